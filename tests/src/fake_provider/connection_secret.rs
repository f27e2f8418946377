//! The connection Secret a Workspace asks for (`spec.writeConnectionSecretToRef`): its
//! reference, its body, and whether it needs a write.

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

/// The connection Secret (server-side apply body): every output as data, type
/// [`SECRET_TYPE`], controlled by the Workspace `owner` (name, uid) when its uid is known.
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
            block_owner_deletion: None,
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

/// Whether the `current` Secret differs from the `desired` one in type, data or owner.
pub fn secret_needs_write(current: Option<&Secret>, desired: &Secret) -> bool {
    let Some(current) = current else {
        return true;
    };
    let empty = BTreeMap::new();
    let uids = |s: &Secret| -> Vec<String> {
        s.metadata
            .owner_references
            .iter()
            .flatten()
            .map(|o| o.uid.clone())
            .collect()
    };
    current.type_ != desired.type_
        || current.data.as_ref().unwrap_or(&empty) != desired.data.as_ref().unwrap_or(&empty)
        || uids(desired).iter().any(|u| !uids(current).contains(u))
}
