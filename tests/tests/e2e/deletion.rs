//! Deleting the Cluster: the order in which everything goes, a retained VPC, and a stuck
//! deletion that is reported and finishes once unblocked.

use crate::common::{ONE_AT_A_TIME, provisioned, workspace_name};
use anyhow::Result;
use capt_controller::api::{
    CAPTCluster, CAPTControlPlane, Cluster, TerraformWorkspace, WorkspaceTemplateApply,
};
use capt_tests::env;
use kube::api::{Api, DeleteParams, PropagationPolicy};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

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

/// When each object got its deletion timestamp and when it disappeared.
#[derive(Default, Debug)]
struct Timeline(BTreeMap<String, (Option<Instant>, Option<Instant>)>);

impl Timeline {
    /// Records what one poll saw at `now` (the poll's start: objects polled in one round share
    /// it, so the order is known to within one round, 25 ms plus the reads).
    async fn observe(&mut self, now: Instant, name: &str, exists: Option<bool>) {
        let entry = self.0.entry(name.to_owned()).or_default();
        match exists {
            Some(true) => entry.0 = entry.0.or(Some(now)),
            None => {
                entry.0 = entry.0.or(Some(now));
                entry.1 = entry.1.or(Some(now));
            }
            Some(false) => {}
        }
    }
    fn deleting(&self, name: &str) -> Instant {
        self.0[name]
            .0
            .unwrap_or_else(|| panic!("{name} was never deleted: {self:?}"))
    }
    fn gone(&self, name: &str) -> Instant {
        self.0[name]
            .1
            .unwrap_or_else(|| panic!("{name} never disappeared: {self:?}"))
    }
}

/// `Some(deleting)` for an existing object, `None` when gone.
async fn state<K>(api: &Api<K>, name: &str) -> Result<Option<bool>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .get_opt(name)
        .await?
        .map(|o| o.meta().deletion_timestamp.is_some()))
}

async fn delete_cluster_and_record(ns: &str, retain_vpc: bool) -> Result<Timeline> {
    let client = env().client().await?;
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), ns);
    let cps: Api<CAPTControlPlane> = Api::namespaced(client.clone(), ns);
    let ccs: Api<CAPTCluster> = Api::namespaced(client.clone(), ns);
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), ns);
    let workspaces: Api<TerraformWorkspace> = Api::all(client.clone());
    clusters.delete("demo", &user_deletion()).await?;
    let mut timeline = Timeline::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = Instant::now();
        timeline
            .observe(now, "cluster", state(&clusters, "demo").await?)
            .await;
        timeline
            .observe(now, "captcontrolplane", state(&cps, "demo").await?)
            .await;
        timeline
            .observe(now, "captcluster", state(&ccs, "demo").await?)
            .await;
        timeline
            .observe(now, "cp-apply", state(&applies, "demo-controlplane").await?)
            .await;
        timeline
            .observe(
                now,
                "cp-workspace",
                state(&workspaces, &workspace_name(ns, "demo-controlplane")).await?,
            )
            .await;
        let vpc_apply = state(&applies, "demo-vpc").await?;
        let vpc_ws = state(&workspaces, &workspace_name(ns, "demo-vpc")).await?;
        timeline.observe(now, "vpc-apply", vpc_apply).await;
        timeline.observe(now, "vpc-workspace", vpc_ws).await;
        let cluster_gone = timeline.0["cluster"].1.is_some();
        let vpc_done = if retain_vpc {
            true
        } else {
            vpc_apply.is_none() && vpc_ws.is_none()
        };
        if cluster_gone && vpc_done && timeline.0["captcluster"].1.is_some() {
            return Ok(timeline);
        }
        assert!(
            Instant::now() < deadline,
            "deletion did not finish within 60 s: {timeline:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn deleting_the_cluster_removes_everything_control_plane_first_with_no_finalizer_left()
-> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("e2e-delete", false).await?;
    let t = delete_cluster_and_record(&ns.name, false).await?;
    // seed 003: the control plane's Workspace goes, then the control plane, and only then
    // does the VPC apply start deleting; the CAPTCluster goes after its VPC Workspace.
    assert!(t.gone("cp-workspace") <= t.gone("cp-apply"), "{t:?}");
    assert!(t.gone("cp-apply") <= t.gone("captcontrolplane"), "{t:?}");
    assert!(
        t.gone("captcontrolplane") <= t.deleting("vpc-apply"),
        "{t:?}"
    );
    assert!(t.gone("vpc-workspace") <= t.gone("captcluster"), "{t:?}");
    assert!(t.gone("captcluster") <= t.gone("cluster"), "{t:?}");
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
    system.provider.kill(); // nobody removes the Workspace's finalizer any more
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
