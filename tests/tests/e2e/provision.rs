//! Provisioning: the sample Cluster goes from nothing to provisioned with every field owned
//! as planned, and then stays still (no write, no reconcile).

use crate::common::{ONE_AT_A_TIME, endpoint_host, provisioned};
use anyhow::Result;
use capt_tests::system::System;
use capt_tests::{CLUSTER_V1BETA2, TestNamespace, env};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The claim's window: at rest, no write and no reconcile over this long.
const STEADY_WINDOW: Duration = Duration::from_secs(30);
/// The claim's window: a wake waits at most 10 s for the cache to show our own write
/// (`rewake.rs`); this long after the last intent computed behind it, every wake started
/// before has either been woken by the cache or given up.
const REWAKE_WINDOW: Duration = Duration::from_secs(11);

#[tokio::test]
async fn a_cluster_goes_from_nothing_to_provisioned_with_its_endpoint_set() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let (ns, system) = provisioned("e2e-up", false).await?;
    println!("Provisioned in {:.1} s", started.elapsed().as_secs_f64());

    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    let endpoint_host = endpoint_host(&ns.name);
    assert_eq!(
        cp["spec"]["controlPlaneEndpoint"],
        json!({"host": endpoint_host, "port": 443})
    );
    assert_eq!(cp["status"]["phase"], "Ready");
    assert_eq!(cp["status"]["ready"], true);
    assert_eq!(cp["status"]["initialized"], true);
    assert_eq!(
        cp["status"]["workspaceStatus"]["atProvider"]["outputs"]["cluster_endpoint"],
        format!("https://{endpoint_host}")
    );
    let cluster = system.get(&[CLUSTER_V1BETA2, "demo"])?.unwrap();
    assert_eq!(
        cluster["spec"]["controlPlaneEndpoint"],
        json!({"host": endpoint_host, "port": 443})
    );
    assert_eq!(
        cluster["status"]["initialization"],
        json!({"infrastructureProvisioned": true, "controlPlaneInitialized": true})
    );
    let cc = system.get(&["captcluster", "demo"])?.unwrap();
    assert_eq!(
        cc["status"]["vpcId"],
        format!("vpc-{}", capt_tests::eks_name(&ns.name, "demo"))
    );
    assert_eq!(cc["status"]["ready"], true);

    // Every status and endpoint field has the owner of the ownership plan.
    let owner = |obj: &Value, path: &[&str], sub: &str| -> Vec<String> {
        obj["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["subresource"].as_str().unwrap_or("") == sub)
            .filter(|e| {
                path.iter()
                    .try_fold(&e["fieldsV1"], |v, p| v.get(format!("f:{p}")))
                    .is_some()
            })
            .map(|e| e["manager"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        owner(&cp, &["status", "workspaceStatus", "atProvider"], "status"),
        ["capt-captcontrolplane"]
    );
    assert_eq!(
        owner(&cp, &["spec", "controlPlaneEndpoint"], ""),
        ["capt-captcontrolplane"]
    );
    // Beside Cluster API core the Cluster's fields are core's (manager `manager`); without it,
    // capt-cluster writes them (docs/cluster-api.md).
    let cluster_writer = if env().core {
        "manager"
    } else {
        "capt-cluster"
    };
    assert_eq!(
        owner(&cluster, &["spec", "controlPlaneEndpoint"], ""),
        [cluster_writer]
    );
    assert_eq!(
        owner(&cluster, &["status", "phase"], "status"),
        [cluster_writer]
    );
    assert_eq!(
        owner(&cc, &["status", "vpcId"], "status"),
        ["capt-captcluster"]
    );
    // The v1beta2 contract's fields, and the v1beta1 conditions kept for the transition:
    // each with its kind's manager alone.
    for path in [
        &["status", "initialization", "provisioned"][..],
        &["status", "deprecated", "v1beta1", "conditions"],
    ] {
        assert_eq!(owner(&cc, path, "status"), ["capt-captcluster"], "{path:?}");
    }
    for path in [
        &["status", "initialization", "controlPlaneInitialized"][..],
        &["status", "deprecated", "v1beta1", "conditions"],
    ] {
        assert_eq!(
            owner(&cp, path, "status"),
            ["capt-captcontrolplane"],
            "{path:?}"
        );
    }
    assert_eq!(cc["status"]["initialization"]["provisioned"], true);
    assert_eq!(
        cp["status"]["initialization"]["controlPlaneInitialized"],
        true
    );
    let _ = ns;
    Ok(())
}

#[tokio::test]
async fn steady_state_makes_no_writes_and_no_reconciles_over_30_seconds() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("e2e-steady", false).await?;
    system.wait_samples_rest().await?;
    let versions = || -> Result<BTreeMap<String, String>> {
        let mut v = BTreeMap::new();
        for kind in [
            "cluster",
            "captcluster",
            "captcontrolplane",
            "workspacetemplateapply",
        ] {
            let out = env().kubectl_ok(
                &[
                    "get",
                    kind,
                    "-n",
                    &ns.name,
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.name}={.metadata.resourceVersion} {end}",
                ],
                None,
            )?;
            v.insert(kind.to_owned(), out);
        }
        let ws = env().kubectl_ok(
            &[
                "get",
                "workspaces",
                "-l",
                &format!("{}={}", capt_tests::system::APPLY_NAMESPACE_LABEL, ns.name),
                "-o",
                "jsonpath={range .items[*]}{.metadata.name}={.metadata.resourceVersion} {end}",
            ],
            None,
        )?;
        v.insert("workspace".into(), ws);
        Ok(v)
    };
    let before = versions()?;
    let reconciles = system
        .controller_metric("capt_reconciles_total", &[])
        .await?;
    let intents = system
        .controller_metric("capt_intents_published_total", &[])
        .await?;
    let writes = system
        .applier
        .metric("status_applier_api_writes_total", &[])
        .await?;
    tokio::time::sleep(STEADY_WINDOW).await;
    assert_eq!(versions()?, before, "no object changed");
    assert_eq!(
        system
            .controller_metric("capt_reconciles_total", &[])
            .await?,
        reconciles,
        "no reconcile"
    );
    assert_eq!(
        system
            .controller_metric("capt_intents_published_total", &[])
            .await?,
        intents,
        "no intent"
    );
    assert_eq!(
        system
            .applier
            .metric("status_applier_api_writes_total", &[])
            .await?,
        writes,
        "no write"
    );
    println!(
        "steady state over {STEADY_WINDOW:?}: 0 writes, 0 reconciles (after {reconciles} reconciles and {writes} writes to provision)"
    );
    Ok(())
}

/// The controller's own spec writes (the apply's recorded name, the control plane's
/// endpoint) make a new generation. A status computed beside such a write observes the new
/// generation: one written for the old one is written again a moment later, for its
/// `observedGeneration` alone. A watch of both CAPT kinds from before their creation checks
/// every status change of a provisioning: each observes the generation its object had then.
#[tokio::test]
async fn every_status_change_observes_the_generation_its_object_had_then() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "e2e-generation").await?;
    let system = System::start_with(&ns.name, 200, &[]).await?;
    let trails: Vec<_> = ["CAPTCluster", "CAPTControlPlane"]
        .into_iter()
        .map(|kind| {
            let (group, plural) = match kind {
                "CAPTCluster" => ("infrastructure.cluster.x-k8s.io", "captclusters"),
                _ => ("controlplane.cluster.x-k8s.io", "captcontrolplanes"),
            };
            let gvk = GroupVersionKind::gvk(group, "v1beta1", kind);
            let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &resource);
            let trail = Arc::new(Mutex::new(Vec::new()));
            let (recorded, watched) = (trail.clone(), api.clone());
            let task = tokio::spawn(async move {
                let mut events = watcher(watched, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
                    .boxed();
                while let Some(Ok(o)) = events.next().await {
                    let status = o.data.get("status").cloned().unwrap_or(Value::Null);
                    let version = o.metadata.resource_version.clone();
                    recorded
                        .lock()
                        .unwrap()
                        .push((o.metadata.generation, status, version));
                }
            });
            (kind, api, trail, task)
        })
        .collect();
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    // The last status changes of provisioning written, and each watch at its object's
    // current version.
    system.wait_samples_rest().await?;
    for (_, api, trail, _) in &trails {
        system
            .wait_for(
                "the watch to see the object's current version",
                Duration::from_secs(10),
                || async {
                    let current = api.get("demo").await?.metadata.resource_version;
                    Ok(trail.lock().unwrap().last().map(|(_, _, v)| v) == Some(&current))
                },
            )
            .await?;
    }
    let behind_at_rest = system
        .controller_metric("capt_intents_behind_total", &[])
        .await?;
    for (kind, _, trail, task) in trails {
        task.abort();
        let trail = trail.lock().unwrap();
        let mut changes = Vec::new();
        for pair in trail.windows(2) {
            let ((_, before, _), (generation, after, _)) = (&pair[0], &pair[1]);
            if before == after {
                continue;
            }
            changes.push(changed_keys(before, after));
            assert_eq!(
                after["observedGeneration"].as_i64(),
                *generation,
                "{kind} demo: a status change observes generation {} while the object is at {generation:?}:\n{after:#}",
                after["observedGeneration"]
            );
        }
        println!(
            "{kind} demo: {} status changes, each for its object's generation: {changes:?}",
            changes.len()
        );
        assert!(
            !changes.is_empty(),
            "{kind} demo: the watch saw its status change"
        );
    }
    // A publication computed on a cache behind our own write waits for the cache, and the
    // cache always catches up: no wake waits its whole limit (10 s, `rewake.rs`). With no
    // intent computed behind, no wake was started, and there is nothing to wait for.
    if behind_at_rest > 0.0 {
        tokio::time::sleep(REWAKE_WINDOW).await;
    }
    let behind = system
        .controller_metric("capt_intents_behind_total", &[])
        .await?;
    let gave_up = system
        .controller_metric("capt_rewake_gave_up_total", &[])
        .await?;
    println!(
        "intents computed on a cache behind our own write: {behind}; wakes that gave up: {gave_up}"
    );
    assert_eq!(gave_up, 0.0, "a wake waited its whole limit for our write");
    Ok(())
}

/// The status keys whose values differ (conditions by type), for the test's report.
fn changed_keys(before: &Value, after: &Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let (b, a) = (
        before.as_object().unwrap_or(&empty),
        after.as_object().unwrap_or(&empty),
    );
    let mut keys: Vec<String> = b
        .keys()
        .chain(a.keys())
        .filter(|k| b.get(*k) != a.get(*k) && *k != "conditions")
        .cloned()
        .collect();
    keys.sort();
    keys.dedup();
    let conditions = |v: Option<&Value>| -> BTreeMap<String, Value> {
        v.and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| (c["type"].as_str().unwrap_or_default().to_owned(), c.clone()))
            .collect()
    };
    let (bc, ac) = (
        conditions(b.get("conditions")),
        conditions(a.get("conditions")),
    );
    let types: std::collections::BTreeSet<_> = bc.keys().chain(ac.keys()).collect();
    keys.extend(
        types
            .into_iter()
            .filter(|t| bc.get(*t) != ac.get(*t))
            .map(|t| format!("conditions[{t}]")),
    );
    keys
}
