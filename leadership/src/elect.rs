//! Holding the Lease: one task per process that observes the Lease, decides its next step by
//! [`crate::rule::next_step`] and acts (take, renew, release), and tells the process's
//! [`Lead`] whether it may write.
//!
//! A lead that lapses (no renewal seen before the deadline) is not an exit: the process stops
//! writing ([`Lead::may_write`] turns false by itself at the deadline, with no event needed),
//! keeps its caches and watches, and stands as a candidate; when it leads again it goes on.
//! Each write of the Lease carries the `resourceVersion` it was decided on, so of two
//! candidates acting on one version, one fails with a conflict and looks again.

use crate::rule::{Claim, Mine, Step, Timing, next_step};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use tokio::sync::watch;
// Tokio's clock, which a test may pause; the rule takes the standard one it stands for.
use tokio::time::Instant;

/// Which Lease, who this replica is, and how it times its turns.
#[derive(Clone, Debug)]
pub struct Election {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub lease: String,
    /// This replica's identity in the Lease (the pod's name).
    pub identity: String,
    /// The durations.
    pub timing: Timing,
    /// The field manager of the Lease writes.
    pub field_manager: String,
    /// Told of each write of the Lease by its result, for the process to count.
    pub on_write: Option<OnWrite>,
}

/// Told of each write of the Lease by its result: `taken`, `renewed`, `conflict` (another
/// replica wrote it first), `failed` (no answer, or an error) or `released`.
#[derive(Clone)]
pub struct OnWrite(pub Arc<dyn Fn(&'static str) + Send + Sync>);

impl std::fmt::Debug for OnWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnWrite")
    }
}

/// Whether this replica may write.
#[derive(Clone, Debug, PartialEq)]
pub enum Role {
    /// No leader election: always.
    Unconditional,
    /// It holds the Lease and may write until this instant (which may pass with no renewal).
    Leading {
        /// The deadline of its last renewal ([`Timing::deadline`]).
        until: Instant,
    },
    /// It does not lead: it writes nothing and waits for its turn.
    Candidate {
        /// Who holds the Lease, as last seen (this replica's own name after a lapse).
        holder: Option<String>,
    },
}

impl Role {
    fn may_write(&self, now: Instant) -> bool {
        match self {
            Self::Unconditional => true,
            Self::Leading { until } => now < *until,
            Self::Candidate { .. } => false,
        }
    }
}

/// This process's lead, shared by everything that writes (cheap to clone).
#[derive(Clone, Debug)]
pub struct Lead {
    role: watch::Receiver<Role>,
    identity: Option<Arc<str>>,
    elector: Arc<Mutex<Option<Elector>>>,
}

#[derive(Debug)]
struct Elector {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Lead {
    /// A lead without election: every write allowed (a single replica).
    pub fn unconditional() -> Self {
        // A channel whose sender is gone still reads as its last value: all this lead needs.
        let (_, role) = watch::channel(Role::Unconditional);
        Self {
            role,
            identity: None,
            elector: Arc::default(),
        }
    }

    /// This replica's identity in the Lease (none without election).
    pub fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }

    /// Each change of where this replica stands.
    pub fn watch(&self) -> watch::Receiver<Role> {
        self.role.clone()
    }

    /// Whether a write may be sent now.
    pub fn may_write(&self) -> bool {
        self.role.borrow().may_write(Instant::now())
    }

    /// Where this replica stands now.
    pub fn role(&self) -> Role {
        self.role.borrow().clone()
    }

    /// Resolves once this replica may write (at once if it may now); never, if the elector
    /// stopped.
    pub async fn leading(&self) {
        let mut role = self.role.clone();
        loop {
            if role.borrow_and_update().may_write(Instant::now()) {
                return;
            }
            if role.changed().await.is_err() {
                // No elector any more (the process is stopping): no more leading.
                return std::future::pending().await;
            }
        }
    }

    /// Resolves once this replica may no longer write (at once if it may not now); never
    /// for a lead without election, nor once the elector stopped.
    pub async fn lapsed(&self) {
        let mut role = self.role.clone();
        loop {
            if !role.borrow_and_update().may_write(Instant::now()) {
                return;
            }
            if role.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Stops the elector and, when this replica holds the Lease, releases it, so that
    /// another takes over without waiting for it to expire. Writes stop first.
    pub async fn release(&self) {
        let elector = self.elector.lock().expect("lock").take();
        if let Some(elector) = elector {
            elector.stop.send_replace(true);
            let _ = elector.task.await;
        }
    }
}

/// Starts electing: a task that takes the Lease when it may and holds it while it can.
pub fn elect(client: kube::Client, election: Election) -> Lead {
    let (tell, role) = watch::channel(Role::Candidate { holder: None });
    let (stop, stopped) = watch::channel(false);
    let api: Api<Lease> = Api::namespaced(client, &election.namespace);
    tracing::info!(
        identity = election.identity,
        lease = election.lease,
        namespace = election.namespace,
        "Waiting for the leader lease"
    );
    let identity = Some(Arc::from(election.identity.as_str()));
    let tell = Arc::new(tell);
    tokio::spawn(lapse_at_the_deadline(
        tell.clone(),
        election.identity.clone(),
    ));
    let task = tokio::spawn(hold(api, election, tell, stopped));
    Lead {
        role,
        identity,
        elector: Arc::new(Mutex::new(Some(Elector { stop, task }))),
    }
}

/// The Lease as last seen: what it claims, and the version a write must carry.
struct Seen {
    claim: Claim,
    version: Option<String>,
    transitions: i32,
    /// When this version was first seen expired: in an answer that came when its claim had
    /// expired by this replica's clock (`None`: not yet). A view from before an outage does
    /// not count, however old: at the outage's end the other replicas' answers come too.
    expired_since: Option<Instant>,
}

impl Seen {
    /// The Lease as read or written now; `before` is the version seen until now, whose time
    /// of first sight expired carries over when the version is the same.
    fn of(lease: &Lease, before: Option<&Seen>) -> Self {
        let version = lease.metadata.resource_version.clone();
        let claim = Claim::of(lease.spec.as_ref());
        let expired_since = match before {
            Some(b) if b.version == version && b.expired_since.is_some() => b.expired_since,
            _ => claim.expired(SystemTime::now()).then(Instant::now),
        };
        Self {
            expired_since,
            claim,
            version,
            transitions: lease
                .spec
                .as_ref()
                .and_then(|s| s.lease_transitions)
                .unwrap_or(0),
        }
    }
}

/// The elector's loop: observe (read the Lease, unless this replica's own last write says
/// what it is), decide ([`next_step`]), act (write it, or wait).
async fn hold(
    api: Api<Lease>,
    election: Election,
    tell: Arc<watch::Sender<Role>>,
    mut stopped: watch::Receiver<bool>,
) {
    let t = election.timing;
    let me = election.identity.as_str();
    let mut seen: Option<Seen> = None;
    let mut mine = Mine::Fresh;
    let mut read = true;
    loop {
        let stop = stopped.wait_for(|stop| *stop);
        let turn = async {
            if read {
                match tokio::time::timeout(t.duration, api.get_opt(&election.lease)).await {
                    Ok(Ok(lease)) => seen = lease.map(|l| Seen::of(&l, seen.as_ref())),
                    failed => {
                        tracing::warn!(error = %failure(failed), lease = election.lease, "Reading the leader Lease failed; retrying");
                        tokio::time::sleep(t.retry).await;
                        return;
                    }
                }
            }
            note(&tell, seen.as_ref(), me);
            let claim = seen.as_ref().map(|s| &s.claim);
            let expired_since = seen.as_ref().and_then(|s| s.expired_since);
            let (now, at) = (SystemTime::now(), Instant::now().into_std());
            let since = expired_since.map_or(at, Instant::into_std);
            let step = next_step(claim, since, me, mine, &t, now, at);
            match step {
                Step::Wait(wait) => {
                    tokio::time::sleep(wait).await;
                    // A leader knows the Lease from its own last write; a candidate reads it.
                    read = !tell.borrow().may_write(Instant::now());
                }
                Step::Renew | Step::Take => {
                    let sent = Instant::now();
                    let write = write(&api, &election, seen.as_ref(), step);
                    let written = tokio::time::timeout(t.duration, write).await;
                    count(
                        &election,
                        match (&written, step) {
                            (Ok(Ok(_)), Step::Take) => "taken",
                            (Ok(Ok(_)), _) => "renewed",
                            (Ok(Err(kube::Error::Api(e))), _) if e.code == 409 => "conflict",
                            _ => "failed",
                        },
                    );
                    match written {
                        Ok(Ok(lease)) => {
                            seen = Some(Seen::of(&lease, seen.as_ref()));
                            mine = Mine::Renewed(sent.into_std());
                            // A renewal that took until past its own deadline (sent
                            // before an outage, answered after it) does not make a leader.
                            let until = Instant::from_std(t.deadline(sent.into_std()));
                            if until > Instant::now() {
                                let was = tell.send_replace(Role::Leading { until });
                                if !was.may_write(Instant::now()) {
                                    tracing::info!(
                                        identity = me,
                                        lease = election.lease,
                                        "Leading"
                                    );
                                }
                            }
                            read = false;
                        }
                        Ok(Err(kube::Error::Api(e))) if e.code == 409 => read = true,
                        failed => {
                            tracing::warn!(error = %failure(failed), lease = election.lease, "Writing the leader Lease failed; retrying");
                            tokio::time::sleep(t.retry).await;
                            read = true;
                        }
                    }
                }
            }
        };
        tokio::select! {
            biased;
            _ = stop => break,
            () = turn => {}
        }
    }
    // Stopping: no write from here on, then the Lease let go if it is still this replica's.
    let leading = tell.borrow().may_write(Instant::now());
    tell.send_replace(Role::Candidate { holder: None });
    if let (true, Some(seen)) = (leading, &seen) {
        let release = json!({
            "metadata": {"resourceVersion": seen.version},
            "spec": {"holderIdentity": null},
        });
        let released = tokio::time::timeout(
            t.retry,
            api.patch(
                &election.lease,
                &patch_params(&election),
                &Patch::Merge(release),
            ),
        )
        .await;
        count(
            &election,
            if matches!(released, Ok(Ok(_))) {
                "released"
            } else {
                "failed"
            },
        );
        match released {
            Ok(Ok(_)) => tracing::info!(identity = me, "Released the leader Lease"),
            failed => {
                tracing::warn!(error = %failure(failed), "Releasing the leader Lease failed: the next leader waits for it to expire")
            }
        }
    }
}

fn count(election: &Election, result: &'static str) {
    if let Some(OnWrite(tell)) = &election.on_write {
        tell(result);
    }
}

/// Ends a lead at its deadline when no renewal moved it: whatever the elector is waiting for
/// then (a renewal in flight to an API server that does not answer), the process is told
/// and the lapse logged at the deadline itself.
async fn lapse_at_the_deadline(tell: Arc<watch::Sender<Role>>, me: String) {
    let mut roles = tell.subscribe();
    loop {
        let role = roles.borrow_and_update().clone();
        if let Role::Leading { until } = role {
            tokio::select! {
                () = tokio::time::sleep_until(until) => {
                    let lapsed = tell.send_if_modified(|role| match role {
                        Role::Leading { until: u } if *u == until => {
                            *role = Role::Candidate { holder: Some(me.clone()) };
                            true
                        }
                        _ => false,
                    });
                    if lapsed {
                        tracing::warn!(
                            identity = me,
                            "The leader Lease was not renewed before its deadline: writes stop; standing as a candidate"
                        );
                    }
                    continue;
                }
                changed = roles.changed() => if changed.is_err() { return },
            }
        } else if roles.changed().await.is_err() {
            return;
        }
    }
}

/// Tells the process where it stands when another replica holds the Lease.
fn note(tell: &watch::Sender<Role>, seen: Option<&Seen>, me: &str) {
    let holder = seen.and_then(|s| s.claim.holder.clone());
    let role = tell.borrow().clone();
    match role {
        Role::Leading { .. } if holder.as_deref() != Some(me) => {
            tracing::warn!(
                identity = me,
                holder,
                "Another replica holds the leader Lease: writes stop; standing as a candidate"
            );
            tell.send_replace(Role::Candidate { holder });
        }
        Role::Candidate { holder: was } if was != holder => {
            if let Some(leader) = holder.as_deref().filter(|h| *h != me) {
                tracing::info!(identity = me, leader, "Standing by: another replica leads");
            }
            tell.send_replace(Role::Candidate { holder });
        }
        _ => {}
    }
}

/// Takes or renews the Lease, on the version last seen (a conflict when it changed since).
async fn write(
    api: &Api<Lease>,
    election: &Election,
    seen: Option<&Seen>,
    step: Step,
) -> kube::Result<Lease> {
    let now = MicroTime(jiff::Timestamp::now());
    let duration = i32::try_from(election.timing.duration.as_secs()).unwrap_or(i32::MAX);
    let params = patch_params(election);
    let Some(seen) = seen else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(election.lease.clone()),
                namespace: Some(election.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(election.identity.clone()),
                lease_duration_seconds: Some(duration),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        let post = PostParams {
            field_manager: params.field_manager,
            ..PostParams::default()
        };
        return api.create(&post, &lease).await;
    };
    let mut spec = json!({
        "holderIdentity": election.identity,
        "leaseDurationSeconds": duration,
        "renewTime": now,
    });
    if step == Step::Take {
        spec["acquireTime"] = json!(now);
        spec["leaseTransitions"] = json!(seen.transitions + 1);
    }
    let patch = json!({"metadata": {"resourceVersion": seen.version}, "spec": spec});
    api.patch(&election.lease, &params, &Patch::Merge(patch))
        .await
}

/// Every write of the Lease is a merge patch under the election's field manager.
fn patch_params(election: &Election) -> PatchParams {
    PatchParams {
        field_manager: Some(election.field_manager.clone()),
        ..PatchParams::default()
    }
}

/// A failed or timed-out request, in words.
fn failure<T>(result: Result<kube::Result<T>, tokio::time::error::Elapsed>) -> String {
    match result {
        Ok(Ok(_)) => "none".into(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => "no answer in time".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn lead(role: Role) -> (watch::Sender<Role>, Lead) {
        let (tell, role) = watch::channel(role);
        let lead = Lead {
            role,
            identity: Some(Arc::from("pod-a")),
            elector: Arc::default(),
        };
        (tell, lead)
    }

    /// Pod-a's Lease, of version `version`, renewed `ago` before now, for 15 s.
    fn lease_renewed(ago: Duration, version: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("pod-a".into()),
                renew_time: Some(MicroTime(
                    jiff::Timestamp::try_from(SystemTime::now() - ago).expect("a time"),
                )),
                lease_duration_seconds: Some(15),
                ..LeaseSpec::default()
            }),
        }
    }

    /// A lapsed leader lets the others go first for `renew_every` from the first answer that
    /// showed it its Lease expired: not from a view older than an outage, which would let it
    /// take the Lease back at the outage's end, in a race with the standby whose answers come
    /// at the same moment.
    #[tokio::test(start_paused = true)]
    async fn a_lease_counts_as_seen_expired_from_the_first_answer_after_its_expiry() {
        let live = Seen::of(&lease_renewed(Duration::ZERO, "7"), None);
        assert_eq!(live.expired_since, None, "not expired when seen");
        // The API server does not answer for 30 s; then it answers with the same version.
        tokio::time::advance(Duration::from_secs(30)).await;
        let thawed = Seen::of(&lease_renewed(Duration::from_secs(30), "7"), Some(&live));
        assert_eq!(
            thawed.expired_since,
            Some(Instant::now()),
            "from this answer"
        );
        tokio::time::advance(Duration::from_secs(2)).await;
        let later = Seen::of(&lease_renewed(Duration::from_secs(32), "7"), Some(&thawed));
        assert_eq!(later.expired_since, thawed.expired_since, "unchanged since");
        let taken = Seen::of(&lease_renewed(Duration::ZERO, "8"), Some(&later));
        assert_eq!(taken.expired_since, None, "a new version starts again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lead_ends_at_its_deadline_with_no_event_and_resumes_with_a_renewal() {
        let deadline = Instant::now() + Duration::from_secs(5);
        let (tell, lead) = lead(Role::Leading { until: deadline });
        assert!(lead.may_write());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(!lead.may_write(), "no write at the deadline");
        let waiting = tokio::spawn({
            let lead = lead.clone();
            async move { lead.leading().await }
        });
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!waiting.is_finished(), "a lapsed lead waits for a renewal");
        tell.send_replace(Role::Leading {
            until: Instant::now() + Duration::from_secs(12),
        });
        waiting.await.expect("leads again");
        assert!(lead.may_write());
    }

    #[tokio::test(start_paused = true)]
    async fn the_role_turns_candidate_at_the_deadline_unless_a_renewal_moved_it() {
        let start = Instant::now();
        let tell = Arc::new(
            watch::channel(Role::Leading {
                until: start + Duration::from_secs(5),
            })
            .0,
        );
        let mut roles = tell.subscribe();
        tokio::spawn(lapse_at_the_deadline(tell.clone(), "pod-a".into()));
        tokio::time::sleep(Duration::from_secs(4)).await;
        // A renewal: 12 s more from now.
        let renewed = Instant::now() + Duration::from_secs(12);
        tell.send_replace(Role::Leading { until: renewed });
        roles
            .wait_for(|r| matches!(r, Role::Candidate { .. }))
            .await
            .expect("a lapse");
        assert_eq!(
            Instant::now(),
            renewed,
            "at the renewed deadline, not the first"
        );
        assert_eq!(
            *roles.borrow(),
            Role::Candidate {
                holder: Some("pod-a".into())
            }
        );
        assert!(start.elapsed() >= Duration::from_secs(16));
    }

    #[tokio::test(start_paused = true)]
    async fn a_candidate_waits_and_an_unconditional_lead_never_does() {
        let (tell, lead) = lead(Role::Candidate {
            holder: Some("pod-b".into()),
        });
        assert!(!lead.may_write());
        let waiting = tokio::spawn({
            let lead = lead.clone();
            async move { lead.leading().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        // A deadline already passed is no lead either.
        tell.send_replace(Role::Leading {
            until: Instant::now(),
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        let unconditional = Lead::unconditional();
        assert!(unconditional.may_write());
        unconditional.leading().await;
    }

    #[tokio::test]
    async fn a_lapse_is_told_when_the_lead_ends_and_never_without_election() {
        let (tell, lead) = lead(Role::Leading {
            until: Instant::now() + Duration::from_secs(60),
        });
        let lapsed = tokio::spawn({
            let lead = lead.clone();
            async move { lead.lapsed().await }
        });
        tokio::task::yield_now().await;
        assert!(!lapsed.is_finished(), "it still leads");
        tell.send_replace(Role::Candidate {
            holder: Some("pod-a".into()),
        });
        tokio::time::timeout(Duration::from_secs(5), lapsed)
            .await
            .expect("told of the lapse")
            .expect("the task");
        let unconditional = Lead::unconditional();
        let never = tokio::time::timeout(Duration::from_millis(50), unconditional.lapsed());
        assert!(never.await.is_err(), "a lead without election never lapses");
    }
}
