//! The CAPTCluster's decision: from what was observed ([`Snapshot`]), the clock and what
//! this reconcile's writes answered so far, the plan. Pure.

use super::super::apply_owner::{
    self, APPLYING, OwnerSnapshot, RECORDING, add_refusal, apply_writes, hold_if_paused,
    needing_operator,
};
use super::super::claims::{locate, names_infrastructure};
use super::super::deletion::{self};
use super::super::plan::{self, Next, Plan, Progress, Step, Warning};
use crate::api::WorkspaceTemplateApply;
use crate::api::{CAPT_CLUSTER_FINALIZER, CAPTCluster, Cluster};
use crate::publish::Publication;
use crate::status::MANAGER_CAPT_CLUSTER;
use crate::status::capt_cluster::{
    CaptClusterInput, DEFAULT_VPC_READY_TIMEOUT, desired_capt_cluster,
};
use crate::status::workspace::WorkspaceObservation;
use crate::tenancy::Placement;
use jiff::Timestamp;
use kube::{Resource, ResourceExt};

/// Reason of the Warning Event on a CAPTCluster whose label or owner reference names a
/// Cluster that does not name it back.
pub const CLUSTER_DOES_NOT_REFERENCE: &str = "ClusterDoesNotReferenceInfrastructure";

pub use super::super::plan::ADDING_FINALIZER;

/// What a CAPTCluster's decision reads, as cached when its reconcile began.
pub type Snapshot = OwnerSnapshot<CAPTCluster>;

/// The CAPTCluster's plan. In order: a Cluster that its label names but that does not name
/// it back is told (a Warning, the first round only); a paused one publishes `Paused` and
/// nothing else; a deleting one takes its deletion's next step. Otherwise our finalizer,
/// then (with a proven Cluster, no existing VPC and a VPC template) its VPC apply and that
/// apply's name recorded, are written first; the plan then asks to decide again, since the
/// status observes the generation and the apply those writes answer. Last, the status,
/// computed by [`desired_capt_cluster`] (a refusal's condition added), after a Warning if
/// it newly needs an operator.
pub fn decide(seen: &Snapshot, progress: &Progress, now: Timestamp) -> Plan {
    let mut plan = Plan::nothing();
    let cluster = seen.named_cluster.as_deref();
    let proven = cluster.filter(|c| names_infrastructure(c, &seen.owner));
    if let (Some(named), None, true) = (cluster, proven, progress.is_empty()) {
        plan = plan.then(Step::Warn(decoy(&seen.owner, named)));
    }
    if let Some(held) = hold_if_paused(&*seen.owner, proven, now) {
        return plan.and(held);
    }
    if seen.owner.meta().deletion_timestamp.is_some() {
        return match &seen.deletion {
            Some((d, facts)) => plan.and(deletion::decide(&*seen.owner, facts, d.clone())),
            None => plan,
        };
    }
    let finalized = progress.answer::<CAPTCluster>(ADDING_FINALIZER);
    let cc = finalized.as_ref().unwrap_or(&seen.owner);
    let writes = proven.filter(|_| wants_vpc_apply(cc)).map(|cluster| {
        let existing = seen.apply.as_deref();
        let allowed = &seen.allowed_template_namespaces;
        apply_writes(cc, cluster, existing, &seen.siblings, allowed)
    });
    if progress.is_empty() {
        let mut steps = Vec::new();
        if !cc.finalizers().iter().any(|f| f == CAPT_CLUSTER_FINALIZER) {
            steps.push(plan::add_finalizer(cc, CAPT_CLUSTER_FINALIZER));
        }
        if let Some(Ok(w)) = &writes {
            steps.extend(w.apply.clone());
            steps.extend(w.record.clone());
        }
        if !steps.is_empty() {
            return steps
                .into_iter()
                .fold(plan, Plan::then)
                .next(Next::Redecide);
        }
    }
    let recorded = progress.answer::<CAPTCluster>(RECORDING);
    let mut generation = cc.meta().generation;
    let mut written = None;
    let mut workspace = None;
    let mut vpc_workspace_name = None;
    let mut refusal = None;
    match writes {
        Some(Ok(_)) => {
            if let Some(recorded) = &recorded {
                generation = recorded.meta().generation.max(generation);
                written = recorded.resource_version();
            }
            let apply = progress
                .answer::<WorkspaceTemplateApply>(APPLYING)
                .or_else(|| seen.apply.as_deref().cloned())
                .expect("an apply not written is the one cached");
            let located = locate(&apply, |name| {
                let found = seen.workspaces.iter().find(|w| w.name_any() == name);
                found.map(|w| (**w).clone())
            });
            workspace = located.own().map(|w| {
                WorkspaceObservation::from_json(&serde_json::to_value(w).unwrap_or_default())
            });
            // Another's Workspace under its name is not its VPC (the apply reports it).
            if let Placement::Use { name, .. } = located.placement {
                vpc_workspace_name = Some(name);
            }
        }
        Some(Err(r)) => refusal = Some(r),
        None => {}
    }
    let input = CaptClusterInput {
        generation,
        existing_vpc_id: cc.spec.existing_vpc_id.clone(),
        created: apply_owner::created(cc, now),
        now,
        vpc_ready_timeout: DEFAULT_VPC_READY_TIMEOUT,
        existing: cc.status.clone(),
        workspace,
        vpc_workspace_name,
        waiting_for_cluster: proven.is_none(),
        cluster_endpoint: proven.and_then(|c| c.spec.control_plane_endpoint.clone()),
    };
    let mut desired = desired_capt_cluster(&input);
    if let Some(refusal) = &refusal {
        add_refusal(&mut desired.status_fragment, cc, refusal, now);
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
    if let Some(w) = needing_operator(cc, &desired.status_fragment) {
        plan = plan.then(Step::Warn(w));
    }
    let status = Publication::status(cc, MANAGER_CAPT_CLUSTER, desired.status_fragment)
        .after(written)
        .observing(&observed);
    let recheck = apply_owner::recheck(seen.poll_interval, desired.recheck_after, refusal.as_ref());
    plan.publish(status)
        .next(recheck.map_or(Next::AwaitChange, Next::After))
}

/// True when the CAPTCluster builds its VPC with an apply: no existing VPC, and a template.
fn wants_vpc_apply(cc: &CAPTCluster) -> bool {
    cc.spec.existing_vpc_id.is_none() && cc.spec.vpc_template_ref.is_some()
}

/// The Warning on a CAPTCluster labelled with a Cluster that does not name it in
/// `spec.infrastructureRef`: a decoy builds no VPC in that Cluster's name (its Terraform
/// would run with `CLUSTER_NAME` set to the other's).
fn decoy(cc: &CAPTCluster, named: &Cluster) -> Warning {
    let note = format!(
        "Cluster {}/{} does not name this CAPTCluster in spec.infrastructureRef: it is not this \
         infrastructure's Cluster, and nothing of it is used",
        named.namespace().unwrap_or_default(),
        named.name_any()
    );
    tracing::warn!(subject = super::super::subject(cc), "{note}");
    Warning::about(cc, CLUSTER_DOES_NOT_REFERENCE, "Reconcile", note)
}

#[cfg(test)]
mod tests;
