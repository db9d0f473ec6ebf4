//! Configuration: every shipped file parses; errors name file, line, key and expectation.

use std::path::{Path, PathBuf};

use rebound::Config;

use crate::support::Edit;

fn shipped_configs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = ["config", "bench", "deploy", "examples"]
        .iter()
        .map(|d| root.join(d))
        .collect();
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "toml") {
                out.push(p);
            }
        }
    }
    out
}

/// Provider keys are "set"; everything else takes its default.
fn env(name: &str) -> Option<String> {
    (name.ends_with("_KEY") || name.ends_with("_TOKEN")).then(|| format!("test-{name}"))
}

#[test]
fn every_shipped_config_parses() {
    let files = shipped_configs();
    assert!(files.iter().any(|p| p.ends_with("config/rebound.toml")), "{files:?}");
    for f in &files {
        if let Err(e) = Config::load_with_env(f, &env) {
            panic!("{} does not load:\n{e}", f.display());
        }
    }
}

#[test]
fn default_config_has_the_documented_shape() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let c = Config::load_with_env(&root.join("config/rebound.toml"), &|_| None).unwrap();
    assert_eq!(c.server.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.admin.listen.to_string(), "127.0.0.1:9901");
    assert!(c.redis.is_none(), "the default config needs no Redis");
    assert!(c.admin.token.is_none());
    let names: Vec<&str> = c.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["openai", "anthropic"]);
    assert_eq!(c.upstreams["openai"].url(), "https://api.openai.com");
    assert!(c.retry["anthropic"]
        .retry_on
        .contains(&rebound::hooks::config::RetryOn::Status(529)));
}

fn errors(src: &str) -> Vec<String> {
    match Config::parse(src, Path::new("t.toml"), &|name| {
        (name == "SET").then(|| "value".to_string())
    }) {
        Ok(_) => vec![],
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

const BASE: &str =
    "[upstreams.u]\nurl = \"https://x\"\n[[routes]]\nname = \"r\"\npath_prefix = \"/r/\"\nupstream = \"u\"\n";

#[test]
fn errors_are_located_and_say_what_was_expected() {
    assert!(errors(BASE).is_empty());
    let e = errors(&format!("{BASE}[server]\nlisten = \"nowhere\"\n"));
    assert_eq!(
        e,
        [
            r#"t.toml:8:10: server.listen: expected an IP address and port such as "127.0.0.1:8080" or "[::1]:8080", found "nowhere""#
        ]
    );
    let e = errors(&format!("{BASE}[retry.p]\nmax_attempts = \"3\"\n"));
    assert_eq!(e.len(), 1);
    assert!(
        e[0].starts_with("t.toml:8:16: retry.p.max_attempts: invalid type: string \"3\", expected i64"),
        "{e:?}"
    );
    let e = errors(&format!(
        "{BASE}[retry.p]\nmax_attempts = 0\nbase_delay = \"2s\"\nmax_delay = \"1s\"\njitter = \"fuzzy\"\n"
    ));
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(
        e[0].contains("retry.p.max_attempts: expected an integer from 1 to 20, found 0"),
        "{e:?}"
    );
    assert!(
        e[1].contains("t.toml:10:13: retry.p.max_delay: expected max_delay >= base_delay (2s), found 1s"),
        "{e:?}"
    );
    assert!(e[2].contains("t.toml:11:10: retry.p.jitter: expected one of \"full\", \"equal\", \"decorrelated\", \"none\", found \"fuzzy\""), "{e:?}");
    let e = errors(&format!("{BASE}[retry.p]\nretry_on = [\"429\", \"404\"]\n"));
    assert!(
        e[0].starts_with("t.toml:8:20: retry.p.retry_on[1]: expected a transient condition; 404 is a client error"),
        "{e:?}"
    );
    let e = errors(&format!("{BASE}[circuit.c]\nfailure_on = [\"429\"]\n"));
    assert!(
        e[0].contains("circuit.c.failure_on[0]: expected a failure; 429 is not one"),
        "{e:?}"
    );
}

#[test]
fn references_are_checked() {
    let src = "[upstreams.u]\nurl = \"https://x\"\ncircuit = \"nope\"\n[[routes]]\nname = \"r\"\npath_prefix = \"/r/\"\nupstream = \"u\"\nretry = \"x\"\nidempotency = \"y\"\nfallback = [\"u\", \"v\"]\n";
    let e = errors(src);
    assert_eq!(e.len(), 5, "{e:?}");
    assert!(e[0]
        .contains("upstreams.u.circuit: expected the name of a [circuit.*] table (none are defined), found \"nope\""));
    assert!(e[1].contains("routes[0].retry:"));
    assert!(e[2].contains("routes[0].idempotency:"));
    assert!(
        e[3].contains("t.toml:10:13: routes[0].fallback[0]: expected the name of another [upstreams.*] table"),
        "{e:?}"
    );
    assert!(e[4].contains("routes[0].fallback[1]"));
}

#[test]
fn duplicate_routes_and_missing_keys() {
    let e = errors(&format!(
        "{BASE}[[routes]]\nname = \"r\"\npath_prefix = \"/r/\"\nupstream = \"u\"\n"
    ));
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(e[0].contains("routes[1].name: expected a unique route name"));
    assert!(e[1].contains("routes[1].path_prefix: expected a unique path_prefix"));
    let e = errors("[upstreams.u]\nconnect_timeout = \"1s\"\n[[routes]]\nname = \"r\"\nupstream = \"u\"\n");
    assert!(
        e.iter()
            .any(|m| m.starts_with("t.toml:1:1: upstreams.u: expected a `url` key")),
        "{e:?}"
    );
    assert!(
        e.iter().any(|m| m.contains("routes[0]: expected a `path_prefix` key")),
        "{e:?}"
    );
    let e = errors("");
    assert_eq!(
        e,
        ["t.toml: routes: expected at least one [[routes]] table, found none"]
    );
}

#[test]
fn environment_interpolation() {
    let src = format!("{BASE}[upstreams.k]\nurl = \"https://k\"\nset_headers = {{ authorization = \"Bearer ${{SET}}\" }}\n[server]\nshutdown_grace = \"${{GRACE:-7s}}\"\n");
    let c = Config::parse(&src, Path::new("t.toml"), &|name| {
        (name == "SET").then(|| "value".to_string())
    })
    .unwrap();
    assert_eq!(c.server.shutdown_grace, std::time::Duration::from_secs(7));
    assert_eq!(c.upstreams["k"].set_headers[0].1, "Bearer value");
    let e = errors(&format!(
        "{BASE}[upstreams.k]\nurl = \"https://k\"\nset_headers = {{ x-api-key = \"${{MISSING_KEY}}\" }}\n"
    ));
    assert_eq!(e.len(), 1);
    assert!(
        e[0].contains(
            "t.toml:9:29: upstreams.k.set_headers.x-api-key: expected the environment variable MISSING_KEY to be set"
        ),
        "{e:?}"
    );
}

#[test]
fn secrets_never_appear_in_debug_or_summary() {
    let src = format!("{BASE}[upstreams.k]\nurl = \"https://k\"\nset_headers = {{ authorization = \"Bearer sk-SECRET\" }}\n[admin]\ntoken = \"tok-SECRET\"\n[redis]\nurl = \"redis://:pw-SECRET@127.0.0.1:6379/0\"\n");
    let c = Config::parse(&src, Path::new("t.toml"), &|_| None).unwrap();
    let shown = format!("{c:?}\n{}", c.summary());
    assert!(!shown.contains("SECRET"), "{shown}");
    assert!(shown.contains("authorization"));
}

#[test]
fn upstream_keepalive_is_typed_validated_and_shown() {
    // Default: 15 s; "off" turns it off; shown by `rebound check`.
    let c = Config::parse(BASE, Path::new("t.toml"), &|_| None).unwrap();
    assert_eq!(c.upstreams["u"].keepalive, Some(std::time::Duration::from_secs(15)));
    assert!(c.summary().contains("keepalive 15s"), "{}", c.summary());
    let with = |v: &str| {
        Edit::new(BASE)
            .set("upstreams.u", "keepalive", v.parse::<toml_edit::Value>().unwrap())
            .to_string()
    };
    let c = Config::parse(&with("\"off\""), Path::new("t.toml"), &|_| None).unwrap();
    assert_eq!(c.upstreams["u"].keepalive, None);
    assert!(c.summary().contains("keepalive off"), "{}", c.summary());
    let c = Config::parse(&with("\"30s\""), Path::new("t.toml"), &|_| None).unwrap();
    assert_eq!(c.upstreams["u"].keepalive, Some(std::time::Duration::from_secs(30)));
    // Errors name the file, line, key and what was expected.
    assert_eq!(
        errors(&with("\"500ms\"")),
        [r#"t.toml:3:13: upstreams.u.keepalive: expected a duration from 1s to 1h, or "off", found "500ms""#]
    );
    let e = errors(&with("\"often\""));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with("t.toml:3:13: upstreams.u.keepalive: expected a duration such as")
            && e[0].ends_with(r#"or "off", found "often""#),
        "{e:?}"
    );
    let e = errors(&with("15"));
    assert!(
        e[0].starts_with("t.toml:3:13: upstreams.u.keepalive: invalid type"),
        "{e:?}"
    );
}

#[test]
fn redis_liveness_defaults_validates_and_is_shown() {
    use std::time::Duration;
    let redis = |extra: &str| format!("{BASE}[redis]\nurl = \"redis://127.0.0.1:1\"\n{extra}");
    let parse = |src: &str| Config::parse(src, Path::new("t.toml"), &|_| None).unwrap();
    // 1.5 s by default, shown by `rebound check`.
    let c = parse(&redis(""));
    let r = c.redis.as_ref().unwrap();
    assert_eq!(r.liveness, Duration::from_millis(1500));
    assert!(c.summary().contains("liveness 1500ms"), "{}", c.summary());
    // A long command_timeout lengthens the default (a heartbeat must fit in a quarter of it)...
    let c = parse(&redis("command_timeout = \"500ms\"\n"));
    assert_eq!(c.redis.unwrap().liveness, Duration::from_secs(2));
    // ...and a value set below that, or outside 500ms..60s, names the key and the bounds.
    assert_eq!(
        errors(&redis("command_timeout = \"500ms\"\nliveness = \"1s\"\n")),
        ["t.toml:10:12: redis.liveness: expected a duration from 2s (500ms, and 4 x command_timeout: a heartbeat every quarter of it must fit its command_timeout) to 60s, found 1s"]
    );
    let e = errors(&redis("liveness = \"2m\"\n"));
    assert!(
        e[0].contains("redis.liveness: expected a duration from 500ms") && e[0].ends_with("to 60s, found 2m"),
        "{e:?}"
    );
    assert_eq!(
        parse(&redis("liveness = \"10s\"\n")).redis.unwrap().liveness,
        Duration::from_secs(10)
    );
}

#[test]
fn redis_fingerprint_is_2_or_1_and_1_is_shown() {
    let redis = |extra: &str| format!("{BASE}[redis]\nurl = \"redis://127.0.0.1:1\"\n{extra}");
    let parse = |src: &str| Config::parse(src, Path::new("t.toml"), &|_| None).unwrap();
    let c = parse(&redis(""));
    assert_eq!(c.redis.as_ref().unwrap().fingerprint, 2);
    assert!(
        !c.summary().contains("fingerprints written as version 1"),
        "{}",
        c.summary()
    );
    let c = parse(&redis("fingerprint = 1\n"));
    assert_eq!(c.redis.as_ref().unwrap().fingerprint, 1);
    assert!(
        c.summary().contains("request fingerprints written as version 1"),
        "{}",
        c.summary()
    );
    assert_eq!(
        errors(&redis("fingerprint = 3\n")),
        ["t.toml:9:15: redis.fingerprint: expected an integer from 1 to 2, found 3"]
    );
}

mod properties {
    use std::path::Path;

    use proptest::prelude::*;
    use rebound::Config;

    /// A TOML scalar or array that may or may not suit the key it is given to.
    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            any::<bool>().prop_map(|b| b.to_string()),
            "[ -~]{0,12}".prop_map(|s| format!("{:?}", s)),
            prop_oneof![
                Just("\"250ms\""),
                Just("\"8MiB\""),
                Just("\"0s\""),
                Just("\"-1s\""),
                Just("\"1y\"")
            ]
            .prop_map(str::to_string),
            proptest::collection::vec("[a-z0-9-]{0,6}", 0..3).prop_map(|v| format!("{v:?}")),
        ]
    }

    /// Documents made of the config's own tables and keys (and some that do not exist).
    fn document() -> impl Strategy<Value = String> {
        let table = prop_oneof![
            Just("server"),
            Just("admin"),
            Just("redis"),
            Just("upstreams.fake"),
            Just("retry.p"),
            Just("circuit.c"),
            Just("idempotency.i"),
            Just("dead_letters"),
            Just("jobs"),
            Just("nonsense"),
        ];
        let key = prop_oneof![
            Just("listen"),
            Just("url"),
            Just("max_attempts"),
            Just("base_delay"),
            Just("max_request_head"),
            Just("max_connections"),
            Just("lease"),
            Just("ttl"),
            Just("on_concurrent"),
            Just("failure_on"),
            Just("keepalive"),
            Just("circuit"),
            Just("command_timeout"),
            Just("typo_key"),
        ];
        proptest::collection::vec((table, proptest::collection::vec((key, value()), 0..4)), 0..5).prop_map(|tables| {
            let mut doc = String::new();
            for (t, kvs) in tables {
                doc.push_str(&format!("[{t}]\n"));
                for (k, v) in kvs {
                    doc.push_str(&format!("{k} = {v}\n"));
                }
            }
            doc.push_str("[[routes]]\nname = \"r\"\npath_prefix = \"/r/\"\nupstream = \"fake\"\n");
            doc
        })
    }

    /// 256 cases times `REBOUND_FUZZ_SCALE`, on a fixed seed unless `REBOUND_FUZZ_SEED` names
    /// another (as the library's property tests: `src/testing.rs`), no regression files.
    fn config() -> ProptestConfig {
        let number = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse::<u64>().ok());
        let scale = u32::try_from(number("REBOUND_FUZZ_SCALE").unwrap_or(1).clamp(1, 1_000_000)).unwrap_or(1);
        let mut c = ProptestConfig::with_cases(256 * scale);
        c.rng_seed = proptest::test_runner::RngSeed::Fixed(number("REBOUND_FUZZ_SEED").unwrap_or(0xC0F1_6000));
        c.failure_persistence = None;
        c
    }

    proptest! {
        #![proptest_config(config())]

        /// Any text: a config or errors, never a panic.
        #[test]
        fn any_text_is_parsed_or_refused(src in "\\PC{0,200}") {
            let _ = Config::parse(&src, Path::new("fuzz.toml"), &|_| None);
        }

        /// Config-shaped documents: a config, or errors that each name the file and a key (or a
        /// line, for TOML syntax errors).
        #[test]
        fn every_error_names_a_key(src in document()) {
            if let Err(errors) = Config::parse(&src, Path::new("fuzz.toml"), &|_| None) {
                for e in &errors.0 {
                    prop_assert_eq!(&e.file, "fuzz.toml");
                    prop_assert!(!e.key.is_empty() || e.line.is_some(), "{e:?}\n{src}");
                    prop_assert!(!e.message.is_empty());
                }
            }
        }
    }
}

/// The breaker's defaults changed (3 failures, open 5 s doubling to 8 s); a config written
/// before it that sets only a longer `open_for` stays valid: `max_open_for` defaults to it.
#[test]
fn a_long_open_for_without_max_open_for_is_still_valid() {
    use std::time::Duration;
    let src = "[upstreams.u]\nurl = \"http://127.0.0.1:9\"\ncircuit = \"c\"\n[circuit.c]\nopen_for = \"30s\"\n[circuit.d]\n[[routes]]\nname = \"r\"\npath_prefix = \"/r/\"\nupstream = \"u\"\n";
    let c = rebound::Config::parse(src, std::path::Path::new("t.toml"), &|_| None).expect("valid");
    let (long, default) = (&c.circuit["c"], &c.circuit["d"]);
    assert_eq!(
        (long.open_for, long.max_open_for),
        (Duration::from_secs(30), Duration::from_secs(30))
    );
    assert_eq!(
        (default.consecutive_failures, default.open_for, default.max_open_for),
        (3, Duration::from_secs(5), Duration::from_secs(8))
    );
}

/// A TOML syntax error whose parser message runs over several lines is one located line
/// (`file:line:col: ...`), not a located line and an unlocated one.
#[test]
fn a_toml_syntax_error_is_one_located_line() {
    let src = "[server]\nlisten = \"127.0.0.1:0\"\n[upstreams.u]\nurl = \"http://x\"\nbad = = 1\n";
    let err = match rebound::Config::parse(src, std::path::Path::new("t.toml"), &|_| None) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("t.toml:5:7: "), "{err}");
    assert!(lines[0].contains("expected"), "the parser's detail is kept: {err}");
}

/// `[cache.NAME]` and a route's `cache`: every bad value named, with its location and what was
/// expected; `rebound check` shows the policy in the config's own words.
#[test]
fn cache_policies_are_validated_and_shown() {
    let src = format!(
        "{BASE}cache = \"nope\"\n[cache.c]\nttl = \"721h\"\nmax_entry_size = \"65MiB\"\nstatuses = [\"2xx\", \"abc\"]\nscope_headers = [\"bad header\"]\n"
    );
    let e = errors(&src);
    assert_eq!(e.len(), 5, "{e:?}");
    assert!(
        e[0].contains("t.toml:7:9: routes[0].cache: expected the name of a [cache.*] table (c), found \"nope\""),
        "{e:?}"
    );
    assert!(e[1].contains("cache.c.ttl: expected at most 720h (30 days)"), "{e:?}");
    assert!(
        e[2].contains("cache.c.max_entry_size: expected a size from 1B to 64MiB, found 65MiB"),
        "{e:?}"
    );
    assert!(
        e[3].contains("cache.c.statuses[1]: expected a status such as \"201\""),
        "{e:?}"
    );
    assert!(
        e[4].contains("cache.c.scope_headers[0]: expected a valid HTTP header name"),
        "{e:?}"
    );

    let ok = format!("{BASE}cache = \"c\"\n[cache.c]\nttl = \"10m\"\nstatuses = [\"2xx\", \"404\"]\n");
    let config = Config::parse(&ok, Path::new("t.toml"), &|_| None).unwrap();
    let summary = config.summary();
    assert!(summary.contains("idempotency none, cache c"), "{summary}");
    assert!(
        summary.contains("c              ttl 10m, statuses [2xx,404], max_entry_size 4MiB, scope credentials"),
        "{summary}"
    );
    assert!(
        summary.contains(
            "credentials (never logged or kept; hashed where they scope): headers authorization, proxy-authorization, x-api-key, api-key, x-goog-api-key, x-amz-security-token, cookie; query parameters key, api_key, api-key, access_token"
        ),
        "{summary}"
    );
}

/// `[server] credential_headers` adds names to the list, which every default scope follows; a
/// scope the config writes is shown as written; a bad name is located.
#[test]
fn credential_headers_extend_the_list_and_the_default_scopes() {
    let src = format!(
        "[server]\ncredential_headers = [\"X-Tenant-Key\"]\n{BASE}cache = \"c\"\n[cache.c]\n[cache.d]\nscope_headers = [\"x-tenant\"]\n"
    );
    let config = Config::parse(&src, Path::new("t.toml"), &|_| None).unwrap();
    let names: Vec<&str> = config.server.credentials.headers().iter().map(|h| h.as_str()).collect();
    assert_eq!(names.last(), Some(&"x-tenant-key"));
    assert_eq!(config.cache["c"].scope_headers, config.server.credentials.headers());
    let summary = config.summary();
    assert!(summary.contains("cookie, x-tenant-key; query parameters"), "{summary}");
    assert!(
        summary.contains("scope [x-tenant] + credential query parameters"),
        "{summary}"
    );

    let bad = src.replace("\"X-Tenant-Key\"", "\"bad name\"");
    let e = errors(&bad);
    assert!(
        e[0].contains("server.credential_headers[0]: expected a valid HTTP header name, found \"bad name\""),
        "{e:?}"
    );
}
