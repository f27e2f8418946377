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

use anyhow::{Context, Result};
use capt_controller::api::CAPTControlPlane;
use capt_controller::render::workspace_name;
use capt_tests::fake_provider::{Desired, checksum};
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

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
    /// The resourceVersion of the newest version seen.
    newest: u64,
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
    let (seen, watch) = watch_our_output_keys(&api).await?;
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
    wait_quiet_after_the_race(&system, &seen).await?;
    watch.abort();
    assert_no_key_of_ours_disappeared(&system, &seen.lock().expect("lock"))
}

/// Waits until nothing of the race is left to see: the provider has applied its last
/// revision, the controller has published it (the applier's document of the control plane
/// carries its checksum), the applier has settled on the control plane's current version, and
/// the watch has seen that version.
async fn wait_quiet_after_the_race(system: &System, seen: &Mutex<Seen>) -> Result<()> {
    let workspace = workspace_name(system.namespace(), "demo-controlplane");
    let applied_now = || -> Result<Option<String>> {
        let ws = (system.get(&["workspace", &workspace])?)
            .context("the control plane's Workspace exists")?;
        applied_checksum(&ws)
    };
    system
        .wait_for(
            "the provider to apply the last revision",
            Duration::from_secs(30),
            || async { Ok(applied_now()?.is_some()) },
        )
        .await?;
    // The race is over: the Workspace asks nothing new of the provider any more.
    let applied = applied_now()?.context("the last revision stays applied")?;
    system
        .wait_for(
            "the controller to publish the last revision",
            Duration::from_secs(30),
            || async {
                let documents = system.applier.client.get("/v1/intents").await?.json();
                Ok(documents.as_array().into_iter().flatten().any(|d| {
                    d["object"]["kind"] == "CAPTControlPlane"
                        && d["object"]["namespace"] == system.namespace()
                        && d["document"]["status"]["workspaceStatus"]["atProvider"]["checksum"]
                            == applied.as_str()
                }))
            },
        )
        .await?;
    let version = system
        .settled_control_plane_version(Duration::from_secs(30))
        .await?;
    system
        .wait_for(
            &format!("the watch to see version {version}"),
            Duration::from_secs(30),
            || async { Ok(seen.lock().expect("lock").newest >= version) },
        )
        .await
}

/// The checksum the provider applied last, once it has applied what the Workspace asks now:
/// `atProvider.checksum` is the checksum of its spec and annotations, and it is Ready.
fn applied_checksum(ws: &Value) -> Result<Option<String>> {
    let annotations: BTreeMap<String, String> =
        serde_json::from_value(ws["metadata"]["annotations"].clone()).unwrap_or_default();
    let spec = &ws["spec"];
    let desired = Desired::parse(&annotations)?.with_module_outputs(spec);
    let expected = checksum(spec, &desired);
    let ready = ws["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    let at = &ws["status"]["atProvider"]["checksum"];
    Ok((ready && *at == expected.as_str()).then_some(expected))
}

/// Watches the control plane's outputs: the keys of the first version seen are ours, and
/// each version lacking one of them is recorded.
async fn watch_our_output_keys(
    api: &Api<CAPTControlPlane>,
) -> Result<(Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>)> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (first, first_seen) = oneshot::channel();
    let watch = {
        let (seen, api) = (seen.clone(), api.clone());
        tokio::spawn(async move {
            let config = watcher::Config::default().fields("metadata.name=demo");
            let mut events = watcher(api, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            let mut first = Some(first);
            while let Some(Ok(cp)) = events.next().await {
                let mut seen = seen.lock().expect("lock");
                seen.versions += 1;
                seen.newest = (cp.metadata.resource_version.as_deref())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(seen.newest);
                // Answered once this version is recorded: the lock is held until then.
                if let Some(first) = first.take() {
                    let _ = first.send(());
                }
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
    // The watch's first version is the provisioned state: its keys are ours.
    tokio::time::timeout(Duration::from_secs(20), first_seen)
        .await
        .context("the watch saw no version of the control plane within 20 s")?
        .context("the watch ended before its first version")?;
    assert!(
        seen.lock().expect("lock").ours.contains("cluster_endpoint"),
        "the watch saw our outputs"
    );
    Ok((seen, watch))
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
