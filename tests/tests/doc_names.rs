//! What the docs name exists: every test name, file path, hack script and `--flag` of our
//! programs that `README.md`, `CHANGELOG.md` and `docs/*.md` name in code (backticks, code
//! blocks) or link to. No API server: the tree, and the `--help` of the built binaries
//! (`cargo build --workspace --bins` first, as `hack/test.sh` does).
//!
//! What counts, and what is left out on purpose (each list below says why):
//! - a **test name** is a backticked `snake_case` word of four words or more: it must be a
//!   `fn` of the tree or a word of its code (a Terraform output, a string); one cut short
//!   (`name_…`) fails. Metric names are left out (the exposition adds the unit and `_total`
//!   to the names the code registers), and so are the upstream names of [`UPSTREAM_NAMES`].
//! - a **path** is a code word with a `/` or a file extension: one that starts with a
//!   top-level entry of the repository must exist there; `src/…` and other relative paths
//!   must end some path of the tree; a bare file name must be some file's name. Paths under
//!   what `.gitignore` lists (`.testenv/`, `target/`, ...) are made at run time and left out,
//!   and so are the few of [`NOT_IN_THE_TREE`]. A markdown
//!   link to a local file must reach it.
//! - a **`--flag`** following one of our programs (`capt-controller`, `status-applier` and
//!   its subcommands, `kubectl ownership`, the benchmarks, a `hack/` script) must be one of
//!   that program's, read from its `--help` (a script's from its `case` patterns); a flag
//!   standing alone must be one of ours or of [`FOREIGN_FLAGS`]. Flags after another program
//!   (`kubectl`, `cargo`, `clusterctl`, ...) are that program's and left to it.
//! - `docs/performance-history.md` is left out: it records earlier rounds as they were run,
//!   with the flags, files and tests of their commits.

use capt_tests::applier::binary;
use capt_tests::repo_root;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Pages that are records of their time, not reference: see the module's comment.
const RECORDS: &[&str] = &["docs/performance-history.md"];

/// Pages the docs map links before they exist on every branch: checked once they exist.
const LINKED_BEFORE_THEY_EXIST: &[&str] = &["CHANGELOG.md", "docs/upgrading.md"];

/// Snake-case names of other projects the pages quote.
const UPSTREAM_NAMES: &[&str] = &[
    // Terraform resources of the AWS and kubernetes providers, in the EKS module's sketch
    // (docs/cluster-api.md): the samples stand for them with `terraform_data`.
    "aws_eks_cluster_auth",
    "kubernetes_cluster_role_binding_v1",
    "kubernetes_service_account_v1",
];

/// Metric names are the registered name plus what the exposition adds: not in the source as
/// written. Their prefixes: ours, and controller-runtime's (which ours are compared with).
const METRIC_PREFIXES: &[&str] = &["capt_", "status_applier_", "workqueue_"];

/// Paths that are not this tree's: files a page's own commands write (`docs/debugging.md`
/// writes the applier's document to `desired.yaml`), the policy ConfigMap's key as mounted
/// (`policy.yaml`), and the layout of Cluster API core's module (`docs/testenv.md`).
const NOT_IN_THE_TREE: &[&str] = &[
    "desired.yaml",
    "intent.yaml",
    "stolen.yaml",
    "policy.yaml",
    "config",
    "config/webhook/manifests.yaml",
];

/// Flags of other programs that the pages name standing alone, with whose they are.
const FOREIGN_FLAGS: &[&str] = &[
    // kubectl
    "--server-side",
    "--field-manager",
    "--subresource",
    "--dry-run",
    "--force-conflicts",
    "--kubeconfig",
    "--context",
    "--show-managed-fields",
    "--clusterrole",
    "--serviceaccount",
    // Cluster API core's manager and provider-terraform's
    "--leader-elect",
    "--feature-gates",
    "--kube-api-qps",
    "--kube-api-burst",
    "--webhook-port",
    "--webhook-cert-dir",
    "--max-reconcile-rate",
    "--poll",
    "--poll-jitter",
    // etcd and kube-apiserver in hack/testenv.sh
    "--unsafe-no-fsync",
    "--enable-priority-and-fairness",
    "--etcd-prefix",
    // clusterctl
    "--infrastructure",
    "--control-plane",
    "--config",
    "--to-kubeconfig",
    "--kubernetes-version",
    "--target-namespace",
    // cargo and rustup
    "--release",
    "--locked",
    "--workspace",
    "--bins",
    "--no-run",
];

/// A hack script that hands its arguments to a binary: its flags are the binary's too.
/// `hack/bench.sh` runs `bench-system "$@"`; `hack/soak.sh --applier-args "ARGS"` hands ARGS
/// to the replays' status-applier.
const PASSED_ON: &[(&str, &str)] = &[
    ("hack/bench.sh", "bench-system"),
    ("hack/soak.sh", "status-applier"),
];

/// The pages: README.md, CHANGELOG.md if present, docs/*.md but the records.
fn pages() -> Vec<(String, String)> {
    let root = repo_root();
    let mut names = vec!["README.md".to_owned(), "CHANGELOG.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .map(|e| {
            e.expect("a docs/ entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .filter(|n| !RECORDS.contains(&n.as_str()))
        .filter_map(|n| Some((n.clone(), std::fs::read_to_string(root.join(&n)).ok()?)))
        .collect()
}

/// What a page holds as code: each backticked span, and each line of its fenced blocks.
fn code_of(page: &str) -> Vec<String> {
    let mut code = Vec::new();
    let mut fenced = false;
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            code.push(line.to_owned());
        } else {
            code.extend(line.split('`').skip(1).step_by(2).map(str::to_owned));
        }
    }
    code
}

/// The local targets of a page's markdown links.
fn links_of(page: &str) -> Vec<String> {
    page.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(|t| t.split('#').next().unwrap_or_default().to_owned())
        .filter(|t| !t.is_empty() && !t.contains("://") && !t.starts_with("mailto:"))
        .collect()
}

/// Every file and directory of the tree, relative to the root, but what `.gitignore` lists.
fn tree() -> (BTreeSet<String>, Vec<String>) {
    let root = repo_root();
    let ignored: Vec<String> = std::fs::read_to_string(root.join(".gitignore"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().trim_matches('/').to_owned())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let mut all = BTreeSet::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(dir) = stack.pop() {
        let Ok(read) = std::fs::read_dir(root.join(&dir)) else {
            continue;
        };
        for entry in read.flatten() {
            let rel = dir.join(entry.file_name());
            let rel_str = rel.to_string_lossy().replace('\\', "/");
            if rel_str == ".git" || ignored.iter().any(|i| is_under(&rel_str, i)) {
                continue;
            }
            if entry.path().is_dir() {
                stack.push(rel);
            }
            all.insert(rel_str);
        }
    }
    (all, ignored)
}

/// `path` is `ignored` or under it (a `*.ext` pattern matches the file name's end).
fn is_under(path: &str, ignored: &str) -> bool {
    match ignored.strip_prefix('*') {
        Some(ext) => path.ends_with(ext),
        None => path == ignored || path.starts_with(&format!("{ignored}/")),
    }
}

/// The `fn` names of the tree's Rust files, and the words of its other code files and of
/// the Rust files' string literals (a Terraform output, a key): what a doc may name. This file
/// is left out: it names stale names on purpose.
fn names_in_code(tree: &BTreeSet<String>) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut fns, mut words) = (BTreeSet::new(), BTreeSet::new());
    let code_ext = [
        ".rs", ".sh", ".py", ".yaml", ".yml", ".tf", ".toml", ".json",
    ];
    let split = |text: &str| -> Vec<String> {
        text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .map(str::to_owned)
            .collect()
    };
    for file in tree
        .iter()
        .filter(|f| code_ext.iter().any(|e| f.ends_with(e)) && *f != "tests/tests/doc_names.rs")
    {
        let Ok(text) = std::fs::read_to_string(repo_root().join(file)) else {
            continue;
        };
        if !file.ends_with(".rs") {
            words.extend(split(&text));
            continue;
        }
        let all = split(&text);
        for pair in all.windows(2) {
            if pair[0] == "fn" {
                fns.insert(pair[1].clone());
            }
        }
        for line in text.lines() {
            words.extend(line.split('"').skip(1).step_by(2).flat_map(split));
        }
    }
    (fns, words)
}

/// The backticked words that look like a test name: `snake_case` of four words or more;
/// with `true` when it is cut short (`…` or `...` after it).
fn test_names(code: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if !(chars[i].is_ascii_lowercase()) || (i > 0 && is_word(chars[i - 1])) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && is_word(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let rest: String = chars[i..].iter().take(3).collect();
        let cut = rest.starts_with('…') || rest.starts_with("...");
        let snake = word
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if snake && word.matches('_').count() >= 3 {
            out.push((word.trim_end_matches('_').to_owned(), cut));
        }
    }
    out
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The words of a code span that name a path.
fn path_words(code: &str) -> Vec<String> {
    let extensions = [".rs", ".sh", ".py", ".md", ".yaml", ".yml", ".toml"];
    code.split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| "\"'(),;:[]".contains(c))
                .trim_end_matches('.')
                .trim_start_matches("./")
        })
        .filter(|w| {
            !w.is_empty()
                && !w.starts_with('/')
                && !w.starts_with('-')
                && !w.contains("://")
                && !w.chars().any(|c| "<>*$={}…~@%|&".contains(c))
                && !w.contains("...")
                && (w.contains('/') || extensions.iter().any(|e| w.ends_with(e)))
        })
        .map(str::to_owned)
        .collect()
}

/// Why `word` names nothing in `tree`, if it does not.
fn missing_path(word: &str, tree: &BTreeSet<String>, ignored: &[String]) -> Option<String> {
    let path = word.trim_end_matches('/');
    let first = path.split('/').next().unwrap_or_default();
    if ignored.iter().any(|i| is_under(path, i)) || NOT_IN_THE_TREE.contains(&path) {
        return None;
    }
    // A placeholder stands for a path (`OUT/clusterctl.yaml`, `NS/NAME`): an upper-case part.
    let placeholder = |part: &str| {
        part.len() > 1
            && part
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    };
    if path.split('/').any(placeholder) {
        return None;
    }
    if tree.contains(first) && path.contains('/') {
        return (!tree.contains(path)).then(|| format!("`{word}`: no such path"));
    }
    if !path.contains('/') {
        let named = tree.iter().any(|t| t.rsplit('/').next() == Some(path));
        return (!named).then(|| format!("`{word}`: no file of that name"));
    }
    // A relative path (`src/reconcile/observe.rs`, `status/deletion.rs`): the end of one of
    // the tree's, when it names a file or lies under a `src/`; other words with a `/`
    // (`cluster.x-k8s.io/secret`, `tf.upbound.io/v1beta1`) are not paths.
    let file_like = [".rs", ".sh", ".py", ".md", ".yaml", ".yml", ".toml"]
        .iter()
        .any(|e| path.ends_with(e));
    if !(file_like || first == "src") {
        return None;
    }
    let ends = tree.iter().any(|t| t.ends_with(&format!("/{path}")));
    (!ends).then(|| format!("`{word}`: ends no path of the tree"))
}

/// The long flags in a `--help` text.
fn flags_in(help: &str) -> BTreeSet<String> {
    help.split(|c: char| !(c.is_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(str::to_owned)
        .collect()
}

/// The `--help` of `program`, with every subcommand's.
fn help(program: &Path, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("run {} --help: {e}", program.display()));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} {args:?} --help exited {:?}",
        program.display(),
        out.status.code()
    );
    let mut all = text.clone();
    if args.is_empty() {
        let subcommands: Vec<String> = text
            .lines()
            .skip_while(|l| !l.starts_with("Commands:"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .filter(|s| s != "help")
            .collect();
        for sub in subcommands {
            all.push_str(&help(program, &[&sub]));
        }
    }
    all
}

/// The flags of a script, from its `case` patterns (`--keep)`, `-h | --help)`).
fn script_flags(script: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo_root().join(script)).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            l.starts_with('-')
                .then(|| l.split(')').next().unwrap_or_default())
        })
        .flat_map(|pattern| pattern.split('|').map(|f| f.trim().to_owned()))
        .filter(|f| f.starts_with("--"))
        .collect()
}

/// Each of our programs, by the word that runs it, with its flags.
fn our_flags(tree: &BTreeSet<String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut programs = BTreeMap::new();
    // `crdgen` takes one directory and `bench-applier` two counts: no flags.
    for name in ["capt-controller", "status-applier", "kubectl-ownership"] {
        programs.insert(name.to_owned(), flags_in(&help(&binary(name), &[])));
    }
    for (name, path) in [
        ("bench-system", env!("CARGO_BIN_EXE_bench-system")),
        (
            "fake-terraform-provider",
            env!("CARGO_BIN_EXE_fake-terraform-provider"),
        ),
    ] {
        programs.insert(name.to_owned(), flags_in(&help(Path::new(path), &[])));
    }
    for script in tree.iter().filter(|t| {
        t.starts_with("hack/")
            && !t[5..].contains('/')
            && (t.ends_with(".sh") || t.ends_with(".py"))
    }) {
        let mut flags = script_flags(script);
        for (passer, to) in PASSED_ON {
            if passer == script {
                flags.extend(programs.get(*to).cloned().unwrap_or_default());
            }
        }
        programs.insert(script.clone(), flags);
    }
    let ownership = programs["kubectl-ownership"].clone();
    programs.insert("kubectl ownership".to_owned(), ownership);
    programs
}

/// The flags a line of code gives our programs: (program or `None` for a flag standing
/// alone, flag). Segments split at `|`, `;`, `&&`, `$(`; a segment's program is its first
/// word past `VAR=value`s (a path's last part for a binary, `kubectl ownership` whole).
fn flag_uses(
    code: &str,
    programs: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<(Option<String>, String)> {
    let mut uses = Vec::new();
    let normalized = code
        .replace("&&", ";")
        .replace("||", ";")
        .replace("$(", ";")
        .replace('|', ";");
    for segment in normalized.split(';') {
        let words: Vec<&str> = segment
            .split_whitespace()
            .map(|w| w.trim_matches(|c: char| "\"'()[]".contains(c)))
            .filter(|w| !w.is_empty())
            .collect();
        let mut rest = words
            .iter()
            .skip_while(|w| w.contains('=') && !w.starts_with('-') || **w == "exec")
            .copied();
        let Some(first) = rest.next() else {
            continue;
        };
        let program = if first == "kubectl" && words.contains(&"ownership") {
            Some("kubectl ownership".to_owned())
        } else {
            let script = first.trim_start_matches("./");
            let binary = first.rsplit('/').next().unwrap_or_default();
            if programs.contains_key(script) {
                Some(script.to_owned())
            } else if programs.contains_key(binary) && !first.starts_with("hack/") {
                Some(binary.to_owned())
            } else if first.starts_with("--") {
                None
            } else {
                // Another program's flags are its own.
                continue;
            }
        };
        for word in std::iter::once(first).chain(rest) {
            if let Some(flag) = word
                .strip_prefix("--")
                .filter(|f| f.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
            {
                let flag = flag
                    .split(['=', ',', '.', '`', ')', ']'])
                    .next()
                    .unwrap_or_default();
                uses.push((program.clone(), format!("--{flag}")));
            }
        }
    }
    uses
}

#[test]
fn every_test_file_script_and_flag_the_docs_name_exists() {
    let (tree, ignored) = tree();
    let (fns, words) = names_in_code(&tree);
    let programs = our_flags(&tree);
    let all_ours: BTreeSet<&String> = programs.values().flatten().collect();
    let mut stale: Vec<String> = Vec::new();
    let pages = pages();
    assert!(
        pages.iter().any(|(n, _)| n == "README.md") && pages.len() > 5,
        "the pages are read: {:?}",
        pages.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    for (page, text) in &pages {
        for code in code_of(text) {
            for (name, cut) in test_names(&code) {
                if cut {
                    stale.push(format!(
                        "{page}: `{name}…` is cut short: name the test whole"
                    ));
                } else if !fns.contains(&name)
                    && !words.contains(&name)
                    && !UPSTREAM_NAMES.contains(&name.as_str())
                    && !METRIC_PREFIXES.iter().any(|p| name.starts_with(p))
                {
                    stale.push(format!(
                        "{page}: `{name}`: no test or name of that name in the tree"
                    ));
                }
            }
            for word in path_words(&code) {
                if let Some(why) = missing_path(&word, &tree, &ignored) {
                    stale.push(format!("{page}: {why}"));
                }
            }
            for (program, flag) in flag_uses(&code, &programs) {
                let known = match &program {
                    Some(p) => programs[p].contains(&flag),
                    None => all_ours.contains(&flag) || FOREIGN_FLAGS.contains(&flag.as_str()),
                };
                if !known {
                    let whose =
                        program.map_or("any of our programs".to_owned(), |p| format!("`{p}`"));
                    stale.push(format!(
                        "{page}: `{flag}` is not a flag of {whose}: `{}`",
                        code.trim()
                    ));
                }
            }
        }
        let dir = Path::new(page).parent().unwrap_or(Path::new(""));
        for link in links_of(text) {
            let target = dir.join(&link);
            let resolved = normalize(&target);
            if LINKED_BEFORE_THEY_EXIST.contains(&resolved.as_str())
                || repo_root().join(&resolved).exists()
            {
                continue;
            }
            stale.push(format!("{page}: the link ({link}) reaches nothing"));
        }
    }
    stale.sort();
    stale.dedup();
    assert!(
        stale.is_empty(),
        "the docs name what does not exist: {stale:#?}"
    );
}

/// `docs/../README.md` as `README.md`.
fn normalize(path: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::Normal(p) => parts.push(p.to_string_lossy().into_owned()),
            _ => {}
        }
    }
    parts.join("/")
}

#[test]
fn a_stale_name_of_each_kind_is_caught() {
    let (tree, ignored) = tree();
    let (fns, _) = names_in_code(&tree);
    let programs = our_flags(&tree);
    assert!(
        !fns.contains(
            "the_first_list_wakes_its_own_a_relist_what_changed_while_the_watch_was_away"
        )
    );
    assert!(fns.contains("every_path_the_repository_map_names_exists"));
    assert_eq!(
        test_names("`every_status_change_observes_…`"),
        vec![("every_status_change_observes".to_owned(), true)]
    );
    assert!(missing_path("hack/no-such-script.sh", &tree, &ignored).is_some());
    assert!(missing_path("src/reconcile/observe.rs", &tree, &ignored).is_none());
    assert!(missing_path(".testenv/kubeconfig", &tree, &ignored).is_none());
    assert_eq!(
        flag_uses("hack/soak.sh 100 -j 2 --all-writes", &programs),
        vec![(Some("hack/soak.sh".to_owned()), "--all-writes".to_owned())]
    );
    assert!(!programs["hack/soak.sh"].contains("--all-writes"));
    assert!(programs["hack/soak.sh"].contains("--writes"));
    assert!(programs["capt-controller"].contains("--watch-filter"));
    assert!(programs["hack/bench.sh"].contains("--clusters"));
    assert!(flag_uses("kubectl apply --server-side -f x", &programs).is_empty());
}

/// Each option of a `--help` text: flag → (environment variable, default).
type Options = BTreeMap<String, (Option<String>, Option<String>)>;

/// The options of a `--help` text (clap's long help).
fn options_in(help: &str) -> Options {
    let header = regex::Regex::new(r"^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)").unwrap();
    let env = regex::Regex::new(r"\[env: ([A-Z0-9_]+)=").unwrap();
    let default = regex::Regex::new(r"\[default: ([^\]]*)\]").unwrap();
    let mut options = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    let mut finish = |current: Option<(String, String)>| {
        if let Some((flag, block)) = current {
            let env = env.captures(&block).map(|c| c[1].to_owned());
            let default = default.captures(&block).map(|c| c[1].to_owned());
            options.entry(flag).or_insert((env, default));
        }
    };
    for line in help.lines() {
        if let Some(c) = header.captures(line) {
            finish(current.take());
            current = Some((c[1].to_owned(), line.to_owned()));
        } else if !line.starts_with(' ') && !line.is_empty() {
            finish(current.take());
        } else if let Some((_, block)) = &mut current {
            block.push_str(line);
        }
    }
    finish(current);
    options
}

/// A flag the docs give an environment variable or a default: `(page, flag, environment
/// variables, defaults)`. Two shapes: a table row `` | `--flag` (`ENV` / `ENV`) … | DEFAULT
/// / DEFAULT | … |`` of a table whose second column is the default, and prose
/// `` `… --flag …` (`ENV`) `` or `` `--flag` … default N ``.
type Documented = (String, String, Vec<String>, Vec<String>);

fn documented_options(pages: &[(String, String)]) -> Vec<Documented> {
    let row =
        regex::Regex::new(r"^\| `(--[a-z][a-z0-9-]*)` \(([^)]*)\)[^|]*\| ([^|]*) \|").unwrap();
    let prose_env = regex::Regex::new(
        r"`(?:[a-z-]+ )?(--[a-z][a-z0-9-]*)(?: [A-Z_.]+)?` \((?:or )?`([A-Z][A-Z0-9_]+)`[,;)]",
    )
    .unwrap();
    let prose_default =
        regex::Regex::new(r"`(--[a-z][a-z0-9-]*)`\)?,? \(?default ([0-9][0-9.]*)[),;]").unwrap();
    let word = regex::Regex::new(r"`([^`]+)`").unwrap();
    let mut documented = Vec::new();
    for (page, text) in pages {
        for line in text.lines() {
            if let Some(c) = row.captures(line) {
                let envs = word.captures_iter(&c[2]).map(|w| w[1].to_owned()).collect();
                let defaults = c[3]
                    .split(" / ")
                    .map(|d| d.trim().trim_matches('`').to_owned())
                    .collect();
                documented.push((page.clone(), c[1].to_owned(), envs, defaults));
                continue;
            }
            for c in prose_env.captures_iter(line) {
                documented.push((page.clone(), c[1].to_owned(), vec![c[2].to_owned()], vec![]));
            }
            for c in prose_default.captures_iter(line) {
                documented.push((page.clone(), c[1].to_owned(), vec![], vec![c[2].to_owned()]));
            }
        }
    }
    documented
}

/// What a page says of a flag's environment variable and default is what the binaries'
/// `--help` says: an environment variable must be the flag's in the binary its prefix names
/// (`CAPT_` the controller, `STATUS_APPLIER_` the status-applier, `…_` both); a default must
/// be the flag's (`off` and `none`: it has none), and where two are given (`applier /
/// controller`), each binary's in that order.
#[test]
fn documented_environment_variables_and_defaults_are_the_binaries() {
    let controller = options_in(&help(&binary("capt-controller"), &[]));
    let applier = options_in(&help(&binary("status-applier"), &[]));
    let binaries = [
        ("status-applier", &applier),
        ("capt-controller", &controller),
    ];
    let pages = pages();
    let documented = documented_options(&pages);
    assert!(
        documented.len() > 10,
        "the pages' flags with an environment variable or a default are read: {documented:?}"
    );
    let mut wrong = Vec::new();
    for (page, flag, envs, defaults) in &documented {
        // Which binaries the row is about: those its environment variables name, in order.
        let mut about: Vec<(&str, &Options)> = Vec::new();
        for env in envs {
            let candidates: Vec<_> = if let Some(rest) = env.strip_prefix('…') {
                binaries
                    .iter()
                    .filter(|(_, o)| {
                        o.get(flag)
                            .and_then(|(e, _)| e.as_deref())
                            .is_some_and(|e| e.ends_with(rest))
                    })
                    .collect()
            } else {
                binaries
                    .iter()
                    .filter(|(_, o)| o.get(flag).is_some_and(|(e, _)| e.as_deref() == Some(env)))
                    .collect()
            };
            if candidates.is_empty() {
                let helps: Vec<String> = binaries
                    .iter()
                    .filter_map(|(b, o)| Some(format!("{b}: {:?}", o.get(flag)?.0)))
                    .collect();
                wrong.push(format!(
                    "{page}: `{flag}` (`{env}`): no binary's --help gives the flag that \
                     environment variable ({helps:?})"
                ));
            }
            about.extend(candidates.into_iter().map(|(b, o)| (*b, *o)));
        }
        if about.is_empty() {
            about = binaries
                .iter()
                .filter(|(_, o)| o.contains_key(flag))
                .map(|(b, o)| (*b, *o))
                .collect();
        }
        if defaults.is_empty() || about.is_empty() {
            continue;
        }
        let pairs: Vec<(&str, &str)> = if defaults.len() == about.len() {
            about
                .iter()
                .zip(defaults)
                .map(|((b, _), d)| (*b, d.as_str()))
                .collect()
        } else {
            about
                .iter()
                .map(|(b, _)| (*b, defaults[0].as_str()))
                .collect()
        };
        for (binary, said) in pairs {
            let options = binaries.iter().find(|(b, _)| *b == binary).unwrap().1;
            let actual = options.get(flag).and_then(|(_, d)| d.clone());
            let same = match said {
                "off" | "none" => actual.is_none() || actual.as_deref() == Some("false"),
                _ => actual.as_deref() == Some(said),
            };
            if !same {
                wrong.push(format!(
                    "{page}: `{flag}` of {binary}: the page says the default is {said}, \
                     --help says {actual:?}"
                ));
            }
        }
    }
    // docs/status-applier.md: "Every `serve` flag has an environment variable".
    let serve = options_in(&help(&binary("status-applier"), &["serve"]));
    for (flag, (env, _)) in &serve {
        if env.is_none() && flag != "--help" && flag != "--version" {
            wrong.push(format!(
                "docs/status-applier.md: every `serve` flag has an environment variable, and \
                 `{flag}` has none"
            ));
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(
        wrong.is_empty(),
        "the docs' environment variables and defaults differ from --help: {wrong:#?}"
    );
}
