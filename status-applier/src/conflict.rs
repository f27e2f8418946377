//! Conflicts, found before any request: between two of our own managers (local), and with
//! foreign managers as recorded in the live object's `managedFields` (predicted). The 409 of
//! the API server confirms what prediction missed.

use crate::document::{claimed_fields, same_content, value_at};
use crate::fieldsv1::{FieldSet, PathElement, path_to_string};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde::Serialize;
use serde_json::Value;

/// One `managedFields` entry, decoded.
#[derive(Clone, Debug)]
pub struct Owner {
    /// Field manager name.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// `status`, or empty for the main resource.
    pub subresource: String,
    /// When the entry last changed (RFC 3339), if recorded.
    pub time: Option<String>,
    /// The fields it owns.
    pub fields: FieldSet,
}

impl Owner {
    /// True for the entry a server-side apply by `manager` on `subresource` writes.
    pub fn is_apply_of(&self, manager: &str, subresource: &str) -> bool {
        self.manager == manager && self.operation == "Apply" && self.subresource == subresource
    }
}

/// Decodes the entries of `managedFields`; an entry that cannot be decoded is returned as an
/// error message naming its manager, and left out.
pub fn owners(entries: &[ManagedFieldsEntry]) -> (Vec<Owner>, Vec<String>) {
    let mut owners = Vec::new();
    let mut errors = Vec::new();
    for entry in entries {
        let manager = entry.manager.clone().unwrap_or_default();
        let fields = match entry
            .fields_v1
            .as_ref()
            .map(|f| FieldSet::from_fields_v1(&f.0))
        {
            Some(Ok(fields)) => fields,
            None => FieldSet::default(),
            Some(Err(e)) => {
                errors.push(format!("managedFields entry of `{manager}`: {e}"));
                continue;
            }
        };
        owners.push(Owner {
            manager,
            operation: entry.operation.clone().unwrap_or_default(),
            subresource: entry.subresource.clone().unwrap_or_default(),
            time: entry.time.as_ref().map(|t| t.0.to_string()),
            fields,
        });
    }
    (owners, errors)
}

/// What `manager` owns on `live` through its applies to `subresource`, with the live values.
pub fn owned_document(owners: &[Owner], manager: &str, subresource: &str, live: &Value) -> Value {
    owners
        .iter()
        .find(|o| o.is_apply_of(manager, subresource))
        .and_then(|o| o.fields.project(live))
        .unwrap_or_else(|| Value::Object(Default::default()))
}

/// A path two owners want with different values.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Conflict {
    /// The path, like `.status.conditions[type=Ready].status`.
    pub path: String,
    /// The path as elements, for removing it from an apply.
    #[serde(skip)]
    pub elements: Vec<PathElement>,
    /// The other owner.
    pub owner: String,
    /// The other owner's operation (`Apply`, `Update`), or `Intent` for one of our managers.
    pub operation: String,
    /// Our value.
    pub ours: Option<Value>,
    /// Their value.
    pub theirs: Option<Value>,
}

/// Foreign owners that own a path of `desired` with another value on `live`: an apply
/// without force would get a 409 for each.
pub fn predict(
    desired: &Value,
    manager: &str,
    subresource: &str,
    live: &Value,
    owners: &[Owner],
) -> Vec<Conflict> {
    let claimed = claimed_fields(desired);
    let mut conflicts = Vec::new();
    for owner in owners
        .iter()
        .filter(|o| !o.is_apply_of(manager, subresource))
    {
        for path in value_leaves(&claimed.intersection(&owner.fields)) {
            let ours = value_at(desired, &path);
            let theirs = value_at(live, &path);
            if differs(ours, theirs) {
                conflicts.push(Conflict {
                    path: path_to_string(&path),
                    elements: path,
                    owner: owner.manager.clone(),
                    operation: owner.operation.clone(),
                    ours: ours.cloned(),
                    theirs: theirs.cloned(),
                });
            }
        }
    }
    conflicts
}

/// Paths where `desired` and another of our managers' documents for the same object and
/// subresource want different values. Such an intent is refused before any request.
pub fn local(desired: &Value, others: &[(&str, &Value)]) -> Vec<Conflict> {
    let claimed = claimed_fields(desired);
    let mut conflicts = Vec::new();
    for (manager, doc) in others {
        for path in value_leaves(&claimed.intersection(&claimed_fields(doc))) {
            let ours = value_at(desired, &path);
            let theirs = value_at(doc, &path);
            if differs(ours, theirs) {
                conflicts.push(Conflict {
                    path: path_to_string(&path),
                    elements: path,
                    owner: (*manager).to_owned(),
                    operation: "Intent".into(),
                    ours: ours.cloned(),
                    theirs: theirs.cloned(),
                });
            }
        }
    }
    conflicts
}

/// The owned paths that hold values: a node owned itself (`.`) and also through children
/// is compared through its children.
fn value_leaves(set: &FieldSet) -> Vec<Vec<PathElement>> {
    let paths = set.leaf_paths();
    paths
        .iter()
        .filter(|p| !paths.iter().any(|q| q.len() > p.len() && q.starts_with(p)))
        .cloned()
        .collect()
}

fn differs(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => !same_content(a, b),
        (None, None) => false,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;
    use serde_json::json;

    fn entry(
        manager: &str,
        operation: &str,
        subresource: &str,
        fields: Value,
    ) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            subresource: (!subresource.is_empty()).then(|| subresource.into()),
            fields_v1: Some(FieldsV1(fields)),
            fields_type: Some("FieldsV1".into()),
            ..Default::default()
        }
    }

    fn live_cluster() -> (Value, Vec<Owner>) {
        let live = json!({"spec": {"controlPlaneEndpoint": {"host": "user.example.com", "port": 443}},
                          "status": {"phase": "Provisioning", "infrastructureReady": true}});
        let (owners, errors) = owners(&[
            entry(
                "kubectl",
                "Apply",
                "",
                json!({"f:spec": {"f:controlPlaneEndpoint": {"f:host": {}, "f:port": {}}}}),
            ),
            entry(
                "capi-core",
                "Update",
                "status",
                json!({"f:status": {"f:phase": {}}}),
            ),
            entry(
                "capt-cluster",
                "Apply",
                "status",
                json!({"f:status": {"f:infrastructureReady": {}}}),
            ),
        ]);
        assert!(errors.is_empty());
        (live, owners)
    }

    #[test]
    fn a_foreign_owner_with_another_value_is_predicted() {
        let (live, owners) = live_cluster();
        let desired =
            json!({"spec": {"controlPlaneEndpoint": {"host": "eks.example.com", "port": 443}}});
        let conflicts = predict(&desired, "capt-cluster", "", &live, &owners);
        assert_eq!(conflicts.len(), 1, "{conflicts:?}");
        assert_eq!(conflicts[0].path, ".spec.controlPlaneEndpoint.host");
        assert_eq!(conflicts[0].owner, "kubectl");
        assert_eq!(conflicts[0].theirs, Some(json!("user.example.com")));
    }

    #[test]
    fn agreeing_with_a_foreign_owner_is_no_conflict() {
        let (live, owners) = live_cluster();
        let desired = json!({"status": {"phase": "Provisioning", "infrastructureReady": true}});
        assert!(predict(&desired, "capt-cluster", "status", &live, &owners).is_empty());
        let desired = json!({"status": {"phase": "Provisioned"}});
        let conflicts = predict(&desired, "capt-cluster", "status", &live, &owners);
        assert_eq!(conflicts[0].owner, "capi-core");
        assert_eq!(conflicts[0].operation, "Update");
    }

    #[test]
    fn our_own_apply_entry_is_not_a_foreign_owner() {
        let (live, owners) = live_cluster();
        let desired = json!({"status": {"infrastructureReady": false}});
        assert!(predict(&desired, "capt-cluster", "status", &live, &owners).is_empty());
    }

    #[test]
    fn owned_document_projects_the_live_values_of_our_fields() {
        let (live, owners) = live_cluster();
        assert_eq!(
            owned_document(&owners, "capt-cluster", "status", &live),
            json!({"status": {"infrastructureReady": true}})
        );
        assert_eq!(
            owned_document(&owners, "nobody", "status", &live),
            json!({})
        );
    }

    #[test]
    fn two_of_our_managers_disagreeing_on_a_condition_is_a_local_conflict() {
        let ours = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}], "phase": "Ready"}});
        let other = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "X", "status": "True"}]}});
        let conflicts = local(&ours, &[("other-manager", &other)]);
        assert_eq!(conflicts.len(), 1, "{conflicts:?}");
        assert_eq!(conflicts[0].path, ".status.conditions[type=Ready].status");
        assert_eq!(conflicts[0].owner, "other-manager");
        let agreeing = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert!(local(&ours, &[("other-manager", &agreeing)]).is_empty());
    }

    #[test]
    fn an_undecodable_entry_is_reported_by_manager() {
        let (owners, errors) = owners(&[entry("broken", "Apply", "", json!({"x:oops": {}}))]);
        assert!(owners.is_empty());
        assert!(errors[0].contains("`broken`"), "{errors:?}");
    }
}
