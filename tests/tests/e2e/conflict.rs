//! A user's server-side apply of another endpoint: a conflict the applier reports (and an
//! Event), and the user's value stays.

use crate::common::{ONE_AT_A_TIME, provisioned};
use anyhow::Result;
use capt_controller::api::CAPTControlPlane;
use capt_tests::env;
use kube::Api;
use kube::api::{ApiResource, DynamicObject};
use serde_json::json;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

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
        .wait_for("the conflict reported by the applier", WAIT, || async {
            let conflicts = system.applier.client.get("/v1/conflicts").await?.json();
            Ok(conflicts.as_array().into_iter().flatten().any(|c| {
                c["object"]["kind"] == "CAPTControlPlane"
                    && c["conflict"]["owner"] == "platform-admin"
                    && c["conflict"]["path"] == ".spec.controlPlaneEndpoint.host"
            }))
        })
        .await?;
    // A later look must decide the same. Wake both on purpose (a label): the controller
    // finishes a reconcile of the control plane, and the applier re-checks the version the
    // label made (its watch), each time without forcing the user's endpoint away.
    let reconciles = || async {
        system
            .controller_metric("capt_reconciles_total", &["kind=\"CAPTControlPlane\""])
            .await
    };
    let finished = reconciles().await?;
    env().kubectl_ok(
        &[
            "label",
            "-n",
            &ns.name,
            "captcontrolplane",
            "demo",
            "test/poke=1",
        ],
        None,
    )?;
    system
        .wait_for(
            "a reconcile of the control plane after the poke",
            WAIT,
            || async { Ok(reconciles().await? > finished) },
        )
        .await?;
    let resource = ApiResource::erase::<CAPTControlPlane>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(env().client().await?, &ns.name, &resource);
    system
        .applier
        .acted_on(&api, "demo", "capt-captcontrolplane", true, WAIT)
        .await?;
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
