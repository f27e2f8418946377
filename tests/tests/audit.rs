//! `status-applier audit` against the real API server after the whole system provisioned a
//! Cluster beside the real Cluster API core manager (`hack/testenv.sh`'s default
//! environment): clean after a normal run (exit 0) with core's managers on the Cluster, and a
//! planted foreign owner of `atProvider` found from the cluster and from `kubectl get -o yaml
//! --show-managed-fields` (exit 1). No claim here is about running without core (the audit
//! reads ownership, whoever writes), so there is no no-core variant.

use anyhow::Result;
use capt_tests::applier::{binary, capt_policy};
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use serde_json::json;
use std::process::{Command, Output, Stdio};

/// The field manager of Cluster API core's writes: client-go names it after the binary.
const CORE_MANAGER: &str = "manager";

fn audit(args: &[&str], stdin: Option<&str>) -> Result<Output> {
    use std::io::Write;
    let mut child = Command::new(binary("status-applier"))
        .arg("audit")
        .args(args)
        .env("KUBECONFIG", &env().kubeconfig)
        .env("STATUS_APPLIER_POLICY", capt_policy())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.unwrap_or_default().as_bytes())?;
    Ok(child.wait_with_output()?)
}

#[tokio::test]
async fn the_audit_is_clean_after_a_normal_run_and_finds_a_planted_foreign_owner() -> Result<()> {
    let client = env().client().await?;
    anyhow::ensure!(env().core, "this test runs beside Cluster API core");
    let ns = TestNamespace::create(&client, "audit").await?;
    let system = System::start(&ns.name, 50).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;

    let clean = audit(&["-n", &ns.name], None)?;
    let table = String::from_utf8(clean.stdout)?;
    assert!(
        clean.status.success(),
        "{table}\n{}",
        String::from_utf8_lossy(&clean.stderr)
    );
    assert!(
        table.contains(".status.workspaceStatus.atProvider.checksum")
            && table.contains("capt-captcontrolplane (Apply, status"),
        "{table}"
    );
    // The Cluster's endpoint is core's (copied from the control plane), within the policy's
    // expected owners.
    assert!(
        table.contains(".spec.controlPlaneEndpoint.host")
            && table.contains(&format!("{CORE_MANAGER} (Update, main")),
        "{table}"
    );

    // A foreign writer takes atProvider by force.
    let forged = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "demo", "namespace": ns.name}, "status": {"workspaceStatus": {"atProvider": {"checksum": "forged"}}}});
    env().kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--subresource=status",
            "--field-manager=intruder",
            "--force-conflicts",
            "-f",
            "-",
        ],
        Some(&forged.to_string()),
    )?;

    let found = audit(
        &["captcontrolplane/demo", "-n", &ns.name, "-o", "json"],
        None,
    )?;
    assert_eq!(
        found.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&found.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&found.stdout)?;
    let violations = report[0]["violations"].as_array().unwrap();
    assert!(
        violations.iter().any(
            |v| v["path"] == ".status.workspaceStatus.atProvider.checksum"
                && v["problem"]
                    .as_str()
                    .unwrap()
                    .contains("foreign writer: intruder (Apply, status")
        ),
        "{violations:?}"
    );

    let yaml = env().kubectl_ok(
        &[
            "get",
            "captcontrolplane",
            "demo",
            "-n",
            &ns.name,
            "-o",
            "yaml",
            "--show-managed-fields",
        ],
        None,
    )?;
    let from_stdin = audit(&["-f", "-", "-o", "yaml"], Some(&yaml))?;
    assert_eq!(from_stdin.status.code(), Some(1));
    let annotated = String::from_utf8(from_stdin.stdout)?;
    assert!(
        annotated.contains("checksum: forged  # intruder"),
        "{annotated}"
    );
    assert!(String::from_utf8(from_stdin.stderr)?.contains("1 ownership violation(s)"));

    // With the system stopped, a writer removes atProvider while the Workspace still has
    // one: the audit from the cluster reports it missing.
    drop(system);
    env().kubectl_ok(
        &[
            "patch",
            "captcontrolplane",
            "demo",
            "-n",
            &ns.name,
            "--subresource=status",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/status/workspaceStatus/atProvider"}]"#,
        ],
        None,
    )?;
    let missing = audit(&["captcontrolplane/demo", "-n", &ns.name], None)?;
    assert_eq!(missing.status.code(), Some(1));
    let table = String::from_utf8(missing.stdout)?;
    let ws = capt_controller::render::workspace_name(&ns.name, "demo-controlplane");
    assert!(table.contains(&format!("VIOLATION .status.workspaceStatus.atProvider: missing: its source (Workspace {ws}) has it")), "{table}");
    Ok(())
}

#[tokio::test]
async fn the_audit_names_an_unknown_kind_and_a_bad_expectation() -> Result<()> {
    let out = audit(&["nosuchkind"], None)?;
    assert_eq!(out.status.code(), Some(2), "an error, not a violation");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown kind `nosuchkind`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = audit(
        &["--expect", "Cluster.cluster.x-k8s.io:spec.x", "-f", "-"],
        Some(""),
    )?;
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("expected Kind.group:field.path=manager")
    );
    let out = audit(&["-f", "-"], Some("this: [is not, a kubernetes object"))?;
    assert_eq!(
        out.status.code(),
        Some(2),
        "unreadable input is an error, not a violation"
    );
    Ok(())
}
