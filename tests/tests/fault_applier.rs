//! The status-applier killed and restarted in the middle of a burst of Workspace rewrites:
//! nothing is lost (the last rewrite reaches the control plane), the control plane's status
//! is what it was but for what the new revision changes (no field dropped, emptied or
//! changed), and after catching up it writes nothing more. Intents the applier answered
//! `queued` before it was killed are applied by the next one, with no fragment changed.

use anyhow::Result;
use capt_controller::api::{CAPT_CLUSTER_FINALIZER, CAPTCluster};
use capt_tests::held_proxy::HeldProxy;
use capt_tests::system::System;
use capt_tests::{TestNamespace, differences, env, without_paths};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::Duration;

/// What a new Workspace revision changes in the control plane's status, and only that: the
/// checksum of the fake provider's apply of the revision, as the Workspace's `atProvider`
/// mirror and as its WorkspaceTemplateApply's `lastAppliedRevision`.
const CHANGED_BY_A_REVISION: &[&str] = &[
    "status.workspaceStatus.atProvider.checksum",
    "status.workspaceTemplateStatus.lastAppliedRevision",
];

/// Asserts that the control plane's status `after` is `before` but for the fields a new
/// revision changes: no field dropped, none emptied, none with another value.
fn assert_same_status_but_the_revision(before: &Value, after: &Value) {
    let before = without_paths(before, CHANGED_BY_A_REVISION);
    let after = without_paths(after, CHANGED_BY_A_REVISION);
    assert!(
        before["status"].is_object(),
        "the control plane has a status: {before}"
    );
    assert_eq!(
        after["status"],
        before["status"],
        "the status changed beyond {CHANGED_BY_A_REVISION:?}: {:#?}",
        differences(&before["status"], &after["status"])
    );
}

/// How long the applier must write nothing once the stack is at rest.
const QUIET: Duration = Duration::from_secs(5);

#[tokio::test]
async fn an_applier_killed_mid_burst_loses_nothing_and_settles() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-applier").await?;
    let mut system = System::start(&ns.name, 20).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    let before = system.get(&["captcontrolplane", "demo"])?.unwrap();

    for revision in 1..=6 {
        system.set_revision(&format!("r{revision}"))?;
        if revision == 3 {
            system.applier.restart().await?; // SIGKILL, then a new process on the same socket
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    system.wait_mirrored("r6", Duration::from_secs(60)).await?;
    let after = system.get(&["captcontrolplane", "demo"])?.unwrap();
    assert_same_status_but_the_revision(&before, &after);
    assert_eq!(after["status"]["phase"], "Ready");
    let cluster = system.get(&["cluster", "demo"])?.unwrap();
    assert_eq!(cluster["status"]["phase"], "Provisioned");
    assert!(cluster["spec"]["controlPlaneEndpoint"]["host"].is_string());

    // Caught up: the whole stack at rest (what the quiet window starts after, not a time).
    system.wait_samples_rest().await?;
    let writes = system
        .applier
        .metric("status_applier_api_writes_total", &[])
        .await?;
    // The claim's own window: nothing is written over it.
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        system
            .applier
            .metric("status_applier_api_writes_total", &[])
            .await?,
        writes,
        "no more writes once caught up"
    );
    println!("after the restart: {writes} writes to catch up, then none");
    Ok(())
}

#[tokio::test]
async fn intents_queued_when_the_applier_is_killed_are_applied_after_the_restart() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-inflight").await?;
    // A 2 s coalescing window holds the intents of a new revision in the applier, accepted
    // and not yet applied, long enough to kill it with them queued.
    let window = ["--coalesce-window-ms", "2000"];
    let mut system = System::start_tuned(&ns.name, 20, &[], &window, &env().kubeconfig).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    let before = system.get(&["captcontrolplane", "demo"])?.unwrap();

    system.set_revision("in-flight")?;
    system
        .wait_for(
            "the new revision's intents queued in the applier",
            Duration::from_secs(10),
            || async {
                Ok(system
                    .applier
                    .metric("status_applier_pending_documents", &[])
                    .await?
                    > 0.0)
            },
        )
        .await?;
    assert!(
        !system.mirrors_revision("in-flight")?,
        "the revision must still be in flight when the applier is killed"
    );
    system.applier.restart().await?;
    system
        .wait_mirrored("in-flight", Duration::from_secs(30))
        .await?;
    let after = system.get(&["captcontrolplane", "demo"])?.unwrap();
    assert_same_status_but_the_revision(&before, &after);
    assert_eq!(after["status"]["phase"], "Ready");
    Ok(())
}

/// A CAPTCluster with no Cluster to own it: the controller publishes its status once
/// (`WaitingForCluster`, which nothing changes) and writes nothing itself, since it is created
/// with its finalizer.
async fn create_waiting_capt_cluster(api: &Api<CAPTCluster>, name: &str) -> Result<()> {
    let cc: CAPTCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
        "metadata": {"name": name, "finalizers": [CAPT_CLUSTER_FINALIZER]},
        "spec": {"region": "ap-northeast-1", "existingVpcId": "vpc-0123456789abcdef0"},
    }))?;
    api.create(&PostParams::default(), &cc).await?;
    Ok(())
}

/// How many intents the controller published for CAPTClusters' status.
async fn published(system: &System) -> Result<f64> {
    system
        .controller_metric(
            "capt_intents_published_total",
            &["manager=\"capt-captcluster\""],
        )
        .await
}

/// The reason of the CAPTCluster's `Ready` condition, once its status was applied.
async fn ready_reason(api: &Api<CAPTCluster>, name: &str) -> Result<Option<String>> {
    let cc = serde_json::to_value(api.get(name).await?)?;
    let conditions = cc["status"]["conditions"].as_array().cloned();
    let ready = conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c["type"] == "Ready");
    Ok(ready.and_then(|c| c["reason"].as_str().map(str::to_owned)))
}

#[tokio::test]
async fn intents_answered_queued_before_the_applier_is_killed_are_applied_after_it_is_back_with_no_fragment_changed()
-> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-queued").await?;
    // The applier reaches the API server through a proxy that can hold what it sends, and
    // answers `queued` after a second without an outcome. The controller goes through the
    // proxy too, its watches still flowing; it runs alone, without a Lease it could not
    // renew while the proxy holds.
    let proxy = HeldProxy::in_front_of(&env().kubeconfig).await?;
    let (alone, wait_timeout) = (["--no-leader-election"], ["--wait-timeout-seconds", "1"]);
    let mut system =
        System::start_tuned(&ns.name, 20, &alone, &wait_timeout, proxy.kubeconfig()).await?;
    let api: Api<CAPTCluster> = Api::namespaced(client.clone(), &ns.name);
    // The whole path works before anything is held.
    create_waiting_capt_cluster(&api, "warm-up").await?;
    system
        .wait_for(
            "the warm-up CAPTCluster's status",
            Duration::from_secs(30),
            || async {
                let applied = ready_reason(&api, "warm-up").await?.is_some();
                Ok(applied && published(&system).await? >= 1.0)
            },
        )
        .await?;
    let before = published(&system).await?;
    // What the same computation gives every object below.
    let waiting = ready_reason(&api, "warm-up").await?;

    // The applier's requests held: each object's intent is taken and answered `queued`.
    proxy.hold();
    const NAMES: [&str; 5] = ["queued-a", "queued-b", "queued-c", "queued-d", "queued-e"];
    for name in NAMES {
        create_waiting_capt_cluster(&api, name).await?;
    }
    let in_flight = before + NAMES.len() as f64;
    system
        .wait_for(
            "every object's intent answered `queued`",
            Duration::from_secs(30),
            || async { Ok(published(&system).await? >= in_flight) },
        )
        .await?;
    let sent = published(&system).await?;
    for name in NAMES {
        assert_eq!(
            ready_reason(&api, name).await?,
            None,
            "{name}'s intent must still be in flight when the applier is killed"
        );
    }

    // SIGKILL. The next applier reaches the API server directly: what the killed one sent
    // stays held, and never arrives.
    system.applier.restart_as(&env().kubeconfig).await?;
    for name in NAMES {
        system
            .wait_for(
                &format!("{name}'s status from the intent published before the kill"),
                Duration::from_secs(30),
                || async { Ok(ready_reason(&api, name).await? == waiting) },
            )
            .await?;
    }
    assert_eq!(
        published(&system).await?,
        sent,
        "no intent was published anew: no fragment changed, no reconcile had a cause to"
    );

    // The objects go with their namespace: the finalizer the test put on comes off.
    let unfinalized = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    for name in NAMES.into_iter().chain(["warm-up"]) {
        api.patch(name, &PatchParams::default(), &unfinalized)
            .await?;
    }
    Ok(())
}
