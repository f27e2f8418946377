//! A JSON value kept small in memory, for caches that hold one per object and read it now
//! and then: its compact text, LZ4-compressed.
//!
//! A `serde_json::Value` costs several times its text (a B-tree node per map, a heap string
//! per key); the text of a CAPT object compresses about three times more (its keys and
//! `managedFields` repeat), and LZ4 takes microseconds either way, against tens for parsing
//! the text. So a cached object costs about a tenth of its value and is parsed where it is
//! read.
//!
//! Values of one shape (the objects of one kind, cut down alike) repeat one another's keys
//! and field sets, which a value alone cannot exploit: [`Dictionaries`] compresses each
//! against the text of a recent one of them, a few times smaller again.
//!
//! Equal values have equal compact forms against the same dictionary (`serde_json`'s maps
//! are ordered, and compression is deterministic), so comparing two is comparing their bytes,
//! and their texts when their dictionaries differ.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::fmt;
use std::sync::{Arc, Mutex};

/// A JSON value, compressed. Serializes as the value itself.
#[derive(Clone)]
pub struct CompactJson {
    bytes: Box<[u8]>,
    /// What `bytes` were compressed against, if anything.
    dictionary: Option<Dictionary>,
}

/// The text compact values are compressed against, shared by all of them.
#[derive(Clone)]
pub struct Dictionary(Arc<[u8]>);

impl Dictionary {
    /// LZ4 looks back 64 KiB at most; values held compact are far smaller, and so is a
    /// dictionary worth holding.
    const MAX_LEN: usize = 16 * 1024;

    fn new(text: &[u8]) -> Self {
        // The end of a dictionary is the part LZ4 reaches first.
        Self(text[text.len().saturating_sub(Self::MAX_LEN)..].into())
    }

    fn same(a: Option<&Self>, b: Option<&Self>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(&a.0, &b.0),
            _ => false,
        }
    }
}

impl CompactJson {
    /// `value`, compacted.
    pub fn new(value: &impl Serialize) -> Self {
        Self::compress(&text_of(value), None)
    }

    fn compress(text: &[u8], dictionary: Option<Dictionary>) -> Self {
        let bytes = match &dictionary {
            Some(d) => lz4_flex::block::compress_prepend_size_with_dict(text, &d.0),
            None => lz4_flex::compress_prepend_size(text),
        };
        Self {
            bytes: bytes.into_boxed_slice(),
            dictionary,
        }
    }

    fn text_bytes(&self) -> Vec<u8> {
        match &self.dictionary {
            Some(d) => lz4_flex::block::decompress_size_prepended_with_dict(&self.bytes, &d.0),
            None => lz4_flex::decompress_size_prepended(&self.bytes),
        }
        .expect("compressed by compress")
    }

    /// The compact JSON text.
    pub fn text(&self) -> String {
        String::from_utf8(self.text_bytes()).expect("JSON text is UTF-8")
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

    /// The bytes it takes (beside its own box, and its dictionary's).
    pub fn compressed_len(&self) -> usize {
        self.bytes.len()
    }
}

fn text_of(value: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(value).expect("a serializable value writes as JSON")
}

impl PartialEq for CompactJson {
    fn eq(&self, other: &Self) -> bool {
        if Dictionary::same(self.dictionary.as_ref(), other.dictionary.as_ref()) {
            self.bytes == other.bytes
        } else {
            self.text_bytes() == other.text_bytes()
        }
    }
}

impl Eq for CompactJson {}

/// Compacts values of one shape, each against the text of a recent one.
///
/// The first value becomes the dictionary; a value at least a quarter longer than the
/// dictionary replaces it (values grow as objects fill in, so a longer one shares more with
/// those to come), and so does the next value at least half as long once
/// [`Self::REFRESH`] values have been compacted since, so that the dictionary follows the
/// values as they change. A dictionary lives as long as a value compressed against it: a few
/// at a time, each at most 16 KiB.
#[derive(Default)]
pub struct Dictionaries {
    current: Mutex<Current>,
}

#[derive(Default)]
struct Current {
    dictionary: Option<Dictionary>,
    /// The length of the text it was sampled from (a dictionary is at most 16 KiB of it).
    sampled_len: usize,
    compacted_since: u32,
}

impl Dictionaries {
    /// Values compacted against one dictionary before the next one is sampled.
    pub const REFRESH: u32 = 1024;

    /// `value`, compacted against the current dictionary (which it may become).
    pub fn compact(&self, value: &impl Serialize) -> CompactJson {
        let text = text_of(value);
        let dictionary = {
            let mut current = self.current.lock().expect("lock");
            let sampled = current.sampled_len;
            let replace = current.dictionary.is_none()
                || text.len() * 4 >= sampled * 5
                || (current.compacted_since >= Self::REFRESH && text.len() * 2 >= sampled);
            if replace {
                current.dictionary = Some(Dictionary::new(&text));
                current.sampled_len = text.len();
                current.compacted_since = 0;
            }
            current.compacted_since += 1;
            current.dictionary.clone()
        };
        CompactJson::compress(&text, dictionary)
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

    /// An object of one kind as the applier keeps it, told apart from its siblings by a few
    /// values.
    fn sibling(i: usize) -> Value {
        let conditions: Vec<Value> = ["Ready", "InfrastructureReady", "ControlPlaneReady"]
            .iter()
            .map(|t| {
                json!({"type": t, "status": "True", "reason": "Provisioned",
                            "lastTransitionTime": format!("2026-11-27T16:{:02}:00Z", i % 60)})
            })
            .collect();
        json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
               "metadata": {"name": format!("cluster-{i}"), "namespace": "tenant-a",
                            "uid": format!("0c1d{i:04}-77aa-4c1e-9d6e-5b1f2e3a4b5c"),
                            "resourceVersion": format!("{}", 100_000 + i * 7)},
               "status": {"ready": true, "initialized": true, "version": "1.31",
                          "controlPlaneEndpoint": {"host": format!("https://{i:x}.eks.amazonaws.com"), "port": 443},
                          "conditions": conditions}})
    }

    #[test]
    fn siblings_compacted_against_one_another_take_a_fraction_of_what_they_take_alone() {
        let dictionaries = Dictionaries::default();
        let (mut alone, mut together) = (0, 0);
        for i in 0..100 {
            let value = sibling(i);
            let compact = dictionaries.compact(&value);
            assert_eq!(compact.value(), value);
            alone += CompactJson::new(&value).compressed_len();
            together += compact.compressed_len();
        }
        assert!(together * 3 < alone, "{together} against {alone} alone");
    }

    #[test]
    fn values_against_different_dictionaries_compare_by_their_text() {
        let (a, b) = (Dictionaries::default(), Dictionaries::default());
        a.compact(&sibling(1));
        b.compact(&sibling(2));
        assert_eq!(a.compact(&sibling(3)), b.compact(&sibling(3)));
        assert_eq!(a.compact(&sibling(3)), CompactJson::new(&sibling(3)));
        assert_ne!(a.compact(&sibling(3)), b.compact(&sibling(4)));
        assert_ne!(a.compact(&sibling(3)), a.compact(&sibling(4)));
    }

    #[test]
    fn the_dictionary_follows_longer_values_and_is_sampled_again_after_a_while() {
        let dictionaries = Dictionaries::default();
        let first = dictionaries.compact(&json!({"a": 1}));
        let longer = dictionaries.compact(&sibling(1));
        assert!(!Dictionary::same(
            first.dictionary.as_ref(),
            longer.dictionary.as_ref()
        ));
        // Values no longer than the dictionary's keep it, until it is sampled again.
        let mut last = longer.clone();
        for i in 0..Dictionaries::REFRESH - 1 {
            last = dictionaries.compact(&sibling(i as usize % 10));
            assert!(Dictionary::same(
                last.dictionary.as_ref(),
                longer.dictionary.as_ref()
            ));
        }
        let sampled = dictionaries.compact(&sibling(11));
        assert!(!Dictionary::same(
            sampled.dictionary.as_ref(),
            last.dictionary.as_ref()
        ));
        assert_eq!(sampled.value(), sibling(11));
    }

    #[test]
    fn a_dictionary_holds_the_end_of_a_long_value() {
        let long = json!({"a": "x".repeat(40_000), "b": "the end"});
        let compact = Dictionaries::default().compact(&long);
        assert_eq!(compact.dictionary.as_ref().unwrap().0.len(), 16 * 1024);
        assert!(
            compact
                .dictionary
                .unwrap()
                .0
                .ends_with(br#""b":"the end"}"#)
        );
    }
}
