//! What each status write changed: a watch of one kind that compares every status it
//! receives with the one before it, and counts the changes by the fields that changed. Set
//! against the audit log's count of a manager's writes, it tells the writes that changed
//! nothing (the API server makes no new version for them, so the watch never sees them) from
//! the ones that did, and which fields moved in each.

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// Status changes by what changed (`ready`, `conditions[VpcReady]`, …, joined by `, `).
pub(crate) type Changes = BTreeMap<String, u64>;

/// The census of one kind's status changes.
#[derive(Default)]
pub(crate) struct StatusCensus {
    last: Mutex<HashMap<String, Value>>,
    changes: Mutex<Changes>,
}

impl StatusCensus {
    /// Starts watching; the task ends with the returned handle's abort.
    pub(crate) fn watch(api: Api<DynamicObject>) -> (Arc<Self>, tokio::task::JoinHandle<()>) {
        let me = Arc::new(Self::default());
        let census = me.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(o) = event else { continue };
                census.seen(
                    o.metadata.name.as_deref().unwrap_or_default(),
                    o.data.get("status").cloned().unwrap_or(Value::Null),
                );
            }
        });
        (me, task)
    }

    fn seen(&self, name: &str, status: Value) {
        let before = self
            .last
            .lock()
            .expect("lock")
            .insert(name.to_owned(), status.clone());
        // A first sight is no change: the object may have been written before the watch.
        let Some(before) = before else { return };
        let changed = changed_fields(&before, &status);
        if !changed.is_empty() {
            let what = changed.into_iter().collect::<Vec<_>>().join(", ");
            *self.changes.lock().expect("lock").entry(what).or_default() += 1;
        }
    }

    /// The changes counted so far.
    pub(crate) fn changes(&self) -> Changes {
        self.changes.lock().expect("lock").clone()
    }
}

/// The changes between two censuses taken one after the other.
pub(crate) fn since(before: &Changes, after: &Changes) -> Changes {
    after
        .iter()
        .map(|(what, n)| (what.clone(), n - before.get(what).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The fields that differ between two statuses: top-level keys, one level further into
/// objects, and conditions by type (a condition whose time alone moved counts as itself).
fn changed_fields(before: &Value, after: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    diff(before, after, "", 2, &mut out);
    out
}

fn diff(before: &Value, after: &Value, at: &str, depth: usize, out: &mut BTreeSet<String>) {
    if before == after {
        return;
    }
    let empty = Map::new();
    match (before, after) {
        (Value::Object(_), _) | (_, Value::Object(_)) if depth > 0 => {
            let (b, a) = (
                before.as_object().unwrap_or(&empty),
                after.as_object().unwrap_or(&empty),
            );
            for key in b.keys().chain(a.keys()).collect::<BTreeSet<_>>() {
                let path = if at.is_empty() {
                    key.clone()
                } else {
                    format!("{at}.{key}")
                };
                let (bv, av) = (
                    b.get(key).unwrap_or(&Value::Null),
                    a.get(key).unwrap_or(&Value::Null),
                );
                if key == "conditions" {
                    conditions(bv, av, &path, out);
                } else {
                    diff(bv, av, &path, depth - 1, out);
                }
            }
        }
        _ => {
            out.insert(at.to_owned());
        }
    }
}

fn conditions(before: &Value, after: &Value, at: &str, out: &mut BTreeSet<String>) {
    let by_type = |v: &Value| -> BTreeMap<String, Value> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|c| (c["type"].as_str().unwrap_or_default().to_owned(), c.clone()))
            .collect()
    };
    let (b, a) = (by_type(before), by_type(after));
    for t in b.keys().chain(a.keys()).collect::<BTreeSet<_>>() {
        if b.get(t) != a.get(t) {
            out.insert(format!("{at}[{t}]"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_the_fields_and_the_conditions_that_changed() {
        let before = json!({"ready": false, "workspaceTemplateStatus": {"ready": false, "outputs": {"a": 1}},
            "conditions": [{"type": "VpcReady", "status": "False"}, {"type": "Paused", "status": "False"}]});
        let after = json!({"ready": false, "workspaceTemplateStatus": {"ready": true, "outputs": {"a": 2}},
            "conditions": [{"type": "Paused", "status": "False"}, {"type": "VpcReady", "status": "True"}],
            "vpcId": "vpc-1"});
        assert_eq!(
            changed_fields(&before, &after)
                .into_iter()
                .collect::<Vec<_>>(),
            [
                "conditions[VpcReady]",
                "vpcId",
                "workspaceTemplateStatus.outputs",
                "workspaceTemplateStatus.ready"
            ]
        );
    }

    #[test]
    fn counts_changes_after_the_first_sight_only() {
        let census = StatusCensus::default();
        census.seen("a", json!({"ready": false}));
        census.seen("a", json!({"ready": false}));
        census.seen("a", json!({"ready": true}));
        census.seen("b", json!({"ready": true}));
        assert_eq!(census.changes(), Changes::from([("ready".to_owned(), 1)]));
    }
}
