//! `metav1.Condition` helpers: find a condition by type, and build one whose
//! `lastTransitionTime` carries over from the existing condition of the same type unless its
//! status changes.
//!
//! Times are whole seconds (the API server keeps no more), so a condition built now and the
//! same condition read back from the object compare equal.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::Value;

/// The status of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`.
    Unknown,
}

impl Status {
    /// The status of `c` (`Unknown` for anything but `True` and `False`).
    pub fn of(c: &Condition) -> Self {
        match c.status.as_str() {
            "True" => Status::True,
            "False" => Status::False,
            _ => Status::Unknown,
        }
    }

    /// The API spelling: `True`, `False` or `Unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

/// The condition of type `type_` in `list`, if any.
pub fn find<'a>(list: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    list.iter().find(|c| c.type_ == type_)
}

/// True when `list` holds a condition of type `type_` with status `True`.
pub fn is_true(list: &[Condition], type_: &str) -> bool {
    find(list, type_).is_some_and(|c| c.status == Status::True.as_str())
}

/// When the condition of type `type_` last turned to `status`, if it has that status now.
pub fn since(list: &[Condition], type_: &str, status: Status) -> Option<Timestamp> {
    find(list, type_)
        .filter(|c| c.status == status.as_str())
        .map(|c| c.last_transition_time.0)
}

/// `ts` without its sub-second part.
pub fn whole_seconds(ts: Timestamp) -> Timestamp {
    Timestamp::from_second(ts.as_second()).unwrap_or(ts)
}

/// Builds conditions for one object, carrying transition times over from its existing ones.
#[derive(Clone, Copy, Debug)]
pub struct ConditionBuilder<'a> {
    existing: &'a [Condition],
    generation: Option<i64>,
    now: Timestamp,
}

impl<'a> ConditionBuilder<'a> {
    /// A builder over the object's current conditions, its generation and the injected `now`.
    #[must_use]
    pub fn new(existing: &'a [Condition], generation: Option<i64>, now: Timestamp) -> Self {
        Self {
            existing,
            generation,
            now: whole_seconds(now),
        }
    }

    /// A condition of type `type_`. Its `lastTransitionTime` is the existing condition's when
    /// that one has the same status, `now` otherwise.
    pub fn build(&self, type_: &str, status: Status, reason: &str, message: &str) -> Condition {
        self.build_at(type_, status, reason, message, self.now)
    }

    /// Like [`Self::build`], but a transition is dated `at` instead of `now` (a wait that
    /// started when the object was created, say).
    pub fn build_at(
        &self,
        type_: &str,
        status: Status,
        reason: &str,
        message: &str,
        at: Timestamp,
    ) -> Condition {
        let at = whole_seconds(at);
        let last_transition_time = since(self.existing, type_, status).unwrap_or(at);
        Condition {
            type_: type_.into(),
            status: status.as_str().into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(last_transition_time),
            observed_generation: self.generation,
        }
    }
}

/// The JSON of a condition list, in the order given: plain `metav1.Condition`s, as the
/// v1beta2 contract reads `status.conditions`.
pub fn to_json(conditions: &[Condition]) -> Value {
    // A `Condition` always serializes: its only fallible part is a time format.
    Value::Array(
        conditions
            .iter()
            .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
            .collect(),
    )
}

/// The v1beta1 contract's readiness condition, which core mirrors into the Cluster's v1beta1
/// conditions (`InfrastructureReady`, `ControlPlaneReady`).
pub const V1BETA1_READY: &str = "Ready";

/// `status.deprecated`: the `Ready` condition of `list` as the v1beta1 contract has it (with
/// a `severity` while False), where the v1beta2 contract moved the old conditions
/// (`status.deprecated.v1beta1.conditions`). Core reads it there before `status.conditions`
/// for the Cluster's v1beta1 view; `None` when `list` has no `Ready`.
pub fn deprecated_v1beta1(list: &[Condition]) -> Option<Value> {
    let ready = find(list, V1BETA1_READY)?;
    let conditions = Value::Array(vec![v1beta1_condition_json(ready)]);
    Some(serde_json::json!({ "v1beta1": { "conditions": conditions } }))
}

/// Reasons both CAPT kinds use: of their Workspace's state, and of waiting. Each kind's own
/// `reason` module re-exports them beside its own.
pub mod reason {
    /// The Workspace reported `Synced=False` with `ReconcileError`.
    pub const WORKSPACE_FAILED: &str = "WorkspaceFailed";
    /// The Workspace does not exist yet (or could not be read).
    pub const WAITING_FOR_WORKSPACE: &str = "WaitingForWorkspace";
    /// The Workspace exists and is not ready yet.
    pub const WORKSPACE_CREATING: &str = "WorkspaceCreating";
    /// The Workspace is being deleted.
    pub const WORKSPACE_DELETING: &str = "WorkspaceDeleting";
    /// The Workspace stays ready, but its provider cannot observe it (`observe failed: …`,
    /// e.g. a broken module's plan): ready, with the provider's message.
    pub const WORKSPACE_DEGRADED: &str = "WorkspaceDegraded";
    /// The Workspace is paused (`crossplane.io/paused`) and not ready: nothing happens until
    /// someone removes the annotation, so the wait has no timeout.
    pub const WORKSPACE_PAUSED: &str = "WorkspacePaused";
    /// The Workspace is ready, but does not yet prove that the configuration last rendered
    /// into it was applied (its `capt_revision` output differs): an update in progress.
    pub const WORKSPACE_UPDATING: &str = "WorkspaceUpdating";
    /// The Workspace's provider stopped mid-apply and waits for a person
    /// (`crossplane.io/external-create-pending`): a failure that says what to do.
    pub const WORKSPACE_NEEDS_OPERATOR: &str = "WorkspaceNeedsOperator";
    /// The VPC was not ready within its timeout.
    pub const VPC_READY_TIMEOUT: &str = "VPCReadyTimeout";
    /// No Cluster owns the object yet; nothing is built before one does.
    pub const WAITING_FOR_CLUSTER: &str = "WaitingForCluster";
    /// The control plane was not ready within `controlPlaneTimeout`.
    pub const CONTROL_PLANE_TIMEOUT: &str = "ControlPlaneTimeout";
    /// The Workspace is ready but its `cluster_endpoint` does not parse.
    pub const INVALID_ENDPOINT: &str = "InvalidEndpoint";
    /// A timeout in the spec does not parse.
    pub const INVALID_TIMEOUT: &str = "InvalidTimeout";
    /// The object is being deleted (the summary conditions `Ready` and `Available` during
    /// deletion; the `Deleting` condition says which step).
    pub const DELETING: &str = "Deleting";
}

/// The reasons of a failure (in any manager's conditions): a False condition with one of them
/// is of severity `Error`.
pub const FAILURE_REASONS: [&str; 6] = [
    reason::WORKSPACE_FAILED,
    reason::WORKSPACE_NEEDS_OPERATOR,
    reason::CONTROL_PLANE_TIMEOUT,
    reason::VPC_READY_TIMEOUT,
    reason::INVALID_ENDPOINT,
    reason::INVALID_TIMEOUT,
];

/// The Cluster API v1beta1 severity of a condition: set only while it is False (`Error` for a
/// failure, `Info` otherwise). Core summarizes the Cluster's v1beta1 `Ready` from the mirrored
/// `Ready` conditions by severity; without one, a False `Ready` would not hold it back.
pub fn severity(c: &Condition) -> Option<&'static str> {
    (c.status == Status::False.as_str()).then(|| {
        match FAILURE_REASONS.contains(&c.reason.as_str()) {
            true => "Error",
            false => "Info",
        }
    })
}

fn v1beta1_condition_json(c: &Condition) -> Value {
    // A `Condition` always serializes: its only fallible part is a time format.
    let mut json = serde_json::to_value(c).unwrap_or(Value::Null);
    if let (Some(severity), Value::Object(fields)) = (severity(c), &mut json) {
        fields.insert("severity".into(), severity.into());
    }
    json
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn mk_condition(type_: &str, status: &str, at: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "Old".into(),
            message: "old".into(),
            last_transition_time: Time(ts(at)),
            observed_generation: Some(1),
        }
    }

    #[test]
    fn find_returns_the_condition_of_that_type() {
        let list = vec![
            mk_condition("Ready", "True", "2024-01-01T00:00:00Z"),
            mk_condition("Failed", "False", "2024-01-01T00:00:00Z"),
        ];
        assert_eq!(find(&list, "Failed").unwrap().status, "False");
        assert!(find(&list, "Creating").is_none());
        assert!(is_true(&list, "Ready"));
        assert!(!is_true(&list, "Failed"));
    }

    #[test]
    fn transition_time_carries_over_when_the_status_is_unchanged() {
        let list = vec![mk_condition("Ready", "True", "2024-01-01T00:00:00Z")];
        let b = ConditionBuilder::new(&list, Some(2), ts("2024-06-01T12:00:00Z"));
        let c = b.build("Ready", Status::True, "NewReason", "new message");
        assert_eq!(c.last_transition_time.0, ts("2024-01-01T00:00:00Z"));
        assert_eq!(
            (c.reason.as_str(), c.message.as_str()),
            ("NewReason", "new message")
        );
        assert_eq!(c.observed_generation, Some(2));
    }

    #[test]
    fn transition_time_is_now_when_the_status_changes_or_the_condition_is_new() {
        let list = vec![mk_condition("Ready", "True", "2024-01-01T00:00:00Z")];
        let b = ConditionBuilder::new(&list, Some(2), ts("2024-06-01T12:00:00.750Z"));
        let flipped = b.build("Ready", Status::False, "R", "m");
        assert_eq!(flipped.last_transition_time.0, ts("2024-06-01T12:00:00Z"));
        let new = b.build("Failed", Status::False, "R", "m");
        assert_eq!(new.last_transition_time.0, ts("2024-06-01T12:00:00Z"));
    }

    #[test]
    fn a_transition_can_be_dated_earlier_than_now() {
        let b = ConditionBuilder::new(&[], None, ts("2024-06-01T12:00:00Z"));
        let c = b.build_at(
            "Creating",
            Status::True,
            "R",
            "",
            ts("2024-06-01T11:00:00Z"),
        );
        assert_eq!(c.last_transition_time.0, ts("2024-06-01T11:00:00Z"));
        assert_eq!(c.observed_generation, None);
    }

    #[test]
    fn since_reports_the_transition_time_only_for_the_given_status() {
        let list = vec![mk_condition("Creating", "True", "2024-01-01T00:00:00Z")];
        assert_eq!(
            since(&list, "Creating", Status::True),
            Some(ts("2024-01-01T00:00:00Z"))
        );
        assert_eq!(since(&list, "Creating", Status::False), None);
    }

    #[test]
    fn the_deprecated_v1beta1_ready_carries_a_severity_while_false() {
        let b = ConditionBuilder::new(&[], Some(3), ts("2024-06-01T12:00:00Z"));
        let list = [
            b.build("Ready", Status::False, reason::WORKSPACE_FAILED, "boom"),
            b.build("Paused", Status::False, "NotPaused", ""),
        ];
        let deprecated = deprecated_v1beta1(&list).unwrap();
        let v1beta1 = deprecated["v1beta1"]["conditions"].as_array().unwrap();
        assert_eq!(v1beta1.len(), 1, "only Ready: {deprecated}");
        assert_eq!(v1beta1[0]["severity"], "Error");
        assert!(to_json(&list)[0].get("severity").is_none(), "plain metav1");
        let waiting = [b.build("Ready", Status::False, reason::WORKSPACE_CREATING, "")];
        let deprecated = deprecated_v1beta1(&waiting).unwrap();
        assert_eq!(deprecated["v1beta1"]["conditions"][0]["severity"], "Info");
        let ready = [b.build("Ready", Status::True, "VPCReady", "")];
        let deprecated = deprecated_v1beta1(&ready).unwrap();
        assert!(
            deprecated["v1beta1"]["conditions"][0]
                .get("severity")
                .is_none()
        );
        assert_eq!(deprecated_v1beta1(&list[1..]), None);
    }

    #[test]
    fn conditions_serialize_as_metav1_conditions() {
        let b = ConditionBuilder::new(&[], Some(3), ts("2024-06-01T12:00:00Z"));
        let json = to_json(&[b.build("Ready", Status::Unknown, "Waiting", "")]);
        assert_eq!(
            json,
            json!([{
                "type": "Ready", "status": "Unknown", "reason": "Waiting", "message": "",
                "lastTransitionTime": "2024-06-01T12:00:00Z", "observedGeneration": 3
            }])
        );
    }
}
