//! Rate limits per model (`rate_limit_scope`): a 429 or a spent request quota on one model of a
//! key never holds another model of that key (in one replica and across replicas sharing Redis),
//! the model named by the body or the path; a used-up quota still holds the whole key; a held
//! request is never kept longer than `max_retry_after` allows; `failover_wait` both ways;
//! `rate_limit_scope = "credential"` as before.

use rebound::hooks::config::raw::{RawRetry, RawTarget};

use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::chat_completion;
use crate::support::redis::RedisServer;
use crate::support::*;

const KEY: &str = "Bearer sk-shared";

/// Two attempts 10 ms apart, a reset waited for up to `max_retry_after`.
fn policy(max_retry_after: &str) -> RawRetry {
    RawRetry {
        max_attempts: Some(2),
        base_delay: some("10ms"),
        max_delay: some("10ms"),
        max_retry_after: some(max_retry_after),
        ..RawRetry::default()
    }
}

/// The fake route with a retry policy that waits at most 1 s for a reset; `[metrics] models`
/// names `gpt-big`.
fn one_key(provider: &FakeProvider) -> TestConfig {
    TestConfig::new(&provider.url())
        .retry("p", policy("1s"))
        .route(|r| r.retry = some("p"))
        .metrics_models(&["gpt-big"])
}

async fn chat(base: &str, fake: &str, model: &str) -> Answer {
    send(
        "POST",
        &format!("{base}/fake/echo/v1/chat/completions"),
        &[
            ("x-fake-key", fake),
            ("authorization", KEY),
            ("content-type", "application/json"),
        ],
        format!(r#"{{"model":"{model}","messages":[]}}"#),
    )
    .await
}

/// A 429 with a 30 s reset on `model` (handed back at once: longer than `max_retry_after`).
async fn limit(base: &str, provider: &FakeProvider, fake: &str, model: &str) {
    provider.script(fake, vec![Step::status_with(429, &[("retry-after", "30")])]);
    let r = chat(base, fake, model).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("x-rebound-error"), None, "the provider's own 429");
}

/// A request held by a cooldown whose reset exceeds `max_retry_after`: 429 `cooldown` at once
/// with the time left, and no provider call.
fn assert_refused_at_once(r: &Answer) {
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("x-rebound-error"), Some("cooldown"), "{}", r.text());
    let left: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((28..=30).contains(&left), "{left}");
}

#[tokio::test]
async fn a_limit_on_one_model_never_holds_another_and_a_long_hold_is_refused_at_once() {
    let provider = FakeProvider::start().await;
    let rebound = one_key(&provider).start().await;
    limit(&rebound.url, &provider, "small", "gpt-small").await;
    // The healthy model on the same key: served at once, one call.
    let r = chat(&rebound.url, "big", "gpt-big").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(provider.count("big"), 1);
    // The limited model: refused at once (30 s > max_retry_after), never sent.
    let r = chat(&rebound.url, "small", "gpt-small").await;
    assert_refused_at_once(&r);
    assert_eq!(provider.count("small"), 1);
    let page = rebound.metrics().await;
    assert_eq!(
        metric(
            &page,
            r#"rebound_cooldown_rejections_total{model="other",upstream="fake"}"#
        ),
        1.0,
        "{page}"
    );
    assert_eq!(
        metric(
            &page,
            r#"rebound_cooldown_rejections_total{model="gpt-big",upstream="fake"}"#
        ),
        0.0
    );
}

#[tokio::test]
async fn the_same_holds_on_three_replicas_sharing_redis() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    // The sidecar's key: `rebound_target_state` shows when a replica holds one of its models.
    let config = one_key(&provider).redis(&redis.url()).upstream(|u| {
        u.set_headers.insert("authorization".into(), KEY.into());
    });
    let (a, b, c) = (config.start().await, config.start().await, config.start().await);
    limit(&a.url, &provider, "small", "gpt-small").await;
    for replica in [&b, &c] {
        until_metric(
            replica,
            r#"rebound_target_state{route="fake",state="cooling",upstream="fake"}"#,
            |v| v == 1.0,
        )
        .await;
    }
    for (i, replica) in [&a, &b, &c].into_iter().enumerate() {
        let r = chat(&replica.url, "big", "gpt-big").await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(provider.count("big"), i + 1);
        assert_refused_at_once(&chat(&replica.url, "small", "gpt-small").await);
    }
    assert_eq!(provider.count("small"), 1, "a held model was called again");
    // What Redis holds: the credential's hash and the model's, never a name or a key.
    let handle = crate::support::sidecar::redis_handle(&redis.url()).await;
    let key = handle.key("cooldown:{fake}");
    let fields: Vec<String> = handle
        .run("test", |mut c| {
            let key = key.clone();
            async move { ::redis::cmd("HKEYS").arg(key).query_async(&mut c).await }
        })
        .await
        .unwrap();
    assert_eq!(fields.len(), 1, "{fields:?}");
    let (credential, model) = fields[0].split_once('/').expect("CREDENTIAL/MODEL");
    assert_eq!((credential.len(), model.len()), (32, 32), "{fields:?}");
}

#[tokio::test]
async fn pacing_is_per_model() {
    let provider = FakeProvider::start().await;
    let rebound = one_key(&provider).start().await;
    // gpt-small's quota is spent for 30 s; its response still succeeds.
    provider.script(
        "small",
        vec![Step::Status {
            status: 200,
            headers: vec![
                ("x-ratelimit-remaining-requests".into(), "0".into()),
                ("x-ratelimit-reset-requests".into(), "30s".into()),
            ],
            body: Some(chat_completion()),
        }],
    );
    assert_eq!(chat(&rebound.url, "small", "gpt-small").await.status, 200);
    let r = chat(&rebound.url, "big", "gpt-big").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(provider.count("big"), 1);
    // gpt-small waits for its reset no longer than max_retry_after: refused at once.
    assert_refused_at_once(&chat(&rebound.url, "small", "gpt-small").await);
    assert_eq!(provider.count("small"), 1);
    let page = rebound.metrics().await;
    assert_eq!(
        metric(&page, r#"rebound_pacing_waits_total{model="gpt-big",upstream="fake"}"#),
        0.0,
        "{page}"
    );
}

/// The model a path names: Gemini's and Vertex AI's `/models/{m}:`, Azure's `/deployments/{d}/`,
/// Bedrock's `/model/{m}/`.
#[tokio::test]
async fn a_model_in_the_path_scopes_its_limits() {
    let provider = FakeProvider::start().await;
    let rebound = one_key(&provider).start().await;
    for (i, (limited, healthy)) in [
        (
            "/v1beta/models/gemini-a:generateContent",
            "/v1beta/models/gemini-b:generateContent",
        ),
        (
            "/openai/deployments/gpt4o-a/chat/completions",
            "/openai/deployments/gpt4o-b/chat/completions",
        ),
        (
            "/model/anthropic.claude-a-v1:0/invoke",
            "/model/anthropic.claude-b-v1:0/invoke",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let call = |path: &str, fake: String| {
            let url = format!("{}/fake/echo{path}", rebound.url);
            async move { send("POST", &url, &[("x-fake-key", &fake), ("authorization", KEY)], "{}").await }
        };
        let (hot, cold) = (format!("hot-{i}"), format!("cold-{i}"));
        provider.script(&hot, vec![Step::status_with(429, &[("retry-after", "30")])]);
        assert_eq!(call(limited, hot.clone()).await.status, 429);
        let r = call(healthy, cold.clone()).await;
        assert_eq!(r.status, 200, "{healthy}: {}", r.text());
        assert_refused_at_once(&call(limited, hot.clone()).await);
        assert_eq!((provider.count(&hot), provider.count(&cold)), (1, 1), "{limited}");
    }
}

/// Another model of the key is refused without a call: the key is exhausted.
async fn assert_key_exhausted(rebound: &Rebound, provider: &FakeProvider) {
    let r = chat(&rebound.url, "big", "gpt-big").await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("x-rebound-error"), Some("no_target_available"));
    assert_eq!(provider.count("big"), 0, "an exhausted key was called");
}

#[tokio::test]
async fn a_used_up_quota_holds_every_model_of_the_key() {
    let provider = FakeProvider::start().await;
    let rebound = one_key(&provider).start().await;
    let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    provider.script(
        "small",
        vec![Step::Status {
            status: 429,
            headers: vec![],
            body: Some(quota.to_string()),
        }],
    );
    assert_eq!(chat(&rebound.url, "small", "gpt-small").await.status, 429);
    assert_key_exhausted(&rebound, &provider).await;
}

/// The same quota error inside a 200 stream (its first event): read by the same classifier, it
/// holds the key for every model too.
#[tokio::test]
async fn an_in_band_quota_error_holds_every_model_of_the_key() {
    let provider = FakeProvider::start().await;
    let rebound = one_key(&provider).start().await;
    provider.script("small", vec![Step::in_band("insufficient_quota")]);
    chat(&rebound.url, "small", "gpt-small").await;
    assert_eq!(provider.count("small"), 1);
    assert_key_exhausted(&rebound, &provider).await;
}

#[tokio::test]
async fn one_scope_per_credential_when_configured() {
    let provider = FakeProvider::start().await;
    let rebound = one_key(&provider)
        .upstream(|u| u.rate_limit_scope = some("credential"))
        .start()
        .await;
    limit(&rebound.url, &provider, "small", "gpt-small").await;
    assert_refused_at_once(&chat(&rebound.url, "big", "gpt-big").await);
    assert_eq!(provider.count("big"), 0);
}

/// Targets `a` then `b`, a policy that waits up to 5 s for a reset, and `failover_wait`.
async fn two_targets(a: &FakeProvider, b: &FakeProvider, failover_wait: Option<&str>) -> Rebound {
    let target = |upstream: &str| RawTarget {
        upstream: some(upstream),
        ..RawTarget::default()
    };
    one_key(a)
        .upstream_named("a", &a.url(), |_| {})
        .upstream_named("b", &b.url(), |_| {})
        .retry("p", policy("5s"))
        .route(|r| {
            r.upstream = None;
            r.targets = Some(vec![target("a"), target("b")]);
            r.failover_wait = failover_wait.and_then(some);
        })
        .start()
        .await
}

/// `failover_wait = "2s"`: a reset within it is waited for on the first target (one retry there,
/// nothing on the second), one beyond it (still within `max_retry_after`) moves at once.
#[tokio::test]
async fn failover_wait_waits_for_a_short_reset_and_moves_past_a_long_one() {
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let rebound = two_targets(&a, &b, Some("2s")).await;
    a.script("short", vec![Step::status_with(429, &[("retry-after-ms", "300")])]);
    let r = chat(&rebound.url, "short", "gpt-big").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-rebound-upstream"), Some("a"));
    assert_eq!((a.count("short"), b.count("short")), (2, 0));

    a.script("long", vec![Step::status_with(429, &[("retry-after", "4")])]);
    let r = chat(&rebound.url, "long", "gpt-small").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-rebound-upstream"), Some("b"));
    assert_eq!((a.count("long"), b.count("long")), (1, 1));
    assert_eq!(r.header("x-rebound-failovers"), Some("1"));
}

/// Without `failover_wait` a 429 moves the request at once, as before.
#[tokio::test]
async fn without_failover_wait_a_short_reset_still_moves_at_once() {
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let rebound = two_targets(&a, &b, None).await;
    a.script("short", vec![Step::status_with(429, &[("retry-after-ms", "300")])]);
    let r = chat(&rebound.url, "short", "gpt-big").await;
    assert_eq!(r.header("x-rebound-upstream"), Some("b"), "{}", r.text());
    assert_eq!((a.count("short"), b.count("short")), (1, 1));
}
