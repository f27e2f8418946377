//! Support for integration tests against the real API server of `hack/testenv.sh`.
//!
//! [`env`] starts the environment once per test process, or reuses one that is running
//! (`hack/test.sh` starts it before the tests and stops it after). It runs the real Cluster
//! API core manager beside the API server; a test binary whose subject is our own Cluster
//! writer (core would be noise there) calls [`without_core`] first in each test, and gets an
//! environment of its own without core (`.testenv-nocore`). Each test works in a
//! [`TestNamespace`] of its own, deleted when the test ends, pass or fail.
#![forbid(unsafe_code)]

pub mod api_server_fault;
pub mod applier;
pub mod audit_log;
pub mod deletion_order;
pub mod doc_blocks;
pub mod fake_provider;
pub mod held_proxy;
pub mod pod;
pub mod schema_objects;
pub mod system;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// A running test environment.
#[derive(Debug, Clone)]
pub struct Env {
    /// The kubeconfig that reaches the API server as an administrator.
    pub kubeconfig: PathBuf,
    /// Where `kubectl`, `kube-apiserver` and `etcd` were built.
    pub bin_dir: PathBuf,
    /// True when the Cluster API core manager runs in it.
    pub core: bool,
    /// Where the Cluster API core manager and `clusterctl` were built, when core runs.
    pub cluster_api_bin: Option<PathBuf>,
    /// True when the real provider-terraform runs in it (`hack/testenv.sh start
    /// --real-provider`): no fake provider may run beside it, the two would fight over every
    /// Workspace.
    pub real_provider: bool,
}

static WITHOUT_CORE: AtomicBool = AtomicBool::new(false);

/// Makes [`env`] an environment without Cluster API core in this test process. Call it
/// first in every test of a binary that needs it (whichever test runs first decides).
pub fn without_core() {
    WITHOUT_CORE.store(true, Ordering::SeqCst);
}

static WITH_REAL_PROVIDER: AtomicBool = AtomicBool::new(false);

/// Makes [`env`] an environment with the real provider-terraform and OpenTofu, with Cluster
/// API core, in this test process (`.testenv-real`; see `hack/real-provider.sh`): the
/// [`system::System`]s of this process then start no fake provider. Call it first in every
/// test of a binary that needs it. One real provider runs per machine (its metrics port is
/// fixed): `hack/testenv.sh` holds a machine-wide lock while it runs.
pub fn with_real_provider() {
    WITH_REAL_PROVIDER.store(true, Ordering::SeqCst);
}

static PROCESS_LOG: OnceLock<&'static str> = OnceLock::new();

/// Makes every process this test binary starts from now on (the status-applier, the
/// controller and the fake provider of [`system::System`], [`applier::Applier`] and
/// [`fake_provider::FakeProvider`]) log at `RUST_LOG=trace`, every crate included.
pub fn log_everything() {
    let _ = PROCESS_LOG.set("trace");
}

/// The `RUST_LOG` a started process gets: `trace` after [`log_everything`], else `default`.
pub(crate) fn process_log(default: &str) -> String {
    PROCESS_LOG.get().copied().unwrap_or(default).to_owned()
}

/// The Cluster in Cluster API's `v1beta1` (`kubectl get` names the resource so): core v1.11+
/// stores and shows `v1beta2`, and serves `v1beta1` through its conversion webhook with the
/// fields the v1beta1 contract is about (`infrastructureReady`, `controlPlaneReady`, and the
/// `Ready` summary with severities in `status.conditions`), which core still computes.
pub const CLUSTER_V1BETA1: &str = "clusters.v1beta1.cluster.x-k8s.io";

/// The Cluster in Cluster API's `v1beta2` (what core v1.11+ stores and the v1beta2 contract
/// speaks of: `status.initialization`, plain `metav1.Condition`s such as
/// `InfrastructureReady` and `ControlPlaneAvailable`).
pub const CLUSTER_V1BETA2: &str = "clusters.v1beta2.cluster.x-k8s.io";

/// The repository's root directory.
pub fn repo_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        // Cargo sets it at run time too (`cargo test`, `cargo run`); the compile-time value
        // may name another clone that shared the target directory (CI's, say): cargo
        // rebuilds on changed files, not on a moved tree.
        let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
        manifest
            .parent()
            .expect("tests/ has a parent")
            .to_path_buf()
    })
}

/// The environment, started by `hack/testenv.sh start` on first use in this process.
pub fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| start_env().unwrap_or_else(|e| panic!("test environment: {e:#}")))
}

fn start_env() -> Result<Env> {
    let mut cmd = Command::new(repo_root().join("hack/testenv.sh"));
    cmd.arg("start");
    let dir = std::env::var("CAPT_TESTENV_DIR")
        .unwrap_or_else(|_| repo_root().join(".testenv").display().to_string());
    if WITH_REAL_PROVIDER.load(Ordering::SeqCst) {
        cmd.arg("--real-provider")
            .env("CAPT_TESTENV_DIR", format!("{dir}-real"))
            .env("CAPT_TESTENV_CORE", "1");
    } else if WITHOUT_CORE.load(Ordering::SeqCst) {
        cmd.env("CAPT_TESTENV_DIR", format!("{dir}-nocore"))
            .env("CAPT_TESTENV_CORE", "0");
    }
    run_start(cmd)
}

/// Runs `hack/testenv.sh start` as `cmd` says and reads the environment it prints.
fn run_start(mut cmd: Command) -> Result<Env> {
    let out = cmd.output().context("running hack/testenv.sh start")?;
    if !out.status.success() {
        bail!(
            "hack/testenv.sh start failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let export = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("export {name}=")))
            .map(|v| v.split(':').next().unwrap_or(v).to_owned())
            .with_context(|| format!("hack/testenv.sh printed no {name}: {stdout}"))
    };
    // PATH is `<Kubernetes bin>[:<Cluster API bin>]:$PATH`.
    let path = stdout
        .lines()
        .find_map(|l| l.strip_prefix("export PATH="))
        .unwrap_or_default();
    let cluster_api_bin = path
        .split(':')
        .nth(1)
        .filter(|p| !p.starts_with('$'))
        .map(PathBuf::from);
    Ok(Env {
        kubeconfig: export("KUBECONFIG")?.into(),
        bin_dir: export("PATH")?.into(),
        core: export("CAPT_TESTENV_CORE")? == "1",
        cluster_api_bin,
        real_provider: export("CAPT_TESTENV_REAL_PROVIDER").is_ok_and(|v| v == "1"),
    })
}

impl Env {
    /// Another environment, with Cluster API core, in the state directory `dir` (started, or
    /// reused when one runs there): not [`env`]'s, so a test that needs two API servers (a
    /// `clusterctl move`) gets them. Stop it with [`Env::stop`].
    pub fn start_in(dir: &Path) -> Result<Env> {
        let mut cmd = Command::new(repo_root().join("hack/testenv.sh"));
        cmd.arg("start")
            .env("CAPT_TESTENV_DIR", dir)
            .env("CAPT_TESTENV_CORE", "1");
        run_start(cmd)
    }

    /// `hack/testenv.sh stop` for this environment's state directory.
    pub fn stop(&self) -> Result<()> {
        let out = Command::new(repo_root().join("hack/testenv.sh"))
            .arg("stop")
            .env("CAPT_TESTENV_DIR", self.state_dir())
            .output()
            .context("running hack/testenv.sh stop")?;
        if !out.status.success() {
            bail!(
                "hack/testenv.sh stop failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// The state directory (`CAPT_TESTENV_DIR`): the kubeconfig's, the audit log's.
    pub fn state_dir(&self) -> &Path {
        self.kubeconfig
            .parent()
            .expect("the kubeconfig lies in the state directory")
    }

    /// The real `clusterctl` built beside the Cluster API core manager (`hack/testenv.sh`),
    /// with `HOME` set to `home` (clusterctl keeps an overrides folder and its version
    /// check's state there) and no version check: clusterctl would otherwise ask GitHub for
    /// its latest release after every command, which needs the network (offline, it fails
    /// the command: "unable to verify clusterctl version").
    pub fn clusterctl(&self, home: &Path) -> Result<Command> {
        let bin = self
            .cluster_api_bin
            .as_ref()
            .context("clusterctl is built with Cluster API core (CAPT_TESTENV_CORE=1)")?
            .join("clusterctl");
        let mut cmd = Command::new(bin);
        cmd.env("HOME", home)
            .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true");
        Ok(cmd)
    }

    /// A client for the API server.
    pub async fn client(&self) -> Result<kube::Client> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// The real `kubectl`, pointed at the environment.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.bin_dir.join("kubectl"));
        cmd.env("KUBECONFIG", &self.kubeconfig);
        cmd
    }

    /// Runs kubectl with `args` and `stdin`, returning its output whatever the exit status.
    pub fn kubectl_run(&self, args: &[&str], stdin: Option<&str>) -> Result<Output> {
        use std::io::Write;
        let mut cmd = self.kubectl();
        cmd.args(args).stdin(std::process::Stdio::piped());
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().context("starting kubectl")?;
        let mut pipe = child.stdin.take().expect("stdin is piped");
        pipe.write_all(stdin.unwrap_or_default().as_bytes())?;
        drop(pipe);
        Ok(child.wait_with_output()?)
    }

    /// Runs kubectl and returns its stdout, failing with its stderr when it fails.
    pub fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let out = self.kubectl_run(args, stdin)?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8(out.stdout)?)
    }
}

/// A namespace of one test's own, deleted when dropped.
#[derive(Debug)]
pub struct TestNamespace {
    /// The namespace's name.
    pub name: String,
}

impl TestNamespace {
    /// Creates a namespace named after `prefix`, unique in this run.
    pub async fn create(client: &kube::Client, prefix: &str) -> Result<Self> {
        let name = unique_name(prefix);
        let ns: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(Self { name })
    }
}

/// The namespaces `args` (a controller's) trust with code: `--allow-template-namespace NS`,
/// `=NS`, comma-separated lists.
pub fn trusted_namespaces(args: &[String]) -> Vec<String> {
    const FLAG: &str = "--allow-template-namespace";
    let mut names = Vec::new();
    for (i, arg) in args.iter().enumerate() {
        let value = match arg.strip_prefix(FLAG) {
            Some("") => args.get(i + 1).map(String::as_str),
            Some(rest) => rest.strip_prefix('='),
            None => None,
        };
        names.extend(
            value
                .into_iter()
                .flat_map(|v| v.split(','))
                .map(str::to_owned),
        );
    }
    names
}

/// Marks the namespaces `args` trust with code as the install marks the one it creates:
/// `capt.cluster.x-k8s.io/trusted-with-code=true`, set under the field manager and operation
/// that created the namespace, which is what the controller checks at start
/// (docs/operating.md, "The trusted namespace"). A test's namespaces are made by the test,
/// not by an install: this stands in for the install creating one with the label. A namespace
/// that does not exist (yet) is left alone: the controller then refuses to start, by name.
pub fn mark_trusted_namespaces(args: &[String]) -> Result<()> {
    mark_trusted_namespaces_on(env(), args)
}

/// [`mark_trusted_namespaces`] on the API server of `on`.
pub fn mark_trusted_namespaces_on(on: &Env, args: &[String]) -> Result<()> {
    let label = capt_controller::tenancy::TRUSTED_NAMESPACE_LABEL;
    for name in trusted_namespaces(args) {
        let out = on.kubectl_run(
            &[
                "get",
                "namespace",
                &name,
                "-o",
                "json",
                "--ignore-not-found",
                "--show-managed-fields",
            ],
            None,
        )?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || text.trim().is_empty() {
            continue;
        }
        let namespace: serde_json::Value = serde_json::from_str(&text)?;
        if namespace["metadata"]["labels"][label] == "true" {
            continue;
        }
        // The creator's entry owns the label the API server set when it created the namespace.
        let creator = namespace["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| {
                !e["fieldsV1"]["f:metadata"]["f:labels"]["f:kubernetes.io/metadata.name"].is_null()
            })
            .with_context(|| {
                format!("namespace {name} has no creator in its managedFields: {namespace}")
            })?;
        let manager = creator["manager"].as_str().unwrap_or_default();
        let assignment = format!("{label}=true");
        let field_manager = format!("--field-manager={manager}");
        // Under the creator's manager and operation (an Update: the one that owns the server's
        // label), the label joins the creator's entry.
        anyhow::ensure!(
            creator["operation"] == "Update",
            "namespace {name} was created by {creator}: only a creator's Update can be joined"
        );
        on.kubectl_ok(
            &["label", "namespace", &name, &assignment, &field_manager],
            None,
        )?;
    }
    Ok(())
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Dropping cannot await: kubectl deletes it, and the namespace controller of
        // hack/testenv.sh finalizes it in the background.
        let _ = env()
            .kubectl()
            .args([
                "delete",
                "namespace",
                &self.name,
                "--wait=false",
                "--ignore-not-found",
            ])
            .output();
    }
}

/// A directory of its own under the system's temporary directory (`<prefix>-<pid>-<n>`),
/// removed when dropped, unless the thread is panicking: a failing test's logs and sockets
/// stay to be read, and its message says where.
pub struct Scratch(std::path::PathBuf);

impl Scratch {
    /// Creates the directory.
    pub fn new(prefix: &str) -> Result<Self> {
        let path = std::env::temp_dir().join(unique_name(prefix));
        std::fs::create_dir_all(&path)?;
        Ok(Self(path))
    }
}

/// The directory's path.
impl std::ops::Deref for Scratch {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for Scratch {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

/// As a command's argument or environment value.
impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

/// A file in a [`Scratch`] directory that holds it alone: its path, the directory removed
/// with it.
pub struct ScratchFile {
    path: std::path::PathBuf,
    _dir: Scratch,
}

impl ScratchFile {
    /// `path`, in `dir`, goes with `dir`.
    pub fn new(dir: Scratch, path: std::path::PathBuf) -> Self {
        Self { path, _dir: dir }
    }
}

impl std::ops::Deref for ScratchFile {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

impl AsRef<std::path::Path> for ScratchFile {
    fn as_ref(&self) -> &std::path::Path {
        &self.path
    }
}

/// As a command's argument or environment value.
impl AsRef<std::ffi::OsStr> for ScratchFile {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- kept {} for what the failure left", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A name unique within this test run: `prefix-<pid>-<n>`.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id() % 100_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Deletes a cluster-scoped or namespaced object if it exists, ignoring "not found".
pub async fn delete_ignoring_missing<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The YAML documents of `yaml` as JSON values, empty documents left out.
pub fn yaml_documents(yaml: &str) -> Result<Vec<serde_json::Value>> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let v: serde_json::Value = serde::Deserialize::deserialize(doc)?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

/// Applies the pod's namespace, RBAC and the admission policy that narrows its Secret rights
/// (`manifests/deploy/{namespace,rbac,secret-policy}.yaml`) to the environment, server-side.
pub fn install_rbac() -> Result<()> {
    let deploy = repo_root().join("manifests/deploy");
    for file in ["namespace.yaml", "rbac.yaml", "secret-policy.yaml"] {
        env().kubectl_ok(
            &[
                "apply",
                "--server-side",
                "-f",
                &deploy.join(file).display().to_string(),
            ],
            None,
        )?;
    }
    Ok(())
}

/// The notes of the Warning Events (`events.k8s.io`) of `ns` with `reason` about the object
/// named `name`.
pub fn warnings(ns: &str, reason: &str, name: &str) -> Result<Vec<String>> {
    let selector = format!("reason={reason}");
    let args = [
        "get",
        "events.events.k8s.io",
        "-n",
        ns,
        "--field-selector",
        &selector,
    ];
    let out = env().kubectl_ok(&[&args[..], &["-o", "json"]].concat(), None)?;
    let events: serde_json::Value = serde_json::from_str(&out)?;
    Ok(events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["type"] == "Warning" && e["regarding"]["name"] == name)
        .map(|e| e["note"].as_str().unwrap_or_default().to_owned())
        .collect())
}

/// The name CAPT passes to Terraform for the Cluster `cluster` of `namespace` (its
/// `CLUSTER_NAME`): `<namespace>_<cluster>` (`capt_controller::names`).
pub fn eks_name(namespace: &str, cluster: &str) -> String {
    capt_controller::names::namespaced(namespace, cluster)
}

/// The API server host the samples' EKS template gives the Cluster `cluster` of `namespace`
/// (`https://${CLUSTER_NAME}.gr7.ap-northeast-1.eks.amazonaws.com`, made up): its
/// [`eks_name`], which carries the namespace.
pub fn sample_endpoint_host(namespace: &str, cluster: &str) -> String {
    format!(
        "{}.gr7.ap-northeast-1.eks.amazonaws.com",
        eks_name(namespace, cluster)
    )
}

/// The condition of `type_` in an object's `status.conditions`, if it has one.
pub fn condition<'a>(object: &'a serde_json::Value, type_: &str) -> Option<&'a serde_json::Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// The provider's last word on a Workspace (the real one's and the fake one's alike): its
/// status carries the checksum again (an apply leaves it out until the next poll).
pub fn provider_rests(workspace: &serde_json::Value) -> bool {
    workspace["status"]["atProvider"]["checksum"].is_string()
}

/// `value` without the fields at `paths`: dot-separated keys, `[]` for every element of an
/// array (`status.conditions[].lastTransitionTime`). For comparing two versions of an object
/// with the fields that may legitimately differ named, and nothing else left out.
pub fn without_paths(value: &serde_json::Value, paths: &[&str]) -> serde_json::Value {
    fn remove(value: &mut serde_json::Value, path: &[&str]) {
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        let (key, every) = match first.strip_suffix("[]") {
            Some(key) => (key, true),
            None => (*first, false),
        };
        let Some(map) = value.as_object_mut() else {
            return;
        };
        if rest.is_empty() && !every {
            map.remove(key);
            return;
        }
        match map.get_mut(key) {
            Some(serde_json::Value::Array(items)) if every => {
                for item in items {
                    remove(item, rest);
                }
            }
            Some(inner) if !every => remove(inner, rest),
            _ => {}
        }
    }
    let mut value = value.clone();
    for path in paths {
        remove(&mut value, &path.split('.').collect::<Vec<_>>());
    }
    value
}

/// The paths (`a.b[2].c`) at which `a` and `b` differ, for failure messages.
pub fn differences(a: &serde_json::Value, b: &serde_json::Value) -> Vec<String> {
    fn walk(a: &serde_json::Value, b: &serde_json::Value, at: String, out: &mut Vec<String>) {
        use serde_json::Value;
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    let path = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    match (x.get(k), y.get(k)) {
                        (Some(v), Some(w)) => walk(v, w, path, out),
                        (v, w) => out.push(format!("{path}: {v:?} != {w:?}")),
                    }
                }
            }
            (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
                for (i, (v, w)) in x.iter().zip(y).enumerate() {
                    walk(v, w, format!("{at}[{i}]"), out);
                }
            }
            _ if a != b => out.push(format!("{at}: {a} != {b}")),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(a, b, String::new(), &mut out);
    out
}

#[cfg(test)]
mod json_tests {
    use super::{differences, without_paths};
    use serde_json::json;

    #[test]
    fn named_paths_are_removed_and_nothing_else() {
        let v = json!({"status": {"a": 1, "b": {"c": 2, "d": 3},
            "conditions": [{"type": "X", "t": 1}, {"type": "Y", "t": 2}]}});
        assert_eq!(
            without_paths(
                &v,
                &["status.b.c", "status.conditions[].t", "status.missing.x"]
            ),
            json!({"status": {"a": 1, "b": {"d": 3},
                "conditions": [{"type": "X"}, {"type": "Y"}]}})
        );
    }

    #[test]
    fn differences_name_their_paths() {
        let a = json!({"s": {"a": 1, "l": [1, 2], "gone": true}});
        let b = json!({"s": {"a": 2, "l": [1, 3]}});
        assert_eq!(
            differences(&a, &b),
            [
                "s.a: 1 != 2",
                "s.gone: Some(Bool(true)) != None",
                "s.l[1]: 2 != 3"
            ]
        );
    }
}
