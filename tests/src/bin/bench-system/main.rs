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
//!
//! This file holds the flags and the loop over the rounds; `round` runs one round phase by
//! phase, `probe` measures it (counters, audited writes, processes), `stacks` creates the
//! stacks and watches their Clusters, and `tables` prints the results.

mod probe;
mod round;
mod stacks;
mod tables;

use anyhow::Result;
use clap::{Parser, ValueEnum};
use round::run_round;
use tables::tables;

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
