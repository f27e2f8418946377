//! The status-applier's command line and operator surface against the real API server:
//! `submit`, `show -o yaml`, `conflicts`, `/readyz`, and the metrics the docs promise.

use anyhow::Result;
use capt_tests::applier::{Applier, binary};
use capt_tests::{TestNamespace, env, repo_root};
use serde_json::json;
use std::process::Command;

fn cli(applier: &Applier, args: &[&str], stdin: &str) -> Result<(bool, String, String)> {
    use std::io::Write;
    let mut child = Command::new(binary("status-applier"))
        .args(args)
        .arg("--socket")
        .arg(&applier.socket)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child.stdin.take().unwrap().write_all(stdin.as_bytes())?;
    let out = child.wait_with_output()?;
    Ok((
        out.status.success(),
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    ))
}

#[tokio::test]
async fn submit_show_and_conflicts_work_from_the_command_line() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "cli").await?;
    let manifest = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": ns.name}, "data": {"owner": "kubectl"}});
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
    let applier = Applier::start(&[]).await?;

    let intents = format!(
        "target: {{apiVersion: v1, kind: ConfigMap, namespace: {ns}, name: c}}\nfieldManager: cli-test\nfragment: {{data: {{mine: yes}}}}\n---\n\
         target: {{apiVersion: v1, kind: ConfigMap, namespace: {ns}, name: c}}\nfieldManager: cli-test\nfragment: {{data: {{owner: me}}}}\n",
        ns = ns.name
    );
    let (ok, stdout, stderr) = cli(&applier, &["submit", "-f", "-"], &intents)?;
    assert!(
        !ok,
        "the second intent conflicts, so submit fails: {stdout}"
    );
    let answers: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers[0]["action"], "applied");
    assert_eq!(answers[1]["action"], "conflict");
    assert!(
        stderr.contains("intent 2 of -: the status-applier answered 409"),
        "{stderr}"
    );

    let (ok, yaml, _) = cli(&applier, &["show", "-o", "yaml"], "")?;
    assert!(ok);
    assert!(
        yaml.contains("# kubectl apply --server-side --field-manager=cli-test -f intent.yaml"),
        "{yaml}"
    );
    assert!(
        yaml.contains("mine: yes") || yaml.contains("mine: 'yes'"),
        "{yaml}"
    );

    let (ok, conflicts, _) = cli(&applier, &["conflicts"], "")?;
    assert!(ok);
    let conflicts: serde_json::Value = serde_json::from_str(&conflicts)?;
    assert_eq!(conflicts[0]["conflict"]["path"], ".data.owner");
    assert_eq!(conflicts[0]["conflict"]["owner"], "someone-else");
    Ok(())
}

#[tokio::test]
async fn submit_names_a_missing_file_and_an_unreachable_socket() -> Result<()> {
    let out = Command::new(binary("status-applier"))
        .args([
            "submit",
            "-f",
            "/nonexistent/intent.yaml",
            "--socket",
            "/nonexistent/applier.sock",
        ])
        .output()?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("reading /nonexistent/intent.yaml"));
    let out = Command::new(binary("status-applier"))
        .args(["show", "--socket", "/nonexistent/applier.sock"])
        .output()?;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("cannot reach the status-applier at /nonexistent/applier.sock")
    );
    Ok(())
}

#[tokio::test]
async fn readyz_reports_ready_once_the_api_server_answers() -> Result<()> {
    let applier = Applier::start(&[]).await?;
    let answer = applier.client.get("/readyz").await?;
    assert_eq!(answer.status.as_u16(), 200, "{}", answer.body);
    Ok(())
}

#[tokio::test]
async fn every_metric_the_docs_list_is_served() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "metrics").await?;
    let manifest = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": ns.name}, "data": {"owner": "kubectl"}});
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
    let applier = Applier::start(&["--view-wait-ms", "50"]).await?;
    // Exercise every path once: labelled metric families appear with their first sample.
    let intent = |name: &str, data: serde_json::Value| -> status_applier::intent::Intent {
        serde_json::from_value(json!({"target": {"apiVersion": "v1", "kind": "ConfigMap", "namespace": ns.name, "name": name},
            "fieldManager": "metrics-test", "fragment": {"data": data}})).unwrap()
    };
    applier
        .client
        .submit(&intent("c", json!({"a": "1"})), false)
        .await?;
    applier
        .client
        .submit(&intent("c", json!({"b": "2"})), true)
        .await?; // coalesced into the first
    applier
        .client
        .submit(&intent("c", json!({"owner": "me"})), true)
        .await?; // conflict
    applier
        .client
        .submit(&intent("missing", json!({"a": "1"})), true)
        .await?; // 404
    // A version the applier has not seen (no object has it yet): the wait for a view that
    // new runs out, and the object is read.
    let mut ahead = intent("c", json!({"d": "4"}));
    ahead.not_older_than = Some(u64::MAX.to_string());
    applier.client.submit(&ahead, true).await?;
    let metrics = applier.client.get("/metrics").await?.body;
    let docs = std::fs::read_to_string(repo_root().join("docs/status-applier.md"))?;
    let documented: Vec<&str> = docs
        .lines()
        .filter_map(|l| l.strip_prefix("| `status_applier_"))
        .filter_map(|l| l.split('`').next())
        .collect();
    assert!(documented.len() >= 8, "{documented:?}");
    for name in documented {
        let name = format!("status_applier_{name}");
        let family = name.trim_end_matches("_total");
        assert!(
            metrics.contains(&format!("# TYPE {family} ")),
            "{name} is documented but not served:\n{metrics}"
        );
    }
    Ok(())
}
