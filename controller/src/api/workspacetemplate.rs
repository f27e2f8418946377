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
    /// The Workspace's `spec` (provider-terraform `WorkspaceSpec`); `${key}` is substituted
    /// from the apply's variables, `${WORKSPACE_NAME}` by the Workspace's name.
    #[schemars(schema_with = "any_json_schema")]
    pub spec: serde_json::Value,
}

/// Labels and annotations.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
    /// Values substituted for `${key}` in the template: plain literals only (letters,
    /// digits, `.`, `_`, `-`; at most 253 characters), since they are pasted into Terraform.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "variables_schema")]
    pub variables: Option<BTreeMap<String, String>>,
    /// Where the Workspace writes its connection Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_connection_secret_to_ref: Option<SecretRef>,
    /// Secrets that must exist before the Workspace is rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_secrets: Option<Vec<SecretRef>>,
    /// Workspaces that must be ready before the Workspace is rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_workspaces: Option<Vec<NamespacedRef>>,
    /// Keep the Workspace when this apply is deleted.
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

/// Schema of `spec.variables`: a map of plain literals (`crate::variables`), so that a value
/// that could become Terraform code is refused by the API server already.
fn variables_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "nullable": true,
        "additionalProperties": {
            "type": "string",
            "pattern": crate::variables::PLAIN_LITERAL_PATTERN,
            "maxLength": crate::variables::MAX_VALUE,
        },
    })
}
