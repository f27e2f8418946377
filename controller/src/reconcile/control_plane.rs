//! CAPTControlPlane: waits for its VPC, creates or adopts its WorkspaceTemplateApply, and
//! publishes the status and endpoint computed by [`crate::status::control_plane`]. Deletion
//! releases the Cluster endpoint, deletes the apply and waits for the Workspace to go.

use super::cluster::{endpoint_owned_by_us, managed_by_core};
use super::deletion::{self, Deletion};
use super::shared::{
    ApplySpec, cluster_name, ensure_apply, observe_workspace, owning_cluster, secret_endpoint,
};
use super::{Result, after, kube_err, pause};
use crate::api::{
    CAPT_CONTROL_PLANE_FINALIZER, CAPTCluster, CAPTControlPlane, Cluster, ControlPlanePhase,
};
use crate::context::Context;
use crate::k8s::{apply_fields, set_finalizer};
use crate::publish::Publication;
use crate::status::MANAGER_CAPT_CONTROL_PLANE;
use crate::status::control_plane::{
    CONTROL_PLANE_CONDITION_TYPES, ControlPlaneInput, desired_control_plane,
};
use crate::status::deletion::DeletionFacts;
use jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::sync::Arc;

/// Reconciles one CAPTControlPlane.
pub async fn reconcile(cp: Arc<CAPTControlPlane>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciled("CAPTControlPlane");
    let api: Api<CAPTControlPlane> =
        Api::namespaced(ctx.client.clone(), &cp.namespace().unwrap_or_default());
    let cluster = owning_cluster(&ctx, &*cp).await?;
    let existing = cp.status.as_ref().and_then(|s| s.conditions.as_deref());
    if let Some(why) = pause::paused(cluster.as_ref(), &*cp) {
        let (types, list) = (&CONTROL_PLANE_CONDITION_TYPES, existing.unwrap_or_default());
        return pause::hold(&ctx, &*cp, MANAGER_CAPT_CONTROL_PLANE, types, list, why).await;
    }
    if cp.meta().deletion_timestamp.is_some() {
        return delete(&cp, &api, &ctx, cluster).await;
    }
    set_finalizer(&api, &cp, CAPT_CONTROL_PLANE_FINALIZER, true)
        .await
        .map_err(kube_err(&*cp, "adding its finalizer"))?;
    let vpc_ready = vpc_ready(&ctx, &cp, cluster.as_ref()).await?;
    let mut workspace = None;
    let mut endpoint_source = None;
    if vpc_ready == Some(true) {
        let apply = ensure_apply(&ctx, &*cp, apply_spec(&cp)).await?;
        record_apply_name(&api, &cp, &apply.name_any()).await?;
        workspace = observe_workspace(&ctx, &*cp, &apply).await?;
        if workspace.as_ref().is_some_and(|w| w.is_ready()) {
            super::kubeconfig::ensure_kubeconfig(&ctx, &cp, &apply).await?;
        }
        endpoint_source = workspace
            .as_ref()
            .and_then(|w| w.output_string("cluster_endpoint"));
        if endpoint_source.is_none() && workspace.as_ref().is_some_and(|w| w.is_ready()) {
            endpoint_source = secret_endpoint(&ctx, &*cp, &apply).await?;
        }
    }
    let input = ControlPlaneInput {
        generation: cp.meta().generation,
        version: cp.spec.version.clone(),
        timeouts: cp
            .spec
            .control_plane_config
            .as_ref()
            .and_then(|c| c.timeouts.clone()),
        created: cp
            .meta()
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .unwrap_or_else(Timestamp::now),
        now: Timestamp::now(),
        existing: cp.status.clone(),
        cluster_found: cluster.is_some(),
        vpc_ready,
        workspace,
        endpoint_source,
    };
    let desired = desired_control_plane(&input);
    observe_phase(&ctx, &cp, desired.phase);
    let status = Publication::status(&*cp, MANAGER_CAPT_CONTROL_PLANE, desired.status_fragment);
    let main = desired.endpoint.map(|endpoint| {
        Publication::main(
            &*cp,
            MANAGER_CAPT_CONTROL_PLANE,
            json!({"spec": {"controlPlaneEndpoint": endpoint}}),
            vec![],
        )
    });
    // The endpoint first: it is what the Cluster waits for. One at a time: status applies
    // carry the resourceVersion they were planned on, so a concurrent main-resource write
    // would turn the status apply into a retry.
    if let Some(main) = main {
        ctx.publish(main).await?;
    }
    ctx.publish(status).await?;
    Ok(after(desired.recheck_after))
}

/// The name of the control plane's apply: the recorded one, else `<name>-controlplane`.
pub fn apply_name(cp: &CAPTControlPlane) -> String {
    cp.spec
        .workspace_template_apply_name
        .clone()
        .unwrap_or_else(|| format!("{}-controlplane", cp.name_any()))
}

fn apply_spec(cp: &CAPTControlPlane) -> ApplySpec {
    let config = cp.spec.control_plane_config.clone().unwrap_or_default();
    let mut variables = json!({
        "CLUSTER_NAME": cluster_name(cp).unwrap_or_else(|| cp.name_any()),
        "KUBERNETES_VERSION": cp.spec.version,
    });
    if let Some(region) = config.region {
        variables["REGION"] = json!(region);
    }
    let ns = cp.namespace().unwrap_or_default();
    ApplySpec {
        name: apply_name(cp),
        spec: json!({
            "templateRef": cp.spec.workspace_template_ref,
            "variables": variables,
            "writeConnectionSecretToRef": {"name": format!("{}-eks-connection", cp.name_any()), "namespace": ns},
        }),
    }
}

/// Records the apply's name in `spec.workspaceTemplateApplyName` (field manager
/// `capt-controller`), once.
async fn record_apply_name(
    api: &Api<CAPTControlPlane>,
    cp: &CAPTControlPlane,
    name: &str,
) -> Result<()> {
    if cp.spec.workspace_template_apply_name.as_deref() == Some(name) {
        return Ok(());
    }
    apply_fields(
        api,
        cp,
        json!({"spec": {"workspaceTemplateApplyName": name}}),
    )
    .await
    .map_err(kube_err(cp, "recording its WorkspaceTemplateApply name"))?;
    Ok(())
}

/// Whether the Cluster's CAPTCluster is ready; `None` when unknown.
async fn vpc_ready(
    ctx: &Context,
    cp: &CAPTControlPlane,
    cluster: Option<&Cluster>,
) -> Result<Option<bool>> {
    let Some(infra) = cluster
        .and_then(|c| c.spec.infrastructure_ref.as_ref())
        .and_then(|r| r.name.clone())
    else {
        return Ok(None);
    };
    let api: Api<CAPTCluster> =
        Api::namespaced(ctx.client.clone(), &cp.namespace().unwrap_or_default());
    let found = api
        .get_opt(&infra)
        .await
        .map_err(kube_err(cp, "reading its CAPTCluster"))?;
    Ok(found.map(|c| c.status.and_then(|s| s.ready).unwrap_or(false)))
}

/// Observes the time from Creating to Ready or Failed when the phase changes.
fn observe_phase(ctx: &Context, cp: &CAPTControlPlane, phase: ControlPlanePhase) {
    let previous = cp.status.as_ref().and_then(|s| s.phase);
    if previous == Some(phase) || phase == ControlPlanePhase::Creating {
        return;
    }
    let since = cp
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Creating"))
        .map(|c| c.last_transition_time.0)
        .or(cp.meta().creation_timestamp.as_ref().map(|t| t.0));
    if let Some(since) = since {
        let seconds = (Timestamp::now() - since)
            .total(jiff::Unit::Second)
            .unwrap_or(0.0);
        let label = crate::metrics::PhaseLabel {
            phase: format!("{phase:?}"),
        };
        ctx.metrics
            .phase_transition
            .get_or_create(&label)
            .observe(seconds.max(0.0));
    }
}

async fn delete(
    cp: &CAPTControlPlane,
    api: &Api<CAPTControlPlane>,
    ctx: &Context,
    cluster: Option<Cluster>,
) -> Result<Action> {
    if !cp
        .finalizers()
        .iter()
        .any(|f| f == CAPT_CONTROL_PLANE_FINALIZER)
    {
        return Ok(Action::await_change());
    }
    let (apply, workspace_present) = deletion::apply_facts(ctx, cp, &apply_name(cp)).await?;
    let facts = DeletionFacts {
        // Under core, the endpoint is core's (it copied it from us) and a Cluster going away
        // keeps it; alone, ours is released before the control plane goes.
        endpoint_owned: cluster
            .as_ref()
            .is_some_and(|c| !managed_by_core(c) && endpoint_owned_by_us(c)),
        control_plane_present: false,
        apply_present: apply.is_some(),
        apply_deleting: apply
            .as_ref()
            .is_some_and(|a| a.meta().deletion_timestamp.is_some()),
        workspace_present,
        retain: false,
        started: deletion::started(cp),
        now: Timestamp::now(),
        stuck_after: ctx.settings.stuck_deletion_after,
    };
    let d = Deletion {
        finalizer: CAPT_CONTROL_PLANE_FINALIZER,
        manager: MANAGER_CAPT_CONTROL_PLANE,
        own_types: &CONTROL_PLANE_CONDITION_TYPES,
        existing: cp
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default(),
        apply,
        cluster,
    };
    deletion::carry_out(ctx, cp, api, facts, d).await
}
