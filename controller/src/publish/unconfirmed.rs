//! The intents whose outcome lives in the status-applier's memory alone, and their delivery
//! again until it does not.
//!
//! An intent answered `queued` (kept, not applied within the applier's wait timeout) or not
//! answered at all (the applier died with the request in flight) lives only in the memory of
//! an applier that may be gone: the publisher remembers its fragment as delivered and sends
//! nothing while the fragment is unchanged, so an applier that dies then would lose it until
//! the fragment changes. So each such intent is kept here, one per (object, subresource,
//! manager), and sent again until the applier answers with what its apply did.
//!
//! An intent answered with a conflict (409) or a refusal (422) is in the same place: the
//! applier keeps its document and reports the conflict (its log, metric, Event and
//! `/v1/conflicts`), but a restarted applier rebuilds its documents from `managedFields`,
//! which hold nothing of what was never applied, and would not meet the conflict again until
//! the fragment changes. So such an intent *stands* here with the applier process that
//! answered it (`Outcome::instance`); while any stands, the applier is asked every
//! [`PROBE_PERIOD`] which process it is (`GET /v1/instance`, and only then), and every
//! intent answered by another process is sent again: the new applier meets the conflict,
//! reports it, and the intent stands again with its id. An applied or unchanged intent, or
//! one answered by an applier that does not say which process it is, leaves nothing here.
//!
//! Sending the same intent again is how the publisher both learns the outcome and survives a
//! restart: a live applier merges an identical fragment into the document it has (no change)
//! and answers when its pending apply ends, or at once with its last outcome; a restarted one
//! takes it as new and applies it. A re-send waits for the outcome like any intent, so an
//! applier that is merely slow paces the re-sends by its own wait timeout; one that cannot be
//! reached is asked again with a backoff.
//!
//! What is kept stays bounded: one intent per key, replaced by a newer publication of the key,
//! forgotten once an outcome settles it or the object is deleted. At rest with no conflict
//! this is empty, and nothing is sent or asked.
//!
//! [`State`] decides (pure, with the time given); [`redeliver`] carries out its [`Step`]s.

use super::Digest;
use crate::write_loops::{ObjectId, WriteId};
use futures::StreamExt;
use status_applier_api::client::ClientError;
use status_applier_api::{Action, Intent, Outcome};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How many intents are sent again at once (as many as reconciles of one controller run).
const AT_ONCE: usize = 8;
/// The shortest pause between two rounds of re-sends: an applier answering `queued` at once
/// (a wait timeout of zero) is not asked in a busy loop.
const PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two rounds while the applier cannot be reached.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often the applier is asked which process it is while an intent stands.
pub(super) const PROBE_PERIOD: Duration = Duration::from_secs(5);

/// What an answer to a sent intent means for keeping it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// The applier applied it, or found it in place (or answered a conflict or a refusal
    /// without saying which process it is): nothing to keep.
    Settled,
    /// A conflict or a refusal, which the applier process `instance` holds in memory alone:
    /// kept, and sent again once another process answers.
    Stands(String),
    /// Kept by the applier, not applied yet: ask again.
    Queued,
    /// No answer (the applier is gone or restarting), or it failed to act (503): ask again
    /// after a backoff.
    Unanswered,
    /// Refused as a bad intent (4xx): asking again would be refused again.
    Refused,
}

impl Answer {
    /// What the result of [`status_applier_api::Client::send`] means.
    pub(super) fn of(result: &Result<Outcome, ClientError>) -> Self {
        match result {
            Ok(outcome) => match (outcome.action, &outcome.instance) {
                (Action::queued, _) => Self::Queued,
                (Action::conflict | Action::rejected, Some(instance)) => {
                    Self::Stands(instance.clone())
                }
                _ => Self::Settled,
            },
            Err(ClientError::Refused { status, .. }) if (400..500).contains(status) => {
                Self::Refused
            }
            Err(_) => Self::Unanswered,
        }
    }

    /// Whether the intent must be kept: to be sent again, or to stand.
    pub(super) fn kept(&self) -> bool {
        !matches!(self, Self::Settled | Self::Refused)
    }
}

/// Where a kept intent is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    /// To be sent again in the next round.
    Due,
    /// Being sent again: a newer publication of the key waits for it.
    Sending,
    /// Answered with a conflict or a refusal by the applier process named: sent again once
    /// another answers `GET /v1/instance`.
    Standing(String),
}

/// An intent kept until an outcome settles it.
struct Entry {
    intent: Intent,
    /// What the publisher remembers the intent by, to tell it apart from a newer one.
    digest: Digest,
    phase: Phase,
}

/// What the task that sends the kept intents again does next.
#[derive(Debug, PartialEq)]
pub(super) enum Step {
    /// Send these again (each now [`Phase::Sending`]), then report each answer to
    /// [`State::resent`].
    Send(Vec<(WriteId, Digest, Intent)>),
    /// Ask the applier which process it is, and tell [`State::probed`].
    Probe,
    /// Nothing to send before this time, when the next probe is due; an intent kept to be
    /// sent again meanwhile ends the wait ([`Unconfirmed::keep`] wakes the task).
    WaitUntil(Instant),
    /// Nothing is kept: the task ends (the next [`State::keep`] starts one).
    Done,
}

/// The kept intents, one per key, and what is due: every decision, with no clock or client.
#[derive(Default)]
pub(super) struct State {
    entries: HashMap<WriteId, Entry>,
    /// A task carries out the steps ([`redeliver`]); it ends at [`Step::Done`].
    running: bool,
    /// When the applier is asked next which process it is: set while an intent stands.
    probe_at: Option<Instant>,
}

impl State {
    /// Keeps `intent`, sent for `key` and answered as `answer` says (one that is
    /// [`Answer::kept`]). True when no task carries out the steps yet: the caller starts one.
    #[must_use]
    pub(super) fn keep(
        &mut self,
        key: WriteId,
        intent: Intent,
        digest: Digest,
        answer: &Answer,
    ) -> bool {
        let phase = match answer {
            Answer::Stands(instance) => Phase::Standing(instance.clone()),
            _ => Phase::Due,
        };
        let entry = Entry {
            intent,
            digest,
            phase,
        };
        self.entries.insert(key, entry);
        !std::mem::replace(&mut self.running, true)
    }

    /// Makes way for a newer publication of `key`, which replaces what is kept for it: false
    /// while a re-send of the older is in flight (the applier must never take the older
    /// after the newer; ask again once it ended), else true, the older forgotten.
    pub(super) fn supersede(&mut self, key: &WriteId) -> bool {
        match self.entries.get(key) {
            Some(entry) if entry.phase == Phase::Sending => false,
            Some(_) => {
                self.entries.remove(key);
                true
            }
            None => true,
        }
    }

    /// Forgets what is kept for an object, which was deleted.
    pub(super) fn forget(&mut self, object: ObjectId) {
        self.entries.retain(|k, _| k.object != object);
    }

    /// What to do next, at `now`.
    pub(super) fn next(&mut self, now: Instant) -> Step {
        if self.entries.is_empty() {
            self.running = false;
            self.probe_at = None;
            return Step::Done;
        }
        let standing = self
            .entries
            .values()
            .any(|e| matches!(e.phase, Phase::Standing(_)));
        self.probe_at = standing.then(|| self.probe_at.unwrap_or(now + PROBE_PERIOD));
        if let Some(at) = self.probe_at
            && at <= now
        {
            return Step::Probe;
        }
        let round: Vec<_> = (self.entries.iter_mut())
            .filter(|(_, e)| !matches!(e.phase, Phase::Standing(_)))
            .map(|(key, entry)| {
                entry.phase = Phase::Sending;
                (*key, entry.digest, entry.intent.clone())
            })
            .collect();
        // Kept and none due: every one stands, and the next probe is set.
        match (round.is_empty(), self.probe_at) {
            (true, Some(at)) => Step::WaitUntil(at),
            _ => Step::Send(round),
        }
    }

    /// Records what became of a re-send of the intent `digest` of `key`: forgotten when it
    /// settled, kept otherwise (unless a deletion forgot it meanwhile, and a newer
    /// publication took its place).
    pub(super) fn resent(&mut self, key: &WriteId, digest: &Digest, answer: &Answer) {
        if let Some(entry) = self.entries.get_mut(key)
            && &entry.digest == digest
        {
            match answer {
                Answer::Stands(instance) => entry.phase = Phase::Standing(instance.clone()),
                Answer::Queued | Answer::Unanswered => entry.phase = Phase::Due,
                Answer::Settled | Answer::Refused => {
                    self.entries.remove(key);
                }
            }
        }
    }

    /// Records the applier's answer to a probe at `now`: `Some(instance)`, the process that
    /// answers now; `None`, no answer. Every intent standing with another process is due to
    /// be sent again; how many is returned. The next probe is [`PROBE_PERIOD`] later.
    pub(super) fn probed(&mut self, instance: Option<&str>, now: Instant) -> usize {
        self.probe_at = Some(now + PROBE_PERIOD);
        let Some(instance) = instance else { return 0 };
        let mut due = 0;
        for entry in self.entries.values_mut() {
            if matches!(&entry.phase, Phase::Standing(by) if by != instance) {
                entry.phase = Phase::Due;
                due += 1;
            }
        }
        due
    }

    /// How many intents are kept.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// How many of them stand (answered with a conflict or a refusal).
    #[cfg(test)]
    pub(super) fn standing(&self) -> usize {
        let standing = |e: &&Entry| matches!(e.phase, Phase::Standing(_));
        self.entries.values().filter(standing).count()
    }

    /// Whether the intent kept for `key`, if any, is the one remembered by `digest`.
    #[cfg(test)]
    pub(super) fn holds(&self, key: &WriteId, digest: &Digest) -> bool {
        (self.entries.get(key)).is_some_and(|e| &e.digest == digest)
    }
}

/// The kept intents, shared by the publisher and the task that sends them again.
#[derive(Default)]
pub(super) struct Unconfirmed {
    state: Mutex<State>,
    /// Told whenever a re-send ends.
    resent: Notify,
    /// Told when an intent is kept to be sent again: the task waiting for its next probe
    /// sends it at once.
    due: Notify,
}

impl Unconfirmed {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("lock")
    }

    /// Makes way for a newer publication of `key` ([`State::supersede`]): waits until no
    /// re-send of the key is in flight, then forgets the older.
    pub(super) async fn supersede(&self, key: &WriteId) {
        loop {
            let resent = self.resent.notified();
            if self.state().supersede(key) {
                return;
            }
            resent.await;
        }
    }

    /// Keeps `intent`, sent for `key` and answered as `answer` says ([`State::keep`]). True
    /// when no task sends the kept intents again yet: the caller starts [`redeliver`].
    #[must_use]
    pub(super) fn keep(
        &self,
        key: WriteId,
        intent: Intent,
        digest: Digest,
        answer: &Answer,
    ) -> bool {
        let start = self.state().keep(key, intent, digest, answer);
        if !matches!(answer, Answer::Stands(_)) {
            self.due.notify_one();
        }
        start
    }

    /// Forgets what is kept for an object, which was deleted.
    pub(super) fn forget(&self, object: ObjectId) {
        self.state().forget(object);
    }

    /// Forgets every intent kept.
    pub(super) fn forget_all(&self) {
        self.state().entries.clear();
    }

    /// How many intents are kept.
    pub(super) fn len(&self) -> usize {
        self.state().len()
    }

    /// How many of them stand (answered with a conflict or a refusal).
    #[cfg(test)]
    pub(super) fn standing(&self) -> usize {
        self.state().standing()
    }

    /// Whether the intent kept for `key`, if any, is the one remembered by `digest`.
    #[cfg(test)]
    pub(super) fn holds(&self, key: &WriteId, digest: &Digest) -> bool {
        self.state().holds(key, digest)
    }

    fn resent(&self, key: &WriteId, digest: &Digest, answer: &Answer) {
        self.state().resent(key, digest, answer);
        self.resent.notify_waiters();
    }
}

/// Carries out the [`State`]'s steps until nothing is kept: sends the due intents again with
/// `send`, round after round, and asks `probe` which applier process answers while any
/// stands. A round in which the applier could not be reached is followed by a pause that
/// doubles up to [`MAX_BACKOFF`]; any other by [`PAUSE`] (a `queued` answer already waited
/// the applier's wait timeout).
pub(super) async fn redeliver<F, Fut, P, PFut>(unconfirmed: &Unconfirmed, send: F, probe: P)
where
    F: Fn(Intent) -> Fut,
    Fut: Future<Output = Result<Outcome, ClientError>>,
    P: Fn() -> PFut,
    PFut: Future<Output = Result<String, ClientError>>,
{
    let mut backoff = PAUSE;
    loop {
        let step = unconfirmed.state().next(Instant::now());
        match step {
            Step::Done => return,
            Step::WaitUntil(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = unconfirmed.due.notified() => {}
                }
            }
            Step::Probe => {
                let answered = probe().await;
                if let Err(error) = &answered {
                    tracing::debug!(%error, "The status-applier did not say which process it is");
                }
                let instance = answered.ok();
                let due = unconfirmed
                    .state()
                    .probed(instance.as_deref(), Instant::now());
                if due > 0 {
                    tracing::info!(
                        intents = due,
                        instance,
                        "The status-applier restarted; sending again the intents it answered with a conflict or a refusal"
                    );
                }
            }
            Step::Send(round) => {
                let unanswered = std::sync::atomic::AtomicBool::new(false);
                futures::stream::iter(round)
                    .for_each_concurrent(AT_ONCE, |(key, digest, intent)| {
                        let (send, unanswered) = (&send, &unanswered);
                        async move {
                            let subject = (intent.target.clone(), intent.field_manager.clone());
                            let answer = Answer::of(&send(intent).await);
                            match answer {
                                Answer::Unanswered => {
                                    unanswered.store(true, std::sync::atomic::Ordering::Relaxed)
                                }
                                Answer::Refused => tracing::warn!(
                                    kind = subject.0.kind,
                                    namespace = subject.0.namespace,
                                    name = subject.0.name,
                                    manager = subject.1,
                                    "The status-applier refused an intent sent again; it is sent when its fragment changes"
                                ),
                                Answer::Settled | Answer::Queued | Answer::Stands(_) => {}
                            }
                            unconfirmed.resent(&key, &digest, &answer);
                        }
                    })
                    .await;
                backoff = if unanswered.into_inner() {
                    (backoff * 2).min(MAX_BACKOFF)
                } else {
                    PAUSE
                };
                tokio::time::sleep(backoff).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use status_applier_api::{Subresource, Target};
    use std::sync::Arc;

    fn key(name: &str) -> WriteId {
        WriteId {
            object: ObjectId::of("v1", "Widget", Some("ns"), name),
            manager: "m",
            subresource: Some(Subresource::Status),
        }
    }

    fn intent(name: &str, phase: &str) -> Intent {
        Intent {
            target: Target {
                api_version: "v1".into(),
                kind: "Widget".into(),
                namespace: Some("ns".into()),
                name: name.into(),
                uid: None,
            },
            subresource: Some(Subresource::Status),
            field_manager: "m".into(),
            fragment: json!({"status": {"phase": phase}}),
            release: vec![],
            not_older_than: None,
        }
    }

    fn outcome(action: Action) -> Result<Outcome, ClientError> {
        Ok(Outcome::new("Widget/ns/x", "m", None, action))
    }

    /// An outcome as an applier that names itself answers it.
    fn answered_by(action: Action, instance: &str) -> Result<Outcome, ClientError> {
        let mut outcome = Outcome::new("Widget/ns/x", "m", None, action);
        outcome.instance = Some(instance.into());
        Ok(outcome)
    }

    fn unreachable() -> Result<Outcome, ClientError> {
        Err(ClientError::Read("connection reset".into()))
    }

    /// A probe the test does not expect.
    async fn no_probe() -> Result<String, ClientError> {
        panic!("nothing stands: the applier is not asked which process it is")
    }

    #[test]
    fn queued_unanswered_and_standing_intents_are_kept() {
        for (result, kept) in [
            (outcome(Action::queued), true),
            (unreachable(), true),
            (
                Err(ClientError::Refused {
                    status: 503,
                    body: String::new(),
                }),
                true,
            ),
            (answered_by(Action::conflict, "a"), true),
            (answered_by(Action::rejected, "a"), true),
            (answered_by(Action::applied, "a"), false),
            (answered_by(Action::unchanged, "a"), false),
            (outcome(Action::applied), false),
            (outcome(Action::unchanged), false),
            // An applier that does not say which process it is: nothing to watch for.
            (outcome(Action::conflict), false),
            (outcome(Action::rejected), false),
            (
                Err(ClientError::Refused {
                    status: 400,
                    body: String::new(),
                }),
                false,
            ),
        ] {
            assert_eq!(Answer::of(&result).kept(), kept, "{result:?}");
        }
        assert_eq!(
            Answer::of(&answered_by(Action::conflict, "a")),
            Answer::Stands("a".into())
        );
    }

    #[test]
    fn nothing_kept_nothing_sent_and_nothing_asked() {
        let mut state = State::default();
        assert_eq!(state.next(Instant::now()), Step::Done);
        // An intent to send again is sent, and no probe is set for it.
        let now = Instant::now();
        assert!(state.keep(key("a"), intent("a", "Ready"), [1; 32], &Answer::Queued));
        assert!(matches!(state.next(now), Step::Send(round) if round.len() == 1));
        state.resent(&key("a"), &[1; 32], &Answer::Settled);
        assert_eq!(state.next(now + PROBE_PERIOD * 3), Step::Done);
        assert_eq!(state.len(), 0);
    }

    #[test]
    fn a_conflict_stands_and_is_sent_again_only_once_another_applier_answers() {
        let t0 = Instant::now();
        let mut state = State::default();
        let stands = |by: &str| Answer::Stands(by.into());
        assert!(state.keep(key("a"), intent("a", "Ready"), [1; 32], &stands("one")));
        assert_eq!(state.standing(), 1);
        // Nothing is sent; the applier is asked which process it is every period.
        assert_eq!(state.next(t0), Step::WaitUntil(t0 + PROBE_PERIOD));
        assert_eq!(state.next(t0 + PROBE_PERIOD), Step::Probe);
        assert_eq!(state.probed(Some("one"), t0 + PROBE_PERIOD), 0, "the same");
        let t1 = t0 + PROBE_PERIOD * 2;
        assert_eq!(state.next(t0 + PROBE_PERIOD), Step::WaitUntil(t1));
        assert_eq!(state.next(t1), Step::Probe);
        assert_eq!(state.probed(None, t1), 0, "away: nothing known");
        let t2 = t1 + PROBE_PERIOD;
        assert_eq!(state.next(t2), Step::Probe);
        // Another process: the intent is sent again, and it meets the conflict again.
        assert_eq!(state.probed(Some("two"), t2), 1);
        let Step::Send(round) = state.next(t2) else {
            panic!("the standing intent is sent again")
        };
        assert_eq!(round, vec![(key("a"), [1; 32], intent("a", "Ready"))]);
        assert!(
            !state.supersede(&key("a")),
            "a newer publication waits for it"
        );
        state.resent(&key("a"), &[1; 32], &stands("two"));
        assert_eq!(state.next(t2), Step::WaitUntil(t2 + PROBE_PERIOD));
        assert_eq!(state.next(t2 + PROBE_PERIOD), Step::Probe);
        assert_eq!(state.probed(Some("two"), t2 + PROBE_PERIOD), 0);
        assert!(state.holds(&key("a"), &[1; 32]));
    }

    #[test]
    fn a_standing_intent_goes_when_settled_superseded_or_deleted() {
        let now = Instant::now();
        let mut state = State::default();
        let _ = state.keep(
            key("a"),
            intent("a", "A"),
            [1; 32],
            &Answer::Stands("one".into()),
        );
        let _ = state.keep(
            key("b"),
            intent("b", "B"),
            [2; 32],
            &Answer::Stands("one".into()),
        );
        let _ = state.keep(
            key("c"),
            intent("c", "C"),
            [3; 32],
            &Answer::Stands("one".into()),
        );
        // A restarted applier applies a's (the other owner has gone meanwhile).
        assert_eq!(state.next(now), Step::WaitUntil(now + PROBE_PERIOD));
        assert_eq!(state.next(now + PROBE_PERIOD), Step::Probe);
        assert_eq!(state.probed(Some("two"), now + PROBE_PERIOD), 3);
        assert!(matches!(state.next(now + PROBE_PERIOD), Step::Send(round) if round.len() == 3));
        state.resent(&key("a"), &[1; 32], &Answer::Settled);
        state.resent(&key("b"), &[2; 32], &Answer::Stands("two".into()));
        state.resent(&key("c"), &[3; 32], &Answer::Stands("two".into()));
        assert!(!state.holds(&key("a"), &[1; 32]));
        assert!(
            state.supersede(&key("b")),
            "a newer publication replaces b's"
        );
        state.forget(key("c").object);
        assert_eq!(state.len(), 0);
        assert_eq!(
            state.next(now + PROBE_PERIOD * 2),
            Step::Done,
            "no probe left"
        );
    }

    #[test]
    fn an_intent_to_send_again_beside_standing_ones_does_not_wait_for_the_probe() {
        let now = Instant::now();
        let mut state = State::default();
        let _ = state.keep(
            key("a"),
            intent("a", "A"),
            [1; 32],
            &Answer::Stands("one".into()),
        );
        assert_eq!(state.next(now), Step::WaitUntil(now + PROBE_PERIOD));
        assert!(!state.keep(key("b"), intent("b", "B"), [2; 32], &Answer::Unanswered));
        let Step::Send(round) = state.next(now) else {
            panic!("b is sent at once")
        };
        assert_eq!(
            round,
            vec![(key("b"), [2; 32], intent("b", "B"))],
            "a stands"
        );
        state.resent(&key("b"), &[2; 32], &Answer::Settled);
        assert_eq!(
            state.next(now),
            Step::WaitUntil(now + PROBE_PERIOD),
            "the probe kept its time"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_intent_is_sent_again_until_the_applier_back_from_a_crash_applies_it() {
        let unconfirmed = Unconfirmed::default();
        assert!(unconfirmed.keep(key("a"), intent("a", "Ready"), [1; 32], &Answer::Unanswered));
        assert!(!unconfirmed.keep(key("b"), intent("b", "Ready"), [2; 32], &Answer::Unanswered));
        // The applier is gone for two rounds, then a new one applies what it is sent.
        let answers = Mutex::new(HashMap::<String, Vec<Result<Outcome, ClientError>>>::new());
        for name in ["a", "b"] {
            let script = vec![unreachable(), unreachable(), outcome(Action::applied)];
            answers.lock().unwrap().insert(name.into(), script);
        }
        let sent = Mutex::new(Vec::new());
        let send = |intent: Intent| {
            sent.lock().unwrap().push(intent.clone());
            let answer = answers
                .lock()
                .unwrap()
                .get_mut(&intent.target.name)
                .expect("a scripted intent")
                .remove(0);
            async move { answer }
        };
        redeliver(&unconfirmed, send, no_probe).await;
        let sent = sent.into_inner().unwrap();
        assert_eq!(sent.len(), 6, "each sent three times: {sent:?}");
        assert!(
            sent.iter()
                .all(|i| i.fragment["status"]["phase"] == "Ready")
        );
        assert_eq!(unconfirmed.len(), 0, "applied: nothing kept");
        assert!(
            unconfirmed.keep(key("c"), intent("c", "Ready"), [3; 32], &Answer::Queued),
            "the task ended with nothing left, so the next kept intent starts one"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_queued_intent_is_asked_about_again_until_its_apply_ends() {
        let unconfirmed = Unconfirmed::default();
        let _ = unconfirmed.keep(key("a"), intent("a", "Ready"), [1; 32], &Answer::Queued);
        let script = vec![
            outcome(Action::queued),
            outcome(Action::queued),
            outcome(Action::conflict),
        ];
        let count = std::sync::atomic::AtomicUsize::new(0);
        let script = Mutex::new(script);
        let send = |_| {
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let answer = script.lock().unwrap().remove(0);
            async move { answer }
        };
        redeliver(&unconfirmed, send, no_probe).await;
        assert_eq!(count.into_inner(), 3);
        assert_eq!(
            unconfirmed.len(),
            0,
            "a conflict from an applier that does not name itself is its to retry"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_conflict_is_sent_again_to_a_restarted_applier_and_stands_with_it() {
        let unconfirmed = Arc::new(Unconfirmed::default());
        let answer = Answer::Stands("one".into());
        assert!(unconfirmed.keep(key("a"), intent("a", "Ready"), [1; 32], &answer));
        // The first applier answers two probes, is away for one, and another answers after.
        let probes = Mutex::new(vec![
            Ok("one".to_owned()),
            Ok("one".to_owned()),
            Err(ClientError::Read("connection refused".into())),
        ]);
        let probed = std::sync::atomic::AtomicUsize::new(0);
        let sent = Mutex::new(Vec::<(Instant, Intent)>::new());
        let started = Instant::now();
        let task = {
            let unconfirmed = unconfirmed.clone();
            async move {
                let send = |intent: Intent| {
                    sent.lock().unwrap().push((Instant::now(), intent));
                    async { answered_by(Action::conflict, "two") }
                };
                let probe = || {
                    probed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let next = probes.lock().unwrap().pop();
                    async move { next.unwrap_or_else(|| Ok("two".to_owned())) }
                };
                redeliver(&unconfirmed, send, probe).await;
                (sent.into_inner().unwrap(), probed.into_inner())
            }
        };
        let task = tokio::spawn(task);
        // Six periods and a half: probes at 5, 10, 15, 20, 25 and 30 s.
        tokio::time::sleep(PROBE_PERIOD * 6 + PROBE_PERIOD / 2).await;
        assert_eq!(unconfirmed.standing(), 1, "it stands with the new applier");
        unconfirmed.forget(key("a").object);
        let (sent, probed) = task.await.unwrap();
        assert_eq!(sent.len(), 1, "sent once, to the new applier: {sent:?}");
        let (at, resent) = &sent[0];
        assert_eq!(resent, &intent("a", "Ready"), "the same intent");
        // The probes pop from the end: away at 5 s, "one" at 10 and 15, "two" at 20.
        assert_eq!(*at - started, PROBE_PERIOD * 4);
        assert_eq!(probed, 6, "one probe a period while it stands");
    }

    #[tokio::test(start_paused = true)]
    async fn a_newer_publication_waits_for_the_resend_in_flight_and_replaces_the_older() {
        let unconfirmed = Arc::new(Unconfirmed::default());
        let _ = unconfirmed.keep(key("a"), intent("a", "Old"), [1; 32], &Answer::Queued);
        let (in_flight_tx, in_flight_rx) = tokio::sync::oneshot::channel();
        let (answer_tx, answer_rx) = tokio::sync::oneshot::channel::<()>();
        let channels = Mutex::new(Some((in_flight_tx, answer_rx)));
        let task = {
            let unconfirmed = unconfirmed.clone();
            tokio::spawn(async move {
                let send = |intent| {
                    let channels = channels.lock().unwrap().take();
                    async move {
                        let (in_flight, answer) = channels.expect("sent once");
                        in_flight.send(intent).unwrap();
                        answer.await.unwrap();
                        outcome(Action::queued)
                    }
                };
                redeliver(&unconfirmed, send, no_probe).await
            })
        };
        let resent = in_flight_rx.await.unwrap();
        assert_eq!(resent.fragment["status"]["phase"], "Old");
        let superseding = {
            let unconfirmed = unconfirmed.clone();
            tokio::spawn(async move { unconfirmed.supersede(&key("a")).await })
        };
        tokio::task::yield_now().await;
        assert!(
            !superseding.is_finished(),
            "the newer waits for the re-send of the older"
        );
        answer_tx.send(()).unwrap();
        superseding.await.unwrap();
        assert!(!unconfirmed.holds(&key("a"), &[1; 32]), "the older is gone");
        assert!(!unconfirmed.keep(key("a"), intent("a", "New"), [2; 32], &Answer::Queued));
        assert!(unconfirmed.holds(&key("a"), &[2; 32]));
        unconfirmed.forget(key("a").object);
        task.await.unwrap();
        assert_eq!(unconfirmed.len(), 0);
    }

    #[test]
    fn a_deleted_objects_intents_are_forgotten() {
        let unconfirmed = Unconfirmed::default();
        let _ = unconfirmed.keep(key("a"), intent("a", "Ready"), [1; 32], &Answer::Queued);
        let _ = unconfirmed.keep(key("b"), intent("b", "Ready"), [2; 32], &Answer::Queued);
        unconfirmed.forget(key("a").object);
        assert_eq!(unconfirmed.len(), 1);
        assert!(unconfirmed.holds(&key("b"), &[2; 32]));
    }
}
