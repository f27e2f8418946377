//! Partial views of the upstream kinds CAPT reads and writes: the Cluster API `Cluster`
//! and provider-terraform's `Workspace`. Their CRDs are upstream's; we never generate them.

use compact_json::CompactJson;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{CustomResource, Resource};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::BTreeMap;

use super::ApiEndpoint;

/// The fields of a Cluster API `Cluster` spec CAPT reads, in `v1beta2` (what core v1.11+
/// stores; core plans to stop serving `v1beta1` in v1.16); the rest is kept as it is.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Cluster",
    derive = "PartialEq",
    namespaced,
    schema = "disabled",
    status = "ClusterStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// The infrastructure cluster (a CAPTCluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ContractVersionedObjectReference>,
    /// The control plane (a CAPTControlPlane).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_ref: Option<ContractVersionedObjectReference>,
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

/// A v1beta2 reference from a Cluster to an object in its own namespace: group, kind and
/// name, no version (core finds it from the CRD's contract label) and no namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContractVersionedObjectReference {
    /// The referenced object's API group.
    #[serde(default)]
    pub api_group: String,
    /// Its kind.
    #[serde(default)]
    pub kind: String,
    /// Its name.
    #[serde(default)]
    pub name: String,
}

impl ContractVersionedObjectReference {
    /// True when it names kind `K` (group and kind) by `name`.
    pub fn names<K: kube::Resource<DynamicType = ()>>(&self, name: &str) -> bool {
        self.api_group == K::group(&()) && self.kind == K::kind(&()) && self.name == name
    }

    /// The name, when it names an object of kind `K`.
    pub fn name_of<K: kube::Resource<DynamicType = ()>>(&self) -> Option<&str> {
        (self.api_group == K::group(&()) && self.kind == K::kind(&()))
            .then_some(self.name.as_str())
            .filter(|n| !n.is_empty())
    }
}

/// The fields of a Cluster's v1beta2 status that tell how far it got (the controller's cache
/// keeps no status: they are for those who read it whole).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// Phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// What has been provisioned and initialized (sticky).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ClusterInitialization>,
    /// Every other field.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// A Cluster's `status.initialization` (v1beta2; v1beta1's `infrastructureReady` and
/// `controlPlaneReady`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInitialization {
    /// The infrastructure cluster reported itself provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_provisioned: Option<bool>,
    /// The control plane reported itself initialized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_initialized: Option<bool>,
}

/// A provider-terraform `Workspace` (cluster-scoped), its spec and status kept compact: CAPT
/// renders the spec from templates and reads the status through [`crate::status`], never
/// field by field, and the controller caches every Workspace. As `serde_json::Value`s a
/// provisioned stack's two Workspaces were about 20 KB, the largest part of the cache.
///
/// In the cache its annotations are compact too ([`TerraformWorkspace::compact_annotations`]:
/// a map costs a 544-byte B-tree node and two strings per entry; with its labels, a cached
/// Workspace's `ObjectMeta` was 1.9 KB at 1,000 clusters). Every reader reads them as the
/// Workspace's JSON (`Serialize` puts them back in `metadata.annotations`) or with
/// [`TerraformWorkspace::annotations`], never from `metadata` itself.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TerraformWorkspace {
    /// Metadata (without its annotations once they are compact).
    pub metadata: ObjectMeta,
    /// The spec.
    pub spec: TerraformWorkspaceSpec,
    /// The status.
    pub status: Option<CompactJson>,
    /// `metadata.annotations`, once compact.
    annotations: Option<CompactJson>,
}

/// The spec of a Workspace, whole.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(transparent)]
pub struct TerraformWorkspaceSpec {
    /// The whole spec.
    pub fields: CompactJson,
}

impl Resource for TerraformWorkspace {
    type DynamicType = ();
    type Scope = k8s_openapi::ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Workspace".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "tf.upbound.io".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1beta1".into()
    }

    fn api_version(_: &()) -> Cow<'_, str> {
        "tf.upbound.io/v1beta1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "workspaces".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl TerraformWorkspace {
    /// The spec, as a JSON value.
    pub fn spec_value(&self) -> Value {
        self.spec.fields.value()
    }

    /// The status, as a JSON value (`null` when there is none).
    pub fn status_value(&self) -> Value {
        self.status
            .as_ref()
            .map(CompactJson::value)
            .unwrap_or_default()
    }

    /// Its annotations, compact or not.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        let mut annotations = self.metadata.annotations.clone().unwrap_or_default();
        if let Some(compact) = &self.annotations {
            annotations.extend(compact.parse::<BTreeMap<String, String>>());
        }
        annotations
    }

    /// The size of its compact annotations (0: none are compact).
    pub fn compact_annotations_len(&self) -> usize {
        self.annotations
            .as_ref()
            .map_or(0, CompactJson::compressed_len)
    }

    /// Moves its annotations out of `metadata` into their compact form, by `compact`.
    pub fn compact_annotations(&mut self, compact: impl FnOnce(&Value) -> CompactJson) {
        if self.metadata.annotations.is_none() {
            return;
        }
        let all = self.annotations();
        self.metadata.annotations = None;
        self.annotations = Some(compact(&serde_json::json!(all)));
    }
}

impl Serialize for TerraformWorkspace {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let metadata = match &self.annotations {
            None => Cow::Borrowed(&self.metadata),
            Some(_) => Cow::Owned(ObjectMeta {
                annotations: Some(self.annotations()),
                ..self.metadata.clone()
            }),
        };
        let fields = if self.status.is_some() { 5 } else { 4 };
        let mut out = serializer.serialize_struct("Workspace", fields)?;
        out.serialize_field("apiVersion", &Self::api_version(&()))?;
        out.serialize_field("kind", &Self::kind(&()))?;
        out.serialize_field("metadata", &metadata)?;
        out.serialize_field("spec", &self.spec)?;
        if let Some(status) = &self.status {
            out.serialize_field("status", status)?;
        }
        out.end()
    }
}

impl<'de> Deserialize<'de> for TerraformWorkspace {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// A Workspace as the API server sends it.
        #[derive(Deserialize)]
        struct Sent {
            #[serde(default)]
            metadata: ObjectMeta,
            #[serde(default)]
            spec: TerraformWorkspaceSpec,
            #[serde(default)]
            status: Option<CompactJson>,
        }
        let Sent {
            metadata,
            spec,
            status,
        } = Sent::deserialize(deserializer)?;
        Ok(Self {
            metadata,
            spec,
            status,
            annotations: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CAPTCluster, CAPTControlPlane};
    use serde_json::json;

    fn reference(api_group: &str, kind: &str, name: &str) -> ContractVersionedObjectReference {
        ContractVersionedObjectReference {
            api_group: api_group.into(),
            kind: kind.into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_reference_names_our_object_only_with_our_group_and_kind() {
        let ours = reference("controlplane.cluster.x-k8s.io", "CAPTControlPlane", "cp");
        assert!(ours.names::<CAPTControlPlane>("cp"));
        assert_eq!(ours.name_of::<CAPTControlPlane>(), Some("cp"));
        assert!(!ours.names::<CAPTControlPlane>("other"));
        assert_eq!(ours.name_of::<CAPTCluster>(), None, "another kind");
        let elsewhere = reference("controlplane.example.com", "CAPTControlPlane", "cp");
        assert!(!elsewhere.names::<CAPTControlPlane>("cp"));
        assert_eq!(elsewhere.name_of::<CAPTControlPlane>(), None);
        let nameless = reference("controlplane.cluster.x-k8s.io", "CAPTControlPlane", "");
        assert_eq!(nameless.name_of::<CAPTControlPlane>(), None);
    }

    #[test]
    fn a_cluster_endpoint_may_lack_its_port_or_host_and_is_written_back_as_it_was() {
        for endpoint in [json!({"host": "poison.example.com"}), json!({"port": 6443})] {
            let cluster: Cluster = serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": "poison", "namespace": "mallory"},
                "spec": {"controlPlaneEndpoint": endpoint},
            }))
            .unwrap_or_else(|e| panic!("{endpoint}: {e}"));
            let read = cluster
                .spec
                .control_plane_endpoint
                .clone()
                .expect("an endpoint");
            assert!(!crate::status::endpoint::is_valid(&read), "{endpoint}");
            // Never a `port: 0` nor `host: ""`: the schema refuses both.
            let written = serde_json::to_value(&cluster).unwrap();
            assert_eq!(written["spec"]["controlPlaneEndpoint"], endpoint);
        }
    }

    #[test]
    fn a_v1beta2_cluster_reads_its_references() {
        let cluster: Cluster = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "demo", "namespace": "ns"},
            "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                           "kind": "CAPTCluster", "name": "vpc"}},
            "status": {"initialization": {"infrastructureProvisioned": true}},
        }))
        .expect("a v1beta2 Cluster");
        let infra = cluster.spec.infrastructure_ref.as_ref();
        assert_eq!(infra.and_then(|r| r.name_of::<CAPTCluster>()), Some("vpc"));
        assert_eq!(cluster.spec.control_plane_ref, None);
        let initialization = cluster.status.and_then(|s| s.initialization);
        assert_eq!(
            initialization.and_then(|i| i.infrastructure_provisioned),
            Some(true)
        );
    }
}
