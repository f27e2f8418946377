//! A fake Crossplane provider-terraform, for tests: the pure parts of the
//! `fake-terraform-provider` binary (annotations → desired outcome, checksum, status apply
//! bodies, "is a write needed", the connection Secret), and [`FakeProvider`], the binary run as
//! a child process against the test environment.
//!
//! The binary plays provider-terraform's part against the real API server. For each
//! `tf.upbound.io/v1beta1` `Workspace` it adds the finalizer [`FINALIZER`], reads the outcome a
//! test wants from the annotations ([`OUTPUTS_ANNOTATION`], [`SENSITIVE_OUTPUTS_ANNOTATION`],
//! [`FAIL_ANNOTATION`], [`REVISION_ANNOTATION`]), writes `Synced=True/ReconcileSuccess` and
//! `Ready=False/Creating` at once, and after `--delay-ms` either `Ready=True/Available` with
//! `atProvider {checksum, outputs}` (and the connection Secret), or `Synced=False/ReconcileError`.
//! Status is written by server-side apply on the status subresource under [`FIELD_MANAGER`].
//!
//! This file holds the Workspace's names and annotations and the provider's watch selector;
//! the rest is in submodules, re-exported here: `desired` (the outcome a test asks for, and
//! its checksum), `status` (the Workspace status the provider writes), `connection_secret`
//! and `process` ([`FakeProvider`]).

mod connection_secret;
mod desired;
mod process;
mod status;
#[cfg(test)]
mod tests;

pub use connection_secret::{
    SecretRef, connection_secret, connection_secret_ref, secret_needs_write,
};
pub use desired::{AnnotationError, Desired, canonical_json, checksum};
pub use process::FakeProvider;
pub use status::{
    Phase, at_provider, condition, merge_patch_between, needs_write, now, status_apply,
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
/// When present and not empty, the apply fails with this message.
pub const FAIL_ANNOTATION: &str = "fake.tf.upbound.io/fail";
/// Any string: a change makes the provider re-apply (a new checksum).
pub const REVISION_ANNOTATION: &str = "fake.tf.upbound.io/revision";
/// A Workspace labelled with this belongs to the provider started with `--instance <value>`
/// only; a provider started without `--instance` leaves such Workspaces alone. Tests that run
/// their own provider use it so that no other provider on the same API server interferes.
pub const INSTANCE_LABEL: &str = "fake.tf.upbound.io/provider";
/// The default of `--delay-ms`: how long an apply or a deletion "runs".
pub const DEFAULT_DELAY_MS: u64 = 200;
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
