//! One round of the benchmark, for one mode and one number of stacks: the system started
//! cluster-wide, its stacks in a namespace of their own, then the phases one after another,
//! each a function.

use crate::census::{self, StatusCensus};
use crate::deployed::{Launch, Pod};
use crate::floor::{self, Padding, create_floor_stack, floor_name, floor_workspace};
use crate::probe::{Delta, Probe, ProcessStats, process_stats};
use crate::stacks::{
    Watches, change_output, create_stack, create_templates, endpoint_host, own_template,
    probe_name, resource, stack_name,
};
use crate::system::{BenchSystem, process_name};
use crate::{Args, FloorObject, Mode};
use anyhow::{Context, Result};
use capt_controller::render::workspace_name;
use capt_tests::applier::metric_value;
use capt_tests::env;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::json;
use status_applier::intent::{Intent, Subresource, Target};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A phase of one-at-a-time steps stops after this many misses, or after `PHASE_BUDGET` (a
/// saturated baseline would take hours); the table says how many steps were made.
const MISSES_BEFORE_GIVING_UP: usize = 3;
const PHASE_BUDGET: Duration = Duration::from_secs(600);
/// Stacks created at once (each stack is three creates, one after the other).
pub(crate) const CREATE_CONCURRENCY: usize = 16;
/// The restart is over when the controller's reconcile counter has not moved for this long.
pub(crate) const RESTART_QUIET: Duration = Duration::from_secs(3);
const RESTART_LIMIT: Duration = Duration::from_secs(300);
/// Progress lines at least this often.
const PROGRESS: Duration = Duration::from_secs(30);

/// One round's results.
pub(crate) struct Round {
    pub(crate) mode: Mode,
    pub(crate) clusters: usize,
    /// How long each probe stack and each output change was given before it counted as
    /// missed.
    pub(crate) step_timeout: Duration,
    pub(crate) provisioned: usize,
    pub(crate) provisioned_in: f64,
    pub(crate) provisioning: Delta,
    pub(crate) steady: Delta,
    pub(crate) probes: Probes,
    pub(crate) changes: Changes,
    pub(crate) socket_burst: Option<Burst>,
    /// CAPTCluster status changes by what changed, in provisioning and in the probe stacks.
    pub(crate) captcluster_changes: Vec<(&'static str, census::Changes)>,
    pub(crate) controller: ProcessStats,
    pub(crate) applier: Option<ProcessStats>,
    pub(crate) restart: Restart,
    /// The leading pod killed for good, a standby pod taking over (sidecar mode with two or
    /// more replicas, as the Deployment ships).
    pub(crate) fail_over: Option<Restart>,
    /// The standby pods' processes before the restart, by process name.
    pub(crate) standby: Vec<(String, ProcessStats)>,
    /// Each pod's controller's writes of the leader Lease per minute, at rest.
    pub(crate) lease_writes_per_minute: Vec<(String, f64)>,
    /// How each process was started.
    pub(crate) launches: Vec<Launch>,
}

/// The probe stacks, one at a time: the hops of each, in ms.
#[derive(Default)]
pub(crate) struct Probes {
    /// Workspace output → Cluster endpoint (t2 − t0).
    pub(crate) total_ms: Vec<f64>,
    /// Workspace output → CAPTControlPlane endpoint (t1 − t0): ours.
    pub(crate) ours_ms: Vec<f64>,
    /// CAPTControlPlane endpoint → Cluster endpoint (t2 − t1): Cluster API core, waiting
    /// for our `status.ready` too.
    pub(crate) core_ms: Vec<f64>,
    /// Workspace output → CAPTControlPlane with both endpoint and `status.ready` (tr =
    /// max(t1, ready), what core needs before it copies): ours.
    pub(crate) ours_ready_ms: Vec<f64>,
    /// tr → Cluster endpoint: core alone.
    pub(crate) core_ready_ms: Vec<f64>,
    /// Workspace Ready=True with its output (t0r, the provider's second pass: what the
    /// control plane's readiness follows) → Cluster endpoint: the headline, our hops and core's.
    pub(crate) ready_total_ms: Vec<f64>,
    /// t0r → CAPTControlPlane endpoint and `status.ready` (tr): ours.
    pub(crate) ready_ours_ms: Vec<f64>,
    /// The same hop by the floor (`floor`), one floor stack after each probe stack.
    pub(crate) floor_ms: Vec<f64>,
    pub(crate) floor_made: usize,
    pub(crate) floor_missed: usize,
    /// The status each floor control plane carries (`floor::Padding`), in bytes.
    pub(crate) floor_padding_bytes: usize,
    pub(crate) made: usize,
    pub(crate) missed: usize,
    pub(crate) delta: Delta,
    /// Probe stacks in flight at once.
    pub(crate) concurrency: usize,
}

/// Output changes of provisioned stacks, one at a time.
#[derive(Default)]
pub(crate) struct Changes {
    /// Workspace output changed → CAPTControlPlane endpoint changed, in ms.
    pub(crate) ours_ms: Vec<f64>,
    pub(crate) made: usize,
    pub(crate) missed: usize,
    pub(crate) delta: Delta,
}

/// The restart of the leading pod's processes (the baseline: its controller), or its death
/// and a standby pod's taking over.
pub(crate) struct Restart {
    /// Kill → every live process answers `/readyz` (baseline: `/healthz`).
    pub(crate) ready_s: f64,
    /// Kill → a controller logs `Leading`.
    pub(crate) leading_s: f64,
    /// The pod that leads afterwards.
    pub(crate) leader: String,
    /// Kill → the reconcile counter's last move before `RESTART_QUIET` without one; `None`
    /// when it never stopped within `RESTART_LIMIT`.
    pub(crate) quiet_s: Option<f64>,
    /// Reconciles from restart to quiet.
    pub(crate) reconciles: f64,
    /// Writes from kill to quiet + `RESTART_QUIET`, by field manager.
    pub(crate) writes: BTreeMap<String, u64>,
    /// Write requests refused in that time (they wrote nothing), by field manager.
    pub(crate) refused: BTreeMap<String, u64>,
    /// Reads by (process, verb, resource).
    pub(crate) reads: BTreeMap<(String, String, String), u64>,
    /// Writes of any object by the processes of the pods that did not lead afterwards, by
    /// process (target: none).
    pub(crate) writes_by_others: BTreeMap<String, u64>,
    pub(crate) controller: ProcessStats,
    pub(crate) applier: Option<ProcessStats>,
}

pub(crate) async fn run_round(args: &Args, mode: Mode, n: usize, pod: &Pod) -> Result<Round> {
    let client = env().client().await?;
    let audit = env().state_dir().join("audit.log");
    let ns = format!("bench-{n}-{}", mode.short());
    let templates = pod.template_namespace()?;
    create_namespace(&client, &ns).await?;
    let dir = std::env::temp_dir().join(capt_tests::unique_name(&ns));
    std::fs::create_dir_all(&dir)?;
    let mut system = BenchSystem::start(args, mode, pod, &dir).await?;
    let round = Probe {
        mode,
        ns: &ns,
        audit: &audit,
    };
    let stacks = Stacks {
        ns: &ns,
        templates: &templates,
    };
    let watches = Watches::start(&client, &ns);
    let (captclusters, census_task) = StatusCensus::watch(Api::namespaced_with(
        client.clone(),
        &ns,
        &resource("infrastructure.cluster.x-k8s.io", "CAPTCluster"),
    ));
    eprintln!(
        "[{} N={n}] namespace {ns}, processes' logs in {}",
        mode.name(),
        dir.display()
    );

    let own: Vec<String> = (0..args.output_changes.min(n)).map(stack_name).collect();
    let provision_timeout = match mode {
        Mode::Baseline => Duration::from_secs(args.baseline_provision_timeout_seconds),
        Mode::Sidecar => args.provision_timeout(n),
    };
    let (provisioned, provisioned_in, provisioning) = provision(
        &round,
        &system,
        &client,
        &watches,
        &stacks,
        n,
        &own,
        provision_timeout,
    )
    .await?;
    let provisioned_census = captclusters.changes();
    let (steady, lease_writes_per_minute) =
        steady_state(&round, &system, args.steady_seconds).await?;
    let before_probes = captclusters.changes();
    // The baseline's hops are its 30 s requeues: fewer probes, each given two of them.
    let (probe_count, timeout) = match mode {
        Mode::Sidecar => (
            args.changes,
            Duration::from_secs(args.probe_timeout_seconds),
        ),
        Mode::Baseline => (args.baseline_changes, 3 * crate::upstream::REQUEUE),
    };
    let padding = match (mode, args.floor_object) {
        (Mode::Baseline, _) => None,
        (Mode::Sidecar, FloorObject::Bare) => Some(Padding::Bare),
        (Mode::Sidecar, FloorObject::AsOurs) => {
            Some(Padding::of(&client, &ns, &stack_name(0)).await?)
        }
    };
    let floor_task = padding
        .is_some()
        .then(|| floor::spawn(client.clone(), ns.clone()));
    let probes = probe_stacks(
        &round,
        &system,
        &client,
        &watches,
        &stacks,
        probe_count,
        match mode {
            Mode::Sidecar => args.probe_concurrency,
            Mode::Baseline => 1,
        },
        timeout,
        padding.as_ref(),
    )
    .await?;
    if let Some(t) = floor_task {
        t.abort();
    }
    let captcluster_changes = vec![
        ("provisioning", provisioned_census),
        (
            "probe stacks",
            census::since(&before_probes, &captclusters.changes()),
        ),
    ];
    census_task.abort();
    let changed = match mode {
        Mode::Sidecar => &own[..],
        Mode::Baseline => &own[..args.baseline_changes.min(own.len())],
    };
    let changes = output_changes(
        &round, &system, &client, &watches, &stacks, changed, timeout,
    )
    .await?;
    let (controller, applier) = measure_processes(&system)?;
    let standby = system
        .standbys()
        .flat_map(|pod| {
            let mut processes = vec![("capt-controller", &pod.controller)];
            processes.extend(pod.applier.iter().map(|a| ("status-applier", a)));
            processes.into_iter().map(|(name, process)| {
                Ok((process_name(&pod.name, name), process_stats(process.pid())?))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let restart = take_over(&round, &mut system, "restart", BenchSystem::restart).await?;
    // Before the burst, whose condition no controller computes: a new leader would remove
    // it. The round's system has one pod less afterwards.
    let fail_over = if system.pods.len() > 1 {
        Some(
            take_over(&round, &mut system, "fail-over", |s| {
                s.kill_leader();
                Ok(())
            })
            .await?,
        )
    } else {
        None
    };
    // After the restart: the burst's condition stays on the object, and is no part of what
    // the restart should find up to date.
    let socket_burst = match mode {
        Mode::Sidecar => {
            Some(socket_burst(&round, &system, &client, &stack_name(0), args.burst).await?)
        }
        Mode::Baseline => None,
    };
    Ok(Round {
        mode,
        clusters: n,
        step_timeout: timeout,
        provisioned,
        provisioned_in,
        provisioning,
        steady,
        probes,
        changes,
        socket_burst,
        captcluster_changes,
        controller,
        applier,
        restart,
        fail_over,
        standby,
        lease_writes_per_minute,
        launches: system.launches.clone(),
    })
}

/// Where a round's stacks go: their namespace, and the template namespace their templates are
/// kept in (the one the Deployment trusts with code).
pub(crate) struct Stacks<'a> {
    pub(crate) ns: &'a str,
    pub(crate) templates: &'a str,
}

/// Phase 1, provisioning: the templates and `n` stacks created at once (`own` of them with
/// a WorkspaceTemplate of their own) while the fake provider plays Terraform, until they are
/// provisioned (or a deadline passes) and the writes settle. Returns how many were
/// provisioned, in how many seconds, and what happened meanwhile.
#[allow(clippy::too_many_arguments)]
async fn provision(
    round: &Probe<'_>,
    system: &BenchSystem,
    client: &kube::Client,
    watches: &Watches,
    stacks: &Stacks<'_>,
    n: usize,
    own: &[String],
    timeout: Duration,
) -> Result<(usize, f64, Delta)> {
    let start = round.snapshot(system).await?;
    create_templates(client, stacks.templates, stacks.ns, own).await?;
    create_stacks(client, stacks, n, own.len()).await?;
    eprintln!(
        "  {n} stacks created in {:.1} s",
        start.at.elapsed().as_secs_f64()
    );
    wait_provisioned(watches, n, timeout).await;
    let provisioned = watches.provisioned();
    let provisioned_at = Instant::now();
    let provisioned_in = (provisioned_at - start.at).as_secs_f64();
    eprintln!("  {provisioned}/{n} provisioned in {provisioned_in:.1} s");
    if !round
        .quiet(Duration::from_secs(3), Duration::from_secs(60))
        .await?
    {
        eprintln!("  writes had not stopped 60 s after provisioning");
    }
    let provisioning = round.delta(&start, &round.snapshot(system).await?)?;
    Ok((provisioned, provisioned_in, provisioning))
}

/// Creates the namespace `ns`.
pub(crate) async fn create_namespace(client: &kube::Client, ns: &str) -> Result<()> {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await
        .with_context(|| format!("creating namespace {ns}"))?;
    Ok(())
}

/// Creates stacks `0..n`, `CREATE_CONCURRENCY` at a time; the first `own` use a
/// WorkspaceTemplate of their own.
pub(crate) async fn create_stacks(
    client: &kube::Client,
    stacks: &Stacks<'_>,
    n: usize,
    own: usize,
) -> Result<()> {
    create_stacks_in(client, stacks, n, own, None).await
}

/// [`create_stacks`], each labelled for `shard`, if any.
pub(crate) async fn create_stacks_in(
    client: &kube::Client,
    stacks: &Stacks<'_>,
    n: usize,
    own: usize,
    shard: Option<&str>,
) -> Result<()> {
    futures::stream::iter((0..n).map(|i| {
        let template = (i < own).then(|| own_template(stacks.ns, &stack_name(i)));
        let shard = shard.map(str::to_owned);
        create_stack(
            client.clone(),
            stacks.ns.to_owned(),
            stacks.templates.to_owned(),
            stack_name(i),
            template,
            shard,
        )
    }))
    .buffer_unordered(CREATE_CONCURRENCY)
    .try_collect::<Vec<()>>()
    .await?;
    Ok(())
}

/// Waits until `n` Clusters are provisioned, for at most `timeout`, reporting progress every
/// 10 s.
pub(crate) async fn wait_provisioned(watches: &Watches, n: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let mut reported = Instant::now();
    while watches.provisioned() < n && Instant::now() < deadline {
        if reported.elapsed() > Duration::from_secs(10) {
            eprintln!("  provisioned {}/{n}", watches.provisioned());
            reported = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Phase 2, steady state: what happens over `seconds` once provisioned, and each pod's
/// controller's Lease writes per minute meanwhile.
async fn steady_state(
    round: &Probe<'_>,
    system: &BenchSystem,
    seconds: u64,
) -> Result<(Delta, Vec<(String, f64)>)> {
    let before = round.snapshot(system).await?;
    let leases_before = lease_writes(system).await;
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let leases_after = lease_writes(system).await;
    let steady = round.delta(&before, &round.snapshot(system).await?)?;
    let per_minute = leases_before
        .into_iter()
        .zip(leases_after)
        .map(|((pod, b), (_, a))| (pod, (a - b) * 60.0 / steady.seconds))
        .collect();
    eprintln!(
        "  steady state: {} writes by the controller, {} by anyone, {} reconciles in {:.0} s",
        steady.controller_writes(),
        steady.all_writes(),
        steady.reconciles,
        steady.seconds
    );
    Ok((steady, per_minute))
}

/// Each pod's controller's writes of the leader Lease so far (`capt_leader_lease_writes_total`:
/// Leases are not in the audit log); NaN where it cannot be read.
async fn lease_writes(system: &BenchSystem) -> Vec<(String, f64)> {
    let mut counts = Vec::new();
    for pod in &system.pods {
        let text = system.controller_metrics_of(pod).await;
        let count = text.and_then(|t| metric_value(&t, "capt_leader_lease_writes_total", &[]));
        let count = count.unwrap_or_else(|e| {
            eprintln!("  {}: its Lease writes could not be read: {e:#}", pod.name);
            f64::NAN
        });
        counts.push((pod.name.clone(), count));
    }
    counts
}

fn ms(from: Instant, to: Instant) -> f64 {
    // Signed: two watches deliver independently, so a later hop may arrive first.
    if to >= from {
        (to - from).as_secs_f64() * 1000.0
    } else {
        -((from - to).as_secs_f64() * 1000.0)
    }
}

/// One probe stack's times (and its floor stack's hop).
#[derive(Default)]
struct ProbeTimes {
    t0: Option<Instant>,
    t1: Option<Instant>,
    t2: Option<Instant>,
    ready: Option<Instant>,
    t0r: Option<Instant>,
    /// `None` without a floor stack; `Some(None)` when it missed.
    floor_ms: Option<Option<f64>>,
}

/// Probe stack `i` and (with `floor`) floor stack `i`, created together so that both hops
/// run under the same load, each waited for up to `timeout`.
async fn probe_one(
    stacks: &Stacks<'_>,
    client: &kube::Client,
    watches: &Watches,
    i: usize,
    timeout: Duration,
    floor: Option<&Padding>,
) -> Result<ProbeTimes> {
    let ns = stacks.ns;
    let stack = probe_name(i);
    let name = floor_name(i);
    let ours = async {
        create_stack(
            client.clone(),
            ns.to_owned(),
            stacks.templates.to_owned(),
            stack.clone(),
            None,
            None,
        )
        .await?;
        let t2 = watches
            .clusters
            .wait(timeout, |s| s.first_with(&stack, "host:"))
            .await;
        anyhow::Ok(t2)
    };
    let theirs = async {
        let Some(padding) = floor else {
            return anyhow::Ok(None);
        };
        create_floor_stack(client, ns, &name, padding).await?;
        let tr = watches
            .control_planes
            .wait(timeout, |s| {
                Some(s.first_with(&name, "host:")?.max(s.first(&name, "ready")?))
            })
            .await;
        let ws = floor_workspace(ns, &name);
        Ok(Some(
            match (watches.workspaces.first_with(&ws, "ready-output"), tr) {
                (Some(t0r), Some(tr)) => Some(ms(t0r, tr)),
                _ => None,
            },
        ))
    };
    let (t2, floor_ms) = futures::try_join!(ours, theirs)?;
    let ws = workspace_name(ns, &format!("{stack}-controlplane"));
    Ok(ProbeTimes {
        t0: watches.workspaces.first_with(&ws, "output:"),
        t1: watches.control_planes.first_with(&stack, "host:"),
        t2,
        ready: watches.control_planes.first_with(&stack, "ready"),
        t0r: watches.workspaces.first_with(&ws, "ready-output"),
        floor_ms,
    })
}

/// Phase 3, latency: `count` new stacks created `concurrency` at a time, each waited for until
/// its Cluster has an endpoint, each with a floor stack created beside it (with `floor`).
/// For each, from the round's watches: t0 when its control plane's Workspace first showed
/// the `cluster_endpoint` output, t1 when its CAPTControlPlane first had
/// `spec.controlPlaneEndpoint.host`, t2 when its Cluster did.
#[allow(clippy::too_many_arguments)]
async fn probe_stacks(
    round: &Probe<'_>,
    system: &BenchSystem,
    client: &kube::Client,
    watches: &Watches,
    stacks: &Stacks<'_>,
    count: usize,
    concurrency: usize,
    timeout: Duration,
    floor: Option<&Padding>,
) -> Result<Probes> {
    let mut p = Probes::default();
    let before = round.snapshot(system).await?;
    let mut reported = Instant::now();
    let missed = std::sync::atomic::AtomicUsize::new(0);
    let started = std::sync::atomic::AtomicUsize::new(0);
    let mut results = futures::stream::iter(0..count)
        .take_while(|_| {
            let go = missed.load(std::sync::atomic::Ordering::Relaxed) < MISSES_BEFORE_GIVING_UP
                && before.at.elapsed() <= PHASE_BUDGET;
            if go {
                started.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            std::future::ready(go)
        })
        .map(|i| probe_one(stacks, client, watches, i, timeout, floor))
        .buffer_unordered(concurrency.max(1));
    while let Some(times) = results.next().await {
        let times = times?;
        p.made += 1;
        if reported.elapsed() > PROGRESS {
            eprintln!("  probe stacks: {}/{count} ({} missed)", p.made, p.missed);
            reported = Instant::now();
        }
        match (times.t0, times.t1, times.t2) {
            (Some(t0), Some(t1), Some(t2)) => {
                p.total_ms.push(ms(t0, t2));
                p.ours_ms.push(ms(t0, t1));
                p.core_ms.push(ms(t1, t2));
                if let Some(ready) = times.ready {
                    let tr = t1.max(ready);
                    p.ours_ready_ms.push(ms(t0, tr));
                    p.core_ready_ms.push(ms(tr, t2));
                    if let Some(t0r) = times.t0r {
                        p.ready_total_ms.push(ms(t0r, t2));
                        p.ready_ours_ms.push(ms(t0r, tr));
                    }
                }
            }
            _ => {
                p.missed += 1;
                missed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        match times.floor_ms {
            None => {}
            Some(Some(hop)) => {
                p.floor_made += 1;
                p.floor_ms.push(hop);
            }
            Some(None) => {
                p.floor_made += 1;
                p.floor_missed += 1;
            }
        }
    }
    drop(results);
    let started = started.load(std::sync::atomic::Ordering::Relaxed);
    if started < count {
        eprintln!(
            "  {started} probe stacks made, {} missed: the phase stopped there",
            p.missed
        );
    }
    round
        .quiet(Duration::from_secs(2), Duration::from_secs(30))
        .await?;
    p.delta = round.delta(&before, &round.snapshot(system).await?)?;
    p.concurrency = concurrency.max(1);
    p.floor_padding_bytes = floor.map_or(0, Padding::bytes);
    eprintln!("  {} probe stacks ({} missed)", p.made, p.missed);
    Ok(p)
}

/// Phase 4, output changes of provisioned stacks, one at a time: the `cluster_endpoint`
/// output of each stack of `own` changed in its WorkspaceTemplate; the controller renders the
/// Workspace, the provider applies it and reports the new output. Waits until the
/// CAPTControlPlane's endpoint follows (Cluster API core leaves the Cluster's endpoint as it
/// is once set), then until our managers' writes stop for 1 s, before the next.
async fn output_changes(
    round: &Probe<'_>,
    system: &BenchSystem,
    client: &kube::Client,
    watches: &Watches,
    stacks: &Stacks<'_>,
    own: &[String],
    timeout: Duration,
) -> Result<Changes> {
    let mut c = Changes::default();
    let before = round.snapshot(system).await?;
    let mut reported = Instant::now();
    for (i, stack) in own.iter().enumerate() {
        if c.missed >= MISSES_BEFORE_GIVING_UP || before.at.elapsed() > PHASE_BUDGET {
            eprintln!(
                "  {i} output changes made, {} missed: the phase stops here",
                c.missed
            );
            break;
        }
        if reported.elapsed() > PROGRESS {
            eprintln!("  output changes: {i}/{} ({} missed)", own.len(), c.missed);
            reported = Instant::now();
        }
        let host = endpoint_host(stack, 1);
        let ws = workspace_name(round.ns, &format!("{stack}-controlplane"));
        c.made += 1;
        change_output(client, stacks.templates, stacks.ns, stack, &host).await?;
        let wanted = format!("host:{host}");
        let t1 = watches
            .control_planes
            .wait(timeout, |s| s.first(stack, &wanted))
            .await;
        let t0 = watches
            .workspaces
            .first(&ws, &format!("output:https://{host}"));
        match (t0, t1) {
            (Some(t0), Some(t1)) => c.ours_ms.push(ms(t0, t1)),
            _ => c.missed += 1,
        }
        round
            .quiet(Duration::from_secs(1), Duration::from_secs(10))
            .await?;
    }
    c.delta = round.delta(&before, &round.snapshot(system).await?)?;
    eprintln!("  {} output changes ({} missed)", c.made, c.missed);
    Ok(c)
}

/// The burst of intents: how many applies it became, and how it reached the applier.
pub(crate) struct Burst {
    pub(crate) delta: Delta,
    /// From the first answer to the last one, in ms.
    pub(crate) spread_ms: f64,
    /// The longest time between two answers in a row, in ms. The applier answers an intent
    /// that does not wait as soon as it has merged it, so this is (to the scheduling of this
    /// process) the longest quiet time the applier saw inside the burst: longer than the
    /// coalescing window, and the burst was two bursts to it.
    pub(crate) largest_gap_ms: f64,
}

/// Phase 8, `burst` intents for one object under one manager, sent to the applier's socket
/// together (all in flight at once, as the reconcilers of a busy controller send them), the
/// last one waiting for its apply: how many applies they became (the writes of that manager in
/// the audit log), and when they were answered. (Sent one after another instead, each waiting
/// for its answer, they are a burst only while no answer takes longer than the coalescing
/// window, 10 ms.)
async fn socket_burst(
    round: &Probe<'_>,
    system: &BenchSystem,
    client: &kube::Client,
    stack: &str,
    burst: usize,
) -> Result<Burst> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        round.ns,
        &resource("controlplane.cluster.x-k8s.io", "CAPTControlPlane"),
    );
    let live = api.get(stack).await?;
    let uid = live.metadata.uid;
    // A fragment replaces a list whole, and the controller sends this manager's conditions:
    // each intent carries them as they are, plus its own, so that the burst adds one
    // condition and takes none of the controller's away (which the controller would then
    // write back, a second apply that is no part of the burst).
    let conditions: Vec<serde_json::Value> = live.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["type"] != "BenchBurst")
        .cloned()
        .collect();
    let intent = |i: usize| Intent {
        target: Target {
            api_version: "controlplane.cluster.x-k8s.io/v1beta1".into(),
            kind: "CAPTControlPlane".into(),
            namespace: Some(round.ns.to_owned()),
            name: stack.to_owned(),
            uid: uid.clone(),
        },
        subresource: Some(Subresource::Status),
        // An allowed manager (the Deployment's allow-list): the controller's own.
        field_manager: "capt-captcontrolplane".into(),
        fragment: json!({"status": {"conditions": conditions.iter().cloned().chain([json!({
            "type": "BenchBurst", "status": "True", "reason": "Burst",
            "message": format!("intent {i}"), "lastTransitionTime": "2026-01-01T00:00:00Z"})])
            .collect::<Vec<_>>()}}),
        release: vec![],
        not_older_than: None,
    };
    let applier = system.applier_client()?;
    let before = round.snapshot(system).await?;
    let started = Instant::now();
    let (sent, last) = futures::join!(
        futures::future::join_all((0..burst - 1).map(|i| {
            let (applier, intent) = (applier.clone(), intent(i));
            async move {
                let answer = applier.submit(&intent, false).await;
                (answer, Instant::now())
            }
        })),
        async {
            let intent = intent(burst - 1);
            applier.submit(&intent, true).await
        }
    );
    let mut answered = Vec::with_capacity(sent.len());
    for (answer, at) in sent {
        answer?;
        answered.push(at);
    }
    let last = last?;
    answered.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let spread_ms = match (answered.first(), answered.last()) {
        (Some(first), Some(last)) => ms(*last - *first),
        _ => 0.0,
    };
    let largest_gap_ms = answered
        .windows(2)
        .map(|w| ms(w[1] - w[0]))
        .fold(0.0, f64::max);
    eprintln!(
        "  burst of {burst} intents sent in {:?}; answered over {spread_ms:.1} ms, largest gap {largest_gap_ms:.1} ms",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let delta = round.delta(&before, &round.snapshot(system).await?)?;
    eprintln!(
        "  burst of {burst} intents: answer {}, {} applies",
        last.status,
        delta.writes_of("capt-captcontrolplane")
    );
    Ok(Burst {
        delta,
        spread_ms,
        largest_gap_ms,
    })
}

/// Phase 6, the processes: peak RSS and CPU time of the controller and (sidecar only) of
/// the status-applier, before the restart.
fn measure_processes(system: &BenchSystem) -> Result<(ProcessStats, Option<ProcessStats>)> {
    let controller = process_stats(system.leader().controller.pid())?;
    let applier = match &system.leader().applier {
        Some(a) => Some(process_stats(a.pid())?),
        None => None,
    };
    Ok((controller, applier))
}

async fn reconciles(system: &BenchSystem) -> Option<f64> {
    let text = system.controller_metrics().await.ok()?;
    metric_value(&text, "capt_reconciles_total", &[]).ok()
}

/// Phase 7, restart (and, last, fail-over): `kill` stops the leading pod's processes (and
/// starts them again, or not), and a pod takes the Lease: the same after a restart, or a
/// standby one. The controller has worked through its initial queue when its reconcile
/// counter, having moved, stays still for `RESTART_QUIET` (scraped every 250 ms); if it
/// never moves, 30 s after it leads.
async fn take_over(
    round: &Probe<'_>,
    system: &mut BenchSystem,
    phase: &str,
    kill: impl FnOnce(&mut BenchSystem) -> Result<()>,
) -> Result<Restart> {
    // The baseline never goes quiet (its requeues): a minute of it is enough to count.
    let limit = match round.mode {
        Mode::Sidecar => RESTART_LIMIT,
        Mode::Baseline => Duration::from_secs(60),
    };
    let from = round.audit_end()?;
    let killed = Instant::now();
    kill(system)?;
    // A fail-over waits out the Lease (15 s as deployed) before a standby may lead.
    let (ready, leading) = system.wait_ready(Duration::from_secs(120)).await?;
    let mut last = reconciles(system).await.unwrap_or(0.0);
    let mut moved_at = Instant::now();
    let mut moved = last > 0.0;
    let mut reported = Instant::now();
    let quiet_s = loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = Instant::now();
        if let Some(r) = reconciles(system).await
            && r != last
        {
            last = r;
            moved_at = now;
            moved = true;
        }
        let still = now - moved_at;
        if (moved && still >= RESTART_QUIET) || (!moved && now - leading >= Duration::from_secs(30))
        {
            break Some((moved_at - killed).as_secs_f64());
        }
        if now - killed > limit {
            break None;
        }
        if reported.elapsed() > PROGRESS {
            eprintln!("  {phase}: {last} reconciles so far");
            reported = Instant::now();
        }
    };
    let to = round.audit_end()?;
    let writes = round.write_requests(from, to)?;
    let who: Vec<(&str, &str)> = system
        .identities
        .iter()
        .map(|(n, id)| (n.as_str(), id.as_str()))
        .collect();
    let leader = system.leader();
    let others: Vec<(&str, &str)> = system
        .identities
        .iter()
        .filter(|(n, _)| {
            *n != process_name(&leader.name, "capt-controller")
                && *n != process_name(&leader.name, "status-applier")
        })
        .map(|(n, id)| (n.as_str(), id.as_str()))
        .collect();
    let restart = Restart {
        ready_s: (ready - killed).as_secs_f64(),
        leading_s: (leading - killed).as_secs_f64(),
        leader: leader.name.clone(),
        quiet_s,
        reconciles: last,
        writes: writes.made,
        refused: writes.refused,
        reads: round.reads_by(from, to, &who)?,
        writes_by_others: round.writes_by(from, to, &others)?,
        controller: process_stats(leader.controller.pid())?,
        applier: match &leader.applier {
            Some(a) => Some(process_stats(a.pid())?),
            None => None,
        },
    };
    eprintln!(
        "  {phase}: ready {:.1} s, {} leads at {:.1} s, quiet {}, {} writes, {} by the other pods",
        restart.ready_s,
        restart.leader,
        restart.leading_s,
        quiet_s.map_or("never".into(), |q| format!("{q:.1} s")),
        restart.writes.values().sum::<u64>(),
        restart.writes_by_others.values().sum::<u64>()
    );
    Ok(restart)
}
