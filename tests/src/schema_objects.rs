//! Random JSON values valid against an OpenAPI v3 schema as the API server reads a CRD's (a
//! structural schema), for property tests of what the server accepts.
//!
//! Each optional property is present or absent at random, types, enums, formats, bounds,
//! lengths and patterns are kept, maps (`additionalProperties`) and lists (unique where
//! `x-kubernetes-list-type` says so) get a few entries, `x-kubernetes-int-or-string` gives
//! either, and a `x-kubernetes-preserve-unknown-fields` object may carry fields of its own.
//! What a schema cannot say (CEL rules, webhooks) is left to the server: it refuses what
//! breaks them. One seed gives one sequence of values, on any machine (proptest's ChaCha).

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::string::RegexGeneratorStrategy;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use regex_syntax::hir::{Hir, HirKind};
use serde_json::{Map, Value, json};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// How likely an optional property is present. Low enough that deep objects stay small (each
/// nested optional object halves again), high enough that every property shows up often.
const PRESENT: f64 = 0.4;
/// How likely a nullable property that is present is `null`.
const NULL: f64 = 0.1;
/// Below this depth only required properties are filled.
const MAX_DEPTH: usize = 12;
/// At most this many items a list or map gets beyond its minimum.
const MAX_EXTRA_ITEMS: usize = 3;

/// A seeded source of random values for schemas.
pub struct Generator {
    runner: TestRunner,
    /// Each pattern's strategy, parsed once (`None`: one proptest cannot generate).
    patterns: HashMap<String, Option<Rc<RegexGeneratorStrategy<String>>>>,
}

impl Generator {
    /// The generator of `seed` for `stream` (a kind's name): each stream has its own
    /// sequence, so that one kind's values do not depend on how many another one drew.
    pub fn new(seed: u64, stream: &str) -> Self {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        // FNV-1a of the stream's name: stable across builds, unlike `DefaultHasher`.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for b in stream.bytes() {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        bytes[8..16].copy_from_slice(&hash.to_le_bytes());
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
        Self {
            runner: TestRunner::new_with_rng(Config::default(), rng),
            patterns: HashMap::new(),
        }
    }

    /// A value valid against `schema` (no `$ref`s: see [`inline_refs`]).
    pub fn value(&mut self, schema: &Value) -> Value {
        self.at(schema, 0)
    }

    fn draw<S: Strategy>(&mut self, strategy: S) -> S::Value {
        strategy
            .new_tree(&mut self.runner)
            .expect("a strategy without filters always gives a value")
            .current()
    }

    fn chance(&mut self, p: f64) -> bool {
        self.draw(prop::bool::weighted(p))
    }

    fn index(&mut self, len: usize) -> usize {
        self.draw(0..len.max(1))
    }

    fn at(&mut self, schema: &Value, depth: usize) -> Value {
        let schema = &self.merged_branch(schema);
        if schema["x-kubernetes-int-or-string"] == json!(true) {
            return if self.chance(0.5) {
                json!(self.draw(0..100i64))
            } else {
                json!(format!("{}%", self.draw(0..=100u8)))
            };
        }
        if let Some(values) = schema["enum"].as_array().filter(|v| !v.is_empty()) {
            return values[self.index(values.len())].clone();
        }
        match schema["type"].as_str() {
            Some("object") => self.object(schema, depth),
            Some("array") => self.array(schema, depth),
            Some("string") => json!(self.string(schema)),
            Some("integer") => json!(self.integer(schema)),
            Some("number") => json!(self.number(schema)),
            Some("boolean") => json!(self.chance(0.5)),
            _ => self.anything(depth),
        }
    }

    /// The schema with one of its `allOf`/`anyOf`/`oneOf` branches folded in (the
    /// int-or-string `anyOf` stays as it is: its flag says it all).
    fn merged_branch(&mut self, schema: &Value) -> Value {
        let mut merged = schema.clone();
        let Some(object) = merged.as_object_mut() else {
            return merged;
        };
        if let Some(Value::Array(all)) = object.remove("allOf") {
            for part in all {
                merge_into(object, part);
            }
        }
        if object.get("x-kubernetes-int-or-string") != Some(&json!(true)) {
            for key in ["anyOf", "oneOf"] {
                if let Some(Value::Array(branches)) = object.remove(key)
                    && !branches.is_empty()
                {
                    let branch = branches[self.index(branches.len())].clone();
                    merge_into(object, branch);
                }
            }
        }
        merged
    }

    fn object(&mut self, schema: &Value, depth: usize) -> Value {
        let mut out = Map::new();
        let required: HashSet<&str> = schema["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let empty = Map::new();
        let properties = schema["properties"].as_object().unwrap_or(&empty);
        let mut absent = Vec::new();
        for (name, property) in properties {
            if required.contains(name.as_str()) {
                out.insert(name.clone(), self.at(property, depth + 1));
            } else if depth < MAX_DEPTH && self.chance(PRESENT) {
                let value = if property["nullable"] == json!(true) && self.chance(NULL) {
                    Value::Null
                } else {
                    self.at(property, depth + 1)
                };
                out.insert(name.clone(), value);
            } else {
                absent.push(name);
            }
        }
        let min = schema["minProperties"].as_u64().unwrap_or(0) as usize;
        for name in absent {
            if out.len() >= min {
                break;
            }
            out.insert(name.clone(), self.at(&properties[name], depth + 1));
        }
        let max = schema["maxProperties"]
            .as_u64()
            .map_or(usize::MAX, |m| m as usize);
        let extra = |g: &mut Self, min_extra: usize| {
            let room = max.saturating_sub(out.len());
            let wanted = g.draw(min_extra..=min_extra + MAX_EXTRA_ITEMS);
            wanted.min(room)
        };
        match &schema["additionalProperties"] {
            Value::Object(values) => {
                let values = Value::Object(values.clone());
                let n = extra(self, min.saturating_sub(out.len()));
                for _ in 0..n {
                    let key = self.key();
                    let value = self.at(&values, depth + 1);
                    out.insert(key, value);
                }
            }
            Value::Bool(true) => {
                for _ in 0..extra(self, 0) {
                    let (key, value) = (self.key(), self.anything(depth + 1));
                    out.insert(key, value);
                }
            }
            _ if schema["x-kubernetes-preserve-unknown-fields"] == json!(true)
                && self.chance(0.5) =>
            {
                for _ in 0..extra(self, 0) {
                    let (key, value) = (self.key(), self.anything(depth + 1));
                    out.entry(key).or_insert(value);
                }
            }
            _ => {}
        }
        Value::Object(out)
    }

    fn array(&mut self, schema: &Value, depth: usize) -> Value {
        let min = schema["minItems"].as_u64().unwrap_or(0) as usize;
        let max = schema["maxItems"]
            .as_u64()
            .map_or(usize::MAX, |m| m as usize);
        let upper = if depth < MAX_DEPTH {
            max.min(min + MAX_EXTRA_ITEMS)
        } else {
            min
        };
        let len = self.draw(min..=upper.max(min));
        let mut items: Vec<Value> = (0..len)
            .map(|_| self.at(&schema["items"], depth + 1))
            .collect();
        match schema["x-kubernetes-list-type"].as_str() {
            Some("set") => {
                let mut seen = HashSet::new();
                items.retain(|v| seen.insert(v.to_string()));
            }
            Some("map") => {
                let keys: Vec<&str> = schema["x-kubernetes-list-map-keys"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                let mut seen = HashSet::new();
                items.retain(|v| {
                    seen.insert(keys.iter().map(|k| v[k].to_string()).collect::<Vec<_>>())
                });
            }
            _ => {}
        }
        Value::Array(items)
    }

    fn string(&mut self, schema: &Value) -> String {
        let min = schema["minLength"].as_u64().unwrap_or(0) as usize;
        let max = schema["maxLength"]
            .as_u64()
            .map_or(usize::MAX, |m| m as usize);
        let fits = |s: &str| (min..=max).contains(&s.chars().count());
        match schema["format"].as_str() {
            Some("date-time") => return self.timestamp(),
            Some("byte") => {
                let bytes = self.draw(prop::collection::vec(any::<u8>(), 0..24));
                return base64(&bytes);
            }
            Some("duration") => {
                return format!(
                    "{}h{}m{}s",
                    self.draw(0..48u32),
                    self.draw(0..60u32),
                    self.draw(0..60u32)
                );
            }
            _ => {}
        }
        if let Some(pattern) = schema["pattern"].as_str()
            && let Some(strategy) = (self.patterns.entry(pattern.to_owned()))
                .or_insert_with(|| pattern_strategy(pattern).map(Rc::new))
                .clone()
        {
            // A pattern and a length together: draw a few, keep the first that fits.
            let mut last = String::new();
            for _ in 0..8 {
                last = self.draw(strategy.clone());
                if fits(&last) {
                    break;
                }
            }
            return last;
        }
        let upper = max.min(min + 16).max(min);
        let len = self.draw(min..=upper);
        let first = self.draw(prop::char::range('a', 'z'));
        let rest: String = self.draw(prop::collection::vec(
            prop_oneof![8 => prop::char::range('a', 'z'), 3 => prop::char::range('0', '9'), 1 => Just('-')],
            len.saturating_sub(2),
        )).into_iter().collect();
        let last = self.draw(prop::char::range('0', '9'));
        match len {
            0 => String::new(),
            1 => first.to_string(),
            _ => format!("{first}{rest}{last}"),
        }
    }

    fn timestamp(&mut self) -> String {
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            self.draw(2000..2040u32),
            self.draw(1..=12u32),
            self.draw(1..=28u32),
            self.draw(0..24u32),
            self.draw(0..60u32),
            self.draw(0..60u32)
        )
    }

    fn integer(&mut self, schema: &Value) -> i64 {
        let (low, high) = match schema["format"].as_str() {
            Some("int32") => (i64::from(i32::MIN), i64::from(i32::MAX)),
            // JSON numbers beyond 2^53 lose precision on the way through some clients.
            _ => (-(1i64 << 53), 1i64 << 53),
        };
        let mut low = schema["minimum"].as_i64().unwrap_or(low);
        let mut high = schema["maximum"].as_i64().unwrap_or(high);
        if schema["exclusiveMinimum"] == json!(true) {
            low += 1;
        }
        if schema["exclusiveMaximum"] == json!(true) {
            high -= 1;
        }
        if low > high {
            return low;
        }
        // Mostly small numbers (what fields mean), sometimes anywhere in range.
        let small_low = low.max(0).min(high);
        let small_high = high.min(small_low.saturating_add(1000));
        if self.chance(0.8) {
            self.draw(small_low..=small_high)
        } else {
            self.draw(low..=high)
        }
    }

    fn number(&mut self, schema: &Value) -> f64 {
        let low = schema["minimum"].as_f64().unwrap_or(-1e6);
        let high = schema["maximum"].as_f64().unwrap_or(1e6);
        if low >= high {
            return low;
        }
        self.draw(low..high)
    }

    /// A map key or unknown field's name: a label key, sometimes with a prefix.
    fn key(&mut self) -> String {
        let name = self.draw("[a-z][a-z0-9]{0,7}");
        if self.chance(0.2) {
            format!("example.com/{name}")
        } else {
            name
        }
    }

    /// Any small JSON value (what a field without a schema, kept verbatim, may hold).
    fn anything(&mut self, depth: usize) -> Value {
        let choice = if depth < MAX_DEPTH {
            self.index(6)
        } else {
            self.index(4)
        };
        match choice {
            0 => json!(self.chance(0.5)),
            1 => json!(self.draw(-1000i64..1000)),
            2 => json!(self.draw("[a-zA-Z0-9 ._-]{0,12}")),
            3 => Value::Null,
            4 => {
                let n = self.draw(0..=MAX_EXTRA_ITEMS);
                Value::Array((0..n).map(|_| self.anything(depth + 1)).collect())
            }
            _ => {
                let n = self.draw(0..=MAX_EXTRA_ITEMS);
                let mut out = Map::new();
                for _ in 0..n {
                    let (key, value) = (self.key(), self.anything(depth + 1));
                    out.insert(key, value);
                }
                Value::Object(out)
            }
        }
    }
}

/// Adds `part`'s keys to `object`; `properties` and `required` are joined.
fn merge_into(object: &mut Map<String, Value>, part: Value) {
    let Value::Object(part) = part else { return };
    for (key, value) in part {
        match (key.as_str(), object.get_mut(&key), value) {
            ("properties", Some(Value::Object(mine)), Value::Object(theirs)) => mine.extend(theirs),
            ("required", Some(Value::Array(mine)), Value::Array(theirs)) => mine.extend(theirs),
            (_, Some(_), _) => {}
            (_, None, value) => {
                object.insert(key, value);
            }
        }
    }
}

/// A strategy for strings matching `pattern` as a whole: its anchors (`^`, `$`, which
/// proptest cannot generate) dropped, for a generated string is matched whole anyway. `None`
/// for what `regex-syntax` cannot parse (a Go or ECMA pattern beyond it).
fn pattern_strategy(pattern: &str) -> Option<RegexGeneratorStrategy<String>> {
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(pattern)
        .ok()?;
    proptest::string::string_regex_parsed(&without_anchors(&hir)).ok()
}

fn without_anchors(hir: &Hir) -> Hir {
    match hir.kind() {
        HirKind::Look(_) => Hir::empty(),
        HirKind::Repetition(rep) => Hir::repetition(regex_syntax::hir::Repetition {
            sub: Box::new(without_anchors(&rep.sub)),
            ..rep.clone()
        }),
        HirKind::Capture(capture) => Hir::capture(regex_syntax::hir::Capture {
            sub: Box::new(without_anchors(&capture.sub)),
            ..capture.clone()
        }),
        HirKind::Concat(subs) => Hir::concat(subs.iter().map(without_anchors).collect()),
        HirKind::Alternation(subs) => Hir::alternation(subs.iter().map(without_anchors).collect()),
        _ => hir.clone(),
    }
}

/// Standard base64 with padding (the `byte` format).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `schema` with every `$ref` to `#/components/schemas/NAME` replaced by that schema of
/// `components` (an OpenAPI v3 document's), but those named in `opaque`, which become plain
/// objects (the caller fills them: `ObjectMeta`).
pub fn inline_refs(schema: &Value, components: &Value, opaque: &[&str]) -> Value {
    match schema {
        Value::Object(object) => {
            if let Some(reference) = object.get("$ref").and_then(Value::as_str) {
                let name = reference.trim_start_matches("#/components/schemas/");
                if opaque.contains(&name) {
                    return json!({"type": "object"});
                }
                return inline_refs(&components[name], components, opaque);
            }
            Value::Object(
                object
                    .iter()
                    .map(|(k, v)| (k.clone(), inline_refs(v, components, opaque)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| inline_refs(v, components, opaque))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn many(schema: Value) -> Vec<Value> {
        let mut g = Generator::new(7, "test");
        (0..200).map(|_| g.value(&schema)).collect()
    }

    #[test]
    fn optional_properties_are_sometimes_present_and_sometimes_absent() {
        let values = many(json!({"type": "object", "required": ["a"],
            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}));
        assert!(values.iter().all(|v| v["a"].is_string()));
        assert!(values.iter().any(|v| v.get("b").is_some()));
        assert!(values.iter().any(|v| v.get("b").is_none()));
    }

    #[test]
    fn bounds_enums_patterns_and_lengths_are_kept() {
        for v in many(json!({"type": "integer", "minimum": 1, "maximum": 65535})) {
            assert!((1..=65535).contains(&v.as_i64().unwrap()), "{v}");
        }
        for v in many(json!({"type": "string", "enum": ["A", "B"]})) {
            assert!(v == "A" || v == "B", "{v}");
        }
        for v in many(json!({"type": "string", "pattern": "^[a-z]{2}-[0-9]+$"})) {
            let s = v.as_str().unwrap();
            let (letters, digits) = s.split_once('-').unwrap();
            assert!(letters.len() == 2 && !digits.is_empty(), "{s}");
        }
        for v in many(json!({"type": "string", "minLength": 1, "maxLength": 5})) {
            assert!((1..=5).contains(&v.as_str().unwrap().len()), "{v}");
        }
    }

    #[test]
    fn min_properties_are_met_and_list_maps_have_unique_keys() {
        for v in many(json!({"type": "object", "minProperties": 1,
            "properties": {"host": {"type": "string"}, "port": {"type": "integer"}}}))
        {
            assert!(!v.as_object().unwrap().is_empty(), "{v}");
        }
        for v in many(json!({"type": "array", "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"], "items": {"type": "object",
            "required": ["name"], "properties": {"name": {"type": "string", "enum": ["a", "b"]}}}}))
        {
            let names: Vec<_> = v.as_array().unwrap().iter().map(|i| &i["name"]).collect();
            assert!(names.len() <= 2, "{v}");
        }
    }

    #[test]
    fn one_seed_gives_one_sequence_and_streams_differ() {
        let schema = json!({"type": "string"});
        let draw = |stream| {
            let mut g = Generator::new(42, stream);
            (0..5).map(|_| g.value(&schema)).collect::<Vec<_>>()
        };
        assert_eq!(draw("a"), draw("a"));
        assert_ne!(draw("a"), draw("b"));
    }

    #[test]
    fn base64_pads_as_the_standard_does() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foob"), "Zm9vYg==");
    }
}
