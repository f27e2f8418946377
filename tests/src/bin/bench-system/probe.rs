//! What measures a round: snapshots of the counters, the writes between two of them (from
//! the API server's audit log), waiting for writes to settle, and the processes' peak RSS
//! and CPU time.

use crate::Mode;
use anyhow::{Context, Result, bail};
use capt_tests::applier::metric_value;
use capt_tests::system::System;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, Read, Seek};
use std::time::{Duration, Instant};

/// The field managers that write status and endpoints: the rows of the per-change table.
pub(crate) const STATUS_MANAGERS: [&str; 4] = [
    "capt-captcluster",
    "capt-captcontrolplane",
    "capt-cluster",
    "capt-workspacetemplateapply",
];

/// Counters at one moment.
#[derive(Clone)]
pub(crate) struct Snapshot {
    pub(crate) at: Instant,
    audit_offset: u64,
    reconciles: f64,
    intents: f64,
    applies: f64,
}

/// What happened between two snapshots.
#[derive(Default)]
pub(crate) struct Delta {
    pub(crate) seconds: f64,
    /// API writes by field manager (from the audit log), of this round's objects only.
    pub(crate) writes: BTreeMap<String, u64>,
    pub(crate) reconciles: f64,
    pub(crate) intents: f64,
    pub(crate) applies: f64,
}

impl Delta {
    pub(crate) fn status_writes(&self) -> u64 {
        STATUS_MANAGERS
            .iter()
            .map(|m| self.writes.get(*m).copied().unwrap_or(0))
            .sum()
    }

    pub(crate) fn controller_writes(&self) -> u64 {
        self.writes
            .iter()
            .filter(|(m, _)| m.starts_with("capt-"))
            .map(|(_, n)| n)
            .sum()
    }
}

/// Peak RSS and CPU time of a process.
pub(crate) struct ProcessStats {
    pub(crate) peak_rss_mib: f64,
    pub(crate) cpu_seconds: f64,
}

/// What measures a round: its namespace (and the Workspaces named after it), its processes
/// and the audit log.
pub(crate) struct Probe<'a> {
    pub(crate) mode: Mode,
    pub(crate) ns: &'a str,
    pub(crate) audit: &'a std::path::Path,
}

impl Probe<'_> {
    pub(crate) async fn snapshot(&self, system: &System) -> Result<Snapshot> {
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
    pub(crate) fn delta(&self, from: &Snapshot, to: &Snapshot) -> Result<Delta> {
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

pub(crate) fn process_stats(pid: u32) -> Result<ProcessStats> {
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
pub(crate) async fn settle(
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
