//! Test support: a fake provider, test certificates, a Redis fixture, rebound fixtures (in-process
//! and as the real binary) and small HTTP helpers over real sockets.

#![allow(dead_code)]

pub mod certs;
pub mod cloud;
pub mod config_builder;
pub mod config_edit;
pub mod event_stream;
pub mod fake_hosts;
pub mod fake_provider;
pub mod redis;
pub mod redis_cluster;
pub mod redis_sentinel;
pub mod shipped;
pub mod sidecar;
pub mod sigv4;

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub use config_edit::Edit;
pub use fake_provider::{FakeProvider, Step};
pub use sidecar::Rebound;

/// A plain HTTP/1.1 client.
pub fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A whole response.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Sends a request and reads the whole response (10 s at most).
pub async fn send(method: &str, url: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Answer {
    send_within(Duration::from_secs(10), method, url, headers, body).await
}

/// Sends a request and reads the whole response, with `within` for the head and as much again
/// for the body (slow generations).
pub async fn send_within(
    within: Duration,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    let resp = send_streaming_within(within, method, url, headers, body).await;
    let (parts, body) = resp.into_parts();
    let body = tokio::time::timeout(within, body.collect())
        .await
        .unwrap_or_else(|_| panic!("body within {within:?}"))
        .expect("body read")
        .to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// Sends a request and returns the response with its body unread.
pub async fn send_streaming(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Response<Incoming> {
    send_streaming_within(Duration::from_secs(10), method, url, headers, body).await
}

/// Sends a request and returns the response, its head within `within`, its body unread.
pub async fn send_streaming_within(
    within: Duration,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Response<Incoming> {
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(body.into())).expect("request");
    tokio::time::timeout(within, client().request(req))
        .await
        .unwrap_or_else(|_| panic!("response within {within:?}"))
        .expect("response")
}

pub async fn post_json(url: &str, body: &str) -> Answer {
    send("POST", url, &[("content-type", "application/json")], body.to_string()).await
}

pub async fn get(url: &str) -> Answer {
    send("GET", url, &[], Bytes::new()).await
}

/// Writes raw bytes to `addr` and reads until the peer closes or 5 s pass.
pub async fn raw_exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Polls `f` every 5 ms until it is true: the time it took, or `None` after `within`.
pub async fn time_until(within: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = tokio::time::Instant::now();
    loop {
        if f() {
            return Some(start.elapsed());
        }
        if start.elapsed() > within {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Polls `f` until it is true (true) or `within` passes (false).
pub async fn eventually(within: Duration, f: impl FnMut() -> bool) -> bool {
    time_until(within, f).await.is_some()
}

/// Polls the asynchronous `f` every 10 ms until it gives `Ok`, and returns that: the event a test
/// waits for (an HTTP answer, a Redis key, a metric), never a fixed time. Fails loudly, naming
/// `what` and the last value seen, when `within` passes first.
pub async fn until<T, F, Fut>(what: &str, within: Duration, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    try_until(within, f)
        .await
        .unwrap_or_else(|last| panic!("{what}: not within {within:?}; last seen: {last}"))
}

/// [`until`] for a harness that reports instead of failing: the value `f` gave, or the last error
/// it gave once `within` passed.
pub async fn try_until<T, E, F, Fut>(within: Duration, mut f: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let end = tokio::time::Instant::now() + within;
    loop {
        let last = match f().await {
            Ok(value) => return Ok(value),
            Err(last) => last,
        };
        if tokio::time::Instant::now() >= end {
            return Err(last);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The value of a metric sample line `name{labels} value` in a Prometheus page (0 when absent).
/// A response body read to its end.
pub struct BodyRead {
    /// Every data byte: what the caller had read already, then the rest.
    pub bytes: Bytes,
    /// When the first data frame read here came.
    pub first_at: Option<std::time::Instant>,
    pub ended_at: std::time::Instant,
    /// Ended cleanly; `false`: it failed (a visible abort).
    pub clean: bool,
}

/// Reads `body` to its end, after the `already` bytes the caller read from it; a silence longer
/// than `stall` fails the test.
pub async fn read_body(mut body: Incoming, already: &[u8], stall: Duration) -> BodyRead {
    let mut bytes = bytes::BytesMut::from(already);
    let mut first_at = None;
    loop {
        match tokio::time::timeout(stall, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    first_at.get_or_insert_with(std::time::Instant::now);
                    bytes.extend_from_slice(d);
                }
            }
            Ok(end) => {
                return BodyRead {
                    bytes: bytes.freeze(),
                    first_at,
                    ended_at: std::time::Instant::now(),
                    clean: end.is_none(),
                }
            }
            Err(_) => panic!("the body stalled for {stall:?}"),
        }
    }
}

/// Waits (10 s at most, failing loudly past it) until the series `name_and_labels` on
/// `rebound`'s `/metrics` satisfies `want`: the event a test waits for instead of a fixed time.
pub async fn until_metric(rebound: &Rebound, name_and_labels: &str, want: impl Fn(f64) -> bool) {
    until_metric_within(rebound, Duration::from_secs(10), name_and_labels, want).await
}

/// [`until_metric`], waiting `within` at most.
pub async fn until_metric_within(
    rebound: &Rebound,
    within: Duration,
    name_and_labels: &str,
    want: impl Fn(f64) -> bool,
) {
    let end = tokio::time::Instant::now() + within;
    loop {
        let value = metric(&rebound.metrics().await, name_and_labels);
        if want(value) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "{name_and_labels} is still {value} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn metric(page: &str, name_and_labels: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name_and_labels).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}
