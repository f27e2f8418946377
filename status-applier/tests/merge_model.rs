//! Property test of the merge rules: for random sequences of fragments (sets, nulls,
//! releases, a protected subtree merged key by key, a protected subtree replaced whole), an
//! independent reference model predicts the desired document after every step, and the
//! applier's pure core must agree. Invariant: a protected path never vanishes unless the
//! fragment released it. Reproduce a failure with the seed proptest prints
//! (`PROPTEST_CASES`, `proptest-regressions/`).

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use status_applier::config::{FieldPath, PathRules};
use status_applier::merge::merge_fragment;

/// What a fragment does to one key: leave it, set it, or null it.
#[derive(Clone, Debug)]
enum Op {
    Keep,
    Set(u8),
    Null,
}

/// What a fragment does to a subtree of keys `x`, `y`, `z`.
#[derive(Clone, Debug)]
enum Tree {
    Keep,
    Null,
    Keys(std::collections::BTreeMap<String, Op>),
}

#[derive(Clone, Debug)]
struct Step {
    plain: Op,
    endpoint: Tree,
    at_provider: Tree,
    release_endpoint: bool,
    release_at_provider: bool,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![Just(Op::Keep), (0u8..4).prop_map(Op::Set), Just(Op::Null)]
}

fn tree() -> impl Strategy<Value = Tree> {
    let key = prop_oneof![
        Just("x".to_owned()),
        Just("y".to_owned()),
        Just("z".to_owned())
    ];
    let keys = proptest::collection::btree_map(key, op(), 0..3);
    prop_oneof![
        Just(Tree::Keep),
        Just(Tree::Null),
        keys.prop_map(Tree::Keys)
    ]
}

fn step() -> impl Strategy<Value = Step> {
    (
        op(),
        tree(),
        tree(),
        proptest::bool::weighted(0.2),
        proptest::bool::weighted(0.2),
    )
        .prop_map(
            |(plain, endpoint, at_provider, release_endpoint, release_at_provider)| Step {
                plain,
                endpoint,
                at_provider,
                release_endpoint,
                release_at_provider,
            },
        )
}

fn op_json(op: &Op) -> Option<Value> {
    match op {
        Op::Keep => None,
        Op::Set(v) => Some(json!(v)),
        Op::Null => Some(Value::Null),
    }
}

fn tree_json(tree: &Tree) -> Option<Value> {
    match tree {
        Tree::Keep => None,
        Tree::Null => Some(Value::Null),
        Tree::Keys(keys) => Some(Value::Object(
            keys.iter()
                .filter_map(|(k, o)| Some((k.clone(), op_json(o)?)))
                .collect(),
        )),
    }
}

/// The fragment a step sends.
fn fragment(step: &Step) -> Value {
    let mut status = Map::new();
    if let Some(v) = op_json(&step.plain) {
        status.insert("phase".into(), v);
    }
    if let Some(v) = tree_json(&step.at_provider) {
        status.insert("atProvider".into(), v);
    }
    let mut doc = json!({"status": status});
    if let Some(v) = tree_json(&step.endpoint) {
        doc["spec"] = json!({"endpoint": v});
    }
    doc
}

/// The reference model: the desired value of each part, kept apart and combined at the end.
#[derive(Clone, Debug, Default, PartialEq)]
struct Model {
    phase: Option<u8>,
    endpoint: Map<String, Value>,
    at_provider: Map<String, Value>,
}

impl Model {
    fn apply(&mut self, step: &Step) {
        match step.plain {
            Op::Keep => {}
            Op::Set(v) => self.phase = Some(v),
            Op::Null => self.phase = None,
        }
        let before = self.endpoint.clone();
        match &step.endpoint {
            Tree::Keep => {}
            Tree::Null => self.endpoint.clear(),
            // Merged key by key.
            Tree::Keys(keys) => {
                for (k, o) in keys {
                    match o {
                        Op::Keep => {}
                        Op::Set(v) => {
                            self.endpoint.insert(k.clone(), json!(v));
                        }
                        Op::Null => {
                            self.endpoint.remove(k);
                        }
                    }
                }
            }
        }
        if self.endpoint.is_empty() && !before.is_empty() && !step.release_endpoint {
            self.endpoint = before; // protected: kept unless released
        }
        let before = self.at_provider.clone();
        match &step.at_provider {
            Tree::Keep => {}
            Tree::Null => self.at_provider.clear(),
            // Replaced whole: exactly the keys set now.
            Tree::Keys(keys) => {
                self.at_provider = keys
                    .iter()
                    .filter_map(|(k, o)| match o {
                        Op::Set(v) => Some((k.clone(), json!(v))),
                        _ => None,
                    })
                    .collect();
            }
        }
        if self.at_provider.is_empty() && !before.is_empty() && !step.release_at_provider {
            self.at_provider = before;
        }
    }

    /// The model's parts as they must appear in the document (an absent or emptied
    /// subtree may be absent or `{}`: both apply nothing).
    fn agrees_with(&self, doc: &Value) -> Result<(), String> {
        let phase = doc["status"]["phase"].as_u64().map(|v| v as u8);
        let obj = |v: &Value| v.as_object().cloned().unwrap_or_default();
        let endpoint = obj(&doc["spec"]["endpoint"]);
        let at_provider = obj(&doc["status"]["atProvider"]);
        if (phase, &endpoint, &at_provider) != (self.phase, &self.endpoint, &self.at_provider) {
            return Err(format!("model {self:?}\ndocument {doc}"));
        }
        Ok(())
    }
}

fn rules() -> PathRules {
    let p = |s: &str| s.parse::<FieldPath>().unwrap();
    PathRules {
        protected: vec![p("spec.endpoint"), p("status.atProvider")],
        replaced: vec![p("status.atProvider")],
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn the_pure_core_agrees_with_the_model_on_every_step(steps in proptest::collection::vec(step(), 1..25)) {
        let rules = rules();
        let mut model = Model::default();
        let mut doc = json!({});
        for step in &steps {
            let mut release = Vec::new();
            if step.release_endpoint { release.push("spec.endpoint".parse().unwrap()); }
            if step.release_at_provider { release.push("status.atProvider".parse().unwrap()); }
            let had_endpoint = !model.endpoint.is_empty();
            let had_at_provider = !model.at_provider.is_empty();
            doc = merge_fragment(&doc, &fragment(step), &rules, &release).document;
            model.apply(step);
            prop_assert!(model.agrees_with(&doc).is_ok(), "{}", model.agrees_with(&doc).unwrap_err());
            if had_endpoint && !step.release_endpoint {
                prop_assert!(!model.endpoint.is_empty(), "a protected endpoint vanished without release");
            }
            if had_at_provider && !step.release_at_provider {
                prop_assert!(!model.at_provider.is_empty(), "a protected atProvider vanished without release");
            }
        }
    }
}
