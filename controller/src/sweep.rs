//! The first reconcile of every cached object after a start, handed to its controller a few
//! at a time.
//!
//! kube-rs's scheduler takes in every reference it is sent as soon as it is polled, and its
//! tables keep the room they once needed. Sent all at once after the first list, the
//! references of 3,000 clusters (about 15,000 objects over four controllers) were held there
//! together: a peak that only a restart reached (docs/performance-history.md, "Memory"). The sweep
//! keeps at most `width` of its references waiting or in a reconcile; each reconcile's end,
//! as the controller reports it, makes room for the next.

use crate::trigger::Wake;
use crate::watches::{Watched, reference};
use kube::runtime::controller::{Action, Error};
use kube::runtime::reflector::{ObjectRef, Store};
use std::collections::HashSet;
use std::sync::Mutex;
use tokio::sync::Notify;

/// One controller's sweep.
pub struct Sweep {
    width: usize,
    /// The objects sent and not yet reconciled: (namespace, name).
    outstanding: Mutex<HashSet<(Option<String>, String)>>,
    room: Notify,
}

impl Sweep {
    /// A sweep that keeps at most `width` (at least 1) of its references outstanding.
    pub fn new(width: usize) -> Self {
        Self {
            width: width.max(1),
            outstanding: Mutex::default(),
            room: Notify::new(),
        }
    }

    /// Sends `wake` a reference to every object in `store`, waiting for room before each.
    /// Returns when every one was sent, or when the controller is gone.
    pub async fn feed<K: Watched>(&self, store: &Store<K>, wake: &Wake<K>) {
        // A pointer per object; one that changes before it is sent is held twice until then.
        let objects = store.state();
        let count = objects.len();
        for object in objects {
            let r = reference(&*object);
            drop(object);
            self.wait_for_room(&r).await;
            if !wake.send(r) {
                return;
            }
        }
        tracing::debug!(kind = %K::kind(&()), count, "Every cached object handed to its controller");
    }

    /// The controller reported what became of a reference: reconciled, failed, or found
    /// gone (deleted since). Whichever, if the sweep sent it, there is room for another.
    pub fn reported<K, E, Q>(&self, result: &Result<(ObjectRef<K>, Action), Error<E, Q>>)
    where
        K: kube::runtime::reflector::Lookup,
    {
        let (namespace, name) = match result {
            Ok((r, _)) => (&r.namespace, &r.name),
            Err(Error::ReconcilerFailed(_, r) | Error::ObjectNotFound(r)) => {
                (&r.namespace, &r.name)
            }
            Err(_) => return,
        };
        self.done(namespace.as_deref(), name);
    }

    /// The controller is done with the object `namespace`/`name`.
    fn done(&self, namespace: Option<&str>, name: &str) {
        let key = (namespace.map(str::to_owned), name.to_owned());
        if self.lock().remove(&key) {
            self.room.notify_one();
        }
    }

    async fn wait_for_room<K: Watched>(&self, r: &ObjectRef<K>) {
        loop {
            // Taken before looking, so that a `done` in between is not missed.
            let room = self.room.notified();
            {
                let mut outstanding = self.lock();
                if outstanding.len() < self.width {
                    outstanding.insert((r.namespace.clone(), r.name.clone()));
                    return;
                }
            }
            room.await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<(Option<String>, String)>> {
        // Nothing panics while holding it; a poisoned set is still a set.
        self.outstanding
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::WorkspaceTemplateApply;
    use crate::trigger::Trigger;
    use futures::StreamExt;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use serde_json::json;
    use std::collections::BTreeSet;
    use std::sync::Arc;

    fn apply(name: &str) -> WorkspaceTemplateApply {
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
            "kind": "WorkspaceTemplateApply",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"templateRef": {"name": "t"}},
        }))
        .expect("an apply")
    }

    fn store_of(names: &[String]) -> Store<WorkspaceTemplateApply> {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&Event::Init);
        for name in names {
            writer.apply_watcher_event(&Event::InitApply(apply(name)));
        }
        writer.apply_watcher_event(&Event::InitDone);
        store
    }

    #[tokio::test]
    async fn whatever_became_of_a_reference_makes_room() {
        type Reported = Result<
            (ObjectRef<WorkspaceTemplateApply>, Action),
            Error<std::io::Error, std::io::Error>,
        >;
        let sweep = Sweep::new(1);
        let r = || ObjectRef::<WorkspaceTemplateApply>::new("a").within("ns");
        let erased = || Box::new(r().erase());
        let failed = || std::io::Error::other("failed");
        let reports: [(&str, Reported); 3] = [
            ("reconciled", Ok((r(), Action::await_change()))),
            ("failed", Err(Error::ReconcilerFailed(failed(), erased()))),
            ("found gone", Err(Error::ObjectNotFound(erased()))),
        ];
        for (what, report) in reports {
            sweep.wait_for_room(&r()).await;
            sweep.reported(&report);
            assert!(
                sweep.lock().is_empty(),
                "{what}: the sweep still waits for it"
            );
        }
        // What has no object says nothing of one.
        sweep.wait_for_room(&r()).await;
        let queue_error: Reported = Err(Error::QueueError(failed()));
        sweep.reported(&queue_error);
        assert_eq!(sweep.lock().len(), 1);
    }

    #[tokio::test]
    async fn every_cached_object_is_sent_once_and_never_more_than_width_unreconciled() {
        let names: Vec<String> = (0..50).map(|i| format!("a{i}")).collect();
        let store = store_of(&names);
        let sweep = Arc::new(Sweep::new(3));
        let trigger = Trigger::default();
        let (sender, mut receiver) = (trigger.wake(), trigger.into_stream());
        let feeding = tokio::spawn({
            let sweep = sweep.clone();
            async move { sweep.feed(&store, &sender).await }
        });
        // A controller that holds what it was sent, and reconciles only when nothing more
        // arrives: the most the sweep lets wait.
        let mut waiting = Vec::new();
        let mut seen = BTreeSet::new();
        let mut most_waiting = 0;
        loop {
            tokio::task::yield_now().await;
            while let Ok(r) = receiver.try_recv() {
                assert!(seen.insert(r.name.clone()), "{} sent twice", r.name);
                waiting.push(r);
            }
            most_waiting = most_waiting.max(waiting.len());
            // An object the sweep did not send makes no room.
            let other = ObjectRef::<WorkspaceTemplateApply>::new("not-sent").within("ns");
            sweep.reported::<_, std::io::Error, std::io::Error>(&Ok((
                other,
                Action::await_change(),
            )));
            let Some(r) = waiting.pop() else {
                if feeding.is_finished() {
                    break;
                }
                continue;
            };
            sweep.reported::<_, std::io::Error, std::io::Error>(&Ok((r, Action::await_change())));
        }
        assert_eq!(most_waiting, 3);
        assert_eq!(seen, names.into_iter().collect::<BTreeSet<_>>());
        assert!(receiver.next().await.is_none(), "the sweep is over");
    }
}
