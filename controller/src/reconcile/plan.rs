//! A reconcile's decision, as data: the writes to make, in order, and when to look at the
//! object again. A reconciler observes (reads the caches into a snapshot), decides (a pure
//! function from the snapshot to a [`Plan`]) and acts ([`super::act`] carries the plan out).
//! Nothing here talks to the API server, so that a decision can be tested as a table of
//! snapshots and plans, and what a reconcile will write is visible before it writes.

use crate::publish::Publication;
use crate::write_loops::{Basis, Written};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use kube::api::DynamicObject;
use kube::core::ApiResource;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::time::Duration;

/// The steps a decision asks for, carried out in order, each only once the step before it
/// succeeded, and when to look at the object again.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// The writes, in the order that matters.
    pub steps: Vec<Step>,
    /// When to reconcile again without a change.
    pub next: Next,
}

/// One write of a plan.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Publish an intent to the status-applier.
    Publish(Publication),
    /// Server-side apply `body` (made by [`Object::fields`]) to the object under `manager`;
    /// what the API server answers is kept for the next round's decision, under `doing`
    /// ([`Progress::answer`]).
    Apply {
        /// The object.
        object: Object,
        /// The field manager.
        manager: &'static str,
        /// Take the fields from any other manager that holds them.
        force: bool,
        /// The applied configuration.
        body: Value,
        /// What that is to the reconciled object ("applying its …"): a failure's action, and
        /// the key of its answer.
        doing: &'static str,
        /// Told to the write-loop guard once written, for a write computed from observations.
        wrote: Option<Wrote>,
    },
    /// Publish a Warning Event (a courtesy: its failure is logged, and the plan goes on).
    Warn(Warning),
    /// Delete the object, only if it still has the uid it was observed with.
    Delete {
        /// The object.
        object: Object,
        /// What that is to the reconciled object, for a failure's error ("deleting its …").
        doing: &'static str,
    },
    /// Drop the object's ownerReferences, so that the garbage collector leaves it, only if it
    /// still has the uid it was observed with.
    Orphan {
        /// The object.
        object: Object,
        /// What that is to the reconciled object, for a failure's error ("orphaning its …").
        doing: &'static str,
    },
    /// Take our finalizer off the object; its deletion is then the API server's.
    RemoveFinalizer {
        /// The object.
        object: Object,
        /// The finalizer.
        finalizer: &'static str,
    },
    /// Read the object from the API server, for what no cache holds (a Secret, which is not
    /// watched; the managedFields the caches strip); what it answers, or that there is none,
    /// is kept for the next round's decision, under `doing` and the object's name
    /// ([`Progress::read`]).
    Read {
        /// The object.
        object: Object,
        /// What that is to the reconciled object ("reading its …"): a failure's action, and
        /// the key of its answer.
        doing: &'static str,
    },
    /// Write a Secret the reconcile computes, under [`SPEC_MANAGER`]: created when it has no
    /// uid (none was read; a create fails rather than take over one made since), else
    /// applied, forced, with that uid (the one read) as a precondition.
    WriteSecret {
        /// The Secret, which holds Secret data: compared and sent, never printed.
        secret: Sealed,
        /// What that is to the reconciled object ("writing a …"): a failure's action.
        doing: &'static str,
        /// Told to the write-loop guard once written.
        wrote: Wrote,
    },
    /// Merge-patch `patch` into the object under `manager`, only if it still has the uid it
    /// was observed with (a uid in a patch is a precondition).
    Merge {
        /// The object.
        object: Object,
        /// The field manager.
        manager: &'static str,
        /// The merge patch (its uid set from `object`'s).
        patch: Value,
        /// What that is to the reconciled object ("recording its …"): a failure's action.
        doing: &'static str,
        /// Told to the write-loop guard once written.
        wrote: Wrote,
    },
    /// Ask the API server whether these Secrets (namespace, name) exist, a few at a time,
    /// stopping at the first that does not; only existence is asked, never data
    /// ([`crate::seen_secrets`]). The first missing, or that none is, is kept for the next
    /// round's decision, under `doing` ([`Progress::checked`]).
    CheckSecrets {
        /// The Secrets, in the order they are waited for.
        secrets: Vec<(String, String)>,
        /// What that is to the reconciled object ("checking …"): a failure's action, and the
        /// key of its answer.
        doing: &'static str,
    },
    /// The object reached `phase` `seconds` after it began its way there (a metric).
    PhaseReached {
        /// The phase.
        phase: String,
        /// How long it took.
        seconds: f64,
    },
    /// The object's deletion is done as far as we are concerned: how long it took is
    /// recorded, and what was delivered for it forgotten.
    Deleted {
        /// The object.
        object: Object,
        /// When its deletion was asked for, if it was.
        started: Option<Timestamp>,
    },
}

/// What adding our finalizer does: a failure's action, and the key of its answer.
pub const ADDING_FINALIZER: &str = "adding its finalizer";

/// Our `finalizer` added to `obj`, under its own field manager (finalizers are a set:
/// others' stay); the object it answers is kept under [`ADDING_FINALIZER`].
pub fn add_finalizer<K: Resource<DynamicType = ()>>(obj: &K, finalizer: &'static str) -> Step {
    let object = Object::of(obj);
    let body = object.fields(json!({"metadata": {"finalizers": [finalizer]}}));
    Step::Apply {
        object,
        manager: FINALIZER_MANAGER,
        force: false,
        body,
        doing: ADDING_FINALIZER,
        wrote: None,
    }
}

/// Field manager of the controller's finalizers.
pub const FINALIZER_MANAGER: &str = "capt-controller-finalizer";
/// Field manager of the controller's spec-side fields (`spec.workspaceTemplateApplyName`,
/// WorkspaceTemplateApplies and Workspaces it renders).
pub const SPEC_MANAGER: &str = "capt-controller";

/// A write the write-loop guard is told of: the write, what it was computed from, and the
/// object its Warning would be about.
#[derive(Clone, Debug, PartialEq)]
pub struct Wrote {
    /// The object and manager written.
    pub written: Written,
    /// What the write was computed from.
    pub basis: Basis,
    /// The reconciled object.
    pub regarding: ObjectReference,
}

/// An object a step writes to: its resource, where it is, and the uid it was observed with
/// (a precondition: never one created again under its name since).
#[derive(Clone, Debug, PartialEq)]
pub struct Object {
    /// Its kind, group, version and plural.
    pub resource: ApiResource,
    /// Its namespace; `None` for a cluster-scoped kind.
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// Its uid, as observed.
    pub uid: Option<String>,
}

impl Object {
    /// `obj`, as observed.
    pub fn of<K: Resource<DynamicType = ()>>(obj: &K) -> Self {
        Self {
            resource: ApiResource::erase::<K>(&()),
            namespace: obj.namespace(),
            name: obj.name_any(),
            uid: obj.uid(),
        }
    }

    /// The `K` `name` in `namespace`, whatever its uid.
    pub fn named<K: Resource<DynamicType = ()>>(namespace: &str, name: &str) -> Self {
        Self {
            resource: ApiResource::erase::<K>(&()),
            namespace: Some(namespace.to_owned()),
            name: name.to_owned(),
            uid: None,
        }
    }

    /// An applied configuration of the object: `fields` with its apiVersion, kind, name,
    /// namespace and uid (a precondition: the API server refuses it for another object).
    pub fn fields(&self, fields: Value) -> Value {
        let mut body = json!({
            "apiVersion": self.resource.api_version,
            "kind": self.resource.kind,
            "metadata": {"name": self.name, "uid": self.uid},
        });
        if let Some(namespace) = &self.namespace {
            body["metadata"]["namespace"] = json!(namespace);
        }
        merge(&mut body, fields);
        body
    }
}

/// A Secret to write: compared and sent, never printed (its `Debug` names it, not its data),
/// so that no log, panic or error carries its data.
#[derive(Clone, PartialEq)]
pub struct Sealed(pub Box<Secret>);

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Sealed({}/{})",
            self.0.namespace().unwrap_or_default(),
            self.0.name_any()
        )
    }
}

/// A Warning Event about an object.
#[derive(Clone, Debug, PartialEq)]
pub struct Warning {
    /// The object it is about.
    pub regarding: ObjectReference,
    /// Its reason (CamelCase).
    pub reason: &'static str,
    /// What was being done.
    pub action: &'static str,
    /// What happened, and what to do.
    pub note: String,
}

impl Warning {
    /// A Warning about `obj`.
    pub fn about<K: Resource<DynamicType = ()>>(
        obj: &K,
        reason: &'static str,
        action: &'static str,
        note: String,
    ) -> Self {
        Self {
            regarding: obj.object_ref(&()),
            reason,
            action,
            note,
        }
    }
}

/// When to look at the object again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Next {
    /// When it, or something its reconcile reads, changes.
    #[default]
    AwaitChange,
    /// After this long, changed or not (a state that only time changes).
    After(Duration),
    /// At once, deciding again from what this plan's writes answered ([`Progress`]): a
    /// decision that needs what the API server made of a write (a generation, a uid).
    Redecide,
}

/// What the steps of a reconcile's plans answered so far: the objects the API server
/// returned for writes, by what the write was doing; the objects read (or that there was
/// none), by what the read was doing and their name; and the generation each publication
/// left. Empty for the first plan. Its `Debug` names what was answered, never what (a read
/// Secret's data stays out of every log).
#[derive(Clone, Default)]
pub struct Progress {
    answers: Vec<(&'static str, DynamicObject)>,
    reads: Vec<(&'static str, String, Option<DynamicObject>)>,
    published: Vec<(Written, Option<i64>)>,
    checked: Vec<(&'static str, Option<(String, String)>)>,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let answers: Vec<_> = self
            .answers
            .iter()
            .map(|(d, o)| (d, o.name_any()))
            .collect();
        let reads: Vec<_> = (self.reads.iter())
            .map(|(d, name, o)| (d, name, o.is_some()))
            .collect();
        f.debug_struct("Progress")
            .field("answers", &answers)
            .field("reads", &reads)
            .field("published", &self.published)
            .field("checked", &self.checked)
            .finish()
    }
}

impl Progress {
    /// True before any step answered.
    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
            && self.reads.is_empty()
            && self.published.is_empty()
            && self.checked.is_empty()
    }

    /// Keeps what the write `doing` answered.
    pub fn answered(&mut self, doing: &'static str, object: DynamicObject) {
        self.answers.push((doing, object));
    }

    /// What the write `doing` answered, as a `K`; `None` when it was not made (or answered
    /// something that is not one).
    pub fn answer<K: DeserializeOwned>(&self, doing: &str) -> Option<K> {
        let (_, object) = self.answers.iter().rev().find(|(d, _)| *d == doing)?;
        as_kind(object)
    }

    /// Keeps what the read `doing` of `name` found.
    pub fn was_read(&mut self, doing: &'static str, name: String, found: Option<DynamicObject>) {
        self.reads.push((doing, name, found));
    }

    /// What the read `doing` of `name` found, as a `K`: `None` when it was not made,
    /// `Some(None)` when there was no such object.
    pub fn read<K: DeserializeOwned>(&self, doing: &str, name: &str) -> Option<Option<K>> {
        let (.., found) = (self.reads.iter().rev()).find(|(d, n, _)| *d == doing && n == name)?;
        Some(found.as_ref().and_then(as_kind))
    }

    /// Keeps the generation a publication of `key` left.
    pub fn was_published(&mut self, key: Written, generation: Option<i64>) {
        self.published.push((key, generation));
    }

    /// The generation the publication of `key` left (`Some(None)`: none known); `None` when
    /// it was not published.
    pub fn published(&self, key: &Written) -> Option<Option<i64>> {
        let (_, generation) = self.published.iter().rev().find(|(k, _)| k == key)?;
        Some(*generation)
    }
}

impl Progress {
    /// Keeps what the check of Secrets `doing` found: the first missing, or none.
    pub fn was_checked(&mut self, doing: &'static str, missing: Option<(String, String)>) {
        self.checked.push((doing, missing));
    }

    /// What the check of Secrets `doing` found: `None` when it was not made, `Some(None)`
    /// when every one exists, else the first missing (namespace, name).
    pub fn checked(&self, doing: &str) -> Option<Option<&(String, String)>> {
        let (_, missing) = self.checked.iter().rev().find(|(d, _)| *d == doing)?;
        Some(missing.as_ref())
    }
}

fn as_kind<K: DeserializeOwned>(object: &DynamicObject) -> Option<K> {
    serde_json::from_value(serde_json::to_value(object).ok()?).ok()
}

impl Plan {
    /// Nothing to write; look again on a change.
    pub fn nothing() -> Self {
        Self::default()
    }

    /// This plan, then `publication` published.
    pub fn publish(self, publication: Publication) -> Self {
        self.then(Step::Publish(publication))
    }

    /// This plan, then `step`.
    pub fn then(mut self, step: Step) -> Self {
        self.steps.push(step);
        self
    }

    /// This plan, then `other`'s steps, looking again when `other` says.
    pub fn and(mut self, other: Plan) -> Self {
        self.steps.extend(other.steps);
        self.next = other.next;
        self
    }

    /// This plan, looking again at `next`.
    pub fn next(mut self, next: Next) -> Self {
        self.next = next;
        self
    }
}

/// `patch`'s fields set in `target`, objects merged key by key.
pub(crate) fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                merge(t.entry(k).or_insert(Value::Null), v);
            }
        }
        (t, p) => *t = p,
    }
}

/// True when every field of `wanted` is in `live` with the same value.
pub fn contains(live: &Value, wanted: &Value) -> bool {
    match (live, wanted) {
        (Value::Object(live), Value::Object(wanted)) => wanted
            .iter()
            .all(|(k, v)| live.get(k).is_some_and(|l| contains(l, v))),
        (live, wanted) => live == wanted,
    }
}
