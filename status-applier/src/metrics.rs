//! Prometheus metrics of the applier. Labels have few values: managers, actions, paths and
//! status codes, never object names.

use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// What happened to one intent or one apply: the vocabulary of logs, metrics and answers.
pub use status_applier_api::outcome::Action;

/// Labels: field manager and action.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ManagerAction {
    /// Field manager.
    pub manager: String,
    /// Action.
    pub action: Action,
}

// By hand, as the derive would: `Action` is the API crate's, which knows no Prometheus.
impl EncodeLabelSet for ManagerAction {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [
            ("manager", self.manager.as_str()),
            ("action", self.action.as_str()),
        ]
        .encode(encoder)
    }
}

/// Labels: field manager.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ManagerLabel {
    /// Field manager.
    pub manager: String,
}

/// How a wait for a newer view of an object ended (an intent's `notOlderThan`).
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelValue,
)]
pub enum WaitEnd {
    /// The watch delivered a view at least as new.
    #[allow(non_camel_case_types)]
    caught_up,
    /// The wait ran out; the object was read.
    #[allow(non_camel_case_types)]
    read,
}

/// Labels: field manager and how its wait for a view ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ManagerWaitEnd {
    /// Field manager.
    pub manager: String,
    /// How the wait ended.
    pub end: WaitEnd,
}

/// Labels of a conflict.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConflictLabels {
    /// Our field manager.
    pub manager: String,
    /// The conflicting path.
    pub path: String,
    /// `local` (two of our managers) or `foreign`.
    pub owner: String,
}

/// Labels: the HTTP status class of an API error.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    /// `404`, `409`, `422`, `5xx`, ...
    pub code: String,
}

/// Every metric of the applier.
#[derive(Clone)]
pub struct Metrics {
    /// Intents received, by manager and what was done with them.
    pub intents: Family<ManagerAction, Counter>,
    /// Apply attempts by manager and outcome; `unchanged` counts skipped no-op applies.
    pub applies: Family<ManagerAction, Counter>,
    /// PATCH requests sent (writes), by manager.
    pub writes: Family<ManagerLabel, Counter>,
    /// Intents merged into an apply that was already pending or in flight.
    pub coalesced: Family<ManagerLabel, Counter>,
    /// Documents that waited for a view of their object as new as an intent's
    /// `notOlderThan`, by manager and how the wait ended.
    pub view_waits: Family<ManagerWaitEnd, Counter>,
    /// Conflicts, by manager, path and kind of owner.
    pub conflicts: Family<ConflictLabels, Counter>,
    /// Errors answered by the API server, by status.
    pub api_errors: Family<CodeLabel, Counter>,
    /// Time from taking a desired document to the API server's answer.
    pub apply_duration: Family<ManagerLabel, Histogram>,
    /// Desired documents waiting for an apply.
    pub pending: Gauge,
    /// 1 while this replica may write (no leader election, or its Lease names this pod and
    /// has not expired), else 0 (`leadership`).
    pub leading: Gauge,
    /// Failures of the watch of each kind (`diagnostics::watches`).
    pub watch_failures: Family<diagnostics::watches::KindLabel, Counter>,
}

impl Metrics {
    /// Creates the metrics and registers them under `status_applier_`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            intents: Family::default(),
            applies: Family::default(),
            writes: Family::default(),
            coalesced: Family::default(),
            view_waits: Family::default(),
            conflicts: Family::default(),
            api_errors: Family::default(),
            apply_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 14))
            }),
            pending: Gauge::default(),
            leading: Gauge::default(),
            watch_failures: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("status_applier");
        r.register(
            "intents",
            "Intents received, by field manager and action",
            m.intents.clone(),
        );
        r.register(
            "applies",
            "Apply attempts by field manager and action (unchanged: no-op, no request)",
            m.applies.clone(),
        );
        r.register(
            "api_writes",
            "PATCH requests sent, by field manager",
            m.writes.clone(),
        );
        r.register(
            "coalesced_intents",
            "Intents merged into an apply already pending",
            m.coalesced.clone(),
        );
        r.register(
            "view_waits",
            "Documents that waited for a view as new as an intent's notOlderThan, by field manager and end (caught_up, read)",
            m.view_waits.clone(),
        );
        r.register(
            "leading",
            "1 while this replica may write (it leads, or there is no leader election), else 0",
            m.leading.clone(),
        );
        r.register(
            "conflicts",
            "Field conflicts by manager, path and owner (local or foreign)",
            m.conflicts.clone(),
        );
        r.register(
            "watch_failures",
            "Failures of the watch of each kind (it retries with a backoff; /readyz fails while one keeps failing)",
            m.watch_failures.clone(),
        );
        r.register(
            "api_errors",
            "Errors answered by the API server, by status",
            m.api_errors.clone(),
        );
        r.register_with_unit(
            "apply_duration",
            "Time from taking a desired document to the API server's answer",
            Unit::Seconds,
            m.apply_duration.clone(),
        );
        r.register(
            "pending_documents",
            "Desired documents waiting for an apply",
            m.pending.clone(),
        );
        m
    }

    /// Counts an apply attempt's action.
    pub fn applied(&self, manager: &str, action: Action) {
        self.applies
            .get_or_create(&ManagerAction {
                manager: manager.to_owned(),
                action,
            })
            .inc();
    }

    /// Counts an intent's action.
    pub fn intent(&self, manager: &str, action: Action) {
        self.intents
            .get_or_create(&ManagerAction {
                manager: manager.to_owned(),
                action,
            })
            .inc();
    }

    /// Counts a conflict.
    pub fn conflict(&self, manager: &str, path: &str, local: bool) {
        let owner = if local { "local" } else { "foreign" };
        self.conflicts
            .get_or_create(&ConflictLabels {
                manager: manager.to_owned(),
                path: path.to_owned(),
                owner: owner.into(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_label_by_their_name() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics
            .intents
            .get_or_create(&ManagerAction {
                manager: "m".into(),
                action: Action::conflict,
            })
            .inc();
        let text = diagnostics::metrics_text(&registry);
        assert!(
            text.contains(r#"intents_total{manager="m",action="conflict"} 1"#),
            "{text}"
        );
    }
}
