//! What the applier is configured with: which managers and kinds it serves, and the path
//! rules (protected paths, replaced subtrees) of each kind.

use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// A path of object fields, written `status.workspaceStatus.atProvider`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(into = "String")]
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

/// A rule for one kind: `Kind.group:path` (`Cluster.cluster.x-k8s.io:spec.controlPlaneEndpoint`).
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

/// A kind and its API group, written `Kind.group` (`CAPTControlPlane.controlplane.cluster.x-k8s.io`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

/// CAPT's rules (the ownership plan in README.md): the protected paths and the replaced `atProvider`.
pub const CAPT_PROTECTED: &[&str] = &[
    "CAPTControlPlane.controlplane.cluster.x-k8s.io:status.workspaceStatus.atProvider",
    "CAPTControlPlane.controlplane.cluster.x-k8s.io:spec.controlPlaneEndpoint",
    "Cluster.cluster.x-k8s.io:spec.controlPlaneEndpoint",
];

/// Subtrees CAPT mirrors whole from their source.
pub const CAPT_REPLACED: &[&str] = &[
    "CAPTControlPlane.controlplane.cluster.x-k8s.io:status.workspaceStatus.atProvider",
    "CAPTControlPlane.controlplane.cluster.x-k8s.io:status.workspaceTemplateStatus.outputs",
    "CAPTCluster.infrastructure.cluster.x-k8s.io:status.workspaceTemplateStatus.outputs",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_paths_parse_with_and_without_group() {
        let rule: KindPath = "Cluster.cluster.x-k8s.io:spec.controlPlaneEndpoint"
            .parse()
            .unwrap();
        assert_eq!(rule.kind.group, "cluster.x-k8s.io");
        assert_eq!(rule.kind.kind, "Cluster");
        assert_eq!(rule.path.segments(), ["spec", "controlPlaneEndpoint"]);
        let core: KindPath = "ConfigMap:data.x".parse().unwrap();
        assert_eq!(core.kind.to_string(), "ConfigMap");
    }

    #[test]
    fn malformed_rules_name_what_is_wrong() {
        let err = "Cluster.cluster.x-k8s.io".parse::<KindPath>().unwrap_err();
        assert!(err.contains("expected Kind.group:field.path"), "{err}");
        let err = "Cluster.cluster.x-k8s.io:spec..x"
            .parse::<KindPath>()
            .unwrap_err();
        assert!(err.contains("`spec..x`"), "{err}");
    }

    #[test]
    fn group_kind_comes_from_api_version() {
        let gk = GroupKind::from_api_version(
            "controlplane.cluster.x-k8s.io/v1beta1",
            "CAPTControlPlane",
        );
        assert_eq!(
            gk.to_string(),
            "CAPTControlPlane.controlplane.cluster.x-k8s.io"
        );
        assert_eq!(
            GroupKind::from_api_version("v1", "ConfigMap").to_string(),
            "ConfigMap"
        );
    }

    #[test]
    fn capt_defaults_parse_and_select_by_kind() {
        let policy = Policy {
            protected: CAPT_PROTECTED.iter().map(|s| s.parse().unwrap()).collect(),
            replaced: CAPT_REPLACED.iter().map(|s| s.parse().unwrap()).collect(),
            ..Policy::default()
        };
        let cp = policy.rules_for(
            &"CAPTControlPlane.controlplane.cluster.x-k8s.io"
                .parse()
                .unwrap(),
        );
        assert_eq!(cp.protected.len(), 2);
        assert_eq!(cp.replaced.len(), 2);
        let cluster = policy.rules_for(&"Cluster.cluster.x-k8s.io".parse().unwrap());
        assert_eq!(
            cluster.protected,
            vec!["spec.controlPlaneEndpoint".parse().unwrap()]
        );
        assert!(cluster.replaced.is_empty());
    }
}
