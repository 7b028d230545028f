//! Checks on the repository as a whole, run with the unit tests (`cargo test --workspace
//! --lib --bins`): the crates depend only downward, and the README and docs/architecture.md
//! name what the crates hold.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The crates from the bottom up, each with the crates it may depend on: those below it only
/// (render and webhook side by side, neither on the other; the test bed beside cli, neither on
/// the other).
const ALLOWED: &[(&str, &[&str])] = &[
    ("src/model", &[]),
    ("src/guards", &["model"]),
    ("src/render", &["model", "guards"]),
    ("src/webhook", &["model", "guards"]),
    ("src/agent", &["model", "guards", "render", "webhook"]),
    (
        "src/cli",
        &["model", "guards", "render", "webhook", "agent"],
    ),
    ("src/testbed", &["model", "guards", "render", "agent"]),
    (
        "e2e",
        &[
            "model", "guards", "render", "webhook", "agent", "cli", "testbed",
        ],
    ),
];

fn crates() -> impl Iterator<Item = &'static str> {
    ALLOWED.iter().map(|(dir, _)| *dir)
}

/// Each crate's `[dependencies]` on the project's own crates: only crates below it (webhook
/// knows the guards, never the renderings or the agent; nothing the image ships knows the test
/// bed). cargo refuses a cycle; this refuses an upward or sideways edge before it becomes one.
#[test]
fn each_crate_depends_only_on_crates_below_it() {
    for (dir, may) in ALLOWED {
        let manifest = std::fs::read_to_string(repo().join(dir).join("Cargo.toml"))
            .unwrap_or_else(|e| panic!("{dir}/Cargo.toml: {e}"));
        let deps = manifest
            .split("\n[dependencies]\n")
            .nth(1)
            .and_then(|rest| rest.split("\n[").next())
            .unwrap_or_default();
        for line in deps.lines() {
            let Some(name) = line.split('=').next().map(str::trim) else {
                continue;
            };
            if let Some(ours) = name.strip_prefix("hcp-fleet-") {
                assert!(
                    may.contains(&ours),
                    "{dir} depends on {name}, which is not below it"
                );
            }
        }
    }
    // Every member of the workspace is in the order.
    let root = std::fs::read_to_string(repo().join("Cargo.toml")).expect("Cargo.toml");
    for dir in crates() {
        assert!(
            root.contains(&format!("\"{dir}\"")),
            "{dir} is not a member"
        );
    }
    assert_eq!(
        root.matches("    \"").count(),
        ALLOWED.len(),
        "a member of the workspace missing from ALLOWED"
    );
}

/// docs/architecture.md names every module of `src/` (a file with its directory,
/// `` `controller/report.rs` ``; a directory's `mod.rs` as itself or as `` `dir/` ``), so
/// the next engineer finds the room for a change by its name there.
/// The README renders as its author meant: each table whole (a header, its separator, and
/// rows of as many cells, with a blank line before and after: a paragraph between two
/// rows once turned the rest of the Layout table into text), and the Layout table names
/// every crate.
#[test]
fn the_readme_tables_are_whole_and_the_layout_names_every_directory() {
    let readme = include_str!("../../README.md");
    let lines: Vec<&str> = readme.lines().collect();
    let cells = |l: &str| {
        // `|` inside a code span is text, not a cell boundary.
        let mut n = 0;
        let mut code = false;
        for ch in l.chars() {
            match ch {
                '`' => code = !code,
                '|' if !code => n += 1,
                _ => {}
            }
        }
        n
    };
    let mut i = 0;
    let mut tables = 0;
    while i < lines.len() {
        if !lines[i].starts_with('|') {
            i += 1;
            continue;
        }
        let start = i;
        while i < lines.len() && lines[i].starts_with('|') {
            i += 1;
        }
        let table = &lines[start..i];
        tables += 1;
        assert!(
            table.len() >= 3 && table[1].replace(['|', '-', ' ', ':'], "").is_empty(),
            "line {}: a table needs a header, a separator and rows: {table:?}",
            start + 1
        );
        assert!(
            start == 0 || lines[start - 1].trim().is_empty(),
            "line {}: no blank line before the table",
            start + 1
        );
        assert!(
            i == lines.len() || lines[i].trim().is_empty(),
            "line {}: text right after a table's last row",
            i + 1
        );
        let want = cells(table[0]);
        for (k, row) in table.iter().enumerate() {
            assert_eq!(cells(row), want, "line {}: {row}", start + k + 1);
        }
    }
    assert!(tables >= 2, "the README's tables: {tables}");
    let layout = readme
        .split("## Layout")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .unwrap_or_default();
    for krate in crates() {
        let dir = format!("`{krate}/`");
        assert!(layout.contains(&dir), "the README's Layout misses {dir}");
    }
}

/// The top level is the card's (`Cargo.toml`, `src`, `charts`, `policies`, `e2e`, `docs`,
/// `Makefile`) and the files that must sit beside them (the README, the lock file, the tools'
/// settings, `hack`, `Containerfile`), and `src/` holds the crates and nothing else.
#[test]
fn the_top_level_is_the_cards_and_src_holds_the_crates() {
    const TOP: &[&str] = &[
        "Cargo.toml",
        "src",
        "charts",
        "policies",
        "e2e",
        "docs",
        "Makefile",
        "README.md",
        "Cargo.lock",
        "clippy.toml",
        "deny.toml",
        "rust-toolchain.toml",
        "hack",
        "Containerfile",
        "target",
    ];
    let entries = |dir: PathBuf| -> Vec<String> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| !n.starts_with('.'))
            .collect()
    };
    let stray: Vec<String> = entries(repo())
        .into_iter()
        .filter(|n| !TOP.contains(&n.as_str()))
        .collect();
    assert!(stray.is_empty(), "at the top, not the card's: {stray:?}");
    let crates: Vec<&str> = crates().filter_map(|c| c.strip_prefix("src/")).collect();
    assert_eq!(
        crates.len(),
        ALLOWED.len() - 1,
        "every crate but e2e under src/"
    );
    let stray: Vec<String> = entries(repo().join("src"))
        .into_iter()
        .filter(|n| !crates.contains(&n.as_str()))
        .collect();
    assert!(stray.is_empty(), "in src/, not a crate: {stray:?}");
}

/// docs/architecture.md names every module of every crate, as `` `<crate>/<path>` `` (a
/// directory's `mod.rs` as itself or as `` `<crate>/<dir>/` ``), so the next engineer finds
/// the room for a change by its name there.
#[test]
fn the_architecture_names_every_module() {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(root)
                    .map(|p| p.to_string_lossy().replace('\\', "/"))
                    .unwrap_or_default();
                if rel != "lib.rs" && rel != "main.rs" {
                    out.push(rel);
                }
            }
        }
    }
    let doc = include_str!("../../docs/architecture.md");
    let mut missing = Vec::new();
    let mut modules = 0;
    for dir_of_crate in crates() {
        let name = dir_of_crate.rsplit('/').next().unwrap_or(dir_of_crate);
        let src = repo().join(dir_of_crate).join("src");
        let mut found = Vec::new();
        walk(&src, &src, &mut found);
        modules += found.len();
        for m in found {
            let dir = m.strip_suffix("mod.rs").unwrap_or(&m);
            // By crate and module (`agent/grid.rs`), or by the path from the top (`e2e/src/dev.rs`,
            // where the crate's name is a directory of the top too).
            if !doc.contains(&format!("`{name}/{m}`"))
                && !doc.contains(&format!("`{name}/{dir}`"))
                && !doc.contains(&format!("`{dir_of_crate}/src/{m}`"))
            {
                missing.push(format!("{name}/{m}"));
            }
        }
    }
    assert!(modules > 60, "{modules} modules");
    assert!(
        missing.is_empty(),
        "docs/architecture.md does not name {missing:?}"
    );
}

/// The e2e suite is split by concern: no file of it over 1,200 lines (a file that grows past
/// that gets a module of its own, as `e2e/agent/` and `e2e/admission/` have).
#[test]
fn no_e2e_file_is_over_1200_lines() {
    fn walk(dir: &std::path::Path, long: &mut Vec<(String, usize)>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, long);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let lines = std::fs::read_to_string(&path)
                    .map(|t| t.lines().count())
                    .unwrap_or(0);
                if lines > 1200 {
                    long.push((path.display().to_string(), lines));
                }
            }
        }
    }
    let e2e = repo().join("e2e");
    let mut long = Vec::new();
    walk(&e2e, &mut long);
    assert!(long.is_empty(), "e2e files over 1,200 lines: {long:?}");
}

/// Paths the docs and comments name that are not this repository's to hold: another
/// repository's (Kubernetes' `hack/lib/version.sh`, MCVW's SelectorSyncSet templates), files a
/// test writes in a scratch crate, an annotation key that reads like a path.
const NAMED_ELSEWHERE: &[&str] = &[
    "hack/lib/version.sh",
    "hack/templates/00-managed-cluster-validating-webhooks-hs.SelectorSyncSet.yaml.tmpl",
    "src/main.rs",
    "src/lib.rs",
    "e2e/nudge",
];

/// The anchors of a Markdown file's headings, as GitHub makes them: lower case, letters,
/// digits, `-` and `_` kept, spaces to `-`, anything else dropped, a repeated one numbered.
fn anchors(text: &str) -> (Vec<String>, Vec<String>) {
    let mut slugs = Vec::new();
    let mut titles = Vec::new();
    let mut seen = std::collections::HashMap::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(title) = line
            .strip_prefix('#')
            .map(|l| l.trim_start_matches('#'))
            .filter(|l| !fenced && l.starts_with(' '))
            .map(str::trim)
        else {
            continue;
        };
        let slug: String = title
            .chars()
            .flat_map(char::to_lowercase)
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0usize);
        let numbered = if *n == 0 { slug } else { format!("{slug}-{n}") };
        *n += 1;
        slugs.push(numbered);
        titles.push(title.replace('`', ""));
    }
    (slugs, titles)
}

/// The files whose text may name a path: Markdown, Rust, shell and Python, the Makefile and
/// the Containerfile, outside `target`, hidden directories and test data.
fn named_in(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') && name != "testdata" {
                named_in(&path, out);
            }
        } else if ["md", "rs", "sh", "py"]
            .iter()
            .any(|e| path.extension().is_some_and(|x| x == *e))
            || name == "Makefile"
            || name == "Containerfile"
        {
            out.push(path);
        }
    }
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_.-/".contains(c)
}

/// What one line names that leads nowhere, from the top of the repository `root`.
struct Names<'a> {
    root: &'a Path,
    named: usize,
    wrong: Vec<String>,
}

impl Names<'_> {
    /// The paths by their first directory, each one's `#anchor` and quoted section.
    fn paths(&mut self, line: &str, at: &dyn Fn(String) -> String) {
        for start in [
            "docs/",
            "src/",
            "e2e/",
            "hack/",
            "charts/",
            "policies/",
            "src/",
        ] {
            for (i, _) in line.match_indices(start) {
                if line[..i].chars().next_back().is_some_and(is_path_char) {
                    continue;
                }
                let tail = &line[i..];
                let len = tail.find(|c: char| !is_path_char(c)).unwrap_or(tail.len());
                let path = tail[..len].trim_end_matches(['.', '/']);
                if path.len() <= start.len()
                    || path.ends_with(".tmp")
                    || NAMED_ELSEWHERE.contains(&path)
                {
                    continue;
                }
                self.named += 1;
                self.path(path, &tail[len..], at);
            }
        }
    }

    fn path(&mut self, path: &str, after: &str, at: &dyn Fn(String) -> String) {
        let exists = if path.ends_with('-') || after.starts_with(['*', '<']) {
            let (dir, stem) = path.rsplit_once('/').unwrap_or(("", path));
            std::fs::read_dir(self.root.join(dir))
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(stem))
        } else {
            self.root.join(path).exists()
        };
        if !exists {
            self.wrong.push(at(format!("no {path}")));
            return;
        }
        let Some((slugs, titles)) = path
            .ends_with(".md")
            .then(|| std::fs::read_to_string(self.root.join(path)).ok())
            .flatten()
            .map(|t| anchors(&t))
        else {
            return;
        };
        if let Some(anchor) = after.strip_prefix('#') {
            let anchor: String = anchor.chars().take_while(|c| is_path_char(*c)).collect();
            let anchor = anchor.trim_end_matches('.');
            if !slugs.iter().any(|s| s == anchor) {
                self.wrong
                    .push(at(format!("no heading #{anchor} in {path}")));
            }
        }
        let quoted = after
            .strip_prefix(", \"")
            .or_else(|| after.strip_prefix(" (\""));
        if let Some(title) = quoted.and_then(|q| q.split_once('"')).map(|(t, _)| t)
            && !titles.iter().any(|t| t == title)
        {
            self.wrong
                .push(at(format!("no section \"{title}\" in {path}")));
        }
    }

    /// Markdown links from `file` to files of the repository, and their anchors.
    fn links(&mut self, file: &Path, line: &str, at: &dyn Fn(String) -> String) {
        for (i, _) in line.match_indices("](") {
            let Some(target) = line[i + 2..].split([')', ' ']).next() else {
                continue;
            };
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            self.named += 1;
            let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
            let to = if path.is_empty() {
                file.to_path_buf()
            } else {
                file.parent().unwrap_or(self.root).join(path)
            };
            if !to.exists() {
                self.wrong.push(at(format!("no {target}")));
                continue;
            }
            if !anchor.is_empty()
                && to.extension().is_some_and(|e| e == "md")
                && let Some((slugs, _)) = std::fs::read_to_string(&to).ok().map(|t| anchors(&t))
                && !slugs.iter().any(|s| s == anchor)
            {
                self.wrong
                    .push(at(format!("no heading #{anchor} in {target}")));
            }
        }
    }
}

/// Every repository path a doc, a comment or a script names exists (`docs/…`, `src/…`,
/// `e2e/…`, `hack/…`, `charts/…`, `policies/…`, `src/…`; a name ending in `-` or followed by
/// `*` or `<` is a prefix some file has), every `#anchor` after a Markdown file's path or in a
/// Markdown link is one of its headings, and every section named after one in quotes
/// (`<page>.md, "Title"` or `<page>.md ("Title")` after a page's path) is one of its headings.
#[test]
fn every_path_anchor_and_section_the_docs_and_comments_name_exists() {
    let root = repo();
    let root = root.canonicalize().unwrap_or(root);
    let mut files = Vec::new();
    named_in(&root, &mut files);
    assert!(files.len() > 100, "{} files", files.len());
    let mut names = Names {
        root: &root,
        named: 0,
        wrong: Vec::new(),
    };
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let rel = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        for (ln, line) in text.lines().enumerate() {
            let at = |what: String| format!("{rel}:{}: {what}", ln + 1);
            names.paths(line, &at);
            if rel.ends_with(".md") {
                names.links(file, line, &at);
            }
        }
    }
    assert!(
        names.named > 200,
        "only {} names found: is the scan broken?",
        names.named
    );
    assert!(
        names.wrong.is_empty(),
        "{} names that lead nowhere:\n{}",
        names.wrong.len(),
        names.wrong.join("\n")
    );
}
