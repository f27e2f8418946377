//! `CAPTCluster`: the Cluster API infrastructure cluster, backed by a VPC Workspace.

use super::common::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Finalizer the controller keeps on a CAPTCluster until its VPC is gone (or retained).
pub const CAPT_CLUSTER_FINALIZER: &str = "infrastructure.cluster.x-k8s.io/captcluster";

/// Desired state of a CAPTCluster: where its VPC comes from.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "CAPTCluster",
    derive = "PartialEq",
    plural = "captclusters",
    shortname = "captc",
    category = "cluster-api",
    namespaced,
    doc = "A Cluster API infrastructure cluster whose VPC is built by a Terraform Workspace.",
    status = "CAPTClusterStatus",
    printcolumn = r#"{"name":"VPC-ID","type":"string","jsonPath":".status.vpcId","description":"ID of the VPC"}"#,
    printcolumn = r#"{"name":"READY","type":"boolean","jsonPath":".status.ready","description":"Infrastructure is ready"}"#,
    printcolumn = r#"{"name":"ENDPOINT","type":"string","jsonPath":".status.endpoint","description":"The Cluster's control plane endpoint (host:port)"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("has(self.vpcTemplateRef) != has(self.existingVpcId)").message("exactly one of spec.vpcTemplateRef and spec.existingVpcId must be set"))]
// The apply name is set once: the controller records it, and deletion acts on it (only when
// the apply proves to be this object's, but a name that cannot move is one less lever).
#[x_kube(validation = Rule::new("!has(oldSelf.workspaceTemplateApplyName) || has(self.workspaceTemplateApplyName)").message("spec.workspaceTemplateApplyName cannot be removed once set"))]
#[serde(rename_all = "camelCase")]
pub struct CAPTClusterSpec {
    /// AWS region of the VPC, e.g. `ap-northeast-1`.
    #[schemars(regex(pattern = REGION_PATTERN))]
    pub region: String,
    /// WorkspaceTemplate that creates the VPC. Exactly one of this and `existingVpcId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vpc_template_ref: Option<NamespacedRef>,
    /// ID of a VPC that already exists. Exactly one of this and `vpcTemplateRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing_vpc_id: Option<String>,
    /// Keep the VPC's WorkspaceTemplateApply when the CAPTCluster is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_vpc_on_delete: Option<bool>,
    /// VPC settings passed to the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vpc_config: Option<VpcConfig>,
    /// Name of the VPC WorkspaceTemplateApply; recorded by the controller when it creates or
    /// adopts one. Set once: it cannot change nor be removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.workspaceTemplateApplyName is immutable once set"))]
    pub workspace_template_apply_name: Option<String>,
    /// Control plane endpoint (Cluster API infrastructure contract); informational here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
}

/// VPC settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VpcConfig {
    /// Name of the VPC. It reaches the Terraform template as `${VPC_NAME}`, after its
    /// namespace (`<namespace>_<name>`), so it is a plain literal (letters, digits, `.`, `_`,
    /// `-`).
    #[schemars(regex(pattern = crate::variables::PLAIN_LITERAL_PATTERN), length(max = 253))]
    pub name: String,
}

/// Observed state of a CAPTCluster, written only through the status-applier.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CAPTClusterStatus {
    /// Deprecated (the v1beta1 contract's `provisioned`, for core before v1.11): the same as
    /// `initialization.provisioned`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// The v1beta2 contract's initialization: `provisioned` once the VPC has been ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<CAPTClusterInitialization>,
    /// ID of the VPC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vpc_id: Option<String>,
    /// Name of the VPC Workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vpc_workspace_name: Option<String>,
    /// Programmatic token of a terminal failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// Human-readable message of a terminal failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
    /// Failure domains available for machine placement: the VPC's availability zones (its
    /// `azs` output), when it reports them; the v1beta2 contract's list keyed by `name`.
    // Read in either shape: builds before v0.1.0 stored the v1beta1 contract's map keyed by
    // name (`failure_domains_in_either_shape`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "failure_domains_in_either_shape"
    )]
    #[schemars(schema_with = "failure_domains_schema")]
    pub failure_domains: Option<Vec<FailureDomain>>,
    /// The owning Cluster's control plane endpoint as `host:port`, for display.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// What the controller observed of the VPC WorkspaceTemplateApply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_template_status: Option<WorkspaceTemplateStatus>,
    /// Conditions (Ready, VPCReady, VPCFailed, WaitingForCluster, Paused, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Option<Vec<Condition>>,
    /// The v1beta1 contract's conditions, for the Cluster's v1beta1 view.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated: Option<DeprecatedStatus>,
    /// The generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The v1beta2 contract's `status.initialization` of an InfraCluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CAPTClusterInitialization {
    /// True once the VPC has been ready; it then stays true (core orchestrates provisioning
    /// on it). The `Ready` condition tells the state of now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

/// A Cluster API failure domain (v1beta2 contract).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    /// Name of the failure domain (an availability zone); unique in the list.
    pub name: String,
    /// Whether control plane machines may be placed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    /// Free-form attributes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attributes: Option<BTreeMap<String, String>>,
}

/// `status.failureDomains` as the list it is, or as the map keyed by name that builds before
/// v0.1.0 wrote (the v1beta1 contract's shape, under the same API version): an object they
/// stored stays readable. Read in
/// the type, so that every reader (the watches, the reconcilers) reads both. (v0.1.0 wrote the
/// list already: an upgrade from it stores no map.)
fn failure_domains_in_either_shape<'de, D>(
    deserializer: D,
) -> Result<Option<Vec<FailureDomain>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    /// A failure domain of the map shape: the name is its key.
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Keyed {
        #[serde(default)]
        control_plane: Option<bool>,
        #[serde(default)]
        attributes: Option<BTreeMap<String, String>>,
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Shape {
        List(Vec<FailureDomain>),
        Map(BTreeMap<String, Keyed>),
    }
    Ok(
        Option::<Shape>::deserialize(deserializer)?.map(|shape| match shape {
            Shape::List(list) => list,
            Shape::Map(map) => map
                .into_iter()
                .map(|(name, keyed)| FailureDomain {
                    name,
                    control_plane: keyed.control_plane,
                    attributes: keyed.attributes,
                })
                .collect(),
        }),
    )
}

/// `status.failureDomains`: a list-type map keyed by `name`, as the contract defines it.
fn failure_domains_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<FailureDomain>>();
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["name"]),
    );
    schema
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn failure_domains_stored_as_the_earlier_map_read_as_the_list() {
        let status: CAPTClusterStatus = serde_json::from_value(json!({"failureDomains": {
            "ap-northeast-1a": {"controlPlane": true},
            "ap-northeast-1c": {"attributes": {"zone": "c"}}}}))
        .unwrap();
        let domains = status.failure_domains.unwrap();
        assert_eq!(domains.len(), 2);
        assert_eq!(domains[0].name, "ap-northeast-1a");
        assert_eq!(domains[0].control_plane, Some(true));
        assert_eq!(domains[1].name, "ap-northeast-1c");
        assert_eq!(domains[1].attributes.as_ref().unwrap()["zone"], "c");
        let list = serde_json::to_value(CAPTClusterStatus {
            failure_domains: Some(domains),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(list["failureDomains"][0]["name"], "ap-northeast-1a");
        let again: CAPTClusterStatus = serde_json::from_value(list).unwrap();
        assert_eq!(again.failure_domains.unwrap().len(), 2);
        let none: CAPTClusterStatus = serde_json::from_value(json!({})).unwrap();
        assert!(none.failure_domains.is_none());
    }
}
