//! Beside the real Cluster API core manager (v1.14, started by `hack/testenv.sh` with its
//! admission and conversion webhooks; `hack/core-suite.sh` runs them beside v1.13 too): the provider contract (the contract label, pausing, `externalManagedControlPlane`,
//! the kubeconfig Secret), sharing the Cluster with core, deletion through core's finalizer,
//! and bad input. Each test runs its own status-applier, controller and fake provider; they
//! take turns.

use anyhow::{Context, Result, ensure};
use capt_tests::audit_log::{AuditLog, without_noop_polls, workspace_versions, writes_over};
use capt_tests::deletion_order::{Check, DeletionOrder};
use capt_tests::fake_provider::APPLY_GATE_ANNOTATION;
use capt_tests::system::System;
use capt_tests::{CLUSTER_V1BETA1, CLUSTER_V1BETA2, Scratch, ScratchFile, TestNamespace, env};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

const CORE_FINALIZER: &str = "cluster.cluster.x-k8s.io";
/// The field manager of core's writes: client-go names it after the binary, `manager`.
const CORE_MANAGER: &str = "manager";
/// The claim's window: at rest nothing is written, by any manager, over a minute.
const AT_REST_WINDOW: Duration = Duration::from_secs(60);
/// The claim's window: a spec change to a paused stack is held this long (the controller
/// polls every second, so it has had every chance to act on it).
const PAUSED_WINDOW: Duration = Duration::from_secs(8);
/// The claim's window: a deleted paused Cluster is held this long, nothing of it deleted.
const PAUSED_DELETION_WINDOW: Duration = Duration::from_secs(8);
/// The claim's window: no write while the references stay missing (no hot loop).
const MISSING_REFERENCES_WINDOW: Duration = Duration::from_secs(20);

/// A namespace of the test's own with the system running in it beside Cluster API core
/// (fake provider delay `delay_ms`, extra controller arguments `args`).
async fn started(prefix: &str, delay_ms: u64, args: &[&str]) -> Result<(TestNamespace, System)> {
    ensure!(
        env().core,
        "these tests need Cluster API core (CAPT_TESTENV_CORE=1)"
    );
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, prefix).await?;
    let system = System::start_with(&ns.name, delay_ms, args).await?;
    Ok((ns, system))
}

async fn provisioned(prefix: &str) -> Result<(TestNamespace, System)> {
    let (ns, system) = started(prefix, 200, &["--stuck-deletion-seconds", "3"]).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    Ok((ns, system))
}

/// Waits until core reports the Cluster `demo` Ready (its v1beta1 `Ready` condition).
async fn wait_ready(system: &System) -> Result<()> {
    let ready = || async {
        let cluster = system.get(&[CLUSTER_V1BETA1, "demo"])?;
        Ok(cluster.is_some_and(|c| is_true(&c, "Ready")))
    };
    let timeout = Duration::from_secs(30);
    system
        .wait_for("the Cluster's Ready condition", timeout, ready)
        .await
}

/// Waits until the Cluster `demo` is gone: core removed its finalizer once ours were done.
async fn wait_cluster_gone(system: &System) -> Result<()> {
    let gone = || async { Ok(system.get(&[CLUSTER_V1BETA2, "demo"])?.is_none()) };
    let timeout = Duration::from_secs(60);
    system
        .wait_for("the Cluster to be gone", timeout, gone)
        .await
}

fn is_true(obj: &Value, type_: &str) -> bool {
    capt_tests::condition(obj, type_).is_some_and(|c| c["status"] == "True")
}

/// The managers with an entry on `obj` that owns at least one field.
fn managers(obj: &Value) -> Vec<String> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["fieldsV1"].as_object().is_some_and(|f| !f.is_empty()))
        .map(|e| e["manager"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// The GroupVersionKind of a short name used in these tests.
fn gvk(short: &str) -> GroupVersionKind {
    let (group, kind) = match short {
        "cluster" => ("cluster.x-k8s.io", "Cluster"),
        "captcontrolplane" => ("controlplane.cluster.x-k8s.io", "CAPTControlPlane"),
        "captcluster" => ("infrastructure.cluster.x-k8s.io", "CAPTCluster"),
        "apply" => ("infrastructure.cluster.x-k8s.io", "WorkspaceTemplateApply"),
        _ => ("tf.upbound.io", "Workspace"),
    };
    GroupVersionKind::gvk(group, "v1beta1", kind)
}

/// Pauses or unpauses the Cluster `demo`, as `clusterctl move` does.
fn set_paused(ns: &str, paused: bool) -> Result<()> {
    merge_patch("cluster", "demo", ns, json!({"spec": {"paused": paused}}))
}

fn merge_patch(kind: &str, name: &str, ns: &str, patch: Value) -> Result<()> {
    env().kubectl_ok(
        &[
            "patch",
            kind,
            name,
            "-n",
            ns,
            "--type=merge",
            "--field-manager=capt-test",
            "-p",
            &patch.to_string(),
        ],
        None,
    )?;
    Ok(())
}

#[tokio::test]
async fn core_adopts_our_kinds_and_the_cluster_becomes_ready_with_no_conflict() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    for crd in [
        "captclusters.infrastructure.cluster.x-k8s.io",
        "captcontrolplanes.controlplane.cluster.x-k8s.io",
    ] {
        // Core reads the newest contract a CRD names (v1beta2), through our API's v1beta1;
        // the v1beta1 label stays for the transition.
        for contract in ["v1beta1", "v1beta2"] {
            let label = env().kubectl_ok(
                &[
                    "get",
                    "crd",
                    crd,
                    "-o",
                    &format!(r"jsonpath={{.metadata.labels.cluster\.x-k8s\.io/{contract}}}"),
                ],
                None,
            )?;
            assert_eq!(label, "v1beta1", "{crd}: the {contract} contract label");
        }
    }
    let (ns, system) = provisioned("core-up").await?;
    wait_ready(&system).await?;
    let cluster = system
        .get(&[CLUSTER_V1BETA1, "demo"])?
        .context("the Cluster")?;
    assert!(
        cluster["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == CORE_FINALIZER)),
        "core manages the Cluster"
    );
    for kind in ["captcluster", "captcontrolplane"] {
        let obj = system.get(&[kind, "demo"])?.context(kind)?;
        let owner = &obj["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "Cluster", "{kind}: adopted by core");
        assert_eq!(owner["uid"], cluster["metadata"]["uid"], "{kind}");
        // Since v1.11 core's reference names the stored v1beta2 and is a plain one (v1.10
        // set `controller` and `blockOwnerDeletion`); the controller finds the Cluster by any
        // reference of that group and kind (`reconcile/claims.rs` `cluster_name`).
        assert_eq!(owner["apiVersion"], "cluster.x-k8s.io/v1beta2", "{kind}");
    }
    // The made-up host of the samples' outputs: the EKS cluster's name carries the namespace.
    let endpoint_host = capt_tests::sample_endpoint_host(&ns.name, "demo");
    assert_eq!(
        cluster["spec"]["controlPlaneEndpoint"],
        json!({"host": endpoint_host, "port": 443})
    );
    assert_eq!(cluster["status"]["phase"], "Provisioned");
    assert_eq!(cluster["status"]["infrastructureReady"], true);
    assert_eq!(cluster["status"]["controlPlaneReady"], true);
    // Every one of those is core's: capt-cluster writes nothing core writes.
    let owners = managers(&cluster);
    assert!(!owners.iter().any(|m| m == "capt-cluster"), "{owners:?}");

    // The v1beta2 contract, as core reads it: initialization from ours, and its conditions
    // mirrored from our `Ready` and `Available` (our reasons, not core's fallback ones).
    let v1beta2 = system.get(&[CLUSTER_V1BETA2, "demo"])?.context("v1beta2")?;
    assert_eq!(
        v1beta2["status"]["initialization"],
        json!({"infrastructureProvisioned": true, "controlPlaneInitialized": true})
    );
    let infra =
        capt_tests::condition(&v1beta2, "InfrastructureReady").context("InfrastructureReady")?;
    assert_eq!(
        (&infra["status"], &infra["reason"]),
        (&json!("True"), &json!("VPCReady")),
        "{infra}"
    );
    let available = capt_tests::condition(&v1beta2, "ControlPlaneAvailable")
        .context("ControlPlaneAvailable")?;
    assert_eq!(
        (&available["status"], &available["reason"]),
        (&json!("True"), &json!("ControlPlaneReady")),
        "{available}"
    );
    let cc = system
        .get(&["captcluster", "demo"])?
        .context("captcluster")?;
    assert_eq!(cc["status"]["initialization"], json!({"provisioned": true}));
    if let Some(domains) = cc["status"]["failureDomains"].as_array() {
        // Core surfaces the v1beta2 list as it is (sorted by name, as ours is).
        assert_eq!(&v1beta2["status"]["failureDomains"], &json!(domains));
    }

    let cp = system.get(&["captcontrolplane", "demo"])?.context("cp")?;
    assert_eq!(cp["status"]["externalManagedControlPlane"], true);
    assert_eq!(
        cp["status"]["initialization"],
        json!({"controlPlaneInitialized": true})
    );
    assert_eq!(cp["status"]["initialized"], true);
    assert_eq!(cp["status"]["ready"], true);
    assert_eq!(cp["status"]["version"], "1.31");
    assert_eq!(
        cp["status"]["endpoint"],
        format!("{endpoint_host}:443"),
        "the printed endpoint"
    );
    let secret = system.get(&["secret", "demo-kubeconfig"])?;
    let secret = secret.context("the demo-kubeconfig Secret")?;
    assert_eq!(secret["type"], "cluster.x-k8s.io/secret");
    assert_eq!(
        secret["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"],
        "demo"
    );
    assert!(secret["data"]["value"].is_string());

    let conflicts = system
        .applier
        .metric("status_applier_conflicts_total", &[])
        .await?;
    assert_eq!(conflicts, 0.0, "no conflict while provisioning beside core");

    let audit = capt_tests::applier::audit_clean(
        &ns.name,
        &[],
        "the ownership audit is clean with core's managers present",
    )?;
    assert!(
        audit.contains(CORE_MANAGER),
        "core's writes are in the audit"
    );
    Ok(())
}

#[tokio::test]
async fn sixty_seconds_at_rest_with_core_make_no_write_at_all() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("core-rest").await?;
    wait_ready(&system).await?;
    system.wait_samples_rest().await?;
    // The provider's polls (a status Update of each Workspace every second, stored as nothing
    // when unchanged) are not writes; every other request is.
    let (writes, polls) = writes_over(env(), &ns.name, AT_REST_WINDOW).await?;
    let listed: Vec<String> = writes.iter().map(ToString::to_string).collect();
    assert!(
        writes.is_empty(),
        "{} writes over {AT_REST_WINDOW:?} at rest (API server audit log):\n{}",
        writes.len(),
        listed.join("\n")
    );
    println!(
        "{AT_REST_WINDOW:?} at rest beside Cluster API core: 0 writes in the API server's audit log \
         ({polls} no-op status Updates of the provider's polls left out)"
    );
    Ok(())
}

/// While the Cluster is paused nothing changes but the `Paused` conditions: not the
/// Workspace (with the real provider a spec change is a Terraform run), not an apply, not a
/// finalizer, not a status. Unpausing lets the change through.
#[tokio::test]
async fn a_paused_cluster_holds_workspaces_applies_and_statuses_until_unpaused() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("core-pause").await?;
    // Settled before the pause: everything provisioning wrote has been written.
    system.wait_samples_rest().await?;
    set_paused(&ns.name, true)?;
    system
        .wait_for("Paused conditions", Duration::from_secs(20), || async {
            let cc = system.get(&["captcluster", "demo"])?.unwrap_or_default();
            let cp = system
                .get(&["captcontrolplane", "demo"])?
                .unwrap_or_default();
            Ok(is_true(&cc, "Paused") && is_true(&cp, "Paused"))
        })
        .await?;
    // Settled on the pause: core has seen it (its Paused condition observes the paused
    // Cluster's generation), and the applier has written our Paused conditions.
    system
        .wait_for(
            "core's Paused condition",
            Duration::from_secs(20),
            || async {
                let cluster = system.get(&[CLUSTER_V1BETA2, "demo"])?.unwrap_or_default();
                Ok(capt_tests::condition(&cluster, "Paused").is_some_and(|c| {
                    c["status"] == "True"
                        && c["observedGeneration"] == cluster["metadata"]["generation"]
                }))
            },
        )
        .await?;
    let client = env().client().await?;
    for kind in ["captcluster", "captcontrolplane"] {
        let api = Api::<DynamicObject>::namespaced_with(
            client.clone(),
            &ns.name,
            &ApiResource::from_gvk(&gvk(kind)),
        );
        system
            .applier
            .settled_on(&api, "demo", Duration::from_secs(20))
            .await?;
    }
    let statuses = || -> Result<Vec<Value>> {
        let mut all = Vec::new();
        for kind in ["captcluster", "captcontrolplane"] {
            let mut obj = system.get(&[kind, "demo"])?.context(kind)?;
            let list = obj["status"]["conditions"]
                .as_array_mut()
                .context("conditions")?;
            list.retain(|c| c["type"] != "Paused");
            all.push(obj["status"].take());
        }
        Ok(all)
    };
    let before = statuses()?;
    let versions = workspace_versions(&ns.name)?;
    let log = AuditLog::from_now()?;
    merge_patch(
        "captcontrolplane",
        "demo",
        &ns.name,
        json!({"spec": {"version": "1.32"}}),
    )?;
    let generation =
        system.get(&["captcontrolplane", "demo"])?.context("cp")?["metadata"]["generation"].clone();
    tokio::time::sleep(PAUSED_WINDOW).await;
    // The controller did see the change in the window: its Paused condition observes it.
    let cp = system.get(&["captcontrolplane", "demo"])?.context("cp")?;
    assert_eq!(
        capt_tests::condition(&cp, "Paused").context("Paused")?["observedGeneration"],
        generation,
        "the controller reconciled the changed spec while paused"
    );
    let (writes, _) = without_noop_polls(
        log.writes_in(&ns.name)?,
        &versions,
        &workspace_versions(&ns.name)?,
    );
    // One write is allowed besides ours: the Paused condition observes the new generation.
    let paused_condition = format!(
        "patch captcontrolplanes/status {}/demo by capt-captcontrolplane",
        ns.name
    );
    // A patch refused for a stale resourceVersion (409) wrote nothing: the applier planned
    // on a view from before the test's own patch, and applies again once it has read the
    // object (under load its watch can trail that patch).
    let (refused, others): (Vec<_>, Vec<_>) = writes
        .into_iter()
        .filter(|w| w.manager != "capt-test")
        .partition(|w| w.is_refused_as_stale());
    let others: Vec<String> = others.iter().map(ToString::to_string).collect();
    println!(
        "while paused: {} write(s) besides the test's, {} refused as stale",
        others.len(),
        refused.len()
    );
    assert!(
        others.is_empty() || others == [paused_condition],
        "nothing but our version change and the Paused condition is written while paused:\n{}",
        others.join("\n")
    );
    assert_eq!(
        statuses()?,
        before,
        "no status but Paused changes while paused"
    );

    set_paused(&ns.name, false)?;
    let workspace = capt_controller::render::workspace_name(&ns.name, "demo-controlplane");
    system
        .wait_for(
            "the Workspace to render version 1.32 after unpausing",
            Duration::from_secs(30),
            || async {
                let ws = env().kubectl_ok(&["get", "workspace", &workspace, "-o", "json"], None)?;
                Ok(ws.contains("1.32"))
            },
        )
        .await?;
    let cp = system.get(&["captcontrolplane", "demo"])?.context("cp")?;
    assert_eq!(
        capt_tests::condition(&cp, "Paused").context("Paused")?["status"],
        "False"
    );
    Ok(())
}

/// `kubectl delete cluster` (background, as users do): core deletes the control plane, waits
/// for it, then the infrastructure; our finalizers keep the seeds' order inside that, and
/// the Cluster keeps its endpoint to the end.
#[tokio::test]
async fn deleting_the_cluster_goes_through_core_in_order_and_keeps_its_endpoint() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, _system) = provisioned("core-delete").await?;
    let client = env().client().await?;
    let n = &ns.name;
    let namespaced = |resource: &str| -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), n, &ApiResource::from_gvk(&gvk(resource)))
    };
    let workspaces: Api<DynamicObject> =
        Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk("workspace")));
    let objects: Vec<(&str, Api<DynamicObject>, String)> = vec![
        ("cluster", namespaced("cluster"), "demo".into()),
        (
            "captcontrolplane",
            namespaced("captcontrolplane"),
            "demo".into(),
        ),
        ("cp-apply", namespaced("apply"), "demo-controlplane".into()),
        (
            "cp-workspace",
            workspaces.clone(),
            capt_controller::render::workspace_name(n, "demo-controlplane"),
        ),
        ("captcluster", namespaced("captcluster"), "demo".into()),
        ("vpc-apply", namespaced("apply"), "demo-vpc".into()),
        (
            "vpc-workspace",
            workspaces,
            capt_controller::render::workspace_name(n, "demo-vpc"),
        ),
    ];
    // Every version of the Cluster, to its last, keeps its endpoint.
    let endpoint_host = capt_tests::sample_endpoint_host(n, "demo");
    let endpoint_kept: Check = Box::new(move |c: &DynamicObject| {
        let host = &c.data["spec"]["controlPlaneEndpoint"]["host"];
        (*host != endpoint_host).then(|| {
            format!(
                "the endpoint of a Cluster going away is never blanked: {host} at resourceVersion {:?}",
                c.metadata.resource_version
            )
        })
    });
    let labels: Vec<&str> = objects.iter().map(|(l, ..)| *l).collect();
    let order = DeletionOrder::watch_checking(objects, vec![("cluster", endpoint_kept)]).await?;
    env().kubectl_ok(
        &["delete", "cluster", "demo", "-n", n, "--wait=false"],
        None,
    )?;
    order.wait_gone(&labels, Duration::from_secs(90)).await?;
    println!("deletion order (resourceVersions): {:?}", order.seen());
    assert_eq!(order.violations(), Vec::<String>::new());
    let (gone, deleting) = (|l| order.gone(l), |l| order.deleting(l));
    assert!(gone("cp-workspace") <= gone("captcontrolplane"));
    assert!(gone("cp-apply") <= gone("captcontrolplane"));
    assert!(gone("captcontrolplane") <= deleting("vpc-apply"));
    assert!(gone("vpc-workspace") <= gone("captcluster"));
    assert!(gone("captcluster") <= gone("cluster"));
    Ok(())
}

/// As core does for the Cluster, a paused Cluster that is deleted is held: nothing of it is
/// deleted until it is unpaused.
#[tokio::test]
async fn a_paused_cluster_that_is_deleted_is_held_until_unpaused() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("core-pause-delete").await?;
    set_paused(&ns.name, true)?;
    env().kubectl_ok(
        &["delete", "cluster", "demo", "-n", &ns.name, "--wait=false"],
        None,
    )?;
    tokio::time::sleep(PAUSED_DELETION_WINDOW).await;
    for kind in ["captcluster", "captcontrolplane", "workspacetemplateapply"] {
        let out = env().kubectl_ok(
            &[
                "get",
                kind,
                "-n",
                &ns.name,
                "-o",
                "jsonpath={range .items[*]}{.metadata.name}:{.metadata.deletionTimestamp} {end}",
            ],
            None,
        )?;
        assert!(
            !out.trim().is_empty() && out.split_whitespace().all(|o| o.ends_with(':')),
            "{kind}: still there and not deleting while paused: {out:?}"
        );
    }
    set_paused(&ns.name, false)?;
    wait_cluster_gone(&system).await?;
    let left = env().kubectl_ok(
        &[
            "get",
            "captcluster,captcontrolplane,workspacetemplateapply",
            "-n",
            &ns.name,
            "-o",
            "name",
        ],
        None,
    )?;
    assert_eq!(left, "", "everything went once unpaused");
    Ok(())
}

/// A Cluster whose infrastructureRef names nothing, and a control plane no Cluster owns:
/// each is explained by a condition, and neither makes a write while nothing changes.
#[tokio::test]
async fn missing_references_are_explained_without_a_hot_loop() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = started("core-bad", 200, &[]).await?;
    let docs = [
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
               "metadata": {"name": "lost", "namespace": ns.name},
               "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                              "kind": "CAPTCluster", "name": "nowhere"}}}),
        json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
               "metadata": {"name": "orphan", "namespace": ns.name},
               "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "eks"}}}),
    ];
    let text: Vec<String> = docs.iter().map(Value::to_string).collect();
    env().kubectl_ok(&["apply", "-f", "-"], Some(&text.join("\n")))?;
    system
        .wait_for("both explained", Duration::from_secs(30), || async {
            let cluster = system.get(&[CLUSTER_V1BETA2, "lost"])?.unwrap_or_default();
            let infra = capt_tests::condition(&cluster, "InfrastructureReady")
                .cloned()
                .unwrap_or_default();
            let cp = system
                .get(&["captcontrolplane", "orphan"])?
                .unwrap_or_default();
            let waiting = capt_tests::condition(&cp, "Ready")
                .is_some_and(|c| c["reason"] == "WaitingForCluster");
            Ok(infra["status"] == "False"
                && infra["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("CAPTCluster does not exist"))
                && waiting)
        })
        .await?;
    // Settled: the applier has settled on the control plane, and core's status
    // of the Cluster observes its generation and carries core's finalizer.
    let client = env().client().await?;
    let cps = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &ns.name,
        &ApiResource::from_gvk(&gvk("captcontrolplane")),
    );
    system
        .applier
        .settled_on(&cps, "orphan", Duration::from_secs(20))
        .await?;
    system
        .wait_for(
            "core's status of the Cluster",
            Duration::from_secs(20),
            || async {
                let cluster = system.get(&[CLUSTER_V1BETA2, "lost"])?.unwrap_or_default();
                Ok(
                    cluster["status"]["observedGeneration"] == cluster["metadata"]["generation"]
                        && cluster["metadata"]["finalizers"]
                            .as_array()
                            .is_some_and(|f| f.iter().any(|f| f == CORE_FINALIZER)),
                )
            },
        )
        .await?;
    let (writes, _) = writes_over(env(), &ns.name, MISSING_REFERENCES_WINDOW).await?;
    let writes: Vec<String> = writes.iter().map(ToString::to_string).collect();
    assert!(
        writes.is_empty(),
        "no write while nothing changes:\n{}",
        writes.join("\n")
    );
    let cp = system.get(&["captcontrolplane", "orphan"])?.context("cp")?;
    assert_eq!(
        cp["status"]["failureReason"],
        Value::Null,
        "waiting is not a failure"
    );
    assert!(
        system
            .get(&["workspacetemplateapply", "orphan-controlplane"])?
            .is_none(),
        "nothing is built for a control plane no Cluster owns"
    );
    Ok(())
}

/// The condition `type_` of the Cluster `demo` in core's v1beta2 view, as `(status, reason)`.
fn cluster_condition(system: &System, type_: &str) -> Result<(String, String)> {
    let cluster = system.get(&[CLUSTER_V1BETA2, "demo"])?.unwrap_or_default();
    let c = capt_tests::condition(&cluster, type_)
        .cloned()
        .unwrap_or_default();
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    Ok((text(&c["status"]), text(&c["reason"])))
}

/// Sets (`Some`) or removes (`None`) the fake provider's failure on a Workspace.
fn fail_workspace(workspace: &str, message: Option<&str>) -> Result<()> {
    let annotation = match message {
        Some(m) => format!("fake.tf.upbound.io/fail={m}"),
        None => "fake.tf.upbound.io/fail-".into(),
    };
    env().kubectl_ok(
        &[
            "annotate",
            "workspace",
            workspace,
            &annotation,
            "--overwrite",
        ],
        None,
    )?;
    Ok(())
}

/// The v1beta2 contract: core mirrors our CAPTCluster's `Ready` into the Cluster's
/// `InfrastructureReady` and our CAPTControlPlane's `Available` into `ControlPlaneAvailable`.
/// A failure of the provisioned VPC and control plane takes both False with our reason while
/// `initialization` stays true (core's fallback, from the sticky flags, would have kept them
/// True), and the fix takes them True again. The VPC's zones reach the Cluster as the
/// v1beta2 failure-domain list.
#[tokio::test]
async fn cores_infrastructure_ready_and_control_plane_available_follow_our_conditions() -> Result<()>
{
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("core-follow").await?;
    let n = &ns.name;
    let outputs = json!({"vpc_id": "vpc-demo", "azs": ["ap-northeast-1c", "ap-northeast-1a"]});
    merge_patch(
        "workspacetemplate",
        "vpc",
        n,
        json!({"spec": {"template": {"metadata":
            {"annotations": {"fake.tf.upbound.io/outputs": outputs.to_string()}}}}}),
    )?;
    let domains = json!([
        {"name": "ap-northeast-1a", "controlPlane": true},
        {"name": "ap-northeast-1c", "controlPlane": true},
    ]);
    let both = |status: &'static str, reason: &'static str| {
        let system = &system;
        move || async move {
            let infra = cluster_condition(system, "InfrastructureReady")?;
            let cp = cluster_condition(system, "ControlPlaneAvailable")?;
            let want = (status.to_owned(), reason.to_owned());
            Ok(infra.0 == want.0 && cp == want && (status == "False" || infra.1 == "VPCReady"))
        }
    };
    system
        .wait_for(
            "the Cluster's failure domains from the VPC's zones",
            Duration::from_secs(30),
            || async {
                let cluster = system.get(&[CLUSTER_V1BETA2, "demo"])?.unwrap_or_default();
                Ok(cluster["status"]["failureDomains"] == domains)
            },
        )
        .await?;
    let cc = system
        .get(&["captcluster", "demo"])?
        .context("captcluster")?;
    assert_eq!(
        cc["status"]["failureDomains"], domains,
        "ours, keyed by name"
    );
    system
        .wait_for(
            "InfrastructureReady and ControlPlaneAvailable True from ours",
            Duration::from_secs(30),
            both("True", "ControlPlaneReady"),
        )
        .await?;

    let vpc = capt_controller::render::workspace_name(n, "demo-vpc");
    let eks = capt_controller::render::workspace_name(n, "demo-controlplane");
    fail_workspace(&vpc, Some("Error: creating VPC: quota"))?;
    fail_workspace(
        &eks,
        Some("Error: updating EKS Cluster: AccessDeniedException"),
    )?;
    system
        .wait_for(
            "InfrastructureReady and ControlPlaneAvailable False with our reason",
            Duration::from_secs(30),
            both("False", "WorkspaceFailed"),
        )
        .await?;
    assert_eq!(
        cluster_condition(&system, "InfrastructureReady")?,
        ("False".to_owned(), "WorkspaceFailed".to_owned())
    );
    let cluster = system.get(&[CLUSTER_V1BETA2, "demo"])?.context("cluster")?;
    assert_eq!(
        cluster["status"]["initialization"],
        json!({"infrastructureProvisioned": true, "controlPlaneInitialized": true}),
        "initialization is sticky: the conditions, not it, tell the failure"
    );
    let cp = system.get(&["captcontrolplane", "demo"])?.context("cp")?;
    assert_eq!(
        cp["status"]["initialization"],
        json!({"controlPlaneInitialized": true})
    );

    fail_workspace(&vpc, None)?;
    fail_workspace(&eks, None)?;
    system
        .wait_for(
            "InfrastructureReady and ControlPlaneAvailable True again",
            Duration::from_secs(30),
            both("True", "ControlPlaneReady"),
        )
        .await?;
    Ok(())
}

/// Every value a watch saw of the fields core and our controller both care about, on the
/// Cluster and on the CAPTControlPlane, in order.
type Histories = Arc<std::sync::Mutex<BTreeMap<String, Vec<Value>>>>;

/// The value of `field` in `obj`: a JSON pointer, `condition:<Type>` for that condition's
/// `[status, reason]` in `status.conditions` (its message, with its countdowns, left out), or
/// `condition-status:<Type>` for its status alone (its reason instead once that is deletion's
/// `Deleting`, ours, or `ObjectDeleted`, core's once the control plane is gone: the deletion is
/// the one way back to False that is no flip).
fn field_value(obj: &Value, field: &str) -> Value {
    if let Some(type_) = field.strip_prefix("condition:") {
        return capt_tests::condition(obj, type_)
            .map(|c| json!([c["status"], c["reason"]]))
            .unwrap_or(Value::Null);
    }
    if let Some(type_) = field.strip_prefix("condition-status:") {
        // Core may never mirror our `Deleting` (its reconcile can fall after the control plane
        // is gone): True, then straight to False with `ObjectDeleted`.
        return capt_tests::condition(obj, type_)
            .map(|c| match c["reason"].as_str() {
                Some(reason @ ("Deleting" | "ObjectDeleted")) => json!(reason),
                _ => c["status"].clone(),
            })
            .unwrap_or(Value::Null);
    }
    obj.pointer(field).cloned().unwrap_or(Value::Null)
}

/// Records each watched object's `fields` (see [`field_value`]) whenever one of them changes.
fn record(api: Api<DynamicObject>, name: &str, fields: &'static [&'static str], into: Histories) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut events = watcher(api, config)
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(Ok(obj)) = events.next().await {
            let json = serde_json::to_value(&obj).unwrap_or_default();
            let mut h = into.lock().unwrap();
            for f in fields {
                let v = field_value(&json, f);
                let seen = h
                    .entry(format!(
                        "{}{}{f}",
                        obj.types.as_ref().map_or("", |t| &t.kind),
                        if f.starts_with('/') { "" } else { " " }
                    ))
                    .or_default();
                if seen.last() != Some(&v) {
                    seen.push(v);
                }
            }
        }
    });
}

/// Applies the samples with the control plane's Workspace held creating by the fake
/// provider's apply gate, until the gate file returned is written.
fn apply_samples_holding_the_control_plane(system: &System, prefix: &str) -> Result<ScratchFile> {
    let dir = Scratch::new(prefix)?;
    let path = dir.join("gate");
    let gate = ScratchFile::new(dir, path);
    system.apply_samples_edited(|doc| {
        if doc["kind"] == "WorkspaceTemplate" && doc["metadata"]["name"] == "eks" {
            doc["spec"]["template"]["metadata"]["annotations"][APPLY_GATE_ANNOTATION] =
                json!(gate.display().to_string());
        }
    })?;
    Ok(gate)
}

/// A value that comes back after another: `A → B → A`.
fn flips(history: &[Value]) -> Option<String> {
    history.iter().enumerate().find_map(|(i, v)| {
        history[..i.saturating_sub(1)]
            .contains(v)
            .then(|| format!("{history:?}"))
    })
}

/// Provisioning, a version upgrade and deletion beside core: no conflict at the applier, and
/// no field of the Cluster or of the control plane's contract goes back to a value it left.
#[tokio::test]
async fn provisioning_an_upgrade_and_deletion_beside_core_flip_nothing_and_conflict_nowhere()
-> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    ensure!(env().core, "this test needs Cluster API core");
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "core-flips").await?;
    let histories: Histories = Default::default();
    let api = |short| {
        Api::<DynamicObject>::namespaced_with(
            client.clone(),
            &ns.name,
            &ApiResource::from_gvk(&gvk(short)),
        )
    };
    const CLUSTER: &[&str] = &[
        "/status/phase",
        "/status/infrastructureReady",
        "/status/controlPlaneReady",
        "/status/failureReason",
        "/spec/controlPlaneEndpoint",
    ];
    // The v1beta2 view: the contract's initialization and every condition core sets from
    // ours, or from its own view of the Cluster (no status+reason may come back after it left).
    const CLUSTER_V1BETA2_FIELDS: &[&str] = &[
        "/status/initialization/infrastructureProvisioned",
        "/status/initialization/controlPlaneInitialized",
        "condition:InfrastructureReady",
        "condition:ControlPlaneInitialized",
        // Core mirrors our control plane's Available into it, reason included: its status
        // alone, as for ours (the reason goes to WorkspaceUpdating and back in an upgrade).
        "condition-status:ControlPlaneAvailable",
        "condition:Available",
        "condition:Deleting",
        "condition:Paused",
    ];
    const CONTROL_PLANE: &[&str] = &[
        "/status/ready",
        "/status/initialized",
        "/status/initialization/controlPlaneInitialized",
        "/status/version",
        "/status/externalManagedControlPlane",
        "/spec/controlPlaneEndpoint",
        // Its status: the reason may go to WorkspaceUpdating and back during an upgrade (it
        // serves throughout, and says so).
        "condition-status:Available",
    ];
    const CAPT_CLUSTER: &[&str] = &[
        "/status/ready",
        "/status/initialization/provisioned",
        "condition-status:Ready",
    ];
    // Our summaries' reasons, to see where they went (not checked for flips).
    let reasons: Histories = Default::default();
    record(
        api("captcontrolplane"),
        "demo",
        &["condition:Available"],
        reasons.clone(),
    );
    record(api("cluster"), "demo", CLUSTER, histories.clone());
    let v1beta2 = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster");
    let v1beta2 = || {
        Api::<DynamicObject>::namespaced_with(
            client.clone(),
            &ns.name,
            &ApiResource::from_gvk(&v1beta2),
        )
    };
    record(v1beta2(), "demo", CLUSTER_V1BETA2_FIELDS, histories.clone());
    record(
        v1beta2(),
        "demo",
        &["condition:ControlPlaneAvailable"],
        reasons.clone(),
    );
    record(api("captcluster"), "demo", CAPT_CLUSTER, histories.clone());
    record(
        api("captcontrolplane"),
        "demo",
        CONTROL_PLANE,
        histories.clone(),
    );
    let system = System::start_with(&ns.name, 200, &[]).await?;
    // The control plane's Workspace stays creating until core has mirrored its Available as
    // False: the round then always goes False → True → False (deleted), as it does under load.
    let gate = apply_samples_holding_the_control_plane(&system, "core-flips-gate")?;
    system
        .wait_for(
            "core's mirror of the creating control plane's Available",
            Duration::from_secs(60),
            || async {
                let cluster = system.get(&[CLUSTER_V1BETA2, "demo"])?.unwrap_or_default();
                Ok(capt_tests::condition(&cluster, "ControlPlaneAvailable")
                    .is_some_and(|c| c["status"] == "False"))
            },
        )
        .await?;
    std::fs::write(&gate, "")?;
    system.wait_provisioned().await?;
    merge_patch(
        "captcontrolplane",
        "demo",
        &ns.name,
        json!({"spec": {"version": "1.32"}}),
    )?;
    system
        .wait_for("the upgrade to 1.32", Duration::from_secs(30), || async {
            Ok(system.get(&["captcontrolplane", "demo"])?.is_some_and(|c| {
                c["status"]["version"] == "1.32" && c["status"]["phase"] == "Ready"
            }))
        })
        .await?;
    env().kubectl_ok(
        &["delete", "cluster", "demo", "-n", &ns.name, "--wait=false"],
        None,
    )?;
    wait_cluster_gone(&system).await?;
    let conflicts = system
        .applier
        .metric("status_applier_conflicts_total", &[])
        .await?;
    let histories = histories.lock().unwrap().clone();
    let reasons = reasons.lock().unwrap().clone();
    for (field, history) in histories.iter().chain(&reasons) {
        println!("{field}: {history:?}");
    }
    assert_eq!(conflicts, 0.0, "no conflict at the applier");
    let flipped: Vec<String> = histories
        .iter()
        .filter_map(|(f, h)| flips(h).map(|h| format!("{f}: {h}")))
        .collect();
    assert!(
        flipped.is_empty(),
        "fields that flipped back:\n{}",
        flipped.join("\n")
    );
    assert_eq!(
        histories["CAPTControlPlane/status/version"],
        [Value::Null, json!("1.31"), json!("1.32")],
        "the version moves once, when the upgrade is done"
    );
    // The v1beta2 conditions were seen following ours, to their deletion.
    for (field, value) in [
        (
            "Cluster condition:InfrastructureReady",
            json!(["True", "VPCReady"]),
        ),
        (
            "Cluster condition:ControlPlaneAvailable",
            json!(["True", "ControlPlaneReady"]),
        ),
        (
            "CAPTControlPlane condition:Available",
            json!(["False", "Deleting"]),
        ),
    ] {
        let seen = histories.get(field).or(reasons.get(field));
        assert!(
            seen.is_some_and(|h| h.contains(&value)),
            "{field}: {value} in {seen:?}"
        );
    }
    Ok(())
}

/// Core mirrors the control plane's `Ready` condition into the Cluster's `ControlPlaneReady`
/// and summarizes `Ready` from it by severity: while the control plane is still creating, the
/// Cluster is not Ready (found with the demo: without a severity it was).
#[tokio::test]
async fn the_clusters_ready_condition_waits_for_the_control_plane() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (_ns, system) = started("core-ready", 200, &[]).await?;
    // The control plane's Workspace stays creating until the gate file exists: core's mirror
    // is seen in that state whatever the load on the machine.
    let gate = apply_samples_holding_the_control_plane(&system, "core-ready-gate")?;
    system
        .wait_for(
            "the VPC ready and the control plane creating",
            Duration::from_secs(30),
            || async {
                let cc = system.get(&["captcluster", "demo"])?.unwrap_or_default();
                let cp = system
                    .get(&["captcontrolplane", "demo"])?
                    .unwrap_or_default();
                Ok(cc["status"]["ready"] == true
                    && capt_tests::condition(&cp, "Ready")
                        .is_some_and(|c| c["reason"] == "WorkspaceCreating"))
            },
        )
        .await?;
    system
        .wait_for(
            "core's mirror of the creating control plane's Ready",
            Duration::from_secs(60),
            || async {
                let cluster = system.get(&[CLUSTER_V1BETA1, "demo"])?.unwrap_or_default();
                Ok(capt_tests::condition(&cluster, "ControlPlaneReady")
                    .is_some_and(|c| c["reason"] == "WorkspaceCreating"))
            },
        )
        .await?;
    let cluster = system
        .get(&[CLUSTER_V1BETA1, "demo"])?
        .context("the Cluster")?;
    let mirrored =
        capt_tests::condition(&cluster, "ControlPlaneReady").context("ControlPlaneReady")?;
    assert_eq!(mirrored["status"], "False", "{mirrored}");
    assert_eq!(mirrored["severity"], "Info", "{mirrored}");
    assert_eq!(
        capt_tests::condition(&cluster, "Ready").context("Ready")?["status"],
        "False",
        "the Cluster is not Ready while its control plane creates: {}",
        cluster["status"]["conditions"]
    );
    std::fs::write(&gate, "")?;
    system.wait_provisioned().await?;
    wait_ready(&system).await?;
    Ok(())
}
