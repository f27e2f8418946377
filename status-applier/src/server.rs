//! The intent API: HTTP/1.1 + JSON on a Unix socket (and, for debugging, on TCP), plus the
//! health and metrics endpoints.
//!
//! | route | what |
//! | --- | --- |
//! | `POST /v1/intents[?wait=false]` | submit an intent (JSON or YAML); answers its outcome |
//! | `GET /v1/intents[?format=yaml]` | every desired document; YAML prints apply configurations with the kubectl command that reproduces each; filters `kind`, `namespace`, `name`, `manager`, `subresource` (`status` or `main`) |
//! | `GET /v1/conflicts` | recent conflicts |
//! | `GET /v1/instance` | `{"instance": "…"}`: this process, as its outcomes name it (a random id made at start) |
//! | `GET /healthz`, `/readyz`, `/metrics` | liveness, readiness (API server reachable; every watch listed, none failing), Prometheus text |
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
    /// `/readyz`'s last look at the API server.
    pub api_probe: Arc<ApiProbe>,
}

/// How long `/readyz` trusts its last look at the API server.
pub const API_PROBE_TTL: Duration = Duration::from_secs(1);

/// The API server's last answer to `/readyz`'s probe, kept for [`API_PROBE_TTL`]: however
/// many probes arrive (kubelets, or anyone who reaches the port), the API server is asked at
/// most once per TTL, and never twice at once (callers wait for the probe in flight).
#[derive(Default)]
pub struct ApiProbe {
    last: tokio::sync::Mutex<Option<(std::time::Instant, Result<(), String>)>>,
}

impl ApiProbe {
    /// `Ok` when the API server answered `/version` within 2 s, now or within the TTL.
    pub async fn reachable(&self, client: &kube::Client) -> Result<(), String> {
        let mut last = self.last.lock().await;
        if let Some((at, answer)) = &*last
            && at.elapsed() < API_PROBE_TTL
        {
            return answer.clone();
        }
        let answer =
            match tokio::time::timeout(Duration::from_secs(2), client.apiserver_version()).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("API server unreachable: {e}")),
                Err(_) => Err("API server did not answer within 2s".to_owned()),
            };
        *last = Some((std::time::Instant::now(), answer.clone()));
        answer
    }
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    probes(state.clone())
        .route("/metrics", get(metrics))
        .route("/v1/intents", post(submit).get(desired))
        .route("/v1/conflicts", get(conflicts))
        .route("/v1/instance", get(instance))
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

async fn instance(State(state): State<AppState>) -> Response {
    Json(json!({"instance": state.engine.instance()})).into_response()
}

async fn readyz(State(state): State<AppState>) -> Response {
    let client = state.engine.live().client().clone();
    let watches = state
        .engine
        .live()
        .health()
        .readiness(std::time::Instant::now());
    match state.api_probe.reachable(&client).await {
        Ok(()) => match watches {
            Ok(()) => (StatusCode::OK, "ok").into_response(),
            Err(problems) => (StatusCode::SERVICE_UNAVAILABLE, problems).into_response(),
        },
        Err(message) => (StatusCode::SERVICE_UNAVAILABLE, message).into_response(),
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        diagnostics::metrics_text(&state.registry),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An API server that answers `/version` and counts the requests.
    async fn counting_api_server() -> (kube::Client, Arc<AtomicUsize>) {
        let count = Arc::new(AtomicUsize::new(0));
        let counted = count.clone();
        let app = Router::new().route(
            "/version",
            get(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async {
                    Json(json!({"major": "1", "minor": "34", "gitVersion": "v1.34.4",
                        "gitCommit": "", "gitTreeState": "", "buildDate": "", "goVersion": "",
                        "compiler": "", "platform": ""}))
                }
            }),
        );
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", tcp.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(tcp, app).await });
        let config = kube::Config::new(url.parse().unwrap());
        (kube::Client::try_from(config).unwrap(), count)
    }

    #[tokio::test]
    async fn readiness_probes_ask_the_api_server_at_most_once_per_ttl() {
        let (client, asked) = counting_api_server().await;
        let probe = Arc::new(ApiProbe::default());
        let probes: Vec<_> = (0..50)
            .map(|_| {
                let (probe, client) = (probe.clone(), client.clone());
                tokio::spawn(async move { probe.reachable(&client).await })
            })
            .collect();
        for p in probes {
            assert_eq!(p.await.unwrap(), Ok(()));
        }
        assert_eq!(asked.load(Ordering::SeqCst), 1, "50 probes, one request");
        tokio::time::sleep(API_PROBE_TTL).await;
        probe.reachable(&client).await.unwrap();
        assert_eq!(asked.load(Ordering::SeqCst), 2, "asked again after the TTL");
    }
}
