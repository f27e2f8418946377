//! A CAPT object deleted and recreated under the same name while intents for the deleted
//! incarnation are still queued in the status-applier (a coalescing window; where a test
//! runs the applier alone, a proxy also holds what it sends to the API server until the
//! recreation is done, so that no load on the machine decides the order). What must hold:
//!
//! - the queued intents carry the old uid, and none of them is applied to the new object:
//!   no version of the new object ever shows a value only the old intents carried (status or
//!   `spec.controlPlaneEndpoint`), and no queued intent is answered `applied`; when its apply
//!   is attempted it is `rejected` with the uid precondition named;
//! - a waiting submitter hears what became of its intent: an old intent dropped because the
//!   new incarnation's first intent replaced its document before its apply is answered
//!   `rejected` (422), like any intent for a recreated object, not "the apply continues";
//! - the old incarnation's desired document does not leak into the new one: the first intent
//!   for the new uid starts from what the new object holds, not from what the old one did,
//!   and changes of the new object never make the applier write the old document;
//! - the system converges on the new object: the controller publishes for the new uid only,
//!   and the new control plane gets its own status and endpoint, and the Cluster its endpoint.

use anyhow::{Context, Result, bail, ensure};
use capt_controller::api::{CAPTCluster, CAPTControlPlane, Cluster};
use capt_tests::applier::Applier;
use capt_tests::held_proxy::HeldProxy;
use capt_tests::system::System;
use capt_tests::{TestNamespace, env, repo_root};
use futures::StreamExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use status_applier::client::Answer;
use status_applier::intent::Intent;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CP_API: &str = "controlplane.cluster.x-k8s.io/v1beta1";
const CC_API: &str = "infrastructure.cluster.x-k8s.io/v1beta1";
const STALE_HOST: &str = "stale.example.com";
const STALE_MESSAGE: &str = "queued for the deleted incarnation";
const HOLD: &str = "capt-tests.example.com/hold";
/// The status managers of the control plane and of the CAPTCluster.
const CP_MANAGER: &str = "capt-captcontrolplane";
const CC_MANAGER: &str = "capt-captcluster";

fn intent(
    api_version: &str,
    kind: &str,
    ns: &str,
    uid: &str,
    manager: &str,
    subresource: Option<&str>,
    fragment: Value,
) -> Result<Intent> {
    let mut v = json!({
        "target": {"apiVersion": api_version, "kind": kind, "namespace": ns, "name": "demo", "uid": uid},
        "fieldManager": manager,
        "fragment": fragment,
    });
    if let Some(s) = subresource {
        v["subresource"] = json!(s);
    }
    Ok(serde_json::from_value(v)?)
}

/// The sample document of `kind` (from `manifests/samples/cluster.yaml`) in `ns`.
fn sample(kind: &str, ns: &str) -> Result<Value> {
    let text = std::fs::read_to_string(repo_root().join("manifests/samples/cluster.yaml"))?;
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc)?;
        if v["kind"] == kind {
            return Ok(capt_tests::system::in_test_namespace(v, ns));
        }
    }
    bail!("no {kind} in the samples")
}

fn uid_of<K: kube::Resource>(obj: &K) -> String {
    obj.meta().uid.clone().unwrap_or_default()
}

/// The managers that have a managedFields entry on `obj`.
fn managers(obj: &Value) -> Vec<String> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["manager"].as_str().map(str::to_owned))
        .collect()
}

/// Submits `intent` without waiting (so that it is merged and queued), then again with
/// waiting, in a task: the second answer is the outcome of the apply that carries it.
async fn queue(applier: &Applier, intent: Intent) -> Result<tokio::task::JoinHandle<Answer>> {
    let queued = applier.client.submit(&intent, false).await?;
    ensure!(
        matches!(
            queued.json()["action"].as_str(),
            Some("queued" | "coalesced")
        ),
        "the intent is queued: {}",
        queued.body
    );
    let client = applier.client.clone();
    Ok(tokio::spawn(async move {
        client
            .submit(&intent, true)
            .await
            .expect("the applier answers")
    }))
}

/// Socket level, with a bare control plane and CAPTCluster (no controller): intents for the
/// old uid, queued for a one-second coalescing window (on the trailing edge), meet the
/// recreated objects.
#[tokio::test]
async fn queued_intents_for_a_deleted_object_are_rejected_by_its_successor() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-recreate-sa").await?;
    // Past the window, the proxy holds what the applier sends until the recreation is done.
    let (proxy, applier) = start_held_trailing_applier().await?;
    let pair = Pair::create(&client, &ns.name).await?;
    give_the_old_incarnation_a_status(&applier, &pair).await?;
    proxy.hold();
    let queued_at = Instant::now();
    let outcomes = queue_stale_intents(&applier, &pair).await?;
    let (new_cp, new_cc) = recreate_while_held(&pair, &proxy, queued_at).await?;
    assert_rejected_by_the_uid_precondition(outcomes).await?;
    assert_old_documents_never_written(&applier, &pair).await?;
    assert_fresh_intents_start_from_the_new_objects(&applier, &pair, &new_cp, &new_cc).await
}

/// The status-applier alone behind a proxy that can hold what it sends, on the trailing
/// edge with a one-second window: every intent waits the window, so all of them are queued
/// when the object is recreated (on the default leading edge a quiet key's intent goes at
/// once).
async fn start_held_trailing_applier() -> Result<(HeldProxy, Applier)> {
    let proxy = HeldProxy::in_front_of(&env().kubeconfig).await?;
    let applier = Applier::start_as(
        &[
            "--coalesce-window-ms",
            "1000",
            "--apply-lone-intents-at-once=false",
        ],
        proxy.kubeconfig(),
    )
    .await?;
    Ok((proxy, applier))
}

/// A bare control plane and CAPTCluster (the samples), as first created.
struct Pair {
    ns: String,
    cps: Api<CAPTControlPlane>,
    ccs: Api<CAPTCluster>,
    cp_doc: Value,
    cc_doc: Value,
    old_cp: String,
    old_cc: String,
}

impl Pair {
    async fn create(client: &kube::Client, ns: &str) -> Result<Self> {
        let cps: Api<CAPTControlPlane> = Api::namespaced(client.clone(), ns);
        let ccs: Api<CAPTCluster> = Api::namespaced(client.clone(), ns);
        let cp_doc = sample("CAPTControlPlane", ns)?;
        let cc_doc = sample("CAPTCluster", ns)?;
        let pp = PostParams::default();
        let old_cp = uid_of(
            &cps.create(&pp, &serde_json::from_value(cp_doc.clone())?)
                .await?,
        );
        let old_cc = uid_of(
            &ccs.create(&pp, &serde_json::from_value(cc_doc.clone())?)
                .await?,
        );
        Ok(Self {
            ns: ns.to_owned(),
            cps,
            ccs,
            cp_doc,
            cc_doc,
            old_cp,
            old_cc,
        })
    }

    /// The control plane and the CAPTCluster as they are now.
    async fn current(&self) -> Result<(Value, Value)> {
        Ok((
            serde_json::to_value(self.cps.get("demo").await?)?,
            serde_json::to_value(self.ccs.get("demo").await?)?,
        ))
    }
}

/// The old incarnation gets a status of its manager's.
async fn give_the_old_incarnation_a_status(applier: &Applier, pair: &Pair) -> Result<()> {
    let ns = &pair.ns;
    let first = [
        intent(
            CP_API,
            "CAPTControlPlane",
            ns,
            &pair.old_cp,
            CP_MANAGER,
            Some("status"),
            json!({"status": {"phase": "Creating", "ready": false}}),
        )?,
        intent(
            CC_API,
            "CAPTCluster",
            ns,
            &pair.old_cc,
            CC_MANAGER,
            Some("status"),
            json!({"status": {"ready": false}}),
        )?,
    ];
    for i in &first {
        let out = applier.client.submit(i, true).await?;
        assert_eq!(out.json()["action"], "applied", "{}", out.body);
    }
    Ok(())
}

/// Intents for the old uid, queued: status, endpoint, and the CAPTCluster's status. Returns
/// their waiting submitters.
async fn queue_stale_intents(
    applier: &Applier,
    pair: &Pair,
) -> Result<Vec<tokio::task::JoinHandle<Answer>>> {
    let ns = &pair.ns;
    let stale = [
        intent(
            CP_API,
            "CAPTControlPlane",
            ns,
            &pair.old_cp,
            CP_MANAGER,
            Some("status"),
            json!({"status": {"phase": "Ready", "ready": true, "failureMessage": STALE_MESSAGE,
                "workspaceStatus": {"atProvider": {"outputs": {"cluster_endpoint": format!("https://{STALE_HOST}")}}}}}),
        )?,
        intent(
            CP_API,
            "CAPTControlPlane",
            ns,
            &pair.old_cp,
            CP_MANAGER,
            None,
            json!({"spec": {"controlPlaneEndpoint": {"host": STALE_HOST, "port": 6443}}}),
        )?,
        intent(
            CC_API,
            "CAPTCluster",
            ns,
            &pair.old_cc,
            CC_MANAGER,
            Some("status"),
            json!({"status": {"ready": true, "vpcId": "vpc-stale"}}),
        )?,
    ];
    let mut outcomes = Vec::new();
    for i in stale {
        outcomes.push(queue(applier, i).await?);
    }
    Ok(outcomes)
}

/// Deleted (no finalizer: at once) and recreated under the same name, before anything the
/// applier sends for the queued intents reaches the API server; then the proxy lets it
/// through. Returns the new uids.
async fn recreate_while_held(
    pair: &Pair,
    proxy: &HeldProxy,
    queued_at: Instant,
) -> Result<(String, String)> {
    let (cps, ccs) = (&pair.cps, &pair.ccs);
    let pp = PostParams::default();
    let dp = DeleteParams::default();
    cps.delete("demo", &dp).await?;
    ccs.delete("demo", &dp).await?;
    let new_cp = uid_of(
        &cps.create(&pp, &serde_json::from_value(pair.cp_doc.clone())?)
            .await?,
    );
    let new_cc = uid_of(
        &ccs.create(&pp, &serde_json::from_value(pair.cc_doc.clone())?)
            .await?,
    );
    println!(
        "deleted and recreated {:.0} ms after the intents were queued (window 1000 ms)",
        queued_at.elapsed().as_secs_f64() * 1000.0
    );
    proxy.release();
    assert_ne!(new_cp, pair.old_cp);
    assert_ne!(new_cc, pair.old_cc);
    Ok((new_cp, new_cc))
}

/// Every queued intent for the old uid is answered `rejected` (422), naming the uid
/// precondition.
async fn assert_rejected_by_the_uid_precondition(
    outcomes: Vec<tokio::task::JoinHandle<Answer>>,
) -> Result<()> {
    for outcome in outcomes {
        let answer = outcome.await?;
        let out = answer.json();
        println!("queued intent for the old uid: {}", answer.body);
        assert_eq!(out["action"], "rejected", "{}", answer.body);
        assert_eq!(answer.status.as_u16(), 422, "{}", answer.body);
        assert!(
            out["message"]
                .as_str()
                .is_some_and(|m| m.contains("uid precondition failed")),
            "the answer names the uid precondition: {}",
            answer.body
        );
    }
    Ok(())
}

/// True for an object no status manager of ours wrote: no status, no endpoint, no entry.
fn untouched(obj: &Value) -> bool {
    obj.get("status").is_none()
        && obj["spec"].get("controlPlaneEndpoint").is_none()
        && !managers(obj)
            .iter()
            .any(|m| m == CP_MANAGER || m == CC_MANAGER)
}

/// The new objects stay untouched, also when their changes make the applier check its
/// documents again (drift): the old documents are never written.
async fn assert_old_documents_never_written(applier: &Applier, pair: &Pair) -> Result<()> {
    let (cps, ccs) = (&pair.cps, &pair.ccs);
    let (cp, cc) = pair.current().await?;
    assert!(untouched(&cp), "the new control plane was written: {cp}");
    assert!(untouched(&cc), "the new CAPTCluster was written: {cc}");

    // Changes of the new objects make the applier check its documents again (drift): the
    // old documents must still not be written.
    let writes = applier
        .metric("status_applier_api_writes_total", &[])
        .await?;
    // Each change is followed by a check of every old document (the control plane's status
    // and main resource, the CAPTCluster's status): an attempt each, whatever its outcome.
    let attempts = || applier.metric("status_applier_applies_total", &[]);
    for i in 0..3 {
        let before = attempts().await?;
        let patch = json!({"metadata": {"annotations": {"touched": i.to_string()}}});
        cps.patch("demo", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        ccs.patch("demo", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        capt_tests::system::wait_until(
            &format!("the applier to check its three old documents after change {i}"),
            Duration::from_secs(10),
            || async { Ok(attempts().await? >= before + 3.0) },
        )
        .await?;
    }
    let (cp, cc) = pair.current().await?;
    assert!(untouched(&cp), "a drift check wrote the old document: {cp}");
    assert!(untouched(&cc), "a drift check wrote the old document: {cc}");
    assert_eq!(
        applier
            .metric("status_applier_api_writes_total", &[])
            .await?,
        writes,
        "no write for the old documents"
    );
    Ok(())
}

/// The new incarnation's first intents start from the new objects: nothing of the old
/// documents (ready, failureMessage, atProvider, the endpoint, vpcId) comes along, and the
/// applier keeps no old value.
async fn assert_fresh_intents_start_from_the_new_objects(
    applier: &Applier,
    pair: &Pair,
    new_cp: &String,
    new_cc: &String,
) -> Result<()> {
    let ns = &pair.ns;
    let fresh = [
        intent(
            CP_API,
            "CAPTControlPlane",
            ns,
            new_cp,
            CP_MANAGER,
            Some("status"),
            json!({"status": {"phase": "Creating"}}),
        )?,
        intent(
            CC_API,
            "CAPTCluster",
            ns,
            new_cc,
            CC_MANAGER,
            Some("status"),
            json!({"status": {"ready": false}}),
        )?,
        intent(
            CP_API,
            "CAPTControlPlane",
            ns,
            new_cp,
            CP_MANAGER,
            None,
            json!({"spec": {"controlPlaneEndpoint": {"host": "new.example.com", "port": 443}}}),
        )?,
    ];
    for i in &fresh {
        let out = applier.client.submit(i, true).await?;
        assert_eq!(out.json()["action"], "applied", "{}", out.body);
    }
    let (cp, cc) = pair.current().await?;
    assert_eq!(
        cp["status"],
        json!({"phase": "Creating"}),
        "only the new incarnation's status"
    );
    assert_eq!(
        cp["spec"]["controlPlaneEndpoint"],
        json!({"host": "new.example.com", "port": 443})
    );
    assert_eq!(
        cc["status"],
        json!({"ready": false}),
        "only the new incarnation's status"
    );
    let docs = applier.client.get("/v1/intents").await?.json();
    for doc in docs.as_array().context("a list of documents")? {
        let expected = match doc["object"]["kind"].as_str() {
            Some("CAPTControlPlane") => new_cp,
            _ => new_cc,
        };
        assert_eq!(doc["uid"], expected.as_str(), "{doc}");
        assert!(
            !doc["document"].to_string().contains("stale"),
            "the applier keeps no old value: {doc}"
        );
    }
    Ok(())
}

/// Socket level: the new incarnation's first intent arrives while the old uid's intent is
/// still queued (the controller reconciles a recreated object at once). The new one is
/// applied; the old one is not, and its waiting submitter is told so (`rejected`, as for
/// any intent whose object was recreated), not that its apply continues.
#[tokio::test]
async fn an_intent_superseded_by_the_new_incarnation_is_answered_rejected() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-recreate-sup").await?;
    // Past the window, the proxy holds what the applier sends until the new intent is in.
    let (proxy, applier) = start_held_trailing_applier().await?;
    let cps: Api<CAPTControlPlane> = Api::namespaced(client.clone(), &ns.name);
    let cp_doc = sample("CAPTControlPlane", &ns.name)?;
    let pp = PostParams::default();
    let old = uid_of(
        &cps.create(&pp, &serde_json::from_value(cp_doc.clone())?)
            .await?,
    );
    let manager = CP_MANAGER;
    let stale = intent(
        CP_API,
        "CAPTControlPlane",
        &ns.name,
        &old,
        manager,
        Some("status"),
        json!({"status": {"phase": "Ready", "failureMessage": STALE_MESSAGE}}),
    )?;
    // The old incarnation has a status of its manager's: the applier knows the kind and the
    // object before the proxy holds what it sends.
    let first = intent(
        CP_API,
        "CAPTControlPlane",
        &ns.name,
        &old,
        manager,
        Some("status"),
        json!({"status": {"phase": "Creating", "ready": false}}),
    )?;
    let out = applier.client.submit(&first, true).await?;
    assert_eq!(out.json()["action"], "applied", "{}", out.body);
    proxy.hold();
    let queued_at = Instant::now();
    let old_outcome = queue(&applier, stale).await?;
    cps.delete("demo", &DeleteParams::default()).await?;
    let new = uid_of(&cps.create(&pp, &serde_json::from_value(cp_doc)?).await?);
    let fresh = intent(
        CP_API,
        "CAPTControlPlane",
        &ns.name,
        &new,
        manager,
        Some("status"),
        json!({"status": {"phase": "Creating"}}),
    )?;
    let new_outcome = queue(&applier, fresh).await?;
    proxy.release();
    let new_answer = new_outcome.await?;
    println!(
        "the old intent's submitter was answered within {:.1} s (wait timeout 30 s): {}",
        queued_at.elapsed().as_secs_f64(),
        old_outcome.is_finished()
    );
    let old_answer = old_outcome.await?;
    println!("old uid: {} {}", old_answer.status, old_answer.body);
    println!("new uid: {} {}", new_answer.status, new_answer.body);
    assert_eq!(
        new_answer.json()["action"],
        "applied",
        "{}",
        new_answer.body
    );
    let cp = serde_json::to_value(cps.get("demo").await?)?;
    assert_eq!(
        cp["status"],
        json!({"phase": "Creating"}),
        "only the new intent's status"
    );
    assert_eq!(
        old_answer.json()["action"],
        "rejected",
        "the old uid's intent was dropped: its submitter must hear `rejected`, got {} {}",
        old_answer.status,
        old_answer.body
    );
    assert_eq!(old_answer.status.as_u16(), 422, "{}", old_answer.body);
    Ok(())
}

/// End to end: the whole system provisions the sample Cluster; its control plane is deleted
/// (the controller carries out the deletion; a test finalizer holds the object at the end),
/// intents for the old uid are queued, and the object is released and recreated at once.
#[tokio::test]
async fn a_control_plane_recreated_with_intents_queued_gets_only_its_own_status() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-recreate").await?;
    let system = provision_with_a_500_ms_window(&ns.name).await?;
    let cps: Api<CAPTControlPlane> = Api::namespaced(client.clone(), &ns.name);
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns.name);
    let old = uid_of(&cps.get("demo").await?);
    let (versions, watch) = watch_every_incarnation(&cps);
    delete_held_by_a_test_finalizer(&system, &cps, &ns.name).await?;
    let (outcomes, new) = queue_stale_intents_then_recreate(&system, &cps, &ns.name, &old).await?;
    assert_stale_intents_never_succeed(outcomes).await?;
    wait_converged_on_the_new_object(&system, &cps, &clusters, &new).await?;
    wait_watched_to_the_settled_version(&system, &versions).await?;
    watch.abort();
    assert_no_old_value_reached_the_new_object(&system, &versions, &new)?;
    assert_documents_for_the_new_uid_only(&system, &new).await
}

/// The whole system, its applier coalescing over 500 ms, with the sample provisioned.
async fn provision_with_a_500_ms_window(ns: &str) -> Result<System> {
    let system = System::start_tuned(
        ns,
        20,
        &[],
        &["--coalesce-window-ms", "500"],
        &env().kubeconfig,
    )
    .await?;
    let started = Instant::now();
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    println!(
        "provisioned in {:.1} s with a 500 ms coalescing window",
        started.elapsed().as_secs_f64()
    );
    Ok(system)
}

/// Every version of every incarnation of the control plane, by uid.
type Versions = Arc<Mutex<Vec<(String, Value)>>>;

/// Watches every version of every incarnation of the control plane `demo`.
fn watch_every_incarnation(cps: &Api<CAPTControlPlane>) -> (Versions, tokio::task::JoinHandle<()>) {
    let versions: Versions = Arc::default();
    let watch = {
        let (versions, cps) = (versions.clone(), cps.clone());
        tokio::spawn(async move {
            let config = watcher::Config::default().fields("metadata.name=demo");
            let mut events = watcher(cps, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(Ok(cp)) = events.next().await {
                let v = serde_json::to_value(&cp).unwrap_or_default();
                versions.lock().unwrap().push((uid_of(&cp), v));
            }
        })
    };
    (versions, watch)
}

/// Held by a finalizer of ours, the controller's deletion runs to its end.
async fn delete_held_by_a_test_finalizer(
    system: &System,
    cps: &Api<CAPTControlPlane>,
    ns: &str,
) -> Result<()> {
    let hold = json!([{"op": "add", "path": "/metadata/finalizers/-", "value": HOLD}]);
    env().kubectl_ok(
        &[
            "patch",
            "captcontrolplane",
            "demo",
            "-n",
            ns,
            "--type=json",
            "-p",
            &hold.to_string(),
        ],
        None,
    )?;
    cps.delete("demo", &DeleteParams::background()).await?;
    system
        .wait_for(
            "the controller's deletion to finish (only the test's finalizer left)",
            Duration::from_secs(30),
            || async {
                let cp = cps.get("demo").await?;
                Ok(cp.metadata.finalizers.unwrap_or_default() == [HOLD])
            },
        )
        .await?;
    Ok(())
}

/// Intents for the old uid, queued, then the object released and recreated at once (within
/// the coalescing window, else the run is inconclusive). Returns the intents' waiting
/// submitters and the new uid.
async fn queue_stale_intents_then_recreate(
    system: &System,
    cps: &Api<CAPTControlPlane>,
    ns: &str,
    old: &str,
) -> Result<(Vec<tokio::task::JoinHandle<Answer>>, String)> {
    let stale = [
        intent(
            CP_API,
            "CAPTControlPlane",
            ns,
            old,
            CP_MANAGER,
            Some("status"),
            json!({"status": {"failureReason": "StaleIntent", "failureMessage": STALE_MESSAGE,
                "workspaceStatus": {"atProvider": {"outputs": {"cluster_endpoint": format!("https://{STALE_HOST}")}}}}}),
        )?,
        intent(
            CP_API,
            "CAPTControlPlane",
            ns,
            old,
            CP_MANAGER,
            None,
            json!({"spec": {"controlPlaneEndpoint": {"host": STALE_HOST, "port": 6443}}}),
        )?,
    ];
    let queued_at = Instant::now();
    let mut outcomes = Vec::new();
    for i in stale {
        outcomes.push(queue(&system.applier, i).await?);
    }
    cps.patch(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    let doc = sample("CAPTControlPlane", ns)?;
    let new = uid_of(
        &cps.create(&PostParams::default(), &serde_json::from_value(doc)?)
            .await?,
    );
    let recreated = queued_at.elapsed();
    println!(
        "released and recreated {:.0} ms after the old intents were queued (window 500 ms)",
        recreated.as_secs_f64() * 1000.0
    );
    ensure!(
        recreated < Duration::from_millis(450),
        "inconclusive: the recreation took longer than the coalescing window"
    );
    assert_ne!(new, old);
    Ok((outcomes, new))
}

/// The old intents never succeed: rejected by the uid precondition, or dropped when the
/// controller's first intent for the new uid replaced the old document.
async fn assert_stale_intents_never_succeed(
    outcomes: Vec<tokio::task::JoinHandle<Answer>>,
) -> Result<()> {
    for outcome in outcomes {
        let answer = outcome.await?;
        println!("queued intent for the old uid: {}", answer.body);
        let action = answer.json()["action"].as_str().unwrap_or("").to_owned();
        assert!(
            !matches!(action.as_str(), "applied" | "unchanged" | "conflict"),
            "an intent for the deleted object was applied: {}",
            answer.body
        );
    }
    Ok(())
}

/// The system converges on the new object: Ready with its endpoint, and the Cluster's.
async fn wait_converged_on_the_new_object(
    system: &System,
    cps: &Api<CAPTControlPlane>,
    clusters: &Api<Cluster>,
    new: &str,
) -> Result<()> {
    let endpoint_host = capt_tests::sample_endpoint_host(system.namespace(), "demo");
    system
        .wait_for(
            "the new control plane Ready with its endpoint, and the Cluster's",
            Duration::from_secs(40),
            || async {
                let cp = cps.get("demo").await?;
                let cluster = clusters.get("demo").await?;
                let endpoint = |e: Option<&capt_controller::api::ApiEndpoint>| {
                    e.is_some_and(|e| e.host == endpoint_host && e.port == 443)
                };
                Ok(uid_of(&cp) == new
                    && cp
                        .status
                        .as_ref()
                        .is_some_and(|s| s.ready == Some(true) && s.phase.is_some())
                    && endpoint(cp.spec.control_plane_endpoint.as_ref())
                    && endpoint(cluster.spec.control_plane_endpoint.as_ref())
                    && cluster
                        .status
                        .as_ref()
                        .and_then(|s| s.initialization.as_ref())
                        .is_some_and(|i| i.control_plane_initialized == Some(true)))
            },
        )
        .await
}

/// Waits until the watch has seen the control plane's version the applier settled on: every
/// version the system's writes made is then among those the watch saw.
async fn wait_watched_to_the_settled_version(system: &System, versions: &Versions) -> Result<()> {
    let settled = system
        .settled_control_plane_version(Duration::from_secs(30))
        .await?;
    let newest = || {
        let versions = versions.lock().unwrap();
        let numbers = versions.iter().filter_map(|(_, v)| {
            v["metadata"]["resourceVersion"]
                .as_str()?
                .parse::<u64>()
                .ok()
        });
        numbers.max().unwrap_or(0)
    };
    system
        .wait_for(
            &format!("the watch to see version {settled}"),
            Duration::from_secs(30),
            || async { Ok(newest() >= settled) },
        )
        .await
}

/// No version of the new object the watch saw showed a value only an old intent carried;
/// the new object has its own atProvider.
fn assert_no_old_value_reached_the_new_object(
    system: &System,
    versions: &Versions,
    new: &str,
) -> Result<()> {
    let versions = versions.lock().unwrap().clone();
    let uids: BTreeSet<&str> = versions.iter().map(|(u, _)| u.as_str()).collect();
    let of_new: Vec<&Value> = versions
        .iter()
        .filter(|(u, _)| *u == new)
        .map(|(_, v)| v)
        .collect();
    let stale_seen = of_new
        .iter()
        .filter(|v| {
            let text = v["status"].to_string() + &v["spec"].to_string();
            text.contains(STALE_HOST)
                || text.contains(STALE_MESSAGE)
                || text.contains("StaleIntent")
        })
        .count();
    println!(
        "watched {} versions of {} incarnations; {} of the new one, {stale_seen} with an old intent's value",
        versions.len(),
        uids.len(),
        of_new.len()
    );
    assert!(of_new.len() >= 3, "the watch followed the new object");
    assert_eq!(
        stale_seen, 0,
        "an old intent's value reached the new object"
    );
    let cp = system
        .get(&["captcontrolplane", "demo"])?
        .context("the control plane")?;
    assert!(
        cp["status"]["workspaceStatus"]["atProvider"]["outputs"]["cluster_endpoint"].is_string(),
        "the new object has its own atProvider: {}",
        cp["status"]
    );
    assert!(cp["status"].get("failureMessage").is_none());
    Ok(())
}

/// The controller publishes for the new uid only, and the applier's documents hold no old
/// value.
async fn assert_documents_for_the_new_uid_only(system: &System, new: &str) -> Result<()> {
    let docs = system
        .applier
        .client
        .get("/v1/intents?kind=CAPTControlPlane&name=demo")
        .await?
        .json();
    let docs = docs.as_array().context("a list of documents")?;
    assert!(!docs.is_empty());
    for doc in docs {
        assert_eq!(doc["uid"], new, "{doc}");
        assert!(
            !doc["document"].to_string().contains(STALE_HOST),
            "the applier keeps an old value: {doc}"
        );
    }
    Ok(())
}
