//! Whole-system benchmark: N CAPT stacks (Cluster + CAPTCluster + CAPTControlPlane) against
//! the real API server, the system running as deployed (status-applier + capt-controller, two
//! processes), beside the naive baseline (`capt-controller --baseline-full-update`: a full
//! update on every reconcile, woken by every change, as upstream CAPT did). Prints tables.
//!
//! API writes are counted by the API server itself: from the audit log `hack/testenv.sh`
//! keeps (every create/update/patch/delete, by field manager). Each round, per mode and N:
//! 1. provisioning: N stacks created at once; the fake provider plays Terraform;
//! 2. steady state: writes and reconciles over `--steady-seconds` once provisioned;
//! 3. changes: the provider is stopped and the benchmark plays it: one Workspace output
//!    (`cluster_endpoint`) change at a time, on `--changes` stacks; the time until the
//!    Cluster's `spec.controlPlaneEndpoint` follows, and the writes per change per manager;
//! 4. burst: `--burst` output changes of one Workspace back to back, and (sidecar only)
//!    `--burst` intents for one object sent straight to the applier's socket;
//! 5. peak RSS and CPU seconds of each process.
//!
//! `hack/bench.sh` builds in release mode, starts a fresh environment and runs it.

use anyhow::{Context, Result, bail};
use capt_tests::applier::metric_value;
use capt_tests::fake_provider::{self, workspace_resource};
use capt_tests::system::System;
use capt_tests::{TestNamespace, env, repo_root};
use clap::{Parser, ValueEnum};
use futures::{StreamExt, TryStreamExt};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use status_applier::intent::{Intent, Subresource, Target};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Read, Seek};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Runs the whole-system benchmark and prints its tables.
#[derive(Parser)]
#[command(about)]
struct Args {
    /// Numbers of CAPT stacks, one round each (per mode).
    #[arg(long, value_delimiter = ',', default_values_t = [100, 1000])]
    clusters: Vec<usize>,
    /// The modes to compare.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Mode::Sidecar, Mode::Baseline])]
    modes: Vec<Mode>,
    /// Length of the steady-state observation.
    #[arg(long, default_value_t = 60)]
    steady_seconds: u64,
    /// Output changes, one at a time, for the latency and writes-per-change measures.
    #[arg(long, default_value_t = 100)]
    changes: usize,
    /// Size of the bursts.
    #[arg(long, default_value_t = 100)]
    burst: usize,
    /// More flags for `status-applier serve` (e.g. `--applier-args=--coalesce-window-ms=0`).
    #[arg(long, value_delimiter = ' ', allow_hyphen_values = true)]
    applier_args: Vec<String>,
    /// The fake provider's apply time while provisioning.
    #[arg(long, default_value_t = 100)]
    provider_delay_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// status-applier + capt-controller, as deployed.
    Sidecar,
    /// capt-controller --baseline-full-update, alone.
    Baseline,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Sidecar => "sidecar (as deployed)",
            Mode::Baseline => "naive baseline",
        }
    }
}

/// The field managers that write status and endpoints: the rows of the per-change table.
const STATUS_MANAGERS: [&str; 4] = [
    "capt-captcluster",
    "capt-captcontrolplane",
    "capt-cluster",
    "capt-workspacetemplateapply",
];

/// How long an output change may take to reach the Cluster before it counts as missed.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// The change phase stops after this many misses, or after `CHANGES_BUDGET` (a saturated
/// baseline would take hours); the table says how many changes were made.
const MISSES_BEFORE_GIVING_UP: usize = 10;
const CHANGES_BUDGET: Duration = Duration::from_secs(300);

/// Counters at one moment.
#[derive(Clone)]
struct Snapshot {
    at: Instant,
    audit_offset: u64,
    reconciles: f64,
    intents: f64,
    applies: f64,
}

/// What happened between two snapshots.
#[derive(Default)]
struct Delta {
    seconds: f64,
    /// API writes by field manager (from the audit log), of this round's objects only.
    writes: BTreeMap<String, u64>,
    reconciles: f64,
    intents: f64,
    applies: f64,
}

impl Delta {
    fn status_writes(&self) -> u64 {
        STATUS_MANAGERS
            .iter()
            .map(|m| self.writes.get(*m).copied().unwrap_or(0))
            .sum()
    }

    fn controller_writes(&self) -> u64 {
        self.writes
            .iter()
            .filter(|(m, _)| m.starts_with("capt-"))
            .map(|(_, n)| n)
            .sum()
    }
}

/// Peak RSS and CPU time of a process.
struct ProcessStats {
    peak_rss_mib: f64,
    cpu_seconds: f64,
}

/// One round's results.
struct Round {
    mode: Mode,
    clusters: usize,
    provisioned: usize,
    provisioned_in: f64,
    provisioning: Delta,
    steady: Delta,
    changes: Delta,
    latencies_ms: Vec<f64>,
    missed: usize,
    burst: Delta,
    socket_burst: Option<Delta>,
    controller: ProcessStats,
    applier: Option<ProcessStats>,
}

/// What measures a round: its namespace (and the Workspaces named after it), its processes
/// and the audit log.
struct Probe<'a> {
    mode: Mode,
    ns: &'a str,
    audit: &'a std::path::Path,
}

impl Probe<'_> {
    async fn snapshot(&self, system: &System) -> Result<Snapshot> {
        let controller = system
            .controller_metric("capt_reconciles_total", &[])
            .await?;
        let (intents, applies) = match self.mode {
            Mode::Sidecar => {
                let text = system.applier.client.get("/metrics").await?.body;
                (
                    metric_value(&text, "status_applier_intents_total", &[]),
                    metric_value(&text, "status_applier_api_writes_total", &[]),
                )
            }
            Mode::Baseline => (0.0, 0.0),
        };
        Ok(Snapshot {
            at: Instant::now(),
            audit_offset: std::fs::metadata(self.audit)?.len(),
            reconciles: controller,
            intents,
            applies,
        })
    }

    /// The writes to this round's objects between two snapshots, by field manager.
    fn delta(&self, from: &Snapshot, to: &Snapshot) -> Result<Delta> {
        if to.audit_offset < from.audit_offset {
            bail!(
                "the audit log {} was rotated during a phase",
                self.audit.display()
            );
        }
        let mut file = std::fs::File::open(self.audit)?;
        file.seek(std::io::SeekFrom::Start(from.audit_offset))?;
        let reader = std::io::BufReader::new(file.take(to.audit_offset - from.audit_offset));
        let mut writes = BTreeMap::new();
        for line in reader.lines() {
            let event: Value = serde_json::from_str(&line?)?;
            if let Some(manager) = self.write_of_round(&event) {
                *writes.entry(manager).or_default() += 1;
            }
        }
        Ok(Delta {
            seconds: (to.at - from.at).as_secs_f64(),
            writes,
            reconciles: to.reconciles - from.reconciles,
            intents: to.intents - from.intents,
            applies: to.applies - from.applies,
        })
    }

    /// The field manager of an audited write to one of this round's objects.
    fn write_of_round(&self, event: &Value) -> Option<String> {
        let object = &event["objectRef"];
        let ours = object["namespace"] == self.ns
            || (object["resource"] == "workspaces"
                && object["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(&format!("{}-", self.ns))));
        if !ours || event["stage"] != "ResponseComplete" {
            return None;
        }
        let uri = event["requestURI"].as_str().unwrap_or("");
        let manager = uri
            .split_once('?')
            .and_then(|(_, query)| {
                query
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("fieldManager="))
            })
            .map(str::to_owned)
            .unwrap_or_else(|| {
                let agent = event["userAgent"].as_str().unwrap_or("unknown");
                format!("(no manager: {})", agent.split('/').next().unwrap_or(agent))
            });
        Some(manager)
    }
}

/// The benchmark's own creates, named in the audit log.
fn bench_creates() -> PostParams {
    PostParams {
        field_manager: Some("capt-bench".into()),
        ..Default::default()
    }
}

fn resource(group: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, "v1beta1", kind))
}

fn stack_name(i: usize) -> String {
    format!("c{i:04}")
}

/// The Cluster endpoint each output change should produce.
fn endpoint_host(stack: &str, change: usize) -> String {
    format!("{stack}-r{change}.bench.example.com")
}

/// The sample stack (`manifests/samples/cluster.yaml`) renamed to `name`.
fn stack_docs(name: &str) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(repo_root().join("manifests/samples/cluster.yaml"))?;
    let text = text.replace("demo", name);
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Ok(serde::Deserialize::deserialize(doc)?))
        .collect()
}

async fn create_templates(client: &kube::Client, ns: &str) -> Result<()> {
    let text = std::fs::read_to_string(repo_root().join("manifests/samples/templates.yaml"))?;
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &resource("infrastructure.cluster.x-k8s.io", "WorkspaceTemplate"),
    );
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let mut v: Value = serde::Deserialize::deserialize(doc)?;
        v["metadata"]["namespace"] = json!(ns);
        api.create(&bench_creates(), &serde_json::from_value(v)?)
            .await?;
    }
    Ok(())
}

/// Creates one stack; Cluster API core adopts its CAPT objects (their cluster-name label
/// names the Cluster where core does not run).
async fn create_stack(client: kube::Client, ns: String, name: String) -> Result<()> {
    for mut doc in stack_docs(&name)? {
        let kind = doc["kind"].as_str().context("kind")?.to_owned();
        let group = doc["apiVersion"]
            .as_str()
            .and_then(|a| a.split_once('/'))
            .context("apiVersion")?
            .0
            .to_owned();
        doc["metadata"]["namespace"] = json!(ns);
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &ns, &resource(&group, &kind));
        api.create(&bench_creates(), &serde_json::from_value(doc)?)
            .await
            .with_context(|| format!("creating {kind} {ns}/{name}"))?;
    }
    Ok(())
}

/// What the benchmark sees of each Cluster: phase and endpoint host, and when it saw them.
#[derive(Default)]
struct Clusters {
    seen: Mutex<HashMap<String, (String, String, Instant)>>,
    changed: tokio::sync::Notify,
}

impl Clusters {
    fn watch(client: kube::Client, ns: &str) -> Arc<Self> {
        let me = Arc::new(Self::default());
        let api: Api<DynamicObject> =
            Api::namespaced_with(client, ns, &resource("cluster.x-k8s.io", "Cluster"));
        let watching = me.clone();
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(Ok(c)) = events.next().await {
                let phase = c.data["status"]["phase"].as_str().unwrap_or("").to_owned();
                let host = c.data["spec"]["controlPlaneEndpoint"]["host"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned();
                let name = c.metadata.name.clone().unwrap_or_default();
                watching
                    .seen
                    .lock()
                    .expect("lock")
                    .insert(name, (phase, host, Instant::now()));
                watching.changed.notify_waiters();
            }
        });
        me
    }

    fn provisioned(&self) -> usize {
        self.seen
            .lock()
            .expect("lock")
            .values()
            .filter(|(phase, host, _)| phase == "Provisioned" && !host.is_empty())
            .count()
    }

    /// When the Cluster `name` was first seen with endpoint `host`, waiting up to `timeout`.
    async fn endpoint_seen(&self, name: &str, host: &str, timeout: Duration) -> Option<Instant> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.changed.notified();
            if let Some((_, h, at)) = self.seen.lock().expect("lock").get(name)
                && h == host
            {
                return Some(*at);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return None;
            }
        }
    }
}

/// Plays provider-terraform for one Workspace: its outputs now say `host`.
async fn change_output(workspaces: &Api<DynamicObject>, name: &str, host: &str) -> Result<()> {
    let ws = workspaces.get_status(name).await?;
    let mut status = ws.data["status"].clone();
    if !status["atProvider"].is_object() {
        bail!("Workspace {name} has no atProvider yet");
    }
    status["atProvider"]["outputs"]["cluster_endpoint"] = json!(format!("https://{host}"));
    status["atProvider"]["checksum"] = json!(format!("bench-{host}"));
    let body = json!({"apiVersion": fake_provider::API_VERSION, "kind": fake_provider::KIND,
        "metadata": {"name": name}, "status": status});
    workspaces
        .patch_status(
            name,
            &PatchParams::apply(fake_provider::FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
    Ok(())
}

fn process_stats(pid: u32) -> Result<ProcessStats> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let hwm_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .context("VmHWM")?
        .parse()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let after = stat.rsplit_once(')').context("stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    let hz: f64 = String::from_utf8(
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()?
            .stdout,
    )?
    .trim()
    .parse()?;
    Ok(ProcessStats {
        peak_rss_mib: hwm_kib / 1024.0,
        cpu_seconds: ticks / hz,
    })
}

/// Waits until the round's objects see no write for `quiet`, for at most `limit`.
async fn settle(
    round: &Probe<'_>,
    system: &System,
    quiet: Duration,
    limit: Duration,
) -> Result<bool> {
    let started = Instant::now();
    let mut last = round.snapshot(system).await?;
    loop {
        tokio::time::sleep(quiet).await;
        let now = round.snapshot(system).await?;
        if round.delta(&last, &now)?.controller_writes() == 0 {
            return Ok(true);
        }
        if started.elapsed() > limit {
            return Ok(false);
        }
        last = now;
    }
}

async fn run_round(args: &Args, mode: Mode, n: usize) -> Result<Round> {
    let client = env().client().await?;
    let audit = audit_log()?;
    let ns = TestNamespace::create(&client, &format!("bench-{n}")).await?;
    let mut system = start_system(args, mode, &ns.name).await?;
    let round = Probe {
        mode,
        ns: &ns.name,
        audit: &audit,
    };
    let clusters = Clusters::watch(client.clone(), &ns.name);
    eprintln!("[{} N={n}] namespace {}", mode.name(), ns.name);

    let (provisioned, provisioned_in, provisioning) =
        provision(&round, &system, &client, &clusters, n).await?;
    let steady = steady_state(&round, &system, args.steady_seconds).await?;
    // The benchmark plays the provider from here on.
    system.provider.kill();
    let workspaces: Api<DynamicObject> = Api::all_with(client.clone(), &workspace_resource());
    let (changes, latencies_ms, missed) =
        output_changes(&round, &system, &workspaces, &clusters, n, args.changes).await?;
    let stack = stack_name(0);
    let burst = output_burst(&round, &system, &workspaces, &clusters, &stack, args.burst).await?;
    let socket_burst = match mode {
        Mode::Sidecar => Some(socket_burst(&round, &system, &client, &stack, args.burst).await?),
        Mode::Baseline => None,
    };
    let (controller, applier) = measure_processes(&system, mode)?;
    Ok(Round {
        mode,
        clusters: n,
        provisioned,
        provisioned_in,
        provisioning,
        steady,
        changes,
        latencies_ms,
        missed,
        burst,
        socket_burst,
        controller,
        applier,
    })
}

/// The API server's audit log: `hack/testenv.sh` keeps it in its state directory, beside
/// the kubeconfig.
fn audit_log() -> Result<std::path::PathBuf> {
    Ok(env()
        .kubeconfig
        .parent()
        .context("state dir")?
        .join("audit.log"))
}

/// Starts the fake provider, the controller and the status-applier in namespace `ns`; in
/// the baseline mode the controller does full updates.
async fn start_system(args: &Args, mode: Mode, ns: &str) -> Result<System> {
    let controller_args: &[&str] = match mode {
        Mode::Sidecar => &["--no-leader-election"],
        Mode::Baseline => &["--no-leader-election", "--baseline-full-update"],
    };
    let applier_args: Vec<&str> = args.applier_args.iter().map(String::as_str).collect();
    System::start_tuned(
        ns,
        args.provider_delay_ms,
        controller_args,
        &applier_args,
        &env().kubeconfig,
    )
    .await
}

/// Phase 1, provisioning: the templates and `n` stacks created at once while the fake
/// provider plays Terraform, until they are provisioned (or a deadline passes) and the
/// writes settle. Returns how many were provisioned, in how many seconds, and what happened
/// meanwhile.
async fn provision(
    round: &Probe<'_>,
    system: &System,
    client: &kube::Client,
    clusters: &Clusters,
    n: usize,
) -> Result<(usize, f64, Delta)> {
    let start = round.snapshot(system).await?;
    create_templates(client, round.ns).await?;
    create_stacks(client, round.ns, n).await?;
    wait_provisioned(clusters, n).await;
    let provisioned = clusters.provisioned();
    let provisioned_at = round.snapshot(system).await?;
    let provisioned_in = (provisioned_at.at - start.at).as_secs_f64();
    eprintln!("  {provisioned}/{n} provisioned in {provisioned_in:.1} s");
    let settled = settle(
        round,
        system,
        Duration::from_secs(3),
        Duration::from_secs(60),
    )
    .await?;
    let provisioning = round.delta(&start, &round.snapshot(system).await?)?;
    if !settled {
        eprintln!("  writes had not stopped 60 s after provisioning");
    }
    Ok((provisioned, provisioned_in, provisioning))
}

/// Creates stacks `0..n`, 16 at a time.
async fn create_stacks(client: &kube::Client, ns: &str, n: usize) -> Result<()> {
    futures::stream::iter(
        (0..n).map(|i| create_stack(client.clone(), ns.to_owned(), stack_name(i))),
    )
    .buffer_unordered(16)
    .try_collect::<Vec<()>>()
    .await?;
    Ok(())
}

/// Waits until `n` Clusters are provisioned, for at most 120 s plus 0.5 s per stack,
/// reporting progress every 10 s.
async fn wait_provisioned(clusters: &Clusters, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(120 + n as u64 / 2);
    let mut reported = Instant::now();
    while clusters.provisioned() < n && Instant::now() < deadline {
        if reported.elapsed() > Duration::from_secs(10) {
            eprintln!("  provisioned {}/{n}", clusters.provisioned());
            reported = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Phase 2, steady state: what happens over `seconds` once provisioned.
async fn steady_state(round: &Probe<'_>, system: &System, seconds: u64) -> Result<Delta> {
    let before = round.snapshot(system).await?;
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let steady = round.delta(&before, &round.snapshot(system).await?)?;
    eprintln!(
        "  steady state: {} writes, {} reconciles in {:.0} s",
        steady.controller_writes(),
        steady.reconciles,
        steady.seconds
    );
    Ok(steady)
}

/// Phase 3, output changes one at a time on `changes` of the `n` stacks (at most one each),
/// the benchmark playing the provider. Returns what happened until the writes settled, the
/// latency of each change until the Cluster's endpoint followed, and how many were missed.
async fn output_changes(
    round: &Probe<'_>,
    system: &System,
    workspaces: &Api<DynamicObject>,
    clusters: &Clusters,
    n: usize,
    changes: usize,
) -> Result<(Delta, Vec<f64>, usize)> {
    let changes = changes.min(n);
    let mut latencies_ms = Vec::with_capacity(changes);
    let mut missed = 0;
    let before = round.snapshot(system).await?;
    for c in 0..changes {
        if missed >= MISSES_BEFORE_GIVING_UP || before.at.elapsed() > CHANGES_BUDGET {
            eprintln!("  {c} output changes made, {missed} missed: the phase stops here");
            break;
        }
        let stack = stack_name(c * n / changes);
        let host = endpoint_host(&stack, c);
        let sent = Instant::now();
        let ws = format!("{}-{stack}-controlplane", round.ns);
        if let Err(e) = change_output(workspaces, &ws, &host).await {
            eprintln!("  cannot change {ws}: {e:#}");
            missed += 1;
            continue;
        }
        match clusters.endpoint_seen(&stack, &host, CHANGE_TIMEOUT).await {
            Some(at) => latencies_ms.push((at - sent).as_secs_f64() * 1000.0),
            None => missed += 1,
        }
    }
    settle(
        round,
        system,
        Duration::from_secs(2),
        Duration::from_secs(30),
    )
    .await?;
    let changes_delta = round.delta(&before, &round.snapshot(system).await?)?;
    eprintln!("  {changes} output changes done ({missed} missed)");
    Ok((changes_delta, latencies_ms, missed))
}

/// Phase 4, a burst of `burst` output changes, back to back, on the control plane's
/// Workspace of `stack`: what happened until its last endpoint reached the Cluster and the
/// writes settled.
async fn output_burst(
    round: &Probe<'_>,
    system: &System,
    workspaces: &Api<DynamicObject>,
    clusters: &Clusters,
    stack: &str,
    burst: usize,
) -> Result<Delta> {
    let ws = format!("{}-{stack}-controlplane", round.ns);
    let before = round.snapshot(system).await?;
    for b in 0..burst {
        if let Err(e) = change_output(workspaces, &ws, &endpoint_host(stack, 100_000 + b)).await {
            eprintln!("  the burst cannot change {ws}: {e:#}");
            break;
        }
    }
    let last = endpoint_host(stack, 100_000 + burst - 1);
    if clusters
        .endpoint_seen(stack, &last, Duration::from_secs(60))
        .await
        .is_none()
    {
        eprintln!("  the burst's last endpoint never reached the Cluster");
    }
    settle(
        round,
        system,
        Duration::from_secs(2),
        Duration::from_secs(30),
    )
    .await?;
    round.delta(&before, &round.snapshot(system).await?)
}

/// Phase 5, the processes: peak RSS and CPU time of the controller and (sidecar only) of
/// the status-applier.
fn measure_processes(system: &System, mode: Mode) -> Result<(ProcessStats, Option<ProcessStats>)> {
    let controller = process_stats(system.controller_pid())?;
    let applier = match mode {
        Mode::Sidecar => Some(process_stats(system.applier.pid())?),
        Mode::Baseline => None,
    };
    Ok((controller, applier))
}

/// `burst` intents for one object under one manager, sent without waiting, then one that
/// waits: how many applies they became.
async fn socket_burst(
    round: &Probe<'_>,
    system: &System,
    client: &kube::Client,
    stack: &str,
    burst: usize,
) -> Result<Delta> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        round.ns,
        &resource("controlplane.cluster.x-k8s.io", "CAPTControlPlane"),
    );
    let uid = api.get(stack).await?.metadata.uid;
    let intent = |i: usize| Intent {
        target: Target {
            api_version: "controlplane.cluster.x-k8s.io/v1beta1".into(),
            kind: "CAPTControlPlane".into(),
            namespace: Some(round.ns.to_owned()),
            name: stack.to_owned(),
            uid: uid.clone(),
        },
        subresource: Some(Subresource::Status),
        field_manager: "bench-burst".into(),
        fragment: json!({"status": {"conditions": [{"type": "BenchBurst", "status": "True",
            "reason": "Burst", "message": format!("intent {i}"),
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
        release: vec![],
    };
    let applier = &system.applier.client;
    let before = round.snapshot(system).await?;
    for i in 0..burst - 1 {
        applier.submit(&intent(i), false).await?;
    }
    applier.submit(&intent(burst - 1), true).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    round.delta(&before, &round.snapshot(system).await?)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn tables(rounds: &[Round], args: &Args) -> String {
    use std::fmt::Write;
    let out = std::cell::RefCell::new(String::new());
    let mut sizes: Vec<usize> = rounds.iter().map(|r| r.clusters).collect();
    sizes.dedup();
    for n in sizes {
        let rs: Vec<&Round> = rounds.iter().filter(|r| r.clusters == n).collect();
        let _ = writeln!(out.borrow_mut(), "\n### {n} clusters\n");
        out.borrow_mut().push_str("| measure |");
        for r in &rs {
            let _ = write!(out.borrow_mut(), " {} |", r.mode.name());
        }
        out.borrow_mut().push('\n');
        out.borrow_mut().push_str("| --- |");
        for _ in &rs {
            out.borrow_mut().push_str(" ---: |");
        }
        out.borrow_mut().push('\n');
        let row = |label: &str, cell: &dyn Fn(&Round) -> String| {
            let _ = write!(out.borrow_mut(), "| {label} |");
            for r in &rs {
                let _ = write!(out.borrow_mut(), " {} |", cell(r));
            }
            out.borrow_mut().push('\n');
        };
        let per = |n: u64, d: usize| format!("{:.2}", n as f64 / d.max(1) as f64);
        row("provisioned in (s)", &|r| {
            if r.provisioned == r.clusters {
                format!("{:.1}", r.provisioned_in)
            } else {
                format!("only {} after {:.0}", r.provisioned, r.provisioned_in)
            }
        });
        row("provisioning: status writes (all managers)", &|r| {
            r.provisioning.status_writes().to_string()
        });
        row("provisioning: reconciles", &|r| {
            format!("{:.0}", r.provisioning.reconciles)
        });
        row("provisioning: intents/s (sent to the applier)", &|r| {
            rate(r, r.provisioning.intents)
        });
        row(
            "provisioning: applies/s (the applier's PATCH requests)",
            &|r| rate(r, r.provisioning.applies),
        );
        row("provisioning: status writes/s", &|r| {
            format!(
                "{:.1}",
                r.provisioning.status_writes() as f64 / r.provisioning.seconds
            )
        });
        row(
            &format!("steady state {} s: controller writes", args.steady_seconds),
            &|r| r.steady.controller_writes().to_string(),
        );
        row(
            &format!("steady state {} s: reconciles", args.steady_seconds),
            &|r| format!("{:.0}", r.steady.reconciles),
        );
        for m in STATUS_MANAGERS {
            row(&format!("writes per output change: `{m}`"), &|r| {
                per(
                    r.changes.writes.get(m).copied().unwrap_or(0),
                    r.latencies_ms.len() + r.missed,
                )
            });
        }
        row("writes per output change: reconciles", &|r| {
            format!(
                "{:.2}",
                r.changes.reconciles / (r.latencies_ms.len() + r.missed).max(1) as f64
            )
        });
        row("output → Cluster endpoint p50 (ms)", &|r| latency(r, 0.5));
        row("output → Cluster endpoint p99 (ms)", &|r| {
            latency(r, 0.99)
        });
        row("output changes made / missed (10 s)", &|r| {
            format!("{} / {}", r.latencies_ms.len() + r.missed, r.missed)
        });
        row(
            &format!("burst of {} output changes: status writes", args.burst),
            &|r| r.burst.status_writes().to_string(),
        );
        row(
            &format!("burst of {} output changes: coalescing ratio", args.burst),
            &|r| {
                format!(
                    "{:.1}",
                    args.burst as f64 / r.burst.status_writes().max(1) as f64
                )
            },
        );
        row(
            &format!("burst of {} intents on one object: applies", args.burst),
            &|r| match &r.socket_burst {
                Some(d) => d
                    .writes
                    .get("bench-burst")
                    .copied()
                    .unwrap_or(0)
                    .to_string(),
                None => "n/a".into(),
            },
        );
        row("controller peak RSS (MiB)", &|r| {
            format!("{:.1}", r.controller.peak_rss_mib)
        });
        row("controller CPU (s)", &|r| {
            format!("{:.1}", r.controller.cpu_seconds)
        });
        row("status-applier peak RSS (MiB)", &|r| match &r.applier {
            Some(a) => format!("{:.1}", a.peak_rss_mib),
            None => "n/a".into(),
        });
        row("status-applier CPU (s)", &|r| match &r.applier {
            Some(a) => format!("{:.1}", a.cpu_seconds),
            None => "n/a".into(),
        });
        out.borrow_mut()
            .push_str("\nWrites by field manager in each phase (API server audit log):\n\n");
        for r in &rs {
            for (phase, d) in [
                ("provisioning", &r.provisioning),
                ("steady", &r.steady),
                ("changes", &r.changes),
                ("burst", &r.burst),
            ] {
                let list: Vec<String> = d.writes.iter().map(|(m, n)| format!("{m} {n}")).collect();
                let _ = writeln!(
                    out.borrow_mut(),
                    "- {} / {phase}: {}",
                    r.mode.name(),
                    list.join(", ")
                );
            }
        }
    }
    out.into_inner()
}

fn rate(r: &Round, count: f64) -> String {
    match r.mode {
        Mode::Sidecar => format!("{:.1}", count / r.provisioning.seconds),
        Mode::Baseline => "n/a".into(),
    }
}

fn latency(r: &Round, p: f64) -> String {
    let mut sorted = r.latencies_ms.clone();
    sorted.sort_by(f64::total_cmp);
    format!("{:.1}", percentile(&sorted, p))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let mut rounds = Vec::new();
    for &n in &args.clusters {
        for &mode in &args.modes {
            let round = run_round(&args, mode, n).await?;
            rounds.push(round);
            // Each round's numbers as soon as it ends (on stderr): a later round that fails
            // does not take them along.
            eprintln!("{}", tables(&rounds[rounds.len() - 1..], &args));
        }
    }
    print!("{}", tables(&rounds, &args));
    Ok(())
}
