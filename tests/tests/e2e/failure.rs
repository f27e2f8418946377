//! A Terraform failure of a running control plane (a failed update: provider-terraform keeps
//! the Workspace `Ready=True Available` and reports `Synced=False ReconcileError`): the control
//! plane is Failed with the provider's message (not a terminal failure) while staying
//! provisioned (ready, initialized, the Cluster Provisioned), and a fix returns it to Ready.

use crate::common::{ONE_AT_A_TIME, annotate_workspace, provisioned, workspace_name};
use anyhow::Result;
use capt_tests::CLUSTER_V1BETA2;
use serde_json::{Value, json};
use std::time::Duration;

/// The message of the `Failed` condition while it is True: how a control plane tells a
/// failure (`failureMessage` is for terminal failures, in the Cluster API contract).
fn failed_message(cp: &Value) -> Option<&str> {
    cp["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Failed" && c["status"] == "True")?["message"]
        .as_str()
}

/// A v1beta2 Cluster's terminal failure message, kept in v1beta2 for the v1beta1 contract.
fn terminal_failure(cluster: &Value) -> Option<&Value> {
    cluster["status"]["deprecated"]["v1beta1"].get("failureMessage")
}

#[tokio::test]
async fn a_terraform_failure_gives_failed_with_the_providers_message_and_a_fix_returns_to_ready()
-> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("e2e-failure", false).await?;
    let ws = workspace_name(&ns.name, "demo-controlplane");
    annotate_workspace(
        &ws,
        json!({"fake.tf.upbound.io/fail": "Error: creating EKS Cluster: AccessDeniedException"}),
    )
    .await?;
    system
        .wait_for(
            "phase Failed with the provider's message",
            Duration::from_secs(30),
            || async {
                let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
                Ok(cp["status"]["phase"] == "Failed"
                    && failed_message(&cp)
                        .is_some_and(|m| m.contains("creating EKS Cluster: AccessDeniedException")))
            },
        )
        .await?;
    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    assert!(
        cp["status"]["workspaceStatus"]["atProvider"].is_object(),
        "atProvider kept through the failure"
    );
    let workspace = system.get(&["workspaces.tf.upbound.io", &ws])?.unwrap();
    let ready = workspace["status"]["conditions"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("True"), &json!("Available")),
        "the provider keeps the Workspace Available through a failed update"
    );
    assert_eq!(cp["status"]["workspaceStatus"]["state"], "Available");
    // Still provisioned: ready and initialized are sticky, the Cluster stays Provisioned.
    assert_eq!(
        (&cp["status"]["ready"], &cp["status"]["initialized"]),
        (&json!(true), &json!(true)),
        "{}",
        cp["status"]
    );
    // Not a terminal failure (a fixed Terraform error recovers): no failureReason, so neither
    // core nor capt-cluster marks the Cluster Failed for good.
    assert!(
        cp["status"].get("failureReason").is_none(),
        "{}",
        cp["status"]
    );
    let cluster = system.get(&[CLUSTER_V1BETA2, "demo"])?.unwrap();
    assert!(
        terminal_failure(&cluster).is_none() && cluster["status"]["phase"] == "Provisioned",
        "{}",
        cluster["status"]
    );
    assert_eq!(
        cluster["status"]["initialization"]["controlPlaneInitialized"],
        json!(true)
    );

    annotate_workspace(
        &ws,
        json!({"fake.tf.upbound.io/fail": null, "fake.tf.upbound.io/revision": "fixed"}),
    )
    .await?;
    system
        .wait_for(
            "phase Ready again, failure cleared",
            Duration::from_secs(30),
            || async {
                let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
                let cluster = system.get(&[CLUSTER_V1BETA2, "demo"])?.unwrap();
                Ok(cp["status"]["phase"] == "Ready"
                    && failed_message(&cp).is_none()
                    && terminal_failure(&cluster).is_none()
                    && cluster["status"]["phase"] == "Provisioned")
            },
        )
        .await?;
    Ok(())
}
