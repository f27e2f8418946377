//! Peak memory of `status-applier serve` over many objects: not a test, it prints numbers.
//!
//! On the API server of `hack/testenv.sh start --no-core` (KUBECONFIG set), it creates, in the
//! namespace `applier-mem`, CLUSTERS sets of four objects shaped like CAPT's (a Cluster, a
//! CAPTCluster, a CAPTControlPlane, a WorkspaceTemplateApply), each with `managedFields` of
//! several managers: the creator (an Update with kubectl's last-applied annotation), the
//! Cluster API core manager (`manager`: a finalizer, owner references, and on the Cluster a
//! large v1beta2 status, its v1beta1 conditions kept under `deprecated`). It then runs `status-applier serve`
//! (the release binary) with the four kinds watched, reads VmHWM/VmRSS from /proc once the
//! kinds are listed, submits every intent at once (six documents per set, under four
//! managers), reads them again, submits a second wave that changes every document, and reads
//! them a last time.
//!
//! ```sh
//! cargo build --release -p status-applier --bins --examples
//! $CARGO_TARGET_DIR/release/examples/memory 1000 [--keep] [-- SERVE ARGS…]
//! ```
//! `--keep` reuses the objects of a run before (created on first use); without it the
//! namespace is emptied and the objects created again, so that every run starts from the
//! same state. The serve environment is inherited (try `MALLOC_ARENA_MAX=2`).

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt, stream};
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use status_applier::client::Client as Applier;
use status_applier_api::intent::{Intent, Subresource, Target};
use std::time::{Duration, Instant};

const NS: &str = "applier-mem";
const CLUSTER: (&str, &str, &str) = ("cluster.x-k8s.io", "v1beta2", "Cluster");
const CAPT_CLUSTER: (&str, &str, &str) =
    ("infrastructure.cluster.x-k8s.io", "v1beta1", "CAPTCluster");
const CONTROL_PLANE: (&str, &str, &str) = (
    "controlplane.cluster.x-k8s.io",
    "v1beta1",
    "CAPTControlPlane",
);
const APPLY: (&str, &str, &str) = (
    "infrastructure.cluster.x-k8s.io",
    "v1beta1",
    "WorkspaceTemplateApply",
);
const MANAGERS: &str =
    "capt-captcluster,capt-captcontrolplane,capt-cluster,capt-workspacetemplateapply";

fn resource((group, version, kind): (&str, &str, &str)) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

fn api(client: &Client, kind: (&str, &str, &str)) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), NS, &resource(kind))
}

/// A condition of core's v1beta1 contract, which v1beta2 keeps under `deprecated.v1beta1`.
fn v1beta1_condition(kind: &str, i: usize, n: usize) -> Value {
    json!({"type": format!("{kind}{n}"), "status": "False", "severity": "Info",
           "reason": "WaitingForInfrastructure",
           "message": format!("* {kind}{n}: waiting for the infrastructure of cluster c-{i} to be provisioned by its provider"),
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// A condition as Cluster API core writes it (v1beta2).
fn condition(i: usize, n: usize) -> Value {
    json!({"type": format!("V2Condition{n}"), "status": "Unknown", "reason": "NotYetReported",
           "message": format!("* CAPTControlPlane c-{i}: condition V2Condition{n} not yet reported"),
           "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1})
}

/// One object to create: its kind (group, version, kind), the object, core's patch of it,
/// core's status patch.
type Created = (
    (&'static str, &'static str, &'static str),
    Value,
    Value,
    Option<Value>,
);

/// The objects of set `i`.
fn set(i: usize) -> Vec<Created> {
    let name = format!("c-{i}");
    // Core's owner references, as labels: with a made-up owner uid the garbage collector of
    // the test environment would delete the objects.
    let owner = json!({"labels": {"cluster.x-k8s.io/owner-kind": "Cluster", "cluster.x-k8s.io/owner-name": name,
        "cluster.x-k8s.io/owner-uid": "00000000-0000-0000-0000-000000000000"}});
    let labels = json!({"cluster.x-k8s.io/cluster-name": name});
    let cluster_spec = json!({
        "clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}, "services": {"cidrBlocks": ["10.128.0.0/12"]}},
        "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "CAPTCluster", "name": name},
        "controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io", "kind": "CAPTControlPlane", "name": name}});
    let cc_spec = json!({"region": "ap-northeast-1", "vpcTemplateRef": {"name": "vpc"},
        "vpcConfig": {"name": format!("{name}-vpc")}, "workspaceTemplateApplyName": format!("{name}-vpc")});
    let cp_spec = json!({"version": "1.31", "workspaceTemplateRef": {"name": "eks"},
        "workspaceTemplateApplyName": format!("{name}-eks"),
        "controlPlaneConfig": {"region": "ap-northeast-1", "endpointAccess": {"public": true, "private": true}}});
    // Variables are plain values of at most 253 bytes (the CRD checks): eight tags stand in for
    // the bulk of a real apply's variables.
    let mut variables =
        json!({"CLUSTER_NAME": name, "REGION": "ap-northeast-1", "KUBERNETES_VERSION": "1.31"});
    for n in 0..8 {
        variables[format!("TAG_{n}")] = json!(format!(
            "team-{n}.cost-center-{i}.{name}.eks-node-group-{n}"
        ));
    }
    let wta_spec = json!({"templateRef": {"name": "eks", "namespace": NS},
        "variables": variables,
        "writeConnectionSecretToRef": {"name": format!("{name}-eks-connection"), "namespace": NS}});
    let created = |kind: (&str, &str, &str), name: String, spec: Value, labels: Value| {
        let mut object = json!({"apiVersion": format!("{}/{}", kind.0, kind.1), "kind": kind.2,
            "metadata": {"name": name, "namespace": NS, "labels": labels}, "spec": spec});
        let last_applied = object.to_string();
        object["metadata"]["annotations"] =
            json!({"kubectl.kubernetes.io/last-applied-configuration": last_applied});
        object
    };
    let core_status = json!({"status": {
        "phase": "Provisioning", "observedGeneration": 1,
        "initialization": {"infrastructureProvisioned": false, "controlPlaneInitialized": false},
        "conditions": (0..10).map(|n| condition(i, n)).collect::<Vec<_>>(),
        "deprecated": {"v1beta1": {"conditions": (0..8).map(|n| v1beta1_condition("Cluster", i, n)).collect::<Vec<_>>()}}}});
    vec![
        (
            CLUSTER,
            created(CLUSTER, name.clone(), cluster_spec, json!({})),
            json!({"metadata": {"finalizers": ["cluster.cluster.x-k8s.io"]}}),
            Some(core_status),
        ),
        (
            CAPT_CLUSTER,
            created(CAPT_CLUSTER, name.clone(), cc_spec, labels.clone()),
            json!({"metadata": owner.clone()}),
            None,
        ),
        (
            CONTROL_PLANE,
            created(CONTROL_PLANE, name.clone(), cp_spec, labels.clone()),
            json!({"metadata": owner}),
            None,
        ),
        (
            APPLY,
            created(APPLY, format!("{name}-eks"), wta_spec, labels),
            json!({"metadata": {"labels": {"extra": "x"}}}),
            None,
        ),
    ]
}

/// The documents of set `i` in wave `wave`: (kind, name, subresource, manager, fragment).
fn intents(i: usize, wave: usize) -> Vec<Intent> {
    let name = format!("c-{i}");
    let phase = if wave == 0 { "Creating" } else { "Ready" };
    let ready = wave > 0;
    let cond = |t: &str| {
        json!({"type": t, "status": if ready {"True"} else {"False"}, "reason": phase,
        "message": format!("{t} of {name} is {phase}"), "lastTransitionTime": format!("2026-01-0{}T00:00:00Z", wave + 1)})
    };
    let outputs = json!({"cluster_endpoint": format!("https://{name}.gr7.ap-northeast-1.eks.amazonaws.com"),
        "cluster_name": name, "oidc_provider": format!("oidc.eks.ap-northeast-1.amazonaws.com/id/{i:032}")});
    let target = |kind: (&str, &str, &str), name: &str| Target {
        api_version: format!("{}/{}", kind.0, kind.1),
        kind: kind.2.into(),
        namespace: Some(NS.into()),
        name: name.into(),
        uid: None,
    };
    let intent = |kind, name: &str, status: bool, manager: &str, fragment: Value| Intent {
        target: target(kind, name),
        subresource: status.then_some(Subresource::Status),
        field_manager: manager.into(),
        fragment,
        release: Vec::new(),
        not_older_than: None,
    };
    vec![
        intent(
            CLUSTER,
            &name,
            false,
            "capt-cluster",
            json!({"spec": {"controlPlaneEndpoint":
            {"host": format!("{name}.gr7.ap-northeast-1.eks.amazonaws.com"), "port": 443 + wave}}}),
        ),
        intent(
            CAPT_CLUSTER,
            &name,
            true,
            "capt-captcluster",
            json!({"status": {"ready": ready,
            "vpcId": format!("vpc-{i}"), "vpcWorkspaceName": format!("{name}-vpc"),
            "conditions": [cond("Ready"), cond("VpcReady")],
            "workspaceTemplateStatus": {"ready": ready, "state": phase, "lastAppliedRevision": format!("{wave}"),
                "outputs": {"vpc_id": format!("vpc-{i}"), "private_subnets": "subnet-a,subnet-b"}}}}),
        ),
        intent(
            CAPT_CLUSTER,
            &name,
            true,
            "capt-cluster",
            json!({"status": {"observedGeneration": 1 + wave}}),
        ),
        intent(
            CONTROL_PLANE,
            &name,
            true,
            "capt-captcontrolplane",
            json!({"status": {"ready": ready,
            "initialized": ready, "phase": phase, "version": "1.31",
            "conditions": [cond("Ready"), cond("ControlPlaneReady"), cond("WorkspaceReady")],
            "workspaceStatus": {"ready": ready, "state": phase, "atProvider": {"checksum": format!("{i}-{wave}"), "outputs": outputs.clone()}},
            "workspaceTemplateStatus": {"ready": ready, "state": phase, "outputs": outputs}}}),
        ),
        intent(
            CONTROL_PLANE,
            &name,
            false,
            "capt-captcontrolplane",
            json!({"spec": {"controlPlaneEndpoint":
            {"host": format!("{name}.gr7.ap-northeast-1.eks.amazonaws.com"), "port": 443 + wave}}}),
        ),
        intent(
            APPLY,
            &format!("{name}-eks"),
            true,
            "capt-workspacetemplateapply",
            json!({"status": {
            "applied": ready, "workspaceName": format!("{name}-eks-{i}"),
            "conditions": [cond("Ready"), cond("Synced")]}}),
        ),
    ]
}

/// Intents in flight at once: `MEMORY_BENCH_CONCURRENCY`, 512 by default (every cluster
/// provisioning at once).
fn concurrency() -> usize {
    std::env::var("MEMORY_BENCH_CONCURRENCY")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(512)
}

fn memory(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let get = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| format!("{:.1} MiB", kb as f64 / 1024.0))
            .unwrap_or_else(|| "?".into())
    };
    format!("VmHWM {} VmRSS {}", get("VmHWM:"), get("VmRSS:"))
}

async fn create(client: &Client, clusters: usize) -> Result<()> {
    let started = Instant::now();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
    namespaces
        .patch(NS, &PatchParams::apply("memory-bench"), &Patch::Apply(ns))
        .await?;
    let work: Vec<_> = (0..clusters).flat_map(set).collect();
    stream::iter(work)
        .map(|(kind, object, core, core_status)| async move {
            let api = api(client, kind);
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let object: DynamicObject = serde_json::from_value(object)?;
            let pp = PostParams {
                field_manager: Some("kubectl-client-side-apply".into()),
                ..Default::default()
            };
            api.create(&pp, &object)
                .await
                .with_context(|| format!("creating {name}"))?;
            let core_params = PatchParams {
                field_manager: Some("manager".into()),
                ..Default::default()
            };
            api.patch(&name, &core_params, &Patch::Merge(core)).await?;
            if let Some(status) = core_status {
                api.patch_status(&name, &core_params, &Patch::Merge(status))
                    .await?;
            }
            anyhow::Ok(())
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    eprintln!(
        "created {} objects in {:.0?}",
        clusters * 4,
        started.elapsed()
    );
    Ok(())
}

async fn empty(client: &Client) -> Result<()> {
    for kind in [CLUSTER, CAPT_CLUSTER, CONTROL_PLANE, APPLY] {
        let api = api(client, kind);
        // Finalizers first, so the objects go at once (no controller runs here).
        let names: Vec<String> = api
            .list_metadata(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|o| o.metadata.name)
            .collect();
        stream::iter(names)
            .map(|name| {
                let api = api.clone();
                async move {
                    let _ = api
                        .patch(
                            &name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                        )
                        .await;
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<()>>()
            .await;
        api.delete_collection(&DeleteParams::default(), &ListParams::default())
            .await?;
    }
    Ok(())
}

async fn count(client: &Client) -> Result<usize> {
    let mut n = 0;
    for kind in [CLUSTER, CAPT_CLUSTER, CONTROL_PLANE, APPLY] {
        n += api(client, kind)
            .list_metadata(&ListParams::default())
            .await?
            .items
            .len();
    }
    Ok(n)
}

async fn wave(applier: &Applier, clusters: usize, wave: usize, pid: u32) -> Result<()> {
    let started = Instant::now();
    let all: Vec<Intent> = (0..clusters).flat_map(|i| intents(i, wave)).collect();
    let total = all.len();
    let outcomes: Vec<String> = stream::iter(all)
        .map(|intent| async move {
            match applier.send(&intent).await {
                Ok(outcome) if outcome.message.is_none() => format!("{:?}", outcome.action),
                Ok(outcome) => format!(
                    "{:?}: {}",
                    outcome.action,
                    outcome.message.unwrap_or_default()
                ),
                Err(e) => format!("refused: {e}"),
            }
        })
        .buffer_unordered(concurrency())
        .collect()
        .await;
    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    for o in outcomes {
        // One line per kind of outcome, not per object.
        let o: String = o.chars().take(160).collect();
        let o = o
            .split(' ')
            .map(|w| if w.contains("c-") { "…" } else { w })
            .collect::<Vec<_>>()
            .join(" ");
        *tally.entry(o).or_default() += 1;
    }
    println!(
        "wave {wave}: {total} intents, {} at once, in {:.1?}: {tally:?}",
        concurrency(),
        started.elapsed()
    );
    println!("after wave {wave}: {}", memory(pid));
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (ours, serve_args) = match args.iter().position(|a| a == "--") {
        Some(at) => (args[..at].to_vec(), args[at + 1..].to_vec()),
        None => (args.clone(), Vec::new()),
    };
    let clusters: usize = ours.iter().find_map(|a| a.parse().ok()).unwrap_or(1000);
    let keep = ours.iter().any(|a| a == "--keep");
    let client = Client::try_default().await?;
    let have = count(&client).await.unwrap_or(0);
    if !keep || have != clusters * 4 {
        empty(&client).await?;
        while count(&client).await? > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        create(&client, clusters).await?;
    } else {
        eprintln!("reusing {have} objects");
    }
    let binary = std::env::var("STATUS_APPLIER_BIN").unwrap_or_else(|_| {
        let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
        format!("{target}/release/status-applier")
    });
    let dir = std::env::temp_dir().join(format!("applier-mem-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("applier.sock");
    let kinds = [CLUSTER, CAPT_CLUSTER, CONTROL_PLANE, APPLY]
        .map(|(g, v, k)| format!("{g}/{v}:{k}"))
        .join(",");
    let started = Instant::now();
    let mut child = tokio::process::Command::new(&binary)
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .args([
            "--allow-manager",
            MANAGERS,
            "--watch-kind",
            &kinds,
            "--no-events",
        ])
        .args(&serve_args)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stderr(std::fs::File::create(dir.join("serve.log"))?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("running {binary}"))?;
    let pid = child.id().context("a pid")?;
    let applier = Applier::new(&socket);
    loop {
        if let Ok(answer) = applier.get("/readyz").await
            && answer.status.is_success()
        {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("serve not ready after 300 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "clusters {clusters}, objects {}, serve {binary} {}",
        clusters * 4,
        serve_args.join(" ")
    );
    println!("listed after {:.1?}: {}", started.elapsed(), memory(pid));
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!("idle: {}", memory(pid));
    wave(&applier, clusters, 0, pid).await?;
    wave(&applier, clusters, 1, pid).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!("settled: {}", memory(pid));
    child.kill().await?;
    let log = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
    println!(
        "serve logged {} lines at RUST_LOG=warn",
        log.lines().count()
    );
    for line in log.lines().take(3) {
        println!("  {line}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
