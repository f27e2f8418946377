//! A layer of the API client that refuses every request that would change something (any
//! method but `GET` and `HEAD`) while a predicate says no, before it leaves the process.
//!
//! A replica that no longer leads must not write, whichever code path writes (a finalizer, a
//! rendered object, a Secret, an Event): checking at each call site would miss the next one
//! added. The controller fences its client with its lead ([`crate::kube_client_fenced`]); the
//! refusal reaches the caller as a `kube::Error::Service` carrying [`Fenced`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{BoxError, Layer, Service};

/// Whether a write may be sent now.
pub type MayWrite = Arc<dyn Fn() -> bool + Send + Sync>;

/// The error of a refused write.
#[derive(Debug, thiserror::Error)]
#[error("{method} {path} not sent: this replica does not lead (its writes are fenced)")]
pub struct Fenced {
    /// The request's method.
    pub method: String,
    /// Its path.
    pub path: String,
}

/// The layer ([`kube::client::ClientBuilder::with_layer`]).
#[derive(Clone)]
pub struct FenceLayer {
    may_write: MayWrite,
}

impl FenceLayer {
    /// Fences writes by `may_write`.
    pub fn new(may_write: MayWrite) -> Self {
        Self { may_write }
    }
}

impl<S> Layer<S> for FenceLayer {
    type Service = Fence<S>;

    fn layer(&self, inner: S) -> Fence<S> {
        Fence {
            inner,
            may_write: self.may_write.clone(),
        }
    }
}

/// The service of [`FenceLayer`].
#[derive(Clone)]
pub struct Fence<S> {
    inner: S,
    may_write: MayWrite,
}

impl<S, B> Service<axum::http::Request<B>> for Fence<S>
where
    S: Service<axum::http::Request<B>>,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        use axum::http::Method;
        let reads = matches!(*request.method(), Method::GET | Method::HEAD);
        if !reads && !(self.may_write)() {
            let fenced = Fenced {
                method: request.method().to_string(),
                path: request.uri().path().to_owned(),
            };
            return Box::pin(std::future::ready(Err(fenced.into())));
        }
        let response = self.inner.call(request);
        Box::pin(async move { response.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tower::ServiceExt;

    #[tokio::test]
    async fn writes_pass_only_while_allowed_and_reads_always() {
        let leading = Arc::new(AtomicBool::new(false));
        let may_write: MayWrite = {
            let leading = leading.clone();
            Arc::new(move || leading.load(Ordering::SeqCst))
        };
        let inner =
            tower::service_fn(|_: axum::http::Request<()>| async { Ok::<_, BoxError>("sent") });
        let fenced = FenceLayer::new(may_write).layer(inner);
        let request = |method: &str| {
            axum::http::Request::builder()
                .method(method)
                .uri("/api/v1/namespaces/a/secrets/b")
                .body(())
                .unwrap()
        };
        assert_eq!(
            fenced.clone().oneshot(request("GET")).await.unwrap(),
            "sent"
        );
        for method in ["POST", "PUT", "PATCH", "DELETE"] {
            let refused = fenced.clone().oneshot(request(method)).await.unwrap_err();
            assert!(refused.is::<Fenced>(), "{method}: {refused}");
        }
        leading.store(true, Ordering::SeqCst);
        assert_eq!(
            fenced.clone().oneshot(request("PATCH")).await.unwrap(),
            "sent"
        );
    }
}
