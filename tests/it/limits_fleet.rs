//! Fleet-wide limits on three replicas sharing one Redis, as issue 58 found them broken: capacity
//! freed on one replica reaches a request waiting on another, and a queued limit keeps its slots
//! busy. (The weights under abandonment: `limiter_store`; one deadline: `limits`.)

use std::time::{Duration, Instant};

use crate::limits::{redis_up, team_limit};
use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::{FakeProvider, Step};
use crate::support::redis::RedisServer;
use crate::support::sidecar::Rebound;
use crate::support::{send_within, until_metric, Answer};

/// A chat request to `rebound` under the fake's `key`, with `deadline_ms` (none: the route's).
async fn ask(rebound: &Rebound, key: &str, deadline_ms: Option<&str>) -> Answer {
    let mut h = vec![("x-fake-key", key), ("x-team", "chat")];
    if let Some(ms) = deadline_ms {
        h.push(("x-rebound-deadline-ms", ms));
    }
    send_within(
        Duration::from_secs(30),
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &h,
        "{}",
    )
    .await
}

async fn three(config: &TestConfig) -> Vec<Rebound> {
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(config.start().await);
    }
    for r in &replicas {
        redis_up(r).await;
    }
    replicas
}

/// `concurrent = 1`, queued: one request holds the slot 4 s on replica A; two queued on B and C
/// give up at their short deadlines (429 in time); one sent to B 2 s in, with 6 s left, gets the
/// slot when A frees it (it waited its 6 s and got 429 before: A kept the freed slot idle).
#[tokio::test]
async fn a_slot_freed_on_one_replica_reaches_a_waiter_on_another() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = TestConfig::new(&provider.url()).redis(&redis.url()).limit(
        "one",
        team_limit(|l| {
            l.concurrent = Some(1);
            l.on_limit = some("queue");
            l.max_wait = some("60s");
        }),
    );
    let r = three(&config).await;
    provider.script("hold", vec![Step::Delay { ms: 4000 }]);
    let started = Instant::now();
    let (a, b, c) = (&r[0], &r[1], &r[2]);
    let holding = ask(a, "hold", None);
    let others = async {
        until_metric(
            a,
            r#"rebound_limit_decisions_total{limit="one",result="admitted"}"#,
            |v| v >= 1.0,
        )
        .await;
        let (short_b, short_c) = tokio::join!(ask(b, "short", Some("800")), ask(c, "short", Some("1500")));
        for short in [&short_b, &short_c] {
            assert_eq!(short.status, 429, "{}", short.text());
            assert_eq!(short.header("x-rebound-error"), Some("limit_exceeded"));
        }
        tokio::time::sleep(Duration::from_secs(2).saturating_sub(started.elapsed())).await;
        let sent = Instant::now();
        let late = ask(b, "late", Some("6000")).await;
        (late, sent.elapsed())
    };
    let (held, (late, waited)) = tokio::join!(holding, others);
    assert_eq!(held.status, 200);
    assert_eq!(late.status, 200, "the slot A freed reached B's waiter: {}", late.text());
    // It waited for A's request to end (it was sent 2 s before that), not for its deadline:
    // the 200 tells (before, it got 429 when its 6 s ran out).
    assert!(waited >= Duration::from_millis(1500), "{waited:?}");
    assert_eq!(provider.count("late"), 1);
    assert_eq!(provider.count("short"), 0);
}

/// `concurrent = 16`, queued, three replicas, clients offering twice that: the waiting requests
/// take freed slots promptly (about 7 of 16 were busy before: slots taken in chunks lay idle on
/// one replica while the fleet's next waiter was on another).
#[tokio::test]
async fn a_saturated_queued_limit_keeps_its_slots_busy() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = TestConfig::new(&provider.url()).redis(&redis.url()).limit(
        "pool",
        team_limit(|l| {
            l.concurrent = Some(16);
            l.on_limit = some("queue");
            l.max_wait = some("60s");
        }),
    );
    let r = three(&config).await;
    provider.script("busy", vec![Step::Delay { ms: 250 }; 10_000]);
    let run = Duration::from_secs(5);
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..32 {
        let replica = r[i % 3].url.clone();
        clients.spawn(async move {
            let mut done = 0u32;
            while started.elapsed() < run {
                let a = send_within(
                    Duration::from_secs(30),
                    "POST",
                    &format!("{replica}/fake/v1/chat/completions"),
                    &[("x-fake-key", "busy"), ("x-team", "chat")],
                    "{}",
                )
                .await;
                assert_eq!(a.status, 200, "{}", a.text());
                done += 1;
            }
            done
        });
    }
    let mut done = 0;
    while let Some(n) = clients.join_next().await {
        done += n.expect("a client");
    }
    let took = started.elapsed().as_secs_f64();
    // 16 slots of 250 ms requests: 64 a second at most.
    let busy = f64::from(done) * 0.25 / took;
    assert!(
        busy >= 12.0,
        "{busy:.1} of 16 slots busy on average ({done} requests in {took:.1} s)"
    );
}

/// Redis frozen (SIGSTOP: it accepts connections and answers nothing, as a stalled primary does)
/// with `redis_down = "local"`: a replica of three counts alone up to its share of the window,
/// `limit / 3`, less what the fleet granted it already (it admitted all 81 requests of a
/// 120-a-minute limit before: it divided by the replicas of whichever bucket it last leased).
#[tokio::test]
async fn with_redis_frozen_each_of_three_replicas_keeps_to_its_share() {
    crate::limits::whole_minute_ahead(Duration::from_secs(40)).await;
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = TestConfig::new(&provider.url())
        .redis_with(&redis.url(), |r| r.command_timeout = some("200ms"))
        .limit(
            "team",
            team_limit(|l| {
                l.requests_per_minute = Some(120);
                l.redis_down = some("local");
            }),
        );
    let r = three(&config).await;
    // Traffic on every replica: each has leased the bucket since the others joined, and the
    // fleet's count told it three share it.
    for _ in 0..10 {
        for replica in &r {
            assert_eq!(ask(replica, "share", None).await.status, 200);
        }
    }
    // Then a team only replica A serves: its bucket's count says one replica (a replica that
    // took its share from the last count it heard, whichever bucket, took all 120).
    let solo = send_within(
        Duration::from_secs(10),
        "POST",
        &format!("{}/fake/v1/chat/completions", r[0].url),
        &[("x-fake-key", "share"), ("x-team", "solo")],
        "{}",
    )
    .await;
    assert_eq!(solo.status, 200);
    redis.freeze();
    let mut admitted_frozen = 0;
    for _ in 0..81 {
        match ask(&r[0], "share", None).await.status.as_u16() {
            200 => admitted_frozen += 1,
            429 => {}
            s => panic!("status {s}"),
        }
    }
    redis.thaw();
    // Ten before the freeze, then at most the rest of its share of 40.
    assert!(
        admitted_frozen + 10 <= 40,
        "replica A admitted {} in the window, its share is 40",
        admitted_frozen + 10
    );
    assert!(admitted_frozen >= 20, "it kept serving its share: {admitted_frozen}");
}

/// One shared capacity (`key = "route"`, `concurrent = 4`) split by team 4 : 1, both teams
/// saturating it through three replicas, their clients giving up after 1 s in the queue and
/// sending again: chat was admitted 244 times and batch once (a team was charged for every
/// request that joined the fleet's queue, served or not).
#[tokio::test]
async fn a_shared_capacity_is_split_by_weight_across_three_replicas() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let shared = crate::support::config_builder::some("route");
    let config = TestConfig::new(&provider.url()).redis(&redis.url()).limit(
        "shared",
        team_limit(|l| {
            l.key = shared;
            l.concurrent = Some(4);
            l.on_limit = some("queue");
            l.max_wait = some("1s");
            l.share_by = some("header:x-team");
            l.weights = Some([("chat".to_string(), 4), ("batch".to_string(), 1)].into());
        }),
    );
    let r = three(&config).await;
    provider.script("w", vec![Step::Delay { ms: 40 }; 100_000]);
    let run = Duration::from_secs(6);
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..24 {
        let replica = r[i % 3].url.clone();
        let team = if i % 2 == 0 { "chat" } else { "batch" };
        clients.spawn(async move {
            while started.elapsed() < run {
                let a = send_within(
                    Duration::from_secs(30),
                    "POST",
                    &format!("{replica}/fake/v1/chat/completions"),
                    &[("x-fake-key", "w"), ("x-team", team)],
                    "{}",
                )
                .await;
                assert!(matches!(a.status.as_u16(), 200 | 429), "{}", a.text());
            }
        });
    }
    while let Some(done) = clients.join_next().await {
        done.expect("a client");
    }
    let teams: Vec<String> = provider
        .requests("w")
        .iter()
        .map(|r| r.header("x-team").unwrap_or("").to_string())
        .collect();
    // While both saturate it (the first second's releases may come before every team waits).
    let cut = teams.len() / 6;
    let steady = &teams[cut..];
    let chat = steady.iter().filter(|t| *t == "chat").count() as f64 / steady.len() as f64;
    assert!(
        (0.72..=0.88).contains(&chat),
        "chat had {:.0}% of {} admissions, 80% expected (4 : 1)",
        chat * 100.0,
        steady.len()
    );
}

/// One deadline per request on the fleet: queued on replica B behind a slot replica A holds for
/// 2.7 s, admitted when A frees it, its attempt gets what is left of its 4 s (it got a fresh 4 s
/// and answered 200 after 5.8 s, when its client had given up at 4 s).
#[tokio::test]
async fn a_request_queued_on_one_replica_spends_its_one_deadline() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = TestConfig::new(&provider.url()).redis(&redis.url()).limit(
        "one",
        team_limit(|l| {
            l.concurrent = Some(1);
            l.on_limit = some("queue");
            l.max_wait = some("60s");
        }),
    );
    let r = three(&config).await;
    provider.script("hold", vec![Step::Delay { ms: 2700 }]);
    provider.script("late", vec![Step::Delay { ms: 3000 }]);
    let holding = ask(&r[0], "hold", None);
    let late = async {
        until_metric(
            &r[0],
            r#"rebound_limit_decisions_total{limit="one",result="admitted"}"#,
            |v| v >= 1.0,
        )
        .await;
        let sent = Instant::now();
        let a = ask(&r[1], "late", Some("4000")).await;
        (a, sent.elapsed())
    };
    let (held, (late, took)) = tokio::join!(holding, late);
    assert_eq!(held.status, 200);
    assert_eq!(late.status, 504, "{}", late.text());
    assert_eq!(late.header("x-rebound-error"), Some("deadline_exceeded"));
    assert_eq!(
        provider.count("late"),
        1,
        "admitted on B once A's slot was free, then cut at its deadline"
    );
    assert!(took >= Duration::from_millis(3900), "{took:?}");
}
