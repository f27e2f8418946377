//! A hostile tenant, against the real API server with the controller, the status-applier and
//! the fake Terraform provider as processes (`capt_tests::system::System`), beside real
//! Cluster API core. Each test performs one attack and checks that it is refused, with the
//! condition or Warning Event that says so (`docs/security.md`, "Threat model"):
//!
//! - hole 1: a template naming another team's ProviderConfig, another Terraform state
//!   (`crossplane.io/external-name`, `-backend-config`) or `publishConnectionDetailsTo` is
//!   refused and nothing rendered;
//! - hole 3: a CAPT object whose `spec.workspaceTemplateApplyName` names another stack's
//!   WorkspaceTemplateApply, then deleted, leaves that apply alone; the name is set once;
//! - hole 4: a decoy CAPTControlPlane (or CAPTCluster) labelled with another Cluster's name
//!   gets neither that Cluster's kubeconfig Secret nor anything else of it; a `<cluster>-kubeconfig` Secret the
//!   control plane does not control is left alone;
//! - hole 2: a tenant's value reaches the Workspace only as a Terraform variable's value,
//!   verbatim; a key that is not an identifier is refused by the API server and, where it
//!   gets past it, by the controller; a template with a tenant's key outside its variables,
//!   or an apply with a key its template does not name, renders nothing;
//! - hole 8: an apply waiting for another namespace's Workspace (cluster-scoped, named)
//!   stays waiting, as if it did not exist;
//! - hole 6: templates over the size limit are cached without their bodies and refused;
//! - hole 5: the ServiceAccount, whose RBAC may create Secrets anywhere, creates and changes
//!   only `cluster.x-k8s.io/secret` Secrets named `*-kubeconfig` (an admission policy);
//! - hole 9: a tenant's own template (Terraform, run by the provider every namespace shares)
//!   is refused unless the operator trusts its namespace with code; a template of the trusted
//!   platform namespace renders for the tenant;
//! - hole 10: two tenants' Clusters of one name render two names in Terraform (each carries
//!   its namespace); a hand-written apply setting a name key to another tenant's name (its
//!   prefix, or a bare name an older apply of that tenant holds) is refused;
//! - probes: the ways round that (the provider's token, `local-exec`, `managementPolicies`
//!   without `Delete`, a key swap through a shared template, `TF_CLI_ARGS` in `env`, the
//!   entrypoint trick, `retainWorkspaceOnDelete`), each refused under the defaults. The
//!   `fileset`/`file` loot template runs on the real provider: `tests/tests/real_provider.rs`.
//!
//! Most tests here trust their own namespace (the `System`'s default), so that the checks
//! that hold for a trusted template are what they attack; hole 9 runs untrusted.
//!
//! The negative checks wait for what shows the controller acted (the attacker's deletion
//! completed, its Warning Event), then look at the victim. Every test ends by checking the API
//! server's audit log: our processes (told apart by their User-Agent) sent no request on an
//! object of another namespace, nor on a Workspace not named for the test's namespace. The tests take turns (a mutex):
//! each runs its own processes.

use anyhow::{Context as _, Result};
use capt_controller::api::{TerraformWorkspace, WorkspaceTemplateApply};
use capt_controller::reconcile::{OWNER_KIND_LABEL, OWNER_NAME_LABEL, OWNER_NAMESPACE_LABEL};
use capt_controller::render::workspace_name;
use capt_tests::audit_log::AuditLog;
use capt_tests::fake_provider::FakeProvider;
use capt_tests::system::{
    ALL_NAMESPACES, System, TRUST_TEMPLATES, apply_sample_in_shard, impersonating_kubeconfig,
};
use capt_tests::{TestNamespace, env, install_rbac, unique_name, warnings};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::discovery::ApiResource;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;
use tokio::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

const WAIT: Duration = Duration::from_secs(60);

/// `kubectl apply --server-side` of `docs` (JSON objects).
fn apply(docs: &[Value]) -> Result<()> {
    let text: Vec<String> = docs.iter().map(Value::to_string).collect();
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&text.join("\n")),
    )?;
    Ok(())
}

/// The message of the apply's `Applied=False` condition with `reason`, if it has one.
async fn applied_refusal(
    applies: &Api<WorkspaceTemplateApply>,
    name: &str,
    reason: &str,
) -> Result<Option<String>> {
    let apply = applies.get(name).await?;
    let status = serde_json::to_value(&apply.status)?;
    Ok(status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Applied" && c["reason"] == reason)
        .map(|c| c["message"].as_str().unwrap_or_default().to_owned()))
}

/// Waits until the controller acted on the apply `name`: refused it with `reason` (then
/// `Ok`), or rendered its Workspace (then the test fails, showing the module rendered).
async fn refused_not_rendered(system: &System, ns: &str, name: &str, reason: &str) -> Result<()> {
    let client = env().client().await?;
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), ns);
    let workspaces: Api<TerraformWorkspace> = Api::all(client);
    let ws_name = workspace_name(ns, name);
    let refused = || async {
        Ok::<_, anyhow::Error>(applied_refusal(&applies, name, reason).await?.is_some())
    };
    // The refusal (fixed) or the Workspace (before the fix) shows the controller acted.
    system
        .wait_for("the refusal, or the Workspace", WAIT, || async {
            Ok(refused().await? || workspaces.get_opt(&ws_name).await?.is_some())
        })
        .await?;
    if let Some(ws) = workspaces.get_opt(&ws_name).await? {
        let module = ws.spec_value()["forProvider"]["module"].to_string();
        panic!("{ns}/{name} was rendered into Terraform: {module}");
    }
    assert!(refused().await?, "Applied=False, reason {reason}");
    Ok(())
}

fn dynamic(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn capt_clusters(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = dynamic(
        "infrastructure.cluster.x-k8s.io",
        "v1beta1",
        "CAPTCluster",
        "captclusters",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

fn control_planes(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = dynamic(
        "controlplane.cluster.x-k8s.io",
        "v1beta1",
        "CAPTControlPlane",
        "captcontrolplanes",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// A VPC template `vpc` in `ns` (the fake provider reports a `vpc_id`).
fn vpc_template(ns: &str) -> Value {
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
        "metadata": {"name": "vpc", "namespace": ns},
        "spec": {"template": {"metadata": {"annotations": {"fake.tf.upbound.io/outputs": "{\"vpc_id\": \"vpc-1\"}"}},
                 "spec": {"forProvider": {"source": "Inline", "module": "# vpc"}}}},
    })
}

/// Hole 3. Tenant `evil` creates a CAPTCluster whose `spec.workspaceTemplateApplyName` names
/// the VPC apply of another stack (`victim`) in the same namespace, and deletes it. Before the
/// fix the deletion deleted whatever the name named; now only an apply whose owner labels name
/// the deleted object is deleted (with a uid precondition), and the refusal is a Warning Event.
/// Nothing of another namespace was created, changed, read or deleted by our processes since
/// `audit` (the API server's audit log; their requests carry their User-Agent): what they
/// know of other namespaces comes from cluster-wide watches only.
fn assert_stayed_in(audit: &AuditLog, ns: &str) -> Result<()> {
    let outside: Vec<String> = audit
        .requests_outside(ns, &["capt-controller", "status-applier"])?
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        outside.is_empty(),
        "our processes reached beyond namespace {ns}: {outside:?}"
    );
    Ok(())
}

#[tokio::test]
async fn hole3_deleting_a_capt_object_never_deletes_an_apply_it_does_not_own() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "hostile-apply").await?;
    let audit = AuditLog::from_now()?;
    let system = System::start(&ns.name, 50).await?;
    // The victim's apply, labelled as the controller labels a CAPTCluster's VPC apply.
    let victim = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "victim-vpc", "namespace": ns.name, "labels": {
            OWNER_KIND_LABEL: "CAPTCluster", OWNER_NAME_LABEL: "victim", OWNER_NAMESPACE_LABEL: ns.name}},
        "spec": {"templateRef": {"name": "vpc"}, "variables": {"CLUSTER_NAME": "victim"}},
    });
    apply(&[vpc_template(&ns.name), victim])?;
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), &ns.name);
    let workspaces: Api<TerraformWorkspace> = Api::all(client.clone());
    let victim_ws = workspace_name(&ns.name, "victim-vpc");
    // The controller has seen the victim's apply once it rendered its Workspace.
    system
        .wait_for("the victim's Workspace", WAIT, || async {
            Ok(workspaces.get_opt(&victim_ws).await?.is_some())
        })
        .await?;

    let evil = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
        "metadata": {"name": "evil", "namespace": ns.name},
        "spec": {"region": "ap-northeast-1", "vpcTemplateRef": {"name": "vpc"},
                 "workspaceTemplateApplyName": "victim-vpc"},
    });
    apply(&[evil])?;
    let ccs = capt_clusters(&client, &ns.name);
    system
        .wait_for("the controller's finalizer on evil", WAIT, || async {
            Ok(ccs.get_opt("evil").await?.is_some_and(|c| {
                c.finalizers()
                    .iter()
                    .any(|f| f == capt_controller::api::CAPT_CLUSTER_FINALIZER)
            }))
        })
        .await?;
    ccs.delete("evil", &DeleteParams::default()).await?;
    // The attacker's deletion completed: the controller went through its deletion, whatever
    // path it took.
    system
        .wait_for("evil gone", WAIT, || async {
            Ok(ccs.get_opt("evil").await?.is_none())
        })
        .await?;

    let survivor = applies
        .get_opt("victim-vpc")
        .await?
        .context("the victim's apply still exists")?;
    assert!(
        survivor.meta().deletion_timestamp.is_none(),
        "the victim's apply is being deleted"
    );
    let ws = workspaces
        .get_opt(&victim_ws)
        .await?
        .context("the victim's Workspace still exists")?;
    assert!(ws.meta().deletion_timestamp.is_none());
    // Which path ran: the refusal, told on the attacker.
    let notes = warnings(&ns.name, "WorkspaceTemplateApplyNotOwned", "evil")?;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("victim-vpc") && n.contains("left alone")),
        "a Warning Event on evil says the apply was left alone: {notes:?}"
    );

    applies
        .delete("victim-vpc", &DeleteParams::default())
        .await?;
    system
        .wait_for("the victim's Workspace gone", WAIT, || async {
            Ok(workspaces.get_opt(&victim_ws).await?.is_none())
        })
        .await?;
    assert_stayed_in(&audit, &ns.name)?;
    Ok(())
}

/// Hole 3, the field: `spec.workspaceTemplateApplyName` may be set (on creation, or by the
/// controller once), never changed nor removed, on both kinds. Checked by the API server
/// alone (the CRD's CEL rules), so no controller runs.
#[tokio::test]
async fn hole3_the_apply_name_is_set_once() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "hostile-name").await?;
    let audit = AuditLog::from_now()?;
    let cc = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
        "metadata": {"name": "a", "namespace": ns.name},
        "spec": {"region": "ap-northeast-1", "vpcTemplateRef": {"name": "vpc"}},
    });
    let cp = json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "a", "namespace": ns.name},
        "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "eks"}},
    });
    apply(&[cc, cp])?;
    let params = PatchParams::default();
    for api in [
        capt_clusters(&client, &ns.name),
        control_planes(&client, &ns.name),
    ] {
        let kind = api.resource_url().to_owned();
        let set = |name: Value| Patch::Merge(json!({"spec": {"workspaceTemplateApplyName": name}}));
        api.patch("a", &params, &set(json!("a-own")))
            .await
            .with_context(|| format!("{kind}: setting the name once is allowed"))?;
        for (what, value) in [("changed", json!("victim-vpc")), ("removed", Value::Null)] {
            let refused = api.patch("a", &params, &set(value)).await;
            let err = match refused {
                Err(kube::Error::Api(e)) => e,
                other => panic!("{kind}: the name was {what}: {other:?}"),
            };
            assert_eq!(err.code, 422, "{kind}: {err:?}");
            assert!(
                err.message.contains("workspaceTemplateApplyName"),
                "{kind}: the refusal names the field: {}",
                err.message
            );
        }
        let live = api.get("a").await?;
        assert_eq!(live.data["spec"]["workspaceTemplateApplyName"], "a-own");
    }
    assert_stayed_in(&audit, &ns.name)?;
    Ok(())
}

/// What a watch of `<cluster>-kubeconfig` saw: the controllers (owner uids) of each version,
/// and whether it was deleted.
#[derive(Default)]
struct SecretHistory {
    controllers: Vec<String>,
    deleted: bool,
}

/// Watches the Secret `name` of `ns` from its current version on.
async fn watch_secret(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<Arc<StdMutex<SecretHistory>>> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let current = api.get(name).await?;
    let version = current.resource_version().unwrap_or_default();
    let params = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(290);
    let mut stream = api.watch(&params, &version).await?.boxed();
    let history = Arc::new(StdMutex::new(SecretHistory::default()));
    let seen = history.clone();
    tokio::spawn(async move {
        while let Some(Ok(event)) = stream.next().await {
            let mut h = seen.lock().expect("not poisoned");
            match event {
                WatchEvent::Added(s) | WatchEvent::Modified(s) => {
                    h.controllers.extend(controller_uid(&s));
                }
                WatchEvent::Deleted(_) => h.deleted = true,
                _ => {}
            }
        }
    });
    Ok(history)
}

/// The uid of the Secret's controller owner reference.
fn controller_uid(secret: &Secret) -> Option<String> {
    let refs = secret.owner_references().iter();
    let controller = refs.into_iter().find(|o| o.controller == Some(true));
    controller.map(|o| o.uid.clone())
}

/// Hole 4, the decoy. Beside a provisioned stack (`demo`), tenant creates a CAPTControlPlane
/// `decoy` labelled `cluster.x-k8s.io/cluster-name: demo`, which Cluster `demo` does not name
/// in `spec.controlPlaneRef`. Before the fix the decoy built a control plane for Cluster
/// `demo` and took `demo-kubeconfig` over (its owner reference replaced by the decoy's, so
/// that the decoy's deletion would have the garbage collector delete it). Now the decoy gets
/// nothing of `demo`, and a Warning Event says why.
#[tokio::test]
async fn hole4_a_decoy_control_plane_gets_nothing_of_the_cluster_it_names() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "hostile-decoy").await?;
    let audit = AuditLog::from_now()?;
    let system = System::start(&ns.name, 50).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let cps = control_planes(&client, &ns.name);
    let demo_uid = cps.get("demo").await?.uid().context("uid")?;
    system
        .wait_for("demo-kubeconfig, controlled by demo", WAIT, || async {
            let secret = secrets.get_opt("demo-kubeconfig").await?;
            Ok(secret.and_then(|s| controller_uid(&s)) == Some(demo_uid.clone()))
        })
        .await?;
    let history = watch_secret(&client, &ns.name, "demo-kubeconfig").await?;

    let decoy = json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "decoy", "namespace": ns.name,
                     "labels": {"cluster.x-k8s.io/cluster-name": "demo"}},
        "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "eks"},
                 "controlPlaneConfig": {"region": "ap-northeast-1"}},
    });
    apply(&[decoy])?;
    let taken = || {
        let h = history.lock().expect("not poisoned");
        h.deleted || h.controllers.iter().any(|c| *c != demo_uid)
    };
    // Either the refusal (fixed) or the takeover (before the fix) shows the controller acted.
    system
        .wait_for(
            "the decoy refused, or demo-kubeconfig taken",
            WAIT,
            || async {
                let refused =
                    !warnings(&ns.name, "ClusterDoesNotReferenceControlPlane", "decoy")?.is_empty();
                Ok(refused || taken())
            },
        )
        .await?;
    assert!(!taken(), "the decoy took demo-kubeconfig over");
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), &ns.name);
    assert!(
        applies.get_opt("decoy-controlplane").await?.is_none(),
        "the decoy got a WorkspaceTemplateApply for Cluster demo"
    );

    // The same for the infrastructure: a decoy CAPTCluster labelled demo would have its VPC
    // built by Terraform with CLUSTER_NAME=demo.
    let decoy_vpc = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
        "metadata": {"name": "decoy", "namespace": ns.name,
                     "labels": {"cluster.x-k8s.io/cluster-name": "demo"}},
        "spec": {"region": "ap-northeast-1", "vpcTemplateRef": {"name": "vpc"}},
    });
    apply(&[decoy_vpc])?;
    system
        .wait_for("the decoy VPC refused, or built", WAIT, || async {
            let refused =
                !warnings(&ns.name, "ClusterDoesNotReferenceInfrastructure", "decoy")?.is_empty();
            Ok(refused || applies.get_opt("decoy-vpc").await?.is_some())
        })
        .await?;
    assert!(
        applies.get_opt("decoy-vpc").await?.is_none(),
        "the decoy CAPTCluster got a VPC apply for Cluster demo"
    );
    let ccs = capt_clusters(&client, &ns.name);
    ccs.delete("decoy", &DeleteParams::default()).await?;

    // The decoy's deletion takes nothing of demo with it.
    cps.delete("decoy", &DeleteParams::default()).await?;
    system
        .wait_for("the decoys gone", WAIT, || async {
            Ok(cps.get_opt("decoy").await?.is_none() && ccs.get_opt("decoy").await?.is_none())
        })
        .await?;
    let secret = secrets
        .get_opt("demo-kubeconfig")
        .await?
        .context("demo-kubeconfig survives the decoy")?;
    assert_eq!(controller_uid(&secret), Some(demo_uid.clone()));
    assert!(!taken(), "demo-kubeconfig was taken or deleted");
    let cluster = system.get(&["cluster", "demo"])?.context("Cluster demo")?;
    assert!(
        cluster["spec"]["controlPlaneEndpoint"]["host"].is_string(),
        "demo keeps its endpoint: {}",
        cluster["spec"]
    );
    assert_stayed_in(&audit, &ns.name)?;
    Ok(())
}

/// Hole 4, the Secret. Tenant provides `demo-kubeconfig` of type `cluster.x-k8s.io/secret`
/// itself, controlled by no one, before the stack `demo` provisions. Before the fix the
/// controller overwrote it (value, label, owner reference); now a Secret this control plane
/// does not control is left alone, and a Warning Event on the control plane says so.
#[tokio::test]
async fn hole4_a_kubeconfig_secret_the_control_plane_does_not_control_is_left_alone() -> Result<()>
{
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "hostile-secret").await?;
    let audit = AuditLog::from_now()?;
    let system = System::start(&ns.name, 50).await?;
    let theirs = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "demo-kubeconfig", "namespace": ns.name},
        "type": "cluster.x-k8s.io/secret",
        "stringData": {"value": "the tenant's own kubeconfig"},
    });
    apply(&[theirs])?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let before = secrets.get("demo-kubeconfig").await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    let changed =
        |s: &Secret| s.data != before.data || s.owner_references() != before.owner_references();
    system
        .wait_for("the refusal, or demo-kubeconfig written", WAIT, || async {
            let refused = !warnings(&ns.name, "KubeconfigSecretNotControlled", "demo")?.is_empty();
            let written = secrets.get("demo-kubeconfig").await.map(|s| changed(&s))?;
            Ok(refused || written)
        })
        .await?;
    let after = secrets.get("demo-kubeconfig").await?;
    // Compared, never printed: Secret data stays out of test output too.
    assert!(
        after.data == before.data,
        "the tenant's kubeconfig was overwritten"
    );
    assert!(
        after.owner_references().is_empty(),
        "the tenant's Secret gained owners: {:?}",
        after.owner_references()
    );
    let notes = warnings(&ns.name, "KubeconfigSecretNotControlled", "demo")?;
    assert!(
        notes.iter().any(|n| n.contains("demo-kubeconfig")),
        "{notes:?}"
    );
    assert_stayed_in(&audit, &ns.name)?;
    Ok(())
}

/// The injection of hole 2: a Kubernetes version that closes the module's string and block
/// and opens a resource of its own.
const INJECTION: &str = r#"1.31" } resource "null_resource" "x" {"#;

/// The WorkspaceTemplateApply CRD as it was before keys had a shape, applied for the
/// test's duration: how an apply with a key the CRD now refuses gets past the API server
/// (a CRD installed without the rule, an apply stored before). Put back on drop.
struct RelaxedApplyCrd;

const APPLY_CRD: &str =
    "manifests/crds/workspacetemplateapplies.infrastructure.cluster.x-k8s.io.yaml";

impl RelaxedApplyCrd {
    fn apply() -> Result<Self> {
        let path = capt_tests::repo_root().join(APPLY_CRD);
        let mut crd: Value = serde_yaml::from_str(&std::fs::read_to_string(path)?)?;
        let variables = &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
            ["spec"]["properties"]["variables"];
        let variables = variables.as_object_mut().context("variables' schema")?;
        variables
            .remove("x-kubernetes-validations")
            .context("the CRD has the rule on keys")?;
        // As the test environment installed it (`hack/testenv.sh`, manager `testenv`): the
        // CRD's `spec.versions` is one atomic list, which another manager could not change.
        env().kubectl_ok(
            &[
                "apply",
                "--server-side",
                "--field-manager=testenv",
                "-f",
                "-",
            ],
            Some(&crd.to_string()),
        )?;
        Ok(Self)
    }
}

impl Drop for RelaxedApplyCrd {
    fn drop(&mut self) {
        let path = capt_tests::repo_root().join(APPLY_CRD);
        let _ = env().kubectl_ok(
            &[
                "apply",
                "--server-side",
                "--field-manager=testenv",
                "-f",
                &path.display().to_string(),
            ],
            None,
        );
    }
}

/// Hole 2. A tenant's value is a value: the apply's `KUBERNETES_VERSION` reaches the Workspace
/// only as the value of the template's variable (`forProvider.vars`), which provider-terraform
/// hands to Terraform as a variable, never as HCL, so the injection
/// `1.31" } resource "null_resource" "x" {` is stored and rendered verbatim there and the
/// module stays the template's. (Before the fix it was pasted into the module; the CRD and a
/// plain-literal check kept it out, and with it every CIDR and ARN.) The CAPT object's
/// `spec.version` keeps its pattern. A key that is not an identifier (`local.bucket`, which
/// replaced the platform module's own text) is refused by the API server and, where it gets
/// past it, by the controller: `Applied=False`, reason `UnsafeVariable`, a Warning Event.
#[tokio::test]
async fn hole2_a_value_reaches_terraform_as_a_variable_never_as_code() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "hostile-inject").await?;
    let audit = AuditLog::from_now()?;
    let system = System::start(&ns.name, 50).await?;

    // Through the CAPT object: its version's pattern holds.
    let cp = json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "demo", "namespace": ns.name},
        "spec": {"version": INJECTION, "workspaceTemplateRef": {"name": "eks"}},
    });
    let created = control_planes(&client, &ns.name)
        .create(&PostParams::default(), &serde_json::from_value(cp)?)
        .await;
    match created {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert!(e.message.contains("spec.version"), "{}", e.message);
        }
        other => panic!("a CAPTControlPlane with an injected version was stored: {other:?}"),
    }

    // Through an apply: a value of the template's variable, verbatim.
    let module = "variable \"kubernetes_version\" {}\nmodule \"eks\" {\n  version = var.kubernetes_version\n}\n";
    let template = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
        "metadata": {"name": "eks", "namespace": ns.name},
        "spec": {"template": {"spec": {"forProvider": {"source": "Inline", "module": module,
                 "vars": [{"key": "kubernetes_version", "value": "${KUBERNETES_VERSION}"}]}}}},
    });
    let injected = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "injected", "namespace": ns.name},
        "spec": {"templateRef": {"name": "eks"}, "variables": {"KUBERNETES_VERSION": INJECTION}},
    });
    apply(&[template, injected])?;
    let workspaces: Api<TerraformWorkspace> = Api::all(client.clone());
    let rendered = workspace_name(&ns.name, "injected");
    system
        .wait_for("the Workspace", WAIT, || async {
            Ok(workspaces.get_opt(&rendered).await?.is_some())
        })
        .await?;
    let spec = workspaces.get(&rendered).await?.spec_value();
    let text = spec["forProvider"]["module"].as_str().unwrap_or_default();
    assert!(
        text.starts_with(module) && !text.contains("null_resource"),
        "{text}"
    );
    assert_eq!(
        spec["forProvider"]["vars"],
        json!([{"key": "kubernetes_version", "value": INJECTION}])
    );

    // A key that would address the module's own text: refused where it enters, and by the
    // controller where it gets past the API server.
    let swapped = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "swapped", "namespace": ns.name},
        "spec": {"templateRef": {"name": "eks"},
                 "variables": {"KUBERNETES_VERSION": "1.31", "var.kubernetes_version": "x"}},
    });
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), &ns.name);
    let refused = applies
        .create(
            &PostParams::default(),
            &serde_json::from_value(swapped.clone())?,
        )
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(e)) if e.code == 422 && e.message.contains("identifier")),
        "an apply with a key that is not an identifier was stored: {refused:?}"
    );
    let relaxed = RelaxedApplyCrd::apply()?;
    // The API server takes a CRD's new schema on shortly; no object reports when.
    system
        .wait_for("the apply stored under the relaxed CRD", WAIT, || async {
            let body = serde_json::from_value(swapped.clone())?;
            Ok(applies.create(&PostParams::default(), &body).await.is_ok())
        })
        .await?;
    drop(relaxed);
    refused_not_rendered(&system, &ns.name, "swapped", "UnsafeVariable").await?;
    let notes = warnings(&ns.name, "UnsafeVariable", "swapped")?;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("\"var.kubernetes_version\"")),
        "{notes:?}"
    );
    assert_stayed_in(&audit, &ns.name)?;
    Ok(())
}

/// Hole 2, through a shared template: a tenant's key placed anywhere but a variable's value
/// would be text of the platform's module. A template with `value = ${NAME}` in its module
/// and a tenant's apply whose value is `var.platform_token` would hand the tenant the
/// platform's variable as an output. The controller renders nothing: `Applied=False`, reason
/// `PlaceholderOutsideVariables`, a Warning Event naming the template and the field. A key
/// the template names nowhere (`BUCKET`) is refused the same way, reason
/// `UndeclaredVariable`. (Before the fix the Workspace carried `value = var.platform_token`;
/// a placeholder inside a string, or in an inline JSON module, was pasted.)
#[tokio::test]
async fn hole2_a_key_outside_the_templates_variables_is_refused() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "hostile-code").await?;
    let audit = AuditLog::from_now()?;
    let system = System::start(&ns.name, 50).await?;
    let module = "variable \"platform_token\" {\n  default = \"not for tenants\"\n}\n\
                  output \"name\" {\n  value = ${NAME}\n}\n";
    let template = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
        "metadata": {"name": "unquoted", "namespace": ns.name},
        "spec": {"template": {"spec": {"forProvider": {"source": "Inline", "module": module}}}},
    });
    let json_module = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
        "metadata": {"name": "json", "namespace": ns.name},
        "spec": {"template": {"spec": {"forProvider": {"source": "Inline", "inlineFormat": "JSON",
                 "module": "{\"output\": {\"name\": {\"value\": \"${NAME}\"}}}"}}}},
    });
    let of = |name: &str, template: &str, variables: Value| {
        json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
            "metadata": {"name": name, "namespace": ns.name},
            "spec": {"templateRef": {"name": template}, "variables": variables},
        })
    };
    apply(&[
        template,
        json_module,
        of(
            "reference",
            "unquoted",
            json!({"NAME": "var.platform_token"}),
        ),
        of("in-json", "json", json!({"NAME": "${var.platform_token}"})),
        of("undeclared", "json", json!({"BUCKET": "x"})),
    ])?;
    for (name, template) in [("reference", "unquoted"), ("in-json", "json")] {
        refused_not_rendered(&system, &ns.name, name, "PlaceholderOutsideVariables").await?;
        let notes = warnings(&ns.name, "PlaceholderOutsideVariables", name)?;
        assert!(
            notes
                .iter()
                .any(|n| n.contains(&format!("{}/{template}", ns.name))
                    && n.contains("${NAME}")
                    && n.contains("forProvider.module")),
            "{notes:?}"
        );
    }
    refused_not_rendered(&system, &ns.name, "undeclared", "UndeclaredVariable").await?;
    let notes = warnings(&ns.name, "UndeclaredVariable", "undeclared")?;
    assert!(notes.iter().any(|n| n.contains("BUCKET")), "{notes:?}");
    assert_stayed_in(&audit, &ns.name)?;
    Ok(())
}

/// Hole 1. A tenant's template names the credentials, the Terraform state or where outputs
/// go: another team's ProviderConfig, Crossplane's `default` once the operator named the
/// namespace's own, `crossplane.io/external-name` (another workspace's state in the
/// backend), a `-backend-config` init argument, `publishConnectionDetailsTo`. Each is
/// refused (`Applied=False`, reason `WorkspaceNotAllowed`, a Warning Event naming the field)
/// and no Workspace is rendered; the namespace's own ProviderConfig renders. Before the fix
/// every one was rendered.
#[tokio::test]
async fn hole1_a_template_chooses_neither_credentials_nor_state_nor_where_outputs_go() -> Result<()>
{
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "hostile-render").await?;
    let audit = AuditLog::from_now()?;
    let own_config = format!("{}=tenant-config", ns.name);
    let system =
        System::start_with(&ns.name, 50, &["--allow-provider-config", &own_config]).await?;
    let workspaces: Api<TerraformWorkspace> = Api::all(client.clone());
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), &ns.name);
    let module = json!({"source": "Inline", "module": "# hole 1"});
    // (name, template spec, template annotations, the field the refusal names; None: renders)
    let cases = [
        (
            "own",
            json!({"providerConfigRef": {"name": "tenant-config"}, "forProvider": module}),
            json!({}),
            None,
        ),
        (
            "other",
            json!({"providerConfigRef": {"name": "team-b"}, "forProvider": module}),
            json!({}),
            Some("spec.providerConfigRef"),
        ),
        (
            "default",
            json!({"forProvider": module}),
            json!({}),
            Some("spec.providerConfigRef"),
        ),
        (
            "state",
            json!({"providerConfigRef": {"name": "tenant-config"}, "forProvider": module}),
            json!({"crossplane.io/external-name": "team-b-eks"}),
            Some("crossplane.io/external-name"),
        ),
        (
            "backend",
            json!({"providerConfigRef": {"name": "tenant-config"},
            "forProvider": {"source": "Inline", "module": "# x", "initArgs": ["-backend-config=secret_suffix=team-b-eks"]}}),
            json!({}),
            Some("spec.forProvider.initArgs[0]"),
        ),
        (
            "publish",
            json!({"providerConfigRef": {"name": "tenant-config"}, "forProvider": module,
            "publishConnectionDetailsTo": {"name": "eks", "configRef": {"name": "vault"}}}),
            json!({}),
            Some("spec.publishConnectionDetailsTo"),
        ),
    ];
    for (name, spec, annotations, _) in &cases {
        apply(&[
            json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
                "metadata": {"name": name, "namespace": ns.name},
                "spec": {"template": {"metadata": {"annotations": annotations}, "spec": spec}},
            }),
            json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
                "metadata": {"name": name, "namespace": ns.name},
                "spec": {"templateRef": {"name": name}, "variables": {"CLUSTER_NAME": name}},
            }),
        ])?;
    }
    let refused = |name: &'static str| {
        let applies = applies.clone();
        async move {
            Ok::<_, anyhow::Error>(
                applied_refusal(&applies, name, "WorkspaceNotAllowed")
                    .await?
                    .is_some(),
            )
        }
    };
    for (name, _, _, field) in cases {
        let ws_name = workspace_name(&ns.name, name);
        // The refusal (fixed) or the Workspace (before the fix) shows the controller acted.
        system
            .wait_for(
                &format!("apply {name} refused or rendered"),
                WAIT,
                || async {
                    Ok(refused(name).await? || workspaces.get_opt(&ws_name).await?.is_some())
                },
            )
            .await?;
        let rendered = workspaces.get_opt(&ws_name).await?;
        match field {
            None => {
                let ws = rendered.context("the namespace's own ProviderConfig renders")?;
                assert_eq!(
                    ws.spec_value()["providerConfigRef"]["name"],
                    "tenant-config"
                );
            }
            Some(field) => {
                assert!(rendered.is_none(), "apply {name}: a Workspace was rendered");
                assert!(
                    refused(name).await?,
                    "apply {name}: Applied=False, WorkspaceNotAllowed"
                );
                let notes = warnings(&ns.name, "WorkspaceNotAllowed", name)?;
                assert!(
                    notes.iter().any(|n| n.contains(field)),
                    "apply {name}: {notes:?}"
                );
            }
        }
    }
    assert_stayed_in(&audit, &ns.name)?;
    Ok(())
}

/// Hole 8 (`waitForWorkspaces`). Workspaces are cluster-scoped, so an apply could wait for
/// another namespace's Workspace by its name, learn when it is ready, and render then. Only
/// a Workspace rendered for an apply of the waiting apply's namespace counts: another
/// namespace's Ready Workspace leaves it waiting, with the message it would have if that
/// Workspace did not exist. Before the fix the apply rendered at once.
#[tokio::test]
async fn hole8_an_apply_cannot_wait_for_another_namespaces_workspace() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "hostile-wait").await?;
    let audit = AuditLog::from_now()?;
    let victim = TestNamespace::create(&client, "hostile-waited").await?;
    let system = System::start(&ns.name, 50).await?;
    // The victim's Workspace as the controller renders it, Ready as the provider reports it.
    let victim_ws = workspace_name(&victim.name, "eks");
    let workspaces: Api<TerraformWorkspace> = Api::all(client.clone());
    let ws = json!({
        "apiVersion": "tf.upbound.io/v1beta1", "kind": "Workspace",
        "metadata": {"name": victim_ws, "labels": {
            capt_controller::render::APPLY_NAMESPACE_LABEL: victim.name,
            capt_controller::render::APPLY_NAME_LABEL: "eks"}},
        "spec": {"forProvider": {"source": "Inline", "module": "# victim"}},
    });
    workspaces
        .create(&PostParams::default(), &serde_json::from_value(ws)?)
        .await?;
    let ready = json!({"apiVersion": "tf.upbound.io/v1beta1", "kind": "Workspace",
        "status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "Available", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Synced", "status": "True", "reason": "ReconcileSuccess", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    workspaces
        .patch_status(
            &victim_ws,
            &PatchParams::apply("hostile-tenant-test").force(),
            &Patch::Apply(&ready),
        )
        .await?;
    let template = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
        "metadata": {"name": "eks", "namespace": ns.name},
        "spec": {"template": {"spec": {"forProvider": {"source": "Inline", "module": "# tenant"}}}},
    });
    let waiting = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "eks", "namespace": ns.name},
        "spec": {"templateRef": {"name": "eks"}, "waitForWorkspaces": [{"name": victim_ws}]},
    });
    apply(&[template, waiting])?;
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), &ns.name);
    let own_ws = workspace_name(&ns.name, "eks");
    let message = || applied_refusal(&applies, "eks", "WaitingForWorkspaces");
    // Waiting (fixed) or rendered (before the fix) shows the controller decided.
    system
        .wait_for("the apply waiting, or its Workspace", WAIT, || async {
            Ok(message().await?.is_some() || workspaces.get_opt(&own_ws).await?.is_some())
        })
        .await?;
    assert!(
        workspaces.get_opt(&own_ws).await?.is_none(),
        "the apply rendered on another namespace's Ready Workspace"
    );
    assert_eq!(
        message().await?.as_deref(),
        Some(
            format!(
                "Workspace {victim_ws} of an apply of namespace {} is not ready yet",
                ns.name
            )
            .as_str()
        )
    );
    workspaces
        .delete(&victim_ws, &DeleteParams::default())
        .await?;
    assert_stayed_in(&audit, &ns.name)?;
    Ok(())
}

/// The resident memory of a process, in MiB.
fn rss_mib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .context("VmRSS")?
        .parse()?;
    Ok(kib / 1024.0)
}

/// Hole 6. Templates are the tenant's and every one is cached by the shared controller:
/// before the fix, templates of 1 MiB each stayed whole in its memory (a hundred of 1.5 MB
/// crash-looped it). A template over the limit (256 KiB) is now cached without its body,
/// and an apply that uses it is refused (`Applied=False`, reason `TemplateTooLarge`).
#[tokio::test]
async fn hole6_a_tenants_oversized_templates_cost_the_controller_no_memory() -> Result<()> {
    const TEMPLATES: usize = 48;
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "hostile-size").await?;
    let audit = AuditLog::from_now()?;
    let system = System::start(&ns.name, 50).await?;
    let before = rss_mib(system.controller_pid())?;
    // 1 MiB of module each (the API server takes up to 3 MiB a request, etcd 1.5 MiB).
    let module = format!("# {}", "x".repeat(1024 * 1024));
    for i in 0..TEMPLATES {
        apply(&[json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
            "metadata": {"name": format!("large-{i}"), "namespace": ns.name},
            "spec": {"template": {"spec": {"forProvider": {"source": "Inline", "module": module}}}},
        })])?;
    }
    // Created after every template: once the controller has the last one, it has them all
    // (one watch, in order).
    let last = format!("large-{}", TEMPLATES - 1);
    apply(&[json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "large", "namespace": ns.name},
        "spec": {"templateRef": {"name": last}},
    })])?;
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), &ns.name);
    let workspaces: Api<TerraformWorkspace> = Api::all(client.clone());
    let ws_name = workspace_name(&ns.name, "large");
    let refused = || applied_refusal(&applies, "large", "TemplateTooLarge");
    system
        .wait_for("the refusal, or the Workspace", WAIT, || async {
            Ok(refused().await?.is_some() || workspaces.get_opt(&ws_name).await?.is_some())
        })
        .await?;
    let after = rss_mib(system.controller_pid())?;
    // Whole, the templates are 48 MiB in the cache; without their bodies only what
    // deserializing them left in the allocator remains.
    let grown = after - before;
    eprintln!(
        "controller RSS {before:.1} MiB → {after:.1} MiB after {TEMPLATES} templates of 1 MiB"
    );
    assert!(
        grown < TEMPLATES as f64 / 2.0,
        "the controller grew by {grown:.1} MiB for {TEMPLATES} MiB of templates it does not render"
    );
    assert!(
        workspaces.get_opt(&ws_name).await?.is_none(),
        "an oversized template was rendered"
    );
    let message = refused()
        .await?
        .context("Applied=False, TemplateTooLarge")?;
    assert!(
        message.contains(&last) && message.contains("262144"),
        "{message}"
    );
    assert_stayed_in(&audit, &ns.name)?;
    Ok(())
}

/// Hole 5. The ServiceAccount may `create` and `get` Secrets in every namespace (RBAC cannot
/// limit `create` by name): without more, it could create a `kubernetes.io/service-account-token`
/// Secret for any ServiceAccount and read the token the API server fills in. With the
/// manifests' ValidatingAdmissionPolicy (`manifests/deploy/secret-policy.yaml`) the account
/// creates and changes only Secrets of type `cluster.x-k8s.io/secret` named `*-kubeconfig`;
/// others, administrators included, are not limited by it.
#[tokio::test]
async fn hole5_the_service_account_writes_only_kubeconfig_secrets() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "hostile-sa").await?;
    let audit = AuditLog::from_now()?;
    install_rbac()?;
    let user = "system:serviceaccount:capt-system:capt-controller";
    let dir = capt_tests::Scratch::new(&ns.name)?;
    let kubeconfig = impersonating_kubeconfig(user, &dir)?;
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::config::Kubeconfig::read_from(&kubeconfig)?;
    let account =
        kube::Client::try_from(kube::Config::from_custom_kubeconfig(config, &options).await?)?;
    let as_account: Api<Secret> = Api::namespaced(account, &ns.name);
    let as_admin: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let secret = |name: &str, type_: &str, annotations: Value| -> Result<Secret> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": ns.name, "annotations": annotations},
            "type": type_,
        }))?)
    };
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let token = secret(
        "admin-token",
        "kubernetes.io/service-account-token",
        json!({"kubernetes.io/service-account.name": "default"}),
    )?;
    // The API server enforces a policy once it has loaded it, which no object reports: ask
    // (dry runs, which store nothing) until the account's token Secret is refused, bounded.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let refusal = loop {
        match as_account.create(&dry, &token).await {
            Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => break e,
            Err(e) => return Err(e.into()),
            Ok(_) if std::time::Instant::now() > deadline => {
                panic!("the account may create a service-account-token Secret")
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert!(
        refusal.message.contains("cluster.x-k8s.io/secret"),
        "{}",
        refusal.message
    );
    // For real, too: nothing is created, so there is no token to read.
    let created = as_account.create(&PostParams::default(), &token).await;
    assert!(
        matches!(&created, Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422),
        "{created:?}"
    );
    assert!(as_admin.get_opt("admin-token").await?.is_none());
    for (name, type_) in [
        ("x-kubeconfig", "Opaque"),
        ("x-kubeconfig", "kubernetes.io/dockerconfigjson"),
        ("other", "cluster.x-k8s.io/secret"),
    ] {
        let s = secret(name, type_, json!({}))?;
        let denied = as_account.create(&dry, &s).await;
        assert!(
            matches!(&denied, Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422),
            "{name} of type {type_}: {denied:?}"
        );
    }
    // What the controller writes still passes (RBAC and the policy), created and patched.
    let kubeconfig_secret = secret("demo-kubeconfig", "cluster.x-k8s.io/secret", json!({}))?;
    as_account
        .create(&PostParams::default(), &kubeconfig_secret)
        .await
        .context("the account creates <cluster>-kubeconfig")?;
    let label =
        Patch::Merge(json!({"metadata": {"labels": {"cluster.x-k8s.io/cluster-name": "demo"}}}));
    as_account
        .patch("demo-kubeconfig", &PatchParams::default(), &label)
        .await
        .context("the account patches <cluster>-kubeconfig")?;
    // An administrator's Secret of any type is not the policy's business.
    let opaque = secret("admins", "Opaque", json!({}))?;
    as_admin.create(&PostParams::default(), &opaque).await?;
    // Nor may the account change a Secret it did not make into something else.
    let denied = as_account
        .patch("admins", &PatchParams::default(), &label)
        .await;
    assert!(
        matches!(&denied, Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422),
        "{denied:?}"
    );
    assert_stayed_in(&audit, &ns.name)?;
    Ok(())
}

/// The value of the Terraform variable `key` in the Workspace `name`, if rendered.
async fn rendered_var(name: &str, key: &str) -> Result<Option<String>> {
    let workspaces: Api<TerraformWorkspace> = Api::all(env().client().await?);
    let Some(ws) = workspaces.get_opt(name).await? else {
        return Ok(None);
    };
    let spec = ws.spec_value();
    let vars = spec["forProvider"]["vars"].as_array().cloned();
    Ok(vars
        .into_iter()
        .flatten()
        .find(|v| v["key"] == key)
        .and_then(|v| v["value"].as_str().map(str::to_owned)))
}

/// Hole 10, names. Tenants `a` and `b` each create a Cluster named `prod` beside the other,
/// under one ProviderConfig (the default), with one controller managing both namespaces.
/// Before the fix both control planes rendered `cluster_name = "prod"` (and both VPCs the same
/// name): two tenants' Terraform naming one EKS cluster in the platform's account, so that the
/// second fails on the first's, or its tags and lookups find the first's. Now each name
/// carries its namespace, `<a>_prod` and `<b>_prod`. Then tenant `b` writes applies of its
/// own: one whose `CLUSTER_NAME` is `a`'s name (`<a>_prod`), and one whose `CLUSTER_NAME` is a
/// bare name an older apply of `a` holds (as the applies of a Cluster provisioned before
/// names carried their namespace do). Both are refused, `Applied=False` with reason
/// `PlatformNameOfAnother` and a Warning Event, and render no Workspace.
#[tokio::test]
async fn hole10_two_tenants_clusters_of_one_name_render_two_names_and_neither_takes_the_others()
-> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let a = TestNamespace::create(&client, "hostile-names-a").await?;
    let b = TestNamespace::create(&client, "hostile-names-b").await?;
    let audit = AuditLog::from_now()?;
    // One controller for both namespaces, as deployed (confined to this test's objects by a
    // shard of its own); each namespace's templates trusted, each namespace's Workspaces
    // played by a fake provider.
    let shard = unique_name("names");
    let args = [
        ALL_NAMESPACES,
        "--watch-filter",
        &shard,
        TRUST_TEMPLATES,
        &a.name,
        TRUST_TEMPLATES,
        &b.name,
    ];
    let system = System::start_with(&a.name, 50, &args).await?;
    let _provider_b = FakeProvider::for_namespace(&b.name, 50, "info", &env().kubeconfig).await?;
    for ns in [&a.name, &b.name] {
        apply_sample_in_shard(env(), ns, "prod", &shard)?;
    }
    let control_plane_ws = |ns: &str| workspace_name(ns, "prod-controlplane");
    system
        .wait_for("both control planes' Workspaces", WAIT, || async {
            Ok(rendered_var(&control_plane_ws(&a.name), "cluster_name")
                .await?
                .is_some()
                && rendered_var(&control_plane_ws(&b.name), "cluster_name")
                    .await?
                    .is_some())
        })
        .await?;
    let mut names = Vec::new();
    for ns in [&a.name, &b.name] {
        let eks = rendered_var(&control_plane_ws(ns), "cluster_name").await?;
        let vpc = rendered_var(&workspace_name(ns, "prod-vpc"), "cluster_name").await?;
        let expected = capt_tests::eks_name(ns, "prod");
        assert_eq!(
            eks.as_deref(),
            Some(expected.as_str()),
            "{ns}: the EKS name"
        );
        assert_eq!(vpc.as_deref(), Some(expected.as_str()), "{ns}: the VPC's");
        names.push(expected);
    }
    assert_ne!(names[0], names[1], "two tenants' Clusters render two names");

    // Tenant b takes a's name, by a's prefix.
    let applies_b: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), &b.name);
    let hand_written = |ns: &str, name: &str, cluster_name: &str| {
        json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
            "metadata": {"name": name, "namespace": ns,
                         "labels": {"cluster.x-k8s.io/watch-filter": shard}},
            "spec": {"templateRef": {"name": "vpc"},
                     "variables": {"CLUSTER_NAME": cluster_name, "REGION": "ap-northeast-1"}},
        })
    };
    apply(&[hand_written(&b.name, "steal-prefixed", &names[0])])?;
    refused_not_rendered(&system, &b.name, "steal-prefixed", "PlatformNameOfAnother").await?;
    let message = applied_refusal(&applies_b, "steal-prefixed", "PlatformNameOfAnother")
        .await?
        .unwrap_or_default();
    assert!(
        message.contains("CLUSTER_NAME") && message.contains(&format!("namespace {}", a.name)),
        "the refusal names the key and whose name it is: {message}"
    );
    let notes = warnings(&b.name, "PlatformNameOfAnother", "steal-prefixed")?;
    assert!(!notes.is_empty(), "a Warning Event on the apply");

    // A bare name a holds (its apply older): b's apply of it is refused too.
    apply(&[hand_written(&a.name, "legacy", "legacy-prod")])?;
    system
        .wait_for("a's apply of a bare name rendered", WAIT, || async {
            Ok(
                rendered_var(&workspace_name(&a.name, "legacy"), "cluster_name")
                    .await?
                    .is_some(),
            )
        })
        .await?;
    apply(&[hand_written(&b.name, "steal-bare", "legacy-prod")])?;
    refused_not_rendered(&system, &b.name, "steal-bare", "PlatformNameOfAnother").await?;
    let notes = warnings(&b.name, "PlatformNameOfAnother", "steal-bare")?;
    assert!(!notes.is_empty(), "a Warning Event on the apply");
    // b's own name renders. (Were the two applies created in the same second, the older is
    // the one of the namespace whose name sorts first: a's.)
    apply(&[hand_written(
        &b.name,
        "own",
        &capt_tests::eks_name(&b.name, "other"),
    )])?;
    system
        .wait_for("b's apply of its own name rendered", WAIT, || async {
            Ok(
                rendered_var(&workspace_name(&b.name, "own"), "cluster_name")
                    .await?
                    .is_some(),
            )
        })
        .await?;
    // Nothing outside the two namespaces was reached.
    let outside = |ns: &str| -> Result<Vec<String>> {
        let requests = audit.requests_outside(ns, &["capt-controller", "status-applier"])?;
        Ok(requests.iter().map(ToString::to_string).collect())
    };
    let beyond_b = outside(&b.name)?;
    let beyond_both: Vec<String> = outside(&a.name)?
        .into_iter()
        .filter(|r| beyond_b.contains(r))
        .collect();
    assert!(
        beyond_both.is_empty(),
        "our processes reached beyond the two namespaces: {beyond_both:?}"
    );
    Ok(())
}

/// Hole 9. A tenant writes a template in its own namespace, the `fileset`/`file` loot module of
/// `tests/tests/real_provider.rs` (which there reads every other stack's credential files), and
/// an apply of it. Under the default (only the platform namespace trusted) it is refused:
/// `Applied=False` and `TemplateTrusted=False`, reason `TemplateNotTrusted`, a Warning Event
/// saying how an operator would trust the namespace, and no Workspace. The same tenant's apply
/// of the platform namespace's template renders. Before the fix the own template rendered.
#[tokio::test]
async fn hole9_a_tenants_own_template_is_refused_unless_its_namespace_is_trusted() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "hostile-own").await?;
    let platform = TestNamespace::create(&client, "hostile-platform").await?;
    let audit = AuditLog::from_now()?;
    let system =
        System::start_with(&ns.name, 50, &[TRUST_TEMPLATES, platform.name.as_str()]).await?;
    let loot =
        "output \"neighbours\" {\n  value = fileset(abspath(\"${path.module}/..\"), \"*/*\")\n}\n";
    let template = |namespace: &str| {
        json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
            "metadata": {"name": "loot", "namespace": namespace},
            "spec": {"template": {"spec": {"forProvider": {"source": "Inline", "module": loot}}}},
        })
    };
    let own = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "own", "namespace": ns.name},
        "spec": {"templateRef": {"name": "loot"}},
    });
    apply(&[template(&ns.name), own])?;
    refused_not_rendered(&system, &ns.name, "own", "TemplateNotTrusted").await?;
    let notes = warnings(&ns.name, "TemplateNotTrusted", "own")?;
    let how = format!("--allow-template-namespace {}", ns.name);
    assert!(
        notes
            .iter()
            .any(|n| n.contains(&format!("{}/loot", ns.name)) && n.contains(&how)),
        "{notes:?}"
    );
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), &ns.name);
    let status = serde_json::to_value(applies.get("own").await?.status)?;
    let trusted = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "TemplateTrusted");
    assert_eq!(
        trusted.map(|c| (c["status"].clone(), c["reason"].clone())),
        Some((json!("False"), json!("TemplateNotTrusted"))),
        "{status}"
    );

    // The platform's template, in the trusted namespace, is rendered for the tenant.
    let shared = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "shared", "namespace": ns.name},
        "spec": {"templateRef": {"name": "loot", "namespace": platform.name}},
    });
    apply(&[template(&platform.name), shared])?;
    let workspaces: Api<TerraformWorkspace> = Api::all(client.clone());
    let rendered = workspace_name(&ns.name, "shared");
    system
        .wait_for("the platform template's Workspace", WAIT, || async {
            Ok(workspaces.get_opt(&rendered).await?.is_some())
        })
        .await?;
    assert!(
        workspaces
            .get_opt(&workspace_name(&ns.name, "own"))
            .await?
            .is_none()
    );
    // Reading the trusted namespace's template comes from the cluster-wide watch: no request
    // on another namespace.
    assert_stayed_in(&audit, &ns.name)?;
    Ok(())
}

/// The probes of hole 9's round: each a way round "a tenant runs no Terraform of its own",
/// refused under the defaults (only the platform namespace trusted). A tenant namespace, a
/// platform namespace and a system trusting the platform's alone.
struct Probe {
    tenant: TestNamespace,
    platform: TestNamespace,
    system: System,
    audit: AuditLog,
}

impl Probe {
    async fn start(prefix: &str) -> Result<Self> {
        let client = env().client().await?;
        let tenant = TestNamespace::create(&client, prefix).await?;
        let platform = TestNamespace::create(&client, &format!("{prefix}-platform")).await?;
        let audit = AuditLog::from_now()?;
        let system =
            System::start_with(&tenant.name, 50, &[TRUST_TEMPLATES, platform.name.as_str()])
                .await?;
        Ok(Self {
            tenant,
            platform,
            system,
            audit,
        })
    }

    /// A template `name` in `namespace` whose Workspace spec is `spec`.
    fn template(namespace: &str, name: &str, spec: Value) -> Value {
        json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"template": {"spec": spec}},
        })
    }

    /// The tenant's apply `name` of the template `template_ref`, its spec `extra` besides.
    fn apply(&self, name: &str, template_ref: Value, extra: Value) -> Value {
        let mut spec = json!({"templateRef": template_ref});
        if let (Value::Object(spec), Value::Object(extra)) = (&mut spec, extra) {
            spec.extend(extra);
        }
        json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
            "metadata": {"name": name, "namespace": self.tenant.name}, "spec": spec,
        })
    }

    /// Waits for the refusal of the tenant's apply `name` with `reason` and a Warning Event
    /// whose note has `says`; no Workspace; nothing done outside the tenant's namespace.
    async fn refused(&self, name: &str, reason: &str, says: &str) -> Result<()> {
        refused_not_rendered(&self.system, &self.tenant.name, name, reason).await?;
        let notes = warnings(&self.tenant.name, reason, name)?;
        assert!(notes.iter().any(|n| n.contains(says)), "{says}: {notes:?}");
        assert_stayed_in(&self.audit, &self.tenant.name)
    }
}

/// Probe: the provider's ServiceAccount token read by a tenant's own template
/// (`file("/var/run/secrets/kubernetes.io/serviceaccount/token")`, whose account Crossplane
/// lets read and write every Secret). Refused: the template is the tenant's. Before the fix it
/// was rendered.
#[tokio::test]
async fn probe_a_tenants_template_reading_the_providers_token_is_refused() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let probe = Probe::start("probe-token").await?;
    let module = "output \"token\" {\n  value     = file(\"/var/run/secrets/kubernetes.io/serviceaccount/token\")\n  sensitive = true\n}\n";
    let ns = probe.tenant.name.clone();
    apply(&[
        Probe::template(
            &ns,
            "token",
            json!({"forProvider": {"source": "Inline", "module": module}}),
        ),
        probe.apply("token", json!({"name": "token"}), json!({})),
    ])?;
    probe
        .refused("token", "TemplateNotTrusted", "--allow-template-namespace")
        .await
}

/// Probe: a command run by a tenant's own template (`local-exec`). Refused: the template is
/// the tenant's. Before the fix it was rendered.
#[tokio::test]
async fn probe_a_tenants_template_running_local_exec_is_refused() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let probe = Probe::start("probe-exec").await?;
    let module = "resource \"terraform_data\" \"x\" {\n  provisioner \"local-exec\" {\n    command = \"id\"\n  }\n}\n";
    let ns = probe.tenant.name.clone();
    apply(&[
        Probe::template(
            &ns,
            "exec",
            json!({"forProvider": {"source": "Inline", "module": module}}),
        ),
        probe.apply("exec", json!({"name": "exec"}), json!({})),
    ])?;
    probe
        .refused("exec", "TemplateNotTrusted", "--allow-template-namespace")
        .await
}

/// Probe: `managementPolicies` without `Delete` (a Workspace provider-terraform never
/// destroys, whatever its `deletionPolicy`), even in the platform's trusted template: refused
/// as `Orphan` is, reason `WorkspaceNotAllowed`. Before the fix it was rendered
/// (`Applied=True`).
#[tokio::test]
async fn probe_management_policies_without_delete_are_refused() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let probe = Probe::start("probe-policies").await?;
    let platform = probe.platform.name.clone();
    let spec = json!({"managementPolicies": ["Observe", "Create", "Update", "LateInitialize"],
        "forProvider": {"source": "Inline", "module": "# kept"}});
    apply(&[
        Probe::template(&platform, "kept", spec),
        probe.apply(
            "kept",
            json!({"name": "kept", "namespace": platform}),
            json!({}),
        ),
    ])?;
    probe
        .refused("kept", "WorkspaceNotAllowed", "spec.managementPolicies")
        .await
}

/// Probe: a key swap through a shared template. The platform's template has Terraform's own
/// `${local.bucket}` in its module; a tenant's key `local.bucket` would replace it. Refused:
/// the API server stores no apply whose key is not an identifier, and the template's module
/// takes no key anyway. Before the fix the apply was stored and the module rendered with the
/// tenant's text in place of `${local.bucket}`.
#[tokio::test]
async fn probe_a_key_swap_through_a_shared_template_is_refused() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let probe = Probe::start("probe-swap").await?;
    let platform = probe.platform.name.clone();
    let module = "locals {\n  bucket = \"platform-bucket\"\n}\noutput \"bucket\" {\n  value = \"s3://${local.bucket}\"\n}\n";
    apply(&[Probe::template(
        &platform,
        "bucket",
        json!({"forProvider": {"source": "Inline", "module": module}}),
    )])?;
    let swap = probe.apply(
        "swap",
        json!({"name": "bucket", "namespace": platform}),
        json!({"variables": {"local.bucket": "tenant-bucket"}}),
    );
    let client = env().client().await?;
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), &probe.tenant.name);
    let created = applies
        .create(&PostParams::default(), &serde_json::from_value(swap)?)
        .await;
    match created {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert!(e.message.contains("identifier"), "{}", e.message);
        }
        Ok(_) => {
            let workspaces: Api<TerraformWorkspace> = Api::all(client);
            let name = workspace_name(&probe.tenant.name, "swap");
            probe
                .system
                .wait_for("the swapped Workspace", WAIT, || async {
                    Ok(workspaces.get_opt(&name).await?.is_some())
                })
                .await?;
            let module =
                workspaces.get(&name).await?.spec_value()["forProvider"]["module"].to_string();
            panic!("the tenant's key was stored and rendered: {module}");
        }
        Err(e) => return Err(e.into()),
    }
    assert_stayed_in(&probe.audit, &probe.tenant.name)
}

/// Probe: `TF_CLI_ARGS_init` in `forProvider.env`, which Terraform adds to `tofu init`'s
/// arguments round the checks of `initArgs` (`-backend-config=...`: another state). Refused
/// even in the platform's trusted template, reason `WorkspaceNotAllowed`. Before the fix it
/// was rendered.
#[tokio::test]
async fn probe_terraform_arguments_through_the_environment_are_refused() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let probe = Probe::start("probe-env").await?;
    let platform = probe.platform.name.clone();
    let spec = json!({"forProvider": {"source": "Inline", "module": "# env",
        "env": [{"name": "TF_CLI_ARGS_init", "value": "-backend-config=secret_suffix=team-b"}]}});
    apply(&[
        Probe::template(&platform, "env", spec),
        probe.apply(
            "env",
            json!({"name": "env", "namespace": platform}),
            json!({}),
        ),
    ])?;
    probe
        .refused("env", "WorkspaceNotAllowed", "env[0] is TF_CLI_ARGS_init")
        .await
}

/// Probe: the entrypoint trick. provider-terraform strips `../` from `entrypoint` once, so
/// `....//<uid>` runs another Workspace's directory. Refused even in the platform's trusted
/// template, reason `WorkspaceNotAllowed`. Before the fix it was rendered.
#[tokio::test]
async fn probe_an_entrypoint_into_another_workspaces_directory_is_refused() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let probe = Probe::start("probe-entry").await?;
    let platform = probe.platform.name.clone();
    let spec = json!({"forProvider": {"source": "Inline", "module": "# entry",
        "entrypoint": "....//0b7c5e32-7a5e-4c5e-9a0e-1d2f3a4b5c6d"}});
    apply(&[
        Probe::template(&platform, "entry", spec),
        probe.apply(
            "entry",
            json!({"name": "entry", "namespace": platform}),
            json!({}),
        ),
    ])?;
    probe
        .refused(
            "entry",
            "WorkspaceNotAllowed",
            "spec.forProvider.entrypoint",
        )
        .await
}

/// Probe: a tenant's apply with `retainWorkspaceOnDelete: true`, which would leave its
/// cluster-scoped Workspace (invisible to the tenant) running on the platform's credentials
/// once the apply is deleted. Refused, reason `WorkspaceNotAllowed`; and an apply that gets the
/// field once rendered still has its Workspace deleted with it. Before the fix it was rendered,
/// and the Workspace kept.
#[tokio::test]
async fn probe_a_tenant_setting_retain_workspace_on_delete_keeps_no_workspace() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let probe = Probe::start("probe-retain").await?;
    let platform = probe.platform.name.clone();
    let spec = json!({"forProvider": {"source": "Inline", "module": "# retained"}});
    let reference = json!({"name": "retained", "namespace": platform});
    apply(&[
        Probe::template(&platform, "retained", spec),
        probe.apply(
            "retain",
            reference.clone(),
            json!({"retainWorkspaceOnDelete": true}),
        ),
    ])?;
    probe
        .refused(
            "retain",
            "WorkspaceNotAllowed",
            "spec.retainWorkspaceOnDelete",
        )
        .await?;

    // Rendered first, then given the field, then deleted: its Workspace goes with it.
    apply(&[probe.apply("later", reference, json!({}))])?;
    let client = env().client().await?;
    let workspaces: Api<TerraformWorkspace> = Api::all(client.clone());
    let name = workspace_name(&probe.tenant.name, "later");
    probe
        .system
        .wait_for("the Workspace", WAIT, || async {
            Ok(workspaces.get_opt(&name).await?.is_some())
        })
        .await?;
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client, &probe.tenant.name);
    applies
        .patch(
            "later",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"retainWorkspaceOnDelete": true}})),
        )
        .await?;
    applies.delete("later", &DeleteParams::default()).await?;
    probe
        .system
        .wait_for("the apply gone", WAIT, || async {
            Ok(applies.get_opt("later").await?.is_none())
        })
        .await?;
    assert!(
        workspaces.get_opt(&name).await?.is_none(),
        "the Workspace of a deleted apply was kept"
    );
    Ok(())
}
