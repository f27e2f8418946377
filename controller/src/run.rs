//! Wiring: the four controllers, what wakes each of them, and the HTTP endpoints.
//!
//! Primary objects wake their own reconciler only when their generation, finalizers,
//! labels or deletion change ([`crate::reconcile::lifecycle`]): status writes, ours included,
//! do not, so a status apply never loops back into the reconcile that caused it.

use crate::api::{
    CAPTCluster, CAPTControlPlane, Cluster, TerraformWorkspace, WorkspaceTemplate,
    WorkspaceTemplateApply,
};
use crate::context::Context;
use crate::reconcile::shared::cluster_name;
use crate::reconcile::{
    OWNER_KIND_LABEL, OWNER_NAME_LABEL, OWNER_NAMESPACE_LABEL, apply, capt_cluster, cluster,
    control_plane, error_policy, lifecycle,
};
use crate::render::{APPLY_NAME_LABEL, APPLY_NAMESPACE_LABEL};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use std::sync::Arc;

/// Which objects the controllers manage.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    /// One namespace, or every namespace when `None`. Workspaces are cluster-scoped: with a
    /// namespace, only those rendered from applies of that namespace are watched.
    pub namespace: Option<String>,
    /// Wake reconcilers on every change of their own objects, status included: the benchmark
    /// baseline, as upstream CAPT did. Our own status writes then wake us again.
    pub wake_on_every_change: bool,
}

impl Scope {
    fn api<K>(&self, client: &kube::Client) -> Api<K>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }

    fn workspaces(&self) -> watcher::Config {
        match &self.namespace {
            Some(ns) => watcher::Config::default().labels(&format!("{APPLY_NAMESPACE_LABEL}={ns}")),
            None => watcher::Config::default(),
        }
    }
}

/// Runs every controller until a shutdown signal.
pub async fn run(ctx: Arc<Context>, scope: Scope) {
    let client = ctx.client.clone();
    let (applies, apply_controller) = controller::<WorkspaceTemplateApply>(&scope, &client);
    let (control_planes, cp_controller) = controller::<CAPTControlPlane>(&scope, &client);
    let (capt_clusters, cc_controller) = controller::<CAPTCluster>(&scope, &client);
    let (_, cluster_controller) = controller::<Cluster>(&scope, &client);
    let wc = watcher::Config::default();
    let workspaces = || Api::<TerraformWorkspace>::all(client.clone());
    let ws_config = scope.workspaces();

    let applies_of_cluster = applies.clone();
    let apply_loop = apply_controller
        .watches(workspaces(), ws_config.clone(), |ws| {
            labelled_ref(&ws, APPLY_NAMESPACE_LABEL, APPLY_NAME_LABEL)
        })
        // Pausing and unpausing a Cluster holds and releases its applies.
        .watches(scope.api::<Cluster>(&client), wc.clone(), move |c| {
            of_cluster(&applies_of_cluster, &c)
        })
        .watches(
            scope.api::<WorkspaceTemplate>(&client),
            wc.clone(),
            move |t| users_of(&applies, &t),
        )
        .shutdown_on_signal()
        .run(apply::reconcile, error_policy, ctx.clone())
        .for_each(|_| std::future::ready(()));

    let cp_loop = owner_watches::<CAPTControlPlane, CAPTCluster>(
        cp_controller,
        control_planes,
        &scope,
        &client,
        |c| &c.spec.control_plane_ref,
    )
    .shutdown_on_signal()
    .run(control_plane::reconcile, error_policy, ctx.clone())
    .for_each(|_| std::future::ready(()));

    let cc_loop = owner_watches::<CAPTCluster, CAPTControlPlane>(
        cc_controller,
        capt_clusters,
        &scope,
        &client,
        |c| &c.spec.infrastructure_ref,
    )
    .shutdown_on_signal()
    .run(capt_cluster::reconcile, error_policy, ctx.clone())
    .for_each(|_| std::future::ready(()));

    let cluster_loop = cluster_controller
        .watches(scope.api::<CAPTCluster>(&client), wc.clone(), |o| {
            owning_cluster_ref(&o)
        })
        .watches(scope.api::<CAPTControlPlane>(&client), wc.clone(), |o| {
            owning_cluster_ref(&o)
        })
        .shutdown_on_signal()
        .run(cluster::reconcile, error_policy, ctx.clone())
        .for_each(|_| std::future::ready(()));

    tracing::info!("Controllers started");
    futures::join!(apply_loop, cp_loop, cc_loop, cluster_loop);
}

/// A namespaced kind the controllers watch and cache.
trait Watched:
    Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// What wakes the owner `O` of an apply (a CAPTCluster or a CAPTControlPlane): its applies
/// and their Workspaces (by their owner labels), the other CAPT kind `P` of the same Cluster
/// (the VPC's readiness, the control plane's presence during deletion), and the Cluster that
/// references it through `reference` (pausing, adoption, the endpoint).
fn owner_watches<O, P>(
    controller: Controller<O>,
    owners: Store<O>,
    scope: &Scope,
    client: &kube::Client,
    reference: fn(&Cluster) -> &Option<k8s_openapi::api::core::v1::ObjectReference>,
) -> Controller<O>
where
    O: Watched,
    P: Watched,
{
    let wc = watcher::Config::default();
    controller
        .watches(
            scope.api::<WorkspaceTemplateApply>(client),
            wc.clone(),
            |a| owner_of::<O, _>(&a),
        )
        .watches(
            Api::<TerraformWorkspace>::all(client.clone()),
            scope.workspaces(),
            |ws| owner_of::<O, _>(&ws),
        )
        .watches(scope.api::<P>(client), wc.clone(), move |peer| {
            same_cluster(&owners, &peer)
        })
        .watches(scope.api::<Cluster>(client), wc, move |c| {
            referenced(&c, reference(&c))
        })
}

/// A controller of `K` woken by lifecycle changes only (unless the scope says every change),
/// and the store of its objects.
fn controller<K>(scope: &Scope, client: &kube::Client) -> (Store<K>, Controller<K>)
where
    K: Watched,
{
    let (reader, writer) = reflector::store();
    let every_change = scope.wake_on_every_change;
    let wakes = move |obj: &K| {
        if every_change {
            kube::runtime::predicates::resource_version(obj)
        } else {
            lifecycle(obj)
        }
    };
    // The reconcilers read managedFields from fresh GETs only: the cache need not hold them
    // (they are most of an object's size, and 1,000 clusters make thousands of objects).
    let stream = watcher(scope.api(client), watcher::Config::default())
        .default_backoff()
        .modify(|obj: &mut K| obj.meta_mut().managed_fields = None)
        .reflect(writer)
        .applied_objects()
        .predicate_filter(wakes, Default::default());
    (reader.clone(), Controller::for_stream(stream, reader))
}

/// The object named by two labels (namespace, name) of `obj`.
fn labelled_ref<K: Resource<DynamicType = ()>>(
    obj: &impl Resource,
    ns_label: &str,
    name_label: &str,
) -> Option<ObjectRef<K>> {
    let labels = obj.meta().labels.as_ref()?;
    Some(ObjectRef::new(labels.get(name_label)?).within(labels.get(ns_label)?))
}

/// The CAPT object of kind `K` an apply or a Workspace serves (from its owner labels).
fn owner_of<K: Resource<DynamicType = ()>, O: Resource>(obj: &O) -> Option<ObjectRef<K>> {
    (obj.meta().labels.as_ref()?.get(OWNER_KIND_LABEL)? == &*K::kind(&())).then_some(())?;
    labelled_ref(obj, OWNER_NAMESPACE_LABEL, OWNER_NAME_LABEL)
}

/// The applies that use a WorkspaceTemplate.
fn users_of(
    applies: &Store<WorkspaceTemplateApply>,
    template: &WorkspaceTemplate,
) -> Vec<ObjectRef<WorkspaceTemplateApply>> {
    let ns = template.namespace();
    applies
        .state()
        .iter()
        .filter(|a| a.spec.template_ref.name == template.name_any())
        .filter(|a| a.spec.template_ref.namespace.clone().or(a.namespace()) == ns)
        .map(|a| ObjectRef::from_obj(a.as_ref()))
        .collect()
}

/// The objects in `store` that belong to the same Cluster as `obj`.
fn same_cluster<K, O>(store: &Store<K>, obj: &O) -> Vec<ObjectRef<K>>
where
    K: Resource<DynamicType = ()> + Clone,
    O: Resource,
{
    let Some(cluster) = cluster_name(obj) else {
        return vec![];
    };
    store
        .state()
        .iter()
        .filter(|o| {
            o.namespace() == obj.meta().namespace
                && cluster_name(o.as_ref()).as_deref() == Some(&cluster)
        })
        .map(|o| ObjectRef::from_obj(o.as_ref()))
        .collect()
}

/// The objects in `store` that belong to `cluster` (by owner reference or label).
fn of_cluster<K>(store: &Store<K>, cluster: &Cluster) -> Vec<ObjectRef<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    store
        .state()
        .iter()
        .filter(|o| {
            o.namespace() == cluster.namespace()
                && cluster_name(o.as_ref()).as_deref() == Some(&cluster.name_any())
        })
        .map(|o| ObjectRef::from_obj(o.as_ref()))
        .collect()
}

/// The object a Cluster references, if it is of kind `K`.
fn referenced<K: Resource<DynamicType = ()>>(
    cluster: &Cluster,
    reference: &Option<k8s_openapi::api::core::v1::ObjectReference>,
) -> Option<ObjectRef<K>> {
    let r = reference.as_ref()?;
    (r.kind.as_deref()? == &*K::kind(&())).then_some(())?;
    Some(ObjectRef::new(r.name.as_deref()?).within(&cluster.namespace()?))
}

/// The Cluster an object belongs to.
fn owning_cluster_ref<O: Resource>(obj: &O) -> Option<ObjectRef<Cluster>> {
    Some(ObjectRef::new(&cluster_name(obj)?).within(obj.meta().namespace.as_deref()?))
}
