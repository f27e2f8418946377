//! The Cluster's decision: from what its reconcile observed to the intents of `capt-cluster`.
//! A pure function: no client, no clock, no metrics; its rules are the rows of the table
//! below.

use crate::api::{CAPTCluster, CAPTControlPlane, Cluster};
use crate::publish::Publication;
use crate::reconcile::plan::Plan;
use crate::status::cluster::{ClusterInput, ProviderView, desired_cluster};
use crate::status::pause::paused_by;
use crate::status::{ENDPOINT_PATH, MANAGER_CLUSTER};
use kube::{Resource, ResourceExt};
use managed_fields::ManagedFields;
use serde_json::json;
use std::sync::Arc;

/// The finalizer core's Cluster controller puts on every Cluster it manages.
pub const CORE_CLUSTER_FINALIZER: &str = "cluster.cluster.x-k8s.io";

/// What a Cluster's decision reads.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The Cluster, as cached.
    pub cluster: Arc<Cluster>,
    /// The CAPTCluster its `infrastructureRef` names in its namespace, if cached.
    pub infrastructure: Option<Arc<CAPTCluster>>,
    /// The CAPTControlPlane its `controlPlaneRef` names in its namespace, if cached.
    pub control_plane: Option<Arc<CAPTControlPlane>>,
    /// The controller runs `--without-cluster-api-core`.
    pub without_core: bool,
}

/// True when the Cluster API core controller manages the Cluster: always, unless the
/// controller runs `--without-cluster-api-core` (`without_core`); then when the Cluster
/// carries core's finalizer. Not inferred from the finalizer's absence alone: a new Cluster
/// has none until core's first reconcile, and what `capt-cluster` wrote in that moment (an
/// endpoint, once ours) would stay ours beside core.
pub fn managed_by_core(without_core: bool, cluster: &Cluster) -> bool {
    !without_core
        || cluster
            .finalizers()
            .iter()
            .any(|f| f == CORE_CLUSTER_FINALIZER)
}

/// True when `capt-cluster` still owns the Cluster's `spec.controlPlaneEndpoint`, or a field
/// of it, through its applies.
pub fn endpoint_owned_by_us(cluster: &Cluster) -> bool {
    let endpoint = managed_fields::parse_field_path(ENDPOINT_PATH).expect("a valid field path");
    ManagedFields::decode(cluster.managed_fields()).applied_at(MANAGER_CLUSTER, "", &endpoint)
}

/// The release of the Cluster's `spec.controlPlaneEndpoint` by `capt-cluster`: the control
/// plane's deletion publishes it, where core does not run, before the control plane goes.
pub fn endpoint_release(cluster: &Cluster) -> Publication {
    Publication::main(
        cluster,
        MANAGER_CLUSTER,
        json!({"spec": {"controlPlaneEndpoint": null}}),
        vec![ENDPOINT_PATH.to_owned()],
    )
}

/// The intents of `capt-cluster` for the Cluster: its status, then, when the endpoint is
/// known or must be released, its `spec.controlPlaneEndpoint`, in that order (the endpoint
/// only once the status was taken).
pub fn decide(s: &Snapshot) -> Plan {
    let cluster = &*s.cluster;
    // Paused: core writes nothing, and neither do we. Deleting: nothing left to report.
    let paused = paused_by(cluster.spec.paused, cluster.meta().annotations.as_ref()).is_some();
    if cluster.meta().deletion_timestamp.is_some() || paused {
        return Plan::nothing();
    }
    let (infra, cp) = (s.infrastructure.as_deref(), s.control_plane.as_deref());
    if infra.is_none() && cp.is_none() {
        return Plan::nothing();
    }
    let input = ClusterInput {
        infrastructure: infra.map(|c| {
            ProviderView::capt_cluster(&c.name_any(), &c.status.clone().unwrap_or_default())
        }),
        control_plane: cp.map(|c| {
            ProviderView::control_plane(&c.name_any(), &c.status.clone().unwrap_or_default())
        }),
        control_plane_endpoint: cp.and_then(|c| c.spec.control_plane_endpoint.clone()),
        control_plane_deleting: cp.is_some_and(|c| c.meta().deletion_timestamp.is_some()),
        managed_by_core: managed_by_core(s.without_core, cluster),
    };
    let desired = desired_cluster(&input);
    // The input is all observation: no clock, no status of the Cluster's own.
    let status = Publication::status(cluster, MANAGER_CLUSTER, desired.status_fragment);
    let plan = Plan::nothing().publish(status.observing(&input));
    match desired.main_fragment {
        Some(fragment) => {
            let release = match desired.release_endpoint {
                true => vec![ENDPOINT_PATH.to_owned()],
                false => vec![],
            };
            let main = Publication::main(cluster, MANAGER_CLUSTER, fragment, release);
            plan.publish(main.observing(&input))
        }
        None => plan,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::plan::{Next, Step};
    use serde_json::Value;

    fn cluster(extra: Value) -> Arc<Cluster> {
        let mut object = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "demo", "namespace": "default", "uid": "uid-demo"},
            "spec": {}
        });
        json_patch::merge(&mut object, &extra);
        Arc::new(serde_json::from_value(object).expect("a Cluster"))
    }

    fn capt_cluster(status: Value) -> Option<Arc<CAPTCluster>> {
        let object = json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
            "metadata": {"name": "demo", "namespace": "default"},
            "spec": {"region": "r"}, "status": status,
        });
        Some(Arc::new(
            serde_json::from_value(object).expect("a CAPTCluster"),
        ))
    }

    fn control_plane(extra: Value) -> Option<Arc<CAPTControlPlane>> {
        let mut object = json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
            "metadata": {"name": "demo", "namespace": "default"},
            "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "t"}},
        });
        json_patch::merge(&mut object, &extra);
        Some(Arc::new(
            serde_json::from_value(object).expect("a CAPTControlPlane"),
        ))
    }

    /// Writes as (subresource, fragment, released paths).
    type Writes = Vec<(&'static str, Value, Vec<String>)>;

    /// Each write of a plan.
    fn writes(plan: &Plan) -> Writes {
        plan.steps
            .iter()
            .map(|step| match step {
                Step::Publish(p) => {
                    assert_eq!(p.key.manager, MANAGER_CLUSTER);
                    let on = if p.key.subresource.is_some() {
                        "status"
                    } else {
                        "main"
                    };
                    (on, p.fragment.clone(), p.release.clone())
                }
                other => panic!("the Cluster's decision only publishes: {other:?}"),
            })
            .collect()
    }

    const DELETING: &str = "2026-12-01T00:00:00Z";

    #[test]
    fn the_cluster_rules_as_a_table_of_snapshots_and_writes() {
        let ready = json!({"ready": true});
        let endpoint = json!({"spec": {"controlPlaneEndpoint": {"host": "eks.example.com", "port": 443}},
            "status": {"ready": true}});
        let alone = true;
        let beside_core = false;
        let none = Writes::new;
        let rows: Vec<(&str, Snapshot, Writes)> = vec![
            (
                "a Cluster being deleted: nothing left to report",
                Snapshot {
                    cluster: cluster(json!({"metadata": {"deletionTimestamp": DELETING,
                        "finalizers": ["f"]}})),
                    infrastructure: capt_cluster(ready.clone()),
                    control_plane: control_plane(endpoint.clone()),
                    without_core: alone,
                },
                none(),
            ),
            (
                "a Cluster paused by its spec: core writes nothing, and neither do we",
                Snapshot {
                    cluster: cluster(json!({"spec": {"paused": true}})),
                    infrastructure: capt_cluster(ready.clone()),
                    control_plane: control_plane(endpoint.clone()),
                    without_core: alone,
                },
                none(),
            ),
            (
                "a Cluster paused by its annotation: the same",
                Snapshot {
                    cluster: cluster(json!({"metadata": {"annotations":
                        {"cluster.x-k8s.io/paused": "true"}}})),
                    infrastructure: capt_cluster(ready.clone()),
                    control_plane: control_plane(endpoint.clone()),
                    without_core: alone,
                },
                none(),
            ),
            (
                "neither referenced object cached: nothing to compute from",
                Snapshot {
                    cluster: cluster(json!({})),
                    infrastructure: None,
                    control_plane: None,
                    without_core: alone,
                },
                none(),
            ),
            (
                "beside core: every field core's, our status released, the endpoint kept",
                Snapshot {
                    cluster: cluster(json!({})),
                    infrastructure: capt_cluster(ready.clone()),
                    control_plane: control_plane(endpoint.clone()),
                    without_core: beside_core,
                },
                vec![(
                    "status",
                    json!({"status": crate::status::cluster::released_status()}),
                    vec![],
                )],
            ),
            (
                "without core but with core's finalizer: core manages it all the same",
                Snapshot {
                    cluster: cluster(json!({"metadata": {"finalizers": [CORE_CLUSTER_FINALIZER]}})),
                    infrastructure: capt_cluster(ready.clone()),
                    control_plane: control_plane(endpoint.clone()),
                    without_core: alone,
                },
                vec![(
                    "status",
                    json!({"status": crate::status::cluster::released_status()}),
                    vec![],
                )],
            ),
            (
                "without core, the infrastructure ready alone: its readiness, no endpoint",
                Snapshot {
                    cluster: cluster(json!({})),
                    infrastructure: capt_cluster(ready.clone()),
                    control_plane: None,
                    without_core: alone,
                },
                vec![(
                    "status",
                    json!({"status": {"initialization": {"infrastructureProvisioned": true}}}),
                    vec![],
                )],
            ),
            (
                "without core, both ready with an endpoint: Provisioned, then the endpoint",
                Snapshot {
                    cluster: cluster(json!({})),
                    infrastructure: capt_cluster(ready.clone()),
                    control_plane: control_plane(endpoint.clone()),
                    without_core: alone,
                },
                vec![
                    (
                        "status",
                        json!({"status": {"initialization": {"infrastructureProvisioned": true,
                            "controlPlaneInitialized": true},
                            "deprecated": {"v1beta1": {"failureReason": null, "failureMessage": null}},
                            "phase": "Provisioned"}}),
                        vec![],
                    ),
                    (
                        "main",
                        json!({"spec": {"controlPlaneEndpoint": {"host": "eks.example.com", "port": 443}}}),
                        vec![],
                    ),
                ],
            ),
            (
                "without core, the control plane being deleted: the endpoint released",
                Snapshot {
                    cluster: cluster(json!({})),
                    infrastructure: capt_cluster(ready.clone()),
                    control_plane: control_plane(
                        json!({"metadata": {"deletionTimestamp": DELETING,
                        "finalizers": ["f"]}, "spec": endpoint["spec"].clone(),
                        "status": {"ready": true}}),
                    ),
                    without_core: alone,
                },
                vec![
                    (
                        "status",
                        json!({"status": {"initialization": {"infrastructureProvisioned": true,
                            "controlPlaneInitialized": true},
                            "deprecated": {"v1beta1": {"failureReason": null, "failureMessage": null}}}}),
                        vec![],
                    ),
                    (
                        "main",
                        json!({"spec": {"controlPlaneEndpoint": null}}),
                        vec![ENDPOINT_PATH.to_owned()],
                    ),
                ],
            ),
        ];
        for (rule, snapshot, expected) in rows {
            let plan = decide(&snapshot);
            assert_eq!(writes(&plan), expected, "{rule}");
            assert_eq!(plan.next, Next::AwaitChange, "{rule}");
        }
    }

    #[test]
    fn what_it_publishes_names_what_it_was_computed_from() {
        let snapshot = |ready: bool| Snapshot {
            cluster: cluster(json!({})),
            infrastructure: capt_cluster(json!({"ready": ready})),
            control_plane: None,
            without_core: true,
        };
        let basis = |ready| match &decide(&snapshot(ready)).steps[..] {
            [Step::Publish(p)] => p.basis(),
            steps => panic!("one publication, not {steps:?}"),
        };
        // The write-loop guard tells a write from new input from one that repeats itself.
        assert_ne!(basis(true), basis(false));
        assert_eq!(basis(true), basis(true));
    }

    fn with_managed_fields(managed_fields: Value) -> Cluster {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "demo", "namespace": "default", "managedFields": managed_fields},
            "spec": {"controlPlaneEndpoint": {"host": "eks.example.com", "port": 443}}
        }))
        .expect("a Cluster")
    }

    fn entry(manager: &str, operation: &str, fields: Value) -> Value {
        json!({"manager": manager, "operation": operation, "fieldsType": "FieldsV1", "fieldsV1": fields})
    }

    #[test]
    fn core_manages_every_cluster_unless_told_it_does_not_run() {
        let mut new_cluster = with_managed_fields(json!([]));
        // A new Cluster core has not reconciled yet carries no finalizer of core's.
        assert!(managed_by_core(false, &new_cluster));
        assert!(!managed_by_core(true, &new_cluster));
        new_cluster.metadata.finalizers = Some(vec![CORE_CLUSTER_FINALIZER.to_owned()]);
        assert!(managed_by_core(false, &new_cluster));
        assert!(managed_by_core(true, &new_cluster));
    }

    #[test]
    fn the_endpoint_is_ours_only_through_our_apply_to_the_main_resource() {
        let endpoint = json!({"f:spec": {"f:controlPlaneEndpoint": {"f:host": {}, "f:port": {}}}});
        let owned = |manager, operation, fields| {
            endpoint_owned_by_us(&with_managed_fields(json!([entry(
                manager, operation, fields
            )])))
        };
        assert!(owned(MANAGER_CLUSTER, "Apply", endpoint.clone()));
        assert!(!owned("kubectl", "Apply", endpoint.clone()));
        assert!(!owned(MANAGER_CLUSTER, "Update", endpoint));
        assert!(!owned(
            MANAGER_CLUSTER,
            "Apply",
            json!({"f:spec": {"f:paused": {}}})
        ));
    }
}
