//! Whether this applier may write: it follows its replica's leader-election Lease.
//!
//! A Deployment of several replicas runs one applier per pod, and every applier applies under
//! the same field-manager names. Only the pod whose controller leads may write: an applier
//! that kept writing the documents its controller sent before another pod took the Lease would
//! see every write of the new leader as drift and restore its own values, and the two would
//! flip the object forever. So an applier given a Lease (`--leader-election-lease`) writes only
//! while that Lease names its own pod, and only until the Lease would expire:
//!
//! - **leading** ([`Leadership::Until`]): the Lease names this pod; applies are sent until its
//!   renew time plus its duration, less a margin for clock skew ([`expiry_margin`]). Another
//!   candidate may take the Lease only once it has expired by its own clock, so a leader that
//!   stops at its margin never writes beside the next one (the fence). A Lease not renewed in
//!   time (the controller died, the API server is unreachable) stops the writes by itself,
//!   with no event needed: intents are still taken and wait for a renewal;
//! - **standing by** ([`Leadership::Follower`]): another pod holds an unexpired Lease. The
//!   applier writes nothing, refuses intents (its controller must not be running), and keeps
//!   no document a controller sent: each follows the live object, as one rebuilt from
//!   `managedFields` does, so taking over later needs no restart and reverts nothing;
//! - a Lease held by nobody, or expired in another's name, is neither: intents are taken and
//!   held until the Lease names this pod (its controller is about to take it).
//!
//! An apply in flight when the margin passes was planned on a view whose `resourceVersion` it
//! carries as a precondition: if the next leader wrote meanwhile, the API server refuses it.

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use std::time::{Duration, Instant, SystemTime};

/// Whether the engine may write, as the machine uses it.
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
    /// Whether an apply may be sent at `now`.
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
/// Kubernetes' own leader election. The leader renews at two thirds of the duration, so the
/// renewal is seen well before the margin.
pub fn expiry_margin(lease_duration: Duration) -> Duration {
    lease_duration / 5
}

/// What a Lease means for the replica `identity` at wall-clock time `now`, as the machine's
/// [`Leadership`] at the monotonic `at` (the same moment).
pub fn leadership(
    spec: Option<&LeaseSpec>,
    identity: &str,
    now: SystemTime,
    at: Instant,
) -> Leadership {
    let holder = spec.and_then(|s| s.holder_identity.as_deref());
    let expiry = spec.and_then(|s| {
        let renewed: SystemTime = s.renew_time.as_ref()?.0.into();
        let duration = Duration::from_secs(u64::try_from(s.lease_duration_seconds?).ok()?);
        Some((renewed + duration, duration))
    });
    let remaining = |deadline: SystemTime| deadline.duration_since(now).unwrap_or_default();
    match (holder, expiry) {
        (Some(h), Some((expires, duration))) if h == identity => {
            Leadership::Until(at + remaining(expires).saturating_sub(expiry_margin(duration)))
        }
        (Some(h), Some((expires, _))) if h != identity && expires > now => Leadership::Follower {
            leader: h.to_owned(),
        },
        // Ours without a renew time, nobody's, or another's that expired: hold the writes.
        _ => Leadership::Until(at),
    }
}

/// Where the Lease to follow is, and who this replica is.
#[derive(Clone, Debug)]
pub struct LeaseToFollow {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity, as its controller writes it into the Lease (the pod's name).
    pub identity: String,
}

/// Watches the Lease and calls `tell` with what each version of it means for this replica,
/// until the process ends. Watch errors are logged and retried by the watcher: meanwhile the
/// last answer stands, and a leader's expires by itself.
pub async fn follow(client: kube::Client, lease: LeaseToFollow, tell: impl Fn(Leadership)) {
    let api: Api<Lease> = Api::namespaced(client, &lease.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", lease.name));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    let mut last: Option<Leadership> = None;
    while let Some(event) = events.next().await {
        let spec = match event {
            Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => l.spec,
            Ok(watcher::Event::Delete(_)) => None,
            Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
            Err(error) => {
                tracing::warn!(%error, lease = lease.name, "Watching the leader Lease failed; retrying");
                continue;
            }
        };
        let now = leadership(
            spec.as_ref(),
            &lease.identity,
            SystemTime::now(),
            Instant::now(),
        );
        log_change(last.as_ref(), &now, &lease);
        last = Some(now.clone());
        tell(now);
    }
}

fn log_change(before: Option<&Leadership>, now: &Leadership, lease: &LeaseToFollow) {
    let leading = |l: Option<&Leadership>| matches!(l, Some(Leadership::Until(_)));
    match now {
        Leadership::Follower { leader } if before != Some(now) => {
            tracing::info!(
                lease = lease.name,
                leader,
                "Standing by: another replica leads"
            )
        }
        Leadership::Until(_) if !leading(before) => {
            tracing::info!(
                lease = lease.name,
                identity = lease.identity,
                "Following the Lease as a candidate or leader"
            )
        }
        _ => {}
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
}
