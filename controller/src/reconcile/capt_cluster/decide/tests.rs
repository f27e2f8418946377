//! The CAPTCluster's decision, as a table: each row a snapshot (and what earlier writes
//! answered), and the plan's writes. Each row is a rule of `docs/architecture.md` and
//! `docs/security.md`.

use super::*;
use crate::reconcile::plan::Step;
use crate::tenancy::APPLY_OWNED_CONDITION;
use kube::api::DynamicObject;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

const NOW: &str = "2026-12-07T12:00:00Z";
const FINALIZER: &str = CAPT_CLUSTER_FINALIZER;

fn now() -> Timestamp {
    NOW.parse().expect("a time")
}

fn object<K: serde::de::DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("an object of its kind")
}

/// A CAPTCluster `demo` of the Cluster `demo`, `extra` merged in.
fn capt_cluster(extra: Value) -> Arc<CAPTCluster> {
    let mut value = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
        "metadata": {"name": "demo", "namespace": "default", "uid": "uid-cc", "generation": 1,
            "resourceVersion": "10", "creationTimestamp": "2026-12-07T11:59:00Z",
            "labels": {"cluster.x-k8s.io/cluster-name": "demo"},
            "finalizers": [FINALIZER]},
        "spec": {"region": "r", "vpcTemplateRef": {"name": "vpc"},
            "workspaceTemplateApplyName": "demo-vpc"},
    });
    json_patch::merge(&mut value, &extra);
    Arc::new(object(value))
}

/// The Cluster `demo`, naming (`names_it`) the CAPTCluster `demo` as its infrastructure.
fn cluster(names_it: bool) -> Arc<Cluster> {
    let infrastructure = if names_it { "demo" } else { "other" };
    Arc::new(object(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "demo", "namespace": "default", "uid": "uid-cluster"},
        "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
            "kind": "CAPTCluster", "name": infrastructure}},
    })))
}

/// The VPC apply as the controller writes it for `capt_cluster(..)` (ours, up to date).
fn vpc_apply() -> Value {
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "demo-vpc", "namespace": "default", "uid": "uid-apply",
            "generation": 1, "resourceVersion": "20",
            "labels": {
                "infrastructure.cluster.x-k8s.io/owner-kind": "CAPTCluster",
                "infrastructure.cluster.x-k8s.io/owner-name": "demo",
                "infrastructure.cluster.x-k8s.io/owner-namespace": "default",
                "cluster.x-k8s.io/cluster-name": "demo",
            }},
        "spec": {
            "templateRef": {"name": "vpc"},
            "variables": {"REGION": "r", "CLUSTER_NAME": "default_demo"},
            "writeConnectionSecretToRef": {"name": "demo-vpc-connection", "namespace": "default"},
        },
    })
}

fn snapshot(cc: Arc<CAPTCluster>, cluster: Option<Arc<Cluster>>, apply: Option<Value>) -> Snapshot {
    Snapshot {
        owner: cc,
        named_cluster: cluster,
        apply: apply.map(|a| Arc::new(object(a))),
        workspaces: vec![],
        siblings: vec![],
        deletion: None,
        allowed_template_namespaces: Default::default(),
        poll_interval: Duration::from_secs(5),
    }
}

/// A plan's steps, each as (what it does, the object it writes).
fn steps(plan: &Plan) -> Vec<(String, String)> {
    plan.steps
        .iter()
        .map(|step| match step {
            Step::Apply { doing, object, .. } => (doing.to_string(), object.name.clone()),
            Step::Publish(p) => {
                let on = match p.key.subresource {
                    Some(_) => "publish status",
                    None => "publish main",
                };
                (on.to_owned(), p.key.name.to_string())
            }
            Step::Warn(w) => (format!("warn {}", w.reason), String::new()),
            other => (format!("{other:?}"), String::new()),
        })
        .collect()
}

fn row(doing: &str, name: &str) -> (String, String) {
    (doing.to_owned(), name.to_owned())
}

/// The published status fragment of a plan.
fn status(plan: &Plan) -> &Publication {
    plan.steps
        .iter()
        .find_map(|s| match s {
            Step::Publish(p) if p.key.subresource.is_some() => Some(p),
            _ => None,
        })
        .expect("a status published")
}

fn condition<'a>(p: &'a Publication, type_: &str) -> &'a Value {
    let list = p.fragment["status"]["conditions"]
        .as_array()
        .expect("conditions");
    list.iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no condition {type_} in {list:?}"))
}

#[test]
fn a_new_capt_cluster_gets_its_finalizer_its_apply_and_the_apply_s_name_then_decides_again() {
    let cc = capt_cluster(json!({"metadata": {"finalizers": null},
        "spec": {"workspaceTemplateApplyName": null}}));
    let plan = decide(
        &snapshot(cc, Some(cluster(true)), None),
        &Progress::default(),
        now(),
    );
    assert_eq!(
        steps(&plan),
        [
            row(ADDING_FINALIZER, "demo"),
            row(APPLYING, "demo-vpc"),
            row(RECORDING, "demo"),
        ]
    );
    assert_eq!(plan.next, Next::Redecide);
    let Step::Apply { body, force, .. } = &plan.steps[1] else {
        unreachable!()
    };
    assert!(
        force,
        "the apply is the controller's: it takes its fields back"
    );
    assert_eq!(
        body["spec"]["variables"]["CLUSTER_NAME"], "default_demo",
        "the name that reaches Terraform carries the namespace"
    );
}

#[test]
fn after_the_writes_the_status_observes_what_they_answered() {
    let cc = capt_cluster(json!({"metadata": {"finalizers": null},
        "spec": {"workspaceTemplateApplyName": null}}));
    let seen = snapshot(cc, Some(cluster(true)), None);
    let mut progress = Progress::default();
    let finalized = capt_cluster(json!({"metadata": {"resourceVersion": "11"},
        "spec": {"workspaceTemplateApplyName": null}}));
    let as_dynamic = |v: Value| -> DynamicObject { object(v) };
    progress.answered(
        ADDING_FINALIZER,
        as_dynamic(serde_json::to_value(&*finalized).unwrap()),
    );
    progress.answered(APPLYING, as_dynamic(vpc_apply()));
    let recorded = capt_cluster(json!({"metadata": {"resourceVersion": "12", "generation": 2}}));
    progress.answered(
        RECORDING,
        as_dynamic(serde_json::to_value(&*recorded).unwrap()),
    );
    let plan = decide(&seen, &progress, now());
    assert_eq!(steps(&plan), [row("publish status", "demo")]);
    let p = status(&plan);
    assert_eq!(
        p.written.as_deref(),
        Some("12"),
        "after the recorded name's write"
    );
    assert_eq!(
        p.computed_on.as_deref(),
        Some("11"),
        "computed on the object the finalizer's write answered"
    );
    assert_eq!(
        p.fragment["status"]["observedGeneration"], 2,
        "the generation the recorded name's write made, not the cached one: else the status \
         is written twice"
    );
}

#[test]
fn a_capt_cluster_whose_apply_is_up_to_date_writes_nothing_but_its_status() {
    let seen = snapshot(
        capt_cluster(json!({})),
        Some(cluster(true)),
        Some(vpc_apply()),
    );
    let plan = decide(&seen, &Progress::default(), now());
    assert_eq!(steps(&plan), [row("publish status", "demo")]);
    assert_eq!(status(&plan).written, None);
}

#[test]
fn an_apply_changed_by_someone_is_applied_again() {
    let mut apply = vpc_apply();
    apply["spec"]["variables"]["REGION"] = json!("elsewhere");
    let seen = snapshot(capt_cluster(json!({})), Some(cluster(true)), Some(apply));
    let plan = decide(&seen, &Progress::default(), now());
    assert_eq!(steps(&plan), [row(APPLYING, "demo-vpc")]);
    assert_eq!(plan.next, Next::Redecide);
}

#[test]
fn without_its_cluster_a_capt_cluster_writes_no_apply_and_says_it_waits() {
    let seen = snapshot(capt_cluster(json!({})), None, None);
    let plan = decide(&seen, &Progress::default(), now());
    assert_eq!(steps(&plan), [row("publish status", "demo")]);
}

#[test]
fn a_decoy_labelled_with_another_s_cluster_is_told_and_builds_nothing() {
    let seen = snapshot(capt_cluster(json!({})), Some(cluster(false)), None);
    let plan = decide(&seen, &Progress::default(), now());
    assert_eq!(
        steps(&plan),
        [
            row(&format!("warn {CLUSTER_DOES_NOT_REFERENCE}"), ""),
            row("publish status", "demo"),
        ]
    );
    let mut progress = Progress::default();
    progress.answered(
        "an earlier write",
        object(json!({"apiVersion": "v1", "kind": "X",
        "metadata": {"name": "x"}})),
    );
    let again = decide(&seen, &progress, now());
    assert_eq!(
        steps(&again),
        [row("publish status", "demo")],
        "told once per reconcile, in its first round"
    );
}

#[test]
fn an_existing_vpc_needs_no_apply() {
    let cc = capt_cluster(json!({"spec": {"existingVpcId": "vpc-1"}}));
    let plan = decide(
        &snapshot(cc, Some(cluster(true)), None),
        &Progress::default(),
        now(),
    );
    assert_eq!(steps(&plan), [row("publish status", "demo")]);
}

#[test]
fn a_template_in_another_namespace_is_refused_and_looked_at_again_within_the_poll() {
    let cc =
        capt_cluster(json!({"spec": {"vpcTemplateRef": {"name": "vpc", "namespace": "theirs"}}}));
    let plan = decide(
        &snapshot(cc, Some(cluster(true)), None),
        &Progress::default(),
        now(),
    );
    assert_eq!(steps(&plan), [row("publish status", "demo")]);
    assert_eq!(
        condition(status(&plan), "ReferencesResolved")["status"],
        "False"
    );
    assert_eq!(plan.next, Next::After(Duration::from_secs(5)));
}

#[test]
fn an_allowed_template_namespace_is_not_refused() {
    let cc = capt_cluster(
        json!({"spec": {"vpcTemplateRef": {"name": "vpc", "namespace": "capt-templates"}}}),
    );
    let mut seen = snapshot(cc, Some(cluster(true)), None);
    seen.allowed_template_namespaces = std::sync::Arc::new(["capt-templates".into()].into());
    let plan = decide(&seen, &Progress::default(), now());
    assert_eq!(steps(&plan), [row(APPLYING, "demo-vpc")]);
}

#[test]
fn an_apply_of_its_name_that_is_not_its_own_is_left_alone_and_refused() {
    let mut apply = vpc_apply();
    apply["metadata"]["labels"]["infrastructure.cluster.x-k8s.io/owner-name"] = json!("other");
    let seen = snapshot(capt_cluster(json!({})), Some(cluster(true)), Some(apply));
    let plan = decide(&seen, &Progress::default(), now());
    assert_eq!(steps(&plan), [row("publish status", "demo")]);
    assert_eq!(
        condition(status(&plan), APPLY_OWNED_CONDITION)["status"],
        "False"
    );
}

#[test]
fn a_paused_cluster_holds_it_before_any_write() {
    let cc = capt_cluster(json!({"metadata": {"finalizers": null,
        "annotations": {"cluster.x-k8s.io/paused": ""}}}));
    let plan = decide(
        &snapshot(cc, Some(cluster(true)), None),
        &Progress::default(),
        now(),
    );
    assert_eq!(steps(&plan), [row("publish status", "demo")]);
    assert_eq!(condition(status(&plan), "Paused")["status"], "True");
    assert_eq!(plan.next, Next::AwaitChange);
}

#[test]
fn a_deletion_that_is_not_ours_to_carry_out_writes_nothing() {
    let cc = capt_cluster(json!({"metadata": {"finalizers": ["someone-else"],
        "deletionTimestamp": "2026-12-07T11:59:30Z"}}));
    let plan = decide(
        &snapshot(cc, Some(cluster(true)), None),
        &Progress::default(),
        now(),
    );
    assert_eq!(steps(&plan), []);
    assert_eq!(plan.next, Next::AwaitChange);
}
