//! What the attempts hand back ([`Delivery`]), and the account they keep while they run
//! ([`Progress`]): each attempt's record, the last failed response kept while waiting, the
//! request's token ledger.

use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tokio::time::Instant;

use super::primed::Primed;
use super::routes::{Route, Target};
use super::tokens::{self, RequestTokens};
use crate::config::DeadLettersConfig;
use crate::dead_letters::{self, AttemptRecord, DeadLetter};
use crate::error::ProxyError;
use crate::idempotency::Claim;
use crate::jobs;
use crate::retry::policy::{Outcome, Stop};
use crate::upstream::{AttemptError, UpstreamBody};

/// The attempts of a request, in order: one in place (most requests make one, and its record
/// then needs no allocation of its own).
pub(super) type Attempts = smallvec::SmallVec<[AttemptRecord; 1]>;

/// The retry loop's account of a request so far: what each attempt did, and where.
pub(super) struct Progress {
    /// The last attempt's outcome (`None` while no attempt ran).
    outcome: Option<Outcome>,
    attempts: Attempts,
    /// The target of the last attempt (its index in the route's list).
    pub(super) target: usize,
    /// The last failed response, kept while waiting: delivered if no further attempt can run.
    /// Boxed: only a retried request keeps one, and inline it would take its room in every
    /// request's future.
    last: Option<Box<Response<Primed<UpstreamBody>>>>,
    /// The request's whole deadline (for the error that reports it).
    pub(super) deadline: Duration,
    /// The request's model label and token ledger.
    pub(super) tokens: RequestTokens,
    /// When the last attempt was sent.
    sent: Instant,
    /// When the last failed attempt's answer said to try again (its `retry-after`, a reset
    /// header's, its error body's).
    hint: Option<Duration>,
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
            hint: None,
        }
    }

    /// An attempt goes to `target` at `now`: the failed response kept from the last one is
    /// dropped.
    pub(super) fn sending(&mut self, target: usize, now: Instant) {
        self.last = None;
        self.target = target;
        self.sent = now;
    }

    /// Records an attempt's outcome, and when its answer said to try again.
    pub(super) fn record(&mut self, outcome: Outcome, status: Option<u16>, took: Duration, hint: Option<Duration>) {
        self.outcome = Some(outcome);
        self.hint = hint;
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
    pub(super) fn keep(
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

    /// Forgets the kept response: what ends the loop is rebound's own answer.
    pub(super) fn forget(&mut self) {
        self.last = None;
    }

    pub(super) fn waited(&mut self, wait: Duration) {
        if let Some(a) = self.attempts.last_mut() {
            a.wait_ms = wait.as_millis() as u64;
        }
    }

    /// Ends the loop with this result, after `failovers` moves to another target.
    pub(super) fn deliver(
        &mut self,
        result: Result<Response<Primed<UpstreamBody>>, ProxyError>,
        stop: Stop,
        failovers: u32,
    ) -> Delivery {
        let retry_after = match &result {
            Err(e) => e.retry_after(),
            Ok(_) => self.hint,
        };
        Delivery {
            retry_after,
            ratelimit: None,
            result,
            outcome: self.outcome,
            attempts: std::mem::take(&mut self.attempts),
            stop,
            target: self.target,
            failovers,
            tokens: self.tokens.clone(),
            sent: self.sent,
        }
    }

    /// Ends the loop before an attempt could run: the last failed response, if one is kept,
    /// else rebound's own error.
    pub(super) fn stop_before_attempt(
        &mut self,
        stop: Stop,
        failovers: u32,
        err: impl FnOnce() -> ProxyError,
    ) -> Delivery {
        let result = self.last.take().map_or_else(|| Err(err()), |r| Ok(*r));
        self.deliver(result, stop, failovers)
    }
}

impl Delivery {
    /// rebound's own refusal before any attempt (a limit): nothing was sent.
    pub(super) fn refused(err: ProxyError, tokens: RequestTokens) -> Delivery {
        Progress::new(Duration::ZERO, tokens, crate::time::now()).deliver(Err(err), Stop::NotRetryable, 0)
    }
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
    /// When a failure delivered may be tried again, when rebound knows: rebound's own error's
    /// `retry-after`, the last answer's hint, else (set in step 7) the time its target's circuit
    /// stays open.
    pub(super) retry_after: Option<Duration>,
    /// The `RateLimit-Policy` and `RateLimit` fields of the route's tightest limit.
    pub(super) ratelimit: super::limited::RateLimitFields,
}

impl Delivery {
    /// The delivery with the fields of the limits that admitted it.
    pub(super) fn with_ratelimit(mut self, fields: super::limited::RateLimitFields) -> Delivery {
        self.ratelimit = fields;
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

    /// Whether the app receives a failure (a failed answer, or rebound's own error).
    pub(super) fn failed(&self) -> bool {
        self.result.is_err() || self.outcome.is_some_and(Outcome::is_failure)
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

    /// The dead letter of this delivery of the request (`parts`, `body`) on `route`, failed for
    /// good for `reason`.
    pub(super) fn dead_letter(
        &self,
        route: &Route,
        (parts, body): (&http::request::Parts, &Bytes),
        reason: &str,
        config: &DeadLettersConfig,
    ) -> DeadLetter {
        let idem = route.idempotency.as_ref();
        let failure = dead_letters::Failure {
            route: &route.name,
            upstream: &route.targets.get(self.target).unwrap_or(route.primary()).name,
            parts,
            body,
            keep_body: route.config.dead_letter_bodies,
            idempotency_header: idem.map(|i| &i.policy.header),
            identity: idem.map(|i| i.identity_of(i.fingerprint_version(), parts, body)),
            reason,
            error_class: self.error_class(),
            final_status: self.status(),
            error_message: self.result.as_ref().ok().and_then(|r| {
                let m = r.extensions().get::<crate::retry::provider_error::ProviderMessage>()?;
                Some(&*m.0)
            }),
            attempts: tokens::with_usage(&self.attempts, &self.tokens.ledger),
            job_id: parts.extensions.get::<jobs::JobRun>().map(|j| j.0.as_str().to_owned()),
        };
        DeadLetter::of(failure, config)
    }
}
