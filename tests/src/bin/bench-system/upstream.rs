//! The benchmark's baseline: upstream CAPT's (v0.3.0) write pattern, as a process of its own
//! (`bench-system --serve-upstream-baseline`), not a mode of the product.
//!
//! What it does is what upstream's controllers did, reduced to what provisioning needs:
//! - three controllers (CAPTCluster, CAPTControlPlane, WorkspaceTemplateApply), each with
//!   controller-runtime's default of one reconcile at a time, woken by every change of its
//!   own objects (its own status writes included, as controller-runtime's `For` without a
//!   predicate) and of the applies it owns, and requeued every 30 s;
//! - per reconcile a full status write of its object: `Update` (PUT) of the whole status as
//!   computed from the cached object, sent whether or not anything changed, so that a status
//!   that did not change is a no-op write (the API server stores nothing new);
//! - the Cluster fields upstream wrote, by merge patch, each reconcile: `infrastructureReady`
//!   (CAPTCluster), `controlPlaneReady`, `phase: Provisioned` once both are true and
//!   `spec.controlPlaneEndpoint` (CAPTControlPlane), in the Cluster's v1beta2 (core's storage
//!   version) where the first two are `status.initialization`'s `infrastructureProvisioned`
//!   and `controlPlaneInitialized`. Beside Cluster API core these agree with core's own
//!   values, so the baseline provisions; it never writes `null`s.
//! - no server-side apply anywhere: creates, `Update`s and merge patches, under the field
//!   managers our system uses (so that the audit log counts them alike).
//! - templates where the stacks name them: upstream kept a template in its object's namespace;
//!   here an apply names the template's namespace too (the benchmark's templates are where the
//!   Deployment trusts them), which changes what is read, not what is written.
//!
//! At one cluster at rest that is 8 writes per 30 s tick (CAPTCluster: its status and the
//! Cluster's status; CAPTControlPlane: its endpoint, its status, the Cluster's status and
//! endpoint; each of the two applies: its status): 16 a minute, every one a no-op, as
//! upstream measured. Left out, because provisioning does not need them: finalizers and
//! deletion, the kubeconfig Secret, pausing, timeouts and failures.

use anyhow::{Context as _, Result};
use capt_controller::api::{
    CAPTCluster, CAPTControlPlane, NamespacedRef, WorkspaceTemplate, WorkspaceTemplateApply,
};
use capt_controller::reconcile::{OWNER_KIND_LABEL, OWNER_NAME_LABEL, OWNER_NAMESPACE_LABEL};
use capt_controller::render::{
    APPLY_NAME_LABEL, APPLY_NAMESPACE_LABEL, CLUSTER_NAME_LABEL, render_workspace, workspace_name,
};
use futures::StreamExt;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Upstream's fixed requeue.
pub(crate) const REQUEUE: Duration = Duration::from_secs(30);
/// The flag that makes `bench-system` this process.
pub(crate) const FLAG: &str = "--serve-upstream-baseline";
/// Environment: where it serves `/healthz` (plain) and `/metrics` (HTTPS, authorized).
pub(crate) const PROBE_ENV: &str = "CAPT_HEALTH_PROBE_BIND_ADDRESS";
pub(crate) const METRICS_ENV: &str = "CAPT_METRICS_BIND_ADDRESS";

/// Errors end a reconcile; it is retried after the requeue, as upstream's were (with
/// controller-runtime's backoff, shorter at first: here a fixed 1 s).
#[derive(Debug)]
pub(crate) struct Failed(String);

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failed {}

fn failed(what: &str) -> impl Fn(kube::Error) -> Failed + '_ {
    move |e| Failed(format!("{what}: {e}"))
}

struct Ctx {
    client: kube::Client,
    applies: Store<WorkspaceTemplateApply>,
    workspaces: Store<DynamicObject>,
    capt_clusters: Store<CAPTCluster>,
    reconciles: Counter,
}

fn workspace_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "tf.upbound.io",
        "v1beta1",
        "Workspace",
    ))
}

fn cluster_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "cluster.x-k8s.io",
        "v1beta2",
        "Cluster",
    ))
}

fn params(manager: &str) -> PostParams {
    PostParams {
        field_manager: Some(manager.into()),
        ..Default::default()
    }
}

fn patch_params(manager: &str) -> PatchParams {
    PatchParams {
        field_manager: Some(manager.into()),
        ..Default::default()
    }
}

/// The Cluster an object belongs to: its `cluster.x-k8s.io/cluster-name` label.
fn cluster_of<K: Resource>(obj: &K) -> Option<String> {
    obj.meta().labels.as_ref()?.get(CLUSTER_NAME_LABEL).cloned()
}

/// `meta.SetStatusCondition`: the transition time moves only when the status does.
fn set_condition(existing: &Value, kind: &str, status: bool, reason: &str) -> Value {
    let status = if status { "True" } else { "False" };
    let old = existing
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind);
    let since = match old {
        Some(c) if c["status"] == status => c["lastTransitionTime"].clone(),
        _ => json!(jiff_now()),
    };
    json!([{"type": kind, "status": status, "reason": reason, "message": "",
            "lastTransitionTime": since}])
}

fn jiff_now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The Workspace an apply rendered, from the cache, and what upstream read of it.
struct Observed {
    ready: bool,
    state: Option<String>,
    at_provider: Value,
}

fn observe(ctx: &Ctx, apply: &WorkspaceTemplateApply) -> Option<Observed> {
    let name = workspace_name(&apply.namespace()?, &apply.name_any());
    let ws = ctx
        .workspaces
        .get(&ObjectRef::new_with(&name, workspace_resource()))?;
    let conditions = ws.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let condition = |t: &str| conditions.iter().find(|c| c["type"] == t).cloned();
    let is_true = |t: &str| condition(t).is_some_and(|c| c["status"] == "True");
    Some(Observed {
        ready: is_true("Ready") && is_true("Synced"),
        state: condition("Ready").and_then(|c| c["reason"].as_str().map(str::to_owned)),
        at_provider: ws.data["status"]["atProvider"].clone(),
    })
}

fn output(o: &Observed, key: &str) -> Option<String> {
    o.at_provider["outputs"][key].as_str().map(str::to_owned)
}

/// Creates the owner's apply if the cache has none (upstream: `CreateOrUpdate`, its spec set
/// once), with an owner reference to it (so that the apply's changes wake the owner).
async fn ensure_apply<O: Resource<DynamicType = ()>>(
    ctx: &Ctx,
    owner: &O,
    suffix: &str,
    template: &NamespacedRef,
    variables: Value,
) -> Result<Option<Arc<WorkspaceTemplateApply>>, Failed> {
    let ns = owner.namespace().unwrap_or_default();
    let name = format!("{}-{suffix}", owner.name_any());
    if let Some(apply) = ctx.applies.get(&ObjectRef::new(&name).within(&ns)) {
        return Ok(Some(apply));
    }
    let mut labels = json!({OWNER_KIND_LABEL: O::kind(&()), OWNER_NAME_LABEL: owner.name_any(),
        OWNER_NAMESPACE_LABEL: ns});
    if let Some(cluster) = cluster_of(owner) {
        labels[CLUSTER_NAME_LABEL] = json!(cluster);
    }
    let body = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": name, "namespace": ns, "labels": labels,
            "ownerReferences": [owner.controller_owner_ref(&())]},
        "spec": {"templateRef": template, "variables": variables},
    });
    let api: Api<WorkspaceTemplateApply> = Api::namespaced(ctx.client.clone(), &ns);
    let body = serde_json::from_value(body).map_err(|e| Failed(e.to_string()))?;
    match api.create(&params("capt-controller"), &body).await {
        Ok(_) => Ok(None),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
        Err(e) => Err(failed("creating the apply")(e)),
    }
}

/// Upstream's `Status().Update()`: the cached object with its status replaced, PUT whole.
async fn update_status<K>(ctx: &Ctx, obj: &K, status: Value, manager: &str) -> Result<(), Failed>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
    let mut body = serde_json::to_value(obj).map_err(|e| Failed(e.to_string()))?;
    body["status"] = status;
    let body: K = serde_json::from_value(body).map_err(|e| Failed(e.to_string()))?;
    api.replace_status(&obj.name_any(), &params(manager), &body)
        .await
        .map_err(failed("updating the status"))?;
    Ok(())
}

/// A merge patch of the owning Cluster (status or main resource), as `capt-cluster`.
async fn patch_cluster(
    ctx: &Ctx,
    ns: &str,
    cluster: &str,
    patch: Value,
    status: bool,
) -> Result<(), Failed> {
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &cluster_resource());
    let pp = patch_params("capt-cluster");
    let done = match status {
        true => api.patch_status(cluster, &pp, &Patch::Merge(&patch)).await,
        false => api.patch(cluster, &pp, &Patch::Merge(&patch)).await,
    };
    match done {
        Ok(_) => Ok(()),
        // Created after its CAPT objects, or not yet: the next requeue writes it.
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(failed("patching the Cluster")(e)),
    }
}

async fn reconcile_capt_cluster(cc: Arc<CAPTCluster>, ctx: Arc<Ctx>) -> Result<Action, Failed> {
    ctx.reconciles.inc();
    let template = cc.spec.vpc_template_ref.clone().unwrap_or_default();
    let mut variables = json!({"CLUSTER_NAME": cluster_of(&*cc).unwrap_or_else(|| cc.name_any()),
        "REGION": cc.spec.region});
    if let Some(vpc) = &cc.spec.vpc_config {
        variables["VPC_NAME"] = json!(vpc.name);
    }
    let apply = ensure_apply(&ctx, &*cc, "vpc", &template, variables).await?;
    let observed = apply.as_deref().and_then(|a| observe(&ctx, a));
    let vpc_id = observed.as_ref().and_then(|o| output(o, "vpc_id"));
    let ready = observed.as_ref().is_some_and(|o| o.ready) && vpc_id.is_some();
    let old = serde_json::to_value(&cc.status).unwrap_or_default();
    let status = json!({
        "ready": ready,
        "vpcId": vpc_id,
        "workspaceTemplateStatus": {"ready": observed.as_ref().map(|o| o.ready),
            "state": observed.as_ref().and_then(|o| o.state.clone())},
        "conditions": set_condition(&old["conditions"], "VPCReady", ready,
            if ready { "VPCReady" } else { "VPCCreating" }),
    });
    update_status(&ctx, &*cc, strip_nulls(status), "capt-captcluster").await?;
    if let Some(cluster) = cluster_of(&*cc) {
        let ns = cc.namespace().unwrap_or_default();
        patch_cluster(
            &ctx,
            &ns,
            &cluster,
            json!({"status": {"initialization": {"infrastructureProvisioned": ready}}}),
            true,
        )
        .await?;
    }
    Ok(Action::requeue(REQUEUE))
}

async fn reconcile_control_plane(
    cp: Arc<CAPTControlPlane>,
    ctx: Arc<Ctx>,
) -> Result<Action, Failed> {
    ctx.reconciles.inc();
    let ns = cp.namespace().unwrap_or_default();
    let cluster = cluster_of(&*cp);
    // Upstream waited for its VPC: the CAPTCluster of the same Cluster, read on each
    // reconcile (not watched: a VPC that becomes ready is seen at the next requeue).
    let vpc_ready = ctx.capt_clusters.state().iter().any(|cc| {
        cc.namespace().as_deref() == Some(&ns)
            && cluster_of(cc.as_ref()) == cluster
            && cc.status.as_ref().and_then(|s| s.ready) == Some(true)
    });
    let mut observed = None;
    if vpc_ready {
        let variables = json!({"CLUSTER_NAME": cluster.clone().unwrap_or_else(|| cp.name_any()),
            "KUBERNETES_VERSION": cp.spec.version});
        let template = cp.spec.workspace_template_ref.clone();
        let apply = ensure_apply(&ctx, &*cp, "controlplane", &template, variables).await?;
        observed = apply.as_deref().and_then(|a| observe(&ctx, a));
    }
    let endpoint = observed
        .as_ref()
        .and_then(|o| output(o, "cluster_endpoint"))
        .and_then(|url| parse_endpoint(&url));
    let ready = observed.as_ref().is_some_and(|o| o.ready) && endpoint.is_some();
    if let Some((host, port)) = &endpoint {
        let api: Api<CAPTControlPlane> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = json!({"spec": {"controlPlaneEndpoint": {"host": host, "port": port}}});
        api.patch(
            &cp.name_any(),
            &patch_params("capt-captcontrolplane"),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(failed("patching the endpoint"))?;
    }
    let old = serde_json::to_value(&cp.status).unwrap_or_default();
    let status = json!({
        "ready": ready,
        "initialized": ready,
        "phase": if ready { "Ready" } else { "Creating" },
        "version": cp.spec.version,
        "externalManagedControlPlane": true,
        "workspaceStatus": observed.as_ref().map(|o| json!({"ready": o.ready, "state": o.state,
            "atProvider": o.at_provider})),
        "conditions": set_condition(&old["conditions"], "Ready", ready,
            if ready { "Ready" } else { "Creating" }),
    });
    update_status(&ctx, &*cp, strip_nulls(status), "capt-captcontrolplane").await?;
    if let Some(cluster) = cluster {
        let infra = ctx.capt_clusters.state().iter().any(|cc| {
            cc.namespace().as_deref() == Some(&ns)
                && cluster_of(cc.as_ref()).as_deref() == Some(&cluster)
                && cc.status.as_ref().and_then(|s| s.ready) == Some(true)
        });
        let mut status = json!({"initialization": {"controlPlaneInitialized": ready}});
        if ready && infra {
            status["phase"] = json!("Provisioned");
        }
        patch_cluster(&ctx, &ns, &cluster, json!({"status": status}), true).await?;
        if let Some((host, port)) = &endpoint {
            let patch = json!({"spec": {"controlPlaneEndpoint": {"host": host, "port": port}}});
            patch_cluster(&ctx, &ns, &cluster, patch, false).await?;
        }
    }
    Ok(Action::requeue(REQUEUE))
}

/// `https://host[:port]` → (host, port), 443 by default.
fn parse_endpoint(url: &str) -> Option<(String, u16)> {
    let rest = url.strip_prefix("https://").unwrap_or(url);
    let rest = rest.split('/').next()?;
    match rest.rsplit_once(':') {
        Some((host, port)) => Some((host.to_owned(), port.parse().ok()?)),
        None if !rest.is_empty() => Some((rest.to_owned(), 443)),
        None => None,
    }
}

async fn reconcile_apply(
    apply: Arc<WorkspaceTemplateApply>,
    ctx: Arc<Ctx>,
) -> Result<Action, Failed> {
    ctx.reconciles.inc();
    let ns = apply.namespace().unwrap_or_default();
    let name = workspace_name(&ns, &apply.name_any());
    let template_ns = apply.spec.template_ref.namespace.as_deref().unwrap_or(&ns);
    let templates: Api<WorkspaceTemplate> = Api::namespaced(ctx.client.clone(), template_ns);
    // Upstream read its template from the manager's cache; here from the API server (the
    // baseline does not watch templates).
    let template = templates
        .get(&apply.spec.template_ref.name)
        .await
        .map_err(failed("reading the template"))?;
    let rendered = render_workspace(&apply, &template, &name).map_err(|e| Failed(e.to_string()))?;
    let workspaces: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &workspace_resource());
    match ctx
        .workspaces
        .get(&ObjectRef::new_with(&name, workspace_resource()))
    {
        None => {
            let body = serde_json::from_value(rendered).map_err(|e| Failed(e.to_string()))?;
            match workspaces.create(&params("capt-controller"), &body).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(failed("creating the Workspace")(e)),
            }
        }
        // A template that changed: the Workspace follows (upstream's CreateOrUpdate).
        // Only what the template renders is compared: the provider adds annotations of its
        // own, and upstream compared before it updated.
        Some(live)
            if live.data["spec"] != rendered["spec"]
                || rendered["metadata"]["annotations"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .any(|(k, v)| {
                        live.metadata.annotations.as_ref().and_then(|a| a.get(k))
                            != v.as_str().map(str::to_owned).as_ref()
                    }) =>
        {
            let patch = json!({"metadata": {"annotations": rendered["metadata"]["annotations"]},
                "spec": rendered["spec"]});
            workspaces
                .patch(
                    &name,
                    &patch_params("capt-controller"),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(failed("updating the Workspace"))?;
        }
        Some(_) => {}
    }
    let observed = observe(&ctx, &apply);
    let old = serde_json::to_value(&apply.status).unwrap_or_default();
    let applied_at = match &old["lastAppliedTime"] {
        Value::Null => json!(jiff_now()),
        t => t.clone(),
    };
    let ready = observed.as_ref().is_some_and(|o| o.ready);
    let status = json!({
        "workspaceName": name,
        "applied": true,
        "lastAppliedTime": applied_at,
        "conditions": set_condition(&old["conditions"], "Ready", ready,
            observed.as_ref().and_then(|o| o.state.clone()).as_deref().unwrap_or("Creating")),
    });
    update_status(&ctx, &*apply, status, "capt-workspacetemplateapply").await?;
    Ok(Action::requeue(REQUEUE))
}

fn strip_nulls(mut v: Value) -> Value {
    if let Value::Object(map) = &mut v {
        map.retain(|_, x| !x.is_null());
        for x in map.values_mut() {
            *x = strip_nulls(x.take());
        }
    }
    v
}

fn error_policy<K>(_: Arc<K>, e: &Failed, _: Arc<Ctx>) -> Action {
    tracing::debug!(error = %e, "Reconcile failed");
    Action::requeue(Duration::from_secs(1))
}

/// The WorkspaceTemplateApply a Workspace was rendered from (its labels).
fn apply_of(ws: DynamicObject) -> Option<ObjectRef<WorkspaceTemplateApply>> {
    let labels = ws.metadata.labels.as_ref()?;
    Some(ObjectRef::new(labels.get(APPLY_NAME_LABEL)?).within(labels.get(APPLY_NAMESPACE_LABEL)?))
}

/// Runs the baseline until killed.
pub(crate) async fn serve() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let client = kube::Client::try_default().await?;
    let addr = |key: &str| -> Result<SocketAddr> {
        std::env::var(key)
            .with_context(|| key.to_owned())?
            .parse()
            .with_context(|| key.to_owned())
    };
    let reconciles = Counter::default();
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register("capt_reconciles", "Reconciles", reconciles.clone());
    let registry = Arc::new(registry);
    let probes = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
    diagnostics::serve_probes(addr(PROBE_ENV)?, probes).await?;
    let metrics = axum::routing::get(move || {
        let registry = registry.clone();
        async move { diagnostics::metrics_text(&registry) }
    });
    let options = diagnostics::MetricsOptions {
        bind_address: addr(METRICS_ENV)?,
        cert_dir: None,
        insecure: false,
    };
    diagnostics::serve_metrics(&options, client.clone(), metrics).await?;

    let wc = watcher::Config::default;
    let applies_api: Api<WorkspaceTemplateApply> = Api::all(client.clone());
    let ws_api: Api<DynamicObject> = Api::all_with(client.clone(), &workspace_resource());
    let cc_api: Api<CAPTCluster> = Api::all(client.clone());
    let cp_api: Api<CAPTControlPlane> = Api::all(client.clone());
    // controller-runtime's default: one reconcile at a time per controller.
    let one = || Config::default().concurrency(1);

    let apply_controller = Controller::new(applies_api.clone(), wc())
        .with_config(one())
        .watches_with(ws_api, workspace_resource(), wc(), apply_of);
    let cc_controller = Controller::new(cc_api, wc())
        .with_config(one())
        .owns(applies_api.clone(), wc());
    let cp_controller = Controller::new(cp_api, wc())
        .with_config(one())
        .owns(applies_api, wc());
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        applies: apply_controller.store(),
        // The Workspace cache: the apply controller's secondary watch keeps none, so one of
        // its own (upstream's manager cached every kind it read).
        workspaces: spawn_store(Api::all_with(client.clone(), &workspace_resource())),
        capt_clusters: cc_controller.store(),
        reconciles,
    });
    eprintln!("Leading (the baseline runs one replica, without leader election)");
    let a = apply_controller
        .run(reconcile_apply, error_policy, ctx.clone())
        .for_each(|_| std::future::ready(()));
    let c = cc_controller
        .run(reconcile_capt_cluster, error_policy, ctx.clone())
        .for_each(|_| std::future::ready(()));
    let p = cp_controller
        .run(reconcile_control_plane, error_policy, ctx.clone())
        .for_each(|_| std::future::ready(()));
    futures::join!(a, c, p);
    Ok(())
}

/// A reflector of `api`, running in a task of its own.
fn spawn_store(api: Api<DynamicObject>) -> Store<DynamicObject> {
    use kube::runtime::WatchStreamExt;
    let writer = kube::runtime::reflector::store::Writer::new(workspace_resource());
    let reader = writer.as_reader();
    let stream = kube::runtime::reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff();
    tokio::spawn(stream.for_each(|_| std::future::ready(())));
    reader
}
