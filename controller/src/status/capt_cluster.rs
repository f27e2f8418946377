//! The CAPTCluster status fragment (field manager `capt-captcluster`): the VPC's readiness.
//!
//! With `spec.existingVpcId` the VPC is ready at once. Otherwise it is ready when its Workspace
//! is Ready and has a `vpc_id` output; `ReconcileError` is a failure with the provider's
//! message; waiting longer than the VPC timeout is a failure (`VPCReadyTimeout`) that stays
//! until the VPC is ready or the spec changes. Waiting for the owning Cluster never times out.
//!
//! The current wait started at the latest transition of `VPCReady`, `VPCFailed` and
//! `WaitingForCluster` to False (the object's creation before any of them exists).

use super::conditions::{self, ConditionBuilder, Status};
use super::duration::format_duration;
use super::endpoint;
use super::pause::{PAUSED_CONDITION, paused_condition};
use super::wait::{self, Deadline, recheck_after};
use super::workspace::{WorkspaceObservation, WorkspaceState, keep_output_names};
use crate::api::{ApiEndpoint, CAPTClusterStatus};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::{Map, Value, json};
use std::time::Duration;

/// The v1beta2 contract's summary of a CAPTCluster, which core mirrors into the Cluster's
/// `InfrastructureReady`: the VPC's state now, through its whole life (deletion included).
pub const READY_CONDITION: &str = "Ready";

/// Condition types this manager sets on a CAPTCluster, in the order it lists them.
pub const CAPT_CLUSTER_CONDITION_TYPES: [&str; 5] = [
    READY_CONDITION,
    "VPCReady",
    "VPCFailed",
    "WaitingForCluster",
    PAUSED_CONDITION,
];

/// The conditions whose turn to False starts a wait (not `Paused`: unpausing resumes a wait).
const WAIT_MARKERS: [&str; 3] = ["VPCReady", "VPCFailed", "WaitingForCluster"];

/// The VPC output listing its availability zones; each becomes a failure domain.
pub const AZS_OUTPUT: &str = "azs";

/// How long the VPC may take when nobody says otherwise (a CAPTCluster has no timeouts field).
pub const DEFAULT_VPC_READY_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Reasons used in the conditions (those of the VPC Workspace's state and of waiting are
/// shared with the control plane).
pub mod reason {
    pub use crate::status::conditions::reason::{
        VPC_READY_TIMEOUT, WAITING_FOR_CLUSTER, WAITING_FOR_WORKSPACE, WORKSPACE_CREATING,
        WORKSPACE_DEGRADED, WORKSPACE_DELETING, WORKSPACE_FAILED, WORKSPACE_NEEDS_OPERATOR,
        WORKSPACE_PAUSED,
    };
    /// `spec.existingVpcId` names the VPC.
    pub const EXISTING_VPC: &str = "ExistingVPC";
    /// The VPC Workspace is ready and reported `vpc_id`.
    pub const VPC_READY: &str = "VPCReady";
    /// A Cluster owns the CAPTCluster.
    pub const OWNER_CLUSTER_FOUND: &str = "OwnerClusterFound";
    /// The VPC Workspace is ready but has no `vpc_id` output.
    pub const WAITING_FOR_VPC_ID: &str = "WaitingForVPCID";
    /// No failure.
    pub const NO_FAILURE: &str = "NoFailure";
}

/// Everything the CAPTCluster status depends on.
#[derive(Clone, Debug)]
pub struct CaptClusterInput {
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `spec.existingVpcId`.
    pub existing_vpc_id: Option<String>,
    /// `metadata.creationTimestamp`.
    pub created: Timestamp,
    /// The injected current time.
    pub now: Timestamp,
    /// How long the VPC may take; [`DEFAULT_VPC_READY_TIMEOUT`] unless configured.
    pub vpc_ready_timeout: Duration,
    /// The live `status`, if any.
    pub existing: Option<CAPTClusterStatus>,
    /// The VPC Workspace; `None` when it does not exist yet (or could not be read).
    pub workspace: Option<WorkspaceObservation>,
    /// The VPC Workspace's name when known without reading it (the apply's `workspaceName`).
    pub vpc_workspace_name: Option<String>,
    /// True when no Cluster owns the CAPTCluster yet (no ownerReference, or no such Cluster).
    pub waiting_for_cluster: bool,
    /// The owning Cluster's `spec.controlPlaneEndpoint`, if set.
    pub cluster_endpoint: Option<ApiEndpoint>,
}

/// Drops what of our own status nothing reads back (the controller's cache keeps the rest):
/// `deprecated`, derived from the conditions on every computation, and of
/// `workspaceTemplateStatus` all but the outputs' names ([`keep_output_names`]).
pub fn keep_what_is_read(status: &mut CAPTClusterStatus) {
    status.deprecated = None;
    keep_output_names(&mut status.workspace_template_status);
}

/// The desired CAPTCluster status.
#[derive(Clone, Debug, PartialEq)]
pub struct CaptClusterDesired {
    /// `{"status": {...}}` for `capt-captcluster` on the status subresource.
    pub status_fragment: Value,
    /// The `ready` in the fragment.
    pub ready: bool,
    /// The VPC ID, when known.
    pub vpc_id: Option<String>,
    /// Reconcile again after this long to notice a timeout; `None` when nothing times out.
    pub recheck_after: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq)]
enum Situation {
    Ready {
        reason: &'static str,
        message: String,
    },
    Waiting {
        reason: &'static str,
        message: String,
        timed: bool,
    },
    Failed {
        reason: String,
        message: String,
    },
}

/// Computes the desired status of a CAPTCluster from what was observed.
pub fn desired_capt_cluster(input: &CaptClusterInput) -> CaptClusterDesired {
    let now = conditions::whole_seconds(input.now);
    let start = waiting_since(input, now);
    let vpc_id = input.existing_vpc_id.clone().or_else(|| {
        let ws = input.workspace.as_ref()?;
        ws.output_string("vpc_id").filter(|id| !id.is_empty())
    });
    let (situation, recheck) = match observed_situation(input, vpc_id.as_deref()) {
        Situation::Waiting {
            reason,
            message,
            timed: true,
        } => apply_timeout(input, start, now, reason, message),
        other => (other, None),
    };
    let ready = matches!(situation, Situation::Ready { .. });
    CaptClusterDesired {
        status_fragment: status_fragment(input, &situation, vpc_id.as_deref(), start, now),
        ready,
        vpc_id,
        recheck_after: recheck,
    }
}

fn observed_situation(input: &CaptClusterInput, vpc_id: Option<&str>) -> Situation {
    let waiting = |reason, message: String| Situation::Waiting {
        reason,
        message,
        timed: true,
    };
    if let Some(id) = &input.existing_vpc_id {
        let message = format!("using the existing VPC {id}");
        return Situation::Ready {
            reason: reason::EXISTING_VPC,
            message,
        };
    }
    let state = input.workspace.as_ref().map(|ws| (ws.state(), &ws.name));
    match (state, vpc_id) {
        (Some((WorkspaceState::Failed { message }, name)), _) => Situation::Failed {
            reason: reason::WORKSPACE_FAILED.into(),
            message: format!("Workspace {name}: {message}"),
        },
        (Some((WorkspaceState::NeedsOperator { message }, name)), _) => Situation::Failed {
            reason: reason::WORKSPACE_NEEDS_OPERATOR.into(),
            message: format!("Workspace {name}: {message}"),
        },
        (Some((WorkspaceState::Ready, _)), Some(id)) => Situation::Ready {
            reason: reason::VPC_READY,
            message: format!("VPC {id} is ready"),
        },
        _ if input.waiting_for_cluster => Situation::Waiting {
            reason: reason::WAITING_FOR_CLUSTER,
            message: "waiting for a Cluster to own this CAPTCluster".into(),
            timed: false,
        },
        (Some((WorkspaceState::Ready, name)), None) => waiting(
            reason::WAITING_FOR_VPC_ID,
            format!("Workspace {name} is ready but has no vpc_id output"),
        ),
        (Some((WorkspaceState::Degraded { message }, name)), Some(id)) => Situation::Ready {
            reason: reason::WORKSPACE_DEGRADED,
            message: format!(
                "VPC {id} is ready, but its provider cannot check it: Workspace {name}: {message}"
            ),
        },
        (Some((WorkspaceState::Degraded { message }, name)), None) => Situation::Failed {
            reason: reason::WORKSPACE_FAILED.into(),
            message: format!("Workspace {name}: {message}"),
        },
        // Paused when ready: the VPC is as the provider last saw it.
        (Some((WorkspaceState::Paused { ready: true }, name)), Some(id)) => Situation::Ready {
            reason: reason::WORKSPACE_PAUSED,
            message: format!(
                "VPC {id} is ready, but Workspace {name} is paused (crossplane.io/paused): \
                 changes wait until the annotation is removed"
            ),
        },
        (Some((WorkspaceState::Paused { .. }, name)), _) => Situation::Waiting {
            reason: reason::WORKSPACE_PAUSED,
            message: format!(
                "Workspace {name} is paused (crossplane.io/paused): provider-terraform does not \
                 reconcile it until the annotation is removed"
            ),
            timed: false,
        },
        (Some((WorkspaceState::Deleting, name)), _) => waiting(
            reason::WORKSPACE_DELETING,
            format!("Workspace {name} is being deleted"),
        ),
        (Some((WorkspaceState::Creating, name)), _) => waiting(
            reason::WORKSPACE_CREATING,
            format!("waiting for Workspace {name} to become ready"),
        ),
        (None, _) => waiting(
            reason::WAITING_FOR_WORKSPACE,
            "waiting for the VPC Workspace".into(),
        ),
    }
}

fn apply_timeout(
    input: &CaptClusterInput,
    start: Timestamp,
    now: Timestamp,
    reason: &'static str,
    message: String,
) -> (Situation, Option<Duration>) {
    if let Some(sticky) = sticky_timeout(input) {
        return (sticky, None);
    }
    let deadline = Deadline::new(start, input.vpc_ready_timeout);
    if deadline.expired(now) {
        let within = format_duration(input.vpc_ready_timeout);
        let message = format!("the VPC was not ready within {within}: {message}");
        let reason = reason::VPC_READY_TIMEOUT.into();
        return (Situation::Failed { reason, message }, None);
    }
    let message = format!("{message} ({})", deadline.describe());
    let situation = Situation::Waiting {
        reason,
        message,
        timed: true,
    };
    (situation, recheck_after([deadline.remaining(now)]))
}

/// A timeout failure of the same generation: it stays until the VPC is ready.
fn sticky_timeout(input: &CaptClusterInput) -> Option<Situation> {
    let existing = input.existing.as_ref()?;
    let same_generation = existing.observed_generation == input.generation;
    let list = existing_conditions(input);
    let reasons = [reason::VPC_READY_TIMEOUT];
    let (reason, message) = wait::sticky_failure(list, "VPCFailed", &reasons, same_generation)?;
    Some(Situation::Failed {
        reason: reason.into(),
        message: message.into(),
    })
}

fn waiting_since(input: &CaptClusterInput, now: Timestamp) -> Timestamp {
    let list = existing_conditions(input);
    let markers = WAIT_MARKERS.map(|t| (t, Status::False));
    wait::waiting_since(list, &markers, input.created, now)
}

fn existing_conditions(input: &CaptClusterInput) -> &[Condition] {
    input
        .existing
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
}

/// `{"status": {...}}` with every field this manager knows now.
fn status_fragment(
    input: &CaptClusterInput,
    situation: &Situation,
    vpc_id: Option<&str>,
    start: Timestamp,
    now: Timestamp,
) -> Value {
    let mut status = Map::new();
    // The contract's "provisioning completed": once true it stays true; the conditions say
    // what the VPC is doing now. `ready` is the v1beta1 contract's name for it.
    let existing = input.existing.as_ref();
    let was_provisioned = existing.and_then(|s| s.ready) == Some(true)
        || existing
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.provisioned)
            == Some(true);
    let provisioned = was_provisioned || matches!(situation, Situation::Ready { .. });
    status.insert("ready".into(), json!(provisioned));
    status.insert(
        "initialization".into(),
        json!({ "provisioned": provisioned }),
    );
    if let Some(e) = input
        .cluster_endpoint
        .as_ref()
        .filter(|e| endpoint::is_valid(e))
    {
        status.insert("endpoint".into(), json!(endpoint::display(e)));
    }
    if let Some(id) = vpc_id {
        status.insert("vpcId".into(), json!(id));
    }
    // Terminal failures only, in the Cluster API contract (core turns them into a Cluster
    // that stays Failed): none of ours is, so `VPCFailed` tells a failure and these stay absent.
    status.insert("failureReason".into(), Value::Null);
    status.insert("failureMessage".into(), Value::Null);
    insert_workspace_fields(&mut status, input);
    let builder = ConditionBuilder::new(existing_conditions(input), input.generation, now);
    let mut list = capt_cluster_conditions(&builder, situation, input.waiting_for_cluster, start);
    list.push(paused_condition(&builder, None));
    status.insert("conditions".into(), conditions::to_json(&list));
    if let Some(deprecated) = conditions::deprecated_v1beta1(&list) {
        status.insert("deprecated".into(), deprecated);
    }
    if let Some(generation) = input.generation {
        status.insert("observedGeneration".into(), json!(generation));
    }
    json!({ "status": status })
}

/// `vpcWorkspaceName` and `workspaceTemplateStatus`: `null` with an existing VPC (there is no
/// Workspace), omitted while the Workspace is unknown.
fn insert_workspace_fields(status: &mut Map<String, Value>, input: &CaptClusterInput) {
    if input.existing_vpc_id.is_some() {
        status.insert("vpcWorkspaceName".into(), Value::Null);
        status.insert("workspaceTemplateStatus".into(), Value::Null);
        return;
    }
    let ws = input.workspace.as_ref();
    let name = input
        .vpc_workspace_name
        .clone()
        .or_else(|| ws.map(|w| w.name.clone()).filter(|n| !n.is_empty()));
    if let Some(name) = name {
        status.insert("vpcWorkspaceName".into(), json!(name));
    }
    if let Some(domains) = ws.and_then(failure_domains) {
        status.insert("failureDomains".into(), domains);
    }
    if let Some(ws) = ws {
        let previous = input
            .existing
            .as_ref()
            .and_then(|s| s.workspace_template_status.as_ref())
            .and_then(|t| t.outputs.as_ref());
        status.insert(
            "workspaceTemplateStatus".into(),
            ws.template_status(previous),
        );
    }
}

/// `failureDomains` from the VPC's `azs` output (a list of zone names), when it has one:
/// every zone may hold control plane instances (EKS spreads its own across them). The v1beta2
/// contract's list keyed by `name`, sorted and without duplicates, so the same zones always
/// make the same list.
fn failure_domains(ws: &WorkspaceObservation) -> Option<Value> {
    let zones = ws.output(AZS_OUTPUT)?.as_array()?;
    let names: std::collections::BTreeSet<&str> = zones
        .iter()
        .filter_map(Value::as_str)
        .filter(|z| !z.is_empty())
        .collect();
    let domains: Vec<Value> = names
        .into_iter()
        .map(|z| json!({"name": z, "controlPlane": true}))
        .collect();
    (!domains.is_empty()).then_some(Value::Array(domains))
}

/// Ready, VPCReady, VPCFailed and WaitingForCluster, in that order. `Ready` says what
/// `VPCReady` says (deletion replaces it, see [`super::deletion`]). While waiting, transitions
/// are dated from the wait's start, so the next reconcile finds the same start.
fn capt_cluster_conditions(
    b: &ConditionBuilder<'_>,
    situation: &Situation,
    waiting_for_cluster: bool,
    start: Timestamp,
) -> Vec<Condition> {
    let (vpc_ready, vpc_failed, at) = match situation {
        Situation::Ready { reason, message } => (
            (Status::True, *reason, message.as_str()),
            (Status::False, reason::NO_FAILURE, ""),
            None,
        ),
        Situation::Waiting {
            reason, message, ..
        } => (
            (Status::False, *reason, message.as_str()),
            (Status::False, reason::NO_FAILURE, ""),
            Some(start),
        ),
        Situation::Failed { reason, message } => (
            (Status::False, reason.as_str(), message.as_str()),
            (Status::True, reason.as_str(), message.as_str()),
            None,
        ),
    };
    let cluster = match waiting_for_cluster {
        true => (
            Status::True,
            reason::WAITING_FOR_CLUSTER,
            "no Cluster owns this CAPTCluster yet",
        ),
        false => (Status::False, reason::OWNER_CLUSTER_FOUND, ""),
    };
    let build = |t: &str, (status, reason, message): (Status, &str, &str)| match at {
        Some(at) if status == Status::False => b.build_at(t, status, reason, message, at),
        _ => b.build(t, status, reason, message),
    };
    vec![
        build(READY_CONDITION, vpc_ready),
        build("VPCReady", vpc_ready),
        build("VPCFailed", vpc_failed),
        build("WaitingForCluster", cluster),
    ]
}

#[cfg(test)]
mod tests;
