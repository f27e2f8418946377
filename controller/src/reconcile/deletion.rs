//! A CAPT object's deletion, decided one step per reconcile, in the order that
//! [`crate::status::deletion`] plans: the Cluster endpoint released, the apply deleted, its
//! Workspace gone, then the finalizer removed. Progress is published as conditions. A pure
//! function: [`super::act`] carries its plan out.

use super::plan::{Next, Object, Plan, Step, Warning};
use crate::api::{Cluster, WorkspaceTemplateApply};
use crate::publish::Publication;
use crate::status::deletion::{
    DeletionFacts, DeletionStep, deletion_status_fragment, plan_deletion,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{Resource, ResourceExt};
use std::time::Duration;

/// What a deleting object is, besides the facts of its deletion.
#[derive(Clone, Debug)]
pub struct Deletion {
    /// Our finalizer on it.
    pub finalizer: &'static str,
    /// The field manager of its status.
    pub manager: &'static str,
    /// The condition types that manager sets (kept verbatim while deleting).
    pub own_types: &'static [&'static str],
    /// Its live conditions.
    pub existing: Vec<Condition>,
    /// Its apply, if it exists and is provably its own.
    pub apply: Option<WorkspaceTemplateApply>,
    /// Why the apply its `spec.workspaceTemplateApplyName` names is left alone, when it
    /// exists and is not its own (told as a Warning Event).
    pub refused: Option<String>,
    /// The Cluster whose endpoint it releases, if any.
    pub cluster: Option<Cluster>,
    /// How often a waiting deletion looks again, at most.
    pub poll: Duration,
}

/// The next step of `obj`'s deletion, from `facts`: its progress published (until the
/// finalizer comes off), a refused apply told, then the step itself.
pub fn decide<K: Resource<DynamicType = ()>>(obj: &K, facts: &DeletionFacts, d: Deletion) -> Plan {
    let next = plan_deletion(facts, &d.existing, obj.meta().generation);
    if next.stuck {
        tracing::warn!(
            subject = super::subject(obj),
            step = next.step.as_str(),
            "Deletion is stuck"
        );
    }
    let mut plan = Plan::nothing();
    if next.step != DeletionStep::RemoveFinalizer {
        let fragment = deletion_status_fragment(&d.existing, d.own_types, &next);
        plan = plan.publish(Publication::status(obj, d.manager, fragment));
    }
    if let Some(why) = &d.refused {
        tracing::warn!(subject = super::subject(obj), "{why}");
        let reason = crate::tenancy::APPLY_NOT_OURS;
        plan = plan.then(Step::Warn(Warning::about(
            obj,
            reason,
            "Delete",
            why.clone(),
        )));
    }
    let recheck = next.recheck_after.unwrap_or(d.poll).min(d.poll);
    match next.step {
        DeletionStep::ReleaseEndpoint => {
            if let Some(cluster) = &d.cluster {
                plan = plan.publish(super::cluster::endpoint_release(cluster));
            }
        }
        DeletionStep::DeleteApply => {
            let apply = d.apply.as_ref().expect("DeleteApply implies an apply");
            plan = plan.then(Step::Delete {
                object: Object::of(apply),
                doing: "deleting its WorkspaceTemplateApply",
            });
        }
        DeletionStep::RemoveFinalizer => {
            // Retained: an adopted apply's owner references would let the garbage collector
            // take it (and its Workspace) once the owner is gone.
            if let Some(apply) = d.apply.as_ref().filter(|_| facts.retain)
                && !apply.owner_references().is_empty()
            {
                plan = plan.then(Step::Orphan {
                    object: Object::of(apply),
                    doing: "orphaning its WorkspaceTemplateApply",
                });
            }
            let object = Object::of(obj);
            let started = obj.meta().deletion_timestamp.as_ref().map(|t| t.0);
            return plan
                .then(Step::RemoveFinalizer {
                    object: object.clone(),
                    finalizer: d.finalizer,
                })
                .then(Step::Deleted { object, started });
        }
        DeletionStep::WaitForControlPlane
        | DeletionStep::WaitForApplyGone
        | DeletionStep::WaitForWorkspaceGone => {}
    }
    plan.next(Next::After(recheck))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::CAPTCluster;
    use crate::status::MANAGER_CAPT_CLUSTER;
    use jiff::Timestamp;
    use serde_json::{Value, json};

    const POLL: Duration = Duration::from_secs(30);
    const STARTED: &str = "2026-12-01T00:00:00Z";

    fn owner() -> CAPTCluster {
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
            "metadata": {"name": "demo", "namespace": "default", "uid": "uid-demo",
                "deletionTimestamp": STARTED, "finalizers": ["f"], "generation": 2},
            "spec": {"region": "r"},
        }))
        .expect("a CAPTCluster")
    }

    fn apply(extra: Value) -> Option<WorkspaceTemplateApply> {
        let mut object = json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
            "kind": "WorkspaceTemplateApply",
            "metadata": {"name": "demo-vpc", "namespace": "default", "uid": "uid-apply"},
            "spec": {"templateRef": {"name": "t"}},
        });
        json_patch::merge(&mut object, &extra);
        Some(serde_json::from_value(object).expect("an apply"))
    }

    fn cluster() -> Option<Cluster> {
        Some(
            serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": "demo", "namespace": "default", "uid": "uid-cluster"},
                "spec": {},
            }))
            .expect("a Cluster"),
        )
    }

    fn facts() -> DeletionFacts {
        let started: Timestamp = STARTED.parse().expect("a time");
        DeletionFacts {
            endpoint_owned: false,
            control_plane_present: false,
            apply_present: false,
            apply_deleting: false,
            workspace_present: false,
            workspace_problem: None,
            retain: false,
            started,
            now: started + Duration::from_secs(60),
            stuck_after: Duration::from_secs(900),
        }
    }

    fn deletion(apply: Option<WorkspaceTemplateApply>) -> Deletion {
        Deletion {
            finalizer: "f",
            manager: MANAGER_CAPT_CLUSTER,
            own_types: &["Ready"],
            existing: vec![],
            apply,
            refused: None,
            cluster: None,
            poll: POLL,
        }
    }

    /// Each step of a plan, in words: what it writes, to which object.
    fn steps(plan: &Plan) -> Vec<String> {
        plan.steps
            .iter()
            .map(|step| match step {
                Step::Publish(p) => {
                    let on = p.key.subresource.map_or("main", |_| "status");
                    let reason = p.fragment["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|c| c["type"] == "Deleting")
                        .map(|c| format!(" {}", c["reason"].as_str().unwrap_or_default()))
                        .unwrap_or_default();
                    format!("publish {} {} {on}{reason}", p.target.kind, p.key.manager)
                }
                Step::Warn(w) => format!("warn {}", w.reason),
                Step::Apply { object, doing, .. } => format!("{doing} {}", object.name),
                Step::Delete { object, .. } => format!("delete {} {:?}", object.name, object.uid),
                Step::Orphan { object, .. } => format!("orphan {} {:?}", object.name, object.uid),
                Step::RemoveFinalizer { object, finalizer } => {
                    format!("remove {finalizer} from {} {:?}", object.name, object.uid)
                }
                Step::Deleted { object, started } => {
                    format!("deleted {} {}", object.name, started.is_some())
                }
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn the_deletion_order_as_a_table_of_facts_and_plans() {
        let status = |reason: &str| format!("publish CAPTCluster capt-captcluster status {reason}");
        let finish = || {
            vec![
                r#"remove f from demo Some("uid-demo")"#.to_owned(),
                "deleted demo true".to_owned(),
            ]
        };
        let again = Next::After(POLL);
        type Row = (&'static str, DeletionFacts, Deletion, Vec<String>, Next);
        let rows: Vec<Row> = vec![
            (
                "the endpoint is still ours: released on the Cluster first",
                DeletionFacts {
                    endpoint_owned: true,
                    apply_present: true,
                    ..facts()
                },
                Deletion {
                    cluster: cluster(),
                    ..deletion(apply(json!({})))
                },
                vec![
                    status("ReleasingEndpoint"),
                    "publish Cluster capt-cluster main".to_owned(),
                ],
                again,
            ),
            (
                "the control plane is still there: wait for it, write nothing",
                DeletionFacts {
                    control_plane_present: true,
                    apply_present: true,
                    ..facts()
                },
                deletion(apply(json!({}))),
                vec![status("WaitingForControlPlane")],
                again,
            ),
            (
                "the apply is there: deleted, only the one of its observed uid",
                DeletionFacts {
                    apply_present: true,
                    workspace_present: true,
                    ..facts()
                },
                deletion(apply(json!({}))),
                vec![
                    status("DeletingWorkspaceTemplateApply"),
                    r#"delete demo-vpc Some("uid-apply")"#.to_owned(),
                ],
                again,
            ),
            (
                "the apply is going and its Workspace is there: wait for the Workspace",
                DeletionFacts {
                    apply_present: true,
                    apply_deleting: true,
                    workspace_present: true,
                    ..facts()
                },
                deletion(apply(json!({}))),
                vec![status("WaitingForWorkspace")],
                again,
            ),
            (
                "the Workspace is gone, the apply still going: wait for the apply",
                DeletionFacts {
                    apply_present: true,
                    apply_deleting: true,
                    ..facts()
                },
                deletion(apply(json!({}))),
                vec![status("WaitingForWorkspaceTemplateApply")],
                again,
            ),
            (
                "nothing left: the finalizer comes off, no status (the object goes)",
                facts(),
                deletion(None),
                finish(),
                Next::AwaitChange,
            ),
            (
                "retained, the apply adopted: its owner references dropped, then the finalizer",
                DeletionFacts {
                    retain: true,
                    apply_present: true,
                    workspace_present: true,
                    ..facts()
                },
                deletion(apply(
                    json!({"metadata": {"ownerReferences": [{"apiVersion": "v1",
                    "kind": "X", "name": "x", "uid": "u"}]}}),
                )),
                [
                    vec![r#"orphan demo-vpc Some("uid-apply")"#.to_owned()],
                    finish(),
                ]
                .concat(),
                Next::AwaitChange,
            ),
            (
                "retained, the apply not adopted: nothing to drop",
                DeletionFacts {
                    retain: true,
                    apply_present: true,
                    workspace_present: true,
                    ..facts()
                },
                deletion(apply(json!({}))),
                finish(),
                Next::AwaitChange,
            ),
            (
                "the recorded apply is another's: told, left alone",
                DeletionFacts {
                    workspace_present: false,
                    ..facts()
                },
                Deletion {
                    refused: Some("not ours".into()),
                    ..deletion(None)
                },
                [
                    vec!["warn WorkspaceTemplateApplyNotOwned".to_owned()],
                    finish(),
                ]
                .concat(),
                Next::AwaitChange,
            ),
        ];
        let owner = owner();
        for (rule, facts, d, want, next) in rows {
            let plan = decide(&owner, &facts, d);
            assert_eq!(steps(&plan), want, "{rule}");
            assert_eq!(plan.next, next, "{rule}");
        }
    }
}
