//! The fleet's limit counters on a real Redis (`src/limiter/store.rs` and its scripts): leases
//! never grant past a window's limit across replicas, adjustments count what a replica spent
//! beyond its lease, and a replica's concurrent slots expire when it stops renewing them.

use std::sync::Arc;
use std::time::Duration;

use rebound::hooks::limiter::store::{CounterId, Counters, Demand, Leaser, QueueCaller, QueueOp, SlotsCaller};
use rebound::hooks::metrics::Metrics;
use rebound::hooks::redis::RedisHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::support::config_builder::TestConfig;
use crate::support::redis::RedisServer;
use crate::support::until;

async fn store(redis: &RedisServer) -> (Counters, CancellationToken) {
    let config = TestConfig::new("http://127.0.0.1:9").redis(&redis.url()).config();
    let metrics = Arc::new(Metrics::new().expect("metrics"));
    let stop = CancellationToken::new();
    let handle = RedisHandle::start(
        config.redis.clone().expect("redis"),
        metrics,
        &TaskTracker::new(),
        stop.clone(),
    );
    let up = handle.clone();
    until("redis up", Duration::from_secs(10), || {
        let up = up.clone();
        async move { up.is_up().then_some(()).ok_or_else(|| "down".to_string()) }
    })
    .await;
    (Counters::Redis(handle), stop)
}

/// A lease of up to 70 of a limit of 1000, as replica `r`.
async fn lease_70(store: &Counters, window: u64) -> u64 {
    let demand = Demand { want: 70, limit: 1000 };
    let leaser = Leaser {
        replica: "r",
        liveness: Duration::from_secs(60),
    };
    store
        .lease(&id(window), demand, Duration::from_secs(120), leaser)
        .await
        .unwrap()
        .granted
}

fn id(window: u64) -> CounterId {
    CounterId {
        limit: "team".into(),
        bucket: "ab".repeat(16),
        quota: "tokens",
        window,
    }
}

#[tokio::test]
async fn three_replicas_leasing_at_once_never_get_more_than_the_limit() {
    let redis = RedisServer::start();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Arc::new(store(&redis).await));
    }
    let mut set = tokio::task::JoinSet::new();
    for r in &replicas {
        for _ in 0..20 {
            let r = r.clone();
            set.spawn(async move { lease_70(&r.0, 7).await });
        }
    }
    let mut total = 0;
    while let Some(g) = set.join_next().await {
        total += g.unwrap();
    }
    assert_eq!(total, 1000, "60 leases of 70 share a limit of 1000 exactly");
    let next = lease_70(&replicas[0].0, 8).await;
    assert_eq!(next, 70, "the next window starts afresh");
    // Spent beyond the lease: counted, so the fleet's next lease sees it; given back: freed.
    assert_eq!(
        replicas[1]
            .0
            .adjust(&id(8), 950, Duration::from_secs(120))
            .await
            .unwrap(),
        1020
    );
    assert_eq!(lease_70(&replicas[2].0, 8).await, 0);
    assert_eq!(
        replicas[1]
            .0
            .adjust(&id(8), -100, Duration::from_secs(120))
            .await
            .unwrap(),
        920
    );
    assert_eq!(lease_70(&replicas[2].0, 8).await, 70);
    for r in replicas {
        r.1.cancel();
    }
}

#[tokio::test]
async fn a_replica_that_stops_renewing_loses_its_slots() {
    let redis = RedisServer::start();
    let (a, stop_a) = store(&redis).await;
    let (b, stop_b) = store(&redis).await;
    let ttl = Duration::from_millis(300);
    assert_eq!(hold(&a, "a", 1, 8, ttl).await, 8);
    assert_eq!(hold(&b, "b", 1, 8, ttl).await, 2, "what a's holding leaves");
    // a renews with fewer: b may take more.
    assert_eq!(hold(&a, "a", 2, 5, ttl).await, 5);
    assert_eq!(hold(&b, "b", 2, 8, ttl).await, 5);
    // a dies (stops renewing): once its holding expires, b may hold them all.
    let got = until("a's slots expired", Duration::from_secs(10), || {
        let b = &b;
        async move {
            let n = hold(b, "b", 3, 10, ttl).await;
            (n == 10).then_some(n).ok_or_else(|| format!("{n} slots"))
        }
    })
    .await;
    assert_eq!(got, 10);
    // A declaration that was counted before the latest one but lands after it is ignored: it
    // would free slots still in use.
    assert_eq!(hold(&b, "b", 2, 0, ttl).await, 10);
    assert_eq!(hold(&a, "a", 9, 1, ttl).await, 0);
    stop_a.cancel();
    stop_b.cancel();
}

/// Declaration `seq` of `replica` on bucket `cd..` of limit `team`: it holds `want` of the
/// bucket's 10 slots for `ttl`; what it was granted.
async fn hold(store: &Counters, replica: &str, seq: u64, want: u64, ttl: Duration) -> u64 {
    let bucket = "cd".repeat(16);
    let caller = SlotsCaller {
        limit: "team",
        bucket: &bucket,
        replica,
        seq,
    };
    store
        .hold_slots(caller, Demand { want, limit: 10 }, ttl)
        .await
        .unwrap()
        .granted
}

/// Calls the fleet queue of bucket `ef..` of limit `shared` as `replica` with `ticket`.
async fn queue(store: &Counters, (replica, ticket): (&str, u64), op: QueueOp<'_>, liveness: Duration) -> (i64, u64) {
    let bucket = "ef".repeat(16);
    let caller = QueueCaller {
        limit: "shared",
        bucket: &bucket,
        replica,
        ticket,
    };
    store
        .queue(caller, op, Duration::from_secs(60), liveness)
        .await
        .expect("redis")
        .map(|a| (a.result, a.waiting))
        .expect("a fleet queue")
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The fleet's queue on a real Redis: two replicas' waiting requests are released in one fair
/// order (4 : 1 by weight, first in first out within a share), whichever replica they wait on;
/// a replica that stops asking (it died) and a request past its deadline stop holding it up.
#[tokio::test]
async fn the_fleet_queue_releases_every_replicas_waiters_in_one_fair_order() {
    let redis = RedisServer::start();
    let (a, stop_a) = store(&redis).await;
    let (b, stop_b) = store(&redis).await;
    let live = Duration::from_secs(10);
    let join = |share: &'static str, weight: u32| QueueOp::Join {
        share,
        weight,
        deadline_ms: unix_ms() + 60_000,
    };
    // Chat waits on replica a (weight 4), batch on replica b (weight 1), ten each.
    let mut waiting = Vec::new();
    for t in 0..10 {
        queue(&a, ("a", t), join("chat", 4), live).await;
        waiting.push(("a", t, "chat"));
        queue(&b, ("b", t), join("batch", 1), live).await;
        waiting.push(("b", t, "batch"));
    }
    let mut released = Vec::new();
    while released.len() < 10 {
        let mut head = None;
        for (i, (replica, ticket, _)) in waiting.iter().enumerate() {
            let store = if *replica == "a" { &a } else { &b };
            let (rank, len) = queue(store, (replica, *ticket), QueueOp::Head, live).await;
            assert_eq!(len as usize, waiting.len());
            if rank == 0 {
                assert!(head.is_none(), "one head");
                head = Some(i);
            }
        }
        let (replica, ticket, share) = waiting.remove(head.expect("a head"));
        let store = if replica == "a" { &a } else { &b };
        queue(store, (replica, ticket), QueueOp::Done { served: true }, live).await;
        released.push((share, ticket));
    }
    let chat: Vec<u64> = released.iter().filter(|(s, _)| *s == "chat").map(|(_, t)| *t).collect();
    let batch: Vec<u64> = released
        .iter()
        .filter(|(s, _)| *s == "batch")
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(chat, [0, 1, 2, 3, 4, 5, 6, 7], "4 : 1, in order: {released:?}");
    assert_eq!(batch, [0, 1], "{released:?}");
    // Another replica joins ahead of everyone (a new share starts at the virtual time, and its
    // name sorts first on a tie) and dies: it stops asking, and once its liveness runs out the
    // queue moves past it.
    queue(&a, ("0dead", 0), join("new", 1), Duration::from_millis(300)).await;
    let (rank, _) = queue(&a, ("a", 8), QueueOp::Head, live).await;
    assert!(rank > 0, "c's request is ahead");
    let moved = until("c's entry dropped", Duration::from_secs(10), || {
        let a = &a;
        async move {
            let (rank, _) = queue(a, ("a", 8), QueueOp::Head, live).await;
            (rank == 0).then_some(()).ok_or_else(|| format!("rank {rank}"))
        }
    })
    .await;
    assert_eq!(moved, ());
    // A request past its deadline is dropped too.
    let short = QueueOp::Join {
        share: "newer",
        weight: 1,
        deadline_ms: unix_ms() + 300,
    };
    queue(&b, ("0late", 0), short, live).await;
    let (rank, _) = queue(&a, ("a", 8), QueueOp::Head, live).await;
    assert!(rank > 0, "the short request is ahead");
    until("the expired entry dropped", Duration::from_secs(10), || {
        let a = &a;
        async move {
            let (rank, _) = queue(a, ("a", 8), QueueOp::Head, live).await;
            (rank == 0).then_some(()).ok_or_else(|| format!("rank {rank}"))
        }
    })
    .await;
    stop_a.cancel();
    stop_b.cancel();
}

/// Under saturation the clients of both teams give up and send again: a request that leaves the
/// queue unserved charges its team nothing, so the weights still hold (4 : 1). Three replicas,
/// a seeded mix of joins, services of the fleet's first and abandonments; the fleet's first is
/// found as a replica finds it (the `head` of its own waiters, and `mine` when it is another).
#[tokio::test]
async fn teams_whose_requests_give_up_keep_their_weighted_share() {
    use rand::{Rng, SeedableRng};
    let redis = RedisServer::start();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(store(&redis).await);
    }
    let names = ["ra", "rb", "rc"];
    let live = Duration::from_secs(30);
    let mut rng = rand::rngs::StdRng::seed_from_u64(58);
    // (replica, ticket, team) of every waiting request; each team keeps 6 waiting.
    let mut waiting: Vec<(usize, u64, &str)> = Vec::new();
    let mut next = 0u64;
    let mut served = Vec::new();
    let deadline = unix_ms() + 600_000;
    while served.len() < 400 {
        for team in ["chat", "batch"] {
            while waiting.iter().filter(|w| w.2 == team).count() < 6 {
                let r = rng.random_range(0..3);
                let weight = if team == "chat" { 4 } else { 1 };
                let op = QueueOp::Join {
                    share: team,
                    weight,
                    deadline_ms: deadline,
                };
                queue(&replicas[r].0, (names[r], next), op, live).await;
                waiting.push((r, next, team));
                next += 1;
            }
        }
        if rng.random_bool(0.5) {
            // A client gives up (either team, at random): it leaves unserved.
            let gone = waiting.remove(rng.random_range(0..waiting.len()));
            queue(
                &replicas[gone.0].0,
                (names[gone.0], gone.1),
                QueueOp::Done { served: false },
                live,
            )
            .await;
            continue;
        }
        // The fleet's first: any waiter asks, and is told whether it is first or which of its
        // replica's waiters is.
        let mut first = None;
        for (i, (r, ticket, _)) in waiting.iter().enumerate() {
            let bucket = "ef".repeat(16);
            let caller = QueueCaller {
                limit: "shared",
                bucket: &bucket,
                replica: names[*r],
                ticket: *ticket,
            };
            let a = replicas[*r]
                .0
                .queue(caller, QueueOp::Head, Duration::from_secs(60), live)
                .await
                .expect("redis")
                .expect("a fleet queue");
            if a.result == 0 {
                first = Some(i);
                break;
            }
            if let Some(t) = a.mine {
                first = waiting.iter().position(|w| w.0 == *r && w.1 == t);
                break;
            }
        }
        let (r, ticket, team) = waiting.remove(first.expect("a first"));
        queue(&replicas[r].0, (names[r], ticket), QueueOp::Done { served: true }, live).await;
        served.push(team);
    }
    let chat = served.iter().filter(|t| **t == "chat").count();
    assert!(
        (300..=340).contains(&chat),
        "chat served {chat} of 400, 320 expected (4 : 1)"
    );
    for (_, stop) in replicas {
        stop.cancel();
    }
}
