//! The system of one round: the fake provider (as deployed: its default 10 min poll, one
//! Workspace at a time), and either the pod as deployed (status-applier + capt-controller,
//! from `deployed`) or the naive baseline (the `manager` container alone, plus
//! `--baseline-full-update`). Each round has a fresh pod name; a restart keeps it.

use crate::deployed::{APPLIER, Launch, MANAGER, Pod, Process};
use crate::identity::{self, Identity};
use crate::{Args, Mode};
use anyhow::{Context, Result, bail};
use capt_tests::fake_provider::FakeProvider;
use status_applier::client::Client;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub(crate) struct BenchSystem {
    /// Kept for its lifetime: dropped, it is killed.
    _provider: FakeProvider,
    pub(crate) controller: Process,
    pub(crate) applier: Option<Process>,
    /// (process, credential id): who sent what, in the audit log.
    pub(crate) identities: Vec<(String, String)>,
    /// What changed from the Deployment, per container.
    pub(crate) launches: Vec<Launch>,
    scraper: Identity,
}

impl BenchSystem {
    pub(crate) async fn start(args: &Args, mode: Mode, pod: &Pod, dir: &Path) -> Result<Self> {
        identity::install(&pod.namespace)?;
        let scraper = identity::scraper(&pod.namespace, dir)?;
        let delay = args.provider_delay_ms.to_string();
        let rate = args.provider_max_reconcile_rate.to_string();
        let filter = std::env::var("FAKE_PROVIDER_LOG").unwrap_or_else(|_| "info".to_owned());
        // As provider-terraform runs by default: the poll interval and the backoff are the
        // binary's defaults; the apply time is the benchmark's, and so is the reconcile rate
        // (its default is provider-terraform's, 1).
        let provider = FakeProvider::start_as(
            &["--delay-ms", &delay, "--max-reconcile-rate", &rate],
            &filter,
            &capt_tests::env().kubeconfig,
        )
        .await?;
        let pod_name = format!("capt-controller-bench-{}", std::process::id());
        let mut identities = Vec::new();
        let mut launches = Vec::new();
        let applier = match mode {
            Mode::Sidecar => {
                let id = identity::pod(&pod.namespace, dir, APPLIER)?;
                let launch = pod.launch(APPLIER, dir, &pod_name, &id.kubeconfig, &[])?;
                identities.push((APPLIER.to_owned(), id.credential_id));
                launches.push(launch.clone());
                Some(Process::start(launch, dir)?)
            }
            Mode::Baseline => None,
        };
        let (id, extra) = match mode {
            Mode::Sidecar => (identity::pod(&pod.namespace, dir, "controller")?, vec![]),
            Mode::Baseline => (
                identity::baseline(&pod.namespace, dir)?,
                vec!["--baseline-full-update".to_owned()],
            ),
        };
        let launch = pod.launch(MANAGER, dir, &pod_name, &id.kubeconfig, &extra)?;
        identities.push(("capt-controller".to_owned(), id.credential_id));
        launches.push(launch.clone());
        let controller = Process::start(launch, dir)?;
        let system = Self {
            _provider: provider,
            controller,
            applier,
            identities,
            launches,
            scraper,
        };
        system.wait_ready(Duration::from_secs(60)).await?;
        Ok(system)
    }

    /// Waits until the processes answer their probes and the controller leads: `/readyz` of
    /// both in the sidecar mode; `/healthz` in the baseline's (its `/readyz` asks the
    /// applier it does not have). Returns (ready, leading) times.
    pub(crate) async fn wait_ready(&self, timeout: Duration) -> Result<(Instant, Instant)> {
        let deadline = Instant::now() + timeout;
        let (mut ready, mut leading) = (None, None);
        loop {
            let now = Instant::now();
            if ready.is_none() && self.ready().await {
                ready = Some(now);
            }
            if leading.is_none() && self.controller.log_text().contains("Leading") {
                leading = Some(now);
            }
            if let (Some(r), Some(l)) = (ready, leading) {
                return Ok((r, l));
            }
            if now > deadline {
                bail!(
                    "the system was not ready and leading within {timeout:?}\n--- controller log:\n{}",
                    self.controller.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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

    pub(crate) async fn controller_metrics(&self) -> Result<String> {
        self.controller.metrics(&self.scraper.token).await
    }

    pub(crate) async fn applier_metrics(&self) -> Result<Option<String>> {
        match &self.applier {
            Some(a) => Ok(Some(a.metrics(&self.scraper.token).await?)),
            None => Ok(None),
        }
    }

    /// A client of the applier's socket (the Deployment's socket path, made local).
    pub(crate) fn applier_client(&self) -> Result<Client> {
        let applier = self.applier.as_ref().context("no status-applier")?;
        let socket: PathBuf = applier
            .launch
            .env
            .iter()
            .find(|(k, _)| k == "STATUS_APPLIER_SOCKET")
            .map(|(_, v)| v.into())
            .context("the applier's STATUS_APPLIER_SOCKET")?;
        Ok(Client::new(socket))
    }

    /// Kills the pod's processes and starts them again the same way (applier first, then
    /// the controller, without waiting between them, as a pod's containers start).
    pub(crate) fn restart(&mut self) -> Result<()> {
        self.controller.kill();
        if let Some(a) = &mut self.applier {
            a.kill();
        }
        if let Some(a) = &mut self.applier {
            a.restart()?;
        }
        self.controller.restart()
    }
}
