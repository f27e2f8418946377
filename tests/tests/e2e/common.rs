//! What the end-to-end scenarios share: the mutex they take turns on, the sample's endpoint,
//! starting a provisioned system, and reading and annotating Workspaces.

use anyhow::Result;
use capt_controller::api::TerraformWorkspace;
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::Mutex;

pub(crate) static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// The sample's endpoint host in namespace `ns`: the EKS name in it carries the namespace.
pub(crate) fn endpoint_host(ns: &str) -> String {
    capt_tests::sample_endpoint_host(ns, "demo")
}

pub(crate) async fn provisioned(prefix: &str, retain_vpc: bool) -> Result<(TestNamespace, System)> {
    provisioned_with(prefix, retain_vpc, 200).await
}

pub(crate) async fn provisioned_with(
    prefix: &str,
    retain_vpc: bool,
    provider_delay_ms: u64,
) -> Result<(TestNamespace, System)> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, prefix).await?;
    let system = System::start_with(
        &ns.name,
        provider_delay_ms,
        &["--stuck-deletion-seconds", "3"],
    )
    .await?;
    system.apply_samples(retain_vpc).await?;
    system.wait_provisioned().await?;
    Ok((ns, system))
}

/// The Workspace of apply `ns`/`apply`: the controller's one naming function.
pub(crate) fn workspace_name(ns: &str, apply: &str) -> String {
    capt_controller::render::workspace_name(ns, apply)
}

/// Merge-patches annotations on a Workspace, as a test driving the fake provider.
pub(crate) async fn annotate_workspace(name: &str, annotations: Value) -> Result<()> {
    let api: Api<TerraformWorkspace> = Api::all(env().client().await?);
    let patch = json!({"metadata": {"annotations": annotations}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}
