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
    ("crates/model", &[]),
    ("crates/guards", &["model"]),
    ("crates/render", &["model", "guards"]),
    ("crates/webhook", &["model", "guards"]),
    ("crates/agent", &["model", "guards", "render", "webhook"]),
    (
        "crates/cli",
        &["model", "guards", "render", "webhook", "agent"],
    ),
    ("crates/testbed", &["model", "guards", "render", "agent"]),
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
    for dir in crates() {
        let name = dir.rsplit('/').next().unwrap_or(dir);
        let src = repo().join(dir).join("src");
        let mut found = Vec::new();
        walk(&src, &src, &mut found);
        modules += found.len();
        for m in found {
            let dir = m.strip_suffix("mod.rs").unwrap_or(&m);
            if !doc.contains(&format!("`{name}/{m}`")) && !doc.contains(&format!("`{name}/{dir}`"))
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
