//! The benchmark's CAPT stacks: the sample templates and stacks it creates, the Clusters it
//! watches (phase, endpoint), and an output change made as provider-terraform would.

use anyhow::{Context, Result, bail};
use capt_tests::fake_provider;
use capt_tests::repo_root;
use futures::StreamExt;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The benchmark's own creates, named in the audit log.
fn bench_creates() -> PostParams {
    PostParams {
        field_manager: Some("capt-bench".into()),
        ..Default::default()
    }
}

pub(crate) fn resource(group: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, "v1beta1", kind))
}

pub(crate) fn stack_name(i: usize) -> String {
    format!("c{i:04}")
}

/// The Cluster endpoint each output change should produce.
pub(crate) fn endpoint_host(stack: &str, change: usize) -> String {
    format!("{stack}-r{change}.bench.example.com")
}

/// The sample stack (`manifests/samples/cluster.yaml`) renamed to `name`.
fn stack_docs(name: &str) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(repo_root().join("manifests/samples/cluster.yaml"))?;
    let text = text.replace("demo", name);
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Ok(serde::Deserialize::deserialize(doc)?))
        .collect()
}

pub(crate) async fn create_templates(client: &kube::Client, ns: &str) -> Result<()> {
    let text = std::fs::read_to_string(repo_root().join("manifests/samples/templates.yaml"))?;
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &resource("infrastructure.cluster.x-k8s.io", "WorkspaceTemplate"),
    );
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let mut v: Value = serde::Deserialize::deserialize(doc)?;
        v["metadata"]["namespace"] = json!(ns);
        api.create(&bench_creates(), &serde_json::from_value(v)?)
            .await?;
    }
    Ok(())
}

/// Creates one stack; Cluster API core adopts its CAPT objects (their cluster-name label
/// names the Cluster where core does not run).
pub(crate) async fn create_stack(client: kube::Client, ns: String, name: String) -> Result<()> {
    for mut doc in stack_docs(&name)? {
        let kind = doc["kind"].as_str().context("kind")?.to_owned();
        let group = doc["apiVersion"]
            .as_str()
            .and_then(|a| a.split_once('/'))
            .context("apiVersion")?
            .0
            .to_owned();
        doc["metadata"]["namespace"] = json!(ns);
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &ns, &resource(&group, &kind));
        api.create(&bench_creates(), &serde_json::from_value(doc)?)
            .await
            .with_context(|| format!("creating {kind} {ns}/{name}"))?;
    }
    Ok(())
}

/// What the benchmark sees of each Cluster: phase and endpoint host, and when it saw them.
#[derive(Default)]
pub(crate) struct Clusters {
    seen: Mutex<HashMap<String, (String, String, Instant)>>,
    changed: tokio::sync::Notify,
}

impl Clusters {
    pub(crate) fn watch(client: kube::Client, ns: &str) -> Arc<Self> {
        let me = Arc::new(Self::default());
        let api: Api<DynamicObject> =
            Api::namespaced_with(client, ns, &resource("cluster.x-k8s.io", "Cluster"));
        let watching = me.clone();
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(Ok(c)) = events.next().await {
                let phase = c.data["status"]["phase"].as_str().unwrap_or("").to_owned();
                let host = c.data["spec"]["controlPlaneEndpoint"]["host"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned();
                let name = c.metadata.name.clone().unwrap_or_default();
                watching
                    .seen
                    .lock()
                    .expect("lock")
                    .insert(name, (phase, host, Instant::now()));
                watching.changed.notify_waiters();
            }
        });
        me
    }

    pub(crate) fn provisioned(&self) -> usize {
        self.seen
            .lock()
            .expect("lock")
            .values()
            .filter(|(phase, host, _)| phase == "Provisioned" && !host.is_empty())
            .count()
    }

    /// When the Cluster `name` was first seen with endpoint `host`, waiting up to `timeout`.
    pub(crate) async fn endpoint_seen(
        &self,
        name: &str,
        host: &str,
        timeout: Duration,
    ) -> Option<Instant> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.changed.notified();
            if let Some((_, h, at)) = self.seen.lock().expect("lock").get(name)
                && h == host
            {
                return Some(*at);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return None;
            }
        }
    }
}

/// Plays provider-terraform for one Workspace: its outputs now say `host`.
pub(crate) async fn change_output(
    workspaces: &Api<DynamicObject>,
    name: &str,
    host: &str,
) -> Result<()> {
    let ws = workspaces.get_status(name).await?;
    let mut status = ws.data["status"].clone();
    if !status["atProvider"].is_object() {
        bail!("Workspace {name} has no atProvider yet");
    }
    status["atProvider"]["outputs"]["cluster_endpoint"] = json!(format!("https://{host}"));
    status["atProvider"]["checksum"] = json!(format!("bench-{host}"));
    let body = json!({"apiVersion": fake_provider::API_VERSION, "kind": fake_provider::KIND,
        "metadata": {"name": name}, "status": status});
    workspaces
        .patch_status(
            name,
            &PatchParams::apply(fake_provider::FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
    Ok(())
}
