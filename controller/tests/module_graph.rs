//! The module graph of `controller/src`, read from its `use` lines and its `crate::`,
//! `super::` and `self::` paths: no cycle between modules, and no module imports the wiring
//! above it (`run`, which starts the controllers; `main.rs` and `crdgen.rs` are binaries of
//! their own that nothing can import). No compiler, no API server: the files only.
//!
//! What it reads, and what it leaves out on purpose:
//! - a path names the longest module it starts with (`crate::status::deletion::plan` names
//!   `status::deletion`); `super::` and `self::` are taken from the file's own module;
//! - a `pub use` of a module's own child is its public surface, not a dependency (`api`
//!   re-exports its children, which use each other's types through it);
//! - an inline `#[cfg(test)] mod` block is a test's (its `super::` is the file's module);
//! - comments are skipped (a doc link is not an import);
//! - a bare relative path (`use child::X` in a `mod.rs`) is not seen: the tree uses
//!   `super::`/`crate::` below the crate root, which this reads.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The modules of the library that are the wiring: nothing below them may import them.
const WIRING: &[&str] = &["run"];

/// The binaries' roots under `src/`: crates of their own, not modules of the library.
const BINARIES: &[&str] = &["main.rs", "crdgen.rs"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read controller/src") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file is, as `a::b` (`""` for the crate root); `None` for a binary's root.
fn module_of(root: &Path, file: &Path) -> Option<String> {
    let rel = file
        .strip_prefix(root)
        .ok()?
        .to_string_lossy()
        .replace('\\', "/");
    if BINARIES.contains(&rel.as_str()) {
        return None;
    }
    let mut parts: Vec<&str> = rel.trim_end_matches(".rs").split('/').collect();
    if matches!(parts.last(), Some(&"mod") | Some(&"lib")) {
        parts.pop();
    }
    Some(parts.join("::"))
}

/// The file's code without comments and without its inline `#[cfg(test)] mod` blocks.
fn code(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    let mut skip_depth: Option<i32> = None;
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim();
        if let Some(depth) = skip_depth.as_mut() {
            *depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
            if *depth <= 0 {
                skip_depth = None;
            }
            continue;
        }
        if trimmed == "#[cfg(test)]"
            && lines
                .get(i + 1)
                .is_some_and(|next| next.trim_start().starts_with("mod ") && next.contains('{'))
        {
            skip_depth = Some(0);
            continue;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        let without_comment = match line.find("//") {
            // `//` inside a string (a URL) is not a comment.
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        };
        out.push_str(without_comment);
        out.push('\n');
    }
    out
}

/// `a::{b, c::{d, e}}` as `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.to_owned()];
    };
    let close = tree.rfind('}').expect("a `use` group closes");
    let (prefix, inner) = (&tree[..open], &tree[open + 1..close]);
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .flat_map(|i| expand(i).into_iter().map(move |e| format!("{prefix}{e}")))
        .collect()
}

/// The paths a module's code names, each with whether it is a `pub use`.
fn paths(code: &str) -> Vec<(String, bool)> {
    let mut found = Vec::new();
    let mut rest = String::new();
    let mut statement: Option<(String, bool)> = None;
    for line in code.lines() {
        let trimmed = line.trim_start();
        if statement.is_none() {
            let public = trimmed.starts_with("pub use ") || trimmed.starts_with("pub(crate) use ");
            if let Some(at) = trimmed
                .find("use ")
                .filter(|_| public || trimmed.starts_with("use "))
            {
                statement = Some((trimmed[at + 4..].to_owned(), public));
            } else {
                rest.push_str(line);
                rest.push('\n');
                continue;
            }
        } else if let Some((text, _)) = statement.as_mut() {
            text.push(' ');
            text.push_str(trimmed);
        }
        if let Some((text, public)) = statement.take_if(|(t, _)| t.contains(';')) {
            let tree = text.split(';').next().unwrap_or_default();
            found.extend(expand(tree).into_iter().map(|p| (p, public)));
        }
    }
    // Paths in expressions and types: `crate::a::b`, `super::x`.
    let bytes = rest.as_bytes();
    for root in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = rest[from..].find(root) {
            let start = from + at;
            from = start + root.len();
            let before = start.checked_sub(1).map(|i| bytes[i] as char);
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let end = rest[start..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .map_or(rest.len(), |e| start + e);
            found.push((rest[start..end].trim_end_matches(':').to_owned(), false));
        }
    }
    found
}

/// The module a path names, from inside `module`: the longest known module it starts with.
fn target(module: &str, path: &str, modules: &BTreeSet<String>) -> Option<String> {
    let mut segments = path
        .split("::")
        .map(|s| s.split(" as ").next().unwrap_or_default().trim().to_owned());
    let first = segments.next()?;
    let mut at: Vec<String> = match first.as_str() {
        "crate" => Vec::new(),
        "super" | "self" => {
            let mut at: Vec<String> = module
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            if first == "super" {
                at.pop();
            }
            at
        }
        _ => return None,
    };
    let mut rest: Vec<String> = segments.collect();
    while rest.first().is_some_and(|s| s == "super") {
        at.pop();
        rest.remove(0);
    }
    at.extend(rest.into_iter().filter(|s| s != "self" && s != "*"));
    (0..=at.len())
        .rev()
        .map(|n| at[..n].join("::"))
        .find(|m| modules.contains(m))
}

/// Module → its file.
fn module_files() -> BTreeMap<String, PathBuf> {
    let root = src();
    let mut all = Vec::new();
    files(&root, &mut all);
    all.into_iter()
        .filter_map(|f| Some((module_of(&root, &f)?, f)))
        .collect()
}

/// Module → the modules it imports.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let files = module_files();
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    let mut graph = BTreeMap::new();
    for (module, file) in &files {
        let text = std::fs::read_to_string(file).expect("read a module");
        let mut imports = BTreeSet::new();
        for (path, public) in paths(&code(&text)) {
            let Some(to) = target(module, &path, &modules) else {
                continue;
            };
            let own_child = to
                .strip_prefix(module.as_str())
                .is_some_and(|r| r.starts_with("::") || module.is_empty());
            if to == *module || (public && own_child) {
                continue;
            }
            imports.insert(to);
        }
        graph.insert(module.clone(), imports);
    }
    graph
}

fn name(module: &str) -> &str {
    if module.is_empty() { "crate" } else { module }
}

/// One cycle of the graph, if there is one, as the modules along it.
fn a_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|start| visit(start, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_graph_is_read_from_the_tree() {
    let graph = graph();
    // Edges the tree is known to have, one per kind of path this reads: a `use crate::`, a
    // `use super::{..}` group, and a path in an expression.
    for (from, to) in [
        ("reconcile::observe", "reconcile::claims"),
        ("reconcile::kubeconfig", "reconcile"),
        ("reconcile", "metrics"),
    ] {
        assert!(
            graph.get(from).is_some_and(|i| i.contains(to)),
            "{from} imports {to}, and the graph read has: {:#?}",
            graph.get(from)
        );
    }
}

#[test]
fn no_module_of_the_controller_imports_the_wiring_above_it() {
    let upward: Vec<String> = graph()
        .iter()
        .flat_map(|(from, imports)| {
            imports
                .iter()
                .filter(|to| WIRING.contains(&to.as_str()))
                .map(move |to| format!("{} imports {to}", name(from)))
        })
        .collect();
    assert!(
        upward.is_empty(),
        "modules import the wiring above them: {upward:#?}"
    );
}

#[test]
fn the_modules_of_the_controller_import_each_other_in_no_cycle() {
    let graph = graph();
    if let Some(cycle) = a_cycle(&graph) {
        let cycle: Vec<&str> = cycle.iter().map(|m| name(m)).collect();
        panic!("a cycle of imports: {}", cycle.join(" → "));
    }
}

/// The modules that decide: a reconciler's pure function from what it observed to its plan,
/// and the plan itself.
fn decides(module: &str) -> bool {
    matches!(
        module,
        "reconcile::plan"
            | "reconcile::deletion"
            | "reconcile::pause"
            | "reconcile::apply_owner"
            | "reconcile::claims"
            | "reconcile::kubeconfig"
    ) || module.ends_with("::decide")
}

/// The modules a decision must not import: the context (it holds the client), the caches,
/// the metrics, the executor and the wiring.
const NOT_FOR_A_DECISION: &[&str] = &[
    "context",
    "watches",
    "metrics",
    "rewake",
    "seen_secrets",
    "reconcile::act",
    "run",
];

/// What a decision's code must not name: a request, the runtime, the metrics, the clock.
const IMPURE: &[&str] = &[
    ".await",
    "async ",
    "tokio",
    "kube::Api",
    "kube::api::Api",
    "Api<",
    "kube::Client",
    "Client::",
    "prometheus_client",
    "Timestamp::now",
    "Instant::now",
    "SystemTime::now",
];

#[test]
fn a_decision_names_no_client_runtime_metrics_or_clock() {
    let graph = graph();
    let files = module_files();
    let deciding: Vec<&String> = graph.keys().filter(|m| decides(m)).collect();
    assert!(
        deciding.iter().any(|m| *m == "reconcile::cluster::decide"),
        "the deciding modules read: {deciding:?}"
    );
    let mut found = Vec::new();
    for module in deciding {
        for to in &graph[module] {
            if NOT_FOR_A_DECISION.contains(&to.as_str()) {
                found.push(format!("{module} imports {to}"));
            }
        }
        let text = code(&std::fs::read_to_string(&files[module]).expect("read a module"));
        for word in IMPURE {
            if text.contains(word) {
                found.push(format!("{module} names `{word}`"));
            }
        }
    }
    assert!(found.is_empty(), "a decision is not pure: {found:#?}");
}
