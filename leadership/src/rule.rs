//! The rule, as pure functions of what a replica has seen of the Lease and its clocks: who may
//! write, until when, and what a candidate does next. No client and no task: the elector
//! ([`crate::elect`]) and the follower ([`crate::follow`]) carry these decisions out.
//!
//! - **The fence.** A leader writes only until the renew time of its last renewal plus the
//!   Lease's duration, less a margin for clock skew ([`expiry_margin`]); another replica takes
//!   the Lease only once it has expired by its own clock. So a leader that stops at its margin
//!   never writes beside the next one.
//! - **Renewing early.** The leader renews every `renew_every` (5 s of a 15 s Lease) from its
//!   last renewal, not once near the end: an API server that does not answer for up to
//!   duration − margin − renew_every (7 s) costs no write, and one that does not answer for up
//!   to the duration (15 s) costs no change of leader, whenever the outage starts.
//! - **A lapse is not a loss.** A leader whose deadline passed without a renewal stops writing
//!   and stands as a candidate. While the Lease still names it and has not expired, nobody
//!   else may take it, so it renews as soon as the API server answers and leads on. Once it
//!   has expired, the others go first: the lapsed leader takes it only `renew_every` after
//!   an answer first showed it the expired Lease, unchanged since, so that another replica
//!   that sees it too takes over (its own view of the API server may be the healthier one).
//!   What it saw before an outage does not count: when the API server answers again, it
//!   answers the others as well, and they go first.

use k8s_openapi::api::coordination::v1::LeaseSpec;
use std::time::{Duration, Instant, SystemTime};

/// Whether a replica may write, as the status-applier's engine uses it.
#[derive(Clone, Debug, PartialEq)]
pub enum Leadership {
    /// No leader election: always (a single replica, the tests, the debugging command line).
    Unconditional,
    /// This replica leads: it may write before this instant (which may have passed: the Lease
    /// was not renewed in time, or nobody holds it yet).
    Until(Instant),
    /// Another replica leads: write nothing, hold no document of intents, refuse intents.
    Follower {
        /// Who holds the Lease.
        leader: String,
    },
}

impl Leadership {
    /// Whether a write may be sent at `now`.
    pub fn may_write(&self, now: Instant) -> bool {
        match self {
            Self::Unconditional => true,
            Self::Until(until) => now < *until,
            Self::Follower { .. } => false,
        }
    }
}

/// How long before its Lease expires a leader stops writing: a fifth of the lease duration
/// (3 s of the default 15 s), which must exceed the clock skew between the nodes, as for
/// Kubernetes' own leader election.
pub fn expiry_margin(lease_duration: Duration) -> Duration {
    lease_duration / 5
}

/// What a Lease says: who holds it, when it was last renewed (by the holder's clock) and for
/// how long.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// The holder; `None` when nobody holds it (released, or never taken).
    pub holder: Option<String>,
    /// The last renewal.
    pub renewed: Option<SystemTime>,
    /// How long a renewal lasts.
    pub duration: Option<Duration>,
}

impl Claim {
    /// The claim a Lease's spec makes.
    pub fn of(spec: Option<&LeaseSpec>) -> Self {
        Self {
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty()),
            renewed: spec.and_then(|s| Some(s.renew_time.as_ref()?.0.into())),
            duration: spec.and_then(|s| {
                Some(Duration::from_secs(
                    u64::try_from(s.lease_duration_seconds?).ok()?,
                ))
            }),
        }
    }

    /// When it expires, by the renewal's clock.
    fn expires(&self) -> Option<SystemTime> {
        Some(self.renewed? + self.duration?)
    }

    /// Whether it has expired at `now` (a claim without a renewal or a duration has).
    pub fn expired(&self, now: SystemTime) -> bool {
        self.expires().is_none_or(|e| e <= now)
    }
}

/// What a Lease means for the replica `identity` at wall-clock time `now`, as the machine's
/// [`Leadership`] at the monotonic `at` (the same moment).
pub fn leadership(
    spec: Option<&LeaseSpec>,
    identity: &str,
    now: SystemTime,
    at: Instant,
) -> Leadership {
    let claim = Claim::of(spec);
    let remaining = |deadline: SystemTime| deadline.duration_since(now).unwrap_or_default();
    match (&claim.holder, claim.expires(), claim.duration) {
        (Some(h), Some(expires), Some(duration)) if h == identity => {
            Leadership::Until(at + remaining(expires).saturating_sub(expiry_margin(duration)))
        }
        (Some(h), Some(expires), _) if h != identity && expires > now => Leadership::Follower {
            leader: h.to_owned(),
        },
        // Ours without a renew time, nobody's, or another's that expired: hold the writes.
        _ => Leadership::Until(at),
    }
}

/// How a candidate times its turns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a claim lasts without renewal (written into the Lease).
    pub duration: Duration,
    /// How often the leader renews, counted from its last renewal.
    pub renew_every: Duration,
    /// How often a candidate looks at the Lease again, and a leader whose renewal failed
    /// tries again.
    pub retry: Duration,
}

impl Timing {
    /// The shipped defaults: a Lease of 15 s (as client-go's), renewed every 5 s (client-go:
    /// every 2 s), looked at and retried every 2 s.
    pub const DEFAULT: Self = Self {
        duration: Duration::from_secs(15),
        renew_every: Duration::from_secs(5),
        retry: Duration::from_secs(2),
    };

    /// Checks that a leader renews in time: at least twice before it would stop writing.
    pub fn check(&self) -> Result<(), String> {
        let writes_for = self.duration.saturating_sub(expiry_margin(self.duration));
        if self.renew_every.is_zero() || self.retry.is_zero() {
            return Err("the renew and retry periods must be longer than 0 s".into());
        }
        if self.renew_every * 2 > writes_for {
            return Err(format!(
                "a renewal every {} s leaves no second chance before the leader stops writing, \
                 {} s after a renewal (the lease duration {} s less a fifth): renew at most \
                 every {} s, or lengthen the lease",
                self.renew_every.as_secs_f64(),
                writes_for.as_secs_f64(),
                self.duration.as_secs_f64(),
                (writes_for / 2).as_secs_f64()
            ));
        }
        Ok(())
    }

    /// Until when a leader whose renewal was sent at `sent` may write.
    pub fn deadline(&self, sent: Instant) -> Instant {
        sent + self.duration - expiry_margin(self.duration)
    }
}

/// Where this replica stands, by its own writes of the Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mine {
    /// It has not written the Lease yet (it just started).
    Fresh,
    /// Its last write of the Lease (a take or a renewal) was sent at this instant and
    /// succeeded.
    Renewed(Instant),
}

/// What a candidate, or the leader, does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Renew the Lease it holds.
    Renew,
    /// Take the Lease: nobody holds it, or its claim expired (or it does not exist: create it).
    Take,
    /// Look again after this long (a leader: renew then; a candidate: read the Lease again).
    Wait(Duration),
}

/// The next step of the replica `me`, which sees the Lease as `claim` (`None`: there is no
/// Lease), first seen expired and unchanged since at `seen_expired` (an answer's time; `at`
/// when no answer showed it expired yet), at wall-clock time `now` and monotonic `at`.
pub fn next_step(
    claim: Option<&Claim>,
    seen_expired: Instant,
    me: &str,
    mine: Mine,
    timing: &Timing,
    now: SystemTime,
    at: Instant,
) -> Step {
    let Some(claim) = claim else {
        return Step::Take;
    };
    let until = |when: SystemTime| when.duration_since(now).unwrap_or_default();
    match claim.holder.as_deref() {
        None => Step::Take,
        Some(holder) if holder == me => match mine {
            // Leading: renew on time.
            Mine::Renewed(sent) if at < timing.deadline(sent) => {
                match (sent + timing.renew_every).checked_duration_since(at) {
                    Some(wait) if !wait.is_zero() => Step::Wait(wait),
                    _ => Step::Renew,
                }
            }
            // Started again under the same name (a container restart): the Lease is still
            // this replica's, and the process that wrote it is gone.
            Mine::Fresh => Step::Renew,
            // Lapsed: while the claim is unexpired nobody else may take it; once it has
            // expired, the others go first.
            Mine::Renewed(_) if !claim.expired(now) => Step::Renew,
            Mine::Renewed(_) => {
                match (seen_expired + timing.renew_every).checked_duration_since(at) {
                    Some(wait) if !wait.is_zero() => Step::Wait(wait.min(timing.retry)),
                    _ => Step::Take,
                }
            }
        },
        Some(_) if claim.expired(now) => Step::Take,
        Some(_) => Step::Wait(
            claim
                .expires()
                .map_or(timing.retry, until)
                .min(timing.retry),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(
        holder: Option<&str>,
        renewed_ago: Duration,
        seconds: i32,
        now: SystemTime,
    ) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            renew_time: Some(MicroTime(
                jiff::Timestamp::try_from(now - renewed_ago).expect("a time"),
            )),
            lease_duration_seconds: Some(seconds),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_lease_of_ours_allows_writes_until_its_expiry_less_the_margin() {
        let (now, at) = (SystemTime::now(), Instant::now());
        let spec = lease(Some("pod-a"), Duration::from_secs(5), 15, now);
        let Leadership::Until(until) = leadership(Some(&spec), "pod-a", now, at) else {
            panic!("leading")
        };
        // 15 s from a renewal 5 s ago, less a margin of 3 s: 7 s from now.
        assert_eq!(until - at, Duration::from_secs(7));
        assert!(Leadership::Until(until).may_write(at + Duration::from_millis(6_999)));
        assert!(!Leadership::Until(until).may_write(at + Duration::from_secs(7)));
    }

    #[test]
    fn a_lease_of_ours_not_renewed_in_time_allows_no_write() {
        let (now, at) = (SystemTime::now(), Instant::now());
        let spec = lease(Some("pod-a"), Duration::from_secs(13), 15, now);
        assert!(!leadership(Some(&spec), "pod-a", now, at).may_write(at));
    }

    #[test]
    fn another_holder_of_an_unexpired_lease_makes_a_follower() {
        let (now, at) = (SystemTime::now(), Instant::now());
        let spec = lease(Some("pod-b"), Duration::from_secs(1), 15, now);
        assert_eq!(
            leadership(Some(&spec), "pod-a", now, at),
            Leadership::Follower {
                leader: "pod-b".into()
            }
        );
    }

    #[test]
    fn an_expired_lease_of_another_or_of_nobody_holds_writes_but_is_not_a_follower() {
        let (now, at) = (SystemTime::now(), Instant::now());
        let expired = lease(Some("pod-b"), Duration::from_secs(16), 15, now);
        assert_eq!(
            leadership(Some(&expired), "pod-a", now, at),
            Leadership::Until(at)
        );
        let released = LeaseSpec::default();
        assert_eq!(
            leadership(Some(&released), "pod-a", now, at),
            Leadership::Until(at)
        );
        assert_eq!(leadership(None, "pod-a", now, at), Leadership::Until(at));
        assert!(!Leadership::Until(at).may_write(at));
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// One row: a claim (holder, renewed how long ago), this replica's own last write (how
    /// long ago), and the step expected of `pod-a` with the default timing; the claim was
    /// seen first when it was written.
    fn step(holder: Option<&str>, renewed_ago: Option<u64>, mine_ago: Option<u64>) -> Step {
        step_seen(holder, renewed_ago, mine_ago, renewed_ago.unwrap_or(0))
    }

    /// [`step`] of a claim seen first `seen_ago` seconds ago.
    fn step_seen(
        holder: Option<&str>,
        renewed_ago: Option<u64>,
        mine_ago: Option<u64>,
        seen_ago: u64,
    ) -> Step {
        let (now, at) = (SystemTime::now(), Instant::now() + S(3600));
        let claim = renewed_ago.map(|ago| Claim {
            holder: holder.map(str::to_owned),
            renewed: Some(now - S(ago)),
            duration: Some(S(15)),
        });
        let mine = mine_ago.map_or(Mine::Fresh, |ago| Mine::Renewed(at - S(ago)));
        let since = at - S(seen_ago);
        next_step(
            claim.as_ref(),
            since,
            "pod-a",
            mine,
            &Timing::DEFAULT,
            now,
            at,
        )
    }

    #[test]
    fn the_steps_of_a_candidate_and_a_leader() {
        let rows = [
            // No Lease: create it.
            ("no Lease", step(None, None, None), Step::Take),
            // Released: take it.
            ("released", step(None, Some(1), None), Step::Take),
            // Another's, renewed 1 s ago: look again in 2 s (its expiry is 14 s away).
            (
                "another's",
                step(Some("pod-b"), Some(1), None),
                Step::Wait(S(2)),
            ),
            // Another's, 14 s ago: look again at its expiry, 1 s away.
            (
                "another's, expiring",
                step(Some("pod-b"), Some(14), None),
                Step::Wait(S(1)),
            ),
            (
                "another's, expired",
                step(Some("pod-b"), Some(15), None),
                Step::Take,
            ),
            // Ours, renewed 1 s ago: renew 4 s later (every 5 s).
            (
                "leading",
                step(Some("pod-a"), Some(1), Some(1)),
                Step::Wait(S(4)),
            ),
            (
                "leading, due",
                step(Some("pod-a"), Some(5), Some(5)),
                Step::Renew,
            ),
            // Renewals failed for 8 s: keep trying (the caller waits `retry` between tries).
            (
                "leading, late",
                step(Some("pod-a"), Some(8), Some(8)),
                Step::Renew,
            ),
            // Past the deadline (12 s) but unexpired: nobody else may take it; renew.
            (
                "lapsed, unexpired",
                step(Some("pod-a"), Some(13), Some(13)),
                Step::Renew,
            ),
            // Expired, and seen so for 1 s: the others first, until it is seen so for 5 s.
            (
                "lapsed, expired",
                step_seen(Some("pod-a"), Some(16), Some(16), 1),
                Step::Wait(S(2)),
            ),
            (
                "lapsed, expired, seen 4 s",
                step_seen(Some("pod-a"), Some(19), Some(19), 4),
                Step::Wait(S(1)),
            ),
            (
                "lapsed, nobody took it",
                step_seen(Some("pod-a"), Some(20), Some(20), 5),
                Step::Take,
            ),
            // Its own renewal sent before an outage lands after the Lease expired (as the API
            // server thaws): seen just now, so the others still go first.
            (
                "lapsed, late renewal landed",
                step_seen(Some("pod-a"), Some(35), Some(35), 0),
                Step::Wait(S(2)),
            ),
            // A restarted container finds the Lease in its name: take it back at once.
            (
                "fresh, named",
                step(Some("pod-a"), Some(3), None),
                Step::Renew,
            ),
            // Taken by another while this one lapsed: a candidate like any other.
            (
                "lapsed, taken",
                step(Some("pod-b"), Some(1), Some(20)),
                Step::Wait(S(2)),
            ),
        ];
        for (row, got, expected) in rows {
            assert_eq!(got, expected, "{row}");
        }
    }

    #[test]
    fn a_leader_renews_at_least_twice_before_it_would_stop_writing() {
        assert_eq!(Timing::DEFAULT.check(), Ok(()));
        let too_rare = Timing {
            renew_every: S(7),
            ..Timing::DEFAULT
        };
        let message = too_rare.check().unwrap_err();
        assert!(message.contains("renew at most every 6 s"), "{message}");
        // The tests' short Leases: 4 s renewed every 1 s.
        let short = Timing {
            duration: S(4),
            renew_every: S(1),
            retry: S(1),
        };
        assert_eq!(short.check(), Ok(()));
    }

    #[test]
    fn the_shipped_timing_rides_out_outages_shorter_than_its_slack() {
        let t = Timing::DEFAULT;
        let sent = Instant::now();
        // The worst moment: an outage that starts just before a renewal is due.
        let writes_through = t.deadline(sent) - (sent + t.renew_every);
        assert_eq!(writes_through, S(7), "writes go on through 7 s of silence");
        assert_eq!(
            t.duration - t.renew_every,
            S(10),
            "no other leader within 10 s"
        );
    }
}
