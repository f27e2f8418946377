//! A validation rule added to a CRD ratchets, so that an upgrade never strands an object: one
//! valid under the CRD it was written with but not under a stricter one can still lose its
//! finalizer and be deleted (Kubernetes' CRD validation ratcheting: a write that leaves a field
//! as it was is not refused for it). Against the real API server, with CAPT's CAPTCluster CRD
//! and, as the new rule, a `maxLength` on `spec.vpcConfig.name` that the object breaks; a
//! write that changes that field is refused (the rule is in force). The CRD is put back as
//! the tree has it when the test ends.

use anyhow::{Result, ensure};
use capt_tests::{TestNamespace, env, repo_root};
use serde_json::{Value, json};

const CRD: &str = "manifests/crds/captclusters.infrastructure.cluster.x-k8s.io.yaml";
const FINALIZER: &str = "example.com/hold";

/// Puts the tree's CRD back when dropped.
struct RestoredCrd;

impl Drop for RestoredCrd {
    fn drop(&mut self) {
        let _ = apply_crd(&tree_crd().expect("the tree's CRD"));
    }
}

fn tree_crd() -> Result<Value> {
    Ok(serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join(CRD),
    )?)?)
}

fn apply_crd(crd: &Value) -> Result<()> {
    env().kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            "testenv",
            "-f",
            "-",
        ],
        Some(&crd.to_string()),
    )?;
    env().kubectl_ok(
        &[
            "wait",
            "--for",
            "condition=Established",
            "--timeout",
            "60s",
            "crd",
            crd["metadata"]["name"].as_str().unwrap_or_default(),
        ],
        None,
    )?;
    Ok(())
}

#[tokio::test]
async fn an_object_a_new_rule_refuses_can_still_lose_its_finalizer_and_be_deleted() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "ratchet").await?;
    let _restored = RestoredCrd;
    let object = json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
        "metadata": {"name": "old", "namespace": ns.name, "finalizers": [FINALIZER]},
        "spec": {"region": "ap-northeast-1", "existingVpcId": "vpc-1", "vpcConfig": {"name": "a-long-vpc-name"}}});
    env().kubectl_ok(&["create", "-f", "-"], Some(&object.to_string()))?;

    let mut stricter = tree_crd()?;
    for version in stricter["spec"]["versions"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        let name = &mut version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["vpcConfig"]
            ["properties"]["name"];
        ensure!(name.is_object(), "no spec.vpcConfig.name in {CRD}");
        name["maxLength"] = json!(3);
    }
    apply_crd(&stricter)?;

    let target = ["-n", &ns.name, "captcluster", "old"];
    let changed = env().kubectl_run(
        &[
            &["patch"][..],
            &target,
            &[
                "--type",
                "merge",
                "-p",
                r#"{"spec":{"vpcConfig":{"name":"still-too-long"}}}"#,
            ],
        ]
        .concat(),
        None,
    )?;
    ensure!(
        !changed.status.success(),
        "the new rule is not in force: a change of the field was accepted"
    );
    // Deleted as a CAPT object is: marked first, its finalizer removed then.
    env().kubectl_ok(
        &[&["delete"][..], &target, &["--wait=false"]].concat(),
        None,
    )?;
    env().kubectl_ok(
        &[
            &["patch"][..],
            &target,
            &[
                "--type",
                "json",
                "-p",
                r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
            ],
        ]
        .concat(),
        None,
    )?;
    env().kubectl_ok(
        &[&["wait"][..], &target, &["--for=delete", "--timeout=30s"]].concat(),
        None,
    )?;
    let left = env().kubectl_ok(
        &[&["get"][..], &target, &["--ignore-not-found"]].concat(),
        None,
    )?;
    ensure!(left.trim().is_empty(), "still there: {left}");
    Ok(())
}
