//! `CAPTControlPlane`: the Cluster API control plane, an EKS cluster built by a Workspace.

use super::common::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Finalizer the controller keeps on a CAPTControlPlane until its Workspace is gone.
pub const CAPT_CONTROL_PLANE_FINALIZER: &str = "controlplane.cluster.x-k8s.io/captcontrolplane";

/// Desired state of a CAPTControlPlane.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "controlplane.cluster.x-k8s.io",
    version = "v1beta1",
    kind = "CAPTControlPlane",
    derive = "PartialEq",
    plural = "captcontrolplanes",
    shortname = "captcp",
    category = "cluster-api",
    namespaced,
    doc = "A Cluster API control plane: an EKS cluster built by a Terraform Workspace.",
    status = "CAPTControlPlaneStatus",
    printcolumn = r#"{"name":"READY","type":"boolean","jsonPath":".status.ready","description":"Control plane is ready"}"#,
    printcolumn = r#"{"name":"PHASE","type":"string","jsonPath":".status.phase","description":"Creating, Ready or Failed"}"#,
    printcolumn = r#"{"name":"VERSION","type":"string","jsonPath":".spec.version","description":"Kubernetes version"}"#,
    printcolumn = r#"{"name":"ENDPOINT","type":"string","jsonPath":".status.endpoint","description":"API server endpoint (host:port)"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
// The apply name is set once (see CAPTClusterSpec).
#[x_kube(validation = Rule::new("!has(oldSelf.workspaceTemplateApplyName) || has(self.workspaceTemplateApplyName)").message("spec.workspaceTemplateApplyName cannot be removed once set"))]
#[serde(rename_all = "camelCase")]
pub struct CAPTControlPlaneSpec {
    /// Kubernetes version of the control plane: semver as Cluster API writes it
    /// (`v1.31.0`, what a ClusterClass topology sets), or EKS's `1.31` (`v` and a patch
    /// optional either way). The template gets EKS's major.minor (`${KUBERNETES_VERSION}` =
    /// `1.31` for all of them, see [`eks_version`]): EKS runs a minor, its patch is AWS's.
    #[schemars(regex(pattern = VERSION_PATTERN), length(max = 64))]
    pub version: String,
    /// WorkspaceTemplate that creates the EKS cluster.
    pub workspace_template_ref: NamespacedRef,
    /// EKS settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_config: Option<ControlPlaneConfig>,
    /// Tags added to every AWS resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::bounds::tags_schema")]
    pub additional_tags: Option<BTreeMap<String, String>>,
    /// API server endpoint, applied by the controller (field manager `capt-captcontrolplane`)
    /// from the `cluster_endpoint` output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// Name of the control plane's WorkspaceTemplateApply; recorded by the controller when it
    /// creates or adopts one. Set once: it cannot change nor be removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.workspaceTemplateApplyName is immutable once set"))]
    pub workspace_template_apply_name: Option<String>,
}

/// EKS settings of a control plane.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneConfig {
    /// AWS region, e.g. `ap-northeast-1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = REGION_PATTERN))]
    pub region: Option<String>,
    /// Who can reach the API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_access: Option<EndpointAccess>,
    /// EKS add-ons to install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::bounds::MAX_ADDONS))]
    pub addons: Option<Vec<Addon>>,
    /// How long to wait before a wait turns into a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<Timeouts>,
}

/// API server reachability.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointAccess {
    /// Public endpoint enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public: Option<bool>,
    /// Private endpoint enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private: Option<bool>,
    /// CIDRs allowed to reach the public endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::bounds::MAX_PUBLIC_CIDRS), inner(length(max = super::bounds::MAX_CIDR)))]
    pub public_cidrs: Option<Vec<String>>,
}

/// An EKS add-on.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Addon {
    /// Add-on name, e.g. `vpc-cni`.
    #[schemars(length(max = super::bounds::MAX_SHORT))]
    pub name: String,
    /// Add-on version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = super::bounds::MAX_SHORT))]
    pub version: Option<String>,
}

/// Timeouts, as Go durations (`30m`, `1h`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Timeouts {
    /// How long the control plane may take to become ready.
    #[serde(default = "default_control_plane_timeout")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub control_plane_timeout: String,
    /// How long to wait for the VPC before failing.
    #[serde(default = "default_vpc_ready_timeout")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub vpc_ready_timeout: String,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            control_plane_timeout: default_control_plane_timeout(),
            vpc_ready_timeout: default_vpc_ready_timeout(),
        }
    }
}

fn default_control_plane_timeout() -> String {
    "30m".into()
}

fn default_vpc_ready_timeout() -> String {
    "15m".into()
}

/// A Kubernetes version: `1.31`, `v1.31`, `1.31.2`, `v1.31.0`.
pub const VERSION_PATTERN: &str = r"^v?[0-9]+\.[0-9]+(\.[0-9]+)?$";

/// The EKS version a module needs (`aws_eks_cluster.version`: major.minor) of a
/// [`VERSION_PATTERN`] version: `v1.31.0`, `1.31.2`, `v1.31` and `1.31` all give `1.31`.
/// Anything else (the pattern not enforced) is passed on as it is, for the variable check to
/// judge (`variables::first_unsafe`).
pub fn eks_version(version: &str) -> String {
    let plain = version.strip_prefix('v').unwrap_or(version);
    let mut parts = plain.split('.');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(major), Some(minor), patch, None)
            if [Some(major), Some(minor), patch]
                .into_iter()
                .flatten()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) =>
        {
            format!("{major}.{minor}")
        }
        _ => version.to_owned(),
    }
}

#[cfg(test)]
mod version_tests {
    use super::eks_version;

    #[test]
    fn semver_and_eks_forms_give_the_eks_minor() {
        for v in ["v1.31.0", "1.31.2", "v1.31", "1.31", "v1.31.12"] {
            assert_eq!(eks_version(v), "1.31", "{v}");
        }
        assert_eq!(eks_version("v1.32.0"), "1.32");
    }

    #[test]
    fn what_is_not_a_version_is_passed_on_unchanged() {
        for v in [
            "",
            "latest",
            "1",
            "v1.31.0-rc.1",
            "1.31.x",
            "1..31",
            "1.31.0.1",
        ] {
            assert_eq!(eks_version(v), v, "{v}");
        }
    }
}

/// One version a control plane runs (`status.versions[]`, as core's `StatusVersion`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusVersion {
    /// The Kubernetes version.
    pub version: String,
    /// How many replicas run it; omitted: EKS has no control-plane Machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
}

/// A Go-style duration of hours, minutes and seconds (`1h30m`, `45s`).
pub const DURATION_PATTERN: &str = r"^([0-9]+h)?([0-9]+m)?([0-9]+s)?$";

/// Phase of a control plane.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ControlPlanePhase {
    /// The Workspace is being applied, or the endpoint is not known yet.
    Creating,
    /// The Workspace is applied and the endpoint is known.
    Ready,
    /// The apply failed or timed out.
    Failed,
}

/// Observed state of a CAPTControlPlane, written only through the status-applier.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CAPTControlPlaneStatus {
    /// Deprecated (v1beta1 contract, for core before v1.11): true once the control plane has
    /// been ready with a known endpoint; it stays true. `phase` tells the state of now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// Deprecated (v1beta1 contract): the same as `initialization.controlPlaneInitialized`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialized: Option<bool>,
    /// The v1beta2 contract's initialization: `controlPlaneInitialized` once the control
    /// plane has been ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<CAPTControlPlaneInitialization>,
    /// Creating, Ready or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ControlPlanePhase>,
    /// Kubernetes version that is running: the spec's version when last seen Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The versions running, oldest first (Cluster API v1.14's control-plane contract; core
    /// reads it before `version` to tell an upgrade in progress): EKS runs one, so one entry,
    /// the same as `version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<Vec<StatusVersion>>,
    /// Always true: EKS runs the control plane, there are no control plane Machines
    /// (Cluster API contract).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_managed_control_plane: Option<bool>,
    /// The API server endpoint as `host:port`, for display.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Programmatic token of a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// Human-readable message of a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
    /// What the controller observed of the WorkspaceTemplateApply, with outputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_template_status: Option<WorkspaceTemplateStatus>,
    /// What the controller observed of the Workspace, with `atProvider` verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_status: Option<WorkspaceStatus>,
    /// Conditions (Available, Ready, Initialized, Failed, Creating, Paused, Deleting,
    /// DeletionFailed).
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

/// The v1beta2 contract's `status.initialization` of a ControlPlane.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CAPTControlPlaneInitialization {
    /// True once the control plane has been ready with a known endpoint (it accepts
    /// requests); it then stays true. The `Available` condition tells the state of now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_initialized: Option<bool>,
}

/// A mirror of the Workspace's state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceStatus {
    /// True when the Workspace is synced and ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// The Workspace's `Ready` reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The Workspace's `status.atProvider`, verbatim (checksum, outputs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json_schema")]
    pub at_provider: Option<serde_json::Value>,
}
