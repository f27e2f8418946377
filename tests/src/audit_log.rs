//! The API server's audit log of `hack/testenv.sh` (every request except those on Events and
//! Leases, at Metadata level: no bodies) read from an offset: which writes reached the API
//! server, by whom (reads are in the log too, and left out here). Counted by the server itself, so a write by any process, Cluster API core included,
//! shows.
//!
//! One kind of request is a write only in name: provider-terraform (and its stand-in) sends a
//! full status Update of each Workspace at every poll, as crossplane-runtime's reconciler
//! does, and the API server stores nothing when the status is unchanged. The audit log cannot
//! tell such a request apart, the Workspace's resourceVersion can: [`without_noop_polls`].

use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, Read, Seek};
use std::path::PathBuf;

/// One audited write.
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    /// The `fieldManager` of the request, else `(no manager: <user agent's program>)`.
    pub manager: String,
    /// `create`, `update`, `patch`, `delete`, ...
    pub verb: String,
    /// `resource[/subresource] namespace/name`.
    pub object: String,
    /// The object's name.
    pub name: String,
    /// The API server's answer (`responseStatus.code`); 0 when the log has none.
    pub code: u16,
    /// The pod that sent it, for a process acting as a pod of the Deployment
    /// ([`crate::pod::Pod`]: the impersonated user extra `pod`).
    pub pod: Option<String>,
    /// When the API server received it (`requestReceivedTimestamp`, RFC 3339).
    pub received: String,
}

impl Write {
    /// Refused for a stale `resourceVersion` precondition (409): nothing was written. The
    /// status-applier's applies carry one, and are refused when the object changed since the
    /// view they were planned on; it then reads the object and applies again.
    pub fn is_refused_as_stale(&self) -> bool {
        self.code == 409
    }

    /// A status Update of a Workspace by the provider: what a poll sends.
    fn is_provider_poll(&self) -> bool {
        self.manager == crate::fake_provider::FIELD_MANAGER
            && self.verb == "update"
            && self.object.starts_with("workspaces/status ")
    }
}

/// The resourceVersion of every Workspace of namespace `ns` (named `<ns>-…`, as the
/// controller names them), by name.
pub fn workspace_versions(ns: &str) -> Result<BTreeMap<String, String>> {
    workspace_versions_in(crate::env(), ns)
}

/// [`workspace_versions`] in the environment `env`.
pub fn workspace_versions_in(env: &crate::Env, ns: &str) -> Result<BTreeMap<String, String>> {
    let out = env.kubectl_ok(&["get", "workspaces", "-o", "json"], None)?;
    let list: Value = serde_json::from_str(&out)?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| {
            let name = w["metadata"]["name"].as_str()?;
            let version = w["metadata"]["resourceVersion"].as_str()?;
            name.starts_with(&format!("{ns}-"))
                .then(|| (name.to_owned(), version.to_owned()))
        })
        .collect())
}

/// `writes` less the provider's polls of Workspaces whose resourceVersion is the same
/// `before` and `after` the window (so the API server stored nothing for them), and how many
/// were left out. A poll of a Workspace that did change stays, as every other write does.
pub fn without_noop_polls(
    writes: Vec<Write>,
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) -> (Vec<Write>, usize) {
    let unchanged = |name: &str| before.get(name).is_some_and(|v| after.get(name) == Some(v));
    let (polls, kept): (Vec<Write>, Vec<Write>) = writes
        .into_iter()
        .partition(|w| w.is_provider_poll() && unchanged(&w.name));
    (kept, polls.len())
}

/// The writes to namespace `ns` of the environment `env` while `window` passes (a quiet
/// window: the caller has waited for what it started to settle), less the provider's no-op
/// polls ([`without_noop_polls`]), and how many polls were left out.
pub async fn writes_over(
    env: &crate::Env,
    ns: &str,
    window: std::time::Duration,
) -> Result<(Vec<Write>, usize)> {
    let before = workspace_versions_in(env, ns)?;
    let log = AuditLog::from_now_in(env)?;
    tokio::time::sleep(window).await;
    let after = workspace_versions_in(env, ns)?;
    Ok(without_noop_polls(log.writes_in(ns)?, &before, &after))
}

impl std::fmt::Display for Write {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} by {}", self.verb, self.object, self.manager)
    }
}

/// A position in the audit log.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    offset: u64,
}

impl AuditLog {
    /// The log of the running environment, from its current end.
    pub fn from_now() -> Result<Self> {
        Self::from_now_in(crate::env())
    }

    /// The log of the environment `env`, from its current end.
    pub fn from_now_in(env: &crate::Env) -> Result<Self> {
        let path = env.state_dir().join("audit.log");
        let offset = std::fs::metadata(&path)
            .with_context(|| format!("{}", path.display()))?
            .len();
        Ok(Self { path, offset })
    }

    /// The log of the running environment, from its beginning.
    pub fn from_start() -> Result<Self> {
        Ok(Self {
            path: Self::path()?,
            offset: 0,
        })
    }

    fn path() -> Result<PathBuf> {
        Ok(crate::env()
            .kubeconfig
            .parent()
            .context("the environment's state directory")?
            .join("audit.log"))
    }

    /// The writes since this position that touched namespace `ns` (or a cluster-scoped
    /// object whose name starts with `ns-`, as our Workspaces do).
    pub fn writes_in(&self, ns: &str) -> Result<Vec<Write>> {
        self.requests_in(ns, is_write)
    }

    /// Returns once this log holds every request the API server completed before the call:
    /// a read of a ConfigMap no one has (a name of its own, answered 404) is sent, and awaited
    /// in the log, which the API server writes as each request completes.
    pub async fn caught_up(&self, client: &kube::Client, ns: &str) -> Result<()> {
        use k8s_openapi::api::core::v1::ConfigMap;
        let name = crate::unique_name("audit-marker");
        let configmaps: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), ns);
        configmaps.get_opt(&name).await?;
        let marker = format!("configmaps {ns}/{name}");
        crate::system::wait_until(
            &format!("the audit log to record the read of {marker}"),
            std::time::Duration::from_secs(10),
            || async {
                let reads = self.requests_in(ns, |verb| verb == "get")?;
                Ok(reads.iter().any(|r| r.object == marker))
            },
        )
        .await
    }

    /// The requests since this position on `ns` (as [`AuditLog::writes_in`] counts it) whose
    /// verb `verb` keeps: reads too (`get`, `list`, `watch`). [`Write::manager`] is then the
    /// program of the user agent (`(no manager: capt-controller)`), a read has no field
    /// manager.
    pub fn requests_in(&self, ns: &str, verb: impl Fn(&str) -> bool) -> Result<Vec<Write>> {
        let prefix = format!("{ns}-");
        self.requests(|event| {
            let o = &event["objectRef"];
            let name = o["name"].as_str().unwrap_or("");
            event["verb"].as_str().is_some_and(&verb)
                && (o["namespace"] == ns || name.starts_with(&prefix))
        })
    }

    /// The requests since this position by `programs` (the first word of their User-Agent)
    /// that reach beyond namespace `ns`: any on a namespaced object of another namespace, or on
    /// a Workspace not named for `ns` (`<ns>-…`). A process scoped to `ns` sends none of them;
    /// its cluster-wide lists and watches name no object and are not counted.
    pub fn requests_outside(&self, ns: &str, programs: &[&str]) -> Result<Vec<Write>> {
        let prefix = format!("{ns}-");
        self.requests(|event| {
            let agent = event["userAgent"].as_str().unwrap_or("");
            let program = agent.split('/').next().unwrap_or(agent);
            let o = &event["objectRef"];
            let name = o["name"].as_str().unwrap_or("");
            // The controller's check at start of each namespace it trusts with code reads
            // that Namespace object by name (docs/operating.md, "The trusted namespace"):
            // its metadata, nothing in it.
            let trust_check = o["resource"] == "namespaces" && event["verb"] == "get";
            // Templates are listed and watched only in the namespaces trusted with code, one
            // watch each (docs/operating.md, "Tenancy"): the platform's, meant to be read.
            let trusted_templates = o["resource"] == "workspacetemplates"
                && matches!(event["verb"].as_str(), Some("list" | "watch"));
            let elsewhere = !trust_check
                && !trusted_templates
                && o["namespace"].as_str().is_some_and(|n| n != ns)
                || (o["resource"] == "workspaces"
                    && !name.is_empty()
                    && !name.starts_with(&prefix));
            programs.contains(&program) && elsewhere
        })
    }

    /// The audit events of the requests completed since this position that `keep` keeps,
    /// whole (`requestURI`, `userAgent`, `requestReceivedTimestamp`, `stageTimestamp`, ...).
    pub fn events(&self, keep: impl Fn(&Value) -> bool) -> Result<Vec<Value>> {
        let mut file = std::fs::File::open(&self.path)?;
        let end = file.metadata()?.len();
        anyhow::ensure!(end >= self.offset, "the audit log was rotated");
        file.seek(std::io::SeekFrom::Start(self.offset))?;
        let reader = std::io::BufReader::new(file.take(end - self.offset));
        let mut events = Vec::new();
        for line in reader.lines() {
            let Ok(event) = serde_json::from_str::<Value>(&line?) else {
                continue; // the line the API server is still writing
            };
            if event["stage"] == "ResponseComplete" && keep(&event) {
                events.push(event);
            }
        }
        Ok(events)
    }

    /// The completed requests since this position that `keep` keeps.
    fn requests(&self, keep: impl Fn(&Value) -> bool) -> Result<Vec<Write>> {
        let mut writes = Vec::new();
        for event in self.events(keep)? {
            let o = &event["objectRef"];
            let name = o["name"].as_str().unwrap_or("");
            writes.push(Write {
                manager: manager(&event),
                verb: event["verb"].as_str().unwrap_or("").to_owned(),
                object: format!(
                    "{}{} {}/{name}",
                    o["resource"].as_str().unwrap_or(""),
                    o["subresource"]
                        .as_str()
                        .map(|s| format!("/{s}"))
                        .unwrap_or_default(),
                    o["namespace"].as_str().unwrap_or(""),
                ),
                name: name.to_owned(),
                code: event["responseStatus"]["code"]
                    .as_u64()
                    .and_then(|c| u16::try_from(c).ok())
                    .unwrap_or(0),
                pod: event["impersonatedUser"]["extra"]["pod"][0]
                    .as_str()
                    .map(str::to_owned),
                received: event["requestReceivedTimestamp"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
            });
        }
        Ok(writes)
    }
}

/// The verbs that change something: the audit log records reads too (`get`, `list`,
/// `watch`).
pub fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

fn manager(event: &Value) -> String {
    let uri = event["requestURI"].as_str().unwrap_or("");
    uri.split_once('?')
        .and_then(|(_, q)| q.split('&').find_map(|kv| kv.strip_prefix("fieldManager=")))
        .map(str::to_owned)
        .unwrap_or_else(|| {
            let agent = event["userAgent"].as_str().unwrap_or("unknown");
            format!("(no manager: {})", agent.split('/').next().unwrap_or(agent))
        })
}
