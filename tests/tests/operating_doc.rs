//! Runs the `sh` blocks of `docs/operating.md`'s "Installing, step by step", in order, against
//! the test environment: from `kubectl apply --server-side -k manifests/` to a provisioned
//! sample, a scrape of both metrics endpoints and the ownership audit, each block as it says
//! (`capt_tests::doc_blocks`). And, with a tenant's `capt-templates` created before the
//! install, that the install fails loudly.
//!
//! The environment has no kubelet and no container runtime, so the test stands in for what a
//! cluster would run, as the section says at its end: a `docker` that records what it is asked
//! to build and push; once the applied Deployment exists, its pod as two processes started
//! from the Deployment read back from the API server (its containers' command and
//! environment; the volumes as local directories; the pod's own loopback address for the
//! `0.0.0.0` listeners; a TokenRequest token of its ServiceAccount); the fake provider for
//! provider-terraform; and for the scraper's pod, a token of the scraper's ServiceAccount and
//! the pod's address. No network plugin enforces the NetworkPolicy: the page's step 8 checks
//! what its rule selects. The blocks run in a copy of the tree (step 2 edits
//! `manifests/kustomization.yaml`). Afterwards the test deletes the sample, stops what it
//! started and deletes what the install created but the CRDs, which the environment installed
//! first: other tests share the environment.

use anyhow::{Context, Result, bail};
use capt_tests::applier::binary;
use capt_tests::doc_blocks::{Block, Ran, section, sh_blocks};
use capt_tests::fake_provider::FakeProvider;
use capt_tests::{Scratch, env, repo_root};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// The two tests install the same names: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

const PAGE: &str = "docs/operating.md";
const SECTION: &str = "Installing, step by step";
/// The page's example values (the `export`s above its blocks), which its expectations name.
const IMAGE: &str = "registry.example.com/capt/status-management:v0.2.0";
const SCRAPER_NAMESPACE: &str = "monitoring";
const SCRAPER_ACCOUNT: &str = "prometheus";
/// What the page's blocks create beside the install: the scraper's binding (step 8).
const SCRAPER_BINDING: &str = "capt-metrics-scraper";
/// The Deployment the install applies, and the namespace it trusts with code.
const DEPLOYMENT_NAMESPACE: &str = "capt-system";
const DEPLOYMENT: &str = "capt-controller";
const TRUSTED: &str = "capt-templates";
/// Where the sample's Cluster lives (`manifests/samples/cluster.yaml`).
const SAMPLE_NAMESPACE: &str = "default";
/// The stand-in pod's name (its `metadata.name`, and so its identity in the Lease).
const POD_NAME: &str = "capt-controller-stand-in";

/// The section's blocks.
fn steps() -> Result<Vec<Block>> {
    let page = std::fs::read_to_string(repo_root().join(PAGE))?;
    let text = section(&page, SECTION).with_context(|| format!("no `{SECTION}` in {PAGE}"))?;
    Ok(sh_blocks(text))
}

/// One run of the install: the copy of the tree it runs in, and what stands in for the
/// cluster's kubelet, image builder, provider-terraform and scraper pod. Dropped, it deletes
/// the sample, stops its processes and uninstalls.
struct Install {
    tree: Scratch,
    /// The stand-in builder's directory (first on the PATH) and its record of calls.
    builder: PathBuf,
    /// A token of the scraper's ServiceAccount, as its pod would have it mounted.
    token_file: PathBuf,
    /// The stand-in pod's address, and the pod once started.
    address: String,
    pod: Option<StandInPod>,
    /// Why the pod has not started yet (for failure messages).
    pending: String,
    _provider: FakeProvider,
}

impl Install {
    /// Uninstalls what an earlier test left, copies the tree, and readies the stand-ins.
    async fn prepare() -> Result<Self> {
        uninstall()?;
        let tree = copy_of_the_tree()?;
        let builder = tree.join(".stand-in-bin");
        std::fs::create_dir_all(&builder)?;
        let docker = builder.join("docker");
        std::fs::write(
            &docker,
            format!(
                "#!/bin/sh\necho \"docker $*\" >>'{}'\n",
                builder.join("calls").display()
            ),
        )?;
        std::fs::set_permissions(&docker, std::fs::Permissions::from_mode(0o755))?;
        // The scraper, as a monitoring stack installed before would be.
        kubectl(&["create", "namespace", SCRAPER_NAMESPACE])?;
        kubectl(&[
            "create",
            "serviceaccount",
            SCRAPER_ACCOUNT,
            "-n",
            SCRAPER_NAMESPACE,
        ])?;
        let token = kubectl(&[
            "create",
            "token",
            SCRAPER_ACCOUNT,
            "-n",
            SCRAPER_NAMESPACE,
            "--duration",
            "1h",
        ])?;
        let token_file = tree.join(".scraper-token");
        std::fs::write(&token_file, token.trim())?;
        let selector = format!(
            "{}={SAMPLE_NAMESPACE}",
            capt_tests::system::APPLY_NAMESPACE_LABEL
        );
        let provider = FakeProvider::start(&[
            "--delay-ms",
            "50",
            "--selector",
            &selector,
            "--poll-interval-ms",
            "1000",
            "--backoff-base-ms",
            "100",
        ])
        .await?;
        Ok(Self {
            tree,
            builder,
            token_file,
            address: pod_address()?,
            pod: None,
            pending: "the Deployment has not been applied".to_owned(),
            _provider: provider,
        })
    }

    /// Runs `block` as the page says to (from the tree's root, with its variables), after
    /// starting the pod if its Deployment has appeared; prints what it did.
    fn run(&mut self, n: usize, block: &Block) -> Result<Ran> {
        if self.pod.is_none() {
            match StandInPod::start(&self.address)? {
                Ok(pod) => self.pod = Some(pod),
                Err(why) => self.pending = why,
            }
        }
        let path = format!(
            "{}:{}:{}:{}",
            self.builder.display(),
            env().bin_dir.display(),
            binary("kubectl-ownership").parent().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = block.command();
        command
            .current_dir(&self.tree)
            .env("PATH", path)
            .env("KUBECONFIG", &env().kubeconfig)
            .env("IMAGE", IMAGE)
            .env("SCRAPER_NAMESPACE", SCRAPER_NAMESPACE)
            .env("SCRAPER_ACCOUNT", SCRAPER_ACCOUNT)
            .env("CAPT_IMAGE_BUILDER", "docker")
            .env("TOKEN_FILE", &self.token_file)
            .env("METRICS_HOST", &self.address);
        let started = Instant::now();
        let ran = block.run(command)?;
        println!(
            "--- block {n}, step {} (exit {:?}, {:.1} s)\n{}{}",
            block.heading,
            ran.code,
            started.elapsed().as_secs_f64(),
            shortened(&ran.stdout),
            shortened(&ran.stderr)
        );
        Ok(ran)
    }

    /// Step `n`'s block checked as the page says; the pod's state and logs added on failure.
    fn run_as_documented(&mut self, n: usize, block: &Block) -> Result<()> {
        let ran = self.run(n, block)?;
        block
            .check(&format!("block {n} (step {})", block.heading), &ran)
            .map_err(|e| anyhow::anyhow!("{e:#}\n{}", self.pod_state()))
    }

    /// The pod's logs, or why it has not started.
    fn pod_state(&self) -> String {
        match &self.pod {
            Some(pod) => pod.logs(),
            None => format!("--- the stand-in pod has not started: {}", self.pending),
        }
    }

    /// The builder's calls.
    fn builder_calls(&self) -> String {
        std::fs::read_to_string(self.builder.join("calls")).unwrap_or_default()
    }
}

impl Drop for Install {
    fn drop(&mut self) {
        if let Err(e) = delete_the_sample() {
            eprintln!("--- deleting the sample: {e:#}");
        }
        self.pod = None;
        if let Err(e) = uninstall() {
            eprintln!("--- uninstalling: {e:#}");
        }
    }
}

/// `text` as printed in the test's output: its first lines, and how many more there are.
fn shortened(text: &str) -> String {
    const LINES: usize = 25;
    let lines: Vec<&str> = text.lines().collect();
    let mut out: String = lines.iter().take(LINES).map(|l| format!("{l}\n")).collect();
    if lines.len() > LINES {
        out.push_str(&format!("[… {} more lines]\n", lines.len() - LINES));
    }
    out
}

/// `kubectl ARGS` against the environment: its stdout, or an error with its stderr.
fn kubectl(args: &[&str]) -> Result<String> {
    env().kubectl_ok(args, None)
}

/// A copy of what the page's blocks read and write: the manifests, the scripts, the
/// Dockerfile and Cargo.toml (which `hack/image.sh` reads for the clusterctl repository).
fn copy_of_the_tree() -> Result<Scratch> {
    let dir = Scratch::new("operating")?;
    let status = Command::new("cp")
        .arg("-r")
        .args(["manifests", "hack", "Dockerfile", "Cargo.toml"].map(|p| repo_root().join(p)))
        .arg(&*dir)
        .status()?;
    anyhow::ensure!(status.success(), "copying the tree");
    Ok(dir)
}

/// The Cluster of the sample deleted (core deletes its CAPT objects, and the controller its
/// Workspaces, while the pod runs); what a finalizer still holds after that is let go.
fn delete_the_sample() -> Result<()> {
    let out = env().kubectl_run(
        &[
            "delete",
            "cluster.cluster.x-k8s.io/demo",
            "-n",
            SAMPLE_NAMESPACE,
            "--ignore-not-found",
            "--timeout=90s",
        ],
        None,
    )?;
    if out.status.success() {
        return Ok(());
    }
    for kind in [
        "cluster.cluster.x-k8s.io",
        "captclusters.infrastructure.cluster.x-k8s.io",
        "captcontrolplanes.controlplane.cluster.x-k8s.io",
        "workspacetemplateapplies.infrastructure.cluster.x-k8s.io",
    ] {
        let names = kubectl(&["get", kind, "-n", SAMPLE_NAMESPACE, "-o", "name"])?;
        for name in names.lines() {
            let _ = env().kubectl_run(
                &[
                    "patch",
                    name,
                    "-n",
                    SAMPLE_NAMESPACE,
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ],
                None,
            );
        }
    }
    bail!(
        "the sample's Cluster was not deleted within 90 s (its finalizers let go): {}",
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Deletes what the install and the page's blocks create, but the CRDs (the test environment
/// installs them, and other tests use them): the namespaces with what is in them, the
/// cluster-scoped RBAC and admission policy, the scraper's namespace and binding; waits until
/// the namespaces are gone; and has the install's field manager let go of the CRDs, which
/// the environment's own (`testenv`) owns as before.
fn uninstall() -> Result<()> {
    let manifests = repo_root().join("manifests");
    let objects =
        capt_tests::yaml_documents(&kubectl(&["kustomize", manifests.to_str().unwrap()])?)?;
    let (crds, others): (Vec<&Value>, Vec<&Value>) = objects
        .iter()
        .filter(|d| d["metadata"]["namespace"].is_null())
        .partition(|d| d["kind"] == "CustomResourceDefinition");
    let mut names: Vec<String> = others
        .iter()
        .map(|d| {
            let kind = d["kind"].as_str().unwrap_or_default();
            let group = d["apiVersion"]
                .as_str()
                .and_then(|v| v.rsplit_once('/'))
                .map(|(group, _)| format!(".{group}"))
                .unwrap_or_default();
            format!(
                "{}{group}/{}",
                kind.to_lowercase(),
                d["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    names.push(format!(
        "clusterrolebinding.rbac.authorization.k8s.io/{SCRAPER_BINDING}"
    ));
    names.push(format!("namespace/{SCRAPER_NAMESPACE}"));
    let mut args = vec!["delete", "--ignore-not-found", "--wait=false"];
    args.extend(names.iter().map(String::as_str));
    kubectl(&args)?;
    let namespaces: Vec<&str> = names
        .iter()
        .filter(|n| n.starts_with("namespace/"))
        .map(String::as_str)
        .collect();
    let mut args = vec!["wait", "--for=delete", "--timeout=120s"];
    args.extend(namespaces);
    kubectl(&args)?;
    // An apply that names no field of a CRD: `kubectl`, the install's field manager, owns none
    // (kubectl's own validation wants a `spec`; the server's merge keeps the one there is).
    let stubs: Vec<Value> = crds
        .iter()
        .map(|d| {
            serde_json::json!({"apiVersion": d["apiVersion"], "kind": d["kind"],
                "metadata": {"name": d["metadata"]["name"]}})
        })
        .collect();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": stubs});
    env().kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--field-manager=kubectl",
            "--validate=false",
            "-f",
            "-",
        ],
        Some(&list.to_string()),
    )?;
    Ok(())
}

/// An address of the loopback network of its own for the pod (`127.x.y.z`, not 127.0.0.1),
/// as a pod has an IP of its own: the containers' `0.0.0.0:PORT` listeners listen on it, with
/// their own ports. The first such address on which the Deployment's ports are free.
fn pod_address() -> Result<String> {
    let ports: Vec<u16> = {
        let text = std::fs::read_to_string(repo_root().join("manifests/deploy/deployment.yaml"))?;
        let deployment = capt_tests::yaml_documents(&text)?
            .into_iter()
            .find(|d| d["kind"] == "Deployment")
            .context("a Deployment")?;
        containers(&deployment)
            .iter()
            .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p["containerPort"].as_u64())
            .map(|p| p as u16)
            .collect()
    };
    let seed = std::process::id();
    for attempt in 0..50u32 {
        let n = seed
            .wrapping_mul(2_654_435_761)
            .wrapping_add(attempt * 7919);
        let address = format!(
            "127.{}.{}.{}",
            1 + (n >> 16) % 250,
            (n >> 8) % 256,
            1 + n % 250
        );
        let free = ports
            .iter()
            .all(|port| std::net::TcpListener::bind((address.as_str(), *port)).is_ok());
        if free {
            return Ok(address);
        }
    }
    bail!("no loopback address with the ports {ports:?} free")
}

/// The containers of a Deployment.
fn containers(deployment: &Value) -> Vec<Value> {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The pod of the applied Deployment, as processes; killed when dropped.
struct StandInPod {
    processes: Vec<(String, Child, PathBuf)>,
    _dir: Scratch,
}

impl StandInPod {
    /// Starts the pod of the applied Deployment on `address`, as a kubelet would once it is
    /// scheduled: `Ok(Err(why))` while it cannot start yet (no Deployment, or what it mounts
    /// or runs as is not there).
    fn start(address: &str) -> Result<std::result::Result<Self, String>> {
        let text = kubectl(&[
            "get",
            "deployment",
            DEPLOYMENT,
            "-n",
            DEPLOYMENT_NAMESPACE,
            "-o",
            "json",
            "--ignore-not-found",
        ])?;
        if text.trim().is_empty() {
            return Ok(Err(format!(
                "no Deployment {DEPLOYMENT_NAMESPACE}/{DEPLOYMENT}"
            )));
        }
        let deployment: Value = serde_json::from_str(&text)?;
        let spec = &deployment["spec"]["template"]["spec"];
        let dir = Scratch::new("capt-pod")?;
        // The pod's credentials: a token of its ServiceAccount (the kubelet projects one).
        let account = spec["serviceAccountName"].as_str().unwrap_or("default");
        let token = env().kubectl_run(
            &[
                "create",
                "token",
                account,
                "-n",
                DEPLOYMENT_NAMESPACE,
                "--duration",
                "1h",
            ],
            None,
        )?;
        if !token.status.success() {
            return Ok(Err(format!(
                "no token of ServiceAccount {DEPLOYMENT_NAMESPACE}/{account}: {}",
                String::from_utf8_lossy(&token.stderr)
            )));
        }
        let kubeconfig = token_kubeconfig(String::from_utf8(token.stdout)?.trim(), &dir)?;
        // The volumes, each a local directory.
        let mut volumes = std::collections::BTreeMap::new();
        for volume in spec["volumes"].as_array().into_iter().flatten() {
            let name = volume["name"].as_str().context("a volume's name")?;
            let to = dir.join("volumes").join(name);
            std::fs::create_dir_all(&to)?;
            if let Some(map) = volume["configMap"]["name"].as_str() {
                let text = kubectl(&[
                    "get",
                    "configmap",
                    map,
                    "-n",
                    DEPLOYMENT_NAMESPACE,
                    "-o",
                    "json",
                    "--ignore-not-found",
                ])?;
                if text.trim().is_empty() {
                    return Ok(Err(format!("no ConfigMap {DEPLOYMENT_NAMESPACE}/{map}")));
                }
                let map: Value = serde_json::from_str(&text)?;
                for (key, value) in map["data"].as_object().into_iter().flatten() {
                    std::fs::write(to.join(key), value.as_str().unwrap_or_default())?;
                }
            } else if volume.get("emptyDir").is_none() {
                bail!("volume {name} is neither an emptyDir nor a ConfigMap: not stood in for");
            }
            volumes.insert(name.to_owned(), to);
        }
        let mut processes = Vec::new();
        for container in spec["containers"].as_array().into_iter().flatten() {
            let (name, command) = container_command(
                container,
                &volumes,
                address,
                deployment["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default(),
            )?;
            let log = dir.join(format!("{name}.log"));
            let mut command = command;
            command
                .env("KUBECONFIG", &kubeconfig)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log)?);
            let child = command
                .spawn()
                .with_context(|| format!("starting container {name}"))?;
            processes.push((name, child, log));
        }
        Ok(Ok(Self {
            processes,
            _dir: dir,
        }))
    }

    /// What each container logged so far.
    fn logs(&self) -> String {
        self.processes
            .iter()
            .map(|(name, _, log)| {
                format!(
                    "--- stand-in pod, container {name}:\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                )
            })
            .collect()
    }

    /// Waits until container `name` has exited, at most `timeout`; its log.
    async fn exited(&mut self, name: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        let (_, child, log) = self
            .processes
            .iter_mut()
            .find(|(n, _, _)| n == name)
            .with_context(|| format!("no container {name}"))?;
        while child.try_wait()?.is_none() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "container {name} still runs after {timeout:?}:\n{}",
                std::fs::read_to_string(&*log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(std::fs::read_to_string(&*log)?)
    }
}

impl Drop for StandInPod {
    fn drop(&mut self) {
        for (_, child, _) in &mut self.processes {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}

/// Container `container` of the pod as a command: its program this build's binary of the
/// same name, its arguments and environment the Deployment's alone, with each path under a
/// mount moved to the volume's local directory, `0.0.0.0` (every address of the pod) the
/// pod's `address`, and the `fieldRef`s filled in.
fn container_command(
    container: &Value,
    volumes: &std::collections::BTreeMap<String, PathBuf>,
    address: &str,
    namespace: &str,
) -> Result<(String, Command)> {
    let name = container["name"]
        .as_str()
        .context("a container's name")?
        .to_owned();
    let mounts: Vec<(String, &PathBuf)> = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let path = m["mountPath"].as_str().context("a mount's path")?;
            let volume = m["name"].as_str().context("a mount's volume")?;
            let to = volumes
                .get(volume)
                .with_context(|| format!("no volume {volume}"))?;
            Ok((path.to_owned(), to))
        })
        .collect::<Result<_>>()?;
    let local = |s: &str| -> String {
        let s = match s.strip_prefix("0.0.0.0:") {
            Some(port) => return format!("{address}:{port}"),
            None => s,
        };
        mounts
            .iter()
            .filter(|(m, _)| s == m || s.starts_with(&format!("{m}/")))
            .max_by_key(|(m, _)| m.len())
            .map(|(m, to)| format!("{}{}", to.display(), &s[m.len()..]))
            .unwrap_or_else(|| s.to_owned())
    };
    let words: Vec<String> = ["command", "args"]
        .iter()
        .flat_map(|k| container[k].as_array().cloned().unwrap_or_default())
        .map(|w| w.as_str().map(str::to_owned).context("a command word"))
        .collect::<Result<_>>()?;
    let program = words.first().context("the container's command")?;
    let program = Path::new(program)
        .file_name()
        .context("the command's program")?
        .to_string_lossy()
        .into_owned();
    let mut command = Command::new(binary(&program));
    command
        .args(words[1..].iter().map(|w| local(w)))
        .env_clear();
    for var in container["env"].as_array().into_iter().flatten() {
        let key = var["name"].as_str().context("an env name")?;
        let value = if let Some(value) = var["value"].as_str() {
            local(value)
        } else {
            match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.name") => POD_NAME.to_owned(),
                Some("metadata.namespace") => namespace.to_owned(),
                other => bail!("{name}: env {key} from {other:?}: not stood in for"),
            }
        };
        command.env(key, value);
    }
    Ok((name, command))
}

/// The environment's kubeconfig (its server) with `token` as its user's credentials.
fn token_kubeconfig(token: &str, dir: &Path) -> Result<PathBuf> {
    let text = std::fs::read_to_string(&env().kubeconfig)?;
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text)?;
    for user in config["users"]
        .as_sequence_mut()
        .context("kubeconfig has users")?
    {
        user["user"] = serde_yaml::to_value(serde_json::json!({ "token": token }))?;
    }
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&config)?)?;
    Ok(path)
}

#[tokio::test]
async fn every_install_step_of_the_operating_page_runs_as_documented() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let steps = steps()?;
    assert!(
        steps.len() >= 9,
        "the section has its steps: {}",
        steps.len()
    );
    let mut install = Install::prepare().await?;
    for (i, step) in steps.iter().enumerate() {
        install.run_as_documented(i + 1, step)?;
    }
    // What stood in for the builder was asked to build and push the image, which the applied
    // Deployment names for both containers.
    let calls = install.builder_calls();
    for call in [format!("build -t {IMAGE}"), format!("push {IMAGE}")] {
        assert!(calls.contains(&call), "`docker {call}` in: {calls}");
    }
    let deployment: Value = serde_json::from_str(&kubectl(&[
        "get",
        "deployment",
        DEPLOYMENT,
        "-n",
        DEPLOYMENT_NAMESPACE,
        "-o",
        "json",
    ])?)?;
    let images: Vec<Value> = containers(&deployment)
        .iter()
        .map(|c| c["image"].clone())
        .collect();
    assert_eq!(images, [IMAGE, IMAGE], "the applied Deployment's images");
    Ok(())
}

/// A tenant allowed to create namespaces (self-service) creates `capt-templates` before the
/// install. The install adopts and labels it, and then fails loudly: step 4 says who created
/// it and stops, and the controller of the pod refuses to start, naming it.
#[tokio::test]
async fn a_capt_templates_a_tenant_created_first_fails_the_install_loudly() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let steps = steps()?;
    let mut install = Install::prepare().await?;
    let _tenant = Tenant::allowed_to_create_namespaces("tenant-a")?;
    kubectl(&["create", "namespace", TRUSTED, "--as=tenant-a"])?;
    // The rule is to the second: the install comes at least a second later, as it would.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let check = steps
        .iter()
        .position(|s| s.text.contains(&format!("ns={TRUSTED}")))
        .context("the step that checks capt-templates")?;
    for (i, step) in steps[..check].iter().enumerate() {
        install.run_as_documented(i + 1, step)?;
    }
    let ran = install.run(check + 1, &steps[check])?;
    assert_eq!(ran.code, Some(1), "the check fails: {ran:?}");
    for part in [
        "capt-templates existed before the install labelled it",
        "kubectl-create",
        "Do not go on",
    ] {
        assert!(ran.stderr.contains(part), "`{part}` in: {}", ran.stderr);
    }
    // The pod started with the Deployment; its controller stops at once, saying why.
    let pod = install.pod.as_mut().context("the pod started")?;
    let said = pod.exited("manager", Duration::from_secs(60)).await?;
    for part in [
        "refusing to start",
        "namespace capt-templates is trusted with code",
        "was not set by the request that created it",
        "kubectl-create",
    ] {
        assert!(said.contains(part), "`{part}` in: {said}");
    }
    println!("--- the controller of the pod:\n{said}");
    Ok(())
}

/// A user allowed to create namespaces, and nothing else; gone when dropped.
struct Tenant(String);

impl Tenant {
    fn allowed_to_create_namespaces(user: &str) -> Result<Self> {
        let name = format!("capt-test-self-service-{user}");
        kubectl(&[
            "create",
            "clusterrole",
            &name,
            "--verb=create",
            "--resource=namespaces",
        ])?;
        kubectl(&[
            "create",
            "clusterrolebinding",
            &name,
            &format!("--clusterrole={name}"),
            &format!("--user={user}"),
        ])?;
        Ok(Self(name))
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        let _ = env().kubectl_run(
            &[
                "delete",
                "--ignore-not-found",
                &format!("clusterrole/{}", self.0),
                &format!("clusterrolebinding/{}", self.0),
            ],
            None,
        );
    }
}
