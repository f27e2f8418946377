//! Which variable values may be rendered into a Workspace. Pure: no API server.
//!
//! The renderer pastes `${KEY}` values into the template's text, and that text is Terraform
//! (`forProvider.module`) run with the platform's credentials. A value that could leave the
//! literal it is pasted into (a quote, a brace, `${`, `%{`, a newline, a comment) would be
//! code, not a value: `1.31" } resource "null_resource" "x" {` as a Kubernetes version adds a
//! resource. So only plain literals are rendered: letters, digits, `.`, `_` and `-`, starting
//! and ending with a letter or digit, at most [`MAX_VALUE`] characters. That is every value
//! CAPT itself passes (Cluster names, regions, versions, VPC names, Workspace names); anything
//! else is refused before rendering, and nothing is applied.
//!
//! The same rule is the CRDs' pattern for the fields that reach a template
//! ([`PLAIN_LITERAL_PATTERN`]), so most such values never get past the API server; this check
//! is what holds when they do (an apply written by hand, a CRD installed without the rule).

use std::collections::BTreeMap;

/// The longest value rendered (a DNS subdomain's length).
pub const MAX_VALUE: usize = 253;

/// The CRD pattern of a value that may reach a template: what [`plain_literal`] accepts.
pub const PLAIN_LITERAL_PATTERN: &str = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$";

/// Condition reason (and Warning Event reason) of an apply whose variable is refused.
pub const UNSAFE_VARIABLE: &str = "UnsafeVariable";

/// True when `value` is a plain literal: `[A-Za-z0-9]`, then `[A-Za-z0-9._-]`, ending in
/// `[A-Za-z0-9]`, 1 to [`MAX_VALUE`] characters.
pub fn plain_literal(value: &str) -> bool {
    let bytes = value.as_bytes();
    let edge = |b: &u8| b.is_ascii_alphanumeric();
    let inner = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    !bytes.is_empty()
        && bytes.len() <= MAX_VALUE
        && bytes.first().is_some_and(edge)
        && bytes.last().is_some_and(edge)
        && bytes.iter().all(inner)
}

/// The first variable whose value is not a [`plain_literal`], as the refusal's message. The
/// value itself is not shown: it is the tenant's, and shown it would be pasted into logs and
/// Events; its length and the key tell the user which one.
pub fn first_unsafe(variables: Option<&BTreeMap<String, String>>) -> Option<String> {
    let (key, value) = variables?.iter().find(|(_, value)| !plain_literal(value))?;
    Some(format!(
        "spec.variables.{key} ({} characters) is not a plain literal (letters, digits, '.', '_' \
         and '-', starting and ending with a letter or digit, at most {MAX_VALUE} characters): \
         values are pasted into Terraform and must not be able to become code; nothing is \
         rendered",
        value.chars().count()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_capt_passes_is_a_plain_literal() {
        for ok in [
            "1.31",
            "v1.31.2",
            "ap-northeast-1",
            "demo",
            "demo-vpc",
            "team_a.vpc",
            "x",
            "default-demo-controlplane-0123456789",
        ] {
            assert!(plain_literal(ok), "{ok}");
        }
    }

    #[test]
    fn what_could_leave_a_literal_is_refused() {
        for bad in [
            "",
            r#"1.31" } resource "null_resource" "x" {"#,
            "1.31\"",
            "${var.x}",
            "%{if true}x%{endif}",
            "a\nb",
            "a b",
            "a#b",
            "a//b",
            "a/*b",
            "a\\b",
            "-leading",
            "trailing.",
            "é",
        ] {
            assert!(!plain_literal(bad), "{bad:?}");
        }
        assert!(!plain_literal(&"a".repeat(MAX_VALUE + 1)));
        assert!(plain_literal(&"a".repeat(MAX_VALUE)));
    }

    #[test]
    fn the_first_unsafe_variable_is_named_and_its_value_never_shown() {
        let value = r#"1.31" } resource "null_resource" "x" {"#;
        let vars = BTreeMap::from([
            ("CLUSTER_NAME".to_owned(), "demo".to_owned()),
            ("KUBERNETES_VERSION".to_owned(), value.to_owned()),
        ]);
        let message = first_unsafe(Some(&vars)).expect("refused");
        assert!(
            message.contains("spec.variables.KUBERNETES_VERSION"),
            "{message}"
        );
        assert!(!message.contains("null_resource"), "{message}");
        assert_eq!(first_unsafe(None), None);
        let fine = BTreeMap::from([("A".to_owned(), "1.31".to_owned())]);
        assert_eq!(first_unsafe(Some(&fine)), None);
    }
}
