//! CAPTControlPlane: waits for its VPC, creates or adopts its WorkspaceTemplateApply, and
//! publishes the status and endpoint computed by [`crate::status::control_plane`]. Deletion
//! releases the Cluster endpoint, deletes the apply and waits for the Workspace to go.

use super::cluster::{endpoint_still_ours, managed_by_core};
use super::deletion;
use super::owner::{self, ApplyOwner};
use super::shared::{names_control_plane, observe_workspace, owning_cluster, secret_endpoint};
use super::{Result, after, apply_owner, kube_err};
use crate::api::{
    CAPT_CONTROL_PLANE_FINALIZER, CAPTCluster, CAPTControlPlane, Cluster, ControlPlanePhase,
    WorkspaceTemplateApply,
};
use crate::context::Context;
use crate::k8s::set_finalizer;
use crate::publish::Publication;
use crate::status::MANAGER_CAPT_CONTROL_PLANE;
use crate::status::control_plane::{
    CONTROL_PLANE_CONDITION_TYPES, ControlPlaneInput, desired_control_plane,
};
use crate::tenancy::Refusal;
use crate::watches::cached_beside;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use std::sync::Arc;

impl ApplyOwner for CAPTControlPlane {
    const FINALIZER: &'static str = CAPT_CONTROL_PLANE_FINALIZER;
    const MANAGER: &'static str = MANAGER_CAPT_CONTROL_PLANE;
    const CONDITION_TYPES: &'static [&'static str] = &CONTROL_PLANE_CONDITION_TYPES;
    const APPLY_SUFFIX: &'static str = "controlplane";

    fn recorded_apply_name(&self) -> Option<&str> {
        self.spec.workspace_template_apply_name.as_deref()
    }

    const CONNECTION_SUFFIX: &'static str = "eks-connection";

    fn template_ref(&self) -> Value {
        json!(self.spec.workspace_template_ref)
    }

    /// Its Kubernetes version and region (`CLUSTER_NAME` is set, with its namespace, in
    /// [`owner::ensure_recorded_apply`]).
    fn apply_variables(&self) -> Value {
        let config = self.spec.control_plane_config.clone().unwrap_or_default();
        let mut variables = json!({
            "KUBERNETES_VERSION": crate::api::eks_version(&self.spec.version),
        });
        if let Some(region) = config.region {
            variables["REGION"] = json!(region);
        }
        variables
    }

    fn conditions(&self) -> &[Condition] {
        let list = self.status.as_ref().and_then(|s| s.conditions.as_deref());
        list.unwrap_or_default()
    }

    fn template_namespace(&self) -> (&'static str, Option<&String>) {
        (
            "spec.workspaceTemplateRef",
            self.spec.workspace_template_ref.namespace.as_ref(),
        )
    }
}

/// Reconciles one CAPTControlPlane.
pub async fn reconcile(cp: Arc<CAPTControlPlane>, ctx: Arc<Context>) -> Result<Action> {
    let api: Api<CAPTControlPlane> =
        Api::namespaced(ctx.client.clone(), &cp.namespace().unwrap_or_default());
    let cluster = proven_cluster(&ctx, &cp).await;
    if let Some(held) = apply_owner::hold_if_paused(&*cp, cluster.as_ref(), Timestamp::now()) {
        return super::act::carry_out(&ctx, &super::subject(&*cp), held).await;
    }
    if cp.meta().deletion_timestamp.is_some() {
        return delete(&cp, &ctx, cluster).await;
    }
    let cp = set_finalizer(&api, &cp, CAPT_CONTROL_PLANE_FINALIZER, true)
        .await
        .map_err(kube_err(&*cp, "adding its finalizer"))?
        .map_or(cp, Arc::new);
    let Observed {
        mut input,
        apply,
        refusal,
        written,
    } = observe_infrastructure(&ctx, &cp, cluster.as_ref()).await?;
    let workspace_ready = input.workspace.as_ref().is_some_and(|w| w.is_ready());
    let mut desired = desired_control_plane(&input);
    // What the endpoint and status are computed from, less the clock and the status's own
    // last value.
    let observed = (
        &input.version,
        &input.timeouts,
        input.cluster_found,
        input.vpc_ready,
        &input.workspace,
        &input.endpoint_source,
        input.apply_generation,
        &refusal,
    );
    let observed = format!("{observed:?}");
    // The endpoint first: it is what the Cluster waits for. One at a time: status applies
    // carry the resourceVersion they were planned on, so a concurrent main-resource write
    // would turn the status apply into a retry.
    if let Some(endpoint) = &desired.endpoint {
        let main = Publication::main(
            &*cp,
            MANAGER_CAPT_CONTROL_PLANE,
            json!({"spec": {"controlPlaneEndpoint": endpoint}}),
            vec![],
        )
        .after(written.clone());
        // Our endpoint write makes a new generation, which the cache may not show yet (nor
        // does it to a reconcile that runs right after the one that wrote it). The status
        // observes the generation the write left: computed on the cached one, it would be
        // written twice, the second time for its observedGeneration alone.
        let written = ctx.publish(main.observing(&observed)).await?.generation();
        if written > input.generation {
            input.generation = written;
            desired = desired_control_plane(&input);
        }
    }
    if let Some(refusal) = &refusal {
        apply_owner::add_refusal(
            &mut desired.status_fragment,
            &*cp,
            refusal,
            Timestamp::now(),
        );
    }
    observe_phase(&ctx, &cp, desired.phase);
    let recheck = after(apply_owner::recheck(
        ctx.settings.poll_interval,
        desired.recheck_after,
        refusal.as_ref(),
    ));
    owner::warn_if_needing_operator(&ctx, &*cp, &desired.status_fragment).await;
    let status = Publication::status(&*cp, MANAGER_CAPT_CONTROL_PLANE, desired.status_fragment)
        .after(written);
    ctx.publish(status.observing(&observed)).await?;
    // The kubeconfig Secret last: reading the connection Secret is a request, and the
    // endpoint and status do not wait for it.
    if let (Some(apply), Some(cluster)) = (apply.filter(|_| workspace_ready), &cluster) {
        super::kubeconfig::ensure_kubeconfig(&ctx, &cp, cluster, &apply).await?;
    }
    Ok(recheck)
}

/// What the control plane's endpoint and status are computed from, with the apply they come
/// from, or why that apply is refused.
struct Observed {
    input: ControlPlaneInput,
    apply: Option<WorkspaceTemplateApply>,
    refusal: Option<Refusal>,
    /// The resourceVersion recording the apply's name left, when this reconcile recorded it.
    written: Option<String>,
}

/// Observes the control plane's infrastructure: once the VPC is ready, its apply (created or
/// adopted, its name recorded: [`owner::ensure_recorded_apply`]), then the apply's Workspace
/// and the endpoint it reports (its `cluster_endpoint` output, else the connection Secret
/// once the Workspace is ready).
async fn observe_infrastructure(
    ctx: &Context,
    cp: &CAPTControlPlane,
    cluster: Option<&Cluster>,
) -> Result<Observed> {
    let vpc_ready = vpc_ready(ctx, cp, cluster);
    let mut workspace = None;
    let mut endpoint_source = None;
    let mut refusal = None;
    let mut generation = cp.meta().generation;
    let mut written = None;
    let apply = match (vpc_ready, cluster) {
        (Some(true), Some(cluster)) => {
            match owner::ensure_recorded_apply(ctx, cp, cluster).await? {
                Ok(recorded) => {
                    generation = recorded.generation;
                    written = recorded.written;
                    Some(recorded.apply)
                }
                Err(r) => {
                    refusal = Some(r);
                    None
                }
            }
        }
        _ => None,
    };
    if let Some(apply) = &apply {
        workspace = observe_workspace(ctx, apply);
        endpoint_source = workspace
            .as_ref()
            .and_then(|w| w.output_string("cluster_endpoint"));
        if endpoint_source.is_none() && workspace.as_ref().is_some_and(|w| w.is_ready()) {
            endpoint_source = secret_endpoint(ctx, cp, apply).await?;
        }
    }
    let input = ControlPlaneInput {
        generation,
        version: cp.spec.version.clone(),
        timeouts: cp
            .spec
            .control_plane_config
            .as_ref()
            .and_then(|c| c.timeouts.clone()),
        created: apply_owner::created(cp, Timestamp::now()),
        now: Timestamp::now(),
        existing: cp.status.clone(),
        cluster_found: cluster.is_some(),
        vpc_ready,
        workspace,
        endpoint_source,
        apply_generation: apply.as_ref().and_then(|a| a.meta().generation),
    };
    Ok(Observed {
        input,
        apply,
        refusal,
        written,
    })
}

/// Reason of the Warning Event on a control plane whose label or owner reference names a
/// Cluster that does not name it back.
pub const CLUSTER_DOES_NOT_REFERENCE: &str = "ClusterDoesNotReferenceControlPlane";

/// The Cluster this is the control plane of (as cached): the one its owner reference or
/// `cluster.x-k8s.io/cluster-name` label names, only when that Cluster's
/// `spec.controlPlaneRef` names it back ([`names_control_plane`]). Whoever writes a control
/// plane writes its labels: a decoy labelled with another's Cluster gets nothing of that
/// Cluster (not its VPC, its kubeconfig Secret, its endpoint, nor its release on deletion),
/// and a Warning Event says why.
async fn proven_cluster(ctx: &Context, cp: &CAPTControlPlane) -> Option<Cluster> {
    let named = owning_cluster(ctx, cp)?;
    if names_control_plane(&named, cp) {
        return Some(named);
    }
    let note = format!(
        "Cluster {}/{} does not name this CAPTControlPlane in spec.controlPlaneRef: it is not \
         this control plane's Cluster, and nothing of it is used",
        named.namespace().unwrap_or_default(),
        named.name_any()
    );
    tracing::warn!(subject = super::subject(cp), "{note}");
    ctx.warn(cp, CLUSTER_DOES_NOT_REFERENCE, "Reconcile", note)
        .await;
    None
}

/// Whether the Cluster's CAPTCluster is ready (as cached); `None` when unknown.
fn vpc_ready(ctx: &Context, cp: &CAPTControlPlane, cluster: Option<&Cluster>) -> Option<bool> {
    let infra = cluster
        .and_then(|c| c.spec.infrastructure_ref.as_ref())
        .and_then(|r| r.name_of::<CAPTCluster>())?;
    let found = cached_beside(&ctx.caches.capt_clusters, cp, infra)?;
    Some(found.status.as_ref().and_then(|s| s.ready).unwrap_or(false))
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

async fn delete(cp: &CAPTControlPlane, ctx: &Context, cluster: Option<Cluster>) -> Result<Action> {
    if !owner::ours_to_delete(cp) {
        return Ok(Action::await_change());
    }
    // Under core, the endpoint is core's (it copied it from us) and a Cluster going away keeps
    // it; alone, ours is released before the control plane goes.
    let endpoint_owned = match cluster
        .as_ref()
        .filter(|c| !managed_by_core(ctx.settings.without_core, c))
    {
        Some(c) => endpoint_still_ours(ctx, c).await?,
        None => false,
    };
    let (d, mut facts) = owner::deletion_of(ctx, cp, cluster);
    facts.endpoint_owned = endpoint_owned;
    super::act::carry_out(ctx, &super::subject(cp), deletion::decide(cp, &facts, d)).await
}
