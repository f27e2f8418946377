//! `status-applier audit`: the command's flags, reading the objects (from a file or the API
//! server) and following the policy's source checks. The audit itself is the library's
//! `status_applier::audit`; this module is named `audit_command` to keep the two apart.

use crate::{PolicyFileArg, Verdict};
use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use status_applier::audit::Expectation;
use status_applier::config::GroupKind;
use status_applier::policy::{LookupStep, Scope, SourceCheck};
use std::io::Read;

#[derive(Args)]
pub(crate) struct AuditArgs {
    /// KIND or KIND/NAME (kind, plural or Kind.group); the policy's `audit.kinds` when omitted.
    target: Option<String>,
    /// The namespace (all namespaces when omitted).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// Read the objects from a file, or - for standard input (`kubectl get -o yaml --show-managed-fields`).
    #[arg(short = 'f', long = "filename")]
    file: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = AuditFormat::Table)]
    output: AuditFormat,
    #[command(flatten)]
    policy: PolicyFileArg,
    /// Protected paths and their only owners, as Kind.group:field.path=manager[|manager]
    /// (replaces the policy file's `audit.expectations`).
    #[arg(long = "expect", value_delimiter = ',')]
    expectations: Vec<Expectation>,
}

#[derive(Clone, Copy, ValueEnum)]
enum AuditFormat {
    Table,
    Json,
    Yaml,
}

pub(crate) async fn audit(args: AuditArgs) -> Result<Verdict> {
    let policy = args.policy.read()?;
    let objects = match &args.file {
        Some(file) => read_objects(file)?,
        None => {
            let kinds: Vec<String> = policy.audit.kinds.iter().map(|k| k.to_string()).collect();
            fetch_objects(args.target.as_deref(), &kinds, args.namespace.as_deref()).await?
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
        .map(|o| status_applier::audit::audit(o, &expectations))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    if args.file.is_none() {
        check_sources(&policy.audit.source_checks, &objects, &mut audits).await?;
    }
    match args.output {
        AuditFormat::Table => print!("{}", status_applier::audit::table(&audits)),
        AuditFormat::Json => println!("{}", serde_json::to_string_pretty(&audits)?),
        AuditFormat::Yaml => print!("{}", status_applier::audit::annotated_yaml(&audits)),
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
    checks: &[SourceCheck],
    objects: &[serde_json::Value],
    audits: &mut [status_applier::audit::ObjectAudit],
) -> Result<()> {
    if checks.is_empty() {
        return Ok(());
    }
    let client = kube::Client::try_default()
        .await
        .context("connecting to the API server")?;
    for (object, audit) in objects.iter().zip(audits.iter_mut()) {
        let kind = GroupKind::from_api_version(
            object["apiVersion"].as_str().unwrap_or_default(),
            object["kind"].as_str().unwrap_or_default(),
        );
        for check in checks.iter().filter(|c| c.kind == kind) {
            let Some((source, described)) = follow(&client, object, &check.source.lookup).await?
            else {
                continue;
            };
            let source_has = check.source.path.lookup(&source).is_some();
            if let Some(v) = status_applier::audit::missing_from_source(
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

/// Objects from YAML or JSON documents; `List`s are flattened.
fn read_objects(file: &str) -> Result<Vec<serde_json::Value>> {
    let text = if file == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading standard input")?;
        s
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?
    };
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
    target: Option<&str>,
    audited: &[String],
    namespace: Option<&str>,
) -> Result<Vec<serde_json::Value>> {
    if target.is_none() && audited.is_empty() {
        bail!(
            "nothing to audit: name a KIND or KIND/NAME, or give a policy file (--policy) whose audit.kinds lists the kinds"
        );
    }
    let client = kube::Client::try_default()
        .await
        .context("connecting to the API server")?;
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
