//! The Cluster's `<cluster>-kubeconfig` Secret (Cluster API control-plane contract) and its
//! `<cluster>-user-kubeconfig` for people, kept equal to what [`crate::kubeconfig`] computes
//! from the control plane's connection Secret: the steps that keep them, decided from what
//! was read. Pure. Secret data is never logged and never put into an error.

use super::plan::{Object, Progress, SPEC_MANAGER, Sealed, Step, Warning, Wrote};
use crate::api::{CAPTControlPlane, Cluster, WorkspaceTemplateApply};
use crate::kubeconfig::{self, SecretAction};
use crate::write_loops::{Basis, Written};
use k8s_openapi::api::core::v1::Secret;
use kube::{Resource, ResourceExt};

/// Reason of the Warning Event when `<cluster>-kubeconfig` or `<cluster>-user-kubeconfig`
/// exists and this control plane is not its controller.
pub const SECRET_NOT_CONTROLLED: &str = "KubeconfigSecretNotControlled";

/// What reading the apply's connection Secret is: a failure's action, and its answer's key.
pub const READING_CONNECTION: &str = "reading the connection Secret";

/// What reading a kubeconfig Secret is: a failure's action, and its answer's key.
pub const READING_KUBECONFIG: &str = "reading a kubeconfig Secret";

/// The apply's connection Secret, when it is in the control plane's namespace: Secrets never
/// cross namespaces, and one elsewhere is not read (the apply reports it).
pub fn connection_secret(cp: &CAPTControlPlane, apply: &WorkspaceTemplateApply) -> Option<Object> {
    let secret_ref = apply.spec.write_connection_secret_to_ref.as_ref()?;
    (Some(&secret_ref.namespace) == cp.namespace().as_ref())
        .then(|| Object::named::<Secret>(&secret_ref.namespace, &secret_ref.name))
}

/// What keeping the kubeconfig Secrets takes now.
#[derive(Debug, PartialEq)]
pub enum Keeping {
    /// Reads first: the connection Secret, then the live kubeconfig Secrets.
    Read(Vec<Step>),
    /// The writes and Warnings (none when every Secret is as wanted).
    Write(Vec<Step>),
}

/// The steps that keep the kubeconfig Secrets of `cluster` (the Cluster whose
/// `spec.controlPlaneRef` names `cp`: the caller proved it) from the apply's connection
/// Secret: `<cluster>-kubeconfig` (what core connects with) and `<cluster>-user-kubeconfig`
/// (the `aws eks get-token` form for people, as Cluster API Provider AWS writes it). Each is
/// written only when the live Secret differs from the wanted one, and only when it is absent
/// (created, never taken over) or controlled by this control plane (updated with its uid as
/// a precondition). Nothing without a connection Secret in the control plane's own
/// namespace, or before the outputs hold what a kubeconfig needs.
pub fn keep(
    cp: &CAPTControlPlane,
    cluster: &Cluster,
    apply: &WorkspaceTemplateApply,
    progress: &Progress,
) -> Keeping {
    let cluster = cluster.name_any();
    let (Some(ns), Some(uid), Some(connection)) =
        (cp.namespace(), cp.uid(), connection_secret(cp, apply))
    else {
        return Keeping::Write(vec![]);
    };
    let Some(read) = progress.read::<Secret>(READING_CONNECTION, &connection.name) else {
        let doing = READING_CONNECTION;
        return Keeping::Read(vec![Step::Read {
            object: connection,
            doing,
        }]);
    };
    // Which connection Secret the kubeconfig is computed from (its version, not its data).
    let source = read
        .as_ref()
        .and_then(|s| s.metadata.resource_version.clone());
    let Some(data) = read.and_then(|s| s.data) else {
        return Keeping::Write(vec![]);
    };
    let region = (cp.spec.control_plane_config.as_ref()).and_then(|c| c.region.as_deref());
    // The EKS cluster's name, when the outputs do not give it: what the apply passed.
    let eks_name = (apply.spec.variables.as_ref())
        .and_then(|v| v.get(crate::names::CLUSTER_NAME))
        .map_or(cluster.as_str(), String::as_str);
    let owner = kubeconfig::controller_ref(
        &CAPTControlPlane::api_version(&()),
        &CAPTControlPlane::kind(&()),
        &cp.name_any(),
        &uid,
    );
    let wanted: Vec<Secret> = [
        (
            kubeconfig::secret_name(&cluster),
            kubeconfig::kubeconfig(&data, &cluster, eks_name, region),
        ),
        (
            kubeconfig::user_secret_name(&cluster),
            kubeconfig::user_kubeconfig(&data, &cluster, eks_name, region),
        ),
    ]
    .into_iter()
    .filter_map(|(name, value)| {
        let value = value?;
        Some(kubeconfig::desired_secret(
            &name,
            &cluster,
            &ns,
            owner.clone(),
            value,
        ))
    })
    .collect();
    let unread: Vec<Step> = (wanted.iter())
        .filter(|s| {
            progress
                .read::<Secret>(READING_KUBECONFIG, &s.name_any())
                .is_none()
        })
        .map(|s| Step::Read {
            object: Object::named::<Secret>(&ns, &s.name_any()),
            doing: READING_KUBECONFIG,
        })
        .collect();
    if !unread.is_empty() {
        return Keeping::Read(unread);
    }
    let basis = Basis::of(cp.meta().generation, &(&source, &cluster, eks_name, region));
    let steps = (wanted.into_iter())
        .filter_map(|desired| {
            let live = progress.read::<Secret>(READING_KUBECONFIG, &desired.name_any());
            keep_secret(cp, live.flatten(), desired, &basis)
        })
        .collect();
    Keeping::Write(steps)
}

/// What keeping `desired` takes, beside the `live` Secret of its name: a write when that is
/// absent or this control plane's and differs; a Warning when it is another's; else nothing.
fn keep_secret(
    cp: &CAPTControlPlane,
    live: Option<Secret>,
    mut desired: Secret,
    basis: &Basis,
) -> Option<Step> {
    let (ns, name) = (desired.namespace().unwrap_or_default(), desired.name_any());
    match kubeconfig::verdict(live.as_ref(), &desired) {
        SecretAction::UpToDate => None,
        SecretAction::UserProvided => {
            tracing::debug!(
                subject = super::subject(cp),
                secret = name,
                "The kubeconfig Secret has another type: user-provided, left alone"
            );
            None
        }
        SecretAction::NotControlled(controller) => {
            let by = controller.unwrap_or_else(|| "no controller".into());
            let note = format!(
                "Secret {ns}/{name} exists and this CAPTControlPlane is not its controller \
                 ({by}): left alone"
            );
            tracing::warn!(subject = super::subject(cp), "{note}");
            let warning = Warning::about(cp, SECRET_NOT_CONTROLLED, "WriteKubeconfig", note);
            Some(Step::Warn(warning))
        }
        SecretAction::Write => {
            // Absent: no uid, a create. Ours: its uid, a precondition, so that a Secret
            // deleted and made again by someone else since the read is not written.
            desired.metadata.uid = live.and_then(|l| l.uid());
            let doing = match desired.metadata.uid {
                None => "creating a kubeconfig Secret",
                Some(_) => "applying a kubeconfig Secret",
            };
            let written = Written::of::<Secret>(Some(&ns), &name, SPEC_MANAGER, None);
            Some(Step::WriteSecret {
                secret: Sealed(Box::new(desired)),
                doing,
                wrote: Wrote {
                    written,
                    basis: *basis,
                    regarding: cp.object_ref(&()),
                },
            })
        }
    }
}
