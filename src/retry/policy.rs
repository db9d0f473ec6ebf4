//! The retry decision for one finished attempt: deliver what we have, or wait and try again.
//! Pure: the caller passes the time, the RNG and the budget, and applies the decision.
//!
//! Order of checks (the first that applies wins):
//! 1. a success, or an outcome that `retry_on` / `retry_once_on` do not name, is delivered;
//!    An in-band error ([`Outcome::InBand`]) counts as the status it stands for.
//! 2. a POST/PATCH whose failure may have been processed (reset after send, timeout, 500, 502,
//!    504) is delivered under `non_idempotent = "safe-only"`;
//! 3. a `retry_once_on` outcome already retried once, or the last allowed attempt, is delivered
//!    (`Exhausted`);
//! 4. the wait is `backoff`, or with a Retry-After hint `max(backoff, hint) + jitter`; a hint over
//!    `max_retry_after`, or a wait that would end past the deadline, delivers at once;
//! 5. the route's retry budget must grant the retry, else the failure is delivered.

use std::time::Duration;

use http::{Method, StatusCode};
use rand::Rng;

use super::backoff::{retry_after_jitter, Backoff};
use super::budget::RetryBudget;
use super::retry_after::RetryHint;
use crate::config::{NonIdempotent, RetryOn, RetryPolicy};
use crate::time::Instant;
use crate::words::{spelled, AttemptOutcome};

/// What one attempt produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A response head with this status (for 2xx, read ahead to its commit point too: the first
    /// body byte, an event stream's first event, a JSON body's end).
    Status(StatusCode),
    /// No connection: the request was never sent.
    ConnectFailure,
    /// HTTP/2 REFUSED_STREAM: the server did not process the request.
    RefusedStream,
    /// The connection failed after the request may have been sent.
    Reset,
    /// No response head within the per-try timeout, or no first body byte within
    /// `first_byte_timeout`.
    Timeout,
    /// A 2xx whose first SSE event (or whole JSON body) is an error object: the status it stands
    /// for (529 overloaded, 429 rate limited, 500 server error), else the response's own status
    /// (an error type with no retryable equivalent). Retried, fed to the breaker and the cooldown
    /// as that status; labelled `stream_error`.
    InBand(StatusCode),
}

/// How safe it is to send the request again (RFC 9110 §9.2.2 for non-idempotent methods).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Safety {
    /// The provider surely did not process it: connect failure, refused stream, 429, 503, 529.
    NotProcessed,
    /// The provider may have processed it: reset after send, timeouts, other 5xx.
    MaybeProcessed,
    /// A success or a permanent failure: never retried.
    Final,
}

impl Outcome {
    /// The `retry_on` entry this outcome matches.
    pub fn token(self) -> Option<RetryOn> {
        match self {
            Outcome::ConnectFailure => Some(RetryOn::ConnectFailure),
            Outcome::RefusedStream => Some(RetryOn::RefusedStream),
            Outcome::Reset => Some(RetryOn::Reset),
            Outcome::Timeout => Some(RetryOn::Timeout),
            Outcome::Status(s) | Outcome::InBand(s) if s == StatusCode::TOO_MANY_REQUESTS || s.is_server_error() => {
                Some(RetryOn::Status(s.as_u16()))
            }
            Outcome::Status(_) | Outcome::InBand(_) => None,
        }
    }

    /// A 429, or an in-band rate-limit error: its reset hints count, and note a cooldown.
    pub(crate) fn is_rate_limited(self) -> bool {
        matches!(self, Outcome::Status(s) | Outcome::InBand(s) if s == StatusCode::TOO_MANY_REQUESTS)
    }

    /// Whether a retry could process the request twice.
    pub(crate) fn safety(self) -> Safety {
        match self {
            Outcome::ConnectFailure | Outcome::RefusedStream => Safety::NotProcessed,
            // 521, 522, 523: Cloudflare could not reach the origin, so the provider never saw it.
            Outcome::Status(s) | Outcome::InBand(s) if matches!(s.as_u16(), 429 | 503 | 521..=523 | 529) => {
                Safety::NotProcessed
            }
            Outcome::Status(s) | Outcome::InBand(s) if s.is_server_error() => Safety::MaybeProcessed,
            Outcome::Reset | Outcome::Timeout => Safety::MaybeProcessed,
            Outcome::Status(_) | Outcome::InBand(_) => Safety::Final,
        }
    }

    /// Whether this is a failure (anything but a 1xx-3xx response; an in-band error always is).
    pub(crate) fn is_failure(self) -> bool {
        !matches!(self, Outcome::Status(s) if !(s.is_client_error() || s.is_server_error()))
    }

    /// What it counts as (`rebound_upstream_attempts_total{outcome}`).
    pub(crate) fn kind(self) -> AttemptOutcome {
        match self {
            Outcome::Status(s) if s.as_u16() == 429 => AttemptOutcome::Status429,
            Outcome::Status(s) if s.is_client_error() => AttemptOutcome::Status4xx,
            Outcome::Status(s) if s.is_server_error() => AttemptOutcome::Status5xx,
            Outcome::Status(_) => AttemptOutcome::Ok,
            Outcome::ConnectFailure => AttemptOutcome::ConnectFailure,
            Outcome::RefusedStream | Outcome::Reset => AttemptOutcome::Reset,
            Outcome::Timeout => AttemptOutcome::Timeout,
            Outcome::InBand(_) => AttemptOutcome::StreamError,
        }
    }

    /// Its `outcome` label.
    pub(crate) fn label(self) -> &'static str {
        self.kind().as_str()
    }
}

/// Methods RFC 9110 §9.2.2 calls idempotent: safe to repeat whatever happened.
pub(crate) fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT | Method::DELETE | Method::TRACE
    )
}

pub(crate) use crate::words::Stop;

/// Where a wait came from (the `source` label of `rebound_retry_wait_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitSource {
    Backoff,
    RetryAfter,
}

spelled!(WaitSource { "backoff" => Backoff, "retry_after" => RetryAfter });

/// What to do after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Deliver(Stop),
    Retry {
        wait: Duration,
        source: WaitSource,
        reason: RetryOn,
    },
}

/// A route's retry rules, as one attempt's decision reads them.
#[derive(Clone, Copy)]
pub(crate) struct Rules<'a> {
    pub(crate) policy: &'a RetryPolicy,
    pub(crate) backoff: &'a Backoff,
    pub(crate) budget: &'a RetryBudget,
}

/// What one attempt showed: its outcome, and the reset its response gave (a header's, else its
/// error body's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shown {
    pub(crate) outcome: Outcome,
    pub(crate) hint: Option<RetryHint>,
}

/// The retry state of one request across its attempts.
#[derive(Debug, Clone)]
pub(crate) struct RetryState {
    /// Attempts allowed (the policy's, tightened by `x-rebound-max-attempts`).
    pub max_attempts: u32,
    /// The whole request must be answered by then.
    pub deadline: Instant,
    /// Attempts made so far on the current target (`max_attempts` counts these).
    pub attempts: u32,
    /// Attempts made so far on every target.
    pub total: u32,
    /// `retry_once_on` entries already retried.
    once_used: Vec<RetryOn>,
    /// The previous backoff (decorrelated jitter); reset by a server-directed wait.
    prev_backoff: Option<Duration>,
}

impl RetryState {
    pub(crate) fn new(max_attempts: u32, deadline: Instant) -> RetryState {
        RetryState {
            max_attempts: max_attempts.max(1),
            deadline,
            attempts: 0,
            total: 0,
            once_used: Vec::new(),
            prev_backoff: None,
        }
    }

    /// Counts an attempt about to be sent.
    pub(crate) fn attempt(&mut self) {
        self.attempts += 1;
        self.total += 1;
    }

    /// The request moves to another target: its attempts, `retry_once_on` entries and backoff
    /// start afresh there (`max_attempts` counts per target); the deadline and the budget do not.
    pub(crate) fn switch_target(&mut self) {
        self.attempts = 0;
        self.once_used.clear();
        self.prev_backoff = None;
    }

    /// Decides after attempt number `self.attempts` showed `shown` (its outcome and the reset it
    /// gave), under a route's `rules`. A `Retry` is committed: the budget was withdrawn and the
    /// state advanced.
    pub(crate) fn decide<R: Rng + ?Sized>(
        &mut self,
        rules: Rules<'_>,
        method: &Method,
        shown: Shown,
        now: Instant,
        rng: &mut R,
    ) -> Decision {
        let Rules {
            policy,
            backoff,
            budget,
        } = rules;
        let Shown { outcome, hint } = shown;
        if !outcome.is_failure() {
            return Decision::Deliver(Stop::Success);
        }
        let Some(token) = outcome.token() else {
            return Decision::Deliver(Stop::NotRetryable);
        };
        let once = policy.retry_once_on.contains(&token);
        if !once && !policy.retry_on.contains(&token) {
            return Decision::Deliver(Stop::NotRetryable);
        }
        if policy.non_idempotent == NonIdempotent::SafeOnly
            && !is_idempotent(method)
            && outcome.safety() != Safety::NotProcessed
        {
            return Decision::Deliver(Stop::UnsafeToReplay);
        }
        if self.attempts >= self.max_attempts || (once && self.once_used.contains(&token)) {
            return Decision::Deliver(Stop::Exhausted);
        }

        let retry_number = self.attempts; // the first retry follows attempt 1
        let backoff_wait = backoff.delay(retry_number, self.prev_backoff, rng);
        // Reset headers (x-ratelimit-reset-*) come on every response; only a 429 makes them a hint.
        let hint = hint.filter(|h| policy.respect_retry_after && (h.source.is_explicit() || outcome.is_rate_limited()));
        let (wait, source) = match hint {
            Some(h) if h.delay > policy.max_retry_after => return Decision::Deliver(Stop::HintTooLong),
            Some(h) => {
                let wait = backoff_wait.max(h.delay) + retry_after_jitter(h.delay, rng);
                (
                    wait,
                    if h.delay >= backoff_wait {
                        WaitSource::RetryAfter
                    } else {
                        WaitSource::Backoff
                    },
                )
            }
            None => (backoff_wait, WaitSource::Backoff),
        };
        // An attempt must fit after the wait: a wait that ends at the deadline is a wasted wait.
        if now + wait >= self.deadline {
            return Decision::Deliver(Stop::Deadline);
        }
        if !budget.withdraw(now) {
            return Decision::Deliver(Stop::BudgetExhausted);
        }
        self.prev_backoff = if source == WaitSource::RetryAfter {
            None
        } else {
            Some(backoff_wait)
        };
        if once {
            self.once_used.push(token);
        }
        Decision::Retry {
            wait,
            source,
            reason: token,
        }
    }
}

/// What the app's request asks of the retry loop: its own limits (the policy's, tightened, never
/// loosened) and whether it is itself an SDK's retry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RetryTerms {
    pub max_attempts: u32,
    pub deadline: Duration,
    /// `x-stainless-retry-count` > 0: the request counts against the retry budget, so that two
    /// layers cannot multiply an outage.
    pub(crate) sdk_retry: bool,
}

/// The request's [`RetryTerms`], from `x-rebound-max-attempts`, `x-rebound-deadline-ms`, the
/// SDKs' `x-stainless-timeout` / `x-stainless-read-timeout` and google-genai's `x-server-timeout`
/// (seconds: the client gives up then, so retrying past it is waste) and
/// `x-stainless-retry-count`, each read from its first value as `HeaderMap::get` would.
/// Unparseable values are ignored.
///
/// One pass over the headers ([`first_values`]): five lookups by name would hash each
/// name whether or not it is there, which costs more than walking the dozen headers a request
/// carries.
pub(crate) fn retry_terms(headers: &http::HeaderMap, policy: &RetryPolicy) -> RetryTerms {
    use crate::wire::headers::{
        first_values, X_REBOUND_DEADLINE_MS, X_REBOUND_MAX_ATTEMPTS, X_SERVER_TIMEOUT, X_STAINLESS_READ_TIMEOUT,
        X_STAINLESS_RETRY_COUNT, X_STAINLESS_TIMEOUT,
    };
    let first = first_values(
        headers,
        &[
            X_REBOUND_MAX_ATTEMPTS,
            X_REBOUND_DEADLINE_MS,
            X_STAINLESS_TIMEOUT,
            X_STAINLESS_READ_TIMEOUT,
            X_STAINLESS_RETRY_COUNT,
            X_SERVER_TIMEOUT,
        ],
    );
    let text = |i: usize| first[i].and_then(|v| v.to_str().ok()).map(str::trim);
    let mut max_attempts = policy.max_attempts;
    if let Some(n) = text(0).and_then(|v| v.parse::<u32>().ok()) {
        max_attempts = max_attempts.min(n.max(1));
    }
    let mut deadline = policy.deadline;
    if let Some(ms) = text(1).and_then(|v| v.parse::<u64>().ok()) {
        deadline = deadline.min(Duration::from_millis(ms));
    }
    for i in [2, 3, 5] {
        let secs = text(i)
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0);
        if let Some(s) = secs {
            deadline = deadline.min(Duration::from_secs_f64(s.min(86_400.0)));
        }
    }
    let sdk_retry = text(4).and_then(|v| v.parse::<u32>().ok()).is_some_and(|n| n > 0);
    RetryTerms {
        max_attempts,
        deadline,
        sdk_retry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::validate::default_retry;
    use crate::retry::retry_after::HintSource;
    use crate::retry::Jitter;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    struct Case {
        policy: RetryPolicy,
        backoff: Backoff,
        budget: RetryBudget,
        rng: StdRng,
        now: Instant,
    }

    fn case(edit: impl FnOnce(&mut RetryPolicy)) -> Case {
        let mut policy = default_retry("t");
        policy.jitter = Jitter::None;
        policy.base_delay = Duration::from_millis(100);
        edit(&mut policy);
        let backoff = Backoff::try_new(policy.base_delay, policy.max_delay, policy.jitter).unwrap();
        let budget = RetryBudget::try_new(
            policy.budget_ratio,
            policy.budget_min_per_second,
            Duration::from_secs(10),
        )
        .unwrap();
        Case {
            policy,
            backoff,
            budget,
            rng: StdRng::seed_from_u64(7),
            now: crate::time::now(),
        }
    }

    impl Case {
        fn decide(
            &mut self,
            st: &mut RetryState,
            method: Method,
            outcome: Outcome,
            hint: Option<RetryHint>,
        ) -> Decision {
            st.attempts += 1;
            let rules = Rules {
                policy: &self.policy,
                backoff: &self.backoff,
                budget: &self.budget,
            };
            st.decide(rules, &method, Shown { outcome, hint }, self.now, &mut self.rng)
        }
    }

    fn status(s: u16) -> Outcome {
        Outcome::Status(StatusCode::from_u16(s).unwrap())
    }

    fn state(c: &Case) -> RetryState {
        RetryState::new(c.policy.max_attempts, c.now + Duration::from_secs(300))
    }

    #[test]
    fn classes() {
        assert_eq!(status(200).safety(), Safety::Final);
        assert_eq!(status(429).safety(), Safety::NotProcessed);
        assert_eq!(status(529).safety(), Safety::NotProcessed);
        assert_eq!(status(502).safety(), Safety::MaybeProcessed);
        assert_eq!(status(522).safety(), Safety::NotProcessed);
        assert_eq!(
            status(524).safety(),
            Safety::MaybeProcessed,
            "the origin took the request"
        );
        assert_eq!(Outcome::ConnectFailure.safety(), Safety::NotProcessed);
        assert_eq!(Outcome::Timeout.safety(), Safety::MaybeProcessed);
        assert_eq!(status(404).token(), None);
        assert!(!status(200).is_failure() && !status(304).is_failure() && status(400).is_failure());
        assert_eq!(status(503).label(), "status_5xx");
        assert_eq!(Outcome::RefusedStream.label(), "reset");
    }

    fn in_band(s: u16) -> Outcome {
        Outcome::InBand(StatusCode::from_u16(s).unwrap())
    }

    #[test]
    fn in_band_errors_count_as_the_status_they_stand_for() {
        for s in [529, 429, 500, 200] {
            assert_eq!(in_band(s).token(), status(s).token(), "{s}");
            assert_eq!(in_band(s).safety(), status(s).safety(), "{s}");
            assert!(in_band(s).is_failure(), "{s}");
            assert_eq!(in_band(s).label(), "stream_error");
        }
        assert!(in_band(429).is_rate_limited() && status(429).is_rate_limited());
        assert!(!in_band(529).is_rate_limited());

        // Retried per retry_on, as the equivalent status.
        let mut c = case(|p| p.retry_on.push(RetryOn::Status(529)));
        let mut st = state(&c);
        assert_eq!(
            c.decide(&mut st, Method::POST, in_band(529), None),
            Decision::Retry {
                wait: Duration::from_millis(100),
                source: WaitSource::Backoff,
                reason: RetryOn::Status(529)
            }
        );
        // A reset header is a hint for an in-band rate limit, as for a 429.
        let mut st = state(&c);
        assert!(matches!(
            c.decide(
                &mut st,
                Method::POST,
                in_band(429),
                hint(3.0, HintSource::OpenAiResetRequests)
            ),
            Decision::Retry {
                source: WaitSource::RetryAfter,
                ..
            }
        ));
        // An error type with no equivalent is delivered as it came.
        let mut st = state(&c);
        assert_eq!(
            c.decide(&mut st, Method::POST, in_band(200), None),
            Decision::Deliver(Stop::NotRetryable)
        );
        // Not named in retry_on: delivered.
        let mut c = case(|_| {});
        let mut st = state(&c);
        assert_eq!(
            c.decide(&mut st, Method::POST, in_band(529), None),
            Decision::Deliver(Stop::NotRetryable)
        );
    }

    #[test]
    fn success_and_permanent_failures_are_delivered() {
        let mut c = case(|_| {});
        let mut st = state(&c);
        for s in [200, 201, 400, 401, 403, 404, 409, 422] {
            let mut st2 = st.clone();
            let want = if s < 300 { Stop::Success } else { Stop::NotRetryable };
            assert_eq!(
                c.decide(&mut st2, Method::POST, status(s), None),
                Decision::Deliver(want),
                "{s}"
            );
        }
        // 529 is not in the default retry_on.
        assert_eq!(
            c.decide(&mut st, Method::POST, status(529), None),
            Decision::Deliver(Stop::NotRetryable)
        );
    }

    #[test]
    fn retries_until_attempts_are_used_up() {
        let mut c = case(|p| p.max_attempts = 3);
        let mut st = state(&c);
        let first = c.decide(&mut st, Method::POST, status(503), None);
        assert_eq!(
            first,
            Decision::Retry {
                wait: Duration::from_millis(100),
                source: WaitSource::Backoff,
                reason: RetryOn::Status(503)
            }
        );
        let second = c.decide(&mut st, Method::POST, status(503), None);
        assert_eq!(
            second,
            Decision::Retry {
                wait: Duration::from_millis(200),
                source: WaitSource::Backoff,
                reason: RetryOn::Status(503)
            }
        );
        assert_eq!(
            c.decide(&mut st, Method::POST, status(503), None),
            Decision::Deliver(Stop::Exhausted)
        );
    }

    #[test]
    fn retry_once_on_retries_once() {
        let mut c = case(|p| p.max_attempts = 5);
        let mut st = state(&c);
        assert!(matches!(
            c.decide(&mut st, Method::POST, status(500), None),
            Decision::Retry { .. }
        ));
        assert_eq!(
            c.decide(&mut st, Method::POST, status(500), None),
            Decision::Deliver(Stop::Exhausted)
        );
    }

    #[test]
    fn safe_only_replays_only_what_was_not_processed() {
        let mut c = case(|p| p.non_idempotent = NonIdempotent::SafeOnly);
        for (outcome, retried) in [
            (Outcome::Timeout, false),
            (Outcome::Reset, false),
            (status(502), false),
            (status(504), false),
            (status(503), true),
            (status(429), true),
            (Outcome::ConnectFailure, true),
            (Outcome::RefusedStream, true),
        ] {
            let mut st = state(&c);
            let d = c.decide(&mut st, Method::POST, outcome, None);
            assert_eq!(matches!(d, Decision::Retry { .. }), retried, "{outcome:?}: {d:?}");
            if !retried {
                assert_eq!(d, Decision::Deliver(Stop::UnsafeToReplay));
            }
            // Idempotent methods are replayed whatever happened.
            let mut st = state(&c);
            assert!(
                matches!(c.decide(&mut st, Method::GET, outcome, None), Decision::Retry { .. }),
                "{outcome:?}"
            );
        }
    }

    fn hint(secs: f64, source: HintSource) -> Option<RetryHint> {
        Some(RetryHint {
            delay: Duration::from_secs_f64(secs),
            source,
        })
    }

    #[test]
    fn retry_after_is_a_floor_with_upward_jitter() {
        let mut c = case(|_| {});
        let mut st = state(&c);
        match c.decide(&mut st, Method::POST, status(429), hint(2.0, HintSource::RetryAfter)) {
            Decision::Retry { wait, source, .. } => {
                assert_eq!(source, WaitSource::RetryAfter);
                assert!(
                    wait >= Duration::from_secs(2) && wait <= Duration::from_millis(2_310),
                    "{wait:?}"
                );
            }
            d => panic!("{d:?}"),
        }
        // A backoff longer than the hint wins.
        let mut c = case(|p| p.base_delay = Duration::from_secs(5));
        let mut st = state(&c);
        match c.decide(&mut st, Method::POST, status(503), hint(1.0, HintSource::RetryAfter)) {
            Decision::Retry { wait, source, .. } => {
                assert_eq!(source, WaitSource::Backoff);
                assert!(wait >= Duration::from_secs(5), "{wait:?}");
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn long_hints_and_deadlines_deliver_at_once() {
        let mut c = case(|p| p.max_retry_after = Duration::from_secs(60));
        let mut st = state(&c);
        assert_eq!(
            c.decide(&mut st, Method::POST, status(429), hint(120.0, HintSource::RetryAfter)),
            Decision::Deliver(Stop::HintTooLong)
        );
        let mut st = RetryState::new(3, c.now + Duration::from_secs(1));
        assert_eq!(
            c.decide(&mut st, Method::POST, status(429), hint(2.0, HintSource::RetryAfterMs)),
            Decision::Deliver(Stop::Deadline)
        );
        let mut st = RetryState::new(3, c.now + Duration::from_millis(50));
        assert_eq!(
            c.decide(&mut st, Method::POST, status(503), None),
            Decision::Deliver(Stop::Deadline)
        );
        // Ignored entirely when the policy says so.
        let mut c = case(|p| p.respect_retry_after = false);
        let mut st = state(&c);
        assert!(matches!(
            c.decide(&mut st, Method::POST, status(429), hint(120.0, HintSource::RetryAfter)),
            Decision::Retry {
                source: WaitSource::Backoff,
                ..
            }
        ));
    }

    #[test]
    fn reset_headers_count_only_on_a_429() {
        let mut c = case(|_| {});
        let mut st = state(&c);
        let d = c.decide(
            &mut st,
            Method::POST,
            status(503),
            hint(30.0, HintSource::OpenAiResetTokens),
        );
        assert_eq!(
            d,
            Decision::Retry {
                wait: Duration::from_millis(100),
                source: WaitSource::Backoff,
                reason: RetryOn::Status(503)
            }
        );
        let mut st = state(&c);
        assert!(matches!(
            c.decide(
                &mut st,
                Method::POST,
                status(429),
                hint(3.0, HintSource::OpenAiResetRequests)
            ),
            Decision::Retry {
                source: WaitSource::RetryAfter,
                ..
            }
        ));
    }

    #[test]
    fn retry_terms_only_tighten() {
        let p = default_retry("t");
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = http::HeaderMap::new();
            for (k, v) in pairs {
                m.append(*k, v.parse().unwrap());
            }
            m
        };
        let limits = |pairs: &[(&'static str, &'static str)]| retry_terms(&h(pairs), &p);
        assert_eq!(
            limits(&[]),
            RetryTerms {
                max_attempts: 3,
                deadline: Duration::from_secs(900),
                sdk_retry: false
            }
        );
        assert_eq!(limits(&[("x-rebound-max-attempts", "1")]).max_attempts, 1);
        assert_eq!(limits(&[("x-rebound-max-attempts", "9")]).max_attempts, 3);
        assert_eq!(limits(&[("x-rebound-max-attempts", "0")]).max_attempts, 1);
        assert_eq!(limits(&[("x-rebound-max-attempts", "x")]).max_attempts, 3);
        assert_eq!(limits(&[("x-rebound-max-attempts", " 2 ")]).max_attempts, 2);
        assert_eq!(
            limits(&[("x-rebound-deadline-ms", "1500")]).deadline,
            Duration::from_millis(1500)
        );
        assert_eq!(
            limits(&[("x-rebound-deadline-ms", "999999999")]).deadline,
            Duration::from_secs(900)
        );
        assert_eq!(
            limits(&[("x-stainless-timeout", "2.5")]).deadline,
            Duration::from_millis(2500)
        );
        assert_eq!(
            limits(&[("x-stainless-read-timeout", "600")]).deadline,
            Duration::from_secs(600)
        );
        assert_eq!(
            limits(&[("x-stainless-read-timeout", "60"), ("x-stainless-timeout", "NOT_GIVEN")]).deadline,
            Duration::from_secs(60)
        );
        assert_eq!(
            limits(&[("x-stainless-timeout", "-1")]).deadline,
            Duration::from_secs(900)
        );
        // The smallest of every limit given wins, whatever the order of the headers.
        let all = limits(&[
            ("x-stainless-timeout", "5"),
            ("content-type", "application/json"),
            ("x-rebound-deadline-ms", "4000"),
            ("x-stainless-read-timeout", "3"),
            ("x-rebound-max-attempts", "2"),
            ("x-stainless-retry-count", "1"),
        ]);
        assert_eq!(
            all,
            RetryTerms {
                max_attempts: 2,
                deadline: Duration::from_secs(3),
                sdk_retry: true
            }
        );
        // A repeated header counts by its first value, as `HeaderMap::get` reads it.
        assert_eq!(
            limits(&[("x-rebound-max-attempts", "2"), ("x-rebound-max-attempts", "1")]).max_attempts,
            2
        );
        assert_eq!(
            limits(&[("x-rebound-max-attempts", "x"), ("x-rebound-max-attempts", "1")]).max_attempts,
            3
        );
        // google-genai's own timeout, whole seconds.
        assert_eq!(limits(&[("x-server-timeout", "30")]).deadline, Duration::from_secs(30));
        assert_eq!(
            limits(&[("x-server-timeout", "30"), ("x-rebound-deadline-ms", "2000")]).deadline,
            Duration::from_secs(2)
        );
        assert_eq!(limits(&[("x-server-timeout", "0")]).deadline, Duration::from_secs(900));
        assert!(limits(&[("x-stainless-retry-count", "1")]).sdk_retry);
        assert!(!limits(&[("x-stainless-retry-count", "0")]).sdk_retry);
        assert!(!limits(&[("x-stainless-retry-count", "zero")]).sdk_retry);
    }

    #[test]
    fn budget_stops_retries() {
        let mut c = case(|p| {
            p.budget_ratio = 0.0;
            p.budget_min_per_second = 0;
        });
        let mut st = state(&c);
        assert_eq!(
            c.decide(&mut st, Method::POST, status(503), None),
            Decision::Deliver(Stop::BudgetExhausted)
        );
        let mut c = case(|p| {
            p.budget_ratio = 0.0;
            p.budget_min_per_second = 1; // 10 retries per 10 s window
        });
        let granted = (0..20)
            .filter(|_| {
                let mut st = state(&c);
                matches!(
                    c.decide(&mut st, Method::POST, status(503), None),
                    Decision::Retry { .. }
                )
            })
            .count();
        assert_eq!(granted, 10);
    }
}
