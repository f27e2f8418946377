//! One apply attempt of a desired document: check the live object, leave out what another
//! owner holds with other values, skip the request when nothing would change, and send a
//! server-side apply with `force=false` (unless the policy allows forcing that manager
//! outside protected paths).

use crate::config::{FieldPath, Policy};
use crate::conflict::{self, Conflict};
use crate::document::{remove_at, same_content, without_empty_objects};
use crate::engine::Outcome;
use crate::error::ApplyError;
use crate::fieldsv1::PathElement;
use crate::intent::{DesiredKey, Subresource};
use crate::live::{Kind, Live};
use crate::metrics::{Action, CodeLabel, ManagerLabel, Metrics};
use kube::api::{DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use std::sync::Arc;

/// What an attempt did.
pub struct Attempt {
    /// The outcome.
    pub outcome: Outcome,
    /// The uid of the live object, when it was found.
    pub object_uid: Option<String>,
    /// Whether to back off before the next attempt (a 409 that prediction missed).
    pub retry: bool,
}

/// Applies `document` for `key` if the live object needs it.
pub async fn attempt(
    live: &Live,
    policy: &Policy,
    metrics: &Metrics,
    key: &DesiredKey,
    document: &Value,
    precondition: Option<&str>,
) -> Attempt {
    let kind = match live.kind(&key.object.api_version, &key.object.kind).await {
        Ok(kind) => kind,
        Err(e) => return failed(metrics, key, e, None),
    };
    // A 409 means the cached object was stale (a conflict prediction missed, or the
    // resourceVersion precondition failed): read it again and plan again, a few times.
    let mut reread = false;
    for tries in 1.. {
        let object = match live.get(&kind, &key.object).await {
            Ok(Some(object)) => object,
            Ok(None) => return failed(metrics, key, ApplyError::NotFound, None),
            Err(e) => return failed(metrics, key, e, None),
        };
        let uid = object.metadata.uid.clone();
        if let Some(expected) = precondition
            && uid.as_deref() != Some(expected)
        {
            // The cache may not have seen the object recreated yet: ask the API server once
            // before refusing an intent for the new incarnation.
            if !reread {
                reread = true;
                if let Err(e) = live.reread(&kind, &key.object).await {
                    return failed(metrics, key, e, None);
                }
                continue;
            }
            let found = uid.clone().unwrap_or_else(|| "none".into());
            return failed(
                metrics,
                key,
                ApplyError::UidMismatch {
                    expected: expected.into(),
                    found,
                },
                uid,
            );
        }
        let plan = plan(policy, key, document, &object);
        if plan.unchanged {
            let action = if plan.conflicts.is_empty() {
                Action::unchanged
            } else {
                Action::conflict
            };
            let mut outcome = Outcome::new(key, action);
            outcome.conflicts = plan.conflicts;
            outcome.resource_version = object.metadata.resource_version.clone();
            return Attempt {
                outcome,
                object_uid: uid,
                retry: false,
            };
        }
        metrics
            .writes
            .get_or_create(&ManagerLabel {
                manager: key.field_manager.clone(),
            })
            .inc();
        let mut body = apply_body(key, uid.as_deref(), &plan.body);
        if precondition.is_some() {
            // The uid in the body is a precondition for the main resource only: the status
            // subresource ignores metadata. The resourceVersion of the object whose uid was
            // checked is a precondition for both.
            body["metadata"]["resourceVersion"] = json!(object.metadata.resource_version);
        }
        match send(live, &kind, key, body, plan.force).await {
            Ok(applied) => {
                let action = if plan.conflicts.is_empty() {
                    Action::applied
                } else {
                    Action::conflict
                };
                let mut outcome = Outcome::new(key, action);
                outcome.resource_version = applied.metadata.resource_version.clone();
                outcome.conflicts = plan.conflicts;
                live.observe(&kind, applied);
                return Attempt {
                    outcome,
                    object_uid: uid,
                    retry: false,
                };
            }
            Err(e @ (ApplyError::Conflict(_) | ApplyError::Stale)) if tries < 3 => {
                tracing::debug!(subject = %key.object, error = %e, "Apply refused as stale; re-reading the object");
                refresh(live, &kind, key).await;
            }
            Err(e) => {
                let retry = matches!(e, ApplyError::Conflict(_) | ApplyError::Stale);
                let mut attempt = failed(metrics, key, e, uid);
                attempt.retry = retry;
                return attempt;
            }
        }
    }
    unreachable!("the loop returns")
}

fn failed(
    metrics: &Metrics,
    key: &DesiredKey,
    error: ApplyError,
    object_uid: Option<String>,
) -> Attempt {
    metrics
        .api_errors
        .get_or_create(&CodeLabel {
            code: error.code().into(),
        })
        .inc();
    let action = match &error {
        ApplyError::Transient(_) => Action::error,
        ApplyError::Conflict(_) | ApplyError::Stale => Action::conflict,
        _ => Action::rejected,
    };
    tracing::warn!(subject = %key.object, manager = key.field_manager, error = %error, "Apply did not happen");
    Attempt {
        outcome: Outcome::new(key, action).with_message(format!("{}: {error}", key.object)),
        object_uid,
        retry: false,
    }
}

async fn refresh(live: &Live, kind: &Kind, key: &DesiredKey) {
    if let Ok(Some(object)) = kind
        .api(live.client(), key.object.namespace.as_deref())
        .get_opt(&key.object.name)
        .await
    {
        live.observe(kind, object);
    }
}

async fn send(
    live: &Live,
    kind: &Arc<Kind>,
    key: &DesiredKey,
    body: Value,
    force: bool,
) -> Result<DynamicObject, ApplyError> {
    let api = kind.api(live.client(), key.object.namespace.as_deref());
    let params = PatchParams {
        field_manager: Some(key.field_manager.clone()),
        force,
        ..PatchParams::default()
    };
    let patch = Patch::Apply(body);
    let result = match key.subresource {
        Some(Subresource::Status) => api.patch_status(&key.object.name, &params, &patch).await,
        None => api.patch(&key.object.name, &params, &patch).await,
    };
    result.map_err(ApplyError::from_kube)
}

/// What to send, if anything.
#[derive(Debug)]
pub struct Plan {
    /// The document to apply: the desired one less the paths left to other owners.
    pub body: Value,
    /// Whether the apply forces (only for managers the policy allows, never on protected paths).
    pub force: bool,
    /// Paths another owner holds with other values.
    pub conflicts: Vec<Conflict>,
    /// True when the manager already owns exactly `body` on the live object.
    pub unchanged: bool,
}

/// Plans one apply of `document` for `key` against `object` as last seen (with its
/// `managedFields`). Pure: no request is made.
pub fn plan(policy: &Policy, key: &DesiredKey, document: &Value, object: &DynamicObject) -> Plan {
    // An empty object would claim the field itself (and conflict with its other owners);
    // it is what is left of a removed subtree, so it is not sent.
    let document = &without_empty_objects(document);
    let live = serde_json::to_value(object).unwrap_or_default();
    let subresource = key.subresource_name();
    let (owners, errors) = conflict::owners(
        object
            .metadata
            .managed_fields
            .as_deref()
            .unwrap_or_default(),
    );
    for error in errors {
        tracing::warn!(subject = %key.object, error, "Skipping an undecodable managedFields entry");
    }
    let protected = policy.rules_for(&key.object.group_kind()).protected;
    let may_force = policy.may_force(&key.field_manager);
    let conflicts = conflict::predict(document, &key.field_manager, subresource, &live, &owners);
    tracing::trace!(subject = %key.object, manager = key.field_manager, %document, conflicts = conflicts.len(), "Planned");
    let mut body = document.clone();
    let mut force = false;
    for c in &conflicts {
        if may_force && !protected.iter().any(|p| is_under(&c.elements, p)) {
            force = true;
        } else {
            remove_at(&mut body, &c.elements);
        }
    }
    // Removing a conflicting field can leave its parent empty (`status: {}`), which the
    // API server records as owning `status` itself. Pruned to `{}` when nothing else is
    // wanted, the body then equals what we own once we own nothing: no write per re-check,
    // the conflict is still reported.
    let body = without_empty_objects(&body);
    let owned = conflict::owned_document(&owners, &key.field_manager, subresource, &live);
    let unchanged = same_content(&owned, &body);
    Plan {
        body,
        force,
        conflicts,
        unchanged,
    }
}

fn is_under(path: &[PathElement], prefix: &FieldPath) -> bool {
    prefix.segments().len() <= path.len()
        && prefix
            .segments()
            .iter()
            .zip(path)
            .all(|(name, element)| matches!(element, PathElement::Field(f) if f == name))
}

/// The apply configuration for `document`: the object's identity (with the uid as a
/// precondition, so a recreated object is never written and nothing is created) plus the
/// document.
pub fn apply_body(key: &DesiredKey, uid: Option<&str>, document: &Value) -> Value {
    let mut metadata = json!({"name": key.object.name});
    if let Some(ns) = &key.object.namespace {
        metadata["namespace"] = json!(ns);
    }
    if let Some(uid) = uid {
        metadata["uid"] = json!(uid);
    }
    let mut body = json!({"apiVersion": key.object.api_version, "kind": key.object.kind, "metadata": metadata});
    if let (Value::Object(body), Value::Object(fields)) = (&mut body, document) {
        body.extend(fields.clone());
    }
    body
}

/// What `key`'s manager owns on `object`, with the live values: its desired document as the
/// API server remembers it.
pub fn owned_document(object: &DynamicObject, key: &DesiredKey) -> Value {
    let live = serde_json::to_value(object).unwrap_or_default();
    let (owners, _) = conflict::owners(
        object
            .metadata
            .managed_fields
            .as_deref()
            .unwrap_or_default(),
    );
    let mut owned =
        conflict::owned_document(&owners, &key.field_manager, key.subresource_name(), &live);
    if let Value::Object(fields) = &mut owned {
        // Identity is the applier's, not part of any document.
        for reserved in ["apiVersion", "kind", "metadata"] {
            fields.remove(reserved);
        }
    }
    owned
}

/// The (manager, subresource) pairs among `managers` that have applied to `object`.
pub fn our_apply_entries(
    object: &DynamicObject,
    managers: &[String],
) -> Vec<(String, Option<Subresource>)> {
    object
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|e| e.operation.as_deref() == Some("Apply"))
        .filter_map(|e| {
            let manager = e.manager.clone()?;
            if !managers.contains(&manager) {
                return None;
            }
            match e.subresource.as_deref() {
                Some("status") => Some((manager, Some(Subresource::Status))),
                None | Some("") => Some((manager, None)),
                Some(_) => None,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intent::ObjectRef;

    fn status_key() -> DesiredKey {
        DesiredKey {
            object: ObjectRef {
                api_version: "controlplane.cluster.x-k8s.io/v1beta1".into(),
                kind: "CAPTControlPlane".into(),
                namespace: Some("default".into()),
                name: "demo".into(),
            },
            subresource: Some(Subresource::Status),
            field_manager: "capt-captcontrolplane".into(),
        }
    }

    /// The object after `foreign-a` applied `phase: Creating`, with our entry's fieldsV1.
    fn object(ours: Option<Value>) -> DynamicObject {
        let mut managed = vec![json!({"manager": "foreign-a", "operation": "Apply",
            "subresource": "status", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:status": {"f:phase": {}}}})];
        if let Some(fields) = ours {
            managed.push(
                json!({"manager": "capt-captcontrolplane", "operation": "Apply",
                "subresource": "status", "fieldsType": "FieldsV1", "fieldsV1": fields}),
            );
        }
        serde_json::from_value(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
            "metadata": {"name": "demo", "namespace": "default", "managedFields": managed},
            "status": {"phase": "Creating"},
        }))
        .unwrap()
    }

    #[test]
    fn a_conflict_left_out_leaves_no_empty_object_and_settles() {
        let document = json!({"status": {"phase": "Ready"}});
        // We still co-own the phase: the apply (of nothing) releases it.
        let owning = object(Some(json!({"f:status": {"f:phase": {}}})));
        let planned = plan(&Policy::default(), &status_key(), &document, &owning);
        assert_eq!(planned.body, json!({}));
        assert_eq!(planned.conflicts.len(), 1, "{:?}", planned.conflicts);
        assert_eq!(planned.conflicts[0].owner, "foreign-a");
        assert!(!planned.unchanged);
        // Once we own nothing, nothing is left to apply: no write, the conflict reported.
        let planned = plan(&Policy::default(), &status_key(), &document, &object(None));
        assert_eq!(planned.body, json!({}));
        assert_eq!(planned.conflicts.len(), 1);
        assert!(planned.unchanged);
    }
}
