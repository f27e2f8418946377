//! How the machine takes what the watches and reads show of an object: the newest view,
//! re-checks of the documents of its intents, remembered documents that follow the object,
//! and documents rebuilt from `managedFields` after a restart.

use super::{KeyState, Machine, Phase, behind, is_newer, set_phase};
use crate::apply::{our_apply_entries, owned_document};
use crate::conflict::Conflict;
use crate::engine::events::Effect;
use crate::error::ApplyError;
use crate::intent::{DesiredKey, ObjectRef};
use crate::metrics::Action;
use crate::view::View;
use std::sync::Arc;
use std::time::Instant;
use tracing::info;

impl Machine {
    /// Keeps `view` if it is newer than the one held, or of the same version and cut down to
    /// something else (a read that keeps what the engine asked last); answers whether it was
    /// newer.
    pub(super) fn take_view(&mut self, object: &ObjectRef, view: Arc<View>) -> bool {
        let Some(held) = self.objects.get_mut(object) else {
            return false;
        };
        let newer = held.view.as_ref().is_none_or(|v| is_newer(&view, v));
        let recut = held
            .view
            .as_ref()
            .is_some_and(|v| !is_newer(v, &view) && view.kept_otherwise_than(v));
        if newer || recut {
            held.view = Some(view);
        }
        newer
    }

    pub(super) fn observed(
        &mut self,
        object: &ObjectRef,
        view: Arc<View>,
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
        self.unpark(object, true, now, out);
        let replanned = self.busy_in(object, |p| matches!(p, Phase::Reading { .. }));
        if let Some(key) = &replanned {
            let Phase::Reading { stale } = self.entries[key].phase else {
                unreachable!("reading")
            };
            self.plan_or_read(key, stale, now, out);
        }
        if newer {
            self.follow_view(object, replanned.as_ref(), now, out);
        }
    }

    /// What every key of `object` but `except` does on a newer view of it: remembered
    /// documents follow it, idle ones are checked again, one waiting for it is planned.
    /// Whether the view came from the watch or from an apply's answer: an answer can show
    /// another writer's change first, and the watch's event for it is then no news.
    pub(super) fn follow_view(
        &mut self,
        object: &ObjectRef,
        except: Option<&DesiredKey>,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        let view = self.objects[object].view.clone().expect("a view");
        let whole = view.object();
        let keys: Vec<DesiredKey> = self.objects[object].keys.to_vec();
        for key in keys.into_iter().filter(|k| Some(k) != except) {
            let entry = self.entries.get_mut(&key).expect("a key");
            if !entry.from_intent {
                if !view.keeps(&key.field_manager) {
                    // Cut down before its manager was kept: what it owns is not in this view.
                    continue;
                }
                // A remembered document follows the object.
                entry.document = self.documents.store(&key, &owned_document(&whole, &key));
                entry.object_uid = view.metadata.uid.clone();
            } else if entry.phase.is_idle() {
                // Re-check: restores drifted fields and retries conflicts; sends nothing
                // when nothing would change.
                let due = now + self.tuning.coalesce_window;
                self.queue(&key, due, false, now, out);
            } else if entry.awaiting_view.is_some()
                && matches!(entry.phase, Phase::Queued { .. })
                && !behind(Some(&view), entry.not_older_than)
            {
                // The view it waited for: plan at once.
                set_phase(entry, &mut self.pending, Phase::Ready);
                self.ready.push_back(key);
            } else if matches!(entry.phase, Phase::Applying { .. }) {
                // The apply in flight was planned on an older view.
                entry.recheck = true;
            }
        }
    }

    pub(super) fn gone(&mut self, object: &ObjectRef, now: Instant, out: &mut Vec<Effect>) {
        let Some(held) = self.objects.get_mut(object) else {
            return;
        };
        held.view = None;
        self.unpark(object, false, now, out);
        if let Some(key) = self.busy_in(object, |p| matches!(p, Phase::Reading { .. })) {
            let outcome = crate::outcome::for_key(&key, Action::rejected)
                .with_message(format!("{object}: {}", ApplyError::NotFound));
            self.finish(&key, outcome, false, now, out);
        }
        self.forget_if_settled(object, out);
    }

    /// Forgets a deleted object whose keys have nothing left to do: its documents, keys and
    /// claims (memory stays flat under churn). A key still queued, applying or waited for
    /// keeps the object until a later deletion event; an intent for the name afterwards
    /// starts from nothing, as for a new object.
    fn forget_if_settled(&mut self, object: &ObjectRef, out: &mut Vec<Effect>) {
        let Some(held) = self.objects.get(object) else {
            return;
        };
        if held.view.is_some() || held.busy.is_some() || !held.parked.is_empty() {
            return;
        }
        let settled = held.keys.iter().all(|k| {
            self.entries
                .get(k)
                .is_none_or(|e| e.phase.is_idle() && e.waiters.is_empty())
        });
        if !settled {
            return;
        }
        if let Some(held) = self.objects.remove(object) {
            for key in &held.keys {
                self.entries.remove(key);
            }
        }
        out.push(Effect::Forget(object.clone()));
    }

    /// Rebuilds the documents of the allowed managers that have applied to `object` and have
    /// none in memory (after a restart).
    pub(super) fn rebuild(&mut self, object: &ObjectRef, view: &Arc<View>) {
        let whole = view.object();
        for (manager, subresource) in our_apply_entries(&whole, &self.policy.allowed_managers) {
            let key = DesiredKey {
                object: object.clone(),
                subresource,
                field_manager: manager,
            };
            if self.entries.contains_key(&key) {
                continue;
            }
            info!(subject = %key.object, manager = key.field_manager, "Rebuilt desired document from managedFields");
            let owned = self.documents.store(&key, &owned_document(&whole, &key));
            let mut entry = KeyState::new(owned, view.metadata.uid.clone());
            entry.last = Some(
                crate::outcome::for_key(&key, Action::unchanged)
                    .with_message("rebuilt from managedFields"),
            );
            self.entries.insert(key.clone(), entry);
            let held = self.objects.entry(object.clone()).or_default();
            held.add_key(key);
            if held.view.as_ref().is_none_or(|v| is_newer(view, v)) {
                held.view = Some(view.clone());
            }
        }
    }

    /// The key of `object` that holds it, if its phase matches.
    pub(super) fn busy_in(
        &self,
        object: &ObjectRef,
        phase: impl Fn(&Phase) -> bool,
    ) -> Option<DesiredKey> {
        let key = self.objects.get(object)?.busy.clone()?;
        phase(&self.entries.get(&key)?.phase).then_some(key)
    }

    pub(super) fn report(
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
