//! Noticing write loops: an object written by one of our managers again and again while
//! nothing it is computed from changed.
//!
//! Every write the controller makes or asks the status-applier for is a function of what
//! it observed (the object's spec, the Workspace, the template, the peer objects). A write
//! that repeats while that stayed the same is wrong by construction: it derives its change
//! from our own previous write, or from the clock, and it usually wakes the reconcile that
//! makes the next one (a standalone WorkspaceTemplateApply once wrote ~85 times a second). This
//! module does not stop such a loop, it makes it visible: the caller counts a metric and
//! puts a Warning Event on the object.
//!
//! Pure: no client, no clock. The caller passes `now`, so the tests move time by hand.

use status_applier_api::intent::Subresource;
use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

/// An object, the manager that wrote it and the subresource written: what the write-loop
/// guard counts writes of, and what the publisher remembers deliveries by. One is kept per
/// object and manager, so the kind and the manager are the program's own strings, not
/// copies (`Resource::kind` borrows them for every kind CAPT writes).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Written {
    /// The object's apiVersion.
    pub api_version: Cow<'static, str>,
    /// The object's kind.
    pub kind: Cow<'static, str>,
    /// Its namespace (`None`: cluster-scoped).
    pub namespace: Option<Box<str>>,
    /// Its name.
    pub name: Box<str>,
    /// The field manager of the write.
    pub manager: &'static str,
    /// The subresource written (`None`: the main resource).
    pub subresource: Option<Subresource>,
}

impl Written {
    /// A write of the `K` `namespace`/`name` by `manager`.
    pub fn of<K: kube::Resource<DynamicType = ()>>(
        namespace: Option<&str>,
        name: &str,
        manager: &'static str,
        subresource: Option<Subresource>,
    ) -> Self {
        Self {
            api_version: K::api_version(&()),
            kind: K::kind(&()),
            namespace: namespace.map(Into::into),
            name: name.into(),
            manager,
            subresource,
        }
    }

    /// What the tables that remember writes key this one by.
    pub fn id(&self) -> WriteId {
        WriteId {
            object: ObjectId::of(
                &self.api_version,
                &self.kind,
                self.namespace.as_deref(),
                &self.name,
            ),
            manager: self.manager,
            subresource: self.subresource,
        }
    }
}

/// An object (apiVersion, kind, namespace and name) by a 128-bit fingerprint: what is kept
/// per object for as long as it exists holds no copy of its strings (they were a tenth of
/// the controller's memory per cluster).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ObjectId(u128);

impl ObjectId {
    /// The object `kind` `namespace`/`name` of `api_version`.
    pub fn of(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Self {
        use sha2::Digest as _;
        let text =
            serde_json::to_vec(&(api_version, kind, namespace, name)).expect("strings serialize");
        let digest = sha2::Sha256::digest(&text);
        let mut first = [0; 16];
        first.copy_from_slice(&digest[..16]);
        Self(u128::from_le_bytes(first))
    }

    /// `obj`.
    pub fn of_object<K: kube::Resource<DynamicType = ()>>(obj: &K) -> Self {
        let meta = obj.meta();
        let name = meta.name.as_deref().unwrap_or_default();
        Self::of(
            &K::api_version(&()),
            &K::kind(&()),
            meta.namespace.as_deref(),
            name,
        )
    }
}

/// A [`Written`] as it is remembered: its object's fingerprint, its manager and subresource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WriteId {
    /// The object written.
    pub object: ObjectId,
    /// The field manager of the write.
    pub manager: &'static str,
    /// The subresource written (`None`: the main resource).
    pub subresource: Option<Subresource>,
}

/// How many writes within how long, with the same [`Basis`], are a loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// More writes than this within `window` are a loop.
    pub writes: usize,
    /// The sliding window writes are counted over; also how long a reported object stays
    /// quiet before it can be reported again.
    pub window: Duration,
}

/// Writes allowed per window by default: a provisioning control plane writes its status a
/// handful of times, each time for a new observation, which resets the count anyway.
pub const DEFAULT_WRITES: usize = 6;
/// The default window.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(60);

impl Default for Limit {
    fn default() -> Self {
        Self {
            writes: DEFAULT_WRITES,
            window: DEFAULT_WINDOW,
        }
    }
}

/// What a write was computed from: the generation of the object it is for and a fingerprint
/// of what the reconcile observed besides the object's own status (which is our output,
/// not an input). Equal bases mean nothing changed that could explain a new write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Basis(u64);

impl Basis {
    /// The basis of a write for an object of `generation`, computed from `observed`.
    ///
    /// The fingerprint hashes `observed`'s `Debug` text: the observations are plain data
    /// that all derive `Debug` (not all `Hash`: JSON values, timestamps), and the basis is
    /// only ever compared within one process.
    pub fn of(generation: Option<i64>, observed: &impl Debug) -> Self {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        generation.hash(&mut hasher);
        format!("{observed:?}").hash(&mut hasher);
        Self(hasher.finish())
    }
}

/// A loop found: the writes counted within the window, this one included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loop {
    /// How many writes with one basis fell within the window.
    pub writes: usize,
}

/// The recent writes of one object.
#[derive(Debug)]
struct Track {
    basis: Basis,
    /// When the writes with `basis` happened, within the window; at most `limit + 1`.
    at: VecDeque<Instant>,
    /// Not reported again before this.
    quiet_until: Option<Instant>,
}

/// The recent writes of every object, keyed by `K` (an object and a manager).
#[derive(Debug)]
pub struct WriteLoops<K> {
    limit: Limit,
    objects: HashMap<K, Track>,
    swept: Option<Instant>,
}

impl<K: Hash + Eq + Clone> WriteLoops<K> {
    /// Nothing counted yet.
    pub fn new(limit: Limit) -> Self {
        Self {
            limit,
            objects: HashMap::new(),
            swept: None,
        }
    }

    /// Forgets the writes of every key `gone` says is gone (its object was deleted).
    pub fn forget(&mut self, gone: impl Fn(&K) -> bool) {
        self.objects.retain(|k, _| !gone(k));
    }

    /// The limit in force.
    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// Counts a write of `key` computed from `basis` at `now`. Answers a [`Loop`] when this
    /// write makes more than [`Limit::writes`] within the window with one basis, and the
    /// object was not reported within the last window.
    pub fn wrote(&mut self, key: K, basis: Basis, now: Instant) -> Option<Loop> {
        self.sweep(now);
        let window = self.limit.window;
        let track = self.objects.entry(key).or_insert_with(|| Track {
            basis,
            at: VecDeque::new(),
            quiet_until: None,
        });
        // A new observation or a new spec explains the write: counting starts again.
        if track.basis != basis {
            track.basis = basis;
            track.at.clear();
        }
        track.at.push_back(now);
        while track
            .at
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= window)
        {
            track.at.pop_front();
        }
        while track.at.len() > self.limit.writes + 1 {
            track.at.pop_front();
        }
        let looping = track.at.len() > self.limit.writes;
        let quiet = track.quiet_until.is_some_and(|until| now < until);
        if !looping || quiet {
            return None;
        }
        track.quiet_until = Some(now + window);
        Some(Loop {
            writes: track.at.len(),
        })
    }

    /// How many objects are tracked (for tests: what is forgotten).
    pub fn tracked(&self) -> usize {
        self.objects.len()
    }

    /// Forgets, at most once per window, the objects with no write within the last window
    /// and no report still keeping them quiet: memory stays bounded by the objects written
    /// lately, not by every object ever written.
    fn sweep(&mut self, now: Instant) {
        let window = self.limit.window;
        if self
            .swept
            .is_some_and(|t| now.saturating_duration_since(t) < window)
        {
            return;
        }
        self.swept = Some(now);
        self.objects.retain(|_, track| {
            let recent = track
                .at
                .back()
                .is_some_and(|t| now.saturating_duration_since(*t) < window);
            let quiet = track.quiet_until.is_some_and(|until| now < until);
            recent || quiet
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn loops() -> (WriteLoops<&'static str>, Instant) {
        (WriteLoops::new(Limit::default()), Instant::now())
    }

    fn basis(generation: i64, observed: &str) -> Basis {
        Basis::of(Some(generation), &observed)
    }

    #[test]
    fn objects_are_told_apart_by_every_part_of_their_name() {
        let id = |ns: Option<&str>, name: &str| ObjectId::of("v1", "Secret", ns, name);
        assert_eq!(id(Some("a"), "b"), id(Some("a"), "b"));
        assert_ne!(id(Some("a"), "bc"), id(Some("ab"), "c"));
        assert_ne!(id(None, "b"), id(Some(""), "b"));
        assert_ne!(
            ObjectId::of("v1", "Secret", None, "b"),
            ObjectId::of("v1", "ConfigMap", None, "b")
        );
    }

    #[test]
    fn the_seventh_write_within_a_minute_with_one_basis_is_a_loop() {
        let (mut w, t0) = loops();
        for i in 0..6 {
            assert_eq!(w.wrote("a", basis(1, "x"), t0 + i * SECOND), None, "{i}");
        }
        assert_eq!(
            w.wrote("a", basis(1, "x"), t0 + 6 * SECOND),
            Some(Loop { writes: 7 })
        );
    }

    #[test]
    fn writes_spread_wider_than_the_window_are_not_a_loop() {
        let (mut w, t0) = loops();
        // One every 10 s: never more than six within any 60 s.
        for i in 0..30 {
            assert_eq!(
                w.wrote("a", basis(1, "x"), t0 + i * 10 * SECOND),
                None,
                "{i}"
            );
        }
    }

    #[test]
    fn a_new_observation_or_generation_starts_the_count_again() {
        let (mut w, t0) = loops();
        // A failing Workspace retried with backoff: each write mirrors a new observation.
        for i in 0..20 {
            let observed = format!("attempt {i}");
            assert_eq!(
                w.wrote("a", Basis::of(Some(1), &observed), t0 + i * SECOND),
                None
            );
        }
        for i in 0..20 {
            assert_eq!(
                w.wrote("b", basis(i64::from(i), "x"), t0 + i * SECOND),
                None
            );
        }
    }

    #[test]
    fn a_loop_is_reported_once_per_window_and_again_while_it_lasts() {
        let (mut w, t0) = loops();
        let ms = Duration::from_millis(25);
        let reported: Vec<u32> = (0..6000u32)
            .filter(|i| w.wrote("a", basis(1, "x"), t0 + *i * ms).is_some())
            .collect();
        // 6,000 writes 25 ms apart are 150 s: reported at the 7th write, then each 60 s.
        assert_eq!(reported, vec![6, 2406, 4806]);
    }

    #[test]
    fn objects_are_counted_apart() {
        let (mut w, t0) = loops();
        for i in 0..6 {
            assert_eq!(w.wrote("a", basis(1, "x"), t0 + i * SECOND), None);
            assert_eq!(w.wrote("b", basis(1, "x"), t0 + i * SECOND), None);
        }
        assert!(w.wrote("a", basis(1, "x"), t0 + 6 * SECOND).is_some());
        assert!(w.wrote("c", basis(1, "x"), t0 + 6 * SECOND).is_none());
    }

    #[test]
    fn the_limit_is_the_callers() {
        let limit = Limit {
            writes: 2,
            window: 10 * SECOND,
        };
        let mut w = WriteLoops::new(limit);
        let t0 = Instant::now();
        assert_eq!(w.wrote("a", basis(1, "x"), t0), None);
        assert_eq!(w.wrote("a", basis(1, "x"), t0 + SECOND), None);
        assert_eq!(
            w.wrote("a", basis(1, "x"), t0 + 2 * SECOND),
            Some(Loop { writes: 3 })
        );
        // 11 s later the first two fell out of the window and the report's quiet ended.
        assert_eq!(w.wrote("a", basis(1, "x"), t0 + 12 * SECOND), None);
    }

    #[test]
    fn objects_written_long_ago_are_forgotten() {
        let (mut w, t0) = loops();
        for i in 0..100u32 {
            w.wrote(if i % 2 == 0 { "a" } else { "b" }, basis(1, "x"), t0);
        }
        assert_eq!(w.tracked(), 2);
        w.wrote("c", basis(1, "x"), t0 + 61 * SECOND);
        // "a" and "b" were reported (quiet until t0 + 60 s) and last written at t0.
        assert_eq!(w.tracked(), 1);
    }

    #[test]
    fn the_basis_tells_observations_apart_and_equal_ones_alike() {
        assert_eq!(basis(1, "x"), basis(1, "x"));
        assert_ne!(basis(1, "x"), basis(2, "x"));
        assert_ne!(basis(1, "x"), basis(1, "y"));
        assert_ne!(Basis::of(None, &"x"), basis(1, "x"));
    }
}
