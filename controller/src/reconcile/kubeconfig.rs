//! The Cluster's `<cluster>-kubeconfig` Secret (Cluster API control-plane contract) and its
//! `<cluster>-user-kubeconfig` for people, kept equal to what [`crate::kubeconfig`] computes
//! from the control plane's connection Secret.
//! Secret data is never logged and never put into an error.

use super::{Result, kube_err};
use crate::api::{CAPTControlPlane, Cluster, WorkspaceTemplateApply};
use crate::context::Context;
use crate::k8s::SPEC_MANAGER;
use crate::kubeconfig::{self, SecretAction};
use crate::write_loops::Basis;
use crate::write_loops::Written;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};

/// Reason of the Warning Event when `<cluster>-kubeconfig` or `<cluster>-user-kubeconfig`
/// exists and this control plane is not its controller.
pub const SECRET_NOT_CONTROLLED: &str = "KubeconfigSecretNotControlled";

/// Creates or updates the kubeconfig Secrets of `cluster` (the Cluster whose
/// `spec.controlPlaneRef` names `cp`: the caller proved it) from the apply's connection
/// Secret: `<cluster>-kubeconfig` (what core connects with) and `<cluster>-user-kubeconfig`
/// (the `aws eks get-token` form for people, as Cluster API Provider AWS writes it). Each is
/// written only when the live Secret differs from the wanted one, and only when it is absent
/// (created, never taken over) or controlled by this control plane (updated with its uid as a
/// precondition). Does nothing without a connection Secret in the control plane's own
/// namespace, or before the outputs hold what a kubeconfig needs.
pub async fn ensure_kubeconfig(
    ctx: &Context,
    cp: &CAPTControlPlane,
    cluster: &Cluster,
    apply: &WorkspaceTemplateApply,
) -> Result<()> {
    let cluster = cluster.name_any();
    let (Some(ns), Some(uid)) = (cp.namespace(), cp.uid()) else {
        return Ok(());
    };
    let Some(secret_ref) = &apply.spec.write_connection_secret_to_ref else {
        return Ok(());
    };
    if secret_ref.namespace != ns {
        return Ok(());
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let connection = secrets
        .get_opt(&secret_ref.name)
        .await
        .map_err(kube_err(cp, "reading the connection Secret"))?;
    // Which connection Secret the kubeconfig is computed from (its version, not its data).
    let source = connection
        .as_ref()
        .and_then(|s| s.metadata.resource_version.clone());
    let Some(data) = connection.and_then(|s| s.data) else {
        return Ok(());
    };
    let region = cp
        .spec
        .control_plane_config
        .as_ref()
        .and_then(|c| c.region.as_deref());
    // The EKS cluster's name, when the outputs do not give it: what the apply passed.
    let eks_name = apply
        .spec
        .variables
        .as_ref()
        .and_then(|v| v.get(crate::names::CLUSTER_NAME))
        .map_or(cluster.as_str(), String::as_str);
    let owner = kubeconfig::controller_ref(
        &CAPTControlPlane::api_version(&()),
        &CAPTControlPlane::kind(&()),
        &cp.name_any(),
        &uid,
    );
    let wanted = [
        (
            kubeconfig::secret_name(&cluster),
            kubeconfig::kubeconfig(&data, &cluster, eks_name, region),
        ),
        (
            kubeconfig::user_secret_name(&cluster),
            kubeconfig::user_kubeconfig(&data, &cluster, eks_name, region),
        ),
    ];
    for (name, value) in wanted {
        let Some(value) = value else { continue };
        let desired = kubeconfig::desired_secret(&name, &cluster, &ns, owner.clone(), value);
        if ensure_secret(ctx, cp, &secrets, desired).await? {
            let written = Written::of::<Secret>(Some(&ns), &name, SPEC_MANAGER, None);
            let basis = Basis::of(cp.meta().generation, &(&source, &cluster, eks_name, region));
            ctx.wrote(written, basis, cp.object_ref(&())).await;
        }
    }
    Ok(())
}

/// Writes `desired` when the live Secret of its name is absent or this control plane's and
/// differs; true when it wrote.
async fn ensure_secret(
    ctx: &Context,
    cp: &CAPTControlPlane,
    secrets: &Api<Secret>,
    mut desired: Secret,
) -> Result<bool> {
    let (ns, name) = (desired.namespace().unwrap_or_default(), desired.name_any());
    let live = secrets
        .get_opt(&name)
        .await
        .map_err(kube_err(cp, "reading a kubeconfig Secret"))?;
    match kubeconfig::verdict(live.as_ref(), &desired) {
        SecretAction::UpToDate => return Ok(false),
        SecretAction::UserProvided => {
            tracing::debug!(
                subject = super::subject(cp),
                secret = name,
                "The kubeconfig Secret has another type: user-provided, left alone"
            );
            return Ok(false);
        }
        SecretAction::NotControlled(controller) => {
            let by = controller.unwrap_or_else(|| "no controller".into());
            let note = format!(
                "Secret {ns}/{name} exists and this CAPTControlPlane is not its controller \
                 ({by}): left alone"
            );
            tracing::warn!(subject = super::subject(cp), "{note}");
            ctx.warn(cp, SECRET_NOT_CONTROLLED, "WriteKubeconfig", note)
                .await;
            return Ok(false);
        }
        SecretAction::Write => {}
    }
    match live.and_then(|l| l.uid()) {
        // Absent: a create, which fails rather than take over a Secret made meanwhile.
        None => {
            let params = PostParams {
                field_manager: Some(SPEC_MANAGER.into()),
                ..PostParams::default()
            };
            secrets
                .create(&params, &desired)
                .await
                .map_err(kube_err(cp, "creating a kubeconfig Secret"))?;
        }
        // Ours: the uid is a precondition, so a Secret deleted and made again by someone
        // else since the read is not written.
        Some(live_uid) => {
            desired.metadata.uid = Some(live_uid);
            let params = PatchParams::apply(SPEC_MANAGER).force();
            secrets
                .patch(&name, &params, &Patch::Apply(&desired))
                .await
                .map_err(kube_err(cp, "applying a kubeconfig Secret"))?;
        }
    }
    tracing::info!(
        subject = super::subject(cp),
        secret = name,
        "Kubeconfig Secret written"
    );
    Ok(true)
}
