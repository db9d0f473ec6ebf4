//! Rules for the tests themselves: an integration test never asserts that something
//! took *less* than a wall-clock time. On a loaded 2-core machine such a bound fails spuriously;
//! on a fast one it proves nothing. A test tells mechanisms apart by what they leave (a metric's
//! reason, an error code, the provider's call count, an order of events); waits at least as long
//! as a policy asks are lower bounds and stay. Hang guards are `timeout(..)` / `eventually(..)`
//! limits far above the expected time, not assertions. A comparison that is not a time limit (two
//! readings of one deadline) says so with `// tidy: not a time limit` on the line before.

use std::path::{Path, PathBuf};

/// Every `assert!(..)` of `text` with the line it starts on, its whole argument text, and whether
/// the line before carries the opt-out.
fn asserts(text: &str) -> Vec<(usize, String, bool)> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(at) = text[from..].find("assert!(") {
        let start = from + at + "assert!(".len();
        let mut depth = 1;
        let mut end = start;
        while end < bytes.len() && depth > 0 {
            match bytes[end] {
                b'(' => depth += 1,
                b')' => depth -= 1,
                _ => {}
            }
            end += 1;
        }
        let line = text[..start].lines().count();
        let before = text[..from + at].lines().rev().nth(1).unwrap_or("");
        let opted_out = before.contains("tidy: not a time limit");
        out.push((line, text[start..end.saturating_sub(1)].to_string(), opted_out));
        from = end;
    }
    out
}

/// Whether an assertion's text bounds a duration from above: a spaced `<` or `<=` in an
/// assertion that speaks of time (a `Duration`, an `elapsed()`, a bound constant).
fn is_time_limit(assertion: &str) -> bool {
    // The condition only: the message after the first top-level comma is free text.
    let condition = condition_of(assertion);
    let below = condition.contains(" < ") || condition.contains(" <= ");
    let timed = ["Duration", "elapsed()", "BOUND", "took", "lag", "gap"]
        .iter()
        .any(|w| condition.contains(w));
    below && timed
}

fn condition_of(assertion: &str) -> &str {
    let mut depth = 0i32;
    let mut quoted = false;
    for (i, c) in assertion.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '(' | '[' | '{' if !quoted => depth += 1,
            ')' | ']' | '}' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => return &assertion[..i],
            _ => {}
        }
    }
    assertion
}

fn test_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("tests/it") {
        let path = entry.expect("entry").path();
        // The support code's helpers (eventually, time_until) are where hang guards live.
        if path.is_dir() && !path.ends_with("support") {
            test_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("tidy.rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_integration_test_asserts_that_something_was_fast() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it");
    let mut files = Vec::new();
    test_files(&root, &mut files);
    assert!(files.len() > 20, "the scan sees the tests: {files:?}");
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        for (line, assertion, opted_out) in asserts(&text) {
            if is_time_limit(&assertion) && !opted_out {
                let name = file.strip_prefix(&root).unwrap_or(file).display();
                found.push(format!("tests/it/{name}:{line}: assert!({})", condition_of(&assertion)));
            }
        }
    }
    assert!(
        found.is_empty(),
        "wall-clock upper bounds (tell the mechanisms apart by what they leave, or make the limit \
         a hang guard):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_finds_a_time_limit_and_leaves_lower_bounds_and_guards_alone() {
    let text = r#"
    assert!(started.elapsed() < Duration::from_secs(2), "fast");
    assert!(
        took <= Duration::from_millis(150),
        "seen after {took:?}"
    );
    assert!(gap >= Duration::from_secs(2), "waited {gap:?} < 3 s");
    assert_eq!(provider.count("k"), 1);
    assert!(n < 5, "{n}");
    // tidy: not a time limit
    assert!(skew <= Duration::from_millis(50), "one deadline read twice");
"#;
    let flagged: Vec<usize> = asserts(text)
        .into_iter()
        .filter(|(_, a, opted_out)| is_time_limit(a) && !opted_out)
        .map(|(line, _, _)| line)
        .collect();
    assert_eq!(flagged, vec![2, 3]);
}

/// The text of every file under `dir` whose name ends with `.rs`.
fn rust_texts(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_texts(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("read");
            out.push((path, text));
        }
    }
}

/// The name a line declares `pub` (not `pub(crate)`): an item or a struct field.
fn public_name(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix("pub ")?;
    let mut words = rest.split_whitespace();
    let mut word = words.next()?;
    while ["async", "const", "unsafe"].contains(&word) {
        // `pub const NAME` is an item of its own; `pub const fn` is a function.
        let next = words.next()?;
        if word == "const" && !["fn", "unsafe"].contains(&next) {
            word = next;
            return Some(word.trim_end_matches(':').split(['<', '(', ':']).next().unwrap_or(word));
        }
        word = next;
    }
    let name = if ["fn", "struct", "enum", "type", "trait", "static", "mod"].contains(&word) {
        words.next()?
    } else if word.ends_with(':') {
        // A field: `pub name: Type`.
        word
    } else {
        return None; // `pub use`, `pub impl`..
    };
    let end = name
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(name.len());
    // A macro's `pub mod $name` declares no name of its own.
    (end > 0).then(|| &name[..end])
}

/// The text of a declaration starting at `lines[0]`: a function's signature (to its `{` or `;`),
/// a struct's, enum's or trait's whole body (to the `}` at its indentation), else the line.
fn declaration(lines: &[&str]) -> String {
    let first = lines[0];
    let indent = &first[..first.len() - first.trim_start().len()];
    let is_body = ["struct ", "enum ", "trait "].iter().any(|k| first.contains(k)) && first.trim_end().ends_with('{');
    let mut text = String::new();
    for line in lines {
        text.push_str(line);
        text.push('\n');
        let done = if is_body {
            *line == format!("{indent}}}")
        } else if first.contains("fn ") {
            line.contains('{') || line.trim_end().ends_with(';')
        } else {
            line.trim_end().ends_with(';') || line.trim_end().ends_with(',')
        };
        if done {
            break;
        }
    }
    text
}

/// A trait impl at the top level: its self type and its associated types' lines.
fn impl_types<'a>(lines: &[&'a str]) -> Option<(&'a str, String)> {
    let header = lines[0].strip_prefix("impl")?;
    let target = header.split(" for ").nth(1)?;
    let self_type = identifiers(target).into_iter().next()?;
    let mut types = String::new();
    for line in &lines[1..] {
        if *line == "}" {
            break;
        }
        if line.trim_start().starts_with("type ") {
            types.push_str(line);
            types.push('\n');
        }
    }
    Some((self_type, types))
}

fn identifiers(text: &str) -> Vec<&str> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect()
}

/// The identifiers a Rust text names in its code: comments, string literals (raw ones too) and
/// character literals left out, so that a word in a doc comment or in a test's TOML keeps
/// nothing `pub`.
fn names(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let (mut out, mut i) = (Vec::new(), 0);
    while i < b.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |e| e + 2);
        } else if let Some(hashes) = raw_string_start(rest) {
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes + usize::from(rest.starts_with("br"));
            i += body + rest[body..].find(&close).map_or(rest.len() - body, |e| e + close.len());
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if b[i] == b'\'' && (rest.get(2..3) == Some("'") || rest.starts_with("'\\")) {
            // A character literal ('x', '\n', '\''); a lifetime has no closing quote there.
            i += 1 + rest[1..].find('\'').map_or(0, |e| e + 1) + usize::from(rest.starts_with("'\\'"));
        } else if b[i].is_ascii_alphanumeric() || b[i] == b'_' {
            let len = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            out.push(&rest[..len]);
            i += len;
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
        }
    }
    out
}

/// The number of `#` of a raw string literal starting `text` (`r"`, `r#"`, `br##"`), if one does.
fn raw_string_start(text: &str) -> Option<usize> {
    let rest = text.strip_prefix("br").or_else(|| text.strip_prefix('r'))?;
    let hashes = rest.len() - rest.trim_start_matches('#').len();
    rest[hashes..].starts_with('"').then_some(hashes)
}

/// An item of the library is `pub` only when something outside it needs it (the
/// binary, the tests, the benchmarks, the fuzz targets); everything else is `pub(crate)` or
/// narrower, so that the compiler finds what nothing uses. Outside code is read for the names
/// it uses ([`names`]: not its comments or strings); a name that some outside file uses for
/// anything keeps its item `pub` (the check errs that way).
#[test]
fn every_pub_item_is_used_outside_the_library() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut outside = Vec::new();
    for dir in ["tests", "bench", "benches", "fuzz"] {
        rust_texts(&root.join(dir), &mut outside);
    }
    outside.push((
        root.join("src/main.rs"),
        std::fs::read_to_string(root.join("src/main.rs")).expect("main"),
    ));
    let words: std::collections::HashSet<&str> = outside.iter().flat_map(|(_, t)| names(t)).collect();
    let mut library = Vec::new();
    rust_texts(&root.join("src"), &mut library);
    // The declarations: (file, line, name, the identifiers its signature or body names).
    let mut declared = Vec::new();
    for (path, text) in &library {
        if path.ends_with("main.rs") {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            if line.starts_with("mod tests") {
                break;
            }
            if let Some(name) = public_name(line) {
                declared.push((path, n + 1, name, declaration(&lines[n..]), true));
            } else if let Some((self_type, types)) = impl_types(&lines[n..]) {
                // `impl FromStr for Jitter { type Err = UnknownJitter; .. }`: as public as Jitter.
                declared.push((path, n + 1, self_type, types, false));
            }
        }
    }
    // What the outside names is needed; so is whatever a needed item's signature, fields or
    // variants name (the compiler asks it to be as public as the item).
    let mut needed = words;
    loop {
        let before = needed.len();
        for (_, _, name, text, _) in &declared {
            if needed.contains(name) {
                needed.extend(identifiers(text));
            }
        }
        if needed.len() == before {
            break;
        }
    }
    let mut unused = Vec::new();
    for (path, line, name, _, checked) in &declared {
        if *checked && !needed.contains(name) {
            let file = path.strip_prefix(root).unwrap_or(path).display();
            unused.push(format!("{file}:{line}: `{name}`"));
        }
    }
    assert!(
        unused.is_empty(),
        "pub, but nothing outside the library names it (make it pub(crate)):\n{}",
        unused.join("\n")
    );
}

#[test]
fn the_name_scan_reads_code_and_skips_comments_strings_and_characters() {
    let text = r####"use rebound::hooks::config::raw; // raw_only_in_comment
/// doc_word
let s = "in_string \" still_string";
let t = r#"toml_key = "x" "#;
let c = ('"', '\'', '\\');
fn f<'a>(x: &'a Kept) -> Also { Also::new() } /* block_word */
"####;
    let found = names(text);
    for kept in [
        "rebound", "config", "raw", "s", "t", "c", "f", "a", "x", "Kept", "Also", "new",
    ] {
        assert!(found.contains(&kept), "{kept} not in {found:?}");
    }
    for gone in [
        "raw_only_in_comment",
        "doc_word",
        "in_string",
        "still_string",
        "toml_key",
        "block_word",
    ] {
        assert!(!found.contains(&gone), "{gone} in {found:?}");
    }
}

#[test]
fn the_pub_scan_reads_items_and_fields_and_skips_narrower_ones() {
    let names: Vec<Option<&str>> = [
        "pub fn start(config: Config) -> Server {",
        "    pub async fn send<B>(&self) {",
        "pub const fn ms(n: u64) -> Duration {",
        "pub const SLOTS: usize = 10;",
        "pub struct Pool<B> {",
        "    pub retry_after: Option<Duration>,",
        "pub(crate) fn hidden() {}",
        "pub use routes::Route;",
        "let pub_thing = 1;",
    ]
    .iter()
    .map(|l| public_name(l))
    .collect();
    assert_eq!(
        names,
        vec![
            Some("start"),
            Some("send"),
            Some("ms"),
            Some("SLOTS"),
            Some("Pool"),
            Some("retry_after"),
            None,
            None,
            None
        ]
    );
}

/// The app's credential is hashed once per request, by `proxy/request.rs`: no other step of the
/// pipeline reads the credential of the app's head (`parts`) itself.
#[test]
fn no_module_but_the_requests_hashes_the_apps_credential() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut library = Vec::new();
    rust_texts(&root.join("src/proxy"), &mut library);
    let request = root.join("src/proxy/request.rs");
    let mut found = 0;
    let mut readers = Vec::new();
    for (path, text) in &library {
        for (at, _) in text.match_indices(".presented(") {
            let args = &text[at..];
            let args = &args[..args.find(')').unwrap_or(args.len())];
            if args.contains("parts") {
                found += 1;
                if *path != request {
                    readers.push(path.strip_prefix(root).unwrap_or(path).display().to_string());
                }
            }
        }
    }
    assert!(
        readers.is_empty(),
        "the app's credential read outside proxy/request.rs: {readers:?}"
    );
    assert_eq!(found, 1, "proxy/request.rs reads it once");
}

/// One deadline per request: what its headers ask of the retry policy (`retry_terms`, where
/// the deadline comes from) is read in the request's own module only, once, and every other step
/// borrows it.
#[test]
fn no_module_but_the_requests_computes_a_deadline() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut library = Vec::new();
    rust_texts(&root.join("src"), &mut library);
    let allowed = [root.join("src/proxy/request.rs"), root.join("src/retry/policy.rs")];
    let readers: Vec<String> = library
        .iter()
        .filter(|(path, text)| !allowed.contains(path) && names(text).contains(&"retry_terms"))
        .map(|(path, _)| path.strip_prefix(root).unwrap_or(path).display().to_string())
        .collect();
    assert!(
        readers.is_empty(),
        "a deadline read outside proxy/request.rs: {readers:?}"
    );
    let request = std::fs::read_to_string(root.join("src/proxy/request.rs")).expect("request.rs");
    assert_eq!(
        names(&request).iter().filter(|n| **n == "retry_terms").count(),
        2,
        "imported, then called once"
    );
}
