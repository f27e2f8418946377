//! Rendering a WorkspaceTemplateApply and its WorkspaceTemplate into the provider-terraform
//! Workspace they describe. Pure: no API server.

use crate::api::{WorkspaceTemplate, WorkspaceTemplateApply};
use kube::ResourceExt;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// Label on a Workspace naming the namespace of the apply that rendered it.
pub const APPLY_NAMESPACE_LABEL: &str =
    "infrastructure.cluster.x-k8s.io/workspacetemplateapply-namespace";
/// Label on a Workspace naming the apply that rendered it.
pub const APPLY_NAME_LABEL: &str = "infrastructure.cluster.x-k8s.io/workspacetemplateapply-name";
/// Prefix of the labels naming the CAPT object an apply serves.
pub const OWNER_LABEL_PREFIX: &str = "infrastructure.cluster.x-k8s.io/owner-";
/// Label naming the Cluster API Cluster an object belongs to (the Cluster API convention).
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// The variable that stands for the Workspace's own name.
pub const WORKSPACE_NAME_VARIABLE: &str = "WORKSPACE_NAME";

/// Why a Workspace could not be rendered.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RenderError {
    /// The template's spec is not an object.
    #[error("WorkspaceTemplate {0}: spec.template.spec must be an object")]
    SpecNotObject(String),
}

/// The name of the Workspace of an apply. Workspaces are cluster-scoped, so the name
/// carries the apply's namespace.
pub fn workspace_name(apply: &WorkspaceTemplateApply) -> String {
    let name = format!(
        "{}-{}",
        apply.namespace().unwrap_or_default(),
        apply.name_any()
    );
    name.chars().take(253).collect()
}

/// The Workspace object (an apply configuration) for `apply` rendered from `template`.
///
/// `${key}` in any string of the template's spec, labels and annotations is replaced by the
/// apply's variable `key`, and `${WORKSPACE_NAME}` by the Workspace's name. Other `${…}`
/// (Terraform's own interpolation) are left as they are.
pub fn render_workspace(
    apply: &WorkspaceTemplateApply,
    template: &WorkspaceTemplate,
) -> Result<Value, RenderError> {
    let name = workspace_name(apply);
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
    let mut spec = substitute(&body.spec, &variables);
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
    // The CAPT object the apply serves, so that a change of the Workspace alone (new outputs,
    // same conditions) wakes that object's reconciler directly.
    for (k, v) in apply.labels() {
        if k.starts_with(OWNER_LABEL_PREFIX) {
            labels.insert(k.clone(), v.clone());
        }
    }
    let annotations = substitute_map(metadata.annotations.unwrap_or_default(), &variables);
    Ok(json!({
        "apiVersion": "tf.upbound.io/v1beta1",
        "kind": "Workspace",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": spec,
    }))
}

fn substitute_map(
    map: BTreeMap<String, String>,
    variables: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    map.into_iter()
        .map(|(k, v)| (k, substitute_str(&v, variables)))
        .collect()
}

fn substitute(value: &Value, variables: &BTreeMap<String, String>) -> Value {
    match value {
        Value::String(s) => Value::String(substitute_str(s, variables)),
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| substitute(v, variables)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), substitute(v, variables)))
                .collect::<Map<_, _>>(),
        ),
        other => other.clone(),
    }
}

fn substitute_str(s: &str, variables: &BTreeMap<String, String>) -> String {
    variables.iter().fold(s.to_owned(), |acc, (key, value)| {
        acc.replace(&format!("${{{key}}}"), value)
    })
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
    fn variables_and_the_workspace_name_are_substituted_everywhere() {
        let template = mk_template(
            json!({"forProvider": {"module": "name = \"${cluster}\" ws = \"${WORKSPACE_NAME}\"",
            "vars": [{"key": "region", "value": "${region}"}]}}),
        );
        let ws = render_workspace(
            &mk_apply(json!({"cluster": "demo", "region": "ap-northeast-1"}), None),
            &template,
        )
        .unwrap();
        assert_eq!(ws["metadata"]["name"], "default-demo-eks");
        assert_eq!(
            ws["spec"]["forProvider"]["module"],
            "name = \"demo\" ws = \"default-demo-eks\""
        );
        assert_eq!(
            ws["spec"]["forProvider"]["vars"][0]["value"],
            "ap-northeast-1"
        );
        assert_eq!(ws["metadata"]["annotations"]["note"], "demo");
        assert_eq!(ws["metadata"]["labels"][APPLY_NAME_LABEL], "demo-eks");
        assert_eq!(ws["metadata"]["labels"][APPLY_NAMESPACE_LABEL], "default");
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
        let ws = render_workspace(&apply, &mk_template(json!({}))).unwrap();
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
        let ws = render_workspace(&mk_apply(json!({}), None), &template).unwrap();
        assert_eq!(
            ws["spec"]["forProvider"]["module"],
            "tags = { Name = \"${var.name}\" }"
        );
    }

    #[test]
    fn the_applys_connection_secret_wins_over_the_templates() {
        let template = mk_template(json!({}));
        let ws = render_workspace(&mk_apply(json!({}), Some("apply-secret")), &template).unwrap();
        assert_eq!(
            ws["spec"]["writeConnectionSecretToRef"]["name"],
            "apply-secret"
        );
        let ws = render_workspace(&mk_apply(json!({}), None), &template).unwrap();
        assert_eq!(
            ws["spec"]["writeConnectionSecretToRef"]["name"],
            "template-secret"
        );
    }

    #[test]
    fn a_template_whose_spec_is_not_an_object_is_refused_by_name() {
        let template = mk_template(json!("nope"));
        let err = render_workspace(&mk_apply(json!({}), None), &template).unwrap_err();
        assert_eq!(
            err.to_string(),
            "WorkspaceTemplate default/eks: spec.template.spec must be an object"
        );
    }
}
