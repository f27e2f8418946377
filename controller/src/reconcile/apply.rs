//! WorkspaceTemplateApply: renders its Workspace from the WorkspaceTemplate, mirrors the
//! Workspace's conditions (manager `capt-workspacetemplateapply`), and on deletion deletes
//! the Workspace (always: `retainWorkspaceOnDelete` is a tenant's, not honoured) and keeps its
//! finalizer until the Workspace is gone.
//!
//! Tenancy (`crate::tenancy`): only a template of a namespace the operator trusts with code is
//! rendered, every other reference stays in the apply's namespace, and a Workspace under its name that belongs to another is
//! never applied to nor deleted; each is reported as a condition and a Warning Event.

use super::shared::{Located, contains, locate_workspace};
use super::{Result, after, kube_err};
use crate::api::{TerraformWorkspace, WorkspaceTemplate, WorkspaceTemplateApply};
use crate::context::Context;
use crate::k8s::{SPEC_MANAGER, set_finalizer};
use crate::publish::Publication;
use crate::render::{
    APPLY_GENERATION_ANNOTATION, FIRST_RENDERING, INPUTS_ANNOTATION, RENDERING,
    RENDERING_ANNOTATION, render_workspace,
};
use crate::tenancy::{
    Placement, Refusal, WORKSPACE_OWNED_BY_ANOTHER, WORKSPACE_OWNED_CONDITION,
    apply_cross_namespace, rendered_cross_namespace, untrusted_template,
};
use crate::watches::cached;
use crate::write_loops::Basis;
use crate::write_loops::{ObjectId, Written};
use jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use std::sync::Arc;

/// Finalizer kept on an apply until its Workspace is gone.
pub const APPLY_FINALIZER: &str = "infrastructure.cluster.x-k8s.io/workspacetemplateapply";
/// Field manager of WorkspaceTemplateApply status.
pub const MANAGER: &str = "capt-workspacetemplateapply";
/// Field manager of the inputs recorded on a Workspace of v0.1.0 ([`record_inputs`]).
pub const INPUTS_MANAGER: &str = "capt-workspace-inputs";
/// Condition type on an apply: False while something blocks rendering.
pub const APPLIED_CONDITION: &str = "Applied";

/// Reconciles one WorkspaceTemplateApply.
pub async fn reconcile(apply: Arc<WorkspaceTemplateApply>, ctx: Arc<Context>) -> Result<Action> {
    // Paused (its Cluster, or its own annotation): no Workspace change, no finalizer change,
    // and its status, which only mirrors the Workspace, stays as it is.
    let cluster = super::shared::owning_cluster(&ctx, &*apply);
    if let Some(why) = super::pause::paused(cluster.as_ref(), &*apply) {
        tracing::debug!(apply = apply.name_any(), why, "Paused");
        return Ok(Action::await_change());
    }
    let namespace = apply.namespace().unwrap_or_default();
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(ctx.client.clone(), &namespace);
    let workspaces: Api<TerraformWorkspace> = Api::all(ctx.client.clone());
    let located = locate_workspace(&ctx, &apply);
    if apply.meta().deletion_timestamp.is_some() {
        return delete(&apply, &applies, &workspaces, located, &ctx).await;
    }
    let apply = set_finalizer(&applies, &apply, APPLY_FINALIZER, true)
        .await
        .map_err(kube_err(&*apply, "adding its finalizer"))?
        .map_or(apply, Arc::new);
    let own = located.own();
    let own_name = own.map(|_| located.placement.name()).unwrap_or_default();
    if let Some(refusal) = spec_refusal(&apply, &ctx, &namespace) {
        return refuse(&apply, &ctx, own_name, own, refusal).await;
    }
    if let Some(refusal) = name_refusal(&apply, &ctx, own) {
        return refuse(&apply, &ctx, own_name, own, refusal).await;
    }
    let name = match &located.placement {
        Placement::Use { name, .. } => name.clone(),
        Placement::Taken { name, owner } => {
            refuse(&apply, &ctx, "", None, taken(name, owner)).await?;
            // Not woken by another's Workspace: look again for it to go.
            return Ok(Action::requeue(ctx.settings.poll_interval));
        }
    };
    if let Some((reason, message)) = waiting(&apply, &ctx, &namespace).await? {
        publish(
            &apply,
            &ctx,
            &name,
            own,
            false,
            Some(blocked(reason, message)),
        )
        .await?;
        return Ok(Action::requeue(ctx.settings.poll_interval));
    }
    let (template, template_ns) = match template_of(&apply, &ctx, &namespace) {
        Ok(found) => found,
        Err(refusal) => {
            publish(&apply, &ctx, &name, own, false, Some(refusal)).await?;
            return Ok(Action::requeue(ctx.settings.poll_interval));
        }
    };
    let rendered = match render_checked(&apply, &ctx, &template, &template_ns, &name)? {
        Ok(rendered) => rendered,
        Err(refusal) => return refuse(&apply, &ctx, own_name, own, refusal).await,
    };
    let changed = needs_apply(own, &rendered);
    if changed {
        apply_workspace(&apply, &ctx, &workspaces, own, rendered, &template, &name).await?;
    } else if let Some(live) = own.filter(|w| !w.annotations().contains_key(INPUTS_ANNOTATION)) {
        record_inputs(&apply, &ctx, &workspaces, live, &rendered, &name).await?;
    }
    publish(&apply, &ctx, &name, own, changed, None).await?;
    Ok(after(None))
}

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

/// The WorkspaceTemplate the apply names, with its namespace (the apply's unless it names
/// one), as cached; or, not found, what blocks the apply.
fn template_of(
    apply: &WorkspaceTemplateApply,
    ctx: &Context,
    namespace: &str,
) -> std::result::Result<(Arc<WorkspaceTemplate>, String), Refusal> {
    let template_ref = &apply.spec.template_ref;
    let template_ns = template_ref
        .namespace
        .clone()
        .unwrap_or(namespace.to_owned());
    match cached(
        &ctx.caches.templates,
        Some(&template_ns),
        &template_ref.name,
    ) {
        Some(template) => Ok((template, template_ns)),
        None => {
            let message = format!(
                "WorkspaceTemplate {template_ns}/{} not found",
                template_ref.name
            );
            Err(blocked("TemplateNotFound", message))
        }
    }
}

/// Why the apply's own spec must not be rendered, if it must not: a reference to another
/// namespace (templates from an allowed one excepted), a template of a namespace the operator
/// does not trust with code (the apply's own included), or a variable refused for itself (its
/// key's shape, its value's size: `crate::variables`).
fn spec_refusal(apply: &WorkspaceTemplateApply, ctx: &Context, namespace: &str) -> Option<Refusal> {
    let allowed = &ctx.settings.allowed_template_namespaces;
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
    ctx: &Context,
    own: Option<&TerraformWorkspace>,
) -> Option<Refusal> {
    use crate::names;
    let generation = apply.meta().generation.map(|g| g.to_string());
    let rendered = own
        .is_some_and(|w| w.annotations().get(APPLY_GENERATION_ANNOTATION) == generation.as_ref());
    if rendered {
        return None;
    }
    fn holder(a: &WorkspaceTemplateApply) -> names::Holder<'_> {
        names::Holder {
            namespace: a.metadata.namespace.as_deref().unwrap_or_default(),
            name: a.metadata.name.as_deref().unwrap_or_default(),
            created: a.metadata.creation_timestamp.as_ref().map(|t| t.0),
            variables: a.spec.variables.as_ref(),
        }
    }
    let me = holder(apply);
    // Every apply is read only for a bare name, which CAPT itself gives only to the applies
    // it rendered before names carried their namespace.
    let cached = match names::holds_a_bare_name(&me) {
        true => ctx.caches.applies.state(),
        false => Vec::new(),
    };
    let policy = &ctx.settings.workspace_policy;
    let shares = |other: &str| policy.share_a_provider_config(me.namespace, other);
    let others = cached.iter().map(|a| holder(a));
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
    ctx: &Context,
    template: &WorkspaceTemplate,
    template_ns: &str,
    name: &str,
) -> Result<std::result::Result<Value, Refusal>> {
    let namespace = apply.namespace().unwrap_or_default();
    let template_name = format!("{template_ns}/{}", apply.spec.template_ref.name);
    if let Some(size) = template
        .annotations()
        .get(crate::watches::TOO_LARGE_ANNOTATION)
    {
        let message = format!(
            "WorkspaceTemplate {template_name} is {size} bytes, over the limit of {} bytes; \
             nothing is rendered",
            crate::watches::MAX_TEMPLATE_BYTES
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
    if let Some(message) = ctx.settings.workspace_policy.refusal(&namespace, &rendered) {
        return Ok(Err(blocked(crate::workspace_policy::NOT_ALLOWED, message)));
    }
    Ok(Ok(rendered))
}

/// Applies the rendered Workspace and records the write (for the write-loop check).
async fn apply_workspace(
    apply: &WorkspaceTemplateApply,
    ctx: &Context,
    workspaces: &Api<TerraformWorkspace>,
    own: Option<&TerraformWorkspace>,
    mut rendered: Value,
    template: &WorkspaceTemplate,
    name: &str,
) -> Result<()> {
    // Onto the Workspace we observed as ours, never one that replaced it meanwhile.
    if let Some(uid) = own.and_then(|w| w.uid()) {
        rendered["metadata"]["uid"] = json!(uid);
    }
    let params = PatchParams::apply(SPEC_MANAGER).force();
    workspaces
        .patch(name, &params, &Patch::Apply(&rendered))
        .await
        .map_err(kube_err(apply, "applying its Workspace"))?;
    tracing::info!(
        apply = apply.name_any(),
        workspace = name,
        "Rendered Workspace"
    );
    // The render is a function of the apply (spec, labels, uid), the template and the
    // name in use: the same ones rendered again and again is a loop.
    let observed = (
        apply.labels(),
        apply.uid(),
        template.meta().resource_version.as_deref(),
        name,
    );
    let written = Written::of::<TerraformWorkspace>(None, name, SPEC_MANAGER, None);
    let basis = Basis::of(apply.meta().generation, &observed);
    ctx.wrote(written, basis, apply.object_ref(&())).await;
    Ok(())
}

/// Records on a Workspace of v0.1.0, kept as it is ([`needs_apply`]), the inputs it renders
/// (those of now: its apply's generation is the one it records) and its rendering
/// ([`FIRST_RENDERING`]), so that a later change of its template reaches it. Its annotations
/// only, under a field manager of its own: its spec, and with it its generation, stays (no
/// Terraform run), and the fields CAPT's apply owns stay CAPT's.
async fn record_inputs(
    apply: &WorkspaceTemplateApply,
    ctx: &Context,
    workspaces: &Api<TerraformWorkspace>,
    live: &TerraformWorkspace,
    rendered: &Value,
    name: &str,
) -> Result<()> {
    let inputs = &rendered["metadata"]["annotations"][INPUTS_ANNOTATION];
    // Onto the Workspace observed, never one that replaced it meanwhile (a uid mismatch is a
    // conflict).
    let patch = json!({"metadata": {"uid": live.uid(), "annotations": {
        INPUTS_ANNOTATION: inputs, RENDERING_ANNOTATION: FIRST_RENDERING.to_string()}}});
    let params = PatchParams {
        field_manager: Some(INPUTS_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    workspaces
        .patch(name, &params, &Patch::Merge(&patch))
        .await
        .map_err(kube_err(apply, "recording its Workspace's inputs"))?;
    tracing::info!(
        apply = apply.name_any(),
        workspace = name,
        "Recorded the inputs of a Workspace rendered by v0.1.0; its spec is kept"
    );
    let written = Written::of::<TerraformWorkspace>(None, name, INPUTS_MANAGER, None);
    let basis = Basis::of(apply.meta().generation, &(name, inputs.as_str()));
    ctx.wrote(written, basis, apply.object_ref(&())).await;
    Ok(())
}

/// `Applied=False` with `reason`: rendering waits for something.
fn blocked(reason: &'static str, message: String) -> Refusal {
    Refusal {
        condition: APPLIED_CONDITION,
        reason,
        message,
    }
}

/// Leaves the Workspace alone and says why: the refusal's condition (and `Applied=False`),
/// and a Warning Event when the condition is new. `name` is the apply's own Workspace's, `""`
/// when it has none (another's Workspace is never named as its). Waits for the apply to
/// change.
async fn refuse(
    apply: &WorkspaceTemplateApply,
    ctx: &Context,
    name: &str,
    own: Option<&TerraformWorkspace>,
    refusal: Refusal,
) -> Result<Action> {
    let reported = apply
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|list| {
            list.iter().any(|c| {
                c.type_ == refusal.condition && c.status == "False" && c.message == refusal.message
            })
        });
    if !reported {
        tracing::warn!(
            apply = apply.name_any(),
            reason = refusal.reason,
            message = refusal.message,
            "Refused"
        );
        ctx.warn(apply, refusal.reason, "Render", refusal.message.clone())
            .await;
    }
    publish(apply, ctx, name, own, false, Some(refusal)).await?;
    Ok(Action::await_change())
}

/// What the apply waits for before rendering: Secrets and Workspaces named in its spec.
/// A Secret's existence is read (its metadata only) until it is seen, a few at a time, one
/// read for every apply asking about it at once, then remembered a while
/// ([`crate::seen_secrets`]): the check reads at most the
/// [`MAX_WAITS`](crate::api::bounds::MAX_WAITS) the CRD allows, and stops at the first missing.
async fn waiting(
    apply: &WorkspaceTemplateApply,
    ctx: &Context,
    namespace: &str,
) -> Result<Option<(&'static str, String)>> {
    let secrets: Vec<(String, String)> = apply
        .spec
        .wait_for_secrets
        .iter()
        .flatten()
        .map(|s| (s.namespace.clone(), s.name.clone()))
        .collect();
    let exists = |(namespace, name): &(String, String)| {
        let api: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(ctx.client.clone(), namespace);
        let name = name.clone();
        // Only existence is checked: the Secret's data is never read here.
        async move {
            api.get_metadata_opt(&name)
                .await
                .map(|found| found.is_some())
        }
    };
    let missing = ctx
        .seen_secrets
        .first_missing(&secrets, exists)
        .await
        .map_err(|shared| {
            // The read's failure, as its own when this check was the last to hold it.
            Arc::try_unwrap(shared).unwrap_or_else(|shared| kube::Error::Service(Box::new(shared)))
        })
        .map_err(kube_err(apply, "checking a Secret it waits for"))?;
    if let Some((secret_namespace, secret)) = missing {
        return Ok(Some((
            "WaitingForSecrets",
            format!("Secret {secret_namespace}/{secret} does not exist yet"),
        )));
    }
    for wanted in apply.spec.wait_for_workspaces.iter().flatten() {
        // Workspaces are cluster-scoped: only one rendered for an apply of this namespace
        // counts, so that no tenant learns whether another namespace's Workspace is ready
        // (the message is the same whether it exists elsewhere or not at all).
        let found = cached(&ctx.caches.workspaces, None, &wanted.name).filter(|w| {
            w.labels()
                .get(crate::render::APPLY_NAMESPACE_LABEL)
                .map(String::as_str)
                == Some(namespace)
        });
        let ready = found
            .map(|w| {
                crate::status::workspace::WorkspaceObservation::from_json(
                    &serde_json::to_value(w.as_ref()).unwrap_or_default(),
                )
                .is_ready()
            })
            .unwrap_or(false);
        if !ready {
            return Ok(Some((
                "WaitingForWorkspaces",
                format!(
                    "Workspace {} of an apply of namespace {namespace} is not ready yet",
                    wanted.name
                ),
            )));
        }
    }
    Ok(None)
}

/// Whether the rendered Workspace is written: always when there is none; never onto a
/// Workspace an earlier [`RENDERING`] rendered from the inputs it still has (the apply's
/// generation and [`inputs_digest`](crate::render::inputs_digest) it records), so that a new
/// rendering reaches an existing Workspace only with a real change of its inputs, not with an
/// upgrade; otherwise when the live Workspace, as cached (its module as a digest:
/// [`crate::watches::Watched::trim`]), lacks what was rendered: a change of the inputs, or
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
        *module = Value::String(crate::watches::module_digest(text));
    }
    !["spec", "metadata"]
        .iter()
        .all(|k| contains(&live[*k], &rendered[*k]))
}

/// Publishes the apply's status: the Workspace's name (`""`: none), whether it was rendered,
/// and the Workspace's conditions mirrored (plus `Applied=False`, and the refusal's own
/// condition, while something blocks rendering).
async fn publish(
    apply: &WorkspaceTemplateApply,
    ctx: &Context,
    name: &str,
    workspace: Option<&TerraformWorkspace>,
    applied_now: bool,
    blocked: Option<Refusal>,
) -> Result<()> {
    let existing = apply.status.as_ref();
    let last_applied = if applied_now {
        Some(Timestamp::now().to_string())
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
                .unwrap_or_else(|| Timestamp::now().to_string())
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
    let publication = Publication::status(apply, MANAGER, json!({"status": status}));
    ctx.publish(publication.observing(&observed)).await?;
    Ok(())
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

async fn delete(
    apply: &WorkspaceTemplateApply,
    applies: &Api<WorkspaceTemplateApply>,
    workspaces: &Api<TerraformWorkspace>,
    located: Located,
    ctx: &Context,
) -> Result<Action> {
    if !apply.finalizers().iter().any(|f| f == APPLY_FINALIZER) {
        return Ok(Action::await_change());
    }
    // `spec.retainWorkspaceOnDelete` is the tenant's, so it is not honoured: a Workspace left
    // behind would keep running on the platform's credentials, seen by no one.
    let retain = false;
    match (&located.placement, located.workspace) {
        (Placement::Taken { name, owner }, _) => {
            // Another's Workspace under our name: never deleted.
            let note = format!("Workspace {name} belongs to another ({owner}); not deleted");
            tracing::warn!(apply = apply.name_any(), note, "Left another's Workspace");
            ctx.warn(apply, WORKSPACE_OWNED_BY_ANOTHER, "Delete", note)
                .await;
        }
        (Placement::Use { .. }, Some(ws)) if !retain => {
            if ws.meta().deletion_timestamp.is_none() {
                // Only the Workspace observed as ours: a replacement fails the precondition.
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: ws.uid(),
                        resource_version: None,
                    }),
                    ..DeleteParams::background()
                };
                workspaces
                    .delete(&ws.name_any(), &params)
                    .await
                    .map_err(kube_err(apply, "deleting its Workspace"))?;
                tracing::info!(
                    apply = apply.name_any(),
                    workspace = ws.name_any(),
                    "Deleting Workspace"
                );
            }
            return Ok(Action::requeue(ctx.settings.poll_interval));
        }
        (Placement::Use { name, .. }, None) if !retain => {
            // The cache may not show a Workspace rendered just before the deletion: the
            // finalizer goes only once the API server says there is none of ours, or the
            // Workspace (and its cloud resources) would be orphaned.
            let live = workspaces
                .get_opt(name)
                .await
                .map_err(kube_err(apply, "looking for its Workspace"))?;
            let ours = live.as_ref().is_some_and(|ws| {
                crate::tenancy::workspace_owner(
                    &apply.namespace().unwrap_or_default(),
                    &apply.name_any(),
                    apply.uid().as_deref(),
                    ws.labels(),
                ) == crate::tenancy::WorkspaceOwner::Ours
            });
            if ours {
                tracing::info!(
                    apply = apply.name_any(),
                    workspace = name,
                    "Its Workspace is not in the cache yet; waiting for it before deleting it"
                );
                return Ok(Action::requeue(ctx.settings.poll_interval));
            }
        }
        _ => {}
    }
    set_finalizer(applies, apply, APPLY_FINALIZER, false)
        .await
        .map_err(kube_err(apply, "removing its finalizer"))?;
    super::observe_deletion(ctx, apply);
    ctx.publisher.forget(ObjectId::of_object(apply));
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watches::Watched as _;

    #[test]
    fn an_apply_stored_over_a_bound_is_refused_naming_the_field() {
        use crate::api::bounds::MAX_WAITS;
        let with = |field: &str, n: usize| -> WorkspaceTemplateApply {
            let list: Vec<_> = (0..n)
                .map(|i| json!({"name": format!("s{i}"), "namespace": "team"}))
                .collect();
            serde_json::from_value(json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
                "metadata": {"name": "a", "namespace": "team"},
                "spec": {"templateRef": {"name": "t"}, field: list},
            }))
            .unwrap()
        };
        assert_eq!(over_bounds(&with("waitForSecrets", MAX_WAITS)), None);
        let refused = over_bounds(&with("waitForSecrets", 20_000)).expect("refused");
        assert!(
            refused.starts_with("spec.waitForSecrets has 20000 entries"),
            "{refused}"
        );
        let refused = over_bounds(&with("waitForWorkspaces", MAX_WAITS + 1)).expect("refused");
        assert!(refused.starts_with("spec.waitForWorkspaces"), "{refused}");
    }

    #[test]
    fn defaulted_fields_do_not_make_a_workspace_look_changed() {
        let mut live: TerraformWorkspace = serde_json::from_value(json!({
            "apiVersion": "tf.upbound.io/v1beta1", "kind": "Workspace",
            "metadata": {"name": "w", "labels": {"a": "1", "other": "x"},
                "annotations": {RENDERING_ANNOTATION: RENDERING.to_string()}},
            "spec": {"forProvider": {"module": "m", "source": "Inline"}, "managementPolicies": ["*"]},
        }))
        .unwrap();
        live.trim();
        let rendered = json!({"metadata": {"name": "w", "labels": {"a": "1"}}, "spec": {"forProvider": {"module": "m", "source": "Inline"}}});
        assert!(!needs_apply(Some(&live), &rendered));
        let changed = json!({"metadata": {"name": "w", "labels": {"a": "1"}}, "spec": {"forProvider": {"module": "m2", "source": "Inline"}}});
        assert!(needs_apply(Some(&live), &changed));
        assert!(needs_apply(None, &rendered));
    }

    fn inline_template(module: &str) -> crate::api::WorkspaceTemplate {
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
            "metadata": {"name": "t", "namespace": "team"},
            "spec": {"template": {"spec": {"forProvider": {"module": module, "source": "Inline"}}}},
        }))
        .unwrap()
    }

    fn apply_at(generation: i64) -> WorkspaceTemplateApply {
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
            "metadata": {"name": "a", "namespace": "team", "uid": "u-1", "generation": generation},
            "spec": {"templateRef": {"name": "t"}},
        }))
        .unwrap()
    }

    /// `rendered` as the cache holds it once stored, with `edit` applied to it.
    fn stored(rendered: &Value, edit: impl FnOnce(&mut Value)) -> TerraformWorkspace {
        let mut stored = rendered.clone();
        stored["spec"]["deletionPolicy"] = json!("Delete");
        edit(&mut stored);
        let mut live: TerraformWorkspace = serde_json::from_value(stored).unwrap();
        live.trim();
        live
    }

    /// What v0.1.0 wrote: no inputs digest, no rendering, the apply's generation; and a
    /// rendering that differs from today's (here its module).
    fn as_v0_1_0(ws: &mut Value) {
        let annotations = ws["metadata"]["annotations"].as_object_mut().unwrap();
        annotations.remove(INPUTS_ANNOTATION);
        annotations.remove(RENDERING_ANNOTATION);
        ws["spec"]["forProvider"]["module"] = json!("rendered otherwise by v0.1.0");
    }

    #[test]
    fn a_workspace_of_an_earlier_rendering_is_kept_while_its_inputs_are_unchanged() {
        let template = inline_template("m");
        let rendered = render_workspace(&apply_at(2), &template, "w").unwrap();
        let live = stored(&rendered, as_v0_1_0);
        assert!(!needs_apply(Some(&live), &rendered), "kept");
        // Its apply changed since: rendered anew.
        let later = render_workspace(&apply_at(3), &template, "w").unwrap();
        assert!(needs_apply(Some(&live), &later), "apply changed");
        // An earlier rendering that recorded its inputs: the template changed since.
        let live = stored(&rendered, |ws| {
            ws["metadata"]["annotations"][RENDERING_ANNOTATION] = json!("1");
            ws["spec"]["forProvider"]["module"] = json!("rendered otherwise");
        });
        assert!(!needs_apply(Some(&live), &rendered), "kept");
        let changed = render_workspace(&apply_at(2), &inline_template("m2"), "w").unwrap();
        assert!(needs_apply(Some(&live), &changed), "template changed");
    }

    #[test]
    fn another_writers_change_of_a_rendered_field_is_put_back_and_an_operators_own_fields_stay() {
        let rendered = render_workspace(&apply_at(2), &inline_template("m"), "w").unwrap();
        assert!(
            rendered["spec"].get("deletionPolicy").is_none(),
            "{rendered}"
        );
        let operators = stored(&rendered, |ws| {
            ws["spec"]["deletionPolicy"] = json!("Orphan");
            ws["metadata"]["annotations"]["operator/note"] = json!("keep");
        });
        assert!(!needs_apply(Some(&operators), &rendered));
        let drifted = stored(&rendered, |ws| {
            ws["spec"]["forProvider"]["module"] = json!("edited by hand");
        });
        assert!(needs_apply(Some(&drifted), &rendered));
    }

    /// A loop once: a template without annotations rendered an empty map, which the API server
    /// does not store; the Workspace then always looked changed and was applied again on
    /// every reconcile.
    #[test]
    fn a_workspace_rendered_from_a_template_without_annotations_is_not_applied_again() {
        let template: crate::api::WorkspaceTemplate = serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
            "metadata": {"name": "plain", "namespace": "team"},
            "spec": {"template": {"spec": {"forProvider": {"module": "m", "source": "Inline"}}}},
        }))
        .unwrap();
        let apply: WorkspaceTemplateApply = serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
            "metadata": {"name": "alone", "namespace": "team", "uid": "u-1"},
            "spec": {"templateRef": {"name": "plain"}},
        }))
        .unwrap();
        let rendered = render_workspace(&apply, &template, "team-alone-0123456789").unwrap();
        // What the API server keeps of it: no empty map in metadata, its defaults in spec.
        let mut stored = rendered.clone();
        let metadata = stored["metadata"].as_object_mut().unwrap();
        metadata.retain(|_, v| v.as_object().is_none_or(|m| !m.is_empty()));
        stored["spec"]["managementPolicies"] = json!(["*"]);
        stored["spec"]["providerConfigRef"] = json!({"name": "default"});
        let mut live: TerraformWorkspace = serde_json::from_value(stored).unwrap();
        live.trim();
        assert!(!needs_apply(Some(&live), &rendered), "{rendered}");
    }
}
