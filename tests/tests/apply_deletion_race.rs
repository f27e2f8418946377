//! An apply (WorkspaceTemplateApply) deleted before the controller's cache shows the Workspace
//! just rendered for it keeps its finalizer until the API server says no Workspace of its is
//! left, so that Workspace, and the cloud resources it stands for, is never orphaned
//! (`docs/security.md`; issue 28, item 8).
//!
//! The race is made to happen every time: the controller's own apply reconciler runs in this
//! process against the real API server, on caches the test fills by hand, so the Workspace
//! cache shows the rendered Workspace only once the test says it has caught up. No
//! controller process runs; a status-applier takes the apply's status.

use anyhow::{Context as _, Result, ensure};
use capt_controller::api::{
    CAPTCluster, CAPTControlPlane, Cluster, TerraformWorkspace, WorkspaceTemplate,
    WorkspaceTemplateApply,
};
use capt_controller::context::{Context, Settings, recorder};
use capt_controller::metrics::Metrics;
use capt_controller::publish::Publisher;
use capt_controller::reconcile::apply::{APPLY_FINALIZER, reconcile};
use capt_controller::render::workspace_name;
use capt_controller::rewake::Rewake;
use capt_controller::watches::Caches;
use capt_controller::write_loops::{Limit, WriteLoops};
use capt_tests::applier::Applier;
use capt_tests::{TestNamespace, env};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher::Event;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the reconciler looks again while waiting.
const POLL: Duration = Duration::from_secs(1);

/// What the reconciler reads, as the test lets it: the template it renders from, and the
/// Workspace cache, which sees the rendered Workspace only when the test says so.
struct HandFedCaches {
    caches: Caches,
    templates: Writer<WorkspaceTemplate>,
    workspaces: Writer<TerraformWorkspace>,
}

impl HandFedCaches {
    fn empty() -> Self {
        let (templates_store, templates) = reflector::store();
        let (workspaces_store, workspaces) = reflector::store();
        let caches = Caches {
            clusters: reflector::store::<Cluster>().0,
            capt_clusters: reflector::store::<CAPTCluster>().0,
            control_planes: reflector::store::<CAPTControlPlane>().0,
            applies: reflector::store::<WorkspaceTemplateApply>().0,
            templates: templates_store,
            workspaces: workspaces_store,
        };
        Self {
            caches,
            templates,
            workspaces,
        }
    }
}

/// The reconcilers' context on `caches`, publishing to `applier`, trusting the templates of
/// `namespace` with code.
fn context(caches: Caches, applier: &Applier, client: kube::Client, namespace: &str) -> Context {
    let metrics = Metrics::register(&mut prometheus_client::registry::Registry::default());
    Context {
        caches,
        rewake: Rewake::new(metrics.rewake_gave_up.clone()),
        events: recorder(client.clone()),
        client,
        publisher: Publisher::new(status_applier::client::Client::new(&applier.socket)),
        metrics,
        settings: Settings {
            poll_interval: POLL,
            allowed_template_namespaces: Arc::new([namespace.to_owned()].into()),
            ..Settings::default()
        },
        seen_secrets: Default::default(),
        write_loops: Mutex::new(WriteLoops::new(Limit {
            writes: 100,
            window: Duration::from_secs(60),
        })),
    }
}

#[tokio::test]
async fn an_apply_deleted_before_the_cache_shows_its_workspace_keeps_its_finalizer_until_the_workspace_is_gone()
-> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "apply-race").await?;
    let applier = Applier::start(&[]).await?;
    let templates: Api<WorkspaceTemplate> = Api::namespaced(client.clone(), &ns.name);
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), &ns.name);
    let workspaces: Api<TerraformWorkspace> = Api::all(client.clone());
    let template: WorkspaceTemplate = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
        "metadata": {"name": "vpc", "namespace": ns.name},
        "spec": {"template": {"spec": {"forProvider": {"source": "Inline",
            "module": "variable \"id\" {}\noutput \"id\" { value = var.id }",
            "vars": [{"key": "id", "value": "${ID}"}]}}}},
    }))?;
    let template = templates.create(&PostParams::default(), &template).await?;
    let apply: WorkspaceTemplateApply = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "vpc", "namespace": ns.name},
        "spec": {"templateRef": {"name": "vpc"}, "variables": {"ID": "vpc-1"}},
    }))?;
    applies.create(&PostParams::default(), &apply).await?;
    let name = workspace_name(&ns.name, "vpc");

    let mut fed = HandFedCaches::empty();
    fed.templates.apply_watcher_event(&Event::Apply(template));
    let ctx = Arc::new(context(
        fed.caches.clone(),
        &applier,
        client.clone(),
        &ns.name,
    ));

    // The reconciler renders the Workspace; the cache has not seen it yet.
    reconcile(Arc::new(applies.get("vpc").await?), ctx.clone()).await?;
    let rendered = workspaces
        .get_opt(&name)
        .await?
        .context("the Workspace rendered for the apply")?;
    ensure!(
        applies
            .get("vpc")
            .await?
            .finalizers()
            .contains(&APPLY_FINALIZER.to_owned()),
        "the apply carries its finalizer once it has rendered"
    );

    // Deleted before the cache shows its Workspace: the deletion decision sees none.
    applies.delete("vpc", &DeleteParams::default()).await?;
    let deleting = applies.get("vpc").await?;
    ensure!(deleting.metadata.deletion_timestamp.is_some());
    let action = reconcile(Arc::new(deleting), ctx.clone()).await?;
    let kept = applies.get_opt("vpc").await?;
    ensure!(
        kept.as_ref()
            .is_some_and(|a| a.finalizers().contains(&APPLY_FINALIZER.to_owned())),
        "the apply keeps its finalizer while the API server still has its Workspace \
         (else that Workspace is orphaned): {kept:?}"
    );
    let workspace = workspaces.get_opt(&name).await?;
    ensure!(
        workspace
            .as_ref()
            .is_some_and(|w| w.uid() == rendered.uid()),
        "its Workspace is still there, the one rendered: {workspace:?}"
    );
    ensure!(
        action == Action::requeue(POLL),
        "it looks again for the cache to catch up: {action:?}"
    );

    // The cache catches up: the Workspace is deleted, then the finalizer goes.
    fed.workspaces
        .apply_watcher_event(&Event::Apply(workspace.context("the Workspace")?));
    reconcile(Arc::new(applies.get("vpc").await?), ctx.clone()).await?;
    let workspace = workspaces.get_opt(&name).await?;
    ensure!(
        workspace.is_none(),
        "the Workspace is deleted once the cache shows it: {workspace:?}"
    );
    fed.workspaces
        .apply_watcher_event(&Event::Delete(rendered.clone()));
    reconcile(Arc::new(applies.get("vpc").await?), ctx.clone()).await?;
    let left = applies.get_opt("vpc").await?;
    ensure!(
        left.is_none(),
        "the apply goes once the API server has no Workspace of its: {left:?}"
    );
    Ok(())
}
