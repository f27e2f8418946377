//! One watch per kind, shared by every controller: each kind is listed and watched once, its
//! objects stripped of what no reconciler reads before they are cached, and each change
//! handed to the controllers it wakes as object references (the objects are not copied).
//!
//! The reconcilers read these caches instead of issuing GETs ([`Caches`]). A controller of
//! kube-rs opens a watch of its own for every `.watches()`: with four controllers that was
//! up to four watches, four initial LISTs and four in-flight copies of every Workspace,
//! apply and Cluster.

use crate::api::{
    CAPTCluster, CAPTControlPlane, Cluster, TerraformWorkspace, WorkspaceTemplate,
    WorkspaceTemplateApply,
};
pub use crate::render::{MAX_TEMPLATE_BYTES, TOO_LARGE_ANNOTATION, module_digest};
use crate::trigger::Trigger;
use crate::unreadable::{Decoded, UnreadableReport, Unreadables};
use compact_json::Dictionaries;
use diagnostics::{WatchHealth, WatchReport};
use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::HashSet;
use std::sync::{Arc, LazyLock};
use std::time::Instant;

/// Annotation `kubectl apply` (client-side) leaves: a copy of the whole object, never read.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A namespaced or cluster-scoped kind the controllers watch and cache.
pub trait Watched:
    Resource<DynamicType = ()>
    + Clone
    + PartialEq
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    /// Drops what of this kind no reconciler reads, before it is cached (after [`strip`]).
    fn trim(&mut self) {}

    /// What is cached of an object of `bytes` bytes, too large for its text to reach the
    /// watch (`diagnostics::guard::MAX_OBJECT_BYTES`), of which only `meta` (its name,
    /// namespace, uid and resourceVersion) is known; `None`: nothing, it is unreadable.
    fn too_large(meta: &kube::api::ObjectMeta, bytes: u64) -> Option<Self> {
        let _ = (meta, bytes);
        None
    }
}

/// Our own status is read back only for what carries over from one computation to the next
/// (conditions' transition times, the phase, the template's previous outputs).
impl Watched for CAPTCluster {
    fn trim(&mut self) {
        if let Some(status) = self.status.as_mut() {
            crate::status::capt_cluster::keep_what_is_read(status);
        }
    }
}

impl Watched for CAPTControlPlane {
    fn trim(&mut self) {
        if let Some(status) = self.status.as_mut() {
            crate::status::control_plane::keep_what_is_read(status);
        }
    }
}

impl Watched for WorkspaceTemplateApply {}

/// Templates are written by tenants: one larger than [`MAX_TEMPLATE_BYTES`] is cached
/// without its body (and refused by every apply that uses it, `reconcile/apply/decide.rs`), so that
/// what a tenant writes cannot grow the shared controller's memory without bound. One too
/// large to reach the watch at all is cached the same way, with the size of the whole object.
impl Watched for WorkspaceTemplate {
    fn trim(&mut self) {
        let size = serde_json::to_vec(&self.spec).map_or(0, |v| v.len());
        if size > MAX_TEMPLATE_BYTES {
            self.spec = Default::default();
            self.meta_mut()
                .annotations
                .get_or_insert_default()
                .insert(TOO_LARGE_ANNOTATION.to_owned(), size.to_string());
        }
    }

    fn too_large(meta: &kube::api::ObjectMeta, bytes: u64) -> Option<Self> {
        let mut template = WorkspaceTemplate::new("", Default::default());
        template.metadata = meta.clone();
        template.metadata.annotations =
            Some([(TOO_LARGE_ANNOTATION.to_owned(), bytes.to_string())].into());
        Some(template)
    }
}

/// A Workspace's inline module is most of its size, and no reconciler reads it: the apply
/// only compares it with what it renders. The cache keeps its digest ([`module_digest`]).
/// The Workspaces are rendered from a few templates, and their specs, statuses and
/// annotations repeat one another: each is compressed against a recent one (a spec or a
/// status to a third of its size alone, measured on the benchmark's).
impl Watched for TerraformWorkspace {
    fn trim(&mut self) {
        static SPECS: LazyLock<Dictionaries> = LazyLock::new(Dictionaries::default);
        static STATUSES: LazyLock<Dictionaries> = LazyLock::new(Dictionaries::default);
        static ANNOTATIONS: LazyLock<Dictionaries> = LazyLock::new(Dictionaries::default);
        self.compact_annotations(|a| ANNOTATIONS.compact(a));
        let mut spec = self.spec_value();
        let module = spec
            .get_mut("forProvider")
            .and_then(|f| f.get_mut("module"));
        if let Some(module) = module
            && let Some(text) = module.as_str()
        {
            *module = serde_json::Value::String(module_digest(text));
        }
        self.spec.fields = SPECS.compact(&spec);
        if let Some(status) = self.status.as_mut() {
            *status = STATUSES.compact(&status.value());
        }
    }
}

/// A Cluster's status is core's (or, without core, what `capt-cluster` computes from our
/// objects): no reconciler reads it, and core's conditions are most of a Cluster's size.
impl Watched for Cluster {
    fn trim(&mut self) {
        self.status = None;
    }
}

/// What the cache keeps of an object: everything but its managedFields (the reconcilers read
/// them from a fresh GET where they need them: [`crate::reconcile::cluster`]) and the
/// last-applied annotation. Together they are most of an object's size.
pub fn strip<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// The reference to `obj` by its namespace and name, which is all the caches and the
/// controllers compare (`ObjectRef::from_obj` copies its uid and resourceVersion as well: two
/// strings more per object a subscriber keeps).
pub(crate) fn reference<K: Watched>(obj: &K) -> ObjectRef<K> {
    let meta = obj.meta();
    named(
        meta.namespace.as_deref(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// The reference to `namespace`/`name` (`namespace` `None`: cluster-scoped), as
/// [`reference`] makes it.
pub(crate) fn named<K: Resource<DynamicType = ()>>(
    namespace: Option<&str>,
    name: &str,
) -> ObjectRef<K> {
    let r = ObjectRef::new(name);
    match namespace {
        Some(namespace) => r.within(namespace),
        None => r,
    }
}

/// One change of an object, as its watch saw it.
#[derive(Clone, Copy, Debug)]
pub enum Change<'a, K> {
    /// Created or changed: the object now, and as the cache held it before the change
    /// (`None`: new to the cache).
    Applied {
        /// The object now.
        object: &'a K,
        /// The object before.
        previous: Option<&'a K>,
    },
    /// Deleted.
    Deleted(&'a K),
}

impl<'a, K> Change<'a, K> {
    /// The object the change is of (as it is now, or as it was when deleted).
    pub fn object(&self) -> &'a K {
        match *self {
            Change::Applied { object, .. } | Change::Deleted(object) => object,
        }
    }
}

/// Who is woken by the changes of one kind, and with which references.
pub struct Subscribers<K> {
    each: Vec<Subscriber<K>>,
}

/// One subscriber: told of every change.
type Subscriber<K> = Box<dyn Fn(&Change<'_, K>) + Send + Sync>;

impl<K> Default for Subscribers<K> {
    fn default() -> Self {
        Self { each: Vec::new() }
    }
}

impl<K: Watched> Subscribers<K> {
    /// Wakes the controller of `K` itself when `lifecycle` of an object changes (a new
    /// object, or a change the hash sees) after the first list (that one is the sweep's:
    /// [`crate::sweep`]); deletions do not wake it (a finalizer turns the deletion into a
    /// change first). What it compares with is the cache's copy from before the change:
    /// nothing is kept per object beside the cache.
    pub fn wakes_own(&mut self, trigger: &Trigger<K>, lifecycle: fn(&K) -> Option<u64>) {
        let wake = trigger.wake();
        self.each.push(Box::new(move |change| {
            let woken = match *change {
                Change::Deleted(_) => None,
                Change::Applied { object, previous } => {
                    (previous.map(lifecycle) != Some(lifecycle(object))).then_some(object)
                }
            };
            if let Some(object) = woken {
                wake.send(reference(object));
            }
        }));
    }

    /// Calls `forget` with each deleted object of this kind, so that what is kept per object
    /// goes with it.
    pub fn on_deleted(&mut self, forget: impl Fn(&K) + Send + Sync + 'static) {
        self.each.push(Box::new(move |change| {
            if let Change::Deleted(object) = *change {
                forget(object);
            }
        }));
    }

    /// Wakes the controller of `P` for the objects `map` finds, on every change of an object
    /// of this kind that its cached copy shows (`follow`), its deletion included, after the
    /// first list (at the start the sweep
    /// hands every object of `P` to its controller anyway: a wake per related object then
    /// only filled the queues).
    pub fn wakes<P, I>(
        &mut self,
        trigger: &Trigger<P>,
        map: impl Fn(&K) -> I + Send + Sync + 'static,
    ) where
        P: Resource<DynamicType = ()> + 'static,
        I: IntoIterator<Item = ObjectRef<P>>,
    {
        let wake = trigger.wake();
        self.each.push(Box::new(move |change| {
            for r in map(change.object()) {
                wake.send(r);
            }
        }));
    }

    /// Like [`Subscribers::wakes`], for a controller that reads little of this kind: only a
    /// new object, a deletion, or a change of what `read` returns wakes it. `read` is what
    /// that controller's reconcile reads of an object of this kind; the other changes (a
    /// status write it does not read) would wake a reconcile with nothing new to see.
    pub fn wakes_when<P, I, V>(
        &mut self,
        trigger: &Trigger<P>,
        read: fn(&K) -> V,
        map: impl Fn(&K) -> I + Send + Sync + 'static,
    ) where
        P: Resource<DynamicType = ()> + 'static,
        I: IntoIterator<Item = ObjectRef<P>>,
        V: PartialEq + 'static,
    {
        let wake = trigger.wake();
        self.each.push(Box::new(move |change| {
            if let Change::Applied {
                object,
                previous: Some(previous),
            } = *change
                && read(previous) == read(object)
            {
                return;
            }
            for r in map(change.object()) {
                wake.send(r);
            }
        }));
    }

    /// Hands one change to every subscriber.
    pub fn deliver(&self, change: Change<'_, K>) {
        for subscriber in &self.each {
            subscriber(&change);
        }
    }
}

/// The watch of one kind: its cache, and who is woken by its changes. Nothing is listed until
/// [`Watch::spawn`].
pub struct Watch<K: Watched> {
    /// One watch each, feeding the one cache: the namespace each is limited to, if it is one
    /// of several ([`Watch::in_namespaces`]).
    apis: Vec<(Option<String>, Api<Decoded<K>>)>,
    config: watcher::Config,
    store: Store<K>,
    writer: reflector::store::Writer<K>,
    /// Who its changes wake.
    pub subscribers: Subscribers<K>,
}

/// Where the watches report on themselves: their health (`/readyz`) and the objects they
/// cannot read ([`crate::unreadable`]).
#[derive(Clone)]
pub struct Reporting {
    /// Whether each watch has listed its kind, and whether it keeps failing.
    pub health: WatchHealth,
    /// The objects that do not fit their types.
    pub unreadables: Unreadables,
}

/// What one watch reports to.
struct Reports {
    /// `None` when the watch is several, each reporting its own health ([`merged`]).
    health: Option<WatchReport>,
    unreadable: UnreadableReport,
}

/// The events of one watch, as [`follow`] reads them.
type Events<K> = futures::stream::BoxStream<'static, watcher::Result<watcher::Event<Decoded<K>>>>;

impl<K: Watched> Watch<K> {
    /// A watch of `api` with `config`, not started. Each object is decoded alone
    /// ([`Decoded`]): one that does not fit `K` is reported, not cached, and costs no other.
    pub fn new(api: Api<Decoded<K>>, config: watcher::Config) -> Self {
        Self::of(vec![(None, api)], config)
    }

    /// A watch of `K` in each of `namespaces` (and nowhere else) with `config`, feeding one
    /// cache, not started. No namespace: nothing is listed, and the cache is empty and ready.
    pub fn in_namespaces(
        client: &kube::Client,
        namespaces: impl IntoIterator<Item = String>,
        config: watcher::Config,
    ) -> Self
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope>,
    {
        let apis = namespaces
            .into_iter()
            .map(|ns| {
                let api = Api::namespaced(client.clone(), &ns);
                (Some(ns), api)
            })
            .collect();
        Self::of(apis, config)
    }

    fn of(apis: Vec<(Option<String>, Api<Decoded<K>>)>, config: watcher::Config) -> Self {
        let (store, writer) = reflector::store();
        Self {
            apis,
            config,
            store,
            writer,
            subscribers: Subscribers::default(),
        }
    }

    /// The cache (empty until the first list completes: [`Store::wait_until_ready`]).
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Lists and watches until the process ends, keeping the cache, waking subscribers and
    /// reporting to `reporting` (from now on, the watch counts in `/readyz`; each of several
    /// counts alone, so that one namespace's failing relist is not hidden by another's
    /// changes).
    pub fn spawn(self, reporting: &Reporting) {
        let Self {
            apis,
            config,
            store,
            mut writer,
            subscribers,
        } = self;
        let kind = K::kind(&());
        let several = apis.len() > 1;
        let mut streams: Vec<(String, Events<K>)> = Vec::new();
        let mut health = None;
        for (namespace, api) in apis {
            let events = watcher(api, config.clone()).default_backoff().modify(|o| {
                if let Decoded::Readable(o) = o {
                    strip(o);
                    o.trim();
                }
            });
            match (several, namespace) {
                (true, Some(ns)) => {
                    let report = reporting.health.watch_in(&kind, &ns);
                    let events = events.inspect(move |e| report.saw(e, Instant::now()));
                    streams.push((ns, events.boxed()));
                }
                _ => {
                    health = Some(reporting.health.watch(&kind));
                    streams.push((String::new(), events.boxed()));
                }
            }
        }
        let reports = Reports {
            health,
            unreadable: reporting.unreadables.of::<K>(),
        };
        let events = match streams.len() {
            0 => {
                // Nothing to watch: the cache is complete as it is.
                writer.apply_watcher_event(&watcher::Event::Init);
                writer.apply_watcher_event(&watcher::Event::InitDone);
                return;
            }
            1 => streams.remove(0).1,
            _ => merged(streams, store.clone()).boxed(),
        };
        tokio::spawn(follow(events, store, writer, subscribers, reports));
    }
}

/// The watches of one kind in several namespaces, as one watch of them all would yield them:
/// one `Init`, and one `InitDone` once every namespace is listed. After that a namespace's
/// relist is handed on as changes (what it lists as `Apply`, what it no longer lists as a
/// `Delete` of the cached copy), so that it neither empties the cache of the others nor
/// waits for them.
fn merged<K: Watched>(
    streams: Vec<(String, Events<K>)>,
    store: Store<K>,
) -> impl futures::Stream<Item = watcher::Result<watcher::Event<Decoded<K>>>> + Send {
    let namespaces: Vec<String> = streams.iter().map(|(ns, _)| ns.clone()).collect();
    let n = namespaces.len();
    let tagged = futures::stream::select_all(
        streams
            .into_iter()
            .enumerate()
            .map(|(i, (_, s))| s.map(move |e| (i, e))),
    );
    let mut merge = Merge {
        listed: vec![false; n],
        started: false,
        all_listed: false,
        names: vec![HashSet::new(); n],
        relisting: vec![None; n],
    };
    tagged.flat_map(move |(i, event)| {
        futures::stream::iter(merge.step(i, event, |name| gone(&store, &namespaces[i], name)))
    })
}

/// What [`merged`] knows of each namespace's watch.
struct Merge {
    /// Each namespace's first list completed.
    listed: Vec<bool>,
    /// The one `Init` was handed on.
    started: bool,
    /// The one `InitDone` was handed on.
    all_listed: bool,
    /// The names each namespace's watch has shown and not deleted.
    names: Vec<HashSet<String>>,
    /// During a namespace's relist: the names it has listed so far.
    relisting: Vec<Option<HashSet<String>>>,
}

impl Merge {
    /// The events one watch of every namespace yields for `event` of namespace `i`; `gone`
    /// is the deletion of one of its names (the cached copy, if any).
    fn step<O: Resource>(
        &mut self,
        i: usize,
        event: watcher::Result<watcher::Event<O>>,
        gone: impl Fn(&str) -> O,
    ) -> Vec<watcher::Result<watcher::Event<O>>> {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let name = |o: &O| o.meta().name.clone().unwrap_or_default();
        match event {
            Err(error) => vec![Err(error)],
            // Before every namespace is listed, all of them list into one buffer (a namespace
            // that lists again then lists into it again).
            Ok(Init) if !self.all_listed => {
                self.listed[i] = false;
                match std::mem::replace(&mut self.started, true) {
                    true => vec![],
                    false => vec![Ok(Init)],
                }
            }
            Ok(Init) => {
                self.relisting[i] = Some(HashSet::new());
                vec![]
            }
            Ok(InitApply(o)) => {
                self.names[i].insert(name(&o));
                match self.relisting[i].as_mut() {
                    Some(seen) => {
                        seen.insert(name(&o));
                        vec![Ok(Apply(o))]
                    }
                    None => vec![Ok(InitApply(o))],
                }
            }
            Ok(InitDone) => match self.relisting[i].take() {
                Some(seen) => {
                    let stale: Vec<String> = self.names[i].difference(&seen).cloned().collect();
                    self.names[i] = seen;
                    stale.iter().map(|n| Ok(Delete(gone(n)))).collect()
                }
                None => {
                    self.listed[i] = true;
                    if self.all_listed || !self.listed.iter().all(|l| *l) {
                        return vec![];
                    }
                    self.all_listed = true;
                    vec![Ok(InitDone)]
                }
            },
            Ok(Apply(o)) => {
                self.names[i].insert(name(&o));
                vec![Ok(Apply(o))]
            }
            Ok(Delete(o)) => {
                self.names[i].remove(&name(&o));
                vec![Ok(Delete(o))]
            }
        }
    }
}

/// The deletion of `namespace`/`name` as its watch would show it: the cached copy, or (not
/// cached: it could not be read) its name alone, which resolves its report.
fn gone<K: Watched>(store: &Store<K>, namespace: &str, name: &str) -> Decoded<K> {
    match store.get(&named(Some(namespace), name)) {
        Some(cached) => Decoded::Readable((*cached).clone()),
        None => Decoded::Unreadable(Box::new(crate::unreadable::Unreadable {
            meta: kube::api::ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                ..Default::default()
            },
            error: String::new(),
            too_large: None,
        })),
    }
}

/// Keeps the cache from `events` and hands each change to `subscribers`: what `reflect`
/// does, with the cache's copy from before each change handed over too (during a relist the
/// cache keeps the old list until the new one is whole, so that copy is the last one seen).
/// The objects of the first list are cached and handed to no one, nor is a change that
/// leaves the cached copy as it was ([`same_but_version`]). An object that cannot be read is
/// reported and not cached; a copy cached while it could be read goes, as if deleted (it is
/// no longer what the API server holds).
async fn follow<K: Watched>(
    events: impl futures::Stream<Item = watcher::Result<watcher::Event<Decoded<K>>>>,
    store: Store<K>,
    mut writer: reflector::store::Writer<K>,
    subscribers: Subscribers<K>,
    reports: Reports,
) {
    let kind = K::kind(&());
    let mut events = std::pin::pin!(events);
    let mut listed = false;
    while let Some(event) = events.next().await {
        // Only a completed list or a watched change resets the failures (not a page of a
        // list that may fail later): `WatchReport::saw`.
        if let Some(health) = &reports.health {
            health.saw(&event, Instant::now());
        }
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                tracing::warn!(%kind, %error, "Watch failed; retrying with backoff");
                continue;
            }
        };
        let event = match readable(event) {
            Ok(event) => event,
            Err((object, deleted)) => {
                if deleted {
                    reports.unreadable.resolved(&object.meta);
                    continue;
                }
                reports.unreadable.unreadable(&object);
                let stale = store.get(&named(
                    object.meta.namespace.as_deref(),
                    object.meta.name.as_deref().unwrap_or_default(),
                ));
                if let Some(stale) = stale {
                    writer.apply_watcher_event(&watcher::Event::Delete((*stale).clone()));
                    if listed {
                        subscribers.deliver(Change::Deleted(&*stale));
                    }
                }
                continue;
            }
        };
        match &event {
            // The first list wakes no one: each controller's sweep hands it every object of
            // its own kind ([`crate::sweep`]), and wakes of related objects would only fill
            // the queues.
            watcher::Event::InitApply(object) if !listed => {
                reports.unreadable.resolved(object.meta());
                writer.apply_watcher_event(&event)
            }
            watcher::Event::Apply(object) | watcher::Event::InitApply(object) => {
                reports.unreadable.resolved(object.meta());
                let previous = store.get(&reference(object));
                writer.apply_watcher_event(&event);
                let previous = previous.as_deref();
                if previous.is_some_and(|p| same_but_version(p, object)) {
                    continue;
                }
                subscribers.deliver(Change::Applied { object, previous });
            }
            watcher::Event::Delete(object) => {
                reports.unreadable.resolved(object.meta());
                writer.apply_watcher_event(&event);
                subscribers.deliver(Change::Deleted(object));
            }
            watcher::Event::Init => {
                reports.unreadable.relisting();
                writer.apply_watcher_event(&event)
            }
            watcher::Event::InitDone => {
                writer.apply_watcher_event(&event);
                reports.unreadable.relisted();
                listed = true;
            }
        }
    }
}

/// How an event of `K` is made again from its object.
type Rewrap<K> = fn(K) -> watcher::Event<K>;

/// The event with its object read as `K` (or as [`Watched::too_large`] makes it, of an object
/// too large to reach the watch); or the object that cannot be read, and whether the event
/// was its deletion.
fn readable<K: Watched>(
    event: watcher::Event<Decoded<K>>,
) -> Result<watcher::Event<K>, (Box<crate::unreadable::Unreadable>, bool)> {
    use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
    let deleted = matches!(event, Delete(_));
    let (object, rewrap): (Decoded<K>, Rewrap<K>) = match event {
        Init => return Ok(Init),
        InitDone => return Ok(InitDone),
        Apply(object) => (object, Apply),
        InitApply(object) => (object, InitApply),
        Delete(object) => (object, Delete),
    };
    match object {
        Decoded::Readable(object) => Ok(rewrap(object)),
        Decoded::Unreadable(u) => match u.too_large.and_then(|b| K::too_large(&u.meta, b)) {
            Some(object) => Ok(rewrap(object)),
            None => Err((u, deleted)),
        },
    }
}

/// True when `object`, as cached, differs from its cached copy `previous` in its
/// resourceVersion alone: the change was to what the cache does not keep (core's writes of a
/// Cluster's status, which [`Watched::trim`] drops). The reconcilers read only the
/// cache, so no reconcile can see such a change, and it wakes no one: at 3,000 clusters,
/// core's sweeps of Cluster statuses (about 1,000 writes in 20 s) otherwise queued a
/// reconcile of each control plane and each CAPTCluster before the changes that matter.
fn same_but_version<K: Watched>(previous: &K, object: &K) -> bool {
    if previous.meta().resource_version == object.meta().resource_version {
        return previous == object;
    }
    let mut previous = previous.clone();
    previous.meta_mut().resource_version = object.meta().resource_version.clone();
    previous == *object
}

/// The caches the reconcilers read, one per kind.
#[derive(Clone)]
pub struct Caches {
    /// Cluster API Clusters.
    pub clusters: Store<Cluster>,
    /// CAPTClusters.
    pub capt_clusters: Store<CAPTCluster>,
    /// CAPTControlPlanes.
    pub control_planes: Store<CAPTControlPlane>,
    /// WorkspaceTemplateApplies.
    pub applies: Store<WorkspaceTemplateApply>,
    /// WorkspaceTemplates.
    pub templates: Store<WorkspaceTemplate>,
    /// Workspaces (cluster-scoped).
    pub workspaces: Store<TerraformWorkspace>,
}

impl Caches {
    /// Waits until every cache has listed its kind once: a reconcile before that would see
    /// objects as missing and publish a status that says so.
    pub async fn ready(&self) {
        let _ = futures::join!(
            self.clusters.wait_until_ready(),
            self.capt_clusters.wait_until_ready(),
            self.control_planes.wait_until_ready(),
            self.applies.wait_until_ready(),
            self.templates.wait_until_ready(),
            self.workspaces.wait_until_ready(),
        );
    }
}

/// The cached object of `namespace`/`name` (`namespace` `None`: cluster-scoped).
pub fn cached<K: Watched>(store: &Store<K>, namespace: Option<&str>, name: &str) -> Option<Arc<K>> {
    store.get(&named(namespace, name))
}

/// The cached object of `name` in `obj`'s namespace.
pub fn cached_beside<K: Watched, O: Resource>(
    store: &Store<K>,
    obj: &O,
    name: &str,
) -> Option<Arc<K>> {
    cached(store, obj.meta().namespace.as_deref(), name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::WorkspaceTemplateSpec;
    use crate::reconcile::lifecycle;
    use compact_json::CompactJson;
    use kube::ResourceExt;
    use serde_json::json;
    use std::collections::HashMap;

    fn apply(name: &str, generation: i64, status: &str) -> WorkspaceTemplateApply {
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
            "kind": "WorkspaceTemplateApply",
            "metadata": {"name": name, "namespace": "ns", "generation": generation,
                "managedFields": [{"manager": "m", "operation": "Apply"}],
                "annotations": {LAST_APPLIED: "{}", "kept": "yes"}},
            "spec": {"templateRef": {"name": "t"}},
            "status": {"workspaceName": status},
        }))
        .expect("an apply")
    }

    fn made_again(mut apply: WorkspaceTemplateApply) -> WorkspaceTemplateApply {
        apply.metadata.uid = Some("another".into());
        apply
    }

    /// Hands `object` to `subs` as its watch would, with `cache` standing for the watch's cache.
    fn applied<K: Watched>(subs: &Subscribers<K>, cache: &mut HashMap<String, K>, object: K) {
        let name = object.meta().name.clone().unwrap_or_default();
        let previous = cache.remove(&name);
        subs.deliver(Change::Applied {
            object: &object,
            previous: previous.as_ref(),
        });
        cache.insert(name, object);
    }

    fn deleted<K: Watched>(subs: &Subscribers<K>, cache: &mut HashMap<String, K>, object: K) {
        cache.remove(object.meta().name.as_deref().unwrap_or_default());
        subs.deliver(Change::Deleted(&object));
    }

    /// Reports that go nowhere but the returned health and unreadable objects.
    fn reports_of<K: Watched>() -> (Reports, Reporting) {
        let reporting = Reporting {
            health: WatchHealth::default(),
            unreadables: Unreadables::new(Default::default(), None),
        };
        let reports = Reports {
            health: Some(reporting.health.watch(&K::kind(&()))),
            unreadable: reporting.unreadables.of::<K>(),
        };
        (reports, reporting)
    }

    /// [`follow`] of `events` whose objects are all readable.
    async fn follow_readable<K: Watched, const N: usize>(
        events: [watcher::Event<K>; N],
        store: Store<K>,
        writer: reflector::store::Writer<K>,
        subs: Subscribers<K>,
    ) {
        let events = events.map(|e| Ok(decoded(e)));
        follow(
            futures::stream::iter(events),
            store,
            writer,
            subs,
            reports_of::<K>().0,
        )
        .await;
    }

    /// The event as a watch of [`Decoded`] objects delivers it.
    fn decoded<K>(event: watcher::Event<K>) -> watcher::Event<Decoded<K>> {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        match event {
            Init => Init,
            InitDone => InitDone,
            Apply(o) => Apply(Decoded::Readable(o)),
            InitApply(o) => InitApply(Decoded::Readable(o)),
            Delete(o) => Delete(Decoded::Readable(o)),
        }
    }

    fn unreadable<K>(name: &str, version: &str) -> Decoded<K> {
        Decoded::Unreadable(Box::new(crate::unreadable::Unreadable {
            meta: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            error: "spec.templateRef: missing field `name`".into(),
            too_large: None,
        }))
    }

    #[tokio::test]
    async fn an_object_that_cannot_be_read_costs_only_itself() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let mut trigger = Trigger::<CAPTCluster>::default();
        let mut subs = Subscribers::default();
        subs.wakes(&trigger, |a: &WorkspaceTemplateApply| {
            Some(ObjectRef::new(&format!("owner-of-{}", a.metadata.name.clone()?)).within("ns"))
        });
        let (store, writer) = reflector::store();
        let readable = |name: &str, generation| Decoded::Readable(apply(name, generation, ""));
        let events = [
            Init,
            InitApply(readable("a", 1)),
            InitApply(unreadable("poison", "1")),
            InitApply(readable("b", 1)),
            InitDone,
            // Fixed: cached, and its owner woken.
            Apply(readable("poison", 2)),
            // Broken again: the copy cached while it was readable goes, as if deleted.
            Apply(unreadable("poison", "3")),
            Apply(readable("a", 2)),
        ];
        let (reports, reporting) = reports_of::<WorkspaceTemplateApply>();
        let stream = futures::stream::iter(events.map(Ok));
        let follow = tokio::spawn(follow(stream, store.clone(), writer, subs, reports));
        follow.await.unwrap();
        assert!(
            store.wait_until_ready().await.is_ok(),
            "the first list completed"
        );
        let names: Vec<_> = store.state().iter().map(|a| a.name_any()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(
            cached(&store, Some("ns"), "a").is_some() && cached(&store, Some("ns"), "b").is_some()
        );
        assert_eq!(
            trigger.drain(),
            ["owner-of-poison", "owner-of-poison", "owner-of-a"]
        );
        assert_eq!(reporting.unreadables.count("WorkspaceTemplateApply"), 1);
        assert_eq!(reporting.health.readiness(Instant::now()), Ok(()));

        // Deleted while it could not be read: nothing is left of it.
        let (store, writer) = reflector::store::<WorkspaceTemplateApply>();
        let (reports, reporting) = reports_of::<WorkspaceTemplateApply>();
        let events = [
            Init,
            InitApply(unreadable("poison", "1")),
            InitDone,
            Delete(unreadable("poison", "2")),
        ];
        follow_all(events, store, writer, reports).await;
        assert_eq!(reporting.unreadables.count("WorkspaceTemplateApply"), 0);
    }

    #[test]
    fn watches_of_several_namespaces_list_once_together_and_relist_each_as_changes() {
        use watcher::Event::{Init, InitApply, InitDone};
        let mut merge = Merge {
            listed: vec![false; 2],
            started: false,
            all_listed: false,
            names: vec![HashSet::new(); 2],
            relisting: vec![None; 2],
        };
        let mut step = |i: usize, event: watcher::Event<WorkspaceTemplateApply>| -> Vec<String> {
            let gone = |name: &str| apply(&format!("gone-{name}"), 1, "");
            let shown = |e: &watcher::Event<WorkspaceTemplateApply>| match e {
                watcher::Event::Init => "Init".to_owned(),
                watcher::Event::InitDone => "InitDone".to_owned(),
                watcher::Event::InitApply(o) => format!("InitApply {}", o.name_any()),
                watcher::Event::Apply(o) => format!("Apply {}", o.name_any()),
                watcher::Event::Delete(o) => format!("Delete {}", o.name_any()),
            };
            let out = merge.step(i, Ok(event), gone);
            out.iter().map(|e| shown(e.as_ref().unwrap())).collect()
        };
        // The first lists: one Init, one InitDone once both namespaces are listed.
        assert_eq!(step(0, Init), ["Init"]);
        assert_eq!(step(1, Init), Vec::<String>::new());
        assert_eq!(step(0, InitApply(apply("x", 1, ""))), ["InitApply x"]);
        assert_eq!(step(0, InitApply(apply("z", 1, ""))), ["InitApply z"]);
        assert!(
            step(0, InitDone).is_empty(),
            "the other namespace is not listed yet"
        );
        assert_eq!(step(1, InitApply(apply("y", 1, ""))), ["InitApply y"]);
        assert_eq!(step(1, InitDone), ["InitDone"]);
        // A relist of one namespace: changes, and what it no longer shows deleted.
        assert!(step(0, Init).is_empty());
        assert_eq!(step(0, InitApply(apply("x", 2, ""))), ["Apply x"]);
        assert_eq!(step(0, InitDone), ["Delete gone-z"]);
    }

    #[tokio::test]
    async fn a_list_that_fails_each_time_keeps_the_watch_failing() {
        use watcher::Event::Init;
        // kube-rs announces each list (`Init`) before it asks for it.
        let events = [
            Ok(Init),
            Err(watcher::Error::NoResourceVersion),
            Ok(Init),
            Err(watcher::Error::NoResourceVersion),
        ];
        let (store, writer) = reflector::store::<WorkspaceTemplateApply>();
        let (reports, reporting) = reports_of::<WorkspaceTemplateApply>();
        let stream = futures::stream::iter(events);
        follow(stream, store, writer, Subscribers::default(), reports).await;
        let not_ready = reporting.health.readiness(Instant::now()).unwrap_err();
        assert!(
            not_ready.starts_with("watch of WorkspaceTemplateApply failing (2 times in a row"),
            "{not_ready}"
        );
    }

    async fn follow_all<K: Watched, const N: usize>(
        events: [watcher::Event<Decoded<K>>; N],
        store: Store<K>,
        writer: reflector::store::Writer<K>,
        reports: Reports,
    ) {
        let stream = futures::stream::iter(events.map(Ok));
        follow(stream, store, writer, Subscribers::default(), reports).await;
    }

    #[test]
    fn its_own_controller_wakes_on_lifecycle_changes_only() {
        let mut trigger = Trigger::default();
        let mut subs = Subscribers::default();
        subs.wakes_own(&trigger, lifecycle);
        let cache = &mut HashMap::new();
        applied(&subs, cache, apply("a", 1, ""));
        applied(&subs, cache, apply("a", 1, "ws-1")); // status: ours, no wake
        applied(&subs, cache, apply("b", 1, ""));
        applied(&subs, cache, apply("a", 2, "ws-1")); // spec: wakes
        assert_eq!(trigger.drain(), ["a", "b", "a"]);
        // Deleted, then created again under the same name: a new object wakes it.
        deleted(&subs, cache, apply("b", 1, ""));
        assert!(trigger.drain().is_empty());
        applied(&subs, cache, apply("b", 1, ""));
        assert_eq!(trigger.drain(), ["b"]);
    }

    #[test]
    fn a_controller_that_reads_little_wakes_only_when_what_it_reads_changes() {
        let mut owners = Trigger::<CAPTCluster>::default();
        let mut subs = Subscribers::default();
        let read = |a: &WorkspaceTemplateApply| a.metadata.generation;
        subs.wakes_when(&owners, read, |_| {
            Some(ObjectRef::new("owner").within("ns"))
        });
        let cache = &mut HashMap::new();
        applied(&subs, cache, apply("a", 1, "")); // new: wakes
        applied(&subs, cache, apply("a", 1, "ws-1")); // what it does not read: no wake
        applied(&subs, cache, apply("a", 2, "ws-1")); // what it reads: wakes
        deleted(&subs, cache, apply("a", 2, "ws-1")); // gone: wakes
        assert_eq!(owners.drain(), ["owner"; 3]);
    }

    #[tokio::test]
    async fn the_first_list_wakes_nothing_a_relist_what_changed_while_the_watch_was_away() {
        use watcher::Event::{Init, InitApply, InitDone};
        let mut trigger = Trigger::default();
        let mut owners = Trigger::<CAPTCluster>::default();
        let mut subs = Subscribers::default();
        subs.wakes_own(&trigger, lifecycle);
        subs.wakes(&owners, |a: &WorkspaceTemplateApply| {
            Some(ObjectRef::new(&format!("owner-of-{}", a.metadata.name.clone()?)).within("ns"))
        });
        let (store, writer) = reflector::store();
        let events = [
            Init,
            InitApply(apply("a", 1, "")),
            InitApply(apply("b", 1, "")),
            InitApply(apply("d", 1, "")),
            InitDone,
            // The watch fell behind and lists again: "a" changed its spec meanwhile, "b"
            // only its status, "c" is new, "d" was deleted and made again.
            Init,
            InitApply(apply("a", 2, "")),
            InitApply(apply("b", 1, "ws-1")),
            InitApply(apply("c", 1, "")),
            InitApply(made_again(apply("d", 1, ""))),
            InitDone,
        ];
        follow_readable(events, store.clone(), writer, subs).await;
        // The first list is the sweep's; of the relist, what a reconcile must see.
        assert_eq!(trigger.drain(), ["a", "c", "d"]);
        // Nor does the first list wake the owners (their own sweep reconciles them): only the
        // relist, every object of it, wakes them through the mapper.
        let owners = owners.drain();
        assert_eq!(
            owners,
            ["owner-of-a", "owner-of-b", "owner-of-c", "owner-of-d"]
        );
        let b = cached(&store, Some("ns"), "b").expect("b is cached");
        assert_eq!(
            b.status.as_ref().unwrap().workspace_name.as_deref(),
            Some("ws-1")
        );
    }

    #[test]
    fn other_controllers_wake_on_each_change_and_deletion_through_their_mapper() {
        let mut trigger = Trigger::<CAPTCluster>::default();
        let mut subs = Subscribers::<WorkspaceTemplateApply>::default();
        subs.wakes(&trigger, |a: &WorkspaceTemplateApply| {
            Some(ObjectRef::new(&format!("owner-of-{}", a.metadata.name.clone()?)).within("ns"))
        });
        let cache = &mut HashMap::new();
        applied(&subs, cache, apply("a", 1, ""));
        applied(&subs, cache, apply("a", 1, "ws-1"));
        deleted(&subs, cache, apply("a", 1, "ws-1"));
        assert_eq!(trigger.drain(), ["owner-of-a"; 3]);
    }

    #[tokio::test]
    async fn a_change_to_what_the_cache_does_not_keep_wakes_no_one() {
        use watcher::Event::{Apply, Init, InitApply, InitDone};
        // As the watch hands it on: stripped and trimmed.
        let cluster = |version: &str, phase: &str, label: &str| -> Cluster {
            let mut c: Cluster = serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": "c", "namespace": "ns", "resourceVersion": version,
                    "labels": {"team": label},
                    "managedFields": [{"manager": "manager", "operation": "Update"}]},
                "spec": {"controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io",
                    "kind": "CAPTControlPlane", "name": "cp"}},
                "status": {"phase": phase},
            }))
            .expect("a cluster");
            strip(&mut c);
            c.trim();
            c
        };
        let mut control_planes = Trigger::<CAPTControlPlane>::default();
        let mut subs = Subscribers::<Cluster>::default();
        subs.wakes(&control_planes, |c: &Cluster| {
            Some(ObjectRef::new(c.spec.control_plane_ref.as_ref()?.name.as_str()).within("ns"))
        });
        let (store, writer) = reflector::store();
        let events = [
            Init,
            InitApply(cluster("1", "Provisioning", "a")),
            InitDone,
            // Core writes the Cluster's status: the cache keeps none of it.
            Apply(cluster("2", "Provisioned", "a")),
            Apply(cluster("3", "Provisioned", "a")),
            // A change the cache keeps (and the reconcilers may read).
            Apply(cluster("4", "Provisioned", "b")),
        ];
        follow_readable(events, store.clone(), writer, subs).await;
        assert_eq!(control_planes.drain(), ["cp"]);
        let cached = cached(&store, Some("ns"), "c").expect("c is cached");
        assert_eq!(cached.metadata.resource_version.as_deref(), Some("4"));
    }

    #[test]
    fn the_cache_keeps_neither_managed_fields_nor_the_last_applied_copy() {
        let mut a = apply("a", 1, "ws-1");
        strip(&mut a);
        assert!(a.metadata.managed_fields.is_none());
        let annotations = a.metadata.annotations.as_ref().expect("annotations");
        assert!(!annotations.contains_key(LAST_APPLIED));
        assert_eq!(annotations["kept"], "yes");
        assert_eq!(a.spec.template_ref.name, "t");
    }

    #[test]
    fn a_cached_cluster_keeps_its_spec_and_not_cores_status() {
        let mut cluster: Cluster = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Cluster",
            "metadata": {"name": "c", "namespace": "ns", "finalizers": ["cluster.cluster.x-k8s.io"]},
            "spec": {"paused": false, "controlPlaneEndpoint": {"host": "h", "port": 443},
                "controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io",
                    "kind": "CAPTControlPlane", "name": "cp"}},
            "status": {"phase": "Provisioned", "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .expect("a cluster");
        strip(&mut cluster);
        cluster.trim();
        assert!(cluster.status.is_none());
        assert_eq!(
            cluster
                .spec
                .control_plane_ref
                .as_ref()
                .and_then(|r| r.name_of::<crate::api::CAPTControlPlane>()),
            Some("cp")
        );
        assert_eq!(
            cluster
                .spec
                .control_plane_endpoint
                .as_ref()
                .map(|e| e.host.as_str()),
            Some("h")
        );
        assert_eq!(
            cluster.metadata.finalizers.as_deref(),
            Some(&["cluster.cluster.x-k8s.io".to_owned()][..])
        );
    }

    #[test]
    fn a_cached_control_plane_keeps_the_status_it_reads_back_and_not_the_copies() {
        let mut cp: CAPTControlPlane = serde_json::from_value(json!({
            "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
            "metadata": {"name": "cp", "namespace": "ns"},
            "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "t"}},
            "status": {"phase": "Ready", "ready": true,
                "conditions": [{"type": "Ready", "status": "True",
                    "lastTransitionTime": "2026-11-27T00:00:00Z", "reason": "Ready"}],
                "workspaceTemplateStatus": {"ready": true, "outputs": {"a": "b"}},
                "workspaceStatus": {"ready": true, "atProvider": {"outputs": {"a": "b"}}},
                "deprecated": {"v1beta1": {"conditions": [{"type": "Ready", "status": "True",
                    "lastTransitionTime": "2026-11-27T00:00:00Z"}]}}},
        }))
        .expect("a control plane");
        let kept = cp.clone();
        strip(&mut cp);
        cp.trim();
        let (status, before) = (cp.status.unwrap(), kept.status.unwrap());
        assert!(status.workspace_status.is_none() && status.deprecated.is_none());
        assert_eq!(status.conditions, before.conditions);
        assert_eq!(status.phase, before.phase);
        let names = |s: &crate::api::CAPTControlPlaneStatus| -> Vec<String> {
            let outputs = s
                .workspace_template_status
                .as_ref()
                .and_then(|t| t.outputs.clone());
            outputs.unwrap_or_default().into_keys().collect()
        };
        assert_eq!(names(&status), names(&before));
    }

    #[test]
    fn a_template_over_the_limit_is_cached_without_its_body_and_marked() {
        let template = |module: String| -> WorkspaceTemplate {
            serde_json::from_value(json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
                "metadata": {"name": "t", "namespace": "ns"},
                "spec": {"template": {"spec": {"forProvider": {"module": module}}}},
            }))
            .expect("a template")
        };
        let mut small = template("m".repeat(1024));
        let kept = small.clone();
        small.trim();
        assert_eq!(small.spec, kept.spec);
        assert_eq!(small.metadata, kept.metadata);
        let mut large = template("m".repeat(MAX_TEMPLATE_BYTES));
        large.trim();
        assert_eq!(large.spec, WorkspaceTemplateSpec::default());
        let size: usize = kube::ResourceExt::annotations(&large)[TOO_LARGE_ANNOTATION]
            .parse()
            .unwrap();
        assert!(size > MAX_TEMPLATE_BYTES, "{size}");
    }

    #[test]
    fn a_cached_workspace_keeps_its_module_as_a_digest() {
        let mut ws: TerraformWorkspace = serde_json::from_value(json!({
            "apiVersion": "tf.upbound.io/v1beta1", "kind": "Workspace",
            "metadata": {"name": "w"},
            "spec": {"forProvider": {"module": "x".repeat(100_000), "source": "Inline"}},
        }))
        .expect("a Workspace");
        ws.trim();
        let spec = ws.spec_value();
        let module = spec["forProvider"]["module"].as_str().unwrap();
        assert_eq!(module, module_digest(&"x".repeat(100_000)));
        assert_ne!(module, module_digest("y"));
        assert_eq!(spec["forProvider"]["source"], "Inline");
    }

    #[test]
    fn cached_workspaces_are_compressed_against_one_another_and_read_back_whole() {
        let workspace = |i: usize| -> TerraformWorkspace {
            serde_json::from_value(json!({
                "apiVersion": "tf.upbound.io/v1beta1", "kind": "Workspace",
                "metadata": {"name": format!("w{i}"), "annotations": {
                    "crossplane.io/external-name": format!("w{i}"),
                    "crossplane.io/external-create-succeeded": "2026-11-28T07:33:48Z",
                    "infrastructure.cluster.x-k8s.io/workspace-revision": format!("{i:064x}")}},
                "spec": {"forProvider": {"module": "m", "source": "Inline",
                    "vars": [{"key": "cluster_name", "value": format!("c{i}")},
                             {"key": "region", "value": "ap-northeast-1"}]},
                    "providerConfigRef": {"name": "default"},
                    "writeConnectionSecretToRef": {"name": format!("c{i}-eks-connection"),
                                                   "namespace": "team-a"}},
                "status": {"atProvider": {"checksum": format!("{i:032x}"),
                    "outputs": {"cluster_endpoint": format!("https://c{i}.eks.amazonaws.com"),
                                "cluster_name": format!("c{i}")}},
                    "conditions": [
                        {"type": "Ready", "status": "True", "reason": "Available",
                         "lastTransitionTime": "2026-11-28T07:33:49Z"},
                        {"type": "Synced", "status": "True", "reason": "ReconcileSuccess",
                         "lastTransitionTime": "2026-11-28T07:33:48Z"}]},
            }))
            .expect("a Workspace")
        };
        let (mut cached, mut alone) = (0, 0);
        for i in 0..20 {
            let mut ws = workspace(i);
            alone += ws.spec.fields.compressed_len();
            alone += ws.status.as_ref().map_or(0, |s| s.compressed_len());
            alone += CompactJson::new(&ws.metadata.annotations).compressed_len();
            let (spec, status) = (ws.spec_value(), ws.status_value());
            let annotations = ws.metadata.annotations.clone().unwrap();
            ws.trim();
            cached += ws.spec.fields.compressed_len();
            cached += ws.status.as_ref().map_or(0, |s| s.compressed_len());
            cached += ws.compact_annotations_len();
            assert_eq!(ws.status_value(), status, "the status reads back whole");
            assert!(
                ws.metadata.annotations.is_none(),
                "no map of annotations is kept"
            );
            assert_eq!(
                ws.annotations(),
                annotations,
                "the annotations read back whole"
            );
            let json = serde_json::to_value(&ws).unwrap();
            assert_eq!(
                json["metadata"]["annotations"],
                json!(annotations),
                "and as JSON"
            );
            let mut digested = spec;
            digested["forProvider"]["module"] = json!(module_digest("m"));
            assert_eq!(ws.spec_value(), digested, "the spec reads back whole");
        }
        assert!(
            cached * 2 < alone,
            "{cached} bytes cached, {alone} bytes compressed alone"
        );
    }
}
