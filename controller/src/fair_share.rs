//! A fair share of one controller's workers among the namespaces that have work waiting.
//!
//! kube-rs's controller starts reconciles in the order its scheduler releases them: first
//! come, first served. A tenant that queues a thousand objects, or a few that each take long,
//! would make every other tenant's new object wait behind them. So every reconcile takes a
//! [`Permit`] from its controller's [`FairShare`] before it runs (the controller itself is
//! left unbounded: an object waiting here holds no more than a pointer into the cache), and
//! permits go out by a max-min rule:
//!
//! a free worker goes to the namespace that holds the fewest workers now, and among equals
//! to the one whose oldest waiting object has waited longest (first come, first served within
//! a namespace and between equals). A namespace alone uses every worker; a namespace with
//! one new object waits for at most one reconcile per worker to end (the first that ends
//! frees its worker for it), however much another has queued. How long that is depends on
//! how long one reconcile can take, which is why each object's cost is bounded
//! (`reconcile/apply.rs` reads no Secret from the API server, the CRDs bound every list).
//! No worker is kept idle for a namespace that may come: most installs keep every Cluster in
//! one namespace, and would lose that worker for good. Nothing here knows CAPT: a namespace
//! is a string.
//!
//! The queue is visible per namespace ([`QueueCollector`]): its depth and its oldest wait,
//! read at each scrape, and how often it was held back (a worker went to another namespace
//! whose oldest object had waited less).

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Labels: the kind reconciled and the namespace of the waiting objects.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// The kind of the controller.
    pub kind: String,
    /// The namespace.
    pub namespace: String,
}

/// The workers of one controller, shared fairly among namespaces.
#[derive(Debug)]
pub struct FairShare {
    kind: String,
    state: Mutex<State>,
    held_back: Family<QueueLabels, Counter>,
}

#[derive(Debug)]
struct State {
    workers: usize,
    busy: usize,
    namespaces: HashMap<String, Namespace>,
}

#[derive(Debug, Default)]
struct Namespace {
    running: usize,
    waiting: VecDeque<Waiter>,
}

#[derive(Debug)]
struct Waiter {
    since: Instant,
    grant: oneshot::Sender<()>,
}

impl FairShare {
    /// `workers` (at least 1) shared among namespaces for the controller of `kind`; each time
    /// a namespace is held back, `held_back` counts it.
    pub fn new(kind: &str, workers: usize, held_back: Family<QueueLabels, Counter>) -> Arc<Self> {
        Arc::new(Self {
            kind: kind.to_owned(),
            state: Mutex::new(State {
                workers: workers.max(1),
                busy: 0,
                namespaces: HashMap::new(),
            }),
            held_back,
        })
    }

    /// Waits for a worker for an object of `namespace`. The worker is the caller's until
    /// the permit is dropped.
    pub async fn acquire(self: &Arc<Self>, namespace: &str) -> Permit {
        let (grant, granted) = oneshot::channel();
        {
            let mut state = self.lock();
            let waiting = &mut state.namespaces.entry(namespace.to_owned()).or_default();
            waiting.waiting.push_back(Waiter {
                since: Instant::now(),
                grant,
            });
            self.dispatch(&mut state);
        }
        let mut pending = Pending {
            share: self.clone(),
            namespace: namespace.to_owned(),
            granted: Some(granted),
        };
        let granted = pending.granted.as_mut().expect("set above");
        // The sender goes only with a grant, or with this share (which `pending` keeps).
        let _ = granted.await;
        pending.granted = None;
        Permit {
            share: self.clone(),
            namespace: std::mem::take(&mut pending.namespace),
        }
    }

    /// Hands free workers to waiting objects, by the max-min rule (module docs).
    fn dispatch(&self, state: &mut State) {
        while state.busy < state.workers {
            let chosen = state
                .namespaces
                .iter()
                .filter_map(|(name, ns)| Some((ns.running, ns.waiting.front()?.since, name)))
                .min()
                .map(|(_, since, name)| (since, name.clone()));
            let Some((since, name)) = chosen else { break };
            for (other, ns) in &state.namespaces {
                if ns.waiting.front().is_some_and(|w| w.since < since) {
                    self.held_back
                        .get_or_create(&QueueLabels {
                            kind: self.kind.clone(),
                            namespace: other.clone(),
                        })
                        .inc();
                }
            }
            let ns = state.namespaces.get_mut(&name).expect("chosen above");
            let waiter = ns.waiting.pop_front().expect("chosen above");
            // A waiter gone (its reconcile dropped) takes no worker.
            if waiter.grant.send(()).is_ok() {
                ns.running += 1;
                state.busy += 1;
            }
            if ns.running == 0 && ns.waiting.is_empty() {
                state.namespaces.remove(&name);
            }
        }
    }

    /// A worker of `namespace` is free again.
    fn release(&self, namespace: &str) {
        let mut state = self.lock();
        state.busy -= 1;
        if let Some(ns) = state.namespaces.get_mut(namespace) {
            ns.running -= 1;
            if ns.running == 0 && ns.waiting.is_empty() {
                state.namespaces.remove(namespace);
            }
        }
        self.dispatch(&mut state);
    }

    /// Per namespace with objects waiting: how many, and how long the oldest has waited.
    fn queues(&self) -> Vec<(String, usize, f64)> {
        let state = self.lock();
        let now = Instant::now();
        state
            .namespaces
            .iter()
            .filter_map(|(name, ns)| {
                let oldest = ns.waiting.front()?.since;
                let wait = now.duration_since(oldest).as_secs_f64();
                Some((name.clone(), ns.waiting.len(), wait))
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("fair share lock")
    }
}

/// A worker, held by one reconcile; dropped, it goes to the next by the rule.
#[derive(Debug)]
pub struct Permit {
    share: Arc<FairShare>,
    namespace: String,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.share.release(&self.namespace);
    }
}

/// A wait for a permit, dropped before it was taken (the reconcile was dropped): a grant
/// that came meanwhile is given back.
struct Pending {
    share: Arc<FairShare>,
    namespace: String,
    granted: Option<oneshot::Receiver<()>>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(mut granted) = self.granted.take() {
            granted.close();
            if granted.try_recv().is_ok() {
                self.share.release(&self.namespace);
            }
        }
    }
}

/// The queues of every controller's [`FairShare`], read at each scrape:
/// `capt_reconcile_queue_depth{kind,namespace}` and
/// `capt_reconcile_queue_oldest_wait_seconds{kind,namespace}`, for the namespaces that have
/// objects waiting now (a namespace with none has no series).
#[derive(Debug, Default, Clone)]
pub struct QueueCollector {
    shares: Arc<Mutex<Vec<Weak<FairShare>>>>,
}

impl QueueCollector {
    /// Reports the queues of `share` too.
    pub fn add(&self, share: &Arc<FairShare>) {
        self.shares
            .lock()
            .expect("collector lock")
            .push(Arc::downgrade(share));
    }

    fn rows(&self) -> Vec<(QueueLabels, usize, f64)> {
        let shares = self.shares.lock().expect("collector lock");
        let mut rows = Vec::new();
        for share in shares.iter().filter_map(Weak::upgrade) {
            for (namespace, depth, wait) in share.queues() {
                let labels = QueueLabels {
                    kind: share.kind.clone(),
                    namespace,
                };
                rows.push((labels, depth, wait));
            }
        }
        rows
    }
}

impl prometheus_client::collector::Collector for QueueCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = self.rows();
        let gauge = ConstGauge::new(0i64);
        let mut depth = encoder.encode_descriptor(
            "reconcile_queue_depth",
            "Objects waiting for a worker, by kind and namespace",
            None,
            gauge.metric_type(),
        )?;
        for (labels, n, _) in &rows {
            ConstGauge::new(*n as i64).encode(depth.encode_family(labels)?)?;
        }
        let mut oldest = encoder.encode_descriptor(
            "reconcile_queue_oldest_wait",
            "How long the oldest object waiting for a worker has waited, by kind and namespace",
            Some(&Unit::Seconds),
            gauge.metric_type(),
        )?;
        for (labels, _, wait) in &rows {
            ConstGauge::new(*wait).encode(oldest.encode_family(labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn share(workers: usize) -> Arc<FairShare> {
        FairShare::new("Test", workers, Family::default())
    }

    /// Starts waiting for a permit for `namespace`, one tick after the previous one (so that
    /// waits are ordered), and returns the task that holds it once granted.
    async fn wait(
        share: &Arc<FairShare>,
        namespace: &'static str,
    ) -> tokio::task::JoinHandle<Permit> {
        tokio::time::advance(Duration::from_millis(1)).await;
        let share = share.clone();
        let task = tokio::spawn(async move { share.acquire(namespace).await });
        tokio::task::yield_now().await;
        task
    }

    async fn granted(task: &tokio::task::JoinHandle<Permit>) -> bool {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        task.is_finished()
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_namespace_gets_the_next_free_worker_before_a_flood_queued_earlier() {
        let s = share(2);
        // Tenant A floods: a hundred objects, queued first. Alone, it uses both workers.
        let mut flood = Vec::new();
        for _ in 0..100 {
            flood.push(wait(&s, "a").await);
        }
        assert!(granted(&flood[0]).await && granted(&flood[1]).await);
        assert!(!granted(&flood[2]).await);
        // B's one object waits for one of A's reconciles to end, not for A's 98 that waited
        // longer.
        let b = wait(&s, "b").await;
        assert!(!granted(&b).await);
        drop(flood.remove(0).await.unwrap());
        assert!(granted(&b).await, "B waited behind A's flood");
        assert!(!granted(&flood[1]).await);
        // The worker B frees goes back to A.
        drop(b.await.unwrap());
        assert!(granted(&flood[1]).await);
    }

    #[tokio::test(start_paused = true)]
    async fn workers_go_to_the_namespace_holding_fewest_and_among_equals_to_the_longest_waiting() {
        let s = share(4);
        let mut a = Vec::new();
        let mut b = Vec::new();
        for _ in 0..10 {
            a.push(wait(&s, "a").await);
        }
        for _ in 0..10 {
            b.push(wait(&s, "b").await);
        }
        let settle = || async {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        };
        let held = |tasks: &Vec<tokio::task::JoinHandle<Permit>>| {
            tasks.iter().filter(|t| t.is_finished()).count()
        };
        settle().await;
        assert_eq!((held(&a), held(&b)), (4, 0));
        // Each worker A frees goes to B while B holds fewer.
        drop(a.remove(0).await.unwrap());
        settle().await;
        assert_eq!((held(&a), held(&b)), (3, 1));
        drop(a.remove(0).await.unwrap());
        settle().await;
        assert_eq!((held(&a), held(&b)), (2, 2));
        // A worker freed by either goes back to it: it then holds fewer.
        drop(b.remove(0).await.unwrap());
        settle().await;
        assert_eq!(
            (held(&a), held(&b)),
            (2, 2),
            "the freed worker stays with B"
        );
        let c = wait(&s, "c").await;
        drop(a.remove(0).await.unwrap());
        settle().await;
        assert!(c.is_finished(), "C, holding none, gets the next worker");

        // Among namespaces holding as many, the one whose oldest object waited longest.
        let one = share(1);
        let holder = wait(&one, "x").await;
        let first = wait(&one, "d").await;
        let second = wait(&one, "e").await;
        drop(holder.await.unwrap());
        assert!(granted(&first).await && !granted(&second).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_dropped_before_or_after_its_grant_takes_no_worker() {
        let s = share(1);
        let first = wait(&s, "a").await;
        assert!(granted(&first).await);
        let dropped = wait(&s, "a").await;
        let next = wait(&s, "b").await;
        dropped.abort();
        let _ = dropped.await;
        drop(first.await.unwrap());
        assert!(granted(&next).await, "the aborted waiter kept the worker");
        drop(next.await.unwrap());
        // Nothing is held: a new waiter is granted at once.
        let last = wait(&s, "c").await;
        assert!(granted(&last).await);
        assert_eq!(s.lock().busy, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_queues_show_depth_and_oldest_wait_by_namespace_and_who_was_held_back() {
        let s = share(2);
        let collector = QueueCollector::default();
        collector.add(&s);
        let a1 = wait(&s, "a").await;
        let _a2 = wait(&s, "a").await;
        let _a3 = wait(&s, "a").await;
        tokio::time::advance(Duration::from_secs(3)).await;
        let b = wait(&s, "b").await;
        // A holds both workers; A's third and B's one wait.
        let mut rows = collector.rows();
        rows.sort_by(|x, y| x.0.namespace.cmp(&y.0.namespace));
        let shown: Vec<_> = rows
            .iter()
            .map(|(l, d, _)| (l.namespace.as_str(), *d))
            .collect();
        assert_eq!(shown, [("a", 1), ("b", 1)]);
        assert!(rows[0].2 >= 3.0, "A's oldest waited {}", rows[0].2);
        // A worker A frees goes to B, though A's third waited longer: A was held back once.
        drop(a1.await.unwrap());
        assert!(granted(&b).await);
        let rows = collector.rows();
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].0.namespace, "a");
        let a = QueueLabels {
            kind: "Test".into(),
            namespace: "a".into(),
        };
        assert_eq!(s.held_back.get_or_create(&a).get(), 1);
    }
}
