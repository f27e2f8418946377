//! A client of the intent API over the Unix socket, used by the controller and the CLI.
//!
//! [`Client::send`] reads the answer the way the server writes it: which HTTP statuses carry
//! a delivered [`Outcome`] ([`Action::is_delivered_status`]) and which are refusals.

use crate::intent::Intent;
use crate::outcome::{Action, Outcome};
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
    /// The status-applier did not take the intent: a bad intent (400, 403, 413), or it
    /// failed to act on it (503).
    #[error("the status-applier refused the intent ({status}): {body}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// Its answer.
        body: String,
    },
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

    /// The outcome of a submitted intent, if the applier took it: a 2xx, 409 (a conflict) or
    /// 422 (a missing object, an API refusal) answer carries the outcome of an intent the
    /// applier keeps and applies again when the object changes. Anything else (a bad intent,
    /// an applier failure) is [`ClientError::Refused`].
    pub fn outcome(self) -> Result<Outcome, ClientError> {
        let status = self.status.as_u16();
        if !Action::is_delivered_status(status) {
            return Err(ClientError::Refused {
                status,
                body: self.body,
            });
        }
        serde_json::from_str(&self.body)
            .map_err(|e| ClientError::Read(format!("an outcome ({status}): {e}: {}", self.body)))
    }

    /// The instance of an answer to `GET /v1/instance`: `{"instance": "…"}` with a 200.
    /// Anything else (an applier without the route answers 404) is an error.
    pub fn instance(self) -> Result<String, ClientError> {
        let status = self.status.as_u16();
        if status != 200 {
            return Err(ClientError::Refused {
                status,
                body: self.body,
            });
        }
        match self.json()["instance"].as_str() {
            Some(instance) if !instance.is_empty() => Ok(instance.to_owned()),
            _ => Err(ClientError::Read(format!("an instance: {}", self.body))),
        }
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

    /// Delivers an intent and waits for the outcome of its apply: `Ok` when the applier
    /// took the intent (whatever the outcome), [`ClientError::Refused`] when it did not.
    pub async fn send(&self, intent: &Intent) -> Result<Outcome, ClientError> {
        self.submit(intent, true).await?.outcome()
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

    /// The applier process answering now (`GET /v1/instance`): an id made at its start, the
    /// same its outcomes carry (`Outcome::instance`). Another id than an outcome's means the
    /// applier restarted since, and forgot what it held in memory alone.
    pub async fn instance(&self) -> Result<String, ClientError> {
        self.get("/v1/instance").await?.instance()
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn answer(status: u16, body: Value) -> Answer {
        Answer {
            status: StatusCode::from_u16(status).unwrap(),
            body: body.to_string(),
        }
    }

    fn outcome(action: &str) -> Value {
        json!({"subject": "ConfigMap/ns/x", "fieldManager": "m", "action": action})
    }

    #[test]
    fn conflicts_and_rejections_are_delivered_outcomes() {
        for (status, action) in [
            (200, Action::applied),
            (200, Action::unchanged),
            (409, Action::conflict),
            (422, Action::rejected),
        ] {
            let got = answer(status, outcome(action.as_str())).outcome().unwrap();
            assert_eq!(got.action, action);
            assert_eq!(got.subject, "ConfigMap/ns/x");
        }
    }

    #[test]
    fn bad_intents_and_applier_failures_are_refusals() {
        for status in [400, 403, 413, 503] {
            let body = json!({"action": "rejected", "error": "no"});
            match answer(status, body.clone()).outcome() {
                Err(ClientError::Refused { status: s, body: b }) => {
                    assert_eq!(s, status);
                    assert_eq!(b, body.to_string());
                }
                other => panic!("{status}: {other:?}"),
            }
        }
    }

    #[test]
    fn an_instance_is_read_from_a_200_and_nothing_else() {
        let got = answer(200, json!({"instance": "9a3e"})).instance().unwrap();
        assert_eq!(got, "9a3e");
        for (status, body) in [
            (404, json!("not found")),
            (200, json!({"nope": 1})),
            (200, json!({"instance": ""})),
        ] {
            assert!(
                answer(status, body.clone()).instance().is_err(),
                "{status} {body}"
            );
        }
    }

    #[test]
    fn a_delivered_answer_that_is_no_outcome_is_a_read_error() {
        let err = answer(200, json!({"nope": 1})).outcome().unwrap_err();
        assert!(matches!(err, ClientError::Read(_)), "{err:?}");
    }
}
