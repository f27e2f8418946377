//! ClusterClass beside the real Cluster API core manager with its topology controller on
//! (`hack/testenv.sh` starts it with `--feature-gates ClusterTopology=true`): the sample
//! ClusterClass of `manifests/samples/clusterclass.yaml` names a `CAPTClusterTemplate` and a
//! `CAPTControlPlaneTemplate`; core stamps out a CAPTCluster and a CAPTControlPlane for a
//! Cluster with `spec.topology`, CAPT provisions them (the EKS module pointed at the test
//! environment's workload API server), the Cluster becomes Available, an upgrade through
//! `spec.topology.version` reaches the Workspace and comes back to the control plane's status,
//! and deleting the Cluster removes everything.

use anyhow::{Context, Result, ensure};
use capt_tests::system::{System, apply_workload_samples_with};
use capt_tests::{TestNamespace, env};
use serde_json::{Value, json};
use std::time::Duration;

const CLUSTER: &str = "demo-class";
const CLUSTER_V1BETA2: &str = "clusters.v1beta2.cluster.x-k8s.io";

fn condition_status(obj: &Value, type_: &str) -> Option<String> {
    let conditions = obj["status"]["conditions"].as_array()?;
    let found = conditions.iter().find(|c| c["type"] == type_)?;
    found["status"].as_str().map(str::to_owned)
}

/// The Cluster (v1beta2) and the name of the CAPTControlPlane core made for it.
fn cluster_and_control_plane(system: &System) -> Result<Option<(Value, String)>> {
    let Some(cluster) = system.get(&[CLUSTER_V1BETA2, CLUSTER])? else {
        return Ok(None);
    };
    let name = cluster["spec"]["controlPlaneRef"]["name"].as_str();
    Ok(name.map(|n| (cluster.clone(), n.to_owned())))
}

/// The `kubernetes_version` variable of the Workspace rendered for control plane `cp`.
fn workspace_kubernetes_version(system: &System, cp: &Value) -> Result<Option<String>> {
    let Some(apply) = cp["spec"]["workspaceTemplateApplyName"].as_str() else {
        return Ok(None);
    };
    let Some(apply) = system.get(&["workspacetemplateapply", apply])? else {
        return Ok(None);
    };
    let Some(workspace) = apply["status"]["workspaceName"].as_str() else {
        return Ok(None);
    };
    let ws = system
        .env()
        .kubectl_ok(&["get", "workspace", workspace, "-o", "json"], None)?;
    let ws: Value = serde_json::from_str(&ws)?;
    let vars = ws["spec"]["forProvider"]["vars"].as_array().cloned();
    Ok(vars
        .unwrap_or_default()
        .iter()
        .find(|v| v["key"] == "kubernetes_version")
        .and_then(|v| v["value"].as_str().map(str::to_owned)))
}

#[tokio::test]
async fn a_cluster_from_the_clusterclass_provisions_upgrades_and_deletes() -> Result<()> {
    ensure!(
        env().core,
        "this test needs Cluster API core (CAPT_TESTENV_CORE=1)"
    );
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "clusterclass").await?;
    let system = System::start(&ns.name, 200).await?;
    apply_workload_samples_with(system.env(), &ns.name, "clusterclass.yaml")?;
    let cp_name = assert_the_topology_provisions(&system).await?;
    assert_the_topology_upgrades(&system, &ns.name, &cp_name).await?;
    assert_the_deletion_takes_everything(&system, &ns.name).await
}

/// How long each step of the topology may take.
const TOPOLOGY_TIMEOUT: Duration = Duration::from_secs(120);

/// Core's topology controller makes the CAPT objects from the templates; CAPT provisions
/// them and core connects: Available, as for a Cluster written by hand, at the topology's
/// version. Returns the control plane's name.
async fn assert_the_topology_provisions(system: &System) -> Result<String> {
    let timeout = TOPOLOGY_TIMEOUT;
    system
        .wait_for("the topology Cluster Available", timeout, || async {
            let Some((cluster, _)) = cluster_and_control_plane(system)? else {
                return Ok(false);
            };
            Ok(
                condition_status(&cluster, "RemoteConnectionProbe").as_deref() == Some("True")
                    && condition_status(&cluster, "Available").as_deref() == Some("True"),
            )
        })
        .await
        .map_err(|e| {
            let conditions = system.get(&[CLUSTER_V1BETA2, CLUSTER]).ok().flatten();
            let conditions = conditions.map(|c| c["status"]["conditions"].to_string());
            e.context(format!("the Cluster's conditions: {conditions:?}"))
        })?;
    let (cluster, cp_name) = cluster_and_control_plane(system)?.context("the Cluster")?;
    assert_eq!(
        condition_status(&cluster, "TopologyReconciled").as_deref(),
        Some("True")
    );
    let cp = system
        .get(&["captcontrolplane", &cp_name])?
        .context("the CAPTControlPlane core made")?;
    assert_eq!(
        cp["spec"]["version"], "v1.31.0",
        "from spec.topology.version"
    );
    assert_eq!(cp["status"]["version"], "v1.31.0");
    assert_eq!(cp["status"]["versions"], json!([{"version": "v1.31.0"}]));
    assert_eq!(
        workspace_kubernetes_version(system, &cp)?.as_deref(),
        Some("1.31"),
        "the module gets EKS's major.minor"
    );
    let infra = cluster["spec"]["infrastructureRef"]["name"]
        .as_str()
        .context("infrastructureRef")?
        .to_owned();
    assert!(
        system.get(&["captcluster", &infra])?.is_some(),
        "the CAPTCluster core made"
    );
    Ok(cp_name)
}

/// The upgrade: spec.topology.version → the control plane's spec → the Workspace → back
/// to the control plane's status; the topology reconciled at the new version.
async fn assert_the_topology_upgrades(system: &System, ns: &str, cp_name: &str) -> Result<()> {
    let timeout = TOPOLOGY_TIMEOUT;
    system.env().kubectl_ok(
        &[
            "patch",
            CLUSTER_V1BETA2,
            CLUSTER,
            "-n",
            ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"topology":{"version":"v1.32.0"}}}"#,
        ],
        None,
    )?;
    system
        .wait_for("the upgrade back in the status", timeout, || async {
            let Some(cp) = system.get(&["captcontrolplane", cp_name])? else {
                return Ok(false);
            };
            Ok(cp["spec"]["version"] == "v1.32.0"
                && cp["status"]["version"] == "v1.32.0"
                && cp["status"]["versions"] == json!([{"version": "v1.32.0"}])
                && workspace_kubernetes_version(system, &cp)?.as_deref() == Some("1.32"))
        })
        .await?;
    system
        .wait_for("the topology reconciled at v1.32.0", timeout, || async {
            let Some((cluster, _)) = cluster_and_control_plane(system)? else {
                return Ok(false);
            };
            Ok(
                condition_status(&cluster, "TopologyReconciled").as_deref() == Some("True")
                    && condition_status(&cluster, "Available").as_deref() == Some("True"),
            )
        })
        .await
}

/// Deletion: the Cluster, then everything core made and CAPT rendered, Workspaces included.
async fn assert_the_deletion_takes_everything(system: &System, ns: &str) -> Result<()> {
    let timeout = TOPOLOGY_TIMEOUT;
    system.env().kubectl_ok(
        &["delete", CLUSTER_V1BETA2, CLUSTER, "-n", ns, "--wait=false"],
        None,
    )?;
    let workspaces_before = system.env().kubectl_ok(
        &[
            "get",
            "workspaces",
            "-l",
            &format!(
                "infrastructure.cluster.x-k8s.io/workspacetemplateapply-namespace={}",
                ns
            ),
            "-o",
            "name",
        ],
        None,
    )?;
    assert_eq!(
        workspaces_before.lines().count(),
        2,
        "the VPC's and the control plane's Workspaces, found by the label: {workspaces_before}"
    );
    system
        .wait_for("the Cluster and its objects gone", timeout, || async {
            let left = |kind: &str| -> Result<bool> {
                let out = system
                    .env()
                    .kubectl_ok(&["get", kind, "-n", ns, "-o", "name"], None)?;
                Ok(!out.trim().is_empty())
            };
            // The Workspaces are cluster-scoped; the label names their apply's namespace.
            let selector = format!(
                "infrastructure.cluster.x-k8s.io/workspacetemplateapply-namespace={}",
                ns
            );
            let workspaces = system
                .env()
                .kubectl_ok(&["get", "workspaces", "-l", &selector, "-o", "name"], None)?;
            Ok(!(left(CLUSTER_V1BETA2)?
                || left("captcluster")?
                || left("captcontrolplane")?
                || left("workspacetemplateapply")?
                || !workspaces.trim().is_empty()))
        })
        .await?;
    Ok(())
}
