//! `status-applier serve`: its flags (socket, policy, tuning), the server it starts and its
//! graceful shutdown.

use crate::SocketArg;
use anyhow::{Context, Result};
use clap::Args;
use leadership::LeaseToFollow;
use prometheus_client::registry::Registry;
use status_applier::config::{GroupKind, KindPath, Policy};
use status_applier::engine::{Engine, Tuning};
use status_applier::metrics::Metrics;
use status_applier::ownership::PolicyFileArg;
use status_applier::server::{AppState, metrics_route, probes, router};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The socket's mode: the owner and its group (the controller's container shares the pod's
/// group) may connect, nobody else.
const SOCKET_MODE: u32 = 0o660;

#[derive(Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    socket: SocketArg,
    #[command(flatten)]
    diagnostics: DiagnosticsArgs,
    /// Also serve the whole intent API, without authentication, on this TCP address: a
    /// loopback address only (127.0.0.1, ::1; anything else is refused). For debugging
    /// only: off by default. Never in production: `kubectl port-forward` reaches the pod's
    /// loopback, so whoever may port-forward to the pod writes with the applier's rights.
    #[arg(long, env = "STATUS_APPLIER_DEBUG_TCP_ADDR", value_parser = loopback_address)]
    debug_tcp_addr: Option<SocketAddr>,
    #[command(flatten)]
    policy: PolicyArgs,
    #[command(flatten)]
    tuning: TuningArgs,
    #[command(flatten)]
    leader: LeaderArgs,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "STATUS_APPLIER_LOG_JSON")]
    log_json: bool,
}

/// The replica's leader election, when several replicas run (a Deployment): the applier
/// writes only while the Lease its controller holds names this pod (`docs/status-applier.md`,
/// "Replicas"). Without `--leader-election-lease` it always writes.
#[derive(Args)]
struct LeaderArgs {
    /// The Lease the controllers of the replicas elect their leader on.
    #[arg(long, env = "STATUS_APPLIER_LEADER_ELECTION_LEASE")]
    leader_election_lease: Option<String>,
    /// The Lease's namespace.
    #[arg(
        long,
        env = "STATUS_APPLIER_LEADER_ELECTION_NAMESPACE",
        requires = "leader_election_lease"
    )]
    leader_election_namespace: Option<String>,
    /// This replica's identity in the Lease, as its controller writes it (the pod's name).
    #[arg(long, env = "POD_NAME", requires = "leader_election_lease")]
    leader_election_identity: Option<String>,
}

impl LeaderArgs {
    fn lease(self) -> Result<Option<LeaseToFollow>> {
        let Some(name) = self.leader_election_lease else {
            return Ok(None);
        };
        let namespace = self.leader_election_namespace.context(
            "--leader-election-lease needs --leader-election-namespace (the Lease's namespace)",
        )?;
        let identity = self.leader_election_identity.context(
            "--leader-election-lease needs this replica's identity: --leader-election-identity \
             or POD_NAME (the name its controller writes into the Lease)",
        )?;
        Ok(Some(LeaseToFollow {
            namespace,
            name,
            identity,
        }))
    }
}

/// The diagnostics listeners on TCP (the `diagnostics` crate): both off unless given.
#[derive(Args)]
struct DiagnosticsArgs {
    #[arg(
        long,
        env = "STATUS_APPLIER_METRICS_BIND_ADDRESS",
        visible_alias = "diagnostics-address",
        help = diagnostics::help::METRICS_BIND_ADDRESS
    )]
    metrics_bind_address: Option<SocketAddr>,
    #[arg(long, env = "STATUS_APPLIER_METRICS_CERT_DIR", help = diagnostics::help::METRICS_CERT_DIR)]
    metrics_cert_dir: Option<std::path::PathBuf>,
    #[arg(long, env = "STATUS_APPLIER_INSECURE_DIAGNOSTICS", help = diagnostics::help::INSECURE_DIAGNOSTICS)]
    insecure_diagnostics: bool,
    #[arg(
        long,
        env = "STATUS_APPLIER_HEALTH_PROBE_BIND_ADDRESS",
        visible_alias = "health-addr",
        help = diagnostics::help::HEALTH_PROBE_BIND_ADDRESS
    )]
    health_probe_bind_address: Option<SocketAddr>,
}

/// `--debug-tcp-addr`: the debug listener serves the whole intent API (which can, say, move
/// a Cluster's endpoint) without authentication, so it listens on loopback only.
fn loopback_address(value: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = value
        .parse()
        .map_err(|e| format!("`{value}` is not an address: {e}"))?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{addr} is not a loopback address: the debug listener serves the whole intent API \
             without authentication, so it listens on 127.0.0.1 or [::1] only"
        ));
    }
    Ok(addr)
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
    #[arg(long, env = "STATUS_APPLIER_NO_EVENTS")]
    no_events: bool,
    /// Watch only this namespace's objects (of namespaced kinds): one shard of a sharded
    /// deployment. Intents for other objects are still served, read on demand.
    #[arg(long = "watch-namespace", env = "STATUS_APPLIER_WATCH_NAMESPACE")]
    watch_namespace: Option<String>,
    /// Watch only the objects this label selector matches (`key=value`), e.g. the
    /// controller's shard label. Intents for other objects are still served, read on demand.
    #[arg(
        long = "watch-label-selector",
        env = "STATUS_APPLIER_WATCH_LABEL_SELECTOR"
    )]
    watch_label_selector: Option<String>,
}

/// The engine's defaults: the flags' defaults are read from them, so the two cannot drift.
const DEFAULTS: Tuning = Tuning::DEFAULT;

#[derive(Args)]
struct TuningArgs {
    /// How long a queued document waits for more intents before its apply.
    #[arg(long, env = "STATUS_APPLIER_COALESCE_WINDOW_MS", default_value_t = DEFAULTS.coalesce_window.as_millis() as u64)]
    coalesce_window_ms: u64,
    /// Apply an intent for a key that was quiet for a window at once (leading edge, the
    /// default); what follows within the window, or while that apply runs, coalesces into
    /// the next apply, so a burst is at most two applies. `=false`: every apply waits for a
    /// quiet window (trailing edge; a burst is one apply, a lone change pays the window).
    #[arg(
        long,
        env = "STATUS_APPLIER_APPLY_LONE_INTENTS_AT_ONCE",
        default_value_t = DEFAULTS.apply_lone_intents_at_once,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    apply_lone_intents_at_once: bool,
    /// Applies in flight at once.
    #[arg(
        long,
        env = "STATUS_APPLIER_MAX_CONCURRENT_APPLIES",
        default_value_t = DEFAULTS.max_concurrent_applies
    )]
    max_concurrent_applies: usize,
    /// How long a document waits for the watch to show its object at least at the version
    /// its intent names (`notOlderThan`) before the object is read instead.
    #[arg(long, env = "STATUS_APPLIER_VIEW_WAIT_MS", default_value_t = DEFAULTS.view_wait.as_millis() as u64)]
    view_wait_ms: u64,
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

impl PolicyArgs {
    /// The serving policy and the kinds watched from the start: the policy file's, each
    /// section replaced by its flag (or its environment variable) when given.
    fn policy(&self) -> Result<(Policy, Vec<(String, String)>)> {
        let file = self.file.read()?;
        fn or_file<T: Clone>(flag: &[T], file: Vec<T>) -> Vec<T> {
            if flag.is_empty() { file } else { flag.to_vec() }
        }
        let mut policy = file.serving();
        policy.allowed_managers = or_file(&self.allowed_managers, policy.allowed_managers);
        policy.allowed_kinds = or_file(&self.allowed_kinds, policy.allowed_kinds);
        policy.protected = or_file(&self.protected, policy.protected);
        policy.replaced = or_file(&self.replaced, policy.replaced);
        policy.force_managers = or_file(&self.force_managers, policy.force_managers);
        let watch_kinds = if self.watch_kinds.is_empty() {
            file.watch_kinds
                .iter()
                .map(|w| (w.api_version.clone(), w.kind.clone()))
                .collect()
        } else {
            self.watch_kinds
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
        Ok((policy, watch_kinds))
    }
}

impl TuningArgs {
    /// The engine's tuning.
    fn tuning(&self) -> Tuning {
        Tuning {
            coalesce_window: Duration::from_millis(self.coalesce_window_ms),
            apply_lone_intents_at_once: self.apply_lone_intents_at_once,
            max_concurrent_applies: self.max_concurrent_applies.max(1),
            view_wait: Duration::from_millis(self.view_wait_ms),
            backoff_base: Duration::from_millis(self.backoff_base_ms),
            backoff_max: Duration::from_secs(self.backoff_max_seconds),
            wait_timeout: Duration::from_secs(self.wait_timeout_seconds),
            ..Tuning::default()
        }
    }
}

pub(crate) async fn serve(args: ServeArgs) -> Result<()> {
    diagnostics::telemetry::init_logging(args.log_json);
    let (policy, watch_kinds) = args.policy.policy()?;
    let flags = args.policy;
    tracing::info!(
        protected = policy.protected.len(),
        replaced = policy.replaced.len(),
        allowed_managers = ?policy.allowed_managers,
        watched = watch_kinds.len(),
        "Policy"
    );
    let lease = args.leader.lease()?;
    let tuning = args.tuning.tuning();
    let client = diagnostics::kube_client("status-applier", env!("CARGO_PKG_VERSION")).await?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let scope = status_applier::live::WatchScope {
        namespace: flags.watch_namespace,
        label_selector: flags.watch_label_selector,
    };
    let engine = Engine::start(
        client.clone(),
        policy,
        tuning,
        metrics,
        !flags.no_events,
        scope,
    );
    match lease {
        Some(lease) => {
            tracing::info!(
                lease = lease.name,
                namespace = lease.namespace,
                identity = lease.identity,
                "Writing only while the Lease names this replica"
            );
            engine.follow_lease(lease);
        }
        None => {
            engine.metrics().leading.set(1);
        }
    }
    for (api_version, kind) in &watch_kinds {
        engine
            .watch_kind(api_version, kind)
            .await
            .with_context(|| format!("watching {api_version}:{kind}"))?;
    }
    let state = AppState {
        engine,
        registry: Arc::new(registry),
        api_probe: Arc::default(),
    };

    let socket = &args.socket.socket;
    let listener = bind_socket(socket)?;
    tracing::info!(socket = %socket.display(), "Serving the intent API");
    serve_diagnostics(args.diagnostics, client, &state).await?;
    if let Some(addr) = args.debug_tcp_addr {
        let tcp = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding --debug-tcp-addr {addr}"))?;
        tracing::warn!(%addr, "Serving the whole intent API on TCP (debugging only)");
        tokio::spawn(axum::serve(tcp, router(state.clone())).into_future());
    }
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown())
        .await?;
    let _ = std::fs::remove_file(socket);
    Ok(())
}

/// Starts the probe and metrics listeners that are asked for.
async fn serve_diagnostics(
    d: DiagnosticsArgs,
    client: kube::Client,
    state: &AppState,
) -> Result<()> {
    if let Some(addr) = d.health_probe_bind_address {
        diagnostics::serve_probes(addr, probes(state.clone()).with_state(state.clone())).await?;
    }
    if let Some(bind_address) = d.metrics_bind_address {
        let options = diagnostics::MetricsOptions {
            bind_address,
            cert_dir: d.metrics_cert_dir,
            insecure: d.insecure_diagnostics,
        };
        diagnostics::serve_metrics(&options, client, metrics_route(state.clone())).await?;
    }
    Ok(())
}

/// Binds the Unix socket with its final mode from the start: it is bound and given
/// [`SOCKET_MODE`] in a private directory (0700) beside its path, then renamed onto the path
/// (replacing a stale socket), so the path never carries a socket with another mode. (A
/// umask set around `bind` would do the same, but for every thread of the process.)
fn bind_socket(socket: &Path) -> Result<tokio::net::UnixListener> {
    let parent = socket
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    socket
        .file_name()
        .with_context(|| format!("the socket path {} names no file", socket.display()))?;
    // Short names: a socket path is limited to 107 bytes, and the one bound first should
    // not be much longer than the final one.
    let private = parent.join(format!(".sa-{}", std::process::id()));
    // A directory left by an earlier process with this pid (a crash) is ours to replace.
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .with_context(|| format!("creating {}", private.display()))?;
    let bound = (|| {
        let inside = private.join("s");
        let listener = tokio::net::UnixListener::bind(&inside)
            .with_context(|| format!("binding {}", socket.display()))?;
        std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(SOCKET_MODE))
            .with_context(|| format!("setting the mode of {}", inside.display()))?;
        std::fs::rename(&inside, socket)
            .with_context(|| format!("moving the socket onto {}", socket.display()))?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&private);
    bound
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
