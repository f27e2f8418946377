//! `capt-controller`: parses flags and wires the controllers, the publisher and the HTTP
//! endpoints together. Nothing else lives here.
#![forbid(unsafe_code)]

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use capt_controller::context::{Context, Settings};
use capt_controller::metrics::Metrics;
use capt_controller::publish::Publisher;
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
    /// Serve /healthz, /readyz and /metrics here.
    #[arg(long, env = "CAPT_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: std::net::SocketAddr,
    /// Report a deletion as stuck (DeletionFailed) after this many seconds.
    #[arg(long, env = "CAPT_STUCK_DELETION_SECONDS", default_value_t = 900)]
    stuck_deletion_seconds: u64,
    /// How often to look again while waiting for something not watched.
    #[arg(long, env = "CAPT_POLL_INTERVAL_SECONDS", default_value_t = 5)]
    poll_interval_seconds: u64,
    /// Manage the objects of this namespace only (all namespaces by default).
    #[arg(long, env = "CAPT_NAMESPACE")]
    namespace: Option<String>,
    /// Log as JSON lines.
    #[arg(long, env = "CAPT_LOG_JSON")]
    log_json: bool,
}

#[derive(Clone)]
struct Http {
    registry: Arc<Registry>,
    applier: status_applier::client::Client,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    status_applier::telemetry::init_logging(args.log_json);
    let client = kube::Client::try_default()
        .await
        .context("connecting to the API server")?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let applier = status_applier::client::Client::new(&args.applier_socket);
    let ctx = Arc::new(Context {
        client,
        publisher: Publisher::new(applier.clone()),
        metrics,
        settings: Settings {
            stuck_deletion_after: Duration::from_secs(args.stuck_deletion_seconds),
            poll_interval: Duration::from_secs(args.poll_interval_seconds.max(1)),
        },
    });
    let http = Http {
        registry: Arc::new(registry),
        applier,
    };
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(http);
    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("binding {}", args.metrics_addr))?;
    tracing::info!(addr = %args.metrics_addr, "Serving health and metrics");
    tokio::spawn(axum::serve(listener, app).into_future());
    let scope = capt_controller::run::Scope {
        namespace: args.namespace,
    };
    capt_controller::run::run(ctx, scope).await;
    Ok(())
}

/// Ready when the status-applier answers: without it no status can be written.
async fn readyz(State(http): State<Http>) -> (StatusCode, String) {
    match http.applier.get("/healthz").await {
        Ok(a) if a.status.is_success() => (StatusCode::OK, "ok".into()),
        Ok(a) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("status-applier answered {}", a.status),
        ),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn metrics_text(State(http): State<Http>) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &http.registry)
        .expect("writing to a String cannot fail");
    out
}
