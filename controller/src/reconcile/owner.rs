//! What a CAPTCluster and a CAPTControlPlane both are to the controller: the owner of one
//! WorkspaceTemplateApply (named, specified, recorded in `spec.workspaceTemplateApplyName`,
//! deleted in order), with a finalizer, a status field manager and its conditions. The two
//! reconcilers differ only in what they compute; this is what they share.

use super::deletion::Deletion;
use super::pause;
use super::plan::Plan;
use super::shared::{self, ApplySpec, ensure_apply};
use super::{Result, kube_err};
use crate::api::{CAPTCluster, CAPTControlPlane, Cluster, WorkspaceTemplateApply};
use crate::context::Context;
use crate::k8s::apply_fields;
use crate::names;
use crate::status::conditions::{self, ConditionBuilder, Status};
use crate::status::deletion::DeletionFacts;
use crate::tenancy::{ApplyClaim, Refusal, template_cross_namespace};
use crate::watches::cached_beside;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use std::fmt::Debug;

/// A CAPT kind that owns one WorkspaceTemplateApply.
pub trait ApplyOwner:
    Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + Debug + Sized
{
    /// Our finalizer on it.
    const FINALIZER: &'static str;
    /// The field manager of its status.
    const MANAGER: &'static str;
    /// The condition types that manager sets.
    const CONDITION_TYPES: &'static [&'static str];
    /// The default apply is `<name>-<APPLY_SUFFIX>`.
    const APPLY_SUFFIX: &'static str;

    /// `spec.workspaceTemplateApplyName`, once recorded.
    fn recorded_apply_name(&self) -> Option<&str>;

    /// Its connection Secret is `<name>-<CONNECTION_SUFFIX>` in its namespace.
    const CONNECTION_SUFFIX: &'static str;

    /// The apply's `templateRef` (as the owner's spec names it).
    fn template_ref(&self) -> Value;

    /// The apply's `variables`.
    fn apply_variables(&self) -> Value;

    /// Its live conditions.
    fn conditions(&self) -> &[Condition];

    /// Its template reference: the field's path and the namespace it names, if any.
    fn template_namespace(&self) -> (&'static str, Option<&String>);

    /// The `spec` of the apply to create: its template, variables and connection Secret.
    fn apply_spec(&self) -> Value {
        let secret = format!("{}-{}", self.name_any(), Self::CONNECTION_SUFFIX);
        json!({
            "templateRef": self.template_ref(),
            "variables": self.apply_variables(),
            "writeConnectionSecretToRef": {"name": secret, "namespace": self.namespace().unwrap_or_default()},
        })
    }

    /// The name of its apply: the recorded one, else `<name>-<APPLY_SUFFIX>`.
    fn apply_name(&self) -> String {
        self.recorded_apply_name()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("{}-{}", self.name_any(), Self::APPLY_SUFFIX))
    }
}

/// The owner's apply, and the owner's generation once its name is recorded.
#[derive(Debug)]
pub struct Recorded {
    /// The WorkspaceTemplateApply.
    pub apply: WorkspaceTemplateApply,
    /// The owner's resourceVersion after recording the apply's name, when this reconcile
    /// recorded it ([`crate::publish::Publication::after`]).
    pub written: Option<String>,
    /// The owner's `metadata.generation` after recording the apply's name: recording it is
    /// a spec change, so a status computed in the same reconcile observes this generation,
    /// not the cached one (else the status is written twice, once for each generation).
    pub generation: Option<i64>,
}

/// Creates or adopts the owner's apply and records its name in the owner's
/// `spec.workspaceTemplateApplyName` (field manager `capt-controller`), once. Nothing is
/// created, changed or recorded when the owner's template reference leaves its namespace
/// (unless allowed), the name its Cluster (`cluster`, which names the owner) would get is
/// one EKS refuses, or the existing apply is not provably its own: `Ok(Err(refusal))`.
pub async fn ensure_recorded_apply<O: ApplyOwner>(
    ctx: &Context,
    api: &Api<O>,
    owner: &O,
    cluster: &Cluster,
) -> Result<Result<Recorded, Refusal>> {
    let own = owner.namespace().unwrap_or_default();
    let (field, namespace) = owner.template_namespace();
    let allowed = &ctx.settings.allowed_template_namespaces;
    if let Some(crossing) = template_cross_namespace(&own, field, namespace, allowed) {
        return Ok(Err(Refusal::cross_namespace(&crossing, &own)));
    }
    let mut spec = owner.apply_spec();
    if let Err(refusal) = platform_names(ctx, owner, cluster, &mut spec["variables"]) {
        return Ok(Err(refusal));
    }
    let wanted = ApplySpec {
        name: owner.apply_name(),
        spec,
    };
    let apply = match ensure_apply(ctx, owner, wanted).await? {
        Ok(apply) => apply,
        Err(refusal) => return Ok(Err(refusal)),
    };
    let mut generation = owner.meta().generation;
    let mut written_version = None;
    if owner.recorded_apply_name() != Some(apply.name_any().as_str()) {
        let fields = json!({"spec": {"workspaceTemplateApplyName": apply.name_any()}});
        let written = apply_fields(api, owner, fields)
            .await
            .map_err(kube_err(owner, "recording its WorkspaceTemplateApply name"))?;
        generation = written.meta().generation.max(generation);
        written_version = written.resource_version();
    }
    Ok(Ok(Recorded {
        apply,
        written: written_version,
        generation,
    }))
}

/// Sets the name keys of the owner's apply variables (`crate::names`): `CLUSTER_NAME` to
/// `<namespace>_<cluster>`, and `VPC_NAME`, when set, to `<namespace>_<vpc>`, unless the
/// owner's apply exists and recorded the bare name (an apply rendered before names carried
/// their namespace keeps its name), or, with no apply yet, the other apply of its Cluster
/// recorded the bare Cluster name. `Err` when the Cluster's new name is one EKS refuses:
/// `ClusterNameValid=False`, and no apply.
fn platform_names<O: ApplyOwner>(
    ctx: &Context,
    owner: &O,
    cluster: &Cluster,
    variables: &mut Value,
) -> std::result::Result<(), Refusal> {
    let ns = owner.namespace().unwrap_or_default();
    let own = recorded_names(ctx, owner);
    let recorded = |key: &str| own.as_ref().and_then(|v| v.get(key)).map(String::as_str);
    let bare = cluster.name_any();
    let siblings = cluster_names_recorded(ctx, cluster);
    let name = names::cluster_name(&ns, &bare, recorded(names::CLUSTER_NAME), &siblings).map_err(
        |message| Refusal {
            condition: names::CLUSTER_NAME_VALID_CONDITION,
            reason: names::CLUSTER_NAME_INVALID,
            message,
        },
    )?;
    variables[names::CLUSTER_NAME] = json!(name);
    if let Some(vpc) = variables[names::VPC_NAME].as_str().map(str::to_owned) {
        let kept = names::kept_or_namespaced(&ns, &vpc, recorded(names::VPC_NAME), &[]);
        variables[names::VPC_NAME] = json!(kept);
    }
    Ok(())
}

/// The variables of the owner's apply (as cached), when it exists and is provably its own.
fn recorded_names<O: ApplyOwner>(
    ctx: &Context,
    owner: &O,
) -> Option<std::collections::BTreeMap<String, String>> {
    let apply = shared::get_apply(ctx, owner, &owner.apply_name())?;
    let ours = matches!(shared::claim_of(owner, &apply), ApplyClaim::Ours);
    ours.then_some(apply.spec.variables).flatten()
}

/// The `CLUSTER_NAME`s the applies of the Cluster's CAPTCluster and CAPTControlPlane (those
/// its references name, as cached) recorded.
fn cluster_names_recorded(ctx: &Context, cluster: &Cluster) -> Vec<String> {
    let infra = cluster.spec.infrastructure_ref.as_ref();
    let cc = infra
        .and_then(|r| r.name_of::<CAPTCluster>())
        .and_then(|n| cached_beside(&ctx.caches.capt_clusters, cluster, n));
    let control_plane = cluster.spec.control_plane_ref.as_ref();
    let cp = control_plane
        .and_then(|r| r.name_of::<CAPTControlPlane>())
        .and_then(|n| cached_beside(&ctx.caches.control_planes, cluster, n));
    let of = |variables: Option<std::collections::BTreeMap<String, String>>| {
        variables.and_then(|mut v| v.remove(names::CLUSTER_NAME))
    };
    let mut found = Vec::new();
    found.extend(cc.and_then(|cc| of(recorded_names(ctx, &*cc))));
    found.extend(cp.and_then(|cp| of(recorded_names(ctx, &*cp))));
    found
}

/// When to look again: a refused owner within the poll interval, since what would lift the
/// refusal (an adopt annotation on an apply without our labels, which routes no event to us)
/// does not wake it.
pub fn recheck(
    ctx: &Context,
    recheck: Option<std::time::Duration>,
    refusal: Option<&Refusal>,
) -> Option<std::time::Duration> {
    match refusal {
        Some(_) => Some(recheck.map_or(ctx.settings.poll_interval, |d| {
            d.min(ctx.settings.poll_interval)
        })),
        None => recheck,
    }
}

/// Adds the condition of `refusal` (status False) to a status fragment's conditions, its
/// transition time carried over from the owner's live condition of that type.
pub fn add_refusal<O: ApplyOwner>(fragment: &mut Value, owner: &O, refusal: &Refusal) {
    let builder = ConditionBuilder::new(
        owner.conditions(),
        owner.meta().generation,
        Timestamp::now(),
    );
    let condition = builder.build(
        refusal.condition,
        Status::False,
        refusal.reason,
        &refusal.message,
    );
    let list = &mut fragment["status"]["conditions"];
    if !list.is_array() {
        *list = json!([]);
    }
    if let (Some(items), Value::Array(new)) =
        (list.as_array_mut(), conditions::to_json(&[condition]))
    {
        items.extend(new);
    }
}

/// A Warning Event when the status about to be published newly says that a person must act
/// (a True condition with reason `WorkspaceNeedsOperator` the live status does not have):
/// the condition is the record, the Event is where `kubectl get events` and `kubectl
/// describe` show it, with what to do.
pub async fn warn_if_needing_operator<O: ApplyOwner>(ctx: &Context, owner: &O, fragment: &Value) {
    let needs = crate::status::conditions::reason::WORKSPACE_NEEDS_OPERATOR;
    let conditions = fragment["status"]["conditions"].as_array();
    let Some(wanted) = conditions
        .into_iter()
        .flatten()
        .find(|c| c["status"] == "True" && c["reason"] == needs)
    else {
        return;
    };
    let already = owner
        .conditions()
        .iter()
        .any(|c| c.type_ == wanted["type"] && c.status == "True" && c.reason == needs);
    if !already {
        let note = wanted["message"].as_str().unwrap_or_default().to_owned();
        ctx.warn(owner, needs, "Reconcile", note).await;
    }
}

/// `Some(plan)` when the owner is paused: its `Paused` condition published at `now`, nothing
/// else.
pub fn hold_if_paused<O: ApplyOwner>(
    owner: &O,
    cluster: Option<&Cluster>,
    now: Timestamp,
) -> Option<Plan> {
    let why = pause::paused(cluster, owner)?;
    let conditions = owner.conditions();
    Some(pause::hold(
        owner,
        O::MANAGER,
        O::CONDITION_TYPES,
        conditions,
        why,
        now,
    ))
}

/// What the deletion of `owner` is: its description (with its apply, if any) and the facts
/// every owner shares. Facts of one kind only (`endpoint_owned`, `control_plane_present`,
/// `retain`) start `false`; the reconciler sets them.
pub fn deletion_of<O: ApplyOwner>(
    ctx: &Context,
    owner: &O,
    cluster: Option<Cluster>,
) -> (Deletion, DeletionFacts) {
    let shared::ApplyFacts {
        apply,
        workspace_present,
        workspace_problem,
        refused,
    } = shared::apply_facts(ctx, owner, &owner.apply_name());
    let facts = DeletionFacts {
        endpoint_owned: false,
        control_plane_present: false,
        apply_present: apply.is_some(),
        apply_deleting: apply
            .as_ref()
            .is_some_and(|a| a.meta().deletion_timestamp.is_some()),
        workspace_present,
        workspace_problem,
        retain: false,
        started: shared::deletion_started(owner),
        now: Timestamp::now(),
        stuck_after: ctx.settings.stuck_deletion_after,
    };
    let d = Deletion {
        finalizer: O::FINALIZER,
        manager: O::MANAGER,
        own_types: O::CONDITION_TYPES,
        existing: owner.conditions().to_vec(),
        apply,
        refused,
        cluster,
        poll: ctx.settings.poll_interval,
    };
    (d, facts)
}

/// True when the owner still carries our finalizer: its deletion is ours to carry out.
pub fn ours_to_delete<O: ApplyOwner>(owner: &O) -> bool {
    owner.finalizers().iter().any(|f| f == O::FINALIZER)
}
