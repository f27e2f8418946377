//! A user's server-side apply of another endpoint: a conflict the applier reports (and an
//! Event), and the user's value stays.

use crate::common::{ONE_AT_A_TIME, provisioned};
use anyhow::Result;
use capt_tests::env;
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn a_users_server_side_apply_of_another_endpoint_is_a_reported_conflict_and_stays()
-> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("e2e-user", false).await?;
    let theirs = json!({"host": "api.user.example.com", "port": 6443});
    // The control plane's endpoint: capt-captcontrolplane's, with or without core (the
    // Cluster's is core's beside core; fault_endpoint.rs covers capt-cluster's without it).
    let manifest = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "demo", "namespace": ns.name}, "spec": {"controlPlaneEndpoint": theirs}});
    env().kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=platform-admin",
            "-f",
            "-",
        ],
        Some(&manifest.to_string()),
    )?;
    system
        .wait_for(
            "the conflict reported by the applier",
            Duration::from_secs(20),
            || async {
                let conflicts = system.applier.client.get("/v1/conflicts").await?.json();
                Ok(conflicts.as_array().into_iter().flatten().any(|c| {
                    c["object"]["kind"] == "CAPTControlPlane"
                        && c["conflict"]["owner"] == "platform-admin"
                        && c["conflict"]["path"] == ".spec.controlPlaneEndpoint.host"
                }))
            },
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    assert_eq!(
        cp["spec"]["controlPlaneEndpoint"], theirs,
        "the user's endpoint stays"
    );
    let events = env().kubectl_ok(
        &[
            "get",
            "events",
            "-n",
            &ns.name,
            "--field-selector",
            "reason=FieldConflict",
            "-o",
            "jsonpath={.items[*].message}{.items[*].note}",
        ],
        None,
    )?;
    assert!(
        events.contains("owned by platform-admin"),
        "an Event reports it: {events}"
    );
    Ok(())
}
