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
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// What one check's reads did: how many were made, and the most in flight at once.
    #[derive(Default)]
    struct Reads {
        made: AtomicUsize,
        in_flight: AtomicUsize,
        most_at_once: AtomicUsize,
    }

    impl Reads {
        /// A read of `key` that takes `took` and answers that it exists unless its name is in
        /// `missing`.
        fn of(
            self: &Arc<Self>,
            missing: &'static [&'static str],
            took: Duration,
        ) -> impl Fn(&Key) -> BoxFuture<'static, Result<bool, kube::Error>> {
            let reads = self.clone();
            move |(_, name): &Key| {
                let (reads, exists) = (reads.clone(), !missing.contains(&name.as_str()));
                async move {
                    reads.made.fetch_add(1, Ordering::SeqCst);
                    let now = reads.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    reads.most_at_once.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(took).await;
                    reads.in_flight.fetch_sub(1, Ordering::SeqCst);
                    Ok(exists)
                }
                .boxed()
            }
        }

        fn made(&self) -> usize {
            self.made.load(Ordering::SeqCst)
        }
    }

    fn secrets(names: impl IntoIterator<Item = String>) -> Vec<Key> {
        names.into_iter().map(|n| ("team-a".into(), n)).collect()
    }

    fn waited(n: usize) -> Vec<Key> {
        secrets((0..n).map(|i| format!("s{i}")))
    }

    #[tokio::test(start_paused = true)]
    async fn a_secret_seen_is_not_read_again_until_it_is_forgotten() {
        let seen = SeenSecrets::default();
        assert!(!seen.recently_seen("team-a", "db"));
        seen.saw("team-a", "db");
        assert!(seen.recently_seen("team-a", "db"));
        assert!(
            !seen.recently_seen("team-b", "db"),
            "another namespace's Secret of the same name was not seen"
        );
        tokio::time::advance(REMEMBERED_FOR).await;
        assert!(
            !seen.recently_seen("team-a", "db"),
            "remembered for too long"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn what_tenants_name_cannot_grow_it_past_its_bound() {
        let seen = SeenSecrets::default();
        for i in 0..MAX_REMEMBERED + 10 {
            tokio::time::advance(Duration::from_millis(1)).await;
            seen.saw("team-a", &format!("s{i}"));
        }
        assert!(seen.len() <= MAX_REMEMBERED, "{}", seen.len());
        let newest = format!("s{}", MAX_REMEMBERED + 9);
        assert!(
            seen.recently_seen("team-a", &newest),
            "the newest was forgotten"
        );
        assert!(!seen.recently_seen("team-a", "s0"), "the oldest was kept");
    }

    /// The longest list the CRD allows, its last Secret missing: read a few at a time, so the
    /// check takes about a quarter of the round trips of reading one after the other.
    #[tokio::test(start_paused = true)]
    async fn a_check_reads_a_few_secrets_at_a_time_in_order() {
        let (seen, reads) = (SeenSecrets::default(), Arc::new(Reads::default()));
        let wanted = waited(32);
        let trip = Duration::from_millis(10);
        let started = Instant::now();
        let missing = seen
            .first_missing(&wanted, reads.of(&["s31"], trip))
            .await
            .expect("no read fails");
        assert_eq!(missing, Some(&wanted[31]));
        assert_eq!(reads.made(), 32, "each Secret read once");
        assert_eq!(
            reads.most_at_once.load(Ordering::SeqCst),
            READS_AT_ONCE,
            "reads in flight at once"
        );
        let took = started.elapsed();
        assert!(
            took <= trip * (32 / READS_AT_ONCE as u32),
            "took {took:?}: the reads were not made {READS_AT_ONCE} at a time"
        );
        assert_eq!(seen.len(), 31, "the Secrets found are remembered");
    }

    /// The first missing in the apply's order is the answer, though a later read answers first;
    /// and nothing past the reads already started is read.
    #[tokio::test(start_paused = true)]
    async fn the_first_missing_in_order_is_told_and_the_check_stops_there() {
        let (seen, reads) = (SeenSecrets::default(), Arc::new(Reads::default()));
        let wanted = waited(32);
        let slow = reads.of(&["s1", "s2"], Duration::from_millis(10));
        let fast = reads.of(&["s1", "s2"], Duration::from_millis(1));
        let read = |key: &Key| {
            if key.1 == "s1" { slow(key) } else { fast(key) }
        };
        let missing = seen
            .first_missing(&wanted, read)
            .await
            .expect("no read fails");
        assert_eq!(missing, Some(&wanted[1]), "s1 is the first missing");
        assert!(
            reads.made() <= 1 + READS_AT_ONCE,
            "{} reads: the check went on past s1's answer",
            reads.made()
        );
    }

    /// A tenant's applies, all waiting for the same Secrets and checked at once by every
    /// worker, read each Secret once between them.
    #[tokio::test(start_paused = true)]
    async fn checks_at_once_share_one_read_per_secret() {
        let (seen, reads) = (SeenSecrets::default(), Arc::new(Reads::default()));
        let wanted = waited(32);
        let read = reads.of(&["s31"], Duration::from_millis(10));
        let checks = (0..8).map(|_| seen.first_missing(&wanted, &read));
        for missing in futures::future::join_all(checks).await {
            assert_eq!(missing.expect("no read fails"), Some(&wanted[31]));
        }
        assert_eq!(reads.made(), 32, "one read per Secret for the 8 checks");
    }

    /// An answer is not kept: a Secret missing a moment ago is read again by the next check,
    /// and found once it was created.
    #[tokio::test(start_paused = true)]
    async fn a_missing_secret_is_read_again_by_the_next_check() {
        let seen = SeenSecrets::default();
        let wanted = waited(1);
        let reads = Arc::new(Reads::default());
        let absent = seen
            .first_missing(&wanted, reads.of(&["s0"], Duration::from_millis(10)))
            .await;
        assert_eq!(absent.expect("no read fails"), Some(&wanted[0]));
        let created = seen
            .first_missing(&wanted, reads.of(&[], Duration::from_millis(10)))
            .await;
        assert_eq!(created.expect("no read fails"), None);
        assert_eq!(reads.made(), 2);
    }

    /// A check dropped while its reads are in flight (its reconcile ended) leaves nothing a
    /// later check would wait on forever.
    #[tokio::test(start_paused = true)]
    async fn a_check_dropped_midway_does_not_hold_back_the_next() {
        let seen = SeenSecrets::default();
        let wanted = waited(8);
        let reads = Arc::new(Reads::default());
        let read = reads.of(&[], Duration::from_millis(10));
        let dropped =
            tokio::time::timeout(Duration::from_millis(5), seen.first_missing(&wanted, &read))
                .await;
        assert!(dropped.is_err(), "the first check was still reading");
        let later =
            tokio::time::timeout(Duration::from_secs(1), seen.first_missing(&wanted, &read))
                .await
                .expect("the later check was not held back");
        assert_eq!(later.expect("no read fails"), None);
    }

    /// A failed read fails the check, for every check sharing it; the next check reads again.
    #[tokio::test(start_paused = true)]
    async fn a_failed_read_fails_each_check_sharing_it() {
        let seen = SeenSecrets::default();
        let wanted = waited(1);
        let failing = |_: &Key| {
            async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Err(kube::Error::Service("the API server did not answer".into()))
            }
            .boxed()
        };
        let (a, b) = futures::join!(
            seen.first_missing(&wanted, failing),
            seen.first_missing(&wanted, failing)
        );
        assert!(a.is_err() && b.is_err(), "{a:?} {b:?}");
        let reads = Arc::new(Reads::default());
        let again = seen
            .first_missing(&wanted, reads.of(&[], Duration::from_millis(1)))
            .await;
        assert_eq!(again.expect("read again"), None);
        assert_eq!(reads.made(), 1);
    }
}
