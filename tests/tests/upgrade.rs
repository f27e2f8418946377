//! An upgrade in place from the previous release (CHANGELOG.md's first released heading,
//! built by `hack/previous-release.sh`, cached by commit) to this build, as `clusterctl
//! upgrade` does it: the previous release's CRDs and both its processes (controller,
//! status-applier) run beside Cluster API core and the fake provider (the repository's
//! stand-in for provider-terraform: what is asserted is what CAPT writes, and the real
//! provider's minutes per stack would buy nothing here) with several stacks: one whose VPC
//! reports failure domains, one paused, one mid-provisioning (its control plane's apply held
//! open), one halfway (its VPC's apply held open, its control plane without an apply yet), a
//! standalone apply, and a Workspace an operator set to `deletionPolicy: Orphan`.
//! Then the new CRDs are applied server-side and both processes replaced, and:
//!
//! - no Workspace is created, deleted or changed in spec (same uid, same generation), and
//!   none is written by the controller's rendering manager (CHANGELOG.md names no change that
//!   costs a Terraform run);
//! - every object reads with this build's types; the CAPT objects' and applies' statuses and
//!   the Clusters' `Available` are what they were;
//! - the new status-applier counts 0 conflicts; once settled, 30 s of the audit log hold no
//!   write by a `capt-*` manager; the ownership audit is clean;
//! - the operator's `Orphan` is kept, also when the apply's next real change renders the
//!   Workspace anew (then, and only then, with this build's rendering);
//! - the stack held mid-provisioning completes once its apply is let through;
//! - the names Terraform got stay: every apply keeps the bare Cluster name it recorded, and
//!   the halfway stack's control plane, whose apply is created after the upgrade, gets the
//!   same bare name as its VPC; a stack with no apply yet (the paused one, unpaused) gets
//!   names that carry the namespace (`<namespace>_<name>`, `capt_controller::names`).
//!
//! Templates live in a namespace of their own that the controller is told to trust
//! (`--allow-template-namespace`).

use anyhow::{Context, Result, bail, ensure};
use capt_controller::api::{
    CAPTCluster, CAPTControlPlane, WorkspaceTemplate, WorkspaceTemplateApply,
};
use capt_controller::reconcile::apply::INPUTS_MANAGER;
use capt_controller::render::{INPUTS_ANNOTATION, RENDERING, RENDERING_ANNOTATION, workspace_name};
use capt_tests::applier::{audit_clean, use_capt_binaries_from};
use capt_tests::audit_log::AuditLog;
use capt_tests::system::System;
use capt_tests::{TestNamespace, env, repo_root, yaml_documents};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long to count writes once the upgraded system rests.
const AT_REST: Duration = Duration::from_secs(30);
/// How long each stack may take to reach the state it rests in.
const SETTLE: Duration = Duration::from_secs(120);

#[tokio::test]
async fn an_upgrade_in_place_from_the_previous_release_renders_nothing_again_and_keeps_everything()
-> Result<()> {
    let (commit, previous) = previous_release()?;
    println!("upgrading from {commit} ({})", previous.display());
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "upgrade").await?;
    let templates = TestNamespace::create(&client, "upgrade-templates").await?;
    let gate = capt_tests::Scratch::new("upgrade-gate")?;
    let gate_file = gate.join("open");

    // The previous release, as installed: its CRDs, its two processes.
    apply_crds(Some(&commit))?;
    use_capt_binaries_from(Some(previous));
    let started = System::start_with(
        &ns.name,
        50,
        &["--allow-template-namespace", &templates.name],
    )
    .await;
    use_capt_binaries_from(None);
    let mut system = started?;
    apply(
        &templates.name,
        &templates_docs(&gate_file.display().to_string())?,
    )?;
    let mut docs = stack("zones", "vpc", "eks", false, &templates.name)?;
    docs.extend(stack("paused", "vpc", "eks", true, &templates.name)?);
    docs.extend(standalone("alone", &templates.name));
    docs.extend(standalone("orphaned", &templates.name));
    apply(&ns.name, &docs)?;
    // The held stack last: the provider applies one Workspace at a time, as provider-terraform
    // does by default (`--max-reconcile-rate` 1), so a held apply holds every later one.
    let stages: [(&str, Check, Option<Stack>); 5] = [
        ("the stack with failure domains", zones_rests, None),
        ("the paused stack", paused_rests, None),
        ("the standalone applies", standalones_rest, None),
        (
            "the stack mid-provisioning",
            midway_rests,
            Some(("midway", "vpc", "eks-gated")),
        ),
        (
            "the stack halfway",
            halfway_rests,
            Some(("halfway", "vpc-gated", "eks")),
        ),
    ];
    for (what, check, create) in stages {
        if let Some((name, vpc, eks)) = create {
            apply(&ns.name, &stack(name, vpc, eks, false, &templates.name)?)?;
        }
        system
            .wait_for(
                &format!("{what} to rest under {commit}"),
                SETTLE,
                || async { check(&system) },
            )
            .await?;
    }

    // The upgrade: both processes stop (a rolling update), an operator keeps a Workspace
    // meanwhile, the new CRDs are applied server-side, the new processes start.
    let log = AuditLog::from_now()?;
    let orphaned = workspace_name(&ns.name, "orphaned");
    system.stop_processes()?;
    env().kubectl_ok(
        &[
            "patch",
            "workspace",
            &orphaned,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"deletionPolicy":"Orphan"}}"#,
        ],
        None,
    )?;
    let before = snapshot(&system)?;
    apply_crds(None)?;
    let upgraded = Instant::now();
    system.start_processes().await?;
    // Settled: each Workspace the previous release wrote was seen by its apply (which records
    // its inputs once), and everything rests as before.
    let stamped = |system: &System| -> Result<bool> {
        Ok(workspaces(system)?
            .values()
            .all(|w| w["metadata"]["annotations"][INPUTS_ANNOTATION].is_string()))
    };
    system
        .wait_for(
            "every Workspace to be seen by the new controller",
            SETTLE,
            || async {
                Ok(stamped(&system)? && zones_rests(&system)? && standalones_rest(&system)?)
            },
        )
        .await?;
    println!(
        "settled {:.1} s after the new processes started",
        upgraded.elapsed().as_secs_f64()
    );

    let at_rest = AuditLog::from_now()?;
    tokio::time::sleep(AT_REST).await;
    at_rest.caught_up(&client, &ns.name).await?;
    let after = snapshot(&system)?;

    // No Workspace created, deleted, or changed in spec.
    let (was, now) = (&before.workspaces, &after.workspaces);
    ensure!(
        was.keys().eq(now.keys()),
        "the Workspaces changed: before {:?}, after {:?}",
        was.keys().collect::<Vec<_>>(),
        now.keys().collect::<Vec<_>>()
    );
    for (name, old) in was {
        let new = &now[name];
        let same = |path: &str| old.pointer(path) == new.pointer(path);
        ensure!(
            same("/metadata/uid") && same("/metadata/generation") && same("/spec"),
            "Workspace {name} was changed by the upgrade (CHANGELOG.md names no change that \
             costs a Terraform run):\nbefore: generation {} spec {}\nafter:  generation {} spec {}",
            old["metadata"]["generation"],
            old["spec"],
            new["metadata"]["generation"],
            new["spec"]
        );
        ensure!(
            new["metadata"]["annotations"][RENDERING_ANNOTATION] == "1",
            "Workspace {name} keeps the previous release's rendering: {}",
            new["metadata"]["annotations"]
        );
    }
    let rendered: Vec<String> = log
        .writes_in(&ns.name)?
        .into_iter()
        .filter(|w| w.object.starts_with("workspaces ") && w.manager != INPUTS_MANAGER)
        .filter(|w| w.manager.starts_with("capt-"))
        .map(|w| w.to_string())
        .collect();
    ensure!(
        rendered.is_empty(),
        "Workspace writes by CAPT besides the inputs recorded: {rendered:#?}"
    );
    // Statuses, and the Clusters' Available, as they were.
    for (what, old) in &before.statuses {
        let new = &after.statuses[what];
        ensure!(
            old == new,
            "{what} changed with the upgrade:\nbefore {old}\nafter  {new}"
        );
    }
    // Every object reads with this build's types.
    read_all(&client, &ns.name, &templates.name).await?;
    // No conflict, no write at rest, no leftover owner.
    let conflicts = system
        .applier
        .metric("status_applier_conflicts_total", &[])
        .await?;
    ensure!(conflicts == 0.0, "{conflicts} conflicts after the upgrade");
    let writes: Vec<String> = at_rest
        .writes_in(&ns.name)?
        .into_iter()
        .filter(|w| w.manager.starts_with("capt-"))
        .map(|w| w.to_string())
        .collect();
    ensure!(
        writes.is_empty(),
        "{} write(s) by capt-* at rest after the upgrade: {writes:#?}",
        writes.len()
    );
    audit_clean(&ns.name, &[], "after the upgrade")?;
    // The names Terraform got stay what each apply recorded: the bare Cluster name.
    for (stack, applies) in [
        ("zones", ["zones-vpc", "zones-controlplane"]),
        ("midway", ["midway-vpc", "midway-controlplane"]),
    ] {
        for apply in applies {
            ensure!(
                cluster_name_of(&system, apply)? == stack,
                "{apply} passes {} to Terraform, not the {stack} it recorded",
                cluster_name_of(&system, apply)?
            );
        }
    }
    // The held stacks go on where they stood: the halfway one's control plane gets its apply
    // now, named as its VPC's.
    std::fs::write(&gate_file, "")?;
    system
        .wait_for("the held control plane to complete", SETTLE, || async {
            Ok(get(&system, "captcontrolplane", "midway")?["status"]["phase"] == "Ready")
        })
        .await?;
    system
        .wait_for("the halfway control plane's apply", SETTLE, || async {
            Ok(cluster_name_of(&system, "halfway-controlplane")?.is_string())
        })
        .await?;
    for apply in ["halfway-vpc", "halfway-controlplane"] {
        ensure!(
            cluster_name_of(&system, apply)? == "halfway",
            "{apply} passes {} to Terraform: the VPC and the EKS cluster of one Cluster carry \
             one name, the bare one its VPC recorded",
            cluster_name_of(&system, apply)?
        );
    }
    // A stack with no apply before the upgrade: its names carry the namespace.
    env().kubectl_ok(
        &[
            "patch",
            "cluster",
            "paused",
            "-n",
            &ns.name,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"paused":false}}"#,
        ],
        None,
    )?;
    let namespaced = json!(capt_controller::names::namespaced(&ns.name, "paused"));
    system
        .wait_for("the unpaused stack's VPC apply", SETTLE, || async {
            Ok(cluster_name_of(&system, "paused-vpc")?.is_string())
        })
        .await?;
    ensure!(
        cluster_name_of(&system, "paused-vpc")? == namespaced,
        "a new apply passes {}, not {namespaced}",
        cluster_name_of(&system, "paused-vpc")?
    );
    // The operator's Orphan, kept; kept too when a real change renders the Workspace anew.
    ensure!(
        now[&orphaned]["spec"]["deletionPolicy"] == "Orphan",
        "{}",
        now[&orphaned]["spec"]
    );
    let generation = now[&orphaned]["metadata"]["generation"]
        .as_i64()
        .unwrap_or_default();
    apply(
        &ns.name,
        &[
            json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
        "kind": "WorkspaceTemplateApply", "metadata": {"name": "orphaned"},
        "spec": {"templateRef": {"name": "standalone", "namespace": templates.name},
                 "variables": {"BUCKET": "orphaned-2"}}}),
        ],
    )?;
    system
        .wait_for(
            "the changed apply's Workspace to be rendered anew",
            SETTLE,
            || async {
                let ws = &workspaces(&system)?[&orphaned];
                Ok(ws["metadata"]["generation"].as_i64() > Some(generation)
                    && ws["metadata"]["annotations"][RENDERING_ANNOTATION]
                        .as_str()
                        .and_then(|r| r.parse().ok())
                        == Some(RENDERING))
            },
        )
        .await?;
    let ws = &workspaces(&system)?[&orphaned];
    ensure!(
        ws["spec"]["deletionPolicy"] == "Orphan",
        "the re-render reset the operator's Orphan: {}",
        ws["spec"]
    );
    Ok(())
}

type Check = fn(&System) -> Result<bool>;
/// A stack to create: its name, its VPC template and its control plane's.
type Stack = (&'static str, &'static str, &'static str);

/// The previous release's commit and the directory of its two programs.
fn previous_release() -> Result<(String, PathBuf)> {
    let changelog = std::fs::read_to_string(repo_root().join("CHANGELOG.md"))?;
    let commit = changelog
        .lines()
        .filter_map(|l| {
            l.strip_prefix("## v")?
                .split_once(" (")?
                .1
                .strip_suffix(')')
        })
        .find(|c| c.chars().all(|c| c.is_ascii_hexdigit()))
        .context("CHANGELOG.md names no released commit")?
        .to_owned();
    // The build shares this build's target directory (target/debug/deps/<this test>).
    let exe = std::env::current_exe()?;
    let target = exe.ancestors().nth(3).context("the target directory")?;
    let out = Command::new(repo_root().join("hack/previous-release.sh"))
        .arg(&commit)
        .env("CARGO_TARGET_DIR", target)
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("hack/previous-release.sh {commit} failed");
    }
    let dir = String::from_utf8(out.stdout)?.trim().to_owned();
    Ok((commit, PathBuf::from(dir)))
}

/// Applies CAPT's CRDs server-side, as an install does: those of `commit`, or this tree's.
fn apply_crds(commit: Option<&str>) -> Result<()> {
    let texts: Vec<String> = match commit {
        Some(commit) => {
            let git = |args: &[&str]| -> Result<String> {
                let out = Command::new("git")
                    .current_dir(repo_root())
                    .args(args)
                    .output()?;
                ensure!(
                    out.status.success(),
                    "git {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                Ok(String::from_utf8(out.stdout)?)
            };
            git(&["ls-tree", "--name-only", commit, "manifests/crds/"])?
                .lines()
                .map(|path| git(&["show", &format!("{commit}:{path}")]))
                .collect::<Result<_>>()?
        }
        None => {
            let mut paths: Vec<_> = std::fs::read_dir(repo_root().join("manifests/crds"))?
                .map(|e| e.map(|e| e.path()))
                .collect::<std::io::Result<_>>()?;
            paths.sort();
            paths
                .iter()
                .map(std::fs::read_to_string)
                .collect::<std::io::Result<_>>()?
        }
    };
    env().kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            "testenv",
            "-f",
            "-",
        ],
        Some(&texts.join("\n---\n")),
    )?;
    env().kubectl_ok(
        &[
            "wait",
            "--for",
            "condition=Established",
            "--timeout",
            "60s",
            "crd",
            "--all",
        ],
        None,
    )?;
    Ok(())
}

/// What the upgrade must keep: every Workspace of the namespace's applies, and the status of
/// every CAPT object and apply and the `Available` condition of every Cluster.
struct Snapshot {
    workspaces: BTreeMap<String, Value>,
    statuses: BTreeMap<String, Value>,
}

fn snapshot(system: &System) -> Result<Snapshot> {
    let mut statuses = BTreeMap::new();
    for kind in [
        "captcluster",
        "captcontrolplane",
        "workspacetemplateapply",
        "cluster",
    ] {
        for item in list(system, kind)? {
            let name = format!("{kind}/{}", item["metadata"]["name"].as_str().unwrap_or(""));
            let kept = if kind == "cluster" {
                condition_or_null(&item, "Available").clone()
            } else {
                item["status"].clone()
            };
            statuses.insert(name, kept);
        }
    }
    Ok(Snapshot {
        workspaces: workspaces(system)?,
        statuses,
    })
}

/// Reads every CAPT object of the two namespaces with this build's types.
async fn read_all(client: &kube::Client, ns: &str, templates: &str) -> Result<()> {
    use kube::Api;
    let params = kube::api::ListParams::default();
    let n = Api::<CAPTCluster>::namespaced(client.clone(), ns)
        .list(&params)
        .await?
        .items
        .len()
        + Api::<CAPTControlPlane>::namespaced(client.clone(), ns)
            .list(&params)
            .await?
            .items
            .len()
        + Api::<WorkspaceTemplateApply>::namespaced(client.clone(), ns)
            .list(&params)
            .await?
            .items
            .len()
        + Api::<WorkspaceTemplate>::namespaced(client.clone(), templates)
            .list(&params)
            .await?
            .items
            .len();
    ensure!(n == 4 + 4 + 7 + 5, "read {n} CAPT objects");
    Ok(())
}

fn list(system: &System, kind: &str) -> Result<Vec<Value>> {
    let out = env().kubectl_ok(&["get", kind, "-n", system.namespace(), "-o", "json"], None)?;
    let list: Value = serde_json::from_str(&out)?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

/// The Workspaces of the namespace's applies, by name.
fn workspaces(system: &System) -> Result<BTreeMap<String, Value>> {
    let out = env().kubectl_ok(&["get", "workspaces", "-o", "json"], None)?;
    let list: Value = serde_json::from_str(&out)?;
    let prefix = format!("{}-", system.namespace());
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| {
            let name = w["metadata"]["name"].as_str()?;
            name.starts_with(&prefix)
                .then(|| (name.to_owned(), w.clone()))
        })
        .collect())
}

/// `kubectl apply --server-side` of `docs` into `ns`.
fn apply(ns: &str, docs: &[Value]) -> Result<()> {
    let text: Vec<String> = docs
        .iter()
        .map(|d| {
            let mut d = d.clone();
            d["metadata"]["namespace"] = json!(ns);
            d.to_string()
        })
        .collect();
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&text.join("\n")),
    )?;
    Ok(())
}

/// The samples' templates, the VPC's reporting two availability zones (failure domains);
/// `vpc-gated` and `eks-gated`, whose applies wait for `gate` to exist; and `standalone`.
fn templates_docs(gate: &str) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(repo_root().join("manifests/samples/templates.yaml"))?;
    // The templates alone: the file's Namespace is the platform's, this test has its own.
    let mut docs: Vec<Value> = yaml_documents(&text)?
        .into_iter()
        .filter(|d| d["kind"] == "WorkspaceTemplate")
        .collect();
    let mut gated = Vec::new();
    for d in &mut docs {
        let name = d["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let annotations = &mut d["spec"]["template"]["metadata"]["annotations"];
        if name == "vpc" {
            let key = "fake.tf.upbound.io/outputs";
            let mut outputs: Value =
                serde_json::from_str(annotations[key].as_str().unwrap_or("{}"))?;
            outputs["azs"] = json!(["ap-northeast-1a", "ap-northeast-1c"]);
            annotations[key] = json!(outputs.to_string());
        }
        let mut held = d.clone();
        held["metadata"]["name"] = json!(format!("{name}-gated"));
        held["spec"]["template"]["metadata"]["annotations"]["fake.tf.upbound.io/apply-gate"] =
            json!(gate);
        gated.push(held);
    }
    docs.extend(gated);
    docs.push(json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
        "metadata": {"name": "standalone"}, "spec": {"template": {"spec": {"forProvider": {
            "source": "Inline", "module": "variable \"bucket\" { type = string }\noutput \"bucket\" { value = var.bucket }",
            "vars": [{"key": "bucket", "value": "${BUCKET}"}]}}}}}));
    Ok(docs)
}

/// The samples' Cluster, CAPTCluster and CAPTControlPlane renamed `name`, their templates
/// `vpc` and `eks` of namespace `templates`, the Cluster paused when `paused`.
fn stack(name: &str, vpc: &str, eks: &str, paused: bool, templates: &str) -> Result<Vec<Value>> {
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
                d["spec"]["workspaceTemplateRef"] = json!({"name": eks, "namespace": templates});
            }
            _ => {
                d["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] = json!(name);
                d["spec"]["vpcTemplateRef"] = json!({"name": vpc, "namespace": templates});
            }
        }
    }
    Ok(docs)
}

/// A WorkspaceTemplateApply `name` of the template `standalone`, owned by no CAPT object.
fn standalone(name: &str, templates: &str) -> Vec<Value> {
    vec![
        json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": name},
        "spec": {"templateRef": {"name": "standalone", "namespace": templates}, "variables": {"BUCKET": name}}}),
    ]
}

fn get(system: &System, kind: &str, name: &str) -> Result<Value> {
    Ok(system.get(&[kind, name])?.unwrap_or(Value::Null))
}

fn workspace(system: &System, apply: &str) -> Result<Value> {
    Ok(workspaces(system)?
        .remove(&workspace_name(system.namespace(), apply))
        .unwrap_or(Value::Null))
}

/// Provisioned, the failure domains reported, each CAPT object mirroring its Workspace; core
/// has judged the Cluster's `Available`.
fn zones_rests(system: &System) -> Result<bool> {
    let (vpc, eks) = (
        workspace(system, "zones-vpc")?,
        workspace(system, "zones-controlplane")?,
    );
    let cc = get(system, "captcluster", "zones")?;
    let cp = get(system, "captcontrolplane", "zones")?;
    Ok(capt_tests::provider_rests(&vpc)
        && capt_tests::provider_rests(&eks)
        && get(system, "cluster", "zones")?["status"]["phase"] == "Provisioned"
        && !condition_or_null(&get(system, "cluster", "zones")?, "Available").is_null()
        && cc["status"]["failureDomains"]
            .as_array()
            .is_some_and(|d| d.len() == 2)
        && cc["status"]["workspaceTemplateStatus"]["lastAppliedRevision"]
            == vpc["status"]["atProvider"]["checksum"]
        && cp["status"]["phase"] == "Ready"
        && cp["status"]["workspaceStatus"]["atProvider"] == eks["status"]["atProvider"])
}

/// Both CAPT objects say they are paused, and no Workspace was rendered for them.
fn paused_rests(system: &System) -> Result<bool> {
    let cc = get(system, "captcluster", "paused")?;
    let cp = get(system, "captcontrolplane", "paused")?;
    Ok(condition_or_null(&cc, "Paused")["status"] == "True"
        && condition_or_null(&cp, "Paused")["status"] == "True"
        && workspace(system, "paused-vpc")?.is_null())
}

/// The VPC is ready; the control plane's Workspace exists, its apply held, and the control
/// plane says it waits for it; core has judged the Cluster's `Available`.
fn midway_rests(system: &System) -> Result<bool> {
    let vpc = workspace(system, "midway-vpc")?;
    let eks = workspace(system, "midway-controlplane")?;
    let cp = get(system, "captcontrolplane", "midway")?;
    Ok(capt_tests::provider_rests(&vpc)
        && !eks.is_null()
        && !condition_or_null(&get(system, "cluster", "midway")?, "Available").is_null()
        && cp["status"]["phase"].is_string()
        && cp["status"]["phase"] != "Ready"
        && cp["status"]["observedGeneration"] == cp["metadata"]["generation"])
}

/// The VPC's Workspace exists, its apply held; the control plane waits for the VPC, with no
/// apply of its own yet; core has judged the Cluster's `Available`.
fn halfway_rests(system: &System) -> Result<bool> {
    let vpc = workspace(system, "halfway-vpc")?;
    let cc = get(system, "captcluster", "halfway")?;
    let cp = get(system, "captcontrolplane", "halfway")?;
    Ok(!vpc.is_null()
        && get(system, "workspacetemplateapply", "halfway-controlplane")?.is_null()
        && !condition_or_null(&get(system, "cluster", "halfway")?, "Available").is_null()
        && !condition_or_null(&cc, "Ready").is_null()
        && cp["status"]["observedGeneration"] == cp["metadata"]["generation"])
}

/// The `CLUSTER_NAME` the apply `name` passes to Terraform (`null` without the apply).
fn cluster_name_of(system: &System, apply: &str) -> Result<Value> {
    let apply = get(system, "workspacetemplateapply", apply)?;
    Ok(apply["spec"]["variables"]["CLUSTER_NAME"].clone())
}

/// Each standalone apply's Workspace is ready, and the apply mirrors its conditions.
fn standalones_rest(system: &System) -> Result<bool> {
    for name in ["alone", "orphaned"] {
        let ws = workspace(system, name)?;
        let apply = get(system, "workspacetemplateapply", name)?;
        let mirrored = |type_: &str| {
            let (ours, theirs) = (
                condition_or_null(&apply, type_),
                condition_or_null(&ws, type_),
            );
            !theirs.is_null() && ours["status"] == theirs["status"]
        };
        if !(capt_tests::provider_rests(&ws)
            && apply["status"]["applied"] == true
            && mirrored("Ready"))
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The condition of `type_`, or `null` when there is none.
fn condition_or_null<'a>(obj: &'a Value, type_: &str) -> &'a Value {
    capt_tests::condition(obj, type_).unwrap_or(&Value::Null)
}
