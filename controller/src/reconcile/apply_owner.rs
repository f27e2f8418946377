//! What a CAPTCluster and a CAPTControlPlane both are to the controller, as rules: the owner
//! of one WorkspaceTemplateApply (named, specified, recorded in
//! `spec.workspaceTemplateApplyName`), with a finalizer, a status field manager and its
//! conditions. Pure: what the owner's apply is to be, which names reach Terraform, what a
//! refusal publishes and when a refused owner looks again are decided here from what was
//! observed; the reconcilers' executor writes it.

use super::claims::{ADOPTED_ANNOTATION, claim_of, cluster_name};
use super::deletion::Deletion;
use super::pause;
use super::plan::contains;
use super::plan::{Object, Plan, SPEC_MANAGER, Step, Warning, Wrote};
use super::{OWNER_KIND_LABEL, OWNER_NAME_LABEL, OWNER_NAMESPACE_LABEL};
use crate::api::{Cluster, TerraformWorkspace, WorkspaceTemplateApply};
use crate::names;
use crate::render::{CLUSTER_NAME_LABEL, WATCH_FILTER_LABEL};
use crate::status::conditions::{self, ConditionBuilder, Status};
use crate::status::deletion::DeletionFacts;
use crate::tenancy::template_cross_namespace;
use crate::tenancy::{APPLY_NOT_OURS, APPLY_OWNED_CONDITION, ApplyClaim, Refusal};
use crate::write_loops::{Basis, Written};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::core::ApiResource;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

/// What the decision of an owner (a CAPTCluster, a CAPTControlPlane) reads of itself as the
/// owner of one apply, as cached when its reconcile began.
#[derive(Clone, Debug)]
pub struct OwnerSnapshot<O: ApplyOwner> {
    /// The owner.
    pub owner: Arc<O>,
    /// The Cluster its owner reference or label names, if it exists (proven by the
    /// decision).
    pub named_cluster: Option<Arc<Cluster>>,
    /// Its apply ([`ApplyOwner::apply_name`]), if it exists.
    pub apply: Option<Arc<WorkspaceTemplateApply>>,
    /// The Workspaces under the names its apply's Workspace may have.
    pub workspaces: Vec<Arc<TerraformWorkspace>>,
    /// The `CLUSTER_NAME`s the applies of the named Cluster's CAPTCluster and control plane
    /// recorded.
    pub siblings: Vec<String>,
    /// Its deletion, when it is being deleted and our finalizer is on it.
    pub deletion: Option<(Deletion, DeletionFacts)>,
    /// The namespaces whose templates any namespace may use.
    pub allowed_template_namespaces: Arc<BTreeSet<String>>,
    /// How often a refused owner looks again, at most.
    pub poll_interval: Duration,
}

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

/// What a reconcile writes for the owner's apply, in that order: the apply (created, or
/// changed back to what the owner wants), then its name recorded in the owner's spec. Each
/// is there only when what was observed differs.
#[derive(Clone, Debug, PartialEq)]
pub struct ApplyWrites {
    /// The apply written, if it needs to be.
    pub apply: Option<Step>,
    /// `spec.workspaceTemplateApplyName` recorded, if it is not yet.
    pub record: Option<Step>,
}

/// What the owner's apply write does: the action of a failure, and the key of its answer.
pub const APPLYING: &str = "applying its WorkspaceTemplateApply";
/// What the owner's recording of its apply's name does.
pub const RECORDING: &str = "recording its WorkspaceTemplateApply name";

/// The writes that make the owner's apply what it should be, from what was observed: the
/// owner, the Cluster that names it (`cluster`), its apply as cached (`existing`, at
/// [`ApplyOwner::apply_name`]), the `CLUSTER_NAME`s its Cluster's applies recorded
/// (`siblings`, [`platform_names`]) and the namespaces whose templates anyone may use.
///
/// Nothing is created, changed or recorded when the owner's template reference leaves its
/// namespace (unless allowed), the name its Cluster would get is one EKS refuses, or the
/// existing apply is not provably its own: `Err(refusal)`. An existing apply whose spec and
/// labels are what the owner wants is not written again (a write that changes nothing still
/// costs one on every reconcile).
pub fn apply_writes<O: ApplyOwner>(
    owner: &O,
    cluster: &Cluster,
    existing: Option<&WorkspaceTemplateApply>,
    siblings: &[String],
    allowed_template_namespaces: &BTreeSet<String>,
) -> Result<ApplyWrites, Refusal> {
    let own = owner.namespace().unwrap_or_default();
    let (field, namespace) = owner.template_namespace();
    if let Some(crossing) =
        template_cross_namespace(&own, field, namespace, allowed_template_namespaces)
    {
        return Err(Refusal::cross_namespace(&crossing, &own));
    }
    let mut spec = owner.apply_spec();
    let recorded = existing.and_then(|a| recorded_names(owner, a));
    platform_names(
        owner,
        cluster,
        recorded.as_ref(),
        siblings,
        &mut spec["variables"],
    )?;
    let name = owner.apply_name();
    let adopted = adoption(owner, existing, &name)?;
    let body = desired_apply(owner, &name, spec, existing, adopted);
    let unchanged = existing.is_some_and(|existing| {
        let live = serde_json::to_value(existing).unwrap_or_default();
        let spec_matches = adopted || live.get("spec") == body.get("spec");
        spec_matches && contains(&live["metadata"], &body["metadata"])
    });
    let apply = (!unchanged).then(|| {
        // The apply is a function of its owner (spec, Cluster) and of whether it was adopted.
        let observed = (&name, cluster_name(owner), adopted);
        Step::Apply {
            object: Object {
                resource: ApiResource::erase::<WorkspaceTemplateApply>(&()),
                namespace: Some(own.clone()),
                name: name.clone(),
                uid: None,
            },
            manager: SPEC_MANAGER,
            force: true,
            body,
            doing: APPLYING,
            wrote: Some(Wrote {
                written: Written::of::<WorkspaceTemplateApply>(
                    Some(&own),
                    &name,
                    SPEC_MANAGER,
                    None,
                ),
                basis: Basis::of(owner.meta().generation, &observed),
                regarding: owner.object_ref(&()),
            }),
        }
    });
    let record = (owner.recorded_apply_name() != Some(name.as_str())).then(|| {
        let object = Object::of(owner);
        let body = object.fields(json!({"spec": {"workspaceTemplateApplyName": name}}));
        Step::Apply {
            object,
            manager: SPEC_MANAGER,
            force: false,
            body,
            doing: RECORDING,
            wrote: None,
        }
    });
    Ok(ApplyWrites { apply, record })
}

/// Sets the name keys of the owner's apply variables (`crate::names`): `CLUSTER_NAME` to
/// `<namespace>_<cluster>`, and `VPC_NAME`, when set, to `<namespace>_<vpc>`, unless the
/// owner's apply exists and recorded the bare name (`recorded`: an apply rendered before
/// names carried their namespace keeps its name), or, with no apply yet, another apply of
/// its Cluster recorded the bare Cluster name (`siblings`). `Err` when the Cluster's new
/// name is one EKS refuses: `ClusterNameValid=False`, and no apply.
pub fn platform_names<O: ApplyOwner>(
    owner: &O,
    cluster: &Cluster,
    recorded: Option<&BTreeMap<String, String>>,
    siblings: &[String],
    variables: &mut Value,
) -> Result<(), Refusal> {
    let ns = owner.namespace().unwrap_or_default();
    let recorded = |key: &str| recorded.and_then(|v| v.get(key)).map(String::as_str);
    let bare = cluster.name_any();
    let name = names::cluster_name(&ns, &bare, recorded(names::CLUSTER_NAME), siblings).map_err(
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

/// The variables `apply` recorded, when it is provably `owner`'s.
pub fn recorded_names<O: Resource<DynamicType = ()>>(
    owner: &O,
    apply: &WorkspaceTemplateApply,
) -> Option<BTreeMap<String, String>> {
    let ours = matches!(claim_of(owner, apply), ApplyClaim::Ours);
    ours.then(|| apply.spec.variables.clone()).flatten()
}

/// Whether the existing apply named `name`, if any, is one `owner` adopted (its spec is then
/// the user's), or why it is not `owner`'s to use.
fn adoption<K: Resource<DynamicType = ()>>(
    owner: &K,
    existing: Option<&WorkspaceTemplateApply>,
    name: &str,
) -> Result<bool, Refusal> {
    let Some(existing) = existing else {
        return Ok(false);
    };
    match claim_of(owner, existing) {
        ApplyClaim::NotOurs(why) => Err(Refusal {
            condition: APPLY_OWNED_CONDITION,
            reason: APPLY_NOT_OURS,
            message: format!(
                "WorkspaceTemplateApply {}/{name} exists and is not this {}'s: {why}",
                owner.namespace().unwrap_or_default(),
                K::kind(&())
            ),
        }),
        ApplyClaim::Adoptable => Ok(true),
        ApplyClaim::Ours => Ok(existing.annotations().contains_key(ADOPTED_ANNOTATION)),
    }
}

/// The WorkspaceTemplateApply `owner` wants: its owner labels (and its Cluster's and
/// shard's), and either the wanted spec or, adopted, the adoption's annotation on the
/// existing apply's uid.
fn desired_apply<K: Resource<DynamicType = ()>>(
    owner: &K,
    name: &str,
    spec: Value,
    existing: Option<&WorkspaceTemplateApply>,
    adopted: bool,
) -> Value {
    let ns = owner.namespace().unwrap_or_default();
    let mut labels = json!({
        OWNER_KIND_LABEL: K::kind(&()), OWNER_NAME_LABEL: owner.name_any(), OWNER_NAMESPACE_LABEL: ns,
    });
    if let Some(cluster) = cluster_name(owner) {
        labels[CLUSTER_NAME_LABEL] = json!(cluster);
    }
    // The owner's shard (`--watch-filter`): its apply must be watched by the same controller.
    if let Some(shard) = owner.labels().get(WATCH_FILTER_LABEL) {
        labels[WATCH_FILTER_LABEL] = json!(shard);
    }
    // No owner reference: the garbage collector would delete the apply as soon as its owner
    // is deleted, racing the deletion order (the control plane before the VPC). The owner's
    // finalizer deletes it instead, in order; the labels map events back to the owner.
    let mut body = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
    });
    if adopted {
        body["metadata"]["annotations"] = json!({ADOPTED_ANNOTATION: "true"});
        body["metadata"]["uid"] = json!(existing.and_then(|a| a.uid()));
    } else {
        body["spec"] = spec;
    }
    body
}

/// When to look again: a refused owner within the poll interval, since what would lift the
/// refusal (an adopt annotation on an apply without our labels, which routes no event to us)
/// does not wake it.
pub fn recheck(
    poll_interval: Duration,
    recheck: Option<Duration>,
    refusal: Option<&Refusal>,
) -> Option<Duration> {
    match refusal {
        Some(_) => Some(recheck.map_or(poll_interval, |d| d.min(poll_interval))),
        None => recheck,
    }
}

/// Adds the condition of `refusal` (status False) to a status fragment's conditions, its
/// transition time carried over from the owner's live condition of that type (else `now`).
pub fn add_refusal<O: ApplyOwner>(
    fragment: &mut Value,
    owner: &O,
    refusal: &Refusal,
    now: Timestamp,
) {
    let builder = ConditionBuilder::new(owner.conditions(), owner.meta().generation, now);
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
pub fn needing_operator<O: ApplyOwner>(owner: &O, fragment: &Value) -> Option<Warning> {
    let needs = conditions::reason::WORKSPACE_NEEDS_OPERATOR;
    let conditions = fragment["status"]["conditions"].as_array();
    let wanted = conditions
        .into_iter()
        .flatten()
        .find(|c| c["status"] == "True" && c["reason"] == needs)?;
    let already = owner
        .conditions()
        .iter()
        .any(|c| c.type_ == wanted["type"] && c.status == "True" && c.reason == needs);
    let note = wanted["message"].as_str().unwrap_or_default().to_owned();
    (!already).then(|| Warning::about(owner, needs, "Reconcile", note))
}

/// When `obj` was created; `now` for an object not stored yet (a timeout then starts now).
pub fn created<K: Resource>(obj: &K, now: Timestamp) -> Timestamp {
    (obj.meta().creation_timestamp.as_ref()).map_or(now, |t| t.0)
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
