//! End to end: the status-applier, the controller and the fake Terraform provider as separate
//! processes against the real API server, driving the sample Cluster of `manifests/samples/`.
//! The tests take turns (a mutex): each runs its own three processes.
//!
//! One test binary (`cargo test --test e2e`), one module per group of scenarios; `common`
//! holds the turn-taking mutex and the helpers they share.

mod applies;
mod common;
mod conflict;
mod deletion;
mod failure;
mod provision;
mod workspace_status;
