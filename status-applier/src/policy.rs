//! The policy file (`--policy FILE`): the rules a deployment gives the sidecar. Nothing is
//! built in: without a file (and without the flags that override its sections) nothing is
//! protected, replaced, expected or checked.
//!
//! ```yaml
//! allowedManagers: [acme-writer]          # intents from other managers are refused
//! allowedKinds: [ConfigMap]               # Kind.group; intents for other kinds are refused
//! forceManagers: []                       # conflicts outside protected paths are forced
//! watchKinds:                             # watched from the start
//!   - {apiVersion: v1, kind: ConfigMap}
//! protected:                              # never removed unless an intent releases them
//!   - {kind: ConfigMap, path: data.owner}
//! replaced:                               # replaced whole instead of merged key by key
//!   - {kind: ConfigMap, path: data.snapshot}
//! audit:
//!   kinds: [ConfigMap]                    # read by `audit` when no target is named
//!   expectations:                         # a protected path and its only owners
//!     - {kind: ConfigMap, path: data.owner, owners: [acme-writer]}
//!   sourceChecks:                         # present when its source has it
//!     - kind: Widget.example.com
//!       path: status.observed
//!       source:
//!         lookup:                         # followed from the object, one object a step
//!           - {apiVersion: example.com/v1, kind: Gadget, scope: Namespaced, nameFrom: spec.gadgetName}
//!         path: status.observed
//! ```

use crate::audit::Expectation;
use crate::config::{FieldPath, GroupKind, KindPath, Policy};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// The policy file, as written.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicyFile {
    /// Field managers accepted in intents; empty accepts any valid name.
    #[serde(default)]
    pub allowed_managers: Vec<String>,
    /// Kinds accepted in intents; empty accepts any.
    #[serde(default)]
    pub allowed_kinds: Vec<GroupKind>,
    /// Managers whose conflicts outside protected paths are forced.
    #[serde(default)]
    pub force_managers: Vec<String>,
    /// Kinds watched from the start, so documents are rebuilt before the first intent.
    #[serde(default)]
    pub watch_kinds: Vec<WatchKind>,
    /// Protected paths.
    #[serde(default)]
    pub protected: Vec<PathRule>,
    /// Replaced subtrees.
    #[serde(default)]
    pub replaced: Vec<PathRule>,
    /// What `audit` checks.
    #[serde(default)]
    pub audit: AuditPolicy,
}

/// A kind to watch.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WatchKind {
    /// `group/version`, or `v1` for the core group.
    pub api_version: String,
    /// Kind.
    pub kind: String,
}

/// A path of one kind.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PathRule {
    /// `Kind.group`.
    pub kind: GroupKind,
    /// The path in objects of that kind.
    pub path: FieldPath,
}

impl From<PathRule> for KindPath {
    fn from(r: PathRule) -> Self {
        KindPath {
            kind: r.kind,
            path: r.path,
        }
    }
}

/// What `audit` checks.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AuditPolicy {
    /// Kinds read when no target is named.
    #[serde(default)]
    pub kinds: Vec<GroupKind>,
    /// Protected paths and their only owners.
    #[serde(default)]
    pub expectations: Vec<ExpectationRule>,
    /// Paths that must be present when their source has its own.
    #[serde(default)]
    pub source_checks: Vec<SourceCheck>,
}

/// A protected path and the managers that may own it (several when shared by design).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExpectationRule {
    /// `Kind.group`.
    pub kind: GroupKind,
    /// The protected path.
    pub path: FieldPath,
    /// Its only owners.
    pub owners: Vec<String>,
}

impl From<ExpectationRule> for Expectation {
    fn from(r: ExpectationRule) -> Self {
        Expectation {
            kind: r.kind,
            path: r.path,
            owner: r.owners.join("|"),
        }
    }
}

/// "Present when its source has it": an object of `kind` must carry `path` when the object
/// found by `source.lookup` carries `source.path`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SourceCheck {
    /// `Kind.group` of the checked objects.
    pub kind: GroupKind,
    /// The path that must be present.
    pub path: FieldPath,
    /// Where the value comes from.
    pub source: Source,
}

/// The source of a checked path.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// The steps from the checked object to the source: each names an object read from the
    /// one before (the first from the checked object); the last is the source.
    pub lookup: Vec<LookupStep>,
    /// The path of the source that, when present, requires ours.
    pub path: FieldPath,
}

/// One object on the way to a source.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LookupStep {
    /// `group/version`, or `v1`.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// `Namespaced` (in the namespace of the object before) or `Cluster`.
    pub scope: Scope,
    /// A field of the object before that holds the name.
    #[serde(default)]
    pub name_from: Option<FieldPath>,
    /// A name template: `{field.path}` is replaced by that field of the object before
    /// (`{metadata.name}-state`).
    #[serde(default)]
    pub name_template: Option<String>,
}

/// Where objects of a kind live.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub enum Scope {
    /// In a namespace.
    Namespaced,
    /// Cluster-wide.
    Cluster,
}

impl LookupStep {
    /// The name of this step's object, read from the object before; `None` when a field it
    /// needs is missing (then there is no source, and nothing to check).
    pub fn name_in(&self, before: &Value) -> Option<String> {
        if let Some(path) = &self.name_from {
            return path.lookup(before)?.as_str().map(str::to_owned);
        }
        let template = self.name_template.as_deref()?;
        let mut name = String::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            name.push_str(&rest[..open]);
            let close = open + rest[open..].find('}')?;
            let path: FieldPath = rest[open + 1..close].parse().ok()?;
            match path.lookup(before)? {
                Value::String(s) => name.push_str(s),
                Value::Number(n) => name.push_str(&n.to_string()),
                _ => return None,
            }
            rest = &rest[close + 1..];
        }
        name.push_str(rest);
        Some(name)
    }

    fn validate(&self) -> Result<(), String> {
        match (&self.name_from, &self.name_template) {
            (None, None) => return Err("give nameFrom or nameTemplate".into()),
            (Some(_), Some(_)) => return Err("give nameFrom or nameTemplate, not both".into()),
            _ => {}
        }
        if let Some(t) = &self.name_template {
            let mut rest = t.as_str();
            while let Some(open) = rest.find('{') {
                let close = rest[open..]
                    .find('}')
                    .map(|c| open + c)
                    .ok_or_else(|| format!("nameTemplate `{t}`: a `{{` is never closed"))?;
                rest[open + 1..close]
                    .parse::<FieldPath>()
                    .map_err(|e| format!("nameTemplate `{t}`: {e}"))?;
                rest = &rest[close + 1..];
            }
        }
        if self.api_version.is_empty() || self.kind.is_empty() {
            return Err("apiVersion and kind must not be empty".into());
        }
        Ok(())
    }
}

impl PolicyFile {
    /// Reads and checks a policy file; errors name the file, the entry and what is wrong.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading the policy file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("policy file {}: {e}", path.display()))
    }

    /// Parses and checks the text of a policy file.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let file: Self = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        file.validate()?;
        Ok(file)
    }

    fn validate(&self) -> Result<(), String> {
        let names = |section: &str, names: &[String]| {
            names.iter().enumerate().try_for_each(|(i, m)| {
                if m.is_empty() {
                    Err(format!("{section}[{i}]: an empty manager name"))
                } else {
                    Ok(())
                }
            })
        };
        names("allowedManagers", &self.allowed_managers)?;
        names("forceManagers", &self.force_managers)?;
        for (i, w) in self.watch_kinds.iter().enumerate() {
            if w.api_version.is_empty() || w.kind.is_empty() {
                return Err(format!(
                    "watchKinds[{i}]: apiVersion and kind must not be empty"
                ));
            }
        }
        for (i, e) in self.audit.expectations.iter().enumerate() {
            if e.owners.is_empty() || e.owners.iter().any(String::is_empty) {
                return Err(format!(
                    "audit.expectations[{i}] ({}:{}): owners must name at least one manager, none empty",
                    e.kind, e.path
                ));
            }
        }
        for (i, c) in self.audit.source_checks.iter().enumerate() {
            if c.source.lookup.is_empty() {
                return Err(format!(
                    "audit.sourceChecks[{i}] ({}:{}): source.lookup needs at least one step",
                    c.kind, c.path
                ));
            }
            for (j, step) in c.source.lookup.iter().enumerate() {
                step.validate().map_err(|e| {
                    format!(
                        "audit.sourceChecks[{i}].source.lookup[{j}] ({}): {e}",
                        step.kind
                    )
                })?;
            }
        }
        Ok(())
    }

    /// The serving policy of this file.
    pub fn serving(&self) -> Policy {
        Policy {
            allowed_managers: self.allowed_managers.clone(),
            allowed_kinds: self.allowed_kinds.clone(),
            protected: self.protected.iter().cloned().map(Into::into).collect(),
            replaced: self.replaced.iter().cloned().map(Into::into).collect(),
            force_managers: self.force_managers.clone(),
        }
    }

    /// The audit's expectations of this file.
    pub fn expectations(&self) -> Vec<Expectation> {
        self.audit
            .expectations
            .iter()
            .cloned()
            .map(Into::into)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const EXAMPLE: &str = r#"
allowedManagers: [acme-writer]
allowedKinds: [ConfigMap, Widget.example.com]
watchKinds:
  - {apiVersion: v1, kind: ConfigMap}
protected:
  - {kind: ConfigMap, path: data.owner}
replaced:
  - {kind: Widget.example.com, path: status.observed}
audit:
  kinds: [ConfigMap]
  expectations:
    - {kind: ConfigMap, path: data.owner, owners: [acme-writer, acme-backup]}
  sourceChecks:
    - kind: Widget.example.com
      path: status.observed
      source:
        lookup:
          - {apiVersion: example.com/v1, kind: Gadget, scope: Namespaced, nameFrom: spec.gadgetName}
          - {apiVersion: example.com/v1, kind: Part, scope: Cluster, nameTemplate: "{status.part}-x"}
        path: status.observed
"#;

    #[test]
    fn the_example_parses_into_rules() {
        let file = PolicyFile::parse(EXAMPLE).unwrap();
        let policy = file.serving();
        assert_eq!(policy.allowed_managers, ["acme-writer"]);
        assert_eq!(policy.allowed_kinds.len(), 2);
        let cm = policy.rules_for(&"ConfigMap".parse().unwrap());
        assert_eq!(cm.protected, vec!["data.owner".parse().unwrap()]);
        let widget = policy.rules_for(&"Widget.example.com".parse().unwrap());
        assert_eq!(widget.replaced, vec!["status.observed".parse().unwrap()]);
        assert_eq!(file.watch_kinds[0].api_version, "v1");
        let e = &file.expectations()[0];
        assert_eq!(e.owner, "acme-writer|acme-backup");
        let check = &file.audit.source_checks[0];
        assert_eq!(check.source.lookup[0].scope, Scope::Namespaced);
        assert_eq!(check.source.lookup[1].scope, Scope::Cluster);
    }

    #[test]
    fn the_empty_file_is_the_empty_policy() {
        for text in ["", "# nothing\n", "{}"] {
            assert_eq!(PolicyFile::parse(text).unwrap(), PolicyFile::default());
        }
        let policy = PolicyFile::default().serving();
        assert!(policy.protected.is_empty() && policy.replaced.is_empty());
    }

    #[test]
    fn errors_name_the_entry_and_the_problem() {
        let err =
            PolicyFile::parse("protected:\n  - {kind: ConfigMap, paht: data.x}\n").unwrap_err();
        assert!(
            err.contains("protected[0]") && err.contains("unknown field `paht`"),
            "{err}"
        );
        let err = PolicyFile::parse("protectd: []\n").unwrap_err();
        assert!(err.contains("unknown field `protectd`"), "{err}");
        let err =
            PolicyFile::parse("replaced:\n  - {kind: ConfigMap, path: data..x}\n").unwrap_err();
        assert!(
            err.contains("replaced[0]") && err.contains("`data..x`"),
            "{err}"
        );
        let err = PolicyFile::parse(
            "audit:\n  expectations:\n    - {kind: ConfigMap, path: data.x, owners: []}\n",
        )
        .unwrap_err();
        assert!(
            err.contains("audit.expectations[0] (ConfigMap:data.x)"),
            "{err}"
        );
        let err = PolicyFile::parse(
            "audit:\n  sourceChecks:\n    - kind: ConfigMap\n      path: data.x\n      source:\n        lookup:\n          - {apiVersion: v1, kind: Secret, scope: Namespaced}\n        path: data.x\n",
        )
        .unwrap_err();
        assert!(
            err.contains(
                "audit.sourceChecks[0].source.lookup[0] (Secret): give nameFrom or nameTemplate"
            ),
            "{err}"
        );
        let err = PolicyFile::parse(
            "audit:\n  sourceChecks:\n    - kind: ConfigMap\n      path: data.x\n      source:\n        lookup:\n          - {apiVersion: v1, kind: Secret, scope: Somewhere, nameFrom: data.y}\n        path: data.x\n",
        )
        .unwrap_err();
        assert!(err.contains("unknown variant `Somewhere`"), "{err}");
    }

    #[test]
    fn a_read_error_names_the_file() {
        let err = PolicyFile::read(Path::new("/nonexistent/policy.yaml")).unwrap_err();
        assert!(err.contains("/nonexistent/policy.yaml"), "{err}");
    }

    #[test]
    fn names_come_from_a_field_or_a_template() {
        let step = |from: Option<&str>, template: Option<&str>| LookupStep {
            api_version: "v1".into(),
            kind: "Secret".into(),
            scope: Scope::Namespaced,
            name_from: from.map(|f| f.parse().unwrap()),
            name_template: template.map(str::to_owned),
        };
        let obj = json!({"metadata": {"name": "demo"}, "spec": {"ref": "r1", "n": 3}});
        assert_eq!(
            step(Some("spec.ref"), None).name_in(&obj).as_deref(),
            Some("r1")
        );
        assert_eq!(step(Some("spec.none"), None).name_in(&obj), None);
        assert_eq!(
            step(None, Some("{metadata.name}-state-{spec.n}"))
                .name_in(&obj)
                .as_deref(),
            Some("demo-state-3")
        );
        assert_eq!(step(None, Some("{spec.none}-x")).name_in(&obj), None);
        assert_eq!(
            step(None, Some("fixed")).name_in(&obj).as_deref(),
            Some("fixed")
        );
    }
}
