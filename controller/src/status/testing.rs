//! Test support shared by the status modules: time builders and an RFC 7386 merge, to play
//! the status-applier's part across a sequence of reconciles.

use jiff::Timestamp;
use serde_json::Value;

/// The reference time of the tests: 2024-01-01T00:00:00Z.
pub const T0: &str = "2024-01-01T00:00:00Z";

/// Parses an RFC 3339 timestamp.
pub fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// `T0` plus `minutes`.
pub fn at_min(minutes: i64) -> Timestamp {
    ts(T0)
        .checked_add(jiff::SignedDuration::from_mins(minutes))
        .unwrap()
}

/// True when `value` holds a JSON `null` anywhere.
pub fn has_null(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.iter().any(has_null),
        Value::Object(map) => map.values().any(has_null),
        _ => false,
    }
}

/// The `(reason, message)` of condition `type_` while it is True, else `(null, null)`: how a
/// status tells a failure. `failureReason`/`failureMessage` are for terminal failures only
/// (the Cluster API contract) and must stay absent.
pub fn failure(status: &Value, type_: &str) -> (Value, Value) {
    for field in ["failureReason", "failureMessage"] {
        assert!(
            status.get(field).is_none_or(Value::is_null),
            "{field}: {status}"
        );
    }
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_ && c["status"] == "True")
        .map_or((Value::Null, Value::Null), |c| {
            (c["reason"].clone(), c["message"].clone())
        })
}
