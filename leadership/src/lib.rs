//! Leader election on a coordination Lease, for both programs of a pod: the controller holds
//! the Lease ([`elect`]) and writes only while it leads; the status-applier follows it
//! ([`follow`]) and applies only while it names its own pod. Both stop at the same deadline,
//! by the same rule ([`rule`]): the renew time plus the duration, less a margin for clock
//! skew, before any other replica may take the Lease.

pub mod elect;
pub mod follow;
pub mod rule;

pub use elect::{Election, Lead, OnWrite, Role, elect};
pub use follow::{LeaseToFollow, follow};
pub use rule::{Leadership, Timing, expiry_margin, leadership};
