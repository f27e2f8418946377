//! Questions about desired documents and live objects that need no API server: which
//! fields a document claims, the value at a path, and comparison up to list order.

use managed_fields::{FieldSet, PathElement};
use serde_json::Value;

/// The key fields of an associative list at a schema path, or `None` for an atomic list.
///
/// NOTE: the applier does not read CRD schemas; it knows one convention, that a list named
/// `conditions` is a list-type map keyed by `type` (`metav1.Condition`). Every other list is
/// treated as atomic. This affects only conflict prediction and the no-op check: the API
/// server, which knows the schema, stays the authority on what an apply does.
pub fn list_map_keys(schema_path: &[PathElement]) -> Option<Vec<String>> {
    match schema_path.last() {
        Some(PathElement::Field(name)) if name == "conditions" => Some(vec!["type".to_owned()]),
        _ => None,
    }
}

/// The fields an apply of `doc` claims.
pub fn claimed_fields(doc: &Value) -> FieldSet {
    FieldSet::from_apply_document(doc, &list_map_keys)
}

/// The value at `path`, following `k:` keys, `v:` values and `i:` indices into lists.
pub fn value_at<'a>(doc: &'a Value, path: &[PathElement]) -> Option<&'a Value> {
    path.iter().try_fold(doc, |here, step| match (step, here) {
        (PathElement::Field(name), Value::Object(map)) => map.get(name),
        (PathElement::Key(keys), Value::Array(items)) => {
            items.iter().find(|item| has_keys(item, keys))
        }
        (PathElement::Value(v), Value::Array(items)) => items.iter().find(|item| *item == v),
        (PathElement::Index(i), Value::Array(items)) => items.get(*i),
        _ => None,
    })
}

/// Removes the value at `path`; returns whether anything was removed.
pub fn remove_at(doc: &mut Value, path: &[PathElement]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut here = doc;
    for step in parents {
        let next = match (step, here) {
            (PathElement::Field(name), Value::Object(map)) => map.get_mut(name),
            (PathElement::Key(keys), Value::Array(items)) => {
                items.iter_mut().find(|item| has_keys(item, keys))
            }
            (PathElement::Value(v), Value::Array(items)) => {
                items.iter_mut().find(|item| *item == v)
            }
            (PathElement::Index(i), Value::Array(items)) => items.get_mut(*i),
            _ => None,
        };
        let Some(next) = next else { return false };
        here = next;
    }
    match (last, here) {
        (PathElement::Field(name), Value::Object(map)) => map.remove(name).is_some(),
        (PathElement::Key(keys), Value::Array(items)) => {
            remove_first(items, |item| has_keys(item, keys))
        }
        (PathElement::Value(v), Value::Array(items)) => remove_first(items, |item| item == v),
        (PathElement::Index(i), Value::Array(items)) if *i < items.len() => {
            items.remove(*i);
            true
        }
        _ => false,
    }
}

fn remove_first(items: &mut Vec<Value>, matches: impl Fn(&Value) -> bool) -> bool {
    let Some(pos) = items.iter().position(matches) else {
        return false;
    };
    items.remove(pos);
    true
}

fn has_keys(item: &Value, keys: &serde_json::Map<String, Value>) -> bool {
    keys.iter().all(|(k, v)| item.get(k) == Some(v))
}

/// Equality as the API server sees it: `null` and empty objects are no content, and the
/// elements of a `conditions` list are compared in order of their `type`.
pub fn same_content(a: &Value, b: &Value) -> bool {
    normalize(a) == normalize(b)
}

/// `value` without empty objects (recursively; an object emptied by that goes too).
pub fn without_empty_objects(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), without_empty_objects(v)))
                .filter(|(_, v)| !matches!(v, Value::Object(m) if m.is_empty()))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn normalize(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), normalize_field(k, v)))
                .filter(|(_, v)| !is_nothing(v))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

fn normalize_field(name: &str, value: &Value) -> Value {
    let mut value = normalize(value);
    if let (Value::Array(items), Some(keys)) = (
        &mut value,
        list_map_keys(&[PathElement::Field(name.to_owned())]),
    ) {
        items.sort_by_key(|item| {
            keys.iter()
                .map(|k| item.get(k).map(Value::to_string))
                .collect::<Vec<_>>()
        });
    }
    value
}

fn is_nothing(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(t: &str) -> PathElement {
        PathElement::Key(json!({"type": t}).as_object().unwrap().clone())
    }

    fn field(s: &str) -> PathElement {
        PathElement::Field(s.into())
    }

    #[test]
    fn value_at_follows_condition_keys() {
        let doc = json!({"status": {"conditions": [{"type": "A", "status": "True"}, {"type": "B", "status": "False"}]}});
        let path = [
            field("status"),
            field("conditions"),
            key("B"),
            field("status"),
        ];
        assert_eq!(value_at(&doc, &path), Some(&json!("False")));
        assert_eq!(value_at(&doc, &[field("status"), field("missing")]), None);
    }

    #[test]
    fn remove_at_removes_one_condition_or_one_field() {
        let mut doc =
            json!({"status": {"phase": "Ready", "conditions": [{"type": "A"}, {"type": "B"}]}});
        assert!(remove_at(
            &mut doc,
            &[field("status"), field("conditions"), key("A")]
        ));
        assert!(remove_at(&mut doc, &[field("status"), field("phase")]));
        assert!(!remove_at(&mut doc, &[field("status"), field("phase")]));
        assert_eq!(doc, json!({"status": {"conditions": [{"type": "B"}]}}));
    }

    #[test]
    fn conditions_are_claimed_per_type() {
        let doc = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let fields = claimed_fields(&doc);
        assert!(fields.owns(&[
            field("status"),
            field("conditions"),
            key("Ready"),
            field("status")
        ]));
        assert!(!fields.touches(&[field("status"), field("conditions"), key("Initialized")]));
    }

    #[test]
    fn empty_objects_left_by_removals_are_dropped() {
        let doc = json!({"spec": {}, "status": {"a": {"b": {}}, "c": 1, "list": [{}]}});
        assert_eq!(
            without_empty_objects(&doc),
            json!({"status": {"c": 1, "list": [{}]}})
        );
    }

    #[test]
    fn same_content_ignores_condition_order_and_empty_objects() {
        let a = json!({"status": {"x": {}, "conditions": [{"type": "B"}, {"type": "A"}]}});
        let b = json!({"status": {"conditions": [{"type": "A"}, {"type": "B"}]}});
        assert!(same_content(&a, &b));
        assert!(!same_content(
            &json!({"list": [1, 2]}),
            &json!({"list": [2, 1]})
        ));
        assert!(!same_content(&json!({"a": 1}), &json!({"a": 2})));
    }
}
