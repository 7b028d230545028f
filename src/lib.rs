//! hcp-fleet-agent: admission webhooks across a HyperShift fleet.
//!
//! One module per concern; see docs/architecture.md for how they fit together.

pub mod admission;
pub mod agent;
pub mod catalogue;
pub mod certificates;
pub mod cmd;
pub mod compare;
pub mod config;
pub mod controller;
pub mod crd;
pub mod crypto;
pub mod guards;
pub mod hosted;
pub mod human;
#[cfg(test)]
mod layers;
pub mod liveness;
#[cfg(feature = "testbed")]
pub mod localcp;
pub mod managed_clusters;
pub mod management;
pub mod metrics;
pub mod names;
pub mod overrides;
pub mod reporting;
pub mod rollout;
pub mod secure_metrics;
pub mod telemetry;
pub mod tls;

#[cfg(test)]
mod tests {
    /// docs/architecture.md names every module of `src/` (a file with its directory,
    /// `` `controller/report.rs` ``; a directory's `mod.rs` as itself or as `` `dir/` ``), so
    /// the next engineer finds the room for a change by its name there.
    /// The README renders as its author meant: each table whole (a header, its separator, and
    /// rows of as many cells, with a blank line before and after: a paragraph between two
    /// rows once turned the rest of the Layout table into text), and the Layout table names
    /// every directory of `src/`.
    #[test]
    fn the_readme_tables_are_whole_and_the_layout_names_every_directory() {
        let readme = include_str!("../README.md");
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
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for entry in std::fs::read_dir(&src).into_iter().flatten().flatten() {
            if entry.path().is_dir() {
                let dir = format!("`src/{}/`", entry.file_name().to_string_lossy());
                assert!(layout.contains(&dir), "the README's Layout misses {dir}");
            }
        }
    }

    #[test]
    fn the_architecture_names_every_module() {
        fn walk(dir: &std::path::Path, root: &std::path::Path, out: &mut Vec<String>) {
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
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut modules = Vec::new();
        walk(&root, &root, &mut modules);
        assert!(modules.len() > 60, "{modules:?}");
        let doc = include_str!("../docs/architecture.md");
        let missing: Vec<&String> = modules
            .iter()
            .filter(|m| {
                let dir = m.strip_suffix("mod.rs").unwrap_or(m);
                !doc.contains(&format!("`{m}`")) && !doc.contains(&format!("`{dir}`"))
            })
            .collect();
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
        let e2e = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e");
        let mut long = Vec::new();
        walk(&e2e, &mut long);
        assert!(long.is_empty(), "e2e files over 1,200 lines: {long:?}");
    }
}
