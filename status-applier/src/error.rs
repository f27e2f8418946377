//! What can go wrong between a desired document and the API server.

/// Why an apply did not happen.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ApplyError {
    /// The API server does not serve the kind.
    #[error("kind {0} is not served by the API server: {1}")]
    UnknownKind(String, String),
    /// The object does not exist (never created, or deleted).
    #[error("object not found")]
    NotFound,
    /// The object was deleted and recreated: its uid is not the one the intent names.
    #[error(
        "uid precondition failed: the intent is for uid {expected}, the object has uid {found}"
    )]
    UidMismatch {
        /// The uid the intent named.
        expected: String,
        /// The uid of the live object, or `none`.
        found: String,
    },
    /// The object changed since it was read (a resourceVersion precondition failed).
    #[error("the object changed since it was read")]
    Stale,
    /// Another field manager owns fields of the apply with other values (HTTP 409).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The API server refused the request for a reason retrying will not change (400, 403,
    /// 404, 422).
    #[error("refused by the API server ({code}): {message}")]
    Refused {
        /// HTTP status.
        code: u16,
        /// The server's message.
        message: String,
    },
    /// A failure that may pass (5xx, 429, timeouts, connection errors): retried with backoff.
    #[error("API server unavailable: {0}")]
    Transient(String),
}

impl ApplyError {
    /// Classifies a client error.
    pub fn from_kube(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(status) => match status.code {
                404 => Self::NotFound,
                409 if status.message.contains("uid mismatch") => Self::UidMismatch {
                    expected: "the intent's".into(),
                    found: "none".into(),
                },
                409 if status.message.contains("the object has been modified") => Self::Stale,
                409 => Self::Conflict(conflict_summary(&status)),
                429 | 500..=599 => Self::Transient(format!("{}: {}", status.code, status.message)),
                code => Self::Refused {
                    code,
                    message: status.message,
                },
            },
            other => Self::Transient(other.to_string()),
        }
    }

    /// The HTTP status the error stands for, as an API error code label.
    pub fn code(&self) -> &'static str {
        match self {
            Self::UnknownKind(..) | Self::NotFound => "404",
            Self::UidMismatch { .. } | Self::Conflict(_) | Self::Stale => "409",
            Self::Refused { code: 400, .. } => "400",
            Self::Refused { code: 403, .. } => "403",
            Self::Refused { code: 422, .. } => "422",
            Self::Refused { .. } => "4xx",
            Self::Transient(_) => "5xx",
        }
    }
}

/// `field (owner message)` for each cause of a 409.
fn conflict_summary(status: &kube::core::Status) -> String {
    let causes: Vec<String> = status
        .details
        .iter()
        .flat_map(|d| d.causes.iter())
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect();
    if causes.is_empty() {
        status.message.clone()
    } else {
        causes.join("; ")
    }
}
