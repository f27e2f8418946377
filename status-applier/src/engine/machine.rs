//! The engine's state machine: every decision the applier makes, with no I/O and no clock.
//!
//! Events go in ([`Event`]): an intent, an object observed or gone, a read or an apply
//! finished, a timer. Effects come out ([`Effect`]): read this object, send this apply,
//! answer this submitter, wake me at, report these conflicts, count this. The driver
//! ([`super::Engine`]) carries the effects out and feeds back what came of them; the tests
//! of this module feed events by hand and check each effect.
//!
//! Two rules keep a field from being lost to a stale view (`docs/concurrency.md`):
//! * every apply is planned on the newest view of the object the machine has, and carries
//!   that view's `resourceVersion` and `uid` as preconditions. If the object changed since,
//!   the API server refuses the apply (409) and the machine reads the object and plans
//!   again: a plan acts on the fields as they are, never as they were;
//! * one apply or read at a time per object: the next document of the same object is
//!   planned on the answer of the one before, not on the view that answer made stale.

use super::Settings;
use crate::apply::{self, our_apply_entries, owned_document};
use crate::config::Policy;
use crate::conflict::{self, Conflict};
use crate::error::ApplyError;
use crate::intent::{DesiredKey, ObjectRef, ValidIntent};
use crate::merge::merge_fragment;
use crate::metrics::Action;
use crate::outcome::Outcome;
use kube::api::DynamicObject;
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::info;

/// Identifies one submitted intent; each ticket is answered exactly once.
pub type Ticket = u64;

/// How many times an apply refused as stale is planned again on a fresh read before the
/// key backs off.
const STALE_RETRIES: u32 = 3;

/// What happens to the engine.
#[derive(Debug)]
pub enum Event {
    /// An intent, validated. `view` is the driver's newest view of the object, if it has one.
    Intent {
        /// The intent.
        intent: ValidIntent,
        /// Answered once: at once, or (with `wait`) when the apply that carries it ends.
        ticket: Ticket,
        /// Whether the submitter waits for the apply.
        wait: bool,
        /// The object as the driver last saw it.
        view: Option<Arc<DynamicObject>>,
    },
    /// The object as the API server showed it (watch or read).
    Observed {
        /// The object.
        object: ObjectRef,
        /// What it looked like.
        view: Arc<DynamicObject>,
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
        result: Result<Arc<DynamicObject>, ApplyError>,
    },
    /// A time asked for by [`Effect::WakeAt`] came.
    Timer(DesiredKey),
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

/// Where a key is in its cycle.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Nothing to do.
    Idle,
    /// Waiting for its coalescing window (or its backoff) to pass.
    Queued {
        due: Instant,
        first: Instant,
        backoff: bool,
    },
    /// Due; waiting for a free slot and for its object to be free.
    Ready,
    /// Holds its object; waiting for a read (no view, a view of another uid, or a view an
    /// apply proved stale).
    Reading { stale: u32 },
    /// Holds its object; an apply of document `version`, planned on the newest view, is in
    /// flight.
    Applying {
        version: u64,
        stale: u32,
        conflicts: Vec<Conflict>,
    },
}

impl Phase {
    fn is_pending(&self) -> bool {
        matches!(self, Phase::Queued { .. } | Phase::Ready)
    }

    fn is_idle(&self) -> bool {
        *self == Phase::Idle
    }
}

struct Entry {
    document: Value,
    /// False for a document rebuilt from managedFields that no intent of this process has
    /// touched yet: it follows the live object instead of correcting it (a standby replica,
    /// or a manager that moved to another applier, must not re-apply what it remembers).
    from_intent: bool,
    /// The intent's uid precondition, if it gave one.
    precondition: Option<String>,
    /// The uid of the object last checked.
    object_uid: Option<String>,
    /// Bumped by every intent that changed the document.
    version: u64,
    phase: Phase,
    /// An observation arrived while the key was busy: check again once it is idle.
    recheck: bool,
    /// The object was read once already because its uid was not the precondition's.
    uid_reread: bool,
    failures: u32,
    waiters: Vec<(u64, Ticket)>,
    last_intent: Option<Instant>,
    last: Option<Outcome>,
    reported: BTreeSet<String>,
}

impl Entry {
    fn new(document: Value, object_uid: Option<String>) -> Self {
        Self {
            document,
            from_intent: false,
            precondition: None,
            object_uid,
            version: 0,
            phase: Phase::Idle,
            recheck: false,
            uid_reread: false,
            failures: 0,
            waiters: Vec::new(),
            last_intent: None,
            last: None,
            reported: BTreeSet::new(),
        }
    }
}

#[derive(Default)]
struct Object {
    /// The newest view the machine has seen.
    view: Option<Arc<DynamicObject>>,
    keys: BTreeSet<DesiredKey>,
    /// The key whose read or apply is in flight.
    busy: Option<DesiredKey>,
}

/// The state machine. See the module documentation.
pub struct Machine {
    policy: Arc<Policy>,
    settings: Settings,
    entries: HashMap<DesiredKey, Entry>,
    objects: HashMap<ObjectRef, Object>,
    ready: VecDeque<DesiredKey>,
    /// Keys holding a slot (reading or applying).
    running: usize,
    /// Keys queued or ready.
    pending: usize,
    jitter: fastrand::Rng,
}

impl Machine {
    /// A machine with no documents. `seed` seeds the backoff jitter.
    pub fn new(policy: Arc<Policy>, settings: Settings, seed: u64) -> Self {
        Self {
            policy,
            settings,
            entries: HashMap::new(),
            objects: HashMap::new(),
            ready: VecDeque::new(),
            running: 0,
            pending: 0,
            jitter: fastrand::Rng::with_seed(seed),
        }
    }

    /// Takes one event at time `now`; answers what to do.
    pub fn handle(&mut self, event: Event, now: Instant) -> Vec<Effect> {
        let mut out = Vec::new();
        match event {
            Event::Intent {
                intent,
                ticket,
                wait,
                view,
            } => self.intent(intent, ticket, wait, view, now, &mut out),
            Event::Observed { object, view } => self.observed(&object, view, now, &mut out),
            Event::Gone(object) => self.gone(&object, now, &mut out),
            Event::ReadFailed { object, error } => {
                if let Some(key) = self.busy_in(&object, |p| matches!(p, Phase::Reading { .. })) {
                    let action = error_action(&error);
                    let outcome =
                        Outcome::new(&key, action).with_message(format!("{object}: {error}"));
                    self.finish(&key, outcome, action == Action::error, now, &mut out);
                }
            }
            Event::Applied { key, result } => self.applied(&key, result, now, &mut out),
            Event::Timer(key) => {
                if let Some(entry) = self.entries.get_mut(&key)
                    && let Phase::Queued { due, .. } = entry.phase
                    && due <= now
                {
                    entry.phase = Phase::Ready;
                    self.ready.push_back(key);
                }
            }
        }
        self.pump(now, &mut out);
        out
    }

    /// Keys queued or ready, not yet started.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Every desired document, sorted by key.
    pub fn desired(&self) -> Vec<DesiredView> {
        let mut views: Vec<DesiredView> = self
            .entries
            .iter()
            .map(|(key, e)| DesiredView {
                key: key.clone(),
                document: e.document.clone(),
                uid: e.precondition.clone().or(e.object_uid.clone()),
                last: e.last.clone(),
            })
            .collect();
        views.sort_by(|a, b| a.key.cmp(&b.key));
        views
    }

    /// The newest view of `object` the machine holds (only objects it has documents for).
    pub fn view(&self, object: &ObjectRef) -> Option<Arc<DynamicObject>> {
        self.objects.get(object)?.view.clone()
    }

    // -- intents --------------------------------------------------------------------------

    fn intent(
        &mut self,
        intent: ValidIntent,
        ticket: Ticket,
        wait: bool,
        view: Option<Arc<DynamicObject>>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let key = intent.key.clone();
        self.objects
            .entry(key.object.clone())
            .or_default()
            .keys
            .insert(key.clone());
        if let Some(view) = view {
            self.take_view(&key.object, view);
        }
        self.load(&key, intent.uid.as_deref(), out);
        let rules = self.policy.rules_for(&key.object.group_kind());
        let merged = {
            let entry = &self.entries[&key];
            merge_fragment(&entry.document, &intent.fragment, &rules, &intent.release)
        };
        let mut outcome = Outcome::new(&key, Action::queued);
        outcome.kept = merged.kept.iter().map(ToString::to_string).collect();
        let local = self.local_conflicts(&key, &merged.document);
        if !local.is_empty() {
            outcome.action = Action::conflict;
            outcome.conflicts = local.clone();
            self.report(&key, &local, true, out);
            out.push(Effect::Counted(Count::Intent(
                key.field_manager.clone(),
                outcome.action,
            )));
            out.push(Effect::Answer {
                ticket,
                outcome: outcome.with_message(
                    "refused before any request: another manager of this applier wants other values",
                ),
            });
            return;
        }
        let window = self.settings.coalesce_window;
        let entry = self.entries.get_mut(&key).expect("loaded");
        let after_quiet = entry.last_intent.is_none_or(|at| now - at >= window);
        entry.last_intent = Some(now);
        let changed = merged.document != entry.document
            || (intent.uid.is_some() && intent.uid != entry.precondition);
        if !changed
            && entry.phase.is_idle()
            && let Some(last) = &entry.last
        {
            let mut answer = last.clone();
            answer.kept = outcome.kept;
            if matches!(answer.action, Action::applied | Action::queued) {
                answer.action = Action::unchanged;
            }
            out.push(Effect::Counted(Count::Intent(
                key.field_manager.clone(),
                answer.action,
            )));
            out.push(Effect::Answer {
                ticket,
                outcome: answer,
            });
            return;
        }
        entry.from_intent = true;
        if changed {
            entry.document = merged.document;
            entry.precondition = intent.uid.or(entry.precondition.take());
            entry.version += 1;
            entry.failures = 0;
        }
        let version = entry.version;
        match entry.phase.clone() {
            Phase::Idle => {
                let at_once = after_quiet && self.settings.apply_lone_intents_at_once;
                self.queue(
                    &key,
                    if at_once { now } else { now + window },
                    false,
                    now,
                    out,
                );
            }
            Phase::Queued {
                due,
                first,
                backoff,
            } => {
                outcome.action = Action::coalesced;
                // A changed document ends a backoff: the failure was for what it was.
                let (first, due, backoff) = match (backoff, changed) {
                    (true, true) => (now, now + window, false),
                    (true, false) => (first, due, true),
                    (false, _) => (first, (now + window).min(first + window * 10), false),
                };
                entry.phase = Phase::Queued {
                    due,
                    first,
                    backoff,
                };
                out.push(Effect::WakeAt {
                    key: key.clone(),
                    at: due,
                });
            }
            Phase::Ready | Phase::Reading { .. } | Phase::Applying { .. } => {
                outcome.action = Action::coalesced;
            }
        }
        if outcome.action == Action::coalesced {
            out.push(Effect::Counted(Count::Coalesced(key.field_manager.clone())));
        }
        out.push(Effect::Counted(Count::Intent(
            key.field_manager.clone(),
            outcome.action,
        )));
        if wait {
            self.entries
                .get_mut(&key)
                .expect("loaded")
                .waiters
                .push((version, ticket));
        } else {
            out.push(Effect::Answer { ticket, outcome });
        }
    }

    /// Makes sure `key` has a document: the one in memory, or else what its manager owns on
    /// the newest view of the object (after a restart, this keeps a partial intent from
    /// dropping fields). A document for another incarnation of the object is replaced, and
    /// its waiting submitters hear that their intents were dropped.
    fn load(&mut self, key: &DesiredKey, uid: Option<&str>, out: &mut Vec<Effect>) {
        let reload = self.entries.get(key).is_none_or(|e| {
            uid.is_some() && e.precondition.is_some() && e.precondition.as_deref() != uid
        });
        if !reload {
            return;
        }
        let view = self.objects.get(&key.object).and_then(|o| o.view.clone());
        let mut fresh = match view {
            Some(v) if uid.is_none() || v.metadata.uid.as_deref() == uid => {
                Entry::new(owned_document(&v, key), v.metadata.uid.clone())
            }
            _ => Entry::new(Value::Object(Default::default()), None),
        };
        if let Some(mut old) = self.entries.remove(key) {
            // The key keeps its place in the cycle and its version count, so that it is
            // never queued twice and an old apply still in flight answers none of the new
            // waiters.
            fresh.version = old.version;
            fresh.phase = old.phase.clone();
            let dropped = Outcome::new(key, Action::rejected).with_message(format!(
                "uid precondition failed: the object was recreated (uid {}), and an intent for \
                 the new incarnation replaced this one before it was applied",
                uid.unwrap_or("unknown")
            ));
            for (_, ticket) in old.waiters.drain(..) {
                out.push(Effect::Answer {
                    ticket,
                    outcome: dropped.clone(),
                });
            }
        }
        self.entries.insert(key.clone(), fresh);
    }

    /// Paths where another manager of this applier, on the same object and subresource,
    /// wants other values than `document`.
    fn local_conflicts(&self, key: &DesiredKey, document: &Value) -> Vec<Conflict> {
        let others: Vec<(&str, &Value)> = self.objects[&key.object]
            .keys
            .iter()
            .filter(|k| *k != key && k.subresource == key.subresource)
            .filter_map(|k| Some((k.field_manager.as_str(), &self.entries.get(k)?.document)))
            .collect();
        conflict::local(document, &others)
    }

    // -- the cycle of a key: queued, ready, reading or applying, idle --------------------

    /// Queues `key` to be checked at `due` (at once when `due` has come).
    fn queue(
        &mut self,
        key: &DesiredKey,
        due: Instant,
        backoff: bool,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let entry = self.entries.get_mut(key).expect("a key");
        if due <= now {
            set_phase(entry, &mut self.pending, Phase::Ready);
            self.ready.push_back(key.clone());
            return;
        }
        set_phase(
            entry,
            &mut self.pending,
            Phase::Queued {
                due,
                first: now,
                backoff,
            },
        );
        out.push(Effect::WakeAt {
            key: key.clone(),
            at: due,
        });
    }

    /// Starts ready keys while slots are free, one key per object at a time.
    fn pump(&mut self, now: Instant, out: &mut Vec<Effect>) {
        let mut waiting = VecDeque::new();
        while self.running < self.settings.max_concurrent_applies.max(1)
            && let Some(key) = self.ready.pop_front()
        {
            let Some(entry) = self.entries.get(&key) else {
                continue;
            };
            if entry.phase != Phase::Ready {
                continue;
            }
            let object = self.objects.get_mut(&key.object).expect("an object");
            if object.busy.is_some() {
                waiting.push_back(key);
                continue;
            }
            object.busy = Some(key.clone());
            self.running += 1;
            self.pending -= 1;
            self.plan_or_read(&key, 0, now, out);
        }
        waiting.extend(self.ready.drain(..));
        self.ready = waiting;
    }

    /// Plans an apply of `key` on the newest view, or asks for a read when there is none
    /// (or it is of another uid than the intent's precondition).
    fn plan_or_read(&mut self, key: &DesiredKey, stale: u32, now: Instant, out: &mut Vec<Effect>) {
        let view = self.objects[&key.object].view.clone();
        let entry = self.entries.get_mut(key).expect("a key");
        let Some(view) = view else {
            entry.phase = Phase::Reading { stale };
            out.push(Effect::Read(key.object.clone()));
            return;
        };
        if let Some(expected) = entry.precondition.clone()
            && view.metadata.uid.as_deref() != Some(expected.as_str())
        {
            // The view may predate the object's recreation: read once before refusing.
            if !entry.uid_reread {
                entry.uid_reread = true;
                entry.phase = Phase::Reading { stale };
                out.push(Effect::Read(key.object.clone()));
                return;
            }
            let error = ApplyError::UidMismatch {
                expected,
                found: view.metadata.uid.clone().unwrap_or_else(|| "none".into()),
            };
            let outcome = Outcome::new(key, Action::rejected)
                .with_message(format!("{}: {error}", key.object));
            self.finish(key, outcome, false, now, out);
            return;
        }
        let plan = apply::plan(&self.policy, key, &entry.document, &view);
        entry.object_uid = view.metadata.uid.clone();
        if plan.unchanged {
            let action = if plan.conflicts.is_empty() {
                Action::unchanged
            } else {
                Action::conflict
            };
            let mut outcome = Outcome::new(key, action);
            outcome.conflicts = plan.conflicts;
            outcome.resource_version = view.metadata.resource_version.clone();
            self.finish(key, outcome, false, now, out);
            return;
        }
        entry.phase = Phase::Applying {
            version: entry.version,
            stale,
            conflicts: plan.conflicts,
        };
        let body = apply::apply_body(
            key,
            view.metadata.uid.as_deref(),
            view.metadata.resource_version.as_deref(),
            &plan.body,
        );
        out.push(Effect::Apply(ApplyRequest {
            key: key.clone(),
            body,
            force: plan.force,
        }));
    }

    fn applied(
        &mut self,
        key: &DesiredKey,
        result: Result<Arc<DynamicObject>, ApplyError>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let Phase::Applying {
            version,
            stale,
            conflicts,
        } = entry.phase.clone()
        else {
            return;
        };
        match result {
            Ok(view) => {
                let action = if conflicts.is_empty() {
                    Action::applied
                } else {
                    Action::conflict
                };
                let mut outcome = Outcome::new(key, action);
                outcome.resource_version = view.metadata.resource_version.clone();
                // What was left out may be free on the object as the apply left it; the watch
                // never shows our own write as news, so plan once more on the answer.
                entry.recheck |= !conflicts.is_empty();
                outcome.conflicts = conflicts;
                self.take_view(&key.object, view);
                self.finish_version(key, version, outcome, false, now, out);
            }
            // The object changed after the view the plan was made on (or, for a 409 with
            // field causes, a conflict was not predicted on it): read it and plan again.
            Err(ApplyError::Stale | ApplyError::Conflict(_) | ApplyError::UidMismatch { .. })
                if stale + 1 < STALE_RETRIES =>
            {
                entry.phase = Phase::Reading { stale: stale + 1 };
                out.push(Effect::Read(key.object.clone()));
            }
            Err(error) => {
                if error == ApplyError::NotFound
                    && let Some(object) = self.objects.get_mut(&key.object)
                {
                    object.view = None;
                }
                let action = error_action(&error);
                let retry = matches!(action, Action::error | Action::conflict);
                let outcome =
                    Outcome::new(key, action).with_message(format!("{}: {error}", key.object));
                self.finish_version(key, version, outcome, retry, now, out);
            }
        }
    }

    fn finish(
        &mut self,
        key: &DesiredKey,
        outcome: Outcome,
        retry: bool,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let version = self.entries[key].version;
        self.finish_version(key, version, outcome, retry, now, out);
    }

    /// Ends a check or an apply of `key` that carried the document's `version`: frees its
    /// object, answers the submitters it carried, and queues the key again for what came
    /// after (a newer document, an observation, or a retry after backoff).
    fn finish_version(
        &mut self,
        key: &DesiredKey,
        version: u64,
        outcome: Outcome,
        retry: bool,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        if let Some(object) = self.objects.get_mut(&key.object)
            && object.busy.as_ref() == Some(key)
        {
            object.busy = None;
            self.running -= 1;
        }
        let entry = self.entries.get_mut(key).expect("a key");
        entry.phase = Phase::Idle;
        entry.uid_reread = false;
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut entry.waiters)
            .into_iter()
            .partition(|(v, _)| *v <= version);
        entry.waiters = waiting;
        for (_, ticket) in done {
            out.push(Effect::Answer {
                ticket,
                outcome: outcome.clone(),
            });
        }
        out.push(Effect::Counted(Count::Attempt(
            key.field_manager.clone(),
            outcome.action,
        )));
        let retry = retry || outcome.action == Action::error;
        if !retry && outcome.conflicts.is_empty() {
            entry.failures = 0;
            entry.reported.clear();
        }
        let conflicts = outcome.conflicts.clone();
        let newer = entry.version > version || std::mem::take(&mut entry.recheck);
        entry.last = Some(outcome);
        if !conflicts.is_empty() {
            self.report(key, &conflicts, false, out);
        }
        let entry = self.entries.get_mut(key).expect("a key");
        if retry {
            entry.failures += 1;
            let delay = backoff(&self.settings, entry.failures, &mut self.jitter);
            self.queue(key, now + delay, true, now, out);
        } else if newer {
            let due = now + self.settings.coalesce_window;
            self.queue(key, due, false, now, out);
        }
    }

    // -- observations ---------------------------------------------------------------------

    /// Keeps `view` if it is newer than the one held; answers whether it was.
    fn take_view(&mut self, object: &ObjectRef, view: Arc<DynamicObject>) -> bool {
        let Some(held) = self.objects.get_mut(object) else {
            return false;
        };
        let newer = held.view.as_ref().is_none_or(|v| is_newer(&view, v));
        if newer {
            held.view = Some(view);
        }
        newer
    }

    fn observed(
        &mut self,
        object: &ObjectRef,
        view: Arc<DynamicObject>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        if !self.policy.allowed_managers.is_empty() {
            self.rebuild(object, &view);
        }
        if !self.objects.contains_key(object) {
            return;
        }
        let newer = self.take_view(object, view);
        let replanned = self.busy_in(object, |p| matches!(p, Phase::Reading { .. }));
        if let Some(key) = &replanned {
            let Phase::Reading { stale } = self.entries[key].phase else {
                unreachable!("reading")
            };
            self.plan_or_read(key, stale, now, out);
        }
        if !newer {
            return;
        }
        let view = self.objects[object].view.clone().expect("just taken");
        let keys: Vec<DesiredKey> = self.objects[object].keys.iter().cloned().collect();
        for key in keys {
            let entry = self.entries.get_mut(&key).expect("a key");
            if !entry.from_intent {
                // A remembered document follows the object.
                entry.document = owned_document(&view, &key);
                entry.object_uid = view.metadata.uid.clone();
            } else if entry.phase.is_idle() {
                // Re-check: restores drifted fields and retries conflicts; sends nothing
                // when nothing would change.
                let due = now + self.settings.coalesce_window;
                self.queue(&key, due, false, now, out);
            } else if matches!(entry.phase, Phase::Applying { .. })
                && replanned.as_ref() != Some(&key)
            {
                // The apply in flight was planned on an older view.
                entry.recheck = true;
            }
        }
    }

    fn gone(&mut self, object: &ObjectRef, now: Instant, out: &mut Vec<Effect>) {
        let Some(held) = self.objects.get_mut(object) else {
            return;
        };
        held.view = None;
        if let Some(key) = self.busy_in(object, |p| matches!(p, Phase::Reading { .. })) {
            let outcome = Outcome::new(&key, Action::rejected)
                .with_message(format!("{object}: {}", ApplyError::NotFound));
            self.finish(&key, outcome, false, now, out);
        }
    }

    /// Rebuilds the documents of the allowed managers that have applied to `object` and have
    /// none in memory (after a restart).
    fn rebuild(&mut self, object: &ObjectRef, view: &Arc<DynamicObject>) {
        for (manager, subresource) in our_apply_entries(view, &self.policy.allowed_managers) {
            let key = DesiredKey {
                object: object.clone(),
                subresource,
                field_manager: manager,
            };
            if self.entries.contains_key(&key) {
                continue;
            }
            info!(subject = %key.object, manager = key.field_manager, "Rebuilt desired document from managedFields");
            let mut entry = Entry::new(owned_document(view, &key), view.metadata.uid.clone());
            entry.last = Some(
                Outcome::new(&key, Action::unchanged).with_message("rebuilt from managedFields"),
            );
            self.entries.insert(key.clone(), entry);
            let held = self.objects.entry(object.clone()).or_default();
            held.keys.insert(key);
            if held.view.as_ref().is_none_or(|v| is_newer(view, v)) {
                held.view = Some(view.clone());
            }
        }
    }

    /// The key of `object` that holds it, if its phase matches.
    fn busy_in(&self, object: &ObjectRef, phase: impl Fn(&Phase) -> bool) -> Option<DesiredKey> {
        let key = self.objects.get(object)?.busy.clone()?;
        phase(&self.entries.get(&key)?.phase).then_some(key)
    }

    fn report(
        &mut self,
        key: &DesiredKey,
        conflicts: &[Conflict],
        local: bool,
        out: &mut Vec<Effect>,
    ) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let fresh: Vec<Conflict> = conflicts
            .iter()
            .filter(|c| entry.reported.insert(format!("{}@{}", c.path, c.owner)))
            .cloned()
            .collect();
        if !fresh.is_empty() {
            out.push(Effect::Report {
                key: key.clone(),
                conflicts: fresh,
                local,
                object_uid: entry.object_uid.clone(),
            });
        }
    }
}

fn set_phase(entry: &mut Entry, pending: &mut usize, phase: Phase) {
    match (entry.phase.is_pending(), phase.is_pending()) {
        (false, true) => *pending += 1,
        (true, false) => *pending -= 1,
        _ => {}
    }
    entry.phase = phase;
}

/// The action an error is answered with.
fn error_action(error: &ApplyError) -> Action {
    match error {
        ApplyError::Transient(_) => Action::error,
        ApplyError::Conflict(_) | ApplyError::Stale => Action::conflict,
        _ => Action::rejected,
    }
}

/// True when `a` is a later view than `b`: another incarnation (uid), or a larger
/// resourceVersion. etcd revisions only grow, so for one object a larger number is newer;
/// an unparseable version counts as newest.
fn is_newer(a: &DynamicObject, b: &DynamicObject) -> bool {
    let version = |o: &DynamicObject| {
        o.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(u64::MAX)
    };
    a.metadata.uid != b.metadata.uid || version(a) > version(b)
}

/// Exponential backoff with jitter: base * 2^(failures-1), capped, times 0.5 to 1.5.
pub(crate) fn backoff(settings: &Settings, failures: u32, jitter: &mut fastrand::Rng) -> Duration {
    let exp = settings
        .backoff_base
        .saturating_mul(1u32 << failures.saturating_sub(1).min(20));
    exp.min(settings.backoff_max).mul_f64(0.5 + jitter.f64())
}
