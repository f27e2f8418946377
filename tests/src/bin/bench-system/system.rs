//! The system of one round: the fake provider (as deployed: its default 10 min poll, one
//! Workspace at a time), and either the Deployment's pods (each a status-applier and a
//! capt-controller, from `deployed`; as many as its replicas, one leading) or the baseline
//! (`upstream`: this binary as a process of its own). Each round has fresh pod names; a
//! restart keeps them.

use crate::deployed::{APPLIER, Launch, MANAGER, Pod, Process};
use crate::identity::{self, Identity};
use crate::{Args, Mode};
use anyhow::{Context, Result, bail};
use capt_tests::fake_provider::FakeProvider;
use capt_tests::pod::WATCH_FILTER_LABEL;
use status_applier::client::Client;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One pod's processes: its status-applier (sidecar mode) and its controller.
pub(crate) struct PodProcesses {
    /// The pod's name (`POD_NAME`): its identity in the leader Lease.
    pub(crate) name: String,
    pub(crate) controller: Process,
    pub(crate) applier: Option<Process>,
}

impl PodProcesses {
    /// Starts the pod's containers as the Deployment runs them, the applier first.
    fn start(
        mode: Mode,
        pod: &Pod,
        dir: &Path,
        name: &str,
        shard: Option<&str>,
        identities: &mut Vec<(String, String)>,
        launches: &mut Vec<Launch>,
    ) -> Result<Self> {
        let (applier_extra, controller_extra) = shard_flags(shard);
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir)?;
        let applier = match mode {
            Mode::Sidecar => {
                let id = identity::pod(&pod.namespace, &dir, APPLIER)?;
                let launch = pod.launch(APPLIER, &dir, name, &id.kubeconfig, &applier_extra)?;
                identities.push((process_name(name, APPLIER), id.credential_id));
                launches.push(launch.clone());
                Some(Process::start(launch, &dir)?)
            }
            Mode::Baseline => None,
        };
        let (id, launch) = match mode {
            Mode::Sidecar => {
                let id = identity::pod(&pod.namespace, &dir, "controller")?;
                let launch = pod.launch(MANAGER, &dir, name, &id.kubeconfig, &controller_extra)?;
                (id, launch)
            }
            Mode::Baseline => {
                let id = identity::baseline(&pod.namespace, &dir)?;
                let launch = upstream_launch(&id.kubeconfig)?;
                (id, launch)
            }
        };
        identities.push((process_name(name, "capt-controller"), id.credential_id));
        launches.push(launch.clone());
        let controller = Process::start(launch, &dir)?;
        Ok(Self {
            name: name.to_owned(),
            controller,
            applier,
        })
    }

    async fn ready(&self) -> bool {
        match &self.applier {
            Some(applier) => {
                applier.probe("/readyz").await == 200
                    && self.controller.probe("/readyz").await == 200
            }
            None => self.controller.probe("/healthz").await == 200,
        }
    }

    fn alive(&self) -> bool {
        self.controller.running()
    }

    fn leads(&self) -> bool {
        self.controller.log_text().contains("Leading")
    }

    /// SIGKILL to every container, as when the node loses the pod.
    pub(crate) fn kill(&mut self) {
        self.controller.kill();
        if let Some(a) = &mut self.applier {
            a.kill();
        }
    }
}

/// The flags that make a pod one shard's (`docs/performance-history.md`, "Sharding, measured"): the applier's
/// and the controller's, each narrowed to the shard's label, on a Lease of the shard's own.
fn shard_flags(shard: Option<&str>) -> (Vec<String>, Vec<String>) {
    let Some(shard) = shard else {
        return (vec![], vec![]);
    };
    let lease = [
        "--leader-election-lease".to_owned(),
        format!("capt-controller-{shard}"),
    ];
    let mut applier = vec![
        "--watch-label-selector".to_owned(),
        format!("{WATCH_FILTER_LABEL}={shard}"),
    ];
    applier.extend(lease.clone());
    let mut controller = vec!["--watch-filter".to_owned(), shard.to_owned()];
    controller.extend(lease);
    (applier, controller)
}

/// The baseline's process: this binary with `upstream::FLAG`, its probes and metrics on
/// free local ports.
fn upstream_launch(kubeconfig: &Path) -> Result<Launch> {
    let probe = capt_tests::system::free_local_addr()?;
    let metrics = capt_tests::system::free_local_addr()?;
    Ok(Launch {
        container: "baseline".into(),
        program: std::env::current_exe()?,
        args: vec![crate::upstream::FLAG.into()],
        env: vec![
            ("KUBECONFIG".into(), kubeconfig.display().to_string()),
            (crate::upstream::PROBE_ENV.into(), probe.clone()),
            (crate::upstream::METRICS_ENV.into(), metrics.clone()),
            ("RUST_LOG".into(), "info".into()),
        ],
        probe_addr: Some(probe),
        metrics_addr: Some(metrics),
        changes: vec![],
    })
}

/// How the tables name a process: `<process>` for the first pod's, `<process> (<pod>)` for
/// the others'.
pub(crate) fn process_name(pod: &str, process: &str) -> String {
    match pod.strip_suffix("-a") {
        Some(_) => process.to_owned(),
        None => format!("{process} ({pod})"),
    }
}

pub(crate) struct BenchSystem {
    /// Kept for its lifetime: dropped, it is killed. Shards share one, started apart.
    _provider: Option<FakeProvider>,
    /// The Deployment's replicas (the baseline: one). The first leads when the round starts;
    /// `leader` follows the Lease through `fail_over`.
    pub(crate) pods: Vec<PodProcesses>,
    leader: usize,
    /// (process, credential id): who sent what, in the audit log.
    pub(crate) identities: Vec<(String, String)>,
    /// What changed from the Deployment, per container.
    pub(crate) launches: Vec<Launch>,
    scraper: Identity,
}

impl BenchSystem {
    /// Starts the fake provider and the pods: the first alone until it leads, so that the
    /// round knows which pod writes, then the others (sidecar mode: as many as the
    /// Deployment's replicas), which stand by.
    pub(crate) async fn start(args: &Args, mode: Mode, pod: &Pod, dir: &Path) -> Result<Self> {
        let provider = start_provider(args).await?;
        Self::start_pods(mode, pod, dir, Some(provider), None).await
    }

    /// The Deployment's pods of one shard (sidecar mode), beside a provider started apart
    /// ([`start_provider`]): each pod's pod name carries the shard.
    pub(crate) async fn start_shard(pod: &Pod, dir: &Path, shard: &str) -> Result<Self> {
        Self::start_pods(Mode::Sidecar, pod, dir, None, Some(shard)).await
    }

    async fn start_pods(
        mode: Mode,
        pod: &Pod,
        dir: &Path,
        provider: Option<FakeProvider>,
        shard: Option<&str>,
    ) -> Result<Self> {
        identity::install(&pod.namespace)?;
        // The controller refuses to start without the namespace it trusts with code.
        let client = capt_tests::env().client().await?;
        crate::stacks::create_template_namespace(&client, &pod.template_namespace()?).await?;
        let scraper = identity::scraper(&pod.namespace, dir)?;
        let replicas = match mode {
            Mode::Sidecar => pod.replicas.max(1) as usize,
            Mode::Baseline => 1,
        };
        let mut identities = Vec::new();
        let mut launches = Vec::new();
        let mut system = Self {
            _provider: provider,
            pods: Vec::new(),
            leader: 0,
            identities: Vec::new(),
            launches: Vec::new(),
            scraper,
        };
        for i in 0..replicas {
            let name = format!(
                "capt-controller-bench-{}-{}{}",
                std::process::id(),
                shard.map(|s| format!("{s}-")).unwrap_or_default(),
                char::from(b'a' + i as u8)
            );
            // The tables list the first pod's launches: the others differ only in the pod's
            // name, their local paths and ports.
            let mut pod_launches = Vec::new();
            let processes = PodProcesses::start(
                mode,
                pod,
                dir,
                &name,
                shard,
                &mut identities,
                &mut pod_launches,
            )?;
            if i == 0 {
                launches = pod_launches;
            }
            system.pods.push(processes);
            let timeout = Duration::from_secs(60);
            if i == 0 {
                system.wait_ready(timeout).await?;
            } else {
                system.wait_standby(i, timeout).await?;
            }
        }
        system.identities = identities;
        system.launches = launches;
        Ok(system)
    }

    /// The pod that leads.
    pub(crate) fn leader(&self) -> &PodProcesses {
        &self.pods[self.leader]
    }

    /// The pods that stand by.
    pub(crate) fn standbys(&self) -> impl Iterator<Item = &PodProcesses> {
        let leader = self.leader;
        self.pods
            .iter()
            .enumerate()
            .filter(move |(i, _)| *i != leader)
            .map(|(_, p)| p)
    }

    /// Waits until the standby pod `i` answers its probes (a standby is ready: its applier
    /// keeps its caches warm) and its controller waits for the Lease.
    async fn wait_standby(&self, i: usize, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let pod = &self.pods[i];
        loop {
            if pod.ready().await && pod.controller.log_text().contains("Waiting for the leader") {
                if pod.leads() {
                    bail!(
                        "the standby pod {} leads beside {}",
                        pod.name,
                        self.leader().name
                    );
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the standby pod {} was not ready within {timeout:?}\n--- controller log:\n{}",
                    pod.name,
                    pod.controller.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every live pod answers its probes (`/readyz` of both processes in the
    /// sidecar mode; `/healthz` in the baseline's, whose `/readyz` asks the applier it does
    /// not have) and one pod's controller leads, which becomes the leader. Returns (ready,
    /// leading) times.
    pub(crate) async fn wait_ready(&mut self, timeout: Duration) -> Result<(Instant, Instant)> {
        let deadline = Instant::now() + timeout;
        let (mut ready, mut leading) = (None, None);
        loop {
            let now = Instant::now();
            if ready.is_none() && self.ready().await {
                ready = Some(now);
            }
            if leading.is_none()
                && let Some(i) = self.pods.iter().position(|p| p.alive() && p.leads())
            {
                self.leader = i;
                leading = Some(now);
            }
            if let (Some(r), Some(l)) = (ready, leading) {
                return Ok((r, l));
            }
            if now > deadline {
                bail!(
                    "the system was not ready and leading within {timeout:?}\n--- controller log:\n{}",
                    self.leader().controller.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn ready(&self) -> bool {
        for pod in self.pods.iter().filter(|p| p.alive()) {
            if !pod.ready().await {
                return false;
            }
        }
        true
    }

    pub(crate) async fn controller_metrics(&self) -> Result<String> {
        self.leader().controller.metrics(&self.scraper.token).await
    }

    /// The metrics of `pod`'s controller, leading or not.
    pub(crate) async fn controller_metrics_of(&self, pod: &PodProcesses) -> Result<String> {
        pod.controller.metrics(&self.scraper.token).await
    }

    pub(crate) async fn applier_metrics(&self) -> Result<Option<String>> {
        match &self.leader().applier {
            Some(a) => Ok(Some(a.metrics(&self.scraper.token).await?)),
            None => Ok(None),
        }
    }

    /// A client of the leading applier's socket (the Deployment's socket path, made local).
    pub(crate) fn applier_client(&self) -> Result<Client> {
        let applier = self
            .leader()
            .applier
            .as_ref()
            .context("no status-applier")?;
        let socket: PathBuf = applier
            .launch
            .env
            .iter()
            .find(|(k, _)| k == "STATUS_APPLIER_SOCKET")
            .map(|(_, v)| v.into())
            .context("the applier's STATUS_APPLIER_SOCKET")?;
        Ok(Client::new(socket))
    }

    /// Kills the leading pod's processes and starts them again the same way (applier first,
    /// then the controller, without waiting between them, as a pod's containers start): the
    /// pod keeps its name, so its controller may take the Lease back before it expires.
    pub(crate) fn restart(&mut self) -> Result<()> {
        let pod = &mut self.pods[self.leader];
        pod.kill();
        if let Some(a) = &mut pod.applier {
            a.restart()?;
        }
        pod.controller.restart()
    }

    /// Kills the leading pod for good (the node lost it, or it was deleted): a standby pod
    /// takes the Lease once it expires. Returns the killed pod's name.
    pub(crate) fn kill_leader(&mut self) -> String {
        let pod = &mut self.pods[self.leader];
        pod.kill();
        pod.name.clone()
    }
}

/// The fake provider as provider-terraform runs by default: the poll interval and the
/// backoff are the binary's defaults; the apply time is the benchmark's, and so is the
/// reconcile rate (its default is provider-terraform's, 1).
pub(crate) async fn start_provider(args: &Args) -> Result<FakeProvider> {
    let delay = args.provider_delay_ms.to_string();
    let rate = args.provider_max_reconcile_rate.to_string();
    let filter = std::env::var("FAKE_PROVIDER_LOG").unwrap_or_else(|_| "info".to_owned());
    FakeProvider::start_as(
        &["--delay-ms", &delay, "--max-reconcile-rate", &rate],
        &filter,
        &capt_tests::env().kubeconfig,
    )
    .await
}
