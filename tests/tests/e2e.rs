//! End to end: the status-applier, the controller and the fake Terraform provider as separate
//! processes against the real API server, driving the sample Cluster of `manifests/samples/`.
//! The tests take turns (a mutex): each runs its own three processes.

use anyhow::Result;
use capt_controller::api::{
    CAPTCluster, CAPTControlPlane, Cluster, TerraformWorkspace, WorkspaceTemplateApply,
};
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use futures::StreamExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PropagationPolicy};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

const ENDPOINT_HOST: &str = "demo.gr7.ap-northeast-1.eks.amazonaws.com";

async fn provisioned(prefix: &str, retain_vpc: bool) -> Result<(TestNamespace, System)> {
    provisioned_with(prefix, retain_vpc, 200).await
}

async fn provisioned_with(
    prefix: &str,
    retain_vpc: bool,
    provider_delay_ms: u64,
) -> Result<(TestNamespace, System)> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, prefix).await?;
    let system = System::start_with(
        &ns.name,
        provider_delay_ms,
        &["--stuck-deletion-seconds", "3"],
    )
    .await?;
    system.apply_samples(retain_vpc).await?;
    system.wait_provisioned().await?;
    Ok((ns, system))
}

/// How a Cluster is deleted here: in the background, as users delete, when Cluster API core
/// runs (its finalizer deletes the children in order); without core, in the foreground, so
/// that the Cluster still waits for its children.
fn user_deletion() -> DeleteParams {
    let propagation = match env().core {
        true => PropagationPolicy::Background,
        false => PropagationPolicy::Foreground,
    };
    DeleteParams {
        propagation_policy: Some(propagation),
        ..Default::default()
    }
}

/// The message of the `Failed` condition while it is True: how a control plane tells a
/// failure (`failureMessage` is for terminal failures, in the Cluster API contract).
fn failed_message(cp: &Value) -> Option<&str> {
    cp["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Failed" && c["status"] == "True")?["message"]
        .as_str()
}

fn workspace_name(ns: &str, apply: &str) -> String {
    format!("{ns}-{apply}")
}

/// Merge-patches annotations on a Workspace, as a test driving the fake provider.
async fn annotate_workspace(name: &str, annotations: Value) -> Result<()> {
    let api: Api<TerraformWorkspace> = Api::all(env().client().await?);
    let patch = json!({"metadata": {"annotations": annotations}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_cluster_goes_from_nothing_to_provisioned_with_its_endpoint_set() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let (ns, system) = provisioned("e2e-up", false).await?;
    println!("Provisioned in {:.1} s", started.elapsed().as_secs_f64());

    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    assert_eq!(
        cp["spec"]["controlPlaneEndpoint"],
        json!({"host": ENDPOINT_HOST, "port": 443})
    );
    assert_eq!(cp["status"]["phase"], "Ready");
    assert_eq!(cp["status"]["ready"], true);
    assert_eq!(cp["status"]["initialized"], true);
    assert_eq!(
        cp["status"]["workspaceStatus"]["atProvider"]["outputs"]["cluster_endpoint"],
        format!("https://{ENDPOINT_HOST}")
    );
    let cluster = system.get(&["cluster", "demo"])?.unwrap();
    assert_eq!(
        cluster["spec"]["controlPlaneEndpoint"],
        json!({"host": ENDPOINT_HOST, "port": 443})
    );
    assert_eq!(cluster["status"]["infrastructureReady"], true);
    assert_eq!(cluster["status"]["controlPlaneReady"], true);
    let cc = system.get(&["captcluster", "demo"])?.unwrap();
    assert_eq!(cc["status"]["vpcId"], "vpc-demo");
    assert_eq!(cc["status"]["ready"], true);

    // Every status and endpoint field has the owner of the ownership plan.
    let owner = |obj: &Value, path: &[&str], sub: &str| -> Vec<String> {
        obj["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["subresource"].as_str().unwrap_or("") == sub)
            .filter(|e| {
                path.iter()
                    .try_fold(&e["fieldsV1"], |v, p| v.get(format!("f:{p}")))
                    .is_some()
            })
            .map(|e| e["manager"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        owner(&cp, &["status", "workspaceStatus", "atProvider"], "status"),
        ["capt-captcontrolplane"]
    );
    assert_eq!(
        owner(&cp, &["spec", "controlPlaneEndpoint"], ""),
        ["capt-captcontrolplane"]
    );
    // Beside Cluster API core the Cluster's fields are core's (manager `manager`); without it,
    // capt-cluster writes them (docs/cluster-api.md).
    let cluster_writer = if env().core {
        "manager"
    } else {
        "capt-cluster"
    };
    assert_eq!(
        owner(&cluster, &["spec", "controlPlaneEndpoint"], ""),
        [cluster_writer]
    );
    assert_eq!(
        owner(&cluster, &["status", "phase"], "status"),
        [cluster_writer]
    );
    assert_eq!(
        owner(&cc, &["status", "vpcId"], "status"),
        ["capt-captcluster"]
    );
    let _ = ns;
    Ok(())
}

#[tokio::test]
async fn at_provider_never_disappears_through_100_rewrites_and_a_failure_and_recovery() -> Result<()>
{
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned_with("e2e-atprovider", false, 20).await?;
    let api: Api<CAPTControlPlane> = Api::namespaced(env().client().await?, &ns.name);

    // A watch counts every observed version of the control plane without atProvider.
    let seen = Arc::new(AtomicUsize::new(0));
    let disappeared = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let watch = {
        let (seen, disappeared, stop) = (seen.clone(), disappeared.clone(), stop.clone());
        let config = watcher::Config::default().fields("metadata.name=demo");
        tokio::spawn(async move {
            let mut events = watcher(api, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(Ok(cp)) = events.next().await {
                seen.fetch_add(1, Ordering::Relaxed);
                let at_provider = cp
                    .status
                    .and_then(|s| s.workspace_status)
                    .and_then(|w| w.at_provider);
                if at_provider.is_none() {
                    disappeared.fetch_add(1, Ordering::Relaxed);
                }
                if stop.load(Ordering::Relaxed) {
                    break;
                }
            }
        })
    };
    let ws = workspace_name(&ns.name, "demo-controlplane");
    let checksum = || {
        env().kubectl_ok(
            &[
                "get",
                "workspace",
                &ws,
                "-o",
                "jsonpath={.status.atProvider.checksum}",
            ],
            None,
        )
    };
    for revision in 1..=100 {
        let before = checksum()?;
        annotate_workspace(
            &ws,
            json!({"fake.tf.upbound.io/revision": revision.to_string()}),
        )
        .await?;
        // Each revision is a real rewrite of the Workspace's atProvider by the provider.
        system
            .wait_for(
                "the provider's rewrite",
                Duration::from_secs(10),
                || async { Ok(checksum()? != before) },
            )
            .await?;
        if revision == 50 {
            annotate_workspace(
                &ws,
                json!({"fake.tf.upbound.io/fail": "terraform apply: AccessDenied"}),
            )
            .await?;
            system
                .wait_for("phase Failed", Duration::from_secs(30), || async {
                    Ok(system
                        .get(&["captcontrolplane", "demo"])?
                        .is_some_and(|c| c["status"]["phase"] == "Failed"))
                })
                .await?;
            annotate_workspace(&ws, json!({"fake.tf.upbound.io/fail": null})).await?;
        }
    }
    // The last rewrite reaches the control plane: its checksum is the Workspace's.
    system
        .wait_for(
            "the last atProvider mirrored and phase Ready",
            Duration::from_secs(30),
            || async {
                let w = env().kubectl_ok(
                    &[
                        "get",
                        "workspace",
                        &ws,
                        "-o",
                        "jsonpath={.status.atProvider.checksum}",
                    ],
                    None,
                )?;
                let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
                let annotated = env().kubectl_ok(
                    &[
                        "get",
                        "workspace",
                        &ws,
                        "-o",
                        "jsonpath={.metadata.annotations.fake\\.tf\\.upbound\\.io/revision}",
                    ],
                    None,
                )?;
                Ok(annotated == "100"
                    && cp["status"]["workspaceStatus"]["atProvider"]["checksum"] == w
                    && cp["status"]["phase"] == "Ready")
            },
        )
        .await?;
    stop.store(true, Ordering::Relaxed);
    annotate_workspace(&ws, json!({"fake.tf.upbound.io/revision": "final"})).await?;
    let _ = tokio::time::timeout(Duration::from_secs(10), watch).await;
    let seen = seen.load(Ordering::Relaxed);
    println!(
        "watched {seen} versions of the control plane; atProvider missing in {}",
        disappeared.load(Ordering::Relaxed)
    );
    assert!(
        seen >= 50,
        "the watch saw the control plane follow the rewrites ({seen} versions)"
    );
    assert_eq!(
        disappeared.load(Ordering::Relaxed),
        0,
        "atProvider disappeared"
    );
    Ok(())
}

#[tokio::test]
async fn a_new_output_alone_moves_the_endpoint_to_the_control_plane_and_the_cluster() -> Result<()>
{
    // Terraform re-applied with a new endpoint output and nothing else changed: the
    // Workspace's conditions stay the same, so only the Workspace itself says so.
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, mut system) = provisioned("e2e-output", false).await?;
    system.provider.kill(); // the test plays the provider from here on
    let api: Api<TerraformWorkspace> = Api::all(env().client().await?);
    let name = workspace_name(&ns.name, "demo-controlplane");
    let mut status = serde_json::to_value(api.get_status(&name).await?)?["status"].clone();
    let conditions = status["conditions"].clone();
    let host = "moved.example.com";
    status["atProvider"]["outputs"]["cluster_endpoint"] = json!(format!("https://{host}"));
    status["atProvider"]["checksum"] = json!("moved");
    let body =
        json!({"apiVersion": "tf.upbound.io/v1beta1", "kind": "Workspace", "status": status});
    api.patch_status(
        &name,
        &PatchParams::apply(capt_tests::fake_provider::FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    assert_eq!(
        serde_json::to_value(api.get_status(&name).await?)?["status"]["conditions"],
        conditions,
        "only the outputs changed"
    );
    let moved = json!({"host": host, "port": 443});
    // Core sets a Cluster's endpoint once, from the control plane, and never moves it; without
    // core, capt-cluster follows the control plane.
    let cluster_wanted = if env().core {
        json!({"host": ENDPOINT_HOST, "port": 443})
    } else {
        moved.clone()
    };
    system
        .wait_for(
            "the new endpoint on the CAPTControlPlane (and the Cluster without core)",
            Duration::from_secs(10),
            || async {
                let cp = system
                    .get(&["captcontrolplane", "demo"])?
                    .unwrap_or_default();
                let cluster = system.get(&["cluster", "demo"])?.unwrap_or_default();
                Ok(cp["spec"]["controlPlaneEndpoint"] == moved
                    && cluster["spec"]["controlPlaneEndpoint"] == cluster_wanted)
            },
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn steady_state_makes_no_writes_and_no_reconciles_over_30_seconds() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("e2e-steady", false).await?;
    tokio::time::sleep(Duration::from_secs(3)).await; // let the last echoes of provisioning settle
    let versions = || -> Result<BTreeMap<String, String>> {
        let mut v = BTreeMap::new();
        for kind in [
            "cluster",
            "captcluster",
            "captcontrolplane",
            "workspacetemplateapply",
        ] {
            let out = env().kubectl_ok(
                &[
                    "get",
                    kind,
                    "-n",
                    &ns.name,
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.name}={.metadata.resourceVersion} {end}",
                ],
                None,
            )?;
            v.insert(kind.to_owned(), out);
        }
        let ws = env().kubectl_ok(
            &[
                "get",
                "workspaces",
                "-l",
                &format!("{}={}", capt_tests::system::APPLY_NAMESPACE_LABEL, ns.name),
                "-o",
                "jsonpath={range .items[*]}{.metadata.name}={.metadata.resourceVersion} {end}",
            ],
            None,
        )?;
        v.insert("workspace".into(), ws);
        Ok(v)
    };
    let before = versions()?;
    let reconciles = system
        .controller_metric("capt_reconciles_total", &[])
        .await?;
    let intents = system
        .controller_metric("capt_intents_published_total", &[])
        .await?;
    let writes = system
        .applier
        .metric("status_applier_api_writes_total", &[])
        .await?;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(versions()?, before, "no object changed");
    assert_eq!(
        system
            .controller_metric("capt_reconciles_total", &[])
            .await?,
        reconciles,
        "no reconcile"
    );
    assert_eq!(
        system
            .controller_metric("capt_intents_published_total", &[])
            .await?,
        intents,
        "no intent"
    );
    assert_eq!(
        system
            .applier
            .metric("status_applier_api_writes_total", &[])
            .await?,
        writes,
        "no write"
    );
    println!(
        "steady state over 30 s: 0 writes, 0 reconciles (after {reconciles} reconciles and {writes} writes to provision)"
    );
    Ok(())
}

#[tokio::test]
async fn a_terraform_failure_gives_failed_with_the_providers_message_and_a_fix_returns_to_ready()
-> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("e2e-failure", false).await?;
    let ws = workspace_name(&ns.name, "demo-controlplane");
    annotate_workspace(
        &ws,
        json!({"fake.tf.upbound.io/fail": "Error: creating EKS Cluster: AccessDeniedException"}),
    )
    .await?;
    system
        .wait_for(
            "phase Failed with the provider's message",
            Duration::from_secs(30),
            || async {
                let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
                Ok(cp["status"]["phase"] == "Failed"
                    && failed_message(&cp)
                        .is_some_and(|m| m.contains("creating EKS Cluster: AccessDeniedException")))
            },
        )
        .await?;
    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    assert!(
        cp["status"]["workspaceStatus"]["atProvider"].is_object(),
        "atProvider kept through the failure"
    );
    // Not a terminal failure (a fixed Terraform error recovers): no failureReason, so neither
    // core nor capt-cluster marks the Cluster Failed for good.
    assert!(
        cp["status"].get("failureReason").is_none(),
        "{}",
        cp["status"]
    );
    let cluster = system.get(&["cluster", "demo"])?.unwrap();
    assert!(
        cluster["status"].get("failureMessage").is_none() && cluster["status"]["phase"] != "Failed",
        "{}",
        cluster["status"]
    );

    annotate_workspace(
        &ws,
        json!({"fake.tf.upbound.io/fail": null, "fake.tf.upbound.io/revision": "fixed"}),
    )
    .await?;
    system
        .wait_for(
            "phase Ready again, failure cleared",
            Duration::from_secs(30),
            || async {
                let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
                let cluster = system.get(&["cluster", "demo"])?.unwrap();
                Ok(cp["status"]["phase"] == "Ready"
                    && failed_message(&cp).is_none()
                    && cluster["status"].get("failureMessage").is_none()
                    && cluster["status"]["phase"] == "Provisioned")
            },
        )
        .await?;
    Ok(())
}

/// When each object got its deletion timestamp and when it disappeared.
#[derive(Default, Debug)]
struct Timeline(BTreeMap<String, (Option<Instant>, Option<Instant>)>);

impl Timeline {
    /// Records what one poll saw at `now` (the poll's start: objects polled in one round share
    /// it, so the order is known to within one round, 25 ms plus the reads).
    async fn observe(&mut self, now: Instant, name: &str, exists: Option<bool>) {
        let entry = self.0.entry(name.to_owned()).or_default();
        match exists {
            Some(true) => entry.0 = entry.0.or(Some(now)),
            None => {
                entry.0 = entry.0.or(Some(now));
                entry.1 = entry.1.or(Some(now));
            }
            Some(false) => {}
        }
    }
    fn deleting(&self, name: &str) -> Instant {
        self.0[name]
            .0
            .unwrap_or_else(|| panic!("{name} was never deleted: {self:?}"))
    }
    fn gone(&self, name: &str) -> Instant {
        self.0[name]
            .1
            .unwrap_or_else(|| panic!("{name} never disappeared: {self:?}"))
    }
}

/// `Some(deleting)` for an existing object, `None` when gone.
async fn state<K>(api: &Api<K>, name: &str) -> Result<Option<bool>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .get_opt(name)
        .await?
        .map(|o| o.meta().deletion_timestamp.is_some()))
}

async fn delete_cluster_and_record(ns: &str, retain_vpc: bool) -> Result<Timeline> {
    let client = env().client().await?;
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), ns);
    let cps: Api<CAPTControlPlane> = Api::namespaced(client.clone(), ns);
    let ccs: Api<CAPTCluster> = Api::namespaced(client.clone(), ns);
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), ns);
    let workspaces: Api<TerraformWorkspace> = Api::all(client.clone());
    clusters.delete("demo", &user_deletion()).await?;
    let mut timeline = Timeline::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = Instant::now();
        timeline
            .observe(now, "cluster", state(&clusters, "demo").await?)
            .await;
        timeline
            .observe(now, "captcontrolplane", state(&cps, "demo").await?)
            .await;
        timeline
            .observe(now, "captcluster", state(&ccs, "demo").await?)
            .await;
        timeline
            .observe(now, "cp-apply", state(&applies, "demo-controlplane").await?)
            .await;
        timeline
            .observe(
                now,
                "cp-workspace",
                state(&workspaces, &workspace_name(ns, "demo-controlplane")).await?,
            )
            .await;
        let vpc_apply = state(&applies, "demo-vpc").await?;
        let vpc_ws = state(&workspaces, &workspace_name(ns, "demo-vpc")).await?;
        timeline.observe(now, "vpc-apply", vpc_apply).await;
        timeline.observe(now, "vpc-workspace", vpc_ws).await;
        let cluster_gone = timeline.0["cluster"].1.is_some();
        let vpc_done = if retain_vpc {
            true
        } else {
            vpc_apply.is_none() && vpc_ws.is_none()
        };
        if cluster_gone && vpc_done && timeline.0["captcluster"].1.is_some() {
            return Ok(timeline);
        }
        assert!(
            Instant::now() < deadline,
            "deletion did not finish within 60 s: {timeline:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn deleting_the_cluster_removes_everything_control_plane_first_with_no_finalizer_left()
-> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("e2e-delete", false).await?;
    let t = delete_cluster_and_record(&ns.name, false).await?;
    // seed 003: the control plane's Workspace goes, then the control plane, and only then
    // does the VPC apply start deleting; the CAPTCluster goes after its VPC Workspace.
    assert!(t.gone("cp-workspace") <= t.gone("cp-apply"), "{t:?}");
    assert!(t.gone("cp-apply") <= t.gone("captcontrolplane"), "{t:?}");
    assert!(
        t.gone("captcontrolplane") <= t.deleting("vpc-apply"),
        "{t:?}"
    );
    assert!(t.gone("vpc-workspace") <= t.gone("captcluster"), "{t:?}");
    assert!(t.gone("captcluster") <= t.gone("cluster"), "{t:?}");
    let left = env().kubectl_ok(
        &[
            "get",
            "cluster,captcluster,captcontrolplane,workspacetemplateapply",
            "-n",
            &ns.name,
            "-o",
            "name",
        ],
        None,
    )?;
    assert_eq!(left, "", "nothing is left");
    let deletions = system
        .controller_metric("capt_resource_deletion_duration_seconds_count", &[])
        .await?;
    assert!(deletions >= 4.0, "deletions were measured: {deletions}");
    Ok(())
}

#[tokio::test]
async fn retain_vpc_on_delete_keeps_the_vpc_apply_and_its_workspace() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, _system) = provisioned("e2e-retain", true).await?;
    delete_cluster_and_record(&ns.name, true).await?;
    let client = env().client().await?;
    let applies: Api<WorkspaceTemplateApply> = Api::namespaced(client.clone(), &ns.name);
    let vpc = applies.get("demo-vpc").await?;
    assert!(
        vpc.metadata.deletion_timestamp.is_none(),
        "the VPC apply is kept"
    );
    assert!(
        vpc.metadata.owner_references.unwrap_or_default().is_empty(),
        "and no longer owned"
    );
    let workspaces: Api<TerraformWorkspace> = Api::all(client);
    assert!(
        workspaces
            .get_opt(&workspace_name(&ns.name, "demo-vpc"))
            .await?
            .is_some(),
        "its Workspace is kept"
    );
    assert!(
        applies.get_opt("demo-controlplane").await?.is_none(),
        "the control plane's apply is gone"
    );
    // Clean up what was retained (the Workspace is cluster-scoped).
    applies.delete("demo-vpc", &DeleteParams::default()).await?;
    Ok(())
}

#[tokio::test]
async fn a_users_server_side_apply_of_another_endpoint_is_a_reported_conflict_and_stays()
-> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("e2e-user", false).await?;
    let theirs = json!({"host": "api.user.example.com", "port": 6443});
    // The control plane's endpoint: capt-captcontrolplane's, with or without core (the
    // Cluster's is core's beside core; fault_endpoint.rs covers capt-cluster's without it).
    let manifest = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "CAPTControlPlane",
        "metadata": {"name": "demo", "namespace": ns.name}, "spec": {"controlPlaneEndpoint": theirs}});
    env().kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=platform-admin",
            "-f",
            "-",
        ],
        Some(&manifest.to_string()),
    )?;
    system
        .wait_for(
            "the conflict reported by the applier",
            Duration::from_secs(20),
            || async {
                let conflicts = system.applier.client.get("/v1/conflicts").await?.json();
                Ok(conflicts.as_array().into_iter().flatten().any(|c| {
                    c["object"]["kind"] == "CAPTControlPlane"
                        && c["conflict"]["owner"] == "platform-admin"
                        && c["conflict"]["path"] == ".spec.controlPlaneEndpoint.host"
                }))
            },
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    assert_eq!(
        cp["spec"]["controlPlaneEndpoint"], theirs,
        "the user's endpoint stays"
    );
    let events = env().kubectl_ok(
        &[
            "get",
            "events",
            "-n",
            &ns.name,
            "--field-selector",
            "reason=FieldConflict",
            "-o",
            "jsonpath={.items[*].message}{.items[*].note}",
        ],
        None,
    )?;
    assert!(
        events.contains("owned by platform-admin"),
        "an Event reports it: {events}"
    );
    Ok(())
}

#[tokio::test]
async fn an_existing_apply_with_the_expected_name_is_adopted_not_replaced() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "e2e-adopt").await?;
    let system = System::start(&ns.name, 200).await?;
    // A deployment from before the controller recorded apply names (seed 002's migration).
    let existing = json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "demo-controlplane", "namespace": ns.name},
        "spec": {"templateRef": {"name": "eks"}, "variables": {"CLUSTER_NAME": "demo", "KUBERNETES_VERSION": "1.31", "MIGRATED": "yes"}}});
    env().kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--field-manager=old-capt",
            "-f",
            "-",
        ],
        Some(&existing.to_string()),
    )?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;
    let apply = system
        .get(&["workspacetemplateapply", "demo-controlplane"])?
        .unwrap();
    assert_eq!(
        apply["metadata"]["annotations"]["infrastructure.cluster.x-k8s.io/adopted"],
        "true"
    );
    assert_eq!(
        apply["spec"]["variables"]["MIGRATED"], "yes",
        "its spec is the user's"
    );
    assert!(
        apply["spec"].get("writeConnectionSecretToRef").is_none(),
        "nothing was added to its spec"
    );
    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    assert_eq!(
        cp["spec"]["workspaceTemplateApplyName"],
        "demo-controlplane"
    );
    let applies = env().kubectl_ok(
        &[
            "get",
            "workspacetemplateapply",
            "-n",
            &ns.name,
            "-o",
            "name",
        ],
        None,
    )?;
    assert_eq!(applies.lines().count(), 2, "no duplicate apply: {applies}");
    Ok(())
}

#[tokio::test]
async fn later_template_and_version_changes_reach_the_workspace() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, system) = provisioned("e2e-render", false).await?;
    let ws = workspace_name(&ns.name, "demo-controlplane");
    let module = || {
        env().kubectl_ok(
            &[
                "get",
                "workspace",
                &ws,
                "-o",
                "jsonpath={.spec.forProvider.module}",
            ],
            None,
        )
    };
    assert!(module()?.contains("EKS 1.31 cluster demo"), "{}", module()?);

    env().kubectl_ok(
        &[
            "patch",
            "captcontrolplane",
            "demo",
            "-n",
            &ns.name,
            "--type=merge",
            "-p",
            r#"{"spec":{"version":"1.32"}}"#,
        ],
        None,
    )?;
    system
        .wait_for(
            "the new version in the Workspace",
            Duration::from_secs(20),
            || async { Ok(module()?.contains("EKS 1.32 cluster demo")) },
        )
        .await?;

    let patch = json!({"spec": {"template": {"spec": {"forProvider": {"source": "Inline", "module": "# v2 of ${CLUSTER_NAME}"}}}}});
    env().kubectl_ok(
        &[
            "patch",
            "workspacetemplate",
            "eks",
            "-n",
            &ns.name,
            "--type=merge",
            "-p",
            &patch.to_string(),
        ],
        None,
    )?;
    system
        .wait_for(
            "the new template in the Workspace",
            Duration::from_secs(20),
            || async { Ok(module()? == "# v2 of demo") },
        )
        .await?;
    system
        .wait_for(
            "the control plane Ready again",
            Duration::from_secs(30),
            || async {
                let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
                Ok(cp["status"]["phase"] == "Ready" && cp["status"]["version"] == "1.32")
            },
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_stuck_deletion_is_reported_and_finishes_once_unblocked() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let (ns, mut system) = provisioned("e2e-stuck", false).await?;
    system.provider.kill(); // nobody removes the Workspace's finalizer any more
    let client = env().client().await?;
    let clusters: Api<Cluster> = Api::namespaced(client.clone(), &ns.name);
    clusters.delete("demo", &user_deletion()).await?;
    system
        .wait_for(
            "DeletionFailed on the control plane",
            Duration::from_secs(30),
            || async {
                let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
                Ok(cp["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "DeletionFailed" && c["status"] == "True"))
            },
        )
        .await?;
    let cp = system.get(&["captcontrolplane", "demo"])?.unwrap();
    let deleting = cp["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Deleting")
        .cloned()
        .unwrap();
    println!("Deleting: {deleting}");
    assert_eq!(deleting["status"], "True");

    // Unblocked by hand (as an operator would), the deletion completes.
    let ws = workspace_name(&ns.name, "demo-controlplane");
    env().kubectl_ok(
        &[
            "patch",
            "workspace",
            &ws,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
        None,
    )?;
    let vpc_ws = workspace_name(&ns.name, "demo-vpc");
    system
        .wait_for(
            "the VPC Workspace to be deleted",
            Duration::from_secs(30),
            || async {
                Ok(env()
                    .kubectl_ok(
                        &[
                            "get",
                            "workspace",
                            &vpc_ws,
                            "-o",
                            "jsonpath={.metadata.deletionTimestamp}",
                        ],
                        None,
                    )
                    .map(|t| !t.is_empty())
                    .unwrap_or(true))
            },
        )
        .await?;
    let _ = env().kubectl_run(
        &[
            "patch",
            "workspace",
            &vpc_ws,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
        None,
    )?;
    system
        .wait_for("everything gone", Duration::from_secs(30), || async {
            Ok(env()
                .kubectl_ok(
                    &[
                        "get",
                        "cluster,captcluster,captcontrolplane,workspacetemplateapply",
                        "-n",
                        &ns.name,
                        "-o",
                        "name",
                    ],
                    None,
                )?
                .is_empty())
        })
        .await?;
    Ok(())
}

#[tokio::test]
async fn an_apply_waits_for_its_secrets_and_workspaces_before_rendering() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "e2e-wait").await?;
    let system = System::start(&ns.name, 50).await?;
    system.apply_samples(false).await?; // the templates (and a Cluster, irrelevant here)
    let apply = json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": "waiting", "namespace": ns.name},
        "spec": {"templateRef": {"name": "vpc"}, "variables": {"CLUSTER_NAME": "waiting"},
                 "waitForSecrets": [{"name": "credentials", "namespace": ns.name}],
                 "waitForWorkspaces": [{"name": workspace_name(&ns.name, "demo-vpc")}]}});
    env().kubectl_ok(&["apply", "-f", "-"], Some(&apply.to_string()))?;
    let condition = || -> Result<Value> {
        let a = system.get(&["workspacetemplateapply", "waiting"])?.unwrap();
        Ok(a["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Applied")
            .cloned()
            .unwrap_or(Value::Null))
    };
    system
        .wait_for("WaitingForSecrets", Duration::from_secs(20), || async {
            Ok(condition()?["reason"] == "WaitingForSecrets")
        })
        .await?;
    let ws = workspace_name(&ns.name, "waiting");
    assert!(
        env()
            .kubectl_run(&["get", "workspace", &ws], None)?
            .status
            .code()
            != Some(0),
        "nothing rendered yet"
    );

    env().kubectl_ok(
        &[
            "create",
            "secret",
            "generic",
            "credentials",
            "-n",
            &ns.name,
            "--from-literal=token=not-logged",
        ],
        None,
    )?;
    system
        .wait_for(
            "the Workspace rendered",
            Duration::from_secs(20),
            || async {
                Ok(env()
                    .kubectl_run(&["get", "workspace", &ws], None)?
                    .status
                    .success())
            },
        )
        .await?;
    system
        .wait_for(
            "Applied condition gone, applied true",
            Duration::from_secs(20),
            || async {
                let a = system.get(&["workspacetemplateapply", "waiting"])?.unwrap();
                Ok(condition()?.is_null() && a["status"]["applied"] == true)
            },
        )
        .await?;
    assert!(
        !system.controller_log_text().contains("not-logged"),
        "Secret data never reaches the logs"
    );
    env().kubectl_ok(
        &[
            "delete",
            "workspacetemplateapply",
            "waiting",
            "-n",
            &ns.name,
            "--wait=true",
            "--timeout=30s",
        ],
        None,
    )?;
    Ok(())
}
