//! Waking a reconciler again once its cache catches up with our own write.
//!
//! A publication computed on a version of its object older than the one our last write for
//! the same key left is not sent ([`crate::publish::Published::Behind`]): what it derived
//! again from the older status would be written for nothing. The reconcile that computes on
//! the newer version must still run, and the object's own status writes do not wake it (its
//! reconciler wakes on lifecycle changes only, `reconcile::lifecycle`). So the object is
//! woken here once its cache shows that version (or it is gone). It is rare, so the cache is
//! looked at every few milliseconds rather than hooked into the watch.

use crate::publish::revision;
use crate::trigger::{Trigger, Wake};
use crate::watches::{Watched, named};
use kube::runtime::reflector::{ObjectRef, Store};
use prometheus_client::metrics::counter::Counter;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a waiting wake looks at the cache.
const LOOK_EVERY: Duration = Duration::from_millis(5);
/// A wake waits no longer than this: the object is woken then anyway.
const WAIT_AT_MOST: Duration = Duration::from_secs(10);

/// Wakes one kind's object: (namespace, name, the resourceVersion to wait for).
type Waker = Arc<dyn Fn(Option<String>, String, u64) + Send + Sync>;

/// The wakers of every kind the controller publishes for, by kind.
#[derive(Default)]
pub struct Rewake {
    by_kind: Mutex<HashMap<String, Waker>>,
    /// Counts the wakes that waited the whole limit (`capt_rewake_gave_up_total`).
    gave_up: Counter,
}

impl Rewake {
    /// Wakers that count in `gave_up` each wake that waited the whole limit.
    pub fn new(gave_up: Counter) -> Self {
        Self {
            by_kind: Mutex::default(),
            gave_up,
        }
    }

    /// Lets objects of `K` be woken through `trigger`, once `store` shows the version.
    pub fn register<K: Watched>(&self, store: Store<K>, trigger: &Trigger<K>) {
        let sender = trigger.wake();
        let gave_up = self.gave_up.clone();
        let waker: Waker = Arc::new(move |namespace, name, version| {
            let key = named::<K>(namespace.as_deref(), &name);
            let wake = wake_when_seen(store.clone(), sender.clone(), key, version, gave_up.clone());
            tokio::spawn(wake);
        });
        self.by_kind
            .lock()
            .expect("lock")
            .insert(K::kind(&()).into_owned(), waker);
    }

    /// Wakes the reconciler of `kind` `namespace`/`name` once its cache shows `version`.
    /// A kind nobody registered is not woken (nothing reconciles it).
    pub fn when_seen(&self, kind: &str, namespace: Option<String>, name: String, version: u64) {
        let waker = self.by_kind.lock().expect("lock").get(kind).cloned();
        if let Some(wake) = waker {
            wake(namespace, name, version);
        }
    }
}

async fn wake_when_seen<K: Watched>(
    store: Store<K>,
    sender: Wake<K>,
    key: ObjectRef<K>,
    version: u64,
    gave_up: Counter,
) {
    let deadline = Instant::now() + WAIT_AT_MOST;
    while !seen(&store, &key, version) {
        if Instant::now() >= deadline {
            // Our write's version never reached the cache: a resourceVersion that does not
            // compare as a number would, or a watch that lost it. Woken anyway.
            tracing::warn!(object = %key, version, "The cache never showed our own write; woken anyway");
            gave_up.inc();
            break;
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
    sender.send(key);
}

/// True when the cache holds `version` of the object or a later one, or no longer holds it.
fn seen<K: Watched>(store: &Store<K>, key: &ObjectRef<K>, version: u64) -> bool {
    let Some(object) = store.get(key) else {
        return true;
    };
    revision(object.meta().resource_version.as_deref()).is_none_or(|v| v >= version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::CAPTControlPlane;
    use futures::StreamExt;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn control_plane(version: &str) -> CAPTControlPlane {
        serde_json::from_value(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
            "metadata": {"name": "demo", "namespace": "team-a", "resourceVersion": version},
            "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "eks"}},
        }))
        .expect("a control plane")
    }

    #[tokio::test]
    async fn an_object_is_woken_once_its_cache_shows_the_version_and_not_before() {
        let mut writer = Writer::<CAPTControlPlane>::default();
        writer.apply_watcher_event(&Event::Apply(control_plane("5")));
        let trigger = Trigger::<CAPTControlPlane>::default();
        let rewake = Rewake::default();
        rewake.register(writer.as_reader(), &trigger);
        let mut woken = trigger.into_stream();

        rewake.when_seen("CAPTControlPlane", Some("team-a".into()), "demo".into(), 7);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            woken.try_recv().is_err(),
            "not woken while the cache is behind"
        );

        writer.apply_watcher_event(&Event::Apply(control_plane("7")));
        let key = tokio::time::timeout(Duration::from_secs(1), woken.next())
            .await
            .expect("woken once the cache shows the version")
            .expect("a reference");
        assert_eq!(key, ObjectRef::new("demo").within("team-a"));
    }

    #[tokio::test]
    async fn a_kind_nobody_registered_wakes_nothing() {
        Rewake::default().when_seen("Widget", None, "w1".into(), 1);
    }
}
