//! How a fragment changes a manager's desired document: an RFC 7386 merge, then the
//! replaced subtrees and the protected paths. Pure functions, no API server.
//!
//! Under server-side apply, a field a manager applied before and omits now is deleted. The
//! desired document therefore always holds everything the manager wants, and a fragment
//! only says what changes.

use crate::config::{FieldPath, PathRules};
use serde_json::Value;

/// The result of merging one fragment.
#[derive(Clone, Debug, PartialEq)]
pub struct Merged {
    /// The new desired document.
    pub document: Value,
    /// Protected paths the fragment removed or emptied without releasing them; they keep
    /// their previous value.
    pub kept: Vec<FieldPath>,
}

/// Merges `fragment` into `current` under `rules`; `release` lists protected paths the
/// fragment may remove.
pub fn merge_fragment(
    current: &Value,
    fragment: &Value,
    rules: &PathRules,
    release: &[FieldPath],
) -> Merged {
    let mut document = current.clone();
    json_patch::merge(&mut document, fragment);
    for path in &rules.replaced {
        if let Some(value) = get(fragment, path).filter(|v| !v.is_null()) {
            set(&mut document, path, without_nulls(value.clone()));
        }
    }
    let mut kept = Vec::new();
    for path in &rules.protected {
        if release.iter().any(|r| r.contains(path)) {
            continue;
        }
        let Some(before) = get(current, path).filter(|v| !is_empty(v)) else {
            continue;
        };
        if get(&document, path).is_none_or(is_empty) {
            set(&mut document, path, before.clone());
            kept.push(path.clone());
        }
    }
    Merged { document, kept }
}

/// The value at a field path.
pub fn get<'a>(value: &'a Value, path: &FieldPath) -> Option<&'a Value> {
    path.segments().iter().try_fold(value, |v, key| v.get(key))
}

/// Sets the value at a field path, creating objects on the way.
pub fn set(value: &mut Value, path: &FieldPath, new: Value) {
    let mut here = value;
    for key in path.segments() {
        if !here.is_object() {
            *here = Value::Object(Default::default());
        }
        here = here
            .as_object_mut()
            .expect("made an object above")
            .entry(key.clone())
            .or_insert(Value::Null);
    }
    *here = new;
}

/// True for what counts as removing a protected value: null, "", [] and an object that
/// holds nothing once its empty objects are pruned (`{}`, `{"outputs": {}}`), since the
/// apply body is pruned the same way and would then remove the path from the object.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        other => holds_nothing(other),
    }
}

/// True for null and for objects whose members all hold nothing.
fn holds_nothing(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(m) => m.values().all(holds_nothing),
        _ => false,
    }
}

/// A replaced subtree is taken as the source's whole value; `null`s inside it mean nothing.
fn without_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn path(s: &str) -> FieldPath {
        s.parse().unwrap()
    }

    fn control_plane_rules() -> PathRules {
        PathRules {
            protected: vec![
                path("status.workspaceStatus.atProvider"),
                path("spec.controlPlaneEndpoint"),
            ],
            replaced: vec![path("status.workspaceStatus.atProvider")],
        }
    }

    fn merge(current: Value, fragment: Value) -> Merged {
        merge_fragment(&current, &fragment, &control_plane_rules(), &[])
    }

    #[test]
    fn a_fragment_that_omits_at_provider_keeps_it() {
        let current = json!({"status": {"phase": "Creating", "workspaceStatus": {"atProvider": {"checksum": "a"}}}});
        let merged = merge(current, json!({"status": {"phase": "Ready"}}));
        assert_eq!(
            merged.document,
            json!({"status": {"phase": "Ready", "workspaceStatus": {"atProvider": {"checksum": "a"}}}})
        );
        assert!(merged.kept.is_empty());
    }

    #[test]
    fn null_removes_a_field_that_is_not_protected() {
        let current = json!({"status": {"phase": "Failed", "failureMessage": "boom"}});
        let merged = merge(
            current,
            json!({"status": {"phase": "Ready", "failureMessage": null}}),
        );
        assert_eq!(merged.document, json!({"status": {"phase": "Ready"}}));
    }

    #[test]
    fn null_on_a_protected_path_keeps_the_value_and_says_so() {
        let current = json!({"spec": {"controlPlaneEndpoint": {"host": "h", "port": 443}}});
        let merged = merge(
            current.clone(),
            json!({"spec": {"controlPlaneEndpoint": null}}),
        );
        assert_eq!(merged.document, current);
        assert_eq!(merged.kept, vec![path("spec.controlPlaneEndpoint")]);
    }

    #[test]
    fn emptying_a_protected_path_counts_as_removing_it() {
        let current = json!({"status": {"workspaceStatus": {"atProvider": {"checksum": "a"}}}});
        let merged = merge(
            current.clone(),
            json!({"status": {"workspaceStatus": {"atProvider": {}}}}),
        );
        assert_eq!(merged.document, current);
        assert_eq!(merged.kept, vec![path("status.workspaceStatus.atProvider")]);
    }

    #[test]
    fn replacing_a_protected_path_with_a_map_of_empty_maps_keeps_it() {
        // `atProvider` is replaced whole: `{outputs: {}}` holds nothing once pruned, so the
        // apply would remove atProvider from the object.
        let current = json!({"status": {"workspaceStatus": {"atProvider": {"checksum": "c1"}}}});
        let merged = merge(
            current.clone(),
            json!({"status": {"workspaceStatus": {"atProvider": {"outputs": {}}}}}),
        );
        assert_eq!(merged.document, current);
        assert_eq!(merged.kept, vec![path("status.workspaceStatus.atProvider")]);
        // The same through nulls below a merged protected path, and released it goes.
        let current = json!({"spec": {"controlPlaneEndpoint": {"host": "h"}}});
        let fragment = json!({"spec": {"controlPlaneEndpoint": {"host": null, "extra": {}}}});
        let merged = merge(current.clone(), fragment.clone());
        assert_eq!(merged.document, current);
        assert_eq!(merged.kept, vec![path("spec.controlPlaneEndpoint")]);
        let released = merge_fragment(
            &current,
            &fragment,
            &control_plane_rules(),
            &[path("spec.controlPlaneEndpoint")],
        );
        assert!(released.kept.is_empty());
    }

    #[test]
    fn a_released_protected_path_is_removed() {
        let current = json!({"spec": {"controlPlaneEndpoint": {"host": "h", "port": 443}}});
        let merged = merge_fragment(
            &current,
            &json!({"spec": {"controlPlaneEndpoint": null}}),
            &control_plane_rules(),
            &[path("spec.controlPlaneEndpoint")],
        );
        assert_eq!(merged.document, json!({"spec": {}}));
        assert!(merged.kept.is_empty());
    }

    #[test]
    fn releasing_a_parent_releases_the_protected_path_below_it() {
        let current = json!({"spec": {"controlPlaneEndpoint": {"host": "h", "port": 443}}});
        let merged = merge_fragment(
            &current,
            &json!({"spec": null}),
            &control_plane_rules(),
            &[path("spec")],
        );
        assert_eq!(merged.document, json!({}));
    }

    #[test]
    fn a_manager_may_change_its_own_protected_value() {
        let current = json!({"spec": {"controlPlaneEndpoint": {"host": "old", "port": 443}}});
        let merged = merge(
            current,
            json!({"spec": {"controlPlaneEndpoint": {"host": "new"}}}),
        );
        assert_eq!(
            merged.document,
            json!({"spec": {"controlPlaneEndpoint": {"host": "new", "port": 443}}})
        );
    }

    #[test]
    fn keys_gone_from_a_replaced_subtree_disappear() {
        let current = json!({"status": {"workspaceStatus": {"ready": true,
            "atProvider": {"checksum": "a", "outputs": {"vpc_id": "v", "cluster_endpoint": "e"}}}}});
        let fragment = json!({"status": {"workspaceStatus": {"atProvider": {"checksum": "b", "outputs": {"vpc_id": "v"}}}}});
        let merged = merge(current, fragment);
        assert_eq!(
            merged.document,
            json!({"status": {"workspaceStatus": {"ready": true,
                "atProvider": {"checksum": "b", "outputs": {"vpc_id": "v"}}}}})
        );
    }

    #[test]
    fn a_merged_subtree_keeps_keys_the_fragment_omits() {
        let rules = PathRules::default();
        let current = json!({"status": {"outputs": {"a": 1, "b": 2}}});
        let merged = merge_fragment(
            &current,
            &json!({"status": {"outputs": {"b": 3}}}),
            &rules,
            &[],
        );
        assert_eq!(
            merged.document,
            json!({"status": {"outputs": {"a": 1, "b": 3}}})
        );
    }

    #[test]
    fn nulls_inside_a_replaced_subtree_are_dropped_not_applied() {
        let merged = merge(
            json!({}),
            json!({"status": {"workspaceStatus": {"atProvider": {"checksum": "a", "x": null}}}}),
        );
        assert_eq!(
            merged.document,
            json!({"status": {"workspaceStatus": {"atProvider": {"checksum": "a"}}}})
        );
    }

    #[test]
    fn a_protected_path_never_set_may_stay_absent() {
        let merged = merge(json!({}), json!({"status": {"phase": "Creating"}}));
        assert_eq!(merged.document, json!({"status": {"phase": "Creating"}}));
        assert!(merged.kept.is_empty());
    }
}
