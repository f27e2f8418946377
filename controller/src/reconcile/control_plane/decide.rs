//! The control plane's decision: from what was observed ([`Snapshot`]), the clock and what
//! this reconcile's steps answered so far, the plan. Pure.

use super::super::apply_owner::{
    self, APPLYING, ApplyWrites, OwnerSnapshot, RECORDING, add_refusal, apply_writes,
    hold_if_paused, needing_operator,
};
use super::super::claims::{locate, names_control_plane};
use super::super::cluster::{endpoint_owned_by_us, managed_by_core};
use super::super::deletion::{self};
use super::super::kubeconfig::{self, Keeping, READING_CONNECTION};
use super::super::plan::{self, Next, Object, Plan, Progress, Step, Warning};
use crate::api::{
    CAPT_CONTROL_PLANE_FINALIZER, CAPTCluster, CAPTControlPlane, Cluster, ControlPlanePhase,
    WorkspaceTemplateApply,
};
use crate::publish::Publication;
use crate::status::MANAGER_CAPT_CONTROL_PLANE;
use crate::status::control_plane::{ControlPlaneInput, desired_control_plane};
use crate::status::workspace::WorkspaceObservation;
use crate::tenancy::Refusal;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::sync::Arc;

/// Reason of the Warning Event on a control plane whose label or owner reference names a
/// Cluster that does not name it back.
pub const CLUSTER_DOES_NOT_REFERENCE: &str = "ClusterDoesNotReferenceControlPlane";

pub use super::super::plan::ADDING_FINALIZER;

/// What reading the Cluster live is (its managedFields, which the caches strip): a
/// failure's action, and the key of its answer.
pub const READING_CLUSTER: &str = "reading its Cluster's managedFields";

/// What a control plane's decision reads, as cached when its reconcile began.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The control plane, as an apply's owner.
    pub as_owner: OwnerSnapshot<CAPTControlPlane>,
    /// The CAPTCluster the named Cluster's `spec.infrastructureRef` names, if it exists.
    pub infrastructure: Option<Arc<CAPTCluster>>,
    /// Cluster API core is not running: a Cluster is ours alone.
    pub without_core: bool,
}

/// The control plane's plan. In order: a Cluster that its label names but that does not
/// name it back is told (a Warning, the first round only); a paused one publishes `Paused`
/// and nothing else; a deleting one takes its deletion's next step (after reading whether
/// the Cluster's endpoint is still ours, where core does not run). Otherwise our finalizer,
/// then (with a proven Cluster whose VPC is ready) its apply and that apply's name recorded,
/// are written first, and the plan asks to decide again. Then, from the apply's Workspace:
/// the endpoint (its `cluster_endpoint` output, else the connection Secret's, read once the
/// Workspace is ready) is published first, since the Cluster waits for it, and the status
/// observes the generation that publication left; then the status ([`desired_control_plane`],
/// a refusal's condition added), after the phase's metric and a Warning if it newly needs an
/// operator; last, the kubeconfig Secrets ([`kubeconfig::keep`]), whose reads the endpoint
/// and status do not wait for.
pub fn decide(seen: &Snapshot, progress: &Progress, now: Timestamp) -> Plan {
    let mut plan = Plan::nothing();
    let cluster = seen.as_owner.named_cluster.as_deref();
    let proven = cluster.filter(|c| names_control_plane(c, &seen.as_owner.owner));
    if let (Some(named), None, true) = (cluster, proven, progress.is_empty()) {
        plan = plan.then(Step::Warn(decoy(&seen.as_owner.owner, named)));
    }
    if let Some(held) = hold_if_paused(&*seen.as_owner.owner, proven, now) {
        return plan.and(held);
    }
    if seen.as_owner.owner.meta().deletion_timestamp.is_some() {
        return plan.and(delete(seen, proven, progress));
    }
    let finalized = progress.answer::<CAPTControlPlane>(ADDING_FINALIZER);
    let cp = finalized.as_ref().unwrap_or(&seen.as_owner.owner);
    let vpc_ready = proven
        .and(seen.infrastructure.as_deref())
        .map(|cc| cc.status.as_ref().and_then(|s| s.ready).unwrap_or(false));
    let writes = proven.filter(|_| vpc_ready == Some(true)).map(|cluster| {
        let existing = seen.as_owner.apply.as_deref();
        let allowed = &seen.as_owner.allowed_template_namespaces;
        apply_writes(cp, cluster, existing, &seen.as_owner.siblings, allowed)
    });
    if progress.is_empty() {
        let first = first_writes(cp, writes.as_ref());
        if !first.is_empty() {
            return first
                .into_iter()
                .fold(plan, Plan::then)
                .next(Next::Redecide);
        }
    }
    let owned = Owned::after(cp, seen, writes, progress);
    let workspace = owned.apply.as_ref().and_then(|a| workspace_of(seen, a));
    let endpoint_source = match endpoint_source(cp, &owned, workspace.as_ref(), progress) {
        Ok(source) => source,
        Err(secret) => {
            let read = Step::Read {
                object: *secret,
                doing: READING_CONNECTION,
            };
            return plan.then(read).next(Next::Redecide);
        }
    };
    let workspace_ready = workspace.as_ref().is_some_and(|w| w.is_ready());
    let input = ControlPlaneInput {
        generation: owned.generation,
        version: cp.spec.version.clone(),
        timeouts: (cp.spec.control_plane_config.as_ref()).and_then(|c| c.timeouts.clone()),
        created: apply_owner::created(cp, now),
        now,
        existing: cp.status.clone(),
        cluster_found: proven.is_some(),
        vpc_ready,
        workspace,
        endpoint_source,
        apply_generation: owned.apply.as_ref().and_then(|a| a.meta().generation),
    };
    let plan = match endpoint_then_status(plan, cp, seen, input, &owned, progress) {
        Ok(plan) => plan,
        Err(endpoint) => return endpoint,
    };
    match (owned.apply, proven) {
        (Some(apply), Some(cluster)) if workspace_ready => {
            match kubeconfig::keep(cp, cluster, &apply, progress) {
                Keeping::Read(reads) => reads
                    .into_iter()
                    .fold(plan, Plan::then)
                    .next(Next::Redecide),
                Keeping::Write(writes) => {
                    let next = plan.next;
                    writes.into_iter().fold(plan, Plan::then).next(next)
                }
            }
        }
        _ => plan,
    }
}

/// What a new reconcile writes first: our finalizer, if it is missing, then the apply's
/// writes, unless they are refused.
fn first_writes(cp: &CAPTControlPlane, writes: Option<&Result<ApplyWrites, Refusal>>) -> Vec<Step> {
    let mut steps = Vec::new();
    if !cp
        .finalizers()
        .iter()
        .any(|f| f == CAPT_CONTROL_PLANE_FINALIZER)
    {
        steps.push(plan::add_finalizer(cp, CAPT_CONTROL_PLANE_FINALIZER));
    }
    if let Some(Ok(w)) = writes {
        steps.extend(w.apply.clone());
        steps.extend(w.record.clone());
    }
    steps
}

/// The control plane's apply once its writes answered, or why it is refused.
struct Owned {
    /// The control plane's generation: the one recording the apply's name made, when it did.
    generation: Option<i64>,
    /// The resourceVersion recording the apply's name left, when this reconcile recorded it.
    written: Option<String>,
    /// The apply, as its write answered or as cached; `None` before the VPC is ready.
    apply: Option<WorkspaceTemplateApply>,
    /// Why the apply is refused.
    refusal: Option<Refusal>,
}

impl Owned {
    fn after(
        cp: &CAPTControlPlane,
        seen: &Snapshot,
        writes: Option<Result<ApplyWrites, Refusal>>,
        progress: &Progress,
    ) -> Self {
        let mut owned = Owned {
            generation: cp.meta().generation,
            written: None,
            apply: None,
            refusal: None,
        };
        match writes {
            Some(Ok(_)) => {
                if let Some(recorded) = progress.answer::<CAPTControlPlane>(RECORDING) {
                    owned.generation = recorded.meta().generation.max(owned.generation);
                    owned.written = recorded.resource_version();
                }
                let answered = progress.answer::<WorkspaceTemplateApply>(APPLYING);
                let apply = answered.or_else(|| seen.as_owner.apply.as_deref().cloned());
                owned.apply = Some(apply.expect("an apply not written is the one cached"));
            }
            Some(Err(refusal)) => owned.refusal = Some(refusal),
            None => {}
        }
        owned
    }
}

/// What the apply's own Workspace (as cached) reports.
fn workspace_of(seen: &Snapshot, apply: &WorkspaceTemplateApply) -> Option<WorkspaceObservation> {
    let located = locate(apply, |name| {
        let found = seen
            .as_owner
            .workspaces
            .iter()
            .find(|w| w.name_any() == name);
        found.map(|w| (**w).clone())
    });
    let own = located.own();
    own.map(|w| WorkspaceObservation::from_json(&serde_json::to_value(w).unwrap_or_default()))
}

/// Where the endpoint comes from: the Workspace's `cluster_endpoint` output, else, once the
/// Workspace is ready, the connection Secret's (read live: Secrets are not watched; only that
/// key is used here). `Err` is the Secret to read first.
fn endpoint_source(
    cp: &CAPTControlPlane,
    owned: &Owned,
    workspace: Option<&WorkspaceObservation>,
    progress: &Progress,
) -> Result<Option<String>, Box<Object>> {
    let output = workspace.and_then(|w| w.output_string("cluster_endpoint"));
    let ready = workspace.is_some_and(|w| w.is_ready());
    let connection = (owned.apply.as_ref()).and_then(|a| kubeconfig::connection_secret(cp, a));
    let (None, true, Some(secret)) = (&output, ready, connection) else {
        return Ok(output);
    };
    match progress.read::<Secret>(READING_CONNECTION, &secret.name) {
        None => Err(Box::new(secret)),
        Some(found) => Ok(found.as_ref().and_then(cluster_endpoint)),
    }
}

/// The endpoint, then the status, each once per reconcile. The endpoint first: it is what
/// the Cluster waits for. Alone in its round (`Err`, the plan that publishes it): status
/// applies carry the resourceVersion they were planned on, so a concurrent main-resource
/// write would turn the status apply into a retry. `Ok` is the plan with the status (when
/// not yet published), looking again when the status says.
fn endpoint_then_status(
    mut plan: Plan,
    cp: &CAPTControlPlane,
    seen: &Snapshot,
    mut input: ControlPlaneInput,
    owned: &Owned,
    progress: &Progress,
) -> Result<Plan, Plan> {
    let refusal = &owned.refusal;
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
        refusal,
    );
    let observed = format!("{observed:?}");
    let mut desired = desired_control_plane(&input);
    if let Some(endpoint) = &desired.endpoint {
        let main = Publication::main(
            cp,
            MANAGER_CAPT_CONTROL_PLANE,
            json!({"spec": {"controlPlaneEndpoint": endpoint}}),
            vec![],
        )
        .after(owned.written.clone())
        .observing(&observed);
        match progress.published(&main.key) {
            None => return Err(plan.publish(main).next(Next::Redecide)),
            // Our endpoint write makes a new generation, which the cache may not show yet
            // (nor does it to a reconcile that runs right after the one that wrote it). The
            // status observes the generation the write left: computed on the cached one, it
            // would be written twice, the second time for its observedGeneration alone.
            Some(left) if left > input.generation => {
                input.generation = left;
                desired = desired_control_plane(&input);
            }
            Some(_) => {}
        }
    }
    if let Some(refusal) = refusal {
        add_refusal(&mut desired.status_fragment, cp, refusal, input.now);
    }
    let recheck = apply_owner::recheck(
        seen.as_owner.poll_interval,
        desired.recheck_after,
        refusal.as_ref(),
    );
    let status = Publication::status(cp, MANAGER_CAPT_CONTROL_PLANE, desired.status_fragment)
        .after(owned.written.clone())
        .observing(&observed);
    if progress.published(&status.key).is_none() {
        if let Some(reached) = phase_reached(cp, desired.phase, input.now) {
            plan = plan.then(reached);
        }
        if let Some(w) = needing_operator(cp, &status.fragment) {
            plan = plan.then(Step::Warn(w));
        }
        plan = plan.publish(status);
    }
    Ok(plan.next(recheck.map_or(Next::AwaitChange, Next::After)))
}

/// The deletion's next step, once it is known (where core does not run) whether the
/// Cluster's endpoint is still ours: under core, the endpoint is core's (it copied it from
/// us) and a Cluster going away keeps it; alone, ours is released before the control plane
/// goes.
fn delete(seen: &Snapshot, proven: Option<&Cluster>, progress: &Progress) -> Plan {
    let Some((d, facts)) = &seen.as_owner.deletion else {
        return Plan::nothing();
    };
    let mut facts = facts.clone();
    if let Some(cluster) = proven.filter(|c| !managed_by_core(seen.without_core, c)) {
        match progress.read::<Cluster>(READING_CLUSTER, &cluster.name_any()) {
            None => {
                let read = Step::Read {
                    object: Object::of(cluster),
                    doing: READING_CLUSTER,
                };
                return Plan::nothing().then(read).next(Next::Redecide);
            }
            Some(live) => facts.endpoint_owned = live.is_some_and(|c| endpoint_owned_by_us(&c)),
        }
    }
    deletion::decide(&*seen.as_owner.owner, &facts, d.clone())
}

/// The connection Secret's `cluster_endpoint`, if it holds one.
fn cluster_endpoint(secret: &Secret) -> Option<String> {
    let value = secret.data.as_ref()?.get("cluster_endpoint")?;
    String::from_utf8(value.0.clone()).ok()
}

/// The time from Creating to Ready or Failed, when the phase changes to one of them.
fn phase_reached(cp: &CAPTControlPlane, phase: ControlPlanePhase, now: Timestamp) -> Option<Step> {
    let status = cp.status.as_ref();
    if status.and_then(|s| s.phase) == Some(phase) || phase == ControlPlanePhase::Creating {
        return None;
    }
    let since = (status.and_then(|s| s.conditions.as_ref()))
        .and_then(|c| c.iter().find(|c| c.type_ == "Creating"))
        .map(|c| c.last_transition_time.0)
        .or(cp.meta().creation_timestamp.as_ref().map(|t| t.0))?;
    let seconds = (now - since).total(jiff::Unit::Second).unwrap_or(0.0);
    Some(Step::PhaseReached {
        phase: format!("{phase:?}"),
        seconds,
    })
}

/// The Warning on a control plane labelled with a Cluster that does not name it in
/// `spec.controlPlaneRef`: whoever writes a control plane writes its labels, and a decoy
/// labelled with another's Cluster gets nothing of that Cluster (not its VPC, its
/// kubeconfig Secret, its endpoint, nor its release on deletion).
fn decoy(cp: &CAPTControlPlane, named: &Cluster) -> Warning {
    let note = format!(
        "Cluster {}/{} does not name this CAPTControlPlane in spec.controlPlaneRef: it is not \
         this control plane's Cluster, and nothing of it is used",
        named.namespace().unwrap_or_default(),
        named.name_any()
    );
    tracing::warn!(subject = super::super::subject(cp), "{note}");
    Warning::about(cp, CLUSTER_DOES_NOT_REFERENCE, "Reconcile", note)
}

#[cfg(test)]
mod tests;
