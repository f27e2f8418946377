//! CAPTCluster: waits for its owning Cluster, creates or adopts its VPC apply (unless it
//! uses an existing VPC), and publishes the status computed by
//! [`crate::status::capt_cluster`]. Deletion waits for the control plane, then deletes the
//! VPC apply (or orphans it with `retainVpcOnDelete`) and waits for its Workspace to go.

use super::deletion;
use super::owner::{self, ApplyOwner};
use super::shared::{
    cluster_name, created, locate_workspace, names_control_plane, names_infrastructure,
    owning_cluster,
};
use super::{Result, after, kube_err};
use crate::api::{CAPT_CLUSTER_FINALIZER, CAPTCluster, Cluster};
use crate::context::Context;
use crate::k8s::set_finalizer;
use crate::publish::Publication;
use crate::status::MANAGER_CAPT_CLUSTER;
use crate::status::capt_cluster::{
    CAPT_CLUSTER_CONDITION_TYPES, CaptClusterInput, DEFAULT_VPC_READY_TIMEOUT, desired_capt_cluster,
};
use crate::status::workspace::WorkspaceObservation;
use crate::tenancy::Placement;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use std::sync::Arc;

impl ApplyOwner for CAPTCluster {
    const FINALIZER: &'static str = CAPT_CLUSTER_FINALIZER;
    const MANAGER: &'static str = MANAGER_CAPT_CLUSTER;
    const CONDITION_TYPES: &'static [&'static str] = &CAPT_CLUSTER_CONDITION_TYPES;
    const APPLY_SUFFIX: &'static str = "vpc";

    fn recorded_apply_name(&self) -> Option<&str> {
        self.spec.workspace_template_apply_name.as_deref()
    }

    const CONNECTION_SUFFIX: &'static str = "vpc-connection";

    fn template_ref(&self) -> Value {
        json!(self.spec.vpc_template_ref)
    }

    /// Its region, and the VPC's bare name (`CLUSTER_NAME` and the VPC's name get their
    /// namespace in [`owner::ensure_recorded_apply`]).
    fn apply_variables(&self) -> Value {
        let mut variables = json!({"REGION": self.spec.region});
        if let Some(vpc) = &self.spec.vpc_config {
            variables[crate::names::VPC_NAME] = json!(vpc.name);
        }
        variables
    }

    fn conditions(&self) -> &[Condition] {
        let list = self.status.as_ref().and_then(|s| s.conditions.as_deref());
        list.unwrap_or_default()
    }

    fn template_namespace(&self) -> (&'static str, Option<&String>) {
        (
            "spec.vpcTemplateRef",
            self.spec
                .vpc_template_ref
                .as_ref()
                .and_then(|r| r.namespace.as_ref()),
        )
    }
}

/// Reconciles one CAPTCluster.
pub async fn reconcile(cc: Arc<CAPTCluster>, ctx: Arc<Context>) -> Result<Action> {
    let api: Api<CAPTCluster> =
        Api::namespaced(ctx.client.clone(), &cc.namespace().unwrap_or_default());
    let cluster = proven_cluster(&ctx, &cc).await;
    if let Some(held) = owner::hold_if_paused(&*cc, cluster.as_ref(), Timestamp::now()) {
        return super::act::carry_out(&ctx, &super::subject(&*cc), held).await;
    }
    if cc.meta().deletion_timestamp.is_some() {
        return delete(&cc, &ctx).await;
    }
    let cc = set_finalizer(&api, &cc, CAPT_CLUSTER_FINALIZER, true)
        .await
        .map_err(kube_err(&*cc, "adding its finalizer"))?
        .map_or(cc, Arc::new);
    let mut workspace = None;
    let mut vpc_workspace_name = None;
    let mut refusal = None;
    let mut generation = cc.meta().generation;
    let mut written = None;
    if let Some(cluster) = cluster.as_ref()
        && cc.spec.existing_vpc_id.is_none()
        && cc.spec.vpc_template_ref.is_some()
    {
        match owner::ensure_recorded_apply(&ctx, &api, &*cc, cluster).await? {
            Ok(recorded) => {
                generation = recorded.generation;
                written = recorded.written;
                let located = locate_workspace(&ctx, &recorded.apply);
                workspace = located.own().map(|w| {
                    WorkspaceObservation::from_json(&serde_json::to_value(w).unwrap_or_default())
                });
                // Another's Workspace under its name is not its VPC (the apply reports it).
                if let Placement::Use { name, .. } = located.placement {
                    vpc_workspace_name = Some(name);
                }
            }
            Err(r) => refusal = Some(r),
        }
    }
    let input = CaptClusterInput {
        generation,
        existing_vpc_id: cc.spec.existing_vpc_id.clone(),
        created: created(&*cc),
        now: Timestamp::now(),
        vpc_ready_timeout: DEFAULT_VPC_READY_TIMEOUT,
        existing: cc.status.clone(),
        workspace,
        vpc_workspace_name,
        waiting_for_cluster: cluster.is_none(),
        cluster_endpoint: cluster.and_then(|c| c.spec.control_plane_endpoint),
    };
    let mut desired = desired_capt_cluster(&input);
    if let Some(refusal) = &refusal {
        owner::add_refusal(&mut desired.status_fragment, &*cc, refusal);
    }
    // What the status is computed from, less the clock and its own last value.
    let observed = (
        &input.existing_vpc_id,
        &input.workspace,
        &input.vpc_workspace_name,
        input.waiting_for_cluster,
        &input.cluster_endpoint,
        &refusal,
    );
    owner::warn_if_needing_operator(&ctx, &*cc, &desired.status_fragment).await;
    let status =
        Publication::status(&*cc, MANAGER_CAPT_CLUSTER, desired.status_fragment).after(written);
    ctx.publish(status.observing(&observed)).await?;
    Ok(after(owner::recheck(
        &ctx,
        desired.recheck_after,
        refusal.as_ref(),
    )))
}

/// Reason of the Warning Event on a CAPTCluster whose label or owner reference names a
/// Cluster that does not name it back.
pub const CLUSTER_DOES_NOT_REFERENCE: &str = "ClusterDoesNotReferenceInfrastructure";

/// The Cluster this is the infrastructure of (as cached): the one its owner reference or
/// label names, only when that Cluster's `spec.infrastructureRef` names it back. A decoy
/// labelled with another's Cluster builds no VPC in that Cluster's name (its Terraform would
/// run with `CLUSTER_NAME` set to the other's), and a Warning Event says why.
async fn proven_cluster(ctx: &Context, cc: &CAPTCluster) -> Option<Cluster> {
    let named = owning_cluster(ctx, cc)?;
    if names_infrastructure(&named, cc) {
        return Some(named);
    }
    let note = format!(
        "Cluster {}/{} does not name this CAPTCluster in spec.infrastructureRef: it is not this \
         infrastructure's Cluster, and nothing of it is used",
        named.namespace().unwrap_or_default(),
        named.name_any()
    );
    tracing::warn!(subject = super::subject(cc), "{note}");
    ctx.warn(cc, CLUSTER_DOES_NOT_REFERENCE, "Reconcile", note)
        .await;
    None
}

/// True when a CAPTControlPlane of the same Cluster still exists (as cached). While the
/// Cluster exists, only what it proves counts: a CAPTCluster it does not name (a decoy) waits
/// for nothing, and only the control plane its `spec.controlPlaneRef` names is waited for (a
/// decoy control plane labelled with its name would hold the deletion forever). Once the
/// Cluster is gone (deleted first, where core does not run), the labels are all there is.
fn control_plane_present(ctx: &Context, cc: &CAPTCluster) -> bool {
    let Some(cluster) = cluster_name(cc) else {
        return false;
    };
    if let Some(owner) = owning_cluster(ctx, cc) {
        return names_infrastructure(&owner, cc)
            && ctx.caches.control_planes.state().iter().any(|cp| {
                cp.namespace() == cc.namespace() && names_control_plane(&owner, cp.as_ref())
            });
    }
    ctx.caches.control_planes.state().iter().any(|cp| {
        cp.namespace() == cc.namespace() && cluster_name(cp.as_ref()).as_deref() == Some(&cluster)
    })
}

async fn delete(cc: &CAPTCluster, ctx: &Context) -> Result<Action> {
    if !owner::ours_to_delete(cc) {
        return Ok(Action::await_change());
    }
    let (d, mut facts) = owner::deletion_of(ctx, cc, None);
    facts.control_plane_present = control_plane_present(ctx, cc);
    facts.retain = cc.spec.retain_vpc_on_delete.unwrap_or(false);
    super::act::carry_out(ctx, &super::subject(cc), deletion::decide(cc, &facts, d)).await
}
