//! The engine's driver: feeds events to the [`Machine`] and carries out its effects (reads,
//! applies, answers, timers, reports). It decides nothing itself.

use super::Tuning;
use super::events::{ApplyRequest, Count, DesiredView, Effect, Event, Ticket};
use super::machine::Machine;
use crate::config::Policy;
use crate::conflict::Conflict;
use crate::error::ApplyError;
use crate::intent::{DesiredKey, ObjectRef, Subresource, ValidIntent};
use crate::live::{Change, Live};
use crate::metrics::{Action, CodeLabel, ManagerAction, ManagerLabel, ManagerWaitEnd, Metrics};
use crate::outcome::Outcome;
use crate::view::View;
use kube::api::{Patch, PatchParams};
use leadership::{Leadership, LeaseToFollow};
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

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

/// The engine. Cheap to share behind an `Arc`.
pub struct Engine {
    policy: Arc<Policy>,
    tuning: Tuning,
    live: Live,
    metrics: Metrics,
    machine: Mutex<Machine>,
    tickets: Mutex<HashMap<Ticket, oneshot::Sender<Outcome>>>,
    next_ticket: AtomicU64,
    conflicts: Mutex<VecDeque<ConflictRecord>>,
    events: Option<kube::runtime::events::Recorder>,
    /// This process, as its answers name it ([`Engine::instance`]).
    instance: String,
}

impl Engine {
    /// Starts an engine on the current runtime.
    pub fn start(
        client: kube::Client,
        policy: Policy,
        tuning: Tuning,
        metrics: Metrics,
        events: bool,
        scope: crate::live::WatchScope,
    ) -> Arc<Self> {
        let (changes, changed) = mpsc::unbounded_channel();
        let recorder = events.then(|| {
            let reporter = kube::runtime::events::Reporter {
                controller: "status-applier".into(),
                instance: std::env::var("POD_NAME").ok(),
            };
            kube::runtime::events::Recorder::new(client.clone(), reporter)
        });
        let policy = Arc::new(policy);
        let health = diagnostics::WatchHealth::new(metrics.watch_failures.clone());
        let live = Live::new(client, changes, &policy.allowed_managers, scope, health);
        let engine = Arc::new(Self {
            machine: Mutex::new(Machine::new(
                policy.clone(),
                tuning.clone(),
                fastrand::u64(..),
            )),
            policy,
            tuning,
            live,
            metrics,
            tickets: Mutex::default(),
            next_ticket: AtomicU64::new(1),
            conflicts: Mutex::default(),
            events: recorder,
            instance: format!("{:016x}", fastrand::u64(..)),
        });
        tokio::spawn(engine.clone().run_changes(changed));
        engine
    }

    /// The live-object caches.
    pub fn live(&self) -> &Live {
        &self.live
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// This process: a random id made when the engine started, which every answer to an
    /// intent carries (`Outcome::instance`) and `GET /v1/instance` tells. What the engine
    /// holds in memory alone (the documents of intents answered with a conflict or a
    /// rejection, which a restart rebuilds from `managedFields` without what was never
    /// applied) is gone when it changes: a submitter that sees another id sends those again.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Starts watching a kind ahead of intents, so that documents of our managers are
    /// rebuilt from `managedFields` as soon as its objects are listed.
    pub async fn watch_kind(&self, api_version: &str, kind: &str) -> Result<(), ApplyError> {
        self.live.kind(api_version, kind).await.map(|_| ())
    }

    /// From now on writes only while this replica leads, as `lease` says
    /// ([`leadership`]); without a call the engine always writes. Nothing is applied
    /// until the Lease has been read.
    pub fn follow_lease(self: &Arc<Self>, lease: LeaseToFollow) {
        let start = Instant::now();
        self.feed(Event::Leadership(Leadership::Until(start)));
        self.metrics.leading.set(0);
        let engine = self.clone();
        tokio::spawn(async move {
            let client = engine.live.client().clone();
            let tell = |leadership: Leadership| {
                if let Leadership::Until(until) = leadership {
                    engine.expire_at(until);
                } else {
                    engine.metrics.leading.set(0);
                }
                engine.feed(Event::Leadership(leadership));
            };
            leadership::follow(client, lease, tell).await;
        });
    }

    /// Keeps the `leading` gauge true until `until`, when the writes stop by themselves.
    fn expire_at(self: &Arc<Self>, until: Instant) {
        let leading = Instant::now() < until;
        self.metrics.leading.set(i64::from(leading));
        if leading {
            let engine = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(until.into()).await;
                // Renewed meanwhile: a later call set it again, and this one is stale.
                if !engine
                    .machine
                    .lock()
                    .expect("lock")
                    .may_write(Instant::now())
                {
                    engine.metrics.leading.set(0);
                }
            });
        }
    }

    /// Merges an intent and, unless nothing changed, queues its apply. With `wait`, answers
    /// the outcome of the apply that carries it; when none comes within the wait timeout,
    /// `queued`, which says no more than that: the intent is kept and not applied yet (the
    /// apply goes on, its outcome unknown to this submitter).
    pub async fn submit(self: &Arc<Self>, intent: ValidIntent, wait: bool) -> Outcome {
        let key = intent.key.clone();
        let view = self.view_for(&intent).await;
        let (tx, rx) = oneshot::channel();
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        self.tickets.lock().expect("lock").insert(ticket, tx);
        self.feed(Event::Intent {
            intent,
            ticket,
            wait,
            view,
        });
        let mut outcome = match tokio::time::timeout(self.tuning.wait_timeout, rx).await {
            Ok(Ok(outcome)) => outcome,
            _ => {
                self.tickets.lock().expect("lock").remove(&ticket);
                crate::outcome::for_key(&key, Action::queued)
                    .with_message("no outcome within the wait timeout; the apply continues")
            }
        };
        outcome.instance = Some(self.instance.clone());
        outcome
    }

    /// The object as the cache holds it, if it does; the machine decides whether to read it
    /// (nobody has it, or the intent names a uid the cache has not seen).
    async fn view_for(&self, intent: &ValidIntent) -> Result<Option<Arc<View>>, ApplyError> {
        let object = &intent.key.object;
        let kind = self.live.kind(&object.api_version, &object.kind).await?;
        Ok(self.live.cached(&kind, object))
    }

    /// Every desired document.
    pub fn desired(&self) -> Vec<DesiredView> {
        self.machine.lock().expect("lock").desired()
    }

    /// The most recent conflicts, oldest first.
    pub fn conflicts(&self) -> Vec<ConflictRecord> {
        self.conflicts
            .lock()
            .expect("lock")
            .iter()
            .cloned()
            .collect()
    }

    fn feed(self: &Arc<Self>, event: Event) {
        let effects = {
            let mut machine = self.machine.lock().expect("lock");
            let effects = machine.handle(event, Instant::now());
            self.metrics.pending.set(machine.pending() as i64);
            effects
        };
        for effect in effects {
            self.carry_out(effect);
        }
    }

    fn carry_out(self: &Arc<Self>, effect: Effect) {
        match effect {
            Effect::Read(object) => {
                let engine = self.clone();
                tokio::spawn(async move { engine.read(object).await });
            }
            Effect::Apply(request) => {
                let engine = self.clone();
                tokio::spawn(async move { engine.apply(request).await });
            }
            Effect::Answer { ticket, outcome } => {
                if let Some(tx) = self.tickets.lock().expect("lock").remove(&ticket) {
                    let _ = tx.send(outcome);
                }
            }
            Effect::WakeAt { key, at } => {
                let engine = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep_until(at.into()).await;
                    engine.feed(Event::Timer(key));
                });
            }
            Effect::Report {
                key,
                conflicts,
                local,
                object_uid,
            } => self.report(key, conflicts, local, object_uid),
            Effect::Counted(count) => self.count(count),
            Effect::Keep { object, keep } => self.live.keep(object, &keep),
            Effect::Forget(object) => self.live.forget(&object),
        }
    }

    async fn read(self: Arc<Self>, object: ObjectRef) {
        let found = match self.live.kind(&object.api_version, &object.kind).await {
            Ok(kind) => self.live.reread(&kind, &object).await,
            Err(e) => Err(e),
        };
        let event = match found {
            Ok(Some(view)) => Event::Observed { object, view },
            Ok(None) => {
                // The API server answered 404.
                self.api_error(&ApplyError::NotFound);
                Event::Gone(object)
            }
            Err(error) => {
                self.api_error(&error);
                Event::ReadFailed { object, error }
            }
        };
        self.feed(event);
    }

    async fn apply(self: Arc<Self>, request: ApplyRequest) {
        let ApplyRequest { key, body, force } = request;
        let label = ManagerLabel {
            manager: key.field_manager.clone(),
        };
        self.metrics.writes.get_or_create(&label).inc();
        let started = Instant::now();
        let result = self.send(&key, body, force).await;
        self.metrics
            .apply_duration
            .get_or_create(&label)
            .observe(started.elapsed().as_secs_f64());
        if let Err(error) = &result {
            self.api_error(error);
            match error {
                ApplyError::Stale | ApplyError::Conflict(_) | ApplyError::UidMismatch { .. } => {
                    debug!(subject = %key.object, manager = key.field_manager, %error, "Apply refused on an outdated view; reading the object again")
                }
                _ => {
                    warn!(subject = %key.object, manager = key.field_manager, %error, "Apply did not happen")
                }
            }
        }
        self.feed(Event::Applied { key, result });
    }

    async fn send(
        &self,
        key: &DesiredKey,
        body: serde_json::Value,
        force: bool,
    ) -> Result<Arc<View>, ApplyError> {
        let kind = self
            .live
            .kind(&key.object.api_version, &key.object.kind)
            .await?;
        let api = kind.api(self.live.client(), key.object.namespace.as_deref());
        let params = PatchParams {
            field_manager: Some(key.field_manager.clone()),
            force,
            ..PatchParams::default()
        };
        let patch = Patch::Apply(body);
        let answered = match key.subresource {
            Some(Subresource::Status) => api.patch_status(&key.object.name, &params, &patch).await,
            None => api.patch(&key.object.name, &params, &patch).await,
        }
        .map_err(ApplyError::from_kube)?;
        self.live
            .observe(&kind, answered)
            .ok_or_else(|| ApplyError::Transient("the answered object was not cached".into()))
    }

    async fn run_changes(self: Arc<Self>, mut changed: mpsc::UnboundedReceiver<Change>) {
        while let Some((object, view)) = changed.recv().await {
            self.feed(match view {
                Some(view) => Event::Observed { object, view },
                None => Event::Gone(object),
            });
        }
    }

    fn count(&self, count: Count) {
        match count {
            Count::Intent(manager, action) => self.metrics.intent(&manager, action),
            Count::Coalesced(manager) => {
                self.metrics
                    .coalesced
                    .get_or_create(&ManagerLabel { manager })
                    .inc();
            }
            Count::ViewWait(manager, end) => {
                self.metrics
                    .view_waits
                    .get_or_create(&ManagerWaitEnd { manager, end })
                    .inc();
            }
            Count::Attempt(manager, action) => {
                self.metrics
                    .applies
                    .get_or_create(&ManagerAction { manager, action })
                    .inc();
            }
        }
    }

    fn api_error(&self, error: &ApplyError) {
        self.metrics
            .api_errors
            .get_or_create(&CodeLabel {
                code: error.code().into(),
            })
            .inc();
    }

    fn report(
        self: &Arc<Self>,
        key: DesiredKey,
        conflicts: Vec<Conflict>,
        local: bool,
        object_uid: Option<String>,
    ) {
        {
            let mut history = self.conflicts.lock().expect("lock");
            for c in &conflicts {
                history.push_back(ConflictRecord {
                    time: jiff::Timestamp::now().to_string(),
                    key: key.clone(),
                    owner_type: if local { "local" } else { "foreign" },
                    conflict: c.clone(),
                });
            }
            while history.len() > self.tuning.conflict_history {
                history.pop_front();
            }
        }
        for c in &conflicts {
            self.metrics.conflict(&key.field_manager, &c.path, local);
            warn!(subject = %key.object, manager = key.field_manager, path = c.path, owner = c.owner,
                  operation = c.operation, "Conflict with another owner; not forced");
        }
        if !local && self.events.is_some() {
            let engine = self.clone();
            tokio::spawn(async move { engine.publish_event(&key, &conflicts, object_uid).await });
        }
    }

    async fn publish_event(&self, key: &DesiredKey, conflicts: &[Conflict], uid: Option<String>) {
        let Some(recorder) = &self.events else { return };
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
}
