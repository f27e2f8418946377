//! `CAPTClusterTemplate` and `CAPTControlPlaneTemplate`: what a ClusterClass names, for Cluster
//! API core's topology controller to stamp out a `CAPTCluster` and a `CAPTControlPlane` per
//! Cluster (the InfraClusterTemplate and ControlPlaneTemplate contracts: `spec.template.spec`,
//! optional `spec.template.metadata`). Nothing in CAPT reads them; core does.
//!
//! The template specs hold what a user sets, never what the controller or core fills in:
//! no `controlPlaneEndpoint`, no `workspaceTemplateApplyName`, and for the control plane no
//! `version` (core sets it from the Cluster's `spec.topology.version`).

use super::captcluster::VpcConfig;
use super::captcontrolplane::ControlPlaneConfig;
use super::common::*;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Labels and annotations core copies onto the object it creates from a template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateObjectMeta {
    /// Labels of the created object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::bounds::template_metadata_schema")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations of the created object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::bounds::template_metadata_schema")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// Desired state of a CAPTClusterTemplate.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "CAPTClusterTemplate",
    plural = "captclustertemplates",
    category = "cluster-api",
    namespaced,
    doc = "A template of CAPTClusters, for a ClusterClass's infrastructure."
)]
#[serde(rename_all = "camelCase")]
pub struct CAPTClusterTemplateSpec {
    /// What each CAPTCluster made from this template is.
    pub template: CAPTClusterTemplateResource,
}

/// The CAPTCluster to make.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CAPTClusterTemplateResource {
    /// Labels and annotations of the CAPTCluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateObjectMeta>,
    /// The CAPTCluster's spec.
    pub spec: CAPTClusterTemplateResourceSpec,
}

/// The part of a CAPTCluster's spec a template sets (see `CAPTClusterSpec`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("has(self.vpcTemplateRef) != has(self.existingVpcId)").message("exactly one of spec.template.spec.vpcTemplateRef and spec.template.spec.existingVpcId must be set"))]
#[serde(rename_all = "camelCase")]
pub struct CAPTClusterTemplateResourceSpec {
    /// AWS region, e.g. `ap-northeast-1`.
    #[schemars(regex(pattern = REGION_PATTERN))]
    pub region: String,
    /// WorkspaceTemplate that creates the VPC (or set `existingVpcId`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vpc_template_ref: Option<NamespacedRef>,
    /// An existing VPC to use instead of creating one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing_vpc_id: Option<String>,
    /// Keep the VPC when the CAPTCluster is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_vpc_on_delete: Option<bool>,
    /// VPC settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vpc_config: Option<VpcConfig>,
}

/// Desired state of a CAPTControlPlaneTemplate.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "controlplane.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "CAPTControlPlaneTemplate",
    plural = "captcontrolplanetemplates",
    category = "cluster-api",
    namespaced,
    doc = "A template of CAPTControlPlanes, for a ClusterClass's control plane."
)]
#[serde(rename_all = "camelCase")]
pub struct CAPTControlPlaneTemplateSpec {
    /// What each CAPTControlPlane made from this template is.
    pub template: CAPTControlPlaneTemplateResource,
}

/// The CAPTControlPlane to make.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CAPTControlPlaneTemplateResource {
    /// Labels and annotations of the CAPTControlPlane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateObjectMeta>,
    /// The CAPTControlPlane's spec, but its version (the Cluster's `spec.topology.version`).
    pub spec: CAPTControlPlaneTemplateResourceSpec,
}

/// The part of a CAPTControlPlane's spec a template sets (see `CAPTControlPlaneSpec`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CAPTControlPlaneTemplateResourceSpec {
    /// WorkspaceTemplate that creates the EKS cluster.
    pub workspace_template_ref: NamespacedRef,
    /// EKS settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_config: Option<ControlPlaneConfig>,
    /// Tags added to every AWS resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::bounds::tags_schema")]
    pub additional_tags: Option<BTreeMap<String, String>>,
}
