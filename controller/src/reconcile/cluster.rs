//! The Cluster API `Cluster` (manager `capt-cluster`): readiness, failures, the phase
//! `Provisioned` and `spec.controlPlaneEndpoint`, computed by [`crate::status::cluster`]
//! from the CAPTCluster and CAPTControlPlane the Cluster references. A reconcile observes
//! (the two from the caches, [`observe`]), decides ([`decide::decide`]) and acts
//! ([`super::act`]). Also the endpoint's live ownership and its release, which the control
//! plane's deletion uses.

mod decide;

pub use self::decide::{
    CORE_CLUSTER_FINALIZER, Snapshot, decide, endpoint_owned_by_us, endpoint_release,
    managed_by_core,
};

use super::{Result, kube_err};
use crate::api::{CAPTCluster, CAPTControlPlane, Cluster};
use crate::context::Context;
use crate::watches::cached;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use std::sync::Arc;

/// Reconciles one Cluster.
pub async fn reconcile(cluster: Arc<Cluster>, ctx: Arc<Context>) -> Result<Action> {
    let snapshot = observe(&ctx, cluster);
    let subject = super::subject(&*snapshot.cluster);
    super::act::carry_out(&ctx, &subject, decide(&snapshot)).await
}

/// What the decision reads: the Cluster, and the CAPTCluster and CAPTControlPlane it
/// references in its namespace, as cached.
pub fn observe(ctx: &Context, cluster: Arc<Cluster>) -> Snapshot {
    let ns = cluster.namespace().unwrap_or_default();
    let infrastructure = (cluster.spec.infrastructure_ref.as_ref())
        .and_then(|r| r.name_of::<CAPTCluster>())
        .and_then(|n| cached(&ctx.caches.capt_clusters, Some(&ns), n));
    let control_plane = (cluster.spec.control_plane_ref.as_ref())
        .and_then(|r| r.name_of::<CAPTControlPlane>())
        .and_then(|n| cached(&ctx.caches.control_planes, Some(&ns), n));
    Snapshot {
        cluster,
        infrastructure,
        control_plane,
        without_core: ctx.settings.without_core,
    }
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
