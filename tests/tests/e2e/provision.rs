//! Provisioning: the sample Cluster goes from nothing to provisioned with every field owned
//! as planned, and then stays still (no write, no reconcile).

use crate::common::{ENDPOINT_HOST, ONE_AT_A_TIME, provisioned};
use anyhow::Result;
use capt_tests::env;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[tokio::test]
async fn a_cluster_goes_from_nothing_to_provisioned_with_its_endpoint_set() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let (ns, system) = provisioned("e2e-up", false).await?;
    println!("Provisioned in {:.1} s", started.elapsed().as_secs_f64());

    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    assert_eq!(
        cp["spec"]["controlPlaneEndpoint"],
        json!({"host": ENDPOINT_HOST, "port": 443})
    );
    assert_eq!(cp["status"]["phase"], "Ready");
    assert_eq!(cp["status"]["ready"], true);
    assert_eq!(cp["status"]["initialized"], true);
    assert_eq!(
        cp["status"]["workspaceStatus"]["atProvider"]["outputs"]["cluster_endpoint"],
        format!("https://{ENDPOINT_HOST}")
    );
    let cluster = system.get(&["cluster", "demo"])?.unwrap();
    assert_eq!(
        cluster["spec"]["controlPlaneEndpoint"],
        json!({"host": ENDPOINT_HOST, "port": 443})
    );
    assert_eq!(cluster["status"]["infrastructureReady"], true);
    assert_eq!(cluster["status"]["controlPlaneReady"], true);
    let cc = system.get(&["captcluster", "demo"])?.unwrap();
    assert_eq!(cc["status"]["vpcId"], "vpc-demo");
    assert_eq!(cc["status"]["ready"], true);

    // Every status and endpoint field has the owner of the ownership plan.
    let owner = |obj: &Value, path: &[&str], sub: &str| -> Vec<String> {
        obj["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["subresource"].as_str().unwrap_or("") == sub)
            .filter(|e| {
                path.iter()
                    .try_fold(&e["fieldsV1"], |v, p| v.get(format!("f:{p}")))
                    .is_some()
            })
            .map(|e| e["manager"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        owner(&cp, &["status", "workspaceStatus", "atProvider"], "status"),
        ["capt-captcontrolplane"]
    );
    assert_eq!(
        owner(&cp, &["spec", "controlPlaneEndpoint"], ""),
        ["capt-captcontrolplane"]
    );
    // Beside Cluster API core the Cluster's fields are core's (manager `manager`); without it,
    // capt-cluster writes them (docs/cluster-api.md).
    let cluster_writer = if env().core {
        "manager"
    } else {
        "capt-cluster"
    };
    assert_eq!(
        owner(&cluster, &["spec", "controlPlaneEndpoint"], ""),
        [cluster_writer]
    );
    assert_eq!(
        owner(&cluster, &["status", "phase"], "status"),
        [cluster_writer]
    );
    assert_eq!(
        owner(&cc, &["status", "vpcId"], "status"),
        ["capt-captcluster"]
    );
    let _ = ns;
    Ok(())
}

#[tokio::test]
async fn steady_state_makes_no_writes_and_no_reconciles_over_30_seconds() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("e2e-steady", false).await?;
    tokio::time::sleep(Duration::from_secs(3)).await; // let the last echoes of provisioning settle
    let versions = || -> Result<BTreeMap<String, String>> {
        let mut v = BTreeMap::new();
        for kind in [
            "cluster",
            "captcluster",
            "captcontrolplane",
            "workspacetemplateapply",
        ] {
            let out = env().kubectl_ok(
                &[
                    "get",
                    kind,
                    "-n",
                    &ns.name,
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.name}={.metadata.resourceVersion} {end}",
                ],
                None,
            )?;
            v.insert(kind.to_owned(), out);
        }
        let ws = env().kubectl_ok(
            &[
                "get",
                "workspaces",
                "-l",
                &format!("{}={}", capt_tests::system::APPLY_NAMESPACE_LABEL, ns.name),
                "-o",
                "jsonpath={range .items[*]}{.metadata.name}={.metadata.resourceVersion} {end}",
            ],
            None,
        )?;
        v.insert("workspace".into(), ws);
        Ok(v)
    };
    let before = versions()?;
    let reconciles = system
        .controller_metric("capt_reconciles_total", &[])
        .await?;
    let intents = system
        .controller_metric("capt_intents_published_total", &[])
        .await?;
    let writes = system
        .applier
        .metric("status_applier_api_writes_total", &[])
        .await?;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(versions()?, before, "no object changed");
    assert_eq!(
        system
            .controller_metric("capt_reconciles_total", &[])
            .await?,
        reconciles,
        "no reconcile"
    );
    assert_eq!(
        system
            .controller_metric("capt_intents_published_total", &[])
            .await?,
        intents,
        "no intent"
    );
    assert_eq!(
        system
            .applier
            .metric("status_applier_api_writes_total", &[])
            .await?,
        writes,
        "no write"
    );
    println!(
        "steady state over 30 s: 0 writes, 0 reconciles (after {reconciles} reconciles and {writes} writes to provision)"
    );
    Ok(())
}
