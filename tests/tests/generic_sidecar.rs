//! The status-applier as a generic sidecar, on a kind CAPT does not have: a ConfigMap whose
//! `data.owner` a made-up manager, `acme-writer`, owns under a policy file of its own. Its
//! rules come from that file alone; without a file nothing is protected.

use anyhow::Result;
use capt_tests::applier::{Applier, binary};
use capt_tests::{TestNamespace, env};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use status_applier::intent::Intent;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MANAGER: &str = "acme-writer";

const POLICY: &str = r#"
allowedManagers: [acme-writer]
allowedKinds: [ConfigMap]
protected:
  - {kind: ConfigMap, path: data.owner}
replaced:
  - {kind: ConfigMap, path: binaryData}
audit:
  kinds: [ConfigMap]
  expectations:
    - {kind: ConfigMap, path: data.owner, owners: [acme-writer]}
"#;

struct Fixture {
    ns: TestNamespace,
    api: Api<ConfigMap>,
    policy: PathBuf,
    /// The policy's directory, removed with the fixture.
    _dir: capt_tests::Scratch,
}

async fn fixture(prefix: &str) -> Result<Fixture> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, prefix).await?;
    let api: Api<ConfigMap> = Api::namespaced(client, &ns.name);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "settings"}}))?,
    )
    .await?;
    let dir = capt_tests::Scratch::new(&ns.name)?;
    let policy = dir.join("policy.yaml");
    std::fs::write(&policy, POLICY)?;
    Ok(Fixture {
        ns,
        api,
        policy,
        _dir: dir,
    })
}

impl Fixture {
    fn intent(&self, fragment: Value, release: &[&str]) -> Intent {
        serde_json::from_value(json!({
            "target": {"apiVersion": "v1", "kind": "ConfigMap",
                       "namespace": self.ns.name, "name": "settings"},
            "fieldManager": MANAGER,
            "fragment": fragment,
            "release": release,
        }))
        .expect("a valid intent document")
    }

    async fn object(&self) -> Result<Value> {
        Ok(serde_json::to_value(self.api.get("settings").await?)?)
    }

    fn audit(&self, policy: Option<&Path>) -> Result<Output> {
        let mut cmd = Command::new(binary("status-applier"));
        cmd.args(["audit", "configmap/settings", "-n", &self.ns.name])
            .env("KUBECONFIG", &env().kubeconfig)
            .env_remove("STATUS_APPLIER_POLICY")
            .env_remove("STATUS_APPLIER_POLICY_CONFIGMAP");
        match policy {
            Some(p) => cmd.arg("--policy").arg(p),
            None => cmd.arg("--no-policy"),
        };
        Ok(cmd.output()?)
    }
}

async fn submit(applier: &Applier, intent: &Intent) -> Result<Value> {
    Ok(applier.client.submit(intent, true).await?.json())
}

fn managers(obj: &Value) -> Vec<String> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| format!("{}/{}", e["manager"], e["operation"]))
        .collect()
}

#[tokio::test]
async fn a_policy_file_protects_replaces_and_audits_a_configmap() -> Result<()> {
    let f = fixture("generic").await?;
    let applier = Applier::start_with_policy(Some(&f.policy), &[], &env().kubeconfig).await?;

    // The apply happens under the policy's manager.
    let out = submit(
        &applier,
        &f.intent(
            json!({"data": {"owner": "team-a", "color": "blue"},
                   "binaryData": {"a": "MQ==", "b": "Mg=="}}),
            &[],
        ),
    )
    .await?;
    assert_eq!(out["action"], "applied", "{out}");
    let obj = f.object().await?;
    assert_eq!(obj["data"], json!({"owner": "team-a", "color": "blue"}));
    assert!(
        managers(&obj).contains(&format!("\"{MANAGER}\"/\"Apply\"")),
        "{:?}",
        managers(&obj)
    );

    // An intent that removes the protected path (`null`), without release, keeps it; the
    // unprotected field it removes goes. The replaced binaryData is replaced whole by a
    // fragment that carries it: `a`, which the fragment omits, goes.
    let out = submit(
        &applier,
        &f.intent(
            json!({"data": {"owner": null, "color": null}, "binaryData": {"b": "Mw=="}}),
            &[],
        ),
    )
    .await?;
    assert_eq!(out["kept"], json!(["data.owner"]), "{out}");
    let obj = f.object().await?;
    assert_eq!(obj["data"], json!({"owner": "team-a"}), "{obj}");
    assert_eq!(
        obj["binaryData"],
        json!({"b": "Mw=="}),
        "replaced whole: {obj}"
    );

    // The audit with the policy: clean now.
    let clean = f.audit(Some(&f.policy))?;
    assert_eq!(
        clean.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&clean.stdout),
        String::from_utf8_lossy(&clean.stderr)
    );
    assert!(String::from_utf8_lossy(&clean.stdout).contains(".data.owner"));

    // A foreign writer takes the protected path by force: the audit names it (exit 1).
    let forged = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": f.ns.name}, "data": {"owner": "mallory"}});
    env().kubectl_ok(
        &[
            "apply",
            "--server-side",
            "--field-manager=intruder",
            "--force-conflicts",
            "-f",
            "-",
        ],
        Some(&forged.to_string()),
    )?;
    let found = f.audit(Some(&f.policy))?;
    let stdout = String::from_utf8_lossy(&found.stdout);
    assert_eq!(found.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("VIOLATION .data.owner: foreign writer: intruder (Apply, main"),
        "{stdout}"
    );
    // Without a policy the audit expects nothing: the same object is clean.
    let nothing = f.audit(None)?;
    assert_eq!(
        nothing.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&nothing.stdout)
    );
    Ok(())
}

#[tokio::test]
async fn without_a_policy_nothing_is_protected() -> Result<()> {
    let f = fixture("generic-none").await?;
    let applier = Applier::start_with_policy(None, &[], &env().kubeconfig).await?;
    let out = submit(
        &applier,
        &f.intent(json!({"data": {"owner": "team-a", "color": "blue"}}), &[]),
    )
    .await?;
    assert_eq!(out["action"], "applied", "{out}");
    let out = submit(&applier, &f.intent(json!({"data": {"owner": null}}), &[])).await?;
    assert_eq!(out["action"], "applied", "{out}");
    assert!(out["kept"].as_array().is_none_or(Vec::is_empty), "{out}");
    let obj = f.object().await?;
    assert_eq!(
        obj["data"],
        json!({"color": "blue"}),
        "the omitted field went: {obj}"
    );
    Ok(())
}

#[tokio::test]
async fn a_bad_policy_file_is_named_with_its_entry() -> Result<()> {
    let dir = capt_tests::Scratch::new("bad-policy")?;
    let policy = dir.join("policy.yaml");
    std::fs::write(
        &policy,
        "protected:\n  - {kind: ConfigMap, paht: data.owner}\n",
    )?;
    let out = Command::new(binary("status-applier"))
        .args(["audit", "-f", "-"])
        .arg("--policy")
        .arg(&policy)
        .env_remove("STATUS_APPLIER_POLICY")
        .output();
    std::fs::remove_dir_all(&dir)?;
    let out = out?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("policy file {}", policy.display()))
            && stderr.contains("protected[0]")
            && stderr.contains("unknown field `paht`"),
        "{stderr}"
    );
    Ok(())
}
