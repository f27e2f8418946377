//! Waiting with a timeout: when a wait started, when it runs out, and when to look again.
//!
//! The start of a wait comes from the object's own conditions (the time a "waiting"
//! condition last turned True), so it survives controller restarts and stays the same across
//! reconciles: messages built from it are stable.

use super::conditions::{self, Status};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use std::time::Duration;

/// A wait that started at `start` and fails after `timeout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    /// When the wait started.
    pub start: Timestamp,
    /// How long it may last.
    pub timeout: Duration,
}

impl Deadline {
    /// A wait from `start` lasting at most `timeout`.
    #[must_use]
    pub fn new(start: Timestamp, timeout: Duration) -> Self {
        Self { start, timeout }
    }

    /// The moment the wait runs out, unless that is beyond the representable range.
    pub fn at(&self) -> Option<Timestamp> {
        self.start.checked_add(self.timeout).ok()
    }

    /// How long the wait has lasted at `now` (zero if `now` is before the start).
    pub fn elapsed(&self, now: Timestamp) -> Duration {
        Duration::try_from(now.duration_since(self.start)).unwrap_or(Duration::ZERO)
    }

    /// True when the wait has lasted `timeout` or longer at `now`.
    pub fn expired(&self, now: Timestamp) -> bool {
        self.elapsed(now) >= self.timeout
    }

    /// What is left of the wait at `now`.
    pub fn remaining(&self, now: Timestamp) -> Duration {
        self.timeout.saturating_sub(self.elapsed(now))
    }

    /// `times out at <RFC 3339>`: stable for a given wait, unlike a countdown.
    pub fn describe(&self) -> String {
        match self.at() {
            Some(at) => format!("times out at {at}"),
            None => "never times out".to_string(),
        }
    }
}

/// When the current wait started, read from the conditions that mark it.
///
/// `markers` lists `(type, status while waiting)`. If any marker exists with another status,
/// the wait is only starting: `now`. Otherwise it started at the latest transition among the
/// markers that exist, or at `fallback` (the object's creation, typically) if none exists.
/// The caller dates the markers it writes from this start, so the next reconcile finds it again.
pub fn waiting_since(
    list: &[Condition],
    markers: &[(&str, Status)],
    fallback: Timestamp,
    now: Timestamp,
) -> Timestamp {
    let found: Vec<&Condition> = markers
        .iter()
        .filter_map(|(type_, _)| conditions::find(list, type_))
        .collect();
    let leaving = markers.iter().any(|(type_, waiting)| {
        conditions::find(list, type_).is_some_and(|c| c.status != waiting.as_str())
    });
    if leaving {
        return now;
    }
    found
        .iter()
        .map(|c| c.last_transition_time.0)
        .max()
        .unwrap_or(fallback)
}

/// When to reconcile again so that the earliest of `remaining` waits is noticed when it runs
/// out: the smallest, but at least one second. `None` when nothing is waited for.
pub fn recheck_after(remaining: impl IntoIterator<Item = Duration>) -> Option<Duration> {
    remaining
        .into_iter()
        .min()
        .map(|d| d.max(Duration::from_secs(1)))
}

/// A timeout failure that stays: the failure condition `type_` is True with one of `reasons`
/// and the status was computed from the current generation (a spec change retries). Returns
/// `(reason, message)`.
pub fn sticky_failure<'a>(
    list: &'a [Condition],
    type_: &str,
    reasons: &[&str],
    same_generation: bool,
) -> Option<(&'a str, &'a str)> {
    let c = conditions::find(list, type_).filter(|c| c.status == Status::True.as_str())?;
    (same_generation && reasons.contains(&c.reason.as_str()))
        .then_some((c.reason.as_str(), c.message.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_deadline_expires_once_the_timeout_has_fully_elapsed() {
        let d = Deadline::new(ts("2024-01-01T00:00:00Z"), Duration::from_secs(1800));
        assert!(!d.expired(ts("2024-01-01T00:29:59Z")));
        assert!(d.expired(ts("2024-01-01T00:30:00Z")));
        assert_eq!(
            d.remaining(ts("2024-01-01T00:20:00Z")),
            Duration::from_secs(600)
        );
        assert_eq!(d.describe(), "times out at 2024-01-01T00:30:00Z");
    }

    #[test]
    fn a_start_in_the_future_counts_as_no_time_elapsed() {
        let d = Deadline::new(ts("2024-01-01T01:00:00Z"), Duration::from_secs(60));
        assert_eq!(d.elapsed(ts("2024-01-01T00:00:00Z")), Duration::ZERO);
        assert!(!d.expired(ts("2024-01-01T00:00:00Z")));
    }

    fn mk(type_: &str, status: &str, at: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "R".into(),
            message: String::new(),
            last_transition_time: Time(ts(at)),
            observed_generation: None,
        }
    }

    #[test]
    fn a_wait_starts_at_the_latest_marker_transition_or_the_fallback() {
        let markers = [("A", Status::False), ("B", Status::False)];
        let (created, now) = (ts("2024-01-01T00:00:00Z"), ts("2024-01-02T00:00:00Z"));
        assert_eq!(waiting_since(&[], &markers, created, now), created);
        let list = [
            mk("A", "False", "2024-01-01T01:00:00Z"),
            mk("B", "False", "2024-01-01T02:00:00Z"),
        ];
        assert_eq!(
            waiting_since(&list, &markers, created, now),
            ts("2024-01-01T02:00:00Z")
        );
    }

    #[test]
    fn a_wait_starts_now_when_a_marker_shows_the_object_was_not_waiting() {
        let markers = [("A", Status::False), ("B", Status::False)];
        let (created, now) = (ts("2024-01-01T00:00:00Z"), ts("2024-01-02T00:00:00Z"));
        let list = [
            mk("A", "False", "2024-01-01T01:00:00Z"),
            mk("B", "True", "2024-01-01T02:00:00Z"),
        ];
        assert_eq!(waiting_since(&list, &markers, created, now), now);
    }

    #[test]
    fn recheck_is_the_earliest_remaining_wait_but_at_least_a_second() {
        let s = Duration::from_secs;
        assert_eq!(recheck_after([s(600), s(60)]), Some(s(60)));
        assert_eq!(recheck_after([Duration::ZERO]), Some(s(1)));
        assert_eq!(recheck_after([]), None);
    }
}
