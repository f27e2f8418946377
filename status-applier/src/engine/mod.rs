//! The engine: one desired document per (object, subresource, field manager), merged from
//! intents, applied with server-side apply when it differs from what the manager owns on
//! the live object.
//!
//! [`machine`] makes every decision as a pure state machine (events in, effects out);
//! [`driver`] is the thin async shell that carries the effects out against the API server
//! and feeds back what came of them. A key is queued at most once: intents that arrive
//! while its apply is pending or in flight merge into the document, and the next apply
//! carries them all (coalescing). Object changes seen by the watches re-check the keys of
//! that object, which retries conflicts and restores drifted fields; a check sends nothing
//! when nothing would change.

pub mod driver;
pub mod events;
pub mod machine;
#[cfg(test)]
mod tests;

pub use crate::outcome::Outcome;
pub use driver::{ConflictRecord, Engine};
pub use events::DesiredView;
use std::time::Duration;

/// Tuning of the engine. `status-applier serve` sets each from a flag, whose default is
/// [`Tuning::DEFAULT`]'s.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuning {
    /// How long a queued key waits for more intents before its apply: the apply starts once
    /// no intent arrived for this long (and at the latest after ten windows).
    pub coalesce_window: Duration,
    /// Apply an intent for a key that saw no intent for a window at once (leading edge, the
    /// default): a lone change pays no window; what arrives while that apply runs or within
    /// the window coalesces into the next one, so a burst becomes at most two applies. Off,
    /// every apply waits a quiet window (trailing edge): a burst is one apply.
    pub apply_lone_intents_at_once: bool,
    /// Keys being read or applied at once (one key per object at a time).
    pub max_concurrent_applies: usize,
    /// How long a document whose intent names a newer version of its object than the
    /// applier's view (`notOlderThan`) waits for the watch to deliver it before the object
    /// is read. It holds no slot meanwhile.
    pub view_wait: Duration,
    /// First retry delay after an API error; doubles per failure, with jitter.
    pub backoff_base: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// How long a submitter waiting for the outcome waits.
    pub wait_timeout: Duration,
    /// How many conflicts the conflicts endpoint remembers.
    pub conflict_history: usize,
}

impl Tuning {
    /// The defaults, as a constant: the command line's flags take theirs from it.
    pub const DEFAULT: Tuning = Tuning {
        coalesce_window: Duration::from_millis(10),
        apply_lone_intents_at_once: true,
        max_concurrent_applies: 16,
        view_wait: Duration::from_secs(1),
        backoff_base: Duration::from_millis(200),
        backoff_max: Duration::from_secs(60),
        wait_timeout: Duration::from_secs(30),
        conflict_history: 256,
    };
}

impl Default for Tuning {
    fn default() -> Self {
        Self::DEFAULT
    }
}
