//! Retry policy: pure decisions about whether and when to try again.
//!
//! This module owns the arithmetic and the parsing that a retry loop needs, with no I/O, no clock
//! reads and no global randomness: the current time and the random number generator are always
//! parameters, so every decision is reproducible in a test.
//! - [`backoff`]: the delay before retry `n` (`[retry.NAME] base_delay`, `max_delay`, `jitter`)
//!   and the small upward jitter put on top of a server's Retry-After.
//! - [`retry_after`]: the server-directed delay of a response (`retry-after-ms`, `retry-after`
//!   per RFC 9110 §10.2.3, and the OpenAI and Anthropic rate-limit reset headers).
//! - [`budget`]: the per-route retry budget (`budget_ratio`, `budget_min_per_second`), a
//!   Linkerd/tower-style sliding window that caps how much retries add to a route's traffic.
//!
//! - [`client_retry`]: a client's own retry told apart from a new request (a repeat of a
//!   failure for good moments ago gets one attempt), so that layers add, not multiply.
//! - [`quota`]: a credential's request quota as a response reports it (what pacing reads).
//! - [`policy`]: which outcomes are retryable for which methods (`retry_on`, `retry_once_on`,
//!   `non_idempotent`), the request's deadline (shortened by `x-rebound-deadline-ms` and the
//!   SDK's `x-stainless-timeout`), and the decision after each attempt.
//!
//! It does not own: the retry loop itself, the classification of an attempt's transport failure,
//! the cooldown that a 429's hint triggers, metrics, or reading the clock; those belong to the
//! proxy pipeline, the upstream client and the circuit/cooldown modules, which call in here.
//!
//! How the pieces combine for one retry (docs/retries.md):
//! 1. the attempt failed in a retryable way; [`RetryBudget::withdraw`] must say yes;
//! 2. `backoff = Backoff::delay(n, prev, rng)`;
//! 3. when `respect_retry_after` and [`parse_hint`] finds a hint: a hint over `max_retry_after`
//!    or past the deadline means no retry (the response goes back as it came); otherwise wait
//!    `max(backoff, hint) + retry_after_jitter(hint, rng)`, and pass `prev = None` to the next
//!    `delay` call (a server-directed wait resets decorrelated jitter).

pub mod backoff;
pub mod budget;
pub(crate) mod client_retry;
pub(crate) mod failover;
pub mod policy;
pub(crate) mod provider_error;
pub mod quota;
pub mod retry_after;

pub use backoff::Jitter;

pub(crate) use backoff::Backoff;
pub(crate) use budget::RetryBudget;
pub(crate) use quota::requests_quota;
pub use retry_after::RetryHint;
pub use retry_after::{parse_hint, HintSource};
