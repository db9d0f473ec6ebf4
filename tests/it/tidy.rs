//! Rules for the tests themselves (issue 30): an integration test never asserts that something
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
