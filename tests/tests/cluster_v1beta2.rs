//! The controller reads the Cluster API `Cluster` in `v1beta2` alone: in the environment
//! without core the Cluster CRD serves no other version (what core v1.16 plans to serve), and a
//! Cluster still provisions there, with `capt-cluster` writing the v1beta2 fields it plays in
//! core's place. The references are matched by group, kind and name: one that names our kind
//! in another group is no reference to our object. Its own binary: [`without_core`] holds for
//! a whole test process.

use anyhow::{Context, Result};
use capt_tests::system::System;
use capt_tests::{TestNamespace, env, warnings, without_core};
use serde_json::{Value, json};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// The managers of `obj`'s managedFields entries that hold `path`, as
/// `manager/operation/subresource`.
fn owners(obj: &Value, path: &[&str]) -> Vec<String> {
    let entries = obj["metadata"]["managedFields"].as_array();
    entries
        .into_iter()
        .flatten()
        .filter(|e| {
            path.iter()
                .try_fold(&e["fieldsV1"], |v, p| v.get(format!("f:{p}")))
                .is_some()
        })
        .map(|e| {
            format!(
                "{}/{}/{}",
                e["manager"].as_str().unwrap_or(""),
                e["operation"].as_str().unwrap_or(""),
                e["subresource"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[tokio::test]
async fn a_cluster_served_only_in_v1beta2_provisions_and_references_match_by_group() -> Result<()> {
    without_core();
    let crd = env().kubectl_ok(
        &["get", "crd", "clusters.cluster.x-k8s.io", "-o", "json"],
        None,
    )?;
    let crd: Value = serde_json::from_str(&crd)?;
    let served: Vec<&str> = (crd["spec"]["versions"].as_array().into_iter().flatten())
        .filter(|v| v["served"] == true)
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(served, ["v1beta2"], "the Cluster CRD serves v1beta2 alone");

    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "cluster-v1beta2").await?;
    let system = System::start(&ns.name, 20).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;

    let cluster = system
        .get(&["clusters.v1beta2.cluster.x-k8s.io", "demo"])?
        .context("Cluster demo")?;
    let status = &cluster["status"];
    assert_eq!(status["phase"], "Provisioned", "{status}");
    let initialization = &status["initialization"];
    assert_eq!(
        initialization["infrastructureProvisioned"], true,
        "{status}"
    );
    assert_eq!(initialization["controlPlaneInitialized"], true, "{status}");
    assert!(
        cluster["spec"]["controlPlaneEndpoint"]["host"]
            .as_str()
            .is_some_and(|h| !h.is_empty()),
        "{}",
        cluster["spec"]
    );
    for (path, owner) in [
        (
            &["status", "initialization", "infrastructureProvisioned"][..],
            "capt-cluster/Apply/status",
        ),
        (
            &["status", "initialization", "controlPlaneInitialized"],
            "capt-cluster/Apply/status",
        ),
        (&["status", "phase"], "capt-cluster/Apply/status"),
        (&["spec", "controlPlaneEndpoint"], "capt-cluster/Apply/"),
    ] {
        assert_eq!(owners(&cluster, path), [owner], "{}", path.join("."));
    }

    // A Cluster whose controlPlaneRef names a CAPTControlPlane by kind and name, in another
    // group; the control plane carries that Cluster's label. It is not that Cluster's control
    // plane: it is told so, and builds nothing.
    let stray = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "stray", "namespace": ns.name},
        "spec": {"controlPlaneRef": {"apiGroup": "controlplane.example.com",
                                     "kind": "CAPTControlPlane", "name": "stray"}},
    });
    let stray_cp = json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "stray", "namespace": ns.name,
                     "labels": {"cluster.x-k8s.io/cluster-name": "stray"}},
        "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "eks"}},
    });
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&format!("{stray}\n---\n{stray_cp}")),
    )?;
    let reason = capt_controller::reconcile::control_plane::CLUSTER_DOES_NOT_REFERENCE;
    system
        .wait_for("the stray control plane told", WAIT, || async {
            Ok(!warnings(&ns.name, reason, "stray")?.is_empty())
        })
        .await?;
    let cp = system
        .get(&["captcontrolplane", "stray"])?
        .context("CAPTControlPlane stray")?;
    assert!(
        cp["spec"]["workspaceTemplateApplyName"].is_null(),
        "no apply for a control plane no Cluster references: {}",
        cp["spec"]
    );
    let applies = env().kubectl_ok(
        &[
            "get",
            "workspacetemplateapplies",
            "-n",
            &ns.name,
            "-o",
            "name",
        ],
        None,
    )?;
    assert!(!applies.contains("stray"), "{applies}");
    Ok(())
}

/// Core's finalizer is missing from every Cluster here, as it is from a new Cluster core has
/// not reconciled yet. A controller not told that core is absent
/// (`--without-cluster-api-core`) does not take that absence for it: `capt-cluster` leaves the
/// Cluster to core and writes nothing to it, though its control plane is Ready with an
/// endpoint (what it would write without core). Without this, the endpoint it wrote in that
/// moment stayed its own beside core and was reported as a conflict on every change after.
#[tokio::test]
async fn a_controller_not_told_core_is_absent_leaves_a_cluster_without_its_finalizer_to_core()
-> Result<()> {
    without_core();
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "core-not-declared").await?;
    let system = System::start_with(&ns.name, 20, &["--without-cluster-api-core=false"]).await?;
    system.apply_samples(false).await?;
    system
        .wait_for(
            "the control plane Ready with its endpoint",
            WAIT,
            || async {
                Ok(system
                    .get(&["captcontrolplane", "demo"])?
                    .is_some_and(|cp| {
                        cp["status"]["ready"] == true
                            && cp["spec"]["controlPlaneEndpoint"]["host"].is_string()
                    }))
            },
        )
        .await?;
    // A change of the Cluster after that: the Cluster's reconcile that follows reads the
    // Ready control plane from its cache, as capt-cluster would have to write its endpoint.
    let reconciles = || system.controller_metric("capt_reconciles_total", &["kind=\"Cluster\""]);
    let before = reconciles().await?;
    env().kubectl_ok(
        &[
            "annotate",
            "-n",
            &ns.name,
            "clusters.v1beta2.cluster.x-k8s.io/demo",
            "touched=1",
        ],
        None,
    )?;
    system
        .wait_for(
            "a reconcile of the Cluster after its change",
            WAIT,
            || async { Ok(reconciles().await? > before) },
        )
        .await?;
    let clusters = kube::Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        &ns.name,
        &kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster"),
            "clusters",
        ),
    );
    let cluster = system
        .applier
        .acted_on(&clusters, "demo", "capt-cluster", true, WAIT)
        .await?;
    let entries = cluster["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ours: Vec<_> = entries
        .iter()
        .filter(|e| e["manager"] == "capt-cluster")
        .collect();
    assert!(ours.is_empty(), "capt-cluster wrote the Cluster: {ours:?}");
    assert!(
        cluster["spec"]["controlPlaneEndpoint"].is_null(),
        "{}",
        cluster["spec"]
    );
    assert!(
        cluster["status"]["phase"].is_null(),
        "{}",
        cluster["status"]
    );
    Ok(())
}
