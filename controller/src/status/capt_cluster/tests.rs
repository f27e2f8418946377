//! Tests of the CAPTCluster status, as sequences of reconciles whose fragments are merged the
//! way the status-applier merges them.

use super::*;
use crate::status::testing::{T0, at_min, failure, has_null, ts};
use crate::status::workspace::testing::{
    creating_workspace, failed_workspace, paused_workspace, ready_workspace,
};

fn mk_input() -> CaptClusterInput {
    CaptClusterInput {
        generation: Some(1),
        existing_vpc_id: None,
        created: ts(T0),
        now: at_min(1),
        vpc_ready_timeout: DEFAULT_VPC_READY_TIMEOUT,
        existing: None,
        workspace: None,
        vpc_workspace_name: None,
        waiting_for_cluster: false,
        cluster_endpoint: None,
    }
}

fn with(f: impl FnOnce(&mut CaptClusterInput)) -> CaptClusterInput {
    let mut input = mk_input();
    f(&mut input);
    input
}

fn at(now: i64, ws: Option<WorkspaceObservation>) -> CaptClusterInput {
    with(|i| {
        i.now = at_min(now);
        i.workspace = ws;
    })
}

fn vpc_ready_ws() -> WorkspaceObservation {
    ready_workspace(json!({"vpc_id": "vpc-0abc", "private_subnets": ["s-1", "s-2"]}))
}

struct Sim {
    live: Value,
}

impl Sim {
    fn new() -> Self {
        Self { live: json!({}) }
    }

    fn step(&mut self, mut input: CaptClusterInput) -> CaptClusterDesired {
        // The live status as the controller's cache holds it.
        input.existing = self.live.get("status").map(|s| {
            let mut status = serde_json::from_value(s.clone()).unwrap();
            keep_what_is_read(&mut status);
            status
        });
        let desired = desired_capt_cluster(&input);
        json_patch::merge(&mut self.live, &desired.status_fragment);
        desired
    }

    fn condition(&self, type_: &str) -> Value {
        let list = self.live["status"]["conditions"].as_array().unwrap();
        list.iter().find(|c| c["type"] == type_).unwrap().clone()
    }
}

fn status(d: &CaptClusterDesired) -> &Value {
    &d.status_fragment["status"]
}

fn condition(d: &CaptClusterDesired, type_: &str) -> Value {
    let list = status(d)["conditions"].as_array().unwrap();
    list.iter().find(|c| c["type"] == type_).unwrap().clone()
}

#[test]
fn an_existing_vpc_is_ready_at_once_and_nulls_the_workspace_fields() {
    let d = desired_capt_cluster(&with(|i| i.existing_vpc_id = Some("vpc-123".into())));
    assert!(d.ready);
    let s = status(&d);
    assert_eq!(s["vpcId"], json!("vpc-123"));
    assert_eq!(s["vpcWorkspaceName"], Value::Null);
    assert_eq!(s["workspaceTemplateStatus"], Value::Null);
    assert!(s.as_object().unwrap().contains_key("vpcWorkspaceName"));
    assert_eq!(condition(&d, "VPCReady")["reason"], reason::EXISTING_VPC);
    assert_eq!(d.recheck_after, None);
}

#[test]
fn each_vpc_state_gives_its_readiness_and_reason() {
    let cases = [
        (
            "workspace ready with vpc_id",
            at(2, Some(vpc_ready_ws())),
            true,
            reason::VPC_READY,
        ),
        (
            "workspace ready without vpc_id",
            at(2, Some(ready_workspace(json!({})))),
            false,
            reason::WAITING_FOR_VPC_ID,
        ),
        (
            "workspace creating",
            at(2, Some(creating_workspace())),
            false,
            reason::WORKSPACE_CREATING,
        ),
        (
            "workspace not found",
            at(2, None),
            false,
            reason::WAITING_FOR_WORKSPACE,
        ),
        (
            "ReconcileError",
            at(2, Some(failed_workspace("Error: VpcLimitExceeded"))),
            false,
            reason::WORKSPACE_FAILED,
        ),
        (
            "timed out",
            at(15, Some(creating_workspace())),
            false,
            reason::VPC_READY_TIMEOUT,
        ),
        (
            "waiting for the owning Cluster never times out",
            with(|i| {
                i.now = at_min(600);
                i.waiting_for_cluster = true;
            }),
            false,
            reason::WAITING_FOR_CLUSTER,
        ),
    ];
    for (name, input, ready, reason) in cases {
        let d = desired_capt_cluster(&input);
        assert_eq!(d.ready, ready, "{name}");
        assert_eq!(status(&d)["ready"], json!(ready), "{name}");
        assert_eq!(condition(&d, "VPCReady")["reason"], reason, "{name}");
    }
}

#[test]
fn a_ready_vpc_publishes_its_id_workspace_name_and_template_status() {
    let d = desired_capt_cluster(&at(2, Some(vpc_ready_ws())));
    let s = status(&d);
    assert_eq!(d.vpc_id.as_deref(), Some("vpc-0abc"));
    assert_eq!(s["vpcId"], json!("vpc-0abc"));
    assert_eq!(s["vpcWorkspaceName"], json!("ws-1"));
    assert_eq!(failed_reason(s), Value::Null);
    assert_eq!(failed_message(s), Value::Null);
    assert_eq!(s["observedGeneration"], json!(1));
    assert_eq!(
        s["workspaceTemplateStatus"]["outputs"],
        json!({"vpc_id": "vpc-0abc", "private_subnets": r#"["s-1","s-2"]"#})
    );
    assert_eq!(condition(&d, "VPCFailed")["status"], "False");
    assert_eq!(condition(&d, "WaitingForCluster")["status"], "False");
}

#[test]
fn a_reconcile_error_is_a_failure_with_the_providers_message() {
    let d = desired_capt_cluster(&at(2, Some(failed_workspace("Error: VpcLimitExceeded"))));
    let s = status(&d);
    assert_eq!(failed_reason(s), json!(reason::WORKSPACE_FAILED));
    assert_eq!(
        failed_message(s),
        json!("Workspace ws-1: Error: VpcLimitExceeded")
    );
    assert_eq!(condition(&d, "VPCFailed")["status"], "True");
    assert_eq!(
        s["workspaceTemplateStatus"]["lastFailureMessage"],
        json!("Error: VpcLimitExceeded")
    );
}

#[test]
fn waiting_for_the_cluster_is_a_true_condition_from_the_input_flag() {
    let d = desired_capt_cluster(&with(|i| i.waiting_for_cluster = true));
    assert_eq!(condition(&d, "WaitingForCluster")["status"], "True");
    assert_eq!(d.recheck_after, None);
}

#[test]
fn the_timeout_counts_from_creation_then_from_the_cluster_appearing() {
    let d = desired_capt_cluster(&at(5, None));
    assert_eq!(d.recheck_after, Some(Duration::from_secs(10 * 60)));
    let mut sim = Sim::new();
    sim.step(with(|i| {
        i.now = at_min(30);
        i.waiting_for_cluster = true;
    }));
    let d = sim.step(at(40, None));
    assert_eq!(d.recheck_after, Some(Duration::from_secs(15 * 60)));
    assert!(!sim.step(at(54, Some(creating_workspace()))).ready);
    assert!(sim.live["status"].get("failureReason").is_none());
    let d = sim.step(at(55, Some(creating_workspace())));
    assert_eq!(failed_reason(status(&d)), json!(reason::VPC_READY_TIMEOUT));
}

#[test]
fn a_timeout_stays_until_the_vpc_is_ready_or_the_spec_changes() {
    let mut sim = Sim::new();
    sim.step(at(16, Some(creating_workspace())));
    let d = sim.step(at(20, Some(creating_workspace())));
    assert_eq!(failed_reason(status(&d)), json!(reason::VPC_READY_TIMEOUT));
    let respec = sim.step(with(|i| {
        i.generation = Some(2);
        i.now = at_min(21);
        i.workspace = Some(creating_workspace());
    }));
    assert_eq!(failed_reason(status(&respec)), Value::Null);
    assert_eq!(respec.recheck_after, Some(Duration::from_secs(15 * 60)));
    let mut sim = Sim::new();
    sim.step(at(16, Some(creating_workspace())));
    assert!(sim.step(at(17, Some(vpc_ready_ws()))).ready);
}

#[test]
fn a_cleared_failure_is_retried_with_a_fresh_timeout_and_nulls() {
    let mut sim = Sim::new();
    sim.step(at(10, Some(failed_workspace("boom"))));
    assert_eq!(
        failed_reason(&sim.live["status"]),
        json!(reason::WORKSPACE_FAILED)
    );
    let d = sim.step(at(12, Some(creating_workspace())));
    assert_eq!(failed_message(status(&d)), Value::Null);
    assert!(sim.live["status"].get("failureMessage").is_none());
    assert_eq!(d.recheck_after, Some(Duration::from_secs(15 * 60)));
    assert_eq!(
        sim.condition("VPCFailed")["lastTransitionTime"],
        json!("2024-01-01T00:12:00Z")
    );
}

#[test]
fn repeated_reconciles_publish_identical_fragments() {
    let mut sim = Sim::new();
    let a = sim.step(at(2, Some(creating_workspace())));
    let b = sim.step(at(9, Some(creating_workspace())));
    assert_eq!(
        serde_json::to_string(&a.status_fragment).unwrap(),
        serde_json::to_string(&b.status_fragment).unwrap()
    );
    assert_eq!(sim.condition("VPCReady")["lastTransitionTime"], json!(T0));
}

#[test]
fn an_unknown_workspace_omits_what_it_would_tell_and_keeps_the_merged_values() {
    let mut sim = Sim::new();
    sim.step(at(2, Some(vpc_ready_ws())));
    let d = sim.step(at(3, None));
    let s = status(&d).as_object().unwrap();
    assert!(!s.contains_key("workspaceTemplateStatus"));
    assert!(!s.contains_key("vpcId"));
    assert!(!s.contains_key("vpcWorkspaceName"));
    assert_eq!(sim.live["status"]["vpcId"], json!("vpc-0abc"));
    assert!(!has_null(&sim.live), "the merged document never holds null");
}

#[test]
fn the_workspace_name_comes_from_the_apply_when_given() {
    let d = desired_capt_cluster(&with(|i| i.vpc_workspace_name = Some("vpc-demo".into())));
    assert_eq!(status(&d)["vpcWorkspaceName"], json!("vpc-demo"));
}

#[test]
fn the_fragment_lists_only_this_managers_conditions() {
    let d = desired_capt_cluster(&at(2, Some(vpc_ready_ws())));
    let types: Vec<&str> = status(&d)["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, CAPT_CLUSTER_CONDITION_TYPES);
}

#[test]
fn the_vpc_zones_become_failure_domains() {
    let ws = ready_workspace(
        json!({"vpc_id": "vpc-1", "azs": ["ap-northeast-1c", "ap-northeast-1a", "", "ap-northeast-1c"]}),
    );
    let d = desired_capt_cluster(&with(|i| i.workspace = Some(ws)));
    // The v1beta2 contract's list keyed by name: sorted, each zone once.
    assert_eq!(
        status(&d)["failureDomains"],
        json!([{"name": "ap-northeast-1a", "controlPlane": true},
               {"name": "ap-northeast-1c", "controlPlane": true}])
    );
    let d = desired_capt_cluster(&with(|i| i.workspace = Some(vpc_ready_ws())));
    assert!(
        status(&d).get("failureDomains").is_none(),
        "no azs output: nothing claimed"
    );
}

/// The Cluster API contract: `ready` never goes back once the VPC was provisioned.
#[test]
fn ready_stays_true_while_the_vpc_is_re_applied() {
    let mut sim = Sim::new();
    sim.step(at(2, Some(vpc_ready_ws())));
    let d = sim.step(with(|i| {
        i.now = at_min(3);
        i.generation = Some(2);
        i.workspace = Some(creating_workspace());
    }));
    assert!(!d.ready, "the outcome is not ready");
    assert_eq!(sim.live["status"]["ready"], json!(true));
    assert_eq!(sim.condition("VPCReady")["status"], "False");
}

#[test]
fn the_clusters_endpoint_is_shown_as_host_and_port() {
    let e = ApiEndpoint {
        host: "h.example".into(),
        port: 6443,
    };
    let d = desired_capt_cluster(&with(|i| i.cluster_endpoint = Some(e)));
    assert_eq!(status(&d)["endpoint"], json!("h.example:6443"));
    let d = desired_capt_cluster(&mk_input());
    assert!(status(&d).get("endpoint").is_none());
}

#[test]
fn a_cluster_endpoint_without_its_host_or_port_is_not_shown() {
    // Cluster API v1beta2 lets a Cluster hold either alone; core reads it as no endpoint.
    for json in [json!({"host": "h.example"}), json!({"port": 6443})] {
        let e: ApiEndpoint = serde_json::from_value(json.clone()).expect("half an endpoint");
        let d = desired_capt_cluster(&with(|i| i.cluster_endpoint = Some(e)));
        assert!(status(&d).get("endpoint").is_none(), "{json}");
    }
}

fn failed_reason(status: &Value) -> Value {
    failure(status, "VPCFailed").0
}

fn failed_message(status: &Value) -> Value {
    failure(status, "VPCFailed").1
}

#[test]
fn a_paused_vpc_workspace_keeps_a_ready_vpc_ready_and_never_times_out() {
    let outputs = json!({"vpc_id": "vpc-0abc", "private_subnets": ["s-1", "s-2"]});
    let mut sim = Sim::new();
    assert!(sim.step(at(2, Some(vpc_ready_ws()))).ready);
    let paused = sim.step(at(600, Some(paused_workspace(true, outputs))));
    assert!(paused.ready);
    assert_eq!(paused.vpc_id.as_deref(), Some("vpc-0abc"));
    assert_eq!(paused.recheck_after, None);

    // Paused before it was ready: waiting, said so, long past the VPC timeout.
    let mut sim = Sim::new();
    for now in [2, 600] {
        let d = sim.step(at(now, Some(paused_workspace(false, json!({})))));
        assert!(!d.ready, "minute {now}");
        assert_eq!(d.recheck_after, None);
        assert_eq!(
            sim.condition("VPCReady")["reason"],
            reason::WORKSPACE_PAUSED
        );
    }
}

/// The v1beta2 contract: `initialization.provisioned` beside the deprecated `ready`, both
/// sticky; the `Ready` condition (which core mirrors into `InfrastructureReady`) tells the
/// state of now, and goes False when the VPC fails after it was provisioned.
#[test]
fn provisioned_is_sticky_and_the_ready_condition_follows_the_vpc() {
    let ready = desired_capt_cluster(&with(|i| i.workspace = Some(vpc_ready_ws())));
    let s = status(&ready);
    assert_eq!(s["initialization"], json!({"provisioned": true}));
    assert_eq!(s["ready"], true);
    let cond = |s: &Value, t: &str| {
        s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == t)
            .cloned()
            .unwrap()
    };
    assert_eq!(cond(s, "Ready")["status"], "True");
    assert!(cond(s, "Ready").get("severity").is_none(), "plain metav1");
    let existing: CAPTClusterStatus = serde_json::from_value(s.clone()).unwrap();
    let failed = desired_capt_cluster(&with(|i| {
        i.existing = Some(existing.clone());
        i.workspace = Some(failed_workspace("Error: boom"));
    }));
    let s = status(&failed);
    assert_eq!(s["initialization"], json!({"provisioned": true}), "sticky");
    assert_eq!(s["ready"], true, "sticky");
    assert_eq!(cond(s, "Ready")["status"], "False");
    assert_eq!(cond(s, "Ready")["reason"], reason::WORKSPACE_FAILED);
    let v1beta1 = &s["deprecated"]["v1beta1"]["conditions"][0];
    assert_eq!(
        (&v1beta1["type"], &v1beta1["severity"]),
        (&json!("Ready"), &json!("Error"))
    );
}
