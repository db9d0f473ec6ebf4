//! Dead letters: recorded with every attempt, counted, summarised, replayed, purged; never a
//! credential; capped.

use std::time::Duration;

use rebound::hooks::config::raw::{RawDeadLetters, RawIdempotency, RawJobs, RawRetry};
use tokio::process::Command;

use crate::support::config_builder::{list, some, TestConfig};
use crate::support::redis::RedisServer;
use crate::support::*;

const TOKEN: &str = "admin-token-123";

/// `[dead_letters]`: 20 entries, `x-tenant-secret` sensitive.
fn dead_letter_table() -> RawDeadLetters {
    RawDeadLetters {
        max_entries: Some(20),
        sensitive_headers: list(&["x-tenant-secret"]),
        ..RawDeadLetters::default()
    }
}

/// The `fake` route with fast retries, idempotency and dead letters (with their bodies when
/// `bodies`), the admin token; Redis when given.
fn config(provider: &str, redis: Option<&str>, bodies: bool) -> TestConfig {
    let c = TestConfig::new(provider)
        .retry(
            "fast",
            RawRetry {
                max_attempts: Some(3),
                base_delay: some("10ms"),
                max_delay: some("20ms"),
                jitter: some("none"),
                ..RawRetry::default()
            },
        )
        .idempotency(
            "idem",
            RawIdempotency {
                lease: some("2s"),
                ..RawIdempotency::default()
            },
        )
        .dead_letters(dead_letter_table())
        .route(|r| {
            r.retry = some("fast");
            r.idempotency = some("idem");
            r.dead_letters = Some(true);
            if bodies {
                r.dead_letter_bodies = Some(true);
            }
        })
        .admin_token(TOKEN);
    match redis {
        Some(url) => c.redis(url),
        None => c,
    }
}

async fn admin(rebound: &Rebound, method: &str, path: &str) -> Answer {
    send(
        method,
        &format!("{}{path}", rebound.admin),
        &[("authorization", &format!("Bearer {TOKEN}"))],
        "",
    )
    .await
}

async fn failing_call(rebound: &Rebound, key: &str, idem: &str, body: &str) -> Answer {
    send(
        "POST",
        &format!("{}/fake/v1/chat/completions?api_key=CANARY-query", rebound.url),
        &[
            ("x-fake-key", key),
            ("idempotency-key", idem),
            ("authorization", "Bearer sk-CANARY-auth"),
            ("x-tenant-secret", "CANARY-configured"),
            ("content-type", "application/json"),
        ],
        body.to_string(),
    )
    .await
}

async fn wait_for_entries(rebound: &Rebound, n: usize) -> serde_json::Value {
    until(&format!("{n} dead letters"), Duration::from_secs(10), || async {
        let page = admin(rebound, "GET", "/admin/dead-letters").await.json();
        match page["items"].as_array().map_or(0, Vec::len) >= n {
            true => Ok(page),
            false => Err(page.to_string()),
        }
    })
    .await
}

async fn exhausted_request_is_recorded(redis: Option<&RedisServer>) {
    let provider = FakeProvider::start().await;
    let url = redis.map(RedisServer::url);
    let rebound = config(&provider.url(), url.as_deref(), true).start().await;
    provider.script("k", vec![Step::status(503), Step::status(502), Step::status(503)]);
    let a = failing_call(&rebound, "k", "dl-1", r#"{"model":"m"}"#).await;
    assert_eq!(a.status, 503);
    let page = wait_for_entries(&rebound, 1).await;
    let e = &page["items"][0];
    assert_eq!(e["route"], "fake");
    assert_eq!(e["upstream"], "fake");
    assert_eq!(e["method"], "POST");
    assert_eq!(e["path"], "/fake/v1/chat/completions");
    assert_eq!(e["reason"], "retries_exhausted");
    assert_eq!(e["error_class"], "status_5xx");
    assert_eq!(e["final_status"], 503);
    assert_eq!(e["idempotency_key"], "dl-1");
    let attempts = e["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3);
    assert_eq!(
        attempts
            .iter()
            .map(|a| a["status"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [503, 502, 503]
    );
    // Without jitter the waits are the backoff caps, 10 ms then 20 ms (a deterministic check).
    assert!(attempts[0]["wait_ms"].as_u64().unwrap() >= 10, "{attempts:?}");
    assert!(attempts[1]["wait_ms"].as_u64().unwrap() >= 20, "{attempts:?}");
    assert_eq!(attempts[2]["wait_ms"], 0);
    assert_eq!(e["body_kept"], true);
    assert!(e["body_base64"].as_str().is_some());
    let text = page.to_string();
    assert!(!text.contains("CANARY"), "a credential reached a dead letter: {text}");

    let summary = admin(&rebound, "GET", "/admin/dead-letters/summary").await.json();
    assert_eq!(summary["total"], 1);
    assert_eq!(summary["groups"][0]["count"], 1);
    assert_eq!(summary["groups"][0]["reason"], "retries_exhausted");
    assert!(summary["groups"][0]["first_seen_ms"].as_u64().unwrap() > 0);
    let m = rebound.metrics().await;
    assert_eq!(
        metric(
            &m,
            r#"rebound_dead_letters_total{reason="retries_exhausted",route="fake"}"#
        ),
        1.0
    );
    assert_eq!(metric(&m, "rebound_dead_letters_depth"), 1.0);

    if let Some(redis) = redis {
        let client = ::redis::Client::open(redis.url()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let dump: Vec<(String, Vec<(String, String)>)> = ::redis::cmd("XRANGE")
            .arg("rebound:dead_letters")
            .arg("-")
            .arg("+")
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(dump.len(), 1);
        assert!(!format!("{dump:?}").contains("CANARY"));
    }
}

#[tokio::test]
async fn exhausted_requests_are_recorded_in_memory() {
    exhausted_request_is_recorded(None).await;
}

#[tokio::test]
async fn exhausted_requests_are_recorded_in_redis() {
    let redis = RedisServer::start();
    exhausted_request_is_recorded(Some(&redis)).await;
}

#[tokio::test]
async fn bodies_are_kept_only_where_the_route_says_and_4xx_is_not_a_dead_letter() {
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), None, false).start().await;
    provider.script("k", vec![Step::status(503); 3]);
    failing_call(&rebound, "k", "nobody", r#"{"secret_prompt":1}"#).await;
    let page = wait_for_entries(&rebound, 1).await;
    assert_eq!(page["items"][0]["body_kept"], false);
    assert!(page["items"][0]["body_base64"].is_null());
    provider.script("bad", vec![Step::status(400)]);
    assert_eq!(failing_call(&rebound, "bad", "x400", "{}").await.status, 400);
    // In memory a dead letter is recorded before its response goes out: none for the 400.
    assert_eq!(
        admin(&rebound, "GET", "/admin/dead-letters").await.json()["items"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // Without the body, a replay is refused with a reason.
    let id = page["items"][0]["id"].as_str().unwrap().to_string();
    let r = admin(&rebound, "POST", &format!("/admin/dead-letters/{id}/replay"))
        .await
        .json();
    assert!(r["error"].as_str().unwrap().contains("dead_letter_bodies"), "{r}");
}

#[tokio::test]
async fn replay_after_recovery_succeeds_and_never_duplicates() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), Some(&redis.url()), true).start().await;
    provider.script("a", vec![Step::status(503); 3]);
    provider.script("b", vec![Step::status(503); 3]);
    failing_call(&rebound, "a", "replay-a", r#"{"n":"a"}"#).await;
    failing_call(&rebound, "b", "replay-b", r#"{"n":"b"}"#).await;
    let page = wait_for_entries(&rebound, 2).await;
    let id_of = |fake: &str| {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["idempotency_key"] == format!("replay-{fake}"))
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (id_a, id_b) = (id_of("a"), id_of("b"));

    // The provider recovered: the replay of a succeeds and is recorded on the entry.
    let r = admin(&rebound, "POST", &format!("/admin/dead-letters/{id_a}/replay"))
        .await
        .json();
    assert_eq!(r["status"], 200, "{r}");
    assert_eq!(r["from_store"], false);
    assert_eq!(provider.count("a"), 4);
    let seen = provider.requests("a").pop().unwrap();
    assert_eq!(seen.body, br#"{"n":"a"}"#, "the original body is re-sent");
    assert_eq!(seen.header("idempotency-key"), Some("replay-a"));
    let e = admin(&rebound, "GET", &format!("/admin/dead-letters/{id_a}"))
        .await
        .json();
    assert_eq!(e["replays"][0]["status"], 200);

    // b succeeded meanwhile through the app's own retry (same key, same tenant): the replay is
    // answered from the idempotency store, with no provider call.
    let app_retry = failing_call(&rebound, "b", "replay-b", r#"{"n":"b"}"#).await;
    assert_eq!(app_retry.status, 200);
    assert_eq!(provider.count("b"), 4);
    // Its completion is written to Redis as its body ends: wait for it to land (the replay of a
    // and the app's retry of b: two stored responses).
    let stored = r#"rebound_idempotency_requests_total{result="stored",route="fake"}"#;
    until_metric(&rebound, stored, |n| n >= 2.0).await;
    let r = admin(&rebound, "POST", &format!("/admin/dead-letters/{id_b}/replay"))
        .await
        .json();
    assert_eq!(r["status"], 200);
    assert_eq!(r["from_store"], true, "{r}");
    assert_eq!(
        provider.count("b"),
        4,
        "a replay of something that succeeded never runs twice"
    );

    // Replay by filter replays both again: both answered from the store now.
    let all = admin(&rebound, "POST", "/admin/dead-letters/replay?route=fake")
        .await
        .json();
    assert_eq!(all["replayed"], 2, "{all}");
    assert_eq!((provider.count("a"), provider.count("b")), (4, 4));
    // Purge.
    let purged = admin(&rebound, "DELETE", "/admin/dead-letters?route=fake").await.json();
    assert_eq!(purged["purged"], 2);
    assert_eq!(
        admin(&rebound, "GET", "/admin/dead-letters").await.json()["items"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
}

#[tokio::test]
async fn admin_api_needs_the_token_and_is_off_without_one() {
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), None, false).start().await;
    let none = send("GET", &format!("{}/admin/dead-letters", rebound.admin), &[], "").await;
    assert_eq!(none.status, 401);
    let wrong = send(
        "GET",
        &format!("{}/admin/dead-letters", rebound.admin),
        &[("authorization", "Bearer nope")],
        "",
    )
    .await;
    assert_eq!(wrong.status, 401);
    assert_eq!(wrong.json()["error"]["code"], "unauthorized");
    // Admin errors are built as the proxy's are (one builder): code and retry advice in headers.
    assert_eq!(wrong.header("x-rebound-error"), Some("unauthorized"));
    assert_eq!(wrong.header("x-should-retry"), Some("false"));
    assert_eq!(wrong.header("content-type"), Some("application/json"));
    assert_eq!(admin(&rebound, "GET", "/admin/dead-letters").await.status, 200);

    let off = TestConfig::new(&provider.url()).start().await;
    let a = send(
        "GET",
        &format!("{}/admin/dead-letters", off.admin),
        &[("authorization", "Bearer x")],
        "",
    )
    .await;
    assert_eq!(a.status, 404);
    assert_eq!(a.json()["error"]["code"], "admin_disabled");
    assert_eq!(a.header("x-rebound-error"), Some("admin_disabled"));
}

#[tokio::test]
async fn the_cli_prints_readable_tables() {
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), None, true).start().await;
    provider.script("k", vec![Step::status(503); 6]);
    failing_call(&rebound, "k", "cli-1", "{}").await;
    failing_call(&rebound, "k", "cli-2", "{}").await;
    wait_for_entries(&rebound, 2).await;
    let run = async |args: &[&str]| {
        // tokio's Command: a blocking wait would stall the in-process rebound it talks to.
        let out = Command::new(env!("CARGO_BIN_EXE_rebound"))
            .arg("dead-letters")
            .args(args)
            .args(["--admin", &rebound.admin, "--token", TOKEN])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let list = run(&["list"]).await;
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 3, "{list}");
    assert!(
        lines[0].starts_with("ID ") && lines[0].contains("REASON") && lines[0].contains("ATTEMPTS"),
        "{list}"
    );
    assert!(
        lines[1].contains("fake") && lines[1].contains("retries_exhausted") && lines[1].contains("503"),
        "{list}"
    );
    assert!(lines[1].contains("POST /fake/v1/chat/completions"), "{list}");
    let summary = run(&["summary"]).await;
    let head = summary.lines().next().unwrap();
    assert!(
        head.starts_with("GROUP  ") && head.contains("COUNT") && head.contains("VERDICT"),
        "{summary}"
    );
    assert!(
        summary.contains("2  ") && summary.contains("retries_exhausted") && summary.contains("total: 2"),
        "{summary}"
    );
    // Each group's analysis under the table.
    assert!(summary.contains("2 × fake answered 503"), "{summary}");
    let json: serde_json::Value = serde_json::from_str(&run(&["list", "--json", "--route", "fake"]).await).unwrap();
    assert_eq!(json["items"].as_array().unwrap().len(), 2);
    let none = run(&["list", "--route", "other"]).await;
    assert_eq!(none, "no dead letters\n");
    assert!(run(&["purge", "--all"]).await.contains("purged 2"));

    let out = Command::new(env!("CARGO_BIN_EXE_rebound"))
        .args(["dead-letters", "list", "--admin", &rebound.admin, "--token", "wrong"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));
}

#[tokio::test]
async fn ring_and_stream_stay_within_their_caps() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    for url in [None, Some(redis.url())] {
        // max_entries = 20; 200 failures.
        let rebound = config(&provider.url(), url.as_deref(), false).start().await;
        provider.script("cap", vec![Step::status(503); 1000]);
        for i in 0..200 {
            let a = send(
                "POST",
                &format!("{}/fake/v1/chat/completions", rebound.url),
                &[
                    ("x-fake-key", "cap"),
                    ("x-rebound-max-attempts", "1"),
                    ("x-i", &i.to_string()),
                ],
                "{}",
            )
            .await;
            assert_eq!(a.status, 503);
        }
        // All 200 are recorded: in memory before their responses, on Redis once each write
        // (a task per entry) has been answered.
        if url.is_some() {
            let writes = r#"rebound_redis_command_duration_seconds_count{op="dead_letter_add"}"#;
            until_metric(&rebound, writes, |v| v >= 200.0).await;
        }
        let page = admin(&rebound, "GET", "/admin/dead-letters?limit=1000").await.json();
        let n = page["items"].as_array().unwrap().len();
        // Redis trims approximately (MAXLEN ~): within one macro node of the cap.
        assert!((20..=120).contains(&n), "{n} entries held");
        let depth = metric(&rebound.metrics().await, "rebound_dead_letters_depth");
        assert!(depth <= 120.0, "{depth}");
    }
}

/// `rebound dead-letters replay` says what it did: replayed N, skipped M and why;
/// with nothing replayed it fails (stderr, non-zero exit) instead of printing "replayed 1" and
/// exiting 0.
#[tokio::test]
async fn the_cli_replay_reports_what_it_did_and_fails_when_nothing_was_replayed() {
    let provider = FakeProvider::start().await;
    let replay = async |rebound: &Rebound| {
        Command::new(env!("CARGO_BIN_EXE_rebound"))
            .args([
                "dead-letters",
                "replay",
                "--route",
                "fake",
                "--admin",
                &rebound.admin,
                "--token",
                TOKEN,
            ])
            .output()
            .await
            .unwrap()
    };
    // Without bodies: nothing can be replayed.
    let bare = config(&provider.url(), None, false).start().await;
    provider.script("k", vec![Step::status(503); 6]);
    failing_call(&bare, "k", "cli-r1", "{}").await;
    failing_call(&bare, "k", "cli-r2", "{}").await;
    wait_for_entries(&bare, 2).await;
    let out = replay(&bare).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("replayed 0, succeeded 0, skipped 2 (2: the request body was not kept"),
        "{stderr}"
    );
    // With bodies, after the provider recovered: replayed and succeeded, exit 0.
    let kept = config(&provider.url(), None, true).start().await;
    provider.script("j", vec![Step::status(503); 3]);
    failing_call(&kept, "j", "cli-r3", "{}").await;
    wait_for_entries(&kept, 1).await;
    let out = replay(&kept).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("replayed 1, succeeded 1, skipped 0"), "{stdout}");
}

/// Bodies are bounded. A body over `[dead_letters] max_body` is not kept (the entry
/// says why, and a replay is refused with that reason); in memory the ring holds at most
/// `max_bytes` of bodies, the oldest entries going first.
#[tokio::test]
async fn bodies_over_max_body_are_not_kept_and_the_ring_holds_at_most_max_bytes() {
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), None, true)
        .dead_letters(RawDeadLetters {
            max_body: some("1KiB"),
            max_bytes: some("8KiB"),
            ..dead_letter_table()
        })
        .start()
        .await;
    provider.script("k", vec![Step::status(503); 1000]);
    let big = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(2000));
    failing_call(&rebound, "k", "big", &big).await;
    let page = wait_for_entries(&rebound, 1).await;
    let entry = &page["items"][0];
    assert_eq!(entry["body_kept"], false, "{entry}");
    let why = entry["body_missing"].as_str().unwrap();
    assert!(why.contains("max_body") && why.contains("2013 bytes"), "{why}");
    let id = entry["id"].as_str().unwrap();
    let r = admin(&rebound, "POST", &format!("/admin/dead-letters/{id}/replay"))
        .await
        .json();
    assert!(r["error"].as_str().unwrap().contains("max_body"), "{r}");

    // 20 bodies of 1,000 bytes (1,336 in base64): 8 KiB holds 6 of them, the newest.
    for i in 0..20 {
        let body = format!(r#"{{"i":{i:02},"p":"{}"}}"#, "y".repeat(1000 - 15));
        assert_eq!(body.len(), 1000);
        failing_call(&rebound, "k", &format!("small-{i}"), &body).await;
    }
    let page = admin(&rebound, "GET", "/admin/dead-letters?limit=1000").await.json();
    let keys: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["idempotency_key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        ["small-19", "small-18", "small-17", "small-16", "small-15", "small-14"],
        "the newest entries whose bodies fit in max_bytes"
    );
    assert_eq!(metric(&rebound.metrics().await, "rebound_dead_letters_depth"), 6.0);
}

/// On Redis, bodies are sealed at rest with `[jobs] secret`: the stream holds no
/// byte of the prompt, the admin API shows it opened, a replay re-sends it; a replica with
/// another secret cannot open it and says so instead of replaying an empty body.
#[tokio::test]
async fn bodies_on_redis_are_sealed_with_the_jobs_secret() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let with_secret = |secret: &str| {
        config(&provider.url(), Some(&redis.url()), true).jobs(RawJobs {
            secret: some(secret),
            ..RawJobs::default()
        })
    };
    let a = with_secret("fleet-secret-one-0123456789").start().await;
    provider.script("s", vec![Step::status(503); 3]);
    let body = r#"{"prompt":"CANARY-prompt-text"}"#;
    failing_call(&a, "s", "sealed-1", body).await;
    let page = wait_for_entries(&a, 1).await;
    let id = page["items"][0]["id"].as_str().unwrap().to_string();

    let raw: Vec<(String, Vec<(String, String)>)> = crate::support::redis::query(
        redis.port,
        ::redis::cmd("XRANGE").arg("rebound:dead_letters").arg("-").arg("+"),
    )
    .unwrap();
    assert_eq!(raw.len(), 1);
    let stored = &raw[0].1[0].1;
    let b64 = base64_of(body.as_bytes());
    assert!(
        !stored.contains("CANARY") && !stored.contains(&b64) && stored.contains("body_sealed"),
        "{stored}"
    );
    assert_eq!(page["items"][0]["body_base64"], b64.as_str(), "the API shows it opened");

    let r = admin(&a, "POST", &format!("/admin/dead-letters/{id}/replay"))
        .await
        .json();
    assert_eq!(r["status"], 200, "{r}");
    assert_eq!(provider.requests("s").pop().unwrap().body, body.as_bytes());

    // Another secret: the body cannot be opened; the entry says why and is not replayed.
    let b = with_secret("another-secret-0123456789").start().await;
    let e = admin(&b, "GET", &format!("/admin/dead-letters/{id}")).await.json();
    assert_eq!(e["body_kept"], false, "{e}");
    assert!(e["body_missing"].as_str().unwrap().contains("[jobs] secret"), "{e}");
    let r = admin(&b, "POST", &format!("/admin/dead-letters/{id}/replay"))
        .await
        .json();
    assert!(r["error"].as_str().unwrap().contains("[jobs] secret"), "{r}");
    assert_eq!(
        provider.count("s"),
        4,
        "nothing re-sent by the replica that cannot open it"
    );
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
