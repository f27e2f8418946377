//! CAPT controller: observes CAPT objects, their Workspaces and the Cluster API `Cluster`,
//! computes each object's desired status as a pure function of what it observed, and publishes
//! it to the status-applier as intents. It never writes status itself.
#![forbid(unsafe_code)]

pub mod api;
pub mod context;
pub mod fair_share;
pub mod kubeconfig;
pub mod metrics;
pub mod names;
pub mod publish;
pub mod reconcile;
pub mod render;
pub mod rewake;
pub mod run;
pub mod seen_secrets;
pub mod status;
pub mod sweep;
pub mod tenancy;
pub mod trigger;
pub mod unreadable;
pub mod variables;
pub mod watches;
pub mod workspace_policy;
pub mod write_loops;
