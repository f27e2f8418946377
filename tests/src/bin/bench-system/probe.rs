//! What measures a round: snapshots of the counters (scraped from the processes' metrics
//! listeners over HTTPS, as an authorized scraper does), the writes and reads between two of
//! them (from the API server's audit log), waiting for writes to settle, and the processes'
//! peak RSS and CPU time.

use crate::stacks::BENCH_MANAGER;
use crate::system::BenchSystem;
use anyhow::{Context, Result, bail};
use capt_tests::applier::metric_value;
use capt_tests::audit_log::is_write;
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

/// The sum of our managers' counts (`capt-*`, but the benchmark's own `capt-bench`).
pub(crate) fn ours(by_manager: &BTreeMap<String, u64>) -> u64 {
    by_manager
        .iter()
        .filter(|(m, _)| m.starts_with("capt-") && *m != BENCH_MANAGER)
        .map(|(_, n)| n)
        .sum()
}

/// Where the audit log says who sent a request with a ServiceAccount token.
pub(crate) const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// Counters at one moment.
#[derive(Clone)]
pub(crate) struct Snapshot {
    pub(crate) at: Instant,
    pub(crate) audit_offset: u64,
    reconciles: f64,
    intents: f64,
    applies: f64,
    /// The control plane's reconciles: waits from a wake to the start, and their durations.
    control_plane_waits: Histogram,
    control_plane_reconciles: Histogram,
    /// The status-applier's applies under the control plane's manager.
    control_plane_applies: Histogram,
}

/// A Prometheus histogram as scraped: cumulative counts by upper bound (seconds), and the
/// sum of what was observed.
#[derive(Clone, Default)]
pub(crate) struct Histogram {
    buckets: Vec<(f64, f64)>,
    sum: f64,
}

impl Histogram {
    /// The samples of `name` (a histogram family, without `_bucket`) carrying `label`.
    fn scrape(text: &str, name: &str, label: &str) -> Self {
        let value = |l: &str| l.rsplit(' ').next()?.parse::<f64>().ok();
        let mut h = Self::default();
        for line in text.lines().filter(|l| l.contains(label)) {
            if let Some(rest) = line.strip_prefix(&format!("{name}_bucket{{")) {
                let le = rest
                    .split("le=\"")
                    .nth(1)
                    .and_then(|s| s.split('"').next())
                    .map(|s| s.parse::<f64>().unwrap_or(f64::INFINITY));
                if let (Some(le), Some(v)) = (le, value(line)) {
                    h.buckets.push((le, v));
                }
            } else if line.starts_with(&format!("{name}_sum{{")) {
                h.sum = value(line).unwrap_or(0.0);
            }
        }
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        h
    }

    /// What was observed after `earlier` and up to this one.
    fn since(&self, earlier: &Self) -> Self {
        let before = |le: f64| {
            earlier
                .buckets
                .iter()
                .find(|(l, _)| *l == le)
                .map_or(0.0, |(_, v)| *v)
        };
        Self {
            buckets: self
                .buckets
                .iter()
                .map(|&(le, v)| (le, v - before(le)))
                .collect(),
            sum: self.sum - earlier.sum,
        }
    }

    fn count(&self) -> f64 {
        self.buckets.last().map_or(0.0, |(_, v)| *v)
    }

    /// Observations, mean, p50 and p99 in ms: a quantile interpolated in its bucket as
    /// Prometheus's `histogram_quantile` does, so no finer than the buckets (×2 apart).
    pub(crate) fn summary(&self) -> String {
        let count = self.count();
        if count == 0.0 {
            return "none".into();
        }
        let quantile = |q: f64| {
            let rank = q * count;
            let mut lower = (0.0, 0.0);
            for &(le, v) in &self.buckets {
                if v >= rank {
                    if le.is_infinite() {
                        return lower.0;
                    }
                    let within = (rank - lower.1) / (v - lower.1).max(f64::MIN_POSITIVE);
                    return lower.0 + (le - lower.0) * within;
                }
                lower = (le, v);
            }
            lower.0
        };
        format!(
            "{count:.0}: {:.1} / {:.1} / {:.1}",
            self.sum / count * 1e3,
            quantile(0.5) * 1e3,
            quantile(0.99) * 1e3
        )
    }
}

/// What happened between two snapshots.
#[derive(Default)]
pub(crate) struct Delta {
    pub(crate) seconds: f64,
    /// API writes by field manager (from the audit log), of this round's objects only: the
    /// requests the API server carried out (2xx).
    pub(crate) writes: BTreeMap<String, u64>,
    /// Write requests the API server refused (409 and the rest), by field manager: they
    /// wrote nothing.
    pub(crate) refused: BTreeMap<String, u64>,
    pub(crate) reconciles: f64,
    pub(crate) intents: f64,
    pub(crate) applies: f64,
    pub(crate) control_plane_waits: Histogram,
    pub(crate) control_plane_reconciles: Histogram,
    pub(crate) control_plane_applies: Histogram,
}

impl Delta {
    pub(crate) fn status_writes(&self) -> u64 {
        STATUS_MANAGERS
            .iter()
            .map(|m| self.writes.get(*m).copied().unwrap_or(0))
            .sum()
    }

    pub(crate) fn controller_writes(&self) -> u64 {
        ours(&self.writes)
    }

    pub(crate) fn all_writes(&self) -> u64 {
        self.writes.values().sum()
    }

    pub(crate) fn writes_of(&self, manager: &str) -> u64 {
        self.writes.get(manager).copied().unwrap_or(0)
    }

    pub(crate) fn refused_of(&self, manager: &str) -> u64 {
        self.refused.get(manager).copied().unwrap_or(0)
    }
}

/// The write requests to a round's objects between two audit offsets, by field manager.
#[derive(Default)]
pub(crate) struct Writes {
    /// Carried out (2xx).
    pub(crate) made: BTreeMap<String, u64>,
    /// Refused (any other code): nothing was written.
    pub(crate) refused: BTreeMap<String, u64>,
}

/// Peak and current RSS and CPU time of a process.
#[derive(Clone, Copy)]
pub(crate) struct ProcessStats {
    pub(crate) peak_rss_mib: f64,
    /// Resident now (`VmRSS`): what a process kept, where the peak says what it once needed.
    pub(crate) rss_mib: f64,
    pub(crate) cpu_seconds: f64,
}

/// What measures a round: its namespace (and the Workspaces named after it) and the audit
/// log.
pub(crate) struct Probe<'a> {
    pub(crate) mode: crate::Mode,
    pub(crate) ns: &'a str,
    pub(crate) audit: &'a std::path::Path,
}

impl Probe<'_> {
    pub(crate) async fn snapshot(&self, system: &BenchSystem) -> Result<Snapshot> {
        let audit_offset = self.audit_end()?;
        let controller = system.controller_metrics().await?;
        let reconciles = metric_value(&controller, "capt_reconciles_total", &[])?;
        let control_plane = "kind=\"CAPTControlPlane\"";
        let (intents, applies, control_plane_applies) = match system.applier_metrics().await? {
            Some(text) => (
                metric_value(&text, "status_applier_intents_total", &[])?,
                metric_value(&text, "status_applier_api_writes_total", &[])?,
                Histogram::scrape(
                    &text,
                    "status_applier_apply_duration_seconds",
                    "manager=\"capt-captcontrolplane\"",
                ),
            ),
            None => (0.0, 0.0, Histogram::default()),
        };
        Ok(Snapshot {
            at: Instant::now(),
            audit_offset,
            reconciles,
            intents,
            applies,
            control_plane_waits: Histogram::scrape(
                &controller,
                "capt_reconcile_queue_duration_seconds",
                control_plane,
            ),
            control_plane_reconciles: Histogram::scrape(
                &controller,
                "capt_reconcile_duration_seconds",
                control_plane,
            ),
            control_plane_applies,
        })
    }

    /// The end of the audit log's last whole line.
    pub(crate) fn audit_end(&self) -> Result<u64> {
        let mut file = std::fs::File::open(self.audit)?;
        let len = file.metadata()?.len();
        let back = len.min(1 << 20);
        file.seek(std::io::SeekFrom::Start(len - back))?;
        let mut tail = Vec::with_capacity(back as usize);
        file.take(back).read_to_end(&mut tail)?;
        Ok(match tail.iter().rposition(|b| *b == b'\n') {
            Some(i) => len - back + i as u64 + 1,
            None => len - back,
        })
    }

    /// The audit events between two offsets.
    pub(crate) fn events(&self, from: u64, to: u64) -> Result<Vec<Value>> {
        if to < from {
            bail!(
                "the audit log {} was rotated during a phase",
                self.audit.display()
            );
        }
        let mut file = std::fs::File::open(self.audit)?;
        file.seek(std::io::SeekFrom::Start(from))?;
        let reader = std::io::BufReader::new(file.take(to - from));
        let mut events = Vec::new();
        for line in reader.lines() {
            if let Ok(event) = serde_json::from_str(&line?) {
                events.push(event);
            }
        }
        Ok(events)
    }

    /// The writes made to this round's objects between two audit offsets, by field manager.
    pub(crate) fn writes(&self, from: u64, to: u64) -> Result<BTreeMap<String, u64>> {
        Ok(self.write_requests(from, to)?.made)
    }

    /// The write requests to this round's objects between two audit offsets: made and
    /// refused, by field manager.
    pub(crate) fn write_requests(&self, from: u64, to: u64) -> Result<Writes> {
        let mut writes = Writes::default();
        for event in self.events(from, to)? {
            if let Some(manager) = self.write_of_round(&event) {
                let code = event["responseStatus"]["code"].as_u64().unwrap_or(0);
                let counts = if (200..300).contains(&code) {
                    &mut writes.made
                } else {
                    &mut writes.refused
                };
                *counts.entry(manager).or_default() += 1;
            }
        }
        Ok(writes)
    }

    /// The writes between two snapshots, with the counters' differences.
    pub(crate) fn delta(&self, from: &Snapshot, to: &Snapshot) -> Result<Delta> {
        let writes = self.write_requests(from.audit_offset, to.audit_offset)?;
        Ok(Delta {
            seconds: (to.at - from.at).as_secs_f64(),
            writes: writes.made,
            refused: writes.refused,
            reconciles: to.reconciles - from.reconciles,
            intents: to.intents - from.intents,
            applies: to.applies - from.applies,
            control_plane_waits: to.control_plane_waits.since(&from.control_plane_waits),
            control_plane_reconciles: to
                .control_plane_reconciles
                .since(&from.control_plane_reconciles),
            control_plane_applies: to.control_plane_applies.since(&from.control_plane_applies),
        })
    }

    /// The reads (`get`, `list`, and `watch` as the response starts) each of `who` (name,
    /// credential id) sent between two offsets, whatever the object: by (name, verb,
    /// resource).
    pub(crate) fn reads_by(
        &self,
        from: u64,
        to: u64,
        who: &[(&str, &str)],
    ) -> Result<BTreeMap<(String, String, String), u64>> {
        let mut reads = BTreeMap::new();
        for event in self.events(from, to)? {
            let verb = event["verb"].as_str().unwrap_or("");
            let counted = match verb {
                "get" | "list" => event["stage"] == "ResponseComplete",
                "watch" => event["stage"] == "ResponseStarted",
                _ => false,
            };
            if !counted {
                continue;
            }
            let id = event["user"]["extra"][CREDENTIAL_ID][0]
                .as_str()
                .unwrap_or("");
            let Some((name, _)) = who.iter().find(|(_, cid)| *cid == id) else {
                continue;
            };
            let o = &event["objectRef"];
            let resource = match o["subresource"].as_str() {
                Some(sub) => format!("{}/{sub}", o["resource"].as_str().unwrap_or("")),
                None => o["resource"]
                    .as_str()
                    .map(str::to_owned)
                    .or_else(|| event["requestURI"].as_str().map(str::to_owned))
                    .unwrap_or_default(),
            };
            *reads
                .entry(((*name).to_owned(), verb.to_owned(), resource))
                .or_default() += 1;
        }
        Ok(reads)
    }

    /// The writes (carried out) of any object each of `who` (name, credential id) sent
    /// between two offsets, by name: Leases and Events are not in the audit log.
    pub(crate) fn writes_by(
        &self,
        from: u64,
        to: u64,
        who: &[(&str, &str)],
    ) -> Result<BTreeMap<String, u64>> {
        let mut writes = BTreeMap::new();
        for event in self.events(from, to)? {
            let code = event["responseStatus"]["code"].as_u64().unwrap_or(0);
            if !event["verb"].as_str().is_some_and(is_write)
                || event["stage"] != "ResponseComplete"
                || !(200..300).contains(&code)
            {
                continue;
            }
            let id = event["user"]["extra"][CREDENTIAL_ID][0]
                .as_str()
                .unwrap_or("");
            if let Some((name, _)) = who.iter().find(|(_, cid)| *cid == id) {
                *writes.entry((*name).to_owned()).or_default() += 1;
            }
        }
        Ok(writes)
    }

    /// The field manager of an audited write to one of this round's objects.
    fn write_of_round(&self, event: &Value) -> Option<String> {
        if !event["verb"].as_str().is_some_and(is_write) {
            return None;
        }
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
                // Without one, the API server names the manager after the user agent's
                // program (Cluster API core's is `manager`), as managedFields show.
                let agent = event["userAgent"].as_str().unwrap_or("unknown");
                agent.split('/').next().unwrap_or(agent).to_owned()
            });
        Some(manager)
    }

    /// Waits until the round's objects see no write by our managers for `quiet` (read from
    /// the audit log alone), for at most `limit`. True when they went quiet.
    pub(crate) async fn quiet(&self, quiet: Duration, limit: Duration) -> Result<bool> {
        let started = Instant::now();
        let mut last = self.audit_end()?;
        loop {
            tokio::time::sleep(quiet).await;
            let now = self.audit_end()?;
            let writes = self.writes(last, now)?;
            if ours(&writes) == 0 {
                return Ok(true);
            }
            if started.elapsed() > limit {
                return Ok(false);
            }
            last = now;
        }
    }
}

pub(crate) fn process_stats(pid: u32) -> Result<ProcessStats> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |field: &str| -> Result<f64> {
        Ok(status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next())
            .with_context(|| field.to_owned())?
            .parse()?)
    };
    let hwm_kib = kib("VmHWM:")?;
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
        rss_mib: kib("VmRSS:")? / 1024.0,
        cpu_seconds: ticks / hz,
    })
}

#[cfg(test)]
mod tests {
    use super::Histogram;

    const FAMILY: &str = "capt_reconcile_queue_duration_seconds";

    fn text(counts: [u64; 3], sum: f64) -> String {
        let [a, b, c] = counts;
        format!(
            "{FAMILY}_sum{{kind=\"CAPTControlPlane\"}} {sum}\n\
             {FAMILY}_count{{kind=\"CAPTControlPlane\"}} {c}\n\
             {FAMILY}_bucket{{le=\"0.001\",kind=\"CAPTControlPlane\"}} {a}\n\
             {FAMILY}_bucket{{le=\"0.002\",kind=\"CAPTControlPlane\"}} {b}\n\
             {FAMILY}_bucket{{le=\"+Inf\",kind=\"CAPTControlPlane\"}} {c}\n\
             {FAMILY}_bucket{{le=\"0.001\",kind=\"CAPTCluster\"}} 100\n"
        )
    }

    #[test]
    fn a_phase_is_summed_from_its_own_observations_and_interpolated_in_buckets() {
        let kind = "kind=\"CAPTControlPlane\"";
        let before = Histogram::scrape(&text([10, 10, 10], 0.005), FAMILY, kind);
        // Between the two: 10 in (1, 2] ms, 6.0 ms in all (0.6 ms mean).
        let after = Histogram::scrape(&text([10, 20, 20], 0.011), FAMILY, kind);
        let phase = after.since(&before);
        // p50 is the 5th of 10 in (1, 2]: 1.5 ms; p99 the 9.9th: 1.99 ms.
        assert_eq!(phase.summary(), "10: 0.6 / 1.5 / 2.0");
        assert_eq!(Histogram::default().summary(), "none");
    }
}
