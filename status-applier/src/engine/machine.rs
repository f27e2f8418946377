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
//!   again: a plan acts on the fields as they are, never as they were. A key whose intent
//!   names a newer version than the view (`notOlderThan`) is not planned on it at all: it
//!   waits, queued, for the watch to catch up, then reads the object;
//! * one apply or read at a time per object: the next document of the same object is
//!   planned on the answer of the one before, not on the view that answer made stale.

mod intake;
mod observe;

use super::Tuning;
use super::events::{ApplyRequest, Count, DesiredView, Effect, Event, Ticket};
use crate::apply::{self, Decision, Missing};
use crate::config::{FieldPath, Policy};
use crate::conflict::Conflict;
use crate::error::ApplyError;
use crate::intent::{DesiredKey, ObjectRef, ValidIntent};
use crate::metrics::{Action, WaitEnd};
use crate::outcome::Outcome;
use crate::view::{Keep, View};
use compact_json::{CompactJson, Dictionaries};
use leadership::Leadership;
use managed_fields::FieldSet;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many times an apply refused as stale is planned again on a fresh read before the
/// key backs off.
const STALE_RETRIES: u32 = 3;
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

/// What the machine holds for one key: its document, where it is in its cycle, and who waits.
struct KeyState {
    document: StoredDocument,
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
    /// Submitters waiting for the apply of a document version, with the protected paths
    /// their intent kept (told in their answer, whichever apply carries it).
    waiters: Vec<(u64, Ticket, Vec<String>)>,
    last_intent: Option<Instant>,
    last: Option<Outcome>,
    reported: BTreeSet<String>,
    /// Paths the API server refused to leave `null`: the manager's values there are kept
    /// until the document changes again.
    pinned: Vec<FieldPath>,
    /// The newest version of the object an intent's submitter knew (`notOlderThan`), while
    /// the view is older: the next plan waits for a view at least as new.
    not_older_than: Option<u64>,
    /// Since when the key waits for that view.
    awaiting_view: Option<Instant>,
}

/// A manager's desired document as the machine keeps it, one per object and manager: compact
/// ([`CompactJson`]), parsed where it is read. As `serde_json::Value`s these documents were
/// the largest part of the applier's heap at 1,000 clusters. Equal documents are equal here.
#[derive(Clone, PartialEq, Eq, Debug)]
struct StoredDocument(CompactJson);

/// What documents are compacted against, per manager: a manager's documents for its objects
/// are alike, and compacted against one another take a few times less.
#[derive(Default)]
struct DocumentDictionaries(HashMap<String, Dictionaries>);

impl DocumentDictionaries {
    /// `document`, as `key`'s manager's documents are stored.
    fn store(&mut self, key: &DesiredKey, document: &Value) -> StoredDocument {
        let dictionaries = match self.0.get(&key.field_manager) {
            Some(found) => found,
            None => self.0.entry(key.field_manager.clone()).or_default(),
        };
        StoredDocument(dictionaries.compact(document))
    }
}

impl StoredDocument {
    #[cfg(test)]
    fn new(document: &Value) -> Self {
        Self(CompactJson::new(document))
    }

    fn value(&self) -> Value {
        self.0.value()
    }
}

impl KeyState {
    fn new(document: StoredDocument, object_uid: Option<String>) -> Box<Self> {
        Box::new(Self {
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
            pinned: Vec::new(),
            not_older_than: None,
            awaiting_view: None,
        })
    }
}

#[derive(Default)]
struct Object {
    /// The newest view the machine has seen.
    view: Option<Arc<View>>,
    /// Its keys, sorted: one or two as a rule, and a B-tree set of them took a node of
    /// eleven (1.4 KB) per object.
    keys: Vec<DesiredKey>,
    /// The key whose read or apply is in flight.
    busy: Option<DesiredKey>,
    /// Intents waiting for the one read of the object that tells what their managers own,
    /// or which incarnation it is (in arrival order).
    parked: Vec<Parked>,
    /// Managers whose applies the views of the object must keep (their documents are here).
    keep_managers: BTreeSet<String>,
    /// Per key, what its document claims beyond what its managers own: the views must keep
    /// the values and the other owners there until the manager owns it (see [`View::covers`]).
    claims: BTreeMap<DesiredKey, FieldSet>,
}

impl Object {
    /// Adds `key`, unless it is there.
    fn add_key(&mut self, key: DesiredKey) {
        if let Err(at) = self.keys.binary_search(&key) {
            // Room for one more, not for four (a key is 128 bytes).
            self.keys.reserve_exact(1);
            self.keys.insert(at, key);
        }
    }

    /// What the views of the object must keep.
    fn keep(&self) -> Keep {
        let mut claimed = FieldSet::default();
        for set in self.claims.values() {
            claimed.union_region(set);
        }
        Keep {
            managers: self.keep_managers.clone(),
            claimed,
        }
    }
}

/// An intent waiting for its object to be read.
struct Parked {
    intent: ValidIntent,
    ticket: Ticket,
    wait: bool,
}

/// The state machine. See the module documentation.
pub struct Machine {
    policy: Arc<Policy>,
    tuning: Tuning,
    /// Boxed: a key's state is about 400 bytes, and the table keeps room for up to twice as
    /// many keys as it holds.
    entries: HashMap<DesiredKey, Box<KeyState>>,
    /// Boxed, as the keys' states are: one per object with documents, in a table that doubles.
    objects: HashMap<ObjectRef, Box<Object>>,
    documents: DocumentDictionaries,
    ready: VecDeque<DesiredKey>,
    /// Keys holding a slot (reading or applying).
    running: usize,
    /// Keys queued or ready.
    pending: usize,
    /// Whether this replica may write now ([`leadership`]).
    leadership: Leadership,
    jitter: fastrand::Rng,
}

impl Machine {
    /// A machine with no documents. `seed` seeds the backoff jitter.
    pub fn new(policy: Arc<Policy>, tuning: Tuning, seed: u64) -> Self {
        Self {
            policy,
            tuning,
            entries: HashMap::new(),
            objects: HashMap::new(),
            documents: DocumentDictionaries::default(),
            ready: VecDeque::new(),
            running: 0,
            pending: 0,
            leadership: Leadership::Unconditional,
            jitter: fastrand::Rng::with_seed(seed),
        }
    }

    /// How many objects the machine holds something of (documents, keys, parked intents).
    pub fn objects_held(&self) -> usize {
        self.objects.len()
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
                self.unpark_failed(&object, &error, &mut out);
                if let Some(key) = self.busy_in(&object, |p| matches!(p, Phase::Reading { .. })) {
                    let action = error_action(&error);
                    let outcome = crate::outcome::for_key(&key, action)
                        .with_message(format!("{object}: {error}"));
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
            Event::Leadership(leadership) => self.lead(leadership, &mut out),
        }
        self.pump(now, &mut out);
        out
    }

    /// Whether an apply may be sent at `now` ([`leadership`]).
    pub fn may_write(&self, now: Instant) -> bool {
        self.leadership.may_write(now)
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
                document: e.document.value(),
                uid: e.precondition.clone().or(e.object_uid.clone()),
                last: e.last.clone(),
            })
            .collect();
        views.sort_by(|a, b| a.key.cmp(&b.key));
        views
    }

    /// The newest view of `object` the machine holds (only objects it has documents for).
    pub fn view(&self, object: &ObjectRef) -> Option<Arc<View>> {
        self.objects.get(object)?.view.clone()
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
        if !entry.from_intent {
            // Only what an intent asked for is ever applied: a document rebuilt from the
            // object, or one this replica kept while another led, follows the object.
            return;
        }
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
        while self.leadership.may_write(now)
            && self.running < self.tuning.max_concurrent_applies.max(1)
            && let Some(key) = self.ready.pop_front()
        {
            let Some(entry) = self.entries.get(&key) else {
                continue;
            };
            if entry.phase != Phase::Ready {
                continue;
            }
            if self.objects[&key.object].busy.is_some() {
                waiting.push_back(key);
                continue;
            }
            let wait = self.await_view(&key, now, out);
            if wait == ViewWait::Queued {
                continue;
            }
            let object = self.objects.get_mut(&key.object).expect("an object");
            object.busy = Some(key.clone());
            self.running += 1;
            self.pending -= 1;
            if wait == ViewWait::RanOut {
                self.read_for(&key, Missing::View, 0, out);
            } else {
                self.plan_or_read(&key, 0, now, out);
            }
        }
        waiting.extend(self.ready.drain(..));
        self.ready = waiting;
    }

    /// Whether `key`, ready, waits for a newer view of its object: an intent's submitter
    /// knew a newer version (`notOlderThan`) than the view, on which the apply would be
    /// refused as stale. It waits queued (holding no slot) until a view as new arrives
    /// ([`Machine::observed`] makes it ready) or the wait runs out: then the object is read.
    fn await_view(&mut self, key: &DesiredKey, now: Instant, out: &mut Vec<Effect>) -> ViewWait {
        let view = self.objects[&key.object].view.as_deref();
        let entry = self.entries.get_mut(key).expect("a key");
        if !behind(view, entry.not_older_than) {
            if entry.awaiting_view.take().is_some() {
                out.push(Effect::Counted(Count::ViewWait(
                    key.field_manager.clone(),
                    WaitEnd::caught_up,
                )));
            }
            entry.not_older_than = None;
            return ViewWait::No;
        }
        let since = *entry.awaiting_view.get_or_insert(now);
        let until = since + self.tuning.view_wait;
        if now >= until {
            entry.not_older_than = None;
            entry.awaiting_view = None;
            out.push(Effect::Counted(Count::ViewWait(
                key.field_manager.clone(),
                WaitEnd::read,
            )));
            return ViewWait::RanOut;
        }
        self.queue(key, until, false, now, out);
        ViewWait::Queued
    }

    /// Plans `key` on the newest view ([`apply::plan`]) and takes the decision: a read, a
    /// refusal, an answer (nothing to send), or an apply.
    fn plan_or_read(&mut self, key: &DesiredKey, stale: u32, now: Instant, out: &mut Vec<Effect>) {
        if !self.leadership.may_write(now) || !self.entries[key].from_intent {
            self.hold(key);
            return;
        }
        let view = self.objects[&key.object].view.clone();
        let entry = &self.entries[key];
        let decision = apply::plan(
            &self.policy,
            key,
            &entry.document.value(),
            &entry.pinned,
            entry.precondition.as_deref(),
            view.as_deref(),
            entry.uid_reread,
        );
        let view_uid = view.and_then(|v| v.metadata.uid.clone());
        match decision {
            Decision::Read(missing) => self.read_for(key, missing, stale, out),
            Decision::Reject(error) => {
                let outcome = crate::outcome::for_key(key, Action::rejected)
                    .with_message(format!("{}: {error}", key.object));
                self.finish(key, outcome, false, now, out);
            }
            Decision::Unchanged {
                conflicts,
                resource_version,
                generation,
                claims_owned,
            } => {
                self.release_claims_if(claims_owned, key, out);
                let entry = self.entries.get_mut(key).expect("a key");
                entry.object_uid = view_uid;
                let action = if conflicts.is_empty() {
                    Action::unchanged
                } else {
                    Action::conflict
                };
                let mut outcome = crate::outcome::for_key(key, action);
                outcome.conflicts = conflicts;
                outcome.resource_version = resource_version;
                outcome.generation = generation;
                note_pins(&mut outcome, &entry.pinned);
                self.finish(key, outcome, false, now, out);
            }
            Decision::Apply {
                body,
                force,
                conflicts,
                claims_owned,
            } => {
                self.release_claims_if(claims_owned, key, out);
                let entry = self.entries.get_mut(key).expect("a key");
                entry.object_uid = view_uid;
                entry.phase = Phase::Applying {
                    version: entry.version,
                    stale,
                    conflicts,
                };
                out.push(Effect::Apply(ApplyRequest {
                    key: key.clone(),
                    body,
                    force,
                }));
            }
        }
    }

    /// Reads the object for `key`, whose plan needs what `missing` names: from now on the
    /// views keep what its document claims, and a view of another uid is read once only.
    fn read_for(&mut self, key: &DesiredKey, missing: Missing, stale: u32, out: &mut Vec<Effect>) {
        let entry = self.entries.get_mut(key).expect("a key");
        match missing {
            Missing::View => {}
            Missing::Incarnation => entry.uid_reread = true,
            Missing::Claimed(claimed) => {
                let held = self.objects.get_mut(&key.object).expect("an object");
                held.keep_managers.insert(key.field_manager.clone());
                held.claims.insert(key.clone(), claimed);
                out.push(Effect::Keep {
                    object: key.object.clone(),
                    keep: held.keep(),
                });
            }
        }
        entry.phase = Phase::Reading { stale };
        out.push(Effect::Read(key.object.clone()));
    }

    /// When the manager owns all its document claims (`owned`), the views need not keep its
    /// claims any more: what it owns is kept anyway.
    fn release_claims_if(&mut self, owned: bool, key: &DesiredKey, out: &mut Vec<Effect>) {
        let held = self.objects.get_mut(&key.object).expect("an object");
        if owned && held.claims.remove(key).is_some() {
            out.push(Effect::Keep {
                object: key.object.clone(),
                keep: held.keep(),
            });
        }
    }

    /// Gives back the slot and the object `key` holds, if it holds them, and makes it idle.
    fn free(&mut self, key: &DesiredKey) {
        if let Some(object) = self.objects.get_mut(&key.object)
            && object.busy.as_ref() == Some(key)
        {
            object.busy = None;
            self.running -= 1;
        }
        if let Some(entry) = self.entries.get_mut(key) {
            entry.phase = Phase::Idle;
        }
    }

    /// Gives back the slot and the object of `key`, which may not be applied now: it waits,
    /// ready, for the leadership to allow writes again (or stays idle, when no intent asks
    /// for it any more).
    fn hold(&mut self, key: &DesiredKey) {
        self.free(key);
        let entry = self.entries.get_mut(key).expect("a key");
        if entry.from_intent {
            set_phase(entry, &mut self.pending, Phase::Ready);
            self.ready.push_front(key.clone());
        }
    }

    /// Takes what the replica's Lease now says. Becoming a follower drops what intents asked
    /// for: every document follows the object from now on, and the submitters still waiting
    /// hear that nothing of theirs will be applied here.
    fn lead(&mut self, leadership: Leadership, out: &mut Vec<Effect>) {
        let was_follower = matches!(self.leadership, Leadership::Follower { .. });
        self.leadership = leadership;
        let Leadership::Follower { leader } = &self.leadership else {
            return;
        };
        if was_follower {
            return;
        }
        let refusal = not_leading(leader);
        self.ready.clear();
        for (key, entry) in &mut self.entries {
            entry.from_intent = false;
            entry.recheck = false;
            entry.not_older_than = None;
            entry.awaiting_view = None;
            if entry.phase.is_pending() {
                set_phase(entry, &mut self.pending, Phase::Idle);
            }
            if let Some(view) = self.objects.get(&key.object).and_then(|o| o.view.as_ref())
                && view.keeps(&key.field_manager)
            {
                entry.document = self
                    .documents
                    .store(key, &apply::owned_document(&view.object(), key));
            }
            for (_, ticket, _) in entry.waiters.drain(..) {
                out.push(Effect::Answer {
                    ticket,
                    outcome: crate::outcome::for_key(key, Action::error)
                        .with_message(refusal.clone()),
                });
            }
        }
        for object in self.objects.values_mut() {
            for parked in object.parked.drain(..) {
                out.push(Effect::Answer {
                    ticket: parked.ticket,
                    outcome: crate::outcome::for_key(&parked.intent.key, Action::error)
                        .with_message(refusal.clone()),
                });
            }
        }
    }

    fn applied(
        &mut self,
        key: &DesiredKey,
        result: Result<Arc<View>, ApplyError>,
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
        // Paths a 422 refuses as `null` that are not kept yet (see below).
        let new_nulls: Vec<FieldPath> = match &result {
            Err(ApplyError::Refused { code: 422, message }) => apply::null_refusals(message)
                .into_iter()
                .filter(|p| !entry.pinned.contains(p))
                .collect(),
            _ => Vec::new(),
        };
        match result {
            Ok(view) => {
                let action = if conflicts.is_empty() {
                    Action::applied
                } else {
                    Action::conflict
                };
                let mut outcome = crate::outcome::for_key(key, action);
                outcome.resource_version = view.metadata.resource_version.clone();
                outcome.generation = view.metadata.generation;
                note_pins(&mut outcome, &entry.pinned);
                // What was left out may be free on the object as the apply left it; the watch
                // never shows our own write as news, so plan once more on the answer.
                entry.recheck |= !conflicts.is_empty();
                outcome.conflicts = conflicts;
                // The apply made the manager the owner of what it claimed (unless a conflict
                // left some out): kept with its applies from now on, its claims need not be.
                let owned = self
                    .objects
                    .get(&key.object)
                    .and_then(|o| o.claims.get(key))
                    .is_some_and(|claimed| view.owned_covers(&key.field_manager, claimed));
                if self.take_view(&key.object, view) {
                    self.follow_view(&key.object, Some(key), now, out);
                }
                self.release_claims_if(owned, key, out);
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
            // The apply would leave `null` where the schema refuses it (a map another manager
            // owns, emptied of ours): keep our values there and apply the rest.
            Err(ApplyError::Refused { code: 422, .. }) if !new_nulls.is_empty() => {
                entry.pinned.extend(new_nulls);
                self.plan_or_read(key, stale, now, out);
            }
            Err(error) => {
                if error == ApplyError::NotFound
                    && let Some(object) = self.objects.get_mut(&key.object)
                {
                    object.view = None;
                }
                let action = error_action(&error);
                let retry = matches!(action, Action::error | Action::conflict);
                let outcome = crate::outcome::for_key(key, action)
                    .with_message(format!("{}: {error}", key.object));
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
        self.free(key);
        let entry = self.entries.get_mut(key).expect("a key");
        entry.uid_reread = false;
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut entry.waiters)
            .into_iter()
            .partition(|(v, _, _)| *v <= version);
        entry.waiters = waiting;
        for (_, ticket, kept) in done {
            let mut answer = outcome.clone();
            for path in kept {
                if !answer.kept.contains(&path) {
                    answer.kept.push(path);
                }
            }
            out.push(Effect::Answer {
                ticket,
                outcome: answer,
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
            let delay = backoff(&self.tuning, entry.failures, &mut self.jitter);
            self.queue(key, now + delay, true, now, out);
        } else if newer {
            let due = now + self.tuning.coalesce_window;
            self.queue(key, due, false, now, out);
        }
    }
}

fn set_phase(entry: &mut KeyState, pending: &mut usize, phase: Phase) {
    match (entry.phase.is_pending(), phase.is_pending()) {
        (false, true) => *pending += 1,
        (true, false) => *pending -= 1,
        _ => {}
    }
    entry.phase = phase;
}

/// Why an intent is refused, or a waiting one dropped, while another replica leads.
fn not_leading(leader: &str) -> String {
    format!("not applied: this replica stands by, {leader} leads (its applier applies)")
}

/// Tells, in an outcome, the paths kept because the API server refused to leave them `null`.
fn note_pins(outcome: &mut Outcome, pinned: &[FieldPath]) {
    if pinned.is_empty() {
        return;
    }
    outcome.kept = pinned.iter().map(ToString::to_string).collect();
    outcome.message = Some(format!(
        "kept {}: the API server refuses to leave it null while another manager owns it; \
         removed once that changes",
        outcome.kept.join(", ")
    ));
}

/// The action an error is answered with.
fn error_action(error: &ApplyError) -> Action {
    match error {
        ApplyError::Transient(_) => Action::error,
        ApplyError::Conflict(_) | ApplyError::Stale => Action::conflict,
        _ => Action::rejected,
    }
}

/// Whether `view` is older than the version an intent named: only a view whose version is
/// known and smaller. Without a view the plan reads the object anyway.
fn behind(view: Option<&View>, not_older_than: Option<u64>) -> bool {
    match (view.and_then(View::revision), not_older_than) {
        (Some(have), Some(wanted)) => have < wanted,
        _ => false,
    }
}

/// What [`Machine::await_view`] decided for a ready key.
#[derive(Debug, PartialEq)]
enum ViewWait {
    /// The view is new enough: plan.
    No,
    /// Queued until a newer view or the end of the wait.
    Queued,
    /// The wait ran out: read the object.
    RanOut,
}

/// True when `a` is a later view than `b`: another incarnation (uid), or a larger
/// resourceVersion. etcd revisions only grow, so for one object a larger number is newer;
/// an unparseable version counts as newest.
fn is_newer(a: &View, b: &View) -> bool {
    let version = |o: &View| o.revision().unwrap_or(u64::MAX);
    a.metadata.uid != b.metadata.uid || version(a) > version(b)
}

/// Exponential backoff with jitter: base * 2^(failures-1), capped, times 0.5 to 1.5.
pub(crate) fn backoff(tuning: &Tuning, failures: u32, jitter: &mut fastrand::Rng) -> Duration {
    let exp = tuning
        .backoff_base
        .saturating_mul(1u32 << failures.saturating_sub(1).min(20));
    exp.min(tuning.backoff_max).mul_f64(0.5 + jitter.f64())
}

#[cfg(test)]
mod stored_document_tests {
    use super::{DocumentDictionaries, StoredDocument};
    use crate::intent::{DesiredKey, ObjectRef};
    use serde_json::json;

    fn key(manager: &str, name: &str) -> DesiredKey {
        DesiredKey {
            object: ObjectRef {
                api_version: "controlplane.cluster.x-k8s.io/v1beta1".into(),
                kind: "CAPTControlPlane".into(),
                namespace: Some("tenant-a".into()),
                name: name.into(),
            },
            subresource: Some(crate::intent::Subresource::Status),
            field_manager: manager.into(),
        }
    }

    #[test]
    fn a_managers_documents_are_stored_against_one_another_and_read_back_whole() {
        let mut documents = DocumentDictionaries::default();
        let (mut alone, mut stored) = (0, 0);
        for i in 0..100 {
            let document = json!({"status": {"ready": true, "initialized": true,
                "controlPlaneEndpoint": {"host": format!("https://{i:x}.eks.amazonaws.com"), "port": 443},
                "conditions": [{"type": "Ready", "status": "True", "reason": "Provisioned"},
                               {"type": "EndpointReady", "status": "True", "reason": "Provisioned"}]}});
            let compact =
                documents.store(&key("capt-captcontrolplane", &format!("c{i}")), &document);
            assert_eq!(compact.value(), document);
            assert_eq!(compact, StoredDocument::new(&document));
            alone += StoredDocument::new(&document).0.compressed_len();
            stored += compact.0.compressed_len();
        }
        assert!(stored * 2 < alone, "{stored} stored, {alone} alone");
        // Another manager's documents have their own dictionary, and compare all the same.
        let other = documents.store(&key("capt-cluster", "c0"), &json!({"status": {"x": 1}}));
        assert_eq!(other, StoredDocument::new(&json!({"status": {"x": 1}})));
        assert_eq!(documents.0.len(), 2);
    }

    #[test]
    fn equal_documents_are_equal_texts_whatever_the_order_of_their_keys() {
        let written = json!({"status": {"b": 1, "a": {"d": [1.5, -2], "c": null}}});
        let read: serde_json::Value =
            serde_json::from_str(r#"{"status":{"a":{"c":null,"d":[1.5,-2]},"b":1}}"#).unwrap();
        assert_eq!(StoredDocument::new(&written), StoredDocument::new(&read));
        assert_eq!(StoredDocument::new(&written).value(), written);
        assert_ne!(
            StoredDocument::new(&written),
            StoredDocument::new(&json!({"status": {"b": 1.0, "a": {"d": [1.5, -2], "c": null}}}))
        );
    }
}
