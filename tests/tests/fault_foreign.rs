//! Foreign writers racing on `atProvider` while the provider rewrites the Workspace, each in
//! its own task, all at once:
//!
//! * an Update (merge patch) that takes over our `checksum`;
//! * a forced Apply of an output of its own;
//! * an Update that owns only a sibling of our outputs, inside the `outputs` map our manager
//!   created (the shape that once made the API server drop a map with the keys in it);
//! * a non-forced Apply that owns only a sibling of our outputs.
//!
//! Every version of the control plane the watch sees is checked: `atProvider` is there, and
//! so is every output key of ours once it was set (disappearances counted, and must be 0).
//! The takeover is reported as a conflict instead of fought, and every writer's keys stay.

use anyhow::Result;
use capt_controller::api::CAPTControlPlane;
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const ROUNDS: usize = 30;

/// What the watch saw.
#[derive(Default)]
struct Seen {
    versions: usize,
    at_provider_missing: usize,
    /// Our output keys, as first seen once provisioned.
    ours: BTreeSet<String>,
    /// Versions where one of our keys was missing, with the key.
    ours_missing: Vec<String>,
}

fn output_keys(cp: &CAPTControlPlane) -> Option<BTreeSet<String>> {
    let at = cp
        .status
        .as_ref()?
        .workspace_status
        .as_ref()?
        .at_provider
        .as_ref()?;
    Some(
        at.get("outputs")
            .and_then(Value::as_object)
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default(),
    )
}

fn as_manager(manager: &str) -> PatchParams {
    PatchParams {
        field_manager: Some(manager.into()),
        ..Default::default()
    }
}

fn outputs_patch(outputs: Value) -> Value {
    json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
           "status": {"workspaceStatus": {"atProvider": {"outputs": outputs}}}})
}

#[tokio::test]
async fn foreign_writers_on_and_beside_our_keys_never_make_one_of_ours_disappear() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-foreign").await?;
    let system = System::start(&ns.name, 20).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    let api: Api<CAPTControlPlane> = Api::namespaced(client.clone(), &ns.name);
    let (seen, watch) = watch_our_output_keys(&api).await;
    race_four_foreign_writers(&system, &api).await?;
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
    assert_no_key_of_ours_disappeared(&system, &seen.lock().expect("lock"))
}

/// Watches the control plane's outputs: the keys of the first version seen are ours, and
/// each version lacking one of them is recorded.
async fn watch_our_output_keys(
    api: &Api<CAPTControlPlane>,
) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let watch = {
        let (seen, api) = (seen.clone(), api.clone());
        tokio::spawn(async move {
            let config = watcher::Config::default().fields("metadata.name=demo");
            let mut events = watcher(api, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(Ok(cp)) = events.next().await {
                let mut seen = seen.lock().expect("lock");
                seen.versions += 1;
                let Some(keys) = output_keys(&cp) else {
                    seen.at_provider_missing += 1;
                    continue;
                };
                if seen.ours.is_empty() {
                    seen.ours = keys
                        .iter()
                        .filter(|k| !k.starts_with("foreign_"))
                        .cloned()
                        .collect();
                }
                let missing: Vec<String> = seen.ours.difference(&keys).cloned().collect();
                seen.ours_missing.extend(missing);
            }
        })
    };
    // Let the watch see the provisioned state first: its keys are ours.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        seen.lock().expect("lock").ours.contains("cluster_endpoint"),
        "the watch saw our outputs"
    );
    (seen, watch)
}

/// Four foreign writers at once, `ROUNDS` rounds each, while the provider applies new
/// revisions: an Update that takes our checksum over, a forced Apply of another output, and
/// an Update and an Apply of sibling outputs beside ours.
async fn race_four_foreign_writers(system: &System, api: &Api<CAPTControlPlane>) -> Result<()> {
    let takeover = {
        let api = api.clone();
        async move {
            for i in 0..ROUNDS {
                let update = json!({"status": {"workspaceStatus": {"atProvider": {"checksum": format!("foreign-{i}")}}}});
                api.patch_status(
                    "demo",
                    &as_manager("foreign-updater"),
                    &Patch::Merge(&update),
                )
                .await?;
                tokio::time::sleep(Duration::from_millis(fastrand_ms(i, 40))).await;
            }
            anyhow::Ok(())
        }
    };
    let forced = {
        let api = api.clone();
        async move {
            for i in 0..ROUNDS {
                let apply = outputs_patch(json!({"foreign_output": format!("{i}")}));
                api.patch_status(
                    "demo",
                    &PatchParams::apply("foreign-applier").force(),
                    &Patch::Apply(&apply),
                )
                .await?;
                tokio::time::sleep(Duration::from_millis(fastrand_ms(i + 7, 40))).await;
            }
            anyhow::Ok(())
        }
    };
    let siblings = {
        let api = api.clone();
        async move {
            for i in 0..ROUNDS {
                let update = json!({"status": {"workspaceStatus": {"atProvider": {"outputs": {"foreign_sibling": format!("{i}")}}}}});
                api.patch_status(
                    "demo",
                    &as_manager("foreign-sibling"),
                    &Patch::Merge(&update),
                )
                .await?;
                let apply = outputs_patch(json!({"foreign_applied": format!("{i}")}));
                // Not forced: it owns nothing of ours, so it never conflicts.
                api.patch_status(
                    "demo",
                    &PatchParams::apply("foreign-sibling-applier"),
                    &Patch::Apply(&apply),
                )
                .await?;
                tokio::time::sleep(Duration::from_millis(fastrand_ms(i + 13, 40))).await;
            }
            anyhow::Ok(())
        }
    };
    let provider = async {
        for i in 0..ROUNDS {
            system.set_revision(&format!("f{i}"))?;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::Ok(())
    };
    let (a, b, c, d) = tokio::join!(takeover, forced, siblings, provider);
    a?;
    b?;
    c?;
    d?;
    Ok(())
}

/// No version the watch saw lacked atProvider or one of our keys; the foreign keys stay
/// beside ours.
fn assert_no_key_of_ours_disappeared(system: &System, seen: &Seen) -> Result<()> {
    println!(
        "watched {} versions with four foreign writers; atProvider missing in {}; our keys {:?} missing {} times",
        seen.versions,
        seen.at_provider_missing,
        seen.ours,
        seen.ours_missing.len()
    );
    assert!(
        seen.versions >= 4 * ROUNDS,
        "the watch saw the race ({} versions)",
        seen.versions
    );
    assert_eq!(seen.at_provider_missing, 0, "atProvider disappeared");
    assert_eq!(
        seen.ours_missing,
        Vec::<String>::new(),
        "keys of ours disappeared"
    );
    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    let outputs = &cp["status"]["workspaceStatus"]["atProvider"]["outputs"];
    let last = format!("{}", ROUNDS - 1);
    for key in ["foreign_output", "foreign_sibling", "foreign_applied"] {
        assert_eq!(
            outputs[key],
            json!(last),
            "the foreign key {key} stays: {outputs}"
        );
    }
    assert!(
        outputs["cluster_endpoint"].is_string(),
        "ours stays too: {outputs}"
    );
    Ok(())
}

/// A pause of 0 to `max` ms, different per writer and round, without a seed to pick.
fn fastrand_ms(i: usize, max: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    (nanos / 1000 + i as u64 * 7919) % (max + 1)
}
