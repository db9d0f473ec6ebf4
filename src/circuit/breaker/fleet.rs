//! The breaker's fleet hooks (see the module's "Fleet hooks"): what the shared layer
//! (`super::super::shared`) exchanges with one breaker: remote transitions applied, probe leases
//! granted and reported, and the outcomes counted since the last sync ([`Deltas`]).

use std::time::Duration;

use super::{Breaker, Cause, CircuitState, Credit, Phase, Transition};
use crate::time::Instant;

/// A fleet probe lease (the member of the Redis lease set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseToken(pub u64);

/// What became of a leased probe, for the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseResult {
    Success,
    Failure {
        hint: Option<Duration>,
    },
    /// Unused, abandoned, neutral, stale or lapsed: give the lease back.
    Released,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseReport {
    pub token: LeaseToken,
    pub result: LeaseResult,
}

/// Outcomes counted since the last sync, for the fleet counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Deltas {
    pub successes: u64,
    pub failures: u64,
    /// First-attempt failures after the last success (the run that continues the fleet's).
    pub(crate) tail_failures: u64,
    /// A success ended the fleet's run in this period.
    pub(crate) had_success: bool,
    /// The longest Retry-After hint sent with a failure (for the fleet's open floor).
    pub(crate) max_hint: Option<Duration>,
    /// When the oldest of these outcomes was recorded.
    pub since: Option<Instant>,
}

impl Deltas {
    pub(crate) fn is_empty(&self) -> bool {
        self.successes == 0 && self.failures == 0
    }

    /// Puts deltas that could not be sent (`older`) back in front of these.
    pub(crate) fn merge_older(&mut self, older: Deltas) {
        self.successes = self.successes.saturating_add(older.successes);
        self.failures = self.failures.saturating_add(older.failures);
        if !self.had_success {
            self.tail_failures = self.tail_failures.saturating_add(older.tail_failures);
        }
        self.had_success |= older.had_success;
        self.max_hint = self.max_hint.max(older.max_hint);
        self.since = match (self.since, older.since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

impl Breaker {
    /// The fleet opened the circuit until `until`: open (or stay open, until the later of the
    /// two), marked as a fleet phase.
    pub(crate) fn apply_remote_open(&mut self, until: Instant, now: Instant) -> Option<Transition> {
        if until <= now {
            return None;
        }
        if let Phase::Open { until: u, fleet } = &mut self.phase {
            *u = (*u).max(until);
            *fleet = true;
            return None;
        }
        let from = self.phase.state(now);
        self.openings = self.openings.saturating_add(1);
        self.enter_open(until, true);
        Some(Transition {
            from,
            to: CircuitState::Open,
            cause: Cause::Fleet,
            open_for: Some(until - now),
        })
    }

    /// The fleet is half-open (its open time elapsed, no probe has closed it yet): a closed
    /// breaker joins it; an open or half-open one becomes a fleet phase (its probes need leases).
    pub(crate) fn apply_remote_half_open(&mut self, now: Instant) -> Option<Transition> {
        match &mut self.phase {
            Phase::Open { fleet, .. } | Phase::HalfOpen { fleet, .. } => {
                *fleet = true;
                None
            }
            Phase::Closed => {
                self.generation += 1;
                self.openings = self.openings.max(1);
                self.phase = Phase::HalfOpen {
                    slots: Vec::new(),
                    successes: 0,
                    fleet: true,
                };
                let _ = now;
                Some(Transition {
                    from: CircuitState::Closed,
                    to: CircuitState::HalfOpen,
                    cause: Cause::Fleet,
                    open_for: None,
                })
            }
        }
    }

    /// The fleet closed the circuit (its probes succeeded): a fleet phase closes. A phase this
    /// breaker entered on its own (a local trip the fleet never adopted) is left alone.
    pub(crate) fn apply_remote_close(&mut self, now: Instant) -> Option<Transition> {
        if self.phase.fleet() {
            Some(self.close(Cause::Fleet, now))
        } else {
            None
        }
    }

    /// The fleet no longer holds this phase (its record expired or Redis lost it): carry on
    /// locally, probing without leases.
    pub(crate) fn localize(&mut self) {
        match &mut self.phase {
            Phase::Open { fleet, .. } | Phase::HalfOpen { fleet, .. } => *fleet = false,
            Phase::Closed => {}
        }
        self.drop_credits();
    }

    /// A sync with the fleet succeeded: fleet phases need leases until `until`.
    pub(crate) fn attach_until(&mut self, until: Instant) {
        self.attached_until = Some(until);
    }

    /// Whether the last sync is recent enough for fleet phases to wait for leases.
    pub(crate) fn is_attached(&self, now: Instant) -> bool {
        self.attached_until.is_some_and(|t| now < t)
    }

    /// Whether a call was rejected for want of a fleet lease since the last call (resets it).
    pub(crate) fn take_lease_demand(&mut self, now: Instant) -> bool {
        let wanted = std::mem::take(&mut self.wants_lease);
        wanted
            && self.phase.fleet()
            && self.state(now) == CircuitState::HalfOpen
            && self.credits.is_empty()
            && self.is_attached(now)
    }

    /// A fleet lease was granted. Returns false (and reports it released) when the breaker no
    /// longer needs it.
    pub(crate) fn grant_lease(&mut self, token: LeaseToken, expires: Instant, use_by: Instant, now: Instant) -> bool {
        let _ = self.advance(now);
        let wanted = matches!(self.phase, Phase::HalfOpen { fleet: true, .. }) && expires > now;
        if wanted {
            self.credits.push(Credit {
                token,
                use_by: use_by.min(expires),
                expires,
            });
        } else {
            self.report(token, LeaseResult::Released);
        }
        wanted
    }

    /// The outcomes counted since the last call, for the fleet counters.
    pub(crate) fn take_deltas(&mut self) -> Deltas {
        std::mem::take(&mut self.deltas)
    }

    /// Puts back deltas that could not be sent, unless they have left the window meanwhile
    /// (stale counts would skew the fleet's window when Redis comes back).
    pub(crate) fn restore_deltas(&mut self, older: Deltas, now: Instant) {
        if older
            .since
            .is_some_and(|t| now.saturating_duration_since(t) < self.cfg.window)
        {
            self.deltas.merge_older(older);
        }
    }

    /// The leased probes' results since the last call.
    pub(crate) fn take_reports(&mut self) -> Vec<LeaseReport> {
        std::mem::take(&mut self.reports)
    }
}
