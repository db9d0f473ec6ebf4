//! Fleet sharing of circuits and cooldowns: three `Circuits` (three replicas' mirrors) on one
//! real redis-server, driven through the public API.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use rebound::hooks::circuit::{Admission, Attempt, CircuitState, Circuits, CredentialHash, LimitKey, Permit};
use rebound::hooks::metrics::Metrics;
use rebound::hooks::redis::RedisHandle;
use rebound::hooks::retry::policy::Outcome;
use rebound::hooks::time::{self, Instant};
use rebound::Config;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::support::redis::RedisServer;
use crate::support::{eventually, time_until};

const SYNC: Duration = Duration::from_millis(100);
const OPEN_FOR: Duration = Duration::from_secs(1);
const PROBES: usize = 2;

fn config(redis_url: &str) -> Config {
    let src = format!(
        r#"
[redis]
url = "{redis_url}"
key_prefix = "it:"
command_timeout = "100ms"
sync_interval = "100ms"

[upstreams.up]
url = "http://127.0.0.1:9"
circuit = "c"

[circuit.c]
consecutive_failures = 3
failure_rate = 0.5
minimum_requests = 20
window = "10s"
open_for = "1s"
max_open_for = "10s"
half_open_probes = 2

[[routes]]
name = "r"
path_prefix = "/r/"
upstream = "up"
"#
    );
    Config::parse(&src, Path::new("circuit_shared.toml"), &|_| None).expect("config")
}

/// One replica: its own metrics, Redis connection, mirror and background tasks.
struct Replica {
    circuits: Arc<Circuits>,
    metrics: Arc<Metrics>,
    redis: RedisHandle,
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Replica {
    fn start(redis_url: &str) -> Replica {
        let config = config(redis_url);
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let tasks = TaskTracker::new();
        let stop = CancellationToken::new();
        let redis = RedisHandle::start(
            config.redis.clone().expect("redis"),
            metrics.clone(),
            &tasks,
            stop.clone(),
        );
        let circuits = Arc::new(Circuits::new(&config, metrics.clone()));
        circuits.start(Some(redis.clone()), &tasks, stop.clone());
        Replica {
            circuits,
            metrics,
            redis,
            tasks,
            stop,
        }
    }

    /// Fleet syncs that Redis answered (each sends this replica's deltas and reads the fleet's
    /// state).
    fn syncs(&self) -> u64 {
        self.metrics
            .redis_command_duration_seconds
            .with_label_values(&["circuit_sync"])
            .get_sample_count()
    }

    /// Fleet syncs that failed (Redis down).
    fn failed_syncs(&self) -> u64 {
        self.metrics
            .redis_errors_total
            .with_label_values(&["circuit_sync"])
            .get()
    }

    fn state(&self) -> CircuitState {
        self.circuits.state("up", time::now()).expect("a breaker")
    }

    fn admit(&self) -> Admission {
        self.circuits.admit("up", Attempt::First, time::now())
    }

    fn fail(&self, n: usize) {
        for _ in 0..n {
            match self.admit() {
                Admission::Allowed(p) => p.record(Outcome::Status(StatusCode::BAD_GATEWAY), None, time::now()),
                Admission::Rejected { .. } => panic!("rejected while failing"),
            }
        }
    }

    fn succeed(&self, n: usize) {
        for _ in 0..n {
            match self.admit() {
                Admission::Allowed(p) => p.record(Outcome::Status(StatusCode::OK), None, time::now()),
                Admission::Rejected { .. } => panic!("rejected while succeeding"),
            }
        }
    }

    async fn shutdown(self) {
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

async fn fleet(redis: &RedisServer) -> [Replica; 3] {
    let fleet = [
        Replica::start(&redis.url()),
        Replica::start(&redis.url()),
        Replica::start(&redis.url()),
    ];
    for r in &fleet {
        assert!(
            eventually(Duration::from_secs(10), || r.redis.is_up()).await,
            "redis up"
        );
    }
    // A few syncs each (their subscriptions are made before their first sync).
    after_syncs(&fleet.iter().collect::<Vec<_>>(), 2, false).await;
    fleet
}

/// Waits until every replica of `fleet` has made `n` more fleet syncs (`failed`: failed ones,
/// while Redis is down): the event after which what they could learn through Redis, they have.
async fn after_syncs(fleet: &[&Replica], n: u64, failed: bool) {
    let count = |r: &Replica| if failed { r.failed_syncs() } else { r.syncs() };
    let from: Vec<u64> = fleet.iter().map(|r| count(r)).collect();
    let done = eventually(Duration::from_secs(10), || {
        fleet.iter().zip(&from).all(|(r, f)| count(r) >= f + n)
    })
    .await;
    assert!(done, "the replicas did not sync {n} more times within 10 s");
}

/// Whether every replica of `fleet` reaches a state that satisfies `want` within `within`.
async fn fleet_reaches(fleet: &[&Replica], within: Duration, want: impl Fn(CircuitState) -> bool) -> bool {
    eventually(within, || fleet.iter().all(|r| want(r.state()))).await
}

/// Admits on every replica every 10 ms for `during`, keeping every permit: the probes granted.
async fn collect_probes(fleet: &[&Replica], during: Duration) -> Vec<Permit> {
    let mut probes = Vec::new();
    let end = Instant::now() + during;
    while Instant::now() < end {
        for r in fleet {
            if let Admission::Allowed(p) = r.admit() {
                assert!(p.is_probe(), "only probes while half-open");
                probes.push(p);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    probes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_on_one_replica_open_the_fleet_and_the_fleet_probes_at_most_half_open_probes() {
    let redis = RedisServer::start();
    let [a, b, c] = fleet(&redis).await;

    let a0 = a.syncs();
    let before = time::now();
    a.fail(3);
    assert_eq!(a.state(), CircuitState::Open, "A trips on its own at once");
    // A's trip is sent at once (an urgent sync) and published: B and C open within one sync of
    // their own after it landed (counted in syncs, not in wall time: a loaded machine slows both).
    assert!(
        eventually(Duration::from_secs(3), || a.syncs() > a0).await,
        "A's trip was sent"
    );
    let (b1, c1) = (b.syncs(), c.syncs());
    let took = time_until(Duration::from_secs(3), || {
        b.state() == CircuitState::Open && c.state() == CircuitState::Open
    })
    .await
    .expect("B and C follow A");
    assert!(
        b.syncs() <= b1 + 1 && c.syncs() <= c1 + 1,
        "B and C opened after {} and {} syncs of their own",
        b.syncs() - b1,
        c.syncs() - c1
    );
    eprintln!("fleet: B and C opened {took:?} after A's failures (sync_interval {SYNC:?})");
    // B is open for open_for (plus its upward jitter of up to 10%): not ending before A's open
    // time does (to the millisecond the wire carries, plus the reading of two clocks), nor later
    // than that after B learned of it, however long the news took to travel.
    let asked = time::now();
    match b.admit() {
        Admission::Rejected { retry_after } => {
            let ends = asked + retry_after;
            let slack = Duration::from_millis(50);
            // tidy: not a time limit
            assert!(
                ends + slack >= before + OPEN_FOR && retry_after <= OPEN_FOR + OPEN_FOR / 10 + slack,
                "B's open time ends {:?} after A tripped, {retry_after:?} after B learned of it",
                ends.saturating_duration_since(before)
            );
        }
        Admission::Allowed(_) => panic!("B must reject while open"),
    }

    // Half-open: whatever the three replicas ask, the fleet grants at most `half_open_probes`.
    let all = [&a, &b, &c];
    assert!(fleet_reaches(&all, Duration::from_secs(3), |s| s != CircuitState::Open).await);
    let probes = collect_probes(&all, Duration::from_millis(1500)).await;
    assert!(!probes.is_empty(), "the fleet must probe");
    assert!(
        probes.len() <= PROBES,
        "{} probes granted across the fleet",
        probes.len()
    );
    eprintln!(
        "fleet: {} probe(s) granted across three replicas in 1.5 s",
        probes.len()
    );

    // Their successes close the fleet circuit everywhere (once `half_open_probes` succeeded).
    let granted = probes.len();
    for p in probes {
        p.record(Outcome::Status(StatusCode::OK), None, time::now());
    }
    if granted < PROBES {
        // The rest of the probes, granted now that a slot has been used.
        let more = collect_probes(&all, Duration::from_millis(1500)).await;
        assert!(more.len() <= PROBES - granted, "{} more probes", more.len());
        for p in more {
            p.record(Outcome::Status(StatusCode::OK), None, time::now());
        }
    }
    let before: Vec<u64> = all.iter().map(|r| r.syncs()).collect();
    let took = time_until(Duration::from_secs(2), || {
        all.iter().all(|r| r.state() == CircuitState::Closed)
    })
    .await
    .expect("the fleet closes");
    // Within two syncs of each replica: the probe's success sent, then read (not wall time).
    for (r, s) in all.iter().zip(&before) {
        assert!(r.syncs() <= s + 2, "closed after {} syncs", r.syncs() - s);
    }
    eprintln!("fleet: closed everywhere {took:?} after the probes' successes");
    b.succeed(1);

    for r in [a, b, c] {
        r.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_probe_reopens_the_fleet_for_longer() {
    let redis = RedisServer::start();
    let [a, b, c] = fleet(&redis).await;
    a.fail(3);
    assert!(eventually(Duration::from_secs(2), || c.state() == CircuitState::Open).await);
    let all = [&a, &b, &c];
    assert!(fleet_reaches(&all, Duration::from_secs(3), |s| s != CircuitState::Open).await);
    let probes = collect_probes(&all, Duration::from_millis(500)).await;
    assert!(!probes.is_empty() && probes.len() <= PROBES);
    let opened = Instant::now();
    for p in probes {
        p.record(Outcome::ConnectFailure, None, time::now());
    }
    assert!(fleet_reaches(&all, Duration::from_secs(1), |s| s == CircuitState::Open).await);
    // The second opening lasts twice as long: each replica's open time ends 2 s after the probe
    // failed, not 1 s (read from the breaker, not slept for).
    for (name, r) in ["A", "B", "C"].iter().zip(all) {
        let asked = time::now();
        match r.admit() {
            Admission::Rejected { retry_after } => {
                let open_for = (asked + retry_after).saturating_duration_since(opened);
                assert!(
                    open_for >= Duration::from_millis(1900),
                    "{name}: re-opened for {open_for:?}"
                );
            }
            Admission::Allowed(_) => panic!("{name}: admitted while re-opened"),
        }
    }
    assert!(fleet_reaches(&all, Duration::from_secs(5), |s| s != CircuitState::Open).await);
    for r in [a, b, c] {
        r.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_failing_alone_does_not_open_a_fleet_that_succeeds() {
    let redis = RedisServer::start();
    let [a, b, c] = fleet(&redis).await;
    b.succeed(30);
    c.succeed(30);
    // Their successes reach the fleet's counters (a sync sends what was counted before it).
    after_syncs(&[&b, &c], 2, false).await;
    a.fail(3);
    assert_eq!(a.state(), CircuitState::Open);
    // A's failures reach the fleet, then B and C read the fleet's state after them.
    after_syncs(&[&a], 2, false).await;
    after_syncs(&[&b, &c], 2, false).await;
    assert_eq!(
        b.state(),
        CircuitState::Closed,
        "3 failures in 63 calls: the fleet stays closed"
    );
    assert_eq!(c.state(), CircuitState::Closed);
    for r in [a, b, c] {
        r.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_each_replica_runs_locally_and_they_converge_when_it_returns() {
    let mut redis = RedisServer::start();
    let [a, b, c] = fleet(&redis).await;
    let all = [&a, &b, &c];

    // The fleet is open when Redis goes away.
    a.fail(3);
    assert!(fleet_reaches(&all, Duration::from_secs(2), |s| s == CircuitState::Open).await);
    redis.stop();

    // The request path never waits for Redis: admission is a synchronous call on the local
    // mirror (it has no `.await` to wait on), and it keeps answering with Redis gone.
    for _ in 0..1000 {
        let _ = b.admit();
    }

    // Once the open time is up, every replica probes on its own (no lease to wait for): the
    // half-open state cannot wedge on a missing Redis.
    assert!(fleet_reaches(&all, Duration::from_secs(3), |s| s != CircuitState::Open).await);
    // Each has tried (and failed) to reach the fleet since: what it does next, it does alone.
    after_syncs(&all, 2, true).await;
    for r in all {
        let probes = collect_probes(&[r], Duration::from_millis(100)).await;
        assert!(!probes.is_empty(), "a replica probes locally without Redis");
        for p in probes {
            p.record(Outcome::Status(StatusCode::OK), None, time::now());
        }
    }
    assert!(fleet_reaches(&all, Duration::from_secs(1), |s| s == CircuitState::Closed).await);

    // Local breakers keep working: B trips alone, the others know nothing of it.
    b.fail(3);
    assert_eq!(b.state(), CircuitState::Open);
    // A and C try to sync (and fail) three times each: nothing reaches them without Redis.
    after_syncs(&[&a, &c], 3, true).await;
    assert_eq!(a.state(), CircuitState::Closed);
    assert_eq!(c.state(), CircuitState::Closed);

    // Redis is back (empty): the replicas rejoin without a restart. B's failures from the outage
    // are still in the window: they reach the fleet, and A and C follow.
    redis.restart();
    let back = Instant::now();
    let took = time_until(Duration::from_secs(5), || {
        all.iter().all(|r| r.state() == CircuitState::Open)
    })
    .await
    .expect("the fleet converges after Redis returns");
    eprintln!("fleet: after the outage, all open {took:?} after Redis restarted");
    for r in all {
        // The health check runs every second: it may lag behind the reconnection.
        assert!(
            eventually(Duration::from_secs(5), || r.redis.is_up()).await,
            "reconnected"
        );
    }
    // And it is one fleet again: one half-open phase, at most `half_open_probes` probes in all.
    assert!(fleet_reaches(&all, Duration::from_secs(3), |s| s != CircuitState::Open).await);
    let probes = collect_probes(&all, Duration::from_millis(1000)).await;
    assert!(!probes.is_empty() && probes.len() <= PROBES, "{} probes", probes.len());
    eprintln!("fleet: one half-open phase {:?} after Redis restarted", back.elapsed());
    for r in [a, b, c] {
        r.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cooldown_noted_on_one_replica_holds_that_credential_everywhere() {
    let redis = RedisServer::start();
    let [a, b, c] = fleet(&redis).await;
    let k1 = LimitKey::from(CredentialHash([1; 16]));
    let k2 = LimitKey::from(CredentialHash([2; 16]));
    let now = time::now();
    let a0 = a.syncs();
    a.circuits.cooldown_note("up", k1, now + Duration::from_secs(3), now);
    assert!(a.circuits.cooldown_check("up", &k1, time::now()).is_some());
    // Sent at once and published: B and C hold it within one sync of their own after it landed
    // (counted in syncs, not in wall time).
    assert!(
        eventually(Duration::from_secs(3), || a.syncs() > a0).await,
        "A's cooldown was sent"
    );
    let (b1, c1) = (b.syncs(), c.syncs());
    let took = time_until(Duration::from_secs(2), || {
        b.circuits.cooldown_check("up", &k1, time::now()).is_some()
            && c.circuits.cooldown_check("up", &k1, time::now()).is_some()
    })
    .await
    .expect("B and C see A's cooldown");
    assert!(
        b.syncs() <= b1 + 1 && c.syncs() <= c1 + 1,
        "B and C held it after {} and {} syncs of their own",
        b.syncs() - b1,
        c.syncs() - c1
    );
    eprintln!("cooldown: B and C held the credential {took:?} after A noted it");
    // The same end everywhere: B's time left ends when A's cooldown ends (to the millisecond the
    // wire carries, plus the reading of two clocks), however long the trip took.
    let asked = time::now();
    let left = b.circuits.cooldown_check("up", &k1, asked).unwrap();
    let (ends, want) = (asked + left, now + Duration::from_secs(3));
    let skew = if ends > want { ends - want } else { want - ends };
    // tidy: not a time limit
    assert!(
        skew <= Duration::from_millis(50),
        "B's cooldown ends {skew:?} away from A's"
    );
    assert_eq!(
        b.circuits.cooldown_check("up", &k2, time::now()),
        None,
        "another credential is free"
    );

    // A replica that starts later (it missed the message) learns it at its first sync.
    let d = Replica::start(&redis.url());
    assert!(
        eventually(Duration::from_secs(3), || d
            .circuits
            .cooldown_check("up", &k1, time::now())
            .is_some())
        .await
    );
    assert_eq!(d.circuits.cooldown_check("up", &k2, time::now()), None);

    // It ends when it should, everywhere.
    assert!(
        eventually(Duration::from_secs(4), || {
            [&a, &b, &c, &d]
                .iter()
                .all(|r| r.circuits.cooldown_check("up", &k1, time::now()).is_none())
        })
        .await
    );
    assert!(now.elapsed() >= Duration::from_millis(2900));
    for r in [a, b, c, d] {
        r.shutdown().await;
    }
}
