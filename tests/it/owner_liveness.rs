//! When the replica that owns a live generation dies, the fleet learns it within
//! `[redis] liveness` (1.5 s) plus a look, not the lease (30 s). Two real rebound processes on the
//! shipped config file (only the provider URL, the listeners and `[redis] url` replaced), one Redis,
//! the fake provider; the owner is SIGKILLed mid-stream.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use http_body_util::BodyExt as _;

use crate::support::fake_provider::sse_stream_bytes;
use crate::support::redis::RedisServer;
use crate::support::shipped;
use crate::support::sidecar::ReboundProcess;
use crate::support::*;

const PATH: &str = "/openai/v1/chat/completions";
/// A hang guard, not a speed target: more than 6 x the shipped `liveness` (1.5 s) and a third of
/// the 30 s lease it rules out. What ended a wait is told by what it left (an abort, a takeover
/// counted, the provider's calls); how long it took is printed (about 1.5 s here).
const GUARD: Duration = Duration::from_secs(10);

/// A keyed streamed chat completion to `base`: `chunks` events `gap_ms` apart (headers the
/// fingerprint does not cover: a retry may ask for a faster stream of the same request).
async fn stream(base: &str, key: &str, chunks: &str, gap_ms: &str) -> http::Response<hyper::body::Incoming> {
    send_streaming_within(
        Duration::from_secs(60),
        "POST",
        &format!("{base}{PATH}"),
        &[
            ("x-fake-key", key),
            ("idempotency-key", key),
            ("x-fake-chunks", chunks),
            ("x-fake-gap-ms", gap_ms),
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-test"),
        ],
        r#"{"model":"m","stream":true}"#,
    )
    .await
}

/// A body read to its end after the bytes `got` already (a 60 s silence fails the test).
async fn read(body: hyper::body::Incoming, got: BytesMut) -> BodyRead {
    read_body(body, &got, Duration::from_secs(60)).await
}

/// The first data frame of a response (it is live).
async fn first_bytes(body: &mut hyper::body::Incoming) -> BytesMut {
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(20), body.frame())
            .await
            .expect("a first frame within 20 s")
            .expect("not the end")
            .expect("not an error");
        if let Ok(data) = frame.into_data() {
            if !data.is_empty() {
                return BytesMut::from(&data[..]);
            }
        }
    }
}

async fn replicas(edits: &[(&str, &str)]) -> (RedisServer, FakeProvider, ReboundProcess, ReboundProcess) {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let toml = shipped::with_redis(&provider.url(), &redis.url(), edits);
    let a = ReboundProcess::start(&toml, &[]).await;
    let b = ReboundProcess::start(&toml, &[]).await;
    // A replica takes others for dead only once its own heartbeats have landed for a whole
    // `liveness` (1.5 s, shipped default): B is given that before the tests kill A.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    (redis, provider, a, b)
}

async fn kill(p: &mut ReboundProcess) -> Instant {
    p.child.start_kill().unwrap();
    let _ = p.child.wait().await;
    Instant::now()
}

async fn takeovers(p: &ReboundProcess) -> f64 {
    let page = send("GET", &format!("{}/metrics", p.admin), &[], "").await.text();
    metric(&page, r#"rebound_idempotency_takeovers_total{route="openai"}"#)
}

/// `on_concurrent = "follow"` (shipped): a stream runs on A, a duplicate follows it on B, another
/// duplicate comes to B 0.5 s after A is SIGKILLed. Both followers end with an abort about 1.5 s
/// after the kill (the liveness, not the 30 s lease); a retry 3.5 s after the kill gets a whole
/// fresh answer at once; the provider saw 2 calls (the first was lost with its replica); the key
/// is then completed and replayed, blocked nowhere.
#[tokio::test]
async fn a_dead_owners_followers_abort_and_its_key_runs_again_at_once() {
    let (_redis, provider, mut a, b) = replicas(&[]).await;
    let key = "owner-dies";
    // 60 events 250 ms apart: the original streams for 15 s.
    let original = stream(&a.proxy, key, "60", "250").await;
    assert_eq!(original.status(), 200);
    let mut original = original.into_body();
    first_bytes(&mut original).await;

    let follower = stream(&b.proxy, key, "60", "250").await;
    assert_eq!(follower.status(), 200);
    assert_eq!(follower.headers()["idempotent-replayed"], "true", "a follower");
    let mut follower = follower.into_body();
    let got = first_bytes(&mut follower).await;
    let follower = tokio::spawn(read(follower, got));

    let killed_at = kill(&mut a).await;
    drop(original);
    // The duplicate of the bug report: sent to B 0.5 s after the kill.
    tokio::time::sleep_until((killed_at + Duration::from_millis(500)).into()).await;
    let early = stream(&b.proxy, key, "60", "250").await;
    assert_eq!(early.status(), 200);
    let early = tokio::spawn(read(early.into_body(), BytesMut::new()));

    for (name, f) in [("follower", follower), ("retry at +0.5 s", early)] {
        let f = tokio::time::timeout_at((killed_at + GUARD).into(), f)
            .await
            .unwrap_or_else(|_| panic!("{name}: still following {GUARD:?} after the kill"))
            .unwrap();
        let after = f.ended_at - killed_at;
        eprintln!("{name}: ended {after:?} after the kill, clean {}", f.clean);
        assert!(!f.clean, "{name}: a visible abort, never a clean end");
        assert!(!f.bytes.is_empty(), "{name}: it had the start of the stream");
    }

    // A retry 3.5 s after the kill: a fresh generation whose first byte comes at once.
    tokio::time::sleep_until((killed_at + Duration::from_millis(3500)).into()).await;
    let sent = Instant::now();
    let retry = tokio::time::timeout(GUARD, stream(&b.proxy, key, "5", "0"))
        .await
        .expect("the retry was held: the dead owner's lease still counted");
    assert_eq!(retry.status(), 200);
    assert!(retry.headers().get("idempotent-replayed").is_none(), "a fresh run");
    assert_eq!(retry.headers()["x-rebound-attempts"], "1");
    let retry = read(retry.into_body(), BytesMut::new()).await;
    assert!(retry.clean);
    assert_eq!(String::from_utf8_lossy(&retry.bytes), sse_stream_bytes(5));
    let first = retry.first_at.unwrap() - sent;
    eprintln!("retry at +3.5 s: first byte {first:?} after it was sent");
    assert_eq!(provider.count(key), 2, "the lost original, and the retry");
    assert_eq!(takeovers(&b).await, 1.0);

    // No key stays blocked: the retry's answer is stored and replayed.
    let again = send_within(
        Duration::from_secs(10),
        "POST",
        &format!("{}{PATH}", b.proxy),
        &[
            ("x-fake-key", key),
            ("idempotency-key", key),
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-test"),
        ],
        r#"{"model":"m","stream":true}"#,
    )
    .await;
    assert_eq!(again.status, 200);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.text(), sse_stream_bytes(5));
    assert_eq!(provider.count(key), 2);
}

/// `on_concurrent = "wait"`: a duplicate held on B while the original runs on A learns of A's
/// death about 1.5 s after the kill, takes the key over and runs the request itself: a whole answer,
/// the provider's second call.
#[tokio::test]
async fn a_waiting_duplicate_takes_a_dead_owners_key_over() {
    let (_redis, provider, mut a, b) = replicas(&[("idempotency.llm.on_concurrent", "wait")]).await;
    let key = "owner-dies-wait";
    let original = stream(&a.proxy, key, "60", "250").await;
    assert_eq!(original.status(), 200);
    let mut original = original.into_body();
    first_bytes(&mut original).await;

    let b_url = b.proxy.clone();
    let waiting = tokio::spawn(async move {
        let resp = stream(&b_url, key, "5", "0").await;
        let head_at = Instant::now();
        let status = resp.status();
        let replayed = resp.headers().get("idempotent-replayed").is_some();
        (status, replayed, head_at, read(resp.into_body(), BytesMut::new()).await)
    });
    // The duplicate reached B; that it was held is shown below: its answer came after the kill,
    // from the provider's second call.
    let b_metrics = format!("{}/metrics", b.admin);
    until("the duplicate is in flight on B", Duration::from_secs(10), || async {
        let page = get(&b_metrics).await.text();
        match metric(&page, "rebound_inflight_requests") {
            n if n >= 1.0 => Ok(()),
            n => Err(format!("{n} in flight")),
        }
    })
    .await;
    assert_eq!(provider.count(key), 1);

    let killed_at = kill(&mut a).await;
    drop(original);
    let (status, replayed, head_at, body) = tokio::time::timeout_at((killed_at + GUARD).into(), waiting)
        .await
        .expect("still waiting on the dead owner's key")
        .unwrap();
    assert!(head_at > killed_at, "held while the original ran");
    let after = head_at - killed_at;
    eprintln!("waiting duplicate: answered {after:?} after the kill");
    assert_eq!(status, 200);
    assert!(!replayed, "it ran the request itself");
    assert!(body.clean);
    assert_eq!(String::from_utf8_lossy(&body.bytes), sse_stream_bytes(5));
    assert_eq!(provider.count(key), 2);
    assert_eq!(takeovers(&b).await, 1.0);
}

/// A replica that is alive keeps its keys however long its generation is silent: a duplicate
/// on another replica follows it (the liveness record, not the stream's bytes, is what counts),
/// and no key is taken over.
#[tokio::test]
async fn a_live_owners_silent_stream_is_never_taken_for_dead() {
    let (_redis, provider, a, b) = replicas(&[]).await;
    let key = "owner-thinks";
    provider.script(key, vec![Step::PauseAfterFirst { ms: 6_000 }]);
    let original = stream(&a.proxy, key, "3", "0").await;
    let mut original = original.into_body();
    let got = first_bytes(&mut original).await;
    let original = tokio::spawn(read(original, got));
    let follower = stream(&b.proxy, key, "3", "0").await;
    assert_eq!(follower.headers()["idempotent-replayed"], "true");
    let follower = read(follower.into_body(), BytesMut::new()).await;
    let original = original.await.unwrap();
    assert!(original.clean && follower.clean, "both whole after a 6 s silence");
    assert_eq!(follower.bytes, original.bytes);
    assert_eq!(String::from_utf8_lossy(&original.bytes), sse_stream_bytes(3));
    assert_eq!(provider.count(key), 1);
    assert_eq!(takeovers(&b).await, 0.0);
    assert_eq!(takeovers(&a).await, 0.0);
}
