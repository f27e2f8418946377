//! One pod of the Deployment as `manifests/deploy/deployment.yaml` runs it: a status-applier
//! and a controller that elect their leader on one Lease and know the pod's name, both acting
//! as the pod's ServiceAccount. Each pod's requests carry the pod's name as an impersonated
//! user extra (`pod`), so the API server's audit log tells the pods apart
//! ([`crate::audit_log::Write::pod`]).

use crate::applier::{Applier, binary};
use crate::system::free_local_addrs;
use crate::{env, install_rbac};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The label Cluster API providers shard by (`--watch-filter`).
pub const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";

/// The ServiceAccount both containers of a pod run as (`manifests/deploy/rbac.yaml`).
pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:capt-system:capt-controller";
/// The namespace of the Lease, as deployed (the pod's own).
pub const LEASE_NAMESPACE: &str = "capt-system";

/// The Lease the pods of one test elect their leader on, and its timing.
#[derive(Clone, Debug)]
pub struct Election {
    /// The Lease's name in [`LEASE_NAMESPACE`] (one per test).
    pub lease: String,
    /// Its duration in seconds, for a test that needs a short one: renewed every second and
    /// retried every second. `None`: the timing the Deployment ships (no flag).
    pub duration_seconds: Option<u64>,
}

impl Election {
    /// The flags of this timing.
    pub fn lease_args(&self) -> Vec<String> {
        match self.duration_seconds {
            None => vec![],
            Some(duration) => [
                "--lease-duration-seconds",
                &duration.to_string(),
                "--lease-renew-period-seconds",
                "1",
                "--lease-retry-period-seconds",
                "1",
            ]
            .map(str::to_owned)
            .to_vec(),
        }
    }
}

/// A running pod; its processes are killed when dropped.
pub struct Pod {
    /// The pod's name: its identity in the Lease.
    pub name: String,
    /// Its status-applier.
    pub applier: Applier,
    controller: Option<Child>,
    controller_log: PathBuf,
    controller_starts: u32,
    /// The namespace the controller manages (`--namespace`); `None`: every namespace.
    namespace: Option<String>,
    /// The namespace whose WorkspaceTemplates it trusts.
    templates: String,
    election: Election,
    kubeconfig: PathBuf,
    /// Its shard: the value of the `cluster.x-k8s.io/watch-filter` label it manages.
    shard: Option<String>,
    /// Where the controller serves `/metrics` and its probes (plain HTTP).
    metrics_addr: String,
    probe_addr: String,
    /// Its kubeconfig's directory; after the processes, so that it goes once they have.
    _dir: crate::Scratch,
}

impl Pod {
    /// Starts the pod `name` for the objects of `namespace` (its applier first, as the
    /// controller needs its socket), with the RBAC of the manifests installed.
    pub async fn start(name: &str, namespace: &str, election: &Election) -> Result<Self> {
        Self::start_in_shard(name, namespace, election, None).await
    }

    /// [`Pod::start`] for one shard: the controller with `--watch-filter <shard>`, the applier
    /// watching only the objects labelled `cluster.x-k8s.io/watch-filter=<shard>`, as
    /// `docs/performance.md` says to run one Deployment per shard (each with a Lease of its
    /// own: `election`).
    pub async fn start_in_shard(
        name: &str,
        namespace: &str,
        election: &Election,
        shard: Option<&str>,
    ) -> Result<Self> {
        Self::start_scoped(name, (Some(namespace), namespace), election, shard).await
    }

    /// [`Pod::start_in_shard`] managing the shard's objects of every namespace, as a
    /// Deployment without `--namespace` does (every tenant's objects, sharded by label), with
    /// the WorkspaceTemplates of `templates` trusted.
    pub async fn start_in_shard_everywhere(
        name: &str,
        election: &Election,
        shard: &str,
        templates: &str,
    ) -> Result<Self> {
        Self::start_scoped(name, (None, templates), election, Some(shard)).await
    }

    /// A pod managing `namespace` (every one when `None`), trusting the templates of
    /// `templates`.
    async fn start_scoped(
        name: &str,
        (namespace, templates): (Option<&str>, &str),
        election: &Election,
        shard: Option<&str>,
    ) -> Result<Self> {
        install_rbac()?;
        let scratch = format!("{}-{name}", namespace.unwrap_or(&election.lease));
        let dir = crate::Scratch::new(&scratch)?;
        let kubeconfig = pod_kubeconfig(name, &dir)?;
        let mut applier_args = vec![
            "--leader-election-lease".to_owned(),
            election.lease.clone(),
            "--leader-election-namespace".to_owned(),
            LEASE_NAMESPACE.to_owned(),
            "--leader-election-identity".to_owned(),
            name.to_owned(),
        ];
        if let Some(shard) = shard {
            applier_args.push("--watch-label-selector".to_owned());
            applier_args.push(format!("{WATCH_FILTER_LABEL}={shard}"));
        }
        let applier_args: Vec<&str> = applier_args.iter().map(String::as_str).collect();
        let applier = Applier::start_as(&applier_args, &kubeconfig).await?;
        let mut pod = Self {
            name: name.to_owned(),
            controller_log: applier.socket.with_file_name("controller.log"),
            applier,
            controller: None,
            controller_starts: 0,
            namespace: namespace.map(str::to_owned),
            templates: templates.to_owned(),
            election: election.clone(),
            kubeconfig,
            shard: shard.map(str::to_owned),
            metrics_addr: String::new(),
            probe_addr: String::new(),
            _dir: dir,
        };
        pod.start_controller()?;
        Ok(pod)
    }

    /// Starts the controller container (again, after [`Pod::kill_controller`]: as the kubelet
    /// restarts it, with the same pod name and a log of its own).
    pub fn start_controller(&mut self) -> Result<()> {
        self.controller_starts += 1;
        self.controller_log = self
            .applier
            .socket
            .with_file_name(format!("controller-{}.log", self.controller_starts));
        let [metrics_addr, probe_addr] = free_local_addrs()?;
        crate::mark_trusted_namespaces(&[
            crate::system::TRUST_TEMPLATES.to_owned(),
            self.templates.clone(),
        ])?;
        let child = Command::new(binary("capt-controller"))
            .args(
                self.namespace
                    .iter()
                    .flat_map(|ns| ["--namespace", ns.as_str()]),
            )
            .args(["--leader-election-namespace", LEASE_NAMESPACE])
            .args(["--leader-election-lease", &self.election.lease])
            .args(self.election.lease_args())
            .args(["--insecure-diagnostics", "--poll-interval-seconds", "1"])
            // The tests keep their templates beside their stacks: trusted explicitly.
            .args([crate::system::TRUST_TEMPLATES, &self.templates])
            .args(["--metrics-bind-address", &metrics_addr])
            .args(["--health-probe-bind-address", &probe_addr])
            .arg("--applier-socket")
            .arg(&self.applier.socket)
            .args((!crate::env().core).then_some(crate::system::WITHOUT_CORE))
            .args(
                self.shard
                    .iter()
                    .flat_map(|shard| ["--watch-filter", shard.as_str()]),
            )
            .env("POD_NAME", &self.name)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", crate::process_log("info"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&self.controller_log)?)
            .spawn()
            .context("starting capt-controller")?;
        self.controller = Some(child);
        (self.metrics_addr, self.probe_addr) = (metrics_addr, probe_addr);
        Ok(())
    }

    /// The controller's `/readyz`: its HTTP status and body.
    pub async fn controller_readyz(&self) -> Result<(u16, String)> {
        crate::system::plain_get(&self.probe_addr, "/readyz").await
    }

    /// The controller's `/metrics` text.
    pub async fn controller_metrics_text(&self) -> Result<String> {
        let (status, body) = crate::system::plain_get(&self.metrics_addr, "/metrics").await?;
        anyhow::ensure!(
            status == 200,
            "the controller's /metrics answered {status}: {body}"
        );
        Ok(body)
    }

    /// Kills the controller container (SIGKILL, like a crash); the applier stays up.
    pub fn kill_controller(&mut self) {
        if let Some(mut child) = self.controller.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`) to the controller.
    pub fn signal_controller(&self, signal: &str) -> Result<()> {
        let child = self.controller.as_ref().context("no controller runs")?;
        signal_process(child.id(), signal)
    }

    /// Whether the controller process started last is still running (a lost or lapsed lead
    /// is no exit).
    pub fn controller_running(&mut self) -> Result<bool> {
        match &mut self.controller {
            Some(child) => Ok(child.try_wait()?.is_none()),
            None => Ok(false),
        }
    }

    /// How many times the controller was started (1: never restarted).
    pub fn controller_starts(&self) -> u32 {
        self.controller_starts
    }

    /// Waits until the controller has exited (on SIGTERM), at most `timeout`.
    pub async fn controller_exit(&mut self, timeout: std::time::Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        while let Some(child) = &mut self.controller {
            if child.try_wait()?.is_some() {
                self.controller = None;
                break;
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "{}'s controller still runs after {timeout:?}:\n{}",
                self.name,
                self.controller_log_text()
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// The pod deleted: SIGTERM to both containers, and wait for them to end.
    pub fn terminate(&mut self) -> Result<()> {
        if let Some(mut child) = self.controller.take() {
            signal_process(child.id(), "TERM")?;
            child.wait()?;
        }
        self.applier.terminate()
    }

    /// What the controller logged since it last started.
    pub fn controller_log_text(&self) -> String {
        std::fs::read_to_string(&self.controller_log).unwrap_or_default()
    }

    /// The kubeconfig both containers use.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        if let Some(child) = &self.controller {
            // A stopped process would not die of SIGKILL until continued.
            let _ = signal_process(child.id(), "CONT");
        }
        self.kill_controller();
        if std::thread::panicking() {
            eprintln!(
                "--- {} controller log:\n{}",
                self.name,
                self.controller_log_text()
            );
        }
    }
}

fn signal_process(pid: u32, signal: &str) -> Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()?;
    anyhow::ensure!(status.success(), "kill -{signal} {pid} failed");
    Ok(())
}

/// A kubeconfig that acts as the pod's ServiceAccount, with the pod's name as the user extra
/// `pod` (what the audit log shows as `impersonatedUser.extra.pod`).
pub fn pod_kubeconfig(pod: &str, dir: &Path) -> Result<PathBuf> {
    let text = std::fs::read_to_string(&env().kubeconfig)?;
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let users = config["users"]
        .as_sequence_mut()
        .context("kubeconfig has users")?;
    for u in users {
        u["user"]["as"] = serde_yaml::Value::from(SERVICE_ACCOUNT);
        u["user"]["as-user-extra"] = serde_yaml::from_str(&format!("{{pod: [{pod}]}}"))?;
    }
    std::fs::create_dir_all(dir)?;
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&config)?)?;
    Ok(path)
}
