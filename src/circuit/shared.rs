//! Fleet sharing of circuit state and cooldowns through Redis, off the request path.
//!
//! The request path only ever reads the local mirror ([`super::Circuits`]). Two background
//! tasks keep it in step with the fleet:
//!
//! - the **syncer** runs every `sync_interval` (and sooner when the request path has something
//!   urgent: a cooldown to share, a local trip, a probe result, a half-open rejection that wants
//!   a probe lease). Per upstream it sends, each in one round trip of one Lua script:
//!   - new cooldowns (`cooldown_note_v1`: keep the later deadline, PUBLISH it);
//!   - leased probes' results (`circuit_probe_done_v1`: the fleet closes after
//!     `half_open_probes` successes, re-opens, doubled, on a failure);
//!   - the outcome counts since the last sync (`circuit_sync_v1`: HINCRBY into per-bucket fields
//!     of a TTL'd window hash keyed by Redis's own clock; opens the fleet circuit when the fleet
//!     crosses a threshold; returns the fleet state and the cooldowns in force);
//!   - when the breaker is half-open and wants to probe, a lease request
//!     (`circuit_probe_acquire_v1`: a zset of leases with their end times, at most
//!     `half_open_probes` across the fleet).
//! - the **subscriber** listens on `{prefix}circuit:events` for transitions and cooldowns
//!   published by those scripts, so that other replicas follow within one message latency;
//!   it resubscribes after reconnects (and asks the syncer for a reconciliation, since messages
//!   may have been missed meanwhile).
//!
//! Fleet state lives in TTL'd keys written by the scripts: `open` expires when the open time is
//! up (so the fleet turns half-open by itself, even if every replica is gone), and every duration
//! is relative (PX, ms left) or read from Redis `TIME`, so clock skew between replicas never
//! matters. Each transition bumps a generation (`max(previous + 1, Redis ms)`, so it keeps
//! growing across a Redis restart); a replica ignores states older than the newest it has seen.
//!
//! When Redis cannot be reached, scripts fail within `command_timeout`; the breakers' attachment
//! lapses after three sync intervals, after which every replica runs on its local breaker alone
//! (probing without leases). Counts and cooldowns that could not be sent are kept (bounded) and
//! sent on reconnect; the fleet state is re-read at the first successful sync. No restart needed.

use foldhash::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use rand::Rng;
use redis::Script;
use serde::Deserialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::breaker::{self, BreakerConfig, Deltas, LeaseReport, LeaseResult, LeaseToken, Transition};
use super::{Cell, Circuits, Entry, Hold};
use crate::redis::{RedisError, RedisHandle};
use crate::time::{self, Instant};

const LIB: &str = include_str!("../redis/scripts/circuit_lib_v1.lua");

struct Scripts {
    sync: Script,
    acquire: Script,
    done: Script,
    cooldown: Script,
}

static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let with_lib = |body: &str| Script::new(&format!("{LIB}\n{body}"));
    Scripts {
        sync: with_lib(include_str!("../redis/scripts/circuit_sync_v1.lua")),
        acquire: with_lib(include_str!("../redis/scripts/circuit_probe_acquire_v1.lua")),
        done: with_lib(include_str!("../redis/scripts/circuit_probe_done_v1.lua")),
        cooldown: Script::new(include_str!("../redis/scripts/cooldown_note_v1.lua")),
    }
});

/// The pub/sub channel, under the key prefix.
pub fn channel(redis: &RedisHandle) -> String {
    redis.key("circuit:events")
}

/// One upstream's keys, in the order the scripts take them (see `circuit_lib_v1.lua`), all under
/// the hash tag `{upstream}`.
pub(crate) fn upstream_keys(redis: &RedisHandle, upstream: &str) -> [String; 7] {
    let k = |suffix: &str| redis.key(&format!("circuit:{{{upstream}}}:{suffix}"));
    [
        k("gen"),
        k("open"),
        k("trip"),
        k("probes"),
        k("oks"),
        k("win"),
        redis.key(&format!("cooldown:{{{upstream}}}")),
    ]
}

/// The fleet's circuit state, as a script or a message reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FleetState {
    Closed,
    HalfOpen,
    Open { left: Duration },
}

/// Brings a breaker in line with the fleet state of generation `gen`.
///
/// - `gen` 0: the fleet holds nothing (never tripped, or Redis lost its data): fleet phases
///   carry on locally.
/// - older than the newest generation seen: stale (a reply overtaken by a message), ignored.
/// - the same generation never takes a closed breaker out of closed (it has resolved that
///   phase already, e.g. its own probe closed it and the report is on its way), it only
///   refreshes a phase in progress.
pub(crate) fn reconcile(cell: &mut Cell, fleet: FleetState, gen: u64, now: Instant) -> Option<Transition> {
    if gen == 0 {
        cell.fleet_gen = 0;
        cell.breaker.localize();
        return None;
    }
    if gen < cell.fleet_gen {
        return None;
    }
    let newer = gen > cell.fleet_gen;
    cell.fleet_gen = gen;
    let closed = cell.breaker.state(now) == breaker::CircuitState::Closed;
    match fleet {
        FleetState::Open { left } if newer || !closed => cell.breaker.apply_remote_open(now + left, now),
        FleetState::HalfOpen if newer || !closed => cell.breaker.apply_remote_half_open(now),
        FleetState::Closed if newer => cell.breaker.apply_remote_close(now),
        FleetState::Closed => {
            cell.breaker.localize();
            None
        }
        _ => None,
    }
}

/// A script's JSON answer (`cjson` numbers are doubles).
#[derive(Debug, Default, Deserialize)]
struct Reply {
    #[serde(default)]
    s: f64,
    #[serde(default)]
    ms: f64,
    #[serde(default)]
    g: f64,
    #[serde(default)]
    r: Option<String>,
    #[serde(default)]
    cool: HashMap<String, f64>,
}

impl Reply {
    fn fleet(&self) -> FleetState {
        match self.s as u8 {
            2 => FleetState::Open {
                left: Duration::from_millis(self.ms.max(0.0) as u64),
            },
            1 => FleetState::HalfOpen,
            _ => FleetState::Closed,
        }
    }

    fn gen(&self) -> u64 {
        self.g.max(0.0) as u64
    }
}

/// A message on the channel.
#[derive(Debug, Deserialize)]
struct Event {
    k: String,
    u: String,
    #[serde(default)]
    ms: f64,
    #[serde(default)]
    g: f64,
    #[serde(default)]
    c: Option<String>,
}

/// A breaker's parameters as the scripts take them.
#[derive(Debug, Clone)]
struct Params {
    bucket_ms: u64,
    buckets: u64,
    minimum_requests: u32,
    rate_ppm: u64,
    consecutive_failures: u32,
    open_for_ms: u64,
    max_open_for_ms: u64,
    window_ms: u64,
    half_open_probes: u32,
    lease_ms: u64,
    max_open_for: Duration,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds, rounded up (so that a deadline is never shortened).
fn ms_ceil(d: Duration) -> u64 {
    ms(d.saturating_add(Duration::from_nanos(999_999)))
}

impl Params {
    fn new(cfg: &BreakerConfig) -> Params {
        Params {
            bucket_ms: ms(cfg.bucket()).max(1),
            buckets: breaker::BUCKETS as u64,
            minimum_requests: cfg.minimum_requests,
            rate_ppm: (cfg.failure_rate.clamp(0.0, 1.0) * 1_000_000.0).round() as u64,
            consecutive_failures: cfg.consecutive_failures,
            open_for_ms: ms(cfg.open_for).max(1),
            max_open_for_ms: ms(cfg.max_open_for).max(1),
            window_ms: ms(cfg.window).max(1),
            half_open_probes: cfg.half_open_probes,
            lease_ms: ms(cfg.probe_lease).max(1),
            max_open_for: cfg.max_open_for,
        }
    }

    fn floor_ms(&self, hint: Option<Duration>) -> u64 {
        ms_ceil(hint.unwrap_or(Duration::ZERO).min(self.max_open_for))
    }
}

/// One upstream, as the syncer sees it.
struct Target {
    entry: Arc<Entry>,
    keys: [String; 7],
    params: Option<Params>,
    /// No lease requests before this (the last answer was busy).
    next_acquire: Instant,
}

struct Syncer {
    circuits: Arc<Circuits>,
    redis: RedisHandle,
    channel: String,
    targets: Vec<Target>,
    /// How long a successful sync keeps fleet phases waiting for leases.
    attach_for: Duration,
    /// How long an unused lease is kept.
    credit_for: Duration,
    interval: Duration,
}

/// Starts the syncer and the subscriber on `tasks`; both stop with `stop`.
pub fn spawn(circuits: Arc<Circuits>, redis: RedisHandle, tasks: &TaskTracker, stop: CancellationToken) {
    let interval = circuits.sync_interval().max(Duration::from_millis(10));
    let targets: Vec<Target> = circuits
        .entries()
        .filter(|e| e.shared || e.share_cooldowns || e.share_pacing || e.share_exhausted())
        .map(|e| Target {
            entry: e.clone(),
            keys: upstream_keys(&redis, &e.name),
            params: if e.shared {
                e.with_cell(|c| Params::new(c.breaker.config()))
            } else {
                None
            },
            next_acquire: time::now(),
        })
        .collect();
    if targets.is_empty() {
        // Nothing to share: only keep the gauges moving.
        super::Circuits::start(&circuits, None, tasks, stop);
        return;
    }
    let resubscribe = Arc::new(Notify::new());
    let syncer = Syncer {
        channel: channel(&redis),
        attach_for: interval * 3 + redis.command_timeout() * 2,
        credit_for: (interval * 2).max(Duration::from_millis(500)),
        interval,
        circuits: circuits.clone(),
        redis: redis.clone(),
        targets,
    };
    tasks.spawn(syncer.run(stop.clone(), resubscribe.clone()));
    tasks.spawn(subscribe(circuits, redis, stop, resubscribe));
}

impl Syncer {
    async fn run(mut self, stop: CancellationToken, resubscribe: Arc<Notify>) {
        let min_gap = (self.interval / 10).max(Duration::from_millis(5));
        let mut next = time::now() + self.interval;
        let mut healthy = true;
        loop {
            let full = tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(next) => true,
                _ = self.circuits.wake().notified() => false,
            };
            let now = time::now();
            if full {
                next = now + self.interval;
            }
            let ok = self.pass(full, now).await;
            if ok && !healthy {
                tracing::info!("fleet circuit sync resumed");
                resubscribe.notify_one();
            } else if !ok && healthy {
                tracing::warn!("fleet circuit sync failing: breakers run on local state until Redis answers");
            }
            healthy = ok;
            if !full {
                // Urgent passes at most every `min_gap`.
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(min_gap) => {}
                }
            }
        }
    }

    /// One exchange for every target; false if any Redis call failed.
    async fn pass(&mut self, full: bool, now: Instant) -> bool {
        let mut ok = true;
        for i in 0..self.targets.len() {
            ok &= self.sync_target(i, full, now).await.is_ok();
        }
        if full {
            self.circuits.refresh(time::now());
        }
        ok
    }

    async fn sync_target(&mut self, i: usize, full: bool, now: Instant) -> Result<(), RedisError> {
        let target = &self.targets[i];
        let entry = target.entry.clone();
        let mut out = entry.take_outgoing(now);

        // Cooldowns and pacing first: the signals that should reach the fleet fastest.
        let cooldowns = std::mem::take(&mut out.cooldowns).into_iter();
        let pacing = std::mem::take(&mut out.pacing).into_iter();
        let exhausted = std::mem::take(&mut out.exhausted).into_iter();
        let mut pending = (exhausted.map(|(c, t)| (Hold::Exhausted, c, t)))
            .chain(cooldowns.map(|(c, t)| (Hold::Cooldown, c, t)))
            .chain(pacing.map(|(c, t)| (Hold::Pacing, c, t)));
        while let Some((hold, cred, until)) = pending.next() {
            if let Err(e) = self
                .note_cooldown(&target.keys[6], &entry.name, &hold.field(cred), until, now)
                .await
            {
                let mut rest = vec![(hold, cred, until)];
                rest.extend(pending);
                entry.restore_outgoing(out.deltas, rest, time::now());
                return Err(e);
            }
        }

        let Some(params) = target.params.clone() else {
            if full {
                let reply = self.sync_script(i, None, Deltas::default()).await?;
                self.apply_cooldowns(&entry, &reply);
            }
            return Ok(());
        };

        for report in std::mem::take(&mut out.reports) {
            // Lost reports only cost a lease that lapses by itself.
            if let Err(e) = self.report_probe(i, &params, report).await {
                entry.restore_outgoing(out.deltas, Vec::new(), time::now());
                return Err(e);
            }
        }

        if full || out.flush_now {
            let deltas = out.deltas;
            match self.sync_script(i, Some(&params), deltas).await {
                Ok(reply) => {
                    self.apply_cooldowns(&entry, &reply);
                    self.apply_state(&entry, &reply);
                }
                Err(e) => {
                    // Kept for the next sync while they are in the window (older ones are
                    // dropped there rather than skew the fleet window when Redis comes back).
                    entry.restore_outgoing(deltas, Vec::new(), time::now());
                    return Err(e);
                }
            }
        } else {
            entry.restore_outgoing(out.deltas, Vec::new(), now);
        }

        let target = &self.targets[i];
        if out.wants_lease && time::now() >= target.next_acquire {
            self.acquire(i, &params).await?;
        }
        Ok(())
    }

    async fn note_cooldown(
        &self,
        key: &str,
        upstream: &str,
        field: &str,
        until: Instant,
        now: Instant,
    ) -> Result<(), RedisError> {
        let left = until.saturating_duration_since(now);
        if left.is_zero() {
            return Ok(());
        }
        let mut inv = SCRIPTS.cooldown.prepare_invoke();
        inv.key(key)
            .arg(field)
            .arg(ms_ceil(left))
            .arg(&self.channel)
            .arg(upstream);
        self.redis
            .run("cooldown_note", |mut conn| async move {
                inv.invoke_async::<i64>(&mut conn).await
            })
            .await
            .map(|_| ())
    }

    async fn sync_script(&self, i: usize, params: Option<&Params>, deltas: Deltas) -> Result<Reply, RedisError> {
        let target = &self.targets[i];
        let mut inv = SCRIPTS.sync.prepare_invoke();
        for k in &target.keys {
            inv.key(k);
        }
        let jitter: u32 = rand::rng().random_range(0..=1_000_000);
        let p = params.cloned();
        let floor = p.as_ref().map_or(0, |p| p.floor_ms(deltas.max_hint));
        let p = p.unwrap_or(Params {
            bucket_ms: 1,
            buckets: breaker::BUCKETS as u64,
            minimum_requests: 1,
            rate_ppm: 0,
            consecutive_failures: 1,
            open_for_ms: 1,
            max_open_for_ms: 1,
            window_ms: 1,
            half_open_probes: 1,
            lease_ms: 1,
            max_open_for: Duration::ZERO,
        });
        inv.arg(deltas.successes)
            .arg(deltas.failures)
            .arg(deltas.tail_failures)
            .arg(u8::from(deltas.had_success))
            .arg(floor)
            .arg(p.bucket_ms)
            .arg(p.buckets)
            .arg(p.minimum_requests)
            .arg(p.rate_ppm)
            .arg(p.consecutive_failures)
            .arg(p.open_for_ms)
            .arg(p.max_open_for_ms)
            .arg(jitter)
            .arg(p.window_ms)
            .arg(&self.channel)
            .arg(&target.entry.name)
            .arg(u8::from(params.is_some()));
        self.invoke("circuit_sync", inv).await
    }

    async fn report_probe(&self, i: usize, params: &Params, report: LeaseReport) -> Result<(), RedisError> {
        let target = &self.targets[i];
        let (result, hint) = match report.result {
            LeaseResult::Success => ("ok", None),
            LeaseResult::Failure { hint } => ("fail", hint),
            LeaseResult::Released => ("release", None),
        };
        let mut inv = SCRIPTS.done.prepare_invoke();
        for k in &target.keys {
            inv.key(k);
        }
        inv.arg(report.token.0)
            .arg(result)
            .arg(params.half_open_probes)
            .arg(params.open_for_ms)
            .arg(params.max_open_for_ms)
            .arg(rand::rng().random_range(0..=1_000_000u32))
            .arg(params.floor_ms(hint))
            .arg(&self.channel)
            .arg(&target.entry.name);
        let reply = self.invoke("circuit_probe_done", inv).await?;
        self.apply_state(&target.entry, &reply);
        Ok(())
    }

    async fn acquire(&mut self, i: usize, params: &Params) -> Result<(), RedisError> {
        let token = LeaseToken(rand::rng().random());
        let reply = {
            let target = &self.targets[i];
            let mut inv = SCRIPTS.acquire.prepare_invoke();
            for k in &target.keys {
                inv.key(k);
            }
            inv.arg(token.0).arg(params.lease_ms).arg(params.half_open_probes);
            self.invoke("circuit_probe_acquire", inv).await?
        };
        let now = time::now();
        let entry = self.targets[i].entry.clone();
        self.apply_state(&entry, &reply);
        if reply.r.as_deref() == Some("granted") {
            let lease = Duration::from_millis(reply.ms.max(0.0) as u64);
            let credit_for = self.credit_for;
            entry.update(|cell| {
                cell.breaker.grant_lease(token, now + lease, now + credit_for, now);
                None
            });
        } else {
            self.targets[i].next_acquire = now + self.interval;
        }
        Ok(())
    }

    async fn invoke(&self, op: &'static str, inv: redis::ScriptInvocation<'static>) -> Result<Reply, RedisError> {
        let json = self
            .redis
            .run(
                op,
                |mut conn| async move { inv.invoke_async::<String>(&mut conn).await },
            )
            .await?;
        Ok(serde_json::from_str(&json).unwrap_or_else(|e| {
            tracing::warn!(op, error = %e, "unreadable answer from a circuit script");
            Reply::default()
        }))
    }

    fn apply_state(&self, entry: &Entry, reply: &Reply) {
        let now = time::now();
        let attach = now + self.attach_for;
        entry.update(|cell| {
            cell.breaker.attach_until(attach);
            reconcile(cell, reply.fleet(), reply.gen(), now)
        });
    }

    fn apply_cooldowns(&self, entry: &Entry, reply: &Reply) {
        let now = time::now();
        for (field, left) in &reply.cool {
            if let Some((hold, cred)) = Hold::parse_field(field) {
                entry.hold_from_fleet(hold, cred, now + Duration::from_millis(left.max(0.0) as u64), now);
            }
        }
    }
}

/// Applies one published event.
fn apply_event(circuits: &Circuits, payload: &str) {
    let Ok(event) = serde_json::from_str::<Event>(payload) else {
        tracing::debug!("ignoring an unreadable circuit event");
        return;
    };
    let Some(entry) = circuits.entry(&event.u) else {
        return;
    };
    let now = time::now();
    let left = Duration::from_millis(event.ms.max(0.0) as u64);
    let gen = event.g.max(0.0) as u64;
    match event.k.as_str() {
        "open" if entry.shared => entry.update(|cell| reconcile(cell, FleetState::Open { left }, gen, now)),
        "close" if entry.shared => entry.update(|cell| reconcile(cell, FleetState::Closed, gen, now)),
        "cool" => {
            if let Some((hold, cred)) = event.c.as_deref().and_then(Hold::parse_field) {
                entry.hold_from_fleet(hold, cred, now + left, now);
            }
        }
        _ => {}
    }
}

/// Listens to the channel, reconnecting (with backoff) after any loss; each (re)subscription
/// asks the syncer for a reconciliation, since messages may have been missed.
async fn subscribe(circuits: Arc<Circuits>, redis: RedisHandle, stop: CancellationToken, resubscribe: Arc<Notify>) {
    let channel = channel(&redis);
    let connect_timeout = redis.command_timeout().max(Duration::from_millis(500));
    let mut backoff = Duration::from_millis(100);
    loop {
        let connect = async {
            let mut pubsub = redis.pubsub().await.map_err(|e| e.to_string())?;
            pubsub.subscribe(&channel).await.map_err(|e| e.to_string())?;
            Ok::<_, String>(pubsub)
        };
        let subscribed = tokio::select! {
            _ = stop.cancelled() => return,
            r = tokio::time::timeout(connect_timeout, connect) => r,
        };
        match subscribed {
            Ok(Ok(pubsub)) => {
                backoff = Duration::from_millis(100);
                // A recovery noticed while we were reconnecting needs no second resubscription.
                let _ = resubscribe.notified().now_or_never();
                circuits.wake().notify_one();
                let mut messages = pubsub.into_on_message();
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = resubscribe.notified() => break,
                        msg = messages.next() => match msg {
                            Some(msg) => {
                                if let Ok(payload) = msg.get_payload::<String>() {
                                    apply_event(&circuits, &payload);
                                }
                            }
                            None => break,
                        },
                    }
                }
                tracing::debug!("circuit event subscription lost; resubscribing");
            }
            _ => {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(redis.reconnect_backoff_max());
            }
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::circuit::breaker::{Breaker, CircuitState};
    use crate::config::FailureOn;

    fn cell() -> Cell {
        let cfg = BreakerConfig {
            consecutive_failures: 5,
            failure_rate: 0.5,
            minimum_requests: 20,
            window: Duration::from_secs(30),
            open_for: Duration::from_secs(5),
            max_open_for: Duration::from_secs(300),
            half_open_probes: 1,
            failure_on: vec![FailureOn::AnyServerError],
            probe_lease: Duration::from_secs(90),
        };
        Cell {
            breaker: Breaker::new(cfg, crate::time::now()).shared(),
            fleet_gen: 0,
        }
    }

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn follows_the_fleet_and_ignores_stale_states() {
        let mut c = cell();
        let now = crate::time::now();
        let t = reconcile(&mut c, FleetState::Open { left: 5 * SEC }, 100, now).unwrap();
        assert_eq!(t.to, CircuitState::Open);
        assert_eq!(c.breaker.open_until(), Some(now + 5 * SEC));
        // An older reply (taken before the opening) changes nothing.
        assert_eq!(reconcile(&mut c, FleetState::Closed, 99, now), None);
        assert_eq!(c.breaker.state(now), CircuitState::Open);
        // The same opening, re-read: refreshes without a transition.
        assert_eq!(reconcile(&mut c, FleetState::Open { left: 4 * SEC }, 100, now), None);
        // Half-open at the same generation: follows.
        let later = now + 5 * SEC;
        assert_eq!(reconcile(&mut c, FleetState::HalfOpen, 100, later), None);
        assert_eq!(c.breaker.state(later), CircuitState::HalfOpen);
        // Closed at a newer generation: closes.
        let t = reconcile(&mut c, FleetState::Closed, 101, later).unwrap();
        assert_eq!(t.to, CircuitState::Closed);
        // A late half-open of the old generation does not reopen it.
        assert_eq!(reconcile(&mut c, FleetState::HalfOpen, 101, later), None);
        assert_eq!(c.breaker.state(later), CircuitState::Closed);
        // A new trip does.
        assert!(reconcile(&mut c, FleetState::Open { left: SEC }, 102, later).is_some());
    }

    #[test]
    fn an_empty_store_leaves_the_breaker_local() {
        let mut c = cell();
        let now = crate::time::now();
        reconcile(&mut c, FleetState::Open { left: 5 * SEC }, 100, now);
        assert!(c.breaker.is_fleet_phase());
        // Redis restarted empty: generation 0.
        assert_eq!(reconcile(&mut c, FleetState::Closed, 0, now), None);
        assert!(!c.breaker.is_fleet_phase());
        assert_eq!(c.breaker.state(now), CircuitState::Open, "keeps its own timer");
        assert_eq!(c.fleet_gen, 0);
        // The next fleet opening is taken whatever its generation.
        assert!(reconcile(&mut c, FleetState::Open { left: 9 * SEC }, 5, now).is_none());
        assert_eq!(c.breaker.open_until(), Some(now + 9 * SEC));
    }

    #[test]
    fn a_closed_fleet_at_the_same_generation_localizes() {
        let mut c = cell();
        let now = crate::time::now();
        reconcile(&mut c, FleetState::Open { left: SEC }, 100, now);
        // The trip record expired without a close: carry on locally.
        assert_eq!(reconcile(&mut c, FleetState::Closed, 100, now), None);
        assert!(!c.breaker.is_fleet_phase());
    }

    #[test]
    fn key_layout_and_params() {
        let cfg = cell().breaker.config().clone();
        let p = Params::new(&cfg);
        assert_eq!(p.bucket_ms, 3000);
        assert_eq!(p.rate_ppm, 500_000);
        assert_eq!(p.floor_ms(Some(Duration::from_micros(1500))), 2);
        assert_eq!(p.floor_ms(Some(Duration::from_secs(1 << 31))), 300_000);
        assert_eq!(ms_ceil(Duration::from_millis(3)), 3);
    }

    #[test]
    fn events_parse() {
        let e: Event = serde_json::from_str(r#"{"k":"open","u":"openai","ms":5000,"g":1700000000001}"#).unwrap();
        assert_eq!(
            (e.k.as_str(), e.u.as_str(), e.ms as u64, e.g as u64),
            ("open", "openai", 5000, 1_700_000_000_001)
        );
        let r: Reply = serde_json::from_str(r#"{"s":2,"ms":1234,"g":7,"cool":{"ab":10}}"#).unwrap();
        assert_eq!(
            r.fleet(),
            FleetState::Open {
                left: Duration::from_millis(1234)
            }
        );
        assert_eq!(r.gen(), 7);
        let r: Reply = serde_json::from_str(r#"{"s":0,"ms":0,"g":0}"#).unwrap();
        assert_eq!(r.fleet(), FleetState::Closed);
        assert!(r.cool.is_empty());
    }
}
