//! Circuit breaking and rate-limit cooldowns per upstream: the local mirror the request path
//! reads, without ever waiting for Redis.
//!
//! - [`breaker`]: the pure breaker state machine (closed, open, half-open);
//! - [`cooldown`]: the pure "no calls before T" table per credential, and the credential hash;
//! - [`shared`]: the background task that shares both across the fleet through Redis.
//!
//! # What the pipeline calls, and when
//! - before each attempt (the first and every retry), [`Circuits::admit`] (or
//!   [`Circuits::admit_first`] over the primary and its fallbacks). `Rejected` means the circuit
//!   is open (or half-open with its probes out): no upstream call; try the next fallback, or
//!   answer 503 `circuit_open` with `retry-after`. A rejection in the middle of a retry loop ends
//!   the loop.
//! - after the attempt, [`Permit::record`] with the attempt's [`Outcome`] and the provider's
//!   explicit Retry-After (`retry-after-ms` / `retry-after`), if any. Dropping a permit without
//!   recording (the client went away, the attempt was cancelled) gives it back: a probe frees its
//!   slot.
//! - before sending, [`Circuits::cooldown_check`] with the [`CredentialHash`] of the credential
//!   headers as they go upstream; after a 429 with any reset hint, [`Circuits::cooldown_note`].
//!   When a cooldown makes the pipeline answer 429 `cooldown`, [`Circuits::count_cooldown_rejection`].
//! - pacing rides on the same machinery ([`Hold::Pacing`]: a second table per upstream, shared
//!   through the same Redis hash and channel, its fields prefixed `p:`): after a response that
//!   says a credential has at most `pacing_reserve` requests left, [`Circuits::hold_note`] with
//!   the quota's reset; before sending, [`Circuits::hold_check`] says how long to wait.
//!
//! Locks are `parking_lot::Mutex`es held for a few field updates, never across an `.await`.

pub mod breaker;
pub mod cooldown;
pub mod shared;

use foldhash::HashMap;
use parking_lot::Mutex;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use breaker::{Attempt, CircuitState};
pub(crate) use cooldown::release_delay;
pub use cooldown::{CredentialHash, LimitKey};

use self::breaker::{Breaker, BreakerConfig, Deltas, LeaseReport, Ticket, Transition};
use self::cooldown::CooldownTable;
use crate::config::{Config, CooldownMode, PacingMode, RetryPolicy};
use crate::metrics::Metrics;
use crate::redis::RedisHandle;
use crate::retry::policy::Outcome;
use crate::time::{self, Instant};

/// How often breakers' timers are applied (gauges, lapsed probes) when nothing else does it.
const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// Cooldowns waiting to be shared, per upstream, at most.
const OUTBOX_CAPACITY: usize = 1024;

/// Every upstream's breaker and cooldowns.
pub struct Circuits {
    entries: HashMap<String, Arc<Entry>>,
    wake: Arc<Notify>,
    sync_interval: Duration,
}

/// One upstream.
pub(crate) struct Entry {
    pub(crate) name: String,
    /// `None`: the upstream names no `[circuit.*]`; every call is allowed.
    breaker: Option<Mutex<Cell>>,
    /// The breaker is shared through Redis (`shared = true` and `[redis]` set).
    pub(crate) shared: bool,
    cooldown_mode: CooldownMode,
    /// Cooldowns are shared through Redis (`[redis]` set, `cooldown` not `off`).
    pub(crate) share_cooldowns: bool,
    cooldowns: Mutex<Cooldowns>,
    pacing_mode: PacingMode,
    /// Pacing holds are shared through Redis (`[redis]` set, `pacing` not `off`).
    pub(crate) share_pacing: bool,
    pacing: Mutex<Cooldowns>,
    /// Credentials whose quota is used up (shared whenever `[redis]` is set).
    share_exhausted: bool,
    exhausted: Mutex<Cooldowns>,
    /// The local breaker tripped: send the counts now rather than at the next tick.
    flush_now: AtomicBool,
    metrics: Arc<Metrics>,
    wake: Arc<Notify>,
}

/// A breaker and the newest fleet generation it has seen.
pub(crate) struct Cell {
    pub(crate) breaker: Breaker,
    pub(crate) fleet_gen: u64,
}

struct Cooldowns {
    table: CooldownTable,
    /// Noted here, not yet written to Redis.
    outbox: HashMap<LimitKey, Instant>,
}

impl Cooldowns {
    fn new() -> Mutex<Cooldowns> {
        Mutex::new(Cooldowns {
            table: CooldownTable::default(),
            outbox: HashMap::default(),
        })
    }

    /// Queues a deadline for the fleet (bounded: expired entries make room first).
    fn queue(&mut self, cred: LimitKey, until: Instant, now: Instant) {
        if self.outbox.len() >= OUTBOX_CAPACITY && !self.outbox.contains_key(&cred) {
            self.outbox.retain(|_, t| *t > now);
        }
        if self.outbox.len() < OUTBOX_CAPACITY || self.outbox.contains_key(&cred) {
            let t = self.outbox.entry(cred).or_insert(until);
            *t = (*t).max(until);
        }
    }
}

/// What keeps calls with a credential from going out: a 429's cooldown, or pacing (its request
/// quota nearly spent until its reset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    Cooldown,
    Pacing,
    /// A quota used up: the credential is avoided until its reset, whatever the
    /// upstream's cooldown mode; never waited for.
    Exhausted,
}

impl Hold {
    /// The field of the upstream's Redis hash that holds `cred`'s deadline (pacing prefixed, so
    /// that a replica that does not know pacing ignores it).
    pub(crate) fn field(self, cred: LimitKey) -> String {
        match self {
            Hold::Cooldown => cred.to_string(),
            Hold::Pacing => format!("p:{cred}"),
            Hold::Exhausted => format!("x:{cred}"),
        }
    }

    /// The hold and credential a field names.
    pub(crate) fn parse_field(field: &str) -> Option<(Hold, LimitKey)> {
        if let Some(cred) = field.strip_prefix("p:") {
            return Some((Hold::Pacing, cred.parse().ok()?));
        }
        if let Some(cred) = field.strip_prefix("x:") {
            return Some((Hold::Exhausted, cred.parse().ok()?));
        }
        Some((Hold::Cooldown, field.parse().ok()?))
    }
}

/// What the shared layer takes from an entry at each sync.
#[derive(Debug, Default)]
pub(crate) struct Outgoing {
    pub(crate) deltas: Deltas,
    pub(crate) reports: Vec<LeaseReport>,
    pub(crate) wants_lease: bool,
    pub(crate) flush_now: bool,
    pub(crate) cooldowns: Vec<(LimitKey, Instant)>,
    pub(crate) pacing: Vec<(LimitKey, Instant)>,
    pub(crate) exhausted: Vec<(LimitKey, Instant)>,
}

/// The answer to "may this attempt go to that upstream now?".
#[must_use]
#[derive(Debug)]
pub enum Admission {
    /// Go ahead; record the outcome on the permit.
    Allowed(Permit),
    /// The circuit is open (or its half-open probes are out): come back after `retry_after`.
    Rejected { retry_after: Duration },
}

/// Permission for one attempt. [`Permit::record`] its outcome; dropping it unrecorded gives it
/// back without one (a half-open probe frees its slot).
#[must_use = "record the attempt's outcome on the permit"]
pub struct Permit {
    held: Option<(Arc<Entry>, Ticket)>,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("upstream", &self.held.as_ref().map(|(e, _)| e.name.as_str()))
            .field("probe", &self.is_probe())
            .finish()
    }
}

impl Permit {
    /// A permit for an upstream without a breaker.
    fn unguarded() -> Permit {
        Permit { held: None }
    }

    /// Whether this attempt is a half-open trial.
    pub fn is_probe(&self) -> bool {
        self.held.as_ref().is_some_and(|(_, t)| t.is_probe())
    }

    /// Records the attempt's outcome. `retry_after` is the provider's explicit Retry-After
    /// (`RetryHint::delay` when `source.is_explicit()`), a floor for an opening it causes.
    pub fn record(mut self, outcome: Outcome, retry_after: Option<Duration>, now: Instant) {
        if let Some((entry, ticket)) = self.held.take() {
            entry.record(ticket, outcome, retry_after, now);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some((entry, ticket)) = self.held.take() {
            entry.abandon(ticket, time::now());
        }
    }
}

/// How long a probe may hold its slot (and its fleet lease) without reporting: the longest an
/// attempt can take before its outcome is known under any retry policy (`per_try_timeout` plus
/// `first_byte_timeout`, but never past the `deadline`, which bounds both), plus a second.
pub fn probe_lease(config: &Config) -> Duration {
    let default = RetryPolicy::no_retries();
    config
        .retry
        .values()
        .map(|p| p.as_ref())
        .chain(std::iter::once(&default))
        .map(|p| p.per_try_timeout.saturating_add(p.first_byte_timeout).min(p.deadline))
        .max()
        .unwrap_or(Duration::from_secs(90))
        .saturating_add(Duration::from_secs(1))
}

impl Circuits {
    /// A breaker for every upstream whose `circuit` names a policy, a cooldown table for every
    /// upstream, all closed and empty.
    pub fn new(config: &Config, metrics: Arc<Metrics>) -> Circuits {
        let now = time::now();
        let wake = Arc::new(Notify::new());
        let lease = probe_lease(config);
        let redis = config.redis.is_some();
        let entries = config
            .upstreams
            .iter()
            .map(|(name, u)| {
                let policy = u.circuit.as_ref().and_then(|c| config.circuit.get(c));
                let shared = redis && policy.is_some_and(|p| p.shared);
                let breaker = policy.map(|p| {
                    let b = Breaker::new(BreakerConfig::new(p, lease), now);
                    metrics
                        .circuit_state
                        .with_label_values(&[name])
                        .set(CircuitState::Closed.gauge());
                    Mutex::new(Cell {
                        breaker: if shared { b.shared() } else { b },
                        fleet_gen: 0,
                    })
                });
                let entry = Entry {
                    name: name.clone(),
                    breaker,
                    shared,
                    cooldown_mode: u.cooldown,
                    share_cooldowns: redis && u.cooldown != CooldownMode::Off,
                    cooldowns: Cooldowns::new(),
                    pacing_mode: u.pacing,
                    share_pacing: redis && u.pacing != PacingMode::Off,
                    pacing: Cooldowns::new(),
                    share_exhausted: redis,
                    exhausted: Cooldowns::new(),
                    flush_now: AtomicBool::new(false),
                    metrics: metrics.clone(),
                    wake: wake.clone(),
                };
                (name.clone(), Arc::new(entry))
            })
            .collect();
        Circuits {
            entries,
            wake,
            sync_interval: config
                .redis
                .as_ref()
                .map_or(Duration::from_millis(250), |r| r.sync_interval),
        }
    }

    /// Starts the background work: with `redis`, the fleet sync ([`shared`]); without, a timer
    /// that applies elapsed open times to the gauges and prunes expired cooldowns. Both stop with
    /// `stop`.
    pub fn start(self: &Arc<Self>, redis: Option<RedisHandle>, tasks: &TaskTracker, stop: CancellationToken) {
        match redis {
            Some(redis) => shared::spawn(self.clone(), redis, tasks, stop),
            None => {
                let circuits = self.clone();
                tasks.spawn(async move {
                    let mut tick = tokio::time::interval(REFRESH_INTERVAL);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tokio::select! {
                            _ = stop.cancelled() => break,
                            _ = tick.tick() => circuits.refresh(time::now()),
                        }
                    }
                });
            }
        }
    }

    /// May an attempt go to `upstream` now? Upstreams without a breaker (or unknown names) are
    /// always allowed.
    pub fn admit(&self, upstream: &str, attempt: Attempt, now: Instant) -> Admission {
        match self.entries.get(upstream) {
            Some(entry) => entry.admit(attempt, now),
            None => Admission::Allowed(Permit::unguarded()),
        }
    }

    /// The state of `upstream`'s circuit (`None` without a breaker).
    pub fn state(&self, upstream: &str, now: Instant) -> Option<CircuitState> {
        let entry = self.entries.get(upstream)?;
        let cell = entry.breaker.as_ref()?.lock();
        Some(cell.breaker.state(now))
    }

    /// How long `upstream`'s circuit stays open from `now` (`None` when it is not open): when a
    /// failure rebound delivers can be tried again.
    pub(crate) fn open_for(&self, upstream: &str, now: Instant) -> Option<Duration> {
        let entry = self.entries.get(upstream)?;
        let cell = entry.breaker.as_ref()?.lock();
        let until = cell
            .breaker
            .open_until()
            .filter(|_| cell.breaker.state(now) == CircuitState::Open)?;
        Some(until.saturating_duration_since(now)).filter(|d| !d.is_zero())
    }

    /// The time left before calls to `upstream` with `cred` may go out, if a cooldown holds them
    /// (always `None` with `cooldown = "off"`).
    pub fn cooldown_check(&self, upstream: &str, cred: &LimitKey, now: Instant) -> Option<Duration> {
        self.hold_check(Hold::Cooldown, upstream, cred, now)
    }

    /// Whether any cooldown holds calls to `upstream` (cheap: lets the hot path skip hashing the
    /// credential when none does).
    pub(crate) fn cooldowns_active(&self, upstream: &str) -> bool {
        self.hold_active(Hold::Cooldown, upstream)
    }

    /// No calls to `upstream` with `cred` before `until` (a 429's reset hint, from the moment
    /// the response arrived). Shared with the fleet when `[redis]` is set.
    pub fn cooldown_note(&self, upstream: &str, cred: LimitKey, until: Instant, now: Instant) {
        self.hold_note(Hold::Cooldown, upstream, cred, until, now);
    }

    /// [`Circuits::cooldown_check`] for either hold (always `None` when its mode is `off`).
    pub(crate) fn hold_check(&self, hold: Hold, upstream: &str, cred: &LimitKey, now: Instant) -> Option<Duration> {
        let entry = self.entries.get(upstream)?;
        entry.holds(hold).and_then(|h| h.lock().table.check(cred, now))
    }

    /// Whether a hold of `hold` is in force on `upstream` for `credential`, for any model.
    pub(crate) fn hold_any(&self, hold: Hold, upstream: &str, credential: &CredentialHash, now: Instant) -> bool {
        let Some(entry) = self.entries.get(upstream) else {
            return false;
        };
        entry
            .holds(hold)
            .is_some_and(|h| h.lock().table.any_for(credential, now))
    }

    /// [`Circuits::cooldowns_active`] for either hold.
    pub(crate) fn hold_active(&self, hold: Hold, upstream: &str) -> bool {
        self.entries
            .get(upstream)
            .and_then(|e| e.holds(hold))
            .is_some_and(|h| !h.lock().table.is_empty())
    }

    /// [`Circuits::cooldown_note`] for either hold.
    pub(crate) fn hold_note(&self, hold: Hold, upstream: &str, cred: LimitKey, until: Instant, now: Instant) {
        let Some(entry) = self.entries.get(upstream) else {
            return;
        };
        let Some(holds) = entry.holds(hold) else {
            return;
        };
        let shared = entry.shares(hold);
        let extended = {
            let mut c = holds.lock();
            let extended = c.table.note(cred, until, now);
            if extended && shared {
                c.queue(cred, until, now);
            }
            extended
        };
        if extended && shared {
            self.wake.notify_one();
        }
    }

    /// Counts a request held by pacing (`rebound_pacing_waits_total`).
    pub(crate) fn count_pacing_wait(&self, upstream: &str, model: &str) {
        if let Some(entry) = self.entries.get(upstream) {
            entry
                .metrics
                .pacing_waits_total
                .with_label_values(&[&entry.name, model])
                .inc();
        }
    }

    /// Counts a request answered 429 `cooldown` (`rebound_cooldown_rejections_total`).
    pub(crate) fn count_cooldown_rejection(&self, upstream: &str, model: &str) {
        if let Some(entry) = self.entries.get(upstream) {
            entry
                .metrics
                .cooldown_rejections_total
                .with_label_values(&[&entry.name, model])
                .inc();
        }
    }

    /// Applies elapsed time: open circuits whose time is up become half-open (gauges follow),
    /// lapsed probes are freed, expired cooldowns dropped.
    pub(crate) fn refresh(&self, now: Instant) {
        for entry in self.entries.values() {
            entry.update(|cell| cell.breaker.advance(now));
            entry.cooldowns.lock().table.prune(now);
            entry.pacing.lock().table.prune(now);
            entry.exhausted.lock().table.prune(now);
        }
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = &Arc<Entry>> {
        self.entries.values()
    }

    pub(crate) fn entry(&self, upstream: &str) -> Option<&Arc<Entry>> {
        self.entries.get(upstream)
    }

    pub(crate) fn wake(&self) -> &Notify {
        &self.wake
    }

    pub(crate) fn sync_interval(&self) -> Duration {
        self.sync_interval
    }
}

impl Entry {
    /// Whether exhausted credentials are shared with the fleet.
    pub(crate) fn share_exhausted(&self) -> bool {
        self.share_exhausted
    }

    /// The table of `hold`, unless its mode is `off`.
    fn holds(&self, hold: Hold) -> Option<&Mutex<Cooldowns>> {
        match hold {
            Hold::Cooldown => (self.cooldown_mode != CooldownMode::Off).then_some(&self.cooldowns),
            Hold::Pacing => (self.pacing_mode != PacingMode::Off).then_some(&self.pacing),
            Hold::Exhausted => Some(&self.exhausted),
        }
    }

    /// Whether `hold` is shared with the fleet.
    fn shares(&self, hold: Hold) -> bool {
        match hold {
            Hold::Cooldown => self.share_cooldowns,
            Hold::Pacing => self.share_pacing,
            Hold::Exhausted => self.share_exhausted,
        }
    }

    fn admit(self: &Arc<Self>, attempt: Attempt, now: Instant) -> Admission {
        let Some(cell) = &self.breaker else {
            return Admission::Allowed(Permit::unguarded());
        };
        let (admission, transition, half_open) = {
            let mut cell = cell.lock();
            let (admission, transition) = cell.breaker.admit(attempt, now);
            let half_open = cell.breaker.state(now) == CircuitState::HalfOpen;
            (admission, transition, half_open)
        };
        if let Some(t) = transition {
            self.on_transition(t);
        }
        match admission {
            breaker::Admission::Allowed(ticket) => Admission::Allowed(Permit {
                held: Some((self.clone(), ticket)),
            }),
            breaker::Admission::Rejected { retry_after } => {
                self.metrics
                    .circuit_rejections_total
                    .with_label_values(&[&self.name])
                    .inc();
                if half_open && self.shared {
                    // Perhaps waiting for a fleet lease: let the sync task ask for one now.
                    self.wake.notify_one();
                }
                Admission::Rejected { retry_after }
            }
        }
    }

    fn record(&self, ticket: Ticket, outcome: Outcome, hint: Option<Duration>, now: Instant) {
        let leased = ticket.lease().is_some();
        let mut rng = rand::rng();
        self.update(|cell| cell.breaker.record(ticket, outcome, hint, now, &mut rng).transition);
        if leased {
            self.wake.notify_one();
        }
    }

    fn abandon(&self, ticket: Ticket, now: Instant) {
        let leased = ticket.lease().is_some();
        self.update(|cell| {
            cell.breaker.abandon(ticket, now);
            None
        });
        if leased {
            self.wake.notify_one();
        }
    }

    /// Runs `f` on the breaker under its lock, then applies the transition it returns to the
    /// metrics and the log (outside the lock).
    pub(crate) fn update(&self, f: impl FnOnce(&mut Cell) -> Option<Transition>) {
        let Some(cell) = &self.breaker else {
            return;
        };
        let transition = f(&mut cell.lock());
        if let Some(t) = transition {
            self.on_transition(t);
        }
    }

    /// Runs `f` on the breaker under its lock (`None` without a breaker).
    pub(crate) fn with_cell<R>(&self, f: impl FnOnce(&mut Cell) -> R) -> Option<R> {
        self.breaker.as_ref().map(|cell| f(&mut cell.lock()))
    }

    fn on_transition(&self, t: Transition) {
        let name = self.name.as_str();
        self.metrics.circuit_state.with_label_values(&[name]).set(t.to.gauge());
        self.metrics
            .circuit_transitions_total
            .with_label_values(&[name, t.to.as_str()])
            .inc();
        if self.shared && t.to == CircuitState::Open && t.cause != breaker::Cause::Fleet {
            // Tell the fleet now, not at the next tick.
            self.flush_now.store(true, Ordering::Relaxed);
            self.wake.notify_one();
        }
        let open_for_ms = t.open_for.map(|d| d.as_millis() as u64);
        if t.to == CircuitState::Open {
            tracing::warn!(
                upstream = name,
                from = t.from.as_str(),
                to = t.to.as_str(),
                cause = t.cause.as_str(),
                open_for_ms,
                "circuit opened"
            );
        } else {
            tracing::info!(
                upstream = name,
                from = t.from.as_str(),
                to = t.to.as_str(),
                cause = t.cause.as_str(),
                "circuit state changed"
            );
        }
    }

    /// Everything to send to the fleet since the last sync.
    pub(crate) fn take_outgoing(&self, now: Instant) -> Outgoing {
        let mut out = Outgoing::default();
        if self.shared {
            self.update(|cell| {
                let transition = cell.breaker.advance(now);
                out.deltas = cell.breaker.take_deltas();
                out.reports = cell.breaker.take_reports();
                out.wants_lease = cell.breaker.take_lease_demand(now);
                transition
            });
            out.flush_now = self.flush_now.swap(false, Ordering::Relaxed);
        }
        if self.share_cooldowns {
            let mut c = self.cooldowns.lock();
            out.cooldowns = c.outbox.drain().filter(|(_, t)| *t > now).collect();
            c.table.prune(now);
        }
        if self.share_pacing {
            let mut c = self.pacing.lock();
            out.pacing = c.outbox.drain().filter(|(_, t)| *t > now).collect();
            c.table.prune(now);
        }
        if self.share_exhausted {
            let mut c = self.exhausted.lock();
            out.exhausted = c.outbox.drain().filter(|(_, t)| *t > now).collect();
            c.table.prune(now);
        }
        out
    }

    /// Puts back what could not be sent: recent deltas, and holds still ahead.
    pub(crate) fn restore_outgoing(&self, deltas: Deltas, holds: Vec<(Hold, LimitKey, Instant)>, now: Instant) {
        if !deltas.is_empty() {
            self.update(|cell| {
                cell.breaker.restore_deltas(deltas, now);
                None
            });
        }
        for (hold, cred, until) in holds {
            if let Some(h) = self.holds(hold).filter(|_| until > now) {
                h.lock().queue(cred, until, now);
            }
        }
    }

    /// A hold learned from the fleet (not shared again).
    pub(crate) fn hold_from_fleet(&self, hold: Hold, cred: LimitKey, until: Instant, now: Instant) {
        if let Some(h) = self.holds(hold) {
            h.lock().table.note(cred, until, now);
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use http::StatusCode;
    use std::path::Path;

    fn config(extra: &str) -> Config {
        let src = format!(
            r#"
[upstreams.a]
url = "http://127.0.0.1:1"
circuit = "c"

[upstreams.b]
url = "http://127.0.0.1:2"
circuit = "c"

[upstreams.plain]
url = "http://127.0.0.1:3"
cooldown = "off"

[circuit.c]
consecutive_failures = 2
open_for = "1s"
max_open_for = "10s"

[[routes]]
name = "a"
path_prefix = "/a/"
upstream = "a"
fallback = ["b"]
{extra}
"#
        );
        Config::parse(&src, Path::new("test.toml"), &|_| None).unwrap()
    }

    fn circuits() -> (Circuits, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new().unwrap());
        (Circuits::new(&config(""), metrics.clone()), metrics)
    }

    fn fail(c: &Circuits, upstream: &str, now: Instant) {
        match c.admit(upstream, Attempt::First, now) {
            Admission::Allowed(p) => p.record(Outcome::Status(StatusCode::BAD_GATEWAY), None, now),
            Admission::Rejected { .. } => panic!("rejected"),
        }
    }

    fn page(m: &Metrics) -> String {
        String::from_utf8(m.render()).unwrap()
    }

    #[test]
    fn opens_rejects_and_counts() {
        let (c, m) = circuits();
        let now = crate::time::now();
        fail(&c, "a", now);
        fail(&c, "a", now);
        assert_eq!(c.state("a", now), Some(CircuitState::Open));
        assert_eq!(c.state("b", now), Some(CircuitState::Closed));
        assert_eq!(c.state("plain", now), None);
        match c.admit("a", Attempt::First, now) {
            Admission::Rejected { retry_after } => assert!(retry_after >= Duration::from_secs(1)),
            other => panic!("{other:?}"),
        }
        let p = page(&m);
        assert!(p.contains("rebound_circuit_state{upstream=\"a\"} 2"), "{p}");
        assert!(p.contains("rebound_circuit_state{upstream=\"b\"} 0"), "{p}");
        assert!(
            p.contains("rebound_circuit_transitions_total{to=\"open\",upstream=\"a\"} 1"),
            "{p}"
        );
        assert!(p.contains("rebound_circuit_rejections_total{upstream=\"a\"} 1"), "{p}");

        // After open_for the gauge follows without traffic (refresh), and a probe closes it.
        let later = now + Duration::from_millis(1200);
        c.refresh(later);
        assert!(page(&m).contains("rebound_circuit_state{upstream=\"a\"} 1"));
        let Admission::Allowed(probe) = c.admit("a", Attempt::First, later) else {
            panic!("probe expected");
        };
        assert!(probe.is_probe());
        probe.record(Outcome::Status(StatusCode::OK), None, later);
        assert_eq!(c.state("a", later), Some(CircuitState::Closed));
        let p = page(&m);
        assert!(p.contains("rebound_circuit_state{upstream=\"a\"} 0"), "{p}");
        assert!(
            p.contains("rebound_circuit_transitions_total{to=\"half_open\",upstream=\"a\"} 1"),
            "{p}"
        );
        assert!(
            p.contains("rebound_circuit_transitions_total{to=\"closed\",upstream=\"a\"} 1"),
            "{p}"
        );
    }

    #[test]
    fn unguarded_upstreams_are_always_allowed() {
        let (c, _) = circuits();
        let now = crate::time::now();
        for _ in 0..100 {
            fail(&c, "plain", now);
            fail(&c, "nonexistent", now);
        }
        assert!(matches!(c.admit("plain", Attempt::First, now), Admission::Allowed(_)));
    }

    #[test]
    fn a_dropped_probe_gives_its_slot_back() {
        let (c, _) = circuits();
        let now = crate::time::now();
        fail(&c, "a", now);
        fail(&c, "a", now);
        let later = now + Duration::from_secs(2);
        let probe = c.admit("a", Attempt::First, later);
        assert!(matches!(&probe, Admission::Allowed(p) if p.is_probe()));
        assert!(matches!(
            c.admit("a", Attempt::First, later),
            Admission::Rejected { .. }
        ));
        drop(probe);
        assert!(matches!(c.admit("a", Attempt::First, later), Admission::Allowed(p) if p.is_probe()));
    }

    #[test]
    fn cooldowns_per_credential_and_off() {
        let (c, m) = circuits();
        let now = crate::time::now();
        let k1 = LimitKey::from(CredentialHash([1; 16]));
        let k2 = LimitKey::from(CredentialHash([2; 16]));
        c.cooldown_note("a", k1, now + Duration::from_secs(3), now);
        assert_eq!(c.cooldown_check("a", &k1, now), Some(Duration::from_secs(3)));
        assert_eq!(c.cooldown_check("a", &k2, now), None);
        assert_eq!(c.cooldown_check("b", &k1, now), None, "per upstream");
        c.cooldown_note("plain", k1, now + Duration::from_secs(3), now);
        assert_eq!(c.cooldown_check("plain", &k1, now), None, "cooldown = off");
        c.count_cooldown_rejection("a", "other");
        assert!(page(&m).contains("rebound_cooldown_rejections_total{model=\"other\",upstream=\"a\"} 1"));
        // Without [redis] nothing waits to be shared.
        assert!(c.entry("a").unwrap().take_outgoing(now).cooldowns.is_empty());
    }

    #[test]
    fn shared_entries_queue_their_cooldowns_and_deltas() {
        let metrics = Arc::new(Metrics::new().unwrap());
        let c = Circuits::new(&config("\n[redis]\nurl = \"redis://127.0.0.1:1/0\"\n"), metrics);
        let now = crate::time::now();
        let k1 = LimitKey::from(CredentialHash([1; 16]));
        c.cooldown_note("a", k1, now + Duration::from_secs(3), now);
        c.cooldown_note("a", k1, now + Duration::from_secs(2), now);
        fail(&c, "a", now);
        let out = c.entry("a").unwrap().take_outgoing(now);
        assert_eq!(out.cooldowns, vec![(k1, now + Duration::from_secs(3))]);
        assert_eq!(out.deltas.failures, 1);
        // Nothing twice.
        let again = c.entry("a").unwrap().take_outgoing(now);
        assert!(again.cooldowns.is_empty() && again.deltas.is_empty());
        // Unsent work goes back.
        let holds = out.cooldowns.iter().map(|(c, t)| (Hold::Cooldown, *c, *t)).collect();
        c.entry("a").unwrap().restore_outgoing(out.deltas, holds, now);
        let out = c.entry("a").unwrap().take_outgoing(now);
        assert_eq!(out.deltas.failures, 1);
        assert_eq!(out.cooldowns.len(), 1);
    }

    #[test]
    fn probe_lease_covers_the_slowest_attempt() {
        let cfg = config(
            "\n[retry.slow]\nper_try_timeout = \"1000s\"\nfirst_byte_timeout = \"500s\"\ndeadline = \"2000s\"\n",
        );
        assert_eq!(probe_lease(&cfg), Duration::from_secs(1501));
        // The deadline bounds an attempt, so it bounds the lease too.
        let cfg = config(
            "\n[retry.slow]\nper_try_timeout = \"1000s\"\nfirst_byte_timeout = \"500s\"\ndeadline = \"1200s\"\n",
        );
        assert_eq!(probe_lease(&cfg), Duration::from_secs(1201));
        // The defaults: 600 s + 600 s, within the 900 s deadline.
        assert_eq!(probe_lease(&config("")), Duration::from_secs(901));
    }
}
