//! The `sh` blocks of a markdown page, run as the page says they run: what
//! `tests/tests/debugging_doc.rs` and `tests/tests/operating_doc.rs` run, so that the pages
//! cannot rot. A block containing `# expect: exit N` must exit with N; every other block must
//! succeed. A line `# expect: stdout contains TEXT` (or `stderr`) is checked on what the block
//! printed; every block states at least one.

use anyhow::{Result, bail};
use std::process::Command;

/// One `sh` block, with the heading it stands under.
#[derive(Clone, Debug)]
pub struct Block {
    /// The nearest heading above the block, without its `#`s (empty before the first).
    pub heading: String,
    /// The block's lines.
    pub text: String,
}

/// The `sh` blocks of a markdown page, in order.
pub fn sh_blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut heading = String::new();
    // Inside an `sh` block: its text so far; inside another fence: `None` with `fenced`.
    let mut current: Option<String> = None;
    let mut fenced = false;
    for line in markdown.lines() {
        let line = line.trim_end();
        match (&mut current, fenced) {
            (Some(block), _) if line == "```" => {
                blocks.push(Block {
                    heading: heading.clone(),
                    text: std::mem::take(block),
                });
                current = None;
            }
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, true) => fenced = !line.starts_with("```"),
            (None, false) if line == "```sh" => current = Some(String::new()),
            (None, false) if line.starts_with("```") => fenced = true,
            (None, false) if line.starts_with('#') => {
                heading = line.trim_start_matches('#').trim().to_owned();
            }
            (None, false) => {}
        }
    }
    blocks
}

/// The part of `markdown` under the heading `heading` (its text without the `#`s), up to the
/// next heading of the same level or above; `None` when there is no such heading.
pub fn section<'a>(markdown: &'a str, heading: &str) -> Option<&'a str> {
    let mut offset = 0;
    let mut fenced = false;
    let mut start: Option<(usize, usize)> = None;
    for line in markdown.split_inclusive('\n') {
        let trimmed = line.trim_end();
        if trimmed.starts_with("```") {
            fenced = !fenced;
        }
        let level = trimmed.chars().take_while(|c| *c == '#').count();
        let is_heading = !fenced && level > 0 && trimmed[level..].starts_with(' ');
        match start {
            None if is_heading && trimmed[level..].trim() == heading => {
                start = Some((offset + line.len(), level));
            }
            Some((from, own)) if is_heading && level <= own => {
                return Some(&markdown[from..offset]);
            }
            _ => {}
        }
        offset += line.len();
    }
    start.map(|(from, _)| &markdown[from..])
}

impl Block {
    /// The exit status the block must end with (`# expect: exit N`; 0 without one).
    pub fn expected_exit(&self) -> i32 {
        self.text
            .lines()
            .find_map(|l| l.trim().strip_prefix("# expect: exit "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The `(stream, text)` pairs of the block's `# expect: STREAM contains TEXT` lines.
    pub fn expected_output(&self) -> Vec<(&str, &str)> {
        self.text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("# expect: "))
            .filter_map(|l| {
                let (stream, text) = l.split_once(" contains ")?;
                Some((stream.trim(), text.trim()))
            })
            .collect()
    }

    /// The block as a bash script that stops at the first failing command (`set -euo
    /// pipefail`): set its directory and environment, then [`Block::run`] it.
    pub fn command(&self) -> Command {
        let mut command = Command::new("bash");
        command
            .arg("-c")
            .arg(format!("set -euo pipefail\n{}", self.text));
        command
    }

    /// Runs `command` (from [`Block::command`]) to its end.
    pub fn run(&self, mut command: Command) -> Result<Ran> {
        let out = command.output()?;
        Ok(Ran {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Whether `ran` is what the block says it does: its exit status, and each text it says
    /// its output contains; the error names the block (`what`) and shows what it printed.
    pub fn check(&self, what: &str, ran: &Ran) -> Result<()> {
        let expected = self.expected_exit();
        let shown = || {
            format!(
                "{}\n--- stdout:\n{}\n--- stderr:\n{}",
                self.text, ran.stdout, ran.stderr
            )
        };
        if ran.code != Some(expected) {
            bail!(
                "{what} exited {:?}, expected {expected}:\n{}",
                ran.code,
                shown()
            );
        }
        let outputs = self.expected_output();
        if outputs.is_empty() {
            bail!("{what} states no expected output:\n{}", self.text);
        }
        for (stream, text) in outputs {
            let printed = match stream {
                "stdout" => &ran.stdout,
                "stderr" => &ran.stderr,
                other => bail!("{what}: unknown stream `{other}`"),
            };
            if !printed.contains(text) {
                bail!("{what}: {stream} lacks `{text}`:\n{}", shown());
            }
        }
        Ok(())
    }
}

/// What a block did.
#[derive(Clone, Debug)]
pub struct Ran {
    /// Its exit status (`None`: killed by a signal).
    pub code: Option<i32>,
    /// What it printed.
    pub stdout: String,
    /// What it printed on its error stream.
    pub stderr: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# Page\n\n## One\n\n```sh\n# expect: exit 1\n# expect: stderr contains no\nfalse\n```\n\n### One, a\n\n```text\n# not a heading\nnot run\n```\n\n```sh\n# expect: stdout contains a\necho a\n```\n\n## Two\n\n```sh\necho b\n```\n";

    #[test]
    fn blocks_stand_under_their_headings_and_say_what_they_expect() {
        let blocks = sh_blocks(PAGE);
        assert_eq!(blocks.len(), 3);
        assert_eq!(blocks[0].heading, "One");
        assert_eq!(blocks[0].expected_exit(), 1);
        assert_eq!(blocks[0].expected_output(), [("stderr", "no")]);
        assert_eq!(blocks[1].heading, "One, a");
        assert_eq!(blocks[1].expected_exit(), 0);
        assert_eq!(blocks[2].heading, "Two");
        assert!(blocks[2].expected_output().is_empty());
    }

    #[test]
    fn a_section_ends_at_the_next_heading_of_its_level() {
        let one = section(PAGE, "One").expect("section One");
        assert_eq!(sh_blocks(one).len(), 2, "{one}");
        assert!(!one.contains("## Two"));
        assert_eq!(sh_blocks(section(PAGE, "Two").unwrap()).len(), 1);
        assert!(section(PAGE, "Three").is_none());
    }
}
