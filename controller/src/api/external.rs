//! Partial views of the upstream kinds CAPT reads and writes: the Cluster API `Cluster`
//! and provider-terraform's `Workspace`. Their CRDs are upstream's; we never generate them.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ApiEndpoint;

/// The fields of a Cluster API `Cluster` spec CAPT reads; the rest is kept as it is.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta1",
    kind = "Cluster",
    namespaced,
    schema = "disabled",
    status = "ClusterStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// The infrastructure cluster (a CAPTCluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ObjectReference>,
    /// The control plane (a CAPTControlPlane).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_ref: Option<ObjectReference>,
    /// The API server endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// True while the Cluster and everything it owns must not change (`clusterctl move`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Every other field.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// The fields of a Cluster's status CAPT reads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// Phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Infrastructure ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ready: Option<bool>,
    /// Control plane ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_ready: Option<bool>,
    /// Every other field.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// A provider-terraform `Workspace` (cluster-scoped), kept as JSON: CAPT renders its spec
/// from templates and reads its status through [`crate::status`].
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "tf.upbound.io",
    version = "v1beta1",
    kind = "Workspace",
    root = "TerraformWorkspace",
    schema = "disabled",
    status = "Value"
)]
pub struct TerraformWorkspaceSpec {
    /// The whole spec.
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}
