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
        tokio::time::timeout(Duration::from_millis(5), seen.first_missing(&wanted, &read)).await;
    assert!(dropped.is_err(), "the first check was still reading");
    let later = tokio::time::timeout(Duration::from_secs(1), seen.first_missing(&wanted, &read))
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
