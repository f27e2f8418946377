//! Lookups several reconcilers share: the owning Cluster, the applies they create, the
//! Workspace of an apply and the connection Secret's endpoint.

use super::{OWNER_KIND_LABEL, OWNER_NAME_LABEL, OWNER_NAMESPACE_LABEL, Result, kube_err};
use crate::api::{Cluster, TerraformWorkspace, WorkspaceTemplateApply};
use crate::context::Context;
use crate::k8s::SPEC_MANAGER;
use crate::render::{CLUSTER_NAME_LABEL, workspace_name};
use crate::status::workspace::WorkspaceObservation;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

/// Annotation marking an apply the controller adopted rather than created: its spec is the
/// user's and is left alone.
pub const ADOPTED_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/adopted";

/// The name of the Cluster an object belongs to: its owner reference of kind Cluster, else
/// the `cluster.x-k8s.io/cluster-name` label.
pub fn cluster_name<K: Resource>(obj: &K) -> Option<String> {
    obj.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Cluster" && o.api_version.starts_with("cluster.x-k8s.io/"))
        .map(|o| o.name.clone())
        .or_else(|| obj.meta().labels.as_ref()?.get(CLUSTER_NAME_LABEL).cloned())
}

/// The Cluster an object belongs to, if it exists.
pub async fn owning_cluster<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    obj: &K,
) -> Result<Option<Cluster>> {
    let Some(name) = cluster_name(obj) else {
        return Ok(None);
    };
    let api: Api<Cluster> =
        Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
    api.get_opt(&name)
        .await
        .map_err(kube_err(obj, "reading its Cluster"))
}

/// What to create when an object has no apply yet.
pub struct ApplySpec {
    /// The apply's name.
    pub name: String,
    /// Its `spec`.
    pub spec: Value,
}

/// Creates the object's apply, or adopts an existing one of that name (the migration path:
/// its spec stays the user's; it gains our labels). Returns the apply.
pub async fn ensure_apply<K>(
    ctx: &Context,
    owner: &K,
    wanted: ApplySpec,
) -> Result<WorkspaceTemplateApply>
where
    K: Resource<DynamicType = ()>,
{
    let ns = owner.namespace().unwrap_or_default();
    let api: Api<WorkspaceTemplateApply> = Api::namespaced(ctx.client.clone(), &ns);
    let existing = api
        .get_opt(&wanted.name)
        .await
        .map_err(kube_err(owner, "reading its WorkspaceTemplateApply"))?;
    let adopted = existing.as_ref().is_some_and(|a| {
        !a.labels().contains_key(OWNER_KIND_LABEL)
            || a.annotations().contains_key(ADOPTED_ANNOTATION)
    });
    let mut labels = json!({
        OWNER_KIND_LABEL: K::kind(&()), OWNER_NAME_LABEL: owner.name_any(), OWNER_NAMESPACE_LABEL: ns,
    });
    if let Some(cluster) = cluster_name(owner) {
        labels[CLUSTER_NAME_LABEL] = json!(cluster);
    }
    // No owner reference: the garbage collector would delete the apply as soon as its owner
    // is deleted, racing the deletion order (the control plane before the VPC). The owner's
    // finalizer deletes it instead, in order; the labels map events back to the owner.
    let mut body = json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": wanted.name, "namespace": ns, "labels": labels},
    });
    if adopted {
        body["metadata"]["annotations"] = json!({ADOPTED_ANNOTATION: "true"});
        body["metadata"]["uid"] = json!(existing.as_ref().and_then(|a| a.uid()));
    } else {
        body["spec"] = wanted.spec;
    }
    // Applying what is already there changes nothing at the server but still costs a write
    // on every reconcile: skip it. The spec must match exactly (a field we stopped wanting
    // must go); labels and annotations only need to be there (others may add theirs).
    if let Some(existing) = existing {
        let live = serde_json::to_value(&existing).unwrap_or_default();
        let spec_matches = adopted || live.get("spec") == body.get("spec");
        if spec_matches && contains(&live["metadata"], &body["metadata"]) {
            return Ok(existing);
        }
    }
    let params = PatchParams::apply(SPEC_MANAGER).force();
    api.patch(&wanted.name, &params, &Patch::Apply(&body))
        .await
        .map_err(kube_err(owner, "applying its WorkspaceTemplateApply"))
}

/// True when every field of `wanted` is in `live` with the same value.
pub fn contains(live: &Value, wanted: &Value) -> bool {
    match (live, wanted) {
        (Value::Object(live), Value::Object(wanted)) => wanted
            .iter()
            .all(|(k, v)| live.get(k).is_some_and(|l| contains(l, v))),
        (live, wanted) => live == wanted,
    }
}

/// Gives an apply up (`retainVpcOnDelete`): drops any owner reference an adopted apply
/// carried, so that the garbage collector leaves it (and its Workspace) in place.
pub async fn orphan_apply<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    owner: &K,
    apply: &WorkspaceTemplateApply,
) -> Result<()> {
    if apply.owner_references().is_empty() {
        return Ok(());
    }
    let api: Api<WorkspaceTemplateApply> =
        Api::namespaced(ctx.client.clone(), &apply.namespace().unwrap_or_default());
    let patch = json!({"metadata": {"ownerReferences": null}});
    api.patch(
        &apply.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(kube_err(owner, "orphaning its WorkspaceTemplateApply"))?;
    Ok(())
}

/// The apply of `name` in the owner's namespace, if it exists.
pub async fn get_apply<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    owner: &K,
    name: &str,
) -> Result<Option<WorkspaceTemplateApply>> {
    let api: Api<WorkspaceTemplateApply> =
        Api::namespaced(ctx.client.clone(), &owner.namespace().unwrap_or_default());
    api.get_opt(name)
        .await
        .map_err(kube_err(owner, "reading its WorkspaceTemplateApply"))
}

/// The Workspace an apply renders, observed; `None` when it does not exist.
pub async fn observe_workspace<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    owner: &K,
    apply: &WorkspaceTemplateApply,
) -> Result<Option<WorkspaceObservation>> {
    let api: Api<TerraformWorkspace> = Api::all(ctx.client.clone());
    let found = api
        .get_opt(&workspace_name(apply))
        .await
        .map_err(kube_err(owner, "reading its Workspace"))?;
    Ok(found
        .map(|w| WorkspaceObservation::from_json(&serde_json::to_value(&w).unwrap_or_default())))
}

/// The `cluster_endpoint` key of the apply's connection Secret. Only that key is read, and
/// its value is never logged.
pub async fn secret_endpoint<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    owner: &K,
    apply: &WorkspaceTemplateApply,
) -> Result<Option<String>> {
    let Some(secret_ref) = &apply.spec.write_connection_secret_to_ref else {
        return Ok(None);
    };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &secret_ref.namespace);
    let secret = api
        .get_opt(&secret_ref.name)
        .await
        .map_err(kube_err(owner, "reading the connection Secret"))?;
    Ok(secret
        .and_then(|s| s.data)
        .and_then(|d| d.get("cluster_endpoint").cloned())
        .and_then(|v| String::from_utf8(v.0).ok()))
}
