//! The entries of an object's `managedFields`, decoded: who wrote each ([`Owner`]) and which
//! fields it owns, and the questions the applier, the audit and the controller ask of them.

use crate::fieldsv1::{FieldSet, PathElement, path_to_string};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;

/// Who wrote one `managedFields` entry.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Owner {
    /// Field manager name.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// `status`, or empty for the main resource.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
    /// When the entry last changed (RFC 3339), if recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
}

impl Owner {
    /// True for the entry a server-side apply by `manager` on `subresource` (empty for the
    /// main resource) writes.
    pub fn is_apply_of(&self, manager: &str, subresource: &str) -> bool {
        self.manager == manager && self.operation == "Apply" && self.subresource == subresource
    }
}

impl fmt::Display for Owner {
    /// `manager (operation, subresource, time)`, with `main` for the main resource.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sub = if self.subresource.is_empty() {
            "main"
        } else {
            &self.subresource
        };
        write!(f, "{} ({}, {sub}", self.manager, self.operation)?;
        match &self.time {
            Some(t) => write!(f, ", {t})"),
            None => f.write_str(")"),
        }
    }
}

/// One decoded `managedFields` entry: its owner and the fields it owns.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Who wrote it.
    pub owner: Owner,
    /// What it owns.
    pub fields: FieldSet,
}

/// Every entry of one object's `managedFields` that decodes, and an error message naming the
/// manager of each one that does not (left out: a broken entry never blocks the others).
#[derive(Clone, Debug, Default)]
pub struct ManagedFields {
    /// The decoded entries, in the object's order.
    pub entries: Vec<Entry>,
    /// One message per entry that could not be decoded.
    pub errors: Vec<String>,
}

impl ManagedFields {
    /// Decodes typed entries, as a client reads them.
    pub fn decode(entries: &[ManagedFieldsEntry]) -> Self {
        let mut decoded = Self::default();
        for entry in entries {
            let owner = Owner {
                manager: entry.manager.clone().unwrap_or_default(),
                operation: entry.operation.clone().unwrap_or_default(),
                subresource: entry.subresource.clone().unwrap_or_default(),
                time: entry.time.as_ref().map(|t| t.0.to_string()),
            };
            let fields = match entry.fields_v1.as_ref() {
                None => Ok(FieldSet::default()),
                Some(f) => FieldSet::from_fields_v1(&f.0),
            };
            match fields {
                Ok(fields) => decoded.entries.push(Entry { owner, fields }),
                Err(e) => decoded
                    .errors
                    .push(format!("managedFields entry of `{}`: {e}", owner.manager)),
            }
        }
        decoded
    }

    /// Decodes `metadata.managedFields` of an object given as JSON (for example the output of
    /// `kubectl get -o json --show-managed-fields`); absent counts as empty.
    pub fn from_object(object: &Value) -> Result<Self, String> {
        match &object["metadata"]["managedFields"] {
            Value::Null => Ok(Self::default()),
            entries => serde_json::from_value::<Vec<ManagedFieldsEntry>>(entries.clone())
                .map(|entries| Self::decode(&entries))
                .map_err(|e| format!("metadata.managedFields is not a list of entries: {e}")),
        }
    }

    /// The entry of `manager`'s applies to `subresource` (empty for the main resource).
    pub fn apply_of(&self, manager: &str, subresource: &str) -> Option<&Entry> {
        self.entries
            .iter()
            .find(|e| e.owner.is_apply_of(manager, subresource))
    }

    /// Every entry but that of `manager`'s applies to `subresource`.
    pub fn others_than(&self, manager: &str, subresource: &str) -> Vec<&Entry> {
        self.entries
            .iter()
            .filter(|e| !e.owner.is_apply_of(manager, subresource))
            .collect()
    }

    /// True when `manager`'s applies to `subresource` own `path` or anything below it.
    pub fn applied_at(&self, manager: &str, subresource: &str, path: &[PathElement]) -> bool {
        self.apply_of(manager, subresource)
            .is_some_and(|e| e.fields.touches(path))
    }

    /// What `manager` owns on `live` through its applies to `subresource`, with the live
    /// values: its desired document as the API server remembers it (`{}` when none).
    pub fn owned_document(&self, manager: &str, subresource: &str, live: &Value) -> Value {
        self.apply_of(manager, subresource)
            .and_then(|e| e.fields.project(live))
            .unwrap_or_else(|| Value::Object(Default::default()))
    }

    /// Every field that holds a value, rendered like `.status.phase`, with all its owners in
    /// entry order.
    pub fn field_owners(&self) -> BTreeMap<String, Vec<Owner>> {
        let mut fields: BTreeMap<String, Vec<Owner>> = BTreeMap::new();
        for entry in &self.entries {
            for path in entry.fields.value_leaves() {
                fields
                    .entry(path_to_string(&path))
                    .or_default()
                    .push(entry.owner.clone());
            }
        }
        fields
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object() -> Value {
        json!({"metadata": {"managedFields": [
            {"manager": "ours", "operation": "Apply", "subresource": "status",
             "time": "2026-11-25T00:00:00Z", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:status": {"f:phase": {}}}},
            {"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:spec": {".": {}, "f:a": {}}}},
            {"manager": "broken", "operation": "Update", "fieldsType": "FieldsV1",
             "fieldsV1": {"x:bad": {}}}
        ]}, "spec": {"a": 1}, "status": {"phase": "Ready", "other": 2}})
    }

    #[test]
    fn decodes_every_entry_and_names_the_manager_of_a_broken_one() {
        let fields = ManagedFields::from_object(&object()).unwrap();
        assert_eq!(fields.entries.len(), 2);
        assert_eq!(fields.errors.len(), 1);
        assert!(fields.errors[0].contains("`broken`"), "{:?}", fields.errors);
        let ours = &fields.entries[0].owner;
        assert_eq!(
            ours.to_string(),
            "ours (Apply, status, 2026-11-25T00:00:00Z)"
        );
        assert_eq!(
            fields.entries[1].owner.to_string(),
            "kubectl (Update, main)"
        );
    }

    #[test]
    fn a_list_that_is_not_of_entries_is_an_error_not_an_empty_set() {
        let err =
            ManagedFields::from_object(&json!({"metadata": {"managedFields": 3}})).unwrap_err();
        assert!(err.contains("metadata.managedFields"), "{err}");
        assert!(
            ManagedFields::from_object(&json!({}))
                .unwrap()
                .entries
                .is_empty()
        );
    }

    #[test]
    fn owned_document_projects_only_the_applied_fields_of_that_subresource() {
        let fields = ManagedFields::from_object(&object()).unwrap();
        let live = object();
        assert_eq!(
            fields.owned_document("ours", "status", &live),
            json!({"status": {"phase": "Ready"}})
        );
        assert_eq!(fields.owned_document("ours", "", &live), json!({}));
        assert_eq!(
            fields.owned_document("kubectl", "", &live),
            json!({}),
            "an Update is no apply"
        );
        assert_eq!(fields.others_than("ours", "status").len(), 1);
    }

    #[test]
    fn applied_at_sees_a_path_or_anything_below_it() {
        let fields = ManagedFields::from_object(&object()).unwrap();
        let status = parse_path(".status");
        assert!(fields.applied_at("ours", "status", &status));
        assert!(fields.applied_at("ours", "status", &parse_path(".status.phase")));
        assert!(!fields.applied_at("ours", "status", &parse_path(".status.other")));
        assert!(!fields.applied_at("kubectl", "", &parse_path(".spec")));
    }

    #[test]
    fn field_owners_lists_value_leaves_only() {
        let fields = ManagedFields::from_object(&object()).unwrap();
        let owners = fields.field_owners();
        let paths: Vec<&str> = owners.keys().map(String::as_str).collect();
        // `.spec` is owned itself and through `.spec.a`: it is compared through its child.
        assert_eq!(paths, [".spec.a", ".status.phase"]);
    }

    fn parse_path(s: &str) -> Vec<PathElement> {
        crate::parse_field_path(s).unwrap()
    }
}
