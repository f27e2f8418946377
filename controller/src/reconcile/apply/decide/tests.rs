use super::*;
use crate::reconcile::plan::merge;
use crate::watches::Watched as _;

#[test]
fn an_apply_stored_over_a_bound_is_refused_naming_the_field() {
    use crate::api::bounds::MAX_WAITS;
    let with = |field: &str, n: usize| -> WorkspaceTemplateApply {
        let list: Vec<_> = (0..n)
            .map(|i| json!({"name": format!("s{i}"), "namespace": "team"}))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
            "metadata": {"name": "a", "namespace": "team"},
            "spec": {"templateRef": {"name": "t"}, field: list},
        }))
        .unwrap()
    };
    assert_eq!(over_bounds(&with("waitForSecrets", MAX_WAITS)), None);
    let refused = over_bounds(&with("waitForSecrets", 20_000)).expect("refused");
    assert!(
        refused.starts_with("spec.waitForSecrets has 20000 entries"),
        "{refused}"
    );
    let refused = over_bounds(&with("waitForWorkspaces", MAX_WAITS + 1)).expect("refused");
    assert!(refused.starts_with("spec.waitForWorkspaces"), "{refused}");
}

#[test]
fn defaulted_fields_do_not_make_a_workspace_look_changed() {
    let mut live: TerraformWorkspace = serde_json::from_value(json!({
        "apiVersion": "tf.upbound.io/v1beta1", "kind": "Workspace",
        "metadata": {"name": "w", "labels": {"a": "1", "other": "x"},
            "annotations": {RENDERING_ANNOTATION: RENDERING.to_string()}},
        "spec": {"forProvider": {"module": "m", "source": "Inline"}, "managementPolicies": ["*"]},
    }))
    .unwrap();
    live.trim();
    let rendered = json!({"metadata": {"name": "w", "labels": {"a": "1"}}, "spec": {"forProvider": {"module": "m", "source": "Inline"}}});
    assert!(!needs_apply(Some(&live), &rendered));
    let changed = json!({"metadata": {"name": "w", "labels": {"a": "1"}}, "spec": {"forProvider": {"module": "m2", "source": "Inline"}}});
    assert!(needs_apply(Some(&live), &changed));
    assert!(needs_apply(None, &rendered));
}

fn inline_template(module: &str) -> crate::api::WorkspaceTemplate {
    serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
        "metadata": {"name": "t", "namespace": "team"},
        "spec": {"template": {"spec": {"forProvider": {"module": module, "source": "Inline"}}}},
    }))
    .unwrap()
}

fn apply_at(generation: i64) -> WorkspaceTemplateApply {
    serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "a", "namespace": "team", "uid": "u-1", "generation": generation},
        "spec": {"templateRef": {"name": "t"}},
    }))
    .unwrap()
}

/// `rendered` as the cache holds it once stored, with `edit` applied to it.
fn stored(rendered: &Value, edit: impl FnOnce(&mut Value)) -> TerraformWorkspace {
    let mut stored = rendered.clone();
    stored["spec"]["deletionPolicy"] = json!("Delete");
    edit(&mut stored);
    let mut live: TerraformWorkspace = serde_json::from_value(stored).unwrap();
    live.trim();
    live
}

/// What v0.1.0 wrote: no inputs digest, no rendering, the apply's generation; and a
/// rendering that differs from today's (here its module).
fn as_v0_1_0(ws: &mut Value) {
    let annotations = ws["metadata"]["annotations"].as_object_mut().unwrap();
    annotations.remove(INPUTS_ANNOTATION);
    annotations.remove(RENDERING_ANNOTATION);
    ws["spec"]["forProvider"]["module"] = json!("rendered otherwise by v0.1.0");
}

#[test]
fn a_workspace_of_an_earlier_rendering_is_kept_while_its_inputs_are_unchanged() {
    let template = inline_template("m");
    let rendered = render_workspace(&apply_at(2), &template, "w").unwrap();
    let live = stored(&rendered, as_v0_1_0);
    assert!(!needs_apply(Some(&live), &rendered), "kept");
    // Its apply changed since: rendered anew.
    let later = render_workspace(&apply_at(3), &template, "w").unwrap();
    assert!(needs_apply(Some(&live), &later), "apply changed");
    // An earlier rendering that recorded its inputs: the template changed since.
    let live = stored(&rendered, |ws| {
        ws["metadata"]["annotations"][RENDERING_ANNOTATION] = json!("1");
        ws["spec"]["forProvider"]["module"] = json!("rendered otherwise");
    });
    assert!(!needs_apply(Some(&live), &rendered), "kept");
    let changed = render_workspace(&apply_at(2), &inline_template("m2"), "w").unwrap();
    assert!(needs_apply(Some(&live), &changed), "template changed");
}

#[test]
fn another_writers_change_of_a_rendered_field_is_put_back_and_an_operators_own_fields_stay() {
    let rendered = render_workspace(&apply_at(2), &inline_template("m"), "w").unwrap();
    assert!(
        rendered["spec"].get("deletionPolicy").is_none(),
        "{rendered}"
    );
    let operators = stored(&rendered, |ws| {
        ws["spec"]["deletionPolicy"] = json!("Orphan");
        ws["metadata"]["annotations"]["operator/note"] = json!("keep");
    });
    assert!(!needs_apply(Some(&operators), &rendered));
    let drifted = stored(&rendered, |ws| {
        ws["spec"]["forProvider"]["module"] = json!("edited by hand");
    });
    assert!(needs_apply(Some(&drifted), &rendered));
}

/// A loop once: a template without annotations rendered an empty map, which the API server
/// does not store; the Workspace then always looked changed and was applied again on
/// every reconcile.
#[test]
fn a_workspace_rendered_from_a_template_without_annotations_is_not_applied_again() {
    let template: crate::api::WorkspaceTemplate = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
        "metadata": {"name": "plain", "namespace": "team"},
        "spec": {"template": {"spec": {"forProvider": {"module": "m", "source": "Inline"}}}},
    }))
    .unwrap();
    let apply: WorkspaceTemplateApply = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "alone", "namespace": "team", "uid": "u-1"},
        "spec": {"templateRef": {"name": "plain"}},
    }))
    .unwrap();
    let rendered = render_workspace(&apply, &template, "team-alone-0123456789").unwrap();
    // What the API server keeps of it: no empty map in metadata, its defaults in spec.
    let mut stored = rendered.clone();
    let metadata = stored["metadata"].as_object_mut().unwrap();
    metadata.retain(|_, v| v.as_object().is_none_or(|m| !m.is_empty()));
    stored["spec"]["managementPolicies"] = json!(["*"]);
    stored["spec"]["providerConfigRef"] = json!({"name": "default"});
    let mut live: TerraformWorkspace = serde_json::from_value(stored).unwrap();
    live.trim();
    assert!(!needs_apply(Some(&live), &rendered), "{rendered}");
}

// The decision, as a table: each row a snapshot (and what earlier steps answered), and the
// plan. Each row is a rule of `docs/architecture.md` and `docs/security.md`.

const NOW: &str = "2026-12-07T12:00:00Z";

fn now() -> Timestamp {
    NOW.parse().expect("a time")
}

/// The apply `team/a` of template `t`, ours (our finalizer on it), `extra` merged in.
fn apply(extra: Value) -> WorkspaceTemplateApply {
    let mut value = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "a", "namespace": "team", "uid": "u-1", "generation": 2,
            "resourceVersion": "10", "finalizers": [APPLY_FINALIZER]},
        "spec": {"templateRef": {"name": "t"}, "variables": {"REGION": "r"}},
    });
    merge(&mut value, extra);
    serde_json::from_value(value).expect("an apply")
}

/// Its Workspace's name.
fn ws_name() -> String {
    crate::render::workspace_name("team", "a")
}

/// The Workspace rendered for `apply` as the cache holds it, `edit`ed.
fn its_workspace(
    apply: &WorkspaceTemplateApply,
    edit: impl FnOnce(&mut Value),
) -> TerraformWorkspace {
    let rendered = render_workspace(apply, &inline_template("m"), &ws_name()).unwrap();
    stored(&rendered, |ws| {
        ws["metadata"]["uid"] = json!("ws-uid");
        edit(ws);
    })
}

/// Another apply's Workspace under its name.
fn anothers_workspace() -> TerraformWorkspace {
    serde_json::from_value(json!({
        "apiVersion": "tf.upbound.io/v1beta1", "kind": "Workspace",
        "metadata": {"name": ws_name(), "uid": "theirs", "labels": {
            crate::render::APPLY_NAMESPACE_LABEL: "elsewhere",
            crate::render::APPLY_NAME_LABEL: "b"}},
        "spec": {"forProvider": {"source": "Inline", "module": "theirs"}},
    }))
    .unwrap()
}

/// What the apply's reconcile observes: its template cached, `workspace` under its name.
fn snapshot(apply: WorkspaceTemplateApply, workspace: Option<TerraformWorkspace>) -> Snapshot {
    let located = super::super::super::claims::locate(&apply, |n| {
        workspace.clone().filter(|w| w.name_any() == n)
    });
    Snapshot {
        apply: Arc::new(apply),
        cluster: None,
        located,
        template: Some(Arc::new(inline_template("m"))),
        waited_workspaces: vec![],
        applies: vec![],
        allowed_template_namespaces: BTreeSet::from(["team".to_owned()]).into(),
        workspace_policy: Default::default(),
        poll_interval: Duration::from_secs(5),
    }
}

fn decided(seen: &Snapshot, progress: &Progress) -> Plan {
    decide(seen, progress, now()).expect("renders")
}

/// A plan's steps, each as (what it does, the object it is about).
fn steps(plan: &Plan) -> Vec<(String, String)> {
    plan.steps
        .iter()
        .map(|step| match step {
            Step::Apply { doing, object, .. } => (doing.to_string(), object.name.clone()),
            Step::Merge { doing, object, .. } => (doing.to_string(), object.name.clone()),
            Step::Read { doing, object } => (doing.to_string(), object.name.clone()),
            Step::Delete { doing, object } => (doing.to_string(), object.name.clone()),
            Step::CheckSecrets { doing, secrets } => (doing.to_string(), format!("{secrets:?}")),
            Step::Publish(p) => ("publish".into(), p.key.name.to_string()),
            Step::Warn(w) => (format!("warn {}", w.reason), w.note.clone()),
            Step::RemoveFinalizer { object, .. } => {
                ("remove finalizer".into(), object.name.clone())
            }
            Step::Deleted { object, .. } => ("deleted".into(), object.name.clone()),
            other => (format!("{other:?}"), String::new()),
        })
        .collect()
}

fn doings(plan: &Plan) -> Vec<String> {
    steps(plan).into_iter().map(|(d, _)| d).collect()
}

/// The status a plan publishes.
fn published_status(plan: &Plan) -> Value {
    let publication = plan.steps.iter().find_map(|s| match s {
        Step::Publish(p) => Some(p),
        _ => None,
    });
    publication.expect("a status published").fragment["status"].clone()
}

/// The condition `type_` of a published status.
fn condition(status: &Value, type_: &str) -> Value {
    let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    conditions
        .into_iter()
        .find(|c| c["type"] == type_)
        .unwrap_or(Value::Null)
}

#[test]
fn a_new_apply_gets_our_finalizer_first_and_decides_again_from_its_answer() {
    let new = apply(json!({"metadata": {"finalizers": null}}));
    let seen = snapshot(new.clone(), None);
    let plan = decided(&seen, &Progress::default());
    assert_eq!(doings(&plan), vec![ADDING_FINALIZER]);
    assert_eq!(plan.next, Next::Redecide);
    // The answer: the apply with our finalizer, a newer resourceVersion.
    let mut answered = Progress::default();
    let mut with =
        serde_json::to_value(apply(json!({"metadata": {"resourceVersion": "11"}}))).unwrap();
    with["metadata"]["finalizers"] = json!([APPLY_FINALIZER]);
    answered.answered(ADDING_FINALIZER, serde_json::from_value(with).unwrap());
    let plan = decided(&seen, &answered);
    assert_eq!(doings(&plan), vec![APPLYING_WORKSPACE, "publish"]);
}

#[test]
fn a_paused_apply_is_left_as_it_is() {
    let paused = apply(
        json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": ""},
        "finalizers": null}}),
    );
    let plan = decided(&snapshot(paused, None), &Progress::default());
    assert_eq!(
        plan,
        Plan::nothing(),
        "no finalizer, no Workspace, no status"
    );
}

#[test]
fn a_rendered_workspace_is_applied_onto_the_one_observed_then_the_status_published() {
    let a = apply(json!({}));
    let drifted = its_workspace(&a, |ws| ws["spec"]["forProvider"]["module"] = json!("hand"));
    let plan = decided(&snapshot(a, Some(drifted)), &Progress::default());
    assert_eq!(doings(&plan), vec![APPLYING_WORKSPACE, "publish"]);
    let Step::Apply {
        object,
        manager,
        force,
        body,
        wrote,
        ..
    } = &plan.steps[0]
    else {
        panic!("{plan:?}")
    };
    assert_eq!(
        (object.name.as_str(), *manager, *force),
        (ws_name().as_str(), SPEC_MANAGER, true)
    );
    assert_eq!(
        body["metadata"]["uid"], "ws-uid",
        "only onto the Workspace observed"
    );
    assert!(wrote.is_some(), "told to the write-loop guard");
    let status = published_status(&plan);
    assert_eq!(status["applied"], true);
    assert_eq!(status["lastAppliedTime"], NOW, "applied now");
    assert_eq!(plan.next, Next::AwaitChange);
}

#[test]
fn an_apply_at_rest_publishes_its_status_and_writes_nothing() {
    let a = apply(json!({}));
    let rendered = its_workspace(&a, |_| {});
    let plan = decided(&snapshot(a, Some(rendered)), &Progress::default());
    assert_eq!(doings(&plan), vec!["publish"]);
    assert_eq!(plan.next, Next::AwaitChange);
}

#[test]
fn a_workspace_of_v0_1_0_gets_its_inputs_recorded_and_keeps_its_spec() {
    let a = apply(json!({}));
    let old = its_workspace(&a, as_v0_1_0);
    let plan = decided(&snapshot(a, Some(old)), &Progress::default());
    assert_eq!(doings(&plan), vec![RECORDING_INPUTS, "publish"]);
    let Step::Merge { patch, manager, .. } = &plan.steps[0] else {
        panic!("{plan:?}")
    };
    assert_eq!(*manager, INPUTS_MANAGER);
    assert_eq!(patch["metadata"]["uid"], "ws-uid");
    assert!(patch.get("spec").is_none(), "its spec stays: {patch}");
}

#[test]
fn a_spec_refused_for_itself_is_told_once_and_nothing_is_rendered() {
    let retained = apply(json!({"spec": {"retainWorkspaceOnDelete": true}}));
    let plan = decided(&snapshot(retained.clone(), None), &Progress::default());
    assert_eq!(
        doings(&plan),
        vec![
            format!("warn {}", crate::workspace_policy::NOT_ALLOWED),
            "publish".into()
        ]
    );
    let status = published_status(&plan);
    assert_eq!(condition(&status, APPLIED_CONDITION)["status"], "False");
    assert_eq!(
        plan.next,
        Next::AwaitChange,
        "looked at again when it changes"
    );
    // Already reported with the same message: no second Warning.
    let mut reported = serde_json::to_value(&retained).unwrap();
    reported["status"] = status.clone();
    let reported: WorkspaceTemplateApply = serde_json::from_value(reported).unwrap();
    let plan = decided(&snapshot(reported, None), &Progress::default());
    assert_eq!(doings(&plan), vec!["publish"]);
}

#[test]
fn a_template_of_a_namespace_not_trusted_is_refused() {
    let elsewhere = apply(json!({"spec": {"templateRef": {"name": "t", "namespace": "theirs"}}}));
    let plan = decided(&snapshot(elsewhere, None), &Progress::default());
    assert_eq!(doings(&plan).len(), 2, "{plan:?}");
    assert!(doings(&plan)[0].starts_with("warn "), "{plan:?}");
    assert!(!doings(&plan).contains(&APPLYING_WORKSPACE.to_owned()));
}

#[test]
fn another_applys_workspace_under_its_name_is_neither_applied_to_nor_named_as_its() {
    let plan = decided(
        &snapshot(apply(json!({})), Some(anothers_workspace())),
        &Progress::default(),
    );
    assert_eq!(
        doings(&plan),
        vec![
            format!("warn {WORKSPACE_OWNED_BY_ANOTHER}"),
            "publish".into()
        ]
    );
    assert_eq!(published_status(&plan)["workspaceName"], Value::Null);
    assert_eq!(
        plan.next,
        Next::After(Duration::from_secs(5)),
        "looked at again for it to go"
    );
}

#[test]
fn the_secrets_it_waits_for_are_checked_as_one_step_then_the_first_missing_is_told() {
    let waits = json!({"spec": {"waitForSecrets": [
        {"name": "s1", "namespace": "team"}, {"name": "s2", "namespace": "team"}]}});
    let seen = snapshot(apply(waits), None);
    let plan = decided(&seen, &Progress::default());
    let wanted = vec![
        ("team".to_owned(), "s1".to_owned()),
        ("team".to_owned(), "s2".to_owned()),
    ];
    assert_eq!(
        plan.steps,
        vec![Step::CheckSecrets {
            secrets: wanted,
            doing: CHECKING_SECRETS
        }],
        "one step, in the apply's order, nothing rendered before its answer"
    );
    assert_eq!(plan.next, Next::Redecide);
    let mut missing = Progress::default();
    missing.was_checked(CHECKING_SECRETS, Some(("team".into(), "s2".into())));
    let plan = decided(&seen, &missing);
    assert_eq!(doings(&plan), vec!["publish"], "nothing rendered");
    let applied = condition(&published_status(&plan), APPLIED_CONDITION);
    assert_eq!(applied["reason"], "WaitingForSecrets");
    assert_eq!(applied["message"], "Secret team/s2 does not exist yet");
    assert_eq!(
        plan.next,
        Next::After(Duration::from_secs(5)),
        "no watch wakes it"
    );
    let mut all_there = Progress::default();
    all_there.was_checked(CHECKING_SECRETS, None);
    let plan = decided(&seen, &all_there);
    assert_eq!(doings(&plan), vec![APPLYING_WORKSPACE, "publish"]);
}

#[test]
fn a_workspace_it_waits_for_not_ready_here_holds_the_rendering() {
    let mut seen = snapshot(
        apply(json!({"spec": {"waitForWorkspaces": [{"name": "vpc"}]}})),
        None,
    );
    seen.waited_workspaces = vec![("vpc".into(), false)];
    let plan = decided(&seen, &Progress::default());
    assert_eq!(doings(&plan), vec!["publish"]);
    let applied = condition(&published_status(&plan), APPLIED_CONDITION);
    assert_eq!(applied["reason"], "WaitingForWorkspaces");
    seen.waited_workspaces = vec![("vpc".into(), true)];
    let plan = decided(&seen, &Progress::default());
    assert_eq!(doings(&plan), vec![APPLYING_WORKSPACE, "publish"]);
}

#[test]
fn a_template_not_cached_is_told_and_looked_for_again() {
    let mut seen = snapshot(apply(json!({})), None);
    seen.template = None;
    let plan = decided(&seen, &Progress::default());
    assert_eq!(doings(&plan), vec!["publish"]);
    let applied = condition(&published_status(&plan), APPLIED_CONDITION);
    assert_eq!(applied["reason"], "TemplateNotFound");
    assert_eq!(plan.next, Next::After(Duration::from_secs(5)));
}

fn deleting() -> WorkspaceTemplateApply {
    apply(json!({"metadata": {"deletionTimestamp": "2026-12-07T11:59:00Z"}}))
}

#[test]
fn a_deletion_deletes_its_own_workspace_by_uid_and_waits_for_it() {
    let a = deleting();
    let ws = its_workspace(&a, |_| {});
    let plan = decided(&snapshot(a.clone(), Some(ws)), &Progress::default());
    assert_eq!(
        steps(&plan),
        vec![(DELETING_WORKSPACE.to_owned(), ws_name())]
    );
    let Step::Delete { object, .. } = &plan.steps[0] else {
        panic!()
    };
    assert_eq!(
        object.uid.as_deref(),
        Some("ws-uid"),
        "only the Workspace observed"
    );
    assert_eq!(plan.next, Next::After(Duration::from_secs(5)));
    let going = its_workspace(&a, |ws| {
        ws["metadata"]["deletionTimestamp"] = json!("2026-12-07T11:59:30Z");
    });
    let plan = decided(&snapshot(a, Some(going)), &Progress::default());
    assert_eq!(plan.steps, vec![], "deleted once, then waited for");
    assert_eq!(plan.next, Next::After(Duration::from_secs(5)));
}

#[test]
fn a_deletion_with_no_cached_workspace_looks_for_it_live_before_its_finalizer_goes() {
    let a = deleting();
    let seen = snapshot(a.clone(), None);
    let plan = decided(&seen, &Progress::default());
    assert_eq!(
        steps(&plan),
        vec![(LOOKING_FOR_WORKSPACE.to_owned(), ws_name())]
    );
    assert_eq!(plan.next, Next::Redecide);
    // There is one, ours, not cached yet: waited for.
    let mut found = Progress::default();
    let live = serde_json::to_value(its_workspace(&a, |_| {})).unwrap();
    found.was_read(
        LOOKING_FOR_WORKSPACE,
        ws_name(),
        Some(serde_json::from_value(live).unwrap()),
    );
    let plan = decided(&seen, &found);
    assert_eq!(plan.steps, vec![]);
    assert_eq!(plan.next, Next::After(Duration::from_secs(5)));
    // There is none: our finalizer comes off, and what was kept of it is forgotten.
    let mut none = Progress::default();
    none.was_read(LOOKING_FOR_WORKSPACE, ws_name(), None);
    let plan = decided(&seen, &none);
    assert_eq!(
        doings(&plan),
        vec!["remove finalizer".to_owned(), "deleted".into()]
    );
    let Step::Deleted { started, .. } = &plan.steps[1] else {
        panic!()
    };
    assert!(started.is_some(), "its deletion's time is measured");
}

#[test]
fn a_deletion_never_deletes_anothers_workspace_and_says_so() {
    let plan = decided(
        &snapshot(deleting(), Some(anothers_workspace())),
        &Progress::default(),
    );
    assert_eq!(
        doings(&plan),
        vec![
            format!("warn {WORKSPACE_OWNED_BY_ANOTHER}"),
            "remove finalizer".into(),
            "deleted".into()
        ]
    );
}

#[test]
fn a_deletion_without_our_finalizer_is_not_ours() {
    let theirs = apply(
        json!({"metadata": {"deletionTimestamp": "2026-12-07T11:59:00Z",
        "finalizers": ["someone-else"]}}),
    );
    let plan = decided(&snapshot(theirs, None), &Progress::default());
    assert_eq!(plan, Plan::nothing());
}

/// The longest reconcile (a new apply waiting for a Secret that exists), carried out against
/// canned answers: it settles well within the executor's rounds, each write once.
#[test]
fn the_longest_reconcile_settles_with_each_write_once() {
    let new = apply(json!({"metadata": {"finalizers": null},
        "spec": {"waitForSecrets": [{"name": "s1", "namespace": "team"}]}}));
    let seen = snapshot(new, None);
    let mut progress = Progress::default();
    let mut carried = Vec::new();
    for round in 1..=super::super::super::act::MOST_ROUNDS {
        let plan = decided(&seen, &progress);
        for step in &plan.steps {
            match step {
                Step::Apply { doing, body, .. } => {
                    // What the API server answers: the object with the applied fields.
                    let mut answer = match *doing {
                        ADDING_FINALIZER => serde_json::to_value(seen.apply.as_ref()).unwrap(),
                        _ => json!({}),
                    };
                    merge(&mut answer, body.clone());
                    progress.answered(doing, serde_json::from_value(answer).unwrap())
                }
                Step::CheckSecrets { doing, .. } => progress.was_checked(doing, None),
                _ => {}
            }
        }
        carried.extend(doings(&plan));
        if plan.next != Next::Redecide {
            assert_eq!(round, 3, "{carried:?}");
            break;
        }
    }
    assert_eq!(
        carried,
        vec![
            ADDING_FINALIZER,
            CHECKING_SECRETS,
            APPLYING_WORKSPACE,
            "publish"
        ]
    );
}
