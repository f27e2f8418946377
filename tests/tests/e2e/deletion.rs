//! Deleting the Cluster: the order in which everything goes, a retained VPC, and a stuck
//! deletion that is reported and finishes once unblocked.

use crate::common::{ONE_AT_A_TIME, provisioned, workspace_name};
use anyhow::Result;
use capt_controller::api::{Cluster, TerraformWorkspace, WorkspaceTemplateApply};
use capt_tests::deletion_order::DeletionOrder;
use capt_tests::env;
use kube::api::{Api, DeleteParams, PropagationPolicy};
use std::time::Duration;

/// How a Cluster is deleted here: in the background, as users delete, when Cluster API core
/// runs (its finalizer deletes the children in order); without core, in the foreground, so
/// that the Cluster still waits for its children.
fn user_deletion() -> DeleteParams {
    let propagation = match env().core {
        true => PropagationPolicy::Background,
        false => PropagationPolicy::Foreground,
    };
    DeleteParams {
        propagation_policy: Some(propagation),
        ..Default::default()
    }
}

/// Deletes the Cluster and waits until everything that should go is gone: the order is the
/// API server's (resourceVersions, [`DeletionOrder`]), not that of a poll.
async fn delete_cluster_and_record(ns: &str, retain_vpc: bool) -> Result<DeletionOrder> {
    let client = env().client().await?;
    let order = DeletionOrder::of_sample_stack(&client, ns).await?;
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), ns);
    clusters.delete("demo", &user_deletion()).await?;
    let mut wanted = vec![
        "cluster",
        "captcontrolplane",
        "captcluster",
        "cp-apply",
        "cp-workspace",
    ];
    if !retain_vpc {
        wanted.extend(["vpc-apply", "vpc-workspace"]);
    }
    order.wait_gone(&wanted, Duration::from_secs(60)).await?;
    Ok(order)
}

#[tokio::test]
async fn deleting_the_cluster_removes_everything_control_plane_first_with_no_finalizer_left()
-> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("e2e-delete", false).await?;
    let t = delete_cluster_and_record(&ns.name, false).await?;
    let t_seen = t.seen();
    let t = &t;
    // seed 003: the control plane's Workspace goes, then the control plane, and only then
    // does the VPC apply start deleting; the CAPTCluster goes after its VPC Workspace.
    assert!(t.gone("cp-workspace") <= t.gone("cp-apply"), "{t_seen:?}");
    assert!(
        t.gone("cp-apply") <= t.gone("captcontrolplane"),
        "{t_seen:?}"
    );
    assert!(
        t.gone("captcontrolplane") <= t.deleting("vpc-apply"),
        "{t_seen:?}"
    );
    assert!(
        t.gone("vpc-workspace") <= t.gone("captcluster"),
        "{t_seen:?}"
    );
    assert!(t.gone("captcluster") <= t.gone("cluster"), "{t_seen:?}");
    let left = env().kubectl_ok(
        &[
            "get",
            "cluster,captcluster,captcontrolplane,workspacetemplateapply",
            "-n",
            &ns.name,
            "-o",
            "name",
        ],
        None,
    )?;
    assert_eq!(left, "", "nothing is left");
    let deletions = system
        .controller_metric("capt_resource_deletion_duration_seconds_count", &[])
        .await?;
    assert!(deletions >= 4.0, "deletions were measured: {deletions}");
    Ok(())
}

#[tokio::test]
async fn retain_vpc_on_delete_keeps_the_vpc_apply_and_its_workspace() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, _system) = provisioned("e2e-retain", true).await?;
    delete_cluster_and_record(&ns.name, true).await?;
    let client = env().client().await?;
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), &ns.name);
    let vpc = applies.get("demo-vpc").await?;
    assert!(
        vpc.metadata.deletion_timestamp.is_none(),
        "the VPC apply is kept"
    );
    assert!(
        vpc.metadata.owner_references.unwrap_or_default().is_empty(),
        "and no longer owned"
    );
    let workspaces: Api<TerraformWorkspace> = Api::all(client);
    assert!(
        workspaces
            .get_opt(&workspace_name(&ns.name, "demo-vpc"))
            .await?
            .is_some(),
        "its Workspace is kept"
    );
    assert!(
        applies.get_opt("demo-controlplane").await?.is_none(),
        "the control plane's apply is gone"
    );
    // Clean up what was retained (the Workspace is cluster-scoped).
    applies.delete("demo-vpc", &DeleteParams::default()).await?;
    Ok(())
}

#[tokio::test]
async fn a_stuck_deletion_is_reported_and_finishes_once_unblocked() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, mut system) = provisioned("e2e-stuck", false).await?;
    system.provider_mut().kill(); // nobody removes the Workspace's finalizer any more
    let client = env().client().await?;
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns.name);
    clusters.delete("demo", &user_deletion()).await?;
    system
        .wait_for(
            "DeletionFailed on the control plane",
            Duration::from_secs(30),
            || async {
                let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
                Ok(cp["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "DeletionFailed" && c["status"] == "True"))
            },
        )
        .await?;
    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    let deleting = cp["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Deleting")
        .cloned()
        .unwrap();
    println!("Deleting: {deleting}");
    assert_eq!(deleting["status"], "True");

    // Unblocked by hand (as an operator would), the deletion completes.
    let ws = workspace_name(&ns.name, "demo-controlplane");
    env().kubectl_ok(
        &[
            "patch",
            "workspace",
            &ws,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
        None,
    )?;
    let vpc_ws = workspace_name(&ns.name, "demo-vpc");
    system
        .wait_for(
            "the VPC Workspace to be deleted",
            Duration::from_secs(30),
            || async {
                Ok(env()
                    .kubectl_ok(
                        &[
                            "get",
                            "workspace",
                            &vpc_ws,
                            "-o",
                            "jsonpath={.metadata.deletionTimestamp}",
                        ],
                        None,
                    )
                    .map(|t| !t.is_empty())
                    .unwrap_or(true))
            },
        )
        .await?;
    let _ = env().kubectl_run(
        &[
            "patch",
            "workspace",
            &vpc_ws,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
        None,
    )?;
    system
        .wait_for("everything gone", Duration::from_secs(30), || async {
            Ok(env()
                .kubectl_ok(
                    &[
                        "get",
                        "cluster,captcluster,captcontrolplane,workspacetemplateapply",
                        "-n",
                        &ns.name,
                        "-o",
                        "name",
                    ],
                    None,
                )?
                .is_empty())
        })
        .await?;
    Ok(())
}
