//! Noisy neighbour (`--noisy-neighbour`): one tenant's load against another tenant's wait.
//!
//! The system as deployed; tenant B (namespace `noisy-b`) creates one new
//! WorkspaceTemplateApply a second, `--noisy-probes` of them, and its time to a rendered
//! Workspace is measured from the create's answer to the Workspace's first watch event.
//! Four phases, in one run on one API server:
//! 1. **alone**: B only (the baseline the others are compared with);
//! 2. **flood**: tenant A (`noisy-a`) creates `--noisy-flood` applies at once, as B goes on;
//! 3. **waits**: A's `--noisy-waits` applies each wait for the most Secrets the CRD allows
//!    (`MAX_WAITS`), the last of which does not exist, so each is looked at again every poll
//!    interval for as long as the run lasts, as B goes on;
//! 4. **restart**: the leading pod's two processes killed and started again with all of A's
//!    objects there, then B again.
//!
//! The target: B's p99 in each phase within 2x of B's p99 alone. Peak RSS of both processes
//! against their Deployment limits, before and after the restart. No provider runs: what is
//! measured is the controller's share of work, up to the rendered Workspace.

use crate::deployed::Pod;
use crate::probe::process_stats;
use crate::round::create_namespace;
use crate::stacks::{bench_creates, create_templates, resource};
use crate::system::BenchSystem;
use crate::{Args, Mode};
use anyhow::{Context, Result};
use capt_controller::api::bounds::MAX_WAITS;
use capt_controller::render::{APPLY_NAME_LABEL, APPLY_NAMESPACE_LABEL};
use capt_tests::fake_provider::workspace_resource;
use capt_tests::{eks_name, env};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TENANT_A: &str = "noisy-a";
const TENANT_B: &str = "noisy-b";
/// How long one of B's applies may take to get its Workspace before it counts as missed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(120);

/// One phase's numbers: B's times to a rendered Workspace.
pub(crate) struct Phase {
    pub(crate) name: &'static str,
    pub(crate) times: Times,
    pub(crate) missed: usize,
}

/// Seconds, sorted.
pub(crate) struct Times(Vec<f64>);

impl Times {
    fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        Self(v)
    }
    fn p50(&self) -> f64 {
        crate::tables::percentile(&self.0, 0.5)
    }
    fn p99(&self) -> f64 {
        crate::tables::percentile(&self.0, 0.99)
    }
    fn max(&self) -> f64 {
        self.0.last().copied().unwrap_or(f64::NAN)
    }
    fn summary(&self) -> String {
        format!(
            "{} rendered, p50 {:.3} s, p99 {:.3} s, max {:.3} s",
            self.0.len(),
            self.p50(),
            self.p99(),
            self.max()
        )
    }
}

/// A noisy-neighbour run.
pub(crate) struct Noisy {
    pub(crate) phases: Vec<Phase>,
    /// Peak RSS (MiB) before the restart, after it, and the Deployment's limits: controller,
    /// status-applier.
    pub(crate) peaks: [(f64, f64); 2],
    pub(crate) limits: (f64, f64),
    pub(crate) flood: usize,
    pub(crate) waits: usize,
}

/// When each of B's Workspaces was first seen, by its apply's name.
#[derive(Default)]
struct Rendered(Mutex<HashMap<String, Instant>>);

impl Rendered {
    /// Watches the Workspaces rendered for tenant B's applies.
    fn start(client: &kube::Client) -> Arc<Self> {
        let seen = Arc::new(Self::default());
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &workspace_resource());
        let config =
            watcher::Config::default().labels(&format!("{APPLY_NAMESPACE_LABEL}={TENANT_B}"));
        let s = seen.clone();
        tokio::spawn(async move {
            let mut events =
                std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
            while let Some(ws) = events.next().await {
                let Ok(ws) = ws else { continue };
                if let Some(apply) = ws
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(APPLY_NAME_LABEL))
                {
                    s.0.lock()
                        .unwrap()
                        .entry(apply.clone())
                        .or_insert_with(Instant::now);
                }
            }
        });
        seen
    }

    fn at(&self, apply: &str) -> Option<Instant> {
        self.0.lock().unwrap().get(apply).copied()
    }
}

fn applies(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &resource("infrastructure.cluster.x-k8s.io", "WorkspaceTemplateApply"),
    )
}

/// An apply of the sample `vpc` template in `templates`, named `name`, waiting for `secrets`.
/// Its `CLUSTER_NAME` carries its namespace, as a hand-written apply's must: the two tenants
/// use the same names, and a bare one another namespace's older apply holds is refused.
fn apply_body(name: &str, templates: &str, secrets: &[String], ns: &str) -> Result<DynamicObject> {
    let waits: Vec<_> = secrets
        .iter()
        .map(|s| json!({"name": s, "namespace": ns}))
        .collect();
    let mut spec = json!({
        "templateRef": {"name": "vpc", "namespace": templates},
        "variables": {"CLUSTER_NAME": eks_name(ns, name), "REGION": "ap-northeast-1"},
    });
    if !waits.is_empty() {
        spec["waitForSecrets"] = json!(waits);
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
        "kind": "WorkspaceTemplateApply",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))?)
}

/// B creates `probes` applies, one a second, each waited for (up to [`PROBE_TIMEOUT`]) in
/// the background; returns B's times once every one is rendered or missed.
async fn tenant_b(
    client: &kube::Client,
    rendered: &Arc<Rendered>,
    templates: &str,
    phase: &'static str,
    probes: usize,
) -> Result<Phase> {
    let api = applies(client, TENANT_B);
    let mut waits = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    for i in 0..probes {
        tick.tick().await;
        let name = format!("{phase}-{i}");
        api.create(
            &bench_creates(),
            &apply_body(&name, templates, &[], TENANT_B)?,
        )
        .await
        .with_context(|| format!("creating {TENANT_B}/{name}"))?;
        let created = Instant::now();
        let rendered = rendered.clone();
        waits.push(tokio::spawn(async move {
            let deadline = created + PROBE_TIMEOUT;
            loop {
                if let Some(at) = rendered.at(&name) {
                    return Some(at.saturating_duration_since(created));
                }
                if Instant::now() > deadline {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    let mut times = Vec::new();
    let mut missed = 0;
    for w in waits {
        match w.await? {
            Some(d) => times.push(d.as_secs_f64()),
            None => missed += 1,
        }
    }
    let times = Times::of(times);
    eprintln!("[noisy] {phase}: B {} ({missed} missed)", times.summary());
    Ok(Phase {
        name: phase,
        times,
        missed,
    })
}

/// A creates `n` applies at once (64 requests in flight), each waiting for `secrets`.
async fn tenant_a(
    client: &kube::Client,
    templates: &str,
    prefix: &str,
    n: usize,
    secrets: Vec<String>,
) -> Result<()> {
    let api = applies(client, TENANT_A);
    futures::stream::iter(0..n)
        .map(|i| {
            let (api, secrets) = (api.clone(), secrets.clone());
            async move {
                let name = format!("{prefix}-{i}");
                api.create(
                    &bench_creates(),
                    &apply_body(&name, templates, &secrets, TENANT_A)?,
                )
                .await
                .with_context(|| format!("creating {TENANT_A}/{name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// The Secrets A's waiting applies name: all but the last exist.
async fn waited_secrets(client: &kube::Client) -> Result<Vec<String>> {
    let api: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), TENANT_A);
    let names: Vec<String> = (0..MAX_WAITS).map(|i| format!("waited-{i}")).collect();
    for name in &names[..MAX_WAITS - 1] {
        let secret =
            serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"k": "v"}}))?;
        api.create(&bench_creates(), &secret)
            .await
            .with_context(|| format!("creating Secret {name}"))?;
    }
    Ok(names)
}

fn peaks(system: &BenchSystem) -> Result<(f64, f64)> {
    let leader = system.leader();
    let controller = process_stats(leader.controller.pid())?.peak_rss_mib;
    let applier = leader
        .applier
        .as_ref()
        .context("the pod's status-applier")?;
    Ok((controller, process_stats(applier.pid())?.peak_rss_mib))
}

/// Runs the four phases against the system as deployed.
pub(crate) async fn run_noisy(args: &Args, pod: &Pod) -> Result<Noisy> {
    let client = env().client().await?;
    let dir = std::env::temp_dir().join(capt_tests::unique_name("noisy"));
    std::fs::create_dir_all(&dir)?;
    let mut system = BenchSystem::start(args, Mode::Sidecar, pod, &dir).await?;
    eprintln!("[noisy] processes' logs in {}", dir.display());
    system.wait_ready(Duration::from_secs(120)).await?;
    let templates = pod.template_namespace()?;
    create_templates(&client, &templates, TENANT_B, &[]).await?;
    create_namespace(&client, TENANT_A).await?;
    create_namespace(&client, TENANT_B).await?;
    let rendered = Rendered::start(&client);
    let probes = args.noisy_probes;

    let mut phases = vec![tenant_b(&client, &rendered, &templates, "alone", probes).await?];

    let flood = tenant_a(&client, &templates, "flood", args.noisy_flood, vec![]);
    let (flooded, b) = tokio::join!(
        flood,
        tenant_b(&client, &rendered, &templates, "flood", probes)
    );
    flooded?;
    phases.push(b?);

    let secrets = waited_secrets(&client).await?;
    tenant_a(&client, &templates, "waits", args.noisy_waits, secrets).await?;
    phases.push(tenant_b(&client, &rendered, &templates, "waits", probes).await?);
    let before = peaks(&system)?;

    system.restart()?;
    system.wait_ready(Duration::from_secs(300)).await?;
    phases.push(tenant_b(&client, &rendered, &templates, "restart", probes).await?);
    let after = peaks(&system)?;
    let limits = (
        pod.memory_limit_mib("manager")?,
        pod.memory_limit_mib("status-applier")?,
    );
    Ok(Noisy {
        phases,
        peaks: [before, after],
        limits,
        flood: args.noisy_flood,
        waits: args.noisy_waits,
    })
}

/// The run's table, and whether each target held.
pub(crate) fn table(n: &Noisy) -> (String, bool) {
    let alone = n.phases[0].times.p99();
    let mut ok = true;
    let mut out = format!(
        "\nNoisy neighbour: tenant B's time from creating an apply to its rendered Workspace, \
         one a second, while tenant A has {} applies created at once (flood), then {} applies \
         each waiting for {MAX_WAITS} Secrets, one missing (waits), then the leading pod \
         restarted with all of A's objects there (restart). Target: B's p99 within 2x of B \
         alone.\n\n| phase | B p50 (s) | B p99 (s) | B max (s) | missed | p99 / alone | target |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | --- |\n",
        n.flood, n.waits
    );
    for p in &n.phases {
        let ratio = p.times.p99() / alone;
        let met = p.missed == 0 && ratio <= 2.0;
        ok &= met;
        out += &format!(
            "| {} | {:.3} | {:.3} | {:.3} | {} | {:.2}x | {} |\n",
            p.name,
            p.times.p50(),
            p.times.p99(),
            p.times.max(),
            p.missed,
            ratio,
            if met { "met" } else { "MISSED" }
        );
    }
    out += "\n| process | peak RSS before restart (MiB) | after restart (MiB) | limit (MiB) |\n\
            | --- | ---: | ---: | ---: |\n";
    let [before, after] = n.peaks;
    for (name, b, a, limit) in [
        ("controller", before.0, after.0, n.limits.0),
        ("status-applier", before.1, after.1, n.limits.1),
    ] {
        ok &= b < limit && a < limit;
        out += &format!("| {name} | {b:.1} | {a:.1} | {limit:.0} |\n");
    }
    (out, ok)
}
