//! The Cluster API `Cluster` (manager `capt-cluster`): readiness, failures, the phase
//! `Provisioned` and `spec.controlPlaneEndpoint`, computed by [`crate::status::cluster`]
//! from the CAPTCluster and CAPTControlPlane the Cluster references. A reconcile observes
//! (the two from the caches, [`observe`]), decides ([`decide::decide`]) and acts
//! ([`super::act`]). Also whether the endpoint is still ours and its release, which the
//! control plane's deletion decides from the Cluster it reads live.

mod decide;

pub use self::decide::{
    CORE_CLUSTER_FINALIZER, Snapshot, decide, endpoint_owned_by_us, endpoint_release,
    managed_by_core,
};

use super::Result;
use crate::api::{CAPTCluster, CAPTControlPlane, Cluster};
use crate::context::Context;
use crate::watches::cached;
use kube::ResourceExt;
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
