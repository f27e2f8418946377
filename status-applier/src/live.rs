//! The live objects the applier manages, as the API server last showed them: one watch per
//! kind, updated also from the answers of our own applies, so that checking whether an
//! apply would change anything costs no request.
//!
//! Every object enters here, and only here (watch events, reads, apply answers), and is cut
//! down at once to what planning reads of it ([`crate::view`]) before it is kept: the full
//! object never stays in memory.

use crate::error::ApplyError;
use crate::intent::ObjectRef;
use crate::view::{Keep, Keeps, View};
use compact_json::Dictionaries;
use diagnostics::{WatchHealth, WatchReport};
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::Scope;
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

type ObjectName = (Option<String>, String);

/// One kind the applier has met: how to reach it, and the cache of its objects.
pub struct Kind {
    /// The resource, as discovered.
    pub resource: ApiResource,
    /// Whether objects of the kind live in namespaces.
    pub namespaced: bool,
    objects: RwLock<HashMap<ObjectName, Arc<View>>>,
    /// What its views are compacted against: views of one kind are alike.
    dictionaries: Dictionaries,
}

impl Kind {
    /// The API of one object's namespace (or of the cluster, for cluster-scoped kinds).
    pub fn api(&self, client: &kube::Client, namespace: Option<&str>) -> Api<DynamicObject> {
        match (self.namespaced, namespace) {
            (true, Some(ns)) => Api::namespaced_with(client.clone(), ns, &self.resource),
            _ => Api::all_with(client.clone(), &self.resource),
        }
    }

    fn cached(&self, name: &ObjectName) -> Option<Arc<View>> {
        self.objects.read().expect("lock").get(name).cloned()
    }

    /// Keeps `obj`, cut down to what `keeps` names for it, unless the cache holds a newer
    /// version of it; answers the kept object, or `None` when the cache already had a newer one.
    fn observe(&self, obj: DynamicObject, keeps: &Keeps) -> Option<Arc<View>> {
        let name = (
            obj.metadata.namespace.clone(),
            obj.metadata.name.clone().unwrap_or_default(),
        );
        let keep = keeps.of(&object_ref(self, &obj));
        let obj = View::strip(obj, keep, &self.dictionaries);
        let mut objects = self.objects.write().expect("lock");
        if let Some(current) = objects.get(&name)
            && current.metadata.uid == obj.metadata.uid
            && version(current) > version(&obj)
        {
            return None;
        }
        let kept = Arc::new(obj);
        objects.insert(name, kept.clone());
        Some(kept)
    }
}

/// The resourceVersion as a number: etcd revisions only grow, so for one object a larger
/// number is newer. An unparseable version counts as newest.
fn version(obj: &View) -> u64 {
    obj.revision().unwrap_or(u64::MAX)
}

/// A change the watches saw: the object as cached now, or `None` once it is deleted.
pub type Change = (ObjectRef, Option<Arc<View>>);

/// Which objects the cache watches: those of one namespace (cluster-scoped kinds are
/// watched whole), those matching a label selector, or every one. An intent for an object
/// outside is still served: the object is read when needed, and an apply planned on a read
/// that went stale is refused (409) and planned again on a new read.
#[derive(Clone, Debug, Default)]
pub struct WatchScope {
    /// One namespace.
    pub namespace: Option<String>,
    /// A label selector (`key=value,...`).
    pub label_selector: Option<String>,
}

/// The caches of every kind met so far.
pub struct Live {
    client: kube::Client,
    scope: WatchScope,
    kinds: tokio::sync::Mutex<HashMap<(String, String), Arc<Kind>>>,
    changes: mpsc::UnboundedSender<Change>,
    keeps: Arc<Keeps>,
    health: WatchHealth,
}

impl Live {
    /// A cache that reports every object change it sees on `changes`, and keeps of every
    /// object the applies of `managers` (the allowed ones) with what they own. Its watches
    /// report on themselves to `health`.
    pub fn new(
        client: kube::Client,
        changes: mpsc::UnboundedSender<Change>,
        managers: &[String],
        scope: WatchScope,
        health: WatchHealth,
    ) -> Self {
        Self {
            client,
            scope,
            kinds: Default::default(),
            changes,
            keeps: Arc::new(Keeps::new(managers)),
            health,
        }
    }

    /// Whether each watch has listed its kind, and whether one keeps failing.
    pub fn health(&self) -> &WatchHealth {
        &self.health
    }

    /// From now on, keeps of `object` what `keep` names besides the allowed managers' applies.
    pub fn keep(&self, object: ObjectRef, keep: &Keep) {
        self.keeps.set(object, keep);
    }

    /// Forgets what was to be kept of a deleted `object`.
    pub fn forget(&self, object: &ObjectRef) {
        self.keeps.forget(object);
    }

    /// The client.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The kind of `apiVersion`/`kind`, discovered and watched on first use.
    pub async fn kind(&self, api_version: &str, kind: &str) -> Result<Arc<Kind>, ApplyError> {
        let mut kinds = self.kinds.lock().await;
        let id = (api_version.to_owned(), kind.to_owned());
        if let Some(found) = kinds.get(&id) {
            return Ok(found.clone());
        }
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, caps) = kube::discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| ApplyError::UnknownKind(format!("{kind}.{api_version}"), e.to_string()))?;
        let found = Arc::new(Kind {
            resource,
            namespaced: caps.scope == Scope::Namespaced,
            objects: Default::default(),
            dictionaries: Dictionaries::default(),
        });
        tokio::spawn(watch(
            self.client.clone(),
            self.scope.clone(),
            found.clone(),
            (self.changes.clone(), self.health.watch(kind)),
            self.keeps.clone(),
        ));
        kinds.insert(id, found.clone());
        Ok(found)
    }

    /// The object as the cache holds it, if it does (no request).
    pub fn cached(&self, kind: &Kind, obj: &ObjectRef) -> Option<Arc<View>> {
        kind.cached(&(obj.namespace.clone(), obj.name.clone()))
    }

    /// Reads an object from the API server, not the cache, and caches what it found (unless
    /// the cache already holds a newer version, which is then answered).
    pub async fn reread(
        &self,
        kind: &Kind,
        obj: &ObjectRef,
    ) -> Result<Option<Arc<View>>, ApplyError> {
        match kind
            .api(&self.client, obj.namespace.as_deref())
            .get_opt(&obj.name)
            .await
        {
            Ok(Some(found)) => Ok(self.observe(kind, found)),
            Ok(None) => Ok(None),
            Err(e) => Err(ApplyError::from_kube(e)),
        }
    }

    /// Records an object the API server answered (an apply's answer, a read); answers the
    /// newest version the cache now holds.
    pub fn observe(&self, kind: &Kind, obj: DynamicObject) -> Option<Arc<View>> {
        let name = (
            obj.metadata.namespace.clone(),
            obj.metadata.name.clone().unwrap_or_default(),
        );
        kind.observe(obj, &self.keeps)
            .or_else(|| kind.cached(&name))
    }
}

/// Caches a watched object and reports it, unless the cache already held a newer version.
fn observed(
    kind: &Kind,
    obj: DynamicObject,
    keeps: &Keeps,
    changes: &mpsc::UnboundedSender<Change>,
) {
    let changed = object_ref(kind, &obj);
    if let Some(kept) = kind.observe(obj, keeps) {
        let _ = changes.send((changed, Some(kept)));
    }
}

fn object_ref(kind: &Kind, obj: &DynamicObject) -> ObjectRef {
    ObjectRef {
        api_version: kind.resource.api_version.clone(),
        kind: kind.resource.kind.clone(),
        namespace: obj.metadata.namespace.clone(),
        name: obj.metadata.name.clone().unwrap_or_default(),
    }
}

/// Whether `obj` reached the watch as a stub, nested too deep or too large to be read
/// (`diagnostics::guard`): it is logged and not cached (a copy cached before goes), so that
/// an apply to it reads it anew, and fails alone, instead of being planned against a stub;
/// every other object of its list page or watch is read as usual.
fn unreadable(kind: &Kind, obj: &DynamicObject) -> bool {
    let Some(why) = diagnostics::guard::unreadable(&obj.data) else {
        return false;
    };
    let name = (
        obj.metadata.namespace.clone(),
        obj.metadata.name.clone().unwrap_or_default(),
    );
    warn!(
        kind = %kind.resource.kind,
        namespace = name.0.as_deref().unwrap_or_default(),
        name = name.1,
        error = why.message,
        "Object cannot be read; not cached until it changes"
    );
    kind.objects.write().expect("lock").remove(&name);
    true
}

async fn watch(
    client: kube::Client,
    scope: WatchScope,
    kind: Arc<Kind>,
    (changes, health): (mpsc::UnboundedSender<Change>, WatchReport),
    keeps: Arc<Keeps>,
) {
    let api: Api<DynamicObject> = match &scope.namespace {
        Some(ns) if kind.namespaced => Api::namespaced_with(client, ns, &kind.resource),
        _ => Api::all_with(client, &kind.resource),
    };
    let mut config = watcher::Config::default().page_size(50);
    if let Some(selector) = &scope.label_selector {
        config = config.labels(selector);
    }
    // Lists in pages of 50 (kube-rs lists 500 at once by default): every object of a page is
    // parsed whole before it is cut down, and four kinds list at once. 50 halved the listing
    // peak at 4,000 objects (status-applier/examples/memory.rs: 77 → 34 MiB); streaming lists
    // (WatchList) did as well (29 MiB) but need an API server that serves them.
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut listed: HashSet<ObjectName> = HashSet::new();
    info!(kind = %kind.resource.kind, "Watching");
    while let Some(event) = events.next().await {
        // Only a completed list or a watched change resets the failures (not a page of a
        // list that may fail later): `WatchReport::saw`.
        health.saw(&event, std::time::Instant::now());
        match event {
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitApply(obj) | watcher::Event::Apply(obj))
                if unreadable(&kind, &obj) => {}
            Ok(watcher::Event::InitApply(obj)) => {
                listed.insert((
                    obj.metadata.namespace.clone(),
                    obj.metadata.name.clone().unwrap_or_default(),
                ));
                observed(&kind, obj, &keeps, &changes);
            }
            Ok(watcher::Event::Apply(obj)) => observed(&kind, obj, &keeps, &changes),
            Ok(watcher::Event::InitDone) => {
                kind.objects
                    .write()
                    .expect("lock")
                    .retain(|name, _| listed.contains(name));
                debug!(kind = %kind.resource.kind, objects = listed.len(), "Cache synced");
                // The names are needed only to sweep after a (re)list: kept past it, every
                // object ever seen, deleted ones too, would stay here until the next one.
                listed = HashSet::new();
            }
            Ok(watcher::Event::Delete(obj)) => {
                let name = (
                    obj.metadata.namespace.clone(),
                    obj.metadata.name.clone().unwrap_or_default(),
                );
                kind.objects.write().expect("lock").remove(&name);
                let _ = changes.send((object_ref(&kind, &obj), None));
            }
            Err(e) => {
                warn!(kind = %kind.resource.kind, error = %e, "Watch failed; retrying with backoff")
            }
        }
    }
}
