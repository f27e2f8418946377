//! WorkspaceTemplateApply: renders its Workspace from the WorkspaceTemplate, mirrors the
//! Workspace's conditions (manager `capt-workspacetemplateapply`), and on deletion deletes
//! the Workspace (unless retained) and keeps its finalizer until the Workspace is gone.

use super::shared::contains;
use super::{Result, after, kube_err};
use crate::api::{TerraformWorkspace, WorkspaceTemplate, WorkspaceTemplateApply};
use crate::context::Context;
use crate::k8s::{SPEC_MANAGER, set_finalizer};
use crate::publish::Publication;
use crate::render::{render_workspace, workspace_name};
use jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use std::sync::Arc;

/// Finalizer kept on an apply until its Workspace is gone.
pub const APPLY_FINALIZER: &str = "infrastructure.cluster.x-k8s.io/workspacetemplateapply";
/// Field manager of WorkspaceTemplateApply status.
pub const MANAGER: &str = "capt-workspacetemplateapply";

/// Reconciles one WorkspaceTemplateApply.
pub async fn reconcile(apply: Arc<WorkspaceTemplateApply>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconciled("WorkspaceTemplateApply");
    // Paused (its Cluster, or its own annotation): no Workspace change, no finalizer change,
    // and its status, which only mirrors the Workspace, stays as it is.
    let cluster = super::shared::owning_cluster(&ctx, &*apply).await?;
    if let Some(why) = super::pause::paused(cluster.as_ref(), &*apply) {
        tracing::debug!(apply = apply.name_any(), why, "Paused");
        return Ok(Action::await_change());
    }
    let namespace = apply.namespace().unwrap_or_default();
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(ctx.client.clone(), &namespace);
    let workspaces: Api<TerraformWorkspace> = Api::all(ctx.client.clone());
    let workspace = workspaces
        .get_opt(&workspace_name(&apply))
        .await
        .map_err(kube_err(&*apply, "reading its Workspace"))?;
    if apply.meta().deletion_timestamp.is_some() {
        return delete(&apply, &applies, &workspaces, workspace, &ctx).await;
    }
    set_finalizer(&applies, &apply, APPLY_FINALIZER, true)
        .await
        .map_err(kube_err(&*apply, "adding its finalizer"))?;
    if let Some((reason, message)) = waiting(&apply, &ctx, &namespace).await? {
        publish(
            &apply,
            &ctx,
            workspace.as_ref(),
            false,
            Some((reason, message)),
        )
        .await?;
        return Ok(Action::requeue(ctx.settings.poll_interval));
    }
    let template_ns = apply
        .spec
        .template_ref
        .namespace
        .clone()
        .unwrap_or(namespace);
    let templates: Api<WorkspaceTemplate> = Api::namespaced(ctx.client.clone(), &template_ns);
    let Some(template) = templates
        .get_opt(&apply.spec.template_ref.name)
        .await
        .map_err(kube_err(&*apply, "reading its WorkspaceTemplate"))?
    else {
        let message = format!(
            "WorkspaceTemplate {template_ns}/{} not found",
            apply.spec.template_ref.name
        );
        publish(
            &apply,
            &ctx,
            workspace.as_ref(),
            false,
            Some(("TemplateNotFound", message)),
        )
        .await?;
        return Ok(Action::requeue(ctx.settings.poll_interval));
    };
    let rendered = render_workspace(&apply, &template)?;
    let changed = needs_apply(workspace.as_ref(), &rendered);
    if changed {
        let params = PatchParams::apply(SPEC_MANAGER).force();
        workspaces
            .patch(&workspace_name(&apply), &params, &Patch::Apply(&rendered))
            .await
            .map_err(kube_err(&*apply, "applying its Workspace"))?;
        tracing::info!(
            apply = apply.name_any(),
            workspace = workspace_name(&apply),
            "Rendered Workspace"
        );
    }
    publish(&apply, &ctx, workspace.as_ref(), changed, None).await?;
    Ok(after(None))
}

/// What the apply waits for before rendering: Secrets and Workspaces named in its spec.
async fn waiting(
    apply: &WorkspaceTemplateApply,
    ctx: &Context,
    namespace: &str,
) -> Result<Option<(&'static str, String)>> {
    for secret in apply.spec.wait_for_secrets.iter().flatten() {
        let api: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(ctx.client.clone(), &secret.namespace);
        // Only existence is checked: the Secret's data is never read here.
        let found = api
            .get_metadata_opt(&secret.name)
            .await
            .map_err(kube_err(apply, "checking a Secret it waits for"))?;
        if found.is_none() {
            return Ok(Some((
                "WaitingForSecrets",
                format!(
                    "Secret {}/{} does not exist yet",
                    secret.namespace, secret.name
                ),
            )));
        }
    }
    let workspaces: Api<TerraformWorkspace> = Api::all(ctx.client.clone());
    for wanted in apply.spec.wait_for_workspaces.iter().flatten() {
        let found = workspaces
            .get_opt(&wanted.name)
            .await
            .map_err(kube_err(apply, "checking a Workspace it waits for"))?;
        let ready = found
            .map(|w| {
                crate::status::workspace::WorkspaceObservation::from_json(
                    &serde_json::to_value(&w).unwrap_or_default(),
                )
                .is_ready()
            })
            .unwrap_or(false);
        if !ready {
            return Ok(Some((
                "WaitingForWorkspaces",
                format!("Workspace {} is not ready yet", wanted.name),
            )));
        }
    }
    let _ = namespace;
    Ok(None)
}

/// True when the live Workspace lacks what was rendered. Fields the API server defaulted
/// (`managementPolicies`, `providerConfigRef`, ...) are not ours and are not compared.
fn needs_apply(live: Option<&TerraformWorkspace>, rendered: &Value) -> bool {
    let Some(live) = live else { return true };
    let live = serde_json::to_value(live).unwrap_or_default();
    !["spec", "metadata"]
        .iter()
        .all(|k| contains(&live[*k], &rendered[*k]))
}

/// Publishes the apply's status: the Workspace's name, whether it was rendered, and the
/// Workspace's conditions mirrored (plus `Applied` while something blocks rendering).
async fn publish(
    apply: &WorkspaceTemplateApply,
    ctx: &Context,
    workspace: Option<&TerraformWorkspace>,
    applied_now: bool,
    blocked: Option<(&'static str, String)>,
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
    if let Some((reason, message)) = blocked {
        let since = existing
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| {
                c.iter()
                    .find(|c| c.type_ == "Applied" && c.status == "False")
            })
            .map(|c| c.last_transition_time.0.to_string())
            .unwrap_or_else(|| Timestamp::now().to_string());
        conditions.push(json!({"type": "Applied", "status": "False", "reason": reason, "message": message, "lastTransitionTime": since}));
    }
    let mut status = json!({"workspaceName": workspace_name(apply), "applied": applied_now || workspace.is_some(), "conditions": conditions});
    if let Some(t) = last_applied {
        status["lastAppliedTime"] = json!(t);
    }
    ctx.publish(Publication::status(
        apply,
        MANAGER,
        json!({"status": status}),
    ))
    .await?;
    Ok(())
}

/// The Workspace's `Synced` and `Ready` conditions, as `metav1.Condition`s.
fn mirrored_conditions(workspace: &TerraformWorkspace) -> Vec<Value> {
    let status = workspace.status.clone().unwrap_or_default();
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| matches!(c["type"].as_str(), Some("Synced" | "Ready")))
        .map(|c| {
            json!({
                "type": c["type"], "status": c["status"],
                "reason": c["reason"].as_str().filter(|r| !r.is_empty()).unwrap_or("Unknown"),
                "message": c["message"].as_str().unwrap_or(""),
                "lastTransitionTime": c["lastTransitionTime"],
            })
        })
        .collect()
}

async fn delete(
    apply: &WorkspaceTemplateApply,
    applies: &Api<WorkspaceTemplateApply>,
    workspaces: &Api<TerraformWorkspace>,
    workspace: Option<TerraformWorkspace>,
    ctx: &Context,
) -> Result<Action> {
    if !apply.finalizers().iter().any(|f| f == APPLY_FINALIZER) {
        return Ok(Action::await_change());
    }
    let retain = apply.spec.retain_workspace_on_delete.unwrap_or(false);
    if let Some(ws) = workspace.filter(|_| !retain) {
        if ws.meta().deletion_timestamp.is_none() {
            workspaces
                .delete(&ws.name_any(), &DeleteParams::background())
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
    set_finalizer(applies, apply, APPLY_FINALIZER, false)
        .await
        .map_err(kube_err(apply, "removing its finalizer"))?;
    super::observe_deletion(ctx, apply);
    ctx.publisher.forget(
        "WorkspaceTemplateApply",
        apply.namespace().as_deref(),
        &apply.name_any(),
    );
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaulted_fields_do_not_make_a_workspace_look_changed() {
        let live: TerraformWorkspace = serde_json::from_value(json!({
            "apiVersion": "tf.upbound.io/v1beta1", "kind": "Workspace",
            "metadata": {"name": "w", "labels": {"a": "1", "other": "x"}},
            "spec": {"forProvider": {"module": "m", "source": "Inline"}, "managementPolicies": ["*"]},
        }))
        .unwrap();
        let rendered = json!({"metadata": {"name": "w", "labels": {"a": "1"}}, "spec": {"forProvider": {"module": "m", "source": "Inline"}}});
        assert!(!needs_apply(Some(&live), &rendered));
        let changed = json!({"metadata": {"name": "w", "labels": {"a": "1"}}, "spec": {"forProvider": {"module": "m2", "source": "Inline"}}});
        assert!(needs_apply(Some(&live), &changed));
        assert!(needs_apply(None, &rendered));
    }
}
