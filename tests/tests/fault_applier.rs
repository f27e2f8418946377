//! The status-applier killed and restarted in the middle of a burst of Workspace rewrites:
//! nothing is lost (the last rewrite reaches the control plane), the control plane's status
//! is what it was but for what the new revision changes (no field dropped, emptied or
//! changed), and after catching up it writes nothing more. Intents the applier answered
//! `queued` before it was killed are applied by the next one, with no fragment changed; a
//! conflict and a refusal it answered are reported again by the next one, with no fragment
//! changed; and an applier killed at rest with neither sends nor writes anything once back.

use anyhow::Result;
use capt_controller::api::{CAPT_CLUSTER_FINALIZER, CAPTCluster};
use capt_tests::held_proxy::HeldProxy;
use capt_tests::system::System;
use capt_tests::{TestNamespace, differences, env, unique_name, without_paths};
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

/// How long the controller's publisher takes at most to see that the applier restarted
/// while an intent stands (it asks every 5 s), to send it again and have it answered, with
/// room for a busy machine.
const REPORTED_AGAIN: Duration = Duration::from_secs(30);

/// Takes the finalizer the test put on off `name`, so that it goes with its namespace.
async fn unfinalize(api: &Api<CAPTCluster>, name: &str) -> Result<()> {
    let unfinalized = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    api.patch(name, &PatchParams::default(), &unfinalized)
        .await?;
    Ok(())
}

/// The applier's count of conflicts for `capt-captcluster` (a new process counts from 0).
async fn conflicts(system: &System) -> Result<f64> {
    let labels = ["manager=\"capt-captcluster\""];
    (system.applier)
        .metric("status_applier_conflicts_total", &labels)
        .await
}

/// The applier's count of `capt-captcluster`'s applies the API server refused.
async fn rejected(system: &System) -> Result<f64> {
    let labels = ["manager=\"capt-captcluster\"", "action=\"rejected\""];
    (system.applier)
        .metric("status_applier_applies_total", &labels)
        .await
}

/// The VPC id another writer holds on the CAPTCluster, where ours is the spec's
/// `existingVpcId`.
const THEIRS: &str = "vpc-0fedcba987654321f";

#[tokio::test]
async fn a_conflict_is_reported_again_by_a_restarted_applier_with_no_fragment_changed() -> Result<()>
{
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-conflict").await?;
    let api: Api<CAPTCluster> = Api::namespaced(client.clone(), &ns.name);
    // Another writer owns the VPC id with another value before the controller runs: the
    // controller's first intent is answered with a conflict (409), and nothing it observes
    // changes after.
    create_waiting_capt_cluster(&api, "conflicted").await?;
    let foreign = PatchParams {
        field_manager: Some("foreign-writer".into()),
        ..PatchParams::default()
    };
    let theirs = Patch::Merge(json!({"status": {"vpcId": THEIRS}}));
    api.patch_status("conflicted", &foreign, &theirs).await?;
    let mut system = System::start(&ns.name, 20).await?;
    system
        .wait_for(
            "the conflict on the VPC id reported",
            Duration::from_secs(30),
            || async { Ok(conflicts(&system).await? >= 1.0 && published(&system).await? >= 1.0) },
        )
        .await?;
    let sent = published(&system).await?;

    // SIGKILL: the conflict lived in the applier's memory alone.
    system.applier.restart().await?;
    system
        .wait_for(
            "the conflict reported again by the restarted applier",
            REPORTED_AGAIN,
            || async { Ok(conflicts(&system).await? >= 1.0) },
        )
        .await?;
    let listed = system.applier.client.get("/v1/conflicts").await?.json();
    assert!(
        listed.as_array().into_iter().flatten().any(|c| {
            c["conflict"]["owner"] == "foreign-writer" && c["conflict"]["path"] == ".status.vpcId"
        }),
        "the restarted applier lists the conflict: {listed}"
    );
    assert_eq!(
        published(&system).await?,
        sent,
        "no intent was published anew: no fragment changed"
    );
    let cc = serde_json::to_value(api.get("conflicted").await?)?;
    assert_eq!(cc["status"]["vpcId"], THEIRS, "reported, not forced");
    unfinalize(&api, "conflicted").await
}

/// A ValidatingAdmissionPolicy that refuses (422) every status write to the CAPTCluster
/// `refused` of one namespace; removed when dropped.
struct RefusingPolicy(String);

impl RefusingPolicy {
    async fn install(namespace: &str) -> Result<Self> {
        let name = unique_name("refuse-status");
        let policy = json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["infrastructure.cluster.x-k8s.io"], "apiVersions": ["*"],
                    "operations": ["UPDATE"], "resources": ["captclusters/status"]}]},
                "validations": [{"expression": "object.metadata.name != 'refused'",
                    "message": "the test refuses this CAPTCluster's status", "reason": "Invalid"}],
            },
        });
        let binding = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": namespace}}}},
        });
        let guard = Self(name);
        for object in [policy, binding] {
            env().kubectl_ok(&["create", "-f", "-"], Some(&object.to_string()))?;
        }
        Ok(guard)
    }
}

impl Drop for RefusingPolicy {
    fn drop(&mut self) {
        let kinds = "validatingadmissionpolicybinding,validatingadmissionpolicy";
        let _ = env().kubectl_run(&["delete", "--ignore-not-found", kinds, &self.0], None);
    }
}

#[tokio::test]
async fn a_refusal_is_reported_again_by_a_restarted_applier_with_no_fragment_changed() -> Result<()>
{
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-refused").await?;
    let api: Api<CAPTCluster> = Api::namespaced(client.clone(), &ns.name);
    let _policy = RefusingPolicy::install(&ns.name).await?;
    create_waiting_capt_cluster(&api, "refused").await?;
    // The API server enforces a policy once it has loaded it, which no object reports: ask
    // (dry runs, which store nothing) until a status write is refused, bounded.
    let dry = PatchParams {
        dry_run: true,
        field_manager: Some("probe".into()),
        ..PatchParams::default()
    };
    let write = Patch::Merge(json!({"status": {"vpcId": THEIRS}}));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match api.patch_status("refused", &dry, &write).await {
            Err(kube::Error::Api(e)) if e.code == 422 => break,
            answer if std::time::Instant::now() > deadline => {
                anyhow::bail!("the policy never refused a status write: {answer:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let mut system = System::start(&ns.name, 20).await?;
    system
        .wait_for(
            "the controller's intent rejected by the API server",
            Duration::from_secs(30),
            || async { Ok(rejected(&system).await? >= 1.0 && published(&system).await? >= 1.0) },
        )
        .await?;
    let sent = published(&system).await?;

    // SIGKILL: the refusal lived in the applier's memory alone.
    system.applier.restart().await?;
    system
        .wait_for(
            "the refusal reported again by the restarted applier",
            REPORTED_AGAIN,
            || async { Ok(rejected(&system).await? >= 1.0) },
        )
        .await?;
    let refused = system
        .applier
        .metric("status_applier_api_errors_total", &["code=\"422\""])
        .await?;
    assert!(refused >= 1.0, "the restarted applier met the 422 itself");
    assert_eq!(
        published(&system).await?,
        sent,
        "no intent was published anew: no fragment changed"
    );
    assert_eq!(ready_reason(&api, "refused").await?, None, "never written");
    unfinalize(&api, "refused").await
}

#[tokio::test]
async fn an_applier_killed_at_rest_without_conflicts_writes_nothing_when_back() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-rest").await?;
    let mut system = System::start(&ns.name, 20).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    system.wait_samples_rest().await?;
    let conflicts = system
        .applier
        .metric("status_applier_conflicts_total", &[])
        .await?;
    assert_eq!(conflicts, 0.0, "no conflict stands at rest");

    system.applier.restart().await?;
    // Two of the publisher's probe periods (5 s each), and more: had anything stood, it
    // would have been sent again by now.
    tokio::time::sleep(Duration::from_secs(12)).await;
    for metric in [
        "status_applier_intents_total",
        "status_applier_api_writes_total",
    ] {
        assert_eq!(
            system.applier.metric(metric, &[]).await?,
            0.0,
            "{metric}: the restarted applier is sent nothing and writes nothing"
        );
    }
    Ok(())
}
