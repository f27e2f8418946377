//! The whole system against the real Crossplane provider-terraform v0.18.0 running OpenTofu
//! (`hack/real-provider.sh`), with the sample Cluster of `manifests/samples/`, whose modules
//! need no cloud and no registry. One provider serves the environment (`.testenv-real`); the
//! tests take turns, so that one test's backoffs and polls do not delay another's.
//!
//! Pause, a broken module and a failing destroy run twice, on the real provider and on the
//! fake one (in the ordinary environment: a fake beside the real provider would fight it over
//! every Workspace), and compare what CAPT reports. Each scenario prints what the Workspace
//! and CAPT reported (`--nocapture` shows it).

use anyhow::{Context, Result};
use capt_controller::api::Cluster;
use capt_controller::render::workspace_name;
use capt_controller::render::{REVISION_ANNOTATION, REVISION_OUTPUT};
use capt_tests::deletion_order::{DeletionOrder, SAMPLE_STACK};
use capt_tests::fake_provider::{
    APPLY_GATE_ANNOTATION, EXTERNAL_CREATE_PENDING, FAIL_DESTROY_ANNOTATION, OUTPUTS_ANNOTATION,
};
use capt_tests::system::{System, TRUST_TEMPLATES};
use capt_tests::{Env, env, repo_root, unique_name, with_real_provider};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// Generous: tofu init, plan and apply per Workspace, one reconcile at a time.
const WAIT: Duration = Duration::from_secs(180);

/// Which provider plays the Workspaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Provider {
    Real,
    Fake,
}

/// Which samples a [`Stack`] applies.
enum Samples {
    /// `manifests/samples/` as they are: a placeholder endpoint, no credentials.
    Plain,
    /// Pointed at the test environment's workload API server, which plays EKS
    /// (`hack/testenv.sh workload-samples`).
    Workload,
}

/// The sample Cluster, Provisioned, in a namespace of its own, with the status-applier and
/// the controller (and, on [`Provider::Fake`], the fake provider) running for it.
struct Stack {
    system: System,
}

impl Stack {
    async fn provisioned(provider: Provider, prefix: &str) -> Result<Self> {
        Self::provisioned_from(provider, prefix, Samples::Plain).await
    }

    async fn provisioned_from(provider: Provider, prefix: &str, samples: Samples) -> Result<Self> {
        with_real_provider();
        let on = match provider {
            Provider::Real => env().clone(),
            Provider::Fake => fake_env()?,
        };
        assert_eq!(
            on.real_provider,
            provider == Provider::Real,
            "{provider:?}: the environment runs the provider asked for"
        );
        let ns = unique_name(prefix);
        on.kubectl_ok(&["create", "namespace", &ns], None)?;
        let system = System::start_on(&on, &ns, 200).await?;
        let started = Instant::now();
        match samples {
            Samples::Plain => system.apply_samples(false).await?,
            Samples::Workload => system.apply_workload_samples().await?,
        }
        system
            .wait_for("Cluster phase Provisioned", WAIT, || async {
                Ok(system
                    .get(&["cluster", "demo"])?
                    .is_some_and(|c| c["status"]["phase"] == "Provisioned"))
            })
            .await?;
        println!(
            "{prefix} ({provider:?}): Provisioned in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Ok(Self { system })
    }

    fn env(&self) -> &Env {
        self.system.env()
    }

    fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.env().kubectl_ok(args, None)
    }

    fn workspace_name(&self) -> String {
        workspace_name(self.system.namespace(), "demo-controlplane")
    }

    /// The control plane's Workspace.
    fn workspace(&self) -> Result<Value> {
        self.system
            .get(&["workspaces.tf.upbound.io", &self.workspace_name()])?
            .context("the control plane's Workspace exists")
    }

    fn control_plane(&self) -> Result<Value> {
        self.system
            .get(&["captcontrolplane", "demo"])?
            .context("the control plane exists")
    }

    fn annotate_workspace(&self, annotation: &str) -> Result<()> {
        let name = self.workspace_name();
        self.kubectl(&["annotate", "workspace", &name, "--overwrite", annotation])?;
        Ok(())
    }

    /// The control plane's module as the sample has it.
    fn module(&self) -> Result<String> {
        let template = self
            .system
            .get(&["workspacetemplate", "eks"])?
            .context("the eks template")?;
        Ok(
            template["spec"]["template"]["spec"]["forProvider"]["module"]
                .as_str()
                .context("an inline module")?
                .to_owned(),
        )
    }

    fn set_module(&self, module: &str) -> Result<()> {
        self.system.patch_control_plane_template(
            &json!({"spec": {"template": {"spec": {"forProvider": {"module": module}}}}}),
        )
    }

    fn set_template_annotation(&self, key: &str, value: Option<&str>) -> Result<()> {
        self.system.patch_control_plane_template(
            &json!({"spec": {"template": {"metadata": {"annotations": {key: value}}}}}),
        )
    }

    /// Waits until the control plane has observed a Workspace that is no longer Ready and
    /// Synced (`workspaceStatus.ready` false), and returns it.
    async fn observed_not_ready(&self) -> Result<Value> {
        self.system
            .wait_for(
                "the control plane to observe the Workspace",
                WAIT,
                || async {
                    Ok(self.control_plane()?["status"]["workspaceStatus"]["ready"] == false)
                },
            )
            .await?;
        self.control_plane()
    }

    async fn delete_cluster(&self) -> Result<()> {
        Api::<Cluster>::namespaced(self.env().client().await?, self.system.namespace())
            .delete("demo", &DeleteParams::background())
            .await?;
        Ok(())
    }

    async fn wait_cluster_gone(&self) -> Result<()> {
        self.system
            .wait_for("the Cluster and its objects gone", WAIT, || async {
                Ok(self.system.get(&["cluster", "demo"])?.is_none())
            })
            .await
    }

    /// Deletes the Cluster and waits until it is gone, so that the shared provider stops
    /// polling its Workspaces.
    async fn clean_up(&self) -> Result<()> {
        self.delete_cluster().await?;
        self.wait_cluster_gone().await
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = self.env().kubectl_run(
            &[
                "delete",
                "namespace",
                self.system.namespace(),
                "--wait=false",
                "--ignore-not-found",
            ],
            None,
        );
    }
}

/// The ordinary environment (the one `hack/test.sh` runs), where the fake provider plays.
fn fake_env() -> Result<Env> {
    let dir = std::env::var("CAPT_TESTENV_DIR")
        .unwrap_or_else(|_| repo_root().join(".testenv").display().to_string());
    Env::start_in(std::path::Path::new(&dir))
}

/// `(status, reason, message)` of the condition `type_` of `obj` (empty strings when absent).
fn condition(obj: &Value, type_: &str) -> (String, String, String) {
    let c = obj["status"]["conditions"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["type"] == type_))
        .cloned()
        .unwrap_or_default();
    let text = |f: &str| c[f].as_str().unwrap_or_default().to_owned();
    (text("status"), text("reason"), text("message"))
}

/// One line of what the control plane reports: phase, ready, and its True conditions.
fn summary(cp: &Value) -> String {
    let conditions: Vec<String> = cp["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["status"] == "True")
        .map(|c| format!("{}/{}: {}", c["type"], c["reason"], c["message"]))
        .collect();
    format!(
        "phase={} ready={} workspaceStatus.ready={} conditions={conditions:?}",
        cp["status"]["phase"], cp["status"]["ready"], cp["status"]["workspaceStatus"]["ready"]
    )
}

/// What CAPT reports of a control plane, without the messages (they name the namespace):
/// compared between the two providers.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    phase: String,
    ready: bool,
    /// `(status, reason)` of Ready, Failed, Creating and Deleting.
    conditions: Vec<(String, String, String)>,
}

impl Outcome {
    fn of(cp: &Value) -> Self {
        Self {
            phase: cp["status"]["phase"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            ready: cp["status"]["ready"] == true,
            conditions: ["Ready", "Failed", "Creating", "Deleting"]
                .iter()
                .map(|t| {
                    let (status, reason, _) = condition(cp, t);
                    (t.to_string(), status, reason)
                })
                .collect(),
        }
    }

    fn condition(&self, type_: &str) -> (&str, &str) {
        self.conditions
            .iter()
            .find(|(t, _, _)| t == type_)
            .map(|(_, s, r)| (s.as_str(), r.as_str()))
            .unwrap_or_default()
    }
}

/// The kubernetes backend's state Secrets of `system`'s Workspaces.
fn state_secrets(system: &System) -> Result<Vec<String>> {
    let names = system.env().kubectl_ok(
        &["get", "secrets", "-n", "crossplane-system", "-o", "name"],
        None,
    )?;
    let ours = [
        workspace_name(system.namespace(), "demo-controlplane"),
        workspace_name(system.namespace(), "demo-vpc"),
    ];
    Ok(names
        .lines()
        .filter(|n| ours.iter().any(|w| n.contains(w.as_str())))
        .map(str::to_owned)
        .collect())
}

/// Deletes the Cluster and waits until everything is gone: the order as the API server
/// recorded it.
async fn delete_in_order(stack: &Stack) -> Result<DeletionOrder> {
    let client = stack.env().client().await?;
    let order = DeletionOrder::of_sample_stack(&client, stack.system.namespace()).await?;
    stack.delete_cluster().await?;
    order.wait_gone(&SAMPLE_STACK, WAIT).await?;
    Ok(order)
}

#[tokio::test]
async fn provisions_updates_and_deletes_in_order() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let stack = Stack::provisioned(Provider::Real, "real-up").await?;
    let system = &stack.system;
    let cp = stack.control_plane()?;
    println!("provisioned: {}", summary(&cp));
    let outputs = &cp["status"]["workspaceStatus"]["atProvider"]["outputs"];
    // The EKS name Terraform got, and so the made-up host, carry the namespace.
    let ns = system.namespace();
    let host = capt_tests::sample_endpoint_host(ns, "demo");
    assert_eq!(
        outputs["cluster_endpoint"],
        format!("https://{host}"),
        "{outputs}"
    );
    assert_eq!(outputs["cluster_name"], capt_tests::eks_name(ns, "demo"));
    assert_eq!(outputs["kubernetes_version"], "1.31", "{outputs}");
    assert!(
        outputs.get("kubeconfig").is_none(),
        "sensitive: not in atProvider"
    );
    assert_eq!(cp["status"]["phase"], "Ready");
    assert_eq!(
        cp["spec"]["controlPlaneEndpoint"],
        json!({"host": host, "port": 443})
    );
    let cc = system
        .get(&["captcluster", "demo"])?
        .context("captcluster")?;
    assert_eq!(
        cc["status"]["vpcId"],
        format!("vpc-{}", capt_tests::eks_name(ns, "demo"))
    );
    let ws = stack.workspace()?;
    assert_eq!(condition(&ws, "Ready").1, "Available");
    assert!(ws["status"]["atProvider"]["checksum"].is_string(), "{ws}");
    // The sensitive output reached the Cluster's kubeconfig Secret (its value not printed).
    let kubeconfig = system
        .get(&["secret", "demo-kubeconfig"])?
        .context("the Cluster's kubeconfig Secret")?;
    assert!(kubeconfig["data"]["value"].is_string());
    assert_eq!(
        state_secrets(system)?.len(),
        2,
        "one state Secret per Workspace"
    );

    // An update: a new Kubernetes version is a new value of the module's variable; tofu
    // applies it and the new output reaches the control plane.
    let started = Instant::now();
    stack.kubectl(&[
        "patch",
        "-n",
        stack.system.namespace(),
        "captcontrolplane",
        "demo",
        "-n",
        system.namespace(),
        "--type=merge",
        "-p",
        r#"{"spec":{"version":"1.32"}}"#,
    ])?;
    let seen = std::sync::Mutex::new(Vec::<String>::new());
    system
        .wait_for("the new output on the control plane", WAIT, || async {
            let cp = stack.control_plane()?;
            let ws = stack.workspace()?;
            let now = format!(
                "{} | Workspace Ready={:?} Synced={:?}",
                summary(&cp),
                condition(&ws, "Ready").1,
                condition(&ws, "Synced").1
            );
            let mut seen = seen.lock().unwrap();
            if seen.last() != Some(&now) {
                seen.push(now);
            }
            Ok(
                cp["status"]["workspaceStatus"]["atProvider"]["outputs"]["kubernetes_version"]
                    == "1.32"
                    && cp["status"]["phase"] == "Ready",
            )
        })
        .await?;
    println!(
        "update: new output after {:.1} s; seen:\n  {}",
        started.elapsed().as_secs_f64(),
        seen.lock().unwrap().join("\n  ")
    );
    let cp = stack.control_plane()?;
    assert_eq!(cp["status"]["version"], "1.32", "{}", cp["status"]);

    // Deletion: the control plane's Workspace first, the VPC's after, the state with them.
    let t = delete_in_order(&stack).await?;
    let t_seen = t.seen();
    println!("deletion: {t_seen:?}");
    assert!(t.gone("cp-workspace") <= t.gone("cp-apply"), "{t_seen:?}");
    assert!(
        t.gone("cp-apply") <= t.gone("captcontrolplane"),
        "{t_seen:?}"
    );
    assert!(
        t.gone("captcontrolplane") <= t.deleting("vpc-apply"),
        "{t_seen:?}"
    );
    assert!(
        t.gone("vpc-workspace") <= t.gone("captcluster"),
        "{t_seen:?}"
    );
    assert!(t.gone("captcluster") <= t.gone("cluster"), "{t_seen:?}");
    assert_eq!(
        state_secrets(system)?,
        Vec::<String>::new(),
        "destroyed, state gone"
    );
    Ok(())
}

/// Pauses the control plane's Workspace (`crossplane.io/paused: "true"`, the same on both
/// providers), returns what CAPT reports, and unpauses it.
async fn pause(provider: Provider) -> Result<Outcome> {
    let stack = Stack::provisioned(provider, "real-pause").await?;
    stack.annotate_workspace("crossplane.io/paused=true")?;
    stack
        .system
        .wait_for("Synced=False ReconcilePaused", WAIT, || async {
            Ok(condition(&stack.workspace()?, "Synced").1 == "ReconcilePaused")
        })
        .await?;
    let ws = stack.workspace()?;
    println!(
        "paused ({provider:?}): Workspace Synced={:?} Ready={:?}",
        condition(&ws, "Synced"),
        condition(&ws, "Ready")
    );
    assert_eq!(
        condition(&ws, "Ready").0,
        "True",
        "the provider keeps Ready"
    );
    let cp = stack.observed_not_ready().await?;
    println!("paused ({provider:?}): CAPT reports {}", summary(&cp));
    let outcome = Outcome::of(&cp);

    stack.annotate_workspace("crossplane.io/paused-")?;
    stack
        .system
        .wait_for("Synced=True and Ready again", WAIT, || async {
            Ok(condition(&stack.workspace()?, "Synced").0 == "True"
                && stack.control_plane()?["status"]["workspaceStatus"]["ready"] == true)
        })
        .await?;
    stack.clean_up().await?;
    Ok(outcome)
}

#[tokio::test]
async fn a_paused_workspace_keeps_a_ready_control_plane_ready_on_both_providers() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let real = pause(Provider::Real).await?;
    let fake = pause(Provider::Fake).await?;
    assert_eq!(real, fake, "CAPT reports the same on both");
    assert_eq!(real.phase, "Ready", "{real:?}");
    assert_eq!(real.condition("Ready"), ("True", "WorkspacePaused"));
    assert_eq!(real.condition("Failed").0, "False");
    assert_eq!(real.condition("Creating").0, "False");
    Ok(())
}

/// Breaks the control plane's module so that its plan fails (on the fake: input it cannot
/// use, its `observe failed`), returns what CAPT reports, and repairs it.
async fn broken_module(provider: Provider) -> Result<Outcome> {
    let stack = Stack::provisioned(provider, "real-broken").await?;
    let module = stack.module()?;
    let outputs = stack
        .system
        .get(&["workspacetemplate", "eks"])?
        .context("the eks template")?["spec"]["template"]["metadata"]["annotations"]
        [OUTPUTS_ANNOTATION]
        .as_str()
        .map(str::to_owned);
    match provider {
        Provider::Real => {
            stack.set_module(&format!(
                "{module}output \"broken\" {{ value = local.missing }}\n"
            ))?;
        }
        Provider::Fake => stack.set_template_annotation(OUTPUTS_ANNOTATION, Some("{"))?,
    }
    stack
        .system
        .wait_for("observe failed: cannot diff", WAIT, || async {
            let (status, _, message) = condition(&stack.workspace()?, "Synced");
            Ok(status == "False" && message.contains("observe failed: cannot diff"))
        })
        .await?;
    let ws = stack.workspace()?;
    println!(
        "broken module ({provider:?}): Workspace Synced={:?} Ready={:?}",
        condition(&ws, "Synced"),
        condition(&ws, "Ready")
    );
    assert_eq!(
        condition(&ws, "Ready").1,
        "Available",
        "the provider keeps Ready (stale)"
    );
    let cp = stack.observed_not_ready().await?;
    println!(
        "broken module ({provider:?}): CAPT reports {}",
        summary(&cp)
    );
    assert!(
        condition(&cp, "Ready").2.contains("observe failed"),
        "the provider's message is shown: {}",
        summary(&cp)
    );
    let outcome = Outcome::of(&cp);

    match provider {
        Provider::Real => stack.set_module(&module)?,
        Provider::Fake => stack.set_template_annotation(OUTPUTS_ANNOTATION, outputs.as_deref())?,
    }
    stack
        .system
        .wait_for("Ready again", WAIT, || async {
            let cp = stack.control_plane()?;
            Ok(cp["status"]["workspaceStatus"]["ready"] == true
                && condition(&cp, "Ready").1 == "ControlPlaneReady")
        })
        .await?;
    stack.clean_up().await?;
    Ok(outcome)
}

#[tokio::test]
async fn a_broken_module_on_a_ready_workspace_is_degraded_not_failed_on_both_providers()
-> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let real = broken_module(Provider::Real).await?;
    let fake = broken_module(Provider::Fake).await?;
    assert_eq!(real, fake, "CAPT reports the same on both");
    assert_eq!(real.phase, "Ready", "{real:?}");
    assert!(real.ready);
    assert_eq!(real.condition("Ready"), ("True", "WorkspaceDegraded"));
    assert_eq!(real.condition("Failed").0, "False");
    Ok(())
}

/// Makes the control plane's destroy fail (the real one: a resource whose destroy
/// provisioner fails until a file exists; the fake one: its annotation), deletes the Cluster,
/// returns what CAPT reports meanwhile, then lets the destroy succeed.
async fn failing_destroy(provider: Provider) -> Result<Outcome> {
    let stack = Stack::provisioned(provider, "real-destroy").await?;
    let dir = std::env::temp_dir().join(unique_name("real-destroy"));
    std::fs::create_dir_all(&dir)?;
    let allow = dir.join("allow");
    match provider {
        Provider::Real => {
            let module = stack.module()?;
            stack.set_module(&format!(
                "{module}resource \"terraform_data\" \"destroy_guard\" {{\n  provisioner \"local-exec\" {{\n    when    = destroy\n    command = \"test -e {} || {{ echo 'destroy refused by the test' >&2; exit 1; }}\"\n  }}\n}}\noutput \"destroy_guard\" {{ value = terraform_data.destroy_guard.id }}\n",
                allow.display()
            ))?;
            stack
                .system
                .wait_for("the guard applied", WAIT, || async {
                    Ok(stack.control_plane()?["status"]["workspaceStatus"]["atProvider"]
                        ["outputs"]["destroy_guard"]
                        .is_string())
                })
                .await?;
        }
        Provider::Fake => {
            stack.set_template_annotation(
                FAIL_DESTROY_ANNOTATION,
                Some("local-exec provisioner error: destroy refused by the test"),
            )?;
            stack
                .system
                .wait_for("the Workspace to carry the annotation", WAIT, || async {
                    Ok(
                        stack.workspace()?["metadata"]["annotations"][FAIL_DESTROY_ANNOTATION]
                            .is_string(),
                    )
                })
                .await?;
        }
    }
    stack.delete_cluster().await?;
    stack
        .system
        .wait_for("delete failed on the Workspace", WAIT, || async {
            let (status, _, message) = condition(&stack.workspace()?, "Synced");
            Ok(status == "False" && message.contains("delete failed"))
        })
        .await?;
    let ws = stack.workspace()?;
    println!(
        "failing destroy ({provider:?}): Workspace Synced={:?} Ready={:?}",
        condition(&ws, "Synced"),
        condition(&ws, "Ready")
    );
    assert_eq!(condition(&ws, "Ready").1, "Deleting");
    // What CAPT shows meanwhile: the provider's reason, where a user looks.
    let last = std::sync::Mutex::new(String::new());
    let shown = stack
        .system
        .wait_for(
            "the control plane to show the failed destroy",
            Duration::from_secs(30),
            || async {
                let cp = stack.control_plane()?;
                *last.lock().unwrap() = summary(&cp);
                Ok(condition(&cp, "Deleting").2.contains("delete failed"))
            },
        )
        .await;
    println!(
        "failing destroy ({provider:?}): CAPT reports {}",
        last.lock().unwrap()
    );
    let outcome = Outcome::of(&stack.control_plane()?);

    match provider {
        Provider::Real => std::fs::write(&allow, "")?,
        Provider::Fake => stack.annotate_workspace(&format!("{FAIL_DESTROY_ANNOTATION}-"))?,
    }
    // A change of the Workspace's annotations wakes the provider at once (no backoff wait).
    stack.annotate_workspace("capt.test/retry=1")?;
    stack.wait_cluster_gone().await?;
    if provider == Provider::Real {
        assert_eq!(state_secrets(&stack.system)?, Vec::<String>::new());
    }
    // Only now: the destroy reads the file until it ends.
    std::fs::remove_dir_all(&dir)?;
    shown?;
    Ok(outcome)
}

#[tokio::test]
async fn a_failing_destroy_is_shown_while_deleting_and_finishes_once_fixed_on_both_providers()
-> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let real = failing_destroy(Provider::Real).await?;
    let fake = failing_destroy(Provider::Fake).await?;
    assert_eq!(real, fake, "CAPT reports the same on both");
    assert_eq!(real.condition("Deleting"), ("True", "WaitingForWorkspace"));
    Ok(())
}

/// Creates the gate file when dropped.
struct Release(std::path::PathBuf);

impl Drop for Release {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, "");
    }
}

/// What the control plane shows while an update is being applied, and when the update is
/// proven applied.
#[derive(Debug, PartialEq, Eq)]
struct HeldUpdate {
    /// While Terraform applies it (the Workspace still `Ready=True Available`).
    during: Outcome,
    during_version: String,
    /// Once the module's `capt_revision` output equals the revision rendered.
    after: Outcome,
    after_version: String,
}

/// `spec.version` 1.31 → 1.32 with the apply held (the real one: a `terraform_data` whose
/// create provisioner waits for a file named after the version; the fake one: its apply-gate
/// annotation): the Workspace stays `Ready=True Available` throughout, as provider-terraform
/// keeps it, so only the revision output tells an applied update from one in progress.
async fn held_update(provider: Provider) -> Result<HeldUpdate> {
    let stack = Stack::provisioned(provider, "real-held").await?;
    let system = &stack.system;
    assert_eq!(stack.control_plane()?["status"]["version"], "1.31");
    let dir = std::env::temp_dir().join(unique_name("real-held"));
    std::fs::create_dir_all(&dir)?;
    let gate = |version: &str| dir.join(format!("gate-{version}"));
    // Whatever happens, the held apply ends: a held one would keep the shared provider's
    // worker (and the namespace's deletion) waiting.
    let _release = Release(gate("1.32"));
    match provider {
        Provider::Real => {
            std::fs::write(gate("1.31"), "")?;
            let module = stack.module()?;
            stack.set_module(&format!(
                "{module}resource \"terraform_data\" \"apply_gate\" {{\n  triggers_replace = var.kubernetes_version\n  provisioner \"local-exec\" {{\n    command = \"while [ ! -e {}/gate-${{var.kubernetes_version}} ]; do sleep 0.1; done\"\n  }}\n}}\noutput \"apply_gate\" {{ value = terraform_data.apply_gate.id }}\n",
                dir.display()
            ))?;
            system
                .wait_for("the gate applied", WAIT, || async {
                    let cp = stack.control_plane()?;
                    Ok(
                        cp["status"]["workspaceStatus"]["atProvider"]["outputs"]["apply_gate"]
                            .is_string()
                            && condition(&cp, "Ready").1 == "ControlPlaneReady",
                    )
                })
                .await?;
        }
        Provider::Fake => {
            let held = gate("1.32");
            stack.annotate_workspace(&format!("{APPLY_GATE_ANNOTATION}={}", held.display()))?;
        }
    }
    stack.kubectl(&[
        "patch",
        "-n",
        stack.system.namespace(),
        "captcontrolplane",
        "demo",
        "-n",
        system.namespace(),
        "--type=merge",
        "-p",
        r#"{"spec":{"version":"1.32"}}"#,
    ])?;
    // The new rendering is on the Workspace, its apply held: what the control plane says.
    let last = std::sync::Mutex::new(String::new());
    system
        .wait_for(
            "the control plane to show the update in progress",
            WAIT,
            || async {
                let cp = stack.control_plane()?;
                let seen = format!("{} version={}", summary(&cp), cp["status"]["version"]);
                *last.lock().unwrap() = seen;
                Ok(condition(&cp, "Ready")
                    .2
                    .contains("has not applied revision"))
            },
        )
        .await
        .with_context(|| format!("last seen: {}", last.lock().unwrap()))?;
    let ws = stack.workspace()?;
    let rendered = ws["metadata"]["annotations"][REVISION_ANNOTATION].clone();
    println!(
        "held update ({provider:?}): Workspace Ready={:?} Synced={:?} rendered {rendered} applied {}",
        condition(&ws, "Ready"),
        condition(&ws, "Synced"),
        ws["status"]["atProvider"]["outputs"][REVISION_OUTPUT]
    );
    assert_eq!(
        (
            condition(&ws, "Ready").0.as_str(),
            condition(&ws, "Synced").0.as_str()
        ),
        ("True", "True"),
        "the provider reports Ready and Synced while applying"
    );
    assert_ne!(
        ws["status"]["atProvider"]["outputs"][REVISION_OUTPUT],
        rendered
    );
    let cp = stack.control_plane()?;
    println!(
        "held update ({provider:?}): CAPT reports {} version={}",
        summary(&cp),
        cp["status"]["version"]
    );
    let during = Outcome::of(&cp);
    let during_version = cp["status"]["version"]
        .as_str()
        .unwrap_or_default()
        .to_owned();

    std::fs::write(gate("1.32"), "")?;
    system
        .wait_for("status.version 1.32", WAIT, || async {
            Ok(stack.control_plane()?["status"]["version"] == "1.32")
        })
        .await?;
    let cp = stack.control_plane()?;
    let ws = stack.workspace()?;
    println!("applied ({provider:?}): CAPT reports {}", summary(&cp));
    assert_eq!(
        ws["status"]["atProvider"]["outputs"][REVISION_OUTPUT],
        ws["metadata"]["annotations"][REVISION_ANNOTATION],
        "the version follows the proof"
    );
    assert_eq!(
        cp["status"]["workspaceStatus"]["atProvider"]["outputs"]["kubernetes_version"],
        "1.32"
    );
    let after = Outcome::of(&cp);
    let after_version = cp["status"]["version"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    stack.clean_up().await?;
    // Only now: the gates are read by the provider's apply until it ends.
    std::fs::remove_dir_all(&dir)?;
    Ok(HeldUpdate {
        during,
        during_version,
        after,
        after_version,
    })
}

#[tokio::test]
async fn the_version_follows_the_proof_that_the_update_was_applied_on_both_providers() -> Result<()>
{
    let _turn = ONE_AT_A_TIME.lock().await;
    let real = held_update(Provider::Real).await?;
    let fake = held_update(Provider::Fake).await?;
    assert_eq!(real, fake, "CAPT reports the same on both");
    assert_eq!(real.during_version, "1.31", "not proven while applying");
    assert_eq!(real.during.phase, "Ready", "{real:?}");
    assert_eq!(
        real.during.condition("Ready"),
        ("True", "WorkspaceUpdating")
    );
    assert_eq!(real.during.condition("Failed").0, "False");
    assert_eq!(real.after_version, "1.32");
    assert_eq!(real.after.condition("Ready"), ("True", "ControlPlaneReady"));
    Ok(())
}

/// A provider that stops mid-apply (a crash, a restart) leaves
/// `crossplane.io/external-create-pending` later than any recorded result; crossplane-runtime
/// then refuses to go on (`Synced=False "cannot determine creation result …"`) until a person
/// removes it. The real provider cannot be made to crash on demand here, so the stand-in
/// plays what that annotation makes the managed reconciler do; the annotation is written as
/// the crash leaves it, with the provider's restart (a change it wakes on). CAPT fails the
/// control plane with its own reason, says what to do in the condition and a Warning Event,
/// and doing what it says brings the control plane back.
#[tokio::test]
async fn a_create_left_pending_by_a_crash_tells_an_operator_what_to_do() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let stack = Stack::provisioned(Provider::Fake, "fake-crash").await?;
    let system = &stack.system;
    let pending_since = capt_tests::fake_provider::now();
    stack.annotate_workspace(&format!("{EXTERNAL_CREATE_PENDING}={pending_since}"))?;
    stack.annotate_workspace("capt.test/provider-restarted=1")?;
    system
        .wait_for("the control plane to need an operator", WAIT, || async {
            Ok(condition(&stack.control_plane()?, "Failed").1 == "WorkspaceNeedsOperator")
        })
        .await?;
    let ws = stack.workspace()?;
    let (_, _, provider_says) = condition(&ws, "Synced");
    assert!(
        provider_says.starts_with("cannot determine creation result"),
        "{provider_says}"
    );
    assert_eq!(condition(&ws, "Ready").1, "Creating");
    let cp = stack.control_plane()?;
    println!("crash: CAPT reports {}", summary(&cp));
    assert_eq!(cp["status"]["phase"], "Failed");
    let (status, _, message) = condition(&cp, "Failed");
    assert_eq!(status, "True");
    let command = message
        .split_once("kubectl annotate")
        .and_then(|(_, rest)| rest.split_once(" --overwrite"))
        .map(|(args, _)| args.to_owned())
        .with_context(|| format!("a command in the message: {message}"))?;
    // The Warning Event on the control plane says the same.
    let events: Value = serde_json::from_str(&stack.kubectl(&[
        "get",
        "events",
        "-n",
        system.namespace(),
        "-o",
        "json",
    ])?)?;
    let event = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| {
            e["reason"] == "WorkspaceNeedsOperator"
                && e["involvedObject"]["kind"] == "CAPTControlPlane"
        })
        .context("a WorkspaceNeedsOperator Event on the control plane")?;
    assert_eq!(event["type"], "Warning");
    assert!(
        event["message"]
            .as_str()
            .is_some_and(|m| m.contains(&command)),
        "{event}"
    );

    // What the message says to do, as an operator would run it.
    let args: Vec<String> = command
        .replace("\"$(date +%s)\"", "1")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let mut kubectl = vec!["annotate".to_owned()];
    kubectl.extend(args);
    kubectl.push("--overwrite".into());
    stack.kubectl(&kubectl.iter().map(String::as_str).collect::<Vec<_>>())?;
    system
        .wait_for("the control plane Ready again", WAIT, || async {
            Ok(condition(&stack.control_plane()?, "Ready").1 == "ControlPlaneReady")
        })
        .await?;
    assert_eq!(stack.control_plane()?["status"]["phase"], "Ready");
    stack.clean_up().await?;
    Ok(())
}

/// An operator patches the control plane's Workspace to `deletionPolicy: Orphan`. The field is
/// the operator's (CAPT renders no `deletionPolicy` its template does not name): CAPT leaves it,
/// also when the Workspace changes next (a new revision reaches it), and deleting the Cluster
/// then drops the Workspace without destroying anything (on the real provider: its Terraform
/// state Secrets stay, removed here afterwards). Returns the policy the Workspace had when the
/// deletion started.
async fn orphan_patched(provider: Provider) -> Result<String> {
    let stack = Stack::provisioned(provider, "real-orphan").await?;
    let name = stack.workspace_name();
    stack.kubectl(&[
        "patch",
        "workspace",
        &name,
        "--type=merge",
        "-p",
        r#"{"spec":{"deletionPolicy":"Orphan"}}"#,
    ])?;
    // A real change (the Kubernetes version) renders the Workspace anew: the controller has
    // acted since the patch.
    let generation = stack.workspace()?["metadata"]["generation"].as_i64();
    stack.kubectl(&[
        "patch",
        "-n",
        stack.system.namespace(),
        "captcontrolplane",
        "demo",
        "--type=merge",
        "-p",
        r#"{"spec":{"version":"1.32"}}"#,
    ])?;
    stack
        .system
        .wait_for(
            "the control plane's Workspace rendered anew",
            WAIT,
            || async { Ok(stack.workspace()?["metadata"]["generation"].as_i64() > generation) },
        )
        .await?;
    let policy = stack.workspace()?["spec"]["deletionPolicy"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    println!("orphan ({provider:?}): deletionPolicy {policy} after a new rendering");
    stack.clean_up().await?;
    if provider == Provider::Real {
        let kept = state_secrets(&stack.system)?;
        let control_plane = workspace_name(stack.system.namespace(), "demo-controlplane");
        assert!(
            kept.iter().any(|s| s.contains(&control_plane)),
            "orphaned, its state kept: {kept:?}"
        );
        let mut args = vec!["delete", "-n", "crossplane-system"];
        args.extend(kept.iter().map(String::as_str));
        stack.system.env().kubectl_ok(&args, None)?;
    }
    Ok(policy)
}

#[tokio::test]
async fn a_workspace_an_operator_set_to_orphan_keeps_it_and_is_orphaned_on_both_providers()
-> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let real = orphan_patched(Provider::Real).await?;
    let fake = orphan_patched(Provider::Fake).await?;
    assert_eq!(real, fake);
    assert_eq!(real, "Orphan");
    Ok(())
}

/// provider-terraform puts Terraform's whole error, gzipped and base64-encoded, in the
/// Workspace's `Synced` message ("To see the full error run: echo …"); a `local-exec` error
/// carries its command with a variable's value, here one read from a Secret and declared
/// `sensitive`. CAPT's conditions, its apply's mirrored conditions and its Events carry the
/// provider's summary without that blob, so the value is nowhere CAPT writes.
#[tokio::test]
async fn a_terraform_error_carrying_a_secret_value_is_not_copied_by_capt() -> Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let stack = Stack::provisioned(Provider::Real, "real-leak").await?;
    let system = &stack.system;
    let ns = system.namespace().to_owned();
    const PASSWORD: &str = "hunter2-never-copied";
    stack.kubectl(&[
        "create",
        "secret",
        "generic",
        "db",
        "-n",
        &ns,
        &format!("--from-literal=vars.json={{\"db_password\":\"{PASSWORD}\"}}"),
    ])?;
    let module = stack.module()?;
    system.patch_control_plane_template(&json!({"spec": {"template": {"spec": {"forProvider": {
        "module": format!("{module}variable \"db_password\" {{\n  type      = string\n  sensitive = true\n}}\nresource \"terraform_data\" \"uses_secret\" {{\n  provisioner \"local-exec\" {{\n    command = \"echo connecting with ${{var.db_password}}; exit 1\"\n  }}\n}}\n"),
        "varFiles": [{"source": "SecretKey", "format": "JSON",
                      "secretKeyRef": {"namespace": ns, "name": "db", "key": "vars.json"}}],
    }}}}}))?;
    system
        .wait_for(
            "the control plane to show the failed apply",
            WAIT,
            || async {
                Ok(condition(&stack.control_plane()?, "Failed")
                    .2
                    .contains("local-exec provisioner error"))
            },
        )
        .await?;
    let (_, _, provider_says) = condition(&stack.workspace()?, "Synced");
    assert!(
        provider_says.contains("To see the full error run: echo"),
        "the premise: the provider writes the blob: {provider_says}"
    );
    let cp = stack.control_plane()?;
    println!("leak: CAPT reports {}", summary(&cp));
    let apply = system
        .get(&["workspacetemplateapply", "demo-controlplane"])?
        .context("the apply")?;
    let events = stack.kubectl(&["get", "events", "-n", &ns, "-o", "json"])?;
    for (what, text) in [
        ("control plane", cp.to_string()),
        ("apply", apply.to_string()),
        ("events", events),
    ] {
        assert!(!text.contains(PASSWORD), "{what}: {text}");
        assert!(
            !text.contains("H4sI"),
            "{what} carries the encoded error: {text}"
        );
    }
    system.patch_control_plane_template(&json!({"spec": {"template": {"spec": {"forProvider": {
        "module": module, "varFiles": null}}}}}))?;
    stack.clean_up().await?;
    Ok(())
}

/// The kubeconfig scenario on the real provider: the sample EKS module, applied by OpenTofu,
/// outputs the workload API server's endpoint, CA and token (the token sensitive, so only in
/// the Workspace's connection Secret); the controller writes the `<cluster>-kubeconfig`
/// Secret from them, and Cluster API core connects with it: the Cluster's
/// `RemoteConnectionProbe` and `Available` turn True. The token is in no log of CAPT's.
#[tokio::test]
async fn the_kubeconfig_from_the_real_providers_outputs_lets_core_reach_the_cluster() -> Result<()>
{
    let _turn = ONE_AT_A_TIME.lock().await;
    let stack =
        Stack::provisioned_from(Provider::Real, "real-kubeconfig", Samples::Workload).await?;
    let system = &stack.system;
    let secrets: Api<Secret> = Api::namespaced(stack.env().client().await?, system.namespace());
    let secret = secrets.get("demo-kubeconfig").await?;
    let value = secret.data.as_ref().and_then(|d| d.get("value"));
    let config: Value = serde_yaml::from_slice(&value.context("data.value")?.0)?;
    let user = &config["users"][0]["user"];
    assert!(user["token"].is_string(), "a bearer token");
    assert!(
        user.get("exec").is_none(),
        "no exec plugin (core runs none)"
    );

    let started = Instant::now();
    system
        .wait_for(
            "the Cluster's RemoteConnectionProbe and Available conditions True",
            WAIT,
            || async {
                let cluster = system.get(&["clusters.v1beta2.cluster.x-k8s.io", "demo"])?;
                Ok(cluster.is_some_and(|c| {
                    ["RemoteConnectionProbe", "Available"]
                        .iter()
                        .all(|t| condition(&c, t).0 == "True")
                }))
            },
        )
        .await?;
    println!(
        "RemoteConnectionProbe and Available True {:.1} s after Provisioned",
        started.elapsed().as_secs_f64()
    );

    let token = user["token"].as_str().unwrap_or_default();
    for (who, log) in [
        ("capt-controller", system.controller_log_text()),
        ("status-applier", system.applier.log_text()),
    ] {
        assert!(!log.contains(token), "the token is in the {who} log");
    }
    stack.clean_up().await
}

/// A namespace of the real environment, deleted (without waiting) on drop.
struct Namespace(String);

impl Namespace {
    fn create(prefix: &str) -> Result<Self> {
        let name = unique_name(prefix);
        env().kubectl_ok(&["create", "namespace", &name], None)?;
        Ok(Self(name))
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let args = [
            "delete",
            "namespace",
            &self.0,
            "--wait=false",
            "--ignore-not-found",
        ];
        let _ = env().kubectl_run(&args, None);
    }
}

/// A WorkspaceTemplate `name` in `namespace` whose Workspace spec is `spec`.
fn template_doc(namespace: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"template": {"spec": spec}},
    })
}

/// A WorkspaceTemplateApply `name` in `namespace`, its spec `spec`.
fn apply_doc(namespace: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "WorkspaceTemplateApply",
        "metadata": {"name": name, "namespace": namespace}, "spec": spec,
    })
}

fn apply_docs(docs: &[Value]) -> Result<()> {
    let text: Vec<String> = docs.iter().map(Value::to_string).collect();
    env().kubectl_ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&text.join("\n")),
    )?;
    Ok(())
}

/// The string data of the Secret `namespace`/`name`, if it exists.
async fn secret_strings(namespace: &str, name: &str) -> Result<Option<Vec<(String, String)>>> {
    let secrets: Api<Secret> = Api::namespaced(env().client().await?, namespace);
    Ok(secrets.get_opt(name).await?.map(|s| {
        s.data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect()
    }))
}

/// Whether the Workspace `name` is Ready.
fn workspace_ready(system: &System, name: &str) -> Result<bool> {
    Ok(system
        .get(&["workspaces.tf.upbound.io", name])?
        .is_some_and(|w| condition(&w, "Ready").0 == "True"))
}

/// Deletes the apply `namespace`/`name` and waits until its Workspace is gone (destroyed).
async fn delete_apply(system: &System, namespace: &str, name: &str) -> Result<()> {
    env().kubectl_ok(
        &[
            "delete",
            "workspacetemplateapply",
            name,
            "-n",
            namespace,
            "--wait=false",
        ],
        None,
    )?;
    let workspace = workspace_name(namespace, name);
    system
        .wait_for("the Workspace destroyed", WAIT, || async {
            Ok(system
                .get(&["workspaces.tf.upbound.io", &workspace])?
                .is_none())
        })
        .await
}

/// A tenant's values are values of Terraform variables: a CIDR, an IAM role ARN, a list of
/// zones and a tag with spaces and quotes, each of which the plain-literal rule refused, reach
/// the platform's module (a trusted namespace's template) through `forProvider.vars` and come
/// back verbatim as its outputs, in the connection Secret.
#[tokio::test]
async fn a_stack_whose_variables_are_a_cidr_an_arn_and_a_list_of_zones_gets_them_verbatim()
-> Result<()> {
    with_real_provider();
    let _turn = ONE_AT_A_TIME.lock().await;
    let tenant = Namespace::create("values")?;
    let platform = Namespace::create("values-platform")?;
    let system =
        System::start_with(&tenant.0, 200, &[TRUST_TEMPLATES, platform.0.as_str()]).await?;
    let names = ["cidr", "role_arn", "zones", "tag"];
    let module: String = names
        .iter()
        .map(|n| {
            format!("variable \"{n}\" {{ type = string }}\noutput \"{n}\" {{ value = var.{n} }}\n")
        })
        .collect();
    let vars: Vec<Value> = names
        .iter()
        .map(|n| json!({"key": n, "value": format!("${{{}}}", n.to_uppercase())}))
        .collect();
    let values = [
        ("CIDR", "10.0.0.0/16"),
        ("ROLE_ARN", "arn:aws:iam::123456789012:role/eks"),
        ("ZONES", "ap-northeast-1a,ap-northeast-1c"),
        ("TAG", "cost center \"42\" } # not code"),
    ];
    let variables: serde_json::Map<String, Value> = values
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    apply_docs(&[
        template_doc(
            &platform.0,
            "net",
            json!({"forProvider": {"source": "Inline", "module": module, "vars": vars}}),
        ),
        apply_doc(
            &tenant.0,
            "net",
            json!({"templateRef": {"name": "net", "namespace": platform.0},
                   "variables": variables,
                   "writeConnectionSecretToRef": {"name": "net-outputs", "namespace": tenant.0}}),
        ),
    ])?;
    let workspace = workspace_name(&tenant.0, "net");
    system
        .wait_for("the Workspace Ready", WAIT, || async {
            workspace_ready(&system, &workspace)
        })
        .await?;
    let outputs = secret_strings(&tenant.0, "net-outputs")
        .await?
        .context("the connection Secret")?;
    for (key, value) in values {
        let name = key.to_lowercase();
        let got = outputs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str());
        assert_eq!(got, Some(value), "output {name}");
    }
    println!("outputs: {outputs:?}");
    delete_apply(&system, &tenant.0, "net").await
}

/// Probe: the loot template. A tenant's own template lists (`fileset`) and reads (`file`)
/// the directories of the other Workspaces the one provider-terraform runs beside it, each
/// with its ProviderConfig's credential files (here the backend's kubeconfig, an
/// administrator's). Refused under the defaults: the tenant's namespace is not trusted with
/// code (`TemplateNotTrusted`), and nothing runs. Before the fix it ran, and its connection
/// Secret listed the neighbour's files (names printed, never their contents; the bytes read
/// are counted).
#[tokio::test]
async fn probe_a_tenants_template_cannot_list_or_read_its_neighbours_files() -> Result<()> {
    with_real_provider();
    let _turn = ONE_AT_A_TIME.lock().await;
    let victim = Namespace::create("loot-victim")?;
    let tenant = Namespace::create("loot-tenant")?;
    let platform = Namespace::create("loot-platform")?;
    let trust = [TRUST_TEMPLATES, platform.0.as_str()];
    let victim_system = System::start_with(&victim.0, 200, &trust).await?;
    let system = System::start_with(&tenant.0, 200, &trust).await?;
    // A neighbour: the victim's stack, of the platform's template, on the same provider.
    apply_docs(&[
        template_doc(
            &platform.0,
            "plain",
            json!({"forProvider": {"source": "Inline", "module": "output \"x\" { value = \"v\" }\n"}}),
        ),
        apply_doc(
            &victim.0,
            "vpc",
            json!({"templateRef": {"name": "plain", "namespace": platform.0}}),
        ),
    ])?;
    let neighbour = workspace_name(&victim.0, "vpc");
    victim_system
        .wait_for("the neighbour's Workspace Ready", WAIT, || async {
            workspace_ready(&victim_system, &neighbour)
        })
        .await?;
    let neighbour_uid = victim_system
        .get(&["workspaces.tf.upbound.io", &neighbour])?
        .context("the neighbour")?["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();

    let loot = r#"locals {
  tf    = abspath("${path.module}/..")
  found = sort(fileset(local.tf, "*/*"))
}
output "neighbours" { value = join(",", local.found) }
output "bytes_read" {
  value = join(",", [for f in local.found : tostring(length(file("${local.tf}/${f}"))) if endswith(f, "kubeconfig")])
}
"#;
    apply_docs(&[
        template_doc(
            &tenant.0,
            "loot",
            json!({"forProvider": {"source": "Inline", "module": loot}}),
        ),
        apply_doc(
            &tenant.0,
            "loot",
            json!({"templateRef": {"name": "loot"},
                   "writeConnectionSecretToRef": {"name": "loot", "namespace": tenant.0}}),
        ),
    ])?;
    let refused = || -> Result<bool> {
        let apply = system.get(&["workspacetemplateapply", "loot"])?;
        Ok(apply.is_some_and(|a| condition(&a, "Applied").1 == "TemplateNotTrusted"))
    };
    // The connection Secret is written with the outputs once Terraform applied.
    let looted = || async {
        let outputs = secret_strings(&tenant.0, "loot").await?;
        Ok::<_, anyhow::Error>(outputs.filter(|o| o.iter().any(|(k, _)| k == "neighbours")))
    };
    system
        .wait_for("the refusal, or the loot", WAIT, || async {
            Ok(refused()? || looted().await?.is_some())
        })
        .await?;
    if let Some(outputs) = looted().await? {
        let get = |key: &str| {
            outputs
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let names = get("neighbours");
        let theirs: Vec<&str> = names
            .split(',')
            .filter(|n| n.starts_with(&neighbour_uid))
            .collect();
        panic!(
            "the tenant's template ran and read its neighbours' directories: {} files, the \
             neighbour {neighbour_uid}'s {theirs:?}; kubeconfig bytes read: {}",
            names.split(',').count(),
            get("bytes_read")
        );
    }
    assert!(refused()?, "Applied=False, reason TemplateNotTrusted");
    assert!(
        system
            .get(&[
                "workspaces.tf.upbound.io",
                &workspace_name(&tenant.0, "loot")
            ])?
            .is_none()
    );
    delete_apply(&victim_system, &victim.0, "vpc").await
}
