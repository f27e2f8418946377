//! The benchmark's CAPT stacks: the sample templates and stacks it creates, what it watches
//! of them (one watch per kind, each value stamped when it first arrives), and an output
//! change made where outputs come from (the stack's own WorkspaceTemplate).
//!
//! The templates live where the Deployment's controller trusts them with code (its template
//! namespace, `Pod::template_namespace`), shared by every round of a run, and the stacks of
//! every round name them there, as the samples do.

use anyhow::{Context, Result};
use capt_tests::fake_provider::{OUTPUTS_ANNOTATION, workspace_resource};
use capt_tests::pod::WATCH_FILTER_LABEL;
use capt_tests::repo_root;
use capt_tests::system::APPLY_NAMESPACE_LABEL;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The benchmark's own field manager, named in the audit log (not one of ours).
pub(crate) const BENCH_MANAGER: &str = "capt-bench";

/// The benchmark's own creates, named in the audit log.
pub(crate) fn bench_creates() -> PostParams {
    PostParams {
        field_manager: Some(BENCH_MANAGER.into()),
        ..Default::default()
    }
}

pub(crate) fn resource(group: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, "v1beta1", kind))
}

pub(crate) fn stack_name(i: usize) -> String {
    format!("c{i:04}")
}

/// The stacks created one at a time after the others, for the latency.
pub(crate) fn probe_name(i: usize) -> String {
    format!("p{i:04}")
}

/// The WorkspaceTemplate of its own a stack of round `ns` whose output the benchmark changes
/// uses: a copy of the sample's `eks`, named after the round too, since all rounds keep their
/// templates in the one trusted namespace.
pub(crate) fn own_template(ns: &str, stack: &str) -> String {
    format!("eks-{ns}-{stack}")
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

fn templates_in(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &resource("infrastructure.cluster.x-k8s.io", "WorkspaceTemplate"),
    )
}

/// The namespace the Deployment trusts with code, made as the install makes it: labelled when
/// created, which the controller checks at start (`capt_controller::tenancy::untrusted_namespace`).
pub(crate) async fn create_template_namespace(
    client: &kube::Client,
    templates: &str,
) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let label = capt_controller::tenancy::TRUSTED_NAMESPACE_LABEL;
    let namespace = serde_json::from_value(
        json!({"metadata": {"name": templates, "labels": {label: "true"}}}),
    )?;
    already_there_or_made(namespaces.create(&bench_creates(), &namespace).await)
        .with_context(|| format!("creating the template namespace {templates}"))
}

/// In the template namespace `templates` (created if absent): the sample templates (`vpc`,
/// `eks`; kept when an earlier round made them), and a copy of `eks` for each of `own` stacks
/// of round `ns` ([`own_template`]).
pub(crate) async fn create_templates(
    client: &kube::Client,
    templates: &str,
    ns: &str,
    own: &[String],
) -> Result<()> {
    create_template_namespace(client, templates).await?;
    let text = std::fs::read_to_string(repo_root().join("manifests/samples/templates.yaml"))?;
    let api = templates_in(client, templates);
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let mut v: Value = serde::Deserialize::deserialize(doc)?;
        // The file also holds the namespace, made above under the Deployment's name for it.
        if v["kind"] != "WorkspaceTemplate" {
            continue;
        }
        v["metadata"]["namespace"] = json!(templates);
        if v["metadata"]["name"] == "eks" {
            for stack in own {
                let mut copy = v.clone();
                let name = own_template(ns, stack);
                copy["metadata"]["name"] = json!(name);
                api.create(&bench_creates(), &serde_json::from_value(copy)?)
                    .await
                    .with_context(|| format!("creating WorkspaceTemplate {templates}/{name}"))?;
            }
        }
        let name = v["metadata"]["name"].clone();
        already_there_or_made(
            api.create(&bench_creates(), &serde_json::from_value(v)?)
                .await,
        )
        .with_context(|| format!("creating WorkspaceTemplate {templates}/{name}"))?;
    }
    Ok(())
}

/// A create answered 409 (an earlier round's, left as it is) counts as made.
fn already_there_or_made<T>(created: kube::Result<T>) -> kube::Result<()> {
    match created {
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Changes the `cluster_endpoint` output of round `ns`'s `stack`'s control plane where it
/// comes from: its own WorkspaceTemplate (in the template namespace `templates`), whose
/// outputs the controller renders into the Workspace and the provider applies (as a new
/// Terraform configuration would), as `System::set_endpoint_output` does for the sample.
pub(crate) async fn change_output(
    client: &kube::Client,
    templates: &str,
    ns: &str,
    stack: &str,
    host: &str,
) -> Result<()> {
    let outputs = json!({"cluster_endpoint": format!("https://{host}"),
        "cluster_name": "${CLUSTER_NAME}"});
    let patch = json!({"spec": {"template": {"metadata": {"annotations":
        {OUTPUTS_ANNOTATION: outputs.to_string()}}}}});
    templates_in(client, templates)
        .patch(
            &own_template(ns, stack),
            &PatchParams {
                field_manager: Some(BENCH_MANAGER.into()),
                ..Default::default()
            },
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

/// Creates one stack (its templates those of the template namespace `templates`, its control
/// plane's the WorkspaceTemplate `template`, the sample's `eks` when `None`; its objects
/// labelled for `shard`, if any); Cluster API core adopts its CAPT objects (their
/// cluster-name label names the Cluster where core does not run).
pub(crate) async fn create_stack(
    client: kube::Client,
    ns: String,
    templates: String,
    name: String,
    template: Option<String>,
    shard: Option<String>,
) -> Result<()> {
    for mut doc in stack_docs(&name)? {
        for field in ["vpcTemplateRef", "workspaceTemplateRef"] {
            if let Some(r) = doc["spec"].get_mut(field) {
                r["namespace"] = json!(templates);
            }
        }
        if let Some(shard) = &shard {
            doc["metadata"]["labels"][WATCH_FILTER_LABEL] = json!(shard);
        }
        if let Some(t) = &template
            && doc["kind"] == "CAPTControlPlane"
        {
            doc["spec"]["workspaceTemplateRef"]["name"] = json!(t);
        }
        let kind = doc["kind"].as_str().context("kind")?.to_owned();
        // The version the sample is written in (the Cluster's is v1beta2, core's storage).
        let (group, version) = doc["apiVersion"]
            .as_str()
            .and_then(|a| a.split_once('/'))
            .context("apiVersion")?;
        let gvk = GroupVersionKind::gvk(group, version, &kind);
        doc["metadata"]["namespace"] = json!(ns);
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &ns, &ApiResource::from_gvk(&gvk));
        api.create(&bench_creates(), &serde_json::from_value(doc)?)
            .await
            .with_context(|| format!("creating {kind} {ns}/{name}"))?;
    }
    Ok(())
}

/// What the benchmark sees of one kind: for each object, its values now (as the extractor
/// names them, `host:…`, `phase:…`), and when each value was first received.
#[derive(Default)]
pub(crate) struct Seen {
    now: Mutex<HashMap<String, Vec<String>>>,
    first: Mutex<HashMap<(String, String), Instant>>,
    changed: tokio::sync::Notify,
}

type Extract = fn(&DynamicObject) -> Vec<String>;

impl Seen {
    fn watch(
        api: Api<DynamicObject>,
        config: watcher::Config,
        extract: Extract,
    ) -> (Arc<Self>, tokio::task::JoinHandle<()>) {
        let me = Arc::new(Self::default());
        let watching = me.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(api, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(o) = event else { continue };
                let at = Instant::now();
                let name = o.metadata.name.clone().unwrap_or_default();
                let values = extract(&o);
                {
                    let mut first = watching.first.lock().expect("lock");
                    for v in &values {
                        first.entry((name.clone(), v.clone())).or_insert(at);
                    }
                }
                watching.now.lock().expect("lock").insert(name, values);
                watching.changed.notify_waiters();
            }
        });
        (me, task)
    }

    /// When `name` was first seen with `value`.
    pub(crate) fn first(&self, name: &str, value: &str) -> Option<Instant> {
        self.first
            .lock()
            .expect("lock")
            .get(&(name.to_owned(), value.to_owned()))
            .copied()
    }

    /// When `name` was first seen with any value starting with `prefix`.
    pub(crate) fn first_with(&self, name: &str, prefix: &str) -> Option<Instant> {
        self.first
            .lock()
            .expect("lock")
            .iter()
            .filter(|((n, v), _)| n == name && v.starts_with(prefix))
            .map(|(_, at)| *at)
            .min()
    }

    /// Waits up to `timeout` for `check` to find a time.
    pub(crate) async fn wait(
        &self,
        timeout: Duration,
        check: impl Fn(&Self) -> Option<Instant>,
    ) -> Option<Instant> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.changed.notified();
            if let Some(at) = check(self) {
                return Some(at);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return check(self);
            }
        }
    }
}

/// The three watches of a round: Clusters (`phase:…`, `host:…` of
/// `spec.controlPlaneEndpoint`), CAPTControlPlanes (`host:…`, and `ready` while
/// `status.ready` is true) and the round's Workspaces
/// (`output:…`, the `cluster_endpoint` output in `status.atProvider`, and `ready-output` once
/// the Workspace is also Ready=True).
pub(crate) struct Watches {
    pub(crate) clusters: Arc<Seen>,
    pub(crate) control_planes: Arc<Seen>,
    pub(crate) workspaces: Arc<Seen>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn endpoint_host_of(o: &DynamicObject) -> Option<String> {
    o.data["spec"]["controlPlaneEndpoint"]["host"]
        .as_str()
        .filter(|h| !h.is_empty())
        .map(|h| format!("host:{h}"))
}

impl Watches {
    pub(crate) fn start(client: &kube::Client, ns: &str) -> Self {
        // Core's storage version: a v1beta1 watch goes through core's conversion webhook,
        // and under load an event whose conversion fails is lost to the watch (at a load
        // average of 50, 127 of 200 Clusters were Provisioned and the watch had seen none).
        let cluster_api = Api::namespaced_with(
            client.clone(),
            ns,
            &ApiResource::from_gvk(&GroupVersionKind::gvk(
                "cluster.x-k8s.io",
                "v1beta2",
                "Cluster",
            )),
        );
        let cp_api = Api::namespaced_with(
            client.clone(),
            ns,
            &resource("controlplane.cluster.x-k8s.io", "CAPTControlPlane"),
        );
        let ws_api = Api::all_with(client.clone(), &workspace_resource());
        let (clusters, c) = Seen::watch(cluster_api, watcher::Config::default(), |o| {
            let mut v: Vec<String> = endpoint_host_of(o).into_iter().collect();
            if let Some(p) = o.data["status"]["phase"].as_str() {
                v.push(format!("phase:{p}"));
            }
            v
        });
        let (control_planes, p) = Seen::watch(cp_api, watcher::Config::default(), |o| {
            let mut v: Vec<String> = endpoint_host_of(o).into_iter().collect();
            // What core waits for before it copies the endpoint (`status.ready`).
            if o.data["status"]["ready"] == true {
                v.push("ready".into());
            }
            v
        });
        let (workspaces, w) = Seen::watch(
            ws_api,
            watcher::Config::default().labels(&format!("{APPLY_NAMESPACE_LABEL}={ns}")),
            |o| {
                let output = o.data["status"]["atProvider"]["outputs"]["cluster_endpoint"]
                    .as_str()
                    .map(|e| format!("output:{e}"));
                // Ready=True with the output: from here the control plane is ready (its
                // `status.ready` follows the Workspace's Ready, and core waits for it).
                let ready = o.data["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                let ready_output = (ready && output.is_some()).then(|| "ready-output".to_owned());
                output.into_iter().chain(ready_output).collect()
            },
        );
        Self {
            clusters,
            control_planes,
            workspaces,
            tasks: vec![c, p, w],
        }
    }

    /// Clusters Provisioned with an endpoint.
    pub(crate) fn provisioned(&self) -> usize {
        self.clusters
            .now
            .lock()
            .expect("lock")
            .values()
            .filter(|vs| {
                vs.iter().any(|v| v == "phase:Provisioned")
                    && vs.iter().any(|v| v.starts_with("host:"))
            })
            .count()
    }
}
