//! The Workspace status the fake provider writes: its phases as conditions and `atProvider`,
//! the server-side-apply body, whether a write is needed, and the patch that replaces
//! `atProvider` whole.

use super::{API_VERSION, KIND};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Map, Value, json};

/// A state of the provider's work on one Workspace, as its status shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    /// Apply running: `Synced=True ReconcileSuccess`, `Ready=False Creating`; atProvider kept.
    Creating,
    /// Applied: `Synced=True`, `Ready=True Available`, atProvider replaced by these.
    Available {
        /// `atProvider.checksum`.
        checksum: String,
        /// `atProvider.outputs` (the non-sensitive outputs; omitted when empty).
        outputs: Map<String, Value>,
    },
    /// Apply failed: `Synced=False ReconcileError <message>`, `Ready=False Creating`;
    /// atProvider kept.
    Failed {
        /// The condition's message.
        message: String,
    },
    /// Deletion running: `Synced=True`, `Ready=False Deleting`; atProvider kept.
    Deleting,
}

impl Phase {
    /// (status, reason, message) of the Synced and the Ready condition.
    fn conditions(&self) -> [(&'static str, &'static str, &str); 2] {
        const SYNCED: (&str, &str, &str) = ("True", "ReconcileSuccess", "");
        match self {
            Phase::Creating => [SYNCED, ("False", "Creating", "")],
            Phase::Available { .. } => [SYNCED, ("True", "Available", "")],
            Phase::Failed { message } => [
                ("False", "ReconcileError", message.as_str()),
                ("False", "Creating", ""),
            ],
            Phase::Deleting => [SYNCED, ("False", "Deleting", "")],
        }
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

/// The server-side-apply body for the status subresource of Workspace `name` in `phase`.
///
/// Holds both conditions (each with `observedGeneration` = `generation` when known, and the
/// current `lastTransitionTime` when its status is unchanged), and the complete `atProvider`:
/// the new one when Available, otherwise the current one, so that the apply keeps it.
pub fn status_apply(
    name: &str,
    generation: Option<i64>,
    current: Option<&Value>,
    phase: &Phase,
    now: &str,
) -> Value {
    let [synced, ready] = phase.conditions();
    let conditions: Vec<Value> = [("Synced", synced), ("Ready", ready)]
        .into_iter()
        .map(|(type_, (status, reason, message))| {
            let existing = condition(current, type_);
            let unchanged = existing.and_then(|c| c.get("status")?.as_str()) == Some(status);
            let since = existing
                .filter(|_| unchanged)
                .and_then(|c| c.get("lastTransitionTime")?.as_str())
                .unwrap_or(now);
            let mut c = json!({
                "type": type_, "status": status, "reason": reason, "message": message,
                "lastTransitionTime": since,
            });
            if let Some(g) = generation {
                c["observedGeneration"] = json!(g);
            }
            c
        })
        .collect();
    let mut status = json!({ "conditions": conditions });
    match phase {
        Phase::Available { checksum, outputs } => {
            status["atProvider"] = at_provider(checksum, outputs);
        }
        _ => {
            if let Some(kept) = current
                .and_then(|s| s.get("atProvider"))
                .filter(|v| !v.is_null())
            {
                status["atProvider"] = kept.clone();
            }
        }
    }
    json!({
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": { "name": name },
        "status": status,
    })
}

/// `atProvider` as provider-terraform writes it (`outputs` omitted when there are none).
pub fn at_provider(checksum: &str, outputs: &Map<String, Value>) -> Value {
    let mut v = json!({ "checksum": checksum });
    if !outputs.is_empty() {
        v["outputs"] = Value::Object(outputs.clone());
    }
    v
}

/// Whether applying `body` (from [`status_apply`]) would change the current `status`: a
/// condition differs in status, reason, message or observedGeneration (not in
/// lastTransitionTime), or `atProvider` differs at all. Conditions of other types are
/// ignored.
pub fn needs_write(current: Option<&Value>, body: &Value) -> bool {
    let want = &body["status"];
    let wanted = want["conditions"].as_array().into_iter().flatten();
    for c in wanted {
        let Some(type_) = c.get("type").and_then(Value::as_str) else {
            continue;
        };
        let Some(have) = condition(current, type_) else {
            return true;
        };
        let text = |c: &Value, k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let same = ["status", "reason", "message"]
            .iter()
            .all(|k| text(have, k) == text(c, k))
            && have.get("observedGeneration").and_then(Value::as_i64)
                == c.get("observedGeneration").and_then(Value::as_i64);
        if !same {
            return true;
        }
    }
    current
        .and_then(|s| s.get("atProvider"))
        .filter(|v| !v.is_null())
        != want.get("atProvider")
}

/// The RFC 7386 merge patch that turns `from` into `to` (`to` holds no nulls). Used to
/// replace `atProvider` whole when keys another writer applied survive our apply.
pub fn merge_patch_between(from: &Value, to: &Value) -> Value {
    match (from, to) {
        (Value::Object(f), Value::Object(t)) => {
            let mut patch = Map::new();
            for (k, fv) in f {
                match t.get(k) {
                    None => {
                        patch.insert(k.clone(), Value::Null);
                    }
                    Some(tv) if tv != fv => {
                        patch.insert(k.clone(), merge_patch_between(fv, tv));
                    }
                    Some(_) => {}
                }
            }
            for (k, tv) in t {
                if !f.contains_key(k) {
                    patch.insert(k.clone(), tv.clone());
                }
            }
            Value::Object(patch)
        }
        _ => to.clone(),
    }
}
