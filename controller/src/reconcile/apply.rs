//! WorkspaceTemplateApply: renders its Workspace from the WorkspaceTemplate, mirrors the
//! Workspace's conditions (manager `capt-workspacetemplateapply`), and on deletion deletes
//! the Workspace (always: `retainWorkspaceOnDelete` is a tenant's, not honoured) and keeps its
//! finalizer until the Workspace is gone. A reconcile observes (the caches, [`observe`]),
//! decides ([`decide::decide`]) and acts ([`super::act`]).
//!
//! Tenancy (`crate::tenancy`): only a template of a namespace the operator trusts with code is
//! rendered, every other reference stays in the apply's namespace, and a Workspace under its name that belongs to another is
//! never applied to nor deleted; each is reported as a condition and a Warning Event.

mod decide;

pub use self::decide::{
    APPLIED_CONDITION, APPLY_FINALIZER, APPLYING_WORKSPACE, CHECKING_SECRETS, DELETING_WORKSPACE,
    INPUTS_MANAGER, LOOKING_FOR_WORKSPACE, MANAGER, OVER_BOUNDS, RECORDING_INPUTS, Snapshot,
    decide,
};

use super::Result;
use super::observe::{locate_workspace, owning_cluster};
use crate::api::WorkspaceTemplateApply;
use crate::context::Context;
use crate::watches::cached;
use jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use std::sync::Arc;

/// Reconciles one WorkspaceTemplateApply.
pub async fn reconcile(apply: Arc<WorkspaceTemplateApply>, ctx: Arc<Context>) -> Result<Action> {
    let seen = observe(&ctx, apply);
    let subject = super::subject(&*seen.apply);
    super::act::carry_out_rounds(&ctx, &subject, |progress| {
        Ok(decide(&seen, progress, Timestamp::now())?)
    })
    .await
}

/// What the decision reads, from the caches: the apply, its Cluster (for the pause), its
/// Workspace under the names it may have, its template, the Workspaces it waits for, and
/// (only when its name keys hold a bare name) every other apply.
pub fn observe(ctx: &Context, apply: Arc<WorkspaceTemplateApply>) -> Snapshot {
    let namespace = apply.namespace().unwrap_or_default();
    let cluster = owning_cluster(ctx, &*apply);
    let located = locate_workspace(ctx, &apply);
    let template_ref = &apply.spec.template_ref;
    let template_ns = template_ref.namespace.as_deref().unwrap_or(&namespace);
    let template = cached(&ctx.caches.templates, Some(template_ns), &template_ref.name);
    let waited_workspaces = (apply.spec.wait_for_workspaces.iter().flatten())
        .map(|wanted| {
            (
                wanted.name.clone(),
                ready_here(ctx, &wanted.name, &namespace),
            )
        })
        .collect();
    let applies = match decide::holds_a_bare_name(&apply) {
        true => ctx.caches.applies.state(),
        false => Vec::new(),
    };
    let settings = &ctx.settings;
    Snapshot {
        apply,
        cluster,
        located,
        template,
        waited_workspaces,
        applies,
        allowed_template_namespaces: settings.allowed_template_namespaces.clone(),
        workspace_policy: settings.workspace_policy.clone(),
        poll_interval: settings.poll_interval,
    }
}

/// True when the Workspace `name` is cached, Ready, and rendered for an apply of
/// `namespace`. Workspaces are cluster-scoped: only one of the namespace counts, so that no
/// tenant learns whether another namespace's Workspace is ready (the message is the same
/// whether it exists elsewhere or not at all).
fn ready_here(ctx: &Context, name: &str, namespace: &str) -> bool {
    let found = cached(&ctx.caches.workspaces, None, name).filter(|w| {
        w.labels()
            .get(crate::render::APPLY_NAMESPACE_LABEL)
            .map(String::as_str)
            == Some(namespace)
    });
    found.is_some_and(|w| {
        crate::status::workspace::WorkspaceObservation::from_json(
            &serde_json::to_value(w.as_ref()).unwrap_or_default(),
        )
        .is_ready()
    })
}
