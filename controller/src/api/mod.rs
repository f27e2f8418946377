//! CRD types of the four CAPT kinds, and the partial views of the upstream kinds we read.
//!
//! Optional fields are `Option`s skipped when `None`, so nothing we serialize carries `null`
//! (a `null` in an apply body would be a claim on the field). Conditions are list-type maps
//! keyed by `type`, so several field managers can own different conditions of one list.

mod captcluster;
mod captcontrolplane;
mod common;
mod workspacetemplate;

pub use captcluster::*;
pub use captcontrolplane::*;
pub use common::*;
pub use workspacetemplate::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Every CRD this project defines.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        CAPTCluster::crd(),
        CAPTControlPlane::crd(),
        WorkspaceTemplate::crd(),
        WorkspaceTemplateApply::crd(),
    ]
}

/// The CRD manifests as `(file name, YAML)`, in the layout of `manifests/crds/`.
pub fn crd_files() -> Result<Vec<(String, String)>, serde_yaml::Error> {
    crds()
        .into_iter()
        .map(|crd| {
            let file = format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or_default());
            Ok((file, serde_yaml::to_string(&crd)?))
        })
        .collect()
}
