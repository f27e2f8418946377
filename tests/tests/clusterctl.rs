//! clusterctl packaging, checked with the real `clusterctl` built from the Go module proxy
//! (hack/testenv.sh) and the real API server: `hack/clusterctl-repo.sh` builds a local
//! provider repository from manifests/, `clusterctl generate provider` reads both providers
//! from it (variables, labels, move labels, images, what the API server accepts), and
//! `clusterctl generate cluster` gives a Cluster that the running system provisions.

use anyhow::{Result, bail};
use capt_tests::system::{System, TRUST_TEMPLATES};
use capt_tests::{TestNamespace, env, repo_root};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The local repository for this test, and its clusterctl config.
fn repository(dir: &Path) -> Result<PathBuf> {
    let path = format!(
        "{}:{}",
        env().bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(repo_root().join("hack/clusterctl-repo.sh"))
        .arg(dir)
        .arg("v0.1.0")
        .env("PATH", path)
        .output()?;
    if !out.status.success() {
        bail!(
            "hack/clusterctl-repo.sh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(dir.join("clusterctl.yaml"))
}

/// `clusterctl ARGS` with `vars` as environment variables; its stdout.
fn clusterctl(config: &Path, args: &[&str], vars: &[(&str, &str)]) -> Result<String> {
    let home = config.parent().expect("a directory").join("home");
    let out = env()
        .clusterctl(&home)?
        .args(args)
        .arg("--config")
        .arg(config)
        .env("KUBECONFIG", &env().kubeconfig)
        .envs(vars.iter().copied())
        .output()?;
    if !out.status.success() {
        bail!(
            "clusterctl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn documents(yaml: &str) -> Result<Vec<Value>> {
    capt_tests::yaml_documents(yaml)
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn env_value<'a>(deployment: &'a Value, container: &str, var: &str) -> Option<&'a str> {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == container)?["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == var)?["value"]
        .as_str()
}

#[tokio::test]
async fn clusterctl_generates_both_providers_from_the_local_repository() -> Result<()> {
    let dir = tempdir("clusterctl-provider")?;
    let config = repository(&dir)?;

    let infra = documents(&clusterctl(
        &config,
        &["generate", "provider", "--infrastructure", "capt:v0.1.0"],
        &[],
    )?)?;
    let namespaces: Vec<&Value> = infra.iter().filter(|d| d["kind"] == "Namespace").collect();
    assert_eq!(namespaces.len(), 1, "one target namespace");
    assert_eq!(namespaces[0]["metadata"]["name"], "capt-system");
    for doc in &infra {
        assert_eq!(
            doc["metadata"]["labels"]["cluster.x-k8s.io/provider"], "infrastructure-capt",
            "{} {} carries the provider label",
            doc["kind"], doc["metadata"]["name"]
        );
    }
    // Defaults of the variables, substituted; an env value stays a string.
    let deployment = find(&infra, "Deployment", "capt-controller");
    assert_eq!(env_value(deployment, "manager", "RUST_LOG"), Some("info"));
    assert_eq!(
        env_value(deployment, "manager", "CAPT_STUCK_DELETION_SECONDS"),
        Some("900")
    );
    assert_eq!(
        env_value(deployment, "manager", "CAPT_ALLOW_PROVIDER_CONFIGS"),
        Some("*=default")
    );
    // Templates are code: only the platform's namespace is trusted with it.
    assert_eq!(
        env_value(deployment, "manager", "CAPT_ALLOW_TEMPLATE_NAMESPACES"),
        Some("capt-templates")
    );
    // The admission policy that narrows the Secret rights, and who may connect, come along.
    find(
        &infra,
        "ValidatingAdmissionPolicy",
        "capt-controller-secrets",
    );
    find(&infra, "NetworkPolicy", "capt-controller");
    let image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(image, "docker.io/capt/status-management:v0.1.0");
    // Objects no ownerReference ties to a Cluster are moved by their CRDs' labels.
    for crd in [
        "workspacetemplates.infrastructure.cluster.x-k8s.io",
        "workspacetemplateapplies.infrastructure.cluster.x-k8s.io",
    ] {
        let labels = &find(&infra, "CustomResourceDefinition", crd)["metadata"]["labels"];
        assert_eq!(
            labels["clusterctl.cluster.x-k8s.io/move"], "",
            "{crd}: {labels}"
        );
        assert_eq!(
            labels["cluster.x-k8s.io/v1beta1"], "v1beta1",
            "{crd}: {labels}"
        );
    }
    // The CRDs' own `${key}` and `${WORKSPACE_NAME}` survive clusterctl's substitution
    // (escaped in the repository).
    let crd = |name: &str| find(&infra, "CustomResourceDefinition", name).to_string();
    assert!(crd("workspacetemplateapplies.infrastructure.cluster.x-k8s.io").contains("`${key}`"));
    assert!(
        crd("workspacetemplates.infrastructure.cluster.x-k8s.io").contains("`${WORKSPACE_NAME}`")
    );

    // A variable given wins over its default.
    let debug = documents(&clusterctl(
        &config,
        &["generate", "provider", "--infrastructure", "capt:v0.1.0"],
        &[("CAPT_LOG_LEVEL", "debug")],
    )?)?;
    let deployment = find(&debug, "Deployment", "capt-controller");
    assert_eq!(
        env_value(deployment, "status-applier", "RUST_LOG"),
        Some("debug")
    );

    let control_plane = documents(&clusterctl(
        &config,
        &["generate", "provider", "--control-plane", "capt:v0.1.0"],
        &[],
    )?)?;
    let crd = find(
        &control_plane,
        "CustomResourceDefinition",
        "captcontrolplanes.controlplane.cluster.x-k8s.io",
    );
    assert_eq!(
        crd["metadata"]["labels"]["cluster.x-k8s.io/provider"],
        "control-plane-capt"
    );
    // Its namespace (clusterctl takes one per provider) is the one trusted with code, made
    // with the label the controller checks at start: the install creates it.
    let namespaces: Vec<&Value> = (control_plane.iter())
        .filter(|d| d["kind"] == "Namespace")
        .collect();
    assert_eq!(namespaces.len(), 1, "one target namespace");
    assert_eq!(namespaces[0]["metadata"]["name"], "capt-templates");
    assert_eq!(
        namespaces[0]["metadata"]["labels"][capt_controller::tenancy::TRUSTED_NAMESPACE_LABEL],
        "true"
    );
    // The ClusterClass templates come with their provider, contract label and all.
    for (docs, name, provider) in [
        (
            &infra,
            "captclustertemplates.infrastructure.cluster.x-k8s.io",
            "infrastructure-capt",
        ),
        (
            &control_plane,
            "captcontrolplanetemplates.controlplane.cluster.x-k8s.io",
            "control-plane-capt",
        ),
    ] {
        let labels = &find(docs, "CustomResourceDefinition", name)["metadata"]["labels"];
        assert_eq!(labels["cluster.x-k8s.io/provider"], provider, "{name}");
        assert_eq!(labels["cluster.x-k8s.io/v1beta1"], "v1beta1", "{name}");
    }

    // The API server accepts every object as generated for a namespace of the user's choice
    // (a server-side dry run; `--target-namespace` is how `clusterctl init` installs it).
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "clusterctl-install").await?;
    let mut all = Vec::new();
    for provider in ["--infrastructure", "--control-plane"] {
        let yaml = clusterctl(
            &config,
            &[
                "generate",
                "provider",
                provider,
                "capt:v0.1.0",
                "--target-namespace",
                &ns.name,
            ],
            &[],
        )?;
        all.extend(documents(&yaml)?);
    }
    assert!(
        all.iter().all(|d| d["metadata"]["namespace"].is_null()
            || d["metadata"]["namespace"] == ns.name.as_str())
    );
    let all: Vec<String> = all.iter().map(Value::to_string).collect();
    env().kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "--force-conflicts",
            "-f",
            "-",
        ],
        Some(&all.join("\n")),
    )?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// The repository's `metadata.yaml` maps the release series to the newest contract the CRDs'
/// contract labels name (clusterctl's provider contract: the series' contract "must match the
/// contract version that is declared in the CRD"; clusterctl v1.14 still accepts `v1beta1` as
/// compatible with its `v1beta2`, until v1beta1 is EOL), and clusterctl reads it.
#[tokio::test]
async fn the_release_series_names_the_contract_the_crds_declare() -> Result<()> {
    let dir = tempdir("clusterctl-metadata")?;
    let config = repository(&dir)?;
    for (provider_dir, flag) in [
        ("infrastructure-capt", "--infrastructure"),
        ("control-plane-capt", "--control-plane"),
    ] {
        let text = std::fs::read_to_string(dir.join(provider_dir).join("v0.1.0/metadata.yaml"))?;
        let metadata: Value = serde_yaml::from_str(&text)?;
        assert_eq!(
            metadata["apiVersion"],
            "clusterctl.cluster.x-k8s.io/v1alpha3"
        );
        assert_eq!(metadata["kind"], "Metadata");
        let series: Vec<&Value> = (metadata["releaseSeries"].as_array().into_iter().flatten())
            .filter(|s| s["major"] == 0 && s["minor"] == 1)
            .collect();
        assert_eq!(series.len(), 1, "one series for v0.1.0: {metadata}");
        let contract = series[0]["contract"].as_str().unwrap_or_default();

        // clusterctl accepts the metadata, and the components it generates declare it.
        let components = documents(&clusterctl(
            &config,
            &["generate", "provider", flag, "capt:v0.1.0"],
            &[],
        )?)?;
        let crds = components
            .iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition");
        let mut declared = std::collections::BTreeSet::new();
        for crd in crds {
            let labels = crd["metadata"]["labels"].as_object().cloned();
            declared.extend(
                labels
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, _)| k.strip_prefix("cluster.x-k8s.io/").map(str::to_owned))
                    .filter(|v| v.starts_with('v')),
            );
        }
        assert_eq!(
            declared.last().map(String::as_str),
            Some(contract),
            "{provider_dir}: the series names the newest contract its CRDs declare ({declared:?})"
        );
        assert_eq!(contract, "v1beta2", "{provider_dir}");
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[tokio::test]
async fn clusterctl_generate_cluster_gives_a_cluster_the_system_provisions() -> Result<()> {
    let dir = tempdir("clusterctl-cluster")?;
    let config = repository(&dir)?;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "clusterctl").await?;
    // The platform's namespace, trusted with code; the Cluster's own is not.
    let platform = TestNamespace::create(&client, "clusterctl-templates").await?;

    let missing = clusterctl(
        &config,
        &[
            "generate",
            "cluster",
            "demo",
            "--infrastructure",
            "capt:v0.1.0",
        ],
        &[],
    )
    .expect_err("AWS_REGION is required");
    assert!(missing.to_string().contains("AWS_REGION"), "{missing:#}");

    let cluster = clusterctl(
        &config,
        &[
            "generate",
            "cluster",
            "demo",
            "--infrastructure",
            "capt:v0.1.0",
            "--target-namespace",
            &ns.name,
        ],
        &[
            ("AWS_REGION", "eu-west-1"),
            ("CAPT_TEMPLATE_NAMESPACE", platform.name.as_str()),
        ],
    )?;
    let docs = documents(&cluster)?;
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(kinds, ["Cluster", "CAPTCluster", "CAPTControlPlane"]);
    assert!(
        docs.iter()
            .all(|d| d["metadata"]["namespace"] == ns.name.as_str())
    );
    let cp = find(&docs, "CAPTControlPlane", "demo");
    assert_eq!(cp["spec"]["version"], "1.31");
    assert_eq!(cp["spec"]["controlPlaneConfig"]["region"], "eu-west-1");
    assert_eq!(
        cp["spec"]["workspaceTemplateRef"]["namespace"],
        platform.name.as_str()
    );
    let cc = find(&docs, "CAPTCluster", "demo");
    assert_eq!(
        cc["spec"]["vpcTemplateRef"]["namespace"],
        platform.name.as_str()
    );

    // The WorkspaceTemplates it names are the platform namespace's (the samples'), which the
    // controller trusts; then the system provisions the generated Cluster.
    let system =
        System::start_with(&ns.name, 50, &[TRUST_TEMPLATES, platform.name.as_str()]).await?;
    let templates = std::fs::read_to_string(repo_root().join("manifests/samples/templates.yaml"))?;
    let mut objects: Vec<Value> = documents(&templates)?
        .into_iter()
        .filter(|d| d["kind"] != "Namespace")
        .collect();
    for t in &mut objects {
        t["metadata"]["namespace"] = Value::from(platform.name.clone());
    }
    objects.extend(docs);
    let objects: Vec<String> = objects.iter().map(Value::to_string).collect();
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&objects.join("\n")),
    )?;
    system.wait_provisioned().await?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

fn tempdir(name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(capt_tests::unique_name(name));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
