//! status-applier-api: the wire contract between a controller (the field manager's writer)
//! and the status-applier sidecar.
//!
//! An [`Intent`] goes in, an [`Outcome`] comes back; [`client::Client::send`] is the one
//! place that tells which HTTP answers carry a delivered outcome and which are refusals,
//! and the server answers with [`Action::status_code`], so the two cannot drift apart.
#![forbid(unsafe_code)]

pub mod client;
pub mod intent;
pub mod outcome;

pub use client::{Client, ClientError};
pub use intent::{Intent, MAX_INTENT_BYTES, Subresource, Target};
pub use outcome::{Action, Conflict, Outcome};
