//! Circuit breaking and cooldowns through the pipeline: fail fast, probe gently, share across the
//! fleet, fall back, and respect a provider's "slow down" for one credential.

use std::time::{Duration, Instant};

use crate::support::redis::RedisServer;
use crate::support::sidecar::config_for;
use crate::support::*;

/// The `fake` route on an upstream with `[circuit.c]` (and `cooldown` mode), no retries.
fn config(provider: &str, redis: Option<&str>, circuit: &str, cooldown: &str, extra: &str) -> String {
    let mut tables = format!(
        "\n[circuit.c]\nconsecutive_failures = 3\nopen_for = \"1s\"\nmax_open_for = \"4s\"\nhalf_open_probes = 1\n{circuit}\n{extra}"
    );
    if let Some(url) = redis {
        tables.push_str(&format!("\n[redis]\nurl = \"{url}\"\nsync_interval = \"100ms\"\n"));
    }
    Edit::new(&config_for(provider, &tables))
        .set("upstreams.fake", "circuit", "c")
        .set("upstreams.fake", "cooldown", cooldown)
        .to_string()
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
    let rebound = Rebound::start(&config(&provider.url(), None, "", "off", "")).await;
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
    tokio::time::sleep(Duration::from_millis(100)).await;
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
    let extra = format!("\n[upstreams.backup]\nurl = \"{}\"\ncircuit = \"c\"\n", backup.url());
    let toml = Edit::new(&config(&primary.url(), None, "", "off", &extra))
        .route_set("fake", "fallback", toml_edit::Array::from_iter(["backup"]))
        .route_set("fake", "dead_letters", true)
        .to_string();
    let rebound = Rebound::start(&toml).await;
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
    let toml = Edit::new(&config(&provider.url(), None, "", "off", ""))
        .set("admin", "token", "t")
        .route_set("fake", "dead_letters", true)
        .to_string();
    let rebound = Rebound::start(&toml).await;
    provider.script("k", vec![Step::status(503); 10]);
    for _ in 0..4 {
        call(&rebound.url, "k").await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let page = send(
        "GET",
        &format!("{}/admin/dead-letters?reason=circuit_open", rebound.admin),
        &[("authorization", "Bearer t")],
        "",
    )
    .await
    .json();
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{page}");
    assert_eq!(items[0]["error_class"], "circuit_open");
    assert_eq!(items[0]["final_status"], 503);
}

#[tokio::test]
async fn the_fleet_opens_together_and_probes_once() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let toml = Edit::new(&config(&provider.url(), Some(&redis.url()), "", "off", ""))
        .change("circuit.c", "open_for", "2s")
        .to_string();
    let a = Rebound::start(&toml).await;
    let b = Rebound::start(&toml).await;
    let c = Rebound::start(&toml).await;
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
    let mut followed = None;
    while opened.elapsed() < Duration::from_secs(10) {
        if open_on(&b.metrics().await) && open_on(&c.metrics().await) {
            followed = Some(opened.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // B and C opened without a failure of their own (asserted below): only the fleet state did it.
    let followed = followed.expect("B and C open too");
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
    let reject = config(&provider.url(), Some(&redis.url()), "", "reject", "");
    let wait = config(&provider.url(), Some(&redis.url()), "", "wait", "");
    let (a, b, w) = (
        Rebound::start(&reject).await,
        Rebound::start(&reject).await,
        Rebound::start(&wait).await,
    );
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
    let toml = config(&provider.url(), Some(&redis.url()), "", "off", "");
    let (a, b) = (Rebound::start(&toml).await, Rebound::start(&toml).await);
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
