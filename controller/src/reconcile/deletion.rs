//! Carrying out a CAPT object's deletion, one step per reconcile, in the order that
//! [`crate::status::deletion`] plans: the Cluster endpoint released, the apply deleted, its
//! Workspace gone, then the finalizer removed. Progress is published as conditions.

use super::shared::{get_apply, observe_workspace, orphan_apply, ours_to_remove};
use super::{Result, kube_err};
use crate::api::{Cluster, WorkspaceTemplateApply};
use crate::context::Context;
use crate::k8s::set_finalizer;
use crate::publish::Publication;
use crate::status::deletion::{
    DeletionFacts, DeletionStep, deletion_status_fragment, plan_deletion,
};
use crate::write_loops::ObjectId;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use std::fmt::Debug;

/// What a deleting object is, besides the facts of its deletion.
pub struct Deletion {
    /// Our finalizer on it.
    pub finalizer: &'static str,
    /// The field manager of its status.
    pub manager: &'static str,
    /// The condition types that manager sets (kept verbatim while deleting).
    pub own_types: &'static [&'static str],
    /// Its live conditions.
    pub existing: Vec<Condition>,
    /// Its apply, if it exists and is provably its own.
    pub apply: Option<WorkspaceTemplateApply>,
    /// Why the apply its `spec.workspaceTemplateApplyName` names is left alone, when it
    /// exists and is not its own (told as a Warning Event).
    pub refused: Option<String>,
    /// The Cluster whose endpoint it releases, if any.
    pub cluster: Option<Cluster>,
}

/// The apply a deletion acts on, as cached.
pub struct ApplyFacts {
    /// The apply of `apply_name`, only when it is provably the object's ([`ours_to_remove`]).
    pub apply: Option<WorkspaceTemplateApply>,
    /// That apply's Workspace exists.
    pub workspace_present: bool,
    /// That Workspace's `Synced=False` message, if any.
    pub workspace_problem: Option<String>,
    /// When an apply of that name exists and is not the object's: why. The deletion then
    /// goes on as if there were none, and leaves it alone.
    pub refused: Option<String>,
}

/// The facts every deletion shares: its apply and that apply's Workspace (as cached). The
/// name comes from the object's spec, which its user writes: an apply of that name that is
/// not the object's own is neither deleted nor orphaned nor waited for.
pub fn apply_facts<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    obj: &K,
    apply_name: &str,
) -> ApplyFacts {
    let found = get_apply(ctx, obj, apply_name);
    let (apply, refused) = match found.map(|a| (ours_to_remove(obj, &a), a)) {
        Some((Ok(()), a)) => (Some(a), None),
        Some((Err(why), a)) => {
            let ns = a.namespace().unwrap_or_default();
            let kind = K::kind(&());
            let message = format!(
                "WorkspaceTemplateApply {ns}/{apply_name} is not this {kind}'s ({why}): \
                 left alone on deletion"
            );
            (None, Some(message))
        }
        None => (None, None),
    };
    let workspace = apply.as_ref().and_then(|a| observe_workspace(ctx, a));
    let workspace_problem = workspace
        .as_ref()
        .and_then(|w| w.synced.as_ref())
        .filter(|c| c.status == "False" && !c.message.is_empty())
        .map(|c| c.message.clone());
    ApplyFacts {
        apply,
        workspace_present: workspace.is_some(),
        workspace_problem,
        refused,
    }
}

/// When the object's deletion was requested.
pub fn started<K: Resource>(obj: &K) -> Timestamp {
    obj.meta()
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or_else(Timestamp::now)
}

/// Plans the next step from `facts`, publishes the progress and carries the step out.
pub async fn carry_out<K>(
    ctx: &Context,
    obj: &K,
    api: &Api<K>,
    facts: DeletionFacts,
    d: Deletion,
) -> Result<Action>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + Debug,
{
    let plan = plan_deletion(&facts, &d.existing, obj.meta().generation);
    if plan.stuck {
        tracing::warn!(
            subject = super::subject(obj),
            step = plan.step.as_str(),
            "Deletion is stuck"
        );
    }
    if plan.step != DeletionStep::RemoveFinalizer {
        let fragment = deletion_status_fragment(&d.existing, d.own_types, &plan);
        let status = Publication::status(obj, d.manager, fragment);
        ctx.publish(status).await?;
    }
    if let Some(why) = &d.refused {
        tracing::warn!(subject = super::subject(obj), "{why}");
        let (reason, action) = (crate::tenancy::APPLY_NOT_OURS, "Delete");
        ctx.warn(obj, reason, action, why.clone()).await;
    }
    match plan.step {
        DeletionStep::ReleaseEndpoint => {
            if let Some(cluster) = &d.cluster {
                super::cluster::release_cluster_endpoint(ctx, cluster).await?;
            }
        }
        DeletionStep::DeleteApply => {
            let apply = d.apply.expect("DeleteApply implies an apply");
            let applies: Api<WorkspaceTemplateApply> =
                Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
            // The uid precondition: only the apply found to be ours, never one created
            // again under its name since.
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: apply.uid(),
                    resource_version: None,
                }),
                ..DeleteParams::background()
            };
            applies
                .delete(&apply.name_any(), &params)
                .await
                .map_err(kube_err(obj, "deleting its WorkspaceTemplateApply"))?;
        }
        DeletionStep::RemoveFinalizer => {
            if let Some(apply) = d.apply.filter(|_| facts.retain) {
                orphan_apply(ctx, obj, &apply).await?;
            }
            set_finalizer(api, obj, d.finalizer, false)
                .await
                .map_err(kube_err(obj, "removing its finalizer"))?;
            super::observe_deletion(ctx, obj);
            ctx.publisher.forget(ObjectId::of_object(obj));
            return Ok(Action::await_change());
        }
        DeletionStep::WaitForControlPlane
        | DeletionStep::WaitForApplyGone
        | DeletionStep::WaitForWorkspaceGone => {}
    }
    let poll = ctx.settings.poll_interval;
    Ok(Action::requeue(
        plan.recheck_after.unwrap_or(poll).min(poll),
    ))
}
