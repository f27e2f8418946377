//! The engine: one desired document per (object, subresource, field manager), merged from
//! intents, applied by workers with server-side apply when it differs from what the
//! manager owns on the live object.
//!
//! A key is queued at most once: intents that arrive while its apply is pending or in flight
//! merge into the document, and the next apply carries them all (coalescing). Object changes
//! seen by the watches re-check the keys of that object, which retries conflicts and
//! restores drifted fields; the check itself sends nothing when nothing would change.

use crate::apply::{self, Attempt};
use crate::config::Policy;
use crate::conflict::{self, Conflict};
use crate::intent::{DesiredKey, ObjectRef, Subresource, ValidIntent};
use crate::live::Live;
use crate::merge::merge_fragment;
use crate::metrics::{Action, Metrics};
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::{info, warn};

/// Tuning of the engine.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How long a queued key waits for more intents before its apply: the apply starts once
    /// no intent arrived for this long (and at the latest after ten windows).
    pub coalesce_window: Duration,
    /// Apply an intent for a key that saw no intent for a window at once (a lone change pays
    /// no window; what arrives while that apply runs coalesces into the next one, so a burst
    /// becomes two applies). Off by default: the apply may then be planned on a cache that has
    /// not yet seen a write made just before the intent.
    pub apply_lone_intents_at_once: bool,
    /// Applies in flight at once (for different keys).
    pub max_concurrent_applies: usize,
    /// First retry delay after an API error; doubles per failure, with jitter.
    pub backoff_base: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// How long a submitter waiting for the outcome waits.
    pub wait_timeout: Duration,
    /// How many conflicts the conflicts endpoint remembers.
    pub conflict_history: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            coalesce_window: Duration::from_millis(10),
            apply_lone_intents_at_once: false,
            max_concurrent_applies: 16,
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(60),
            wait_timeout: Duration::from_secs(30),
            conflict_history: 256,
        }
    }
}

/// What became of an intent or an apply.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// `kind/namespace/name`.
    pub subject: String,
    /// The field manager.
    pub field_manager: String,
    /// The subresource.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subresource: Option<Subresource>,
    /// What happened.
    pub action: Action,
    /// Why, for anything but applied and unchanged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The object's resourceVersion after the apply.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Paths another owner wants with other values; left out of the apply.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<Conflict>,
    /// Protected paths the intent tried to remove; they keep their value.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<String>,
}

impl Outcome {
    /// An outcome of `action` for `key`.
    pub fn new(key: &DesiredKey, action: Action) -> Self {
        Self {
            subject: key.object.to_string(),
            field_manager: key.field_manager.clone(),
            subresource: key.subresource,
            action,
            message: None,
            resource_version: None,
            conflicts: Vec::new(),
            kept: Vec::new(),
        }
    }

    /// The same outcome with a message.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }
}

/// A conflict, as the conflicts endpoint lists it.
#[derive(Serialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct ConflictRecord {
    /// When it was seen (RFC 3339).
    pub time: String,
    /// The key of our document.
    #[serde(flatten)]
    pub key: DesiredKey,
    /// `local` (another of our managers) or `foreign`.
    pub owner_type: &'static str,
    /// The conflict.
    pub conflict: Conflict,
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

struct Entry {
    document: Value,
    /// False for a document rebuilt from managedFields that no intent of this process has
    /// touched yet: it follows the live object instead of correcting it (a standby replica,
    /// or a manager that moved to another applier, must not re-apply what it remembers).
    from_intent: bool,
    /// The intent's uid precondition, if it gave one.
    precondition: Option<String>,
    /// The uid of the live object last checked.
    object_uid: Option<String>,
    version: u64,
    queued: bool,
    in_flight: bool,
    retry_at: Option<Instant>,
    failures: u32,
    waiters: Vec<(u64, oneshot::Sender<Outcome>)>,
    /// When the last intent for the key arrived.
    last_intent: Option<Instant>,
    /// The queued apply is the first after a quiet window: it need not wait for another.
    apply_at_once: bool,
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
            queued: false,
            in_flight: false,
            retry_at: None,
            failures: 0,
            waiters: Vec::new(),
            last_intent: None,
            apply_at_once: false,
            last: None,
            reported: BTreeSet::new(),
        }
    }
}

#[derive(Default)]
struct State {
    entries: HashMap<DesiredKey, Entry>,
    by_object: HashMap<ObjectRef, BTreeSet<DesiredKey>>,
    conflicts: VecDeque<ConflictRecord>,
}

impl State {
    fn insert(&mut self, key: DesiredKey, entry: Entry) {
        self.by_object
            .entry(key.object.clone())
            .or_default()
            .insert(key.clone());
        self.entries.insert(key, entry);
    }
}

/// The engine. Cheap to share behind an `Arc`.
pub struct Engine {
    policy: Policy,
    settings: Settings,
    live: Live,
    metrics: Metrics,
    state: Mutex<State>,
    loading: Mutex<HashMap<DesiredKey, Arc<tokio::sync::Mutex<()>>>>,
    queue: mpsc::UnboundedSender<DesiredKey>,
    events: Option<kube::runtime::events::Recorder>,
}

impl Engine {
    /// Starts an engine and its workers on the current runtime.
    pub fn start(
        client: kube::Client,
        policy: Policy,
        settings: Settings,
        metrics: Metrics,
        events: bool,
    ) -> Arc<Self> {
        let (queue, queued) = mpsc::unbounded_channel();
        let (changes, changed) = mpsc::unbounded_channel();
        let recorder = events.then(|| {
            let reporter = kube::runtime::events::Reporter {
                controller: "status-applier".into(),
                instance: std::env::var("POD_NAME").ok(),
            };
            kube::runtime::events::Recorder::new(client.clone(), reporter)
        });
        let engine = Arc::new(Self {
            policy,
            settings,
            live: Live::new(client, changes),
            metrics,
            state: Mutex::default(),
            loading: Mutex::default(),
            queue,
            events: recorder,
        });
        tokio::spawn(engine.clone().run_queue(queued));
        tokio::spawn(engine.clone().run_changes(changed));
        engine
    }

    /// The live-object caches.
    pub fn live(&self) -> &Live {
        &self.live
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Starts watching a kind ahead of intents, so that documents of our managers are
    /// rebuilt from `managedFields` as soon as its objects are listed.
    pub async fn watch_kind(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<(), crate::error::ApplyError> {
        self.live.kind(api_version, kind).await.map(|_| ())
    }

    /// Merges an intent and, unless nothing changed, queues its apply. With `wait`, answers
    /// the outcome of the apply that carries it.
    pub async fn submit(self: &Arc<Self>, intent: ValidIntent, wait: bool) -> Outcome {
        let key = intent.key.clone();
        self.load(&key, intent.uid.as_deref()).await;
        let (outcome, waiter) = self.merge(intent, wait);
        self.metrics.intent(&key.field_manager, outcome.action);
        if outcome.action == Action::conflict {
            self.report(&key, &outcome.conflicts, true).await;
        }
        let Some(waiter) = waiter else { return outcome };
        match tokio::time::timeout(self.settings.wait_timeout, waiter).await {
            Ok(Ok(mut applied)) => {
                applied.kept = outcome.kept;
                applied
            }
            _ => outcome.with_message("no outcome within the wait timeout; the apply continues"),
        }
    }

    fn merge(
        &self,
        intent: ValidIntent,
        wait: bool,
    ) -> (Outcome, Option<oneshot::Receiver<Outcome>>) {
        let key = intent.key;
        let rules = self.policy.rules_for(&key.object.group_kind());
        let mut state = self.state.lock().expect("lock");
        let others: Vec<(String, Value)> = state.by_object[&key.object]
            .iter()
            .filter(|k| **k != key && k.subresource == key.subresource)
            .map(|k| (k.field_manager.clone(), state.entries[k].document.clone()))
            .collect();
        let entry = state.entries.get_mut(&key).expect("loaded");
        let now = Instant::now();
        let after_quiet = entry
            .last_intent
            .is_none_or(|at| now - at >= self.settings.coalesce_window);
        entry.last_intent = Some(now);
        let merged = merge_fragment(&entry.document, &intent.fragment, &rules, &intent.release);
        let mut outcome = Outcome::new(&key, Action::queued);
        outcome.kept = merged.kept.iter().map(ToString::to_string).collect();
        let others: Vec<(&str, &Value)> = others.iter().map(|(m, d)| (m.as_str(), d)).collect();
        let local = conflict::local(&merged.document, &others);
        if !local.is_empty() {
            outcome.action = Action::conflict;
            outcome.conflicts = local;
            return (outcome.with_message("refused before any request: another manager of this applier wants other values"), None);
        }
        let changed = merged.document != entry.document
            || (intent.uid.is_some() && intent.uid != entry.precondition);
        if !changed
            && !entry.queued
            && !entry.in_flight
            && let Some(last) = &entry.last
        {
            let mut answer = last.clone();
            answer.kept = outcome.kept;
            if matches!(answer.action, Action::applied | Action::queued) {
                answer.action = Action::unchanged;
            }
            return (answer, None);
        }
        entry.from_intent = true;
        if changed {
            entry.document = merged.document;
            entry.precondition = intent.uid.or(entry.precondition.take());
            entry.version += 1;
            entry.retry_at = None;
            entry.failures = 0;
        }
        if entry.queued || entry.in_flight {
            outcome.action = Action::coalesced;
            self.metrics
                .coalesced
                .get_or_create(&crate::metrics::ManagerLabel {
                    manager: key.field_manager.clone(),
                })
                .inc();
        } else {
            entry.queued = true;
            entry.apply_at_once = after_quiet && self.settings.apply_lone_intents_at_once;
            let _ = self.queue.send(key.clone());
        }
        let waiter = wait.then(|| {
            let (tx, rx) = oneshot::channel();
            entry.waiters.push((entry.version, tx));
            rx
        });
        (outcome, waiter)
    }

    /// Makes sure the key has a document: the one in memory, or else what its manager owns
    /// on the live object (after a restart, this is what keeps a partial intent from
    /// dropping fields). A document for another incarnation of the object is replaced.
    async fn load(&self, key: &DesiredKey, uid: Option<&str>) {
        {
            let state = self.state.lock().expect("lock");
            if let Some(entry) = state.entries.get(key)
                && (uid.is_none()
                    || entry.precondition.as_deref() == uid
                    || entry.precondition.is_none())
            {
                return;
            }
        }
        let owned = match self
            .live
            .kind(&key.object.api_version, &key.object.kind)
            .await
        {
            Ok(kind) => self.live.get(&kind, &key.object).await.ok().flatten(),
            Err(_) => None,
        };
        let (document, object_uid) = match owned {
            Some(live) if uid.is_none() || live.metadata.uid.as_deref() == uid => {
                (apply::owned_document(&live, key), live.metadata.uid.clone())
            }
            _ => (Value::Object(Default::default()), None),
        };
        let mut state = self.state.lock().expect("lock");
        let reload = state
            .entries
            .get(key)
            .is_none_or(|e| uid.is_some() && e.precondition.as_deref() != uid);
        if reload {
            let mut fresh = Entry::new(document, object_uid);
            if let Some(old) = state.entries.get_mut(key) {
                supersede(key, old, &mut fresh, uid);
            }
            state.insert(key.clone(), fresh);
        }
        drop(state);
        self.loading.lock().expect("lock").remove(key);
    }

    async fn run_queue(self: Arc<Self>, mut queued: mpsc::UnboundedReceiver<DesiredKey>) {
        let permits = Arc::new(Semaphore::new(self.settings.max_concurrent_applies));
        while let Some(key) = queued.recv().await {
            let permit = permits.clone().acquire_owned().await.expect("never closed");
            let engine = self.clone();
            tokio::spawn(async move {
                engine.process(key).await;
                drop(permit);
            });
        }
    }

    async fn process(self: &Arc<Self>, key: DesiredKey) {
        self.quiet(&key).await;
        let Some((document, precondition, version)) = self.take(&key) else {
            return;
        };
        let started = Instant::now();
        let attempt = apply::attempt(
            &self.live,
            &self.policy,
            &self.metrics,
            &key,
            &document,
            precondition.as_deref(),
        )
        .await;
        self.metrics
            .apply_duration
            .get_or_create(&crate::metrics::ManagerLabel {
                manager: key.field_manager.clone(),
            })
            .observe(started.elapsed().as_secs_f64());
        self.metrics
            .applied(&key.field_manager, attempt.outcome.action);
        if !attempt.outcome.conflicts.is_empty() {
            self.report(&key, &attempt.outcome.conflicts, false).await;
        }
        self.finish(&key, version, attempt);
    }

    /// Waits until no intent for `key` has arrived for one coalescing window (at most ten
    /// windows), so a burst becomes one apply.
    async fn quiet(&self, key: &DesiredKey) {
        let window = self.settings.coalesce_window;
        let at_once = self
            .state
            .lock()
            .expect("lock")
            .entries
            .get_mut(key)
            .is_some_and(|e| std::mem::take(&mut e.apply_at_once));
        if window.is_zero() || at_once {
            return;
        }
        let version = || {
            self.state
                .lock()
                .expect("lock")
                .entries
                .get(key)
                .map(|e| e.version)
        };
        let deadline = Instant::now() + window * 10;
        let mut seen = version();
        loop {
            tokio::time::sleep(window).await;
            let now = version();
            if now == seen || Instant::now() >= deadline {
                return;
            }
            seen = now;
        }
    }

    /// Takes a queued key's document for an apply, unless it must wait for its backoff.
    fn take(self: &Arc<Self>, key: &DesiredKey) -> Option<(Value, Option<String>, u64)> {
        let mut state = self.state.lock().expect("lock");
        let entry = state.entries.get_mut(key)?;
        entry.queued = false;
        if let Some(at) = entry.retry_at
            && at > Instant::now()
        {
            self.retry_later(key.clone(), at);
            return None;
        }
        entry.in_flight = true;
        self.metrics
            .pending
            .set(state.entries.values().filter(|e| e.queued).count() as i64);
        let entry = state.entries.get(key)?;
        Some((
            entry.document.clone(),
            entry.precondition.clone(),
            entry.version,
        ))
    }

    fn finish(self: &Arc<Self>, key: &DesiredKey, version: u64, attempt: Attempt) {
        let mut state = self.state.lock().expect("lock");
        let Some(entry) = state.entries.get_mut(key) else {
            return;
        };
        entry.in_flight = false;
        if attempt.object_uid.is_some() {
            entry.object_uid = attempt.object_uid;
        }
        let outcome = attempt.outcome;
        let (ready, waiting) = std::mem::take(&mut entry.waiters)
            .into_iter()
            .partition(|(v, _)| *v <= version);
        entry.waiters = waiting;
        for (_, tx) in ready {
            let _ = tx.send(outcome.clone());
        }
        if outcome.action == Action::error || attempt.retry {
            entry.failures += 1;
            let delay = backoff(&self.settings, entry.failures);
            entry.retry_at = Some(Instant::now() + delay);
            if outcome.action == Action::error {
                self.retry_later(key.clone(), Instant::now() + delay);
            }
        } else if outcome.conflicts.is_empty() {
            entry.failures = 0;
            entry.retry_at = None;
            entry.reported.clear();
        }
        entry.last = Some(outcome);
        if entry.version > version && !entry.queued {
            entry.queued = true;
            let _ = self.queue.send(key.clone());
        }
    }

    fn retry_later(self: &Arc<Self>, key: DesiredKey, at: Instant) {
        let engine = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            engine.requeue(&key);
        });
    }

    fn requeue(&self, key: &DesiredKey) {
        let mut state = self.state.lock().expect("lock");
        if let Some(entry) = state.entries.get_mut(key)
            && !entry.queued
            && !entry.in_flight
        {
            entry.queued = true;
            let _ = self.queue.send(key.clone());
        }
    }

    async fn run_changes(self: Arc<Self>, mut changed: mpsc::UnboundedReceiver<ObjectRef>) {
        while let Some(object) = changed.recv().await {
            let keys: Vec<DesiredKey> = {
                let state = self.state.lock().expect("lock");
                state
                    .by_object
                    .get(&object)
                    .map(|k| k.iter().cloned().collect())
                    .unwrap_or_default()
            };
            let (intended, remembered): (Vec<DesiredKey>, Vec<DesiredKey>) = {
                let state = self.state.lock().expect("lock");
                keys.iter()
                    .cloned()
                    .partition(|k| state.entries.get(k).is_some_and(|e| e.from_intent))
            };
            for key in &intended {
                self.requeue(key);
            }
            if !remembered.is_empty() {
                self.refresh(&object, &remembered).await;
            }
            if !self.policy.allowed_managers.is_empty() {
                self.rebuild(&object, &keys).await;
            }
        }
    }

    /// Takes the live values of documents no intent has touched yet.
    async fn refresh(&self, object: &ObjectRef, keys: &[DesiredKey]) {
        let Ok(kind) = self.live.kind(&object.api_version, &object.kind).await else {
            return;
        };
        let Ok(Some(live)) = self.live.get(&kind, object).await else {
            return;
        };
        let mut state = self.state.lock().expect("lock");
        for key in keys {
            if let Some(entry) = state.entries.get_mut(key).filter(|e| !e.from_intent) {
                entry.document = apply::owned_document(&live, key);
                entry.object_uid = live.metadata.uid.clone();
            }
        }
    }

    /// Rebuilds the documents of our managers that own fields of `object` and have none in
    /// memory (after a restart).
    async fn rebuild(&self, object: &ObjectRef, known: &[DesiredKey]) {
        let Ok(kind) = self.live.kind(&object.api_version, &object.kind).await else {
            return;
        };
        let Ok(Some(live)) = self.live.get(&kind, object).await else {
            return;
        };
        for (manager, subresource) in apply::our_apply_entries(&live, &self.policy.allowed_managers)
        {
            let key = DesiredKey {
                object: object.clone(),
                subresource,
                field_manager: manager,
            };
            if known.contains(&key) {
                continue;
            }
            let document = apply::owned_document(&live, &key);
            let mut state = self.state.lock().expect("lock");
            if !state.entries.contains_key(&key) {
                info!(subject = %key.object, manager = key.field_manager, "Rebuilt desired document from managedFields");
                let mut entry = Entry::new(document, live.metadata.uid.clone());
                entry.last = Some(
                    Outcome::new(&key, Action::unchanged)
                        .with_message("rebuilt from managedFields"),
                );
                state.insert(key, entry);
            }
        }
    }

    async fn report(&self, key: &DesiredKey, conflicts: &[Conflict], local: bool) {
        let fresh: Vec<Conflict> = {
            let mut state = self.state.lock().expect("lock");
            let fresh: Vec<Conflict> = match state.entries.get_mut(key) {
                Some(entry) => conflicts
                    .iter()
                    .filter(|c| entry.reported.insert(format!("{}@{}", c.path, c.owner)))
                    .cloned()
                    .collect(),
                None => conflicts.to_vec(),
            };
            for c in &fresh {
                state.conflicts.push_back(ConflictRecord {
                    time: jiff::Timestamp::now().to_string(),
                    key: key.clone(),
                    owner_type: if local { "local" } else { "foreign" },
                    conflict: c.clone(),
                });
            }
            while state.conflicts.len() > self.settings.conflict_history {
                state.conflicts.pop_front();
            }
            fresh
        };
        for c in &fresh {
            self.metrics.conflict(&key.field_manager, &c.path, local);
            warn!(subject = %key.object, manager = key.field_manager, path = c.path, owner = c.owner,
                  operation = c.operation, "Conflict with another owner; not forced");
        }
        if !fresh.is_empty() && !local {
            self.publish_event(key, &fresh).await;
        }
    }

    async fn publish_event(&self, key: &DesiredKey, conflicts: &[Conflict]) {
        let Some(recorder) = &self.events else { return };
        let uid = self
            .state
            .lock()
            .expect("lock")
            .entries
            .get(key)
            .and_then(|e| e.object_uid.clone());
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(key.object.api_version.clone()),
            kind: Some(key.object.kind.clone()),
            name: Some(key.object.name.clone()),
            namespace: key.object.namespace.clone(),
            uid,
            ..Default::default()
        };
        let paths: Vec<String> = conflicts
            .iter()
            .map(|c| format!("{} (owned by {})", c.path, c.owner))
            .collect();
        let event = kube::runtime::events::Event {
            type_: kube::runtime::events::EventType::Warning,
            reason: "FieldConflict".into(),
            note: Some(format!(
                "{}: not applied, another owner holds other values: {}",
                key.field_manager,
                paths.join(", ")
            )),
            action: "Apply".into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &reference).await {
            warn!(subject = %key.object, error = %e, "Could not publish the conflict event");
        }
    }

    /// Every desired document.
    pub fn desired(&self) -> Vec<DesiredView> {
        let state = self.state.lock().expect("lock");
        let mut views: Vec<DesiredView> = state
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

    /// The most recent conflicts, oldest first.
    pub fn conflicts(&self) -> Vec<ConflictRecord> {
        self.state
            .lock()
            .expect("lock")
            .conflicts
            .iter()
            .cloned()
            .collect()
    }
}

/// Replaces the document of an older incarnation of the object with `fresh`: the old
/// intents' waiting submitters hear that theirs were dropped (`rejected`, like any intent for
/// a recreated object), and the key keeps its queue state and version count, so that it is
/// never queued twice and an old apply still in flight answers none of the new waiters.
fn supersede(key: &DesiredKey, old: &mut Entry, fresh: &mut Entry, uid: Option<&str>) {
    fresh.version = old.version;
    fresh.queued = old.queued;
    fresh.in_flight = old.in_flight;
    let dropped = Outcome::new(key, Action::rejected).with_message(format!(
        "uid precondition failed: the object was recreated (uid {}), and an intent for the \
         new incarnation replaced this one before it was applied",
        uid.unwrap_or("unknown")
    ));
    for (_, tx) in old.waiters.drain(..) {
        let _ = tx.send(dropped.clone());
    }
}

/// Exponential backoff with jitter: base * 2^(failures-1), capped, times 0.5 to 1.5.
fn backoff(settings: &Settings, failures: u32) -> Duration {
    let exp = settings
        .backoff_base
        .saturating_mul(1u32 << failures.saturating_sub(1).min(20));
    exp.min(settings.backoff_max).mul_f64(0.5 + fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_failure_with_jitter_and_stops_at_the_cap() {
        let settings = Settings {
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(60),
            ..Settings::default()
        };
        for _ in 0..100 {
            let first = backoff(&settings, 1);
            assert!(
                first >= Duration::from_millis(100) && first <= Duration::from_millis(300),
                "{first:?}"
            );
            let fourth = backoff(&settings, 4);
            assert!(
                fourth >= Duration::from_millis(800) && fourth <= Duration::from_millis(2400),
                "{fourth:?}"
            );
            let capped = backoff(&settings, 40);
            assert!(
                capped >= Duration::from_secs(30) && capped <= Duration::from_secs(90),
                "{capped:?}"
            );
        }
    }
}
