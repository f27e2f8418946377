//! The intent document: what a field manager wants a part of one object to be (the types
//! are the API crate's), its parsing and its validation. Nothing here talks to the API
//! server.

use crate::config::{FieldPath, GroupKind, Policy};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

pub use status_applier_api::intent::{Intent, MAX_INTENT_BYTES, Subresource, Target};

/// An object, without uid: `kind/namespace/name` in logs and answers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// `group/version`.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Namespace; absent for cluster-scoped objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

impl ObjectRef {
    /// The kind's group and kind.
    pub fn group_kind(&self) -> GroupKind {
        GroupKind::from_api_version(&self.api_version, &self.kind)
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{}/{ns}/{}", self.kind, self.name),
            None => write!(f, "{}/{}", self.kind, self.name),
        }
    }
}

/// What one desired document is kept for: an object, a subresource and a field manager.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct DesiredKey {
    /// The object.
    pub object: ObjectRef,
    /// The subresource, or the main resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subresource: Option<Subresource>,
    /// The field manager.
    pub field_manager: String,
}

impl DesiredKey {
    /// The subresource as the API names it (`status`, or empty for the main resource).
    pub fn subresource_name(&self) -> &'static str {
        match self.subresource {
            Some(Subresource::Status) => "status",
            None => "",
        }
    }
}

impl fmt::Display for DesiredKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}", self.object, self.field_manager)?;
        match self.subresource {
            Some(Subresource::Status) => f.write_str(", status]"),
            None => f.write_str("]"),
        }
    }
}

/// An intent that passed validation.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidIntent {
    /// Which desired document the fragment merges into.
    pub key: DesiredKey,
    /// The uid precondition, if any.
    pub uid: Option<String>,
    /// The fragment (a JSON object).
    pub fragment: Value,
    /// Protected paths the intent releases.
    pub release: Vec<FieldPath>,
    /// The intent is planned on no view of the object older than this `resourceVersion`.
    pub not_older_than: Option<u64>,
}

/// Why an intent was refused. Every variant is the submitter's mistake (a 4xx).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum IntentError {
    /// The body is not a valid intent document (syntax, a missing or unknown field).
    #[error("invalid intent document: {0}")]
    Malformed(String),
    /// The body is larger than [`MAX_INTENT_BYTES`].
    #[error("intent body of {0} bytes is larger than the limit of {MAX_INTENT_BYTES} bytes")]
    TooLarge(usize),
    /// `fieldManager` is empty or not a valid field manager name.
    #[error(
        "invalid fieldManager `{0}`: expected 1 to 128 characters, letters, digits and -_.:/, starting with a letter or digit"
    )]
    InvalidManager(String),
    /// The policy does not allow this field manager.
    #[error("fieldManager `{0}` is not allowed by this applier's configuration")]
    ManagerNotAllowed(String),
    /// The policy does not allow this kind.
    #[error("kind `{0}` is not allowed by this applier's configuration")]
    KindNotAllowed(String),
    /// A target field is missing or invalid.
    #[error("invalid target: {0}")]
    InvalidTarget(String),
    /// The fragment is not a JSON object.
    #[error("fragment must be an object, like {{status: {{phase: Ready}}}}")]
    FragmentNotObject,
    /// The fragment touches `apiVersion`, `kind`, `metadata` or `managedFields`.
    #[error("fragment must not set `{0}`: the applier owns the object's identity and metadata")]
    ReservedField(String),
    /// A status intent carries fields outside `status`, or a main-resource intent carries `status`.
    #[error("fragment field `{field}` does not belong to {subresource}")]
    WrongSubresource {
        /// The offending top-level field.
        field: String,
        /// `the status subresource` or `the main resource`.
        subresource: &'static str,
    },
    /// An entry of `release` is not a field path.
    #[error("invalid release entry: {0}")]
    InvalidRelease(String),
    /// `notOlderThan` is not a resourceVersion this applier can compare.
    #[error(
        "invalid notOlderThan `{0}`: expected a resourceVersion as the API server gives it (a decimal number)"
    )]
    InvalidNotOlderThan(String),
}

/// Parsing and validation of an intent, which only the server does.
pub trait IntentExt: Sized {
    /// Parses one intent from JSON or YAML (YAML is a superset, so both are accepted).
    fn parse(body: &[u8]) -> Result<Self, IntentError>;

    /// Checks the intent against the rules and the policy.
    fn validate(self, policy: &Policy) -> Result<ValidIntent, IntentError>;
}

impl IntentExt for Intent {
    fn parse(body: &[u8]) -> Result<Self, IntentError> {
        if body.len() > MAX_INTENT_BYTES {
            return Err(IntentError::TooLarge(body.len()));
        }
        match serde_json::from_slice(body) {
            Ok(intent) => Ok(intent),
            Err(json_err) if json_err.is_syntax() || json_err.is_eof() => {
                serde_yaml::from_slice(body).map_err(|e| IntentError::Malformed(e.to_string()))
            }
            Err(e) => Err(IntentError::Malformed(e.to_string())),
        }
    }

    fn validate(self, policy: &Policy) -> Result<ValidIntent, IntentError> {
        validate_manager(&self.field_manager)?;
        if !policy.allows_manager(&self.field_manager) {
            return Err(IntentError::ManagerNotAllowed(self.field_manager));
        }
        let object = validate_target(&self.target)?;
        let kind = object.group_kind();
        if !policy.allows_kind(&kind) {
            return Err(IntentError::KindNotAllowed(kind.to_string()));
        }
        validate_fragment(&self.fragment, self.subresource)?;
        let release = self
            .release
            .iter()
            .map(|p| p.parse().map_err(IntentError::InvalidRelease))
            .collect::<Result<_, _>>()?;
        // The API server's resourceVersions are etcd revisions, which the applier compares
        // (newer views win); one it cannot compare would make it wait for nothing.
        let not_older_than = match self.not_older_than {
            None => None,
            Some(v) => Some(
                v.parse::<u64>()
                    .map_err(|_| IntentError::InvalidNotOlderThan(v.clone()))?,
            ),
        };
        Ok(ValidIntent {
            key: DesiredKey {
                object,
                subresource: self.subresource,
                field_manager: self.field_manager,
            },
            uid: self.target.uid.filter(|u| !u.is_empty()),
            fragment: self.fragment,
            release,
            not_older_than,
        })
    }
}

fn validate_manager(manager: &str) -> Result<(), IntentError> {
    let valid_char = |c: char| c.is_ascii_alphanumeric() || "-_.:/".contains(c);
    let starts_well = manager
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    if manager.len() > 128 || !starts_well || !manager.chars().all(valid_char) {
        return Err(IntentError::InvalidManager(manager.to_owned()));
    }
    Ok(())
}

fn validate_target(target: &Target) -> Result<ObjectRef, IntentError> {
    let invalid = |msg: String| Err(IntentError::InvalidTarget(msg));
    if target.kind.is_empty() {
        return invalid("target.kind is empty".into());
    }
    if target.api_version.is_empty() || target.api_version.split('/').count() > 2 {
        return invalid(format!(
            "target.apiVersion `{}` is not group/version or version",
            target.api_version
        ));
    }
    for (field, value) in [
        ("name", Some(&target.name)),
        ("namespace", target.namespace.as_ref()),
    ] {
        let Some(value) = value else { continue };
        if value.is_empty() || value.len() > 253 || value.contains('/') || value.contains('%') {
            return invalid(format!(
                "target.{field} `{value}` is not a valid object name"
            ));
        }
    }
    Ok(ObjectRef {
        api_version: target.api_version.clone(),
        kind: target.kind.clone(),
        namespace: target.namespace.clone(),
        name: target.name.clone(),
    })
}

fn validate_fragment(
    fragment: &Value,
    subresource: Option<Subresource>,
) -> Result<(), IntentError> {
    let Value::Object(fields) = fragment else {
        return Err(IntentError::FragmentNotObject);
    };
    for field in fields.keys() {
        if matches!(field.as_str(), "apiVersion" | "kind" | "metadata") {
            return Err(IntentError::ReservedField(field.clone()));
        }
        let wrong = match subresource {
            Some(Subresource::Status) => field != "status",
            None => field == "status",
        };
        if wrong {
            return Err(IntentError::WrongSubresource {
                field: field.clone(),
                subresource: match subresource {
                    Some(Subresource::Status) => "the status subresource",
                    None => "the main resource",
                },
            });
        }
    }
    if let Some(path) = find_key(fragment, "managedFields") {
        return Err(IntentError::ReservedField(path));
    }
    Ok(())
}

/// The dotted path of the first object key named `name`, anywhere in `value`.
fn find_key(value: &Value, name: &str) -> Option<String> {
    let mut stack = vec![(value, String::new())];
    while let Some((value, path)) = stack.pop() {
        let Value::Object(map) = value else {
            if let Value::Array(items) = value {
                stack.extend(items.iter().map(|v| (v, path.clone())));
            }
            continue;
        };
        for (k, v) in map {
            let here = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            if k == name {
                return Some(here);
            }
            stack.push((v, here));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn intent(v: Value) -> Result<ValidIntent, IntentError> {
        Intent::parse(v.to_string().as_bytes())?.validate(&Policy::default())
    }

    fn status_intent() -> Value {
        json!({
            "target": {"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "Widget",
                       "namespace": "default", "name": "demo"},
            "subresource": "status",
            "fieldManager": "widget-controller",
            "fragment": {"status": {"phase": "Ready"}},
        })
    }

    #[test]
    fn a_status_intent_is_valid() {
        let valid = intent(status_intent()).unwrap();
        assert_eq!(
            valid.key.to_string(),
            "Widget/default/demo [widget-controller, status]"
        );
        assert_eq!(valid.key.subresource_name(), "status");
    }

    #[test]
    fn yaml_intents_parse_like_json() {
        let yaml = "target: {apiVersion: v1, kind: ConfigMap, namespace: ns, name: x}\nfieldManager: m\nfragment:\n  data: {a: b}\nrelease: [data.a]\n";
        let valid = Intent::parse(yaml.as_bytes())
            .unwrap()
            .validate(&Policy::default())
            .unwrap();
        assert_eq!(valid.fragment, json!({"data": {"a": "b"}}));
        assert_eq!(valid.release, vec!["data.a".parse().unwrap()]);
    }

    #[test]
    fn unknown_fields_are_rejected_by_name() {
        let mut v = status_intent();
        v["fieldmanager"] = json!("x");
        let err = intent(v).unwrap_err().to_string();
        assert!(err.contains("unknown field `fieldmanager`"), "{err}");
    }

    #[test]
    fn each_invalid_part_gets_its_own_error() {
        type Mutation = fn(&mut Value);
        let cases: Vec<(Mutation, &str)> = vec![
            (|v| v["fieldManager"] = json!(""), "invalid fieldManager ``"),
            (
                |v| v["fieldManager"] = json!("-x"),
                "invalid fieldManager `-x`",
            ),
            (
                |v| v["target"]["name"] = json!(""),
                "target.name `` is not a valid object name",
            ),
            (|v| v["target"]["kind"] = json!(""), "target.kind is empty"),
            (|v| v["fragment"] = json!([1]), "fragment must be an object"),
            (
                |v| v["fragment"] = json!({"metadata": {"labels": {}}}),
                "must not set `metadata`",
            ),
            (
                |v| v["fragment"]["status"]["managedFields"] = json!([]),
                "must not set `status.managedFields`",
            ),
            (
                |v| v["fragment"]["spec"] = json!({}),
                "`spec` does not belong to the status subresource",
            ),
            (|v| v["release"] = json!(["a..b"]), "invalid release entry"),
            (
                |v| v["notOlderThan"] = json!("abc"),
                "invalid notOlderThan `abc`",
            ),
            (
                |v| v["subresource"] = json!("scale"),
                "unknown variant `scale`",
            ),
        ];
        for (mutate, expected) in cases {
            let mut v = status_intent();
            mutate(&mut v);
            let err = intent(v).unwrap_err().to_string();
            assert!(err.contains(expected), "expected `{expected}` in `{err}`");
        }
    }

    #[test]
    fn not_older_than_is_read_as_a_revision() {
        let mut v = status_intent();
        v["notOlderThan"] = json!("4711");
        assert_eq!(intent(v).unwrap().not_older_than, Some(4711));
        assert_eq!(intent(status_intent()).unwrap().not_older_than, None);
    }

    #[test]
    fn a_missing_target_name_is_named() {
        let mut v = status_intent();
        v["target"].as_object_mut().unwrap().remove("name");
        let err = intent(v).unwrap_err().to_string();
        assert!(err.contains("missing field `name`"), "{err}");
    }

    #[test]
    fn main_resource_intents_may_not_carry_status() {
        let mut v = status_intent();
        v.as_object_mut().unwrap().remove("subresource");
        let err = intent(v).unwrap_err().to_string();
        assert!(
            err.contains("`status` does not belong to the main resource"),
            "{err}"
        );
    }

    #[test]
    fn the_policy_limits_managers_and_kinds() {
        let policy = Policy {
            allowed_managers: vec!["other-controller".into()],
            ..Policy::default()
        };
        let parsed = Intent::parse(status_intent().to_string().as_bytes()).unwrap();
        assert_eq!(
            parsed.clone().validate(&policy).unwrap_err(),
            IntentError::ManagerNotAllowed("widget-controller".into())
        );
        let policy = Policy {
            allowed_kinds: vec!["Cluster.cluster.x-k8s.io".parse().unwrap()],
            ..Policy::default()
        };
        let err = parsed.validate(&policy).unwrap_err().to_string();
        assert!(
            err.contains("Widget.controlplane.cluster.x-k8s.io"),
            "{err}"
        );
    }

    #[test]
    fn oversized_bodies_are_refused_before_parsing() {
        let body = vec![b' '; MAX_INTENT_BYTES + 1];
        assert_eq!(
            Intent::parse(&body).unwrap_err(),
            IntentError::TooLarge(MAX_INTENT_BYTES + 1)
        );
    }
}
