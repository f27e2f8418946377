//! Our CRDs as the real API server serves them: printer columns, validation, and the
//! upstream CRDs installed beside them.

use anyhow::Result;
use capt_controller::api::CAPTCluster;
use capt_tests::{TestNamespace, env};
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test]
async fn kubectl_get_captcontrolplane_shows_the_printer_columns_of_the_design() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "columns").await?;
    let manifest = json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "test-cluster", "namespace": ns.name},
        "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "eks"},
                 "controlPlaneEndpoint": {"host": "10.0.0.1", "port": 6443}},
    });
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&manifest.to_string()),
    )?;
    env().kubectl_ok(
        &["apply", "--server-side", "--subresource=status", "--field-manager=test", "-f", "-"],
        Some(&json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
            "metadata": {"name": "test-cluster", "namespace": ns.name},
            "status": {"ready": true, "phase": "Ready", "endpoint": "10.0.0.1:6443"}})
        .to_string()),
    )?;

    let out = env().kubectl_ok(&["get", "captcontrolplane", "-n", &ns.name], None)?;
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["NAME", "READY", "PHASE", "VERSION", "ENDPOINT", "AGE"],
        "{out}"
    );
    assert_eq!(
        lines[1][..5],
        ["test-cluster", "true", "Ready", "1.31", "10.0.0.1:6443"],
        "{out}"
    );

    let out = env().kubectl_ok(&["get", "captcluster", "-n", &ns.name], None)?;
    assert!(out.is_empty() || out.contains("No resources"), "{out}");
    let err = env().kubectl_run(&["get", "captcluster", "-n", &ns.name], None)?;
    assert!(String::from_utf8_lossy(&err.stderr).contains("No resources found"));
    Ok(())
}

#[tokio::test]
async fn kubectl_get_captcluster_shows_vpc_ready_and_endpoint_columns() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "columns-c").await?;
    let manifest = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
        "metadata": {"name": "test-cluster", "namespace": ns.name},
        "spec": {"region": "ap-northeast-1", "existingVpcId": "vpc-123456789"},
    });
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&manifest.to_string()),
    )?;
    env().kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--subresource=status",
            "--field-manager=test",
            "-f",
            "-",
        ],
        Some(
            &json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
            "metadata": {"name": "test-cluster", "namespace": ns.name},
            "status": {"ready": true, "vpcId": "vpc-123456789", "endpoint": "10.0.0.1:6443"}})
            .to_string(),
        ),
    )?;
    let out = env().kubectl_ok(&["get", "captcluster", "-n", &ns.name], None)?;
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["NAME", "VPC-ID", "READY", "ENDPOINT", "AGE"],
        "{out}"
    );
    assert_eq!(
        lines[1][..4],
        ["test-cluster", "vpc-123456789", "true", "10.0.0.1:6443"],
        "{out}"
    );
    Ok(())
}

#[tokio::test]
async fn the_real_cluster_and_workspace_crds_are_installed() -> Result<()> {
    let out = env().kubectl_ok(
        &[
            "get",
            "crd",
            "clusters.cluster.x-k8s.io",
            "workspaces.tf.upbound.io",
            "-o",
            "json",
        ],
        None,
    )?;
    let list: serde_json::Value = serde_json::from_str(&out)?;
    let versions = |name: &str, served: bool| -> Vec<String> {
        let crd = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no CRD {name}"));
        let key = if served { "served" } else { "storage" };
        crd["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v[key] == true)
            .filter_map(|v| v["name"].as_str().map(str::to_owned))
            .collect()
    };
    // Core v1.14 stores v1beta2 and still serves v1beta1, the contract our controller reads
    // (without core, the test environment keeps the CRD at v1beta1 alone).
    let core = env().core;
    let cluster_served = versions("clusters.cluster.x-k8s.io", true);
    assert!(
        cluster_served.contains(&"v1beta1".to_owned()),
        "{cluster_served:?}"
    );
    assert_eq!(
        versions("clusters.cluster.x-k8s.io", false),
        [if core { "v1beta2" } else { "v1beta1" }]
    );
    assert_eq!(versions("workspaces.tf.upbound.io", false), ["v1beta1"]);
    Ok(())
}

#[tokio::test]
async fn an_invalid_captcluster_is_rejected_with_a_clear_message() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "validation").await?;
    let api: Api<CAPTCluster> = Api::namespaced(client, &ns.name);
    let create = |spec: serde_json::Value| {
        let api = api.clone();
        async move {
            let obj: CAPTCluster = serde_json::from_value(json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
                "metadata": {"name": "bad"}, "spec": spec,
            }))
            .unwrap();
            api.create(&PostParams::default(), &obj).await
        }
    };
    let message = |r: kube::Result<CAPTCluster>| match r {
        Err(kube::Error::Api(s)) if s.code == 422 => s.message,
        other => panic!("expected a 422, got {other:?}"),
    };

    let both = message(create(json!({"region": "ap-northeast-1", "existingVpcId": "vpc-1", "vpcTemplateRef": {"name": "vpc"}})).await);
    assert!(
        both.contains("exactly one of spec.vpcTemplateRef and spec.existingVpcId must be set"),
        "{both}"
    );
    let neither = message(create(json!({"region": "ap-northeast-1"})).await);
    assert!(
        neither.contains("exactly one of spec.vpcTemplateRef and spec.existingVpcId must be set"),
        "{neither}"
    );
    let region = message(create(json!({"region": "Tokyo", "existingVpcId": "vpc-1"})).await);
    assert!(
        region.contains("spec.region") && region.contains("\"Tokyo\""),
        "{region}"
    );

    create(json!({"region": "ap-northeast-1", "existingVpcId": "vpc-1"})).await?;
    Ok(())
}
