//! What the controller observes of a provider-terraform `Workspace` (`tf.upbound.io/v1beta1`),
//! and the status fragments that mirror it (`workspaceTemplateStatus`, `workspaceStatus`).
//!
//! A Workspace carries Crossplane conditions `Synced` (ReconcileSuccess | ReconcileError) and
//! `Ready` (Available | Creating | Deleting; `Unavailable` exists in crossplane-runtime, is
//! never set by provider-terraform, and is read like any other not-ready reason), and
//! `status.atProvider{checksum, outputs}`, which the provider replaces whole on each
//! observation. A Workspace annotated `crossplane.io/paused` gets `Synced=False
//! ReconcilePaused` and keeps the `Ready` it had (crossplane-runtime's managed reconciler):
//! [`WorkspaceState::Paused`], neither a failure nor "still creating". A failed apply of an existing Workspace keeps `Ready=True Available` and
//! reports `Synced=False ReconcileError`: that is [`WorkspaceState::Failed`] too. Sensitive outputs are not
//! in `atProvider` (only in the connection Secret), so nothing here sees secret data.

use crate::api::WorkspaceTemplateStatus;
use crate::render::{APPLY_GENERATION_ANNOTATION, REVISION_ANNOTATION, REVISION_OUTPUT};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// The start of crossplane-runtime's `errCreateIncomplete` (managed reconciler, v1.16.0).
const CREATE_INCOMPLETE: &str = "cannot determine creation result";
/// crossplane-runtime's `meta.AnnotationKeyExternalCreatePending`.
pub const CREATE_PENDING_ANNOTATION: &str = "crossplane.io/external-create-pending";

/// An annotation whose change wakes provider-terraform (any not in crossplane-runtime's
/// `DesiredStateChanged` ignore list would do): the retry an operator makes after a crash.
pub const RETRY_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/operator-retry";

/// One of a Workspace's Crossplane conditions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkspaceCondition {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// CamelCase reason, e.g. `ReconcileError` or `Available`.
    pub reason: String,
    /// The provider's message; empty when it gave none.
    pub message: String,
}

/// What the controller observed of one Workspace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkspaceObservation {
    /// `metadata.name`.
    pub name: String,
    /// The `Synced` condition, if present.
    pub synced: Option<WorkspaceCondition>,
    /// The `Ready` condition, if present.
    pub ready: Option<WorkspaceCondition>,
    /// `status.atProvider`, verbatim; `None` before the provider first observed it.
    pub at_provider: Option<Value>,
    /// True when `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// The revision CAPT rendered into it (`render::REVISION_ANNOTATION`); `None` for a
    /// module CAPT cannot add its revision output to.
    pub rendered_revision: Option<String>,
    /// The generation of the apply it was rendered from
    /// (`render::APPLY_GENERATION_ANNOTATION`).
    pub rendered_generation: Option<i64>,
}

/// Whether a Workspace proves that the configuration last rendered into it was applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Its module's `capt_revision` output is the revision rendered from the apply's
    /// current generation: Terraform applied exactly that.
    Proven,
    /// Not yet (or not the apply's current generation): an update in progress.
    Pending {
        /// What is missing, for a person.
        message: String,
    },
    /// The module carries no revision output (remote, or inline JSON): `Ready` is all there
    /// is to go by.
    Unproven,
}

/// What a Workspace's state means for the object waiting on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkspaceState {
    /// Not ready yet, and no failure reported: keep waiting.
    Creating,
    /// `Synced=True` and `Ready=True`.
    Ready,
    /// `Synced=False` with `ReconcileError`: a failure, not "still creating".
    Failed {
        /// The provider's message (or a generic one when it gave none).
        message: String,
    },
    /// The Workspace is being deleted.
    Deleting,
    /// crossplane-runtime found `crossplane.io/external-create-pending` later than any
    /// create result (the provider stopped mid-apply, e.g. a crash or restart): `Synced=False
    /// ReconcileError "cannot determine creation result …"`, `Ready=False Creating`, and it is
    /// never retried until a person removes the annotation.
    NeedsOperator {
        /// What to do, with the provider's message.
        message: String,
    },
    /// `Synced=False ReconcileError` from Observe or Connect (`observe failed: …`, e.g. a plan
    /// of a broken module; `connect failed: …`) while `Ready=True` stays: the provider cannot
    /// look at the infrastructure, which is as it last saw it. Not a failed apply.
    Degraded {
        /// The provider's message.
        message: String,
    },
    /// `Synced=False` with `ReconcilePaused`: the provider leaves it alone until the pause
    /// annotation goes; what it reported last stands.
    Paused {
        /// The `Ready` condition it kept is True.
        ready: bool,
    },
}

impl WorkspaceObservation {
    /// Decodes a Workspace object as JSON. Decoding is lenient: a missing or malformed field
    /// reads as absent (a Workspace without status is simply `Creating`).
    pub fn from_json(workspace: &Value) -> Self {
        let metadata = &workspace["metadata"];
        let status = &workspace["status"];
        let conditions = status["conditions"].as_array().map(Vec::as_slice);
        let at_provider = &status["atProvider"];
        Self {
            name: metadata["name"].as_str().unwrap_or_default().into(),
            synced: conditions.and_then(|c| condition(c, "Synced")),
            ready: conditions.and_then(|c| condition(c, "Ready")),
            at_provider: at_provider.is_object().then(|| at_provider.clone()),
            deleting: !metadata["deletionTimestamp"].is_null(),
            rendered_revision: metadata["annotations"][REVISION_ANNOTATION]
                .as_str()
                .map(str::to_owned),
            rendered_generation: metadata["annotations"][APPLY_GENERATION_ANNOTATION]
                .as_str()
                .and_then(|g| g.parse().ok()),
        }
    }

    /// Whether this Workspace proves that the apply at `apply_generation` (its owner's
    /// current apply; `None` when unknown) was applied: rendered from that generation, and
    /// its `capt_revision` output equal to the revision rendered. provider-terraform keeps
    /// `Ready=True` through an update and writes no observedGeneration, so `Ready` alone
    /// cannot tell an applied update from one not yet started.
    pub fn applied(&self, apply_generation: Option<i64>) -> Applied {
        if let Some(wanted) = apply_generation
            && self.rendered_generation != Some(wanted)
        {
            let rendered = self
                .rendered_generation
                .map_or("an older generation".to_owned(), |g| {
                    format!("generation {g}")
                });
            return Applied::Pending {
                message: format!(
                    "Workspace {} still renders {rendered} of its WorkspaceTemplateApply, not \
                     generation {wanted}",
                    self.name
                ),
            };
        }
        let Some(rendered) = &self.rendered_revision else {
            return Applied::Unproven;
        };
        match self.output_string(REVISION_OUTPUT) {
            Some(applied) if &applied == rendered => Applied::Proven,
            applied => Applied::Pending {
                message: format!(
                    "Workspace {} has not applied revision {rendered} yet (its {REVISION_OUTPUT} \
                     output is {})",
                    self.name,
                    applied.as_deref().unwrap_or("absent")
                ),
            },
        }
    }

    /// Classifies the Workspace: deletion first, then a reconcile error, then readiness.
    pub fn state(&self) -> WorkspaceState {
        if self.deleting {
            return WorkspaceState::Deleting;
        }
        if let Some(synced) = &self.synced
            && synced.status == "False"
            && synced.reason == "ReconcilePaused"
        {
            return WorkspaceState::Paused {
                ready: is_true(&self.ready),
            };
        }
        if let Some(synced) = &self.synced
            && synced.status == "False"
            && synced.reason == "ReconcileError"
        {
            let message = match synced.message.as_str() {
                "" => "the Workspace reported ReconcileError without a message".to_string(),
                m => m.to_string(),
            };
            if message.starts_with(CREATE_INCOMPLETE) {
                return WorkspaceState::NeedsOperator {
                    message: format!(
                        "provider-terraform cannot tell whether its first apply finished (it \
                         stopped mid-apply) and will not retry until a person decides: check \
                         the Terraform state in the backend for what that apply created, then \
                         remove the annotation {CREATE_PENDING_ANNOTATION} together with a \
                         change the provider wakes on (the removal alone does not wake it): \
                         kubectl annotate workspace {} {CREATE_PENDING_ANNOTATION}- \
                         {RETRY_ANNOTATION}=\"$(date +%s)\" --overwrite. The provider says: \
                         {message}",
                        self.name
                    ),
                };
            }
            // crossplane-runtime's prefixes of errors before any apply (errReconcileObserve,
            // errReconcileConnect): nothing was changed, what was Ready stays so.
            let unobserved = ["observe failed", "connect failed"]
                .iter()
                .any(|p| message.starts_with(p));
            if unobserved && is_true(&self.ready) {
                return WorkspaceState::Degraded { message };
            }
            return WorkspaceState::Failed { message };
        }
        if is_true(&self.synced) && is_true(&self.ready) {
            WorkspaceState::Ready
        } else {
            WorkspaceState::Creating
        }
    }

    /// True when the Workspace is [`WorkspaceState::Ready`].
    pub fn is_ready(&self) -> bool {
        self.state() == WorkspaceState::Ready
    }

    /// The `Ready` condition's reason (Available, Unavailable, Creating, Deleting), if any.
    pub fn ready_reason(&self) -> Option<&str> {
        self.ready.as_ref().map(|c| c.reason.as_str())
    }

    /// `status.atProvider.checksum`, if present.
    pub fn checksum(&self) -> Option<&str> {
        self.at_provider.as_ref()?.get("checksum")?.as_str()
    }

    /// The output `name` as a string: a string output as-is, any other JSON rendered compactly.
    /// `None` when there is no such output (or it is `null`).
    pub fn output_string(&self, name: &str) -> Option<String> {
        self.raw_outputs()?.get(name).and_then(render_output)
    }

    /// The output `name` as the provider reported it (any JSON).
    pub fn output(&self, name: &str) -> Option<&Value> {
        self.raw_outputs()?.get(name)
    }

    /// Every output rendered as by [`Self::output_string`], sorted by name.
    pub fn outputs(&self) -> BTreeMap<String, String> {
        let Some(outputs) = self.raw_outputs() else {
            return BTreeMap::new();
        };
        outputs
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), render_output(v)?)))
            .collect()
    }

    /// The `workspaceTemplateStatus` fragment: `ready`, `state` (the Ready reason, `null` when
    /// the Workspace has no Ready condition), `lastAppliedRevision` (the checksum, when ready),
    /// `lastFailedRevision` and `lastFailureMessage` (when failed), and `outputs` as strings.
    ///
    /// The `last*` fields are history: omitted (kept as they were) when they do not change now.
    /// `outputs` is omitted before the provider first reports `atProvider`; otherwise each key
    /// of `previous_outputs` (the live status's) that is gone is set to `null`, because a merge
    /// patch would otherwise keep it.
    pub fn template_status(&self, previous_outputs: Option<&BTreeMap<String, String>>) -> Value {
        let state = self.state();
        let mut out = Map::new();
        out.insert("ready".into(), json!(state == WorkspaceState::Ready));
        out.insert("state".into(), json!(self.ready_reason()));
        match (&state, self.checksum()) {
            (WorkspaceState::Ready, Some(sum)) => {
                out.insert("lastAppliedRevision".into(), json!(sum));
            }
            (
                WorkspaceState::Failed { message }
                | WorkspaceState::Degraded { message }
                | WorkspaceState::NeedsOperator { message },
                sum,
            ) => {
                if let Some(sum) = sum {
                    out.insert("lastFailedRevision".into(), json!(sum));
                }
                out.insert("lastFailureMessage".into(), json!(message));
            }
            _ => {}
        }
        if self.at_provider.is_some() {
            out.insert("outputs".into(), self.outputs_patch(previous_outputs));
        }
        Value::Object(out)
    }

    /// The `workspaceStatus` fragment: `ready`, `state` and `atProvider` copied verbatim
    /// (omitted, never `null`, before the provider first reports it).
    pub fn workspace_status(&self) -> Value {
        let mut out = Map::new();
        out.insert("ready".into(), json!(self.is_ready()));
        out.insert("state".into(), json!(self.ready_reason()));
        if let Some(at_provider) = &self.at_provider {
            out.insert("atProvider".into(), at_provider.clone());
        }
        Value::Object(out)
    }

    fn raw_outputs(&self) -> Option<&Map<String, Value>> {
        self.at_provider.as_ref()?.get("outputs")?.as_object()
    }

    fn outputs_patch(&self, previous: Option<&BTreeMap<String, String>>) -> Value {
        let current = self.outputs();
        let mut patch: Map<String, Value> = previous
            .into_iter()
            .flat_map(|p| p.keys())
            .filter(|k| !current.contains_key(*k))
            .map(|k| (k.clone(), Value::Null))
            .collect();
        patch.extend(current.into_iter().map(|(k, v)| (k, Value::String(v))));
        Value::Object(patch)
    }
}

fn condition(conditions: &[Value], type_: &str) -> Option<WorkspaceCondition> {
    let c = conditions.iter().find(|c| c["type"] == type_)?;
    let text = |field: &str| c[field].as_str().unwrap_or_default().to_string();
    Some(WorkspaceCondition {
        status: text("status"),
        reason: text("reason"),
        message: without_error_blob(&text("message")),
    })
}

/// What provider-terraform (v0.18.0) writes before the whole Terraform error, gzipped and
/// base64-encoded, in a condition's message.
const ERROR_BLOB_START: &str = "To see the full error run: echo \"";

/// `message` without provider-terraform's encoded full error: that blob holds Terraform's
/// whole output, variable values included (seen on the real provider: a `local-exec` error
/// carries its command with the value of a variable read from a Secret, `sensitive = true`
/// or not). It stays on the Workspace, for whoever may read that; nothing CAPT writes (a
/// condition, an Event, a mirrored condition) copies it.
pub fn without_error_blob(message: &str) -> String {
    match message.split_once(ERROR_BLOB_START) {
        None => message.to_owned(),
        Some((before, _)) => format!(
            "{before}(the full Terraform error, which may hold variable values, is left out: \
             see the Workspace's Synced condition)"
        ),
    }
}

fn is_true(condition: &Option<WorkspaceCondition>) -> bool {
    condition.as_ref().is_some_and(|c| c.status == "True")
}

fn render_output(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Test builders shared by the status modules' tests.
/// What a cached status of ours keeps of its `workspaceTemplateStatus`: the names of its
/// outputs, all that [`WorkspaceObservation::template_status`] reads back (to null the ones
/// gone). Their values (a certificate authority among them) and the other fields are the
/// Workspace's, read from the cached Workspace on every computation.
pub fn keep_output_names(status: &mut Option<WorkspaceTemplateStatus>) {
    let outputs = status.take().and_then(|s| s.outputs);
    *status = outputs.map(|outputs| WorkspaceTemplateStatus {
        outputs: Some(outputs.into_keys().map(|k| (k, String::new())).collect()),
        ..WorkspaceTemplateStatus::default()
    });
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A Workspace object as the provider writes it. `synced`/`ready` are
    /// `(status, reason, message)`; `outputs` is `status.atProvider.outputs` (no atProvider when
    /// `None`).
    pub fn mk_workspace_json(
        synced: Option<(&str, &str, &str)>,
        ready: Option<(&str, &str, &str)>,
        outputs: Option<Value>,
    ) -> Value {
        let cond = |t: &str, (s, r, m): (&str, &str, &str)| {
            json!({"type": t, "status": s, "reason": r, "message": m,
                   "lastTransitionTime": "2024-01-01T00:00:00Z"})
        };
        let mut conditions = vec![];
        conditions.extend(synced.map(|c| cond("Synced", c)));
        conditions.extend(ready.map(|c| cond("Ready", c)));
        let mut status = json!({ "conditions": conditions });
        if let Some(outputs) = outputs {
            status["atProvider"] = json!({"checksum": "sum-1", "outputs": outputs});
        }
        json!({"apiVersion": "tf.upbound.io/v1beta1", "kind": "Workspace",
               "metadata": {"name": "ws-1"}, "status": status})
    }

    /// `workspace` as CAPT rendered it from generation `generation` of its apply, with the
    /// revision `rendered` (annotations).
    pub fn rendered(
        mut workspace: WorkspaceObservation,
        generation: i64,
        rendered: &str,
    ) -> WorkspaceObservation {
        workspace.rendered_generation = Some(generation);
        workspace.rendered_revision = Some(rendered.to_owned());
        workspace
    }

    /// A decoded Workspace: see [`mk_workspace_json`].
    pub fn mk_workspace(
        synced: Option<(&str, &str, &str)>,
        ready: Option<(&str, &str, &str)>,
        outputs: Option<Value>,
    ) -> WorkspaceObservation {
        WorkspaceObservation::from_json(&mk_workspace_json(synced, ready, outputs))
    }

    /// Synced=True and Ready=True (Available), with these outputs.
    pub fn ready_workspace(outputs: Value) -> WorkspaceObservation {
        mk_workspace(SYNCED_OK, Some(("True", "Available", "")), Some(outputs))
    }

    /// Synced=True, Ready=False (Creating), no atProvider yet.
    pub fn creating_workspace() -> WorkspaceObservation {
        mk_workspace(SYNCED_OK, Some(("False", "Creating", "")), None)
    }

    /// A failed first apply, as provider-terraform reports it (crossplane-runtime's Create
    /// path): Synced=False with ReconcileError and this message, Ready=False Creating, an
    /// empty atProvider.
    pub fn failed_workspace(message: &str) -> WorkspaceObservation {
        mk_workspace(
            Some(("False", "ReconcileError", message)),
            Some(("False", "Creating", "")),
            Some(json!({})),
        )
    }

    /// A failed apply of a Workspace that exists (crossplane-runtime's Update path): Synced=False
    /// with ReconcileError and this message, Ready=True Available kept, atProvider (these
    /// outputs) kept.
    pub fn failed_update_workspace(message: &str, outputs: Value) -> WorkspaceObservation {
        mk_workspace(
            Some(("False", "ReconcileError", message)),
            Some(("True", "Available", "")),
            Some(outputs),
        )
    }

    /// A Workspace annotated `crossplane.io/paused`: Synced=False ReconcilePaused, the Ready
    /// it had kept (`Available` when `ready`, else `Creating`), atProvider (these outputs) kept.
    pub fn paused_workspace(ready: bool, outputs: Value) -> WorkspaceObservation {
        let kept = match ready {
            true => ("True", "Available", ""),
            false => ("False", "Creating", ""),
        };
        mk_workspace(
            Some(("False", "ReconcilePaused", "")),
            Some(kept),
            Some(outputs),
        )
    }

    /// A Workspace whose Observe fails (a broken module's plan): Synced=False ReconcileError
    /// `observe failed: <cause>`, Ready=True Available and atProvider (these outputs) kept.
    pub fn degraded_workspace(cause: &str, outputs: Value) -> WorkspaceObservation {
        let message =
            format!("observe failed: cannot diff (i.e. plan) Terraform configuration: {cause}");
        mk_workspace(
            Some(("False", "ReconcileError", &message)),
            Some(("True", "Available", "")),
            Some(outputs),
        )
    }

    /// Synced=True with ReconcileSuccess.
    pub const SYNCED_OK: Option<(&str, &str, &str)> = Some(("True", "ReconcileSuccess", ""));
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn workspace_states_follow_synced_ready_and_deletion() {
        let available = Some(("True", "Available", ""));
        let error = Some(("False", "ReconcileError", "apply failed: quota"));
        let cases = [
            (
                "synced and ready",
                SYNCED_OK,
                available,
                WorkspaceState::Ready,
            ),
            ("no conditions yet", None, None, WorkspaceState::Creating),
            (
                "synced, ready creating",
                SYNCED_OK,
                Some(("False", "Creating", "")),
                WorkspaceState::Creating,
            ),
            (
                "ready without synced",
                None,
                available,
                WorkspaceState::Creating,
            ),
            (
                "reconcile error is a failure even if ready",
                error,
                available,
                WorkspaceState::Failed {
                    message: "apply failed: quota".into(),
                },
            ),
            (
                "observe failed on a ready workspace is degraded",
                Some((
                    "False",
                    "ReconcileError",
                    "observe failed: cannot diff (i.e. plan) Terraform configuration: x",
                )),
                available,
                WorkspaceState::Degraded {
                    message: "observe failed: cannot diff (i.e. plan) Terraform configuration: x"
                        .into(),
                },
            ),
            (
                "observe failed before it was ready is a failure",
                Some(("False", "ReconcileError", "observe failed: cannot diff")),
                Some(("False", "Creating", "")),
                WorkspaceState::Failed {
                    message: "observe failed: cannot diff".into(),
                },
            ),
            (
                "paused keeps the ready it had",
                Some(("False", "ReconcilePaused", "")),
                available,
                WorkspaceState::Paused { ready: true },
            ),
            (
                "paused before it was ready",
                Some(("False", "ReconcilePaused", "")),
                Some(("False", "Creating", "")),
                WorkspaceState::Paused { ready: false },
            ),
            (
                "synced false for another reason is waiting",
                Some(("False", "SomeOtherReason", "")),
                available,
                WorkspaceState::Creating,
            ),
        ];
        for (name, synced, ready, expected) in cases {
            assert_eq!(
                mk_workspace(synced, ready, None).state(),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn a_reconcile_error_without_message_still_explains_itself() {
        let ws = mk_workspace(Some(("False", "ReconcileError", "")), None, None);
        let WorkspaceState::Failed { message } = ws.state() else {
            panic!("not failed");
        };
        assert!(message.contains("ReconcileError"));
    }

    #[test]
    fn a_deletion_timestamp_means_deleting_whatever_the_conditions() {
        let mut json = mk_workspace_json(SYNCED_OK, Some(("True", "Available", "")), None);
        json["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        assert_eq!(
            WorkspaceObservation::from_json(&json).state(),
            WorkspaceState::Deleting
        );
    }

    #[test]
    fn outputs_render_strings_as_is_and_other_json_compactly() {
        let ws = ready_workspace(json!({
            "cluster_endpoint": "https://x.eks.amazonaws.com",
            "subnets": ["a", "b"],
            "count": 3,
            "tags": {"b": 1, "a": true},
            "nothing": null
        }));
        assert_eq!(
            ws.output_string("cluster_endpoint").as_deref(),
            Some("https://x.eks.amazonaws.com")
        );
        assert_eq!(ws.output_string("subnets").as_deref(), Some(r#"["a","b"]"#));
        assert_eq!(ws.output_string("count").as_deref(), Some("3"));
        assert_eq!(
            ws.output_string("tags").as_deref(),
            Some(r#"{"a":true,"b":1}"#)
        );
        assert_eq!(ws.output_string("nothing"), None);
        assert_eq!(ws.output_string("absent"), None);
        assert_eq!(ws.outputs().len(), 4);
    }

    #[test]
    fn template_status_of_a_ready_workspace_records_the_applied_revision() {
        let ws = ready_workspace(json!({"vpc_id": "vpc-1"}));
        assert_eq!(
            ws.template_status(None),
            json!({"ready": true, "state": "Available", "lastAppliedRevision": "sum-1",
                   "outputs": {"vpc_id": "vpc-1"}})
        );
    }

    #[test]
    fn template_status_of_a_failed_workspace_records_the_failed_revision_and_message() {
        let ws = failed_workspace("Error: creating EKS cluster");
        assert_eq!(
            ws.template_status(None),
            json!({"ready": false, "state": "Creating", "lastFailedRevision": "sum-1",
                   "lastFailureMessage": "Error: creating EKS cluster", "outputs": {}})
        );
    }

    /// A failed apply of a Workspace that exists keeps `Ready=True Available` at the provider:
    /// still a failure here, with the outputs the Terraform state still has.
    #[test]
    fn a_failed_update_is_a_failure_though_the_workspace_stays_available() {
        let ws = failed_update_workspace("update failed: boom", json!({"vpc_id": "vpc-1"}));
        assert_eq!(
            ws.state(),
            WorkspaceState::Failed {
                message: "update failed: boom".into()
            }
        );
        assert!(!ws.is_ready());
        assert_eq!(
            ws.template_status(None),
            json!({"ready": false, "state": "Available", "lastFailedRevision": "sum-1",
                   "lastFailureMessage": "update failed: boom", "outputs": {"vpc_id": "vpc-1"}})
        );
    }

    #[test]
    fn template_status_before_the_first_observation_omits_outputs_and_nulls_the_state() {
        let ws = mk_workspace(None, None, None);
        assert_eq!(
            ws.template_status(None),
            json!({"ready": false, "state": null})
        );
    }

    #[test]
    fn the_output_names_a_cache_keeps_make_the_same_template_status() {
        let ws = ready_workspace(json!({"a": "1"}));
        let previous =
            BTreeMap::from([("a".to_string(), "0".to_string()), ("b".into(), "2".into())]);
        let mut kept = Some(WorkspaceTemplateStatus {
            ready: Some(true),
            state: Some("Available".into()),
            outputs: Some(previous.clone()),
            ..WorkspaceTemplateStatus::default()
        });
        keep_output_names(&mut kept);
        let outputs = kept.as_ref().and_then(|k| k.outputs.as_ref());
        assert!(
            outputs.is_some_and(|o| o.values().all(String::is_empty)),
            "{kept:?}"
        );
        assert_eq!(
            ws.template_status(outputs),
            ws.template_status(Some(&previous))
        );
    }

    #[test]
    fn outputs_that_vanished_since_the_live_status_are_nulled() {
        let ws = ready_workspace(json!({"a": "1"}));
        let previous =
            BTreeMap::from([("a".to_string(), "0".to_string()), ("b".into(), "2".into())]);
        assert_eq!(
            ws.template_status(Some(&previous))["outputs"],
            json!({"a": "1", "b": null})
        );
    }

    #[test]
    fn workspace_status_copies_at_provider_verbatim() {
        let outputs = json!({"cluster_endpoint": "https://h", "nested": {"x": [1, {"y": null}]}});
        let ws = ready_workspace(outputs.clone());
        assert_eq!(
            ws.workspace_status(),
            json!({"ready": true, "state": "Available",
                   "atProvider": {"checksum": "sum-1", "outputs": outputs}})
        );
    }

    #[test]
    fn workspace_status_omits_at_provider_before_the_provider_reports_it() {
        let status = creating_workspace().workspace_status();
        assert_eq!(status, json!({"ready": false, "state": "Creating"}));
    }
}

#[cfg(test)]
mod applied_tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn the_revision_output_proves_the_rendering_of_the_current_generation_applied() {
        let ws = |generation, wanted: &str, applied: Option<&str>| {
            let outputs = match applied {
                Some(a) => json!({"capt_revision": a}),
                None => json!({}),
            };
            rendered(ready_workspace(outputs), generation, wanted)
        };
        assert_eq!(ws(2, "r2", Some("r2")).applied(Some(2)), Applied::Proven);
        assert_eq!(ws(2, "r2", Some("r2")).applied(None), Applied::Proven);
        for (name, w, generation) in [
            ("older output", ws(2, "r2", Some("r1")), Some(2)),
            ("no output yet", ws(2, "r2", None), Some(2)),
            (
                "rendered from an older generation",
                ws(1, "r1", Some("r1")),
                Some(2),
            ),
        ] {
            assert!(
                matches!(w.applied(generation), Applied::Pending { .. }),
                "{name}"
            );
        }
        let mut remote = ready_workspace(json!({}));
        remote.rendered_generation = Some(2);
        assert_eq!(remote.applied(Some(2)), Applied::Unproven);
    }

    #[test]
    fn the_rendered_revision_and_generation_are_read_from_annotations() {
        let mut json = mk_workspace_json(SYNCED_OK, None, None);
        json["metadata"]["annotations"] = json!({
            REVISION_ANNOTATION: "abc", APPLY_GENERATION_ANNOTATION: "7"});
        let ws = WorkspaceObservation::from_json(&json);
        assert_eq!(ws.rendered_revision.as_deref(), Some("abc"));
        assert_eq!(ws.rendered_generation, Some(7));
    }
}

#[cfg(test)]
mod needs_operator_tests {
    use super::testing::*;
    use super::*;

    /// crossplane-runtime's `errCreateIncomplete`, as the managed reconciler writes it.
    const INCOMPLETE: &str = "cannot determine creation result - remove the \
        crossplane.io/external-create-pending annotation if it is safe to proceed";

    #[test]
    fn a_create_left_pending_by_a_crash_needs_an_operator_and_says_what_to_do() {
        let ws = mk_workspace(
            Some(("False", "ReconcileError", INCOMPLETE)),
            Some(("False", "Creating", "")),
            None,
        );
        let WorkspaceState::NeedsOperator { message } = ws.state() else {
            panic!("{:?}", ws.state());
        };
        assert!(
            message
                .contains("kubectl annotate workspace ws-1 crossplane.io/external-create-pending-"),
            "{message}"
        );
        assert!(message.ends_with(INCOMPLETE), "{message}");
        assert!(!ws.is_ready());
        assert_eq!(
            ws.template_status(None)["lastFailureMessage"],
            json!(message)
        );
    }
}

#[cfg(test)]
mod error_blob_tests {
    use super::testing::*;
    use super::*;

    /// The message provider-terraform wrote on the real provider for a `local-exec` that
    /// failed with a variable read from a Secret (its blob decodes to
    /// `Error running command 'echo using hunter2-secret-value; exit 1'`).
    const REAL: &str = "create failed: cannot apply Terraform configuration: Terraform \
        encountered an error. Summary: local-exec provisioner error. To see the full error \
        run: echo \"H4sIAAAAAAAA/3yQQUozQRCF932KR2+ySSbkh2zmX4oLQXATcSmdTk2mYaYqVFfHAXeewRxFvE9OIhMjEhR3RVV9r96rVUtKCErI0hN2KuuO+oynZC2sJVzd3iAKN2lbNFgSrt3x8O6Ory94CMqJtzXuOaw7gglkR/wTQZM6GpETtvpN9bSCYPBzFbF5ZaQaGtFeo8dGKIPFQEPKVrnj4c05d60qWqOTGLoZDRRH+/uUkzApaJw6h3OUL7nHTbBQDVMHCKMPiStr0CUmLKdIDKUsRSPBXzIefvC1A7CsgYtT/tuCx/PZGLTw+B5E6fvAG0wotoKSx15b2Ej/zTJFJZvtQ1fo/5jOsJjUn0W2YCW7RYW7Yrti9R+scx8AAAD//wEAAP//bFkdd8kBAAA=\" \
        | base64 -d | gunzip";

    #[test]
    fn the_encoded_full_error_never_leaves_the_workspace() {
        let ws = mk_workspace(
            Some(("False", "ReconcileError", REAL)),
            Some(("False", "Creating", "")),
            None,
        );
        let WorkspaceState::Failed { message } = ws.state() else {
            panic!("{:?}", ws.state());
        };
        assert!(
            message.starts_with(
                "create failed: cannot apply Terraform configuration: Terraform \
                 encountered an error. Summary: local-exec provisioner error. (the full"
            ),
            "{message}"
        );
        assert!(!message.contains("H4sI"), "{message}");
        assert!(!ws.template_status(None).to_string().contains("H4sI"));
        let plain = "update failed: cannot apply Terraform configuration: quota";
        assert_eq!(without_error_blob(plain), plain);
    }
}
