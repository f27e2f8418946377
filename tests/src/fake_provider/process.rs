//! [`FakeProvider`]: the `fake-terraform-provider` binary run as a child process against the
//! test environment.

use super::READY_LOG_LINE;
use crate::applier::binary;
use crate::env;
use anyhow::{Context, Result, bail};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A running `fake-terraform-provider`, killed when dropped.
pub struct FakeProvider {
    child: Child,
    log: PathBuf,
    /// Its log's directory, removed after the process (unless a test fails).
    _dir: crate::Scratch,
}

impl FakeProvider {
    /// Starts the binary with `args` (e.g. `["--delay-ms", "300", "--instance", "t1"]`)
    /// against the test environment, and waits until it can list the Workspaces it handles. It
    /// logs to a temporary file (see [`FakeProvider::log_text`]) with `RUST_LOG` from
    /// `FAKE_PROVIDER_LOG` (default `info`; `trace` after [`crate::log_everything`], whatever
    /// `FAKE_PROVIDER_LOG` says), and exits by itself if the test process dies.
    pub async fn start(args: &[&str]) -> Result<Self> {
        let filter = std::env::var("FAKE_PROVIDER_LOG").unwrap_or_else(|_| "info".to_owned());
        Self::start_logging(args, &filter).await
    }

    /// [`FakeProvider::start`] with this `RUST_LOG` filter (e.g. `debug`, which logs every
    /// pass, an up-to-date one included).
    pub async fn start_logging(args: &[&str], filter: &str) -> Result<Self> {
        Self::start_as(args, filter, &env().kubeconfig).await
    }

    /// The provider of a test system: the Workspaces rendered for namespace `namespace`,
    /// with provider-terraform's timings shortened as for every system of the tests (an apply
    /// after `delay_ms`, a poll every second, so that a checksum an apply left out comes back
    /// soon, and backoff from 100 ms), against the API server of `kubeconfig`.
    pub async fn for_namespace(
        namespace: &str,
        delay_ms: u64,
        filter: &str,
        kubeconfig: &std::path::Path,
    ) -> Result<Self> {
        let selector = format!("{}={namespace}", crate::system::APPLY_NAMESPACE_LABEL);
        let delay = delay_ms.to_string();
        let args = [
            "--delay-ms",
            &delay,
            "--selector",
            &selector,
            "--poll-interval-ms",
            "1000",
            "--backoff-base-ms",
            "100",
        ];
        Self::start_as(&args, filter, kubeconfig).await
    }

    /// [`FakeProvider::start_logging`] against the API server of `kubeconfig` (another
    /// environment's, say).
    pub async fn start_as(
        args: &[&str],
        filter: &str,
        kubeconfig: &std::path::Path,
    ) -> Result<Self> {
        let dir = crate::Scratch::new("fake-provider")?;
        let log = dir.join("fake-provider.log");
        // `trace` after `crate::log_everything`, whatever the filter says.
        let filter = crate::process_log(filter);
        let child = Command::new(binary("fake-terraform-provider"))
            .args(args)
            .arg("--exit-with-parent")
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", filter)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting fake-terraform-provider")?;
        let mut provider = Self {
            child,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if provider.log_text().contains(READY_LOG_LINE) {
                return Ok(provider);
            }
            if let Some(status) = provider.child.try_wait()? {
                bail!(
                    "fake-terraform-provider exited ({status}) before watching; log:\n{}",
                    provider.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        bail!(
            "fake-terraform-provider did not start watching within 30 s; log:\n{}",
            provider.log_text()
        )
    }

    /// What the process logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits up to `timeout` for the process to exit.
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .context("running kill -TERM")?;
        if !sent.success() {
            bail!("kill -TERM {} failed", self.child.id());
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                bail!("fake-terraform-provider did not exit within {timeout:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the process (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- fake-terraform-provider log ({}):\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}
