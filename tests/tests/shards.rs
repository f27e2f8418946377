//! Two shards as Cluster API providers shard (`docs/performance-history.md`, "Sharding, measured"): two
//! pods of the Deployment in one namespace, each with a Lease of its own, the controller with
//! `--watch-filter <shard>` and the applier watching only its shard's label, beside the real
//! Cluster API core manager. Each shard's stack (the sample Cluster and its CAPT objects,
//! labelled `cluster.x-k8s.io/watch-filter=<shard>`) is provisioned and deleted, and the API
//! server's audit log, by the pod each request came from, shows that each pod wrote its own
//! shard's objects and not one of the other shard's.

use anyhow::{Context, Result, bail, ensure};
use capt_tests::audit_log::AuditLog;
use capt_tests::fake_provider::FakeProvider;
use capt_tests::pod::{Election, Pod};
use capt_tests::system::{apply_sample_in_shard, wait_until};
use capt_tests::{TestNamespace, env};
use serde_json::Value;
use std::time::Duration;

/// (stack, shard, pod): the stack named `stack` carries the label of `shard`, which `pod`
/// manages.
const SHARDS: [(&str, &str, &str); 2] =
    [("alpha", "shard-a", "pod-a"), ("beta", "shard-b", "pod-b")];
const TIMEOUT: Duration = Duration::from_secs(120);

#[tokio::test]
async fn each_shard_writes_its_own_objects_and_none_of_the_other_shards() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "shards").await?;
    let audit = AuditLog::from_now()?;
    let _provider = FakeProvider::for_namespace(&ns.name, 50, "info", &env().kubeconfig).await?;
    let mut pods = Vec::new();
    for (_, shard, pod) in SHARDS {
        let election = Election {
            lease: format!("capt-{}-{shard}", ns.name),
            duration_seconds: None,
        };
        pods.push(Pod::start_in_shard(pod, &ns.name, &election, Some(shard)).await?);
    }
    let logs = || -> String {
        pods.iter()
            .map(|p| {
                format!(
                    "--- {} controller log:\n{}\n",
                    p.name,
                    p.controller_log_text()
                )
            })
            .collect()
    };
    for (stack, shard, _) in SHARDS {
        apply_sample_in_shard(env(), &ns.name, stack, shard)?;
    }
    for (stack, _, _) in SHARDS {
        let waited = wait_until(
            &format!("Cluster {stack} Provisioned with an endpoint"),
            TIMEOUT,
            || async {
                let cluster = get(&ns.name, "cluster", stack)?;
                Ok(cluster["status"]["phase"] == "Provisioned"
                    && cluster["spec"]["controlPlaneEndpoint"]["host"].is_string())
            },
        )
        .await;
        if let Err(e) = waited {
            bail!("{e}\n{}", logs());
        }
    }
    let names: Vec<&str> = SHARDS.iter().map(|(stack, _, _)| *stack).collect();
    env().kubectl_ok(
        &[
            &["delete", "cluster", "-n", &ns.name, "--wait=false"],
            &names[..],
        ]
        .concat(),
        None,
    )?;
    let gone = wait_until("both stacks and their Workspaces gone", TIMEOUT, || async {
        let left = env().kubectl_ok(
            &[
                "get",
                "clusters,captclusters,captcontrolplanes,workspacetemplateapplies",
                "-n",
                &ns.name,
                "-o",
                "name",
            ],
            None,
        )?;
        let workspaces = env().kubectl_ok(&["get", "workspaces", "-o", "name"], None)?;
        Ok(left.trim().is_empty() && !workspaces.contains(&ns.name))
    })
    .await;
    if let Err(e) = gone {
        bail!("{e}\n{}", logs());
    }

    let writes = audit.writes_in(&ns.name)?;
    for (stack, _, pod) in SHARDS {
        let by_pod: Vec<_> = writes
            .iter()
            // Refused requests too: a request to another shard's object is the fault.
            .filter(|w| w.pod.as_deref() == Some(pod))
            .collect();
        ensure!(
            by_pod.iter().any(|w| w.name.contains(stack)),
            "{pod} wrote none of its shard's objects ({stack}): {by_pod:#?}"
        );
        let elsewhere: Vec<_> = by_pod.iter().filter(|w| !w.name.contains(stack)).collect();
        assert!(
            elsewhere.is_empty(),
            "{pod} (the shard of {stack}) wrote objects of another shard: {elsewhere:#?}"
        );
        eprintln!("{pod}: {} writes, all to {stack}'s objects", by_pod.len());
    }
    Ok(())
}

/// `kind/name` in `ns`, as JSON.
fn get(ns: &str, kind: &str, name: &str) -> Result<Value> {
    let out = env()
        .kubectl_ok(&["get", kind, name, "-n", ns, "-o", "json"], None)
        .with_context(|| format!("{kind}/{name}"))?;
    Ok(serde_json::from_str(&out)?)
}
