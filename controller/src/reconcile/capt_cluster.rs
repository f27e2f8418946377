//! CAPTCluster: waits for its owning Cluster, creates or adopts its VPC apply (unless it
//! uses an existing VPC), and publishes the status computed by
//! [`crate::status::capt_cluster`]. Deletion waits for the control plane, then deletes the
//! VPC apply (or orphans it with `retainVpcOnDelete`) and waits for its Workspace to go.

use super::deletion::{self, Deletion};
use super::shared::{ApplySpec, cluster_name, ensure_apply, observe_workspace, owning_cluster};
use super::{Result, after, kube_err, pause};
use crate::api::{CAPT_CLUSTER_FINALIZER, CAPTCluster, CAPTControlPlane};
use crate::context::Context;
use crate::k8s::{apply_fields, set_finalizer};
use crate::publish::Publication;
use crate::render::workspace_name;
use crate::status::MANAGER_CAPT_CLUSTER;
use crate::status::capt_cluster::{
    CAPT_CLUSTER_CONDITION_TYPES, CaptClusterInput, DEFAULT_VPC_READY_TIMEOUT, desired_capt_cluster,
};
use crate::status::deletion::DeletionFacts;
use jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::sync::Arc;

/// Reconciles one CAPTCluster.
pub async fn reconcile(cc: Arc<CAPTCluster>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciled("CAPTCluster");
    let api: Api<CAPTCluster> =
        Api::namespaced(ctx.client.clone(), &cc.namespace().unwrap_or_default());
    let cluster = owning_cluster(&ctx, &*cc).await?;
    let existing = cc.status.as_ref().and_then(|s| s.conditions.as_deref());
    if let Some(why) = pause::paused(cluster.as_ref(), &*cc) {
        let (types, list) = (&CAPT_CLUSTER_CONDITION_TYPES, existing.unwrap_or_default());
        return pause::hold(&ctx, &*cc, MANAGER_CAPT_CLUSTER, types, list, why).await;
    }
    if cc.meta().deletion_timestamp.is_some() {
        return delete(&cc, &api, &ctx).await;
    }
    set_finalizer(&api, &cc, CAPT_CLUSTER_FINALIZER, true)
        .await
        .map_err(kube_err(&*cc, "adding its finalizer"))?;
    let mut workspace = None;
    let mut vpc_workspace_name = None;
    if cluster.is_some() && cc.spec.existing_vpc_id.is_none() && cc.spec.vpc_template_ref.is_some()
    {
        let apply = ensure_apply(&ctx, &*cc, apply_spec(&cc)).await?;
        if cc.spec.workspace_template_apply_name.as_deref() != Some(&apply.name_any()) {
            apply_fields(
                &api,
                &cc,
                json!({"spec": {"workspaceTemplateApplyName": apply.name_any()}}),
            )
            .await
            .map_err(kube_err(&*cc, "recording its WorkspaceTemplateApply name"))?;
        }
        vpc_workspace_name = Some(workspace_name(&apply));
        workspace = observe_workspace(&ctx, &*cc, &apply).await?;
    }
    let input = CaptClusterInput {
        generation: cc.meta().generation,
        existing_vpc_id: cc.spec.existing_vpc_id.clone(),
        created: cc
            .meta()
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .unwrap_or_else(Timestamp::now),
        now: Timestamp::now(),
        vpc_ready_timeout: DEFAULT_VPC_READY_TIMEOUT,
        existing: cc.status.clone(),
        workspace,
        vpc_workspace_name,
        waiting_for_cluster: cluster.is_none(),
        cluster_endpoint: cluster.and_then(|c| c.spec.control_plane_endpoint),
    };
    let desired = desired_capt_cluster(&input);
    let status = Publication::status(&*cc, MANAGER_CAPT_CLUSTER, desired.status_fragment);
    ctx.publish(status).await?;
    Ok(after(desired.recheck_after))
}

/// The name of the VPC apply: the recorded one, else `<name>-vpc`.
pub fn apply_name(cc: &CAPTCluster) -> String {
    cc.spec
        .workspace_template_apply_name
        .clone()
        .unwrap_or_else(|| format!("{}-vpc", cc.name_any()))
}

fn apply_spec(cc: &CAPTCluster) -> ApplySpec {
    let mut variables = json!({
        "CLUSTER_NAME": cluster_name(cc).unwrap_or_else(|| cc.name_any()),
        "REGION": cc.spec.region,
    });
    if let Some(vpc) = &cc.spec.vpc_config {
        variables["VPC_NAME"] = json!(vpc.name);
    }
    let ns = cc.namespace().unwrap_or_default();
    ApplySpec {
        name: apply_name(cc),
        spec: json!({
            "templateRef": cc.spec.vpc_template_ref,
            "variables": variables,
            "writeConnectionSecretToRef": {"name": format!("{}-vpc-connection", cc.name_any()), "namespace": ns},
        }),
    }
}

/// True when a CAPTControlPlane of the same Cluster still exists.
async fn control_plane_present(ctx: &Context, cc: &CAPTCluster) -> Result<bool> {
    let Some(cluster) = cluster_name(cc) else {
        return Ok(false);
    };
    let api: Api<CAPTControlPlane> =
        Api::namespaced(ctx.client.clone(), &cc.namespace().unwrap_or_default());
    let all = api
        .list(&ListParams::default())
        .await
        .map_err(kube_err(cc, "listing control planes"))?;
    Ok(all
        .items
        .iter()
        .any(|cp| cluster_name(cp).as_deref() == Some(&cluster)))
}

async fn delete(cc: &CAPTCluster, api: &Api<CAPTCluster>, ctx: &Context) -> Result<Action> {
    if !cc.finalizers().iter().any(|f| f == CAPT_CLUSTER_FINALIZER) {
        return Ok(Action::await_change());
    }
    let (apply, workspace_present) = deletion::apply_facts(ctx, cc, &apply_name(cc)).await?;
    let facts = DeletionFacts {
        endpoint_owned: false,
        control_plane_present: control_plane_present(ctx, cc).await?,
        apply_present: apply.is_some(),
        apply_deleting: apply
            .as_ref()
            .is_some_and(|a| a.meta().deletion_timestamp.is_some()),
        workspace_present,
        retain: cc.spec.retain_vpc_on_delete.unwrap_or(false),
        started: deletion::started(cc),
        now: Timestamp::now(),
        stuck_after: ctx.settings.stuck_deletion_after,
    };
    let d = Deletion {
        finalizer: CAPT_CLUSTER_FINALIZER,
        manager: MANAGER_CAPT_CLUSTER,
        own_types: &CAPT_CLUSTER_CONDITION_TYPES,
        existing: cc
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default(),
        apply,
        cluster: None,
    };
    deletion::carry_out(ctx, cc, api, facts, d).await
}
