//! The admin listener: health, readiness, metrics.

use rebound::hooks::config::raw::RawRetry;

use crate::support::config_builder::{list, some, TestConfig};
use crate::support::*;

#[tokio::test]
async fn health_ready_and_metrics() {
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url()).start().await;
    assert_eq!(get(&format!("{}/healthz", rebound.admin)).await.status, 200);
    let ready = get(&format!("{}/readyz", rebound.admin)).await;
    assert_eq!(ready.status, 200);
    assert_eq!(get(&format!("{}/nope", rebound.admin)).await.status, 404);

    for _ in 0..3 {
        assert_eq!(
            post_json(&format!("{}/fake/v1/chat/completions", rebound.url), "{}")
                .await
                .status,
            200
        );
    }
    provider.script("err", vec![Step::status(503)]);
    let a = send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[("x-fake-key", "err")],
        "{}",
    )
    .await;
    assert_eq!(a.status, 503);
    assert_eq!(get(&format!("{}/none/x", rebound.url)).await.status, 404);

    let page = rebound.metrics().await;
    assert_eq!(
        metric(&page, r#"rebound_requests_total{code="200",route="fake"}"#),
        3.0,
        "{page}"
    );
    assert_eq!(metric(&page, r#"rebound_requests_total{code="503",route="fake"}"#), 1.0);
    assert_eq!(metric(&page, r#"rebound_requests_total{code="404",route="none"}"#), 1.0);
    assert_eq!(
        metric(&page, r#"rebound_request_duration_seconds_count{route="fake"}"#),
        4.0
    );
    assert_eq!(
        metric(
            &page,
            r#"rebound_upstream_attempts_total{outcome="ok",route="fake",upstream="fake"}"#
        ),
        3.0
    );
    assert_eq!(
        metric(
            &page,
            r#"rebound_upstream_attempts_total{outcome="status_5xx",route="fake",upstream="fake"}"#
        ),
        1.0
    );
    assert_eq!(
        metric(
            &page,
            r#"rebound_upstream_attempt_duration_seconds_count{upstream="fake"}"#
        ),
        4.0
    );
    assert_eq!(metric(&page, "rebound_inflight_requests"), 0.0);
    assert_eq!(
        metric(
            &page,
            &format!(r#"rebound_build_info{{version="{}"}}"#, env!("CARGO_PKG_VERSION"))
        ),
        1.0
    );
    assert!(page.contains("# TYPE rebound_request_duration_seconds histogram"));
}

#[tokio::test]
async fn inflight_counts_open_streams() {
    use http_body_util::BodyExt;
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url()).start().await;
    let resp = send_streaming(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[("x-fake-chunks", "3"), ("x-fake-gap-ms", "300")],
        r#"{"stream":true}"#,
    )
    .await;
    let page = rebound.metrics().await;
    assert_eq!(metric(&page, "rebound_inflight_requests"), 1.0, "{page}");
    let _ = resp.into_body().collect().await.unwrap();
    let page = rebound.metrics().await;
    assert_eq!(metric(&page, "rebound_inflight_requests"), 0.0);
}

#[tokio::test]
async fn a_client_that_gives_up_early_is_counted_out_of_flight() {
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url()).start().await;
    provider.script("slow", vec![Step::Delay { ms: 1500 }]);
    let url = format!("{}/fake/v1/chat/completions", rebound.url);
    let gave_up = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        send("POST", &url, &[("x-fake-key", "slow")], "{}"),
    )
    .await;
    assert!(gave_up.is_err());
    // The abandoned request must leave the in-flight gauge.
    until_metric(&rebound, "rebound_inflight_requests", |v| v == 0.0).await;
}

/// A fresh sidecar exports every series its config determines, at 0, before any request: the
/// dashboard and the alerts have data on day one (rate(), increase() and absent() work).
#[tokio::test]
async fn a_fresh_sidecar_exports_the_series_its_config_determines() {
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .retry(
            "r",
            RawRetry {
                retry_on: list(&["503"]),
                retry_once_on: list(&["500"]),
                ..RawRetry::default()
            },
        )
        .idempotency("i", Default::default())
        .circuit("c", Default::default())
        .route(|r| {
            r.retry = some("r");
            r.idempotency = some("i");
            r.dead_letters = Some(true);
        })
        .upstream(|u| u.circuit = some("c"))
        .start()
        .await;
    let page = rebound.metrics().await;
    for sample in [
        r#"rebound_circuit_state{upstream="fake"} 0"#,
        r#"rebound_circuit_rejections_total{upstream="fake"} 0"#,
        r#"rebound_circuit_transitions_total{to="open",upstream="fake"} 0"#,
        r#"rebound_cooldown_rejections_total{model="other",upstream="fake"} 0"#,
        r#"rebound_requests_total{code="200",route="fake"} 0"#,
        r#"rebound_retries_total{reason="503",route="fake"} 0"#,
        r#"rebound_retries_total{reason="500",route="fake"} 0"#,
        r#"rebound_retries_exhausted_total{route="fake"} 0"#,
        r#"rebound_retry_budget_exhausted_total{route="fake"} 0"#,
        r#"rebound_retry_wait_seconds_count{route="fake",source="retry_after"} 0"#,
        r#"rebound_idempotency_requests_total{result="replayed",route="fake"} 0"#,
        r#"rebound_idempotency_completions_total{result="lost",route="fake"} 0"#,
        r#"rebound_dead_letters_total{reason="retries_exhausted",route="fake"} 0"#,
    ] {
        assert!(page.lines().any(|l| l == sample), "missing {sample}:\n{page}");
    }
}
