//! One object never stops the others. A tenant's objects that the API server (and Cluster API
//! core's webhooks) accept are created beside another tenant's stacks, the controller is
//! restarted as a pod restart does, and the other tenant's stacks are still reconciled:
//!
//! - the Cluster of the report that found the trap (v1beta2 makes the endpoint's port
//!   optional; the controller's view once required it, so this Cluster failed its list of
//!   every Cluster, and after a restart nothing was reconciled for any tenant) now reads as a
//!   Cluster with no endpoint yet;
//! - a CAPTControlPlane whose `spec.controlPlaneEndpoint.port` is past 32 bits: the CRD says
//!   `format: int32`, which the API server does not enforce on integers, and the controller
//!   cannot read it. It costs only itself: it is reported (a Warning Event, the
//!   `capt_objects_unreadable` gauge, a log line) until it is deleted.
//!
//! And a watch that keeps failing (an upgrade whose ClusterRole lacks a kind) makes `/readyz`
//! fail and name it.

use anyhow::{Context, Result, bail, ensure};
use capt_tests::applier::metric_value;
use capt_tests::fake_provider::FakeProvider;
use capt_tests::pod::{Election, Pod};
use capt_tests::system::{System, apply_sample_in_shard, impersonating_kubeconfig, wait_until};
use capt_tests::{Scratch, TestNamespace, env, unique_name, warnings};
use serde_json::{Value, json};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(120);

/// A Cluster of tenant `mallory` that core accepts: v1beta2 allows an endpoint without a
/// port (the controller's view of a Cluster requires one).
fn poison_cluster(namespace: &str, shard: &str) -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {"name": "poison", "namespace": namespace,
            "labels": {capt_tests::pod::WATCH_FILTER_LABEL: shard}},
        "spec": {
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                "kind": "CAPTCluster", "name": "poison"},
            "controlPlaneEndpoint": {"host": "poison.example.com"},
        },
    })
}

/// A CAPTControlPlane of tenant `mallory` whose endpoint's port is past what a 32-bit integer
/// holds: the CRD's schema says `format: int32`, which the API server does not enforce on
/// integers.
fn poison_control_plane(namespace: &str, shard: &str) -> Value {
    json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
        "kind": "CAPTControlPlane",
        "metadata": {"name": "poison", "namespace": namespace,
            "labels": {capt_tests::pod::WATCH_FILTER_LABEL: shard}},
        "spec": {
            "version": "1.31",
            "workspaceTemplateRef": {"name": "poison"},
            "controlPlaneEndpoint": {"host": "poison.example.com", "port": 4_294_967_296_i64},
        },
    })
}

fn apply(object: &Value) -> Result<()> {
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&object.to_string()),
    )?;
    Ok(())
}

fn get(namespace: &str, what: &str, name: &str) -> Result<Value> {
    let out = env().kubectl_ok(&["get", what, name, "-n", namespace, "-o", "json"], None)?;
    Ok(serde_json::from_str(&out)?)
}

async fn unreadable(pod: &Pod, kind: &str) -> Result<f64> {
    let text = pod.controller_metrics_text().await?;
    metric_value(
        &text,
        "capt_objects_unreadable",
        &[&format!("kind=\"{kind}\"")],
    )
}

async fn provisioned(pod: &Pod, namespace: &str, stack: &str) -> Result<()> {
    let what = format!("Cluster {namespace}/{stack} Provisioned");
    wait_until(&what, TIMEOUT, || async {
        Ok(get(namespace, "cluster", stack)?["status"]["phase"] == "Provisioned")
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n--- controller log:\n{}", pod.controller_log_text()))
}

#[tokio::test]
async fn a_tenants_odd_but_valid_objects_cost_only_themselves_across_a_restart() -> Result<()> {
    let client = env().client().await?;
    let tenant = TestNamespace::create(&client, "tenant").await?;
    let mallory = TestNamespace::create(&client, "mallory").await?;
    let shard = unique_name("unreadable");
    let _provider =
        FakeProvider::for_namespace(&tenant.name, 50, "info", &env().kubeconfig).await?;
    let election = Election {
        lease: format!("capt-{shard}"),
        duration_seconds: None,
    };
    // Every namespace, as deployed; the shard's label keeps other tests' objects out.
    let mut pod = Pod::start_in_shard_everywhere("pod-a", &election, &shard, &tenant.name).await?;
    apply_sample_in_shard(env(), &tenant.name, "demo", &shard)?;
    provisioned(&pod, &tenant.name, "demo").await?;

    apply(&poison_cluster(&mallory.name, &shard)).context("core accepts the poison Cluster")?;
    apply(&poison_control_plane(&mallory.name, &shard))
        .context("the API server accepts the poison control plane")?;
    // Restarted, as a pod restart, an eviction or a fail-over does: the first list meets them.
    pod.kill_controller();
    pod.start_controller()?;
    wait_until("the restarted controller ready", TIMEOUT, || async {
        Ok(pod.controller_readyz().await?.0 == 200)
    })
    .await?;

    // The other tenant's stacks are reconciled: a pause is seen, a new stack provisioned.
    env().kubectl_ok(
        &[
            "patch",
            "cluster",
            "demo",
            "-n",
            &tenant.name,
            "--type=merge",
            "-p",
            r#"{"spec":{"paused":true}}"#,
        ],
        None,
    )?;
    wait_until(
        "the paused Cluster's CAPTCluster Paused=True",
        TIMEOUT,
        || async {
            let capt_cluster = get(&tenant.name, "captcluster", "demo")?;
            Ok(capt_tests::condition(&capt_cluster, "Paused")
                .is_some_and(|c| c["status"] == "True"))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n--- controller log:\n{}", pod.controller_log_text()))?;
    apply_sample_in_shard(env(), &tenant.name, "second", &shard)?;
    provisioned(&pod, &tenant.name, "second").await?;

    // The Cluster reads (an endpoint without its port is no endpoint yet); the control plane
    // does not, and is reported where an operator looks: its Event, the gauge, the log.
    ensure!(
        unreadable(&pod, "Cluster").await? == 0.0,
        "the Cluster reads"
    );
    ensure!(
        unreadable(&pod, "CAPTControlPlane").await? == 1.0,
        "one unreadable CAPTControlPlane"
    );
    let notes = warnings(&mallory.name, "Unreadable", "poison")?;
    ensure!(
        notes.iter().any(|n| n.contains("CAPTControlPlane")
            && n.contains("spec.controlPlaneEndpoint.port")),
        "a Warning Event on the control plane naming the field: {notes:?}"
    );
    let log = pod.controller_log_text();
    ensure!(
        log.contains("Object cannot be read") && log.contains(&mallory.name),
        "the log names the object:\n{log}"
    );
    let (status, body) = pod.controller_readyz().await?;
    ensure!(status == 200, "ready beside them: {body}");

    // Deleted, it counts no more.
    for what in ["cluster", "captcontrolplane"] {
        let args = [
            "delete",
            what,
            "poison",
            "-n",
            &mallory.name,
            "--wait=false",
        ];
        env().kubectl_ok(&args, None)?;
    }
    wait_until("no unreadable CAPTControlPlane", TIMEOUT, || async {
        Ok(unreadable(&pod, "CAPTControlPlane").await? == 0.0)
    })
    .await?;
    Ok(())
}

/// The controller's ClusterRole of `manifests/deploy/rbac.yaml` without `resource`.
fn cluster_role_without(name: &str, resource: &str) -> Result<Value> {
    let text = std::fs::read_to_string(capt_tests::repo_root().join("manifests/deploy/rbac.yaml"))?;
    let role = capt_tests::yaml_documents(&text)?
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "capt-controller")
        .context("the controller's ClusterRole")?;
    let mut rules = Vec::new();
    for mut rule in role["rules"].as_array().cloned().unwrap_or_default() {
        if let Some(resources) = rule["resources"].as_array_mut() {
            resources.retain(|r| r != resource);
            if resources.is_empty() {
                continue;
            }
        }
        rules.push(rule);
    }
    Ok(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name}, "rules": rules,
    }))
}

#[tokio::test]
async fn readyz_fails_and_names_the_watch_that_keeps_failing() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "readyz").await?;
    let user = unique_name("capt-without-templates");
    apply(&cluster_role_without(&user, "workspacetemplates")?)?;
    apply(&json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))?;
    let scratch = Scratch::new(&user)?;
    let kubeconfig = impersonating_kubeconfig(&user, &scratch)?;
    let system = System::start_as(&ns.name, 50, &["--no-leader-election"], &kubeconfig).await?;
    let failing = wait_until("/readyz failing on the template watch", TIMEOUT, || async {
        let (status, body) = system.controller_readyz().await?;
        Ok(status == 503
            && body.contains("watch of WorkspaceTemplate failing")
            && body.contains("forbidden"))
    })
    .await;
    if let Err(e) = failing {
        let (status, body) = system.controller_readyz().await?;
        let log = system.controller_log_text();
        bail!("{e}; /readyz now answers {status}: {body}\n--- controller log:\n{log}");
    }
    let failures =
        system.controller_metric("capt_watch_failures_total", &["kind=\"WorkspaceTemplate\""]);
    ensure!(failures.await? >= 2.0, "the failures are counted");

    // The operator grants the kind: the watch lists it, and the controller is ready.
    let mut role = cluster_role_without(&user, "workspacetemplates")?;
    role["rules"].as_array_mut().unwrap().push(json!({
        "apiGroups": ["infrastructure.cluster.x-k8s.io"],
        "resources": ["workspacetemplates"], "verbs": ["get", "list", "watch"],
    }));
    apply(&role)?;
    wait_until("/readyz ready once granted", TIMEOUT, || async {
        Ok(system.controller_readyz().await?.0 == 200)
    })
    .await?;
    for what in ["clusterrolebinding", "clusterrole"] {
        env().kubectl_ok(&["delete", what, &user], None)?;
    }
    Ok(())
}

/// A value nested `depth` objects deep (serde_json parses no more than 128 levels; the API
/// server stores it under `x-kubernetes-preserve-unknown-fields`).
fn nested(depth: usize) -> Value {
    let mut value = json!({});
    for _ in 1..depth {
        value = json!({ "a": value });
    }
    value
}

const DEEP: usize = 200;

/// Whether the controller reports one deep object of each kind (and one template only: the
/// untrusted namespace's is never listed).
async fn all_reported(pod: &Pod) -> Result<bool> {
    for kind in ["WorkspaceTemplate", "CAPTControlPlane", "Workspace"] {
        if unreadable(pod, kind).await? != 1.0 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Deletes the cluster-scoped Workspace `name` when dropped, whatever the test's outcome:
/// every controller of the environment watches every Workspace.
struct DeleteWorkspace(String);

impl Drop for DeleteWorkspace {
    fn drop(&mut self) {
        let args = [
            "delete",
            "workspaces.tf.upbound.io",
            &self.0,
            "--ignore-not-found",
        ];
        let _ = env().kubectl_run(&args, None);
    }
}

/// Issue 54: objects of every watched kind with a field without a schema, nested 200 deep
/// (serde_json, which kube-rs parses each list page and watch event with, stops at 128):
/// a WorkspaceTemplate in the trusted namespace and one in a tenant's own (never listed),
/// a CAPTControlPlane's `status.workspaceStatus.atProvider`, a Workspace's
/// `spec.forProvider.varmap`. Before the client's layer (`diagnostics/src/guard.rs`) the
/// first list of templates after a restart failed forever and nothing was reconciled.
#[tokio::test]
async fn a_tenants_deep_objects_cost_only_themselves_across_a_restart() -> Result<()> {
    let client = env().client().await?;
    let tenant = TestNamespace::create(&client, "tenant").await?;
    let mallory = TestNamespace::create(&client, "mallory").await?;
    let shard = unique_name("deep");
    let _provider =
        FakeProvider::for_namespace(&tenant.name, 50, "info", &env().kubeconfig).await?;
    let election = Election {
        lease: format!("capt-{shard}"),
        duration_seconds: None,
    };
    // Every namespace, as deployed, trusting the tenant's templates alone.
    let mut pod = Pod::start_in_shard_everywhere("pod-a", &election, &shard, &tenant.name).await?;
    apply_sample_in_shard(env(), &tenant.name, "demo", &shard)?;
    provisioned(&pod, &tenant.name, "demo").await?;

    let label = json!({capt_tests::pod::WATCH_FILTER_LABEL: shard});
    for ns in [&tenant.name, &mallory.name] {
        apply(&json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
            "metadata": {"name": "deep", "namespace": ns},
            "spec": {"template": {"spec": {"forProvider": {"source": "Inline", "module": "#"},
                "deep": nested(DEEP)}}},
        }))
        .context("the API server accepts a deep template")?;
    }
    let mut control_plane = poison_control_plane(&mallory.name, &shard);
    control_plane["metadata"]["name"] = json!("deep");
    control_plane["spec"]["controlPlaneEndpoint"]["port"] = json!(443);
    apply(&control_plane)?;
    let status = json!({"status": {"workspaceStatus": {"atProvider": nested(DEEP)}}});
    let patch = [
        "patch",
        "captcontrolplane",
        "deep",
        "-n",
        &mallory.name,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ];
    env()
        .kubectl_ok(&patch, None)
        .context("the API server accepts a deep status")?;
    let workspace = format!("{}-deep", mallory.name);
    let _workspace = DeleteWorkspace(workspace.clone());
    apply(&json!({
        "apiVersion": "tf.upbound.io/v1beta1", "kind": "Workspace",
        "metadata": {"name": workspace, "labels": label},
        "spec": {"forProvider": {"source": "Inline", "module": "#", "varmap": nested(DEEP)}},
    }))
    .context("the API server accepts a deep Workspace")?;
    // While running, each arrives as a watch event and is reported alone.
    let reported = || all_reported(&pod);
    wait_until("each deep object reported while running", TIMEOUT, reported)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n--- controller log:\n{}", pod.controller_log_text()))?;

    // Restarted, as a pod restart does: the first lists meet them, and so do the
    // status-applier's.
    pod.kill_controller();
    pod.applier.restart().await?;
    pod.start_controller()?;
    wait_until("the restarted controller ready", TIMEOUT, || async {
        Ok(pod.controller_readyz().await?.0 == 200)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n--- controller log:\n{}", pod.controller_log_text()))?;

    // The other tenant's stacks are reconciled: a pause is seen, a new stack provisioned
    // (through the restarted status-applier, whose watches list the deep control plane).
    env().kubectl_ok(
        &[
            "patch",
            "cluster",
            "demo",
            "-n",
            &tenant.name,
            "--type=merge",
            "-p",
            r#"{"spec":{"paused":true}}"#,
        ],
        None,
    )?;
    wait_until(
        "the paused Cluster's CAPTCluster Paused=True",
        TIMEOUT,
        || async {
            let capt_cluster = get(&tenant.name, "captcluster", "demo")?;
            Ok(capt_tests::condition(&capt_cluster, "Paused")
                .is_some_and(|c| c["status"] == "True"))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n--- controller log:\n{}", pod.controller_log_text()))?;
    apply_sample_in_shard(env(), &tenant.name, "second", &shard)?;
    provisioned(&pod, &tenant.name, "second").await?;

    // Each is reported where an operator looks; mallory's template, in a namespace no flag
    // trusts, is never even listed.
    wait_until(
        "each deep object reported after the restart",
        TIMEOUT,
        || all_reported(&pod),
    )
    .await?;
    for (ns, kind) in [
        (&tenant.name, "WorkspaceTemplate"),
        (&mallory.name, "CAPTControlPlane"),
    ] {
        let notes = warnings(ns, "Unreadable", "deep")?;
        ensure!(
            notes
                .iter()
                .any(|n| n.contains(kind) && n.contains("levels deep, over the limit of 100")),
            "a Warning Event on the {kind} naming its depth: {notes:?}"
        );
    }
    ensure!(
        warnings(&mallory.name, "Unreadable", "deep")?
            .iter()
            .all(|n| !n.contains("WorkspaceTemplate")),
        "a template of an untrusted namespace is not listed"
    );
    let log = pod.controller_log_text();
    ensure!(
        log.contains("Object cannot be read") && log.contains(&workspace),
        "the log names the Workspace:\n{log}"
    );
    let (status, body) = pod.controller_readyz().await?;
    ensure!(status == 200, "ready beside them: {body}");
    let applier_log = pod.applier.log_text();
    ensure!(
        applier_log.contains("Object cannot be read")
            && applier_log.contains("levels deep, over the limit of 100"),
        "the status-applier logs the deep control plane:\n{applier_log}"
    );
    Ok(())
}
