//! A reconcile's decision, as data: the writes to make, in order, and when to look at the
//! object again. A reconciler observes (reads the caches into a snapshot), decides (a pure
//! function from the snapshot to a [`Plan`]) and acts ([`super::act`] carries the plan out).
//! Nothing here talks to the API server, so that a decision can be tested as a table of
//! snapshots and plans, and what a reconcile will write is visible before it writes.

use crate::publish::Publication;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::core::ApiResource;
use kube::{Resource, ResourceExt};
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

    /// This plan, looking again at `next`.
    pub fn next(mut self, next: Next) -> Self {
        self.next = next;
        self
    }
}
