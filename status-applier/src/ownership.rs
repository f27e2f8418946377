//! The ownership audit as a command, shared by `status-applier audit` and the kubectl plugin
//! `kubectl-ownership`: the flags (kubectl's: `-n`, `-A`, `-o`, `--kubeconfig`,
//! `--context`), reading the objects (from a file or the API server), following the policy's
//! source checks, printing, and the verdict that becomes the exit code. The audit itself is
//! [`crate::audit`].

use crate::audit::Expectation;
use crate::config::GroupKind;
use crate::policy::{LookupStep, PolicyFile, Scope, SourceCheck};
use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use std::io::Read;
use std::path::PathBuf;

/// The policy file: nothing is protected, replaced or expected without one (or the flags).
#[derive(Args)]
pub struct PolicyFileArg {
    /// The policy file (YAML; docs/status-applier.md). A flag given for a section of it
    /// replaces that section.
    #[arg(long = "policy", env = "STATUS_APPLIER_POLICY", value_name = "FILE")]
    pub policy_file: Option<PathBuf>,
}

impl PolicyFileArg {
    /// The policy file, or the empty policy when none is given.
    pub fn read(&self) -> Result<PolicyFile> {
        match &self.policy_file {
            Some(path) => PolicyFile::read(path).map_err(anyhow::Error::msg),
            None => Ok(PolicyFile::default()),
        }
    }
}

/// Where to read objects from when no file is given: kubectl's connection flags.
#[derive(Args)]
pub struct ConnectionArgs {
    /// The kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

impl ConnectionArgs {
    /// A client for the chosen kubeconfig and context.
    pub async fn client(&self) -> Result<kube::Client> {
        let config = if self.kubeconfig.is_none() && self.context.is_none() {
            kube::Config::infer()
                .await
                .context("finding a kubeconfig")?
        } else {
            let options = kube::config::KubeConfigOptions {
                context: self.context.clone(),
                ..Default::default()
            };
            let kubeconfig = match &self.kubeconfig {
                Some(path) => kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading the kubeconfig {}", path.display()))?,
                None => kube::config::Kubeconfig::read().context("reading the kubeconfig")?,
            };
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .context("loading the kubeconfig")?
        };
        kube::Client::try_from(config).context("connecting to the API server")
    }
}

/// Which namespaces an audit without `-n` or `-A` reads.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum DefaultScope {
    /// Every namespace (`status-applier audit`).
    #[default]
    AllNamespaces,
    /// The namespace of the kubeconfig context, as kubectl does (`kubectl ownership`).
    ContextNamespace,
}

/// The audit's flags.
#[derive(Args)]
pub struct AuditArgs {
    /// KIND or KIND/NAME (kind, plural or Kind.group); the policy's `audit.kinds` when omitted.
    pub target: Option<String>,
    /// The namespace.
    #[arg(short = 'n', long, conflicts_with = "all_namespaces")]
    pub namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Read the objects from a file, or - for standard input (`kubectl get -o yaml --show-managed-fields`).
    #[arg(short = 'f', long = "filename")]
    pub file: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = AuditFormat::Table)]
    pub output: AuditFormat,
    #[command(flatten)]
    pub policy: PolicyFileArg,
    /// Read the policy from this ConfigMap of the cluster (`NAMESPACE/NAME`, key
    /// `policy.yaml`) instead of a file. Without --policy and this flag, an audit of the
    /// cluster reads the ConfigMap labelled `app.kubernetes.io/component=status-applier-policy`,
    /// looked for in every namespace (the manifests deploy it, with a hash suffix on its
    /// name, beside the applier); none found, or several, is an error.
    #[arg(
        long,
        env = "STATUS_APPLIER_POLICY_CONFIGMAP",
        value_name = "NAMESPACE/NAME",
        conflicts_with = "policy_file"
    )]
    pub policy_configmap: Option<String>,
    /// Audit without a policy: every field with its owners, nothing expected or checked
    /// (the default with -f and no --policy).
    #[arg(long, conflicts_with_all = ["policy_file", "policy_configmap"])]
    pub no_policy: bool,
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// Protected paths and their only owners, as Kind.group:field.path=manager[|manager]
    /// (replaces the policy file's `audit.expectations`).
    #[arg(long = "expect", value_delimiter = ',')]
    pub expectations: Vec<Expectation>,
    /// Which namespaces are read without `-n` or `-A`; set by the binary, not a flag.
    #[arg(skip)]
    pub default_scope: DefaultScope,
}

/// What an audit found; the binaries turn it into exit codes: 0 clean, 1 a violation, and 2
/// for an error (an audit that could not run never looks like one that found a violation).
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// No violation.
    Clean,
    /// At least one violation.
    Violations,
}

/// The exit code of an audit's result.
pub fn exit_code(result: &Result<Verdict>) -> std::process::ExitCode {
    match result {
        Ok(Verdict::Clean) => std::process::ExitCode::SUCCESS,
        Ok(Verdict::Violations) => std::process::ExitCode::from(1),
        Err(_) => std::process::ExitCode::from(2),
    }
}

/// The audit's output formats.
#[derive(Clone, Copy, ValueEnum)]
pub enum AuditFormat {
    /// One row per field, with every owner.
    Table,
    /// The audits as JSON.
    Json,
    /// The objects as YAML, each field annotated with its owners.
    Yaml,
}

/// The label of the ConfigMap that holds a deployed applier's policy (`--policy-configmap`).
pub const POLICY_CONFIGMAP_LABEL: &str = "app.kubernetes.io/component=status-applier-policy";
/// The key of that ConfigMap that holds the policy file.
pub const POLICY_CONFIGMAP_KEY: &str = "policy.yaml";

/// The policy of an audit: the file; none with `--no-policy` or when the objects come from a
/// file (`-f`, nothing is read from the cluster); else the named ConfigMap, or the one
/// labelled [`POLICY_CONFIGMAP_LABEL`]. A ConfigMap that is missing, or lacks the key, is an
/// error: an audit never runs on an empty policy it was not asked for.
async fn audit_policy(args: &AuditArgs, client: Option<&kube::Client>) -> Result<PolicyFile> {
    if args.policy.policy_file.is_some() {
        return args.policy.read();
    }
    if args.no_policy {
        return Ok(PolicyFile::default());
    }
    let Some(client) = client else {
        if args.policy_configmap.is_some() {
            bail!("--policy-configmap reads the cluster; with -f, give --policy FILE");
        }
        return Ok(PolicyFile::default());
    };
    let config_map = match &args.policy_configmap {
        Some(named) => named_policy_configmap(client, named).await?,
        None => labelled_policy_configmap(client).await?,
    };
    policy_of_configmap(config_map)
}

/// The ConfigMap `--policy-configmap NAMESPACE/NAME` names.
async fn named_policy_configmap(client: &kube::Client, named: &str) -> Result<ConfigMap> {
    let (ns, name) = named
        .split_once('/')
        .with_context(|| format!("--policy-configmap {named:?}: expected NAMESPACE/NAME"))?;
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .with_context(|| format!("reading the policy ConfigMap {named}"))?
        .with_context(|| {
            format!("no policy: the ConfigMap {named} (--policy-configmap) does not exist")
        })
}

/// The one ConfigMap labelled [`POLICY_CONFIGMAP_LABEL`], in any namespace.
async fn labelled_policy_configmap(client: &kube::Client) -> Result<ConfigMap> {
    let list = Api::<ConfigMap>::all(client.clone())
        .list(&ListParams::default().labels(POLICY_CONFIGMAP_LABEL))
        .await
        .context("looking for the applier's policy ConfigMap")?;
    let names: Vec<String> = list.items.iter().map(namespaced_name).collect();
    match <[ConfigMap; 1]>::try_from(list.items) {
        Ok([one]) => Ok(one),
        Err(items) if items.is_empty() => bail!(
            "no policy: no ConfigMap labelled {POLICY_CONFIGMAP_LABEL} in any namespace (as the \
             applier's manifests deploy it); give --policy FILE, --policy-configmap \
             NAMESPACE/NAME, or --no-policy to list the owners without checks"
        ),
        Err(_) => bail!(
            "{} ConfigMaps are labelled {POLICY_CONFIGMAP_LABEL} ({}): name one with \
             --policy-configmap NAMESPACE/NAME, or give --policy FILE",
            names.len(),
            names.join(", ")
        ),
    }
}

/// The policy file in [`POLICY_CONFIGMAP_KEY`] of `config_map`, parsed as a file is.
fn policy_of_configmap(config_map: ConfigMap) -> Result<PolicyFile> {
    let name = namespaced_name(&config_map);
    let mut data = config_map.data.unwrap_or_default();
    let Some(text) = data.remove(POLICY_CONFIGMAP_KEY) else {
        let keys: Vec<&String> = data.keys().collect();
        bail!(
            "no policy: the ConfigMap {name} has no key {POLICY_CONFIGMAP_KEY} (its keys: {keys:?})"
        );
    };
    PolicyFile::parse(&text).map_err(|e| {
        anyhow::anyhow!("policy of the ConfigMap {name} ({POLICY_CONFIGMAP_KEY}): {e}")
    })
}

fn namespaced_name(config_map: &ConfigMap) -> String {
    format!(
        "{}/{}",
        config_map.metadata.namespace.as_deref().unwrap_or_default(),
        config_map.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Runs the audit the flags describe and prints it.
pub async fn audit(args: AuditArgs) -> Result<Verdict> {
    // From a file, nothing is read from the cluster (and the source checks, which read it,
    // are skipped).
    let client = match &args.file {
        Some(_) => None,
        None => Some(args.connection.client().await?),
    };
    let policy = audit_policy(&args, client.as_ref()).await?;
    let (objects, client) = match (&args.file, client) {
        (Some(file), _) => (read_objects(file)?, None),
        (None, client) => {
            let client = client.expect("a client without -f");
            let namespace = match (&args.namespace, args.all_namespaces, args.default_scope) {
                (Some(ns), _, _) => Some(ns.clone()),
                (None, true, _) | (None, false, DefaultScope::AllNamespaces) => None,
                (None, false, DefaultScope::ContextNamespace) => {
                    Some(client.default_namespace().to_owned())
                }
            };
            let kinds: Vec<String> = policy.audit.kinds.iter().map(|k| k.to_string()).collect();
            let target = args.target.as_deref();
            let objects = fetch_objects(&client, target, &kinds, namespace.as_deref()).await?;
            (objects, Some(client))
        }
    };
    // `--expect` given replaces the file's expectations.
    let expectations = if args.expectations.is_empty() {
        policy.expectations()
    } else {
        args.expectations
    };
    let mut audits = objects
        .iter()
        .map(|o| crate::audit::audit(o, &expectations))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    if let Some(client) = &client {
        check_sources(client, &policy.audit.source_checks, &objects, &mut audits).await?;
    }
    match args.output {
        AuditFormat::Table => print!("{}", crate::audit::table(&audits)),
        AuditFormat::Json => println!("{}", serde_json::to_string_pretty(&audits)?),
        AuditFormat::Yaml => print!("{}", crate::audit::annotated_yaml(&audits)),
    }
    let violations: usize = audits.iter().map(|a| a.violations.len()).sum();
    if violations > 0 {
        eprintln!(
            "{violations} ownership violation(s) in {} object(s)",
            audits.len()
        );
        return Ok(Verdict::Violations);
    }
    eprintln!("audited {} object(s): no violation", audits.len());
    Ok(Verdict::Clean)
}

/// The policy's "present when its source has it" checks (only from the cluster: the sources
/// are read from it).
async fn check_sources(
    client: &kube::Client,
    checks: &[SourceCheck],
    objects: &[serde_json::Value],
    audits: &mut [crate::audit::ObjectAudit],
) -> Result<()> {
    if checks.is_empty() {
        return Ok(());
    }
    for (object, audit) in objects.iter().zip(audits.iter_mut()) {
        let kind = GroupKind::from_api_version(
            object["apiVersion"].as_str().unwrap_or_default(),
            object["kind"].as_str().unwrap_or_default(),
        );
        for check in checks.iter().filter(|c| c.kind == kind) {
            let Some((source, described)) = follow(client, object, &check.source.lookup).await?
            else {
                continue;
            };
            let source_has = check.source.path.lookup(&source).is_some();
            if let Some(v) = crate::audit::missing_from_source(
                object,
                &check.path.to_string(),
                source_has,
                &described,
            ) {
                audit.violations.push(v);
            }
        }
    }
    Ok(())
}

/// The object at the end of `steps` from `object`, and its `Kind name`; `None` when a step's
/// name or object is missing (no source: nothing to check).
async fn follow(
    client: &kube::Client,
    object: &serde_json::Value,
    steps: &[LookupStep],
) -> Result<Option<(serde_json::Value, String)>> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let mut current = object.clone();
    let mut described = String::new();
    for step in steps {
        let Some(name) = step.name_in(&current) else {
            return Ok(None);
        };
        let (group, version) = step
            .api_version
            .rsplit_once('/')
            .unwrap_or(("", &step.api_version));
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &step.kind));
        let api: kube::Api<DynamicObject> = match step.scope {
            Scope::Namespaced => {
                let Some(ns) = current["metadata"]["namespace"].as_str() else {
                    return Ok(None);
                };
                kube::Api::namespaced_with(client.clone(), ns, &resource)
            }
            Scope::Cluster => kube::Api::all_with(client.clone(), &resource),
        };
        let Some(found) = api
            .get_opt(&name)
            .await
            .with_context(|| format!("reading {} {name}", step.kind))?
        else {
            return Ok(None);
        };
        current = serde_json::to_value(found)?;
        described = format!("{} {name}", step.kind);
    }
    Ok(Some((current, described)))
}

/// The text of `file`, or of standard input for `-`, as every command that takes `-f` reads it.
pub fn read_input(file: &str) -> Result<String> {
    if file == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading standard input")?;
        Ok(s)
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {file}"))
    }
}

/// Objects from YAML or JSON documents; `List`s are flattened.
fn read_objects(file: &str) -> Result<Vec<serde_json::Value>> {
    let text = read_input(file)?;
    let mut objects = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let value: serde_json::Value = serde::Deserialize::deserialize(doc)
            .with_context(|| format!("{file}: document {} is not YAML", i + 1))?;
        match value["items"].as_array() {
            Some(items) if value["kind"].as_str().is_some_and(|k| k.ends_with("List")) => {
                objects.extend(items.iter().cloned())
            }
            _ if value.is_null() => {}
            _ => objects.push(value),
        }
    }
    if objects
        .iter()
        .any(|o| o["metadata"]["managedFields"].is_null())
    {
        eprintln!(
            "note: some objects carry no managedFields: use kubectl get -o yaml --show-managed-fields"
        );
    }
    Ok(objects)
}

/// Objects of the target (or of every kind of `audited` when none is named) from the API
/// server.
async fn fetch_objects(
    client: &kube::Client,
    target: Option<&str>,
    audited: &[String],
    namespace: Option<&str>,
) -> Result<Vec<serde_json::Value>> {
    if target.is_none() && audited.is_empty() {
        bail!(
            "nothing to audit: name a KIND or KIND/NAME, or give a policy (--policy FILE, or the \
             deployed policy ConfigMap) whose audit.kinds lists the kinds"
        );
    }
    let discovery = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .context("discovering the API")?;
    let (kinds, name): (Vec<String>, Option<&str>) = match target {
        Some(t) => {
            let (kind, name) = t.split_once('/').map_or((t, None), |(k, n)| (k, Some(n)));
            (vec![kind.to_owned()], name)
        }
        None => (audited.to_vec(), None),
    };
    let mut objects = Vec::new();
    for wanted in &kinds {
        let (resource, caps) =
            find_kind(&discovery, wanted).with_context(|| format!("unknown kind `{wanted}`"))?;
        let api: kube::Api<kube::api::DynamicObject> = match namespace {
            Some(ns) if caps.scope == kube::discovery::Scope::Namespaced => {
                kube::Api::namespaced_with(client.clone(), ns, &resource)
            }
            _ => kube::Api::all_with(client.clone(), &resource),
        };
        let found = match name {
            Some(n) => vec![
                api.get(n)
                    .await
                    .with_context(|| format!("reading {wanted}/{n}"))?,
            ],
            None => {
                api.list(&Default::default())
                    .await
                    .with_context(|| format!("listing {wanted}"))?
                    .items
            }
        };
        for mut obj in found {
            obj.types = Some(kube::api::TypeMeta {
                api_version: resource.api_version.clone(),
                kind: resource.kind.clone(),
            });
            objects.push(serde_json::to_value(obj)?);
        }
    }
    Ok(objects)
}

/// A kind by `Kind`, `Kind.group`, plural or singular name, case-insensitively.
fn find_kind(
    discovery: &kube::discovery::Discovery,
    wanted: &str,
) -> Option<(kube::core::ApiResource, kube::discovery::ApiCapabilities)> {
    let (name, group) = wanted
        .split_once('.')
        .map_or((wanted, None), |(n, g)| (n, Some(g)));
    discovery
        .groups()
        .filter(|g| group.is_none_or(|w| g.name() == w))
        .find_map(|g| {
            g.recommended_resources().into_iter().find(|(r, _)| {
                [&r.kind, &r.plural]
                    .iter()
                    .any(|n| n.eq_ignore_ascii_case(name))
                    || r.kind.to_lowercase() == name.to_lowercase().trim_end_matches('s')
            })
        })
}
