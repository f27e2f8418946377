//! The results as Markdown tables, one per number of stacks with a column per mode, and
//! the writes by field manager in each phase.

use crate::Args;
use crate::Mode;
use crate::probe::STATUS_MANAGERS;
use crate::round::Round;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub(crate) fn tables(rounds: &[Round], args: &Args) -> String {
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
