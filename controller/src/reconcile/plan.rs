//! A reconcile's decision, as data: the writes to make, in order, and when to look at the
//! object again. A reconciler observes (reads the caches into a snapshot), decides (a pure
//! function from the snapshot to a [`Plan`]) and acts ([`super::act`] carries the plan out).
//! Nothing here talks to the API server, so that a decision can be tested as a table of
//! snapshots and plans, and what a reconcile will write is visible before it writes.

use crate::publish::Publication;
use crate::write_loops::{Basis, Written};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
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
    /// The object's deletion is done as far as we are concerned: how long it took is
    /// recorded, and what was delivered for it forgotten.
    Deleted {
        /// The object.
        object: Object,
        /// When its deletion was asked for, if it was.
        started: Option<Timestamp>,
    },
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

/// What the writes of a reconcile's plans answered so far: the objects the API server
/// returned, by what the write was doing. Empty for the first plan.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    answers: Vec<(&'static str, DynamicObject)>,
}

impl Progress {
    /// True before any write answered.
    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }

    /// Keeps what the write `doing` answered.
    pub fn answered(&mut self, doing: &'static str, object: DynamicObject) {
        self.answers.push((doing, object));
    }

    /// What the write `doing` answered, as a `K`; `None` when it was not made (or answered
    /// something that is not one).
    pub fn answer<K: DeserializeOwned>(&self, doing: &str) -> Option<K> {
        let (_, object) = self.answers.iter().rev().find(|(d, _)| *d == doing)?;
        serde_json::from_value(serde_json::to_value(object).ok()?).ok()
    }
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
fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                merge(t.entry(k).or_insert(Value::Null), v);
            }
        }
        (t, p) => *t = p,
    }
}
