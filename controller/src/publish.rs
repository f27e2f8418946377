//! Publishing desired status to the status-applier as intents.
//!
//! A reconcile that computes what it computed last time publishes nothing: the publisher
//! remembers the last fragment it delivered per (object, subresource, manager), so steady
//! state costs no request at all. Delivered means the applier kept it: the publisher waits
//! for the outcome, which is what the apply did or, when the applier's wait timeout runs
//! out first, `queued` (kept, not applied yet); a failed delivery is forgotten, so the next
//! reconcile sends it again. An intent answered `queued`, or not answered, is also kept
//! until the applier is seen to act on it, and sent again meanwhile ([`unconfirmed`]): an
//! applier that dies with it loses nothing, with no change of its fragment. One answered with
//! a conflict or a refusal stands there with the applier process that answered, and is sent
//! again when another process answers: a restarted applier reports it again.

mod unconfirmed;

use crate::write_loops::{Basis, ObjectId, WriteId, Written};
use serde_json::Value;
use status_applier_api::client::{Client, ClientError};
use status_applier_api::intent::{Intent, Subresource, Target};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use unconfirmed::{Answer, Unconfirmed};

/// Why an intent was not delivered.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The status-applier could not be reached.
    #[error("{subject}: publishing to the status-applier failed: {source}")]
    Unreachable {
        /// `kind/namespace/name [manager]`.
        subject: String,
        /// The cause.
        #[source]
        source: ClientError,
    },
    /// This replica does not lead: nothing is sent ([`Publisher::fenced`]).
    #[error("{subject}: not published: this replica does not lead")]
    NotLeading {
        /// `kind/namespace/name [manager]`.
        subject: String,
    },
    /// The status-applier refused the intent.
    #[error("{subject}: the status-applier refused the intent ({status}): {body}")]
    Refused {
        /// `kind/namespace/name [manager]`.
        subject: String,
        /// HTTP status.
        status: u16,
        /// Its answer.
        body: String,
    },
}

/// An intent to publish.
#[derive(Clone, Debug, PartialEq)]
pub struct Publication {
    /// The object.
    pub target: Target,
    /// The object again, the subresource (`Some(Status)` for the status) and the field
    /// manager: what its delivery is remembered by.
    pub key: Written,
    /// The fragment.
    pub fragment: Value,
    /// Protected paths released.
    pub release: Vec<String>,
    /// The `resourceVersion` of the object it was computed from.
    pub computed_on: Option<String>,
    /// The `resourceVersion` the reconcile's own last write to the object left (its
    /// finalizer, a recorded name), when it wrote ([`Publication::after`]).
    pub written: Option<String>,
    /// The `generation` of the object it was computed from.
    pub generation: Option<i64>,
    /// What it was computed from besides the object's own status, when the caller says
    /// ([`Publication::observing`]); else the generation alone stands for it.
    pub observed: Option<Basis>,
}

impl Publication {
    /// A status-subresource intent of `obj` under `manager`.
    pub fn status<K: kube::Resource<DynamicType = ()>>(
        obj: &K,
        manager: &'static str,
        fragment: Value,
    ) -> Self {
        Self {
            target: target(obj),
            key: Written::of::<K>(
                obj.meta().namespace.as_deref(),
                obj.meta().name.as_deref().unwrap_or_default(),
                manager,
                Some(Subresource::Status),
            ),
            fragment,
            release: vec![],
            computed_on: obj.meta().resource_version.clone(),
            written: None,
            generation: obj.meta().generation,
            observed: None,
        }
    }

    /// A main-resource intent of `obj` under `manager`, releasing `release`.
    pub fn main<K: kube::Resource<DynamicType = ()>>(
        obj: &K,
        manager: &'static str,
        fragment: Value,
        release: Vec<String>,
    ) -> Self {
        Self {
            target: target(obj),
            key: Written::of::<K>(
                obj.meta().namespace.as_deref(),
                obj.meta().name.as_deref().unwrap_or_default(),
                manager,
                None,
            ),
            fragment,
            release,
            computed_on: obj.meta().resource_version.clone(),
            written: None,
            generation: obj.meta().generation,
            observed: None,
        }
    }

    /// Says what the reconcile's own write to the object left (`None`: it wrote nothing).
    /// The applier's view of the object may not show that write yet, and an apply planned
    /// on it would be refused as stale: the intent asks for a view at least as new.
    pub fn after(mut self, written: Option<String>) -> Self {
        self.written = newest(self.written.take(), written);
        self
    }

    /// The newest version of the object this publication knows: the applier plans it on
    /// no older view (`notOlderThan`).
    fn not_older_than(&self) -> Option<String> {
        newest(self.computed_on.clone(), self.written.clone())
    }

    /// Says what the fragment was computed from besides the object's spec and own status
    /// (the Workspace, the peers, ...): a write repeated on the same observation is a write
    /// loop (`crate::write_loops`).
    pub fn observing(mut self, observed: &impl std::fmt::Debug) -> Self {
        self.observed = Some(Basis::of(self.generation, observed));
        self
    }

    /// What the fragment was computed from, for the write-loop guard.
    pub fn basis(&self) -> Basis {
        self.observed
            .unwrap_or_else(|| Basis::of(self.generation, &()))
    }
}

impl Publication {
    /// `kind/namespace/name [manager]`, for errors.
    fn subject(&self) -> String {
        format!(
            "{}/{}/{} [{}]",
            self.target.kind,
            self.target.namespace.as_deref().unwrap_or(""),
            self.target.name,
            self.key.manager
        )
    }
}

/// The status-applier target of an object, with its uid as a precondition.
pub fn target<K: kube::Resource<DynamicType = ()>>(obj: &K) -> Target {
    use kube::ResourceExt;
    Target {
        api_version: K::api_version(&()).into(),
        kind: K::kind(&()).into(),
        namespace: obj.namespace(),
        name: obj.name_any(),
        uid: obj.uid(),
    }
}

/// What was delivered: a digest of the uid precondition, the fragment and the releases, and
/// the object's resourceVersion and generation its outcome told. Kept for every object the
/// controller publishes for: the fragments themselves (a status is kilobytes, parsed many
/// times that) were the largest part of the controller's memory at 1,000 clusters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Delivered {
    digest: Digest,
    version: Option<u64>,
    generation: Option<i64>,
}

/// A resourceVersion as a number: etcd's revision, which only grows. `None` when it is not
/// one (the API server promises nothing about its form), and nothing is compared then.
pub(crate) fn revision(version: Option<&str>) -> Option<u64> {
    version?.parse().ok()
}

/// The newer of two resourceVersions (the one that is a revision, when only one is).
fn newest(a: Option<String>, b: Option<String>) -> Option<String> {
    match (revision(a.as_deref()), revision(b.as_deref())) {
        (Some(x), Some(y)) => {
            if x >= y {
                a
            } else {
                b
            }
        }
        (Some(_), None) => a,
        (None, Some(_)) => b,
        (None, None) => a.or(b),
    }
}

/// SHA-256 of a delivery's JSON.
type Digest = [u8; 32];

/// The digest a delivery is remembered by.
fn digest(uid: &Option<String>, fragment: &Value, release: &[String]) -> Digest {
    use sha2::Digest;
    let text = serde_json::to_vec(&(uid, fragment, release)).expect("JSON values serialize");
    sha2::Sha256::digest(&text).into()
}

/// What became of a publication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Published {
    /// Not sent: the same fragment was delivered last time.
    Repeat {
        /// The object's generation the last delivery's outcome told, if it did.
        generation: Option<i64>,
    },
    /// Not sent: it was computed on a version of the object older than the one our last
    /// delivery for the same key left. The watch has yet to show that write; the reconcile
    /// it wakes computes on what the write left.
    Behind {
        /// As for a repeat.
        generation: Option<i64>,
        /// The resourceVersion our last write left (`crate::rewake` waits for it).
        awaiting: u64,
    },
    /// Sent, and what the status-applier did with it.
    Sent {
        /// What the status-applier did.
        action: status_applier_api::Action,
        /// The object's generation after it, if told.
        generation: Option<i64>,
    },
}

impl Published {
    /// True when the intent was sent.
    pub fn was_sent(&self) -> bool {
        matches!(self, Published::Sent { .. })
    }

    /// The object's generation as this delivery (or, for a repeat, the last one) left it: a
    /// write of ours that made a new generation is known here before the watch shows it.
    pub fn generation(&self) -> Option<i64> {
        match self {
            Published::Repeat { generation }
            | Published::Behind { generation, .. }
            | Published::Sent { generation, .. } => *generation,
        }
    }
}

/// Delivers intents, skipping repeats, and delivers again those not yet seen applied.
pub struct Publisher {
    client: Client,
    delivered: Mutex<HashMap<WriteId, Delivered>>,
    /// Sent, answered `queued` or not at all: sent again by a task of its own.
    unconfirmed: Arc<Unconfirmed>,
    /// Whether an intent may be sent now: only while this replica leads.
    may_write: diagnostics::fence::MayWrite,
}

impl Publisher {
    /// A publisher talking to the status-applier's socket.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            delivered: Mutex::default(),
            unconfirmed: Arc::default(),
            may_write: Arc::new(|| true),
        }
    }

    /// This publisher, sending only while `may_write` says so: a publication made while it
    /// does not is refused ([`PublishError::NotLeading`]), and an intent kept to be sent
    /// again waits, as one not answered does.
    pub fn fenced(self, may_write: diagnostics::fence::MayWrite) -> Self {
        Self { may_write, ..self }
    }

    /// Publishes unless the same fragment was delivered last time.
    pub async fn publish(&self, p: Publication) -> Result<Published, PublishError> {
        if !(self.may_write)() {
            return Err(PublishError::NotLeading {
                subject: p.subject(),
            });
        }
        let client = &self.client;
        let key = p.key.id();
        let sent = digest(&p.target.uid, &p.fragment, &p.release);
        if let Some(last) = self.delivered.lock().expect("lock").get(&key) {
            if last.digest == sent {
                return Ok(Published::Repeat {
                    generation: last.generation,
                });
            }
            // Computed on a cache that does not show our own last write yet (a reconcile
            // that runs right after the one that wrote): what it derives again from the
            // older status (a condition's transition time, say) would be written for
            // nothing, and then written back.
            let computed_on = revision(p.computed_on.as_deref());
            if let (Some(on), Some(left)) = (computed_on, last.version)
                && on < left
            {
                return Ok(Published::Behind {
                    generation: last.generation,
                    awaiting: left,
                });
            }
        }
        let subject = p.subject();
        let not_older_than = p.not_older_than().filter(|v| revision(Some(v)).is_some());
        let intent = Intent {
            target: p.target,
            subresource: p.key.subresource,
            field_manager: p.key.manager.to_owned(),
            fragment: p.fragment,
            release: p.release,
            not_older_than,
        };
        // A re-send of an older intent of the key is let through first: the applier must
        // take this one last.
        self.unconfirmed.supersede(&key).await;
        self.delivered.lock().expect("lock").remove(&key);
        // Waiting for the apply's outcome means an intent is remembered only once the
        // applier acted on it: an applier that dies with intents queued makes the next
        // reconcile send them again. An answer of `queued` after the applier's wait timeout
        // (30 s by default) is remembered too, though not applied yet, so that repeats are
        // not sent: that intent, and one not answered at all, is kept and sent again until
        // the applier acts on it, whether it is slow or died and came back
        // ([`unconfirmed`]).
        // Any outcome is delivered, a conflict or a rejection too: the applier keeps the
        // document and retries when the object changes. Those two live in the applier's
        // memory alone, so they stand in [`unconfirmed`] too, and are sent again to an
        // applier that restarted, which reports them anew. A refusal (a bad intent, an
        // applier failure) is not delivered; the client reads which is which.
        let result = client.send(&intent).await;
        let answer = Answer::of(&result);
        if answer.kept() && self.unconfirmed.keep(key, intent, sent, &answer) {
            let (unconfirmed, client) = (self.unconfirmed.clone(), client.clone());
            let may_write = self.may_write.clone();
            tokio::spawn(async move {
                let send = |intent: Intent| {
                    let (client, may_write) = (client.clone(), may_write.clone());
                    async move {
                        match may_write() {
                            true => client.send(&intent).await,
                            // Not sent, as if not answered: kept until this replica leads
                            // again, or until another's lead makes it forget everything.
                            false => Err(ClientError::Refused {
                                status: 503,
                                body: "not sent: this replica does not lead".into(),
                            }),
                        }
                    }
                };
                let probe = || {
                    let client = client.clone();
                    async move { client.instance().await }
                };
                unconfirmed::redeliver(&unconfirmed, send, probe).await;
            });
        }
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(ClientError::Refused { status, body }) => {
                return Err(PublishError::Refused {
                    subject,
                    status,
                    body,
                });
            }
            Err(source) => return Err(PublishError::Unreachable { subject, source }),
        };
        let delivered = Delivered {
            digest: sent,
            version: revision(outcome.resource_version.as_deref()),
            generation: outcome.generation,
        };
        self.delivered.lock().expect("lock").insert(key, delivered);
        Ok(Published::Sent {
            action: outcome.action,
            generation: outcome.generation,
        })
    }

    /// Forgets what was delivered for an object, which was deleted, and what is kept to be
    /// sent again: what the publisher keeps stays bounded by the objects that exist (churn
    /// leaves nothing behind).
    pub fn forget(&self, object: ObjectId) {
        (self.delivered.lock().expect("lock")).retain(|k, _| k.object != object);
        self.unconfirmed.forget(object);
    }

    /// Forgets every delivery and every intent kept to be sent again: another replica led
    /// meanwhile, so what this one delivered may no longer be what the applier holds, and
    /// what it kept may be older than what the other wrote. Every publication after this is
    /// sent (the applier writes none that changes nothing).
    pub fn forget_all(&self) {
        self.delivered.lock().expect("lock").clear();
        self.unconfirmed.forget_all();
    }

    /// How many (object, subresource, manager) deliveries are remembered.
    pub fn remembered(&self) -> usize {
        self.delivered.lock().expect("lock").len()
    }

    /// How many intents are kept to be sent again: answered `queued` or not at all, and not
    /// yet seen applied, or standing (answered with a conflict or a refusal); none at rest
    /// without a conflict.
    pub fn unconfirmed(&self) -> usize {
        self.unconfirmed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::CAPTCluster;
    use crate::watches::{Change, Subscribers};

    fn capt_cluster(name: &str) -> CAPTCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "CAPTCluster",
            "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}")},
            "spec": {"region": "r"},
        }))
        .expect("a valid CAPTCluster")
    }

    /// Remembers a delivery for `obj` as a sent intent would.
    fn delivered(publisher: &Publisher, obj: &CAPTCluster, manager: &'static str) {
        let p = Publication::status(obj, manager, serde_json::json!({"status": {}}));
        let key = p.key.id();
        let d = Delivered {
            digest: digest(&p.target.uid, &p.fragment, &p.release),
            version: Some(1),
            generation: Some(1),
        };
        publisher.delivered.lock().expect("lock").insert(key, d);
    }

    #[test]
    fn an_intent_asks_for_a_view_as_new_as_the_object_it_was_computed_on_or_its_own_write() {
        let mut cc = capt_cluster("a");
        cc.metadata.resource_version = Some("7".into());
        let p = || Publication::status(&cc, "m", serde_json::json!({"status": {}}));
        assert_eq!(p().not_older_than().as_deref(), Some("7"));
        assert_eq!(p().after(None).not_older_than().as_deref(), Some("7"));
        let after_write = p().after(Some("12".into()));
        assert_eq!(after_write.not_older_than().as_deref(), Some("12"));
        // Never older than what it was computed on, whatever the caller says.
        assert_eq!(
            p().after(Some("3".into())).not_older_than().as_deref(),
            Some("7")
        );
    }

    #[tokio::test]
    async fn an_intent_not_answered_is_kept_to_be_sent_again_until_its_object_is_deleted() {
        let publisher = Publisher::new(Client::new("/nonexistent/applier.sock"));
        let (a, b) = (capt_cluster("a"), capt_cluster("b"));
        for obj in [&a, &b] {
            let p = Publication::status(obj, "capt-captcluster", serde_json::json!({"status": {}}));
            let sent = publisher.publish(p).await;
            assert!(
                matches!(sent, Err(PublishError::Unreachable { .. })),
                "{sent:?}"
            );
        }
        assert_eq!(publisher.remembered(), 0, "not delivered");
        assert_eq!(publisher.unconfirmed(), 2, "kept to be sent again");
        publisher.forget(ObjectId::of_object(&a));
        assert_eq!(publisher.unconfirmed(), 1, "only b's is left");
    }

    #[test]
    fn a_deleted_objects_deliveries_are_forgotten_through_its_watch() {
        let publisher = std::sync::Arc::new(Publisher::new(Client::new("/nonexistent.sock")));
        let (a, b) = (capt_cluster("a"), capt_cluster("b"));
        delivered(&publisher, &a, "capt-captcluster");
        delivered(&publisher, &a, "capt-other");
        delivered(&publisher, &b, "capt-captcluster");
        let mut subscribers = Subscribers::<CAPTCluster>::default();
        let p = publisher.clone();
        subscribers.on_deleted(move |o| p.forget(ObjectId::of_object(o)));
        subscribers.deliver(Change::Applied {
            object: &a,
            previous: Some(&a),
        });
        assert_eq!(publisher.remembered(), 3, "a change forgets nothing");
        subscribers.deliver(Change::Deleted(&a));
        assert_eq!(publisher.remembered(), 1, "only b's delivery is left");
    }
}
