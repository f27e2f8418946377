//! The Cluster API `Cluster` fragments of field manager `capt-cluster`: its status (from the
//! CAPTCluster and CAPTControlPlane statuses) and `spec.controlPlaneEndpoint` (from the
//! CAPTControlPlane's).
//!
//! The Cluster API core controller writes every one of these fields when it manages the
//! Cluster (it carries core's finalizer). Then `capt-cluster` writes none of them and gives
//! up what it holds: core derives each from the same source (our objects'
//! `status.initialization`, `failureReason`/`failureMessage`, the control plane's
//! `spec.controlPlaneEndpoint`), on a watch of those objects, and keeps
//! `status.initialization` sticky, which a mirror cannot. Two writers of one field could only
//! agree (no news) or conflict. `docs/cluster-api.md` records each decision with the evidence.
//!
//! Without core (a test environment without it), `capt-cluster` writes them itself in the
//! Cluster's `v1beta2` (what the controller reads and core stores), the way core would:
//! `status.initialization` from our objects' `status.initialization`, failures into
//! `status.deprecated.v1beta1` as core reports them (`Failure detected from referenced
//! resource <GVK> with name "<name>": <message>`), and `phase` only when it must be
//! `Provisioned`.

use super::endpoint;
use crate::api::{ApiEndpoint, CAPTClusterStatus, CAPTControlPlaneStatus};
use serde_json::{Map, Value, json};

/// How core names the CAPTCluster kind in failure messages.
const CAPT_CLUSTER_GVK: &str = "infrastructure.cluster.x-k8s.io/v1beta1, Kind=CAPTCluster";
/// How core names the CAPTControlPlane kind in failure messages.
const CONTROL_PLANE_GVK: &str = "controlplane.cluster.x-k8s.io/v1beta1, Kind=CAPTControlPlane";

/// What the Cluster needs of one provider object (its CAPTCluster or CAPTControlPlane).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProviderView {
    /// `<group>/<version>, Kind=<kind>`, as core prints a GroupVersionKind.
    pub gvk: String,
    /// `metadata.name`.
    pub name: String,
    /// `status.initialization.provisioned` (CAPTCluster) or `controlPlaneInitialized`
    /// (CAPTControlPlane), or the deprecated `status.ready` of an object written before them:
    /// sticky, as core's copy is.
    pub ready: bool,
    /// `status.failureReason`.
    pub failure_reason: Option<String>,
    /// `status.failureMessage`.
    pub failure_message: Option<String>,
}

impl ProviderView {
    /// The view of a CAPTCluster named `name`.
    pub fn capt_cluster(name: &str, status: &CAPTClusterStatus) -> Self {
        Self {
            gvk: CAPT_CLUSTER_GVK.into(),
            name: name.into(),
            ready: status.ready == Some(true)
                || status.initialization.as_ref().and_then(|i| i.provisioned) == Some(true),
            failure_reason: status.failure_reason.clone(),
            failure_message: status.failure_message.clone(),
        }
    }

    /// The view of a CAPTControlPlane named `name`.
    pub fn control_plane(name: &str, status: &CAPTControlPlaneStatus) -> Self {
        Self {
            gvk: CONTROL_PLANE_GVK.into(),
            name: name.into(),
            ready: status.ready == Some(true)
                || (status.initialization.as_ref()).and_then(|i| i.control_plane_initialized)
                    == Some(true),
            failure_reason: status.failure_reason.clone(),
            failure_message: status.failure_message.clone(),
        }
    }

    fn failed(&self) -> bool {
        non_empty(&self.failure_reason).is_some() || non_empty(&self.failure_message).is_some()
    }
}

/// Everything the Cluster fragments depend on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterInput {
    /// The CAPTCluster; `None` when it could not be read.
    pub infrastructure: Option<ProviderView>,
    /// The CAPTControlPlane; `None` when it could not be read.
    pub control_plane: Option<ProviderView>,
    /// The CAPTControlPlane's `spec.controlPlaneEndpoint`, if set.
    pub control_plane_endpoint: Option<ApiEndpoint>,
    /// True when the CAPTControlPlane is being deleted: the endpoint is released.
    pub control_plane_deleting: bool,
    /// True when Cluster API core manages the Cluster: every field here is core's.
    pub managed_by_core: bool,
}

/// The desired Cluster fragments.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterDesired {
    /// `{"status": {...}}` for `capt-cluster` on the status subresource.
    pub status_fragment: Value,
    /// `{"spec": {"controlPlaneEndpoint": ...}}` for `capt-cluster` on the main resource;
    /// `None` when the endpoint is not known (publish nothing).
    pub main_fragment: Option<Value>,
    /// True when the main fragment releases the endpoint: send it with
    /// `release: ["spec.controlPlaneEndpoint"]`.
    pub release_endpoint: bool,
}

/// Where `capt-cluster` writes the infrastructure's readiness (v1beta1: `infrastructureReady`).
const INFRASTRUCTURE_PROVISIONED: &str = "infrastructureProvisioned";
/// Where it writes the control plane's (v1beta1: `controlPlaneReady`).
const CONTROL_PLANE_INITIALIZED: &str = "controlPlaneInitialized";

/// The status `capt-cluster` writes without core, every field released (`null`).
pub fn released_status() -> Value {
    json!({
        "initialization": {INFRASTRUCTURE_PROVISIONED: null, CONTROL_PLANE_INITIALIZED: null},
        "deprecated": {"v1beta1": {"failureReason": null, "failureMessage": null}},
        "phase": null,
    })
}

/// Computes the Cluster's status and endpoint fragments.
pub fn desired_cluster(input: &ClusterInput) -> ClusterDesired {
    if input.managed_by_core {
        // The endpoint is never released here: core copied it (or will) from the control
        // plane, and a `null` would blank it while we were its only owner.
        return ClusterDesired {
            status_fragment: json!({ "status": released_status() }),
            main_fragment: None,
            release_endpoint: false,
        };
    }
    let endpoint = input
        .control_plane_endpoint
        .as_ref()
        .filter(|e| endpoint::is_valid(e));
    let main_fragment = match (input.control_plane_deleting, endpoint) {
        (true, _) => Some(json!({"spec": {"controlPlaneEndpoint": null}})),
        (false, Some(e)) => Some(json!({"spec": {"controlPlaneEndpoint": e}})),
        (false, None) => None,
    };
    ClusterDesired {
        status_fragment: status_fragment(input, endpoint.is_some()),
        main_fragment,
        release_endpoint: input.control_plane_deleting,
    }
}

fn status_fragment(input: &ClusterInput, endpoint_valid: bool) -> Value {
    let infra = input.infrastructure.as_ref();
    let cp = input.control_plane.as_ref();
    let mut status = Map::new();
    // Only ever `true`, as core writes them: a Cluster core's finalizer appears on later (it
    // can, even `--without-cluster-api-core`) would see a `false` of ours released (gone), then
    // core's `true`: a flip. Our sources are sticky, so `true` never has to be taken back.
    let mut initialization = Map::new();
    if infra.is_some_and(|v| v.ready) {
        initialization.insert(INFRASTRUCTURE_PROVISIONED.into(), json!(true));
    }
    if cp.is_some_and(|v| v.ready) {
        initialization.insert(CONTROL_PLANE_INITIALIZED.into(), json!(true));
    }
    if !initialization.is_empty() {
        status.insert("initialization".into(), Value::Object(initialization));
    }
    // Core records the control plane's failure last, so it wins when both failed.
    let failing = cp.filter(|v| v.failed()).or(infra.filter(|v| v.failed()));
    let failure = match failing {
        Some(view) => Some(json!({
            "failureReason": non_empty(&view.failure_reason),
            "failureMessage": failure_message(view),
        })),
        None if infra.is_some() && cp.is_some() => {
            Some(json!({"failureReason": null, "failureMessage": null}))
        }
        None => None,
    };
    if let Some(failure) = failure {
        status.insert("deprecated".into(), json!({ "v1beta1": failure }));
    }
    let both_ready = infra.is_some_and(|v| v.ready) && cp.is_some_and(|v| v.ready);
    if both_ready && endpoint_valid && !input.control_plane_deleting {
        status.insert("phase".into(), json!("Provisioned"));
    }
    json!({ "status": status })
}

/// Core's message: `Failure detected from referenced resource <GVK> with name "<name>": <m>`.
fn failure_message(view: &ProviderView) -> Option<String> {
    let message = non_empty(&view.failure_message)?;
    Some(format!(
        "Failure detected from referenced resource {} with name {:?}: {message}",
        view.gvk, view.name
    ))
}

fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_view(kind: &str, ready: bool, failure: Option<(&str, &str)>) -> ProviderView {
        let gvk = if kind == "infra" {
            CAPT_CLUSTER_GVK
        } else {
            CONTROL_PLANE_GVK
        };
        ProviderView {
            gvk: gvk.into(),
            name: "demo".into(),
            ready,
            failure_reason: failure.map(|f| f.0.into()),
            failure_message: failure.map(|f| f.1.into()),
        }
    }

    fn mk_input(infra_ready: bool, cp_ready: bool, endpoint: Option<(&str, i32)>) -> ClusterInput {
        ClusterInput {
            infrastructure: Some(mk_view("infra", infra_ready, None)),
            control_plane: Some(mk_view("cp", cp_ready, None)),
            control_plane_endpoint: endpoint.map(|(h, p)| ApiEndpoint {
                host: h.into(),
                port: p,
            }),
            control_plane_deleting: false,
            managed_by_core: false,
        }
    }

    #[test]
    fn under_core_every_status_field_is_released_and_the_endpoint_left_alone() {
        let mut input = mk_input(true, true, Some(("h.example", 443)));
        input.managed_by_core = true;
        let d = desired_cluster(&input);
        assert_eq!(d.status_fragment["status"], released_status());
        assert_eq!(d.main_fragment, None);
        assert!(!d.release_endpoint);
        input.control_plane_deleting = true;
        assert_eq!(desired_cluster(&input).main_fragment, None, "never blanked");
    }

    #[test]
    fn phase_is_provisioned_only_with_both_ready_and_a_valid_endpoint() {
        let ep = Some(("h.example", 443));
        let cases = [
            ("both ready, endpoint valid", mk_input(true, true, ep), true),
            ("infrastructure not ready", mk_input(false, true, ep), false),
            ("control plane not ready", mk_input(true, false, ep), false),
            ("no endpoint", mk_input(true, true, None), false),
            (
                "endpoint without host",
                mk_input(true, true, Some(("", 443))),
                false,
            ),
            (
                "endpoint port 0",
                mk_input(true, true, Some(("h", 0))),
                false,
            ),
        ];
        for (name, input, provisioned) in cases {
            let status = &desired_cluster(&input).status_fragment["status"];
            match provisioned {
                true => assert_eq!(status["phase"], json!("Provisioned"), "{name}"),
                false => assert!(status.get("phase").is_none(), "{name}: phase is core's"),
            }
        }
    }

    #[test]
    fn readiness_is_only_ever_claimed_true_and_no_failure_is_an_explicit_null() {
        let d = desired_cluster(&mk_input(true, false, None));
        assert_eq!(
            d.status_fragment,
            json!({"status": {"initialization": {"infrastructureProvisioned": true},
                "deprecated": {"v1beta1": {"failureReason": null, "failureMessage": null}}}})
        );
    }

    #[test]
    fn failures_are_reported_the_way_core_reports_them() {
        let mut input = mk_input(false, false, None);
        input.infrastructure = Some(mk_view("infra", false, Some(("WorkspaceFailed", "quota"))));
        let status = desired_cluster(&input).status_fragment["status"].clone();
        let failure = &status["deprecated"]["v1beta1"];
        assert_eq!(failure["failureReason"], json!("WorkspaceFailed"));
        assert_eq!(
            failure["failureMessage"],
            json!(
                "Failure detected from referenced resource infrastructure.cluster.x-k8s.io/v1beta1, Kind=CAPTCluster with name \"demo\": quota"
            )
        );
        input.control_plane = Some(mk_view("cp", false, Some(("ControlPlaneTimeout", "slow"))));
        let status = desired_cluster(&input).status_fragment["status"].clone();
        let failure = &status["deprecated"]["v1beta1"];
        assert_eq!(failure["failureReason"], json!("ControlPlaneTimeout"));
        assert!(
            failure["failureMessage"]
                .as_str()
                .unwrap()
                .contains("Kind=CAPTControlPlane")
        );
    }

    #[test]
    fn an_unreadable_provider_object_omits_what_it_would_tell() {
        let mut input = mk_input(true, true, Some(("h", 443)));
        input.control_plane = None;
        let status = desired_cluster(&input).status_fragment["status"].clone();
        assert_eq!(
            status,
            json!({"initialization": {"infrastructureProvisioned": true}})
        );
    }

    #[test]
    fn the_endpoint_goes_to_the_main_fragment_only_when_valid() {
        let d = desired_cluster(&mk_input(true, true, Some(("h.example", 6443))));
        assert_eq!(
            d.main_fragment,
            Some(json!({"spec": {"controlPlaneEndpoint": {"host": "h.example", "port": 6443}}}))
        );
        assert!(!d.release_endpoint);
        let d = desired_cluster(&mk_input(true, true, None));
        assert_eq!(d.main_fragment, None);
        // Half an endpoint (no port, or no host) is none, as core's `IsValid` has it.
        for (host, port) in [("h", 0), ("", 443)] {
            let d = desired_cluster(&mk_input(true, true, Some((host, port))));
            assert_eq!(d.main_fragment, None, "{host:?}:{port}");
        }
    }

    #[test]
    fn a_deleting_control_plane_releases_the_endpoint_and_is_not_provisioned() {
        let mut input = mk_input(true, true, Some(("h.example", 443)));
        input.control_plane_deleting = true;
        let d = desired_cluster(&input);
        assert_eq!(
            d.main_fragment,
            Some(json!({"spec": {"controlPlaneEndpoint": null}}))
        );
        assert!(d.release_endpoint);
        assert!(d.status_fragment["status"].get("phase").is_none());
    }

    #[test]
    fn views_read_the_provider_statuses() {
        let status = CAPTControlPlaneStatus {
            ready: Some(true),
            failure_reason: Some("X".into()),
            ..Default::default()
        };
        let view = ProviderView::control_plane("cp1", &status);
        assert!(view.ready && view.failed());
        assert_eq!(view.gvk, CONTROL_PLANE_GVK);
        let view = ProviderView::capt_cluster("c1", &CAPTClusterStatus::default());
        assert!(!view.ready && !view.failed());
        // The v1beta2 contract's fields count alone (what core reads), and so does the
        // deprecated `ready` of an object written before them.
        let provisioned: CAPTClusterStatus =
            serde_json::from_value(json!({"initialization": {"provisioned": true}})).unwrap();
        assert!(ProviderView::capt_cluster("c1", &provisioned).ready);
        let initialized: CAPTControlPlaneStatus =
            serde_json::from_value(json!({"initialization": {"controlPlaneInitialized": true}}))
                .unwrap();
        assert!(ProviderView::control_plane("cp1", &initialized).ready);
    }
}
