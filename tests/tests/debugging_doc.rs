//! Runs every `sh` block of `docs/debugging.md`, in order, against the whole system on the
//! real API server, so the page cannot rot. A block containing `# expect: exit N` must exit
//! with N; every other block must succeed. A line `# expect: stdout contains TEXT` (or
//! `stderr`) is checked on what the block printed; every block states at least one
//! (`capt_tests::doc_blocks`).

use anyhow::Result;
use capt_tests::applier::binary;
use capt_tests::doc_blocks::sh_blocks;
use capt_tests::system::System;
use capt_tests::{TestNamespace, env, repo_root};

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
        let mut command = block.command();
        command
            .current_dir(&workdir)
            .env("PATH", &path)
            .env("KUBECONFIG", &env().kubeconfig)
            .env("NS", &ns.name)
            .env("SOCKET", &system.applier.socket)
            .env("STATUS_APPLIER_POLICY", capt_tests::applier::capt_policy());
        let ran = block.run(command)?;
        block.check(&format!("block {}", i + 1), &ran)?;
    }
    Ok(())
}
