//! Carrying out a CAPT object's deletion, one step per reconcile, in the order that
//! [`crate::status::deletion`] plans: the Cluster endpoint released, the apply deleted, its
//! Workspace gone, then the finalizer removed. Progress is published as conditions.

use super::shared::{get_apply, observe_workspace, orphan_apply};
use super::{Result, kube_err};
use crate::api::{Cluster, WorkspaceTemplateApply};
use crate::context::Context;
use crate::k8s::set_finalizer;
use crate::publish::Publication;
use crate::status::deletion::{
    DeletionFacts, DeletionStep, deletion_status_fragment, plan_deletion,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams};
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
    /// Its apply, if it exists.
    pub apply: Option<WorkspaceTemplateApply>,
    /// The Cluster whose endpoint it releases, if any.
    pub cluster: Option<Cluster>,
}

/// The facts every deletion shares: its apply and that apply's Workspace (as cached).
pub fn apply_facts<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    obj: &K,
    apply_name: &str,
) -> (Option<WorkspaceTemplateApply>, bool) {
    let apply = get_apply(ctx, obj, apply_name);
    let workspace_present = apply
        .as_ref()
        .is_some_and(|a| observe_workspace(ctx, a).is_some());
    (apply, workspace_present)
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
            applies
                .delete(&apply.name_any(), &DeleteParams::background())
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
            ctx.publisher
                .forget(&K::kind(&()), obj.namespace().as_deref(), &obj.name_any());
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
