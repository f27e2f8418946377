//! CRD types of the four CAPT kinds, and the partial views of the upstream kinds we read.
//!
//! Optional fields are `Option`s skipped when `None`, so nothing we serialize carries `null`
//! (a `null` in an apply body would be a claim on the field). Conditions are list-type maps
//! keyed by `type`, so several field managers can own different conditions of one list.

mod captcluster;
mod captcontrolplane;
mod common;
mod external;
mod workspacetemplate;

pub use captcluster::*;
pub use captcontrolplane::*;
pub use common::*;
pub use external::*;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::Path;

    /// `manifests/crds/` must hold exactly what the types generate: run
    /// `cargo run -p capt-controller --bin crdgen -- manifests/crds` after changing a type.
    #[test]
    fn committed_crd_yaml_matches_the_rust_types() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/crds");
        let generated = crd_files().unwrap();
        for (file, yaml) in &generated {
            let committed = std::fs::read_to_string(dir.join(file))
                .unwrap_or_else(|e| panic!("manifests/crds/{file}: {e}; regenerate with crdgen"));
            assert!(
                committed == *yaml,
                "manifests/crds/{file} differs from the types; regenerate with crdgen"
            );
        }
        let committed: BTreeSet<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let expected: BTreeSet<String> = generated.into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            committed, expected,
            "manifests/crds/ holds files the types do not generate"
        );
    }

    #[test]
    fn conditions_are_list_maps_keyed_by_type_in_every_crd() {
        for (file, yaml) in crd_files().unwrap() {
            let lists = yaml.matches("x-kubernetes-list-type: map").count();
            let conditions = yaml.matches("conditions:").count();
            assert_eq!(
                lists, conditions,
                "{file}: every conditions list is a list-type map"
            );
            assert!(
                yaml.contains("x-kubernetes-list-map-keys:\n                - type")
                    || conditions == 0,
                "{file}"
            );
        }
    }
}
