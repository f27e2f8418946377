//! A fake Crossplane provider-terraform, for tests: the pure parts of the
//! `fake-terraform-provider` binary (annotations → desired outcome, checksum, status apply
//! bodies, "is a write needed", the connection Secret), and [`FakeProvider`], the binary run as
//! a child process against the test environment.
//!
//! The binary plays provider-terraform's part against the real API server. For each
//! `tf.upbound.io/v1beta1` `Workspace` it adds the finalizer [`FINALIZER`], reads the outcome a
//! test wants from the annotations ([`OUTPUTS_ANNOTATION`], [`SENSITIVE_OUTPUTS_ANNOTATION`],
//! [`FAIL_ANNOTATION`], [`REVISION_ANNOTATION`]), writes `Synced=True/ReconcileSuccess` and
//! `Ready=False/Creating` at once, and after `--delay-ms` either `Ready=True/Available` with
//! `atProvider {checksum, outputs}` (and the connection Secret), or `Synced=False/ReconcileError`.
//! Status is written by server-side apply on the status subresource under [`FIELD_MANAGER`].

use crate::applier::binary;
use crate::{env, unique_name};
use anyhow::{Context, Result, bail};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The Workspace's group.
pub const GROUP: &str = "tf.upbound.io";
/// The Workspace's apiVersion.
pub const API_VERSION: &str = "tf.upbound.io/v1beta1";
/// The Workspace's kind.
pub const KIND: &str = "Workspace";
/// The field manager of every write the fake provider makes.
pub const FIELD_MANAGER: &str = "fake-provider-terraform";
/// The finalizer Crossplane managed resources carry.
pub const FINALIZER: &str = "finalizer.managedresource.crossplane.io";
/// The type of a Crossplane connection Secret.
pub const SECRET_TYPE: &str = "connection.crossplane.io/v1alpha1";
/// A JSON object of Terraform outputs (absent: no outputs).
pub const OUTPUTS_ANNOTATION: &str = "fake.tf.upbound.io/outputs";
/// A JSON object of sensitive outputs: in the connection Secret only, never in `atProvider`.
pub const SENSITIVE_OUTPUTS_ANNOTATION: &str = "fake.tf.upbound.io/sensitive-outputs";
/// When present and not empty, the apply fails with this message.
pub const FAIL_ANNOTATION: &str = "fake.tf.upbound.io/fail";
/// Any string: a change makes the provider re-apply (a new checksum).
pub const REVISION_ANNOTATION: &str = "fake.tf.upbound.io/revision";
/// A Workspace labelled with this belongs to the provider started with `--instance <value>`
/// only; a provider started without `--instance` leaves such Workspaces alone. Tests that run
/// their own provider use it so that no other provider on the same API server interferes.
pub const INSTANCE_LABEL: &str = "fake.tf.upbound.io/provider";
/// The default of `--delay-ms`: how long an apply or a deletion "runs".
pub const DEFAULT_DELAY_MS: u64 = 200;
/// What the binary logs once its first list of Workspaces is in its cache.
pub const READY_LOG_LINE: &str = "watching Workspaces";

/// The Workspace resource, for `Api<DynamicObject>::all_with`.
pub fn workspace_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1beta1", KIND), "workspaces")
}

/// The label selector a provider watches with: its instance's Workspaces (or, without an
/// instance, those of no instance), narrowed by `selector` when given.
pub fn watch_selector(instance: Option<&str>, selector: Option<&str>) -> String {
    let own = match instance {
        Some(name) => format!("{INSTANCE_LABEL}={name}"),
        None => format!("!{INSTANCE_LABEL}"),
    };
    match selector.map(str::trim).filter(|s| !s.is_empty()) {
        Some(extra) => format!("{own},{extra}"),
        None => own,
    }
}

/// The outcome a test asks of the provider, from a Workspace's annotations.
#[derive(Clone, PartialEq, Default)]
pub struct Desired {
    /// Non-sensitive outputs: `atProvider.outputs` and the connection Secret.
    pub outputs: Map<String, Value>,
    /// Sensitive outputs: the connection Secret only.
    pub sensitive: Map<String, Value>,
    /// When set, the apply fails with this message.
    pub failure: Option<String>,
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
        Ok(Self {
            outputs,
            sensitive,
            failure,
            revision: annotations.get(REVISION_ANNOTATION).cloned(),
        })
    }

    /// Like [`Desired::parse`], but an unusable annotation becomes a failed apply whose
    /// message says what is wrong: the provider never stops on bad input.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Self {
        Self::parse(annotations).unwrap_or_else(|e| Self {
            failure: Some(format!("invalid fake provider input: {e}")),
            revision: annotations.get(REVISION_ANNOTATION).cloned(),
            ..Self::default()
        })
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

    /// Identifies the whole desired state (checksum and failure): when it changes, the
    /// provider runs a new apply.
    pub fn state_key(&self, spec: &Value) -> String {
        format!(
            "{}/{}",
            checksum(spec, self),
            self.failure.as_deref().unwrap_or("")
        )
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

/// A state of the provider's work on one Workspace, as its status shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    /// Apply running: `Synced=True ReconcileSuccess`, `Ready=False Creating`; atProvider kept.
    Creating,
    /// Applied: `Synced=True`, `Ready=True Available`, atProvider replaced by these.
    Available {
        /// `atProvider.checksum`.
        checksum: String,
        /// `atProvider.outputs` (the non-sensitive outputs; omitted when empty).
        outputs: Map<String, Value>,
    },
    /// Apply failed: `Synced=False ReconcileError <message>`, `Ready=False Creating`;
    /// atProvider kept.
    Failed {
        /// The condition's message.
        message: String,
    },
    /// Deletion running: `Synced=True`, `Ready=False Deleting`; atProvider kept.
    Deleting,
}

impl Phase {
    /// (status, reason, message) of the Synced and the Ready condition.
    fn conditions(&self) -> [(&'static str, &'static str, &str); 2] {
        const SYNCED: (&str, &str, &str) = ("True", "ReconcileSuccess", "");
        match self {
            Phase::Creating => [SYNCED, ("False", "Creating", "")],
            Phase::Available { .. } => [SYNCED, ("True", "Available", "")],
            Phase::Failed { message } => [
                ("False", "ReconcileError", message.as_str()),
                ("False", "Creating", ""),
            ],
            Phase::Deleting => [SYNCED, ("False", "Deleting", "")],
        }
    }
}

/// The current time as Kubernetes writes it (`2026-01-01T00:00:00Z`).
pub fn now() -> String {
    let time = Time(k8s_openapi::jiff::Timestamp::now());
    match serde_json::to_value(time) {
        Ok(Value::String(s)) => s,
        _ => "1970-01-01T00:00:00Z".to_owned(),
    }
}

/// A condition of `status` by type.
pub fn condition<'a>(status: Option<&'a Value>, type_: &str) -> Option<&'a Value> {
    status?
        .get("conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
}

/// The server-side-apply body for the status subresource of Workspace `name` in `phase`.
///
/// Holds both conditions (each with `observedGeneration` = `generation` when known, and the
/// current `lastTransitionTime` when its status is unchanged), and the complete `atProvider`:
/// the new one when Available, otherwise the current one, so that the apply keeps it.
pub fn status_apply(
    name: &str,
    generation: Option<i64>,
    current: Option<&Value>,
    phase: &Phase,
    now: &str,
) -> Value {
    let [synced, ready] = phase.conditions();
    let conditions: Vec<Value> = [("Synced", synced), ("Ready", ready)]
        .into_iter()
        .map(|(type_, (status, reason, message))| {
            let existing = condition(current, type_);
            let unchanged = existing.and_then(|c| c.get("status")?.as_str()) == Some(status);
            let since = existing
                .filter(|_| unchanged)
                .and_then(|c| c.get("lastTransitionTime")?.as_str())
                .unwrap_or(now);
            let mut c = json!({
                "type": type_, "status": status, "reason": reason, "message": message,
                "lastTransitionTime": since,
            });
            if let Some(g) = generation {
                c["observedGeneration"] = json!(g);
            }
            c
        })
        .collect();
    let mut status = json!({ "conditions": conditions });
    match phase {
        Phase::Available { checksum, outputs } => {
            status["atProvider"] = at_provider(checksum, outputs);
        }
        _ => {
            if let Some(kept) = current
                .and_then(|s| s.get("atProvider"))
                .filter(|v| !v.is_null())
            {
                status["atProvider"] = kept.clone();
            }
        }
    }
    json!({
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": { "name": name },
        "status": status,
    })
}

/// `atProvider` as provider-terraform writes it (`outputs` omitted when there are none).
pub fn at_provider(checksum: &str, outputs: &Map<String, Value>) -> Value {
    let mut v = json!({ "checksum": checksum });
    if !outputs.is_empty() {
        v["outputs"] = Value::Object(outputs.clone());
    }
    v
}

/// Whether applying `body` (from [`status_apply`]) would change the current `status`: a
/// condition differs in status, reason, message or observedGeneration (not in
/// lastTransitionTime), or `atProvider` differs at all. Conditions of other types are
/// ignored.
pub fn needs_write(current: Option<&Value>, body: &Value) -> bool {
    let want = &body["status"];
    let wanted = want["conditions"].as_array().into_iter().flatten();
    for c in wanted {
        let Some(type_) = c.get("type").and_then(Value::as_str) else {
            continue;
        };
        let Some(have) = condition(current, type_) else {
            return true;
        };
        let text = |c: &Value, k: &str| c.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let same = ["status", "reason", "message"]
            .iter()
            .all(|k| text(have, k) == text(c, k))
            && have.get("observedGeneration").and_then(Value::as_i64)
                == c.get("observedGeneration").and_then(Value::as_i64);
        if !same {
            return true;
        }
    }
    current
        .and_then(|s| s.get("atProvider"))
        .filter(|v| !v.is_null())
        != want.get("atProvider")
}

/// The RFC 7386 merge patch that turns `from` into `to` (`to` holds no nulls). Used to
/// replace `atProvider` whole when keys another writer applied survive our apply.
pub fn merge_patch_between(from: &Value, to: &Value) -> Value {
    match (from, to) {
        (Value::Object(f), Value::Object(t)) => {
            let mut patch = Map::new();
            for (k, fv) in f {
                match t.get(k) {
                    None => {
                        patch.insert(k.clone(), Value::Null);
                    }
                    Some(tv) if tv != fv => {
                        patch.insert(k.clone(), merge_patch_between(fv, tv));
                    }
                    Some(_) => {}
                }
            }
            for (k, tv) in t {
                if !f.contains_key(k) {
                    patch.insert(k.clone(), tv.clone());
                }
            }
            Value::Object(patch)
        }
        _ => to.clone(),
    }
}

/// `spec.writeConnectionSecretToRef`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    /// The Secret's namespace.
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
}

/// The connection Secret a Workspace spec asks for, if any.
pub fn connection_secret_ref(spec: Option<&Value>) -> Option<SecretRef> {
    let r = spec?.get("writeConnectionSecretToRef")?;
    let field = |k: &str| {
        r.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    Some(SecretRef {
        namespace: field("namespace")?,
        name: field("name")?,
    })
}

/// The connection Secret (server-side apply body): every output as data, type
/// [`SECRET_TYPE`], controlled by the Workspace `owner` (name, uid) when its uid is known.
pub fn connection_secret(
    reference: &SecretRef,
    owner: (&str, Option<&str>),
    desired: &Desired,
) -> Secret {
    let owner_references = owner.1.map(|uid| {
        vec![OwnerReference {
            api_version: API_VERSION.to_owned(),
            kind: KIND.to_owned(),
            name: owner.0.to_owned(),
            uid: uid.to_owned(),
            controller: Some(true),
            block_owner_deletion: None,
        }]
    });
    Secret {
        metadata: ObjectMeta {
            name: Some(reference.name.clone()),
            namespace: Some(reference.namespace.clone()),
            owner_references,
            ..ObjectMeta::default()
        },
        type_: Some(SECRET_TYPE.to_owned()),
        data: Some(
            desired
                .connection_data()
                .into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Secret::default()
    }
}

/// Whether the `current` Secret differs from the `desired` one in type, data or owner.
pub fn secret_needs_write(current: Option<&Secret>, desired: &Secret) -> bool {
    let Some(current) = current else {
        return true;
    };
    let empty = BTreeMap::new();
    let uids = |s: &Secret| -> Vec<String> {
        s.metadata
            .owner_references
            .iter()
            .flatten()
            .map(|o| o.uid.clone())
            .collect()
    };
    current.type_ != desired.type_
        || current.data.as_ref().unwrap_or(&empty) != desired.data.as_ref().unwrap_or(&empty)
        || uids(desired).iter().any(|u| !uids(current).contains(u))
}

/// A running `fake-terraform-provider`, killed when dropped.
pub struct FakeProvider {
    child: Child,
    log: PathBuf,
}

impl FakeProvider {
    /// Starts the binary with `args` (e.g. `["--delay-ms", "300", "--instance", "t1"]`)
    /// against the test environment, and waits until it can list the Workspaces it handles. It
    /// logs to a temporary file (see [`FakeProvider::log_text`]) with `RUST_LOG` from
    /// `FAKE_PROVIDER_LOG` (default `info`), and exits by itself if the test process dies.
    pub async fn start(args: &[&str]) -> Result<Self> {
        let dir = std::env::temp_dir().join(unique_name("fake-provider"));
        std::fs::create_dir_all(&dir)?;
        let log = dir.join("fake-provider.log");
        let filter = std::env::var("FAKE_PROVIDER_LOG").unwrap_or_else(|_| "info".to_owned());
        let child = Command::new(binary("fake-terraform-provider"))
            .args(args)
            .arg("--exit-with-parent")
            .env("KUBECONFIG", &env().kubeconfig)
            .env("RUST_LOG", filter)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting fake-terraform-provider")?;
        let mut provider = Self { child, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if provider.log_text().contains(READY_LOG_LINE) {
                return Ok(provider);
            }
            if let Some(status) = provider.child.try_wait()? {
                bail!(
                    "fake-terraform-provider exited ({status}) before watching; log:\n{}",
                    provider.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        bail!(
            "fake-terraform-provider did not start watching within 30 s; log:\n{}",
            provider.log_text()
        )
    }

    /// What the process logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits up to `timeout` for the process to exit.
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .context("running kill -TERM")?;
        if !sent.success() {
            bail!("kill -TERM {} failed", self.child.id());
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                bail!("fake-terraform-provider did not exit within {timeout:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the process (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- fake-terraform-provider log ({}):\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn map(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn parses_outputs_sensitive_failure_and_revision() {
        let d = Desired::parse(&annotations(&[
            (
                OUTPUTS_ANNOTATION,
                r#"{"vpc_id":"vpc-123","azs":["a","b"]}"#,
            ),
            (
                SENSITIVE_OUTPUTS_ANNOTATION,
                r#"{"kubeconfig":"apiVersion: v1"}"#,
            ),
            (FAIL_ANNOTATION, "  boom  "),
            (REVISION_ANNOTATION, "7"),
            ("other", "x"),
        ]))
        .unwrap();
        assert_eq!(
            d.outputs,
            map(json!({"vpc_id": "vpc-123", "azs": ["a", "b"]}))
        );
        assert_eq!(d.sensitive, map(json!({"kubeconfig": "apiVersion: v1"})));
        assert_eq!(d.failure.as_deref(), Some("boom"));
        assert_eq!(d.revision.as_deref(), Some("7"));
    }

    #[test]
    fn absent_or_empty_annotations_mean_no_outputs_and_no_failure() {
        assert_eq!(
            Desired::parse(&BTreeMap::new()).unwrap(),
            Desired::default()
        );
        let d = Desired::parse(&annotations(&[
            (OUTPUTS_ANNOTATION, " "),
            (FAIL_ANNOTATION, ""),
        ]))
        .unwrap();
        assert_eq!(d, Desired::default());
    }

    #[test]
    fn bad_annotations_are_errors_that_become_failures_without_values() {
        let bad = annotations(&[
            (SENSITIVE_OUTPUTS_ANNOTATION, r#"{"password": "hunter2""#),
            (REVISION_ANNOTATION, "3"),
        ]);
        let e = Desired::parse(&bad).unwrap_err();
        assert_eq!(e.annotation, SENSITIVE_OUTPUTS_ANNOTATION);
        assert!(e.reason.starts_with("invalid JSON"), "{e}");
        let d = Desired::from_annotations(&bad);
        let message = d.failure.clone().unwrap();
        assert!(message.contains(SENSITIVE_OUTPUTS_ANNOTATION), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        assert!(d.outputs.is_empty() && d.sensitive.is_empty());
        assert_eq!(d.revision.as_deref(), Some("3"));

        let e = Desired::parse(&annotations(&[(OUTPUTS_ANNOTATION, "[1]")])).unwrap_err();
        assert!(e.reason.contains("an array"), "{e}");
        let e = Desired::parse(&annotations(&[(OUTPUTS_ANNOTATION, r#"{"a b":1}"#)])).unwrap_err();
        assert!(e.reason.contains("Secret key"), "{e}");
        let e = Desired::parse(&annotations(&[
            (OUTPUTS_ANNOTATION, r#"{"a":1}"#),
            (SENSITIVE_OUTPUTS_ANNOTATION, r#"{"a":2}"#),
        ]))
        .unwrap_err();
        assert!(e.reason.contains("also in"), "{e}");
    }

    #[test]
    fn debug_never_shows_sensitive_values() {
        let d = Desired::parse(&annotations(&[(
            SENSITIVE_OUTPUTS_ANNOTATION,
            r#"{"token":"s3cr3t"}"#,
        )]))
        .unwrap();
        let text = format!("{d:?}");
        assert!(text.contains("token") && !text.contains("s3cr3t"), "{text}");
    }

    #[test]
    fn connection_data_holds_every_output_as_text() {
        let d = Desired {
            outputs: map(json!({"vpc_id": "vpc-1", "port": 443, "azs": ["a"]})),
            sensitive: map(json!({"token": "t"})),
            ..Desired::default()
        };
        let data = d.connection_data();
        assert_eq!(data["vpc_id"], "vpc-1");
        assert_eq!(data["port"], "443");
        assert_eq!(data["azs"], r#"["a"]"#);
        assert_eq!(data["token"], "t");
        assert_eq!(data.len(), 4);
    }

    #[test]
    fn checksum_is_deterministic_and_follows_spec_outputs_and_revision() {
        let spec = json!({"forProvider": {"source": "Inline", "module": "# none"}});
        let d = Desired {
            outputs: map(json!({"a": 1, "b": 2})),
            ..Desired::default()
        };
        let c = checksum(&spec, &d);
        assert_eq!(c.len(), 16);
        assert!(c.chars().all(|ch| ch.is_ascii_hexdigit()));
        // Key order does not matter.
        let reordered = Desired {
            outputs: map(json!({"b": 2, "a": 1})),
            ..Desired::default()
        };
        let spec2 = json!({"forProvider": {"module": "# none", "source": "Inline"}});
        assert_eq!(checksum(&spec2, &reordered), c);
        let with_rev = Desired {
            revision: Some("2".into()),
            ..d.clone()
        };
        assert_ne!(checksum(&spec, &with_rev), c);
        let with_secret = Desired {
            sensitive: map(json!({"t": "x"})),
            ..d.clone()
        };
        assert_ne!(checksum(&spec, &with_secret), c);
        assert_ne!(checksum(&json!({"forProvider": {}}), &d), c);
        // A failure changes the state key, not the checksum.
        let failing = Desired {
            failure: Some("boom".into()),
            ..d.clone()
        };
        assert_eq!(checksum(&spec, &failing), c);
        assert_ne!(failing.state_key(&spec), d.state_key(&spec));
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let v = json!({"b": {"d": 1, "c": [{"z": 1, "y": "\"q"}]}, "a": null});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":null,"b":{"c":[{"y":"\"q","z":1}],"d":1}}"#
        );
    }

    const T0: &str = "2026-01-01T00:00:00Z";
    const T1: &str = "2026-01-01T00:01:00Z";

    fn ready_reason(body: &Value) -> (&str, &str) {
        let c = condition(Some(&body["status"]), "Ready").unwrap();
        (c["status"].as_str().unwrap(), c["reason"].as_str().unwrap())
    }

    #[test]
    fn status_bodies_mirror_provider_terraform() {
        let creating = status_apply("ws", Some(3), None, &Phase::Creating, T0);
        assert_eq!(creating["apiVersion"], API_VERSION);
        assert_eq!(creating["kind"], KIND);
        assert_eq!(creating["metadata"], json!({"name": "ws"}));
        assert_eq!(
            creating["status"]["conditions"][0],
            json!({"type": "Synced", "status": "True", "reason": "ReconcileSuccess", "message": "",
                   "lastTransitionTime": T0, "observedGeneration": 3})
        );
        assert_eq!(ready_reason(&creating), ("False", "Creating"));
        assert!(creating["status"].get("atProvider").is_none());

        let outputs = map(json!({"vpc_id": "vpc-1"}));
        let available = status_apply(
            "ws",
            Some(3),
            Some(&creating["status"]),
            &Phase::Available {
                checksum: "abc".into(),
                outputs: outputs.clone(),
            },
            T1,
        );
        assert_eq!(ready_reason(&available), ("True", "Available"));
        assert_eq!(
            available["status"]["atProvider"],
            json!({"checksum": "abc", "outputs": {"vpc_id": "vpc-1"}})
        );
        // Synced stayed True: its transition time is kept; Ready flipped: it is new.
        let synced = condition(Some(&available["status"]), "Synced").unwrap();
        assert_eq!(synced["lastTransitionTime"], T0);
        let ready = condition(Some(&available["status"]), "Ready").unwrap();
        assert_eq!(ready["lastTransitionTime"], T1);

        let failed = status_apply(
            "ws",
            None,
            Some(&available["status"]),
            &Phase::Failed {
                message: "boom".into(),
            },
            T1,
        );
        let synced = condition(Some(&failed["status"]), "Synced").unwrap();
        assert_eq!(synced["status"], "False");
        assert_eq!(synced["reason"], "ReconcileError");
        assert_eq!(synced["message"], "boom");
        assert!(synced.get("observedGeneration").is_none());
        assert_eq!(ready_reason(&failed), ("False", "Creating"));
        assert_eq!(
            failed["status"]["atProvider"], available["status"]["atProvider"],
            "a failure keeps atProvider"
        );

        let deleting = status_apply("ws", Some(3), Some(&failed["status"]), &Phase::Deleting, T1);
        assert_eq!(ready_reason(&deleting), ("False", "Deleting"));
        assert_eq!(
            deleting["status"]["atProvider"],
            available["status"]["atProvider"]
        );
    }

    #[test]
    fn available_without_outputs_has_only_a_checksum() {
        let body = status_apply(
            "ws",
            None,
            None,
            &Phase::Available {
                checksum: "c".into(),
                outputs: Map::new(),
            },
            T0,
        );
        assert_eq!(body["status"]["atProvider"], json!({"checksum": "c"}));
    }

    #[test]
    fn needs_write_ignores_transition_times_and_foreign_conditions() {
        let phase = Phase::Available {
            checksum: "c".into(),
            outputs: map(json!({"a": 1})),
        };
        let body = status_apply("ws", Some(1), None, &phase, T0);
        assert!(needs_write(None, &body));
        let mut current = body["status"].clone();
        assert!(!needs_write(Some(&current), &body));
        // Rebuilt later: same content, no write.
        let later = status_apply("ws", Some(1), Some(&current), &phase, T1);
        assert!(!needs_write(Some(&current), &later));
        // A foreign condition does not matter.
        current["conditions"].as_array_mut().unwrap().push(
            json!({"type": "Other", "status": "True", "reason": "X", "lastTransitionTime": T0}),
        );
        assert!(!needs_write(Some(&current), &body));
        // Another generation, reason or atProvider does.
        let newer = status_apply("ws", Some(2), Some(&current), &phase, T1);
        assert!(needs_write(Some(&current), &newer));
        let creating = status_apply("ws", Some(1), Some(&current), &Phase::Creating, T1);
        assert!(needs_write(Some(&current), &creating));
        let mut extra = current.clone();
        extra["atProvider"]["outputs"]["b"] = json!(2);
        assert!(needs_write(Some(&extra), &body));
        // A missing message reads as empty.
        let mut no_message = current.clone();
        for c in no_message["conditions"].as_array_mut().unwrap() {
            c.as_object_mut().unwrap().remove("message");
        }
        assert!(!needs_write(Some(&no_message), &body));
    }

    #[test]
    fn carried_at_provider_needs_no_write() {
        let current = json!({"atProvider": {"checksum": "c", "outputs": {"x": 1}}});
        let body = status_apply("ws", None, Some(&current), &Phase::Creating, T0);
        assert_eq!(body["status"]["atProvider"], current["atProvider"]);
        let mut after = body["status"].clone();
        after["atProvider"] = current["atProvider"].clone();
        assert!(!needs_write(Some(&after), &body));
    }

    #[test]
    fn merge_patch_between_removes_extra_keys() {
        let from =
            json!({"checksum": "a", "outputs": {"x": 1, "y": 2, "n": {"k": 1}}, "foreign": true});
        let to = json!({"checksum": "b", "outputs": {"x": 1, "n": {"k": 2}, "z": 3}});
        let patch = merge_patch_between(&from, &to);
        assert_eq!(
            patch,
            json!({"checksum": "b", "outputs": {"y": null, "n": {"k": 2}, "z": 3}, "foreign": null})
        );
        assert_eq!(merge_patch_between(&to, &to), json!({}));
    }

    #[test]
    fn connection_secret_ref_needs_name_and_namespace() {
        let spec = json!({"writeConnectionSecretToRef": {"name": "s", "namespace": "ns"}});
        assert_eq!(
            connection_secret_ref(Some(&spec)),
            Some(SecretRef {
                namespace: "ns".into(),
                name: "s".into()
            })
        );
        assert_eq!(
            connection_secret_ref(Some(&json!({"writeConnectionSecretToRef": {"name": "s"}}))),
            None
        );
        assert_eq!(connection_secret_ref(Some(&json!({}))), None);
        assert_eq!(connection_secret_ref(None), None);
    }

    #[test]
    fn connection_secret_and_its_comparison() {
        let reference = SecretRef {
            namespace: "ns".into(),
            name: "conn".into(),
        };
        let d = Desired {
            outputs: map(json!({"endpoint": "https://x"})),
            sensitive: map(json!({"token": "t"})),
            ..Desired::default()
        };
        let secret = connection_secret(&reference, ("ws", Some("uid-1")), &d);
        let v = serde_json::to_value(&secret).unwrap();
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["kind"], "Secret");
        assert_eq!(v["type"], SECRET_TYPE);
        assert_eq!(v["metadata"]["namespace"], "ns");
        assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(v["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(v["data"]["token"], "dA==");
        assert!(secret_needs_write(None, &secret));
        assert!(!secret_needs_write(Some(&secret), &secret));
        let other = connection_secret(&reference, ("ws", Some("uid-1")), &Desired::default());
        assert!(secret_needs_write(Some(&other), &secret));
        let unowned = connection_secret(&reference, ("ws", None), &d);
        assert!(secret_needs_write(Some(&unowned), &secret));
        assert!(!secret_needs_write(Some(&secret), &unowned));
    }

    #[test]
    fn watch_selector_separates_instances() {
        assert_eq!(watch_selector(None, None), "!fake.tf.upbound.io/provider");
        assert_eq!(
            watch_selector(Some("t1"), Some("a=b")),
            "fake.tf.upbound.io/provider=t1,a=b"
        );
        assert_eq!(
            watch_selector(None, Some(" ")),
            "!fake.tf.upbound.io/provider"
        );
    }

    #[test]
    fn now_is_a_kubernetes_timestamp() {
        let t = now();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
    }
}
