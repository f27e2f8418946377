//! How the machine takes an intent: refused, or parked until its object is read (what its
//! manager owns there is unknown, or the intent names an incarnation the view is not of),
//! then merged into its document (kept, rebuilt from the object, or replaced for a new
//! incarnation), refused for a conflict between managers of this applier, and where the key
//! goes next (queued, coalesced, or answered at once).

use super::{KeyState, Machine, Parked, Phase};
use crate::apply::owned_document;
use crate::conflict::{self, Conflict};
use crate::engine::events::{Count, Effect, Ticket};
use crate::error::ApplyError;
use crate::intent::{DesiredKey, ObjectRef, ValidIntent};
use crate::merge::merge_fragment;
use crate::metrics::Action;
use crate::outcome::Outcome;
use crate::view::View;
use leadership::Leadership;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;

impl Machine {
    /// Takes an intent as the driver hands it over, with the object as the driver's cache
    /// holds it (or why it could not look): refused, or taken in ([`Machine::take_in`]).
    pub(super) fn intent(
        &mut self,
        intent: ValidIntent,
        ticket: Ticket,
        wait: bool,
        view: Result<Option<Arc<View>>, ApplyError>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let key = intent.key.clone();
        let view = match view {
            Ok(view) => view,
            // Without the object as it is, a first intent cannot know what its manager owns
            // already: refuse it for now rather than risk dropping those fields.
            Err(error) => {
                refuse_unread(&key, ticket, &error, out);
                return;
            }
        };
        if let Leadership::Follower { leader } = &self.leadership {
            // Its controller must not be running: whatever it asks for, the leader's pod
            // applies. Not delivered (503), so a controller that believes it leads retries.
            refuse(&key, ticket, super::not_leading(leader), out);
            return;
        }
        self.objects.entry(key.object.clone()).or_default();
        if let Some(view) = view {
            self.take_view(&key.object, view);
        }
        self.take_in(
            Parked {
                intent,
                ticket,
                wait,
            },
            false,
            now,
            out,
        );
    }

    /// Takes in an intent: parked until its object is read, refused for a local conflict,
    /// answered at once when nothing changed, or merged into its key's document and queued.
    /// `after_read`: the object was just read for it (it is not parked again for the same
    /// reason).
    fn take_in(&mut self, arrived: Parked, after_read: bool, now: Instant, out: &mut Vec<Effect>) {
        if let Some(why) = self.read_first(&arrived.intent, after_read) {
            self.park(arrived, why, out);
            return;
        }
        let Parked {
            intent,
            ticket,
            wait,
        } = arrived;
        let key = intent.key.clone();
        let object = self.objects.get_mut(&key.object).expect("made on arrival");
        object.add_key(key.clone());
        self.load(&key, intent.uid.as_deref(), out);
        let merged = self.merge(&intent);
        let mut outcome = crate::outcome::for_key(&key, Action::queued);
        outcome.kept = merged.kept.iter().map(ToString::to_string).collect();
        let local = self.local_conflicts(&key, &merged.document);
        if !local.is_empty() {
            self.refuse_local_conflicts(&key, ticket, outcome, local, out);
            return;
        }
        let window = self.tuning.coalesce_window;
        let entry = self.entries.get_mut(&key).expect("loaded");
        let after_quiet = entry.last_intent.is_none_or(|at| now - at >= window);
        entry.last_intent = Some(now);
        let document = self.documents.store(&key, &merged.document);
        let changed = document != entry.document
            || (intent.uid.is_some() && intent.uid != entry.precondition);
        if !changed
            && entry.phase.is_idle()
            && let Some(last) = &entry.last
        {
            answer_as_last(&key, last, ticket, outcome.kept, out);
            return;
        }
        entry.from_intent = true;
        if let Some(seen) = intent.not_older_than {
            entry.not_older_than = Some(entry.not_older_than.map_or(seen, |v| v.max(seen)));
        }
        if changed {
            entry.document = document;
            entry.precondition = intent.uid.or(entry.precondition.take());
            entry.version += 1;
            entry.failures = 0;
            entry.pinned.clear();
        }
        let version = entry.version;
        outcome.action = self.schedule(&key, changed, after_quiet, now, out);
        if outcome.action == Action::coalesced {
            out.push(Effect::Counted(Count::Coalesced(key.field_manager.clone())));
        }
        out.push(Effect::Counted(Count::Intent(
            key.field_manager.clone(),
            outcome.action,
        )));
        if wait {
            let entry = self.entries.get_mut(&key).expect("loaded");
            entry.waiters.push((version, ticket, outcome.kept));
        } else {
            out.push(Effect::Answer { ticket, outcome });
        }
    }

    /// Why `intent` must wait for a read of its object before it is merged, if it must.
    fn read_first(&self, intent: &ValidIntent, after_read: bool) -> Option<ReadFirst> {
        let key = &intent.key;
        let view = self.objects[&key.object].view.as_deref();
        if !self.entries.contains_key(key) && view.is_none_or(|v| !v.keeps(&key.field_manager)) {
            return Some(ReadFirst::OwnedUnknown);
        }
        let names_another =
            |uid: &str| view.is_some_and(|v| crate::apply::of_another_incarnation(v, uid));
        (!after_read && intent.uid.as_deref().is_some_and(names_another))
            .then_some(ReadFirst::OtherIncarnation)
    }

    /// Parks an intent until its object is read: one read, shared by every intent that
    /// arrives meanwhile, that keeps what the intent's manager owns.
    fn park(&mut self, parked: Parked, why: ReadFirst, out: &mut Vec<Effect>) {
        let key = &parked.intent.key;
        let object = self.objects.get_mut(&key.object).expect("made on arrival");
        if why == ReadFirst::OwnedUnknown && object.keep_managers.insert(key.field_manager.clone())
        {
            out.push(Effect::Keep {
                object: key.object.clone(),
                keep: object.keep(),
            });
        }
        if object.parked.is_empty() {
            out.push(Effect::Read(key.object.clone()));
        }
        object.parked.push(parked);
    }

    /// The key's document with `intent` merged in, under the policy's rules for its kind.
    fn merge(&self, intent: &ValidIntent) -> crate::merge::Merged {
        let key = &intent.key;
        let rules = self.policy.rules_for(&key.object.group_kind());
        merge_fragment(
            &self.entries[key].document.value(),
            &intent.fragment,
            &rules,
            &intent.release,
        )
    }

    /// Refuses an intent another manager of this applier disagrees with, before any request.
    fn refuse_local_conflicts(
        &mut self,
        key: &DesiredKey,
        ticket: Ticket,
        mut outcome: crate::outcome::Outcome,
        local: Vec<Conflict>,
        out: &mut Vec<Effect>,
    ) {
        outcome.action = Action::conflict;
        self.report(key, &local, true, out);
        outcome.conflicts = local;
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
    }

    /// Where a merged key goes next, as the answer's action: an idle key is queued (at once
    /// after a quiet window when lone intents are applied at once); a queued one waits a
    /// window more, up to ten, or leaves its backoff when its document changed; one ready,
    /// reading or applying carries the intent in its next apply.
    fn schedule(
        &mut self,
        key: &DesiredKey,
        changed: bool,
        after_quiet: bool,
        now: Instant,
        out: &mut Vec<Effect>,
    ) -> Action {
        let window = self.tuning.coalesce_window;
        let entry = self.entries.get_mut(key).expect("loaded");
        match entry.phase.clone() {
            Phase::Idle => {
                let at_once = after_quiet && self.tuning.apply_lone_intents_at_once;
                let due = if at_once { now } else { now + window };
                self.queue(key, due, false, now, out);
                Action::queued
            }
            Phase::Queued {
                due,
                first,
                backoff,
            } => {
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
                Action::coalesced
            }
            Phase::Ready | Phase::Reading { .. } | Phase::Applying { .. } => Action::coalesced,
        }
    }

    /// Makes sure `key` has a document: the one in memory, or else what its manager owns on
    /// the newest view of the object (after a restart, this keeps a partial intent from
    /// dropping fields). A document for another incarnation of the object is replaced, and
    /// its waiting submitters hear that their intents were dropped.
    pub(super) fn load(&mut self, key: &DesiredKey, uid: Option<&str>, out: &mut Vec<Effect>) {
        let reload = self.entries.get(key).is_none_or(|e| {
            uid.is_some() && e.precondition.is_some() && e.precondition.as_deref() != uid
        });
        if !reload {
            return;
        }
        let view = self.objects.get(&key.object).and_then(|o| o.view.clone());
        let mut fresh = match view {
            Some(v) if uid.is_none() || v.metadata.uid.as_deref() == uid => {
                let owned = self.documents.store(key, &owned_document(&v.object(), key));
                KeyState::new(owned, v.metadata.uid.clone())
            }
            _ => KeyState::new(self.documents.store(key, &empty()), None),
        };
        if let Some(mut old) = self.entries.remove(key) {
            // The key keeps its place in the cycle and its version count, so that it is
            // never queued twice and an old apply still in flight answers none of the new
            // waiters.
            fresh.version = old.version;
            fresh.phase = old.phase.clone();
            let dropped = crate::outcome::for_key(key, Action::rejected).with_message(format!(
                "uid precondition failed: the object was recreated (uid {}), and an intent for \
                 the new incarnation replaced this one before it was applied",
                uid.unwrap_or("unknown")
            ));
            for (_, ticket, _) in old.waiters.drain(..) {
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
    pub(super) fn local_conflicts(&self, key: &DesiredKey, document: &Value) -> Vec<Conflict> {
        let others: Vec<(&str, Value)> = self.objects[&key.object]
            .keys
            .iter()
            .filter(|k| *k != key && k.subresource == key.subresource)
            .filter_map(|k| {
                Some((
                    k.field_manager.as_str(),
                    self.entries.get(k)?.document.value(),
                ))
            })
            .collect();
        let others: Vec<(&str, &Value)> = others.iter().map(|(m, d)| (*m, d)).collect();
        conflict::local(document, &others)
    }

    /// Merges the intents that waited for the object's read, in arrival order: once it was
    /// read (`found`), or once it is known not to exist (documents start empty: there is
    /// nothing a manager could own on it).
    pub(super) fn unpark(
        &mut self,
        object: &ObjectRef,
        found: bool,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let Some(held) = self.objects.get_mut(object) else {
            return;
        };
        for parked in std::mem::take(&mut held.parked) {
            let key = parked.intent.key.clone();
            if !found && !self.entries.contains_key(&key) {
                self.entries.insert(
                    key.clone(),
                    KeyState::new(self.documents.store(&key, &empty()), None),
                );
            }
            self.take_in(parked, true, now, out);
        }
    }

    /// Answers the intents that waited for a read that failed: not merged, so nothing the
    /// manager owns can be dropped; the submitter tries again.
    pub(super) fn unpark_failed(
        &mut self,
        object: &ObjectRef,
        error: &ApplyError,
        out: &mut Vec<Effect>,
    ) {
        let Some(held) = self.objects.get_mut(object) else {
            return;
        };
        for parked in std::mem::take(&mut held.parked) {
            refuse_unread(&parked.intent.key, parked.ticket, error, out);
        }
    }
}

/// Why an intent waits for a read of its object before it is merged.
#[derive(Clone, Copy, PartialEq)]
enum ReadFirst {
    /// What its manager owns on the object is unknown: no document yet, and no view or one
    /// cut down without the manager's applies. Merged into nothing, a partial intent would
    /// drop it; the views of the object keep the manager's applies from now on.
    OwnedUnknown,
    /// The view is of another incarnation than the intent names (a recreation the watch has
    /// not delivered yet): its document starts from what the manager owns on the object the
    /// intent names.
    OtherIncarnation,
}

/// Answers an intent whose object could not be read: not merged, so nothing the manager owns
/// can be dropped; the submitter tries again.
fn refuse_unread(key: &DesiredKey, ticket: Ticket, error: &ApplyError, out: &mut Vec<Effect>) {
    refuse(
        key,
        ticket,
        format!("{}: reading the object: {error}", key.object),
        out,
    );
}

/// Answers an intent with an error, merged nowhere.
fn refuse(key: &DesiredKey, ticket: Ticket, message: String, out: &mut Vec<Effect>) {
    out.push(Effect::Counted(Count::Intent(
        key.field_manager.clone(),
        Action::error,
    )));
    out.push(Effect::Answer {
        ticket,
        outcome: crate::outcome::for_key(key, Action::error).with_message(message),
    });
}

/// Answers an intent that changed nothing with the key's last outcome (an apply that
/// carried it is, for this intent, `unchanged`) and the paths it kept.
fn answer_as_last(
    key: &DesiredKey,
    last: &Outcome,
    ticket: Ticket,
    kept: Vec<String>,
    out: &mut Vec<Effect>,
) {
    // The last outcome's `kept` are the paths still pinned (the server refused `null`
    // there): they stay kept, beside what this intent's own merge kept.
    let mut answer = last.clone();
    for path in kept {
        if !answer.kept.contains(&path) {
            answer.kept.push(path);
        }
    }
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
}

/// The document of a key nothing is known of yet.
fn empty() -> Value {
    Value::Object(Default::default())
}
