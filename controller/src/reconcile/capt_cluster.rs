//! CAPTCluster: waits for its owning Cluster, creates or adopts its VPC apply (unless it
//! uses an existing VPC), and publishes the status computed by
//! [`crate::status::capt_cluster`]. Deletion waits for the control plane, then deletes the
//! VPC apply (or orphans it with `retainVpcOnDelete`) and waits for its Workspace to go. A
//! reconcile observes (the caches, [`observe`]), decides ([`decide::decide`]) and acts
//! ([`super::act`]).

mod decide;

pub use self::decide::{ADDING_FINALIZER, CLUSTER_DOES_NOT_REFERENCE, Snapshot, decide};

use super::Result;
use super::apply_owner::ApplyOwner;
use super::claims::{cluster_name, names_control_plane, names_infrastructure};
use super::observe::{self, owning_cluster};
use crate::api::{CAPT_CLUSTER_FINALIZER, CAPTCluster};
use crate::context::Context;
use crate::status::MANAGER_CAPT_CLUSTER;
use crate::status::capt_cluster::CAPT_CLUSTER_CONDITION_TYPES;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use serde_json::{Value, json};
use std::sync::Arc;

impl ApplyOwner for CAPTCluster {
    const FINALIZER: &'static str = CAPT_CLUSTER_FINALIZER;
    const MANAGER: &'static str = MANAGER_CAPT_CLUSTER;
    const CONDITION_TYPES: &'static [&'static str] = &CAPT_CLUSTER_CONDITION_TYPES;
    const APPLY_SUFFIX: &'static str = "vpc";

    fn recorded_apply_name(&self) -> Option<&str> {
        self.spec.workspace_template_apply_name.as_deref()
    }

    const CONNECTION_SUFFIX: &'static str = "vpc-connection";

    fn template_ref(&self) -> Value {
        json!(self.spec.vpc_template_ref)
    }

    /// Its region, and the VPC's bare name (`CLUSTER_NAME` and the VPC's name get their
    /// namespace in [`super::apply_owner::apply_writes`]).
    fn apply_variables(&self) -> Value {
        let mut variables = json!({"REGION": self.spec.region});
        if let Some(vpc) = &self.spec.vpc_config {
            variables[crate::names::VPC_NAME] = json!(vpc.name);
        }
        variables
    }

    fn conditions(&self) -> &[Condition] {
        let list = self.status.as_ref().and_then(|s| s.conditions.as_deref());
        list.unwrap_or_default()
    }

    fn template_namespace(&self) -> (&'static str, Option<&String>) {
        (
            "spec.vpcTemplateRef",
            self.spec
                .vpc_template_ref
                .as_ref()
                .and_then(|r| r.namespace.as_ref()),
        )
    }
}

/// Reconciles one CAPTCluster.
pub async fn reconcile(cc: Arc<CAPTCluster>, ctx: Arc<Context>) -> Result<Action> {
    let seen = observe(&ctx, cc);
    let subject = super::subject(&*seen.owner);
    super::act::carry_out_rounds(&ctx, &subject, |progress| {
        Ok(decide(&seen, progress, Timestamp::now()))
    })
    .await
}

/// What the decision reads, from the caches ([`observe::as_owner`]), with the CAPTCluster's own
/// deletion facts: whether its control plane is still there, and whether its VPC is kept.
pub fn observe(ctx: &Context, cc: Arc<CAPTCluster>) -> Snapshot {
    let mut seen = observe::as_owner(ctx, cc, |_| None);
    if let Some((_, facts)) = &mut seen.deletion {
        facts.control_plane_present = control_plane_present(ctx, &seen.owner);
        facts.retain = seen.owner.spec.retain_vpc_on_delete.unwrap_or(false);
    }
    seen
}

/// True when a CAPTControlPlane of the same Cluster still exists (as cached). While the
/// Cluster exists, only what it proves counts: a CAPTCluster it does not name (a decoy) waits
/// for nothing, and only the control plane its `spec.controlPlaneRef` names is waited for (a
/// decoy control plane labelled with its name would hold the deletion forever). Once the
/// Cluster is gone (deleted first, where core does not run), the labels are all there is.
fn control_plane_present(ctx: &Context, cc: &CAPTCluster) -> bool {
    let Some(cluster) = cluster_name(cc) else {
        return false;
    };
    if let Some(owner) = owning_cluster(ctx, cc) {
        return names_infrastructure(&owner, cc)
            && ctx.caches.control_planes.state().iter().any(|cp| {
                cp.namespace() == cc.namespace() && names_control_plane(&owner, cp.as_ref())
            });
    }
    ctx.caches.control_planes.state().iter().any(|cp| {
        cp.namespace() == cc.namespace() && cluster_name(cp.as_ref()).as_deref() == Some(&cluster)
    })
}
