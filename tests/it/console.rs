//! The console's API (issue 63) through real sockets, on two replicas sharing one Redis: dead
//! letters grouped by cause with the provider's message masked and never a credential, each group
//! with its analysis; a group's entries, its replay plan (nothing sent) and its replay (the
//! provider receives the original keys); the fleet view on the replica that saw none of it; the
//! page itself. The browser's view of the same is tests/e2e/test_console.py.

use std::time::Duration;

use rebound::hooks::config::raw::{RawCircuit, RawIdempotency, RawRetry};

use crate::support::config_builder::{some, TestConfig};
use crate::support::redis::RedisServer;
use crate::support::*;

const TOKEN: &str = "console-token-42";

const OVERLOADED: &str = r#"{"error":{"message":"Overloaded, request req_77ab12 for key sk-proj-CANARY1234567890abcdef","type":"server_error"}}"#;

fn config(provider: &str, redis: &str) -> TestConfig {
    TestConfig::new(provider)
        .retry(
            "fast",
            RawRetry {
                max_attempts: Some(2),
                base_delay: some("5ms"),
                max_delay: some("10ms"),
                jitter: some("none"),
                ..RawRetry::default()
            },
        )
        .idempotency(
            "idem",
            RawIdempotency {
                lease: some("2s"),
                ..RawIdempotency::default()
            },
        )
        .circuit(
            "c",
            RawCircuit {
                consecutive_failures: Some(3),
                open_for: some("1s"),
                max_open_for: some("1s"),
                ..RawCircuit::default()
            },
        )
        .upstream(|u| {
            u.circuit = some("c");
            u.cooldown = some("off");
        })
        .route(|r| {
            r.retry = some("fast");
            r.idempotency = some("idem");
            r.dead_letters = Some(true);
            r.dead_letter_bodies = Some(true);
        })
        .admin_token(TOKEN)
        .redis_with(redis, |r| r.sync_interval = some("100ms"))
}

async fn admin(rebound: &Rebound, method: &str, path: &str) -> Answer {
    send(
        method,
        &format!("{}{path}", rebound.admin),
        &[("authorization", &format!("Bearer {TOKEN}"))],
        "",
    )
    .await
}

async fn chat(rebound: &Rebound, key: &str, idem: &str) -> Answer {
    send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[
            ("x-fake-key", key),
            ("idempotency-key", idem),
            ("authorization", "Bearer sk-CANARY-app"),
            ("content-type", "application/json"),
        ],
        r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#.to_string(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_analysis_plan_replay_and_the_fleet_on_another_replica() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let a = config(&provider.url(), &redis.url()).start().await;
    let b = config(&provider.url(), &redis.url()).start().await;
    let overloaded = Step::Status {
        status: 503,
        headers: vec![("content-type".into(), "application/json".into())],
        body: Some(OVERLOADED.into()),
    };
    provider.script("k", vec![overloaded; 6]);
    let keys = ["idem-1", "idem-2", "idem-3"];
    for k in keys {
        assert_eq!(chat(&a, "k", k).await.status, 503);
    }
    // The provider is well again (the steps the open circuit spared are dropped).
    provider.script("k", Vec::new());
    // On B, which served none of it: the fleet's dead letters, one group; once B's journal (a
    // read a second) has seen its mirror of the shared circuit open.
    let summary = until("B's journal saw the circuit open", Duration::from_secs(10), || async {
        let summary = admin(&b, "GET", "/admin/dead-letters/summary").await.json();
        match summary.to_string().contains("the circuit opened") {
            true => Ok(summary),
            false => Err(summary.to_string()),
        }
    })
    .await;
    assert_eq!(summary["total"], 3, "{summary}");
    let g = &summary["groups"][0];
    assert_eq!(g["count"], 3);
    assert_eq!(
        g["message"], "Overloaded, request <id> for key [redacted]",
        "ids masked, the key redacted: {g}"
    );
    assert_eq!((g["replayable"].as_u64(), g["with_key"].as_u64()), (Some(3), Some(3)));
    assert_eq!(
        g["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|n| n.as_u64())
            .sum::<u64>(),
        3
    );
    let line = g["analysis"]["line"].as_str().unwrap();
    assert!(line.starts_with("3 × fake answered 503"), "{line}");
    assert!(
        line.contains("the circuit opened"),
        "the shared circuit, seen from B: {line}"
    );
    assert_eq!(g["analysis"]["verdict"], "wait", "{line}");
    assert!(
        !summary.to_string().contains("CANARY"),
        "a credential reached the summary: {summary}"
    );

    // The group's entries, and what a replay would send: nothing sent.
    let key = g["key"].as_str().unwrap();
    let page = admin(&b, "GET", &format!("/admin/dead-letters?group={key}"))
        .await
        .json();
    assert_eq!(page["items"].as_array().unwrap().len(), 3);
    let before = provider.count("k");
    let plan = admin(
        &b,
        "POST",
        &format!("/admin/dead-letters/replay?group={key}&dry_run=true"),
    )
    .await
    .json();
    assert_eq!(
        (plan["replayable"].as_u64(), plan["with_key"].as_u64()),
        (Some(3), Some(3))
    );
    assert_eq!(plan["requests"][0]["path"], "/fake/v1/chat/completions");
    assert_eq!(provider.count("k"), before, "a plan sends nothing");

    // The fleet now, on B: the shared circuit of the upstream A's failures opened.
    let fleet = admin(&b, "GET", "/admin/fleet").await.json();
    assert_eq!(fleet["redis"], "up");
    let up = &fleet["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "fake")
        .cloned();
    assert!(up.is_some(), "{fleet}");
    assert!(
        fleet["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "circuit_opened"),
        "{fleet}"
    );

    // The app's own traffic probes the half-open circuit and closes it (the provider is well
    // again); then the replay: the original keys reach the provider.
    until("the circuit closed by a probe", Duration::from_secs(10), || async {
        let r = chat(&a, "probe", &format!("probe-{}", rand_suffix())).await;
        if r.status == 200 {
            Ok(())
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Err(r.status.to_string())
        }
    })
    .await;
    until("A sees the circuit closed", Duration::from_secs(10), || async {
        let fleet = admin(&a, "GET", "/admin/fleet").await.json();
        match fleet["upstreams"][0]["circuit"] == "closed" {
            true => Ok(()),
            false => Err(fleet.to_string()),
        }
    })
    .await;
    // Replayed through A, whose own probe closed it (B, idle, still holds its half-open mirror).
    let done = admin(&a, "POST", &format!("/admin/dead-letters/replay?group={key}"))
        .await
        .json();
    assert_eq!(done["succeeded"], 3, "{done}");
    let received = provider.requests("k");
    let mut replayed: Vec<String> = received[received.len() - 3..]
        .iter()
        .filter_map(|r| {
            r.headers
                .iter()
                .find(|(k, _)| k == "idempotency-key")
                .map(|(_, v)| v.clone())
        })
        .collect();
    replayed.sort();
    assert_eq!(replayed, keys);
    let after = admin(&a, "GET", "/admin/dead-letters/summary").await.json();
    assert_eq!(after["groups"][0]["replayed"], 3, "{after}");

    // Purge by group.
    let purged = admin(&a, "DELETE", &format!("/admin/dead-letters?group={key}"))
        .await
        .json();
    assert_eq!(purged["purged"], 3);
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[tokio::test]
async fn the_page_is_served_with_a_strict_policy_and_only_with_a_token() {
    let provider = FakeProvider::start().await;
    let on = TestConfig::new(&provider.url()).admin_token(TOKEN).start().await;
    let page = send("GET", &format!("{}/console", on.admin), &[], "").await;
    assert_eq!(page.status, 200);
    assert!(page.text().contains("<title>rebound console</title>"));
    let csp = page.header("content-security-policy").unwrap_or_default();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
        "{csp}"
    );
    let script = send("GET", &format!("{}/console/console.js", on.admin), &[], "").await;
    assert_eq!(script.status, 200);
    // The data is behind the token.
    let refused = send("GET", &format!("{}/admin/fleet", on.admin), &[], "").await;
    assert_eq!(refused.status, 401);

    let off = TestConfig::new(&provider.url()).start().await;
    let page = send("GET", &format!("{}/console", off.admin), &[], "").await;
    assert_eq!(page.status, 404);
    assert!(page.text().contains("[admin] token"));
}
