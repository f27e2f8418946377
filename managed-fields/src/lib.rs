//! Field ownership as the Kubernetes API server records it in `metadata.managedFields`: the
//! one place that decodes it, for the status-applier (conflict prediction, planning, the
//! rebuild of desired documents after a restart, the ownership audit) and for the controller.
//!
//! [`fieldsv1`] decodes one entry's `fieldsV1` tree into a [`FieldSet`] and answers questions
//! about it; [`ManagedFields`] is every entry of one object, each with its [`Owner`].
//! Pure: no API server, no schema.

pub mod fieldsv1;
mod owners;

pub use fieldsv1::{FieldSet, FieldsV1Error, PathElement, parse_field_path, path_to_string};
pub use owners::{Entry, ManagedFields, Owner};
