//! No request between a reconcile's snapshot and its plan: observing reads the watch caches
//! only, and deciding is pure (a live read is a step the plan asks for), so what a reconcile costs the API server is what its plan
//! says, carried out by the executor. Each reconcile that has the observe → decide → act
//! shape is run here up to its plan, with a client that counts every request it is asked
//! to send (and answers none): the count stays 0. The executor's first write then shows the
//! count counts.

use capt_controller::api::{CAPTCluster, CAPTControlPlane, Cluster, WorkspaceTemplateApply};
use capt_controller::context::{Context, Settings, recorder};
use capt_controller::metrics::Metrics;
use capt_controller::publish::Publisher;
use capt_controller::reconcile::plan::{Next, Object, Plan, Progress, Step};
use capt_controller::reconcile::{
    act, apply, capt_cluster, cluster, control_plane, deletion, observe,
};
use capt_controller::rewake::Rewake;
use capt_controller::watches::Caches;
use capt_controller::write_loops::{Limit, WriteLoops};
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A client that counts the requests it is given and answers each with 503.
fn counting_client(count: Arc<AtomicUsize>) -> kube::Client {
    let service = tower::service_fn(move |_: http::Request<kube::client::Body>| {
        count.fetch_add(1, Ordering::SeqCst);
        async {
            let refused = http::Response::builder()
                .status(503)
                .body(kube::client::Body::empty())
                .expect("a response");
            Ok::<_, std::convert::Infallible>(refused)
        }
    });
    kube::Client::new(service, "default")
}

fn object<K: DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("an object of its kind")
}

fn cache<K>(objects: Vec<K>) -> reflector::Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let mut writer = Writer::<K>::default();
    for o in objects {
        writer.apply_watcher_event(&watcher::Event::Apply(o));
    }
    writer.as_reader()
}

fn the_cluster() -> Cluster {
    object(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "demo", "namespace": "default", "uid": "uid-cluster"},
        "spec": {
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "CAPTCluster", "name": "demo"},
            "controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io",
                "kind": "CAPTControlPlane", "name": "demo"},
        },
    }))
}

fn capt_cluster(deleting: bool) -> CAPTCluster {
    let mut value = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
        "metadata": {"name": "demo", "namespace": "default", "uid": "uid-cc",
            "labels": {"cluster.x-k8s.io/cluster-name": "demo"},
            "finalizers": [capt_controller::api::CAPT_CLUSTER_FINALIZER]},
        "spec": {"region": "r", "vpcTemplateRef": {"name": "vpc"},
            "workspaceTemplateApplyName": "demo-vpc"},
        "status": {"ready": true},
    });
    if deleting {
        value["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
    }
    object(value)
}

fn control_plane() -> CAPTControlPlane {
    object(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "demo", "namespace": "default", "uid": "uid-cp"},
        "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "t"}},
        "status": {"initialization": {"controlPlaneInitialized": true}},
    }))
}

fn vpc_apply() -> WorkspaceTemplateApply {
    object(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "demo-vpc", "namespace": "default", "uid": "uid-apply",
            "labels": {
                "infrastructure.cluster.x-k8s.io/owner-kind": "CAPTCluster",
                "infrastructure.cluster.x-k8s.io/owner-name": "demo",
                "infrastructure.cluster.x-k8s.io/owner-namespace": "default",
            }},
        "spec": {"templateRef": {"name": "vpc"}},
    }))
}

/// A context whose client counts, with `capt_clusters` (and the Cluster, its control plane
/// and the VPC apply) in its caches.
fn context(count: Arc<AtomicUsize>, capt_clusters: Vec<CAPTCluster>) -> Context {
    let client = counting_client(count);
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    Context {
        caches: Caches {
            clusters: cache(vec![the_cluster()]),
            capt_clusters: cache(capt_clusters),
            control_planes: cache(vec![control_plane()]),
            applies: cache(vec![vpc_apply()]),
            templates: cache(vec![]),
            workspaces: cache(vec![]),
        },
        rewake: Rewake::new(Default::default()),
        publisher: Publisher::new(status_applier_api::Client::new("/nonexistent/applier.sock")),
        events: recorder(client.clone()),
        client,
        metrics,
        settings: Settings::default(),
        seen_secrets: Default::default(),
        write_loops: std::sync::Mutex::new(WriteLoops::new(Limit {
            writes: 6,
            window: Duration::from_secs(60),
        })),
    }
}

#[tokio::test]
async fn the_cluster_is_planned_from_its_caches_with_no_request() {
    let count = Arc::new(AtomicUsize::new(0));
    let ctx = context(count.clone(), vec![capt_cluster(false)]);
    let snapshot = cluster::observe(&ctx, Arc::new(the_cluster()));
    let plan = cluster::decide(&snapshot);
    assert!(snapshot.infrastructure.is_some() && snapshot.control_plane.is_some());
    assert!(
        !plan.steps.is_empty(),
        "the Cluster's status is planned: {plan:?}"
    );
    assert_eq!(count.load(Ordering::SeqCst), 0, "requests before the plan");
}

#[tokio::test]
async fn a_capt_cluster_is_planned_from_its_caches_with_no_request() {
    let count = Arc::new(AtomicUsize::new(0));
    let mut new = capt_cluster(false);
    new.metadata.finalizers = None;
    let ctx = context(count.clone(), vec![new.clone()]);
    let snapshot = capt_cluster::observe(&ctx, Arc::new(new));
    let plan = capt_cluster::decide(&snapshot, &Progress::default(), jiff::Timestamp::now());
    assert!(snapshot.named_cluster.is_some() && snapshot.apply.is_some());
    assert_eq!(
        plan.next,
        Next::Redecide,
        "its finalizer is written first: {plan:?}"
    );
    assert_eq!(count.load(Ordering::SeqCst), 0, "requests before the plan");
}

#[tokio::test]
async fn a_control_plane_is_planned_from_its_caches_with_no_request() {
    let count = Arc::new(AtomicUsize::new(0));
    let mut ctx = context(count.clone(), vec![capt_cluster(false)]);
    let mut cp = control_plane();
    cp.metadata.labels = Some([("cluster.x-k8s.io/cluster-name".into(), "demo".into())].into());
    let snapshot = control_plane::observe(&ctx, Arc::new(cp.clone()));
    let plan = control_plane::decide(&snapshot, &Progress::default(), jiff::Timestamp::now());
    assert!(snapshot.as_owner.named_cluster.is_some() && snapshot.infrastructure.is_some());
    assert_eq!(
        plan.next,
        Next::Redecide,
        "its finalizer is written first: {plan:?}"
    );
    // Its deletion, where core does not run, needs the Cluster's managedFields, which no
    // cache holds: a read the plan asks for, not one made before it.
    ctx.settings.without_core = true;
    cp.metadata.finalizers = Some(vec![
        capt_controller::api::CAPT_CONTROL_PLANE_FINALIZER.into(),
    ]);
    cp.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        jiff::Timestamp::now(),
    ));
    let snapshot = control_plane::observe(&ctx, Arc::new(cp));
    let plan = control_plane::decide(&snapshot, &Progress::default(), jiff::Timestamp::now());
    let reads = plan
        .steps
        .iter()
        .any(|s| matches!(s, Step::Read { doing, .. } if *doing == control_plane::READING_CLUSTER));
    assert!(reads, "the Cluster's read is planned: {plan:?}");
    assert_eq!(count.load(Ordering::SeqCst), 0, "requests before the plan");
}

#[tokio::test]
async fn an_apply_is_planned_from_its_caches_with_no_request() {
    let count = Arc::new(AtomicUsize::new(0));
    let mut ctx = context(count.clone(), vec![capt_cluster(false)]);
    // Its template's namespace trusted: nothing refuses it before its waits.
    ctx.settings.allowed_template_namespaces = std::sync::Arc::new(["default".into()].into());
    let mut waiting = vpc_apply();
    waiting.metadata.finalizers = Some(vec![
        capt_controller::reconcile::apply::APPLY_FINALIZER.into(),
    ]);
    waiting.spec.wait_for_secrets = Some(vec![
        serde_json::from_value(json!({"name": "credentials", "namespace": "default"}))
            .expect("a Secret reference"),
    ]);
    let snapshot = apply::observe(&ctx, Arc::new(waiting));
    let plan =
        apply::decide(&snapshot, &Progress::default(), jiff::Timestamp::now()).expect("decided");
    // The Secrets it waits for are not watched: their check is a step of the plan, made by
    // the executor, not a read made before it.
    let checks = plan.steps.iter().any(
        |s| matches!(s, Step::CheckSecrets { doing, .. } if *doing == apply::CHECKING_SECRETS),
    );
    assert!(checks, "the Secrets' check is planned: {plan:?}");
    assert_eq!(count.load(Ordering::SeqCst), 0, "requests before the plan");
}

#[tokio::test]
async fn a_deletion_is_planned_from_its_caches_with_no_request() {
    let count = Arc::new(AtomicUsize::new(0));
    let cc = capt_cluster(true);
    let ctx = context(count.clone(), vec![cc.clone()]);
    let seen = observe::as_owner(&ctx, Arc::new(cc.clone()), |_| None);
    let (d, facts) = seen.deletion.expect("its deletion observed");
    let plan = deletion::decide(&cc, &facts, d);
    let deletes = plan.steps.iter().any(|s| matches!(s, Step::Delete { .. }));
    assert!(deletes, "the VPC apply's deletion is planned: {plan:?}");
    assert_eq!(count.load(Ordering::SeqCst), 0, "requests before the plan");

    // The count counts: the executor's delete is a request.
    let delete = Plan::nothing().then(Step::Delete {
        object: Object::of(&vpc_apply()),
        doing: "deleting its WorkspaceTemplateApply",
    });
    let carried = act::carry_out(&ctx, "CAPTCluster/default/demo", delete).await;
    assert!(carried.is_err(), "the counting client answers 503");
    assert!(count.load(Ordering::SeqCst) >= 1, "the delete was counted");
}
