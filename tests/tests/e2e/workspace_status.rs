//! The Workspace's status reaching the control plane and the Cluster: `atProvider` never
//! disappears through rewrites and a failure, and a new output alone moves the endpoint.

use crate::common::{
    ONE_AT_A_TIME, annotate_workspace, endpoint_host, provisioned, provisioned_with, workspace_name,
};
use anyhow::Result;
use capt_controller::api::{CAPTControlPlane, TerraformWorkspace};
use capt_tests::env;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

#[tokio::test]
async fn at_provider_never_disappears_through_100_rewrites_and_a_failure_and_recovery() -> Result<()>
{
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned_with("e2e-atprovider", false, 20).await?;
    let api: Api<CAPTControlPlane> = Api::namespaced(env().client().await?, &ns.name);

    // A watch counts every observed version of the control plane without atProvider.
    let seen = Arc::new(AtomicUsize::new(0));
    let disappeared = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let watch = {
        let (seen, disappeared, stop) = (seen.clone(), disappeared.clone(), stop.clone());
        let config = watcher::Config::default().fields("metadata.name=demo");
        tokio::spawn(async move {
            let mut events = watcher(api, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(Ok(cp)) = events.next().await {
                seen.fetch_add(1, Ordering::Relaxed);
                let at_provider = cp
                    .status
                    .and_then(|s| s.workspace_status)
                    .and_then(|w| w.at_provider);
                if at_provider.is_none() {
                    disappeared.fetch_add(1, Ordering::Relaxed);
                }
                if stop.load(Ordering::Relaxed) {
                    break;
                }
            }
        })
    };
    let ws = workspace_name(&ns.name, "demo-controlplane");
    let checksum = || {
        env().kubectl_ok(
            &[
                "get",
                "workspace",
                &ws,
                "-o",
                "jsonpath={.status.atProvider.checksum}",
            ],
            None,
        )
    };
    for revision in 1..=100 {
        let before = checksum()?;
        annotate_workspace(
            &ws,
            json!({"fake.tf.upbound.io/revision": revision.to_string()}),
        )
        .await?;
        // Each revision is a real rewrite of the Workspace's atProvider by the provider.
        system
            .wait_for(
                "the provider's rewrite",
                Duration::from_secs(10),
                || async { Ok(checksum()? != before) },
            )
            .await?;
        if revision == 50 {
            annotate_workspace(
                &ws,
                json!({"fake.tf.upbound.io/fail": "terraform apply: AccessDenied"}),
            )
            .await?;
            system
                .wait_for("phase Failed", Duration::from_secs(30), || async {
                    Ok(system
                        .get(&["captcontrolplane", "demo"])?
                        .is_some_and(|c| c["status"]["phase"] == "Failed"))
                })
                .await?;
            annotate_workspace(&ws, json!({"fake.tf.upbound.io/fail": null})).await?;
        }
    }
    // The last rewrite reaches the control plane: its checksum is the Workspace's.
    system
        .wait_for(
            "the last atProvider mirrored and phase Ready",
            Duration::from_secs(30),
            || async {
                let w = env().kubectl_ok(
                    &[
                        "get",
                        "workspace",
                        &ws,
                        "-o",
                        "jsonpath={.status.atProvider.checksum}",
                    ],
                    None,
                )?;
                let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
                let annotated = env().kubectl_ok(
                    &[
                        "get",
                        "workspace",
                        &ws,
                        "-o",
                        "jsonpath={.metadata.annotations.fake\\.tf\\.upbound\\.io/revision}",
                    ],
                    None,
                )?;
                Ok(annotated == "100"
                    && cp["status"]["workspaceStatus"]["atProvider"]["checksum"] == w
                    && cp["status"]["phase"] == "Ready")
            },
        )
        .await?;
    stop.store(true, Ordering::Relaxed);
    annotate_workspace(&ws, json!({"fake.tf.upbound.io/revision": "final"})).await?;
    let _ = tokio::time::timeout(Duration::from_secs(10), watch).await;
    let seen = seen.load(Ordering::Relaxed);
    println!(
        "watched {seen} versions of the control plane; atProvider missing in {}",
        disappeared.load(Ordering::Relaxed)
    );
    assert!(
        seen >= 50,
        "the watch saw the control plane follow the rewrites ({seen} versions)"
    );
    assert_eq!(
        disappeared.load(Ordering::Relaxed),
        0,
        "atProvider disappeared"
    );
    Ok(())
}

#[tokio::test]
async fn a_new_output_alone_moves_the_endpoint_to_the_control_plane_and_the_cluster() -> Result<()>
{
    // Terraform re-applied with a new endpoint output and nothing else changed: the
    // Workspace's conditions stay the same, so only the Workspace itself says so.
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("e2e-output", false).await?;
    let api: Api<TerraformWorkspace> = Api::all(env().client().await?);
    let name = workspace_name(&ns.name, "demo-controlplane");
    let conditions = |ws: &TerraformWorkspace| -> Result<Value> {
        let status = ws.status_value();
        Ok(status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| json!([c["type"], c["status"], c["reason"]]))
            .collect())
    };
    let before = api.get(&name).await?;
    let checksum = |ws: &TerraformWorkspace| ws.status_value()["atProvider"]["checksum"].clone();
    // Terraform's next run outputs another endpoint: the fake provider reports the outputs
    // the template's annotation names (rendered onto the Workspace by the controller).
    let host = "moved.example.com";
    system.set_endpoint_output(&format!("https://{host}"))?;
    system
        .wait_for(
            "the provider's new outputs",
            Duration::from_secs(10),
            || async {
                let ws = api.get(&name).await?;
                let outputs = &ws.status_value()["atProvider"]["outputs"];
                Ok(outputs["cluster_endpoint"] == format!("https://{host}")
                    && checksum(&ws) != checksum(&before))
            },
        )
        .await?;
    let after = api.get(&name).await?;
    assert_eq!(
        conditions(&after)?,
        conditions(&before)?,
        "only the outputs changed"
    );
    let moved = json!({"host": host, "port": 443});
    // Core sets a Cluster's endpoint once, from the control plane, and never moves it; without
    // core, capt-cluster follows the control plane.
    let cluster_wanted = if env().core {
        json!({"host": endpoint_host(&ns.name), "port": 443})
    } else {
        moved.clone()
    };
    system
        .wait_for(
            "the new endpoint on the CAPTControlPlane (and the Cluster without core)",
            Duration::from_secs(10),
            || async {
                let cp = system
                    .get(&["captcontrolplane", "demo"])?
                    .unwrap_or_default();
                let cluster = system.get(&["cluster", "demo"])?.unwrap_or_default();
                Ok(cp["spec"]["controlPlaneEndpoint"] == moved
                    && cluster["spec"]["controlPlaneEndpoint"] == cluster_wanted)
            },
        )
        .await?;
    Ok(())
}
