//! `status-applier`: the server (`serve`) and the client commands that talk to it.
#![forbid(unsafe_code)]

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use prometheus_client::registry::Registry;
use status_applier::audit::Expectation;
use status_applier::client::{Answer, Client};
use status_applier::config::{GroupKind, KindPath};
use status_applier::engine::{Engine, Settings};
use status_applier::metrics::Metrics;
use status_applier::policy::{LookupStep, PolicyFile, Scope, SourceCheck};
use status_applier::server::{AppState, probes, router};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A server-side-apply field-manager sidecar.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the intent API and apply intents to the API server.
    Serve(Box<ServeArgs>),
    /// Submit intents (YAML or JSON; several YAML documents in one file are submitted in order).
    Submit {
        #[command(flatten)]
        socket: SocketArg,
        /// The intent file, or - for standard input.
        #[arg(short = 'f', long = "filename")]
        file: String,
        /// Answer once the intent is merged, without waiting for its apply.
        #[arg(long)]
        no_wait: bool,
    },
    /// Print every desired document (as JSON, or as apply configurations with the kubectl
    /// command that reproduces each).
    Show {
        #[command(flatten)]
        socket: SocketArg,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Json)]
        output: Format,
        #[command(flatten)]
        filter: ShowFilter,
    },
    /// Print the recent conflicts.
    Conflicts {
        #[command(flatten)]
        socket: SocketArg,
    },
    /// Audit field ownership: every field with all its co-owners, and the protected paths
    /// (exactly the expected owner, no foreign writer). Exits 1 on a violation, 2 when it
    /// cannot run (unreadable input, an unreachable API server).
    Audit(AuditArgs),
}

#[derive(Args)]
struct AuditArgs {
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

/// The policy file: nothing is protected, replaced or expected without one (or the flags).
#[derive(Args)]
struct PolicyFileArg {
    /// The policy file (YAML; docs/status-applier.md). A flag given for a section of it
    /// replaces that section.
    #[arg(long = "policy", env = "STATUS_APPLIER_POLICY", value_name = "FILE")]
    policy_file: Option<PathBuf>,
}

impl PolicyFileArg {
    fn read(&self) -> Result<PolicyFile> {
        match &self.policy_file {
            Some(path) => PolicyFile::read(path).map_err(anyhow::Error::msg),
            None => Ok(PolicyFile::default()),
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum AuditFormat {
    Table,
    Json,
    Yaml,
}

/// Which desired documents `show` prints (all when no filter is given).
#[derive(Args)]
struct ShowFilter {
    /// Only this kind.
    #[arg(long)]
    kind: Option<String>,
    /// Only this namespace.
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// Only objects of this name.
    #[arg(long)]
    name: Option<String>,
    /// Only this field manager.
    #[arg(long)]
    manager: Option<String>,
    /// Only this subresource: `status` or `main`.
    #[arg(long)]
    subresource: Option<String>,
}

impl ShowFilter {
    fn query(&self) -> String {
        [
            ("kind", &self.kind),
            ("namespace", &self.namespace),
            ("name", &self.name),
            ("manager", &self.manager),
            ("subresource", &self.subresource),
        ]
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("&{k}={v}")))
        .collect()
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Json,
    Yaml,
}

#[derive(Args)]
struct SocketArg {
    /// The Unix socket of the server.
    #[arg(
        long,
        env = "STATUS_APPLIER_SOCKET",
        default_value = "/var/run/status-applier/applier.sock"
    )]
    socket: PathBuf,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    socket: SocketArg,
    /// Also serve /healthz, /readyz and /metrics on this TCP address (for probes and Prometheus).
    #[arg(long, env = "STATUS_APPLIER_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Also serve the whole intent API on this TCP address. For debugging only: off by default.
    #[arg(long, env = "STATUS_APPLIER_DEBUG_TCP_ADDR")]
    debug_tcp_addr: Option<std::net::SocketAddr>,
    #[command(flatten)]
    policy: PolicyArgs,
    #[command(flatten)]
    tuning: TuningArgs,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "STATUS_APPLIER_LOG_JSON")]
    log_json: bool,
}

/// The serving policy: each flag given replaces its section of the policy file.
#[derive(Args)]
struct PolicyArgs {
    #[command(flatten)]
    file: PolicyFileArg,
    /// Field managers accepted in intents (all when none is given).
    #[arg(
        long = "allow-manager",
        env = "STATUS_APPLIER_ALLOWED_MANAGERS",
        value_delimiter = ','
    )]
    allowed_managers: Vec<String>,
    /// Kinds accepted in intents, as Kind.group (all when none is given).
    #[arg(
        long = "allow-kind",
        env = "STATUS_APPLIER_ALLOWED_KINDS",
        value_delimiter = ','
    )]
    allowed_kinds: Vec<GroupKind>,
    /// Protected paths, as Kind.group:field.path (none when none is given).
    #[arg(
        long = "protect",
        env = "STATUS_APPLIER_PROTECT",
        value_delimiter = ','
    )]
    protected: Vec<KindPath>,
    /// Subtrees replaced whole by a fragment that carries them, as Kind.group:field.path
    /// (none when none is given).
    #[arg(
        long = "replace",
        env = "STATUS_APPLIER_REPLACE",
        value_delimiter = ','
    )]
    replaced: Vec<KindPath>,
    /// Managers whose conflicts outside protected paths are forced (none by default).
    #[arg(
        long = "force-manager",
        env = "STATUS_APPLIER_FORCE_MANAGERS",
        value_delimiter = ','
    )]
    force_managers: Vec<String>,
    /// Kinds to watch from the start, as apiVersion:Kind, so that documents are rebuilt
    /// from managedFields before the first intent arrives.
    #[arg(
        long = "watch-kind",
        env = "STATUS_APPLIER_WATCH_KINDS",
        value_delimiter = ','
    )]
    watch_kinds: Vec<String>,
    /// Do not publish Kubernetes Events for conflicts.
    #[arg(long)]
    no_events: bool,
}

/// The engine's defaults: the flags' defaults are read from them, so the two cannot drift.
const DEFAULTS: Settings = Settings::DEFAULT;

#[derive(Args)]
struct TuningArgs {
    /// How long a queued document waits for more intents before its apply.
    #[arg(long, env = "STATUS_APPLIER_COALESCE_WINDOW_MS", default_value_t = DEFAULTS.coalesce_window.as_millis() as u64)]
    coalesce_window_ms: u64,
    /// Apply a lone intent at once instead of after a quiet window: lower latency, a burst
    /// becomes two applies, and an apply may be planned on a cache that has not yet seen a
    /// write made just before the intent (see docs/status-applier.md: off by default).
    #[arg(long, env = "STATUS_APPLIER_APPLY_LONE_INTENTS_AT_ONCE")]
    apply_lone_intents_at_once: bool,
    /// Applies in flight at once.
    #[arg(
        long,
        env = "STATUS_APPLIER_MAX_CONCURRENT_APPLIES",
        default_value_t = DEFAULTS.max_concurrent_applies
    )]
    max_concurrent_applies: usize,
    /// First retry delay after an API error (doubles per failure, with jitter).
    #[arg(long, env = "STATUS_APPLIER_BACKOFF_BASE_MS", default_value_t = DEFAULTS.backoff_base.as_millis() as u64)]
    backoff_base_ms: u64,
    /// Longest retry delay.
    #[arg(long, env = "STATUS_APPLIER_BACKOFF_MAX_SECONDS", default_value_t = DEFAULTS.backoff_max.as_secs())]
    backoff_max_seconds: u64,
    /// How long a submitter that waits for the apply waits at most.
    #[arg(
        long,
        env = "STATUS_APPLIER_WAIT_TIMEOUT_SECONDS",
        default_value_t = DEFAULTS.wait_timeout.as_secs()
    )]
    wait_timeout_seconds: u64,
}

/// Exit codes: 0 success; 1 an audit found a violation, or a command failed; 2 an audit
/// could not run (so a check for exit 1 cannot pass on an error).
fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let audit_run = matches!(cli.command, Command::Audit(_));
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(Verdict::Clean) => std::process::ExitCode::SUCCESS,
        Ok(Verdict::Violations) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(if audit_run { 2 } else { 1 })
        }
    }
}

/// What a command that ran found.
enum Verdict {
    Clean,
    Violations,
}

async fn run(cli: Cli) -> Result<Verdict> {
    let done = |r: Result<()>| r.map(|()| Verdict::Clean);
    match cli.command {
        Command::Serve(args) => done(serve(*args).await),
        Command::Submit {
            socket,
            file,
            no_wait,
        } => done(submit(&socket.socket, &file, !no_wait).await),
        Command::Show {
            socket,
            output,
            filter,
        } => {
            let format = match output {
                Format::Json => "json",
                Format::Yaml => "yaml",
            };
            let path = format!("/v1/intents?format={format}{}", filter.query());
            done(print_answer(Client::new(&socket.socket).get(&path).await?))
        }
        Command::Conflicts { socket } => done(print_answer(
            Client::new(&socket.socket).get("/v1/conflicts").await?,
        )),
        Command::Audit(args) => audit(args).await,
    }
}

fn print_answer(answer: Answer) -> Result<()> {
    println!("{}", answer.body.trim_end());
    if !answer.status.is_success() {
        bail!("the status-applier answered {}", answer.status);
    }
    Ok(())
}

async fn submit(socket: &std::path::Path, file: &str, wait: bool) -> Result<()> {
    let text = if file == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading standard input")?;
        s
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?
    };
    let client = Client::new(socket);
    let mut failed = 0;
    for (i, doc) in split_documents(&text).into_iter().enumerate() {
        let answer = client.submit_raw(doc.into_bytes(), wait).await?;
        println!("{}", answer.body.trim_end());
        if !answer.status.is_success() {
            eprintln!(
                "intent {} of {file}: the status-applier answered {}",
                i + 1,
                answer.status
            );
            failed += 1;
        }
    }
    if failed > 0 {
        bail!("{failed} intent(s) of {file} were not accepted");
    }
    Ok(())
}

/// Splits a multi-document YAML stream; JSON and single documents pass through as they are,
/// so the server validates the bytes the user wrote.
fn split_documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else {
            let doc = docs.last_mut().expect("never empty");
            doc.push_str(line);
            doc.push('\n');
        }
    }
    docs.into_iter()
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .collect()
}

async fn serve(args: ServeArgs) -> Result<()> {
    status_applier::telemetry::init_logging(args.log_json);
    let file = args.policy.file.read()?;
    let flags = args.policy;
    // A flag (or its environment variable) given replaces the file's section.
    fn or_file<T>(flag: Vec<T>, file: Vec<T>) -> Vec<T> {
        if flag.is_empty() { file } else { flag }
    }
    let mut policy = file.serving();
    policy.allowed_managers = or_file(flags.allowed_managers, policy.allowed_managers);
    policy.allowed_kinds = or_file(flags.allowed_kinds, policy.allowed_kinds);
    policy.protected = or_file(flags.protected, policy.protected);
    policy.replaced = or_file(flags.replaced, policy.replaced);
    policy.force_managers = or_file(flags.force_managers, policy.force_managers);
    let watch_kinds = if flags.watch_kinds.is_empty() {
        file.watch_kinds
            .iter()
            .map(|w| (w.api_version.clone(), w.kind.clone()))
            .collect()
    } else {
        flags
            .watch_kinds
            .iter()
            .map(|watched| {
                watched
                    .rsplit_once(':')
                    .map(|(v, k)| (v.to_owned(), k.to_owned()))
                    .with_context(|| {
                        format!("invalid --watch-kind `{watched}`: expected apiVersion:Kind")
                    })
            })
            .collect::<Result<Vec<_>>>()?
    };
    tracing::info!(
        protected = policy.protected.len(),
        replaced = policy.replaced.len(),
        allowed_managers = ?policy.allowed_managers,
        watched = watch_kinds.len(),
        "Policy"
    );
    let t = args.tuning;
    let settings = Settings {
        coalesce_window: Duration::from_millis(t.coalesce_window_ms),
        apply_lone_intents_at_once: t.apply_lone_intents_at_once,
        max_concurrent_applies: t.max_concurrent_applies.max(1),
        backoff_base: Duration::from_millis(t.backoff_base_ms),
        backoff_max: Duration::from_secs(t.backoff_max_seconds),
        wait_timeout: Duration::from_secs(t.wait_timeout_seconds),
        ..Settings::default()
    };
    let client = kube::Client::try_default()
        .await
        .context("connecting to the API server")?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let engine = Engine::start(client, policy, settings, metrics, !flags.no_events);
    for (api_version, kind) in &watch_kinds {
        engine
            .watch_kind(api_version, kind)
            .await
            .with_context(|| format!("watching {api_version}:{kind}"))?;
    }
    let state = AppState {
        engine,
        registry: Arc::new(registry),
    };

    let socket = &args.socket.socket;
    if socket.exists() {
        std::fs::remove_file(socket)
            .with_context(|| format!("removing the stale socket {}", socket.display()))?;
    }
    let listener = tokio::net::UnixListener::bind(socket)
        .with_context(|| format!("binding {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o660))?;
    tracing::info!(socket = %socket.display(), "Serving the intent API");
    if let Some(addr) = args.metrics_addr {
        let tcp = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        tracing::info!(%addr, "Serving health and metrics");
        tokio::spawn(
            axum::serve(tcp, probes(state.clone()).with_state(state.clone())).into_future(),
        );
    }
    if let Some(addr) = args.debug_tcp_addr {
        let tcp = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        tracing::warn!(%addr, "Serving the whole intent API on TCP (debugging only)");
        tokio::spawn(axum::serve(tcp, router(state.clone())).into_future());
    }
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown())
        .await?;
    let _ = std::fs::remove_file(socket);
    Ok(())
}

async fn shutdown() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("signal handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
    tracing::info!("Shutting down");
}

async fn audit(args: AuditArgs) -> Result<Verdict> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
