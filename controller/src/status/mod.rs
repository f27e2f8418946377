//! Pure status computation: from observed objects to the desired status fragments that the
//! controller publishes to the status-applier.
//!
//! Nothing here talks to the API server, reads the clock or is async: every function maps its
//! inputs (plain structs, `serde_json::Value`, an injected `now`) to an output, so a reconcile
//! that observes nothing new publishes a byte-identical fragment.
//!
//! Each fragment is an RFC 7386 merge patch for one field manager:
//! - a field the manager knows now is set;
//! - a field that must be absent is an explicit JSON `null` (a cleared `failureMessage`);
//! - a field that cannot be known now (the Workspace could not be read) is omitted, so the
//!   applier keeps the last value it had.
//!
//! NOTE: a merge patch replaces a JSON array whole, so a fragment's `conditions` list always
//! carries *every* condition its manager sets (see [`deletion::deletion_status_fragment`] for
//! the deletion case).

pub mod capt_cluster;
pub mod cluster;
pub mod conditions;
pub mod control_plane;
pub mod deletion;
pub mod duration;
pub mod endpoint;
pub mod pause;
pub mod wait;
pub mod workspace;

#[cfg(test)]
mod testing;

/// Field manager of `CAPTCluster` status.
pub const MANAGER_CAPT_CLUSTER: &str = "capt-captcluster";
/// Field manager of `CAPTControlPlane` status and `spec.controlPlaneEndpoint`.
pub const MANAGER_CAPT_CONTROL_PLANE: &str = "capt-captcontrolplane";
/// Field manager of the Cluster API `Cluster` status and `spec.controlPlaneEndpoint`.
pub const MANAGER_CLUSTER: &str = "capt-cluster";
/// The protected path an intent names in `release` to give up an endpoint.
pub const ENDPOINT_PATH: &str = "spec.controlPlaneEndpoint";
