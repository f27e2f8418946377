//! The connection Secret a Workspace asks for (`spec.writeConnectionSecretToRef`): its
//! reference, its body, and whether it needs a write.
//!
//! As crossplane-runtime v1.16.0 publishes it (`pkg/reconciler/managed/api.go`
//! `APISecretPublisher`, `pkg/resource/api.go` `APIPatchingApplicator`,
//! `pkg/resource/resource.go` `ConnectionSecretFor`): created when missing, otherwise sent as
//! a JSON merge patch of the whole desired Secret, and only when its data differs. A merge
//! patch never removes a key, so an output that disappears stays in the Secret.
//! `UnpublishConnection` does nothing: the Secret goes with its owner, by garbage collection.

use super::{API_VERSION, Desired, KIND, SECRET_TYPE};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::Value;
use std::collections::BTreeMap;

/// `spec.writeConnectionSecretToRef`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    /// The Secret's namespace.
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
}

/// The connection Secret a Workspace spec asks for, if any.
pub fn connection_secret_ref(spec: Option<&Value>) -> Option<SecretRef> {
    let r = spec?.get("writeConnectionSecretToRef")?;
    let field = |k: &str| {
        r.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    Some(SecretRef {
        namespace: field("namespace")?,
        name: field("name")?,
    })
}

/// The connection Secret: every output (sensitive ones too) as data, type [`SECRET_TYPE`],
/// controlled by the Workspace `owner` (name, uid; `blockOwnerDeletion`) when its uid is known.
pub fn connection_secret(
    reference: &SecretRef,
    owner: (&str, Option<&str>),
    desired: &Desired,
) -> Secret {
    let owner_references = owner.1.map(|uid| {
        vec![OwnerReference {
            api_version: API_VERSION.to_owned(),
            kind: KIND.to_owned(),
            name: owner.0.to_owned(),
            uid: uid.to_owned(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]
    });
    Secret {
        metadata: ObjectMeta {
            name: Some(reference.name.clone()),
            namespace: Some(reference.namespace.clone()),
            owner_references,
            ..ObjectMeta::default()
        },
        type_: Some(SECRET_TYPE.to_owned()),
        data: Some(
            desired
                .connection_data()
                .into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Secret::default()
    }
}

/// Whether the publisher writes: the Secret is missing, or its data differs from the
/// desired data (an empty and a missing `data` are equal). Type and owner are not compared.
pub fn secret_needs_write(current: Option<&Secret>, desired: &Secret) -> bool {
    let Some(current) = current else {
        return true;
    };
    let empty = BTreeMap::new();
    current.data.as_ref().unwrap_or(&empty) != desired.data.as_ref().unwrap_or(&empty)
}
