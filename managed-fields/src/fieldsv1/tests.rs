//! Tests of the fieldsV1 codec and the ownership queries.

use super::*;
use serde_json::json;

/// managedFields[].fieldsV1 of a controller on a Widget's status.
fn controller_status_fields() -> Value {
    json!({"f:status":{".":{},"f:phase":{},"f:conditions":{"k:{\"type\":\"Ready\"}":{".":{},"f:type":{},"f:status":{},"f:reason":{}}},"f:workspaceStatus":{"f:atProvider":{"f:checksum":{},"f:outputs":{"f:cluster_endpoint":{}}}}}})
}

/// managedFields[].fieldsV1 of another manager on the Widget's spec.
fn other_spec_fields() -> Value {
    json!({"f:spec":{"f:controlPlaneEndpoint":{},"f:version":{}}})
}

/// A live Widget.
fn live_object() -> Value {
    json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
        "kind": "Widget",
        "metadata": {"name": "demo", "namespace": "default"},
        "spec": {
            "version": "1.31",
            "controlPlaneEndpoint": {"host": "abc.eks.amazonaws.com", "port": 443}
        },
        "status": {
            "phase": "Ready",
            "ready": true,
            "conditions": [
                {"type": "WorkspaceReady", "status": "False", "reason": "Pending"},
                {"type": "Ready", "status": "True", "reason": "Ok",
                 "lastTransitionTime": "2025-01-01T00:00:00Z"}
            ],
            "workspaceStatus": {
                "atProvider": {
                    "checksum": "abc123",
                    "outputs": {
                        "cluster_endpoint": {"value": "https://abc", "sensitive": false},
                        "cluster_ca": "LS0t"
                    },
                    "state": {"nested": [1, 2, 3]}
                }
            }
        }
    })
}

fn decode(v: &Value) -> FieldSet {
    FieldSet::from_fields_v1(v).expect("valid fieldsV1")
}

fn path(s: &str) -> Vec<PathElement> {
    parse_field_path(s).expect("valid path")
}

fn key(v: Value) -> PathElement {
    match v {
        Value::Object(map) => PathElement::Key(map),
        other => panic!("not an object: {other}"),
    }
}

fn rendered_leaves(set: &FieldSet) -> Vec<String> {
    set.leaf_paths().iter().map(|p| path_to_string(p)).collect()
}

fn decode_error(v: Value) -> String {
    FieldSet::from_fields_v1(&v)
        .expect_err("invalid fieldsV1")
        .to_string()
}

/// Drops a deeply nested value one level at a time, so Drop never recurses deeply.
fn drop_iteratively(mut v: Value) {
    loop {
        let next = match &mut v {
            Value::Object(map) => map.values_mut().next().map(std::mem::take),
            _ => None,
        };
        match next {
            Some(inner) => v = inner,
            None => break,
        }
    }
}

fn nested_fields(depth: usize) -> Value {
    let mut v = json!({});
    for _ in 0..depth {
        let mut map = Map::new();
        map.insert("f:a".to_owned(), v);
        v = Value::Object(map);
    }
    v
}

#[test]
fn field_keys_decode_into_nested_fields() {
    let set = decode(&json!({"f:spec":{"f:replicas":{},"f:template":{"f:metadata":{}}}}));
    assert_eq!(
        rendered_leaves(&set),
        [".spec.replicas", ".spec.template.metadata"]
    );
}

#[test]
fn controller_status_fields_decode_with_every_leaf_in_order() {
    let set = decode(&controller_status_fields());
    assert_eq!(
        rendered_leaves(&set),
        [
            ".status",
            ".status.conditions[type=Ready]",
            ".status.conditions[type=Ready].reason",
            ".status.conditions[type=Ready].status",
            ".status.conditions[type=Ready].type",
            ".status.phase",
            ".status.workspaceStatus.atProvider.checksum",
            ".status.workspaceStatus.atProvider.outputs.cluster_endpoint",
        ]
    );
}

#[test]
fn list_map_keys_with_several_fields_compare_order_insensitively() {
    let set = decode(&json!({"f:ports":{"k:{\"protocol\":\"TCP\",\"containerPort\":80}":{}}}));
    let leaves = set.leaf_paths();
    let expected = key(json!({"containerPort": 80, "protocol": "TCP"}));
    assert_eq!(leaves, [vec![PathElement::Field("ports".into()), expected]]);
    assert_eq!(
        rendered_leaves(&set),
        [".ports[containerPort=80,protocol=TCP]"]
    );
    let encoded = set.to_fields_v1();
    assert!(encoded["f:ports"]["k:{\"containerPort\":80,\"protocol\":\"TCP\"}"].is_object());
}

#[test]
fn equivalent_keys_spelled_differently_are_merged() {
    let set = decode(&json!({
        "k:{\"a\":1,\"b\":2}": {"f:x": {}},
        "k:{\"b\":2, \"a\":1}": {"f:y": {}},
        "i:07": {},
        "i:7": {}
    }));
    assert_eq!(rendered_leaves(&set), ["[7]", "[a=1,b=2].x", "[a=1,b=2].y"]);
}

#[test]
fn set_values_and_indices_decode() {
    let set = decode(
        &json!({"f:finalizers":{"v:\"foo\"":{},"v:1":{},"v:{\"b\":1,\"a\":[true]}":{}},"f:args":{"i:3":{}}}),
    );
    let leaves = set.leaf_paths();
    assert!(leaves.contains(&vec![
        PathElement::Field("finalizers".into()),
        PathElement::Value(json!("foo")),
    ]));
    assert!(leaves.contains(&vec![
        PathElement::Field("finalizers".into()),
        PathElement::Value(json!(1)),
    ]));
    assert!(leaves.contains(&vec![
        PathElement::Field("args".into()),
        PathElement::Index(3),
    ]));
    assert!(rendered_leaves(&set).contains(&".finalizers[=\"foo\"]".to_owned()));
    assert!(rendered_leaves(&set).contains(&".finalizers[={\"a\":[true],\"b\":1}]".to_owned()));
}

#[test]
fn dot_marks_a_node_with_children_as_owned_itself() {
    let set = decode(&json!({"f:metadata":{"f:labels":{".":{},"f:app":{}}}}));
    assert!(set.owns(&path("metadata.labels")));
    assert!(set.owns(&path("metadata.labels.app")));
    assert!(!set.owns(&path("metadata.labels.tier")));
    assert!(!set.owns(&path("metadata")));
}

#[test]
fn dot_alone_is_the_same_leaf_as_an_empty_object() {
    assert_eq!(decode(&json!({"f:a":{".":{}}})), decode(&json!({"f:a":{}})));
}

#[test]
fn dot_on_the_root_owns_the_root() {
    let set = decode(&json!({".":{}}));
    assert!(set.owns(&[]));
    assert_eq!(set.leaf_paths(), [Vec::<PathElement>::new()]);
    assert_eq!(set.to_fields_v1(), json!({".":{}}));
}

#[test]
fn empty_fields_decode_to_an_empty_set() {
    let set = decode(&json!({}));
    assert!(set.is_empty());
    assert!(set.leaf_paths().is_empty());
    assert!(!set.touches(&[]));
    assert_eq!(set.project(&live_object()), None);
}

#[test]
fn round_trip_reproduces_the_same_json_and_set() {
    for fields in [
        controller_status_fields(),
        other_spec_fields(),
        json!({"f:spec":{"f:containers":{"k:{\"name\":\"app\"}":{".":{},"f:ports":{"k:{\"containerPort\":80,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{}}}}}}}),
        json!({"f:finalizers":{".":{},"v:\"a\"":{},"v:2.5":{},"v:null":{}},"f:args":{"i:0":{}}}),
    ] {
        let set = decode(&fields);
        let encoded = set.to_fields_v1();
        assert_eq!(encoded, fields);
        assert_eq!(decode(&encoded), set);
    }
}

#[test]
fn a_non_object_root_is_rejected() {
    assert_eq!(
        decode_error(json!([1])),
        "invalid fieldsV1 root: expected a JSON object, found an array"
    );
}

#[test]
fn a_non_object_node_is_rejected_naming_key_and_path() {
    assert_eq!(
        decode_error(json!({"f:status":{"f:phase":"Ready"}})),
        "invalid value for key `f:phase` at .status: expected a JSON object, found a string"
    );
}

#[test]
fn a_non_empty_dot_is_rejected() {
    assert_eq!(
        decode_error(json!({"f:status":{".":{"f:x":{}}}})),
        "invalid value for key `.` at .status: expected an empty object"
    );
}

#[test]
fn an_unknown_prefix_is_rejected_naming_key_and_path() {
    assert_eq!(
        decode_error(json!({"f:status":{"x:phase":{}}})),
        "unknown prefix in key `x:phase` at .status: expected `f:`, `k:`, `v:`, `i:` or `.`"
    );
    assert!(decode_error(json!({"phase":{}})).starts_with("unknown prefix in key `phase` at ."));
    assert!(decode_error(json!({"":{}})).starts_with("unknown prefix in key `` at ."));
}

#[test]
fn invalid_json_after_k_is_rejected_naming_key_and_path() {
    let message = decode_error(json!({"f:status":{"f:conditions":{"k:{oops":{}}}}));
    assert!(
        message.starts_with(
            "invalid key `k:{oops` at .status.conditions: expected a JSON object after `k:`"
        ),
        "{message}"
    );
}

#[test]
fn a_k_key_that_is_not_an_object_is_rejected() {
    assert_eq!(
        decode_error(json!({"f:conditions":{"k:[\"Ready\"]":{}}})),
        "invalid key `k:[\"Ready\"]` at .conditions: expected a JSON object after `k:`, found an array"
    );
}

#[test]
fn invalid_json_after_v_is_rejected_naming_key_and_path() {
    let message = decode_error(json!({"f:finalizers":{"v:foo":{}}}));
    assert!(
        message.starts_with("invalid key `v:foo` at .finalizers: expected a JSON value after `v:`"),
        "{message}"
    );
}

#[test]
fn an_index_that_is_not_a_non_negative_integer_is_rejected() {
    for bad in [
        "i:-1",
        "i:abc",
        "i:",
        "i:+1",
        "i:1.0",
        "i:99999999999999999999999",
    ] {
        let mut map = Map::new();
        map.insert(bad.to_owned(), json!({}));
        let message = decode_error(json!({"f:args": Value::Object(map)}));
        assert_eq!(
            message,
            format!("invalid key `{bad}` at .args: expected a non-negative integer after `i:`")
        );
    }
}

#[test]
fn nesting_of_exactly_the_maximum_depth_is_accepted() {
    let fields = nested_fields(MAX_DEPTH);
    let set = decode(&fields);
    assert_eq!(set.leaf_paths()[0].len(), MAX_DEPTH);
    assert_eq!(decode(&set.to_fields_v1()), set);
}

#[test]
fn nesting_one_level_deeper_than_the_maximum_is_rejected() {
    let message = decode_error(nested_fields(MAX_DEPTH + 1));
    let expected_path = ".a".repeat(MAX_DEPTH);
    assert_eq!(
        message,
        format!("key `f:a` at {expected_path} nests deeper than 64 levels")
    );
}

#[test]
fn ten_thousand_levels_of_nesting_fail_without_overflowing_the_stack() {
    // Built programmatically: serde_json's text parser stops at 128 levels on its own.
    let fields = nested_fields(10_000);
    let result = FieldSet::from_fields_v1(&fields);
    assert!(matches!(result, Err(FieldsV1Error::TooDeep { .. })));
    // serde_json's own Drop recurses, so take the value apart level by level.
    drop_iteratively(fields);
}

#[test]
fn owns_covers_leaves_and_everything_below_a_leaf() {
    let set = decode(&other_spec_fields());
    assert!(set.owns(&path(".spec.controlPlaneEndpoint")));
    assert!(set.owns(&path(".spec.controlPlaneEndpoint.host")));
    assert!(!set.owns(&path(".spec")));
    assert!(!set.owns(&path(".spec.paused")));
    assert!(!set.owns(&[]));
}

#[test]
fn owns_on_list_map_elements_uses_the_dot_and_key_fields() {
    let set = decode(&controller_status_fields());
    let ready = key(json!({"type": "Ready"}));
    let mut conditions = path("status.conditions");
    assert!(!set.owns(&conditions));
    conditions.push(ready);
    assert!(set.owns(&conditions));
    conditions.push(PathElement::Field("status".into()));
    assert!(set.owns(&conditions));
    conditions.pop();
    conditions.push(PathElement::Field("message".into()));
    assert!(!set.owns(&conditions));
    let mut other = path("status.conditions");
    other.push(key(json!({"type": "WorkspaceReady"})));
    assert!(!set.owns(&other));
}

#[test]
fn covering_leaf_names_the_childless_leaf_above_a_path() {
    let set = decode(&json!({"f:status":{".":{},"f:workspaceStatus":{"f:atProvider":{}}}}));
    let below = path("status.workspaceStatus.atProvider.checksum");
    assert_eq!(set.covering_leaf(&below), Some(3));
    assert_eq!(
        set.covering_leaf(&path("status.workspaceStatus.atProvider")),
        None
    );
    // `.` with children covers nothing below it.
    assert_eq!(set.covering_leaf(&path("status.phase")), None);
    assert_eq!(set.covering_leaf(&path("spec.x")), None);
}

#[test]
fn a_dot_node_with_children_does_not_own_unlisted_descendants() {
    let set = decode(&controller_status_fields());
    assert!(set.owns(&path("status")));
    assert!(!set.owns(&path("status.ready")));
    assert!(!set.owns(&path("status.workspaceStatus.atProvider")));
    assert!(!set.touches(&path("status.workspaceStatus.atProvider.state")));
}

#[test]
fn touches_finds_owned_paths_below_and_above() {
    let set = decode(&controller_status_fields());
    assert!(set.touches(&path("status.workspaceStatus")));
    assert!(set.touches(&path("status.workspaceStatus.atProvider")));
    assert!(!set.owns(&path("status.workspaceStatus.atProvider")));
    assert!(set.touches(&path(
        "status.workspaceStatus.atProvider.outputs.cluster_endpoint.value"
    )));
    assert!(!set.touches(&path("spec")));
    assert!(set.touches(&[]));
}

#[test]
fn projection_copies_owned_scalars_and_whole_leaf_subtrees() {
    let set = decode(&other_spec_fields());
    assert_eq!(
        set.project(&live_object()),
        Some(json!({"spec": {
            "version": "1.31",
            "controlPlaneEndpoint": {"host": "abc.eks.amazonaws.com", "port": 443}
        }}))
    );
}

#[test]
fn projection_of_nested_maps_keeps_only_owned_fields() {
    let set = decode(
        &json!({"f:status":{"f:workspaceStatus":{"f:atProvider":{"f:checksum":{},"f:outputs":{"f:cluster_endpoint":{}}}}}}),
    );
    assert_eq!(
        set.project(&live_object()),
        Some(json!({"status": {"workspaceStatus": {"atProvider": {
            "checksum": "abc123",
            "outputs": {"cluster_endpoint": {"value": "https://abc", "sensitive": false}}
        }}}}))
    );
}

#[test]
fn list_map_element_projection_keeps_its_key_fields_and_live_order() {
    let set =
        decode(&json!({"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":{"f:status":{}}}}}));
    assert_eq!(
        set.project(&live_object()),
        Some(json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}))
    );
}

#[test]
fn a_status_projection_includes_the_owned_condition_only() {
    let set = decode(&controller_status_fields());
    assert_eq!(
        set.project(&live_object()),
        Some(json!({"status": {
            "phase": "Ready",
            "conditions": [{"type": "Ready", "status": "True", "reason": "Ok"}],
            "workspaceStatus": {"atProvider": {
                "checksum": "abc123",
                "outputs": {"cluster_endpoint": {"value": "https://abc", "sensitive": false}}
            }}
        }}))
    );
}

#[test]
fn projection_of_two_owned_list_map_elements_keeps_live_order() {
    let set = decode(&json!({"f:conditions":{
        "k:{\"type\":\"Ready\"}":{"f:reason":{}},
        "k:{\"type\":\"WorkspaceReady\"}":{"f:reason":{}}
    }}));
    let live = json!({"conditions": [
        {"type": "WorkspaceReady", "reason": "Pending"},
        {"type": "Other", "reason": "x"},
        {"type": "Ready", "reason": "Ok"}
    ]});
    assert_eq!(
        set.project(&live),
        Some(json!({"conditions": [
            {"type": "WorkspaceReady", "reason": "Pending"},
            {"type": "Ready", "reason": "Ok"}
        ]}))
    );
}

#[test]
fn a_dot_element_whose_fields_are_absent_projects_to_its_keys() {
    let set = decode(
        &json!({"f:ports":{"k:{\"containerPort\":80,\"protocol\":\"TCP\"}":{".":{},"f:name":{}}}}),
    );
    let live = json!({"ports": [{"containerPort": 80, "protocol": "TCP", "hostPort": 8080}]});
    assert_eq!(
        set.project(&live),
        Some(json!({"ports": [{"containerPort": 80, "protocol": "TCP"}]}))
    );
}

#[test]
fn a_dot_map_whose_children_are_absent_projects_to_an_empty_object() {
    let set = decode(&json!({"f:metadata":{"f:labels":{".":{},"f:app":{}}}}));
    let live = json!({"metadata": {"labels": {"tier": "web"}}});
    assert_eq!(
        set.project(&live),
        Some(json!({"metadata": {"labels": {}}}))
    );
}

#[test]
fn set_projection_includes_only_values_present_live() {
    let set = decode(&json!({"f:finalizers":{"v:\"a\"":{},"v:\"gone\"":{}}}));
    let live = json!({"finalizers": ["z", "a", "b"]});
    assert_eq!(set.project(&live), Some(json!({"finalizers": ["a"]})));
}

#[test]
fn index_projection_picks_the_live_element() {
    let set = decode(&json!({"f:args":{"i:1":{}}}));
    let live = json!({"args": ["--a", {"b": 1}, "--c"]});
    assert_eq!(set.project(&live), Some(json!({"args": [{"b": 1}]})));
}

#[test]
fn owned_paths_missing_live_are_skipped() {
    let set = decode(
        &json!({"f:status":{"f:phase":{},"f:missing":{"f:deeper":{}},"f:conditions":{"k:{\"type\":\"Gone\"}":{"f:status":{}}}}}),
    );
    assert_eq!(
        set.project(&live_object()),
        Some(json!({"status": {"phase": "Ready"}}))
    );
    assert_eq!(set.project(&json!({"spec": {}})), None);
    assert_eq!(set.project(&json!({"status": "not an object"})), None);
}

#[test]
fn at_provider_owned_as_several_leaves_projects_arbitrary_nested_json() {
    let set = decode(&json!({"f:status":{"f:workspaceStatus":{"f:atProvider":{
        "f:checksum":{},"f:state":{},"f:outputs":{"f:cluster_ca":{}}
    }}}}));
    assert_eq!(
        set.project(&live_object()),
        Some(json!({"status": {"workspaceStatus": {"atProvider": {
            "checksum": "abc123",
            "outputs": {"cluster_ca": "LS0t"},
            "state": {"nested": [1, 2, 3]}
        }}}}))
    );
}

fn conditions_keyed_by_type(path: &[PathElement]) -> Option<Vec<String>> {
    match path_to_string(path).as_str() {
        ".status.conditions" => Some(vec!["type".to_owned()]),
        ".status.finalizers" => Some(Vec::new()),
        _ => None,
    }
}

#[test]
fn an_apply_of_status_with_conditions_claims_keyed_elements() {
    let doc = json!({"status": {
        "phase": "Ready",
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Ok"},
            {"type": "Synced", "status": "True"}
        ],
        "workspaceStatus": {"atProvider": {"checksum": "x", "outputs": {}}},
        "addresses": ["10.0.0.1"],
        "finalizers": ["a"],
        "empty": null
    }});
    let set = FieldSet::from_apply_document(&doc, &conditions_keyed_by_type);
    let expected = json!({"f:status":{
        "f:phase":{},
        "f:conditions":{
            "k:{\"type\":\"Ready\"}":{".":{},"f:type":{},"f:status":{},"f:reason":{}},
            "k:{\"type\":\"Synced\"}":{".":{},"f:type":{},"f:status":{}}
        },
        "f:workspaceStatus":{"f:atProvider":{"f:checksum":{},"f:outputs":{}}},
        "f:addresses":{},
        "f:finalizers":{"v:\"a\"":{}},
        "f:empty":{}
    }});
    assert_eq!(set, decode(&expected));
    assert_eq!(set.to_fields_v1(), expected);
}

#[test]
fn an_apply_with_an_empty_list_map_claims_nothing_for_it() {
    let doc = json!({"status": {"conditions": []}});
    let set = FieldSet::from_apply_document(&doc, &conditions_keyed_by_type);
    assert!(set.is_empty());
}

#[test]
fn list_map_keys_are_asked_with_the_schema_path_of_the_list() {
    let doc = json!({"spec": {"containers": [{"name": "app", "ports": [{"containerPort": 80}]}]}});
    let keys = |p: &[PathElement]| match path_to_string(p).as_str() {
        ".spec.containers" => Some(vec!["name".to_owned()]),
        ".spec.containers.ports" => Some(vec!["containerPort".to_owned(), "protocol".to_owned()]),
        _ => None,
    };
    let set = FieldSet::from_apply_document(&doc, &keys);
    assert_eq!(
        rendered_leaves(&set),
        [
            ".spec.containers[name=app]",
            ".spec.containers[name=app].name",
            ".spec.containers[name=app].ports[containerPort=80]",
            ".spec.containers[name=app].ports[containerPort=80].containerPort",
        ]
    );
}

#[test]
fn a_predicted_apply_conflicts_with_the_controller_on_shared_paths() {
    let doc = json!({"status": {
        "phase": "Provisioning",
        "conditions": [{"type": "Ready", "status": "False"}],
        "workspaceStatus": {"atProvider": {"outputs": {"cluster_endpoint": "x", "cluster_ca": "y"}}}
    }});
    let applied = FieldSet::from_apply_document(&doc, &conditions_keyed_by_type);
    let controller = decode(&controller_status_fields());
    let conflicts = applied.intersection(&controller);
    assert_eq!(
        rendered_leaves(&conflicts),
        [
            ".status.conditions[type=Ready]",
            ".status.conditions[type=Ready].status",
            ".status.conditions[type=Ready].type",
            ".status.phase",
            ".status.workspaceStatus.atProvider.outputs.cluster_endpoint",
        ]
    );
    assert_eq!(conflicts, controller.intersection(&applied));
}

#[test]
fn intersection_with_a_leaf_keeps_the_deeper_paths_of_the_other_side() {
    let whole = decode(&json!({"f:status":{"f:workspaceStatus":{}}}));
    let controller = decode(&controller_status_fields());
    let expected = [
        ".status.workspaceStatus.atProvider.checksum",
        ".status.workspaceStatus.atProvider.outputs.cluster_endpoint",
    ];
    assert_eq!(rendered_leaves(&whole.intersection(&controller)), expected);
    assert_eq!(rendered_leaves(&controller.intersection(&whole)), expected);
}

#[test]
fn intersection_of_disjoint_sets_is_empty() {
    let spec = decode(&other_spec_fields());
    let status = decode(&controller_status_fields());
    assert!(spec.intersection(&status).is_empty());
    assert!(FieldSet::default().intersection(&status).is_empty());
}

#[test]
fn paths_render_for_humans_and_labels() {
    let mut p = path("status.conditions");
    p.push(key(json!({"type": "Ready"})));
    p.push(PathElement::Field("status".into()));
    assert_eq!(path_to_string(&p), ".status.conditions[type=Ready].status");
    let elements = [
        key(json!({"protocol": "TCP", "containerPort": 80})),
        PathElement::Value(json!("foo")),
        PathElement::Index(3),
    ];
    assert_eq!(
        path_to_string(&elements),
        "[containerPort=80,protocol=TCP][=\"foo\"][3]"
    );
    assert_eq!(path_to_string(&[]), ".");
}

#[test]
fn field_paths_parse_with_or_without_a_leading_dot() {
    let expected = vec![
        PathElement::Field("status".into()),
        PathElement::Field("workspaceStatus".into()),
        PathElement::Field("atProvider".into()),
    ];
    assert_eq!(path("status.workspaceStatus.atProvider"), expected);
    assert_eq!(path(".status.workspaceStatus.atProvider"), expected);
}

#[test]
fn field_paths_with_empty_segments_are_rejected() {
    for bad in ["", ".", "status..phase", "status.", "..status"] {
        assert!(
            matches!(
                parse_field_path(bad),
                Err(FieldsV1Error::EmptyPathSegment { .. })
            ),
            "{bad:?}"
        );
    }
    assert_eq!(
        parse_field_path("status..phase").unwrap_err().to_string(),
        "invalid field path `status..phase`: segment 2 is empty"
    );
}

// -- the set as a region -------------------------------------------------------------------

#[test]
fn a_region_union_takes_a_leaf_whole_and_merges_the_rest() {
    let mut region = decode(&json!({"f:status": {"f:phase": {}, "f:outputs": {"f:a": {}}}}));
    region.union_region(&decode(
        &json!({"f:status": {"f:outputs": {}, "f:ready": {}}}),
    ));
    assert_eq!(
        region.to_fields_v1(),
        json!({"f:status": {"f:phase": {}, "f:outputs": {}, "f:ready": {}}})
    );
    // A `.` with children is no leaf: it stands for its children only.
    let mut region = decode(&json!({"f:spec": {}}));
    region.union_region(&decode(&json!({"f:spec": {".": {}, "f:a": {}}})));
    assert!(region.is_leaf_at(&path("spec")));
}

#[test]
fn a_region_covers_what_lies_inside_it_only() {
    let region = decode(&controller_status_fields());
    let inside = decode(&json!({"f:status": {"f:phase": {},
        "f:workspaceStatus": {"f:atProvider": {"f:outputs": {"f:cluster_endpoint": {"f:value": {}}}}}}}));
    assert!(region.region_covers(&inside));
    assert!(region.region_covers(&FieldSet::default()));
    // A sibling the region does not name, or a leaf where the region names children only.
    assert!(!region.region_covers(&decode(&json!({"f:status": {"f:ready": {}}}))));
    assert!(!region.region_covers(&decode(&json!({"f:status": {"f:workspaceStatus": {}}}))));
}

#[test]
fn projecting_a_region_keeps_values_inside_and_the_kind_of_every_value_on_the_way() {
    let region = decode(&json!({"f:spec": {"f:version": {}},
        "f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {"f:status": {}}},
                     "f:workspaceStatus": {"f:atProvider": {"f:missing": {}}},
                     "f:phase": {"f:below-a-scalar": {}}}}));
    let projected = region.project_region(&live_object()).unwrap();
    assert_eq!(
        projected,
        json!({"spec": {"version": "1.31"},
               "status": {"conditions": [{"type": "Ready", "status": "True"}],
                          "workspaceStatus": {"atProvider": {}},
                          "phase": "Ready"}})
    );
    // A list the region names an element of by index is kept whole: indices must not move.
    let by_index = decode(&json!({"f:status": {"f:conditions": {"i:1": {}}}}));
    assert_eq!(
        by_index.project_region(&live_object()).unwrap()["status"]["conditions"],
        live_object()["status"]["conditions"]
    );
    assert_eq!(FieldSet::default().project_region(&live_object()), None);
}

#[test]
fn a_set_within_a_region_answers_every_question_about_the_region_as_before() {
    let region = decode(&json!({"f:status": {"f:workspaceStatus": {"f:atProvider": {
        "f:checksum": {}, "f:outputs": {}}}}}));
    // Another manager: owns atProvider as a map and a key in outputs, and much elsewhere.
    let other = decode(&json!({"f:metadata": {"f:labels": {"f:a": {}}},
        "f:status": {".": {}, "f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}}},
            "f:workspaceStatus": {"f:atProvider": {".": {}, "f:outputs": {"f:f": {"f:deep": {}}}, "f:state": {"f:x": {}}}}}}));
    let within = other.within_region(&region);
    for p in [
        "status",
        "status.workspaceStatus",
        "status.workspaceStatus.atProvider",
        "status.workspaceStatus.atProvider.checksum",
        "status.workspaceStatus.atProvider.outputs",
        "status.workspaceStatus.atProvider.outputs.f",
        "status.workspaceStatus.atProvider.outputs.f.deep",
        "status.workspaceStatus.atProvider.outputs.g",
    ] {
        let p = path(p);
        assert_eq!(within.owns(&p), other.owns(&p), "owns {p:?}");
        assert_eq!(within.touches(&p), other.touches(&p), "touches {p:?}");
        assert_eq!(
            within.is_leaf_at(&p),
            other.is_leaf_at(&p),
            "is_leaf_at {p:?}"
        );
        assert_eq!(
            within.covering_leaf(&p),
            other.covering_leaf(&p),
            "covering_leaf {p:?}"
        );
    }
    let claimed = decode(&json!({"f:status": {"f:workspaceStatus": {"f:atProvider": {
        "f:checksum": {}, "f:outputs": {"f:f": {}, "f:a": {}}}}}}));
    assert_eq!(claimed.intersection(&within), claimed.intersection(&other));
    // Outside the region only a bare leaf is left of each child leaving it.
    assert_eq!(
        within.to_fields_v1()["f:status"]["f:conditions"],
        json!({}),
        "{}",
        within.to_fields_v1()
    );
    assert_eq!(within.to_fields_v1()["f:metadata"], json!({}));
    // Outside any region, where the set is is all that is left.
    assert_eq!(
        other.within_region(&FieldSet::default()).to_fields_v1(),
        json!({"f:metadata": {}, "f:status": {}})
    );
}

#[test]
fn a_region_answers_for_claims_that_leave_it_where_nobody_owns_anything() {
    let region = decode(&json!({"f:status": {"f:ready": {}}}));
    let core = decode(&json!({"f:metadata": {"f:finalizers": {}}, "f:status": {"f:phase": {}}}))
        .within_region(&region);
    let kubectl = decode(&json!({"f:spec": {"f:size": {}}})).within_region(&region);
    let owners = [&core, &kubectl];
    let claims = |v: Value| region.region_answers(&decode(&v), &owners);
    // Inside the region, or where nobody owns anything: no value outside is read.
    assert!(claims(json!({"f:status": {"f:ready": {}}})));
    assert!(claims(
        json!({"f:status": {"f:ready": {}, "f:outputs": {"f:a": {}}}})
    ));
    assert!(claims(json!({"f:other": {"f:x": {}}})));
    // Where someone owns something the region did not keep: read it first.
    assert!(!claims(json!({"f:status": {"f:phase": {}}})));
    assert!(!claims(json!({"f:spec": {"f:replicas": {}}})));
    assert!(
        !claims(json!({"f:status": {}})),
        "a leaf claims the phase too"
    );
    // An owner of a whole subtree the region holds part of.
    let whole = decode(&json!({"f:status": {}})).within_region(&region);
    assert!(region.region_answers(&decode(&json!({"f:status": {"f:ready": {}}})), &[&whole]));
    assert!(!region.region_answers(&decode(&json!({"f:status": {"f:x": {}}})), &[&whole]));
}
