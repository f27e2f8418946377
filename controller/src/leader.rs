//! Leader election on a coordination Lease: only the holder reconciles and writes, and only
//! until its Lease would expire.
//!
//! kube-lease-manager takes the Lease and renews it, but reports only changes of holder: a
//! renewal that fails (the API server unreachable or slow) leaves it reporting "leading"
//! while the Lease runs out and another replica may take it. So the Lease is also followed
//! by the rule the status-applier follows (`status_applier::leadership`, the same code): this
//! replica writes only until the Lease's renew time plus its duration, less a margin for clock
//! skew. Another replica takes the Lease only once it has expired by its own clock, so a
//! leader that stops at the margin never writes beside the next one. Stopping means leaving:
//! the caller exits, and the kubelet starts the container again as a candidate.

use kube::Client;
use status_applier::leadership::{Leadership, LeaseToFollow, expiry_margin};
use std::fmt;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Which Lease, who this replica is, and how long a claim lasts.
#[derive(Clone, Debug)]
pub struct Election {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub lease: String,
    /// This replica's identity in the Lease (the pod's name).
    pub identity: String,
    /// How long a claim lasts without renewal.
    pub duration: Duration,
    /// How long before expiry the leader renews.
    pub grace: Duration,
}

impl Election {
    /// How long before expiry the leader renews, in the whole seconds kube-lease-manager
    /// takes: at least a second more than the margin at which it stops writing, so that a
    /// renewal has that second to be seen before the deadline; less than the duration.
    pub fn renew_before_expiry(&self) -> u64 {
        let duration = self.duration.as_secs().max(2);
        let margin = expiry_margin(self.duration).as_secs_f64().ceil() as u64;
        self.grace.as_secs().max(margin + 1).min(duration - 1)
    }
}

/// Why this replica no longer leads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lost {
    /// The Lease was not renewed in time: its deadline (renew time plus duration, less the
    /// margin) passed.
    NotRenewed,
    /// Another replica holds the Lease.
    Taken {
        /// Who.
        leader: String,
    },
    /// The lease manager reported the loss, or stopped.
    Released,
}

impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotRenewed => f.write_str("the leader Lease was not renewed before its deadline"),
            Self::Taken { leader } => write!(f, "{leader} holds the leader Lease"),
            Self::Released => f.write_str("the lease manager reported the leader Lease lost"),
        }
    }
}

/// This replica's lead: [`Lead::lost`] tells when it ends.
pub struct Lead {
    leading: watch::Receiver<bool>,
    followed: watch::Receiver<Option<Leadership>>,
    _follower: tokio::task::JoinHandle<()>,
}

/// Waits until this replica holds the Lease and the Lease shows it (a deadline ahead).
pub async fn lead(client: &Client, election: &Election) -> anyhow::Result<Lead> {
    let (tell, followed) = watch::channel(None);
    let follower = tokio::spawn(status_applier::leadership::follow(
        client.clone(),
        LeaseToFollow {
            namespace: election.namespace.clone(),
            name: election.lease.clone(),
            identity: election.identity.clone(),
        },
        move |leadership| {
            tell.send_replace(Some(leadership));
        },
    ));
    // A Lease that cannot be used (RBAC, say) is reported and retried, not a crash loop.
    let manager = loop {
        let built = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &election.lease)
            .with_namespace(&election.namespace)
            .with_identity(&election.identity)
            .with_duration(election.duration.as_secs().max(2))
            .with_grace(election.renew_before_expiry())
            .with_field_manager("capt-controller-leader")
            .build()
            .await;
        match built {
            Ok(manager) => break manager,
            Err(error) => {
                tracing::error!(
                    ?error,
                    lease = election.lease,
                    namespace = election.namespace,
                    "Cannot use the leader Lease; retrying in 10 s"
                );
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        }
    };
    let (mut leading, _task) = manager.watch().await;
    tracing::info!(
        identity = election.identity,
        lease = election.lease,
        namespace = election.namespace,
        "Waiting for the leader lease"
    );
    let mut followed = followed;
    loop {
        leading
            .wait_for(|leader| *leader)
            .await
            .map_err(|_| anyhow::anyhow!("leader election stopped"))?;
        // The lease manager reports the Lease taken once its write succeeded; the Lease
        // followed shows it a moment later, with the renew time the deadline counts from.
        let shown = followed.wait_for(
            |l| matches!(l, Some(Leadership::Until(until)) if *until > std::time::Instant::now()),
        );
        tokio::select! {
            shown = shown => {
                shown.map_err(|_| anyhow::anyhow!("following the leader Lease stopped"))?;
                break;
            }
            lost = leading.wait_for(|leader| !*leader) => {
                lost.map_err(|_| anyhow::anyhow!("leader election stopped"))?;
            }
        }
    }
    tracing::info!(identity = election.identity, "Leading");
    Ok(Lead {
        leading,
        followed,
        _follower: follower,
    })
}

impl Lead {
    /// Resolves when this replica must stop writing: the Lease's deadline passed with no
    /// renewal seen, another replica holds it, or the lease manager lost it.
    pub async fn lost(mut self) -> Lost {
        loop {
            let deadline = match deadline(self.followed.borrow_and_update().as_ref()) {
                Ok(deadline) => deadline,
                Err(lost) => return lost,
            };
            if deadline <= Instant::now() {
                return Lost::NotRenewed;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                changed = self.followed.changed() => {
                    if changed.is_err() {
                        return Lost::Released;
                    }
                }
                _ = self.leading.wait_for(|leader| !*leader) => return Lost::Released,
            }
        }
    }
}

/// Until when this replica may write, by what the followed Lease last said.
fn deadline(followed: Option<&Leadership>) -> Result<Instant, Lost> {
    match followed {
        Some(Leadership::Until(until)) => Ok(Instant::from_std(*until)),
        Some(Leadership::Follower { leader }) => Err(Lost::Taken {
            leader: leader.clone(),
        }),
        // Leading was seen before, so the Lease was shown once: neither is possible.
        Some(Leadership::Unconditional) | None => Err(Lost::NotRenewed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn election(duration: u64, grace: u64) -> Election {
        Election {
            namespace: "ns".into(),
            lease: "l".into(),
            identity: "pod-a".into(),
            duration: Duration::from_secs(duration),
            grace: Duration::from_secs(grace),
        }
    }

    #[test]
    fn the_leader_renews_a_second_before_it_would_stop_writing_at_the_latest() {
        // 15 s: stops 3 s before expiry; renews 5 s before, as asked.
        assert_eq!(election(15, 5).renew_before_expiry(), 5);
        // Asked to renew 1 s before expiry, past the margin of 3 s: 4 s before.
        assert_eq!(election(15, 1).renew_before_expiry(), 4);
        // 3 s: stops 0.6 s before expiry; renews 2 s before (never at expiry or earlier
        // than the claim itself).
        assert_eq!(election(3, 1).renew_before_expiry(), 2);
        assert_eq!(election(2, 1).renew_before_expiry(), 1);
    }

    #[test]
    fn the_deadline_is_the_one_the_followed_lease_gives() {
        let at = std::time::Instant::now() + Duration::from_secs(7);
        assert_eq!(
            deadline(Some(&Leadership::Until(at))),
            Ok(Instant::from_std(at))
        );
        let taken = Leadership::Follower {
            leader: "pod-b".into(),
        };
        assert_eq!(
            deadline(Some(&taken)),
            Err(Lost::Taken {
                leader: "pod-b".into()
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lead_ends_when_its_deadline_passes_unless_a_renewal_moves_it() {
        let (_leading_tx, leading) = watch::channel(true);
        let soon = (Instant::now() + Duration::from_secs(5)).into_std();
        let (tell, followed) = watch::channel(Some(Leadership::Until(soon)));
        let lead = Lead {
            leading,
            followed,
            _follower: tokio::spawn(async {}),
        };
        let started = Instant::now();
        let lost = tokio::spawn(lead.lost());
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(!lost.is_finished(), "before the deadline");
        // A renewal seen: 5 s more from now.
        tell.send_replace(Some(Leadership::Until(
            (Instant::now() + Duration::from_secs(5)).into_std(),
        )));
        assert_eq!(lost.await.unwrap(), Lost::NotRenewed);
        assert_eq!(started.elapsed(), Duration::from_secs(9));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lead_ends_at_once_when_another_replica_holds_the_lease() {
        let (_leading_tx, leading) = watch::channel(true);
        let later = (Instant::now() + Duration::from_secs(60)).into_std();
        let (tell, followed) = watch::channel(Some(Leadership::Until(later)));
        let lead = Lead {
            leading,
            followed,
            _follower: tokio::spawn(async {}),
        };
        let lost = tokio::spawn(lead.lost());
        tokio::task::yield_now().await;
        tell.send_replace(Some(Leadership::Follower {
            leader: "pod-b".into(),
        }));
        assert_eq!(
            lost.await.unwrap(),
            Lost::Taken {
                leader: "pod-b".into()
            }
        );
    }
}
