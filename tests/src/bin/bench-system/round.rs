//! One round of the benchmark, for one mode and one number of stacks: the system started
//! in a namespace of its own, then the phases one after another, each a function.

use crate::probe::{Delta, Probe, ProcessStats, process_stats, settle};
use crate::stacks::{
    Clusters, change_output, create_stack, create_templates, endpoint_host, resource, stack_name,
};
use crate::{Args, Mode};
use anyhow::{Context, Result};
use capt_controller::render::workspace_name;
use capt_tests::fake_provider::workspace_resource;
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject};
use serde_json::json;
use status_applier::intent::{Intent, Subresource, Target};
use std::time::{Duration, Instant};

/// How long an output change may take to reach the Cluster before it counts as missed.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// The change phase stops after this many misses, or after `CHANGES_BUDGET` (a saturated
/// baseline would take hours); the table says how many changes were made.
const MISSES_BEFORE_GIVING_UP: usize = 10;
const CHANGES_BUDGET: Duration = Duration::from_secs(300);

/// One round's results.
pub(crate) struct Round {
    pub(crate) mode: Mode,
    pub(crate) clusters: usize,
    pub(crate) provisioned: usize,
    pub(crate) provisioned_in: f64,
    pub(crate) provisioning: Delta,
    pub(crate) steady: Delta,
    pub(crate) changes: Delta,
    pub(crate) latencies_ms: Vec<f64>,
    pub(crate) missed: usize,
    pub(crate) burst: Delta,
    pub(crate) socket_burst: Option<Delta>,
    pub(crate) controller: ProcessStats,
    pub(crate) applier: Option<ProcessStats>,
}

pub(crate) async fn run_round(args: &Args, mode: Mode, n: usize) -> Result<Round> {
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
        let ws = workspace_name(round.ns, &format!("{stack}-controlplane"));
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
    let ws = workspace_name(round.ns, &format!("{stack}-controlplane"));
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
