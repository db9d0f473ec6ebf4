//! The series each configuration gives every family from the start (`Metrics::init_series`), so
//! that `rate()`, `increase()` and `absent()` work before the first event.

use crate::config::{Config, CooldownMode, PacingMode};
use crate::words::{spelled, Stop, TargetState};

use prometheus::{Histogram, IntCounter};

use super::{CacheResult, CompletionResult, IdempotencyResult, Metrics, StreamErrorPosition, TokenOutcome};

impl Metrics {
    /// Creates, at 0, every labelled series whose labels the config determines, so that `rate()`,
    /// `increase()` and `absent()` work before the first failure and a dashboard has data on day
    /// one. Called for each configuration loaded (a reload adds the series of new routes and
    /// upstreams); a series that exists already keeps its value.
    pub(crate) fn init_series(&self, config: &Config) {
        if config.telemetry.otlp_endpoint.is_some() {
            for result in ["exported", "dropped", "failed"] {
                self.trace_spans_total.with_label_values(&[result]);
            }
        }
        for (name, u) in &config.upstreams {
            if let Some(mode) = u.concurrency {
                self.init_concurrency(name, mode, config);
            }
            if u.circuit.is_some() {
                self.circuit_state.with_label_values(&[name]);
                self.circuit_rejections_total.with_label_values(&[name]);
                for to in ["closed", "half_open", "open"] {
                    self.circuit_transitions_total.with_label_values(&[name, to]);
                }
            }
            for model in config.metrics.models.iter().map(String::as_str).chain(["other"]) {
                if u.cooldown != CooldownMode::Off {
                    self.cooldown_rejections_total.with_label_values(&[name, model]);
                }
                if u.pacing != PacingMode::Off {
                    self.pacing_waits_total.with_label_values(&[name, model]);
                }
            }
        }
        for r in &config.routes {
            let route = r.name.as_str();
            // The success series: other codes appear with their first answer.
            self.requests_total.with_label_values(&[route, "200"]);
            for upstream in r.upstreams() {
                for position in StreamErrorPosition::NAMES {
                    self.stream_errors_total.with_label_values(&[route, upstream, position]);
                }
                // Input and output per model label: the cache kinds appear with the first
                // provider that reports them (most routes never see one).
                for model in config.metrics.models.iter().map(String::as_str).chain(["other"]) {
                    for kind in ["input", "output"] {
                        for outcome in TokenOutcome::NAMES {
                            self.tokens_total
                                .with_label_values(&[route, upstream, model, kind, outcome]);
                        }
                    }
                }
            }
            if let Some(policy) = r.retry.as_ref().and_then(|p| config.retry.get(p)) {
                self.init_retry_series(route, policy);
            }
            if r.cache.is_some() {
                for result in CacheResult::NAMES {
                    self.cache_requests_total.with_label_values(&[route, result]);
                }
                for model in config.metrics.models.iter().map(String::as_str).chain(["other"]) {
                    for kind in ["input", "output"] {
                        self.cache_tokens_saved_total.with_label_values(&[route, model, kind]);
                    }
                }
            }
            if r.idempotency.is_some() {
                for result in IdempotencyResult::NAMES {
                    self.idempotency_requests_total.with_label_values(&[route, result]);
                }
                for result in CompletionResult::NAMES {
                    self.idempotency_completions_total.with_label_values(&[route, result]);
                }
                self.idempotency_takeovers_total.with_label_values(&[route]);
            }
            for upstream in r.upstreams() {
                for state in TargetState::ALL.map(TargetState::as_str) {
                    self.target_state.with_label_values(&[route, upstream, state]);
                }
            }
            for from in r.upstreams() {
                for to in r.upstreams().filter(|to| *to != from) {
                    for reason in r.failover_on.iter() {
                        self.failovers_total
                            .with_label_values(&[route, from, to, reason.as_str()]);
                    }
                }
            }
            if r.dead_letters {
                for reason in Stop::DEAD_LETTER.map(Stop::as_str) {
                    self.dead_letters_total.with_label_values(&[route, reason]);
                }
            }
        }
        for (name, u) in &config.upstreams {
            if u.auth != crate::config::Auth::Static {
                for result in ["ok", "error"] {
                    self.credential_refreshes_total.with_label_values(&[name, result]);
                }
                self.credential_expiry_seconds.with_label_values(&[name]);
            }
        }
        self.init_limit_series(config);
        self.init_continuation_series(config);
        if config.redis.is_some() {
            self.redis_errors_total.with_label_values(&["ping"]);
            self.redis_errors_total.with_label_values(&["connect"]);
        }
    }

    /// The series of a route that retries under `policy`.
    fn init_retry_series(&self, route: &str, policy: &crate::config::RetryPolicy) {
        for reason in policy.retry_on.iter().chain(&policy.retry_once_on) {
            self.retries_total.with_label_values(&[route, &reason.to_string()]);
        }
        for source in ["backoff", "retry_after"] {
            self.retry_wait_seconds.with_label_values(&[route, source]);
        }
        self.retries_exhausted_total.with_label_values(&[route]);
        self.retry_budget_exhausted_total.with_label_values(&[route]);
        self.client_retries_total.with_label_values(&[route]);
    }

    /// The series of each route that continues cut streams.
    fn init_continuation_series(&self, config: &Config) {
        for r in config.routes.iter().filter(|r| r.continue_streams) {
            for result in ["continued", "refused_tool_call", "refused_thinking", "failed"] {
                self.continuations_total.with_label_values(&[&r.name, result]);
            }
        }
    }

    /// The series of each `[limits.*]`.
    fn init_limit_series(&self, config: &Config) {
        for (name, l) in &config.limits {
            for result in LimitResult::NAMES {
                self.limit_decisions_total.with_label_values(&[name, result]);
            }
            self.limit_queue_seconds.with_label_values(&[name]);
            if l.tokens_per_minute.is_some() {
                for kind in LimitTokenKind::NAMES {
                    self.limit_tokens_total.with_label_values(&[name, kind]);
                }
            }
        }
    }
}

/// The `result` label of `rebound_limit_decisions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LimitResult {
    Admitted,
    Queued,
    Rejected,
}

spelled!(LimitResult { "admitted" => Admitted, "queued" => Queued, "rejected" => Rejected });

/// The `kind` label of `rebound_limit_tokens_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LimitTokenKind {
    Reserved,
    Settled,
}

spelled!(LimitTokenKind { "reserved" => Reserved, "settled" => Settled });

/// One `[limits.NAME]`'s children of the limit families, resolved once: a decision hashes no
/// labels.
pub(crate) struct LimitMetrics {
    /// By result, in the order of [`LimitResult::ALL`].
    decisions: [IntCounter; LimitResult::ALL.len()],
    pub(crate) queue_seconds: Histogram,
    pub(crate) reserved: IntCounter,
    pub(crate) settled: IntCounter,
}

impl LimitMetrics {
    pub(crate) fn new(m: &Metrics, limit: &str) -> LimitMetrics {
        let [reserved, settled] = LimitTokenKind::NAMES.map(|k| m.limit_tokens_total.with_label_values(&[limit, k]));
        LimitMetrics {
            decisions: LimitResult::NAMES.map(|r| m.limit_decisions_total.with_label_values(&[limit, r])),
            queue_seconds: m.limit_queue_seconds.with_label_values(&[limit]),
            reserved,
            settled,
        }
    }

    /// Counts a decision.
    pub(crate) fn decided(&self, result: LimitResult) {
        self.decisions[result as usize].inc();
    }
}
