//! The outcome a test asks of the fake provider, parsed from a Workspace's annotations, and
//! the checksum of an apply (over canonical JSON).

use super::{
    FAIL_ANNOTATION, FAIL_TIMES_ANNOTATION, OUTPUTS_ANNOTATION, REVISION_ANNOTATION,
    SENSITIVE_OUTPUTS_ANNOTATION,
};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::fmt;

/// The outcome a test asks of the provider, from a Workspace's annotations.
#[derive(Clone, PartialEq, Default)]
pub struct Desired {
    /// Non-sensitive outputs: `atProvider.outputs` and the connection Secret.
    pub outputs: Map<String, Value>,
    /// Sensitive outputs: the connection Secret only.
    pub sensitive: Map<String, Value>,
    /// When set, every apply fails with this message.
    pub failure: Option<String>,
    /// The first this many applies of this configuration fail with a transient error; the
    /// next one succeeds.
    pub fail_times: u32,
    /// A free revision string; a change means a new apply.
    pub revision: Option<String>,
}

// Never shows sensitive values, only their names.
impl fmt::Debug for Desired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Desired")
            .field("outputs", &self.outputs)
            .field("sensitive", &self.sensitive_names())
            .field("failure", &self.failure)
            .field("fail_times", &self.fail_times)
            .field("revision", &self.revision)
            .finish()
    }
}

/// An annotation the provider cannot use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotationError {
    /// The annotation's key.
    pub annotation: &'static str,
    /// What is wrong with it (never its value).
    pub reason: String,
}

impl fmt::Display for AnnotationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "annotation {}: {}", self.annotation, self.reason)
    }
}

impl std::error::Error for AnnotationError {}

impl Desired {
    /// Parses the annotations; invalid JSON, a non-object, an output name that cannot be a
    /// Secret key, or a name both sensitive and not, is an error.
    pub fn parse(annotations: &BTreeMap<String, String>) -> Result<Self, AnnotationError> {
        let outputs = parse_outputs(annotations, OUTPUTS_ANNOTATION)?;
        let sensitive = parse_outputs(annotations, SENSITIVE_OUTPUTS_ANNOTATION)?;
        if let Some(name) = outputs.keys().find(|k| sensitive.contains_key(*k)) {
            return Err(AnnotationError {
                annotation: SENSITIVE_OUTPUTS_ANNOTATION,
                reason: format!("output {name:?} is also in {OUTPUTS_ANNOTATION}"),
            });
        }
        let failure = annotations
            .get(FAIL_ANNOTATION)
            .map(|m| m.trim().to_owned())
            .filter(|m| !m.is_empty());
        let fail_times = match annotations.get(FAIL_TIMES_ANNOTATION).map(|s| s.trim()) {
            None | Some("") => 0,
            Some(n) => n.parse().map_err(|_| AnnotationError {
                annotation: FAIL_TIMES_ANNOTATION,
                reason: "expected a whole number of failed applies".into(),
            })?,
        };
        Ok(Self {
            outputs,
            sensitive,
            failure,
            fail_times,
            revision: annotations.get(REVISION_ANNOTATION).cloned(),
        })
    }

    /// Adds the non-sensitive outputs an inline HCL module in `spec` declares with a string
    /// literal value ([`literal_module_outputs`]), as Terraform would report them; an
    /// annotation's output of the same name wins. Sensitive outputs come from the
    /// sensitive-outputs annotation alone: a test decides what secret data exists.
    pub fn with_module_outputs(mut self, spec: &Value) -> Self {
        for (name, value, sensitive) in literal_module_outputs(spec) {
            if sensitive || self.sensitive.contains_key(&name) {
                continue;
            }
            self.outputs.entry(name).or_insert(value);
        }
        self
    }

    /// The names of the sensitive outputs (safe to log).
    pub fn sensitive_names(&self) -> Vec<&str> {
        self.sensitive.keys().map(String::as_str).collect()
    }

    /// The names of the non-sensitive outputs.
    pub fn output_names(&self) -> Vec<&str> {
        self.outputs.keys().map(String::as_str).collect()
    }

    /// Every output, sensitive or not, as the connection Secret holds it: strings as they
    /// are, other JSON values as compact JSON text.
    pub fn connection_data(&self) -> BTreeMap<String, String> {
        self.outputs
            .iter()
            .chain(self.sensitive.iter())
            .map(|(k, v)| {
                let text = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (k.clone(), text)
            })
            .collect()
    }

    /// The outcome of the `attempt`-th apply (0 for the first) of this configuration:
    /// the failure asked for, else a transient error while `attempt < fail_times`.
    pub fn apply_outcome(&self, attempt: u32) -> Result<(), String> {
        if let Some(message) = &self.failure {
            return Err(message.clone());
        }
        if attempt < self.fail_times {
            return Err(format!(
                "transient error (fake): failed apply {} of {}",
                attempt + 1,
                self.fail_times
            ));
        }
        Ok(())
    }

    /// Whether Observe's plan shows a diff against what was applied (`applied`, the
    /// checksum of the last successful apply; `None` when nothing was): a new configuration,
    /// or one whose apply fails (it never converges, so its plan always differs).
    pub fn differs(&self, checksum: &str, applied: Option<&str>) -> bool {
        applied != Some(checksum) || self.failure.is_some()
    }
}

fn parse_outputs(
    annotations: &BTreeMap<String, String>,
    annotation: &'static str,
) -> Result<Map<String, Value>, AnnotationError> {
    let Some(raw) = annotations.get(annotation) else {
        return Ok(Map::new());
    };
    if raw.trim().is_empty() {
        return Ok(Map::new());
    }
    let error = |reason: String| AnnotationError { annotation, reason };
    // serde_json's message says where the syntax breaks, never what the text is.
    let value: Value =
        serde_json::from_str(raw).map_err(|e| error(format!("invalid JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(error(format!(
            "expected a JSON object of outputs, got {}",
            json_kind(&value)
        )));
    };
    if let Some(bad) = map.keys().find(|k| !valid_secret_key(k)) {
        return Err(error(format!(
            "output name {bad:?} cannot be a Secret key (letters, digits, '-', '_', '.')"
        )));
    }
    Ok(map)
}

/// `(name, value, sensitive)` of each `output` block of an inline HCL module
/// (`forProvider.source: Inline`) whose `value` is a string literal without interpolation,
/// one attribute per line or all on the block's line. Anything else (a reference, a list, a
/// remote module) is Terraform's to compute, which the fake does not: such outputs come from
/// the outputs annotations.
pub fn literal_module_outputs(spec: &Value) -> Vec<(String, Value, bool)> {
    let for_provider = &spec["forProvider"];
    let format = for_provider["inlineFormat"].as_str().unwrap_or("HCL");
    let module = match for_provider["module"].as_str() {
        Some(m) if for_provider["source"] == "Inline" && format == "HCL" => m,
        _ => return vec![],
    };
    let mut found = vec![];
    // (name, value, sensitive) of the block being read.
    let mut open: Option<(String, Option<String>, bool)> = None;
    for line in module.lines() {
        let line = line.trim();
        let closes = match open.as_mut() {
            Some(_) if line == "}" => true,
            Some(block) => {
                read_attributes(line, block);
                false
            }
            None => {
                let header = line.strip_prefix("output \"");
                let Some((name, body)) = header.and_then(|h| h.split_once('"')) else {
                    continue;
                };
                let mut block = (name.to_owned(), None, false);
                let body = body.trim().trim_start_matches('{');
                read_attributes(body, &mut block);
                open = Some(block);
                body.trim_end().ends_with('}')
            }
        };
        if closes && let Some((name, Some(value), sensitive)) = open.take() {
            found.push((name, Value::String(value), sensitive));
        }
    }
    found
}

/// Reads `value = "…"` and `sensitive = true` from one line of an output block.
fn read_attributes(text: &str, block: &mut (String, Option<String>, bool)) {
    let text = text.trim().trim_end_matches('}').trim();
    if let Some(rest) = text.strip_prefix("value") {
        let literal = rest.trim_start().strip_prefix('=').map(str::trim);
        let literal = literal.and_then(|l| l.strip_prefix('"'));
        let literal = literal.and_then(|l| l.split_once('"')).map(|(v, _)| v);
        block.1 = literal.filter(|v| !v.contains("${")).map(str::to_owned);
    } else if text.replace(' ', "") == "sensitive=true" {
        block.2 = true;
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn valid_secret_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 253
        && k != "."
        && k != ".."
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// JSON text with object keys sorted at every level, whatever map type `serde_json` uses.
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The `atProvider.checksum` of an apply: FNV-1a (64 bits, 16 hex digits) of the canonical
/// JSON of the spec, all outputs and the revision. Deterministic across runs and builds.
pub fn checksum(spec: &Value, desired: &Desired) -> String {
    let doc = json!({
        "spec": spec,
        "outputs": desired.outputs,
        "sensitive": desired.sensitive,
        "revision": desired.revision,
    });
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in canonical_json(&doc).bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}
