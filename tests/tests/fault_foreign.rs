//! Foreign writers racing on atProvider, with both operations: an Update (merge patch) that
//! takes over the checksum, and a forced Apply that adds its own output, while the provider
//! rewrites the Workspace. atProvider never disappears; the applier reports the takeover as
//! a conflict instead of fighting it.

use anyhow::Result;
use capt_controller::api::CAPTControlPlane;
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

#[tokio::test]
async fn foreign_update_and_apply_writers_never_make_at_provider_disappear() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-foreign").await?;
    let system = System::start(&ns.name, 20).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    let api: Api<CAPTControlPlane> = Api::namespaced(client.clone(), &ns.name);

    let seen = Arc::new(AtomicUsize::new(0));
    let disappeared = Arc::new(AtomicUsize::new(0));
    let watch = {
        let (seen, disappeared, api) = (seen.clone(), disappeared.clone(), api.clone());
        tokio::spawn(async move {
            let config = watcher::Config::default().fields("metadata.name=demo");
            let mut events = watcher(api, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(Ok(cp)) = events.next().await {
                seen.fetch_add(1, Ordering::Relaxed);
                if cp
                    .status
                    .and_then(|s| s.workspace_status)
                    .and_then(|w| w.at_provider)
                    .is_none()
                {
                    disappeared.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    let ws = format!("{}-demo-controlplane", ns.name);
    for i in 0..30 {
        // An Update (a merge patch) of a value the control plane's manager owns: it takes it over.
        let update = json!({"status": {"workspaceStatus": {"atProvider": {"checksum": format!("foreign-{i}")}}}});
        let as_updater = PatchParams {
            field_manager: Some("foreign-updater".into()),
            ..Default::default()
        };
        api.patch_status("demo", &as_updater, &Patch::Merge(&update))
            .await?;
        // A forced Apply of an output of its own.
        let apply = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
            "status": {"workspaceStatus": {"atProvider": {"outputs": {"foreign_output": format!("{i}")}}}}});
        api.patch_status(
            "demo",
            &PatchParams::apply("foreign-applier").force(),
            &Patch::Apply(&apply),
        )
        .await?;
        env().kubectl_ok(
            &[
                "annotate",
                "workspace",
                &ws,
                "--overwrite",
                &format!("fake.tf.upbound.io/revision=f{i}"),
            ],
            None,
        )?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    system
        .wait_for(
            "the takeover reported as a conflict",
            Duration::from_secs(20),
            || async {
                let conflicts = system.applier.client.get("/v1/conflicts").await?.json();
                Ok(conflicts.as_array().into_iter().flatten().any(|c| {
                    c["conflict"]["owner"] == "foreign-updater"
                        && c["conflict"]["path"] == ".status.workspaceStatus.atProvider.checksum"
                }))
            },
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    watch.abort();
    let (seen, disappeared) = (
        seen.load(Ordering::Relaxed),
        disappeared.load(Ordering::Relaxed),
    );
    println!(
        "watched {seen} versions with two foreign writers; atProvider missing in {disappeared}"
    );
    assert!(seen >= 60, "the watch saw the race ({seen} versions)");
    assert_eq!(disappeared, 0, "atProvider disappeared");
    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    assert_eq!(
        cp["status"]["workspaceStatus"]["atProvider"]["outputs"]["foreign_output"], "29",
        "the foreign output stays"
    );
    assert!(
        cp["status"]["workspaceStatus"]["atProvider"]["outputs"]["cluster_endpoint"].is_string(),
        "ours stays too"
    );
    Ok(())
}
