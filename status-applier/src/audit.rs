//! The field-ownership audit: every field of an object with all its co-owners (manager,
//! operation, subresource, time), and the protected-path checks: exactly the expected
//! owner, no foreign writer. Pure: objects come in as JSON, from the cluster or from
//! `kubectl get -o yaml --show-managed-fields`.

use crate::config::{FieldPath, GroupKind};
use managed_fields::{ManagedFields, Owner};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::str::FromStr;

/// A protected path and the managers that may own it: `Kind.group:path=manager`, or
/// `Kind.group:path=a|b` when a field is shared by design (one writer or the other, never a
/// third).
#[derive(Clone, Debug, PartialEq)]
pub struct Expectation {
    /// The kind.
    pub kind: GroupKind,
    /// The protected path.
    pub path: FieldPath,
    /// Its expected owners, as written (`a` or `a|b`).
    pub owner: String,
}

impl Expectation {
    fn allows(&self, manager: &str) -> bool {
        self.owner.split('|').any(|o| o == manager)
    }
}

impl FromStr for Expectation {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (rule, owner) = s
            .rsplit_once('=')
            .filter(|(_, o)| !o.is_empty() && o.split('|').all(|m| !m.is_empty()))
            .ok_or_else(|| {
                format!(
                    "invalid expectation `{s}`: expected Kind.group:field.path=manager[|manager]"
                )
            })?;
        let rule: crate::config::KindPath = rule.parse()?;
        Ok(Self {
            kind: rule.kind,
            path: rule.path,
            owner: owner.to_owned(),
        })
    }
}

/// A broken expectation.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Violation {
    /// The protected path.
    pub path: String,
    /// What is wrong.
    pub problem: String,
}

/// The audit of one object.
#[derive(Serialize, Clone, Debug)]
pub struct ObjectAudit {
    /// `Kind/namespace/name`.
    pub subject: String,
    /// Every owned field with all its owners, in path order.
    pub fields: BTreeMap<String, Vec<Owner>>,
    /// Broken expectations.
    pub violations: Vec<Violation>,
    /// The object without `managedFields` (for the annotated YAML).
    #[serde(skip)]
    pub object: Value,
}

/// Audits one object (a JSON object with `metadata.managedFields`).
pub fn audit(object: &Value, expectations: &[Expectation]) -> Result<ObjectAudit, String> {
    let kind = GroupKind::from_api_version(
        object["apiVersion"].as_str().unwrap_or_default(),
        object["kind"].as_str().unwrap_or_default(),
    );
    let subject = match object["metadata"]["namespace"].as_str() {
        Some(ns) => format!(
            "{}/{ns}/{}",
            kind.kind,
            object["metadata"]["name"].as_str().unwrap_or_default()
        ),
        None => format!(
            "{}/{}",
            kind.kind,
            object["metadata"]["name"].as_str().unwrap_or_default()
        ),
    };
    let managed = ManagedFields::from_object(object).map_err(|e| format!("{subject}: {e}"))?;
    if let Some(error) = managed.errors.first() {
        return Err(format!("{subject}: {error}"));
    }
    let fields = managed.field_owners();
    let mut bare = object.clone();
    if let Some(meta) = bare["metadata"].as_object_mut() {
        meta.remove("managedFields");
    }
    let violations = expectations
        .iter()
        .filter(|e| e.kind == kind)
        .flat_map(|e| check(e, &fields, object))
        .collect();
    Ok(ObjectAudit {
        subject,
        fields,
        violations,
        object: bare,
    })
}

/// The "present when its source has it" check: a violation when `source_has` and `object`
/// lacks `path` (dotted, like `status.mirror.observed`).
pub fn missing_from_source(
    object: &Value,
    path: &str,
    source_has: bool,
    source: &str,
) -> Option<Violation> {
    let present = path
        .split('.')
        .try_fold(object, |v, k| v.get(k))
        .is_some_and(|v| !v.is_null());
    (source_has && !present).then(|| Violation {
        path: format!(".{path}"),
        problem: format!("missing: its source ({source}) has it"),
    })
}

fn check(e: &Expectation, fields: &BTreeMap<String, Vec<Owner>>, object: &Value) -> Vec<Violation> {
    let root = format!(".{}", e.path);
    let under = |p: &str| {
        p == root || p.starts_with(&format!("{root}.")) || p.starts_with(&format!("{root}["))
    };
    let mut violations = Vec::new();
    let mut owned_by_expected = false;
    for (path, owners) in fields.iter().filter(|(p, _)| under(p)) {
        for o in owners {
            if e.allows(&o.manager) {
                owned_by_expected = true;
            } else {
                violations.push(Violation {
                    path: path.clone(),
                    problem: format!("foreign writer: {o} owns it; only {} may", e.owner),
                });
            }
        }
    }
    let present = e
        .path
        .segments()
        .iter()
        .try_fold(object, |v, k| v.get(k))
        .is_some_and(|v| !v.is_null());
    if present && !owned_by_expected {
        violations.push(Violation {
            path: root,
            problem: format!("present but not owned by {}", e.owner),
        });
    }
    violations
}

/// The audits as a table: one row per field, every owner in it.
pub fn table(audits: &[ObjectAudit]) -> String {
    let mut out = String::new();
    let width = audits
        .iter()
        .flat_map(|a| a.fields.keys())
        .map(String::len)
        .max()
        .unwrap_or(5)
        .max(5);
    for a in audits {
        let _ = writeln!(out, "{}", a.subject);
        let _ = writeln!(out, "  {:width$}  OWNERS", "FIELD");
        for (path, owners) in &a.fields {
            let owners: Vec<String> = owners.iter().map(ToString::to_string).collect();
            let _ = writeln!(out, "  {path:width$}  {}", owners.join("; "));
        }
        for v in &a.violations {
            let _ = writeln!(out, "  VIOLATION {}: {}", v.path, v.problem);
        }
    }
    out
}

/// Each object as YAML, every owned line followed by a comment naming its owners.
pub fn annotated_yaml(audits: &[ObjectAudit]) -> String {
    let mut out = String::new();
    for a in audits {
        out.push_str("---\n");
        for v in &a.violations {
            let _ = writeln!(out, "# VIOLATION {}: {}", v.path, v.problem);
        }
        emit(&a.object, "", 0, &a.fields, &mut out);
    }
    out
}

fn comment(fields: &BTreeMap<String, Vec<Owner>>, path: &str) -> String {
    match fields.get(path) {
        Some(owners) => format!(
            "  # {}",
            owners
                .iter()
                .map(|o| o.manager.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => String::new(),
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) if !s.contains('\n') => serde_yaml::to_string(s)
            .unwrap_or_default()
            .trim_end()
            .to_owned(),
        Value::Object(m) if m.is_empty() => "{}".into(),
        Value::Array(a) if a.is_empty() => "[]".into(),
        other => other.to_string(),
    }
}

fn is_scalar(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => true,
    }
}

/// Writes a map's entries at `indent`; `first` prefixes the first line (a list item's `- `).
fn emit(
    v: &Value,
    path: &str,
    indent: usize,
    fields: &BTreeMap<String, Vec<Owner>>,
    out: &mut String,
) {
    let Value::Object(map) = v else { return };
    for (k, child) in map {
        let here = format!("{path}.{k}");
        let pad = " ".repeat(indent);
        if is_scalar(child) {
            let _ = writeln!(out, "{pad}{k}: {}{}", scalar(child), comment(fields, &here));
            continue;
        }
        let _ = writeln!(out, "{pad}{k}:{}", comment(fields, &here));
        match child {
            Value::Object(_) => emit(child, &here, indent + 2, fields, out),
            Value::Array(items) => emit_list(items, &here, indent, fields, out),
            _ => {}
        }
    }
}

fn emit_list(
    items: &[Value],
    path: &str,
    indent: usize,
    fields: &BTreeMap<String, Vec<Owner>>,
    out: &mut String,
) {
    let pad = " ".repeat(indent);
    for (i, item) in items.iter().enumerate() {
        let here = match item["type"].as_str() {
            Some(t) => format!("{path}[type={t}]"),
            None => format!("{path}[{i}]"),
        };
        if is_scalar(item) {
            let value_path = format!("{path}[={item}]");
            let _ = writeln!(
                out,
                "{pad}- {}{}",
                scalar(item),
                comment(fields, &value_path)
            );
            continue;
        }
        let mut nested = String::new();
        emit(item, &here, indent + 2, fields, &mut nested);
        let _ = writeln!(out, "{pad}-{}", comment(fields, &here));
        out.push_str(&nested);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn widget(managed: Value) -> Value {
        json!({"apiVersion": "example.com/v1", "kind": "Widget",
               "metadata": {"name": "demo", "namespace": "default", "managedFields": managed},
               "spec": {"endpoint": {"host": "h", "port": 443}},
               "status": {"phase": "Ready", "mirror": {"observed": {"checksum": "c"}},
                          "conditions": [{"type": "Ready", "status": "True"}]}})
    }

    fn entry(manager: &str, op: &str, sub: &str, fields: Value) -> Value {
        json!({"manager": manager, "operation": op, "subresource": sub, "time": "2026-11-25T00:00:00Z", "fieldsV1": fields})
    }

    fn expectations() -> Vec<Expectation> {
        [
            "Widget.example.com:status.mirror.observed=widget-controller",
            "Widget.example.com:spec.endpoint=widget-controller",
            "Gadget.example.com:spec.endpoint=gadget-writer|manager",
        ]
        .iter()
        .map(|e| e.parse().unwrap())
        .collect()
    }

    #[test]
    fn every_field_lists_all_its_co_owners() {
        let obj = widget(json!([
            entry(
                "widget-controller",
                "Apply",
                "status",
                json!({"f:status": {"f:phase": {}, "f:mirror": {"f:observed": {"f:checksum": {}}}}})
            ),
            entry(
                "other-controller",
                "Update",
                "status",
                json!({"f:status": {"f:phase": {}}})
            ),
            entry(
                "widget-controller",
                "Apply",
                "",
                json!({"f:spec": {"f:endpoint": {"f:host": {}, "f:port": {}}}})
            ),
        ]));
        let a = audit(&obj, &expectations()).unwrap();
        let phase: Vec<&str> = a.fields[".status.phase"]
            .iter()
            .map(|o| o.manager.as_str())
            .collect();
        assert_eq!(phase, ["widget-controller", "other-controller"]);
        assert!(a.violations.is_empty(), "{:?}", a.violations);
        let table = table(&[a]);
        assert!(table.contains("widget-controller (Apply, status, 2026-11-25T00:00:00Z); other-controller (Update, status"), "{table}");
    }

    #[test]
    fn a_shared_expectation_allows_either_owner_and_no_third() {
        let e: Expectation = "Gadget.example.com:spec.endpoint=gadget-writer|manager"
            .parse()
            .unwrap();
        assert!(e.allows("gadget-writer") && e.allows("manager") && !e.allows("kubectl"));
        assert!(
            "Gadget.example.com:spec.x=a|"
                .parse::<Expectation>()
                .is_err()
        );
    }

    #[test]
    fn a_foreign_owner_of_a_protected_path_is_a_violation() {
        let obj = widget(json!([
            entry(
                "widget-controller",
                "Apply",
                "status",
                json!({"f:status": {"f:mirror": {"f:observed": {"f:checksum": {}}}}})
            ),
            entry(
                "intruder",
                "Update",
                "status",
                json!({"f:status": {"f:mirror": {"f:observed": {"f:checksum": {}}}}})
            ),
            entry(
                "widget-controller",
                "Apply",
                "",
                json!({"f:spec": {"f:endpoint": {"f:host": {}, "f:port": {}}}})
            ),
        ]));
        let a = audit(&obj, &expectations()).unwrap();
        assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
        assert_eq!(a.violations[0].path, ".status.mirror.observed.checksum");
        assert!(
            a.violations[0]
                .problem
                .contains("foreign writer: intruder (Update, status"),
            "{:?}",
            a.violations
        );
    }

    #[test]
    fn a_protected_value_nobody_expected_owns_is_a_violation() {
        let obj = widget(json!([entry(
            "widget-controller",
            "Apply",
            "status",
            json!({"f:status": {"f:mirror": {"f:observed": {"f:checksum": {}}}}})
        ),]));
        let a = audit(&obj, &expectations()).unwrap();
        assert_eq!(
            a.violations,
            vec![Violation {
                path: ".spec.endpoint".into(),
                problem: "present but not owned by widget-controller".into(),
            }]
        );
    }

    #[test]
    fn the_annotated_yaml_names_owners_on_their_lines() {
        let obj = widget(json!([entry(
            "widget-controller",
            "Apply",
            "status",
            json!({"f:status": {"f:phase": {}, "f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}, "f:type": {}}}}})
        ),]));
        let yaml = annotated_yaml(&[audit(&obj, &[]).unwrap()]);
        assert!(
            yaml.contains("  phase: Ready  # widget-controller"),
            "{yaml}"
        );
        assert!(
            yaml.contains("    status: 'True'  # widget-controller"),
            "{yaml}"
        );
        assert!(!yaml.contains("managedFields"), "{yaml}");
        let parsed: serde_yaml::Value =
            serde_yaml::from_str(yaml.trim_start_matches("---\n")).unwrap();
        assert_eq!(
            parsed["status"]["phase"],
            serde_yaml::Value::from("Ready"),
            "the annotated YAML is YAML"
        );
    }

    #[test]
    fn a_value_missing_while_its_source_has_it_is_a_violation() {
        let obj = json!({"status": {"mirror": {"ready": true}}});
        let v = missing_from_source(&obj, "status.mirror.observed", true, "Gadget g").unwrap();
        assert_eq!(v.problem, "missing: its source (Gadget g) has it");
        assert!(missing_from_source(&obj, "status.mirror.observed", false, "Gadget g").is_none());
        let with = json!({"status": {"mirror": {"observed": {"checksum": "c"}}}});
        assert!(missing_from_source(&with, "status.mirror.observed", true, "Gadget g").is_none());
    }

    #[test]
    fn malformed_expectations_name_the_problem() {
        let err = "Gadget.example.com:spec.endpoint"
            .parse::<Expectation>()
            .unwrap_err();
        assert!(
            err.contains("expected Kind.group:field.path=manager"),
            "{err}"
        );
    }
}
