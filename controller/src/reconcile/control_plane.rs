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
use super::owner;
use super::shared::{cluster_name, names_control_plane, workspace_names};
use crate::api::{CAPT_CONTROL_PLANE_FINALIZER, CAPTCluster, CAPTControlPlane};
use crate::context::Context;
use crate::status::MANAGER_CAPT_CONTROL_PLANE;
use crate::status::control_plane::CONTROL_PLANE_CONDITION_TYPES;
use crate::watches::{cached, cached_beside};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
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
    let subject = super::subject(&*seen.cp);
    super::act::carry_out_rounds(&ctx, &subject, |progress| {
        decide(&seen, progress, Timestamp::now())
    })
    .await
}

/// What the decision reads, from the caches: the control plane, the Cluster it names and
/// that Cluster's CAPTCluster, its apply, the Workspaces that may be that apply's, the names
/// its Cluster's applies recorded, and, when it is being deleted, its deletion's facts.
pub fn observe(ctx: &Context, cp: Arc<CAPTControlPlane>) -> Snapshot {
    let ns = cp.namespace().unwrap_or_default();
    let named_cluster =
        cluster_name(&*cp).and_then(|n| cached_beside(&ctx.caches.clusters, &*cp, &n));
    let infrastructure = (named_cluster.as_ref())
        .and_then(|c| c.spec.infrastructure_ref.as_ref())
        .and_then(|r| r.name_of::<CAPTCluster>())
        .and_then(|n| cached_beside(&ctx.caches.capt_clusters, &*cp, n));
    let apply_name = cp.apply_name();
    let apply = cached_beside(&ctx.caches.applies, &*cp, &apply_name);
    let workspaces = workspace_names(&ns, &apply_name)
        .iter()
        .filter_map(|n| cached(&ctx.caches.workspaces, None, n))
        .collect();
    let siblings = named_cluster
        .as_deref()
        .map(|c| owner::cluster_names_recorded(ctx, c))
        .unwrap_or_default();
    let deleting = cp.meta().deletion_timestamp.is_some() && owner::ours_to_delete(&*cp);
    let deletion = deleting.then(|| {
        let proven = (named_cluster.as_deref()).filter(|c| names_control_plane(c, &cp));
        owner::deletion_of(ctx, &*cp, proven.cloned())
    });
    Snapshot {
        cp,
        named_cluster,
        infrastructure,
        apply,
        workspaces,
        siblings,
        deletion,
        allowed_template_namespaces: ctx.settings.allowed_template_namespaces.clone(),
        poll_interval: ctx.settings.poll_interval,
        without_core: ctx.settings.without_core,
    }
}
