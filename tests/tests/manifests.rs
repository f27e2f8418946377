//! `manifests/` against the real API server: the kustomization passes a server-side dry run,
//! and the ServiceAccount's RBAC is exactly enough: both processes, impersonating it,
//! provision a Cluster; with a permission taken away, the refusal is reported clearly and
//! nothing crashes.

use anyhow::{Context, Result};
use capt_tests::system::{System, impersonating_kubeconfig};
use capt_tests::{TestNamespace, env, install_rbac, repo_root};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;
use tokio::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// The applier and the controller of a system in a new namespace, both impersonating the
/// ServiceAccount `capt-system/<account>`, electing their leader on a Lease in capt-system.
async fn start_as_service_account(
    prefix: &str,
    account: &str,
) -> Result<(TestNamespace, System, capt_tests::Scratch)> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, prefix).await?;
    let user = format!("system:serviceaccount:capt-system:{account}");
    let dir = capt_tests::Scratch::new(&ns.name)?;
    let kubeconfig = impersonating_kubeconfig(&user, &dir)?;
    let lease = format!("capt-{}", ns.name);
    let args = [
        "--leader-election-namespace",
        "capt-system",
        "--leader-election-lease",
        &lease,
    ];
    let system = System::start_as(&ns.name, 50, &args, &kubeconfig).await?;
    Ok((ns, system, dir))
}

#[tokio::test]
async fn the_kustomization_passes_a_server_side_dry_run() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    install_rbac()?; // the namespace must exist for a dry run of what lives in it
    let out = env().kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "--field-manager=testenv",
            "-k",
            repo_root().join("manifests").to_str().unwrap(),
        ],
        None,
    )?;
    assert!(
        out.contains("deployment.apps/capt-controller serverside-applied (server dry run)"),
        "{out}"
    );
    assert!(out.contains("clusterrole.rbac.authorization.k8s.io/capt-controller serverside-applied (server dry run)"), "{out}");
    for role in [
        "capt-controller-metrics-auth",
        "capt-controller-metrics-reader",
    ] {
        assert!(
            out.contains(&format!(
                "clusterrole.rbac.authorization.k8s.io/{role} serverside-applied (server dry run)"
            )),
            "{out}"
        );
    }
    assert!(
        out.contains("service/capt-controller-metrics serverside-applied (server dry run)"),
        "{out}"
    );
    Ok(())
}

#[tokio::test]
async fn the_service_accounts_rbac_is_enough_to_provision_a_cluster() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    install_rbac()?;
    let (_ns, system, _kubeconfig) = start_as_service_account("rbac", "capt-controller").await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    let conflicts = system.applier.client.get("/v1/conflicts").await?.json();
    assert_eq!(conflicts, serde_json::json!([]));
    assert!(
        !system.controller_log_text().contains("forbidden"),
        "{}",
        system.controller_log_text()
    );
    Ok(())
}

#[tokio::test]
async fn a_missing_permission_is_reported_clearly_and_crashes_nothing() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    install_rbac()?;
    // The same role without the WorkspaceTemplateApply status permission (a status nothing
    // else waits for; with Cluster API core running, capt-cluster writes no Cluster status).
    let role = env().kubectl_ok(
        &["get", "clusterrole", "capt-controller", "-o", "json"],
        None,
    )?;
    let mut role: serde_json::Value = serde_json::from_str(&role)?;
    let rules = role["rules"].as_array_mut().unwrap();
    for rule in rules.iter_mut() {
        if rule["resources"]
            == serde_json::json!(["captclusters/status", "workspacetemplateapplies/status"])
        {
            rule["resources"] = serde_json::json!(["captclusters/status"]);
        }
    }
    let limited = serde_json::json!({
    "apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "capt-limited", "namespace": "capt-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "capt-limited"}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "capt-limited"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "capt-limited"},
         "subjects": [{"kind": "ServiceAccount", "name": "capt-limited", "namespace": "capt-system"}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "capt-limited-leader-election", "namespace": "capt-system"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "capt-controller-leader-election"},
             "subjects": [{"kind": "ServiceAccount", "name": "capt-limited", "namespace": "capt-system"}]},
        ]});
    env().kubectl_ok(&["apply", "-f", "-"], Some(&limited.to_string()))?;
    let (_ns, system, _kubeconfig) =
        start_as_service_account("rbac-missing", "capt-limited").await?;
    system.apply_samples(false).await?;
    // The CAPT objects still progress; the applies' status is refused, and said so.
    system
        .wait_for(
            "the WorkspaceTemplateApply status refusal in the applier",
            Duration::from_secs(30),
            || async {
                let docs = system.applier.client.get("/v1/intents").await?.json();
                Ok(docs.as_array().into_iter().flatten().any(|d| {
                    d["object"]["kind"] == "WorkspaceTemplateApply"
                        && d["subresource"] == "status"
                        && d["last"]["action"] == "rejected"
                        && d["last"]["message"].as_str().is_some_and(|m| {
                            m.contains("refused by the API server (403)")
                                && m.contains("workspacetemplateapplies/status")
                        })
                }))
            },
        )
        .await?;
    system
        .wait_for(
            "the control plane Ready regardless",
            Duration::from_secs(30),
            || async {
                Ok(system
                    .get(&["captcontrolplane", "demo"])?
                    .is_some_and(|c| c["status"]["phase"] == "Ready"))
            },
        )
        .await?;
    let log = system.applier.log_text();
    assert!(
        log.contains("Apply did not happen") && log.contains("403"),
        "the applier logs it"
    );
    assert!(
        system.applier.client.get("/healthz").await.is_ok(),
        "the applier still runs"
    );
    assert!(
        system
            .controller_metric("capt_reconciles_total", &[])
            .await?
            > 0.0,
        "the controller still runs"
    );
    Ok(())
}

#[tokio::test]
async fn a_lease_the_controller_may_not_use_is_reported_and_retried_not_a_crash() -> Result<()> {
    let dir = capt_tests::Scratch::new("lease-forbidden")?;
    let kubeconfig = impersonating_kubeconfig("system:serviceaccount:capt-system:nobody", &dir)?;
    let log = dir.join("controller.log");
    let mut controller = std::process::Command::new(capt_tests::applier::binary("capt-controller"))
        .args([
            "--leader-election-namespace",
            "capt-system",
            "--metrics-bind-address",
            "127.0.0.1:0",
            "--health-probe-bind-address",
            "127.0.0.1:0",
            "--applier-socket",
        ])
        .arg(dir.join("none.sock"))
        .env("KUBECONFIG", &kubeconfig)
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log)?.contains("Reading the leader Lease failed; retrying") {
        assert!(
            std::time::Instant::now() < deadline,
            "no report: {}",
            std::fs::read_to_string(&log)?
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = std::fs::read_to_string(&log)?;
    assert!(text.contains("forbidden"), "the reason is given: {text}");
    assert!(
        controller.try_wait()?.is_none(),
        "the controller keeps running"
    );
    let _ = controller.kill();
    let _ = controller.wait();
    Ok(())
}

/// The status-applier's debug listener serves the intent API without authentication, and
/// `kubectl port-forward` reaches the pod's loopback it listens on: the shipped Deployment
/// never turns it on (docs/status-applier.md).
#[test]
fn the_deployment_does_not_turn_the_unauthenticated_debug_listener_on() -> Result<()> {
    let text = std::fs::read_to_string(repo_root().join("manifests/deploy/deployment.yaml"))?;
    let deployment = capt_tests::yaml_documents(&text)?
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    for c in containers {
        let words = c["command"]
            .as_array()
            .into_iter()
            .chain(c["args"].as_array())
            .flatten()
            .filter_map(|w| w.as_str());
        for word in words {
            assert!(!word.contains("debug-tcp-addr"), "{}: {word}", c["name"]);
        }
        for var in c["env"].as_array().into_iter().flatten() {
            assert_ne!(
                var["name"], "STATUS_APPLIER_DEBUG_TCP_ADDR",
                "{}",
                c["name"]
            );
        }
    }
    assert!(!containers.is_empty());
    Ok(())
}

/// A copy of what `hack/image.sh` reads and writes (the manifests, the scripts, the
/// Dockerfile, Cargo.toml), so that `--set` edits the copy, not this tree.
fn image_scratch() -> Result<capt_tests::Scratch> {
    let dir = capt_tests::Scratch::new("image")?;
    let status = std::process::Command::new("cp")
        .arg("-r")
        .args(["manifests", "hack", "Dockerfile", "Cargo.toml"].map(|p| repo_root().join(p)))
        .arg(&*dir)
        .status()?;
    anyhow::ensure!(status.success(), "copying the tree for hack/image.sh");
    Ok(dir)
}

/// `hack/image.sh` in `dir`, with `bin` first on the PATH (then the environment's kubectl
/// and the PATH of the test), the builders it may try named by `builders`.
fn image_script(
    dir: &std::path::Path,
    bin: &std::path::Path,
    builders: &str,
) -> std::process::Command {
    let path = format!(
        "{}:{}:{}",
        bin.display(),
        env().bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = std::process::Command::new(dir.join("hack/image.sh"));
    command
        .env("PATH", path)
        .env("CAPT_IMAGE_BUILDER", builders);
    command
}

/// The image a user builds is the one both install paths deploy: every container of
/// `kubectl kustomize manifests/` and of the clusterctl components runs it, and no
/// container is left on the default.
#[test]
fn hack_image_names_the_image_for_both_install_paths() -> Result<()> {
    const IMAGE: &str = "registry.example.com:5000/capt/status-management:v9.8.7";
    let dir = image_scratch()?;
    let out = image_script(&dir, &dir, "")
        .args(["--no-build", "--set", IMAGE])
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "hack/image.sh --set: {stderr}");
    let kustomized = env().kubectl_ok(
        &["kustomize", &dir.join("manifests").display().to_string()],
        None,
    )?;
    let versions = dir.join(".clusterctl-repo/infrastructure-capt");
    let version = std::fs::read_dir(&versions)?
        .next()
        .context("a version")??
        .path();
    let components = std::fs::read_to_string(version.join("infrastructure-components.yaml"))?;
    for (path, text) in [("kubectl apply -k", kustomized), ("clusterctl", components)] {
        let images: Vec<String> = capt_tests::yaml_documents(&text)?
            .iter()
            .filter(|d| d["kind"] == "Deployment")
            .flat_map(|d| {
                d["spec"]["template"]["spec"]["containers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .map(|c| c["image"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(images, vec![IMAGE; 2], "{path}: the containers' images");
    }
    Ok(())
}

/// Without a builder, or with one whose daemon is not there, `hack/image.sh` says which and
/// what to do instead, and builds nothing; with one, it builds the Dockerfile under the name
/// given, and pushes it when asked.
#[test]
fn hack_image_builds_with_the_builder_there_is_and_says_when_there_is_none() -> Result<()> {
    let dir = image_scratch()?;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    let fake = |name: &str, info_fails: bool| -> Result<()> {
        let script = format!(
            "#!/bin/sh\necho \"{name} $*\" >>'{}'\n{}",
            dir.join("calls").display(),
            if info_fails {
                "[ \"$1\" = info ] && exit 1\nexit 0\n"
            } else {
                "exit 0\n"
            }
        );
        let path = bin.join(name);
        std::fs::write(&path, script)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(())
    };
    // Only a docker without its daemon: the builders the machine has are left out, since
    // CAPT_IMAGE_BUILDER names the fakes alone (and one that is nowhere).
    fake("docker", true)?;
    let none = image_script(&dir, &bin, "docker no-such-builder")
        .arg("example.com/capt:v1")
        .output()?;
    let said = String::from_utf8_lossy(&none.stderr);
    assert_eq!(none.status.code(), Some(3), "{said}");
    assert!(said.contains("no usable container builder"), "{said}");
    assert!(
        said.contains("docker (installed, but `docker info` fails"),
        "{said}"
    );
    assert!(
        said.contains("--no-build --set example.com/capt:v1"),
        "{said}"
    );

    fake("podman", false)?;
    let built = image_script(&dir, &bin, "docker podman")
        .args(["--push", "example.com/capt:v1"])
        .output()?;
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let calls = std::fs::read_to_string(dir.join("calls"))?;
    let root = dir.display();
    assert_eq!(
        calls
            .lines()
            .filter(|l| !l.ends_with(" info"))
            .collect::<Vec<_>>(),
        [
            format!("podman build -t example.com/capt:v1 -f {root}/Dockerfile {root}"),
            "podman push example.com/capt:v1".to_owned()
        ],
        "the builder's calls"
    );
    Ok(())
}

/// The controller, as the ServiceAccount, trusting the templates of `trusted`, on its own
/// (no applier, no Lease); its probes on `probes`.
fn controller_trusting(
    trusted: &str,
    probes: &str,
    dir: &std::path::Path,
) -> Result<std::process::Child> {
    let kubeconfig = impersonating_kubeconfig(capt_tests::pod::SERVICE_ACCOUNT, dir)?;
    let [metrics] = capt_tests::system::free_local_addrs()?;
    Ok(
        std::process::Command::new(capt_tests::applier::binary("capt-controller"))
            .args([
                "--allow-template-namespace",
                trusted,
                "--no-leader-election",
            ])
            .args(["--insecure-diagnostics", "--metrics-bind-address", &metrics])
            .args(["--health-probe-bind-address", probes])
            .arg("--applier-socket")
            .arg(dir.join("no-applier.sock"))
            .env("KUBECONFIG", kubeconfig)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()?,
    )
}

/// How a controller started by [`controller_trusting`] went: `Ok(())` once it serves its
/// probes (it is past its start), `Err(stderr)` when it exits first.
async fn started_or_refused(
    mut controller: std::process::Child,
    probes: &str,
) -> Result<std::result::Result<(), String>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = controller.try_wait()? {
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut controller.stderr.take().unwrap(), &mut stderr)?;
            return Ok(Err(format!("exited {status}: {stderr}")));
        }
        if capt_tests::system::plain_get(probes, "/healthz")
            .await
            .is_ok()
        {
            let _ = controller.kill();
            let _ = controller.wait();
            return Ok(Ok(()));
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the controller neither served its probes nor exited within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `kubectl apply -k manifests/` alone creates the namespace trusted with code, labelled in
/// the request that creates it; the controller trusting it starts.
#[tokio::test]
async fn the_install_creates_the_trusted_namespace_and_the_controller_trusts_it() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let manifests = repo_root().join("manifests");
    let out = env().kubectl_ok(
        // The field manager of the other tests' applies of the manifests, so that their
        // server-side dry run (above) finds no other owner of what they set.
        &[
            "apply",
            "--server-side",
            "--field-manager=testenv",
            "-k",
            manifests.to_str().unwrap(),
        ],
        None,
    )?;
    assert!(
        out.contains("namespace/capt-templates serverside-applied"),
        "{out}"
    );
    let labels = env().kubectl_ok(
        &[
            "get",
            "namespace",
            "capt-templates",
            "-o",
            "jsonpath={.metadata.labels}",
        ],
        None,
    )?;
    assert!(
        labels.contains(r#""capt.cluster.x-k8s.io/trusted-with-code":"true""#),
        "{labels}"
    );
    let dir = capt_tests::Scratch::new("trusted-install")?;
    let [probes] = capt_tests::system::free_local_addrs()?;
    let controller = controller_trusting("capt-templates", &probes, &dir)?;
    let went = started_or_refused(controller, &probes).await?;
    assert_eq!(
        went,
        Ok(()),
        "the controller trusts the namespace the install made"
    );
    Ok(())
}

/// A tenant creates the trusted namespace before the install: `kubectl apply` adopts and labels
/// it, and the controller refuses to start, naming the namespace, who created it and what to
/// do. (The install's namespace document renamed, so that this test's tenant does not take
/// the name the other tests install.)
#[tokio::test]
async fn a_trusted_namespace_a_tenant_created_first_stops_the_controller() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    install_rbac()?;
    let name = capt_tests::unique_name("tenant-first");
    // The tenant's: created as `kubectl create namespace` does, before the install.
    env().kubectl_ok(&["create", "namespace", &name], None)?;
    let _cleanup = DeleteNamespace(name.clone());
    // The install's namespace, renamed, applied as `kubectl apply -k manifests/` applies it.
    let install =
        std::fs::read_to_string(repo_root().join("manifests/deploy/templates-namespace.yaml"))?
            .replace("capt-templates", &name);
    env().kubectl_ok(&["apply", "--server-side", "-f", "-"], Some(&install))?;
    let dir = capt_tests::Scratch::new("tenant-first")?;
    let [probes] = capt_tests::system::free_local_addrs()?;
    let controller = controller_trusting(&name, &probes, &dir)?;
    let went = started_or_refused(controller, &probes).await?;
    let Err(said) = went else {
        panic!("the controller started trusting {name}, which a tenant created before the install");
    };
    for part in [
        "refusing to start",
        &format!("namespace {name} is trusted with code"),
        "was not set by the request that created it",
        "kubectl-create",
    ] {
        assert!(said.contains(part), "`{part}` in: {said}");
    }
    Ok(())
}

/// Deletes a namespace when dropped (without waiting for its finalization).
struct DeleteNamespace(String);

impl Drop for DeleteNamespace {
    fn drop(&mut self) {
        let _ = env().kubectl_run(
            &[
                "delete",
                "namespace",
                &self.0,
                "--wait=false",
                "--ignore-not-found",
            ],
            None,
        );
    }
}
