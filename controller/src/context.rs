//! What every reconciler shares.

use crate::metrics::Metrics;
use crate::publish::{Publication, PublishError, Publisher};
use crate::status::deletion::DEFAULT_STUCK_AFTER;
use std::time::Duration;

/// Settings of the reconcilers.
#[derive(Clone, Debug)]
pub struct Settings {
    /// A deletion running longer than this is reported as stuck (`DeletionFailed`).
    pub stuck_deletion_after: Duration,
    /// How often to look again while waiting for something not watched (Secrets).
    pub poll_interval: Duration,
}

/// How often to look again, by default, while waiting for something not watched.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);

impl Default for Settings {
    fn default() -> Self {
        Self {
            stuck_deletion_after: DEFAULT_STUCK_AFTER,
            poll_interval: DEFAULT_POLL_INTERVAL,
        }
    }
}

/// The reconcilers' shared context.
pub struct Context {
    /// The API client (reads; spec-side writes: finalizers, applies, Workspaces).
    pub client: kube::Client,
    /// Status and endpoint writes go through the status-applier, only.
    pub publisher: Publisher,
    /// Metrics.
    pub metrics: Metrics,
    /// Settings.
    pub settings: Settings,
}

impl Context {
    /// Publishes an intent, counting it when it was sent.
    pub async fn publish(&self, publication: Publication) -> Result<(), PublishError> {
        let manager = publication.field_manager;
        if self.publisher.publish(publication).await? {
            self.metrics
                .intents
                .get_or_create(&crate::metrics::ManagerLabel {
                    manager: manager.into(),
                })
                .inc();
        }
        Ok(())
    }
}
