//! Following a Lease one does not write: the status-applier writes only while the Lease its
//! controller holds names its own pod, by [`crate::rule::leadership`].

use crate::rule::{Leadership, leadership};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use std::time::{Instant, SystemTime};

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
