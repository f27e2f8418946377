//! Whole-system benchmark: N CAPT stacks (Cluster + CAPTCluster + CAPTControlPlane) against
//! the real API server and the real Cluster API core manager (`hack/testenv.sh`), the system
//! running as `manifests/deploy/deployment.yaml` configures it, beside the baseline
//! (upstream CAPT's write pattern: `upstream`) and the floor (a minimal direct writer:
//! `floor`). Prints tables.
//!
//! The system as deployed (`deployed`): the Deployment's two containers, `status-applier` and
//! `manager`, become two processes started with each container's command and environment
//! read from the YAML at run time (leader election on, the binaries' default log level,
//! cluster-wide, the allow-lists and watch kinds), changing only what a local run must
//! (paths under volume mounts, bind addresses, the pod's name, a kubeconfig with a token of
//! the pod's ServiceAccount: `identity`); metrics are scraped over HTTPS with a token bound
//! to `capt-controller-metrics-reader`. The baseline is this binary run as another process
//! (`upstream::FLAG`). The fake provider runs with its defaults (provider-terraform's: a 10 min
//! poll, one Workspace at a time), only its apply time set (`--provider-delay-ms`). Every
//! difference from production is printed with the tables (`tables::differences`).
//!
//! API writes and reads are counted by the API server itself: from the audit log
//! `hack/testenv.sh` keeps (every request but those on Events and Leases, by field manager
//! and by the token's id). Each round, per mode and N, on a fresh API server
//! (`--restart-environment`, which `hack/bench.sh` passes):
//! 1. provisioning: N stacks created (`round::CREATE_CONCURRENCY` at a time), until their
//!    Clusters are Provisioned with an endpoint and our managers' writes stop for 3 s;
//! 2. steady state: writes and reconciles over `--steady-seconds`;
//! 3. latency: `--changes` new "probe" stacks, `--probe-concurrency` at a time, each waited for until
//!    its Cluster has an endpoint (`--probe-timeout-seconds`, else missed); from the benchmark's watches (one per
//!    kind, each event stamped on receipt): t0 the control plane's Workspace first shows the
//!    `cluster_endpoint` output, t1 the CAPTControlPlane's `spec.controlPlaneEndpoint.host`
//!    is set, t2 the Cluster's; p50/p99/max of t2 − t0 and of each hop (t1 − t0 ours,
//!    t2 − t1 core), and, since core copies the endpoint only once the CAPTControlPlane's
//!    `status.ready` is true, the same split at tr = max(t1, ready first seen); and the
//!    writes per probe stack by field manager;
//! 4. output changes: the `cluster_endpoint` output of `--output-changes` provisioned stacks
//!    changed, one at a time, where it comes from (each of those stacks has a
//!    WorkspaceTemplate of its own, in the namespace the Deployment trusts with templates, as
//!    all the benchmark's are: `stacks`); the writes per change by field manager, and the time
//!    from the Workspace's new output to the CAPTControlPlane's new endpoint (core never
//!    changes a Cluster's endpoint once set, so that is where a change ends);
//! 5. peak RSS and CPU seconds of each process;
//! 6. restart: the leading pod's processes killed and started again the same way, its
//!    standby beside it: the time until ready, until a controller leads, until its reconcile counter stops moving for 3 s;
//!    the writes meanwhile (ours: target 0; the provider's polls are counted apart) and
//!    each process's LIST, GET and WATCH requests (told apart by their tokens' ids);
//! 7. fail-over (sidecar, with the Deployment's two replicas): the leading pod killed for
//!    good; the time until the standby pod leads and has worked through its queue, our writes
//!    meanwhile, and any write by a pod that does not lead (target: none);
//! 8. burst (sidecar only): `--burst` intents for one object sent straight to the leading
//!    applier's socket, and the applies they became.
//!
//! `hack/bench.sh` builds in release mode, starts a fresh environment and runs it.
//!
//! Two other runs replace the rounds: `churn` (`--churn-waves`: stacks provisioned and
//! deleted in waves, the memory kept after each) and `shards` (`--shards`: the stacks split
//! over shards, each shard's cost and its writes to other shards' objects).
//!
//! This file holds the flags and the loop over the rounds; `round` runs one round phase by
//! phase, `system` starts the processes (from `deployed` and `identity`), `probe` measures
//! (counters, audited requests, processes), `stacks` creates the stacks and watches them,
//! and `tables` prints the results.

mod census;
mod churn;
mod deployed;
mod floor;
mod identity;
mod noisy;
mod probe;
mod round;
mod shards;
mod stacks;
mod system;
mod tables;
mod upstream;

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use round::run_round;
use tables::{Header, tables};

/// Runs the whole-system benchmark and prints its tables.
#[derive(Parser)]
#[command(
    about = "The whole-system benchmark: N CAPT stacks as deployed, beside the baseline (upstream CAPT's write pattern), the floor and Cluster API core (run it through hack/bench.sh)"
)]
struct Args {
    /// Numbers of CAPT stacks, one round each (per mode).
    #[arg(long, value_delimiter = ',', default_values_t = [100, 1000])]
    clusters: Vec<usize>,
    /// Probe stacks and output changes of the baseline (each waits for its 30 s requeues:
    /// up to 90 s).
    #[arg(long, default_value_t = 5)]
    baseline_changes: usize,
    /// The numbers of stacks the system as deployed runs at (default: every `--clusters`).
    #[arg(long, value_delimiter = ',')]
    sidecar_clusters: Option<Vec<usize>>,
    /// The numbers of stacks the baseline runs at (it is skipped at the others).
    #[arg(long, value_delimiter = ',', default_values_t = [100, 1000])]
    baseline_clusters: Vec<usize>,
    /// The modes to compare.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Mode::Sidecar, Mode::Baseline])]
    modes: Vec<Mode>,
    /// Length of the steady-state observation.
    #[arg(long, default_value_t = 60)]
    steady_seconds: u64,
    /// Probe stacks (latency), each with a floor stack beside it: at least 200, so that a
    /// p99 is a percentile and not the largest sample.
    #[arg(long, default_value_t = 200)]
    changes: usize,
    /// Probe stacks (each with its floor stack) in flight at once. With 1 they are made one
    /// after another; more keeps a round of 200 probes at 1,000 stacks within minutes (each
    /// probe waits on the provider's requeues, seconds), and the tables say how many.
    #[arg(long, default_value_t = 1)]
    probe_concurrency: usize,
    /// What the floor's control planes carry besides what the floor writes: `as-ours`, the
    /// status of one of the round's provisioned control planes (an object of our size), or
    /// `bare` (only the `Paused` condition; the floor of the rounds before 2026-11-28).
    #[arg(long, value_enum, default_value_t = FloorObject::AsOurs)]
    floor_object: FloorObject,
    /// How long a probe stack may take to get its Cluster's endpoint (a whole new stack: two
    /// Workspaces applied, core's reconciles), or a changed output to reach the
    /// CAPTControlPlane, before it counts as missed. On a loaded machine a probe takes tens of
    /// seconds; the phase stops after 3 misses.
    #[arg(long, default_value_t = 30)]
    probe_timeout_seconds: u64,
    /// Output changes of provisioned stacks (writes per change), one at a time.
    #[arg(long, default_value_t = 20)]
    output_changes: usize,
    /// Size of the burst of intents.
    #[arg(long, default_value_t = 100)]
    burst: usize,
    /// The fake provider's apply (and destroy) time.
    #[arg(long, default_value_t = 100)]
    provider_delay_ms: u64,
    /// The fake provider's `--max-reconcile-rate`: Workspaces reconciled at once
    /// (provider-terraform's default is 1; at thousands of stacks provisioning takes hours
    /// with it, and the tables say when it was raised).
    #[arg(long, default_value_t = 1)]
    provider_max_reconcile_rate: u16,
    /// How long provisioning may take before the round goes on with what was provisioned
    /// (default: 120 s plus 2 s per stack).
    #[arg(long)]
    provision_timeout_seconds: Option<u64>,
    /// How long the baseline's provisioning may take: one reconcile at a time per controller,
    /// each a full status write, is slower than ours (the tables say how many it provisioned).
    #[arg(long, default_value_t = 300)]
    baseline_provision_timeout_seconds: u64,
    /// Instead of the rounds: this many churn waves at each `--clusters` (the system as
    /// deployed; each wave N stacks provisioned, then deleted; the resident memory after
    /// each), to show what the processes keep of deleted objects.
    #[arg(long, default_value_t = 0)]
    churn_waves: usize,
    /// Instead of the rounds: each `--clusters` split over this many shards, each shard the
    /// Deployment's pods narrowed to its label, to show each shard's cost and that no shard
    /// writes another's objects.
    #[arg(long, default_value_t = 0)]
    shards: usize,
    /// Instead of the rounds: the noisy-neighbour run (`noisy`): tenant B's time to a
    /// rendered Workspace, alone, beside tenant A's flood and waiting applies, and after a
    /// restart; fails when B's p99 is over 2x of alone or a peak RSS over its limit.
    #[arg(long)]
    noisy_neighbour: bool,
    /// Applies tenant A creates at once in the noisy-neighbour run.
    #[arg(long, default_value_t = 1000)]
    noisy_flood: usize,
    /// Applies of tenant A that each wait for the most Secrets the CRD allows, one missing.
    #[arg(long, default_value_t = 200)]
    noisy_waits: usize,
    /// Applies tenant B creates in each phase, one a second: at least 100, so that a p99 is
    /// not the largest sample.
    #[arg(long, default_value_t = 100)]
    noisy_probes: usize,
    /// Restart the test environment (`hack/testenv.sh stop`, `start`, in its
    /// `CAPT_TESTENV_DIR`) before every round but the first, so that each round has an API
    /// server of its own: the processes are cluster-wide. `hack/bench.sh` passes it; never
    /// use it on an environment others share.
    #[arg(long)]
    restart_environment: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// status-applier + capt-controller, as deployed.
    Sidecar,
    /// Upstream CAPT's write pattern (`upstream`), alone.
    Baseline,
}

impl Args {
    /// How long provisioning `n` stacks may take as deployed (`--provision-timeout-seconds`,
    /// by default 120 s plus 2 s per stack).
    fn provision_timeout(&self, n: usize) -> std::time::Duration {
        let seconds = self.provision_timeout_seconds.unwrap_or(120 + 2 * n as u64);
        std::time::Duration::from_secs(seconds)
    }
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Sidecar => "sidecar (as deployed)",
            Mode::Baseline => "baseline (upstream's pattern)",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Mode::Sidecar => "sidecar",
            Mode::Baseline => "baseline",
        }
    }
}

/// `hack/testenv.sh stop` then `start`, in the environment's state directory.
fn restart_environment() -> Result<()> {
    let dir = capt_tests::env().state_dir().to_owned();
    for verb in ["stop", "start"] {
        let out = std::process::Command::new(capt_tests::repo_root().join("hack/testenv.sh"))
            .arg(verb)
            .env("CAPT_TESTENV_DIR", &dir)
            .output()
            .with_context(|| format!("hack/testenv.sh {verb}"))?;
        anyhow::ensure!(
            out.status.success(),
            "hack/testenv.sh {verb} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// What the floor's control planes carry (`floor::Padding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum FloorObject {
    /// The status of one of the round's provisioned control planes of ours.
    AsOurs,
    /// Nothing but the `Paused` condition our controller keeps.
    Bare,
}

#[tokio::main]
async fn main() -> Result<()> {
    if std::env::args().nth(1).as_deref() == Some(upstream::FLAG) {
        return upstream::serve().await;
    }
    let args = Args::parse();
    let header = Header::now()?;
    eprintln!("{}", header.text());
    if args.noisy_neighbour {
        let (text, ok) = noisy::table(&noisy::run_noisy(&args, &deployed::Pod::read()?).await?);
        print!("{}\n{text}", header.text());
        anyhow::ensure!(
            ok,
            "a noisy-neighbour target was missed (the table says which)"
        );
        return Ok(());
    }
    // The churn and the shards replace the rounds: one run per `--clusters`.
    if args.churn_waves > 0 || args.shards > 0 {
        for (i, &n) in args.clusters.iter().enumerate() {
            if i > 0 && args.restart_environment {
                restart_environment()?;
            }
            let pod = deployed::Pod::read()?;
            let table = if args.churn_waves > 0 {
                churn::table(&churn::run_churn(&args, n, args.churn_waves, &pod).await?)
            } else {
                shards::table(&shards::run_shards(&args, n, args.shards, &pod).await?)
            };
            print!("{}\n{table}", header.text());
        }
        return Ok(());
    }
    let mut rounds = Vec::new();
    let mut pod = None;
    for &n in &args.clusters {
        for &mode in &args.modes {
            if mode == Mode::Baseline && !args.baseline_clusters.contains(&n) {
                continue;
            }
            if mode == Mode::Sidecar
                && args
                    .sidecar_clusters
                    .as_ref()
                    .is_some_and(|s| !s.contains(&n))
            {
                continue;
            }
            if !rounds.is_empty() && args.restart_environment {
                eprintln!("restarting the test environment for the next round");
                restart_environment()?;
            }
            // Read again each round: what runs is what the file says now.
            let deployment = deployed::Pod::read()?;
            let round = run_round(&args, mode, n, &deployment).await?;
            pod = Some(deployment);
            rounds.push(round);
            // Each round's numbers as soon as it ends (on stderr): a later round that fails
            // does not take them along.
            eprintln!(
                "{}",
                tables(&rounds[rounds.len() - 1..], &args, &header, pod.as_ref())
            );
        }
    }
    print!("{}", tables(&rounds, &args, &header, pod.as_ref()));
    match pod {
        Some(pod) => limits_hold(&rounds, &pod),
        None => Ok(()),
    }
}

/// The check of the Deployment's memory limits: every peak RSS measured as deployed at up to
/// 1,000 stacks (before and after the restart) must be below its container's limit. Prints
/// each comparison; fails the run when one is not.
fn limits_hold(rounds: &[round::Round], pod: &deployed::Pod) -> Result<()> {
    let limit = |container: &str| -> Result<f64> { pod.memory_limit_mib(container) };
    let (manager, applier) = (limit("manager")?, limit("status-applier")?);
    let mut over = Vec::new();
    println!("\nMemory limits of manifests/deploy/deployment.yaml against the peaks (N <= 1000):");
    for r in rounds
        .iter()
        .filter(|r| r.mode == Mode::Sidecar && r.clusters <= 1000)
    {
        let peaks = [
            ("manager", manager, Some(&r.controller)),
            (
                "manager after restart",
                manager,
                Some(&r.restart.controller),
            ),
            ("status-applier", applier, r.applier.as_ref()),
            (
                "status-applier after restart",
                applier,
                r.restart.applier.as_ref(),
            ),
        ];
        for (what, limit, stats) in peaks {
            let Some(stats) = stats else { continue };
            let ok = stats.peak_rss_mib < limit;
            println!(
                "- N={}: {what} {:.1} MiB, limit {limit:.0} MiB: {}",
                r.clusters,
                stats.peak_rss_mib,
                if ok { "ok" } else { "OVER THE LIMIT" }
            );
            if !ok {
                over.push(format!("N={} {what}", r.clusters));
            }
        }
    }
    anyhow::ensure!(
        over.is_empty(),
        "peak RSS over the Deployment's memory limit: {over:?}"
    );
    Ok(())
}
