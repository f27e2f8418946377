//! The failover of `fault_leader.rs` where Cluster API core does not run: there
//! `capt-cluster` writes the Cluster (`initialization.infrastructureProvisioned` and `.controlPlaneInitialized`, phase
//! `Provisioned`, and `spec.controlPlaneEndpoint` following the control plane's), and the new
//! leader must take those writes over. The claim is about that no-core path alone (beside
//! core, `capt-cluster` writes nothing to the Cluster), so it runs without core: an
//! environment of its own (`.testenv-nocore`; [`without_core`] holds for a whole test
//! process, hence its own binary).
//!
//! What must hold for the Cluster, besides everything `fault_leader.rs` asserts for the CAPT
//! objects: its endpoint is the Workspace's last `cluster_endpoint` (changed during the
//! failover, and once more after it) and it is Provisioned; no watched version lacks the
//! endpoint, `initialization.controlPlaneInitialized` or the phase once set; each of those is owned by
//! `capt-cluster` alone (Apply), and the new leader settles.
//!
//! [`without_core`]: capt_tests::without_core

#[path = "scenarios/failover.rs"]
mod failover;

use capt_tests::system::ClusterWriter;
use failover::the_standby_takes_over_a_leader_killed_mid_provisioning;

#[tokio::test]
async fn the_standby_takes_over_a_leader_killed_mid_provisioning_without_core_and_nothing_is_lost()
-> anyhow::Result<()> {
    capt_tests::without_core();
    the_standby_takes_over_a_leader_killed_mid_provisioning(ClusterWriter::CaptCluster).await
}
