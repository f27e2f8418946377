//! Diagnostics endpoints as Cluster API providers serve them, shared by `capt-controller`
//! and `status-applier`:
//!
//! - **metrics over HTTPS, for authorized scrapers only** (controller-runtime's metrics
//!   server with `filters.WithAuthenticationAndAuthorization`): the bearer token of each
//!   request is checked with a `TokenReview` (authentication.k8s.io/v1), then a
//!   `SubjectAccessReview` (authorization.k8s.io/v1) asks whether that user (with its groups,
//!   uid and extra) may `get` the non-resource URL `/metrics`. No or an invalid token: 401;
//!   not allowed: 403; allowed: the metrics; the API server cannot be asked: 503. Decisions
//!   are cached briefly ([`ALLOW_TTL`], [`DENY_TTL`], at most [`MAX_CACHED`] tokens), so a
//!   scraper does not cost two API calls per scrape. The certificate is `tls.crt`/`tls.key`
//!   of `--metrics-cert-dir`, else a self-signed one made at start. Plain HTTP without
//!   authentication only with `--insecure-diagnostics`.
//! - **probes** (`/healthz`, `/readyz`) on a plain-HTTP port that serves nothing else, for
//!   the kubelet.
//!
//! Also what else both binaries share of a process's plumbing: the logging set-up
//! ([`telemetry`]), the metrics' text ([`metrics_text`]) and the API server client with a
//! `User-Agent` of its own ([`kube_client`]).
//!
//! The process needs `create` on `tokenreviews` and `subjectaccessreviews`; a scraper needs
//! `get` on the non-resource URL `/metrics` (the `capt-controller-metrics-reader` ClusterRole
//! of `manifests/deploy/rbac.yaml`).
#![forbid(unsafe_code)]

mod auth;
mod client;
pub mod fence;
pub mod guard;
pub mod telemetry;
mod tls;
pub mod watches;

pub use auth::{ALLOW_TTL, Access, DENY_TTL, KubeReviewer, MAX_CACHED, Reviewer};
pub use client::{kube_client, kube_client_fenced};
pub use watches::{WatchHealth, WatchReport};

use anyhow::Context as _;
use axum::Router;
use axum::routing::MethodRouter;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// The Prometheus text exposition of `registry`, as both binaries serve it.
pub fn metrics_text(registry: &prometheus_client::registry::Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

/// The only path the metrics listener serves, and the non-resource URL a scraper must be
/// allowed to `get`.
pub const METRICS_PATH: &str = "/metrics";

/// The help texts of the diagnostics flags, the same in both binaries (each names its own
/// environment variables).
pub mod help {
    /// `--metrics-bind-address`.
    pub const METRICS_BIND_ADDRESS: &str = "Serve /metrics on this address: HTTPS, and only to a bearer token whose user may get the non-resource URL /metrics (TokenReview, then SubjectAccessReview)";
    /// `--metrics-cert-dir`.
    pub const METRICS_CERT_DIR: &str = "Directory holding tls.crt and tls.key for the metrics listener (a self-signed certificate is made at start when not given)";
    /// `--insecure-diagnostics`.
    pub const INSECURE_DIAGNOSTICS: &str = "Serve /metrics over plain HTTP without authentication or authorization. For local runs and tests only";
    /// `--health-probe-bind-address`.
    pub const HEALTH_PROBE_BIND_ADDRESS: &str =
        "Serve the probes /healthz and /readyz (plain HTTP, nothing else) on this address";
}

/// How the metrics listener serves.
#[derive(Clone, Debug)]
pub struct MetricsOptions {
    /// Where it listens.
    pub bind_address: SocketAddr,
    /// `tls.crt` and `tls.key` (PEM); a self-signed certificate when `None`.
    pub cert_dir: Option<PathBuf>,
    /// Plain HTTP, no authentication, no authorization.
    pub insecure: bool,
}

/// Binds the metrics listener and serves `metrics` (the handler of `GET /metrics`) on it in
/// a task of its own, authorized with TokenReview and SubjectAccessReview through `client`
/// (unless `insecure`). Returns the bound address; fails when the certificate cannot be read
/// or made, or the address cannot be bound.
pub async fn serve_metrics(
    options: &MetricsOptions,
    client: kube::Client,
    metrics: MethodRouter,
) -> anyhow::Result<SocketAddr> {
    serve_metrics_with(options, KubeReviewer::new(client), metrics).await
}

/// [`serve_metrics`] with another [`Reviewer`].
pub async fn serve_metrics_with<R: Reviewer>(
    options: &MetricsOptions,
    reviewer: R,
    metrics: MethodRouter,
) -> anyhow::Result<SocketAddr> {
    let tcp = bind(options.bind_address, "--metrics-bind-address").await?;
    let addr = tcp.local_addr()?;
    if options.insecure {
        tracing::warn!(
            %addr,
            "Serving metrics over plain HTTP without authentication (--insecure-diagnostics)"
        );
        let app = Router::new().route(METRICS_PATH, metrics);
        tokio::spawn(axum::serve(tcp, app).into_future());
        return Ok(addr);
    }
    let config = tls::server_config(options.cert_dir.as_deref())?;
    let app = auth::authorized(Arc::new(auth::Gate::new(reviewer)), metrics);
    tracing::info!(
        %addr,
        certificate = %options
            .cert_dir
            .as_ref()
            .map_or("self-signed".to_owned(), |d| d.display().to_string()),
        "Serving metrics over HTTPS to authorized scrapers (TokenReview, SubjectAccessReview)"
    );
    tokio::spawn(axum::serve(tls::TlsListener::new(tcp, config), app).into_future());
    Ok(addr)
}

/// Binds the probe listener and serves `probes` (its `/healthz` and `/readyz`, nothing
/// else) on it over plain HTTP in a task of its own. Returns the bound address.
pub async fn serve_probes(addr: SocketAddr, probes: Router) -> anyhow::Result<SocketAddr> {
    let tcp = bind(addr, "--health-probe-bind-address").await?;
    let addr = tcp.local_addr()?;
    tracing::info!(%addr, "Serving the probes /healthz and /readyz");
    tokio::spawn(axum::serve(tcp, probes).into_future());
    Ok(addr)
}

async fn bind(addr: SocketAddr, flag: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {flag} {addr}"))
}
