//! The status-applier as a separate process against the real API server: merging, protected
//! paths, replaced subtrees, restart, no-op suppression, coalescing, conflicts, the kubectl
//! reproduction and bad input.

use anyhow::Result;
use capt_controller::api::CAPTControlPlane;
use capt_tests::applier::Applier;
use capt_tests::{TestNamespace, env};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use status_applier::intent::Intent;
use std::time::{Duration, Instant};

const MANAGER: &str = "capt-captcontrolplane";

struct Fixture {
    ns: TestNamespace,
    api: Api<CAPTControlPlane>,
}

async fn fixture(prefix: &str) -> Result<Fixture> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, prefix).await?;
    let api: Api<CAPTControlPlane> = Api::namespaced(client, &ns.name);
    api.create(&PostParams::default(), &control_plane()?)
        .await?;
    Ok(Fixture { ns, api })
}

fn control_plane() -> Result<CAPTControlPlane> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "demo"},
        "spec": {"version": "1.31", "workspaceTemplateRef": {"name": "eks"}},
    }))?)
}

impl Fixture {
    fn intent(&self, subresource: Option<&str>, fragment: Value) -> Intent {
        let mut v = json!({
            "target": {"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
                       "namespace": self.ns.name, "name": "demo"},
            "fieldManager": MANAGER,
            "fragment": fragment,
        });
        if let Some(s) = subresource {
            v["subresource"] = json!(s);
        }
        serde_json::from_value(v).expect("a valid intent document")
    }

    fn status(&self, status: Value) -> Intent {
        self.intent(Some("status"), json!({"status": status}))
    }

    /// A write of the test's own to the control plane (a label); answers what it left.
    async fn poke(&self, n: u32) -> Result<CAPTControlPlane> {
        let patch = json!({"metadata": {"labels": {"poked": n.to_string()}}});
        let params = PatchParams::default();
        Ok(self
            .api
            .patch("demo", &params, &Patch::Merge(patch))
            .await?)
    }

    async fn object(&self) -> Result<Value> {
        Ok(serde_json::to_value(self.api.get("demo").await?)?)
    }
}

/// Submits and waits for the apply; answers the outcome.
async fn submit(applier: &Applier, intent: &Intent) -> Result<Value> {
    let answer = applier.client.submit(intent, true).await?;
    Ok(answer.json())
}

#[tokio::test]
async fn later_fragments_that_omit_at_provider_keep_it_and_null_removes_other_fields() -> Result<()>
{
    let f = fixture("sa-merge").await?;
    let applier = Applier::start(&[]).await?;
    let at_provider =
        json!({"checksum": "c1", "outputs": {"cluster_endpoint": "https://eks.example.com"}});
    let out = submit(
        &applier,
        &f.status(
            json!({"phase": "Creating", "failureMessage": "still waiting",
        "workspaceStatus": {"ready": false, "atProvider": at_provider}}),
        ),
    )
    .await?;
    assert_eq!(out["action"], "applied", "{out}");

    let out = submit(
        &applier,
        &f.status(
            json!({"phase": "Ready", "failureMessage": null, "workspaceStatus": {"ready": true}}),
        ),
    )
    .await?;
    assert_eq!(out["action"], "applied", "{out}");
    let status = &f.object().await?["status"];
    assert_eq!(status["phase"], "Ready");
    assert_eq!(
        status["workspaceStatus"]["atProvider"], at_provider,
        "atProvider survived: {status}"
    );
    assert_eq!(status["workspaceStatus"]["ready"], true);
    assert!(
        status.get("failureMessage").is_none(),
        "null removed failureMessage: {status}"
    );
    Ok(())
}

#[tokio::test]
async fn a_protected_path_is_kept_unless_the_intent_releases_it() -> Result<()> {
    let f = fixture("sa-protect").await?;
    let applier = Applier::start(&[]).await?;
    let endpoint = json!({"host": "eks.example.com", "port": 443});
    let out = submit(
        &applier,
        &f.intent(None, json!({"spec": {"controlPlaneEndpoint": endpoint}})),
    )
    .await?;
    assert_eq!(out["action"], "applied", "{out}");

    let out = submit(
        &applier,
        &f.intent(None, json!({"spec": {"controlPlaneEndpoint": null}})),
    )
    .await?;
    assert_eq!(out["kept"], json!(["spec.controlPlaneEndpoint"]), "{out}");
    assert_eq!(f.object().await?["spec"]["controlPlaneEndpoint"], endpoint);

    let mut release = f.intent(None, json!({"spec": {"controlPlaneEndpoint": null}}));
    release.release = vec!["spec.controlPlaneEndpoint".into()];
    let out = submit(&applier, &release).await?;
    assert_eq!(out["action"], "applied", "{out}");
    assert!(
        f.object().await?["spec"]
            .get("controlPlaneEndpoint")
            .is_none()
    );
    Ok(())
}

#[tokio::test]
async fn a_key_removed_from_the_replaced_at_provider_disappears_from_the_object() -> Result<()> {
    let f = fixture("sa-replace").await?;
    let applier = Applier::start(&[]).await?;
    let ws = |at: Value| f.status(json!({"workspaceStatus": {"atProvider": at}}));
    submit(&applier, &ws(json!({"checksum": "c1", "outputs": {"vpc_id": "vpc-1", "cluster_endpoint": "https://a"}}))).await?;
    submit(
        &applier,
        &ws(json!({"checksum": "c2", "outputs": {"vpc_id": "vpc-1"}})),
    )
    .await?;
    let at = &f.object().await?["status"]["workspaceStatus"]["atProvider"];
    assert_eq!(
        at,
        &json!({"checksum": "c2", "outputs": {"vpc_id": "vpc-1"}})
    );
    Ok(())
}

#[tokio::test]
async fn after_a_restart_a_partial_intent_drops_nothing() -> Result<()> {
    let f = fixture("sa-restart").await?;
    let mut first = Applier::start(&[]).await?;
    let condition = json!({"type": "Ready", "status": "False", "reason": "Creating", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"});
    let full = json!({"phase": "Creating", "ready": false, "conditions": [condition],
        "workspaceStatus": {"atProvider": {"checksum": "c1", "outputs": {"cluster_endpoint": "https://a"}}}});
    submit(&first, &f.status(full.clone())).await?;
    first.kill();

    let second = Applier::start(&["--allow-manager", MANAGER]).await?;
    let out = submit(&second, &f.status(json!({"phase": "Ready"}))).await?;
    assert_eq!(out["action"], "applied", "{out}");
    let status = &f.object().await?["status"];
    let mut expected = full;
    expected["phase"] = json!("Ready");
    assert_eq!(status, &expected, "nothing but the phase changed");
    Ok(())
}

#[tokio::test]
async fn a_no_op_intent_makes_no_write() -> Result<()> {
    let f = fixture("sa-noop").await?;
    let applier = Applier::start(&[]).await?;
    let intent = f.status(
        json!({"phase": "Creating", "workspaceStatus": {"atProvider": {"checksum": "c1"}}}),
    );
    submit(&applier, &intent).await?;
    let before = f.object().await?["metadata"]["resourceVersion"].clone();
    let writes = applier
        .metric("status_applier_api_writes_total", &[])
        .await?;

    let out = submit(&applier, &intent).await?;
    assert_eq!(out["action"], "unchanged", "{out}");
    let out = submit(&applier, &f.status(json!({"phase": "Creating"}))).await?;
    assert_eq!(
        out["action"], "unchanged",
        "a fragment repeating part of the document: {out}"
    );
    assert_eq!(f.object().await?["metadata"]["resourceVersion"], before);
    assert_eq!(
        applier
            .metric("status_applier_api_writes_total", &[])
            .await?,
        writes
    );
    Ok(())
}

/// An intent whose submitter wrote the object itself (`notOlderThan`: the version its own
/// write left) is never planned on the older view the applier holds, so no apply is refused
/// as stale. The applier here watches none of the object (a label selector it does not
/// match): its view stays at its own last apply, the wait for a newer one runs out, and the
/// object is read. Without `notOlderThan`, the same sequence costs a refused apply (409).
#[tokio::test]
async fn an_intent_after_the_submitters_own_write_is_planned_on_no_older_view() -> Result<()> {
    let f = fixture("sa-after").await?;
    let applier = Applier::start(&[
        "--watch-label-selector",
        "capt-test/never=matched",
        "--view-wait-ms",
        "100",
    ])
    .await?;
    submit(&applier, &f.status(json!({"phase": "Creating"}))).await?;
    let refusals = || applier.metric("status_applier_api_errors_total", &["code=\"409\""]);
    // The submitter's own write, which the applier does not see.
    let written = f.poke(1).await?;
    let mut after = f.status(json!({"phase": "Ready"}));
    after.not_older_than = written.metadata.resource_version.clone();
    let out = submit(&applier, &after).await?;
    assert_eq!(out["action"], "applied", "{out}");
    assert_eq!(refusals().await?, 0.0, "planned on the older view");
    let waits = &["end=\"read\""];
    assert_eq!(
        applier
            .metric("status_applier_view_waits_total", waits)
            .await?,
        1.0
    );
    // The same without notOlderThan: planned on the older view, refused, read, applied.
    f.poke(2).await?;
    let out = submit(&applier, &f.status(json!({"phase": "Failed"}))).await?;
    assert_eq!(out["action"], "applied", "{out}");
    assert_eq!(refusals().await?, 1.0, "the control: one refusal");
    assert_eq!(f.object().await?["status"]["phase"], "Failed");
    Ok(())
}

/// How long a lone intent takes to be applied (answered with `wait`), under `args`.
async fn lone_intent_latency(prefix: &str, args: &[&str]) -> Result<Duration> {
    let f = fixture(prefix).await?;
    let applier = Applier::start(args).await?;
    let started = Instant::now();
    let answer = applier
        .client
        .submit(&f.status(json!({"phase": "Creating"})), true)
        .await?;
    let took = started.elapsed();
    assert!(answer.status.is_success(), "{}", answer.body);
    assert_eq!(f.object().await?["status"]["phase"], "Creating");
    Ok(took)
}

#[tokio::test]
async fn a_lone_intent_is_applied_at_once_by_default_and_waits_a_window_on_trailing_edge()
-> Result<()> {
    // A 2 s window: applied at once means well under it; delayed means at least it.
    let window = ["--coalesce-window-ms", "2000"];
    let at_once = lone_intent_latency("sa-lone", &window).await?;
    let delayed = lone_intent_latency(
        "sa-lone-trailing",
        &[&window[..], &["--apply-lone-intents-at-once=false"]].concat(),
    )
    .await?;
    println!(
        "lone intent: {at_once:?} by default, {delayed:?} with --apply-lone-intents-at-once=false"
    );
    assert!(at_once < Duration::from_millis(1000), "{at_once:?}");
    assert!(delayed >= Duration::from_millis(2000), "{delayed:?}");
    Ok(())
}

#[tokio::test]
async fn a_burst_of_100_intents_for_one_object_makes_at_most_2_applies() -> Result<()> {
    let f = fixture("sa-burst").await?;
    // The default settings (leading edge: the first intent is applied at once, the rest
    // coalesce into one more apply); outputs merge key by key here (by default they are
    // replaced whole).
    let applier = Applier::start(&[
        "--replace",
        "CAPTControlPlane.controlplane.cluster.x-k8s.io:status.workspaceStatus.atProvider",
    ])
    .await?;
    // 100 intents at once, each adding one output: all must land, in at most two applies.
    let intents: Vec<Intent> = (0..100)
        .map(|i| {
            f.status(
                json!({"workspaceTemplateStatus": {"outputs": {format!("k{i}"): format!("{i}")}}}),
            )
        })
        .collect();
    let started = Instant::now();
    let answers =
        futures::future::join_all(intents.iter().map(|i| applier.client.submit(i, false))).await;
    let submitted = started.elapsed();
    for answer in answers {
        let answer = answer?;
        assert!(answer.status.is_success(), "{}", answer.body);
    }
    let outputs = |obj: &Value| {
        obj["status"]["workspaceTemplateStatus"]["outputs"]
            .as_object()
            .map_or(0, |o| o.len())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while outputs(&f.object().await?) != 100 {
        assert!(Instant::now() < deadline, "not every intent was applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let writes = applier
        .metric("status_applier_api_writes_total", &[])
        .await?;
    let coalesced = applier
        .metric("status_applier_coalesced_intents_total", &[])
        .await?;
    println!(
        "burst of 100 submitted in {submitted:?}: {writes} writes, {coalesced} intents coalesced"
    );
    let metrics = applier.client.get("/metrics").await?.body;
    let detail: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            ["applies_total", "api_errors_total", "intents_total"]
                .iter()
                .any(|m| l.starts_with(&format!("status_applier_{m}")))
        })
        .collect();
    assert!(
        (1.0..=2.0).contains(&writes),
        "{writes} writes, {coalesced} intents coalesced; {detail:#?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_foreign_owner_of_a_protected_path_is_a_reported_conflict_and_keeps_its_value()
-> Result<()> {
    let f = fixture("sa-foreign").await?;
    let applier = Applier::start(&[]).await?;
    let theirs = json!({"host": "user.example.com", "port": 6443});
    let manifest = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "demo", "namespace": f.ns.name}, "spec": {"controlPlaneEndpoint": theirs}});
    env().kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--field-manager=someone-else",
            "-f",
            "-",
        ],
        Some(&manifest.to_string()),
    )?;
    let before = f.object().await?["metadata"]["resourceVersion"].clone();

    let out = submit(
        &applier,
        &f.intent(
            None,
            json!({"spec": {"controlPlaneEndpoint": {"host": "eks.example.com", "port": 443}}}),
        ),
    )
    .await?;
    assert_eq!(out["action"], "conflict", "{out}");
    let paths: Vec<&str> = out["conflicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            ".spec.controlPlaneEndpoint.host",
            ".spec.controlPlaneEndpoint.port"
        ],
        "{out}"
    );
    assert!(
        out["conflicts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["owner"] == "someone-else"),
        "{out}"
    );

    let obj = f.object().await?;
    assert_eq!(obj["spec"]["controlPlaneEndpoint"], theirs);
    assert_eq!(
        obj["metadata"]["resourceVersion"], before,
        "nothing was written"
    );
    let listed = applier.client.get("/v1/conflicts").await?.json();
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
    assert_eq!(
        applier
            .metric("status_applier_conflicts_total", &["owner=\"foreign\""])
            .await?,
        2.0
    );
    // The Event is published beside the answer, not before it.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let events = env().kubectl_ok(
            &[
                "get",
                "events",
                "-n",
                &f.ns.name,
                "--field-selector",
                "reason=FieldConflict",
                "-o",
                "jsonpath={.items[*].note}{.items[*].message}",
            ],
            None,
        )?;
        if events.contains(".spec.controlPlaneEndpoint.host (owned by someone-else)") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no FieldConflict event: {events}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::test]
async fn the_printed_kubectl_command_reproduces_the_appliers_managed_fields_entry() -> Result<()> {
    let f = fixture("sa-kubectl").await?;
    let applier = Applier::start(&[]).await?;
    let condition = json!({"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"});
    submit(&applier, &f.status(json!({"phase": "Ready", "ready": true, "conditions": [condition],
        "workspaceStatus": {"atProvider": {"checksum": "c1", "outputs": {"cluster_endpoint": "https://a"}}}}))).await?;
    let entry = |obj: &Value| {
        obj["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["manager"] == MANAGER)
            .map(|e| {
                (
                    e["operation"].clone(),
                    e["subresource"].clone(),
                    e["apiVersion"].clone(),
                    e["fieldsV1"].clone(),
                )
            })
    };
    let by_applier = f.object().await?;
    let printed = applier.client.get("/v1/intents?format=yaml").await?.body;
    drop(applier); // it would restore its fields, which the reset below removes
    let command = printed
        .lines()
        .find(|l| l.starts_with("# kubectl "))
        .unwrap()
        .trim_start_matches("# kubectl ")
        .to_owned();
    assert_eq!(
        command,
        format!(
            "apply --server-side --field-manager={MANAGER} --subresource=status -f intent.yaml"
        )
    );

    // Remove the status (another writer, an Update), which also removes the applier's ownership.
    env().kubectl_ok(
        &[
            "patch",
            "captcontrolplane",
            "demo",
            "-n",
            &f.ns.name,
            "--subresource=status",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/status"}]"#,
        ],
        None,
    )?;
    assert!(
        entry(&f.object().await?).is_none(),
        "the applier's entry is gone"
    );

    let mut args: Vec<&str> = command.split_whitespace().collect();
    *args.last_mut().unwrap() = "-";
    env().kubectl_ok(&args, Some(&printed))?;
    let by_kubectl = f.object().await?;
    assert_eq!(entry(&by_kubectl), entry(&by_applier));
    assert_eq!(by_kubectl["status"], by_applier["status"]);
    Ok(())
}

#[tokio::test]
async fn a_uid_precondition_never_writes_a_recreated_object() -> Result<()> {
    let f = fixture("sa-uid").await?;
    let applier = Applier::start(&[]).await?;
    let uid = f.object().await?["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut intent = f.status(json!({"phase": "Creating"}));
    intent.target.uid = Some(uid.clone());
    assert_eq!(submit(&applier, &intent).await?["action"], "applied");

    f.api.delete("demo", &Default::default()).await?;
    let recreated = f
        .api
        .create(&PostParams::default(), &control_plane()?)
        .await?;
    // The state the claim is about: the applier no longer takes the first incarnation for the
    // live object. Submitted before its watch shows the delete, the intent is planned on the
    // old view, refused for its uid and read again, and the late delete then answers it
    // "object not found" (nothing written either, but not the path tested here). Once the
    // watch shows the delete, the applier forgets the document it held (it had nothing left
    // to do); had the watch shown the new incarnation alone (a relist), it re-checks the
    // document and refuses it for the new uid. Either is the sign.
    let new_uid = recreated
        .metadata
        .uid
        .clone()
        .expect("a created object has a uid");
    applier_let_go_of_the_old_object(&applier, &f.ns.name, &new_uid).await?;
    let mut intent = f.status(json!({"phase": "Ready"}));
    intent.target.uid = Some(uid);
    let out = submit(&applier, &intent).await?;
    assert_eq!(out["action"], "rejected", "{out}");
    assert!(
        out["message"]
            .as_str()
            .unwrap()
            .contains("uid precondition failed"),
        "{out}"
    );
    assert!(
        f.object().await?.get("status").is_none(),
        "the new object was not written"
    );
    Ok(())
}

/// Waits until the applier holds no document for `demo` in `namespace` (its watch showed the
/// deletion), or one last refused for the object of uid `uid` (its watch showed that
/// incarnation).
async fn applier_let_go_of_the_old_object(
    applier: &Applier,
    namespace: &str,
    uid: &str,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let documents = applier.client.get("/v1/intents").await?.json();
        let mut held = documents
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["object"]["namespace"] == namespace && d["object"]["name"] == "demo");
        let let_go = held.all(|d| {
            d["last"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(uid))
        });
        if let_go {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the applier still takes the first incarnation of {namespace}/demo for the live \
             object after 30 s (the new one has uid {uid}): {documents}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn each_bad_input_class_gets_its_4xx_and_changes_nothing() -> Result<()> {
    let f = fixture("sa-bad").await?;
    let applier = Applier::start(&[
        "--allow-manager",
        &format!("{MANAGER},someone"),
        "--allow-kind",
        "CAPTControlPlane.controlplane.cluster.x-k8s.io",
    ])
    .await?;
    let before = f.object().await?["metadata"]["resourceVersion"].clone();
    let good = serde_json::to_value(f.status(json!({"phase": "Ready"})))?;
    let with = |mutate: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        mutate(&mut v);
        v.to_string().into_bytes()
    };
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "invalid JSON",
            b"{\"target\": ".to_vec(),
            400,
            "invalid intent document",
        ),
        (
            "invalid YAML",
            b"target: [unclosed".to_vec(),
            400,
            "invalid intent document",
        ),
        (
            "unknown field",
            with(&|v| v["extra"] = json!(1)),
            400,
            "unknown field `extra`",
        ),
        (
            "fragment sets metadata",
            with(&|v| v["fragment"] = json!({"metadata": {"labels": {"a": "b"}}})),
            400,
            "must not set `metadata`",
        ),
        (
            "fragment sets managedFields",
            with(&|v| v["fragment"]["status"]["managedFields"] = json!([])),
            400,
            "managedFields",
        ),
        (
            "manager not allowed",
            with(&|v| v["fieldManager"] = json!("intruder")),
            403,
            "`intruder` is not allowed",
        ),
        (
            "kind not allowed",
            with(&|v| {
                v["target"]["kind"] = json!("Cluster");
                v["target"]["apiVersion"] = json!("cluster.x-k8s.io/v1beta2");
            }),
            403,
            "kind `Cluster.cluster.x-k8s.io` is not allowed",
        ),
        (
            "empty manager",
            with(&|v| v["fieldManager"] = json!("")),
            400,
            "invalid fieldManager ``",
        ),
        (
            "invalid manager",
            with(&|v| v["fieldManager"] = json!("bad manager!")),
            400,
            "invalid fieldManager `bad manager!`",
        ),
        (
            "target without name",
            with(&|v| {
                v["target"].as_object_mut().unwrap().remove("name");
            }),
            400,
            "missing field `name`",
        ),
        (
            "target without kind",
            with(&|v| {
                v["target"].as_object_mut().unwrap().remove("kind");
            }),
            400,
            "missing field `kind`",
        ),
        (
            "body over 1 MiB",
            with(&|v| v["fragment"]["status"]["phase"] = json!("x".repeat(1 << 20))),
            413,
            "larger than the limit",
        ),
    ];
    for (class, body, code, message) in cases {
        let answer = applier.client.submit_raw(body, true).await?;
        assert_eq!(answer.status.as_u16(), code, "{class}: {}", answer.body);
        let error = answer.json()["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            error.contains(message),
            "{class}: expected `{message}` in `{error}`"
        );
    }
    assert_eq!(
        f.object().await?["metadata"]["resourceVersion"],
        before,
        "no bad input changed the object"
    );
    assert_eq!(
        applier
            .metric("status_applier_api_writes_total", &[])
            .await?,
        0.0
    );
    assert_eq!(
        applier.client.get("/v1/intents").await?.json(),
        json!([]),
        "no document was created"
    );
    Ok(())
}
