//! Beside the real Cluster API core manager (`hack/testenv.sh`'s default environment), foreign
//! writers race on `spec.controlPlaneEndpoint` of the CAPTControlPlane and of the Cluster,
//! with both operations (an Update, i.e. a merge patch, that takes the host over, and a forced
//! Apply of another host and port), while the Workspace's `cluster_endpoint` output keeps
//! changing. What must hold (docs/status-applier.md: a protected path is never removed or
//! emptied and never taken back by force; a conflict is reported, not fought):
//!
//! - during the race, and after it, no watched version of either object lacks the endpoint
//!   or has an empty host or no port (count of such versions = 0);
//! - the applier reports the control plane's takeovers as conflicts: in `GET /v1/conflicts`,
//!   in `status_applier_conflicts_total` and as `FieldConflict` Events;
//! - the Cluster's endpoint is core's (core copies the control plane's once, into a Cluster
//!   without a valid one): `capt-cluster` writes nothing to it, meets no conflict, raises no
//!   Event, and never owns it; the writers' last value stays;
//! - no hot loop: the applier's apply attempts for the control plane's endpoint manager stay
//!   bounded by the versions of the objects it saw, its writes by the changes it was shown
//!   (the foreign writes and the controller's intents: at most one write each), and once the
//!   writers stop and the applier has acted on the last versions, it makes no attempt and no
//!   write at all while the foreign values stay (they are not fought);
//! - the Workspace's changes still reach the control plane's status (`atProvider`) meanwhile.
//!
//! What happens once the foreign writers stop and their ownership is released, as documented
//! here and asserted: a forced-Apply writer cannot release the control plane's endpoint by
//! applying without it (it alone owns the port, the API server refuses to remove a required
//! field: 422), so an operator releases both writers by removing their `managedFields`
//! entries. That changes the objects, so the applier plans again, finds no other owner and
//! applies its current value: the control plane's endpoint becomes the Workspace's last
//! `cluster_endpoint` (without ever disappearing), owned by `capt-captcontrolplane` alone,
//! and follows the next change of the Workspace; the Cluster keeps the writers' last value.
//!
//! The same race where core does not run, and `capt-cluster` owns and protects the
//! Cluster's endpoint, is `fault_endpoint_nocore.rs`.

#[path = "scenarios/endpoint_race.rs"]
mod endpoint_race;

use capt_tests::system::ClusterWriter;
use endpoint_race::foreign_writers_race_on_the_endpoint;

#[tokio::test]
async fn foreign_update_and_forced_apply_on_the_endpoint_beside_core_are_reported_never_fought_nor_emptied()
-> anyhow::Result<()> {
    foreign_writers_race_on_the_endpoint(ClusterWriter::Core).await
}
