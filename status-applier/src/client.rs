//! A client of the intent API over the Unix socket, used by the controller and the CLI.

use crate::intent::Intent;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client as HttpClient;
use hyperlocal::{UnixClientExt, UnixConnector, Uri};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached.
    #[error("cannot reach the status-applier at {socket}: {source}")]
    Unreachable {
        /// The socket path.
        socket: PathBuf,
        /// The cause.
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    /// The answer could not be read.
    #[error("reading the answer of the status-applier: {0}")]
    Read(String),
}

/// An answer: the HTTP status and the body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: StatusCode,
    /// The body (JSON for every route but the YAML view and the metrics).
    pub body: String,
}

impl Answer {
    /// The body as JSON (`null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// A client bound to one socket.
#[derive(Clone)]
pub struct Client {
    socket: PathBuf,
    http: HttpClient<UnixConnector, Full<Bytes>>,
}

impl Client {
    /// A client of the server listening on `socket`.
    pub fn new(socket: impl AsRef<Path>) -> Self {
        Self {
            socket: socket.as_ref().to_owned(),
            http: HttpClient::unix(),
        }
    }

    /// Submits an intent; with `wait`, the answer carries the outcome of its apply.
    pub async fn submit(&self, intent: &Intent, wait: bool) -> Result<Answer, ClientError> {
        let body = serde_json::to_vec(intent).map_err(|e| ClientError::Read(e.to_string()))?;
        self.request(Method::POST, &format!("/v1/intents?wait={wait}"), body)
            .await
    }

    /// Sends raw bytes as an intent body (the CLI passes files through unparsed, so the
    /// server's validation answers).
    pub async fn submit_raw(&self, body: Vec<u8>, wait: bool) -> Result<Answer, ClientError> {
        self.request(Method::POST, &format!("/v1/intents?wait={wait}"), body)
            .await
    }

    /// GETs a path.
    pub async fn get(&self, path: &str) -> Result<Answer, ClientError> {
        self.request(Method::GET, path, Vec::new()).await
    }

    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<Answer, ClientError> {
        let uri: hyper::Uri = Uri::new(&self.socket, path).into();
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| ClientError::Read(e.to_string()))?;
        let response =
            self.http
                .request(request)
                .await
                .map_err(|source| ClientError::Unreachable {
                    socket: self.socket.clone(),
                    source,
                })?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Read(e.to_string()))?
            .to_bytes();
        Ok(Answer {
            status,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }
}
