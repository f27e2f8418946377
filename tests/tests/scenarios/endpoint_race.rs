//! The race on `spec.controlPlaneEndpoint` of `fault_endpoint.rs` (beside Cluster API core)
//! and `fault_endpoint_nocore.rs` (without it, where `capt-cluster` owns the Cluster's
//! endpoint): one scenario, the Cluster's claims chosen by who writes the Cluster. Each
//! binary's header says what holds.

use anyhow::{Context, Result};
use capt_tests::applier::audit_clean;
use capt_tests::system::{ClusterWriter, System, resource};
use capt_tests::{TestNamespace, env};
use futures::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const FOREIGN_UPDATER: &str = "foreign-updater";
const FOREIGN_APPLIER: &str = "foreign-applier";
const CP_MANAGER: &str = "capt-captcontrolplane";
const CLUSTER_MANAGER: &str = "capt-cluster";
const ROUNDS: usize = 15;
/// The claim's window: once the writers stopped and the applier has settled on the objects it
/// writes, this long without an apply attempt or a write shows it does not fight.
const NOT_FOUGHT_WINDOW: Duration = Duration::from_secs(3);

/// Counts the watched versions of one object, and those without a usable endpoint.
#[derive(Default)]
struct Counts {
    seen: AtomicUsize,
    missing: AtomicUsize,
    errors: AtomicUsize,
    last_version: Mutex<String>,
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
                            obj.types.as_ref().map(|t| t.kind.as_str()).unwrap_or(""),
                            obj.data["spec"]
                        );
                    }
                    *counts.last_version.lock().unwrap() =
                        obj.metadata.resource_version.clone().unwrap_or_default();
                }
                Err(_) => {
                    counts.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    })
}

/// Waits until the watch behind `counts` has seen the current version of `demo`.
async fn watch_caught_up(system: &System, api: &Api<DynamicObject>, counts: &Counts) -> Result<()> {
    system
        .wait_for(
            "the watch to see the object's current version",
            Duration::from_secs(10),
            || async {
                let current = api.get("demo").await?.metadata.resource_version;
                Ok(current.as_deref() == Some(counts.last_version.lock().unwrap().as_str()))
            },
        )
        .await
}

/// The sum of the applier's `name` samples for `managers`.
async fn managers_metric(system: &System, name: &str, managers: &[&str]) -> Result<f64> {
    let mut sum = 0.0;
    for manager in managers {
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

/// The notes of the `FieldConflict` Events in `ns` about an object of `kind`.
fn field_conflict_notes(ns: &str, kind: &str) -> Result<Vec<String>> {
    let events = env().kubectl_ok(
        &[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            "reason=FieldConflict",
            "-o",
            "json",
        ],
        None,
    )?;
    let events: Value = serde_json::from_str(&events)?;
    Ok(events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["regarding"]["kind"] == kind || e["involvedObject"]["kind"] == kind)
        .map(|e| format!("{}{}", e["note"], e["message"]))
        .collect())
}

/// Foreign writers (an Update that takes the host over, and a forced Apply of another host
/// and port) race on the endpoint of the control plane and of the Cluster while the
/// Workspace's `cluster_endpoint` output keeps changing; then they stop, and an operator
/// releases them.
pub async fn foreign_writers_race_on_the_endpoint(writer: ClusterWriter) -> Result<()> {
    writer.expect_environment()?;
    let stack = provision_and_watch(writer).await?;
    let before = stack.applier_counts().await?;
    let cluster_writes_before = managers_metric(
        &stack.system,
        "status_applier_api_writes_total",
        &[CLUSTER_MANAGER],
    )
    .await?;
    let (foreign_writes, last_output) = race_foreign_writers(&stack).await?;
    wait_provider_done(&stack, &last_output).await?;
    assert_conflicts_reported(&stack).await?;
    assert_not_fought(&stack, &before, foreign_writes, cluster_writes_before).await?;
    assert_forced_applier_cannot_release(&stack).await?;
    release_foreign_writers(&stack)?;
    assert_endpoints_back_to_capt(&stack, &last_output).await?;
    assert_endpoints_never_missing(&stack).await
}

/// The provisioned stack the writers race on: its two objects with an endpoint, each
/// watched from its current version on.
struct Stack {
    writer: ClusterWriter,
    /// CAPT's managers of the endpoint: the Cluster's is CAPT's only without core.
    ours: &'static [&'static str],
    system: System,
    ns: TestNamespace,
    cps: Api<DynamicObject>,
    clusters: Api<DynamicObject>,
    cp_counts: Arc<Counts>,
    cluster_counts: Arc<Counts>,
    watches: [tokio::task::JoinHandle<()>; 2],
}

impl Stack {
    fn beside_core(&self) -> bool {
        self.writer == ClusterWriter::Core
    }

    /// The applier's apply attempts, writes and intents for CAPT's endpoint managers.
    async fn applier_counts(&self) -> Result<ApplierCounts> {
        let system = &self.system;
        Ok(ApplierCounts {
            applies: managers_metric(system, "status_applier_applies_total", self.ours).await?,
            writes: managers_metric(system, "status_applier_api_writes_total", self.ours).await?,
            intents: managers_metric(system, "status_applier_intents_total", self.ours).await?,
        })
    }
}

/// What the applier did for CAPT's endpoint managers, as its metrics count it.
struct ApplierCounts {
    applies: f64,
    writes: f64,
    intents: f64,
}

/// Provisions the stack and watches its control plane and Cluster (beside core, once core
/// copied the endpoint to the Cluster).
async fn provision_and_watch(writer: ClusterWriter) -> Result<Stack> {
    let beside_core = writer == ClusterWriter::Core;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-endpoint").await?;
    let system = System::start(&ns.name, 20).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    let ours: &[&str] = match writer {
        ClusterWriter::Core => &[CP_MANAGER],
        ClusterWriter::CaptCluster => &[CP_MANAGER, CLUSTER_MANAGER],
    };

    let cp_resource = resource(
        "controlplane.cluster.x-k8s.io",
        "CAPTControlPlane",
        "captcontrolplanes",
    );
    let cluster_resource = resource("cluster.x-k8s.io", "Cluster", "clusters");
    let cps: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &cp_resource);
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &cluster_resource);
    if beside_core {
        // Core copied the control plane's endpoint to the Cluster (the race below needs one).
        system
            .wait_for(
                "core to copy the endpoint to the Cluster",
                Duration::from_secs(30),
                || async {
                    Ok(endpoint_usable(&serde_json::to_value(
                        clusters.get("demo").await?,
                    )?))
                },
            )
            .await?;
    }
    let cp_counts = Arc::new(Counts::default());
    let cluster_counts = Arc::new(Counts::default());
    let watches = [
        watch(cps.clone(), cp_counts.clone()),
        watch(clusters.clone(), cluster_counts.clone()),
    ];
    watch_caught_up(&system, &cps, &cp_counts).await?;
    watch_caught_up(&system, &clusters, &cluster_counts).await?;
    Ok(Stack {
        writer,
        ours,
        system,
        ns,
        cps,
        clusters,
        cp_counts,
        cluster_counts,
        watches,
    })
}

/// The race: `ROUNDS` rounds of a foreign Update and a forced foreign Apply on both
/// endpoints, the Workspace's output changing every third round. Returns the number of
/// foreign writes and the Workspace's last output.
async fn race_foreign_writers(stack: &Stack) -> Result<(usize, String)> {
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
                &stack.cps,
                "cp",
                "controlplane.cluster.x-k8s.io/v1beta1",
                "CAPTControlPlane",
            ),
            (&stack.clusters, "cl", "cluster.x-k8s.io/v1beta2", "Cluster"),
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
            stack.system.set_endpoint_output(&last_output)?;
        }
        // The race's pace: the Workspace's changes interleave with the foreign writes.
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    println!(
        "race: {foreign_writes} foreign writes in {:.1} s",
        race.elapsed().as_secs_f64()
    );
    Ok((foreign_writes, last_output))
}

/// Waits for the Workspace's last change to reach the control plane's status.
async fn wait_provider_done(stack: &Stack, last_output: &str) -> Result<()> {
    let system = &stack.system;
    // The Workspace's last change reaches the control plane's status meanwhile: its outputs,
    // and then its checksum, which the provider's apply drops and its next Observe puts back
    // (`fake_provider::applied_at_provider`). Only then has the provider done all it will.
    system
        .wait_for(
            "the last Workspace output and its checksum in the control plane's atProvider",
            Duration::from_secs(20),
            || async {
                let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
                let at_provider = &cp["status"]["workspaceStatus"]["atProvider"];
                Ok(at_provider["outputs"]["cluster_endpoint"] == last_output
                    && at_provider["checksum"].is_string())
            },
        )
        .await
}

/// The takeovers are reported as conflicts (the applier's list, its metric, a
/// `FieldConflict` Event) for the objects CAPT writes the endpoint of, and only those.
async fn assert_conflicts_reported(stack: &Stack) -> Result<()> {
    let (system, ours, beside_core) = (&stack.system, stack.ours, stack.beside_core());
    // Reported as conflicts, for both writers, on each object CAPT writes the endpoint of.
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
                    && (beside_core || reported("Cluster", FOREIGN_UPDATER)))
            },
        )
        .await?;
    for manager in [CP_MANAGER, CLUSTER_MANAGER] {
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
        if ours.contains(&manager) {
            assert!(reported > 0.0, "{manager}: no conflict counted");
        } else {
            assert_eq!(
                reported, 0.0,
                "{manager} writes no endpoint beside core, so it meets no conflict"
            );
        }
    }
    for (kind, manager) in [
        ("CAPTControlPlane", CP_MANAGER),
        ("Cluster", CLUSTER_MANAGER),
    ] {
        let notes = field_conflict_notes(&stack.ns.name, kind)?;
        let found = notes
            .iter()
            .any(|n| n.contains(".spec.controlPlaneEndpoint.host (owned by foreign-"));
        if ours.contains(&manager) {
            assert!(found, "a FieldConflict Event on the {kind}: {notes:?}");
        } else {
            assert!(
                notes.is_empty(),
                "no FieldConflict Event on the {kind}: {notes:?}"
            );
        }
    }
    Ok(())
}

/// Once the writers stopped and the applier settled, the foreign values stay and the
/// applier is quiet: its attempts and writes bounded by the changes it saw and was shown,
/// none while nothing changes (no hot loop).
async fn assert_not_fought(
    stack: &Stack,
    before: &ApplierCounts,
    foreign_writes: usize,
    cluster_writes_before: f64,
) -> Result<()> {
    let (system, ours, beside_core) = (&stack.system, stack.ours, stack.beside_core());
    let (cps, clusters) = (&stack.cps, &stack.clusters);
    let last = ROUNDS - 1;
    // Stopped writers: once the applier has settled on the objects it writes, their values
    // stay and the applier is quiet (no hot loop).
    let settled = Duration::from_secs(20);
    system.applier.settled_on(cps, "demo", settled).await?;
    if !beside_core {
        system.applier.settled_on(clusters, "demo", settled).await?;
    }
    let ApplierCounts {
        applies,
        writes,
        intents,
    } = stack.applier_counts().await?;
    let seen = stack.cp_counts.seen.load(Ordering::Relaxed)
        + stack.cluster_counts.seen.load(Ordering::Relaxed);
    println!(
        "during the race: {} apply attempts and {} writes by {ours:?}, {} intents for them, \
         {foreign_writes} foreign writes, {seen} watched versions",
        applies - before.applies,
        writes - before.writes,
        intents - before.intents,
    );
    // Each change of an object makes the applier check that object's documents (a status
    // and a main one per object) once: at most a few attempts per version seen.
    assert!(
        applies - before.applies <= (3 * seen) as f64,
        "apply attempts bounded by the changes seen: {} for {seen} versions",
        applies - before.applies
    );
    // What the applier was shown: the foreign writes, and the controller's intents for the
    // endpoint managers (its publisher skips repeats, so an intent is a changed wish). Its own
    // writes count in neither (the watched versions would count them: a loop of writes
    // would have raised its own bound). At most one write per change shown.
    let shown = foreign_writes as f64 + (intents - before.intents);
    assert!(
        writes - before.writes <= shown,
        "writes bounded by the changes shown: {} for {foreign_writes} foreign writes and {} \
         intents",
        writes - before.writes,
        intents - before.intents
    );
    if beside_core {
        assert_eq!(
            managers_metric(
                system,
                "status_applier_api_writes_total",
                &[CLUSTER_MANAGER]
            )
            .await?,
            cluster_writes_before,
            "capt-cluster wrote to a Cluster core manages"
        );
    }
    tokio::time::sleep(NOT_FOUGHT_WINDOW).await;
    assert_eq!(
        managers_metric(system, "status_applier_applies_total", ours).await?,
        applies,
        "no apply attempt while nothing changes"
    );
    assert_eq!(
        managers_metric(system, "status_applier_api_writes_total", ours).await?,
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
    Ok(())
}

/// The forced-Apply writer cannot release the control plane's endpoint by applying
/// without it.
async fn assert_forced_applier_cannot_release(stack: &Stack) -> Result<()> {
    // The forced-Apply writer cannot release the control plane's endpoint by applying
    // without it: it alone owns the required port, which the API server will not remove.
    let empty = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "demo"}});
    let refused = stack
        .cps
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
    Ok(())
}

/// An operator releases both writers: their managedFields entries go.
fn release_foreign_writers(stack: &Stack) -> Result<()> {
    for kind in ["captcontrolplane", "cluster"] {
        let obj = stack.system.get(&[kind, "demo"])?.context("the object")?;
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
                &stack.ns.name,
                "--type=merge",
                "-p",
                &patch.to_string(),
            ],
            None,
        )?;
    }
    Ok(())
}

/// Released, the endpoints CAPT writes come back to the Workspace's, owned by CAPT alone,
/// and follow it again; the ownership audit is clean.
async fn assert_endpoints_back_to_capt(stack: &Stack, last_output: &str) -> Result<()> {
    let (system, writer, beside_core) = (&stack.system, stack.writer, stack.beside_core());
    let last = ROUNDS - 1;
    let released = Instant::now();
    // Beside core, the Cluster's endpoint stays as the writers left it: core copies the
    // control plane's only into a Cluster without a valid one, and capt-cluster never owns it.
    let foreign_cluster_endpoint =
        json!({"host": format!("cl-update-{last}.example.com"), "port": 6443});
    let want = |host: String| {
        let foreign_cluster_endpoint = &foreign_cluster_endpoint;
        move || {
            let host = host.clone();
            async move {
                let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
                let cluster = system.get(&["cluster", "demo"])?.unwrap();
                let want = json!({"host": host, "port": 443});
                let cluster_ok = match writer {
                    ClusterWriter::CaptCluster => {
                        cluster["spec"]["controlPlaneEndpoint"] == want
                            && endpoint_owners(&cluster) == ["capt-cluster/Apply"]
                    }
                    ClusterWriter::Core => {
                        cluster["spec"]["controlPlaneEndpoint"] == *foreign_cluster_endpoint
                            && !endpoint_owners(&cluster)
                                .iter()
                                .any(|o| o.starts_with("capt-"))
                    }
                };
                Ok(cp["spec"]["controlPlaneEndpoint"] == want
                    && endpoint_owners(&cp) == ["capt-captcontrolplane/Apply"]
                    && cluster_ok)
            }
        }
    };
    let last_host = last_output.trim_start_matches("https://").to_owned();
    system
        .wait_for(
            "the endpoints CAPT writes back to the Workspace's, owned by CAPT alone",
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
            "the endpoints CAPT writes following the Workspace again",
            Duration::from_secs(15),
            want("after-release.example.com".into()),
        )
        .await?;
    // Beside core the Cluster's endpoint is left without an owner (the operator released
    // the writers core's copy lost it to), which the audit rightly reports: audit the
    // control plane there.
    let audited: &[&str] = if beside_core {
        &["captcontrolplane/demo"]
    } else {
        &[]
    };
    audit_clean(
        &stack.ns.name,
        audited,
        "the ownership audit after the release",
    )?;
    Ok(())
}

/// Through the race, the release and the writes after it, every version the watches saw
/// of either object had a usable endpoint.
async fn assert_endpoints_never_missing(stack: &Stack) -> Result<()> {
    watch_caught_up(&stack.system, &stack.cps, &stack.cp_counts).await?;
    watch_caught_up(&stack.system, &stack.clusters, &stack.cluster_counts).await?;
    for w in &stack.watches {
        w.abort();
    }
    let report = |c: &Counts| {
        (
            c.seen.load(Ordering::Relaxed),
            c.missing.load(Ordering::Relaxed),
            c.errors.load(Ordering::Relaxed),
        )
    };
    let (cp_seen, cp_missing, cp_errors) = report(&stack.cp_counts);
    let (cl_seen, cl_missing, cl_errors) = report(&stack.cluster_counts);
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
