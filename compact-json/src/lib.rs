//! A JSON value kept small in memory, for caches that hold one per object and read it now
//! and then: its compact text, LZ4-compressed.
//!
//! A `serde_json::Value` costs several times its text (a B-tree node per map, a heap string
//! per key); the text of a CAPT object compresses about three times more (its keys and
//! `managedFields` repeat), and LZ4 takes microseconds either way, against tens for parsing
//! the text. So a cached object costs about a tenth of its value and is parsed where it is
//! read.
//!
//! Equal values have equal compact forms (`serde_json`'s maps are ordered, and compression
//! is deterministic), so comparing two is comparing the values.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::fmt;

/// A JSON value, compressed. Serializes as the value itself.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CompactJson(Box<[u8]>);

impl CompactJson {
    /// `value`, compacted.
    pub fn new(value: &impl Serialize) -> Self {
        let text = serde_json::to_vec(value).expect("a serializable value writes as JSON");
        Self(lz4_flex::compress_prepend_size(&text).into_boxed_slice())
    }

    /// The compact JSON text.
    pub fn text(&self) -> String {
        let bytes = lz4_flex::decompress_size_prepended(&self.0).expect("compressed by new");
        String::from_utf8(bytes).expect("JSON text is UTF-8")
    }

    /// The value.
    pub fn value(&self) -> Value {
        self.parse()
    }

    /// The value, as a `T` (it was written from one, or from a value of the same shape).
    ///
    /// # Panics
    /// When the value is not a `T`.
    pub fn parse<T: DeserializeOwned>(&self) -> T {
        serde_json::from_str(&self.text()).expect("the value is of the type it is read as")
    }

    /// The bytes it takes (beside its own box).
    pub fn compressed_len(&self) -> usize {
        self.0.len()
    }
}

impl Default for CompactJson {
    /// An empty object.
    fn default() -> Self {
        Self::new(&Value::Object(Default::default()))
    }
}

impl From<&Value> for CompactJson {
    fn from(value: &Value) -> Self {
        Self::new(value)
    }
}

impl fmt::Debug for CompactJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

impl Serialize for CompactJson {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for CompactJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Self::new(&Value::deserialize(deserializer)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object() -> Value {
        json!({"metadata": {"name": "c0", "labels": {"a": "b"}},
               "status": {"conditions": [{"type": "Ready", "status": "True"}], "n": 1.5}})
    }

    #[test]
    fn keeps_the_value_it_was_given() {
        let compact = CompactJson::new(&object());
        assert_eq!(compact.value(), object());
        assert_eq!(compact.text(), object().to_string());
    }

    #[test]
    fn equal_values_compact_equally_and_different_ones_do_not() {
        let reordered: Value = serde_json::from_str(
            r#"{"status": {"n": 1.5, "conditions": [{"status": "True", "type": "Ready"}]},
               "metadata": {"labels": {"a": "b"}, "name": "c0"}}"#,
        )
        .unwrap();
        assert_eq!(CompactJson::new(&reordered), CompactJson::new(&object()));
        let mut other = object();
        other["status"]["n"] = json!(2);
        assert_ne!(CompactJson::new(&other), CompactJson::new(&object()));
    }

    #[test]
    fn serializes_and_deserializes_as_the_value() {
        let compact: CompactJson = serde_json::from_value(object()).unwrap();
        assert_eq!(serde_json::to_value(&compact).unwrap(), object());
        assert_eq!(format!("{compact:?}"), object().to_string());
    }

    #[test]
    fn a_repetitive_object_takes_less_than_its_text() {
        let conditions: Vec<Value> = (0..20)
            .map(|i| {
                json!({"type": format!("Condition{i}"), "status": "True",
                            "reason": "Ready", "lastTransitionTime": "2026-11-27T16:00:00Z"})
            })
            .collect();
        let value = json!({"status": {"conditions": conditions}});
        let compact = CompactJson::new(&value);
        assert!(
            compact.compressed_len() * 3 < value.to_string().len(),
            "{} of {}",
            compact.compressed_len(),
            value.to_string().len()
        );
    }
}
