//! The fake provider-terraform as a separate process against the real API server: status and
//! atProvider of an applied Workspace, its connection Secret (sensitive outputs too), outputs
//! replaced whole, failures that keep atProvider, no writes at steady state, deletion after
//! the delay, and a clean exit on SIGTERM.
//!
//! Each test runs its own provider instance (`--instance`), which handles only the Workspaces
//! labelled with it: tests running in parallel, and any provider started without an instance
//! (a demo, another test binary), never touch each other's Workspaces.

use anyhow::{Result, bail};
use capt_tests::fake_provider::{
    FAIL_ANNOTATION, FIELD_MANAGER, FINALIZER, FakeProvider, INSTANCE_LABEL, KIND,
    OUTPUTS_ANNOTATION, REVISION_ANNOTATION, SECRET_TYPE, SENSITIVE_OUTPUTS_ANNOTATION, condition,
    workspace_resource,
};
use capt_tests::{TestNamespace, env, unique_name};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);

/// One test's provider, namespace and Workspace API; the Workspaces it created are deleted
/// (finalizer and all) when dropped, even when the test fails.
struct Fixture {
    ns: TestNamespace,
    api: Api<DynamicObject>,
    secrets: Api<Secret>,
    instance: String,
    created: Vec<String>,
    // Killed only after `Drop for Fixture` has cleaned up `created`.
    provider: FakeProvider,
}

impl Fixture {
    async fn start(prefix: &str, delay_ms: u64) -> Result<Self> {
        let client = env().client().await?;
        let ns = TestNamespace::create(&client, prefix).await?;
        let instance = unique_name(prefix);
        let delay = delay_ms.to_string();
        let provider =
            FakeProvider::start(&["--delay-ms", &delay, "--instance", &instance]).await?;
        Ok(Self {
            api: Api::all_with(client.clone(), &workspace_resource()),
            secrets: Api::namespaced(client, &ns.name),
            ns,
            instance,
            created: Vec::new(),
            provider,
        })
    }

    /// Creates a Workspace with these annotations, writing its connection Secret `secret`
    /// into the test namespace when given.
    async fn create(
        &mut self,
        prefix: &str,
        annotations: &[(&str, &str)],
        secret: Option<&str>,
    ) -> Result<String> {
        let name = unique_name(prefix);
        let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
        let mut spec = json!({"forProvider": {"source": "Inline", "module": "# none"}});
        if let Some(secret) = secret {
            spec["writeConnectionSecretToRef"] = json!({"name": secret, "namespace": self.ns.name});
        }
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "tf.upbound.io/v1beta1", "kind": KIND,
            "metadata": {"name": name, "labels": {INSTANCE_LABEL: self.instance}, "annotations": annotations},
            "spec": spec,
        }))?;
        self.api.create(&PostParams::default(), &obj).await?;
        self.created.push(name.clone());
        Ok(name)
    }

    async fn get(&self, name: &str) -> Result<Option<Value>> {
        Ok(self
            .api
            .get_opt(name)
            .await?
            .map(serde_json::to_value)
            .transpose()?)
    }

    /// Sets (`Some`) or removes (`None`) annotations with a merge patch, as a user would.
    async fn annotate(&self, name: &str, changes: &[(&str, Option<&str>)]) -> Result<()> {
        let annotations: serde_json::Map<String, Value> = changes
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.map_or(Value::Null, |v| json!(v))))
            .collect();
        self.api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
            )
            .await?;
        Ok(())
    }

    /// Waits until the Workspace satisfies `check`, returning it.
    async fn wait_workspace(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        wait_until(what, TIMEOUT, || async {
            Ok(self.get(name).await?.filter(|ws| check(ws)))
        })
        .await
    }

    /// Deletes the Workspace and waits until the provider has let it go.
    async fn delete_and_wait(&self, name: &str) -> Result<Duration> {
        let started = Instant::now();
        capt_tests::delete_ignoring_missing(&self.api, name).await?;
        wait_until("the Workspace to be gone", TIMEOUT, || async {
            Ok(self.get(name).await?.is_none().then_some(()))
        })
        .await?;
        Ok(started.elapsed())
    }

    async fn secret_data(&self, name: &str) -> Result<Option<BTreeMap<String, String>>> {
        let Some(secret) = self.secrets.get_opt(name).await? else {
            return Ok(None);
        };
        Ok(Some(
            secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                .collect(),
        ))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // The provider may be gone before it finishes a deletion: a Workspace must not
        // stay behind with its finalizer (it is cluster-scoped, no namespace takes it away).
        for name in &self.created {
            let _ = env()
                .kubectl()
                .args(["delete", "workspaces.tf.upbound.io", name])
                .args(["--wait=false", "--ignore-not-found"])
                .output();
            let _ = env()
                .kubectl()
                .args(["patch", "workspaces.tf.upbound.io", name, "--type=merge"])
                .args(["-p", r#"{"metadata":{"finalizers":null}}"#])
                .output();
        }
    }
}

async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// (status, reason, message) of a condition of the Workspace.
fn cond(ws: &Value, type_: &str) -> Option<(String, String, String)> {
    let c = condition(ws.get("status"), type_)?;
    let text = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    Some((text("status"), text("reason"), text("message")))
}

fn is(ws: &Value, type_: &str, status: &str, reason: &str) -> bool {
    cond(ws, type_).is_some_and(|(s, r, _)| s == status && r == reason)
}

fn available(ws: &Value) -> bool {
    is(ws, "Synced", "True", "ReconcileSuccess") && is(ws, "Ready", "True", "Available")
}

fn at_provider(ws: &Value) -> Value {
    ws["status"]["atProvider"].clone()
}

#[tokio::test]
async fn applies_outputs_to_status_and_secret_and_replaces_at_provider_whole() -> Result<()> {
    let mut f = Fixture::start("fp-apply", 400).await?;
    let started = Instant::now();
    let name = f
        .create(
            "fp-apply",
            &[
                (
                    OUTPUTS_ANNOTATION,
                    r#"{"vpc_id":"vpc-123","subnet_ids":["a","b"]}"#,
                ),
                (
                    SENSITIVE_OUTPUTS_ANNOTATION,
                    r#"{"kubeconfig":"apiVersion: v1 # secret"}"#,
                ),
            ],
            Some("vpc-conn"),
        )
        .await?;

    // First Creating (with the finalizer), then, after the delay, Available.
    let creating = f
        .wait_workspace(&name, "Ready=False Creating", |ws| {
            is(ws, "Ready", "False", "Creating") || available(ws)
        })
        .await?;
    assert!(
        is(&creating, "Ready", "False", "Creating"),
        "Creating must come before Available: {creating:#}"
    );
    assert!(is(&creating, "Synced", "True", "ReconcileSuccess"));
    let ws = f
        .wait_workspace(&name, "Synced=True, Ready=True", available)
        .await?;
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(ws["metadata"]["finalizers"], json!([FINALIZER]));
    let first = at_provider(&ws);
    assert_eq!(
        first["outputs"],
        json!({"vpc_id": "vpc-123", "subnet_ids": ["a", "b"]}),
        "atProvider holds the non-sensitive outputs only"
    );
    let checksum = first["checksum"].as_str().unwrap_or_default().to_owned();
    assert!(
        checksum.len() == 16 && checksum.chars().all(|c| c.is_ascii_hexdigit()),
        "{checksum}"
    );
    let ready = condition(ws.get("status"), "Ready").unwrap();
    assert_eq!(ready["observedGeneration"], ws["metadata"]["generation"]);
    assert!(ready["lastTransitionTime"].is_string());
    // Status is owned by the provider's field manager, applied on the status subresource.
    let managers = ws["metadata"]["managedFields"].as_array().unwrap();
    assert!(
        managers.iter().any(|m| m["manager"] == FIELD_MANAGER
            && m["subresource"] == "status"
            && m["operation"] == "Apply"),
        "{managers:#?}"
    );

    // The connection Secret holds every output, sensitive ones too.
    let secret = f.secrets.get("vpc-conn").await?;
    assert_eq!(secret.type_.as_deref(), Some(SECRET_TYPE));
    let owner = &secret.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        (KIND, name.as_str())
    );
    let data = f.secret_data("vpc-conn").await?.unwrap();
    assert_eq!(
        data,
        BTreeMap::from([
            ("vpc_id".to_owned(), "vpc-123".to_owned()),
            ("subnet_ids".to_owned(), r#"["a","b"]"#.to_owned()),
            (
                "kubeconfig".to_owned(),
                "apiVersion: v1 # secret".to_owned()
            ),
        ])
    );
    assert!(
        !f.provider.log_text().contains("apiVersion: v1 # secret"),
        "a sensitive value reached the log"
    );

    // Steady state: the provider does not write again (no loop on its own writes).
    let version = ws["metadata"]["resourceVersion"].clone();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let still = f.get(&name).await?.unwrap();
    assert_eq!(
        still["metadata"]["resourceVersion"], version,
        "a write at steady state"
    );

    // A removed output disappears from atProvider (replaced whole) and from the Secret.
    f.annotate(
        &name,
        &[(OUTPUTS_ANNOTATION, Some(r#"{"vpc_id":"vpc-456"}"#))],
    )
    .await?;
    let ws = f
        .wait_workspace(&name, "the new outputs", |ws| {
            available(ws) && at_provider(ws)["outputs"] == json!({"vpc_id": "vpc-456"})
        })
        .await?;
    assert_ne!(at_provider(&ws)["checksum"], json!(checksum));
    let data = wait_until("the Secret to follow", TIMEOUT, || async {
        Ok(f.secret_data("vpc-conn")
            .await?
            .filter(|d| d.get("vpc_id").map(String::as_str) == Some("vpc-456")))
    })
    .await?;
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        ["kubeconfig", "vpc_id"],
        "subnet_ids is gone from the Secret"
    );

    // A new revision is a new apply: a new checksum, same outputs.
    let before = at_provider(&ws)["checksum"].clone();
    f.annotate(&name, &[(REVISION_ANNOTATION, Some("2"))])
        .await?;
    let ws = f
        .wait_workspace(&name, "a new checksum", |ws| {
            available(ws) && at_provider(ws)["checksum"] != before
        })
        .await?;
    assert_eq!(at_provider(&ws)["outputs"], json!({"vpc_id": "vpc-456"}));

    // A key another writer slips into atProvider is removed: the provider owns it whole.
    f.api
        .patch_status(
            &name,
            &PatchParams::apply("intruder").force(),
            &Patch::Apply(json!({
                "apiVersion": "tf.upbound.io/v1beta1", "kind": KIND,
                "status": {"atProvider": {"outputs": {"foreign": "x"}}},
            })),
        )
        .await?;
    f.wait_workspace(&name, "the foreign output removed", |ws| {
        available(ws) && at_provider(ws)["outputs"] == json!({"vpc_id": "vpc-456"})
    })
    .await?;

    // No outputs at all: atProvider keeps only its checksum.
    f.annotate(&name, &[(OUTPUTS_ANNOTATION, None)]).await?;
    f.wait_workspace(&name, "no outputs", |ws| {
        available(ws) && at_provider(ws).get("outputs").is_none()
    })
    .await?;

    f.delete_and_wait(&name).await?;
    Ok(())
}

#[tokio::test]
async fn a_failure_reports_reconcile_error_and_keeps_at_provider() -> Result<()> {
    let mut f = Fixture::start("fp-fail", 200).await?;
    let name = f
        .create(
            "fp-fail",
            &[(
                OUTPUTS_ANNOTATION,
                r#"{"cluster_endpoint":"https://ABC.gr7.ap-northeast-1.eks.amazonaws.com"}"#,
            )],
            None,
        )
        .await?;
    let ws = f.wait_workspace(&name, "Available", available).await?;
    let kept = at_provider(&ws);
    assert_eq!(
        kept["outputs"]["cluster_endpoint"],
        "https://ABC.gr7.ap-northeast-1.eks.amazonaws.com"
    );

    f.annotate(
        &name,
        &[(FAIL_ANNOTATION, Some("terraform apply: AccessDenied"))],
    )
    .await?;
    let ws = f
        .wait_workspace(&name, "Synced=False ReconcileError", |ws| {
            is(ws, "Synced", "False", "ReconcileError")
        })
        .await?;
    let (_, _, message) = cond(&ws, "Synced").unwrap();
    assert_eq!(message, "terraform apply: AccessDenied");
    assert!(is(&ws, "Ready", "False", "Creating"), "{ws:#}");
    assert_eq!(at_provider(&ws), kept, "a failure keeps atProvider");

    // The failure is stable: no further writes.
    let version = ws["metadata"]["resourceVersion"].clone();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        f.get(&name).await?.unwrap()["metadata"]["resourceVersion"],
        version
    );

    // Bad input is a failure with a clear message, never a crash.
    f.annotate(
        &name,
        &[
            (FAIL_ANNOTATION, None),
            (OUTPUTS_ANNOTATION, Some(r#"{"cluster_endpoint": "#)),
        ],
    )
    .await?;
    let ws = f
        .wait_workspace(&name, "the invalid-JSON failure", |ws| {
            cond(ws, "Synced").is_some_and(|(s, _, m)| s == "False" && m.contains("invalid JSON"))
        })
        .await?;
    let (_, reason, message) = cond(&ws, "Synced").unwrap();
    assert_eq!(reason, "ReconcileError");
    assert!(message.contains(OUTPUTS_ANNOTATION), "{message}");
    assert_eq!(at_provider(&ws), kept);

    // Fixed input: applied again.
    f.annotate(
        &name,
        &[(
            OUTPUTS_ANNOTATION,
            Some(r#"{"cluster_endpoint":"https://x"}"#),
        )],
    )
    .await?;
    let ws = f
        .wait_workspace(&name, "Available again", available)
        .await?;
    assert_eq!(
        at_provider(&ws)["outputs"],
        json!({"cluster_endpoint": "https://x"})
    );

    f.delete_and_wait(&name).await?;
    Ok(())
}

#[tokio::test]
async fn deletion_shows_deleting_then_removes_secret_and_finalizer_after_the_delay() -> Result<()> {
    let delay = Duration::from_millis(800);
    let mut f = Fixture::start("fp-delete", delay.as_millis() as u64).await?;
    let name = f
        .create(
            "fp-delete",
            &[
                (OUTPUTS_ANNOTATION, r#"{"vpc_id":"vpc-9"}"#),
                (SENSITIVE_OUTPUTS_ANNOTATION, r#"{"token":"t"}"#),
            ],
            Some("del-conn"),
        )
        .await?;
    let ws = f.wait_workspace(&name, "Available", available).await?;
    let kept = at_provider(&ws);
    assert!(f.secret_data("del-conn").await?.is_some());

    let started = Instant::now();
    capt_tests::delete_ignoring_missing(&f.api, &name).await?;
    let deleting = f
        .wait_workspace(&name, "Ready=False Deleting", |ws| {
            is(ws, "Ready", "False", "Deleting")
        })
        .await?;
    assert!(deleting["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(at_provider(&deleting), kept, "deletion keeps atProvider");
    assert!(
        f.secret_data("del-conn").await?.is_some(),
        "the Secret stays while the deletion runs"
    );

    wait_until("the Workspace to be gone", TIMEOUT, || async {
        Ok(f.get(&name).await?.is_none().then_some(()))
    })
    .await?;
    assert!(
        started.elapsed() >= delay,
        "gone after {:?}, before the delay",
        started.elapsed()
    );
    wait_until("the Secret to be gone", TIMEOUT, || async {
        Ok(f.secret_data("del-conn").await?.is_none().then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn leaves_other_instances_workspaces_alone_and_exits_on_sigterm() -> Result<()> {
    let mut f = Fixture::start("fp-term", 100).await?;
    // A Workspace of another instance, which is not running.
    let client = env().client().await?;
    let api: Api<DynamicObject> = Api::all_with(client, &workspace_resource());
    let stranger = unique_name("fp-stranger");
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tf.upbound.io/v1beta1", "kind": KIND,
        "metadata": {"name": stranger, "labels": {INSTANCE_LABEL: unique_name("nobody")}},
        "spec": {"forProvider": {"source": "Inline", "module": "# none"}},
    }))?;
    api.create(&PostParams::default(), &obj).await?;
    f.created.push(stranger.clone());
    let mine = f.create("fp-term", &[], None).await?;
    let ws = f.wait_workspace(&mine, "Available", available).await?;
    assert_eq!(at_provider(&ws).get("outputs"), None);
    let other = f.get(&stranger).await?.unwrap();
    assert!(other.get("status").is_none(), "{other:#}");
    assert!(other["metadata"].get("finalizers").is_none(), "{other:#}");
    f.delete_and_wait(&mine).await?;
    capt_tests::delete_ignoring_missing(&api, &stranger).await?;

    let status = f.provider.terminate(Duration::from_secs(10))?;
    assert!(status.success(), "exit status {status}");
    assert!(f.provider.log_text().contains("stopped"));
    Ok(())
}
