//! The documentation cannot drift silently: every key of docs/configuration.md is a field of the
//! config structs and every field is documented there; every metric name the docs mention is a
//! family rebound exports, and docs/operations.md's table lists each exactly; every error code of
//! docs/errors.md is in the error table with its status, and the other way round; every page of
//! docs/ is linked from the README.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use rebound::hooks::config::raw::{
    RawAdmin, RawCache, RawCircuit, RawConcurrency, RawConfig, RawDeadLetters, RawIdempotency, RawJobs, RawLimit,
    RawLog, RawMetrics, RawPrice, RawRedis, RawRetry, RawRoute, RawServer, RawTarget, RawTelemetry, RawUpstream,
};
use rebound::hooks::error::ErrorKind;
use rebound::hooks::metrics::Metrics;
use serde::Serialize;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The keys TOML may give a struct: its serde field names (renames included).
fn fields<T: Serialize + Default>() -> BTreeSet<String> {
    let value = serde_json::to_value(T::default()).unwrap();
    value.as_object().unwrap().keys().cloned().collect()
}

/// docs/configuration.md's tables: heading (`[server]`, `[[routes]] targets`, ...) -> the keys of
/// its `| key | default | meaning |` rows.
fn documented_keys(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            current = heading
                .strip_prefix('`')
                .and_then(|h| h.strip_suffix('`'))
                .map(str::to_string);
            if let Some(c) = &current {
                assert!(out.insert(c.clone(), Vec::new()).is_none(), "`{c}` has two sections");
            }
            continue;
        }
        let (Some(section), Some(row)) = (&current, line.strip_prefix("| `")) else {
            continue;
        };
        let key = row.split('`').next().unwrap().to_string();
        out.get_mut(section).unwrap().push(key);
    }
    out
}

#[test]
fn every_config_key_is_documented_and_every_documented_key_exists() {
    let path = root().join("docs/configuration.md");
    let documented = documented_keys(&read(&path));
    let tables: [(&str, BTreeSet<String>); 18] = [
        ("[server]", fields::<RawServer>()),
        ("[admin]", fields::<RawAdmin>()),
        ("[log]", fields::<RawLog>()),
        ("[redis]", fields::<RawRedis>()),
        ("[telemetry]", fields::<RawTelemetry>()),
        ("[metrics]", fields::<RawMetrics>()),
        ("[dead_letters]", fields::<RawDeadLetters>()),
        ("[jobs]", fields::<RawJobs>()),
        ("[upstreams.NAME]", fields::<RawUpstream>()),
        ("[[routes]]", fields::<RawRoute>()),
        ("[[routes]] targets", fields::<RawTarget>()),
        ("[retry.NAME]", fields::<RawRetry>()),
        ("[circuit.NAME]", fields::<RawCircuit>()),
        ("[idempotency.NAME]", fields::<RawIdempotency>()),
        ("[cache.NAME]", fields::<RawCache>()),
        ("[limits.NAME]", fields::<RawLimit>()),
        ("[prices]", fields::<RawPrice>()),
        ("[concurrency]", fields::<RawConcurrency>()),
    ];
    let mut problems = Vec::new();
    for (heading, keys) in &tables {
        let Some(listed) = documented.get(*heading) else {
            problems.push(format!("no section `{heading}`"));
            continue;
        };
        let listed_set: BTreeSet<String> = listed.iter().cloned().collect();
        if listed_set.len() != listed.len() {
            problems.push(format!("`{heading}` lists a key twice: {listed:?}"));
        }
        for missing in keys.difference(&listed_set) {
            problems.push(format!(
                "`{heading}`: `{missing}` is a config key but is not documented"
            ));
        }
        for stray in listed_set.difference(keys) {
            problems.push(format!("`{heading}`: `{stray}` is documented but is not a config key"));
        }
    }
    for heading in documented.keys() {
        if !tables.iter().any(|(h, _)| h == heading) {
            problems.push(format!("section `{heading}` is not a config table"));
        }
    }
    // Every top-level table of the file has its section.
    for table in fields::<RawConfig>() {
        let covered = documented
            .keys()
            .any(|h| h.trim_matches(['[', ']']).split(['.', ']']).next() == Some(table.as_str()));
        if !covered {
            problems.push(format!("the top-level table `{table}` has no section"));
        }
    }
    assert!(problems.is_empty(), "{}:\n{}", path.display(), problems.join("\n"));
}

/// README.md and every page of docs/.
fn pages() -> Vec<(PathBuf, String)> {
    let mut paths = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths.into_iter().map(|p| (p.clone(), read(&p))).collect()
}

/// `rebound_...` and `gen_ai_client_...` words of a text (Prometheus series names).
fn metric_words(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for prefix in ["rebound_", "gen_ai_client_"] {
        for (i, _) in text.match_indices(prefix) {
            if text[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
            {
                continue;
            }
            let word: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            out.insert(word);
        }
    }
    out
}

/// Words that look like series names and are not: the error type of rebound's JSON bodies, a
/// field of bench/results.jsonl.
const NOT_METRICS: &[&str] = &["rebound_error", "rebound_sha256"];

#[test]
fn every_metric_the_docs_name_is_exported_and_the_table_lists_each_once() {
    let metrics = Metrics::new().unwrap();
    let families: BTreeSet<String> = metrics.family_names().iter().cloned().collect();
    assert!(families.len() > 30, "{families:?}");
    let is_series = |w: &str| {
        // A prefix in a pattern (`rebound_(retries|requests)_total`, "the `rebound_` prefix").
        (w.ends_with('_') && families.iter().any(|f| f.starts_with(w)))
            || families.contains(w)
            || ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| w.strip_suffix(s).is_some_and(|f| families.contains(f)))
    };
    let mut problems = Vec::new();
    for (path, text) in pages() {
        for word in metric_words(&text) {
            if !is_series(&word) && !NOT_METRICS.contains(&word.as_str()) {
                problems.push(format!("{}: `{word}` is not a metric rebound exports", path.display()));
            }
        }
    }
    let ops = root().join("docs/operations.md");
    let mut table: Vec<String> = read(&ops)
        .lines()
        .filter_map(|l| l.strip_prefix("| `rebound_"))
        .map(|rest| format!("rebound_{}", rest.split('`').next().unwrap()))
        .collect();
    let rows = table.len();
    table.sort();
    table.dedup();
    if table.len() != rows {
        problems.push(format!("{}: the metrics table lists a family twice", ops.display()));
    }
    let ours: BTreeSet<String> = families.iter().filter(|f| f.starts_with("rebound_")).cloned().collect();
    for missing in ours.difference(&table.iter().cloned().collect()) {
        problems.push(format!(
            "{}: `{missing}` is exported but not in the metrics table",
            ops.display()
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_error_code_in_docs_errors_md_is_in_the_error_table_and_back() {
    let path = root().join("docs/errors.md");
    let documented: BTreeSet<(u16, String)> = read(&path)
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let status: u16 = cells.get(1)?.parse().ok()?;
            let code = cells.get(2)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((status, code.to_string()))
        })
        .collect();
    let table: BTreeSet<(u16, String)> = ErrorKind::ALL
        .iter()
        .map(|k| (k.row().status.as_u16(), k.row().code.to_string()))
        .collect();
    let undocumented: Vec<_> = table.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&table).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "{}: (status, code) rebound produces but the page does not list: {undocumented:?}; listed but not produced: {unknown:?}",
        path.display()
    );
}

#[test]
fn every_page_of_docs_is_linked_from_the_readme() {
    let readme = read(&root().join("README.md"));
    let unlinked: Vec<String> = pages()
        .into_iter()
        .skip(1)
        .filter_map(|(p, _)| {
            let name = p.file_name()?.to_str()?.to_string();
            (!readme.contains(&format!("(docs/{name}"))).then_some(name)
        })
        .collect();
    assert!(unlinked.is_empty(), "docs pages the README does not link: {unlinked:?}");
}
