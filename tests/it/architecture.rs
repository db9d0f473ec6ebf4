//! The layering and the code map of ARCHITECTURE.md, checked: the layer table is [`LAYERS`] and
//! [`SAME_LAYER`] (ARCHITECTURE.md's table is written from them: `UPDATE_EXPECT=1 cargo test --test
//! it architecture` rewrites it), every import between top-level modules of src (`src/NAME.rs` or
//! `src/NAME/`, through `crate::` paths) goes down a layer or along a declared edge, there is no
//! cycle, every file of src is in the code map, and every path or item the code map names exists
//! (in the manner of rust-analyzer's tidy tests).

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
    paths_after(text, "crate::")
}

/// The names a source text reaches through `PREFIX NAME` and `PREFIX {NAME, NAME::..}` (`prefix`
/// being `crate::` or `super::`).
fn paths_after(text: &str, prefix: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices(prefix) {
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue; // `other_crate::`, `foo::crate::` (`$crate::` in a macro is this crate)
        }
        let rest = &text[i + prefix.len()..];
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

/// Adds the import `from -> to` of `file` to `g` (for the tests of the scan itself).
fn edge(g: &mut Graph, from: &str, to: &str, file: &str) {
    g.entry(from.into())
        .or_default()
        .entry(to.into())
        .or_default()
        .insert(file.into());
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

/// The layers, lowest first: (layer, its modules, what it is). A module may import any module of
/// a lower layer, and one of its own layer only along an edge of [`SAME_LAYER`].
const LAYERS: &[(&str, &[&str], &str)] = &[
    (
        "words",
        &["words"],
        "the spellings metrics, logs, config and errors share, each defined once",
    ),
    (
        "leaves",
        &["time", "tasks", "workers", "testing", "credentials", "config", "metrics"],
        "the clock, the one way to start a task, the threads that serve connections, unit-test helpers, the credential forms, the typed configuration, every metric",
    ),
    (
        "vocabulary",
        &["wire", "error", "routing", "telemetry"],
        "the HTTP vocabulary, rebound's own errors, the route table, the log subscriber",
    ),
    (
        "policy (pure)",
        &["retry", "limits", "continuation"],
        "retry decisions, backoff, Retry-After, budgets, quotas; limits' buckets, ledgers and fair queue; a cut stream's transcript, continuation request, seam and splice",
    ),
    (
        "I/O edges",
        &["redis", "upstream", "traces", "cloud", "journal"],
        "the Redis connection, the upstream pools, the trace exporter, the cloud credentials, the journal of what the metrics' series show",
    ),
    (
        "features",
        &["circuit", "idempotency", "cache", "dead_letters", "jobs", "targets", "limiter"],
        "what the pipeline composes, each with its shared state",
    ),
    ("pipeline", &["proxy"], "a request's path, top-down"),
    (
        "process",
        &["shutdown", "reload", "admin", "console", "server", "cli", "fuzzing", "hooks"],
        "listeners, the drain, reloads, the admin API, the operator's console, the command line, the entry points of fuzz targets, tests and benchmarks",
    ),
];

/// The imports allowed within a layer: (from, to, why).
const SAME_LAYER: &[(&str, &str, &str)] = &[
    (
        "config",
        "testing",
        "its property tests share the seeded proptest configuration",
    ),
    ("metrics", "config", "it exports the series a configuration determines"),
    (
        "config",
        "credentials",
        "the credential list in force is part of the configuration, and the default scope",
    ),
    ("error", "wire", "error responses carry rebound's header names"),
    ("traces", "upstream", "spans are exported over an upstream pool"),
    (
        "cloud",
        "upstream",
        "the credential services are called with the upstreams' TLS trust",
    ),
    (
        "dead_letters",
        "idempotency",
        "a dead letter keeps its request's idempotency identity",
    ),
    ("jobs", "idempotency", "a job keeps its request's idempotency identity"),
    (
        "cache",
        "idempotency",
        "the cache stores and follows responses with the idempotency records",
    ),
    (
        "dead_letters",
        "jobs",
        "a dead letter's body is sealed at rest as a job's credentials are",
    ),
    ("server", "admin", "the server starts the admin listener"),
    (
        "admin",
        "console",
        "the admin listener serves the console and its views",
    ),
    ("server", "reload", "the server starts the reload watcher"),
    ("server", "shutdown", "client connections watch the drain signal"),
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, modules, _)| modules.contains(&module))
}

/// The imports that go up a layer, or along an undeclared edge of one layer, and the modules in no
/// layer, each with the files that import.
fn layer_violations(g: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    for (from, tos) in g {
        let Some(lf) = layer_of(from) else {
            out.push(format!("module `{from}` is in no layer of LAYERS"));
            continue;
        };
        for (to, files) in tos {
            let Some(lt) = layer_of(to) else {
                out.push(format!("module `{to}` (imported by `{from}`) is in no layer of LAYERS"));
                continue;
            };
            let declared = SAME_LAYER.iter().any(|(f, t, _)| f == from && t == to);
            if lt > lf || (lt == lf && !declared) {
                out.push(format!(
                    "undeclared edge {from} ({}) -> {to} ({}): {}",
                    LAYERS[lf].0,
                    LAYERS[lt].0,
                    files.iter().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    for (from, to, _) in SAME_LAYER {
        if !g.get(*from).is_some_and(|tos| tos.contains_key(*to)) {
            out.push(format!(
                "declared edge {from} -> {to} is not used: remove it from SAME_LAYER"
            ));
        }
    }
    out
}

/// ARCHITECTURE.md's layer table, written from [`LAYERS`] and [`SAME_LAYER`].
fn layer_table() -> String {
    let mut t = String::from("| layer | modules | what | may import |\n| --- | --- | --- | --- |\n");
    for (i, (name, modules, what)) in LAYERS.iter().enumerate() {
        let names = modules.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", ");
        let mut may = vec![if i == 0 {
            "nothing below".to_string()
        } else {
            "the layers above this row".to_string()
        }];
        for (from, to, why) in SAME_LAYER.iter().filter(|(f, _, _)| modules.contains(f)) {
            may.push(format!("`{from}` -> `{to}` ({why})"));
        }
        t.push_str(&format!("| {name} | {names} | {what} | {} |\n", may.join("; ")));
    }
    t
}

const TABLE_START: &str = "<!-- layers: written by tests/it/architecture.rs -->\n";
const TABLE_END: &str = "<!-- end of layers -->";

#[test]
fn every_import_goes_down_a_layer_or_along_a_declared_edge() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    let mut problems = layer_violations(&g);
    // Every top-level module is in the table, imported or not.
    for entry in std::fs::read_dir(&src).unwrap() {
        let name = entry
            .unwrap()
            .file_name()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if name != "lib" && name != "main" && layer_of(&name).is_none() {
            problems.push(format!("module `{name}` is in no layer of LAYERS"));
        }
    }
    problems.dedup();
    assert!(
        problems.is_empty(),
        "the layer table is broken:\n{}",
        problems.join("\n")
    );
}

#[test]
fn architecture_md_shows_the_layer_table_of_this_test() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find(TABLE_START).expect("the layer table's start marker") + TABLE_START.len();
    let end = start + text[start..].find(TABLE_END).expect("the layer table's end marker");
    let want = layer_table();
    if text[start..end] != want {
        if std::env::var_os("UPDATE_EXPECT").is_some() {
            std::fs::write(&path, format!("{}{want}{}", &text[..start], &text[end..])).unwrap();
        } else {
            panic!("ARCHITECTURE.md's layer table is not LAYERS (run with UPDATE_EXPECT=1 to write it):\n{want}");
        }
    }
}

#[test]
fn an_undeclared_edge_fails_and_names_its_files() {
    let mut g = Graph::new();
    for (from, to, _) in SAME_LAYER {
        edge(&mut g, from, to, "declared");
    }
    edge(&mut g, "proxy", "wire", "src/proxy/mod.rs");
    assert_eq!(layer_violations(&g), Vec::<String>::new());
    edge(&mut g, "wire", "proxy", "src/wire/body.rs");
    edge(&mut g, "circuit", "jobs", "src/circuit/mod.rs");
    edge(&mut g, "nowhere", "wire", "src/nowhere.rs");
    let v = layer_violations(&g);
    assert!(
        v.contains(&"undeclared edge wire (vocabulary) -> proxy (pipeline): src/wire/body.rs".to_string()),
        "{v:?}"
    );
    assert!(
        v.contains(&"undeclared edge circuit (features) -> jobs (features): src/circuit/mod.rs".to_string()),
        "{v:?}"
    );
    assert!(
        v.contains(&"module `nowhere` is in no layer of LAYERS".to_string()),
        "{v:?}"
    );
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
    "src/metrics/mod.rs",
    "new",
    "the one table of metric families: a flat list of definitions, one statement each",
)];

#[test]
fn no_file_over_600_code_lines_and_no_function_over_100() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut over = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let rel = format!("src/{}", file.strip_prefix(&src).unwrap().display());
        let code = code_lines(&text);
        if code.len() > 600 {
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

/// The names a file of the pipeline's folder reaches through `super::NAME` and
/// `super::{NAME, ..}` in its code lines (not its tests): a sibling module, or an item of
/// `mod.rs`.
fn super_paths(code: &[(usize, &str)]) -> BTreeSet<String> {
    let text: String = code.iter().map(|(_, l)| format!("{l}\n")).collect();
    paths_after(&text, "super::")
}

#[test]
fn the_pipeline_folder_imports_without_a_cycle_and_never_back_up() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/proxy");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let module = |f: &Path| f.file_stem().unwrap().to_string_lossy().into_owned();
    let siblings: BTreeSet<String> = files.iter().map(|f| module(f)).collect();
    let (mut g, mut up) = (Graph::new(), Vec::new());
    for file in files.iter().filter(|f| module(f) != "mod") {
        let text = std::fs::read_to_string(file).unwrap();
        let code = code_lines(&text);
        for name in super_paths(&code) {
            let rel = format!("src/proxy/{}.rs", module(file));
            match siblings.contains(&name) {
                true => edge(&mut g, &module(file), &name, &rel),
                false => up.push(format!("{rel} imports `super::{name}` from mod.rs")),
            }
        }
    }
    assert!(
        up.is_empty(),
        "a step reaches back up into the pipeline:\n{}",
        up.join("\n")
    );
    if let Some(cycle) = find_cycle(&g) {
        panic!("a cycle in src/proxy: {}", describe(&g, &cycle));
    }
}

/// The parameters of each function of a file's code lines: (name, line, count), `self`
/// included, a tuple pattern counted once (as clippy's `too_many_arguments` counts them).
fn parameters<'a>(code: &[(usize, &'a str)]) -> Vec<(&'a str, usize, usize)> {
    parameters_of(code, false)
}

/// [`parameters`], each field of a tuple pattern counted (`tuples`): a tuple is not a way around
/// the limit.
fn parameters_of<'a>(code: &[(usize, &'a str)], tuples: bool) -> Vec<(&'a str, usize, usize)> {
    let mut out = Vec::new();
    for (name, line, _) in functions(code) {
        let k = code.iter().position(|(l, _)| *l == line).unwrap();
        let text: String = code[k..].iter().map(|(_, l)| format!("{l}\n")).collect();
        let after_name = &text[text.find(&format!("fn {name}")).unwrap() + 3 + name.len()..];
        let (mut depth, mut commas, mut any, mut prev) = (0i64, 0, false, ' ');
        let (mut in_params, mut in_pattern) = (false, true);
        for c in after_name.chars() {
            in_params |= c == '(' && depth == 0;
            match c {
                '(' | '<' | '[' | '{' => depth += 1,
                '>' if prev == '-' => {}
                ')' | '>' | ']' | '}' => {
                    depth -= 1;
                    if depth == 0 && c == ')' {
                        break;
                    }
                }
                ',' if in_params && depth == 1 => {
                    commas += 1;
                    any = false;
                    in_pattern = true;
                }
                ':' if in_params && depth == 1 => in_pattern = false,
                // A field of a tuple pattern is a parameter too.
                ',' if in_params && depth == 2 && in_pattern && tuples => commas += 1,
                c if in_params && depth == 1 && !c.is_whitespace() => any = true,
                _ => {}
            }
            prev = c;
        }
        // A parameter after the last comma, unless the list ends with one.
        out.push((name, line, commas + usize::from(any)));
    }
    out
}

/// No function of the crate takes more than six parameters, `self` and each field of a tuple or
/// struct pattern counted (test-only code aside: a `tests` folder, and what follows
/// `#[cfg(test)]`).
#[test]
fn no_function_takes_more_than_six_parameters() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let mut over = Vec::new();
    for file in files
        .into_iter()
        .filter(|f| !f.components().any(|c| c.as_os_str() == "tests"))
    {
        let text = std::fs::read_to_string(&file).unwrap();
        for (name, line, n) in parameters_of(&code_lines(&text), true) {
            if n > 6 {
                over.push(format!("{}:{line}: fn {name} takes {n}", file.display()));
            }
        }
    }
    assert!(over.is_empty(), "group what travels together:\n{}", over.join("\n"));
}

#[test]
fn the_parameter_scan_counts_what_clippy_counts() {
    let text = "fn a<B: Into<u8>, C>(&self, x: impl FnOnce() -> u8, (y, z): (u8, u8), w: Vec<u8>,\n) -> u8 {\n    0\n}\nfn b() {}\nfn c(s: &str) {}\n";
    let code = code_lines(text);
    assert_eq!(parameters(&code), vec![("a", 1, 4), ("b", 5, 0), ("c", 6, 1)]);
    assert_eq!(parameters_of(&code, true), vec![("a", 1, 5), ("b", 5, 0), ("c", 6, 1)]);
}

/// ARCHITECTURE.md's code map: its sections, each with the paths its heading names and its text.
fn code_map() -> Vec<(Vec<String>, String)> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md")).unwrap();
    let start = text.find("\n## Code map").expect("a code map");
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |i| i + 3);
    let mut sections = Vec::new();
    for part in rest[..end].split("\n### ").skip(1) {
        let (heading, body) = part.split_once('\n').unwrap_or((part, ""));
        let paths = ticked(heading).into_iter().filter(|t| t.starts_with("src/")).collect();
        sections.push((paths, body.to_string()));
    }
    sections
}

/// The `backticked` tokens of a text.
fn ticked(text: &str) -> Vec<String> {
    text.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// The folders a section's relative paths are read against: its heading's folders, and the
/// folders of its heading's files.
fn bases(paths: &[String]) -> Vec<String> {
    paths
        .iter()
        .map(|p| match p.rsplit_once('/') {
            Some((dir, "")) => format!("{dir}/"),
            Some((dir, _)) => format!("{dir}/"),
            None => String::new(),
        })
        .collect()
}

fn is_path(token: &str) -> bool {
    !token.contains(' ')
        && (token.ends_with(".rs") || (token.ends_with('/') && token.len() > 1))
        && !token.contains("::")
}

#[test]
fn every_file_of_src_is_in_the_code_map_and_every_path_it_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let map = code_map();
    let mut problems = Vec::new();
    // Every path it names exists.
    for (paths, body) in &map {
        for p in paths {
            if !root.join(p).exists() {
                problems.push(format!("the code map names `{p}`, which does not exist"));
            }
        }
        for t in ticked(body).into_iter().filter(|t| is_path(t)) {
            // A path from the repository's root (`src/...`, `fuzz/`), or within the section.
            let found = root.join(&t).exists() || bases(paths).iter().any(|b| root.join(format!("{b}{t}")).exists());
            if !found {
                problems.push(format!(
                    "the code map's section {paths:?} names `{t}`, which does not exist"
                ));
            }
        }
    }
    // Every file of src is in it: named by its path or a folder of it (`src/proxy/`), or in its
    // folder's section by its path there (or a folder of it).
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    for file in files {
        let rel = format!("src/{}", file.strip_prefix(root.join("src")).unwrap().display());
        let covered = map.iter().any(|(paths, body)| {
            let tokens = ticked(body);
            paths.contains(&rel)
                || tokens.contains(&rel)
                || tokens
                    .iter()
                    .any(|t| t.starts_with("src/") && t.ends_with('/') && rel.starts_with(t.as_str()))
                || paths.iter().filter(|p| p.ends_with('/')).any(|dir| {
                    rel.strip_prefix(dir.as_str()).is_some_and(|inner| {
                        let mut names = vec![inner.to_string()];
                        let mut at = inner;
                        while let Some((parent, _)) = at.rsplit_once('/') {
                            names.push(format!("{parent}/"));
                            at = parent;
                        }
                        names.iter().any(|n| tokens.contains(n))
                    })
                })
        });
        if !covered {
            problems.push(format!("`{rel}` is in no section of the code map"));
        }
    }
    assert!(
        problems.is_empty(),
        "ARCHITECTURE.md's code map is not true:\n{}",
        problems.join("\n")
    );
}

/// The Rust sources of a top-level module (`src/NAME.rs` or `src/NAME/`), as one text.
fn module_text(root: &Path, module: &str) -> Option<String> {
    let file = root.join(format!("src/{module}.rs"));
    if file.exists() {
        return std::fs::read_to_string(file).ok();
    }
    let dir = root.join(format!("src/{module}"));
    if !dir.is_dir() {
        return None;
    }
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    Some(
        files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap())
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// Whether `text` defines `name`: an item, a module, an enum variant or a field.
fn defines(text: &str, name: &str) -> bool {
    let item = [
        "fn ", "struct ", "enum ", "trait ", "type ", "const ", "static ", "mod ",
    ]
    .iter()
    .any(|kw| {
        text.match_indices(&format!("{kw}{name}")).any(|(i, m)| {
            let after = text[i + m.len()..].chars().next();
            let before = text[..i].chars().next_back();
            !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
                && !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    });
    item || text.lines().any(|l| {
        let l = l
            .trim_start()
            .trim_start_matches("pub ")
            .trim_start_matches("pub(crate) ");
        l.strip_prefix(name).is_some_and(|rest| {
            let rest = rest.trim_start();
            rest.starts_with(',') || rest.starts_with('(') || rest.starts_with('{') || rest.starts_with(':')
        })
    })
}

#[test]
fn every_item_architecture_md_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = String::new();
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    for f in &files {
        all.push_str(&std::fs::read_to_string(f).unwrap());
        all.push('\n');
    }
    let ident = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_');
    // Paths into other crates (`parking_lot::Mutex`, `std::...`) are not this crate's items.
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let mut external: BTreeSet<String> = ["std", "core", "alloc"].map(String::from).into();
    for line in manifest.lines() {
        if let Some((name, _)) = line.split_once(" = ") {
            if ident(&name.replace('-', "_")) {
                external.insert(name.replace('-', "_"));
            }
        }
    }
    let mut problems = Vec::new();
    let mut checked = 0;
    // The whole page: the code map, and the cross-cutting sections after it.
    let page = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    {
        for t in ticked(&page) {
            let segs: Vec<&str> = t.split("::").collect();
            if segs.len() < 2
                || !segs.iter().all(|s| ident(s))
                || (external.contains(segs[0]) && module_text(root, segs[0]).is_none())
            {
                continue;
            }
            checked += 1;
            let last = segs[segs.len() - 1];
            let ok = match module_text(root, segs[0]) {
                // `module::...::item`: the item is defined in that module.
                Some(text) => {
                    defines(&text, last)
                        || root
                            .join(format!("src/{}/{last}.rs", segs[..segs.len() - 1].join("/")))
                            .exists()
                }
                // `Type::member`: both are defined somewhere in src.
                None => defines(&all, segs[0]) && defines(&all, last),
            };
            if !ok {
                problems.push(format!("the code map names `{t}`, which is not defined in src"));
            }
        }
    }
    assert!(checked >= 8, "the scan found the code map's items ({checked})");
    assert!(
        problems.is_empty(),
        "ARCHITECTURE.md's code map is not true:\n{}",
        problems.join("\n")
    );
}

/// The files of every folder of `src/` import each other one way: no folder holds an import
/// cycle among its files (`mod.rs` aside: the folder's own map; an item only tests build aside).
#[test]
fn no_folder_holds_an_import_cycle_among_its_files() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut dirs = vec![src.clone()];
    let mut cycles = Vec::new();
    while let Some(dir) = dirs.pop() {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
        if !files.iter().any(|f| f.file_name().is_some_and(|n| n == "mod.rs")) {
            continue;
        }
        let module = |f: &Path| f.file_stem().unwrap().to_string_lossy().into_owned();
        let siblings: BTreeSet<String> = files.iter().map(|f| module(f)).collect();
        let mut g = Graph::new();
        for file in files.iter().filter(|f| module(f) != "mod") {
            let text = std::fs::read_to_string(file).unwrap();
            // An item only tests build (`#[cfg(test)]` before it) is a seam, not an edge.
            let all = code_lines(&text);
            let code: Vec<(usize, &str)> = all
                .iter()
                .enumerate()
                .filter(|(i, _)| *i == 0 || all[i - 1].1.trim() != "#[cfg(test)]")
                .map(|(_, l)| *l)
                .collect();
            let rel = file.strip_prefix(&src).unwrap().display().to_string();
            for name in super_paths(&code)
                .into_iter()
                .filter(|n| siblings.contains(n) && n != "mod")
            {
                edge(&mut g, &module(file), &name, &rel);
            }
        }
        if let Some(cycle) = find_cycle(&g) {
            cycles.push(format!(
                "{}: {}",
                dir.strip_prefix(&src).unwrap().display(),
                describe(&g, &cycle)
            ));
        }
    }
    assert!(
        cycles.is_empty(),
        "folders with an import cycle:\n{}",
        cycles.join("\n")
    );
}
