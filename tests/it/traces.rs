//! OpenTelemetry traces through real sockets: an OTLP/HTTP receiver inside the test decodes the
//! protobuf rebound exports and checks the span tree, the W3C `traceparent` each attempt sends
//! the provider, sampling, and that an unreachable collector costs the requests nothing.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use rebound::hooks::config::raw::{RawRetry, RawTelemetry};
use tokio::net::TcpListener;

use crate::support::config_builder::{some, TestConfig};
use crate::support::*;

/// An OTLP/HTTP trace receiver: every span posted to `/v1/traces`, decoded.
struct Collector {
    url: String,
    spans: Arc<Mutex<Vec<Span>>>,
    paths: Arc<Mutex<Vec<String>>>,
}

impl Collector {
    async fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (spans, paths) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
        let (s, p) = (spans.clone(), paths.clone());
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { return };
                let (s, p) = (s.clone(), p.clone());
                let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let (s, p) = (s.clone(), p.clone());
                    async move {
                        p.lock().unwrap().push(req.uri().path().to_string());
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let export = ExportTraceServiceRequest::decode(body).unwrap();
                        let mut spans = s.lock().unwrap();
                        for rs in export.resource_spans {
                            for ss in rs.scope_spans {
                                spans.extend(ss.spans);
                            }
                        }
                        let mut resp = http::Response::new(Full::new(Bytes::new()));
                        resp.headers_mut()
                            .insert("content-type", "application/x-protobuf".parse().unwrap());
                        Ok::<_, Infallible>(resp)
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Collector { url, spans, paths }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn text(span: &Span, key: &str) -> String {
    match attr(span, key) {
        Some(Value::StringValue(s)) => s.clone(),
        other => panic!("{key}: {other:?} in {:?}", span.name),
    }
}

fn int(span: &Span, key: &str) -> i64 {
    match attr(span, key) {
        Some(Value::IntValue(n)) => *n,
        other => panic!("{key}: {other:?} in {:?}", span.name),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `fake` route with a fast retry policy (two attempts), and `[telemetry]` exporting to
/// `endpoint` with `edit` applied.
fn config(provider: &str, endpoint: &str, edit: impl FnOnce(&mut RawTelemetry)) -> TestConfig {
    let mut telemetry = RawTelemetry {
        otlp_endpoint: some(endpoint),
        ..RawTelemetry::default()
    };
    edit(&mut telemetry);
    TestConfig::new(provider)
        .retry(
            "fast",
            RawRetry {
                max_attempts: Some(2),
                base_delay: some("20ms"),
                max_delay: some("20ms"),
                jitter: some("none"),
                ..RawRetry::default()
            },
        )
        .telemetry(telemetry)
        .route(|r| r.retry = some("fast"))
}

#[tokio::test]
async fn a_retried_request_is_one_server_span_with_a_client_span_per_attempt() {
    let collector = Collector::start().await;
    let provider = FakeProvider::start().await;
    provider.script("traced", vec![Step::status(503)]);
    let rebound = config(&provider.url(), &collector.url, |t| {
        t.service_name = some("rebound-test")
    })
    .start()
    .await;
    let (trace, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let traceparent = format!("00-{trace}-{parent}-01");
    let answer = send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[("x-fake-key", "traced"), ("traceparent", &traceparent)],
        r#"{"model":"gpt-x","messages":[]}"#,
    )
    .await;
    assert_eq!(answer.status, 200);
    assert!(eventually(Duration::from_secs(10), || collector.spans().len() >= 3).await);
    let spans = collector.spans();
    assert_eq!(spans.len(), 3, "{spans:#?}");
    assert_eq!(collector.paths.lock().unwrap()[0], "/v1/traces");

    let server = spans.iter().find(|s| s.kind == 2).expect("a server span");
    assert_eq!(hex(&server.trace_id), trace, "the app's trace");
    assert_eq!(hex(&server.parent_span_id), parent, "a child of the app's span");
    assert_eq!(text(server, "http.route"), "fake");
    assert_eq!(text(server, "gen_ai.provider.name"), "fake");
    assert_eq!(text(server, "gen_ai.request.model"), "gpt-x");
    assert_eq!(text(server, "gen_ai.operation.name"), "chat");
    assert_eq!(int(server, "http.response.status_code"), 200);
    // The delivered attempt's usage (the fake completion reports 12 in, 96 out).
    assert_eq!(int(server, "gen_ai.usage.input_tokens"), 12);
    assert_eq!(int(server, "gen_ai.usage.output_tokens"), 96);

    let mut attempts: Vec<&Span> = spans.iter().filter(|s| s.kind == 3).collect();
    attempts.sort_by_key(|s| int(s, "rebound.attempt"));
    assert_eq!(attempts.len(), 2);
    for a in &attempts {
        assert_eq!(a.trace_id, server.trace_id);
        assert_eq!(a.parent_span_id, server.span_id, "attempts are children of the request");
    }
    assert_eq!(text(attempts[0], "rebound.outcome"), "status_5xx");
    assert_eq!(int(attempts[0], "http.response.status_code"), 503);
    assert_eq!(text(attempts[1], "rebound.outcome"), "ok");
    assert_eq!(int(attempts[1], "rebound.wait_ms"), 20);
    assert_eq!(text(attempts[1], "rebound.wait_source"), "backoff");

    // Each attempt told the provider its own span.
    let seen = provider.requests("traced");
    assert_eq!(seen.len(), 2);
    for (req, span) in seen.iter().zip(&attempts) {
        let sent = req.header("traceparent").expect("a traceparent per attempt");
        assert_eq!(sent, format!("00-{trace}-{}-01", hex(&span.span_id)));
    }
    // Counted once the collector has answered.
    let exported = r#"rebound_trace_spans_total{result="exported"}"#;
    until_metric(&rebound, exported, |v| v >= 3.0).await;
    assert_eq!(metric(&rebound.metrics().await, exported), 3.0);
}

#[tokio::test]
async fn sampling_and_an_unreachable_collector() {
    let collector = Collector::start().await;
    let provider = FakeProvider::start().await;
    let none = config(&provider.url(), &collector.url, |t| t.sample_ratio = Some(0.0))
        .start()
        .await;
    let url = format!("{}/fake/v1/chat/completions", none.url);
    for _ in 0..5 {
        assert_eq!(
            send("POST", &url, &[("x-fake-key", "unsampled")], "{}").await.status,
            200
        );
    }
    // The app's own decision is followed: a sampled parent is traced even at ratio 0.
    let sampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    assert_eq!(
        send(
            "POST",
            &url,
            &[("x-fake-key", "unsampled"), ("traceparent", sampled)],
            "{}"
        )
        .await
        .status,
        200
    );
    // Spans are exported in the order they end, through one queue: once the sampled request's two
    // spans are in, any span of the five before it would be too.
    assert!(eventually(Duration::from_secs(10), || collector.spans().len() >= 2).await);
    let spans = collector.spans();
    assert!(
        spans
            .iter()
            .all(|s| hex(&s.trace_id) == "0af7651916cd43dd8448eb211c80319c"),
        "only the sampled request: {spans:#?}"
    );
    assert_eq!(spans.len(), 2, "its server span and its attempt");

    // A collector that is not there: requests are served as usual, the spans counted as failed.
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let rebound = config(&provider.url(), &format!("http://{gone}"), |_| {}).start().await;
    let url = format!("{}/fake/v1/chat/completions", rebound.url);
    for _ in 0..3 {
        assert_eq!(
            send("POST", &url, &[("x-fake-key", "nocollector")], "{}").await.status,
            200
        );
    }
    // The server and attempt spans of 3 requests, counted failed (each export waits up to 5 s).
    let failed = r#"rebound_trace_spans_total{result="failed"}"#;
    until_metric_within(&rebound, Duration::from_secs(20), failed, |v| v >= 6.0).await;
}
