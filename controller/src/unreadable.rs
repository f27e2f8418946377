//! Objects the API server accepted and our types cannot read: each object is decoded alone,
//! so that one that does not fit costs only itself.
//!
//! kube-rs decodes a typed list as a whole: one object that does not fit the Rust type fails
//! the list, and every relist, of its whole kind, and the caches never sync (a tenant's
//! Cluster with an endpoint but no port stopped every reconcile of every tenant). A watch of
//! [`Decoded<K>`] instead reads each object as JSON first and then as `K`, keeping what does
//! not fit as [`Decoded::Unreadable`]: its identity and the decode error. The watch caches
//! only readable objects and reports the others here ([`UnreadableReport`]): a log line, a
//! Warning Event on the object (reason [`UNREADABLE_REASON`]), and the gauge
//! `capt_objects_unreadable{kind}`, which falls back once the object is fixed or deleted.
//!
//! An object nested too deep, or too large, for a list page or a watch event to be parsed
//! at all reaches the watch as a stub (the client's layer, `diagnostics::guard`): it is
//! unreadable too, with what the layer found (`nested 200 levels deep, over the limit of
//! 100`).

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::de::{Deserialize, DeserializeOwned, Deserializer};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::metrics::KindLabel;

/// The reason of the Warning Event on an object that cannot be read.
pub const UNREADABLE_REASON: &str = "Unreadable";

/// An Event's note is at most 1 KiB: the decode error is cut to fit beside the rest.
const MAX_ERROR_IN_NOTE: usize = 800;

/// An object as its watch decoded it.
#[derive(Clone, Debug, PartialEq)]
pub enum Decoded<K> {
    /// It fits `K`.
    Readable(K),
    /// It does not (rare: boxed, so that a readable object carries no room for it).
    Unreadable(Box<Unreadable>),
}

/// What is known of an object that does not fit its type: who it is, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Unreadable {
    /// Its name, namespace, uid and resourceVersion, nothing else.
    pub meta: ObjectMeta,
    /// Where and why it does not fit (`spec.controlPlaneEndpoint: missing field `port``).
    pub error: String,
    /// Its size in bytes, when it is unreadable for being too large (only its identity
    /// reached the watch).
    pub too_large: Option<u64>,
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Decoded<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(Self::from_value)
    }
}

impl<K: DeserializeOwned> Decoded<K> {
    /// Reads `value` as `K`, or keeps why it does not fit. The value is moved into `K`
    /// (its strings are not copied again); the path to the field that does not fit is
    /// tracked as it goes.
    pub fn from_value(value: Value) -> Self {
        let meta = identity(&value);
        if let Some(stub) = diagnostics::guard::unreadable(&value) {
            return Self::Unreadable(Box::new(Unreadable {
                meta,
                error: stub.message,
                too_large: stub.bytes,
            }));
        }
        match serde_path_to_error::deserialize(value) {
            Ok(object) => Self::Readable(object),
            Err(error) => Self::Unreadable(Box::new(Unreadable {
                meta,
                error: match error.path().to_string().as_str() {
                    "." => error.inner().to_string(),
                    path => format!("{path}: {}", error.inner()),
                },
                too_large: None,
            })),
        }
    }
}

/// The name, namespace, uid and resourceVersion of an object as JSON.
fn identity(value: &Value) -> ObjectMeta {
    let field = |name: &str| value["metadata"][name].as_str().map(str::to_owned);
    ObjectMeta {
        name: field("name"),
        namespace: field("namespace"),
        uid: field("uid"),
        resource_version: field("resourceVersion"),
        ..ObjectMeta::default()
    }
}

/// Watched as `K` is: its API's URL and scope are `K`'s.
impl<K: Resource> Resource for Decoded<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Self::Readable(object) => object.meta(),
            Self::Unreadable(u) => &u.meta,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Self::Readable(object) => object.meta_mut(),
            Self::Unreadable(u) => &mut u.meta,
        }
    }
}

/// `namespace`/`name` of an object (`namespace` `None`: cluster-scoped).
type Name = (Option<String>, String);

fn name_of(meta: &ObjectMeta) -> Name {
    (
        meta.namespace.clone(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// Every kind's unreadable objects, and where they are reported. Cloning shares it.
#[derive(Clone)]
pub struct Unreadables {
    kinds: Arc<Mutex<HashMap<String, Kind>>>,
    gauge: Family<KindLabel, Gauge>,
    events: Option<Recorder>,
}

#[derive(Default)]
struct Kind {
    /// Each unreadable object, with the resourceVersion it was last reported at.
    objects: HashMap<Name, Option<String>>,
    /// During a relist: the unreadable objects it has shown so far.
    relisted: Option<HashSet<Name>>,
}

impl Unreadables {
    /// Counts them in `gauge`; publishes a Warning Event about each with `events` (`None`: no
    /// Events, in tests without an API server).
    pub fn new(gauge: Family<KindLabel, Gauge>, events: Option<Recorder>) -> Self {
        Self {
            kinds: Arc::default(),
            gauge,
            events,
        }
    }

    /// The report of the kind `K`; its gauge is served from now on, at 0.
    pub fn of<K: Resource<DynamicType = ()>>(&self) -> UnreadableReport {
        let kind = K::kind(&()).into_owned();
        let _ = self.gauge.get_or_create(&KindLabel { kind: kind.clone() });
        UnreadableReport {
            unreadables: self.clone(),
            api_version: K::api_version(&()).into_owned(),
            kind,
        }
    }

    /// How many objects of `kind` cannot be read now.
    pub fn count(&self, kind: &str) -> usize {
        let kinds = self.kinds.lock().expect("lock");
        kinds.get(kind).map_or(0, |k| k.objects.len())
    }
}

/// Where the watch of one kind reports what it cannot read.
#[derive(Clone)]
pub struct UnreadableReport {
    unreadables: Unreadables,
    api_version: String,
    kind: String,
}

impl UnreadableReport {
    /// `object` cannot be read: reported the first time it is seen at its resourceVersion.
    pub fn unreadable(&self, object: &Unreadable) {
        let name = name_of(&object.meta);
        let version = object.meta.resource_version.clone();
        let new = self.update(|k| {
            if let Some(relisted) = k.relisted.as_mut() {
                relisted.insert(name.clone());
            }
            k.objects.insert(name.clone(), version.clone()) != Some(version)
        });
        if new {
            self.report(object);
        }
    }

    /// The object `meta` names is readable (again), or gone.
    pub fn resolved(&self, meta: &ObjectMeta) {
        let name = name_of(meta);
        self.update(|k| k.objects.remove(&name));
    }

    /// A relist starts: what it does not show again is resolved when it ends.
    pub fn relisting(&self) {
        self.update(|k| k.relisted = Some(HashSet::new()));
    }

    /// The relist ended.
    pub fn relisted(&self) {
        self.update(|k| {
            if let Some(seen) = k.relisted.take() {
                k.objects.retain(|name, _| seen.contains(name));
            }
        });
    }

    fn update<T>(&self, f: impl FnOnce(&mut Kind) -> T) -> T {
        let mut kinds = self.unreadables.kinds.lock().expect("lock");
        let kind = kinds.entry(self.kind.clone()).or_default();
        let result = f(kind);
        let count = i64::try_from(kind.objects.len()).unwrap_or(i64::MAX);
        self.unreadables
            .gauge
            .get_or_create(&KindLabel {
                kind: self.kind.clone(),
            })
            .set(count);
        result
    }

    /// The log line and the Warning Event about `object`.
    fn report(&self, object: &Unreadable) {
        let meta = &object.meta;
        tracing::warn!(
            kind = self.kind,
            namespace = meta.namespace.as_deref().unwrap_or_default(),
            name = meta.name.as_deref().unwrap_or_default(),
            error = object.error,
            "Object cannot be read; skipped until it changes"
        );
        let Some(recorder) = self.unreadables.events.clone() else {
            return;
        };
        let mut error = object.error.clone();
        if error.len() > MAX_ERROR_IN_NOTE {
            let mut cut = MAX_ERROR_IN_NOTE;
            while !error.is_char_boundary(cut) {
                cut -= 1;
            }
            error.truncate(cut);
            error.push('…');
        }
        let event = Event {
            type_: EventType::Warning,
            reason: UNREADABLE_REASON.into(),
            note: Some(format!(
                "capt-controller cannot read this {}: {error}. It is skipped (not reconciled) \
                 until it is changed to a form the controller reads, or deleted; other \
                 objects are not affected",
                self.kind
            )),
            action: "Read".into(),
            secondary: None,
        };
        let regarding = ObjectReference {
            api_version: Some(self.api_version.clone()),
            kind: Some(self.kind.clone()),
            namespace: meta.namespace.clone(),
            name: meta.name.clone(),
            uid: meta.uid.clone(),
            ..ObjectReference::default()
        };
        tokio::spawn(async move {
            if let Err(error) = recorder.publish(&event, &regarding).await {
                tracing::warn!(
                    object = regarding.name,
                    %error,
                    "Could not publish an Event"
                );
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Cluster;
    use serde_json::json;

    fn cluster(name: &str, endpoint: Value) -> Value {
        json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": name, "namespace": "mallory", "uid": "u-1",
                "resourceVersion": "7"},
            "spec": {"controlPlaneEndpoint": endpoint},
        })
    }

    #[test]
    fn an_object_that_does_not_fit_its_type_is_kept_as_its_identity_and_the_path_of_the_error() {
        let odd = cluster("poison", json!({"host": 42}));
        let Decoded::<Cluster>::Unreadable(u) = serde_json::from_value(odd).unwrap() else {
            panic!("a number for a host is not readable");
        };
        assert_eq!(u.meta.name.as_deref(), Some("poison"));
        assert_eq!(u.meta.namespace.as_deref(), Some("mallory"));
        assert_eq!(u.meta.uid.as_deref(), Some("u-1"));
        assert_eq!(u.meta.resource_version.as_deref(), Some("7"));
        assert!(
            u.error
                .starts_with("spec.controlPlaneEndpoint.host: invalid type: integer `42`"),
            "{}",
            u.error
        );
    }

    #[test]
    fn a_stub_of_the_clients_layer_is_unreadable_with_what_the_layer_found() {
        let stub = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "deep", "namespace": "mallory", "uid": "u-2",
                "resourceVersion": "8"},
            diagnostics::guard::UNREADABLE_FIELD: {
                "message": "nested 204 levels deep, over the limit of 100", "depth": 204},
        });
        let Decoded::<Cluster>::Unreadable(u) = serde_json::from_value(stub).unwrap() else {
            panic!("a stub is not readable");
        };
        assert_eq!(u.meta.name.as_deref(), Some("deep"));
        assert_eq!(u.meta.uid.as_deref(), Some("u-2"));
        assert_eq!(u.error, "nested 204 levels deep, over the limit of 100");
        assert_eq!(u.too_large, None);
    }

    #[test]
    fn a_list_with_one_object_that_does_not_fit_keeps_every_other_object() {
        let list = json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "ClusterList",
            "metadata": {"resourceVersion": "9"},
            "items": [
                cluster("a", json!({"host": "a.example.com", "port": 443})),
                cluster("poison", json!({"host": 42})),
                cluster("b", json!({"host": "b.example.com", "port": 6443})),
            ],
        });
        let list: kube::core::ObjectList<Decoded<Cluster>> =
            serde_json::from_value(list).expect("the list decodes");
        let readable: Vec<_> = list
            .items
            .iter()
            .filter_map(|d| match d {
                Decoded::Readable(c) => c.metadata.name.as_deref(),
                Decoded::Unreadable(_) => None,
            })
            .collect();
        assert_eq!(readable, ["a", "b"]);
        // And as kube-rs decodes it, from the response's text: the same.
        let text = serde_json::to_string(&json!({
            "type": "MODIFIED",
            "object": cluster("poison", json!({"host": 42})),
        }))
        .unwrap();
        let event: kube::core::WatchEvent<Decoded<Cluster>> =
            serde_json::from_str(&text).expect("the event decodes");
        assert!(matches!(
            event,
            kube::core::WatchEvent::Modified(Decoded::Unreadable(_))
        ));
    }

    #[test]
    fn the_gauge_counts_each_unreadable_object_until_it_is_resolved_or_not_relisted() {
        let gauge = Family::<KindLabel, Gauge>::default();
        let unreadables = Unreadables::new(gauge.clone(), None);
        let report = unreadables.of::<Cluster>();
        let odd = |name: &str, version: &str| Unreadable {
            meta: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("mallory".into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            error: "missing field `port`".into(),
            too_large: None,
        };
        let count = || {
            gauge
                .get_or_create(&KindLabel {
                    kind: "Cluster".into(),
                })
                .get()
        };
        report.unreadable(&odd("p", "1"));
        report.unreadable(&odd("p", "2"));
        report.unreadable(&odd("q", "1"));
        assert_eq!(count(), 2);
        report.resolved(&odd("p", "3").meta);
        assert_eq!(count(), 1);
        // A relist that no longer shows "q" (deleted while the watch was away).
        report.relisting();
        report.unreadable(&odd("r", "1"));
        report.relisted();
        assert_eq!(count(), 1);
        assert_eq!(unreadables.count("Cluster"), 1);
    }
}
