//! Fuzzes intent parsing and merging: arbitrary bytes must parse or fail cleanly; a valid
//! intent's fragment merges into an arbitrary current document without panicking, the
//! result keeps every protected value the intent did not release, and a second merge of the
//! same fragment changes nothing (merging is idempotent).
#![no_main]

use libfuzzer_sys::fuzz_target;
use status_applier::config::Policy;
use status_applier::intent::{Intent, IntentExt};
use status_applier::merge::{get, merge_fragment};

/// What the merge rules count as a value (null, "", {} and [] are none).
fn has_content(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Null => false,
        serde_json::Value::String(s) => !s.is_empty(),
        serde_json::Value::Object(m) => !m.is_empty(),
        serde_json::Value::Array(a) => !a.is_empty(),
        _ => true,
    }
}

fuzz_target!(|data: &[u8]| {
    let (current, body) = data.split_at(data.len() / 3);
    let Ok(intent) = Intent::parse(body) else {
        return;
    };
    // A made-up kind with one protected and one replaced subtree: the sidecar is generic.
    let policy = Policy {
        protected: vec!["Widget.example.com:status.mirror.observed".parse().unwrap()],
        replaced: vec!["Widget.example.com:status.mirror".parse().unwrap()],
        ..Policy::default()
    };
    let Ok(valid) = intent.validate(&policy) else {
        return;
    };
    let current: serde_json::Value =
        serde_json::from_slice(current).unwrap_or_else(|_| serde_json::json!({}));
    let rules = policy.rules_for(&valid.key.object.group_kind());
    let once = merge_fragment(&current, &valid.fragment, &rules, &valid.release);
    for path in &rules.protected {
        let released = valid.release.iter().any(|r| r.contains(path));
        if get(&current, path).is_some_and(has_content) && !released {
            assert!(
                get(&once.document, path).is_some(),
                "protected {path} vanished"
            );
        }
    }
    let twice = merge_fragment(&once.document, &valid.fragment, &rules, &valid.release);
    assert_eq!(
        twice.document, once.document,
        "merging the same fragment twice changed the document"
    );
});
