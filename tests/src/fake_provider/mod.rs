//! A fake Crossplane provider-terraform, for tests: the pure parts of the
//! `fake-terraform-provider` binary (annotations → desired outcome, checksum, the status as
//! crossplane-runtime builds it, the reconciler's paths and backoff, the connection Secret),
//! and [`FakeProvider`], the binary run as a child process against the test environment.
//!
//! The binary plays provider-terraform v0.18.0 (the version whose CRD the tests install,
//! `hack/tools/crds/go.mod`) on crossplane-runtime v1.16.0's managed reconciler, against the
//! real API server. What it copies, and from where:
//!
//! - crossplane-runtime `pkg/reconciler/managed/reconciler.go` `Reconcile`: one pass is
//!   Observe → (deleting: Delete then `Ready=False Deleting`, or, once nothing exists, remove
//!   the finalizer) → publish the connection details → add the finalizer → Create when
//!   nothing exists (`Ready=False Creating` with `Synced=True ReconcileSuccess`, or with
//!   `Synced=False ReconcileError "create failed: …"`), `Synced=True ReconcileSuccess` when
//!   up to date, else Update (`Synced=False ReconcileError "update failed: …"` on failure,
//!   Ready untouched). Every pass ends in a full status Update (`Status().Update`: a PUT of
//!   the status subresource carrying the resourceVersion read); a 409 requeues
//!   (`SilentlyRequeueOnConflict`). Failures and the pass after a Create requeue with the
//!   rate limiter's backoff; up to date or updated requeues after the poll interval.
//!   `Creating` is set on the Create path only: an update, or a failed apply, of a Workspace
//!   that exists keeps the `Ready` it had (`Available`).
//! - provider-terraform `internal/controller/workspace/workspace.go`: Observe runs `terraform
//!   plan`; a plan error is `observe failed: cannot diff (i.e. plan) Terraform configuration`;
//!   it sets `atProvider` to the non-sensitive outputs of the state and the checksum of the
//!   configuration, and `Ready=True Available` only when the plan shows no diff; the resource
//!   exists when the state has resources or outputs. Create calls Update, which runs
//!   `terraform apply` (`cannot apply Terraform configuration`), sets `atProvider` to the
//!   outputs alone (no checksum until the next Observe) and `Available`. The connection
//!   details are every output, sensitive ones included; `atProvider` holds no sensitive one.
//! - provider-terraform `cmd/provider/main.go` and `workspace.go` `Setup`: `--poll` 10m,
//!   `--max-reconcile-rate` 1, events filtered by `resource.DesiredStateChanged` (a change
//!   of generation, labels or annotations wakes it; its own status writes do not).
//! - crossplane-runtime `pkg/ratelimiter/default.go`: per-item backoff 1 s doubling to 60 s.
//! - crossplane-runtime `pkg/reconciler/managed/api.go`: the connection Secret (see
//!   `connection_secret`); `pkg/resource/api.go` `APIFinalizer`: the finalizer
//!   added and removed by an Update of the object.
//!
//! - crossplane-runtime `Reconcile`, first thing after the read: `crossplane.io/paused:
//!   "true"` sets `Synced=False ReconcilePaused` (no message), keeps `Ready`, writes the
//!   status and waits for a change, deleting or not.
//!
//! - `Reconcile`, after the pause: a deleted Workspace with `spec.deletionPolicy: Orphan`
//!   loses its finalizer with no Observe and no destroy; then `meta.ExternalCreateIncomplete`
//!   (`crossplane.io/external-create-pending` later than the create's recorded result, as a
//!   provider that stopped mid-apply leaves it) sets `Ready=False Creating` and `Synced=False
//!   ReconcileError "cannot determine creation result - …"` and waits for a change, deleting
//!   or not. The fake never writes the `external-create-*` annotations itself (a test writes
//!   the pending one, as a crash leaves it), nor the Warning Event the real one records.
//!
//! Not modelled: management policies,
//! `--poll-jitter`, the global rate limit, the Terraform timeout.
//! `Unavailable` is never set: neither the managed reconciler nor provider-terraform does.
//!
//! - Terraform's outputs: an inline HCL module's `output` whose value is a string literal is
//!   reported as tofu reports it (CAPT's `capt_revision` echo is one); every other output
//!   comes from the annotations below, since the fake evaluates no Terraform.
//!
//! What a test asks for is read from annotations: [`OUTPUTS_ANNOTATION`],
//! [`SENSITIVE_OUTPUTS_ANNOTATION`], [`FAIL_ANNOTATION`] (every apply fails),
//! [`FAIL_TIMES_ANNOTATION`] (the first N applies fail, then it recovers by itself),
//! [`FAIL_DESTROY_ANNOTATION`] (every destroy fails), [`APPLY_GATE_ANNOTATION`] (an apply waits for a file), [`PAUSED_ANNOTATION`] (as the real one),
//! [`REVISION_ANNOTATION`]. Writes are made under [`FIELD_MANAGER`] (operation `Update`).
//!
//! This file holds the Workspace's names and annotations and the provider's watch selector;
//! the rest is in submodules, re-exported here: `desired` (the outcome a test asks for, and
//! its checksum), `status` (the Workspace status and the reconciler's paths),
//! `connection_secret` and `process` ([`FakeProvider`]).

mod connection_secret;
mod desired;
mod process;
mod status;
#[cfg(test)]
mod tests;

pub use connection_secret::{
    SecretRef, connection_secret, connection_secret_ref, secret_needs_write,
};
pub use desired::{AnnotationError, Desired, canonical_json, checksum, literal_module_outputs};
pub use process::FakeProvider;
pub use status::{
    Cond, Path, applied_at_provider, at_provider, backoff, condition, external_create_incomplete,
    message, now, orphaned, pass_conditions, path, set_conditions, typed_status,
};

use kube::core::{ApiResource, GroupVersionKind};

/// The Workspace's group.
pub const GROUP: &str = "tf.upbound.io";
/// The Workspace's apiVersion.
pub const API_VERSION: &str = "tf.upbound.io/v1beta1";
/// The Workspace's kind.
pub const KIND: &str = "Workspace";
/// The field manager of every write the fake provider makes.
pub const FIELD_MANAGER: &str = "fake-provider-terraform";
/// The finalizer Crossplane managed resources carry.
pub const FINALIZER: &str = "finalizer.managedresource.crossplane.io";
/// The type of a Crossplane connection Secret.
pub const SECRET_TYPE: &str = "connection.crossplane.io/v1alpha1";
/// A JSON object of Terraform outputs (absent: no outputs).
pub const OUTPUTS_ANNOTATION: &str = "fake.tf.upbound.io/outputs";
/// A JSON object of sensitive outputs: in the connection Secret only, never in `atProvider`.
pub const SENSITIVE_OUTPUTS_ANNOTATION: &str = "fake.tf.upbound.io/sensitive-outputs";
/// When present and not empty, every apply fails with this message.
pub const FAIL_ANNOTATION: &str = "fake.tf.upbound.io/fail";
/// A whole number N: the first N applies of the configuration fail with a transient error,
/// then the provider recovers by itself (retrying with backoff).
pub const FAIL_TIMES_ANNOTATION: &str = "fake.tf.upbound.io/fail-times";
/// When present and not empty, every destroy fails with this message (`delete failed: …`,
/// `Ready=False Deleting` kept, retried with backoff), as a module whose destroy fails.
pub const FAIL_DESTROY_ANNOTATION: &str = "fake.tf.upbound.io/fail-destroy";
/// A file path: an apply (Create or Update) waits until the file exists, writing nothing
/// meanwhile, as a long `terraform apply` does. Not read while deleting.
pub const APPLY_GATE_ANNOTATION: &str = "fake.tf.upbound.io/apply-gate";
/// crossplane-runtime's pause annotation (`meta.AnnotationKeyReconciliationPaused`): the
/// value `true` pauses the Workspace's reconciliation.
pub const PAUSED_ANNOTATION: &str = "crossplane.io/paused";
/// Any string: a change makes the provider re-apply (a new checksum).
pub const REVISION_ANNOTATION: &str = "fake.tf.upbound.io/revision";
/// A Workspace labelled with this belongs to the provider started with `--instance <value>`
/// only; a provider started without `--instance` leaves such Workspaces alone. Tests that run
/// their own provider use it so that no other provider on the same API server interferes.
pub const INSTANCE_LABEL: &str = "fake.tf.upbound.io/provider";
/// The default of `--delay-ms`: how long an apply or a destroy "runs".
pub const DEFAULT_DELAY_MS: u64 = 200;
/// The default of `--poll-interval-ms`: provider-terraform's `--poll` (10m).
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 600_000;
/// The default of `--backoff-base-ms`: crossplane-runtime's rate limiter base (1 s).
pub const DEFAULT_BACKOFF_BASE_MS: u64 = 1_000;
/// The default of `--backoff-max-ms`: crossplane-runtime's rate limiter maximum (60 s).
pub const DEFAULT_BACKOFF_MAX_MS: u64 = 60_000;
/// crossplane-runtime's `meta.AnnotationKeyExternalCreatePending`: written just before a
/// create; left behind when the provider stops before recording the result.
pub const EXTERNAL_CREATE_PENDING: &str = "crossplane.io/external-create-pending";
/// `meta.AnnotationKeyExternalCreateSucceeded`.
pub const EXTERNAL_CREATE_SUCCEEDED: &str = "crossplane.io/external-create-succeeded";
/// `meta.AnnotationKeyExternalCreateFailed`.
pub const EXTERNAL_CREATE_FAILED: &str = "crossplane.io/external-create-failed";
/// The annotation the managed reconciler ignores as a desired-state change (it writes them).
pub const IGNORED_ANNOTATIONS: [&str; 2] = [EXTERNAL_CREATE_PENDING, EXTERNAL_CREATE_FAILED];
/// What the binary logs once its first list of Workspaces is in its cache.
pub const READY_LOG_LINE: &str = "watching Workspaces";

/// The Workspace resource, for `Api<DynamicObject>::all_with`.
pub fn workspace_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1beta1", KIND), "workspaces")
}

/// The label selector a provider watches with: its instance's Workspaces (or, without an
/// instance, those of no instance), narrowed by `selector` when given.
pub fn watch_selector(instance: Option<&str>, selector: Option<&str>) -> String {
    let own = match instance {
        Some(name) => format!("{INSTANCE_LABEL}={name}"),
        None => format!("!{INSTANCE_LABEL}"),
    };
    match selector.map(str::trim).filter(|s| !s.is_empty()) {
        Some(extra) => format!("{own},{extra}"),
        None => own,
    }
}
