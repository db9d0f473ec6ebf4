//! One upstream's circuit breaker: a pure state machine. The caller passes the time and the RNG,
//! and applies what it returns (metrics, logs, sharing); nothing here sleeps, locks or talks to
//! Redis.
//!
//! # States
//! - **Closed**: every call is admitted. A failure opens the circuit when it is the
//!   `consecutive_failures`-th failure in a row, or when the sliding `window` holds at least
//!   `minimum_requests` calls of which at least `failure_rate` failed. Trips are evaluated when a
//!   failure is recorded (as Polly does): a success never opens the circuit.
//! - **Open** until a deadline: every call is rejected with the time left. The n-th opening in a
//!   row (n = 0 for the first) lasts `min(max_open_for, open_for * 2^n)`, plus an upward jitter of
//!   up to 10% (clamped again to `max_open_for`), so `open_for` is a true minimum and
//!   `max_open_for` a true maximum. A Retry-After hint sent with the failure that opened it is a
//!   floor, itself capped at `max_open_for` (the operator's cap wins, so a bogus hint cannot lock an
//!   upstream out for longer).
//! - **Half-open** once the deadline passes (lazily, on the next call or [`Breaker::advance`]):
//!   at most `half_open_probes` trial calls are in flight at once; the others are rejected with
//!   [`HALF_OPEN_RETRY_AFTER`]. `half_open_probes` probe successes close the circuit (and reset the
//!   doubling); one probe failure opens it again, for twice as long.
//!
//! # Outcomes
//! [`classify`] maps an attempt's [`Outcome`] to a [`Verdict`]: the `failure_on` outcomes are
//! failures; 429 is neutral (a rate-limit signal for the cooldown, not a health signal); a 5xx or
//! a transport failure that `failure_on` does not name is neutral too (no evidence either way);
//! every other response (2xx, 3xx, 4xx) is a success. An in-band error (a 2xx whose first event
//! is an error) counts as the status it stands for. Neutral outcomes neither count in the window
//! nor break a run of failures; a neutral probe just frees its slot.
//!
//! Retries of one request count in the window (they are real calls, and `minimum_requests` gates
//! the rate) but a failed retry does not add to the run of consecutive failures: a run counts
//! requests, so one request's retries cannot trip the breaker on their own faster than the window
//! allows. A successful retry does end a run.
//!
//! # Window
//! A ring of [`BUCKETS`] buckets, each `window / BUCKETS` wide (Hystrix, Resilience4j's time-based
//! window): a call counts for at least `0.9 * window` and at most `window`.
//!
//! # Tickets and lost probes
//! [`Breaker::admit`] hands out a [`Ticket`] that [`Breaker::record`] (or [`Breaker::abandon`],
//! when the caller gives up without an outcome) consumes. Every transition starts a new
//! generation: a ticket from an earlier one (a straggler admitted before the circuit opened, a
//! probe from before a remote close) is ignored, so stale results never move the state. A probe
//! holds its slot until it reports, is abandoned, or its lease (`probe_lease`, at least as long as
//! an attempt may take) runs out: a probe whose caller vanished cannot wedge the breaker.
//!
//! # Fleet hooks
//! The shared layer (`super::shared`) drives the same machine with remote state:
//! [`Breaker::apply_remote_open`], [`Breaker::apply_remote_half_open`],
//! [`Breaker::apply_remote_close`]. A phase entered or adopted from the fleet is marked *fleet*:
//! while the breaker is attached ([`Breaker::attach_until`], refreshed by each successful sync),
//! its half-open probes also need a fleet lease ([`Breaker::grant_lease`]), so that the whole
//! fleet sends at most `half_open_probes` probes. When syncs stop (Redis unreachable) the
//! attachment lapses and the breaker probes on its own: it never waits for Redis.
//! Outcomes counted in the window are also accumulated as [`Deltas`] for the fleet counters, and
//! leased probes' results as [`LeaseReport`]s.

use crate::words::spelled;
use std::time::Duration;

use rand::Rng;

use crate::config::{CircuitPolicy, FailureOn};
use crate::retry::policy::Outcome;
use crate::time::Instant;

mod fleet;
mod window;

pub use fleet::LeaseToken;

pub(crate) use fleet::{Deltas, LeaseReport, LeaseResult};
use window::Window;

/// Buckets in the sliding window.
pub(crate) const BUCKETS: usize = 10;

/// The retry-after given to calls rejected while half-open probes are in flight.
pub(crate) const HALF_OPEN_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Open durations get up to `1/OPEN_JITTER_DIVISOR` (10%) added at random.
pub(crate) const OPEN_JITTER_DIVISOR: u64 = 10;

/// Lease reports kept for the shared layer at most (it drains them every sync).
const MAX_REPORTS: usize = 64;

/// The state as exported (`rebound_circuit_state`: 0 closed, 1 half-open, 2 open).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CircuitState {
    Closed,
    HalfOpen,
    Open,
}

impl CircuitState {
    /// The value of the `rebound_circuit_state` gauge.
    pub(crate) const fn gauge(self) -> i64 {
        match self {
            CircuitState::Closed => 0,
            CircuitState::HalfOpen => 1,
            CircuitState::Open => 2,
        }
    }
}

// The `to` label of `rebound_circuit_transitions_total`.
spelled!(CircuitState { "closed" => Closed, "half_open" => HalfOpen, "open" => Open });

/// What an outcome means to the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Success,
    Failure,
    /// Neither: 429, or a failure `failure_on` does not name.
    Neutral,
}

/// The breaker's reading of an attempt's outcome (see the module documentation).
pub(crate) fn classify(outcome: Outcome, failure_on: &[FailureOn]) -> Verdict {
    let listed = |f: FailureOn| failure_on.contains(&f);
    let failure_if = |yes: bool| if yes { Verdict::Failure } else { Verdict::Neutral };
    match outcome {
        Outcome::ConnectFailure => failure_if(listed(FailureOn::ConnectFailure)),
        Outcome::Reset | Outcome::RefusedStream => failure_if(listed(FailureOn::Reset)),
        Outcome::Timeout => failure_if(listed(FailureOn::Timeout)),
        // An in-band error counts as the status it stands for.
        Outcome::Status(s) | Outcome::InBand(s) if s.as_u16() == 429 => Verdict::Neutral,
        Outcome::Status(s) | Outcome::InBand(s) if s.is_server_error() => {
            failure_if(listed(FailureOn::AnyServerError) || listed(FailureOn::Status(s.as_u16())))
        }
        Outcome::Status(_) | Outcome::InBand(_) => Verdict::Success,
    }
}

/// Whether a call is a request's first attempt or a retry (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    First,
    Retry,
}

/// The breaker's parameters: a `[circuit.NAME]` policy plus the probe lease.
#[derive(Debug, Clone)]
pub struct BreakerConfig {
    pub consecutive_failures: u32,
    pub failure_rate: f64,
    pub minimum_requests: u32,
    pub window: Duration,
    pub open_for: Duration,
    pub max_open_for: Duration,
    pub half_open_probes: u32,
    pub failure_on: Vec<FailureOn>,
    /// How long an admitted probe may hold its slot without reporting: at least the longest an
    /// attempt can take before its outcome is known.
    pub probe_lease: Duration,
}

impl BreakerConfig {
    pub fn new(policy: &CircuitPolicy, probe_lease: Duration) -> BreakerConfig {
        BreakerConfig {
            consecutive_failures: policy.consecutive_failures.max(1),
            failure_rate: policy.failure_rate,
            minimum_requests: policy.minimum_requests.max(1),
            window: policy.window,
            open_for: policy.open_for,
            max_open_for: policy.max_open_for.max(policy.open_for),
            half_open_probes: policy.half_open_probes.max(1),
            failure_on: policy.failure_on.clone(),
            probe_lease,
        }
    }

    /// The width of one window bucket (at least 1 ms).
    pub(crate) fn bucket(&self) -> Duration {
        (self.window / BUCKETS as u32).max(Duration::from_millis(1))
    }

    /// A Retry-After floor, capped at `max_open_for`.
    pub(crate) fn hint_floor(&self, hint: Option<Duration>) -> Duration {
        hint.unwrap_or(Duration::ZERO).min(self.max_open_for)
    }
}

/// How long the `n`-th opening in a row (0 for the first) lasts, with `jitter_ppm` parts per
/// million (0..=1_000_000) of the 10% jitter span added: `min(max, open_for * 2^n)`, plus jitter,
/// clamped to `max_open_for`, floored at the (capped) hint. The fleet's Lua script computes the
/// same formula from a `jitter_ppm` drawn here.
pub(crate) fn open_duration_with(cfg: &BreakerConfig, n: u32, hint: Option<Duration>, jitter_ppm: u32) -> Duration {
    let doubled = 1u32
        .checked_shl(n)
        .and_then(|factor| cfg.open_for.checked_mul(factor))
        .unwrap_or(cfg.max_open_for)
        .min(cfg.max_open_for);
    let span_ms = u64::try_from(doubled.as_millis()).unwrap_or(u64::MAX) / OPEN_JITTER_DIVISOR;
    let extra_ms =
        u64::try_from(u128::from(span_ms) * u128::from(jitter_ppm.min(1_000_000)) / 1_000_000).unwrap_or(u64::MAX);
    let jittered = doubled
        .checked_add(Duration::from_millis(extra_ms))
        .unwrap_or(cfg.max_open_for)
        .min(cfg.max_open_for);
    jittered.max(cfg.hint_floor(hint))
}

/// [`open_duration_with`] with the jitter drawn from `rng`.
pub(crate) fn open_duration(cfg: &BreakerConfig, n: u32, hint: Option<Duration>, rng: &mut impl Rng) -> Duration {
    open_duration_with(cfg, n, hint, rng.random_range(0..=1_000_000))
}

/// Why the state changed (for logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    ConsecutiveFailures,
    FailureRate,
    OpenElapsed,
    ProbeFailed,
    ProbesSucceeded,
    /// Adopted from the fleet (Redis).
    Fleet,
}

spelled!(Cause {
    "consecutive_failures" => ConsecutiveFailures,
    "failure_rate" => FailureRate,
    "open_elapsed" => OpenElapsed,
    "probe_failed" => ProbeFailed,
    "probes_succeeded" => ProbesSucceeded,
    "fleet" => Fleet,
});

/// A state change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: CircuitState,
    pub to: CircuitState,
    pub(crate) cause: Cause,
    /// For transitions to open: for how long.
    pub open_for: Option<Duration>,
}

/// Permission for one call, consumed by [`Breaker::record`] or [`Breaker::abandon`].
#[derive(Debug, PartialEq, Eq)]
pub struct Ticket {
    generation: u64,
    kind: TicketKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TicketKind {
    Call(Attempt),
    Probe(Probe),
}

/// A half-open trial's ticket: its slot, and the fleet lease it holds, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Probe {
    id: u64,
    lease: Option<LeaseToken>,
}

impl Ticket {
    /// Whether this call is a half-open trial.
    pub fn is_probe(&self) -> bool {
        matches!(self.kind, TicketKind::Probe(_))
    }

    /// The fleet lease this probe holds, if any.
    pub fn lease(&self) -> Option<LeaseToken> {
        match self.kind {
            TicketKind::Probe(probe) => probe.lease,
            TicketKind::Call(_) => None,
        }
    }
}

/// The breaker's answer to "may I call?".
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    Allowed(Ticket),
    /// Come back after `retry_after` (the open time left, or [`HALF_OPEN_RETRY_AFTER`]).
    Rejected {
        retry_after: Duration,
    },
}

/// What [`Breaker::record`] made of an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    pub(crate) verdict: Verdict,
    pub(crate) transition: Option<Transition>,
    /// The ticket was from an earlier generation: ignored.
    pub stale: bool,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    id: u64,
    deadline: Instant,
    lease: Option<LeaseToken>,
}

#[derive(Debug, Clone, Copy)]
struct Credit {
    token: LeaseToken,
    /// Given back if no probe used it by then.
    use_by: Instant,
    /// When the fleet lease lapses.
    expires: Instant,
}

#[derive(Debug, Clone)]
enum Phase {
    Closed,
    Open {
        until: Instant,
        fleet: bool,
    },
    HalfOpen {
        slots: Vec<Slot>,
        successes: u32,
        fleet: bool,
    },
}

impl Phase {
    fn state(&self, now: Instant) -> CircuitState {
        match self {
            Phase::Closed => CircuitState::Closed,
            Phase::Open { until, .. } if now < *until => CircuitState::Open,
            Phase::Open { .. } | Phase::HalfOpen { .. } => CircuitState::HalfOpen,
        }
    }

    fn fleet(&self) -> bool {
        match self {
            Phase::Closed => false,
            Phase::Open { fleet, .. } | Phase::HalfOpen { fleet, .. } => *fleet,
        }
    }
}

/// One upstream's breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    cfg: BreakerConfig,
    phase: Phase,
    window: Window,
    /// First-attempt failures in a row.
    consecutive: u32,
    /// Openings since the circuit last closed (the doubling exponent).
    openings: u32,
    generation: u64,
    next_probe: u64,
    track_deltas: bool,
    deltas: Deltas,
    attached_until: Option<Instant>,
    credits: Vec<Credit>,
    reports: Vec<LeaseReport>,
    wants_lease: bool,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(cfg: BreakerConfig, now: Instant) -> Breaker {
        Breaker {
            window: Window::new(cfg.bucket(), now),
            cfg,
            phase: Phase::Closed,
            consecutive: 0,
            openings: 0,
            generation: 0,
            next_probe: 0,
            track_deltas: false,
            deltas: Deltas::default(),
            attached_until: None,
            credits: Vec::new(),
            reports: Vec::new(),
            wants_lease: false,
        }
    }

    /// Also accumulates [`Deltas`] for the fleet.
    pub fn shared(mut self) -> Breaker {
        self.track_deltas = true;
        self
    }

    pub fn config(&self) -> &BreakerConfig {
        &self.cfg
    }

    /// The state at `now` (an elapsed open reads as half-open).
    pub fn state(&self, now: Instant) -> CircuitState {
        self.phase.state(now)
    }

    /// While open: until when.
    pub(crate) fn open_until(&self) -> Option<Instant> {
        match self.phase {
            Phase::Open { until, .. } => Some(until),
            _ => None,
        }
    }

    #[cfg(test)]
    /// Whether the current open or half-open phase came from (or was adopted by) the fleet.
    pub(crate) fn is_fleet_phase(&self) -> bool {
        self.phase.fleet()
    }

    #[cfg(test)]
    /// Probe slots taken now (half-open only).
    pub(crate) fn probes_in_flight(&self) -> usize {
        match &self.phase {
            Phase::HalfOpen { slots, .. } => slots.len(),
            _ => 0,
        }
    }

    #[cfg(test)]
    /// (successes, failures) in the window at `now`.
    pub(crate) fn window_totals(&self, now: Instant) -> (u64, u64) {
        self.window.totals(now)
    }

    /// Applies the passage of time: an elapsed open becomes half-open; lapsed probe slots and
    /// unused fleet credits are freed.
    pub fn advance(&mut self, now: Instant) -> Option<Transition> {
        let mut transition = None;
        if let Phase::Open { until, fleet } = self.phase {
            if now >= until {
                self.generation += 1;
                self.phase = Phase::HalfOpen {
                    slots: Vec::new(),
                    successes: 0,
                    fleet,
                };
                transition = Some(Transition {
                    from: CircuitState::Open,
                    to: CircuitState::HalfOpen,
                    cause: Cause::OpenElapsed,
                    open_for: None,
                });
            }
        }
        if let Phase::HalfOpen { slots, .. } = &mut self.phase {
            let mut lapsed = Vec::new();
            slots.retain(|s| {
                let keep = s.deadline > now;
                if !keep {
                    lapsed.extend(s.lease);
                }
                keep
            });
            for token in lapsed {
                self.report(token, LeaseResult::Released);
            }
        }
        let mut expired = Vec::new();
        self.credits.retain(|c| {
            let keep = c.use_by > now && c.expires > now;
            if !keep {
                expired.push(c.token);
            }
            keep
        });
        for token in expired {
            self.report(token, LeaseResult::Released);
        }
        transition
    }

    /// May a call go out now?
    pub fn admit(&mut self, attempt: Attempt, now: Instant) -> (Admission, Option<Transition>) {
        let transition = self.advance(now);
        let fleet_probes = self.phase.fleet() && self.is_attached(now);
        let generation = self.generation;
        let probes = self.cfg.half_open_probes;
        let lease_for = self.cfg.probe_lease;
        let admission = match &mut self.phase {
            Phase::Closed => Admission::Allowed(Ticket {
                generation,
                kind: TicketKind::Call(attempt),
            }),
            Phase::Open { until, .. } => Admission::Rejected {
                retry_after: until.saturating_duration_since(now).max(Duration::from_millis(1)),
            },
            Phase::HalfOpen { slots, successes, .. } => {
                if slots.len() as u64 + u64::from(*successes) >= u64::from(probes) {
                    Admission::Rejected {
                        retry_after: HALF_OPEN_RETRY_AFTER,
                    }
                } else if fleet_probes {
                    match self.credits.pop() {
                        Some(credit) => {
                            let id = self.next_probe;
                            self.next_probe += 1;
                            slots.push(Slot {
                                id,
                                deadline: credit.expires,
                                lease: Some(credit.token),
                            });
                            Admission::Allowed(Ticket {
                                generation,
                                kind: TicketKind::Probe(Probe {
                                    id,
                                    lease: Some(credit.token),
                                }),
                            })
                        }
                        None => {
                            self.wants_lease = true;
                            Admission::Rejected {
                                retry_after: HALF_OPEN_RETRY_AFTER,
                            }
                        }
                    }
                } else {
                    let id = self.next_probe;
                    self.next_probe += 1;
                    slots.push(Slot {
                        id,
                        deadline: now + lease_for,
                        lease: None,
                    });
                    Admission::Allowed(Ticket {
                        generation,
                        kind: TicketKind::Probe(Probe { id, lease: None }),
                    })
                }
            }
        };
        (admission, transition)
    }

    /// Records the outcome of an admitted call. `hint` is the provider's Retry-After, if it sent
    /// one: a floor for an opening this failure causes.
    pub fn record(
        &mut self,
        ticket: Ticket,
        outcome: Outcome,
        hint: Option<Duration>,
        now: Instant,
        rng: &mut impl Rng,
    ) -> Recorded {
        let verdict = classify(outcome, &self.cfg.failure_on);
        if ticket.generation != self.generation {
            if let Some(token) = ticket.lease() {
                self.report(token, LeaseResult::Released);
            }
            return Recorded {
                verdict,
                transition: None,
                stale: true,
            };
        }
        let transition = match ticket.kind {
            TicketKind::Call(attempt) if matches!(self.phase, Phase::Closed) => {
                self.record_closed(attempt, verdict, hint, now, rng)
            }
            TicketKind::Probe(probe) if matches!(self.phase, Phase::HalfOpen { .. }) => {
                self.record_probe(probe, verdict, hint, now, rng)
            }
            // Same generation but another phase cannot happen (every transition starts a new
            // generation); ignore defensively.
            _ => None,
        };
        Recorded {
            verdict,
            transition,
            stale: false,
        }
    }

    fn record_probe(
        &mut self,
        probe: Probe,
        verdict: Verdict,
        hint: Option<Duration>,
        now: Instant,
        rng: &mut impl Rng,
    ) -> Option<Transition> {
        let Probe { id, lease } = probe;
        let mut done = false;
        if let Phase::HalfOpen { slots, successes, .. } = &mut self.phase {
            slots.retain(|s| s.id != id);
            if verdict == Verdict::Success {
                *successes += 1;
            }
            done = *successes >= self.cfg.half_open_probes;
        }
        if let Some(token) = lease {
            let result = match verdict {
                Verdict::Success => LeaseResult::Success,
                Verdict::Failure => LeaseResult::Failure { hint },
                Verdict::Neutral => LeaseResult::Released,
            };
            self.report(token, result);
        }
        match verdict {
            Verdict::Success if done => Some(self.close(Cause::ProbesSucceeded, now)),
            Verdict::Failure => {
                let fleet = self.phase.fleet();
                Some(self.open(Cause::ProbeFailed, hint, fleet, now, rng))
            }
            _ => None,
        }
    }

    fn record_closed(
        &mut self,
        attempt: Attempt,
        verdict: Verdict,
        hint: Option<Duration>,
        now: Instant,
        rng: &mut impl Rng,
    ) -> Option<Transition> {
        match verdict {
            Verdict::Neutral => None,
            Verdict::Success => {
                self.window.add(now, false);
                self.consecutive = 0;
                if self.track_deltas {
                    let d = &mut self.deltas;
                    d.successes = d.successes.saturating_add(1);
                    d.had_success = true;
                    d.tail_failures = 0;
                    d.since.get_or_insert(now);
                }
                None
            }
            Verdict::Failure => {
                self.window.add(now, true);
                if attempt == Attempt::First {
                    self.consecutive = self.consecutive.saturating_add(1);
                }
                if self.track_deltas {
                    let d = &mut self.deltas;
                    d.failures = d.failures.saturating_add(1);
                    if attempt == Attempt::First {
                        d.tail_failures = d.tail_failures.saturating_add(1);
                    }
                    d.max_hint = d.max_hint.max(hint);
                    d.since.get_or_insert(now);
                }
                let cause = if self.consecutive >= self.cfg.consecutive_failures {
                    Some(Cause::ConsecutiveFailures)
                } else {
                    let (s, f) = self.window.totals(now);
                    let total = s + f;
                    (total >= u64::from(self.cfg.minimum_requests) && f as f64 >= self.cfg.failure_rate * total as f64)
                        .then_some(Cause::FailureRate)
                };
                cause.map(|c| self.open(c, hint, false, now, rng))
            }
        }
    }

    /// Gives a ticket back without an outcome (the caller went away): a probe frees its slot.
    pub(crate) fn abandon(&mut self, ticket: Ticket, _now: Instant) {
        if let Some(token) = ticket.lease() {
            self.report(token, LeaseResult::Released);
        }
        if ticket.generation != self.generation {
            return;
        }
        if let (TicketKind::Probe(Probe { id, .. }), Phase::HalfOpen { slots, .. }) = (ticket.kind, &mut self.phase) {
            slots.retain(|s| s.id != id);
        }
    }

    fn open(
        &mut self,
        cause: Cause,
        hint: Option<Duration>,
        fleet: bool,
        now: Instant,
        rng: &mut impl Rng,
    ) -> Transition {
        let from = self.phase.state(now);
        let d = open_duration(&self.cfg, self.openings, hint, rng);
        self.openings = self.openings.saturating_add(1);
        self.enter_open(now + d, fleet);
        Transition {
            from,
            to: CircuitState::Open,
            cause,
            open_for: Some(d),
        }
    }

    fn enter_open(&mut self, until: Instant, fleet: bool) {
        self.generation += 1;
        self.phase = Phase::Open { until, fleet };
        self.consecutive = 0;
        self.window.clear();
        self.drop_credits();
    }

    fn close(&mut self, cause: Cause, now: Instant) -> Transition {
        let from = self.phase.state(now);
        self.generation += 1;
        self.phase = Phase::Closed;
        self.openings = 0;
        self.consecutive = 0;
        self.window.clear();
        self.drop_credits();
        Transition {
            from,
            to: CircuitState::Closed,
            cause,
            open_for: None,
        }
    }

    fn drop_credits(&mut self) {
        self.wants_lease = false;
        for c in std::mem::take(&mut self.credits) {
            self.report(c.token, LeaseResult::Released);
        }
    }

    fn report(&mut self, token: LeaseToken, result: LeaseResult) {
        if self.reports.len() >= MAX_REPORTS {
            self.reports.remove(0);
        }
        self.reports.push(LeaseReport { token, result });
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use http::StatusCode;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    const MS: Duration = Duration::from_millis(1);
    const SEC: Duration = Duration::from_secs(1);

    fn cfg() -> BreakerConfig {
        BreakerConfig {
            consecutive_failures: 5,
            failure_rate: 0.5,
            minimum_requests: 20,
            window: Duration::from_secs(30),
            open_for: Duration::from_secs(5),
            max_open_for: Duration::from_secs(300),
            half_open_probes: 1,
            failure_on: vec![
                FailureOn::ConnectFailure,
                FailureOn::Reset,
                FailureOn::Timeout,
                FailureOn::AnyServerError,
            ],
            probe_lease: Duration::from_secs(90),
        }
    }

    fn status(s: u16) -> Outcome {
        Outcome::Status(StatusCode::from_u16(s).unwrap())
    }

    /// A breaker on a fake timeline.
    struct T {
        b: Breaker,
        now: Instant,
        rng: StdRng,
        transitions: Vec<Transition>,
    }

    impl T {
        fn new(cfg: BreakerConfig) -> T {
            let now = crate::time::now();
            T {
                b: Breaker::new(cfg, now),
                now,
                rng: StdRng::seed_from_u64(1),
                transitions: Vec::new(),
            }
        }

        fn at(&mut self, d: Duration) {
            self.now += d;
        }

        fn admit_as(&mut self, attempt: Attempt) -> Admission {
            let (a, t) = self.b.admit(attempt, self.now);
            self.transitions.extend(t);
            a
        }

        fn admit(&mut self) -> Admission {
            self.admit_as(Attempt::First)
        }

        fn ticket(&mut self) -> Ticket {
            match self.admit() {
                Admission::Allowed(t) => t,
                other => panic!("expected admission, got {other:?}"),
            }
        }

        fn rejected(&mut self) -> Duration {
            match self.admit() {
                Admission::Rejected { retry_after } => retry_after,
                other => panic!("expected rejection, got {other:?}"),
            }
        }

        fn record(&mut self, ticket: Ticket, outcome: Outcome, hint: Option<Duration>) -> Recorded {
            let r = self.b.record(ticket, outcome, hint, self.now, &mut self.rng);
            self.transitions.extend(r.transition);
            r
        }

        fn call(&mut self, outcome: Outcome) -> Recorded {
            let t = self.ticket();
            self.record(t, outcome, None)
        }

        fn call_retry(&mut self, outcome: Outcome) -> Recorded {
            let t = match self.admit_as(Attempt::Retry) {
                Admission::Allowed(t) => t,
                other => panic!("expected admission, got {other:?}"),
            };
            self.record(t, outcome, None)
        }

        fn state(&self) -> CircuitState {
            self.b.state(self.now)
        }

        /// Opens the breaker with consecutive failures; returns how long it is open.
        fn trip(&mut self) -> Duration {
            for _ in 0..self.b.cfg.consecutive_failures {
                self.call(status(503));
            }
            assert_eq!(self.state(), CircuitState::Open);
            self.b.open_until().unwrap() - self.now
        }
    }

    /// The breaker of a `[circuit.c]` table with every default.
    fn default_cfg() -> BreakerConfig {
        let src = "[upstreams.u]\nurl = \"http://127.0.0.1:9\"\ncircuit = \"c\"\n[circuit.c]\n[[routes]]\nname = \"r\"\npath_prefix = \"/r/\"\nupstream = \"u\"\n";
        let config = crate::config::Config::parse(src, std::path::Path::new("t.toml"), &|_| None).expect("config");
        BreakerConfig::new(&config.circuit["c"], Duration::from_secs(90))
    }

    /// With the defaults, a target that flapped (down, up, down, up, down for a
    /// minute) carries traffic again within 10 s of recovering for good. Requests every 100 ms
    /// on an injected clock; the provider's health is a function of time.
    #[test]
    fn with_the_defaults_a_recovered_target_is_back_within_10s_even_after_flapping() {
        let healthy = |t: Duration| {
            let s = t.as_secs();
            (20..25).contains(&s) || (40..42).contains(&s) || s >= 102
        };
        let mut t = T::new(default_cfg());
        let start = t.now;
        let mut first_success_after_recovery = None;
        while t.now - start < Duration::from_secs(130) {
            let at = t.now - start;
            if let Admission::Allowed(ticket) = t.admit() {
                let outcome = if healthy(at) { status(200) } else { status(503) };
                t.record(ticket, outcome, None);
                if healthy(at) && at >= Duration::from_secs(102) && first_success_after_recovery.is_none() {
                    first_success_after_recovery = Some(at);
                }
            }
            t.at(100 * MS);
        }
        let back = first_success_after_recovery.expect("traffic again") - Duration::from_secs(102);
        assert!(back <= Duration::from_secs(10), "back {back:?} after recovering");
        assert_eq!(t.state(), CircuitState::Closed);
        // And it took 3 failures to open (the run before the first opening).
        let cfg = default_cfg();
        assert_eq!(
            (cfg.consecutive_failures, cfg.open_for, cfg.max_open_for),
            (3, 5 * SEC, 8 * SEC)
        );
    }

    #[test]
    fn classification() {
        let c = cfg();
        assert_eq!(classify(status(200), &c.failure_on), Verdict::Success);
        assert_eq!(classify(status(301), &c.failure_on), Verdict::Success);
        assert_eq!(classify(status(400), &c.failure_on), Verdict::Success);
        assert_eq!(classify(status(404), &c.failure_on), Verdict::Success);
        assert_eq!(classify(status(429), &c.failure_on), Verdict::Neutral);
        assert_eq!(classify(status(500), &c.failure_on), Verdict::Failure);
        assert_eq!(classify(status(529), &c.failure_on), Verdict::Failure);
        assert_eq!(classify(Outcome::ConnectFailure, &c.failure_on), Verdict::Failure);
        assert_eq!(classify(Outcome::Reset, &c.failure_on), Verdict::Failure);
        assert_eq!(classify(Outcome::RefusedStream, &c.failure_on), Verdict::Failure);
        assert_eq!(classify(Outcome::Timeout, &c.failure_on), Verdict::Failure);

        let only = [FailureOn::Status(503), FailureOn::Timeout];
        assert_eq!(classify(status(503), &only), Verdict::Failure);
        assert_eq!(classify(status(500), &only), Verdict::Neutral);
        assert_eq!(classify(Outcome::ConnectFailure, &only), Verdict::Neutral);
        assert_eq!(classify(Outcome::Reset, &only), Verdict::Neutral);
        assert_eq!(classify(Outcome::Timeout, &only), Verdict::Failure);
        assert_eq!(classify(status(429), &[]), Verdict::Neutral);

        // An in-band error (a 200 whose first event is an error) counts as its equivalent status.
        let in_band = |s: u16| Outcome::InBand(StatusCode::from_u16(s).unwrap());
        for s in [200, 429, 500, 529] {
            assert_eq!(
                classify(in_band(s), &c.failure_on),
                classify(status(s), &c.failure_on),
                "{s}"
            );
            assert_eq!(classify(in_band(s), &only), classify(status(s), &only), "{s}");
        }
    }

    #[test]
    fn consecutive_failures_open_exactly_at_the_threshold() {
        let mut t = T::new(cfg());
        for _ in 0..4 {
            t.call(Outcome::ConnectFailure);
        }
        assert_eq!(t.state(), CircuitState::Closed);
        let r = t.call(Outcome::Timeout);
        assert_eq!(r.verdict, Verdict::Failure);
        let tr = r.transition.unwrap();
        assert_eq!(
            (tr.from, tr.to, tr.cause),
            (CircuitState::Closed, CircuitState::Open, Cause::ConsecutiveFailures)
        );
        assert_eq!(t.state(), CircuitState::Open);
        let left = t.rejected();
        assert!(
            left >= Duration::from_secs(5) && left <= Duration::from_millis(5500),
            "{left:?}"
        );
    }

    #[test]
    fn a_success_breaks_the_run() {
        let mut t = T::new(cfg());
        for _ in 0..4 {
            t.call(status(500));
        }
        t.call(status(200));
        for _ in 0..4 {
            t.call(status(500));
        }
        assert_eq!(t.state(), CircuitState::Closed);
        t.call(status(500));
        assert_eq!(t.state(), CircuitState::Open);
    }

    #[test]
    fn client_errors_count_as_successes_and_break_the_run() {
        let mut t = T::new(cfg());
        for _ in 0..4 {
            t.call(status(502));
        }
        assert_eq!(t.call(status(404)).verdict, Verdict::Success);
        for _ in 0..4 {
            t.call(status(502));
        }
        assert_eq!(t.state(), CircuitState::Closed);
        assert_eq!(t.b.window_totals(t.now), (1, 8));
    }

    #[test]
    fn rate_limits_are_neither_success_nor_failure() {
        let mut t = T::new(cfg());
        for _ in 0..4 {
            t.call(status(500));
        }
        // Any number of 429s: the run goes on, the window does not grow.
        for _ in 0..100 {
            assert_eq!(t.call(status(429)).verdict, Verdict::Neutral);
        }
        assert_eq!(t.state(), CircuitState::Closed);
        assert_eq!(t.b.window_totals(t.now), (0, 4));
        t.call(status(500));
        assert_eq!(t.state(), CircuitState::Open);
    }

    #[test]
    fn failures_not_in_failure_on_are_neutral() {
        let mut c = cfg();
        c.failure_on = vec![FailureOn::Status(503)];
        let mut t = T::new(c);
        for _ in 0..10 {
            t.call(status(500));
            t.call(Outcome::ConnectFailure);
        }
        assert_eq!(t.state(), CircuitState::Closed);
        assert_eq!(t.b.window_totals(t.now), (0, 0));
        for _ in 0..5 {
            t.call(status(503));
        }
        assert_eq!(t.state(), CircuitState::Open);
    }

    #[test]
    fn failure_rate_needs_the_minimum_volume() {
        let mut c = cfg();
        c.consecutive_failures = 1000;
        let mut t = T::new(c);
        // 19 calls, all failures but alternating with successes to keep runs short: 10 failures.
        for i in 0..19 {
            t.call(if i % 2 == 0 { status(500) } else { status(200) });
        }
        assert_eq!(t.b.window_totals(t.now), (9, 10));
        assert_eq!(t.state(), CircuitState::Closed, "19 < minimum_requests");
        // The 20th call: a success never trips, even at 50%.
        t.call(status(200));
        assert_eq!(t.state(), CircuitState::Closed);
        // 21 calls, 11 failures: 52% >= 50%.
        let r = t.call(status(500));
        assert_eq!(r.transition.unwrap().cause, Cause::FailureRate);
        assert_eq!(t.state(), CircuitState::Open);
    }

    #[test]
    fn failure_rate_threshold_is_inclusive_and_below_it_stays_closed() {
        let mut c = cfg();
        c.consecutive_failures = 1000;
        c.minimum_requests = 10;
        c.failure_rate = 0.3;
        let mut t = T::new(c);
        for _ in 0..7 {
            t.call(status(200));
        }
        t.call(status(500));
        t.call(status(500));
        assert_eq!(t.state(), CircuitState::Closed, "9 calls < minimum");
        // 10 calls, 3 failures: 30% >= 30%.
        t.call(status(500));
        assert_eq!(t.state(), CircuitState::Open);

        let mut c = cfg();
        c.consecutive_failures = 1000;
        c.minimum_requests = 10;
        c.failure_rate = 0.31;
        let mut t = T::new(c);
        for _ in 0..7 {
            t.call(status(200));
        }
        for _ in 0..3 {
            t.call(status(500));
        }
        assert_eq!(t.state(), CircuitState::Closed, "30% < 31%");
    }

    #[test]
    fn old_calls_leave_the_window() {
        let mut c = cfg();
        c.consecutive_failures = 1000;
        c.minimum_requests = 4;
        let mut t = T::new(c);
        // 3 failures, then a long quiet period: they expire.
        for _ in 0..3 {
            t.call(status(500));
        }
        assert_eq!(t.b.window_totals(t.now), (0, 3));
        t.at(Duration::from_secs(27));
        assert_eq!(t.b.window_totals(t.now), (0, 3), "still inside 0.9 * window");
        t.at(Duration::from_secs(3));
        assert_eq!(t.b.window_totals(t.now), (0, 0), "gone after the window");
        t.call(status(500));
        assert_eq!(t.state(), CircuitState::Closed, "only 1 call in the window");
        // The ring wraps: buckets from an earlier lap do not count.
        t.at(Duration::from_secs(300));
        assert_eq!(t.b.window_totals(t.now), (0, 0));
        for _ in 0..3 {
            t.call(status(500));
        }
        assert_eq!(t.state(), CircuitState::Closed);
        t.call(status(500));
        assert_eq!(t.state(), CircuitState::Open);
    }

    #[test]
    fn window_slides_bucket_by_bucket() {
        let mut c = cfg();
        c.window = Duration::from_secs(10);
        let mut t = T::new(c);
        for _ in 0..10 {
            t.call(status(200));
            t.at(SEC);
        }
        // One call per bucket: at t = 10 s the first has just left.
        assert_eq!(t.b.window_totals(t.now), (9, 0));
        t.at(Duration::from_millis(4500));
        assert_eq!(t.b.window_totals(t.now), (5, 0));
    }

    #[test]
    fn retries_count_in_the_window_but_not_in_the_run() {
        let mut t = T::new(cfg());
        // One request, 3 attempts, 2 requests: 6 failures, but only 2 in the run.
        for _ in 0..2 {
            t.call(status(502));
            t.call_retry(status(502));
            t.call_retry(status(502));
        }
        assert_eq!(t.state(), CircuitState::Closed);
        assert_eq!(t.b.window_totals(t.now), (0, 6));
        // A successful retry ends a run.
        t.call(status(502));
        t.call_retry(status(200));
        for _ in 0..4 {
            t.call(status(502));
        }
        assert_eq!(t.state(), CircuitState::Closed);
        t.call(status(502));
        assert_eq!(t.state(), CircuitState::Open);
    }

    #[test]
    fn open_rejects_with_the_time_left_then_half_opens() {
        let mut t = T::new(cfg());
        let open = t.trip();
        let first = t.rejected();
        assert_eq!(first, open);
        t.at(Duration::from_secs(2));
        assert_eq!(t.rejected(), open - Duration::from_secs(2));
        t.at(open - Duration::from_secs(2) - MS);
        assert_eq!(t.rejected(), MS);
        assert_eq!(t.state(), CircuitState::Open);
        t.at(MS);
        assert_eq!(t.state(), CircuitState::HalfOpen);
        let probe = t.ticket();
        assert!(probe.is_probe());
        let last = t.transitions.last().unwrap();
        assert_eq!((last.from, last.to), (CircuitState::Open, CircuitState::HalfOpen));
    }

    #[test]
    fn open_time_doubles_with_bounded_jitter_up_to_the_cap() {
        let mut c = cfg();
        c.open_for = Duration::from_secs(5);
        c.max_open_for = Duration::from_secs(60);
        let mut t = T::new(c);
        let expected = [5u64, 10, 20, 40, 60, 60, 60];
        let mut open = t.trip();
        for (i, base) in expected.iter().enumerate() {
            let base = Duration::from_secs(*base);
            assert!(open >= base, "opening {i}: {open:?} < {base:?}");
            assert!(
                open <= (base + base / 10).min(Duration::from_secs(60)),
                "opening {i}: {open:?}"
            );
            // Half-open, the probe fails: re-open, doubled.
            t.at(open);
            let probe = t.ticket();
            let r = t.record(probe, Outcome::ConnectFailure, None);
            assert_eq!(r.transition.unwrap().cause, Cause::ProbeFailed);
            open = t.b.open_until().unwrap() - t.now;
        }
        // Closing resets the doubling.
        t.at(open);
        let probe = t.ticket();
        t.record(probe, status(200), None);
        assert_eq!(t.state(), CircuitState::Closed);
        let open = t.trip();
        assert!(
            open >= Duration::from_secs(5) && open <= Duration::from_millis(5500),
            "{open:?}"
        );
    }

    #[test]
    fn open_duration_formula() {
        let mut c = cfg();
        c.open_for = Duration::from_secs(5);
        c.max_open_for = Duration::from_secs(300);
        assert_eq!(open_duration_with(&c, 0, None, 0), Duration::from_secs(5));
        assert_eq!(open_duration_with(&c, 0, None, 1_000_000), Duration::from_millis(5500));
        assert_eq!(open_duration_with(&c, 0, None, 500_000), Duration::from_millis(5250));
        assert_eq!(open_duration_with(&c, 3, None, 0), Duration::from_secs(40));
        assert_eq!(open_duration_with(&c, 6, None, 0), Duration::from_secs(300));
        assert_eq!(open_duration_with(&c, 6, None, 1_000_000), Duration::from_secs(300));
        assert_eq!(open_duration_with(&c, 40, None, 1_000_000), Duration::from_secs(300));
        assert_eq!(open_duration_with(&c, u32::MAX, None, 0), Duration::from_secs(300));
        // The hint is a floor, capped at max_open_for.
        assert_eq!(
            open_duration_with(&c, 0, Some(Duration::from_secs(30)), 0),
            Duration::from_secs(30)
        );
        assert_eq!(
            open_duration_with(&c, 0, Some(Duration::from_secs(1)), 0),
            Duration::from_secs(5)
        );
        assert_eq!(
            open_duration_with(&c, 0, Some(Duration::from_secs(1 << 31)), 0),
            Duration::from_secs(300)
        );
        // Jitter spreads the openings.
        let mut rng = StdRng::seed_from_u64(3);
        let draws: std::collections::HashSet<_> = (0..50).map(|_| open_duration(&c, 0, None, &mut rng)).collect();
        assert!(draws.len() > 10);
        assert!(draws
            .iter()
            .all(|d| *d >= Duration::from_secs(5) && *d <= Duration::from_millis(5500)));
    }

    #[test]
    fn retry_after_is_a_floor_for_the_opening() {
        let mut t = T::new(cfg());
        for _ in 0..4 {
            t.call(status(503));
        }
        let ticket = t.ticket();
        t.record(ticket, status(503), Some(Duration::from_secs(42)));
        assert_eq!(t.b.open_until().unwrap() - t.now, Duration::from_secs(42));
        // A hint on a probe failure too, and a short one does not shorten the doubling.
        t.at(Duration::from_secs(42));
        let probe = t.ticket();
        t.record(probe, status(503), Some(Duration::from_secs(1)));
        let open = t.b.open_until().unwrap() - t.now;
        assert!(open >= Duration::from_secs(10), "{open:?}");
    }

    #[test]
    fn half_open_admits_only_the_configured_probes() {
        let mut c = cfg();
        c.half_open_probes = 3;
        let mut t = T::new(c);
        let open = t.trip();
        t.at(open);
        let p1 = t.ticket();
        let p2 = t.ticket();
        let p3 = t.ticket();
        assert!(p1.is_probe() && p2.is_probe() && p3.is_probe());
        assert_eq!(t.rejected(), HALF_OPEN_RETRY_AFTER);
        // Two successes: still half-open, and the successes keep their slots spent.
        t.record(p1, status(200), None);
        t.record(p2, status(200), None);
        assert_eq!(t.state(), CircuitState::HalfOpen);
        assert_eq!(t.rejected(), HALF_OPEN_RETRY_AFTER);
        // A neutral probe (429) frees its slot without counting.
        t.record(p3, status(429), None);
        assert_eq!(t.state(), CircuitState::HalfOpen);
        let p4 = t.ticket();
        let r = t.record(p4, status(200), None);
        assert_eq!(r.transition.unwrap().cause, Cause::ProbesSucceeded);
        assert_eq!(t.state(), CircuitState::Closed);
        assert!(!t.ticket().is_probe());
    }

    #[test]
    fn one_probe_failure_reopens() {
        let mut c = cfg();
        c.half_open_probes = 2;
        let mut t = T::new(c);
        let open = t.trip();
        t.at(open);
        let p1 = t.ticket();
        let p2 = t.ticket();
        t.record(p1, status(200), None);
        t.record(p2, Outcome::Timeout, None);
        assert_eq!(t.state(), CircuitState::Open);
    }

    #[test]
    fn an_abandoned_probe_frees_its_slot() {
        let mut t = T::new(cfg());
        let open = t.trip();
        t.at(open);
        let p = t.ticket();
        t.rejected();
        t.b.abandon(p, t.now);
        let p = t.ticket();
        assert!(p.is_probe());
    }

    #[test]
    fn a_lost_probe_lapses_after_its_lease() {
        let mut c = cfg();
        c.probe_lease = Duration::from_secs(10);
        let mut t = T::new(c);
        let open = t.trip();
        t.at(open);
        let lost = t.ticket();
        t.at(Duration::from_secs(10) - MS);
        t.rejected();
        t.at(MS);
        let p = t.ticket();
        assert!(p.is_probe());
        // The lost one's late answer still counts (same generation): real evidence.
        t.record(lost, status(200), None);
        assert_eq!(t.state(), CircuitState::Closed);
        // And the other's is now stale.
        assert!(t.record(p, status(500), None).stale);
        assert_eq!(t.state(), CircuitState::Closed);
    }

    #[test]
    fn stragglers_from_before_the_opening_are_ignored() {
        let mut t = T::new(cfg());
        let slow = t.ticket();
        let open = t.trip();
        // A success from before the opening does not close it, a failure does not extend it.
        let r = t.record(slow, status(200), None);
        assert!(r.stale);
        assert_eq!(t.state(), CircuitState::Open);
        t.at(open);
        let slow = t.ticket();
        let r = t.record(slow, status(200), None);
        assert!(!r.stale);
        assert_eq!(t.state(), CircuitState::Closed);
    }

    #[test]
    fn closing_starts_a_fresh_window() {
        let mut c = cfg();
        c.consecutive_failures = 1000;
        c.minimum_requests = 4;
        let mut t = T::new(c);
        for _ in 0..4 {
            t.call(status(500));
        }
        let open = t.b.open_until().unwrap() - t.now;
        t.at(open);
        let p = t.ticket();
        t.record(p, status(200), None);
        assert_eq!(t.b.window_totals(t.now), (0, 0));
        t.call(status(500));
        assert_eq!(t.state(), CircuitState::Closed);
    }

    #[test]
    fn transitions_are_reported_once_each() {
        let mut t = T::new(cfg());
        let open = t.trip();
        t.at(open);
        assert_eq!(t.b.advance(t.now).unwrap().to, CircuitState::HalfOpen);
        assert_eq!(t.b.advance(t.now), None);
        let p = t.ticket();
        t.record(p, status(200), None);
        let tos: Vec<_> = t.transitions.iter().map(|t| t.to).collect();
        assert_eq!(tos, [CircuitState::Open, CircuitState::Closed]);
    }

    #[test]
    fn remote_open_extends_and_never_shortens() {
        let mut t = T::new(cfg());
        let now = t.now;
        let tr = t.b.apply_remote_open(now + Duration::from_secs(7), now).unwrap();
        assert_eq!(
            (tr.to, tr.cause, tr.open_for),
            (CircuitState::Open, Cause::Fleet, Some(Duration::from_secs(7)))
        );
        assert!(t.b.is_fleet_phase());
        assert_eq!(t.b.apply_remote_open(now + Duration::from_secs(3), now), None);
        assert_eq!(t.b.open_until(), Some(now + Duration::from_secs(7)));
        assert_eq!(t.b.apply_remote_open(now + Duration::from_secs(9), now), None);
        assert_eq!(t.b.open_until(), Some(now + Duration::from_secs(9)));
        // In the past: ignored.
        let mut u = T::new(cfg());
        assert_eq!(u.b.apply_remote_open(u.now, u.now), None);
        assert_eq!(u.state(), CircuitState::Closed);
    }

    #[test]
    fn remote_close_closes_fleet_phases_only() {
        let mut t = T::new(cfg());
        let now = t.now;
        t.b.apply_remote_open(now + SEC, now);
        assert_eq!(t.b.apply_remote_close(now).unwrap().to, CircuitState::Closed);
        // A local trip the fleet never adopted stays.
        t.trip();
        assert!(!t.b.is_fleet_phase());
        assert_eq!(t.b.apply_remote_close(t.now), None);
        assert_eq!(t.state(), CircuitState::Open);
    }

    #[test]
    fn fleet_half_open_needs_leases_while_attached() {
        let mut c = cfg();
        c.half_open_probes = 2;
        let mut t = T::new(c);
        let now = t.now;
        t.b.attach_until(now + Duration::from_secs(60));
        t.b.apply_remote_open(now + SEC, now);
        t.at(SEC);
        // No lease: rejected, and the demand is flagged once.
        assert_eq!(t.rejected(), HALF_OPEN_RETRY_AFTER);
        assert!(t.b.take_lease_demand(t.now));
        assert!(!t.b.take_lease_demand(t.now));
        let now = t.now;
        assert!(t.b.grant_lease(LeaseToken(7), now + SEC * 90, now + SEC, now));
        let p = t.ticket();
        assert_eq!(p.lease(), Some(LeaseToken(7)));
        t.rejected();
        // Its result goes to the fleet.
        t.record(p, status(200), None);
        assert_eq!(
            t.b.take_reports(),
            [LeaseReport {
                token: LeaseToken(7),
                result: LeaseResult::Success
            }]
        );
        // One local success of two: still half-open.
        assert_eq!(t.state(), CircuitState::HalfOpen);
        // An unused lease is given back after its use-by time.
        let now = t.now;
        assert!(t.b.grant_lease(LeaseToken(8), now + SEC * 90, now + SEC, now));
        t.at(SEC);
        t.b.advance(t.now);
        assert_eq!(
            t.b.take_reports(),
            [LeaseReport {
                token: LeaseToken(8),
                result: LeaseResult::Released
            }]
        );
    }

    #[test]
    fn fleet_half_open_probes_locally_once_detached() {
        let mut t = T::new(cfg());
        let now = t.now;
        t.b.attach_until(now + Duration::from_secs(2));
        t.b.apply_remote_open(now + SEC, now);
        t.at(SEC);
        t.rejected();
        // Syncs stopped: the attachment lapses and the breaker probes on its own.
        t.at(SEC);
        let p = t.ticket();
        assert!(p.is_probe());
        assert_eq!(p.lease(), None);
        t.record(p, status(200), None);
        assert_eq!(t.state(), CircuitState::Closed);
    }

    #[test]
    fn leases_are_released_when_the_state_moves_on() {
        let mut t = T::new(cfg());
        let now = t.now;
        t.b.attach_until(now + Duration::from_secs(60));
        t.b.apply_remote_open(now + SEC, now);
        t.at(SEC);
        let now = t.now;
        t.b.grant_lease(LeaseToken(1), now + SEC * 90, now + SEC * 2, now);
        let p = t.ticket();
        // The fleet re-opens meanwhile: the probe's answer is stale, its lease is released.
        t.b.apply_remote_open(now + SEC * 10, now);
        assert!(t.record(p, status(500), None).stale);
        assert_eq!(
            t.b.take_reports(),
            [LeaseReport {
                token: LeaseToken(1),
                result: LeaseResult::Released
            }]
        );
        // A lease granted while open is not wanted.
        assert!(!t.b.grant_lease(LeaseToken(2), now + SEC * 90, now + SEC, now));
        assert_eq!(t.b.take_reports().len(), 1);
    }

    #[test]
    fn remote_half_open_joins_a_closed_breaker() {
        let mut t = T::new(cfg());
        let tr = t.b.apply_remote_half_open(t.now).unwrap();
        assert_eq!((tr.from, tr.to), (CircuitState::Closed, CircuitState::HalfOpen));
        assert!(t.b.is_fleet_phase());
        // Not attached: probes locally.
        assert!(t.ticket().is_probe());
        t.b.localize();
        assert!(!t.b.is_fleet_phase());
    }

    #[test]
    fn deltas_follow_the_counted_outcomes() {
        let mut t = T::new(cfg());
        t.b = t.b.clone().shared();
        t.call(status(500));
        t.call(status(200));
        t.call(status(429));
        t.call(status(500));
        t.call_retry(status(500));
        let t2 = t.ticket();
        t.record(t2, status(503), Some(Duration::from_secs(3)));
        let d = t.b.take_deltas();
        assert_eq!(
            d,
            Deltas {
                successes: 1,
                failures: 4,
                tail_failures: 2,
                had_success: true,
                max_hint: Some(Duration::from_secs(3)),
                since: Some(t.now),
            }
        );
        assert!(t.b.take_deltas().is_empty());
        // Deltas that could not be sent go back in front.
        t.call(status(500));
        let mut newer = t.b.take_deltas();
        newer.merge_older(d);
        assert_eq!(newer.tail_failures, 3);
        assert_eq!(newer.failures, 5);
        assert!(newer.had_success);
        let mut after_success = Deltas {
            successes: 1,
            had_success: true,
            ..Deltas::default()
        };
        after_success.merge_older(d);
        assert_eq!(after_success.tail_failures, 0);
        // Put back while still in the window: kept; once out of it: dropped.
        t.b.restore_deltas(d, t.now + Duration::from_secs(29));
        assert_eq!(t.b.take_deltas().failures, 4);
        t.b.restore_deltas(d, t.now + Duration::from_secs(30));
        assert!(t.b.take_deltas().is_empty());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Admit,
        Succeed(usize),
        Fail(usize),
        Neutral(usize),
        Abandon(usize),
        Wait(u64),
        RemoteOpen(u64),
        RemoteClose,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Admit),
            2 => any::<usize>().prop_map(Op::Succeed),
            2 => any::<usize>().prop_map(Op::Fail),
            1 => any::<usize>().prop_map(Op::Neutral),
            1 => any::<usize>().prop_map(Op::Abandon),
            2 => (0u64..3000).prop_map(Op::Wait),
            1 => (1u64..3000).prop_map(Op::RemoteOpen),
            1 => Just(Op::RemoteClose),
        ]
    }

    /// Seeded, so that a run is the same run every time (a failure reproduces).
    fn proptest_config() -> ProptestConfig {
        let mut config = ProptestConfig::with_cases(256);
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(0x00B2_EA4E);
        config
    }

    proptest! {
        #![proptest_config(proptest_config())]

        /// Whatever happens, no more than `half_open_probes` probes of one half-open phase are
        /// out at once, and a closed breaker never hands out probes.
        #[test]
        fn never_more_probes_than_configured(
            probes in 1u32..4,
            ops in proptest::collection::vec(op(), 1..300),
        ) {
            let mut c = cfg();
            c.half_open_probes = probes;
            c.consecutive_failures = 2;
            c.open_for = Duration::from_millis(500);
            c.max_open_for = Duration::from_secs(4);
            c.probe_lease = Duration::from_secs(3600);
            let mut t = T::new(c);
            let mut out: Vec<Ticket> = Vec::new();
            for op in ops {
                match op {
                    Op::Admit => {
                        let state = t.b.state(t.now);
                        if let Admission::Allowed(ticket) = t.admit() {
                            prop_assert_eq!(ticket.is_probe(), state != CircuitState::Closed);
                            out.push(ticket);
                        }
                    }
                    Op::Succeed(i) | Op::Fail(i) | Op::Neutral(i) | Op::Abandon(i) if !out.is_empty() => {
                        let ticket = out.remove(i % out.len());
                        let outcome = match op {
                            Op::Succeed(_) => status(200),
                            Op::Fail(_) => status(500),
                            _ => status(429),
                        };
                        if matches!(op, Op::Abandon(_)) {
                            t.b.abandon(ticket, t.now);
                        } else {
                            t.record(ticket, outcome, None);
                        }
                    }
                    Op::Wait(ms) => t.at(Duration::from_millis(ms)),
                    Op::RemoteOpen(ms) => {
                        let now = t.now;
                        t.b.apply_remote_open(now + Duration::from_millis(ms), now);
                    }
                    Op::RemoteClose => {
                        let now = t.now;
                        t.b.apply_remote_close(now);
                    }
                    _ => {}
                }
                let live_probes = out
                    .iter()
                    .filter(|tk| tk.is_probe() && tk.generation == t.b.generation)
                    .count();
                prop_assert!(live_probes <= probes as usize, "{} probes out", live_probes);
                prop_assert_eq!(live_probes, t.b.probes_in_flight());
            }
        }
    }
}
