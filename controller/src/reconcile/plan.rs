//! A reconcile's decision, as data: the writes to make, in order, and when to look at the
//! object again. A reconciler observes (reads the caches into a snapshot), decides (a pure
//! function from the snapshot to a [`Plan`]) and acts ([`super::act`] carries the plan out).
//! Nothing here talks to the API server, so that a decision can be tested as a table of
//! snapshots and plans, and what a reconcile will write is visible before it writes.

use crate::publish::Publication;
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
    pub fn publish(mut self, publication: Publication) -> Self {
        self.steps.push(Step::Publish(publication));
        self
    }
}
