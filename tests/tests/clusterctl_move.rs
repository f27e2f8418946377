//! `clusterctl move` (the real clusterctl of `hack/testenv.sh`, v1.14.2, `move
//! --to-kubeconfig`) of a Provisioned cluster from one API server to another, with Cluster API
//! core and the whole system (status-applier, capt-controller, fake Terraform provider) running
//! on both.
//!
//! Two environments of this test's own (`.testenv-move-source`, `.testenv-move-target`, beside
//! `CAPT_TESTENV_DIR` when it is set; both
//! started fresh and stopped at the end), not the shared one of [`capt_tests::env`]: the test
//! labels CRDs and creates the clusterctl inventory, which the other tests must not see.
//!
//! Set up by hand, because `clusterctl init` cannot run here (it downloads core and
//! cert-manager from GitHub), faithfully to what init would create (v1.10.4, still so in v1.14.2,
//! `cmd/clusterctl/client/cluster/inventory.go`, `installer.go`,
//! `client/repository/components.go`), on both API servers:
//! - the inventory CRD `providers.clusterctl.cluster.x-k8s.io` from the module's
//!   `cmd/clusterctl/config/manifest/clusterctl-api.yaml`, labelled
//!   `clusterctl.cluster.x-k8s.io/core: inventory` (`inventoryClient.createObj`);
//! - the labels init puts on every component (`getCommonLabels`): `clusterctl.cluster.x-k8s.io`
//!   and `cluster.x-k8s.io/provider` (`cluster-api`, `infrastructure-capt`,
//!   `control-plane-capt`) on the CRDs of core and of CAPT — `clusterctl move` discovers the
//!   kinds it moves from the CRDs carrying `clusterctl.cluster.x-k8s.io`
//!   (`objectgraph.go` `getCRDList`) — and `clusterctl.cluster.x-k8s.io/move` on the
//!   WorkspaceTemplate and WorkspaceTemplateApply CRDs, as CAPT's release assets carry it
//!   (`tests/tests/clusterctl.rs`). provider-terraform's Workspace CRD is not clusterctl's and
//!   stays unlabelled;
//! - the `Provider` objects (`components.InventoryObject`): `cluster-api` in `capi-system`
//!   (CoreProvider at clusterctl's own version), `infrastructure-capt` in `capt-system` and
//!   `control-plane-capt` in `capt-templates`, its components' namespace (v0.1.0); `move` checks that the target has every provider of the source at least at
//!   the source's version (`mover.go` `checkTargetProviders`).
//!
//! The Workspaces are cluster-scoped objects of provider-terraform; clusterctl does not move
//! them. The test carries them (and their connection Secrets) to the target before the move,
//! as an operator would with Crossplane's tooling: created with their spec, labels and
//! annotations, then their status written through the status subresource (a create drops
//! it), before the target's fake provider starts, so that its Terraform state (seeded from
//! the status, as the real provider's state travels with its backend) is the applied one. The
//! apply's uid label is left off: the applies get new uids on the target (clusterctl creates
//! them), and a Workspace whose uid label names another uid is another's (`tenancy.rs`
//! `workspace_owner`); one without it whose namespace and name labels match is the apply's,
//! and the controller gives it the uid label (metadata only: no spec change, no Terraform).
//!
//! Asserted: the source Cluster was paused by clusterctl during the move; nothing ran
//! Terraform on either side (no `applied` line from either fake provider, no write to a
//! Workspace but the uid label's, every Workspace's generation as it was, none deleted: on
//! the source, the objects clusterctl deletes carry `clusterctl.cluster.x-k8s.io/delete-for-move`,
//! which CAPT holds like a pause; before it did, the control-plane apply, deleted after its
//! Cluster, destroyed its Workspace); everything arrived on the target
//! (Cluster, CAPTCluster, CAPTControlPlane, both applies, both templates, the kubeconfig
//! Secret) with the field managers of the source (clusterctl creates each object and then
//! patches the source's managedFields back: `mover.go` `createTargetObject`,
//! `patchTopologyManagedFields`, for every object); the target Cluster is Provisioned and
//! unpaused; after it settles, 30 s without a write on the target but the fake provider's
//! no-op status polls and its re-publication of the control plane's connection Secret (a
//! fake-provider artefact of a seeded state, see below); the source namespace holds none
//! of the moved objects.

use anyhow::{Context, Result, bail, ensure};
use capt_controller::reconcile::plan::SPEC_MANAGER;
use capt_controller::render::APPLY_UID_LABEL;
use capt_tests::audit_log::{AuditLog, without_noop_polls, workspace_versions_in, writes_over};
use capt_tests::system::System;
use capt_tests::{Env, repo_root, unique_name};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, WatchEvent, WatchParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// The kinds clusterctl moves for a CAPT cluster, as `kubectl get` names them.
const MOVED: [&str; 6] = [
    "clusters.cluster.x-k8s.io",
    "captclusters.infrastructure.cluster.x-k8s.io",
    "captcontrolplanes.controlplane.cluster.x-k8s.io",
    "workspacetemplateapplies.infrastructure.cluster.x-k8s.io",
    "workspacetemplates.infrastructure.cluster.x-k8s.io",
    "secrets",
];

/// The claim's window: once the target rests, this long without a write on it.
const QUIET_WINDOW: Duration = Duration::from_secs(30);

/// Both environments, stopped when dropped (pass or fail).
struct Envs {
    source: Env,
    target: Env,
}

impl Drop for Envs {
    fn drop(&mut self) {
        for env in [&self.source, &self.target] {
            if let Err(e) = env.stop() {
                eprintln!("stopping {}: {e:#}", env.state_dir().display());
            }
        }
    }
}

/// A fresh environment with core in `.testenv-<name>` (`$CAPT_TESTENV_DIR-<name>` when set, so
/// that `hack/core-suite.sh` keeps its own; one left running by an earlier run is stopped
/// first: the inventory below is created, not applied).
fn fresh_env(name: &str) -> Result<Env> {
    let dir = match std::env::var("CAPT_TESTENV_DIR") {
        Ok(dir) => PathBuf::from(format!("{dir}-{name}")),
        Err(_) => repo_root().join(format!(".testenv-{name}")),
    };
    let _ = Command::new(repo_root().join("hack/testenv.sh"))
        .arg("stop")
        .env("CAPT_TESTENV_DIR", &dir)
        .output();
    let env = Env::start_in(&dir)?;
    ensure!(env.core, "{name}: core runs");
    Ok(env)
}

/// The Cluster API module the core manager is built from (`hack/testenv.sh crds` lists its
/// CRDs: `<module>/core/config/crd/bases/…` since v1.14, `<module>/config/crd/bases/…` before).
fn cluster_api_module(env: &Env) -> Result<PathBuf> {
    let out = Command::new(repo_root().join("hack/testenv.sh"))
        .arg("crds")
        .env("CAPT_TESTENV_DIR", env.state_dir())
        .output()?;
    let text = String::from_utf8(out.stdout)?;
    let first = text
        .lines()
        .next()
        .context("hack/testenv.sh crds lists the CRDs")?;
    let (module, _) = first
        .split_once("/config/crd/")
        .with_context(|| format!("a CRD of the module: {first}"))?;
    Ok(PathBuf::from(
        module.strip_suffix("/core").unwrap_or(module),
    ))
}

fn documents(yaml: &str) -> Result<Vec<Value>> {
    capt_tests::yaml_documents(yaml)
}

fn get_json(env: &Env, args: &[&str]) -> Result<Value> {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "json", "--show-managed-fields"]);
    Ok(serde_json::from_str(&env.kubectl_ok(&all, None)?)?)
}

/// The version of the real clusterctl (`clusterctl version -o short`): core's, as both are
/// built from one module. `clusterctl init` records it as the CoreProvider's version.
fn clusterctl_version(env: &Env) -> Result<String> {
    let home = std::env::temp_dir().join(unique_name("clusterctl-version-home"));
    std::fs::create_dir_all(&home)?;
    let out = env
        .clusterctl(&home)?
        .args(["version", "-o", "short"])
        .output()?;
    std::fs::remove_dir_all(&home)?;
    ensure!(out.status.success(), "clusterctl version: {out:?}");
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

/// What `clusterctl init --infrastructure capt --control-plane capt` (with the core of the
/// test environment) leaves for `clusterctl move` to read: see the module documentation.
fn install_inventory(env: &Env) -> Result<()> {
    let module = cluster_api_module(env)?;
    let core_version = clusterctl_version(env)?;
    let manifest = module.join("cmd/clusterctl/config/manifest/clusterctl-api.yaml");
    let mut inventory = documents(&std::fs::read_to_string(&manifest)?)?;
    for o in &mut inventory {
        o["metadata"]["labels"]["clusterctl.cluster.x-k8s.io/core"] = json!("inventory");
    }
    let inventory: Vec<String> = inventory.iter().map(Value::to_string).collect();
    env.kubectl_ok(&["create", "-f", "-"], Some(&inventory.join("\n")))?;
    env.kubectl_ok(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=30s",
            "crd/providers.clusterctl.cluster.x-k8s.io",
        ],
        None,
    )?;

    let crds = get_json(env, &["crds"])?;
    for crd in crds["items"].as_array().into_iter().flatten() {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        let group = crd["spec"]["group"].as_str().unwrap_or_default();
        let provider = match group {
            "infrastructure.cluster.x-k8s.io" => "infrastructure-capt",
            "controlplane.cluster.x-k8s.io" => "control-plane-capt",
            "clusterctl.cluster.x-k8s.io" => continue,
            g if g == "cluster.x-k8s.io" || g.ends_with(".cluster.x-k8s.io") => "cluster-api",
            _ => continue, // provider-terraform's Workspace: not clusterctl's
        };
        let mut args = vec![
            "label".to_owned(),
            "crd".to_owned(),
            name.to_owned(),
            "--overwrite".to_owned(),
            "clusterctl.cluster.x-k8s.io=".to_owned(),
            format!("cluster.x-k8s.io/provider={provider}"),
        ];
        if name.starts_with("workspacetemplate") {
            args.push("clusterctl.cluster.x-k8s.io/move=".to_owned());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        env.kubectl_ok(&args, None)?;
    }

    let mut objects = Vec::new();
    for ns in ["capi-system", "capt-system", "capt-templates"] {
        objects.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    for (ns, name, provider, kind, version) in [
        (
            "capi-system",
            "cluster-api",
            "cluster-api",
            "CoreProvider",
            core_version.as_str(),
        ),
        (
            "capt-system",
            "infrastructure-capt",
            "capt",
            "InfrastructureProvider",
            "v0.1.0",
        ),
        (
            "capt-templates",
            "control-plane-capt",
            "capt",
            "ControlPlaneProvider",
            "v0.1.0",
        ),
    ] {
        objects.push(json!({
            "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
            "kind": "Provider",
            "metadata": {"namespace": ns, "name": name, "labels": {
                "clusterctl.cluster.x-k8s.io": "",
                "cluster.x-k8s.io/provider": name,
                "clusterctl.cluster.x-k8s.io/core": "inventory",
            }},
            "providerName": provider,
            "type": kind,
            "version": version,
        }));
    }
    let objects: Vec<String> = objects.iter().map(Value::to_string).collect();
    env.kubectl_ok(&["create", "-f", "-"], Some(&objects.join("\n")))?;
    Ok(())
}

/// The Workspaces of namespace `ns`'s applies.
fn workspaces(env: &Env, ns: &str) -> Result<Vec<Value>> {
    let label = format!("{}={ns}", capt_tests::system::APPLY_NAMESPACE_LABEL);
    let list = get_json(env, &["workspaces", "-l", &label])?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

/// Carries the Workspaces of `ns` and their connection Secrets from `from` to `to`, as an
/// operator would with Crossplane's tooling (see the module documentation); their names.
fn carry_workspaces(from: &Env, to: &Env, ns: &str) -> Result<Vec<String>> {
    let mut names = Vec::new();
    to.kubectl_ok(&["create", "namespace", ns], None)?;
    for ws in workspaces(from, ns)? {
        let name = ws["metadata"]["name"]
            .as_str()
            .context("a name")?
            .to_owned();
        let mut labels = ws["metadata"]["labels"].clone();
        labels
            .as_object_mut()
            .context("labels")?
            .remove(APPLY_UID_LABEL);
        let copy = json!({
            "apiVersion": ws["apiVersion"], "kind": ws["kind"],
            "metadata": {"name": name, "labels": labels,
                "annotations": ws["metadata"]["annotations"],
                "finalizers": ws["metadata"]["finalizers"]},
            "spec": ws["spec"],
        });
        to.kubectl_ok(&["create", "-f", "-"], Some(&copy.to_string()))?;
        let status = json!({"status": ws["status"]}).to_string();
        to.kubectl_ok(
            &[
                "patch",
                "workspace",
                &name,
                "--subresource=status",
                "--type=merge",
                "-p",
                &status,
            ],
            None,
        )?;
        let uid = get_json(to, &["workspace", &name])?["metadata"]["uid"].clone();
        let secret_ref = &ws["spec"]["writeConnectionSecretToRef"];
        if let (Some(s), Some(s_ns)) = (
            secret_ref["name"].as_str(),
            secret_ref["namespace"].as_str(),
        ) {
            let secret = get_json(from, &["secret", s, "-n", s_ns])?;
            let owners: Vec<Value> = secret["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|o| {
                    let mut o = o.clone();
                    if o["kind"] == "Workspace" {
                        o["uid"] = uid.clone();
                    }
                    o
                })
                .collect();
            let copy = json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": s, "namespace": s_ns,
                    "labels": secret["metadata"]["labels"],
                    "ownerReferences": owners},
                "type": secret["type"], "data": secret["data"],
            });
            to.kubectl_ok(&["create", "-f", "-"], Some(&copy.to_string()))?;
        }
        names.push(name);
    }
    Ok(names)
}

/// `kind/name` of every object of the moved kinds in `ns`, but the Secrets of Workspaces.
fn moved_objects(env: &Env, ns: &str) -> Result<Vec<String>> {
    let list = get_json(env, &[&MOVED.join(","), "-n", ns])?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| {
            let owners = o["metadata"]["ownerReferences"].as_array();
            !owners.is_some_and(|os| os.iter().any(|r| r["kind"] == "Workspace"))
        })
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or(""),
                o["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect())
}

/// The field managers of the object `what` in `ns`, with their operation and subresource.
fn managers(env: &Env, ns: &str, what: &[&str]) -> Result<Vec<String>> {
    let mut args = what.to_vec();
    args.extend_from_slice(&["-n", ns]);
    let o = get_json(env, &args)?;
    let mut all: Vec<String> = o["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            format!(
                "{} {} {}",
                m["manager"].as_str().unwrap_or(""),
                m["operation"].as_str().unwrap_or(""),
                m["subresource"].as_str().unwrap_or("")
            )
        })
        .collect();
    all.sort();
    Ok(all)
}

fn generations(env: &Env, ns: &str) -> Result<BTreeMap<String, Value>> {
    Ok(workspaces(env, ns)?
        .into_iter()
        .map(|w| {
            (
                w["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                w["metadata"]["generation"].clone(),
            )
        })
        .collect())
}

fn applied_lines(system: &System) -> usize {
    system
        .provider()
        .log_text()
        .lines()
        .filter(|l| l.contains("applied"))
        .count()
}

/// What a watch of the source Cluster saw.
struct SourceCluster {
    /// A version of it had `spec.paused: true`.
    paused: Arc<AtomicBool>,
    /// Notified once it was deleted.
    deleted: Arc<Notify>,
}

/// Watches the source Cluster `ns/demo` from now on.
async fn watch_source_cluster(env: &Env, ns: &str) -> Result<SourceCluster> {
    let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster");
    let api: Api<DynamicObject> =
        Api::namespaced_with(env.client().await?, ns, &ApiResource::from_gvk(&gvk));
    let current = api.get("demo").await?;
    let version = current
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default();
    let paused = Arc::new(AtomicBool::new(false));
    let deleted = Arc::new(Notify::new());
    let (flag, on_deletion) = (paused.clone(), deleted.clone());
    let params = WatchParams::default()
        .fields("metadata.name=demo")
        .timeout(290);
    let mut stream = api.watch(&params, &version).await?.boxed();
    tokio::spawn(async move {
        while let Some(Ok(event)) = stream.next().await {
            if let WatchEvent::Modified(o) | WatchEvent::Deleted(o) = &event
                && o.data["spec"]["paused"] == true
            {
                flag.store(true, Ordering::SeqCst);
            }
            if let WatchEvent::Deleted(_) = event {
                on_deletion.notify_one();
            }
        }
    });
    Ok(SourceCluster { paused, deleted })
}

fn clusterctl(envs: &Envs, ns: &str, home: &Path) -> Result<String> {
    std::fs::create_dir_all(home)?;
    let out = envs
        .source
        .clusterctl(home)?
        .args(["move", "--namespace", ns, "--kubeconfig"])
        .arg(&envs.source.kubeconfig)
        .arg("--to-kubeconfig")
        .arg(&envs.target.kubeconfig)
        .args(["-v", "1"])
        .output()?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("clusterctl move: {log}");
    }
    Ok(log)
}

#[tokio::test]
async fn clusterctl_move_carries_a_provisioned_cluster_without_running_terraform() -> Result<()> {
    let envs = Envs {
        source: fresh_env("move-source")?,
        target: fresh_env("move-target")?,
    };
    for env in [&envs.source, &envs.target] {
        install_inventory(env)?;
    }
    let ns = unique_name("move");
    let source = provision_on_source(&envs, &ns).await?;
    let target = carry_workspaces_and_start_target(&envs, &ns).await?;
    let source_audit = move_with_clusterctl(&envs, &ns).await?;
    assert_everything_arrived(&envs, &ns, &source.moved)?;
    assert_target_provisioned(&envs, &ns, &target, &source.managers).await?;
    assert_source_emptied(&envs, &ns)?;
    assert_target_quiet(&envs, &ns, &target).await?;
    assert_no_terraform_ran(&envs, &ns, &source, &target, &source_audit)?;
    drop(target);
    drop(source);
    Ok(())
}

/// The source side: its system, and what it held once provisioned.
struct Source {
    system: System,
    /// Its fake provider's `applied` lines.
    applied: usize,
    /// The objects clusterctl moves ([`moved_objects`]).
    moved: Vec<String>,
    /// Its Workspaces' generations.
    generations: BTreeMap<String, Value>,
    /// The control plane's managers.
    managers: Vec<String>,
}

/// The target side: its system, and the Workspaces carried to it before it started.
struct Target {
    system: System,
    carried: Vec<String>,
    audit: Audited,
}

/// An environment's audit log from some point on, with its Workspaces' versions then.
struct Audited {
    log: AuditLog,
    versions_before: BTreeMap<String, String>,
}

impl Audited {
    fn from_now(env: &Env, ns: &str) -> Result<Self> {
        Ok(Self {
            log: AuditLog::from_now_in(env)?,
            versions_before: workspace_versions_in(env, ns)?,
        })
    }

    /// The writes in `ns` since then, no-op status polls of a Workspace left out.
    fn writes(&self, env: &Env, ns: &str) -> Result<Vec<capt_tests::audit_log::Write>> {
        let versions_after = workspace_versions_in(env, ns)?;
        let (writes, _) = without_noop_polls(
            self.log.writes_in(ns)?,
            &self.versions_before,
            &versions_after,
        );
        Ok(writes)
    }
}

/// The whole system on the source, the samples provisioned and at rest: Terraform ran once
/// per Workspace.
async fn provision_on_source(envs: &Envs, ns: &str) -> Result<Source> {
    envs.source.kubectl_ok(&["create", "namespace", ns], None)?;
    let source = System::start_on(&envs.source, ns, 50).await?;
    source.apply_samples(false).await?;
    source.wait_provisioned().await?;
    // Settled: each object mirrors its Workspace's last report, and core has processed ours.
    source.wait_samples_rest().await?;
    let source_applied = applied_lines(&source);
    assert_eq!(
        source_applied, 2,
        "the source ran Terraform once per Workspace"
    );
    let source_generations = generations(&envs.source, ns)?;
    assert_eq!(source_generations.len(), 2, "{source_generations:?}");
    Ok(Source {
        applied: source_applied,
        moved: moved_objects(&envs.source, ns)?,
        generations: source_generations,
        managers: managers(&envs.source, ns, &["captcontrolplane", "demo"])?,
        system: source,
    })
}

/// The Workspaces go first, then the target's system starts.
async fn carry_workspaces_and_start_target(envs: &Envs, ns: &str) -> Result<Target> {
    let carried = carry_workspaces(&envs.source, &envs.target, ns)?;
    assert_eq!(carried.len(), 2);
    let audit = Audited::from_now(&envs.target, ns)?;
    let system = System::start_on(&envs.target, ns, 50).await?;
    Ok(Target {
        system,
        carried,
        audit,
    })
}

/// Runs `clusterctl move`, which pauses the source Cluster before it copies anything and
/// deletes it at the end. Returns the source's audit from before the move.
async fn move_with_clusterctl(envs: &Envs, ns: &str) -> Result<Audited> {
    let source_audit = Audited::from_now(&envs.source, ns)?;
    let source_cluster = watch_source_cluster(&envs.source, ns).await?;
    let home = std::env::temp_dir().join(unique_name("clusterctl-move-home"));
    let log = clusterctl(envs, ns, &home)?;
    eprintln!("--- clusterctl move:\n{log}");
    std::fs::remove_dir_all(&home)?;
    // Once the watch has seen the deletion, it has seen every version before it.
    tokio::time::timeout(Duration::from_secs(30), source_cluster.deleted.notified())
        .await
        .context("the watch of the source Cluster saw its deletion")?;
    assert!(
        source_cluster.paused.load(Ordering::SeqCst),
        "clusterctl paused the source Cluster"
    );
    Ok(source_audit)
}

/// Everything arrived on the target: what the source held, and each kind of the stack.
fn assert_everything_arrived(envs: &Envs, ns: &str, before_moved: &[String]) -> Result<()> {
    let after_moved = moved_objects(&envs.target, ns)?;
    for o in before_moved {
        if o.starts_with("Secret/") && !o.ends_with("-kubeconfig") {
            continue; // the target's own Secrets (none of the Cluster's but the kubeconfig)
        }
        assert!(
            after_moved.contains(o),
            "{o} on the target: {after_moved:?}"
        );
    }
    for kind in [
        "Cluster/demo",
        "CAPTCluster/demo",
        "CAPTControlPlane/demo",
        "Secret/demo-kubeconfig",
    ] {
        assert!(
            after_moved.iter().any(|o| o == kind),
            "{kind}: {after_moved:?}"
        );
    }
    let applies = after_moved
        .iter()
        .filter(|o| o.starts_with("WorkspaceTemplateApply/"))
        .count();
    let templates = after_moved
        .iter()
        .filter(|o| o.starts_with("WorkspaceTemplate/"))
        .count();
    assert_eq!((applies, templates), (2, 2), "{after_moved:?}");
    Ok(())
}

/// The target Cluster is Provisioned and unpaused, its control plane ready, with the
/// source's managedFields.
async fn assert_target_provisioned(
    envs: &Envs,
    ns: &str,
    target: &Target,
    source_managers: &[String],
) -> Result<()> {
    let target = &target.system;
    target.wait_provisioned().await?;
    target
        .wait_for(
            "the target Cluster unpaused",
            Duration::from_secs(30),
            || async {
                Ok(target
                    .get(&["cluster", "demo"])?
                    .is_some_and(|c| c["spec"]["paused"] != true))
            },
        )
        .await?;
    target
        .wait_for(
            "the target control plane ready",
            Duration::from_secs(60),
            || async {
                Ok(target
                    .get(&["captcontrolplane", "demo"])?
                    .is_some_and(|cp| cp["status"]["ready"] == true))
            },
        )
        .await?;
    let target_managers = managers(&envs.target, ns, &["captcontrolplane", "demo"])?;
    eprintln!("managers on the source: {source_managers:#?}\non the target: {target_managers:#?}");
    for m in source_managers {
        assert!(
            target_managers.contains(m),
            "{m} survived the move: {target_managers:?}"
        );
    }
    // Not asserted: the target's status-applier did not log "Rebuilt desired document from
    // managedFields" in the runs so far; its documents came from the controller's intents
    // (the statuses are dropped by clusterctl's creates and published anew).
    let rebuilt = target
        .applier
        .log_text()
        .matches("Rebuilt desired document")
        .count();
    eprintln!("target applier: {rebuilt} documents rebuilt from managedFields");
    Ok(())
}

/// The source namespace is empty of the moved objects.
fn assert_source_emptied(envs: &Envs, ns: &str) -> Result<()> {
    let left = moved_objects(&envs.source, ns)?;
    let left: Vec<&String> = left
        .iter()
        .filter(|o| !o.starts_with("Secret/") || o.ends_with("-kubeconfig"))
        .collect();
    assert!(left.is_empty(), "left on the source: {left:?}");
    Ok(())
}

/// Settled (as on the source before the move), the target stays quiet for the window.
async fn assert_target_quiet(envs: &Envs, ns: &str, target: &Target) -> Result<()> {
    target.system.wait_samples_rest().await?;
    let (writes, polls) = writes_over(&envs.target, ns, QUIET_WINDOW).await?;
    // Left out, and reported: the fake provider re-publishes the control plane's connection
    // Secret at every poll on the target (its Terraform state there is seeded from the
    // Workspace's status, which holds no sensitive output). Not CAPT's, not core's.
    let (republished, writes): (Vec<_>, Vec<_>) = writes.into_iter().partition(|w| {
        w.manager == capt_tests::fake_provider::FIELD_MANAGER
            && w.verb == "patch"
            && w.object.starts_with("secrets ")
            && w.name.ends_with("-connection")
    });
    eprintln!(
        "target at rest: {} connection Secret patches by the fake provider",
        republished.len()
    );
    let shown: Vec<String> = writes.iter().map(ToString::to_string).collect();
    assert!(
        writes.is_empty(),
        "writes on the target at rest ({polls} no-op polls left out): {shown:#?}"
    );
    Ok(())
}

/// Nothing ran Terraform, on either side: no new `applied` line, the Workspaces'
/// generations as they were, no Workspace write on the source, and on the target none but
/// the uid label's and the provider's status polls, which stored nothing.
fn assert_no_terraform_ran(
    envs: &Envs,
    ns: &str,
    source: &Source,
    target: &Target,
    source_audit: &Audited,
) -> Result<()> {
    assert_eq!(
        applied_lines(&source.system),
        source.applied,
        "{}",
        source.system.provider().log_text()
    );
    assert_eq!(
        applied_lines(&target.system),
        0,
        "{}",
        target.system.provider().log_text()
    );
    assert_eq!(generations(&envs.source, ns)?, source.generations);
    let target_generations = generations(&envs.target, ns)?;
    assert_eq!(
        target_generations.keys().collect::<Vec<_>>(),
        source.generations.keys().collect::<Vec<_>>()
    );
    assert!(
        target_generations.values().all(|g| *g == json!(1)),
        "{target_generations:?}"
    );
    let workspace_writes = |writes: Vec<capt_tests::audit_log::Write>| -> Vec<String> {
        writes
            .iter()
            .filter(|w| {
                w.object.starts_with("workspaces ") || w.object.starts_with("workspaces/status")
            })
            .map(ToString::to_string)
            .collect()
    };
    assert_eq!(
        workspace_writes(source_audit.writes(&envs.source, ns)?),
        Vec::<String>::new(),
        "no Workspace write on the source"
    );
    let target_ws_writes = workspace_writes(target.audit.writes(&envs.target, ns)?);
    eprintln!("Workspace writes on the target: {target_ws_writes:#?}");
    // No write to a Workspace but the uid label's: one patch of each carried Workspace by
    // the controller (metadata only: the generations above are 1), and else only the fake
    // provider's status polls, which stored nothing: each Workspace's status is still the
    // one carried from the source. (The uid label changed each Workspace's resourceVersion
    // within the window, so without_noop_polls cannot leave those polls out.)
    let (polls, mut others): (Vec<String>, Vec<String>) =
        target_ws_writes.iter().cloned().partition(|w| {
            w.starts_with("update workspaces/status ")
                && w.ends_with(&format!(" by {}", capt_tests::fake_provider::FIELD_MANAGER))
        });
    let mut uid_label_patches: Vec<String> = target
        .carried
        .iter()
        .map(|ws| format!("patch workspaces /{ws} by {SPEC_MANAGER}"))
        .collect();
    others.sort();
    uid_label_patches.sort();
    assert_eq!(
        others, uid_label_patches,
        "the target's Workspace writes but the provider's status polls: one uid label patch each"
    );
    for ws in &target.carried {
        let on_target = &get_json(&envs.target, &["workspace", ws])?["status"];
        let on_source = &get_json(&envs.source, &["workspace", ws])?["status"];
        assert_eq!(
            on_target,
            on_source,
            "{ws}: the {} status polls on the target stored nothing: {:#?}",
            polls.len(),
            capt_tests::differences(on_source, on_target)
        );
    }
    for ws in &target.carried {
        let labels = &get_json(&envs.target, &["workspace", ws])?["metadata"]["labels"];
        assert!(
            labels[APPLY_UID_LABEL].is_string(),
            "{ws} got the new apply's uid: {labels}"
        );
    }
    Ok(())
}
