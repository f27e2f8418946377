//! Wiring: the four controllers and what wakes each of them, over one shared watch per kind
//! ([`crate::watches`]).
//!
//! Primary objects wake their own reconciler only when their generation, finalizers,
//! labels or deletion change ([`crate::reconcile::lifecycle`]): status writes, ours included,
//! do not, so a status apply never loops back into the reconcile that caused it.

use crate::api::{
    CAPTCluster, CAPTControlPlane, Cluster, ContractVersionedObjectReference, TerraformWorkspace,
    WorkspaceTemplate, WorkspaceTemplateApply,
};
use crate::context::Context;
use crate::fair_share::FairQueue;
use crate::metrics::{KindLabel, LONG_RECONCILE};
use crate::reconcile::claims::{cluster_name, cluster_name_in};
use crate::reconcile::{
    OWNER_KIND_LABEL, OWNER_NAME_LABEL, OWNER_NAMESPACE_LABEL, apply, capt_cluster, cluster,
    control_plane, error_policy, lifecycle,
};
use crate::render::{APPLY_NAME_LABEL, APPLY_NAMESPACE_LABEL, WATCH_FILTER_LABEL};
use crate::sweep::Sweep;
use crate::trigger::Trigger;
use crate::unreadable::Decoded;
use crate::watches::{Caches, Reporting, Watch, Watched, named, reference};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, watcher};
use kube::{Resource, ResourceExt};
use leadership::Lead;
use std::sync::Arc;

/// What this process's controllers are assigned: which objects they manage, and how many
/// reconciles each runs at once.
#[derive(Clone, Debug, Default)]
pub struct Assignment {
    /// One namespace, or every namespace when `None`. Workspaces are cluster-scoped and all
    /// of them are watched either way: whether a name is taken by another's Workspace must be
    /// answered from the cache, and another's carries no label of ours to select it by.
    pub namespace: Option<String>,
    /// Manage only the objects labelled `cluster.x-k8s.io/watch-filter=<this>`, as Cluster
    /// API providers shard (`--watch-filter`): the Clusters, CAPT objects and applies of the
    /// shard are watched by that label; Workspaces and WorkspaceTemplates are not (a
    /// template is shared, and a Workspace name taken by another shard must still be seen).
    /// The applies we create carry the label of their owner.
    pub watch_filter: Option<String>,
    /// Reconciles each controller runs at once. Each holds its intents in flight at the
    /// status-applier until they are applied: unbounded, 1,000 stacks created at once were
    /// thousands of reconciles in flight, and both processes' memory followed.
    pub concurrency: u16,
}

impl Assignment {
    fn api<K>(&self, client: &kube::Client) -> Api<Decoded<K>>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        match &self.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
}

/// The watches of every kind the controllers read, one per kind, not started: their caches
/// go into the reconcilers' context first ([`Watches::caches`]), then [`run`] wires and
/// starts them.
pub struct Watches {
    clusters: Watch<Cluster>,
    capt_clusters: Watch<CAPTCluster>,
    control_planes: Watch<CAPTControlPlane>,
    applies: Watch<WorkspaceTemplateApply>,
    templates: Watch<WorkspaceTemplate>,
    workspaces: Watch<TerraformWorkspace>,
    reporting: Reporting,
}

impl Watches {
    /// The watches of `assignment`, reporting to `reporting`. WorkspaceTemplates are watched
    /// in the namespaces trusted with code (`--allow-template-namespace`) alone, one watch
    /// each: only their templates are ever rendered, and a template of any other namespace
    /// is never listed, so that it costs the controller nothing (none trusted: none watched).
    pub fn new(
        client: &kube::Client,
        assignment: &Assignment,
        template_namespaces: &std::collections::BTreeSet<String>,
        reporting: Reporting,
    ) -> Self {
        // Lists in pages of 50, not kube-rs's 500: a page is parsed whole, managedFields and
        // all, before the cache strips it, and six kinds list at once after a restart, which
        // is where the peak at 1,000 clusters was (docs/performance-history.md, "Memory").
        let wc = || watcher::Config::default().page_size(50);
        let shard = || match &assignment.watch_filter {
            Some(value) => wc().labels(&format!("{WATCH_FILTER_LABEL}={value}")),
            None => wc(),
        };
        Self {
            clusters: Watch::new(assignment.api(client), shard()),
            capt_clusters: Watch::new(assignment.api(client), shard()),
            control_planes: Watch::new(assignment.api(client), shard()),
            applies: Watch::new(assignment.api(client), shard()),
            templates: Watch::in_namespaces(client, template_namespaces.iter().cloned(), wc()),
            workspaces: Watch::new(Api::all(client.clone()), wc()),
            reporting,
        }
    }

    /// Starts every watch.
    fn spawn(self) {
        let r = &self.reporting;
        self.clusters.spawn(r);
        self.capt_clusters.spawn(r);
        self.control_planes.spawn(r);
        self.applies.spawn(r);
        self.templates.spawn(r);
        self.workspaces.spawn(r);
    }

    /// Their caches.
    pub fn caches(&self) -> Caches {
        Caches {
            clusters: self.clusters.store(),
            capt_clusters: self.capt_clusters.store(),
            control_planes: self.control_planes.store(),
            applies: self.applies.store(),
            templates: self.templates.store(),
            workspaces: self.workspaces.store(),
        }
    }
}

/// Runs every controller until a shutdown signal: wires what wakes each, starts the watches,
/// and reconciles once every cache has listed its kind, while this replica leads (`lead`).
/// A replica that does not lead runs its watches all the same: its caches stay warm, and it
/// takes over without listing anything.
pub async fn run(ctx: Arc<Context>, assignment: Assignment, mut w: Watches, lead: Lead) {
    let t = Triggers::default();
    wire_wakes(&t, &mut w);
    forget_on_deletion(&ctx, &mut w);
    let caches = w.caches();
    // Nothing else wakes an object whose publication waits for our own write to be seen.
    ctx.rewake.register(caches.applies.clone(), &t.applies);
    ctx.rewake
        .register(caches.control_planes.clone(), &t.control_planes);
    ctx.rewake
        .register(caches.capt_clusters.clone(), &t.capt_clusters);
    ctx.rewake.register(caches.clusters.clone(), &t.clusters);
    w.spawn();
    caches.ready().await;
    tracing::info!("Caches synced; controllers started");

    let c = (assignment.concurrency, &lead);
    futures::join!(
        reconcile_all(caches.applies, t.applies, c, apply::reconcile, &ctx),
        reconcile_all(
            caches.control_planes,
            t.control_planes,
            c,
            control_plane::reconcile,
            &ctx
        ),
        reconcile_all(
            caches.capt_clusters,
            t.capt_clusters,
            c,
            capt_cluster::reconcile,
            &ctx
        ),
        reconcile_all(caches.clusters, t.clusters, c, cluster::reconcile, &ctx),
    );
}

/// What wakes each controller: the references it is sent.
#[derive(Default)]
struct Triggers {
    applies: Trigger<WorkspaceTemplateApply>,
    control_planes: Trigger<CAPTControlPlane>,
    capt_clusters: Trigger<CAPTCluster>,
    clusters: Trigger<Cluster>,
}

/// Subscribes each controller's trigger to the changes that concern its objects: their own
/// lifecycle, and the related objects of other kinds.
fn wire_wakes(t: &Triggers, w: &mut Watches) {
    w.applies.subscribers.wakes_own(&t.applies, lifecycle);
    w.workspaces.subscribers.wakes(&t.applies, |ws| {
        labelled_ref(ws, APPLY_NAMESPACE_LABEL, APPLY_NAME_LABEL)
    });
    // Pausing and unpausing a Cluster holds and releases its applies: all they read of it.
    let applies = w.applies.store();
    w.clusters
        .subscribers
        .wakes_when(&t.applies, paused, move |c| of_cluster(&applies, c));
    let applies = w.applies.store();
    w.templates
        .subscribers
        .wakes(&t.applies, move |template| users_of(&applies, template));

    w.control_planes
        .subscribers
        .wakes_own(&t.control_planes, lifecycle);
    let control_planes = w.control_planes.store();
    w.capt_clusters
        .subscribers
        .wakes_when(&t.control_planes, vpc_as_read, move |peer| {
            same_cluster(&control_planes, peer)
        });
    owner_wakes(&t.control_planes, w, |c| &c.spec.control_plane_ref);

    w.capt_clusters
        .subscribers
        .wakes_own(&t.capt_clusters, lifecycle);
    let capt_clusters = w.capt_clusters.store();
    w.control_planes
        .subscribers
        .wakes_when(&t.capt_clusters, control_plane_as_read, move |peer| {
            same_cluster(&capt_clusters, peer)
        });
    owner_wakes(&t.capt_clusters, w, |c| &c.spec.infrastructure_ref);

    w.clusters.subscribers.wakes_own(&t.clusters, lifecycle);
    w.capt_clusters
        .subscribers
        .wakes(&t.clusters, owning_cluster_ref);
    w.control_planes
        .subscribers
        .wakes(&t.clusters, owning_cluster_ref);
}

/// Forgets what is kept per object once it is deleted (memory stays flat under churn).
fn forget_on_deletion(ctx: &Arc<Context>, w: &mut Watches) {
    let c = ctx.clone();
    w.applies.subscribers.on_deleted(move |o| c.forget(o));
    let c = ctx.clone();
    w.control_planes
        .subscribers
        .on_deleted(move |o| c.forget(o));
    let c = ctx.clone();
    w.capt_clusters.subscribers.on_deleted(move |o| c.forget(o));
    let c = ctx.clone();
    w.clusters.subscribers.on_deleted(move |o| c.forget(o));
}

/// Runs the controller of `K` with `reconcile` until a shutdown signal: reading `store`, woken
/// by `trigger` only, `concurrency` reconciles at once shared fairly among namespaces
/// ([`crate::fair_share`]: every wake waits in its queue, in front of kube-rs), and handed
/// every cached object first by a sweep ([`crate::sweep`]: twice `concurrency` at a time
/// keeps it busy). Each reconcile that finished (with or without an error) is counted, so
/// that a rising count says a reconcile has made its decisions; how long each waited for its
/// worker and took is recorded, and one that ran long is logged.
///
/// kube-rs's controller runs what the queue hands it, one reconcile per object at a time, and
/// schedules requeues and retries; a reconcile it starts on its own (a requeue, a retry)
/// joins the queue instead of running, so that the fair share, not arrival order, decides
/// who runs, and no reconcile is parked in kube-rs while it waits.
///
/// Only while this replica leads: a reconcile asked for while it does not (a standby, a lead
/// that lapsed) ends at once, and the sweep hands every cached object over again each time
/// it comes to lead.
async fn reconcile_all<K, F, Fut>(
    store: Store<K>,
    trigger: Trigger<K>,
    (concurrency, lead): (u16, &Lead),
    reconcile: F,
    ctx: &Arc<Context>,
) where
    K: Watched,
    F: Fn(Arc<K>, Arc<Context>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = crate::reconcile::Result<Action>> + Send + 'static,
{
    use kube::runtime::controller::Error;
    let sweep = Arc::new(Sweep::new(2 * usize::from(concurrency)));
    let wake = trigger.wake();
    tokio::spawn({
        let (sweep, store, lead, wake) = (sweep.clone(), store.clone(), lead.clone(), wake.clone());
        async move {
            loop {
                lead.leading().await;
                sweep.feed(&store, &wake).await;
                lead.lapsed().await;
            }
        }
    });
    let kind = K::kind(&());
    let waiting = trigger.waiting();
    let (queue, handed) = FairQueue::new(&kind, concurrency.into(), ctx.metrics.held_back.clone());
    ctx.metrics.queues.add(&queue);
    tokio::spawn({
        let (queue, mut wakes) = (queue.clone(), trigger.into_stream());
        async move {
            while let Some(r) = wakes.next().await {
                queue.wake(r);
            }
        }
    });
    let timed = {
        let (waited, took) = ctx.metrics.durations(&kind);
        // Cloned out of the family at once: its guard holds the family's lock, and the next
        // controller's first count of its own kind would wait on it for ever.
        let long = ctx
            .metrics
            .long_reconciles
            .get_or_create(&KindLabel {
                kind: kind.to_string(),
            })
            .clone();
        let kind_of = kind.to_string();
        let (queue, waiting, store, lead) =
            (queue.clone(), waiting.clone(), store.clone(), lead.clone());
        move |obj: Arc<K>, ctx: Arc<Context>| {
            let (queue, wake, waiting, waited, took, long, store, lead) = (
                queue.clone(),
                wake.clone(),
                waiting.clone(),
                waited.clone(),
                took.clone(),
                long.clone(),
                store.clone(),
                lead.clone(),
            );
            let (reconcile, kind_of) = (reconcile.clone(), kind_of.clone());
            // Only the reference is kept: the object is read from the cache once it runs, as
            // it is then (a wait behind another namespace's work must not reconcile a stale
            // copy).
            let r = reference(obj.as_ref());
            drop(obj);
            async move {
                // Started by kube-rs on its own (a requeue, a retry): it waits its turn.
                let Some(_worker) = queue.start(&r) else {
                    wake.send(r);
                    return Ok(Action::await_change());
                };
                let wait = waiting.ended(&r);
                // Not leading: nothing to do until it leads, when the sweep hands this
                // object over again.
                if !lead.may_write() {
                    return Ok(Action::await_change());
                }
                if let Some(wait) = wait {
                    waited.observe(wait.as_secs_f64());
                }
                // Deleted since it was handed over: nothing to do.
                let Some(obj) = store.get(&r) else {
                    return Ok(Action::await_change());
                };
                let counted = ctx.clone();
                let started = tokio::time::Instant::now();
                // Boxed: a future is as large as its largest state, and the reconcile's is
                // large; kube-rs holds this one from its start.
                let result = Box::pin(reconcile(obj, ctx)).await;
                let elapsed = started.elapsed();
                // Counted here, not from what the controller reports: a reconcile that ended
                // at once (not leading, or joining the queue) decided nothing.
                counted.metrics.reconciled(&kind_of);
                took.observe(elapsed.as_secs_f64());
                if elapsed > LONG_RECONCILE {
                    long.inc();
                    tracing::warn!(
                        subject = format!(
                            "{kind_of}/{}/{}",
                            r.namespace.as_deref().unwrap_or_default(),
                            r.name
                        ),
                        seconds = elapsed.as_secs_f64(),
                        "Reconcile ran long"
                    );
                }
                result
            }
        }
    };
    // Unbounded here: the fair queue bounds the reconciles that run.
    Controller::for_stream(futures::stream::empty(), store)
        .with_config(kube::runtime::controller::Config::default().concurrency(0))
        .reconcile_on(handed)
        .shutdown_on_signal()
        .run(timed, error_policy, ctx.clone())
        .for_each(|result| {
            sweep.reported(&result);
            // Deleted before it started: it waits no more, and its worker is free.
            if let Err(Error::ObjectNotFound(gone)) = &result {
                let r = named::<K>(gone.namespace.as_deref(), &gone.name);
                waiting.ended(&r);
                queue.gone(&r);
            }
            std::future::ready(())
        })
        .await;
}

/// What else wakes the owner `O` of an apply (a CAPTCluster or a CAPTControlPlane): its
/// applies and their Workspaces (by their owner labels), and the Cluster that references it
/// through `reference` (pausing, adoption, the endpoint). The other CAPT kind of the same
/// Cluster wakes it too (the VPC's readiness, the control plane's presence during deletion):
/// the caller wires that, the peer being the one kind it cannot name generically.
fn owner_wakes<O: Watched>(
    trigger: &Trigger<O>,
    w: &mut Watches,
    reference: fn(&Cluster) -> &Option<ContractVersionedObjectReference>,
) {
    w.applies
        .subscribers
        .wakes(trigger, |a| owner_of::<O, _>(a));
    w.workspaces
        .subscribers
        .wakes(trigger, |ws| owner_of::<O, _>(ws));
    w.clusters
        .subscribers
        .wakes(trigger, move |c| referenced(c, reference(c)));
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

/// The CAPT object of kind `K` an apply or a Workspace serves (from its owner labels). A
/// tenant may write those labels (on an apply, or through a template onto its Workspace), so
/// they count only when they name the labelled object's own namespace (a Workspace's: its
/// apply's): another namespace's reconcilers are never woken by them.
fn owner_of<K: Resource<DynamicType = ()>, O: Resource>(obj: &O) -> Option<ObjectRef<K>> {
    let labels = obj.meta().labels.as_ref()?;
    (labels.get(OWNER_KIND_LABEL)? == &*K::kind(&())).then_some(())?;
    let own = match &obj.meta().namespace {
        Some(ns) => ns,
        None => labels.get(APPLY_NAMESPACE_LABEL)?,
    };
    (labels.get(OWNER_NAMESPACE_LABEL)? == own).then_some(())?;
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
        .map(|a| reference(a.as_ref()))
        .collect()
}

/// What an apply's reconcile reads of its Cluster: whether it is paused.
fn paused(cluster: &Cluster) -> Option<bool> {
    cluster.spec.paused
}

/// What a control plane's reconcile reads of the CAPTCluster its Cluster names: whether the
/// VPC is ready (and whose it is, for the wake itself).
fn vpc_as_read(cc: &CAPTCluster) -> (Option<String>, Option<bool>) {
    (cluster_name(cc), cc.status.as_ref().and_then(|s| s.ready))
}

/// What a CAPTCluster's reconcile reads of its Cluster's control plane: that it exists
/// (while deleting), and whose it is.
fn control_plane_as_read(cp: &CAPTControlPlane) -> Option<String> {
    cluster_name(cp)
}

/// The objects in `store` that belong to the same Cluster as `obj`.
fn same_cluster<K, O>(store: &Store<K>, obj: &O) -> Vec<ObjectRef<K>>
where
    K: Watched,
    O: Resource,
{
    let Some(cluster) = cluster_name_in(obj) else {
        return vec![];
    };
    in_cluster(store, obj.meta().namespace.as_deref(), cluster)
}

/// The objects in `store` that belong to `cluster` (by owner reference or label).
fn of_cluster<K: Watched>(store: &Store<K>, cluster: &Cluster) -> Vec<ObjectRef<K>> {
    let Some(name) = cluster.meta().name.as_deref() else {
        return vec![];
    };
    in_cluster(store, cluster.meta().namespace.as_deref(), name)
}

/// The objects in `store` of the Cluster `namespace`/`cluster`. Every object of the kind is
/// looked at, so nothing is copied of those that are not.
fn in_cluster<K: Watched>(
    store: &Store<K>,
    namespace: Option<&str>,
    cluster: &str,
) -> Vec<ObjectRef<K>> {
    store
        .state()
        .iter()
        .filter(|o| {
            o.meta().namespace.as_deref() == namespace
                && cluster_name_in(o.as_ref()) == Some(cluster)
        })
        .map(|o| reference(o.as_ref()))
        .collect()
}

/// The object a Cluster references, if it is of kind `K`.
fn referenced<K: Resource<DynamicType = ()>>(
    cluster: &Cluster,
    reference: &Option<ContractVersionedObjectReference>,
) -> Option<ObjectRef<K>> {
    let name = reference.as_ref()?.name_of::<K>()?;
    Some(ObjectRef::new(name).within(&cluster.namespace()?))
}

/// The Cluster an object belongs to.
fn owning_cluster_ref<O: Resource>(obj: &O) -> Option<ObjectRef<Cluster>> {
    Some(ObjectRef::new(&cluster_name(obj)?).within(obj.meta().namespace.as_deref()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labelled<K: serde::de::DeserializeOwned>(
        kind: &str,
        namespace: Option<&str>,
        labels: serde_json::Value,
    ) -> K {
        let (api_version, kind) = match kind {
            "Workspace" => ("tf.upbound.io/v1beta1", kind),
            _ => ("infrastructure.cluster.x-k8s.io/v1beta1", kind),
        };
        serde_json::from_value(json!({
            "apiVersion": api_version, "kind": kind,
            "metadata": {"name": "x", "namespace": namespace, "labels": labels},
            "spec": {"templateRef": {"name": "t"}, "forProvider": {}},
        }))
        .expect("a valid object")
    }

    fn owner_labels(namespace: &str, extra: serde_json::Value) -> serde_json::Value {
        let mut labels = json!({
            OWNER_KIND_LABEL: "CAPTCluster", OWNER_NAMESPACE_LABEL: namespace, OWNER_NAME_LABEL: "c",
        });
        labels
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        labels
    }

    #[test]
    fn owner_labels_wake_only_an_object_of_the_labelled_ones_namespace() {
        let own: WorkspaceTemplateApply = labelled(
            "WorkspaceTemplateApply",
            Some("team-a"),
            owner_labels("team-a", json!({})),
        );
        assert_eq!(
            owner_of::<CAPTCluster, _>(&own),
            Some(ObjectRef::new("c").within("team-a"))
        );
        let foreign: WorkspaceTemplateApply = labelled(
            "WorkspaceTemplateApply",
            Some("team-a"),
            owner_labels("team-b", json!({})),
        );
        assert_eq!(owner_of::<CAPTCluster, _>(&foreign), None);

        let ws = |owner_ns: &str| -> TerraformWorkspace {
            labelled(
                "Workspace",
                None,
                owner_labels(owner_ns, json!({APPLY_NAMESPACE_LABEL: "team-a"})),
            )
        };
        assert_eq!(
            owner_of::<CAPTCluster, _>(&ws("team-a")),
            Some(ObjectRef::new("c").within("team-a"))
        );
        assert_eq!(owner_of::<CAPTCluster, _>(&ws("team-b")), None);
        let unlabelled: TerraformWorkspace =
            labelled("Workspace", None, owner_labels("team-a", json!({})));
        assert_eq!(owner_of::<CAPTCluster, _>(&unlabelled), None);
    }
}
