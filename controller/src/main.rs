//! `capt-controller`: parses flags and wires the controllers, the publisher and the HTTP
//! endpoints (the `diagnostics` crate's probe and metrics listeners) together. Nothing else
//! lives here.
#![forbid(unsafe_code)]

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use capt_controller::context::{Context, DEFAULT_POLL_INTERVAL, Settings};
use capt_controller::metrics::Metrics;
use capt_controller::publish::Publisher;
use capt_controller::status::deletion::DEFAULT_STUCK_AFTER;
use clap::Parser;
use prometheus_client::registry::Registry;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Computes CAPT status and publishes it to the status-applier.
#[derive(Parser)]
#[command(version, about)]
struct Args {
    /// The status-applier's Unix socket.
    #[arg(
        long,
        env = "CAPT_APPLIER_SOCKET",
        default_value = "/var/run/status-applier/applier.sock"
    )]
    applier_socket: PathBuf,
    #[command(flatten)]
    diagnostics: DiagnosticsArgs,
    /// Report a deletion as stuck (DeletionFailed) after this many seconds.
    #[arg(long, env = "CAPT_STUCK_DELETION_SECONDS", default_value_t = DEFAULT_STUCK_AFTER.as_secs())]
    stuck_deletion_seconds: u64,
    /// Reconciles each of the four controllers runs at once: bounds what is in flight at the
    /// status-applier, and so both processes' memory, when thousands of objects change at
    /// once.
    #[arg(long, env = "CAPT_MAX_CONCURRENT_RECONCILES", default_value_t = 8)]
    max_concurrent_reconciles: u16,
    /// How often to look again while waiting for something not watched.
    #[arg(long, env = "CAPT_POLL_INTERVAL_SECONDS", default_value_t = DEFAULT_POLL_INTERVAL.as_secs())]
    poll_interval_seconds: u64,
    /// Trust this namespace with code: its WorkspaceTemplates (Terraform, run by the
    /// provider every namespace shares) are used, by objects of any namespace. A template of
    /// any other namespace, the object's own included, is refused (docs/security.md).
    /// Repeatable, or comma-separated in the environment variable. Every other reference
    /// (Secrets above all) stays in its object's own namespace.
    #[arg(
        long = "allow-template-namespace",
        value_name = "NAMESPACE",
        env = "CAPT_ALLOW_TEMPLATE_NAMESPACES",
        value_delimiter = ','
    )]
    allow_template_namespaces: Vec<String>,
    /// Let the applies of NAMESPACE render Workspaces on the ProviderConfig NAME (its cloud
    /// credentials); `*=NAME` for every namespace. Repeatable, or comma-separated in the
    /// environment variable. Any other ProviderConfig is refused (docs/security.md).
    #[arg(
        long = "allow-provider-config",
        value_name = "NAMESPACE=NAME",
        env = "CAPT_ALLOW_PROVIDER_CONFIGS",
        value_delimiter = ',',
        default_value = "*=default"
    )]
    allow_provider_configs: Vec<String>,
    /// Report an object (a `capt_write_loops_total` count and a Warning Event, reason
    /// WriteLoop) once our managers write it more than this many times within
    /// --write-loop-window-seconds without a change of its spec or of what the writes observe.
    #[arg(long, env = "CAPT_WRITE_LOOP_LIMIT", default_value_t = capt_controller::write_loops::DEFAULT_WRITES)]
    write_loop_limit: usize,
    /// The window of --write-loop-limit; an object is reported at most once per window.
    #[arg(long, env = "CAPT_WRITE_LOOP_WINDOW_SECONDS", default_value_t = capt_controller::write_loops::DEFAULT_WINDOW.as_secs())]
    write_loop_window_seconds: u64,
    #[command(flatten)]
    leader: LeaderArgs,
    /// Manage the objects of this namespace only (all namespaces by default).
    #[arg(long, env = "CAPT_NAMESPACE")]
    namespace: Option<String>,
    /// Manage only the objects labelled `cluster.x-k8s.io/watch-filter=<value>` (Cluster API's
    /// sharding: one Deployment per value, each with a Lease of its own).
    #[arg(long, env = "CAPT_WATCH_FILTER")]
    watch_filter: Option<String>,
    /// Cluster API core does not run beside this controller: `capt-cluster` then writes each
    /// Cluster's readiness, phase and `spec.controlPlaneEndpoint` itself (a Cluster that
    /// carries core's finalizer is still left to core). Without it, the Cluster is core's
    /// alone, as the provider contract has it, even before core's finalizer appears.
    #[arg(
        long,
        env = "CAPT_WITHOUT_CLUSTER_API_CORE",
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_value_t = false,
        default_missing_value = "true"
    )]
    without_cluster_api_core: bool,
    /// Log as JSON lines.
    #[arg(long, env = "CAPT_LOG_JSON")]
    log_json: bool,
}

/// The diagnostics listeners (the `diagnostics` crate): metrics over HTTPS for authorized
/// scrapers, probes on a plain port of their own.
#[derive(clap::Args)]
struct DiagnosticsArgs {
    #[arg(
        long,
        env = "CAPT_METRICS_BIND_ADDRESS",
        default_value = "0.0.0.0:8443",
        visible_alias = "diagnostics-address",
        help = diagnostics::help::METRICS_BIND_ADDRESS
    )]
    metrics_bind_address: std::net::SocketAddr,
    #[arg(long, env = "CAPT_METRICS_CERT_DIR", help = diagnostics::help::METRICS_CERT_DIR)]
    metrics_cert_dir: Option<PathBuf>,
    #[arg(long, env = "CAPT_INSECURE_DIAGNOSTICS", help = diagnostics::help::INSECURE_DIAGNOSTICS)]
    insecure_diagnostics: bool,
    #[arg(
        long,
        env = "CAPT_HEALTH_PROBE_BIND_ADDRESS",
        default_value = "0.0.0.0:8081",
        visible_alias = "health-addr",
        help = diagnostics::help::HEALTH_PROBE_BIND_ADDRESS
    )]
    health_probe_bind_address: std::net::SocketAddr,
}

/// Leader election: only the holder of a coordination Lease reconciles and writes, until the
/// Lease would expire unrenewed; the others keep their caches warm and wait, and take over
/// once it has expired. A leader whose Lease lapses stops writing and stands again as a
/// candidate; it does not exit.
#[derive(clap::Args)]
struct LeaderArgs {
    /// Run without leader election (a single replica).
    #[arg(long, env = "CAPT_NO_LEADER_ELECTION")]
    no_leader_election: bool,
    /// Namespace of the Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    leader_election_namespace: String,
    /// Name of the Lease.
    #[arg(
        long,
        env = "CAPT_LEADER_ELECTION_LEASE",
        default_value = "capt-controller"
    )]
    leader_election_lease: String,
    /// How long a leader's claim lasts without renewal; it stops writing a fifth of it
    /// before.
    #[arg(long, env = "CAPT_LEASE_DURATION_SECONDS", default_value_t = 15)]
    lease_duration_seconds: u64,
    /// How often the leader renews its Lease, counted from its last renewal (at most every
    /// (duration less a fifth) / 2 s).
    #[arg(long, env = "CAPT_LEASE_RENEW_PERIOD_SECONDS", default_value_t = 5)]
    lease_renew_period_seconds: u64,
    /// How often a replica that does not lead reads the Lease, and a leader whose renewal
    /// failed tries again.
    #[arg(long, env = "CAPT_LEASE_RETRY_PERIOD_SECONDS", default_value_t = 2)]
    lease_retry_period_seconds: u64,
}

impl LeaderArgs {
    /// The election these flags ask for; this replica is `POD_NAME`.
    fn election(&self, on_write: leadership::OnWrite) -> anyhow::Result<leadership::Election> {
        let timing = leadership::Timing {
            duration: Duration::from_secs(self.lease_duration_seconds),
            renew_every: Duration::from_secs(self.lease_renew_period_seconds),
            retry: Duration::from_secs(self.lease_retry_period_seconds),
        };
        timing.check().map_err(|e| {
            anyhow::anyhow!(
                "--lease-duration-seconds {} with --lease-renew-period-seconds {}: {e}",
                self.lease_duration_seconds,
                self.lease_renew_period_seconds
            )
        })?;
        Ok(leadership::Election {
            namespace: self.leader_election_namespace.clone(),
            lease: self.leader_election_lease.clone(),
            identity: std::env::var("POD_NAME")
                .unwrap_or_else(|_| format!("capt-controller-{}", std::process::id())),
            timing,
            field_manager: "capt-controller-leader".into(),
            on_write: Some(on_write),
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    diagnostics::telemetry::init_logging(args.log_json);
    let version = env!("CARGO_PKG_VERSION");
    // Two clients: the Lease and the metrics' access reviews are never fenced (a replica
    // that does not lead must still try to lead, and serve its metrics); every other request
    // that writes is refused while this replica does not lead.
    let unfenced = diagnostics::kube_client("capt-controller", version).await?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let lead = match args.leader.no_leader_election {
        true => leadership::Lead::unconditional(),
        false => {
            let writes = metrics.lease_writes.clone();
            let on_write = leadership::OnWrite(Arc::new(move |result: &'static str| {
                let label = capt_controller::metrics::LeaseWriteLabel {
                    result: result.into(),
                };
                writes.get_or_create(&label).inc();
            }));
            leadership::elect(unfenced.clone(), args.leader.election(on_write)?)
        }
    };
    let may_write: diagnostics::fence::MayWrite = {
        let lead = lead.clone();
        Arc::new(move || lead.may_write())
    };
    let client =
        diagnostics::kube_client_fenced("capt-controller", version, may_write.clone()).await?;
    let applier = status_applier_api::Client::new(&args.applier_socket);
    let assignment = capt_controller::run::Assignment {
        namespace: args.namespace,
        watch_filter: args.watch_filter,
        concurrency: args.max_concurrent_reconciles.max(1),
    };
    let workspace_policy =
        capt_controller::workspace_policy::WorkspacePolicy::parse(&args.allow_provider_configs)
            .map_err(anyhow::Error::msg)?;
    trusted_namespaces_hold(&client, &args.allow_template_namespaces).await?;
    let trusted: std::collections::BTreeSet<String> =
        args.allow_template_namespaces.into_iter().collect();
    let reporting = capt_controller::watches::Reporting {
        health: diagnostics::WatchHealth::new(metrics.watch_failures.clone()),
        unreadables: capt_controller::unreadable::Unreadables::new(
            metrics.objects_unreadable.clone(),
            Some(capt_controller::context::recorder(client.clone())),
        ),
    };
    let health = reporting.health.clone();
    let watches = capt_controller::run::Watches::new(&client, &assignment, &trusted, reporting);
    let ctx = Arc::new(Context {
        caches: watches.caches(),
        rewake: capt_controller::rewake::Rewake::new(metrics.rewake_gave_up.clone()),
        client: client.clone(),
        publisher: Publisher::new(applier.clone()).fenced(may_write),
        metrics,
        settings: Settings {
            stuck_deletion_after: Duration::from_secs(args.stuck_deletion_seconds),
            poll_interval: Duration::from_secs(args.poll_interval_seconds.max(1)),
            allowed_template_namespaces: Arc::new(trusted),
            workspace_policy: Arc::new(workspace_policy),
            without_core: args.without_cluster_api_core,
        },
        events: capt_controller::context::recorder(client.clone()),
        seen_secrets: Default::default(),
        write_loops: std::sync::Mutex::new(capt_controller::write_loops::WriteLoops::new(
            capt_controller::write_loops::Limit {
                writes: args.write_loop_limit,
                window: Duration::from_secs(args.write_loop_window_seconds.max(1)),
            },
        )),
    });
    let registry = Arc::new(registry);
    let probes = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(Readiness { applier, health });
    let d = args.diagnostics;
    diagnostics::serve_probes(d.health_probe_bind_address, probes).await?;
    let options = diagnostics::MetricsOptions {
        bind_address: d.metrics_bind_address,
        cert_dir: d.metrics_cert_dir,
        insecure: d.insecure_diagnostics,
    };
    let metrics = get(move || {
        let registry = registry.clone();
        async move { diagnostics::metrics_text(&registry) }
    });
    diagnostics::serve_metrics(&options, unfenced, metrics).await?;
    tokio::spawn(follow_the_lead(lead.clone(), ctx.clone()));
    capt_controller::run::run(ctx, assignment, watches, lead.clone()).await;
    // Stopped by a signal: the Lease let go, so that the next leader need not wait for it to
    // expire.
    lead.release().await;
    Ok(())
}

/// Follows where this replica stands: `capt_leading`, and once another replica holds the
/// Lease, what this one remembers of its deliveries may be out of date when it leads again:
/// it forgets them (`Publisher::forget_all`).
async fn follow_the_lead(lead: leadership::Lead, ctx: Arc<Context>) {
    let mut roles = lead.watch();
    loop {
        let role = roles.borrow_and_update().clone();
        match &role {
            leadership::Role::Candidate { holder: Some(h) } if lead.identity() != Some(h) => {
                ctx.publisher.forget_all();
            }
            _ => {}
        }
        ctx.metrics.leading.set(i64::from(lead.may_write()));
        // A lead ends at its deadline with no change of role: looked at again then.
        let until = match role {
            leadership::Role::Leading { until } if until > tokio::time::Instant::now() => {
                Some(until)
            }
            _ => None,
        };
        let deadline = async {
            match until {
                Some(until) => tokio::time::sleep_until(until).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = roles.changed() => if changed.is_err() { return },
            () = deadline => {}
        }
    }
}

/// Refuses to start when a namespace trusted with code was not created by the install
/// (`tenancy::untrusted_namespace`): a pod that will not start is what an operator notices,
/// where a warning would leave every stack's credentials to whoever made the namespace.
async fn trusted_namespaces_hold(client: &kube::Client, names: &[String]) -> anyhow::Result<()> {
    let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    let mut refused = Vec::new();
    for name in names {
        let namespace = api.get_opt(name).await.map_err(|e| {
            anyhow::anyhow!(
                "reading namespace {name}, trusted with code (--allow-template-namespace): {e}"
            )
        })?;
        if let Some(why) = capt_controller::tenancy::untrusted_namespace(name, namespace.as_ref()) {
            tracing::error!(namespace = %name, "{why}");
            refused.push(why);
        }
    }
    match refused.is_empty() {
        true => Ok(()),
        false => Err(anyhow::anyhow!("refusing to start: {}", refused.join("; "))),
    }
}

/// What `/readyz` asks.
#[derive(Clone)]
struct Readiness {
    applier: status_applier_api::Client,
    health: diagnostics::WatchHealth,
}

/// Ready when the status-applier answers (without it no status can be written) and every
/// watch has listed its kind and none keeps failing (a reconcile would work on a partial
/// picture); else what is wrong, one line each. A replica standing by runs its watches too,
/// and is ready once they have listed: it takes over with warm caches.
async fn readyz(State(r): State<Readiness>) -> (StatusCode, String) {
    let mut problems = match r.applier.get("/healthz").await {
        Ok(a) if a.status.is_success() => String::new(),
        Ok(a) => format!("status-applier answered {}\n", a.status),
        Err(e) => format!("status-applier: {e}\n"),
    };
    if let Err(watches) = r.health.readiness(std::time::Instant::now()) {
        problems.push_str(&watches);
    }
    match problems.is_empty() {
        true => (StatusCode::OK, "ok".into()),
        false => (StatusCode::SERVICE_UNAVAILABLE, problems),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Args::command().debug_assert();
    }
}
