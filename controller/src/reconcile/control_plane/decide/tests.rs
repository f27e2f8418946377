//! The control plane's decision, as a table: each row a snapshot (and what earlier steps
//! answered), and the plan. Each row is a rule of `docs/architecture.md` and
//! `docs/security.md`. The last rows carry whole reconciles out against canned answers.

use super::*;
use crate::api::TerraformWorkspace;
use crate::reconcile::deletion::Deletion;
use crate::reconcile::kubeconfig::{READING_KUBECONFIG, SECRET_NOT_CONTROLLED};
use crate::render::{APPLY_NAME_LABEL, APPLY_NAMESPACE_LABEL, APPLY_UID_LABEL, workspace_name};
use crate::status::deletion::DeletionFacts;
use k8s_openapi::ByteString;
use kube::api::DynamicObject;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

const NOW: &str = "2026-12-07T12:00:00Z";
const FINALIZER: &str = CAPT_CONTROL_PLANE_FINALIZER;
const ENDPOINT: &str = "https://eks.example:443";

fn now() -> Timestamp {
    NOW.parse().expect("a time")
}

fn object<K: serde::de::DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("an object of its kind")
}

fn dynamic(value: impl serde::Serialize) -> DynamicObject {
    object(serde_json::to_value(value).expect("json"))
}

/// A CAPTControlPlane `demo` of the Cluster `demo`, `extra` merged in.
fn control_plane(extra: Value) -> Arc<CAPTControlPlane> {
    let mut value = json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "demo", "namespace": "default", "uid": "uid-cp", "generation": 1,
            "resourceVersion": "10", "creationTimestamp": "2026-12-07T11:59:00Z",
            "labels": {"cluster.x-k8s.io/cluster-name": "demo"},
            "finalizers": [FINALIZER]},
        "spec": {"version": "v1.31.0", "workspaceTemplateRef": {"name": "eks"},
            "controlPlaneConfig": {"region": "r"},
            "workspaceTemplateApplyName": "demo-controlplane"},
    });
    json_patch::merge(&mut value, &extra);
    Arc::new(object(value))
}

/// The Cluster `demo`, naming (`names_it`) the control plane `demo`, and the CAPTCluster
/// `demo` as its infrastructure; `extra` merged in.
fn cluster(names_it: bool, extra: Value) -> Arc<Cluster> {
    let control_plane = if names_it { "demo" } else { "other" };
    let mut value = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "demo", "namespace": "default", "uid": "uid-cluster"},
        "spec": {
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "CAPTCluster", "name": "demo"},
            "controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io",
                "kind": "CAPTControlPlane", "name": control_plane},
        },
    });
    json_patch::merge(&mut value, &extra);
    Arc::new(object(value))
}

/// The CAPTCluster `demo`, its VPC ready or not.
fn vpc(ready: bool) -> Arc<CAPTCluster> {
    Arc::new(object(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
        "metadata": {"name": "demo", "namespace": "default", "uid": "uid-cc"},
        "spec": {"region": "r"},
        "status": {"ready": ready},
    })))
}

/// The apply the controller writes for `control_plane(..)`: the body of a new control
/// plane's first plan, as the API server keeps it.
fn cp_apply() -> WorkspaceTemplateApply {
    let seen = snapshot(control_plane(json!({})), None);
    let plan = decide(&seen, &Progress::default(), now());
    let body = plan
        .steps
        .iter()
        .find_map(|s| match s {
            Step::Apply {
                doing: APPLYING,
                body,
                ..
            } => Some(body.clone()),
            _ => None,
        })
        .expect("an apply written");
    let mut apply: Value = body;
    json_patch::merge(
        &mut apply,
        &json!({"metadata": {"uid": "uid-apply", "generation": 1, "resourceVersion": "20"}}),
    );
    object(apply)
}

/// The apply's Workspace: ours, Ready, with these outputs.
fn workspace(outputs: Value) -> Arc<TerraformWorkspace> {
    Arc::new(object(json!({
        "apiVersion": "tf.upbound.io/v1beta1", "kind": "Workspace",
        "metadata": {"name": workspace_name("default", "demo-controlplane"), "uid": "uid-ws",
            "labels": {APPLY_NAMESPACE_LABEL: "default", APPLY_NAME_LABEL: "demo-controlplane",
                APPLY_UID_LABEL: "uid-apply"}},
        "spec": {},
        "status": {
            "conditions": [
                {"type": "Synced", "status": "True", "reason": "ReconcileSuccess", "message": "",
                    "lastTransitionTime": "2026-12-07T11:59:30Z"},
                {"type": "Ready", "status": "True", "reason": "Available", "message": "",
                    "lastTransitionTime": "2026-12-07T11:59:30Z"},
            ],
            "atProvider": {"checksum": "sum-1", "outputs": outputs},
        },
    })))
}

/// The apply's connection Secret, with the endpoint and the CA (no whole kubeconfig).
fn connection() -> Secret {
    let data = BTreeMap::from([
        ("cluster_endpoint".to_owned(), ByteString(ENDPOINT.into())),
        (
            "cluster_certificate_authority_data".to_owned(),
            ByteString("Q0EgREFUQQ==".into()),
        ),
    ]);
    let mut secret: Secret = object(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "demo-eks-connection", "namespace": "default",
            "resourceVersion": "30"},
    }));
    secret.data = Some(data);
    secret
}

/// A control plane whose VPC is ready, with its Cluster, its apply and its Workspace.
fn snapshot(cp: Arc<CAPTControlPlane>, workspace: Option<Arc<TerraformWorkspace>>) -> Snapshot {
    Snapshot {
        as_owner: OwnerSnapshot {
            owner: cp,
            named_cluster: Some(cluster(true, json!({}))),
            apply: None,
            workspaces: workspace.into_iter().collect(),
            siblings: vec![],
            deletion: None,
            allowed_template_namespaces: Default::default(),
            poll_interval: Duration::from_secs(5),
        },
        infrastructure: Some(vpc(true)),
        without_core: false,
    }
}

/// The snapshot of a control plane at rest: its apply cached, its Workspace Ready with these
/// outputs.
fn at_rest(outputs: Value) -> Snapshot {
    let mut seen = snapshot(control_plane(json!({})), Some(workspace(outputs)));
    seen.as_owner.apply = Some(Arc::new(cp_apply()));
    seen
}

/// A plan's steps, each as (what it does, the object it reads or writes).
fn steps(plan: &Plan) -> Vec<(String, String)> {
    plan.steps
        .iter()
        .map(|step| match step {
            Step::Apply { doing, object, .. } => (doing.to_string(), object.name.clone()),
            Step::Read { doing, object } => (doing.to_string(), object.name.clone()),
            Step::WriteSecret { doing, secret, .. } => (doing.to_string(), secret.0.name_any()),
            Step::Publish(p) => {
                let on = match p.key.subresource {
                    Some(_) => "publish status",
                    None => "publish main",
                };
                (on.to_owned(), p.key.name.to_string())
            }
            Step::Warn(w) => (format!("warn {}", w.reason), String::new()),
            Step::PhaseReached { phase, .. } => (format!("phase {phase}"), String::new()),
            other => (format!("{other:?}"), String::new()),
        })
        .collect()
}

fn row(doing: &str, name: &str) -> (String, String) {
    (doing.to_owned(), name.to_owned())
}

/// The publication of the status (`status`) or of the main resource in a plan.
fn published(plan: &Plan, status: bool) -> &Publication {
    plan.steps
        .iter()
        .find_map(|s| match s {
            Step::Publish(p) if p.key.subresource.is_some() == status => Some(p),
            _ => None,
        })
        .expect("a publication")
}

/// `progress` with the connection Secret read (`found` or not there).
fn read_connection(progress: &mut Progress, found: Option<Secret>) {
    let name = "demo-eks-connection".to_owned();
    progress.was_read(READING_CONNECTION, name, found.map(dynamic));
}

#[test]
fn a_new_control_plane_gets_its_finalizer_its_apply_and_the_apply_s_name_then_decides_again() {
    let cp = control_plane(json!({"metadata": {"finalizers": null},
        "spec": {"workspaceTemplateApplyName": null}}));
    let plan = decide(&snapshot(cp, None), &Progress::default(), now());
    assert_eq!(
        steps(&plan),
        [
            row(ADDING_FINALIZER, "demo"),
            row(APPLYING, "demo-controlplane"),
            row(RECORDING, "demo"),
        ]
    );
    assert_eq!(plan.next, Next::Redecide);
}

#[test]
fn before_its_vpc_is_ready_a_control_plane_writes_no_apply_and_publishes_its_status() {
    let mut seen = snapshot(control_plane(json!({})), None);
    seen.infrastructure = Some(vpc(false));
    let plan = decide(&seen, &Progress::default(), now());
    assert_eq!(steps(&plan), [row("publish status", "demo")]);
    let status = &published(&plan, true).fragment["status"];
    assert_eq!(status["phase"], "Creating", "{status}");
}

#[test]
fn the_endpoint_from_the_workspace_output_is_published_alone_first_then_the_status() {
    let seen = at_rest(json!({"cluster_endpoint": ENDPOINT}));
    let plan = decide(&seen, &Progress::default(), now());
    assert_eq!(steps(&plan), [row("publish main", "demo")]);
    assert_eq!(plan.next, Next::Redecide);
    let main = published(&plan, false);
    assert_eq!(
        main.fragment["spec"]["controlPlaneEndpoint"]["host"],
        "eks.example"
    );
    // The endpoint's write made generation 2: the status observes it, computed once.
    let mut progress = Progress::default();
    progress.was_published(main.key.clone(), Some(2));
    let plan = decide(&seen, &progress, now());
    let status = published(&plan, true);
    assert_eq!(
        status.fragment["status"]["observedGeneration"], 2,
        "the generation the endpoint's write left"
    );
    assert!(
        !steps(&plan).contains(&row("publish main", "demo")),
        "published once"
    );
}

#[test]
fn without_an_endpoint_output_a_ready_workspace_s_connection_secret_gives_it_read_once() {
    let seen = at_rest(json!({}));
    let plan = decide(&seen, &Progress::default(), now());
    assert_eq!(
        steps(&plan),
        [row(READING_CONNECTION, "demo-eks-connection")]
    );
    assert_eq!(plan.next, Next::Redecide);
    let mut progress = Progress::default();
    read_connection(&mut progress, Some(connection()));
    let plan = decide(&seen, &progress, now());
    let main = published(&plan, false);
    assert_eq!(
        main.fragment["spec"]["controlPlaneEndpoint"]["host"],
        "eks.example"
    );
    // The kubeconfig's turn reads it no more: the one read serves both.
    progress.was_published(main.key.clone(), Some(1));
    let plan = decide(&seen, &progress, now());
    let reads: Vec<_> = steps(&plan)
        .into_iter()
        .filter(|(d, _)| d.starts_with("reading"))
        .collect();
    assert_eq!(
        reads,
        [
            row(READING_KUBECONFIG, "demo-kubeconfig"),
            row(READING_KUBECONFIG, "demo-user-kubeconfig"),
        ]
    );
}

#[test]
fn a_connection_secret_in_another_namespace_is_never_read() {
    let mut apply = cp_apply();
    apply
        .spec
        .write_connection_secret_to_ref
        .as_mut()
        .expect("a ref")
        .namespace = "kube-system".into();
    let mut seen = at_rest(json!({}));
    seen.as_owner.apply = Some(Arc::new(apply));
    let plan = decide(&seen, &Progress::default(), now());
    assert!(
        !steps(&plan).iter().any(|(d, _)| d.starts_with("reading")),
        "{:?}",
        steps(&plan)
    );
}

/// What the first rounds of a control plane at rest answered: its endpoint published (same
/// generation) and its connection Secret read.
fn endpoint_published(seen: &Snapshot) -> Progress {
    let mut progress = Progress::default();
    let plan = decide(seen, &progress, now());
    progress.was_published(published(&plan, false).key.clone(), Some(1));
    progress
}

#[test]
fn the_kubeconfig_secrets_are_read_after_the_status_and_created_when_absent() {
    let seen = at_rest(json!({"cluster_endpoint": ENDPOINT}));
    let mut progress = endpoint_published(&seen);
    let plan = decide(&seen, &progress, now());
    assert_eq!(
        steps(&plan),
        [
            row("publish status", "demo"),
            row(READING_CONNECTION, "demo-eks-connection"),
        ]
    );
    progress.was_published(published(&plan, true).key.clone(), None);
    read_connection(&mut progress, Some(connection()));
    let plan = decide(&seen, &progress, now());
    assert_eq!(
        steps(&plan),
        [
            row(READING_KUBECONFIG, "demo-kubeconfig"),
            row(READING_KUBECONFIG, "demo-user-kubeconfig"),
        ],
        "the status is not published again"
    );
    for name in ["demo-kubeconfig", "demo-user-kubeconfig"] {
        progress.was_read(READING_KUBECONFIG, name.into(), None);
    }
    let plan = decide(&seen, &progress, now());
    assert_eq!(
        steps(&plan),
        [
            row("creating a kubeconfig Secret", "demo-kubeconfig"),
            row("creating a kubeconfig Secret", "demo-user-kubeconfig"),
        ]
    );
    assert_ne!(plan.next, Next::Redecide);
}

/// What the kubeconfig's reads answered: the connection Secret, and these live Secrets.
fn kubeconfig_read(seen: &Snapshot, live: [Option<Secret>; 2]) -> Progress {
    let mut progress = endpoint_published(seen);
    let plan = decide(seen, &progress, now());
    progress.was_published(published(&plan, true).key.clone(), None);
    read_connection(&mut progress, Some(connection()));
    for (name, live) in ["demo-kubeconfig", "demo-user-kubeconfig"]
        .into_iter()
        .zip(live)
    {
        progress.was_read(READING_KUBECONFIG, name.into(), live.map(dynamic));
    }
    progress
}

/// The Secrets a plan writes.
fn secrets_written(plan: &Plan) -> Vec<Secret> {
    let written = plan.steps.iter().filter_map(|s| match s {
        Step::WriteSecret { secret, .. } => Some((*secret.0).clone()),
        _ => None,
    });
    written.collect()
}

#[test]
fn kubeconfig_secrets_as_wanted_are_not_written_and_ours_that_differ_are_applied_by_uid() {
    let seen = at_rest(json!({"cluster_endpoint": ENDPOINT}));
    let wanted = secrets_written(&decide(&seen, &kubeconfig_read(&seen, [None, None]), now()));
    assert_eq!(wanted.len(), 2);
    let live = wanted.clone().into_iter().map(|mut s| {
        s.metadata.uid = Some(format!("uid-{}", s.name_any()));
        Some(s)
    });
    let mut live: Vec<Option<Secret>> = live.collect();
    let plan = decide(
        &seen,
        &kubeconfig_read(&seen, [live[0].clone(), live[1].clone()]),
        now(),
    );
    assert!(secrets_written(&plan).is_empty(), "{:?}", steps(&plan));
    live[1].as_mut().expect("ours").data =
        Some(BTreeMap::from([("value".into(), ByteString("old".into()))]));
    let plan = decide(
        &seen,
        &kubeconfig_read(&seen, [live[0].clone(), live[1].clone()]),
        now(),
    );
    assert_eq!(
        steps(&plan),
        [row("applying a kubeconfig Secret", "demo-user-kubeconfig")]
    );
    let applied = &secrets_written(&plan)[0];
    assert_eq!(
        applied.metadata.uid.as_deref(),
        Some("uid-demo-user-kubeconfig")
    );
}

#[test]
fn a_kubeconfig_secret_controlled_by_another_is_left_alone_with_a_warning() {
    let seen = at_rest(json!({"cluster_endpoint": ENDPOINT}));
    let wanted = secrets_written(&decide(&seen, &kubeconfig_read(&seen, [None, None]), now()));
    let mut theirs = wanted[0].clone();
    theirs.metadata.uid = Some("uid-theirs".into());
    theirs.metadata.owner_references = None;
    let plan = decide(&seen, &kubeconfig_read(&seen, [Some(theirs), None]), now());
    assert_eq!(
        steps(&plan),
        [
            row(&format!("warn {SECRET_NOT_CONTROLLED}"), ""),
            row("creating a kubeconfig Secret", "demo-user-kubeconfig"),
        ]
    );
}

#[test]
fn no_plan_prints_secret_data() {
    let seen = at_rest(json!({"cluster_endpoint": ENDPOINT}));
    let progress = kubeconfig_read(&seen, [None, None]);
    let plan = decide(&seen, &progress, now());
    let written = secrets_written(&plan);
    assert!(!written.is_empty());
    // Each value read or written, as JSON (base64) and as its bytes would print.
    let datas = std::iter::once(connection().data).chain(written.into_iter().map(|s| s.data));
    let values = (datas.flatten().flatten()).flat_map(|(_, v)| {
        let bytes = format!("{:?}", v.0);
        let base64 = serde_json::to_value(&v).expect("json");
        [
            bytes.trim_matches(['[', ']']).to_owned(),
            base64.as_str().expect("a string").to_owned(),
        ]
    });
    let printed = format!("{plan:?} {progress:?}");
    for value in values {
        assert!(!printed.contains(&value), "Secret data printed: {value}");
    }
}

#[test]
fn a_template_in_another_namespace_is_refused_and_looked_at_again_within_the_poll() {
    let cp = control_plane(json!({"spec": {"workspaceTemplateRef": {"namespace": "shared"}}}));
    let plan = decide(&snapshot(cp, None), &Progress::default(), now());
    assert_eq!(steps(&plan), [row("publish status", "demo")]);
    let conditions = published(&plan, true).fragment["status"]["conditions"].clone();
    let refused = (conditions.as_array().expect("conditions").iter())
        .find(|c| c["type"] == "ReferencesResolved")
        .expect("the refusal's condition");
    assert_eq!(refused["status"], "False", "{refused}");
    assert_eq!(plan.next, Next::After(Duration::from_secs(5)));
}

#[test]
fn a_decoy_is_told_once_and_gets_nothing_of_the_cluster_it_names() {
    let mut seen = snapshot(control_plane(json!({})), None);
    seen.as_owner.named_cluster = Some(cluster(false, json!({})));
    let plan = decide(&seen, &Progress::default(), now());
    assert_eq!(
        steps(&plan),
        [
            row(&format!("warn {CLUSTER_DOES_NOT_REFERENCE}"), ""),
            row("publish status", "demo"),
        ]
    );
    assert_eq!(
        published(&plan, true).fragment["status"]["phase"],
        "Creating"
    );
}

#[test]
fn a_paused_control_plane_publishes_paused_and_nothing_else() {
    let paused = cluster(true, json!({"spec": {"paused": true}}));
    let mut seen = at_rest(json!({"cluster_endpoint": ENDPOINT}));
    seen.as_owner.named_cluster = Some(paused);
    let plan = decide(&seen, &Progress::default(), now());
    assert_eq!(steps(&plan), [row("publish status", "demo")]);
}

/// A control plane being deleted, alone (no core) or beside core, its apply gone.
fn deleting(without_core: bool) -> Snapshot {
    let cp = control_plane(json!({"metadata": {"deletionTimestamp": "2026-12-07T11:59:50Z"}}));
    let mut seen = snapshot(cp, None);
    seen.without_core = without_core;
    let d = Deletion {
        finalizer: FINALIZER,
        manager: MANAGER_CAPT_CONTROL_PLANE,
        own_types: &[],
        existing: vec![],
        apply: None,
        refused: None,
        cluster: seen.as_owner.named_cluster.as_deref().cloned(),
        poll: Duration::from_secs(5),
    };
    let facts = DeletionFacts {
        endpoint_owned: false,
        control_plane_present: false,
        apply_present: false,
        apply_deleting: false,
        workspace_present: false,
        workspace_problem: None,
        retain: false,
        started: "2026-12-07T11:59:50Z".parse().expect("a time"),
        now: now(),
        stuck_after: Duration::from_secs(600),
    };
    seen.as_owner.deletion = Some((d, facts));
    seen
}

#[test]
fn alone_a_deletion_reads_whether_the_endpoint_is_still_ours_and_releases_it() {
    let seen = deleting(true);
    let plan = decide(&seen, &Progress::default(), now());
    assert_eq!(steps(&plan), [row(READING_CLUSTER, "demo")]);
    let live = cluster(
        true,
        json!({"metadata": {"managedFields": [{"manager": crate::status::MANAGER_CLUSTER,
            "operation": "Apply", "apiVersion": "cluster.x-k8s.io/v1beta2",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:controlPlaneEndpoint": {"f:host": {}, "f:port": {}}}}}]}}),
    );
    let mut progress = Progress::default();
    progress.was_read(READING_CLUSTER, "demo".into(), Some(dynamic(&*live)));
    let plan = decide(&seen, &progress, now());
    assert_eq!(
        steps(&plan),
        [row("publish status", "demo"), row("publish main", "demo")],
        "its Deleting status, then the endpoint released"
    );
    let release = published(&plan, false);
    assert_eq!(release.key.manager, crate::status::MANAGER_CLUSTER);
    // Not ours (no managedFields of ours): nothing to release, the finalizer goes.
    let mut progress = Progress::default();
    progress.was_read(
        READING_CLUSTER,
        "demo".into(),
        Some(dynamic(&*cluster(true, json!({})))),
    );
    let plan = decide(&seen, &progress, now());
    assert!(
        !steps(&plan).contains(&row("publish main", "demo")),
        "{:?}",
        steps(&plan)
    );
}

#[test]
fn beside_core_a_deletion_reads_no_cluster() {
    let seen = deleting(false);
    let plan = decide(&seen, &Progress::default(), now());
    assert!(
        !steps(&plan).iter().any(|(d, _)| d == READING_CLUSTER),
        "{:?}",
        steps(&plan)
    );
}

/// Carries out a whole reconcile against canned answers: the finalizer's and the apply's
/// writes answer their bodies, the recorded name a new generation, the endpoint's
/// publication generation 2, a read `reads[name]`. Returns every round's steps and the
/// last plan's `next`.
fn reconcile(
    seen: &Snapshot,
    reads: &BTreeMap<&str, Option<DynamicObject>>,
) -> (Vec<Vec<(String, String)>>, Next) {
    let mut progress = Progress::default();
    let mut rounds = Vec::new();
    for _ in 0..crate::reconcile::act::MOST_ROUNDS {
        let plan = decide(seen, &progress, now());
        rounds.push(steps(&plan));
        for step in &plan.steps {
            match step {
                Step::Apply { doing, body, .. } => {
                    let mut answer = body.clone();
                    answer["metadata"]["generation"] = json!(2);
                    answer["metadata"]["resourceVersion"] = json!("11");
                    if *doing == APPLYING {
                        answer["metadata"]["uid"] = json!("uid-apply");
                    }
                    progress.answered(doing, object(answer));
                }
                Step::Read { doing, object } => {
                    let found = reads.get(object.name.as_str()).cloned().flatten();
                    progress.was_read(doing, object.name.clone(), found);
                }
                Step::Publish(p) => {
                    let generation = if p.key.subresource.is_some() {
                        None
                    } else {
                        Some(2)
                    };
                    progress.was_published(p.key.clone(), generation);
                }
                _ => {}
            }
        }
        if plan.next != Next::Redecide {
            return (rounds, plan.next);
        }
    }
    panic!("no settling within the rounds the executor allows: {rounds:#?}");
}

#[test]
fn the_longest_reconcile_settles_within_the_rounds_the_executor_allows() {
    // New, its Workspace already Ready under the apply about to be created, its endpoint only
    // in the connection Secret: every round the decision can ask for.
    let cp = control_plane(json!({"metadata": {"finalizers": null},
        "spec": {"workspaceTemplateApplyName": null}}));
    let seen = snapshot(cp, Some(workspace(json!({}))));
    let reads = BTreeMap::from([
        ("demo-eks-connection", Some(dynamic(connection()))),
        ("demo-kubeconfig", None),
        ("demo-user-kubeconfig", None),
    ]);
    let (rounds, next) = reconcile(&seen, &reads);
    assert_eq!(rounds.len(), 5, "{rounds:#?}");
    let all: Vec<_> = rounds.concat();
    for once in [
        row(ADDING_FINALIZER, "demo"),
        row(APPLYING, "demo-controlplane"),
        row(READING_CONNECTION, "demo-eks-connection"),
        row("publish main", "demo"),
        row("publish status", "demo"),
        row("creating a kubeconfig Secret", "demo-kubeconfig"),
    ] {
        assert_eq!(
            all.iter().filter(|s| **s == once).count(),
            1,
            "{once:?} in {rounds:#?}"
        );
    }
    assert_ne!(next, Next::Redecide);
}
