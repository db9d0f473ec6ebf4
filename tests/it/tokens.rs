//! Tokens and pacing through real sockets: the usage every response reports, counted as delivered
//! or wasted, and pacing that keeps a fleet under a provider's request quota instead of meeting
//! its 429.

use std::time::Duration;

use rebound::hooks::config::raw::RawUpstream;

use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::Step;
use crate::support::redis::RedisServer;
use crate::support::sidecar::redis_handle;
use crate::support::*;

/// The `fake` route, with `[metrics] models` naming `gpt-4o` and `claude-x`.
fn with_models(provider: &FakeProvider) -> TestConfig {
    TestConfig::new(&provider.url()).metrics_models(&["gpt-4o", "claude-x"])
}

async fn call(base: &str, path: &str, key: &str, body: &str) -> Answer {
    let h = [
        ("x-fake-key", key),
        ("content-type", "application/json"),
        ("authorization", "Bearer sk-test"),
    ];
    send("POST", &format!("{base}/fake{path}"), &h, body.to_string()).await
}

/// The `rebound_tokens_total` series for the `fake` route and upstream.
fn tokens_series(model: &str, kind: &str, outcome: &str) -> String {
    format!(r#"rebound_tokens_total{{kind="{kind}",model="{model}",outcome="{outcome}",route="fake",upstream="fake"}}"#)
}

/// `rebound_tokens_total` for the `fake` route and upstream.
fn tokens(page: &str, model: &str, kind: &str, outcome: &str) -> f64 {
    metric(page, &tokens_series(model, kind, outcome))
}

#[tokio::test]
async fn usage_is_read_from_json_and_event_streams_of_both_providers() {
    let provider = FakeProvider::start().await;
    let rebound = with_models(&provider).start().await;
    let chat_stream = r#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true}}"#;
    for (path, body) in [
        ("/v1/chat/completions", r#"{"model":"gpt-4o"}"#),
        ("/v1/chat/completions", chat_stream),
        ("/v1/messages", r#"{"model":"claude-x"}"#),
        ("/v1/messages", r#"{"model":"claude-x","stream":true}"#),
        ("/v1/messages", r#"{"model":"claude-unlisted","stream":true}"#),
    ] {
        let a = call(&rebound.url, path, "usage", body).await;
        assert_eq!(a.status, 200, "{path} {body}: {}", a.text());
    }
    // The app got the provider's bytes untouched.
    let a = call(&rebound.url, "/v1/chat/completions", "usage", chat_stream).await;
    assert!(a
        .text()
        .contains("\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5"));
    let page = rebound.metrics().await;
    // JSON: 12 in, 96 out; chat stream (include_usage): 12 in, 5 out, twice.
    assert_eq!(tokens(&page, "gpt-4o", "input", "delivered"), 36.0, "{page}");
    assert_eq!(tokens(&page, "gpt-4o", "output", "delivered"), 106.0);
    // Anthropic JSON 12/96; stream: message_start 12 in, message_delta 5 out (cumulative).
    assert_eq!(tokens(&page, "claude-x", "input", "delivered"), 24.0);
    assert_eq!(tokens(&page, "claude-x", "output", "delivered"), 101.0);
    assert_eq!(tokens(&page, "other", "input", "delivered"), 12.0);
    assert_eq!(tokens(&page, "gpt-4o", "input", "wasted"), 0.0);
    // The OpenTelemetry GenAI histograms, unprefixed.
    let usage = r#"gen_ai_client_token_usage_sum{gen_ai_provider_name="fake",gen_ai_request_model="gpt-4o",gen_ai_token_type="output"}"#;
    assert_eq!(metric(&page, usage), 106.0, "{page}");
    let ops = r#"gen_ai_client_operation_duration_seconds_count{gen_ai_provider_name="fake",gen_ai_request_model="claude-x"}"#;
    assert_eq!(metric(&page, ops), 2.0, "{page}");
}

#[tokio::test]
async fn an_error_after_output_wastes_the_tokens_already_reported() {
    let provider = FakeProvider::start().await;
    let rebound = with_models(&provider).start().await;
    provider.script(
        "mid",
        vec![Step::MidStreamError {
            after: 1,
            error_type: "overloaded_error".into(),
        }],
    );
    let a = call(
        &rebound.url,
        "/v1/messages",
        "mid",
        r#"{"model":"claude-x","stream":true}"#,
    )
    .await;
    assert_eq!(a.status, 200);
    let page = rebound.metrics().await;
    assert_eq!(tokens(&page, "claude-x", "input", "wasted"), 12.0, "{page}");
    assert_eq!(tokens(&page, "claude-x", "output", "wasted"), 1.0);
    assert_eq!(tokens(&page, "claude-x", "input", "delivered"), 0.0);
}

#[tokio::test]
async fn a_client_gone_mid_stream_wastes_the_attempt() {
    let provider = FakeProvider::start().await;
    let rebound = with_models(&provider).start().await;
    let url = format!("{}/fake/v1/messages", rebound.url);
    let h = [
        ("x-fake-key", "gone"),
        ("content-type", "application/json"),
        ("x-fake-chunks", "50"),
        ("x-fake-gap-ms", "20"),
    ];
    let resp = send_streaming("POST", &url, &h, r#"{"model":"claude-x","stream":true}"#.to_string()).await;
    drop(resp); // after the head (message_start came with it): the client goes away
    until_metric(&rebound, &tokens_series("claude-x", "input", "wasted"), |v| v == 12.0).await;
    let page = rebound.metrics().await;
    assert_eq!(tokens(&page, "claude-x", "input", "wasted"), 12.0, "{page}");
    assert_eq!(tokens(&page, "claude-x", "input", "delivered"), 0.0);
}

#[tokio::test]
async fn pacing_waits_are_exported_from_startup() {
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .with_upstream(
            "quiet",
            RawUpstream {
                url: some("http://127.0.0.1:1"),
                pacing: some("off"),
                ..RawUpstream::default()
            },
        )
        .start()
        .await;
    let page = rebound.metrics().await;
    assert!(
        page.lines()
            .any(|l| l == r#"rebound_pacing_waits_total{model="other",upstream="fake"} 0"#),
        "{page}"
    );
    assert!(!page
        .lines()
        .any(|l| l.starts_with("rebound_pacing_waits_total") && l.contains("quiet")));
}

/// Two replicas sharing a Redis, each sending `per_replica` requests one after another with the
/// same credential, to a provider that allows 5 requests per 2 s window: the 429s the provider
/// answered, and the pacing waits of both replicas.
async fn two_replicas(pacing: &str, per_replica: usize) -> (usize, f64) {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    provider.rate_limit(5, Duration::from_secs(2));
    let config = TestConfig::new(&provider.url())
        .redis_with(&redis.url(), |r| r.sync_interval = some("100ms"))
        .upstream(|u| {
            u.pacing = some(pacing);
            u.pacing_reserve = Some(1);
        });
    let (a, b) = (config.start().await, config.start().await);
    let run = |base: String| async move {
        let mut statuses = Vec::new();
        for _ in 0..per_replica {
            statuses.push(
                call(&base, "/v1/chat/completions", "paced", r#"{"model":"gpt-4o"}"#)
                    .await
                    .status,
            );
        }
        statuses
    };
    let (sa, sb) = tokio::join!(run(a.url.clone()), run(b.url.clone()));
    let waits = |page: &str| metric(page, r#"rebound_pacing_waits_total{model="other",upstream="fake"}"#);
    let (pa, pb) = (a.metrics().await, b.metrics().await);
    if pacing == "wait" {
        assert!(sa.iter().chain(&sb).all(|s| *s == 200), "{sa:?} {sb:?}");
    }
    (provider.rate_limited(), waits(&pa) + waits(&pb))
}

#[tokio::test]
async fn with_pacing_two_replicas_stay_under_the_quota() {
    let (limited, waits) = two_replicas("wait", 10).await;
    assert_eq!(limited, 0, "the provider answered 429");
    assert!(waits >= 2.0, "{waits} pacing waits");
}

#[tokio::test]
async fn without_pacing_the_same_load_meets_429s() {
    let (limited, waits) = two_replicas("off", 10).await;
    assert!(limited > 0, "no 429 without pacing");
    assert_eq!(waits, 0.0);
}

#[tokio::test]
async fn a_credential_paced_on_one_replica_waits_on_the_other() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    provider.rate_limit(1, Duration::from_secs(2));
    let config = TestConfig::new(&provider.url()).redis_with(&redis.url(), |r| r.sync_interval = some("100ms"));
    let (a, b) = (config.start().await, config.start().await);
    let first = call(&a.url, "/v1/chat/completions", "fleet", "{}").await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-ratelimit-remaining-requests"), Some("0"));
    // A's hold reaches Redis, then B (pub/sub, or B's next sync at the latest).
    let handle = redis_handle(&redis.url()).await;
    let key = handle.key("cooldown:{fake}");
    until("the pacing hold reached Redis", Duration::from_secs(10), || async {
        let fields: Vec<String> = handle
            .run("test", |mut c| {
                let key = key.clone();
                async move { ::redis::cmd("HKEYS").arg(key).query_async(&mut c).await }
            })
            .await
            .unwrap_or_default();
        match fields.iter().any(|f| f.starts_with("p:")) {
            true => Ok(()),
            false => Err(format!("{fields:?}")),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await; // past B's sync interval
    let second = call(&b.url, "/v1/chat/completions", "fleet", "{}").await;
    assert_eq!(second.status, 200, "B waited for the window instead of meeting a 429");
    assert_eq!(provider.rate_limited(), 0);
    let page = b.metrics().await;
    assert_eq!(
        metric(&page, r#"rebound_pacing_waits_total{model="other",upstream="fake"}"#),
        1.0,
        "{page}"
    );
}
