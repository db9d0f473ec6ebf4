//! An upstream's `concurrency` (issue 62) through real sockets: the adaptive limit shrinks on each
//! overload signal and grows back on successes at the limit; a request at the limit goes to
//! another target, else waits, else gets 429 `concurrency_limited` without reaching the provider;
//! three replicas share one limit through Redis, and keep it when one is killed; each adapts alone
//! while Redis is away; a reload that changes the settings starts afresh, one that does not keeps
//! the limit.

use std::time::Duration;

use rebound::hooks::config::raw::{RawRetry, RawTarget};

use crate::limits::redis_up;
use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::{FakeProvider, Step};
use crate::support::redis::RedisServer;
use crate::support::sidecar::{Rebound, ReboundProcess};
use crate::support::{eventually, metric, send_within, until_metric, Answer};

const CHAT: &str = "/fake/v1/chat/completions";

/// `fake` with `concurrency = mode`, one attempt per request (each answer one signal), a 300 ms
/// first-byte timeout, `[concurrency]` from `initial` within 1..=100.
fn limited(provider: &FakeProvider, mode: toml::Value, initial: i64) -> TestConfig {
    TestConfig::new(&provider.url())
        .upstream(|u| u.concurrency = Some(mode))
        .concurrency_bounds(initial, 1, 100)
        .retry(
            "once",
            RawRetry {
                max_attempts: Some(1),
                first_byte_timeout: some("300ms"),
                ..RawRetry::default()
            },
        )
        .route(|r| r.retry = some("once"))
}

fn adaptive() -> toml::Value {
    toml::Value::String("adaptive".into())
}

async fn chat(rebound: &Rebound, path: &str, key: &str, extra: &[(&str, &str)]) -> Answer {
    chat_at(&rebound.url, path, key, extra).await
}

async fn chat_at(base: &str, path: &str, key: &str, extra: &[(&str, &str)]) -> Answer {
    let mut headers = vec![("x-fake-key", key), ("content-type", "application/json")];
    headers.extend_from_slice(extra);
    let url = format!("{base}{path}");
    send_within(Duration::from_secs(30), "POST", &url, &headers, r#"{"model":"m"}"#).await
}

fn limit_of(page: &str, upstream: &str) -> f64 {
    metric(
        page,
        &format!(r#"rebound_concurrency_limit{{model="other",upstream="{upstream}"}}"#),
    )
}

fn adjustments(page: &str, direction: &str, signal: &str) -> f64 {
    metric(
        page,
        &format!(
            r#"rebound_concurrency_adjustments_total{{direction="{direction}",signal="{signal}",upstream="fake"}}"#
        ),
    )
}

#[tokio::test]
async fn each_overload_signal_shrinks_the_limit_and_successes_at_it_grow_it_back() {
    let provider = FakeProvider::start().await;
    // No cooldown: a 429's long reset would hold the requests after it.
    let rebound = limited(&provider, adaptive(), 20)
        .upstream(|u| u.cooldown = some("off"))
        .start()
        .await;
    // A success first: the scope exists, its time to first byte has a floor.
    for _ in 0..5 {
        assert_eq!(chat(&rebound, CHAT, "ok", &[]).await.status, 200);
    }
    assert_eq!(limit_of(&rebound.metrics().await, "fake"), 20.0);
    let signals: [(Step, &str, f64); 5] = [
        (Step::status_with(429, &[("retry-after", "1")]), "rate_limited", 15.0),
        (Step::status(503), "unavailable", 11.0),
        (Step::status(529), "overloaded", 8.0),
        (Step::in_band("overloaded_error"), "overloaded", 6.0),
        (Step::Stall, "first_byte_timeout", 4.0),
    ];
    for (i, (step, signal, limit)) in signals.into_iter().enumerate() {
        let key = format!("signal-{i}");
        provider.script(&key, vec![step]);
        let before = adjustments(&rebound.metrics().await, "down", signal);
        chat(&rebound, CHAT, &key, &[]).await;
        let page = rebound.metrics().await;
        assert_eq!(adjustments(&page, "down", signal), before + 1.0, "{signal}");
        assert_eq!(limit_of(&page, "fake"), limit, "{signal}");
    }
    // Not overload: a quota's long reset (the cooldown's business), a 400 (the app's), a 500.
    for (i, step) in [
        Step::status_with(429, &[("retry-after", "30")]),
        Step::status(400),
        Step::status(500),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("not-{i}");
        provider.script(&key, vec![step]);
        chat(&rebound, CHAT, &key, &[]).await;
        assert_eq!(limit_of(&rebound.metrics().await, "fake"), 4.0, "answer {i}");
    }
    // The provider queueing: first bytes well above their floor.
    provider.script("slow", vec![Step::Delay { ms: 600 }; 6]);
    for _ in 0..6 {
        assert_eq!(chat(&rebound, CHAT, "slow", &[]).await.status, 200);
        if adjustments(&rebound.metrics().await, "down", "slow_first_byte") > 0.0 {
            break;
        }
    }
    let page = rebound.metrics().await;
    assert_eq!(adjustments(&page, "down", "slow_first_byte"), 1.0);
    assert_eq!(limit_of(&page, "fake"), 3.0);
    // Waves of requests at the limit (more than it: the rest wait their turn) grow it back.
    for wave in 0..30 {
        if limit_of(&rebound.metrics().await, "fake") >= 8.0 {
            break;
        }
        let key = format!("wave-{wave}");
        provider.script(&key, vec![Step::Delay { ms: 30 }; 12]);
        let answers = futures_util::future::join_all((0..12).map(|_| chat(&rebound, CHAT, &key, &[]))).await;
        assert!(
            answers.iter().all(|a| a.status == 200),
            "every queued request is served"
        );
    }
    let page = rebound.metrics().await;
    assert!(
        limit_of(&page, "fake") >= 8.0,
        "grown back: {}",
        limit_of(&page, "fake")
    );
    assert!(adjustments(&page, "up", "success") >= 3.0);
}

#[tokio::test]
async fn at_the_limit_a_request_goes_elsewhere_else_waits_else_gets_429_unsent() {
    let provider = FakeProvider::start().await;
    let spare = FakeProvider::start().await;
    let config = limited(&provider, toml::Value::Integer(1), 20)
        .upstream_named("spare", &spare.url(), |_| {})
        .with_route(rebound::hooks::config::raw::RawRoute {
            name: some("pair"),
            path_prefix: some("/pair/"),
            targets: Some(vec![
                RawTarget {
                    upstream: some("fake"),
                    ..RawTarget::default()
                },
                RawTarget {
                    upstream: some("spare"),
                    ..RawTarget::default()
                },
            ]),
            balance: some("ordered"),
            strip_prefix: Some(true),
            ..Default::default()
        });
    let rebound = config.start().await;

    // Another target: the first holds `fake`'s one slot, the second goes to `spare`.
    provider.script("hold", vec![Step::Delay { ms: 1500 }]);
    let holding = chat(&rebound, "/pair/v1/chat/completions", "hold", &[]);
    let second = async {
        assert!(eventually(Duration::from_secs(10), || provider.count("hold") == 1).await);
        chat(&rebound, "/pair/v1/chat/completions", "second", &[]).await
    };
    let (held, second) = tokio::join!(holding, second);
    assert_eq!(held.header("x-rebound-upstream"), Some("fake"));
    assert_eq!(second.status, 200);
    assert_eq!(second.header("x-rebound-upstream"), Some("spare"));
    assert_eq!((provider.count("second"), spare.count("second")), (0, 1));

    // No other target: the second waits for the slot, the provider never runs two at once.
    provider.reset_most_in_flight();
    provider.script("hold", vec![Step::Delay { ms: 1500 }]);
    let holding = chat(&rebound, CHAT, "hold", &[]);
    let waiting = async {
        assert!(eventually(Duration::from_secs(10), || provider.count("hold") == 2).await);
        let waited = chat(&rebound, CHAT, "waiter", &[]).await;
        (
            waited,
            provider.requests("hold")[1].at,
            provider.requests("waiter")[0].at,
        )
    };
    let (held, (waited, held_at, waiter_at)) = tokio::join!(holding, waiting);
    assert_eq!((held.status.as_u16(), waited.status.as_u16()), (200, 200));
    assert_eq!(provider.most_in_flight(), 1);
    assert!(
        waiter_at >= held_at.map(|t| t + Duration::from_millis(1500)),
        "sent after the slot was freed"
    );
    let page = rebound.metrics().await;
    assert!(metric(&page, r#"rebound_concurrency_queue_seconds_count{upstream="fake"}"#) >= 1.0);

    // Its wait over before a slot frees: 429 concurrency_limited, never sent.
    provider.script("hold", vec![Step::Delay { ms: 1500 }]);
    let holding = chat(&rebound, CHAT, "hold", &[]);
    let refused = async {
        assert!(eventually(Duration::from_secs(10), || provider.count("hold") == 3).await);
        chat(&rebound, CHAT, "late", &[("x-rebound-deadline-ms", "200")]).await
    };
    let (_, refused) = tokio::join!(holding, refused);
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.header("x-rebound-error"), Some("concurrency_limited"));
    assert_eq!(refused.header("x-should-retry"), Some("false"));
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(provider.count("late"), 0);
}

/// Three replicas on one Redis, `concurrency = 4` fixed (two in this process, one the real binary):
/// twelve requests held 1 s each, four sent to each replica, never more than four at the
/// provider, all served; the binary paused (SIGSTOP) stops holding its part once its report
/// expires, and the two left run four between them.
#[tokio::test]
async fn three_replicas_share_one_limit_and_a_paused_one_stops_holding_its_part() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = limited(&provider, toml::Value::Integer(4), 20).redis(&redis.url());
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let r = Box::pin(config.start()).await;
        redis_up(&r).await;
        replicas.push(r);
    }
    let process = ReboundProcess::start(&config.toml(), &[]).await;
    let urls: Vec<String> = replicas
        .iter()
        .map(|r| r.url.clone())
        .chain([process.proxy.clone()])
        .collect();
    // Each replica's scope made, and reported to the fleet.
    for url in &urls {
        assert_eq!(chat_at(url, CHAT, "warm", &[]).await.status, 200);
    }
    for r in &replicas {
        exchanged(r, 3.0).await;
    }
    provider.reset_most_in_flight();
    provider.script("held", vec![Step::Delay { ms: 1000 }; 12]);
    let all = urls
        .iter()
        .flat_map(|u| (0..4).map(move |_| chat_at(u, CHAT, "held", &[])));
    let answers = futures_util::future::join_all(all).await;
    assert!(answers.iter().all(|a| a.status == 200), "all served in turn");
    assert_eq!(provider.count("held"), 12);
    let most = provider.most_in_flight();
    assert!(
        (2..=4).contains(&most),
        "the fleet ran {most} at once, never more than four"
    );

    // The binary paused: once its report expires (1 s after its last exchange), the two left run
    // four at once. (Waited out, not counted in exchanges: a scope idle for 5 s stops exchanging.)
    process.signal("STOP");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    provider.reset_most_in_flight();
    provider.script("two", vec![Step::Delay { ms: 1000 }; 8]);
    let all = replicas
        .iter()
        .flat_map(|r| (0..4).map(move |_| chat_at(&r.url, CHAT, "two", &[])));
    let answers = futures_util::future::join_all(all).await;
    assert!(answers.iter().all(|a| a.status == 200));
    assert_eq!(
        provider.most_in_flight(),
        4,
        "the paused replica's part went to the others"
    );
    process.signal("CONT");
}

/// Waits until `r` has made `n` exchanges with the fleet.
async fn exchanged(r: &Rebound, n: f64) {
    until_metric(
        r,
        r#"rebound_redis_command_duration_seconds_count{op="concurrency"}"#,
        |v| v >= n,
    )
    .await;
}

#[tokio::test]
async fn with_redis_away_each_replica_adapts_on_its_own() {
    let mut redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let rebound = limited(&provider, adaptive(), 8).redis(&redis.url()).start().await;
    redis_up(&rebound).await;
    assert_eq!(chat(&rebound, CHAT, "ok", &[]).await.status, 200);
    exchanged(&rebound, 1.0).await;
    redis.stop();
    until_metric(&rebound, "rebound_redis_up", |v| v == 0.0).await;
    // Served, and still adapting: a 529 lowers its limit.
    provider.script("busy", vec![Step::status(529)]);
    assert_eq!(chat(&rebound, CHAT, "busy", &[]).await.status, 529);
    assert_eq!(limit_of(&rebound.metrics().await, "fake"), 6.0);
    provider.script("held", vec![Step::Delay { ms: 200 }; 6]);
    let answers = futures_util::future::join_all((0..6).map(|_| chat(&rebound, CHAT, "held", &[]))).await;
    assert!(answers.iter().all(|a| a.status == 200));
    assert!(provider.most_in_flight() <= 6);
}

#[tokio::test]
async fn a_reload_that_changes_the_settings_starts_afresh_one_that_does_not_keeps_the_limit() {
    let provider = FakeProvider::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rebound.toml");
    let write = |config: &TestConfig| std::fs::write(&path, config.toml()).unwrap();
    let first = limited(&provider, adaptive(), 20);
    write(&first);
    let config = rebound::Config::load_with_env(&path, &|_| None).unwrap();
    let rebound = Rebound::start_config(config).await;
    provider.script("busy", vec![Step::status(529)]);
    chat(&rebound, CHAT, "busy", &[]).await;
    assert_eq!(limit_of(&rebound.metrics().await, "fake"), 15.0);

    // Another route's change: the limit found so far stays.
    write(&limited(&provider, adaptive(), 20).route(|r| r.dead_letters = Some(false)));
    reload(&rebound, 1.0).await;
    assert_eq!(chat(&rebound, CHAT, "ok", &[]).await.status, 200);
    assert_eq!(limit_of(&rebound.metrics().await, "fake"), 15.0);

    // `[concurrency]` changed: it starts again from the new initial limit.
    write(&limited(&provider, adaptive(), 12));
    reload(&rebound, 2.0).await;
    assert_eq!(chat(&rebound, CHAT, "ok", &[]).await.status, 200);
    assert_eq!(limit_of(&rebound.metrics().await, "fake"), 12.0);
}

/// Reloads `rebound` from its file and waits for the `n`th successful reload.
async fn reload(rebound: &Rebound, n: f64) {
    if let Some(s) = &rebound.server {
        s.reload().expect("reloads");
    }
    until_metric(rebound, r#"rebound_config_reloads_total{result="success"}"#, |v| v >= n).await;
}
