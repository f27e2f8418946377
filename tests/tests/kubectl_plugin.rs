//! `kubectl ownership`: the audit as a kubectl plugin, found by the real `kubectl` on the PATH,
//! against the real API server: kubectl's namespace conventions (the context's namespace,
//! `-n`, `-A`), `-o json`, `--context`, and the audit's exit codes (0 clean, 1 a violation,
//! 2 it could not run), and the policy read from the cluster when no file is given.

use anyhow::Result;
use capt_tests::applier::binary;
use capt_tests::{TestNamespace, env};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Output;

/// `kubectl ownership ARGS` with the plugin's directory first on the PATH and `kubeconfig`.
fn kubectl_ownership(kubeconfig: &Path, args: &[&str]) -> Result<Output> {
    let plugin_dir = binary("kubectl-ownership")
        .parent()
        .expect("a directory")
        .to_owned();
    let path = std::env::join_paths(std::iter::once(plugin_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))?;
    Ok(env()
        .kubectl()
        .arg("ownership")
        .args(args)
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("STATUS_APPLIER_POLICY")
        .env_remove("STATUS_APPLIER_POLICY_CONFIGMAP")
        .output()?)
}

fn apply_config_map(ns: &str, manager: &str, data: Value, force: bool) -> Result<()> {
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": ns}, "data": data});
    let manager = format!("--field-manager={manager}");
    let mut args = vec!["apply", "--server-side", manager.as_str(), "-f", "-"];
    if force {
        args.push("--force-conflicts");
    }
    env().kubectl_ok(&args, Some(&cm.to_string()))?;
    Ok(())
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn kubectl_finds_the_plugin_and_it_audits_with_kubectls_conventions() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "plugin").await?;
    let other = TestNamespace::create(&client, "plugin-other").await?;
    apply_config_map(&ns.name, "alice", json!({"owned": "by-alice"}), false)?;
    apply_config_map(&other.name, "carol", json!({"elsewhere": "x"}), false)?;

    // A kubeconfig whose current context's namespace is the test's, as `kubens` would leave it.
    let dir = capt_tests::Scratch::new(&format!("kubectl-ownership-{}", ns.name))?;
    let kubeconfig = dir.join("kubeconfig");
    std::fs::copy(&env().kubeconfig, &kubeconfig)?;
    let set_ns = env()
        .kubectl()
        .env("KUBECONFIG", &kubeconfig)
        .args([
            "config",
            "set-context",
            "--current",
            "--namespace",
            &ns.name,
        ])
        .output()?;
    assert!(set_ns.status.success(), "{}", text(&set_ns));

    // This test names its kinds and expectations on the command line: no policy.
    let kubectl_ownership = |kubeconfig: &Path, args: &[&str]| {
        kubectl_ownership(kubeconfig, &[args, &["--no-policy"]].concat())
    };

    // Without -n: the context's namespace only.
    let out = kubectl_ownership(&kubeconfig, &["configmaps"])?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains(".data.owned") && table.contains("alice (Apply, main"),
        "{}",
        text(&out)
    );
    assert!(
        !table.contains(".data.elsewhere"),
        "another namespace leaked in: {}",
        text(&out)
    );

    // -n names another namespace; -A reads them all; -o json is JSON.
    let out = kubectl_ownership(
        &kubeconfig,
        &["configmap/settings", "-n", &other.name, "-o", "json"],
    )?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let audits: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(
        audits[0]["subject"],
        json!(format!("ConfigMap/{}/settings", other.name)),
        "{}",
        text(&out)
    );
    assert!(
        audits[0]["fields"][".data.elsewhere"][0]["manager"] == json!("carol"),
        "{}",
        text(&out)
    );
    let out = kubectl_ownership(&kubeconfig, &["configmaps", "-A"])?;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains(".data.owned") && table.contains(".data.elsewhere"),
        "{}",
        text(&out)
    );

    // An expectation that holds, then a foreign writer takes the field: exit 0, then 1.
    let expect = "--expect=ConfigMap:data.owned=alice";
    let out = kubectl_ownership(&kubeconfig, &["configmaps", expect])?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    apply_config_map(&ns.name, "mallory", json!({"owned": "by-mallory"}), true)?;
    let out = kubectl_ownership(&kubeconfig, &["configmaps", expect])?;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("foreign writer: mallory"),
        "{}",
        text(&out)
    );

    // It cannot run: exit 2 with the reason, never 1.
    let out = kubectl_ownership(&kubeconfig, &["configmaps", "--context", "no-such-context"])?;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no-such-context"), "{}", text(&out));
    let out = kubectl_ownership(&kubeconfig, &["no-such-kind"])?;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("unknown kind `no-such-kind`"),
        "{}",
        text(&out)
    );

    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// `status-applier audit ARGS` with `KUBECONFIG` and no policy file.
fn status_applier_audit(args: &[&str]) -> Result<Output> {
    Ok(std::process::Command::new(binary("status-applier"))
        .arg("audit")
        .args(args)
        .env("KUBECONFIG", &env().kubeconfig)
        .env_remove("STATUS_APPLIER_POLICY")
        .env_remove("STATUS_APPLIER_POLICY_CONFIGMAP")
        .output()?)
}

/// On a management cluster the policy is the deployed ConfigMap: with no `--policy`,
/// `kubectl ownership -A` and `status-applier audit` read the ConfigMap labelled
/// `app.kubernetes.io/component=status-applier-policy` (the kustomization's, as deployed) and
/// audit the kinds it lists; `--policy-configmap` names one. Without it, or without its key
/// `policy.yaml`, they fail (exit 2) naming what they looked for: never an audit on an empty
/// policy nobody asked for.
#[tokio::test]
async fn without_a_policy_file_the_deployed_policy_configmap_is_read() -> Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, ListParams};
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "plugin-policy").await?;
    let rendered = env().kubectl_ok(
        &[
            "kustomize",
            &capt_tests::repo_root().join("manifests").to_string_lossy(),
        ],
        None,
    )?;
    let mut policy = capt_tests::yaml_documents(&rendered)?
        .into_iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["labels"].is_object())
        .expect("the kustomization's labelled policy ConfigMap");
    policy["metadata"]["namespace"] = json!(ns.name);
    let name = policy["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let configmap = format!("{}/{name}", ns.name);
    // An object of a kind the policy lists (and no target named on the command line).
    let cp = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "demo", "namespace": ns.name},
        "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "eks"}}});
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&cp.to_string()),
    )?;

    // No policy ConfigMap yet (this is the only test that makes one). One an earlier run of
    // this test left in its namespace, which is being deleted, is awaited until it is gone:
    // the namespace's deletion takes a few seconds after that run ended.
    let labelled = Api::<ConfigMap>::all(client.clone())
        .list(&ListParams::default().labels("app.kubernetes.io/component=status-applier-policy"))
        .await?;
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
    let mut elsewhere = Vec::new();
    for c in &labelled.items {
        let namespace = c.metadata.namespace.clone().unwrap_or_default();
        let leaving = namespaces
            .get_opt(&namespace)
            .await?
            .is_some_and(|n| n.metadata.deletion_timestamp.is_some());
        if !(leaving && namespace.starts_with("plugin-policy-")) {
            elsewhere.push((namespace, c.metadata.name.clone()));
            continue;
        }
        let api = Api::<ConfigMap>::namespaced(client.clone(), &namespace);
        let name = c.metadata.name.clone().unwrap_or_default();
        let uid = c.metadata.uid.clone().unwrap_or_default();
        let gone = kube::runtime::wait::await_condition(
            api,
            &name,
            kube::runtime::wait::conditions::is_deleted(&uid),
        );
        tokio::time::timeout(std::time::Duration::from_secs(120), gone)
            .await
            .map_err(|_| {
                anyhow::anyhow!("{namespace}/{name}, of an earlier run, not gone in 120 s")
            })??;
    }
    anyhow::ensure!(
        elsewhere.is_empty(),
        "a policy ConfigMap from elsewhere is in the environment: {elsewhere:?}"
    );
    let none_found =
        "no ConfigMap labelled app.kubernetes.io/component=status-applier-policy in any namespace";
    for out in [
        kubectl_ownership(&env().kubeconfig, &["-A"])?,
        status_applier_audit(&[])?,
    ] {
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains(none_found), "{}", text(&out));
    }
    let out = kubectl_ownership(&env().kubeconfig, &["-A", "--policy-configmap", &configmap])?;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "the ConfigMap {configmap} (--policy-configmap) does not exist"
        )),
        "{}",
        text(&out)
    );
    // A ConfigMap without the key.
    let keyless = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "keyless", "namespace": ns.name}, "data": {"other.yaml": "{}"}});
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&keyless.to_string()),
    )?;
    let keyless = format!("{}/keyless", ns.name);
    let out = kubectl_ownership(&env().kubeconfig, &["-A", "--policy-configmap", &keyless])?;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("the ConfigMap {keyless} has no key policy.yaml")),
        "{}",
        text(&out)
    );

    // Deployed: found by its label, or named.
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&policy.to_string()),
    )?;
    let ours = format!("CAPTControlPlane/{}/demo", ns.name);
    for args in [
        vec!["-n", &ns.name],
        vec!["-n", &ns.name, "--policy-configmap", &configmap],
    ] {
        let out = kubectl_ownership(&env().kubeconfig, &args)?;
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&ours),
            "{args:?}: {}",
            text(&out)
        );
    }
    // Every namespace: others of the shared environment may hold violations (exit 1), so the
    // claim is that the audit ran on the deployed policy and read our object.
    for out in [
        kubectl_ownership(&env().kubeconfig, &["-A"])?,
        status_applier_audit(&[])?,
    ] {
        assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&ours),
            "{}",
            text(&out)
        );
    }
    Ok(())
}
