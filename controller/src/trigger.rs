//! What wakes a controller: the references it is sent, and since when each has waited.
//!
//! The wait is controller-runtime's workqueue "queue duration": from the first wake of an
//! object that is not yet reconciled to the start of its reconcile. It is everything between
//! a change and the reconcile that answers it (kube-rs's scheduler, the bound on reconciles
//! at once, an object held while its previous reconcile runs) and is what a reconcile's own
//! duration does not show.

use futures::channel::mpsc;
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The references a controller of `K` is woken with, sent by the watches that wake it.
pub struct Trigger<K: Resource<DynamicType = ()>> {
    wake: Wake<K>,
    receiver: mpsc::UnboundedReceiver<ObjectRef<K>>,
}

impl<K: Resource<DynamicType = ()>> Default for Trigger<K> {
    fn default() -> Self {
        let (sender, receiver) = mpsc::unbounded();
        let waiting = Arc::new(Waiting(Mutex::default()));
        Self {
            wake: Wake { sender, waiting },
            receiver,
        }
    }
}

impl<K: Resource<DynamicType = ()> + 'static> Trigger<K> {
    /// What wakes an object of `K`.
    pub fn wake(&self) -> Wake<K> {
        self.wake.clone()
    }

    /// Since when each woken object has waited for its reconcile.
    pub fn waiting(&self) -> Arc<Waiting<K>> {
        self.wake.waiting.clone()
    }

    /// The stream of references to reconcile (`Controller::reconcile_on`).
    pub fn into_stream(self) -> mpsc::UnboundedReceiver<ObjectRef<K>> {
        self.receiver
    }

    /// The names sent so far and not yet taken.
    #[cfg(test)]
    pub(crate) fn drain(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(r) = self.receiver.try_recv() {
            out.push(r.name);
        }
        out
    }
}

/// Sends an object's reference to its controller.
pub struct Wake<K: Resource<DynamicType = ()>> {
    sender: mpsc::UnboundedSender<ObjectRef<K>>,
    waiting: Arc<Waiting<K>>,
}

impl<K: Resource<DynamicType = ()>> Clone for Wake<K> {
    fn clone(&self) -> Self {
        Self {
            sender: self.sender.clone(),
            waiting: self.waiting.clone(),
        }
    }
}

impl<K: Resource<DynamicType = ()>> Wake<K> {
    /// Wakes `r`. False when its controller is gone.
    pub fn send(&self, r: ObjectRef<K>) -> bool {
        self.waiting.woken(&r);
        self.sender.unbounded_send(r).is_ok()
    }
}

/// When each object woken and not yet reconciled was first woken. An entry lives from a wake
/// to the start of the reconcile, or to the controller's report that the object is gone: no
/// longer than the controller's own queue holds the reference.
pub struct Waiting<K: Resource<DynamicType = ()>>(Mutex<HashMap<ObjectRef<K>, Instant>>);

impl<K: Resource<DynamicType = ()>> Waiting<K> {
    fn woken(&self, r: &ObjectRef<K>) {
        let mut since = self.0.lock().expect("lock");
        // A wake of an object already waiting joins it (the scheduler keeps one request):
        // the wait is from the first.
        if !since.contains_key(r) {
            since.insert(r.clone(), Instant::now());
        }
    }

    /// The reconcile of `r` starts, or its controller found it gone: how long it waited, if
    /// it was woken.
    pub fn ended(&self, r: &ObjectRef<K>) -> Option<Duration> {
        let since = self.0.lock().expect("lock").remove(r)?;
        Some(since.elapsed())
    }

    /// Objects waiting now.
    #[cfg(test)]
    fn count(&self) -> usize {
        self.0.lock().expect("lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::CAPTControlPlane;

    #[tokio::test(start_paused = true)]
    async fn an_object_waits_from_its_first_wake_to_its_reconcile() {
        let trigger = Trigger::<CAPTControlPlane>::default();
        let (wake, waiting) = (trigger.wake(), trigger.waiting());
        let mut stream = trigger.into_stream();
        let a = ObjectRef::new("a").within("ns");
        assert!(wake.send(a.clone()));
        tokio::time::advance(Duration::from_millis(30)).await;
        // Woken again while waiting: still one wait, counted from the first wake.
        assert!(wake.send(a.clone()));
        assert_eq!(waiting.count(), 1);
        tokio::time::advance(Duration::from_millis(20)).await;
        assert_eq!(waiting.ended(&a), Some(Duration::from_millis(50)));
        assert_eq!(waiting.count(), 0, "a reconcile's start ends the wait");
        assert_eq!(waiting.ended(&a), None, "an object not woken did not wait");

        // Woken during its reconcile: a new wait, from that wake.
        assert!(wake.send(a.clone()));
        tokio::time::advance(Duration::from_millis(5)).await;
        assert_eq!(waiting.ended(&a), Some(Duration::from_millis(5)));
        assert_eq!(stream.try_recv().ok().map(|r| r.name).as_deref(), Some("a"));
    }
}
