//! Circuit breaking and cooldowns through the pipeline: fail fast, probe gently, share across the
//! fleet, fall back, and respect a provider's "slow down" for one credential.

use std::time::{Duration, Instant};

use rebound::hooks::config::raw::{RawCircuit, RawUpstream};

use crate::support::config_builder::{list, some, TestConfig};
use crate::support::redis::RedisServer;
use crate::support::*;

/// `[circuit.c]`: open after 3 consecutive failures, for 1 s (4 s at most), one probe.
fn breaker() -> RawCircuit {
    RawCircuit {
        consecutive_failures: Some(3),
        open_for: some("1s"),
        max_open_for: some("4s"),
        half_open_probes: Some(1),
        ..RawCircuit::default()
    }
}

/// The `fake` route on an upstream with `[circuit.c]` (and `cooldown` mode), no retries; Redis
/// when given.
fn config(provider: &str, redis: Option<&str>, cooldown: &str) -> TestConfig {
    let c = TestConfig::new(provider).circuit("c", breaker()).upstream(|u| {
        u.circuit = some("c");
        u.cooldown = some(cooldown);
    });
    match redis {
        Some(url) => c.redis_with(url, |r| r.sync_interval = some("100ms")),
        None => c,
    }
}

async fn call(url: &str, key: &str) -> Answer {
    send(
        "POST",
        &format!("{url}/fake/v1/chat/completions"),
        &[("x-fake-key", key), ("authorization", "Bearer tenant-a")],
        "{}",
    )
    .await
}

#[tokio::test]
async fn an_open_circuit_fails_fast_then_probes_once_and_recovers() {
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), None, "off").start().await;
    provider.script("down", vec![Step::status(503); 100]);
    for _ in 0..3 {
        assert_eq!(call(&rebound.url, "down").await.status, 503);
    }
    assert_eq!(provider.count("down"), 3);
    // Open: fast 503 circuit_open, no upstream call.
    for _ in 0..5 {
        let a = call(&rebound.url, "down").await;
        assert_eq!(a.status, 503);
        assert_eq!(a.header("x-rebound-error"), Some("circuit_open"));
        assert_eq!(a.header("x-should-retry"), Some("false"));
        let ra: u64 = a.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=2).contains(&ra), "{ra}");
    }
    assert_eq!(provider.count("down"), 3, "the provider's counter stops growing");
    let page = rebound.metrics().await;
    assert_eq!(
        metric(&page, r#"rebound_circuit_state{upstream="fake"}"#),
        2.0,
        "{page}"
    );
    assert!(metric(&page, r#"rebound_circuit_rejections_total{upstream="fake"}"#) >= 5.0);
    assert_eq!(
        metric(&page, r#"rebound_circuit_transitions_total{to="open",upstream="fake"}"#),
        1.0
    );

    // After open_for (+10% jitter at most): one probe; while it runs, others are still refused.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    provider.script("down", vec![Step::Delay { ms: 300 }]);
    let probe = tokio::spawn({
        let url = rebound.url.clone();
        async move { call(&url, "down").await }
    });
    // The probe is running: it reached the provider.
    assert!(eventually(Duration::from_secs(10), || provider.count("down") == 4).await);
    let during = call(&rebound.url, "down").await;
    assert_eq!(during.header("x-rebound-error"), Some("circuit_open"));
    assert_eq!(probe.await.unwrap().status, 200);
    assert_eq!(provider.count("down"), 4, "exactly one probe");
    // Closed again.
    for _ in 0..3 {
        assert_eq!(call(&rebound.url, "down").await.status, 200);
    }
    let page = rebound.metrics().await;
    assert_eq!(metric(&page, r#"rebound_circuit_state{upstream="fake"}"#), 0.0);
    assert_eq!(
        metric(
            &page,
            r#"rebound_circuit_transitions_total{to="closed",upstream="fake"}"#
        ),
        1.0
    );
}

#[tokio::test]
async fn an_open_circuit_falls_back_and_says_so() {
    let (primary, backup) = (FakeProvider::start().await, FakeProvider::start().await);
    let rebound = config(&primary.url(), None, "off")
        .with_upstream(
            "backup",
            RawUpstream {
                url: Some(backup.url()),
                circuit: some("c"),
                ..RawUpstream::default()
            },
        )
        .route(|r| {
            r.fallback = list(&["backup"]);
            r.dead_letters = Some(true);
        })
        .start()
        .await;
    primary.script("k", vec![Step::status(503); 100]);
    // Each 503 (no retries on this route: its one attempt is used up) moves to the backup.
    for _ in 0..3 {
        let a = call(&rebound.url, "k").await;
        assert_eq!(a.status, 200);
        assert_eq!(a.header("x-rebound-upstream"), Some("backup"));
        assert_eq!(a.header("x-rebound-failovers"), Some("1"));
    }
    // The primary's circuit is open: it is skipped, not called.
    let a = call(&rebound.url, "k").await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("x-rebound-upstream"), Some("backup"));
    assert_eq!((primary.count("k"), backup.count("k")), (3, 4));
    let page = rebound.metrics().await;
    let moved = |reason: &str| {
        metric(
            &page,
            &format!(r#"rebound_failovers_total{{from="fake",reason="{reason}",route="fake",to="backup"}}"#),
        )
    };
    assert_eq!(
        (moved("retries_exhausted"), moved("circuit_open")),
        (3.0, 1.0),
        "{page}"
    );
}

#[tokio::test]
async fn no_fallback_left_is_a_dead_letter() {
    let provider = FakeProvider::start().await;
    let rebound = config(&provider.url(), None, "off")
        .admin_token("t")
        .route(|r| r.dead_letters = Some(true))
        .start()
        .await;
    provider.script("k", vec![Step::status(503); 10]);
    for _ in 0..4 {
        call(&rebound.url, "k").await;
    }
    let page = until("the circuit_open dead letter", Duration::from_secs(10), || async {
        let page = send(
            "GET",
            &format!("{}/admin/dead-letters?reason=circuit_open", rebound.admin),
            &[("authorization", "Bearer t")],
            "",
        )
        .await
        .json();
        match page["items"].as_array().is_some_and(|i| !i.is_empty()) {
            true => Ok(page),
            false => Err(page.to_string()),
        }
    })
    .await;
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{page}");
    assert_eq!(items[0]["error_class"], "circuit_open");
    assert_eq!(items[0]["final_status"], 503);
}

#[tokio::test]
async fn the_fleet_opens_together_and_probes_once() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = config(&provider.url(), Some(&redis.url()), "off").circuit(
        "c",
        RawCircuit {
            open_for: some("2s"),
            ..breaker()
        },
    );
    let a = config.start().await;
    let b = config.start().await;
    let c = config.start().await;
    // The provider is down for everyone; each replica's calls carry their own key so that the
    // provider's counters tell whose calls reached it.
    for key in ["k", "kb", "kc"] {
        provider.script(key, vec![Step::status(503); 100]);
    }
    for _ in 0..3 {
        call(&a.url, "k").await;
    }
    let opened = Instant::now();
    // B and C follow through the fleet state (one sync interval, 100 ms, or the published event)
    // without a single failure of their own: nothing is sent to them while they follow.
    let open_on = |page: &str| metric(page, r#"rebound_circuit_state{upstream="fake"}"#) == 2.0;
    // B and C opened without a failure of their own (asserted below): only the fleet state did it.
    let followed = until("B and C open too", Duration::from_secs(10), || async {
        match open_on(&b.metrics().await) && open_on(&c.metrics().await) {
            true => Ok(opened.elapsed()),
            false => Err("not both open".to_string()),
        }
    })
    .await;
    eprintln!("B and C followed A {followed:?} after its failures");
    // Open on B and C: their calls fail fast, none reaches the provider.
    let (rb, rc) = (call(&b.url, "kb").await, call(&c.url, "kc").await);
    assert_eq!(rb.header("x-rebound-error"), Some("circuit_open"));
    assert_eq!(rc.header("x-rebound-error"), Some("circuit_open"));
    assert_eq!(
        (provider.count("kb"), provider.count("kc")),
        (0, 0),
        "B and C opened on the fleet's word alone"
    );
    let before_probe = provider.count("k");

    // Half-open: the whole fleet sends at most one probe. Bursts of 15 concurrent calls (5 per
    // replica) until the provider sees the probe; it lasts 500 ms, so the burst overlaps it.
    provider.script("k", vec![Step::Delay { ms: 500 }; 20]);
    let end = Instant::now() + Duration::from_secs(8);
    let mut probes = 0;
    while Instant::now() < end {
        let mut set = tokio::task::JoinSet::new();
        for url in [a.url.clone(), b.url.clone(), c.url.clone()] {
            for _ in 0..5 {
                let url = url.clone();
                set.spawn(async move { call(&url, "k").await.status });
            }
        }
        while set.join_next().await.is_some() {}
        probes = provider.count("k") - before_probe;
        if probes > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(probes, 1, "one probe for the fleet, not one per replica");
}

#[tokio::test]
async fn a_cooldown_on_one_replica_holds_or_rejects_that_credential_on_another() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let reject = config(&provider.url(), Some(&redis.url()), "reject");
    let wait = config(&provider.url(), Some(&redis.url()), "wait");
    let (a, b, w) = (reject.start().await, reject.start().await, wait.start().await);
    provider.script("k", vec![Step::status_with(429, &[("retry-after", "3")])]);
    let first = call(&a.url, "k").await;
    assert_eq!(first.status, 429);
    let noted = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // B (reject): 429 cooldown at once, with the time left; the provider sees nothing.
    let r = call(&b.url, "k").await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-rebound-error"), Some("cooldown"));
    let left: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((2..=3).contains(&left), "{left}");
    assert_eq!(provider.count("k"), 1);
    // Another credential is unaffected.
    let other = send(
        "POST",
        &format!("{}/fake/v1/chat/completions", b.url),
        &[("x-fake-key", "k"), ("authorization", "Bearer tenant-b")],
        "{}",
    )
    .await;
    assert_eq!(other.status, 200);
    assert_eq!(provider.count("k"), 2);

    // W (wait): the request is held until the cooldown ends, then sent.
    let started = Instant::now();
    let held = call(&w.url, "k").await;
    assert_eq!(held.status, 200);
    assert!(
        noted.elapsed() >= Duration::from_secs(3),
        "released after {:?}",
        noted.elapsed()
    );
    eprintln!("held {:?}, then sent", started.elapsed());
    assert_eq!(provider.count("k"), 3);
    let page = b.metrics().await;
    assert!(
        metric(
            &page,
            r#"rebound_cooldown_rejections_total{model="other",upstream="fake"}"#
        ) >= 1.0,
        "{page}"
    );
}

#[tokio::test]
async fn every_replica_keeps_its_local_breaker_without_redis() {
    let mut redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = config(&provider.url(), Some(&redis.url()), "off");
    let (a, b) = (config.start().await, config.start().await);
    redis.stop();
    provider.script("k", vec![Step::status(503); 100]);
    for _ in 0..3 {
        call(&a.url, "k").await;
    }
    assert_eq!(
        call(&a.url, "k").await.header("x-rebound-error"),
        Some("circuit_open"),
        "A breaks locally"
    );
    // B has not seen the failures (no Redis): it still calls, and breaks on its own.
    let rb = call(&b.url, "k").await;
    assert_eq!(rb.status, 503);
    assert!(rb.header("x-rebound-error").is_none());
    assert_eq!(provider.count("k"), 4);
}
