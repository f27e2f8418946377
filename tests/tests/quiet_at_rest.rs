//! At rest the system writes nothing: every kind it reconciles, standalone and
//! owned, is created beside the running system (a WorkspaceTemplateApply of its own, with
//! and without a `providerConfigRef` in its template; the samples' provisioned stack; a
//! stack whose Cluster is paused; a stack whose control plane fails), and once each has
//! reached the state it rests in, 30 s of the API server's audit log must hold no write by
//! any `capt-*` field manager, and the controller's write-loop guard must have reported
//! nothing (`capt_write_loops_total`, `WriteLoop` Events). The window is the claim itself:
//! "nothing happens" is only ever checked over a span of time. Settling is awaited on what
//! the objects show, never slept for.

use anyhow::{Context, Result};
use capt_controller::render::workspace_name;
use capt_tests::audit_log::AuditLog;
use capt_tests::system::System;
use capt_tests::{TestNamespace, env, repo_root, yaml_documents};
use serde_json::{Value, json};
use std::time::Duration;

/// How long to count writes once everything rests.
const AT_REST: Duration = Duration::from_secs(30);
/// The failure the failing stack's control-plane template asks of the fake provider.
const FAILURE: &str = "Error: creating EKS Cluster: AccessDeniedException (quiet_at_rest)";

#[tokio::test]
async fn every_kind_standalone_and_owned_writes_nothing_at_rest() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "quiet").await?;
    let system = System::start(&ns.name, 50).await?;
    system.apply_samples(false).await?;
    let mut docs = stack("paused", "eks", true)?;
    docs.extend(stack("failing", "eks-failing", false)?);
    docs.extend(failing_template()?);
    docs.extend(standalone("alone", None));
    docs.extend(standalone(
        "alone-pcr",
        Some(json!({"providerConfigRef": {"name": "default"}})),
    ));
    apply(&ns.name, &docs)?;

    let settled = |what: &'static str, check: fn(&System) -> Result<bool>| {
        let system = &system;
        async move {
            system
                .wait_for(what, Duration::from_secs(90), || async { check(system) })
                .await
        }
    };
    settled("the samples' stack to rest", demo_rests).await?;
    settled("the paused stack to rest", paused_rests).await?;
    settled("the failing stack to rest", failing_rests).await?;
    settled("the standalone applies to rest", |s| {
        Ok(standalone_rests(s, "alone")? && standalone_rests(s, "alone-pcr")?)
    })
    .await?;

    let log = AuditLog::from_now()?;
    let started = std::time::Instant::now();
    tokio::time::sleep(AT_REST).await;
    let ours: Vec<String> = log
        .writes_in(&ns.name)?
        .into_iter()
        .filter(|w| w.manager.starts_with("capt-"))
        .map(|w| w.to_string())
        .collect();
    let seconds = started.elapsed().as_secs_f64();
    // The controller's own guard agrees: no write loop reported, as a metric or an Event.
    // (The metric has no sample until a first loop, and reads 0 then.)
    let loops = system
        .controller_metric("capt_write_loops_total", &[])
        .await?
        + 0.0;
    let events = write_loop_events(&ns.name)?;
    println!(
        "{} write(s) by capt-* managers in {seconds:.1} s at rest; capt_write_loops_total {loops}; \
         {} WriteLoop Event(s)",
        ours.len(),
        events.len()
    );
    assert!(
        ours.is_empty(),
        "{} write(s) by capt-* managers in {seconds:.1} s at rest (API server audit log); \
         capt_write_loops_total {loops}; WriteLoop Events:\n{}\nby kind:\n{}",
        ours.len(),
        events.join("\n"),
        tally(&ours)
    );
    assert_eq!(loops, 0.0, "no write loop reported: {events:?}");
    assert!(events.is_empty(), "no WriteLoop Event: {events:?}");
    Ok(())
}

/// The WriteLoop Events of namespace `ns`: what each regards, and its note.
fn write_loop_events(ns: &str) -> Result<Vec<String>> {
    let out = env().kubectl_ok(
        &[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            "reason=WriteLoop",
            "-o",
            "json",
        ],
        None,
    )?;
    let list: Value = serde_json::from_str(&out)?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let o = &e["involvedObject"];
            format!("{}/{}: {}", o["kind"], o["name"], e["message"])
        })
        .collect())
}

/// The writes, counted by what they were (verb, object, manager), most first.
fn tally(writes: &[String]) -> String {
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for w in writes {
        *counts.entry(w).or_default() += 1;
    }
    let mut lines: Vec<(usize, &str)> = counts.into_iter().map(|(w, n)| (n, w)).collect();
    lines.sort_by(|a, b| b.cmp(a));
    lines
        .iter()
        .map(|(n, w)| format!("{n:6} {w}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `kubectl apply --server-side` of `docs` into `ns`.
fn apply(ns: &str, docs: &[Value]) -> Result<()> {
    let text: Vec<String> = docs
        .iter()
        .filter(|d| d["kind"] != "Namespace")
        .map(|d| capt_tests::system::in_test_namespace(d.clone(), ns).to_string())
        .collect();
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&text.join("\n")),
    )?;
    Ok(())
}

/// The samples' Cluster, CAPTCluster and CAPTControlPlane renamed `name`, the control plane
/// rendered from the template `eks`, the Cluster paused when `paused`.
fn stack(name: &str, eks: &str, paused: bool) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(repo_root().join("manifests/samples/cluster.yaml"))?;
    let mut docs = yaml_documents(&text)?;
    for d in &mut docs {
        d["metadata"]["name"] = json!(name);
        match d["kind"].as_str() {
            Some("Cluster") => {
                d["spec"]["infrastructureRef"]["name"] = json!(name);
                d["spec"]["controlPlaneRef"]["name"] = json!(name);
                d["spec"]["paused"] = json!(paused);
            }
            Some("CAPTControlPlane") => {
                d["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = json!(name);
                d["spec"]["workspaceTemplateRef"]["name"] = json!(eks);
            }
            _ => d["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = json!(name),
        }
    }
    Ok(docs)
}

/// The samples' control-plane template as `eks-failing`: every apply of its Workspace fails.
fn failing_template() -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(repo_root().join("manifests/samples/templates.yaml"))?;
    let mut eks = yaml_documents(&text)?
        .into_iter()
        .find(|d| d["metadata"]["name"] == "eks")
        .context("the samples' eks template")?;
    eks["metadata"]["name"] = json!("eks-failing");
    eks["spec"]["template"]["metadata"]["annotations"]["fake.tf.upbound.io/fail"] = json!(FAILURE);
    Ok(vec![eks])
}

/// A WorkspaceTemplate and a WorkspaceTemplateApply of that name owned by no CAPT object,
/// as a user writes them: the template carries no metadata (so no annotations), its spec
/// `extra` besides the module.
fn standalone(name: &str, extra: Option<Value>) -> Vec<Value> {
    let mut spec = json!({"forProvider": {"source": "Inline",
        "module": "variable \"bucket\" {}\noutput \"bucket\" { value = var.bucket }",
        "vars": [{"key": "bucket", "value": "${BUCKET}"}]}});
    if let Some(Value::Object(extra)) = extra {
        spec.as_object_mut().unwrap().extend(extra);
    }
    vec![
        json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
            "metadata": {"name": name}, "spec": {"template": {"spec": spec}}}),
        json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
            "metadata": {"name": name},
            "spec": {"templateRef": {"name": name}, "variables": {"BUCKET": name}}}),
    ]
}

fn get(system: &System, kind: &str, name: &str) -> Result<Value> {
    Ok(system.get(&[kind, name])?.unwrap_or(Value::Null))
}

fn workspace(system: &System, apply: &str) -> Result<Value> {
    let name = workspace_name(system.namespace(), apply);
    let out = env().kubectl_run(&["get", "workspace", &name, "-o", "json"], None)?;
    Ok(serde_json::from_slice(&out.stdout).unwrap_or(Value::Null))
}

/// Provisioned, and each CAPT object mirrors what its Workspace finally reported; the
/// kubeconfig Secret written.
fn demo_rests(system: &System) -> Result<bool> {
    let (vpc, eks) = (
        workspace(system, "demo-vpc")?,
        workspace(system, "demo-controlplane")?,
    );
    let cc = get(system, "captcluster", "demo")?;
    let cp = get(system, "captcontrolplane", "demo")?;
    Ok(capt_tests::provider_rests(&vpc)
        && capt_tests::provider_rests(&eks)
        && get(system, "cluster", "demo")?["status"]["phase"] == "Provisioned"
        && cc["status"]["workspaceTemplateStatus"]["lastAppliedRevision"]
            == vpc["status"]["atProvider"]["checksum"]
        && cp["status"]["phase"] == "Ready"
        && cp["status"]["workspaceStatus"]["atProvider"] == eks["status"]["atProvider"]
        && system.get(&["secret", "demo-kubeconfig"])?.is_some())
}

/// Both CAPT objects say they are paused, and no Workspace was rendered for them.
fn paused_rests(system: &System) -> Result<bool> {
    let cc = get(system, "captcluster", "paused")?;
    let cp = get(system, "captcontrolplane", "paused")?;
    Ok(condition_or_null(&cc, "Paused")["status"] == "True"
        && condition_or_null(&cp, "Paused")["status"] == "True"
        && workspace(system, "paused-vpc")?.is_null())
}

/// The VPC is ready and the control plane failed with the provider's message, mirroring
/// the Workspace's last report.
fn failing_rests(system: &System) -> Result<bool> {
    let vpc = workspace(system, "failing-vpc")?;
    let eks = workspace(system, "failing-controlplane")?;
    let cc = get(system, "captcluster", "failing")?;
    let cp = get(system, "captcontrolplane", "failing")?;
    let failed = condition_or_null(&cp, "Failed");
    Ok(capt_tests::provider_rests(&vpc)
        && cc["status"]["workspaceTemplateStatus"]["lastAppliedRevision"]
            == vpc["status"]["atProvider"]["checksum"]
        && cp["status"]["phase"] == "Failed"
        && failed["status"] == "True"
        && failed["message"]
            .as_str()
            .is_some_and(|m| m.contains(FAILURE))
        && !eks["status"].is_null()
        && cp["status"]["workspaceStatus"]["atProvider"] == eks["status"]["atProvider"])
}

/// The apply's Workspace is ready and at rest, and the apply mirrors its conditions.
fn standalone_rests(system: &System, name: &str) -> Result<bool> {
    let ws = workspace(system, name)?;
    let apply = get(system, "workspacetemplateapply", name)?;
    let mirrored = |type_: &str| {
        let (ours, theirs) = (
            condition_or_null(&apply, type_),
            condition_or_null(&ws, type_),
        );
        !theirs.is_null()
            && ours["status"] == theirs["status"]
            && ours["lastTransitionTime"] == theirs["lastTransitionTime"]
    };
    Ok(capt_tests::provider_rests(&ws)
        && condition_or_null(&ws, "Ready")["status"] == "True"
        && apply["status"]["applied"] == true
        && mirrored("Ready")
        && mirrored("Synced"))
}

/// The condition of `type_`, or `null` when there is none.
fn condition_or_null<'a>(obj: &'a Value, type_: &str) -> &'a Value {
    capt_tests::condition(obj, type_).unwrap_or(&Value::Null)
}
