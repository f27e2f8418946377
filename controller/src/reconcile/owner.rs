//! How a CAPTCluster and a CAPTControlPlane, as owners of one WorkspaceTemplateApply,
//! observe what their decisions share ([`observe`]: the Cluster they name, their apply and
//! its Workspaces, the names their Cluster's applies recorded, their deletion's facts), from
//! the caches. The rules they share are [`super::apply_owner`]'s, and pure.

use super::apply_owner::OwnerSnapshot;
use super::deletion::Deletion;
use super::shared::{cluster_name, workspace_names};
use super::{apply_owner, shared};
use crate::api::{CAPTCluster, CAPTControlPlane, Cluster};
use crate::context::Context;
use crate::names;
use crate::status::deletion::DeletionFacts;
use crate::watches::{cached, cached_beside};
use jiff::Timestamp;
use kube::{Resource, ResourceExt};
use std::sync::Arc;

pub use super::apply_owner::ApplyOwner;

/// What an owner's decision reads, from the caches: the owner, the Cluster it names, its
/// apply, the Workspaces that may be that apply's, the names its Cluster's applies recorded,
/// and, when it is being deleted, its deletion's facts, with the Cluster `deletion_cluster`
/// picks of the one it names (facts of one kind only start `false`: [`deletion_of`]).
pub fn observe<O: ApplyOwner>(
    ctx: &Context,
    owner: Arc<O>,
    deletion_cluster: impl FnOnce(Option<&Cluster>) -> Option<Cluster>,
) -> OwnerSnapshot<O> {
    let ns = owner.namespace().unwrap_or_default();
    let named_cluster =
        cluster_name(&*owner).and_then(|n| cached_beside(&ctx.caches.clusters, &*owner, &n));
    let apply_name = owner.apply_name();
    let apply = cached_beside(&ctx.caches.applies, &*owner, &apply_name);
    let workspaces = workspace_names(&ns, &apply_name)
        .iter()
        .filter_map(|n| cached(&ctx.caches.workspaces, None, n))
        .collect();
    let siblings = named_cluster
        .as_deref()
        .map(|c| cluster_names_recorded(ctx, c))
        .unwrap_or_default();
    let deleting = owner.meta().deletion_timestamp.is_some() && ours_to_delete(&*owner);
    let deletion =
        deleting.then(|| deletion_of(ctx, &*owner, deletion_cluster(named_cluster.as_deref())));
    OwnerSnapshot {
        owner,
        named_cluster,
        apply,
        workspaces,
        siblings,
        deletion,
        allowed_template_namespaces: ctx.settings.allowed_template_namespaces.clone(),
        poll_interval: ctx.settings.poll_interval,
    }
}

/// The `CLUSTER_NAME`s the applies of the Cluster's CAPTCluster and CAPTControlPlane (those
/// its references name, as cached) recorded.
fn cluster_names_recorded(ctx: &Context, cluster: &Cluster) -> Vec<String> {
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
fn deletion_of<O: ApplyOwner>(
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
fn ours_to_delete<O: ApplyOwner>(owner: &O) -> bool {
    owner.finalizers().iter().any(|f| f == O::FINALIZER)
}
