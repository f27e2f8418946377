//! Unit tests of the fake provider's pure parts: annotations, checksum, status bodies and
//! their comparison, the connection Secret and the watch selector.

use super::*;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn map(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

#[test]
fn parses_outputs_sensitive_failure_and_revision() {
    let d = Desired::parse(&annotations(&[
        (
            OUTPUTS_ANNOTATION,
            r#"{"vpc_id":"vpc-123","azs":["a","b"]}"#,
        ),
        (
            SENSITIVE_OUTPUTS_ANNOTATION,
            r#"{"kubeconfig":"apiVersion: v1"}"#,
        ),
        (FAIL_ANNOTATION, "  boom  "),
        (REVISION_ANNOTATION, "7"),
        ("other", "x"),
    ]))
    .unwrap();
    assert_eq!(
        d.outputs,
        map(json!({"vpc_id": "vpc-123", "azs": ["a", "b"]}))
    );
    assert_eq!(d.sensitive, map(json!({"kubeconfig": "apiVersion: v1"})));
    assert_eq!(d.failure.as_deref(), Some("boom"));
    assert_eq!(d.revision.as_deref(), Some("7"));
}

#[test]
fn absent_or_empty_annotations_mean_no_outputs_and_no_failure() {
    assert_eq!(
        Desired::parse(&BTreeMap::new()).unwrap(),
        Desired::default()
    );
    let d = Desired::parse(&annotations(&[
        (OUTPUTS_ANNOTATION, " "),
        (FAIL_ANNOTATION, ""),
    ]))
    .unwrap();
    assert_eq!(d, Desired::default());
}

#[test]
fn bad_annotations_are_errors_that_become_failures_without_values() {
    let bad = annotations(&[
        (SENSITIVE_OUTPUTS_ANNOTATION, r#"{"password": "hunter2""#),
        (REVISION_ANNOTATION, "3"),
    ]);
    let e = Desired::parse(&bad).unwrap_err();
    assert_eq!(e.annotation, SENSITIVE_OUTPUTS_ANNOTATION);
    assert!(e.reason.starts_with("invalid JSON"), "{e}");
    let d = Desired::from_annotations(&bad);
    let message = d.failure.clone().unwrap();
    assert!(message.contains(SENSITIVE_OUTPUTS_ANNOTATION), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
    assert!(d.outputs.is_empty() && d.sensitive.is_empty());
    assert_eq!(d.revision.as_deref(), Some("3"));

    let e = Desired::parse(&annotations(&[(OUTPUTS_ANNOTATION, "[1]")])).unwrap_err();
    assert!(e.reason.contains("an array"), "{e}");
    let e = Desired::parse(&annotations(&[(OUTPUTS_ANNOTATION, r#"{"a b":1}"#)])).unwrap_err();
    assert!(e.reason.contains("Secret key"), "{e}");
    let e = Desired::parse(&annotations(&[
        (OUTPUTS_ANNOTATION, r#"{"a":1}"#),
        (SENSITIVE_OUTPUTS_ANNOTATION, r#"{"a":2}"#),
    ]))
    .unwrap_err();
    assert!(e.reason.contains("also in"), "{e}");
}

#[test]
fn debug_never_shows_sensitive_values() {
    let d = Desired::parse(&annotations(&[(
        SENSITIVE_OUTPUTS_ANNOTATION,
        r#"{"token":"s3cr3t"}"#,
    )]))
    .unwrap();
    let text = format!("{d:?}");
    assert!(text.contains("token") && !text.contains("s3cr3t"), "{text}");
}

#[test]
fn connection_data_holds_every_output_as_text() {
    let d = Desired {
        outputs: map(json!({"vpc_id": "vpc-1", "port": 443, "azs": ["a"]})),
        sensitive: map(json!({"token": "t"})),
        ..Desired::default()
    };
    let data = d.connection_data();
    assert_eq!(data["vpc_id"], "vpc-1");
    assert_eq!(data["port"], "443");
    assert_eq!(data["azs"], r#"["a"]"#);
    assert_eq!(data["token"], "t");
    assert_eq!(data.len(), 4);
}

#[test]
fn checksum_is_deterministic_and_follows_spec_outputs_and_revision() {
    let spec = json!({"forProvider": {"source": "Inline", "module": "# none"}});
    let d = Desired {
        outputs: map(json!({"a": 1, "b": 2})),
        ..Desired::default()
    };
    let c = checksum(&spec, &d);
    assert_eq!(c.len(), 16);
    assert!(c.chars().all(|ch| ch.is_ascii_hexdigit()));
    // Key order does not matter.
    let reordered = Desired {
        outputs: map(json!({"b": 2, "a": 1})),
        ..Desired::default()
    };
    let spec2 = json!({"forProvider": {"module": "# none", "source": "Inline"}});
    assert_eq!(checksum(&spec2, &reordered), c);
    let with_rev = Desired {
        revision: Some("2".into()),
        ..d.clone()
    };
    assert_ne!(checksum(&spec, &with_rev), c);
    let with_secret = Desired {
        sensitive: map(json!({"t": "x"})),
        ..d.clone()
    };
    assert_ne!(checksum(&spec, &with_secret), c);
    assert_ne!(checksum(&json!({"forProvider": {}}), &d), c);
    // A failure changes the state key, not the checksum.
    let failing = Desired {
        failure: Some("boom".into()),
        ..d.clone()
    };
    assert_eq!(checksum(&spec, &failing), c);
    assert_ne!(failing.state_key(&spec), d.state_key(&spec));
}

#[test]
fn canonical_json_sorts_keys_at_every_level() {
    let v = json!({"b": {"d": 1, "c": [{"z": 1, "y": "\"q"}]}, "a": null});
    assert_eq!(
        canonical_json(&v),
        r#"{"a":null,"b":{"c":[{"y":"\"q","z":1}],"d":1}}"#
    );
}

const T0: &str = "2026-01-01T00:00:00Z";
const T1: &str = "2026-01-01T00:01:00Z";

fn ready_reason(body: &Value) -> (&str, &str) {
    let c = condition(Some(&body["status"]), "Ready").unwrap();
    (c["status"].as_str().unwrap(), c["reason"].as_str().unwrap())
}

#[test]
fn status_bodies_mirror_provider_terraform() {
    let creating = status_apply("ws", Some(3), None, &Phase::Creating, T0);
    assert_eq!(creating["apiVersion"], API_VERSION);
    assert_eq!(creating["kind"], KIND);
    assert_eq!(creating["metadata"], json!({"name": "ws"}));
    assert_eq!(
        creating["status"]["conditions"][0],
        json!({"type": "Synced", "status": "True", "reason": "ReconcileSuccess", "message": "",
               "lastTransitionTime": T0, "observedGeneration": 3})
    );
    assert_eq!(ready_reason(&creating), ("False", "Creating"));
    assert!(creating["status"].get("atProvider").is_none());

    let outputs = map(json!({"vpc_id": "vpc-1"}));
    let available = status_apply(
        "ws",
        Some(3),
        Some(&creating["status"]),
        &Phase::Available {
            checksum: "abc".into(),
            outputs: outputs.clone(),
        },
        T1,
    );
    assert_eq!(ready_reason(&available), ("True", "Available"));
    assert_eq!(
        available["status"]["atProvider"],
        json!({"checksum": "abc", "outputs": {"vpc_id": "vpc-1"}})
    );
    // Synced stayed True: its transition time is kept; Ready flipped: it is new.
    let synced = condition(Some(&available["status"]), "Synced").unwrap();
    assert_eq!(synced["lastTransitionTime"], T0);
    let ready = condition(Some(&available["status"]), "Ready").unwrap();
    assert_eq!(ready["lastTransitionTime"], T1);

    let failed = status_apply(
        "ws",
        None,
        Some(&available["status"]),
        &Phase::Failed {
            message: "boom".into(),
        },
        T1,
    );
    let synced = condition(Some(&failed["status"]), "Synced").unwrap();
    assert_eq!(synced["status"], "False");
    assert_eq!(synced["reason"], "ReconcileError");
    assert_eq!(synced["message"], "boom");
    assert!(synced.get("observedGeneration").is_none());
    assert_eq!(ready_reason(&failed), ("False", "Creating"));
    assert_eq!(
        failed["status"]["atProvider"], available["status"]["atProvider"],
        "a failure keeps atProvider"
    );

    let deleting = status_apply("ws", Some(3), Some(&failed["status"]), &Phase::Deleting, T1);
    assert_eq!(ready_reason(&deleting), ("False", "Deleting"));
    assert_eq!(
        deleting["status"]["atProvider"],
        available["status"]["atProvider"]
    );
}

#[test]
fn available_without_outputs_has_only_a_checksum() {
    let body = status_apply(
        "ws",
        None,
        None,
        &Phase::Available {
            checksum: "c".into(),
            outputs: Map::new(),
        },
        T0,
    );
    assert_eq!(body["status"]["atProvider"], json!({"checksum": "c"}));
}

#[test]
fn needs_write_ignores_transition_times_and_foreign_conditions() {
    let phase = Phase::Available {
        checksum: "c".into(),
        outputs: map(json!({"a": 1})),
    };
    let body = status_apply("ws", Some(1), None, &phase, T0);
    assert!(needs_write(None, &body));
    let mut current = body["status"].clone();
    assert!(!needs_write(Some(&current), &body));
    // Rebuilt later: same content, no write.
    let later = status_apply("ws", Some(1), Some(&current), &phase, T1);
    assert!(!needs_write(Some(&current), &later));
    // A foreign condition does not matter.
    current["conditions"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "Other", "status": "True", "reason": "X", "lastTransitionTime": T0}));
    assert!(!needs_write(Some(&current), &body));
    // Another generation, reason or atProvider does.
    let newer = status_apply("ws", Some(2), Some(&current), &phase, T1);
    assert!(needs_write(Some(&current), &newer));
    let creating = status_apply("ws", Some(1), Some(&current), &Phase::Creating, T1);
    assert!(needs_write(Some(&current), &creating));
    let mut extra = current.clone();
    extra["atProvider"]["outputs"]["b"] = json!(2);
    assert!(needs_write(Some(&extra), &body));
    // A missing message reads as empty.
    let mut no_message = current.clone();
    for c in no_message["conditions"].as_array_mut().unwrap() {
        c.as_object_mut().unwrap().remove("message");
    }
    assert!(!needs_write(Some(&no_message), &body));
}

#[test]
fn carried_at_provider_needs_no_write() {
    let current = json!({"atProvider": {"checksum": "c", "outputs": {"x": 1}}});
    let body = status_apply("ws", None, Some(&current), &Phase::Creating, T0);
    assert_eq!(body["status"]["atProvider"], current["atProvider"]);
    let mut after = body["status"].clone();
    after["atProvider"] = current["atProvider"].clone();
    assert!(!needs_write(Some(&after), &body));
}

#[test]
fn merge_patch_between_removes_extra_keys() {
    let from =
        json!({"checksum": "a", "outputs": {"x": 1, "y": 2, "n": {"k": 1}}, "foreign": true});
    let to = json!({"checksum": "b", "outputs": {"x": 1, "n": {"k": 2}, "z": 3}});
    let patch = merge_patch_between(&from, &to);
    assert_eq!(
        patch,
        json!({"checksum": "b", "outputs": {"y": null, "n": {"k": 2}, "z": 3}, "foreign": null})
    );
    assert_eq!(merge_patch_between(&to, &to), json!({}));
}

#[test]
fn connection_secret_ref_needs_name_and_namespace() {
    let spec = json!({"writeConnectionSecretToRef": {"name": "s", "namespace": "ns"}});
    assert_eq!(
        connection_secret_ref(Some(&spec)),
        Some(SecretRef {
            namespace: "ns".into(),
            name: "s".into()
        })
    );
    assert_eq!(
        connection_secret_ref(Some(&json!({"writeConnectionSecretToRef": {"name": "s"}}))),
        None
    );
    assert_eq!(connection_secret_ref(Some(&json!({}))), None);
    assert_eq!(connection_secret_ref(None), None);
}

#[test]
fn connection_secret_and_its_comparison() {
    let reference = SecretRef {
        namespace: "ns".into(),
        name: "conn".into(),
    };
    let d = Desired {
        outputs: map(json!({"endpoint": "https://x"})),
        sensitive: map(json!({"token": "t"})),
        ..Desired::default()
    };
    let secret = connection_secret(&reference, ("ws", Some("uid-1")), &d);
    let v = serde_json::to_value(&secret).unwrap();
    assert_eq!(v["apiVersion"], "v1");
    assert_eq!(v["kind"], "Secret");
    assert_eq!(v["type"], SECRET_TYPE);
    assert_eq!(v["metadata"]["namespace"], "ns");
    assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    assert_eq!(v["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(v["data"]["token"], "dA==");
    assert!(secret_needs_write(None, &secret));
    assert!(!secret_needs_write(Some(&secret), &secret));
    let other = connection_secret(&reference, ("ws", Some("uid-1")), &Desired::default());
    assert!(secret_needs_write(Some(&other), &secret));
    let unowned = connection_secret(&reference, ("ws", None), &d);
    assert!(secret_needs_write(Some(&unowned), &secret));
    assert!(!secret_needs_write(Some(&secret), &unowned));
}

#[test]
fn watch_selector_separates_instances() {
    assert_eq!(watch_selector(None, None), "!fake.tf.upbound.io/provider");
    assert_eq!(
        watch_selector(Some("t1"), Some("a=b")),
        "fake.tf.upbound.io/provider=t1,a=b"
    );
    assert_eq!(
        watch_selector(None, Some(" ")),
        "!fake.tf.upbound.io/provider"
    );
}

#[test]
fn now_is_a_kubernetes_timestamp() {
    let t = now();
    assert_eq!(t.len(), 20, "{t}");
    assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
}
