//! Shards (`--shards K`): the system as Cluster API providers scale it past one replica.
//! K Deployments of the manifests' pods (two replicas each), every pod narrowed to one
//! shard's label (`cluster.x-k8s.io/watch-filter=<shard>`: the controller's `--watch-filter`,
//! the applier's `--watch-label-selector`) on a Lease of the shard's own, beside one
//! provider; N stacks split evenly, each shard's in a namespace of its own and labelled for
//! it. What it shows: each shard's provisioning time, its leading pod's peak RSS and CPU, and
//! from the API server's audit log the writes each shard's processes made to their own
//! shard's objects and to any other's (the target: none).

use crate::deployed::Pod;
use crate::probe::{CREDENTIAL_ID, Probe, ProcessStats, process_stats};
use crate::round::{Stacks, create_namespace, create_stacks_in, wait_provisioned};
use crate::stacks::{Watches, create_templates};
use crate::system::{BenchSystem, start_provider};
use crate::{Args, Mode};
use anyhow::{Context, Result};
use capt_tests::audit_log::is_write;
use capt_tests::env;
use serde_json::Value;
use std::time::{Duration, Instant};

/// One shard's numbers.
pub(crate) struct Shard {
    pub(crate) name: String,
    pub(crate) stacks: usize,
    pub(crate) provisioned: usize,
    pub(crate) provisioned_in: f64,
    pub(crate) controller: ProcessStats,
    pub(crate) applier: ProcessStats,
    /// Writes by the shard's processes to its own shard's objects.
    pub(crate) own_writes: u64,
    /// Writes by the shard's processes to another shard's objects (target: 0).
    pub(crate) cross_writes: u64,
}

/// A sharded run: `n` stacks over its shards.
pub(crate) struct Sharded {
    pub(crate) clusters: usize,
    pub(crate) shards: Vec<Shard>,
}

fn shard_namespace(n: usize, shard: usize) -> String {
    format!("shard-{n}-{shard}")
}

/// Runs `n` stacks over `k` shards, provisions them all at once, and measures each shard.
pub(crate) async fn run_shards(args: &Args, n: usize, k: usize, pod: &Pod) -> Result<Sharded> {
    let client = env().client().await?;
    let audit = env().state_dir().join("audit.log");
    let dir = std::env::temp_dir().join(capt_tests::unique_name(&format!("shards-{n}")));
    std::fs::create_dir_all(&dir)?;
    let _provider = start_provider(args).await?;
    let names: Vec<String> = (0..k).map(|i| format!("shard-{i}")).collect();
    let namespaces: Vec<String> = (0..k).map(|i| shard_namespace(n, i)).collect();
    let mut systems = Vec::new();
    for (name, ns) in names.iter().zip(&namespaces) {
        create_namespace(&client, ns).await?;
        systems.push(BenchSystem::start_shard(pod, &dir.join(name), name).await?);
    }
    eprintln!("[shards N={n} K={k}] processes' logs in {}", dir.display());
    // Any round's probe reads the whole audit log; its namespace plays no part here.
    let log = Probe {
        mode: Mode::Sidecar,
        ns: &namespaces[0],
        audit: &audit,
    };
    let from = log.audit_end()?;
    let per_shard = n / k;
    let timeout = args.provision_timeout(n);
    let templates = &pod.template_namespace()?;
    let start = Instant::now();
    let provisioning = names.iter().zip(&namespaces).map(|(name, ns)| {
        let client = client.clone();
        async move {
            let watches = Watches::start(&client, ns);
            let stacks = Stacks { ns, templates };
            create_templates(&client, templates, ns, &[]).await?;
            create_stacks_in(&client, &stacks, per_shard, 0, Some(name)).await?;
            wait_provisioned(&watches, per_shard, timeout).await;
            anyhow::Ok((watches.provisioned(), start.elapsed().as_secs_f64()))
        }
    });
    let provisioned = futures::future::try_join_all(provisioning).await?;
    if !log
        .quiet(Duration::from_secs(3), Duration::from_secs(60))
        .await?
    {
        eprintln!("  writes had not stopped 60 s after provisioning");
    }
    let events = log.events(from, log.audit_end()?)?;
    let mut shards = Vec::new();
    for (i, system) in systems.iter().enumerate() {
        let ids: Vec<&str> = system
            .identities
            .iter()
            .map(|(_, id)| id.as_str())
            .collect();
        let (mut own_writes, mut cross_writes) = (0, 0);
        for event in &events {
            let Some(target) = written_namespace(event, &ids, &namespaces) else {
                continue;
            };
            if target == i {
                own_writes += 1;
            } else {
                cross_writes += 1;
            }
        }
        let leader = system.leader();
        let applier = leader
            .applier
            .as_ref()
            .context("the pod's status-applier")?;
        shards.push(Shard {
            name: names[i].clone(),
            stacks: per_shard,
            provisioned: provisioned[i].0,
            provisioned_in: provisioned[i].1,
            controller: process_stats(leader.controller.pid())?,
            applier: process_stats(applier.pid())?,
            own_writes,
            cross_writes,
        });
    }
    Ok(Sharded {
        clusters: n,
        shards,
    })
}

/// The shard (index into `namespaces`) whose object `event` wrote, when it is a completed
/// write sent with one of `ids`' credentials to an object of a shard: in its namespace, or a
/// Workspace named after it.
fn written_namespace(event: &Value, ids: &[&str], namespaces: &[String]) -> Option<usize> {
    let id = event["user"]["extra"][CREDENTIAL_ID][0].as_str()?;
    if !ids.contains(&id)
        || event["stage"] != "ResponseComplete"
        || !event["verb"].as_str().is_some_and(is_write)
    {
        return None;
    }
    let object = &event["objectRef"];
    namespaces.iter().position(|ns| {
        object["namespace"] == ns.as_str()
            || (object["resource"] == "workspaces"
                && object["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(&format!("{ns}-"))))
    })
}

/// The shards' table, in markdown.
pub(crate) fn table(sharded: &Sharded) -> String {
    let mut out = format!(
        "\n### {} stacks over {} shards (two replicas each, one provider)\n\n| shard | stacks | provisioned | in (s) | controller peak RSS (MiB) / CPU (s) | status-applier peak RSS (MiB) / CPU (s) | writes to its own shard's objects | to another shard's |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        sharded.clusters,
        sharded.shards.len()
    );
    for s in &sharded.shards {
        out += &format!(
            "| {} | {} | {} | {:.1} | {:.1} / {:.1} | {:.1} / {:.1} | {} | {} |\n",
            s.name,
            s.stacks,
            s.provisioned,
            s.provisioned_in,
            s.controller.peak_rss_mib,
            s.controller.cpu_seconds,
            s.applier.peak_rss_mib,
            s.applier.cpu_seconds,
            s.own_writes,
            s.cross_writes
        );
    }
    out
}
