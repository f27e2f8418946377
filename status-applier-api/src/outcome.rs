//! What became of an intent or an apply: the answer of the intent API, and the vocabulary
//! shared by the server's logs and metrics.

use crate::intent::Subresource;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What happened to an intent or an apply.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[allow(non_camel_case_types)]
pub enum Action {
    /// Applied: the object changed.
    applied,
    /// Nothing to change: no request was sent.
    unchanged,
    /// Merged into an apply already pending.
    coalesced,
    /// Accepted and kept, not applied when answered: the submitter did not wait, or no
    /// outcome came within the applier's wait timeout (the message says so). The applier
    /// carries on with it; what its apply ends in (applied, a conflict, a rejection) this
    /// answer cannot tell.
    queued,
    /// Another owner disagrees; reported, not forced.
    conflict,
    /// Refused: bad intent, missing object, uid mismatch, or an API refusal.
    rejected,
    /// The API server failed; retried with backoff.
    error,
}

impl Action {
    /// The name of the action, as serialized and as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::applied => "applied",
            Self::unchanged => "unchanged",
            Self::coalesced => "coalesced",
            Self::queued => "queued",
            Self::conflict => "conflict",
            Self::rejected => "rejected",
            Self::error => "error",
        }
    }

    /// The HTTP status the intent API answers an outcome of this action with.
    ///
    /// 409 (a conflict) and 422 (a missing object, an API refusal) still mean delivered:
    /// the applier keeps the document and applies it again when the object changes. 503
    /// (the applier failed) does not.
    pub fn status_code(self) -> u16 {
        match self {
            Self::conflict => 409,
            Self::rejected => 422,
            Self::error => 503,
            Self::applied | Self::unchanged | Self::coalesced | Self::queued => 200,
        }
    }

    /// True for the HTTP statuses whose answer is an outcome the applier kept: the intent
    /// was delivered, whatever became of its apply. Anything else (a bad intent: 400, 403,
    /// 413; an applier failure: 503) was not.
    pub fn is_delivered_status(status: u16) -> bool {
        matches!(status, 200..=299 | 409 | 422)
    }
}

/// A path two owners want with different values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Conflict {
    /// The path, like `.status.conditions[type=Ready].status`.
    pub path: String,
    /// The other owner.
    pub owner: String,
    /// The other owner's operation (`Apply`, `Update`), or `Intent` for one of our managers.
    pub operation: String,
    /// Our value.
    #[serde(default)]
    pub ours: Option<Value>,
    /// Their value.
    #[serde(default)]
    pub theirs: Option<Value>,
}

/// What became of an intent or an apply.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// `kind/namespace/name`.
    pub subject: String,
    /// The field manager.
    pub field_manager: String,
    /// The subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subresource: Option<Subresource>,
    /// What happened.
    pub action: Action,
    /// Why, for anything but applied and unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The object's resourceVersion after the apply (or the one checked, when unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// The object's `metadata.generation` after the apply (or the one checked): a publisher
    /// whose own write made a new generation learns it here before its watch shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Paths another owner wants with other values; left out of the apply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<Conflict>,
    /// Protected paths the intent tried to remove; they keep their value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<String>,
    /// The applier process that answered: an id it made at its start, which `GET
    /// /v1/instance` also tells. A submitter that keeps an intent answered `conflict` or
    /// `rejected` (which the applier holds in memory alone) learns from a new instance that
    /// the applier restarted, and sends it again. Absent from an applier that does not tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
}

impl Outcome {
    /// An outcome of `action` for `subject` (`kind/namespace/name`) under `field_manager`.
    pub fn new(
        subject: impl Into<String>,
        field_manager: impl Into<String>,
        subresource: Option<Subresource>,
        action: Action,
    ) -> Self {
        Self {
            subject: subject.into(),
            field_manager: field_manager.into(),
            subresource,
            action,
            message: None,
            resource_version: None,
            generation: None,
            conflicts: Vec::new(),
            kept: Vec::new(),
            instance: None,
        }
    }

    /// The same outcome with a message.
    #[must_use]
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ALL: [Action; 7] = [
        Action::applied,
        Action::unchanged,
        Action::coalesced,
        Action::queued,
        Action::conflict,
        Action::rejected,
        Action::error,
    ];

    #[test]
    fn actions_serialize_by_their_name() {
        for action in ALL {
            let wire = serde_json::to_value(action).unwrap();
            assert_eq!(wire, json!(action.as_str()));
            assert_eq!(serde_json::from_value::<Action>(wire).unwrap(), action);
        }
    }

    #[test]
    fn every_status_the_server_answers_an_outcome_with_is_delivered_but_errors() {
        for action in ALL.into_iter().filter(|a| *a != Action::error) {
            assert!(
                Action::is_delivered_status(action.status_code()),
                "{action:?}"
            );
        }
        assert!(!Action::is_delivered_status(Action::error.status_code()));
        for refusal in [400, 403, 413, 500, 503] {
            assert!(!Action::is_delivered_status(refusal));
        }
    }

    #[test]
    fn an_outcome_round_trips_and_omits_what_is_empty() {
        let mut outcome = Outcome::new(
            "Widget/default/demo",
            "widget-controller",
            Some(Subresource::Status),
            Action::conflict,
        )
        .with_message("left out");
        outcome.instance = Some("5f0c2a9e1d3b4c87".into());
        outcome.conflicts.push(Conflict {
            path: ".status.phase".into(),
            owner: "kubectl".into(),
            operation: "Update".into(),
            ours: Some(json!("Ready")),
            theirs: Some(json!("Failed")),
        });
        let wire = serde_json::to_value(&outcome).unwrap();
        assert_eq!(
            wire,
            json!({
                "subject": "Widget/default/demo",
                "fieldManager": "widget-controller",
                "subresource": "status",
                "action": "conflict",
                "message": "left out",
                "conflicts": [{"path": ".status.phase", "owner": "kubectl", "operation": "Update",
                               "ours": "Ready", "theirs": "Failed"}],
                "instance": "5f0c2a9e1d3b4c87",
            })
        );
        assert_eq!(serde_json::from_value::<Outcome>(wire).unwrap(), outcome);
    }
}
