//! The layering ARCHITECTURE.md describes, checked: the top-level modules of src (`src/NAME.rs`
//! or `src/NAME/`) import each other through `crate::` paths without a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `from -> to -> files of from that import to`.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module names a source text reaches through `crate::NAME` and
/// `crate::{NAME, NAME::..}`.
fn crate_paths(text: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue; // `other_crate::`, `foo::crate::` (`$crate::` in a macro is this crate)
        }
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group: after `{` or a `,` at depth 0.
            let mut depth = 0;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        start = false;
                        let name = ident(&group[j..]);
                        if !name.is_empty() && name != "self" {
                            out.insert(name);
                        }
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut g = Graph::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        let module = first.trim_end_matches(".rs").to_string();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for to in crate_paths(&text) {
            if to != module {
                g.entry(module.clone())
                    .or_default()
                    .entry(to)
                    .or_default()
                    .insert(format!("src/{}", rel.display()));
            }
        }
    }
    g
}

/// One cycle, if there is any: the modules in order, the first repeated at the end.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    fn visit(g: &Graph, node: &str, stack: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for next in g.get(node).into_iter().flat_map(|m| m.keys()) {
            if let Some(c) = visit(g, next, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys().find_map(|n| visit(g, n, &mut Vec::new(), &mut done))
}

fn describe(g: &Graph, cycle: &[String]) -> String {
    let mut out = format!("import cycle: {}\n", cycle.join(" -> "));
    for pair in cycle.windows(2) {
        let files = &g[&pair[0]][&pair[1]];
        out.push_str(&format!(
            "  {} -> {}: {}\n",
            pair[0],
            pair[1],
            files.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    out
}

#[test]
fn top_level_modules_import_each_other_without_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    assert!(g.len() >= 10, "the scan found the modules: {:?}", g.keys());
    if let Some(cycle) = find_cycle(&g) {
        panic!("{}", describe(&g, &cycle));
    }
}

#[test]
fn the_scan_sees_every_import_form_and_reports_a_cycle_with_its_files() {
    let paths = crate_paths(
        "use crate::a::B;\nuse crate::{b, c::{D, E}, self};\nlet x = crate::d::f();\nmacro_rules! m { () => { $crate::e::F } }\nuse other_crate::g;",
    );
    assert_eq!(paths, ["a", "b", "c", "d", "e"].map(String::from).into());

    fn edge(g: &mut Graph, from: &str, to: &str, file: &str) {
        g.entry(from.into())
            .or_default()
            .entry(to.into())
            .or_default()
            .insert(file.into());
    }
    let mut g = Graph::new();
    edge(&mut g, "proxy", "jobs", "src/proxy/mod.rs");
    edge(&mut g, "jobs", "wire", "src/jobs/mod.rs");
    assert_eq!(find_cycle(&g), None);
    edge(&mut g, "wire", "proxy", "src/wire/body.rs");
    let cycle = find_cycle(&g).expect("a cycle");
    let text = describe(&g, &cycle);
    assert!(text.contains("jobs -> wire: src/jobs/mod.rs"), "{text}");
    assert!(text.contains("wire -> proxy: src/wire/body.rs"), "{text}");
}

/// Code lines of a source text outside `#[cfg(test)] mod ... { }` blocks: (line number, text),
/// blank lines and `//` comment lines left out.
fn code_lines(text: &str) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let is_test_mod = lines[i].trim() == "#[cfg(test)]"
            && lines.get(i + 1).is_some_and(|l| {
                let l = l.trim_start();
                (l.starts_with("mod ") || l.starts_with("pub mod ")) && l.ends_with('{')
            });
        if is_test_mod {
            let mut depth = 0i64;
            i += 1;
            while i < lines.len() {
                depth += lines[i].matches('{').count() as i64 - lines[i].matches('}').count() as i64;
                i += 1;
                if depth <= 0 {
                    break;
                }
            }
            continue;
        }
        let t = lines[i].trim();
        if !t.is_empty() && !t.starts_with("//") {
            out.push((i + 1, lines[i]));
        }
        i += 1;
    }
    out
}

/// Functions (name, first line, code lines) of a file's code lines.
fn functions<'a>(code: &[(usize, &'a str)]) -> Vec<(&'a str, usize, usize)> {
    let mut out = Vec::new();
    for (k, (line, text)) in code.iter().enumerate() {
        let t = text.trim_start();
        let t = t
            .strip_prefix("pub(super) ")
            .or_else(|| t.strip_prefix("pub(crate) "))
            .unwrap_or(t);
        let t = t.strip_prefix("pub ").unwrap_or(t);
        let t = t.strip_prefix("async ").unwrap_or(t);
        let t = t.strip_prefix("const ").unwrap_or(t);
        let Some(rest) = t.strip_prefix("fn ") else { continue };
        if text.trim_end().ends_with(';') {
            continue;
        }
        let name: &str = rest
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .unwrap_or("");
        let (mut depth, mut started, mut n) = (0i64, false, 0);
        for (_, l) in &code[k..] {
            n += 1;
            depth += l.matches('{').count() as i64 - l.matches('}').count() as i64;
            started |= l.contains('{');
            if started && depth <= 0 {
                break;
            }
        }
        out.push((name, *line, n));
    }
    out
}

/// Functions allowed past the limit, each with its reason.
const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[(
    "src/metrics.rs",
    "new",
    "the one table of metric families: a flat list of definitions, one statement each",
)];

#[test]
fn no_file_over_800_code_lines_and_no_function_over_100() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut over = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let rel = format!("src/{}", file.strip_prefix(&src).unwrap().display());
        let code = code_lines(&text);
        if code.len() > 800 {
            over.push(format!("{rel}: {} code lines", code.len()));
        }
        for (name, line, n) in functions(&code) {
            let allowed = LONG_FUNCTIONS.iter().any(|(f, fun, _)| *f == rel && *fun == name);
            if n > 100 && !allowed {
                over.push(format!("{rel}:{line}: fn {name} has {n} code lines"));
            }
        }
    }
    assert!(
        over.is_empty(),
        "over the size limits (split by concept):\n{}",
        over.join("\n")
    );
}

#[test]
fn the_size_scan_skips_tests_and_counts_functions() {
    let text = "fn a() {\n    let x = 1;\n\n    // note\n}\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\npub async fn b(\n    y: u8,\n) -> u8 {\n    y\n}\n";
    let code = code_lines(text);
    assert_eq!(code.len(), 8, "{code:?}");
    assert_eq!(functions(&code), vec![("a", 1, 3), ("b", 10, 5)]);
}
