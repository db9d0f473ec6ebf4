//! Step 6a: which target the next attempt goes to. A request stays on its target while the
//! retry policy retries there; it moves on when an outcome fails over ([`crate::retry::failover`])
//! or when the target cannot take it (its circuit open, the credential cooling down or paced out).
//! The choice among the targets it has not left is the route's `balance`
//! ([`crate::targets::choose`]); availability is read from the local mirror of the fleet's state,
//! never from Redis.

use std::time::Duration;

use super::attempts::{build_upstream_request, Admit, Asked, Go, Progress};
use super::limits::Limits;
use super::{pacing, Proxy, Route, Target};
use crate::circuit::{release_delay, Admission, Attempt, Hold};
use crate::config::{CooldownMode, FailoverReason};
use crate::error::ProxyError;
use crate::retry::policy::{RetryState, Stop};
use crate::targets::{choose, Candidate};
use tokio::time::Instant;

/// What bounds a request's wait for a hold on a target.
struct Bounds<'a> {
    /// Another target can take the request.
    others: bool,
    deadline: Instant,
    /// The retry policy's `max_retry_after`: no hold is waited for longer.
    max_wait: Duration,
    /// The route's `failover_wait`: with other targets, a hold at most this long is waited for.
    failover_wait: Duration,
    /// The request's model label (`[metrics] models`).
    model: &'a str,
}

impl Bounds<'_> {
    /// Whether a hold with `left` to run is waited for: it ends before the deadline and within
    /// `max_retry_after`, and, when another target could take the request, within
    /// `failover_wait`.
    fn waits(&self, left: Duration, now: Instant) -> bool {
        now + left < self.deadline && left <= self.max_wait && (!self.others || left <= self.failover_wait)
    }
}

/// Where a request is among its route's targets.
pub(super) struct Cursor {
    /// The target it is on (retries stay there); `None` before the first attempt and after it
    /// left one.
    current: Option<usize>,
    /// Targets it left or found unavailable, and why (allocated only when one is): never chosen
    /// again for this request.
    left: Vec<(usize, FailoverReason)>,
    /// Why it is leaving a target it was on, counted when the next one is admitted.
    leaving: Option<(usize, FailoverReason)>,
    /// The soonest a target found unavailable recovers (`None`: none has a time, e.g. all
    /// exhausted).
    soonest: Option<Duration>,
    /// Times it moved to another target.
    pub(super) failovers: u32,
}

impl Cursor {
    pub(super) fn new() -> Cursor {
        Cursor {
            current: None,
            left: Vec::new(),
            leaving: None,
            soonest: None,
            failovers: 0,
        }
    }

    /// Why `index` was left, if it was.
    fn reason(&self, index: usize) -> Option<FailoverReason> {
        self.left.iter().find(|(i, _)| *i == index).map(|(_, r)| *r)
    }

    fn is_left(&self, index: usize) -> bool {
        self.reason(index).is_some()
    }

    fn mark(&mut self, index: usize, reason: FailoverReason) {
        if !self.is_left(index) {
            self.left.push((index, reason));
        }
    }

    /// Whether a target the request has not left remains besides `index`.
    pub(super) fn has_another(&self, route: &Route, index: usize) -> bool {
        (0..route.targets.len()).any(|i| i != index && !self.is_left(i))
    }

    /// Whether a target it has not left takes a larger prompt than `target` (an unknown
    /// `context_window` is not larger than any).
    pub(super) fn larger_context(&self, route: &Route, target: &Target) -> bool {
        route.targets.iter().any(|t| {
            t.index != target.index && !self.is_left(t.index) && t.config.context_window > target.config.context_window
        })
    }

    /// The request leaves the target it is on for `reason` (a failover). A prompt too long for
    /// it is too long for every target that takes no more: those are left too.
    pub(super) fn leave(&mut self, route: &Route, index: usize, reason: FailoverReason, state: &mut RetryState) {
        if reason == FailoverReason::ContextLength {
            let limit = route.targets.get(index).and_then(|t| t.config.context_window);
            for t in route.targets.iter().filter(|t| t.config.context_window <= limit) {
                self.mark(t.index, reason);
            }
        }
        self.unavailable(index, reason, None);
        state.switch_target();
    }

    /// The target for the next attempt: the current one, else one chosen by the route's balance
    /// among those not left.
    fn next(&mut self, route: &Route) -> Option<usize> {
        if let Some(i) = self.current {
            return Some(i);
        }
        if route.targets.len() == 1 {
            // The common route: nothing to choose, nothing allocated.
            return (!self.is_left(0)).then_some(0);
        }
        let candidates: Vec<Candidate> = route
            .targets
            .iter()
            .filter(|t| !self.is_left(t.index))
            .map(|t| Candidate {
                index: t.index,
                weight: t.config.weight,
                in_flight: t.load.in_flight(),
                ewma_us: t.load.ewma_us(),
            })
            .collect();
        choose(route.targets.balance, &candidates, &mut rand::rng())
    }

    /// `index` cannot take the request now (`reason`, back after `after` if known): left.
    fn unavailable(&mut self, index: usize, reason: FailoverReason, after: Option<Duration>) {
        self.mark(index, reason);
        if self.current == Some(index) {
            self.current = None;
        }
        self.leaving.get_or_insert((index, reason));
        if let Some(after) = after {
            self.soonest = Some(self.soonest.map_or(after, |s| s.min(after)));
        }
    }
}

impl Proxy {
    /// Admission of the next attempt: the deadline, the target (its circuit, the credential's
    /// exhaustion, pacing and cooldown: each may move the request to another target, or hold it
    /// when none is left), and the request for it.
    pub(super) async fn admit<'r>(
        &self,
        Asked {
            route,
            parts,
            path,
            body,
        }: Asked<'r>,
        state: &mut RetryState,
        d: &mut Progress,
        at: &mut Cursor,
        now: Instant,
    ) -> Admit<'r> {
        if state.deadline <= now {
            let upstream = route.targets.get(d.target).unwrap_or(route.primary()).name.to_string();
            let timeout_ms = d.deadline.as_millis();
            return Admit::Stop(d.stop_before_attempt(Stop::Deadline, || ProxyError::Timeout { upstream, timeout_ms }));
        }
        loop {
            let Some(index) = at.next(route) else {
                return Admit::Stop(self.no_target(route, d, at));
            };
            let Some(target) = route.targets.get(index) else {
                return Admit::Stop(self.no_target(route, d, at));
            };
            let permit = match self.circuits.admit(&target.name, attempt_kind(state), now) {
                Admission::Allowed(permit) => permit,
                Admission::Rejected { retry_after } => {
                    at.unavailable(index, FailoverReason::CircuitOpen, Some(retry_after));
                    continue;
                }
            };
            let req = match build_upstream_request(target, parts, path, body.clone(), &self.credentials) {
                Ok(r) => r,
                Err(e) => {
                    d.last = None;
                    return Admit::Stop(
                        d.stop_before_attempt(Stop::NotRetryable, || ProxyError::InvalidRequestTarget(e.to_string())),
                    );
                }
            };
            // The credential is hashed only when some hold concerns this upstream, or after a 429.
            let credential = self.credentials.presented(req.headers(), req.uri().query());
            let limits = Limits::new(credential, body, path);
            let bounds = Bounds {
                others: at.has_another(route, index),
                deadline: state.deadline,
                max_wait: route.retry.max_retry_after,
                failover_wait: route.config.failover_wait,
                model: &d.tokens.model,
            };
            match self.gate(target, &limits, &bounds, now) {
                Gate::Open => {}
                Gate::Skip(reason, after) => {
                    drop(permit);
                    at.unavailable(index, reason, after);
                    continue;
                }
                Gate::Hold(hold) => {
                    drop(permit);
                    tracing::debug!(route = %route.name, upstream = %target.name, hold_ms = hold.as_millis() as u64, "held by pacing or a cooldown");
                    tokio::time::sleep(hold).await;
                    return Admit::Held;
                }
            }
            if let Some((from, reason)) = at.leaving.take() {
                self.count_failover(route, from, target, reason);
                at.failovers += 1;
            }
            at.current = Some(index);
            return Admit::Go(Go {
                target,
                permit,
                req,
                limits,
            });
        }
    }

    /// Whether the request can leave target `index` for `reason`: the route fails over on it,
    /// and another target it has not left has a circuit that is not open (a 429 is waited out
    /// here when no other target can take the request).
    pub(super) fn can_move(
        &self,
        route: &Route,
        at: &Cursor,
        index: usize,
        reason: FailoverReason,
        now: Instant,
    ) -> bool {
        route.targets.failover_on.contains(reason)
            && route.targets.iter().any(|t| {
                t.index != index
                    && !at.is_left(t.index)
                    && self.circuits.state(&t.name, now) != Some(crate::circuit::CircuitState::Open)
            })
    }

    /// What the credential's holds on `target` say of the next attempt: a quota used up is
    /// skipped (never waited for); pacing or a cooldown (for the model asked for) holds the
    /// request when the wait fits its bounds (see [`Bounds::waits`]), else moves it to another
    /// target, or refuses it (429 `cooldown`, counted) when none is left.
    fn gate(&self, target: &Target, limits: &Limits<'_>, bounds: &Bounds<'_>, now: Instant) -> Gate {
        let forms = &self.credentials;
        let exhausted = self.circuits.hold_active(Hold::Exhausted, &target.name)
            && self
                .circuits
                .hold_check(Hold::Exhausted, &target.name, &limits.credential(forms), now)
                .is_some();
        if exhausted {
            return Gate::Skip(FailoverReason::Exhausted, None);
        }
        let key = || limits.per_model(forms, target);
        let (hold, left) = if let Some(left) = pacing::left(&self.circuits, target, key, now) {
            (Hold::Pacing, left)
        } else if self.circuits.cooldowns_active(&target.name) {
            match self.circuits.cooldown_check(&target.name, &key(), now) {
                Some(left) => (Hold::Cooldown, left),
                None => return Gate::Open,
            }
        } else {
            return Gate::Open;
        };
        let may_wait = hold == Hold::Pacing || target.upstream.config.cooldown == CooldownMode::Wait;
        if may_wait && bounds.waits(left, now) {
            if hold == Hold::Pacing {
                self.circuits.count_pacing_wait(&target.name, bounds.model);
            }
            let hold = release_delay(left, &mut rand::rng())
                .min(bounds.max_wait.max(left))
                .min(bounds.deadline - now);
            return Gate::Hold(hold);
        }
        if !bounds.others {
            self.circuits.count_cooldown_rejection(&target.name, bounds.model);
        }
        Gate::Skip(FailoverReason::Cooldown, Some(left))
    }

    /// Counts a move from target `from` to `to`.
    fn count_failover(&self, route: &Route, from: usize, to: &Target, reason: FailoverReason) {
        let from = route.targets.get(from).map_or("", |t| &*t.name);
        self.metrics
            .failovers_total
            .with_label_values(&[&*route.name, from, &*to.name, reason.as_str()])
            .inc();
        tracing::info!(route = %route.name, from, to = %to.name, reason = reason.as_str(), "failover");
    }

    /// No target can take the request: the last upstream answer when targets were called (as
    /// today), else rebound's error: for a one-target route the specific one (503 `circuit_open`,
    /// 429 `cooldown`), for several 503 `no_target_available` with each target's reason; both
    /// with the soonest recovery.
    fn no_target(&self, route: &Route, d: &mut Progress, at: &Cursor) -> super::attempts::Delivery {
        if let (1, Some(reason), Some(retry_after)) = (route.targets.len(), at.reason(0), at.soonest) {
            let upstream = route.primary().name.to_string();
            match reason {
                FailoverReason::CircuitOpen => {
                    return d
                        .stop_before_attempt(Stop::CircuitOpen, || ProxyError::CircuitOpen { upstream, retry_after });
                }
                FailoverReason::Cooldown => {
                    return d.stop_before_attempt(Stop::Cooldown, || ProxyError::Cooldown { upstream, retry_after });
                }
                _ => {}
            }
        }
        let reasons: Vec<Option<FailoverReason>> = route.targets.iter().map(|t| at.reason(t.index)).collect();
        let stop = match reasons.iter().all(|r| *r == Some(FailoverReason::CircuitOpen)) {
            true => Stop::CircuitOpen,
            false => Stop::Cooldown,
        };
        let targets: Vec<(String, &'static str)> = route
            .targets
            .iter()
            .zip(reasons)
            .map(|(t, r)| (t.name.to_string(), r.map_or("available", FailoverReason::as_str)))
            .collect();
        let retry_after = at.soonest;
        d.stop_before_attempt(stop, || ProxyError::NoTargetAvailable { retry_after, targets })
    }
}

/// What a credential's holds say of an attempt on a target.
enum Gate {
    /// Nothing holds it.
    Open,
    /// This target cannot take the request now (back after the time, if known): another one
    /// does, or, when none is left, rebound answers for it.
    Skip(FailoverReason, Option<Duration>),
    /// No other target: wait this long, then admit again.
    Hold(Duration),
}

/// A first attempt on its target, or a retry there (the breaker treats them differently).
fn attempt_kind(state: &RetryState) -> Attempt {
    if state.attempts == 0 {
        Attempt::First
    } else {
        Attempt::Retry
    }
}

impl Proxy {
    /// Sets `rebound_target_state` for every target of every route, as of `now` (called at each
    /// scrape): `open` from its circuit; `exhausted`, `cooling` and `paced` for the credential the
    /// sidecar sets with `set_headers` (an app's own credentials are many, and not known here).
    pub(crate) fn refresh_target_states(&self, now: Instant) {
        for route in self.routes.routes() {
            for t in route.targets.iter() {
                let state = self.target_state(t, now);
                for s in crate::metrics::TARGET_STATES {
                    self.metrics
                        .target_state
                        .with_label_values(&[&*route.name, &*t.name, s])
                        .set(i64::from(s == state));
                }
            }
        }
    }

    fn target_state(&self, t: &Target, now: Instant) -> &'static str {
        if self.circuits.state(&t.name, now) == Some(crate::circuit::CircuitState::Open) {
            return "open";
        }
        if !t.upstream.config.sets_credential {
            return "available";
        }
        let set: http::HeaderMap = t.upstream.config.set_headers.iter().cloned().collect();
        let credential = self.credentials.presented(&set, None).hash(&self.credentials);
        // Cooling or paced: for any model (a walk over the upstream's table, at a scrape).
        let held = |hold| self.circuits.hold_any(hold, &t.name, &credential, now);
        if held(Hold::Exhausted) {
            "exhausted"
        } else if held(Hold::Cooldown) {
            "cooling"
        } else if held(Hold::Pacing) {
            "paced"
        } else {
            "available"
        }
    }
}
