//! `WorkspaceTemplate` and `WorkspaceTemplateApply`: how CAPT renders provider-terraform
//! Workspaces.

use super::common::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A template of a provider-terraform Workspace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "WorkspaceTemplate",
    derive = "PartialEq",
    plural = "workspacetemplates",
    shortname = "wt",
    category = "cluster-api",
    namespaced,
    doc = "A template of a provider-terraform Workspace, rendered by WorkspaceTemplateApply.",
    status = "WorkspaceTemplateStatusSummary"
)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceTemplateSpec {
    /// The Workspace to render.
    pub template: WorkspaceTemplateBody,
    /// Where the Workspace writes its connection Secret; an apply's own value wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_connection_secret_to_ref: Option<SecretRef>,
}

/// Metadata and spec of the rendered Workspace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceTemplateBody {
    /// Labels and annotations of the Workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// The Workspace's `spec` (provider-terraform `WorkspaceSpec`); `${key}` in
    /// `forProvider.vars[].value` and `varmap` is the apply's variable `key`,
    /// `${WORKSPACE_NAME}` anywhere the Workspace's name.
    #[schemars(schema_with = "any_json_schema")]
    pub spec: serde_json::Value,
}

/// Labels and annotations.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::bounds::template_metadata_schema")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::bounds::template_metadata_schema")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// Status of a WorkspaceTemplate (nothing is tracked yet).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceTemplateStatusSummary {
    /// Conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Option<Vec<Condition>>,
}

/// Renders one WorkspaceTemplate into one Workspace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "WorkspaceTemplateApply",
    derive = "PartialEq",
    plural = "workspacetemplateapplies",
    shortname = "wta",
    category = "cluster-api",
    namespaced,
    doc = "Renders a WorkspaceTemplate into a provider-terraform Workspace and mirrors its state.",
    status = "WorkspaceTemplateApplyStatus",
    printcolumn = r#"{"name":"WORKSPACE","type":"string","jsonPath":".status.workspaceName"}"#,
    printcolumn = r#"{"name":"APPLIED","type":"boolean","jsonPath":".status.applied"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceTemplateApplySpec {
    /// The template to render.
    pub template_ref: NamespacedRef,
    /// Values of the template's Terraform variables: `${key}` is replaced only where the
    /// template's `forProvider.vars[].value` or `varmap` (and the Workspace's labels and
    /// annotations) name it, never in the module or any other field, so any string is a
    /// value. A key is an identifier; one the template does not name is refused (but the keys
    /// CAPT passes: `CLUSTER_NAME`, `REGION`, `KUBERNETES_VERSION`, `VPC_NAME`). The names
    /// `CLUSTER_NAME` and `VPC_NAME` carry their namespace (`<namespace>_<name>`): a value
    /// starting with another namespace's `<namespace>_`, or another namespace's older bare
    /// name, is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "variables_schema")]
    pub variables: Option<BTreeMap<String, String>>,
    /// Where the Workspace writes its connection Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_connection_secret_to_ref: Option<SecretRef>,
    /// Secrets that must exist before the Workspace is rendered (at most 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::bounds::MAX_WAITS))]
    pub wait_for_secrets: Option<Vec<SecretRef>>,
    /// Workspaces that must be ready before the Workspace is rendered (at most 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::bounds::MAX_WAITS))]
    pub wait_for_workspaces: Option<Vec<NamespacedRef>>,
    /// Not honoured, and an apply that sets it to true is not rendered: keeping a Workspace
    /// (and the infrastructure it runs on the platform's credentials) is the platform's to
    /// decide, never a tenant's object's (a VPC is kept by `retainVpcOnDelete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_workspace_on_delete: Option<bool>,
}

/// Observed state of a WorkspaceTemplateApply (field manager `capt-workspacetemplateapply`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceTemplateApplyStatus {
    /// Name of the rendered Workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_name: Option<String>,
    /// True once the Workspace has been rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<bool>,
    /// When the Workspace was last rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_applied_time: Option<Time>,
    /// Conditions mirrored from the Workspace (Synced, Ready).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Option<Vec<Condition>>,
}

/// Schema of `spec.variables`: identifiers as keys (`crate::variables`), any string as a value
/// (it reaches Terraform as a variable's value, never as its code).
fn variables_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "nullable": true,
        "maxProperties": crate::variables::MAX_VARIABLES,
        "additionalProperties": {
            "type": "string",
            "maxLength": crate::variables::MAX_VALUE,
        },
        "x-kubernetes-validations": [{
            "rule": format!(
                "self.all(k, size(k) <= {} && k.matches('{}'))",
                crate::variables::MAX_KEY,
                crate::variables::KEY_PATTERN
            ),
            "message": format!(
                "every key of spec.variables is an identifier ({}, at most {} characters)",
                crate::variables::KEY_PATTERN,
                crate::variables::MAX_KEY
            ),
        }],
    })
}
