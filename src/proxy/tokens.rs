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
use crate::wire::api::Named;
use crate::wire::api::Reframed;
use crate::wire::body::{Flow, Used};
use crate::wire::sse::Shape;
use crate::wire::usage::{Ledger, UsageScan};

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
    pub(super) fn new(config: &MetricsConfig) -> Models {
        Models {
            listed: config.models.iter().map(|m| Arc::from(m.as_str())).collect(),
            other: Arc::from(OTHER),
        }
    }

    /// A request's label: the model it names when it is listed, else `other`.
    pub(crate) fn for_request(&self, named: &Named) -> RequestTokens {
        let model = named
            .model
            .as_deref()
            .and_then(|m| self.listed.iter().find(|l| &***l == m));
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
    /// Where the stream's usage is charged as it flows (the request's limits).
    flow: Option<Flowed>,
    done: bool,
}

/// How often (in events) a flowing stream's usage is charged.
const FLOW_EVERY: u64 = 16;

/// A stream's usage as it flows: the usage it reported so far (Anthropic's input, at its start),
/// and one token of output for each event (`data:` line) so far, when that is more than it
/// reported (a delta carries one token or more; the few events that carry none are the
/// estimate's error, which the settlement corrects).
struct Flowed {
    to: Arc<dyn Flow>,
    events: u64,
    /// How much of `data:` the current line starts with so far (5: all; [`NOT_DATA`]: it does
    /// not), carried across frames.
    matched: usize,
    /// The count at which to charge next.
    next: u64,
}

/// A line that does not start with `data:`.
const NOT_DATA: usize = 6;

impl Flowed {
    /// Counts the `data:` lines in the stream's next bytes.
    fn count(&mut self, mut data: &[u8]) {
        const DATA: &[u8] = b"data:";
        loop {
            if let Some(want) = DATA.get(self.matched..).filter(|w| !w.is_empty()) {
                let n = want.len().min(data.len());
                self.matched = match data.get(..n) == want.get(..n) {
                    true => self.matched + n,
                    false => NOT_DATA,
                };
                self.events += u64::from(self.matched == DATA.len());
            }
            match memchr::memchr2(b'\n', b'\r', data) {
                Some(i) => {
                    data = data.get(i + 1..).unwrap_or_default();
                    self.matched = 0;
                }
                None => return,
            }
        }
    }
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
            flow: None,
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

    /// Charges the stream's usage to `to` as it flows (an event stream's only).
    pub(crate) fn charge_as_it_flows(&mut self, shape: Shape, to: Option<Arc<dyn Flow>>) {
        self.flow = to.filter(|_| shape == Shape::EventStream).map(|to| Flowed {
            to,
            events: 0,
            matched: 0,
            next: FLOW_EVERY,
        });
    }

    /// The body's next data bytes.
    pub(crate) fn feed(&mut self, data: &[u8]) {
        self.scan.feed(data);
        if let Some(f) = self.flow.as_mut() {
            f.count(data);
            if f.events >= f.next {
                f.next = f.events + FLOW_EVERY;
                let reported = self.scan.usage().unwrap_or_default();
                f.to.flowed(Used {
                    input: reported.input + reported.cache_write,
                    cached_input: reported.cache_read,
                    output: reported.output.max(f.events),
                });
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    #[derive(Default)]
    struct Seen(Mutex<Vec<Used>>);

    impl Flow for Seen {
        fn flowed(&self, used: Used) {
            self.0.lock().push(used);
        }
    }

    fn meter() -> Meter {
        let all = crate::metrics::Metrics::new().expect("metrics");
        let metrics = Arc::new(TokenMetrics::new(&all, "r", "u", "p"));
        let request = RequestTokens {
            model: Arc::from("m"),
            ledger: Ledger::default(),
        };
        Meter::for_response(Shape::EventStream, &metrics, &request, 1, crate::time::now()).expect("meter")
    }

    #[test]
    fn a_stream_is_charged_every_sixteen_events_however_it_is_framed() {
        let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n";
        let delta = "event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"data: x\"}}\r\n\r\n";
        let stream = format!("{start}{}", delta.repeat(40));
        for frame in [1, 7, 64, stream.len()] {
            let seen = Arc::new(Seen::default());
            let mut m = meter();
            m.charge_as_it_flows(Shape::EventStream, Some(seen.clone()));
            for chunk in stream.as_bytes().chunks(frame) {
                m.feed(chunk);
            }
            let seen = seen.0.lock().clone();
            // 41 events: charged at 16 and 32 (one frame: once, at 41); a `data:` inside a
            // string is not an event.
            let outputs: Vec<u64> = seen.iter().map(|u| u.output).collect();
            match frame == stream.len() {
                true => assert_eq!(outputs, [41]),
                false => assert_eq!(outputs, [16, 32], "frames of {frame}"),
            }
            assert!(seen.iter().all(|u| u.input == 12), "frames of {frame}: {seen:?}");
        }
        // A JSON body is not charged as it flows.
        let seen = Arc::new(Seen::default());
        let mut m = meter();
        m.charge_as_it_flows(Shape::Json, Some(seen.clone()));
        m.feed(stream.as_bytes());
        assert!(seen.0.lock().is_empty());
    }
}
