//! The system as `manifests/deploy/deployment.yaml` runs it, read from that file at run time
//! so that the two cannot drift: each container's `command` and `env` become a process's
//! program, arguments and environment (and nothing else: the environment is cleared first).
//! What a local run must change is changed, and said ([`Pod::differences`]):
//!
//! - the programs are the release binaries next to this one (`/capt-controller` →
//!   `target/release/capt-controller`);
//! - every path under a volume mount is moved to a local directory: an `emptyDir` (the
//!   socket's) becomes an empty directory, a ConfigMap made by the kustomization's
//!   `configMapGenerator` (the applier's policy) a directory holding the files it is made of
//!   (`manifests/deploy/status-applier-policy.yaml` as `policy.yaml`);
//! - every `*_BIND_ADDRESS` becomes a free port on 127.0.0.1;
//! - `fieldRef` values: `metadata.name` is a fixed pod name (the same after a restart, as a
//!   container restarted in its pod keeps it), `metadata.namespace` is `capt-system`, the
//!   Deployment's namespace;
//! - `KUBECONFIG` is added: a token of the pod's ServiceAccount (see `identity`).

use anyhow::{Context, Result, bail};
use capt_tests::applier::binary;
use capt_tests::repo_root;
use capt_tests::system::{free_local_addr, plain_get};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The Deployment's file, relative to the repository.
pub(crate) const DEPLOYMENT: &str = "manifests/deploy/deployment.yaml";
/// The kustomization that generates the ConfigMaps the pod mounts.
const KUSTOMIZATION: &str = "manifests/kustomization.yaml";
/// How the controller is told the namespaces it trusts with code.
const TEMPLATE_NAMESPACES_ENV: &str = "CAPT_ALLOW_TEMPLATE_NAMESPACES";
const TEMPLATE_NAMESPACE_FLAG: &str = "--allow-template-namespace";
/// The containers, by name.
pub(crate) const APPLIER: &str = "status-applier";
pub(crate) const MANAGER: &str = "manager";

/// The Deployment, as far as the benchmark uses it.
pub(crate) struct Pod {
    pub(crate) namespace: String,
    pub(crate) replicas: u64,
    spec: Value,
}

/// One container made a local process: what it runs with, and what changed.
#[derive(Clone)]
pub(crate) struct Launch {
    pub(crate) container: String,
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    /// The probe listener (`/healthz`, `/readyz`), plain HTTP.
    pub(crate) probe_addr: Option<String>,
    /// The metrics listener (HTTPS, as deployed).
    pub(crate) metrics_addr: Option<String>,
    /// Where the container's paths went, and the like, for the differences list.
    pub(crate) changes: Vec<String>,
}

impl Pod {
    pub(crate) fn read() -> Result<Self> {
        let text = std::fs::read_to_string(repo_root().join(DEPLOYMENT))?;
        let doc = capt_tests::yaml_documents(&text)?
            .into_iter()
            .find(|d| d["kind"] == "Deployment")
            .with_context(|| format!("no Deployment in {DEPLOYMENT}"))?;
        Self::of(&doc)
    }

    fn of(doc: &Value) -> Result<Self> {
        Ok(Self {
            namespace: doc["metadata"]["namespace"]
                .as_str()
                .context("the Deployment's namespace")?
                .to_owned(),
            replicas: doc["spec"]["replicas"].as_u64().unwrap_or(1),
            spec: doc["spec"]["template"]["spec"].clone(),
        })
    }

    fn container(&self, name: &str) -> Result<&Value> {
        self.spec["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == name)
            .with_context(|| format!("no container {name} in {DEPLOYMENT}"))
    }

    /// The namespace whose WorkspaceTemplates the `manager` container trusts with code: the
    /// first of its `CAPT_ALLOW_TEMPLATE_NAMESPACES`, else of its `--allow-template-namespace`
    /// flags. The benchmark keeps its templates there, as an operator would: a template of any
    /// other namespace is refused.
    pub(crate) fn template_namespace(&self) -> Result<String> {
        let c = self.container(MANAGER)?;
        let from_env = c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == TEMPLATE_NAMESPACES_ENV)
            .and_then(|e| e["value"].as_str());
        let words: Vec<&str> = ["command", "args"]
            .iter()
            .flat_map(|k| c[k].as_array().into_iter().flatten())
            .filter_map(Value::as_str)
            .collect();
        let from_flags = words.iter().enumerate().find_map(|(i, w)| {
            match w.strip_prefix(TEMPLATE_NAMESPACE_FLAG)? {
                "" => words.get(i + 1).copied(),
                rest => rest.strip_prefix('='),
            }
        });
        from_env
            .or(from_flags)
            .and_then(|list| list.split(',').map(str::trim).find(|ns| !ns.is_empty()))
            .map(str::to_owned)
            .with_context(|| {
                format!(
                    "container {MANAGER} in {DEPLOYMENT} trusts no template namespace \
                     ({TEMPLATE_NAMESPACES_ENV} or {TEMPLATE_NAMESPACE_FLAG}): every \
                     WorkspaceTemplate would be refused"
                )
            })
    }

    /// The memory limit of container `name`, in MiB (`256Mi`, `1Gi`, or bytes).
    pub(crate) fn memory_limit_mib(&self, name: &str) -> Result<f64> {
        let text = self.container(name)?["resources"]["limits"]["memory"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("container {name} has no memory limit in {DEPLOYMENT}"))?;
        let (number, unit) =
            text.split_at(text.find(|c: char| c.is_alphabetic()).unwrap_or(text.len()));
        let value: f64 = number
            .parse()
            .with_context(|| format!("memory limit of {name}: {text:?}"))?;
        let factor = match unit {
            "Ki" => 1.0 / 1024.0,
            "Mi" => 1.0,
            "Gi" => 1024.0,
            "" => 1.0 / (1024.0 * 1024.0),
            other => anyhow::bail!("memory limit of {name}: unit {other:?} not understood"),
        };
        Ok(value * factor)
    }

    /// The resources (requests and limits) a container has in the Deployment, as text.
    pub(crate) fn resources(&self, name: &str) -> Result<String> {
        Ok(self.container(name)?["resources"].to_string())
    }

    /// Container `name` as a local process, its volumes under `dir`, its pod name `pod_name`,
    /// reaching the API server with `kubeconfig`; `extra` are flags added after the
    /// Deployment's (the baseline's `--baseline-full-update`).
    pub(crate) fn launch(
        &self,
        name: &str,
        dir: &Path,
        pod_name: &str,
        kubeconfig: &Path,
        extra: &[String],
    ) -> Result<Launch> {
        let c = self.container(name)?;
        let mut changes = Vec::new();
        let mounts = self.mounts(c, dir, &mut changes)?;
        let local = |s: &str| -> String {
            // The longest mount path that `s` lies under.
            let found = mounts
                .iter()
                .filter(|(m, _)| s == m.as_str() || s.starts_with(&format!("{m}/")))
                .max_by_key(|(m, _)| m.len());
            match found {
                Some((m, to)) => format!("{}{}", to.display(), &s[m.len()..]),
                None => s.to_owned(),
            }
        };
        let mut command: Vec<String> = c["command"]
            .as_array()
            .context("the container's command")?
            .iter()
            .map(|a| a.as_str().map(str::to_owned).context("a command word"))
            .collect::<Result<_>>()?;
        command.extend(c["args"].as_array().into_iter().flatten().map(|a| {
            a.as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| a.to_string())
        }));
        let program_name = Path::new(&command[0])
            .file_name()
            .context("the command's program")?
            .to_string_lossy()
            .into_owned();
        let program = binary(&program_name);
        changes.push(format!(
            "`{name}`: runs {} (release build) instead of the image's `{}`",
            program_name, command[0]
        ));
        let args: Vec<String> = command[1..].iter().map(|a| local(a)).collect();
        for (from, to) in command[1..].iter().zip(&args) {
            if from != to {
                changes.push(format!(
                    "`{name}`: argument {from} → the same path in the volume's local directory"
                ));
            }
        }
        let mut env = Vec::new();
        let (mut probe_addr, mut metrics_addr) = (None, None);
        for e in c["env"].as_array().into_iter().flatten() {
            let key = e["name"].as_str().context("an env name")?.to_owned();
            let value = if let Some(v) = e.get("value") {
                let v = v
                    .as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| v.to_string());
                if key.ends_with("_BIND_ADDRESS") {
                    let addr = free_local_addr()?;
                    changes.push(format!("`{name}`: {key} {v} → 127.0.0.1:<a free port>"));
                    if key.contains("METRICS") {
                        metrics_addr = Some(addr.clone());
                    } else if key.contains("HEALTH_PROBE") {
                        probe_addr = Some(addr.clone());
                    }
                    addr
                } else {
                    let to = local(&v);
                    if to != v {
                        changes.push(format!(
                            "`{name}`: {key} {v} → the same path in the volume's local directory"
                        ));
                    }
                    to
                }
            } else if let Some(path) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                let v = match path {
                    "metadata.name" => pod_name.to_owned(),
                    "metadata.namespace" => self.namespace.clone(),
                    other => bail!("{name}: env {key} from fieldRef {other}: not handled"),
                };
                changes.push(format!("`{name}`: {key} (fieldRef {path}) = {v}"));
                v
            } else {
                bail!("{name}: env {key}: neither value nor fieldRef (not handled)");
            };
            env.push((key, value));
        }
        env.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
        let mut args = args;
        args.extend(extra.iter().cloned());
        Ok(Launch {
            container: name.to_owned(),
            program,
            args,
            env,
            probe_addr,
            metrics_addr,
            changes,
        })
    }

    /// The container's volume mounts as local directories under `dir` (created and filled).
    fn mounts(
        &self,
        c: &Value,
        dir: &Path,
        changes: &mut Vec<String>,
    ) -> Result<Vec<(String, PathBuf)>> {
        let name = c["name"].as_str().unwrap_or("");
        let mut out = Vec::new();
        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            let volume = m["name"].as_str().context("a mount's volume")?;
            let path = m["mountPath"].as_str().context("a mount's path")?;
            let spec = self.spec["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["name"] == volume)
                .with_context(|| format!("no volume {volume}"))?;
            let to = dir.join("volumes").join(volume);
            std::fs::create_dir_all(&to)?;
            if spec.get("emptyDir").is_some() {
                changes.push(format!(
                    "`{name}`: volume {volume} (emptyDir at {path}) is a local directory"
                ));
            } else if let Some(map) = spec["configMap"]["name"].as_str() {
                for (key, file) in config_map_files(map)? {
                    std::fs::copy(repo_root().join("manifests").join(&file), to.join(&key))
                        .with_context(|| format!("copying manifests/{file}"))?;
                    changes.push(format!(
                        "`{name}`: ConfigMap {map} (at {path}) is a local directory holding \
                         manifests/{file} as {key}"
                    ));
                }
            } else {
                bail!("{name}: volume {volume} is neither an emptyDir nor a ConfigMap");
            }
            out.push((path.to_owned(), to));
        }
        Ok(out)
    }
}

/// The files the kustomization's `configMapGenerator` makes ConfigMap `map` of: (key, path
/// relative to `manifests/`).
fn config_map_files(map: &str) -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(repo_root().join(KUSTOMIZATION))?;
    let doc: Value = serde_yaml::from_str(&text)?;
    let generator = doc["configMapGenerator"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|g| g["name"] == map)
        .with_context(|| format!("{KUSTOMIZATION} generates no ConfigMap {map}"))?;
    generator["files"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            let f = f.as_str().context("a file entry")?;
            Ok(match f.split_once('=') {
                Some((key, path)) => (key.to_owned(), path.to_owned()),
                None => (
                    Path::new(f)
                        .file_name()
                        .context("a file name")?
                        .to_string_lossy()
                        .into_owned(),
                    f.to_owned(),
                ),
            })
        })
        .collect()
}

/// A running container-as-process, restartable the same way.
pub(crate) struct Process {
    pub(crate) launch: Launch,
    child: Child,
    log: PathBuf,
    starts: u32,
    killed: bool,
}

impl Process {
    pub(crate) fn start(launch: Launch, dir: &Path) -> Result<Self> {
        let log = dir.join(format!("{}.log", launch.container));
        let child = spawn(&launch, &log)?;
        Ok(Self {
            launch,
            child,
            log,
            starts: 1,
            killed: false,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, like a crashed container.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.killed = true;
    }

    /// Not killed by the benchmark (a process that crashed on its own is not noticed here:
    /// its probes fail).
    pub(crate) fn running(&self) -> bool {
        !self.killed
    }

    /// Starts the same program again, same arguments and environment, logging to a new file.
    pub(crate) fn restart(&mut self) -> Result<()> {
        self.kill();
        self.starts += 1;
        self.log = self.log.with_extension(format!("{}.log", self.starts));
        self.child = spawn(&self.launch, &self.log)?;
        self.killed = false;
        Ok(())
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The HTTP status of `path` on the probe listener (0 when it does not answer).
    pub(crate) async fn probe(&self, path: &str) -> u16 {
        match &self.launch.probe_addr {
            Some(addr) => plain_get(addr, path).await.map(|(s, _)| s).unwrap_or(0),
            None => 0,
        }
    }

    /// `/metrics` over HTTPS with `token`, as an authorized scraper reads it.
    pub(crate) async fn metrics(&self, token: &str) -> Result<String> {
        let addr = self
            .launch
            .metrics_addr
            .as_ref()
            .context("no metrics listener")?;
        let out = tokio::process::Command::new("curl")
            .args(["-sSfk", "--max-time", "10", "-H"])
            .arg(format!("Authorization: Bearer {token}"))
            .arg(format!("https://{addr}/metrics"))
            .output()
            .await
            .context("running curl")?;
        if !out.status.success() {
            bail!(
                "scraping {} /metrics: {}",
                self.launch.container,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8(out.stdout)?)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

fn spawn(launch: &Launch, log: &Path) -> Result<Child> {
    let mut command = Command::new(&launch.program);
    command
        .args(&launch.args)
        .env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)));
    if std::env::var_os(HEAP_PROFILE).is_some() {
        heap_profile(&mut command, log)?;
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .with_context(|| format!("starting {}", launch.program.display()))
}

/// Set (to anything) to record a heap profile of every process the benchmark starts.
const HEAP_PROFILE: &str = "CAPT_BENCH_HEAP_PROFILE";

/// Records `command`'s allocations with heaptrack's preload library (the same process, so the
/// benchmark's pid, probes and RSS stay its own) into `<log>.heaptrack.zst`, read with
/// `heaptrack_print`. The trace is interpreted as it is written: raw it would be gigabytes.
fn heap_profile(command: &mut Command, log: &Path) -> Result<()> {
    const LIB: &str = "/usr/lib/heaptrack";
    let pipe = log.with_extension("heaptrack.pipe");
    let _ = std::fs::remove_file(&pipe);
    let made = Command::new("mkfifo").arg(&pipe).status()?;
    if !made.success() {
        bail!("mkfifo {}: {made}", pipe.display());
    }
    let out = log.with_extension("heaptrack.zst");
    Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{LIB}/libexec/heaptrack_interpret < '{}' | zstd -q > '{}'",
            pipe.display(),
            out.display()
        ))
        .spawn()
        .context("starting heaptrack_interpret (is heaptrack installed?)")?;
    command
        .env("LD_PRELOAD", format!("{LIB}/libheaptrack_preload.so"))
        .env("DUMP_HEAPTRACK_OUTPUT", &pipe);
    Ok(())
}

/// The environment of every launch, for the record: `KEY=value` per variable.
pub(crate) fn env_summary(launch: &Launch) -> String {
    let env: BTreeMap<&str, &str> = launch
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    env.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(manager: Value) -> Pod {
        let doc = json!({"metadata": {"namespace": "capt-system"},
            "spec": {"template": {"spec": {"containers": [manager]}}}});
        Pod::of(&doc).expect("a Deployment")
    }

    #[test]
    fn the_template_namespace_is_the_first_the_manager_trusts() {
        let pod = deployment(json!({"name": MANAGER, "command": ["/capt-controller"],
            "env": [{"name": TEMPLATE_NAMESPACES_ENV, "value": " platform ,other"}]}));
        assert_eq!(pod.template_namespace().unwrap(), "platform");
        let pod = deployment(json!({"name": MANAGER,
            "command": ["/capt-controller", "--allow-template-namespace", "flagged"]}));
        assert_eq!(pod.template_namespace().unwrap(), "flagged");
        let pod = deployment(json!({"name": MANAGER,
            "command": ["/capt-controller"], "args": ["--allow-template-namespace=joined"]}));
        assert_eq!(pod.template_namespace().unwrap(), "joined");
    }

    #[test]
    fn a_manager_that_trusts_no_namespace_is_an_error_naming_the_variable() {
        let pod = deployment(json!({"name": MANAGER, "command": ["/capt-controller"],
            "env": [{"name": TEMPLATE_NAMESPACES_ENV, "value": ""}]}));
        let error = pod.template_namespace().unwrap_err().to_string();
        assert!(error.contains(TEMPLATE_NAMESPACES_ENV), "{error}");
    }

    #[test]
    fn the_shipped_deployment_trusts_a_template_namespace() {
        let pod = Pod::read().expect("the shipped Deployment");
        assert!(!pod.template_namespace().unwrap().is_empty());
    }
}
