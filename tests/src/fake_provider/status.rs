//! The Workspace status the fake provider writes, built as crossplane-runtime builds it: the
//! status as the provider's Go types hold it, conditions set by `SetConditions`, `atProvider`
//! as Observe and Apply fill it, and the managed reconciler's steps and backoff.
//!
//! Sources (crossplane-runtime v1.16.0, the version provider-terraform v0.18.0 builds with):
//! `apis/common/v1/condition.go` (`Condition`, `Equal`, `SetConditions`, the condition
//! constructors), `pkg/reconciler/managed/reconciler.go` (`Reconcile`: which conditions each
//! path sets, the error prefixes), `pkg/ratelimiter/default.go` (`NewController`: per-item
//! exponential backoff from 1 s to 60 s); provider-terraform v0.18.0
//! `apis/v1beta1/workspace_types.go` (`WorkspaceObservation{checksum,outputs}`, both
//! `omitempty`) and `internal/controller/workspace/workspace.go` (`Observe`, `Update`).

use std::time::Duration;

use super::{EXTERNAL_CREATE_FAILED, EXTERNAL_CREATE_PENDING, EXTERNAL_CREATE_SUCCEEDED};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Map, Value, json};

/// A Crossplane condition the managed reconciler or provider-terraform sets. `Unavailable`
/// exists in crossplane-runtime but neither the managed reconciler (v1.16.0) nor
/// provider-terraform (any version up to v1.0.0) ever sets it, so it is not here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cond {
    /// `Ready=True Available`: set by Observe when the plan shows no diff, and by Update.
    Available,
    /// `Ready=False Creating`: set by the reconciler on the Create path only.
    Creating,
    /// `Ready=False Deleting`: set by the reconciler on the Delete path.
    Deleting,
    /// `Synced=True ReconcileSuccess`.
    ReconcileSuccess,
    /// `Synced=False ReconcileError <message>`.
    ReconcileError(String),
    /// `Synced=False ReconcilePaused`, no message: the pause annotation is set.
    ReconcilePaused,
}

impl Cond {
    /// (type, status, reason, message).
    pub fn parts(&self) -> (&'static str, &'static str, &'static str, &str) {
        match self {
            Cond::Available => ("Ready", "True", "Available", ""),
            Cond::Creating => ("Ready", "False", "Creating", ""),
            Cond::Deleting => ("Ready", "False", "Deleting", ""),
            Cond::ReconcileSuccess => ("Synced", "True", "ReconcileSuccess", ""),
            Cond::ReconcileError(m) => ("Synced", "False", "ReconcileError", m.as_str()),
            Cond::ReconcilePaused => ("Synced", "False", "ReconcilePaused", ""),
        }
    }
}

/// The error prefixes of the managed reconciler (`errReconcileObserve`, `...Create`,
/// `...Update`, `...Delete`) and of provider-terraform (`errDiff`, `errApply`, `errDestroy`).
pub mod message {
    /// Observe failed because `terraform plan` failed.
    pub fn observe(cause: &str) -> String {
        format!("observe failed: cannot diff (i.e. plan) Terraform configuration: {cause}")
    }
    /// The first apply (Create path) failed.
    pub fn create(cause: &str) -> String {
        format!("create failed: cannot apply Terraform configuration: {cause}")
    }
    /// An apply of an existing Workspace (Update path) failed.
    pub fn update(cause: &str) -> String {
        format!("update failed: cannot apply Terraform configuration: {cause}")
    }
    /// crossplane-runtime's `errCreateIncomplete`: a create started and never recorded.
    pub fn create_incomplete() -> String {
        format!(
            "cannot determine creation result - remove the {} annotation if it is safe to \
             proceed",
            super::EXTERNAL_CREATE_PENDING
        )
    }
    /// `terraform destroy` failed.
    pub fn delete(cause: &str) -> String {
        format!("delete failed: cannot destroy Terraform configuration: {cause}")
    }
}

/// The current time as Kubernetes writes it (`2026-01-01T00:00:00Z`).
pub fn now() -> String {
    let time = Time(k8s_openapi::jiff::Timestamp::now());
    match serde_json::to_value(time) {
        Ok(Value::String(s)) => s,
        _ => "1970-01-01T00:00:00Z".to_owned(),
    }
}

/// A condition of `status` by type.
pub fn condition<'a>(status: Option<&'a Value>, type_: &str) -> Option<&'a Value> {
    status?
        .get("conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
}

/// The status as provider-terraform's Go type `WorkspaceStatus` holds it after a read: the
/// conditions (their six fields) and `atProvider {checksum, outputs}`, nothing else. A full
/// status Update writes exactly this back, so any other field is gone after it. `atProvider`
/// is a struct without `omitempty` effect, so it is always there, `{}` at least.
pub fn typed_status(status: Option<&Value>) -> Value {
    const FIELDS: [&str; 6] = [
        "type",
        "status",
        "lastTransitionTime",
        "reason",
        "message",
        "observedGeneration",
    ];
    let conditions: Vec<Value> = status
        .and_then(|s| s.get("conditions"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            let kept: Map<String, Value> = FIELDS
                .iter()
                .filter_map(|k| Some(((*k).to_owned(), c.get(*k)?.clone())))
                .filter(|(_, v)| !v.is_null() && v != "" && v != 0)
                .collect();
            Value::Object(kept)
        })
        .collect();
    let at = status.and_then(|s| s.get("atProvider"));
    let mut at_provider = Map::new();
    if let Some(sum) = at
        .and_then(|a| a.get("checksum"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        at_provider.insert("checksum".into(), json!(sum));
    }
    if let Some(outputs) = at
        .and_then(|a| a.get("outputs"))
        .and_then(Value::as_object)
        .filter(|o| !o.is_empty())
    {
        at_provider.insert("outputs".into(), Value::Object(outputs.clone()));
    }
    let mut out = Map::new();
    if !conditions.is_empty() {
        out.insert("conditions".into(), Value::Array(conditions));
    }
    out.insert("atProvider".into(), Value::Object(at_provider));
    Value::Object(out)
}

/// crossplane-runtime's `ConditionedStatus.SetConditions`: a condition equal to the existing
/// one of its type in status, reason and message is left as it is (its
/// `lastTransitionTime` too); otherwise it replaces it whole, dated `now`, without
/// `observedGeneration` (the v1.16.0 constructors set none); a new type is appended.
pub fn set_conditions(status: &mut Value, conds: &[Cond], now: &str) {
    for cond in conds {
        let (type_, st, reason, msg) = cond.parts();
        let mut new =
            json!({"type": type_, "status": st, "lastTransitionTime": now, "reason": reason});
        if !msg.is_empty() {
            new["message"] = json!(msg);
        }
        let list = status
            .as_object_mut()
            .map(|s| s.entry("conditions").or_insert_with(|| json!([])));
        let Some(Value::Array(list)) = list else {
            continue;
        };
        let text = |c: &Value, k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        match list.iter_mut().find(|c| text(c, "type") == type_) {
            Some(existing)
                if text(existing, "status") == st
                    && text(existing, "reason") == reason
                    && text(existing, "message") == msg => {}
            Some(existing) => *existing = new,
            None => list.push(new),
        }
    }
}

/// `atProvider` as Observe writes it: the checksum of the configuration as it is now (the
/// module directory, applied or not) and the non-sensitive outputs of the Terraform state.
pub fn at_provider(checksum: &str, outputs: &Map<String, Value>) -> Value {
    let mut v = json!({ "checksum": checksum });
    if !outputs.is_empty() {
        v["outputs"] = Value::Object(outputs.clone());
    }
    v
}

/// `atProvider` as a successful apply (`Update`, which `Create` calls) leaves it:
/// `generateWorkspaceObservation` fills only the outputs, so the checksum is gone until the
/// next Observe.
pub fn applied_at_provider(outputs: &Map<String, Value>) -> Value {
    match outputs.is_empty() {
        true => json!({}),
        false => json!({ "outputs": outputs }),
    }
}

/// What the managed reconciler does in one pass, from what Observe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// No external resource: `Create` (the first apply). Ready is `Creating` whatever happens.
    Create,
    /// The resource exists and the plan shows a diff: `Update` (an apply); Ready untouched.
    Update,
    /// The resource exists, no diff: `ReconcileSuccess`, come back after the poll interval.
    UpToDate,
    /// Being deleted and the resource exists: `Delete` (destroy), then `Deleting`.
    Delete,
    /// Being deleted and nothing exists any more: remove the finalizer, write no status.
    Finalize,
}

/// The branch of `Reconcile` for an observation.
pub fn path(deleting: bool, exists: bool, up_to_date: bool) -> Path {
    match (deleting, exists, up_to_date) {
        (true, true, _) => Path::Delete,
        (true, false, _) => Path::Finalize,
        (false, false, _) => Path::Create,
        (false, true, true) => Path::UpToDate,
        (false, true, false) => Path::Update,
    }
}

/// The conditions a pass sets after Observe (which sets `Available` when up to date), for
/// its path and the outcome of its external call (`Err` holds the cause): in the order
/// `Reconcile` sets them, so a later one of the same type wins.
pub fn pass_conditions(route: Path, outcome: Result<(), &str>) -> Vec<Cond> {
    match (route, outcome) {
        (Path::Create, Ok(())) => vec![Cond::Available, Cond::Creating, Cond::ReconcileSuccess],
        (Path::Create, Err(cause)) => {
            vec![Cond::Creating, Cond::ReconcileError(message::create(cause))]
        }
        (Path::Update, Ok(())) => vec![Cond::Available, Cond::ReconcileSuccess],
        (Path::Update, Err(cause)) => vec![Cond::ReconcileError(message::update(cause))],
        (Path::UpToDate, _) => vec![Cond::ReconcileSuccess],
        (Path::Delete, Ok(())) => vec![Cond::Deleting, Cond::ReconcileSuccess],
        (Path::Delete, Err(cause)) => {
            vec![Cond::Deleting, Cond::ReconcileError(message::delete(cause))]
        }
        (Path::Finalize, _) => vec![],
    }
}

/// client-go's `ItemExponentialFailureRateLimiter` (crossplane-runtime's `NewController`:
/// base 1 s, max 60 s): the `failures`-th requeue of an item (0 for the first) waits
/// `base * 2^failures`, at most `max`.
pub fn backoff(failures: u32, base: Duration, max: Duration) -> Duration {
    let factor = 2u32.checked_pow(failures.min(31)).unwrap_or(u32::MAX);
    base.checked_mul(factor).map_or(max, |d| d.min(max))
}

/// crossplane-runtime's `meta.ExternalCreateIncomplete`: `external-create-pending` is set
/// and later than both `external-create-succeeded` and `external-create-failed` (an absent or
/// unparsable time is the zero time).
pub fn external_create_incomplete(
    annotations: &std::collections::BTreeMap<String, String>,
) -> bool {
    let time = |key: &str| {
        annotations
            .get(key)
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
    };
    let Some(pending) = time(EXTERNAL_CREATE_PENDING) else {
        return false;
    };
    let latest = [EXTERNAL_CREATE_SUCCEEDED, EXTERNAL_CREATE_FAILED]
        .iter()
        .filter_map(|k| time(k))
        .max();
    latest.is_none_or(|l| pending > l)
}

/// `spec.deletionPolicy: Orphan`: crossplane-runtime removes the finalizer of a deleted
/// resource without observing or deleting the external one (the Terraform state stays).
pub fn orphaned(spec: &Value) -> bool {
    spec["deletionPolicy"] == "Orphan"
}
