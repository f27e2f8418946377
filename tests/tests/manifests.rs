//! `manifests/` against the real API server: the kustomization passes a server-side dry run,
//! and the ServiceAccount's RBAC is exactly enough: both processes, impersonating it,
//! provision a Cluster; with a permission taken away, the refusal is reported clearly and
//! nothing crashes.

use anyhow::Result;
use capt_tests::system::{System, impersonating_kubeconfig};
use capt_tests::{TestNamespace, env, install_rbac, repo_root};
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
    while !std::fs::read_to_string(&log)?.contains("Cannot use the leader Lease") {
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
