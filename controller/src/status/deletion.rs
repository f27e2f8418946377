//! The deletion planner: children first, then the finalizer, with progress and a stuck
//! deletion visible in conditions.
//!
//! Order (seed 003): a CAPTControlPlane releases the Cluster's endpoint, deletes its
//! WorkspaceTemplateApply and waits until the Workspace is gone; a CAPTCluster waits until its
//! CAPTControlPlane is gone, then deletes its VPC WorkspaceTemplateApply (unless
//! `retainVpcOnDelete`) and waits until the Workspace is gone. Only then is the finalizer
//! removed. Each call answers with the one next step; the caller acts and reconciles again.

use super::conditions::{self, ConditionBuilder, Status};
use super::duration::format_duration;
use super::wait::{Deadline, recheck_after};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::{Value, json};
use std::time::Duration;

/// Condition types the deletion planner sets.
pub const DELETION_CONDITION_TYPES: [&str; 2] = ["Deleting", "DeletionFailed"];

/// The summary conditions a deletion turns False (reason `Deleting`), of whichever kind has
/// them: the v1beta2 contract's `Ready` (CAPTCluster) and `Available` (CAPTControlPlane)
/// cover the whole life of the object, and a control plane being torn down is not `Ready`.
pub const SUMMARY_CONDITION_TYPES: [&str; 2] = ["Ready", "Available"];

/// How long a deletion may wait at one point before it is reported stuck, unless configured.
pub const DEFAULT_STUCK_AFTER: Duration = Duration::from_secs(15 * 60);

/// What exists while an object is being deleted. Facts that do not apply to a kind are
/// `false` (a CAPTControlPlane has no control plane to wait for; a CAPTCluster owns no
/// endpoint).
#[derive(Clone, Debug, PartialEq)]
pub struct DeletionFacts {
    /// The Cluster's `spec.controlPlaneEndpoint` is still owned by `capt-cluster`.
    pub endpoint_owned: bool,
    /// The CAPTControlPlane of this CAPTCluster's Cluster still exists.
    pub control_plane_present: bool,
    /// The WorkspaceTemplateApply exists.
    pub apply_present: bool,
    /// The WorkspaceTemplateApply has a deletion timestamp.
    pub apply_deleting: bool,
    /// The Workspace exists (deleting or not).
    pub workspace_present: bool,
    /// The Workspace's `Synced=False` message while it exists (provider-terraform's `delete
    /// failed: …` when its destroy fails): shown while the deletion waits for it.
    pub workspace_problem: Option<String>,
    /// `spec.retainVpcOnDelete`: the apply and its Workspace are left in place.
    pub retain: bool,
    /// `metadata.deletionTimestamp` of the object being deleted.
    pub started: Timestamp,
    /// The injected current time.
    pub now: Timestamp,
    /// How long the deletion may take before it is reported stuck.
    pub stuck_after: Duration,
}

/// The next thing the caller must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeletionStep {
    /// Publish the Cluster endpoint release (`{"spec": {"controlPlaneEndpoint": null}}` with
    /// `release: ["spec.controlPlaneEndpoint"]`) and wait until the manager no longer owns it.
    ReleaseEndpoint,
    /// Wait until the CAPTControlPlane is gone.
    WaitForControlPlane,
    /// Delete the WorkspaceTemplateApply.
    DeleteApply,
    /// Wait until the (deleting) WorkspaceTemplateApply is gone.
    WaitForApplyGone,
    /// Wait until the Workspace is gone.
    WaitForWorkspaceGone,
    /// Remove the finalizer: nothing is left.
    RemoveFinalizer,
}

impl DeletionStep {
    /// CamelCase name, used as the `Deleting` condition's reason.
    pub fn as_str(self) -> &'static str {
        match self {
            DeletionStep::ReleaseEndpoint => "ReleasingEndpoint",
            DeletionStep::WaitForControlPlane => "WaitingForControlPlane",
            DeletionStep::DeleteApply => "DeletingWorkspaceTemplateApply",
            DeletionStep::WaitForApplyGone => "WaitingForWorkspaceTemplateApply",
            DeletionStep::WaitForWorkspaceGone => "WaitingForWorkspace",
            DeletionStep::RemoveFinalizer => "RemovingFinalizer",
        }
    }

    fn progress(self) -> &'static str {
        match self {
            DeletionStep::ReleaseEndpoint => "releasing the Cluster's control plane endpoint",
            DeletionStep::WaitForControlPlane => "waiting for the CAPTControlPlane to be deleted",
            DeletionStep::DeleteApply => "deleting the WorkspaceTemplateApply",
            DeletionStep::WaitForApplyGone => {
                "waiting for the WorkspaceTemplateApply to be deleted"
            }
            DeletionStep::WaitForWorkspaceGone => "waiting for the Workspace to be deleted",
            DeletionStep::RemoveFinalizer => "removing the finalizer",
        }
    }

    fn stuck_reason(self) -> &'static str {
        match self {
            DeletionStep::ReleaseEndpoint => "EndpointReleaseStuck",
            DeletionStep::WaitForControlPlane => "ControlPlaneDeletionStuck",
            DeletionStep::DeleteApply | DeletionStep::WaitForApplyGone => {
                "WorkspaceTemplateApplyDeletionStuck"
            }
            DeletionStep::WaitForWorkspaceGone => "WorkspaceDeletionStuck",
            DeletionStep::RemoveFinalizer => "FinalizerRemovalStuck",
        }
    }
}

/// The next step and the conditions that show it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeletionPlan {
    /// What to do now.
    pub step: DeletionStep,
    /// True when the deletion has lasted longer than `stuck_after` and is not finishing.
    pub stuck: bool,
    /// `Deleting` (True, reason = the step) and `DeletionFailed` (True when stuck).
    pub conditions: Vec<Condition>,
    /// The [`SUMMARY_CONDITION_TYPES`], False with reason `Deleting` and the step's progress.
    pub summaries: Vec<Condition>,
    /// Reconcile again after this long to notice the deletion getting stuck.
    pub recheck_after: Option<Duration>,
}

/// The next deletion step from what exists, children first.
pub fn next_step(facts: &DeletionFacts) -> DeletionStep {
    let owns_children = !facts.retain;
    if facts.endpoint_owned {
        DeletionStep::ReleaseEndpoint
    } else if facts.control_plane_present {
        DeletionStep::WaitForControlPlane
    } else if owns_children && facts.apply_present && !facts.apply_deleting {
        DeletionStep::DeleteApply
    } else if owns_children && facts.workspace_present {
        DeletionStep::WaitForWorkspaceGone
    } else if owns_children && facts.apply_present {
        DeletionStep::WaitForApplyGone
    } else {
        DeletionStep::RemoveFinalizer
    }
}

/// Plans the next step and the conditions to publish. `existing` are the object's current
/// conditions (for transition times), `generation` its `metadata.generation`.
pub fn plan_deletion(
    facts: &DeletionFacts,
    existing: &[Condition],
    generation: Option<i64>,
) -> DeletionPlan {
    let step = next_step(facts);
    let deadline = Deadline::new(facts.started, facts.stuck_after);
    let finishing = step == DeletionStep::RemoveFinalizer;
    let stuck = !finishing && deadline.expired(facts.now);
    let b = ConditionBuilder::new(existing, generation, facts.now);
    let progress = step.progress();
    // Why the Workspace does not go, when its provider says: the user's next step.
    let shown = match (step, &facts.workspace_problem) {
        (DeletionStep::WaitForWorkspaceGone, Some(problem)) => {
            format!("{progress}; the Workspace reports: {problem}")
        }
        _ => progress.to_owned(),
    };
    let deleting = b.build_at(
        "Deleting",
        Status::True,
        step.as_str(),
        &shown,
        facts.started,
    );
    let failed = if stuck {
        let message = format!(
            "deletion started at {} is still {progress} after more than {}",
            conditions::whole_seconds(facts.started),
            format_duration(facts.stuck_after)
        );
        let at = deadline.at().unwrap_or(facts.now);
        b.build_at(
            "DeletionFailed",
            Status::True,
            step.stuck_reason(),
            &message,
            at,
        )
    } else {
        b.build("DeletionFailed", Status::False, "DeletionProgressing", "")
    };
    let waiting = !finishing && !stuck;
    let summaries = SUMMARY_CONDITION_TYPES
        .iter()
        .map(|t| b.build(t, Status::False, conditions::reason::DELETING, &shown))
        .collect();
    DeletionPlan {
        step,
        stuck,
        conditions: vec![deleting, failed],
        summaries,
        recheck_after: recheck_after(waiting.then(|| deadline.remaining(facts.now))),
    }
}

/// The status fragment to publish while deleting: the manager's other conditions as they are
/// now (`own_types`, e.g. `CONTROL_PLANE_CONDITION_TYPES`, copied verbatim from `existing`),
/// then the deletion conditions. A merge patch replaces the list whole, so leaving the other
/// conditions out would delete them.
pub fn deletion_status_fragment(
    existing: &[Condition],
    own_types: &[&str],
    plan: &DeletionPlan,
) -> Value {
    let mut list: Vec<Condition> = own_types
        .iter()
        .filter(|t| !DELETION_CONDITION_TYPES.contains(t))
        .filter_map(|t| match conditions::find(&plan.summaries, t) {
            Some(summary) => Some(summary.clone()),
            None => conditions::find(existing, t).cloned(),
        })
        .collect();
    list.extend(plan.conditions.iter().cloned());
    let mut status = json!({ "conditions": conditions::to_json(&list) });
    if let Some(deprecated) = conditions::deprecated_v1beta1(&list) {
        status["deprecated"] = deprecated;
    }
    json!({ "status": status })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::control_plane::CONTROL_PLANE_CONDITION_TYPES;
    use crate::status::testing::{T0, at_min, ts};

    /// A control plane being deleted since T0, nothing left, observed at `now_min`.
    fn mk_facts(now_min: i64) -> DeletionFacts {
        DeletionFacts {
            endpoint_owned: false,
            control_plane_present: false,
            apply_present: false,
            apply_deleting: false,
            workspace_present: false,
            workspace_problem: None,
            retain: false,
            started: ts(T0),
            now: at_min(now_min),
            stuck_after: DEFAULT_STUCK_AFTER,
        }
    }

    fn with(f: impl FnOnce(&mut DeletionFacts)) -> DeletionFacts {
        let mut facts = mk_facts(1);
        f(&mut facts);
        facts
    }

    #[test]
    fn control_plane_deletion_runs_endpoint_then_apply_then_workspace_then_finalizer() {
        let cases = [
            (
                "endpoint still owned, everything present",
                with(|f| {
                    f.endpoint_owned = true;
                    f.apply_present = true;
                    f.workspace_present = true;
                }),
                DeletionStep::ReleaseEndpoint,
            ),
            (
                "endpoint released, apply present",
                with(|f| {
                    f.apply_present = true;
                    f.workspace_present = true;
                }),
                DeletionStep::DeleteApply,
            ),
            (
                "apply deleting, workspace present",
                with(|f| {
                    f.apply_present = true;
                    f.apply_deleting = true;
                    f.workspace_present = true;
                }),
                DeletionStep::WaitForWorkspaceGone,
            ),
            (
                "apply gone, workspace still present",
                with(|f| f.workspace_present = true),
                DeletionStep::WaitForWorkspaceGone,
            ),
            (
                "workspace gone, apply still finalizing",
                with(|f| {
                    f.apply_present = true;
                    f.apply_deleting = true;
                }),
                DeletionStep::WaitForApplyGone,
            ),
            ("nothing left", mk_facts(1), DeletionStep::RemoveFinalizer),
        ];
        for (name, facts, step) in cases {
            assert_eq!(next_step(&facts), step, "{name}");
        }
    }

    #[test]
    fn capt_cluster_deletion_waits_for_the_control_plane_first() {
        let facts = with(|f| {
            f.control_plane_present = true;
            f.apply_present = true;
            f.workspace_present = true;
        });
        assert_eq!(next_step(&facts), DeletionStep::WaitForControlPlane);
        let facts = with(|f| {
            f.apply_present = true;
            f.workspace_present = true;
        });
        assert_eq!(next_step(&facts), DeletionStep::DeleteApply);
    }

    #[test]
    fn retain_vpc_on_delete_leaves_the_apply_and_workspace_in_place() {
        let retained = with(|f| {
            f.retain = true;
            f.apply_present = true;
            f.workspace_present = true;
        });
        assert_eq!(next_step(&retained), DeletionStep::RemoveFinalizer);
        let waiting = with(|f| {
            f.retain = true;
            f.control_plane_present = true;
            f.apply_present = true;
        });
        assert_eq!(next_step(&waiting), DeletionStep::WaitForControlPlane);
    }

    #[test]
    fn progress_is_visible_in_the_deleting_condition() {
        let plan = plan_deletion(&with(|f| f.workspace_present = true), &[], Some(3));
        assert!(!plan.stuck);
        let deleting = &plan.conditions[0];
        assert_eq!(
            (deleting.type_.as_str(), deleting.status.as_str()),
            ("Deleting", "True")
        );
        assert_eq!(deleting.reason, "WaitingForWorkspace");
        assert_eq!(deleting.message, "waiting for the Workspace to be deleted");
        assert_eq!(deleting.last_transition_time.0, ts(T0));
        assert_eq!(plan.conditions[1].status, "False");
        assert_eq!(plan.recheck_after, Some(Duration::from_secs(14 * 60)));
    }

    #[test]
    fn a_failing_destroy_is_shown_while_waiting_for_the_workspace() {
        let problem = "delete failed: cannot destroy Terraform configuration: exit status 1";
        let plan = plan_deletion(
            &with(|f| {
                f.workspace_present = true;
                f.workspace_problem = Some(problem.into());
            }),
            &[],
            Some(3),
        );
        let deleting = &plan.conditions[0];
        assert_eq!(deleting.reason, "WaitingForWorkspace");
        assert_eq!(
            deleting.message,
            format!("waiting for the Workspace to be deleted; the Workspace reports: {problem}")
        );
    }

    #[test]
    fn a_stuck_deletion_is_reported_not_hidden() {
        let mut facts = with(|f| f.workspace_present = true);
        facts.now = at_min(16);
        let plan = plan_deletion(&facts, &[], Some(3));
        assert!(plan.stuck);
        let failed = &plan.conditions[1];
        assert_eq!(
            (failed.type_.as_str(), failed.status.as_str()),
            ("DeletionFailed", "True")
        );
        assert_eq!(failed.reason, "WorkspaceDeletionStuck");
        assert_eq!(
            failed.message,
            "deletion started at 2024-01-01T00:00:00Z is still waiting for the Workspace to be deleted after more than 15m"
        );
        assert_eq!(failed.last_transition_time.0, at_min(15));
        assert_eq!(plan.recheck_after, None);
        assert_eq!(plan_deletion(&facts, &[], Some(3)), plan, "deterministic");
    }

    #[test]
    fn removing_the_finalizer_is_never_stuck() {
        let plan = plan_deletion(&mk_facts(600), &[], None);
        assert_eq!(plan.step, DeletionStep::RemoveFinalizer);
        assert!(!plan.stuck);
    }

    #[test]
    fn the_deletion_fragment_turns_the_summaries_false_and_keeps_the_other_conditions() {
        let b = ConditionBuilder::new(&[], Some(1), ts(T0));
        let existing = vec![
            b.build("Available", Status::True, "ControlPlaneReady", "ready"),
            b.build("Creating", Status::False, "ControlPlaneReady", ""),
            b.build("Ready", Status::True, "ControlPlaneReady", "ready"),
            b.build("Deleting", Status::True, "Old", "old"),
            b.build("Foreign", Status::True, "X", ""),
        ];
        let plan = plan_deletion(&with(|f| f.endpoint_owned = true), &existing, Some(1));
        let fragment = deletion_status_fragment(&existing, &CONTROL_PLANE_CONDITION_TYPES, &plan);
        let list = fragment["status"]["conditions"].as_array().unwrap();
        let types: Vec<&str> = list.iter().map(|c| c["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "Available",
                "Ready",
                "Creating",
                "Deleting",
                "DeletionFailed"
            ]
        );
        for summary in &list[..2] {
            assert_eq!(summary["status"], "False", "{summary}");
            assert_eq!(summary["reason"], "Deleting", "{summary}");
            assert_eq!(
                summary["message"],
                "releasing the Cluster's control plane endpoint"
            );
            assert_eq!(summary["lastTransitionTime"], "2024-01-01T00:01:00Z");
        }
        assert_eq!(list[2], serde_json::to_value(&existing[1]).unwrap());
        assert_eq!(list[3]["reason"], "ReleasingEndpoint");
        let v1beta1 = &fragment["status"]["deprecated"]["v1beta1"]["conditions"][0];
        assert_eq!(
            (&v1beta1["type"], &v1beta1["reason"], &v1beta1["severity"]),
            (&json!("Ready"), &json!("Deleting"), &json!("Info"))
        );
    }
}
