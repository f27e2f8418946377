//! Decoding, encoding and querying of Kubernetes `managedFields[].fieldsV1` sets.
//!
//! Kubernetes records which field manager owns which fields as a "FieldsV1" JSON tree. Every
//! key of that tree is prefixed:
//!
//! * `f:<name>`: a field of a map or struct,
//! * `k:<json object>`: an element of an associative list (list-type map), identified by its
//!   key fields, e.g. `k:{"type":"Ready"}`,
//! * `v:<json value>`: an element of a set list, identified by its value, e.g. `v:"foo"`,
//! * `i:<n>`: a list element identified by its index,
//! * `.`: the node itself (it is owned even though it also has children).
//!
//! A leaf is an empty object `{}`. [`FieldSet`] is the decoded tree. It answers ownership
//! questions ([`FieldSet::owns`], [`FieldSet::touches`]), projects live objects onto the owned
//! fields ([`FieldSet::project`]), predicts what an apply would claim
//! ([`FieldSet::from_apply_document`]) and finds conflicting paths
//! ([`FieldSet::intersection`]).
//!
//! # Ownership semantics
//!
//! A node without children (a leaf) owns its whole subtree: owning `.spec.controlPlaneEndpoint`
//! owns `.spec.controlPlaneEndpoint.host`. (For conflicts that holds only when the value is
//! atomic: on a map the API server means the map itself, see [`FieldSet::covering_leaf`].)
//! A node marked `.` that also has children owns only itself and the listed children, as in
//! server-side apply: `.status` marked `.` does not make its manager own
//! `.status.anythingElse`. A set decoded from `{".":{}}` alone and one decoded from `{}` are
//! the same leaf.
//!
//! # Limits
//!
//! Decoding rejects trees nested deeper than [`MAX_DEPTH`] path elements, so every `FieldSet`
//! is at most that deep and the recursive helpers here (and `Drop`) stay within a small,
//! bounded stack whatever the input.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt;

use serde_json::{Map, Value};

/// The deepest path (in path elements from the root) a [`FieldSet`] may contain.
pub const MAX_DEPTH: usize = 64;

/// One step of a path into an object.
#[derive(Clone, Debug, PartialEq)]
pub enum PathElement {
    /// A field of a map or struct (`f:<name>`).
    Field(String),
    /// An associative-list element identified by its key fields (`k:{...}`).
    Key(Map<String, Value>),
    /// A set-list element identified by its value (`v:<json>`).
    Value(Value),
    /// A list element identified by its index (`i:<n>`).
    Index(usize),
}

impl fmt::Display for PathElement {
    /// Renders `.name`, `[type=Ready]` (keys comma-joined, strings unquoted), `[=json]` or `[3]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathElement::Field(name) => write!(f, ".{name}"),
            PathElement::Key(keys) => {
                f.write_str("[")?;
                for (i, (name, value)) in sorted_entries(keys).into_iter().enumerate() {
                    let sep = if i == 0 { "" } else { "," };
                    match value {
                        Value::String(s) => write!(f, "{sep}{name}={s}")?,
                        other => write!(f, "{sep}{name}={other}")?,
                    }
                }
                f.write_str("]")
            }
            PathElement::Value(value) => write!(f, "[={value}]"),
            PathElement::Index(index) => write!(f, "[{index}]"),
        }
    }
}

impl PathElement {
    /// The canonical fieldsV1 key of this element (JSON object keys sorted).
    fn encode(&self) -> String {
        match self {
            PathElement::Field(name) => format!("f:{name}"),
            PathElement::Key(keys) => format!("k:{}", canonical(&Value::Object(keys.clone()))),
            PathElement::Value(value) => format!("v:{}", canonical(value)),
            PathElement::Index(index) => format!("i:{index}"),
        }
    }

    /// Parses one fieldsV1 key (other than `.`) found at `path`.
    fn decode(key: &str, path: &[PathElement]) -> Result<Self, FieldsV1Error> {
        if let Some(name) = key.strip_prefix("f:") {
            Ok(PathElement::Field(name.to_owned()))
        } else if let Some(text) = key.strip_prefix("k:") {
            decode_key_object(key, text, path)
        } else if let Some(text) = key.strip_prefix("v:") {
            let value: Value =
                serde_json::from_str(text).map_err(|source| FieldsV1Error::InvalidJson {
                    key: key.to_owned(),
                    path: path_to_string(path),
                    prefix: "v:",
                    expected: "a JSON value",
                    source,
                })?;
            Ok(PathElement::Value(canonical(&value)))
        } else if let Some(text) = key.strip_prefix("i:") {
            decode_index(key, text, path)
        } else {
            Err(FieldsV1Error::UnknownPrefix {
                key: key.to_owned(),
                path: path_to_string(path),
            })
        }
    }

    /// True when this list-element identifier selects `item`, the element at `index`.
    fn selects(&self, index: usize, item: &Value) -> bool {
        match self {
            PathElement::Field(_) => false,
            PathElement::Key(keys) => key_matches(keys, item),
            PathElement::Value(value) => value == item,
            PathElement::Index(n) => *n == index,
        }
    }
}

/// Decodes the text after `k:`, which must be a JSON object.
fn decode_key_object(
    key: &str,
    text: &str,
    path: &[PathElement],
) -> Result<PathElement, FieldsV1Error> {
    let value: Value = serde_json::from_str(text).map_err(|source| FieldsV1Error::InvalidJson {
        key: key.to_owned(),
        path: path_to_string(path),
        prefix: "k:",
        expected: "a JSON object",
        source,
    })?;
    match canonical(&value) {
        Value::Object(keys) => Ok(PathElement::Key(keys)),
        other => Err(FieldsV1Error::KeyNotObject {
            key: key.to_owned(),
            path: path_to_string(path),
            found: json_kind(&other),
        }),
    }
}

/// Decodes the text after `i:`, which must be a non-negative decimal integer.
fn decode_index(key: &str, text: &str, path: &[PathElement]) -> Result<PathElement, FieldsV1Error> {
    let all_digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    match text.parse::<usize>() {
        Ok(index) if all_digits => Ok(PathElement::Index(index)),
        _ => Err(FieldsV1Error::InvalidIndex {
            key: key.to_owned(),
            path: path_to_string(path),
        }),
    }
}

/// An error decoding a fieldsV1 tree or parsing a field path.
#[derive(Debug, thiserror::Error)]
pub enum FieldsV1Error {
    /// The fieldsV1 value itself is not a JSON object.
    #[error("invalid fieldsV1 root: expected a JSON object, found {found}")]
    RootNotObject {
        /// What was found instead (e.g. "an array").
        found: &'static str,
    },
    /// The value under a key is not a JSON object.
    #[error("invalid value for key `{key}` at {path}: expected a JSON object, found {found}")]
    NotAnObject {
        /// The key whose value is not an object.
        key: String,
        /// The path of the node holding the key.
        path: String,
        /// What was found instead (e.g. "a string").
        found: &'static str,
    },
    /// The value under `.` is an object with members; it must be `{}`.
    #[error("invalid value for key `.` at {path}: expected an empty object")]
    NonEmptySelf {
        /// The path of the node holding the `.` key.
        path: String,
    },
    /// A key does not start with `f:`, `k:`, `v:`, `i:` and is not `.`.
    #[error("unknown prefix in key `{key}` at {path}: expected `f:`, `k:`, `v:`, `i:` or `.`")]
    UnknownPrefix {
        /// The offending key.
        key: String,
        /// The path of the node holding the key.
        path: String,
    },
    /// The text after `k:` or `v:` is not valid JSON.
    #[error("invalid key `{key}` at {path}: expected {expected} after `{prefix}`: {source}")]
    InvalidJson {
        /// The offending key.
        key: String,
        /// The path of the node holding the key.
        path: String,
        /// The key's prefix, `k:` or `v:`.
        prefix: &'static str,
        /// What the prefix must be followed by.
        expected: &'static str,
        /// The JSON parse error.
        source: serde_json::Error,
    },
    /// The text after `k:` is valid JSON but not an object.
    #[error("invalid key `{key}` at {path}: expected a JSON object after `k:`, found {found}")]
    KeyNotObject {
        /// The offending key.
        key: String,
        /// The path of the node holding the key.
        path: String,
        /// What was found instead (e.g. "an array").
        found: &'static str,
    },
    /// The text after `i:` is not a non-negative decimal integer that fits a `usize`.
    #[error("invalid key `{key}` at {path}: expected a non-negative integer after `i:`")]
    InvalidIndex {
        /// The offending key.
        key: String,
        /// The path of the node holding the key.
        path: String,
    },
    /// The tree nests deeper than [`MAX_DEPTH`] path elements.
    #[error("key `{key}` at {path} nests deeper than {max} levels")]
    TooDeep {
        /// The key that would exceed the limit.
        key: String,
        /// The path of the node holding the key.
        path: String,
        /// The limit, [`MAX_DEPTH`].
        max: usize,
    },
    /// A dotted field path has an empty segment (e.g. `status..phase`, `` or `status.`).
    #[error("invalid field path `{path}`: segment {segment} is empty")]
    EmptyPathSegment {
        /// The whole path as given.
        path: String,
        /// The 1-based position of the empty segment.
        segment: usize,
    },
}

/// A child of a [`FieldSet`] node: its path element and subtree.
#[derive(Clone, Debug, PartialEq)]
struct Child {
    element: PathElement,
    set: FieldSet,
}

/// A decoded fieldsV1 tree.
///
/// Invariant: every non-root node either has children or is marked as owned itself, so every
/// non-root node owns at least one path; a node owned itself without children is a leaf and
/// owns its whole subtree.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSet {
    /// The node itself is owned (`.`, or a leaf).
    self_owned: bool,
    /// Children by canonical fieldsV1 key, which gives a deterministic order.
    children: BTreeMap<String, Child>,
}

/// What [`FieldSet::from_apply_document`] threads through its recursion.
struct ApplyContext<'a> {
    list_map_keys: &'a dyn Fn(&[PathElement]) -> Option<Vec<String>>,
    /// The schema path so far: field names only, list elements are not recorded.
    schema_path: Vec<PathElement>,
}

impl FieldSet {
    /// Decodes a fieldsV1 value.
    ///
    /// Rejects non-object nodes, unknown prefixes, invalid JSON after `k:`/`v:`, `k:` that is
    /// not a JSON object, `i:` that is not a non-negative integer, a non-empty `.` and nesting
    /// deeper than [`MAX_DEPTH`] path elements. Never panics and never recurses deeper than
    /// [`MAX_DEPTH`], whatever the input. Keys that denote the same element (e.g. `k:` objects
    /// with their keys in a different order) are merged.
    pub fn from_fields_v1(v: &Value) -> Result<FieldSet, FieldsV1Error> {
        match v {
            Value::Object(map) => decode_node(map, &mut Vec::new()),
            other => Err(FieldsV1Error::RootNotObject {
                found: json_kind(other),
            }),
        }
    }

    /// Encodes back to fieldsV1; round-trips with [`FieldSet::from_fields_v1`] for valid
    /// input, modulo key order and canonical spelling of `k:`/`v:`/`i:` keys.
    pub fn to_fields_v1(&self) -> Value {
        self.encode_node(true)
    }

    /// All owned leaf paths (nodes without children, and nodes marked `.`), parents before
    /// their children, siblings in canonical key order.
    pub fn leaf_paths(&self) -> Vec<Vec<PathElement>> {
        let mut out = Vec::new();
        self.collect_leaves(&mut Vec::new(), &mut out);
        out
    }

    /// The owned paths that hold values: [`FieldSet::leaf_paths`] less every node that is
    /// owned itself (`.`) and also through children, which is compared through its children.
    pub fn value_leaves(&self) -> Vec<Vec<PathElement>> {
        let paths = self.leaf_paths();
        paths
            .iter()
            .filter(|p| !paths.iter().any(|q| q.len() > p.len() && q.starts_with(p)))
            .cloned()
            .collect()
    }

    /// True when `path` is owned: it is a leaf of this set (including nodes marked `.`), or
    /// lies below a leaf without children (which owns its whole subtree).
    pub fn owns(&self, path: &[PathElement]) -> bool {
        match self.walk(path) {
            Walk::CoveredBy => true,
            Walk::Reached(node) => node.self_owned,
            Walk::Missing => false,
        }
    }

    /// When `path` lies strictly below a leaf without children, the length of that leaf's
    /// path (a prefix of `path`); `None` when `path` is reached or leaves the set.
    ///
    /// Such a leaf owns the whole value at its path, which covers `path` only if that value is
    /// atomic: a leaf on a map (`f:status: {}`, recorded for a manager that applied the map
    /// empty or lost every field below it) owns the map itself, not its fields. The set alone
    /// cannot tell which; the caller decides from the live value.
    pub fn covering_leaf(&self, path: &[PathElement]) -> Option<usize> {
        let mut node = self;
        for (depth, element) in path.iter().enumerate() {
            if node.is_leaf() {
                return Some(depth);
            }
            node = &node.children.get(&element.encode())?.set;
        }
        None
    }

    /// True when the node at `path` is owned itself and has no children: it owns the value
    /// there as a whole (for a map: the map itself).
    pub fn is_leaf_at(&self, path: &[PathElement]) -> bool {
        matches!(self.walk(path), Walk::Reached(node) if node.is_leaf())
    }

    /// True when the set owns `path` or anything below it.
    pub fn touches(&self, path: &[PathElement]) -> bool {
        match self.walk(path) {
            Walk::CoveredBy => true,
            Walk::Reached(node) => !node.is_empty(),
            Walk::Missing => false,
        }
    }

    /// Builds the set an apply of `doc` (the body of a server-side apply without
    /// apiVersion/kind/metadata) would claim.
    ///
    /// `list_map_keys` receives the schema path of a list (its field names from the root; list
    /// elements contribute nothing, so `spec.containers[].ports` is asked as
    /// `.spec.containers.ports`) and returns its key field names for an associative list, an
    /// empty vector for a set list (elements become `v:` leaves) or `None` for an atomic list
    /// (the list is a leaf). Non-empty objects recurse into `f:` children, empty objects,
    /// scalars and `null` are leaves. List-map elements become `k:{...}` nodes marked `.` with
    /// all their fields; non-object elements become `v:` leaves and objects carrying none of
    /// the key fields `i:` leaves. An empty associative list claims nothing, as in server-side
    /// apply. Content deeper than [`MAX_DEPTH`] is claimed as a leaf. A non-object `doc`
    /// claims nothing.
    pub fn from_apply_document(
        doc: &Value,
        list_map_keys: &dyn Fn(&[PathElement]) -> Option<Vec<String>>,
    ) -> FieldSet {
        let mut ctx = ApplyContext {
            list_map_keys,
            schema_path: Vec::new(),
        };
        match doc {
            Value::Object(map) => apply_object(map, &mut ctx, 0),
            _ => FieldSet::default(),
        }
    }

    /// Projects `live` onto this set: a JSON value containing exactly the owned fields with
    /// their live values (a leaf's live value is copied whole).
    ///
    /// A `k:` element is looked up in the live list by its key fields, projected recursively
    /// and always carries its key fields; `v:` elements are included when present; `i:n`
    /// projects live element `n`. Lists keep live order. Owned paths absent from `live` are
    /// skipped; a node marked `.` whose owned children are all absent yields an empty object
    /// (or list element with its keys). Returns `None` when nothing owned is present.
    pub fn project(&self, live: &Value) -> Option<Value> {
        if self.is_leaf() {
            return Some(live.clone());
        }
        let projected = match live {
            Value::Object(map) => self.project_object(map),
            Value::Array(items) => self.project_array(items),
            _ => None,
        };
        projected.or_else(|| self.self_owned.then(|| empty_like(live)))
    }

    /// The paths both sets own. Where one side owns a node as a leaf (and so its whole
    /// subtree) and the other owns paths below it, the result holds those deeper paths.
    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        intersect(self, other).unwrap_or_default()
    }

    // -- the set as a region of an object: what a stripped copy of the object keeps -------
    //
    // Taken as a region, a leaf without children stands for its whole subtree, and any other
    // node for its listed children only (whether it is owned itself does not matter). The
    // status-applier keeps, of each object it watches, the values and the other managers'
    // fields inside one region: see `status_applier::view`.

    /// Widens this region by `other`: a leaf on either side covers its whole subtree.
    pub fn union_region(&mut self, other: &FieldSet) {
        if self.is_leaf() || other.is_empty() {
            return;
        }
        if other.is_leaf() {
            *self = FieldSet::leaf();
            return;
        }
        for (key, child) in &other.children {
            match self.children.entry(key.clone()) {
                Entry::Vacant(slot) => {
                    slot.insert(child.clone());
                }
                Entry::Occupied(mut slot) => slot.get_mut().set.union_region(&child.set),
            }
        }
    }

    /// True when every path `set` owns, and every node on the way to it, lies in this region.
    pub fn region_covers(&self, set: &FieldSet) -> bool {
        if self.is_leaf() || set.is_empty() {
            return true;
        }
        if set.is_leaf() {
            return false;
        }
        set.children.iter().all(|(key, child)| {
            self.children
                .get(key)
                .is_some_and(|mine| mine.set.region_covers(&child.set))
        })
    }

    /// `live` cut down to this region: a leaf keeps its whole value; any other node keeps its
    /// value's kind (an object, a list, a scalar as it is) with only the children of the region
    /// inside, so that the kind of every value on the way to a kept one stays known. A list
    /// keeps the elements the region selects (`k:` elements with their key fields), or all of
    /// them when the region names one by index. `None` when `live` holds nothing of the region
    /// (or the region is empty).
    pub fn project_region(&self, live: &Value) -> Option<Value> {
        if self.is_leaf() {
            return Some(live.clone());
        }
        if self.children.is_empty() {
            return None;
        }
        Some(match live {
            Value::Object(map) => {
                let mut out = Map::new();
                for child in self.children.values() {
                    if let PathElement::Field(name) = &child.element
                        && let Some(value) = map.get(name).and_then(|v| child.set.project_region(v))
                    {
                        out.insert(name.clone(), value);
                    }
                }
                Value::Object(out)
            }
            Value::Array(items) => {
                if self
                    .children
                    .values()
                    .any(|c| matches!(c.element, PathElement::Index(_)))
                {
                    return Some(live.clone());
                }
                let kept = items
                    .iter()
                    .enumerate()
                    .filter_map(|(index, item)| {
                        let child = self
                            .children
                            .values()
                            .find(|c| c.element.selects(index, item))?;
                        let mut projected = child.set.project_region(item)?;
                        if let (PathElement::Key(keys), Value::Object(fields)) =
                            (&child.element, &mut projected)
                        {
                            for (name, value) in keys {
                                fields.insert(name.clone(), value.clone());
                            }
                        }
                        Some(projected)
                    })
                    .collect();
                Value::Array(kept)
            }
            other => other.clone(),
        })
    }

    /// This set as seen from inside `region`: exactly this set within the region; a child that
    /// leaves the region is kept as a bare leaf, so that every node inside keeps whether it has
    /// children (a node owned itself and without children would own its whole subtree), and
    /// where the set leaves the region stays known (see [`FieldSet::region_answers`]).
    pub fn within_region(&self, region: &FieldSet) -> FieldSet {
        if region.is_leaf() {
            return self.clone();
        }
        let children = self
            .children
            .iter()
            .map(|(key, child)| {
                let set = match region.children.get(key) {
                    Some(r) => child.set.within_region(&r.set),
                    None => FieldSet::leaf(),
                };
                (
                    key.clone(),
                    Child {
                        element: child.element.clone(),
                        set,
                    },
                )
            })
            .collect();
        FieldSet {
            self_owned: self.self_owned,
            children,
        }
    }

    /// True when an object cut down to this region, with every manager's set `within_region`
    /// (`owners`), tells all that planning an apply claiming `claimed` reads: every claimed
    /// path lies in the region, or leaves it where none of `owners` owns anything (nobody
    /// holds it, whatever its value: no conflict, nothing to compare).
    pub fn region_answers(&self, claimed: &FieldSet, owners: &[&FieldSet]) -> bool {
        if self.is_leaf() || claimed.is_empty() {
            return true;
        }
        if owners.iter().any(|o| o.is_leaf()) {
            // An owner of the whole subtree: every claimed value in it is compared.
            return self.region_covers(claimed);
        }
        if claimed.is_leaf() {
            // A claim of the whole subtree: every owner's value in it is compared.
            return owners.iter().all(|o| self.region_covers(o));
        }
        claimed.children.iter().all(|(key, child)| {
            let below: Vec<&FieldSet> = owners
                .iter()
                .filter_map(|o| o.children.get(key).map(|c| &c.set))
                .collect();
            match self.children.get(key) {
                Some(region) => region.set.region_answers(&child.set, &below),
                None => below.is_empty(),
            }
        })
    }

    /// True when the set owns nothing.
    pub fn is_empty(&self) -> bool {
        !self.self_owned && self.children.is_empty()
    }

    /// A node owned itself, without children: it owns its whole subtree.
    fn leaf() -> FieldSet {
        FieldSet {
            self_owned: true,
            children: BTreeMap::new(),
        }
    }

    /// True for a leaf without children, which owns its whole subtree.
    fn is_leaf(&self) -> bool {
        self.self_owned && self.children.is_empty()
    }

    /// Adds `set` under `element`, merging with an existing child for the same element.
    fn insert_child(&mut self, element: PathElement, set: FieldSet) {
        match self.children.entry(element.encode()) {
            Entry::Vacant(slot) => {
                slot.insert(Child { element, set });
            }
            Entry::Occupied(mut slot) => slot.get_mut().set.union_with(set),
        }
    }

    /// Adds everything `other` owns to `self`.
    fn union_with(&mut self, other: FieldSet) {
        self.self_owned |= other.self_owned;
        for (key, child) in other.children {
            match self.children.entry(key) {
                Entry::Vacant(slot) => {
                    slot.insert(child);
                }
                Entry::Occupied(mut slot) => slot.get_mut().set.union_with(child.set),
            }
        }
    }

    /// Follows `path` from this node.
    fn walk(&self, path: &[PathElement]) -> Walk<'_> {
        let mut node = self;
        for element in path {
            if node.is_leaf() {
                return Walk::CoveredBy;
            }
            match node.children.get(&element.encode()) {
                Some(child) => node = &child.set,
                None => return Walk::Missing,
            }
        }
        Walk::Reached(node)
    }

    /// Encodes this node; the root writes `.` even without children.
    fn encode_node(&self, is_root: bool) -> Value {
        let mut map = Map::new();
        if self.self_owned && (is_root || !self.children.is_empty()) {
            map.insert(".".to_owned(), Value::Object(Map::new()));
        }
        for (key, child) in &self.children {
            map.insert(key.clone(), child.set.encode_node(false));
        }
        Value::Object(map)
    }

    /// Appends the leaf paths of this node (at `path`) to `out`.
    fn collect_leaves(&self, path: &mut Vec<PathElement>, out: &mut Vec<Vec<PathElement>>) {
        if self.self_owned {
            out.push(path.clone());
        }
        for child in self.children.values() {
            path.push(child.element.clone());
            child.set.collect_leaves(path, out);
            path.pop();
        }
    }

    /// Projects the `f:` children onto a live object.
    fn project_object(&self, map: &Map<String, Value>) -> Option<Value> {
        let mut out = Map::new();
        for child in self.children.values() {
            let PathElement::Field(name) = &child.element else {
                continue;
            };
            if let Some(value) = map.get(name).and_then(|live| child.set.project(live)) {
                out.insert(name.clone(), value);
            }
        }
        (!out.is_empty()).then_some(Value::Object(out))
    }

    /// Projects the list-element children onto a live list, keeping live order.
    fn project_array(&self, items: &[Value]) -> Option<Value> {
        let out: Vec<Value> = items
            .iter()
            .enumerate()
            .filter_map(|(index, item)| self.project_element(index, item))
            .collect();
        (!out.is_empty()).then_some(Value::Array(out))
    }

    /// Projects the first child selecting the live list element `item` at `index`.
    fn project_element(&self, index: usize, item: &Value) -> Option<Value> {
        let child = self
            .children
            .values()
            .find(|child| child.element.selects(index, item))?;
        let projected = child.set.project(item)?;
        match (&child.element, projected) {
            (PathElement::Key(keys), Value::Object(mut fields)) => {
                for (name, value) in keys {
                    fields.insert(name.clone(), value.clone());
                }
                Some(Value::Object(fields))
            }
            (_, projected) => Some(projected),
        }
    }
}

/// Where following a path into a [`FieldSet`] ends.
enum Walk<'a> {
    /// The path lies strictly below a leaf without children.
    CoveredBy,
    /// The path names this node.
    Reached(&'a FieldSet),
    /// The path leaves the set.
    Missing,
}

/// Decodes the object `map` found at `path`; recursion depth is bounded by [`MAX_DEPTH`].
fn decode_node(
    map: &Map<String, Value>,
    path: &mut Vec<PathElement>,
) -> Result<FieldSet, FieldsV1Error> {
    let mut set = FieldSet::default();
    for (key, value) in map {
        let Value::Object(inner) = value else {
            return Err(FieldsV1Error::NotAnObject {
                key: key.clone(),
                path: path_to_string(path),
                found: json_kind(value),
            });
        };
        if key == "." {
            if !inner.is_empty() {
                return Err(FieldsV1Error::NonEmptySelf {
                    path: path_to_string(path),
                });
            }
            set.self_owned = true;
            continue;
        }
        let element = PathElement::decode(key, path)?;
        if path.len() >= MAX_DEPTH {
            return Err(FieldsV1Error::TooDeep {
                key: key.clone(),
                path: path_to_string(path),
                max: MAX_DEPTH,
            });
        }
        path.push(element.clone());
        let child = decode_node(inner, path);
        path.pop();
        let mut child = child?;
        child.self_owned |= child.children.is_empty();
        set.insert_child(element, child);
    }
    Ok(set)
}

/// The set an apply of the object `map` at depth `depth` claims below it.
fn apply_object(map: &Map<String, Value>, ctx: &mut ApplyContext<'_>, depth: usize) -> FieldSet {
    let mut set = FieldSet::default();
    for (name, value) in map {
        ctx.schema_path.push(PathElement::Field(name.clone()));
        let child = apply_value(value, ctx, depth + 1);
        ctx.schema_path.pop();
        if let Some(child) = child {
            set.insert_child(PathElement::Field(name.clone()), child);
        }
    }
    set
}

/// The set an apply of `value` at depth `depth` claims; `None` when it claims nothing.
fn apply_value(value: &Value, ctx: &mut ApplyContext<'_>, depth: usize) -> Option<FieldSet> {
    if depth >= MAX_DEPTH {
        return Some(FieldSet::leaf());
    }
    match value {
        Value::Object(map) if !map.is_empty() => {
            let set = apply_object(map, ctx, depth);
            (!set.is_empty()).then_some(set)
        }
        Value::Array(items) => match (ctx.list_map_keys)(&ctx.schema_path) {
            Some(keys) => apply_list(items, &keys, ctx, depth),
            None => Some(FieldSet::leaf()),
        },
        _ => Some(FieldSet::leaf()),
    }
}

/// The set an apply of an associative or set list at depth `depth` claims.
fn apply_list(
    items: &[Value],
    keys: &[String],
    ctx: &mut ApplyContext<'_>,
    depth: usize,
) -> Option<FieldSet> {
    let mut set = FieldSet::default();
    for (index, item) in items.iter().enumerate() {
        let element = list_item_element(index, item, keys);
        let child = match (&element, item) {
            (PathElement::Key(_), Value::Object(fields)) if depth + 1 < MAX_DEPTH => {
                let mut child = apply_object(fields, ctx, depth + 1);
                child.self_owned = true;
                child
            }
            _ => FieldSet::leaf(),
        };
        set.insert_child(element, child);
    }
    (!set.is_empty()).then_some(set)
}

/// The path element identifying `item` (at `index`) in a list with key fields `keys`.
fn list_item_element(index: usize, item: &Value, keys: &[String]) -> PathElement {
    let Value::Object(fields) = item else {
        return PathElement::Value(canonical(item));
    };
    if keys.is_empty() {
        return PathElement::Value(canonical(item));
    }
    let key: Map<String, Value> = keys
        .iter()
        .filter_map(|name| fields.get(name).map(|v| (name.clone(), canonical(v))))
        .collect();
    if key.is_empty() {
        PathElement::Index(index)
    } else {
        PathElement::Key(key)
    }
}

/// The paths both `a` and `b` own, or `None` when they share nothing.
fn intersect(a: &FieldSet, b: &FieldSet) -> Option<FieldSet> {
    if a.is_leaf() {
        return (!b.is_empty()).then(|| b.clone());
    }
    if b.is_leaf() {
        return (!a.is_empty()).then(|| a.clone());
    }
    let mut out = FieldSet {
        self_owned: a.self_owned && b.self_owned,
        children: BTreeMap::new(),
    };
    for (key, left) in &a.children {
        let Some(right) = b.children.get(key) else {
            continue;
        };
        if let Some(set) = intersect(&left.set, &right.set) {
            let element = left.element.clone();
            out.children.insert(key.clone(), Child { element, set });
        }
    }
    (!out.is_empty()).then_some(out)
}

/// True when the live list element `item` is an object whose key fields equal `keys`.
fn key_matches(keys: &Map<String, Value>, item: &Value) -> bool {
    let Value::Object(fields) = item else {
        return false;
    };
    keys.iter()
        .all(|(name, value)| fields.get(name) == Some(value))
}

/// An empty object for an object, an empty list for a list, the value itself otherwise.
fn empty_like(live: &Value) -> Value {
    match live {
        Value::Object(_) => Value::Object(Map::new()),
        Value::Array(_) => Value::Array(Vec::new()),
        other => other.clone(),
    }
}

/// `value` with every object's keys in sorted order, whatever serde_json's map type.
fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            sorted_entries(map)
                .into_iter()
                .map(|(k, v)| (k.clone(), canonical(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// The entries of `map` sorted by key.
fn sorted_entries(map: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut entries: Vec<_> = map.iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    entries
}

/// A short description of the kind of a JSON value, for error messages.
fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Renders a path for humans and for metrics labels, e.g.
/// `.status.conditions[type=Ready].status`; the empty (root) path renders as `.`.
pub fn path_to_string(path: &[PathElement]) -> String {
    if path.is_empty() {
        return ".".to_owned();
    }
    path.iter().map(ToString::to_string).collect()
}

/// Parses a dotted path like `status.workspaceStatus.atProvider` or
/// `.spec.controlPlaneEndpoint` (one leading `.` is optional) into [`PathElement::Field`]s.
/// Fails on empty segments, including an empty path, `.` alone and a trailing `.`.
pub fn parse_field_path(s: &str) -> Result<Vec<PathElement>, FieldsV1Error> {
    let body = s.strip_prefix('.').unwrap_or(s);
    body.split('.')
        .enumerate()
        .map(|(i, segment)| {
            if segment.is_empty() {
                Err(FieldsV1Error::EmptyPathSegment {
                    path: s.to_owned(),
                    segment: i + 1,
                })
            } else {
                Ok(PathElement::Field(segment.to_owned()))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
