//! The fake provider-terraform as a separate process against the real API server, behaving as
//! provider-terraform v0.18.0 on crossplane-runtime v1.16.0 does: status written by full
//! Updates (managedFields operation `Update`), `Creating` only before the first apply,
//! `Ready=True Available` kept through updates and failed applies, errors in
//! `Synced=False ReconcileError`, transient failures that recover with backoff, periodic
//! re-observation that writes nothing when nothing changed, the connection Secret (sensitive
//! outputs too, keys never removed), deletion, and a clean exit on SIGTERM.
//!
//! Each test runs its own provider instance (`--instance`), which handles only the Workspaces
//! labelled with it: tests running in parallel, and any provider started without an instance
//! (a demo, another test binary), never touch each other's Workspaces.

use anyhow::{Result, bail};
use capt_tests::fake_provider::{
    FAIL_ANNOTATION, FAIL_TIMES_ANNOTATION, FIELD_MANAGER, FINALIZER, FakeProvider, INSTANCE_LABEL,
    KIND, OUTPUTS_ANNOTATION, REVISION_ANNOTATION, SECRET_TYPE, SENSITIVE_OUTPUTS_ANNOTATION,
    condition, workspace_resource,
};
use capt_tests::{TestNamespace, env, unique_name};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);
/// The tests' poll interval: provider-terraform's 10 minutes, shortened.
const POLL: Duration = Duration::from_millis(300);
/// The tests' backoff: from 100 ms, at most 800 ms (crossplane-runtime: 1 s to 60 s).
const BACKOFF_ARGS: [&str; 4] = ["--backoff-base-ms", "100", "--backoff-max-ms", "800"];

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
        let poll = POLL.as_millis().to_string();
        let mut args = vec!["--delay-ms", &delay, "--instance", &instance];
        args.extend(["--poll-interval-ms", &poll]);
        args.extend(BACKOFF_ARGS);
        let provider =
            FakeProvider::start_logging(&args, "info,fake_terraform_provider=debug").await?;
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

fn resource_version(ws: &Value) -> String {
    ws["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

impl Fixture {
    /// How many log lines of the provider mention `what` for Workspace `name`.
    fn log_count(&self, name: &str, what: &str) -> usize {
        self.provider
            .log_text()
            .lines()
            .filter(|l| l.contains(what) && l.contains(name))
            .count()
    }

    /// Samples the Workspace every 20 ms until `done` holds, checking `always` on every
    /// sample (the one that satisfies `done` included); returns the last sample and how many
    /// were taken.
    async fn watch_until(
        &self,
        name: &str,
        what: &str,
        always: impl Fn(&Value) -> bool,
        done: impl Fn(&Value) -> bool,
    ) -> Result<(Value, usize)> {
        let deadline = Instant::now() + TIMEOUT;
        let mut samples = 0;
        loop {
            let ws = self.get(name).await?.unwrap_or_default();
            samples += 1;
            if !always(&ws) {
                bail!("while waiting for {what}: {ws:#}");
            }
            if done(&ws) {
                return Ok((ws, samples));
            }
            if Instant::now() >= deadline {
                bail!("timed out after {TIMEOUT:?} waiting for {what}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn applies_outputs_to_status_and_secret_with_full_status_updates() -> Result<()> {
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

    let (ws, checksum) = assert_created_then_available(&f, &name, started).await?;
    assert_the_secret_holds_every_output(&f, &name).await?;
    assert_steady_state_writes_nothing(&f, &name, &ws).await?;
    let ws = assert_an_update_keeps_ready(&f, &name, &checksum).await?;
    assert_a_new_revision_is_a_new_apply(&f, &name, &ws).await?;
    assert_a_foreign_output_is_removed(&f, &name).await?;
    assert_no_outputs_keep_the_checksum(&f, &name).await?;
    f.delete_and_wait(&name).await?;
    Ok(())
}

/// Nothing is written while the first apply runs; then Creating (the Create path), with
/// the outputs and no checksum (Update fills only the outputs); the next pass observes:
/// Available, with the checksum. Status and finalizer are written by Updates (PUT), never
/// by server-side apply. Returns the Workspace and its checksum.
async fn assert_created_then_available(
    f: &Fixture,
    name: &str,
    started: Instant,
) -> Result<(Value, String)> {
    let creating = f
        .wait_workspace(name, "a status", |ws| ws.get("status").is_some())
        .await?;
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "status written during the apply"
    );
    assert!(
        is(&creating, "Ready", "False", "Creating"),
        "Creating must come before Available: {creating:#}"
    );
    assert!(is(&creating, "Synced", "True", "ReconcileSuccess"));
    assert_eq!(
        at_provider(&creating),
        json!({"outputs": {"vpc_id": "vpc-123", "subnet_ids": ["a", "b"]}}),
        "atProvider holds the non-sensitive outputs only, no checksum after an apply"
    );
    // The next pass observes: Available, with the checksum.
    let ws = f
        .wait_workspace(name, "Synced=True, Ready=True", available)
        .await?;
    assert_eq!(ws["metadata"]["finalizers"], json!([FINALIZER]));
    let first = at_provider(&ws);
    assert_eq!(
        first["outputs"],
        json!({"vpc_id": "vpc-123", "subnet_ids": ["a", "b"]})
    );
    let checksum = first["checksum"].as_str().unwrap_or_default().to_owned();
    assert!(
        checksum.len() == 16 && checksum.chars().all(|c| c.is_ascii_hexdigit()),
        "{checksum}"
    );
    let ready = condition(ws.get("status"), "Ready").unwrap();
    assert!(ready.get("observedGeneration").is_none(), "{ready}");
    assert!(ready["lastTransitionTime"].is_string());
    // Status and finalizer are written by Updates (PUT), never by server-side apply.
    let managers = ws["metadata"]["managedFields"].as_array().unwrap();
    let ours = |sub: Option<&str>| {
        managers.iter().any(|m| {
            m["manager"] == FIELD_MANAGER
                && m["operation"] == "Update"
                && m.get("subresource").and_then(Value::as_str) == sub
        })
    };
    assert!(ours(Some("status")) && ours(None), "{managers:#?}");
    assert!(
        !managers
            .iter()
            .any(|m| m["manager"] == FIELD_MANAGER && m["operation"] == "Apply"),
        "{managers:#?}"
    );
    Ok((ws, checksum))
}

/// The connection Secret holds every output, sensitive ones too, and no sensitive value
/// reaches the log.
async fn assert_the_secret_holds_every_output(f: &Fixture, name: &str) -> Result<()> {
    let secret = f.secrets.get("vpc-conn").await?;
    assert_eq!(secret.type_.as_deref(), Some(SECRET_TYPE));
    let owner = &secret.metadata.owner_references.clone().unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        (KIND, name, Some(true))
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
    Ok(())
}

/// Periodic re-observation: passes run every poll interval, their PUTs change nothing, so
/// the API server keeps the resourceVersion.
async fn assert_steady_state_writes_nothing(f: &Fixture, name: &str, ws: &Value) -> Result<()> {
    let version = resource_version(ws);
    let passes = f.log_count(name, "observed: up to date");
    capt_tests::system::wait_until("two more passes", POLL * 20, || async {
        Ok(f.log_count(name, "observed: up to date") >= passes + 2)
    })
    .await?;
    let still = f.get(name).await?.unwrap();
    assert_eq!(resource_version(&still), version, "a write at steady state");
    Ok(())
}

/// An update: Ready stays True/Available all through it; the new outputs replace
/// atProvider whole; the checksum is back at the next observation; the Secret follows, and
/// keeps the old key. Returns the Workspace.
async fn assert_an_update_keeps_ready(f: &Fixture, name: &str, checksum: &str) -> Result<Value> {
    f.annotate(
        name,
        &[(OUTPUTS_ANNOTATION, Some(r#"{"vpc_id":"vpc-456"}"#))],
    )
    .await?;
    let (ws, samples) = f
        .watch_until(
            name,
            "the new outputs and checksum",
            |ws| is(ws, "Ready", "True", "Available"),
            |ws| {
                available(ws)
                    && at_provider(ws)["outputs"] == json!({"vpc_id": "vpc-456"})
                    && at_provider(ws)["checksum"].is_string()
            },
        )
        .await?;
    assert!(
        samples >= 10,
        "only {samples} samples during a 400 ms apply"
    );
    assert_ne!(at_provider(&ws)["checksum"], json!(checksum));
    let data = wait_until("the Secret to follow", TIMEOUT, || async {
        Ok(f.secret_data("vpc-conn")
            .await?
            .filter(|d| d.get("vpc_id").map(String::as_str) == Some("vpc-456")))
    })
    .await?;
    // A merge patch never removes a key: the old output stays in the Secret.
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        ["kubeconfig", "subnet_ids", "vpc_id"],
    );
    Ok(ws)
}

/// A new revision is a new apply: a new checksum, same outputs.
async fn assert_a_new_revision_is_a_new_apply(f: &Fixture, name: &str, ws: &Value) -> Result<()> {
    let before = at_provider(ws)["checksum"].clone();
    f.annotate(name, &[(REVISION_ANNOTATION, Some("2"))])
        .await?;
    let ws = f
        .wait_workspace(name, "a new checksum", |ws| {
            available(ws)
                && at_provider(ws)["checksum"].is_string()
                && at_provider(ws)["checksum"] != before
        })
        .await?;
    assert_eq!(at_provider(&ws)["outputs"], json!({"vpc_id": "vpc-456"}));
    Ok(())
}

/// A key another writer slips into atProvider is gone after the next full Update.
async fn assert_a_foreign_output_is_removed(f: &Fixture, name: &str) -> Result<()> {
    f.api
        .patch_status(
            name,
            &PatchParams::apply("intruder").force(),
            &Patch::Apply(json!({
                "apiVersion": "tf.upbound.io/v1beta1", "kind": KIND,
                "status": {"atProvider": {"outputs": {"foreign": "x"}}},
            })),
        )
        .await?;
    f.wait_workspace(name, "the foreign output removed", |ws| {
        available(ws) && at_provider(ws)["outputs"] == json!({"vpc_id": "vpc-456"})
    })
    .await?;
    Ok(())
}

/// No outputs at all: atProvider keeps only its checksum.
async fn assert_no_outputs_keep_the_checksum(f: &Fixture, name: &str) -> Result<()> {
    f.annotate(name, &[(OUTPUTS_ANNOTATION, None)]).await?;
    f.wait_workspace(name, "no outputs", |ws| {
        available(ws)
            && at_provider(ws).get("outputs").is_none()
            && at_provider(ws)["checksum"].is_string()
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_failed_apply_of_an_existing_workspace_keeps_ready_and_reports_synced_false() -> Result<()>
{
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
    let (ws, _) = f
        .watch_until(
            &name,
            "Synced=False ReconcileError",
            |ws| is(ws, "Ready", "True", "Available"),
            |ws| is(ws, "Synced", "False", "ReconcileError"),
        )
        .await?;
    let (_, _, message) = cond(&ws, "Synced").unwrap();
    assert_eq!(
        message,
        "update failed: cannot apply Terraform configuration: terraform apply: AccessDenied"
    );
    assert_eq!(at_provider(&ws), kept, "a failure keeps atProvider");

    // The provider retries with backoff; each retry writes the same status, which the API
    // server does not store again.
    let version = resource_version(&ws);
    let tries = f.log_count(&name, "apply failed");
    capt_tests::system::wait_until("a retry of the apply", Duration::from_secs(10), || async {
        Ok(f.log_count(&name, "apply failed") > tries)
    })
    .await?;
    let still = f.get(&name).await?.unwrap();
    assert_eq!(resource_version(&still), version);
    assert!(is(&still, "Ready", "True", "Available"));

    // Input the plan cannot use is an observe failure, Ready still kept.
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
    assert!(
        message.starts_with("observe failed: cannot diff (i.e. plan) Terraform configuration"),
        "{message}"
    );
    assert!(message.contains(OUTPUTS_ANNOTATION), "{message}");
    assert!(is(&ws, "Ready", "True", "Available"), "{ws:#}");
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
        .wait_workspace(&name, "Available again", |ws| {
            available(ws) && at_provider(ws)["outputs"] == json!({"cluster_endpoint": "https://x"})
        })
        .await?;
    assert!(is(&ws, "Synced", "True", "ReconcileSuccess"));

    f.delete_and_wait(&name).await?;
    Ok(())
}

#[tokio::test]
async fn transient_failures_recover_by_themselves_with_backoff() -> Result<()> {
    let mut f = Fixture::start("fp-transient", 100).await?;
    // The first two applies fail: Creating with the error, then Available with no help.
    let name = f
        .create(
            "fp-transient",
            &[
                (OUTPUTS_ANNOTATION, r#"{"vpc_id":"vpc-7"}"#),
                (FAIL_TIMES_ANNOTATION, "2"),
            ],
            None,
        )
        .await?;
    let ws = f
        .wait_workspace(&name, "the first failure", |ws| {
            is(ws, "Synced", "False", "ReconcileError")
        })
        .await?;
    assert!(is(&ws, "Ready", "False", "Creating"), "{ws:#}");
    let (_, _, message) = cond(&ws, "Synced").unwrap();
    assert!(
        message.starts_with("create failed: cannot apply Terraform configuration: transient"),
        "{message}"
    );
    let started = Instant::now();
    f.wait_workspace(&name, "recovered", available).await?;
    // Two failed applies, one good one, and the backoff between them (100 ms, then 200 ms).
    assert_eq!(f.log_count(&name, "apply failed"), 2);
    assert!(started.elapsed() >= Duration::from_millis(200));

    // On an existing Workspace: Synced=False while failing, Ready Available all along.
    f.annotate(
        &name,
        &[
            (REVISION_ANNOTATION, Some("2")),
            (FAIL_TIMES_ANNOTATION, Some("1")),
        ],
    )
    .await?;
    let (ws, _) = f
        .watch_until(
            &name,
            "the update's failure",
            |ws| is(ws, "Ready", "True", "Available"),
            |ws| is(ws, "Synced", "False", "ReconcileError"),
        )
        .await?;
    assert!(
        cond(&ws, "Synced")
            .unwrap()
            .2
            .starts_with("update failed: "),
        "{ws:#}"
    );
    f.watch_until(
        &name,
        "recovered from the update's failure",
        |ws| is(ws, "Ready", "True", "Available"),
        |ws| is(ws, "Synced", "True", "ReconcileSuccess"),
    )
    .await?;
    assert_eq!(f.log_count(&name, "apply failed"), 3);
    f.delete_and_wait(&name).await?;
    Ok(())
}

#[tokio::test]
async fn deletion_destroys_then_shows_deleting_then_removes_the_finalizer() -> Result<()> {
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
    f.wait_workspace(&name, "Available", available).await?;
    assert!(f.secret_data("del-conn").await?.is_some());

    let started = Instant::now();
    capt_tests::delete_ignoring_missing(&f.api, &name).await?;
    // Deleting is written once the destroy has run, not before.
    let deleting = f
        .wait_workspace(&name, "Ready=False Deleting", |ws| {
            is(ws, "Ready", "False", "Deleting")
        })
        .await?;
    assert!(
        started.elapsed() >= delay,
        "Deleting before the destroy ran"
    );
    assert!(deleting["metadata"]["deletionTimestamp"].is_string());
    assert!(is(&deleting, "Synced", "True", "ReconcileSuccess"));

    wait_until("the Workspace to be gone", TIMEOUT, || async {
        Ok(f.get(&name).await?.is_none().then_some(()))
    })
    .await?;
    // The provider does not delete the Secret: the garbage collector does, by its owner.
    wait_until("the Secret to be collected", TIMEOUT, || async {
        Ok(f.secret_data("del-conn").await?.is_none().then_some(()))
    })
    .await?;
    assert!(!f.provider.log_text().contains("connection Secret deleted"));
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
