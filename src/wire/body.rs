//! Bodies: the capped, replayable request body, and the response body that streams frames through
//! as they come and closes the request's books (metrics, the access log line) when it ends.

use crate::words::spelled;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use tokio::time::Instant;

use super::usage::Ledger;
use crate::metrics::{Metrics, RouteMetrics};

/// What the pipeline delivered, as a response extension, for a caller inside the process (a job
/// worker) that needs it typed rather than read back from `x-rebound-*` headers: the upstream
/// attempts made, and rebound's own error code when rebound answered for itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Delivered {
    pub attempts: u32,
    pub error: Option<&'static str>,
}

/// The error type of bodies rebound streams.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request body could not be taken.
#[derive(Debug)]
pub(crate) enum BodyError {
    TooLarge,
    Read(String),
}

/// Reads the whole request body (it is re-sent on retries), refusing at once a declared
/// `content-length` over `limit` and stopping as soon as the bytes read pass it.
pub(crate) async fn read_capped<B>(body: B, headers: &HeaderMap, limit: u64) -> Result<Bytes, BodyError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(BodyError::TooLarge);
    }
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(BodyError::TooLarge),
        Err(e) => Err(BodyError::Read(e.to_string())),
    }
}

/// How a response ended, for the access log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// Every byte was handed to the client connection.
    Complete,
    /// The upstream body failed mid-way: the client connection is aborted, never ended cleanly.
    UpstreamAborted,
    /// The client went away before the end.
    ClientGone,
}

// The access log's `completion`.
spelled!(Completion { "complete" => Complete, "upstream_aborted" => UpstreamAborted, "client_gone" => ClientGone });

/// What ends a request's trace span when its books close (implemented by `traces`).
pub(crate) trait SpanEnd: Send {
    /// `tokens`: the input (cached included) and output tokens of the attempts whose response
    /// was delivered, when any reported usage.
    fn end(self: Box<Self>, status: u16, completion: &str, error: Option<&str>, tokens: Option<[u64; 2]>);
}

/// What a request holds until its response ends (its `[limits.*]` admission), settled then with
/// the tokens every attempt used: input (cached included) and output, wasted attempts too (the
/// provider counted them); `None` when none reported usage.
pub(crate) trait Settle: Send {
    fn settle(self: Box<Self>, used: Option<Used>);

    /// Where the delivered stream's usage is charged while it flows, if anywhere.
    fn flow(&self) -> Option<Arc<dyn Flow>> {
        None
    }
}

/// A stream's usage so far (an estimate the settlement corrects), charged to the request's
/// limits before the stream ends, so that a long stream does not pass them unseen.
pub(crate) trait Flow: Send + Sync {
    fn flowed(&self, used: Used);
}

/// The tokens a request used, every attempt's summed, in three parts that do not overlap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Used {
    /// Input not read from the provider's cache (cache writes included).
    pub(crate) input: u64,
    /// Input read from the provider's cache.
    pub(crate) cached_input: u64,
    pub(crate) output: u64,
}

/// The shape of the error bodies rebound writes itself: the route's API's (OpenAI, Anthropic,
/// Gemini; before a route matched, the API its path belongs to), or RFC 9457 alone when the request's `accept` asks
/// for `application/problem+json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum ErrorShape {
    #[default]
    OpenAi,
    Anthropic,
    Gemini,
    Problem,
}

/// One request's books: counted in flight from its head, closed when its response ends.
pub struct RequestLog {
    metrics: Arc<Metrics>,
    /// The shape of rebound's own error body for this request.
    error_shape: ErrorShape,
    start: Instant,
    method: http::Method,
    /// Logged as its path only: a query may carry credentials. (A `Uri` clone shares its bytes.)
    uri: http::Uri,
    /// `None` until a route matched (`route="none"`).
    route: Option<Arc<RouteMetrics>>,
    upstream: Option<Arc<str>>,
    status: u16,
    attempts: u32,
    /// Time spent waiting between attempts (backoff, Retry-After, cooldowns).
    wait_ms: u64,
    /// What idempotency did with the request (`claimed`, `replayed`, `followed`, `bypassed`).
    idempotency: Option<&'static str>,
    /// What the response cache did (`hit`, `miss`, `refresh`, `bypass`).
    cache: Option<&'static str>,
    /// rebound's own error code, when it answered for itself.
    error: Option<&'static str>,
    /// The W3C trace id the app sent (`traceparent`), to join the log with its traces.
    trace_id: Option<String>,
    /// The request's server span, ended with the books.
    span: Option<Box<dyn SpanEnd>>,
    /// Every attempt's token usage, once counted.
    usage: Option<Ledger>,
    /// Settled with the tokens used when the books close.
    settle: Option<Box<dyn Settle>>,
    /// Closed (counted out of flight, logged): at the end of the response, or on drop.
    closed: bool,
}

impl Drop for RequestLog {
    /// A request dropped before its response went out (the client went away while rebound was
    /// still waiting or retrying) is still counted out of flight and logged.
    fn drop(&mut self) {
        if !self.closed {
            self.close(Completion::ClientGone);
        }
    }
}

impl RequestLog {
    /// Starts the books for a request (counts it in flight).
    pub fn start(metrics: &Arc<Metrics>, method: &http::Method, uri: &http::Uri) -> RequestLog {
        metrics.inflight_requests.inc();
        RequestLog {
            error_shape: ErrorShape::OpenAi,
            metrics: metrics.clone(),
            start: crate::time::now(),
            method: method.clone(),
            uri: uri.clone(),
            route: None,
            upstream: None,
            status: 0,
            attempts: 0,
            wait_ms: 0,
            idempotency: None,
            cache: None,
            error: None,
            trace_id: None,
            span: None,
            usage: None,
            settle: None,
            closed: false,
        }
    }

    /// Takes the trace id of the app's `traceparent` (W3C: `00-<32 hex>-<16 hex>-<2 hex>`), if valid.
    pub(crate) fn set_trace(&mut self, headers: &http::HeaderMap) {
        // One pass over the names: a lookup by a name that is not a standard one hashes it.
        let [traceparent] = super::headers::first_values(headers, &[super::headers::TRACEPARENT]);
        self.trace_id = traceparent
            .and_then(|v| v.to_str().ok())
            .and_then(trace_id_of)
            .map(str::to_string);
    }

    /// The span to end with the books (and whose trace id the log line carries).
    pub(crate) fn set_span(&mut self, span: Box<dyn SpanEnd>, trace_id: Option<String>) {
        self.span = Some(span);
        if trace_id.is_some() {
            self.trace_id = trace_id;
        }
    }

    /// Records what the response cache did with the request.
    pub(crate) fn set_cache(&mut self, result: &'static str) {
        self.cache = Some(result);
    }

    /// Records what idempotency did with the request.
    pub(crate) fn set_idempotency(&mut self, result: &'static str) {
        self.idempotency = Some(result);
    }

    /// Records rebound's own error code.
    pub(crate) fn set_error(&mut self, code: &'static str) {
        self.error = Some(code);
    }

    /// Records the time waited between attempts.
    pub(crate) fn set_wait(&mut self, wait_ms: u64) {
        self.wait_ms = wait_ms;
    }

    /// When the request arrived.
    pub fn started(&self) -> Instant {
        self.start
    }

    /// Names the route (its metric children, resolved at config load).
    /// The request's `accept` asks for RFC 9457 alone: it stays so whatever the route.
    pub(crate) fn set_accept(&mut self, headers: &http::HeaderMap) {
        let problem = headers.get_all(http::header::ACCEPT).iter().any(|v| {
            let want = b"application/problem+json";
            v.as_bytes().windows(want.len()).any(|w| w.eq_ignore_ascii_case(want))
        });
        if problem {
            self.error_shape = ErrorShape::Problem;
        }
    }

    /// The route's API says the shape of rebound's own errors (unless RFC 9457 was asked for).
    pub(crate) fn set_api(&mut self, api: crate::config::Api) {
        use crate::config::Family;
        if self.error_shape != ErrorShape::Problem {
            self.error_shape = match api.family() {
                Family::OpenAi => ErrorShape::OpenAi,
                Family::Anthropic => ErrorShape::Anthropic,
                Family::Gemini => ErrorShape::Gemini,
            };
        }
    }

    pub(crate) fn error_shape(&self) -> ErrorShape {
        self.error_shape
    }

    pub(crate) fn set_route(&mut self, route: &Arc<RouteMetrics>) {
        self.route = Some(route.clone());
    }

    /// Names the upstream that answered and the attempts made.
    pub(crate) fn set_upstream(&mut self, upstream: &Arc<str>, attempts: u32) {
        self.upstream = Some(upstream.clone());
        self.attempts = attempts;
    }

    /// The request's token ledger (logged as `usage` when an attempt reported any).
    pub(crate) fn set_usage(&mut self, ledger: &Ledger) {
        self.usage = Some(ledger.clone());
    }

    /// Holds `settle` until the books close (then given the tokens every attempt used).
    pub(crate) fn set_settle(&mut self, settle: Box<dyn Settle>) {
        self.settle = Some(settle);
    }

    /// Where the delivered stream's usage is charged as it flows (a route with token or spend
    /// limits).
    pub(crate) fn flow(&self) -> Option<Arc<dyn Flow>> {
        self.settle.as_ref().and_then(|s| s.flow())
    }

    fn route_name(&self) -> &str {
        self.route.as_ref().map_or("none", |r| &*r.route)
    }

    /// Records the response status (counted now, when the head goes out).
    fn respond(&mut self, status: u16) {
        self.status = status;
        match &self.route {
            Some(r) => r.count(status),
            None => self
                .metrics
                .requests_total
                .with_label_values(&["none", &status.to_string()])
                .inc(),
        }
    }

    fn finish(mut self, completion: Completion) {
        self.close(completion);
    }

    fn close(&mut self, completion: Completion) {
        self.closed = true;
        let elapsed = self.start.elapsed();
        self.metrics.inflight_requests.dec();
        match &self.route {
            Some(r) => r.observe(elapsed.as_secs_f64()),
            None => self
                .metrics
                .request_duration_seconds
                .with_label_values(&["none"])
                .observe(elapsed.as_secs_f64()),
        }
        // Field values are only computed when the line is logged (the ledger's JSON, too).
        tracing::info!(
            target: "rebound::access",
            route = self.route_name(),
            method = %self.method,
            path = self.uri.path(),
            status = self.status,
            attempts = self.attempts,
            upstream = self.upstream.as_deref().unwrap_or("-"),
            wait_ms = self.wait_ms,
            idempotency = self.idempotency.unwrap_or("-"),
            cache = self.cache.unwrap_or("-"),
            error = self.error.unwrap_or("-"),
            trace_id = self.trace_id.as_deref().unwrap_or("-"),
            duration_ms = elapsed.as_secs_f64() * 1000.0,
            completion = completion.as_str(),
            usage = self.usage.as_ref().filter(|l| !l.is_empty()).map(Ledger::to_json).as_deref(),
            "request"
        );
        if let Some(settle) = self.settle.take() {
            let used = self.usage.as_ref().map(|l| l.entries()).and_then(|entries| {
                entries.iter().fold(None, |sum: Option<Used>, e| {
                    let s = sum.unwrap_or_default();
                    Some(Used {
                        input: s.input.saturating_add(e.input).saturating_add(e.cache_write),
                        cached_input: s.cached_input.saturating_add(e.cache_read),
                        output: s.output.saturating_add(e.output),
                    })
                })
            });
            settle.settle(used);
        }
        if let Some(span) = self.span.take() {
            let tokens = self.usage.as_ref().map(|l| l.entries()).and_then(|entries| {
                let delivered = entries
                    .iter()
                    .filter(|e| e.outcome == crate::metrics::TokenOutcome::Delivered.as_str());
                delivered.fold(None, |sum: Option<[u64; 2]>, e| {
                    let [i, o] = sum.unwrap_or_default();
                    let input = e.input.saturating_add(e.cache_read).saturating_add(e.cache_write);
                    Some([i.saturating_add(input), o.saturating_add(e.output)])
                })
            });
            span.end(self.status, completion.as_str(), self.error, tokens);
        }
    }
}

/// The trace id of a W3C `traceparent` value (version 00 layout; all-zero ids are invalid).
pub(crate) fn trace_id_of(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let valid = hex(version, 2)
        && version != "ff"
        && hex(trace, 32)
        && hex(span, 16)
        && hex(flags, 2)
        && trace.bytes().any(|b| b != b'0')
        && span.bytes().any(|b| b != b'0');
    valid.then_some(trace)
}

/// The response body rebound sends: frames pass through untouched as they arrive (no
/// buffering), and the request's books close when it ends, fails or is dropped.
pub struct ProxyBody {
    inner: UnsyncBoxBody<Bytes, BoxError>,
    log: Option<RequestLog>,
}

impl ProxyBody {
    /// Wraps a streaming body; `log` is closed when it ends.
    pub fn new<B>(inner: B, mut log: RequestLog, status: u16) -> ProxyBody
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        log.respond(status);
        ProxyBody {
            inner: inner.map_err(Into::into).boxed_unsync(),
            log: Some(log),
        }
    }

    /// A complete body held in memory.
    pub fn full(bytes: impl Into<Bytes>, log: RequestLog, status: u16) -> ProxyBody {
        ProxyBody::new(
            Full::new(bytes.into()).map_err(|never: Infallible| -> BoxError { match never {} }),
            log,
            status,
        )
    }

    /// A body outside any request's books (admin responses).
    pub fn plain(bytes: impl Into<Bytes>) -> ProxyBody {
        ProxyBody {
            inner: Full::new(bytes.into())
                .map_err(|never: Infallible| -> BoxError { match never {} })
                .boxed_unsync(),
            log: None,
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => {
                if let Some(log) = self.log.take() {
                    log.finish(Completion::Complete);
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(log) = self.log.take() {
                    log.finish(Completion::UpstreamAborted);
                }
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for ProxyBody {
    /// The body goes first, so that what it counts when dropped (an attempt's tokens) is in the
    /// log line.
    fn drop(&mut self) {
        if let Some(log) = self.log.take() {
            let completion = if self.inner.is_end_stream() {
                Completion::Complete
            } else {
                Completion::ClientGone
            };
            let empty = http_body_util::Empty::new()
                .map_err(|never: Infallible| -> BoxError { match never {} })
                .boxed_unsync();
            drop(std::mem::replace(&mut self.inner, empty));
            log.finish(completion);
        }
    }
}
