//! The health of a process's watches, one entry per watched kind, which `/readyz` answers
//! from: a process whose watch of some kind has not listed that kind yet, or keeps failing,
//! works on a partial picture of the cluster and must say so.
//!
//! "Keeps failing" is [`FAILING_AFTER`] failures in a row, the last within
//! [`FAILING_WINDOW`]. kube-rs's watcher retries with a backoff of at most 30 s, so a watch
//! that cannot list or watch fails at least that often; one failure alone is a dropped
//! connection that the next attempt mends. A watch that was re-established yields nothing
//! until something changes, so a success is not always seen: the window ends the failing
//! state of a watch that failed and then went quiet.
//!
//! A success is a list completed or a change watched ([`WatchReport::saw`]), never a page of
//! a list: kube-rs's watcher hands a list's objects on page by page and starts the list again
//! from its first page after a failure, so a relist that fails on its third page every time
//! still delivers two pages each time, and counting those as successes kept such a watch
//! ready forever.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::runtime::watcher;

/// Failures in a row after which a watch counts as failing.
pub const FAILING_AFTER: u32 = 2;
/// How long after its last failure a watch still counts as failing (twice kube-rs's longest
/// backoff).
pub const FAILING_WINDOW: Duration = Duration::from_secs(60);

/// Labels: the watched kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// The kind.
    pub kind: String,
}

/// The health of every watch of a process. Cloning shares it.
#[derive(Clone, Default)]
pub struct WatchHealth {
    kinds: Arc<Mutex<BTreeMap<String, State>>>,
    failures: Family<KindLabel, Counter>,
}

#[derive(Debug, Default)]
struct State {
    listed: bool,
    failures_in_a_row: u32,
    last_failure: Option<(Instant, String)>,
}

impl WatchHealth {
    /// Health that counts each watch failure in `failures` (registered by the caller under
    /// its own prefix, e.g. `capt_watch_failures_total`).
    pub fn new(failures: Family<KindLabel, Counter>) -> Self {
        Self {
            kinds: Arc::default(),
            failures,
        }
    }

    /// The report of the watch of `kind`, which counts as not listed until it says so. Its
    /// failure count is served from now on, at 0.
    pub fn watch(&self, kind: &str) -> WatchReport {
        self.report(kind, kind.to_owned())
    }

    /// The report of the watch of `kind` in `namespace`, one of several watches of `kind`
    /// (one per namespace) that count alone in `/readyz`; its failures are counted under
    /// `kind`.
    pub fn watch_in(&self, kind: &str, namespace: &str) -> WatchReport {
        self.report(kind, format!("{kind} in namespace {namespace}"))
    }

    fn report(&self, kind: &str, watch: String) -> WatchReport {
        let _ = self.failures.get_or_create(&KindLabel {
            kind: kind.to_owned(),
        });
        self.kinds
            .lock()
            .expect("lock")
            .entry(watch.clone())
            .or_default();
        WatchReport {
            health: self.clone(),
            kind: kind.to_owned(),
            watch,
        }
    }

    /// `Ok` when every watch has listed its kind and none keeps failing at `now`; else what is
    /// wrong, one line per watch. A process with no watch yet (one standing by for a leader
    /// Lease) is ready.
    pub fn readiness(&self, now: Instant) -> Result<(), String> {
        let kinds = self.kinds.lock().expect("lock");
        let mut problems = String::new();
        for (kind, state) in kinds.iter() {
            if let Some((at, error)) = state.failing(now) {
                let ago = now.saturating_duration_since(at).as_secs();
                let _ = writeln!(
                    problems,
                    "watch of {kind} failing ({} times in a row, last {ago} s ago): {error}",
                    state.failures_in_a_row
                );
            } else if !state.listed {
                let _ = writeln!(problems, "watch of {kind} has not listed its objects yet");
            }
        }
        match problems.is_empty() {
            true => Ok(()),
            false => Err(problems),
        }
    }
}

impl State {
    fn failing(&self, now: Instant) -> Option<(Instant, &str)> {
        let (at, error) = self.last_failure.as_ref()?;
        (self.failures_in_a_row >= FAILING_AFTER
            && now.saturating_duration_since(*at) < FAILING_WINDOW)
            .then_some((*at, error.as_str()))
    }
}

/// What the watch of one kind reports of itself.
#[derive(Clone)]
pub struct WatchReport {
    health: WatchHealth,
    /// The kind, as its failures are counted.
    kind: String,
    /// The watch, as `/readyz` names it.
    watch: String,
}

impl WatchReport {
    /// What one step of the watch yielded at `now`: a list completed (`InitDone`) or a
    /// change watched (`Apply`, `Delete`) shows that it works; a failure counts; the start
    /// of a list (`Init`: kube-rs announces a list before asking for it) and each object of
    /// a list (`InitApply`: the list may still fail on a later page) show nothing yet.
    pub fn saw<K>(&self, step: &Result<watcher::Event<K>, watcher::Error>, now: Instant) {
        match step {
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Ok(watcher::Event::InitDone) => self.listed(),
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => self.succeeded(),
            Err(error) => self.failed(error, now),
        }
    }

    /// The watch listed its kind (a first list or a relist completed).
    pub fn listed(&self) {
        self.update(|s| {
            s.listed = true;
            s.failures_in_a_row = 0;
        });
    }

    /// The watch delivered a change outside a list: it works. (Not an object of a list:
    /// [`WatchReport::saw`].)
    pub fn succeeded(&self) {
        self.update(|s| s.failures_in_a_row = 0);
    }

    /// The watch failed at `now` with `error` (it retries with a backoff).
    pub fn failed(&self, error: &dyn std::fmt::Display, now: Instant) {
        self.health
            .failures
            .get_or_create(&KindLabel {
                kind: self.kind.clone(),
            })
            .inc();
        let error = error.to_string();
        self.update(|s| {
            s.failures_in_a_row += 1;
            s.last_failure = Some((now, error));
        });
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        let mut kinds = self.health.kinds.lock().expect("lock");
        f(kinds.entry(self.watch.clone()).or_default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> WatchHealth {
        WatchHealth::new(Family::default())
    }

    #[test]
    fn a_process_is_ready_only_once_every_watch_has_listed() {
        let health = health();
        let now = Instant::now();
        assert_eq!(health.readiness(now), Ok(()), "no watch yet: standing by");
        let clusters = health.watch("Cluster");
        let secrets = health.watch("Secret");
        clusters.listed();
        let not_ready = health.readiness(now).unwrap_err();
        assert_eq!(
            not_ready,
            "watch of Secret has not listed its objects yet\n"
        );
        secrets.listed();
        assert_eq!(health.readiness(now), Ok(()));
    }

    #[test]
    fn a_watch_that_keeps_failing_makes_the_process_unready_with_its_error() {
        let health = health();
        let clusters = health.watch("Cluster");
        clusters.listed();
        let t0 = Instant::now();
        clusters.failed(&"connection reset", t0);
        assert_eq!(health.readiness(t0), Ok(()), "one failure is a blip");
        clusters.failed(&"forbidden", t0 + Duration::from_secs(2));
        let at = t0 + Duration::from_secs(5);
        assert_eq!(
            health.readiness(at).unwrap_err(),
            "watch of Cluster failing (2 times in a row, last 3 s ago): forbidden\n"
        );
        assert_eq!(
            health.readiness(t0 + Duration::from_secs(2) + FAILING_WINDOW),
            Ok(()),
            "quiet for the whole window after its last failure"
        );
        clusters.failed(&"forbidden", at);
        clusters.succeeded();
        assert_eq!(health.readiness(at), Ok(()), "an event since: it works");
        let counted = health
            .failures
            .get_or_create(&KindLabel {
                kind: "Cluster".into(),
            })
            .get();
        assert_eq!(counted, 3);
    }

    #[test]
    fn a_relist_that_fails_on_a_later_page_every_time_keeps_the_process_unready() {
        use watcher::Event::{Apply, Init, InitApply, InitDone};
        let health = health();
        let templates = health.watch("WorkspaceTemplate");
        let t0 = Instant::now();
        let failed = || Err(watcher::Error::NoResourceVersion);
        // Listed once, then each relist delivers two pages and fails on the third; kube-rs
        // starts the list again from its first page each time.
        let mut steps: Vec<Result<watcher::Event<&str>, watcher::Error>> =
            vec![Ok(Init), Ok(InitApply("a")), Ok(InitDone), failed()];
        for _ in 0..3 {
            steps.extend([Ok(Init), Ok(InitApply("a")), Ok(InitApply("b")), failed()]);
        }
        for (i, step) in steps.iter().enumerate() {
            templates.saw(step, t0 + Duration::from_secs(i as u64));
        }
        let now = t0 + Duration::from_secs(steps.len() as u64);
        let not_ready = health.readiness(now).unwrap_err();
        assert!(
            not_ready.starts_with("watch of WorkspaceTemplate failing (4 times in a row"),
            "{not_ready}"
        );
        // A relist that completes, or a change watched, shows that it works again.
        templates.saw::<&str>(&Ok(InitDone), now);
        assert_eq!(health.readiness(now), Ok(()));
        templates.saw::<&str>(&failed(), now);
        templates.saw::<&str>(&failed(), now);
        assert!(health.readiness(now).is_err());
        templates.saw(&Ok(Apply("a")), now);
        assert_eq!(health.readiness(now), Ok(()));
    }

    #[test]
    fn a_watch_that_fails_before_its_first_list_says_why() {
        let health = health();
        let templates = health.watch("WorkspaceTemplate");
        let t0 = Instant::now();
        templates.failed(&"403 forbidden", t0);
        assert_eq!(
            health.readiness(t0).unwrap_err(),
            "watch of WorkspaceTemplate has not listed its objects yet\n"
        );
        templates.failed(&"403 forbidden", t0);
        assert!(
            health
                .readiness(t0)
                .unwrap_err()
                .starts_with("watch of WorkspaceTemplate failing (2 times in a row")
        );
    }
}
