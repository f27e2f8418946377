//! Property test of the applier's pure core among foreign writers.
//!
//! Random sequences of intents (merges, nulls, releases, the replaced `atProvider`) for the
//! two documents of our manager (status and main resource) are interleaved with foreign
//! writes: server-side applies (forced or not) and updates (merge patches), on fields we also
//! want, protected ones included. Two independent references judge every step:
//!
//! * a model of the merge rules of docs/status-applier.md, kept as flat `path -> value` maps, predicts our
//!   desired documents and the protected paths an intent keeps;
//! * a small simulation of the API server's server-side apply (`managedFields` per manager,
//!   operation and subresource; a 409 for a non-forced apply that changes a value another
//!   manager owns; a forced apply or an update takes ownership; an apply removes a field only
//!   when its last owner stops applying it) plays the object.
//!
//! The applier's pure core (`merge::merge_fragment`, then `apply::plan_on_object` against the
//! simulated object and its `managedFields`) must agree with the model on every step: the desired
//! documents, the conflicts it predicts, what it leaves out of the apply body, whether it
//! forces, and whether it skips the apply. Invariants: the server never refuses an apply the
//! core planned; no apply of ours removes a protected path the intent did not release, nor
//! takes a field of a protected path from another owner; a skipped apply would have changed
//! nothing, every write changes something, and the applier reaches a steady state; once
//! settled, every field we want that no foreign manager owns is on the object as ours, and a
//! protected path our document holds is on the object, equal to our document where no
//! foreign manager owns a field of it.
//!
//! The simulation follows what the real API server was seen to do (see
//! `tests/tests/replay_seeded.rs` for the same kind of sequences against it): an update owns
//! the maps it creates (`.`), an apply owns the maps below `atProvider` (a
//! `x-kubernetes-preserve-unknown-fields` subtree), an apply of an empty object owns that
//! field itself, a manager that loses the fields below such a map keeps owning the map.
//! Proptest saves the cases that failed in `foreign_model.proptest-regressions` beside this
//! file and replays them first; `PROPTEST_CASES` changes the number of cases.

use kube::api::DynamicObject;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestCaseError;
use serde_json::{Map, Value, json};
use status_applier::apply::plan_on_object;
use status_applier::config::{GroupKind, PathRules, Policy};
use status_applier::intent::{DesiredKey, ObjectRef, Subresource};
use status_applier::merge::merge_fragment;
use status_applier::policy::PolicyFile;
use std::collections::{BTreeMap, BTreeSet};

/// Field names from the root.
type Path = Vec<String>;
/// Scalar leaves by path.
type Flat = BTreeMap<Path, Value>;

const OURS: &str = "capt-captcontrolplane";
const FOREIGN: [&str; 2] = ["foreign-a", "foreign-b"];
const API_VERSION: &str = "controlplane.cluster.x-k8s.io/v1beta1";
/// The subresource of each of our documents: 0 is the status, 1 the main resource.
const SUBRESOURCE: [&str; 2] = ["status", ""];
/// The model's rules, written down independently of the policy file the applier reads
/// (CAPT's, `manifests/deploy/status-applier-policy.yaml`).
const PROTECTED: [&str; 2] = [
    "status.workspaceStatus.atProvider",
    "spec.controlPlaneEndpoint",
];
const REPLACED: [&str; 1] = ["status.workspaceStatus.atProvider"];
/// Below this path the schema preserves unknown fields: an apply owns the maps there too.
const DEDUCED: &str = "status.workspaceStatus.atProvider";

fn path(s: &str) -> Path {
    s.split('.').map(str::to_owned).collect()
}

fn show(p: &[String]) -> String {
    format!(".{}", p.join("."))
}

fn is_under(p: &[String], prefix: &str) -> bool {
    p.starts_with(&path(prefix))
}

fn fail(message: impl Into<String>) -> TestCaseError {
    TestCaseError::fail(message.into())
}

fn ensure(ok: bool, message: impl FnOnce() -> String) -> Result<(), TestCaseError> {
    if ok { Ok(()) } else { Err(fail(message())) }
}

// ---------------------------------------------------------------------------------------
// JSON helpers of the model

/// The value at `p`.
fn get<'a>(v: &'a Value, p: &[String]) -> Option<&'a Value> {
    p.iter().try_fold(v, |here, k| here.get(k))
}

/// Every scalar leaf, nulls included (an applier document or body must not hold one).
fn flatten(v: &Value) -> Flat {
    fn walk(v: &Value, p: &mut Path, out: &mut Flat) {
        match v {
            Value::Object(map) => {
                for (k, x) in map {
                    p.push(k.clone());
                    walk(x, p, out);
                    p.pop();
                }
            }
            other => {
                out.insert(p.clone(), other.clone());
            }
        }
    }
    let mut out = Flat::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// What a document or object holds: its scalar leaves, without nulls.
fn content(v: &Value) -> Flat {
    let mut flat = flatten(v);
    flat.retain(|_, x| !x.is_null());
    flat
}

fn under(flat: &Flat, prefix: &str) -> Flat {
    flat.iter()
        .filter(|(p, _)| is_under(p, prefix))
        .map(|(p, v)| (p.clone(), v.clone()))
        .collect()
}

fn unflatten(flat: &Flat) -> Value {
    let mut out = json!({});
    for (p, v) in flat {
        let mut here = &mut out;
        for k in &p[..p.len() - 1] {
            here = here
                .as_object_mut()
                .expect("objects on the way")
                .entry(k.clone())
                .or_insert_with(|| json!({}));
        }
        here[p.last().expect("non-empty path")] = v.clone();
    }
    out
}

/// The paths of the empty objects in `v` (the root aside).
fn empty_objects(v: &Value) -> BTreeSet<Path> {
    fn walk(v: &Value, p: &mut Path, out: &mut BTreeSet<Path>) {
        if let Value::Object(map) = v {
            if map.is_empty() && !p.is_empty() {
                out.insert(p.clone());
            }
            for (k, x) in map {
                p.push(k.clone());
                walk(x, p, out);
                p.pop();
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// True when `set` owns the node at `p` itself: `p`, or an ancestor it owns whole (a path
/// with nothing of the set below it).
fn owns_node(set: &BTreeSet<Path>, p: &[String]) -> bool {
    set.iter().any(|q| {
        p.starts_with(q)
            && (q.len() == p.len() || !set.iter().any(|r| r.len() > q.len() && r.starts_with(q)))
    })
}

/// The first `null` in `v`, if any.
fn null_in(v: &Value) -> Option<String> {
    fn walk(v: &Value, p: &mut Path) -> Option<String> {
        match v {
            Value::Null => Some(format!("null at {}", show(p))),
            Value::Object(map) => map.iter().find_map(|(k, x)| {
                p.push(k.clone());
                let found = walk(x, p);
                p.pop();
                found
            }),
            _ => None,
        }
    }
    walk(v, &mut Vec::new())
}

/// How an apply merges its configuration into the live object: maps key by key, anything
/// else replaced. An empty object creates the field if it is missing.
fn merge_apply(target: &mut Value, config: &Value) {
    match (target.as_object_mut(), config) {
        (Some(map), Value::Object(config)) => {
            for (k, v) in config {
                let slot = map.entry(k.clone()).or_insert_with(|| json!({}));
                if v.is_object() && !slot.is_object() {
                    *slot = json!({});
                }
                merge_apply(slot, v);
            }
        }
        (_, config) => *target = config.clone(),
    }
}

fn remove(v: &mut Value, p: &[String]) {
    let (last, parents) = p.split_last().expect("non-empty path");
    if let Some(Value::Object(map)) = parents.iter().try_fold(v, |here, k| here.get_mut(k)) {
        map.remove(last);
    }
}

// ---------------------------------------------------------------------------------------
// The model of the merge rules

/// Our desired document after a fragment, and the protected paths it kept: RFC 7386 on the
/// leaves, a replaced subtree taken whole from a fragment that carries it, and a protected
/// path that had leaves and has none now restored unless released.
fn model_merge(before: &Flat, fragment: &Value, release: &[Path]) -> (Flat, Vec<String>) {
    fn patch(out: &mut Flat, v: &Value, p: &mut Path) {
        let Value::Object(map) = v else { return };
        for (k, x) in map {
            p.push(k.clone());
            match x {
                Value::Null => out.retain(|q, _| !q.starts_with(p)),
                Value::Object(_) => {
                    out.remove(p.as_slice());
                    patch(out, x, p);
                }
                scalar => {
                    out.retain(|q, _| !q.starts_with(p));
                    out.insert(p.clone(), scalar.clone());
                }
            }
            p.pop();
        }
    }
    let mut out = before.clone();
    patch(&mut out, fragment, &mut Vec::new());
    for replaced in REPLACED {
        let r = path(replaced);
        if let Some(v) = get(fragment, &r).filter(|v| v.is_object()) {
            out.retain(|q, _| !q.starts_with(&r));
            for (q, x) in content(v) {
                out.insert(r.iter().chain(&q).cloned().collect(), x);
            }
        }
    }
    let mut kept = Vec::new();
    for protected in PROTECTED {
        let pp = path(protected);
        if release.iter().any(|r| pp.starts_with(r)) {
            continue;
        }
        let had = under(before, protected);
        if !had.is_empty() && under(&out, protected).is_empty() {
            out.extend(had);
            kept.push(protected.to_owned());
        }
    }
    (out, kept)
}

// ---------------------------------------------------------------------------------------
// The simulated API server

/// A `managedFields` entry's identity: manager, operation, subresource.
type EntryId = (String, &'static str, &'static str);

/// What server-side apply changes between two versions of an object.
#[derive(Default)]
struct Diff {
    modified: BTreeSet<Path>,
    added: BTreeSet<Path>,
    removed: BTreeSet<Path>,
}

fn diff(old: &Value, new: &Value) -> Diff {
    fn all(v: &Value, p: &mut Path, out: &mut BTreeSet<Path>) {
        out.insert(p.clone());
        if let Value::Object(map) = v {
            for (k, x) in map {
                p.push(k.clone());
                all(x, p, out);
                p.pop();
            }
        }
    }
    fn walk(old: &Value, new: &Value, p: &mut Path, d: &mut Diff) {
        match (old, new) {
            (Value::Object(o), Value::Object(n)) => {
                let keys: BTreeSet<&String> = o.keys().chain(n.keys()).collect();
                for k in keys {
                    p.push(k.clone());
                    match (o.get(k), n.get(k)) {
                        (Some(a), Some(b)) => walk(a, b, p, d),
                        (None, Some(b)) => all(b, p, &mut d.added),
                        (Some(a), None) => all(a, p, &mut d.removed),
                        (None, None) => {}
                    }
                    p.pop();
                }
            }
            (a, b) if a != b => {
                d.modified.insert(p.clone());
            }
            _ => {}
        }
    }
    let mut d = Diff::default();
    walk(old, new, &mut Vec::new(), &mut d);
    d
}

/// The fields an apply of `config` owns: its scalar leaves, its empty objects, and the maps
/// below the deduced subtree.
fn claims(config: &Value) -> BTreeSet<Path> {
    fn walk(v: &Value, p: &mut Path, out: &mut BTreeSet<Path>) {
        let Value::Object(map) = v else { return };
        for (k, x) in map {
            p.push(k.clone());
            match x {
                Value::Object(m) if !m.is_empty() => {
                    if p.len() > path(DEDUCED).len() && is_under(p, DEDUCED) {
                        out.insert(p.clone());
                    }
                    walk(x, p, out);
                }
                _ => {
                    out.insert(p.clone());
                }
            }
            p.pop();
        }
    }
    let mut out = BTreeSet::new();
    walk(config, &mut Vec::new(), &mut out);
    out
}

/// `managedFields[].fieldsV1` of a set of owned paths.
fn fields_v1(set: &BTreeSet<Path>) -> Value {
    #[derive(Default)]
    struct Node {
        member: bool,
        children: BTreeMap<String, Node>,
    }
    fn render(n: &Node) -> Value {
        let mut map = Map::new();
        if n.member && !n.children.is_empty() {
            map.insert(".".into(), json!({}));
        }
        for (k, c) in &n.children {
            map.insert(k.clone(), render(c));
        }
        Value::Object(map)
    }
    let mut root = Node::default();
    for p in set {
        let node = p.iter().fold(&mut root, |n, k| {
            n.children.entry(format!("f:{k}")).or_default()
        });
        node.member = true;
    }
    render(&root)
}

/// One object (its `spec` and `status`) and its `managedFields`.
#[derive(Clone, Debug, PartialEq)]
struct Server {
    live: Value,
    entries: BTreeMap<EntryId, BTreeSet<Path>>,
}

impl Server {
    /// The object as created: its spec written by an update of its creator.
    fn new() -> Self {
        let mut entries = BTreeMap::new();
        entries.insert(
            ("creator".to_owned(), "Update", ""),
            [path("spec"), path("spec.version")].into_iter().collect(),
        );
        Self {
            live: json!({"spec": {"version": "v0"}}),
            entries,
        }
    }

    /// The scalar at `p`, if any.
    fn leaf(&self, p: &[String]) -> Option<&Value> {
        get(&self.live, p).filter(|v| !v.is_object() && !v.is_null())
    }

    /// The object as the applier reads it.
    fn object(&self) -> DynamicObject {
        let managed: Vec<Value> = self
            .entries
            .iter()
            .map(|((manager, operation, sub), set)| {
                let mut e = json!({"manager": manager, "operation": operation, "apiVersion": API_VERSION,
                                   "fieldsType": "FieldsV1", "fieldsV1": fields_v1(set)});
                if !sub.is_empty() {
                    e["subresource"] = json!(sub);
                }
                e
            })
            .collect();
        let mut object = json!({"apiVersion": API_VERSION, "kind": "CAPTControlPlane",
            "metadata": {"name": "demo", "namespace": "model", "uid": "uid-1", "resourceVersion": "1",
                         "managedFields": managed}});
        for (k, v) in self.live.as_object().expect("an object") {
            object[k] = v.clone();
        }
        serde_json::from_value(object).expect("a valid object")
    }

    /// True when some entry owns `p` or a field below it.
    fn covered(entries: &BTreeMap<EntryId, BTreeSet<Path>>, p: &[String]) -> bool {
        entries.values().any(|s| s.iter().any(|q| q.starts_with(p)))
    }

    /// A server-side apply; answers whether anything changed, or the conflicts of a 409.
    fn apply(
        &mut self,
        manager: &str,
        sub: &'static str,
        config: &Value,
        force: bool,
    ) -> Result<bool, Vec<String>> {
        let id: EntryId = (manager.to_owned(), "Apply", sub);
        let claimed = claims(config);
        let last = self.entries.get(&id).cloned().unwrap_or_default();
        let mut entries = self.entries.clone();
        entries.insert(id.clone(), claimed.clone());
        let mut live = self.live.clone();
        merge_apply(&mut live, config);
        // What this manager applied before and applies no more goes, unless another owner
        // keeps it; maps left empty by that go with it, unless owned. A map this manager
        // owned as such goes whole unless another entry owns the map itself: the real API
        // server then drops the fields other managers own in it too (and, where that leaves
        // a parent empty, writes `null` there, which the CRD refuses with a 422). Either is
        // a loss of another manager's fields, refused here.
        let mut gone: Vec<&Path> = last.difference(&claimed).collect();
        gone.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in gone {
            if let Some(Value::Object(map)) = get(&live, p)
                && !map.is_empty()
            {
                if entries
                    .iter()
                    .any(|(other, set)| *other != id && set.contains(p))
                {
                    continue;
                }
                let taken: Vec<String> = entries
                    .iter()
                    .filter(|(other, _)| **other != id)
                    .flat_map(|((m, _, _), set)| {
                        set.iter()
                            .filter(|q| q.len() > p.len() && q.starts_with(p))
                            .map(move |q| format!("{} owned by {m}", show(q)))
                    })
                    .collect();
                if !taken.is_empty() {
                    return Err(taken
                        .into_iter()
                        .map(|t| format!("422: {} removed with {t}", show(p)))
                        .collect());
                }
                continue;
            }
            if Self::covered(&entries, p) {
                continue;
            }
            match get(&live, p) {
                None => continue,
                Some(_) => remove(&mut live, p),
            }
            for len in (1..p.len()).rev() {
                let parent = &p[..len];
                let empty = matches!(get(&live, parent), Some(Value::Object(m)) if m.is_empty());
                if !empty || Self::covered(&entries, parent) {
                    break;
                }
                remove(&mut live, parent);
            }
        }
        let d = diff(&self.live, &live);
        let touched: BTreeSet<Path> = d.modified.union(&d.added).cloned().collect();
        let conflicts: Vec<String> = entries
            .iter()
            .filter(|(other, _)| **other != id)
            .flat_map(|((m, _, _), set)| {
                set.intersection(&touched)
                    .map(move |p| format!("{} owned by {m}", show(p)))
            })
            .collect();
        if !conflicts.is_empty() && !force {
            return Err(conflicts);
        }
        for (other, set) in entries.iter_mut() {
            if *other != id {
                set.retain(|p| !touched.contains(p) && !d.removed.contains(p));
            }
        }
        entries.retain(|_, set| !set.is_empty());
        let changed = live != self.live || entries != self.entries;
        self.live = live;
        self.entries = entries;
        Ok(changed)
    }

    /// An update (merge patch): it owns what it changed, the others lose it.
    fn update(&mut self, manager: &str, sub: &'static str, patch: &Value) -> bool {
        let id: EntryId = (manager.to_owned(), "Update", sub);
        let mut live = self.live.clone();
        json_patch::merge(&mut live, patch);
        let d = diff(&self.live, &live);
        let touched: BTreeSet<Path> = d.modified.union(&d.added).cloned().collect();
        let mut entries = self.entries.clone();
        for (other, set) in entries.iter_mut() {
            if *other != id {
                set.retain(|p| !touched.contains(p) && !d.removed.contains(p));
            }
        }
        let own = entries.entry(id).or_default();
        own.extend(touched);
        own.retain(|p| !d.removed.contains(p));
        entries.retain(|_, set| !set.is_empty());
        let changed = live != self.live || entries != self.entries;
        self.live = live;
        self.entries = entries;
        changed
    }

    /// The simulation's own invariant: every value on the object has an owner.
    fn check(&self) -> Result<(), TestCaseError> {
        for p in content(&self.live).keys() {
            ensure(self.entries.values().any(|s| s.contains(p)), || {
                format!("simulation: {} has no owner\n{self:?}", show(p))
            })?;
        }
        Ok(())
    }

    fn foreign_owns(&self, ours: &EntryId, p: &[String]) -> bool {
        self.entries
            .iter()
            .any(|(id, set)| id != ours && set.iter().any(|q| q == p))
    }
}

// ---------------------------------------------------------------------------------------
// Generated steps

#[derive(Debug)]
enum Shape {
    Leaf,
    Map(&'static [(&'static str, Shape)]),
}
use Shape::{Leaf, Map as M};

static OUR_STATUS: Shape = M(&[(
    "status",
    M(&[
        ("phase", Leaf),
        (
            "workspaceStatus",
            M(&[
                ("ready", Leaf),
                (
                    "atProvider",
                    M(&[
                        ("checksum", Leaf),
                        ("outputs", M(&[("a", Leaf), ("b", Leaf)])),
                    ]),
                ),
            ]),
        ),
    ]),
)]);
static FOREIGN_STATUS: Shape = M(&[(
    "status",
    M(&[
        ("phase", Leaf),
        (
            "workspaceStatus",
            M(&[
                ("ready", Leaf),
                (
                    "atProvider",
                    M(&[
                        ("checksum", Leaf),
                        ("outputs", M(&[("a", Leaf), ("b", Leaf), ("f", Leaf)])),
                    ]),
                ),
            ]),
        ),
    ]),
)]);
static MAIN: Shape = M(&[(
    "spec",
    M(&[
        ("version", Leaf),
        ("controlPlaneEndpoint", M(&[("host", Leaf), ("port", Leaf)])),
    ]),
)]);

/// What a document generator may write: intents and merge patches hold nulls, applies don't.
#[derive(Clone, Copy, Debug)]
enum Gen {
    Intent,
    Apply,
    Update,
}

fn node(shape: &'static Shape, generator: Gen) -> BoxedStrategy<Option<Value>> {
    let value = (0u8..3).prop_map(|v| Some(json!(format!("v{v}"))));
    match (shape, generator) {
        (Leaf, Gen::Apply) => prop_oneof![1 => Just(None), 1 => value].boxed(),
        (Leaf, _) => prop_oneof![3 => Just(None), 4 => value, 2 => Just(Some(Value::Null))].boxed(),
        (M(children), Gen::Apply) => {
            prop_oneof![1 => Just(None), 3 => object(children, generator).prop_map(Some)].boxed()
        }
        (M(children), Gen::Intent | Gen::Update) => prop_oneof![
            3 => Just(None),
            1 => Just(Some(Value::Null)),
            5 => object(children, generator).prop_map(Some),
        ]
        .boxed(),
    }
}

fn object(children: &'static [(&'static str, Shape)], generator: Gen) -> BoxedStrategy<Value> {
    let parts: Vec<BoxedStrategy<Option<Value>>> =
        children.iter().map(|(_, s)| node(s, generator)).collect();
    parts
        .prop_map(move |values| {
            Value::Object(
                children
                    .iter()
                    .zip(values)
                    .filter_map(|((k, _), v)| Some(((*k).to_owned(), v?)))
                    .collect(),
            )
        })
        .boxed()
}

fn root(shape: &'static Shape, generator: Gen) -> BoxedStrategy<Value> {
    match shape {
        M(children) => object(children, generator),
        Leaf => unreachable!("a document is an object"),
    }
}

#[derive(Clone, Debug)]
enum Write {
    Apply { config: Value, force: bool },
    Update { patch: Value },
}

#[derive(Clone, Debug)]
enum Step {
    /// An intent for our status (0) or main-resource (1) document.
    Intent {
        doc: usize,
        fragment: Value,
        release: Vec<String>,
    },
    /// A foreign manager writes the status (0) or the main resource (1).
    Foreign {
        manager: &'static str,
        doc: usize,
        write: Write,
    },
}

fn release(candidates: &'static [&'static str]) -> BoxedStrategy<Vec<String>> {
    prop_oneof![
        4 => Just(Vec::new()),
        1 => proptest::sample::select(candidates).prop_map(|c| vec![c.to_owned()]),
    ]
    .boxed()
}

fn step() -> impl Strategy<Value = Step> {
    let status_intent = (
        root(&OUR_STATUS, Gen::Intent),
        release(&[
            "status.workspaceStatus.atProvider",
            "status.workspaceStatus",
            "status",
        ]),
    )
        .prop_map(|(fragment, release)| Step::Intent {
            doc: 0,
            fragment,
            release,
        });
    let main_intent = (
        root(&MAIN, Gen::Intent),
        release(&["spec.controlPlaneEndpoint", "spec"]),
    )
        .prop_map(|(fragment, release)| Step::Intent {
            doc: 1,
            fragment,
            release,
        });
    let write = |shape: &'static Shape| {
        prop_oneof![
            2 => (root(shape, Gen::Apply), proptest::bool::ANY)
                .prop_map(|(config, force)| Write::Apply { config, force }),
            1 => root(shape, Gen::Update).prop_map(|patch| Write::Update { patch }),
        ]
    };
    let foreign = (
        proptest::sample::select(&FOREIGN[..]),
        prop_oneof![3 => Just(0usize), 1 => Just(1usize)],
    )
        .prop_flat_map(move |(manager, doc)| {
            let shape = if doc == 0 { &FOREIGN_STATUS } else { &MAIN };
            write(shape).prop_map(move |write| Step::Foreign {
                manager,
                doc,
                write,
            })
        });
    prop_oneof![4 => status_intent, 2 => main_intent, 5 => foreign]
}

// ---------------------------------------------------------------------------------------
// The run

fn key(doc: usize) -> DesiredKey {
    DesiredKey {
        object: ObjectRef {
            api_version: API_VERSION.into(),
            kind: "CAPTControlPlane".into(),
            namespace: Some("model".into()),
            name: "demo".into(),
        },
        subresource: (doc == 0).then_some(Subresource::Status),
        field_manager: OURS.into(),
    }
}

fn ours(doc: usize) -> EntryId {
    (OURS.to_owned(), "Apply", SUBRESOURCE[doc])
}

/// The protected paths of one of our documents.
fn protected_of(doc: usize) -> impl Iterator<Item = &'static str> {
    PROTECTED
        .into_iter()
        .filter(move |p| p.starts_with(if doc == 0 { "status." } else { "spec." }))
}

struct World {
    policy: Policy,
    rules: PathRules,
    may_force: bool,
    server: Server,
    /// The applier's desired documents.
    docs: [Value; 2],
    /// The model's.
    model: [Flat; 2],
    /// Whether an intent has reached the document (only those are re-checked on changes).
    touched: [bool; 2],
    /// Counts, for the summary.
    stats: Stats,
}

#[derive(Default, Debug, Clone, Copy)]
struct Stats {
    steps: usize,
    applies: usize,
    forced: usize,
    skipped: usize,
    conflicts: usize,
    refused_foreign: usize,
    kept: usize,
    released: usize,
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, o: Self) {
        self.steps += o.steps;
        self.applies += o.applies;
        self.forced += o.forced;
        self.skipped += o.skipped;
        self.conflicts += o.conflicts;
        self.refused_foreign += o.refused_foreign;
        self.kept += o.kept;
        self.released += o.released;
    }
}

impl World {
    fn new(may_force: bool) -> Self {
        let file = PolicyFile::read(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../manifests/deploy/status-applier-policy.yaml"),
        )
        .expect("CAPT's policy file");
        let policy = Policy {
            force_managers: if may_force {
                vec![OURS.into()]
            } else {
                Vec::new()
            },
            ..file.serving()
        };
        let rules = policy.rules_for(&GroupKind::from_api_version(
            API_VERSION,
            "CAPTControlPlane",
        ));
        Self {
            policy,
            rules,
            may_force,
            server: Server::new(),
            docs: [json!({}), json!({})],
            model: [Flat::new(), Flat::new()],
            touched: [false; 2],
            stats: Stats::default(),
        }
    }

    fn state(&self) -> String {
        format!(
            "live: {}\nmanagedFields: {:?}\ndocs: {} | {}\nmodel: {} | {}",
            self.server.live,
            self.server.entries,
            self.docs[0],
            self.docs[1],
            unflatten(&self.model[0]),
            unflatten(&self.model[1])
        )
    }

    fn step(&mut self, step: &Step) -> Result<(), TestCaseError> {
        self.stats.steps += 1;
        let mut released = Vec::new();
        match step {
            Step::Intent {
                doc,
                fragment,
                release,
            } => {
                let doc = *doc;
                released = release.iter().map(|r| path(r)).collect();
                self.stats.released += released.len();
                let release_paths: Vec<_> =
                    release.iter().map(|r| r.parse().expect("a path")).collect();
                let merged = merge_fragment(&self.docs[doc], fragment, &self.rules, &release_paths);
                let (model, kept) = model_merge(&self.model[doc], fragment, &released);
                ensure(flatten(&merged.document) == model, || {
                    format!(
                        "desired document: the core has {}, the model {}\n{}",
                        merged.document,
                        unflatten(&model),
                        self.state()
                    )
                })?;
                let mut core_kept: Vec<String> =
                    merged.kept.iter().map(ToString::to_string).collect();
                core_kept.sort();
                ensure(core_kept == kept, || {
                    format!("kept: the core says {core_kept:?}, the model {kept:?}")
                })?;
                self.stats.kept += kept.len();
                for protected in protected_of(doc) {
                    let released = released.iter().any(|r| path(protected).starts_with(r));
                    ensure(
                        released
                            || under(&self.model[doc], protected).is_empty()
                            || !under(&model, protected).is_empty(),
                        || format!("{protected} vanished from the document without release"),
                    )?;
                }
                // The engine applies when the document changed, or on its first intent.
                let changed = merged.document != self.docs[doc] || !self.touched[doc];
                self.docs[doc] = merged.document;
                self.model[doc] = model;
                self.touched[doc] = true;
                if changed {
                    self.settle(&released)?;
                }
            }
            Step::Foreign {
                manager,
                doc,
                write,
            } => {
                let sub = SUBRESOURCE[*doc];
                let changed = match write {
                    Write::Apply { config, force } => {
                        match self.server.apply(manager, sub, config, *force) {
                            Ok(changed) => changed,
                            Err(_) => {
                                self.stats.refused_foreign += 1;
                                false
                            }
                        }
                    }
                    Write::Update { patch } => self.server.update(manager, sub, patch),
                };
                self.server.check()?;
                // The watch sees the change and re-checks every document of the object.
                if changed {
                    self.settle(&released)?;
                }
            }
        }
        self.server.check()?;
        self.check_settled()
    }

    /// Re-checks every document until no apply is needed, as the engine does on each
    /// change of the object; a write that changes nothing, or a change per write without
    /// end, is a failure.
    fn settle(&mut self, released: &[Path]) -> Result<(), TestCaseError> {
        for _ in 0..4 {
            let mut wrote = false;
            for doc in 0..2 {
                if self.touched[doc] {
                    wrote |= self.attempt(doc, released)?;
                }
            }
            if !wrote {
                return Ok(());
            }
        }
        Err(fail(format!(
            "no steady state: the applier writes again after every write\n{}",
            self.state()
        )))
    }

    /// One apply attempt of a document: the core's plan against the model's prediction,
    /// then the apply on the simulated server. Answers whether it wrote.
    fn attempt(&mut self, doc: usize, released: &[Path]) -> Result<bool, TestCaseError> {
        let object = self.server.object();
        let planned = plan_on_object(&self.policy, &key(doc), &self.docs[doc], &object);
        let context = || {
            format!(
                "document {doc} ({}), plan: force {} unchanged {} body {}\nconflicts: {:?}\n{}",
                SUBRESOURCE[doc],
                planned.force,
                planned.unchanged,
                planned.body,
                planned.conflicts,
                self.state()
            )
        };

        // The model: a conflict is a field we want that a foreign entry owns with another
        // value (exactly that field: owning a map is not owning the fields in it).
        let me = ours(doc);
        let desired = &self.model[doc];
        let mut conflicts: Vec<(String, String, String)> = Vec::new();
        let mut conflicting = BTreeSet::new();
        for (p, v) in desired {
            for (id, set) in &self.server.entries {
                if *id != me && set.contains(p) && self.server.leaf(p) != Some(v) {
                    conflicts.push((show(p), id.0.clone(), id.1.to_owned()));
                    conflicting.insert(p.clone());
                }
            }
        }
        conflicts.sort();
        let protected = |p: &Path| PROTECTED.iter().any(|pp| is_under(p, pp));
        let force = self.may_force && conflicting.iter().any(|p| !protected(p));
        let body: Flat = desired
            .iter()
            .filter(|(p, _)| !conflicting.contains(*p) || (self.may_force && !protected(p)))
            .map(|(p, v)| (p.clone(), v.clone()))
            .collect();

        let mut core_conflicts: Vec<(String, String, String)> = planned
            .conflicts
            .iter()
            .map(|c| (c.path.clone(), c.owner.clone(), c.operation.clone()))
            .collect();
        core_conflicts.sort();
        ensure(core_conflicts == conflicts, || {
            format!("conflicts: the model predicts {conflicts:?}\n{}", context())
        })?;
        ensure(planned.force == force, || {
            format!("force: the model says {force}\n{}", context())
        })?;
        // A map we own as such that the body leaves while other managers own fields in it is
        // kept, empty (dropped, the server would drop their fields with it); no other empty
        // object, and no null.
        let containers: BTreeSet<Path> = self
            .server
            .entries
            .get(&me)
            .into_iter()
            .flatten()
            .filter(|p| get(&self.server.live, p).is_some_and(Value::is_object))
            .filter(|p| !body.keys().any(|q| q.starts_with(p)))
            .filter(|p| {
                self.server.entries.iter().any(|(id, set)| {
                    *id != me
                        && !owns_node(set, p)
                        && set.iter().any(|q| q.len() > p.len() && q.starts_with(p))
                })
            })
            .cloned()
            .collect();
        if let Some(bad) = null_in(&planned.body) {
            return Err(fail(format!("the apply body holds {bad}\n{}", context())));
        }
        ensure(empty_objects(&planned.body) == containers, || {
            format!(
                "empty maps in the body: the model keeps {:?}\n{}",
                containers.iter().map(|p| show(p)).collect::<Vec<_>>(),
                context()
            )
        })?;
        ensure(flatten(&planned.body) == body, || {
            format!(
                "apply body: the model sends {}\n{}",
                unflatten(&body),
                context()
            )
        })?;

        // What the apply would do.
        let mut after = self.server.clone();
        let wrote = after
            .apply(OURS, SUBRESOURCE[doc], &planned.body, planned.force)
            .map_err(|c| {
                fail(format!(
                    "the server refuses (409, or 422 for a removed map) an apply the core planned: {c:?}\n{}",
                    context()
                ))
            })?;
        if planned.unchanged {
            let owned: BTreeSet<&Path> = self
                .server
                .entries
                .get(&me)
                .map(|s| s.iter().filter(|p| self.server.leaf(p).is_some()).collect())
                .unwrap_or_default();
            ensure(
                content(&after.live) == content(&self.server.live)
                    && owned == body.keys().collect(),
                || {
                    format!(
                        "skipped an apply that would change the object or what we own: after it {}\n{}",
                        after.live,
                        context()
                    )
                },
            )?;
            self.stats.skipped += 1;
            self.stats.conflicts += conflicts.len();
            return Ok(false);
        }
        ensure(wrote, || {
            format!(
                "an apply that changes nothing: one write per re-check\n{}",
                context()
            )
        })?;
        for (id, set) in &self.server.entries {
            if *id == me {
                continue;
            }
            for p in set.iter().filter(|p| self.server.leaf(p).is_some()) {
                ensure(after.leaf(p).is_some(), || {
                    format!(
                        "our apply removed {}, a field of {}\n{}",
                        show(p),
                        id.0,
                        context()
                    )
                })?;
            }
        }
        for protected in protected_of(doc) {
            let had = !under(&content(&self.server.live), protected).is_empty();
            let has = !under(&content(&after.live), protected).is_empty();
            let released = released.iter().any(|r| path(protected).starts_with(r));
            ensure(!had || has || released, || {
                format!(
                    "our apply removed {protected} without release: after it {}\n{}",
                    after.live,
                    context()
                )
            })?;
        }
        for (id, set) in &self.server.entries {
            if id.0 == OURS {
                continue;
            }
            for p in set
                .iter()
                .filter(|p| protected(p) && self.server.leaf(p).is_some())
            {
                ensure(after.entries.get(id).is_some_and(|s| s.contains(p)), || {
                    format!(
                        "our apply took {} from {} by force\n{}",
                        show(p),
                        id.0,
                        context()
                    )
                })?;
            }
        }
        self.server = after;
        self.stats.applies += 1;
        self.stats.forced += usize::from(planned.force);
        self.stats.conflicts += conflicts.len();
        Ok(true)
    }

    /// What must hold once the applier has settled.
    fn check_settled(&self) -> Result<(), TestCaseError> {
        let live = content(&self.server.live);
        for doc in (0..2).filter(|d| self.touched[*d]) {
            let me = ours(doc);
            // A field we want that no foreign manager owns is on the object, ours.
            for (p, v) in &self.model[doc] {
                if self.server.foreign_owns(&me, p) {
                    continue;
                }
                ensure(
                    live.get(p) == Some(v)
                        && self.server.entries.get(&me).is_some_and(|s| s.contains(p)),
                    || {
                        format!(
                            "settled, but {} = {v} is not on the object as ours\n{}",
                            show(p),
                            self.state()
                        )
                    },
                )?;
            }
            for protected in protected_of(doc) {
                let wanted = under(&self.model[doc], protected);
                let there = under(&live, protected);
                // Never vanishes while our document holds it.
                ensure(wanted.is_empty() || !there.is_empty(), || {
                    format!(
                        "settled, but {protected} is missing from the object\n{}",
                        self.state()
                    )
                })?;
                // Where only we own fields of it, it is exactly our document's.
                let foreign = self.server.entries.iter().any(|(id, set)| {
                    *id != me
                        && set
                            .iter()
                            .any(|q| is_under(q, protected) && self.server.leaf(q).is_some())
                });
                ensure(foreign || there == wanted, || {
                    format!(
                        "settled, only we own fields of {protected}, but the object has {} and our document {}\n{}",
                        unflatten(&there),
                        unflatten(&wanted),
                        self.state()
                    )
                })?;
            }
        }
        Ok(())
    }
}

/// Runs `steps`; answers the counts so far and the first failure, with its step.
fn run(may_force: bool, steps: &[Step]) -> (Stats, Result<(), TestCaseError>) {
    let mut world = World::new(may_force);
    for (i, step) in steps.iter().enumerate() {
        if let Err(e) = world.step(step) {
            return (world.stats, Err(fail(format!("step {i} {step:?}: {e}"))));
        }
    }
    (world.stats, Ok(()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn the_pure_core_agrees_with_the_model_among_foreign_writers(
        may_force in proptest::bool::weighted(0.25),
        steps in proptest::collection::vec(step(), 1..30),
    ) {
        run(may_force, &steps).1?;
    }
}

/// The generator reaches what the property is about: conflicts, refused and forced applies,
/// kept and released protected paths, skipped applies. (Counted up to each case's first
/// failure, so that this holds whatever the core gets wrong.)
#[test]
fn the_generated_sequences_reach_every_interesting_case() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = (
        proptest::bool::weighted(0.25),
        proptest::collection::vec(step(), 1..30),
    );
    let mut total = Stats::default();
    for _ in 0..300 {
        let (may_force, steps) = strategy.new_tree(&mut runner).expect("a case").current();
        total += run(may_force, &steps).0;
    }
    println!("300 sequences: {total:?}");
    let Stats {
        steps,
        applies,
        forced,
        skipped,
        conflicts,
        refused_foreign,
        kept,
        released,
    } = total;
    for (what, count, least) in [
        ("steps", steps, 1000),
        ("applies", applies, 300),
        ("forced applies of ours", forced, 5),
        ("skipped applies", skipped, 300),
        ("predicted conflicts", conflicts, 50),
        ("foreign applies refused with a 409", refused_foreign, 50),
        ("protected paths kept", kept, 20),
        ("releases", released, 20),
    ] {
        assert!(
            count >= least,
            "only {count} {what} in 300 sequences: {total:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The minimal failing cases the property found, kept as plain tests. Each asserts the
// behaviour docs/status-applier.md describes; the real API server's side of each is checked by the
// ignored tests of `tests/tests/replay_seeded.rs`.

fn status(fragment: Value) -> Step {
    Step::Intent {
        doc: 0,
        fragment: json!({ "status": fragment }),
        release: Vec::new(),
    }
}

fn spec(fragment: Value) -> Step {
    Step::Intent {
        doc: 1,
        fragment: json!({ "spec": fragment }),
        release: Vec::new(),
    }
}

fn foreign(manager: &'static str, doc: usize, write: Write) -> Step {
    Step::Foreign {
        manager,
        doc,
        write,
    }
}

fn assert_agrees(steps: &[Step]) {
    if let (_, Err(e)) = run(false, steps) {
        panic!("{e}");
    }
}

/// An update that created `atProvider` and lost its only field keeps `f:atProvider: {}`:
/// it owns the map, not the fields a later apply puts in it (the API server accepts our
/// apply without a 409). The core reads such an entry as owning the whole subtree, reports
/// a conflict with `foreign-a` and never writes our `atProvider`.
#[test]
fn a_foreign_owner_of_the_at_provider_map_alone_does_not_own_its_fields() {
    assert_agrees(&[
        foreign(
            "foreign-a",
            0,
            Write::Update {
                patch: json!({"status": {"workspaceStatus": {"atProvider": {"checksum": "v2"}}}}),
            },
        ),
        foreign(
            "foreign-a",
            0,
            Write::Update {
                patch: json!({"status": {"workspaceStatus": {"atProvider": {"checksum": null}}}}),
            },
        ),
        status(json!({"workspaceStatus": {"atProvider": {"checksum": "v1"}}})),
    ]);
}

/// The same misreading empties a protected path: after a foreign apply of `spec: {}` (the
/// server records `f:spec: {}`), our manager moving its own endpoint is taken for a conflict
/// with `foreign-a`, the host is left out of the apply, and server-side apply removes it:
/// `spec.controlPlaneEndpoint` vanishes without release. (The real CRD requires the host,
/// so there the apply is refused with a 422 and the endpoint never moves again.)
#[test]
fn a_foreign_apply_of_an_empty_spec_does_not_make_our_endpoint_vanish() {
    assert_agrees(&[
        spec(json!({"controlPlaneEndpoint": {"host": "v0"}})),
        foreign(
            "foreign-a",
            1,
            Write::Apply {
                config: json!({"spec": {}}),
                force: false,
            },
        ),
        spec(json!({"controlPlaneEndpoint": {"host": "v1"}})),
    ]);
}

/// Leaving a conflicting field out of the apply must not leave its parent behind as `{}`:
/// the server records that as owning the parent itself (`f:status: {}`), the no-op check
/// then compares the whole live status with the body and never settles (one write per
/// re-check), and the manager's entry claims the foreign fields below it.
#[test]
fn a_conflict_left_out_of_the_apply_leaves_no_empty_object_behind() {
    assert_agrees(&[
        foreign(
            "foreign-a",
            0,
            Write::Apply {
                config: json!({"status": {"phase": "v0"}}),
                force: false,
            },
        ),
        status(json!({"phase": "v0"})),
        status(json!({"phase": "v1"})),
    ]);
}

/// `atProvider: {outputs: {}}` holds nothing: replacing a protected `atProvider` with it
/// removes the protected path, which must be kept unless released. The core only counts
/// `null`, `""`, `{}` and `[]` at the path itself as empty, so the document loses the
/// checksum and the apply removes `atProvider` from the object.
#[test]
fn a_replaced_at_provider_with_nothing_in_it_is_kept() {
    assert_agrees(&[
        status(json!({"workspaceStatus": {"atProvider": {"checksum": "v1"}}})),
        status(json!({"workspaceStatus": {"atProvider": {"outputs": {}}}})),
    ]);
}
