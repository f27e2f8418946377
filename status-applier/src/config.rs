//! What the applier is configured with: which managers and kinds it serves, and the path
//! rules (protected paths, replaced subtrees) of each kind.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A path of object fields, written `status.observed.summary`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct FieldPath(Vec<String>);

impl FieldPath {
    /// The field names from the root.
    pub fn segments(&self) -> &[String] {
        &self.0
    }

    /// True when `other` is this path or lies below it.
    pub fn contains(&self, other: &FieldPath) -> bool {
        other.0.starts_with(&self.0)
    }

    /// The value at this path in `object`, when present and not null.
    pub fn lookup<'a>(&self, object: &'a serde_json::Value) -> Option<&'a serde_json::Value> {
        self.0
            .iter()
            .try_fold(object, |v, k| v.get(k))
            .filter(|v| !v.is_null())
    }
}

impl TryFrom<String> for FieldPath {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl FromStr for FieldPath {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.strip_prefix('.').unwrap_or(s);
        let segments: Vec<String> = trimmed.split('.').map(str::to_owned).collect();
        if trimmed.is_empty() || segments.iter().any(String::is_empty) {
            return Err(format!(
                "invalid field path `{s}`: expected names separated by dots, like status.phase"
            ));
        }
        Ok(Self(segments))
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("."))
    }
}

impl From<FieldPath> for String {
    fn from(p: FieldPath) -> String {
        p.to_string()
    }
}

/// A rule for one kind: `Kind.group:path` (`Widget.example.com:spec.endpoint`).
/// The core group is written without a dot suffix (`ConfigMap:data.key`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KindPath {
    /// The kind and group, `Kind.group`.
    pub kind: GroupKind,
    /// The path inside objects of that kind.
    pub path: FieldPath,
}

impl FromStr for KindPath {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, path) = s
            .split_once(':')
            .ok_or_else(|| format!("invalid rule `{s}`: expected Kind.group:field.path"))?;
        Ok(Self {
            kind: kind.parse()?,
            path: path.parse()?,
        })
    }
}

/// A kind and its API group, written `Kind.group` (`Widget.example.com`; `ConfigMap` for the
/// core group).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub struct GroupKind {
    /// API group; empty for the core group.
    pub group: String,
    /// Kind.
    pub kind: String,
}

impl GroupKind {
    /// The group and kind of an `apiVersion` (`group/version` or `version`) and kind.
    pub fn from_api_version(api_version: &str, kind: &str) -> Self {
        let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
        Self {
            group: group.to_owned(),
            kind: kind.to_owned(),
        }
    }
}

impl FromStr for GroupKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, group) = s.split_once('.').unwrap_or((s, ""));
        if kind.is_empty() {
            return Err(format!("invalid kind `{s}`: expected Kind.group"));
        }
        Ok(Self {
            group: group.to_owned(),
            kind: kind.to_owned(),
        })
    }
}

impl TryFrom<String> for GroupKind {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl fmt::Display for GroupKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.group.as_str() {
            "" => f.write_str(&self.kind),
            g => write!(f, "{}.{g}", self.kind),
        }
    }
}

/// The path rules of one kind.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PathRules {
    /// Never removed or emptied unless an intent releases them; never forced.
    pub protected: Vec<FieldPath>,
    /// Replaced whole by a fragment that carries them, instead of merged key by key.
    pub replaced: Vec<FieldPath>,
}

/// The applier's policy: who may submit what, and the path rules per kind.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// Field managers accepted in intents; empty accepts any valid name.
    pub allowed_managers: Vec<String>,
    /// Kinds accepted in intents; empty accepts any.
    pub allowed_kinds: Vec<GroupKind>,
    /// Protected paths, per kind.
    pub protected: Vec<KindPath>,
    /// Replaced subtrees, per kind.
    pub replaced: Vec<KindPath>,
    /// Managers whose conflicts on paths that are not protected may be forced.
    pub force_managers: Vec<String>,
}

impl Policy {
    /// The path rules of a kind.
    pub fn rules_for(&self, kind: &GroupKind) -> PathRules {
        let select = |rules: &[KindPath]| {
            rules
                .iter()
                .filter(|r| &r.kind == kind)
                .map(|r| r.path.clone())
                .collect::<Vec<_>>()
        };
        PathRules {
            protected: select(&self.protected),
            replaced: select(&self.replaced),
        }
    }

    /// True when the manager may submit intents.
    pub fn allows_manager(&self, manager: &str) -> bool {
        self.allowed_managers.is_empty() || self.allowed_managers.iter().any(|m| m == manager)
    }

    /// True when intents may target the kind.
    pub fn allows_kind(&self, kind: &GroupKind) -> bool {
        self.allowed_kinds.is_empty() || self.allowed_kinds.contains(kind)
    }

    /// True when the manager's conflicts outside protected paths may be forced.
    pub fn may_force(&self, manager: &str) -> bool {
        self.force_managers.iter().any(|m| m == manager)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_paths_parse_with_and_without_group() {
        let rule: KindPath = "Widget.example.com:spec.endpoint".parse().unwrap();
        assert_eq!(rule.kind.group, "example.com");
        assert_eq!(rule.kind.kind, "Widget");
        assert_eq!(rule.path.segments(), ["spec", "endpoint"]);
        let core: KindPath = "ConfigMap:data.x".parse().unwrap();
        assert_eq!(core.kind.to_string(), "ConfigMap");
    }

    #[test]
    fn malformed_rules_name_what_is_wrong() {
        let err = "Widget.example.com".parse::<KindPath>().unwrap_err();
        assert!(err.contains("expected Kind.group:field.path"), "{err}");
        let err = "Widget.example.com:spec..x"
            .parse::<KindPath>()
            .unwrap_err();
        assert!(err.contains("`spec..x`"), "{err}");
    }

    #[test]
    fn group_kind_comes_from_api_version() {
        let gk = GroupKind::from_api_version("example.com/v1", "Widget");
        assert_eq!(gk.to_string(), "Widget.example.com");
        assert_eq!(
            GroupKind::from_api_version("v1", "ConfigMap").to_string(),
            "ConfigMap"
        );
    }

    #[test]
    fn rules_select_by_kind() {
        let rule = |s: &str| s.parse::<KindPath>().unwrap();
        let policy = Policy {
            protected: vec![
                rule("Widget.example.com:status.observed"),
                rule("Widget.example.com:spec.endpoint"),
                rule("ConfigMap:data.owner"),
            ],
            replaced: vec![rule("Widget.example.com:status.observed")],
            ..Policy::default()
        };
        let widget = policy.rules_for(&"Widget.example.com".parse().unwrap());
        assert_eq!(widget.protected.len(), 2);
        assert_eq!(widget.replaced.len(), 1);
        let cm = policy.rules_for(&"ConfigMap".parse().unwrap());
        assert_eq!(cm.protected, vec!["data.owner".parse().unwrap()]);
        assert!(cm.replaced.is_empty());
        assert_eq!(
            Policy::default().rules_for(&"ConfigMap".parse().unwrap()),
            PathRules::default(),
            "the default policy has no rule"
        );
    }
}
