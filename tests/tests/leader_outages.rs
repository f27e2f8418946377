//! Two pods of the Deployment as it ships them (each a status-applier and a controller, the
//! shipped Lease timing: 15 s, renewed every 5 s), beside the real Cluster API core manager,
//! and the API server frozen (`hack/testenv.sh apiserver-freeze`: SIGSTOP, so connections
//! stay open and nothing is answered until it thaws):
//!
//! - for 6 s from one second before the leader's next renewal is due, three times, and for
//!   9 s at a random moment: no process exits or restarts, the Lease names the same leader
//!   with no new transition, no two pods write in the same second (the API server's audit
//!   log, by pod), and after each the leader's work goes on (a new endpoint output reaches
//!   the control plane);
//! - for 30 s: the leader writes nothing once its deadline passed, the other pod takes over
//!   once the Lease has expired, no object is written by both, and the first stays up as the
//!   standby; killed in turn, the new leader hands back to it, which leads with its warm
//!   caches: it lists nothing.
//!
//! Each test freezes the shared API server, so this binary holds them alone and runs them one
//! at a time.

use anyhow::{Context, Result, ensure};
use capt_tests::api_server_fault::ApiServerFault;
use capt_tests::audit_log::{AuditLog, Write};
use capt_tests::fake_provider::FakeProvider;
use capt_tests::pod::{Election, LEASE_NAMESPACE, Pod};
use capt_tests::system::{apply_samples, set_endpoint_output, wait_until};
use capt_tests::{TestNamespace, env, sample_endpoint_host};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::Api;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime};

/// The shipped Lease timing (`--lease-duration-seconds`, `--lease-renew-period-seconds`).
const LEASE: Duration = Duration::from_secs(15);
const RENEW_EVERY: Duration = Duration::from_secs(5);

static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn outages_shorter_than_the_lease_cost_no_exit_no_restart_and_no_change_of_leader()
-> Result<()> {
    let _alone = ALONE.lock().await;
    let mut pair = Pair::start("outages-short").await?;
    let before = pair.lease().await?;
    let audit = AuditLog::from_now()?;
    for (round, host) in ["one.example.com", "two.example.com", "three.example.com"]
        .into_iter()
        .enumerate()
    {
        // The endpoint moves just before the freeze: the leader's writes are in flight.
        let renewed = pair.renewed().await?;
        let due = renewed + RENEW_EVERY;
        sleep_until(due - Duration::from_secs(1)).await;
        set_endpoint_output(env(), &pair.ns.name, &format!("https://{host}"))?;
        println!("round {round}: frozen 6 s from 1 s before the renewal due at {due:?}");
        freeze_for(Duration::from_secs(6)).await?;
        pair.after_the_outage(host).await?;
    }
    let offset = random_below(RENEW_EVERY);
    let renewed = pair.renewed().await?;
    println!(
        "frozen 9 s from {:.3} s after a renewal",
        offset.as_secs_f64()
    );
    sleep_until(renewed + offset).await;
    set_endpoint_output(env(), &pair.ns.name, "https://four.example.com")?;
    freeze_for(Duration::from_secs(9)).await?;
    pair.after_the_outage("four.example.com").await?;

    let after = pair.lease().await?;
    ensure!(
        after.holder_identity == before.holder_identity
            && after.lease_transitions == before.lease_transitions,
        "the leader changed: {before:?} then {after:?}\n{}",
        pair.logs()
    );
    let writes = audit.writes_in(&pair.ns.name)?;
    let both = seconds_written_by_both(&writes);
    let by_standby: Vec<&Write> = writes
        .iter()
        .filter(|w| w.pod.as_deref() == Some("pod-b"))
        .collect();
    println!(
        "writes by the pods: {}; by the standby: {}; seconds with writes of both: {}",
        writes.iter().filter(|w| w.pod.is_some()).count(),
        by_standby.len(),
        both.len()
    );
    ensure!(both.is_empty(), "two pods wrote in one second: {both:#?}");
    ensure!(by_standby.is_empty(), "the standby wrote: {by_standby:#?}");
    pair.none_restarted()
}

#[tokio::test]
async fn a_30_second_outage_hands_over_to_the_standby_and_the_old_leader_stays_warm() -> Result<()>
{
    let _alone = ALONE.lock().await;
    let mut pair = Pair::start("outage-long").await?;
    let renewed = pair.renewed().await?;
    sleep_until(renewed + random_below(RENEW_EVERY)).await;
    let frozen = AuditLog::from_now()?;
    let last_renewal = pair.renewed().await?;
    freeze_for(Duration::from_secs(30)).await?;
    // At once after the thaw: a change for the leader to write.
    set_endpoint_output(env(), &pair.ns.name, "https://moved.example.com")?;
    wait(&pair, "pod-b to lead", || async {
        Ok(pair.lease().await?.holder_identity.as_deref() == Some("pod-b"))
    })
    .await?;
    wait(&pair, "the endpoint moved by the new leader", || async {
        pair.control_plane_shows("moved.example.com")
    })
    .await?;
    wait(&pair, "pod-a's controller to stand by", || async {
        Ok(pair.pods[0]
            .controller_log_text()
            .contains("Standing by: another replica leads"))
    })
    .await?;
    let deadline = last_renewal + LEASE - LEASE / 5;
    let writes = frozen.writes_in(&pair.ns.name)?;
    let by = |pod: &str| -> BTreeSet<String> {
        (writes.iter())
            .filter(|w| w.pod.as_deref() == Some(pod))
            .map(|w| w.object.clone())
            .collect()
    };
    let (old, new) = (by("pod-a"), by("pod-b"));
    println!(
        "deadline of pod-a {deadline:?}; objects written since the freeze by pod-a: {}, by \
         pod-b: {}",
        old.len(),
        new.len()
    );
    // The system was at rest when it froze: pod-a had nothing in flight, so any write of its
    // since is one sent after its deadline (the freeze lasted past it).
    ensure!(
        old.is_empty(),
        "pod-a wrote after its deadline: {old:#?}\n{}",
        pair.logs()
    );
    ensure!(!new.is_empty(), "pod-b wrote the move");
    pair.none_restarted()?;

    // pod-a, warm, takes over when pod-b goes, with no list of anything.
    let handed_back = AuditLog::from_now()?;
    pair.pods[1].kill_controller();
    pair.pods[1].applier.kill();
    set_endpoint_output(env(), &pair.ns.name, "https://back.example.com")?;
    wait(&pair, "pod-a to lead again", || async {
        Ok(pair.lease().await?.holder_identity.as_deref() == Some("pod-a"))
    })
    .await?;
    wait(&pair, "the endpoint moved by pod-a", || async {
        pair.control_plane_shows("back.example.com")
    })
    .await?;
    let lists: Vec<Write> = handed_back
        .requests_in(&pair.ns.name, |verb| verb == "list")?
        .into_iter()
        .filter(|w| w.pod.as_deref() == Some("pod-a") && w.manager.contains("capt-controller"))
        .collect();
    println!(
        "lists by pod-a's controller once it led again: {}",
        lists.len()
    );
    ensure!(lists.is_empty(), "pod-a listed again: {lists:#?}");
    ensure!(
        pair.pods[0].controller_running()? && pair.pods[0].controller_starts() == 1,
        "pod-a's controller is the one that started first"
    );
    Ok(())
}

/// Two pods for one namespace and the fake provider, the samples provisioned, pod-a leading.
struct Pair {
    ns: TestNamespace,
    election: Election,
    pods: Vec<Pod>,
    _provider: FakeProvider,
}

impl Pair {
    async fn start(prefix: &str) -> Result<Self> {
        let client = env().client().await?;
        let ns = TestNamespace::create(&client, prefix).await?;
        let election = Election {
            lease: format!("capt-{}", ns.name),
            duration_seconds: None,
        };
        let provider = FakeProvider::for_namespace(&ns.name, 50, "info", &env().kubeconfig).await?;
        let pod_a = Pod::start("pod-a", &ns.name, &election).await?;
        let mut pair = Self {
            ns,
            election,
            pods: vec![pod_a],
            _provider: provider,
        };
        wait(&pair, "pod-a to lead", || async {
            Ok(pair.lease().await?.holder_identity.as_deref() == Some("pod-a"))
        })
        .await?;
        let pod_b = Pod::start("pod-b", &pair.ns.name, &pair.election).await?;
        pair.pods.push(pod_b);
        apply_samples(env(), &pair.ns.name, false)?;
        wait(
            &pair,
            "the Cluster Provisioned and its endpoint",
            || async {
                let cluster = pair.get("cluster")?;
                let host = sample_endpoint_host(&pair.ns.name, "demo");
                Ok(cluster["status"]["phase"] == "Provisioned"
                    && pair.control_plane_shows(&host)?)
            },
        )
        .await?;
        Ok(pair)
    }

    async fn lease(&self) -> Result<LeaseSpec> {
        let leases: Api<Lease> = Api::namespaced(env().client().await?, LEASE_NAMESPACE);
        (leases.get(&self.election.lease).await?.spec).context("the Lease has a spec")
    }

    /// The leader's last renewal, as the Lease has it.
    async fn renewed(&self) -> Result<SystemTime> {
        let renewed = self.lease().await?.renew_time.context("renewed")?;
        Ok(renewed.0.into())
    }

    fn get(&self, kind: &str) -> Result<Value> {
        let out = env().kubectl_ok(
            &["get", kind, "demo", "-n", &self.ns.name, "-o", "json"],
            None,
        )?;
        Ok(serde_json::from_str(&out)?)
    }

    fn control_plane_shows(&self, host: &str) -> Result<bool> {
        let cp = self.get("captcontrolplane")?;
        Ok(cp["spec"]["controlPlaneEndpoint"]["host"] == host
            && cp["status"]["endpoint"] == format!("{host}:443"))
    }

    /// After an outage: the Lease renewed since, and the move made before it landed.
    async fn after_the_outage(&self, host: &str) -> Result<()> {
        let thawed = SystemTime::now();
        wait(self, "a renewal after the outage", || async {
            Ok(self.renewed().await? > thawed)
        })
        .await?;
        wait(self, &format!("the endpoint {host}"), || async {
            self.control_plane_shows(host)
        })
        .await
    }

    /// Every process of both pods is the one that started first.
    fn none_restarted(&mut self) -> Result<()> {
        for pod in &mut self.pods {
            ensure!(
                pod.controller_running()? && pod.controller_starts() == 1,
                "{}'s controller exited or was restarted:\n{}",
                pod.name,
                pod.controller_log_text()
            );
            ensure!(pod.applier.running()?, "{}'s applier exited", pod.name);
        }
        Ok(())
    }

    fn logs(&self) -> String {
        let mut text = String::new();
        for pod in &self.pods {
            text += &format!(
                "--- {} controller log:\n{}\n",
                pod.name,
                pod.controller_log_text()
            );
        }
        text
    }
}

async fn wait<F, Fut>(pair: &Pair, what: &str, check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    match wait_until(what, Duration::from_secs(90), check).await {
        Ok(()) => Ok(()),
        Err(e) => anyhow::bail!("{e}\n{}", pair.logs()),
    }
}

/// The seconds (of the API server's clock) in which more than one pod wrote.
fn seconds_written_by_both(writes: &[Write]) -> Vec<String> {
    let mut pods_by_second: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for w in writes {
        if let (Some(pod), Some(second)) = (w.pod.as_deref(), w.received.get(..19)) {
            pods_by_second.entry(second).or_default().insert(pod);
        }
    }
    (pods_by_second.into_iter())
        .filter(|(_, pods)| pods.len() > 1)
        .map(|(second, pods)| format!("{second}: {pods:?}"))
        .collect()
}

/// A random duration below `limit` (printed by the caller: a failing moment can be told).
fn random_below(limit: Duration) -> Duration {
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let millis = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX).max(1);
    Duration::from_millis(random % millis)
}

async fn sleep_until(when: SystemTime) {
    if let Ok(wait) = when.duration_since(SystemTime::now()) {
        tokio::time::sleep(wait).await;
    }
}

/// The API server frozen for `outage` (the outage itself, so slept, not awaited), then
/// thawed.
async fn freeze_for(outage: Duration) -> Result<()> {
    let frozen = ApiServerFault::freeze()?;
    tokio::time::sleep(outage).await;
    frozen.end()
}
