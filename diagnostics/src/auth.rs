//! Who may read the metrics: the bearer token's TokenReview, then a SubjectAccessReview for
//! `get` on the non-resource URL `/metrics`, with a small cache of the decisions.

use crate::METRICS_PATH;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an allowed token is trusted without asking the API server again.
pub const ALLOW_TTL: Duration = Duration::from_secs(60);
/// How long a refused token (401 or 403) is refused without asking again: short, so that a
/// binding just granted takes effect soon.
pub const DENY_TTL: Duration = Duration::from_secs(10);
/// At most this many tokens are remembered.
pub const MAX_CACHED: usize = 1024;
/// At most this many reviews are asked of the API server at once: every unknown token costs
/// a TokenReview, so anyone who can reach the port could otherwise make the pod hammer the
/// API server. A scrape beyond it is answered 503 at once, without a review.
pub const MAX_REVIEWS_IN_FLIGHT: usize = 4;

/// What the API server says about a token: who it is, and whether they may read the metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// The TokenReview did not authenticate it: 401.
    Unauthenticated,
    /// Authenticated as `user`, who may not get `/metrics`: 403.
    Forbidden {
        /// The user's name.
        user: String,
    },
    /// Authenticated as `user`, who may: the metrics.
    Allowed {
        /// The user's name.
        user: String,
    },
}

/// Asks whether a token may read the metrics.
pub trait Reviewer: Send + Sync + 'static {
    /// The decision for `token`; an error when it could not be asked (nothing is cached).
    fn review(&self, token: &str) -> impl Future<Output = anyhow::Result<Access>> + Send;
}

/// Asks the API server: a TokenReview, then a SubjectAccessReview.
pub struct KubeReviewer {
    client: kube::Client,
}

impl KubeReviewer {
    /// A reviewer asking through `client` (which needs `create` on `tokenreviews` and
    /// `subjectaccessreviews`).
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl Reviewer for KubeReviewer {
    async fn review(&self, token: &str) -> anyhow::Result<Access> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..Default::default()
        };
        let review = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| anyhow::anyhow!("TokenReview: {e}"))?;
        let status = review.status.unwrap_or_default();
        let Some(user) = status.user.filter(|_| status.authenticated == Some(true)) else {
            return Ok(Access::Unauthenticated);
        };
        let name = user.username.clone().unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(METRICS_PATH.to_owned()),
                    verb: Some("get".to_owned()),
                }),
                resource_attributes: None,
            },
            ..Default::default()
        };
        let access = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
            .map_err(|e| anyhow::anyhow!("SubjectAccessReview: {e}"))?;
        Ok(if access.status.is_some_and(|s| s.allowed) {
            Access::Allowed { user: name }
        } else {
            Access::Forbidden { user: name }
        })
    }
}

/// Decisions by the SHA-256 of their token (the tokens themselves are not kept), each with
/// the instant it expires.
#[derive(Default)]
struct Cache {
    entries: HashMap<[u8; 32], (Access, Instant)>,
}

impl Cache {
    fn get(&mut self, key: &[u8; 32], now: Instant) -> Option<Access> {
        match self.entries.get(key) {
            Some((decision, expires)) if *expires > now => Some(decision.clone()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    fn put(&mut self, key: [u8; 32], decision: Access, now: Instant) {
        if self.entries.len() >= MAX_CACHED && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (_, expires)| *expires > now);
            if self.entries.len() >= MAX_CACHED {
                // Still full of live entries: drop the one closest to expiry.
                let oldest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, expires))| *expires)
                    .map(|(k, _)| *k);
                if let Some(oldest) = oldest {
                    self.entries.remove(&oldest);
                }
            }
        }
        let ttl = match decision {
            Access::Allowed { .. } => ALLOW_TTL,
            _ => DENY_TTL,
        };
        self.entries.insert(key, (decision, now + ttl));
    }
}

/// A reviewer with its cache and its cap on reviews in flight.
pub(crate) struct Gate<R> {
    reviewer: R,
    cache: Mutex<Cache>,
    reviews: tokio::sync::Semaphore,
}

/// Why a token was not decided.
#[derive(Debug)]
enum Undecided {
    /// [`MAX_REVIEWS_IN_FLIGHT`] reviews are already being asked.
    Busy,
    /// The review could not be asked.
    Failed(anyhow::Error),
}

impl<R: Reviewer> Gate<R> {
    pub(crate) fn new(reviewer: R) -> Self {
        Self {
            reviewer,
            cache: Mutex::default(),
            reviews: tokio::sync::Semaphore::new(MAX_REVIEWS_IN_FLIGHT),
        }
    }

    async fn decide(&self, token: &str) -> Result<Access, Undecided> {
        let key: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
            .as_ref()
            .try_into()
            .expect("SHA-256 has 32 bytes");
        if let Some(decision) = self
            .cache
            .lock()
            .expect("cache lock")
            .get(&key, Instant::now())
        {
            return Ok(decision);
        }
        let Ok(_permit) = self.reviews.try_acquire() else {
            return Err(Undecided::Busy);
        };
        let decision = self
            .reviewer
            .review(token)
            .await
            .map_err(Undecided::Failed)?;
        self.cache
            .lock()
            .expect("cache lock")
            .put(key, decision.clone(), Instant::now());
        Ok(decision)
    }
}

/// `GET /metrics` behind the gate; any other path is 404.
pub(crate) fn authorized<R: Reviewer>(gate: Arc<Gate<R>>, metrics: MethodRouter) -> Router {
    Router::new()
        .route(METRICS_PATH, metrics)
        .route_layer(axum::middleware::from_fn_with_state(gate, authorize::<R>))
}

async fn authorize<R: Reviewer>(
    State(gate): State<Arc<Gate<R>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = bearer(request.headers()) else {
        return unauthorized();
    };
    match gate.decide(&token).await {
        Ok(Access::Allowed { .. }) => next.run(request).await,
        Ok(Access::Unauthenticated) => unauthorized(),
        Ok(Access::Forbidden { user }) => {
            tracing::info!(
                user,
                "Refused a metrics scrape: not allowed to get /metrics"
            );
            (
                StatusCode::FORBIDDEN,
                format!("Forbidden: user {user:?} may not get {METRICS_PATH}\n"),
            )
                .into_response()
        }
        Err(Undecided::Busy) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            "Too many tokens under review; try again\n",
        )
            .into_response(),
        Err(Undecided::Failed(error)) => {
            tracing::warn!(%error, "Cannot review a metrics scraper's token");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "Cannot review the token now\n",
            )
                .into_response()
        }
    }
}

/// The token of an `Authorization: Bearer …` header.
fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_owned())
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "Unauthorized\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::get;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt as _;

    /// Allows `good`, forbids `other`, authenticates nothing else; fails on `broken`; counts
    /// the calls.
    #[derive(Default)]
    struct Fake {
        calls: AtomicUsize,
    }

    impl Reviewer for Arc<Fake> {
        async fn review(&self, token: &str) -> anyhow::Result<Access> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            match token {
                "good" => Ok(Access::Allowed { user: "g".into() }),
                "other" => Ok(Access::Forbidden { user: "o".into() }),
                "broken" => anyhow::bail!("unreachable"),
                _ => Ok(Access::Unauthenticated),
            }
        }
    }

    async fn status(app: &Router, path: &str, authorization: Option<&str>) -> StatusCode {
        let mut request = Request::get(path);
        if let Some(value) = authorization {
            request = request.header(header::AUTHORIZATION, value);
        }
        app.clone()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap()
            .status()
    }

    #[tokio::test]
    async fn tokens_get_401_403_or_the_metrics_and_decisions_are_cached() {
        let fake = Arc::new(Fake::default());
        let app = authorized(
            Arc::new(Gate::new(fake.clone())),
            get(|| async { "metrics" }),
        );
        let calls = || fake.calls.load(Ordering::SeqCst);
        assert_eq!(
            status(&app, "/metrics", None).await,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            status(&app, "/metrics", Some("Basic Zm9vOmJhcg==")).await,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            status(&app, "/metrics", Some("Bearer ")).await,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(calls(), 0, "no token, no review");
        assert_eq!(
            status(&app, "/metrics", Some("Bearer nobody")).await,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            status(&app, "/metrics", Some("Bearer other")).await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            status(&app, "/metrics", Some("bearer good")).await,
            StatusCode::OK
        );
        assert_eq!(calls(), 3);
        for _ in 0..5 {
            assert_eq!(
                status(&app, "/metrics", Some("Bearer good")).await,
                StatusCode::OK
            );
            assert_eq!(
                status(&app, "/metrics", Some("Bearer other")).await,
                StatusCode::FORBIDDEN
            );
        }
        assert_eq!(calls(), 3, "cached decisions are not asked again");
        assert_eq!(
            status(&app, "/metrics", Some("Bearer broken")).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            status(&app, "/metrics", Some("Bearer broken")).await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(calls(), 5, "a failure to ask is not cached");
        assert_eq!(
            status(&app, "/healthz", Some("Bearer good")).await,
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    fn the_cache_expires_and_stays_bounded() {
        let mut cache = Cache::default();
        let now = Instant::now();
        let allowed = Access::Allowed { user: "u".into() };
        cache.put([0; 32], allowed.clone(), now);
        cache.put([1; 32], Access::Unauthenticated, now);
        assert_eq!(cache.get(&[0; 32], now + ALLOW_TTL / 2), Some(allowed));
        assert_eq!(
            cache.get(&[1; 32], now + DENY_TTL + Duration::from_millis(1)),
            None
        );
        assert_eq!(
            cache.get(&[0; 32], now + ALLOW_TTL + Duration::from_millis(1)),
            None
        );
        for i in 0..(MAX_CACHED + 10) {
            let mut key = [0u8; 32];
            key[..8].copy_from_slice(&(i as u64).to_le_bytes());
            cache.put(
                key,
                Access::Unauthenticated,
                now + Duration::from_millis(i as u64),
            );
        }
        assert_eq!(cache.entries.len(), MAX_CACHED);
        let mut first = [0u8; 32];
        first[..8].copy_from_slice(&0u64.to_le_bytes());
        assert!(!cache.entries.contains_key(&first), "the oldest went first");
    }

    /// Holds every review until released; counts those in flight and the most at once.
    struct Slow {
        release: tokio::sync::Semaphore,
        in_flight: AtomicUsize,
        most: AtomicUsize,
    }

    impl Reviewer for Arc<Slow> {
        async fn review(&self, _token: &str) -> anyhow::Result<Access> {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            let _released = self.release.acquire().await?;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(Access::Unauthenticated)
        }
    }

    #[tokio::test]
    async fn unknown_tokens_cost_at_most_the_cap_of_reviews_at_once() {
        let slow = Arc::new(Slow {
            release: tokio::sync::Semaphore::new(0),
            in_flight: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
        });
        let app = authorized(
            Arc::new(Gate::new(slow.clone())),
            get(|| async { "metrics" }),
        );
        let waiting: Vec<_> = (0..MAX_REVIEWS_IN_FLIGHT)
            .map(|i| {
                let app = app.clone();
                tokio::spawn(async move {
                    status(&app, "/metrics", Some(&format!("Bearer random-{i}"))).await
                })
            })
            .collect();
        while slow.in_flight.load(Ordering::SeqCst) < MAX_REVIEWS_IN_FLIGHT {
            tokio::task::yield_now().await;
        }
        // The cap is reached: more random tokens are turned away without a review. (Were
        // they reviewed, they would wait for the held reviews: the timeout ends that.)
        for i in 0..10 {
            let token = format!("Bearer more-{i}");
            let answered = tokio::time::timeout(
                Duration::from_secs(5),
                status(&app, "/metrics", Some(&token)),
            )
            .await;
            assert_eq!(
                answered.ok(),
                Some(StatusCode::SERVICE_UNAVAILABLE),
                "a token beyond the cap"
            );
        }
        assert_eq!(slow.most.load(Ordering::SeqCst), MAX_REVIEWS_IN_FLIGHT);
        slow.release.add_permits(MAX_REVIEWS_IN_FLIGHT);
        for w in waiting {
            assert_eq!(w.await.unwrap(), StatusCode::UNAUTHORIZED);
        }
    }
}
