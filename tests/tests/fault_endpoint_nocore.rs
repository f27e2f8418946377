//! The race of `fault_endpoint.rs` where Cluster API core does not run: there `capt-cluster`
//! writes the Cluster's `spec.controlPlaneEndpoint` (copied from the control plane, as core
//! would) and the status-applier protects it as it protects the control plane's. The claim is
//! about that no-core path alone (beside core, `capt-cluster` writes nothing to the Cluster),
//! so it runs without core: an environment of its own (`.testenv-nocore`; [`without_core`]
//! holds for a whole test process, hence its own binary).
//!
//! What must hold for the Cluster, besides everything `fault_endpoint.rs` asserts for the
//! control plane: no watched version lacks the endpoint; the takeovers are reported as
//! conflicts (`GET /v1/conflicts`, `status_applier_conflicts_total` for `capt-cluster`, a
//! `FieldConflict` Event on the Cluster); the writers' value stays while they own it (not
//! fought, no apply attempt or write in the window); once an operator removes their
//! `managedFields` entries, the endpoint becomes the Workspace's last `cluster_endpoint`,
//! owned by `capt-cluster` alone, follows the next change, and the audit is clean.
//!
//! [`without_core`]: capt_tests::without_core

#[path = "scenarios/endpoint_race.rs"]
mod endpoint_race;

use capt_tests::system::ClusterWriter;
use endpoint_race::foreign_writers_race_on_the_endpoint;

#[tokio::test]
async fn foreign_update_and_forced_apply_on_the_endpoint_without_core_are_reported_never_fought_nor_emptied()
-> anyhow::Result<()> {
    capt_tests::without_core();
    foreign_writers_race_on_the_endpoint(ClusterWriter::CaptCluster).await
}
