//! What the observations of a CAPTCluster and a CAPTControlPlane share, as owners of one
//! WorkspaceTemplateApply: what they read of it and of their peers from the caches (the
//! names their Cluster's applies recorded, their deletion's facts). The rules they share are
//! [`super::apply_owner`]'s, and pure.

use super::deletion::Deletion;
use super::{apply_owner, shared};
use crate::api::{CAPTCluster, CAPTControlPlane, Cluster};
use crate::context::Context;
use crate::names;
use crate::status::deletion::DeletionFacts;
use crate::watches::cached_beside;
use jiff::Timestamp;
use kube::{Resource, ResourceExt};

pub use super::apply_owner::ApplyOwner;

/// The `CLUSTER_NAME`s the applies of the Cluster's CAPTCluster and CAPTControlPlane (those
/// its references name, as cached) recorded.
pub fn cluster_names_recorded(ctx: &Context, cluster: &Cluster) -> Vec<String> {
    let infra = cluster.spec.infrastructure_ref.as_ref();
    let cc = infra
        .and_then(|r| r.name_of::<CAPTCluster>())
        .and_then(|n| cached_beside(&ctx.caches.capt_clusters, cluster, n));
    let control_plane = cluster.spec.control_plane_ref.as_ref();
    let cp = control_plane
        .and_then(|r| r.name_of::<CAPTControlPlane>())
        .and_then(|n| cached_beside(&ctx.caches.control_planes, cluster, n));
    let of = |variables: Option<std::collections::BTreeMap<String, String>>| {
        variables.and_then(|mut v| v.remove(names::CLUSTER_NAME))
    };
    let mut found = Vec::new();
    found.extend(cc.and_then(|cc| of(recorded_names(ctx, &*cc))));
    found.extend(cp.and_then(|cp| of(recorded_names(ctx, &*cp))));
    found
}

/// The variables of the owner's apply (as cached), when it exists and is provably its own.
fn recorded_names<O: ApplyOwner>(
    ctx: &Context,
    owner: &O,
) -> Option<std::collections::BTreeMap<String, String>> {
    let apply = shared::get_apply(ctx, owner, &owner.apply_name())?;
    apply_owner::recorded_names(owner, &apply)
}

/// What the deletion of `owner` is: its description (with its apply, if any) and the facts
/// every owner shares. Facts of one kind only (`endpoint_owned`, `control_plane_present`,
/// `retain`) start `false`; the reconciler sets them.
pub fn deletion_of<O: ApplyOwner>(
    ctx: &Context,
    owner: &O,
    cluster: Option<Cluster>,
) -> (Deletion, DeletionFacts) {
    let shared::ApplyFacts {
        apply,
        workspace_present,
        workspace_problem,
        refused,
    } = shared::apply_facts(ctx, owner, &owner.apply_name());
    let facts = DeletionFacts {
        endpoint_owned: false,
        control_plane_present: false,
        apply_present: apply.is_some(),
        apply_deleting: apply
            .as_ref()
            .is_some_and(|a| a.meta().deletion_timestamp.is_some()),
        workspace_present,
        workspace_problem,
        retain: false,
        started: shared::deletion_started(owner),
        now: Timestamp::now(),
        stuck_after: ctx.settings.stuck_deletion_after,
    };
    let d = Deletion {
        finalizer: O::FINALIZER,
        manager: O::MANAGER,
        own_types: O::CONDITION_TYPES,
        existing: owner.conditions().to_vec(),
        apply,
        refused,
        cluster,
        poll: ctx.settings.poll_interval,
    };
    (d, facts)
}

/// True when the owner still carries our finalizer: its deletion is ours to carry out.
pub fn ours_to_delete<O: ApplyOwner>(owner: &O) -> bool {
    owner.finalizers().iter().any(|f| f == O::FINALIZER)
}
