//! Tests of the control-plane phase machine, as sequences of reconciles whose fragments are
//! merged the way the status-applier merges them.

use super::*;
use crate::status::testing::{T0, at_min, failure, ts};
use crate::status::workspace::testing::{
    creating_workspace, degraded_workspace, failed_update_workspace, failed_workspace,
    paused_workspace, ready_workspace,
};

const ENDPOINT: &str = "https://ABC.gr7.ap-northeast-1.eks.amazonaws.com";

fn mk_input() -> ControlPlaneInput {
    ControlPlaneInput {
        generation: Some(1),
        version: "1.31".into(),
        timeouts: None,
        created: ts(T0),
        now: at_min(1),
        existing: None,
        cluster_found: true,
        vpc_ready: Some(true),
        workspace: None,
        endpoint_source: None,
        apply_generation: None,
    }
}

fn ready_ws() -> WorkspaceObservation {
    ready_workspace(json!({"cluster_endpoint": ENDPOINT, "cluster_name": "demo"}))
}

/// Plays reconciles in order, merging each fragment into the live status.
struct Sim {
    live: Value,
}

impl Sim {
    fn new() -> Self {
        Self { live: json!({}) }
    }

    /// Reconciles `input` against the live status, then merges the fragment into it.
    fn step(&mut self, mut input: ControlPlaneInput) -> ControlPlaneDesired {
        input.existing = self.existing();
        let desired = desired_control_plane(&input);
        json_patch::merge(&mut self.live, &desired.status_fragment);
        desired
    }

    /// The live status as the controller's cache holds it.
    fn existing(&self) -> Option<CAPTControlPlaneStatus> {
        let status = self.live.get("status")?;
        let mut status = serde_json::from_value(status.clone()).unwrap();
        keep_what_is_read(&mut status);
        Some(status)
    }

    fn condition(&self, type_: &str) -> Value {
        let list = self.live["status"]["conditions"].as_array().unwrap();
        list.iter().find(|c| c["type"] == type_).unwrap().clone()
    }
}

fn status(d: &ControlPlaneDesired) -> &Value {
    &d.status_fragment["status"]
}

fn with(f: impl FnOnce(&mut ControlPlaneInput)) -> ControlPlaneInput {
    let mut input = mk_input();
    f(&mut input);
    input
}

fn ready_input(now: i64) -> ControlPlaneInput {
    with(|i| {
        i.now = at_min(now);
        i.workspace = Some(ready_ws());
        i.endpoint_source = Some(ENDPOINT.into());
    })
}

fn creating_input(now: i64) -> ControlPlaneInput {
    with(|i| {
        i.now = at_min(now);
        i.workspace = Some(creating_workspace());
    })
}

#[test]
fn each_transition_of_the_seed_state_diagram() {
    type Setup = fn(&mut Sim);
    let start_ready: Setup = |s| {
        s.step(ready_input(5));
    };
    let start_failed: Setup = |s| {
        s.step(with(|i| i.workspace = Some(failed_workspace("boom"))));
    };
    let start_timed_out: Setup = |s| {
        s.step(creating_input(31));
    };
    let start_creating: Setup = |s| {
        s.step(creating_input(1));
    };
    let cases: Vec<(&str, Setup, ControlPlaneInput, ControlPlanePhase, &str)> = vec![
        (
            "Creating -> Ready: Workspace ready and endpoint available",
            start_creating,
            ready_input(10),
            ControlPlanePhase::Ready,
            reason::CONTROL_PLANE_READY,
        ),
        (
            "Creating -> Failed: ReconcileError",
            start_creating,
            with(|i| i.workspace = Some(failed_workspace("Error: quota"))),
            ControlPlanePhase::Failed,
            reason::WORKSPACE_FAILED,
        ),
        (
            "Ready -> Creating: the Workspace is not ready any more (recreated)",
            start_ready,
            with(|i| {
                i.generation = Some(2);
                i.now = at_min(60);
                i.workspace = Some(creating_workspace());
                i.endpoint_source = Some(ENDPOINT.into());
            }),
            ControlPlanePhase::Creating,
            reason::WORKSPACE_CREATING,
        ),
        (
            "Failed -> Creating: retry once the failure clears",
            start_failed,
            creating_input(2),
            ControlPlanePhase::Creating,
            reason::WORKSPACE_CREATING,
        ),
        (
            "Failed -> Creating: a timeout is retried on a new generation",
            start_timed_out,
            with(|i| {
                i.generation = Some(2);
                i.now = at_min(40);
                i.workspace = Some(creating_workspace());
            }),
            ControlPlanePhase::Creating,
            reason::WORKSPACE_CREATING,
        ),
    ];
    for (name, setup, input, phase, reason) in cases {
        let mut sim = Sim::new();
        setup(&mut sim);
        let d = sim.step(input);
        assert_eq!(d.phase, phase, "{name}");
        assert_eq!(status(&d)["phase"], json!(phase), "{name}");
        assert_eq!(sim.condition("Ready")["reason"], reason, "{name}");
    }
}

#[test]
fn each_failure_path_sets_phase_reason_and_conditions() {
    let cases: Vec<(&str, ControlPlaneInput, ControlPlanePhase, &str)> = vec![
        (
            "ReconcileError",
            with(|i| i.workspace = Some(failed_workspace("Error: quota exceeded"))),
            ControlPlanePhase::Failed,
            reason::WORKSPACE_FAILED,
        ),
        (
            "controlPlaneTimeout",
            creating_input(30),
            ControlPlanePhase::Failed,
            reason::CONTROL_PLANE_TIMEOUT,
        ),
        (
            "vpcReadyTimeout",
            with(|i| {
                i.now = at_min(15);
                i.vpc_ready = Some(false);
            }),
            ControlPlanePhase::Failed,
            reason::VPC_READY_TIMEOUT,
        ),
        (
            "invalid endpoint",
            with(|i| {
                i.workspace = Some(ready_ws());
                i.endpoint_source = Some("ftp://nope".into());
            }),
            ControlPlanePhase::Failed,
            reason::INVALID_ENDPOINT,
        ),
        (
            "missing endpoint",
            with(|i| i.workspace = Some(ready_workspace(json!({})))),
            ControlPlanePhase::Creating,
            reason::WAITING_FOR_ENDPOINT,
        ),
        (
            "unreadable workspace",
            mk_input(),
            ControlPlanePhase::Creating,
            reason::WAITING_FOR_WORKSPACE,
        ),
        (
            "missing endpoint past the timeout",
            with(|i| {
                i.now = at_min(45);
                i.workspace = Some(ready_workspace(json!({})));
            }),
            ControlPlanePhase::Failed,
            reason::CONTROL_PLANE_TIMEOUT,
        ),
        (
            "invalid timeout",
            with(|i| {
                i.timeouts = Some(Timeouts {
                    control_plane_timeout: String::new(),
                    ..Timeouts::default()
                })
            }),
            ControlPlanePhase::Failed,
            reason::INVALID_TIMEOUT,
        ),
    ];
    for (name, input, phase, reason) in cases {
        let d = desired_control_plane(&input);
        let s = status(&d);
        assert_eq!(d.phase, phase, "{name}");
        assert_eq!(s["ready"], json!(false), "{name}");
        let failed = phase == ControlPlanePhase::Failed;
        let expected_reason = if failed { json!(reason) } else { Value::Null };
        assert_eq!(failed_reason(s), expected_reason, "{name}");
        assert_eq!(failed_message(s).is_string(), failed, "{name}");
        let conds = s["conditions"].as_array().unwrap();
        let cond = |t: &str| conds.iter().find(|c| c["type"] == t).unwrap().clone();
        assert_eq!(cond("Ready")["reason"], reason, "{name}");
        assert_eq!(
            cond("Failed")["status"],
            if failed { "True" } else { "False" },
            "{name}"
        );
        assert_eq!(
            cond("Creating")["status"],
            if failed { "False" } else { "True" },
            "{name}"
        );
    }
}

#[test]
fn ready_sets_endpoint_version_initialized_and_workspace_mirrors() {
    let d = desired_control_plane(&ready_input(5));
    let s = status(&d);
    assert_eq!(
        d.endpoint,
        Some(ApiEndpoint {
            host: ENDPOINT[8..].into(),
            port: 443
        })
    );
    assert_eq!(d.recheck_after, None);
    assert_eq!(s["ready"], json!(true));
    assert_eq!(s["initialized"], json!(true));
    assert_eq!(s["version"], json!("1.31"));
    assert_eq!(s["versions"], json!([{"version": "1.31"}]));
    assert_eq!(s["observedGeneration"], json!(1));
    assert_eq!(
        s["workspaceTemplateStatus"]["lastAppliedRevision"],
        json!("sum-1")
    );
    assert_eq!(
        s["workspaceTemplateStatus"]["outputs"]["cluster_name"],
        json!("demo")
    );
    assert_eq!(s["workspaceStatus"]["state"], json!("Available"));
}

#[test]
fn the_reconcile_error_message_is_the_providers_not_still_creating() {
    let input = with(|i| i.workspace = Some(failed_workspace("Error: creating EKS Cluster")));
    let d = desired_control_plane(&input);
    let message = failed_message(status(&d)).as_str().unwrap().to_string();
    assert_eq!(message, "Workspace ws-1: Error: creating EKS Cluster");
    assert!(
        !message
            .to_lowercase()
            .contains("creating the control plane")
    );
}

#[test]
fn the_same_input_twice_gives_byte_identical_fragments() {
    for input in [ready_input(5), creating_input(3), mk_input()] {
        let a = serde_json::to_string(&desired_control_plane(&input).status_fragment).unwrap();
        let b = serde_json::to_string(&desired_control_plane(&input).status_fragment).unwrap();
        assert_eq!(a, b);
    }
}

#[test]
fn a_reconcile_that_observes_nothing_new_publishes_an_identical_fragment() {
    let mut sim = Sim::new();
    let first = sim.step(creating_input(3));
    let second = sim.step(creating_input(7));
    assert_eq!(first.status_fragment, second.status_fragment);
    let ready1 = sim.step(ready_input(8));
    let ready2 = sim.step(ready_input(20));
    assert_eq!(ready1.status_fragment, ready2.status_fragment);
}

#[test]
fn transition_times_carry_over_while_the_status_is_unchanged() {
    let mut sim = Sim::new();
    sim.step(with(|i| i.now = at_min(1)));
    let creating_since = sim.condition("Creating")["lastTransitionTime"].clone();
    assert_eq!(
        creating_since,
        json!(T0),
        "the first wait is dated from creation"
    );
    sim.step(creating_input(4));
    assert_eq!(
        sim.condition("Creating")["lastTransitionTime"],
        creating_since
    );
    assert_eq!(
        sim.condition("Creating")["reason"],
        reason::WORKSPACE_CREATING
    );
    sim.step(ready_input(9));
    assert_eq!(
        sim.condition("Creating")["lastTransitionTime"],
        json!("2024-01-01T00:09:00Z")
    );
    assert_eq!(
        sim.condition("Failed")["lastTransitionTime"],
        json!("2024-01-01T00:01:00Z")
    );
}

#[test]
fn the_first_wait_counts_from_creation_and_later_waits_from_their_transition() {
    let d = desired_control_plane(&creating_input(10));
    assert_eq!(d.recheck_after, Some(Duration::from_secs(20 * 60)));
    let message = status(&d)["conditions"][0]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.ends_with("(times out at 2024-01-01T00:30:00Z)"),
        "{message}"
    );
    let mut sim = Sim::new();
    sim.step(ready_input(5));
    let d = sim.step(creating_input(50));
    assert_eq!(d.phase, ControlPlanePhase::Creating);
    assert_eq!(d.recheck_after, Some(Duration::from_secs(30 * 60)));
    assert_eq!(
        sim.step(creating_input(79)).phase,
        ControlPlanePhase::Creating
    );
    assert_eq!(
        sim.step(creating_input(80)).phase,
        ControlPlanePhase::Failed
    );
}

#[test]
fn a_timeout_failure_stays_until_ready_or_a_new_generation() {
    let mut sim = Sim::new();
    assert_eq!(
        sim.step(creating_input(31)).phase,
        ControlPlanePhase::Failed
    );
    let again = sim.step(creating_input(32));
    assert_eq!(again.phase, ControlPlanePhase::Failed);
    assert_eq!(again.recheck_after, None);
    assert_eq!(
        failed_reason(status(&again)),
        json!(reason::CONTROL_PLANE_TIMEOUT)
    );
    assert_eq!(sim.step(ready_input(33)).phase, ControlPlanePhase::Ready);
}

#[test]
fn a_vpc_timeout_clears_once_the_vpc_is_ready() {
    let mut sim = Sim::new();
    let vpc_down = |now| {
        with(|i| {
            i.now = at_min(now);
            i.vpc_ready = Some(false);
        })
    };
    assert_eq!(sim.step(vpc_down(16)).phase, ControlPlanePhase::Failed);
    assert_eq!(sim.step(vpc_down(17)).phase, ControlPlanePhase::Failed);
    let retry = sim.step(creating_input(18));
    assert_eq!(retry.phase, ControlPlanePhase::Creating);
    assert_eq!(retry.recheck_after, Some(Duration::from_secs(30 * 60)));
}

#[test]
fn the_vpc_timeout_only_applies_while_the_vpc_is_known_not_ready() {
    let unknown = with(|i| {
        i.now = at_min(20);
        i.vpc_ready = None;
    });
    assert_eq!(
        desired_control_plane(&unknown).phase,
        ControlPlanePhase::Creating
    );
    let waiting = with(|i| {
        i.now = at_min(10);
        i.vpc_ready = Some(false);
        i.workspace = Some(creating_workspace());
    });
    let d = desired_control_plane(&waiting);
    assert_eq!(d.recheck_after, Some(Duration::from_secs(5 * 60)));
    assert_eq!(
        status(&d)["conditions"][0]["reason"],
        reason::WAITING_FOR_VPC
    );
}

#[test]
fn custom_timeouts_are_honoured() {
    let input = with(|i| {
        i.now = at_min(50);
        i.timeouts = Some(Timeouts {
            control_plane_timeout: "1h".into(),
            vpc_ready_timeout: "45s".into(),
        });
    });
    assert_eq!(
        desired_control_plane(&input).phase,
        ControlPlanePhase::Creating
    );
}

#[test]
fn cleared_failures_are_explicit_nulls_and_vanish_from_the_merged_status() {
    let mut sim = Sim::new();
    sim.step(with(|i| i.workspace = Some(failed_workspace("boom"))));
    assert_eq!(
        failed_reason(&sim.live["status"]),
        json!(reason::WORKSPACE_FAILED)
    );
    let d = sim.step(creating_input(2));
    assert_eq!(failed_reason(status(&d)), Value::Null);
    assert!(
        status(&d)
            .as_object()
            .unwrap()
            .contains_key("failureMessage")
    );
    assert!(sim.live["status"].get("failureReason").is_none());
    assert!(sim.live["status"].get("failureMessage").is_none());
}

#[test]
fn an_unreadable_workspace_omits_the_workspace_mirrors_and_keeps_them_merged() {
    let mut sim = Sim::new();
    sim.step(ready_input(5));
    let at_provider = sim.live["status"]["workspaceStatus"]["atProvider"].clone();
    let d = sim.step(with(|i| i.now = at_min(6)));
    let s = status(&d).as_object().unwrap();
    assert!(!s.contains_key("workspaceStatus"));
    assert!(!s.contains_key("workspaceTemplateStatus"));
    assert_eq!(d.phase, ControlPlanePhase::Creating);
    assert_eq!(
        sim.live["status"]["workspaceStatus"]["atProvider"],
        at_provider
    );
    assert_eq!(sim.live["status"]["initialized"], json!(true));
}

#[test]
fn at_provider_is_copied_verbatim() {
    let at_outputs = json!({"cluster_endpoint": ENDPOINT, "odd": {"k": [1, "2", {"x": false}]}});
    let input = with(|i| {
        i.workspace = Some(ready_workspace(at_outputs.clone()));
        i.endpoint_source = Some(ENDPOINT.into());
    });
    let d = desired_control_plane(&input);
    assert_eq!(
        status(&d)["workspaceStatus"]["atProvider"],
        json!({"checksum": "sum-1", "outputs": at_outputs})
    );
    assert_eq!(
        status(&d)["workspaceTemplateStatus"]["outputs"]["odd"],
        json!(r#"{"k":[1,"2",{"x":false}]}"#)
    );
}

#[test]
fn initialized_stays_true_once_the_control_plane_was_ready() {
    let mut sim = Sim::new();
    sim.step(ready_input(5));
    let d = sim.step(with(|i| i.workspace = Some(failed_workspace("boom"))));
    assert_eq!(status(&d)["initialized"], json!(true));
    assert_eq!(sim.condition("Initialized")["status"], "True");
}

#[test]
fn version_is_published_only_when_ready() {
    let creating = desired_control_plane(&creating_input(2));
    assert!(status(&creating).get("version").is_none());
    assert!(status(&creating).get("versions").is_none());
}

#[test]
fn the_endpoint_is_published_whenever_it_parses_and_never_when_it_does_not() {
    let creating = with(|i| {
        i.workspace = Some(creating_workspace());
        i.endpoint_source = Some("https://h:6443".into());
    });
    let d = desired_control_plane(&creating);
    assert_eq!(
        d.endpoint,
        Some(ApiEndpoint {
            host: "h".into(),
            port: 6443
        })
    );
    let bad = with(|i| {
        i.workspace = Some(ready_ws());
        i.endpoint_source = Some("https://h:0".into());
    });
    let d = desired_control_plane(&bad);
    assert_eq!(d.endpoint, None);
    let message = failed_message(status(&d)).as_str().unwrap().to_string();
    assert!(message.contains("invalid port \"0\""), "{message}");
}

#[test]
fn the_fragment_lists_only_this_managers_conditions_in_a_fixed_order() {
    let d = desired_control_plane(&ready_input(5));
    let types: Vec<&str> = status(&d)["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, CONTROL_PLANE_CONDITION_TYPES);
}

/// The Cluster API contract: `ready`/`initialized` never go back once provisioning completed,
/// and `version` is the version last seen Ready, through an upgrade.
#[test]
fn an_upgrade_keeps_ready_initialized_and_the_old_version_until_ready_again() {
    let mut sim = Sim::new();
    sim.step(ready_input(2));
    let upgrade = |now| {
        with(|i| {
            i.now = at_min(now);
            i.generation = Some(2);
            i.version = "1.32".into();
            i.workspace = Some(creating_workspace());
        })
    };
    let d = sim.step(upgrade(3));
    assert_eq!(d.phase, ControlPlanePhase::Creating);
    let live = &sim.live["status"];
    assert_eq!(live["ready"], json!(true), "sticky through the upgrade");
    assert_eq!(live["initialized"], json!(true));
    assert_eq!(live["version"], json!("1.31"), "still the old version");
    // Core reads status.versions first: the old version there too, so it sees the upgrade
    // in progress (spec above status) until the new one is Ready.
    assert_eq!(live["versions"], json!([{"version": "1.31"}]));
    let ready_cond = live["conditions"].as_array().unwrap().iter();
    let ready_cond = ready_cond.clone().find(|c| c["type"] == "Ready").unwrap();
    assert_eq!(
        ready_cond["status"], "False",
        "the condition tells the truth of now"
    );
    sim.step(with(|i| {
        i.now = at_min(9);
        i.generation = Some(2);
        i.version = "1.32".into();
        i.workspace = Some(ready_ws());
        i.endpoint_source = Some(ENDPOINT.into());
    }));
    assert_eq!(sim.live["status"]["version"], json!("1.32"));
    assert_eq!(sim.live["status"]["versions"], json!([{"version": "1.32"}]));
}

/// provider-terraform keeps `Ready=True Available` when an apply of an existing Workspace
/// fails, and reports the failure in `Synced=False ReconcileError` only. A failed upgrade of a
/// running control plane: the failure shows in `phase` and the conditions, while `ready`,
/// `initialized`, the version last seen Ready and the endpoint stay; it never reads as
/// Creating (provisioning); once the apply succeeds it is Ready on the new version.
#[test]
fn a_failed_update_of_a_running_control_plane_keeps_what_was_provisioned() {
    let mut sim = Sim::new();
    sim.step(ready_input(2));
    let endpoint = sim.live["status"]["endpoint"].clone();
    assert!(endpoint.is_string(), "{}", sim.live);
    let outputs = json!({"cluster_endpoint": ENDPOINT, "cluster_name": "demo"});
    let upgrade = |now, ws: WorkspaceObservation| {
        with(|i| {
            i.now = at_min(now);
            i.generation = Some(2);
            i.version = "1.32".into();
            i.workspace = Some(ws);
            i.endpoint_source = Some(ENDPOINT.into());
        })
    };
    let message = "update failed: cannot apply Terraform configuration: AccessDenied";
    let d = sim.step(upgrade(
        3,
        failed_update_workspace(message, outputs.clone()),
    ));
    assert_eq!(d.phase, ControlPlanePhase::Failed);
    assert_eq!(
        d.endpoint.as_ref().map(|e| e.host.as_str()),
        Some("ABC.gr7.ap-northeast-1.eks.amazonaws.com")
    );
    let live = sim.live["status"].clone();
    assert_eq!(live["phase"], json!("Failed"));
    assert_eq!(live["ready"], json!(true), "sticky: provisioning completed");
    assert_eq!(live["initialized"], json!(true));
    assert_eq!(
        live["version"],
        json!("1.31"),
        "the version last seen Ready"
    );
    assert_eq!(live["endpoint"], endpoint);
    assert_eq!(live["failureReason"], Value::Null);
    assert_eq!(sim.condition("Failed")["status"], "True");
    assert!(
        sim.condition("Failed")["message"]
            .as_str()
            .is_some_and(|m| m.ends_with(message)),
        "{}",
        sim.condition("Failed")
    );
    assert_eq!(sim.condition("Ready")["status"], "False");
    assert_eq!(sim.condition("Ready")["reason"], reason::WORKSPACE_FAILED);
    assert_eq!(
        sim.condition("Creating")["status"],
        "False",
        "not provisioning"
    );
    assert_eq!(sim.condition("Initialized")["status"], "True");
    assert_eq!(
        live["workspaceStatus"]["state"],
        json!("Available"),
        "the Workspace's own Ready is mirrored"
    );
    assert_eq!(live["workspaceStatus"]["ready"], json!(false));
    assert_eq!(
        live["workspaceStatus"]["atProvider"]["outputs"], outputs,
        "atProvider kept through the failure"
    );
    // Still failing later: no timeout turns it into anything else, it stays Failed.
    let d = sim.step(upgrade(
        90,
        failed_update_workspace(message, outputs.clone()),
    ));
    assert_eq!(d.phase, ControlPlanePhase::Failed);
    assert_eq!(d.recheck_after, None);
    // The retry succeeds: Ready again, on the new version, with no Creating in between.
    let d = sim.step(upgrade(91, ready_ws()));
    assert_eq!(d.phase, ControlPlanePhase::Ready);
    assert_eq!(sim.live["status"]["version"], json!("1.32"));
    assert_eq!(sim.condition("Failed")["status"], "False");
    assert_eq!(sim.condition("Ready")["status"], "True");
}

#[test]
fn the_control_plane_is_externally_managed_and_shows_its_endpoint() {
    for input in [mk_input(), creating_input(3), ready_input(5)] {
        let d = desired_control_plane(&input);
        assert_eq!(status(&d)["externalManagedControlPlane"], json!(true));
    }
    let d = desired_control_plane(&ready_input(5));
    assert_eq!(
        status(&d)["endpoint"],
        json!(format!("{}:443", &ENDPOINT[8..]))
    );
    assert!(
        status(&desired_control_plane(&creating_input(3)))
            .get("endpoint")
            .is_none()
    );
}

/// A control plane nobody owns waits, says why, and is not failed by a timeout however long
/// it waits; nothing polls it (the owner's arrival wakes it).
#[test]
fn waiting_for_a_cluster_is_explained_and_never_times_out() {
    let d = desired_control_plane(&with(|i| {
        i.cluster_found = false;
        i.vpc_ready = None;
        i.now = at_min(24 * 60);
    }));
    assert_eq!(d.phase, ControlPlanePhase::Creating);
    assert_eq!(d.recheck_after, None);
    let s = status(&d);
    assert_eq!(failed_reason(s), Value::Null);
    let list = s["conditions"].as_array().unwrap();
    let ready = list.iter().find(|c| c["type"] == "Ready").unwrap();
    assert_eq!(ready["reason"], reason::WAITING_FOR_CLUSTER);
    let paused = list.iter().find(|c| c["type"] == "Paused").unwrap();
    assert_eq!(paused["status"], "False");
}

fn failed_reason(status: &Value) -> Value {
    failure(status, "Failed").0
}

fn failed_message(status: &Value) -> Value {
    failure(status, "Failed").1
}

/// Core mirrors the v1beta1 `Ready` into the Cluster's v1beta1 conditions and summarizes by
/// severity: in `status.deprecated.v1beta1.conditions` a False `Ready` carries one, `Error`
/// for a failure, `Info` while waiting; `status.conditions` are plain `metav1.Condition`s.
#[test]
fn a_false_ready_condition_carries_the_severity_core_summarizes_by() {
    let ready = |input: &ControlPlaneInput| {
        let d = desired_control_plane(input);
        let plain = status(&d)["conditions"].as_array().unwrap().clone();
        assert!(plain.iter().all(|c| c.get("severity").is_none()));
        let list = status(&d)["deprecated"]["v1beta1"]["conditions"]
            .as_array()
            .unwrap()
            .clone();
        list.into_iter().find(|c| c["type"] == "Ready").unwrap()
    };
    assert_eq!(ready(&creating_input(3))["severity"], "Info");
    let failed = with(|i| i.workspace = Some(failed_workspace("Error: quota")));
    assert_eq!(ready(&failed)["severity"], "Error");
    assert!(
        ready(&ready_input(5)).get("severity").is_none(),
        "none while True"
    );
}

#[test]
fn a_paused_workspace_keeps_a_ready_control_plane_ready_and_never_times_out() {
    let outputs = json!({"cluster_endpoint": ENDPOINT, "cluster_name": "demo"});
    let mut sim = Sim::new();
    assert_eq!(sim.step(ready_input(1)).phase, ControlPlanePhase::Ready);
    // Paused long after any timeout: still Ready, nothing to recheck.
    let paused = sim.step(with(|i| {
        i.now = at_min(600);
        i.workspace = Some(paused_workspace(true, outputs.clone()));
        i.endpoint_source = Some(ENDPOINT.into());
    }));
    assert_eq!(paused.phase, ControlPlanePhase::Ready);
    assert_eq!(paused.recheck_after, None);
    assert_eq!(sim.condition("Ready")["reason"], reason::WORKSPACE_PAUSED);

    // Paused before it was ready: waiting, said so, with no deadline.
    let mut sim = Sim::new();
    for now in [1, 600] {
        let d = sim.step(with(|i| {
            i.now = at_min(now);
            i.workspace = Some(paused_workspace(false, json!({})));
        }));
        assert_eq!(d.phase, ControlPlanePhase::Creating, "minute {now}");
        assert_eq!(d.recheck_after, None);
        let creating = sim.condition("Creating");
        assert_eq!(creating["reason"], reason::WORKSPACE_PAUSED);
        assert!(
            creating["message"].as_str().unwrap().contains("paused"),
            "{creating}"
        );
    }
}

#[test]
fn a_broken_module_on_a_ready_control_plane_is_degraded_not_failed() {
    let outputs = json!({"cluster_endpoint": ENDPOINT, "cluster_name": "demo"});
    let mut sim = Sim::new();
    assert_eq!(sim.step(ready_input(1)).phase, ControlPlanePhase::Ready);
    // An upgrade whose module does not plan: still Ready and serving, the message shown, and
    // the new version not claimed.
    let d = sim.step(with(|i| {
        i.now = at_min(2);
        i.generation = Some(2);
        i.version = "1.32".into();
        i.workspace = Some(degraded_workspace(
            "Reference to undeclared local value",
            outputs,
        ));
        i.endpoint_source = Some(ENDPOINT.into());
    }));
    assert_eq!(d.phase, ControlPlanePhase::Ready);
    assert!(d.endpoint.is_some());
    let ready = sim.condition("Ready");
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("True"), &json!(reason::WORKSPACE_DEGRADED))
    );
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("Reference to undeclared local value"),
        "{ready}"
    );
    assert_eq!(sim.condition("Failed")["status"], "False");
    assert_eq!(sim.live["status"]["version"], "1.31", "not applied");
    assert!(
        sim.live["status"]["workspaceTemplateStatus"]["lastFailureMessage"]
            .as_str()
            .unwrap()
            .starts_with("observe failed"),
    );
}

/// The v1beta2 contract: `initialization.controlPlaneInitialized` beside the deprecated
/// `ready`/`initialized`, all sticky; `Available` (which core mirrors into the Cluster's
/// `ControlPlaneAvailable`) says whether it serves now and goes False on a failure.
#[test]
fn initialized_is_sticky_and_available_follows_the_control_plane() {
    let available = |s: &Value| {
        s["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Available")
            .cloned()
            .unwrap()
    };
    let creating = desired_control_plane(&creating_input(3));
    let s = status(&creating);
    assert_eq!(
        s["initialization"],
        json!({"controlPlaneInitialized": false})
    );
    assert_eq!(available(s)["status"], "False");
    let ready = desired_control_plane(&ready_input(5));
    let s = status(&ready);
    assert_eq!(
        s["initialization"],
        json!({"controlPlaneInitialized": true})
    );
    assert_eq!(available(s)["status"], "True");
    assert_eq!(available(s)["reason"], reason::CONTROL_PLANE_READY);
    let existing: CAPTControlPlaneStatus = serde_json::from_value(s.clone()).unwrap();
    let failed = desired_control_plane(&with(|i| {
        i.existing = Some(existing.clone());
        i.workspace = Some(failed_workspace("Error: quota"));
    }));
    let s = status(&failed);
    assert_eq!(
        s["initialization"],
        json!({"controlPlaneInitialized": true}),
        "sticky"
    );
    assert_eq!(
        (s["ready"].clone(), s["initialized"].clone()),
        (json!(true), json!(true))
    );
    assert_eq!(available(s)["status"], "False");
    assert_eq!(available(s)["reason"], reason::WORKSPACE_FAILED);
}

/// provider-terraform keeps `Ready=True Available` through an update and
/// writes no observedGeneration, so a Ready Workspace proves nothing about the new spec. The
/// version follows the proof: the Workspace rendered from the apply's current generation, and
/// its module's `capt_revision` output equal to the revision rendered into it.
#[test]
fn an_upgrade_completes_only_when_the_workspace_proves_the_new_revision_applied() {
    use crate::status::workspace::testing::rendered;
    let outputs = |applied: &str| json!({"cluster_endpoint": ENDPOINT, "cluster_name": "demo", "capt_revision": applied});
    let step = |sim: &mut Sim, now, version: &str, apply_gen, ws: WorkspaceObservation| {
        sim.step(with(|i| {
            i.now = at_min(now);
            i.version = version.into();
            i.apply_generation = Some(apply_gen);
            i.workspace = Some(ws);
            i.endpoint_source = Some(ENDPOINT.into());
        }))
    };
    let mut sim = Sim::new();
    let d = step(
        &mut sim,
        2,
        "1.31",
        1,
        rendered(ready_workspace(outputs("r1")), 1, "r1"),
    );
    assert_eq!(d.phase, ControlPlanePhase::Ready);
    assert_eq!(sim.live["status"]["version"], "1.31", "proven: r1 applied");
    assert_eq!(
        sim.condition("Ready")["reason"],
        reason::CONTROL_PLANE_READY
    );

    // The spec says 1.32; the apply is at generation 2, and every Workspace below stays
    // Ready=True Available, as both providers keep it through an update.
    let in_progress = [
        (
            "not rendered from generation 2 yet",
            1,
            "r1",
            "r1",
            "generation 1",
        ),
        ("rendered, not applied yet", 2, "r2", "r1", "revision r2"),
    ];
    for (name, generation, wanted, applied, says) in in_progress {
        let ws = rendered(ready_workspace(outputs(applied)), generation, wanted);
        let d = step(&mut sim, 3, "1.32", 2, ws);
        assert_eq!(d.phase, ControlPlanePhase::Ready, "{name}: still serving");
        assert!(d.endpoint.is_some(), "{name}");
        assert_eq!(sim.live["status"]["version"], "1.31", "{name}: not proven");
        let ready = sim.condition("Ready");
        assert_eq!(ready["status"], "True", "{name}");
        assert_eq!(ready["reason"], reason::WORKSPACE_UPDATING, "{name}");
        assert!(
            ready["message"].as_str().unwrap().contains(says),
            "{name}: {ready}"
        );
        assert_eq!(sim.condition("Failed")["status"], "False", "{name}");
    }

    let d = step(
        &mut sim,
        4,
        "1.32",
        2,
        rendered(ready_workspace(outputs("r2")), 2, "r2"),
    );
    assert_eq!(d.phase, ControlPlanePhase::Ready);
    assert_eq!(sim.live["status"]["version"], "1.32", "proven: r2 applied");
    assert_eq!(
        sim.condition("Ready")["reason"],
        reason::CONTROL_PLANE_READY
    );
}

/// A control plane never ready before waits for the proof (with its timeout), and a module
/// that carries no revision (remote) is taken at its `Ready`, as before.
#[test]
fn a_first_apply_waits_for_the_proof_and_a_module_without_one_goes_by_ready() {
    use crate::status::workspace::testing::rendered;
    let ws = rendered(ready_ws(), 1, "r1");
    let d = desired_control_plane(&with(|i| {
        i.apply_generation = Some(1);
        i.workspace = Some(ws);
        i.endpoint_source = Some(ENDPOINT.into());
    }));
    assert_eq!(d.phase, ControlPlanePhase::Creating);
    assert!(status(&d).get("version").is_none());
    assert!(d.recheck_after.is_some(), "the wait has its timeout");

    let mut remote = ready_ws();
    remote.rendered_generation = Some(1);
    let d = desired_control_plane(&with(|i| {
        i.apply_generation = Some(1);
        i.workspace = Some(remote);
        i.endpoint_source = Some(ENDPOINT.into());
    }));
    assert_eq!(d.phase, ControlPlanePhase::Ready);
    assert_eq!(status(&d)["version"], "1.31");
}

/// A provider that crashed mid-apply leaves `crossplane.io/external-create-pending`; it then
/// waits for a person (`Synced=False "cannot determine creation result …"`). The control plane
/// fails with a reason of its own and what to do, untimed: no silent hang, no timeout either.
#[test]
fn a_workspace_stuck_after_a_crash_fails_the_control_plane_with_what_to_do() {
    let stuck = crate::status::workspace::testing::mk_workspace(
        Some((
            "False",
            "ReconcileError",
            "cannot determine creation result - remove the crossplane.io/external-create-pending \
             annotation if it is safe to proceed",
        )),
        Some(("False", "Creating", "")),
        None,
    );
    let d = desired_control_plane(&with(|i| i.workspace = Some(stuck)));
    assert_eq!(d.phase, ControlPlanePhase::Failed);
    assert_eq!(d.recheck_after, None);
    let conditions = status(&d)["conditions"].as_array().unwrap();
    let failed = conditions.iter().find(|c| c["type"] == "Failed").unwrap();
    assert_eq!(failed["status"], "True");
    assert_eq!(failed["reason"], reason::WORKSPACE_NEEDS_OPERATOR);
    assert!(
        failed["message"]
            .as_str()
            .unwrap()
            .contains("crossplane.io/external-create-pending-"),
        "{failed}"
    );
}
