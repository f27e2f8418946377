//! The client commands that talk to a running server over its socket: `submit` (with its
//! multi-document split), and the output of `show` and `conflicts`.

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};
use status_applier::client::{Answer, Client};

/// Which desired documents `show` prints (all when no filter is given).
#[derive(Args)]
pub(crate) struct ShowFilter {
    /// Only this kind.
    #[arg(long)]
    kind: Option<String>,
    /// Only this namespace.
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// Only objects of this name.
    #[arg(long)]
    name: Option<String>,
    /// Only this field manager.
    #[arg(long)]
    manager: Option<String>,
    /// Only this subresource: `status` or `main`.
    #[arg(long)]
    subresource: Option<String>,
}

impl ShowFilter {
    pub(crate) fn query(&self) -> String {
        [
            ("kind", &self.kind),
            ("namespace", &self.namespace),
            ("name", &self.name),
            ("manager", &self.manager),
            ("subresource", &self.subresource),
        ]
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("&{k}={v}")))
        .collect()
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Format {
    Json,
    Yaml,
}

pub(crate) fn print_answer(answer: Answer) -> Result<()> {
    println!("{}", answer.body.trim_end());
    if !answer.status.is_success() {
        bail!("the status-applier answered {}", answer.status);
    }
    Ok(())
}

pub(crate) async fn submit(socket: &std::path::Path, file: &str, wait: bool) -> Result<()> {
    let text = status_applier::ownership::read_input(file)?;
    let client = Client::new(socket);
    let mut failed = 0;
    for (i, doc) in split_documents(&text).into_iter().enumerate() {
        let answer = client.submit_raw(doc.into_bytes(), wait).await?;
        println!("{}", answer.body.trim_end());
        if !answer.status.is_success() {
            eprintln!(
                "intent {} of {file}: the status-applier answered {}",
                i + 1,
                answer.status
            );
            failed += 1;
        }
    }
    if failed > 0 {
        bail!("{failed} intent(s) of {file} were not accepted");
    }
    Ok(())
}

/// Splits a multi-document YAML stream; JSON and single documents pass through as they are,
/// so the server validates the bytes the user wrote.
fn split_documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else {
            let doc = docs.last_mut().expect("never empty");
            doc.push_str(line);
            doc.push('\n');
        }
    }
    docs.into_iter()
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .collect()
}
