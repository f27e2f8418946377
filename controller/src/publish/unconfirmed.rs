//! The intents the status-applier took but has not been seen to apply, and their delivery
//! again until it is.
//!
//! An intent answered `queued` (kept, not applied within the applier's wait timeout) or not
//! answered at all (the applier died with the request in flight) lives only in the memory of
//! an applier that may be gone: the publisher remembers its fragment as delivered and sends
//! nothing while the fragment is unchanged, so an applier that dies then would lose it until
//! the fragment changes. So each such intent is kept here, one per (object, subresource,
//! manager), and sent again until the applier answers with what its apply did (applied,
//! unchanged, a conflict or a rejection, which the applier keeps and retries by itself).
//!
//! Sending the same intent again is how the publisher both learns the outcome and survives a
//! restart, with nothing to detect: a live applier merges an identical fragment into the
//! document it has (no change) and answers when its pending apply ends, or at once with its
//! last outcome; a restarted one takes it as new and applies it. So the applier's API needs no
//! instance id, and the applier stays generic. A re-send waits for the outcome like any
//! intent, so an applier that is merely slow paces the re-sends by its own wait timeout; one
//! that cannot be reached is asked again with a backoff.
//!
//! What is kept stays bounded: one intent per key, replaced by a newer publication of the key,
//! forgotten once an outcome is known or the object is deleted; an applied intent leaves
//! nothing here, so at rest this is empty.

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

/// How many intents are sent again at once (as many as reconciles of one controller run).
const AT_ONCE: usize = 8;
/// The shortest pause between two rounds of re-sends: an applier answering `queued` at once
/// (a wait timeout of zero) is not asked in a busy loop.
const PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two rounds while the applier cannot be reached.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What an answer to a sent intent means for keeping it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// The applier acted on it (applied, unchanged, a conflict, a rejection): nothing to
    /// keep, the applier owns it now.
    Settled,
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
            Ok(outcome) if outcome.action == Action::queued => Self::Queued,
            Ok(_) => Self::Settled,
            Err(ClientError::Refused { status, .. }) if (400..500).contains(status) => {
                Self::Refused
            }
            Err(_) => Self::Unanswered,
        }
    }

    /// Whether the intent must be kept and sent again.
    pub(super) fn unconfirmed(self) -> bool {
        matches!(self, Self::Queued | Self::Unanswered)
    }
}

/// An intent kept until its outcome is known.
struct Entry {
    intent: Intent,
    /// What the publisher remembers the intent by, to tell it apart from a newer one.
    digest: Digest,
    /// A re-send of it is in flight: a newer publication of the key waits for it.
    resending: bool,
}

#[derive(Default)]
struct State {
    entries: HashMap<WriteId, Entry>,
    /// A task sends the entries again ([`redeliver`]); it ends when none are left.
    redelivering: bool,
}

/// The intents not yet seen applied, one per key.
#[derive(Default)]
pub(super) struct Unconfirmed {
    state: Mutex<State>,
    /// Told whenever a re-send ends.
    resent: Notify,
}

impl Unconfirmed {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("lock")
    }

    /// Makes way for a newer publication of `key`: waits until no re-send of the key is in
    /// flight (the applier must never take the older intent after the newer), then forgets
    /// the older, which the newer replaces.
    pub(super) async fn supersede(&self, key: &WriteId) {
        loop {
            let resent = self.resent.notified();
            {
                let mut state = self.state();
                match state.entries.get(key) {
                    Some(entry) if entry.resending => {}
                    Some(_) => {
                        state.entries.remove(key);
                        return;
                    }
                    None => return,
                }
            }
            resent.await;
        }
    }

    /// Keeps `intent`, sent for `key` and answered `queued` or not at all, to send it again.
    /// True when no task sends the kept intents again yet: the caller starts [`redeliver`].
    #[must_use]
    pub(super) fn keep(&self, key: WriteId, intent: Intent, digest: Digest) -> bool {
        let mut state = self.state();
        let entry = Entry {
            intent,
            digest,
            resending: false,
        };
        state.entries.insert(key, entry);
        !std::mem::replace(&mut state.redelivering, true)
    }

    /// Forgets what is kept for an object, which was deleted.
    pub(super) fn forget(&self, object: ObjectId) {
        self.state().entries.retain(|k, _| k.object != object);
    }

    /// Forgets every intent kept.
    pub(super) fn forget_all(&self) {
        self.state().entries.clear();
    }

    /// How many intents are kept.
    pub(super) fn len(&self) -> usize {
        self.state().entries.len()
    }

    /// Whether the intent kept for `key`, if any, is the one remembered by `digest`.
    #[cfg(test)]
    pub(super) fn holds(&self, key: &WriteId, digest: &Digest) -> bool {
        (self.state().entries.get(key)).is_some_and(|e| &e.digest == digest)
    }

    /// The next round: every kept intent, each marked as in flight. `None` when nothing is
    /// kept, and then the task that asked ends (the next [`Unconfirmed::keep`] starts one).
    fn round(&self) -> Option<Vec<(WriteId, Digest, Intent)>> {
        let mut state = self.state();
        if state.entries.is_empty() {
            state.redelivering = false;
            return None;
        }
        let round = state.entries.iter_mut().map(|(key, entry)| {
            entry.resending = true;
            (*key, entry.digest, entry.intent.clone())
        });
        Some(round.collect())
    }

    /// Records what became of a re-send of the intent `digest` of `key`: forgotten when it
    /// needs no other, kept otherwise (unless a deletion forgot it meanwhile, and a newer
    /// publication took its place).
    fn resent(&self, key: &WriteId, digest: &Digest, answer: Answer) {
        {
            let mut state = self.state();
            if let Some(entry) = state.entries.get_mut(key)
                && &entry.digest == digest
            {
                if answer.unconfirmed() {
                    entry.resending = false;
                } else {
                    state.entries.remove(key);
                }
            }
        }
        self.resent.notify_waiters();
    }
}

/// Sends the kept intents again with `send`, round after round, until none is left. A round
/// in which the applier could not be reached is followed by a pause that doubles up to
/// [`MAX_BACKOFF`]; any other by [`PAUSE`] (a `queued` answer already waited the applier's
/// wait timeout).
pub(super) async fn redeliver<F, Fut>(unconfirmed: &Unconfirmed, send: F)
where
    F: Fn(Intent) -> Fut,
    Fut: Future<Output = Result<Outcome, ClientError>>,
{
    let mut backoff = PAUSE;
    while let Some(round) = unconfirmed.round() {
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
                        Answer::Settled | Answer::Queued => {}
                    }
                    unconfirmed.resent(&key, &digest, answer);
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

    fn unreachable() -> Result<Outcome, ClientError> {
        Err(ClientError::Read("connection reset".into()))
    }

    #[test]
    fn only_queued_and_unanswered_intents_are_kept() {
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
            (outcome(Action::applied), false),
            (outcome(Action::unchanged), false),
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
            assert_eq!(Answer::of(&result).unconfirmed(), kept, "{result:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_intent_is_sent_again_until_the_applier_back_from_a_crash_applies_it() {
        let unconfirmed = Unconfirmed::default();
        assert!(unconfirmed.keep(key("a"), intent("a", "Ready"), [1; 32]));
        assert!(!unconfirmed.keep(key("b"), intent("b", "Ready"), [2; 32]));
        // The applier is gone for two rounds, then a new one applies what it is sent.
        let answers = Mutex::new(HashMap::<String, Vec<Result<Outcome, ClientError>>>::new());
        for name in ["a", "b"] {
            let script = vec![unreachable(), unreachable(), outcome(Action::applied)];
            answers.lock().unwrap().insert(name.into(), script);
        }
        let sent = Mutex::new(Vec::new());
        redeliver(&unconfirmed, |intent: Intent| {
            sent.lock().unwrap().push(intent.clone());
            let answer = answers
                .lock()
                .unwrap()
                .get_mut(&intent.target.name)
                .expect("a scripted intent")
                .remove(0);
            async move { answer }
        })
        .await;
        let sent = sent.into_inner().unwrap();
        assert_eq!(sent.len(), 6, "each sent three times: {sent:?}");
        assert!(
            sent.iter()
                .all(|i| i.fragment["status"]["phase"] == "Ready")
        );
        assert_eq!(unconfirmed.len(), 0, "applied: nothing kept");
        assert!(
            unconfirmed.keep(key("c"), intent("c", "Ready"), [3; 32]),
            "the task ended with nothing left, so the next kept intent starts one"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_queued_intent_is_asked_about_again_until_its_apply_ends() {
        let unconfirmed = Unconfirmed::default();
        let _ = unconfirmed.keep(key("a"), intent("a", "Ready"), [1; 32]);
        let mut script = vec![
            outcome(Action::queued),
            outcome(Action::queued),
            outcome(Action::conflict),
        ];
        let count = std::sync::atomic::AtomicUsize::new(0);
        let script = Mutex::new(std::mem::take(&mut script));
        redeliver(&unconfirmed, |_| {
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let answer = script.lock().unwrap().remove(0);
            async move { answer }
        })
        .await;
        assert_eq!(count.into_inner(), 3);
        assert_eq!(unconfirmed.len(), 0, "a conflict is the applier's to retry");
    }

    #[tokio::test(start_paused = true)]
    async fn a_newer_publication_waits_for_the_resend_in_flight_and_replaces_the_older() {
        let unconfirmed = Arc::new(Unconfirmed::default());
        let _ = unconfirmed.keep(key("a"), intent("a", "Old"), [1; 32]);
        let (in_flight_tx, in_flight_rx) = tokio::sync::oneshot::channel();
        let (answer_tx, answer_rx) = tokio::sync::oneshot::channel::<()>();
        let channels = Mutex::new(Some((in_flight_tx, answer_rx)));
        let task = {
            let unconfirmed = unconfirmed.clone();
            tokio::spawn(async move {
                redeliver(&unconfirmed, |intent| {
                    let channels = channels.lock().unwrap().take();
                    async move {
                        let (in_flight, answer) = channels.expect("sent once");
                        in_flight.send(intent).unwrap();
                        answer.await.unwrap();
                        outcome(Action::queued)
                    }
                })
                .await
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
        assert!(!unconfirmed.keep(key("a"), intent("a", "New"), [2; 32]));
        assert!(unconfirmed.holds(&key("a"), &[2; 32]));
        unconfirmed.forget(key("a").object);
        task.await.unwrap();
        assert_eq!(unconfirmed.len(), 0);
    }

    #[test]
    fn a_deleted_objects_intents_are_forgotten() {
        let unconfirmed = Unconfirmed::default();
        let _ = unconfirmed.keep(key("a"), intent("a", "Ready"), [1; 32]);
        let _ = unconfirmed.keep(key("b"), intent("b", "Ready"), [2; 32]);
        unconfirmed.forget(key("a").object);
        assert_eq!(unconfirmed.len(), 1);
        assert!(unconfirmed.holds(&key("b"), &[2; 32]));
    }
}
