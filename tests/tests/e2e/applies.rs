//! WorkspaceTemplateApplies: an existing one is adopted only with proof (our owner labels or
//! the user's `adopt` annotation), later template and version changes
//! reach its Workspace, and it waits for its Secrets and Workspaces before rendering.

use crate::common::{ONE_AT_A_TIME, provisioned, workspace_name};
use anyhow::Result;
use capt_controller::render::REVISION_OUTPUT;
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use serde_json::{Value, json};
use std::time::Duration;

#[tokio::test]
async fn an_existing_apply_with_the_expected_name_is_adopted_only_with_proof() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "e2e-adopt").await?;
    let system = System::start(&ns.name, 200).await?;
    // A deployment from before the controller recorded apply names (seed 002's migration):
    // an apply of the expected name, without our owner labels.
    let existing = json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "demo-controlplane", "namespace": ns.name},
        "spec": {"templateRef": {"name": "eks"}, "variables": {"CLUSTER_NAME": "demo", "KUBERNETES_VERSION": "1.31", "VPC_NAME": "migrated"}}});
    env().kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--field-manager=old-capt",
            "-f",
            "-",
        ],
        Some(&existing.to_string()),
    )?;
    system.apply_samples(false).await?;
    // Without proof that it is ours, the control plane leaves it alone and says so.
    let refused = || -> Result<Value> {
        let cp = system
            .get(&["captcontrolplane", "demo"])?
            .unwrap_or(Value::Null);
        Ok(cp["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "WorkspaceTemplateApplyOwned")
            .cloned()
            .unwrap_or(Value::Null))
    };
    system
        .wait_for(
            "WorkspaceTemplateApplyOwned=False",
            Duration::from_secs(60),
            || async { Ok(refused()?["reason"] == "WorkspaceTemplateApplyNotOwned") },
        )
        .await?;
    let message = refused()?["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("infrastructure.cluster.x-k8s.io/adopt=true"),
        "{message}"
    );
    let apply = system
        .get(&["workspacetemplateapply", "demo-controlplane"])?
        .unwrap();
    assert!(
        apply["metadata"]["labels"]
            .get("infrastructure.cluster.x-k8s.io/owner-kind")
            .is_none(),
        "not labelled: {}",
        apply["metadata"]
    );
    assert!(
        apply["metadata"]["annotations"]
            .get("infrastructure.cluster.x-k8s.io/adopted")
            .is_none()
    );
    assert!(apply["spec"].get("writeConnectionSecretToRef").is_none());
    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    assert!(
        cp["spec"].get("workspaceTemplateApplyName").is_none(),
        "nothing recorded"
    );

    // The user asks for its adoption: it is adopted, its spec stays the user's.
    env().kubectl_ok(
        &[
            "annotate",
            "workspacetemplateapply",
            "demo-controlplane",
            "-n",
            &ns.name,
            "infrastructure.cluster.x-k8s.io/adopt=true",
        ],
        None,
    )?;
    system.wait_provisioned().await?;
    let apply = system
        .get(&["workspacetemplateapply", "demo-controlplane"])?
        .unwrap();
    assert_eq!(
        apply["metadata"]["annotations"]["infrastructure.cluster.x-k8s.io/adopted"],
        "true"
    );
    assert_eq!(
        apply["metadata"]["labels"]["infrastructure.cluster.x-k8s.io/owner-name"],
        "demo"
    );
    assert_eq!(
        apply["spec"]["variables"]["VPC_NAME"], "migrated",
        "its spec is the user's"
    );
    assert!(
        apply["spec"].get("writeConnectionSecretToRef").is_none(),
        "nothing was added to its spec"
    );
    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    assert_eq!(
        cp["spec"]["workspaceTemplateApplyName"],
        "demo-controlplane"
    );
    assert!(refused()?.is_null(), "the refusal is gone");
    let applies = env().kubectl_ok(
        &[
            "get",
            "workspacetemplateapply",
            "-n",
            &ns.name,
            "-o",
            "name",
        ],
        None,
    )?;
    assert_eq!(applies.lines().count(), 2, "no duplicate apply: {applies}");
    Ok(())
}

#[tokio::test]
async fn later_template_and_version_changes_reach_the_workspace() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("e2e-render", false).await?;
    let ws = workspace_name(&ns.name, "demo-controlplane");
    let module = || {
        env().kubectl_ok(
            &[
                "get",
                "workspace",
                &ws,
                "-o",
                "jsonpath={.spec.forProvider.module}",
            ],
            None,
        )
    };
    // The sample passes the version as a value of the module's variable (`vars`).
    let version = || {
        env().kubectl_ok(
            &[
                "get",
                "workspace",
                &ws,
                "-o",
                r#"jsonpath={.spec.forProvider.vars[?(@.key=="kubernetes_version")].value}"#,
            ],
            None,
        )
    };
    assert_eq!(version()?, "1.31");

    env().kubectl_ok(
        &[
            "patch",
            "captcontrolplane",
            "demo",
            "-n",
            &ns.name,
            "--type=merge",
            "-p",
            r#"{"spec":{"version":"1.32"}}"#,
        ],
        None,
    )?;
    system
        .wait_for(
            "the new version in the Workspace",
            Duration::from_secs(20),
            || async { Ok(version()? == "1.32") },
        )
        .await?;

    system.patch_control_plane_template(&json!({"spec": {"template": {"spec": {"forProvider":
        {"source": "Inline", "module": "# v2"}}}}}))?;
    system
        .wait_for(
            "the new template in the Workspace",
            Duration::from_secs(20),
            // Followed by the revision output CAPT adds to an inline module.
            || async {
                let module = module()?;
                let echo = format!("output \"{REVISION_OUTPUT}\"");
                Ok(module.starts_with("# v2\n") && module.contains(&echo))
            },
        )
        .await?;
    system
        .wait_for(
            "the control plane Ready again",
            Duration::from_secs(30),
            || async {
                let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
                Ok(cp["status"]["phase"] == "Ready" && cp["status"]["version"] == "1.32")
            },
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn an_apply_waits_for_its_secrets_and_workspaces_before_rendering() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "e2e-wait").await?;
    let system = System::start(&ns.name, 50).await?;
    system.apply_samples(false).await?; // the templates (and a Cluster, irrelevant here)
    let apply = json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "waiting", "namespace": ns.name},
        "spec": {"templateRef": {"name": "vpc"}, "variables": {"CLUSTER_NAME": "waiting"},
                 "waitForSecrets": [{"name": "credentials", "namespace": ns.name}],
                 "waitForWorkspaces": [{"name": workspace_name(&ns.name, "demo-vpc")}]}});
    env().kubectl_ok(&["apply", "-f", "-"], Some(&apply.to_string()))?;
    let condition = || -> Result<Value> {
        let a = system.get(&["workspacetemplateapply", "waiting"])?.unwrap();
        Ok(a["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Applied")
            .cloned()
            .unwrap_or(Value::Null))
    };
    system
        .wait_for("WaitingForSecrets", Duration::from_secs(20), || async {
            Ok(condition()?["reason"] == "WaitingForSecrets")
        })
        .await?;
    let ws = workspace_name(&ns.name, "waiting");
    assert!(
        env()
            .kubectl_run(&["get", "workspace", &ws], None)?
            .status
            .code()
            != Some(0),
        "nothing rendered yet"
    );

    env().kubectl_ok(
        &[
            "create",
            "secret",
            "generic",
            "credentials",
            "-n",
            &ns.name,
            "--from-literal=token=not-logged",
        ],
        None,
    )?;
    system
        .wait_for(
            "the Workspace rendered",
            Duration::from_secs(20),
            || async {
                Ok(env()
                    .kubectl_run(&["get", "workspace", &ws], None)?
                    .status
                    .success())
            },
        )
        .await?;
    system
        .wait_for(
            "Applied condition gone, applied true",
            Duration::from_secs(20),
            || async {
                let a = system.get(&["workspacetemplateapply", "waiting"])?.unwrap();
                Ok(condition()?.is_null() && a["status"]["applied"] == true)
            },
        )
        .await?;
    assert!(
        !system.controller_log_text().contains("not-logged"),
        "Secret data never reaches the logs"
    );
    env().kubectl_ok(
        &[
            "delete",
            "workspacetemplateapply",
            "waiting",
            "-n",
            &ns.name,
            "--wait=true",
            "--timeout=30s",
        ],
        None,
    )?;
    Ok(())
}
