//! Secret values stay in Secrets. A full system (controller, status-applier, fake provider, all
//! logging at `RUST_LOG=trace`) provisions the sample Cluster; the control plane's connection
//! Secret carries two random canaries: one inside the sensitive `kubeconfig` output (which the
//! controller must copy into `<cluster>-kubeconfig`), one in another sensitive output
//! (`db_password`, which nothing may read). Then neither canary, raw or base64-encoded at any
//! alignment, is in any process log, any Event of any namespace, the CAPTCluster, the
//! CAPTControlPlane, the WorkspaceTemplateApplies or the Cluster (whole: status, spec,
//! metadata, managed fields), the Workspaces' status, the applier's `/v1/intents`,
//! `/v1/conflicts` and `/metrics`, or the controller's `/metrics`; while the kubeconfig Secret
//! the controller wrote holds the first (found by the same search, so the search can fail)
//! and not the second.
//!
//! The fake provider is told its sensitive outputs by an annotation that the controller
//! renders from the WorkspaceTemplate into the Workspace: those two carry the values by
//! construction and are not searched (a real provider-terraform gets them from Terraform).

use anyhow::{Context, Result};
use capt_tests::system::System;
use capt_tests::{TestNamespace, env};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde_json::{Value, json};
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// A value no one could have written by chance: `label` and 128 random bits in hex.
fn canary(label: &str) -> String {
    let random = || {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        h.write_u32(std::process::id());
        h.finish()
    };
    format!("{label}{:016x}{:016x}", random(), random())
}

fn base64(bytes: &[u8]) -> String {
    serde_json::to_value(ByteString(bytes.to_vec()))
        .expect("bytes serialize")
        .as_str()
        .expect("as a base64 string")
        .to_owned()
}

/// The forms `value` takes in text: itself, and the part of its base64 encoding that depends
/// on its bytes alone, at each of the three alignments it can have inside a longer encoded
/// value (a Secret's `data`, say).
fn forms(value: &str) -> Vec<String> {
    let n = value.len();
    let mut out = vec![value.to_owned()];
    for k in 0..3 {
        let mut bytes = vec![b'.'; k];
        bytes.extend_from_slice(value.as_bytes());
        let encoded = base64(&bytes);
        // Characters covering bits [6i, 6i+6) entirely within the value's bits [8k, 8(k+n)).
        let start = (8 * k).div_ceil(6);
        let end = (8 * (k + n)) / 6;
        out.push(encoded[start..end].to_owned());
    }
    out
}

/// The forms of `value` found in `text`.
fn found<'a>(forms: &'a [String], text: &str) -> Vec<&'a str> {
    forms
        .iter()
        .filter(|f| text.contains(f.as_str()))
        .map(String::as_str)
        .collect()
}

#[test]
fn the_forms_find_a_value_encoded_at_any_alignment() {
    let value = canary("probe");
    let forms = forms(&value);
    for prefix in ["", "a", "ab", "abc", "abcd"] {
        let encoded = base64(format!("{prefix}{value}-suffix").as_bytes());
        assert!(!encoded.contains(&value));
        assert!(!found(&forms, &encoded).is_empty(), "{prefix:?}: {encoded}");
    }
    assert!(found(&forms, &base64(b"something else entirely, long enough")).is_empty());
}

fn kubectl_json(args: &[&str]) -> Result<String> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    env().kubectl_ok(&all, None)
}

#[tokio::test]
async fn secret_values_reach_the_kubeconfig_secret_and_nothing_else() -> Result<()> {
    capt_tests::log_everything();
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "secrets").await?;
    let system = System::start(&ns.name, 50).await?;
    system.apply_samples(false).await?;

    let token = canary("kubeconfigtoken");
    let password = canary("dbpassword");
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: demo\n  cluster:\n    server: \
         https://demo.example\ncontexts:\n- name: demo-admin@demo\n  context:\n    cluster: \
         demo\n    user: demo-admin\ncurrent-context: demo-admin@demo\nusers:\n- name: \
         demo-admin\n  user:\n    token: {token}\n"
    );
    // Where the fake provider takes its sensitive outputs from: the annotation the controller
    // renders into the control plane's Workspace from the WorkspaceTemplate.
    system.set_sensitive_outputs(&json!({"kubeconfig": kubeconfig, "db_password": password}))?;

    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let value = |s: &Secret, key: &str| {
        s.data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
    };
    system.wait_provisioned().await?;
    system
        .wait_for(
            "the kubeconfig Secret with the new kubeconfig output",
            Duration::from_secs(60),
            || async {
                Ok(secrets
                    .get_opt("demo-kubeconfig")
                    .await?
                    .is_some_and(|s| value(&s, "value").as_deref() == Some(kubeconfig.as_str())))
            },
        )
        .await?;
    // One more reconcile of the control plane before looking, forced (a label changes its
    // lifecycle hash; at rest nothing else wakes it): it has the Secrets' data in hand again.
    system.reconcile_control_plane_again("1").await?;

    let token_forms = forms(&token);
    let password_forms = forms(&password);

    // Where they must be: the connection Secret holds both; the kubeconfig Secret the first
    // only, under `value`, and the search finds it there in its base64 form.
    let connection = secrets.get("demo-eks-connection").await?;
    assert_eq!(
        value(&connection, "kubeconfig").as_deref(),
        Some(kubeconfig.as_str())
    );
    assert_eq!(
        value(&connection, "db_password").as_deref(),
        Some(password.as_str())
    );
    let written = serde_json::to_string(&secrets.get("demo-kubeconfig").await?)?;
    let hits = found(&token_forms, &written);
    assert!(
        !hits.is_empty() && !written.contains(&token),
        "the kubeconfig Secret holds the token, base64-encoded: {written}"
    );
    assert!(found(&password_forms, &written).is_empty(), "{written}");

    // Where they must not be.
    let mut places: Vec<(String, String)> = vec![
        ("controller log".into(), system.controller_log_text()),
        ("status-applier log".into(), system.applier.log_text()),
        ("fake provider log".into(), system.provider().log_text()),
        (
            "Events (core/v1)".into(),
            kubectl_json(&["get", "events", "-A"])?,
        ),
        (
            "Events (events.k8s.io/v1)".into(),
            kubectl_json(&["get", "events.v1.events.k8s.io", "-A"])?,
        ),
        (
            "CAPT and Cluster objects".into(),
            kubectl_json(&[
                "get",
                "captclusters,captcontrolplanes,workspacetemplateapplies,clusters",
                "-n",
                &ns.name,
                "--show-managed-fields",
            ])?,
        ),
    ];
    let workspaces: Value = serde_json::from_str(&kubectl_json(&[
        "get",
        "workspaces",
        "-l",
        &format!("{}={}", capt_tests::system::APPLY_NAMESPACE_LABEL, ns.name),
    ])?)?;
    let workspaces = workspaces["items"].as_array().context("items")?;
    assert_eq!(workspaces.len(), 2, "the VPC's and the control plane's");
    for ws in workspaces {
        places.push((
            format!("Workspace {} status", ws["metadata"]["name"]),
            ws["status"].to_string(),
        ));
    }
    for path in ["/v1/intents", "/v1/conflicts", "/metrics"] {
        let answer = system.applier.client.get(path).await?;
        places.push((format!("status-applier {path}"), answer.body));
    }
    places.push((
        "controller /metrics".into(),
        system.controller_metrics_text().await?,
    ));

    // Each place is what it claims to be, and the processes logged at trace level.
    for (place, text) in &places {
        assert!(!text.is_empty(), "{place} is empty");
    }
    for (place, text) in &places[..3] {
        assert!(text.contains("TRACE"), "{place} is not at trace level");
    }
    assert!(places[5].1.contains("\"CAPTControlPlane\""));
    let intents: Value = serde_json::from_str(&places[places.len() - 4].1)?;
    assert!(
        intents.as_array().is_some_and(|a| !a.is_empty()),
        "{intents}"
    );

    let mut leaks = Vec::new();
    for (place, text) in &places {
        for (what, forms) in [("token", &token_forms), ("password", &password_forms)] {
            let hits = found(forms, text);
            if !hits.is_empty() {
                leaks.push(format!("the {what} ({hits:?}) in {place}"));
            }
        }
    }
    assert!(leaks.is_empty(), "{leaks:#?}");
    Ok(())
}
