//! Carrying out a CAPT object's deletion, one step per reconcile, in the order that
//! [`crate::status::deletion`] plans: the Cluster endpoint released, the apply deleted, its
//! Workspace gone, then the finalizer removed. Progress is published as conditions.

use super::shared::orphan_apply;
use super::{Result, kube_err};
use crate::api::{Cluster, WorkspaceTemplateApply};
use crate::context::Context;
use crate::k8s::set_finalizer;
use crate::publish::Publication;
use crate::status::deletion::{
    DeletionFacts, DeletionStep, deletion_status_fragment, plan_deletion,
};
use crate::write_loops::ObjectId;
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
