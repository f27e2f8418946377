//! status-applier: a generic server-side-apply field-manager sidecar.
//!
//! The data flows one way: an [`intent::Intent`] is validated, its fragment is merged into
//! the field manager's desired document ([`merge`]), and the engine applies the whole
//! document with server-side apply when it differs from what the manager owns on the live
//! object.
//!
//! The wire contract (intents, outcomes, the client) is the `status-applier-api` crate, which
//! the server answers with, so a client and this server cannot drift apart. Field ownership
//! (`managedFields`, fieldsV1) is decoded by the `managed-fields` crate, which the controller
//! shares.
#![forbid(unsafe_code)]

pub mod apply;
pub mod audit;
pub mod config;
pub mod conflict;
pub mod document;
pub mod engine;
pub mod error;
pub mod intent;
pub mod live;
pub mod merge;
pub mod metrics;
pub mod outcome;
pub mod ownership;
pub mod policy;
pub mod server;
pub mod view;

/// The client of the intent API, from the API crate.
pub use status_applier_api::client;
