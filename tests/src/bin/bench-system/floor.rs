//! The floor: the least a writer can do for our hop, on the same API server under the same
//! load, measured in the same round. A task of the benchmark watches the floor's Workspaces
//! and, as soon as one shows its `cluster_endpoint` output, server-side applies that endpoint
//! to its CAPTControlPlane's `spec.controlPlaneEndpoint`, and once the Workspace is also
//! Ready=True, `status.ready: true`: the two writes our system makes on that path, each
//! straight from the watch event, with no controller, no sidecar, no coalescing and no cache
//! but the set of what it already wrote.
//!
//! A floor stack is a CAPTControlPlane paused by its annotation (so that our controller,
//! which watches every namespace, only keeps its `Paused` condition there, a field the floor
//! does not write) and a Workspace of no apply, which the fake provider applies as it does
//! ours: `floor_workspace` names it, the labels tie it to the round's namespace and to the
//! control plane.
//!
//! The API server's cost of a write grows with the object written to, whatever the write
//! carries: a two-field status apply took 3.2 ms (p50) on a bare CAPTControlPlane and 5.1 on
//! one carrying a provisioned control plane's status, 5 KB (`docs/performance.md`). So that
//! the floor writes to an object like ours, each floor control plane carries, before its
//! Workspace exists, the status of one of the round's provisioned control planes
//! ([`Padding`]), applied by the benchmark's own field manager.

use crate::stacks::{BENCH_MANAGER, bench_creates, resource};
use anyhow::{Context, Result};
use capt_tests::fake_provider::{OUTPUTS_ANNOTATION, workspace_resource};
use capt_tests::system::APPLY_NAMESPACE_LABEL;
use futures::StreamExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::collections::HashSet;

/// The floor writer's field manager.
pub(crate) const MANAGER: &str = "capt-floor";
/// The label naming a floor Workspace's control plane.
const CONTROL_PLANE_LABEL: &str = "bench.capt.dev/floor-control-plane";

/// The floor stack's name (its control plane's).
pub(crate) fn floor_name(i: usize) -> String {
    format!("f{i:04}")
}

/// Its Workspace's name.
pub(crate) fn floor_workspace(ns: &str, name: &str) -> String {
    format!("floor-{ns}-{name}")
}

/// Runs the floor writer for the Workspaces of `ns`'s floor stacks until aborted.
pub(crate) fn spawn(client: kube::Client, ns: String) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let workspaces: Api<DynamicObject> = Api::all_with(client.clone(), &workspace_resource());
        let control_planes: Api<DynamicObject> = Api::namespaced_with(
            client,
            &ns,
            &resource("controlplane.cluster.x-k8s.io", "CAPTControlPlane"),
        );
        let selector = format!("{APPLY_NAMESPACE_LABEL}={ns},{CONTROL_PLANE_LABEL}");
        let mut events = watcher(workspaces, watcher::Config::default().labels(&selector))
            .default_backoff()
            .applied_objects()
            .boxed();
        let apply = PatchParams::apply(MANAGER).force();
        // (control plane, what was written): each write once.
        let mut written: HashSet<(String, String)> = HashSet::new();
        while let Some(event) = events.next().await {
            let Ok(ws) = event else { continue };
            let Some(cp) = ws
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(CONTROL_PLANE_LABEL))
                .cloned()
            else {
                continue;
            };
            let Some(url) = ws.data["status"]["atProvider"]["outputs"]["cluster_endpoint"].as_str()
            else {
                continue;
            };
            let host = url.trim_start_matches("https://").to_owned();
            if written.insert((cp.clone(), format!("host:{host}"))) {
                let body = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
                    "kind": "CAPTControlPlane",
                    "spec": {"controlPlaneEndpoint": {"host": host, "port": 443}}});
                if let Err(e) = control_planes
                    .patch(&cp, &apply, &Patch::Apply(&body))
                    .await
                {
                    eprintln!("  floor: applying {cp}'s endpoint: {e}");
                    written.remove(&(cp.clone(), format!("host:{host}")));
                }
            }
            let ready = ws.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            if ready && written.insert((cp.clone(), "ready".into())) {
                let body = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
                    "kind": "CAPTControlPlane", "status": {"ready": true}});
                if let Err(e) = control_planes
                    .patch_status(&cp, &apply, &Patch::Apply(&body))
                    .await
                {
                    eprintln!("  floor: applying {cp}'s status: {e}");
                    written.remove(&(cp.clone(), "ready".into()));
                }
            }
        }
    })
}

/// What a floor control plane carries besides what the floor writes.
#[derive(Clone, Debug)]
pub(crate) enum Padding {
    /// Nothing: a bare object, only its `Paused` condition (`--floor-object bare`).
    Bare,
    /// The status of a provisioned control plane of ours (`--floor-object as-ours`).
    Status(Value),
}

impl Padding {
    /// The status of `ns/name`, a provisioned control plane of ours, less `ready` (the
    /// floor's to write) and the `Paused` condition (our controller's, on a paused one).
    pub(crate) async fn of(client: &kube::Client, ns: &str, name: &str) -> Result<Self> {
        let control_planes: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            ns,
            &resource("controlplane.cluster.x-k8s.io", "CAPTControlPlane"),
        );
        let cp = control_planes
            .get(name)
            .await
            .with_context(|| format!("reading {ns}/{name}, the floor's padding"))?;
        let mut status = cp.data["status"].clone();
        let Some(fields) = status.as_object_mut() else {
            anyhow::bail!("{ns}/{name} has no status to pad the floor's objects with");
        };
        fields.remove("ready");
        if let Some(Value::Array(conditions)) = fields.get_mut("conditions") {
            conditions.retain(|c| c["type"] != "Paused");
        }
        Ok(Self::Status(status))
    }

    /// Its size in bytes (serialized), for the tables.
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Self::Bare => 0,
            Self::Status(status) => status.to_string().len(),
        }
    }
}

/// Creates floor stack `name` in `ns`: its paused control plane (with `padding`), then its
/// Workspace.
pub(crate) async fn create_floor_stack(
    client: &kube::Client,
    ns: &str,
    name: &str,
    padding: &Padding,
) -> Result<()> {
    let pp = bench_creates();
    let control_planes: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &resource("controlplane.cluster.x-k8s.io", "CAPTControlPlane"),
    );
    let cp = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": name, "namespace": ns,
            "annotations": {"cluster.x-k8s.io/paused": "true"}},
        "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "eks"}}});
    control_planes
        .create(&pp, &serde_json::from_value(cp)?)
        .await
        .with_context(|| format!("creating the floor's CAPTControlPlane {ns}/{name}"))?;
    if let Padding::Status(status) = padding {
        let body = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
            "kind": "CAPTControlPlane", "status": status});
        control_planes
            .patch_status(
                name,
                &PatchParams::apply(BENCH_MANAGER),
                &Patch::Apply(&body),
            )
            .await
            .with_context(|| format!("padding the floor's CAPTControlPlane {ns}/{name}"))?;
    }
    let outputs = json!({"cluster_endpoint": format!("https://{name}.floor.bench.example.com")});
    let ws = json!({"apiVersion": "tf.upbound.io/v1beta1", "kind": "Workspace",
        "metadata": {"name": floor_workspace(ns, name),
            "labels": {APPLY_NAMESPACE_LABEL: ns, CONTROL_PLANE_LABEL: name},
            "annotations": {OUTPUTS_ANNOTATION: outputs.to_string()}},
        "spec": {"forProvider": {"source": "Inline",
            "module": "output \"cluster_endpoint\" { value = \"floor\" }"}}});
    Api::<DynamicObject>::all_with(client.clone(), &workspace_resource())
        .create(&pp, &serde_json::from_value(ws)?)
        .await
        .with_context(|| format!("creating the floor's Workspace for {ns}/{name}"))?;
    Ok(())
}
