//! What every reconciler shares.

use crate::metrics::Metrics;
use crate::publish::{Publication, PublishError, Published, Publisher};
use crate::rewake::Rewake;
use crate::status::deletion::DEFAULT_STUCK_AFTER;
use crate::watches::Caches;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Resource, ResourceExt};
use std::collections::BTreeSet;
use std::time::Duration;

/// Settings of the reconcilers.
#[derive(Clone, Debug)]
pub struct Settings {
    /// A deletion running longer than this is reported as stuck (`DeletionFailed`).
    pub stuck_deletion_after: Duration,
    /// How often to look again while waiting for something not watched (Secrets).
    pub poll_interval: Duration,
    /// Namespaces whose WorkspaceTemplates objects of any namespace may use
    /// (`--allow-template-namespace`). Every other reference stays in its object's namespace.
    pub allowed_template_namespaces: BTreeSet<String>,
}

/// How often to look again, by default, while waiting for something not watched.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);

impl Default for Settings {
    fn default() -> Self {
        Self {
            stuck_deletion_after: DEFAULT_STUCK_AFTER,
            poll_interval: DEFAULT_POLL_INTERVAL,
            allowed_template_namespaces: BTreeSet::new(),
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
    /// Kubernetes Events (`events.k8s.io`) about the objects, as reporter `capt-controller`.
    pub events: Recorder,
    /// What the watches saw: the reconcilers read these, not the API server.
    pub caches: Caches,
    /// Wakes an object whose publication was computed on a cache behind our own write.
    pub rewake: Rewake,
}

impl Context {
    /// Publishes an intent, counting it when it was sent.
    pub async fn publish(&self, publication: Publication) -> Result<Published, PublishError> {
        let label = crate::metrics::ManagerLabel {
            manager: publication.field_manager.into(),
        };
        let target = publication.target.clone();
        let published = self.publisher.publish(publication).await?;
        if let Published::Behind { awaiting, .. } = published {
            self.metrics.behind.get_or_create(&label).inc();
            let (kind, namespace, name) = (target.kind, target.namespace, target.name);
            self.rewake.when_seen(&kind, namespace, name, awaiting);
        }
        if published.was_sent() {
            self.metrics.intents.get_or_create(&label).inc();
        }
        Ok(published)
    }

    /// Publishes a Warning Event on `obj`. A failure is logged, not returned: an Event is a
    /// courtesy, the condition is the record.
    pub async fn warn<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(error) = self.events.publish(&event, &obj.object_ref(&())).await {
            tracing::warn!(
                object = obj.name_any(),
                reason,
                %error,
                "Could not publish an Event"
            );
        }
    }
}

/// The Event recorder of the controller: reporter `capt-controller`, instance the pod's name.
pub fn recorder(client: kube::Client) -> Recorder {
    let reporter = kube::runtime::events::Reporter {
        controller: "capt-controller".into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    Recorder::new(client, reporter)
}
