//! Types shared by several CAPT kinds.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A reference to a namespaced object; the namespace defaults to the referrer's.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespacedRef {
    /// Name of the referenced object.
    #[schemars(length(max = super::bounds::MAX_NAME))]
    pub name: String,
    /// Namespace of the referenced object; the referrer's namespace when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::bounds::MAX_NAMESPACE))]
    pub namespace: Option<String>,
}

/// A reference to a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Name of the Secret.
    #[schemars(length(max = super::bounds::MAX_NAME))]
    pub name: String,
    /// Namespace of the Secret.
    #[schemars(length(max = super::bounds::MAX_NAMESPACE))]
    pub namespace: String,
}

/// The address of a Kubernetes API server (the Cluster API `APIEndpoint`).
///
/// Cluster API v1beta2 makes both fields optional (`omitempty`), so a Cluster may hold an
/// endpoint with a host and no port, or a port and no host. An absent field reads as Go's
/// zero value (`""`, `0`) and is left out again when written. Such an endpoint means what it
/// means to core: nothing yet. Core's `APIEndpoint.IsValid()` wants a host and a non-zero
/// port, and where a Cluster's endpoint is not valid core fills it in from the infrastructure
/// cluster, then the control plane. CAPT reads every endpoint through
/// `status::endpoint::is_valid` (the same rule, with the port in range): one that is not
/// valid is treated as unset, never shown nor copied.
///
/// Our own CRDs still require both fields (see [`whole_endpoint_schema`]): the controller
/// writes an endpoint only whole.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = whole_endpoint_schema)]
pub struct ApiEndpoint {
    /// Host name or IP address, without scheme.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
    /// Port; 443 unless the source names another.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub port: i32,
}

fn is_zero(port: &i32) -> bool {
    *port == 0
}

/// The schema of [`ApiEndpoint`] in our CRDs: host and port both required, as before they
/// could be absent in a Cluster.
fn whole_endpoint_schema(schema: &mut Schema) {
    schema.insert("required".into(), serde_json::json!(["host", "port"]));
}

/// What the controller observed of a WorkspaceTemplateApply and its Workspace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceTemplateStatus {
    /// True when the Workspace is synced and ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// The Workspace's `Ready` reason (Available, Creating, Unavailable, Deleting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The last `atProvider.checksum` seen applied successfully.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_applied_revision: Option<String>,
    /// The last checksum whose apply failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failed_revision: Option<String>,
    /// The provider's message for the last failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_message: Option<String>,
    /// Non-sensitive Terraform outputs, rendered as strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<BTreeMap<String, String>>,
}

/// A condition as Cluster API's v1beta1 contract reads it: a `metav1.Condition` and, while
/// it is False, a `severity`. Core mirrors a provider object's `Ready` condition into the
/// Cluster and summarizes by severity: a False condition without one does not hold the
/// Cluster's `Ready` back. Schema only; [`crate::status::conditions`] writes the severity.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ClusterApiCondition {
    #[serde(flatten)]
    condition: Condition,
    /// How bad a False condition is: `Error`, `Warning` or `Info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(Error|Warning|Info)$"))]
    severity: Option<String>,
}

/// Schema of a condition list that several field managers can share under server-side apply:
/// plain `metav1.Condition`s (the v1beta2 contract), a list-type map keyed by `type`.
pub fn conditions_schema(generator: &mut SchemaGenerator) -> Schema {
    list_map_by_type(generator.subschema_for::<Vec<Condition>>())
}

/// Schema of `status.deprecated.v1beta1.conditions`: the v1beta1 contract's conditions, with
/// their `severity`, kept for the v1beta1 view of the Cluster while core still serves it.
pub fn v1beta1_conditions_schema(generator: &mut SchemaGenerator) -> Schema {
    list_map_by_type(generator.subschema_for::<Vec<ClusterApiCondition>>())
}

fn list_map_by_type(mut schema: Schema) -> Schema {
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
    schema
}

/// Fields the v1beta2 contract moved out of the way: `status.deprecated`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeprecatedStatus {
    /// What the v1beta1 contract read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v1beta1: Option<V1Beta1DeprecatedStatus>,
}

/// The v1beta1 contract's conditions (`status.deprecated.v1beta1`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct V1Beta1DeprecatedStatus {
    /// `Ready` with a `severity` while False: what core mirrors into the Cluster's v1beta1
    /// conditions (`InfrastructureReady`, `ControlPlaneReady`) and summarizes by severity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "v1beta1_conditions_schema")]
    pub conditions: Option<Vec<Condition>>,
}

/// Schema of a field holding arbitrary JSON (kept verbatim by the API server).
pub fn any_json_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// An AWS region name such as `ap-northeast-1` or `us-gov-west-1`.
pub const REGION_PATTERN: &str = r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-[0-9]+$";
