//! Every metric rebound exports, defined once, on a registry the app owns (never a global, so that
//! tests running several instances in one process read their own counts).
//!
//! Labels are bounded: route and upstream names from the config, outcomes and codes from fixed
//! sets. No label ever holds a path, a key or a credential.

mod concurrency;
mod samples;
mod series;

pub(crate) use concurrency::{ConcurrencySeries, ScopeSeries};
pub(crate) use samples::Sample;
pub(crate) use series::{LimitMetrics, LimitResult};

use prometheus::core::Collector;

use crate::words::{spelled, AttemptOutcome};
use parking_lot::Mutex;
use std::cell::RefCell;
use std::sync::Arc;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Request-latency buckets (seconds): sub-millisecond proxy errors up to generations as long as
/// the default limits allow (600 s per try, 900 s in all).
const REQUEST_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0,
];

/// Redis command buckets (seconds).
const REDIS_BUCKETS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

/// Retry-wait buckets (seconds).
const WAIT_BUCKETS: &[f64] = &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0];

/// Token-count buckets of `gen_ai_client_token_usage` (the OpenTelemetry GenAI advice).
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0,
    67108864.0,
];

/// Operation-duration buckets of `gen_ai_client_operation_duration_seconds` (the OpenTelemetry
/// GenAI advice).
const OPERATION_BUCKETS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// Where a family is registered: the registry, the names exported so far, the names' prefix.
type Registered<'a> = (&'a Registry, &'a RefCell<Vec<String>>, &'a str);

/// Registers `metric` and hands it back: a family cannot be defined without being exported. Its
/// name is noted in `names` (a registry lists only the families that have samples).
fn reg<M: Collector + Clone + 'static>(
    (registry, names, prefix): Registered<'_>,
    metric: M,
) -> Result<M, prometheus::Error> {
    registry.register(Box::new(metric.clone()))?;
    names
        .borrow_mut()
        .extend(metric.desc().iter().map(|d| format!("{prefix}{}", d.fq_name)));
    Ok(metric)
}

/// The metric families, with handles for the components that record them.
pub struct Metrics {
    registry: Registry,
    /// The name of every family, as exported.
    names: Vec<String>,
    /// The OpenTelemetry GenAI families, whose names carry no `rebound_` prefix.
    gen_ai: Registry,
    /// Requests answered, by route and status code (`route="none"` when no route matched).
    pub(crate) requests_total: IntCounterVec,
    /// From request head to the end of the response body, by route.
    pub(crate) request_duration_seconds: HistogramVec,
    /// Requests whose response has not ended yet (streams included).
    pub(crate) inflight_requests: IntGauge,
    /// Client connections open, by the worker serving them (src/workers.rs).
    pub(crate) client_connections: IntGaugeVec,
    /// Upstream attempts by route, upstream and outcome (`ok`, `status_4xx`, `status_429`,
    /// `status_5xx`, `connect_failure`, `reset`, `timeout`, `stream_error`).
    pub(crate) upstream_attempts_total: IntCounterVec,
    /// Errors reported inside a 2xx body, by route, upstream and position: `first_event` (the
    /// first SSE event or the JSON body, seen before anything was forwarded: the attempt's outcome
    /// is `stream_error`) or `mid_stream` (after bytes went to the app: passed through).
    pub(crate) stream_errors_total: IntCounterVec,
    /// From sending an attempt to its response head, by upstream.
    pub(crate) upstream_attempt_duration_seconds: HistogramVec,
    /// Retries by route and reason (the `retry_on` entry that matched: `503`, `timeout`, ...).
    pub(crate) retries_total: IntCounterVec,
    /// Waits before retries, by route and source (`backoff` or `retry_after`).
    pub(crate) retry_wait_seconds: HistogramVec,
    /// Requests whose failure was delivered because their attempts were used up.
    pub(crate) retries_exhausted_total: IntCounterVec,
    /// Retries refused because the route's retry budget was spent.
    pub(crate) retry_budget_exhausted_total: IntCounterVec,
    /// Requests taken as a client's own retry of a failure for good (one attempt each).
    pub(crate) client_retries_total: IntCounterVec,
    /// Admission decisions of each `[limits.*]`: `admitted`, `queued` (waited, then admitted),
    /// `rejected`.
    pub(crate) limit_decisions_total: IntCounterVec,
    pub(crate) continuations_total: IntCounterVec,
    /// How long requests waited for a limit before their decision.
    pub(crate) limit_queue_seconds: HistogramVec,
    /// Tokens of each limit: `reserved` on admission, `settled` from the usage reported.
    pub(crate) limit_tokens_total: IntCounterVec,
    /// Idempotency outcomes by route and result (`stored`, `replayed`, `conflict`, `mismatch`,
    /// `invalid`, `store_error`, `not_stored`).
    pub(crate) idempotency_requests_total: IntCounterVec,
    /// Completions of delivered responses that did not land at the first write, by route and
    /// result: `late` (written after the store failed to answer; duplicates meanwhile answered
    /// from the replica that held the response) or `lost` (never written: a retry with the key
    /// may run again).
    pub(crate) idempotency_completions_total: IntCounterVec,
    /// Delivered responses held by this replica until their completion is written.
    pub(crate) idempotency_completions_pending: IntGauge,
    /// Keys in progress under the claim of a replica that died (no heartbeat for `[redis]
    /// liveness`), taken over by a new request with the key instead of waiting for the lease.
    pub(crate) idempotency_takeovers_total: IntCounterVec,
    pub(crate) failovers_total: IntCounterVec,
    /// Trace spans by what became of them (`exported`; `dropped`: the export queue was full;
    /// `failed`: the collector did not take them).
    pub(crate) trace_spans_total: IntCounterVec,
    /// Redis command latency by operation.
    pub redis_command_duration_seconds: HistogramVec,
    /// Requests recorded as dead letters, by route and reason.
    pub(crate) dead_letters_total: IntCounterVec,
    /// Dead letters held (this process's ring, or the fleet's stream).
    pub(crate) dead_letters_depth: IntGauge,
    /// Response-cache lookups by route and result (`hit`, `miss`, `refresh`, `bypass`,
    /// `store_error`).
    pub(crate) cache_requests_total: IntCounterVec,
    /// The usage of the stored responses served by hits, by route, model and kind.
    pub(crate) cache_tokens_saved_total: IntCounterVec,
    /// Response-cache entries held in memory (0 with Redis), and their body bytes.
    pub(crate) cache_entries: IntGauge,
    pub(crate) cache_bytes: IntGauge,
    /// Async jobs by route and status: `queued`, `deduplicated` (the same Idempotency-Key
    /// again), `rejected` (queue full or store down), `succeeded`, `failed`.
    pub(crate) jobs_total: IntCounterVec,
    /// Unfinished jobs, queued or running (the fleet's with Redis, this process's without).
    pub(crate) jobs_queue_depth: IntGauge,
    /// Jobs taken over from a worker that stopped heartbeating (visibility timeout).
    pub(crate) jobs_reclaimed_total: IntCounter,
    /// Configuration reloads by result (`success`, `failure`).
    pub(crate) config_reloads_total: IntCounterVec,
    /// Circuit state by upstream: 0 closed, 1 half-open, 2 open (upstreams with a breaker).
    pub(crate) circuit_state: IntGaugeVec,
    pub(crate) target_state: IntGaugeVec,
    /// Circuit state changes by upstream and new state (`closed`, `half_open`, `open`).
    pub(crate) circuit_transitions_total: IntCounterVec,
    /// Attempts refused by an open (or probing) circuit, by upstream.
    pub(crate) circuit_rejections_total: IntCounterVec,
    /// Requests answered 429 `cooldown` (a provider rate limit still in force), by upstream.
    pub(crate) cooldown_rejections_total: IntCounterVec,
    /// Tokens by route, upstream, model (`[metrics] models`, else `other`), kind (`input`,
    /// `output`, `cache_read`, `cache_write`) and outcome (`delivered`, `wasted`: the attempt's
    /// response did not reach the app whole).
    pub(crate) tokens_total: IntCounterVec,
    /// Requests held until a credential's request quota reset (pacing), by upstream.
    pub(crate) pacing_waits_total: IntCounterVec,
    /// `gen_ai_client_token_usage`: tokens per upstream attempt that reported usage, by
    /// `gen_ai_token_type` (`input`, cached included; `output`), `gen_ai_request_model` and
    /// `gen_ai_provider_name`.
    pub(crate) gen_ai_client_token_usage: HistogramVec,
    /// `gen_ai_client_operation_duration_seconds`: from sending an attempt to the end of its
    /// response body, for attempts whose body was metered.
    pub(crate) gen_ai_client_operation_duration_seconds: HistogramVec,
    /// Redis command failures by operation.
    pub redis_errors_total: IntCounterVec,
    /// 1 while the Redis connection answers its health check, 0 otherwise (and 0 without `[redis]`).
    pub(crate) redis_up: IntGauge,
    /// Always 1, labelled with the version.
    pub(crate) build_info: IntGaugeVec,
    /// Cloud credential fetches by upstream and result (`ok`, `error`).
    pub(crate) credential_refreshes_total: IntCounterVec,
    /// Seconds left on the cloud credential held, by upstream, as of the scrape.
    pub(crate) credential_expiry_seconds: prometheus::GaugeVec,
    /// The upstreams' `concurrency` limits.
    pub(crate) concurrency: concurrency::ConcurrencyFamilies,
}

impl Metrics {
    /// Creates every family on a fresh registry.
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new_custom(Some("rebound".into()), None)?;
        let gen_ai = Registry::new();
        let names = RefCell::new(Vec::new());
        let r = (&registry, &names, "rebound_");
        let g = (&gen_ai, &names, "");
        let counter =
            |name: &str, help: &str, labels: &[&str]| reg(r, IntCounterVec::new(Opts::new(name, help), labels)?);
        let histogram = |name: &str, help: &str, labels: &[&str], buckets: &[f64]| {
            reg(
                r,
                HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels)?,
            )
        };
        let m = Metrics {
            tokens_total: counter(
                "tokens_total",
                "Tokens by route, upstream, model, kind (input, output, cache_read, cache_write) and outcome (delivered, wasted).",
                &["route", "upstream", "model", "kind", "outcome"],
            )?,
            pacing_waits_total: counter(
                "pacing_waits_total",
                "Requests held until a credential's request quota reset, by upstream and model ([metrics] models, else other).",
                &["upstream", "model"],
            )?,
            gen_ai_client_token_usage: reg(
                g,
                HistogramVec::new(
                    HistogramOpts::new("gen_ai_client_token_usage", "Tokens used per upstream attempt (OpenTelemetry GenAI).")
                        .buckets(TOKEN_BUCKETS.to_vec()),
                    &["gen_ai_token_type", "gen_ai_request_model", "gen_ai_provider_name"],
                )?,
            )?,
            gen_ai_client_operation_duration_seconds: reg(
                g,
                HistogramVec::new(
                    HistogramOpts::new(
                        "gen_ai_client_operation_duration_seconds",
                        "Upstream attempt duration to the end of its body (OpenTelemetry GenAI).",
                    )
                    .buckets(OPERATION_BUCKETS.to_vec()),
                    &["gen_ai_request_model", "gen_ai_provider_name"],
                )?,
            )?,
            requests_total: counter(
                "requests_total",
                "Requests answered, by route and status code.",
                &["route", "code"],
            )?,
            request_duration_seconds: histogram(
                "request_duration_seconds",
                "Time from request head to the end of the response body, by route.",
                &["route"],
                REQUEST_BUCKETS,
            )?,
            inflight_requests: reg(
                r,
                IntGauge::new("inflight_requests", "Requests whose response has not ended yet.")?,
            )?,
            client_connections: reg(
                r,
                IntGaugeVec::new(
                    Opts::new("client_connections", "Client connections open, by the worker serving them."),
                    &["worker"],
                )?,
            )?,
            upstream_attempts_total: counter(
                "upstream_attempts_total",
                "Upstream attempts by route, upstream and outcome.",
                &["route", "upstream", "outcome"],
            )?,
            stream_errors_total: counter(
                "stream_errors_total",
                "Errors reported inside a 2xx body, by route, upstream and position (first_event, mid_stream).",
                &["route", "upstream", "position"],
            )?,
            upstream_attempt_duration_seconds: histogram(
                "upstream_attempt_duration_seconds",
                "Time from sending an attempt to its response head, by upstream.",
                &["upstream"],
                REQUEST_BUCKETS,
            )?,
            retries_total: counter(
                "retries_total",
                "Retries by route and reason (the retry_on entry that matched).",
                &["route", "reason"],
            )?,
            retry_wait_seconds: histogram(
                "retry_wait_seconds",
                "Waits before retries, by route and source (backoff, retry_after).",
                &["route", "source"],
                WAIT_BUCKETS,
            )?,
            retries_exhausted_total: counter(
                "retries_exhausted_total",
                "Failures delivered because the attempts were used up.",
                &["route"],
            )?,
            retry_budget_exhausted_total: counter(
                "retry_budget_exhausted_total",
                "Retries refused because the route's retry budget was spent.",
                &["route"],
            )?,
            client_retries_total: counter(
                "client_retries_total",
                "Requests that repeated a failure for good moments ago: a client's retry, given one attempt.",
                &["route"],
            )?,
            continuations_total: counter(
                "continuations_total",
                "Streams cut after bytes reached the app on a continue_streams route, by route and result (continued, refused_tool_call, refused_thinking, failed).",
                &["route", "result"],
            )?,
            limit_decisions_total: counter(
                "limit_decisions_total",
                "Admission decisions by limit and result (admitted, queued, rejected).",
                &["limit", "result"],
            )?,
            limit_queue_seconds: histogram(
                "limit_queue_seconds",
                "Time requests waited for a limit before their decision.",
                &["limit"],
                WAIT_BUCKETS,
            )?,
            limit_tokens_total: counter(
                "limit_tokens_total",
                "Tokens by limit and kind: reserved on admission, settled from the reported usage.",
                &["limit", "kind"],
            )?,
            idempotency_requests_total: counter(
                "idempotency_requests_total",
                "Idempotency outcomes by route and result.",
                &["route", "result"],
            )?,
            idempotency_completions_total: counter(
                "idempotency_completions_total",
                "Completions of delivered responses not written at the first try, by route and result (late, lost).",
                &["route", "result"],
            )?,
            idempotency_takeovers_total: counter(
                "idempotency_takeovers_total",
                "Keys in progress under the claim of a dead replica (no heartbeat for [redis] liveness), taken over by a new request with the key.",
                &["route"],
            )?,
            failovers_total: counter(
                "failovers_total",
                "Requests moved from one target of their route to another, by route, from, to and reason (circuit_open, cooldown, exhausted, overloaded, first_byte_timeout, retries_exhausted, context_length).",
                &["route", "from", "to", "reason"],
            )?,
            idempotency_completions_pending: reg(
                r,
                IntGauge::new(
                    "idempotency_completions_pending",
                    "Delivered responses held by this replica until their completion is written.",
                )?,
            )?,
            trace_spans_total: counter(
                "trace_spans_total",
                "Trace spans by result (exported, dropped: export queue full, failed: collector error).",
                &["result"],
            )?,
            redis_command_duration_seconds: histogram(
                "redis_command_duration_seconds",
                "Redis command latency by operation.",
                &["op"],
                REDIS_BUCKETS,
            )?,
            dead_letters_total: counter(
                "dead_letters_total",
                "Requests recorded as dead letters, by route and reason.",
                &["route", "reason"],
            )?,
            dead_letters_depth: reg(r, IntGauge::new("dead_letters_depth", "Dead letters held.")?)?,
            cache_requests_total: counter(
                "cache_requests_total",
                "Response-cache lookups by route and result (hit, miss, refresh, bypass, store_error).",
                &["route", "result"],
            )?,
            cache_tokens_saved_total: counter(
                "cache_tokens_saved_total",
                "Tokens of the stored responses served from the cache, by route, model and kind.",
                &["route", "model", "kind"],
            )?,
            cache_entries: reg(
                r,
                IntGauge::new("cache_entries", "Response-cache entries held in memory (0 with Redis).")?,
            )?,
            cache_bytes: reg(
                r,
                IntGauge::new("cache_bytes", "Body bytes of the response-cache entries held in memory.")?,
            )?,
            jobs_total: counter("jobs_total", "Async jobs by route and status.", &["route", "status"])?,
            jobs_queue_depth: reg(
                r,
                IntGauge::new("jobs_queue_depth", "Unfinished async jobs (queued or running).")?,
            )?,
            jobs_reclaimed_total: reg(
                r,
                IntCounter::new(
                    "jobs_reclaimed_total",
                    "Async jobs reclaimed from a worker that stopped heartbeating.",
                )?,
            )?,
            config_reloads_total: counter("config_reloads_total", "Configuration reloads by result.", &["result"])?,
            credential_refreshes_total: counter(
                "credential_refreshes_total",
                "Cloud credential fetches (auth = aws, gcp, azure) by upstream and result (ok, error).",
                &["upstream", "result"],
            )?,
            credential_expiry_seconds: reg(
                r,
                prometheus::GaugeVec::new(
                    Opts::new(
                        "credential_expiry_seconds",
                        "Seconds left on the cloud credential held for each upstream with auth = aws, gcp or azure, as of the scrape (0: expired or none held).",
                    ),
                    &["upstream"],
                )?,
            )?,
            target_state: reg(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "target_state",
                        "1 for the current state of each target of each route (available, cooling, paced, exhausted, open), as of the scrape; cooling, paced and exhausted for the credential the sidecar sets with set_headers (cooling and paced for any model of [metrics] models or of the target's models).",
                    ),
                    &["route", "upstream", "state"],
                )?,
            )?,
            circuit_state: reg(
                r,
                IntGaugeVec::new(
                    Opts::new("circuit_state", "Circuit state: 0 closed, 1 half-open, 2 open."),
                    &["upstream"],
                )?,
            )?,
            circuit_transitions_total: counter(
                "circuit_transitions_total",
                "Circuit state changes by upstream and new state.",
                &["upstream", "to"],
            )?,
            circuit_rejections_total: counter(
                "circuit_rejections_total",
                "Attempts refused by an open circuit, by upstream.",
                &["upstream"],
            )?,
            cooldown_rejections_total: counter(
                "cooldown_rejections_total",
                "Requests refused because a provider rate limit is still in force, by upstream and model ([metrics] models, else other).",
                &["upstream", "model"],
            )?,
            redis_errors_total: counter("redis_errors_total", "Redis command failures by operation.", &["op"])?,
            redis_up: reg(
                r,
                IntGauge::new("redis_up", "1 while Redis answers the health check, else 0.")?,
            )?,
            build_info: reg(
                r,
                IntGaugeVec::new(Opts::new("build_info", "Build information; always 1."), &["version"])?,
            )?,
            concurrency: concurrency::ConcurrencyFamilies::new(r)?,
            registry,
            gen_ai,
            names: names.into_inner(),
        };
        m.build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        // Present from the start, so that the first failed reload is a visible increase.
        for result in ["success", "failure"] {
            m.config_reloads_total.with_label_values(&[result]);
        }
        Ok(m)
    }

    /// The name of every family rebound exports, whether or not it has samples yet.
    pub fn family_names(&self) -> &[String] {
        &self.names
    }

    /// The Prometheus text exposition of every family.
    pub(crate) fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 * 1024);
        // Encoding into a Vec cannot fail for well-formed families; an error leaves a partial page.
        let mut families = self.registry.gather();
        families.extend(self.gen_ai.gather());
        let _ = TextEncoder::new().encode(&families, &mut out);
        out
    }
}

/// The `result` label of `rebound_cache_requests_total`: the `x-rebound-cache` values, and
/// `store_error` (the store could not be read or written: forwarded, answered `miss`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CacheResult {
    Hit,
    Miss,
    Refresh,
    Bypass,
    StoreError,
}

spelled!(CacheResult {
    "hit" => Hit,
    "miss" => Miss,
    "refresh" => Refresh,
    "bypass" => Bypass,
    "store_error" => StoreError,
});

/// The `result` label of `rebound_idempotency_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdempotencyResult {
    Stored,
    Replayed,
    Followed,
    Conflict,
    Mismatch,
    Invalid,
    StoreError,
    NotStored,
}

spelled!(IdempotencyResult {
    "stored" => Stored,
    "replayed" => Replayed,
    "followed" => Followed,
    "conflict" => Conflict,
    "mismatch" => Mismatch,
    "invalid" => Invalid,
    "store_error" => StoreError,
    "not_stored" => NotStored,
});

/// The `result` label of `rebound_idempotency_completions_total`: completions written late, and
/// lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CompletionResult {
    Late,
    Lost,
}

spelled!(CompletionResult { "late" => Late, "lost" => Lost });

/// The `position` label of `rebound_stream_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamErrorPosition {
    FirstEvent,
    MidStream,
}

spelled!(StreamErrorPosition { "first_event" => FirstEvent, "mid_stream" => MidStream });

/// One route's children of the request families, resolved once: the hot path hashes no labels.
pub(crate) struct RouteMetrics {
    pub route: Arc<str>,
    requests_total: IntCounterVec,
    duration: Histogram,
    /// Per status code, created on first use (a route sees a handful of codes).
    codes: Mutex<Vec<(u16, IntCounter)>>,
}

impl RouteMetrics {
    pub(crate) fn new(m: &Metrics, route: &str) -> RouteMetrics {
        RouteMetrics {
            route: Arc::from(route),
            requests_total: m.requests_total.clone(),
            duration: m.request_duration_seconds.with_label_values(&[route]),
            codes: Mutex::new(Vec::new()),
        }
    }

    /// Counts a response with this status.
    pub(crate) fn count(&self, status: u16) {
        let mut codes = self.codes.lock();
        if let Some((_, c)) = codes.iter().find(|(s, _)| *s == status) {
            c.inc();
            return;
        }
        let c = self
            .requests_total
            .with_label_values(&[&*self.route, &status.to_string()]);
        c.inc();
        codes.push((status, c));
    }

    /// Observes a request's duration.
    pub(crate) fn observe(&self, seconds: f64) {
        self.duration.observe(seconds);
    }
}

/// One route's children of a `{route, LABEL}` counter family, resolved once for the labels it
/// takes: counting one of them hashes nothing (a label lookup hashes every value, every call).
pub(crate) struct RouteCounters {
    children: Vec<(&'static str, IntCounter)>,
    family: IntCounterVec,
    route: Arc<str>,
}

impl RouteCounters {
    pub(crate) fn new(family: &IntCounterVec, route: &str, labels: &[&'static str]) -> RouteCounters {
        RouteCounters {
            children: labels
                .iter()
                .map(|l| (*l, family.with_label_values(&[route, l])))
                .collect(),
            family: family.clone(),
            route: Arc::from(route),
        }
    }

    /// Counts one `label` (a label outside the resolved set is looked up).
    pub(crate) fn inc(&self, label: &str) {
        match self.children.iter().find(|(l, _)| *l == label) {
            Some((_, c)) => c.inc(),
            None => self.family.with_label_values(&[&*self.route, label]).inc(),
        }
    }
}

/// The children of the attempt families for one (route, upstream) pair, resolved once.
pub(crate) struct AttemptMetrics {
    by_outcome: [IntCounter; AttemptOutcome::ALL.len()],
    pub(crate) duration: Histogram,
    /// `rebound_stream_errors_total{position="first_event"}`.
    pub(crate) first_event_errors: IntCounter,
    /// `rebound_stream_errors_total{position="mid_stream"}`.
    pub(crate) mid_stream_errors: IntCounter,
}

impl AttemptMetrics {
    pub(crate) fn new(m: &Metrics, route: &str, upstream: &str) -> AttemptMetrics {
        let [first_event_errors, mid_stream_errors] =
            StreamErrorPosition::NAMES.map(|p| m.stream_errors_total.with_label_values(&[route, upstream, p]));
        AttemptMetrics {
            by_outcome: AttemptOutcome::ALL.map(|o| {
                m.upstream_attempts_total
                    .with_label_values(&[route, upstream, o.as_str()])
            }),
            duration: m.upstream_attempt_duration_seconds.with_label_values(&[upstream]),
            first_event_errors,
            mid_stream_errors,
        }
    }

    /// Counts an attempt by its outcome.
    pub(crate) fn count(&self, outcome: AttemptOutcome) {
        // `ALL` is in declaration order (a test in `words` keeps it so).
        if let Some(c) = self.by_outcome.get(outcome as usize) {
            c.inc();
        }
    }
}

/// The `outcome` label of `rebound_tokens_total` (and of an attempt's usage in the access log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenOutcome {
    Delivered,
    Wasted,
}

spelled!(TokenOutcome { "delivered" => Delivered, "wasted" => Wasted });

/// The `kind` label of `rebound_tokens_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenKind {
    Input,
    Output,
    CacheRead,
    CacheWrite,
}

spelled!(TokenKind {
    "input" => Input,
    "output" => Output,
    "cache_read" => CacheRead,
    "cache_write" => CacheWrite,
});

/// One model's children of the token families for one (route, upstream) pair.
struct ModelChildren {
    model: Arc<str>,
    /// By outcome, then kind (the orders of [`TokenOutcome::ALL`] and [`TokenKind::ALL`]).
    tokens: [[IntCounter; 4]; 2],
    /// `input`, `output`.
    usage: [Histogram; 2],
    duration: Histogram,
}

/// The token families for one (route, upstream) pair: children resolved once per model label
/// (a handful: the configured models and `other`), so that an attempt hashes no labels.
pub(crate) struct TokenMetrics {
    route: Arc<str>,
    upstream: Arc<str>,
    provider: Arc<str>,
    tokens_total: IntCounterVec,
    usage: HistogramVec,
    duration: HistogramVec,
    by_model: Mutex<Vec<Arc<ModelChildren>>>,
}

impl TokenMetrics {
    /// `provider` is the `gen_ai_provider_name` of the upstream.
    pub(crate) fn new(m: &Metrics, route: &str, upstream: &str, provider: &str) -> TokenMetrics {
        TokenMetrics {
            route: Arc::from(route),
            upstream: Arc::from(upstream),
            provider: Arc::from(provider),
            tokens_total: m.tokens_total.clone(),
            usage: m.gen_ai_client_token_usage.clone(),
            duration: m.gen_ai_client_operation_duration_seconds.clone(),
            by_model: Mutex::new(Vec::new()),
        }
    }

    fn children(&self, model: &Arc<str>) -> Arc<ModelChildren> {
        let mut by_model = self.by_model.lock();
        if let Some(c) = by_model.iter().find(|c| c.model == *model) {
            return c.clone();
        }
        let (route, upstream, provider) = (&*self.route, &*self.upstream, &*self.provider);
        let c = Arc::new(ModelChildren {
            model: model.clone(),
            tokens: TokenOutcome::NAMES.map(|outcome| {
                TokenKind::NAMES.map(|kind| {
                    self.tokens_total
                        .with_label_values(&[route, upstream, model, kind, outcome])
                })
            }),
            usage: ["input", "output"].map(|t| self.usage.with_label_values(&[t, model, provider])),
            duration: self.duration.with_label_values(&[model, provider]),
        });
        by_model.push(c.clone());
        c
    }

    /// Records one attempt: its token counts (in [`TokenKind::ALL`] order; `None` when the
    /// response reported none), whether they were wasted, and its duration.
    pub(crate) fn record(&self, model: &Arc<str>, kinds: Option<[u64; 4]>, wasted: bool, seconds: f64) {
        let c = self.children(model);
        c.duration.observe(seconds);
        let Some(kinds) = kinds else { return };
        for (counter, n) in c.tokens[usize::from(wasted)].iter().zip(kinds) {
            counter.inc_by(n);
        }
        let [input, output, cache_read, cache_write] = kinds;
        let all_input = input.saturating_add(cache_read).saturating_add(cache_write);
        c.usage[0].observe(all_input as f64);
        c.usage[1].observe(output as f64);
    }
}
