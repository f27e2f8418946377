//! A status-applier running as its own process against the test environment.

use crate::{env, repo_root, unique_name};
use anyhow::{Context, Result, bail};
use status_applier::client::Client;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A workspace binary, built next to the test executable (`cargo build --workspace --bins`,
/// which `hack/test.sh` runs first).
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("executable path");
    // Tests run from target/<profile>/deps, binaries from target/<profile>.
    let dir = exe.parent().expect("target/<profile>");
    let dir = if dir.ends_with("deps") {
        dir.parent().expect("target/<profile>")
    } else {
        dir
    };
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` first",
        path.display()
    );
    path
}

/// CAPT's policy for the status-applier, as deployed (`manifests/deploy/`): every CAPT
/// system the tests and the scripts start reads it.
pub fn capt_policy() -> PathBuf {
    repo_root().join("manifests/deploy/status-applier-policy.yaml")
}

/// A running `status-applier serve`, killed when dropped.
pub struct Applier {
    /// Its socket.
    pub socket: PathBuf,
    /// A client of its socket.
    pub client: Client,
    child: Child,
    log: PathBuf,
    args: Vec<String>,
    kubeconfig: PathBuf,
}

impl Applier {
    /// Starts an applier with CAPT's policy ([`capt_policy`]) and `args` added to
    /// `serve --socket …`, and waits until it answers.
    pub async fn start(args: &[&str]) -> Result<Self> {
        Self::start_as(args, &env().kubeconfig).await
    }

    /// [`Applier::start`] with another kubeconfig (an impersonating one, say).
    pub async fn start_as(args: &[&str], kubeconfig: &std::path::Path) -> Result<Self> {
        Self::start_with_policy(Some(&capt_policy()), args, kubeconfig).await
    }

    /// Starts an applier with the policy file `policy` (none: the empty policy) and `args`.
    pub async fn start_with_policy(
        policy: Option<&std::path::Path>,
        args: &[&str],
        kubeconfig: &std::path::Path,
    ) -> Result<Self> {
        let dir = std::env::temp_dir().join(unique_name("applier"));
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("applier.sock");
        let log = dir.join("applier.log");
        let mut args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        if let Some(policy) = policy {
            args.splice(0..0, ["--policy".to_owned(), policy.display().to_string()]);
        }
        let child = spawn(&socket, &args, kubeconfig, &log)?;
        let applier = Self {
            client: Client::new(&socket),
            socket,
            child,
            log,
            args,
            kubeconfig: kubeconfig.to_owned(),
        };
        applier.wait_healthy().await?;
        Ok(applier)
    }

    /// The PATCH requests the applier sends during `period`, once `settle` has passed.
    pub async fn writes_over(&self, settle: Duration, period: Duration) -> Result<f64> {
        tokio::time::sleep(settle).await;
        let before = self.metric("status_applier_api_writes_total", &[]).await?;
        tokio::time::sleep(period).await;
        Ok(self.metric("status_applier_api_writes_total", &[]).await? - before)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process (SIGKILL, like a crash) and starts a new one on the same socket.
    pub async fn restart(&mut self) -> Result<()> {
        self.kill();
        let log = self
            .log
            .with_extension(format!("{}.log", std::process::id()));
        self.child = spawn(&self.socket, &self.args, &self.kubeconfig, &log)?;
        self.log = log;
        self.wait_healthy().await
    }

    async fn wait_healthy(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.client.get("/healthz").await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "status-applier did not answer within 20 s; log:\n{}",
            self.log_text()
        )
    }

    /// What the process logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The value of a metric sample whose line starts with `name{` and contains every label
    /// in `labels` (0 when absent).
    pub async fn metric(&self, name: &str, labels: &[&str]) -> Result<f64> {
        let text = self.client.get("/metrics").await?.body;
        Ok(metric_value(&text, name, labels))
    }

    /// Stops the process (SIGKILL: no chance to tidy up, like a crash).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops it as the kubelet does (SIGTERM) and waits until it has ended.
    pub fn terminate(&mut self) -> Result<()> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill -TERM {}", self.child.id());
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Applier {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- status-applier log ({}):\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

fn spawn(
    socket: &std::path::Path,
    args: &[String],
    kubeconfig: &std::path::Path,
    log: &std::path::Path,
) -> Result<Child> {
    Command::new(binary("status-applier"))
        .arg("serve")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", crate::process_log("info,status_applier=trace"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .context("starting status-applier")
}

/// The sum of the samples of `name` carrying all `labels` (`manager="x"`) in Prometheus text.
pub fn metric_value(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
