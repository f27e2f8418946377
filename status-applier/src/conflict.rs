//! Conflicts, found before any request: between two of our own managers (local), and with
//! foreign managers as recorded in the live object's `managedFields` (predicted). The 409 of
//! the API server confirms what prediction missed.

use crate::document::{
    claimed_fields, list_map_keys, same_content, value_at, without_empty_objects,
};
use managed_fields::{FieldSet, ManagedFields, PathElement, path_to_string};
use serde_json::Value;

pub use status_applier_api::outcome::Conflict;

/// A predicted conflict, with its path as elements for removing it from an apply.
#[derive(Clone, Debug, PartialEq)]
pub struct Predicted {
    /// The conflict, as answered and reported.
    pub conflict: Conflict,
    /// The path as elements.
    pub elements: Vec<PathElement>,
}

/// Foreign owners that own a path of `desired` with another value on `live`: an apply
/// without force would get a 409 for each.
pub fn predict(
    desired: &Value,
    manager: &str,
    subresource: &str,
    live: &Value,
    managed: &ManagedFields,
) -> Vec<Predicted> {
    let claimed = claimed_fields(desired);
    let mut conflicts = Vec::new();
    for other in managed.others_than(manager, subresource) {
        for path in claimed.intersection(&other.fields).value_leaves() {
            if !owns_value(&other.fields, &path, live) {
                continue;
            }
            let ours = value_at(desired, &path);
            let theirs = value_at(live, &path);
            if differs(ours, theirs) {
                conflicts.push(Predicted {
                    conflict: Conflict {
                        path: path_to_string(&path),
                        owner: other.owner.manager.clone(),
                        operation: other.owner.operation.clone(),
                        ours: ours.cloned(),
                        theirs: theirs.cloned(),
                    },
                    elements: path,
                });
            }
        }
    }
    conflicts
}

/// True when `fields` owns the value at `path` on `live`, so that changing it is a conflict.
///
/// A leaf without children above `path` owns it only when the live value of that leaf is
/// atomic. On a map (or a keyed list) it is ownership of the container alone: the API server
/// keeps `f:status: {}` for a manager that applied `status: {}` or lost every field below a
/// map it created, and accepts other managers' applies below it without a 409 (its
/// conflicts are the fields an apply modifies or adds, and an existing map is neither).
/// Without the schema an atomic map looks like any map; the API server's 409 reports
/// what this misses.
fn owns_value(fields: &FieldSet, path: &[PathElement], live: &Value) -> bool {
    let Some(len) = fields.covering_leaf(path) else {
        return true;
    };
    let leaf = &path[..len];
    match value_at(live, leaf) {
        // `null` is what server-side apply leaves of such a map once the last fields below
        // it are released; the API server accepts applies below it without a 409 too.
        Some(Value::Object(_) | Value::Null) => false,
        Some(Value::Array(_)) => {
            let schema_path: Vec<PathElement> = leaf
                .iter()
                .filter(|e| matches!(e, PathElement::Field(_)))
                .cloned()
                .collect();
            list_map_keys(&schema_path).is_none()
        }
        // A scalar replaced by our fields, or absent: the apply modifies or adds the leaf.
        _ => true,
    }
}

/// Paths where `desired` and another of our managers' documents for the same object and
/// subresource want different values. Such an intent is refused before any request.
pub fn local(desired: &Value, others: &[(&str, &Value)]) -> Vec<Conflict> {
    // Empty objects are never applied (see `apply::plan`); claimed, `{}` would be a leaf
    // owning every field another document sets below it.
    let claimed = claimed_fields(&without_empty_objects(desired));
    let mut conflicts = Vec::new();
    for (manager, doc) in others {
        let theirs = claimed_fields(&without_empty_objects(doc));
        for path in claimed.intersection(&theirs).value_leaves() {
            let ours = value_at(desired, &path);
            let theirs = value_at(doc, &path);
            if differs(ours, theirs) {
                conflicts.push(Conflict {
                    path: path_to_string(&path),
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
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
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

    fn live_cluster() -> (Value, ManagedFields) {
        let live = json!({"spec": {"controlPlaneEndpoint": {"host": "user.example.com", "port": 443}},
                          "status": {"phase": "Provisioning", "infrastructureReady": true}});
        let owners = ManagedFields::decode(&[
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
                "widget-controller",
                "Apply",
                "status",
                json!({"f:status": {"f:infrastructureReady": {}}}),
            ),
        ]);
        assert!(owners.errors.is_empty());
        (live, owners)
    }

    #[test]
    fn a_foreign_owner_with_another_value_is_predicted() {
        let (live, owners) = live_cluster();
        let desired =
            json!({"spec": {"controlPlaneEndpoint": {"host": "eks.example.com", "port": 443}}});
        let conflicts = predict(&desired, "widget-controller", "", &live, &owners);
        assert_eq!(conflicts.len(), 1, "{conflicts:?}");
        assert_eq!(
            conflicts[0].conflict.path,
            ".spec.controlPlaneEndpoint.host"
        );
        assert_eq!(conflicts[0].conflict.owner, "kubectl");
        assert_eq!(
            conflicts[0].conflict.theirs,
            Some(json!("user.example.com"))
        );
    }

    #[test]
    fn agreeing_with_a_foreign_owner_is_no_conflict() {
        let (live, owners) = live_cluster();
        let desired = json!({"status": {"phase": "Provisioning", "infrastructureReady": true}});
        assert!(predict(&desired, "widget-controller", "status", &live, &owners).is_empty());
        let desired = json!({"status": {"phase": "Provisioned"}});
        let conflicts = predict(&desired, "widget-controller", "status", &live, &owners);
        assert_eq!(conflicts[0].conflict.owner, "capi-core");
        assert_eq!(conflicts[0].conflict.operation, "Update");
    }

    #[test]
    fn a_foreign_owner_of_a_map_alone_does_not_own_its_fields() {
        // What the API server keeps after `foreign-u` created atProvider with a checksum by an
        // update and then removed the checksum, and after `foreign-a` applied `spec: {}`.
        let live = json!({"spec": {"controlPlaneEndpoint": {"host": "a", "port": 443}},
                          "status": {"workspaceStatus": {"atProvider": {}}}});
        let emptied = json!({"status": {"workspaceStatus": {"atProvider": null}}});
        let owners = ManagedFields::decode(&[
            entry(
                "foreign-u",
                "Update",
                "status",
                json!({"f:status": {".": {}, "f:workspaceStatus": {".": {}, "f:atProvider": {}}}}),
            ),
            entry("foreign-a", "Apply", "", json!({"f:spec": {}})),
        ]);
        assert!(owners.errors.is_empty());
        let desired = json!({"status": {"workspaceStatus": {"atProvider": {"checksum": "ours"}}}});
        assert!(predict(&desired, "widget-controller", "status", &live, &owners).is_empty());
        assert!(predict(&desired, "widget-controller", "status", &emptied, &owners).is_empty());
        let desired = json!({"spec": {"controlPlaneEndpoint": {"host": "b", "port": 443}}});
        assert!(predict(&desired, "widget-controller", "", &live, &owners).is_empty());
        // A leaf on an atomic value still owns what replaces it, and one on an absent map
        // owns the map our apply would add.
        let live = json!({"spec": {"controlPlaneEndpoint": "atomic"}});
        let atomic = ManagedFields::decode(&[entry(
            "foreign-a",
            "Apply",
            "",
            json!({"f:spec": {"f:controlPlaneEndpoint": {}, "f:x": {}}}),
        )]);
        let conflicts = predict(&desired, "widget-controller", "", &live, &atomic);
        assert_eq!(conflicts.len(), 2, "{conflicts:?}");
        let desired = json!({"spec": {"x": {"y": 1}}});
        let conflicts = predict(&desired, "widget-controller", "", &live, &atomic);
        assert_eq!(conflicts[0].conflict.path, ".spec.x.y");
    }

    #[test]
    fn our_own_apply_entry_is_not_a_foreign_owner() {
        let (live, owners) = live_cluster();
        let desired = json!({"status": {"infrastructureReady": false}});
        assert!(predict(&desired, "widget-controller", "status", &live, &owners).is_empty());
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
        // An empty map left in a document by a fragment claims nothing.
        let emptied = json!({"status": {"phase": "Ready", "workspaceStatus": {}}});
        let other = json!({"status": {"workspaceStatus": {"ready": true}}});
        assert!(local(&emptied, &[("other-manager", &other)]).is_empty());
        assert!(local(&other, &[("other-manager", &emptied)]).is_empty());
    }
}
