//! The Cluster's `<cluster>-kubeconfig` Secret (Cluster API control-plane contract) against
//! the real API server: written once the control plane is Ready, from the connection Secret's
//! `kubeconfig` output; following the outputs when they change (a generated `aws eks
//! get-token` kubeconfig when only the endpoint and CA are there); never rewritten at rest;
//! deleted with its CAPTControlPlane by the garbage collector.

use anyhow::{Context, Result};
use capt_controller::api::{CAPTControlPlane, ControlPlanePhase};
use capt_tests::audit_log::AuditLog;
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use std::time::Duration;

const SECRET: &str = "demo-kubeconfig";
const CONNECTION: &str = "demo-eks-connection";

fn value(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

/// The write requests (create, update, patch) to the kubeconfig Secret of `ns` in `log`.
fn secret_writes(log: &AuditLog, ns: &str) -> Result<usize> {
    let object = format!("secrets {ns}/{SECRET}");
    let writes = log.writes_in(ns)?;
    let writes = writes.iter().filter(|w| w.object == object);
    Ok(writes
        .filter(|w| ["create", "update", "patch"].contains(&w.verb.as_str()))
        .count())
}

#[tokio::test]
async fn the_kubeconfig_secret_follows_the_outputs_and_is_not_rewritten_at_rest() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "kubeconfig").await?;
    let stack = provision_until_the_secret(&client, &ns.name).await?;
    let secret = assert_the_contract(&stack).await?;
    assert_not_rewritten_at_rest(&stack, &secret).await?;
    assert_follows_a_rotated_kubeconfig(&stack).await?;
    assert_generated_from_the_endpoint_and_ca(&stack).await?;
    assert_deleted_with_the_control_plane(&stack).await
}

/// The system with the sample provisioned, and the APIs of what the test reads.
struct Stack {
    system: System,
    ns: String,
    secrets: Api<Secret>,
    cps: Api<CAPTControlPlane>,
}

/// Starts the system and the sample, until the control plane is Ready and its kubeconfig
/// Secret exists.
async fn provision_until_the_secret(client: &kube::Client, ns: &str) -> Result<Stack> {
    let system = System::start(ns, 50).await?;
    system.apply_samples(false).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let cps: Api<CAPTControlPlane> = Api::namespaced(client.clone(), ns);
    system
        .wait_for(
            "the control plane Ready and its kubeconfig Secret",
            Duration::from_secs(60),
            || async {
                let ready = cps
                    .get_opt("demo")
                    .await?
                    .and_then(|c| c.status)
                    .and_then(|s| s.phase)
                    == Some(ControlPlanePhase::Ready);
                Ok(ready && secrets.get_opt(SECRET).await?.is_some())
            },
        )
        .await?;
    Ok(Stack {
        system,
        ns: ns.to_owned(),
        secrets,
        cps,
    })
}

/// The contract: type, label, controller owner reference, `value` = the kubeconfig output,
/// written by the controller alone. Returns the Secret.
async fn assert_the_contract(stack: &Stack) -> Result<Secret> {
    let (secrets, cps) = (&stack.secrets, &stack.cps);
    let cp = cps.get("demo").await?;
    let secret = secrets.get(SECRET).await?;
    let connection = secrets.get(CONNECTION).await?;
    assert_eq!(secret.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
    assert_eq!(
        secret.labels().get("cluster.x-k8s.io/cluster-name"),
        Some(&"demo".to_owned())
    );
    let owners = serde_json::to_value(secret.owner_references())?;
    assert_eq!(
        owners,
        json!([{"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
            "name": "demo", "uid": cp.uid().context("uid")?, "controller": true, "blockOwnerDeletion": true}])
    );
    let keys: Vec<&String> = secret.data.as_ref().context("data")?.keys().collect();
    assert_eq!(keys, ["value"], "nothing but the kubeconfig");
    assert_eq!(value(&secret, "value"), value(&connection, "kubeconfig"));
    assert_eq!(
        value(&secret, "value").as_deref(),
        Some("apiVersion: v1 (elided)")
    );
    let managers: Vec<String> = secret
        .managed_fields()
        .iter()
        .filter_map(|m| m.manager.clone())
        .collect();
    assert_eq!(managers, ["capt-controller"]);
    Ok(secret)
}

/// At rest: a forced reconcile (a label changes the control plane's lifecycle hash) reads
/// the Secrets and writes nothing. A server-side apply that changes nothing leaves the
/// resourceVersion alone, so the API server's audit log is what counts the requests.
async fn assert_not_rewritten_at_rest(stack: &Stack, secret: &Secret) -> Result<()> {
    let (system, secrets, ns) = (&stack.system, &stack.secrets, &stack.ns);
    let version = secret.resource_version();
    let at_rest = AuditLog::from_now()?;
    assert!(
        secret_writes(&AuditLog::from_start()?, ns)? >= 1,
        "the audit log records the Secret's creation"
    );
    system.reconcile_control_plane_again("1").await?;
    // The claim: the reconcile went as far as the kubeconfig Secret (it read the connection
    // Secret and the kubeconfig Secret, and the latter is read only to decide whether to
    // write it), and wrote nothing. Nothing else reads them in this window.
    let secret_reads = || -> Result<Vec<String>> {
        Ok(at_rest
            .requests_in(ns, |verb| verb == "get")?
            .into_iter()
            .map(|r| r.object)
            .filter(|o| o.starts_with("secrets "))
            .collect())
    };
    let both = [
        format!("secrets {ns}/{CONNECTION}"),
        format!("secrets {ns}/{SECRET}"),
    ];
    system
        .wait_for(
            "the reconcile's reads of both Secrets",
            Duration::from_secs(10),
            || async {
                Ok(both
                    .iter()
                    .all(|s| secret_reads().is_ok_and(|r| r.contains(s))))
            },
        )
        .await?;
    // A write, were there one, follows the reads within the same reconcile. That reconcile
    // has finished once one more has (the controller never reconciles an object twice at
    // once; the poke makes sure there is one more), and the audit log then holds its write
    // once it holds a request sent after.
    system.reconcile_control_plane_again("2").await?;
    at_rest.caught_up(&env().client().await?, ns).await?;
    assert_eq!(secret_writes(&at_rest, ns)?, 0, "no write request at rest");
    assert_eq!(secrets.get(SECRET).await?.resource_version(), version);
    Ok(())
}

/// A new kubeconfig output: the Secret follows.
async fn assert_follows_a_rotated_kubeconfig(stack: &Stack) -> Result<()> {
    let (system, secrets) = (&stack.system, &stack.secrets);
    system.set_sensitive_outputs(&json!({"kubeconfig": "apiVersion: v1 (rotated)"}))?;
    system
        .wait_for(
            "the rotated kubeconfig in the Secret",
            Duration::from_secs(30),
            || async {
                let secret = secrets.get(SECRET).await?;
                let connection = secrets.get(CONNECTION).await?;
                Ok(
                    value(&secret, "value").as_deref() == Some("apiVersion: v1 (rotated)")
                        && value(&secret, "value") == value(&connection, "kubeconfig"),
                )
            },
        )
        .await
}

/// Only an endpoint and a CA: a kubeconfig that asks `aws eks get-token`, with no other
/// output, and no Secret data in the controller's log.
async fn assert_generated_from_the_endpoint_and_ca(stack: &Stack) -> Result<()> {
    let (system, secrets, ns) = (&stack.system, &stack.secrets, &stack.ns);
    // The provider publishes connection details by merging them into the Secret
    // (crossplane-runtime never removes a key), so the `kubeconfig` output that went away
    // stays there until its owner removes it, as an operator does here.
    system.set_sensitive_outputs(
        &json!({"cluster_certificate_authority_data": "Q0EgYnVuZGxl", "db_password": "hunter2"}),
    )?;
    system
        .wait_for(
            "the CA in the connection Secret",
            Duration::from_secs(30),
            || async {
                let connection = secrets.get(CONNECTION).await?;
                Ok(value(&connection, "cluster_certificate_authority_data").is_some())
            },
        )
        .await?;
    let connection = secrets.get(CONNECTION).await?;
    assert!(
        value(&connection, "kubeconfig").is_some(),
        "the provider keeps a key whose output went away"
    );
    env().kubectl_ok(
        &[
            "patch",
            "secret",
            CONNECTION,
            "-n",
            ns,
            "--type=json",
            "-p",
            r#"[{"op": "remove", "path": "/data/kubeconfig"}]"#,
        ],
        None,
    )?;
    let generated = || async {
        let secret = secrets.get(SECRET).await?;
        let text = value(&secret, "value").unwrap_or_default();
        anyhow::Ok((text.clone(), serde_yaml::from_str::<Value>(&text)?))
    };
    system
        .wait_for(
            "the generated kubeconfig in the Secret",
            Duration::from_secs(30),
            || async {
                let (_, config) = generated().await?;
                Ok(
                    config["clusters"][0]["cluster"]["certificate-authority-data"]
                        == "Q0EgYnVuZGxl",
                )
            },
        )
        .await?;
    let (text, generated) = generated().await?;
    assert!(!text.contains("hunter2"), "no other output");
    // The EKS cluster's name (the `cluster_name` output, the apply's CLUSTER_NAME) carries
    // the namespace; the kubeconfig's own names are the Cluster's.
    let eks_name = capt_tests::eks_name(ns, "demo");
    assert_eq!(
        generated["clusters"][0]["cluster"]["server"],
        format!("https://{}", capt_tests::sample_endpoint_host(ns, "demo"))
    );
    assert_eq!(generated["clusters"][0]["name"], "demo");
    assert_eq!(
        generated["users"][0]["user"]["exec"],
        json!({"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws",
            "args": ["eks", "get-token", "--cluster-name", eks_name, "--region", "ap-northeast-1"]})
    );
    let log = system.controller_log_text();
    for secret_text in ["hunter2", "Q0EgYnVuZGxl", "(rotated)", "(elided)"] {
        assert!(!log.contains(secret_text), "Secret data in the log: {log}");
    }
    Ok(())
}

/// The garbage collector deletes the Secret with its CAPTControlPlane.
async fn assert_deleted_with_the_control_plane(stack: &Stack) -> Result<()> {
    let (system, secrets, cps) = (&stack.system, &stack.secrets, &stack.cps);
    let cp_uid = cps.get("demo").await?.meta().uid.clone();
    cps.delete("demo", &DeleteParams::default()).await?;
    system
        .wait_for(
            "the kubeconfig Secret gone with the control plane",
            Duration::from_secs(60),
            || async {
                let cp_gone = cps
                    .get_opt("demo")
                    .await?
                    .is_none_or(|c| c.meta().uid != cp_uid);
                Ok(cp_gone && secrets.get_opt(SECRET).await?.is_none())
            },
        )
        .await
}

/// `<cluster>-user-kubeconfig`, the exec form for people beside the `<cluster>-kubeconfig`
/// core connects with (as Cluster API Provider AWS writes its EKS kubeconfigs): a tenant's
/// Secret already under that name is left alone and reported; once it is gone, the control
/// plane writes its own from the endpoint and CA outputs, with `aws eks get-token` and never
/// the token `<cluster>-kubeconfig` carries for core; the garbage collector deletes both with
/// the control plane.
#[tokio::test]
async fn the_user_kubeconfig_is_the_exec_form_and_a_tenants_secret_is_left_alone() -> Result<()> {
    const USER_SECRET: &str = "demo-user-kubeconfig";
    const TOKEN: &str = "core-token-9c1e";
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "user-kubeconfig").await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let tenants = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": USER_SECRET, "namespace": ns.name},
        "type": "cluster.x-k8s.io/secret", "stringData": {"value": "the tenant's"}});
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&tenants.to_string()),
    )?;
    let system = System::start(&ns.name, 50).await?;
    system.apply_samples(false).await?;
    system.set_sensitive_outputs(
        &json!({"cluster_certificate_authority_data": "Q0EgYnVuZGxl", "cluster_token": TOKEN}),
    )?;
    let reason = capt_controller::reconcile::kubeconfig::SECRET_NOT_CONTROLLED;
    system
        .wait_for(
            "the tenant's user kubeconfig Secret reported",
            Duration::from_secs(60),
            || async {
                let notes = capt_tests::warnings(&ns.name, reason, "demo")?;
                Ok(notes.iter().any(|n| n.contains(USER_SECRET)))
            },
        )
        .await?;
    let tenants = secrets.get(USER_SECRET).await?;
    assert_eq!(value(&tenants, "value").as_deref(), Some("the tenant's"));
    assert!(tenants.owner_references().is_empty(), "not taken over");

    // The tenant's Secret gone, the next reconcile (a label pokes it) writes ours.
    secrets
        .delete(USER_SECRET, &DeleteParams::default())
        .await?;
    let cps: Api<CAPTControlPlane> = Api::namespaced(client.clone(), &ns.name);
    cps.patch(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"test/poke": "1"}}})),
    )
    .await?;
    system
        .wait_for(
            "the control plane's user kubeconfig Secret",
            Duration::from_secs(30),
            || async {
                let secret = secrets.get_opt(USER_SECRET).await?;
                Ok(secret.is_some_and(|s| !s.owner_references().is_empty()))
            },
        )
        .await?;
    let cp = cps.get("demo").await?;
    let secret = secrets.get(USER_SECRET).await?;
    assert_eq!(secret.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
    assert_eq!(
        secret.labels().get("cluster.x-k8s.io/cluster-name"),
        Some(&"demo".to_owned())
    );
    let owners = serde_json::to_value(secret.owner_references())?;
    assert_eq!(
        owners,
        json!([{"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
            "name": "demo", "uid": cp.uid().context("uid")?, "controller": true, "blockOwnerDeletion": true}])
    );
    let text = value(&secret, "value").context("value")?;
    assert!(
        !text.contains(TOKEN),
        "the user kubeconfig carries no token"
    );
    let config: Value = serde_yaml::from_str(&text)?;
    let eks_name = capt_tests::eks_name(&ns.name, "demo");
    assert_eq!(
        config["users"],
        json!([{"name": "demo-user", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws",
            "args": ["eks", "get-token", "--cluster-name", eks_name, "--region", "ap-northeast-1"]}}}])
    );
    let host = capt_tests::sample_endpoint_host(&ns.name, "demo");
    assert_eq!(
        config["clusters"][0]["cluster"],
        json!({"server": format!("https://{host}"),
            "certificate-authority-data": "Q0EgYnVuZGxl"})
    );
    // Beside it, core's kubeconfig authenticates with the token (these outputs replaced the
    // sample's `kubeconfig` before the first apply).
    let core_config: Value =
        serde_yaml::from_str(&value(&secrets.get(SECRET).await?, "value").context("value")?)?;
    assert_eq!(
        core_config["users"],
        json!([{"name": "demo-admin", "user": {"token": TOKEN}}])
    );

    let cp_uid = cp.meta().uid.clone();
    cps.delete("demo", &DeleteParams::default()).await?;
    system
        .wait_for(
            "both kubeconfig Secrets gone with the control plane",
            Duration::from_secs(60),
            || async {
                let cp_gone = cps
                    .get_opt("demo")
                    .await?
                    .is_none_or(|c| c.meta().uid != cp_uid);
                Ok(cp_gone
                    && secrets.get_opt(SECRET).await?.is_none()
                    && secrets.get_opt(USER_SECRET).await?.is_none())
            },
        )
        .await?;
    Ok(())
}
