//! What decoding each watched object alone costs (`capt_controller::unreadable::Decoded`: the
//! object as JSON first, then as its type) beside decoding it straight into its type, as the
//! watches did before, in the same run: a list page of 50 objects (what the watches ask for)
//! and one watch event, for a Cluster as core writes it, a control plane with its status, and
//! a Workspace with its inline module. The cached copy is the same in both: the JSON of each
//! object is dropped once it has been read.
//!
//! `cargo run --release -p capt-controller --example decode_cost [-- <rounds>]`

use capt_controller::api::{CAPTControlPlane, Cluster, TerraformWorkspace};
use capt_controller::unreadable::Decoded;
use kube::core::{ObjectList, WatchEvent};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const PAGE: usize = 50;

fn conditions(n: usize) -> Value {
    (0..n)
        .map(|i| {
            json!({"type": format!("Condition{i}"), "status": "True", "reason": "Ready",
                "message": "everything is as it should be", "observedGeneration": 3,
                "lastTransitionTime": "2026-12-01T10:00:00Z"})
        })
        .collect()
}

fn meta(kind: &str, i: usize) -> Value {
    json!({"name": format!("{kind}-{i}"), "namespace": "tenant-a", "uid": format!("uid-{i}"),
        "resourceVersion": format!("{}", 1000 + i), "generation": 3,
        "creationTimestamp": "2026-12-01T10:00:00Z",
        "labels": {"cluster.x-k8s.io/cluster-name": format!("c-{i}")},
        "finalizers": ["controlplane.cluster.x-k8s.io/captcontrolplane"]})
}

fn cluster(i: usize) -> Value {
    json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": meta("c", i),
        "spec": {"controlPlaneEndpoint": {"host": format!("c-{i}.eks.example.com"), "port": 443},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "CAPTCluster", "name": format!("c-{i}")},
            "controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io",
                "kind": "CAPTControlPlane", "name": format!("c-{i}")}},
        "status": {"phase": "Provisioned", "conditions": conditions(8),
            "initialization": {"infrastructureProvisioned": true,
                "controlPlaneInitialized": true}}})
}

fn control_plane(i: usize) -> Value {
    let outputs: serde_json::Map<String, Value> = (0..12)
        .map(|o| (format!("output_{o}"), json!(format!("value-{i}-{o}"))))
        .collect();
    json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": meta("cp", i),
        "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "eks"},
            "controlPlaneConfig": {"region": "ap-northeast-1", "endpointAccess":
                {"public": true, "private": true}},
            "controlPlaneEndpoint": {"host": format!("c-{i}.eks.example.com"), "port": 443}},
        "status": {"ready": true, "initialized": true, "phase": "Ready", "version": "1.31",
            "workspaceStatus": {"ready": true, "state": "Available",
                "atProvider": {"checksum": "abc", "outputs": outputs}},
            "conditions": conditions(4)}})
}

fn workspace(i: usize) -> Value {
    let module = "variable \"x\" {}\noutput \"y\" { value = var.x }\n".repeat(30);
    json!({"apiVersion": "tf.upbound.io/v1beta1", "kind": "Workspace",
        "metadata": {"name": format!("ws-{i}"), "uid": format!("uid-{i}"),
            "resourceVersion": format!("{}", 1000 + i),
            "annotations": {"infrastructure.cluster.x-k8s.io/workspace-revision": "0123456789abcdef"}},
        "spec": {"forProvider": {"source": "Inline", "module": module,
            "vars": [{"key": "x", "value": format!("v-{i}")}]},
            "providerConfigRef": {"name": "default"}},
        "status": {"atProvider": {"checksum": "abc", "outputs": {"y": format!("v-{i}")}},
            "conditions": conditions(2)}})
}

/// The median time per object of `rounds` decodes of `text` as `T`, over `objects` objects.
fn per_object<T: DeserializeOwned>(text: &str, objects: usize, rounds: usize) -> Duration {
    let mut times: Vec<Duration> = (0..rounds)
        .map(|_| {
            let started = Instant::now();
            let decoded: T = serde_json::from_str(text).expect("decodes");
            std::hint::black_box(decoded);
            started.elapsed() / u32::try_from(objects).expect("a page")
        })
        .collect();
    times.sort();
    times[rounds / 2]
}

fn compare<K: DeserializeOwned + Clone>(kind: &str, make: fn(usize) -> Value, rounds: usize) {
    let page = json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"},
        "items": (0..PAGE).map(make).collect::<Vec<_>>()})
    .to_string();
    let event = json!({"type": "MODIFIED", "object": make(0)}).to_string();
    let each: ObjectList<Decoded<K>> = serde_json::from_str(&page).expect("the page decodes");
    assert!(
        each.items.iter().all(|d| matches!(d, Decoded::Readable(_))),
        "every {kind} of the page is readable: the two decode the same objects"
    );
    let list_typed = per_object::<ObjectList<K>>(&page, PAGE, rounds);
    let list_each = per_object::<ObjectList<Decoded<K>>>(&page, PAGE, rounds);
    let event_typed = per_object::<WatchEvent<K>>(&event, 1, rounds);
    let event_each = per_object::<WatchEvent<Decoded<K>>>(&event, 1, rounds);
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "{kind:<17} {:>6} B  list page: {:>7.1} -> {:>7.1} µs/object ({:.2}x)   \
         watch event: {:>7.1} -> {:>7.1} µs ({:.2}x)",
        event.len(),
        list_typed.as_secs_f64() * 1e6,
        list_each.as_secs_f64() * 1e6,
        ratio(list_each, list_typed),
        event_typed.as_secs_f64() * 1e6,
        event_each.as_secs_f64() * 1e6,
        ratio(event_each, event_typed),
    );
}

fn main() -> anyhow::Result<()> {
    let rounds: usize = match std::env::args().nth(1) {
        Some(n) => n
            .parse()
            .map_err(|e| anyhow::anyhow!("rounds: {n:?} is not a count: {e}"))?,
        None => 301,
    };
    anyhow::ensure!(rounds > 0, "rounds: at least one");
    println!("median of {rounds} rounds; typed (before) -> each object alone (now)");
    compare::<Cluster>("Cluster", cluster, rounds);
    compare::<CAPTControlPlane>("CAPTControlPlane", control_plane, rounds);
    compare::<TerraformWorkspace>("Workspace", workspace, rounds);
    Ok(())
}
