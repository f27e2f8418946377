//! Pausing, as Cluster API's provider contract defines it: an object is paused while its
//! Cluster has `spec.paused: true` or the object itself carries the `cluster.x-k8s.io/paused`
//! annotation. `clusterctl move` pauses a Cluster before it copies it, so while paused nothing
//! may change: no Workspace, no WorkspaceTemplateApply, no finalizer, and no status except
//! the `Paused` condition that says so.
//!
//! After the copy, clusterctl deletes each object from the source: it annotates it with
//! `clusterctl.cluster.x-k8s.io/delete-for-move`, deletes it, then removes its finalizers.
//! The Cluster may go first, and an object without it would no longer be paused; but what
//! the object built (its Workspaces: real infrastructure) moved with it, so such a deletion
//! is held like a pause: nothing is deleted, no finalizer is touched.

use super::conditions::{self, ConditionBuilder, Status};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The annotation that pauses one object (any value).
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
/// The annotation `clusterctl move` sets on an object it is about to delete from the source.
pub const DELETE_FOR_MOVE_ANNOTATION: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";
/// The condition that reports whether an object is paused.
pub const PAUSED_CONDITION: &str = "Paused";

/// Why an object is paused; `None` when it is not.
pub fn paused_by(
    cluster_paused: Option<bool>,
    annotations: Option<&BTreeMap<String, String>>,
) -> Option<&'static str> {
    if cluster_paused == Some(true) {
        Some("the Cluster has spec.paused: true")
    } else if annotations.is_some_and(|a| a.contains_key(PAUSED_ANNOTATION)) {
        Some("the object has the cluster.x-k8s.io/paused annotation")
    } else if annotations.is_some_and(|a| a.contains_key(DELETE_FOR_MOVE_ANNOTATION)) {
        Some("clusterctl move is deleting the object from this cluster after copying it")
    } else {
        None
    }
}

/// The `Paused` condition: `True` with why, or `False`.
pub fn paused_condition(b: &ConditionBuilder<'_>, paused: Option<&str>) -> Condition {
    match paused {
        Some(why) => b.build(PAUSED_CONDITION, Status::True, "Paused", why),
        None => b.build(PAUSED_CONDITION, Status::False, "NotPaused", ""),
    }
}

/// The only status a paused object publishes: its manager's conditions as they are, with
/// `Paused` turned `True`. Every other field keeps its value (the fragment omits it).
pub fn paused_fragment(
    existing: &[Condition],
    own_types: &[&str],
    generation: Option<i64>,
    now: Timestamp,
    why: &str,
) -> Value {
    let b = ConditionBuilder::new(existing, generation, now);
    let list: Vec<Condition> = own_types
        .iter()
        .filter_map(|t| match *t {
            PAUSED_CONDITION => Some(paused_condition(&b, Some(why))),
            t => conditions::find(existing, t).cloned(),
        })
        .collect();
    json!({ "status": { "conditions": conditions::to_json(&list) } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::testing::{T0, at_min, ts};

    #[test]
    fn the_cluster_or_the_annotation_pauses() {
        let annotated = BTreeMap::from([(PAUSED_ANNOTATION.to_owned(), String::new())]);
        let other = BTreeMap::from([("x".to_owned(), "y".to_owned())]);
        assert!(paused_by(Some(true), None).is_some());
        assert!(paused_by(Some(false), Some(&annotated)).is_some());
        assert!(paused_by(None, Some(&annotated)).is_some());
        assert_eq!(paused_by(Some(false), Some(&other)), None);
        assert_eq!(paused_by(None, None), None);
    }

    #[test]
    fn an_object_clusterctl_move_deletes_is_held_even_without_its_cluster() {
        let moving = BTreeMap::from([(DELETE_FOR_MOVE_ANNOTATION.to_owned(), String::new())]);
        let why = paused_by(None, Some(&moving)).expect("held");
        assert!(why.contains("clusterctl move"), "{why}");
        assert!(paused_by(Some(false), Some(&moving)).is_some());
    }

    #[test]
    fn a_paused_fragment_keeps_every_other_condition_verbatim_and_nothing_else() {
        let b = ConditionBuilder::new(&[], Some(1), ts(T0));
        let existing = vec![
            b.build("Ready", Status::True, "ControlPlaneReady", "up"),
            paused_condition(&b, None),
        ];
        let fragment = paused_fragment(
            &existing,
            &["Ready", "Initialized", PAUSED_CONDITION],
            Some(2),
            at_min(5),
            "the Cluster has spec.paused: true",
        );
        let status = fragment["status"].as_object().unwrap();
        assert_eq!(status.len(), 1, "only conditions: {fragment}");
        let list = status["conditions"].as_array().unwrap();
        assert_eq!(
            list.len(),
            2,
            "Initialized did not exist and is not invented"
        );
        assert_eq!(list[0], conditions::to_json(&existing[..1])[0]);
        assert_eq!(list[1]["type"], "Paused");
        assert_eq!(list[1]["status"], "True");
        assert_eq!(list[1]["observedGeneration"], 2);
    }
}
