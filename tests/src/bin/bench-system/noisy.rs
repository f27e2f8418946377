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
//!
//! Beside B, in every phase, the floor of B's hop on the same API server under the same load:
//! half a second after each of B's creates, the benchmark creates a ConfigMap in
//! `noisy-floor`, and a task of the benchmark that watches them applies, straight from each
//! watch event, a Workspace with the spec our controller rendered for B's first apply. Its
//! time, from the ConfigMap's create to the Workspace's first watch event, is what any writer
//! of that Workspace pays for watch delivery and the API server's two requests, with no
//! cache, queue, finalizer or render: how much of B's slowdown in a phase is the shared API
//! server's rather than ours.

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
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject};
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

const TENANT_A: &str = "noisy-a";
const TENANT_B: &str = "noisy-b";
/// The floor's namespace (its ConfigMaps) and the label naming a floor Workspace's ConfigMap.
const FLOOR: &str = "noisy-floor";
const FLOOR_LABEL: &str = "bench.capt.dev/noisy-floor";
/// How long one of B's applies may take to get its Workspace before it counts as missed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(120);

/// One phase's numbers: B's times to a rendered Workspace, and the floor's.
pub(crate) struct Phase {
    pub(crate) name: &'static str,
    pub(crate) b: Probed,
    pub(crate) floor: Probed,
}

/// One prober's times in a phase, and how many of its objects got no Workspace in time.
pub(crate) struct Probed {
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

/// When each watched Workspace was first seen, by the name its `key` label gives, and the
/// spec of the first one.
struct Rendered {
    seen: Mutex<HashMap<String, Instant>>,
    first_spec: watch::Sender<Option<Value>>,
}

impl Rendered {
    /// Watches the Workspaces that match `selector`, each named by its `key` label's value.
    fn start(client: &kube::Client, selector: String, key: &'static str) -> Arc<Self> {
        let seen = Arc::new(Self {
            seen: Mutex::default(),
            first_spec: watch::Sender::new(None),
        });
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &workspace_resource());
        let config = watcher::Config::default().labels(&selector);
        let s = seen.clone();
        tokio::spawn(async move {
            let mut events =
                std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
            while let Some(ws) = events.next().await {
                let Ok(ws) = ws else { continue };
                let Some(name) = ws.metadata.labels.as_ref().and_then(|l| l.get(key)) else {
                    continue;
                };
                s.seen
                    .lock()
                    .unwrap()
                    .entry(name.clone())
                    .or_insert_with(Instant::now);
                s.first_spec.send_if_modified(|spec| {
                    let first = spec.is_none();
                    if first {
                        *spec = Some(ws.data["spec"].clone());
                    }
                    first
                });
            }
        });
        seen
    }

    fn at(&self, name: &str) -> Option<Instant> {
        self.seen.lock().unwrap().get(name).copied()
    }

    /// The spec of the first Workspace seen, once there is one.
    async fn first_spec(&self) -> Value {
        let mut rx = self.first_spec.subscribe();
        let spec = rx.wait_for(Option::is_some).await;
        spec.as_ref()
            .ok()
            .and_then(|s| s.as_ref())
            .cloned()
            .unwrap_or(Value::Null)
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

/// Creates tenant `ns`'s apply `name` ([`apply_body`]) through `api`.
async fn create_apply(
    api: &Api<DynamicObject>,
    ns: &str,
    name: &str,
    templates: &str,
    secrets: &[String],
) -> Result<()> {
    api.create(&bench_creates(), &apply_body(name, templates, secrets, ns)?)
        .await
        .with_context(|| format!("creating {ns}/{name}"))?;
    Ok(())
}

/// Creates `probes` objects with `create`, one a second from `offset`, each waited for (up to
/// [`PROBE_TIMEOUT`]) in the background as `rendered` sees its Workspace; returns the times
/// once every one is rendered or missed.
async fn probe<F, Fut>(
    rendered: &Arc<Rendered>,
    offset: Duration,
    phase: &'static str,
    probes: usize,
    create: F,
) -> Result<Probed>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let mut waits = Vec::new();
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + offset, Duration::from_secs(1));
    for i in 0..probes {
        tick.tick().await;
        let name = format!("{phase}-{i}");
        create(name.clone()).await?;
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
    Ok(Probed {
        times: Times::of(times),
        missed,
    })
}

/// One phase of B's applies and, beside them, the floor's ConfigMaps.
async fn run_phase(
    client: &kube::Client,
    seen: &Seen,
    templates: &str,
    phase: &'static str,
    probes: usize,
) -> Result<Phase> {
    let api = applies(client, TENANT_B);
    let b = probe(&seen.b, Duration::ZERO, phase, probes, |name| {
        let api = api.clone();
        async move { create_apply(&api, TENANT_B, &name, templates, &[]).await }
    });
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), FLOOR);
    let floor = probe(
        &seen.floor,
        Duration::from_millis(500),
        phase,
        probes,
        |name| {
            let config_maps = config_maps.clone();
            async move {
                let cm = serde_json::from_value(json!({"metadata": {"name": name}}))?;
                config_maps
                    .create(&bench_creates(), &cm)
                    .await
                    .with_context(|| format!("creating ConfigMap {FLOOR}/{name}"))?;
                Ok(())
            }
        },
    );
    let (b, floor) = tokio::try_join!(b, floor)?;
    for (who, p) in [("B", &b), ("floor", &floor)] {
        eprintln!(
            "[noisy] {phase}: {who} {} ({} missed)",
            p.times.summary(),
            p.missed
        );
    }
    Ok(Phase {
        name: phase,
        b,
        floor,
    })
}

/// The floor writer: for each ConfigMap of [`FLOOR`], straight from its watch event, applies a
/// Workspace with `spec`, labelled with the ConfigMap's name; runs until aborted.
fn spawn_floor_writer(client: kube::Client, spec: Value) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), FLOOR);
        let workspaces: Api<DynamicObject> = Api::all_with(client, &workspace_resource());
        let apply = PatchParams::apply(crate::floor::MANAGER).force();
        let mut written = HashSet::new();
        let mut events = std::pin::pin!(
            watcher(config_maps, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        while let Some(cm) = events.next().await {
            let Ok(cm) = cm else { continue };
            let name = cm.name_any();
            if !written.insert(name.clone()) {
                continue;
            }
            let ws_name = format!("{FLOOR}-{name}");
            let body = json!({"apiVersion": "tf.upbound.io/v1beta1", "kind": "Workspace",
                "metadata": {"name": ws_name, "labels": {FLOOR_LABEL: name}},
                "spec": spec});
            if let Err(e) = workspaces
                .patch(&ws_name, &apply, &Patch::Apply(&body))
                .await
            {
                eprintln!("  noisy floor: applying Workspace {ws_name}: {e}");
                written.remove(&name);
            }
        }
    })
}

/// B's Workspaces and the floor's.
struct Seen {
    b: Arc<Rendered>,
    floor: Arc<Rendered>,
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
                create_apply(&api, TENANT_A, &name, templates, &secrets).await
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
    create_namespace(&client, FLOOR).await?;
    let seen = Seen {
        b: Rendered::start(
            &client,
            format!("{APPLY_NAMESPACE_LABEL}={TENANT_B}"),
            APPLY_NAME_LABEL,
        ),
        floor: Rendered::start(&client, FLOOR_LABEL.to_owned(), FLOOR_LABEL),
    };
    let probes = args.noisy_probes;

    // The floor copies the spec our controller renders for B: B's first apply is made, and
    // its Workspace awaited, before the phases.
    let warm = probe(&seen.b, Duration::ZERO, "warm", 1, |name| {
        let api = applies(&client, TENANT_B);
        let templates = templates.clone();
        async move { create_apply(&api, TENANT_B, &name, &templates, &[]).await }
    })
    .await?;
    anyhow::ensure!(
        warm.missed == 0,
        "B's first apply got no Workspace in {PROBE_TIMEOUT:?}"
    );
    let floor_writer = spawn_floor_writer(client.clone(), seen.b.first_spec().await);

    let mut phases = vec![run_phase(&client, &seen, &templates, "alone", probes).await?];

    let flood = tenant_a(&client, &templates, "flood", args.noisy_flood, vec![]);
    let (flooded, b) = tokio::join!(
        flood,
        run_phase(&client, &seen, &templates, "flood", probes)
    );
    flooded?;
    phases.push(b?);

    let secrets = waited_secrets(&client).await?;
    tenant_a(&client, &templates, "waits", args.noisy_waits, secrets).await?;
    phases.push(run_phase(&client, &seen, &templates, "waits", probes).await?);
    let before = peaks(&system)?;

    system.restart()?;
    system.wait_ready(Duration::from_secs(300)).await?;
    phases.push(run_phase(&client, &seen, &templates, "restart", probes).await?);
    floor_writer.abort();
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
    let alone = &n.phases[0];
    let mut ok = true;
    let mut out = format!(
        "\nNoisy neighbour: tenant B's time from creating an apply to its rendered Workspace, \
         one a second, while tenant A has {} applies created at once (flood), then {} applies \
         each waiting for {MAX_WAITS} Secrets, one missing (waits), then the leading pod \
         restarted with all of A's objects there (restart). Target: B's p99 within 2x of B \
         alone. Beside it, the floor of B's hop in the same phase: a ConfigMap's create to the \
         first watch event of a Workspace applied straight from its own (the API server's \
         share of B's time, with no controller).\n\n\
         | phase | B p50 (s) | B p99 (s) | B max (s) | missed | B p99 / alone | target \
         | floor p50 (s) | floor p99 (s) | floor p99 / alone | B p99 / floor p99 |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |\n",
        n.flood, n.waits
    );
    for p in &n.phases {
        let ratio = p.b.times.p99() / alone.b.times.p99();
        let met = p.b.missed == 0 && ratio <= 2.0;
        ok &= met;
        out += &format!(
            "| {} | {:.3} | {:.3} | {:.3} | {} | {:.2}x | {} | {:.3} | {:.3} | {:.2}x | {:.2}x |\n",
            p.name,
            p.b.times.p50(),
            p.b.times.p99(),
            p.b.times.max(),
            p.b.missed,
            ratio,
            if met { "met" } else { "MISSED" },
            p.floor.times.p50(),
            p.floor.times.p99(),
            p.floor.times.p99() / alone.floor.times.p99(),
            p.b.times.p99() / p.floor.times.p99(),
        );
        if p.floor.missed > 0 {
            out += &format!(
                "  ({} of the floor's objects got no Workspace)\n",
                p.floor.missed
            );
        }
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
