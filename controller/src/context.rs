//! What every reconciler shares.

use crate::metrics::Metrics;
use crate::publish::{Publication, PublishError, Published, Publisher};
use crate::rewake::Rewake;
use crate::status::deletion::DEFAULT_STUCK_AFTER;
use crate::watches::Caches;
use crate::workspace_policy::WorkspacePolicy;
use crate::write_loops::{Basis, ObjectId, WriteId, WriteLoops, Written};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};
use status_applier_api::Action;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Settings of the reconcilers.
#[derive(Clone, Debug)]
pub struct Settings {
    /// A deletion running longer than this is reported as stuck (`DeletionFailed`).
    pub stuck_deletion_after: Duration,
    /// How often to look again while waiting for something not watched (Secrets).
    pub poll_interval: Duration,
    /// The namespaces trusted with code (`--allow-template-namespace`): only their
    /// WorkspaceTemplates are used, by objects of any namespace. Every other reference stays in
    /// its object's namespace. Shared with each snapshot that reads it, not copied.
    pub allowed_template_namespaces: Arc<BTreeSet<String>>,
    /// What a rendered Workspace may ask of the provider (`--allow-provider-config`).
    pub workspace_policy: Arc<WorkspacePolicy>,
    /// Cluster API core does not run beside us (`--without-cluster-api-core`): `capt-cluster`
    /// writes the readiness, phase and endpoint of the Clusters core's finalizer is not on.
    pub without_core: bool,
}

/// How often to look again, by default, while waiting for something not watched.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);

impl Default for Settings {
    fn default() -> Self {
        Self {
            stuck_deletion_after: DEFAULT_STUCK_AFTER,
            poll_interval: DEFAULT_POLL_INTERVAL,
            allowed_template_namespaces: Arc::default(),
            workspace_policy: Arc::default(),
            without_core: false,
        }
    }
}

/// The reason of the Warning Event on an object written in a loop.
pub const WRITE_LOOP_REASON: &str = "WriteLoop";

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
    /// Our recent writes per object, to notice one written in a loop ([`Context::wrote`]).
    pub write_loops: Mutex<WriteLoops<WriteId>>,
    /// The Secrets `waitForSecrets` named that were found to exist lately
    /// ([`crate::seen_secrets`]).
    pub seen_secrets: crate::seen_secrets::SeenSecrets,
}

impl Context {
    /// Forgets everything kept about `obj`, which was deleted: the publisher's deliveries and
    /// the write-loop guard's counts (the caches drop it themselves).
    pub fn forget<K: Resource<DynamicType = ()>>(&self, obj: &K) {
        let object = ObjectId::of_object(obj);
        self.publisher.forget(object);
        let loops = &mut self.write_loops.lock().expect("lock");
        loops.forget(|w| w.object == object);
    }
}

impl Context {
    /// Publishes an intent, counting it when it was sent.
    pub async fn publish(&self, publication: Publication) -> Result<Published, PublishError> {
        let label = crate::metrics::ManagerLabel {
            manager: publication.key.manager.into(),
        };
        let target = publication.target.clone();
        let written = publication.key.clone();
        let basis = publication.basis();
        let published = self.publisher.publish(publication).await?;
        if let Published::Behind { awaiting, .. } = published {
            self.metrics.behind.get_or_create(&label).inc();
            let (kind, namespace, name) = (&target.kind, &target.namespace, &target.name);
            self.rewake
                .when_seen(kind, namespace.clone(), name.clone(), awaiting);
        }
        if published.was_sent() {
            self.metrics.intents.get_or_create(&label).inc();
        }
        if is_write(&published) {
            let regarding = ObjectReference {
                api_version: Some(target.api_version),
                kind: Some(target.kind),
                namespace: target.namespace,
                name: Some(target.name),
                uid: target.uid,
                ..ObjectReference::default()
            };
            self.wrote(written, basis, regarding).await;
        }
        Ok(published)
    }

    /// Counts a write of ours computed from `basis`; when it makes a write loop
    /// ([`crate::write_loops`]), counts `capt_write_loops_total` and puts a Warning Event
    /// (reason `WriteLoop`) on `regarding`, the object whose reconcile made the write.
    pub async fn wrote(&self, written: Written, basis: Basis, regarding: ObjectReference) {
        let (found, limit) = {
            let mut loops = self.write_loops.lock().expect("lock");
            let found = loops.wrote(written.id(), basis, Instant::now());
            (found, loops.limit())
        };
        let Some(found) = found else { return };
        let labels = crate::metrics::WriteLoopLabels {
            kind: written.kind.to_string(),
            manager: written.manager.to_owned(),
        };
        self.metrics.write_loops.get_or_create(&labels).inc();
        tracing::warn!(
            kind = &*written.kind,
            namespace = written.namespace.as_deref(),
            name = &*written.name,
            manager = written.manager,
            writes = found.writes,
            "Write loop"
        );
        let event = write_loop_event(&written, &regarding, found.writes, limit.window);
        self.record(&event, &regarding).await;
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
        self.warn_regarding(&obj.object_ref(&()), reason, action, note)
            .await;
    }

    /// Publishes a Warning Event about the object `regarding` refers to; as [`Self::warn`].
    pub async fn warn_regarding(
        &self,
        regarding: &ObjectReference,
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
        self.record(&event, regarding).await;
    }

    /// Publishes `event` about the object `regarding` refers to; a failure is logged.
    async fn record(&self, event: &Event, regarding: &ObjectReference) {
        if let Err(error) = self.events.publish(event, regarding).await {
            tracing::warn!(
                object = regarding.name,
                reason = event.reason,
                %error,
                "Could not publish an Event"
            );
        }
    }
}

/// Whether a publication counts as a write for the write-loop guard: it was sent, and the
/// status-applier did not find it already in place. `unchanged` wrote nothing and never will
/// (after a restart, when the publisher remembers nothing, that is every intent); every other
/// outcome was a write or is kept for one.
fn is_write(published: &Published) -> bool {
    matches!(published, Published::Sent { action, .. } if *action != Action::unchanged)
}

/// The Warning Event about a write loop of `written`, on `regarding`.
fn write_loop_event(
    written: &Written,
    regarding: &ObjectReference,
    writes: usize,
    window: Duration,
) -> Event {
    let what = match (&written.namespace, written.subresource) {
        (Some(ns), Some(_)) => format!("{} {ns}/{} status", written.kind, written.name),
        (Some(ns), None) => format!("{} {ns}/{}", written.kind, written.name),
        (None, Some(_)) => format!("{} {} status", written.kind, written.name),
        (None, None) => format!("{} {}", written.kind, written.name),
    };
    let note = format!(
        "{what} written {writes} times by {} within {} s without a change of its spec or of \
         what the writes observe: a write loop",
        written.manager,
        window.as_secs()
    );
    // The written object, when it is not the one the Event is about (a Workspace, an apply,
    // a Secret written for its owner): it tells the Event apart from the owner's own loops,
    // which the recorder would otherwise fold into one series with theirs.
    let related = (regarding.kind.as_deref() != Some(&*written.kind)
        || regarding.name.as_deref() != Some(&*written.name))
    .then(|| ObjectReference {
        api_version: Some(written.api_version.to_string()),
        kind: Some(written.kind.to_string()),
        namespace: written.namespace.as_deref().map(Into::into),
        name: Some(written.name.to_string()),
        ..ObjectReference::default()
    });
    Event {
        type_: EventType::Warning,
        reason: WRITE_LOOP_REASON.into(),
        note: Some(note),
        action: "Write".into(),
        secondary: related,
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

#[cfg(test)]
mod tests {
    use super::*;
    use status_applier_api::intent::Subresource;

    fn written(kind: &'static str, name: &str, subresource: Option<Subresource>) -> Written {
        Written {
            api_version: "v".into(),
            kind: kind.into(),
            namespace: Some("team".into()),
            name: name.into(),
            manager: "capt-controller",
            subresource,
        }
    }

    fn apply_ref() -> ObjectReference {
        ObjectReference {
            kind: Some("WorkspaceTemplateApply".into()),
            namespace: Some("team".into()),
            name: Some("alone".into()),
            ..ObjectReference::default()
        }
    }

    #[test]
    fn an_intent_found_in_place_is_not_a_write() {
        let sent = |action| Published::Sent {
            action,
            generation: None,
        };
        assert!(!is_write(&sent(Action::unchanged)));
        assert!(!is_write(&Published::Repeat { generation: None }));
        for action in [
            Action::applied,
            Action::coalesced,
            Action::queued,
            Action::conflict,
        ] {
            assert!(is_write(&sent(action)), "{action:?}");
        }
    }

    #[test]
    fn a_loop_on_the_object_itself_names_no_other_object() {
        let w = written("WorkspaceTemplateApply", "alone", Some(Subresource::Status));
        let event = write_loop_event(&w, &apply_ref(), 7, Duration::from_secs(60));
        assert_eq!(event.reason, "WriteLoop");
        assert_eq!(event.type_, EventType::Warning);
        assert!(event.secondary.is_none());
        assert_eq!(
            event.note.as_deref(),
            Some(
                "WorkspaceTemplateApply team/alone status written 7 times by capt-controller \
                 within 60 s without a change of its spec or of what the writes observe: a \
                 write loop"
            )
        );
    }

    #[test]
    fn a_loop_on_an_object_written_for_another_names_the_written_one() {
        let mut w = written("Workspace", "team-alone-0123456789", None);
        w.namespace = None;
        let event = write_loop_event(&w, &apply_ref(), 9, Duration::from_secs(30));
        let related = event.secondary.expect("the Workspace");
        assert_eq!(related.kind.as_deref(), Some("Workspace"));
        assert_eq!(related.name.as_deref(), Some("team-alone-0123456789"));
        assert!(
            event
                .note
                .is_some_and(|n| n.starts_with("Workspace team-alone-0123456789 written 9 times"))
        );
    }
}
