//! The retry engine through real sockets: what is retried, when, how often, and what the app sees.

use std::time::{Duration, Instant};

use http_body_util::BodyExt;

use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::{chat_completion, sse_chunk};
use crate::support::*;
use rebound::hooks::config::raw::RawRetry;

/// A rebound whose `fake` route uses `[retry.p]`: fast defaults for tests, then `edit`.
async fn with_policy(edit: impl FnOnce(&mut RawRetry)) -> (FakeProvider, Rebound) {
    let provider = FakeProvider::start().await;
    let mut policy = RawRetry {
        max_attempts: Some(3),
        base_delay: some("10ms"),
        max_delay: some("50ms"),
        per_try_timeout: some("1s"),
        first_byte_timeout: some("300ms"),
        deadline: some("10s"),
        ..RawRetry::default()
    };
    edit(&mut policy);
    let rebound = TestConfig::new(&provider.url())
        .retry("p", policy)
        .route(|r| r.retry = some("p"))
        .start()
        .await;
    (provider, rebound)
}

/// One app request per script key: the key is in its body too, so that requests under
/// different keys are different requests (the same body again, failed for good moments ago,
/// would be a client's retry: tests/it/client_retries.rs).
async fn call(rebound: &Rebound, key: &str, headers: &[(&str, &str)]) -> Answer {
    let mut h = vec![("x-fake-key", key), ("content-type", "application/json")];
    h.extend_from_slice(headers);
    send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &h,
        format!(r#"{{"model":"m","n":1,"user":"{key}"}}"#),
    )
    .await
}

#[tokio::test]
async fn transient_failures_are_retried_until_success() {
    let (provider, rebound) = with_policy(|_| {}).await;
    provider.script("k", vec![Step::status(503), Step::status(503)]);
    let a = call(&rebound, "k", &[]).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.text(), chat_completion());
    assert_eq!(a.header("x-rebound-attempts"), Some("3"));
    assert!(
        a.header("x-should-retry").is_none(),
        "a success says nothing about retrying"
    );
    let seen = provider.requests("k");
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter().all(|r| r.body == br#"{"model":"m","n":1,"user":"k"}"#),
        "the body is re-sent identically"
    );
    let page = rebound.metrics().await;
    assert_eq!(
        metric(&page, r#"rebound_retries_total{reason="503",route="fake"}"#),
        2.0,
        "{page}"
    );
    assert_eq!(
        metric(
            &page,
            r#"rebound_upstream_attempts_total{outcome="status_5xx",route="fake",upstream="fake"}"#
        ),
        2.0
    );
    assert_eq!(
        metric(
            &page,
            r#"rebound_retry_wait_seconds_count{route="fake",source="backoff"}"#
        ),
        2.0
    );
}

#[tokio::test]
async fn permanent_failures_are_passed_through_after_one_attempt() {
    let (provider, rebound) = with_policy(|_| {}).await;
    for status in [400u16, 401, 403, 404, 422] {
        let key = format!("p{status}");
        let body = format!(r#"{{"error":{{"message":"provider says {status}"}}}}"#);
        provider.script(
            &key,
            vec![Step::Status {
                status,
                headers: vec![("x-request-id".into(), "req_1".into())],
                body: Some(body.clone()),
            }],
        );
        let a = call(&rebound, &key, &[]).await;
        assert_eq!(a.status, status);
        assert_eq!(a.text(), body);
        assert_eq!(a.header("x-request-id"), Some("req_1"));
        assert_eq!(a.header("x-rebound-attempts"), Some("1"));
        assert_eq!(a.header("x-should-retry"), Some("false"));
        assert_eq!(provider.count(&key), 1, "{status} must not be retried");
    }
}

#[tokio::test]
async fn exhausted_attempts_hand_back_the_last_answer_and_stop_the_sdk() {
    let (provider, rebound) = with_policy(|_| {}).await;
    provider.script(
        "k",
        vec![
            Step::status(503),
            Step::status(502),
            Step::status_with(503, &[("x-last", "yes")]),
        ],
    );
    let a = call(&rebound, "k", &[]).await;
    assert_eq!(a.status, 503);
    assert_eq!(a.header("x-last"), Some("yes"));
    assert_eq!(a.header("x-rebound-attempts"), Some("3"));
    assert_eq!(a.header("x-should-retry"), Some("false"));
    assert_eq!(provider.count("k"), 3);
    let page = rebound.metrics().await;
    assert_eq!(metric(&page, r#"rebound_retries_exhausted_total{route="fake"}"#), 1.0);
}

#[tokio::test]
async fn retry_after_seconds_is_obeyed() {
    let (provider, rebound) = with_policy(|_| {}).await;
    provider.script("k", vec![Step::status_with(429, &[("retry-after", "2")])]);
    let a = call(&rebound, "k", &[]).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("x-rebound-attempts"), Some("2"));
    let gap = provider.gaps("k")[0];
    assert!(gap >= Duration::from_secs(2), "second attempt after {gap:?}");
    let page = rebound.metrics().await;
    assert_eq!(
        metric(
            &page,
            r#"rebound_retry_wait_seconds_count{route="fake",source="retry_after"}"#
        ),
        1.0,
        "{page}"
    );
}

#[tokio::test]
async fn retry_after_http_date_and_ms_are_obeyed() {
    let (provider, rebound) = with_policy(|_| {}).await;
    let date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(3));
    provider.script("date", vec![Step::status_with(503, &[("retry-after", &date)])]);
    provider.script("ms", vec![Step::status_with(429, &[("retry-after-ms", "1200")])]);
    let (a, b) = tokio::join!(call(&rebound, "date", &[]), call(&rebound, "ms", &[]));
    assert_eq!((a.status, b.status), (200.try_into().unwrap(), 200.try_into().unwrap()));
    // The date is measured against the provider's Date header (whole seconds): 2 to 3 s.
    let gap = provider.gaps("date")[0];
    assert!(gap >= Duration::from_millis(1900), "{gap:?}");
    let gap = provider.gaps("ms")[0];
    assert!(gap >= Duration::from_millis(1200), "{gap:?}");
    // Each wait was the header's, not a backoff (how long exactly is the policy's unit tests'
    // business, on an injected clock).
    let page = rebound.metrics().await;
    assert_eq!(
        metric(
            &page,
            r#"rebound_retry_wait_seconds_count{route="fake",source="retry_after"}"#
        ),
        2.0,
        "{page}"
    );
}

#[tokio::test]
async fn retry_after_beyond_the_cap_is_handed_back_at_once() {
    let (provider, rebound) = with_policy(|p| p.max_retry_after = some("60s")).await;
    provider.script("k", vec![Step::status_with(429, &[("retry-after", "120")])]);
    let a = call(&rebound, "k", &[]).await;
    // At once: no wait of any kind was taken (counted, not timed: a slow machine is still slow).
    assert_eq!(waits(&rebound).await, 0.0, "no wait before handing it back");
    assert_eq!(a.status, 429);
    assert_eq!(
        a.header("retry-after"),
        Some("120"),
        "the provider's hint reaches the app intact"
    );
    assert_eq!(a.header("x-should-retry"), Some("false"));
    assert_eq!(a.header("x-rebound-attempts"), Some("1"));
    assert_eq!(provider.count("k"), 1);

    // A hint past the deadline is handed back at once too.
    // (Another credential: the first 429 put this one in cooldown, which would answer first.)
    provider.script("d", vec![Step::status_with(429, &[("retry-after", "5")])]);
    let a = call(
        &rebound,
        "d",
        &[("x-rebound-deadline-ms", "2000"), ("authorization", "Bearer another")],
    )
    .await;
    assert_eq!(a.status, 429);
    assert_eq!(a.header("x-rebound-attempts"), Some("1"), "the provider's 429");
    assert_eq!(provider.count("d"), 1);
    assert_eq!(waits(&rebound).await, 0.0, "no wait before handing it back");
}

/// Every wait the route's retry loop took (backoff and Retry-After).
async fn waits(rebound: &Rebound) -> f64 {
    let page = rebound.metrics().await;
    ["backoff", "retry_after"]
        .iter()
        .map(|source| {
            metric(
                &page,
                &format!(r#"rebound_retry_wait_seconds_count{{route="fake",source="{source}"}}"#),
            )
        })
        .sum()
}

#[tokio::test]
async fn status_500_is_retried_once_only() {
    let (provider, rebound) = with_policy(|p| {
        p.max_attempts = Some(5);
        p.retry_once_on = Some(vec!["500".into()]);
    })
    .await;
    provider.script("k", vec![Step::status(500), Step::status(500), Step::status(500)]);
    let a = call(&rebound, "k", &[]).await;
    assert_eq!(a.status, 500);
    assert_eq!(a.header("x-rebound-attempts"), Some("2"));
    assert_eq!(provider.count("k"), 2);
}

#[tokio::test]
async fn resets_and_stalled_first_bytes_are_retried() {
    let (provider, rebound) = with_policy(|_| {}).await;
    provider.script("reset", vec![Step::Reset]);
    let a = call(&rebound, "reset", &[]).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("x-rebound-attempts"), Some("2"));

    // The head arrived but no body byte within first_byte_timeout: still retryable.
    provider.script("stall", vec![Step::Stall]);
    let started = Instant::now();
    let a = call(&rebound, "stall", &[]).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.text(), chat_completion());
    assert_eq!(a.header("x-rebound-attempts"), Some("2"));
    assert!(started.elapsed() >= Duration::from_millis(300));
    let page = rebound.metrics().await;
    assert_eq!(
        metric(&page, r#"rebound_retries_total{reason="timeout",route="fake"}"#),
        1.0
    );
    assert_eq!(
        metric(&page, r#"rebound_retries_total{reason="reset",route="fake"}"#),
        1.0
    );

    // A slow head past per_try_timeout is a timeout too.
    provider.script("slow", vec![Step::Delay { ms: 1500 }]);
    let a = call(&rebound, "slow", &[]).await;
    assert_eq!(a.status, 200);
    assert_eq!(provider.count("slow"), 2);
}

#[tokio::test]
async fn a_stream_cut_after_its_first_chunk_is_aborted_not_retried() {
    let (provider, rebound) = with_policy(|_| {}).await;
    provider.script("cut", vec![Step::CutAfterFirstChunk]);
    let resp = send_streaming(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[("x-fake-key", "cut")],
        r#"{"stream":true}"#,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, sse_chunk(0).as_bytes());
    let mut aborted = false;
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            aborted = true;
            break;
        }
    }
    assert!(aborted, "the client must see an aborted stream, not a clean end");
    assert_eq!(provider.count("cut"), 1, "bytes reached the client: never retried");
}

#[tokio::test]
async fn stream_idle_timeout_aborts_a_silent_stream() {
    let (provider, rebound) = with_policy(|p| p.stream_idle_timeout = some("300ms")).await;
    provider.script("idle", vec![Step::StallAfterFirstChunk]);
    let resp = send_streaming(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[("x-fake-key", "idle")],
        "{}",
    )
    .await;
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(5), resp.into_body().collect())
        .await
        .unwrap();
    assert!(result.is_err(), "aborted, not ended");
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(provider.count("idle"), 1);
}

#[tokio::test]
async fn safe_only_does_not_replay_a_post_that_may_have_run() {
    let (provider, rebound) = with_policy(|p| {
        p.non_idempotent = some("safe-only");
        p.per_try_timeout = some("300ms");
    })
    .await;
    provider.script("timeout", vec![Step::Delay { ms: 1000 }]);
    let a = call(&rebound, "timeout", &[]).await;
    assert_eq!(a.status, 504);
    assert_eq!(a.header("x-rebound-error"), Some("deadline_exceeded"));
    assert_eq!(a.header("x-should-retry"), Some("false"));
    assert_eq!(provider.count("timeout"), 1);

    provider.script("s503", vec![Step::status(503)]);
    let a = call(&rebound, "s503", &[]).await;
    assert_eq!(a.status, 200);
    assert_eq!(provider.count("s503"), 2, "a 503 was not processed: safe to replay");

    // An idempotent method is replayed whatever happened.
    provider.script("get", vec![Step::Delay { ms: 1000 }]);
    let a = send(
        "GET",
        &format!("{}/fake/echo", rebound.url),
        &[("x-fake-key", "get")],
        "",
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(provider.count("get"), 2);
}

#[tokio::test]
async fn the_deadline_bounds_attempts_and_waits() {
    let (provider, rebound) = with_policy(|p| {
        p.max_attempts = Some(20);
        p.base_delay = some("200ms");
        p.max_delay = some("200ms");
        p.jitter = some("none");
        p.deadline = some("1s");
    })
    .await;
    provider.script("k", (0..20).map(|_| Step::status(503)).collect());
    let a = call(&rebound, "k", &[]).await;
    assert_eq!(a.status, 503);
    assert_eq!(a.header("x-should-retry"), Some("false"));
    // 200 ms apart, an attempt must start before 1 s: at most 5 of the 20 allowed.
    let n = provider.count("k");
    assert!((2..=5).contains(&n), "{n} attempts");

    // Timeouts that run into the deadline end in 504 deadline_exceeded.
    provider.script("slow", (0..5).map(|_| Step::Delay { ms: 800 }).collect());
    let a = call(&rebound, "slow", &[("x-rebound-deadline-ms", "600")]).await;
    assert_eq!(a.status, 504);
    assert_eq!(a.header("x-rebound-error"), Some("deadline_exceeded"));
    assert_eq!(provider.count("slow"), 1, "cut at 600 ms: no second attempt");
}

#[tokio::test]
async fn request_overrides_only_tighten() {
    let (provider, rebound) = with_policy(|_| {}).await;
    provider.script("one", vec![Step::status(503), Step::status(503)]);
    let a = call(&rebound, "one", &[("x-rebound-max-attempts", "1")]).await;
    assert_eq!(a.status, 503);
    assert_eq!(provider.count("one"), 1);
    provider.script("many", vec![Step::status(503); 10]);
    let a = call(&rebound, "many", &[("x-rebound-max-attempts", "10")]).await;
    assert_eq!(a.status, 503);
    assert_eq!(provider.count("many"), 3, "the policy's 3 attempts stay the maximum");
    // The SDK's own timeout caps the deadline: no retrying after the SDK gave up.
    provider.script("sdk", vec![Step::Delay { ms: 2000 }; 3]);
    let a = call(&rebound, "sdk", &[("x-stainless-timeout", "0.5")]).await;
    assert_eq!(a.status, 504);
    assert_eq!(a.header("x-rebound-error"), Some("deadline_exceeded"));
    assert_eq!(provider.count("sdk"), 1);
}

#[tokio::test]
async fn the_budget_caps_retries_under_a_total_outage() {
    // Floor 1/s over the 10 s window = 10 retries, plus 20% of the requests.
    let (provider, rebound) = with_policy(|p| {
        p.budget_ratio = Some(0.2);
        p.budget_min_per_second = Some(1);
    })
    .await;
    provider.script("down", vec![Step::status(503); 1000]);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..100 {
        let url = rebound.url.clone();
        set.spawn(async move {
            tokio::time::sleep(Duration::from_millis(i)).await;
            send(
                "POST",
                &format!("{url}/fake/v1/chat/completions"),
                &[("x-fake-key", "down")],
                format!(r#"{{"n":{i}}}"#),
            )
            .await
            .status
        });
    }
    while let Some(status) = set.join_next().await {
        assert_eq!(status.unwrap(), 503);
    }
    let attempts = provider.count("down");
    let retries = attempts - 100;
    assert!(retries <= 10 + 20, "{retries} retries for 100 requests");
    assert!(retries >= 10, "the floor allows at least 10: {retries}");
    let page = rebound.metrics().await;
    let refused = metric(&page, r#"rebound_retry_budget_exhausted_total{route="fake"}"#);
    assert!(refused >= 50.0, "{refused}");
    // Without the budget the same load would have made 300 attempts.
}

#[tokio::test]
async fn sdk_retries_spend_the_budget() {
    let (provider, rebound) = with_policy(|p| {
        p.budget_ratio = Some(0.0);
        p.budget_min_per_second = Some(1);
    })
    .await;
    // 10 requests that are themselves SDK retries use up the floor (10 per window)...
    for _ in 0..10 {
        call(&rebound, "ok", &[("x-stainless-retry-count", "1")]).await;
    }
    // ...so a failure now is not retried by rebound.
    provider.script("k", vec![Step::status(503)]);
    let a = call(&rebound, "k", &[]).await;
    assert_eq!(a.status, 503);
    assert_eq!(provider.count("k"), 1);
}

#[tokio::test]
async fn concurrent_retries_are_spread_not_in_lockstep() {
    let (provider, rebound) = with_policy(|p| {
        p.base_delay = some("400ms");
        p.max_delay = some("400ms");
        p.jitter = some("full");
    })
    .await;
    let keys: Vec<String> = (0..50).map(|i| format!("j{i}")).collect();
    for k in &keys {
        provider.script(k, vec![Step::status(503)]);
    }
    let mut set = tokio::task::JoinSet::new();
    for k in keys.clone() {
        let url = rebound.url.clone();
        set.spawn(async move {
            send(
                "POST",
                &format!("{url}/fake/v1/chat/completions"),
                &[("x-fake-key", &k)],
                "{}",
            )
            .await
            .status
        });
    }
    while let Some(s) = set.join_next().await {
        assert_eq!(s.unwrap(), 200);
    }
    let mut waits: Vec<f64> = keys
        .iter()
        .map(|k| provider.gaps(k)[0].as_secs_f64() * 1000.0)
        .collect();
    waits.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let (min, max) = (waits[0], waits[waits.len() - 1]);
    // Full jitter over [0, 400 ms]: the 50 retries cover most of it; lockstep would put them
    // all within a few ms of each other.
    assert!(max - min > 200.0, "retries in lockstep: {waits:?}");
    let distinct_buckets = waits
        .iter()
        .map(|w| (*w / 50.0) as u32)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    assert!(distinct_buckets >= 5, "{waits:?}");
}

#[tokio::test]
async fn routes_without_a_policy_make_one_attempt_and_leave_the_sdk_in_charge() {
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url()).start().await;
    provider.script("k", vec![Step::status(503)]);
    let a = call(&rebound, "k", &[]).await;
    assert_eq!(a.status, 503);
    assert_eq!(provider.count("k"), 1);
    assert_eq!(a.header("x-rebound-attempts"), Some("1"));
    assert!(a.header("x-should-retry").is_none());
}
