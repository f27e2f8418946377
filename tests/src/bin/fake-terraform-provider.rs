//! `fake-terraform-provider`: plays Crossplane provider-terraform's part against a real API
//! server, for tests. It watches `tf.upbound.io/v1beta1` Workspaces and, for each:
//!
//! - adds the finalizer `finalizer.managedresource.crossplane.io` (server-side apply);
//! - on a new desired state (spec or `fake.tf.upbound.io/*` annotations) writes
//!   `Synced=True ReconcileSuccess`, `Ready=False Creating`, then after `--delay-ms` writes
//!   the connection Secret and `Ready=True Available` with `atProvider {checksum, outputs}`
//!   (replaced whole), or `Synced=False ReconcileError <message>` keeping `atProvider`;
//! - on deletion writes `Ready=False Deleting`, waits `--delay-ms`, deletes the connection
//!   Secret and removes its finalizer.
//!
//! Status goes by server-side apply on the status subresource under the field manager
//! `fake-provider-terraform`. Nothing is written when the status already says what it should,
//! so the provider's own writes never make it loop. Output values never reach the log.
//!
//! With `--instance NAME` it handles only Workspaces labelled
//! `fake.tf.upbound.io/provider=NAME`; without, only Workspaces that carry no such label.
//! The pure parts live in `capt_tests::fake_provider`.

use anyhow::Context as _;
use capt_tests::fake_provider::{
    API_VERSION, DEFAULT_DELAY_MS, Desired, FIELD_MANAGER, FINALIZER, KIND, Phase, READY_LOG_LINE,
    checksum, connection_secret, connection_secret_ref, merge_patch_between, needs_write, now,
    secret_needs_write, status_apply, watch_selector, workspace_resource,
};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// A fake Crossplane provider-terraform for tests: Workspace status, connection Secrets,
/// failures on request, deletions; driven by `fake.tf.upbound.io/*` annotations.
#[derive(Parser, Debug)]
#[command(name = "fake-terraform-provider", version)]
struct Args {
    /// How long an apply, and a deletion, takes (milliseconds).
    #[arg(long, default_value_t = DEFAULT_DELAY_MS)]
    delay_ms: u64,
    /// Handle only Workspaces labelled `fake.tf.upbound.io/provider=<INSTANCE>`. Without it,
    /// only Workspaces that carry no such label.
    #[arg(long)]
    instance: Option<String>,
    /// Narrow further to Workspaces whose labels match this selector.
    #[arg(long, short = 'l')]
    selector: Option<String>,
    /// How long to wait before retrying after an error (milliseconds).
    #[arg(long, default_value_t = 1000)]
    retry_ms: u64,
    /// Exit when the parent process exits (so that a test's provider never outlives it).
    #[arg(long)]
    exit_with_parent: bool,
}

/// The progress of an apply, per Workspace uid.
#[derive(Debug, Clone)]
struct Track {
    /// [`Desired::state_key`] of the state being applied.
    state: String,
    since: Instant,
    finished: bool,
}

struct Ctx {
    client: Client,
    workspaces: Api<DynamicObject>,
    delay: Duration,
    retry: Duration,
    applies: Mutex<HashMap<String, Track>>,
    deletions: Mutex<HashMap<String, Instant>>,
}

#[derive(Debug)]
struct Error(anyhow::Error);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for Error {}

impl From<anyhow::Error> for Error {
    fn from(e: anyhow::Error) -> Self {
        Self(e)
    }
}

impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Self {
        Self(e.into())
    }
}

impl Error {
    fn is_conflict(&self) -> bool {
        matches!(self.0.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == 409)
    }
}

fn has_finalizer(ws: &DynamicObject) -> bool {
    ws.finalizers().iter().any(|f| f == FINALIZER)
}

async fn reconcile(ws: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = ws.name_any();
    let key = ws.uid().unwrap_or_else(|| name.clone());
    if ws.metadata.deletion_timestamp.is_some() {
        ctx.applies.lock().expect("lock").remove(&key);
        return delete(&ws, &name, &key, &ctx).await;
    }
    if !has_finalizer(&ws) {
        let body = json!({
            "apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": name, "finalizers": [FINALIZER]},
        });
        ctx.workspaces
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(body),
            )
            .await
            .context("adding the finalizer")?;
        info!(workspace = %name, "finalizer added");
    }
    apply(&ws, &name, &key, &ctx).await
}

/// Drives the apply of the Workspace's desired state: Creating at once, the outcome after
/// the delay, and afterwards only repairs when the status or Secret drifted.
async fn apply(ws: &DynamicObject, name: &str, key: &str, ctx: &Ctx) -> Result<Action, Error> {
    let desired = Desired::from_annotations(ws.annotations());
    let spec = ws.data.get("spec").cloned().unwrap_or(Value::Null);
    let state = desired.state_key(&spec);
    let sum = checksum(&spec, &desired);
    let outcome = match &desired.failure {
        Some(message) => Phase::Failed {
            message: message.clone(),
        },
        None => Phase::Available {
            checksum: sum.clone(),
            outputs: desired.outputs.clone(),
        },
    };
    let generation = ws.metadata.generation;
    let mut status = ws.data.get("status").cloned();

    let previous = ctx.applies.lock().expect("lock").get(key).cloned();
    let track = match previous {
        Some(t) if t.state == state => t,
        previous => {
            let done = status_apply(name, generation, status.as_ref(), &outcome, &now());
            let track = if previous.is_none() && !needs_write(status.as_ref(), &done) {
                // Finished before this process knew it (a restart): nothing to redo.
                Track {
                    state,
                    since: Instant::now(),
                    finished: true,
                }
            } else {
                let body =
                    status_apply(name, generation, status.as_ref(), &Phase::Creating, &now());
                if needs_write(status.as_ref(), &body) {
                    status = write_status(ctx, name, &body)
                        .await?
                        .data
                        .get("status")
                        .cloned();
                }
                info!(
                    workspace = %name, checksum = %sum,
                    "apply started: Synced=True ReconcileSuccess, Ready=False Creating"
                );
                Track {
                    state,
                    since: Instant::now(),
                    finished: false,
                }
            };
            ctx.applies
                .lock()
                .expect("lock")
                .insert(key.to_owned(), track.clone());
            track
        }
    };

    if !track.finished {
        let remaining = ctx.delay.saturating_sub(track.since.elapsed());
        if !remaining.is_zero() {
            return Ok(Action::requeue(remaining));
        }
    }

    // The outcome: the Secret first, so that whoever sees Ready=True finds it.
    let mut wrote = false;
    if matches!(outcome, Phase::Available { .. }) {
        wrote |= ensure_secret(ws, name, &desired, ctx).await?;
    }
    let body = status_apply(name, generation, status.as_ref(), &outcome, &now());
    if needs_write(status.as_ref(), &body) {
        write_status(ctx, name, &body).await?;
        wrote = true;
    }
    if !track.finished || wrote {
        let repair = track.finished;
        match &outcome {
            Phase::Failed { message } => info!(
                workspace = %name, repair, failure = %message,
                "apply failed: Synced=False ReconcileError, Ready=False Creating"
            ),
            _ => info!(
                workspace = %name, repair, checksum = %sum,
                outputs = ?desired.output_names(),
                sensitive_outputs = ?desired.sensitive_names(),
                "applied: Synced=True, Ready=True Available"
            ),
        }
    }
    if let Some(t) = ctx.applies.lock().expect("lock").get_mut(key)
        && t.state == track.state
    {
        t.finished = true;
    }
    Ok(Action::await_change())
}

/// Server-side apply of a status body; then, when keys another writer applied survived in
/// `atProvider`, a merge patch that removes them: the provider replaces `atProvider` whole.
async fn write_status(ctx: &Ctx, name: &str, body: &Value) -> Result<DynamicObject, Error> {
    let mut obj = ctx
        .workspaces
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(body),
        )
        .await
        .context("applying status")?;
    if let Some(want) = body["status"].get("atProvider") {
        let have = obj
            .data
            .get("status")
            .and_then(|s| s.get("atProvider"))
            .cloned()
            .unwrap_or(Value::Null);
        if &have != want {
            debug!(workspace = %name, "atProvider kept foreign keys: replacing it whole");
            let patch = json!({"status": {"atProvider": merge_patch_between(&have, want)}});
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.to_owned()),
                ..PatchParams::default()
            };
            obj = ctx
                .workspaces
                .patch_status(name, &params, &Patch::Merge(patch))
                .await
                .context("replacing atProvider")?;
        }
    }
    Ok(obj)
}

/// Creates or updates the connection Secret when the spec asks for one; true when written.
async fn ensure_secret(
    ws: &DynamicObject,
    name: &str,
    desired: &Desired,
    ctx: &Ctx,
) -> Result<bool, Error> {
    let Some(reference) = connection_secret_ref(ws.data.get("spec")) else {
        return Ok(false);
    };
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &reference.namespace);
    let want = connection_secret(&reference, (name, ws.metadata.uid.as_deref()), desired);
    let have = secrets
        .get_opt(&reference.name)
        .await
        .context("reading the connection Secret")?;
    if !secret_needs_write(have.as_ref(), &want) {
        return Ok(false);
    }
    secrets
        .patch(
            &reference.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&want),
        )
        .await
        .with_context(|| {
            format!(
                "writing the connection Secret {}/{}",
                reference.namespace, reference.name
            )
        })?;
    let keys: Vec<String> = desired.connection_data().into_keys().collect();
    info!(
        workspace = %name, secret = %format!("{}/{}", reference.namespace, reference.name),
        ?keys, "connection Secret written"
    );
    Ok(true)
}

/// Ready=False Deleting, then after the delay: the Secret deleted, the finalizer removed.
async fn delete(ws: &DynamicObject, name: &str, key: &str, ctx: &Ctx) -> Result<Action, Error> {
    if !has_finalizer(ws) {
        ctx.deletions.lock().expect("lock").remove(key);
        return Ok(Action::await_change());
    }
    let since = *ctx
        .deletions
        .lock()
        .expect("lock")
        .entry(key.to_owned())
        .or_insert_with(Instant::now);
    let status = ws.data.get("status");
    let mut resource_version = ws.resource_version();
    let body = status_apply(
        name,
        ws.metadata.generation,
        status,
        &Phase::Deleting,
        &now(),
    );
    if needs_write(status, &body) {
        let obj = write_status(ctx, name, &body).await?;
        resource_version = obj.resource_version();
        info!(workspace = %name, "deleting: Ready=False Deleting");
    }
    let remaining = ctx.delay.saturating_sub(since.elapsed());
    if !remaining.is_zero() {
        return Ok(Action::requeue(remaining));
    }
    if let Some(reference) = connection_secret_ref(ws.data.get("spec")) {
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &reference.namespace);
        match secrets
            .delete(&reference.name, &DeleteParams::default())
            .await
        {
            Ok(_) => info!(
                workspace = %name,
                secret = %format!("{}/{}", reference.namespace, reference.name),
                "connection Secret deleted"
            ),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(Error(
                    anyhow::Error::new(e).context("deleting the connection Secret"),
                ));
            }
        }
    }
    let rest: Vec<&String> = ws.finalizers().iter().filter(|f| *f != FINALIZER).collect();
    // The resourceVersion makes this a compare-and-swap: no other finalizer is lost.
    let patch = json!({"metadata": {"finalizers": rest, "resourceVersion": resource_version}});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match ctx
        .workspaces
        .patch(name, &params, &Patch::Merge(patch))
        .await
    {
        Ok(_) => info!(workspace = %name, "finalizer removed"),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(Error::from(e)),
    }
    ctx.deletions.lock().expect("lock").remove(key);
    Ok(Action::await_change())
}

fn error_policy(ws: Arc<DynamicObject>, error: &Error, ctx: Arc<Ctx>) -> Action {
    if error.is_conflict() {
        // A write raced another writer: read again soon, no noise.
        debug!(workspace = %ws.name_any(), %error, "conflict, retrying");
        return Action::requeue(Duration::from_millis(100));
    }
    warn!(workspace = %ws.name_any(), %error, "reconcile failed, retrying");
    Action::requeue(ctx.retry)
}

/// Resolves when the parent process has exited (this process was re-parented).
fn parent_exit() -> futures::channel::oneshot::Receiver<()> {
    let (tx, rx) = futures::channel::oneshot::channel();
    let parent = std::os::unix::process::parent_id();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if std::os::unix::process::parent_id() != parent {
                info!(parent, "parent process exited, stopping");
                let _ = tx.send(());
                return;
            }
        }
    });
    rx
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    let client = Client::try_default()
        .await
        .context("connecting to the API server (KUBECONFIG)")?;
    let resource = workspace_resource();
    let workspaces = Api::<DynamicObject>::all_with(client.clone(), &resource);
    let selector = watch_selector(args.instance.as_deref(), args.selector.as_deref());
    let config = watcher::Config::default().labels(&selector);
    let ctx = Arc::new(Ctx {
        client,
        workspaces: workspaces.clone(),
        delay: Duration::from_millis(args.delay_ms),
        retry: Duration::from_millis(args.retry_ms),
        applies: Mutex::default(),
        deletions: Mutex::default(),
    });

    // Store::wait_until_ready would race the controller's own wait for the same wake-up,
    // so readiness is one LIST of what it watches: the API server answers and the CRD is
    // installed. The watcher lists again then watches from there, so nothing created after
    // this line is missed.
    ctx.workspaces
        .list_metadata(&ListParams::default().labels(&selector).limit(1))
        .await
        .context("listing Workspaces (is the provider-terraform CRD installed?)")?;
    info!(
        delay_ms = args.delay_ms, %selector, field_manager = FIELD_MANAGER,
        "{READY_LOG_LINE}"
    );

    let mut controller = Controller::new_with(workspaces, config, resource).shutdown_on_signal();
    if args.exit_with_parent {
        controller = controller.graceful_shutdown_on(async {
            let _ = parent_exit().await;
        });
    }
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok(_) | Err(controller::Error::ReconcilerFailed(..)) => {}
                Err(controller::Error::ObjectNotFound(obj)) => {
                    debug!(%obj, "gone before reconcile")
                }
                Err(e) => warn!(error = %e, "watch failed, retrying"),
            }
        })
        .await;
    info!("stopped");
    Ok(())
}
