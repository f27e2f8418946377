//! Foreign writers racing on `spec.controlPlaneEndpoint` of the CAPTControlPlane and of the
//! Cluster, with both operations (an Update, i.e. a merge patch, that takes the host over,
//! and a forced Apply of another host and port), while the Workspace's `cluster_endpoint`
//! output keeps changing. What must hold (docs/status-applier.md: a protected path is never removed or
//! emptied and never taken back by force; a conflict is reported, not fought):
//!
//! - during the race, and after it, no watched version of either object lacks the endpoint
//!   or has an empty host or no port (count of such versions = 0);
//! - the applier reports the takeovers as conflicts: in `GET /v1/conflicts`, in
//!   `status_applier_conflicts_total` and as `FieldConflict` Events on both objects;
//! - no hot loop: the applier's apply attempts for the two endpoint managers stay bounded by
//!   the versions of the objects it saw, its writes by the changes it was shown (the foreign
//!   writes and the controller's intents: at most one write each), and once the writers
//!   stop, it makes no attempt and no write at all while the foreign values stay (they are
//!   not fought);
//! - the Workspace's changes still reach the control plane's status (`atProvider`) meanwhile.
//!
//! What happens once the foreign writers stop and their ownership is released, as documented
//! here and asserted: a forced-Apply writer cannot release the control plane's endpoint by
//! applying without it (it alone owns the port, the API server refuses to remove a required
//! field: 422), so an operator releases both writers by removing their `managedFields`
//! entries. That changes the objects, so the applier plans again, finds no other owner and
//! applies its current value: both endpoints become the Workspace's last `cluster_endpoint`
//! (without ever disappearing), owned by CAPT's managers alone, and follow the next change of
//! the Workspace.

use anyhow::{Context, Result};
use capt_tests::applier::binary;
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const FOREIGN_UPDATER: &str = "foreign-updater";
const FOREIGN_APPLIER: &str = "foreign-applier";
const MANAGERS: [&str; 2] = ["capt-captcontrolplane", "capt-cluster"];
const ROUNDS: usize = 15;

/// Counts the watched versions of one object, and those without a usable endpoint.
#[derive(Default)]
struct Counts {
    seen: AtomicUsize,
    missing: AtomicUsize,
    errors: AtomicUsize,
}

fn endpoint_usable(obj: &Value) -> bool {
    let e = &obj["spec"]["controlPlaneEndpoint"];
    e["host"].as_str().is_some_and(|h| !h.is_empty()) && e["port"].as_i64().is_some_and(|p| p > 0)
}

fn watch(api: Api<DynamicObject>, counts: Arc<Counts>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let config = watcher::Config::default().fields("metadata.name=demo");
        let mut events = watcher(api, config)
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(obj) => {
                    counts.seen.fetch_add(1, Ordering::Relaxed);
                    if !endpoint_usable(&serde_json::to_value(&obj).unwrap_or_default()) {
                        counts.missing.fetch_add(1, Ordering::Relaxed);
                        eprintln!(
                            "endpoint missing or empty: {} {}",
                            obj.types.map(|t| t.kind).unwrap_or_default(),
                            obj.data["spec"]
                        );
                    }
                }
                Err(_) => {
                    counts.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    })
}

fn resource(group: &str, kind: &str, plural: &str) -> ApiResource {
    // Without core the Cluster is served in v1beta2 alone (`hack/testenv.sh`).
    let version = if group == "cluster.x-k8s.io" {
        "v1beta2"
    } else {
        "v1beta1"
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// The sum of the applier's `name` samples for CAPT's two endpoint managers.
async fn endpoint_managers_metric(system: &System, name: &str) -> Result<f64> {
    let mut sum = 0.0;
    for manager in MANAGERS {
        sum += system
            .applier
            .metric(name, &[&format!("manager=\"{manager}\"")])
            .await?;
    }
    Ok(sum)
}

/// The managers (with their operation) whose managedFields entry holds the endpoint.
fn endpoint_owners(obj: &Value) -> Vec<String> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["fieldsV1"]["f:spec"]
                .get("f:controlPlaneEndpoint")
                .is_some()
        })
        .map(|e| {
            format!(
                "{}/{}",
                e["manager"].as_str().unwrap_or(""),
                e["operation"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[tokio::test]
async fn foreign_update_and_forced_apply_on_the_endpoint_are_reported_never_fought_nor_emptied()
-> Result<()> {
    capt_tests::without_core(); // capt-cluster writes the Cluster only where core does not
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-endpoint").await?;
    let system = System::start(&ns.name, 20).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;

    let cp_resource = resource(
        "controlplane.cluster.x-k8s.io",
        "CAPTControlPlane",
        "captcontrolplanes",
    );
    let cluster_resource = resource("cluster.x-k8s.io", "Cluster", "clusters");
    let cps: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &cp_resource);
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &cluster_resource);
    let cp_counts = Arc::new(Counts::default());
    let cluster_counts = Arc::new(Counts::default());
    let watches = [
        watch(cps.clone(), cp_counts.clone()),
        watch(clusters.clone(), cluster_counts.clone()),
    ];
    tokio::time::sleep(Duration::from_millis(300)).await; // the watches have listed

    let applies_before = endpoint_managers_metric(&system, "status_applier_applies_total").await?;
    let writes_before =
        endpoint_managers_metric(&system, "status_applier_api_writes_total").await?;
    let intents_before = endpoint_managers_metric(&system, "status_applier_intents_total").await?;
    let as_updater = PatchParams {
        field_manager: Some(FOREIGN_UPDATER.into()),
        ..Default::default()
    };
    let as_applier = PatchParams::apply(FOREIGN_APPLIER).force();
    let mut foreign_writes = 0;
    let mut last_output = String::new();
    let race = Instant::now();
    for i in 0..ROUNDS {
        for (api, prefix, api_version, kind) in [
            (
                &cps,
                "cp",
                "controlplane.cluster.x-k8s.io/v1beta1",
                "CAPTControlPlane",
            ),
            (&clusters, "cl", "cluster.x-k8s.io/v1beta2", "Cluster"),
        ] {
            let update = json!({"spec": {"controlPlaneEndpoint": {"host": format!("{prefix}-update-{i}.example.com")}}});
            let apply = json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": "demo"},
                "spec": {"controlPlaneEndpoint": {"host": format!("{prefix}-apply-{i}.example.com"), "port": 6443}}});
            // Alternate the order; the last round ends with the Update.
            if i % 2 == 1 {
                api.patch("demo", &as_updater, &Patch::Merge(&update))
                    .await?;
                api.patch("demo", &as_applier, &Patch::Apply(&apply))
                    .await?;
            } else {
                api.patch("demo", &as_applier, &Patch::Apply(&apply))
                    .await?;
                api.patch("demo", &as_updater, &Patch::Merge(&update))
                    .await?;
            }
            foreign_writes += 2;
        }
        if i % 3 == 0 {
            last_output = format!("https://ws-{i}.example.com");
            system.set_endpoint_output(&last_output)?;
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    println!(
        "race: {foreign_writes} foreign writes in {:.1} s",
        race.elapsed().as_secs_f64()
    );

    // The Workspace's last change reaches the control plane's status meanwhile.
    system
        .wait_for(
            "the last Workspace output in the control plane's atProvider",
            Duration::from_secs(20),
            || async {
                let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
                Ok(
                    cp["status"]["workspaceStatus"]["atProvider"]["outputs"]["cluster_endpoint"]
                        == last_output.as_str(),
                )
            },
        )
        .await?;

    // Reported as conflicts, on both objects, for both writers.
    let last = ROUNDS - 1;
    system
        .wait_for(
            "the takeovers reported as conflicts",
            Duration::from_secs(20),
            || async {
                let conflicts = system.applier.client.get("/v1/conflicts").await?.json();
                let reported = |kind: &str, owner: &str| {
                    conflicts.as_array().into_iter().flatten().any(|c| {
                        c["object"]["kind"] == kind
                            && c["conflict"]["owner"] == owner
                            && c["conflict"]["path"] == ".spec.controlPlaneEndpoint.host"
                    })
                };
                Ok(reported("CAPTControlPlane", FOREIGN_UPDATER)
                    && reported("CAPTControlPlane", FOREIGN_APPLIER)
                    && reported("Cluster", FOREIGN_UPDATER))
            },
        )
        .await?;
    for manager in MANAGERS {
        let reported = system
            .applier
            .metric(
                "status_applier_conflicts_total",
                &[
                    &format!("manager=\"{manager}\""),
                    "path=\".spec.controlPlaneEndpoint.host\"",
                    "owner=\"foreign\"",
                ],
            )
            .await?;
        assert!(reported > 0.0, "{manager}: no conflict counted");
    }
    let events = env().kubectl_ok(
        &[
            "get",
            "events",
            "-n",
            &ns.name,
            "--field-selector",
            "reason=FieldConflict",
            "-o",
            "json",
        ],
        None,
    )?;
    let events: Value = serde_json::from_str(&events)?;
    for kind in ["CAPTControlPlane", "Cluster"] {
        let notes: Vec<String> = events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["regarding"]["kind"] == kind || e["involvedObject"]["kind"] == kind)
            .map(|e| format!("{}{}", e["note"], e["message"]))
            .collect();
        assert!(
            notes
                .iter()
                .any(|n| n.contains(".spec.controlPlaneEndpoint.host (owned by foreign-")),
            "a FieldConflict Event on the {kind}: {notes:?}"
        );
    }

    // Stopped writers: their values stay, and the applier is quiet (no hot loop).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let applies = endpoint_managers_metric(&system, "status_applier_applies_total").await?;
    let writes = endpoint_managers_metric(&system, "status_applier_api_writes_total").await?;
    let intents = endpoint_managers_metric(&system, "status_applier_intents_total").await?;
    let seen = cp_counts.seen.load(Ordering::Relaxed) + cluster_counts.seen.load(Ordering::Relaxed);
    println!(
        "during the race: {} apply attempts and {} writes by the endpoint managers, {} intents \
         for them, {foreign_writes} foreign writes, {seen} watched versions",
        applies - applies_before,
        writes - writes_before,
        intents - intents_before,
    );
    // Each change of an object makes the applier check that object's documents (a status
    // and a main one per object) once: at most a few attempts per version seen.
    assert!(
        applies - applies_before <= (3 * seen) as f64,
        "apply attempts bounded by the changes seen: {} for {seen} versions",
        applies - applies_before
    );
    // What the applier was shown: the foreign writes, and the controller's intents for the
    // two managers (its publisher skips repeats, so an intent is a changed wish). Its own
    // writes count in neither (the watched versions would count them: a loop of writes
    // would have raised its own bound). At most one write per change shown.
    let shown = foreign_writes as f64 + (intents - intents_before);
    assert!(
        writes - writes_before <= shown,
        "writes bounded by the changes shown: {} for {foreign_writes} foreign writes and {} \
         intents",
        writes - writes_before,
        intents - intents_before
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        endpoint_managers_metric(&system, "status_applier_applies_total").await?,
        applies,
        "no apply attempt while nothing changes"
    );
    assert_eq!(
        endpoint_managers_metric(&system, "status_applier_api_writes_total").await?,
        writes,
        "no write while nothing changes"
    );
    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    let cluster = system.get(&["cluster", "demo"])?.unwrap();
    assert_eq!(
        cp["spec"]["controlPlaneEndpoint"]["host"],
        format!("cp-update-{last}.example.com"),
        "the foreign value stays: not fought"
    );
    assert_eq!(
        cluster["spec"]["controlPlaneEndpoint"]["host"],
        format!("cl-update-{last}.example.com"),
        "the foreign value stays: not fought"
    );
    println!(
        "stopped: control plane endpoint {} owned by {:?}; Cluster endpoint {} owned by {:?}",
        cp["spec"]["controlPlaneEndpoint"],
        endpoint_owners(&cp),
        cluster["spec"]["controlPlaneEndpoint"],
        endpoint_owners(&cluster)
    );

    // The forced-Apply writer cannot release the control plane's endpoint by applying
    // without it: it alone owns the required port, which the API server will not remove.
    let empty = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "demo"}});
    let refused = cps
        .patch(
            "demo",
            &PatchParams::apply(FOREIGN_APPLIER),
            &Patch::Apply(&empty),
        )
        .await;
    match refused {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 422, "{s:?}"),
        other => panic!("releasing the only owner of a required field: {other:?}"),
    }

    // An operator releases both writers: their managedFields entries go.
    for kind in ["captcontrolplane", "cluster"] {
        let obj = system.get(&[kind, "demo"])?.context("the object")?;
        let kept: Vec<Value> = obj["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| {
                !matches!(
                    e["manager"].as_str(),
                    Some(FOREIGN_UPDATER | FOREIGN_APPLIER)
                )
            })
            .cloned()
            .collect();
        let patch = json!({"metadata": {"managedFields": kept}});
        env().kubectl_ok(
            &[
                "patch",
                kind,
                "demo",
                "-n",
                &ns.name,
                "--type=merge",
                "-p",
                &patch.to_string(),
            ],
            None,
        )?;
    }
    let released = Instant::now();
    let want = |host: String| {
        let system = &system;
        move || {
            let host = host.clone();
            async move {
                let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
                let cluster = system.get(&["cluster", "demo"])?.unwrap();
                let want = json!({"host": host, "port": 443});
                Ok(cp["spec"]["controlPlaneEndpoint"] == want
                    && cluster["spec"]["controlPlaneEndpoint"] == want
                    && endpoint_owners(&cp) == ["capt-captcontrolplane/Apply"]
                    && endpoint_owners(&cluster) == ["capt-cluster/Apply"])
            }
        }
    };
    let last_host = last_output.trim_start_matches("https://").to_owned();
    system
        .wait_for(
            "both endpoints back to the Workspace's, owned by CAPT alone",
            Duration::from_secs(15),
            want(last_host),
        )
        .await?;
    println!(
        "released: CAPT's endpoint back after {:.1} s",
        released.elapsed().as_secs_f64()
    );
    system.set_endpoint_output("https://after-release.example.com")?;
    system
        .wait_for(
            "both endpoints following the Workspace again",
            Duration::from_secs(15),
            want("after-release.example.com".into()),
        )
        .await?;
    let audit = std::process::Command::new(binary("status-applier"))
        .args(["audit", "-n", &ns.name])
        .arg("--policy")
        .arg(capt_tests::applier::capt_policy())
        .env("KUBECONFIG", &env().kubeconfig)
        .output()?;
    assert!(
        audit.status.success(),
        "the ownership audit after the release:\n{}{}",
        String::from_utf8_lossy(&audit.stdout),
        String::from_utf8_lossy(&audit.stderr)
    );

    tokio::time::sleep(Duration::from_millis(500)).await;
    for w in watches {
        w.abort();
    }
    let report = |c: &Counts| {
        (
            c.seen.load(Ordering::Relaxed),
            c.missing.load(Ordering::Relaxed),
            c.errors.load(Ordering::Relaxed),
        )
    };
    let (cp_seen, cp_missing, cp_errors) = report(&cp_counts);
    let (cl_seen, cl_missing, cl_errors) = report(&cluster_counts);
    println!(
        "watched {cp_seen} control plane versions ({cp_missing} without endpoint) and {cl_seen} Cluster versions ({cl_missing} without endpoint)"
    );
    assert_eq!(cp_errors + cl_errors, 0, "the watches failed");
    assert!(
        cp_seen >= ROUNDS && cl_seen >= ROUNDS,
        "the watches saw the race"
    );
    assert_eq!(cp_missing, 0, "the control plane's endpoint disappeared");
    assert_eq!(cl_missing, 0, "the Cluster's endpoint disappeared");
    Ok(())
}
