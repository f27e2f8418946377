//! Fuzzes fieldsV1 decoding: arbitrary JSON must decode or fail cleanly, and whatever decodes
//! must round-trip through `to_fields_v1` and survive `project` and `leaf_paths`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use managed_fields::FieldSet;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(set) = FieldSet::from_fields_v1(&value) else {
        return;
    };
    let encoded = set.to_fields_v1();
    let decoded = FieldSet::from_fields_v1(&encoded).expect("encoded fieldsV1 must decode");
    assert_eq!(decoded, set, "round trip changed the set");
    let _ = set.project(&value);
    let _ = set.leaf_paths();
});
