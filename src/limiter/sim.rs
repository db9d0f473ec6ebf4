//! A deterministic simulation of the fleet's limit protocol: several replicas, each
//! its own [`Limiter`] running the product's admission, queue and settlement code
//! ([`Limiter::wait_admit`], `Pass::settle`), share a simulated Redis whose operations keep the
//! contracts of the four scripts (`limit_lease_v1`, `limit_adjust_v1`, `limit_slots_v2`,
//! `limit_queue_v2`: the fleet queue's order is `limits::fair_queue`'s, which the script mirrors
//! and `tests/it/limiter_store.rs` checks on a real Redis). Time is tokio's paused clock and every
//! choice comes from a seeded RNG, so a schedule replays exactly; replicas lose Redis (refused,
//! or frozen until their command timeout) and die (their holdings expire, their requests vanish).
//!
//! What each schedule must show: a concurrent limit never has more requests in flight than it
//! allows; a window's quota is never exceeded beyond the documented bound; no waiter is admitted
//! after its deadline; under saturation the slots stay busy (at least 90%), a freed slot reaches
//! a waiter on any replica within 200 ms, and each `share_by` value gets its weighted share
//! within 10%.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};

use super::store::{
    CounterId, Counters, Demand, Granted, Leaser, QueueAnswer, QueueCaller, QueueOp, SlotsCaller, SlotsHeld,
};
use super::{Ask, Limit, Limiter, Subject, Timing};
use crate::config::Config;
use crate::limits::fair_queue::{FairQueue, Ticket};
use crate::limits::key::{BucketKey, KeyInput};
use crate::redis::RedisError;
use crate::time::Instant;

/// How a replica reaches the simulated Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Link {
    Up,
    /// Refused at once (connection refused).
    Down,
    /// Nothing answers until the command timeout (SIGSTOP).
    Frozen,
}

/// One replica's handle on the simulated Redis.
pub struct SimCall {
    redis: Arc<parking_lot::Mutex<SimRedis>>,
    link: Arc<parking_lot::Mutex<Link>>,
    timeout: Duration,
}

impl SimCall {
    /// One command: applied at once, refused, or timed out, as the replica's link is.
    pub(crate) async fn call<T>(&self, apply: impl FnOnce(&mut SimRedis) -> T) -> Result<T, RedisError> {
        let link = *self.link.lock();
        match link {
            Link::Up => Ok(apply(&mut self.redis.lock())),
            Link::Down => Err(RedisError::NotConnected),
            Link::Frozen => {
                tokio::time::sleep(self.timeout).await;
                Err(RedisError::Timeout {
                    op: "sim",
                    timeout: self.timeout,
                })
            }
        }
    }
}

/// A bucket's slot holdings, by replica.
type Holdings = HashMap<String, Holding>;

/// One replica's holding of a bucket's slots.
struct Holding {
    slots: u64,
    /// Until when it counts (simulated ms), unless renewed.
    expiry: u64,
    /// The number of the declaration that set it.
    seq: u64,
}

/// The simulated Redis: the scripts' state.
pub(crate) struct SimRedis {
    start: Instant,
    counters: HashMap<CounterId, u64>,
    /// Per bucket (limit, bucket): replica -> until when it counts (the lease script's hash).
    leasers: HashMap<(String, String), HashMap<String, u64>>,
    /// Per bucket: each replica's holding of its slots.
    holdings: HashMap<(String, String), Holdings>,
    queues: HashMap<(String, String), SimQueue>,
    /// Replica -> until when it is live in the queues.
    live: HashMap<String, u64>,
}

#[derive(Default)]
struct SimQueue {
    fair: Option<FairQueue<u64>>,
    /// Member (replica, ticket) -> the fair queue's ticket, and back.
    tickets: HashMap<(String, u64), Ticket>,
    members: HashMap<Ticket, (String, u64)>,
    shares: HashMap<String, u64>,
}

impl SimRedis {
    fn new() -> SimRedis {
        SimRedis {
            start: crate::time::now(),
            counters: HashMap::new(),
            leasers: HashMap::new(),
            holdings: HashMap::new(),
            queues: HashMap::new(),
            live: HashMap::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        crate::time::now().saturating_duration_since(self.start).as_millis() as u64
    }

    pub(crate) fn lease(&mut self, id: &CounterId, demand: Demand, leaser: Leaser<'_>) -> Granted {
        let now = self.now_ms();
        let used = self.counters.entry(id.clone()).or_insert(0);
        let granted = demand.want.min(demand.limit.saturating_sub(*used));
        *used += granted;
        let fleet_used = *used;
        let leasers = self.leasers.entry((id.limit.clone(), id.bucket.clone())).or_default();
        leasers.insert(leaser.replica.to_string(), now + leaser.liveness.as_millis() as u64);
        leasers.retain(|_, until| *until >= now);
        let replicas = leasers.len() as u32;
        let waiting = self.waiting(&id.limit, &id.bucket);
        Granted {
            granted,
            fleet_used,
            replicas,
            waiting,
        }
    }

    pub(crate) fn adjust(&mut self, id: &CounterId, amount: i64) -> u64 {
        let used = self.counters.entry(id.clone()).or_insert(0);
        *used = used.saturating_add_signed(amount);
        *used
    }

    pub(crate) fn hold_slots(&mut self, caller: SlotsCaller<'_>, demand: Demand, ttl: Duration) -> SlotsHeld {
        let (replica, seq) = (caller.replica, caller.seq);
        let now = self.now_ms();
        let waiting = self.waiting(caller.limit, caller.bucket);
        let held = self
            .holdings
            .entry((caller.limit.to_string(), caller.bucket.to_string()))
            .or_default();
        held.retain(|_, h| h.expiry > now);
        let others: u64 = held.iter().filter(|(r, _)| *r != replica).map(|(_, h)| h.slots).sum();
        let holders = 1 + held.keys().filter(|r| *r != replica).count() as u32;
        if let Some(h) = held.get(replica).filter(|h| seq < h.seq) {
            return SlotsHeld {
                granted: h.slots,
                waiting,
                holders,
            };
        }
        let granted = demand.want.min(demand.limit.saturating_sub(others));
        match granted {
            0 => held.remove(replica),
            n => held.insert(
                replica.to_string(),
                Holding {
                    slots: n,
                    expiry: now + ttl.as_millis() as u64,
                    seq,
                },
            ),
        };
        SlotsHeld {
            granted,
            waiting,
            holders,
        }
    }

    fn waiting(&self, limit: &str, bucket: &str) -> u64 {
        self.queues
            .get(&(limit.to_string(), bucket.to_string()))
            .and_then(|q| q.fair.as_ref())
            .map_or(0, |f| f.len() as u64)
    }

    pub(crate) fn queue(&mut self, caller: &QueueCaller<'_>, op: QueueOp<'_>, liveness: Duration) -> QueueAnswer {
        let now_ms = self.now_ms();
        let now = crate::time::now();
        self.live
            .insert(caller.replica.to_string(), now_ms + liveness.as_millis() as u64);
        let live = self.live.clone();
        let q = self
            .queues
            .entry((caller.limit.to_string(), caller.bucket.to_string()))
            .or_default();
        let fair = q.fair.get_or_insert_with(|| FairQueue::new(100_000));
        for gone in fair.expire(now) {
            if let Some(m) = q.members.remove(&gone.ticket) {
                q.tickets.remove(&m);
            }
        }
        // A first entry of a replica no longer live is dropped.
        while let Some(first) = fair.peek().map(|e| e.ticket) {
            let owner = q.members.get(&first).map(|(r, _)| r.clone()).unwrap_or_default();
            if live.get(&owner).is_some_and(|until| *until >= now_ms) {
                break;
            }
            fair.remove(first);
            if let Some(m) = q.members.remove(&first) {
                q.tickets.remove(&m);
            }
        }
        let member = (caller.replica.to_string(), caller.ticket);
        let (mut result, mut mine) = (-1, None);
        match op {
            QueueOp::Join {
                share,
                weight,
                deadline_ms,
            } => {
                let ids = q.shares.len() as u64;
                let share = *q.shares.entry(share.to_string()).or_insert(ids);
                let left = deadline_ms.saturating_sub(crate::time::now_unix_ms());
                if let Ok(t) = fair.push(share, weight, 1, now + Duration::from_millis(left)) {
                    q.tickets.insert(member.clone(), t);
                    q.members.insert(t, member);
                    result = 0;
                }
            }
            QueueOp::Head => {
                if q.tickets.contains_key(&member) {
                    let first = fair.peek().and_then(|e| q.members.get(&e.ticket)).cloned();
                    result = i64::from(first.as_ref() != Some(&member));
                    mine = first.filter(|(r, _)| r == caller.replica).map(|(_, t)| t);
                }
            }
            QueueOp::Done { served } => {
                if let Some(t) = q.tickets.remove(&member) {
                    q.members.remove(&t);
                    match (served, fair.peek().map(|e| e.ticket)) {
                        (true, Some(first)) if first == t => {
                            fair.pop();
                        }
                        _ => {
                            fair.remove(t);
                        }
                    }
                }
            }
        }
        QueueAnswer {
            result,
            mine,
            waiting: fair.len() as u64,
        }
    }
}

/// A fleet of simulated replicas on one simulated Redis.
struct Fleet {
    replicas: Vec<Replica>,
}

struct Replica {
    limiter: Arc<Limiter>,
    link: Arc<parking_lot::Mutex<Link>>,
}

impl Fleet {
    fn new(limit: &str, n: usize) -> Fleet {
        let src = format!(
            "[upstreams.u]\nurl = \"http://127.0.0.1:9\"\n[[routes]]\nname = \"r\"\npath_prefix = \"/r/\"\nupstream = \"u\"\nlimits = [\"l\"]\n[limits.l]\n{limit}"
        );
        let config = Config::parse(&src, std::path::Path::new("sim.toml"), &|_| None).expect("config");
        let redis = Arc::new(parking_lot::Mutex::new(SimRedis::new()));
        let metrics = crate::metrics::Metrics::new().expect("metrics");
        let replicas = (0..n)
            .map(|_| {
                let link = Arc::new(parking_lot::Mutex::new(Link::Up));
                let store = Counters::Sim(SimCall {
                    redis: redis.clone(),
                    link: link.clone(),
                    timeout: Duration::from_millis(100),
                });
                let limiter = Limiter::new(&config, Arc::new(store), Arc::default(), &metrics);
                Replica {
                    limiter: Arc::new(limiter),
                    link,
                }
            })
            .collect();
        Fleet { replicas }
    }
}

/// The simulated wall clock (the limits' windows): a fixed instant 50 s before a minute ends,
/// moved by tokio's paused clock.
fn clock(start: Instant) -> impl Fn() -> u64 + Sync {
    const BASE: u64 = 1_796_385_610_000;
    move || BASE + crate::time::now().saturating_duration_since(start).as_millis() as u64
}

fn headers(team: &str) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    h.insert("x-team", http::HeaderValue::from_str(team).expect("a team"));
    h
}

/// The wall clock the limits' windows read.
type Clock<'c> = &'c (dyn Fn() -> u64 + Sync);

/// What a saturated run of a queued concurrent limit showed.
#[derive(Debug, Default)]
struct Saturated {
    /// Admissions per team.
    admitted: HashMap<&'static str, u64>,
    /// Slot-milliseconds busy, and the run's length in ms.
    busy_ms: u64,
    run_ms: u64,
    /// The most requests in flight at once.
    most_in_flight: u64,
    /// The longest time a freed slot stayed free while a request waited for it, in ms.
    longest_idle_ms: u64,
    /// Admissions past the request's deadline.
    late: u64,
    /// Requests turned away (their wait ran out).
    turned: u64,
}

/// The fleet a saturated run drives: its replicas, the limit's concurrent slots, and the
/// closed-loop clients that send to it.
struct Setup {
    replicas: usize,
    cap: u64,
    clients: usize,
}

/// Runs `setup.clients` closed-loop clients (on replicas in turn, teams chat and batch in turn)
/// for `run` against a `concurrent = setup.cap` queued limit shared by team 4 : 1 on
/// `setup.replicas`; each gives up after a deadline drawn from `seed` and sends again.
async fn saturate(seed: u64, setup: Setup, run: Duration) -> Saturated {
    let Setup { replicas, cap, clients } = setup;
    let limit = format!(
        "key = \"route\"\nconcurrent = {cap}\non_limit = \"queue\"\nmax_wait = \"10s\"\nshare_by = \"header:x-team\"\nweights = {{ chat = 4, batch = 1 }}"
    );
    let fleet = Fleet::new(&limit, replicas);
    let start = crate::time::now();
    let stats = Arc::new(parking_lot::Mutex::new(Books::new(start, cap)));
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let limiter = fleet.replicas[c % replicas].limiter.clone();
        let team: &'static str = if c % 2 == 0 { "chat" } else { "batch" };
        let stats = stats.clone();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 1000 + c as u64);
        tasks.spawn(async move {
            let now_ms = clock(start);
            while crate::time::now().saturating_duration_since(start) < run {
                let arrived = crate::time::now();
                let deadline = arrived + Duration::from_millis(rng.random_range(300..3000));
                let timing = Timing {
                    started: arrived,
                    deadline,
                };
                let waited = ask(&limiter, team, timing, &now_ms).await;
                let Some(pass) = waited else {
                    // Turned away: the client sends it again (a round trip later).
                    stats.lock().turned();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                stats.lock().admitted(team, deadline);
                tokio::time::sleep(Duration::from_millis(rng.random_range(50..400))).await;
                stats.lock().released();
                pass.settle(None, now_ms());
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a client");
    }
    let books = stats.lock();
    let mut s = std::mem::take(&mut *books.sat.lock());
    s.run_ms = crate::time::now().saturating_duration_since(start).as_millis() as u64;
    s
}

/// What the clients did, as it happened.
struct Books {
    sat: parking_lot::Mutex<Saturated>,
    in_flight: u64,
    since: Instant,
    /// When each free slot was freed, oldest first.
    free: std::collections::VecDeque<Instant>,
}

impl Books {
    fn new(start: Instant, cap: u64) -> Books {
        Books {
            sat: parking_lot::Mutex::new(Saturated::default()),
            in_flight: 0,
            since: start,
            free: (0..cap).map(|_| start).collect(),
        }
    }

    /// The time since the last event, at the requests in flight then.
    fn tick(&mut self) -> Instant {
        let t = crate::time::now();
        let ms = t.saturating_duration_since(self.since).as_millis() as u64;
        self.sat.get_mut().busy_ms += self.in_flight * ms;
        self.since = t;
        t
    }

    fn admitted(&mut self, team: &'static str, deadline: Instant) {
        let t = self.tick();
        self.in_flight += 1;
        let freed = self.free.pop_front();
        let sat = self.sat.get_mut();
        *sat.admitted.entry(team).or_default() += 1;
        sat.late += u64::from(t > deadline);
        sat.most_in_flight = sat.most_in_flight.max(self.in_flight);
        if let Some(freed) = freed {
            let idle = t.saturating_duration_since(freed).as_millis() as u64;
            sat.longest_idle_ms = sat.longest_idle_ms.max(idle);
        }
    }

    fn turned(&mut self) {
        self.sat.get_mut().turned += 1;
    }

    fn released(&mut self) {
        let t = self.tick();
        self.in_flight -= 1;
        self.free.push_back(t);
    }
}

#[tokio::test(start_paused = true)]
async fn a_saturated_queued_limit_keeps_its_slots_busy_and_its_weights_on_three_replicas() {
    for seed in 0..4 {
        let setup = Setup {
            replicas: 3,
            cap: 8,
            clients: 40,
        };
        let s = saturate(seed, setup, Duration::from_secs(30)).await;
        assert!(
            s.most_in_flight <= 8,
            "seed {seed}: {} in flight of 8",
            s.most_in_flight
        );
        assert_eq!(s.late, 0, "seed {seed}: admitted after their deadline");
        let busy = s.busy_ms as f64 / (8 * s.run_ms) as f64;
        assert!(
            busy >= 0.9,
            "seed {seed}: {:.0}% of the slots busy: {s:?}",
            busy * 100.0
        );
        assert!(
            s.longest_idle_ms <= 200,
            "seed {seed}: a freed slot waited {} ms for a waiter",
            s.longest_idle_ms
        );
        let chat = s.admitted["chat"] as f64 / (s.admitted["chat"] + s.admitted["batch"]) as f64;
        assert!(
            (0.72..=0.88).contains(&chat),
            "seed {seed}: chat had {:.0}%: {s:?}",
            chat * 100.0
        );
    }
}

/// A request of `team` to a replica's `limiter`: the product's wait for its limits.
async fn ask(limiter: &Limiter, team: &str, timing: Timing, now_ms: Clock<'_>) -> Option<super::Pass> {
    let limits = limiter.for_route(&["l".into()]);
    let h = headers(team);
    let input = KeyInput {
        route: "r",
        credential: crate::credentials::CredentialHash([0; 16]),
        model: None,
        headers: &h,
    };
    let buckets: Vec<BucketKey> = limits.iter().map(|l| l.bucket(&input)).collect();
    let share = |l: &Limit, b: BucketKey| l.share(b, &input);
    let subject = Subject {
        limits: &limits,
        buckets: &buckets,
        share: &share,
    };
    let ask = Ask {
        want: super::Want::default(),
        price: None,
    };
    limiter
        .wait_admit(subject, ask, timing, now_ms)
        .await
        .ok()
        .map(|a| a.pass)
}

/// `concurrent = 1` on three replicas at low load: a request holds the slot on one replica while
/// a request waits on another; when the first ends, the waiter has the slot within 200 ms (it
/// waited until its deadline and got 429 when the freed slot stayed idle on the first replica).
#[tokio::test(start_paused = true)]
async fn a_slot_freed_on_one_replica_reaches_a_waiter_on_another_within_200_ms() {
    for seed in 0..20 {
        let fleet = Fleet::new("key = \"route\"\nconcurrent = 1\non_limit = \"queue\"", 3);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let start = crate::time::now();
        let now_ms = clock(start);
        let (a, b) = (rng.random_range(0..3), rng.random_range(0..3));
        let (a, b) = (&fleet.replicas[a], &fleet.replicas[(a + 1 + b % 2) % 3]);
        let far = start + Duration::from_secs(60);
        let timing = Timing {
            started: start,
            deadline: far,
        };
        let held = ask(&a.limiter, "chat", timing, &now_ms).await.expect("the slot");
        let hold = Duration::from_millis(rng.random_range(100..3000));
        let waiter = async {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..50))).await;
            let arrived = crate::time::now();
            let timing = Timing {
                started: arrived,
                deadline: arrived + Duration::from_secs(20),
            };
            let pass = ask(&b.limiter, "chat", timing, &now_ms).await;
            (pass, crate::time::now())
        };
        let release = async {
            tokio::time::sleep(hold).await;
            held.settle(None, now_ms());
            crate::time::now()
        };
        let ((pass, admitted), released) = tokio::join!(waiter, release);
        assert!(pass.is_some(), "seed {seed}: the waiter never had the slot");
        let after = admitted.saturating_duration_since(released);
        assert!(
            after <= Duration::from_millis(200),
            "seed {seed}: admitted {after:?} after the release"
        );
    }
}

/// `requests_per_minute = 120` on three replicas with `redis_down = "local"`, under random
/// traffic; one replica loses Redis (refused, or frozen: each call waits out the 100 ms timeout)
/// for part of the window, another dies. The fleet admits at most the limit plus the cut-off
/// replica's share (it counts alone up to `limit / replicas`, what Redis granted it included).
#[tokio::test(start_paused = true)]
async fn a_window_holds_while_a_replica_loses_redis_and_another_dies() {
    for seed in 0..12 {
        let fleet = Fleet::new(
            "key = \"route\"\nrequests_per_minute = 120\non_limit = \"reject\"\nredis_down = \"local\"",
            3,
        );
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let start = crate::time::now();
        let now_ms = clock(start);
        let cut = rng.random_range(0..3);
        let dead = (cut + 1) % 3;
        let link = if rng.random_bool(0.5) { Link::Down } else { Link::Frozen };
        let (cut_at, back_at, dies_at) = (
            rng.random_range(0..20_000u64),
            rng.random_range(20_000..45_000u64),
            rng.random_range(0..45_000u64),
        );
        let mut admitted = [0u64; 3];
        let mut t = 0;
        // Within the window (50 s are left of it at the start).
        while t < 48_000 {
            t += rng.random_range(1..200);
            tokio::time::sleep_until(start + Duration::from_millis(t)).await;
            *fleet.replicas[cut].link.lock() = if (cut_at..back_at).contains(&t) { link } else { Link::Up };
            let r = rng.random_range(0..3);
            if r == dead && t >= dies_at {
                *fleet.replicas[dead].link.lock() = Link::Down;
                continue;
            }
            let now = crate::time::now();
            let timing = Timing {
                started: now,
                deadline: now + Duration::from_secs(5),
            };
            if let Some(pass) = ask(&fleet.replicas[r].limiter, "t", timing, &now_ms).await {
                admitted[r] += 1;
                pass.settle(None, now_ms());
            }
        }
        let total: u64 = admitted.iter().sum();
        assert!(
            total <= 120 + 40,
            "seed {seed}: the fleet admitted {total}: {admitted:?}"
        );
    }
}
