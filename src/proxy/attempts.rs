//! Step 6 of the pipeline: the retry loop ([`Proxy::attempts`]), one attempt after another until
//! an outcome is delivered: admit, send, observe, decide.

use super::limits::Limits;
use super::stream::Primed;
use super::targets::Cursor;
use super::tokens::RequestTokens;
use super::{commit, pacing, tokens, Proxy, Route, Target};
use crate::circuit::{Hold, Permit};
use crate::config::{Balance, FailoverReason};
use crate::credentials::{self, Credentials};
use crate::dead_letters::{self, AttemptRecord, DeadLetter};
use crate::error::ProxyError;
use crate::idempotency::Claim;
use crate::jobs;
use crate::retry;
use crate::retry::failover;
use crate::retry::policy::{Decision, Outcome, RetryState, Stop};
use crate::retry::provider_error::{ErrorClass, ErrorSignal};
use crate::retry::retry_after::HintSource;
use crate::time;
use crate::traces::RequestSpan;
use crate::upstream::{AttemptError, UpstreamBody};
use crate::wire::headers;
use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::Full;
use std::time::Duration;
use tokio::time::Instant;

impl Proxy {
    /// The retry loop, until an outcome is delivered, as four phases per attempt: **admit** (the
    /// deadline, then the target: the one the request is on, else one chosen by the route's
    /// balance among those whose circuit and the credential's holds let it through; see
    /// `targets.rs`), **send**, **observe** (the outcome feeds the breaker, a 429's reset hint or
    /// a used-up quota the credential's holds, the metrics) and **next step** (move to another
    /// target on a failover class, else the pure retry policy: deliver, or wait and go round
    /// again).
    pub(super) async fn attempts(
        &self,
        route: &Route,
        parts: &http::request::Parts,
        path: &str,
        body: &Bytes,
        trace: &RequestSpan,
    ) -> Delivery {
        let limits = retry::policy::request_limits(&parts.headers, &route.retry);
        let started = crate::time::now();
        let mut state = RetryState::new(limits.max_attempts, started + limits.deadline);
        if limits.sdk_retry {
            route.budget.record_external_retry(started);
        } else {
            route.budget.deposit(started);
        }
        let mut d = Progress::new(limits.deadline, self.models.for_request(body), started);
        let mut at = Cursor::new();
        let mut now = started;
        let mut waited: (Duration, Option<&'static str>) = (Duration::ZERO, None);
        // A retry is counted when it is sent: one the circuit or the deadline stops after its
        // wait is not a retry (rebound_retries_total matches the provider's extra calls).
        let mut retrying: Option<String> = None;
        loop {
            // Taken apart here and moved on unborrowed: nothing of it waits in this future.
            let Go {
                target,
                permit,
                req,
                limits,
            } = match self
                .admit(Asked::of(route, parts, path, body), &mut state, &mut d, &mut at, now)
                .await
            {
                Admit::Go(go) => go,
                Admit::Held => {
                    now = crate::time::now();
                    continue;
                }
                Admit::Stop(delivery) => return delivery.with_failovers(at.failovers),
            };
            self.count_retry(route, retrying.take());
            state.attempt();
            d.sending(target.index, now);
            let remaining = state.deadline.saturating_duration_since(now);
            let span = trace.attempt(state.total, &target.name, waited.0, waited.1);
            // Load is tracked only where it chooses (least_loaded over several targets).
            let balanced = route.targets.balance == Balance::LeastLoaded && route.targets.len() > 1;
            let in_flight = balanced.then(|| target.load.start());
            // The attempt's result lives in this block, not across the backoff's wait: a local
            // borrowed in an `async fn` keeps its place in the future until its scope ends.
            let wait = {
                let (result, received) = commit::attempt(route, target, traced(&span, req), now, remaining).await;
                drop(in_flight);
                if balanced {
                    target.load.observe(received.saturating_duration_since(now));
                }
                let (outcome, hint, class) = self.observe(target, permit, &limits, &result, received);
                let status = result.as_ref().ok().map(|r| r.status().as_u16());
                span.end(outcome.label(), status, hint.map(|h| h.delay));
                d.record(outcome, status, received - now);
                let seen = failover::Seen {
                    class,
                    first_byte_limit: target.config.first_byte_timeout.is_some(),
                    // Read only where it matters: a prompt too long for this target.
                    larger_context_elsewhere: class == Some(ErrorClass::ContextLength)
                        && at.larger_context(route, target),
                    reset_within_failover_wait: resets_within_failover_wait(route, outcome, class, hint),
                };
                let observed = Observed::of((outcome, seen), hint, now, received);
                match self.next_step(route, &parts.method, &mut state, &at, target, observed) {
                    Next::Move(reason) => {
                        d.keep(result, target, state.total, now);
                        at.leave(route, target.index, reason, &mut state);
                        waited = (Duration::ZERO, None);
                        None
                    }
                    Next::Retry { wait, source, reason } => {
                        self.count_retry_wait(route, state.total, &reason.to_string(), wait, source.as_str());
                        retrying = Some(reason.to_string());
                        d.waited(wait);
                        waited = (wait, Some(source.as_str()));
                        d.keep(result, target, state.total, now);
                        Some(wait)
                    }
                    Next::Deliver(stop) => {
                        let result = self.last_result(route, target, result, (outcome, stop), state.total);
                        return d.deliver(result, stop).with_failovers(at.failovers);
                    }
                }
            };
            if let Some(wait) = wait {
                tokio::time::sleep(wait).await;
            }
            now = crate::time::now();
        }
    }

    /// The result the loop ends with, after `total` attempts, the last with `outcome`: counted,
    /// and logged when it is a failure.
    fn last_result(
        &self,
        route: &Route,
        target: &Target,
        result: Result<Response<Primed<UpstreamBody>>, AttemptError>,
        (outcome, stop): (Outcome, Stop),
        total: u32,
    ) -> Result<Response<Primed<UpstreamBody>>, ProxyError> {
        self.count_stop(route, stop);
        let result = result.map_err(|e| {
            tracing::warn!(route = %route.name, upstream = %target.name, error = %e, "upstream attempt failed");
            attempt_error(&target.name, e)
        });
        if outcome.is_failure() && (total > 1 || stop != Stop::NotRetryable) {
            tracing::info!(route = %route.name, attempts = total, reason = stop.as_str(), outcome = outcome.label(), "delivering failure");
        }
        result
    }

    /// After an attempt: move to another target (a failover class, when another target can take
    /// the request), retry here after a wait, or deliver (the pure retry policy decides those).
    fn next_step(
        &self,
        route: &Route,
        method: &Method,
        state: &mut RetryState,
        at: &Cursor,
        target: &Target,
        observed: Observed,
    ) -> Next {
        let Observed {
            outcome,
            seen,
            hint,
            sent,
            received,
        } = observed;
        let movable = |reason: &FailoverReason| self.can_move(route, at, target.index, *reason, sent);
        if let Some(reason) = failover::at_once(outcome, seen).filter(movable) {
            return Next::Move(reason);
        }
        let decision = state.decide(
            &route.retry,
            &route.backoff,
            method,
            outcome,
            hint,
            &route.budget,
            received,
            &mut rand::rng(),
        );
        match decision {
            Decision::Retry { wait, source, reason } => Next::Retry { wait, source, reason },
            Decision::Deliver(stop) => match failover::after_decision(outcome, stop, seen).filter(movable) {
                Some(reason) => Next::Move(reason),
                None => Next::Deliver(stop),
            },
        }
    }

    /// What an attempt's result tells: its outcome (counted), the breaker fed through `permit`,
    /// a 429's reset hint noted as a cooldown for the credential, and the hint for the decision.
    pub(super) fn observe(
        &self,
        target: &Target,
        permit: Permit,
        limits: &Limits<'_>,
        result: &Result<Response<Primed<UpstreamBody>>, AttemptError>,
        received: Instant,
    ) -> (Outcome, Option<retry::RetryHint>, Option<ErrorClass>) {
        let outcome = match result {
            Ok(resp) => commit::outcome_of(resp),
            Err(e) => e.outcome(),
        };
        target.attempts.count(outcome.label());
        if let Ok(resp) = result {
            let key = || limits.per_model(&self.credentials, target);
            pacing::note(&self.circuits, target, key, resp.headers(), received);
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
                Some(retry::RetryHint {
                    delay,
                    source: HintSource::ErrorBody,
                })
            }),
            _ => None,
        };
        permit.record(
            outcome,
            hint.filter(|h| h.source.is_explicit()).map(|h| h.delay),
            received,
        );
        if class == Some(ErrorClass::Exhausted) {
            // A quota used up: the credential is avoided fleet-wide until its reset (an hour when
            // the provider gives none).
            let until = received + hint.map_or(failover::EXHAUSTED_FOR, |h| h.delay);
            self.circuits.hold_note(
                Hold::Exhausted,
                &target.name,
                limits.credential(&self.credentials),
                until,
                received,
            );
        } else if let Some(h) = hint.filter(|_| outcome.is_rate_limited() || class == Some(ErrorClass::RateLimited)) {
            self.circuits.cooldown_note(
                &target.name,
                limits.per_model(&self.credentials, target),
                received + h.delay,
                received,
            );
        }
        (outcome, hint, class)
    }

    /// Counts the retry being sent, if this attempt is one.
    fn count_retry(&self, route: &Route, retrying: Option<String>) {
        if let Some(reason) = retrying {
            self.metrics
                .retries_total
                .with_label_values(&[&*route.name, &reason])
                .inc();
        }
    }

    fn count_retry_wait(&self, route: &Route, attempt: u32, reason: &str, wait: Duration, source: &str) {
        self.metrics
            .retry_wait_seconds
            .with_label_values(&[&*route.name, source])
            .observe(wait.as_secs_f64());
        tracing::debug!(route = %route.name, attempt, reason, wait_ms = wait.as_millis() as u64, source, "retrying");
    }

    pub(super) fn count_stop(&self, route: &Route, stop: Stop) {
        let family = match stop {
            Stop::Exhausted => &self.metrics.retries_exhausted_total,
            Stop::BudgetExhausted => &self.metrics.retry_budget_exhausted_total,
            _ => return,
        };
        family.with_label_values(&[&*route.name]).inc();
    }

    /// Records a dead letter in the background (the response does not wait for the store).
    pub(super) fn record_dead_letter(
        &self,
        route: &Route,
        parts: &http::request::Parts,
        body: &Bytes,
        d: &Delivery,
        reason: &str,
    ) {
        let idem = route.idempotency.as_ref();
        let failure = dead_letters::Failure {
            route: &route.name,
            upstream: &route.targets.get(d.target).unwrap_or(route.primary()).name,
            parts,
            body,
            keep_body: route.config.dead_letter_bodies,
            idempotency_header: idem.map(|i| &i.policy.header),
            identity: idem.map(|i| {
                i.identity_of(
                    i.fingerprint_version(),
                    &parts.method,
                    parts.uri.path(),
                    parts.uri.query(),
                    &parts.headers,
                    body,
                )
            }),
            reason,
            error_class: d.error_class(),
            final_status: d.status(),
            attempts: tokens::with_usage(&d.attempts, &d.tokens.ledger),
            job_id: parts.extensions.get::<jobs::JobRun>().map(|j| j.0.clone()),
        };
        let entry = DeadLetter::of(failure, &self.dead_letter_config);
        // In memory: recorded here, before the response goes out; on Redis: by a task.
        if let Err(entry) = self.dead_letters.add_now(entry) {
            let store = self.dead_letters.clone();
            self.tasks.spawn(async move {
                if let Err(e) = store.add(*entry).await {
                    tracing::warn!(error = %e, "dead letter not recorded");
                }
            });
        }
    }
}

/// The attempts of a request, in order: one in place (most requests make one, and its record
/// then needs no allocation of its own).
pub(super) type Attempts = smallvec::SmallVec<[AttemptRecord; 1]>;

/// The retry loop's account of a request so far: what each attempt did, and where.
pub(super) struct Progress {
    /// The last attempt's outcome (`None` while no attempt ran).
    pub(super) outcome: Option<Outcome>,
    pub(super) attempts: Attempts,
    /// The target of the last attempt (its index in the route's list).
    pub(super) target: usize,
    /// The last failed response, kept while waiting: delivered if no further attempt can run.
    /// Boxed: only a retried request keeps one, and inline it would take its room in every
    /// request's future.
    pub(super) last: Option<Box<Response<Primed<UpstreamBody>>>>,
    /// The request's whole deadline (for the error that reports it).
    pub(super) deadline: Duration,
    /// The request's model label and token ledger.
    pub(super) tokens: RequestTokens,
    /// When the last attempt was sent.
    pub(super) sent: Instant,
}

impl Progress {
    pub(super) fn new(deadline: Duration, tokens: RequestTokens, started: Instant) -> Progress {
        Progress {
            outcome: None,
            attempts: Attempts::new(),
            target: 0,
            last: None,
            deadline,
            tokens,
            sent: started,
        }
    }

    /// An attempt goes to `target` at `now`: the failed response kept from the last one is
    /// dropped.
    fn sending(&mut self, target: usize, now: Instant) {
        self.last = None;
        self.target = target;
        self.sent = now;
    }

    pub(super) fn record(&mut self, outcome: Outcome, status: Option<u16>, took: Duration) {
        self.outcome = Some(outcome);
        self.attempts.push(AttemptRecord {
            outcome: std::borrow::Cow::Borrowed(outcome.label()),
            status,
            duration_ms: took.as_millis() as u64,
            wait_ms: 0,
            usage: None,
        });
    }

    /// Keeps a failed attempt's response while the loop goes on (delivered if nothing else can
    /// run); its usage is counted as wasted.
    fn keep(
        &mut self,
        result: Result<Response<Primed<UpstreamBody>>, AttemptError>,
        target: &Target,
        attempt: u32,
        now: Instant,
    ) {
        self.last = result.ok().map(|mut r| {
            tokens::discard(&mut r, &target.tokens, &self.tokens, attempt, now);
            Box::new(r)
        });
    }

    pub(super) fn waited(&mut self, wait: Duration) {
        if let Some(a) = self.attempts.last_mut() {
            a.wait_ms = wait.as_millis() as u64;
        }
    }

    /// Ends the loop with this result.
    pub(super) fn deliver(
        &mut self,
        result: Result<Response<Primed<UpstreamBody>>, ProxyError>,
        stop: Stop,
    ) -> Delivery {
        Delivery {
            result,
            outcome: self.outcome,
            attempts: std::mem::take(&mut self.attempts),
            stop,
            target: self.target,
            failovers: 0,
            tokens: self.tokens.clone(),
            sent: self.sent,
        }
    }

    /// Ends the loop before an attempt could run: the last failed response, if one is kept,
    /// else rebound's own error.
    pub(super) fn stop_before_attempt(&mut self, stop: Stop, err: impl FnOnce() -> ProxyError) -> Delivery {
        let result = self.last.take().map_or_else(|| Err(err()), |r| Ok(*r));
        self.deliver(result, stop)
    }
}

/// What follows an attempt.
enum Next {
    /// To another target, at once.
    Move(FailoverReason),
    /// Here again, after `wait`.
    Retry {
        wait: Duration,
        source: retry::policy::WaitSource,
        reason: crate::config::RetryOn,
    },
    Deliver(Stop),
}

/// The request as the app asked it, the same for every attempt.
pub(super) struct Asked<'r> {
    pub(super) route: &'r Route,
    pub(super) parts: &'r http::request::Parts,
    /// The path forwarded (after `strip_prefix`).
    pub(super) path: &'r str,
    pub(super) body: &'r Bytes,
}

impl<'r> Asked<'r> {
    pub(super) fn of(route: &'r Route, parts: &'r http::request::Parts, path: &'r str, body: &'r Bytes) -> Asked<'r> {
        Asked {
            route,
            parts,
            path,
            body,
        }
    }
}

/// What one attempt showed, for the decision after it.
pub(super) struct Observed {
    pub(super) outcome: Outcome,
    pub(super) seen: failover::Seen,
    /// The reset the response gave (a header's, else its error body's).
    pub(super) hint: Option<retry::RetryHint>,
    /// When the attempt was sent, and when its answer (or its failure) came.
    pub(super) sent: Instant,
    pub(super) received: Instant,
}

impl Observed {
    fn of(
        (outcome, seen): (Outcome, failover::Seen),
        hint: Option<retry::RetryHint>,
        sent: Instant,
        received: Instant,
    ) -> Observed {
        Observed {
            outcome,
            seen,
            hint,
            sent,
            received,
        }
    }
}

/// What admission decided for the next attempt.
pub(super) enum Admit<'r> {
    /// Send it.
    Go(Go<'r>),
    /// A cooldown held the request for a while; admit again.
    Held,
    /// No attempt can run: this is delivered.
    Stop(Delivery),
}

/// `req` with the attempt's `traceparent`.
fn traced(span: &crate::traces::AttemptSpan, mut req: Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    span.inject(req.headers_mut());
    req
}

/// An admitted attempt: where it goes, the circuit's permit, the request, and what its limits
/// are kept under (hashed only when a hold needs it).
pub(super) struct Go<'r> {
    pub(super) target: &'r Target,
    pub(super) permit: Permit,
    pub(super) req: Request<Full<Bytes>>,
    pub(super) limits: Limits<'r>,
}

/// What the retry loop hands back.
pub(super) struct Delivery {
    /// The upstream's answer, or rebound's own error.
    pub(super) result: Result<Response<Primed<UpstreamBody>>, ProxyError>,
    /// The last attempt's outcome (`None` when no attempt ran).
    pub(super) outcome: Option<Outcome>,
    pub(super) attempts: Attempts,
    pub(super) stop: Stop,
    /// The target of the last attempt (its index in the route's list).
    pub(super) target: usize,
    /// Times the request moved to another target.
    pub(super) failovers: u32,
    pub(super) tokens: RequestTokens,
    /// When the last attempt was sent.
    pub(super) sent: Instant,
}

impl Delivery {
    pub(super) fn with_failovers(mut self, failovers: u32) -> Delivery {
        self.failovers = failovers;
        self
    }

    /// Whether `claim`'s store keeps this outcome: a response with a stored status that is not
    /// an in-band error.
    pub(super) fn stored_by(&self, claim: &Claim) -> bool {
        let in_band = matches!(self.outcome, Some(Outcome::InBand(_)));
        !in_band && matches!(&self.result, Ok(r) if claim.stores(r.status().as_u16()))
    }

    /// The status the app receives.
    pub(super) fn status(&self) -> u16 {
        match &self.result {
            Ok(r) => r.status().as_u16(),
            Err(e) => e.status().as_u16(),
        }
    }

    /// Why this delivery is a failure for good, if it is one: rebound stopped retrying something
    /// transient, or could not try at all (a permanent 4xx is the app's to see, not a dead letter).
    pub(super) fn dead_letter_reason(&self) -> Option<&'static str> {
        let untried = matches!(self.stop, Stop::CircuitOpen | Stop::Cooldown);
        let failed = self.outcome.is_some_and(Outcome::is_failure);
        (self.stop.is_dead_letter() && (untried || failed)).then(|| self.stop.as_str())
    }

    /// The entry's error class: the last outcome, or what stopped the loop before an attempt.
    pub(super) fn error_class(&self) -> &'static str {
        match (self.outcome, self.stop) {
            (_, stop @ (Stop::CircuitOpen | Stop::Cooldown)) => stop.as_str(),
            (Some(o), _) => o.label(),
            (None, _) => "timeout",
        }
    }
}

/// Whether an attempt's outcome is a rate limit (not a quota, an overload or a refusal) whose
/// reset is within the route's `failover_wait`.
fn resets_within_failover_wait(
    route: &Route,
    outcome: Outcome,
    class: Option<ErrorClass>,
    hint: Option<retry::RetryHint>,
) -> bool {
    let wait = route.config.failover_wait;
    class.map_or(outcome.is_rate_limited(), |c| c == ErrorClass::RateLimited)
        && !wait.is_zero()
        && hint.is_some_and(|h| h.delay <= wait)
}

/// The request sent upstream: same method and body, hop-by-hop and rebound's own headers out,
/// `host` from the upstream URL, the upstream's `set_headers` in. An upstream that sets a
/// credential replaces the app's: every credential header and query parameter of the request
/// (`forms`) is left out.
pub(super) fn build_upstream_request(
    target: &Target,
    parts: &http::request::Parts,
    path: &str,
    body: Bytes,
    forms: &Credentials,
) -> Result<Request<Full<Bytes>>, http::uri::InvalidUri> {
    let upstream = &target.upstream.config;
    let uri = match (parts.uri.query(), upstream.sets_credential) {
        (Some(q), true) => target
            .upstream
            .target_for(path, credentials::strip_query(q).as_deref())?,
        (q, _) => target.upstream.target_for(path, q)?,
    };
    // The target's name for the requested model, when it has one (the rest of the body as sent).
    let body = match target.config.models.is_empty() {
        true => body,
        false => crate::wire::usage::rewrite_model(&body, &target.config.models).map_or(body, Bytes::from),
    };
    let body_len = body.len();
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    let headers = req.headers_mut();
    headers.clone_from(&parts.headers);
    headers::strip_hop_by_hop(headers, false);
    // Rebound's own headers out; the client sets `host` (HTTP/1.1) or `:authority` (HTTP/2)
    // from the upstream URI; the length is the buffered body's.
    headers::remove_all(headers, &headers::NOT_FORWARDED);
    if body_len > 0 || matches!(parts.method, Method::POST | Method::PUT | Method::PATCH) {
        let stated = parts.headers.get(http::header::CONTENT_LENGTH);
        headers.insert(http::header::CONTENT_LENGTH, headers::content_length(body_len, stated));
    }
    if upstream.sets_credential {
        forms.remove_from(headers);
    }
    for (name, value) in &upstream.set_headers {
        headers.insert(name.clone(), value.clone());
    }
    Ok(req)
}

pub(super) fn attempt_error(upstream: &str, e: AttemptError) -> ProxyError {
    let upstream = upstream.to_string();
    match e {
        AttemptError::Timeout(t) => ProxyError::Timeout {
            upstream,
            timeout_ms: t.as_millis(),
        },
        AttemptError::Connect(detail) | AttemptError::RefusedStream(detail) | AttemptError::Reset(detail) => {
            ProxyError::UpstreamUnreachable { upstream, detail }
        }
    }
}
