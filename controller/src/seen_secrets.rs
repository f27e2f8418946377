//! The Secrets an apply's `waitForSecrets` named and that were found to exist: each is read
//! from the API server until it is seen, then answered from here for a while.
//!
//! Why not a watch cache, as every other kind has: the controller may only `get` a Secret by
//! its name (`docs/security.md`). A watch needs `list` and `watch` on every Secret of the
//! cluster, and a list returns their data, so the right to cache their existence is the
//! right to read every tenant's credentials. What bounds the reads instead:
//! - the CRD allows at most [`MAX_WAITS`](crate::api::bounds::MAX_WAITS) entries;
//! - the check stops at the first Secret that does not exist;
//! - a Secret seen is not read again for [`REMEMBERED_FOR`], by any apply, so a reconcile
//!   reads only the Secrets it has not seen lately: while one of 32 is missing, one GET each
//!   time it looks again, not 32.
//!
//! A Secret deleted after it was seen still counts as there for [`REMEMBERED_FOR`]: what it
//! gates is the first rendering, and a stack whose Secret went meanwhile fails in Terraform
//! with the Secret's name, as it would have a second later.

use std::collections::HashMap;
use std::sync::Mutex;
use tokio::time::{Duration, Instant};

/// How long a Secret seen counts as there without being read again.
pub const REMEMBERED_FOR: Duration = Duration::from_secs(600);
/// The most Secrets remembered; past it, the oldest half is forgotten (each is then read
/// again when next asked about): what tenants name cannot grow the controller's memory.
pub const MAX_REMEMBERED: usize = 16_384;

/// Secrets seen, by namespace and name, with when.
#[derive(Debug, Default)]
pub struct SeenSecrets {
    seen: Mutex<HashMap<(String, String), Instant>>,
}

impl SeenSecrets {
    /// Whether `namespace`/`name` was seen within [`REMEMBERED_FOR`].
    pub fn recently_seen(&self, namespace: &str, name: &str) -> bool {
        let seen = self.lock();
        let key = (namespace.to_owned(), name.to_owned());
        seen.get(&key)
            .is_some_and(|at| at.elapsed() < REMEMBERED_FOR)
    }

    /// `namespace`/`name` exists now.
    pub fn saw(&self, namespace: &str, name: &str) {
        let mut seen = self.lock();
        if seen.len() >= MAX_REMEMBERED {
            let mut ages: Vec<Instant> = seen.values().copied().collect();
            ages.sort_unstable();
            let cut = ages[ages.len() / 2];
            seen.retain(|_, at| *at > cut);
        }
        seen.insert((namespace.to_owned(), name.to_owned()), Instant::now());
    }

    /// Secrets remembered now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Instant>> {
        self.seen.lock().expect("seen secrets lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
