//! `fake-terraform-provider`: plays Crossplane provider-terraform v0.18.0 (on
//! crossplane-runtime v1.16.0's managed reconciler) against a real API server, for tests.
//! Each pass over a `tf.upbound.io/v1beta1` Workspace is one `managed.Reconciler.Reconcile`:
//!
//! - Observe: the fake's in-memory Terraform state per Workspace uid says whether the
//!   resource exists and which configuration (checksum) was applied; `atProvider` becomes
//!   `{checksum of the configuration now, non-sensitive outputs of the state}`; no diff sets
//!   `Ready=True Available`. Invalid `fake.tf.upbound.io/*` annotations are a plan error.
//! - Deleting: destroy (`--delay-ms`), `Ready=False Deleting` + `Synced=True`; the next pass
//!   removes the finalizer by an Update. The connection Secret is left to the garbage
//!   collector (its ownerReference), as crossplane-runtime's publisher does.
//! - Publish the connection Secret (every output of the state, sensitive ones included).
//! - Add the finalizer `finalizer.managedresource.crossplane.io` by an Update of the object.
//! - Create (nothing exists): `terraform apply` (`--delay-ms`, nothing written meanwhile),
//!   then `Ready=False Creating` with `Synced=True ReconcileSuccess` and `atProvider` holding
//!   the outputs only, or with `Synced=False ReconcileError "create failed: …"`.
//! - Up to date: `Synced=True ReconcileSuccess`; requeue after `--poll-interval-ms`.
//! - Update (a diff): apply; `Available` + `Synced=True`, or `Synced=False ReconcileError
//!   "update failed: …"` with `Ready` as it was.
//!
//! Every pass ends with a full status Update (PUT of the status subresource with the
//! resourceVersion read) under the field manager `fake-provider-terraform`; a 409 requeues.
//! A pass that changes nothing sends a PUT the API server treats as a no-op (no new
//! resourceVersion), as provider-terraform does at every poll: tests that count write
//! requests in the API server's audit log tell them apart (`capt_tests::audit_log`).
//! Failures, and the pass after a Create, requeue with the per-Workspace
//! exponential backoff (`--backoff-base-ms`, `--backoff-max-ms`). Only a change of
//! generation, labels or annotations (not the provider's own writes) wakes a Workspace
//! early. Output values never reach the log. Which source each behaviour comes from is in
//! `capt_tests::fake_provider` (the module's documentation).
//!
//! With `--instance NAME` it handles only Workspaces labelled
//! `fake.tf.upbound.io/provider=NAME`; without, only Workspaces that carry no such label.
//! The pure parts live in `capt_tests::fake_provider`.

use anyhow::Context as _;
use capt_tests::fake_provider::{
    APPLY_GATE_ANNOTATION, Cond, DEFAULT_BACKOFF_BASE_MS, DEFAULT_BACKOFF_MAX_MS, DEFAULT_DELAY_MS,
    DEFAULT_POLL_INTERVAL_MS, Desired, FAIL_DESTROY_ANNOTATION, FIELD_MANAGER, FINALIZER,
    IGNORED_ANNOTATIONS, PAUSED_ANNOTATION, Path, READY_LOG_LINE, applied_at_provider, at_provider,
    backoff, checksum, condition, connection_secret, connection_secret_ref,
    external_create_incomplete, message, now, orphaned, pass_conditions, path, secret_needs_write,
    set_conditions, typed_status, watch_selector, workspace_resource,
};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, ResourceExt};
use serde_json::Value;
use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{debug, info, warn};

/// A fake Crossplane provider-terraform for tests: Workspace status, connection Secrets,
/// failures on request, deletions; driven by `fake.tf.upbound.io/*` annotations.
#[derive(Parser, Debug)]
#[command(name = "fake-terraform-provider", version)]
struct Args {
    /// How long an apply, and a destroy, takes (milliseconds). The pass waits for it, as
    /// provider-terraform waits for `terraform apply`.
    #[arg(long, default_value_t = DEFAULT_DELAY_MS)]
    delay_ms: u64,
    /// How often an up-to-date Workspace is observed again (provider-terraform's `--poll`).
    #[arg(long, default_value_t = DEFAULT_POLL_INTERVAL_MS)]
    poll_interval_ms: u64,
    /// The first backoff after a failure (crossplane-runtime: 1 s); it doubles per failure.
    #[arg(long, default_value_t = DEFAULT_BACKOFF_BASE_MS)]
    backoff_base_ms: u64,
    /// The longest backoff (crossplane-runtime: 60 s).
    #[arg(long, default_value_t = DEFAULT_BACKOFF_MAX_MS)]
    backoff_max_ms: u64,
    /// How many Workspaces are reconciled at once (provider-terraform's
    /// `--max-reconcile-rate`, default 1).
    #[arg(long, default_value_t = 1)]
    max_reconcile_rate: u16,
    /// Handle only Workspaces labelled `fake.tf.upbound.io/provider=<INSTANCE>`. Without it,
    /// only Workspaces that carry no such label.
    #[arg(long)]
    instance: Option<String>,
    /// Narrow further to Workspaces whose labels match this selector.
    #[arg(long, short = 'l')]
    selector: Option<String>,
    /// Exit when the parent process exits (so that a test's provider never outlives it).
    #[arg(long)]
    exit_with_parent: bool,
}

/// The Terraform state of one Workspace: what the last successful apply applied.
#[derive(Debug, Clone)]
struct Applied {
    /// The checksum of the configuration applied.
    checksum: String,
    /// Its outputs (sensitive ones too).
    outputs: Desired,
}

struct Ctx {
    client: Client,
    workspaces: Api<DynamicObject>,
    delay: Duration,
    poll: Duration,
    backoff_base: Duration,
    backoff_max: Duration,
    /// The Terraform state per Workspace uid.
    state: Mutex<HashMap<String, Applied>>,
    /// Applies tried per uid for one configuration (checksum), for `fail-times`.
    attempts: Mutex<HashMap<String, (String, u32)>>,
    /// Requeues with backoff since the last success, per uid (the rate limiter's count).
    failures: Mutex<HashMap<String, u32>>,
}

impl Ctx {
    /// `Requeue: true`: the rate limiter's next delay for this Workspace.
    fn rate_limited(&self, key: &str) -> Action {
        let mut failures = self.failures.lock().expect("lock");
        let n = failures.entry(key.to_owned()).or_insert(0);
        let wait = backoff(*n, self.backoff_base, self.backoff_max);
        *n += 1;
        Action::requeue(wait)
    }

    /// `RequeueAfter: poll` (or done): the rate limiter forgets the Workspace.
    fn forget(&self, key: &str, action: Action) -> Action {
        self.failures.lock().expect("lock").remove(key);
        action
    }
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
        self.0.chain().any(|e| {
            matches!(e.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == 409)
        })
    }
}

fn has_finalizer(ws: &DynamicObject) -> bool {
    ws.finalizers().iter().any(|f| f == FINALIZER)
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

/// `resource.DesiredStateChanged`: generation, labels and annotations (but the two the
/// reconciler writes itself). A status write changes none of them.
fn desired_state(ws: &DynamicObject) -> Option<u64> {
    let mut h = DefaultHasher::new();
    ws.metadata.generation.hash(&mut h);
    ws.labels().hash(&mut h);
    ws.annotations()
        .iter()
        .filter(|(k, _)| !IGNORED_ANNOTATIONS.contains(&k.as_str()))
        .for_each(|kv| kv.hash(&mut h));
    Some(h.finish())
}

/// The Terraform state of a Workspace this process has not seen yet: after a restart, one
/// that was Available is taken as applied with the outputs it reports (the real provider
/// keeps its state on disk or in a backend).
fn seed_state(ws: &DynamicObject) -> Option<Applied> {
    let status = ws.data.get("status");
    let ready = condition(status, "Ready")?;
    if ready.get("reason").and_then(Value::as_str) != Some("Available") {
        return None;
    }
    let at = status?.get("atProvider")?;
    let outputs = at
        .get("outputs")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    Some(Applied {
        checksum: at.get("checksum")?.as_str()?.to_owned(),
        outputs: Desired {
            outputs,
            ..Desired::default()
        },
    })
}

/// One pass of crossplane-runtime's `managed.Reconciler.Reconcile` over a Workspace.
async fn reconcile(ws: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = ws.name_any();
    let key = ws.uid().unwrap_or_else(|| name.clone());
    let deleting = ws.metadata.deletion_timestamp.is_some();
    if deleting && !has_finalizer(&ws) {
        return Ok(ctx.forget(&key, Action::await_change()));
    }
    let mut obj = (*ws).clone();
    let mut status = typed_status(ws.data.get("status"));
    let spec = ws.data.get("spec").cloned().unwrap_or(Value::Null);

    // Paused: checked before anything else, deletion included; the annotation's removal (a
    // desired-state change) wakes it.
    if ws.annotations().get(PAUSED_ANNOTATION).map(String::as_str) == Some("true") {
        set_conditions(&mut status, &[Cond::ReconcilePaused], &now());
        put_status(&ctx, &mut obj, status).await?;
        info!(workspace = %name, "paused: Synced=False ReconcilePaused");
        return Ok(ctx.forget(&key, Action::await_change()));
    }

    // deletionPolicy Orphan: no Observe and no destroy; the finalizer goes at once and the
    // Terraform state (and what it describes) stays.
    if deleting && orphaned(&spec) {
        info!(workspace = %name, "deletionPolicy Orphan: finalizer removed, nothing destroyed");
        return finalize(&ctx, obj, &name, &key).await;
    }

    // A create that started and never recorded its result (the provider stopped mid-apply):
    // refuse to go on until a person removes the pending annotation, deleting or not.
    if external_create_incomplete(ws.annotations()) {
        let conds = [
            Cond::Creating,
            Cond::ReconcileError(message::create_incomplete()),
        ];
        set_conditions(&mut status, &conds, &now());
        put_status(&ctx, &mut obj, status).await?;
        warn!(workspace = %name, "cannot determine creation result: waits for a person");
        return Ok(ctx.forget(&key, Action::await_change()));
    }

    // Observe: `terraform plan` fails on input it cannot use (ignored while deleting).
    let observed = match observe(&ws, &ctx, &spec, &key, deleting, &mut status) {
        Ok(observed) => observed,
        Err(text) => {
            warn!(workspace = %name, error = %text, "observe failed");
            set_conditions(&mut status, &[Cond::ReconcileError(text)], &now());
            put_status(&ctx, &mut obj, status).await?;
            return Ok(ctx.rate_limited(&key));
        }
    };
    let (applied, up_to_date) = (observed.applied.is_some(), observed.up_to_date);
    match path(deleting, applied, up_to_date) {
        Path::Delete => return destroy(&ctx, &ws, obj, status, &name, &key).await,
        Path::Finalize => return finalize(&ctx, obj, &name, &key).await,
        _ => {}
    }
    publish_and_add_finalizer(&ctx, &mut obj, &name, observed.applied.as_ref()).await?;

    let route = path(false, applied, up_to_date);
    if route == Path::UpToDate {
        debug!(workspace = %name, checksum = %observed.sum, "observed: up to date");
        set_conditions(&mut status, &pass_conditions(route, Ok(())), &now());
        put_status(&ctx, &mut obj, status).await?;
        return Ok(ctx.forget(&key, Action::requeue(ctx.poll)));
    }
    terraform_apply(&ctx, &ws, obj, status, route, observed, &key).await
}

/// What Observe found: the desired configuration and its checksum, what the state holds,
/// and whether they agree.
struct Observation {
    desired: Desired,
    sum: String,
    applied: Option<Applied>,
    up_to_date: bool,
}

/// Observe: the desired configuration from the Workspace (`terraform plan` fails on input it
/// cannot use: the message, unless deleting), the state (seeded from the status when the
/// process has none), atProvider from the state, and Available when up to date.
fn observe(
    ws: &DynamicObject,
    ctx: &Ctx,
    spec: &Value,
    key: &str,
    deleting: bool,
    status: &mut Value,
) -> Result<Observation, String> {
    let desired = match Desired::parse(ws.annotations()) {
        Ok(d) => d.with_module_outputs(spec),
        Err(_) if deleting => Desired::default(),
        Err(e) => {
            return Err(message::observe(&format!(
                "invalid fake provider input: {e}"
            )));
        }
    };
    let sum = checksum(spec, &desired);
    let applied = {
        let mut state = ctx.state.lock().expect("lock");
        if !state.contains_key(key)
            && let Some(seed) = seed_state(ws)
        {
            state.insert(key.to_owned(), seed);
        }
        state.get(key).cloned()
    };
    let state_outputs = applied
        .as_ref()
        .map(|a| a.outputs.outputs.clone())
        .unwrap_or_default();
    status["atProvider"] = at_provider(&sum, &state_outputs);
    let up_to_date = !desired.differs(&sum, applied.as_ref().map(|a| a.checksum.as_str()));
    if up_to_date {
        set_conditions(status, &[Cond::Available], &now());
    }
    Ok(Observation {
        desired,
        sum,
        applied,
        up_to_date,
    })
}

/// Delete: `terraform destroy`, refused when the test asks; destroyed, the state goes and
/// the finalizer stays for the next pass.
async fn destroy(
    ctx: &Ctx,
    ws: &DynamicObject,
    mut obj: DynamicObject,
    mut status: Value,
    name: &str,
    key: &str,
) -> Result<Action, Error> {
    tokio::time::sleep(ctx.delay).await; // terraform destroy
    let refusal = ws.annotations().get(FAIL_DESTROY_ANNOTATION);
    if let Some(cause) = refusal.filter(|c| !c.is_empty()) {
        set_conditions(
            &mut status,
            &pass_conditions(Path::Delete, Err(cause)),
            &now(),
        );
        put_status(ctx, &mut obj, status).await?;
        info!(workspace = %name, failure = %cause, "destroy failed: Synced=False ReconcileError");
        return Ok(ctx.rate_limited(key));
    }
    ctx.state.lock().expect("lock").remove(key);
    set_conditions(&mut status, &pass_conditions(Path::Delete, Ok(())), &now());
    put_status(ctx, &mut obj, status).await?;
    info!(workspace = %name, "destroyed: Ready=False Deleting");
    Ok(ctx.rate_limited(key))
}

/// The observation's connection details (every output of the state) published, and the
/// finalizer added if missing.
async fn publish_and_add_finalizer(
    ctx: &Ctx,
    obj: &mut DynamicObject,
    name: &str,
    applied: Option<&Applied>,
) -> Result<(), Error> {
    let details = applied.map(|a| a.outputs.clone()).unwrap_or_default();
    publish_connection(obj, name, &details, ctx).await?;
    if !has_finalizer(obj) {
        obj.finalizers_mut().push(FINALIZER.to_owned());
        let updated = ctx
            .workspaces
            .replace(name, &post_params(), obj)
            .await
            .context("adding the finalizer")?;
        obj.metadata = updated.metadata;
        info!(workspace = %name, "finalizer added");
    }
    Ok(())
}

/// Create or Update: `terraform apply`, for as long as it takes (and for as long as the
/// test's gate file is missing); nothing is written meanwhile. Then its outcome: the
/// failure the test asked for, or the state, atProvider and connection details.
async fn terraform_apply(
    ctx: &Ctx,
    ws: &DynamicObject,
    mut obj: DynamicObject,
    mut status: Value,
    route: Path,
    observed: Observation,
    key: &str,
) -> Result<Action, Error> {
    let name = ws.name_any();
    let Observation { desired, sum, .. } = observed;
    let attempt = {
        let mut attempts = ctx.attempts.lock().expect("lock");
        let entry = attempts
            .entry(key.to_owned())
            .or_insert_with(|| (sum.clone(), 0));
        if entry.0 != sum {
            *entry = (sum.clone(), 0);
        }
        entry.1 += 1;
        entry.1 - 1
    };
    if let Some(gate) = ws
        .annotations()
        .get(APPLY_GATE_ANNOTATION)
        .filter(|g| !g.is_empty())
    {
        // An apply that takes as long as the test wants (a file is the test's signal: the
        // real module in tests/tests/real_provider.rs waits the same way).
        info!(workspace = %name, gate = %gate, "apply waits for its gate file");
        while !std::path::Path::new(gate).exists() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(ctx.delay).await;
    let creating = route == Path::Create;
    match desired.apply_outcome(attempt) {
        Err(cause) => {
            set_conditions(&mut status, &pass_conditions(route, Err(&cause)), &now());
            put_status(ctx, &mut obj, status).await?;
            info!(workspace = %name, creating, failure = %cause, "apply failed: Synced=False ReconcileError");
            Ok(ctx.rate_limited(key))
        }
        Ok(()) => {
            let done = Applied {
                checksum: sum.clone(),
                outputs: desired.clone(),
            };
            ctx.state.lock().expect("lock").insert(key.to_owned(), done);
            status["atProvider"] = applied_at_provider(&desired.outputs);
            set_conditions(&mut status, &pass_conditions(route, Ok(())), &now());
            publish_connection(&obj, &name, &desired, ctx).await?;
            info!(
                workspace = %name, creating, checksum = %sum,
                outputs = ?desired.output_names(),
                sensitive_outputs = ?desired.sensitive_names(),
                "applied"
            );
            put_status(ctx, &mut obj, status).await?;
            if creating {
                // The reconciler overwrote Update's Available with Creating; the next pass
                // (after the rate limiter's delay) observes Available.
                return Ok(ctx.rate_limited(key));
            }
            Ok(ctx.forget(key, Action::requeue(ctx.poll)))
        }
    }
}

/// Removes the finalizer by an Update (`RemoveFinalizer`); UnpublishConnection does nothing:
/// the Secret goes by garbage collection.
async fn finalize(
    ctx: &Ctx,
    mut obj: DynamicObject,
    name: &str,
    key: &str,
) -> Result<Action, Error> {
    obj.finalizers_mut().retain(|f| f != FINALIZER);
    match ctx.workspaces.replace(name, &post_params(), &obj).await {
        Ok(_) => info!(workspace = %name, "finalizer removed"),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => {
            return Err(Error(
                anyhow::Error::new(e).context("removing the finalizer"),
            ));
        }
    }
    ctx.attempts.lock().expect("lock").remove(key);
    Ok(ctx.forget(key, Action::await_change()))
}

/// `r.client.Status().Update(ctx, managed)`: the object as read, with this status, PUT on
/// the status subresource; the resourceVersion read makes a stale write a 409.
async fn put_status(ctx: &Ctx, obj: &mut DynamicObject, status: Value) -> Result<(), Error> {
    obj.data["status"] = status;
    let updated = ctx
        .workspaces
        .replace_status(&obj.name_any(), &post_params(), obj)
        .await
        .context("updating status")?;
    obj.metadata = updated.metadata;
    Ok(())
}

/// `APISecretPublisher.PublishConnection`: create the Secret when missing, else merge-patch
/// the desired Secret when its data differs (keys are never removed).
async fn publish_connection(
    ws: &DynamicObject,
    name: &str,
    details: &Desired,
    ctx: &Ctx,
) -> Result<(), Error> {
    let Some(reference) = connection_secret_ref(ws.data.get("spec")) else {
        return Ok(());
    };
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &reference.namespace);
    let want = connection_secret(&reference, (name, ws.metadata.uid.as_deref()), details);
    let have = secrets
        .get_opt(&reference.name)
        .await
        .context("reading the connection Secret")?;
    if !secret_needs_write(have.as_ref(), &want) {
        return Ok(());
    }
    let target = format!("{}/{}", reference.namespace, reference.name);
    let written = match have {
        None => secrets.create(&post_params(), &want).await,
        Some(_) => {
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.to_owned()),
                ..PatchParams::default()
            };
            secrets
                .patch(&reference.name, &params, &Patch::Merge(&want))
                .await
        }
    };
    written.with_context(|| format!("writing the connection Secret {target}"))?;
    let keys: Vec<String> = details.connection_data().into_keys().collect();
    info!(workspace = %name, secret = %target, ?keys, "connection Secret written");
    Ok(())
}

fn error_policy(ws: Arc<DynamicObject>, error: &Error, ctx: Arc<Ctx>) -> Action {
    let key = ws.uid().unwrap_or_else(|| ws.name_any());
    if error.is_conflict() {
        // SilentlyRequeueOnConflict: no condition, no noise, the rate limiter's delay.
        debug!(workspace = %ws.name_any(), %error, "conflict, requeued");
    } else {
        warn!(workspace = %ws.name_any(), %error, "reconcile failed, retrying");
    }
    ctx.rate_limited(&key)
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
        poll: Duration::from_millis(args.poll_interval_ms),
        backoff_base: Duration::from_millis(args.backoff_base_ms),
        backoff_max: Duration::from_millis(args.backoff_max_ms),
        state: Mutex::default(),
        attempts: Mutex::default(),
        failures: Mutex::default(),
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
        delay_ms = args.delay_ms, poll_interval_ms = args.poll_interval_ms,
        backoff_base_ms = args.backoff_base_ms, max_reconcile_rate = args.max_reconcile_rate,
        %selector, field_manager = FIELD_MANAGER, "{READY_LOG_LINE}"
    );

    // Woken by desired-state changes only (`resource.DesiredStateChanged`), not by the
    // provider's own status writes; requeues (poll, backoff) come from the reconciler.
    let writer = reflector::store::Writer::<DynamicObject>::new(resource.clone());
    let reader = writer.as_reader();
    let stream = watcher(workspaces, config)
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(desired_state, Default::default());
    let mut controller = Controller::for_stream_with(stream, reader, resource)
        .with_config(controller::Config::default().concurrency(args.max_reconcile_rate))
        .shutdown_on_signal();
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
