//! A seeded, bounded replay against the real API server: a random sequence of intents,
//! submitted to a real status-applier process, interleaved with foreign writes through
//! kube-rs (server-side applies, forced or not, and merge patches, which are Update
//! operations) on the status of one CAPTControlPlane, `atProvider` included. After every
//! step, once the applier has settled, the object must hold what the model predicts:
//!
//! * `status.workspaceStatus.atProvider` is present whenever our desired document holds it
//!   (that is, unless one of our intents released it), and no apply of ours removes it;
//! * where no foreign manager owns a field of `atProvider`, it equals our desired one;
//! * every field we want that no foreign manager owns is on the object with our value;
//! * every field a foreign manager owned when its write (or the step before our intent) was
//!   answered keeps its value: no apply of ours takes it;
//! * a field we released is gone unless another manager owns it;
//! * our managedFields entry holds exactly the fields of the applier's document for us,
//!   less those a foreign owner's other value left out of the apply.
//!
//! The seed comes from `REPLAY_SEED` (a number), or from the clock on every run, and is
//! printed first (with the applier's arguments, `REPLAY_APPLIER_ARGS`); every failure names
//! it and the step. Every seed that ever failed is kept below as a named test, and
//! `hack/soak.sh N` replays N new seeds. `status-applier/tests/foreign_model.rs` is the
//! exhaustive, pure version of the same property.
//!
//! The generator makes every write the CRD takes (`REPLAY_WRITES=all`, the default), or only
//! what the pure model covers (`REPLAY_WRITES=limited`: see [`Writes`]); the named seeds were
//! found with the limited one and replay with it. A foreign writer's own apply that the API
//! server refuses (a 409 without force, or a 422 where the CRD refuses what the apply would
//! leave) changes nothing and is logged as refused.

use anyhow::{Context, Result, bail};
use capt_controller::api::CAPTControlPlane;
use capt_tests::applier::Applier;
use capt_tests::{TestNamespace, env};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Map, Value, json};
use status_applier::intent::Intent;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

const OURS: &str = "capt-captcontrolplane";
const API_VERSION: &str = "controlplane.cluster.x-k8s.io/v1beta1";
const AT_PROVIDER: &str = "status.workspaceStatus.atProvider";
const PHASES: [&str; 3] = ["Creating", "Ready", "Failed"];
/// The whole replay, applier start included, stays within this.
const BUDGET: Duration = Duration::from_secs(55);

/// SplitMix64: small, seedable, good enough to pick steps.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True with probability `percent`/100.
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// The seed to replay: `REPLAY_SEED` (a number), or a new one from the clock on every run.
fn seed() -> u64 {
    match std::env::var("REPLAY_SEED") {
        Ok(s) if s.trim() != "random" && !s.trim().is_empty() => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("REPLAY_SEED={s} is neither a number nor `random`")),
        _ => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    }
}

/// Which foreign writes and intents the generator makes. A seed replays the same steps only
/// with the generator it was found with.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Writes {
    /// Merge patches only write fields whose parent maps exist, applies write no maps below
    /// `atProvider`, intents never replace `atProvider` with a map that holds nothing but is
    /// not `{}`, nor release it while a foreign manager owns a field below it. The named seeds
    /// below were found with it, but one.
    Limited,
    /// [`Writes::Limited`] as it was before it held back the release of `atProvider` while a
    /// foreign manager owns a field below it: seed 1795660137386833806 was found with it
    /// (the API server left `atProvider: null`, which the CRD refused), and the release was
    /// held back from then on, until the applier kept such an `atProvider` (guarantee 4 of
    /// docs/concurrency.md).
    LimitedWithReleases,
    /// Everything the CRD takes.
    All,
}

impl Writes {
    /// The limits of [`Writes::Limited`] but the held-back release.
    fn limited(self) -> bool {
        self != Self::All
    }

    /// Its name in `REPLAY_WRITES`.
    fn name(self) -> &'static str {
        match self {
            Self::Limited => "limited",
            Self::LimitedWithReleases => "limited-with-releases",
            Self::All => "all",
        }
    }
}

/// `REPLAY_WRITES=limited`, `limited-with-releases` or `all` (the default).
fn writes() -> Writes {
    match std::env::var("REPLAY_WRITES").as_deref() {
        Ok("limited") => Writes::Limited,
        Ok("limited-with-releases") => Writes::LimitedWithReleases,
        Ok("all") | Err(_) => Writes::All,
        Ok(other) => {
            panic!("REPLAY_WRITES={other} is neither `limited`, `limited-with-releases` nor `all`")
        }
    }
}

/// Extra arguments of the replay's applier (`REPLAY_APPLIER_ARGS`, split on spaces), e.g.
/// `--apply-lone-intents-at-once=false`.
fn applier_args() -> Vec<String> {
    let mut args = vec!["--no-events".to_owned()];
    if let Ok(extra) = std::env::var("REPLAY_APPLIER_ARGS") {
        args.extend(extra.split_whitespace().map(str::to_owned));
    }
    args
}

// ---------------------------------------------------------------------------------------
// The model

/// Scalar leaves by dotted path.
type Flat = BTreeMap<String, Value>;

fn flatten(v: &Value) -> Flat {
    fn walk(v: &Value, path: &str, out: &mut Flat) {
        match v {
            Value::Object(map) => {
                for (k, x) in map {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(x, &p, out);
                }
            }
            Value::Null => {}
            other => {
                out.insert(path.to_owned(), other.clone());
            }
        }
    }
    let mut out = Flat::new();
    walk(v, "", &mut out);
    out
}

fn is_under(p: &str, prefix: &str) -> bool {
    p == prefix || p.starts_with(&format!("{prefix}."))
}

fn under(flat: &Flat, prefix: &str) -> Flat {
    flat.iter()
        .filter(|(p, _)| is_under(p, prefix))
        .map(|(p, v)| (p.clone(), v.clone()))
        .collect()
}

fn get<'a>(v: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(v, |here, k| here.get(k))
}

/// Our desired status after an intent: RFC 7386 on the leaves, `atProvider` replaced whole
/// by a fragment that carries it, and kept (if it had leaves and has none now) unless
/// released.
fn model_merge(before: &Flat, fragment: &Value, released: bool) -> Flat {
    fn patch(out: &mut Flat, v: &Value, path: &str) {
        let Value::Object(map) = v else { return };
        for (k, x) in map {
            let p = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            match x {
                Value::Null => out.retain(|q, _| !is_under(q, &p)),
                Value::Object(_) => {
                    out.remove(&p);
                    patch(out, x, &p);
                }
                scalar => {
                    out.retain(|q, _| !is_under(q, &p));
                    out.insert(p, scalar.clone());
                }
            }
        }
    }
    let mut out = before.clone();
    patch(&mut out, fragment, "");
    if let Some(v) = get(fragment, AT_PROVIDER).filter(|v| v.is_object()) {
        out.retain(|q, _| !is_under(q, AT_PROVIDER));
        for (q, x) in flatten(v) {
            out.insert(format!("{AT_PROVIDER}.{q}"), x);
        }
    }
    let had = under(before, AT_PROVIDER);
    if !released && !had.is_empty() && under(&out, AT_PROVIDER).is_empty() {
        out.extend(had);
    }
    out
}

/// The fields each `managedFields` entry owns: `(manager, operation, dotted path)`.
fn owned_fields(object: &Value) -> Vec<(String, String, String)> {
    fn walk(node: &Value, path: &str, out: &mut Vec<String>) {
        let Value::Object(map) = node else { return };
        let children: Vec<(&String, &Value)> =
            map.iter().filter(|(k, _)| k.starts_with("f:")).collect();
        if (children.is_empty() || map.contains_key(".")) && !path.is_empty() {
            out.push(path.to_owned());
        }
        for (k, child) in children {
            let name = &k[2..];
            let p = if path.is_empty() {
                name.to_owned()
            } else {
                format!("{path}.{name}")
            };
            walk(child, &p, out);
        }
    }
    let mut owned = Vec::new();
    for entry in object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let mut paths = Vec::new();
        walk(&entry["fieldsV1"], "", &mut paths);
        for p in paths {
            owned.push((
                entry["manager"].as_str().unwrap_or_default().to_owned(),
                entry["operation"].as_str().unwrap_or_default().to_owned(),
                p,
            ));
        }
    }
    owned
}

/// The leaves of `object` that a manager other than ours owns, with their values.
fn foreign_leaves(object: &Value) -> Flat {
    let live = flatten(object);
    owned_fields(object)
        .into_iter()
        .filter(|(manager, _, _)| manager != OURS)
        .filter_map(|(_, _, p)| live.get(&p).map(|v| (p, v.clone())))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Steps

#[derive(Debug)]
enum Step {
    Intent {
        fragment: Value,
        release: bool,
    },
    ForeignApply {
        manager: &'static str,
        force: bool,
        status: Value,
    },
    ForeignUpdate {
        manager: &'static str,
        status: Value,
    },
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Intent { fragment, release } => write!(
                f,
                "intent {fragment}{}",
                if *release {
                    " releasing atProvider"
                } else {
                    ""
                }
            ),
            Step::ForeignApply {
                manager,
                force,
                status,
            } => write!(
                f,
                "{manager} applies{} {status}",
                if *force { " (forced)" } else { "" }
            ),
            Step::ForeignUpdate { manager, status } => {
                write!(f, "{manager} updates (merge patch) {status}")
            }
        }
    }
}

fn set(doc: &mut Value, dotted: &str, value: Value) {
    let mut here = doc;
    for k in dotted.split('.') {
        if !here.is_object() {
            *here = json!({});
        }
        here = here
            .as_object_mut()
            .expect("an object")
            .entry(k.to_owned())
            .or_insert(Value::Null);
    }
    *here = value;
}

fn word(rng: &mut Rng, prefix: &str) -> Value {
    json!(format!("{prefix}{}", rng.below(3)))
}

/// A value for a status field, valid for the CRD schema.
fn value_for(rng: &mut Rng, field: &str) -> Value {
    match field.rsplit('.').next().unwrap_or_default() {
        "phase" => json!(rng.pick(&PHASES)),
        "ready" => json!(rng.chance(50)),
        "checksum" => word(rng, "c"),
        "failureMessage" => word(rng, "m"),
        _ => word(rng, "o"),
    }
}

/// True when a manager other than ours owns a field below `atProvider`: releasing it then
/// would leave `atProvider: null`, which the CRD refuses (422), so the limited generator
/// did not make that release (it works since: see `docs/concurrency.md`).
fn foreign_owns_under_at_provider(live: &Value) -> bool {
    live["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["manager"] != OURS)
        .any(|e| {
            e["fieldsV1"]["f:status"]["f:workspaceStatus"]["f:atProvider"]
                .as_object()
                .is_some_and(|m| m.keys().any(|k| k != "."))
        })
}

fn intent_step(rng: &mut Rng, writes: Writes) -> Step {
    let mut status = json!({});
    for field in ["phase", "failureMessage", "workspaceStatus.ready"] {
        match rng.below(10) {
            0..=4 => {}
            5..=8 => set(&mut status, field, value_for(rng, field)),
            _ => set(&mut status, field, Value::Null),
        }
    }
    let release = rng.chance(12);
    let at_provider = if release && rng.chance(70) {
        Some(Value::Null)
    } else {
        match rng.below(10) {
            0..=3 => None,
            4 => Some(Value::Null),
            _ => {
                let mut at = json!({});
                for field in ["checksum", "outputs.a", "outputs.b"] {
                    match rng.below(10) {
                        0..=2 => {}
                        3..=8 => set(&mut at, field, value_for(rng, field)),
                        _ => set(&mut at, field, Value::Null),
                    }
                }
                if rng.chance(10) {
                    set(&mut at, "outputs", Value::Null);
                }
                // A map that holds nothing replaces atProvider with nothing: written `{}`,
                // the applier keeps a protected atProvider (see the module doc).
                if writes.limited() && flatten(&at).is_empty() {
                    at = json!({});
                }
                Some(at)
            }
        }
    };
    if let Some(at) = at_provider {
        set(&mut status, "workspaceStatus.atProvider", at);
    }
    Step::Intent {
        fragment: json!({ "status": status }),
        release,
    }
}

fn foreign_step(rng: &mut Rng, live: &Value, writes: Writes) -> Step {
    let manager = rng.pick(&["foreign-a", "foreign-b"]);
    if rng.chance(65) {
        let mut fields = vec![
            "phase",
            "failureMessage",
            "workspaceStatus.ready",
            "workspaceStatus.atProvider.checksum",
        ];
        if writes == Writes::All {
            fields.push("workspaceStatus.atProvider.outputs.f");
        }
        let mut status = json!({});
        for field in fields {
            if rng.chance(45) {
                set(&mut status, field, value_for(rng, field));
            }
        }
        return Step::ForeignApply {
            manager,
            force: rng.chance(50),
            status,
        };
    }
    let mut status = json!({});
    for field in [
        "phase",
        "failureMessage",
        "workspaceStatus.ready",
        "workspaceStatus.atProvider.checksum",
        "workspaceStatus.atProvider.outputs.a",
        "workspaceStatus.atProvider.outputs.f",
    ] {
        let parent = format!("status.{field}");
        let parent = parent.rsplit_once('.').expect("a parent").0;
        let parent_exists = get(live, parent).is_some_and(Value::is_object);
        if (parent_exists || writes == Writes::All) && rng.chance(40) {
            let value = if rng.chance(70) {
                value_for(rng, field)
            } else {
                Value::Null
            };
            set(&mut status, field, value);
        }
    }
    Step::ForeignUpdate {
        manager: rng.pick(&["foreign-a", "foreign-u"]),
        status,
    }
}

// ---------------------------------------------------------------------------------------
// The replay

struct Replay {
    seed: u64,
    ns: String,
    api: Api<DynamicObject>,
    applier: Applier,
    desired: Flat,
    /// The applier answered that it kept `atProvider` (the API server refused the `null` a
    /// release would leave where another manager owns the map itself): our values stay there
    /// until an answer stops saying so.
    pinned: bool,
    /// An intent was submitted.
    submitted: bool,
    /// The leaves foreign managers owned when the last step's write was answered (before
    /// our intent, or as the foreign write left them), with their values.
    guarded: Flat,
    started: Instant,
    log: String,
}

impl Replay {
    async fn object(&self) -> Result<Value> {
        Ok(serde_json::to_value(self.api.get("demo").await?)?)
    }

    /// The object once the applier has acted on its current version ([`acted_on`]).
    async fn settled(&self) -> Result<Value> {
        self.applier
            .acted_on(
                &self.api,
                "demo",
                OURS,
                self.submitted,
                Duration::from_secs(10),
            )
            .await
    }

    /// Our desired document for the object, as the applier holds it (`{}` before our first
    /// intent).
    async fn document(&self) -> Result<Value> {
        let documents = self.applier.client.get("/v1/intents").await?.json();
        let ours: Vec<&Value> = documents
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["object"]["name"] == "demo" && d["fieldManager"] == OURS)
            .collect();
        match ours.as_slice() {
            [] if !self.submitted => Ok(json!({})),
            [d] => Ok(d["document"].clone()),
            _ => bail!("expected one document of ours for demo: {documents}"),
        }
    }

    fn intent(&self, fragment: &Value, release: bool) -> Result<Intent> {
        let mut v = json!({
            "target": {"apiVersion": API_VERSION, "kind": "CAPTControlPlane", "namespace": self.ns, "name": "demo"},
            "subresource": "status",
            "fieldManager": OURS,
            "fragment": fragment,
        });
        if release {
            v["release"] = json!([AT_PROVIDER]);
        }
        Ok(serde_json::from_value(v)?)
    }

    /// Runs one step; answers a note for the log.
    async fn run(&mut self, step: &Step) -> Result<String> {
        match step {
            Step::Intent { fragment, release } => {
                self.submitted = true;
                let before = self.object().await?;
                self.guarded = foreign_leaves(&before);
                let answer = self
                    .applier
                    .client
                    .submit(&self.intent(fragment, *release)?, true)
                    .await?;
                let out = answer.json();
                let action = out["action"].as_str().unwrap_or_default().to_owned();
                if !["applied", "unchanged", "conflict"].contains(&action.as_str()) {
                    bail!("the intent was not applied: {out}");
                }
                self.desired = model_merge(&self.desired, fragment, *release);
                let kept_at_provider = out["kept"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p == AT_PROVIDER);
                self.pinned = kept_at_provider && (self.pinned || *release);
                // No apply of ours removes atProvider unless the intent released it.
                let after = self.object().await?;
                let had = !under(&flatten(&before), AT_PROVIDER).is_empty();
                let has = !under(&flatten(&after), AT_PROVIDER).is_empty();
                if had && !has && !release {
                    bail!(
                        "our apply removed atProvider without release: {}",
                        after["status"]
                    );
                }
                let conflicts: Vec<&str> = out["conflicts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c["path"].as_str())
                    .collect();
                Ok(format!("{action} {conflicts:?}"))
            }
            Step::ForeignApply {
                manager,
                force,
                status,
            } => {
                let mut body = json!({"apiVersion": API_VERSION, "kind": "CAPTControlPlane",
                                      "metadata": {"name": "demo"}});
                if status.as_object().is_some_and(|m| !m.is_empty()) {
                    body["status"] = status.clone();
                }
                let mut params = PatchParams::apply(manager);
                params.force = *force;
                let (note, after) = match self
                    .api
                    .patch_status("demo", &params, &Patch::Apply(&body))
                    .await
                {
                    Ok(after) => ("applied", serde_json::to_value(after)?),
                    Err(kube::Error::Api(e)) if e.code == 409 && !force => {
                        ("refused (409)", self.object().await?)
                    }
                    Err(kube::Error::Api(e)) if e.code == 422 => {
                        ("refused (422)", self.object().await?)
                    }
                    Err(e) => return Err(e).context("the foreign apply failed"),
                };
                self.guarded = foreign_leaves(&after);
                Ok(note.into())
            }
            Step::ForeignUpdate { manager, status } => {
                if status.as_object().is_none_or(Map::is_empty) {
                    self.guarded = foreign_leaves(&self.object().await?);
                    return Ok("nothing to patch".into());
                }
                let params = PatchParams {
                    field_manager: Some((*manager).to_owned()),
                    ..PatchParams::default()
                };
                let after = self
                    .api
                    .patch_status("demo", &params, &Patch::Merge(json!({ "status": status })))
                    .await
                    .context("the foreign merge patch failed")?;
                self.guarded = foreign_leaves(&serde_json::to_value(after)?);
                Ok("patched".into())
            }
        }
    }

    /// What the model predicts of the settled object; answers which case it checked.
    /// `document`: the applier's desired document for the object (`GET /v1/intents`);
    /// `guarded`: the leaves foreign managers owned before our step, with their values.
    fn check(&self, object: &Value, document: &Value, guarded: &Flat) -> Result<&'static str> {
        let live = flatten(object);
        let foreign: Vec<String> = owned_fields(object)
            .into_iter()
            .filter(|(manager, _, p)| manager != OURS && live.contains_key(p))
            .map(|(_, _, p)| p)
            .collect();
        // Guarantee 3's class: an apply of ours never takes a field a foreign manager owns.
        for (p, v) in guarded {
            if live.get(p) != Some(v) {
                bail!(
                    "{p} was {v}, owned by a foreign manager, and our step made it {:?}",
                    live.get(p)
                );
            }
        }
        let kept = |p: &str| self.pinned && is_under(p, AT_PROVIDER);
        // What we released is gone, unless another manager owns it (or the applier said it
        // kept atProvider, which the server refuses to drop).
        for p in under(&live, "status").keys() {
            if !self.desired.contains_key(p) && !foreign.contains(p) && !kept(p) {
                bail!(
                    "{p} is on the object, but neither our document nor a foreign manager holds it"
                );
            }
        }
        // Our managedFields entry is the fields of our document: no more (a field we gave
        // up stays ours) and no less (unless a foreign owner's other value left it out).
        let document = flatten(document);
        let ours: Vec<String> = owned_fields(object)
            .into_iter()
            .filter(|(manager, _, p)| manager == OURS && live.contains_key(p))
            .map(|(_, _, p)| p)
            .collect();
        for p in &ours {
            if !document.contains_key(p) && !kept(p) {
                bail!("our manager owns {p}, which our document does not hold");
            }
        }
        for (p, v) in &document {
            let left_out = foreign.contains(p) && live.get(p) != Some(v);
            if !ours.contains(p) && !left_out {
                bail!("our document holds {p} = {v}, but our manager does not own it");
            }
        }
        let wanted = under(&self.desired, AT_PROVIDER);
        let there = under(&live, AT_PROVIDER);
        if !wanted.is_empty() && there.is_empty() {
            bail!("atProvider is missing, but our document holds it (it was not released)");
        }
        if self.pinned {
            // Released, but kept: the server refuses `null` there. Nothing of it may be lost.
            if there.is_empty() {
                bail!("atProvider is missing, but the applier answered that it kept it");
            }
        } else if !foreign.iter().any(|p| is_under(p, AT_PROVIDER)) && there != wanted {
            bail!(
                "only our manager owns fields of atProvider, but it is {there:?}, our document {wanted:?}"
            );
        }
        for (p, v) in &self.desired {
            if !foreign.contains(p) && live.get(p) != Some(v) {
                bail!(
                    "{p} should be {v} (ours, no foreign owner), but is {:?}",
                    live.get(p)
                );
            }
        }
        Ok(
            match (
                wanted.is_empty(),
                foreign.iter().any(|p| is_under(p, AT_PROVIDER)),
            ) {
                (true, _) => "checks: atProvider not in our document",
                (false, false) => "checks: atProvider ours alone, equal to our document",
                (false, true) => "checks: atProvider shared with a foreign owner, present",
            },
        )
    }

    fn context(&self, object: Option<&Value>) -> String {
        let mut s = format!(
            "\ndesired status (model): {:?}\nsteps so far:\n{}",
            self.desired, self.log
        );
        if let Some(object) = object {
            let entries: Vec<Value> = object["metadata"]["managedFields"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    json!([
                        e["manager"],
                        e["operation"],
                        e["subresource"],
                        e["fieldsV1"]
                    ])
                })
                .collect();
            let _ = write!(
                s,
                "object status: {}\nmanagedFields: {}",
                object["status"],
                Value::Array(entries)
            );
        }
        s
    }
}

#[tokio::test]
async fn a_seeded_replay_of_intents_and_foreign_writes_keeps_at_provider() -> Result<()> {
    replay(seed(), writes(), &applier_args()).await
}

// Every seed that ever failed, replayed as it was found (the applier's arguments of the
// run that found it).
#[tokio::test]
async fn replay_seed_1795665213192511349_our_output_under_a_released_foreign_map() -> Result<()> {
    replay(1795665213192511349, Writes::Limited, &applier_args()).await
}

#[tokio::test]
async fn replay_seed_1795665138606139319() -> Result<()> {
    replay(1795665138606139319, Writes::Limited, &applier_args()).await
}

#[tokio::test]
async fn replay_seed_1795665204128017631() -> Result<()> {
    replay(1795665204128017631, Writes::Limited, &applier_args()).await
}

#[tokio::test]
async fn replay_seed_1795665243398715498() -> Result<()> {
    replay(1795665243398715498, Writes::Limited, &applier_args()).await
}

#[tokio::test]
async fn replay_seed_1795660497016337610_on_the_trailing_edge() -> Result<()> {
    // The other coalescing mode than the default's: every apply waits a quiet window.
    replay(
        1795660497016337610,
        Writes::Limited,
        &[
            "--no-events".into(),
            "--apply-lone-intents-at-once=false".into(),
        ],
    )
    .await
}

#[tokio::test]
async fn replay_seed_1795660137386833806_release_of_at_provider_while_a_foreign_manager_owns_below()
-> Result<()> {
    // Found while the applier applied lone intents at once by default (c488069).
    replay(
        1795660137386833806,
        Writes::LimitedWithReleases,
        &["--no-events".into(), "--apply-lone-intents-at-once".into()],
    )
    .await
}

#[tokio::test]
async fn replay_seed_12162625669955059931_release_of_a_map_another_manager_owns_itself()
-> Result<()> {
    replay(12162625669955059931, Writes::All, &applier_args()).await
}

// Both found by `hack/soak.sh 500` at 7aa9137: an intent that changed nothing was answered
// without the paths the applier still kept in `atProvider` (pinned where the server refuses
// `null`), so its submitter was told they were no longer kept.
#[tokio::test]
async fn replay_seed_9519586741356011167_an_unchanged_intent_is_told_what_stays_kept() -> Result<()>
{
    replay(9519586741356011167, Writes::All, &applier_args()).await
}

#[tokio::test]
async fn replay_seed_14357673646813367957_an_unchanged_intent_is_told_what_stays_kept() -> Result<()>
{
    replay(14357673646813367957, Writes::All, &applier_args()).await
}

/// Replays `seed` with the `writes` generator against an applier started with `args`.
async fn replay(seed: u64, writes: Writes, args: &[String]) -> Result<()> {
    eprintln!(
        "replay seed: {seed} (rerun with REPLAY_SEED={seed} REPLAY_WRITES={}), applier {args:?}",
        writes.name()
    );
    let started = Instant::now();
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "replay").await?;
    let resource = ApiResource::erase::<CAPTControlPlane>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client, &ns.name, &resource);
    let created: DynamicObject = serde_json::from_value(json!({
        "apiVersion": API_VERSION, "kind": "CAPTControlPlane", "metadata": {"name": "demo"},
        "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "eks"}},
    }))?;
    api.create(&PostParams::default(), &created).await?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let applier = Applier::start(&args).await?;
    let mut replay = Replay {
        seed,
        ns: ns.name.clone(),
        api,
        applier,
        desired: Flat::new(),
        pinned: false,
        submitted: false,
        guarded: Flat::new(),
        started,
        log: String::new(),
    };

    let mut rng = Rng(seed);
    let total = 40 + rng.below(21);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for i in 0..total {
        let live = replay.object().await?;
        let mut step = if rng.chance(50) {
            intent_step(&mut rng, writes)
        } else {
            foreign_step(&mut rng, &live, writes)
        };
        if writes == Writes::Limited
            && matches!(step, Step::Intent { release: true, .. })
            && foreign_owns_under_at_provider(&live)
        {
            step = foreign_step(&mut rng, &live, writes);
        }
        let at = |what: &str, replay: &Replay, object: Option<&Value>| {
            format!(
                "replay seed {} (rerun with REPLAY_SEED={}), step {i} of {total}: {step}\n{what}{}",
                replay.seed,
                replay.seed,
                replay.context(object)
            )
        };
        let note = match replay.run(&step).await {
            Ok(note) => note,
            Err(e) => panic!("{}", at(&format!("{e:#}"), &replay, Some(&live))),
        };
        let _ = writeln!(replay.log, "  {i}: {step} -> {note}");
        *counts
            .entry(match &step {
                Step::Intent { .. } if note.starts_with("conflict") => "intents with a conflict",
                Step::Intent { .. } => "intents",
                Step::ForeignApply { .. } if note.starts_with("refused") => {
                    "foreign applies refused"
                }
                Step::ForeignApply { force: true, .. } => "forced foreign applies",
                Step::ForeignApply { .. } => "foreign applies",
                Step::ForeignUpdate { .. } => "foreign updates",
            })
            .or_default() += 1;
        let object = match replay.settled().await {
            Ok(object) => object,
            Err(e) => panic!("{}", at(&format!("{e:#}"), &replay, None)),
        };
        let document = match replay.document().await {
            Ok(document) => document,
            Err(e) => panic!("{}", at(&format!("{e:#}"), &replay, Some(&object))),
        };
        match replay.check(&object, &document, &replay.guarded) {
            Ok(case) => *counts.entry(case).or_default() += 1,
            Err(e) => panic!("{}", at(&format!("{e:#}"), &replay, Some(&object))),
        }
        if replay.started.elapsed() > BUDGET {
            panic!(
                "{}",
                at(
                    &format!("the replay ran over its budget of {BUDGET:?}"),
                    &replay,
                    None
                )
            );
        }
    }
    eprintln!(
        "replay seed {seed}: {total} steps in {:.1} s, {counts:?}",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The minimal failing cases of `status-applier/tests/foreign_model.rs`, against the real
// API server and a real applier. They assert the behaviour docs/status-applier.md describes.

struct Fixture {
    _ns: TestNamespace,
    ns: String,
    api: Api<DynamicObject>,
    applier: Applier,
    /// An intent was submitted through [`Fixture::submit`].
    submitted: std::cell::Cell<bool>,
}

async fn fixture(prefix: &str) -> Result<Fixture> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, prefix).await?;
    let resource = ApiResource::erase::<CAPTControlPlane>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client, &ns.name, &resource);
    let created: DynamicObject = serde_json::from_value(json!({
        "apiVersion": API_VERSION, "kind": "CAPTControlPlane", "metadata": {"name": "demo"},
        "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "eks"}},
    }))?;
    api.create(&PostParams::default(), &created).await?;
    Ok(Fixture {
        ns: ns.name.clone(),
        _ns: ns,
        api,
        applier: Applier::start(&["--no-events"]).await?,
        submitted: std::cell::Cell::new(false),
    })
}

impl Fixture {
    async fn submit(&self, subresource: Option<&str>, fragment: Value) -> Result<Value> {
        let mut v = json!({
            "target": {"apiVersion": API_VERSION, "kind": "CAPTControlPlane", "namespace": self.ns, "name": "demo"},
            "fieldManager": OURS,
            "fragment": fragment,
        });
        if let Some(s) = subresource {
            v["subresource"] = json!(s);
        }
        let intent: Intent = serde_json::from_value(v)?;
        self.submitted.set(true);
        Ok(self.applier.client.submit(&intent, true).await?.json())
    }

    async fn foreign_update(&self, manager: &str, status: Value) -> Result<()> {
        let params = PatchParams {
            field_manager: Some(manager.into()),
            ..PatchParams::default()
        };
        self.api
            .patch_status("demo", &params, &Patch::Merge(json!({ "status": status })))
            .await?;
        self.acted_on().await?;
        Ok(())
    }

    async fn object(&self) -> Result<Value> {
        Ok(serde_json::to_value(self.api.get("demo").await?)?)
    }

    /// The object once the applier has acted on a foreign write ([`acted_on`]), so that the
    /// next intent is planned on it.
    async fn acted_on(&self) -> Result<Value> {
        self.applier
            .acted_on(
                &self.api,
                "demo",
                OURS,
                self.submitted.get(),
                Duration::from_secs(10),
            )
            .await
    }
}

#[tokio::test]
async fn real_a_foreign_owner_of_the_at_provider_map_alone_does_not_block_ours() -> Result<()> {
    let f = fixture("replay-map").await?;
    f.foreign_update(
        "foreign-u",
        json!({"workspaceStatus": {"atProvider": {"checksum": "theirs"}}}),
    )
    .await?;
    f.foreign_update(
        "foreign-u",
        json!({"workspaceStatus": {"atProvider": {"checksum": null}}}),
    )
    .await?;
    let out = f
        .submit(
            Some("status"),
            json!({"status": {"workspaceStatus": {"atProvider": {"checksum": "ours"}}}}),
        )
        .await?;
    let object = f.object().await?;
    assert_eq!(
        object["status"]["workspaceStatus"]["atProvider"],
        json!({"checksum": "ours"}),
        "the API server takes this apply without a 409; the applier answered {out}\nmanagedFields: {}",
        object["metadata"]["managedFields"]
    );
    Ok(())
}

#[tokio::test]
/// Here the CRD requires `controlPlaneEndpoint.host`: the apply that leaves the host out is
/// refused (422) instead of removing it, and our manager's endpoint never moves again.
async fn real_a_foreign_apply_of_an_empty_spec_does_not_make_our_endpoint_vanish() -> Result<()> {
    let f = fixture("replay-spec").await?;
    f.submit(
        None,
        json!({"spec": {"controlPlaneEndpoint": {"host": "a.example.com", "port": 443}}}),
    )
    .await?;
    let body = json!({"apiVersion": API_VERSION, "kind": "CAPTControlPlane", "metadata": {"name": "demo"}, "spec": {}});
    f.api
        .patch(
            "demo",
            &PatchParams::apply("foreign-a"),
            &Patch::Apply(&body),
        )
        .await?;
    f.acted_on().await?;
    let out = f
        .submit(
            None,
            json!({"spec": {"controlPlaneEndpoint": {"host": "b.example.com"}}}),
        )
        .await?;
    let object = f.object().await?;
    assert_eq!(
        object["spec"]["controlPlaneEndpoint"],
        json!({"host": "b.example.com", "port": 443}),
        "the applier answered {out}\nmanagedFields: {}",
        object["metadata"]["managedFields"]
    );
    Ok(())
}

#[tokio::test]
async fn real_a_conflict_left_out_of_the_apply_costs_no_write_per_recheck() -> Result<()> {
    let f = fixture("replay-empty").await?;
    let body = json!({"apiVersion": API_VERSION, "kind": "CAPTControlPlane", "metadata": {"name": "demo"},
                      "status": {"phase": "Creating"}});
    f.api
        .patch_status(
            "demo",
            &PatchParams::apply("foreign-a"),
            &Patch::Apply(&body),
        )
        .await?;
    f.acted_on().await?;
    f.submit(Some("status"), json!({"status": {"phase": "Creating"}}))
        .await?;
    let out = f
        .submit(Some("status"), json!({"status": {"phase": "Ready"}}))
        .await?;
    assert_eq!(out["action"], "conflict", "{out}");
    f.acted_on().await?;
    let ours = |object: &Value| {
        object["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["manager"] == OURS)
            .map(|e| e["fieldsV1"].clone())
    };
    let writes = f
        .applier
        .metric("status_applier_api_writes_total", &[])
        .await?;
    // Changes of the object that concern nobody re-check our document: no write each.
    for i in 0..3 {
        env().kubectl_ok(
            &[
                "label",
                "captcontrolplane",
                "demo",
                "-n",
                &f.ns,
                "--overwrite",
                &format!("touch={i}"),
            ],
            None,
        )?;
        f.acted_on().await?;
    }
    let object = f.object().await?;
    let after = f
        .applier
        .metric("status_applier_api_writes_total", &[])
        .await?;
    assert_eq!(
        (after - writes, ours(&object)),
        (0.0, None),
        "writes on re-checks, and our managedFields entry (owning `status` itself is the bug)"
    );
    Ok(())
}

#[tokio::test]
async fn real_a_replaced_at_provider_with_nothing_in_it_is_kept() -> Result<()> {
    let f = fixture("replay-deep").await?;
    f.submit(
        Some("status"),
        json!({"status": {"workspaceStatus": {"atProvider": {"checksum": "c1"}}}}),
    )
    .await?;
    let out = f
        .submit(
            Some("status"),
            json!({"status": {"workspaceStatus": {"atProvider": {"outputs": {}}}}}),
        )
        .await?;
    let object = f.object().await?;
    assert_eq!(
        object["status"]["workspaceStatus"]["atProvider"],
        json!({"checksum": "c1"}),
        "the applier answered {out}"
    );
    Ok(())
}

#[tokio::test]
async fn real_releasing_at_provider_while_a_foreign_update_owns_a_key_below_keeps_theirs()
-> Result<()> {
    let f = fixture("replay-release").await?;
    f.submit(
        Some("status"),
        json!({"status": {"workspaceStatus": {"ready": true,
            "atProvider": {"checksum": "c1", "outputs": {"a": "o1"}}}}}),
    )
    .await?;
    f.foreign_update(
        "foreign-u",
        json!({"workspaceStatus": {"atProvider": {"outputs": {"f": "theirs"}}}}),
    )
    .await?;
    // Dropping `atProvider` whole, the API server would remove the `outputs` map we created
    // with their key in it and leave `atProvider: null`, which the CRD refuses (422).
    let v = json!({
        "target": {"apiVersion": API_VERSION, "kind": "CAPTControlPlane", "namespace": f.ns, "name": "demo"},
        "subresource": "status", "fieldManager": OURS,
        "fragment": {"status": {"workspaceStatus": {"atProvider": null}}},
        "release": [AT_PROVIDER],
    });
    let out = f
        .applier
        .client
        .submit(&serde_json::from_value(v)?, true)
        .await?
        .json();
    assert_eq!(out["action"], "applied", "{out}");
    let object = f.object().await?;
    assert_eq!(
        object["status"]["workspaceStatus"],
        json!({"ready": true, "atProvider": {"outputs": {"f": "theirs"}}}),
        "ours released, theirs kept\nmanagedFields: {}",
        object["metadata"]["managedFields"]
    );
    // Kept as an empty map, the container costs no write on re-checks.
    let writes = f
        .applier
        .metric("status_applier_api_writes_total", &[])
        .await?;
    env().kubectl_ok(
        &["label", "captcontrolplane", "demo", "-n", &f.ns, "touch=1"],
        None,
    )?;
    f.acted_on().await?;
    assert_eq!(
        f.applier
            .metric("status_applier_api_writes_total", &[])
            .await?,
        writes,
        "no write per re-check"
    );
    Ok(())
}
