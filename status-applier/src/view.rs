//! An object as the applier keeps it: only what planning reads of it.
//!
//! Planning an apply of manager M's document D on an object reads (`apply`, `conflict`):
//! the object's identity (`name`, `namespace`, `uid`, `resourceVersion`); M's applied fields
//! (its `managedFields` entry, to rebuild and compare its document) with their values; and, at
//! the paths D claims, the values and the fields other managers own there (conflicts, maps
//! shared with them). Nothing else: not the labels, annotations, owner references, other
//! managers' fields elsewhere, nor the values there.
//!
//! So every object is cut down, as it enters the applier ([`crate::live`]), to a **region**:
//! the union of the fields the kept managers have applied (their whole entries are kept) and
//! of the paths named by [`Keep::claimed`]; inside it the values and every other manager's
//! fields are exact, outside it nothing is left but a bare leaf where another manager's fields
//! leave the region (see [`FieldSet::within_region`]). The kept managers are the allowed ones
//! (`--allow-manager`) and those with documents for the object; `claimed` is what their
//! documents claim beyond what they own yet. An object of a watched kind that none of them
//! has touched keeps its identity (and generation) alone.
//!
//! A view knows what it kept, and [`View::covers`] tells whether it holds what one document
//! needs: the engine plans only on a view that does, and otherwise asks for more
//! ([`crate::engine::events::Effect::Keep`]) and reads the object again.

use crate::intent::ObjectRef;
use compact_json::{CompactJson, Dictionaries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, ObjectMeta};
use kube::api::DynamicObject;
use managed_fields::FieldSet;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::ops::Deref;
use std::sync::{Arc, Mutex, RwLock};

/// What to keep of one object.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Keep {
    /// Managers whose applies are kept whole, and the values of what they own.
    pub managers: BTreeSet<String>,
    /// Further paths whose values and other owners are kept (a region: see
    /// [`FieldSet::union_region`]).
    pub claimed: FieldSet,
}

impl Keep {
    /// Keeps the applies of `managers` and what they own, nothing more.
    pub fn managers(managers: impl IntoIterator<Item = String>) -> Self {
        Self {
            managers: managers.into_iter().collect(),
            claimed: FieldSet::default(),
        }
    }
}

/// An object as the applier holds it: cut down to a [`Keep`], or whole.
///
/// Held compact ([`CompactJson`], against a recent view of the same kind: [`Dictionaries`]),
/// and parsed when an apply is planned on it ([`View::object`]): the applier holds one view
/// of every object it watches, and a `serde_json::Value` costs about ten times that alone.
/// Its identity is at hand (`Deref`).
#[derive(Debug, Clone)]
pub struct View {
    identity: Identity,
    /// The object (cut down).
    object: CompactJson,
    /// What was kept; `None` for a whole object.
    kept: Option<Arc<Keep>>,
}

/// The identity of a viewed object.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Its metadata, less everything else.
    pub metadata: Metadata,
}

/// The fields of an object's metadata a view keeps at hand, named as in `ObjectMeta`: one of
/// these per object the applier watches, where an `ObjectMeta` would carry ten more fields,
/// always empty here.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    /// `name`.
    pub name: Option<String>,
    /// `namespace`.
    pub namespace: Option<String>,
    /// `uid`.
    pub uid: Option<String>,
    /// `resourceVersion`.
    pub resource_version: Option<String>,
    /// `generation`.
    pub generation: Option<i64>,
}

impl Deref for View {
    type Target = Identity;

    fn deref(&self) -> &Identity {
        &self.identity
    }
}

impl View {
    /// The whole object, uncut (tests, and callers that need everything).
    pub fn whole(object: DynamicObject) -> Self {
        let compact = CompactJson::new(&object);
        Self::new(object, compact, None)
    }

    fn new(object: DynamicObject, compact: CompactJson, kept: Option<Arc<Keep>>) -> Self {
        let metadata = Metadata {
            name: object.metadata.name.clone(),
            namespace: object.metadata.namespace.clone(),
            uid: object.metadata.uid.clone(),
            resource_version: object.metadata.resource_version.clone(),
            generation: object.metadata.generation,
        };
        Self {
            identity: Identity { metadata },
            object: compact,
            kept,
        }
    }

    /// Its resourceVersion as a number: etcd's revision, which only grows, so for one object
    /// a larger number is newer. `None` when it is not one.
    pub fn revision(&self) -> Option<u64> {
        self.metadata.resource_version.as_deref()?.parse().ok()
    }

    /// The object, as kept.
    pub fn object(&self) -> DynamicObject {
        self.object.parse()
    }

    /// Its `managedFields`, as kept.
    fn managed_fields(&self) -> Vec<ManagedFieldsEntry> {
        self.object().metadata.managed_fields.unwrap_or_default()
    }

    /// `object` cut down to what `keep` names (see the module documentation), compacted
    /// against `dictionaries` (those of its kind).
    pub fn strip(object: DynamicObject, keep: Arc<Keep>, dictionaries: &Dictionaries) -> Self {
        let DynamicObject {
            types,
            metadata,
            data,
        } = object;
        let entries = metadata.managed_fields.unwrap_or_default();
        let kept_whole = |e: &ManagedFieldsEntry| {
            e.operation.as_deref() == Some("Apply")
                && e.manager
                    .as_ref()
                    .is_some_and(|m| keep.managers.contains(m))
        };
        let region = region(&keep, entries.iter().filter(|e| kept_whole(e)));
        let managed_fields: Vec<ManagedFieldsEntry> = entries
            .into_iter()
            .filter_map(|e| {
                if kept_whole(&e) {
                    return Some(e);
                }
                // An undecodable entry is skipped by planning anyway.
                let fields = FieldSet::from_fields_v1(&e.fields_v1.as_ref()?.0).ok()?;
                let within = fields.within_region(&region);
                if within.is_empty() {
                    return None;
                }
                Some(ManagedFieldsEntry {
                    fields_v1: Some(FieldsV1(within.to_fields_v1())),
                    time: None,
                    ..e
                })
            })
            .collect();
        let data = region
            .project_region(&data)
            .unwrap_or_else(|| Value::Object(Default::default()));
        let metadata = ObjectMeta {
            name: metadata.name,
            namespace: metadata.namespace,
            uid: metadata.uid,
            resource_version: metadata.resource_version,
            generation: metadata.generation,
            managed_fields: (!managed_fields.is_empty()).then_some(managed_fields),
            ..ObjectMeta::default()
        };
        let object = DynamicObject {
            types,
            metadata,
            data,
        };
        let compact = dictionaries.compact(&object);
        Self::new(object, compact, Some(keep))
    }

    /// True when this view was cut down to something else than `other`: of two views of the
    /// same version, the one that arrived last was cut to what the engine asked last (a read
    /// is, always), so it is the one to plan on.
    pub fn kept_otherwise_than(&self, other: &View) -> bool {
        match (&self.kept, &other.kept) {
            (None, None) => false,
            (Some(a), Some(b)) => !Arc::ptr_eq(a, b) && a != b,
            _ => true,
        }
    }

    /// True when the view kept `manager`'s applies (so that its document can be rebuilt).
    pub fn keeps(&self, manager: &str) -> bool {
        self.kept
            .as_ref()
            .is_none_or(|k| k.managers.contains(manager))
    }

    /// True when the view holds all that planning an apply of `manager`'s document needs,
    /// `claimed` being what the document claims: the manager's applies, and the values and
    /// other owners at every claimed path someone owns (see [`FieldSet::region_answers`]).
    pub fn covers(&self, manager: &str, claimed: &FieldSet) -> bool {
        self.answers(manager, claimed, true)
    }

    /// [`View::covers`] without [`Keep::claimed`]: true when the paths need not be asked for
    /// any more (what the managers own, or nobody's, answers for them).
    pub fn owned_covers(&self, manager: &str, claimed: &FieldSet) -> bool {
        self.answers(manager, claimed, false)
    }

    fn answers(&self, manager: &str, claimed: &FieldSet, with_claimed: bool) -> bool {
        let Some(keep) = &self.kept else {
            return true;
        };
        if !keep.managers.contains(manager) {
            return false;
        }
        let entries = self.managed_fields();
        let mut region = region(
            &Keep::default(),
            entries
                .iter()
                .filter(|e| e.operation.as_deref() == Some("Apply"))
                .filter(|e| {
                    e.manager
                        .as_ref()
                        .is_some_and(|m| keep.managers.contains(m))
                }),
        );
        if with_claimed {
            region.union_region(&keep.claimed);
        }
        let owners: Vec<FieldSet> = entries
            .iter()
            .filter_map(|e| FieldSet::from_fields_v1(&e.fields_v1.as_ref()?.0).ok())
            .collect();
        region.region_answers(claimed, &owners.iter().collect::<Vec<_>>())
    }
}

/// The region a view keeps: `keep.claimed` and every field of the kept entries.
fn region<'a>(keep: &Keep, kept: impl Iterator<Item = &'a ManagedFieldsEntry>) -> FieldSet {
    let mut region = keep.claimed.clone();
    for entry in kept {
        if let Some(Ok(fields)) = entry
            .fields_v1
            .as_ref()
            .map(|f| FieldSet::from_fields_v1(&f.0))
        {
            region.union_region(&fields);
        }
    }
    region
}

/// What to keep of each object: the allowed managers' applies everywhere, and what the
/// engine asked for each object it has documents for.
#[derive(Debug)]
pub struct Keeps {
    base: Arc<Keep>,
    objects: RwLock<HashMap<ObjectRef, Arc<Keep>>>,
    /// The keeps that name managers alone, one of each: most objects keep the same few
    /// managers, and a copy of the set per object took 2.4 MB at 1,000 clusters.
    shared: Mutex<Vec<Arc<Keep>>>,
}

impl Keeps {
    /// Keeps the applies of `managers` (the allowed ones) on every object.
    pub fn new(managers: &[String]) -> Self {
        Self {
            base: Arc::new(Keep::managers(managers.iter().cloned())),
            objects: Default::default(),
            shared: Default::default(),
        }
    }

    /// `keep`, as the one shared copy of it when it names managers alone.
    fn shared(&self, keep: Keep) -> Arc<Keep> {
        if keep == *self.base {
            return self.base.clone();
        }
        if !keep.claimed.is_empty() {
            return Arc::new(keep);
        }
        let mut shared = self.shared.lock().expect("lock");
        if let Some(found) = shared.iter().find(|s| ***s == keep) {
            return found.clone();
        }
        // Those no object keeps any more go; the rest are as many as the sets of managers
        // that write to one object.
        shared.retain(|s| Arc::strong_count(s) > 1);
        let keep = Arc::new(keep);
        shared.push(keep.clone());
        keep
    }

    /// What to keep of `object`.
    pub fn of(&self, object: &ObjectRef) -> Arc<Keep> {
        self.objects
            .read()
            .expect("lock")
            .get(object)
            .cloned()
            .unwrap_or_else(|| self.base.clone())
    }

    /// From now on, keeps of `object` what `keep` names besides the allowed managers' applies.
    pub fn set(&self, object: ObjectRef, keep: &Keep) {
        let mut managers = self.base.managers.clone();
        managers.extend(keep.managers.iter().cloned());
        let keep = self.shared(Keep {
            managers,
            claimed: keep.claimed.clone(),
        });
        let mut objects = self.objects.write().expect("lock");
        // An object kept as every other needs no entry: with the allowed managers writing,
        // that is most of them.
        if Arc::ptr_eq(&keep, &self.base) {
            objects.remove(&object);
        } else {
            objects.insert(object, keep);
        }
    }

    /// Forgets `object` (deleted): it is kept as any other from now on.
    pub fn forget(&self, object: &ObjectRef) {
        self.objects.write().expect("lock").remove(object);
    }

    /// How many objects have a keep of their own.
    pub fn len(&self) -> usize {
        self.objects.read().expect("lock").len()
    }

    /// True when no object has a keep of its own.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A control plane as the API server shows it: ours (`ours-status`) applied a little of
    /// the status; `capi` (an update) owns a large status and labels; `kubectl` the spec.
    fn control_plane() -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w1", "namespace": "team-a", "uid": "u1", "resourceVersion": "7",
                "generation": 3, "labels": {"a": "b"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{…}"},
                "finalizers": ["f"], "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "x"}],
                "managedFields": [
                    {"manager": "kubectl", "operation": "Update", "apiVersion": "example.com/v1",
                     "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}, "f:spec": {"f:version": {}, "f:endpoint": {}}}},
                    {"manager": "ours-status", "operation": "Apply", "subresource": "status",
                     "apiVersion": "example.com/v1", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:status": {"f:ready": {}, "f:outputs": {".": {}, "f:a": {}},
                                  "f:conditions": {"k:{\"type\":\"Ours\"}": {".": {}, "f:type": {}, "f:status": {}}}}}},
                    {"manager": "capi", "operation": "Update", "subresource": "status",
                     "apiVersion": "example.com/v1", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:status": {".": {}, "f:phase": {}, "f:outputs": {"f:f": {}},
                                  "f:conditions": {".": {},
                                      "k:{\"type\":\"Ours\"}": {"f:lastTransitionTime": {}},
                                      "k:{\"type\":\"Core\"}": {".": {}, "f:type": {}, "f:status": {}, "f:message": {}}},
                                  "f:v1beta2": {"f:conditions": {}}}}},
                    {"manager": "ours-status", "operation": "Update", "apiVersion": "example.com/v1",
                     "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:finalizers": {}}}},
                ]},
            "spec": {"version": "1.31", "endpoint": {"host": "h", "port": 443}},
            "status": {"ready": true, "phase": "Provisioning", "outputs": {"a": "1", "f": "2"},
                "conditions": [
                    {"type": "Core", "status": "False", "message": "a long message"},
                    {"type": "Ours", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "v1beta2": {"conditions": [{"type": "X", "status": "True"}]}}
        }))
        .unwrap()
    }

    fn decode(v: Value) -> FieldSet {
        FieldSet::from_fields_v1(&v).unwrap()
    }

    fn keep(managers: &[&str], claimed: Value) -> Arc<Keep> {
        Arc::new(Keep {
            managers: managers.iter().map(|m| m.to_string()).collect(),
            claimed: decode(claimed),
        })
    }

    fn managers(view: &View) -> Vec<(String, String, Value)> {
        view.managed_fields()
            .iter()
            .map(|e| {
                (
                    e.manager.clone().unwrap_or_default(),
                    e.operation.clone().unwrap_or_default(),
                    e.fields_v1.clone().unwrap().0,
                )
            })
            .collect()
    }

    #[test]
    fn an_object_no_kept_manager_touched_keeps_its_identity_and_generation_alone() {
        let view = View::strip(
            control_plane(),
            keep(&["someone-else"], json!({})),
            &Dictionaries::default(),
        );
        let mut kept = serde_json::to_value(view.object()).unwrap();
        // Of each manager, where its fields are: enough to know what nobody owns.
        assert_eq!(
            kept["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("managedFields")
                .unwrap(),
            json!([
                {"manager": "kubectl", "operation": "Update", "apiVersion": "example.com/v1",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}, "f:spec": {}}},
                {"manager": "ours-status", "operation": "Apply", "subresource": "status",
                 "apiVersion": "example.com/v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}},
                {"manager": "capi", "operation": "Update", "subresource": "status",
                 "apiVersion": "example.com/v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}},
                {"manager": "ours-status", "operation": "Update", "apiVersion": "example.com/v1",
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}},
            ])
        );
        assert_eq!(
            kept,
            json!({"apiVersion": "example.com/v1", "kind": "Widget",
                   "metadata": {"name": "w1", "namespace": "team-a", "uid": "u1", "resourceVersion": "7",
                                "generation": 3}})
        );
        assert!(view.keeps("someone-else"));
        assert!(
            !view.keeps("ours-status"),
            "its applies were cut: read again"
        );
        assert!(!view.covers("ours-status", &FieldSet::default()));
        assert!(view.covers("someone-else", &FieldSet::default()));
        assert!(!view.covers(
            "someone-else",
            &decode(json!({"f:status": {"f:ready": {}}}))
        ));
        // Nobody owns anything there: nothing to read.
        assert!(view.covers("someone-else", &decode(json!({"f:extra": {"f:ready": {}}}))));
    }

    #[test]
    fn a_kept_manager_keeps_its_apply_whole_with_its_values_and_the_others_where_it_owns() {
        let view = View::strip(
            control_plane(),
            keep(&["ours-status"], json!({})),
            &Dictionaries::default(),
        );
        assert_eq!(view.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(view.metadata.resource_version.as_deref(), Some("7"));
        let object = view.object();
        assert!(object.metadata.labels.is_none() && object.metadata.annotations.is_none());
        assert!(object.metadata.owner_references.is_none() && object.metadata.finalizers.is_none());
        // The values of what ours owns, and the kind of every value on the way; core's key in
        // the outputs, its own condition, the phase, v1beta2 and the spec are gone.
        assert_eq!(
            object.data,
            json!({"status": {"ready": true, "outputs": {"a": "1"},
                   "conditions": [{"type": "Ours", "status": "True"}]}})
        );
        let entries = managers(&view);
        assert_eq!(entries.len(), 4, "{entries:#?}");
        // Ours whole.
        assert_eq!(
            entries[1].2,
            control_plane().metadata.managed_fields.unwrap()[1]
                .fields_v1
                .clone()
                .unwrap()
                .0
        );
        // Core's inside the region exactly (its key in outputs, which ours created; its field
        // of our condition), a bare leaf where it leaves it.
        assert_eq!(entries[2].0, "capi");
        assert_eq!(
            entries[2].2,
            json!({"f:status": {".": {}, "f:phase": {}, "f:outputs": {"f:f": {}},
                   "f:conditions": {".": {}, "k:{\"type\":\"Ours\"}": {"f:lastTransitionTime": {}},
                                    "k:{\"type\":\"Core\"}": {}},
                   "f:v1beta2": {}}})
        );
        // kubectl owns nothing there; nor does ours' own update of the finalizers.
        assert_eq!(entries[0].2, json!({"f:metadata": {}, "f:spec": {}}));
        assert_eq!(entries[3].2, json!({"f:metadata": {}}));
        assert!(view.covers(
            "ours-status",
            &decode(json!({"f:status": {"f:ready": {}, "f:outputs": {"f:a": {}}}}))
        ));
        assert!(!view.covers("ours-status", &decode(json!({"f:status": {"f:phase": {}}}))));
    }

    #[test]
    fn claimed_paths_keep_their_values_and_owners_too() {
        // A document that wants the phase and the endpoint, which ours does not own yet.
        let claimed =
            json!({"f:status": {"f:phase": {}}, "f:spec": {"f:endpoint": {"f:host": {}}}});
        let view = View::strip(
            control_plane(),
            keep(&["ours-status"], claimed.clone()),
            &Dictionaries::default(),
        );
        let object = view.object();
        assert_eq!(object.data["status"]["phase"], json!("Provisioning"));
        assert_eq!(object.data["spec"], json!({"endpoint": {"host": "h"}}));
        let entries = managers(&view);
        let kubectl = entries.iter().find(|(m, _, _)| m == "kubectl").unwrap();
        assert_eq!(
            kubectl.2,
            json!({"f:metadata": {}, "f:spec": {"f:version": {}, "f:endpoint": {}}})
        );
        assert!(view.covers("ours-status", &decode(claimed.clone())));
        assert!(!view.owned_covers("ours-status", &decode(claimed)));
    }

    #[test]
    fn planning_on_a_stripped_view_plans_as_on_the_whole_object() {
        use crate::apply::{owned_document, plan_on_object};
        use crate::config::Policy;
        use crate::document::claimed_fields;
        use crate::intent::{DesiredKey, Subresource};
        let key = DesiredKey {
            object: ObjectRef {
                api_version: "example.com/v1".into(),
                kind: "Widget".into(),
                namespace: Some("team-a".into()),
                name: "w1".into(),
            },
            subresource: Some(Subresource::Status),
            field_manager: "ours-status".into(),
        };
        let whole = control_plane();
        // One kind's dictionaries: every view but the first is compacted against another.
        let dictionaries = Dictionaries::default();
        for document in [
            json!({"status": {"ready": true, "outputs": {"a": "1"},
                   "conditions": [{"type": "Ours", "status": "True"}]}}),
            json!({"status": {"ready": false, "phase": "Ready", "outputs": {"a": "1", "f": "3"}}}),
            json!({"status": {"ready": true}}),
            json!({"status": {"conditions": [{"type": "Core", "status": "True"}], "v1beta2": {"conditions": []}}}),
        ] {
            let claimed = claimed_fields(&crate::document::without_empty_objects(&document));
            let stripped = View::strip(
                whole.clone(),
                Arc::new(Keep {
                    managers: ["ours-status".to_string()].into(),
                    claimed: claimed.clone(),
                }),
                &dictionaries,
            );
            assert!(stripped.covers("ours-status", &claimed));
            let a = plan_on_object(&Policy::default(), &key, &document, &whole);
            let b = plan_on_object(&Policy::default(), &key, &document, &stripped.object());
            assert_eq!(a.body, b.body, "{document}");
            assert_eq!(a.unchanged, b.unchanged, "{document}");
            assert_eq!(a.conflicts, b.conflicts, "{document}");
            assert_eq!(
                owned_document(&whole, &key),
                owned_document(&stripped.object(), &key)
            );
        }
    }

    #[test]
    fn keeps_adds_the_allowed_managers_to_what_an_object_asks() {
        let keeps = Keeps::new(&["allowed".to_string()]);
        let object = ObjectRef {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: None,
            name: "a".into(),
        };
        assert_eq!(keeps.of(&object).managers, ["allowed".to_string()].into());
        keeps.set(object.clone(), &Keep::managers(["dynamic".to_string()]));
        assert_eq!(
            keeps.of(&object).managers,
            ["allowed".to_string(), "dynamic".to_string()].into()
        );
    }

    #[test]
    fn objects_that_keep_the_same_managers_share_one_keep() {
        let keeps = Keeps::new(&["allowed".to_string()]);
        let object = |name: &str| ObjectRef {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: None,
            name: name.into(),
        };
        keeps.set(object("a"), &Keep::managers(["dynamic".to_string()]));
        keeps.set(object("b"), &Keep::managers(["dynamic".to_string()]));
        keeps.set(object("c"), &Keep::managers(["allowed".to_string()]));
        assert!(Arc::ptr_eq(
            &keeps.of(&object("a")),
            &keeps.of(&object("b"))
        ));
        assert!(Arc::ptr_eq(&keeps.of(&object("c")), &keeps.base));
        // Kept as every other, "c" has no entry of its own; nor has "b" once it is again.
        assert_eq!(keeps.len(), 2);
        keeps.set(object("b"), &Keep::managers(["allowed".to_string()]));
        assert_eq!(keeps.len(), 1);
        assert!(Arc::ptr_eq(&keeps.of(&object("b")), &keeps.base));
        // A keep with claims is the object's own, and equal to what it asked.
        let mut claimed = Keep::managers(["dynamic".to_string()]);
        claimed.claimed =
            FieldSet::from_apply_document(&serde_json::json!({"status": {"x": 1}}), &|_| None);
        keeps.set(object("d"), &claimed);
        assert!(!Arc::ptr_eq(
            &keeps.of(&object("d")),
            &keeps.of(&object("a"))
        ));
        assert_eq!(keeps.of(&object("d")).claimed, claimed.claimed);
    }
}
