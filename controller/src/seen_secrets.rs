//! Whether the Secrets an apply's `waitForSecrets` names exist: each is read from the API
//! server until it is seen, then answered from here for a while.
//!
//! Why not a watch cache, as every other kind has: the controller may only `get` a Secret by
//! its name (`docs/security.md`). A watch needs `list` and `watch` on every Secret of the
//! cluster, and a list returns their data, so the right to cache their existence is the
//! right to read every tenant's credentials. What bounds the reads instead, and so how long
//! one apply's check holds a worker every other namespace may be waiting for
//! ([`crate::fair_share`]):
//! - the CRD allows at most [`MAX_WAITS`](crate::api::bounds::MAX_WAITS) entries;
//! - a Secret seen is not read again for [`REMEMBERED_FOR`], by any apply, so a reconcile
//!   reads only the Secrets it has not seen lately: while one of 32 is missing, one read each
//!   time it looks again, not 32;
//! - one read answers every apply that asks about the same Secret while it is in flight: a
//!   tenant's many applies waiting for the same Secrets, reconciled at once by every worker,
//!   read each Secret once, not once per worker;
//! - one check reads [`READS_AT_ONCE`] Secrets at a time, in the order the apply lists them,
//!   and stops at the first that does not exist: it holds its worker for about
//!   `MAX_WAITS / READS_AT_ONCE` round trips, not `MAX_WAITS`, and reads at most
//!   `READS_AT_ONCE - 1` past the missing one.
//!
//! A Secret deleted after it was seen still counts as there for [`REMEMBERED_FOR`]: what it
//! gates is the first rendering, and a stack whose Secret went meanwhile fails in Terraform
//! with the Secret's name, as it would have a second later.

use futures::StreamExt;
use futures::future::{BoxFuture, FutureExt, Shared, WeakShared};
use futures::stream::FuturesOrdered;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::time::{Duration, Instant};

/// How long a Secret seen counts as there without being read again.
pub const REMEMBERED_FOR: Duration = Duration::from_secs(600);
/// The most Secrets remembered; past it, the oldest half is forgotten (each is then read
/// again when next asked about): what tenants name cannot grow the controller's memory.
pub const MAX_REMEMBERED: usize = 16_384;
/// How many Secrets one check reads at a time.
pub const READS_AT_ONCE: usize = 4;

/// A Secret by namespace and name.
type Key = (String, String);
/// A read, whose answer (exists, or the read's failure) every asker shares.
type Read = Shared<BoxFuture<'static, Result<bool, Arc<kube::Error>>>>;
/// The reads in flight, each held by the checks waiting for it (and gone with the last).
type Reading = Mutex<HashMap<Key, WeakShared<BoxFuture<'static, Result<bool, Arc<kube::Error>>>>>>;

/// Secrets seen, by namespace and name, with when, and the reads in flight.
#[derive(Debug, Default)]
pub struct SeenSecrets {
    seen: Arc<Mutex<HashMap<Key, Instant>>>,
    reading: Arc<Reading>,
}

impl SeenSecrets {
    /// The first of `wanted`, in its order, that does not exist, or `None` when every one
    /// does. Those not seen lately are read with `exists`, [`READS_AT_ONCE`] at a time, one
    /// read for every check asking about the same Secret at once. The first failed read (in
    /// `wanted`'s order, before any missing Secret) is the answer's failure.
    pub async fn first_missing<'w, F, Fut>(
        &self,
        wanted: &'w [Key],
        exists: F,
    ) -> Result<Option<&'w Key>, Arc<kube::Error>>
    where
        F: Fn(&Key) -> Fut,
        Fut: Future<Output = Result<bool, kube::Error>> + Send + 'static,
    {
        // Plain loops, not stream combinators over closures: the reconcile's future must stay
        // `Send`, which the compiler cannot prove through a closure taking a reference.
        let mut unseen = Vec::new();
        for key in wanted {
            if !self.recently_seen(&key.0, &key.1) {
                unseen.push(key);
            }
        }
        let mut unseen = unseen.into_iter();
        let mut answers = FuturesOrdered::new();
        for key in unseen.by_ref().take(READS_AT_ONCE) {
            answers.push_back(answer_of(key, self.read(key, &exists)));
        }
        while let Some((key, found)) = answers.next().await {
            if !found? {
                return Ok(Some(key));
            }
            if let Some(next) = unseen.next() {
                answers.push_back(answer_of(next, self.read(next, &exists)));
            }
        }
        Ok(None)
    }

    /// The read of `key` in flight, or a new one. A read no check waits for any more (its
    /// checks stopped at an earlier missing Secret, or their reconcile was dropped) is gone
    /// with them, and the next asker starts another.
    fn read<F, Fut>(&self, key: &Key, exists: &F) -> Read
    where
        F: Fn(&Key) -> Fut,
        Fut: Future<Output = Result<bool, kube::Error>> + Send + 'static,
    {
        let mut reading = self.reading.lock().expect("secret reads lock");
        // Only a read still in flight is joined: an answer already given is not kept.
        if let Some(read) = reading
            .get(key)
            .and_then(WeakShared::upgrade)
            .filter(|read| read.peek().is_none())
        {
            return read;
        }
        let request = exists(key);
        let (seen, answered, key) = (self.seen.clone(), self.reading.clone(), key.clone());
        let read = {
            let key = key.clone();
            async move {
                let answer = request.await;
                // Gone from the reads in flight before its answer is shared: a check that
                // asks after this finds none and reads again.
                answered.lock().expect("secret reads lock").remove(&key);
                let exists = answer.map_err(Arc::new)?;
                if exists {
                    saw(&seen, key);
                }
                Ok(exists)
            }
        }
        .boxed()
        .shared();
        // Reads every check stopped waiting for are dropped here.
        reading.retain(|_, read| read.upgrade().is_some());
        if let Some(weak) = read.downgrade() {
            reading.insert(key, weak);
        }
        read
    }

    /// Whether `namespace`/`name` was seen within [`REMEMBERED_FOR`].
    pub fn recently_seen(&self, namespace: &str, name: &str) -> bool {
        let seen = lock(&self.seen);
        let key = (namespace.to_owned(), name.to_owned());
        seen.get(&key)
            .is_some_and(|at| at.elapsed() < REMEMBERED_FOR)
    }

    /// `namespace`/`name` exists now.
    pub fn saw(&self, namespace: &str, name: &str) {
        saw(&self.seen, (namespace.to_owned(), name.to_owned()));
    }

    /// Secrets remembered now.
    pub fn len(&self) -> usize {
        lock(&self.seen).len()
    }

    /// True when none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `key` with its read's answer.
async fn answer_of(key: &Key, read: Read) -> (&Key, Result<bool, Arc<kube::Error>>) {
    (key, read.await)
}

/// Remembers that `key` exists now, forgetting the oldest half past [`MAX_REMEMBERED`].
fn saw(seen: &Mutex<HashMap<Key, Instant>>, key: Key) {
    let mut seen = lock(seen);
    if seen.len() >= MAX_REMEMBERED {
        let mut ages: Vec<Instant> = seen.values().copied().collect();
        ages.sort_unstable();
        let cut = ages[ages.len() / 2];
        seen.retain(|_, at| *at > cut);
    }
    seen.insert(key, Instant::now());
}

fn lock(seen: &Mutex<HashMap<Key, Instant>>) -> std::sync::MutexGuard<'_, HashMap<Key, Instant>> {
    seen.lock().expect("seen secrets lock")
}

#[cfg(test)]
mod tests;
