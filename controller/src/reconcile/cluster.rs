//! The Cluster API `Cluster` (manager `capt-cluster`): readiness, failures, the phase
//! `Provisioned` and `spec.controlPlaneEndpoint`, computed by [`crate::status::cluster`]
//! from the CAPTCluster and CAPTControlPlane the Cluster references; whether core manages the
//! Cluster, and the endpoint's ownership and release that the control plane's deletion uses.

use super::{Result, after, kube_err};
use crate::api::{CAPTCluster, CAPTControlPlane, Cluster};
use crate::context::Context;
use crate::publish::Publication;
use crate::status::cluster::{ClusterInput, ProviderView, desired_cluster};
use crate::status::{ENDPOINT_PATH, MANAGER_CLUSTER};
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::sync::Arc;

/// The finalizer core's Cluster controller puts on every Cluster it manages.
pub const CORE_CLUSTER_FINALIZER: &str = "cluster.cluster.x-k8s.io";

/// True when the Cluster API core controller manages the Cluster: it carries core's finalizer
/// (core adds it before anything else, long before a VPC or control plane can be ready).
pub fn managed_by_core(cluster: &Cluster) -> bool {
    cluster
        .finalizers()
        .iter()
        .any(|f| f == CORE_CLUSTER_FINALIZER)
}

/// Reconciles one Cluster.
pub async fn reconcile(cluster: Arc<Cluster>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciled("Cluster");
    // Paused: core writes nothing, and neither do we. Deleting: nothing left to report.
    let paused = super::pause::paused(Some(&cluster), &*cluster).is_some();
    if cluster.meta().deletion_timestamp.is_some() || paused {
        return Ok(Action::await_change());
    }
    let ns = cluster.namespace().unwrap_or_default();
    let name_of = |r: &Option<k8s_openapi::api::core::v1::ObjectReference>, kind: &str| {
        r.as_ref()
            .filter(|r| r.kind.as_deref() == Some(kind))
            .and_then(|r| r.name.clone())
    };
    let infra = match name_of(&cluster.spec.infrastructure_ref, "CAPTCluster") {
        Some(n) => Api::<CAPTCluster>::namespaced(ctx.client.clone(), &ns)
            .get_opt(&n)
            .await
            .map_err(kube_err(&*cluster, "reading its CAPTCluster"))?,
        None => None,
    };
    let cp = match name_of(&cluster.spec.control_plane_ref, "CAPTControlPlane") {
        Some(n) => Api::<CAPTControlPlane>::namespaced(ctx.client.clone(), &ns)
            .get_opt(&n)
            .await
            .map_err(kube_err(&*cluster, "reading its CAPTControlPlane"))?,
        None => None,
    };
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
        managed_by_core: managed_by_core(&cluster),
    };
    let desired = desired_cluster(&input);
    ctx.publish(Publication::status(
        &*cluster,
        MANAGER_CLUSTER,
        desired.status_fragment,
    ))
    .await?;
    if let Some(fragment) = desired.main_fragment {
        let release = if desired.release_endpoint {
            vec![ENDPOINT_PATH.to_owned()]
        } else {
            vec![]
        };
        ctx.publish(Publication::main(
            &*cluster,
            MANAGER_CLUSTER,
            fragment,
            release,
        ))
        .await?;
    }
    Ok(after(None))
}

/// True when `capt-cluster` still owns the Cluster's `spec.controlPlaneEndpoint`.
pub fn endpoint_owned_by_us(cluster: &Cluster) -> bool {
    cluster.managed_fields().iter().any(|e| {
        e.manager.as_deref() == Some(MANAGER_CLUSTER)
            && e.operation.as_deref() == Some("Apply")
            && e.subresource.as_deref().unwrap_or("").is_empty()
            && e.fields_v1
                .as_ref()
                .is_some_and(|f| f.0["f:spec"].get("f:controlPlaneEndpoint").is_some())
    })
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
