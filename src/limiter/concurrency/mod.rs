//! An upstream's `concurrency` at run time: the requests in flight per credential and model
//! ([`Scope`]), admitted under a limit that is fixed or adapts ([`crate::limits::aimd`]), and
//! shared by the fleet ([`sync`]: each replica tells Redis what it runs and wants, and gets the
//! fleet's limit and its own part of it, every [`sync::EVERY`], never on a request's path).
//!
//! A request takes a [`Slot`] on its target before an attempt is sent ([`UpstreamLimit::try_acquire`]:
//! an atomic count and a lock held for a few field reads, no round trip); the attempt's answer
//! adjusts the limit ([`Slot::observe`]); the permit is given back when the attempt fails, or
//! when the response delivered ends. A request that finds its target at its limit goes to another
//! target, or waits in the scope's fair queue ([`UpstreamLimit::queue`], `limiter::queue`'s), or is
//! answered 429 `concurrency_limited`: the pipeline decides which (`proxy::call`).
//!
//! The state outlives reloads ([`Concurrency`] is the server's); a reload that changes an
//! upstream's `concurrency` or `[concurrency]` starts its limits afresh, under a new generation
//! of keys in Redis.

pub(crate) mod sync;

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::queue::{Place, QueueShare, Waiting};
use crate::config::{Concurrency as Mode, ConcurrencyBounds, Config};
use crate::credentials::LimitKey;
use crate::limits::aimd::{self, Adjusted, Aimd, Signal, Success};
use crate::limits::fair_queue::Full;
use crate::limits::key::BucketKey;
use crate::metrics::{ConcurrencySeries, Metrics, ScopeSeries};
use crate::time::{self, Instant};

/// Scopes kept per upstream at most: past it, one with nothing in flight or waiting is dropped
/// (it starts again from the fleet's limit, or the initial one).
const MAX_SCOPES: usize = 10_000;

/// The longest a request waits in a scope's queue (within its deadline).
pub(crate) const MAX_QUEUE_WAIT: Duration = Duration::from_secs(30);

/// Every upstream's limits, kept across reloads.
pub(crate) struct Concurrency {
    upstreams: parking_lot::Mutex<HashMap<String, Arc<UpstreamLimit>>>,
    /// The most replicas seen sharing a scope: the part of a limit a replica takes before it
    /// hears from the fleet, or while Redis is away.
    replicas: AtomicU32,
    /// Wakes the fleet sync at once (a limit lowered: the fleet hears it now).
    pub(crate) urgent: tokio::sync::Notify,
    metrics: Arc<Metrics>,
}

/// One upstream's limits: a scope per credential and model.
pub(crate) struct UpstreamLimit {
    pub(crate) name: String,
    mode: Mode,
    bounds: ConcurrencyBounds,
    /// Of its settings: a reload that changes them starts afresh, under new keys.
    pub(crate) generation: u64,
    scopes: parking_lot::Mutex<HashMap<LimitKey, Arc<Scope>>>,
    pub(crate) waiting: Waiting,
    series: ConcurrencySeries,
    /// The registry's, for the urgent sync and the replica count.
    owner: std::sync::Weak<Concurrency>,
}

/// One credential and model on one upstream.
pub(crate) struct Scope {
    pub(crate) key: LimitKey,
    in_flight: AtomicU32,
    /// How long a place is held (from admission to the response's end), smoothed: microseconds
    /// as `f64` bits, 0 before the first.
    hold_bits: AtomicU64,
    pub(crate) state: parking_lot::Mutex<State>,
    /// Its limit and in-flight gauges (under its model's label).
    series: ScopeSeries,
}

/// What a scope knows of its limit.
pub(crate) struct State {
    pub(crate) aimd: Aimd,
    /// This replica's part of the fleet's limit, as of the last exchange: requests it may run.
    pub(crate) part: u32,
    /// The limit `part` is of: the fleet's at the last exchange (the scope's own, without one).
    pub(crate) synced: f64,
    /// Growth since the last exchange, for the fleet's limit.
    pub(crate) grown: f64,
    /// Lowered since the last exchange: the fleet's limit is at most this.
    pub(crate) lowered: Option<f64>,
    /// The fleet's count of decreases at the last exchange.
    pub(crate) decreases: u64,
    /// Requests waiting for it here.
    pub(crate) waiting: u32,
    pub(crate) last_used: Instant,
}

impl State {
    /// The requests this replica may run: its part, moved by what the limit did here since.
    fn allowance(&self) -> u32 {
        let (limit, synced) = (self.aimd.exact(), self.synced);
        if limit >= synced {
            (f64::from(self.part) + limit - synced).floor() as u32
        } else {
            (f64::from(self.part) * limit / synced.max(1.0)).floor() as u32
        }
    }
}

/// What an admission found.
pub(crate) enum Acquired {
    Ok(Slot),
    /// At its limit (or others wait for it here).
    Full,
}

/// A request's place in a scope's queue: left when dropped, unless [`Queued::admitted`].
pub(crate) struct Queued {
    pub(crate) place: Place,
    pub(crate) since: Instant,
    /// When its wait is over.
    pub(crate) until: Instant,
    limit: Arc<UpstreamLimit>,
    scope: Arc<Scope>,
    served: bool,
}

impl Queued {
    /// The upstream whose limit it waits for.
    pub(crate) fn upstream(&self) -> &str {
        &self.limit.name
    }

    /// Admitted: served from the queue.
    pub(crate) fn admitted(mut self) {
        self.served = true;
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        {
            let mut st = self.scope.state.lock();
            st.waiting = st.waiting.saturating_sub(1);
        }
        match self.served {
            true => self.limit.waiting.served(self.place),
            false => self.limit.waiting.leave(self.place),
        }
        self.limit
            .series
            .queued(time::now().saturating_duration_since(self.since));
    }
}

impl Concurrency {
    /// The limits of a process, shared with the fleet through `redis` (exchanges on `tracker`
    /// until `stop`), or this process's alone.
    pub(crate) fn start(
        metrics: Arc<Metrics>,
        redis: Option<&crate::redis::RedisHandle>,
        tracker: &tokio_util::task::TaskTracker,
        stop: tokio_util::sync::CancellationToken,
    ) -> Arc<Concurrency> {
        let concurrency = Arc::new(Concurrency {
            upstreams: parking_lot::Mutex::default(),
            replicas: AtomicU32::new(1),
            urgent: tokio::sync::Notify::new(),
            metrics,
        });
        if let Some(redis) = redis {
            sync::start(&concurrency, redis, tracker, stop);
        }
        concurrency
    }

    /// Takes a configuration: an upstream whose settings are unchanged keeps its limits, one
    /// whose settings changed starts afresh, one without `concurrency` has none.
    pub(crate) fn configure(self: &Arc<Self>, config: &Config) {
        let mut upstreams = self.upstreams.lock();
        let mut next = HashMap::new();
        for (name, u) in &config.upstreams {
            let Some(mode) = u.concurrency else { continue };
            let generation = generation(mode, config.concurrency);
            let kept = upstreams.remove(name).filter(|l| l.generation == generation);
            let limit = kept.unwrap_or_else(|| {
                Arc::new(UpstreamLimit {
                    name: name.clone(),
                    mode,
                    bounds: config.concurrency,
                    generation,
                    scopes: parking_lot::Mutex::default(),
                    waiting: Waiting::default(),
                    series: ConcurrencySeries::new(&self.metrics, name),
                    owner: Arc::downgrade(self),
                })
            });
            next.insert(name.clone(), limit);
        }
        *upstreams = next;
    }

    /// `upstream`'s limits, if it has a `concurrency`.
    pub(crate) fn for_upstream(&self, upstream: &str) -> Option<Arc<UpstreamLimit>> {
        self.upstreams.lock().get(upstream).cloned()
    }

    /// Every upstream's limits (for the fleet sync).
    pub(crate) fn all(&self) -> Vec<Arc<UpstreamLimit>> {
        self.upstreams.lock().values().cloned().collect()
    }

    /// The fleet had `n` replicas sharing a scope.
    pub(crate) fn saw_replicas(&self, n: u32) {
        self.replicas.fetch_max(n.max(1), Ordering::Relaxed);
    }

    fn replicas(&self) -> u32 {
        self.replicas.load(Ordering::Relaxed).max(1)
    }
}

/// A number for an upstream's settings.
fn generation(mode: Mode, bounds: ConcurrencyBounds) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (mode, bounds).hash(&mut h);
    h.finish() & 0xffff_ffff
}

impl UpstreamLimit {
    /// The scope of `key`, made on first use (its series under `model`, a `[metrics] models`
    /// label).
    fn scope(&self, key: LimitKey, model: &str, now: Instant) -> Arc<Scope> {
        let mut scopes = self.scopes.lock();
        if let Some(s) = scopes.get(&key) {
            return s.clone();
        }
        if scopes.len() >= MAX_SCOPES {
            scopes.retain(|_, s| s.in_flight.load(Ordering::Relaxed) > 0 || s.state.lock().waiting > 0);
        }
        let replicas = self.owner.upgrade().map_or(1, |c| c.replicas());
        let aimd = match self.mode {
            Mode::Fixed(n) => Aimd::new(n, n, n),
            Mode::Adaptive => Aimd::new(self.bounds.initial, self.bounds.min, self.bounds.max),
        };
        let part = (aimd.limit() / replicas).max(1);
        let synced = aimd.exact();
        let series = self.series.scope(model);
        series.limit.set(i64::from(aimd.limit()));
        let scope = Arc::new(Scope {
            key,
            in_flight: AtomicU32::new(0),
            hold_bits: AtomicU64::new(0),
            state: parking_lot::Mutex::new(State {
                aimd,
                part,
                synced,
                grown: 0.0,
                lowered: None,
                decreases: 0,
                waiting: 0,
                last_used: now,
            }),
            series,
        });
        scopes.insert(key, scope.clone());
        drop(scopes);
        // A new scope hears from the fleet at once, not at the next tick.
        if let Some(c) = self.owner.upgrade() {
            c.urgent.notify_one();
        }
        scope
    }

    /// Every scope (for the fleet sync).
    pub(crate) fn scopes(&self) -> Vec<Arc<Scope>> {
        self.scopes.lock().values().cloned().collect()
    }

    pub(crate) fn adaptive(&self) -> bool {
        self.mode == Mode::Adaptive
    }

    pub(crate) fn bounds(&self) -> (u32, u32, u32) {
        match self.mode {
            Mode::Fixed(n) => (n, n, n),
            Mode::Adaptive => (self.bounds.initial, self.bounds.min, self.bounds.max),
        }
    }

    /// Admits a request of `key` (model label `model`) at `now` if its scope has room here:
    /// `queued`, its place when it waited (it may pass only at the head of the queue).
    pub(crate) fn try_acquire(
        self: &Arc<Self>,
        key: LimitKey,
        model: &str,
        queued: Option<&Place>,
        now: Instant,
    ) -> Acquired {
        let scope = self.scope(key, model, now);
        let allowance = {
            let mut st = scope.state.lock();
            st.last_used = now;
            // Who waits goes first: one queued passes at the head only, one new only when
            // nobody waits.
            let others_wait = match queued {
                Some(place) => !self.waiting.is_head(place),
                None => st.waiting > 0,
            };
            if others_wait {
                return Acquired::Full;
            }
            st.allowance()
        };
        let running = scope.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        if running > allowance {
            scope.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Acquired::Full;
        }
        scope.series.in_flight.inc();
        Acquired::Ok(Slot {
            upstream: self.clone(),
            scope,
            at_limit: running * 2 >= allowance,
            since: now,
            served: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Queues a request of `key` on this replica (its queue share: `route`) until `until`, when
    /// it can expect a place it can use before then and before its `deadline`
    /// ([`aimd::may_wait`]); `None` when it cannot, or the queue is full.
    pub(crate) fn queue(
        self: &Arc<Self>,
        key: LimitKey,
        model: &str,
        route: &str,
        (until, deadline): (Instant, Instant),
    ) -> Option<Queued> {
        let now = time::now();
        let scope = self.scope(key, model, now);
        let (position, allowance) = {
            let st = scope.state.lock();
            (st.waiting + 1, st.allowance())
        };
        let left = (
            until.saturating_duration_since(now),
            deadline.saturating_duration_since(now),
        );
        if !aimd::may_wait(position, allowance, scope.hold(), left) {
            return None;
        }
        let share = QueueShare {
            value: hash16(route.as_bytes()),
            weight: 1,
        };
        let place = match self.waiting.join(bucket_of(&key), share, until) {
            Ok(p) => p,
            Err(Full) => return None,
        };
        scope.state.lock().waiting += 1;
        Some(Queued {
            place,
            since: now,
            until,
            limit: self.clone(),
            scope,
            served: false,
        })
    }

    fn adjusted(&self, scope: &Scope, adjusted: Adjusted) {
        match adjusted {
            Adjusted::Down(signal, limit) => {
                self.series.adjusted(false, signal.as_str());
                scope.series.limit.set(limit.floor() as i64);
                if let Some(c) = self.owner.upgrade() {
                    c.urgent.notify_one();
                }
            }
            Adjusted::Up(limit) => {
                self.series.adjusted(true, "success");
                scope.series.limit.set(limit.floor() as i64);
            }
        }
    }

    /// The fleet's answer for `scope`: its limit, whether it was lowered since this replica last
    /// heard (a count of decreases), this replica's part, the replicas sharing it.
    pub(crate) fn synced(&self, scope: &Scope, answer: sync::Answer, now: Instant) {
        {
            let mut st = scope.state.lock();
            tracing::debug!(upstream = %self.name, ?answer, waiting = st.waiting, "concurrency exchanged with the fleet");
            let lowered = answer.decreases > st.decreases;
            st.decreases = answer.decreases;
            st.aimd.set(answer.limit, lowered, now);
            st.synced = answer.limit;
            st.part = answer.part;
        }
        scope.series.limit.set(answer.limit.floor() as i64);
        if let Some(c) = self.owner.upgrade() {
            c.saw_replicas(answer.replicas);
        }
        self.waiting.wake();
    }
}

impl Scope {
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// How long a place is held by a success, smoothed (`None` before the first ended).
    pub(crate) fn hold(&self) -> Option<Duration> {
        let bits = self.hold_bits.load(Ordering::Relaxed);
        (bits != 0).then(|| Duration::from_secs_f64(f64::from_bits(bits) / 1e6))
    }

    /// A place was held `held` (a lost race between two updates loses one sample, never corrupts).
    fn held(&self, held: Duration) {
        let sample = (held.as_secs_f64() * 1e6).max(1.0);
        let bits = self.hold_bits.load(Ordering::Relaxed);
        let next = match bits {
            0 => sample,
            b => f64::from_bits(b) + HOLD_ALPHA * (sample - f64::from_bits(b)),
        };
        self.hold_bits.store(next.to_bits(), Ordering::Relaxed);
    }
}

/// How much of a new hold time the smoothed one takes.
const HOLD_ALPHA: f64 = 0.1;

/// A request in flight on a scope: given back when dropped (an attempt that failed at once; the
/// response's body when it ends).
pub(crate) struct Slot {
    upstream: Arc<UpstreamLimit>,
    scope: Arc<Scope>,
    /// At least half the requests this replica may run were running when it was admitted.
    at_limit: bool,
    /// When it was admitted.
    since: Instant,
    /// Its answer was a success: how long it is held is a service time.
    served: std::sync::atomic::AtomicBool,
}

/// An attempt's answer, as the limit sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    pub(crate) sent: Instant,
    pub(crate) received: Instant,
    /// The overload it signals, if any.
    pub(crate) signal: Option<Signal>,
    /// A success (2xx at its commit point).
    pub(crate) ok: bool,
}

impl Slot {
    /// How long a place of its scope is held by a success, smoothed.
    pub(crate) fn hold(&self) -> Option<Duration> {
        self.scope.hold()
    }

    /// Adjusts the limit on an attempt's answer (a fixed limit does not move).
    pub(crate) fn observe(&self, seen: Seen) {
        if seen.ok && seen.signal.is_none() {
            self.served.store(true, Ordering::Relaxed);
        }
        if !self.upstream.adaptive() {
            return;
        }
        let adjusted = {
            let mut st = self.scope.state.lock();
            let now = seen.received;
            match seen.signal {
                Some(signal) => {
                    let adjusted = st.aimd.overload(signal, seen.sent, now);
                    if adjusted.is_some() {
                        let limit = st.aimd.exact();
                        st.lowered = Some(st.lowered.map_or(limit, |l| l.min(limit)));
                        st.grown = 0.0;
                    }
                    adjusted
                }
                None if seen.ok => {
                    let before = st.aimd.exact();
                    let success = Success {
                        sent: seen.sent,
                        first_byte: seen.received.saturating_duration_since(seen.sent),
                        at_limit: self.at_limit,
                    };
                    let adjusted = st.aimd.success(success, now);
                    match adjusted {
                        Some(Adjusted::Down(..)) => {
                            let limit = st.aimd.exact();
                            st.lowered = Some(st.lowered.map_or(limit, |l| l.min(limit)));
                            st.grown = 0.0;
                        }
                        _ => st.grown += st.aimd.growth_since(before),
                    }
                    adjusted
                }
                None => None,
            }
        };
        if let Some(a) = adjusted {
            self.upstream.adjusted(&self.scope, a);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // A failure frees its place at once: only a success says how long a place is held.
        if self.served.load(Ordering::Relaxed) {
            self.scope.held(time::now().saturating_duration_since(self.since));
        }
        self.scope.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.scope.series.in_flight.dec();
        self.upstream.waiting.wake();
    }
}

/// The queue of a scope.
fn bucket_of(key: &LimitKey) -> BucketKey {
    BucketKey(hash16(key.to_string().as_bytes()))
}

fn hash16(bytes: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out.copy_from_slice(&blake3::hash(bytes).as_bytes()[..16]);
    out
}
