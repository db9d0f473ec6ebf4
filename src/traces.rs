//! OpenTelemetry traces (`[telemetry]`, off unless `otlp_endpoint` is set): one server span per
//! proxied request, one client span per upstream attempt under it, exported over OTLP/HTTP
//! (protobuf) by the `opentelemetry-otlp` exporter.
//!
//! - The app's W3C `traceparent` is the request span's parent (its sampling decision is
//!   followed; without one, `sample_ratio` of traces are sampled), and every attempt sends the
//!   provider a `traceparent` naming its own attempt span.
//! - The exporter never blocks a request: ended spans go into a bounded queue (a full queue drops
//!   them, counted in `rebound_trace_spans_total{result="dropped"}`), and one background task
//!   sends them in batches, each bounded by a timeout, so an unreachable collector costs nothing
//!   on the request path.
//! - When traces are off, every call here is a branch on `None`.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    Sampler, SdkTracer, SdkTracerProvider, Span, SpanData, SpanExporter as _, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use prometheus::IntCounter;
use tokio::sync::mpsc;

use crate::config::TelemetryConfig;
use crate::metrics::Metrics;
use crate::wire::body::SpanEnd;

/// Ended spans waiting for the exporter, at most.
const QUEUE: usize = 4096;
/// Spans per export, at most.
const MAX_BATCH: usize = 512;
/// How long a batch waits to fill before it is sent.
const BATCH_DELAY: Duration = Duration::from_millis(200);
/// One export, at most (then its spans count as failed).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why traces could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("telemetry: cannot build the OTLP exporter for {endpoint}: {detail}")]
pub struct TracesError {
    endpoint: String,
    detail: String,
}

/// The process's tracer (none when `[telemetry]` is off).
#[derive(Clone, Default)]
pub struct Traces {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// Closed on shutdown so that the export task sends what is left and ends.
    queue: Arc<Mutex<Option<mpsc::Sender<SpanData>>>>,
    exporter_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Traces {
    /// Traces off.
    pub fn off() -> Traces {
        Traces::default()
    }

    /// Starts the exporter for `config` (off when it names no endpoint). Needs a Tokio runtime.
    pub fn start(config: &TelemetryConfig, metrics: &Metrics) -> Result<Traces, TracesError> {
        let Some(endpoint) = &config.otlp_endpoint else {
            return Ok(Traces::off());
        };
        let url = format!("{endpoint}/v1/traces");
        let fail = |detail: String| TracesError {
            endpoint: url.clone(),
            detail,
        };
        let client = http_client().map_err(&fail)?;
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| fail(e.to_string()))?;
        let resource = Resource::builder()
            .with_service_name(config.service_name.clone())
            .build();
        exporter.set_resource(&resource);
        let spans = |result: &str| metrics.trace_spans_total.with_label_values(&[result]);
        let (tx, rx) = mpsc::channel(QUEUE);
        let queue = Arc::new(Mutex::new(Some(tx)));
        let processor = Queue {
            tx: queue.clone(),
            dropped: spans("dropped"),
        };
        let task = crate::tasks::spawn("trace export", export(rx, exporter, spans("exported"), spans("failed")));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sample_ratio,
            ))))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("rebound");
        Ok(Traces {
            inner: Some(Arc::new(Inner {
                provider,
                tracer,
                queue,
                exporter_task: Mutex::new(Some(task)),
            })),
        })
    }

    /// Sends what is queued (within `bound`) and stops the exporter.
    pub async fn shutdown(&self, bound: Duration) {
        let Some(inner) = &self.inner else { return };
        let _ = inner.provider.shutdown();
        inner.queue.lock().take();
        let task = inner.exporter_task.lock().take();
        if let Some(task) = task {
            let _ = tokio::time::timeout(bound, task).await;
        }
    }

    /// The server span of a request: a child of the app's `traceparent` when it sent one.
    pub fn request(&self, method: &http::Method, path: &str, headers: &HeaderMap) -> RequestSpan {
        let Some(inner) = &self.inner else {
            return RequestSpan { span: None };
        };
        let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
        let span = inner
            .tracer
            .span_builder(format!("{method} {path}"))
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("http.request.method", method.to_string()),
                KeyValue::new("url.path", path.to_string()),
            ])
            .start_with_context(&inner.tracer, &parent);
        let cx = parent.with_span(span);
        RequestSpan {
            span: Some(RequestInner {
                cx,
                tracer: inner.tracer.clone(),
            }),
        }
    }
}

/// The bounded queue between ended spans and the export task.
#[derive(Debug)]
struct Queue {
    tx: Arc<Mutex<Option<mpsc::Sender<SpanData>>>>,
    dropped: IntCounter,
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        let tx = self.tx.lock();
        if tx.as_ref().is_none_or(|tx| tx.try_send(span).is_err()) {
            self.dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Sends queued spans in batches until the queue closes.
async fn export(
    mut rx: mpsc::Receiver<SpanData>,
    exporter: opentelemetry_otlp::SpanExporter,
    exported: IntCounter,
    failed: IntCounter,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        let until = crate::time::now() + BATCH_DELAY;
        while batch.len() < MAX_BATCH {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(span)) => batch.push(span),
                _ => break,
            }
        }
        let n = batch.len() as u64;
        let sent = tokio::time::timeout(EXPORT_TIMEOUT, exporter.export(std::mem::take(&mut batch))).await;
        match sent {
            Ok(Ok(())) => exported.inc_by(n),
            Ok(Err(e)) => {
                failed.inc_by(n);
                tracing::debug!(error = %e, spans = n, "trace export failed");
            }
            Err(_) => failed.inc_by(n),
        }
    }
}

fn http_client() -> Result<impl opentelemetry_http::HttpClient + 'static, String> {
    let tls = crate::upstream::tls::client_config(None).map_err(|e| e.to_string())?;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(Duration::from_secs(2)));
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(opentelemetry_http::hyper::HyperClient::new(
        connector,
        EXPORT_TIMEOUT,
        None,
    ))
}

/// A request's server span (a no-op when traces are off or the trace is not sampled). Clones
/// share the span: the request's books end it when the response ends.
#[derive(Clone)]
pub struct RequestSpan {
    span: Option<RequestInner>,
}

#[derive(Clone)]
struct RequestInner {
    cx: Context,
    tracer: SdkTracer,
}

impl RequestSpan {
    /// Whether spans are recorded for this request (worth computing attributes for).
    pub(crate) fn is_recording(&self) -> bool {
        self.span.as_ref().is_some_and(|s| s.cx.span().is_recording())
    }

    /// The route and the GenAI attributes known before the attempts.
    pub(crate) fn set_route(&self, route: &str, provider: &str, model: Option<&str>, operation: Option<&str>) {
        let Some(s) = &self.span else { return };
        let span = s.cx.span();
        span.set_attribute(KeyValue::new("http.route", route.to_string()));
        span.set_attribute(KeyValue::new("gen_ai.provider.name", provider.to_string()));
        if let Some(model) = model {
            span.set_attribute(KeyValue::new("gen_ai.request.model", model.to_string()));
        }
        if let Some(op) = operation {
            span.set_attribute(KeyValue::new("gen_ai.operation.name", op.to_string()));
        }
    }

    /// A client span for attempt `n` to `upstream`, after waiting `wait` (`source`: what set it).
    pub fn attempt(&self, n: u32, upstream: &str, wait: Duration, source: Option<&str>) -> AttemptSpan {
        let Some(s) = &self.span else {
            return AttemptSpan { span: None };
        };
        let mut attrs = vec![
            KeyValue::new("rebound.attempt", i64::from(n)),
            KeyValue::new("rebound.upstream", upstream.to_string()),
            KeyValue::new("rebound.wait_ms", i64::try_from(wait.as_millis()).unwrap_or(i64::MAX)),
        ];
        if let Some(source) = source {
            attrs.push(KeyValue::new("rebound.wait_source", source.to_string()));
        }
        let span = s
            .tracer
            .span_builder(format!("attempt {n}"))
            .with_kind(SpanKind::Client)
            .with_attributes(attrs)
            .start_with_context(&s.tracer, &s.cx);
        AttemptSpan {
            span: Some(s.cx.with_span(span)),
        }
    }
}

impl SpanEnd for RequestSpan {
    fn end(self: Box<Self>, status: u16, completion: &str, error: Option<&str>, tokens: Option<[u64; 2]>) {
        let Some(s) = self.span else { return };
        let span = s.cx.span();
        if let Some([input, output]) = tokens {
            let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            span.set_attribute(KeyValue::new("gen_ai.usage.input_tokens", n(input)));
            span.set_attribute(KeyValue::new("gen_ai.usage.output_tokens", n(output)));
        }
        span.set_attribute(KeyValue::new("http.response.status_code", i64::from(status)));
        span.set_attribute(KeyValue::new("rebound.completion", completion.to_string()));
        if let Some(code) = error {
            span.set_attribute(KeyValue::new("error.type", code.to_string()));
        }
        if status >= 500 || error.is_some() || completion != "complete" {
            span.set_status(Status::error(error.unwrap_or(completion).to_string()));
        }
        span.end();
    }
}

/// An attempt's client span.
pub struct AttemptSpan {
    span: Option<Context>,
}

impl AttemptSpan {
    /// Writes this attempt's `traceparent` (and `tracestate`) into the upstream request.
    pub(crate) fn inject(&self, headers: &mut HeaderMap) {
        if let Some(cx) = &self.span {
            TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
        }
    }

    /// Ends it with the attempt's outcome, status and the Retry-After it carried.
    pub fn end(self, outcome: &str, status: Option<u16>, retry_after: Option<Duration>) {
        let Some(cx) = self.span else { return };
        let span = cx.span();
        span.set_attribute(KeyValue::new("rebound.outcome", outcome.to_string()));
        if let Some(status) = status {
            span.set_attribute(KeyValue::new("http.response.status_code", i64::from(status)));
        }
        if let Some(after) = retry_after {
            let ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
            span.set_attribute(KeyValue::new("rebound.retry_after_ms", ms));
        }
        if outcome != "ok" {
            span.set_status(Status::error(outcome.to_string()));
        }
        span.end();
    }
}
