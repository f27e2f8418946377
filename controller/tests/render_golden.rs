//! Golden files of rendered Workspaces: the samples' templates (`manifests/samples/`) and edge
//! cases, each rendered from a fixed apply and compared with `tests/golden/<case>.yaml`.
//!
//! A rendering that changes changes the Workspaces it would write, and with them Terraform
//! runs. Such a change is deliberate: raise `render::RENDERING` (so that existing Workspaces
//! keep their rendering until their inputs change), name it in CHANGELOG.md, and rewrite the
//! files with `CAPT_UPDATE_GOLDEN=1 cargo test -p capt-controller --test render_golden`. The
//! rewrite refuses a changed rendering of the same inputs under the same `RENDERING`.

use capt_controller::api::{WorkspaceTemplate, WorkspaceTemplateApply};
use capt_controller::render::{
    INPUTS_ANNOTATION, RENDERING_ANNOTATION, legacy_workspace_name, render_workspace,
    workspace_name_of,
};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// Set to rewrite the golden files from the current rendering.
const UPDATE_VARIABLE: &str = "CAPT_UPDATE_GOLDEN";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn sample_template(name: &str) -> WorkspaceTemplate {
    let text = std::fs::read_to_string(repo_root().join("manifests/samples/templates.yaml"))
        .expect("manifests/samples/templates.yaml");
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_yaml::from_value::<Value>(serde_yaml::Value::deserialize(doc).unwrap()))
        .map(|doc| doc.expect("a YAML document"))
        .find(|doc| doc["kind"] == "WorkspaceTemplate" && doc["metadata"]["name"] == name)
        .map(|doc| serde_json::from_value(doc).expect("a WorkspaceTemplate"))
        .unwrap_or_else(|| panic!("no WorkspaceTemplate {name} in the samples"))
}

use serde::Deserialize as _;

fn template(name: &str, body: Value) -> WorkspaceTemplate {
    serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
        "metadata": {"name": name, "namespace": "default"}, "spec": body,
    }))
    .unwrap()
}

/// An apply as the API server returns it: uid, generation, the owner labels of a CAPT object.
fn apply(name: &str, owner_kind: &str, spec: Value) -> WorkspaceTemplateApply {
    serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": name, "namespace": "default", "generation": 3,
            "uid": format!("00000000-0000-0000-0000-{:0>12}", name.len()),
            "labels": {
                "infrastructure.cluster.x-k8s.io/owner-kind": owner_kind,
                "infrastructure.cluster.x-k8s.io/owner-name": "demo",
                "infrastructure.cluster.x-k8s.io/owner-namespace": "default",
                "cluster.x-k8s.io/cluster-name": "demo",
                "unrelated": "not rendered"}},
        "spec": spec,
    }))
    .unwrap()
}

/// Every case: its file name, the apply, the template, and the Workspace name in use.
fn cases() -> Vec<(
    &'static str,
    WorkspaceTemplateApply,
    WorkspaceTemplate,
    String,
)> {
    let vpc = apply(
        "demo-vpc",
        "CAPTCluster",
        json!({"templateRef": {"name": "vpc"},
            "variables": {"CLUSTER_NAME": "demo", "REGION": "ap-northeast-1"},
            "writeConnectionSecretToRef": {"name": "demo-vpc-connection", "namespace": "default"}}),
    );
    let eks = apply(
        "demo-eks",
        "CAPTControlPlane",
        json!({"templateRef": {"name": "eks"},
            "variables": {"CLUSTER_NAME": "demo", "KUBERNETES_VERSION": "1.31", "REGION": "ap-northeast-1"},
            "writeConnectionSecretToRef": {"name": "demo-eks-connection", "namespace": "default"}}),
    );
    let standalone = |template: &str| {
        apply(
            "alone",
            "None",
            json!({"templateRef": {"name": template}, "variables": {"NAME": "alone"}}),
        )
    };
    let remote = template(
        "remote",
        json!({"template": {"spec": {"forProvider": {"source": "Remote",
            "module": "git::https://example.com/vpc.git?ref=v1.2.0",
            "vars": [{"key": "name", "value": "${NAME}"}]}}}}),
    );
    let inline_json = template(
        "inline-json",
        json!({"template": {"metadata": {"labels": {"team": "${NAME}"}},
            "spec": {"forProvider": {"source": "Inline", "inlineFormat": "JSON",
            "module": "{\"output\": {\"name\": {\"value\": \"${NAME}\"}}}"}}}}),
    );
    let named_policy = template(
        "named-policy",
        json!({"template": {"spec": {"deletionPolicy": "Delete",
            "providerConfigRef": {"name": "default"},
            "forProvider": {"source": "Inline", "module": "output \"n\" { value = \"${NAME}\" }"}}},
            "writeConnectionSecretToRef": {"name": "template-secret", "namespace": "default"}}),
    );
    let legacy_name = legacy_workspace_name("default", "alone");
    vec![
        (
            "sample-vpc",
            vpc.clone(),
            sample_template("vpc"),
            workspace_name_of(&vpc),
        ),
        (
            "sample-eks",
            eks.clone(),
            sample_template("eks"),
            workspace_name_of(&eks),
        ),
        (
            "remote-module",
            standalone("remote"),
            remote,
            workspace_name_of(&standalone("remote")),
        ),
        (
            "inline-json-module",
            standalone("inline-json"),
            inline_json,
            workspace_name_of(&standalone("inline-json")),
        ),
        (
            "template-names-deletion-policy-and-secret",
            standalone("named-policy"),
            named_policy.clone(),
            workspace_name_of(&standalone("named-policy")),
        ),
        (
            "legacy-workspace-name",
            standalone("named-policy"),
            named_policy,
            legacy_name,
        ),
    ]
}

fn golden_path(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{case}.yaml"))
}

#[test]
fn every_rendering_matches_its_golden_file() {
    let update = std::env::var_os(UPDATE_VARIABLE).is_some();
    let mut failures = Vec::new();
    for (case, apply, template, name) in cases() {
        let rendered = render_workspace(&apply, &template, &name).expect(case);
        let text = serde_yaml::to_string(&rendered).unwrap();
        let path = golden_path(case);
        let golden = std::fs::read_to_string(&path).ok();
        if golden.as_deref() == Some(text.as_str()) {
            continue;
        }
        let Some(golden) = golden else {
            if update {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &text).unwrap();
            } else {
                failures.push(format!("{case}: no golden file {}", path.display()));
            }
            continue;
        };
        let before: Value = serde_yaml::from_str(&golden).unwrap();
        let recorded = |ws: &Value, key: &str| ws["metadata"]["annotations"][key].clone();
        if update {
            // The same inputs rendered otherwise under the same number would reach every
            // existing Workspace. (Changed inputs, an edited sample, are rewritten freely.)
            let same_inputs =
                recorded(&before, INPUTS_ANNOTATION) == recorded(&rendered, INPUTS_ANNOTATION);
            assert!(
                !same_inputs
                    || recorded(&before, RENDERING_ANNOTATION)
                        != recorded(&rendered, RENDERING_ANNOTATION),
                "{case}: the rendering of the same inputs changed but render::RENDERING did not; \
                 raise it and name the change in CHANGELOG.md"
            );
            std::fs::write(&path, &text).unwrap();
        } else {
            failures.push(format!(
                "{case}: the rendering differs from {}:\n--- golden\n{golden}--- rendered\n{text}",
                path.display()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}\n\nA rendering that changes changes existing Workspaces (a Terraform run each). If \
         the change is meant: raise render::RENDERING, name the change in CHANGELOG.md, and \
         rewrite the files with `{UPDATE_VARIABLE}=1 cargo test -p capt-controller --test \
         render_golden`.",
        failures.join("\n")
    );
}

/// Every Workspace records the digest of its inputs: a new way of computing it would make
/// every existing one look changed (a Terraform run each). The golden files may be rewritten
/// when a sample changes; this value may not.
#[test]
fn the_inputs_digest_of_the_same_inputs_never_changes() {
    let (_, apply, template, name) = cases()
        .into_iter()
        .find(|(case, ..)| *case == "remote-module")
        .unwrap();
    assert_eq!(
        capt_controller::render::inputs_digest(&apply, &template, &name),
        "1639ef2cac10bf93"
    );
}
