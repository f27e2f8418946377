//! What the reconcilers read of the objects around the one they reconcile, from the watch
//! caches, into the snapshots their decisions take: the Cluster an object belongs to, the
//! Workspace of an apply, and, for a CAPTCluster or CAPTControlPlane as the owner of one
//! WorkspaceTemplateApply ([`as_owner`]), the Cluster it names, its apply and that apply's
//! Workspaces, the names its Cluster's applies recorded and its deletion's facts. No request
//! is made here: what a decision needs live is a step of its plan. Whose each object is, is
//! [`super::claims`]'s; the rules are the decisions'.

use super::apply_owner::{self, ApplyOwner, OwnerSnapshot};
use super::claims::{Located, cluster_name, locate, ours_to_remove, workspace_names};
use super::deletion::Deletion;
use crate::api::{CAPTCluster, CAPTControlPlane, Cluster, WorkspaceTemplateApply};
use crate::context::Context;
use crate::names;
use crate::status::deletion::DeletionFacts;
use crate::status::workspace::WorkspaceObservation;
use crate::watches::{cached, cached_beside};
use jiff::Timestamp;
use kube::{Resource, ResourceExt};
use std::sync::Arc;

/// The Cluster an object belongs to ([`cluster_name`]), if it exists (as cached).
pub fn owning_cluster<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    obj: &K,
) -> Option<Arc<Cluster>> {
    let name = cluster_name(obj)?;
    cached_beside(&ctx.caches.clusters, obj, &name)
}

/// Finds the Workspace of `apply`, as cached ([`locate`]).
pub fn locate_workspace(ctx: &Context, apply: &WorkspaceTemplateApply) -> Located {
    locate(apply, |n| {
        cached(&ctx.caches.workspaces, None, n).map(|w| (*w).clone())
    })
}

/// What an owner's decision reads, from the caches: the owner, the Cluster it names, its
/// apply, the Workspaces that may be that apply's, the names its Cluster's applies recorded,
/// and, when it is being deleted, its deletion's facts, with the Cluster `deletion_cluster`
/// picks of the one it names (facts of one kind only start `false`: [`deletion_of`]).
pub fn as_owner<O: ApplyOwner>(
    ctx: &Context,
    owner: Arc<O>,
    deletion_cluster: impl FnOnce(Option<&Cluster>) -> Option<Cluster>,
) -> OwnerSnapshot<O> {
    let ns = owner.namespace().unwrap_or_default();
    let named_cluster = owning_cluster(ctx, &*owner);
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
    let apply = cached_beside(&ctx.caches.applies, owner, &owner.apply_name())?;
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
    let (apply, refused) = deleted_apply(ctx, owner);
    let workspace = apply
        .as_ref()
        .and_then(|a| locate_workspace(ctx, a).own().cloned());
    let workspace_problem = workspace.as_ref().and_then(|w| {
        let observed = serde_json::to_value(w).unwrap_or_default();
        let synced = WorkspaceObservation::from_json(&observed).synced?;
        (synced.status == "False" && !synced.message.is_empty()).then_some(synced.message)
    });
    let facts = DeletionFacts {
        endpoint_owned: false,
        control_plane_present: false,
        apply_present: apply.is_some(),
        apply_deleting: apply
            .as_ref()
            .is_some_and(|a| a.meta().deletion_timestamp.is_some()),
        workspace_present: workspace.is_some(),
        workspace_problem,
        retain: false,
        started: deletion_started(owner),
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

/// The apply a deletion acts on: the owner's apply (as cached), only when it is provably the
/// owner's ([`ours_to_remove`]); else, when an apply of that name exists, why it is left
/// alone. The name comes from the owner's spec, which its user writes: an apply of that name
/// that is not the owner's own is neither deleted nor orphaned nor waited for, and the
/// deletion goes on as if there were none.
fn deleted_apply<O: ApplyOwner>(
    ctx: &Context,
    owner: &O,
) -> (Option<WorkspaceTemplateApply>, Option<String>) {
    let apply_name = owner.apply_name();
    let Some(found) = cached_beside(&ctx.caches.applies, owner, &apply_name) else {
        return (None, None);
    };
    match ours_to_remove(owner, &found) {
        Ok(()) => (Some((*found).clone()), None),
        Err(why) => {
            let ns = found.namespace().unwrap_or_default();
            let kind = O::kind(&());
            let message = format!(
                "WorkspaceTemplateApply {ns}/{apply_name} is not this {kind}'s ({why}): \
                 left alone on deletion"
            );
            (None, Some(message))
        }
    }
}

/// When the object's deletion was requested.
fn deletion_started<K: Resource>(obj: &K) -> Timestamp {
    obj.meta()
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or_else(Timestamp::now)
}
