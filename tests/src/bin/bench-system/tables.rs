//! The results as Markdown: what reproduces them (commit, machine, command), the
//! differences from production, one table per number of stacks with a column per mode, the
//! writes by field manager in each phase, the reads after the restart, and the scaling of
//! memory with the number of stacks.

use crate::Args;
use crate::deployed::{DEPLOYMENT, Pod, env_summary};
use crate::probe::{STATUS_MANAGERS, ours};
use crate::round::{CREATE_CONCURRENCY, RESTART_QUIET, Restart, Round};
use anyhow::Result;
use std::fmt::Write;

/// What reproduces a run: the commit, the machine, the command.
pub(crate) struct Header {
    commit: String,
    machine: String,
    command: String,
}

fn run(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .current_dir(capt_tests::repo_root())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

impl Header {
    pub(crate) fn now() -> Result<Self> {
        let dirty = !run("git", &["status", "--porcelain"]).is_empty();
        let commit = format!(
            "{}{}",
            run("git", &["rev-parse", "--short", "HEAD"]),
            if dirty { "-dirty" } else { "" }
        );
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_owned())
            .unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_gib = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let machine = format!(
            "{cores} cores ({model}), {mem_gib:.0} GiB, {}; {}",
            std::env::consts::ARCH,
            run("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
        );
        // hack/bench.sh says how it was called; run directly, the arguments say it.
        let command = std::env::var("CAPT_BENCH_COMMAND").unwrap_or_else(|_| {
            std::env::args()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        });
        Ok(Self {
            commit,
            machine,
            command,
        })
    }

    pub(crate) fn text(&self) -> String {
        format!(
            "commit {}; machine: {}; command: `{}`",
            self.commit, self.machine, self.command
        )
    }
}

/// The `p` quantile of `sorted` (nearest rank).
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// p50 / p99 / max of `v`, in ms.
fn spread(v: &[f64]) -> String {
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    format!(
        "{:.1} / {:.1} / {:.1}",
        percentile(&sorted, 0.5),
        percentile(&sorted, 0.99),
        sorted.last().copied().unwrap_or(f64::NAN)
    )
}

fn per(n: u64, d: usize) -> String {
    if d == 0 {
        return "n/a".into();
    }
    format!("{:.2}", n as f64 / d as f64)
}

pub(crate) fn tables(rounds: &[Round], args: &Args, header: &Header, pod: Option<&Pod>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n{}\n", header.text());
    let mut sizes: Vec<usize> = rounds.iter().map(|r| r.clusters).collect();
    sizes.dedup();
    for n in sizes {
        let rs: Vec<&Round> = rounds.iter().filter(|r| r.clusters == n).collect();
        table(&mut out, &rs, n, args, header);
    }
    scaling(&mut out, rounds, header);
    if let Some(pod) = pod {
        differences(&mut out, rounds, pod, args);
    }
    out
}

fn table(out: &mut String, rs: &[&Round], n: usize, args: &Args, header: &Header) {
    let _ = writeln!(out, "\n### {n} clusters\n");
    let _ = writeln!(out, "{}\n", header.text());
    out.push_str("| measure |");
    for r in rs {
        let _ = write!(out, " {} |", r.mode.name());
    }
    out.push_str("\n| --- |");
    for _ in rs {
        out.push_str(" ---: |");
    }
    out.push('\n');
    let mut rows = Rows { out, rs };
    provisioning_rows(&mut rows, args);
    probe_rows(&mut rows);
    output_change_rows(&mut rows);
    process_rows(&mut rows);
    restart_rows(&mut rows);
    fail_over_rows(&mut rows);
    burst_row(&mut rows, args);
    writes_by_manager(out, rs);
    captcluster_changes(out, rs);
    reads_after_the_kill(out, rs);
}

/// The rows of one table, a cell per round.
struct Rows<'a> {
    out: &'a mut String,
    rs: &'a [&'a Round],
}

impl Rows<'_> {
    fn row(&mut self, label: &str, cell: &dyn Fn(&Round) -> String) {
        let _ = write!(self.out, "| {label} |");
        for r in self.rs {
            let _ = write!(self.out, " {} |", cell(r));
        }
        self.out.push('\n');
    }
}

/// Provisioning (time, writes, refusals, reconciles, rates) and the steady state after it.
fn provisioning_rows(rows: &mut Rows, args: &Args) {
    rows.row("provisioned in (s)", &|r| {
        if r.provisioned == r.clusters {
            format!("{:.1}", r.provisioned_in)
        } else {
            format!("only {} after {:.0}", r.provisioned, r.provisioned_in)
        }
    });
    rows.row("provisioning: status writes (all status managers)", &|r| {
        r.provisioning.status_writes().to_string()
    });
    rows.row(
        "provisioning: write requests refused (409 stale, and others), all status managers",
        &|r| {
            STATUS_MANAGERS
                .iter()
                .map(|m| r.provisioning.refused_of(m))
                .sum::<u64>()
                .to_string()
        },
    );
    rows.row("provisioning: reconciles", &|r| {
        format!("{:.0}", r.provisioning.reconciles)
    });
    rows.row("provisioning: intents/s (sent to the applier)", &|r| {
        rate(r, r.provisioning.intents)
    });
    rows.row(
        "provisioning: applies/s (the applier's PATCH requests)",
        &|r| rate(r, r.provisioning.applies),
    );
    rows.row("provisioning: status writes/s", &|r| {
        format!(
            "{:.1}",
            r.provisioning.status_writes() as f64 / r.provisioning.seconds
        )
    });
    let s = args.steady_seconds;
    rows.row(&format!("steady state {s} s: our writes"), &|r| {
        r.steady.controller_writes().to_string()
    });
    rows.row(&format!("steady state {s} s: writes by anyone"), &|r| {
        r.steady.all_writes().to_string()
    });
    rows.row(&format!("steady state {s} s: reconciles"), &|r| {
        format!("{:.0}", r.steady.reconciles)
    });
}

/// The probe stacks: each hop's latency from the Workspace to the Cluster, against the
/// floor, and the writes per stack.
fn probe_rows(rows: &mut Rows) {
    rows.row(
        "probe stacks made / missed (the time each was given) / in flight at once",
        &|r| {
            format!(
                "{} / {} ({} s) / {}",
                r.probes.made,
                r.probes.missed,
                r.step_timeout.as_secs(),
                r.probes.concurrency
            )
        },
    );
    rows.row(
        "**Workspace Ready with its output → Cluster endpoint** p50 / p99 / max (ms)",
        &|r| spread(&r.probes.ready_total_ms),
    );
    rows.row(
        "hop: Workspace Ready with its output → CAPTControlPlane endpoint and `status.ready` (ours) p50 / p99 / max (ms)",
        &|r| spread(&r.probes.ready_ours_ms),
    );
    rows.row(
        "hop, the floor (a direct writer, same round): Workspace Ready with its output → CAPTControlPlane endpoint and `status.ready` p50 / p99 / max (ms)",
        &|r| spread(&r.probes.floor_ms),
    );
    rows.row("floor stacks made / missed", &|r| {
        format!("{} / {}", r.probes.floor_made, r.probes.floor_missed)
    });
    rows.row(
        "floor's control planes: status copied from one of ours (bytes; 0: bare)",
        &|r| r.probes.floor_padding_bytes.to_string(),
    );
    rows.row("our hop / the floor's, p50 and p99", &|r| {
        let sorted = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v
        };
        let (ours, floor) = (sorted(&r.probes.ready_ours_ms), sorted(&r.probes.floor_ms));
        if ours.is_empty() || floor.is_empty() {
            return "n/a".into();
        }
        format!(
            "{:.2}× / {:.2}×",
            percentile(&ours, 0.5) / percentile(&floor, 0.5),
            percentile(&ours, 0.99) / percentile(&floor, 0.99)
        )
    });
    rows.row(
        "Workspace output (first seen, before Ready) → Cluster endpoint p50 / p99 / max (ms)",
        &|r| spread(&r.probes.total_ms),
    );
    rows.row(
        "hop: Workspace output → CAPTControlPlane endpoint (ours) p50 / p99 / max (ms)",
        &|r| spread(&r.probes.ours_ms),
    );
    rows.row(
        "hop: CAPTControlPlane endpoint → Cluster endpoint (core) p50 / p99 / max (ms)",
        &|r| spread(&r.probes.core_ms),
    );
    rows.row(
        "hop: Workspace output → CAPTControlPlane endpoint and `status.ready` (ours) p50 / p99 / max (ms)",
        &|r| spread(&r.probes.ours_ready_ms),
    );
    rows.row(
        "hop: CAPTControlPlane endpoint and `status.ready` → Cluster endpoint (core) p50 / p99 / max (ms)",
        &|r| spread(&r.probes.core_ready_ms),
    );
    for m in STATUS_MANAGERS.iter().chain(&["manager"]) {
        rows.row(&format!("writes per probe stack: `{m}`"), &|r| {
            per(r.probes.delta.writes_of(m), r.probes.made)
        });
    }
    rows.row(
        "while probing, the control plane's reconciles: wait from a wake to the start (`capt_reconcile_queue_duration_seconds`), count: mean / p50 / p99 (ms)",
        &|r| r.probes.delta.control_plane_waits.summary(),
    );
    rows.row(
        "while probing, the control plane's reconciles: duration, delivery to the applier included (`capt_reconcile_duration_seconds`), count: mean / p50 / p99 (ms)",
        &|r| r.probes.delta.control_plane_reconciles.summary(),
    );
    rows.row(
        "while probing, the applier's applies for `capt-captcontrolplane` (`status_applier_apply_duration_seconds`), count: mean / p50 / p99 (ms)",
        &|r| r.probes.delta.control_plane_applies.summary(),
    );
}

/// The output changes: made and missed, writes and reconciles per change, latency.
fn output_change_rows(rows: &mut Rows) {
    rows.row(
        "output changes made / missed (the time each was given)",
        &|r| {
            format!(
                "{} / {} ({} s)",
                r.changes.made,
                r.changes.missed,
                r.step_timeout.as_secs()
            )
        },
    );
    for m in STATUS_MANAGERS.iter().chain(&["manager"]) {
        rows.row(&format!("writes per output change: `{m}`"), &|r| {
            per(r.changes.delta.writes_of(m), r.changes.made)
        });
    }
    rows.row("reconciles per output change", &|r| {
        if r.changes.made == 0 {
            return "n/a".into();
        }
        format!("{:.2}", r.changes.delta.reconciles / r.changes.made as f64)
    });
    rows.row(
        "output change: Workspace output → CAPTControlPlane endpoint p50 / p99 / max (ms)",
        &|r| spread(&r.changes.ours_ms),
    );
}

/// Each process's peak memory and CPU over the round.
fn process_rows(rows: &mut Rows) {
    rows.row("controller peak RSS (MiB)", &|r| {
        format!("{:.1}", r.controller.peak_rss_mib)
    });
    rows.row("controller CPU (s)", &|r| {
        format!("{:.1}", r.controller.cpu_seconds)
    });
    rows.row("status-applier peak RSS (MiB)", &|r| match &r.applier {
        Some(a) => format!("{:.1}", a.peak_rss_mib),
        None => "n/a".into(),
    });
    rows.row("status-applier CPU (s)", &|r| match &r.applier {
        Some(a) => format!("{:.1}", a.cpu_seconds),
        None => "n/a".into(),
    });
}

/// The restart: times, reconciles, writes and reads, memory after it, the standby pods.
fn restart_rows(rows: &mut Rows) {
    rows.row("restart: kill → ready (s)", &|r| {
        format!("{:.2}", r.restart.ready_s)
    });
    rows.row("restart: kill → controller leads (s)", &|r| {
        format!("{:.2}", r.restart.leading_s)
    });
    rows.row(
        &format!(
            "restart: kill → initial queue done (reconciles still for {} s) (s)",
            RESTART_QUIET.as_secs()
        ),
        &|r| {
            r.restart
                .quiet_s
                .map_or("never".into(), |q| format!("{q:.1}"))
        },
    );
    rows.row("restart: reconciles", &|r| {
        format!("{:.0}", r.restart.reconciles)
    });
    rows.row("restart: the pod that leads afterwards", &|r| {
        r.restart.leader.clone()
    });
    rows.row("restart: our writes (capt-* managers)", &|r| {
        ours(&r.restart.writes).to_string()
    });
    rows.row(
        "restart: writes by the pods that do not lead (any object)",
        &|r| r.restart.writes_by_others.values().sum::<u64>().to_string(),
    );
    rows.row("restart: our write requests refused", &|r| {
        ours(&r.restart.refused).to_string()
    });
    rows.row(
        "restart: writes by anyone (the provider's 10 min polls included)",
        &|r| r.restart.writes.values().sum::<u64>().to_string(),
    );
    for (process, verb) in [
        ("capt-controller", "list"),
        ("capt-controller", "get"),
        ("capt-controller", "watch"),
        ("status-applier", "list"),
        ("status-applier", "get"),
        ("status-applier", "watch"),
    ] {
        rows.row(
            &format!("restart: {} requests by {process}", verb.to_uppercase()),
            &|r| {
                if process == "status-applier" && r.applier.is_none() {
                    return "n/a".into();
                }
                r.restart
                    .reads
                    .iter()
                    .filter(|((p, v, _), _)| p == process && v == verb)
                    .map(|(_, n)| n)
                    .sum::<u64>()
                    .to_string()
            },
        );
    }
    rows.row("after the restart: controller peak RSS (MiB)", &|r| {
        format!("{:.1}", r.restart.controller.peak_rss_mib)
    });
    rows.row("after the restart: status-applier peak RSS (MiB)", &|r| {
        r.restart
            .applier
            .map_or("n/a".into(), |a| format!("{:.1}", a.peak_rss_mib))
    });
    rows.row(
        "at rest: Lease writes per minute by each pod's controller",
        &|r| {
            if r.lease_writes_per_minute.is_empty() {
                return "n/a".into();
            }
            r.lease_writes_per_minute
                .iter()
                .map(|(pod, n)| format!("{pod} {n:.1}"))
                .collect::<Vec<_>>()
                .join("; ")
        },
    );
    rows.row(
        "standby pod: controller / status-applier peak RSS (MiB)",
        &|r| {
            if r.standby.is_empty() {
                return "n/a".into();
            }
            r.standby
                .iter()
                .map(|(p, stats)| format!("{p} {:.1}", stats.peak_rss_mib))
                .collect::<Vec<_>>()
                .join("; ")
        },
    );
}

/// The fail-over (the leading pod killed for good), when the round made one.
fn fail_over_rows(rows: &mut Rows) {
    let fail_over = |r: &Round, f: &dyn Fn(&Restart) -> String| match &r.fail_over {
        Some(x) => f(x),
        None => "n/a".into(),
    };
    rows.row(
        "fail-over (the leading pod killed for good): kill → ready (s)",
        &|r| fail_over(r, &|x| format!("{:.2}", x.ready_s)),
    );
    rows.row("fail-over: kill → a standby leads (s)", &|r| {
        fail_over(r, &|x| format!("{:.2} ({})", x.leading_s, x.leader))
    });
    rows.row(
        &format!(
            "fail-over: kill → initial queue done (reconciles still for {} s) (s)",
            RESTART_QUIET.as_secs()
        ),
        &|r| {
            fail_over(r, &|x| {
                x.quiet_s.map_or("never".into(), |q| format!("{q:.1}"))
            })
        },
    );
    rows.row("fail-over: reconciles", &|r| {
        fail_over(r, &|x| format!("{:.0}", x.reconciles))
    });
    rows.row("fail-over: our writes (capt-* managers)", &|r| {
        fail_over(r, &|x| ours(&x.writes).to_string())
    });
    rows.row(
        "fail-over: writes by the pods that do not lead (any object)",
        &|r| fail_over(r, &|x| x.writes_by_others.values().sum::<u64>().to_string()),
    );
}

/// The burst of intents on one object through the socket, when the round made one.
fn burst_row(rows: &mut Rows, args: &Args) {
    rows.row(
        &format!("burst of {} intents on one object: applies", args.burst),
        &|r| match &r.socket_burst {
            Some(b) => format!(
                "{} (the applier's count: {:.0}; answered over {:.1} ms, largest gap {:.1} ms)",
                b.delta.writes_of("capt-captcontrolplane"),
                b.delta.applies,
                b.spread_ms,
                b.largest_gap_ms
            ),
            None => "n/a".into(),
        },
    );
}

/// The writes by field manager in each phase, per round.
fn writes_by_manager(out: &mut String, rs: &[&Round]) {
    out.push_str("\nWrites by field manager in each phase (API server audit log):\n\n");
    for r in rs {
        let phases = [
            ("provisioning", Some(&r.provisioning.writes)),
            ("steady", Some(&r.steady.writes)),
            ("probe stacks", Some(&r.probes.delta.writes)),
            ("output changes", Some(&r.changes.delta.writes)),
            ("restart", Some(&r.restart.writes)),
            ("burst", r.socket_burst.as_ref().map(|b| &b.delta.writes)),
            ("fail-over", r.fail_over.as_ref().map(|x| &x.writes)),
        ];
        for (phase, writes) in phases {
            let Some(writes) = writes else { continue };
            let list: Vec<String> = writes.iter().map(|(m, n)| format!("{m} {n}")).collect();
            let _ = writeln!(
                out,
                "- {} / {phase}: {}",
                r.mode.name(),
                if list.is_empty() {
                    "none".to_owned()
                } else {
                    list.join(", ")
                }
            );
        }
    }
}

/// The CAPTClusters' status changes by what changed, per round and phase.
fn captcluster_changes(out: &mut String, rs: &[&Round]) {
    out.push_str(
        "\nCAPTCluster status changes by what changed (a watch of the round's CAPTClusters; a \
         write that changes nothing makes no new version, so it shows in the writes and not \
         here):\n\n",
    );
    for r in rs {
        for (phase, changes) in &r.captcluster_changes {
            let delta = match *phase {
                "provisioning" => &r.provisioning,
                _ => &r.probes.delta,
            };
            let (writes, refused) = (
                delta.writes_of("capt-captcluster"),
                delta.refused_of("capt-captcluster"),
            );
            let list: Vec<String> = changes.iter().map(|(w, n)| format!("{n}× {w}")).collect();
            let _ = writeln!(
                out,
                "- {} / {phase}: {} changes, {writes} `capt-captcluster` writes (and {refused} \
                 requests refused): {}",
                r.mode.name(),
                changes.values().sum::<u64>(),
                if list.is_empty() {
                    "none".to_owned()
                } else {
                    list.join("; ")
                }
            );
        }
    }
}

/// The reads from the kill to the end of the restart phase, per round.
fn reads_after_the_kill(out: &mut String, rs: &[&Round]) {
    out.push_str(
        "\nReads from the kill to the end of the restart phase, by process (the token's id in \
         the audit log), verb and resource:\n\n",
    );
    for r in rs {
        let list: Vec<String> = r
            .restart
            .reads
            .iter()
            .map(|((p, v, res), n)| format!("{p} {} {res} {n}", v.to_uppercase()))
            .collect();
        let _ = writeln!(out, "- {}: {}", r.mode.name(), list.join(", "));
    }
}

fn rate(r: &Round, count: f64) -> String {
    match r.applier {
        Some(_) => format!("{:.1}", count / r.provisioning.seconds),
        None => "n/a".into(),
    }
}

/// Peak RSS per N, and the slope per cluster between consecutive N, per mode and process.
fn scaling(out: &mut String, rounds: &[Round], header: &Header) {
    let mut modes: Vec<_> = rounds.iter().map(|r| r.mode).collect();
    modes.dedup();
    let _ = writeln!(
        out,
        "\n### Memory against the number of clusters\n\n{}\n",
        header.text()
    );
    out.push_str(
        "| mode | clusters | controller peak RSS (MiB) | slope (KiB per cluster) | \
         status-applier peak RSS (MiB) | slope (KiB per cluster) |\n\
         | --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for mode in modes {
        let rs: Vec<&Round> = rounds.iter().filter(|r| r.mode == mode).collect();
        for (i, r) in rs.iter().enumerate() {
            let slope = |now: f64, before: Option<f64>| match (i, before) {
                (0, _) | (_, None) => "—".to_owned(),
                (_, Some(b)) => format!(
                    "{:.1}",
                    (now - b) * 1024.0 / (r.clusters as f64 - rs[i - 1].clusters as f64)
                ),
            };
            let prev = i.checked_sub(1).map(|j| rs[j]);
            let applier = r.applier.map(|a| a.peak_rss_mib);
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} | {} | {} | {} |",
                mode.name(),
                r.clusters,
                r.controller.peak_rss_mib,
                slope(
                    r.controller.peak_rss_mib,
                    prev.map(|p| p.controller.peak_rss_mib)
                ),
                applier.map_or("n/a".into(), |a| format!("{a:.1}")),
                match applier {
                    Some(a) => slope(a, prev.and_then(|p| p.applier.map(|x| x.peak_rss_mib))),
                    None => "n/a".into(),
                },
            );
        }
    }
}

/// Every known difference between these rounds and the system in production.
fn differences(out: &mut String, rounds: &[Round], pod: &Pod, args: &Args) {
    out.push_str("\n### Differences from production\n\n");
    let mut lines = vec![
        format!(
            "The pod's containers run as processes on this machine, with the command and environment of \
             `{DEPLOYMENT}` (read at run time), the release binaries instead of the image, and no \
             container: no cgroup limits (the Deployment asks `status-applier` {} and `manager` {}), \
             not user 65532, no read-only root filesystem, no seccomp profile.",
            pod.resources(crate::deployed::APPLIER).unwrap_or_default(),
            pod.resources(crate::deployed::MANAGER).unwrap_or_default()
        ),
        format!(
            "{} replicas, as the Deployment ships them (the baseline: one), with leader election \
             (the `capt-controller` Lease in {}): the first pod leads, the others stand by, \
             started as the first is below but for the pod's name, local paths and ports. A \
             restart keeps the pod's name (a container restarted in its pod); the fail-over, after \
             it, kills the leading pod for good and no new pod replaces it.",
            pod.replicas, pod.namespace
        ),
        "Both processes reach the API server (on 127.0.0.1: no network) with a kubeconfig holding a \
         token of the pod's ServiceAccount from the TokenRequest API (one token per process, so that \
         the audit log tells them apart), instead of the projected token and the in-cluster config; \
         the rights are the shipped RBAC's (`manifests/deploy/rbac.yaml`)."
            .into(),
        "Metrics are scraped over HTTPS with a ServiceAccount token bound to \
         `capt-controller-metrics-reader` (TokenReview + SubjectAccessReview per scrape), as \
         deployed; the scrapes are more frequent than a Prometheus's while phases wait."
            .into(),
        "The baseline (upstream CAPT's write pattern, `tests/src/bin/bench-system/upstream.rs`) \
         runs as a ServiceAccount bound to `cluster-admin` (it PUTs whole statuses, which the \
         shipped RBAC does not allow), one process, no leader election. The floor is a task of \
         the benchmark process itself, as the environment's administrator."
            .into(),
        "The API server (`hack/testenv.sh`): etcd runs with `--unsafe-no-fsync` (one member, no \
         fsync: writes are cheaper than on a real etcd); API Priority and Fairness is off \
         (`--enable-priority-and-fairness=false`: no per-flow queueing or limits); the \
         ServiceAccount admission plugin is off; every request but those on Events and Leases is \
         audited at Metadata level (the API server writes a log line per request, reads included); \
         kube-controller-manager runs only its garbage collector and namespace controllers. Each \
         round runs on a fresh API server."
            .into(),
        format!(
            "Cluster API core v1.14 runs as one manager process with `--leader-elect=false`, \
             plain-HTTP diagnostics, its webhooks on 127.0.0.1{}.",
            match std::env::var("CAPT_TESTENV_CORE_QPS") {
                Ok(qps) => format!(
                    ", and its client rate limit raised to {qps} requests/s (its default is 20, \
                     bursts of 30: provisioning 1,000 stacks at once would wait on core alone)"
                ),
                Err(_) => String::new(),
            }
        ),
        format!(
            "provider-terraform is the fake provider of `tests/src/fake_provider/`, which plays \
             v0.18.0's reconciler with its defaults (a 10 min poll, backoff from 1 s){}, each \
             apply taking {} ms instead of a Terraform run; it runs as the environment's \
             administrator.",
            match args.provider_max_reconcile_rate {
                1 => " and `--max-reconcile-rate 1` (one Workspace at a time)".to_owned(),
                r => format!(
                    " but `--max-reconcile-rate {r}` ({r} Workspaces at a time; the default is 1)"
                ),
            },
            args.provider_delay_ms
        ),
        format!(
            "The API server, etcd, core, the provider, the benchmark and both processes share the \
             machine's cores (with other engineers' builds). Stacks are created {CREATE_CONCURRENCY} \
             at a time."
        ),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for r in rounds {
        for l in &r.launches {
            for c in &l.changes {
                if seen.insert(c.clone()) {
                    lines.push(c.clone());
                }
            }
            let mut command = vec![
                l.program
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ];
            command.extend(l.args.iter().map(|a| {
                if a.starts_with('/') {
                    "<local path>".to_owned()
                } else {
                    a.clone()
                }
            }));
            let env = format!(
                "`{}` runs `{}` with only this environment: {}",
                l.container,
                command.join(" "),
                redact(&env_summary(l))
            );
            if seen.insert(env.clone()) {
                lines.push(env);
            }
        }
    }
    for l in lines {
        let _ = writeln!(out, "- {l}");
    }
}

/// Local paths and ports left out, so that rounds say the same thing.
fn redact(env: &str) -> String {
    env.split(' ')
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) if v.starts_with('/') => format!("{k}=<local path>"),
            Some((k, v)) if v.starts_with("127.0.0.1:") => format!("{k}=127.0.0.1:<free port>"),
            Some((k, v)) if k == "POD_NAME" => {
                format!("{k}={}", v.trim_end_matches(char::is_numeric))
            }
            _ => kv.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}
