//! Every list and map a tenant writes in our CRDs is bounded (`controller/src/api/bounds.rs`),
//! against the real API server: admission refuses each one over its bound with a message
//! naming the field, and accepts it at its bound; an apply stored before a bound existed (the
//! CRD loosened, the object created, the tree's CRD put back) can still lose its finalizer
//! and be deleted, while a write that changes the offending field is refused.

use anyhow::{Result, ensure};
use capt_controller::api::bounds::{
    MAX_ADDONS, MAX_PUBLIC_CIDRS, MAX_TAGS, MAX_TEMPLATE_METADATA, MAX_WAITS,
};
use capt_controller::variables::MAX_VARIABLES;
use capt_tests::{TestNamespace, env, repo_root};
use serde_json::{Value, json};

const APPLIES_CRD: &str =
    "manifests/crds/workspacetemplateapplies.infrastructure.cluster.x-k8s.io.yaml";
const FINALIZER: &str = "example.com/hold";
/// One test at a time: the second loosens the apply CRD the first checks.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `n` entries of a list: `{"name": "s<i>", "namespace": ns}`.
fn refs(n: usize, ns: &str) -> Value {
    json!(
        (0..n)
            .map(|i| json!({"name": format!("s{i}"), "namespace": ns}))
            .collect::<Vec<_>>()
    )
}

/// A map of `n` entries `k<i>: v`.
fn map(n: usize) -> Value {
    json!(
        (0..n)
            .map(|i| (format!("k{i}"), json!("v")))
            .collect::<serde_json::Map<_, _>>()
    )
}

fn apply(ns: &str, spec: Value) -> Value {
    let mut body = json!({"templateRef": {"name": "t"}});
    body.as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "bounded", "namespace": ns}, "spec": body})
}

fn control_plane(ns: &str, extra: Value) -> Value {
    let mut spec = json!({"version": "v1.31.0", "workspaceTemplateRef": {"name": "t"}});
    spec.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "bounded", "namespace": ns}, "spec": spec})
}

fn template(ns: &str, metadata: Value) -> Value {
    json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
        "metadata": {"name": "bounded", "namespace": ns},
        "spec": {"template": {"metadata": metadata, "spec": {"forProvider": {"source": "Inline", "module": "x"}}}}})
}

/// The object with `n` entries in one bounded field.
type WithEntries<'a> = Box<dyn Fn(usize) -> Value + 'a>;

/// Each bounded field: its path as the API server names it, its bound, and the object with
/// `n` entries in it.
fn cases(ns: &str) -> Vec<(&'static str, usize, WithEntries<'_>)> {
    vec![
        (
            "spec.waitForSecrets",
            MAX_WAITS,
            Box::new(move |n| apply(ns, json!({"waitForSecrets": refs(n, ns)}))),
        ),
        (
            "spec.waitForWorkspaces",
            MAX_WAITS,
            Box::new(move |n| apply(ns, json!({"waitForWorkspaces": refs(n, ns)}))),
        ),
        (
            "spec.variables",
            MAX_VARIABLES,
            Box::new(move |n| apply(ns, json!({"variables": map(n)}))),
        ),
        (
            "spec.additionalTags",
            MAX_TAGS,
            Box::new(move |n| control_plane(ns, json!({"additionalTags": map(n)}))),
        ),
        (
            "spec.controlPlaneConfig.addons",
            MAX_ADDONS,
            Box::new(move |n| {
                let addons: Vec<Value> = (0..n).map(|i| json!({"name": format!("a{i}")})).collect();
                control_plane(ns, json!({"controlPlaneConfig": {"addons": addons}}))
            }),
        ),
        (
            "spec.controlPlaneConfig.endpointAccess.publicCidrs",
            MAX_PUBLIC_CIDRS,
            Box::new(move |n| {
                let cidrs: Vec<String> = (0..n).map(|i| format!("10.0.{i}.0/24")).collect();
                control_plane(
                    ns,
                    json!({"controlPlaneConfig": {"endpointAccess": {"publicCidrs": cidrs}}}),
                )
            }),
        ),
        (
            "spec.template.metadata.labels",
            MAX_TEMPLATE_METADATA,
            Box::new(move |n| template(ns, json!({"labels": map(n)}))),
        ),
        (
            "spec.template.metadata.annotations",
            MAX_TEMPLATE_METADATA,
            Box::new(move |n| template(ns, json!({"annotations": map(n)}))),
        ),
    ]
}

/// A server-side dry-run create: its stderr when refused.
fn dry_run(object: &Value) -> Result<Option<String>> {
    let out = env().kubectl_run(
        &["create", "--dry-run=server", "-f", "-"],
        Some(&object.to_string()),
    )?;
    Ok((!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned()))
}

#[tokio::test]
async fn admission_refuses_each_list_and_map_over_its_bound_with_a_message_naming_the_field()
-> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "bounds").await?;
    let mut failures = Vec::new();
    for (field, bound, object) in cases(&ns.name) {
        if let Some(refused) = dry_run(&object(bound))? {
            failures.push(format!(
                "{field} at its bound {bound} was refused: {refused}"
            ));
        }
        match dry_run(&object(bound + 1))? {
            None => failures.push(format!("{field} with {} entries was accepted", bound + 1)),
            Some(refused) if !refused.contains(field) => failures.push(format!(
                "{field} over its bound was refused without naming it: {refused}"
            )),
            Some(refused) => println!("{field} over {bound}: {}", refused.trim()),
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// Puts the tree's CRD back when dropped.
struct RestoredCrd;

impl Drop for RestoredCrd {
    fn drop(&mut self) {
        let _ = apply_crd(&tree_crd().expect("the tree's CRD"));
    }
}

fn tree_crd() -> Result<Value> {
    Ok(serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join(APPLIES_CRD),
    )?)?)
}

fn apply_crd(crd: &Value) -> Result<()> {
    env().kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            "testenv",
            "-f",
            "-",
        ],
        Some(&crd.to_string()),
    )?;
    let name = crd["metadata"]["name"].as_str().unwrap_or_default();
    env().kubectl_ok(
        &[
            "wait",
            "--for",
            "condition=Established",
            "--timeout",
            "60s",
            "crd",
            name,
        ],
        None,
    )?;
    Ok(())
}

#[tokio::test]
async fn an_apply_stored_before_the_bound_can_still_lose_its_finalizer_and_be_deleted() -> Result<()>
{
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "bounds-old").await?;
    let _restored = RestoredCrd;
    // The CRD as it was before the bound: no maxItems on waitForSecrets.
    let mut looser = tree_crd()?;
    for version in looser["spec"]["versions"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        let waits = &mut version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["waitForSecrets"];
        ensure!(
            waits["maxItems"] == json!(MAX_WAITS),
            "no bound on spec.waitForSecrets in {APPLIES_CRD}"
        );
        waits.as_object_mut().unwrap().remove("maxItems");
    }
    apply_crd(&looser)?;
    let mut old = apply(
        &ns.name,
        json!({"waitForSecrets": refs(MAX_WAITS * 4, &ns.name)}),
    );
    old["metadata"]["finalizers"] = json!([FINALIZER]);
    env().kubectl_ok(&["create", "-f", "-"], Some(&old.to_string()))?;
    apply_crd(&tree_crd()?)?;

    let target = ["-n", &ns.name, "workspacetemplateapply", "bounded"];
    let longer = json!({"spec": {"waitForSecrets": refs(MAX_WAITS * 4 + 1, &ns.name)}});
    let changed = env().kubectl_run(
        &[
            &["patch"][..],
            &target,
            &["--type", "merge", "-p", &longer.to_string()],
        ]
        .concat(),
        None,
    )?;
    ensure!(
        !changed.status.success(),
        "the bound is not in force: a longer list was accepted"
    );
    env().kubectl_ok(
        &[&["delete"][..], &target, &["--wait=false"]].concat(),
        None,
    )?;
    env().kubectl_ok(
        &[
            &["patch"][..],
            &target,
            &[
                "--type",
                "json",
                "-p",
                r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
            ],
        ]
        .concat(),
        None,
    )?;
    env().kubectl_ok(
        &[&["wait"][..], &target, &["--for=delete", "--timeout=30s"]].concat(),
        None,
    )?;
    Ok(())
}
