//! Idempotency under a Redis that stops answering at each step of a keyed request: a real
//! redis-server frozen with SIGSTOP (connections stay open, commands wait in its socket buffers and
//! run when it is thawed with SIGCONT). For each step (claim, renew, complete, release): how many
//! times the provider is called, and what the next try with the key sees.

use std::time::Duration;

use rebound::hooks::config::raw::RawIdempotency;

use crate::support::config_builder::{some, TestConfig};
use crate::support::redis::RedisServer;
use crate::support::*;

/// Two replicas' config: the `fake` route with idempotency on Redis, no retries (so that a
/// provider's 503 is the outcome), `command_timeout = 100ms`.
fn config(provider: &str, redis: &str, lease: &str) -> TestConfig {
    TestConfig::new(provider)
        .idempotency(
            "idem",
            RawIdempotency {
                lease: some(lease),
                wait_timeout: some("8s"),
                on_store_error: some("fail_closed"),
                ..RawIdempotency::default()
            },
        )
        .redis_with(redis, |r| r.command_timeout = some("100ms"))
        .route(|r| r.idempotency = some("idem"))
}

async fn call(url: &str, fake_key: &str, idem_key: &str) -> Answer {
    let h = [
        ("x-fake-key", fake_key),
        ("content-type", "application/json"),
        ("authorization", "Bearer tenant-a"),
        ("idempotency-key", idem_key),
    ];
    send(
        "POST",
        &format!("{url}/fake/v1/chat/completions"),
        &h,
        r#"{"model":"m","messages":[]}"#.to_string(),
    )
    .await
}

async fn wait_for(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    assert!(eventually(within, &mut f).await, "{what} within {within:?}");
}

/// Keys of idempotency records held in Redis, with their `st` field.
async fn records(url: &str) -> Vec<(String, String)> {
    let client = ::redis::Client::open(url).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = ::redis::cmd("KEYS").arg("*idem:*").query_async(&mut c).await.unwrap();
    let mut out = Vec::new();
    // Records only: not the replicas' liveness records (`idem:alive:REPLICA`).
    for k in keys.into_iter().filter(|k| !k.contains("idem:alive:")) {
        let st: Option<String> = ::redis::cmd("HGET")
            .arg(&k)
            .arg("st")
            .query_async(&mut c)
            .await
            .unwrap();
        out.push((k, st.unwrap_or_default()));
    }
    out
}

/// Completion: the provider answers while Redis is frozen. The client gets its 200; a duplicate on
/// the same replica is answered from the response it holds; a shutdown waits for the write; after
/// the thaw the completion lands, and another replica replays it. One provider call in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_redis_did_not_answer_is_written_late_and_never_runs_twice() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    provider.script("done", vec![Step::Delay { ms: 1000 }]);
    let config = config(&provider.url(), &redis.url(), "10s");
    let mut a = config.start().await;
    let b = config.start().await;

    let first = tokio::spawn({
        let url = a.url.clone();
        async move { call(&url, "done", "k-done").await }
    });
    wait_for("the provider has the request", Duration::from_secs(5), || {
        provider.count("done") == 1
    })
    .await;
    redis.freeze();
    let original = first.await.unwrap();
    assert_eq!(original.status, 200, "{}", original.text());

    // The write failed (Redis frozen); replica a holds the response and answers duplicates with it.
    until_metric(&a, "rebound_idempotency_completions_pending", |v| v == 1.0).await;
    let dup = call(&a.url, "done", "k-done").await;
    assert_eq!(dup.status, 200, "{}", dup.text());
    assert_eq!(dup.header("idempotent-replayed"), Some("true"));
    assert_eq!(dup.body, original.body, "the same response, not a second generation");

    // A shutdown waits for the pending write (within shutdown_grace), which lands after the thaw.
    let admin = a.admin.clone();
    let shutdown = tokio::spawn(async move {
        let exit = a.shutdown().await;
        (a, exit)
    });
    until("the drain started", Duration::from_secs(10), || async {
        let ready = get(&format!("{admin}/readyz")).await;
        match ready.status.as_u16() {
            503 => Ok(()),
            _ => Err(ready.text()),
        }
    })
    .await;
    redis.thaw();
    let (_a, exit) = shutdown.await.unwrap();
    assert_eq!(exit, rebound::Exit::Drained);
    assert_eq!(records(&redis.url()).await.len(), 1);
    assert_eq!(records(&redis.url()).await[0].1, "C", "completed in Redis");

    // Another replica replays the stored response.
    let later = call(&b.url, "done", "k-done").await;
    assert_eq!(later.status, 200, "{}", later.text());
    assert_eq!(later.header("idempotent-replayed"), Some("true"));
    assert_eq!(later.body, original.body);
    assert_eq!(provider.count("done"), 1, "one provider call for the key");
}

/// Claim: sent while Redis is frozen, it gets 503 store_unavailable after command_timeout; the
/// claim waiting in Redis's buffer runs at the thaw and must not hold the key for its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_ran_after_its_request_gave_up_does_not_hold_the_key() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = config(&provider.url(), &redis.url(), "30s");
    let a = config.start().await;
    // Redis knows the scripts already (else the late EVALSHA would fail with NOSCRIPT).
    assert_eq!(call(&a.url, "warm", "k-warm").await.status, 200);

    redis.freeze();
    let refused = call(&a.url, "claim", "k-claim").await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.json()["error"]["code"], "store_unavailable");
    tokio::time::sleep(Duration::from_millis(200)).await;
    redis.thaw();
    assert_eq!(provider.count("claim"), 0);

    // The late claim is refused by its not_after (or released by its owner): nothing holds the
    // key, so the app's retry runs at once instead of waiting out a 30 s lease (wait_timeout 8 s
    // would end in 409).
    let retry = call(&a.url, "claim", "k-claim").await;
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert_eq!(provider.count("claim"), 1);
    // The retry's completion is written as its body ends (in the background): wait for it.
    until("both keys completed, none held", Duration::from_secs(5), || async {
        let held = records(&redis.url()).await;
        match held.len() == 2 && held.iter().all(|(_, st)| st == "C") {
            true => Ok(()),
            false => Err(format!("{held:?}")),
        }
    })
    .await;
}

/// Renewal: Redis frozen for a while as the original runs (renewals time out, and the late ones
/// change nothing). The original completes after the thaw; a duplicate sent to another replica
/// meanwhile waits and gets the replay. One provider call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_that_redis_did_not_answer_keep_one_generation_per_key() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    provider.script("renew", vec![Step::Delay { ms: 2500 }]);
    // Renewed every second; frozen for 1.2 s, shorter than the lease.
    let config = config(&provider.url(), &redis.url(), "3s");
    let a = config.start().await;
    let b = config.start().await;

    let first = tokio::spawn({
        let url = a.url.clone();
        async move { call(&url, "renew", "k-renew").await }
    });
    wait_for("the provider has the request", Duration::from_secs(5), || {
        provider.count("renew") == 1
    })
    .await;
    redis.freeze();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    redis.thaw();
    let dup = call(&b.url, "renew", "k-renew").await;
    let original = first.await.unwrap();
    assert_eq!(original.status, 200, "{}", original.text());
    assert_eq!(dup.status, 200, "{}", dup.text());
    assert_eq!(dup.header("idempotent-replayed"), Some("true"));
    assert_eq!(dup.body, original.body);
    assert_eq!(provider.count("renew"), 1);
}

/// Release: the provider answers 503 (not stored: the key must be freed) while Redis is frozen.
/// The release is retried until Redis answers, so the app's retry runs as soon as Redis is back
/// instead of waiting out the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_redis_did_not_answer_is_retried_until_it_lands() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    provider.script("release", vec![Step::StatusAfter { ms: 500, status: 503 }]);
    let config = config(&provider.url(), &redis.url(), "10s");
    let a = config.start().await;

    let first = tokio::spawn({
        let url = a.url.clone();
        async move { call(&url, "release", "k-release").await }
    });
    wait_for("the provider has the request", Duration::from_secs(5), || {
        provider.count("release") == 1
    })
    .await;
    redis.freeze();
    let failed = first.await.unwrap();
    assert_eq!(failed.status, 503, "{}", failed.text());
    assert_eq!(
        failed.json()["error"]["message"],
        "scripted 503",
        "the provider's own 503"
    );
    // The release met the frozen Redis (timed out) before the thaw.
    until_metric(&a, r#"rebound_redis_errors_total{op="idem_release"}"#, |v| v >= 1.0).await;
    redis.thaw();

    // Held for 10 s without the retried release; wait_timeout is 8 s (409 then).
    let retry = call(&a.url, "release", "k-release").await;
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert_eq!(provider.count("release"), 2, "the failed attempt, then the retry");
}
