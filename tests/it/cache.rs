//! The response cache through real sockets: hit, miss, refresh, bypass, max-age, TTL,
//! scopes, streams, size and status limits, coalesced misses across replicas, Redis down,
//! idempotency keys on the same route.

use std::time::Duration;

use rebound::hooks::config::raw::RawCache;

use crate::support::config_builder::{some, TestConfig};
use crate::support::redis::RedisServer;
use crate::support::*;

const CHAT: &str = r#"{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}"#;

fn cached(provider: &FakeProvider, policy: RawCache) -> TestConfig {
    TestConfig::new(&provider.url()).cache("llm", policy)
}

async fn ask(rebound: &Rebound, fake_key: &str, extra: &[(&str, &str)], body: &str) -> Answer {
    let mut headers = vec![
        ("x-fake-key", fake_key),
        ("content-type", "application/json"),
        ("authorization", "Bearer sk-tenant-a"),
    ];
    headers.extend_from_slice(extra);
    send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &headers,
        body.to_string(),
    )
    .await
}

fn cache_result(a: &Answer) -> &str {
    a.header("x-rebound-cache").unwrap_or("-")
}

async fn results(rebound: &Rebound) -> [f64; 5] {
    let page = rebound.metrics().await;
    ["hit", "miss", "refresh", "bypass", "store_error"].map(|r| {
        metric(
            &page,
            &format!(r#"rebound_cache_requests_total{{result="{r}",route="fake"}}"#),
        )
    })
}

#[tokio::test]
async fn a_repeat_is_a_hit_with_no_upstream_call_and_the_same_json_in_another_order_too() {
    let provider = FakeProvider::start().await;
    let rebound = cached(&provider, RawCache::default()).start().await;
    let first = ask(&rebound, "k", &[], CHAT).await;
    assert_eq!((first.status.as_u16(), cache_result(&first)), (200, "miss"));
    let second = ask(&rebound, "k", &[], CHAT).await;
    assert_eq!((second.status.as_u16(), cache_result(&second)), (200, "hit"));
    assert_eq!(second.header("age"), Some("0"));
    assert_eq!(second.header("x-rebound-attempts"), Some("0"));
    assert_eq!(second.body, first.body);
    assert_eq!(second.header("content-type"), first.header("content-type"));
    // The same JSON with its keys in another order and other whitespace: the same request.
    let reordered = r#"{ "messages": [{"content": "hi", "role": "user"}],
        "model": "gpt-4o-mini" }"#;
    assert_eq!(cache_result(&ask(&rebound, "k", &[], reordered).await), "hit");
    // Another body is another request.
    let other = CHAT.replace("hi", "hello");
    assert_eq!(cache_result(&ask(&rebound, "k", &[], &other).await), "miss");
    assert_eq!(provider.count("k"), 2, "one call per distinct request");
    assert_eq!(results(&rebound).await, [2.0, 2.0, 0.0, 0.0, 0.0]);
    // The stored response's usage (12 input, 96 output tokens), counted on each of the 2 hits.
    let page = rebound.metrics().await;
    let saved = |kind: &str| {
        metric(
            &page,
            &format!(r#"rebound_cache_tokens_saved_total{{kind="{kind}",model="other",route="fake"}}"#),
        )
    };
    assert!(saved("input") > 0.0 && saved("output") > 0.0, "{page}");
    assert_eq!(saved("output") % 2.0, 0.0, "the same usage per hit");
    assert_eq!(metric(&page, "rebound_cache_entries"), 2.0);
    assert!(metric(&page, "rebound_cache_bytes") >= first.body.len() as f64);
}

#[tokio::test]
async fn no_cache_refreshes_no_store_bypasses_and_max_age_takes_only_young_entries() {
    let provider = FakeProvider::start().await;
    let rebound = cached(&provider, RawCache::default()).start().await;
    let no_store = [("cache-control", "no-store")];
    assert_eq!(cache_result(&ask(&rebound, "k", &no_store, CHAT).await), "bypass");
    assert_eq!(
        cache_result(&ask(&rebound, "k", &[], CHAT).await),
        "miss",
        "no-store kept nothing"
    );
    assert_eq!(
        cache_result(&ask(&rebound, "k", &no_store, CHAT).await),
        "bypass",
        "nor used it"
    );
    assert_eq!(provider.count("k"), 3);

    let refreshed = ask(&rebound, "k", &[("cache-control", "no-cache")], CHAT).await;
    assert_eq!((refreshed.status.as_u16(), cache_result(&refreshed)), (200, "refresh"));
    assert_eq!(provider.count("k"), 4);
    assert_eq!(
        cache_result(&ask(&rebound, "k", &[], CHAT).await),
        "hit",
        "the refresh was stored"
    );

    let young = [("cache-control", "max-age=60")];
    assert_eq!(cache_result(&ask(&rebound, "k", &young, CHAT).await), "hit");
    // Once the entry is a whole second old, max-age=0 no longer takes it: called again, replaced.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let aged = ask(&rebound, "k", &[], CHAT).await;
    assert_eq!((cache_result(&aged), aged.header("age")), ("hit", Some("1")));
    let stale = ask(&rebound, "k", &[("cache-control", "max-age=0")], CHAT).await;
    assert_eq!(cache_result(&stale), "refresh");
    assert_eq!(provider.count("k"), 5);
    let fresh = ask(&rebound, "k", &[("cache-control", "max-age=0")], CHAT).await;
    assert_eq!((cache_result(&fresh), fresh.header("age")), ("hit", Some("0")));
    assert_eq!(results(&rebound).await, [4.0, 1.0, 2.0, 2.0, 0.0]);
}

#[tokio::test]
async fn entries_expire_after_their_ttl() {
    let provider = FakeProvider::start().await;
    let policy = RawCache {
        ttl: some("1s"),
        ..RawCache::default()
    };
    let rebound = cached(&provider, policy).start().await;
    assert_eq!(cache_result(&ask(&rebound, "k", &[], CHAT).await), "miss");
    assert_eq!(cache_result(&ask(&rebound, "k", &[], CHAT).await), "hit");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(cache_result(&ask(&rebound, "k", &[], CHAT).await), "miss");
    assert_eq!(provider.count("k"), 2);
}

#[tokio::test]
async fn two_credentials_never_share_an_entry() {
    let provider = FakeProvider::start().await;
    let rebound = cached(&provider, RawCache::default()).start().await;
    let b = [("authorization", "Bearer sk-tenant-b")];
    assert_eq!(cache_result(&ask(&rebound, "k", &[], CHAT).await), "miss");
    // `send` appends: the request carries tenant b's key instead when it is the only one.
    let as_b = send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[("x-fake-key", "k"), ("content-type", "application/json"), b[0]],
        CHAT,
    )
    .await;
    assert_eq!(cache_result(&as_b), "miss", "another key's answer is never served");
    let anonymous = send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[("x-fake-key", "k"), ("content-type", "application/json")],
        CHAT,
    )
    .await;
    assert_eq!(cache_result(&anonymous), "miss");
    assert_eq!(cache_result(&ask(&rebound, "k", &[], CHAT).await), "hit");
    assert_eq!(provider.count("k"), 3);
}

#[tokio::test]
async fn a_stream_hit_is_the_same_bytes_as_the_original_stream() {
    let provider = FakeProvider::start().await;
    let rebound = cached(&provider, RawCache::default()).start().await;
    let streamed = r#"{"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "hi"}]}"#;
    let first = ask(&rebound, "s", &[("x-fake-chunks", "8")], streamed).await;
    assert_eq!(cache_result(&first), "miss");
    assert!(first.header("content-type").unwrap().starts_with("text/event-stream"));
    assert!(first.text().matches("data: ").count() >= 8, "{}", first.text());
    let second = ask(&rebound, "s", &[("x-fake-chunks", "8")], streamed).await;
    assert_eq!(cache_result(&second), "hit");
    assert_eq!(second.header("content-type"), first.header("content-type"));
    assert_eq!(second.body, first.body, "byte for byte");
    assert_eq!(provider.count("s"), 1);
}

#[tokio::test]
async fn what_is_too_large_or_not_a_kept_status_is_passed_through_and_not_stored() {
    let provider = FakeProvider::start().await;
    let policy = RawCache {
        max_entry_size: some("512B"),
        ..RawCache::default()
    };
    let rebound = cached(&provider, policy).start().await;
    let big = ask(&rebound, "big", &[], CHAT).await;
    assert!(big.body.len() > 512, "the fake's answer is {} bytes", big.body.len());
    assert_eq!((big.status.as_u16(), cache_result(&big)), (200, "miss"));
    assert_eq!(cache_result(&ask(&rebound, "big", &[], CHAT).await), "miss");
    assert_eq!(provider.count("big"), 2);

    let rebound = cached(&provider, RawCache::default()).start().await;
    provider.script("err", vec![Step::status(400)]);
    let refused = ask(&rebound, "err", &[], CHAT).await;
    assert_eq!((refused.status.as_u16(), cache_result(&refused)), (400, "miss"));
    let again = ask(&rebound, "err", &[], CHAT).await;
    assert_eq!(
        (again.status.as_u16(), cache_result(&again)),
        (200, "miss"),
        "a 400 is not kept"
    );
    assert_eq!(cache_result(&ask(&rebound, "err", &[], CHAT).await), "hit");
    assert_eq!(provider.count("err"), 2);
}

/// 50 identical requests at once, 25 on each of two replicas sharing one Redis: one provider
/// call, 50 identical bodies; one miss, 49 hits (followers of the original, here or through
/// Redis, or the stored entry).
#[tokio::test]
async fn fifty_concurrent_identical_misses_on_two_replicas_make_one_upstream_call() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = cached(&provider, RawCache::default()).redis(&redis.url());
    let (a, b) = (config.start().await, config.start().await);
    provider.script("herd", vec![Step::Delay { ms: 400 }]);
    let mut calls = Vec::new();
    for i in 0..50 {
        let url = if i % 2 == 0 { a.url.clone() } else { b.url.clone() };
        calls.push(tokio::spawn(async move {
            send(
                "POST",
                &format!("{url}/fake/v1/chat/completions"),
                &[
                    ("x-fake-key", "herd"),
                    ("content-type", "application/json"),
                    ("authorization", "Bearer sk-tenant-a"),
                ],
                CHAT,
            )
            .await
        }));
    }
    let mut answers = Vec::new();
    for c in calls {
        answers.push(c.await.unwrap());
    }
    assert_eq!(provider.count("herd"), 1, "one upstream call for 50 identical requests");
    assert!(answers.iter().all(|x| x.status == 200 && x.body == answers[0].body));
    let misses = answers.iter().filter(|x| cache_result(x) == "miss").count();
    let hits = answers.iter().filter(|x| cache_result(x) == "hit").count();
    assert_eq!((misses, hits), (1, 49));
    let (ra, rb) = (results(&a).await, results(&b).await);
    assert_eq!((ra[0] + rb[0], ra[1] + rb[1]), (49.0, 1.0));
    // Every hit, follower or stored, counts the answer's usage as saved.
    let output = answers[0].json()["usage"]["completion_tokens"].as_f64().unwrap();
    let saved = r#"rebound_cache_tokens_saved_total{kind="output",model="other",route="fake"}"#;
    let total = metric(&a.metrics().await, saved) + metric(&b.metrics().await, saved);
    assert_eq!(total, 49.0 * output);
}

#[tokio::test]
async fn redis_down_the_cache_fails_open_and_counts_it() {
    let provider = FakeProvider::start().await;
    let rebound = cached(&provider, RawCache::default())
        .redis(&RedisServer::unused_url())
        .start()
        .await;
    for _ in 0..2 {
        let a = ask(&rebound, "down", &[], CHAT).await;
        assert_eq!((a.status.as_u16(), cache_result(&a)), (200, "miss"));
    }
    assert_eq!(provider.count("down"), 2);
    assert_eq!(results(&rebound).await, [0.0, 0.0, 0.0, 0.0, 2.0]);
}

/// With idempotency on the same route, a fresh key is answered from the cache and that answer
/// becomes the key's: the key still means one generation (here none), and replays it.
#[tokio::test]
async fn a_fresh_idempotency_key_answered_from_the_cache_keeps_that_answer() {
    let provider = FakeProvider::start().await;
    let rebound = cached(&provider, RawCache::default())
        .idempotency("idem", Default::default())
        .route(|r| r.idempotency = some("idem"))
        .start()
        .await;
    let first = ask(&rebound, "i", &[], CHAT).await;
    assert_eq!(cache_result(&first), "miss");
    let keyed = ask(&rebound, "i", &[("idempotency-key", "order-1")], CHAT).await;
    assert_eq!((cache_result(&keyed), keyed.body.clone()), ("hit", first.body.clone()));
    let replay = ask(
        &rebound,
        "i",
        &[("idempotency-key", "order-1"), ("cache-control", "no-store")],
        CHAT,
    )
    .await;
    assert_eq!(
        replay.header("idempotent-replayed"),
        Some("true"),
        "the key's stored answer"
    );
    assert_eq!(replay.body, first.body);
    assert_eq!(provider.count("i"), 1);
}

/// What the followers of an original whose answer is not kept get: that same answer, as it was
/// produced (one provider call); the next request is a miss.
#[tokio::test]
async fn followers_of_an_answer_that_is_not_kept_get_it_too() {
    let provider = FakeProvider::start().await;
    let rebound = cached(&provider, RawCache::default()).start().await;
    provider.script("bad", vec![Step::StatusAfter { ms: 400, status: 400 }]);
    let mut calls = Vec::new();
    for _ in 0..5 {
        let url = rebound.url.clone();
        calls.push(tokio::spawn(async move {
            send(
                "POST",
                &format!("{url}/fake/v1/chat/completions"),
                &[("x-fake-key", "bad"), ("content-type", "application/json")],
                CHAT,
            )
            .await
        }));
    }
    let mut answers = Vec::new();
    for c in calls {
        answers.push(c.await.unwrap());
    }
    let seen: Vec<_> = answers
        .iter()
        .map(|a| (a.status.as_u16(), cache_result(a).to_string()))
        .collect();
    assert!(
        answers.iter().all(|a| a.status == 400 && a.body == answers[0].body),
        "{seen:?}"
    );
    assert_eq!(provider.count("bad"), 1, "the followers did not call again");
    let next = ask(&rebound, "bad", &[], CHAT).await;
    assert_eq!(
        (next.status.as_u16(), cache_result(&next)),
        (200, "miss"),
        "the 400 was not kept"
    );
}

/// An async job's run goes through the route's pipeline: answered from the cache when it can be.
#[tokio::test]
async fn an_async_job_is_answered_from_the_cache() {
    let provider = FakeProvider::start().await;
    let rebound = cached(&provider, RawCache::default())
        .route(|r| r.async_jobs = Some(true))
        .start()
        .await;
    let sync = ask(&rebound, "job", &[], CHAT).await;
    assert_eq!(cache_result(&sync), "miss");
    let queued = ask(&rebound, "job", &[("prefer", "respond-async")], CHAT).await;
    assert_eq!(queued.status, 202, "{}", queued.text());
    let id = queued.json()["job_id"].as_str().unwrap().to_string();
    let url = format!("{}/jobs/{id}", rebound.url);
    let status = until("the job finishes", Duration::from_secs(10), || async {
        let status = send("GET", &url, &[("authorization", "Bearer sk-tenant-a")], "")
            .await
            .json();
        match status["status"] == "succeeded" || status["status"] == "failed" {
            true => Ok(status),
            false => Err(status.to_string()),
        }
    })
    .await;
    assert_eq!(status["status"], "succeeded", "{status}");
    assert_eq!(status["attempts"], 0, "{status}");
    let url = format!("{}/jobs/{id}/result", rebound.url);
    let result = send("GET", &url, &[("authorization", "Bearer sk-tenant-a")], "").await;
    assert_eq!((result.status.as_u16(), result.body.clone()), (200, sync.body));
    assert_eq!(provider.count("job"), 1);
}

/// With capacity routing: a miss is routed (here it fails over from a target that answers 429 to
/// the next), the answer is stored; a hit calls no target at all.
#[tokio::test]
async fn a_hit_calls_no_target_of_a_route_with_several() {
    use rebound::hooks::config::raw::RawTarget;
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let target = |upstream: &str| RawTarget {
        upstream: some(upstream),
        ..RawTarget::default()
    };
    let rebound = cached(&a, RawCache::default())
        .upstream_named("a", &a.url(), |_| {})
        .upstream_named("b", &b.url(), |_| {})
        .route(|r| {
            r.upstream = None;
            r.targets = Some(vec![target("a"), target("b")]);
        })
        .start()
        .await;
    a.script("t", vec![Step::status_with(429, &[("retry-after", "30")])]);
    let miss = ask(&rebound, "t", &[], CHAT).await;
    assert_eq!((miss.status.as_u16(), cache_result(&miss)), (200, "miss"));
    assert_eq!(miss.header("x-rebound-upstream"), Some("b"));
    assert_eq!(miss.header("x-rebound-failovers"), Some("1"));
    let hit = ask(&rebound, "t", &[], CHAT).await;
    assert_eq!((hit.status.as_u16(), cache_result(&hit)), (200, "hit"));
    assert_eq!(hit.header("x-rebound-failovers"), None, "no target was tried");
    assert_eq!((a.count("t"), b.count("t")), (1, 1));
}
