//! `on_concurrent = "follow"` (the default) through real sockets: duplicates of an in-flight keyed
//! request receive the original's response as it is produced, on the same replica or another one
//! (through Redis), and a client that reconnects mid-stream gets it from byte 0; the provider is
//! called once.

use std::time::Duration;

use bytes::BytesMut;
use http_body_util::BodyExt;
use rebound::hooks::config::raw::{RawIdempotency, RawRetry};

use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::sse_stream_bytes;
use crate::support::redis::RedisServer;
use crate::support::*;

/// The `fake` route with `[idempotency.idem]` (follow, the default) and a fast retry policy;
/// Redis when given.
fn config(provider: &str, redis: Option<&str>) -> TestConfig {
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
        .idempotency(
            "idem",
            RawIdempotency {
                lease: some("2s"),
                ..RawIdempotency::default()
            },
        )
        .route(|r| {
            r.retry = some("fast");
            r.idempotency = some("idem");
        });
    match redis {
        Some(url) => c.redis_with(url, |r| r.command_timeout = some("500ms")),
        None => c,
    }
}

/// A streamed chat completion of `chunks` events, `gap_ms` apart, under an idempotency key.
async fn stream(url: &str, key: &str, chunks: &str, gap_ms: &str) -> http::Response<hyper::body::Incoming> {
    send_streaming_within(
        Duration::from_secs(20),
        "POST",
        &format!("{url}/fake/v1/chat/completions"),
        &[
            ("x-fake-key", key),
            ("idempotency-key", key),
            ("x-fake-chunks", chunks),
            ("x-fake-gap-ms", gap_ms),
            ("content-type", "application/json"),
        ],
        r#"{"stream":true}"#,
    )
    .await
}

/// A response's body read to its end (a 20 s silence fails the test).
async fn read(resp: http::Response<hyper::body::Incoming>) -> BodyRead {
    read_body(resp.into_body(), &[], Duration::from_secs(20)).await
}

/// Five duplicates, on both replicas, follow one live stream: each gets its first byte while the
/// original is still streaming, long before it completes, and every stream is byte-identical.
#[tokio::test]
async fn five_followers_on_two_replicas_receive_the_one_live_stream() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = config(&provider.url(), Some(&redis.url()));
    let (a, b) = (config.start().await, config.start().await);
    // 12 events 250 ms apart: the original streams for ~2.75 s.
    let original = stream(&a.url, "live", "12", "250").await;
    assert!(original.headers().get("idempotent-replayed").is_none());
    let original = tokio::spawn(read(original));
    let mut followers = Vec::new();
    for i in 0..5 {
        let url = if i % 2 == 0 { b.url.clone() } else { a.url.clone() };
        followers.push(tokio::spawn(async move {
            let resp = stream(&url, "live", "12", "250").await;
            assert_eq!(resp.status(), 200);
            assert_eq!(resp.headers()["idempotent-replayed"], "true");
            assert_eq!(resp.headers()["content-type"], "text/event-stream");
            read(resp).await
        }));
    }
    let original = original.await.unwrap();
    assert!(original.clean);
    assert_eq!(String::from_utf8_lossy(&original.bytes), sse_stream_bytes(12));
    let first = original.first_at.unwrap();
    for f in followers {
        let f = f.await.unwrap();
        assert!(f.clean, "a follower ends as the original ends");
        assert_eq!(f.bytes, original.bytes, "byte-identical");
        let got = f.first_at.unwrap();
        // Live, not after the fact: its first byte came while the original was still streaming
        // (an order of events, not a time limit).
        assert!(
            got < original.ended_at,
            "a follower's first byte came after the original ended"
        );
        eprintln!(
            "follower first byte {:?} after the original's",
            got.saturating_duration_since(first)
        );
    }
    assert_eq!(provider.count("live"), 1, "the provider is called once");
    let (pa, pb) = (a.metrics().await, b.metrics().await);
    let followed = |page: &str| {
        metric(
            page,
            r#"rebound_idempotency_requests_total{result="followed",route="fake"}"#,
        )
    };
    assert_eq!(followed(&pa) + followed(&pb), 5.0, "{pa}\n{pb}");
}

/// A client that drops after 3 events and reconnects with the same key gets every event, from
/// byte 0, on the same replica (memory store: the shipped default) or on another one (Redis).
#[tokio::test]
async fn a_client_that_reconnects_mid_stream_gets_every_event() {
    let provider = FakeProvider::start().await;
    let alone = config(&provider.url(), None).start().await;
    reconnect_mid_stream(&provider, "again-local", &alone.url, &alone.url).await;

    let redis = RedisServer::start();
    let config = config(&provider.url(), Some(&redis.url()));
    let (a, b) = (config.start().await, config.start().await);
    reconnect_mid_stream(&provider, "again-remote", &a.url, &b.url).await;
}

async fn reconnect_mid_stream(provider: &FakeProvider, key: &str, first: &str, second: &str) {
    let resp = stream(first, key, "8", "150").await;
    let mut body = resp.into_body();
    let mut got = BytesMut::new();
    while got.windows(2).filter(|w| w == b"\n\n").count() < 3 {
        let frame = body.frame().await.unwrap().unwrap();
        got.extend_from_slice(frame.data_ref().unwrap());
    }
    drop(body);
    let again = stream(second, key, "8", "150").await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again = read(again).await;
    assert!(again.clean);
    assert_eq!(
        String::from_utf8_lossy(&again.bytes),
        sse_stream_bytes(8),
        "every event"
    );
    assert_eq!(provider.count(key), 1, "the provider is called once");
}

/// An original that fails mid-stream aborts its followers too (never a clean end of a cut
/// stream); one whose outcome is not stored releases them, and the first to claim runs itself.
#[tokio::test]
async fn followers_end_as_the_original_ends() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = config(&provider.url(), Some(&redis.url()));
    let (a, b) = (config.start().await, config.start().await);

    provider.script("cut", vec![Step::CutAfterFirstChunk]);
    let original = stream(&a.url, "cut", "8", "200").await;
    let local = tokio::spawn({
        let url = a.url.clone();
        async move { read(stream(&url, "cut", "8", "200").await).await }
    });
    let remote = tokio::spawn({
        let url = b.url.clone();
        async move { read(stream(&url, "cut", "8", "200").await).await }
    });
    let original = read(original).await;
    assert!(!original.clean);
    for f in [local.await.unwrap(), remote.await.unwrap()] {
        assert!(!f.clean, "aborted like the original");
        assert_eq!(f.bytes, original.bytes, "after the bytes the original had");
    }
    assert_eq!(provider.count("cut"), 1);

    // A 400 is not stored: the duplicate waiting for it runs the request itself.
    provider.script("bad", vec![Step::StatusAfter { ms: 300, status: 400 }]);
    let body = r#"{"model":"m"}"#;
    let post = |url: String| async move {
        send(
            "POST",
            &format!("{url}/fake/v1/chat/completions"),
            &[("x-fake-key", "bad"), ("idempotency-key", "bad")],
            body,
        )
        .await
    };
    let original = tokio::spawn(post(a.url.clone()));
    // The original holds the key (it reached the provider) before its duplicate is sent.
    assert!(eventually(Duration::from_secs(10), || provider.count("bad") == 1).await);
    let duplicate = post(b.url.clone()).await;
    assert_eq!(original.await.unwrap().status, 400);
    assert_eq!(duplicate.status, 200, "{}", duplicate.text());
    assert!(duplicate.header("idempotent-replayed").is_none());
    assert_eq!(provider.count("bad"), 2);
}

/// Waits (10 s at most) until the Redis on `port` holds a relay stream with at least `entries`
/// entries; its key.
fn relay_stream(port: u16, entries: usize) -> String {
    use crate::support::redis::query;
    for _ in 0..500 {
        let keys: Vec<String> = query(port, ::redis::cmd("KEYS").arg("*:live:*")).unwrap_or_default();
        for key in keys {
            let n: usize = query(port, ::redis::cmd("XLEN").arg(&key)).unwrap_or(0);
            if n >= entries {
                return key;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no relay stream with {entries} entries");
}

/// The relay stream lost an entry in its middle (a failover to a replica that had not all of
/// it: the owner's later writes land after the gap), and a duplicate comes after: its reader,
/// reading the stream from its start, sees the bytes no longer start where it is and aborts its
/// follower. It never ends clean with a hole in the middle (as it did: it read on to `[DONE]`).
#[tokio::test]
async fn a_follower_whose_relay_lost_an_entry_is_aborted_never_whole_with_a_hole() {
    use crate::support::redis::query;
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = config(&provider.url(), Some(&redis.url()));
    let (a, b) = (Box::pin(config.start()).await, Box::pin(config.start()).await);
    let original = stream(&a.url, "gap", "12", "200").await;
    // A follower on A makes A relay its response (a local follower does not: published
    // follow requests start the relay), then the stream's third entry after the head goes.
    let first = tokio::spawn({
        let url = b.url.clone();
        async move { read(stream(&url, "gap", "12", "200").await).await }
    });
    let port = redis.port;
    tokio::task::spawn_blocking(move || {
        let key = relay_stream(port, 5);
        let entries: Vec<(String, std::collections::HashMap<String, Vec<u8>>)> =
            query(port, ::redis::cmd("XRANGE").arg(&key).arg("-").arg("+")).unwrap();
        let data: Vec<&String> = entries
            .iter()
            .filter(|(_, f)| f.contains_key("d"))
            .map(|(id, _)| id)
            .collect();
        let _: i64 = query(port, ::redis::cmd("XDEL").arg(&key).arg(data[1])).unwrap();
    })
    .await
    .unwrap();
    // A duplicate on a third replica: a new reader, from the stream's start.
    let c = Box::pin(config.start()).await;
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("{}/fake/v1/chat/completions", c.url))
        .header("x-fake-key", "gap")
        .header("idempotency-key", "gap")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            br#"{"stream":true}"#,
        )))
        .unwrap();
    // No response, or one cut short: never a clean end.
    let late = match client().request(req).await {
        Ok(resp) => Some(read(resp).await),
        Err(_) => None,
    };
    let original = read(original).await;
    assert!(original.clean, "the original is not touched");
    assert!(
        first.await.unwrap().clean,
        "the first follower had read the entry before it went"
    );
    if let Some(late) = late {
        assert!(
            !late.clean,
            "a follower missing an entry ends with an abort, never clean: {} of {} bytes",
            late.bytes.len(),
            original.bytes.len()
        );
    }
    assert_eq!(provider.count("gap"), 1);
}
