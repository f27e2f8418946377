//! Tenancy: whose a Workspace or a WorkspaceTemplateApply is, which Workspace name an apply
//! uses, and which references cross a namespace. Pure: no API server.
//!
//! - A Workspace is an apply's when its labels name the apply's namespace and name and, when
//!   it carries one, the apply's uid. The controller neither changes nor deletes any other.
//! - An apply uses [`workspace_name`]; a Workspace under the legacy name
//!   ([`legacy_workspace_name`]) that is provably the apply's is kept in use, so that
//!   upgrading does not create a second Workspace (and a second Terraform run).
//! - A WorkspaceTemplate is code, run by the one provider-terraform every namespace shares:
//!   only a template of a namespace the operator trusts with code (`--allow-template-namespace`)
//!   is rendered, whoever refers to it; a template of any other namespace, the apply's own
//!   included, is refused ([`untrusted_template`]).
//! - Every reference resolves in the referrer's namespace. Only a template may come from
//!   another namespace, and only from a trusted one. Secrets never cross.
//! - An existing apply is adopted only with proof: our owner labels naming this owner, or the
//!   user's [`ADOPT_ANNOTATION`].
//! - A namespace is trusted with code only when the install made it so: it carries
//!   [`TRUSTED_NAMESPACE_LABEL`], set by the request that created it ([`untrusted_namespace`];
//!   the controller checks each at start and refuses to run otherwise).

use crate::api::WorkspaceTemplateApply;
use crate::render::{
    APPLY_NAME_LABEL, APPLY_NAMESPACE_LABEL, APPLY_UID_LABEL, legacy_workspace_name, workspace_name,
};
use kube::ResourceExt;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Condition type on an apply: False when the Workspace under its name is another's.
pub const WORKSPACE_OWNED_CONDITION: &str = "WorkspaceOwned";
/// Reason of `WorkspaceOwned=False` (and of the Event).
pub const WORKSPACE_OWNED_BY_ANOTHER: &str = "WorkspaceOwnedByAnother";
/// Condition type on an apply, a CAPTCluster or a CAPTControlPlane: False when a reference
/// crosses a namespace.
pub const REFERENCES_RESOLVED_CONDITION: &str = "ReferencesResolved";
/// Reason of `ReferencesResolved=False`.
pub const CROSS_NAMESPACE_REFERENCE: &str = "CrossNamespaceReference";
/// Condition type on a CAPTCluster or a CAPTControlPlane: False when an apply of the name it
/// would use exists and is not provably its own.
pub const APPLY_OWNED_CONDITION: &str = "WorkspaceTemplateApplyOwned";
/// Reason of `WorkspaceTemplateApplyOwned=False`.
pub const APPLY_NOT_OURS: &str = "WorkspaceTemplateApplyNotOwned";
/// Condition type on an apply: False when its template is of a namespace the operator does not
/// trust with code.
pub const TEMPLATE_TRUSTED_CONDITION: &str = "TemplateTrusted";
/// Reason of `TemplateTrusted=False` (and of the Warning Event).
pub const TEMPLATE_NOT_TRUSTED: &str = "TemplateNotTrusted";
/// Annotation a user sets on an existing apply to have a CAPT object adopt it.
pub const ADOPT_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/adopt";

/// Whose a Workspace is, from its labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkspaceOwner {
    /// The apply's (its namespace and name labels match, and its uid label if it has one).
    Ours,
    /// Someone else's: what its owner labels say.
    Another(String),
}

/// Whose the Workspace with `labels` is, as seen by the apply `namespace`/`name` of `uid`.
pub fn workspace_owner(
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    labels: &BTreeMap<String, String>,
) -> WorkspaceOwner {
    let label = |k: &str| labels.get(k).map(String::as_str);
    let ours = label(APPLY_NAMESPACE_LABEL) == Some(namespace)
        && label(APPLY_NAME_LABEL) == Some(name)
        && label(APPLY_UID_LABEL).is_none_or(|u| Some(u) == uid);
    if ours {
        return WorkspaceOwner::Ours;
    }
    let shown: Vec<String> = [APPLY_NAMESPACE_LABEL, APPLY_NAME_LABEL, APPLY_UID_LABEL]
        .iter()
        .filter_map(|k| label(k).map(|v| format!("{k}={v}")))
        .collect();
    WorkspaceOwner::Another(match shown.is_empty() {
        true => "no owner labels".into(),
        false => shown.join(", "),
    })
}

/// Which Workspace an apply uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// This name: the Workspace under it is the apply's, or there is none yet.
    Use {
        /// The Workspace's name.
        name: String,
        /// True when a Workspace of that name exists.
        exists: bool,
    },
    /// The Workspace under the apply's name belongs to another: leave it alone.
    Taken {
        /// The Workspace's name.
        name: String,
        /// What its owner labels say.
        owner: String,
    },
}

impl Placement {
    /// The Workspace's name.
    pub fn name(&self) -> &str {
        match self {
            Placement::Use { name, .. } | Placement::Taken { name, .. } => name,
        }
    }
}

/// Which Workspace the apply `namespace`/`name` of `uid` uses, from the labels of the
/// Workspaces observed under [`workspace_name`] (`current`) and [`legacy_workspace_name`]
/// (`legacy`), `None` where there is none: its own under the current name; else its own under
/// the legacy name (rendered before names carried a hash: kept, never duplicated); else the
/// current name, unless another's Workspace holds it.
pub fn place_workspace(
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    current: Option<&BTreeMap<String, String>>,
    legacy: Option<&BTreeMap<String, String>>,
) -> Placement {
    let current_name = workspace_name(namespace, name);
    let ours = |labels: &BTreeMap<String, String>| {
        workspace_owner(namespace, name, uid, labels) == WorkspaceOwner::Ours
    };
    if current.is_some_and(ours) {
        return Placement::Use {
            name: current_name,
            exists: true,
        };
    }
    let legacy_name = legacy_workspace_name(namespace, name);
    if legacy_name != current_name && legacy.is_some_and(ours) {
        return Placement::Use {
            name: legacy_name,
            exists: true,
        };
    }
    match current.map(|l| workspace_owner(namespace, name, uid, l)) {
        Some(WorkspaceOwner::Another(owner)) => Placement::Taken {
            name: current_name,
            owner,
        },
        _ => Placement::Use {
            name: current_name,
            exists: false,
        },
    }
}

/// A reference that names another namespace than its referrer's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrossNamespace {
    /// The field, e.g. `spec.waitForSecrets[0]`.
    pub field: String,
    /// The namespace it names.
    pub namespace: String,
}

impl CrossNamespace {
    /// The condition message: the field, the namespace it names, and the rule.
    pub fn message(&self, own: &str) -> String {
        format!(
            "{} names namespace {}; references resolve in the object's own namespace {own} \
             (templates may come from a namespace the operator allows with \
             --allow-template-namespace; Secrets never cross namespaces)",
            self.field, self.namespace
        )
    }
}

/// The first reference of `apply`'s spec that leaves its namespace: `templateRef` (unless its
/// namespace is in `allowed_templates`), `writeConnectionSecretToRef`, `waitForSecrets`,
/// `waitForWorkspaces` (a namespace there means nothing for a cluster-scoped Workspace and is
/// held to the same rule).
pub fn apply_cross_namespace(
    apply: &WorkspaceTemplateApply,
    allowed_templates: &BTreeSet<String>,
) -> Option<CrossNamespace> {
    let own = apply.namespace().unwrap_or_default();
    let spec = &apply.spec;
    let crossing = |field: String, namespace: Option<&String>| {
        namespace.filter(|ns| **ns != own).map(|ns| CrossNamespace {
            field,
            namespace: ns.clone(),
        })
    };
    let template = spec
        .template_ref
        .namespace
        .as_ref()
        .filter(|ns| !allowed_templates.contains(*ns));
    crossing("spec.templateRef".into(), template)
        .or_else(|| {
            let secret = spec.write_connection_secret_to_ref.as_ref();
            crossing(
                "spec.writeConnectionSecretToRef".into(),
                secret.map(|s| &s.namespace),
            )
        })
        .or_else(|| {
            let secrets = spec.wait_for_secrets.iter().flatten().enumerate();
            secrets
                .filter_map(|(i, s)| {
                    crossing(format!("spec.waitForSecrets[{i}]"), Some(&s.namespace))
                })
                .next()
        })
        .or_else(|| {
            let workspaces = spec.wait_for_workspaces.iter().flatten().enumerate();
            workspaces
                .filter_map(|(i, w)| {
                    crossing(format!("spec.waitForWorkspaces[{i}]"), w.namespace.as_ref())
                })
                .next()
        })
}

/// The first reference in a rendered Workspace `spec` that names another namespace than
/// `own`: any object under a key ending in `Ref` (`writeConnectionSecretToRef`, the
/// `secretKeyRef`/`configMapKeyRef` of `forProvider.env` and `forProvider.varFiles`, ...) with
/// a `namespace`. This catches what a template brings (its own connection Secret, Secrets in
/// its body), which the apply's spec does not show. `field` is its path, from `spec`.
pub fn rendered_cross_namespace(own: &str, spec: &Value) -> Option<CrossNamespace> {
    fn walk(value: &Value, path: &str, own: &str, in_ref: bool) -> Option<CrossNamespace> {
        match value {
            Value::Object(map) => {
                if in_ref
                    && let Some(ns) = map.get("namespace").and_then(Value::as_str)
                    && ns != own
                {
                    return Some(CrossNamespace {
                        field: path.to_owned(),
                        namespace: ns.to_owned(),
                    });
                }
                map.iter().find_map(|(k, v)| {
                    let is_ref = k.ends_with("Ref") || k.ends_with("Refs");
                    walk(v, &format!("{path}.{k}"), own, is_ref)
                })
            }
            Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, v)| walk(v, &format!("{path}[{i}]"), own, in_ref)),
            _ => None,
        }
    }
    walk(spec, "spec", own, false)
}

/// The first template reference of a CAPT object (`field` names it) that leaves its namespace
/// `own`, unless the operator allowed the template's namespace.
pub fn template_cross_namespace(
    own: &str,
    field: &str,
    namespace: Option<&String>,
    allowed_templates: &BTreeSet<String>,
) -> Option<CrossNamespace> {
    namespace
        .filter(|ns| *ns != own && !allowed_templates.contains(*ns))
        .map(|ns| CrossNamespace {
            field: field.into(),
            namespace: ns.clone(),
        })
}

/// The refusal of the template `namespace`/`name` when `namespace` is not one of `trusted`
/// (`--allow-template-namespace`): a template is Terraform, and the provider runs every
/// namespace's Workspaces in one process, beside each other's credential files and with its
/// own ServiceAccount token, so whoever may write a template there may read them all.
pub fn untrusted_template(
    namespace: &str,
    name: &str,
    trusted: &BTreeSet<String>,
) -> Option<Refusal> {
    if trusted.contains(namespace) {
        return None;
    }
    let trusted_list = match trusted.is_empty() {
        true => "none".to_owned(),
        false => trusted.iter().cloned().collect::<Vec<_>>().join(", "),
    };
    Some(Refusal {
        condition: TEMPLATE_TRUSTED_CONDITION,
        reason: TEMPLATE_NOT_TRUSTED,
        message: format!(
            "WorkspaceTemplate {namespace}/{name} is in namespace {namespace}, which the operator \
             does not trust with code (trusted: {trusted_list}); a template is Terraform run by \
             the provider every namespace shares, so nothing is rendered. Use a template of a \
             trusted namespace, or an operator trusts this one with \
             --allow-template-namespace {namespace} (its writers then run code with the \
             provider's credentials and every other stack's: docs/security.md)"
        ),
    })
}

/// The label the install sets on the namespace it creates for the trusted WorkspaceTemplates
/// (`manifests/deploy/templates-namespace.yaml`). A namespace named by
/// `--allow-template-namespace` must carry it, set when it was created.
pub const TRUSTED_NAMESPACE_LABEL: &str = "capt.cluster.x-k8s.io/trusted-with-code";

/// The label the API server sets on every namespace when it creates it: its managedFields
/// entry is the creator's.
const NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Why the namespace `name` (`namespace`, as read; `None`: there is none) must not be trusted
/// with code, or `None` when it may be. It must exist, carry [`TRUSTED_NAMESPACE_LABEL`]
/// `=true`, and that label must have been set by the request that created it: the
/// managedFields entry (manager, operation) that owns the label the API server sets at
/// creation must own ours too, or, where none owns it (a server-side apply created the
/// namespace), the entry that owns ours must date from the creation. A namespace someone else created first and the install then
/// labelled (`kubectl apply` adopts what exists) fails that: its creator may have granted
/// themselves writes there, and would run code with every stack's credentials.
pub fn untrusted_namespace(
    name: &str,
    namespace: Option<&k8s_openapi::api::core::v1::Namespace>,
) -> Option<String> {
    let fix = "create it with the install (kubectl apply --server-side -k manifests/, or the \
               clusterctl components), which sets the label when it creates it; docs/operating.md, \
               \"The trusted namespace\"";
    let Some(namespace) = namespace else {
        return Some(format!(
            "namespace {name} is trusted with code (--allow-template-namespace) but does not \
             exist: {fix}"
        ));
    };
    if namespace
        .labels()
        .get(TRUSTED_NAMESPACE_LABEL)
        .map(String::as_str)
        != Some("true")
    {
        return Some(format!(
            "namespace {name} is trusted with code (--allow-template-namespace) but lacks the \
             label {TRUSTED_NAMESPACE_LABEL}=true the install sets: {fix}"
        ));
    }
    // Each managedFields entry that owns `label`: (manager, operation, time).
    let owners = |label: &str| -> Vec<(String, String, Option<String>)> {
        namespace
            .managed_fields()
            .iter()
            .filter(|entry| {
                entry.fields_v1.as_ref().is_some_and(|fields| {
                    fields.0["f:metadata"]["f:labels"]
                        .get(format!("f:{label}"))
                        .is_some()
                })
            })
            .map(|entry| {
                (
                    entry.manager.clone().unwrap_or_default(),
                    entry.operation.clone().unwrap_or_default(),
                    entry.time.as_ref().map(|t| t.0.to_string()),
                )
            })
            .collect()
    };
    let created = (namespace.metadata.creation_timestamp.as_ref()).map(|t| t.0.to_string());
    let (creators, labellers) = (owners(NAME_LABEL), owners(TRUSTED_NAMESPACE_LABEL));
    let set_at_creation = if creators.is_empty() {
        // Created by a server-side apply, which leaves the server's label to no one: the
        // label's entry must date from the creation (both to the second; an entry's time moves
        // only when its manager changes what it owns).
        labellers.iter().any(|(_, _, time)| *time == created)
    } else {
        creators.iter().any(|(manager, operation, _)| {
            labellers
                .iter()
                .any(|(m, o, _)| m == manager && o == operation)
        })
    };
    if set_at_creation {
        return None;
    }
    let created = created.unwrap_or_else(|| "an unknown time".to_owned());
    let creators: Vec<_> = creators
        .iter()
        .map(|(m, o, _)| format!("{m} ({o})"))
        .collect();
    let labellers: Vec<_> = (labellers.iter())
        .map(|(m, o, t)| {
            format!(
                "{m} ({o}, at {})",
                t.as_deref().unwrap_or("an unknown time")
            )
        })
        .collect();
    Some(format!(
        "namespace {name} is trusted with code (--allow-template-namespace), but its label \
         {TRUSTED_NAMESPACE_LABEL} was not set by the request that created it (created at \
         {created} by {creators:?}; labelled by {labellers:?}): it existed before the install labelled it, \
         and whoever created it may write code there that runs with every stack's credentials. \
         Find out who created it and who may write there; then delete it and {fix}"
    ))
}

/// Why the controller leaves something alone, as the condition it publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The condition type (published with status False).
    pub condition: &'static str,
    /// Its reason.
    pub reason: &'static str,
    /// Its message.
    pub message: String,
}

impl Refusal {
    /// `ReferencesResolved=False` for a reference of an object of namespace `own`.
    pub fn cross_namespace(crossing: &CrossNamespace, own: &str) -> Self {
        Self {
            condition: REFERENCES_RESOLVED_CONDITION,
            reason: CROSS_NAMESPACE_REFERENCE,
            message: crossing.message(own),
        }
    }
}

/// Whether an existing apply is an owner's to use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApplyClaim {
    /// Its owner labels name this owner.
    Ours,
    /// It has no owner labels and the user asked for its adoption ([`ADOPT_ANNOTATION`]).
    Adoptable,
    /// Neither: leave it alone. Why.
    NotOurs(String),
}

/// Whether the apply with `labels` and `annotations` is the owner's (`kind`, `namespace`,
/// `name`, under the owner labels `kind_label`, `namespace_label`, `name_label`).
pub fn apply_claim(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    owner: [(&str, &str); 3],
) -> ApplyClaim {
    let matches = owner
        .iter()
        .all(|(label, value)| labels.get(*label).map(String::as_str) == Some(*value));
    if matches {
        return ApplyClaim::Ours;
    }
    let labelled: Vec<String> = owner
        .iter()
        .filter_map(|(label, _)| labels.get(*label).map(|v| format!("{label}={v}")))
        .collect();
    if !labelled.is_empty() {
        return ApplyClaim::NotOurs(format!(
            "its owner labels name another object ({})",
            labelled.join(", ")
        ));
    }
    if annotations.get(ADOPT_ANNOTATION).map(String::as_str) == Some("true") {
        return ApplyClaim::Adoptable;
    }
    ApplyClaim::NotOurs(format!(
        "it has no owner labels; annotate it {ADOPT_ANNOTATION}=true to have it adopted"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn ours(uid: Option<&str>) -> BTreeMap<String, String> {
        let mut l = labels(&[(APPLY_NAMESPACE_LABEL, "team"), (APPLY_NAME_LABEL, "a-vpc")]);
        if let Some(uid) = uid {
            l.insert(APPLY_UID_LABEL.into(), uid.into());
        }
        l
    }

    /// A namespace as the API server stores it, created at 00:00:00: `entries` are (manager,
    /// operation, labels it owns, time).
    fn namespace(
        trusted: bool,
        entries: &[(&str, &str, &[&str], &str)],
    ) -> k8s_openapi::api::core::v1::Namespace {
        let mut labels = json!({NAME_LABEL: "capt-templates"});
        if trusted {
            labels[TRUSTED_NAMESPACE_LABEL] = json!("true");
        }
        let managed: Vec<Value> = entries
            .iter()
            .map(|(manager, operation, owned, time)| {
                let owned: serde_json::Map<String, Value> = owned
                    .iter()
                    .map(|l| (format!("f:{l}"), json!({})))
                    .collect();
                json!({"manager": manager, "operation": operation, "apiVersion": "v1",
                       "time": format!("2026-12-01T{time}Z"), "fieldsType": "FieldsV1",
                       "fieldsV1": {"f:metadata": {"f:labels": owned}}})
            })
            .collect();
        serde_json::from_value(
            json!({"metadata": {"name": "capt-templates", "labels": labels,
            "managedFields": managed, "creationTimestamp": "2026-12-01T00:00:00Z"}}),
        )
        .unwrap()
    }

    #[test]
    fn a_namespace_is_trusted_only_with_the_label_its_creator_set() {
        let trusted = |entries: &[(&str, &str, &[&str], &str)]| {
            untrusted_namespace("capt-templates", Some(&namespace(true, entries)))
        };
        // Created by a server-side apply (the server's label is no one's), labelled in it.
        let applied = (
            "kubectl",
            "Apply",
            &[TRUSTED_NAMESPACE_LABEL][..],
            "00:00:00",
        );
        assert_eq!(trusted(&[applied]), None);
        // Created by a create (an Update): the server's label is the creator's.
        let created = (
            "clusterctl",
            "Update",
            &[NAME_LABEL, TRUSTED_NAMESPACE_LABEL][..],
            "00:00:00",
        );
        assert_eq!(trusted(&[created]), None);

        // Created by `kubectl create namespace`, then labelled by the install's apply.
        let tenant = ("kubectl-create", "Update", &[NAME_LABEL][..], "00:00:00");
        let install = (
            "kubectl",
            "Apply",
            &[TRUSTED_NAMESPACE_LABEL][..],
            "00:05:00",
        );
        let why = trusted(&[tenant, install]).expect("refused");
        assert!(
            why.contains("was not set by the request that created it"),
            "{why}"
        );
        assert!(why.contains("kubectl-create (Update)"), "{why}");
        // The same manager, another operation: another request.
        let relabelled = ("kubectl", "Update", &[NAME_LABEL][..], "00:00:00");
        assert!(trusted(&[relabelled, install]).is_some());
        // Created by a server-side apply without the label, labelled later.
        assert!(trusted(&[install]).is_some());

        let unlabelled = namespace(false, &[tenant]);
        let why = untrusted_namespace("capt-templates", Some(&unlabelled)).expect("refused");
        assert!(why.contains("lacks the label"), "{why}");
        let why = untrusted_namespace("capt-templates", None).expect("refused");
        assert!(why.contains("does not exist"), "{why}");
    }

    #[test]
    fn a_workspace_is_ours_by_namespace_name_and_uid_when_it_has_one() {
        let owner = |l: &BTreeMap<String, String>| workspace_owner("team", "a-vpc", Some("u1"), l);
        assert_eq!(owner(&ours(None)), WorkspaceOwner::Ours);
        assert_eq!(owner(&ours(Some("u1"))), WorkspaceOwner::Ours);
        assert!(
            matches!(owner(&ours(Some("u0"))), WorkspaceOwner::Another(o) if o.contains("-uid=u0"))
        );
        let theirs = labels(&[(APPLY_NAMESPACE_LABEL, "team-a"), (APPLY_NAME_LABEL, "vpc")]);
        assert!(
            matches!(owner(&theirs), WorkspaceOwner::Another(o) if o.contains("-namespace=team-a"))
        );
        assert_eq!(
            owner(&BTreeMap::new()),
            WorkspaceOwner::Another("no owner labels".into())
        );
    }

    #[test]
    fn the_placement_prefers_our_current_then_our_legacy_workspace() {
        let current = workspace_name("team", "a-vpc");
        let place = |c: Option<&BTreeMap<String, String>>, l: Option<&BTreeMap<String, String>>| {
            place_workspace("team", "a-vpc", Some("u1"), c, l)
        };
        let fresh = Placement::Use {
            name: current.clone(),
            exists: false,
        };
        assert_eq!(place(None, None), fresh);
        assert_eq!(
            place(Some(&ours(Some("u1"))), Some(&ours(None))),
            Placement::Use {
                name: current.clone(),
                exists: true
            }
        );
        assert_eq!(
            place(None, Some(&ours(None))),
            Placement::Use {
                name: "team-a-vpc".into(),
                exists: true
            },
            "a legacy Workspace of ours stays in use"
        );
        // The legacy name held by the other apply of the colliding pair: not ours.
        let theirs = labels(&[(APPLY_NAMESPACE_LABEL, "team-a"), (APPLY_NAME_LABEL, "vpc")]);
        assert_eq!(place(None, Some(&theirs)), fresh);
        assert_eq!(place(None, Some(&ours(Some("u0")))), fresh, "another uid");
        assert!(matches!(
            place(Some(&theirs), None),
            Placement::Taken { name, .. } if name == current
        ));
    }

    fn apply(spec: Value) -> WorkspaceTemplateApply {
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
            "metadata": {"name": "a", "namespace": "team"}, "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn every_reference_of_an_apply_stays_in_its_namespace() {
        let none = BTreeSet::new();
        let ok = apply(json!({"templateRef": {"name": "t", "namespace": "team"},
            "writeConnectionSecretToRef": {"name": "s", "namespace": "team"},
            "waitForSecrets": [{"name": "s", "namespace": "team"}],
            "waitForWorkspaces": [{"name": "w"}]}));
        assert_eq!(apply_cross_namespace(&ok, &none), None);
        let cases = [
            (
                json!({"templateRef": {"name": "t", "namespace": "other"}}),
                "spec.templateRef",
            ),
            (
                json!({"templateRef": {"name": "t"}, "writeConnectionSecretToRef": {"name": "s", "namespace": "other"}}),
                "spec.writeConnectionSecretToRef",
            ),
            (
                json!({"templateRef": {"name": "t"}, "waitForSecrets": [{"name": "s", "namespace": "team"}, {"name": "s", "namespace": "other"}]}),
                "spec.waitForSecrets[1]",
            ),
            (
                json!({"templateRef": {"name": "t"}, "waitForWorkspaces": [{"name": "w", "namespace": "other"}]}),
                "spec.waitForWorkspaces[0]",
            ),
        ];
        for (spec, field) in cases {
            assert_eq!(
                apply_cross_namespace(&apply(spec), &none),
                Some(CrossNamespace {
                    field: field.into(),
                    namespace: "other".into()
                })
            );
        }
    }

    #[test]
    fn only_templates_may_come_from_an_allowed_namespace() {
        let allowed = BTreeSet::from(["shared".to_owned()]);
        let template = apply(json!({"templateRef": {"name": "t", "namespace": "shared"}}));
        assert_eq!(apply_cross_namespace(&template, &allowed), None);
        let secret = apply(json!({"templateRef": {"name": "t", "namespace": "shared"},
            "writeConnectionSecretToRef": {"name": "s", "namespace": "shared"}}));
        assert_eq!(
            apply_cross_namespace(&secret, &allowed).map(|c| c.field),
            Some("spec.writeConnectionSecretToRef".into())
        );
        assert_eq!(
            template_cross_namespace(
                "team",
                "spec.vpcTemplateRef",
                Some(&"shared".into()),
                &allowed
            ),
            None
        );
        assert!(
            template_cross_namespace("team", "spec.vpcTemplateRef", Some(&"x".into()), &allowed)
                .is_some()
        );
    }

    #[test]
    fn a_rendered_workspace_may_not_reach_secrets_of_another_namespace() {
        let spec = json!({"forProvider": {"varFiles": [{"source": "SecretKey",
            "secretKeyRef": {"namespace": "team", "name": "v", "key": "k"}},
            {"source": "SecretKey", "secretKeyRef": {"namespace": "kube-system", "name": "v", "key": "k"}}]},
            "writeConnectionSecretToRef": {"name": "s", "namespace": "team"},
            "providerConfigRef": {"name": "default"}});
        assert_eq!(
            rendered_cross_namespace("team", &spec),
            Some(CrossNamespace {
                field: "spec.forProvider.varFiles[1].secretKeyRef".into(),
                namespace: "kube-system".into()
            })
        );
        let fine = json!({"writeConnectionSecretToRef": {"name": "s", "namespace": "team"},
            "forProvider": {"module": "namespace = \"x\""}, "metadata": {"namespace": "x"}});
        assert_eq!(rendered_cross_namespace("team", &fine), None);
    }

    #[test]
    fn only_a_template_of_a_trusted_namespace_is_used() {
        let trusted: BTreeSet<String> = ["platform".to_owned()].into();
        assert_eq!(untrusted_template("platform", "eks", &trusted), None);
        let refusal = untrusted_template("team", "eks", &trusted).expect("refused");
        assert_eq!(refusal.condition, TEMPLATE_TRUSTED_CONDITION);
        assert_eq!(refusal.reason, TEMPLATE_NOT_TRUSTED);
        for part in [
            "team/eks",
            "trusted: platform",
            "--allow-template-namespace team",
        ] {
            assert!(
                refusal.message.contains(part),
                "{part}: {}",
                refusal.message
            );
        }
        let none = untrusted_template("team", "eks", &BTreeSet::new()).expect("refused");
        assert!(none.message.contains("trusted: none"), "{}", none.message);
    }

    #[test]
    fn an_apply_is_adopted_with_our_labels_or_the_users_annotation_only() {
        let owner = [("kind", "CAPTCluster"), ("name", "demo"), ("ns", "team")];
        let mine = labels(&[("kind", "CAPTCluster"), ("name", "demo"), ("ns", "team")]);
        let none = BTreeMap::new();
        let adopt = labels(&[(ADOPT_ANNOTATION, "true")]);
        assert_eq!(apply_claim(&mine, &none, owner), ApplyClaim::Ours);
        assert_eq!(apply_claim(&none, &adopt, owner), ApplyClaim::Adoptable);
        assert!(matches!(
            apply_claim(&none, &none, owner),
            ApplyClaim::NotOurs(why) if why.contains(ADOPT_ANNOTATION)
        ));
        let another = labels(&[("kind", "CAPTCluster"), ("name", "other"), ("ns", "team")]);
        assert!(matches!(
            apply_claim(&another, &adopt, owner),
            ApplyClaim::NotOurs(why) if why.contains("name=other")
        ));
    }
}
