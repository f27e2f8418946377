//! Rendering a WorkspaceTemplateApply and its WorkspaceTemplate into the provider-terraform
//! Workspace they describe. Pure: no API server.

use crate::api::{WorkspaceTemplate, WorkspaceTemplateApply};
use crate::variables::{PathStep, WORKSPACE_NAME_VARIABLE};
use kube::ResourceExt;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// Label on a Workspace naming the namespace of the apply that rendered it.
pub const APPLY_NAMESPACE_LABEL: &str =
    "infrastructure.cluster.x-k8s.io/workspacetemplateapply-namespace";
/// Label on a Workspace naming the apply that rendered it.
pub const APPLY_NAME_LABEL: &str = "infrastructure.cluster.x-k8s.io/workspacetemplateapply-name";
/// Label on a Workspace carrying the uid of the apply that rendered it: a Workspace whose uid
/// label names another apply is not ours, even when its namespace and name labels match.
pub const APPLY_UID_LABEL: &str = "infrastructure.cluster.x-k8s.io/workspacetemplateapply-uid";
/// Prefix of the labels naming the CAPT object an apply serves.
pub const OWNER_LABEL_PREFIX: &str = "infrastructure.cluster.x-k8s.io/owner-";
/// Label naming the Cluster API Cluster an object belongs to (the Cluster API convention).
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// The label Cluster API providers shard by (`--watch-filter`); the applies a sharded
/// controller creates carry their owner's.
pub const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";
/// Annotation on a Workspace: the revision of what was rendered into it (see
/// [`render_workspace`]), which its module echoes as [`REVISION_OUTPUT`] once applied.
pub const REVISION_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/workspace-revision";
/// Annotation on a Workspace: the `metadata.generation` of the apply it was rendered from,
/// so that an owner can tell whether the Workspace renders its current spec.
pub const APPLY_GENERATION_ANNOTATION: &str =
    "infrastructure.cluster.x-k8s.io/workspacetemplateapply-generation";
/// The output an inline module gets, whose value is the rendered revision: Terraform reports
/// it only after applying that very configuration. A template may not declare it.
pub const REVISION_OUTPUT: &str = "capt_revision";
/// The only `spec.deletionPolicy` a template may set (`workspace_policy`): provider-terraform
/// destroys the infrastructure when the Workspace is deleted. It is also the Workspace CRD's
/// default, so a rendered Workspace gets it without CAPT owning the field.
pub const DELETION_POLICY: &str = "Delete";
/// Annotation on a Workspace: the digest of the inputs it was rendered from ([`inputs_digest`]).
pub const INPUTS_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/workspace-inputs";
/// Annotation on a Workspace: the [`RENDERING`] that rendered it. A Workspace without it was
/// rendered by v0.1.0 ([`FIRST_RENDERING`]).
pub const RENDERING_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/workspace-rendering";
/// The version of what [`render_workspace`] makes of the same inputs. Raised with every
/// change of the rendered Workspace (the golden files of `controller/tests/render_golden.rs`
/// refuse a changed rendering under the same number): a Workspace rendered by an earlier one
/// keeps its rendering until its inputs change (`reconcile/apply/decide.rs` `needs_apply`, docs/upgrading.md).
pub const RENDERING: u32 = 3;
/// The rendering of v0.1.0, which recorded none.
pub const FIRST_RENDERING: u32 = 1;
/// Hex digits of a revision.
const REVISION_HEX: usize = 16;

/// Why a Workspace could not be rendered.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RenderError {
    /// The template's spec is not an object.
    #[error("WorkspaceTemplate {0}: spec.template.spec must be an object")]
    SpecNotObject(String),
}

/// Hex digits of the hash that ends a Workspace name.
pub const WORKSPACE_HASH_HEX: usize = 10;
/// The longest name of a cluster-scoped object (a DNS subdomain).
const MAX_NAME: usize = 253;

/// The name of the Workspace of the apply `namespace`/`name`: `<namespace>-<name>-<hash>`,
/// `hash` the first [`WORKSPACE_HASH_HEX`] hex digits of the SHA-256 of `namespace/name`.
/// Workspaces are cluster-scoped, so the name carries the apply's namespace; the hash keeps
/// two applies apart whose `<namespace>-<name>` read the same (`team-a`/`vpc` and
/// `team`/`a-vpc`). The readable part is cut so that the name fits 253 characters, and
/// never ends in `-` or `.` (a DNS subdomain's labels end alphanumeric).
///
/// Every place that names the Workspace of an apply calls this (or
/// [`legacy_workspace_name`], for Workspaces rendered before names carried the hash).
pub fn workspace_name(namespace: &str, name: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    let hash: String = digest
        .iter()
        .take(WORKSPACE_HASH_HEX / 2)
        .map(|b| format!("{b:02x}"))
        .collect();
    let readable: String = format!("{namespace}-{name}")
        .chars()
        .take(MAX_NAME - 1 - WORKSPACE_HASH_HEX)
        .collect();
    let readable = readable.trim_end_matches(['-', '.']);
    format!("{readable}-{hash}")
}

/// The name Workspaces had before [`workspace_name`]: `<namespace>-<name>`, cut to 253
/// characters. Two applies can map to one such name; a Workspace under it is used only when
/// its labels prove it is the apply's (`reconcile/claims.rs` `locate`).
pub fn legacy_workspace_name(namespace: &str, name: &str) -> String {
    format!("{namespace}-{name}")
        .chars()
        .take(MAX_NAME)
        .collect()
}

/// [`workspace_name`] of an apply object.
pub fn workspace_name_of(apply: &WorkspaceTemplateApply) -> String {
    workspace_name(&apply.namespace().unwrap_or_default(), &apply.name_any())
}

/// The Workspace object (an apply configuration) for `apply` rendered from `template`.
///
/// `${key}` is replaced by the apply's variable `key` only where a value goes
/// ([`crate::variables`]): `spec.forProvider.vars[].value`, the strings of
/// `spec.forProvider.varmap`, and the labels and annotations; `${WORKSPACE_NAME}` (the
/// platform's) everywhere, by the Workspace's name `name` (the one in use: [`workspace_name`],
/// or the legacy name of a Workspace rendered before it, so that its spec stays what Terraform
/// last applied). Other `${…}` (Terraform's own interpolation) are left as they are. The
/// checks of [`crate::variables`] come first: a template with a key elsewhere is not rendered.
///
/// The Workspace carries the apply's generation ([`APPLY_GENERATION_ANNOTATION`]). An inline
/// HCL module also gets the output [`REVISION_OUTPUT`] whose value is the revision (a hash
/// of the rendered spec), and the Workspace the same revision in
/// [`REVISION_ANNOTATION`]: provider-terraform keeps `Ready=True` through an update and
/// writes no observedGeneration, so the output matching the annotation is the only proof
/// that this rendering was applied. A remote module, or inline JSON, gets neither (nothing
/// can be added to it): its Workspace proves nothing beyond `Ready`.
pub fn render_workspace(
    apply: &WorkspaceTemplateApply,
    template: &WorkspaceTemplate,
    name: &str,
) -> Result<Value, RenderError> {
    let name = name.to_owned();
    let mut variables = apply.spec.variables.clone().unwrap_or_default();
    variables.insert(WORKSPACE_NAME_VARIABLE.to_owned(), name.clone());
    let body = &template.spec.template;
    if !body.spec.is_object() {
        return Err(RenderError::SpecNotObject(format!(
            "{}/{}",
            template.namespace().unwrap_or_default(),
            template.name_any()
        )));
    }
    // `deletionPolicy` is rendered only when the template names it: the CRD's default
    // (`Delete`) gives a new Workspace the same, and an operator's `Orphan` on a live one is
    // the operator's to keep (CAPT owns only the fields it renders; `workspace_policy`
    // refuses a template's `Orphan`).
    let platform = BTreeMap::from([(WORKSPACE_NAME_VARIABLE.to_owned(), name.clone())]);
    let mut spec = substitute(&body.spec, &mut Vec::new(), &variables, &platform);
    let secret_ref = apply
        .spec
        .write_connection_secret_to_ref
        .as_ref()
        .or(template.spec.write_connection_secret_to_ref.as_ref());
    if let Some(secret) = secret_ref {
        spec["writeConnectionSecretToRef"] =
            json!({"name": secret.name, "namespace": secret.namespace});
    }
    let metadata = body.metadata.clone().unwrap_or_default();
    let mut labels = substitute_map(metadata.labels.unwrap_or_default(), &variables);
    labels.insert(
        APPLY_NAMESPACE_LABEL.to_owned(),
        apply.namespace().unwrap_or_default(),
    );
    labels.insert(APPLY_NAME_LABEL.to_owned(), apply.name_any());
    if let Some(uid) = apply.uid() {
        labels.insert(APPLY_UID_LABEL.to_owned(), uid);
    }
    // The CAPT object the apply serves, so that a change of the Workspace alone (new outputs,
    // same conditions) wakes that object's reconciler directly.
    for (k, v) in apply.labels() {
        if k.starts_with(OWNER_LABEL_PREFIX) {
            labels.insert(k.clone(), v.clone());
        }
    }
    let annotations = substitute_map(metadata.annotations.unwrap_or_default(), &variables);
    let mut rendered = json!({
        "apiVersion": "tf.upbound.io/v1beta1",
        "kind": "Workspace",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    });
    // Only when there are some. The API server stores no empty map in `metadata` (they are
    // `omitempty`), so an empty one rendered is never found on the live Workspace: every
    // reconcile would apply it again, and each such apply is a real write (its managedFields
    // entry gets a new time), whose watch event wakes the apply once more: a write loop).
    let mut annotations = annotations;
    annotations.remove(REVISION_ANNOTATION);
    if let Some(generation) = apply.metadata.generation {
        annotations.insert(
            APPLY_GENERATION_ANNOTATION.to_owned(),
            generation.to_string(),
        );
    }
    annotations.insert(
        INPUTS_ANNOTATION.to_owned(),
        inputs_digest(apply, template, &name),
    );
    annotations.insert(RENDERING_ANNOTATION.to_owned(), RENDERING.to_string());
    if !annotations.is_empty() {
        rendered["metadata"]["annotations"] = json!(annotations);
    }
    echo_revision(&mut rendered);
    Ok(rendered)
}

/// The digest of what a Workspace is rendered from: the apply's spec, uid and owner labels,
/// the template's spec, and the Workspace's name. It does not depend on how they are rendered,
/// so that a Workspace records whether its inputs changed since, whatever renderer runs.
pub fn inputs_digest(
    apply: &WorkspaceTemplateApply,
    template: &WorkspaceTemplate,
    name: &str,
) -> String {
    use sha2::{Digest, Sha256};
    let owner_labels: BTreeMap<&String, &String> = apply
        .labels()
        .iter()
        .filter(|(k, _)| k.starts_with(OWNER_LABEL_PREFIX))
        .collect();
    let inputs = json!({
        "apply": apply.spec, "uid": apply.uid(), "ownerLabels": owner_labels,
        "template": template.spec, "name": name,
    });
    let digest = Sha256::digest(canonical_json(&inputs).as_bytes());
    digest
        .iter()
        .take(REVISION_HEX / 2)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Why the apply's variables must not be rendered into `template`: a key's `${KEY}` outside
/// the variables' values, or a key the template does not name ([`crate::variables`]).
/// `(reason, message)`.
pub fn variables_refusal(
    apply: &WorkspaceTemplateApply,
    template: &WorkspaceTemplate,
) -> Option<(&'static str, String)> {
    let name = format!(
        "{}/{}",
        template.namespace().unwrap_or_default(),
        template.name_any()
    );
    let metadata = template.spec.template.metadata.clone().unwrap_or_default();
    let strings: Vec<String> = [metadata.labels, metadata.annotations]
        .into_iter()
        .flatten()
        .flat_map(|m| m.into_values())
        .collect();
    let strings: Vec<&str> = strings.iter().map(String::as_str).collect();
    crate::variables::template_refusal(
        &name,
        &template.spec.template.spec,
        &strings,
        apply.spec.variables.as_ref(),
    )
}

/// The module of an inline HCL `forProvider` (provider-terraform's default format is HCL).
fn inline_hcl_module(for_provider: &Value) -> Option<&str> {
    let format = for_provider["inlineFormat"].as_str().unwrap_or("HCL");
    let inline_hcl = for_provider["source"] == "Inline" && format == "HCL";
    for_provider["module"].as_str().filter(|_| inline_hcl)
}

/// Adds the revision output to an inline HCL module, and the revision annotation; leaves any
/// other module alone.
fn echo_revision(rendered: &mut Value) {
    let Some(module) = inline_hcl_module(&rendered["spec"]["forProvider"]) else {
        return;
    };
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(canonical_json(&rendered["spec"]).as_bytes());
    let revision: String = digest
        .iter()
        .take(REVISION_HEX / 2)
        .map(|b| format!("{b:02x}"))
        .collect();
    let separator = if module.ends_with('\n') { "" } else { "\n" };
    let module = format!(
        "{module}{separator}# Added by CAPT: proves that this configuration was applied.\n\
         output \"{REVISION_OUTPUT}\" {{\n  value = \"{revision}\"\n}}\n"
    );
    rendered["spec"]["forProvider"]["module"] = json!(module);
    rendered["metadata"]["annotations"][REVISION_ANNOTATION] = json!(revision);
}

/// JSON text with object keys sorted at every level: the same document hashes the same,
/// whatever order its maps were read in.
fn canonical_json(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical_json(&map[k])))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(canonical_json).collect();
            format!("[{}]", items.join(","))
        }
        scalar => scalar.to_string(),
    }
}

fn substitute_map(
    map: BTreeMap<String, String>,
    variables: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    map.into_iter()
        .map(|(k, v)| (k, crate::variables::substitute(&v, variables)))
        .collect()
}

/// `value` (at `path` of the template's spec) with `variables` replaced where a value goes
/// ([`crate::variables::takes_values`]), and only `platform`'s elsewhere.
fn substitute(
    value: &Value,
    path: &mut Vec<PathStep>,
    variables: &BTreeMap<String, String>,
    platform: &BTreeMap<String, String>,
) -> Value {
    match value {
        Value::String(s) => {
            let map = match crate::variables::takes_values(path) {
                true => variables,
                false => platform,
            };
            Value::String(crate::variables::substitute(s, map))
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    path.push(PathStep::Index(i));
                    let out = substitute(v, path, variables, platform);
                    path.pop();
                    out
                })
                .collect(),
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    path.push(PathStep::Key(k.clone()));
                    let out = substitute(v, path, variables, platform);
                    path.pop();
                    (k.clone(), out)
                })
                .collect::<Map<_, _>>(),
        ),
        other => other.clone(),
    }
}

/// The largest WorkspaceTemplate spec (serialized JSON) the controller renders: an inline
/// module of a whole EKS stack is tens of KiB.
pub const MAX_TEMPLATE_BYTES: usize = 256 * 1024;
/// Set by the template cache (`crate::watches`) on its copy (never written) of a template over [`MAX_TEMPLATE_BYTES`]: its
/// size in bytes. Its body is not kept.
pub const TOO_LARGE_ANNOTATION: &str = "capt.cache/too-large-bytes";

/// What the Workspace cache (`crate::watches`) keeps of an inline module, and what a rendered
/// module is compared as: `sha256:<hex>` of its text.
pub fn module_digest(module: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(module.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_template(spec: Value) -> WorkspaceTemplate {
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
            "metadata": {"name": "eks", "namespace": "default"},
            "spec": {"template": {"metadata": {"annotations": {"note": "${cluster}"}}, "spec": spec},
                     "writeConnectionSecretToRef": {"name": "template-secret", "namespace": "default"}},
        }))
        .unwrap()
    }

    fn mk_apply(variables: Value, secret: Option<&str>) -> WorkspaceTemplateApply {
        let mut spec = json!({"templateRef": {"name": "eks"}, "variables": variables});
        if let Some(s) = secret {
            spec["writeConnectionSecretToRef"] = json!({"name": s, "namespace": "default"});
        }
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
            "metadata": {"name": "demo-eks", "namespace": "default"}, "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn values_go_to_the_variables_and_the_workspace_name_everywhere() {
        let template = mk_template(json!({"forProvider": {
            "module": "variable \"cidr\" {}\n# ws ${WORKSPACE_NAME}, not ${cluster}",
            "vars": [{"key": "cidr", "value": "${cidr}"}, {"key": "ws", "value": "${WORKSPACE_NAME}"}],
            "varmap": {"zones": ["${zones}"]}}}));
        let cidr = "10.0.0.0/16\" } resource \"x\" \"y\" { #";
        let apply = mk_apply(
            json!({"cluster": "demo", "cidr": cidr, "zones": "ap-northeast-1a,ap-northeast-1c"}),
            None,
        );
        let name = workspace_name_of(&apply);
        let ws = render_workspace(&apply, &template, &name).unwrap();
        assert_eq!(ws["metadata"]["name"], name);
        let module = ws["spec"]["forProvider"]["module"].as_str().unwrap();
        assert!(
            module.starts_with(&format!(
                "variable \"cidr\" {{}}\n# ws {name}, not ${{cluster}}"
            )),
            "{module}"
        );
        assert_eq!(ws["spec"]["forProvider"]["vars"][0]["value"], cidr);
        assert_eq!(ws["spec"]["forProvider"]["vars"][1]["value"], name);
        assert_eq!(
            ws["spec"]["forProvider"]["varmap"]["zones"][0],
            "ap-northeast-1a,ap-northeast-1c"
        );
        assert_eq!(ws["metadata"]["annotations"]["note"], "demo");
        assert_eq!(ws["metadata"]["labels"][APPLY_NAME_LABEL], "demo-eks");
        assert_eq!(ws["metadata"]["labels"][APPLY_NAMESPACE_LABEL], "default");
    }

    #[test]
    fn a_key_the_template_places_outside_the_variables_or_not_at_all_is_refused() {
        let in_module = mk_template(json!({"forProvider": {"module": "# ${cluster}"}}));
        let apply = mk_apply(json!({"cluster": "demo"}), None);
        let (reason, message) = variables_refusal(&apply, &in_module).unwrap();
        assert_eq!(reason, crate::variables::PLACEHOLDER_OUTSIDE_VARIABLES);
        assert!(message.contains("default/eks") && message.contains("forProvider.module"));
        // `cluster` is named by the template's annotation (mk_template): taken.
        let plain = mk_template(json!({"forProvider": {"module": "# m"}}));
        assert_eq!(variables_refusal(&apply, &plain), None);
        let swap = mk_apply(json!({"cluster": "demo", "bucket": "x"}), None);
        let (reason, message) = variables_refusal(&swap, &plain).unwrap();
        assert_eq!(reason, crate::variables::UNDECLARED_VARIABLE);
        assert!(message.contains("bucket"), "{message}");
    }

    #[test]
    fn the_workspace_carries_the_owner_labels_of_its_apply() {
        let mut apply = mk_apply(json!({}), None);
        apply.metadata.labels = Some(BTreeMap::from([
            (
                format!("{OWNER_LABEL_PREFIX}kind"),
                "CAPTControlPlane".to_owned(),
            ),
            (format!("{OWNER_LABEL_PREFIX}name"), "demo".to_owned()),
            ("unrelated".to_owned(), "x".to_owned()),
        ]));
        let ws = render_workspace(&apply, &mk_template(json!({})), "w").unwrap();
        let labels = &ws["metadata"]["labels"];
        assert_eq!(
            labels[format!("{OWNER_LABEL_PREFIX}kind")],
            "CAPTControlPlane"
        );
        assert_eq!(labels[format!("{OWNER_LABEL_PREFIX}name")], "demo");
        assert!(labels.get("unrelated").is_none());
    }

    #[test]
    fn terraform_interpolation_of_unknown_names_is_left_alone() {
        let template =
            mk_template(json!({"forProvider": {"module": "tags = { Name = \"${var.name}\" }"}}));
        let ws = render_workspace(&mk_apply(json!({}), None), &template, "w").unwrap();
        assert_eq!(
            ws["spec"]["forProvider"]["module"],
            "tags = { Name = \"${var.name}\" }"
        );
    }

    #[test]
    fn the_applys_connection_secret_wins_over_the_templates() {
        let template = mk_template(json!({}));
        let ws =
            render_workspace(&mk_apply(json!({}), Some("apply-secret")), &template, "w").unwrap();
        assert_eq!(
            ws["spec"]["writeConnectionSecretToRef"]["name"],
            "apply-secret"
        );
        let ws = render_workspace(&mk_apply(json!({}), None), &template, "w").unwrap();
        assert_eq!(
            ws["spec"]["writeConnectionSecretToRef"]["name"],
            "template-secret"
        );
    }

    #[test]
    fn a_template_whose_spec_is_not_an_object_is_refused_by_name() {
        let template = mk_template(json!("nope"));
        let err = render_workspace(&mk_apply(json!({}), None), &template, "w").unwrap_err();
        assert_eq!(
            err.to_string(),
            "WorkspaceTemplate default/eks: spec.template.spec must be an object"
        );
    }

    #[test]
    fn the_workspace_name_is_readable_and_ends_in_a_hash() {
        let name = workspace_name("default", "demo-eks");
        let (readable, hash) = name.rsplit_once('-').unwrap();
        assert_eq!(readable, "default-demo-eks");
        assert_eq!(hash.len(), WORKSPACE_HASH_HEX);
        assert!(
            hash.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_eq!(name, workspace_name("default", "demo-eks"), "stable");
        assert_eq!(
            legacy_workspace_name("default", "demo-eks"),
            "default-demo-eks"
        );
    }

    #[test]
    fn applies_whose_legacy_names_collide_get_two_workspaces() {
        assert_eq!(
            legacy_workspace_name("team-a", "vpc"),
            legacy_workspace_name("team", "a-vpc")
        );
        let one = workspace_name("team-a", "vpc");
        let other = workspace_name("team", "a-vpc");
        assert_ne!(one, other);
        assert!(one.starts_with("team-a-vpc-") && other.starts_with("team-a-vpc-"));
    }

    /// A DNS subdomain (RFC 1123): at most 253 characters, dot-separated labels of lowercase
    /// alphanumerics and `-`, each starting and ending alphanumeric.
    fn is_dns_subdomain(s: &str) -> bool {
        s.len() <= 253
            && s.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    }

    #[test]
    fn a_long_name_is_cut_to_a_valid_253_character_name_and_keeps_its_hash() {
        let ns = "n".repeat(63);
        // 253 characters, with a dot where the cut falls (the 178th character).
        let long = format!("{}.{}", "a".repeat(177), "b-c".repeat(25));
        assert_eq!(long.len(), 253);
        let name = workspace_name(&ns, &long);
        assert!(name.len() <= 253, "{} characters", name.len());
        assert!(is_dns_subdomain(&name), "{name}");
        assert!(name.starts_with(&format!("{ns}-aaaa")));
        // Two long names that differ only past the cut still get two Workspaces.
        let other = workspace_name(&ns, &format!("{long}x").replace("b-c", "b-d"));
        let hash_at = name.len() - WORKSPACE_HASH_HEX;
        assert_eq!(name[..hash_at], other[..hash_at], "same readable part");
        assert_ne!(name, other);
        for cut in 170..253 {
            let name = workspace_name(&ns, &long[..cut]);
            assert!(is_dns_subdomain(&name), "{cut}: {name}");
        }
    }

    #[test]
    fn a_template_without_annotations_renders_no_empty_map_the_server_would_not_keep() {
        let template: WorkspaceTemplate = serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
            "metadata": {"name": "plain", "namespace": "default"},
            "spec": {"template": {"spec": {"forProvider": {"module": "git::m", "source": "Remote"}}}},
        }))
        .unwrap();
        let ws = render_workspace(&mk_apply(json!({}), None), &template, "w").unwrap();
        let annotations = ws["metadata"]["annotations"].as_object().unwrap();
        let keys: Vec<&str> = annotations.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [INPUTS_ANNOTATION, RENDERING_ANNOTATION],
            "CAPT's only"
        );
        assert_eq!(ws["metadata"]["labels"][APPLY_NAME_LABEL], "demo-eks");
    }

    #[test]
    fn the_workspace_carries_its_applys_uid() {
        let mut apply = mk_apply(json!({}), None);
        apply.metadata.uid = Some("1234-abcd".into());
        let ws = render_workspace(&apply, &mk_template(json!({})), "w").unwrap();
        assert_eq!(ws["metadata"]["labels"][APPLY_UID_LABEL], "1234-abcd");
        assert_eq!(ws["metadata"]["name"], "w");
    }

    #[test]
    fn an_inline_module_echoes_the_revision_of_its_rendering_and_the_workspace_records_it() {
        let template = mk_template(json!({"forProvider": {"source": "Inline",
            "module": "variable \"v\" { type = string }",
            "vars": [{"key": "v", "value": "${cluster}"}]}}));
        let mut apply = mk_apply(json!({"cluster": "one"}), None);
        apply.metadata.generation = Some(3);
        let ws = render_workspace(&apply, &template, "w").unwrap();
        let annotations = &ws["metadata"]["annotations"];
        assert_eq!(annotations[APPLY_GENERATION_ANNOTATION], "3");
        let revision = annotations[REVISION_ANNOTATION].as_str().unwrap();
        assert_eq!(revision.len(), REVISION_HEX);
        let module = ws["spec"]["forProvider"]["module"].as_str().unwrap();
        assert!(
            module.starts_with("variable \"v\" { type = string }\n"),
            "{module}"
        );
        assert!(
            module.ends_with(&format!(
                "output \"{REVISION_OUTPUT}\" {{\n  value = \"{revision}\"\n}}\n"
            )),
            "{module}"
        );
        // The same rendering, the same revision; another variable value, another one.
        let again = render_workspace(&apply, &template, "w").unwrap();
        assert_eq!(again, ws);
        let other =
            render_workspace(&mk_apply(json!({"cluster": "two"}), None), &template, "w").unwrap();
        assert_ne!(
            other["metadata"]["annotations"][REVISION_ANNOTATION],
            revision
        );
    }

    #[test]
    fn a_remote_or_json_module_gets_no_revision_and_a_template_cannot_set_one() {
        let mut template = mk_template(json!({"forProvider": {"source": "Remote",
            "module": "git::https://example.com/m.git"}}));
        template
            .spec
            .template
            .metadata
            .as_mut()
            .unwrap()
            .annotations = Some(BTreeMap::from([(
            REVISION_ANNOTATION.to_owned(),
            "forged".to_owned(),
        )]));
        let ws = render_workspace(&mk_apply(json!({}), None), &template, "w").unwrap();
        assert!(
            ws["metadata"]["annotations"]
                .get(REVISION_ANNOTATION)
                .is_none(),
            "{ws}"
        );
        assert_eq!(
            ws["spec"]["forProvider"]["module"],
            "git::https://example.com/m.git"
        );
        let json_module = mk_template(json!({"forProvider": {"source": "Inline",
            "inlineFormat": "JSON", "module": "{}"}}));
        let ws = render_workspace(&mk_apply(json!({}), None), &json_module, "w").unwrap();
        assert_eq!(ws["spec"]["forProvider"]["module"], "{}");
        assert!(
            ws["metadata"]["annotations"]
                .get(REVISION_ANNOTATION)
                .is_none()
        );
    }

    #[test]
    fn the_deletion_policy_is_rendered_only_when_the_template_names_it() {
        let ws = render_workspace(&mk_apply(json!({}), None), &mk_template(json!({})), "w");
        assert!(ws.unwrap()["spec"].get("deletionPolicy").is_none());
        let template = mk_template(json!({"deletionPolicy": DELETION_POLICY}));
        let ws = render_workspace(&mk_apply(json!({}), None), &template, "w");
        assert_eq!(ws.unwrap()["spec"]["deletionPolicy"], DELETION_POLICY);
    }

    #[test]
    fn the_inputs_digest_changes_with_the_apply_and_the_template_only() {
        let template = mk_template(json!({"forProvider": {"module": "m"}}));
        let apply = mk_apply(json!({"cluster": "one"}), None);
        let digest = inputs_digest(&apply, &template, "w");
        let ws = render_workspace(&apply, &template, "w").unwrap();
        assert_eq!(ws["metadata"]["annotations"][INPUTS_ANNOTATION], digest);
        assert_eq!(
            ws["metadata"]["annotations"][RENDERING_ANNOTATION],
            RENDERING.to_string()
        );
        let mut later = apply.clone();
        later.metadata.generation = Some(9);
        later.metadata.resource_version = Some("77".into());
        assert_eq!(
            inputs_digest(&later, &template, "w"),
            digest,
            "metadata alone"
        );
        let other = mk_apply(json!({"cluster": "two"}), None);
        assert_ne!(inputs_digest(&other, &template, "w"), digest, "apply");
        let changed = mk_template(json!({"forProvider": {"module": "m2"}}));
        assert_ne!(inputs_digest(&apply, &changed, "w"), digest, "template");
        assert_ne!(inputs_digest(&apply, &template, "w2"), digest, "name");
    }
}
