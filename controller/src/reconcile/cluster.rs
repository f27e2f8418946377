//! The Cluster API `Cluster` (manager `capt-cluster`): readiness, failures, the phase
//! `Provisioned` and `spec.controlPlaneEndpoint`, computed by [`crate::status::cluster`]
//! from the CAPTCluster and CAPTControlPlane the Cluster references; whether core manages the
//! Cluster, and the endpoint's ownership and release that the control plane's deletion uses.

use super::{Result, after, kube_err};
use crate::api::{CAPTCluster, CAPTControlPlane, Cluster};
use crate::context::{Context, Settings};
use crate::publish::Publication;
use crate::status::cluster::{ClusterInput, ProviderView, desired_cluster};
use crate::status::{ENDPOINT_PATH, MANAGER_CLUSTER};
use crate::watches::cached;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use managed_fields::ManagedFields;
use serde_json::json;
use std::sync::Arc;

/// The finalizer core's Cluster controller puts on every Cluster it manages.
pub const CORE_CLUSTER_FINALIZER: &str = "cluster.cluster.x-k8s.io";

/// True when the Cluster API core controller manages the Cluster: always, unless the
/// controller runs `--without-cluster-api-core`; then when the Cluster carries core's
/// finalizer. Not inferred from the finalizer's absence alone: a new Cluster has none until
/// core's first reconcile, and what `capt-cluster` wrote in that moment (an endpoint, once
/// ours) would stay ours beside core.
pub fn managed_by_core(settings: &Settings, cluster: &Cluster) -> bool {
    !settings.without_core
        || cluster
            .finalizers()
            .iter()
            .any(|f| f == CORE_CLUSTER_FINALIZER)
}

/// Reconciles one Cluster.
pub async fn reconcile(cluster: Arc<Cluster>, ctx: Arc<Context>) -> Result<Action> {
    // Paused: core writes nothing, and neither do we. Deleting: nothing left to report.
    let paused = super::pause::paused(Some(&cluster), &*cluster).is_some();
    if cluster.meta().deletion_timestamp.is_some() || paused {
        return Ok(Action::await_change());
    }
    let ns = cluster.namespace().unwrap_or_default();
    let infra = (cluster.spec.infrastructure_ref.as_ref())
        .and_then(|r| r.name_of::<CAPTCluster>())
        .and_then(|n| cached(&ctx.caches.capt_clusters, Some(&ns), n));
    let cp = (cluster.spec.control_plane_ref.as_ref())
        .and_then(|r| r.name_of::<CAPTControlPlane>())
        .and_then(|n| cached(&ctx.caches.control_planes, Some(&ns), n));
    if infra.is_none() && cp.is_none() {
        return Ok(Action::await_change());
    }
    let input = ClusterInput {
        infrastructure: infra.as_ref().map(|c| {
            ProviderView::capt_cluster(&c.name_any(), &c.status.clone().unwrap_or_default())
        }),
        control_plane: cp.as_ref().map(|c| {
            ProviderView::control_plane(&c.name_any(), &c.status.clone().unwrap_or_default())
        }),
        control_plane_endpoint: cp
            .as_ref()
            .and_then(|c| c.spec.control_plane_endpoint.clone()),
        control_plane_deleting: cp
            .as_ref()
            .is_some_and(|c| c.meta().deletion_timestamp.is_some()),
        managed_by_core: managed_by_core(&ctx.settings, &cluster),
    };
    let desired = desired_cluster(&input);
    // The input is all observation: no clock, no status of the Cluster's own.
    let status = Publication::status(&*cluster, MANAGER_CLUSTER, desired.status_fragment);
    ctx.publish(status.observing(&input)).await?;
    if let Some(fragment) = desired.main_fragment {
        let release = if desired.release_endpoint {
            vec![ENDPOINT_PATH.to_owned()]
        } else {
            vec![]
        };
        let main = Publication::main(&*cluster, MANAGER_CLUSTER, fragment, release);
        ctx.publish(main.observing(&input)).await?;
    }
    Ok(after(None))
}

/// True when `capt-cluster` still owns the Cluster's `spec.controlPlaneEndpoint`, or a field
/// of it, through its applies.
pub fn endpoint_owned_by_us(cluster: &Cluster) -> bool {
    let endpoint = managed_fields::parse_field_path(ENDPOINT_PATH).expect("a valid field path");
    ManagedFields::decode(cluster.managed_fields()).applied_at(MANAGER_CLUSTER, "", &endpoint)
}

/// [`endpoint_owned_by_us`], read from the API server: the cache holds no managedFields.
pub async fn endpoint_still_ours(ctx: &Context, cluster: &Cluster) -> Result<bool> {
    let api: Api<Cluster> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let live = api
        .get_opt(&cluster.name_any())
        .await
        .map_err(kube_err(cluster, "reading its managedFields"))?;
    Ok(live.is_some_and(|c| endpoint_owned_by_us(&c)))
}

/// Publishes the release of the Cluster's endpoint under `capt-cluster`.
pub async fn release_cluster_endpoint(ctx: &Context, cluster: &Cluster) -> Result<()> {
    let release = Publication::main(
        cluster,
        MANAGER_CLUSTER,
        json!({"spec": {"controlPlaneEndpoint": null}}),
        vec![ENDPOINT_PATH.to_owned()],
    );
    ctx.publish(release).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cluster(managed_fields: serde_json::Value) -> Cluster {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "demo", "namespace": "default", "managedFields": managed_fields},
            "spec": {"controlPlaneEndpoint": {"host": "eks.example.com", "port": 443}}
        }))
        .expect("a Cluster")
    }

    fn entry(manager: &str, operation: &str, fields: serde_json::Value) -> serde_json::Value {
        json!({"manager": manager, "operation": operation, "fieldsType": "FieldsV1", "fieldsV1": fields})
    }

    #[test]
    fn core_manages_every_cluster_unless_told_it_does_not_run() {
        let mut new_cluster = cluster(json!([]));
        let beside_core = Settings::default();
        let alone = Settings {
            without_core: true,
            ..Settings::default()
        };
        // A new Cluster core has not reconciled yet carries no finalizer of core's.
        assert!(managed_by_core(&beside_core, &new_cluster));
        assert!(!managed_by_core(&alone, &new_cluster));
        new_cluster.metadata.finalizers = Some(vec![CORE_CLUSTER_FINALIZER.to_owned()]);
        assert!(managed_by_core(&beside_core, &new_cluster));
        assert!(managed_by_core(&alone, &new_cluster));
    }

    #[test]
    fn the_endpoint_is_ours_only_through_our_apply_to_the_main_resource() {
        let endpoint = json!({"f:spec": {"f:controlPlaneEndpoint": {"f:host": {}, "f:port": {}}}});
        assert!(endpoint_owned_by_us(&cluster(json!([entry(
            MANAGER_CLUSTER,
            "Apply",
            endpoint.clone()
        )]))));
        assert!(!endpoint_owned_by_us(&cluster(json!([entry(
            "kubectl",
            "Apply",
            endpoint.clone()
        )]))));
        assert!(!endpoint_owned_by_us(&cluster(json!([entry(
            MANAGER_CLUSTER,
            "Update",
            endpoint
        )]))));
        assert!(!endpoint_owned_by_us(&cluster(json!([entry(
            MANAGER_CLUSTER,
            "Apply",
            json!({"f:spec": {"f:paused": {}}})
        )]))));
    }
}
