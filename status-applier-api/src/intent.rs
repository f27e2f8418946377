//! The intent document: what a field manager wants a part of one object to be
//! (docs/status-applier.md, "The intent"). Parsing and validation against a policy are the
//! server's.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The largest intent body accepted, in bytes.
pub const MAX_INTENT_BYTES: usize = 1 << 20;

/// A field manager's wish for a part of one object (docs/status-applier.md, "The intent").
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Intent {
    /// The object.
    pub target: Target,
    /// `status`, or absent for the main resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subresource: Option<Subresource>,
    /// The field manager the fragment is applied under.
    pub field_manager: String,
    /// Merged into the manager's desired document (RFC 7386: `null` removes a field).
    pub fragment: Value,
    /// Protected paths this intent may remove, e.g. `spec.controlPlaneEndpoint`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub release: Vec<String>,
    /// The newest `resourceVersion` of the object the submitter knows (the one it computed
    /// the fragment from, or the one its own write left): the applier plans the intent on no
    /// older view of the object. An apply planned on an older view would be refused as stale,
    /// since it carries its view's version as a precondition; waiting for the view saves
    /// that refusal and its retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_older_than: Option<String>,
}

/// The object an intent is about.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Target {
    /// `group/version` of the object.
    pub api_version: String,
    /// Kind of the object.
    pub kind: String,
    /// Namespace; absent for cluster-scoped kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the object.
    pub name: String,
    /// When set, the intent applies only to the object with this uid, never to a recreated
    /// object of the same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// The subresource an intent writes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Subresource {
    /// The `status` subresource.
    Status,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_intent_serializes_as_the_design_writes_it() {
        let intent = Intent {
            target: Target {
                api_version: "controlplane.cluster.x-k8s.io/v1beta1".into(),
                kind: "Widget".into(),
                namespace: Some("default".into()),
                name: "demo".into(),
                uid: None,
            },
            subresource: Some(Subresource::Status),
            field_manager: "widget-controller".into(),
            fragment: json!({"status": {"phase": "Ready"}}),
            release: vec![],
            not_older_than: Some("4711".into()),
        };
        let wire = serde_json::to_value(&intent).unwrap();
        assert_eq!(
            wire,
            json!({
                "target": {"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "Widget",
                           "namespace": "default", "name": "demo"},
                "subresource": "status",
                "fieldManager": "widget-controller",
                "fragment": {"status": {"phase": "Ready"}},
                "notOlderThan": "4711",
            })
        );
        assert_eq!(serde_json::from_value::<Intent>(wire).unwrap(), intent);
    }
}
