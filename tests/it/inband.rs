//! In-band errors through real sockets: a provider answers 200 and reports the failure inside the
//! body (the first SSE event, or a JSON body that is an error object). What the app sees: a clean
//! answer when a retry succeeds, the provider's error stream as it came otherwise; an error that
//! comes after the stream started is passed through and counted.

use std::time::Duration;

use rebound::hooks::config::raw::{RawIdempotency, RawRetry};

use crate::support::config_builder::{list, some, TestConfig};
use crate::support::fake_provider::{anthropic_message, error_event, error_object, sse_stream_bytes};
use crate::support::*;

/// The `fake` route retrying under `[retry.p]` (Anthropic's 529 named, fast waits).
fn config(provider: &str) -> TestConfig {
    TestConfig::new(provider)
        .retry(
            "p",
            RawRetry {
                max_attempts: Some(3),
                base_delay: some("10ms"),
                max_delay: some("20ms"),
                per_try_timeout: some("2s"),
                first_byte_timeout: some("1s"),
                deadline: some("10s"),
                retry_on: list(&[
                    "connect-failure",
                    "refused-stream",
                    "reset",
                    "timeout",
                    "429",
                    "502",
                    "503",
                    "504",
                    "529",
                ]),
                retry_once_on: list(&["500"]),
                ..RawRetry::default()
            },
        )
        .route(|r| r.retry = some("p"))
}

/// A rebound on [`config`] with `edit` applied (`idempotency`, ...).
async fn start(edit: impl FnOnce(TestConfig) -> TestConfig) -> (FakeProvider, Rebound) {
    let provider = FakeProvider::start().await;
    let rebound = edit(config(&provider.url())).start().await;
    (provider, rebound)
}

const MESSAGES: &str = "/v1/messages";
const CHAT: &str = "/v1/chat/completions";
const STREAM: &str = r#"{"model":"m","stream":true}"#;

async fn call(base: &str, path: &str, key: &str, body: &str, extra: &[(&str, &str)]) -> Answer {
    let mut h = vec![("x-fake-key", key), ("content-type", "application/json")];
    h.extend_from_slice(extra);
    send("POST", &format!("{base}{path}"), &h, body.to_string()).await
}

/// What the provider answers `path` normally, byte for byte (from a key with no script).
async fn normal(provider: &FakeProvider, path: &str, body: &str) -> String {
    call(&provider.url(), path, "normal-reference", body, &[]).await.text()
}

/// `rebound_upstream_attempts_total` for the `fake` route and upstream, by outcome.
fn attempts(page: &str, outcome: &str) -> f64 {
    metric(
        page,
        &format!(r#"rebound_upstream_attempts_total{{outcome="{outcome}",route="fake",upstream="fake"}}"#),
    )
}

/// `rebound_stream_errors_total` for the `fake` route and upstream, by position.
fn stream_errors(page: &str, position: &str) -> f64 {
    metric(
        page,
        &format!(r#"rebound_stream_errors_total{{position="{position}",route="fake",upstream="fake"}}"#),
    )
}

#[tokio::test]
async fn the_counters_exist_from_startup() {
    let (_provider, rebound) = start(|c| c).await;
    let page = rebound.metrics().await;
    for line in [
        r#"rebound_stream_errors_total{position="first_event",route="fake",upstream="fake"} 0"#,
        r#"rebound_stream_errors_total{position="mid_stream",route="fake",upstream="fake"} 0"#,
        r#"rebound_upstream_attempts_total{outcome="stream_error",route="fake",upstream="fake"} 0"#,
    ] {
        assert!(page.lines().any(|l| l == line), "{line} missing:\n{page}");
    }
}

#[tokio::test]
async fn an_overloaded_first_event_is_retried_and_the_app_gets_one_clean_stream() {
    let (provider, rebound) = start(|c| c).await;
    provider.script("k", vec![Step::in_band("overloaded_error")]);
    let a = call(&format!("{}/fake", rebound.url), MESSAGES, "k", STREAM, &[]).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("content-type"), Some("text/event-stream"));
    assert_eq!(a.text(), normal(&provider, MESSAGES, STREAM).await, "one clean stream");
    assert!(!a.text().contains("error"), "{}", a.text());
    assert_eq!(a.header("x-rebound-attempts"), Some("2"));
    assert_eq!(provider.count("k"), 2);
    let page = rebound.metrics().await;
    assert_eq!(attempts(&page, "stream_error"), 1.0, "{page}");
    assert_eq!(attempts(&page, "ok"), 1.0);
    assert_eq!(stream_errors(&page, "first_event"), 1.0);
    assert_eq!(stream_errors(&page, "mid_stream"), 0.0);
    assert_eq!(
        metric(&page, r#"rebound_retries_total{reason="529",route="fake"}"#),
        1.0
    );
}

#[tokio::test]
async fn an_openai_shaped_server_error_event_is_retried_once() {
    let (provider, rebound) = start(|c| c).await;
    provider.script("k", vec![Step::in_band("server_error")]);
    let a = call(&format!("{}/fake", rebound.url), CHAT, "k", STREAM, &[]).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.text(), sse_stream_bytes(5));
    assert_eq!(provider.count("k"), 2);
    let page = rebound.metrics().await;
    assert_eq!(
        metric(&page, r#"rebound_retries_total{reason="500",route="fake"}"#),
        1.0
    );

    // `retry_once_on = ["500"]`: a second one is delivered as it came.
    provider.script(
        "twice",
        vec![Step::in_band("server_error"), Step::in_band("server_error")],
    );
    let a = call(&format!("{}/fake", rebound.url), CHAT, "twice", STREAM, &[]).await;
    assert_eq!(a.text(), error_event("server_error", false));
    assert_eq!(provider.count("twice"), 2);
}

#[tokio::test]
async fn a_json_200_that_is_an_error_object_is_retried() {
    let (provider, rebound) = start(|c| c).await;
    provider.script(
        "k",
        vec![Step::JsonError {
            error_type: "overloaded_error".into(),
            headers: Vec::new(),
        }],
    );
    let a = call(&format!("{}/fake", rebound.url), MESSAGES, "k", r#"{"model":"m"}"#, &[]).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.text(), anthropic_message());
    assert_eq!(provider.count("k"), 2);
    let page = rebound.metrics().await;
    assert_eq!(stream_errors(&page, "first_event"), 1.0);
}

#[tokio::test]
async fn a_non_retryable_in_band_error_is_passed_through_as_it_came() {
    let (provider, rebound) = start(|c| c).await;
    provider.script(
        "k",
        vec![Step::InBandError {
            error_type: "invalid_request_error".into(),
            headers: vec![("x-request-id".into(), "req_in_band".into())],
        }],
    );
    let a = call(&format!("{}/fake", rebound.url), MESSAGES, "k", STREAM, &[]).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.text(), error_event("invalid_request_error", true), "byte for byte");
    assert_eq!(a.header("x-request-id"), Some("req_in_band"));
    assert_eq!(a.header("x-rebound-attempts"), Some("1"));
    assert_eq!(provider.count("k"), 1);
    let page = rebound.metrics().await;
    assert_eq!(attempts(&page, "stream_error"), 1.0);
    assert_eq!(stream_errors(&page, "first_event"), 1.0);
    assert_eq!(stream_errors(&page, "mid_stream"), 0.0, "not counted twice");

    // A JSON body likewise.
    provider.script(
        "json",
        vec![Step::JsonError {
            error_type: "invalid_request_error".into(),
            headers: Vec::new(),
        }],
    );
    let a = call(&format!("{}/fake", rebound.url), CHAT, "json", r#"{"model":"m"}"#, &[]).await;
    assert_eq!(
        (a.status.as_u16(), a.text()),
        (200, error_object("invalid_request_error", false))
    );
    assert_eq!(provider.count("json"), 1);
}

#[tokio::test]
async fn a_rate_limit_error_waits_for_the_retry_after_it_came_with() {
    let (provider, rebound) = start(|c| c).await;
    provider.script(
        "k",
        vec![Step::InBandError {
            error_type: "rate_limit_error".into(),
            headers: vec![("retry-after-ms".into(), "400".into())],
        }],
    );
    let a = call(&format!("{}/fake", rebound.url), MESSAGES, "k", STREAM, &[]).await;
    assert_eq!(a.status, 200);
    assert!(!a.text().contains("error"));
    let at: Vec<_> = provider.requests("k").iter().map(|r| r.at.unwrap()).collect();
    assert_eq!(at.len(), 2);
    assert!(at[1] - at[0] >= Duration::from_millis(400), "{:?}", at[1] - at[0]);
    let page = rebound.metrics().await;
    assert_eq!(
        metric(&page, r#"rebound_retries_total{reason="429",route="fake"}"#),
        1.0
    );
    assert_eq!(
        metric(
            &page,
            r#"rebound_retry_wait_seconds_count{route="fake",source="retry_after"}"#
        ),
        1.0
    );
}

#[tokio::test]
async fn a_mid_stream_error_is_passed_through_not_retried_and_counted() {
    let (provider, rebound) = start(|c| c).await;
    for (key, path) in [("anthropic", MESSAGES), ("openai", CHAT)] {
        provider.script(
            key,
            vec![Step::MidStreamError {
                after: 3,
                error_type: "overloaded_error".into(),
            }],
        );
        let a = call(&format!("{}/fake", rebound.url), path, key, STREAM, &[]).await;
        assert_eq!(a.status, 200);
        assert!(a.text().contains("token2"), "{}", a.text());
        assert!(
            a.text().ends_with(&error_event("overloaded_error", path == MESSAGES)),
            "{}",
            a.text()
        );
        assert_eq!(a.header("x-rebound-attempts"), Some("1"));
        assert_eq!(provider.count(key), 1, "never retried once the stream started");
    }
    let page = rebound.metrics().await;
    assert_eq!(stream_errors(&page, "mid_stream"), 2.0, "{page}");
    assert_eq!(stream_errors(&page, "first_event"), 0.0);
    assert_eq!(attempts(&page, "ok"), 2.0);
}

#[tokio::test]
async fn exhausted_retries_deliver_the_error_stream_as_it_came() {
    let (provider, rebound) = start(|c| c).await;
    provider.script("k", vec![Step::in_band("overloaded_error"); 3]);
    let a = call(&format!("{}/fake", rebound.url), MESSAGES, "k", STREAM, &[]).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("content-type"), Some("text/event-stream"));
    assert_eq!(a.text(), error_event("overloaded_error", true), "byte for byte");
    assert_eq!(a.header("x-rebound-attempts"), Some("3"));
    assert_eq!(a.header("x-should-retry"), Some("false"));
    assert_eq!(provider.count("k"), 3);
    let page = rebound.metrics().await;
    assert_eq!(attempts(&page, "stream_error"), 3.0);
    assert_eq!(stream_errors(&page, "first_event"), 3.0);
    assert_eq!(metric(&page, r#"rebound_retries_exhausted_total{route="fake"}"#), 1.0);
}

#[tokio::test]
async fn an_in_band_error_is_not_stored_for_an_idempotency_key() {
    // "conflict": a key still held answers 409 at once, so the retry below shows whether the
    // first released it (no wall-clock limit needed).
    let (provider, rebound) = start(|c| {
        c.idempotency(
            "idem",
            RawIdempotency {
                lease: some("5s"),
                on_concurrent: some("conflict"),
                ..RawIdempotency::default()
            },
        )
        .route(|r| r.idempotency = some("idem"))
    })
    .await;
    provider.script("k", vec![Step::in_band("overloaded_error")]);
    let key = [("idempotency-key", "in-band-1")];
    let once = [("idempotency-key", "in-band-1"), ("x-rebound-max-attempts", "1")];
    let first = call(&format!("{}/fake", rebound.url), MESSAGES, "k", STREAM, &once).await;
    assert_eq!(first.text(), error_event("overloaded_error", true));
    // The key was released, not stored: the app's retry runs and gets the generation.
    let again = call(&format!("{}/fake", rebound.url), MESSAGES, "k", STREAM, &key).await;
    assert_eq!(again.status, 200, "not held by the first's lease: {}", again.text());
    assert_eq!(provider.count("k"), 2);
    assert!(again.header("idempotent-replayed").is_none());
    assert_eq!(again.text(), normal(&provider, MESSAGES, STREAM).await);
    // And that success is what the key keeps.
    let third = call(&format!("{}/fake", rebound.url), MESSAGES, "k", STREAM, &key).await;
    assert_eq!(third.header("idempotent-replayed"), Some("true"));
    assert_eq!(third.body, again.body);
    assert_eq!(provider.count("k"), 2);

    // An error event mid-stream: passed through as it came, and the key released at its end.
    provider.script(
        "mid",
        vec![Step::MidStreamError {
            after: 2,
            error_type: "overloaded_error".into(),
        }],
    );
    let key = [("idempotency-key", "in-band-2")];
    let first = call(&format!("{}/fake", rebound.url), MESSAGES, "mid", STREAM, &key).await;
    assert!(first.text().contains("overloaded_error"), "{}", first.text());
    // Sent at once: while the release is being written, a duplicate neither follows nor
    // replays the failed stream; it waits for the key and runs.
    let again = call(&format!("{}/fake", rebound.url), MESSAGES, "mid", STREAM, &key).await;
    assert!(
        again.header("idempotent-replayed").is_none(),
        "not stored: the retry runs"
    );
    assert_eq!(again.text(), normal(&provider, MESSAGES, STREAM).await);
    assert_eq!(provider.count("mid"), 2);
}
