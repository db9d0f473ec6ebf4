//! What the fleet's state says of an attempt on a target before it is sent: the circuit's kind
//! of attempt, and the credential's holds (a used-up quota, pacing, a cooldown), read from the
//! local mirror, never from Redis. Also what a scrape reports of each target
//! (`rebound_target_state`).

use std::time::Duration;

use tokio::time::Instant;

use super::context::Context;
use super::hold_scope::HoldScope;
use super::pacing;
use super::routes::Target;
use crate::circuit::{release_delay, Attempt, CircuitState, Hold};
use crate::config::{CooldownMode, FailoverReason};
use crate::retry::policy::RetryState;
use crate::words::TargetState;

/// What bounds a request's wait for a hold on a target.
pub(super) struct Bounds<'a> {
    /// Another target can take the request.
    pub(super) others: bool,
    pub(super) deadline: Instant,
    /// The retry policy's `max_retry_after`: no hold is waited for longer.
    pub(super) max_wait: Duration,
    /// The route's `failover_wait`: with other targets, a hold at most this long is waited for.
    pub(super) failover_wait: Duration,
    /// The request's model label (`[metrics] models`).
    pub(super) model: &'a str,
}

impl Bounds<'_> {
    /// Whether a hold with `left` to run is waited for: it ends before the deadline and within
    /// `max_retry_after`, and, when another target could take the request, within
    /// `failover_wait`.
    fn waits(&self, left: Duration, now: Instant) -> bool {
        now + left < self.deadline && left <= self.max_wait && (!self.others || left <= self.failover_wait)
    }
}

/// What a credential's holds say of an attempt on a target.
pub(super) enum Gate {
    /// Nothing holds it.
    Open,
    /// This target cannot take the request now (back after the time, if known): another one
    /// does, or, when none is left, rebound answers for it.
    Skip(FailoverReason, Option<Duration>),
    /// No other target: wait this long, then admit again.
    Hold(Duration),
}

/// What the credential's holds on `target` say of the next attempt: a quota used up is skipped
/// (never waited for); pacing or a cooldown (for the model asked for) holds the request when the
/// wait fits its bounds (see [`Bounds::waits`]), else moves it to another target, or refuses it
/// (429 `cooldown`, counted) when none is left.
pub(super) fn gate(cx: &Context, target: &Target, scope: &HoldScope<'_>, bounds: &Bounds<'_>, now: Instant) -> Gate {
    let (circuits, forms) = (&cx.circuits, &cx.credentials);
    let exhausted = circuits.hold_active(Hold::Exhausted, &target.name)
        && circuits
            .hold_check(Hold::Exhausted, &target.name, &scope.credential(forms), now)
            .is_some();
    if exhausted {
        return Gate::Skip(FailoverReason::Exhausted, None);
    }
    let key = || scope.per_model(forms, target);
    let (hold, left) = if let Some(left) = pacing::left(circuits, target, key, now) {
        (Hold::Pacing, left)
    } else if circuits.cooldowns_active(&target.name) {
        match circuits.cooldown_check(&target.name, &key(), now) {
            Some(left) => (Hold::Cooldown, left),
            None => return Gate::Open,
        }
    } else {
        return Gate::Open;
    };
    let may_wait = hold == Hold::Pacing || target.upstream.config.cooldown == CooldownMode::Wait;
    if may_wait && bounds.waits(left, now) {
        if hold == Hold::Pacing {
            circuits.count_pacing_wait(&target.name, bounds.model);
        }
        let hold = release_delay(left, &mut rand::rng())
            .min(bounds.max_wait.max(left))
            .min(bounds.deadline - now);
        return Gate::Hold(hold);
    }
    if !bounds.others {
        circuits.count_cooldown_rejection(&target.name, bounds.model);
    }
    Gate::Skip(FailoverReason::Cooldown, Some(left))
}

/// A first attempt on its target, or a retry there (the breaker treats them differently).
pub(super) fn attempt_kind(state: &RetryState) -> Attempt {
    if state.attempts == 0 {
        Attempt::First
    } else {
        Attempt::Retry
    }
}

/// `rebound_target_state` of `t` as of `now`: `open` from its circuit; `exhausted`, `cooling`
/// and `paced` for the credential the sidecar sets with `set_headers` (an app's own credentials
/// are many, and not known here).
pub(super) fn target_state(cx: &Context, t: &Target, now: Instant) -> TargetState {
    if cx.circuits.state(&t.name, now) == Some(CircuitState::Open) {
        return TargetState::Open;
    }
    if !t.upstream.config.sets_credential {
        return TargetState::Available;
    }
    let set: http::HeaderMap = t.upstream.config.set_headers.iter().cloned().collect();
    let credential = cx.credentials.presented(&set, None).hash(&cx.credentials);
    // Cooling or paced: for any model (a walk over the upstream's table, at a scrape).
    let held = |hold| cx.circuits.hold_any(hold, &t.name, &credential, now);
    if held(Hold::Exhausted) {
        TargetState::Exhausted
    } else if held(Hold::Cooldown) {
        TargetState::Cooling
    } else if held(Hold::Pacing) {
        TargetState::Paced
    } else {
        TargetState::Available
    }
}
