//! The Redis connection: rebound serves without Redis, notices when it comes and goes, and
//! reconnects without a restart.

use std::time::Duration;

use crate::support::redis::RedisServer;
use crate::support::sidecar::config_for;
use crate::support::*;

#[tokio::test]
async fn serves_without_redis_and_connects_when_it_appears() {
    let mut redis = RedisServer::start();
    redis.stop();
    let provider = FakeProvider::start().await;
    let extra = format!("\n[redis]\nurl = \"{}\"\ncommand_timeout = \"200ms\"\n", redis.url());
    let rebound = Rebound::start(&config_for(&provider.url(), &extra)).await;

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
    assert!(
        wait_for_gauge(&rebound, 1.0).await,
        "rebound should connect once Redis is up"
    );
    assert_eq!(
        get(&format!("{}/readyz", rebound.admin)).await.text(),
        "ready (redis: up)\n"
    );

    redis.stop();
    assert!(
        wait_for_gauge(&rebound, 0.0).await,
        "rebound should notice Redis going away"
    );
    assert_eq!(
        post_json(&format!("{}/fake/v1/chat/completions", rebound.url), "{}")
            .await
            .status,
        200
    );

    redis.restart();
    assert!(
        wait_for_gauge(&rebound, 1.0).await,
        "rebound should reconnect without a restart"
    );
}

/// Whether the gauge reaches `want`. The bound is generous: the point is that rebound reconnects
/// by itself (it retries every second), and with the whole suite running in parallel on two cores
/// a reconnect has been seen to take over 10 s.
async fn wait_for_gauge(rebound: &Rebound, want: f64) -> bool {
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < end {
        if metric(&rebound.metrics().await, "rebound_redis_up") == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
