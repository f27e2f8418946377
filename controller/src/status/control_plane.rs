//! The CAPTControlPlane phase machine and its status fragment (field manager
//! `capt-captcontrolplane`).
//!
//! ```text
//! Creating --(Workspace Ready and endpoint parses)--> Ready
//! Creating --(ReconcileError | InvalidEndpoint | timeout)--> Failed
//! Ready    --(ReconcileError, e.g. a failed update)--> Failed
//! Ready    --(Workspace not Ready, e.g. recreated)--> Creating
//! Ready    --(Workspace paused, Ready kept)--> Ready; paused and not ready: Creating, untimed
//! Failed   --(failure cleared, or a new generation)--> Creating (or Ready at once)
//! ```
//!
//! provider-terraform keeps a Workspace `Ready=True Available` through an update and a failed
//! apply of it (`docs/architecture.md`), so an upgrade stays Ready while Terraform applies it,
//! and a failed one goes Ready → Failed → Ready, never through Creating.
//!
//! `ready` and `initialized` are the Cluster API contract's: once true they stay true (core
//! treats them as "provisioning completed"); `phase` and the conditions say what the control
//! plane is doing now, an upgrade included. `version` is the version last seen Ready with
//! the proof that Terraform applied it: the Workspace rendered from the apply's current
//! generation, and its module's `capt_revision` output equal to the revision rendered
//! ([`WorkspaceObservation::applied`]). Until then an upgrade shows `Ready=True
//! WorkspaceUpdating` (or, never ready before, a wait with that reason).
//!
//! The wait started when the `Creating` condition last turned True (the object's creation
//! time before any status exists). A timeout failure stays until the control plane becomes
//! ready, the spec changes (a new generation), or, for `VPCReadyTimeout`, the VPC is ready.

use super::conditions::{self, ConditionBuilder, Status};
use super::duration::{DurationError, format_duration, parse_duration};
use super::endpoint::{self, EndpointError, parse_endpoint};
use super::pause::{PAUSED_CONDITION, paused_condition};
use super::wait::{self, Deadline, recheck_after};
use super::workspace::{Applied, WorkspaceObservation, WorkspaceState, keep_output_names};
use crate::api::{ApiEndpoint, CAPTControlPlaneStatus, ControlPlanePhase, Timeouts};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::{Map, Value, json};
use std::time::Duration;

/// The v1beta2 contract's summary of a control plane, which core mirrors into the Cluster's
/// `ControlPlaneAvailable`: whether the control plane serves now, through its whole life
/// (deletion included).
pub const AVAILABLE_CONDITION: &str = "Available";

/// Condition types this manager sets on a CAPTControlPlane, in the order it lists them.
pub const CONTROL_PLANE_CONDITION_TYPES: [&str; 6] = [
    AVAILABLE_CONDITION,
    "Ready",
    "Initialized",
    "Failed",
    "Creating",
    PAUSED_CONDITION,
];

/// Reasons used in the conditions (those of the Workspace's state, of waiting and of
/// failures are shared with the CAPTCluster).
pub mod reason {
    pub use crate::status::conditions::reason::{
        CONTROL_PLANE_TIMEOUT, INVALID_ENDPOINT, INVALID_TIMEOUT, VPC_READY_TIMEOUT,
        WAITING_FOR_CLUSTER, WAITING_FOR_WORKSPACE, WORKSPACE_CREATING, WORKSPACE_DEGRADED,
        WORKSPACE_DELETING, WORKSPACE_FAILED, WORKSPACE_NEEDS_OPERATOR, WORKSPACE_PAUSED,
        WORKSPACE_UPDATING,
    };
    /// The VPC is not ready yet.
    pub const WAITING_FOR_VPC: &str = "WaitingForVPC";
    /// The Workspace is ready and no endpoint is known yet.
    pub const WAITING_FOR_ENDPOINT: &str = "WaitingForEndpoint";
    /// The control plane is ready.
    pub const CONTROL_PLANE_READY: &str = "ControlPlaneReady";
}

/// Everything the control-plane status depends on.
#[derive(Clone, Debug)]
pub struct ControlPlaneInput {
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `spec.version`.
    pub version: String,
    /// `spec.controlPlaneConfig.timeouts`; defaults (30m, 15m) when `None`.
    pub timeouts: Option<Timeouts>,
    /// `metadata.creationTimestamp`.
    pub created: Timestamp,
    /// The injected current time.
    pub now: Timestamp,
    /// The live `status`, if any: transition times, `initialized`, the previous phase.
    pub existing: Option<CAPTControlPlaneStatus>,
    /// True when a Cluster owns the control plane.
    pub cluster_found: bool,
    /// Whether the VPC is ready; `None` when unknown.
    pub vpc_ready: Option<bool>,
    /// The Workspace; `None` when it does not exist yet or could not be read: the fragment
    /// then omits `workspaceStatus` and `workspaceTemplateStatus`, and the phase is Creating
    /// (unless a timeout ran out).
    pub workspace: Option<WorkspaceObservation>,
    /// The `cluster_endpoint` output, else the connection Secret's endpoint value.
    pub endpoint_source: Option<String>,
    /// `metadata.generation` of the WorkspaceTemplateApply as this reconcile left it: the
    /// Workspace proves an update applied only when rendered from it
    /// ([`WorkspaceObservation::applied`]).
    pub apply_generation: Option<i64>,
}

/// Drops what of our own status nothing reads back (the controller's cache keeps the rest):
/// `deprecated`, derived from the conditions on every computation; `workspaceStatus`, the
/// Workspace's status copied from the cached Workspace every time; and of
/// `workspaceTemplateStatus` all but the outputs' names ([`keep_output_names`]).
pub fn keep_what_is_read(status: &mut CAPTControlPlaneStatus) {
    status.deprecated = None;
    status.workspace_status = None;
    keep_output_names(&mut status.workspace_template_status);
}

/// The desired control-plane status and endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct ControlPlaneDesired {
    /// `{"status": {...}}` for `capt-captcontrolplane` on the status subresource.
    pub status_fragment: Value,
    /// The endpoint for `spec.controlPlaneEndpoint`, whenever the source parses; `None`
    /// means unknown: publish nothing (do not release).
    pub endpoint: Option<ApiEndpoint>,
    /// The phase in the fragment.
    pub phase: ControlPlanePhase,
    /// Reconcile again after this long to notice a timeout; `None` when nothing times out.
    pub recheck_after: Option<Duration>,
}

/// The state the control plane is in, with why.
#[derive(Clone, Debug, PartialEq)]
enum Situation {
    Ready(ApiEndpoint),
    /// Ready, but the provider does not look at the Workspace (`observe failed`, or paused):
    /// shown, and the spec's version not taken as applied.
    Degraded {
        endpoint: ApiEndpoint,
        reason: &'static str,
        message: String,
    },
    Waiting {
        reason: &'static str,
        message: String,
    },
    Failed {
        reason: String,
        message: String,
    },
}

/// Computes the desired status of a CAPTControlPlane from what was observed.
pub fn desired_control_plane(input: &ControlPlaneInput) -> ControlPlaneDesired {
    let now = conditions::whole_seconds(input.now);
    let parsed = input.endpoint_source.as_deref().map(parse_endpoint);
    let (situation, recheck) = match observed_situation(input, parsed.as_ref()) {
        Situation::Waiting { reason, message } => apply_timeouts(input, now, reason, message),
        other => (other, None),
    };
    let phase = match situation {
        Situation::Ready(_) | Situation::Degraded { .. } => ControlPlanePhase::Ready,
        Situation::Waiting { .. } => ControlPlanePhase::Creating,
        Situation::Failed { .. } => ControlPlanePhase::Failed,
    };
    ControlPlaneDesired {
        status_fragment: status_fragment(input, now, &situation, phase),
        endpoint: parsed.and_then(Result::ok),
        phase,
        recheck_after: recheck,
    }
}

/// The situation from the Workspace, the VPC and the endpoint alone, before timeouts.
fn observed_situation(
    input: &ControlPlaneInput,
    endpoint: Option<&Result<ApiEndpoint, EndpointError>>,
) -> Situation {
    if !input.cluster_found {
        return waiting(
            reason::WAITING_FOR_CLUSTER,
            "no Cluster owns this control plane yet".into(),
        );
    }
    let Some(ws) = &input.workspace else {
        return match input.vpc_ready {
            Some(false) => waiting(reason::WAITING_FOR_VPC, "waiting for the VPC".into()),
            _ => waiting(
                reason::WAITING_FOR_WORKSPACE,
                "waiting for the Workspace".into(),
            ),
        };
    };
    workspace_situation(input, ws, endpoint)
}

/// Waiting for `reason`, saying why.
fn waiting(reason: &'static str, message: String) -> Situation {
    Situation::Waiting { reason, message }
}

/// The situation once the control plane's Workspace exists: its state, and the endpoint
/// when it is ready.
fn workspace_situation(
    input: &ControlPlaneInput,
    ws: &WorkspaceObservation,
    endpoint: Option<&Result<ApiEndpoint, EndpointError>>,
) -> Situation {
    match (ws.state(), endpoint) {
        (WorkspaceState::Failed { message }, _) => Situation::Failed {
            reason: reason::WORKSPACE_FAILED.into(),
            message: format!("Workspace {}: {message}", ws.name),
        },
        (WorkspaceState::NeedsOperator { message }, _) => Situation::Failed {
            reason: reason::WORKSPACE_NEEDS_OPERATOR.into(),
            message: format!("Workspace {}: {message}", ws.name),
        },
        (WorkspaceState::Ready, endpoint) => ready_situation(input, ws, endpoint),
        (WorkspaceState::Degraded { message }, Some(Ok(e))) => Situation::Degraded {
            endpoint: e.clone(),
            reason: reason::WORKSPACE_DEGRADED,
            message: format!(
                "its provider cannot check it: Workspace {}: {message}",
                ws.name
            ),
        },
        (WorkspaceState::Degraded { message }, _) => Situation::Failed {
            reason: reason::WORKSPACE_FAILED.into(),
            message: format!("Workspace {}: {message}", ws.name),
        },
        (WorkspaceState::Deleting, _) => waiting(
            reason::WORKSPACE_DELETING,
            format!("Workspace {} is being deleted", ws.name),
        ),
        // Paused when ready: the infrastructure is as the provider last saw it.
        (WorkspaceState::Paused { ready: true }, Some(Ok(e))) => Situation::Degraded {
            endpoint: e.clone(),
            reason: reason::WORKSPACE_PAUSED,
            message: format!(
                "Workspace {} is paused (crossplane.io/paused): changes wait until the \
                 annotation is removed",
                ws.name
            ),
        },
        (WorkspaceState::Paused { .. }, _) => waiting(
            reason::WORKSPACE_PAUSED,
            format!(
                "Workspace {} is paused (crossplane.io/paused): provider-terraform does not \
                 reconcile it until the annotation is removed",
                ws.name
            ),
        ),
        (WorkspaceState::Creating, _) if input.vpc_ready == Some(false) => waiting(
            reason::WAITING_FOR_VPC,
            format!("waiting for the VPC before Workspace {}", ws.name),
        ),
        (WorkspaceState::Creating, _) => waiting(
            reason::WORKSPACE_CREATING,
            format!("waiting for Workspace {} to become ready", ws.name),
        ),
    }
}

/// The situation of a ready Workspace: its endpoint, and whether it has applied the spec.
fn ready_situation(
    input: &ControlPlaneInput,
    ws: &WorkspaceObservation,
    endpoint: Option<&Result<ApiEndpoint, EndpointError>>,
) -> Situation {
    match endpoint {
        Some(Ok(e)) => match ws.applied(input.apply_generation) {
            Applied::Proven | Applied::Unproven => Situation::Ready(e.clone()),
            // An update Terraform has not applied yet: the control plane serves as before,
            // and its version stays the one last proven.
            Applied::Pending { message } if was_ready(input) => Situation::Degraded {
                endpoint: e.clone(),
                reason: reason::WORKSPACE_UPDATING,
                message,
            },
            Applied::Pending { message } => waiting(reason::WORKSPACE_UPDATING, message),
        },
        Some(Err(e)) => Situation::Failed {
            reason: reason::INVALID_ENDPOINT.into(),
            message: format!("Workspace {}: cluster_endpoint: {e}", ws.name),
        },
        None => waiting(
            reason::WAITING_FOR_ENDPOINT,
            format!("Workspace {} is ready but has no cluster_endpoint", ws.name),
        ),
    }
}

/// True when the control plane has been ready (the contract's sticky `initialized`).
fn was_ready(input: &ControlPlaneInput) -> bool {
    input
        .existing
        .as_ref()
        .is_some_and(|s| s.initialized == Some(true) || s.ready == Some(true))
}

/// Turns a wait into a failure once it has lasted too long; otherwise says when to look again.
fn apply_timeouts(
    input: &ControlPlaneInput,
    now: Timestamp,
    reason: &'static str,
    message: String,
) -> (Situation, Option<Duration>) {
    if let Some(sticky) = sticky_timeout(input) {
        return (sticky, None);
    }
    // Waiting for an owner is not provisioning: it never times out, and nothing rechecks it
    // (the Cluster's arrival wakes the reconcile). Nor does a paused Workspace: it waits for
    // a person, and its unpausing wakes the reconcile.
    if reason == reason::WAITING_FOR_CLUSTER || reason == reason::WORKSPACE_PAUSED {
        return (Situation::Waiting { reason, message }, None);
    }
    let (cp_timeout, vpc_timeout) = match parse_timeouts(input.timeouts.as_ref()) {
        Ok(t) => t,
        Err(e) => return (failed(reason::INVALID_TIMEOUT, e.to_string()), None),
    };
    let start = waiting_since(input, now);
    let control_plane = Deadline::new(start, cp_timeout);
    let vpc = Deadline::new(start, vpc_timeout);
    let vpc_waiting = input.vpc_ready == Some(false);
    if vpc_waiting && vpc.expired(now) {
        let msg = format!(
            "the VPC was not ready within {}",
            format_duration(vpc_timeout)
        );
        return (failed(reason::VPC_READY_TIMEOUT, msg), None);
    }
    if control_plane.expired(now) {
        let within = format_duration(cp_timeout);
        let msg = format!("the control plane was not ready within {within}: {message}");
        return (failed(reason::CONTROL_PLANE_TIMEOUT, msg), None);
    }
    let nearest = if vpc_waiting && vpc.at() < control_plane.at() {
        vpc
    } else {
        control_plane
    };
    let message = format!("{message} ({})", nearest.describe());
    let remaining = [control_plane.remaining(now)]
        .into_iter()
        .chain(vpc_waiting.then(|| vpc.remaining(now)));
    (
        Situation::Waiting { reason, message },
        recheck_after(remaining),
    )
}

/// `(controlPlaneTimeout, vpcReadyTimeout)`, defaults when the spec has none.
fn parse_timeouts(timeouts: Option<&Timeouts>) -> Result<(Duration, Duration), DurationError> {
    let defaults = Timeouts::default();
    let t = timeouts.unwrap_or(&defaults);
    let control_plane = parse_duration(&t.control_plane_timeout)?;
    Ok((control_plane, parse_duration(&t.vpc_ready_timeout)?))
}

fn failed(reason: &str, message: String) -> Situation {
    Situation::Failed {
        reason: reason.into(),
        message,
    }
}

/// A timeout failure of the same generation that nothing has cleared yet.
fn sticky_timeout(input: &ControlPlaneInput) -> Option<Situation> {
    let existing = input.existing.as_ref()?;
    // The VPC's timeout stays only while the VPC is still not ready.
    let reasons: &[&str] = match input.vpc_ready {
        Some(true) => &[reason::CONTROL_PLANE_TIMEOUT],
        _ => &[reason::CONTROL_PLANE_TIMEOUT, reason::VPC_READY_TIMEOUT],
    };
    let same_generation = existing.observed_generation == input.generation;
    let (reason, message) = wait::sticky_failure(
        existing_conditions(Some(existing)),
        "Failed",
        reasons,
        same_generation,
    )?;
    (existing.phase == Some(ControlPlanePhase::Failed)).then(|| failed(reason, message.into()))
}

/// When the current wait started: the `Creating` condition's transition to True; `now` when
/// the control plane is leaving Ready or Failed; the creation time before any status.
fn waiting_since(input: &ControlPlaneInput, now: Timestamp) -> Timestamp {
    let existing = input.existing.as_ref();
    let fallback = match existing.and_then(|s| s.phase) {
        None | Some(ControlPlanePhase::Creating) => input.created,
        Some(_) => now,
    };
    let list = existing_conditions(existing);
    wait::waiting_since(list, &[("Creating", Status::True)], fallback, now)
}

fn existing_conditions(existing: Option<&CAPTControlPlaneStatus>) -> &[Condition] {
    existing
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
}

/// `{"status": {...}}` with every field this manager knows now.
fn status_fragment(
    input: &ControlPlaneInput,
    now: Timestamp,
    situation: &Situation,
    phase: ControlPlanePhase,
) -> Value {
    let existing = input.existing.as_ref();
    let ready_now = phase == ControlPlanePhase::Ready;
    let was = |f: fn(&CAPTControlPlaneStatus) -> Option<bool>| existing.and_then(f) == Some(true);
    let initialized = ready_now
        || was(|s| s.initialized)
        || was(|s| s.ready)
        || existing
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.control_plane_initialized)
            == Some(true);
    let mut status = Map::new();
    // `ready` and `initialized` are the v1beta1 contract's names of `initialization`.
    status.insert("ready".into(), json!(initialized));
    status.insert("initialized".into(), json!(initialized));
    status.insert(
        "initialization".into(),
        json!({ "controlPlaneInitialized": initialized }),
    );
    status.insert("externalManagedControlPlane".into(), json!(true));
    status.insert("phase".into(), json!(phase));
    // Omitted while not Ready, so the version last seen Ready stays (an upgrade in progress);
    // while degraded: the provider did not look, let alone apply; and until the Workspace
    // proves the rendering of this spec applied (`Situation::Ready` needs the proof).
    if let Situation::Ready(_) = situation {
        status.insert("version".into(), json!(input.version));
        status.insert("versions".into(), json!([{"version": input.version}]));
    }
    if let Situation::Ready(e) | Situation::Degraded { endpoint: e, .. } = situation {
        status.insert("endpoint".into(), json!(endpoint::display(e)));
    }
    // In the Cluster API contract `failureReason`/`failureMessage` mean a *terminal* failure:
    // core copies them to the Cluster, which stays Failed until it is deleted. Nothing here is
    // terminal (a fixed Terraform error or spec recovers), so failures are told by `phase` and
    // the `Failed` condition only, and the fields are kept absent.
    status.insert("failureReason".into(), Value::Null);
    status.insert("failureMessage".into(), Value::Null);
    if let Some(ws) = &input.workspace {
        let previous = existing
            .and_then(|s| s.workspace_template_status.as_ref())
            .and_then(|t| t.outputs.as_ref());
        status.insert(
            "workspaceTemplateStatus".into(),
            ws.template_status(previous),
        );
        status.insert("workspaceStatus".into(), ws.workspace_status());
    }
    let builder = ConditionBuilder::new(existing_conditions(existing), input.generation, now);
    let since = waiting_since(input, now);
    let mut list = control_plane_conditions(&builder, situation, initialized, since);
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

/// Available, Ready, Initialized, Failed and Creating, in that order. `Available` says what
/// `Ready` says (deletion replaces both, see [`super::deletion`]); a wait's `Creating`
/// condition is dated from `waiting_since`, so the next reconcile finds the same start.
fn control_plane_conditions(
    b: &ConditionBuilder<'_>,
    situation: &Situation,
    initialized: bool,
    waiting_since: Timestamp,
) -> Vec<Condition> {
    let (ready, creating, failed) = match situation {
        Situation::Ready(e) => {
            let msg = format!("the control plane is ready at {}", endpoint::display(e));
            let ok = reason::CONTROL_PLANE_READY;
            (
                b.build("Ready", Status::True, ok, &msg),
                b.build("Creating", Status::False, ok, ""),
                b.build("Failed", Status::False, "NoFailure", ""),
            )
        }
        Situation::Degraded {
            endpoint: e,
            reason,
            message,
        } => {
            let msg = format!(
                "the control plane is ready at {}, but {message}",
                endpoint::display(e)
            );
            (
                b.build("Ready", Status::True, reason, &msg),
                b.build("Creating", Status::False, reason, ""),
                b.build("Failed", Status::False, "NoFailure", ""),
            )
        }
        Situation::Waiting { reason, message } => (
            b.build("Ready", Status::False, reason, message),
            b.build_at("Creating", Status::True, reason, message, waiting_since),
            b.build("Failed", Status::False, "NoFailure", ""),
        ),
        Situation::Failed { reason, message } => (
            b.build("Ready", Status::False, reason, message),
            b.build("Creating", Status::False, reason, message),
            b.build("Failed", Status::True, reason, message),
        ),
    };
    let init = match initialized {
        true => b.build(
            "Initialized",
            Status::True,
            "Initialized",
            "the control plane has been ready",
        ),
        false => b.build(
            "Initialized",
            Status::False,
            "NotInitialized",
            "the control plane has not been ready yet",
        ),
    };
    let available = b.build(
        AVAILABLE_CONDITION,
        Status::of(&ready),
        &ready.reason,
        &ready.message,
    );
    vec![available, ready, init, failed, creating]
}

#[cfg(test)]
mod tests;
