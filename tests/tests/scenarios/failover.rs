//! The leader failover of `fault_leader.rs` (beside Cluster API core) and
//! `fault_leader_nocore.rs` (without it, where `capt-cluster` writes the Cluster): one
//! scenario, the Cluster's claims chosen by who writes the Cluster. Each binary's header says
//! what holds.

use anyhow::{Context, Result};
use capt_tests::applier::{audit_clean, binary, metric_value};
use capt_tests::system::{ClusterWriter, System, resource};
use capt_tests::{CLUSTER_V1BETA2, TestNamespace, env};
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
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
    "--lease-renew-period-seconds",
    "1",
    "--lease-retry-period-seconds",
    "1",
];
/// The claim's window: once the applier has settled on every object it writes, this long
/// without a write shows the new leader has settled.
const SETTLED_WINDOW: Duration = Duration::from_secs(3);

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
        capt_tests::mark_trusted_namespaces(&[
            capt_tests::system::TRUST_TEMPLATES.to_owned(),
            system.namespace().to_owned(),
        ])?;
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
            // As the first replica: the test's templates live in its own namespace.
            .args([capt_tests::system::TRUST_TEMPLATES, system.namespace()])
            .arg("--applier-socket")
            .arg(&system.applier.socket)
            .args((!env().core).then_some(capt_tests::system::WITHOUT_CORE))
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

/// What a watch of one object saw.
#[derive(Default, Clone)]
struct Seen {
    /// Versions watched.
    versions: usize,
    /// Per path, the versions that lacked it after one had it.
    losses: Vec<usize>,
    /// Per path, its values in order (each change once).
    values: Vec<Vec<Value>>,
    /// The last resourceVersion seen.
    last_version: String,
}

/// Watches one object named `demo` and records, for each of `paths`, its values and how many
/// versions lacked it after a version had it (a field lost, even for a moment); a value that
/// says nothing ([`is_set`]) counts as lacking.
fn watch_losses(
    api: Api<DynamicObject>,
    paths: &'static [&'static [&'static str]],
) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen {
        losses: vec![0; paths.len()],
        values: vec![Vec::new(); paths.len()],
        ..Seen::default()
    }));
    let task = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let config = watcher::Config::default().fields("metadata.name=demo");
            let mut events = watcher(api, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(obj) = event else { continue };
                let version = obj.metadata.resource_version.clone().unwrap_or_default();
                let obj = serde_json::to_value(&obj).unwrap_or_default();
                let mut seen = seen.lock().unwrap();
                seen.versions += 1;
                for (i, path) in paths.iter().enumerate() {
                    let value = path
                        .iter()
                        .try_fold(&obj, |v, p| v.get(*p))
                        .filter(|v| is_set(v));
                    match value {
                        Some(v) if seen.values[i].last() != Some(v) => {
                            seen.values[i].push(v.clone());
                        }
                        Some(_) => {}
                        None if !seen.values[i].is_empty() => seen.losses[i] += 1,
                        None => {}
                    }
                }
                seen.last_version = version;
            }
        })
    };
    (seen, task)
}

/// False for a value that says nothing: `null`, `""`, `0`, or an object of such values only
/// (core's v1beta1 view shows a Cluster without an endpoint as `{"host": "", "port": 0}`).
fn is_set(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::Object(map) => map.values().any(is_set),
        Value::Bool(_) | Value::Array(_) => true,
    }
}

/// Waits until the watch behind `seen` has seen the current version of `demo`.
async fn watch_caught_up(
    system: &System,
    api: &Api<DynamicObject>,
    seen: &Mutex<Seen>,
) -> Result<()> {
    system
        .wait_for(
            "the watch to see the object's current version",
            Duration::from_secs(10),
            || async {
                let current = api.get("demo").await?.metadata.resource_version;
                Ok(current.as_deref() == Some(seen.lock().unwrap().last_version.as_str()))
            },
        )
        .await
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

/// The controller leader killed (SIGKILL) in the middle of provisioning, with a standby
/// replica on the same Lease and the same status-applier, and the Workspace's endpoint
/// output changed while no replica leads.
pub async fn the_standby_takes_over_a_leader_killed_mid_provisioning(
    writer: ClusterWriter,
) -> Result<()> {
    writer.expect_environment()?;
    let mut f = start_leader_and_standby(writer).await?;
    let killed = kill_leader_mid_provisioning(&mut f).await?;
    assert_standby_takes_over(&f, killed).await?;
    assert_changes_followed(&f, killed).await?;
    assert_nothing_lost(&f).await?;
    let objects = assert_status_complete(&f)?;
    assert_one_owner_per_field(&f, &objects)?;
    assert_new_leader_settles(&f).await
}

/// The two replicas on one Lease and one status-applier, and the watches of the objects
/// whose fields must never be lost.
struct Failover {
    writer: ClusterWriter,
    standby: Standby,
    system: System,
    ns: TestNamespace,
    cps: Api<DynamicObject>,
    clusters: Api<DynamicObject>,
    capt_clusters: Api<DynamicObject>,
    cp_seen: Arc<Mutex<Seen>>,
    cluster_seen: Arc<Mutex<Seen>>,
    watches: [tokio::task::JoinHandle<()>; 2],
}

impl Failover {
    fn beside_core(&self) -> bool {
        self.writer == ClusterWriter::Core
    }
}

/// The control plane's paths that must never be lost.
const CP_PATHS: &[&[&str]] = &[
    &["spec", "controlPlaneEndpoint"],
    &["status", "workspaceStatus", "atProvider"],
    &["status", "phase"],
];
/// The Cluster's (in v1beta2).
const CLUSTER_PATHS: &[&[&str]] = &[
    &["spec", "controlPlaneEndpoint"],
    &["status", "initialization", "controlPlaneInitialized"],
    &["status", "phase"],
];

/// Starts the system, whose controller leads, and a standby waiting for the Lease; watches
/// the control plane and the Cluster from before provisioning.
async fn start_leader_and_standby(writer: ClusterWriter) -> Result<Failover> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "fault-leader").await?;
    let system = System::start_with(&ns.name, 300, LEASE).await?;
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

    let cps: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &resource(
            "controlplane.cluster.x-k8s.io",
            "CAPTControlPlane",
            "captcontrolplanes",
        ),
    );
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &resource("cluster.x-k8s.io", "Cluster", "clusters"),
    );
    let capt_clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &resource(
            "infrastructure.cluster.x-k8s.io",
            "CAPTCluster",
            "captclusters",
        ),
    );
    let (cp_seen, cp_watch) = watch_losses(cps.clone(), CP_PATHS);
    let (cluster_seen, cluster_watch) = watch_losses(clusters.clone(), CLUSTER_PATHS);
    Ok(Failover {
        writer,
        standby,
        system,
        ns,
        cps,
        clusters,
        capt_clusters,
        cp_seen,
        cluster_seen,
        watches: [cp_watch, cluster_watch],
    })
}

/// Provisioning starts; the leader is killed once it has rendered the control plane's
/// Workspace, while the provider is still applying it (reconciles are in flight). Returns
/// when it was killed.
async fn kill_leader_mid_provisioning(f: &mut Failover) -> Result<Instant> {
    f.system.apply_samples(false).await?;
    let (system, standby) = (&mut f.system, &f.standby);
    let ws = capt_controller::render::workspace_name(&f.ns.name, "demo-controlplane");
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
    let cluster = system
        .get(&[CLUSTER_V1BETA2, "demo"])?
        .context("the Cluster")?;
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
    Ok(killed)
}

/// While nobody leads, the provider re-applies the Workspace (a new atProvider), and the
/// endpoint output changes at its source; the standby takes the Lease within the lease's
/// duration.
async fn assert_standby_takes_over(f: &Failover, killed: Instant) -> Result<()> {
    let (system, standby) = (&f.system, &f.standby);
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
            &f.ns.name,
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
    Ok(())
}

/// The failover's change is followed, and one more after it.
async fn assert_changes_followed(f: &Failover, killed: Instant) -> Result<()> {
    let (system, writer, cp_seen) = (&f.system, f.writer, &f.cp_seen);
    // Without core capt-cluster follows the control plane's endpoint on the Cluster; beside core
    // the Cluster keeps the one core copied (it copies into a Cluster without a valid endpoint
    // only), which is one the control plane had.
    let cluster_endpoint_ok = |cluster: &Value, want: &Value| match writer {
        ClusterWriter::CaptCluster => cluster["spec"]["controlPlaneEndpoint"] == *want,
        ClusterWriter::Core => {
            let endpoint = &cluster["spec"]["controlPlaneEndpoint"];
            cp_seen.lock().unwrap().values[0].contains(endpoint)
        }
    };
    let endpoint_is = |host: &'static str, port: i64| {
        let cluster_endpoint_ok = &cluster_endpoint_ok;
        move || async move {
            let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
            let cluster = system.get(&[CLUSTER_V1BETA2, "demo"])?.unwrap();
            let want = json!({"host": host, "port": port});
            Ok(cp["spec"]["controlPlaneEndpoint"] == want
                && cluster_endpoint_ok(&cluster, &want)
                && cluster["status"]["phase"] == "Provisioned")
        }
    };
    system
        .wait_for(
            "the failover's endpoint on the control plane (and the Cluster without core), \
             Provisioned",
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
    Ok(())
}

/// Nothing lost, not even for a moment: every version up to the current ones watched.
async fn assert_nothing_lost(f: &Failover) -> Result<()> {
    let (system, beside_core) = (&f.system, f.beside_core());
    watch_caught_up(system, &f.cps, &f.cp_seen).await?;
    watch_caught_up(system, &f.clusters, &f.cluster_seen).await?;
    for w in &f.watches {
        w.abort();
    }
    let cp_seen = f.cp_seen.lock().unwrap().clone();
    let cluster_seen = f.cluster_seen.lock().unwrap().clone();
    println!(
        "watched {} control plane versions (losses of {CP_PATHS:?}: {:?}; endpoints {:?}) and \
         {} Cluster versions (losses of {CLUSTER_PATHS:?}: {:?}; endpoints {:?})",
        cp_seen.versions,
        cp_seen.losses,
        cp_seen.values[0],
        cluster_seen.versions,
        cluster_seen.losses,
        cluster_seen.values[0],
    );
    assert!(
        cp_seen.versions >= 5 && cluster_seen.versions >= 3,
        "the watches followed"
    );
    assert!(
        cp_seen
            .losses
            .iter()
            .chain(&cluster_seen.losses)
            .all(|n| *n == 0),
        "a field disappeared after it was set: control plane {:?}, Cluster {:?}",
        cp_seen.losses,
        cluster_seen.losses
    );
    if beside_core {
        let copied = &cluster_seen.values[0];
        assert!(
            copied.len() == 1 && cp_seen.values[0].contains(&copied[0]),
            "core copied one of the control plane's endpoints, once: {copied:?} of {:?}",
            cp_seen.values[0]
        );
    }
    Ok(())
}

/// The objects CAPT writes, as they ended.
struct Objects {
    cp: Value,
    cluster: Value,
    cc: Value,
}

/// Every status field the control plane had is there, and the stack is provisioned.
fn assert_status_complete(f: &Failover) -> Result<Objects> {
    let system = &f.system;
    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    let cluster = system.get(&[CLUSTER_V1BETA2, "demo"])?.unwrap();
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
    // The name Terraform got carries the namespace.
    let eks_name = capt_tests::eks_name(&f.ns.name, "demo");
    assert_eq!(at_provider["outputs"]["cluster_name"], eks_name.as_str());
    assert_eq!(cc["status"]["vpcId"], format!("vpc-{eks_name}"));
    assert_eq!(cc["status"]["ready"], true);
    let initialization = &cluster["status"]["initialization"];
    assert_eq!(initialization["infrastructureProvisioned"], true);
    assert_eq!(initialization["controlPlaneInitialized"], true);
    Ok(Objects { cp, cluster, cc })
}

/// One owner per field, as planned; no duplicate entry; no Update by a CAPT manager; the
/// ownership audit is clean.
fn assert_one_owner_per_field(f: &Failover, objects: &Objects) -> Result<()> {
    let Objects { cp, cluster, cc } = objects;
    let (writer, beside_core) = (f.writer, f.beside_core());
    let mut single = vec![
        (
            cp,
            vec!["status", "workspaceStatus", "atProvider"],
            "capt-captcontrolplane/Apply/status",
        ),
        (
            cp,
            vec!["status", "phase"],
            "capt-captcontrolplane/Apply/status",
        ),
        (
            cp,
            vec!["spec", "controlPlaneEndpoint"],
            "capt-captcontrolplane/Apply/",
        ),
        (cc, vec!["status", "vpcId"], "capt-captcluster/Apply/status"),
    ];
    match writer {
        ClusterWriter::CaptCluster => single.extend([
            (
                cluster,
                vec!["spec", "controlPlaneEndpoint"],
                "capt-cluster/Apply/",
            ),
            (
                cluster,
                vec!["status", "phase"],
                "capt-cluster/Apply/status",
            ),
            (
                cluster,
                vec!["status", "initialization", "controlPlaneInitialized"],
                "capt-cluster/Apply/status",
            ),
        ]),
        // Core writes the Cluster in v1beta2 (its managedFields name v1beta2's paths).
        ClusterWriter::Core => single.extend([
            (
                cluster,
                vec!["spec", "controlPlaneEndpoint"],
                "manager/Update/",
            ),
            (cluster, vec!["status", "phase"], "manager/Update/status"),
            (
                cluster,
                vec!["status", "initialization", "controlPlaneInitialized"],
                "manager/Update/status",
            ),
        ]),
    }
    for (obj, path, owner) in single {
        assert_eq!(
            owners(obj, &path),
            [owner],
            "{} {}: owners",
            obj["kind"],
            path.join(".")
        );
    }
    if beside_core {
        let capt_on_cluster: Vec<String> = entries(cluster)
            .iter()
            .filter(|e| {
                e["manager"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("capt-"))
                    && e["fieldsV1"].as_object().is_some_and(|f| !f.is_empty())
            })
            .map(entry_name)
            .collect();
        assert!(
            capt_on_cluster.is_empty(),
            "CAPT owns no field of a Cluster core manages: {capt_on_cluster:?}"
        );
    }
    for obj in [cp, cluster, cc] {
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
    audit_clean(&f.ns.name, &[], "the ownership audit found a violation")?;
    Ok(())
}

/// The new leader did the work, and settles: once the applier has settled on each object
/// it writes, nothing more is written.
async fn assert_new_leader_settles(f: &Failover) -> Result<()> {
    assert!(f.standby.metric("capt_intents_published_total").await? > 0.0);
    let acted = Duration::from_secs(20);
    let applier = &f.system.applier;
    applier.settled_on(&f.cps, "demo", acted).await?;
    applier.settled_on(&f.capt_clusters, "demo", acted).await?;
    if !f.beside_core() {
        applier.settled_on(&f.clusters, "demo", acted).await?;
    }
    let writes = applier
        .metric("status_applier_api_writes_total", &[])
        .await?;
    tokio::time::sleep(SETTLED_WINDOW).await;
    assert_eq!(
        applier
            .metric("status_applier_api_writes_total", &[])
            .await?
            - writes,
        0.0,
        "no more writes once converged"
    );
    Ok(())
}
