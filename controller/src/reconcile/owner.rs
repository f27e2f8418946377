//! What a CAPTCluster and a CAPTControlPlane both are to the controller: the owner of one
//! WorkspaceTemplateApply (named, specified, recorded in `spec.workspaceTemplateApplyName`,
//! deleted in order), with a finalizer, a status field manager and its conditions. The two
//! reconcilers differ only in what they compute; this is what they share.

use super::deletion::Deletion;
use super::plan::Progress;
use super::{Result, act, apply_owner, shared};
use crate::api::{CAPTCluster, CAPTControlPlane, Cluster, WorkspaceTemplateApply};
use crate::context::Context;
use crate::names;
use crate::status::deletion::DeletionFacts;
use crate::tenancy::Refusal;
use crate::watches::cached_beside;
use jiff::Timestamp;
use kube::{Resource, ResourceExt};
use serde_json::Value;

pub use super::apply_owner::ApplyOwner;

/// The owner's apply, and the owner's generation once its name is recorded.
#[derive(Debug)]
pub struct Recorded {
    /// The WorkspaceTemplateApply.
    pub apply: WorkspaceTemplateApply,
    /// The owner's resourceVersion after recording the apply's name, when this reconcile
    /// recorded it ([`crate::publish::Publication::after`]).
    pub written: Option<String>,
    /// The owner's `metadata.generation` after recording the apply's name: recording it is
    /// a spec change, so a status computed in the same reconcile observes this generation,
    /// not the cached one (else the status is written twice, once for each generation).
    pub generation: Option<i64>,
}

/// Creates or adopts the owner's apply and records its name in the owner's
/// `spec.workspaceTemplateApplyName` (field manager `capt-controller`), once, as
/// [`apply_owner::apply_writes`] decides from the caches; `Ok(Err(refusal))` when it refuses.
pub async fn ensure_recorded_apply<O: ApplyOwner>(
    ctx: &Context,
    owner: &O,
    cluster: &Cluster,
) -> Result<Result<Recorded, Refusal>> {
    let existing = shared::get_apply(ctx, owner, &owner.apply_name());
    let siblings = cluster_names_recorded(ctx, cluster);
    let allowed = &ctx.settings.allowed_template_namespaces;
    let writes =
        match apply_owner::apply_writes(owner, cluster, existing.as_ref(), &siblings, allowed) {
            Ok(writes) => writes,
            Err(refusal) => return Ok(Err(refusal)),
        };
    let steps = writes.apply.into_iter().chain(writes.record).collect();
    let mut progress = Progress::default();
    act::carry_out_steps(ctx, &super::subject(owner), steps, &mut progress).await?;
    let recorded = progress.answer::<O>(apply_owner::RECORDING);
    let apply = progress
        .answer(apply_owner::APPLYING)
        .or(existing)
        .expect("an apply not written is the one cached");
    Ok(Ok(Recorded {
        apply,
        written: recorded.as_ref().and_then(|r| r.resource_version()),
        generation: recorded
            .and_then(|r| r.meta().generation)
            .max(owner.meta().generation),
    }))
}

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

/// A Warning Event when the status about to be published newly says that a person must act
/// ([`apply_owner::needing_operator`]).
pub async fn warn_if_needing_operator<O: ApplyOwner>(ctx: &Context, owner: &O, fragment: &Value) {
    if let Some(w) = apply_owner::needing_operator(owner, fragment) {
        ctx.warn_regarding(&w.regarding, w.reason, w.action, w.note)
            .await;
    }
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
