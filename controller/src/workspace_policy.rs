//! What a rendered Workspace may ask of provider-terraform. Pure: no API server.
//!
//! Even a trusted template (`tenancy`: only those are rendered) does not decide the
//! credentials, the state, where the outputs go, or whether the Workspace is destroyed: the
//! operator does, and these rules hold for every rendered Workspace:
//!
//! - `spec.providerConfigRef` (absent: Crossplane's `default`) must be a ProviderConfig the
//!   operator allowed for the apply's namespace (`--allow-provider-config NAMESPACE=NAME`,
//!   `*` for every namespace): team A's template never runs with team B's cloud credentials.
//! - No `crossplane.io/*` annotation: `crossplane.io/external-name` names the Terraform
//!   workspace in the backend (another team's state, read or destroyed), `crossplane.io/paused`
//!   and the creation annotations are the provider's bookkeeping.
//! - No argument that changes the backend or where code and state come from (`-backend…`,
//!   `-reconfigure`, `-migrate-state`, `-force-copy`, `-from-module`, `-plugin-dir`,
//!   `-state…`, `-chdir`) in `forProvider.initArgs`, `planArgs`, `applyArgs` or
//!   `destroyArgs`.
//! - No `spec.deletionPolicy: Orphan`: provider-terraform would drop the Workspace without
//!   destroying anything, and the deletion of the cluster would end with its infrastructure
//!   and Terraform state left behind, unseen. Keeping infrastructure is CAPT's to decide
//!   (`retainVpcOnDelete`); a rendered Workspace always says `Delete` (`render`).
//! - No `spec.managementPolicies` without `Delete` (or `*`): provider-terraform enables
//!   management policies, and a Workspace without `Delete` is never destroyed, whatever its
//!   `deletionPolicy` says: the same leak as `Orphan`.
//! - No `TF_CLI_ARGS` or `TF_CLI_ARGS_<command>` in `forProvider.env`: Terraform adds them to
//!   its command line, round the argument checks above.
//! - No `forProvider.entrypoint` that leaves the Workspace's directory (absolute, or with a
//!   `..` segment): provider-terraform runs each Workspace in `/tf/<uid>` beside the others,
//!   and strips `../` only once (`....//<uid>` becomes `../<uid>`).
//! - No `spec.publishConnectionDetailsTo`: a store configuration is cluster-scoped and may
//!   write anywhere; the connection Secret (`writeConnectionSecretToRef`) stays in the
//!   apply's namespace (`tenancy`).
//!
//! Anything else is refused before rendering, with the field named, and nothing is applied.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Condition reason (and Warning Event reason) of an apply whose render the policy refuses.
pub const NOT_ALLOWED: &str = "WorkspaceNotAllowed";
/// Crossplane's ProviderConfig when a managed resource names none.
pub const DEFAULT_PROVIDER_CONFIG: &str = "default";
/// The key of the rule for every namespace.
pub const EVERY_NAMESPACE: &str = "*";

/// Terraform CLI flags that change the backend, the state or where the code comes from.
const FORBIDDEN_FLAGS: &[&str] = &[
    "-backend",
    "-reconfigure",
    "-migrate-state",
    "-force-copy",
    "-from-module",
    "-plugin-dir",
    "-state",
    "-chdir",
];
const ARGUMENT_LISTS: &[&str] = &["initArgs", "planArgs", "applyArgs", "destroyArgs"];

/// The operator's rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkspacePolicy {
    /// Namespace (or [`EVERY_NAMESPACE`]) → the ProviderConfigs its applies may use.
    provider_configs: BTreeMap<String, BTreeSet<String>>,
}

impl Default for WorkspacePolicy {
    /// Every namespace may use Crossplane's `default` ProviderConfig, and no other.
    fn default() -> Self {
        Self::parse(&[format!("{EVERY_NAMESPACE}={DEFAULT_PROVIDER_CONFIG}")])
            .expect("the default rule parses")
    }
}

impl WorkspacePolicy {
    /// Rules of the form `NAMESPACE=NAME` (`*=NAME` for every namespace); an empty list
    /// allows no ProviderConfig at all.
    pub fn parse(rules: &[String]) -> Result<Self, String> {
        let mut provider_configs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for rule in rules {
            let Some((namespace, name)) = rule.split_once('=') else {
                return Err(format!(
                    "--allow-provider-config {rule:?}: expected NAMESPACE=NAME (or *=NAME)"
                ));
            };
            let (namespace, name) = (namespace.trim(), name.trim());
            if namespace.is_empty() || name.is_empty() {
                return Err(format!(
                    "--allow-provider-config {rule:?}: the namespace and the ProviderConfig's \
                     name must both be given"
                ));
            }
            provider_configs
                .entry(namespace.to_owned())
                .or_default()
                .insert(name.to_owned());
        }
        Ok(Self { provider_configs })
    }

    /// The ProviderConfigs the applies of `namespace` may use.
    fn provider_configs(&self, namespace: &str) -> BTreeSet<&str> {
        [namespace, EVERY_NAMESPACE]
            .iter()
            .filter_map(|ns| self.provider_configs.get(*ns))
            .flatten()
            .map(String::as_str)
            .collect()
    }

    /// True when an apply of namespace `a` and one of `b` may render Workspaces under one
    /// ProviderConfig (the same credentials, the same cloud account): then their names could
    /// meet in Terraform (`crate::names`).
    pub fn share_a_provider_config(&self, a: &str, b: &str) -> bool {
        !self
            .provider_configs(a)
            .is_disjoint(&self.provider_configs(b))
    }

    fn allows_provider_config(&self, namespace: &str, name: &str) -> bool {
        [namespace, EVERY_NAMESPACE]
            .iter()
            .filter_map(|ns| self.provider_configs.get(*ns))
            .any(|names| names.contains(name))
    }

    /// Why the Workspace `rendered` for an apply of `namespace` is refused, or `None`.
    pub fn refusal(&self, namespace: &str, rendered: &Value) -> Option<String> {
        let spec = &rendered["spec"];
        let config = spec["providerConfigRef"]["name"]
            .as_str()
            .unwrap_or(DEFAULT_PROVIDER_CONFIG);
        if !self.allows_provider_config(namespace, config) {
            return Some(format!(
                "spec.providerConfigRef names ProviderConfig {config:?}, which the operator has \
                 not allowed for namespace {namespace} (--allow-provider-config); nothing is \
                 rendered"
            ));
        }
        let annotations = rendered["metadata"]["annotations"].as_object();
        if let Some(key) = annotations
            .into_iter()
            .flat_map(|a| a.keys())
            .find(|k| k.split('/').next().is_some_and(crossplane_prefix))
        {
            return Some(format!(
                "metadata.annotations.{key}: crossplane.io annotations are the provider's \
                 (external-name selects the Terraform state); a template may not set them"
            ));
        }
        for list in ARGUMENT_LISTS {
            let args = spec["forProvider"][list].as_array().into_iter().flatten();
            for (i, arg) in args.enumerate() {
                let arg = arg.as_str().unwrap_or("");
                if let Some(flag) = forbidden_flag(arg) {
                    return Some(format!(
                        "spec.forProvider.{list}[{i}] is {flag}: arguments that change the \
                         backend, the state or where the code comes from are not allowed"
                    ));
                }
            }
        }
        if let Some(policy) = spec["deletionPolicy"]
            .as_str()
            .filter(|p| *p != crate::render::DELETION_POLICY)
        {
            return Some(format!(
                "spec.deletionPolicy {policy:?} is not allowed: deleting the cluster would leave \
                 its infrastructure and Terraform state behind with nothing to show or destroy \
                 them (a VPC is kept by the CAPTCluster's spec.retainVpcOnDelete)"
            ));
        }
        if let Some(policies) = spec["managementPolicies"].as_array() {
            let deletes = policies
                .iter()
                .any(|p| matches!(p.as_str(), Some("*" | "Delete")));
            if !deletes {
                return Some(format!(
                    "spec.managementPolicies {} has neither Delete nor *: the Workspace would \
                     never be destroyed, its infrastructure and Terraform state left behind \
                     whatever deletionPolicy says",
                    Value::Array(policies.clone())
                ));
            }
        }
        let env = spec["forProvider"]["env"].as_array().into_iter().flatten();
        for (i, var) in env.enumerate() {
            let name = var["name"].as_str().unwrap_or("");
            if name == "TF_CLI_ARGS" || name.starts_with("TF_CLI_ARGS_") {
                return Some(format!(
                    "spec.forProvider.env[{i}] is {name}: Terraform adds it to every command \
                     line, round the checks of the arguments; not allowed"
                ));
            }
        }
        if let Some(entrypoint) = spec["forProvider"]["entrypoint"].as_str()
            && leaves_directory(entrypoint)
        {
            return Some(format!(
                "spec.forProvider.entrypoint {entrypoint:?} leaves the Workspace's directory \
                 (absolute, or a '..' segment once provider-terraform strips '../'): another \
                 Workspace's files; not allowed"
            ));
        }
        if !spec["publishConnectionDetailsTo"].is_null() {
            return Some(
                "spec.publishConnectionDetailsTo is not allowed: connection details go to \
                 the Secret of writeConnectionSecretToRef, in the apply's namespace"
                    .into(),
            );
        }
        None
    }
}

/// True when `entrypoint` is absolute or has a segment of dots only beyond `.` (`..`, and
/// `....`, which becomes `..` once provider-terraform strips `../`), or a backslash.
fn leaves_directory(entrypoint: &str) -> bool {
    entrypoint.starts_with('/')
        || entrypoint.contains('\\')
        || entrypoint
            .split('/')
            .any(|segment| segment.len() > 1 && segment.chars().all(|c| c == '.'))
}

/// `crossplane.io` and its subdomains (`meta.crossplane.io`, ...).
fn crossplane_prefix(prefix: &str) -> bool {
    prefix == "crossplane.io" || prefix.ends_with(".crossplane.io")
}

/// The forbidden flag `arg` is (`-flag`, `--flag`, `-flag=value`), if any.
fn forbidden_flag(arg: &str) -> Option<&'static str> {
    let flag = arg.trim_start_matches('-');
    let flag = flag.split('=').next().unwrap_or(flag);
    FORBIDDEN_FLAGS
        .iter()
        .find(|f| flag.starts_with(f.trim_start_matches('-')))
        .copied()
        .filter(|_| arg.starts_with('-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn workspace(spec: Value, annotations: Value) -> Value {
        json!({"metadata": {"name": "w", "annotations": annotations}, "spec": spec})
    }

    #[test]
    fn namespaces_share_a_provider_config_when_the_rules_give_them_a_common_one() {
        let policy = WorkspacePolicy::default();
        assert!(policy.share_a_provider_config("team-a", "team-b"));
        let rules = ["team-a=aws-a", "team-b=aws-b", "team-c=aws-a"].map(String::from);
        let policy = WorkspacePolicy::parse(&rules).unwrap();
        assert!(!policy.share_a_provider_config("team-a", "team-b"));
        assert!(policy.share_a_provider_config("team-a", "team-c"));
        // A namespace no rule names may use none: it meets no one.
        assert!(!policy.share_a_provider_config("team-a", "other"));
        let rules = ["*=shared", "team-a=aws-a"].map(String::from);
        let policy = WorkspacePolicy::parse(&rules).unwrap();
        assert!(policy.share_a_provider_config("team-a", "other"));
    }

    #[test]
    fn by_default_every_namespace_uses_the_default_provider_config_and_no_other() {
        let policy = WorkspacePolicy::default();
        let none = workspace(json!({"forProvider": {}}), Value::Null);
        assert_eq!(policy.refusal("team-a", &none), None);
        let default = workspace(
            json!({"providerConfigRef": {"name": "default"}}),
            Value::Null,
        );
        assert_eq!(policy.refusal("team-a", &default), None);
        let other = workspace(
            json!({"providerConfigRef": {"name": "team-b"}}),
            Value::Null,
        );
        let message = policy.refusal("team-a", &other).expect("refused");
        assert!(
            message.contains("\"team-b\"") && message.contains("team-a"),
            "{message}"
        );
    }

    #[test]
    fn a_provider_config_is_allowed_only_to_its_namespaces() {
        let policy = WorkspacePolicy::parse(&["team-b=team-b".into(), "*=shared".into()]).unwrap();
        let b = workspace(
            json!({"providerConfigRef": {"name": "team-b"}}),
            Value::Null,
        );
        assert_eq!(policy.refusal("team-b", &b), None);
        assert!(policy.refusal("team-a", &b).is_some());
        let shared = workspace(
            json!({"providerConfigRef": {"name": "shared"}}),
            Value::Null,
        );
        assert_eq!(policy.refusal("team-a", &shared), None);
        // `default` is no longer allowed once the operator names the ProviderConfigs.
        let none = workspace(json!({}), Value::Null);
        assert!(policy.refusal("team-a", &none).is_some());
    }

    #[test]
    fn rules_that_do_not_parse_say_which_and_why() {
        for bad in ["team-a", "=x", "team-a="] {
            let error = WorkspacePolicy::parse(&[bad.into()]).unwrap_err();
            assert!(error.contains(bad), "{error}");
        }
    }

    #[test]
    fn crossplane_annotations_are_refused_and_others_kept() {
        let policy = WorkspacePolicy::default();
        let fine = workspace(json!({}), json!({"example.com/note": "x"}));
        assert_eq!(policy.refusal("a", &fine), None);
        for key in [
            "crossplane.io/external-name",
            "crossplane.io/paused",
            "meta.crossplane.io/x",
        ] {
            let ws = workspace(json!({}), json!({key: "team-b-state"}));
            let message = policy.refusal("a", &ws).expect(key);
            assert!(message.contains(key), "{message}");
        }
    }

    #[test]
    fn backend_and_state_changing_arguments_are_refused_in_every_list() {
        let policy = WorkspacePolicy::default();
        for list in ARGUMENT_LISTS {
            for arg in [
                "-backend-config=secret_suffix=team-b",
                "--backend=false",
                "-reconfigure",
                "-state=/tmp/x",
                "-state-out=/tmp/x",
                "-from-module=git::https://x",
                "-plugin-dir=/x",
            ] {
                let ws = workspace(
                    json!({"forProvider": {*list: ["-upgrade", arg]}}),
                    Value::Null,
                );
                let message = policy.refusal("a", &ws).expect(arg);
                assert!(message.contains(&format!("{list}[1]")), "{message}");
            }
        }
        let fine = workspace(
            json!({"forProvider": {"initArgs": ["-upgrade"], "applyArgs": ["-parallelism=2", "state"]}}),
            Value::Null,
        );
        assert_eq!(policy.refusal("a", &fine), None);
    }

    #[test]
    fn publishing_connection_details_elsewhere_is_refused() {
        let policy = WorkspacePolicy::default();
        let ws = workspace(
            json!({"publishConnectionDetailsTo": {"name": "x", "configRef": {"name": "vault"}}}),
            Value::Null,
        );
        assert!(
            policy
                .refusal("a", &ws)
                .expect("refused")
                .contains("publishConnectionDetailsTo")
        );
    }

    #[test]
    fn a_template_may_not_orphan_its_infrastructure() {
        let policy = WorkspacePolicy::default();
        let orphan = workspace(json!({"deletionPolicy": "Orphan"}), Value::Null);
        let message = policy.refusal("a", &orphan).expect("refused");
        assert!(
            message.contains("spec.deletionPolicy \"Orphan\""),
            "{message}"
        );
        let delete = workspace(json!({"deletionPolicy": "Delete"}), Value::Null);
        assert_eq!(policy.refusal("a", &delete), None);
    }

    #[test]
    fn management_policies_without_delete_are_refused_like_orphan() {
        let policy = WorkspacePolicy::default();
        let kept = workspace(
            json!({"managementPolicies": ["Observe", "Create", "Update", "LateInitialize"]}),
            Value::Null,
        );
        let message = policy.refusal("a", &kept).expect("refused");
        assert!(message.contains("spec.managementPolicies"), "{message}");
        for fine in [
            json!(["*"]),
            json!(["Observe", "Create", "Update", "Delete"]),
        ] {
            let ws = workspace(json!({"managementPolicies": fine}), Value::Null);
            assert_eq!(policy.refusal("a", &ws), None);
        }
    }

    #[test]
    fn terraform_arguments_through_the_environment_are_refused() {
        let policy = WorkspacePolicy::default();
        for name in ["TF_CLI_ARGS", "TF_CLI_ARGS_init", "TF_CLI_ARGS_apply"] {
            let ws = workspace(
                json!({"forProvider": {"env": [{"name": "TF_LOG", "value": "x"},
                    {"name": name, "value": "-backend-config=x"}]}}),
                Value::Null,
            );
            let message = policy.refusal("a", &ws).expect(name);
            assert!(message.contains(&format!("env[1] is {name}")), "{message}");
        }
        let fine = workspace(
            json!({"forProvider": {"env": [{"name": "TF_LOG", "value": "x"}]}}),
            Value::Null,
        );
        assert_eq!(policy.refusal("a", &fine), None);
    }

    #[test]
    fn an_entrypoint_that_leaves_the_workspaces_directory_is_refused() {
        let policy = WorkspacePolicy::default();
        for bad in [
            "....//0d1f-uid",
            "../x",
            "a/../../b",
            "/tf",
            "..",
            "a\\..\\b",
        ] {
            let ws = workspace(json!({"forProvider": {"entrypoint": bad}}), Value::Null);
            let message = policy.refusal("a", &ws).expect(bad);
            assert!(message.contains("entrypoint"), "{message}");
        }
        for fine in ["", "modules/vpc", "./vpc", "v1.2/x"] {
            let ws = workspace(json!({"forProvider": {"entrypoint": fine}}), Value::Null);
            assert_eq!(policy.refusal("a", &ws), None, "{fine}");
        }
    }
}
