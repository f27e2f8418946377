//! What became of an intent or an apply: the answer of the intent API, the `last` of each
//! desired document, and the vocabulary shared by logs and metrics. The types are the API
//! crate's, so the server answers with what clients read.

use crate::intent::DesiredKey;

pub use status_applier_api::outcome::{Action, Conflict, Outcome};

/// An outcome of `action` for `key`.
pub fn for_key(key: &DesiredKey, action: Action) -> Outcome {
    Outcome::new(
        key.object.to_string(),
        key.field_manager.clone(),
        key.subresource,
        action,
    )
}
