//! Whose an object is, proven from what it and the objects it names say: the Cluster an
//! object belongs to and whether that Cluster names it back, whether an apply is an owner's
//! to change or delete, and which Workspace is an apply's. Pure: the reconcilers' observations
//! ([`super::observe`]) and decisions ask these questions of what they hold.

use super::{OWNER_KIND_LABEL, OWNER_NAME_LABEL, OWNER_NAMESPACE_LABEL};
use crate::api::{
    CAPTCluster, CAPTControlPlane, Cluster, ContractVersionedObjectReference, TerraformWorkspace,
    WorkspaceTemplateApply,
};
use crate::render::{CLUSTER_NAME_LABEL, legacy_workspace_name, workspace_name};
use crate::tenancy::{ApplyClaim, Placement};
use kube::{Resource, ResourceExt};

/// Annotation marking an apply the controller adopted rather than created: its spec is the
/// user's and is left alone. (The user asks for an adoption with
/// [`crate::tenancy::ADOPT_ANNOTATION`].)
pub const ADOPTED_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/adopted";

/// The name of the Cluster an object belongs to: its owner reference of kind Cluster, else
/// the `cluster.x-k8s.io/cluster-name` label.
pub fn cluster_name<K: Resource>(obj: &K) -> Option<String> {
    cluster_name_in(obj).map(str::to_owned)
}

/// [`cluster_name`], borrowed from the object: what a scan of a cache compares, without a
/// copy per object.
pub fn cluster_name_in<K: Resource>(obj: &K) -> Option<&str> {
    let meta = obj.meta();
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Cluster" && o.api_version.starts_with("cluster.x-k8s.io/"))
        .map(|o| o.name.as_str())
        .or_else(|| {
            meta.labels
                .as_ref()?
                .get(CLUSTER_NAME_LABEL)
                .map(String::as_str)
        })
}

/// True when the Cluster's `spec.controlPlaneRef` names `cp`: a CAPTControlPlane (group and
/// kind) of that name in the Cluster's namespace (a v1beta2 reference has no namespace of its
/// own).
///
/// This, not the control plane's `cluster.x-k8s.io/cluster-name` label nor an owner reference
/// (both written by whoever writes the control plane), proves which Cluster a control plane
/// is the control plane of: only the Cluster's own spec says so.
pub fn names_control_plane(cluster: &Cluster, cp: &CAPTControlPlane) -> bool {
    names(cluster, cluster.spec.control_plane_ref.as_ref(), cp)
}

/// True when the Cluster's `spec.infrastructureRef` names `cc` ([`names_control_plane`],
/// for the infrastructure cluster).
pub fn names_infrastructure(cluster: &Cluster, cc: &CAPTCluster) -> bool {
    names(cluster, cluster.spec.infrastructure_ref.as_ref(), cc)
}

/// True when `r`, a reference of `cluster`, names `obj`: its group, kind and name, in the
/// Cluster's namespace.
fn names<K: Resource<DynamicType = ()>>(
    cluster: &Cluster,
    r: Option<&ContractVersionedObjectReference>,
    obj: &K,
) -> bool {
    r.is_some_and(|r| r.names::<K>(&obj.name_any())) && cluster.namespace() == obj.namespace()
}

/// Whether `apply` is `owner`'s, from its owner labels and the adopt annotation.
pub fn claim_of<K: Resource<DynamicType = ()>>(
    owner: &K,
    apply: &WorkspaceTemplateApply,
) -> ApplyClaim {
    let (kind, name, ns) = (
        K::kind(&()),
        owner.name_any(),
        owner.namespace().unwrap_or_default(),
    );
    crate::tenancy::apply_claim(
        apply.labels(),
        apply.annotations(),
        [
            (OWNER_KIND_LABEL, &kind),
            (OWNER_NAME_LABEL, &name),
            (OWNER_NAMESPACE_LABEL, &ns),
        ],
    )
}

/// `Ok` when `apply` is provably `owner`'s to delete or orphan: its owner labels name the
/// owner (an apply the owner adopted carries them too). `spec.workspaceTemplateApplyName` is
/// the user's to write, so the name alone proves nothing; an apply that is only adoptable was
/// never taken and is not the owner's either. `Err` says why not.
pub fn ours_to_remove<K: Resource<DynamicType = ()>>(
    owner: &K,
    apply: &WorkspaceTemplateApply,
) -> Result<(), String> {
    match claim_of(owner, apply) {
        ApplyClaim::Ours => Ok(()),
        ApplyClaim::Adoptable => Err("it was never adopted (it has no owner labels)".into()),
        ApplyClaim::NotOurs(why) => Err(why),
    }
}

/// The Workspace of an apply, as found: which name it uses ([`Placement`]) and the
/// Workspace under that name, if any (another's included, for the apply to report).
#[derive(Clone, Debug)]
pub struct Located {
    /// Which Workspace the apply uses, or whose Workspace holds its name.
    pub placement: Placement,
    /// The Workspace under that name.
    pub workspace: Option<TerraformWorkspace>,
}

impl Located {
    /// The apply's own Workspace, if it exists: never another's.
    pub fn own(&self) -> Option<&TerraformWorkspace> {
        match self.placement {
            Placement::Use { .. } => self.workspace.as_ref(),
            Placement::Taken { .. } => None,
        }
    }
}

/// The names the Workspace of the apply `namespace`/`name` may have: [`workspace_name`],
/// and [`legacy_workspace_name`] (a Workspace rendered before names carried the namespace).
pub fn workspace_names(namespace: &str, name: &str) -> [String; 2] {
    [
        workspace_name(namespace, name),
        legacy_workspace_name(namespace, name),
    ]
}

/// Finds the Workspace of `apply` among those `workspace` answers by name: under
/// [`workspace_name`] when it is the apply's, else under [`legacy_workspace_name`] when that
/// one is provably the apply's (`crate::tenancy::place_workspace`). Level-triggered: decided
/// from what exists each time, nothing remembered.
pub fn locate(
    apply: &WorkspaceTemplateApply,
    workspace: impl Fn(&str) -> Option<TerraformWorkspace>,
) -> Located {
    let (ns, name, uid) = (
        apply.namespace().unwrap_or_default(),
        apply.name_any(),
        apply.uid(),
    );
    let current = workspace(&workspace_name(&ns, &name));
    let place = |current: Option<&TerraformWorkspace>, legacy: Option<&TerraformWorkspace>| {
        crate::tenancy::place_workspace(
            &ns,
            &name,
            uid.as_deref(),
            current.map(|w| w.labels()),
            legacy.map(|w| w.labels()),
        )
    };
    let placement = place(current.as_ref(), None);
    if matches!(placement, Placement::Use { exists: true, .. }) {
        return Located {
            placement,
            workspace: current,
        };
    }
    let legacy_name = legacy_workspace_name(&ns, &name);
    let legacy = match legacy_name != placement.name() {
        true => workspace(&legacy_name),
        false => None,
    };
    let placement = place(current.as_ref(), legacy.as_ref());
    let workspace = match &placement {
        Placement::Use { exists: false, .. } => None,
        Placement::Use { name, .. } if *name != workspace_name(&ns, &apply.name_any()) => legacy,
        _ => current,
    };
    Located {
        placement,
        workspace,
    }
}
