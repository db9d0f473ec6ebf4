//! The chaos suite: 3 rebound replicas (the real binary) sharing one redis-server, the
//! fake provider with a fault on ~30% of calls, clients sending mixed unary and streamed requests
//! (half keyed, each keyed request sent twice at once and once more after), and during the run:
//! Redis SIGKILLed and restarted empty, Redis frozen for 5 s, a replica SIGKILLed mid-request (and
//! mid-stream, with followers of its streams on the other two: (h), owner liveness) and restarted,
//! a replica SIGTERMed with streams in flight and restarted, an invalid config reloaded.
//! The invariants are checked from the provider's ledger and the clients' results and printed as
//! a table (`cargo test --test chaos -- --nocapture`).
//!
//! `REBOUND_CHAOS_MINUTES=N` runs a soak of N minutes (injections repeated, 200 req/s unless
//! `REBOUND_CHAOS_RATE` says otherwise) and reports the replicas' RSS over time;
//! `REBOUND_CHAOS_SEED` replaces the fixed seed.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the clock and lock rules are the product's: harnesses measure real time and keep their own fixtures
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test harness fails loudly by design

#[path = "../it/support/mod.rs"]
#[allow(unused_imports)] // the re-exports `it` uses
mod support;

mod checks;
mod load;
mod soak;
mod soak_checks;
mod streams;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;

use load::{Clients, Flow, Spec};
use support::redis::RedisServer;
use support::sidecar::ReboundProcess;
use support::{send, try_until, FakeProvider, Step};

const SEED: u64 = 0x5EED_C4A0;
const ADMIN_TOKEN: &str = "chaos-admin-token";
/// `[redis]` of the replicas: (f) is bounded by 2 x sync_interval + command_timeout.
const SYNC_INTERVAL: Duration = Duration::from_millis(250);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(200);
const LEASE: Duration = Duration::from_secs(3);
/// Breakers of their own for the circuit probe of (f), one per Redis recovery: a breaker that
/// opened once stays open on a replica that sends it nothing, so each probe needs a fresh one.
const CIRCUIT_PROBES: usize = 8;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A replica's config: retries with short timeouts, idempotency (follow, 3 s lease, fail closed), a
/// shared circuit and cooldowns on the provider, dead letters, Redis. Two probe routes for (f):
/// `/cd/` (cooldowns rejected at once, dead letters) and `/cb/` (a breaker that trips quickly).
fn config(port: u16, admin_port: u16, provider: &str, redis: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:{port}"
shutdown_grace = "15s"

[admin]
listen = "127.0.0.1:{admin_port}"
token = "{ADMIN_TOKEN}"

[log]
level = "info"

[redis]
url = "{redis}"
command_timeout = "{cmd}ms"
sync_interval = "{sync}ms"

[upstreams.fake]
url = "{provider}"
connect_timeout = "1s"
circuit = "fleet"
cooldown = "wait"

[upstreams.cd]
url = "{provider}"
connect_timeout = "1s"
cooldown = "reject"

[upstreams.live]
url = "{provider}"
connect_timeout = "1s"


[[routes]]
name = "fake"
path_prefix = "/fake/"
upstream = "fake"
strip_prefix = true
retry = "chaos"
idempotency = "chaos"
dead_letters = true

[[routes]]
name = "cd"
path_prefix = "/cd/"
upstream = "cd"
strip_prefix = true
retry = "probe"
idempotency = "chaos"
dead_letters = true

[[routes]]
name = "live"
path_prefix = "/live/"
upstream = "live"
strip_prefix = true
idempotency = "live"

{circuits}
[retry.chaos]
max_attempts = 4
base_delay = "50ms"
max_delay = "400ms"
per_try_timeout = "1500ms"
first_byte_timeout = "1500ms"
stream_idle_timeout = "5s"
deadline = "10s"
retry_on = ["connect-failure", "refused-stream", "reset", "timeout", "429", "502", "503", "504"]
retry_once_on = ["500"]
max_retry_after = "3s"
budget_ratio = 1.0
budget_min_per_second = 1000

[retry.probe]
max_attempts = 2
base_delay = "10ms"
max_delay = "10ms"
retry_on = ["503"]
max_retry_after = "1s"

[circuit.fleet]
consecutive_failures = 50
failure_rate = 0.95
minimum_requests = 200
window = "10s"
open_for = "1s"
max_open_for = "2s"
half_open_probes = 3
shared = true

[circuit.probe]
consecutive_failures = 3
failure_rate = 0.5
minimum_requests = 3
window = "5s"
open_for = "1s"
max_open_for = "1s"
half_open_probes = 1
shared = true

# The shipped lease: a dead owner's key must free long before it (owner liveness, (h)).
[idempotency.live]
lease = "30s"

[idempotency.chaos]
lease = "{lease}s"
on_concurrent = "follow"
wait_timeout = "10s"
on_store_error = "fail_closed"
"#,
        circuits = (0..CIRCUIT_PROBES)
            .map(|i| format!(
                "\n[upstreams.cb{i}]\nurl = \"{provider}\"\ncircuit = \"probe\"\n\n[[routes]]\nname = \"cb{i}\"\npath_prefix = \"/cb{i}/\"\nupstream = \"cb{i}\"\nstrip_prefix = true\n"
            ))
            .collect::<String>(),
        cmd = COMMAND_TIMEOUT.as_millis(),
        sync = SYNC_INTERVAL.as_millis(),
        lease = LEASE.as_secs(),
    )
}

/// One at a time: the chaos test and the soak each load both cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One replica: the real binary on fixed ports, so that a restart comes back where clients look.
struct Replica {
    toml: String,
    /// Its environment (the soak's credential services).
    env: Vec<(&'static str, String)>,
    url: String,
    admin: String,
    process: Option<ReboundProcess>,
}

impl Replica {
    fn process(&self) -> &ReboundProcess {
        self.process.as_ref().expect("replica running")
    }
    fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(|p| p.child.id())
    }
    async fn start(&mut self) {
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.process = Some(ReboundProcess::start(&self.toml, &env).await);
    }
    async fn metrics(&self) -> String {
        send("GET", &format!("{}/metrics", self.admin), &[], "").await.text()
    }
    /// Waits until it has requests in flight (at most 5 s): how many it has.
    async fn busy(&self) -> f64 {
        let inflight = || async {
            match support::metric(&self.metrics().await, "rebound_inflight_requests") {
                n if n >= 2.0 => Ok(n),
                n => Err(n),
            }
        };
        try_until(Duration::from_secs(5), inflight).await.unwrap_or_else(|n| n)
    }
}

/// A time window in which a documented fault may let a key run twice.
#[derive(Clone, Debug)]
pub struct Window {
    pub kind: &'static str,
    pub start: Instant,
    pub end: Instant,
}

/// What the injections did and measured.
#[derive(Default)]
pub struct Injections {
    pub windows: Vec<Window>,
    /// (replica, SIGTERM instant, exit code)
    pub sigterms: Vec<(usize, Instant, Option<i32>)>,
    /// (what, feature, time from Redis back to working again)
    pub recoveries: Vec<(&'static str, &'static str, Option<Duration>)>,
    /// (what, passed, detail)
    pub checks: Vec<(&'static str, bool, String)>,
    pub log: Vec<String>,
    /// When the last replica SIGKILL took effect.
    pub killed_at: Option<Instant>,
}

/// The replicas' RSS over time (for the soak's figure (g)).
type RssSamples = Arc<Mutex<Vec<(Duration, usize, u64)>>>;

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos() {
    let minutes: Option<f64> = std::env::var("REBOUND_CHAOS_MINUTES").ok().and_then(|v| v.parse().ok());
    let seed: u64 = std::env::var("REBOUND_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SEED);
    let rate: f64 = std::env::var("REBOUND_CHAOS_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if minutes.is_some() { 200.0 } else { 30.0 });
    let started = Instant::now();
    eprintln!(
        "chaos: seed {seed}, {rate} flows/s, {}",
        minutes.map_or("bounded run".to_string(), |m| format!("soak of {m} min"))
    );

    let _alone = ONE_AT_A_TIME.lock().await;
    let provider = Arc::new(FakeProvider::start().await);
    let mut redis = RedisServer::start();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let (port, admin_port) = (free_port(), free_port());
        replicas.push(Replica {
            toml: config(port, admin_port, &provider.url(), &redis.url()),
            env: Vec::new(),
            url: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin_port}"),
            process: None,
        });
    }
    for r in &mut replicas {
        r.start().await;
    }
    let clients = Arc::new(Clients {
        urls: replicas.iter().map(|r| r.url.clone()).collect(),
    });

    let load = Load::start(clients.clone(), provider.clone(), seed, rate, Spec::draw);

    // RSS every 5 s.
    let stop = Arc::new(AtomicBool::new(false));
    let rss: RssSamples = Arc::default();
    let pids: Arc<Mutex<Vec<Option<u32>>>> = Arc::new(Mutex::new(replicas.iter().map(Replica::pid).collect()));
    let sampler = {
        let (rss, pids, stop) = (rss.clone(), pids.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let now = started.elapsed();
                let current = pids.lock().unwrap().clone();
                for (i, pid) in current.iter().enumerate() {
                    if let Some(kib) = pid.and_then(rss_kib) {
                        rss.lock().unwrap().push((now, i, kib));
                    }
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        })
    };

    let mut inj = Injections::default();
    let soak_end = minutes.map(|m| started + Duration::from_secs_f64(m * 60.0));
    let mut round = 0;
    loop {
        tokio::time::sleep(Duration::from_secs(6)).await;
        redis_killed(&mut redis, &replicas, &provider, &mut inj, round).await;
        tokio::time::sleep(Duration::from_secs(6)).await;
        redis_frozen(&redis, &replicas, &provider, &mut inj, round).await;
        tokio::time::sleep(Duration::from_secs(6)).await;
        let follows = followed_streams(&replicas, 1, round).await;
        replica_killed(&mut replicas[1], 1, &mut inj).await;
        owner_death_checked(follows, &replicas, &provider, &mut inj).await;
        *pids.lock().unwrap() = replicas.iter().map(Replica::pid).collect();
        tokio::time::sleep(Duration::from_secs(6)).await;
        replica_terminated(&mut replicas[2], 2, &mut inj).await;
        *pids.lock().unwrap() = replicas.iter().map(Replica::pid).collect();
        tokio::time::sleep(Duration::from_secs(4)).await;
        invalid_reload(&replicas[0], &mut inj).await;
        tokio::time::sleep(Duration::from_secs(6)).await;
        round += 1;
        match soak_end {
            Some(end) if Instant::now() + Duration::from_secs(60) < end => continue,
            Some(end) => tokio::time::sleep(end.saturating_duration_since(Instant::now())).await,
            None => {}
        }
        break;
    }
    let load_for = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let (flows, skipped) = load.finish().await;
    sampler.abort();

    // Keys taken over from a replica taken for dead (owner liveness): each one is a second run.
    for (i, r) in replicas.iter().enumerate() {
        let page = r.metrics().await;
        let taken = support::metric(&page, r#"rebound_idempotency_takeovers_total{route="fake"}"#);
        let lines: Vec<String> = r
            .process()
            .logs()
            .lines()
            .filter(|l| l.contains("taken over") || l.contains("liveness record had lapsed"))
            .map(str::to_string)
            .collect();
        say(
            &mut inj,
            started,
            format!("replica {i}: {taken} keys of route fake taken over since its last start {lines:?}"),
        );
    }
    let report = checks::check(&flows, &provider, &mut inj);
    eprintln!("\n{}", inj.log.join("\n"));
    eprintln!("\n{}", report.table(load_for, skipped));
    eprintln!("| check | passed | measured |\n|---|---|---|");
    for (name, ok, detail) in &inj.checks {
        eprintln!("| {name} | {ok} | {detail} |");
    }
    eprintln!("{}", rss_table(&rss.lock().unwrap()));
    eprintln!("chaos: seed {seed}, whole run {:.1} s", started.elapsed().as_secs_f64());
    let failures = report.failures(&inj);
    assert!(failures.is_empty(), "chaos invariants broken:\n{}", failures.join("\n"));
}

/// The clients' load: flows drawn by `draw` and started at `rate` per second, at most 400 at once.
struct Load {
    stop: Arc<AtomicBool>,
    skipped: Arc<AtomicU64>,
    flows: Arc<Mutex<Vec<Flow>>>,
    generator: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(
        clients: Arc<Clients>,
        provider: Arc<FakeProvider>,
        seed: u64,
        rate: f64,
        draw: fn(&mut StdRng, u64) -> Spec,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let skipped = Arc::new(AtomicU64::new(0));
        let flows: Arc<Mutex<Vec<Flow>>> = Arc::default();
        let (stopped, skips, done) = (stop.clone(), skipped.clone(), flows.clone());
        let generator = tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let limit = Arc::new(tokio::sync::Semaphore::new(400));
            let mut tasks = tokio::task::JoinSet::new();
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut id = 0u64;
            while !stopped.load(Ordering::SeqCst) {
                tick.tick().await;
                let spec = draw(&mut rng, id);
                id += 1;
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    skips.fetch_add(1, Ordering::SeqCst);
                    continue;
                };
                let (clients, provider, done) = (clients.clone(), provider.clone(), done.clone());
                tasks.spawn(async move {
                    let flow = clients.run(provider, spec, seed).await;
                    done.lock().unwrap().push(flow);
                    drop(permit);
                });
                while tasks.try_join_next().is_some() {}
            }
            while tasks.join_next().await.is_some() {}
        });
        Load {
            stop,
            skipped,
            flows,
            generator,
        }
    }

    /// Stops starting flows and waits for those started: every flow, and the flows not started.
    async fn finish(self) -> (Vec<Flow>, u64) {
        self.stop.store(true, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(90), self.generator)
            .await
            .expect("every flow ends (each attempt is bounded)")
            .unwrap();
        let flows = std::mem::take(&mut *self.flows.lock().unwrap());
        (flows, self.skipped.load(Ordering::SeqCst))
    }
}

/// Replica 0's RSS over the run (it is only ever reloaded, never restarted), and the figure for
/// (g): growth after warm-up (the first fifth of the run, at least 1 minute).
fn rss_table(samples: &[(Duration, usize, u64)]) -> String {
    let r0: Vec<_> = samples.iter().filter(|s| s.1 == 0).collect();
    let Some(last) = r0.last() else {
        return "RSS: no samples".into();
    };
    let warm = (last.0 / 5).max(Duration::from_secs(60));
    let mut out = String::from("RSS of replica 0 (MiB) over time:");
    let step = (r0.len() / 12).max(1);
    for s in r0.iter().step_by(step) {
        out.push_str(&format!(" {}s={:.1}", s.0.as_secs(), s.2 as f64 / 1024.0));
    }
    if let Some(base) = r0.iter().find(|s| s.0 >= warm) {
        let max = r0.iter().filter(|s| s.0 >= warm).map(|s| s.2).max().unwrap_or(base.2);
        out.push_str(&format!(
            "\n(g) after warm-up ({}s): {:.1} MiB, at most {:.1} MiB since ({:+.1}%), {:.1} MiB at the end",
            base.0.as_secs(),
            base.2 as f64 / 1024.0,
            max as f64 / 1024.0,
            (max as f64 / base.2 as f64 - 1.0) * 100.0,
            last.2 as f64 / 1024.0
        ));
    }
    out
}

fn say(inj: &mut Injections, started: Instant, what: String) {
    let _ = started;
    eprintln!("chaos: {what}");
    inj.log.push(what);
}

async fn redis_killed(
    redis: &mut RedisServer,
    replicas: &[Replica],
    provider: &FakeProvider,
    inj: &mut Injections,
    round: usize,
) {
    let start = Instant::now();
    redis.stop(); // SIGKILL: nothing is persisted
    tokio::time::sleep(Duration::from_secs(2)).await;
    tokio::task::block_in_place(|| redis.restart());
    let back = Instant::now();
    say(
        inj,
        start,
        format!("redis SIGKILLed, restarted empty after {:?}", back - start),
    );
    inj.windows.push(Window {
        kind: "redis restarted empty",
        start,
        end: back + LEASE + Duration::from_secs(1),
    });
    recovered("redis restart", back, replicas, provider, inj, round * 2).await;
}

async fn redis_frozen(
    redis: &RedisServer,
    replicas: &[Replica],
    provider: &FakeProvider,
    inj: &mut Injections,
    round: usize,
) {
    let start = Instant::now();
    redis.freeze();
    tokio::time::sleep(Duration::from_secs(5)).await;
    redis.thaw();
    let back = Instant::now();
    say(inj, start, "redis frozen (SIGSTOP) for 5 s, then resumed".into());
    inj.windows.push(Window {
        kind: "redis frozen > lease",
        start,
        end: back + Duration::from_secs(1),
    });
    recovered("redis freeze", back, replicas, provider, inj, round * 2 + 1).await;
}

/// Live streams that one replica runs and the other two follow, when it is SIGKILLed ((h)).
struct Follows {
    /// The keys, each a stream on the owner and a follower on each other replica.
    keys: Vec<String>,
    /// (key, follower's replica, its end) per follower.
    followers: Vec<(String, usize, tokio::task::JoinHandle<Ended>)>,
    /// The originals' bodies, held open until the kill.
    originals: Vec<hyper::body::Incoming>,
}

/// How a body ended: when, whether cleanly, and whether it had bytes.
struct Ended {
    at: Instant,
    clean: bool,
    bytes: usize,
}

/// A keyed streamed request on the `/live/` route (the shipped 30 s lease): `chunks` events
/// `gap_ms` apart.
async fn live_stream(base: &str, key: &str, chunks: &str, gap_ms: &str) -> http::Response<hyper::body::Incoming> {
    support::send_streaming_within(
        Duration::from_secs(30),
        "POST",
        &format!("{base}/live/v1/chat/completions"),
        &[
            ("x-fake-key", key),
            ("idempotency-key", key),
            ("x-fake-chunks", chunks),
            ("x-fake-gap-ms", gap_ms),
            ("content-type", "application/json"),
        ],
        r#"{"model":"m","stream":true}"#,
    )
    .await
}

async fn first_frame(body: &mut hyper::body::Incoming) -> usize {
    use http_body_util::BodyExt as _;
    match tokio::time::timeout(Duration::from_secs(10), body.frame()).await {
        Ok(Some(Ok(f))) => f.data_ref().map_or(0, |d| d.len()),
        _ => 0,
    }
}

async fn read_to_end(mut body: hyper::body::Incoming, mut bytes: usize) -> Ended {
    use http_body_util::BodyExt as _;
    loop {
        match tokio::time::timeout(Duration::from_secs(60), body.frame()).await {
            Ok(Some(Ok(f))) => bytes += f.data_ref().map_or(0, |d| d.len()),
            Ok(end) => {
                return Ended {
                    at: Instant::now(),
                    clean: end.is_none(),
                    bytes,
                }
            }
            Err(_) => {
                return Ended {
                    at: Instant::now(),
                    clean: false,
                    bytes,
                }
            }
        }
    }
}

/// Two streams (60 events 250 ms apart) on replica `owner`, each followed from the two others.
async fn followed_streams(replicas: &[Replica], owner: usize, round: usize) -> Follows {
    let mut follows = Follows {
        keys: Vec::new(),
        followers: Vec::new(),
        originals: Vec::new(),
    };
    for i in 0..2 {
        let key = format!("owner-death-{round}-{i}");
        let resp = live_stream(&replicas[owner].url, &key, "60", "250").await;
        let mut body = resp.into_body();
        first_frame(&mut body).await;
        follows.originals.push(body);
        for (r, replica) in replicas.iter().enumerate().filter(|(r, _)| *r != owner) {
            let resp = live_stream(&replica.url, &key, "60", "250").await;
            let mut body = resp.into_body();
            let got = first_frame(&mut body).await;
            follows
                .followers
                .push((key.clone(), r, tokio::spawn(read_to_end(body, got))));
        }
        follows.keys.push(key);
    }
    follows
}

/// (h) Owner liveness, after the owner of `follows` was SIGKILLed: every follower
/// ended with a visible abort about 1.5 s after the kill (10 s guard); a retry of each key 3.5 s after the kill,
/// on another replica, got a whole fresh answer whose first byte came at once; the provider saw
/// 2 calls per key; the key is then replayed (blocked nowhere).
async fn owner_death_checked(follows: Follows, replicas: &[Replica], provider: &FakeProvider, inj: &mut Injections) {
    let killed_at = inj.killed_at.expect("replica_killed ran");
    drop(follows.originals);
    // Liveness (1.5 s) ends them, not the 30 s lease: a guard at a third of the lease tells the
    // two apart without betting on the machine's speed (the time is reported, not asserted).
    let bound = Duration::from_secs(10);
    let (mut ok, mut worst, mut detail) = (true, Duration::ZERO, Vec::new());
    let n = follows.followers.len();
    for (key, r, ended) in follows.followers {
        let ended = ended.await.expect("the follower's reader");
        let after = ended.at.saturating_duration_since(killed_at);
        worst = worst.max(after);
        if ended.clean || ended.bytes == 0 || after > bound {
            ok = false;
            detail.push(format!(
                "{key} on replica {r}: clean {}, {} bytes, ended {after:?} after the kill",
                ended.clean, ended.bytes
            ));
        }
    }
    inj.checks.push((
        "(h) owner SIGKILLed: followers aborted by liveness, not the lease",
        ok,
        if detail.is_empty() {
            format!("{n} followers, the last ended {worst:?} after the kill")
        } else {
            detail.join("; ")
        },
    ));
    say(
        inj,
        Instant::now(),
        format!("(h) {n} followers of the killed replica's streams ended visibly, the last {worst:?} after the kill"),
    );

    tokio::time::sleep_until((killed_at + Duration::from_millis(3500)).into()).await;
    let (mut ok, mut slowest, mut detail) = (true, Duration::ZERO, Vec::new());
    for key in &follows.keys {
        let sent = Instant::now();
        let resp = live_stream(&replicas[0].url, key, "5", "0").await;
        let head = sent.elapsed();
        slowest = slowest.max(head);
        let fresh = resp.status() == 200 && resp.headers().get("idempotent-replayed").is_none();
        let ended = read_to_end(resp.into_body(), 0).await;
        let again = send(
            "POST",
            &format!("{}/live/v1/chat/completions", replicas[2].url),
            &[
                ("x-fake-key", key.as_str()),
                ("idempotency-key", key.as_str()),
                ("content-type", "application/json"),
            ],
            r#"{"model":"m","stream":true}"#,
        )
        .await;
        let replayed = again.status == 200 && again.header("idempotent-replayed").is_some();
        let calls = provider.count(key);
        // A guard well short of the 26.5 s of lease left: not held by the dead owner's claim.
        if !fresh || !ended.clean || head > Duration::from_secs(10) || calls != 2 || !replayed {
            ok = false;
            detail.push(format!(
                "{key}: fresh {fresh}, whole {}, head after {head:?}, {calls} provider calls, then replayed {replayed}",
                ended.clean
            ));
        }
    }
    inj.checks.push((
        "(h) owner SIGKILLed: a retry at +3.5 s is not held, 2 calls, key not blocked",
        ok,
        if detail.is_empty() {
            format!(
                "{} keys, the slowest head {slowest:?} after its retry",
                follows.keys.len()
            )
        } else {
            detail.join("; ")
        },
    ));
    say(
        inj,
        Instant::now(),
        format!(
            "(h) retries at +3.5 s ran at once (slowest head {slowest:?}), 2 provider calls per key, then replayed"
        ),
    );
}

async fn replica_killed(replica: &mut Replica, index: usize, inj: &mut Injections) {
    let inflight = replica.busy().await;
    let start = Instant::now();
    let p = replica.process.as_mut().expect("running");
    p.child.start_kill().unwrap();
    let _ = p.child.wait().await;
    inj.killed_at = Some(Instant::now());
    replica.start().await;
    say(
        inj,
        start,
        format!("replica {index} SIGKILLed with {inflight} requests in flight, restarted on its port"),
    );
    inj.windows.push(Window {
        kind: "replica SIGKILLed",
        start,
        end: Instant::now() + LEASE + Duration::from_secs(1),
    });
}

async fn replica_terminated(replica: &mut Replica, index: usize, inj: &mut Injections) {
    let inflight = replica.busy().await;
    let at = Instant::now();
    let p = replica.process.as_mut().expect("running");
    p.signal("TERM");
    let code = tokio::time::timeout(Duration::from_secs(40), p.child.wait())
        .await
        .ok()
        .and_then(Result::ok)
        .and_then(|s| s.code());
    let drained = at.elapsed();
    replica.start().await;
    say(
        inj,
        at,
        format!(
            "replica {index} SIGTERMed with {inflight} requests in flight: exit {code:?} after {drained:?}, restarted"
        ),
    );
    inj.sigterms.push((index, at, code));
}

async fn invalid_reload(replica: &Replica, inj: &mut Injections) {
    let failures = |page: &str| support::metric(page, "rebound_config_reloads_total{result=\"failure\"}");
    let successes = |page: &str| support::metric(page, "rebound_config_reloads_total{result=\"success\"}");
    let before = replica.metrics().await;
    let path = replica.process().config_path();
    std::fs::write(
        &path,
        replica.toml.replace("max_attempts = 4", "max_attempts = \"four\""),
    )
    .unwrap();
    replica.process().signal("HUP");
    let refused = try_until(Duration::from_secs(10), || async {
        (failures(&replica.metrics().await) > failures(&before))
            .then_some(())
            .ok_or(())
    })
    .await
    .is_ok();
    let serving = replica.process.as_ref().and_then(|p| p.child.id()).is_some()
        && send("GET", &format!("{}/readyz", replica.admin), &[], "").await.status == 200;
    std::fs::write(&path, &replica.toml).unwrap();
    replica.process().signal("HUP");
    let restored = try_until(Duration::from_secs(10), || async {
        (successes(&replica.metrics().await) > successes(&before))
            .then_some(())
            .ok_or(())
    })
    .await
    .is_ok();
    let ok = refused && serving && restored;
    say(
        inj,
        Instant::now(),
        format!("invalid config reloaded on replica 0: refused {refused}, still ready {serving}, valid one reloaded {restored}"),
    );
    inj.checks.push((
        "invalid reload refused, replica kept serving",
        ok,
        format!("refused {refused}, ready {serving}, restored {restored}"),
    ));
}

/// (f): after Redis returns, from `back`: idempotency across replicas, dead letters seen by
/// another replica, a cooldown and an open circuit shared with another replica, each polled
/// concurrently until it works (10 s at most).
async fn recovered(
    what: &'static str,
    back: Instant,
    replicas: &[Replica],
    provider: &FakeProvider,
    inj: &mut Injections,
    n: usize,
) {
    let (a, b) = (&replicas[0], &replicas[1]);
    let within = Duration::from_secs(10);
    let idem = async {
        for i in 0.. {
            if back.elapsed() > within {
                return None;
            }
            let key = format!("probe-idem-{n}-{i}");
            let h = [
                ("x-fake-key", key.as_str()),
                ("idempotency-key", key.as_str()),
                ("authorization", "Bearer probe"),
            ];
            let first = send("POST", &format!("{}/cd/v1/chat/completions", a.url), &h, "{}").await;
            if first.status != 200 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            let again = send("POST", &format!("{}/cd/v1/chat/completions", b.url), &h, "{}").await;
            if again.status == 200 && again.header("idempotent-replayed").is_some() && provider.count(&key) == 1 {
                return Some(back.elapsed());
            }
        }
        None
    };
    let dead_letters = async {
        for i in 0.. {
            if back.elapsed() > within {
                return None;
            }
            let key = format!("probe-dl-{n}-{i}");
            provider.script(&key, vec![Step::status(503), Step::status(503)]);
            let h = [("x-fake-key", key.as_str()), ("authorization", "Bearer probe-dl")];
            let r = send("POST", &format!("{}/cd/v1/chat/completions", a.url), &h, "{}").await;
            if r.status != 503 {
                continue;
            }
            let listed = try_until(Duration::from_millis(1500), || async {
                let list = send(
                    "GET",
                    &format!("{}/admin/dead-letters?route=cd&limit=200", b.admin),
                    &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
                    "",
                )
                .await;
                (list.status == 200 && list.text().contains(&key))
                    .then_some(())
                    .ok_or(())
            });
            if listed.await.is_ok() {
                return Some(back.elapsed());
            }
        }
        None
    };
    let cooldown = async {
        for i in 0.. {
            if back.elapsed() > within {
                return None;
            }
            let key = format!("probe-cd-{n}-{i}");
            let cred = format!("Bearer probe-cd-{n}-{i}");
            provider.script(&key, vec![Step::status_with(429, &[("retry-after", "30")])]);
            let h = [("x-fake-key", key.as_str()), ("authorization", cred.as_str())];
            let r = send("POST", &format!("{}/cd/v1/chat/completions", a.url), &h, "{}").await;
            if r.status != 429 {
                continue;
            }
            let held = try_until(Duration::from_millis(1500), || async {
                let other = format!("{key}-b");
                let h = [("x-fake-key", other.as_str()), ("authorization", cred.as_str())];
                let r = send("POST", &format!("{}/cd/v1/chat/completions", b.url), &h, "{}").await;
                (r.status == 429 && r.header("x-rebound-error") == Some("cooldown"))
                    .then_some(())
                    .ok_or(())
            });
            if held.await.is_ok() {
                return Some(back.elapsed());
            }
        }
        None
    };
    let circuit = async {
        if n >= CIRCUIT_PROBES {
            return None; // a long soak: measured on the first recoveries only
        }
        let opened = |page: &str| -> f64 {
            page.lines()
                .filter(|l| l.starts_with("rebound_circuit_transitions_total{"))
                .filter(|l| l.contains(&format!("upstream=\"cb{n}\"")) && l.contains("to=\"open\""))
                .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
                .sum()
        };
        for i in 0.. {
            if back.elapsed() > within {
                return None;
            }
            let before = opened(&b.metrics().await);
            // Trip it on A: failures in a row (each request one attempt: no retry policy).
            for j in 0..4 {
                let key = format!("probe-cb-{n}-{i}-{j}");
                provider.script(&key, vec![Step::status(503)]);
                let _ = send(
                    "POST",
                    &format!("{}/cb{n}/v1/chat/completions", a.url),
                    &[("x-fake-key", key.as_str())],
                    "{}",
                )
                .await;
            }
            let followed = try_until(Duration::from_millis(1500), || async {
                (opened(&b.metrics().await) > before).then_some(()).ok_or(())
            });
            if followed.await.is_ok() {
                return Some(back.elapsed());
            }
        }
        None
    };
    let (idem, dead_letters, cooldown, circuit) = tokio::join!(idem, dead_letters, cooldown, circuit);
    for (feature, t) in [
        ("idempotency", idem),
        ("dead letters", dead_letters),
        ("cooldown", cooldown),
        ("circuit", circuit),
    ] {
        if feature == "circuit" && n >= CIRCUIT_PROBES {
            continue;
        }
        inj.recoveries.push((what, feature, t));
    }
}
