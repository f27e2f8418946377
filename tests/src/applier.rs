//! A status-applier running as its own process against the test environment.

use crate::{env, repo_root};
use anyhow::{Context, Result, bail};
use status_applier::client::Client;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A workspace binary, built next to the test executable (`cargo build --workspace --bins`,
/// which `hack/test.sh` runs first).
pub fn binary(name: &str) -> PathBuf {
    if let Some(dir) = RELEASE_BINARIES.lock().expect("not poisoned").as_ref()
        && CAPT_PROGRAMS.contains(&name)
    {
        return dir.join(name);
    }
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

/// CAPT's own programs: what [`use_capt_binaries_from`] replaces.
const CAPT_PROGRAMS: [&str; 2] = ["capt-controller", "status-applier"];
/// The directory [`binary`] takes CAPT's programs from instead of this build's.
static RELEASE_BINARIES: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

/// Makes every process started from now on (until `None`) run CAPT's two programs
/// (`capt-controller`, `status-applier`) from `dir`, a previous release's
/// (`hack/previous-release.sh`), instead of this build's. The test programs stay this build's.
pub fn use_capt_binaries_from(dir: Option<PathBuf>) {
    *RELEASE_BINARIES.lock().expect("not poisoned") = dir;
}

/// CAPT's policy for the status-applier, as deployed (`manifests/deploy/`): every CAPT
/// system the tests and the scripts start reads it.
pub fn capt_policy() -> PathBuf {
    repo_root().join("manifests/deploy/status-applier-policy.yaml")
}

/// Runs `status-applier audit` with CAPT's policy against the test environment, over
/// `objects` (`kind/name`; none: every object) of namespace `ns`, and fails unless it found
/// nothing (exit 0), with `what` and the audit's report. Returns the report.
pub fn audit_clean(ns: &str, objects: &[&str], what: &str) -> Result<String> {
    let audit = Command::new(binary("status-applier"))
        .arg("audit")
        .args(objects)
        .args(["-n", ns])
        .arg("--policy")
        .arg(capt_policy())
        .env("KUBECONFIG", &env().kubeconfig)
        .output()?;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&audit.stdout),
        String::from_utf8_lossy(&audit.stderr)
    );
    anyhow::ensure!(audit.status.success(), "{what}:\n{report}");
    Ok(String::from_utf8_lossy(&audit.stdout).into_owned())
}

/// One look at what the applier has done for an object.
struct Look {
    /// How many documents are queued (`status_applier_pending_documents`), every object's.
    pending: f64,
    /// Every document (`GET /v1/intents`).
    all: serde_json::Value,
    /// The documents of the object, every manager's.
    documents: Vec<serde_json::Value>,
    /// The object as the API server has it now.
    object: serde_json::Value,
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
    /// Its socket and log; after the process, so that it goes once the process has.
    _dir: crate::Scratch,
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
        let dir = crate::Scratch::new("applier")?;
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
            _dir: dir,
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

    /// The object `name` once this applier has acted on its current version: the last
    /// outcome of each of `manager`'s documents for it (`GET /v1/intents`) names the object's
    /// resourceVersion (the answer of an apply, or the version a re-check planned on and found
    /// nothing to change in: every newer version the applier's watch shows it is re-checked),
    /// and none is queued (`status_applier_pending_documents`). `submitted`: an intent of
    /// `manager`'s for it was submitted. Before the first intent there is nothing to act on:
    /// the first intent's plan starts from the applier's view of the object, and a plan made on
    /// a view older than the object is refused for its resourceVersion precondition and made
    /// again (docs/concurrency.md, guarantee 1).
    pub async fn acted_on(
        &self,
        api: &kube::Api<kube::api::DynamicObject>,
        name: &str,
        manager: &str,
        submitted: bool,
        timeout: Duration,
    ) -> Result<serde_json::Value> {
        self.poll_documents(api, name, timeout, |look| {
            let versions: Vec<&serde_json::Value> = look
                .documents
                .iter()
                .filter(|d| d["fieldManager"] == manager)
                .map(|d| &d["last"]["resourceVersion"])
                .collect();
            // Once an intent was submitted, no document would make the wait below pass unseen.
            if submitted && versions.is_empty() {
                bail!(
                    "the applier shows no document of {manager} for {name}: {}",
                    look.all
                );
            }
            let current = &look.object["metadata"]["resourceVersion"];
            if look.pending == 0.0 && versions.iter().all(|v| *v == current) {
                return Ok(ControlFlow::Break(()));
            }
            let mine: Vec<&serde_json::Value> = look
                .all
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| d["object"]["name"] == name && d["fieldManager"] == manager)
                .collect();
            Ok(ControlFlow::Continue(format!(
                "the applier did not act on version {current} of {name} within {timeout:?}: \
                 the last versions of {manager}'s documents {versions:?}, {} pending; \
                 the documents: {mine:?}",
                look.pending
            )))
        })
        .await
    }

    /// The object `name` once this applier has nothing left to do for it: none of its
    /// documents is queued (`status_applier_pending_documents`), and the newest version any of
    /// its documents (every manager's) last acted on is the object's current one. Unlike
    /// [`Applier::acted_on`] it holds when that version is the applier's own write of one
    /// document: the watch never shows our own write as news, so the object's other documents
    /// are not re-checked on it, and keep naming the version before.
    pub async fn settled_on(
        &self,
        api: &kube::Api<kube::api::DynamicObject>,
        name: &str,
        timeout: Duration,
    ) -> Result<serde_json::Value> {
        self.poll_documents(api, name, timeout, |look| {
            let versions: Vec<u64> = look
                .documents
                .iter()
                .filter_map(|d| d["last"]["resourceVersion"].as_str()?.parse().ok())
                .collect();
            if versions.is_empty() {
                bail!("the applier shows no document for {name}: {}", look.all);
            }
            let current = &look.object["metadata"]["resourceVersion"];
            let newest = versions.iter().max().map(u64::to_string);
            if look.pending == 0.0 && current.as_str() == newest.as_deref() {
                return Ok(ControlFlow::Break(()));
            }
            Ok(ControlFlow::Continue(format!(
                "the applier did not settle on version {current} of {name} within \
                 {timeout:?}: its documents last acted on {versions:?}, {} pending",
                look.pending
            )))
        })
        .await
    }

    /// Looks at the applier and the object `name` until `verdict` says it is done
    /// (`Break`) or `timeout` has passed, then fails with what the last `Continue` said.
    /// It polls: what it waits for is the applier's answer, not a quiet time.
    async fn poll_documents(
        &self,
        api: &kube::Api<kube::api::DynamicObject>,
        name: &str,
        timeout: Duration,
        verdict: impl Fn(&Look) -> Result<ControlFlow<(), String>>,
    ) -> Result<serde_json::Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let pending = self.metric("status_applier_pending_documents", &[]).await?;
            let all = self.client.get("/v1/intents").await?.json();
            let object = serde_json::to_value(api.get(name).await?)?;
            let documents = (all.as_array().into_iter().flatten())
                .filter(|d| {
                    d["object"]["name"] == name
                        && d["object"]["kind"] == object["kind"]
                        && d["object"]["namespace"] == object["metadata"]["namespace"]
                })
                .cloned()
                .collect();
            let look = Look {
                pending,
                all,
                documents,
                object,
            };
            match verdict(&look)? {
                ControlFlow::Break(()) => return Ok(look.object),
                ControlFlow::Continue(why) if Instant::now() > deadline => bail!("{why}"),
                ControlFlow::Continue(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the process is still running (never restarted by a test that asks).
    pub fn running(&mut self) -> Result<bool> {
        Ok(self.child.try_wait()?.is_none())
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

    /// [`Applier::restart`], the new process reaching the API server through `kubeconfig`
    /// from now on (around a proxy that holds what the killed one sent, say).
    pub async fn restart_as(&mut self, kubeconfig: &std::path::Path) -> Result<()> {
        self.kubeconfig = kubeconfig.to_owned();
        self.restart().await
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

    /// The sum of the applier's samples of `name` carrying every label in `labels`
    /// ([`metric_value`]: an error when the applier does not expose the metric).
    pub async fn metric(&self, name: &str, labels: &[&str]) -> Result<f64> {
        let text = self.client.get("/metrics").await?.body;
        metric_value(&text, name, labels)
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
///
/// A metric that neither the text declares (a `# TYPE` line of its family) nor the
/// status-applier or the controller registers ([`registered_families`]) is an error, not 0:
/// a check that a count is 0, or did not move, must fail when the metric is renamed or gone.
/// So is a label name that no sample of a family with samples carries (a misspelt label). A
/// registered family without a sample carrying `labels` is 0: the processes serve a family
/// only once it has counted something, and a labelled family shows a label set only once it
/// has counted it.
pub fn metric_value(text: &str, name: &str, labels: &[&str]) -> Result<f64> {
    let declared = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split_whitespace().next())
        .any(|family| is_of_family(name, family));
    let registered = registered_families()
        .iter()
        .any(|family| is_of_family(name, family));
    if !declared && !registered {
        bail!(
            "no metric {name}: the text does not declare its family, and neither the \
             status-applier nor the controller registers it"
        );
    }
    let samples: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .collect();
    if !samples.is_empty() {
        for label in labels {
            let key = label.split('=').next().unwrap_or(label);
            if !samples.iter().any(|l| l.contains(&format!("{key}=\""))) {
                bail!("no sample of {name} has a label {key}: {samples:?}");
            }
        }
    }
    Ok(samples
        .iter()
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// True when a sample named `name` belongs to `family`: named the family, or the family and
/// one of these suffixes (counters `_total`, histograms `_bucket`, `_sum`, `_count`).
fn is_of_family(name: &str, family: &str) -> bool {
    const SUFFIXES: [&str; 6] = ["_total", "_created", "_bucket", "_sum", "_count", "_info"];
    name == family
        || name
            .strip_prefix(family)
            .is_some_and(|suffix| SUFFIXES.contains(&suffix))
}

/// The metric families (`# TYPE` names) that the status-applier and the controller register,
/// from their own registration code: each family is given one sample, since a family that
/// has counted nothing is left out of the text.
pub fn registered_families() -> &'static [String] {
    use prometheus_client::registry::Registry;
    static FAMILIES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    FAMILIES.get_or_init(|| {
        let mut registry = Registry::default();
        let applier = status_applier::metrics::Metrics::register(&mut registry);
        let manager = || status_applier::metrics::ManagerLabel {
            manager: "m".into(),
        };
        applier.intent("m", status_applier::metrics::Action::applied);
        applier.applied("m", status_applier::metrics::Action::applied);
        applier.writes.get_or_create(&manager()).inc();
        applier.coalesced.get_or_create(&manager()).inc();
        applier
            .view_waits
            .get_or_create(&status_applier::metrics::ManagerWaitEnd {
                manager: "m".into(),
                end: status_applier::metrics::WaitEnd::read,
            })
            .inc();
        applier.conflict("m", "p", false);
        applier
            .api_errors
            .get_or_create(&status_applier::metrics::CodeLabel { code: "409".into() })
            .inc();
        applier
            .apply_duration
            .get_or_create(&manager())
            .observe(0.1);
        let mut controller_registry = Registry::default();
        let controller = capt_controller::metrics::Metrics::register(&mut controller_registry);
        use capt_controller::metrics as c;
        controller.reconciled("K");
        let (waited, took) = controller.durations("K");
        waited.observe(0.001);
        took.observe(0.001);
        controller
            .errors
            .get_or_create(&c::ErrorLabels {
                kind: "K".into(),
                error: "e".into(),
            })
            .inc();
        let m = || c::ManagerLabel {
            manager: "m".into(),
        };
        controller.intents.get_or_create(&m()).inc();
        controller.behind.get_or_create(&m()).inc();
        controller
            .write_loops
            .get_or_create(&c::WriteLoopLabels {
                kind: "K".into(),
                manager: "m".into(),
            })
            .inc();
        // A standby never writes the Lease: without a sample its family is not in its text.
        controller
            .lease_writes
            .get_or_create(&c::LeaseWriteLabel {
                result: "renewed".into(),
            })
            .inc();
        controller
            .phase_transition
            .get_or_create(&c::PhaseLabel { phase: "p".into() })
            .observe(1.0);
        controller
            .deletion
            .get_or_create(&c::ResourceTypeLabel {
                resource_type: "r".into(),
            })
            .observe(1.0);
        let mut text = diagnostics::metrics_text(&registry);
        prometheus_client::encoding::text::encode(&mut text, &controller_registry)
            .expect("writing to a String cannot fail");
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.split_whitespace().next())
            .map(str::to_owned)
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::metric_value;

    const TEXT: &str = "# HELP status_applier_api_writes PATCH requests sent.
# TYPE status_applier_api_writes counter
status_applier_api_writes_total{manager=\"a\"} 2
status_applier_api_writes_total{manager=\"b\"} 3
# HELP status_applier_conflicts Field conflicts.
# TYPE status_applier_conflicts counter
# HELP status_applier_apply_duration_seconds Time.
# TYPE status_applier_apply_duration_seconds histogram
status_applier_apply_duration_seconds_count{manager=\"a\"} 4
# EOF
";

    #[test]
    fn samples_are_summed_over_the_labels_asked() {
        let sum = |name, labels| metric_value(TEXT, name, labels).unwrap();
        assert_eq!(sum("status_applier_api_writes_total", &[]), 5.0);
        assert_eq!(
            sum("status_applier_api_writes_total", &["manager=\"b\""]),
            3.0
        );
        assert_eq!(sum("status_applier_apply_duration_seconds_count", &[]), 4.0);
    }

    #[test]
    fn a_declared_family_without_the_label_set_is_zero() {
        let value = |name, labels| metric_value(TEXT, name, labels).unwrap();
        assert_eq!(
            value("status_applier_conflicts_total", &["owner=\"x\""]),
            0.0
        );
        assert_eq!(
            value("status_applier_api_writes_total", &["manager=\"c\""]),
            0.0
        );
    }

    #[test]
    fn a_registered_family_not_counted_yet_is_zero() {
        for name in [
            "status_applier_coalesced_intents_total",
            "status_applier_api_errors_total",
            "capt_reconciles_total",
            "capt_rewake_gave_up_total",
            "capt_resource_deletion_duration_seconds_count",
        ] {
            assert_eq!(metric_value(TEXT, name, &[]).unwrap(), 0.0, "{name}");
        }
    }

    #[test]
    fn a_missing_metric_or_label_is_an_error_not_zero() {
        for (name, labels) in [
            ("status_applier_api_write_total", &[][..]),
            ("capt_reconcile_total", &[][..]),
            ("status_applier_api_writes_total", &["managr=\"a\""][..]),
        ] {
            let answer = metric_value(TEXT, name, labels);
            assert!(answer.is_err(), "{name} {labels:?}: {answer:?}");
        }
    }
}
