//! Unit tests of the fake provider's pure parts: annotations, checksum, the status as
//! crossplane-runtime builds it (conditions, atProvider, the reconciler's paths, backoff),
//! the connection Secret and the watch selector.

use super::*;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::time::Duration;

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
fn bad_annotations_are_errors_without_values() {
    let bad = annotations(&[
        (SENSITIVE_OUTPUTS_ANNOTATION, r#"{"password": "hunter2""#),
        (REVISION_ANNOTATION, "3"),
    ]);
    let e = Desired::parse(&bad).unwrap_err();
    assert_eq!(e.annotation, SENSITIVE_OUTPUTS_ANNOTATION);
    assert!(e.reason.starts_with("invalid JSON"), "{e}");
    // The binary reports it as a plan error: the message names the annotation, not the value.
    let text = message::observe(&format!("invalid fake provider input: {e}"));
    assert!(
        text.starts_with("observe failed: cannot diff (i.e. plan) Terraform configuration: "),
        "{text}"
    );
    assert!(text.contains(SENSITIVE_OUTPUTS_ANNOTATION), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    let e = Desired::parse(&annotations(&[(FAIL_TIMES_ANNOTATION, "two")])).unwrap_err();
    assert_eq!(e.annotation, FAIL_TIMES_ANNOTATION);

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
    // A failure does not change the checksum, but its plan always differs.
    let failing = Desired {
        failure: Some("boom".into()),
        ..d.clone()
    };
    assert_eq!(checksum(&spec, &failing), c);
    assert!(!d.differs(&c, Some(&c)));
    assert!(d.differs(&c, Some("other")));
    assert!(d.differs(&c, None));
    assert!(failing.differs(&c, Some(&c)));
}

#[test]
fn fail_times_fails_that_many_applies_then_succeeds() {
    let d = Desired::parse(&annotations(&[(FAIL_TIMES_ANNOTATION, " 2 ")])).unwrap();
    assert_eq!(d.fail_times, 2);
    assert_eq!(
        d.apply_outcome(0),
        Err("transient error (fake): failed apply 1 of 2".into())
    );
    assert_eq!(
        d.apply_outcome(1),
        Err("transient error (fake): failed apply 2 of 2".into())
    );
    assert_eq!(d.apply_outcome(2), Ok(()));
    assert_eq!(Desired::default().apply_outcome(0), Ok(()));
    // A failure asked for never recovers.
    let failing = Desired {
        failure: Some("denied".into()),
        ..Desired::default()
    };
    assert_eq!(failing.apply_outcome(99), Err("denied".into()));
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

/// (status, reason, message, lastTransitionTime) of a condition.
fn parts(status: &Value, type_: &str) -> (String, String, String, String) {
    let c = condition(Some(status), type_).unwrap_or_else(|| panic!("no {type_}: {status}"));
    let text = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    (
        text("status"),
        text("reason"),
        text("message"),
        text("lastTransitionTime"),
    )
}

#[test]
fn set_conditions_follows_crossplane_runtime() {
    let mut status = typed_status(None);
    set_conditions(&mut status, &[Cond::Creating, Cond::ReconcileSuccess], T0);
    assert_eq!(
        status["conditions"],
        json!([
            {"type": "Ready", "status": "False", "lastTransitionTime": T0, "reason": "Creating"},
            {"type": "Synced", "status": "True", "lastTransitionTime": T0, "reason": "ReconcileSuccess"},
        ]),
        "no message, no observedGeneration (v1.16.0 sets none)"
    );
    // Equal in status, reason and message: left as it is, its transition time too.
    set_conditions(&mut status, &[Cond::ReconcileSuccess], T1);
    assert_eq!(parts(&status, "Synced").3, T0);
    // Another reason, same status: replaced, dated now.
    set_conditions(&mut status, &[Cond::Available], T1);
    assert_eq!(
        parts(&status, "Ready"),
        ("True".into(), "Available".into(), "".into(), T1.into())
    );
    // Another message alone is a new condition too.
    set_conditions(&mut status, &[Cond::ReconcileError("a".into())], T0);
    set_conditions(&mut status, &[Cond::ReconcileError("b".into())], T1);
    assert_eq!(
        parts(&status, "Synced"),
        (
            "False".into(),
            "ReconcileError".into(),
            "b".into(),
            T1.into()
        )
    );
    assert_eq!(status["conditions"].as_array().unwrap().len(), 2);
}

#[test]
fn typed_status_keeps_only_what_the_go_types_hold() {
    let live = json!({
        "conditions": [{"type": "Ready", "status": "True", "reason": "Available",
                        "lastTransitionTime": T0, "message": "", "observedGeneration": 0,
                        "foreign": "x"}],
        "atProvider": {"checksum": "c", "outputs": {"a": 1}, "extra": true},
        "somethingElse": {"k": 1},
    });
    assert_eq!(
        typed_status(Some(&live)),
        json!({
            "conditions": [{"type": "Ready", "status": "True", "reason": "Available",
                            "lastTransitionTime": T0}],
            "atProvider": {"checksum": "c", "outputs": {"a": 1}},
        })
    );
    // atProvider is a struct: always written, `{}` at least.
    assert_eq!(typed_status(None), json!({"atProvider": {}}));
    let empty = json!({"atProvider": {"checksum": "", "outputs": {}}});
    assert_eq!(typed_status(Some(&empty)), json!({"atProvider": {}}));
}

#[test]
fn at_provider_from_observe_and_from_apply() {
    let outputs = map(json!({"vpc_id": "vpc-1"}));
    assert_eq!(
        at_provider("abc", &outputs),
        json!({"checksum": "abc", "outputs": {"vpc_id": "vpc-1"}})
    );
    assert_eq!(at_provider("c", &Map::new()), json!({"checksum": "c"}));
    // An apply fills the outputs alone: the checksum is back at the next Observe.
    assert_eq!(
        applied_at_provider(&outputs),
        json!({"outputs": {"vpc_id": "vpc-1"}})
    );
    assert_eq!(applied_at_provider(&Map::new()), json!({}));
}

#[test]
fn the_reconcilers_paths() {
    assert_eq!(path(false, false, false), Path::Create);
    assert_eq!(path(false, false, true), Path::Create);
    assert_eq!(path(false, true, true), Path::UpToDate);
    assert_eq!(path(false, true, false), Path::Update);
    assert_eq!(path(true, true, false), Path::Delete);
    assert_eq!(path(true, false, true), Path::Finalize);
}

/// The status one pass leaves, from the live one, as the binary builds it.
fn pass(live: &Value, route: Path, up_to_date: bool, outcome: Result<(), &str>) -> Value {
    let mut status = typed_status(Some(live));
    if up_to_date {
        set_conditions(&mut status, &[Cond::Available], T1);
    }
    set_conditions(&mut status, &pass_conditions(route, outcome), T1);
    status
}

#[test]
fn ready_stays_available_through_updates_and_failed_applies_of_an_existing_workspace() {
    let mut live = typed_status(None);
    set_conditions(&mut live, &[Cond::Available, Cond::ReconcileSuccess], T0);
    // A failed update: Synced=False with the error, Ready untouched (transition time too).
    let failed = pass(&live, Path::Update, false, Err("AccessDenied"));
    assert_eq!(
        parts(&failed, "Ready"),
        ("True".into(), "Available".into(), "".into(), T0.into())
    );
    assert_eq!(
        parts(&failed, "Synced"),
        (
            "False".into(),
            "ReconcileError".into(),
            "update failed: cannot apply Terraform configuration: AccessDenied".into(),
            T1.into()
        )
    );
    // A successful update: still Available, Synced back to True.
    let ok = pass(&failed, Path::Update, false, Ok(()));
    assert_eq!(parts(&ok, "Ready").1, "Available");
    assert_eq!(parts(&ok, "Ready").3, T0);
    assert_eq!(parts(&ok, "Synced").1, "ReconcileSuccess");
    // Only the Create path says Creating, failed or not.
    let fresh = typed_status(None);
    let c = pass(&fresh, Path::Create, false, Err("denied"));
    assert_eq!(parts(&c, "Ready").1, "Creating");
    assert!(parts(&c, "Synced").2.starts_with("create failed: "));
    let c = pass(&fresh, Path::Create, false, Ok(()));
    assert_eq!(parts(&c, "Ready").1, "Creating");
    assert_eq!(parts(&c, "Synced").1, "ReconcileSuccess");
    // A pass that finds it up to date changes nothing: the same status, byte for byte.
    let again = pass(&ok, Path::UpToDate, true, Ok(()));
    assert_eq!(again, ok);
    // Deletion: Deleting, with the destroy's error when it fails.
    let d = pass(&ok, Path::Delete, false, Err("timeout"));
    assert_eq!(parts(&d, "Ready").1, "Deleting");
    assert_eq!(
        parts(&d, "Synced").2,
        "delete failed: cannot destroy Terraform configuration: timeout"
    );
    assert!(pass_conditions(Path::Finalize, Ok(())).is_empty());
}

#[test]
fn backoff_doubles_from_the_base_to_the_max() {
    let (base, max) = (Duration::from_secs(1), Duration::from_secs(60));
    let waits: Vec<u64> = (0..8).map(|n| backoff(n, base, max).as_secs()).collect();
    assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
    assert_eq!(backoff(1000, base, max), max);
    assert_eq!(
        backoff(2, Duration::from_millis(100), max),
        Duration::from_millis(400)
    );
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
    assert_eq!(
        v["metadata"]["ownerReferences"][0]["blockOwnerDeletion"],
        true
    );
    assert_eq!(v["data"]["token"], "dA==");
    assert!(secret_needs_write(None, &secret));
    assert!(!secret_needs_write(Some(&secret), &secret));
    let other = connection_secret(&reference, ("ws", Some("uid-1")), &Desired::default());
    assert!(secret_needs_write(Some(&other), &secret));
    // Only the data is compared (AllowUpdateIf in APISecretPublisher), empty equals missing.
    let unowned = connection_secret(&reference, ("ws", None), &d);
    assert!(!secret_needs_write(Some(&unowned), &secret));
    let mut no_data = other.clone();
    no_data.data = None;
    assert!(!secret_needs_write(Some(&no_data), &other));
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

/// Terraform reports an output whose value is a string literal as that string; the fake does
/// the same for an inline HCL module (CAPT's `capt_revision` echo is one such output).
#[test]
fn literal_string_outputs_of_an_inline_module_are_reported_as_tofu_would() {
    let module = "variable \"v\" { type = string }\n\
        output \"one_line\" { value = \"a\" }\n\
        output \"block\" {\n  value = \"b\"\n}\n\
        output \"secret\" {\n  value     = \"s\"\n  sensitive = true\n}\n\
        output \"computed\" { value = var.v }\n\
        output \"interpolated\" { value = \"x-${var.v}\" }\n\
        output \"list\" { value = [\"a\"] }\n";
    let spec = json!({"forProvider": {"source": "Inline", "module": module}});
    assert_eq!(
        literal_module_outputs(&spec),
        vec![
            ("one_line".to_owned(), json!("a"), false),
            ("block".to_owned(), json!("b"), false),
            ("secret".to_owned(), json!("s"), true),
        ]
    );
    let remote = json!({"forProvider": {"source": "Remote", "module": module}});
    assert!(literal_module_outputs(&remote).is_empty());
    // The annotations' outputs win over the module's; sensitive outputs come from the
    // annotation alone (the test decides what secret data exists).
    let d = Desired::parse(&annotations(&[(
        OUTPUTS_ANNOTATION,
        r#"{"one_line": "z"}"#,
    )]))
    .unwrap()
    .with_module_outputs(&spec);
    assert_eq!(d.outputs, map(json!({"one_line": "z", "block": "b"})));
    assert!(d.sensitive_names().is_empty());
}

#[test]
fn a_create_is_incomplete_while_pending_is_later_than_its_recorded_result() {
    let at = |pairs: &[(&str, &str)]| external_create_incomplete(&annotations(pairs));
    assert!(!at(&[]), "never started");
    assert!(at(&[(EXTERNAL_CREATE_PENDING, "2026-01-01T00:00:02Z")]));
    assert!(at(&[
        (EXTERNAL_CREATE_PENDING, "2026-01-01T00:00:02Z"),
        (EXTERNAL_CREATE_SUCCEEDED, "2026-01-01T00:00:01Z"),
    ]));
    assert!(!at(&[
        (EXTERNAL_CREATE_PENDING, "2026-01-01T00:00:01Z"),
        (EXTERNAL_CREATE_SUCCEEDED, "2026-01-01T00:00:02Z"),
    ]));
    assert!(
        !at(&[
            (EXTERNAL_CREATE_PENDING, "2026-01-01T00:00:01Z"),
            (EXTERNAL_CREATE_FAILED, "2026-01-01T00:00:01Z"),
        ]),
        "not after: complete"
    );
    assert!(!at(&[(EXTERNAL_CREATE_PENDING, "garbage")]), "zero time");
    assert!(orphaned(&json!({"deletionPolicy": "Orphan"})));
    assert!(!orphaned(&json!({"deletionPolicy": "Delete"})));
    assert!(!orphaned(&json!({})));
}
