//! Tenancy, against the real API server with the controller, the status-applier and the fake
//! Terraform provider as processes (`capt_tests::system::System`):
//!
//! - two applies whose `<namespace>-<name>` read the same get two Workspaces, and deleting one
//!   apply leaves the other's Workspace;
//! - references to another namespace are refused with a condition and nothing is rendered;
//!   `--allow-template-namespace` lets templates (never Secrets) come from a shared namespace;
//! - another's Workspace under an apply's name is left untouched (not applied to, not deleted)
//!   and reported (condition and Warning Event);
//! - a Workspace under the legacy name with the apply's labels is kept (it gains the uid
//!   label), not duplicated, and its spec does not change.
//!
//! The tests take turns (a mutex): each runs its own processes.

use anyhow::{Context as _, Result};
use capt_controller::api::{TerraformWorkspace, WorkspaceTemplate, WorkspaceTemplateApply};
use capt_controller::render::{
    APPLY_NAME_LABEL, APPLY_NAMESPACE_LABEL, APPLY_UID_LABEL, legacy_workspace_name,
    render_workspace, workspace_name,
};
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

const WAIT: Duration = Duration::from_secs(30);

/// A WorkspaceTemplate `name` in `ns` whose module names its Workspace (`${WORKSPACE_NAME}`),
/// so that rendering under another name would change the spec.
fn template(ns: &str, name: &str) -> WorkspaceTemplate {
    serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"template": {"metadata": {"annotations": {"fake.tf.upbound.io/outputs": "{\"id\": \"${ID}\"}"}},
                 "spec": {"forProvider": {"source": "Inline",
                          "module": "# workspace ${WORKSPACE_NAME}\nvariable \"id\" {}\noutput \"id\" { value = var.id }",
                          "vars": [{"key": "id", "value": "id ${ID}"}]}}}},
    }))
    .expect("a valid WorkspaceTemplate")
}

/// An apply `name` in `ns` of template `template` (in `template_ns`, if given).
fn apply(ns: &str, name: &str, template_ref: Value, extra: Value) -> WorkspaceTemplateApply {
    let mut spec = json!({"templateRef": template_ref, "variables": {"ID": name}});
    if let (Value::Object(spec), Value::Object(extra)) = (&mut spec, extra) {
        spec.extend(extra);
    }
    serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": name, "namespace": ns}, "spec": spec,
    }))
    .expect("a valid WorkspaceTemplateApply")
}

async fn create<K>(obj: &K) -> Result<K>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(
        env().client().await?,
        &obj.namespace().context("namespaced")?,
    );
    Ok(api.create(&PostParams::default(), obj).await?)
}

/// A Workspace's `spec.forProvider.module`.
/// The value the Workspace passes to the module's variable `id`.
fn id_value(w: &TerraformWorkspace) -> String {
    w.spec_value()["forProvider"]["vars"][0]["value"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn workspaces() -> Result<Api<TerraformWorkspace>> {
    Ok(Api::all(env().client().await?))
}

async fn get_apply(ns: &str, name: &str) -> Result<Option<WorkspaceTemplateApply>> {
    let api: Api<WorkspaceTemplateApply> = Api::namespaced(env().client().await?, ns);
    Ok(api.get_opt(name).await?)
}

/// The apply's condition of type `type_`, as JSON (`Null` when absent).
async fn condition(ns: &str, name: &str, type_: &str) -> Result<Value> {
    let apply = get_apply(ns, name).await?.context("the apply exists")?;
    let status = serde_json::to_value(&apply.status)?;
    Ok(status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .cloned()
        .unwrap_or(Value::Null))
}

/// The status of CAPT object `kind`/`name` in `ns`, its condition of type `type_`.
fn object_condition(system: &System, kind: &str, name: &str, type_: &str) -> Result<Value> {
    let obj = system.get(&[kind, name])?.unwrap_or(Value::Null);
    Ok(obj["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .cloned()
        .unwrap_or(Value::Null))
}

/// A namespace of exactly `name`, deleted on drop.
async fn namespace_named(name: &str) -> Result<TestNamespace> {
    env().kubectl_ok(&["create", "namespace", name], None)?;
    Ok(TestNamespace {
        name: name.to_owned(),
    })
}

#[tokio::test]
async fn applies_whose_legacy_names_collide_get_two_workspaces_and_delete_only_their_own()
-> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    // `team` with apply `a-vpc`, and `team-a` with apply `vpc`: both `team-a-vpc` by the
    // legacy rule.
    let team = TestNamespace::create(&client, "team").await?;
    let team_a = namespace_named(&format!("{}-a", team.name)).await?;
    assert_eq!(
        legacy_workspace_name(&team.name, "a-vpc"),
        legacy_workspace_name(&team_a.name, "vpc")
    );
    // One controller per namespace, as System runs them; both render cluster-scoped Workspaces.
    let system = System::start(&team.name, 50).await?;
    let system_a = System::start(&team_a.name, 50).await?;
    for (ns, name) in [(&team.name, "a-vpc"), (&team_a.name, "vpc")] {
        create(&template(ns, "t")).await?;
        create(&apply(ns, name, json!({"name": "t"}), json!({}))).await?;
    }
    let (one, other) = (
        workspace_name(&team.name, "a-vpc"),
        workspace_name(&team_a.name, "vpc"),
    );
    assert_ne!(one, other);
    let api = workspaces().await?;
    for (sys, ns, name, ws) in [
        (&system, &team.name, "a-vpc", &one),
        (&system_a, &team_a.name, "vpc", &other),
    ] {
        sys.wait_for(&format!("Workspace {ws}"), WAIT, || async {
            let applied = get_apply(ns, name)
                .await?
                .and_then(|a| a.status)
                .and_then(|s| s.workspace_name);
            Ok(api.get_opt(ws).await?.is_some() && applied.as_deref() == Some(ws))
        })
        .await?;
        let w = api.get(ws).await?;
        let uid = get_apply(ns, name).await?.context("apply")?.uid();
        assert_eq!(w.labels().get(APPLY_NAMESPACE_LABEL), Some(ns));
        assert_eq!(
            w.labels().get(APPLY_NAME_LABEL).map(String::as_str),
            Some(name)
        );
        assert_eq!(w.labels().get(APPLY_UID_LABEL), uid.as_ref());
        assert_eq!(id_value(&w), format!("id {name}"));
    }
    let legacy = legacy_workspace_name(&team.name, "a-vpc");
    assert!(
        api.get_opt(&legacy).await?.is_none(),
        "nothing under the shared legacy name {legacy}"
    );

    // Deleting `team-a`/`vpc` deletes its Workspace only.
    let applies_a: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), &team_a.name);
    applies_a.delete("vpc", &DeleteParams::default()).await?;
    system_a
        .wait_for("the apply and its Workspace gone", WAIT, || async {
            Ok(api.get_opt(&other).await?.is_none() && applies_a.get_opt("vpc").await?.is_none())
        })
        .await?;
    let kept = api.get(&one).await?;
    assert!(kept.meta().deletion_timestamp.is_none(), "{one} is kept");
    let still = get_apply(&team.name, "a-vpc").await?.context("apply")?;
    assert_eq!(
        still.status.and_then(|s| s.workspace_name).as_deref(),
        Some(one.as_str())
    );
    // Clean up (the namespace's deletion would not delete a cluster-scoped Workspace).
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), &team.name);
    applies.delete("a-vpc", &DeleteParams::default()).await?;
    system
        .wait_for("the other Workspace gone", WAIT, || async {
            Ok(api.get_opt(&one).await?.is_none())
        })
        .await?;
    Ok(())
}

/// Points the refused reference of each case (`(apply, templateRef, extra spec, refused
/// field)`) and the CAPTCluster `demo`'s VPC template at namespace `to`.
async fn point_refused_references(
    applies: &Api<WorkspaceTemplateApply>,
    ns: &str,
    cases: &[(&str, Value, Value, &str)],
    to: &str,
) -> Result<()> {
    for (name, template_ref, extra, field) in cases {
        let mut spec = apply(ns, name, template_ref.clone(), extra.clone()).spec;
        match *field {
            "spec.templateRef" => spec.template_ref.namespace = Some(to.to_owned()),
            "spec.writeConnectionSecretToRef" => {
                spec.write_connection_secret_to_ref
                    .as_mut()
                    .context("a Secret reference")?
                    .namespace = to.to_owned();
            }
            _ => {
                spec.wait_for_secrets
                    .as_mut()
                    .context("Secret references")?[0]
                    .namespace = to.to_owned();
            }
        }
        applies
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": spec })),
            )
            .await?;
    }
    env().kubectl_ok(
        &[
            "patch",
            "-n",
            ns,
            "captcluster",
            "demo",
            "--type",
            "merge",
            "-p",
            &json!({"spec": {"vpcTemplateRef": {"namespace": to}}}).to_string(),
        ],
        None,
    )?;
    Ok(())
}

#[tokio::test]
async fn references_to_another_namespace_are_refused_unless_a_template_namespace_is_allowed()
-> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "tenant").await?;
    let shared = TestNamespace::create(&client, "shared").await?;
    create(&template(&shared.name, "t")).await?;
    create(&template(&ns.name, "t")).await?;
    let system = System::start(&ns.name, 50).await?;
    let cases = create_references_to(&ns.name, &shared.name).await?;
    assert_references_refused(&system, &ns.name, &shared.name, &cases).await?;
    assert_refused_again_and_nothing_rendered(&system, &client, &ns.name, &shared.name, &cases)
        .await?;
    drop(system);
    assert_an_allowed_template_namespace_resolves(&client, &ns.name, &shared.name).await
}

/// An apply whose references name another namespace: its name, its `templateRef`, the rest
/// of its spec, and the field refused.
type Crossing = (&'static str, Value, Value, &'static str);

/// Creates in `ns` applies whose Secret, awaited Secret, template or both name `shared`, and
/// a CAPTCluster (with its Cluster) whose VPC template is in `shared`. Returns the applies.
async fn create_references_to(ns: &str, shared: &str) -> Result<[Crossing; 4]> {
    let secret_elsewhere =
        json!({"writeConnectionSecretToRef": {"name": "s", "namespace": shared}});
    let cases = [
        (
            "secret",
            json!({"name": "t"}),
            secret_elsewhere.clone(),
            "spec.writeConnectionSecretToRef",
        ),
        (
            "wait",
            json!({"name": "t"}),
            json!({"waitForSecrets": [{"name": "s", "namespace": shared}]}),
            "spec.waitForSecrets[0]",
        ),
        (
            "template",
            json!({"name": "t", "namespace": shared}),
            json!({}),
            "spec.templateRef",
        ),
        // Secrets never cross, even with a template whose namespace will be allowed (the
        // template is named first until then).
        (
            "template-secret",
            json!({"name": "t", "namespace": shared}),
            secret_elsewhere,
            "spec.templateRef",
        ),
    ];
    for (name, template_ref, extra, _) in &cases {
        create(&apply(ns, name, template_ref.clone(), extra.clone())).await?;
    }
    // A CAPTCluster whose VPC template is in another namespace: no apply is created for it.
    let cluster = json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
        "metadata": {"name": "demo", "namespace": ns, "labels": {"cluster.x-k8s.io/cluster-name": "demo"}},
        "spec": {"region": "ap-northeast-1", "vpcTemplateRef": {"name": "t", "namespace": shared}}});
    let capi = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "demo", "namespace": ns},
        "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                 "kind": "CAPTCluster", "name": "demo"}}});
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&format!("{capi}\n---\n{cluster}")),
    )?;
    Ok(cases)
}

/// Each apply is refused (`ReferencesResolved=False` and `Applied` say
/// `CrossNamespaceReference`, naming the field and the namespace), and so is the CAPTCluster.
async fn assert_references_refused(
    system: &System,
    ns: &str,
    shared: &str,
    cases: &[Crossing],
) -> Result<()> {
    for (name, _, _, field) in cases {
        system
            .wait_for(
                &format!("{name}: ReferencesResolved=False"),
                WAIT,
                || async {
                    Ok(condition(ns, name, "ReferencesResolved").await?["reason"]
                        == "CrossNamespaceReference")
                },
            )
            .await?;
        let c = condition(ns, name, "ReferencesResolved").await?;
        let message = c["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!("{field} names namespace {shared}")),
            "{name}: {message}"
        );
        assert_eq!(c["status"], "False");
        assert_eq!(
            condition(ns, name, "Applied").await?["reason"],
            "CrossNamespaceReference"
        );
    }
    system
        .wait_for(
            "the CAPTCluster's ReferencesResolved=False",
            WAIT,
            || async {
                let c = object_condition(system, "captcluster", "demo", "ReferencesResolved")?;
                Ok(c["reason"] == "CrossNamespaceReference"
                    && c["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with("spec.vpcTemplateRef names namespace")))
            },
        )
        .await?;
    Ok(())
}

/// A reconcile after the refusal must not render either. Each object is woken on purpose:
/// its refused reference pointed at yet another namespace, and the refusal that names it
/// awaited (that reconcile has made its decision); then nothing is rendered, no apply is
/// created for the CAPTCluster, and the references point at `shared` again.
async fn assert_refused_again_and_nothing_rendered(
    system: &System,
    client: &kube::Client,
    ns: &str,
    shared: &str,
    cases: &[Crossing],
) -> Result<()> {
    let api = workspaces().await?;
    let moved = format!("{shared}-moved");
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), ns);
    point_refused_references(&applies, ns, cases, &moved).await?;
    for (name, _, _, field) in cases {
        let refused = format!("{field} names namespace {moved}");
        system
            .wait_for(
                &format!("{name}: refused again, for {moved}"),
                WAIT,
                || async {
                    let c = condition(ns, name, "ReferencesResolved").await?;
                    Ok(c["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with(&refused)))
                },
            )
            .await?;
    }
    let refused = format!("spec.vpcTemplateRef names namespace {moved}");
    system
        .wait_for("the CAPTCluster refused again", WAIT, || async {
            let c = object_condition(system, "captcluster", "demo", "ReferencesResolved")?;
            Ok(c["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(&refused)))
        })
        .await?;
    for (name, ..) in cases {
        for ws in [workspace_name(ns, name), legacy_workspace_name(ns, name)] {
            assert!(
                api.get_opt(&ws).await?.is_none(),
                "{name}: nothing rendered"
            );
        }
    }
    assert!(
        get_apply(ns, "demo-vpc").await?.is_none(),
        "no apply for the CAPTCluster"
    );
    point_refused_references(&applies, ns, cases, shared).await?;
    Ok(())
}

/// The operator shares the template namespace: templates resolve there, Secrets still not.
async fn assert_an_allowed_template_namespace_resolves(
    client: &kube::Client,
    ns: &str,
    shared: &str,
) -> Result<()> {
    let api = workspaces().await?;
    let system = System::start_with(ns, 50, &["--allow-template-namespace", shared]).await?;
    let ws = workspace_name(ns, "template");
    system
        .wait_for("the shared template rendered", WAIT, || async {
            Ok(api.get_opt(&ws).await?.is_some()
                && condition(ns, "template", "ReferencesResolved")
                    .await?
                    .is_null())
        })
        .await?;
    assert_eq!(id_value(&api.get(&ws).await?), "id template");
    // Still refused: the Secret of another namespace, with or without an allowed template.
    for name in ["secret", "wait", "template-secret"] {
        system
            .wait_for(&format!("{name}: refused for its Secret"), WAIT, || async {
                let c = condition(ns, name, "ReferencesResolved").await?;
                Ok(c["reason"] == "CrossNamespaceReference"
                    && c["message"].as_str().is_some_and(|m| {
                        m.starts_with("spec.writeConnectionSecretToRef")
                            || m.starts_with("spec.waitForSecrets[0]")
                    }))
            })
            .await?;
    }
    for name in ["secret", "wait", "template-secret"] {
        assert!(
            api.get_opt(&workspace_name(ns, name)).await?.is_none(),
            "{name}: still nothing rendered"
        );
    }
    // Clean up what the allowed template rendered (the namespace's deletion would not).
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), ns);
    applies.delete("template", &DeleteParams::default()).await?;
    system
        .wait_for("the shared-template Workspace gone", WAIT, || async {
            Ok(api.get_opt(&ws).await?.is_none())
        })
        .await?;
    Ok(())
}

#[tokio::test]
async fn another_owners_workspace_under_our_name_is_left_untouched_and_reported() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "taken").await?;
    let api = workspaces().await?;
    let name = workspace_name(&ns.name, "taken");
    // Someone else's Workspace under the name our apply will use. Its labels name another
    // apply, so the fake provider (which serves this namespace's Workspaces) ignores it too.
    let foreign: TerraformWorkspace = serde_json::from_value(json!({
        "apiVersion": "tf.upbound.io/v1beta1", "kind": "Workspace",
        "metadata": {"name": name, "labels": {
            APPLY_NAMESPACE_LABEL: "someone", APPLY_NAME_LABEL: "else", APPLY_UID_LABEL: "0000-other"}},
        "spec": {"forProvider": {"source": "Inline", "module": "# someone else's"}},
    }))?;
    let before = api
        .patch(
            &name,
            &PatchParams::apply("someone-else"),
            &Patch::Apply(&foreign),
        )
        .await?;
    let system = System::start(&ns.name, 50).await?;
    create(&template(&ns.name, "t")).await?;
    create(&apply(&ns.name, "taken", json!({"name": "t"}), json!({}))).await?;
    system
        .wait_for("WorkspaceOwned=False", WAIT, || async {
            Ok(
                condition(&ns.name, "taken", "WorkspaceOwned").await?["reason"]
                    == "WorkspaceOwnedByAnother",
            )
        })
        .await?;
    let c = condition(&ns.name, "taken", "WorkspaceOwned").await?;
    let message = c["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("Workspace {name} belongs to another")),
        "{message}"
    );
    assert!(
        message.contains(&format!("{APPLY_NAMESPACE_LABEL}=someone"))
            && message.contains(&format!("{APPLY_NAME_LABEL}=else")),
        "{message}"
    );
    let status = get_apply(&ns.name, "taken").await?.and_then(|a| a.status);
    let status = status.context("status")?;
    assert_eq!(
        status.workspace_name, None,
        "another's Workspace is not named as ours"
    );
    assert_eq!(status.applied, Some(false));
    // The Event.
    let warning = || -> Result<Option<Value>> {
        let events = env().kubectl_ok(
            &["get", "events.events.k8s.io", "-n", &ns.name, "-o", "json"],
            None,
        )?;
        let events: Value = serde_json::from_str(&events)?;
        Ok(events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| {
                e["regarding"]["kind"] == "WorkspaceTemplateApply"
                    && e["regarding"]["name"] == "taken"
                    && e["reason"] == "WorkspaceOwnedByAnother"
                    && e["type"] == "Warning"
                    && e["reportingController"] == "capt-controller"
            })
            .cloned())
    };
    system
        .wait_for("the Warning Event", WAIT, || async {
            Ok(warning()?.is_some())
        })
        .await?;
    let note = warning()?.context("event")?["note"].clone();
    assert!(note.as_str().unwrap_or_default().contains(&name), "{note}");
    // Untouched: same resourceVersion (nothing written at all), spec and labels.
    let after = api.get(&name).await?;
    assert_eq!(after.resource_version(), before.resource_version());
    assert_eq!(after.spec, before.spec);
    assert_eq!(after.labels(), before.labels());

    // Deleting the apply leaves it too.
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), &ns.name);
    applies.delete("taken", &DeleteParams::default()).await?;
    system
        .wait_for("the apply gone", WAIT, || async {
            Ok(applies.get_opt("taken").await?.is_none())
        })
        .await?;
    let after = api.get(&name).await?;
    assert!(after.meta().deletion_timestamp.is_none(), "not deleted");
    assert_eq!(after.resource_version(), before.resource_version());
    drop(system);
    api.delete(&name, &DeleteParams::default()).await?;
    Ok(())
}

#[tokio::test]
async fn a_legacy_named_workspace_of_the_apply_is_kept_not_duplicated() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "legacy").await?;
    let api = workspaces().await?;
    let legacy = legacy_workspace_name(&ns.name, "old");
    let current = workspace_name(&ns.name, "old");
    assert_ne!(legacy, current);
    // What the controller rendered before names carried a hash, under the legacy name and
    // its field manager, without the uid label.
    let t = template(&ns.name, "t");
    let a = apply(&ns.name, "old", json!({"name": "t"}), json!({}));
    let old = render_workspace(&a, &t, &legacy)?;
    assert!(old["metadata"]["labels"].get(APPLY_UID_LABEL).is_none());
    assert!(
        old["spec"]["forProvider"]["module"]
            .as_str()
            .is_some_and(|m| m.contains(&legacy)),
        "the spec names the Workspace"
    );
    api.patch(
        &legacy,
        &PatchParams::apply("capt-controller").force(),
        &Patch::Apply(&old),
    )
    .await?;
    let system = System::start(&ns.name, 50).await?;
    // The provider applies it (as Terraform ran for it before the upgrade).
    system
        .wait_for("the legacy Workspace Ready", WAIT, || async {
            let ws = api.get(&legacy).await?;
            let status = ws.status_value();
            Ok(status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True"))
        })
        .await?;
    let before = api.get(&legacy).await?;
    create(&t).await?;
    let created = create(&a).await?;
    let uid = created.uid().context("uid")?;
    system
        .wait_for("the uid label on the legacy Workspace", WAIT, || async {
            let ws = api.get(&legacy).await?;
            let applied = get_apply(&ns.name, "old")
                .await?
                .and_then(|a| a.status)
                .and_then(|s| s.workspace_name);
            Ok(ws.labels().get(APPLY_UID_LABEL) == Some(&uid)
                && applied.as_deref() == Some(legacy.as_str()))
        })
        .await?;
    // A reconcile after the adoption must decide the same: no second Workspace, no
    // re-rendered spec. Wake the apply on purpose (a label) and wait for a reconcile of it
    // to finish.
    let reconciles = || async {
        system
            .controller_metric(
                "capt_reconciles_total",
                &["kind=\"WorkspaceTemplateApply\""],
            )
            .await
    };
    let finished = reconciles().await?;
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(env().client().await?, &ns.name);
    applies
        .patch(
            "old",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"test/poke": "1"}}})),
        )
        .await?;
    system
        .wait_for("a reconcile of the apply after the poke", WAIT, || async {
            Ok(reconciles().await? > finished)
        })
        .await?;
    assert!(
        api.get_opt(&current).await?.is_none(),
        "no second Workspace {current}"
    );
    let selector = format!("{APPLY_NAMESPACE_LABEL}={},{APPLY_NAME_LABEL}=old", ns.name);
    let ours = api.list(&ListParams::default().labels(&selector)).await?;
    assert_eq!(ours.items.len(), 1, "one Workspace for the apply");
    let after = api.get(&legacy).await?;
    assert_eq!(
        after.spec, before.spec,
        "the spec Terraform applied is kept"
    );
    assert_eq!(
        after.meta().generation,
        before.meta().generation,
        "no new generation: nothing for Terraform to run again"
    );
    let mut labels = before.labels().clone();
    labels.insert(APPLY_UID_LABEL.into(), uid);
    assert_eq!(after.labels(), &labels, "only the uid label was added");
    // Deleting the apply deletes the legacy Workspace it uses.
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), &ns.name);
    applies.delete("old", &DeleteParams::default()).await?;
    system
        .wait_for("the apply and its legacy Workspace gone", WAIT, || async {
            Ok(api.get_opt(&legacy).await?.is_none() && applies.get_opt("old").await?.is_none())
        })
        .await?;
    Ok(())
}
