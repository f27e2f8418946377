//! Two pods of the Deployment as it ships (two replicas, each a status-applier and a
//! controller, leader election on one Lease, both acting as the pod's ServiceAccount),
//! beside the real Cluster API core manager: only the leader's pod writes, whichever way
//! leadership moves.
//!
//! For each way it moves (the leader's controller container restarts; the Lease cannot be
//! renewed while the API server is away, and the old leader's controller comes back
//! believing it still leads; the leader pod is deleted; a rolling update) followed by a change
//! of the control plane's `cluster_endpoint` output:
//! - the new endpoint reaches the CAPTControlPlane (`spec.controlPlaneEndpoint` and
//!   `status.endpoint`), and the Cluster keeps the endpoint core copied (core sets it once);
//! - no status field of the CAPT objects or the Cluster, nor an endpoint, flips back to a
//!   value it had left (the old leader's applier restoring its documents did, for ever);
//! - from the moment the Lease names the new leader, no pod but the leader's writes
//!   anything (the API server's audit log, by the pod each request came from);
//! - once the change has landed, 30 s pass with no write by any `capt-*` manager.

use anyhow::{Context, Result, bail, ensure};
use capt_tests::api_server_fault::ApiServerFault;
use capt_tests::audit_log::AuditLog;
use capt_tests::fake_provider::FakeProvider;
use capt_tests::pod::{Election, LEASE_NAMESPACE, Pod};
use capt_tests::system::{apply_samples, set_endpoint_output, wait_until};
use capt_tests::{TestNamespace, env};
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::RwLock;

const LEASE_SECONDS: u64 = 4;
const NEW_HOST: &str = "moved.example.com";
const QUIET: Duration = Duration::from_secs(30);

/// The case that stops the API server runs alone; the others share the environment.
static API_SERVER: RwLock<()> = RwLock::const_new(());

#[tokio::test]
async fn after_the_leaders_controller_restarts_only_the_new_leader_writes() -> Result<()> {
    let _shared = API_SERVER.read().await;
    let mut stack = Stack::start("replicas-restart").await?;
    stack.pods[0].kill_controller();
    let leader = stack.wait_for_a_leader_other_than("pod-a").await?;
    // The kubelet restarts the container: it comes back as a candidate.
    stack.pods[0].start_controller()?;
    stack
        .wait("pod-a's controller to wait for the Lease", || async {
            Ok(stack.pods[0]
                .controller_log_text()
                .contains("Waiting for the leader lease"))
        })
        .await?;
    stack.check_the_endpoint_moves_and_only(&leader).await
}

#[tokio::test]
async fn after_a_lease_lost_to_an_api_server_outage_only_the_new_leader_writes() -> Result<()> {
    let _alone = API_SERVER.write().await;
    let mut stack = Stack::start("replicas-outage").await?;
    // The API server goes away for longer than the Lease; the leader's controller is paused
    // meanwhile, so that the other pod takes the Lease when the API server is back.
    let outage = ApiServerFault::stop()?;
    stack.pods[0].signal_controller("STOP")?;
    tokio::time::sleep(Duration::from_secs(LEASE_SECONDS + 1)).await; // the outage itself
    outage.end()?;
    let leader = stack.wait_for_a_leader_other_than("pod-a").await?;
    // The old leader's controller resumes past its deadline: it writes nothing (its lead
    // ended with the deadline, with no event needed), reads the Lease, and stands by, warm,
    // without exiting.
    stack.pods[0].signal_controller("CONT")?;
    stack
        .wait("pod-a's controller to stand by", || async {
            Ok(stack.pods[0]
                .controller_log_text()
                .contains("Standing by: another replica leads"))
        })
        .await?;
    stack.check_the_endpoint_moves_and_only(&leader).await?;
    ensure!(
        stack.pods[0].controller_running()?,
        "pod-a's controller stayed up as the standby"
    );
    Ok(())
}

#[tokio::test]
async fn after_the_leader_pod_is_deleted_only_the_new_leader_writes() -> Result<()> {
    let _shared = API_SERVER.read().await;
    let mut stack = Stack::start("replicas-deleted").await?;
    stack.pods[0].terminate()?;
    let leader = stack.wait_for_a_leader_other_than("pod-a").await?;
    stack.check_the_endpoint_moves_and_only(&leader).await
}

#[tokio::test]
async fn during_a_rolling_update_only_the_new_leader_writes() -> Result<()> {
    let _shared = API_SERVER.read().await;
    let mut stack = Stack::start("replicas-rolling").await?;
    // The new pod starts; the old leader is told to stop, and its controller goes at once
    // while its applier is still up for the grace period.
    let pod_c = Pod::start("pod-c", &stack.ns.name, &stack.election).await?;
    stack.pods.push(pod_c);
    stack.pods[0].signal_controller("TERM")?;
    stack.pods[0]
        .controller_exit(Duration::from_secs(60))
        .await?;
    let leader = stack.wait_for_a_leader_other_than("pod-a").await?;
    stack.check_the_endpoint_moves_and_only(&leader).await
}

/// Two pods and the fake provider for one namespace, the samples provisioned, pod-a leading.
struct Stack {
    ns: TestNamespace,
    election: Election,
    pods: Vec<Pod>,
    _provider: FakeProvider,
    flips: Flips,
}

impl Stack {
    async fn start(prefix: &str) -> Result<Self> {
        let client = env().client().await?;
        let ns = TestNamespace::create(&client, prefix).await?;
        let election = Election {
            lease: format!("capt-{}", ns.name),
            duration_seconds: Some(LEASE_SECONDS),
        };
        let provider = FakeProvider::for_namespace(&ns.name, 50, "info", &env().kubeconfig).await?;
        let pod_a = Pod::start("pod-a", &ns.name, &election).await?;
        let mut stack = Self {
            ns,
            election,
            pods: vec![pod_a],
            _provider: provider,
            flips: Flips::default(),
        };
        stack
            .wait("pod-a to lead", || async {
                Ok(stack.holder()?.as_deref() == Some("pod-a"))
            })
            .await?;
        let pod_b = Pod::start("pod-b", &stack.ns.name, &stack.election).await?;
        stack.pods.push(pod_b);
        apply_samples(env(), &stack.ns.name, false)?;
        stack
            .wait(
                "the Cluster Provisioned, the control plane Ready",
                || async {
                    let cp = stack.get("captcontrolplane")?;
                    let cluster = stack.get("cluster")?;
                    Ok(cluster["status"]["phase"] == "Provisioned"
                        && cp["status"]["phase"] == "Ready"
                        && cp["spec"]["controlPlaneEndpoint"]["host"] == stack.first_host())
                },
            )
            .await?;
        stack.flips = Flips::watch(&stack.ns.name).await?;
        Ok(stack)
    }

    /// Who holds the Lease.
    fn holder(&self) -> Result<Option<String>> {
        let out = env().kubectl_run(
            &[
                "get",
                "lease",
                &self.election.lease,
                "-n",
                LEASE_NAMESPACE,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
            None,
        )?;
        let holder = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        Ok((out.status.success() && !holder.is_empty()).then_some(holder))
    }

    /// Waits until the Lease names a pod other than `old`, and answers it.
    async fn wait_for_a_leader_other_than(&self, old: &str) -> Result<String> {
        self.wait(&format!("a leader other than {old}"), || async {
            Ok(self.holder()?.is_some_and(|h| h != old))
        })
        .await?;
        self.holder()?.context("the Lease names a leader")
    }

    /// The endpoint host the samples' outputs give first (the EKS name carries the namespace).
    fn first_host(&self) -> String {
        capt_tests::sample_endpoint_host(&self.ns.name, "demo")
    }

    /// `kind/demo` in the namespace.
    fn get(&self, kind: &str) -> Result<Value> {
        let out = env().kubectl_ok(
            &["get", kind, "demo", "-n", &self.ns.name, "-o", "json"],
            None,
        )?;
        Ok(serde_json::from_str(&out)?)
    }

    async fn wait<F, Fut>(&self, what: &str, check: F) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<bool>>,
    {
        match wait_until(what, Duration::from_secs(60), check).await {
            Ok(()) => Ok(()),
            Err(e) => bail!("{e}\n{}", self.logs()),
        }
    }

    fn logs(&self) -> String {
        let mut text = String::new();
        for pod in &self.pods {
            text += &format!(
                "--- {} controller log:\n{}\n--- {} applier log (tail):\n{}\n",
                pod.name,
                pod.controller_log_text(),
                pod.name,
                tail(&pod.applier.log_text(), 30)
            );
        }
        text
    }

    /// The claims of this test, once `leader` holds the Lease (see the module's
    /// documentation).
    async fn check_the_endpoint_moves_and_only(&self, leader: &str) -> Result<()> {
        let since_the_move = AuditLog::from_now()?;
        set_endpoint_output(env(), &self.ns.name, &format!("https://{NEW_HOST}"))?;
        self.wait("the new endpoint on the control plane", || async {
            let cp = self.get("captcontrolplane")?;
            let at_provider = &cp["status"]["workspaceStatus"]["atProvider"];
            Ok(cp["spec"]["controlPlaneEndpoint"]["host"] == NEW_HOST
                && cp["status"]["endpoint"] == format!("{NEW_HOST}:443")
                && at_provider["outputs"]["cluster_endpoint"] == format!("https://{NEW_HOST}")
                && at_provider["checksum"].is_string())
        })
        .await?;
        let cluster = self.get("cluster")?;
        assert_eq!(
            cluster["spec"]["controlPlaneEndpoint"]["host"],
            self.first_host(),
            "core set the Cluster's endpoint once and keeps it"
        );

        let quiet = AuditLog::from_now()?;
        tokio::time::sleep(QUIET).await; // the claim: nothing is written over this span
        let ours =
            |w: &capt_tests::audit_log::Write| w.manager.starts_with("capt-") || w.pod.is_some();
        let at_rest: Vec<String> = quiet
            .writes_in(&self.ns.name)?
            .into_iter()
            .filter(ours)
            .map(|w| format!("{w} (pod {:?}, code {})", w.pod, w.code))
            .collect();
        let others: Vec<String> = since_the_move
            .writes_in(&self.ns.name)?
            .into_iter()
            .filter(|w| w.pod.as_deref().is_some_and(|p| p != leader))
            .map(|w| format!("{w} (pod {:?}, code {})", w.pod, w.code))
            .collect();
        let flips = self.flips.found();
        println!(
            "{leader} leads; writes at rest: {}; by other pods since the move: {}; flips: {}; \
             object versions watched: {}",
            at_rest.len(),
            others.len(),
            flips.len(),
            self.flips.versions()
        );
        ensure!(
            others.is_empty(),
            "a pod that does not lead wrote: {others:#?}\n{}",
            self.logs()
        );
        ensure!(flips.is_empty(), "fields flipped back: {flips:#?}");
        ensure!(
            at_rest.is_empty(),
            "writes at rest: {at_rest:#?}\n{}",
            self.logs()
        );
        ensure!(self.flips.versions() > 0, "the watches saw the change");
        Ok(())
    }
}

/// Changes back to a value a field had left, on the CAPT objects and the Cluster of one
/// namespace: per path (conditions by type), the values in the order seen; `A, B, A` is a
/// flip.
#[derive(Default)]
struct Flips {
    seen: Arc<Mutex<FlipState>>,
    tasks: Vec<Arc<tokio::task::JoinHandle<()>>>,
}

#[derive(Default)]
struct FlipState {
    versions: usize,
    history: BTreeMap<String, Vec<String>>,
    flips: Vec<String>,
}

impl Flips {
    async fn watch(namespace: &str) -> Result<Self> {
        let client = env().client().await?;
        let mut flips = Self::default();
        for (group, kind, plural) in [
            (
                "controlplane.cluster.x-k8s.io",
                "CAPTControlPlane",
                "captcontrolplanes",
            ),
            (
                "infrastructure.cluster.x-k8s.io",
                "CAPTCluster",
                "captclusters",
            ),
            (
                "infrastructure.cluster.x-k8s.io",
                "WorkspaceTemplateApply",
                "workspacetemplateapplies",
            ),
            ("cluster.x-k8s.io", "Cluster", "clusters"),
        ] {
            let resource = capt_tests::system::resource(group, kind, plural);
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), namespace, &resource);
            let seen = flips.seen.clone();
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(async move {
                let mut ready = Some(ready_tx);
                let mut events = watcher(api, watcher::Config::default())
                    .default_backoff()
                    .boxed();
                while let Some(event) = events.next().await {
                    match event {
                        Ok(watcher::Event::InitDone) => {
                            if let Some(tx) = ready.take() {
                                let _ = tx.send(());
                            }
                        }
                        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                            let name =
                                format!("{kind}/{}", o.metadata.name.clone().unwrap_or_default());
                            seen.lock()
                                .unwrap()
                                .take(&name, &serde_json::to_value(&o).unwrap_or_default());
                        }
                        _ => {}
                    }
                }
            });
            ready_rx.await.context("the watch listed")?;
            flips.tasks.push(Arc::new(task));
        }
        Ok(flips)
    }

    fn found(&self) -> Vec<String> {
        self.seen.lock().unwrap().flips.clone()
    }

    fn versions(&self) -> usize {
        self.seen.lock().unwrap().versions
    }
}

impl Drop for Flips {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl FlipState {
    fn take(&mut self, name: &str, object: &Value) {
        self.versions += 1;
        let mut leaves = BTreeMap::new();
        flatten(&object["status"], &format!("{name}:status"), &mut leaves);
        flatten(
            &object["spec"]["controlPlaneEndpoint"],
            &format!("{name}:spec.controlPlaneEndpoint"),
            &mut leaves,
        );
        for (path, value) in leaves {
            let history = self.history.entry(path.clone()).or_default();
            if history.last() == Some(&value) {
                continue;
            }
            if history.contains(&value) {
                self.flips.push(format!("{path}: {history:?} then {value}"));
            }
            history.push(value);
        }
    }
}

/// The leaves of `value` under `path`; a list of objects with a `type` (conditions) is keyed
/// by it, any other list is one leaf.
fn flatten(value: &Value, path: &str, out: &mut BTreeMap<String, String>) {
    match value {
        Value::Null => {}
        Value::Object(map) => {
            for (k, v) in map {
                flatten(v, &format!("{path}.{k}"), out);
            }
        }
        Value::Array(items) if items.iter().all(|i| i["type"].is_string()) && !items.is_empty() => {
            for item in items {
                flatten(
                    item,
                    &format!("{path}[{}]", item["type"].as_str().unwrap_or("")),
                    out,
                );
            }
        }
        other => {
            out.insert(path.to_owned(), other.to_string());
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
