//! Prometheus metrics of the controller.

use crate::fair_share::{QueueCollector, QueueLabels};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// Labels: the kind reconciled.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `CAPTCluster`, `CAPTControlPlane`, `WorkspaceTemplateApply` or `Cluster`.
    pub kind: String,
}

/// Labels: how a write of the leader Lease ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseWriteLabel {
    /// `taken`, `renewed`, `conflict` (another wrote it first), `failed` or `released`.
    pub result: String,
}

/// Labels: the kind and the error.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The kind.
    pub kind: String,
    /// The error variant.
    pub error: String,
}

/// Labels: a field manager.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ManagerLabel {
    /// The field manager.
    pub manager: String,
}

/// Labels: the kind of an object written in a loop, and the manager that wrote it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLoopLabels {
    /// The written object's kind (`Workspace`, `WorkspaceTemplateApply`, ...).
    pub kind: String,
    /// The field manager of the writes.
    pub manager: String,
}

/// Labels: a phase reached.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// The phase (`Ready`, `Failed`).
    pub phase: String,
}

/// Labels: the deleted resource type.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceTypeLabel {
    /// The kind.
    pub resource_type: String,
}

/// Every metric of the controller.
#[derive(Clone)]
pub struct Metrics {
    /// Reconciles finished, by kind.
    pub reconciles: Family<KindLabel, Counter>,
    /// Time from an object's first wake to the start of its reconcile, by kind
    /// ([`crate::trigger`]).
    pub queue_duration: Family<KindLabel, Histogram>,
    /// Time a reconcile took, its publications' delivery included, by kind.
    pub reconcile_duration: Family<KindLabel, Histogram>,
    /// Reconcile errors by kind and error.
    pub errors: Family<ErrorLabels, Counter>,
    /// Intents sent to the status-applier (repeats are not sent, and not counted).
    pub intents: Family<ManagerLabel, Counter>,
    /// Intents not sent: computed on a cache behind our own last write for the same key.
    pub behind: Family<ManagerLabel, Counter>,
    /// Objects woken after waiting the whole limit for their cache to show our own write.
    pub rewake_gave_up: Counter,
    /// Write loops found (`crate::write_loops`): an object written more often than the limit
    /// allows without a change of what the writes are computed from.
    pub write_loops: Family<WriteLoopLabels, Counter>,
    /// Time from entering Creating to reaching a phase.
    pub phase_transition: Family<PhaseLabel, Histogram>,
    /// Time from deletion request to finalizer removal.
    pub deletion: Family<ResourceTypeLabel, Histogram>,
    /// Failures of the watch of each kind (`diagnostics::watches`).
    pub watch_failures: Family<diagnostics::watches::KindLabel, Counter>,
    /// Objects the API server holds that the controller cannot read, by kind
    /// (`crate::unreadable`).
    pub objects_unreadable: Family<KindLabel, Gauge>,
    /// Times a namespace with objects waiting saw a worker go to another namespace whose
    /// oldest object had waited less ([`crate::fair_share`]).
    pub held_back: Family<QueueLabels, Counter>,
    /// The reconcile queues by kind and namespace, read at each scrape.
    pub queues: QueueCollector,
    /// Reconciles that ran longer than [`LONG_RECONCILE`], by kind (each is logged too).
    pub long_reconciles: Family<KindLabel, Counter>,
    /// Writes of the leader Lease by this replica, by outcome.
    pub lease_writes: Family<LeaseWriteLabel, Counter>,
    /// 1 while this replica leads (may write), else 0.
    pub leading: prometheus_client::metrics::gauge::Gauge,
}

/// A reconcile that runs longer than this is logged with its object and counted
/// (`capt_reconciles_long_total`): with every object's cost bounded, none should.
pub const LONG_RECONCILE: std::time::Duration = std::time::Duration::from_secs(10);

impl Metrics {
    /// Creates and registers the metrics (`capt_` prefix).
    pub fn register(registry: &mut Registry) -> Self {
        let seconds = || Histogram::new(exponential_buckets(0.1, 2.0, 16));
        // 0.25 ms to 33 s: a wake's wait and a reconcile are milliseconds when all is well.
        let short = || Histogram::new(exponential_buckets(0.000_25, 2.0, 18));
        let m = Self {
            reconciles: Family::default(),
            queue_duration: Family::new_with_constructor(short),
            reconcile_duration: Family::new_with_constructor(short),
            errors: Family::default(),
            intents: Family::default(),
            behind: Family::default(),
            rewake_gave_up: Counter::default(),
            write_loops: Family::default(),
            phase_transition: Family::new_with_constructor(seconds),
            deletion: Family::new_with_constructor(seconds),
            watch_failures: Family::default(),
            objects_unreadable: Family::default(),
            held_back: Family::default(),
            queues: QueueCollector::default(),
            long_reconciles: Family::default(),
            lease_writes: Family::default(),
            leading: Default::default(),
        };
        let r = registry.sub_registry_with_prefix("capt");
        r.register(
            "reconciles",
            "Reconciles finished, by kind",
            m.reconciles.clone(),
        );
        r.register_with_unit(
            "reconcile_queue_duration",
            "Time from an object's first wake to the start of its reconcile, by kind",
            Unit::Seconds,
            m.queue_duration.clone(),
        );
        r.register_with_unit(
            "reconcile_duration",
            "Time a reconcile took, its publications' delivery included, by kind",
            Unit::Seconds,
            m.reconcile_duration.clone(),
        );
        r.register(
            "reconcile_errors",
            "Reconcile errors by kind and error",
            m.errors.clone(),
        );
        r.register(
            "intents_published",
            "Intents sent to the status-applier",
            m.intents.clone(),
        );
        r.register(
            "intents_behind",
            "Intents not sent: computed on a cache behind our own last write for the same key",
            m.behind.clone(),
        );
        r.register(
            "rewake_gave_up",
            "Objects woken after waiting the whole limit for their cache to show our own write",
            m.rewake_gave_up.clone(),
        );
        r.register(
            "write_loops",
            "Objects written more often than --write-loop-limit allows within \
             --write-loop-window-seconds without a change of their spec or of what the writes \
             observe, by kind and manager (each reported at most once per window)",
            m.write_loops.clone(),
        );
        r.register_with_unit(
            "phase_transition_duration",
            "Time from entering Creating to reaching the phase",
            Unit::Seconds,
            m.phase_transition.clone(),
        );
        r.register_with_unit(
            "resource_deletion_duration",
            "Time from the deletion request to the finalizer's removal",
            Unit::Seconds,
            m.deletion.clone(),
        );
        r.register(
            "watch_failures",
            "Failures of the watch of each kind (it retries with a backoff; /readyz fails while \
             one keeps failing)",
            m.watch_failures.clone(),
        );
        r.register(
            "objects_unreadable",
            "Objects the controller cannot read (they do not fit its types), by kind: each is \
             skipped, with a Warning Event (reason Unreadable), until it is fixed or deleted",
            m.objects_unreadable.clone(),
        );
        r.register(
            "reconcile_held_back",
            "Times a namespace with objects waiting for a worker saw one go to another \
             namespace whose oldest object had waited less (its fair share), by kind and \
             namespace",
            m.held_back.clone(),
        );
        r.register(
            "reconciles_long",
            "Reconciles that ran longer than 10 seconds, by kind (each is logged with its object)",
            m.long_reconciles.clone(),
        );
        r.register(
            "leader_lease_writes",
            "Writes of the leader Lease by this replica, by result (taken, renewed, conflict, failed, released)",
            m.lease_writes.clone(),
        );
        r.register(
            "leading",
            "1 while this replica leads and may write, else 0",
            m.leading.clone(),
        );
        // capt_reconcile_queue_depth and capt_reconcile_queue_oldest_wait_seconds.
        r.register_collector(Box::new(m.queues.clone()));
        m
    }

    /// The histograms of `kind`'s waits for a reconcile and of its reconciles' durations:
    /// taken once per controller, they are observed without a lookup per reconcile.
    pub fn durations(&self, kind: &str) -> (Histogram, Histogram) {
        let label = KindLabel { kind: kind.into() };
        (
            self.queue_duration.get_or_create(&label).clone(),
            self.reconcile_duration.get_or_create(&label).clone(),
        )
    }

    /// Counts a finished reconcile.
    pub fn reconciled(&self, kind: &str) {
        self.reconciles
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc();
    }
}
