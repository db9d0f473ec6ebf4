//! A client's own retry on top of rebound's (issue 48): a request that repeats one that failed
//! for good moments ago gets one attempt, so provider calls grow as the sum of the layers, not
//! their product; failures for good say when to try again.

use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::{FakeProvider, Step};
use crate::support::*;
use rebound::hooks::config::raw::{RawCircuit, RawRetry};

const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

fn policy() -> RawRetry {
    RawRetry {
        max_attempts: Some(3),
        base_delay: some("10ms"),
        max_delay: some("20ms"),
        max_retry_after: some("5s"),
        budget_min_per_second: Some(1000),
        ..RawRetry::default()
    }
}

async fn start(provider: &FakeProvider) -> Rebound {
    TestConfig::new(&provider.url())
        .retry("p", policy())
        .route(|r| r.retry = some("p"))
        .start()
        .await
}

/// The app's call as a client makes it, and each of its own retries: the same bytes, the same
/// credential.
async fn call(rebound: &Rebound, key: &str, credential: &str, body: &str) -> Answer {
    let auth = format!("Bearer {credential}");
    let h = [
        ("x-fake-key", key),
        ("content-type", "application/json"),
        ("authorization", auth.as_str()),
    ];
    send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &h,
        body.to_string(),
    )
    .await
}

fn client_retries(page: &str) -> f64 {
    metric(page, r#"rebound_client_retries_total{route="fake"}"#)
}

#[tokio::test]
async fn a_clients_retries_of_a_failure_for_good_add_one_call_each() {
    let provider = FakeProvider::start().await;
    let rebound = start(&provider).await;
    provider.script("down", vec![Step::status(503); 100]);
    let first = call(&rebound, "down", "sk-a", BODY).await;
    assert_eq!(first.status, 503);
    assert_eq!(first.header("x-rebound-attempts"), Some("3"));
    assert_eq!(first.header("x-should-retry"), Some("false"));
    assert_eq!(provider.count("down"), 3);
    // A client that ignores x-should-retry tries twice more (the Vercel AI SDK's default):
    // one call each, not three.
    for n in 1..=2 {
        let again = call(&rebound, "down", "sk-a", BODY).await;
        assert_eq!(again.status, 503);
        assert_eq!(again.header("x-rebound-attempts"), Some("1"));
        assert_eq!(provider.count("down"), 3 + n);
    }
    assert_eq!(client_retries(&rebound.metrics().await), 2.0);
}

#[tokio::test]
async fn another_request_or_another_credential_is_not_a_retry() {
    let provider = FakeProvider::start().await;
    let rebound = start(&provider).await;
    provider.script("down", vec![Step::status(503); 100]);
    assert_eq!(call(&rebound, "down", "sk-a", BODY).await.status, 503);
    assert_eq!(provider.count("down"), 3);
    // Another tenant's identical request: its own set of attempts.
    assert_eq!(call(&rebound, "down", "sk-b", BODY).await.status, 503);
    assert_eq!(provider.count("down"), 6);
    // The same tenant's other request: its own set too.
    let other = BODY.replace("hi", "hello");
    assert_eq!(call(&rebound, "down", "sk-a", &other).await.status, 503);
    assert_eq!(provider.count("down"), 9);
    assert_eq!(client_retries(&rebound.metrics().await), 0.0);
}

#[tokio::test]
async fn a_retry_that_gets_through_makes_the_next_call_a_new_request() {
    let provider = FakeProvider::start().await;
    let rebound = start(&provider).await;
    // Three failures (the first request), then an answer (the client's retry), then three
    // failures again: the same call made later is a new request with every attempt.
    let mut steps = vec![Step::status(503); 3];
    steps.push(Step::status(200));
    steps.extend(vec![Step::status(503); 2]);
    provider.script("blip", steps);
    assert_eq!(call(&rebound, "blip", "sk-a", BODY).await.status, 503);
    let retried = call(&rebound, "blip", "sk-a", BODY).await;
    assert_eq!(retried.status, 200);
    assert_eq!(provider.count("blip"), 4);
    let later = call(&rebound, "blip", "sk-a", BODY).await;
    assert_eq!(later.status, 200, "two failures, then the third attempt answers");
    assert_eq!(later.header("x-rebound-attempts"), Some("3"));
    assert_eq!(provider.count("blip"), 7);
}

#[tokio::test]
async fn a_permanent_error_is_not_a_failure_for_good_to_remember() {
    let provider = FakeProvider::start().await;
    let rebound = start(&provider).await;
    provider.script("bad", vec![Step::status(400), Step::status(503), Step::status(503)]);
    assert_eq!(call(&rebound, "bad", "sk-a", BODY).await.status, 400);
    // Not a retry of a failure for good: the 503s are retried, the third attempt answers.
    let next = call(&rebound, "bad", "sk-a", BODY).await;
    assert_eq!(next.status, 200);
    assert_eq!(next.header("x-rebound-attempts"), Some("3"));
}

#[tokio::test]
async fn a_failure_for_good_says_when_the_provider_said_to_try_again() {
    let provider = FakeProvider::start().await;
    let rebound = start(&provider).await;
    // A reset only in `retry-after-ms`, longer than the policy waits: handed back at once, with
    // the `retry-after` every client reads.
    provider.script("later", vec![Step::status_with(503, &[("retry-after-ms", "7500")])]);
    let a = call(&rebound, "later", "sk-a", BODY).await;
    assert_eq!(a.status, 503);
    assert_eq!(a.header("retry-after"), Some("8"), "rounded up, never sooner");
    assert_eq!(provider.count("later"), 1);
    // A provider's own retry-after is left as it is.
    provider.script("own", vec![Step::status_with(429, &[("retry-after", "30")])]);
    assert_eq!(
        call(&rebound, "own", "sk-a", BODY).await.header("retry-after"),
        Some("30")
    );
}

#[tokio::test]
async fn a_failure_for_good_that_opened_the_circuit_says_when_it_closes() {
    let provider = FakeProvider::start().await;
    // A run counts requests (a failed retry does not add to it): the second request's first
    // failure opens the circuit, and its retry finds it open.
    let breaker = RawCircuit {
        consecutive_failures: Some(2),
        open_for: some("20s"),
        max_open_for: some("20s"),
        ..RawCircuit::default()
    };
    let rebound = TestConfig::new(&provider.url())
        .retry("p", policy())
        .circuit("c", breaker)
        .upstream(|u| u.circuit = some("c"))
        .route(|r| r.retry = some("p"))
        .start()
        .await;
    provider.script("down", vec![Step::status(503); 100]);
    assert_eq!(call(&rebound, "down", "sk-a", BODY).await.status, 503);
    let other = BODY.replace("hi", "hello");
    let a = call(&rebound, "down", "sk-a", &other).await;
    assert_eq!(a.status, 503);
    assert_eq!(a.header("x-rebound-error"), None, "the provider's answer");
    assert_eq!(provider.count("down"), 4);
    let after: u64 = a.header("retry-after").expect("retry-after").parse().unwrap();
    assert!((19..=20).contains(&after), "the circuit is open for 20 s: {after}");
    // The client's retry finds the circuit open: rebound's own error, no call, the same hint.
    let b = call(&rebound, "down", "sk-a", &other).await;
    assert_eq!(b.status, 503);
    assert_eq!(b.header("x-rebound-error"), Some("circuit_open"));
    assert!(b.header("retry-after").is_some());
    assert_eq!(provider.count("down"), 4);
}
