//! Holding a paused object still: the reconcilers ask [`paused`] first, before deletion or
//! any finalizer, and a paused object only publishes its `Paused` condition.

use super::Result;
use crate::api::Cluster;
use crate::context::Context;
use crate::publish::Publication;
use crate::status::pause::{paused_by, paused_fragment};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Resource;
use kube::runtime::controller::Action;

/// Why `obj` is paused (its Cluster's `spec.paused`, or its own annotation); `None` if not.
pub fn paused<K: Resource>(cluster: Option<&Cluster>, obj: &K) -> Option<&'static str> {
    paused_by(
        cluster.and_then(|c| c.spec.paused),
        obj.meta().annotations.as_ref(),
    )
}

/// Publishes that `obj` is paused (its other conditions kept verbatim) and waits for a
/// change: unpausing wakes the reconcile through the Cluster watch or the object's own.
pub async fn hold<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    obj: &K,
    manager: &'static str,
    own_types: &[&str],
    existing: &[Condition],
    why: &str,
) -> Result<Action> {
    tracing::debug!(subject = super::subject(obj), why, "Paused");
    let fragment = paused_fragment(
        existing,
        own_types,
        obj.meta().generation,
        Timestamp::now(),
        why,
    );
    ctx.publish(Publication::status(obj, manager, fragment))
        .await?;
    Ok(Action::await_change())
}
