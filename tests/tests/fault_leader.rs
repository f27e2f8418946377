//! Beside the real Cluster API core manager (`hack/testenv.sh`'s default environment), the
//! controller leader killed (SIGKILL) in the middle of provisioning, with a standby replica
//! on the same Lease and the same status-applier, and the Workspace's endpoint output changed
//! while no replica leads. Core's controllers write the Cluster throughout. What must hold:
//!
//! - the standby takes over within the lease duration plus a margin, and the Lease names it;
//!   it reconciled nothing while the leader led;
//! - the system converges: the Cluster is Provisioned (core's phase, from our statuses), the
//!   control plane's endpoint is the Workspace's last `cluster_endpoint` (changed during the
//!   failover, and once more after it), and the Cluster's is one the control plane had,
//!   copied by core once (core copies into a Cluster without a valid endpoint only);
//! - no field is lost: no watched version of the control plane or of the Cluster (its
//!   v1beta2 view) lacks the endpoint, `atProvider`, the phase or `initialization.controlPlaneInitialized` once it
//!   was set; the control plane ends with every status field of a provisioned control plane,
//!   its `atProvider` mirrors the Workspace, and the CAPTCluster keeps its `vpcId`;
//! - ownership stays single: each protected path and each status field CAPT writes has
//!   exactly the one owner of the ownership plan, the Cluster's endpoint, phase and
//!   `initialization` are core's (`manager`) alone and no CAPT manager owns a field of the
//!   Cluster, no managedFields entry is duplicated, no CAPT manager ever wrote with an
//!   Update, and `status-applier audit` finds no violation;
//! - the new leader settles: once the applier has acted on every object's last version, no
//!   more writes.
//!
//! Where core does not run, `capt-cluster` writes the Cluster, and the new leader must take
//! that over too: `fault_leader_nocore.rs`.

#[path = "scenarios/failover.rs"]
mod failover;

use capt_tests::system::ClusterWriter;
use failover::the_standby_takes_over_a_leader_killed_mid_provisioning;

#[tokio::test]
async fn the_standby_takes_over_a_leader_killed_mid_provisioning_beside_core_and_nothing_is_lost()
-> anyhow::Result<()> {
    the_standby_takes_over_a_leader_killed_mid_provisioning(ClusterWriter::Core).await
}
