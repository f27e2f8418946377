//! The intent API: HTTP/1.1 + JSON on a Unix socket (and, for debugging, on TCP), plus the
//! health and metrics endpoints.
//!
//! | route | what |
//! | --- | --- |
//! | `POST /v1/intents[?wait=false]` | submit an intent (JSON or YAML); answers its outcome |
//! | `GET /v1/intents[?format=yaml]` | every desired document; YAML prints apply configurations with the kubectl command that reproduces each; filters `kind`, `namespace`, `name`, `manager`, `subresource` (`status` or `main`) |
//! | `GET /v1/conflicts` | recent conflicts |
//! | `GET /healthz`, `/readyz`, `/metrics` | liveness, readiness (API server reachable, caches synced), Prometheus text |
//!
//! On TCP, the probes ([`probes`]) and the metrics ([`metrics_route`], served over HTTPS to
//! authorized scrapers by the `diagnostics` crate) have listeners of their own.

use crate::apply::apply_body;
use crate::engine::{DesiredView, Engine};
use crate::intent::{Intent, IntentError, IntentExt, MAX_INTENT_BYTES};
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use axum::{Json, Router};
use http_body_util::{BodyExt, Limited};
use prometheus_client::registry::Registry;
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The engine.
    pub engine: Arc<Engine>,
    /// The metrics registry.
    pub registry: Arc<Registry>,
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    probes(state.clone())
        .route("/metrics", get(metrics))
        .route("/v1/intents", post(submit).get(desired))
        .route("/v1/conflicts", get(conflicts))
        .with_state(state)
}

/// The probes only, `/healthz` and `/readyz` (for the kubelet, on TCP).
pub fn probes(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// `GET /metrics` (Prometheus text), for the metrics listener.
pub fn metrics_route(state: AppState) -> MethodRouter {
    get(metrics).with_state(state)
}

#[derive(Deserialize)]
struct SubmitQuery {
    #[serde(default = "yes")]
    wait: bool,
}

fn yes() -> bool {
    true
}

async fn submit(
    State(state): State<AppState>,
    Query(q): Query<SubmitQuery>,
    body: Body,
) -> Response {
    let bytes = match Limited::new(body, MAX_INTENT_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return refuse(IntentError::TooLarge(MAX_INTENT_BYTES + 1)),
    };
    let intent = match Intent::parse(&bytes).and_then(|i| i.validate(state.engine.policy())) {
        Ok(intent) => intent,
        Err(e) => return refuse(e),
    };
    let outcome = state.engine.submit(intent, q.wait).await;
    // The API crate's contract: its client reads these statuses back.
    let status = StatusCode::from_u16(outcome.action.status_code())
        .expect("the API crate answers valid statuses");
    (status, Json(outcome)).into_response()
}

fn refuse(e: IntentError) -> Response {
    let status = match e {
        IntentError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        IntentError::ManagerNotAllowed(_) | IntentError::KindNotAllowed(_) => StatusCode::FORBIDDEN,
        _ => StatusCode::BAD_REQUEST,
    };
    tracing::info!(error = %e, "Rejected intent");
    (
        status,
        Json(json!({"action": "rejected", "error": e.to_string()})),
    )
        .into_response()
}

#[derive(Deserialize)]
struct FormatQuery {
    #[serde(default)]
    format: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    manager: Option<String>,
    #[serde(default)]
    subresource: Option<String>,
}

impl FormatQuery {
    /// True when the view matches every filter given (kind case-insensitively; subresource
    /// `status` or `main`).
    fn matches(&self, v: &DesiredView) -> bool {
        let is = |filter: &Option<String>, value: &str| {
            filter
                .as_deref()
                .is_none_or(|f| f.eq_ignore_ascii_case(value))
        };
        let subresource = if v.key.subresource.is_some() {
            "status"
        } else {
            "main"
        };
        is(&self.kind, &v.key.object.kind)
            && is(
                &self.namespace,
                v.key.object.namespace.as_deref().unwrap_or(""),
            )
            && is(&self.name, &v.key.object.name)
            && is(&self.manager, &v.key.field_manager)
            && is(&self.subresource, subresource)
    }
}

async fn desired(State(state): State<AppState>, Query(q): Query<FormatQuery>) -> Response {
    let views: Vec<DesiredView> = state
        .engine
        .desired()
        .into_iter()
        .filter(|v| q.matches(v))
        .collect();
    match q.format.as_deref() {
        None | Some("json") => Json(views).into_response(),
        Some("yaml") => (
            [(header::CONTENT_TYPE, "application/yaml")],
            apply_configurations(&views),
        )
            .into_response(),
        Some(other) => (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": format!("unknown format `{other}`: expected json or yaml")})),
        )
            .into_response(),
    }
}

/// Each desired document as the YAML apply configuration the applier sends, preceded by
/// the kubectl command that sends the same apply.
pub fn apply_configurations(views: &[DesiredView]) -> String {
    let mut out = String::new();
    for view in views {
        let body = apply_body(&view.key, view.uid.as_deref(), None, &view.document);
        out.push_str("---\n");
        out.push_str(&format!("# {}\n# {}\n", view.key, kubectl_command(view)));
        out.push_str(&serde_yaml::to_string(&body).unwrap_or_default());
    }
    out
}

/// The kubectl command that applies a desired document exactly as the applier does.
pub fn kubectl_command(view: &DesiredView) -> String {
    let subresource = if view.key.subresource.is_some() {
        " --subresource=status"
    } else {
        ""
    };
    format!(
        "kubectl apply --server-side --field-manager={}{subresource} -f intent.yaml",
        view.key.field_manager
    )
}

async fn conflicts(State(state): State<AppState>) -> Response {
    Json(state.engine.conflicts()).into_response()
}

async fn readyz(State(state): State<AppState>) -> Response {
    let client = state.engine.live().client().clone();
    let reachable = tokio::time::timeout(Duration::from_secs(2), client.apiserver_version()).await;
    match reachable {
        Ok(Ok(_)) if state.engine.live().synced() => (StatusCode::OK, "ok").into_response(),
        Ok(Ok(_)) => (StatusCode::SERVICE_UNAVAILABLE, "caches are not synced yet").into_response(),
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("API server unreachable: {e}"),
        )
            .into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "API server did not answer within 2s",
        )
            .into_response(),
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::encode(&state.registry),
    )
        .into_response()
}
