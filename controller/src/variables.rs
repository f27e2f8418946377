//! Where an apply's variables may reach a Workspace, and which variables are refused. Pure: no
//! API server.
//!
//! A tenant's value is a value, never Terraform: `${KEY}` is replaced by the apply's value only
//! in the template's `spec.forProvider.vars[].value` and the strings of
//! `spec.forProvider.varmap`, which provider-terraform hands to Terraform as the values of the
//! module's variables (never parsed as HCL), and in the Workspace's labels and annotations,
//! which nothing runs. So any string is a legal value: a CIDR, an IAM role ARN, a list of
//! zones, a tag with spaces. Everywhere else (the module, inline HCL or JSON, or a remote
//! module's address, `env`, `entrypoint`, the arguments, ...) the template's text is the
//! platform's: a template with a `${KEY}` of the apply's there renders nothing, and only the
//! platform's own `${WORKSPACE_NAME}` is replaced.
//!
//! The template names the keys it takes, by placing them: a key it does not name is refused
//! (it would replace nothing, or something the template never meant), except the keys CAPT
//! passes to the template of every CAPT object ([`CAPT_KEYS`]), which a template may leave
//! unused. Keys have a strict shape ([`KEY_PATTERN`], in the CRD and here) and values a size
//! ([`MAX_VALUE`]).

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The longest value (bytes).
/// The platform's variable that stands for the Workspace's own name: replaced everywhere in
/// a template, the one substitution that is not a tenant's value.
pub const WORKSPACE_NAME_VARIABLE: &str = "WORKSPACE_NAME";

pub const MAX_VALUE: usize = 8192;
/// The longest key.
pub const MAX_KEY: usize = 63;
/// The most variables an apply may have.
pub const MAX_VARIABLES: usize = 64;
/// The shape of a key: an identifier (what Terraform accepts as a variable name).
pub const KEY_PATTERN: &str = r"^[A-Za-z_][A-Za-z0-9_]*$";
/// The CRD pattern of a name CAPT passes in a value (a VPC's name, say): a plain literal.
pub const PLAIN_LITERAL_PATTERN: &str = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$";
/// The keys CAPT passes to the templates of its CAPTClusters and CAPTControlPlanes; a
/// template may leave them unused. Two are names, which carry their namespace
/// (`crate::names`).
pub const CAPT_KEYS: &[&str] = &["CLUSTER_NAME", "REGION", "KUBERNETES_VERSION", "VPC_NAME"];

/// Condition reason (and Warning Event reason) of an apply whose variable is refused (its
/// key's shape, the platform's key, its value's size).
pub const UNSAFE_VARIABLE: &str = "UnsafeVariable";
/// Condition reason (and Warning Event reason) of an apply with a key its template does not
/// name.
pub const UNDECLARED_VARIABLE: &str = "UndeclaredVariable";
/// Condition reason (and Warning Event reason) of an apply whose template has one of its
/// keys' `${KEY}` outside the variables' values.
pub const PLACEHOLDER_OUTSIDE_VARIABLES: &str = "PlaceholderOutsideVariables";

/// True when `key` has the shape of [`KEY_PATTERN`] and at most [`MAX_KEY`] characters.
pub fn valid_key(key: &str) -> bool {
    let mut chars = key.chars();
    let first = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    first && key.len() <= MAX_KEY && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The first variable refused for itself, as the refusal's message: a key of another shape,
/// the platform's `WORKSPACE_NAME`, a value over [`MAX_VALUE`], too many variables. A value is
/// never shown (it is the tenant's, and would be pasted into logs and Events).
pub fn first_unsafe(variables: Option<&BTreeMap<String, String>>) -> Option<String> {
    let variables = variables?;
    if variables.len() > MAX_VARIABLES {
        return Some(format!(
            "spec.variables has {} keys, over the limit of {MAX_VARIABLES}; nothing is rendered",
            variables.len()
        ));
    }
    variables.iter().find_map(|(key, value)| {
        if !valid_key(key) {
            let shown: String = key.chars().take(MAX_KEY).collect();
            return Some(format!(
                "spec.variables key {shown:?} is not an identifier ({KEY_PATTERN}, at most \
                 {MAX_KEY} characters); nothing is rendered"
            ));
        }
        if key == WORKSPACE_NAME_VARIABLE {
            return Some(format!(
                "spec.variables.{key} is the platform's (the Workspace's name); nothing is \
                 rendered"
            ));
        }
        (value.len() > MAX_VALUE).then(|| {
            format!(
                "spec.variables.{key} is {} bytes, over the limit of {MAX_VALUE}; nothing is \
                 rendered",
                value.len()
            )
        })
    })
}

/// Whether the string at `path` (from the template's `spec`, keys and indexes) takes the
/// apply's values: `forProvider.vars[i].value` and any string under `forProvider.varmap`.
pub fn takes_values(path: &[PathStep]) -> bool {
    use PathStep::{Index, Key};
    match path {
        [Key(f), Key(v), Index(_), Key(value)] => {
            f == "forProvider" && v == "vars" && value == "value"
        }
        [Key(f), Key(m), ..] => f == "forProvider" && m == "varmap",
        _ => false,
    }
}

/// One step of a path into a JSON document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathStep {
    /// An object's key.
    Key(String),
    /// An array's index.
    Index(usize),
}

/// Why the template's `spec` (`template_spec`) and `metadata` strings must not take the apply's
/// `variables`: a key's `${KEY}` outside the variables' values (the place named), or a key the
/// template does not name at all (not one of [`CAPT_KEYS`]). `(reason, message)`.
pub fn template_refusal(
    template_name: &str,
    template_spec: &Value,
    metadata_strings: &[&str],
    variables: Option<&BTreeMap<String, String>>,
) -> Option<(&'static str, String)> {
    let keys: Vec<&str> = variables
        .into_iter()
        .flat_map(|v| v.keys().map(String::as_str))
        .collect();
    let mut named: BTreeSet<&str> = BTreeSet::new();
    for text in metadata_strings {
        named.extend(
            keys.iter()
                .copied()
                .filter(|k| text.contains(&placeholder(k))),
        );
    }
    let mut outside: Option<(String, &str)> = None;
    walk(
        template_spec,
        &mut Vec::new(),
        &mut |path: &[PathStep], text: &str| {
            for key in keys
                .iter()
                .copied()
                .filter(|k| text.contains(&placeholder(k)))
            {
                if takes_values(path) {
                    named.insert(key);
                } else if outside.is_none() {
                    outside = Some((show(path), key));
                }
            }
        },
    );
    if let Some((path, key)) = outside {
        return Some((
            PLACEHOLDER_OUTSIDE_VARIABLES,
            format!(
                "WorkspaceTemplate {template_name}: spec.template.spec.{path} has ${{{key}}}; an \
                 apply's value reaches Terraform only as a variable's value \
                 (spec.forProvider.vars[].value or varmap: declare `variable \"...\"` in the \
                 module and pass \"${{{key}}}\" there), never as text of the module or of any \
                 other field; nothing is rendered"
            ),
        ));
    }
    let undeclared: Vec<&str> = keys
        .iter()
        .copied()
        .filter(|k| !named.contains(k) && !CAPT_KEYS.contains(k))
        .collect();
    (!undeclared.is_empty()).then(|| {
        (
            UNDECLARED_VARIABLE,
            format!(
                "spec.variables {} not named by WorkspaceTemplate {template_name} (its \
                 forProvider.vars or varmap take only the keys they name as \"${{KEY}}\"); \
                 nothing is rendered",
                undeclared.join(", ")
            ),
        )
    })
}

/// `${key}`.
fn placeholder(key: &str) -> String {
    format!("${{{key}}}")
}

/// A path as the user reads it: `forProvider.vars[0].value`.
fn show(path: &[PathStep]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            PathStep::Key(k) if out.is_empty() => out.push_str(k),
            PathStep::Key(k) => out.push_str(&format!(".{k}")),
            PathStep::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Calls `visit` with the path and text of every string in `value` (object keys excluded).
pub fn walk(value: &Value, path: &mut Vec<PathStep>, visit: &mut impl FnMut(&[PathStep], &str)) {
    match value {
        Value::String(text) => visit(path, text),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(PathStep::Index(i));
                walk(item, path, visit);
                path.pop();
            }
        }
        Value::Object(map) => {
            for (k, item) in map {
                path.push(PathStep::Key(k.clone()));
                walk(item, path, visit);
                path.pop();
            }
        }
        _ => {}
    }
}

/// `text` with each `${KEY}` of a key of `variables` replaced by its value, in one pass: a
/// value is never read again for placeholders. Any other `${…}` (Terraform's own) is left.
pub fn substitute(text: &str, variables: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let replaced = after
            .find('}')
            .and_then(|end| variables.get(&after[..end]).map(|v| (end, v)));
        match replaced {
            Some((end, value)) => {
                out.push_str(value);
                rest = &after[end + 1..];
            }
            None => {
                out.push_str("${");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn any_string_is_a_value_and_keys_are_identifiers() {
        let fine = vars(&[
            ("CIDR", "10.0.0.0/16"),
            ("ROLE", "arn:aws:iam::123456789012:role/eks"),
            ("ZONES", "ap-northeast-1a,ap-northeast-1c"),
            ("TAG", "team a \" } resource \"x\" \"y\" {"),
            ("_x9", ""),
        ]);
        assert_eq!(first_unsafe(Some(&fine)), None);
        for key in [
            "local.bucket",
            "terraform_data.vpc.output.name",
            "9x",
            "a-b",
            "",
            "a b",
            "${X}",
        ] {
            let message = first_unsafe(Some(&vars(&[(key, "v")]))).expect(key);
            assert!(message.contains("not an identifier"), "{message}");
        }
        assert!(first_unsafe(Some(&vars(&[(&"K".repeat(MAX_KEY + 1), "v")]))).is_some());
        let platform = first_unsafe(Some(&vars(&[("WORKSPACE_NAME", "other")]))).unwrap();
        assert!(platform.contains("platform's"), "{platform}");
        let big = "x".repeat(MAX_VALUE + 1);
        let message = first_unsafe(Some(&vars(&[("BIG", &big)]))).unwrap();
        assert!(message.contains("spec.variables.BIG") && !message.contains(&big));
    }

    #[test]
    fn substitution_is_one_pass_and_leaves_terraforms_own_interpolation() {
        let v = vars(&[("A", "${B}"), ("B", "b")]);
        assert_eq!(
            substitute("x ${A} ${B} ${var.c} ${", &v),
            "x ${B} b ${var.c} ${"
        );
    }

    #[test]
    fn a_key_is_taken_only_where_the_template_names_it_among_the_variables() {
        let spec = json!({"forProvider": {"source": "Inline", "module": "variable \"cidr\" {}",
            "vars": [{"key": "cidr", "value": "${CIDR}"}],
            "varmap": {"tags": {"zones": "${ZONES}"}}}});
        let v = vars(&[("CIDR", "10.0.0.0/16"), ("ZONES", "a,b"), ("REGION", "r")]);
        assert_eq!(template_refusal("p/t", &spec, &[], Some(&v)), None);
        // A key no field names: refused, unless it is one CAPT passes to every template.
        let v = vars(&[
            ("CIDR", "x"),
            ("ZONES", "y"),
            ("OTHER", "z"),
            ("VPC_NAME", "n"),
        ]);
        let (reason, message) = template_refusal("p/t", &spec, &[], Some(&v)).unwrap();
        assert_eq!(reason, UNDECLARED_VARIABLE);
        assert!(
            message.contains("OTHER") && !message.contains("VPC_NAME"),
            "{message}"
        );
        // Named in an annotation only: a value nothing runs.
        let v = vars(&[("CIDR", "x"), ("ZONES", "y"), ("NOTE", "z")]);
        assert_eq!(template_refusal("p/t", &spec, &["${NOTE}"], Some(&v)), None);
    }

    #[test]
    fn a_key_in_the_module_or_any_other_field_is_refused_with_its_place() {
        let v = vars(&[("NAME", "x")]);
        for (spec, place) in [
            (
                json!({"forProvider": {"module": "output \"n\" { value = \"${NAME}\" }"}}),
                "forProvider.module",
            ),
            (
                json!({"forProvider": {"inlineFormat": "JSON", "module": "{\"output\": {\"n\": {\"value\": \"${NAME}\"}}}"}}),
                "forProvider.module",
            ),
            (
                json!({"forProvider": {"source": "Remote", "module": "git::https://x/${NAME}"}}),
                "forProvider.module",
            ),
            (
                json!({"forProvider": {"entrypoint": "${NAME}"}}),
                "forProvider.entrypoint",
            ),
            (
                json!({"forProvider": {"env": [{"name": "TF_CLI_ARGS", "value": "${NAME}"}]}}),
                "forProvider.env[0].value",
            ),
            (
                json!({"forProvider": {"vars": [{"key": "${NAME}", "value": "v"}]}}),
                "forProvider.vars[0].key",
            ),
        ] {
            let (reason, message) = template_refusal("p/t", &spec, &[], Some(&v)).expect(place);
            assert_eq!(reason, PLACEHOLDER_OUTSIDE_VARIABLES);
            assert!(
                message.contains(place) && message.contains("${NAME}"),
                "{message}"
            );
        }
    }
}
