//! The reconcilers: one per kind, each a free function from an object and what it observes
//! to intents (published through the status-applier) and the spec-side work the controller
//! owns (finalizers, WorkspaceTemplateApplies, Workspaces, the deletion order).

pub mod act;
pub mod apply;
pub mod apply_owner;
pub mod capt_cluster;
pub mod claims;
pub mod cluster;
pub mod control_plane;
pub mod deletion;
pub mod kubeconfig;
pub mod observe;
pub mod pause;
pub mod plan;

use crate::context::Context;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

pub use crate::render::CLUSTER_NAME_LABEL;
/// Label on applies and Workspaces naming the kind of the CAPT object they serve.
pub const OWNER_KIND_LABEL: &str = "infrastructure.cluster.x-k8s.io/owner-kind";
/// Label on applies and Workspaces naming the CAPT object they serve.
pub const OWNER_NAME_LABEL: &str = "infrastructure.cluster.x-k8s.io/owner-name";
/// Label on applies and Workspaces naming the namespace of the CAPT object they serve.
pub const OWNER_NAMESPACE_LABEL: &str = "infrastructure.cluster.x-k8s.io/owner-namespace";

/// Why a reconcile failed; each is retried after a delay.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the API server failed.
    #[error("{subject}: {action}: {source}")]
    Kube {
        /// `kind/namespace/name`.
        subject: String,
        /// What was being done.
        action: &'static str,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The status-applier could not take an intent.
    #[error(transparent)]
    Publish(#[from] crate::publish::PublishError),
    /// A Workspace could not be rendered.
    #[error(transparent)]
    Render(#[from] crate::render::RenderError),
    /// A decision kept asking to be made again (a fault of the controller, not of the
    /// object; retried like any failure).
    #[error("{subject}: the decision did not settle in {rounds} rounds")]
    Unsettled {
        /// `kind/namespace/name`.
        subject: String,
        /// How many plans were carried out.
        rounds: usize,
    },
}

impl Error {
    /// The metric label of the error.
    pub fn label(&self) -> &'static str {
        if self.is_fenced() {
            return "not_leading";
        }
        match self {
            Error::Kube { .. } => "kube",
            Error::Publish(_) => "publish",
            Error::Render(_) => "render",
            Error::Unsettled { .. } => "unsettled",
        }
    }
}

impl Error {
    /// Whether a write was not sent because this replica no longer leads (its lead lapsed
    /// during the reconcile): not a failure, and retried once it leads again.
    pub fn is_fenced(&self) -> bool {
        match self {
            Error::Kube {
                source: kube::Error::Service(e),
                ..
            } => e.is::<diagnostics::fence::Fenced>(),
            Error::Publish(crate::publish::PublishError::NotLeading { .. }) => true,
            _ => false,
        }
    }
}

/// The result of a reconcile.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `kind/namespace/name` of an object.
pub fn subject<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        obj.namespace().unwrap_or_default(),
        obj.name_any()
    )
}

/// Logs, counts and retries a failed reconcile.
pub fn error_policy<K: Resource<DynamicType = ()>>(
    obj: Arc<K>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    match error.is_fenced() {
        true => {
            tracing::info!(subject = subject(obj.as_ref()), error = %error, "Reconcile stopped: no longer leading; it runs again once this replica leads")
        }
        false => {
            tracing::warn!(subject = subject(obj.as_ref()), error = %error, "Reconcile failed; retrying")
        }
    }
    ctx.metrics
        .errors
        .get_or_create(&crate::metrics::ErrorLabels {
            kind: K::kind(&()).into(),
            error: error.label().into(),
        })
        .inc();
    Action::requeue(Duration::from_secs(5))
}

/// The hash of what should make a primary object reconcile again: its uid (an object made
/// again under the same name while the watch was away), its generation (spec changes),
/// finalizers, labels, deletion and the pause annotation. Status changes, ours included, do
/// not.
pub fn lifecycle<K: Resource>(obj: &K) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let meta = obj.meta();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.uid.hash(&mut hasher);
    meta.generation.hash(&mut hasher);
    meta.finalizers.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    meta.labels.hash(&mut hasher);
    let pause = crate::status::pause::PAUSED_ANNOTATION;
    let paused = meta.annotations.as_ref().map(|a| a.contains_key(pause));
    paused.hash(&mut hasher);
    Some(hasher.finish())
}

/// The action after a reconcile: look again after `recheck`, or wait for a change.
pub fn after(recheck: Option<Duration>) -> Action {
    match recheck {
        Some(d) => Action::requeue(d),
        None => Action::await_change(),
    }
}

/// Records how long the deletion of an object of `kind` took, from `started` until now.
pub fn deletion_took(ctx: &Context, kind: &str, started: jiff::Timestamp) {
    let seconds = (jiff::Timestamp::now() - started)
        .total(jiff::Unit::Second)
        .unwrap_or(0.0);
    ctx.metrics
        .deletion
        .get_or_create(&crate::metrics::ResourceTypeLabel {
            resource_type: kind.into(),
        })
        .observe(seconds.max(0.0));
}
