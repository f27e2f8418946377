//! Every kind the controller and the status-applier read through a typed view is as wide as
//! its schema: random objects valid against the schema the API server holds (from the same
//! CRD files the test environment installs; for built-in kinds the server's own OpenAPI) go to
//! the real API server beside Cluster API core as server-side dry-run creates, and every
//! object it accepts (schema, CEL rules, core's webhooks), as it returns it, defaults applied,
//! must decode into our type. Statuses likewise, as dry-run updates of the status subresource
//! of one real object per kind. What the server refuses is counted, never asserted.
//!
//! Each run draws a seed and prints it; `CAPT_SCHEMA_SEED=<seed>` replays a run,
//! `CAPT_SCHEMA_OBJECTS=<n>` sets how many accepted objects each kind needs (default 100).
//!
//! Not here: `CAPTClusterTemplate` and `CAPTControlPlaneTemplate` (nothing in CAPT reads
//! them; core does), and the kinds the status-applier reads as `DynamicObject` (any object
//! decodes as one).

use anyhow::{Context, Result, bail};
use capt_controller::api::{
    CAPTCluster, CAPTControlPlane, Cluster, TerraformWorkspace, WorkspaceTemplate,
    WorkspaceTemplateApply,
};
use capt_tests::schema_objects::{Generator, inline_refs};
use capt_tests::{TestNamespace, env, repo_root, unique_name};
use futures::future::join_all;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::collections::hash_map::RandomState;
use std::fmt::Write as _;
use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;

/// Accepted objects each kind needs unless `CAPT_SCHEMA_OBJECTS` says otherwise.
const DEFAULT_ACCEPTED: usize = 100;
/// Give up on a kind after this many generated objects per accepted one wanted.
const MAX_TRIES_PER_ACCEPTED: usize = 20;
/// Requests in flight at once.
const IN_FLIGHT: usize = 16;

/// A kind under test: where its schema comes from and the type we read it with.
struct Kind {
    /// How the report names it.
    name: &'static str,
    resource: ApiResource,
    namespaced: bool,
    /// The whole object's schema (`openAPIV3Schema`).
    schema: Value,
    /// True when it has a status subresource (create drops the status).
    status_subresource: bool,
    decode: fn(Value) -> Result<(), String>,
}

fn decode<K: DeserializeOwned>(object: Value) -> Result<(), String> {
    serde_json::from_value::<K>(object)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// What one kind (or its status) came to.
#[derive(Default)]
struct Tally {
    generated: usize,
    accepted: usize,
    decoded: usize,
    /// A few of the server's refusals, to see what it checks.
    refusals: Vec<String>,
    /// The first object that was accepted and did not decode, and why.
    failure: Option<(usize, Value, String)>,
}

#[tokio::test]
async fn every_object_the_api_server_accepts_decodes_into_our_types() -> Result<()> {
    let seed = match std::env::var("CAPT_SCHEMA_SEED") {
        Ok(s) => s.parse().context("CAPT_SCHEMA_SEED must be a number")?,
        // Keyed from the operating system's randomness, anew in each process.
        Err(_) => RandomState::new().build_hasher().finish(),
    };
    let wanted: usize = match std::env::var("CAPT_SCHEMA_OBJECTS") {
        Ok(n) => n.parse().context("CAPT_SCHEMA_OBJECTS must be a number")?,
        Err(_) => DEFAULT_ACCEPTED,
    };
    eprintln!(
        "schema property test: seed {seed} (replay with CAPT_SCHEMA_SEED={seed}), {wanted} accepted objects per kind"
    );
    let env = env();
    assert!(
        env.core,
        "core's webhooks must act on what the server accepts"
    );
    let client = env.client().await?;
    let ns = TestNamespace::create(&client, "schemas").await?;

    let started = std::time::Instant::now();
    let mut report = String::new();
    let mut failures = Vec::new();
    writeln!(
        report,
        "{:<28} {:>9} {:>8} {:>7}",
        "kind", "generated", "accepted", "decoded"
    )?;
    for kind in kinds()? {
        let api = if kind.namespaced {
            Api::<DynamicObject>::namespaced_with(client.clone(), &ns.name, &kind.resource)
        } else {
            Api::<DynamicObject>::all_with(client.clone(), &kind.resource)
        };
        let objects = creates(&kind, &api, &ns.name, seed, wanted).await?;
        let mut tallies = vec![(kind.name.to_owned(), objects)];
        if kind.status_subresource {
            let statuses = status_updates(&kind, &api, &ns.name, seed, wanted).await?;
            tallies.push((format!("{} status", kind.name), statuses));
        }
        for (name, tally) in tallies {
            writeln!(
                report,
                "{name:<28} {:>9} {:>8} {:>7}",
                tally.generated, tally.accepted, tally.decoded
            )?;
            if tally.accepted < wanted {
                failures.push(format!(
                    "{name}: only {} of {} generated objects were accepted (wanted {wanted}); refusals: {:#?}",
                    tally.accepted, tally.generated, tally.refusals
                ));
            }
            if let Some((index, object, error)) = tally.failure {
                let shown = if kind.resource.kind == "Secret" {
                    redacted(object)
                } else {
                    object
                };
                failures.push(format!(
                    "{name}: object #{index} of seed {seed} was accepted by the API server but does not decode: {error}\n{}",
                    serde_json::to_string_pretty(&shown)?
                ));
            }
        }
    }
    writeln!(report, "in {:.0?}", started.elapsed())?;
    eprintln!("{report}");
    assert!(
        failures.is_empty(),
        "seed {seed} (replay with CAPT_SCHEMA_SEED={seed}):\n{report}\n{}",
        failures.join("\n\n")
    );
    Ok(())
}

/// Generated objects as dry-run creates, until `wanted` are accepted.
async fn creates(
    kind: &Kind,
    api: &Api<DynamicObject>,
    ns: &str,
    seed: u64,
    wanted: usize,
) -> Result<Tally> {
    let mut generator = Generator::new(seed, kind.name);
    let mut tally = Tally::default();
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    while tally.accepted < wanted && tally.generated < wanted * MAX_TRIES_PER_ACCEPTED {
        let batch: Vec<(usize, DynamicObject)> = (0..IN_FLIGHT)
            .map(|i| {
                let index = tally.generated + i;
                let mut object = generator.value(&kind.schema);
                object["apiVersion"] = json!(kind.resource.api_version);
                object["kind"] = json!(kind.resource.kind);
                object["metadata"] = json!({"name": format!("schema-{index}")});
                if kind.namespaced {
                    object["metadata"]["namespace"] = json!(ns);
                }
                let object = serde_json::from_value(object).expect("an object with metadata");
                (index, object)
            })
            .collect();
        tally.generated += batch.len();
        let answers = join_all(batch.iter().map(|(_, o)| api.create(&dry_run, o))).await;
        for ((index, _), answer) in batch.into_iter().zip(answers) {
            tally.count(kind, index, answer)?;
        }
    }
    Ok(tally)
}

/// Generated statuses as dry-run updates of the status of one real object of the kind.
async fn status_updates(
    kind: &Kind,
    api: &Api<DynamicObject>,
    ns: &str,
    seed: u64,
    wanted: usize,
) -> Result<Tally> {
    let carrier = carrier(kind, api, ns, seed).await?;
    let name = carrier.metadata.name.clone().unwrap_or_default();
    let mut generator = Generator::new(seed, &format!("{} status", kind.name));
    let status_schema = &kind.schema["properties"]["status"];
    let mut tally = Tally::default();
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    while tally.accepted < wanted && tally.generated < wanted * MAX_TRIES_PER_ACCEPTED {
        let batch: Vec<(usize, Value)> = (0..IN_FLIGHT)
            .map(|i| (tally.generated + i, generator.value(status_schema)))
            .collect();
        tally.generated += batch.len();
        let carrier = api.get(&name).await?;
        let answers = join_all(batch.iter().map(|(_, status)| async {
            // A controller (core's, for a Cluster) may write the carrier meanwhile: read it
            // again and retry.
            let mut current = carrier.clone();
            let mut tries = 0;
            loop {
                if tries > 0 {
                    current = api.get(&name).await?;
                }
                current.data["status"] = status.clone();
                tries += 1;
                match api.replace_status(&name, &dry_run, &current).await {
                    Err(kube::Error::Api(e)) if e.code == 409 && tries < 10 => continue,
                    answer => return answer,
                }
            }
        }))
        .await;
        for ((index, _), answer) in batch.into_iter().zip(answers) {
            tally.count(kind, index, answer)?;
        }
    }
    api.delete(&name, &DeleteParams::background()).await?;
    Ok(tally)
}

/// One real object of the kind, whose status the dry-run updates replace.
async fn carrier(
    kind: &Kind,
    api: &Api<DynamicObject>,
    ns: &str,
    seed: u64,
) -> Result<DynamicObject> {
    let mut generator = Generator::new(seed, &format!("{} carrier", kind.name));
    for _ in 0..1000 {
        let mut object = generator.value(&kind.schema);
        object["apiVersion"] = json!(kind.resource.api_version);
        object["kind"] = json!(kind.resource.kind);
        object["metadata"] = json!({"name": unique_name("schema-carrier")});
        if kind.namespaced {
            object["metadata"]["namespace"] = json!(ns);
        }
        match api
            .create(&PostParams::default(), &serde_json::from_value(object)?)
            .await
        {
            Ok(created) => return Ok(created),
            Err(kube::Error::Api(e)) if (400..500).contains(&e.code) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    bail!("{}: the server accepted none of 1000 objects", kind.name)
}

impl Tally {
    fn count(
        &mut self,
        kind: &Kind,
        index: usize,
        answer: kube::Result<DynamicObject>,
    ) -> Result<()> {
        match answer {
            Ok(accepted) => {
                self.accepted += 1;
                let object = serde_json::to_value(&accepted)?;
                match (kind.decode)(object.clone()) {
                    Ok(()) => self.decoded += 1,
                    Err(e) => {
                        self.failure.get_or_insert((index, object, e));
                    }
                }
            }
            Err(kube::Error::Api(e)) if (400..500).contains(&e.code) && e.code != 409 => {
                if self.refusals.len() < 3 {
                    self.refusals.push(e.message.chars().take(300).collect());
                }
            }
            Err(e) => return Err(e).context(format!("{}: object #{index}", kind.name)),
        }
        Ok(())
    }
}

/// Every kind read through a typed view, with its schema.
fn kinds() -> Result<Vec<Kind>> {
    let upstream = upstream_crd_files()?;
    let find = |file: &str| -> Result<PathBuf> {
        upstream
            .iter()
            .find(|p| p.ends_with(file))
            .cloned()
            .with_context(|| format!("hack/testenv.sh crds lists no {file}"))
    };
    let ours = |file: &str| repo_root().join("manifests/crds").join(file);
    let mut kinds = vec![
        crd_kind(
            "Cluster",
            &find("cluster.x-k8s.io_clusters.yaml")?,
            "v1beta2",
            decode::<Cluster>,
        )?,
        crd_kind(
            "Workspace",
            &find("tf.upbound.io_workspaces.yaml")?,
            "v1beta1",
            decode::<TerraformWorkspace>,
        )?,
        crd_kind(
            "CAPTCluster",
            &ours("captclusters.infrastructure.cluster.x-k8s.io.yaml"),
            "v1beta1",
            decode::<CAPTCluster>,
        )?,
        crd_kind(
            "CAPTControlPlane",
            &ours("captcontrolplanes.controlplane.cluster.x-k8s.io.yaml"),
            "v1beta1",
            decode::<CAPTControlPlane>,
        )?,
        crd_kind(
            "WorkspaceTemplate",
            &ours("workspacetemplates.infrastructure.cluster.x-k8s.io.yaml"),
            "v1beta1",
            decode::<WorkspaceTemplate>,
        )?,
        crd_kind(
            "WorkspaceTemplateApply",
            &ours("workspacetemplateapplies.infrastructure.cluster.x-k8s.io.yaml"),
            "v1beta1",
            decode::<WorkspaceTemplateApply>,
        )?,
    ];
    let core = openapi("/openapi/v3/api/v1")?;
    kinds.push(builtin_kind(
        "Secret",
        &core,
        "",
        "v1",
        "secrets",
        decode::<Secret>,
    ));
    kinds.push(builtin_kind(
        "ConfigMap",
        &core,
        "",
        "v1",
        "configmaps",
        decode::<ConfigMap>,
    ));
    let coordination = openapi("/openapi/v3/apis/coordination.k8s.io/v1")?;
    kinds.push(builtin_kind(
        "Lease",
        &coordination,
        "coordination.k8s.io",
        "v1",
        "leases",
        decode::<Lease>,
    ));
    Ok(kinds)
}

/// The upstream CRD files the test environment installs (`hack/testenv.sh crds`).
fn upstream_crd_files() -> Result<Vec<PathBuf>> {
    let out = std::process::Command::new(repo_root().join("hack/testenv.sh"))
        .arg("crds")
        .output()
        .context("running hack/testenv.sh crds")?;
    if !out.status.success() {
        bail!(
            "hack/testenv.sh crds: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?
        .lines()
        .map(PathBuf::from)
        .collect())
}

/// The kind a CRD file defines, with the schema of its version `version`.
fn crd_kind(
    name: &'static str,
    file: &std::path::Path,
    version: &str,
    decode: fn(Value) -> Result<(), String>,
) -> Result<Kind> {
    let text = std::fs::read_to_string(file).with_context(|| file.display().to_string())?;
    let crd: Value = serde_yaml::from_str(&text).with_context(|| file.display().to_string())?;
    let spec = &crd["spec"];
    let served = spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == version)
        .with_context(|| format!("{}: no version {version}", file.display()))?;
    let group = spec["group"].as_str().unwrap_or_default();
    Ok(Kind {
        name,
        resource: ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: format!("{group}/{version}"),
            kind: spec["names"]["kind"].as_str().unwrap_or_default().into(),
            plural: spec["names"]["plural"].as_str().unwrap_or_default().into(),
        },
        namespaced: spec["scope"] == "Namespaced",
        schema: served["schema"]["openAPIV3Schema"].clone(),
        status_subresource: served["subresources"]["status"].is_object(),
        decode,
    })
}

/// The API server's OpenAPI v3 document at `path`.
fn openapi(path: &str) -> Result<Value> {
    let text = env().kubectl_ok(&["get", "--raw", path], None)?;
    Ok(serde_json::from_str(&text)?)
}

/// A built-in kind (namespaced, no status) with its schema from the server's OpenAPI.
fn builtin_kind(
    name: &'static str,
    document: &Value,
    group: &str,
    version: &str,
    plural: &str,
    decode: fn(Value) -> Result<(), String>,
) -> Kind {
    let components = &document["components"]["schemas"];
    let prefix = match group {
        "" => "io.k8s.api.core".to_owned(),
        g => format!("io.k8s.api.{}", g.trim_end_matches(".k8s.io")),
    };
    let definition = format!("{prefix}.{version}.{name}");
    let schema = inline_refs(
        &components[definition.as_str()],
        components,
        &["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"],
    );
    Kind {
        name,
        resource: ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: if group.is_empty() {
                version.into()
            } else {
                format!("{group}/{version}")
            },
            kind: name.into(),
            plural: plural.into(),
        },
        namespaced: true,
        schema,
        status_subresource: false,
        decode,
    }
}

/// A Secret with its values replaced: only its keys are shown.
fn redacted(mut secret: Value) -> Value {
    for field in ["data", "stringData"] {
        if let Some(map) = secret[field].as_object_mut() {
            map.values_mut().for_each(|v| *v = json!("<redacted>"));
        }
    }
    secret
}
