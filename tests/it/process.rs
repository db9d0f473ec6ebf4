//! The real binary: CLI, exit codes, signals, and logs that never carry a secret.

use std::process::Command;
use std::time::Duration;

use http_body_util::BodyExt;
use rebound::hooks::config::raw::{RawRetry, RawRoute, RawUpstream};

use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::sse_stream_bytes;
use crate::support::sidecar::ReboundProcess;
use crate::support::*;

fn rebound_cmd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rebound"))
}

fn manifest(path: &str) -> String {
    format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn version_and_check() {
    let out = rebound_cmd().arg("--version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("rebound {}", env!("CARGO_PKG_VERSION"))
    );

    let out = rebound_cmd()
        .args(["check", "--config", &manifest("config/rebound.toml")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("valid"), "{text}");
    assert!(
        text.contains("/openai/") && text.contains("https://api.openai.com"),
        "{text}"
    );
    assert!(
        text.contains("/anthropic/") && text.contains("https://api.anthropic.com"),
        "{text}"
    );
}

#[test]
fn check_names_file_line_key_and_expectation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[upstreams.u]\nurl = \"https://x\"\n\n[[routes]]\nname = \"r\"\npath_prefix = \"/r/\"\nupstream = \"typo\"\n\n[retry.p]\nmax_attemps = 2\n",
    )
    .unwrap();
    let out = rebound_cmd().args(["check", "--config"]).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{}:10:1: retry.p.max_attemps: unknown field `max_attemps`",
            path.display()
        )),
        "{err}"
    );

    std::fs::write(
        &path,
        "[upstreams.u]\nurl = \"https://x\"\n\n[[routes]]\nname = \"r\"\npath_prefix = \"/r/\"\nupstream = \"typo\"\n",
    )
    .unwrap();
    let out = rebound_cmd().args(["check", "--config"]).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{}:7:12: routes[0].upstream: expected the name of an [upstreams.*] table (u), found \"typo\"",
            path.display()
        )),
        "{err}"
    );
    // Serving with an invalid config: EX_USAGE, nothing bound.
    let out = rebound_cmd().arg("--config").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
}

#[tokio::test]
async fn logs_never_carry_a_secret() {
    const CANARY: &str = "CANARY-8c1f2e";
    let provider = FakeProvider::start().await;
    let config = TestConfig::new(&provider.url())
        .with_upstream(
            "injected",
            RawUpstream {
                url: some("http://127.0.0.1:1"),
                // Expanded from the environment by the parser, as in a file.
                set_headers: [("authorization".to_string(), "Bearer ${UPSTREAM_KEY}".to_string())].into(),
                ..RawUpstream::default()
            },
        )
        .with_route(RawRoute {
            name: some("injected"),
            path_prefix: some("/injected/"),
            upstream: some("injected"),
            ..RawRoute::default()
        })
        .log_level("trace");
    let rebound = ReboundProcess::start(&config.toml(), &[("UPSTREAM_KEY", &format!("{CANARY}-env"))]).await;
    let secret_headers = [
        ("authorization", format!("Bearer {CANARY}-auth")),
        ("x-api-key", format!("{CANARY}-xapi")),
        ("api-key", format!("{CANARY}-azure")),
        ("cookie", format!("session={CANARY}-cookie")),
        ("x-fake-key", "canary".to_string()),
    ];
    let headers: Vec<(&str, &str)> = secret_headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let url = format!("{}/fake/v1/chat/completions?key={CANARY}-query", rebound.proxy);
    assert_eq!(send("POST", &url, &headers, "{}").await.status, 200);
    // Errors are logged too: an unreachable upstream with an injected credential, a 404.
    let a = send(
        "POST",
        &format!("{}/injected/v1/x?key={CANARY}-query", rebound.proxy),
        &headers,
        "{}",
    )
    .await;
    assert_eq!(a.status, 502);
    assert_eq!(
        send("GET", &format!("{}/nope?token={CANARY}", rebound.proxy), &headers, "")
            .await
            .status,
        404
    );
    // The provider did get the credentials: they were forwarded, just never logged.
    let seen = provider.requests("canary").pop().unwrap();
    assert!(seen.header("authorization").unwrap().contains(CANARY));

    assert!(
        eventually(Duration::from_secs(5), || rebound.logs().matches("\"request\"").count()
            >= 3)
        .await,
        "{}",
        rebound.logs()
    );
    let logs = rebound.logs();
    assert!(
        logs.contains("\"route\":\"fake\""),
        "one line per request with its route: {logs}"
    );
    assert!(!logs.contains(CANARY), "a secret reached the logs:\n{logs}");
}

#[tokio::test]
async fn sigterm_drains_an_inflight_stream_then_exits_zero() {
    let provider = FakeProvider::start().await;
    let mut rebound = ReboundProcess::start(&TestConfig::new(&provider.url()).toml(), &[]).await;
    let resp = send_streaming(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.proxy),
        &[("x-fake-chunks", "5"), ("x-fake-gap-ms", "200")],
        r#"{"stream":true}"#,
    )
    .await;
    rebound.signal("TERM");
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("stream completes during the drain")
        .to_bytes();
    assert_eq!(String::from_utf8_lossy(&body), sse_stream_bytes(5));
    let status = tokio::time::timeout(Duration::from_secs(10), rebound.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0), "{}", rebound.logs());
}

#[tokio::test]
async fn sigterm_past_the_grace_exits_three() {
    let provider = FakeProvider::start().await;
    provider.script("stall", vec![Step::StallAfterFirstChunk]);
    let config = TestConfig::new(&provider.url()).server(|s| s.shutdown_grace = some("200ms"));
    let mut rebound = ReboundProcess::start(&config.toml(), &[]).await;
    let resp = send_streaming(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.proxy),
        &[("x-fake-key", "stall")],
        "{}",
    )
    .await;
    rebound.signal("TERM");
    let status = tokio::time::timeout(Duration::from_secs(10), rebound.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(3), "{}", rebound.logs());
    assert!(
        resp.into_body().collect().await.is_err(),
        "the client must see an abort, not a clean end"
    );
}

/// One JSON access log line per request says what happened to it: route, upstream, status,
/// attempts, the time waited between them, what idempotency did, rebound's own error code, the
/// duration and the app's trace id; the idempotency key (which may be a secret) is not in it.
#[tokio::test]
async fn the_access_log_line_says_what_happened_to_the_request() {
    const CANARY: &str = "CANARY-4d0b9a";
    let provider = FakeProvider::start().await;
    provider.script("logged", vec![Step::status(503)]);
    let config = TestConfig::new(&provider.url())
        .retry(
            "fast",
            RawRetry {
                max_attempts: Some(2),
                base_delay: some("30ms"),
                max_delay: some("30ms"),
                jitter: some("none"),
                ..RawRetry::default()
            },
        )
        .idempotency("idem", Default::default())
        .route(|r| {
            r.retry = some("fast");
            r.idempotency = some("idem");
        });
    let rebound = ReboundProcess::start(&config.toml(), &[]).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let traceparent = format!("00-{trace}-00f067aa0ba902b7-01");
    let key = format!("{CANARY}-idem");
    let headers = [
        ("x-fake-key", "logged"),
        ("traceparent", traceparent.as_str()),
        ("idempotency-key", key.as_str()),
    ];
    let url = format!("{}/fake/v1/chat/completions", rebound.proxy);
    assert_eq!(send("POST", &url, &headers, "{}").await.status, 200);
    assert_eq!(send("POST", &url, &headers, "{}").await.status, 200);
    assert_eq!(
        send("GET", &format!("{}/nope", rebound.proxy), &[], "").await.status,
        404
    );

    let lines = |logs: &str| -> Vec<serde_json::Value> {
        logs.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["target"] == "rebound::access")
            .collect()
    };
    assert!(eventually(Duration::from_secs(5), || lines(&rebound.logs()).len() >= 3).await);
    let logs = rebound.logs();
    let got = lines(&logs);
    let (first, replay, missing) = (&got[0], &got[1], &got[2]);
    assert_eq!(first["route"], "fake", "{first}");
    assert_eq!(first["upstream"], "fake");
    assert_eq!(first["status"], 200);
    assert_eq!(first["attempts"], 2);
    assert_eq!(first["wait_ms"], 30);
    assert_eq!(first["idempotency"], "claimed");
    assert_eq!(first["trace_id"], trace);
    assert_eq!(first["error"], "-");
    assert!(first["duration_ms"].as_f64().unwrap() >= 30.0);
    // The second came after the first's response: a replay, or, if the completion was still
    // being written, the finished live response (both from the original, no upstream call).
    assert!(
        ["replayed", "followed"].contains(&replay["idempotency"].as_str().unwrap()),
        "{replay}"
    );
    assert_eq!(replay["attempts"], 0);
    assert_eq!(missing["error"], "no_route");
    assert_eq!(missing["trace_id"], "-");
    assert!(!logs.contains(CANARY), "the idempotency key reached the logs:\n{logs}");
}

/// The soft limit of open files, and the hard one, of process `pid` (from /proc/PID/limits).
fn open_file_limits(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let nums: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    (nums[0], nums[1])
}

#[tokio::test]
async fn the_open_file_limit_is_raised_to_the_hard_limit_and_a_low_one_is_named() {
    let provider = FakeProvider::start().await;
    let config = TestConfig::new(&provider.url()).toml();
    let rebound = ReboundProcess::start_with_fd_limits(&config, 256, None).await;
    let (soft, hard) = open_file_limits(rebound.child.id().unwrap());
    assert!(hard > 256, "the test needs a hard limit above 256 (is {hard})");
    assert_eq!(soft, hard, "the soft limit was not raised: {}", rebound.logs());
    // Requests still work through it.
    let resp = send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.proxy),
        &[],
        "{}",
    )
    .await;
    assert_eq!(resp.status, 200);

    // A hard limit below 2 x max_connections (10000 by default) is said at startup.
    let low = ReboundProcess::start_with_fd_limits(&config, 128, Some(512)).await;
    assert_eq!(open_file_limits(low.child.id().unwrap()), (512, 512));
    let logs = low.logs();
    assert!(
        logs.contains("the open-file limit is below 2 x max_connections"),
        "{logs}"
    );
    assert!(logs.contains("\"open_files\":512"), "{logs}");
    assert!(logs.contains("\"needed\":20000"), "{logs}");

    // Exactly 2 x max_connections is enough (the common 20,000 for 10,000).
    let small = Edit::new(&config).set("server", "max_connections", 200).to_string();
    let enough = ReboundProcess::start_with_fd_limits(&small, 128, Some(400)).await;
    let logs = enough.logs();
    assert!(!logs.contains("open-file limit"), "{logs}");

    // One less is not; said in a text log written to a pipe, which has no colour codes.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rebound.toml");
    std::fs::write(&path, Edit::new(&small).set("log", "format", "text").to_string()).unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -Sn 128 && ulimit -Hn 399 && exec timeout 3 \"$0\" --config \"$1\"")
        .arg(env!("CARGO_BIN_EXE_rebound"))
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("the open-file limit is below 2 x max_connections"),
        "{text}"
    );
    assert!(text.contains("needed=400"), "{text}");
    assert!(!text.contains('\x1b'), "colour codes in a piped log: {text:?}");
}

/// The names of a process's threads.
fn thread_names(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn the_runtime_is_one_thread_per_worker_or_work_stealing_as_configured() {
    let provider = FakeProvider::start().await;
    let base = TestConfig::new(&provider.url()).toml();
    assert!(base.contains("[server]\n"), "{base}");
    for runtime in ["per_core", "work_stealing"] {
        let toml = base.replacen(
            "[server]\n",
            &format!("[server]\nworker_threads = 2\nruntime = \"{runtime}\"\n"),
            1,
        );
        let rebound = ReboundProcess::start(&toml, &[]).await;
        for _ in 0..4 {
            let resp = post_json(&format!("{}/fake/v1/chat/completions", rebound.proxy), "{}").await;
            assert_eq!(resp.status, 200, "{runtime}: {}", resp.text());
        }
        let names = thread_names(rebound.child.id().unwrap());
        let named = |name: &str| names.iter().filter(|n| *n == name).count();
        match runtime {
            // The process's own thread and one more single-threaded runtime.
            "per_core" => assert_eq!(named("rebound-w1"), 1, "{names:?}"),
            // tokio's two workers (and no per-core worker).
            _ => assert!(named("tokio-rt-worker") >= 2 && named("rebound-w1") == 0, "{names:?}"),
        }
    }
    let e = errors_of(&base.replacen("[server]\n", "[server]\nruntime = \"threads\"\n", 1));
    assert!(
        e.contains(r#"server.runtime: expected one of "per_core", "work_stealing", found "threads""#),
        "{e}"
    );
}

/// `rebound check`'s errors on a config file of `toml`.
fn errors_of(toml: &str) -> String {
    match rebound::Config::parse(toml, std::path::Path::new("t.toml"), &|_| None) {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    }
}
