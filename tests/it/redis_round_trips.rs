//! What the hot path costs in Redis, counted with `MONITOR` on a real redis-server: a keyed
//! request that misses makes 2 round trips (claim, completion), a replay 1, an unkeyed request
//! none (circuit and cooldown decisions read a local mirror), and an idle replica's background
//! sync (fleet state, health check, the liveness heartbeat every 375 ms) stays under 10 commands a
//! second.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rebound::hooks::config::raw::RawCircuit;

use crate::support::config_builder::{some, TestConfig};
use crate::support::redis::RedisServer;
use crate::support::*;

/// `redis-cli monitor`: every command the server runs, one line each, as it runs it.
struct Monitor {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    fn start(port: u16) -> Monitor {
        let mut child = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "monitor"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli");
        let out = child.stdout.take().expect("stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Monitor { child, lines }
    }

    /// The round trips seen since `from`: client commands, not the ones a script runs inside
    /// Redis (`[0 lua]`).
    fn since(&self, from: usize) -> Vec<String> {
        self.lines.lock().unwrap()[from..]
            .iter()
            .filter(|l| !l.contains(" lua] "))
            .cloned()
            .collect()
    }

    /// The round trips between two marks.
    fn between(&self, from: usize, to: usize) -> Vec<String> {
        self.lines.lock().unwrap()[from..to]
            .iter()
            .filter(|l| !l.contains(" lua] "))
            .cloned()
            .collect()
    }

    /// Sends `marker` through the server until the monitor shows it (it may not be attached
    /// yet), and returns the position just after it.
    async fn sync(&self, port: u16, marker: &str) -> usize {
        for _ in 0..50 {
            let _ = Command::new("redis-cli")
                .args(["-p", &port.to_string(), "echo", marker])
                .output();
            let seen = || self.lines.lock().unwrap().iter().rposition(|l| l.contains(marker));
            if eventually(Duration::from_millis(200), || seen().is_some()).await {
                return seen().unwrap() + 1;
            }
        }
        panic!("the monitor never showed {marker}");
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Commands that name an idempotency record (the claim, the completion, a renewal, a release).
fn record_commands(lines: &[String]) -> Vec<&String> {
    lines.iter().filter(|l| l.contains("idem:{")).collect()
}

/// Commands that are not the replica's background work (fleet sync, health check, the relay, the
/// liveness heartbeat).
fn request_commands(lines: &[String]) -> Vec<&String> {
    let background = [
        "\"TIME\"",
        "circuit",
        "cooldown",
        "\"PING\"",
        "\"echo\"",
        "\"ECHO\"",
        "idem:alive:",
    ];
    lines
        .iter()
        .filter(|l| !background.iter().any(|b| l.contains(b)))
        .collect()
}

#[tokio::test]
async fn the_hot_path_costs_two_one_or_no_redis_round_trips_and_idle_sync_stays_cheap() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .circuit(
            "c",
            RawCircuit {
                shared: Some(true),
                ..RawCircuit::default()
            },
        )
        .idempotency("idem", Default::default())
        .redis_with(&redis.url(), |r| {
            r.command_timeout = some("500ms");
            r.sync_interval = some("250ms");
        })
        .upstream(|u| u.circuit = some("c"))
        .route(|r| r.idempotency = some("idem"))
        .start()
        .await;
    let url = format!("{}/fake/v1/chat/completions", rebound.url);
    let call = |key: Option<&'static str>| {
        let url = url.clone();
        async move {
            let mut h = vec![("x-fake-key", "rt")];
            if let Some(k) = key {
                h.push(("idempotency-key", k));
            }
            send("POST", &url, &h, r#"{"model":"m"}"#).await
        }
    };
    // Warm up: the scripts are loaded once (EVALSHA falls back to a load the first time).
    assert_eq!(call(Some("warm-up")).await.status, 200);
    // Its completion, written in the background, lands before the monitor starts counting.
    let stored = r#"rebound_idempotency_requests_total{result="stored",route="fake"}"#;
    until_metric(&rebound, stored, |n| n >= 1.0).await;

    let monitor = Monitor::start(redis.port);
    let start = monitor.sync(redis.port, "mark-miss").await;
    assert_eq!(call(Some("key-miss")).await.status, 200);
    // The completion is written as the body ends, in the background.
    assert!(
        eventually(Duration::from_secs(5), || record_commands(&monitor.since(start)).len()
            >= 2)
        .await
    );
    let end = monitor.sync(redis.port, "mark-replay").await;
    let miss = monitor.between(start, end);
    assert_eq!(
        record_commands(&miss).len(),
        2,
        "a miss: claim and completion\n{miss:#?}"
    );
    assert_eq!(request_commands(&miss).len(), 2, "and nothing else\n{miss:#?}");

    assert_eq!(call(Some("key-miss")).await.status, 200);
    let after = monitor.sync(redis.port, "mark-unkeyed").await;
    let replay = monitor.between(end, after);
    assert_eq!(
        request_commands(&replay).len(),
        1,
        "a replay: one round trip\n{replay:#?}"
    );

    for _ in 0..20 {
        assert_eq!(call(None).await.status, 200);
    }
    let last = monitor.sync(redis.port, "mark-idle").await;
    let unkeyed = monitor.between(after, last);
    assert!(request_commands(&unkeyed).is_empty(), "unkeyed: none\n{unkeyed:#?}");

    // Idle: the background sync (fleet circuit state, health check, liveness heartbeat) for 3 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = monitor.since(last).len();
    eprintln!("idle replica: {idle} Redis commands in 3 s");
    assert!(idle <= 30, "at most 10 commands/s when idle, saw {idle} in 3 s");
    assert_eq!(provider.count("rt"), 1 + 1 + 20);
}

/// Commands that name a response-cache entry.
fn cache_commands(lines: &[String]) -> Vec<&String> {
    lines.iter().filter(|l| l.contains("cache:{")).collect()
}

/// The response cache's cost in Redis: a miss is one round trip before the request
/// (the lookup that claims the entry) and one write after its response; a hit one; a request with
/// `cache-control: no-store` none.
#[tokio::test]
async fn the_cache_costs_a_miss_two_round_trips_a_hit_one_and_a_bypass_none() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .cache("c", Default::default())
        .redis(&redis.url())
        .start()
        .await;
    let url = format!("{}/fake/v1/chat/completions", rebound.url);
    let call = |body: &'static str, extra: Option<(&'static str, &'static str)>| {
        let url = url.clone();
        async move {
            let mut h = vec![("x-fake-key", "crt"), ("content-type", "application/json")];
            h.extend(extra);
            send("POST", &url, &h, body).await
        }
    };
    // Warm up: the scripts are loaded once, and the completion lands before counting starts.
    assert_eq!(call(r#"{"n":0}"#, None).await.header("x-rebound-cache"), Some("miss"));
    let completed = || {
        let keys: Vec<String> =
            crate::support::redis::query(redis.port, ::redis::cmd("KEYS").arg("rebound:cache:*")).unwrap_or_default();
        keys.iter().any(|k| {
            let st: Option<String> =
                crate::support::redis::query(redis.port, ::redis::cmd("HGET").arg(k).arg("st")).unwrap_or(None);
            st.as_deref() == Some("C")
        })
    };
    assert!(eventually(Duration::from_secs(5), completed).await);

    let monitor = Monitor::start(redis.port);
    let start = monitor.sync(redis.port, "mark-cache-miss").await;
    assert_eq!(call(r#"{"n":1}"#, None).await.header("x-rebound-cache"), Some("miss"));
    assert!(
        eventually(Duration::from_secs(5), || cache_commands(&monitor.since(start)).len()
            >= 2)
        .await
    );
    let end = monitor.sync(redis.port, "mark-cache-hit").await;
    let miss = monitor.between(start, end);
    assert_eq!(
        cache_commands(&miss).len(),
        2,
        "a miss: lookup and completion\n{miss:#?}"
    );
    assert_eq!(request_commands(&miss).len(), 2, "and nothing else\n{miss:#?}");

    assert_eq!(call(r#"{"n":1}"#, None).await.header("x-rebound-cache"), Some("hit"));
    let after = monitor.sync(redis.port, "mark-cache-bypass").await;
    let hit = monitor.between(end, after);
    assert_eq!(request_commands(&hit).len(), 1, "a hit: one round trip\n{hit:#?}");

    let no_store = Some(("cache-control", "no-store"));
    assert_eq!(
        call(r#"{"n":1}"#, no_store).await.header("x-rebound-cache"),
        Some("bypass")
    );
    let last = monitor.sync(redis.port, "mark-cache-end").await;
    let bypass = monitor.between(after, last);
    assert!(request_commands(&bypass).is_empty(), "a bypass: none\n{bypass:#?}");
    assert_eq!(provider.count("crt"), 3, "two misses and the bypass");
    // The entries expire with their ttl (1 h by default) in Redis.
    let keys: Vec<String> =
        crate::support::redis::query(redis.port, ::redis::cmd("KEYS").arg("rebound:cache:*")).unwrap();
    assert_eq!(keys.len(), 2);
    for k in &keys {
        let pttl: i64 = crate::support::redis::query(redis.port, ::redis::cmd("PTTL").arg(k)).unwrap();
        assert!((3_500_000..=3_600_000).contains(&pttl), "{k}: {pttl} ms");
    }
}
