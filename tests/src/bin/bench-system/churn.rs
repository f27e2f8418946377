//! Churn (`--churn-waves W`): the memory the system as deployed keeps once objects are gone.
//! Each wave creates N stacks in a namespace of its own, waits until they are provisioned,
//! deletes their Clusters (core deletes the CAPT objects, the controller the applies and
//! Workspaces, the provider destroys), waits until nothing of the wave is left, then reads the
//! resident memory (`VmRSS`) of the leading pod's two processes. What it shows: whether a
//! process forgets what it knew of deleted objects (the target: after the last wave within
//! 10% of after the first).

use crate::deployed::Pod;
use crate::probe::process_stats;
use crate::round::{CREATE_CONCURRENCY, Stacks, create_namespace, create_stacks, wait_provisioned};
use crate::stacks::{Watches, create_templates, resource};
use crate::system::BenchSystem;
use crate::{Args, Mode};
use anyhow::{Context, Result};
use capt_tests::env;
use capt_tests::fake_provider::workspace_resource;
use capt_tests::system::APPLY_NAMESPACE_LABEL;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams};
use std::time::{Duration, Instant};

/// One wave's numbers.
pub(crate) struct Wave {
    pub(crate) provisioned: usize,
    pub(crate) provisioned_in: f64,
    /// Seconds from the Clusters' deletion until nothing of the wave is left; `None` when
    /// something was still left at the deadline.
    pub(crate) deleted_in: Option<f64>,
    /// Objects of the wave left at the deadline (0 when all went).
    pub(crate) left: usize,
    /// Resident memory once the wave is gone (MiB): controller, status-applier.
    pub(crate) controller_rss_mib: f64,
    pub(crate) applier_rss_mib: f64,
}

/// A churn run: its waves, in order.
pub(crate) struct Churn {
    pub(crate) clusters: usize,
    pub(crate) waves: Vec<Wave>,
}

/// Runs `waves` waves of `n` stacks against the system as deployed.
pub(crate) async fn run_churn(args: &Args, n: usize, waves: usize, pod: &Pod) -> Result<Churn> {
    let client = env().client().await?;
    let dir = std::env::temp_dir().join(capt_tests::unique_name(&format!("churn-{n}")));
    std::fs::create_dir_all(&dir)?;
    let system = BenchSystem::start(args, Mode::Sidecar, pod, &dir).await?;
    eprintln!("[churn N={n}] processes' logs in {}", dir.display());
    let timeout = args.provision_timeout(n);
    let templates = pod.template_namespace()?;
    let mut done = Vec::new();
    for wave in 0..waves {
        let ns = format!("churn-{n}-w{wave}");
        create_namespace(&client, &ns).await?;
        let watches = Watches::start(&client, &ns);
        let start = Instant::now();
        let stacks = Stacks {
            ns: &ns,
            templates: &templates,
        };
        create_templates(&client, &templates, &ns, &[]).await?;
        create_stacks(&client, &stacks, n, 0).await?;
        wait_provisioned(&watches, n, timeout).await;
        let provisioned = watches.provisioned();
        let provisioned_in = start.elapsed().as_secs_f64();
        drop(watches);
        let deleting = Instant::now();
        delete_clusters(&client, &ns).await?;
        let left = wait_gone(&client, &ns, timeout).await?;
        let deleted_in = (left == 0).then(|| deleting.elapsed().as_secs_f64());
        let leader = system.leader();
        let controller_rss_mib = process_stats(leader.controller.pid())?.rss_mib;
        let applier = leader
            .applier
            .as_ref()
            .context("the pod's status-applier")?;
        let applier_rss_mib = process_stats(applier.pid())?.rss_mib;
        eprintln!(
            "  wave {}: {provisioned}/{n} provisioned in {provisioned_in:.1} s, {} ; RSS controller {controller_rss_mib:.1} MiB, status-applier {applier_rss_mib:.1} MiB",
            wave + 1,
            match deleted_in {
                Some(s) => format!("all gone {s:.1} s after the deletion"),
                None => format!("{left} objects left after {} s", timeout.as_secs()),
            },
        );
        done.push(Wave {
            provisioned,
            provisioned_in,
            deleted_in,
            left,
            controller_rss_mib,
            applier_rss_mib,
        });
    }
    Ok(Churn {
        clusters: n,
        waves: done,
    })
}

fn cluster_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

/// Deletes every Cluster in `ns`, one request each, [`CREATE_CONCURRENCY`] at a time (as
/// `kubectl delete --all` does). A single deletecollection of 1,000 Clusters failed here with
/// its connection closed before the answer (the cause not traced); one request each keeps
/// every request short, and a failed one names its Cluster.
async fn delete_clusters(client: &kube::Client, ns: &str) -> Result<()> {
    let api = cluster_api(client, ns);
    let (list, delete) = (ListParams::default(), DeleteParams::default());
    let listed = sent_again_if_closed(&format!("listing the Clusters of {ns}"), || {
        api.list_metadata(&list)
    })
    .await?;
    let names = listed
        .items
        .into_iter()
        .map(|c| c.metadata.name.unwrap_or_default());
    futures::stream::iter(names.map(|name| {
        let (api, delete) = (&api, &delete);
        async move {
            sent_again_if_closed(&format!("deleting Cluster {ns}/{name}"), || {
                api.delete(&name, delete)
            })
            .await
            .map(|_| ())
        }
    }))
    .buffer_unordered(CREATE_CONCURRENCY)
    .try_collect::<Vec<()>>()
    .await?;
    Ok(())
}

/// Sends a request up to three times when the client's connection failed
/// (`kube::Error::Service`, such as "connection closed before message completed" on a pooled
/// connection the server closed). Nothing else is retried: a delete that reached the server
/// before its connection failed is refused the second time (404) and stops the run, visibly.
async fn sent_again_if_closed<T, F>(what: &str, send: impl Fn() -> F) -> Result<T>
where
    F: std::future::Future<Output = kube::Result<T>>,
{
    let mut attempt = 1;
    loop {
        match send().await {
            Err(kube::Error::Service(e)) if attempt < 3 => {
                eprintln!("  {what}: {e}; sent again");
                attempt += 1;
            }
            result => return result.with_context(|| what.to_owned()),
        }
    }
}

/// Waits until nothing of the wave in `ns` is left (Clusters, CAPT objects, applies, and
/// the Workspaces rendered for them), for at most `timeout`; returns how many are left.
async fn wait_gone(client: &kube::Client, ns: &str, timeout: Duration) -> Result<usize> {
    let namespaced = |group: &str, kind: &str| -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), ns, &resource(group, kind))
    };
    let kinds = [
        (cluster_api(client, ns), ListParams::default()),
        (
            namespaced("infrastructure.cluster.x-k8s.io", "CAPTCluster"),
            ListParams::default(),
        ),
        (
            namespaced("controlplane.cluster.x-k8s.io", "CAPTControlPlane"),
            ListParams::default(),
        ),
        (
            namespaced("infrastructure.cluster.x-k8s.io", "WorkspaceTemplateApply"),
            ListParams::default(),
        ),
        (
            Api::all_with(client.clone(), &workspace_resource()),
            ListParams::default().labels(&format!("{APPLY_NAMESPACE_LABEL}={ns}")),
        ),
    ];
    let deadline = Instant::now() + timeout;
    loop {
        let mut left = 0;
        for (api, params) in &kinds {
            // One item and the count of the rest: cheap at any N.
            let page = api.list_metadata(&params.clone().limit(1)).await?;
            let rest = page.metadata.remaining_item_count.unwrap_or(0);
            left += page.items.len() + usize::try_from(rest).unwrap_or(0);
        }
        if left == 0 || Instant::now() > deadline {
            return Ok(left);
        }
        // Polls: the deletion of thousands of objects is watched by its count, every 2 s.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The churn table, in markdown.
pub(crate) fn table(churn: &Churn) -> String {
    let mut out = format!(
        "\n### Churn: {} waves of {} stacks, each provisioned then deleted\n\n| wave | provisioned | in (s) | all gone after the deletion (s) | controller RSS (MiB) | status-applier RSS (MiB) |\n| ---: | ---: | ---: | ---: | ---: | ---: |\n",
        churn.waves.len(),
        churn.clusters
    );
    for (i, w) in churn.waves.iter().enumerate() {
        let gone = match w.deleted_in {
            Some(s) => format!("{s:.1}"),
            None => format!("{} left", w.left),
        };
        out += &format!(
            "| {} | {} | {:.1} | {gone} | {:.1} | {:.1} |\n",
            i + 1,
            w.provisioned,
            w.provisioned_in,
            w.controller_rss_mib,
            w.applier_rss_mib
        );
    }
    if let (Some(first), Some(last)) = (churn.waves.first(), churn.waves.last()) {
        let ratio = |a: f64, b: f64| if a > 0.0 { b / a } else { f64::NAN };
        let (c, a) = (
            ratio(first.controller_rss_mib, last.controller_rss_mib),
            ratio(first.applier_rss_mib, last.applier_rss_mib),
        );
        let within = |r: f64| {
            if r <= 1.10 {
                "within 10%"
            } else {
                "MORE than 10% above"
            }
        };
        out += &format!(
            "\nAfter the last wave against after the first: controller {:.2}× ({}), status-applier {:.2}× ({}).\n",
            c,
            within(c),
            a,
            within(a)
        );
    }
    out
}
