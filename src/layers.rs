//! The modules form layers: no module names one that names it back (docs/architecture.md,
//! "Layers"). A cycle is how a leaf module stops being one, so it is caught here, by reading
//! every `crate::` and `super::` path in `src/` outside the test modules, rather than at review.
//!
//! A file is a node (`dir/mod.rs` is `dir`). A parent names each of its children (it declares
//! them, and may re-export them); a child naming its own parent is not counted, since reading
//! what its directory shares is the point of the directory.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module paths (`controller::scope`) of every file under `root`, with their source up to the
/// first test module and without line comments.
fn modules(root: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, root, out);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path
                .strip_prefix(root)
                .map(|p| p.with_extension("").to_string_lossy().replace('\\', "/"))
                .unwrap_or_default();
            if rel == "lib" || rel == "main" {
                continue;
            }
            let name = rel.strip_suffix("/mod").unwrap_or(&rel).replace('/', "::");
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            out.insert(name, shipped(&text));
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The source before its first inline `#[cfg(test)]` module, without `//` comments.
fn shipped(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        // An inline test module ends what ships; a declared one (`mod x;`) only its own line.
        if line.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            if lines
                .peek()
                .is_some_and(|next| next.trim_end().ends_with(';'))
            {
                lines.next();
                continue;
            }
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Every path a `use` or an expression spells from `start` (the text just after `crate::` or
/// `super::`), braces expanded: `a::{b, c::d}` is `a::b` and `a::c::d`.
fn spelled(start: &str) -> Vec<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let head: String = start
        .chars()
        .take_while(|&c| ident(c) || c == ':')
        .collect();
    let rest = &start[head.len()..];
    let head = head.trim_end_matches(':').to_string();
    let Some(inner) = rest.strip_prefix('{') else {
        return vec![head];
    };
    // The brace group, split at its top-level commas.
    let (mut depth, mut parts, mut part) = (1usize, Vec::new(), String::new());
    for c in inner.chars() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => {
                parts.push(std::mem::take(&mut part));
                continue;
            }
            _ => {}
        }
        part.push(c);
    }
    parts.push(part);
    parts
        .iter()
        .flat_map(|p| spelled(p.trim()))
        .map(|tail| match (head.is_empty(), tail.is_empty()) {
            (true, _) => tail,
            (false, true) => head.clone(),
            (false, false) => format!("{head}::{tail}"),
        })
        .collect()
}

/// The module a path names: its longest prefix that is a module.
fn module_of(path: &str, known: &BTreeSet<&str>) -> Option<String> {
    let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    (1..=segs.len())
        .rev()
        .map(|k| segs[..k].join("::"))
        .find(|m| known.contains(m.as_str()))
}

/// Who names whom: a parent its children, a child naming its ancestors left out.
fn edges(mods: &BTreeMap<String, String>) -> BTreeMap<&str, BTreeSet<String>> {
    let known: BTreeSet<&str> = mods.keys().map(String::as_str).collect();
    let mut out: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (m, text) in mods {
        let parent = m.rsplit_once("::").map_or("", |(p, _)| p);
        let mut named = Vec::new();
        for (i, _) in text.match_indices("crate::") {
            named.extend(spelled(&text[i + "crate::".len()..]));
        }
        for (i, _) in text.match_indices("super::") {
            // `super::super::` is read from its first `super`, once.
            if text[..i].ends_with("super::") {
                continue;
            }
            let mut base: Vec<&str> = parent.split("::").filter(|s| !s.is_empty()).collect();
            let mut rest = &text[i + "super::".len()..];
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
            let prefix = base.join("::");
            named.extend(spelled(rest).into_iter().map(|p| {
                if prefix.is_empty() {
                    p
                } else {
                    format!("{prefix}::{p}")
                }
            }));
        }
        if !parent.is_empty() {
            out.entry(parent).or_default().insert(m.clone());
        }
        let targets = out.entry(m.as_str()).or_default();
        for path in named {
            if let Some(t) = module_of(&path, &known) {
                let ancestor = m.starts_with(&format!("{t}::"));
                if t != *m && !ancestor {
                    targets.insert(t);
                }
            }
        }
    }
    out
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(edges: &BTreeMap<&str, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<&'a str, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on_stack: BTreeSet<String>,
        found: Vec<Vec<String>>,
    }
    impl Walk<'_> {
        fn visit(&mut self, v: &str) {
            let i = self.index.len();
            self.index.insert(v.to_string(), i);
            self.low.insert(v.to_string(), i);
            self.stack.push(v.to_string());
            self.on_stack.insert(v.to_string());
            let next: Vec<String> = self
                .edges
                .get(v)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default();
            for w in next {
                if !self.index.contains_key(&w) {
                    self.visit(&w);
                    let lw = self.low[&w];
                    let lv = self.low[v];
                    self.low.insert(v.to_string(), lv.min(lw));
                } else if self.on_stack.contains(&w) {
                    let iw = self.index[&w];
                    let lv = self.low[v];
                    self.low.insert(v.to_string(), lv.min(iw));
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(&w);
                    let done = w == v;
                    component.push(w);
                    if done {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(*v) {
            walk.visit(v);
        }
    }
    walk.found
}

#[test]
fn braces_and_supers_are_read_as_the_compiler_reads_them() {
    assert_eq!(spelled("a::b::C;"), ["a::b::C"]);
    let text = "use crate::a;\n#[cfg(test)]\nmod cases;\nuse crate::b;\n#[cfg(test)]\nmod tests {\nuse crate::c;\n}\n";
    assert_eq!(shipped(text), "use crate::a;\nuse crate::b;\n");
    assert_eq!(spelled("{a::{B, c::D}, e};"), ["a::B", "a::c::D", "e"]);
    let mods: BTreeMap<String, String> = [
        ("x::y", "use super::{z, w::V};"),
        ("x::z", "fn f() { super::super::top::g() }"),
        ("x", "mod y; mod z;"),
        ("x::w", "use crate::x::Shared;"),
        ("top", ""),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let e = edges(&mods);
    assert_eq!(e["x::y"], BTreeSet::from(["x::z".into(), "x::w".into()]));
    assert_eq!(e["x::z"], BTreeSet::from(["top".into()]));
    assert_eq!(
        e["x"],
        BTreeSet::from(["x::y".into(), "x::z".into(), "x::w".into()])
    );
    // A child naming its parent is not an edge.
    assert!(e["x::w"].is_empty());
    assert!(cycles(&e).is_empty());
    let mut e = e;
    e.entry("top").or_default().insert("x::y".into());
    assert_eq!(cycles(&e), [vec!["top", "x::y", "x::z"]]);
    // Through a parent: naming `x` names what it declares.
    let mut e = edges(&mods);
    e.entry("top").or_default().insert("x".into());
    assert_eq!(cycles(&e), [vec!["top", "x", "x::y", "x::z"]]);
}

#[test]
fn no_module_names_one_that_names_it_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&root);
    assert!(mods.len() > 60, "{} modules found", mods.len());
    let e = edges(&mods);
    // The graph is really read: a file known to name another is seen to.
    assert!(e["controller::canary"].contains("guards::canary"), "{e:?}");
    let found = cycles(&e);
    assert!(found.is_empty(), "import cycles: {found:?}");
}
