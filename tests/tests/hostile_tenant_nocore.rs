//! A hostile tenant where Cluster API core does not run, so that the controller owns the
//! Cluster's endpoint (`capt-cluster`): a decoy CAPTControlPlane labelled with another's
//! Cluster cannot release (nor set out to release) that Cluster's endpoint by being deleted (hole 4; the rest of the
//! hole is `hostile_tenant.rs`, beside core). Its own binary: [`without_core`] holds for a
//! whole test process.

use anyhow::Result;
use capt_controller::api::Cluster;
use capt_tests::system::System;
use capt_tests::{TestNamespace, env, warnings, without_core};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, GroupVersionKind, WatchEvent, WatchParams};
use kube::discovery::ApiResource;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// Hole 4, the endpoint. Before the fix the decoy's deletion released Cluster `demo`'s
/// endpoint (the Cluster was whatever its label named, and the endpoint was `capt-cluster`'s):
/// a version of `demo` without `spec.controlPlaneEndpoint`. Now the decoy has no Cluster, and
/// its deletion leaves `demo` alone.
#[tokio::test]
async fn hole4_a_decoy_control_plane_cannot_release_the_endpoint_of_the_cluster_it_names()
-> Result<()> {
    without_core();
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "hostile-release").await?;
    let system = System::start(&ns.name, 50).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns.name);
    let demo = clusters.get("demo").await?;
    assert!(
        demo.spec.control_plane_endpoint.is_some(),
        "demo has its endpoint"
    );

    // Every version of demo from now on: one without its endpoint is the release.
    let released = Arc::new(AtomicBool::new(false));
    let seen = released.clone();
    let params = WatchParams::default()
        .fields("metadata.name=demo")
        .timeout(290);
    let version = demo.resource_version().unwrap_or_default();
    let mut stream = clusters.watch(&params, &version).await?.boxed();
    tokio::spawn(async move {
        while let Some(Ok(event)) = stream.next().await {
            if let WatchEvent::Modified(c) = event
                && c.spec.control_plane_endpoint.is_none()
            {
                seen.store(true, Ordering::SeqCst);
            }
        }
    });

    let decoy = json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "decoy", "namespace": ns.name,
                     "labels": {"cluster.x-k8s.io/cluster-name": "demo"}},
        "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "eks"}},
    });
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&decoy.to_string()),
    )?;
    // Every version of the decoy from now on: a `Deleting` condition of reason
    // `ReleasingEndpoint` is the decoy's deletion setting out to release demo's endpoint
    // (which demo's own control plane may republish at once, so that demo need not lose it
    // for the attempt to be made).
    let attempted = Arc::new(AtomicBool::new(false));
    let tried = attempted.clone();
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "controlplane.cluster.x-k8s.io",
            "v1beta1",
            "CAPTControlPlane",
        ),
        "captcontrolplanes",
    );
    let decoys: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &ar);
    let params = WatchParams::default()
        .fields("metadata.name=decoy")
        .timeout(290);
    let mut stream = decoys.watch(&params, "0").await?.boxed();
    tokio::spawn(async move {
        while let Some(Ok(event)) = stream.next().await {
            if let WatchEvent::Added(c) | WatchEvent::Modified(c) = event {
                let conditions = c.data["status"]["conditions"].as_array().cloned();
                if conditions
                    .into_iter()
                    .flatten()
                    .any(|c| c["reason"] == "ReleasingEndpoint")
                {
                    tried.store(true, Ordering::SeqCst);
                }
            }
        }
    });
    // The controller has taken the decoy in hand: its finalizer.
    system
        .wait_for("the decoy's finalizer", WAIT, || async {
            let cp = system.get(&["captcontrolplane", "decoy"])?;
            Ok(cp.is_some_and(|c| {
                c["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| !f.is_empty())
            }))
        })
        .await?;
    env().kubectl_ok(
        &[
            "delete",
            "captcontrolplane",
            "decoy",
            "-n",
            &ns.name,
            "--wait=false",
        ],
        None,
    )?;
    // The decoy's deletion completed (whatever it released, it has released), or it set out
    // to release demo's endpoint, or demo lost it (before the fix: the decoy's deletion then
    // waits for a release that demo's control plane undoes).
    system
        .wait_for(
            "the decoy gone, or demo's endpoint released",
            WAIT,
            || async {
                let gone = system.get(&["captcontrolplane", "decoy"])?.is_none();
                Ok(gone || released.load(Ordering::SeqCst) || attempted.load(Ordering::SeqCst))
            },
        )
        .await?;
    assert!(
        !attempted.load(Ordering::SeqCst),
        "the decoy's deletion set out to release Cluster demo's endpoint"
    );
    assert!(
        !released.load(Ordering::SeqCst),
        "the decoy's deletion released Cluster demo's endpoint"
    );
    let demo = clusters.get("demo").await?;
    assert!(demo.spec.control_plane_endpoint.is_some());
    let notes = warnings(&ns.name, "ClusterDoesNotReferenceControlPlane", "decoy")?;
    assert!(!notes.is_empty(), "a Warning Event on the decoy says why");
    Ok(())
}
