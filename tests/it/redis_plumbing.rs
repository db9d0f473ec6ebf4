//! The Redis connection: rebound serves without Redis, notices when it comes and goes, and
//! reconnects without a restart.

use std::time::Duration;

use crate::support::config_builder::{some, TestConfig};
use crate::support::redis::RedisServer;
use crate::support::*;

#[tokio::test]
async fn serves_without_redis_and_connects_when_it_appears() {
    let mut redis = RedisServer::start();
    redis.stop();
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .redis_with(&redis.url(), |r| r.command_timeout = some("200ms"))
        .start()
        .await;

    // Redis down from the start: the proxy serves, readiness stays green, the gauge says 0.
    assert_eq!(
        post_json(&format!("{}/fake/v1/chat/completions", rebound.url), "{}")
            .await
            .status,
        200
    );
    let ready = get(&format!("{}/readyz", rebound.admin)).await;
    assert_eq!(ready.status, 200);
    assert_eq!(ready.text(), "ready (redis: unreachable)\n");
    assert_eq!(metric(&rebound.metrics().await, "rebound_redis_up"), 0.0);

    redis.restart();
    // rebound connects once Redis is up.
    wait_for_gauge(&rebound, 1.0).await;
    assert_eq!(
        get(&format!("{}/readyz", rebound.admin)).await.text(),
        "ready (redis: up)\n"
    );

    redis.stop();
    // rebound notices Redis going away.
    wait_for_gauge(&rebound, 0.0).await;
    assert_eq!(
        post_json(&format!("{}/fake/v1/chat/completions", rebound.url), "{}")
            .await
            .status,
        200
    );

    redis.restart();
    // rebound reconnects without a restart.
    wait_for_gauge(&rebound, 1.0).await;
}

/// Waits until the gauge is `want`. The bound is generous: the point is that rebound reconnects
/// by itself (it retries every second), and with the whole suite running in parallel on two cores
/// a reconnect has been seen to take over 10 s.
async fn wait_for_gauge(rebound: &Rebound, want: f64) {
    until_metric_within(rebound, Duration::from_secs(30), "rebound_redis_up", |v| v == want).await
}
