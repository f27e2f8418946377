//! Planning one apply of a desired document, with no request and no I/O: [`plan`] decides,
//! from the document and the newest view of its object, whether to read the object first,
//! refuse, do nothing, or send an apply (leaving out what another owner holds with other
//! values, with the view's `uid` and `resourceVersion` as preconditions). Also what a manager
//! owns on an object, read from its `managedFields`.

use crate::config::{FieldPath, Policy};
use crate::conflict::{self, Conflict};
use crate::document::{claimed_fields, remove_at, same_content, value_at, without_empty_objects};
use crate::error::ApplyError;
use crate::intent::{DesiredKey, Subresource};
use crate::view::View;
use kube::api::DynamicObject;
use managed_fields::{Entry, FieldSet, ManagedFields, PathElement};
use serde_json::{Value, json};

/// What the planner decides for one document on the newest view of its object.
#[derive(Debug, PartialEq)]
pub enum Decision {
    /// Read the object, then plan again: the view lacks something planning needs.
    Read(Missing),
    /// Refuse the document: the object is another incarnation than the intent named, still
    /// after a read ([`ApplyError::UidMismatch`]).
    Reject(ApplyError),
    /// Send nothing: the manager already owns exactly what it would apply.
    Unchanged {
        /// Paths another owner holds with other values (left out, not forced).
        conflicts: Vec<Conflict>,
        /// The view's `resourceVersion`, told in the outcome.
        resource_version: Option<String>,
        /// The view's `generation`, told in the outcome.
        generation: Option<i64>,
        /// The manager owns all the document claims: the views need not keep its claims.
        claims_owned: bool,
    },
    /// Send this server-side apply.
    Apply {
        /// The apply configuration: identity, preconditions (the view's `uid` and
        /// `resourceVersion`) and the fields.
        body: Value,
        /// Whether it forces (only for managers the policy allows, never on protected paths).
        force: bool,
        /// Paths another owner holds with other values (left out unless forced).
        conflicts: Vec<Conflict>,
        /// As in [`Decision::Unchanged`].
        claims_owned: bool,
    },
}

/// What a view lacks for planning, so that the object must be read.
#[derive(Debug, PartialEq)]
pub enum Missing {
    /// There is no view of the object.
    View,
    /// The view is of another uid than the intent's precondition: it may predate the
    /// object's recreation, so it is read once before the document is refused.
    Incarnation,
    /// The view was cut down without some of what the document claims (see
    /// [`crate::view`]): from now on the views of the object must keep these fields.
    Claimed(FieldSet),
}

/// Decides what to do with `key`'s desired `document` on `view`, the newest view of its
/// object: `pinned` are the paths kept where the API server refused `null`
/// ([`null_refusals`]), `precondition` the uid the intent named, and `uid_reread` whether the
/// object was read once already because its uid was not that one. Pure: no request is made.
pub fn plan(
    policy: &Policy,
    key: &DesiredKey,
    document: &Value,
    pinned: &[FieldPath],
    precondition: Option<&str>,
    view: Option<&View>,
    uid_reread: bool,
) -> Decision {
    let Some(view) = view else {
        return Decision::Read(Missing::View);
    };
    if let Some(expected) = precondition
        && of_another_incarnation(view, expected)
    {
        if !uid_reread {
            return Decision::Read(Missing::Incarnation);
        }
        return Decision::Reject(ApplyError::UidMismatch {
            expected: expected.to_string(),
            found: view.metadata.uid.clone().unwrap_or_else(|| "none".into()),
        });
    }
    let object = view.object();
    let document = pinned_document(document, pinned, key, &object);
    // The view keeps only what planning this document needs (`crate::view`); when it lacks
    // some, it must keep it from now on and the object be read again.
    let claimed = claimed_fields(&without_empty_objects(&document));
    if !view.covers(&key.field_manager, &claimed) {
        tracing::trace!(subject = %key.object, manager = key.field_manager, claimed = %claimed.to_fields_v1(),
            kept = ?view, "The view lacks what the document claims; reading the object");
        return Decision::Read(Missing::Claimed(claimed));
    }
    let claims_owned = view.owned_covers(&key.field_manager, &claimed);
    let planned = plan_on_object(policy, key, &document, &object);
    if planned.unchanged {
        return Decision::Unchanged {
            conflicts: planned.conflicts,
            resource_version: view.metadata.resource_version.clone(),
            generation: view.metadata.generation,
            claims_owned,
        };
    }
    Decision::Apply {
        body: apply_body(
            key,
            view.metadata.uid.as_deref(),
            view.metadata.resource_version.as_deref(),
            &planned.body,
        ),
        force: planned.force,
        conflicts: planned.conflicts,
        claims_owned,
    }
}

/// True when `view` is of another object than the one of uid `expected` (deleted and
/// recreated under the same name, or not the one the intent was computed on).
pub fn of_another_incarnation(view: &View, expected: &str) -> bool {
    view.metadata.uid.as_deref() != Some(expected)
}

/// What to send, if anything, as [`plan_on_object`] finds it.
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
/// `managedFields`): the body without preconditions, and whether it changes anything. Pure.
pub fn plan_on_object(
    policy: &Policy,
    key: &DesiredKey,
    document: &Value,
    object: &DynamicObject,
) -> Plan {
    // An empty object would claim the field itself (and conflict with its other owners);
    // it is what is left of a removed subtree, so it is not sent.
    let document = &without_empty_objects(document);
    let live = serde_json::to_value(object).unwrap_or_default();
    let subresource = key.subresource_name();
    let managed = managed_fields_of(object);
    for error in &managed.errors {
        tracing::warn!(subject = %key.object, error, "Skipping an undecodable managedFields entry");
    }
    let protected = policy.rules_for(&key.object.group_kind()).protected;
    let may_force = policy.may_force(&key.field_manager);
    let predicted = conflict::predict(document, &key.field_manager, subresource, &live, &managed);
    tracing::trace!(subject = %key.object, manager = key.field_manager, %document, conflicts = predicted.len(), "Planned");
    let mut body = document.clone();
    let mut force = false;
    for c in &predicted {
        if may_force && !protected.iter().any(|p| is_under(&c.elements, p)) {
            force = true;
        } else {
            remove_at(&mut body, &c.elements);
        }
    }
    let conflicts = predicted.into_iter().map(|p| p.conflict).collect();
    // Removing a conflicting field can leave its parent empty (`status: {}`), which the
    // API server records as owning `status` itself. Pruned to `{}` when nothing else is
    // wanted, the body then equals what we own once we own nothing: no write per re-check,
    // the conflict is still reported.
    let mut body = without_empty_objects(&body);
    let mut owned = managed.owned_document(&key.field_manager, subresource, &live);
    if let Some(ours) = managed.apply_of(&key.field_manager, subresource) {
        let others = managed.others_than(&key.field_manager, subresource);
        for path in shared_maps(&ours.fields, &others, &live) {
            if value_at(&body, &path).is_none() {
                set_empty_map(&mut body, &path);
            }
        }
        // A map we own whole (a leaf of ours) while others own fields in it projects with their
        // fields; what we own of it is the empty map. A body that wants one of those fields
        // therefore differs, and applies: we then own it too.
        for path in maps_with_others_inside(&ours.fields, &others, &live) {
            set_empty_map(&mut owned, &path);
        }
    }
    let unchanged = same_content(&owned, &body);
    Plan {
        body,
        force,
        conflicts,
        unchanged,
    }
}

/// Maps this manager owns as such (a leaf of its set: it created them) while another manager
/// owns fields below them. Left out of the body, the API server would remove such a map with
/// the other manager's fields in it, or leave `null` in its parent (which a schema may refuse
/// with a 422): so the apply keeps it, empty, for as long as others' fields live in it.
fn shared_maps(ours: &FieldSet, others: &[&Entry], live: &Value) -> Vec<Vec<PathElement>> {
    ours.leaf_paths()
        .into_iter()
        .filter(|p| !p.is_empty() && p.iter().all(|e| matches!(e, PathElement::Field(_))))
        .filter(|p| value_at(live, p).is_some_and(Value::is_object))
        .filter(|p| {
            others
                .iter()
                .any(|o| o.fields.touches(p) && !o.fields.owns(p))
        })
        .collect()
}

/// Maps that are leaves of this manager's set (it owns the map itself, not what is in it)
/// while another manager owns something strictly below them.
fn maps_with_others_inside(
    ours: &FieldSet,
    others: &[&Entry],
    live: &Value,
) -> Vec<Vec<PathElement>> {
    ours.leaf_paths()
        .into_iter()
        .filter(|p| !p.is_empty() && p.iter().all(|e| matches!(e, PathElement::Field(_))))
        .filter(|p| ours.is_leaf_at(p))
        .filter(|p| value_at(live, p).is_some_and(Value::is_object))
        .filter(|p| {
            others.iter().any(|o| {
                o.fields
                    .leaf_paths()
                    .iter()
                    .any(|l| l.len() > p.len() && l.starts_with(p))
            })
        })
        .collect()
}

/// Sets `{}` at `path` (field names only), creating the maps on the way.
fn set_empty_map(doc: &mut Value, path: &[PathElement]) {
    let mut here = doc;
    for element in path {
        let PathElement::Field(name) = element else {
            return;
        };
        if !here.is_object() {
            *here = json!({});
        }
        here = here
            .as_object_mut()
            .expect("an object")
            .entry(name.clone())
            .or_insert_with(|| json!({}));
    }
    *here = json!({});
}

fn is_under(path: &[PathElement], prefix: &FieldPath) -> bool {
    prefix.segments().len() <= path.len()
        && prefix
            .segments()
            .iter()
            .zip(path)
            .all(|(name, element)| matches!(element, PathElement::Field(f) if f == name))
}

/// The paths a 422 of the API server names as invalid `null`: where an apply would leave a map
/// emptied of this manager's fields while another manager owns the map itself (the server then
/// writes `null` there, which a schema may refuse). Parsed from messages such as
/// `… is invalid: status.workspaceStatus.atProvider: Invalid value: "null": …`.
pub fn null_refusals(message: &str) -> Vec<FieldPath> {
    const MARK: &str = ": Invalid value: \"null\"";
    let mut paths = Vec::new();
    let mut rest = message;
    while let Some(at) = rest.find(MARK) {
        let before = &rest[..at];
        let token = before
            .rsplit([' ', ','])
            .next()
            .unwrap_or_default()
            .trim_start_matches(['[', '.']);
        if !token.contains('[')
            && let Ok(path) = token.parse::<FieldPath>()
            && !paths.contains(&path)
        {
            paths.push(path);
        }
        rest = &rest[at + MARK.len()..];
    }
    paths
}

/// `document` with the manager's values on `object` kept at each `pinned` path it leaves
/// empty: where the API server refused to leave `null` (see [`null_refusals`]).
fn pinned_document(
    document: &Value,
    pinned: &[FieldPath],
    key: &DesiredKey,
    object: &DynamicObject,
) -> Value {
    if pinned.is_empty() {
        return document.clone();
    }
    let owned = owned_document(object, key);
    let mut pinned_doc = document.clone();
    for path in pinned {
        let wanted = crate::merge::get(document, path).is_some_and(|v| {
            !without_empty_objects(v)
                .as_object()
                .is_some_and(|m| m.is_empty())
        });
        if let (false, Some(ours)) = (wanted, crate::merge::get(&owned, path)) {
            crate::merge::set(&mut pinned_doc, path, ours.clone());
        }
    }
    pinned_doc
}

/// The apply configuration for `document`: the object's identity plus the document. With a
/// `uid`, the apply never writes a recreated object and never creates one; with a
/// `resource_version`, the API server refuses it (409) once the object has changed since
/// that version, so that a plan made on an older view is never carried out.
pub fn apply_body(
    key: &DesiredKey,
    uid: Option<&str>,
    resource_version: Option<&str>,
    document: &Value,
) -> Value {
    let mut metadata = json!({"name": key.object.name});
    if let Some(ns) = &key.object.namespace {
        metadata["namespace"] = json!(ns);
    }
    if let Some(uid) = uid {
        metadata["uid"] = json!(uid);
    }
    if let Some(version) = resource_version {
        metadata["resourceVersion"] = json!(version);
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
    let mut owned =
        managed_fields_of(object).owned_document(&key.field_manager, key.subresource_name(), &live);
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
    managed_fields_of(object)
        .entries
        .into_iter()
        .map(|e| e.owner)
        .filter(|o| o.operation == "Apply" && managers.contains(&o.manager))
        .filter_map(|o| match o.subresource.as_str() {
            "status" => Some((o.manager, Some(Subresource::Status))),
            "" => Some((o.manager, None)),
            _ => None,
        })
        .collect()
}

fn managed_fields_of(object: &DynamicObject) -> ManagedFields {
    ManagedFields::decode(
        object
            .metadata
            .managed_fields
            .as_deref()
            .unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intent::ObjectRef;

    fn status_key() -> DesiredKey {
        DesiredKey {
            object: ObjectRef {
                api_version: "controlplane.cluster.x-k8s.io/v1beta1".into(),
                kind: "Widget".into(),
                namespace: Some("default".into()),
                name: "demo".into(),
            },
            subresource: Some(Subresource::Status),
            field_manager: "widget-controller".into(),
        }
    }

    /// The object after `foreign-a` applied `phase: Creating`, with our entry's fieldsV1.
    fn object(ours: Option<Value>) -> DynamicObject {
        let mut managed = vec![json!({"manager": "foreign-a", "operation": "Apply",
            "subresource": "status", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:status": {"f:phase": {}}}})];
        if let Some(fields) = ours {
            managed.push(json!({"manager": "widget-controller", "operation": "Apply",
                "subresource": "status", "fieldsType": "FieldsV1", "fieldsV1": fields}));
        }
        serde_json::from_value(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "Widget",
            "metadata": {"name": "demo", "namespace": "default", "managedFields": managed},
            "status": {"phase": "Creating"},
        }))
        .unwrap()
    }

    /// [`object`] as a view of the incarnation `u1` at resourceVersion 7, generation 3.
    fn view_of(ours: Option<Value>) -> View {
        let mut object = object(ours);
        object.metadata.uid = Some("u1".into());
        object.metadata.resource_version = Some("7".into());
        object.metadata.generation = Some(3);
        View::whole(object)
    }

    /// [`plan`] of `document` with no pins and the precondition `u1`.
    fn decide(document: &Value, view: Option<&View>, uid_reread: bool) -> Decision {
        plan(
            &Policy::default(),
            &status_key(),
            document,
            &[],
            Some("u1"),
            view,
            uid_reread,
        )
    }

    #[test]
    fn plan_reads_an_object_it_has_no_view_of() {
        let document = json!({"status": {"ready": true}});
        assert_eq!(
            decide(&document, None, false),
            Decision::Read(Missing::View)
        );
    }

    #[test]
    fn plan_reads_another_incarnation_once_then_refuses_it() {
        let document = json!({"status": {"ready": true}});
        let mut recreated = object(None);
        recreated.metadata.uid = Some("u2".into());
        let recreated = View::whole(recreated);
        assert_eq!(
            decide(&document, Some(&recreated), false),
            Decision::Read(Missing::Incarnation)
        );
        assert_eq!(
            decide(&document, Some(&recreated), true),
            Decision::Reject(ApplyError::UidMismatch {
                expected: "u1".into(),
                found: "u2".into()
            })
        );
        // Without a precondition any incarnation is planned on.
        let planned = plan(
            &Policy::default(),
            &status_key(),
            &document,
            &[],
            None,
            Some(&recreated),
            false,
        );
        assert!(matches!(planned, Decision::Apply { .. }), "{planned:?}");
    }

    #[test]
    fn plan_reads_again_a_view_cut_without_what_the_document_claims() {
        // Cut down to our applies: the phase, which foreign-a owns, is gone from it.
        let document = json!({"status": {"phase": "Ready", "ready": true}});
        let mut whole = object(Some(json!({"f:status": {"f:ready": {}}})));
        whole.data["status"]["ready"] = json!(true);
        whole.metadata.uid = Some("u1".into());
        let dictionaries = compact_json::Dictionaries::default();
        let cut = View::strip(
            whole.clone(),
            std::sync::Arc::new(crate::view::Keep::managers(["widget-controller".into()])),
            &dictionaries,
        );
        let claimed = claimed_fields(&document);
        assert_eq!(
            decide(&document, Some(&cut), false),
            Decision::Read(Missing::Claimed(claimed.clone()))
        );
        // Kept from then on, the claim is covered, and not owned by us yet.
        let kept = View::strip(
            whole,
            std::sync::Arc::new(crate::view::Keep {
                managers: ["widget-controller".to_string()].into(),
                claimed,
            }),
            &dictionaries,
        );
        let Decision::Unchanged {
            conflicts,
            claims_owned,
            ..
        } = decide(&document, Some(&kept), false)
        else {
            panic!("the phase is foreign-a's and ready ours already");
        };
        assert_eq!(conflicts.len(), 1, "{conflicts:?}");
        assert!(!claims_owned);
    }

    #[test]
    fn plan_sends_nothing_when_the_manager_owns_the_document_already() {
        let mut owning = object(Some(json!({"f:status": {"f:phase": {}}})));
        owning.data["status"]["phase"] = json!("Ready");
        owning.metadata.uid = Some("u1".into());
        owning.metadata.resource_version = Some("7".into());
        owning.metadata.generation = Some(3);
        // foreign-a co-owns the phase with the same value: no conflict.
        assert_eq!(
            decide(
                &json!({"status": {"phase": "Ready"}}),
                Some(&View::whole(owning)),
                false
            ),
            Decision::Unchanged {
                conflicts: Vec::new(),
                resource_version: Some("7".into()),
                generation: Some(3),
                claims_owned: true,
            }
        );
    }

    #[test]
    fn plan_applies_the_rest_with_the_views_preconditions_and_reports_what_it_left_out() {
        // We still co-own the phase foreign-a set to Creating: the apply releases it, and sets
        // what is free.
        let document = json!({"status": {"phase": "Ready", "ready": true}});
        let view = view_of(Some(json!({"f:status": {"f:phase": {}}})));
        let Decision::Apply {
            body,
            force,
            conflicts,
            claims_owned,
        } = decide(&document, Some(&view), false)
        else {
            panic!("the phase is released, ready set");
        };
        assert_eq!(
            body,
            json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "Widget",
                   "metadata": {"name": "demo", "namespace": "default", "uid": "u1",
                                "resourceVersion": "7"},
                   "status": {"ready": true}})
        );
        assert!(!force);
        assert_eq!(conflicts.len(), 1, "{conflicts:?}");
        assert_eq!(conflicts[0].owner, "foreign-a");
        assert!(claims_owned, "an uncut view needs no claims");
    }

    #[test]
    fn plan_keeps_the_managers_values_at_a_pinned_path_the_document_leaves_empty() {
        let ours = json!({"f:status": {"f:workspaceStatus": {"f:ready": {},
            "f:atProvider": {"f:checksum": {}, "f:outputs": {"f:a": {}}}}}});
        let mut object = shared_outputs(ours);
        object.metadata.uid = Some("u1".into());
        let view = View::whole(object);
        let document = json!({"status": {"workspaceStatus": {"ready": false}}});
        let pinned = ["status.workspaceStatus.atProvider"
            .parse::<FieldPath>()
            .unwrap()];
        let decided = plan(
            &Policy::default(),
            &status_key(),
            &document,
            &pinned,
            Some("u1"),
            Some(&view),
            false,
        );
        let Decision::Apply { body, .. } = decided else {
            panic!("ready changes: {decided:?}");
        };
        assert_eq!(
            body["status"],
            json!({"workspaceStatus": {"ready": false,
                   "atProvider": {"checksum": "c1", "outputs": {"a": "o1"}}}})
        );
    }

    #[test]
    fn a_conflict_left_out_leaves_no_empty_object_and_settles() {
        let document = json!({"status": {"phase": "Ready"}});
        // We still co-own the phase: the apply (of nothing) releases it.
        let owning = object(Some(json!({"f:status": {"f:phase": {}}})));
        let planned = plan_on_object(&Policy::default(), &status_key(), &document, &owning);
        assert_eq!(planned.body, json!({}));
        assert_eq!(planned.conflicts.len(), 1, "{:?}", planned.conflicts);
        assert_eq!(planned.conflicts[0].owner, "foreign-a");
        assert!(!planned.unchanged);
        // Once we own nothing, nothing is left to apply: no write, the conflict reported.
        let planned = plan_on_object(&Policy::default(), &status_key(), &document, &object(None));
        assert_eq!(planned.body, json!({}));
        assert_eq!(planned.conflicts.len(), 1);
        assert!(planned.unchanged);
    }

    /// The control plane with `atProvider` as our manager and `foreign-u` (an update) left
    /// it: we created `outputs` (`.`), they own `outputs.f`.
    fn shared_outputs(ours: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "Widget",
            "metadata": {"name": "demo", "namespace": "default", "managedFields": [
                {"manager": "widget-controller", "operation": "Apply", "subresource": "status",
                 "fieldsType": "FieldsV1", "fieldsV1": ours},
                {"manager": "foreign-u", "operation": "Update", "subresource": "status",
                 "fieldsType": "FieldsV1", "fieldsV1":
                    {"f:status": {"f:workspaceStatus": {"f:atProvider": {"f:outputs": {"f:f": {}}}}}}},
            ]},
            "status": {"workspaceStatus": {"ready": true,
                       "atProvider": {"checksum": "c1", "outputs": {"a": "o1", "f": "x"}}}},
        }))
        .unwrap()
    }

    #[test]
    fn a_map_we_created_is_kept_empty_while_another_manager_owns_keys_in_it() {
        let ours = json!({"f:status": {"f:workspaceStatus": {"f:ready": {},
            "f:atProvider": {"f:checksum": {}, "f:outputs": {".": {}, "f:a": {}}}}}});
        // atProvider released: without the map, the server would drop `outputs.f` with it
        // and leave `atProvider: null`.
        let document = json!({"status": {"workspaceStatus": {"ready": true}}});
        let planned = plan_on_object(
            &Policy::default(),
            &status_key(),
            &document,
            &shared_outputs(ours),
        );
        assert_eq!(
            planned.body,
            json!({"status": {"workspaceStatus": {"ready": true, "atProvider": {"outputs": {}}}}})
        );
        assert!(
            !planned.unchanged,
            "checksum and outputs.a are ours to remove"
        );
    }

    #[test]
    fn a_kept_empty_map_costs_no_write_once_applied() {
        // After the apply above: we own the map as a leaf, the foreign key lives in it.
        let ours = json!({"f:status": {"f:workspaceStatus": {"f:ready": {},
            "f:atProvider": {"f:outputs": {}}}}});
        let document = json!({"status": {"workspaceStatus": {"ready": true}}});
        let planned = plan_on_object(
            &Policy::default(),
            &status_key(),
            &document,
            &shared_outputs(ours),
        );
        assert!(planned.unchanged, "{:?}", planned.body);
    }

    #[test]
    fn a_map_we_only_fill_is_left_to_the_server_as_before() {
        // We own keys in `outputs` but not the map itself: leaving them out removes only them.
        let ours = json!({"f:status": {"f:workspaceStatus": {"f:ready": {},
            "f:atProvider": {"f:outputs": {"f:a": {}}}}}});
        let document = json!({"status": {"workspaceStatus": {"ready": true}}});
        let planned = plan_on_object(
            &Policy::default(),
            &status_key(),
            &document,
            &shared_outputs(ours),
        );
        assert_eq!(planned.body, document);
    }

    #[test]
    fn the_paths_a_422_refuses_as_null_are_read_from_its_message() {
        let message = r#"Widget.controlplane.cluster.x-k8s.io "demo" is invalid: status.workspaceStatus.atProvider: Invalid value: "null": workspaceStatus.atProvider in body must be of type object: "null""#;
        assert_eq!(
            null_refusals(message),
            vec![
                "status.workspaceStatus.atProvider"
                    .parse::<FieldPath>()
                    .unwrap()
            ]
        );
        let two = r#"x is invalid: [status.a: Invalid value: "null": a, spec.b.c: Invalid value: "null": b]"#;
        assert_eq!(null_refusals(two).len(), 2, "{:?}", null_refusals(two));
        assert!(
            null_refusals("x is invalid: spec.replicas: Invalid value: -1: must be positive")
                .is_empty()
        );
        assert!(null_refusals(r#"spec.list[0]: Invalid value: "null": no"#).is_empty());
    }
}
