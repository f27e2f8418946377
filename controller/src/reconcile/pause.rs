//! Holding a paused object still: the reconcilers ask [`paused`] first, before deletion or
//! any finalizer, and a paused object only publishes its `Paused` condition ([`hold`], a
//! pure plan [`super::act`] carries out).

use super::plan::Plan;
use crate::api::Cluster;
use crate::publish::Publication;
use crate::status::pause::{paused_by, paused_fragment};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Resource;

/// Why `obj` is paused (its Cluster's `spec.paused`, or its own annotation); `None` if not.
pub fn paused<K: Resource>(cluster: Option<&Cluster>, obj: &K) -> Option<&'static str> {
    paused_by(
        cluster.and_then(|c| c.spec.paused),
        obj.meta().annotations.as_ref(),
    )
}

/// The plan of a paused object: its `Paused` condition published (its other conditions kept
/// verbatim), then a wait for a change: unpausing wakes the reconcile through the Cluster
/// watch or the object's own.
pub fn hold<K: Resource<DynamicType = ()>>(
    obj: &K,
    manager: &'static str,
    own_types: &[&str],
    existing: &[Condition],
    why: &str,
    now: Timestamp,
) -> Plan {
    tracing::debug!(subject = super::subject(obj), why, "Paused");
    let fragment = paused_fragment(existing, own_types, obj.meta().generation, now, why);
    Plan::nothing().publish(Publication::status(obj, manager, fragment))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::CAPTCluster;
    use crate::reconcile::plan::{Next, Step};
    use serde_json::json;

    #[test]
    fn a_paused_object_publishes_only_its_paused_condition_and_waits() {
        let obj: CAPTCluster = serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
            "metadata": {"name": "demo", "namespace": "default", "generation": 3},
            "spec": {"region": "r"},
        }))
        .expect("a CAPTCluster");
        let now = "2026-12-01T00:00:00Z".parse().expect("a time");
        let plan = hold(
            &obj,
            "capt-captcluster",
            &crate::status::capt_cluster::CAPT_CLUSTER_CONDITION_TYPES,
            &[],
            "the Cluster is paused",
            now,
        );
        assert_eq!(plan.next, Next::AwaitChange);
        let [Step::Publish(p)] = plan.steps.as_slice() else {
            panic!("one publication: {plan:?}");
        };
        assert!(p.key.subresource.is_some(), "the status: {p:?}");
        let conditions = p.fragment["status"]["conditions"]
            .as_array()
            .expect("conditions");
        let paused = conditions
            .iter()
            .find(|c| c["type"] == "Paused")
            .expect("Paused");
        assert_eq!(paused["status"], "True");
    }
}
