//! What goes into the engine's state machine and what comes out of it: the protocol between
//! [`super::machine::Machine`] and the driver.

use crate::conflict::Conflict;
use crate::error::ApplyError;
use crate::intent::{DesiredKey, ObjectRef, ValidIntent};
use crate::metrics::Action;
use crate::outcome::Outcome;
use crate::view::{Keep, View};
use leadership::Leadership;
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

/// Identifies one submitted intent; each ticket is answered exactly once.
pub type Ticket = u64;
/// What happens to the engine.
#[derive(Debug)]
pub enum Event {
    /// An intent, validated. `view` is the driver's newest view of the object, if it has one,
    /// or why it could not get one; reading the object, when the intent needs it, is the
    /// machine's decision ([`Effect::Read`]).
    Intent {
        /// The intent.
        intent: ValidIntent,
        /// Answered once: at once, or (with `wait`) when the apply that carries it ends.
        ticket: Ticket,
        /// Whether the submitter waits for the apply.
        wait: bool,
        /// The object as the driver's cache holds it, or why the driver could not look (its
        /// kind is unknown to the API server).
        view: Result<Option<Arc<View>>, ApplyError>,
    },
    /// The object as the API server showed it (watch or read).
    Observed {
        /// The object.
        object: ObjectRef,
        /// What it looked like.
        view: Arc<View>,
    },
    /// The object does not exist (watch deletion, or a read found nothing).
    Gone(ObjectRef),
    /// A read asked for by [`Effect::Read`] failed.
    ReadFailed {
        /// The object.
        object: ObjectRef,
        /// Why.
        error: ApplyError,
    },
    /// An apply asked for by [`Effect::Apply`] ended.
    Applied {
        /// The document applied.
        key: DesiredKey,
        /// The object as the API server answered it, or why not.
        result: Result<Arc<View>, ApplyError>,
    },
    /// A time asked for by [`Effect::WakeAt`] came.
    Timer(DesiredKey),
    /// Whether this replica may write changed, or its lease was renewed.
    Leadership(Leadership),
}

/// What the driver must do.
#[derive(Debug, PartialEq)]
pub enum Effect {
    /// Read the object from the API server and answer with [`Event::Observed`],
    /// [`Event::Gone`] or [`Event::ReadFailed`].
    Read(ObjectRef),
    /// Send this server-side apply and answer with [`Event::Applied`].
    Apply(ApplyRequest),
    /// Answer a submitter.
    Answer {
        /// Whose.
        ticket: Ticket,
        /// The answer.
        outcome: Outcome,
    },
    /// Send [`Event::Timer`] for `key` at `at` (earlier timers for the key may still fire:
    /// they do nothing).
    WakeAt {
        /// The key.
        key: DesiredKey,
        /// When.
        at: Instant,
    },
    /// Conflicts not reported before for this key: log, count, record, tell.
    Report {
        /// Our document.
        key: DesiredKey,
        /// The new conflicts.
        conflicts: Vec<Conflict>,
        /// Between two managers of this applier (found before any request).
        local: bool,
        /// The object's uid, for an Event about it.
        object_uid: Option<String>,
    },
    /// Something to count.
    Counted(Count),
    /// From now on keep, of this object, what `keep` names (besides the allowed managers'
    /// applies, always kept): the views of it are cut down to that ([`crate::view`]). Comes
    /// before the [`Effect::Read`] that needs it.
    Keep {
        /// The object.
        object: ObjectRef,
        /// What to keep of it.
        keep: Keep,
    },
    /// The object was deleted and the machine forgot it (its documents, keys and claims):
    /// forget what the views keep of it too.
    Forget(ObjectRef),
}

/// What the metrics count.
#[derive(Debug, PartialEq)]
pub enum Count {
    /// An intent arrived and got this first answer.
    Intent(String, Action),
    /// An intent was merged into an apply already pending or in flight.
    Coalesced(String),
    /// An apply check ended with this action (`unchanged`: no request was needed).
    Attempt(String, Action),
    /// A document waited for a newer view of its object (an intent's `notOlderThan`).
    ViewWait(String, crate::metrics::WaitEnd),
}

/// One server-side apply to send.
#[derive(Debug, PartialEq)]
pub struct ApplyRequest {
    /// The document.
    pub key: DesiredKey,
    /// The apply configuration: identity, preconditions (`uid`, `resourceVersion` of the
    /// view it was planned on) and the fields.
    pub body: Value,
    /// Whether the apply forces (the policy allows it outside protected paths).
    pub force: bool,
}

/// One desired document, as the read endpoints show it.
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct DesiredView {
    /// The key.
    #[serde(flatten)]
    pub key: DesiredKey,
    /// The manager's whole desired document.
    pub document: Value,
    /// The uid of the object it was last checked against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The last outcome.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last: Option<Outcome>,
}
