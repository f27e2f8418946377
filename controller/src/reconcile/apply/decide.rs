//! The apply's decision: from what was observed ([`Snapshot`]), the clock and what this
//! reconcile's steps answered so far, the plan. Pure.

use super::super::claims::Located;
use super::super::pause;
use super::super::plan::contains;
use super::super::plan::{
    self, ADDING_FINALIZER, Next, Object, Plan, Progress, SPEC_MANAGER, Step, Warning, Wrote,
};
use crate::api::{Cluster, TerraformWorkspace, WorkspaceTemplate, WorkspaceTemplateApply};
use crate::names;
use crate::publish::Publication;
use crate::render::{
    APPLY_GENERATION_ANNOTATION, FIRST_RENDERING, INPUTS_ANNOTATION, RENDERING,
    RENDERING_ANNOTATION, RenderError, render_workspace,
};
use crate::tenancy::{
    Placement, Refusal, WORKSPACE_OWNED_BY_ANOTHER, WORKSPACE_OWNED_CONDITION,
    apply_cross_namespace, rendered_cross_namespace, untrusted_template,
};
use crate::workspace_policy::WorkspacePolicy;
use crate::write_loops::{Basis, Written};
use jiff::Timestamp;
use kube::core::ApiResource;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// What checking the Secrets an apply waits for is: a failure's action, and the key of its
/// answer.
pub const CHECKING_SECRETS: &str = "checking a Secret it waits for";
/// What applying its rendered Workspace is: a failure's action.
pub const APPLYING_WORKSPACE: &str = "applying its Workspace";
/// What recording a v0.1.0 Workspace's inputs is: a failure's action.
pub const RECORDING_INPUTS: &str = "recording its Workspace's inputs";
/// What deleting its Workspace is: a failure's action.
pub const DELETING_WORKSPACE: &str = "deleting its Workspace";
/// What reading its Workspace live, before its finalizer comes off, is: a failure's action,
/// and the key of its answer.
pub const LOOKING_FOR_WORKSPACE: &str = "looking for its Workspace";

/// What an apply's decision reads, as cached when its reconcile began.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The apply.
    pub apply: Arc<WorkspaceTemplateApply>,
    /// The Cluster it belongs to (its label), if cached: paused with it.
    pub cluster: Option<Arc<Cluster>>,
    /// Its Workspace, as found under the names it may have.
    pub located: Located,
    /// The WorkspaceTemplate its `templateRef` names, if cached.
    pub template: Option<Arc<WorkspaceTemplate>>,
    /// Each Workspace its `waitForWorkspaces` names, in order, with whether it is Ready and
    /// rendered for an apply of its namespace (another namespace's counts as not there).
    pub waited_workspaces: Vec<(String, bool)>,
    /// Every cached apply, when its name keys hold a bare name (else none: only a bare name
    /// is checked against the others).
    pub applies: Vec<Arc<WorkspaceTemplateApply>>,
    /// The namespaces whose templates any namespace may use.
    pub allowed_template_namespaces: Arc<BTreeSet<String>>,
    /// What a rendered Workspace may ask of the provider.
    pub workspace_policy: Arc<WorkspacePolicy>,
    /// How often to look again while waiting for what no watch wakes it for.
    pub poll_interval: Duration,
}

/// The apply's plan. A paused one (its Cluster, or its own annotation) is left as it is:
/// no Workspace change, no finalizer change, and its status, which only mirrors the
/// Workspace, stays. A deleting one takes its deletion's next step ([`deletion`]).
/// Otherwise our finalizer first (the plan asks to decide again, from the apply it
/// answers); then, each ending the plan with `Applied=False` published (a refusal's
/// condition and a Warning Event when new): a spec refused for itself, a name of another's,
/// a Workspace name another holds; then what it waits for (its Secrets asked of the API
/// server as one step, a few at a time, then its Workspaces); then its template, rendered
/// and checked; last the Workspace applied when it lacks what was rendered (or a v0.1.0
/// Workspace's inputs recorded), and the status.
pub fn decide(seen: &Snapshot, progress: &Progress, now: Timestamp) -> Result<Plan, RenderError> {
    let finalized = progress.answer::<WorkspaceTemplateApply>(ADDING_FINALIZER);
    let apply = finalized.as_ref().unwrap_or(&seen.apply);
    if pause::paused(seen.cluster.as_deref(), apply).is_some() {
        return Ok(Plan::nothing());
    }
    if apply.meta().deletion_timestamp.is_some() {
        return Ok(deletion(seen, apply, progress));
    }
    if !has_finalizer(apply) {
        let finalizer = plan::add_finalizer(apply, APPLY_FINALIZER);
        return Ok(Plan::nothing().then(finalizer).next(Next::Redecide));
    }
    let namespace = apply.namespace().unwrap_or_default();
    let located = &seen.located;
    let own = located.own();
    let own_name = own.map(|_| located.placement.name()).unwrap_or_default();
    let refusal = spec_refusal(apply, &seen.allowed_template_namespaces, &namespace)
        .or_else(|| name_refusal(apply, seen, own));
    if let Some(refusal) = refusal {
        return Ok(refuse(apply, own_name, own, refusal, now));
    }
    let name = match &located.placement {
        Placement::Use { name, .. } => name.clone(),
        Placement::Taken { name, owner } => {
            let refused = refuse(apply, "", None, taken(name, owner), now);
            // Not woken by another's Workspace: look again for it to go.
            return Ok(refused.next(Next::After(seen.poll_interval)));
        }
    };
    let waiting = |blocked: Refusal| {
        Plan::nothing()
            .publish(status(apply, &name, own, false, Some(blocked), now))
            .next(Next::After(seen.poll_interval))
    };
    let secrets = waited_secrets(apply);
    match progress.checked(CHECKING_SECRETS) {
        None if !secrets.is_empty() => {
            let check = Step::CheckSecrets {
                secrets,
                doing: CHECKING_SECRETS,
            };
            return Ok(Plan::nothing().then(check).next(Next::Redecide));
        }
        Some(Some((secret_namespace, secret))) => {
            let message = format!("Secret {secret_namespace}/{secret} does not exist yet");
            return Ok(waiting(blocked("WaitingForSecrets", message)));
        }
        _ => {}
    }
    if let Some((workspace, _)) = seen.waited_workspaces.iter().find(|(_, ready)| !ready) {
        let message =
            format!("Workspace {workspace} of an apply of namespace {namespace} is not ready yet");
        return Ok(waiting(blocked("WaitingForWorkspaces", message)));
    }
    let template_ref = &apply.spec.template_ref;
    let template_ns = template_ref.namespace.as_deref().unwrap_or(&namespace);
    let Some(template) = seen.template.as_deref() else {
        let message = format!(
            "WorkspaceTemplate {template_ns}/{} not found",
            template_ref.name
        );
        return Ok(waiting(blocked("TemplateNotFound", message)));
    };
    let policy = &seen.workspace_policy;
    let rendered = match render_checked(apply, policy, template, template_ns, &name)? {
        Ok(rendered) => rendered,
        Err(refusal) => return Ok(refuse(apply, own_name, own, refusal, now)),
    };
    let changed = needs_apply(own, &rendered);
    let mut plan = Plan::nothing();
    if changed {
        plan = plan.then(write_workspace(apply, own, rendered, template, &name));
    } else if let Some(live) = own.filter(|w| !w.annotations().contains_key(INPUTS_ANNOTATION)) {
        plan = plan.then(record_inputs(apply, live, &rendered, &name));
    }
    Ok(plan.publish(status(apply, &name, own, changed, None, now)))
}

/// True when our finalizer is on the apply.
fn has_finalizer(apply: &WorkspaceTemplateApply) -> bool {
    apply.finalizers().iter().any(|f| f == APPLY_FINALIZER)
}

/// The Secrets the apply waits for (namespace, name), in its order.
fn waited_secrets(apply: &WorkspaceTemplateApply) -> Vec<(String, String)> {
    let secrets = apply.spec.wait_for_secrets.iter().flatten();
    secrets
        .map(|s| (s.namespace.clone(), s.name.clone()))
        .collect()
}

/// The deletion's next step. Our finalizer stays until the apply's Workspace is gone: its
/// own Workspace is deleted (only the one observed: a uid precondition), and waited for; one
/// not in the cache is looked for live first (one rendered just before the deletion may not
/// be cached yet, and taking the finalizer off then would orphan it and its cloud
/// resources). Another's Workspace under its name is never deleted (a Warning says so each
/// time). `spec.retainWorkspaceOnDelete` is the tenant's, so it is not honoured: a Workspace
/// left behind would keep running on the platform's credentials, seen by no one.
fn deletion(seen: &Snapshot, apply: &WorkspaceTemplateApply, progress: &Progress) -> Plan {
    if !has_finalizer(apply) {
        return Plan::nothing();
    }
    let poll = Next::After(seen.poll_interval);
    let mut plan = Plan::nothing();
    match (&seen.located.placement, &seen.located.workspace) {
        (Placement::Taken { name, owner }, _) => {
            let note = format!("Workspace {name} belongs to another ({owner}); not deleted");
            let warning = Warning::about(apply, WORKSPACE_OWNED_BY_ANOTHER, "Delete", note);
            plan = plan.then(Step::Warn(warning));
        }
        (Placement::Use { .. }, Some(ws)) => {
            if ws.meta().deletion_timestamp.is_none() {
                let delete = Step::Delete {
                    object: Object::of(ws),
                    doing: DELETING_WORKSPACE,
                };
                plan = plan.then(delete);
            }
            return plan.next(poll);
        }
        (Placement::Use { name, .. }, None) => {
            match progress.read::<TerraformWorkspace>(LOOKING_FOR_WORKSPACE, name) {
                None => {
                    let read = Step::Read {
                        object: workspace_object(name, None),
                        doing: LOOKING_FOR_WORKSPACE,
                    };
                    return plan.then(read).next(Next::Redecide);
                }
                Some(live) if live.as_ref().is_some_and(|ws| is_ours(apply, ws)) => {
                    return plan.next(poll);
                }
                Some(_) => {}
            }
        }
    }
    let object = Object::of(apply);
    let started = apply.meta().deletion_timestamp.as_ref().map(|t| t.0);
    plan.then(Step::RemoveFinalizer {
        object: object.clone(),
        finalizer: APPLY_FINALIZER,
    })
    .then(Step::Deleted { object, started })
}

/// True when `ws`'s owner labels name this apply (its namespace, name and uid).
fn is_ours(apply: &WorkspaceTemplateApply, ws: &TerraformWorkspace) -> bool {
    crate::tenancy::workspace_owner(
        &apply.namespace().unwrap_or_default(),
        &apply.name_any(),
        apply.uid().as_deref(),
        ws.labels(),
    ) == crate::tenancy::WorkspaceOwner::Ours
}

/// The rendered Workspace applied (forced, [`SPEC_MANAGER`]), onto the Workspace observed as
/// ours, never one that replaced it meanwhile (its uid a precondition).
fn write_workspace(
    apply: &WorkspaceTemplateApply,
    own: Option<&TerraformWorkspace>,
    mut rendered: Value,
    template: &WorkspaceTemplate,
    name: &str,
) -> Step {
    let uid = own.and_then(|w| w.uid());
    if let Some(uid) = &uid {
        rendered["metadata"]["uid"] = json!(uid);
    }
    // The render is a function of the apply (spec, labels, uid), the template and the
    // name in use: the same ones rendered again and again is a loop.
    let observed = (
        apply.labels(),
        apply.uid(),
        template.meta().resource_version.as_deref(),
        name,
    );
    Step::Apply {
        object: workspace_object(name, uid),
        manager: SPEC_MANAGER,
        force: true,
        body: rendered,
        doing: APPLYING_WORKSPACE,
        wrote: Some(Wrote {
            written: Written::of::<TerraformWorkspace>(None, name, SPEC_MANAGER, None),
            basis: Basis::of(apply.meta().generation, &observed),
            regarding: apply.object_ref(&()),
        }),
    }
}

/// Records on a Workspace of v0.1.0, kept as it is ([`needs_apply`]), the inputs it renders
/// (those of now: its apply's generation is the one it records) and its rendering
/// ([`FIRST_RENDERING`]), so that a later change of its template reaches it. Its annotations
/// only, under a field manager of its own: its spec, and with it its generation, stays (no
/// Terraform run), and the fields CAPT's apply owns stay CAPT's. Onto the Workspace
/// observed, never one that replaced it meanwhile (a uid mismatch is a conflict).
fn record_inputs(
    apply: &WorkspaceTemplateApply,
    live: &TerraformWorkspace,
    rendered: &Value,
    name: &str,
) -> Step {
    let inputs = &rendered["metadata"]["annotations"][INPUTS_ANNOTATION];
    let patch = json!({"metadata": {"uid": live.uid(), "annotations": {
        INPUTS_ANNOTATION: inputs, RENDERING_ANNOTATION: FIRST_RENDERING.to_string()}}});
    Step::Merge {
        object: workspace_object(name, live.uid()),
        manager: INPUTS_MANAGER,
        patch,
        doing: RECORDING_INPUTS,
        wrote: Wrote {
            written: Written::of::<TerraformWorkspace>(None, name, INPUTS_MANAGER, None),
            basis: Basis::of(apply.meta().generation, &(name, inputs.as_str())),
            regarding: apply.object_ref(&()),
        },
    }
}

/// The Workspace `name` (cluster-scoped), with the uid it was observed with.
fn workspace_object(name: &str, uid: Option<String>) -> Object {
    Object {
        resource: ApiResource::erase::<TerraformWorkspace>(&()),
        namespace: None,
        name: name.to_owned(),
        uid,
    }
}

/// Leaves the Workspace alone and says why: the refusal's condition (and `Applied=False`),
/// and a Warning Event when the condition is new. `name` is the apply's own Workspace's, `""`
/// when it has none (another's Workspace is never named as its). Waits for the apply to
/// change.
fn refuse(
    apply: &WorkspaceTemplateApply,
    name: &str,
    own: Option<&TerraformWorkspace>,
    refusal: Refusal,
    now: Timestamp,
) -> Plan {
    let reported = apply
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|list| {
            list.iter().any(|c| {
                c.type_ == refusal.condition && c.status == "False" && c.message == refusal.message
            })
        });
    let mut plan = Plan::nothing();
    if !reported {
        let note = refusal.message.clone();
        plan = plan.then(Step::Warn(Warning::about(
            apply,
            refusal.reason,
            "Render",
            note,
        )));
    }
    plan.publish(status(apply, name, own, false, Some(refusal), now))
}

/// The apply's own name, namespace, creation and variables, as the name rules see them.
fn holder(a: &WorkspaceTemplateApply) -> names::Holder<'_> {
    names::Holder {
        namespace: a.metadata.namespace.as_deref().unwrap_or_default(),
        name: a.metadata.name.as_deref().unwrap_or_default(),
        created: a.metadata.creation_timestamp.as_ref().map(|t| t.0),
        variables: a.spec.variables.as_ref(),
    }
}

/// True when the apply's name keys hold a bare name (no namespace): only then are the other
/// applies read ([`name_refusal`]), which CAPT itself gives only to the applies it rendered
/// before names carried their namespace.
pub fn holds_a_bare_name(apply: &WorkspaceTemplateApply) -> bool {
    names::holds_a_bare_name(&holder(apply))
}

/// Finalizer kept on an apply until its Workspace is gone.
pub const APPLY_FINALIZER: &str = "infrastructure.cluster.x-k8s.io/workspacetemplateapply";
/// Field manager of WorkspaceTemplateApply status.
pub const MANAGER: &str = "capt-workspacetemplateapply";
/// Field manager of the inputs recorded on a Workspace of v0.1.0 ([`record_inputs`]).
pub const INPUTS_MANAGER: &str = "capt-workspace-inputs";
/// Condition type on an apply: False while something blocks rendering.
pub const APPLIED_CONDITION: &str = "Applied";

/// The refusal of a Workspace name another holds: its Workspace is neither applied to nor
/// deleted.
fn taken(name: &str, owner: &str) -> Refusal {
    Refusal {
        condition: WORKSPACE_OWNED_CONDITION,
        reason: WORKSPACE_OWNED_BY_ANOTHER,
        message: format!(
            "Workspace {name} belongs to another ({owner}); it is neither applied to nor deleted"
        ),
    }
}

/// Why the apply's own spec must not be rendered, if it must not: a reference to another
/// namespace (templates from an allowed one excepted), a template of a namespace the operator
/// does not trust with code (the apply's own included), or a variable refused for itself (its
/// key's shape, its value's size: `crate::variables`).
fn spec_refusal(
    apply: &WorkspaceTemplateApply,
    allowed: &BTreeSet<String>,
    namespace: &str,
) -> Option<Refusal> {
    if let Some(crossing) = apply_cross_namespace(apply, allowed) {
        return Some(Refusal::cross_namespace(&crossing, namespace));
    }
    let template_ref = &apply.spec.template_ref;
    let template_ns = template_ref.namespace.as_deref().unwrap_or(namespace);
    if let Some(refusal) = untrusted_template(template_ns, &template_ref.name, allowed) {
        return Some(refusal);
    }
    if apply.spec.retain_workspace_on_delete == Some(true) {
        let message = "spec.retainWorkspaceOnDelete is not a tenant's to set: the Workspace \
                       would outlive the apply, running on the platform's credentials with no \
                       one to see or destroy it; nothing is rendered (a VPC is kept by the \
                       CAPTCluster's spec.retainVpcOnDelete)";
        return Some(blocked(
            crate::workspace_policy::NOT_ALLOWED,
            message.to_owned(),
        ));
    }
    if let Some(message) = over_bounds(apply) {
        return Some(blocked(OVER_BOUNDS, message));
    }
    crate::variables::first_unsafe(apply.spec.variables.as_ref())
        .map(|message| blocked(crate::variables::UNSAFE_VARIABLE, message))
}

/// Why the apply's name keys (`CLUSTER_NAME`, `VPC_NAME`) must not reach Terraform, if they
/// must not: a name of another namespace (`crate::names::refusal`), among the applies the
/// controller sees (its namespace or shard, when it has one). An apply whose own Workspace
/// renders its current spec already (it records the apply's generation) is not checked:
/// nothing new would reach Terraform, and an upgrade refuses nothing that runs.
fn name_refusal(
    apply: &WorkspaceTemplateApply,
    seen: &Snapshot,
    own: Option<&TerraformWorkspace>,
) -> Option<Refusal> {
    use crate::names;
    let generation = apply.meta().generation.map(|g| g.to_string());
    let rendered = own
        .is_some_and(|w| w.annotations().get(APPLY_GENERATION_ANNOTATION) == generation.as_ref());
    if rendered {
        return None;
    }
    let me = holder(apply);
    let policy = &seen.workspace_policy;
    let shares = |other: &str| policy.share_a_provider_config(me.namespace, other);
    let others = seen.applies.iter().map(|a| holder(a));
    names::refusal(&me, others, shares)
        .map(|message| blocked(names::PLATFORM_NAME_OF_ANOTHER, message))
}

/// Condition reason (and Warning Event reason) of an apply with a list over its CRD bound:
/// one stored before the bound existed (the API server refuses a new one).
pub const OVER_BOUNDS: &str = "OverBounds";

/// Why the apply's lists are too long to act on, if they are: an apply stored before the CRD
/// bounded them keeps them (ratcheting), and each entry would cost a read.
fn over_bounds(apply: &WorkspaceTemplateApply) -> Option<String> {
    use crate::api::bounds::MAX_WAITS;
    let secrets = apply.spec.wait_for_secrets.as_ref().map_or(0, Vec::len);
    let workspaces = apply.spec.wait_for_workspaces.as_ref().map_or(0, Vec::len);
    [
        ("spec.waitForSecrets", secrets),
        ("spec.waitForWorkspaces", workspaces),
    ]
    .into_iter()
    .find(|(_, n)| *n > MAX_WAITS)
    .map(|(field, n)| {
        format!("{field} has {n} entries, over the limit of {MAX_WAITS}; nothing is rendered")
    })
}

/// The Workspace `template` renders for the apply under `name`, or why it must not be
/// rendered: a template over the size limit, a key of the apply's outside the variables'
/// values or not named by the template (`crate::variables`), a rendered
/// reference to another namespace (what the template brings stays in the apply's namespace
/// too), or what the operator's workspace policy forbids (the credentials, the state and
/// where outputs go are the operator's, not the template's).
fn render_checked(
    apply: &WorkspaceTemplateApply,
    policy: &WorkspacePolicy,
    template: &WorkspaceTemplate,
    template_ns: &str,
    name: &str,
) -> Result<Result<Value, Refusal>, RenderError> {
    let namespace = apply.namespace().unwrap_or_default();
    let template_name = format!("{template_ns}/{}", apply.spec.template_ref.name);
    if let Some(size) = template
        .annotations()
        .get(crate::render::TOO_LARGE_ANNOTATION)
    {
        let message = format!(
            "WorkspaceTemplate {template_name} is {size} bytes, over the limit of {} bytes; \
             nothing is rendered",
            crate::render::MAX_TEMPLATE_BYTES
        );
        return Ok(Err(blocked("TemplateTooLarge", message)));
    }
    if let Some((reason, message)) = crate::render::variables_refusal(apply, template) {
        return Ok(Err(blocked(reason, message)));
    }
    let rendered = render_workspace(apply, template, name)?;
    if let Some(crossing) = rendered_cross_namespace(&namespace, &rendered["spec"]) {
        return Ok(Err(Refusal::cross_namespace(&crossing, &namespace)));
    }
    if let Some(message) = policy.refusal(&namespace, &rendered) {
        return Ok(Err(blocked(crate::workspace_policy::NOT_ALLOWED, message)));
    }
    Ok(Ok(rendered))
}

/// `Applied=False` with `reason`: rendering waits for something.
fn blocked(reason: &'static str, message: String) -> Refusal {
    Refusal {
        condition: APPLIED_CONDITION,
        reason,
        message,
    }
}

/// Whether the rendered Workspace is written: always when there is none; never onto a
/// Workspace an earlier [`RENDERING`] rendered from the inputs it still has (the apply's
/// generation and [`inputs_digest`](crate::render::inputs_digest) it records), so that a new
/// rendering reaches an existing Workspace only with a real change of its inputs, not with an
/// upgrade; otherwise when the live Workspace, as cached (its module as a digest:
/// `crate::watches::Watched::trim`), lacks what was rendered: a change of the inputs, or
/// another writer's change of a field CAPT renders (put back). A Workspace of v0.1.0 records
/// no inputs digest: its apply's generation is all it proves. Fields the API server defaulted
/// (`managementPolicies`, `providerConfigRef`, `deletionPolicy`, ...) are not ours and are
/// not compared.
fn needs_apply(live: Option<&TerraformWorkspace>, rendered: &Value) -> bool {
    let Some(live) = live else { return true };
    let annotations = live.annotations();
    let recorded = |key: &str| annotations.get(key).map(String::as_str);
    let wanted = |key: &str| rendered["metadata"]["annotations"][key].as_str();
    let rendering = recorded(RENDERING_ANNOTATION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(FIRST_RENDERING);
    let same_generation =
        recorded(APPLY_GENERATION_ANNOTATION) == wanted(APPLY_GENERATION_ANNOTATION);
    let same_inputs =
        recorded(INPUTS_ANNOTATION).is_none_or(|digest| Some(digest) == wanted(INPUTS_ANNOTATION));
    if rendering < RENDERING && same_generation && same_inputs {
        return false;
    }
    let live = serde_json::to_value(live).unwrap_or_default();
    let mut rendered = rendered.clone();
    if let Some(module) = rendered["spec"]["forProvider"].get_mut("module")
        && let Some(text) = module.as_str()
    {
        *module = Value::String(crate::render::module_digest(text));
    }
    !["spec", "metadata"]
        .iter()
        .all(|k| contains(&live[*k], &rendered[*k]))
}

/// The apply's status, to publish: the Workspace's name (`""`: none), whether it was rendered,
/// and the Workspace's conditions mirrored (plus `Applied=False`, and the refusal's own
/// condition, while something blocks rendering).
fn status(
    apply: &WorkspaceTemplateApply,
    name: &str,
    workspace: Option<&TerraformWorkspace>,
    applied_now: bool,
    blocked: Option<Refusal>,
    now: Timestamp,
) -> Publication {
    let existing = apply.status.as_ref();
    let last_applied = if applied_now {
        Some(now.to_string())
    } else {
        existing
            .and_then(|s| s.last_applied_time.as_ref().map(|t| t.0.to_string()))
            .or_else(|| {
                workspace.and_then(|w| {
                    w.meta()
                        .creation_timestamp
                        .as_ref()
                        .map(|t| t.0.to_string())
                })
            })
    };
    let mut conditions: Vec<Value> = workspace.map(mirrored_conditions).unwrap_or_default();
    let blocked_by = blocked
        .as_ref()
        .map(|r| (r.condition, r.reason, r.message.clone()));
    if let Some(refusal) = blocked {
        let since = |type_: &str| {
            existing
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == type_ && c.status == "False"))
                .map(|c| c.last_transition_time.0.to_string())
                .unwrap_or_else(|| now.to_string())
        };
        let mut types = vec![APPLIED_CONDITION];
        if refusal.condition != APPLIED_CONDITION {
            types.push(refusal.condition);
        }
        for type_ in types {
            conditions.push(
                json!({"type": type_, "status": "False", "reason": refusal.reason,
                "message": refusal.message, "lastTransitionTime": since(type_)}),
            );
        }
    }
    // What the status mirrors, besides the apply itself: the Workspace's conditions and
    // creation, and what blocks rendering.
    let observed = (
        name,
        workspace.map(|w| (&w.meta().creation_timestamp, mirrored_conditions(w))),
        &blocked_by,
    );
    let name = (!name.is_empty()).then_some(name);
    let mut status = json!({"workspaceName": name, "applied": applied_now || workspace.is_some(), "conditions": conditions});
    if let Some(t) = last_applied {
        status["lastAppliedTime"] = json!(t);
    }
    Publication::status(apply, MANAGER, json!({"status": status})).observing(&observed)
}

/// The Workspace's `Synced` and `Ready` conditions, as `metav1.Condition`s.
fn mirrored_conditions(workspace: &TerraformWorkspace) -> Vec<Value> {
    let status = workspace.status_value();
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| matches!(c["type"].as_str(), Some("Synced" | "Ready")))
        .map(|c| {
            json!({
                "type": c["type"], "status": c["status"],
                "reason": c["reason"].as_str().filter(|r| !r.is_empty()).unwrap_or("Unknown"),
                "message": crate::status::workspace::without_error_blob(
                    c["message"].as_str().unwrap_or("")),
                "lastTransitionTime": c["lastTransitionTime"],
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
