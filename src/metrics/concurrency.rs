//! The families of the upstreams' `concurrency` (`limiter::concurrency`): the limit and the
//! requests in flight per upstream and model (`[metrics] models`, else `other`), each adjustment
//! with its direction and signal, the time requests waited at a limit.

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts};

use super::{reg, Metrics, Registered, WAIT_BUCKETS};
use crate::config::{Concurrency, Config};
use crate::words::Signal;

/// The four families.
#[derive(Clone)]
pub(crate) struct ConcurrencyFamilies {
    limit: IntGaugeVec,
    in_flight: IntGaugeVec,
    adjustments_total: IntCounterVec,
    queue_seconds: HistogramVec,
}

impl ConcurrencyFamilies {
    pub(super) fn new(r: Registered<'_>) -> Result<ConcurrencyFamilies, prometheus::Error> {
        let gauge = |name: &str, help: &str| reg(r, IntGaugeVec::new(Opts::new(name, help), &["upstream", "model"])?);
        Ok(ConcurrencyFamilies {
            limit: gauge(
                "concurrency_limit",
                "The concurrency limit of each upstream with concurrency set, by model ([metrics] models, else other): the fleet's, as this replica last heard it.",
            )?,
            in_flight: gauge(
                "concurrency_in_flight",
                "Requests in flight under each upstream's concurrency limit on this replica, by model.",
            )?,
            adjustments_total: reg(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "concurrency_adjustments_total",
                        "Adaptive concurrency limit changes by upstream, direction (up, down) and signal (rate_limited, unavailable, overloaded, first_byte_timeout, slow_first_byte; success for up).",
                    ),
                    &["upstream", "direction", "signal"],
                )?,
            )?,
            queue_seconds: reg(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "concurrency_queue_seconds",
                        "Time requests waited for a slot under an upstream's concurrency limit.",
                    )
                    .buckets(WAIT_BUCKETS.to_vec()),
                    &["upstream"],
                )?,
            )?,
        })
    }
}

/// One upstream's children, resolved once.
pub(crate) struct ConcurrencySeries {
    upstream: String,
    families: ConcurrencyFamilies,
    queue: Histogram,
}

/// One scope's gauges (its model's label).
pub(crate) struct ScopeSeries {
    pub(crate) limit: IntGauge,
    pub(crate) in_flight: IntGauge,
}

impl ConcurrencySeries {
    pub(crate) fn new(m: &Metrics, upstream: &str) -> ConcurrencySeries {
        let families = m.concurrency.clone();
        ConcurrencySeries {
            upstream: upstream.to_string(),
            queue: families.queue_seconds.with_label_values(&[upstream]),
            families,
        }
    }

    /// The gauges of a scope of `model` (a `[metrics] models` label).
    pub(crate) fn scope(&self, model: &str) -> ScopeSeries {
        let labels = [self.upstream.as_str(), model];
        ScopeSeries {
            limit: self.families.limit.with_label_values(&labels),
            in_flight: self.families.in_flight.with_label_values(&labels),
        }
    }

    /// Counts an adjustment (`up`, or `down` on `signal`).
    pub(crate) fn adjusted(&self, up: bool, signal: &str) {
        let direction = if up { "up" } else { "down" };
        self.families
            .adjustments_total
            .with_label_values(&[&self.upstream, direction, signal])
            .inc();
    }

    /// A request waited `waited` in a queue.
    pub(crate) fn queued(&self, waited: std::time::Duration) {
        self.queue.observe(waited.as_secs_f64());
    }
}

impl Metrics {
    /// The series of `upstream`'s `concurrency` a configuration gives from the start: the limit
    /// at `initial` (where a scope starts) until a request's scope says otherwise.
    pub(super) fn init_concurrency(&self, upstream: &str, mode: Concurrency, config: &Config) {
        let initial = match mode {
            Concurrency::Fixed(n) => n,
            Concurrency::Adaptive => config.concurrency.initial,
        };
        let models = &config.metrics.models;
        let f = &self.concurrency;
        f.queue_seconds.with_label_values(&[upstream]);
        for model in models.iter().map(String::as_str).chain(["other"]) {
            f.in_flight.with_label_values(&[upstream, model]);
            let limit = f.limit.with_label_values(&[upstream, model]);
            if limit.get() == 0 {
                limit.set(i64::from(initial));
            }
        }
        for signal in Signal::NAMES {
            f.adjustments_total.with_label_values(&[upstream, "down", signal]);
        }
        f.adjustments_total.with_label_values(&[upstream, "up", "success"]);
    }
}
