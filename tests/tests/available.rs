//! A Cluster that becomes `Available=True` beside the real Cluster API core manager: the
//! test environment's second kube-apiserver plays the EKS control plane
//! (`hack/testenv.sh` `start_workload`), the sample EKS module outputs its endpoint, CA and
//! a token (`hack/testenv.sh workload-samples`), the controller writes the
//! `<cluster>-kubeconfig` Secret from them, and core's cluster cache connects with it: its
//! `RemoteConnectionProbe` and then `Available` turn True. Nothing here fakes core's side.

use anyhow::{Context, Result, ensure};
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::Value;
use std::time::Duration;

const CLUSTER_V1BETA2: &str = "clusters.v1beta2.cluster.x-k8s.io";

fn condition_status(cluster: &Value, type_: &str) -> Option<String> {
    let conditions = cluster["status"]["conditions"].as_array()?;
    let found = conditions.iter().find(|c| c["type"] == type_)?;
    found["status"].as_str().map(str::to_owned)
}

/// The workload API server's endpoint, as `hack/testenv.sh` wrote it.
fn workload_endpoint() -> Result<String> {
    let path = env().state_dir().join("workload/endpoint");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    Ok(text.trim().to_owned())
}

/// The workload API server's admin token (`hack/testenv.sh` `start_workload`).
fn workload_token() -> Result<String> {
    let path = env().state_dir().join("workload/outputs.json");
    let outputs: Value = serde_json::from_slice(&std::fs::read(path)?)?;
    let token = outputs["cluster_token"].as_str().context("cluster_token")?;
    Ok(token.to_owned())
}

#[tokio::test]
async fn core_connects_with_the_kubeconfig_secret_and_the_cluster_becomes_available() -> Result<()>
{
    ensure!(
        env().core,
        "this test needs Cluster API core (CAPT_TESTENV_CORE=1)"
    );
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "available").await?;
    let system = System::start(&ns.name, 200).await?;
    system.apply_workload_samples().await?;
    system.wait_provisioned().await?;

    // The Secret core reads: a bearer token for the workload API server, no exec plugin
    // (core runs none). Only its shape is checked here; its data is never printed.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let secret = secrets.get("demo-kubeconfig").await?;
    let bytes = &secret
        .data
        .as_ref()
        .and_then(|d| d.get("value"))
        .context("data.value")?
        .0;
    let config: Value = serde_yaml::from_slice(bytes).context("the kubeconfig parses")?;
    assert_eq!(
        config["clusters"][0]["cluster"]["server"],
        Value::from(workload_endpoint()?),
        "the kubeconfig names the workload API server"
    );
    let user = &config["users"][0]["user"];
    assert!(user["token"].is_string(), "a bearer token");
    assert!(user.get("exec").is_none(), "no exec plugin");

    // Core connects: its RemoteConnectionProbe, then Available (which also needs the
    // infrastructure and the control plane), turn True on the v1beta2 Cluster.
    let timeout = Duration::from_secs(120);
    system
        .wait_for(
            "the Cluster's RemoteConnectionProbe and Available conditions True",
            timeout,
            || async {
                let cluster = system.get(&[CLUSTER_V1BETA2, "demo"])?;
                Ok(cluster.is_some_and(|c| {
                    condition_status(&c, "RemoteConnectionProbe").as_deref() == Some("True")
                        && condition_status(&c, "Available").as_deref() == Some("True")
                }))
            },
        )
        .await
        .map_err(|e| {
            let conditions = system
                .get(&[CLUSTER_V1BETA2, "demo"])
                .ok()
                .flatten()
                .map(|c| c["status"]["conditions"].to_string());
            e.context(format!("the Cluster's conditions: {conditions:?}"))
        })?;

    // The token went through the connection Secret into the kubeconfig Secret, and into no
    // log of the controller, the status-applier or the provider.
    let token = workload_token()?;
    for (who, log) in [
        ("capt-controller", system.controller_log_text()),
        ("status-applier", system.applier.log_text()),
        ("fake provider", system.provider().log_text()),
    ] {
        assert!(!log.contains(&token), "the token is in the {who} log");
    }
    Ok(())
}
