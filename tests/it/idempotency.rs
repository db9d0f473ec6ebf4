//! Idempotency keys through real sockets: one provider call per key, replays, conflicts, tenants,
//! streams, and a Redis that goes away.

use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use rebound::hooks::config::raw::{RawIdempotency, RawRedis, RawRetry};

use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::{chat_completion, sse_stream_bytes};
use crate::support::redis::RedisServer;
use crate::support::sidecar::ReboundProcess;
use crate::support::*;

/// The completions stored on the `fake` route.
const STORED: &str = r#"rebound_idempotency_requests_total{result="stored",route="fake"}"#;

/// `[redis]` at `url` with a 200 ms command timeout.
fn store(url: &str) -> RawRedis {
    RawRedis {
        url: some(url),
        command_timeout: some("200ms"),
        ..RawRedis::default()
    }
}

/// The `fake` route with `[idempotency.idem]` (a 1 s lease, then `policy`) and a fast retry
/// policy; Redis when given.
fn config(provider: &str, redis: Option<&str>, policy: impl FnOnce(&mut RawIdempotency)) -> TestConfig {
    let mut idem = RawIdempotency {
        wait_timeout: some("5s"),
        lease: some("1s"),
        ..RawIdempotency::default()
    };
    policy(&mut idem);
    let c = TestConfig::new(provider)
        .retry(
            "fast",
            RawRetry {
                max_attempts: Some(2),
                base_delay: some("10ms"),
                max_delay: some("20ms"),
                ..RawRetry::default()
            },
        )
        .idempotency("idem", idem)
        .route(|r| {
            r.retry = some("fast");
            r.idempotency = some("idem");
        });
    match redis {
        Some(url) => c.with_redis(store(url)),
        None => c,
    }
}

async fn call(url: &str, fake_key: &str, idem_key: Option<&str>, body: &str, extra: &[(&str, &str)]) -> Answer {
    let mut h = vec![
        ("x-fake-key", fake_key),
        ("content-type", "application/json"),
        ("authorization", "Bearer tenant-a"),
    ];
    if let Some(k) = idem_key {
        h.push(("idempotency-key", k));
    }
    h.extend_from_slice(extra);
    send("POST", &format!("{url}/fake/v1/chat/completions"), &h, body.to_string()).await
}

async fn redis_keys(url: &str) -> Vec<(String, Vec<u8>)> {
    let client = ::redis::Client::open(url).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = ::redis::cmd("KEYS").arg("*").query_async(&mut c).await.unwrap();
    let mut out = Vec::new();
    for k in keys {
        let fields: Vec<Vec<u8>> = ::redis::cmd("HGETALL")
            .arg(&k)
            .query_async(&mut c)
            .await
            .unwrap_or_default();
        out.push((k, fields.concat()));
    }
    out
}

#[tokio::test]
async fn a_completed_key_is_replayed_by_another_instance_without_a_second_call() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = config(&provider.url(), Some(&redis.url()), |_| {});
    let (a, b) = (config.start().await, config.start().await);
    let first = call(&a.url, "k", Some("key-1"), r#"{"model":"m"}"#, &[]).await;
    assert_eq!(first.status, 200);
    assert!(first.header("idempotent-replayed").is_none());
    assert!(eventually(Duration::from_secs(2), || !provider.requests("k").is_empty()).await);
    // The completion is written to Redis as the body ends, in the background: B asks once it
    // landed (before, B would follow the original instead of replaying it).
    until_metric(&a, STORED, |n| n >= 1.0).await;

    let again = call(&b.url, "k", Some("key-1"), r#"{"model":"m"}"#, &[]).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body, first.body, "byte-exact replay");
    assert_eq!(again.text(), chat_completion());
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.header("content-type"), Some("application/json"));
    assert_eq!(again.header("x-request-id"), Some("req_fake_0001"));
    assert_eq!(again.header("x-rebound-attempts"), Some("0"));
    assert_eq!(provider.count("k"), 1, "exactly one provider call");
    // The key is still forwarded upstream, for providers that honour it.
    assert_eq!(provider.requests("k")[0].header("idempotency-key"), Some("key-1"));
    let page = b.metrics().await;
    assert_eq!(
        metric(
            &page,
            r#"rebound_idempotency_requests_total{result="replayed",route="fake"}"#
        ),
        1.0,
        "{page}"
    );
    let page = a.metrics().await;
    assert_eq!(
        metric(
            &page,
            r#"rebound_idempotency_requests_total{result="stored",route="fake"}"#
        ),
        1.0,
        "{page}"
    );
}

async fn burst(provider: &FakeProvider, urls: [String; 2], key: &str) -> Vec<Answer> {
    provider.script(key, vec![Step::Delay { ms: 400 }]);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..50 {
        let url = urls[i % 2].clone();
        let key = key.to_string();
        set.spawn(async move { call(&url, &key, Some(&key), r#"{"n":1}"#, &[]).await });
    }
    let mut out = Vec::new();
    while let Some(a) = set.join_next().await {
        out.push(a.unwrap());
    }
    out
}

/// Every answer of a burst (50 requests) is the original's response; the 49 besides the original
/// are replays.
fn all_got_the_original(answers: &[Answer]) {
    for ans in answers {
        assert_eq!(ans.status, 200, "{}", ans.text());
        assert_eq!(ans.text(), chat_completion());
    }
    let replayed = answers
        .iter()
        .filter(|a| a.header("idempotent-replayed") == Some("true"))
        .count();
    assert_eq!(replayed, 49);
}

#[tokio::test]
async fn fifty_concurrent_duplicates_make_one_call_and_all_get_the_original() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = config(&provider.url(), Some(&redis.url()), |p| p.on_concurrent = some("wait"));
    let (a, b) = (config.start().await, config.start().await);
    let answers = burst(&provider, [a.url.clone(), b.url.clone()], "burst-wait").await;
    assert_eq!(provider.count("burst-wait"), 1);
    all_got_the_original(&answers);
}

#[tokio::test]
async fn fifty_concurrent_duplicates_in_conflict_mode_get_409() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = config(&provider.url(), Some(&redis.url()), |p| {
        p.on_concurrent = some("conflict")
    });
    let (a, b) = (config.start().await, config.start().await);
    let answers = burst(&provider, [a.url.clone(), b.url.clone()], "burst-conflict").await;
    assert_eq!(provider.count("burst-conflict"), 1);
    let ok = answers.iter().filter(|a| a.status == 200).count();
    let conflicts: Vec<&Answer> = answers.iter().filter(|a| a.status == 409).collect();
    assert_eq!(ok + conflicts.len(), 50);
    assert!(ok >= 1);
    for c in conflicts {
        assert_eq!(c.header("x-rebound-error"), Some("idempotency_in_progress"));
        assert_eq!(c.header("x-should-retry"), Some("true"));
        assert!(c.header("retry-after").is_some());
    }
}

/// The in-memory store decides a fresh key inline; a duplicate of one in flight goes on to wait
/// (and gets the original's response) or is refused at once with a Retry-After.
#[tokio::test]
async fn concurrent_duplicates_on_the_in_memory_store_wait_or_get_409() {
    let provider = FakeProvider::start().await;
    let waits = config(&provider.url(), None, |p| p.on_concurrent = some("wait"))
        .start()
        .await;
    let answers = burst(&provider, [waits.url.clone(), waits.url.clone()], "memory-wait").await;
    assert_eq!(provider.count("memory-wait"), 1);
    all_got_the_original(&answers);

    let refuses = config(&provider.url(), None, |p| p.on_concurrent = some("conflict"))
        .start()
        .await;
    let answers = burst(&provider, [refuses.url.clone(), refuses.url.clone()], "memory-conflict").await;
    assert_eq!(provider.count("memory-conflict"), 1);
    let ok = answers.iter().filter(|a| a.status == 200).count();
    let conflicts: Vec<&Answer> = answers.iter().filter(|a| a.status == 409).collect();
    assert_eq!(ok + conflicts.len(), 50);
    assert!(
        ok >= 1 && !conflicts.is_empty(),
        "{ok} answered, {} refused",
        conflicts.len()
    );
    for c in conflicts {
        assert_eq!(c.header("x-rebound-error"), Some("idempotency_in_progress"));
        assert_eq!(c.header("retry-after"), Some("1"));
    }
}

#[tokio::test]
async fn key_reuse_with_another_body_is_422_and_json_order_does_not_matter() {
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), None, |_| {}).start().await;
    let a = call(
        &rebound.url,
        "k",
        Some("reuse"),
        r#"{"model":"m","messages":[1,2]}"#,
        &[],
    )
    .await;
    assert_eq!(a.status, 200);
    assert!(eventually(Duration::from_secs(2), || provider.count("k") == 1).await);
    let same = call(
        &rebound.url,
        "k",
        Some("reuse"),
        "{ \"messages\": [1, 2],\n  \"model\": \"m\" }",
        &[],
    )
    .await;
    assert_eq!(same.status, 200);
    assert_eq!(same.header("idempotent-replayed"), Some("true"));
    let other = call(&rebound.url, "k", Some("reuse"), r#"{"model":"other"}"#, &[]).await;
    assert_eq!(other.status, 422);
    assert_eq!(other.header("x-rebound-error"), Some("idempotency_key_reused"));
    assert_eq!(other.json()["error"]["code"], "idempotency_key_reused");
    assert_eq!(provider.count("k"), 1);
}

/// A record written before the fingerprint's version 2 (an older replica on the same Redis, or
/// before an upgrade) still answers its duplicates: the request is checked again with the
/// fingerprint of version 1. Another body under the same key is still 422, counted once.
#[tokio::test]
async fn a_record_with_a_version_1_fingerprint_still_replays_its_duplicates() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), Some(&redis.url()), |_| {}).start().await;
    let body = r#"{"model":"m","messages":[{"role":"user","content":"say \"hi\"\n"}]}"#;
    assert_eq!(call(&rebound.url, "k", Some("old"), body, &[]).await.status, 200);
    until_metric(&rebound, STORED, |n| n >= 1.0).await;

    // Written by this version: marked as version 2. Rewritten as an older build wrote it.
    assert_eq!(redis.rewrite_fingerprints_as_v1(body).await, 1);

    let reordered = r#"{"messages":[{"content":"say \"hi\"\u000a","role":"user"}],"model":"m"}"#;
    let again = call(&rebound.url, "k", Some("old"), reordered, &[]).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(provider.count("k"), 1, "no second provider call");

    let other = call(&rebound.url, "k", Some("old"), r#"{"model":"other"}"#, &[]).await;
    assert_eq!(other.status, 422);
    assert_eq!(other.header("x-rebound-error"), Some("idempotency_key_reused"));
    let page = rebound.metrics().await;
    let mismatch = r#"rebound_idempotency_requests_total{result="mismatch",route="fake"}"#;
    assert_eq!(metric(&page, mismatch), 1.0, "{page}");
    assert_eq!(provider.count("k"), 1);
}

/// A fleet rolled with `[redis] fingerprint = 1` (the new build writing what the old one does),
/// then without it: while replicas on both sides share Redis, each replays the other's records
/// and refuses another body with 422.
#[tokio::test]
async fn replicas_on_both_sides_of_the_fingerprint_setting_answer_each_others_keys() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    // One replica with `fingerprint = 1`, one without.
    let old = config(&provider.url(), Some(&redis.url()), |_| {})
        .with_redis(RawRedis {
            fingerprint: Some(1),
            ..store(&redis.url())
        })
        .start()
        .await;
    let new = config(&provider.url(), Some(&redis.url()), |_| {}).start().await;
    let stored = |n: f64| move |v: f64| v >= n;
    let body = r#"{"model":"m","input":"a\nb"}"#;
    let reordered = r#"{"input":"a\u000ab","model":"m"}"#;

    // Each side's record, replayed by the other (the new build's marked `2:`).
    for (writer, reader, key, marked) in [(&old, &new, "from-old", 0), (&new, &old, "from-new", 1)] {
        assert_eq!(call(&writer.url, "k", Some(key), body, &[]).await.status, 200);
        until_metric(writer, STORED, stored(1.0)).await;
        let fps = redis.fingerprints().await;
        assert_eq!(
            fps.iter().filter(|(_, f)| f.starts_with("2:")).count(),
            marked,
            "{fps:?}"
        );
        let again = call(&reader.url, "k", Some(key), reordered, &[]).await;
        assert_eq!(again.header("idempotent-replayed"), Some("true"), "{}", again.text());
    }
    assert_eq!(provider.count("k"), 2, "one provider call per key");

    for (replica, key) in [(&old, "from-new"), (&new, "from-old")] {
        let other = call(&replica.url, "k", Some(key), r#"{"model":"other"}"#, &[]).await;
        assert_eq!(other.status, 422, "{key}");
    }
    assert_eq!(provider.count("k"), 2);
}

#[tokio::test]
async fn a_failed_outcome_releases_the_key_and_the_retry_runs() {
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), None, |_| {}).start().await;
    provider.script("k", vec![Step::status(503), Step::status(503)]);
    let a = call(&rebound.url, "k", Some("released"), "{}", &[]).await;
    assert_eq!(a.status, 503);
    assert_eq!(provider.count("k"), 2);
    let b = call(&rebound.url, "k", Some("released"), "{}", &[]).await;
    assert_eq!(b.status, 200, "the retry runs: the 503 was not stored");
    assert!(b.header("idempotent-replayed").is_none());
    assert_eq!(provider.count("k"), 3);
    let c = call(&rebound.url, "k", Some("released"), "{}", &[]).await;
    assert_eq!(c.header("idempotent-replayed"), Some("true"), "the 200 was stored");
    assert_eq!(provider.count("k"), 3);
}

#[tokio::test]
async fn a_killed_instance_frees_the_key_by_the_end_of_the_lease() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = config(&provider.url(), Some(&redis.url()), |p| {
        p.on_concurrent = some("conflict");
        p.lease = some("2s");
    });
    let mut doomed = ReboundProcess::start(&config.toml(), &[]).await;
    provider.script("k", vec![Step::Delay { ms: 30_000 }]);
    let url = doomed.proxy.clone();
    let sent = Instant::now();
    let inflight = tokio::spawn(async move { call(&url, "k", Some("killed"), "{}", &[]).await });
    assert!(eventually(Duration::from_secs(5), || provider.count("k") == 1).await);
    doomed.child.start_kill().unwrap();
    let _ = doomed.child.wait().await;
    let killed_at = Instant::now();
    inflight.abort();

    let survivor = config.start().await;
    let during = call(&survivor.url, "k", Some("killed"), "{}", &[]).await;
    assert_eq!(during.status, 409, "the dead owner's lease still holds");
    // The lease is 2 s, the key's TTL 24 h: a 60 s guard tells the two apart.
    let (after_kill, after_send) = until(
        "the key is claimable again after the lease at most, not the 24 h TTL",
        Duration::from_secs(60),
        || async {
            let a = call(&survivor.url, "k", Some("killed"), "{}", &[]).await;
            match a.status.as_u16() {
                200 => Ok((killed_at.elapsed(), sent.elapsed())),
                _ => Err(format!("{} {}", a.status, a.text())),
            }
        },
    )
    .await;
    // Freed by the lease, or sooner by the owner's missing liveness record.
    eprintln!("freed {after_kill:?} after the kill, {after_send:?} after the claim");
    assert_eq!(provider.count("k"), 2);
}

/// A whole response is stored when it is delivered, not when the client's connection lets go of
/// its body: hyper drops a body that says it has ended without asking it for its end, and with
/// `complete_on_disconnect = false` such a drop used to count as a disconnect (released, not
/// stored: the retry ran again).
#[tokio::test]
async fn a_delivered_response_is_stored_without_complete_on_disconnect() {
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), None, |p| p.complete_on_disconnect = Some(false))
        .start()
        .await;
    for key in ["whole-1", "whole-2"] {
        let first = call(&rebound.url, key, Some(key), r#"{"model":"m"}"#, &[]).await;
        assert_eq!(first.status, 200);
        assert_eq!(first.text(), chat_completion());
        let again = call(&rebound.url, key, Some(key), r#"{"model":"m"}"#, &[]).await;
        assert_eq!(again.status, 200);
        assert_eq!(again.header("idempotent-replayed"), Some("true"), "{key} stored");
        assert_eq!(again.body, first.body);
        assert_eq!(provider.count(key), 1, "{key}: one provider call");
    }
    // A stream (no content-length: its end is a frame of its own) is stored the same way.
    let sse = |url: String| async move {
        send_streaming(
            "POST",
            &format!("{url}/fake/v1/chat/completions"),
            &[
                ("x-fake-key", "sse"),
                ("idempotency-key", "sse"),
                ("x-fake-chunks", "3"),
            ],
            r#"{"stream":true}"#,
        )
        .await
    };
    let first = sse(rebound.url.clone())
        .await
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    let replay = sse(rebound.url.clone()).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.into_body().collect().await.unwrap().to_bytes(), first);
    assert_eq!(provider.count("sse"), 1);
}

#[tokio::test]
async fn streams_are_replayed_byte_for_byte_and_completed_after_a_disconnect() {
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), None, |_| {}).start().await;
    let stream = |key: &'static str, url: String| async move {
        send_streaming(
            "POST",
            &format!("{url}/fake/v1/chat/completions"),
            &[
                ("x-fake-key", key),
                ("idempotency-key", key),
                ("x-fake-chunks", "8"),
                ("x-fake-gap-ms", "50"),
            ],
            r#"{"stream":true}"#,
        )
        .await
    };
    let first = stream("sse", rebound.url.clone())
        .await
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(String::from_utf8_lossy(&first), sse_stream_bytes(8));
    // Stored: the event the replay depends on.
    until_metric(&rebound, STORED, |n| n >= 1.0).await;
    let replay = stream("sse", rebound.url.clone()).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["content-type"], "text/event-stream");
    let replay = replay.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(replay, first);
    assert_eq!(provider.count("sse"), 1);

    // The client goes away after the first chunk: rebound reads the rest and stores it.
    let resp = stream("gone", rebound.url.clone()).await;
    let mut body = resp.into_body();
    let _first = body.frame().await.unwrap().unwrap();
    drop(body);
    assert!(eventually(Duration::from_secs(5), || provider.streams_completed("gone") == 1).await);
    // Stored: the event the retry depends on (the "sse" record, then this one).
    until_metric(&rebound, STORED, |n| n >= 2.0).await;
    let retry = stream("gone", rebound.url.clone()).await;
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let all = retry.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        String::from_utf8_lossy(&all),
        sse_stream_bytes(8),
        "the whole generation, already paid for"
    );
    assert_eq!(provider.count("gone"), 1);
}

#[tokio::test]
async fn redis_outage_fails_closed_or_open_and_recovers_without_restart() {
    let mut redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let closed = config(&provider.url(), Some(&redis.url()), |_| {}).start().await;
    let open = config(&provider.url(), Some(&redis.url()), |p| {
        p.on_store_error = some("fail_open")
    })
    .start()
    .await;
    assert!(eventually(Duration::from_secs(5), || true).await);
    let warm = call(&closed.url, "k", Some("warm"), "{}", &[]).await;
    assert_eq!(warm.status, 200);

    redis.stop();
    let a = call(&closed.url, "down", Some("while-down"), "{}", &[]).await;
    assert_eq!(a.status, 503, "{}", a.text());
    assert_eq!(a.header("x-rebound-error"), Some("store_unavailable"));
    assert_eq!(provider.count("down"), 0, "fail_closed sends nothing upstream");

    let b = call(&open.url, "down", Some("while-down"), "{}", &[]).await;
    assert_eq!(b.status, 200);
    assert_eq!(b.header("x-rebound-idempotency"), Some("bypassed"));
    assert_eq!(provider.count("down"), 1);
    // Requests without a key never touch the store.
    assert_eq!(call(&closed.url, "nokey", None, "{}", &[]).await.status, 200);

    redis.restart();
    until(
        "idempotency works again without restarting rebound",
        Duration::from_secs(5),
        || async {
            let a = call(&closed.url, "after", Some("after-restart"), "{}", &[]).await;
            if a.status == 200 {
                Ok(())
            } else {
                Err(a.text())
            }
        },
    )
    .await;
    until(
        "the fail-open instance rejoins the store too",
        Duration::from_secs(5),
        || async {
            let replay = call(&open.url, "after", Some("after-restart"), "{}", &[]).await;
            match replay.header("idempotent-replayed") {
                Some("true") => Ok(()),
                _ => Err(replay.text()),
            }
        },
    )
    .await;
    let page = closed.metrics().await;
    assert!(
        metric(
            &page,
            r#"rebound_idempotency_requests_total{result="store_error",route="fake"}"#
        ) >= 1.0
    );
}

#[tokio::test]
async fn tenants_never_share_records_and_redis_holds_no_secret() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), Some(&redis.url()), |_| {}).start().await;
    let key = "tenant-key-CANARY-3f9a";
    for tenant in ["Bearer sk-CANARY-tenant-one", "Bearer sk-CANARY-tenant-two"] {
        let a = call(&rebound.url, "t", Some(key), "{}", &[("authorization", tenant)]).await;
        assert_eq!(a.status, 200);
        assert!(
            a.header("idempotent-replayed").is_none(),
            "another tenant's record must not answer"
        );
    }
    assert_eq!(provider.count("t"), 2);
    until_metric(&rebound, STORED, |n| n >= 2.0).await;
    let keys = redis_keys(&redis.url()).await;
    let records: Vec<&String> = keys.iter().map(|(k, _)| k).filter(|k| k.contains("idem:")).collect();
    assert_eq!(records.len(), 2, "{keys:?}");
    for (k, v) in &keys {
        assert!(!k.contains("CANARY"), "raw key or credential in a Redis key: {k}");
        assert!(
            !String::from_utf8_lossy(v).contains("CANARY"),
            "raw key or credential in a Redis value of {k}"
        );
        assert!(k.starts_with("rebound:idem:{fake:"), "{k}");
    }
}

#[tokio::test]
async fn malformed_and_missing_keys() {
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), None, |_| {}).start().await;
    for bad in ["", "has space", &"x".repeat(256)] {
        let a = call(&rebound.url, "bad", Some(bad), "{}", &[]).await;
        assert_eq!(a.status, 400, "{bad:?}");
        assert_eq!(a.header("x-rebound-error"), Some("invalid_idempotency_key"));
    }
    let two = send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[
            ("x-fake-key", "bad"),
            ("idempotency-key", "a"),
            ("idempotency-key", "b"),
        ],
        "{}",
    )
    .await;
    assert_eq!(two.status, 400);
    assert_eq!(provider.count("bad"), 0);
    // A quoted structured-field string is accepted and means the same key.
    let q = call(&rebound.url, "q", Some("\"quoted-1\""), "{}", &[]).await;
    assert_eq!(q.status, 200);
    until_metric(&rebound, STORED, |n| n >= 1.0).await;
    let plain = call(&rebound.url, "q", Some("quoted-1"), "{}", &[]).await;
    assert_eq!(plain.header("idempotent-replayed"), Some("true"));

    let required = config(&provider.url(), None, |p| p.require_key = Some(true))
        .start()
        .await;
    let a = call(&required.url, "req", None, "{}", &[]).await;
    assert_eq!(a.status, 400);
    assert_eq!(a.header("x-rebound-error"), Some("idempotency_key_required"));
    assert_eq!(provider.count("req"), 0);
    // GET is not covered: forwarded without a key.
    let g = send(
        "GET",
        &format!("{}/fake/echo", required.url),
        &[("x-fake-key", "get")],
        "",
    )
    .await;
    assert_eq!(g.status, 200);
}

#[tokio::test]
async fn an_oversized_response_is_completed_but_not_kept() {
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), None, |p| p.max_stored_body = some("100B"))
        .start()
        .await;
    let a = call(&rebound.url, "big", Some("too-big"), "{}", &[]).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.text(), chat_completion(), "the live client gets it all");
    // Completed without its body: the event the next try depends on.
    until_metric(
        &rebound,
        r#"rebound_idempotency_requests_total{result="not_stored",route="fake"}"#,
        |n| n >= 1.0,
    )
    .await;
    let b = call(&rebound.url, "big", Some("too-big"), "{}", &[]).await;
    assert_eq!(b.status, 409);
    assert_eq!(b.header("x-rebound-error"), Some("idempotency_response_not_kept"));
    assert_eq!(b.header("x-should-retry"), Some("false"));
    assert_eq!(provider.count("big"), 1, "never a re-run");
}

/// A replay answers with the original's allowlisted headers (repeated values in order, an empty
/// value kept) and no other, from the in-memory store and through Redis alike. In memory they
/// are one shared block (`src/idempotency/kept.rs`); Redis holds the same list of pairs as ever.
#[tokio::test]
async fn a_replay_carries_exactly_the_kept_headers_of_the_original() {
    let provider = FakeProvider::start().await;
    let redis = RedisServer::start();
    for (n, store) in [None, Some(redis.url())].into_iter().enumerate() {
        let rebound = config(&provider.url(), store.as_deref(), |_| {}).start().await;
        let fake_key = format!("kept-{n}");
        let headers = [
            ("content-language", "en"),
            ("x-private", "not kept"),
            ("content-language", "fr"),
            ("request-id", ""),
        ];
        let original = Step::Status {
            status: 200,
            headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            body: Some(r#"{"id":"chatcmpl-kept","object":"chat.completion"}"#.into()),
        };
        provider.script(&fake_key, vec![original]);
        let first = call(&rebound.url, &fake_key, Some("kept"), r#"{"model":"m"}"#, &[]).await;
        assert_eq!(first.status, 200);
        until_metric(&rebound, STORED, |v| v >= 1.0).await;
        let again = call(&rebound.url, &fake_key, Some("kept"), r#"{"model":"m"}"#, &[]).await;
        assert_eq!(again.header("idempotent-replayed"), Some("true"), "store {n}");
        assert_eq!(again.body, first.body);
        let all = |name: &str| -> Vec<&str> {
            again
                .headers
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect()
        };
        assert_eq!(all("content-type"), ["application/json"], "store {n}");
        assert_eq!(all("content-language"), ["en", "fr"], "store {n}");
        assert_eq!(all("request-id"), [""], "store {n}");
        assert!(all("x-private").is_empty(), "store {n}");
        assert_eq!(provider.count(&fake_key), 1, "store {n}: one provider call");
    }
}
