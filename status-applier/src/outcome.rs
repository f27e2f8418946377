//! What became of an intent or an apply: the answer of the intent API, the `last` of each
//! desired document, and the vocabulary shared by logs and metrics.

use crate::conflict::Conflict;
use crate::intent::{DesiredKey, Subresource};
use crate::metrics::Action;
use serde::Serialize;

/// What became of an intent or an apply.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// `kind/namespace/name`.
    pub subject: String,
    /// The field manager.
    pub field_manager: String,
    /// The subresource.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subresource: Option<Subresource>,
    /// What happened.
    pub action: Action,
    /// Why, for anything but applied and unchanged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The object's resourceVersion after the apply (or the one checked, when unchanged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Paths another owner wants with other values; left out of the apply.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<Conflict>,
    /// Protected paths the intent tried to remove; they keep their value.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<String>,
}

impl Outcome {
    /// An outcome of `action` for `key`.
    pub fn new(key: &DesiredKey, action: Action) -> Self {
        Self {
            subject: key.object.to_string(),
            field_manager: key.field_manager.clone(),
            subresource: key.subresource,
            action,
            message: None,
            resource_version: None,
            conflicts: Vec::new(),
            kept: Vec::new(),
        }
    }

    /// The same outcome with a message.
    #[must_use]
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }
}
