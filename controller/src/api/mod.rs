//! CRD types of the four CAPT kinds, and the partial views of the upstream kinds we read.
//!
//! Optional fields are `Option`s skipped when `None`, so nothing we serialize carries `null`
//! (a `null` in an apply body would be a claim on the field). Conditions are list-type maps
//! keyed by `type`, so several field managers can own different conditions of one list.

pub mod bounds;
mod captcluster;
mod captcontrolplane;
mod common;
mod external;
mod templates;
mod workspacetemplate;

pub use captcluster::*;
pub use captcontrolplane::*;
pub use common::*;
pub use external::*;
pub use templates::*;
pub use workspacetemplate::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The labels through which Cluster API core resolves a reference's apiVersion and the
/// contract it reads: each maps a contract version to the CRD versions that implement it (the
/// last one is used). Core uses the newest contract it knows: v1beta2 from v1.11 on; the
/// v1beta1 label stays for the transition (our v1beta1 API still carries the v1beta1
/// contract's `ready`/`initialized`).
pub const CONTRACT_LABELS: [(&str, &str); 2] = [
    ("cluster.x-k8s.io/v1beta1", "v1beta1"),
    ("cluster.x-k8s.io/v1beta2", "v1beta1"),
];

/// Every CRD this project defines, each labelled with the contract it implements.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        CAPTCluster::crd(),
        CAPTControlPlane::crd(),
        WorkspaceTemplate::crd(),
        WorkspaceTemplateApply::crd(),
        CAPTClusterTemplate::crd(),
        CAPTControlPlaneTemplate::crd(),
    ];
    for crd in &mut crds {
        let labels = crd.metadata.labels.get_or_insert_with(Default::default);
        for (contract, versions) in CONTRACT_LABELS {
            labels.insert(contract.into(), versions.into());
        }
    }
    crds
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
    fn every_crd_names_the_contract_version_it_implements() {
        for crd in crds() {
            let labels = crd.metadata.labels.unwrap_or_default();
            let versions: Vec<&str> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
            for (contract, _) in CONTRACT_LABELS {
                let label = labels.get(contract).map(String::as_str);
                assert!(
                    label.is_some_and(|l| l.split('_').all(|v| versions.contains(&v))),
                    "{:?}: contract label {contract}={label:?} must list served versions {versions:?}",
                    crd.metadata.name
                );
            }
        }
    }

    #[test]
    fn conditions_are_list_maps_keyed_by_type_in_every_crd() {
        for (file, yaml) in crd_files().unwrap() {
            let lines: Vec<&str> = yaml.lines().map(str::trim).collect();
            let keyed_by_type = lines
                .windows(2)
                .filter(|w| w == &["x-kubernetes-list-map-keys:", "- type"])
                .count();
            let conditions = lines.iter().filter(|l| **l == "conditions:").count();
            assert_eq!(
                keyed_by_type, conditions,
                "{file}: every conditions list is a list-type map keyed by type"
            );
        }
    }
}
