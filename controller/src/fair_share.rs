//! A fair share of one controller's workers among the namespaces that have work waiting.
//!
//! kube-rs's controller starts reconciles in the order its scheduler releases them: first
//! come, first served. A tenant that queues a thousand objects, or a few that each take long,
//! would make every other tenant's new object wait behind them. So a controller's objects
//! wait here, in a [`FairQueue`] in front of kube-rs, and are handed to it one at a time, each
//! with a worker of its own ([`Permit`]), by a max-min rule:
//!
//! a free worker goes to the namespace that holds the fewest workers now, and among equals
//! to the one whose oldest waiting object has waited longest (first come, first served within
//! a namespace and between equals). A namespace alone uses every worker; a namespace with
//! one new object waits for at most one reconcile per worker to end (the first that ends
//! frees its worker for it), however much another has queued. How long that is depends on
//! how long one reconcile can take, which is why each object's cost is bounded
//! (the CRDs bound every list; the Secrets an apply waits for are read a few at a time, once
//! for every apply asking at once: `crate::seen_secrets`).
//! No worker is kept idle for a namespace that may come: most installs keep every Cluster in
//! one namespace, and would lose that worker for good. Nothing here knows CAPT: a namespace
//! is a string.
//!
//! The queue is in front of kube-rs, not behind it, because of what a wait costs. Behind it,
//! every object waiting for a worker was a reconcile kube-rs had started (its future, its
//! tracing span, an entry its scheduler searches at each wake): thousands at once while
//! 3,000 clusters were provisioned. Here a waiting object is its reference, once: an object
//! woken again while it waits stays where it is, and one woken while its reconcile runs is
//! queued again when that ends (the rule of client-go's work queue: never two reconciles of
//! one object, never one lost wake).
//! kube-rs still runs the reconciles, and schedules requeues and retries: a reconcile it
//! starts that the queue did not hand it ([`FairQueue::start`] finds no permit) joins the
//! queue instead of running.
//!
//! The queue is visible per namespace ([`QueueCollector`]): its depth and its oldest wait,
//! read at each scrape, and how often it was held back (a worker went to another namespace
//! whose oldest object had waited less).

use futures::channel::mpsc;
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use tokio::time::Instant;

/// Labels: the kind reconciled and the namespace of the waiting objects.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// The kind of the controller.
    pub kind: String,
    /// The namespace.
    pub namespace: String,
}

/// The objects of one controller waiting for a worker, and the workers, shared fairly
/// among namespaces.
pub struct FairQueue<K: Resource<DynamicType = ()>> {
    kind: String,
    state: Mutex<State<K>>,
    held_back: Family<QueueLabels, Counter>,
    /// Where an object handed a worker goes: kube-rs's `reconcile_on`.
    handed: mpsc::UnboundedSender<ObjectRef<K>>,
}

struct State<K: Resource<DynamicType = ()>> {
    workers: usize,
    namespaces: HashMap<String, Namespace<K>>,
    /// Waiting, in their namespace's queue.
    queued: HashSet<ObjectRef<K>>,
    /// Holding a worker: handed to kube-rs (`false`) or reconciling (`true`).
    holding: HashMap<ObjectRef<K>, bool>,
    /// Woken while holding a worker: queued again when it gives the worker back.
    again: HashSet<ObjectRef<K>>,
}

struct Namespace<K: Resource<DynamicType = ()>> {
    holding: usize,
    waiting: VecDeque<(ObjectRef<K>, Instant)>,
}

impl<K: Resource<DynamicType = ()>> Default for Namespace<K> {
    fn default() -> Self {
        Self {
            holding: 0,
            waiting: VecDeque::new(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + Send + Sync + 'static> FairQueue<K> {
    /// `workers` (at least 1) shared among namespaces for the controller of `kind`; each time
    /// a namespace is held back, `held_back` counts it. The stream is of the objects handed
    /// a worker, for kube-rs's controller to reconcile.
    pub fn new(
        kind: &str,
        workers: usize,
        held_back: Family<QueueLabels, Counter>,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<ObjectRef<K>>) {
        let (handed, stream) = mpsc::unbounded();
        let queue = Arc::new(Self {
            kind: kind.to_owned(),
            state: Mutex::new(State {
                workers: workers.max(1),
                namespaces: HashMap::new(),
                queued: HashSet::new(),
                holding: HashMap::new(),
                again: HashSet::new(),
            }),
            held_back,
            handed,
        });
        (queue, stream)
    }

    /// `r` has something to reconcile: it waits for a worker (once, however often it is
    /// woken meanwhile), or, holding one, is queued again when it gives it back.
    pub fn wake(&self, r: ObjectRef<K>) {
        let mut state = self.lock();
        if state.queued.contains(&r) {
            return;
        }
        if state.holding.contains_key(&r) {
            state.again.insert(r);
            return;
        }
        state.enqueue(r);
        self.dispatch(&mut state);
    }

    /// kube-rs starts the reconcile of `r`: its worker, if the queue handed it one. `None`:
    /// kube-rs started it on its own (a requeue, a retry), and the caller wakes it instead.
    pub fn start(self: &Arc<Self>, r: &ObjectRef<K>) -> Option<Permit<K>> {
        let mut state = self.lock();
        let started = state.holding.get_mut(r).filter(|started| !**started)?;
        *started = true;
        Some(Permit {
            queue: self.clone(),
            held: r.clone(),
        })
    }

    /// kube-rs found `r` gone from its cache when it came to start it: the worker handed
    /// with it is free, and nothing of it is queued again.
    pub fn gone(&self, r: &ObjectRef<K>) {
        let mut state = self.lock();
        state.again.remove(r);
        if state.holding.get(r) == Some(&false) {
            state.release(r);
            self.dispatch(&mut state);
        }
    }

    /// Hands free workers to waiting objects, by the max-min rule (module docs).
    fn dispatch(&self, state: &mut State<K>) {
        while state.holding.len() < state.workers {
            let chosen = state
                .namespaces
                .iter()
                .filter_map(|(name, ns)| Some((ns.holding, ns.waiting.front()?.1, name)))
                .min()
                .map(|(_, since, name)| (since, name.clone()));
            let Some((since, name)) = chosen else { break };
            for (other, ns) in &state.namespaces {
                if ns.waiting.front().is_some_and(|w| w.1 < since) {
                    self.held_back
                        .get_or_create(&QueueLabels {
                            kind: self.kind.clone(),
                            namespace: other.clone(),
                        })
                        .inc();
                }
            }
            let ns = state.namespaces.get_mut(&name).expect("chosen above");
            let (r, _) = ns.waiting.pop_front().expect("chosen above");
            ns.holding += 1;
            state.queued.remove(&r);
            state.holding.insert(r.clone(), false);
            // The controller gone (shutting down): the worker is never given back, and
            // nothing more is handed.
            let _ = self.handed.unbounded_send(r);
        }
    }

    /// Per namespace with objects waiting: how many, and how long the oldest has waited.
    fn queues(&self) -> Vec<(String, usize, f64)> {
        let state = self.lock();
        let now = Instant::now();
        state
            .namespaces
            .iter()
            .filter_map(|(name, ns)| {
                let oldest = ns.waiting.front()?.1;
                let wait = now.duration_since(oldest).as_secs_f64();
                Some((name.clone(), ns.waiting.len(), wait))
            })
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        // Nothing panics while holding it; a poisoned queue is still a queue.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl<K: Resource<DynamicType = ()>> State<K> {
    fn enqueue(&mut self, r: ObjectRef<K>) {
        let namespace = r.namespace.clone().unwrap_or_default();
        self.queued.insert(r.clone());
        self.namespaces
            .entry(namespace)
            .or_default()
            .waiting
            .push_back((r, Instant::now()));
    }

    /// `r` gives its worker back.
    fn release(&mut self, r: &ObjectRef<K>) {
        if self.holding.remove(r).is_none() {
            return;
        }
        let namespace = r.namespace.clone().unwrap_or_default();
        if let Some(ns) = self.namespaces.get_mut(&namespace) {
            ns.holding -= 1;
            if ns.holding == 0 && ns.waiting.is_empty() {
                self.namespaces.remove(&namespace);
            }
        }
    }
}

/// A worker, held by one reconcile; dropped, it goes to the next by the rule, and the
/// object, if it was woken meanwhile, waits again.
pub struct Permit<K: Resource<DynamicType = ()> + Send + Sync + 'static> {
    queue: Arc<FairQueue<K>>,
    held: ObjectRef<K>,
}

impl<K: Resource<DynamicType = ()> + Send + Sync + 'static> Drop for Permit<K> {
    fn drop(&mut self) {
        let mut state = self.queue.lock();
        state.release(&self.held);
        if state.again.remove(&self.held) {
            state.enqueue(self.held.clone());
        }
        self.queue.dispatch(&mut state);
    }
}

/// What the collector reads of a queue, whatever its kind.
trait Queues: Send + Sync {
    fn kind(&self) -> &str;
    fn queues(&self) -> Vec<(String, usize, f64)>;
}

impl<K: Resource<DynamicType = ()> + Send + Sync + 'static> Queues for FairQueue<K> {
    fn kind(&self) -> &str {
        &self.kind
    }
    fn queues(&self) -> Vec<(String, usize, f64)> {
        FairQueue::queues(self)
    }
}

/// The queues of every controller's [`FairQueue`], read at each scrape:
/// `capt_reconcile_queue_depth{kind,namespace}` and
/// `capt_reconcile_queue_oldest_wait_seconds{kind,namespace}`, for the namespaces that have
/// objects waiting now (a namespace with none has no series).
#[derive(Default, Clone)]
pub struct QueueCollector {
    queues: Arc<Mutex<Vec<Weak<dyn Queues>>>>,
}

impl std::fmt::Debug for QueueCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueCollector").finish_non_exhaustive()
    }
}

impl QueueCollector {
    /// Reports the queues of `queue` too.
    pub fn add<K: Resource<DynamicType = ()> + Send + Sync + 'static>(
        &self,
        queue: &Arc<FairQueue<K>>,
    ) {
        let queue: Arc<dyn Queues> = queue.clone();
        self.queues
            .lock()
            .expect("collector lock")
            .push(Arc::downgrade(&queue));
    }

    fn rows(&self) -> Vec<(QueueLabels, usize, f64)> {
        let queues = self.queues.lock().expect("collector lock");
        let mut rows = Vec::new();
        for queue in queues.iter().filter_map(Weak::upgrade) {
            for (namespace, depth, wait) in queue.queues() {
                let labels = QueueLabels {
                    kind: queue.kind().to_owned(),
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
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::time::Duration;

    type Queue = Arc<FairQueue<ConfigMap>>;
    type Handed = mpsc::UnboundedReceiver<ObjectRef<ConfigMap>>;

    fn queue(workers: usize) -> (Queue, Handed) {
        FairQueue::new("Test", workers, Family::default())
    }

    fn obj(namespace: &str, name: &str) -> ObjectRef<ConfigMap> {
        ObjectRef::new(name).within(namespace)
    }

    /// Wakes `namespace`/`name`, one tick after the previous wake (so that waits are
    /// ordered).
    async fn wake(q: &Queue, namespace: &str, name: &str) {
        tokio::time::advance(Duration::from_millis(1)).await;
        q.wake(obj(namespace, name));
    }

    /// The objects handed to kube-rs since the last look, as `namespace/name`.
    fn handed(h: &mut Handed) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(r) = h.try_recv() {
            out.push(format!("{}/{}", r.namespace.unwrap_or_default(), r.name));
        }
        out
    }

    /// kube-rs starts `namespace`/`name`, which the queue handed it.
    fn start(q: &Queue, namespace: &str, name: &str) -> Permit<ConfigMap> {
        q.start(&obj(namespace, name))
            .unwrap_or_else(|| panic!("{namespace}/{name} was handed no worker"))
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_namespace_gets_the_next_free_worker_before_a_flood_queued_earlier() {
        let (q, mut h) = queue(2);
        // Tenant A floods: a hundred objects, queued first. Alone, it uses both workers.
        for i in 0..100 {
            wake(&q, "a", &i.to_string()).await;
        }
        assert_eq!(handed(&mut h), ["a/0", "a/1"]);
        let a0 = start(&q, "a", "0");
        let a1 = start(&q, "a", "1");
        // B's one object waits for one of A's reconciles to end, not for A's 98 that waited
        // longer.
        wake(&q, "b", "new").await;
        assert!(handed(&mut h).is_empty());
        drop(a0);
        assert_eq!(handed(&mut h), ["b/new"], "B waited behind A's flood");
        // The worker B frees goes back to A.
        drop(start(&q, "b", "new"));
        assert_eq!(handed(&mut h), ["a/2"]);
        drop(a1);
        assert_eq!(handed(&mut h), ["a/3"]);
    }

    #[tokio::test(start_paused = true)]
    async fn workers_go_to_the_namespace_holding_fewest_and_among_equals_to_the_longest_waiting() {
        let (q, mut h) = queue(4);
        for i in 0..10 {
            wake(&q, "a", &i.to_string()).await;
        }
        for i in 0..10 {
            wake(&q, "b", &i.to_string()).await;
        }
        assert_eq!(handed(&mut h), ["a/0", "a/1", "a/2", "a/3"]);
        let mut a: VecDeque<_> = (0..4).map(|i| start(&q, "a", &i.to_string())).collect();
        // Each worker A frees goes to B while B holds fewer.
        drop(a.pop_front());
        assert_eq!(handed(&mut h), ["b/0"]);
        let b0 = start(&q, "b", "0");
        drop(a.pop_front());
        assert_eq!(handed(&mut h), ["b/1"]);
        let _b1 = start(&q, "b", "1");
        // A worker freed by either goes back to it: it then holds fewer.
        drop(b0);
        assert_eq!(handed(&mut h), ["b/2"], "the freed worker stays with B");
        let _b2 = start(&q, "b", "2");
        // C, holding none, gets the next worker.
        wake(&q, "c", "0").await;
        drop(a.pop_front());
        assert_eq!(handed(&mut h), ["c/0"]);

        // Among namespaces holding as many, the one whose oldest object waited longest.
        let (one, mut h) = queue(1);
        wake(&one, "x", "0").await;
        wake(&one, "d", "0").await;
        wake(&one, "e", "0").await;
        assert_eq!(handed(&mut h), ["x/0"]);
        drop(start(&one, "x", "0"));
        assert_eq!(handed(&mut h), ["d/0"]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_object_waits_once_runs_once_at_a_time_and_no_wake_is_lost() {
        let (q, mut h) = queue(2);
        // Woken three times while it waits: one wait, one reconcile.
        wake(&q, "a", "x").await;
        wake(&q, "a", "x").await;
        wake(&q, "a", "x").await;
        assert_eq!(handed(&mut h), ["a/x"]);
        // Woken after it was handed, and again while it runs: it is not handed a second
        // worker, and reconciles once more after this one.
        wake(&q, "a", "x").await;
        let x = start(&q, "a", "x");
        wake(&q, "a", "x").await;
        assert!(handed(&mut h).is_empty());
        assert!(q.start(&obj("a", "x")).is_none(), "one reconcile at a time");
        drop(x);
        assert_eq!(
            handed(&mut h),
            ["a/x"],
            "the wake during its reconcile was lost"
        );
        drop(start(&q, "a", "x"));
        assert!(handed(&mut h).is_empty(), "nothing woke it since");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_kube_rs_starts_on_its_own_or_finds_gone_holds_no_worker() {
        let (q, mut h) = queue(1);
        // A requeue kube-rs started: no worker; the caller wakes it instead.
        assert!(q.start(&obj("a", "requeued")).is_none());
        wake(&q, "a", "requeued").await;
        assert_eq!(handed(&mut h), ["a/requeued"]);
        // Handed, then found deleted by kube-rs: its worker goes to the next, and a wake
        // it had meanwhile is dropped with it.
        wake(&q, "b", "next").await;
        wake(&q, "a", "requeued").await;
        q.gone(&obj("a", "requeued"));
        assert_eq!(handed(&mut h), ["b/next"]);
        let next = start(&q, "b", "next");
        // Found gone while it reconciles (a requeue of it kube-rs started): the running
        // reconcile keeps its worker until it ends.
        q.gone(&obj("b", "next"));
        wake(&q, "c", "0").await;
        assert!(handed(&mut h).is_empty());
        drop(next);
        assert_eq!(handed(&mut h), ["c/0"]);
        assert_eq!(q.lock().holding.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_queues_show_depth_and_oldest_wait_by_namespace_and_who_was_held_back() {
        let (q, mut h) = queue(2);
        let collector = QueueCollector::default();
        collector.add(&q);
        wake(&q, "a", "1").await;
        wake(&q, "a", "2").await;
        wake(&q, "a", "3").await;
        tokio::time::advance(Duration::from_secs(3)).await;
        wake(&q, "b", "1").await;
        assert_eq!(handed(&mut h), ["a/1", "a/2"]);
        let a1 = start(&q, "a", "1");
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
        drop(a1);
        assert_eq!(handed(&mut h), ["b/1"]);
        let rows = collector.rows();
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].0.namespace, "a");
        let a = QueueLabels {
            kind: "Test".into(),
            namespace: "a".into(),
        };
        assert_eq!(q.held_back.get_or_create(&a).get(), 1);
    }
}
