//! Runs every `sh` block of `docs/debugging.md`, in order, against the whole system on the
//! real API server, so the page cannot rot. A block containing `# expect: exit N` must exit
//! with N; every other block must succeed. A line `# expect: stdout contains TEXT` (or
//! `stderr`) is checked on what the block printed; every block states at least one.

use anyhow::Result;
use capt_tests::applier::binary;
use capt_tests::system::System;
use capt_tests::{TestNamespace, env, repo_root};
use std::process::Command;

/// The `sh` blocks of a markdown page.
fn sh_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), l) => {
                block.push_str(l);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// The `(stream, text)` pairs of the block's `# expect: STREAM contains TEXT` lines.
fn expected_output(block: &str) -> Vec<(&str, &str)> {
    block
        .lines()
        .filter_map(|l| l.trim().strip_prefix("# expect: "))
        .filter_map(|l| {
            let (stream, text) = l.split_once(" contains ")?;
            Some((stream.trim(), text.trim()))
        })
        .collect()
}

fn expected_exit(block: &str) -> i32 {
    block
        .lines()
        .find_map(|l| l.trim().strip_prefix("# expect: exit "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn every_command_of_the_debugging_page_runs_as_documented() -> Result<()> {
    let client = env().client().await?;
    let ns = TestNamespace::create(&client, "debugging").await?;
    let system = System::start(&ns.name, 50).await?;
    system.apply_samples(false).await?;
    system.wait_provisioned().await?;

    let page = std::fs::read_to_string(repo_root().join("docs/debugging.md"))?;
    let blocks = sh_blocks(&page);
    assert!(
        blocks.len() >= 6,
        "the page has its blocks: {}",
        blocks.len()
    );
    let workdir = capt_tests::Scratch::new("debugging")?;
    let bin = binary("status-applier");
    let path = format!(
        "{}:{}:{}",
        env().bin_dir.display(),
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (i, block) in blocks.iter().enumerate() {
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("set -euo pipefail\n{block}"))
            .current_dir(&workdir)
            .env("PATH", &path)
            .env("KUBECONFIG", &env().kubeconfig)
            .env("NS", &ns.name)
            .env("SOCKET", &system.applier.socket)
            .env("STATUS_APPLIER_POLICY", capt_tests::applier::capt_policy())
            .output()?;
        let expected = expected_exit(block);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(
            out.status.code(),
            Some(expected),
            "block {} exited {:?}, expected {expected}:\n{block}\n--- stdout:\n{stdout}\n--- stderr:\n{stderr}",
            i + 1,
            out.status.code(),
        );
        let outputs = expected_output(block);
        assert!(
            !outputs.is_empty(),
            "block {} states no expected output:\n{block}",
            i + 1
        );
        for (stream, text) in outputs {
            let printed = match stream {
                "stdout" => &stdout,
                "stderr" => &stderr,
                other => panic!("block {}: unknown stream `{other}`", i + 1),
            };
            assert!(
                printed.contains(text),
                "block {}: {stream} lacks `{text}`:\n{block}\n--- stdout:\n{stdout}\n--- stderr:\n{stderr}",
                i + 1
            );
        }
    }
    Ok(())
}
