//! The spec-side writes the controller makes itself, all with server-side apply under the
//! field managers below, and each carrying the object's uid so that nothing is ever created
//! by accident or written to a recreated object.

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::fmt::Debug;

pub use crate::reconcile::plan::{FINALIZER_MANAGER, SPEC_MANAGER};

/// Adds (`present`) or removes our finalizer; finalizers are a set, so other owners' stay.
/// Answers the object as its write left it, when it wrote: a reconcile goes on with that,
/// not with the cached object, whose version the applier would plan an apply on in vain.
pub async fn set_finalizer<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
    present: bool,
) -> kube::Result<Option<K>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    if obj.finalizers().iter().any(|f| f == finalizer) == present {
        return Ok(None);
    }
    let finalizers: Vec<&str> = if present { vec![finalizer] } else { vec![] };
    let body = identity(obj, json!({"metadata": {"finalizers": finalizers}}));
    match api
        .patch(
            &obj.name_any(),
            &PatchParams::apply(FINALIZER_MANAGER),
            &Patch::Apply(body),
        )
        .await
    {
        // Removing: the object is already gone (our removal was its last finalizer).
        Err(e) if !present && gone(&e) => Ok(None),
        Err(e) => Err(e),
        Ok(written) => Ok(Some(written)),
    }
}

/// True when a write failed because its object is gone: not found, or another object (of
/// another uid) under its name.
pub fn gone(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 404 || s.message.contains("uid mismatch"))
}

/// Applies `fields` (e.g. `{"spec": {...}}`) to an existing object under [`SPEC_MANAGER`].
pub async fn apply_fields<K>(api: &Api<K>, obj: &K, fields: Value) -> kube::Result<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let body = identity(obj, fields);
    api.patch(
        &obj.name_any(),
        &PatchParams::apply(SPEC_MANAGER),
        &Patch::Apply(body),
    )
    .await
}

/// `fields` with the object's apiVersion, kind, name, namespace and uid.
fn identity<K: Resource<DynamicType = ()>>(obj: &K, fields: Value) -> Value {
    crate::reconcile::plan::Object::of(obj).fields(fields)
}
