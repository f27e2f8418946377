//! The whole system as separate processes against the test environment: the status-applier,
//! the controller (scoped to one namespace) and the fake Terraform provider (scoped to that
//! namespace's Workspaces), plus the sample manifests of `manifests/samples/`. In an
//! environment with the real provider-terraform ([`crate::with_real_provider`]) no fake
//! provider starts: the real one, shared by the environment, plays the Workspaces.

use crate::applier::{Applier, binary, metric_value};
use crate::fake_provider::FakeProvider;
use crate::{Env, env, repo_root};
use anyhow::{Context, Result, bail};
use capt_controller::render::workspace_name;
use serde_json::Value;
use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The controller's flag that says Cluster API core does not run beside it.
pub const WITHOUT_CORE: &str = "--without-cluster-api-core";
/// The controller's flag naming a namespace trusted with code (its WorkspaceTemplates are
/// used). A system trusts its own namespace, where the tests keep their templates beside
/// their stacks, unless the test names the trusted namespaces itself with this flag (the
/// hostile-tenant tests trust another, so that their own templates are refused).
pub const TRUST_TEMPLATES: &str = "--allow-template-namespace";
/// Not a flag of the controller: told to a [`System`] among the controller's flags, it starts
/// the controller without `--namespace`, so that it manages every namespace (as deployed);
/// the test then confines it to its own objects with `--watch-filter`, and keeps its Lease in
/// the system's namespace. The fake provider still plays that namespace's Workspaces alone.
pub const ALL_NAMESPACES: &str = "--all-namespaces (the tests' own)";
/// The platform namespace of `manifests/samples/`, the one the sample deployment trusts with
/// code; the tests put the samples' templates into their own namespace instead.
pub const SAMPLE_TEMPLATE_NAMESPACE: &str = "capt-templates";

/// The label the controller puts on Workspaces, naming their apply's namespace.
pub use capt_controller::render::APPLY_NAMESPACE_LABEL;

/// Who writes the Cluster's phase, initialization and endpoint in the environment a test
/// runs in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ClusterWriter {
    /// Cluster API core, which copies the control plane's endpoint once; `capt-cluster`
    /// writes nothing to the Cluster.
    Core,
    /// `capt-cluster`, where core does not run (the controller started
    /// `--without-cluster-api-core`): as core would, it follows the control plane's endpoint
    /// and protects it as the control plane's.
    CaptCluster,
}

impl ClusterWriter {
    /// Fails unless the test environment runs Cluster API core exactly when this writer is
    /// core.
    pub fn expect_environment(self) -> Result<()> {
        let beside_core = self == Self::Core;
        anyhow::ensure!(
            env().core == beside_core,
            "this scenario for {self:?} needs CAPT_TESTENV_CORE={}",
            u8::from(beside_core)
        );
        Ok(())
    }
}

/// The resource of `kind` in the version the tests read it in: the Cluster in v1beta2 (core's
/// storage version, and the only one served without core: `hack/testenv.sh`), our kinds in
/// v1beta1.
pub fn resource(group: &str, kind: &str, plural: &str) -> kube::api::ApiResource {
    use kube::api::{ApiResource, GroupVersionKind};
    let version = if group == "cluster.x-k8s.io" {
        "v1beta2"
    } else {
        "v1beta1"
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// The three processes of one system.
pub struct System {
    /// The status-applier.
    pub applier: Applier,
    /// The fake provider; `None` beside the real provider-terraform.
    provider: Option<FakeProvider>,
    controller: Child,
    /// How the controller was started: its arguments and kubeconfig.
    controller_command: (Vec<String>, std::path::PathBuf),
    controller_log: std::path::PathBuf,
    metrics_addr: String,
    probe_addr: String,
    namespace: String,
    env: Env,
}

impl System {
    /// Starts the three processes for `namespace`; the provider's applies and deletions take
    /// `provider_delay_ms`.
    pub async fn start(namespace: &str, provider_delay_ms: u64) -> Result<Self> {
        Self::start_with(namespace, provider_delay_ms, &[]).await
    }

    /// [`System::start`], with more flags for the controller.
    pub async fn start_with(
        namespace: &str,
        provider_delay_ms: u64,
        controller_args: &[&str],
    ) -> Result<Self> {
        Self::start_as(
            namespace,
            provider_delay_ms,
            controller_args,
            &env().kubeconfig,
        )
        .await
    }

    /// [`System::start_with`], the applier and the controller using `kubeconfig` (the fake
    /// provider, which is not part of the pod, stays an administrator).
    pub async fn start_as(
        namespace: &str,
        provider_delay_ms: u64,
        controller_args: &[&str],
        kubeconfig: &std::path::Path,
    ) -> Result<Self> {
        Self::start_tuned(
            namespace,
            provider_delay_ms,
            controller_args,
            &[],
            kubeconfig,
        )
        .await
    }

    /// [`System::start_as`], with more flags for the status-applier (a longer coalescing
    /// window, say).
    pub async fn start_tuned(
        namespace: &str,
        provider_delay_ms: u64,
        controller_args: &[&str],
        applier_args: &[&str],
        kubeconfig: &std::path::Path,
    ) -> Result<Self> {
        Self::start_full(
            env(),
            namespace,
            provider_delay_ms,
            controller_args,
            applier_args,
            kubeconfig,
        )
        .await
    }

    /// [`System::start`] against the environment `on` (not [`env`]'s: the target of a
    /// `clusterctl move`, say): all three processes use its kubeconfig, and the methods read
    /// from it.
    pub async fn start_on(on: &Env, namespace: &str, provider_delay_ms: u64) -> Result<Self> {
        Self::start_full(on, namespace, provider_delay_ms, &[], &[], &on.kubeconfig).await
    }

    async fn start_full(
        on: &Env,
        namespace: &str,
        provider_delay_ms: u64,
        controller_args: &[&str],
        applier_args: &[&str],
        kubeconfig: &std::path::Path,
    ) -> Result<Self> {
        let applier = Applier::start_as(applier_args, kubeconfig).await?;
        // provider-terraform's timings, shortened ([`FakeProvider::for_namespace`]). Each poll
        // sends a status Update the API server stores nothing for; tests that count writes
        // tell them apart (`AuditLog::writes_in` with the Workspaces' resourceVersions).
        let filter = std::env::var("FAKE_PROVIDER_LOG").unwrap_or_else(|_| "info".to_owned());
        let provider = if on.real_provider {
            None
        } else {
            Some(
                FakeProvider::for_namespace(namespace, provider_delay_ms, &filter, &on.kubeconfig)
                    .await?,
            )
        };
        let [metrics_addr, probe_addr] = free_local_addrs()?;
        let controller_log = applier.socket.with_file_name("controller.log");
        // Each system elects its leader on a Lease of its own namespace.
        let leader_args: &[&str] = if controller_args.contains(&"--leader-election-namespace") {
            &[]
        } else {
            &["--leader-election-namespace", namespace]
        };
        let scope: &[&str] = match controller_args.contains(&ALL_NAMESPACES) {
            true => &[],
            false => &["--namespace", namespace],
        };
        let controller_args: Vec<&str> = controller_args
            .iter()
            .copied()
            .filter(|a| *a != ALL_NAMESPACES)
            .collect();
        let mut args: Vec<String> = scope.iter().map(|a| (*a).to_owned()).collect();
        args.extend(
            [
                // The tests scrape the controller's metrics over plain HTTP; the HTTPS
                // listener with its TokenReview and SubjectAccessReview is tested in
                // tests/tests/diagnostics.rs.
                "--insecure-diagnostics",
                "--metrics-bind-address",
                &metrics_addr,
                "--health-probe-bind-address",
                &probe_addr,
                "--poll-interval-seconds",
                "1",
                "--applier-socket",
            ]
            .map(str::to_owned),
        );
        args.push(applier.socket.display().to_string());
        // Where core does not run, the controller is told so, as an operator would
        // (unless the test says otherwise: `--without-cluster-api-core=false`).
        if !on.core && !controller_args.iter().any(|a| a.starts_with(WITHOUT_CORE)) {
            args.push(WITHOUT_CORE.to_owned());
        }
        args.extend(leader_args.iter().map(|a| (*a).to_owned()));
        // The test's own namespace holds its templates: trusted, unless the test says which.
        if !controller_args
            .iter()
            .any(|a| a.starts_with(TRUST_TEMPLATES))
        {
            args.extend([TRUST_TEMPLATES.to_owned(), namespace.to_owned()]);
        }
        args.extend(controller_args.iter().map(|a| (*a).to_owned()));
        let controller_command = (args, kubeconfig.to_owned());
        let controller = spawn_controller(on, &controller_command, &controller_log)?;
        let system = Self {
            applier,
            provider,
            controller,
            controller_command,
            controller_log,
            metrics_addr,
            probe_addr,
            namespace: namespace.to_owned(),
            env: on.clone(),
        };
        system
            .wait_for(
                "the controller's /healthz",
                Duration::from_secs(20),
                || async { Ok(system.http_get("/healthz").await.is_ok()) },
            )
            .await?;
        Ok(system)
    }

    /// The fake provider (panics beside the real provider-terraform: a test that drives the
    /// fake one has no business there).
    pub fn provider(&self) -> &FakeProvider {
        self.provider.as_ref().expect("the fake provider runs")
    }

    /// [`System::provider`], to stop it.
    pub fn provider_mut(&mut self) -> &mut FakeProvider {
        self.provider.as_mut().expect("the fake provider runs")
    }

    /// Applies the sample templates and Cluster into the namespace ([`apply_samples`]).
    pub async fn apply_samples(&self, retain_vpc: bool) -> Result<()> {
        apply_samples(&self.env, &self.namespace, retain_vpc)
    }

    /// [`apply_samples_edited`] into the system's namespace.
    pub fn apply_samples_edited(&self, edit: impl FnMut(&mut Value)) -> Result<()> {
        apply_samples_edited(&self.env, &self.namespace, edit)
    }

    /// [`apply_workload_samples`] into the system's namespace.
    pub async fn apply_workload_samples(&self) -> Result<()> {
        apply_workload_samples(&self.env, &self.namespace)
    }

    /// `kubectl get <what> -n <ns> -o json`, parsed; `None` when not found.
    pub fn get(&self, what: &[&str]) -> Result<Option<Value>> {
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        args.extend_from_slice(&["-n", &self.namespace, "-o", "json", "--show-managed-fields"]);
        let out = self.env.kubectl_run(&args, None)?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("NotFound") || err.contains("not found") {
                return Ok(None);
            }
            bail!("kubectl {}: {err}", args.join(" "));
        }
        Ok(Some(serde_json::from_slice(&out.stdout)?))
    }

    /// Waits until `check` answers true, failing after `timeout` with `what` and the logs.
    pub async fn wait_for<F, Fut>(&self, what: &str, timeout: Duration, check: F) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<bool>>,
    {
        wait_until(what, timeout, check).await.map_err(|e| {
            anyhow::anyhow!("{e}\n--- controller log:\n{}", self.controller_log_text())
        })
    }

    /// Waits until the Cluster is Provisioned.
    pub async fn wait_provisioned(&self) -> Result<()> {
        self.wait_for(
            "Cluster phase Provisioned",
            Duration::from_secs(60),
            || async {
                Ok(self
                    .get(&["cluster", "demo"])?
                    .is_some_and(|c| c["status"]["phase"] == "Provisioned"))
            },
        )
        .await
    }

    /// True when the samples' stack (`demo`) rests: the provider has had its last word on both
    /// Workspaces (their status carries the checksum again: an apply leaves it out until the
    /// next poll), each CAPT object mirrors what its Workspace last reported, the control
    /// plane is Ready, the Cluster Provisioned and its kubeconfig Secret written; and, where
    /// Cluster API core runs, core has processed our last statuses: its Cluster status
    /// observes the Cluster's generation and its `InfrastructureReady` and
    /// `ControlPlaneAvailable` are the mirrors of our final `Ready` and `Available`. What a
    /// quiet window starts after, instead of a fixed settling time. Read with `client` (one
    /// request per object: a check is cheap enough to repeat every 100 ms under load).
    pub async fn samples_rest(&self, client: &kube::Client) -> Result<bool> {
        use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
        let get = |namespaced: bool, group: &str, version: &str, kind: &str, name: String| {
            let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
            let api: Api<DynamicObject> = if namespaced {
                Api::namespaced_with(client.clone(), &self.namespace, &resource)
            } else {
                Api::all_with(client.clone(), &resource)
            };
            async move {
                let object = api.get_opt(&name).await?;
                Ok::<Value, anyhow::Error>(
                    object
                        .map(serde_json::to_value)
                        .transpose()?
                        .unwrap_or(Value::Null),
                )
            }
        };
        let workspace = |apply: &str| {
            get(
                false,
                "tf.upbound.io",
                "v1beta1",
                "Workspace",
                workspace_name(&self.namespace, apply),
            )
        };
        let (vpc, eks) = (
            workspace("demo-vpc").await?,
            workspace("demo-controlplane").await?,
        );
        let cc = get(
            true,
            "infrastructure.cluster.x-k8s.io",
            "v1beta1",
            "CAPTCluster",
            "demo".into(),
        )
        .await?;
        let cp = get(
            true,
            "controlplane.cluster.x-k8s.io",
            "v1beta1",
            "CAPTControlPlane",
            "demo".into(),
        )
        .await?;
        let secret = get(true, "", "v1", "Secret", "demo-kubeconfig".into()).await?;
        let checksum = |ws: &Value| ws["status"]["atProvider"]["checksum"].is_string();
        let ours_rest = checksum(&vpc)
            && checksum(&eks)
            && cc["status"]["workspaceTemplateStatus"]["lastAppliedRevision"]
                == vpc["status"]["atProvider"]["checksum"]
            && cp["status"]["phase"] == "Ready"
            && cp["status"]["workspaceStatus"]["atProvider"] == eks["status"]["atProvider"]
            && !secret.is_null();
        if !ours_rest {
            return Ok(false);
        }
        // Core stores v1beta2 (with its conditions); without core it is the only version
        // served (`hack/testenv.sh`).
        let cluster = get(
            true,
            "cluster.x-k8s.io",
            "v1beta2",
            "Cluster",
            "demo".into(),
        )
        .await?;
        if cluster["status"]["phase"] != "Provisioned" {
            return Ok(false);
        }
        if !self.env.core {
            return Ok(true);
        }
        let condition = |obj: &Value, type_: &str| {
            obj["status"]["conditions"]
                .as_array()
                .and_then(|l| l.iter().find(|c| c["type"] == type_))
                .map(|c| {
                    (
                        c["status"].clone(),
                        c["reason"].clone(),
                        c["message"].clone(),
                    )
                })
        };
        Ok(
            cluster["status"]["observedGeneration"] == cluster["metadata"]["generation"]
                && condition(&cc, "Ready").is_some()
                && condition(&cluster, "InfrastructureReady") == condition(&cc, "Ready")
                && condition(&cp, "Available").is_some()
                && condition(&cluster, "ControlPlaneAvailable") == condition(&cp, "Available"),
        )
    }

    /// Waits until [`System::samples_rest`].
    pub async fn wait_samples_rest(&self) -> Result<()> {
        let client = self.env.client().await?;
        self.wait_for(
            "the samples' stack to rest",
            Duration::from_secs(60),
            || self.samples_rest(&client),
        )
        .await
    }

    /// True when the control plane's Workspace carries the `revision` annotation and the
    /// control plane mirrors the `atProvider` checksum the provider wrote for it.
    pub fn mirrors_revision(&self, revision: &str) -> Result<bool> {
        let ws = self.env.kubectl_ok(
            &[
                "get",
                "workspace",
                &workspace_name(&self.namespace, "demo-controlplane"),
                "-o",
                "json",
            ],
            None,
        )?;
        let ws: Value = serde_json::from_str(&ws)?;
        let checksum = &ws["status"]["atProvider"]["checksum"];
        let cp = self
            .get(&["captcontrolplane", "demo"])?
            .context("the control plane exists")?;
        Ok(
            ws["metadata"]["annotations"]["fake.tf.upbound.io/revision"] == revision
                && checksum.is_string()
                && cp["status"]["workspaceStatus"]["atProvider"]["checksum"] == *checksum,
        )
    }

    /// Waits until [`System::mirrors_revision`].
    pub async fn wait_mirrored(&self, revision: &str, timeout: Duration) -> Result<()> {
        self.wait_for(
            &format!("the control plane to mirror revision {revision}"),
            timeout,
            || async { self.mirrors_revision(revision) },
        )
        .await
    }

    /// The resourceVersion of the sample's control plane once the applier has settled on it
    /// ([`Applier::settled_on`]): none of its documents queued, and the newest version they
    /// acted on is the current one. What a watch of it then has to reach to have seen all.
    pub async fn settled_control_plane_version(&self, timeout: Duration) -> Result<u64> {
        let resource = resource(
            "controlplane.cluster.x-k8s.io",
            "CAPTControlPlane",
            "captcontrolplanes",
        );
        let api = kube::Api::<kube::api::DynamicObject>::namespaced_with(
            self.env.client().await?,
            &self.namespace,
            &resource,
        );
        let settled = self.applier.settled_on(&api, "demo", timeout).await?;
        let version = settled["metadata"]["resourceVersion"].as_str();
        Ok(version.context("a resourceVersion")?.parse()?)
    }

    /// Makes the controller reconcile the sample's control plane once more and waits until a
    /// reconcile of it has finished since the call: a label (`test/poke=<value>`, a new value
    /// each time) changes its lifecycle hash, which wakes it (at rest nothing else does).
    pub async fn reconcile_control_plane_again(&self, value: &str) -> Result<()> {
        let reconciles = || async {
            self.controller_metric("capt_reconciles_total", &["kind=\"CAPTControlPlane\""])
                .await
        };
        let before = reconciles().await?;
        let label = format!("test/poke={value}");
        let poke = ["label", "captcontrolplane", "demo", "--overwrite", &label];
        let mut args = poke.to_vec();
        args.extend_from_slice(&["-n", &self.namespace]);
        self.env.kubectl_ok(&args, None)?;
        self.wait_for(
            "one more reconcile of the control plane",
            Duration::from_secs(20),
            || async { Ok(reconciles().await? > before) },
        )
        .await
    }

    /// The sum of a controller metric's samples carrying `labels`.
    pub async fn controller_metric(&self, name: &str, labels: &[&str]) -> Result<f64> {
        metric_value(&self.http_get("/metrics").await?, name, labels)
    }

    /// The controller's `/metrics` answer.
    pub async fn controller_metrics_text(&self) -> Result<String> {
        self.http_get("/metrics").await
    }

    /// The controller's `/readyz`: its HTTP status and body.
    pub async fn controller_readyz(&self) -> Result<(u16, String)> {
        plain_get(&self.probe_addr, "/readyz").await
    }

    /// The body of the controller's `path`: `/metrics` from its metrics listener (plain
    /// HTTP here), anything else from its probe listener.
    async fn http_get(&self, path: &str) -> Result<String> {
        let addr = if path == "/metrics" {
            &self.metrics_addr
        } else {
            &self.probe_addr
        };
        let (status, body) = plain_get(addr, path).await?;
        if status != 200 {
            bail!("GET {path} on {addr}: {status}");
        }
        Ok(body)
    }

    /// Stops the controller and the status-applier with SIGTERM, as a rolling update of the
    /// pod does, and waits until both have ended; the fake provider keeps running.
    pub fn stop_processes(&mut self) -> Result<()> {
        let pid = self.controller.id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status()?;
        anyhow::ensure!(status.success(), "kill -TERM {pid}");
        self.controller.wait()?;
        self.applier.terminate()
    }

    /// Starts the status-applier and the controller again with the arguments they had, from
    /// the programs [`binary`] names now (another release's:
    /// `applier::use_capt_binaries_from`); returns once the controller answers.
    pub async fn start_processes(&mut self) -> Result<()> {
        self.applier.restart().await?;
        self.controller =
            spawn_controller(&self.env, &self.controller_command, &self.controller_log)?;
        self.wait_for(
            "the new controller's /healthz",
            Duration::from_secs(20),
            || async { Ok(self.http_get("/healthz").await.is_ok()) },
        )
        .await
    }

    /// Kills the controller (SIGKILL, like a crashed pod).
    pub fn kill_controller(&mut self) {
        let _ = self.controller.kill();
        let _ = self.controller.wait();
    }

    /// Changes the `cluster_endpoint` output of the sample's control-plane Workspace
    /// ([`set_endpoint_output`]).
    pub fn set_endpoint_output(&self, endpoint: &str) -> Result<()> {
        set_endpoint_output(&self.env, &self.namespace, endpoint)
    }

    /// Sets the sensitive outputs the fake provider reports for the sample's control plane,
    /// where they come from: the WorkspaceTemplate the controller renders the Workspace from.
    pub fn set_sensitive_outputs(&self, outputs: &Value) -> Result<()> {
        self.patch_control_plane_template(&serde_json::json!({"spec": {"template": {"metadata":
            {"annotations": {crate::fake_provider::SENSITIVE_OUTPUTS_ANNOTATION:
                outputs.to_string()}}}}}))
    }

    /// Merge-patches the sample's control-plane WorkspaceTemplate (`eks`).
    pub fn patch_control_plane_template(&self, patch: &Value) -> Result<()> {
        patch_control_plane_template(&self.env, &self.namespace, patch)
    }

    /// Sets the fake provider's revision annotation on the sample's control-plane Workspace:
    /// a new revision is a new apply, with a new `atProvider` checksum.
    pub fn set_revision(&self, revision: &str) -> Result<()> {
        let annotation = format!("{}={revision}", crate::fake_provider::REVISION_ANNOTATION);
        let ws = workspace_name(&self.namespace, "demo-controlplane");
        self.env.kubectl_ok(
            &["annotate", "workspace", &ws, "--overwrite", &annotation],
            None,
        )?;
        Ok(())
    }

    /// How the controller exited, if it has (`None`: it runs).
    pub fn controller_exited(&mut self) -> Result<Option<std::process::ExitStatus>> {
        Ok(self.controller.try_wait()?)
    }

    /// The controller's process id.
    pub fn controller_pid(&self) -> u32 {
        self.controller.id()
    }

    /// The environment it runs against.
    pub fn env(&self) -> &Env {
        &self.env
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// What the controller logged so far.
    pub fn controller_log_text(&self) -> String {
        std::fs::read_to_string(&self.controller_log).unwrap_or_default()
    }
}

/// Starts `capt-controller` ([`binary`]) with `command`'s arguments and kubeconfig, its
/// output appended to `log`, on the API server of `on` (whose namespaces it trusts are marked
/// as the install marks the one it creates: [`crate::mark_trusted_namespaces`]).
fn spawn_controller(
    on: &Env,
    command: &(Vec<String>, std::path::PathBuf),
    log: &std::path::Path,
) -> Result<Child> {
    let (args, kubeconfig) = command;
    crate::mark_trusted_namespaces_on(on, args)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    Command::new(binary("capt-controller"))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", crate::process_log("info"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting capt-controller")
}

impl Drop for System {
    fn drop(&mut self) {
        let _ = self.controller.kill();
        let _ = self.controller.wait();
        if std::thread::panicking() {
            eprintln!("--- controller log:\n{}", self.controller_log_text());
            if let Some(provider) = &self.provider {
                eprintln!("--- fake provider log:\n{}", provider.log_text());
            }
        }
    }
}

/// Waits until `check` answers true (an error counts as not yet), checking every 100 ms;
/// fails after `timeout`, naming `what`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await.unwrap_or(false) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Applies the sample templates and Cluster of `manifests/samples/` into `namespace`, the EKS
/// template pointed at the environment's workload API server (`hack/testenv.sh
/// workload-samples`: its endpoint, CA and a token as the module's outputs), so Cluster API
/// core can connect to the workload cluster with the `<cluster>-kubeconfig` Secret.
pub fn apply_workload_samples(env: &Env, namespace: &str) -> Result<()> {
    apply_workload_samples_with(env, namespace, "cluster.yaml")
}

/// [`apply_workload_samples`] with the Cluster (and whatever else) of
/// `manifests/samples/<cluster_file>`: `cluster.yaml`, or `clusterclass.yaml` (a ClusterClass,
/// its templates and a Cluster with `spec.topology`).
pub fn apply_workload_samples_with(env: &Env, namespace: &str, cluster_file: &str) -> Result<()> {
    let out = std::process::Command::new(crate::repo_root().join("hack/testenv.sh"))
        .arg("workload-samples")
        .env("CAPT_TESTENV_DIR", env.state_dir())
        .env("KUBECONFIG", &env.kubeconfig)
        .env("PATH", kubectl_path(env))
        .output()?;
    // The output holds the workload token: only the error stream is ever shown.
    anyhow::ensure!(
        out.status.success(),
        "hack/testenv.sh workload-samples: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_slice(&out.stdout)?;
    let mut docs = list["items"].as_array().cloned().unwrap_or_default();
    docs.extend(sample_docs(cluster_file)?);
    apply_in(env, namespace, docs)
}

/// The documents of `manifests/samples/<file>`.
fn sample_docs(file: &str) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(repo_root().join("manifests/samples").join(file))?;
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Ok(serde::Deserialize::deserialize(doc)?))
        .collect()
}

/// A sample document moved into a test's `namespace`: its own namespace, and the samples'
/// platform namespace ([`SAMPLE_TEMPLATE_NAMESPACE`], where the references to its templates
/// point) become `namespace`, which the test's system trusts.
pub fn in_test_namespace(doc: Value, namespace: &str) -> Value {
    let text = doc.to_string().replace(
        &format!("\"{SAMPLE_TEMPLATE_NAMESPACE}\""),
        &format!("\"{namespace}\""),
    );
    let mut doc: Value = serde_json::from_str(&text).expect("JSON stays JSON");
    doc["metadata"]["namespace"] = Value::from(namespace);
    doc
}

/// Applies `docs` into `namespace`. Server-side, as a user should: a later `kubectl apply
/// --server-side` by someone else then takes only what it names (a client-side apply is
/// migrated to the next one). Each goes through [`in_test_namespace`]; the samples' Namespace
/// document is left out.
fn apply_in(env: &Env, namespace: &str, docs: Vec<Value>) -> Result<()> {
    let docs: Vec<String> = docs
        .into_iter()
        .filter(|v| v["kind"] != "Namespace")
        .map(|v| in_test_namespace(v, namespace).to_string())
        .collect();
    env.kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&docs.join("\n")),
    )?;
    Ok(())
}

/// `PATH` with the environment's `kubectl` first (`hack/testenv.sh` runs it).
fn kubectl_path(env: &Env) -> std::ffi::OsString {
    let mut dirs = vec![env.bin_dir.clone()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).unwrap_or_default()
}

/// Applies the sample templates and Cluster of `manifests/samples/` into `namespace`; with
/// `retain_vpc`, the CAPTCluster keeps its VPC on deletion. Cluster API core, when the
/// environment runs it, adopts the CAPT objects; without it, their
/// `cluster.x-k8s.io/cluster-name` label names their Cluster.
pub fn apply_samples(env: &Env, namespace: &str, retain_vpc: bool) -> Result<()> {
    apply_samples_edited(env, namespace, |v| {
        if retain_vpc && v["kind"] == "CAPTCluster" {
            v["spec"]["retainVpcOnDelete"] = Value::Bool(true);
        }
    })
}

/// [`apply_samples`] with each document changed by `edit` first.
pub fn apply_samples_edited(
    env: &Env,
    namespace: &str,
    edit: impl FnMut(&mut Value),
) -> Result<()> {
    let mut docs = sample_docs("templates.yaml")?;
    docs.extend(sample_docs("cluster.yaml")?);
    docs.iter_mut().for_each(edit);
    apply_in(env, namespace, docs)
}

/// Applies the sample templates and the sample Cluster of `manifests/samples/` renamed to
/// `name` into `namespace`, its Cluster and CAPT objects labelled
/// `cluster.x-k8s.io/watch-filter=<shard>`: a stack of one shard.
pub fn apply_sample_in_shard(env: &Env, namespace: &str, name: &str, shard: &str) -> Result<()> {
    let mut docs = sample_docs("templates.yaml")?;
    let text = std::fs::read_to_string(repo_root().join("manifests/samples/cluster.yaml"))?;
    let text = text.replace("demo", name);
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let mut v: Value = serde::Deserialize::deserialize(doc)?;
        v["metadata"]["labels"][crate::pod::WATCH_FILTER_LABEL] = Value::from(shard);
        docs.push(v);
    }
    apply_in(env, namespace, docs)
}

/// Changes the `cluster_endpoint` output of the sample's control-plane Workspace in
/// `namespace` where it comes from: the WorkspaceTemplate (the controller renders the
/// Workspace from it, and takes back an annotation changed on the Workspace itself).
pub fn set_endpoint_output(env: &Env, namespace: &str, endpoint: &str) -> Result<()> {
    let outputs =
        serde_json::json!({"cluster_endpoint": endpoint, "cluster_name": "${CLUSTER_NAME}"});
    patch_control_plane_template(
        env,
        namespace,
        &serde_json::json!({"spec": {"template": {"metadata":
            {"annotations": {"fake.tf.upbound.io/outputs": outputs.to_string()}}}}}),
    )
}

/// Merge-patches the sample's control-plane WorkspaceTemplate (`eks`) in `namespace`.
pub fn patch_control_plane_template(env: &Env, namespace: &str, patch: &Value) -> Result<()> {
    env.kubectl_ok(
        &[
            "patch",
            "workspacetemplate",
            "eks",
            "-n",
            namespace,
            "--type=merge",
            "-p",
            &patch.to_string(),
        ],
        None,
    )?;
    Ok(())
}

/// `127.0.0.1:<a port free a moment ago>`.
pub fn free_local_addr() -> Result<String> {
    let [addr] = free_local_addrs()?;
    Ok(addr)
}

/// `N` addresses like [`free_local_addr`], each a different port: all are bound at once
/// before any is let go (two ports taken one after the other can be the same one, which the
/// second listener of a process then finds in use).
pub fn free_local_addrs<const N: usize>() -> Result<[String; N]> {
    let listeners = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let addrs = listeners
        .iter()
        .map(|l| Ok(format!("127.0.0.1:{}", l.local_addr()?.port())))
        .collect::<Result<Vec<_>>>()?;
    Ok(addrs.try_into().expect("N addresses"))
}

/// `GET path` over plain HTTP/1.0 to `addr`: the status code and the body.
pub async fn plain_get(addr: &str, path: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .with_context(|| format!("no HTTP answer from {addr}: {answer:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .with_context(|| format!("no HTTP status from {addr}: {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// A copy of the environment's kubeconfig that impersonates `user` (e.g.
/// `system:serviceaccount:capt-system:capt-controller`), written next to `dir`.
pub fn impersonating_kubeconfig(user: &str, dir: &std::path::Path) -> Result<std::path::PathBuf> {
    let text = std::fs::read_to_string(&env().kubeconfig)?;
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let users = config["users"]
        .as_sequence_mut()
        .context("kubeconfig has users")?;
    for u in users {
        u["user"]["as"] = serde_yaml::Value::from(user);
    }
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("kubeconfig-{}", user.replace(':', "-")));
    std::fs::write(&path, serde_yaml::to_string(&config)?)?;
    Ok(path)
}
