//! Step 6 of the pipeline: one request through its attempts, until an outcome is delivered
//! ([`attempts`]). A [`Call`] owns what the loop keeps between attempts (where the request is
//! among its targets, its retry state, its account) and runs each attempt in four phases:
//! **admit** ([`Call::admit`]: the deadline, then the target and what the fleet's state says of
//! it, see `admission.rs`), **send** (`commit.rs`), **observe** ([`Call::observe`]: the outcome
//! feeds the breaker, a 429's reset or a used-up quota the credential's holds, the metrics) and
//! **next step** ([`Call::next_step`], the one place that decides what happens next, by asking
//! the pure policies: move to another target, retry here after a wait, or deliver).

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tokio::time::Instant;

use super::admission::{self, Bounds, Gate};
use super::commit;
use super::context::Context;
use super::cursor::{Cursor, Cut};
use super::delivery::{Delivery, Progress};
use super::hold_scope::HoldScope;
use super::outbound;
use super::pacing;
use super::primed::Primed;
use super::request;
use super::room::{self, Room};
use super::routes::{Route, Target};
use super::tokens::RequestTokens;
use crate::circuit::{Admission, CircuitState, Hold, Permit};
use crate::cloud::{CloudAuth, Unavailable};
use crate::config::{Balance, FailoverReason, RetryOn};
use crate::error::ProxyError;
use crate::limiter::concurrency::{Queued, Slot};
use crate::retry::failover;
use crate::retry::policy::{Decision, Outcome, RetryState, Rules, Shown, Stop, WaitSource};
use crate::retry::provider_error::{ErrorClass, ErrorSignal};
use crate::retry::retry_after::HintSource;
use crate::retry::{self, RetryHint};
use crate::time;
use crate::traces::{AttemptSpan, RequestSpan};
use crate::upstream::{AttemptError, UpstreamBody};
use crate::wire::api::Named;
use std::sync::Arc;

/// An attempt's result: the response read ahead to its commit point, or why it failed.
type Answer = Result<Response<Primed<UpstreamBody>>, AttemptError>;

/// The retry loop: admit, send, observe, decide, until an outcome is delivered.
///
/// The call is made before the loop's future and captured by it, used in place: an `async fn`
/// would keep its arguments twice (as they were passed, and in the call). The admitted attempt
/// is taken apart where it is made and its request moved on unborrowed, and the attempt's result
/// lives in a block that ends before any wait: a local borrowed in an `async` body keeps its room
/// in the request's future until its scope ends.
pub(super) fn attempts<'r>(
    cx: &'r Context,
    asked: Asked<'r>,
    tokens: RequestTokens,
    trace: &'r RequestSpan,
) -> impl std::future::Future<Output = Delivery> + Send + 'r {
    let started = time::now();
    let mut call = Call::new(cx, asked, tokens, started);
    async move {
        let mut now = started;
        loop {
            // A hold (or a turn in a concurrency queue) is waited out with nothing of
            // admission's answer kept.
            let (req, admitted) = loop {
                match call.admit(now) {
                    Admit::Go(req, admitted) => break (req, admitted),
                    Admit::Hold(hold) => tokio::time::sleep(hold).await,
                    Admit::Queue(target) => {
                        if let Some(q) = &call.queued {
                            room::turn(target, q).await;
                        }
                    }
                    Admit::Stop(delivery) => return delivery,
                }
                now = time::now();
            };
            let target = admitted.target;
            let (span, remaining) = call.sending(target, now, trace);
            let in_flight = call.balanced().then(|| target.load.start());
            let wait = {
                let traced = {
                    let mut req = req;
                    span.inject(req.headers_mut());
                    req
                };
                let (result, received) = commit::attempt(call.asked.route, target, traced, now, remaining).await;
                if in_flight.is_some() {
                    drop(in_flight);
                    target.load.observe(received.saturating_duration_since(now));
                }
                let observed = call.observe(admitted, span, &result, (now, received));
                match call.next_step(target, &observed) {
                    Next::Move(reason) => {
                        call.move_on(result, target, reason, now);
                        Then::Now
                    }
                    Next::Retry(pause) => Then::Sleep(call.retry(result, target, pause, now)),
                    Next::Reauth(auth) => call.reauth(result, target, auth, now),
                    Next::Deliver(stop) => return call.deliver(result, target, observed.outcome, stop),
                }
            };
            match wait {
                Then::Now => {}
                Then::Sleep(wait) => tokio::time::sleep(wait).await,
                Then::Renewed(auth, fetches, limit) => {
                    let _ = tokio::time::timeout(limit, auth.fetched_after(fetches)).await;
                }
            }
            now = time::now();
        }
    }
}

/// One request through its attempts.
pub(super) struct Call<'r> {
    cx: &'r Context,
    asked: Asked<'r>,
    state: RetryState,
    at: Cursor,
    progress: Progress,
    /// The wait before the next attempt and what set it (for the attempt's span).
    waited: (Duration, Option<&'static str>),
    /// The retry the next attempt is, counted when it is sent: one the circuit or the deadline
    /// stops after its wait is not a retry (`rebound_retries_total` matches the provider's extra
    /// calls).
    retrying: Option<RetryOn>,
    /// The body's SigV4 hash, made once for every attempt to a target that signs.
    payload: Option<String>,
    /// An attempt was repeated after its cloud credential was rejected (once per request).
    reauthed: bool,
    /// The attempt's place under its target's `concurrency` limit, while it runs.
    slot: Option<Slot>,
    /// The request's place in a target's concurrency queue, while it waits.
    queued: Option<Queued>,
}

impl<'r> Call<'r> {
    /// A request's call, `started`: its retry terms read (an SDK's own retry is recorded as one)
    /// and the retry budget credited.
    fn new(cx: &'r Context, asked: Asked<'r>, tokens: RequestTokens, started: Instant) -> Call<'r> {
        let route = asked.route;
        let mut terms = asked.request.retry;
        if asked.client_retry {
            terms.max_attempts = 1;
        }
        if terms.sdk_retry || asked.client_retry {
            route.budget.record_external_retry(started);
        } else {
            route.budget.deposit(started);
        }
        Call {
            cx,
            asked,
            state: RetryState::new(terms.max_attempts, asked.deadline),
            at: Cursor::after_cuts(route, asked.cuts),
            progress: Progress::new(terms.deadline, tokens, started),
            waited: (Duration::ZERO, None),
            retrying: None,
            payload: None,
            reauthed: false,
            slot: None,
            queued: None,
        }
    }

    /// Admission of the next attempt at `now`: the deadline, then the target (its circuit, the
    /// credential's exhaustion, pacing and cooldown: each may move the request to another target,
    /// or hold it when none is left), and the request for it.
    fn admit(&mut self, now: Instant) -> Admit<'r> {
        let (asked, route) = (self.asked, self.asked.route);
        let failovers = self.at.failovers;
        if self.state.deadline <= now {
            return Admit::Stop(self.past_deadline());
        }
        loop {
            let Some(target) = self.at.next(route).and_then(|i| route.targets.get(i)) else {
                let (stop, err) = self.at.none_left(route);
                return Admit::Stop(self.progress.stop_before_attempt(stop, failovers, || err));
            };
            let index = target.index;
            let kind = admission::attempt_kind(&self.state);
            let permit = match self.cx.circuits.admit(&target.name, kind, now) {
                Admission::Allowed(permit) => permit,
                Admission::Rejected { retry_after } => {
                    self.at
                        .unavailable(index, FailoverReason::CircuitOpen, Some(retry_after));
                    continue;
                }
            };
            let request = (asked.parts, asked.path, asked.body.clone(), asked.named);
            let sent = outbound::build(target, request, &self.cx.credentials);
            let (req, rewritten) = match sent {
                Ok(r) => r,
                Err(e) => {
                    self.progress.forget();
                    return Admit::Stop(self.progress.stop_before_attempt(Stop::NotRetryable, failovers, || e));
                }
            };
            // The credential the provider is sent (not always the app's: a target sets or signs
            // its own, hop-by-hop headers are stripped, a resume has its own query), hashed only
            // when some hold concerns this upstream, or after a 429.
            let credential = self.cx.credentials.presented(req.headers(), req.uri().query());
            let scope = HoldScope::new(credential, asked.named.model_or_empty());
            let bounds = Bounds {
                others: self.at.others(route, index).next().is_some(),
                deadline: self.state.deadline,
                max_wait: route.retry.max_retry_after,
                failover_wait: route.config.failover_wait,
                model: &self.progress.tokens.model,
            };
            match admission::gate(self.cx, target, &scope, &bounds, now) {
                Gate::Open => {}
                Gate::Skip(reason, after) => {
                    drop(permit);
                    self.at.unavailable(index, reason, after);
                    continue;
                }
                Gate::Hold(hold) => {
                    drop(permit);
                    tracing::debug!(route = %route.name, upstream = %target.name, hold_ms = hold.as_millis() as u64, "held by pacing or a cooldown");
                    return Admit::Hold(hold);
                }
            }
            let slot = match self.room(target, &scope, now) {
                Placed::Slot(slot) => slot,
                Placed::Elsewhere => continue,
                Placed::Answer(admit) => return admit,
            };
            let mut req = req;
            if let Some(auth) = &target.cloud {
                // A rewritten body is hashed for its own attempt; the app's once for them all.
                let own;
                let payload = match (auth.signs(), &rewritten, &self.payload) {
                    (true, Some(sent), _) => {
                        own = crate::cloud::sigv4::payload_hash(sent);
                        &own
                    }
                    (true, None, None) => self.payload.insert(crate::cloud::sigv4::payload_hash(asked.body)),
                    (_, _, p) => p.as_deref().unwrap_or_default(),
                };
                match auth.apply(&mut req, payload, time::wall_now()) {
                    Ok(()) => {}
                    Err(Unavailable::Pending) => {
                        drop(permit);
                        return Admit::Hold(CREDENTIAL_PENDING.min(self.state.deadline - now));
                    }
                    Err(Unavailable::Failed) => {
                        drop(permit);
                        self.at.unavailable(index, FailoverReason::Credential, None);
                        continue;
                    }
                }
            }
            if let Some((from, reason)) = self.at.arrive(index) {
                self.count_failover(from, target, reason);
            }
            self.slot = slot;
            return Admit::Go(req, Admitted { target, permit, scope });
        }
    }

    /// The request's deadline has come before an attempt: 504 `deadline_exceeded`, or, when it
    /// came while the request waited for a target's concurrency limit, that limit's 429.
    fn past_deadline(&mut self) -> Delivery {
        let (route, failovers) = (self.asked.route, self.at.failovers);
        if let Some(q) = self.queued.take() {
            let e = room::refusal(q.upstream(), &route.name, true);
            return self
                .progress
                .stop_before_attempt(Stop::ConcurrencyLimited, failovers, || e);
        }
        let upstream = route
            .targets
            .get(self.progress.target)
            .unwrap_or(route.primary())
            .name
            .to_string();
        let timeout_ms = self.progress.deadline.as_millis();
        self.progress
            .stop_before_attempt(Stop::Deadline, failovers, || ProxyError::Timeout {
                upstream,
                timeout_ms,
            })
    }

    /// The room `target`'s concurrency limit has for the attempt (see `room.rs`): its slot, or
    /// another target, or a wait in its queue or a 429.
    fn room(&mut self, target: &'r Target, scope: &HoldScope<'_>, now: Instant) -> Placed<'r> {
        let (route, index) = (self.asked.route, target.index);
        let ask = room::Ask {
            key: &|| scope.per_model(&self.cx.credentials, target),
            model: &self.progress.tokens.model,
            route: &route.name,
            elsewhere: self.at.others_free(route, index),
            deadline: self.state.deadline,
        };
        match room::room(target, &ask, &mut self.queued, now) {
            Room::Free(slot) => Placed::Slot(slot),
            Room::Elsewhere => {
                self.at.at_limit(index);
                Placed::Elsewhere
            }
            Room::Wait => {
                self.at.wait_for(index);
                Placed::Answer(Admit::Queue(target))
            }
            Room::Refused(e) => {
                let stop = Stop::ConcurrencyLimited;
                let failovers = self.at.failovers;
                Placed::Answer(Admit::Stop(self.progress.stop_before_attempt(stop, failovers, || e)))
            }
        }
    }

    /// An admitted attempt goes to `target` at `now`: counted (a retry when it is one), and
    /// traced; the time left of the request's deadline.
    fn sending(&mut self, target: &Target, now: Instant, trace: &RequestSpan) -> (AttemptSpan, Duration) {
        if let Some(reason) = self.retrying.take() {
            self.cx
                .metrics
                .retries_total
                .with_label_values(&[&*self.asked.route.name, &reason.to_string()])
                .inc();
        }
        self.state.attempt();
        self.progress.sending(target.index, now);
        let (wait, source) = self.waited;
        let span = trace.attempt(self.state.total, &target.name, wait, source);
        (span, self.state.deadline.saturating_duration_since(now))
    }

    /// Whether the route tracks its targets' load: only where it chooses by it (`least_loaded`
    /// over several targets).
    fn balanced(&self) -> bool {
        let targets = &self.asked.route.targets;
        targets.balance == Balance::LeastLoaded && targets.len() > 1
    }

    /// What an attempt's result tells: its outcome (counted, recorded, on its span), the breaker
    /// fed through the permit, the credential's pacing, a 429's reset noted as a cooldown and a
    /// used-up quota as exhaustion, and what the next step is decided on.
    fn observe(
        &mut self,
        admitted: Admitted<'r>,
        span: AttemptSpan,
        result: &Answer,
        (sent, received): (Instant, Instant),
    ) -> Observed {
        let Admitted { target, permit, scope } = admitted;
        let (cx, route) = (self.cx, self.asked.route);
        let outcome = match result {
            Ok(resp) => commit::outcome_of(resp),
            Err(e) => e.outcome(),
        };
        target.attempts.count(outcome.kind());
        if let Ok(resp) = result {
            let key = || scope.per_model(&cx.credentials, target);
            pacing::note(&cx.circuits, target, key, resp.headers(), received);
        }
        // An error body's class and delay (read at the commit point); a header's delay wins.
        let signal = result
            .as_ref()
            .ok()
            .and_then(|r| r.extensions().get::<ErrorSignal>().copied());
        let class = signal.map(|s| s.class);
        let hint = match result {
            Ok(resp) if outcome.is_failure() => retry::parse_hint(resp.headers(), time::wall_now()).or_else(|| {
                let delay = signal?.body_delay?;
                Some(RetryHint {
                    delay,
                    source: HintSource::ErrorBody,
                })
            }),
            _ => None,
        };
        let explicit = hint.filter(|h| h.source.is_explicit()).map(|h| h.delay);
        permit.record(outcome, explicit, received);
        if let Some(slot) = &self.slot {
            room::observe(
                slot,
                outcome,
                hint.map(|h| h.delay),
                (sent, received),
                self.state.deadline,
            );
        }
        if class == Some(ErrorClass::Exhausted) {
            // A quota used up: the credential is avoided fleet-wide until its reset (an hour when
            // the provider gives none).
            let until = received + hint.map_or(failover::EXHAUSTED_FOR, |h| h.delay);
            let key = scope.credential(&cx.credentials);
            cx.circuits
                .hold_note(Hold::Exhausted, &target.name, key, until, received);
        } else if let Some(h) = hint.filter(|_| outcome.is_rate_limited() || class == Some(ErrorClass::RateLimited)) {
            let key = scope.per_model(&cx.credentials, target);
            cx.circuits
                .cooldown_note(&target.name, key, received + h.delay, received);
        }
        let status = result.as_ref().ok().map(|r| r.status().as_u16());
        span.end(outcome.label(), status, hint.map(|h| h.delay));
        self.progress
            .record(outcome, status, received - sent, hint.map(|h| h.delay));
        let seen = failover::Seen {
            class,
            first_byte_limit: target.config.first_byte_timeout.is_some(),
            // Read only where it matters: a prompt too long for this target.
            larger_context_elsewhere: class == Some(ErrorClass::ContextLength) && self.at.larger_context(route, target),
            reset_within_failover_wait: resets_within_failover_wait(route, outcome, class, hint),
        };
        let credential_rejected = target.cloud.is_some()
            && result
                .as_ref()
                .is_ok_and(|r| crate::cloud::says_rejected(r.status().as_u16(), r.headers()));
        Observed {
            outcome,
            seen,
            hint,
            sent,
            received,
            credential_rejected,
        }
    }

    /// After an attempt on `target`: move to another target (a failover class, when another
    /// target can take the request), retry here after a wait, or deliver. The pure policies
    /// decide: [`failover::at_once`], then the retry policy ([`RetryState::decide`]), then
    /// [`failover::after_decision`] for what it would deliver.
    fn next_step(&mut self, target: &Target, observed: &Observed) -> Next {
        let route = self.asked.route;
        let (cx, at) = (self.cx, &self.at);
        let Observed {
            outcome,
            seen,
            hint,
            sent,
            received,
            credential_rejected,
        } = *observed;
        // A credential the provider no longer takes: refreshed, and this attempt repeated once.
        if let Some(auth) = target.cloud.as_ref().filter(|_| credential_rejected && !self.reauthed) {
            return Next::Reauth(auth.clone());
        }
        // The route fails over on `reason`, and another target it has not left has a circuit
        // that is not open (a 429 is waited out here when no other target can take it).
        let one_attempt = self.asked.client_retry;
        let movable = |reason: &FailoverReason| {
            !one_attempt
                && route.targets.failover_on.contains(*reason)
                && at
                    .others(route, target.index)
                    .any(|t| cx.circuits.state(&t.name, sent) != Some(CircuitState::Open))
        };
        if let Some(reason) = failover::at_once(outcome, seen).filter(movable) {
            return Next::Move(reason);
        }
        let rules = Rules {
            policy: &route.retry,
            backoff: &route.backoff,
            budget: &route.budget,
        };
        let shown = Shown { outcome, hint };
        let decision = self
            .state
            .decide(rules, &self.asked.parts.method, shown, received, &mut rand::rng());
        match decision {
            Decision::Retry { wait, source, reason } => Next::Retry(Pause { wait, source, reason }),
            Decision::Deliver(stop) => match failover::after_decision(outcome, stop, seen).filter(movable) {
                Some(reason) => Next::Move(reason),
                None => Next::Deliver(stop),
            },
        }
    }

    /// The request leaves `target` for `reason`: its answer kept (delivered if no other target
    /// can run), the next attempt admitted at once.
    fn move_on(&mut self, result: Answer, target: &Target, reason: FailoverReason, now: Instant) {
        self.slot = None;
        self.progress.keep(result, target, self.state.total, now);
        self.at.leave(self.asked.route, target.index, reason, &mut self.state);
        self.waited = (Duration::ZERO, None);
    }

    /// The credential `target`'s answer rejected is renewed, and the attempt repeated once, on
    /// the same target, not counted as a retry: the answer is kept meanwhile; what to wait for is
    /// returned (the refresh the rejection asked for, within the deadline).
    fn reauth(&mut self, result: Answer, target: &Target, auth: Arc<CloudAuth>, now: Instant) -> Then {
        tracing::info!(route = %self.asked.route.name, upstream = %target.name, "cloud credential rejected: renewed, attempt repeated");
        self.slot = None;
        self.reauthed = true;
        self.progress.keep(result, target, self.state.total, now);
        self.waited = (Duration::ZERO, None);
        let fetches = auth.rejected();
        let limit = REAUTH_WAIT.min(self.state.deadline.saturating_duration_since(now));
        Then::Renewed(auth, fetches, limit)
    }

    /// The request is retried on `target` after `wait`: its answer kept meanwhile; the wait
    /// returned.
    fn retry(&mut self, result: Answer, target: &Target, pause: Pause, now: Instant) -> Duration {
        let Pause { wait, source, reason } = pause;
        self.slot = None;
        let route = &self.asked.route.name;
        self.cx
            .metrics
            .retry_wait_seconds
            .with_label_values(&[&**route, source.as_str()])
            .observe(wait.as_secs_f64());
        let attempt = self.state.total;
        tracing::debug!(route = %route, attempt, reason = %reason, wait_ms = wait.as_millis() as u64, source = source.as_str(), "retrying");
        self.retrying = Some(reason);
        self.progress.waited(wait);
        self.waited = (wait, Some(source.as_str()));
        self.progress.keep(result, target, attempt, now);
        wait
    }

    /// Ends the loop with the last attempt's answer (`outcome`), stopped for `stop`: counted,
    /// and logged when it is a failure.
    fn deliver(&mut self, result: Answer, target: &Target, outcome: Outcome, stop: Stop) -> Delivery {
        let route = self.asked.route;
        let family = match stop {
            Stop::Exhausted => Some(&self.cx.metrics.retries_exhausted_total),
            Stop::BudgetExhausted => Some(&self.cx.metrics.retry_budget_exhausted_total),
            _ => None,
        };
        if let Some(family) = family {
            family.with_label_values(&[&*route.name]).inc();
        }
        let mut result = result.map_err(|e| {
            tracing::warn!(route = %route.name, upstream = %target.name, error = %e, "upstream attempt failed");
            outbound::attempt_error(&target.name, e)
        });
        // The limit's place is held until the response ends.
        if let (Some(slot), Ok(resp)) = (self.slot.take(), result.as_mut()) {
            resp.body_mut().inner_mut().hold_until_end(Box::new(slot));
        }
        let total = self.state.total;
        if outcome.is_failure() && (total > 1 || stop != Stop::NotRetryable) {
            tracing::info!(route = %route.name, attempts = total, reason = stop.as_str(), outcome = outcome.label(), "delivering failure");
        }
        self.progress.deliver(result, stop, self.at.failovers)
    }

    /// Counts a move from target `from` to `to`.
    fn count_failover(&self, from: usize, to: &Target, reason: FailoverReason) {
        let route = self.asked.route;
        let from = route.targets.get(from).map_or("", |t| &*t.name);
        self.cx
            .metrics
            .failovers_total
            .with_label_values(&[&*route.name, from, &*to.name, reason.as_str()])
            .inc();
        tracing::info!(route = %route.name, from, to = %to.name, reason = reason.as_str(), "failover");
    }
}

/// The request as the app asked it, the same for every attempt (a continuation's: the app's
/// request with the partial answer, its head and body made for that continuation).
#[derive(Clone, Copy)]
pub(super) struct Asked<'r> {
    /// The app's request (`request.rs`): its route, retry terms and deadline.
    pub(super) request: &'r request::Request,
    pub(super) route: &'r Route,
    pub(super) parts: &'r http::request::Parts,
    /// The path forwarded (after `strip_prefix`).
    pub(super) path: &'r str,
    pub(super) body: &'r Bytes,
    /// What it names (`wire::api`), read once.
    pub(super) named: &'r Named,
    /// Its deadline, counted from its arrival (a queue's wait has spent some of it).
    pub(super) deadline: Instant,
    /// The request repeats one that failed for good moments ago: a client's own retry, given one
    /// attempt in all (`crate::retry::client_retry`).
    pub(super) client_retry: bool,
    /// The targets that cut the stream this request continues (none for a request of its own).
    pub(super) cuts: &'r [Cut],
}

impl<'r> Asked<'r> {
    /// The app's request, as it came.
    pub(super) fn of(request: &'r request::Request) -> Asked<'r> {
        Asked {
            request,
            route: &request.route,
            parts: &request.parts,
            path: request.path(),
            body: &request.body,
            named: &request.named,
            deadline: request.deadline,
            client_retry: request.is_client_retry(),
            cuts: &[],
        }
    }

    /// A continuation of the app's `request`, cut by `cuts`: its head, path and body made for it.
    pub(super) fn continuing(
        request: &'r request::Request,
        (parts, path, body): (&'r http::request::Parts, &'r str, &'r Bytes),
        cuts: &'r [Cut],
    ) -> Asked<'r> {
        Asked {
            parts,
            path,
            body,
            cuts,
            client_retry: false,
            ..Asked::of(request)
        }
    }
}

/// What admission decided for the next attempt.
enum Admit<'r> {
    /// Send this request.
    Go(Request<Full<Bytes>>, Admitted<'r>),
    /// Pacing or a cooldown holds the request this long; admit again then.
    Hold(Duration),
    /// Every target is at its `concurrency` limit: wait for a turn in this one's queue, then
    /// admit again.
    Queue(&'r Target),
    /// No attempt can run: this is delivered.
    Stop(Delivery),
}

/// What a target's concurrency limit said of an attempt. Returned by value and matched at once
/// (as `Admit` is): boxing the large answer would allocate on every refusal and every wait.
#[allow(clippy::large_enum_variant)]
enum Placed<'r> {
    /// Its slot (none: no limit).
    Slot(Option<Slot>),
    /// At the limit: another target.
    Elsewhere,
    /// This is admission's answer.
    Answer(Admit<'r>),
}

/// An admitted attempt: where it goes, the circuit's permit, and the scope its holds are kept under
/// (hashed only when a hold needs it).
struct Admitted<'r> {
    target: &'r Target,
    permit: Permit,
    scope: HoldScope<'r>,
}

/// What one attempt showed, for the decision after it.
#[derive(Clone, Copy)]
struct Observed {
    outcome: Outcome,
    seen: failover::Seen,
    /// The reset the response gave (a header's, else its error body's).
    hint: Option<RetryHint>,
    /// When the attempt was sent, and when its answer (or its failure) came.
    sent: Instant,
    received: Instant,
    /// The answer said the cloud credential it carried expired or was revoked.
    credential_rejected: bool,
}

/// What the loop waits for before the next admission.
enum Then {
    Now,
    Sleep(Duration),
    /// A fetch of this credential after the `u64`th, at most this long.
    Renewed(Arc<CloudAuth>, u64, Duration),
}

/// A request waits this long at most for a target's first cloud credential, then admits again.
const CREDENTIAL_PENDING: Duration = Duration::from_millis(50);

/// A repeated attempt waits this long at most for its renewed credential.
const REAUTH_WAIT: Duration = Duration::from_secs(10);

/// What follows an attempt.
enum Next {
    /// To another target, at once.
    Move(FailoverReason),
    /// Here again once the target's cloud credential is renewed (not counted as a retry).
    Reauth(Arc<CloudAuth>),
    /// Here again, after a wait.
    Retry(Pause),
    Deliver(Stop),
}

/// The wait before a retry on the same target: how long, what set it, and what is retried.
#[derive(Clone, Copy)]
struct Pause {
    wait: Duration,
    source: WaitSource,
    reason: RetryOn,
}

/// Whether an attempt's outcome is a rate limit (not a quota, an overload or a refusal) whose
/// reset is within the route's `failover_wait`.
fn resets_within_failover_wait(
    route: &Route,
    outcome: Outcome,
    class: Option<ErrorClass>,
    hint: Option<RetryHint>,
) -> bool {
    let wait = route.config.failover_wait;
    class.map_or(outcome.is_rate_limited(), |c| c == ErrorClass::RateLimited)
        && !wait.is_zero()
        && hint.is_some_and(|h| h.delay <= wait)
}
