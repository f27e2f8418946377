//! `docs/architecture.md`'s repository map against the tree: every path it names exists, and
//! every workspace crate and every top-level module of each crate's `src/` is in it. No API
//! server: the files only.

use anyhow::{Context, Result};
use capt_tests::repo_root;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The map: the section's lines, from its heading to the next one.
fn map() -> Result<Vec<String>> {
    let text = std::fs::read_to_string(repo_root().join("docs/architecture.md"))?;
    let lines: Vec<String> = text
        .lines()
        .skip_while(|l| *l != "## Repository map")
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .map(str::to_owned)
        .collect();
    anyhow::ensure!(
        !lines.is_empty(),
        "no `## Repository map` in docs/architecture.md"
    );
    Ok(lines)
}

/// The map split by top-level entry: (its directory, the text of the entry and its children).
fn entries(lines: &[String]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in lines {
        if let Some(rest) = line.strip_prefix("- `") {
            let dir = rest.split('`').next().unwrap_or_default().to_owned();
            out.push((dir, line.clone()));
        } else if let Some((_, text)) = out.last_mut() {
            text.push('\n');
            text.push_str(line);
        }
    }
    out
}

/// The backticked words of `text` that name a path.
fn paths(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| {
            !w.contains(' ')
                && !w.contains('<')
                && !w.contains('*')
                && (w.contains('/')
                    || [".rs", ".sh", ".md", ".yaml"]
                        .iter()
                        .any(|e| w.ends_with(e)))
        })
        .map(str::to_owned)
        .collect()
}

/// Files and directories named `name` under `dir`.
fn find(dir: &Path, name: &str, found: &mut Vec<PathBuf>) {
    let Ok(read) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in read.flatten() {
        let path = entry.path();
        if path.file_name().is_some_and(|n| n == name) {
            found.push(path.clone());
        }
        if path.is_dir() && !path.ends_with("target") {
            find(&path, name, found);
        }
    }
}

#[test]
fn every_path_the_repository_map_names_exists() -> Result<()> {
    let root = repo_root();
    let mut missing = Vec::new();
    for (dir, text) in entries(&map()?) {
        for path in paths(&text) {
            let trimmed = path.trim_end_matches('/');
            let candidates = [root.join(trimmed), root.join(&dir).join(trimmed)];
            if candidates.iter().any(|c| c.exists()) {
                continue;
            }
            // A bare file name belongs somewhere under its entry's directory.
            let mut found = Vec::new();
            if !trimmed.contains('/') {
                find(&root.join(&dir), trimmed, &mut found);
            }
            if found.is_empty() {
                missing.push(format!("{path} (under {dir})"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md's repository map names paths that do not exist: {missing:#?}"
    );
    Ok(())
}

#[test]
fn every_crate_and_top_level_module_is_in_the_repository_map() -> Result<()> {
    let root = repo_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml"))?;
    let members: Vec<String> = manifest
        .lines()
        .find(|l| l.starts_with("members"))
        .context("workspace members")?
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    let entries = entries(&map()?);
    let mut absent = BTreeSet::new();
    for member in &members {
        let Some((_, text)) = entries.iter().find(|(d, _)| *d == format!("{member}/")) else {
            absent.insert(format!("crate {member}/"));
            continue;
        };
        for entry in std::fs::read_dir(root.join(member).join("src"))? {
            let path = entry?.path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if ["lib.rs", "main.rs"].contains(&name.as_str()) {
                continue;
            }
            let named = match path.is_dir() {
                true => format!("{name}/"),
                false => name.clone(),
            };
            if !text.contains(&format!("`src/{named}`")) && !text.contains(&format!("`{named}`")) {
                absent.insert(format!("{member}/src/{named}"));
            }
        }
    }
    assert!(
        absent.is_empty(),
        "not in docs/architecture.md's repository map: {absent:#?}"
    );
    Ok(())
}
