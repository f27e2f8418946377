//! The bounds of every list and map a tenant writes in our CRDs, in one place.
//!
//! An object's cost to the shared controller (its cache, the reads a reconcile makes, what it
//! renders) follows its lists and maps, so none is unbounded: the API server refuses an object
//! over a bound at admission, with the field's path in its message. An object stored before
//! a bound existed stays readable and deletable (the API server's ratcheting lets a write
//! that leaves the offending field as it is through: `tests/tests/crd_bounds.rs`). Each bound
//! is far above any real stack's need and named for what it limits.

/// `waitForSecrets` and `waitForWorkspaces` of a WorkspaceTemplateApply: what a stack waits
/// for before it is rendered is a handful of names.
pub const MAX_WAITS: usize = 32;
/// Tags of a control plane (`additionalTags`): AWS allows 50 on a resource.
pub const MAX_TAGS: usize = 50;
/// The longest tag key, as AWS has it.
pub const MAX_TAG_KEY: usize = 128;
/// The longest tag value, as AWS has it.
pub const MAX_TAG_VALUE: usize = 256;
/// EKS add-ons of a control plane.
pub const MAX_ADDONS: usize = 32;
/// CIDRs allowed to reach a control plane's public endpoint: EKS allows 40.
pub const MAX_PUBLIC_CIDRS: usize = 40;
/// The longest CIDR (an IPv6 one with its prefix length).
pub const MAX_CIDR: usize = 43;
/// Labels, or annotations, a template gives what it makes.
pub const MAX_TEMPLATE_METADATA: usize = 64;
/// The longest name of an object referred to (a DNS subdomain).
pub const MAX_NAME: usize = 253;
/// The longest namespace (a DNS label).
pub const MAX_NAMESPACE: usize = 63;
/// The longest short free-form string (an add-on's name or version).
pub const MAX_SHORT: usize = 128;

/// The schema of a map of tags: at most [`MAX_TAGS`] entries, keys and values within AWS's
/// lengths.
pub fn tags_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "nullable": true,
        "maxProperties": MAX_TAGS,
        "additionalProperties": {"type": "string", "maxLength": MAX_TAG_VALUE},
        "x-kubernetes-validations": [{
            "rule": format!("self.all(k, size(k) <= {MAX_TAG_KEY})"),
            "message": format!("every tag key is at most {MAX_TAG_KEY} characters"),
        }],
    })
}

/// The schema of a template's labels or annotations: at most [`MAX_TEMPLATE_METADATA`]
/// (their shape is the API server's to check on the object they reach).
pub fn template_metadata_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "nullable": true,
        "maxProperties": MAX_TEMPLATE_METADATA,
        "additionalProperties": {"type": "string"},
    })
}
