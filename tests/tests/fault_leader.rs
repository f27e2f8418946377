//! The controller leader killed (SIGKILL) in the middle of provisioning, with a standby
//! replica on the same Lease and the same status-applier, and the Workspace's endpoint
//! output changed while no replica leads. What must hold:
//!
//! - the standby takes over within the lease duration plus a margin, and the Lease names it;
//! - the system converges: the Cluster is Provisioned, and the endpoints of the control plane
//!   and of the Cluster are the Workspace's last `cluster_endpoint` (changed during the
//!   failover, and once more after it);
//! - no field is lost: no watched version of the control plane or the Cluster lacks
//!   `atProvider`, the endpoint, the phase or `initialization.controlPlaneInitialized` once it
//!   was set; the control plane ends with every status field of a provisioned control plane,
//!   its `atProvider` mirrors the Workspace, its `spec.controlPlaneEndpoint` is set, and the
//!   CAPTCluster keeps its `vpcId`;
//! - ownership stays single: each protected path and each status field CAPT writes has
//!   exactly the one owner of the ownership plan, no managedFields entry is duplicated, no
//!   CAPT manager ever wrote with an Update, and `status-applier audit` finds no violation;
//! - the new leader settles: no more writes once converged.

use anyhow::{Context, Result};
use capt_tests::applier::{binary, metric_value};
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LEASE_SECONDS: u64 = 3;
const LEASE: &[&str] = &[
    "--lease-duration-seconds",
    "3",
    "--lease-grace-seconds",
    "1",
];

/// A second controller replica, killed when dropped.
struct Standby {
    child: Child,
    log: std::path::PathBuf,
    addr: String,
}

impl Standby {
    fn start(system: &System) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let log = system
            .applier
            .socket
            .with_file_name("controller-standby.log");
        let child = Command::new(binary("capt-controller"))
            .args([
                "--namespace",
                system.namespace(),
                "--leader-election-namespace",
                system.namespace(),
                "--insecure-diagnostics",
                "--metrics-bind-address",
                &addr,
                "--health-probe-bind-address",
                "127.0.0.1:0",
                "--poll-interval-seconds",
                "1",
            ])
            .args(LEASE)
            .arg("--applier-socket")
            .arg(&system.applier.socket)
            .env("KUBECONFIG", &env().kubeconfig)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        Ok(Self { child, log, addr })
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn metric(&self, name: &str) -> Result<f64> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(&self.addr).await?;
        stream
            .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).as_bytes())
            .await?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await?;
        metric_value(&body, name, &[])
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- standby controller log:\n{}", self.log_text());
        }
    }
}

/// Versions watched, and per path the versions that lacked it after one had it.
type Losses = Arc<Mutex<(usize, Vec<usize>)>>;

/// Watches one object named `demo` and records, for each of `paths`, how many versions
/// lacked it after a version had it (a field lost, even for a moment).
fn watch_losses(
    api: Api<DynamicObject>,
    paths: &'static [&'static [&'static str]],
) -> (Losses, tokio::task::JoinHandle<()>) {
    let counts = Arc::new(Mutex::new((0, vec![0; paths.len()])));
    let task = {
        let counts = counts.clone();
        tokio::spawn(async move {
            let config = watcher::Config::default().fields("metadata.name=demo");
            let mut events = watcher(api, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            let mut had = vec![false; paths.len()];
            while let Some(event) = events.next().await {
                let Ok(obj) = event else { continue };
                let obj = serde_json::to_value(&obj).unwrap_or_default();
                let mut counts = counts.lock().unwrap();
                counts.0 += 1;
                for (i, path) in paths.iter().enumerate() {
                    let present = path.iter().try_fold(&obj, |v, p| v.get(*p)).is_some();
                    if present {
                        had[i] = true;
                    } else if had[i] {
                        counts.1[i] += 1;
                    }
                }
            }
        })
    };
    (counts, task)
}

/// The managers (with operation and subresource) whose managedFields entry holds `path`.
fn owners(obj: &Value, path: &[&str]) -> Vec<String> {
    entries(obj)
        .iter()
        .filter(|e| {
            path.iter()
                .try_fold(&e["fieldsV1"], |v, p| v.get(format!("f:{p}")))
                .is_some()
        })
        .map(entry_name)
        .collect()
}

fn entries(obj: &Value) -> Vec<Value> {
    obj["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn entry_name(e: &Value) -> String {
    format!(
        "{}/{}/{}",
        e["manager"].as_str().unwrap_or(""),
        e["operation"].as_str().unwrap_or(""),
        e["subresource"].as_str().unwrap_or("")
    )
}

#[tokio::test]
async fn the_standby_takes_over_a_leader_killed_mid_provisioning_and_nothing_is_lost() -> Result<()>
{
    capt_tests::without_core(); // capt-cluster writes the Cluster only where core does not
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-leader").await?;
    let mut system = System::start_with(&ns.name, 300, LEASE).await?;
    system
        .wait_for(
            "the first replica to lead",
            Duration::from_secs(10),
            || async { Ok(system.controller_log_text().contains("Leading")) },
        )
        .await?;
    let standby = Standby::start(&system)?;
    system
        .wait_for(
            "the standby waiting for the lease",
            Duration::from_secs(20),
            || async { Ok(standby.log_text().contains("Waiting for the leader lease")) },
        )
        .await?;

    // Provisioning starts; the leader is killed once it has rendered the control plane's
    // Workspace, while the provider is still applying it (reconciles are in flight).
    // Without core the Cluster is served in v1beta2 alone (`hack/testenv.sh`).
    let gvk = |group: &str, kind: &str, plural: &str| {
        let version = if group == "cluster.x-k8s.io" {
            "v1beta2"
        } else {
            "v1beta1"
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    };
    const CP_PATHS: &[&[&str]] = &[
        &["status", "workspaceStatus", "atProvider"],
        &["spec", "controlPlaneEndpoint"],
        &["status", "phase"],
    ];
    const CLUSTER_PATHS: &[&[&str]] = &[
        &["spec", "controlPlaneEndpoint"],
        &["status", "initialization", "controlPlaneInitialized"],
    ];
    let (cp_losses, cp_watch) = watch_losses(
        Api::namespaced_with(
            client.clone(),
            &ns.name,
            &gvk(
                "controlplane.cluster.x-k8s.io",
                "CAPTControlPlane",
                "captcontrolplanes",
            ),
        ),
        CP_PATHS,
    );
    let (cluster_losses, cluster_watch) = watch_losses(
        Api::namespaced_with(
            client.clone(),
            &ns.name,
            &gvk("cluster.x-k8s.io", "Cluster", "clusters"),
        ),
        CLUSTER_PATHS,
    );
    system.apply_samples(false).await?;
    let ws = capt_controller::render::workspace_name(&ns.name, "demo-controlplane");
    system
        .wait_for(
            "the leader to render the control plane's Workspace",
            Duration::from_secs(30),
            || async {
                Ok(env()
                    .kubectl_run(&["get", "workspace", &ws], None)?
                    .status
                    .success())
            },
        )
        .await?;
    let reconciles = system
        .controller_metric("capt_reconciles_total", &[])
        .await?;
    let killed = Instant::now();
    system.kill_controller();
    let cluster = system.get(&["cluster", "demo"])?.context("the Cluster")?;
    println!(
        "leader killed after {reconciles} reconciles; Cluster phase then: {}",
        cluster["status"]["phase"]
    );
    assert_ne!(
        cluster["status"]["phase"], "Provisioned",
        "the leader was killed mid-provisioning"
    );
    assert_eq!(
        standby.metric("capt_reconciles_total").await?,
        0.0,
        "the standby reconciled while the leader led"
    );

    // While nobody leads, the provider re-applies the Workspace (a new atProvider), and the
    // endpoint output changes at its source.
    system.set_revision("during-failover")?;
    system.set_endpoint_output("https://failover.example.com:6443")?;
    system
        .wait_for(
            "the standby to lead",
            Duration::from_secs(LEASE_SECONDS + 10),
            || async { Ok(standby.log_text().contains("Leading")) },
        )
        .await?;
    let takeover = killed.elapsed();
    println!(
        "takeover after {:.1} s (lease {LEASE_SECONDS} s)",
        takeover.as_secs_f64()
    );
    assert!(
        takeover <= Duration::from_secs(LEASE_SECONDS + 2),
        "the standby took over after {takeover:?}, lease {LEASE_SECONDS} s"
    );
    let holder = env().kubectl_ok(
        &[
            "get",
            "lease",
            "capt-controller",
            "-n",
            &ns.name,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
        None,
    )?;
    assert_eq!(
        holder,
        format!("capt-controller-{}", standby.child.id()),
        "the Lease names the standby"
    );

    // The failover's change is followed, and one more after it.
    let endpoint_is = |host: &'static str, port: i64| {
        let system = &system;
        move || async move {
            let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
            let cluster = system.get(&["cluster", "demo"])?.unwrap();
            let want = json!({"host": host, "port": port});
            Ok(cp["spec"]["controlPlaneEndpoint"] == want
                && cluster["spec"]["controlPlaneEndpoint"] == want
                && cluster["status"]["phase"] == "Provisioned")
        }
    };
    system
        .wait_for(
            "the failover's endpoint on the control plane and the Cluster, Provisioned",
            Duration::from_secs(30),
            endpoint_is("failover.example.com", 6443),
        )
        .await?;
    system
        .wait_mirrored("during-failover", Duration::from_secs(10))
        .await?;
    system.set_endpoint_output("https://after-failover.example.com")?;
    system
        .wait_for(
            "the endpoint changed after the failover",
            Duration::from_secs(30),
            endpoint_is("after-failover.example.com", 443),
        )
        .await?;
    // provider-terraform's apply leaves the outputs in atProvider without a checksum; its next
    // Observe (the poll) adds the checksum of the applied configuration.
    system
        .wait_for(
            "atProvider to mirror the last output and the next observation's checksum",
            Duration::from_secs(10),
            || async {
                let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
                let at_provider = &cp["status"]["workspaceStatus"]["atProvider"];
                Ok(at_provider["outputs"]["cluster_endpoint"]
                    == "https://after-failover.example.com"
                    && at_provider["checksum"].is_string())
            },
        )
        .await?;
    println!(
        "converged {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );

    // Nothing lost, not even for a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    cp_watch.abort();
    cluster_watch.abort();
    let (cp_seen, cp_lost) = cp_losses.lock().unwrap().clone();
    let (cluster_seen, cluster_lost) = cluster_losses.lock().unwrap().clone();
    println!(
        "watched {cp_seen} control plane versions (losses of {CP_PATHS:?}: {cp_lost:?}) and \
         {cluster_seen} Cluster versions (losses of {CLUSTER_PATHS:?}: {cluster_lost:?})"
    );
    assert!(cp_seen >= 5 && cluster_seen >= 3, "the watches followed");
    assert!(
        cp_lost.iter().chain(&cluster_lost).all(|n| *n == 0),
        "a field disappeared after it was set: control plane {cp_lost:?}, Cluster {cluster_lost:?}"
    );
    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    let cluster = system.get(&["cluster", "demo"])?.unwrap();
    let cc = system.get(&["captcluster", "demo"])?.unwrap();
    let status_keys: BTreeSet<&str> = cp["status"]
        .as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default();
    println!("control plane status fields: {status_keys:?}");
    for key in [
        "ready",
        "initialized",
        "phase",
        "version",
        "workspaceTemplateStatus",
        "workspaceStatus",
        "conditions",
    ] {
        assert!(
            status_keys.contains(key),
            "status.{key} lost: {}",
            cp["status"]
        );
    }
    assert_eq!(cp["status"]["phase"], "Ready");
    assert_eq!(cp["status"]["ready"], true);
    let at_provider = &cp["status"]["workspaceStatus"]["atProvider"];
    assert!(at_provider["checksum"].is_string(), "{at_provider}");
    assert_eq!(at_provider["outputs"]["cluster_name"], "demo");
    assert_eq!(cc["status"]["vpcId"], "vpc-demo");
    assert_eq!(cc["status"]["ready"], true);
    let initialization = &cluster["status"]["initialization"];
    assert_eq!(initialization["infrastructureProvisioned"], true);
    assert_eq!(initialization["controlPlaneInitialized"], true);

    // One owner per field, as planned; no duplicate entry; no Update by a CAPT manager.
    let single = [
        (
            &cp,
            vec!["status", "workspaceStatus", "atProvider"],
            "capt-captcontrolplane/Apply/status",
        ),
        (
            &cp,
            vec!["status", "phase"],
            "capt-captcontrolplane/Apply/status",
        ),
        (
            &cp,
            vec!["spec", "controlPlaneEndpoint"],
            "capt-captcontrolplane/Apply/",
        ),
        (
            &cluster,
            vec!["spec", "controlPlaneEndpoint"],
            "capt-cluster/Apply/",
        ),
        (
            &cluster,
            vec!["status", "phase"],
            "capt-cluster/Apply/status",
        ),
        (
            &cluster,
            vec!["status", "initialization", "controlPlaneInitialized"],
            "capt-cluster/Apply/status",
        ),
        (
            &cc,
            vec!["status", "vpcId"],
            "capt-captcluster/Apply/status",
        ),
    ];
    for (obj, path, owner) in single {
        assert_eq!(
            owners(obj, &path),
            [owner],
            "{} {}: owners",
            obj["kind"],
            path.join(".")
        );
    }
    for obj in [&cp, &cluster, &cc] {
        let names: Vec<String> = entries(obj).iter().map(entry_name).collect();
        let unique: BTreeSet<&String> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "duplicate entries: {names:?}");
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with("capt-") && n.contains("/Update/")),
            "a CAPT manager wrote with an Update: {names:?}"
        );
    }
    let audit = Command::new(binary("status-applier"))
        .args(["audit", "-n", &ns.name])
        .arg("--policy")
        .arg(capt_tests::applier::capt_policy())
        .env("KUBECONFIG", &env().kubeconfig)
        .output()?;
    assert!(
        audit.status.success(),
        "the ownership audit found a violation:\n{}{}",
        String::from_utf8_lossy(&audit.stdout),
        String::from_utf8_lossy(&audit.stderr)
    );

    // The new leader did the work, and settles.
    assert!(standby.metric("capt_intents_published_total").await? > 0.0);
    assert_eq!(
        system
            .applier
            .writes_over(Duration::from_secs(2), Duration::from_secs(3))
            .await?,
        0.0,
        "no more writes once converged"
    );
    Ok(())
}
