//! Token accounting, per upstream attempt: the usage its response reports
//! ([`crate::wire::usage`]), counted once, when it is known whether the app got that response whole.
//!
//! - The delivered attempt's body is metered as it streams, in the same wrapper and the same poll
//!   as the mid-stream error watch ([`super::stream::ErrorWatch`]): a [`Meter`] is fed every data
//!   frame and finished when the body ends (`delivered`, unless an error event or an in-band error
//!   flagged it), fails, or is dropped before its end (`wasted`: cut, idle timeout, client gone;
//!   with `complete_on_disconnect` the idempotency recorder reads on to the end, and the tokens
//!   are `delivered`, since the app's retry replays them).
//! - An attempt that is not delivered (an in-band error that is retried) is counted `wasted`
//!   from what the commit point read of it ([`discard`]), and marked so that it is never counted
//!   twice.
//!
//! Every attempt counted is added to the request's [`Ledger`] (the access log, the dead letter and
//! the job record show it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::Response;
use tokio::time::Instant;

use super::primed::Primed;
use crate::config::{MetricsConfig, UpstreamConfig};
use crate::dead_letters::AttemptRecord;
use crate::metrics::TokenMetrics;
use crate::wire::envelope::Reframed;
use crate::wire::sse::Shape;
use crate::wire::usage::{request_model, Ledger, UsageScan};

/// A response extension: this attempt's tokens are counted already.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Counted;

/// What every attempt of one request shares: its model label and its ledger.
#[derive(Clone)]
pub(crate) struct RequestTokens {
    pub model: Arc<str>,
    pub ledger: Ledger,
}

/// The label of every model not in `[metrics] models`.
const OTHER: &str = "other";

/// The `model` label values of one configuration: `[metrics] models`, then `other`.
pub(crate) struct Models {
    listed: Vec<Arc<str>>,
    other: Arc<str>,
}

impl Models {
    pub fn new(config: &MetricsConfig) -> Models {
        Models {
            listed: config.models.iter().map(|m| Arc::from(m.as_str())).collect(),
            other: Arc::from(OTHER),
        }
    }

    /// A request's label: the request body's `model` when it is listed, else `other` (the body
    /// is not searched when no model is listed).
    pub(crate) fn for_request(&self, body: &[u8]) -> RequestTokens {
        let model = match self.listed.is_empty() {
            true => None,
            false => request_model(body).and_then(|m| self.listed.iter().find(|l| &***l == m)),
        };
        RequestTokens {
            model: model.unwrap_or(&self.other).clone(),
            ledger: Ledger::default(),
        }
    }
}

/// `gen_ai_provider_name` for an upstream: the OpenTelemetry name of the provider its `api` or
/// host says (`openai`, `anthropic`, `azure.ai.openai`, `aws.bedrock`, `gcp.vertex_ai`,
/// `gcp.gemini`), else the upstream's name.
pub(crate) fn provider_name(name: &str, config: &UpstreamConfig) -> String {
    config.api.provider().unwrap_or(name).to_string()
}

/// One attempt's usage, read as its body passes, counted once.
pub(crate) struct Meter {
    scan: UsageScan,
    metrics: Arc<TokenMetrics>,
    request: RequestTokens,
    attempt: u32,
    /// When the attempt was sent (the operation's duration runs to the body's end).
    sent: Instant,
    /// The response's error flag: when set, its tokens are wasted.
    error: Option<Arc<AtomicBool>>,
    done: bool,
}

impl Meter {
    /// A meter for attempt number `attempt` (from 1), sent at `sent`, when the body's `shape`
    /// can carry usage (JSON or an event stream).
    pub(crate) fn for_response(
        shape: Shape,
        metrics: &Arc<TokenMetrics>,
        request: &RequestTokens,
        attempt: u32,
        sent: Instant,
    ) -> Option<Meter> {
        if shape == Shape::Other {
            return None;
        }
        Some(Meter {
            scan: UsageScan::default(),
            metrics: metrics.clone(),
            request: request.clone(),
            attempt,
            sent,
            error: None,
            done: false,
        })
    }

    /// The meter of the delivered attempt's response, unless its tokens were counted already.
    pub(crate) fn for_delivered<B>(
        resp: &Response<Primed<B>>,
        metrics: &Arc<TokenMetrics>,
        request: &RequestTokens,
        attempt: u32,
        sent: Instant,
    ) -> Option<Meter> {
        if resp.extensions().get::<Counted>().is_some() {
            return None;
        }
        let mut meter = Meter::for_response(resp.body().shape(), metrics, request, attempt, sent)?;
        if resp.extensions().get::<Reframed>().is_some() {
            meter.scan = UsageScan::with_invocation_metrics();
        }
        Some(meter)
    }

    /// The response's error flag (an in-band or mid-stream error makes its tokens wasted).
    pub(crate) fn watch_error(&mut self, flag: Option<Arc<AtomicBool>>) {
        self.error = flag;
    }

    /// The body's next data bytes.
    pub fn feed(&mut self, data: &[u8]) {
        self.scan.feed(data);
    }

    /// Counts the attempt (once): `whole` when the body reached its end.
    pub(crate) fn finish(&mut self, whole: bool) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let failed = self.error.as_ref().is_some_and(|f| f.load(Ordering::Acquire));
        let wasted = !whole || failed;
        let usage = self.scan.usage();
        let seconds = self.sent.elapsed().as_secs_f64();
        self.metrics
            .record(&self.request.model, usage.map(|u| u.kinds()), wasted, seconds);
        if let Some(u) = usage {
            self.request.ledger.add(self.attempt, u, wasted);
        }
    }
}

/// Counts an attempt that is not delivered (retried, or replaced by a later one) as wasted, from
/// the bytes the commit point read of it, and marks it counted.
pub(crate) fn discard<B>(
    resp: &mut Response<Primed<B>>,
    metrics: &Arc<TokenMetrics>,
    request: &RequestTokens,
    attempt: u32,
    sent: Instant,
) {
    if resp.extensions().get::<Counted>().is_some() {
        return;
    }
    if let Some(mut meter) = Meter::for_response(resp.body().shape(), metrics, request, attempt, sent) {
        meter.feed(&resp.body().held_prefix(usize::MAX));
        meter.finish(false);
    }
    resp.extensions_mut().insert(Counted);
}

/// `attempts` with the usage each one reported (as counted so far).
pub(crate) fn with_usage(attempts: &[AttemptRecord], ledger: &Ledger) -> Vec<AttemptRecord> {
    let counted = ledger.entries();
    let mut out = attempts.to_vec();
    for (i, a) in out.iter_mut().enumerate() {
        a.usage = counted.iter().find(|u| u.attempt as usize == i + 1).cloned();
    }
    out
}
