//! CAPTControlPlane: waits for its VPC, creates or adopts its WorkspaceTemplateApply, and
//! publishes the endpoint and status computed by [`crate::status::control_plane`], then
//! keeps the Cluster's kubeconfig Secrets. Deletion releases the Cluster endpoint, deletes
//! the apply and waits for the Workspace to go. A reconcile observes (the caches,
//! [`observe`]), decides ([`decide::decide`]) and acts ([`super::act`]).

mod decide;

pub use self::decide::{
    ADDING_FINALIZER, CLUSTER_DOES_NOT_REFERENCE, READING_CLUSTER, Snapshot, decide,
};

use super::Result;
use super::apply_owner::ApplyOwner;
use super::claims::names_control_plane;
use super::observe;
use crate::api::{CAPT_CONTROL_PLANE_FINALIZER, CAPTCluster, CAPTControlPlane};
use crate::context::Context;
use crate::status::MANAGER_CAPT_CONTROL_PLANE;
use crate::status::control_plane::CONTROL_PLANE_CONDITION_TYPES;
use crate::watches::cached_beside;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::controller::Action;
use serde_json::{Value, json};
use std::sync::Arc;

impl ApplyOwner for CAPTControlPlane {
    const FINALIZER: &'static str = CAPT_CONTROL_PLANE_FINALIZER;
    const MANAGER: &'static str = MANAGER_CAPT_CONTROL_PLANE;
    const CONDITION_TYPES: &'static [&'static str] = &CONTROL_PLANE_CONDITION_TYPES;
    const APPLY_SUFFIX: &'static str = "controlplane";

    fn recorded_apply_name(&self) -> Option<&str> {
        self.spec.workspace_template_apply_name.as_deref()
    }

    const CONNECTION_SUFFIX: &'static str = "eks-connection";

    fn template_ref(&self) -> Value {
        json!(self.spec.workspace_template_ref)
    }

    /// Its Kubernetes version and region (`CLUSTER_NAME` is set, with its namespace, in
    /// [`super::apply_owner::apply_writes`]).
    fn apply_variables(&self) -> Value {
        let config = self.spec.control_plane_config.clone().unwrap_or_default();
        let mut variables = json!({
            "KUBERNETES_VERSION": crate::api::eks_version(&self.spec.version),
        });
        if let Some(region) = config.region {
            variables["REGION"] = json!(region);
        }
        variables
    }

    fn conditions(&self) -> &[Condition] {
        let list = self.status.as_ref().and_then(|s| s.conditions.as_deref());
        list.unwrap_or_default()
    }

    fn template_namespace(&self) -> (&'static str, Option<&String>) {
        (
            "spec.workspaceTemplateRef",
            self.spec.workspace_template_ref.namespace.as_ref(),
        )
    }
}

/// Reconciles one CAPTControlPlane.
pub async fn reconcile(cp: Arc<CAPTControlPlane>, ctx: Arc<Context>) -> Result<Action> {
    let seen = observe(&ctx, cp);
    let subject = super::subject(&*seen.as_owner.owner);
    super::act::carry_out_rounds(&ctx, &subject, |progress| {
        Ok(decide(&seen, progress, Timestamp::now()))
    })
    .await
}

/// What the decision reads, from the caches ([`observe::as_owner`], whose deletion reads the
/// Cluster only when it names this control plane back), and that Cluster's CAPTCluster
/// (whose VPC it waits for).
pub fn observe(ctx: &Context, cp: Arc<CAPTControlPlane>) -> Snapshot {
    let proving = cp.clone();
    let as_owner = observe::as_owner(ctx, cp, |named| {
        named.filter(|c| names_control_plane(c, &proving)).cloned()
    });
    let infrastructure = (as_owner.named_cluster.as_ref())
        .and_then(|c| c.spec.infrastructure_ref.as_ref())
        .and_then(|r| r.name_of::<CAPTCluster>())
        .and_then(|n| cached_beside(&ctx.caches.capt_clusters, &*as_owner.owner, n));
    Snapshot {
        as_owner,
        infrastructure,
        without_core: ctx.settings.without_core,
    }
}
