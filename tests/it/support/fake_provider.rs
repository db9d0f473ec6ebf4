//! A fake LLM provider over real sockets: OpenAI- and Anthropic-shaped JSON and SSE, scriptable
//! faults per key, per-key request counters and recorded requests.
//!
//! Tests start it in-process ([`FakeProvider::start`], [`FakeProvider::start_tls`]); the benchmark and
//! the Python end-to-end tests run it as a process (`cargo run --example fake-provider`) and drive it
//! over HTTP (`POST /_fake/script`, `GET /_fake/count`, `GET /_fake/requests`).
//!
//! Requests are keyed by the `x-fake-key` header (default `default`). Each key may carry a script: a
//! list of [`Step`]s consumed one per request; when the script is exhausted the provider answers
//! normally. Normal answers:
//! - `POST .../chat/completions`: a ~1 KB chat completion, or SSE when the JSON body has
//!   `"stream": true` (`x-fake-chunks` events, default 5, `x-fake-gap-ms` apart, default 0; the
//!   last one with `"finish_reason": "stop"`);
//! - `POST .../messages`: the Anthropic equivalent (the stream is the full event sequence:
//!   `message_start`, `content_block_start`, the deltas, `content_block_stop`, `message_delta`,
//!   `message_stop`, the first two sent with the first delta and the last three together);
//!   With `"stream_options": {"include_usage": true}` a chat stream ends with a usage chunk;
//! - a rate limit per credential ([`FakeProvider::rate_limit`], `POST /_fake/rate_limit`): `limit`
//!   requests per fixed window of `window_ms` (from the window's first request) for each
//!   `authorization` / `x-api-key` value; every answer carries the quota (OpenAI's
//!   `x-ratelimit-*-requests`, Anthropic's `anthropic-ratelimit-requests-*` on `/messages`), and a
//!   request over the limit gets 429 ([`FakeProvider::rate_limited`] counts them);
//! - `POST .../embeddings`, `POST .../responses`: OpenAI's embeddings (floats, or base64 as the
//!   OpenAI SDK asks by default) and a Responses API answer (its event stream with `"stream": true`);
//! - the paths of the models' cloud hosts (Amazon Bedrock, Vertex AI, Azure OpenAI, the Gemini API):
//!   what those hosts check, answer and refuse, Bedrock's binary event stream included, in
//!   `fake_hosts.rs` (its module docs); `POST /_fake/aws` (`{"region": ".."}`) sets the region a
//!   Bedrock signature must be scoped to;
//! - `ANY /echo...`: JSON describing the request as received (method, path, query, headers, body size);
//! - `GET /ws`: a WebSocket-style upgrade that echoes bytes back;
//! - anything else: 404 with an OpenAI-shaped error body.

#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::{event_stream, fake_hosts};

pub type Body = BoxBody<Bytes, std::io::Error>;

/// One scripted answer.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Step {
    /// Answer with this status, headers and body (default body: an OpenAI-shaped error).
    Status {
        status: u16,
        #[serde(default)]
        headers: Vec<(String, String)>,
        #[serde(default)]
        body: Option<String>,
    },
    /// Close the connection without answering (the client sees a reset / incomplete message).
    Reset,
    /// Wait this long before answering normally.
    Delay { ms: u64 },
    /// Wait this long, then answer with this status and an OpenAI-shaped error body.
    StatusAfter { ms: u64, status: u16 },
    /// Send the response head, then never send a body byte.
    Stall,
    /// Send the head and the first SSE chunk, then abort the stream.
    CutAfterFirstChunk,
    /// Send a 200 head (the request's usual content type), then abort before any body byte.
    ResetAfterHead,
    /// Send the head and the first SSE chunk, then nothing more (the connection stays open).
    StallAfterFirstChunk,
    /// A model that thinks before it streams: the SSE head at once, then the normal stream's first
    /// event `ms` later. Meanwhile, every `ping_every_ms` (0: never), a keep-alive: Anthropic's
    /// `event: ping` on `/messages`, an SSE comment (`: keep-alive`) elsewhere.
    ThinkThenStream {
        ms: u64,
        #[serde(default)]
        ping_every_ms: u64,
    },
    /// Stop reading and writing this connection for good (its process hangs, its kernel still
    /// answers TCP): an HTTP/2 PING is never acknowledged, nothing is ever answered.
    Freeze,
    /// A model that pauses mid-stream: the normal stream's first event at once, then no byte at
    /// all for `ms`, then the rest of the stream (a reasoning model between its first event and
    /// its first token, on a provider that sends no pings).
    PauseAfterFirst { ms: u64 },
    /// The normal stream's first `after` events at once, then no byte for `ms`, then the rest.
    PauseAfter { after: usize, ms: u64 },
    /// The normal answer from its start, even to a request that carries a partial answer to go
    /// on from (a model that starts over).
    FromStart,
    /// An Anthropic stream whose text is `text`, one delta per word (a model that answers
    /// something else).
    AnthropicText { text: String },
    /// These events, one frame each, then the stream aborted (a reset mid-stream).
    EventsThenCut { events: Vec<String> },
    /// The normal stream's first event, then the connection freezes for good (as [`Step::Freeze`],
    /// mid-stream: the provider's host is gone after the first bytes).
    FreezeAfterFirst,
    /// An in-band error: 200 and an event stream whose first event is an error of this type
    /// (`overloaded_error`, `rate_limit_error`, ...), then the end. Anthropic-shaped on
    /// `/messages` (`event: error` + `{"type":"error","error":{..}}`), OpenAI-shaped elsewhere
    /// (`data: {"error": {..}}`). `headers` are added to the response head.
    InBandError {
        error_type: String,
        #[serde(default)]
        headers: Vec<(String, String)>,
    },
    /// 200 and a JSON body that is an error object of this type (shaped as above).
    JsonError {
        error_type: String,
        #[serde(default)]
        headers: Vec<(String, String)>,
    },
    /// The normal stream's first `after` events (at least one), then an error event of this
    /// type, then the end.
    MidStreamError { after: usize, error_type: String },
    /// Bedrock's event stream (`fake_hosts.rs`): the normal stream's first `after` events (0: none),
    /// then an exception message of this type (`throttlingException`,
    /// `serviceUnavailableException`, `modelStreamErrorException`, ...) with this message, then
    /// the end. Elsewhere: the Anthropic error event the exception stands for, as
    /// [`Step::MidStreamError`] (or [`Step::InBandError`] when `after` is 0).
    EventStreamException {
        after: usize,
        exception_type: String,
        #[serde(default = "exception_message")]
        message: String,
    },
    /// Bedrock's event stream: the normal stream's first `after` events, then the next one with
    /// its message checksum broken, then the end. Elsewhere: the first `after` events, then an
    /// aborted body.
    BadChecksum { after: usize },
}

fn exception_message() -> String {
    "scripted exception".into()
}

impl Step {
    pub fn status(status: u16) -> Step {
        Step::Status {
            status,
            headers: Vec::new(),
            body: None,
        }
    }
    pub fn in_band(error_type: &str) -> Step {
        Step::InBandError {
            error_type: error_type.to_string(),
            headers: Vec::new(),
        }
    }
    pub fn status_with(status: u16, headers: &[(&str, &str)]) -> Step {
        Step::Status {
            status,
            headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            body: None,
        }
    }
}

/// A request as the provider received it.
#[derive(Clone, Debug, Serialize)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub version: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Why the host of its path refused it (`fake_hosts.rs`: the status, the error type, the
    /// body), or `None`: it was taken (its script step, if any, consumed).
    pub refused: Option<String>,
    /// When it arrived.
    #[serde(skip)]
    pub at: Option<std::time::Instant>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct State {
    scripts: Mutex<HashMap<String, Vec<Step>>>,
    counts: Mutex<HashMap<String, usize>>,
    recorded: Mutex<HashMap<String, Vec<Recorded>>>,
    streams_completed: Mutex<HashMap<String, usize>>,
    connections: AtomicUsize,
    /// Requests per window and the window, when rate limiting.
    rate: Mutex<Option<(usize, Duration)>>,
    /// Per credential: the window's start and the requests in it.
    windows: Mutex<HashMap<String, (std::time::Instant, usize)>>,
    rate_limited: AtomicUsize,
    /// Requests being answered (until their response head is returned), and the most at once.
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    /// The region a Bedrock signature must be scoped to (any when `None`).
    aws_region: Mutex<Option<String>>,
    /// Keep recorded request bodies (off in the benchmark to stay flat in memory).
    record: bool,
}

/// A running fake provider. Dropping it stops the accept loop.
pub struct FakeProvider {
    pub addr: SocketAddr,
    scheme: &'static str,
    state: Arc<State>,
    _stop: watch::Sender<()>,
}

impl FakeProvider {
    /// Plain HTTP (HTTP/1.1 and h2c) on 127.0.0.1, a free port.
    pub async fn start() -> FakeProvider {
        Self::start_on("127.0.0.1:0", None, true).await
    }

    /// TLS with ALPN `h2` and `http/1.1`, using the given server config.
    pub async fn start_tls(mut tls: rustls::ServerConfig) -> FakeProvider {
        if tls.alpn_protocols.is_empty() {
            tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        }
        Self::start_on("127.0.0.1:0", Some(tls), true).await
    }

    /// Listen on `addr`; `record` keeps every request for [`FakeProvider::requests`].
    pub async fn start_on(addr: &str, tls: Option<rustls::ServerConfig>, record: bool) -> FakeProvider {
        let listener = TcpListener::bind(addr).await.expect("bind fake provider");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(State {
            record,
            ..State::default()
        });
        let (stop_tx, stop_rx) = watch::channel(());
        let acceptor = tls.map(|c| tokio_rustls::TlsAcceptor::from(Arc::new(c)));
        let scheme = if acceptor.is_some() { "https" } else { "http" };
        tokio::spawn(accept_loop(listener, acceptor, state.clone(), stop_rx));
        FakeProvider {
            addr,
            scheme,
            state,
            _stop: stop_tx,
        }
    }

    /// `http://127.0.0.1:PORT` or `https://localhost:PORT` (the TLS test certificate names localhost).
    pub fn url(&self) -> String {
        match self.scheme {
            "https" => format!("https://localhost:{}", self.addr.port()),
            _ => format!("http://{}", self.addr),
        }
    }

    /// Replace the script for `key`.
    pub fn script(&self, key: &str, steps: Vec<Step>) {
        lock(&self.state.scripts).insert(key.to_string(), steps);
    }

    /// Requests received for `key` so far.
    pub fn count(&self, key: &str) -> usize {
        lock(&self.state.counts).get(key).copied().unwrap_or(0)
    }

    /// Requests received for `key`, in order (empty unless recording).
    pub fn requests(&self, key: &str) -> Vec<Recorded> {
        lock(&self.state.recorded).get(key).cloned().unwrap_or_default()
    }

    /// The time between consecutive requests with `key`, as they arrived.
    pub fn gaps(&self, key: &str) -> Vec<std::time::Duration> {
        let at: Vec<std::time::Instant> = self.requests(key).iter().filter_map(|r| r.at).collect();
        at.windows(2).map(|w| w[1] - w[0]).collect()
    }

    /// SSE streams for `key` whose last event has been sent.
    pub fn streams_completed(&self, key: &str) -> usize {
        lock(&self.state.streams_completed).get(key).copied().unwrap_or(0)
    }

    /// Limits each credential to `limit` requests per window of `window` (see the module docs).
    pub fn rate_limit(&self, limit: usize, window: Duration) {
        *lock(&self.state.rate) = Some((limit, window));
    }

    /// Requests answered 429 by the rate limit so far.
    pub fn rate_limited(&self) -> usize {
        self.state.rate_limited.load(Ordering::SeqCst)
    }

    /// Bedrock's signatures must be scoped to `region` (see `fake_hosts.rs`).
    pub fn aws_region(&self, region: &str) {
        *lock(&self.state.aws_region) = Some(region.to_string());
    }

    /// The most requests it was answering at once (from arrival to its response head: a
    /// [`Step::Delay`] counts whole), since the start or [`FakeProvider::reset_most_in_flight`].
    pub fn most_in_flight(&self) -> usize {
        self.state.most_in_flight.load(Ordering::SeqCst)
    }

    pub fn reset_most_in_flight(&self) {
        self.state.most_in_flight.store(0, Ordering::SeqCst);
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    state: Arc<State>,
    mut stop: watch::Receiver<()>,
) {
    loop {
        let (tcp, _) = tokio::select! {
            r = listener.accept() => match r { Ok(c) => c, Err(_) => continue },
            _ = stop.changed() => return,
        };
        let _ = tcp.set_nodelay(true);
        state.connections.fetch_add(1, Ordering::SeqCst);
        let state = state.clone();
        let acceptor = acceptor.clone();
        let frozen = Arc::new(AtomicBool::new(false));
        let tcp = Freezable {
            inner: tcp,
            frozen: frozen.clone(),
        };
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| handle(state.clone(), frozen.clone(), req));
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            match acceptor {
                Some(acceptor) => {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        let _ = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc).await;
                    }
                }
                None => {
                    let _ = builder.serve_connection_with_upgrades(TokioIo::new(tcp), svc).await;
                }
            }
        });
    }
}

#[derive(Debug)]
struct ResetConnection;
impl std::fmt::Display for ResetConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("scripted reset")
    }
}
impl std::error::Error for ResetConnection {}

/// An Anthropic stream's keep-alive event.
pub const ANTHROPIC_PING: &str = "event: ping\ndata: {\"type\": \"ping\"}\n\n";
/// An SSE comment, as servers send to keep a stream alive.
pub const SSE_COMMENT: &str = ": keep-alive\n\n";

/// A connection's I/O that can be frozen ([`Step::Freeze`]): once frozen, every read and write
/// stays pending forever.
struct Freezable<T> {
    inner: T,
    frozen: Arc<AtomicBool>,
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Freezable<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.frozen.load(Ordering::SeqCst) {
            return std::task::Poll::Pending;
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Freezable<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.frozen.load(Ordering::SeqCst) {
            return std::task::Poll::Pending;
        }
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.frozen.load(Ordering::SeqCst) {
            return std::task::Poll::Pending;
        }
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.frozen.load(Ordering::SeqCst) {
            return std::task::Poll::Pending;
        }
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request being answered, counted in `in_flight` until dropped.
struct Answering(Arc<State>);

impl Answering {
    fn new(state: &Arc<State>) -> Answering {
        let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        state.most_in_flight.fetch_max(now, Ordering::SeqCst);
        Answering(state.clone())
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn handle(
    state: Arc<State>,
    frozen: Arc<AtomicBool>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ResetConnection> {
    let path = req.uri().path().to_string();
    if path.starts_with("/_fake/") {
        return Ok(control(&state, req).await);
    }
    let key = header(req.headers(), "x-fake-key").unwrap_or("default").to_string();
    let _answering = Answering::new(&state);
    let chunks: usize = header(req.headers(), "x-fake-chunks")
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let gap = Duration::from_millis(
        header(req.headers(), "x-fake-gap-ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
    );
    if req.headers().contains_key(http::header::UPGRADE) {
        let mut req = req;
        let up = hyper::upgrade::on(&mut req);
        return Ok(websocket_echo(&state, &key, up));
    }
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();

    *lock(&state.counts).entry(key.clone()).or_insert(0) += 1;
    if state.record {
        lock(&state.recorded).entry(key.clone()).or_default().push(Recorded {
            method: parts.method.to_string(),
            path: path.clone(),
            query: parts.uri.query().map(str::to_string),
            version: format!("{:?}", parts.version),
            headers: parts
                .headers
                .iter()
                .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
                .collect(),
            body: body.to_vec(),
            refused: None,
            at: Some(std::time::Instant::now()),
        });
    }

    let call = fake_hosts::Call::of(&path, parts.uri.query());
    if let Some(call) = &call {
        let region = lock(&state.aws_region).clone();
        if let Some((why, refused)) = fake_hosts::refuse(call, region.as_deref(), &parts, &body) {
            if let Some(last) = lock(&state.recorded).get_mut(&key).and_then(|r| r.last_mut()) {
                last.refused = Some(why);
            }
            return Ok(refused);
        }
    }
    let bedrock = call.as_ref().is_some_and(|c| c.host == fake_hosts::Host::Bedrock);

    let quota = rate_quota(&state, &parts.headers, path.ends_with("/messages"));
    if let Some((false, headers)) = &quota {
        state.rate_limited.fetch_add(1, Ordering::SeqCst);
        let mut resp = json_response(
            StatusCode::TOO_MANY_REQUESTS,
            r#"{"error":{"message":"rate limited","type":"requests","code":"rate_limit_exceeded"}}"#.into(),
        );
        add_headers(&mut resp, headers.clone());
        return Ok(resp);
    }
    let resp = answer(state, frozen, parts, body, key, path, call, chunks, gap).await;
    let resp = match resp {
        Ok(resp) if bedrock => Ok(fake_hosts::to_bedrock(resp)),
        other => other,
    };
    Ok(match (resp, quota) {
        (Ok(mut resp), Some((_, headers))) => {
            add_headers(&mut resp, headers);
            resp
        }
        (resp, _) => return resp,
    })
}

/// Counts a request against its credential's window: whether it is allowed, and the quota
/// headers to send (`None` without a rate limit).
fn rate_quota(state: &State, headers: &HeaderMap, anthropic: bool) -> Option<(bool, Vec<(String, String)>)> {
    let (limit, window) = (*lock(&state.rate))?;
    let credential = header(headers, "authorization")
        .or_else(|| header(headers, "x-api-key"))
        .unwrap_or("")
        .to_string();
    let now = std::time::Instant::now();
    let (allowed, remaining, reset) = {
        let mut windows = lock(&state.windows);
        let w = windows.entry(credential).or_insert((now, 0));
        if now >= w.0 + window {
            *w = (now, 0);
        }
        let allowed = w.1 < limit;
        if allowed {
            w.1 += 1;
        }
        (allowed, limit - w.1, (w.0 + window).saturating_duration_since(now))
    };
    // Rounded up: a client that waits this long finds the next window open.
    let reset_ms = reset.as_nanos().div_ceil(1_000_000);
    let headers = if anthropic {
        let at = std::time::SystemTime::now() + Duration::from_millis(reset_ms as u64 + 1);
        let at = httpdate_rfc3339(at);
        vec![
            ("anthropic-ratelimit-requests-limit".into(), limit.to_string()),
            ("anthropic-ratelimit-requests-remaining".into(), remaining.to_string()),
            ("anthropic-ratelimit-requests-reset".into(), at),
        ]
    } else {
        vec![
            ("x-ratelimit-limit-requests".into(), limit.to_string()),
            ("x-ratelimit-remaining-requests".into(), remaining.to_string()),
            ("x-ratelimit-reset-requests".into(), format!("{reset_ms}ms")),
        ]
    };
    Some((allowed, headers))
}

/// RFC 3339 UTC with milliseconds, rounded up to the millisecond.
fn httpdate_rfc3339(at: std::time::SystemTime) -> String {
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().div_ceil(1_000_000)) as i64;
    let (days, rest) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (h, mi, sec, milli) = (rest / 3_600_000, rest / 60_000 % 60, rest / 1000 % 60, rest % 1000);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{sec:02}.{milli:03}Z")
}

/// The answer to a request that the rate limit let through.
#[allow(clippy::too_many_arguments)]
async fn answer(
    state: Arc<State>,
    frozen: Arc<AtomicBool>,
    parts: http::request::Parts,
    body: Bytes,
    key: String,
    path: String,
    call: Option<fake_hosts::Call>,
    chunks: usize,
    gap: Duration,
) -> Result<Response<Body>, ResetConnection> {
    let step = {
        let mut scripts = lock(&state.scripts);
        match scripts.get_mut(&key) {
            Some(steps) if !steps.is_empty() => Some(steps.remove(0)),
            _ => None,
        }
    };
    let request = serde_json::from_slice::<serde_json::Value>(&body).ok();
    let wants_stream = request
        .as_ref()
        .and_then(|v| v.get("stream").and_then(|s| s.as_bool()))
        .unwrap_or(false);
    let wants_stream = call.as_ref().map_or(wants_stream, |c| c.streams(wants_stream));
    // Anthropic's events and errors: `/messages`, and the hosts of Anthropic's models.
    let anthropic = path.ends_with("/messages") || call.as_ref().is_some_and(|c| c.host.anthropic());
    let bedrock = call.as_ref().is_some_and(|c| c.host == fake_hosts::Host::Bedrock);
    let include_usage = request
        .as_ref()
        .and_then(|v| v.pointer("/stream_options/include_usage").and_then(|s| s.as_bool()))
        .unwrap_or(false);

    let step = match step {
        Some(Step::StatusAfter { ms, status }) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Some(Step::status(status))
        }
        // Without an event stream, the error event the exception stands for.
        Some(Step::EventStreamException {
            after, exception_type, ..
        }) if !bedrock => {
            let error_type = fake_hosts::anthropic_error_type(&exception_type).to_string();
            Some(match after {
                0 => Step::in_band(&error_type),
                after => Step::MidStreamError { after, error_type },
            })
        }
        other => other,
    };
    let from_start = matches!(step, Some(Step::FromStart));
    match step {
        Some(Step::Status { status, headers, body }) => {
            let mut resp = Response::builder()
                .status(status)
                .header("content-type", "application/json");
            // A host's own error shape, unless the step gives the body.
            let (host_headers, host_body) = match (&call, &body) {
                (Some(call), None) => fake_hosts::scripted_error(call, status),
                _ => (Vec::new(), String::new()),
            };
            for (k, v) in host_headers {
                if !headers.iter().any(|(h, _)| h.eq_ignore_ascii_case(&k)) {
                    resp = resp.header(k, v);
                }
            }
            for (k, v) in headers {
                resp = resp.header(k, v);
            }
            let body = body.unwrap_or_else(|| match call {
                Some(_) => host_body,
                None => {
                    format!(r#"{{"error":{{"message":"scripted {status}","type":"fake_error","code":"{status}"}}}}"#)
                }
            });
            return Ok(resp.body(full(body)).unwrap_or_default());
        }
        Some(Step::Reset) => return Err(ResetConnection),
        Some(Step::Delay { ms }) => tokio::time::sleep(Duration::from_millis(ms)).await,
        Some(Step::StatusAfter { .. }) => {}
        Some(Step::Stall) => {
            let stream = futures_util::stream::pending::<Result<Frame<Bytes>, std::io::Error>>();
            return Ok(sse_response(BodyExt::boxed(StreamBody::new(stream))));
        }
        Some(Step::CutAfterFirstChunk) => {
            // Let the head and first chunk reach the wire before the abort (an Anthropic stream's
            // first frame starts its message).
            let chunk = match anthropic {
                true => format!("{}{}", anthropic_stream_start(), anthropic_event(0)),
                false => sse_chunk(0),
            };
            let first = futures_util::stream::iter(vec![Ok(Frame::data(Bytes::from(chunk)))]);
            let cut = futures_util::stream::once(async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Err(std::io::Error::other("scripted cut"))
            });
            let stream = futures_util::StreamExt::chain(first, cut);
            return Ok(sse_response(BodyExt::boxed(StreamBody::new(stream))));
        }
        Some(Step::ResetAfterHead) => {
            // Let the head reach the wire before the abort.
            let cut = futures_util::stream::once(async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Err::<Frame<Bytes>, _>(std::io::Error::other("scripted reset after head"))
            });
            let mut resp = sse_response(BodyExt::boxed(StreamBody::new(cut)));
            if !wants_stream {
                resp.headers_mut()
                    .insert("content-type", http::HeaderValue::from_static("application/json"));
            }
            return Ok(resp);
        }
        Some(Step::StallAfterFirstChunk) => {
            let first = futures_util::stream::iter(vec![Ok(Frame::data(Bytes::from(sse_chunk(0))))]);
            let stream = futures_util::StreamExt::chain(first, futures_util::stream::pending());
            return Ok(sse_response(BodyExt::boxed(StreamBody::new(stream))));
        }
        Some(Step::ThinkThenStream { ms, ping_every_ms }) => {
            let ping = if anthropic { ANTHROPIC_PING } else { SSE_COMMENT };
            let thinking = thinking(Duration::from_millis(ms), Duration::from_millis(ping_every_ms), ping);
            let events = sse_events(state, key, chunks, gap, anthropic);
            let stream = futures_util::StreamExt::chain(thinking, events);
            return Ok(sse_response(BodyExt::boxed(StreamBody::new(stream))));
        }
        Some(Step::Freeze) => {
            frozen.store(true, Ordering::SeqCst);
            return futures_util::future::pending().await;
        }
        Some(step @ (Step::PauseAfterFirst { .. } | Step::PauseAfter { .. })) => {
            let (after, ms) = match step {
                Step::PauseAfter { after, ms } => (after, ms),
                Step::PauseAfterFirst { ms } => (1, ms),
                _ => (1, 0),
            };
            let events = sse_events(state, key, chunks, gap, anthropic);
            let pause = Duration::from_millis(ms);
            let stream = futures_util::StreamExt::then(
                futures_util::StreamExt::enumerate(events),
                move |(i, frame)| async move {
                    if i == after {
                        tokio::time::sleep(pause).await;
                    }
                    frame
                },
            );
            return Ok(sse_response(BodyExt::boxed(StreamBody::new(stream))));
        }
        Some(Step::FreezeAfterFirst) => {
            let first = futures_util::StreamExt::take(sse_events(state, key, chunks, gap, anthropic), 1);
            let freeze = futures_util::stream::once(async move {
                // Let the first event reach the wire, then hang the connection.
                tokio::time::sleep(Duration::from_millis(50)).await;
                frozen.store(true, Ordering::SeqCst);
                futures_util::future::pending::<Result<Frame<Bytes>, std::io::Error>>().await
            });
            let stream = futures_util::StreamExt::chain(first, freeze);
            return Ok(sse_response(BodyExt::boxed(StreamBody::new(stream))));
        }
        Some(Step::InBandError { error_type, headers }) => {
            let event = error_event(&error_type, anthropic);
            let mut resp = sse_response(full(event));
            add_headers(&mut resp, headers);
            return Ok(resp);
        }
        Some(Step::JsonError { error_type, headers }) => {
            let body = error_object(&error_type, anthropic);
            let mut resp = json_response(StatusCode::OK, body);
            add_headers(&mut resp, headers);
            return Ok(resp);
        }
        Some(Step::MidStreamError { after, error_type }) => {
            let events = sse_events(state, key, chunks.max(after + 1), gap, anthropic);
            // The normal stream's first events (none of them its last: no finish reason), then
            // the error.
            let events = futures_util::StreamExt::take(events, after.max(1));
            let error = futures_util::stream::once(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(Frame::data(Bytes::from(error_event(&error_type, anthropic))))
            });
            let stream = futures_util::StreamExt::chain(events, error);
            return Ok(sse_response(BodyExt::boxed(StreamBody::new(stream))));
        }
        Some(Step::EventStreamException {
            after,
            exception_type,
            message,
        }) => {
            let exception = event_stream::exception(&exception_type, &message);
            return Ok(fake_hosts::failing_bedrock_stream(chunks, after, exception));
        }
        Some(Step::BadChecksum { after }) if bedrock => {
            let corrupt = event_stream::corrupt(fake_hosts::bedrock_message(chunks, after));
            return Ok(fake_hosts::failing_bedrock_stream(chunks, after, corrupt));
        }
        Some(Step::BadChecksum { after }) => {
            let events: Vec<String> = match anthropic {
                true => fake_hosts::anthropic_events(chunks),
                false => (0..chunks).map(|i| sse_chunk_of(i, chunks)).collect(),
            };
            let first = Bytes::from(events.into_iter().take(after).collect::<String>());
            let cut = futures_util::stream::once(async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Err(std::io::Error::other("scripted bad checksum"))
            });
            let head = futures_util::stream::iter((!first.is_empty()).then(|| Ok(Frame::data(first))));
            let stream = futures_util::StreamExt::chain(head, cut);
            return Ok(sse_response(BodyExt::boxed(StreamBody::new(stream))));
        }
        Some(Step::AnthropicText { text }) => {
            let mut events = vec![anthropic_stream_start().to_string()];
            let words: Vec<&str> = text.split_inclusive(' ').collect();
            for w in &words {
                let delta = serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}});
                events.push(format!("event: content_block_delta\ndata: {delta}\n\n"));
            }
            events.push(anthropic_stream_end(words.len()));
            return Ok(listed_events(state, key, events, gap, "text/event-stream"));
        }
        Some(Step::EventsThenCut { events }) => {
            let frames = events.into_iter().map(|e| Ok(Frame::data(Bytes::from(e))));
            let cut = futures_util::stream::once(async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Err(std::io::Error::other("scripted cut"))
            });
            let stream = futures_util::StreamExt::chain(futures_util::stream::iter(frames.collect::<Vec<_>>()), cut);
            return Ok(sse_response(BodyExt::boxed(StreamBody::new(stream))));
        }
        Some(Step::FromStart) | None => {}
    }

    if let Some(call) = &call {
        match fake_hosts::answer(call, request.as_ref(), chunks) {
            fake_hosts::HostAnswer::Json { body, headers } => {
                let mut resp = json_response(StatusCode::OK, body);
                add_headers(&mut resp, headers);
                return Ok(resp);
            }
            fake_hosts::HostAnswer::AnthropicStream => {
                // A prefill goes on from where it stops, as on Anthropic's own path.
                let from = if from_start {
                    0
                } else {
                    continued_from(request.as_ref())
                };
                return Ok(sse_stream(state, key, (from, chunks), gap, true, false));
            }
            fake_hosts::HostAnswer::Events { events, content_type } => {
                return Ok(listed_events(state, key, events, gap, content_type));
            }
            fake_hosts::HostAnswer::Generic => {}
        }
    } else if let Some(events) = fake_hosts::resumed(&path, parts.uri.query(), chunks) {
        return Ok(listed_events(state, key, events, gap, "text/event-stream"));
    } else if let Some(extra) = fake_hosts::openai_extra(&path, request.as_ref(), chunks) {
        match extra {
            fake_hosts::HostAnswer::Json { body, headers } => {
                let mut resp = json_response(StatusCode::OK, body);
                add_headers(&mut resp, headers);
                return Ok(resp);
            }
            fake_hosts::HostAnswer::Events { events, content_type } => {
                return Ok(listed_events(state, key, events, gap, content_type));
            }
            _ => {}
        }
    }

    if path == "/echo" || path.starts_with("/echo/") {
        let echo = serde_json::json!({
            "method": parts.method.as_str(),
            "path": path,
            "query": parts.uri.query(),
            "version": format!("{:?}", parts.version),
            "headers": parts.headers.iter().map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned())).collect::<Vec<_>>(),
            "body_len": body.len(),
        });
        return Ok(json_response(StatusCode::OK, echo.to_string()));
    }
    if path.ends_with("/chat/completions") || path.ends_with("/messages") {
        if wants_stream {
            // A continuation of a partial answer goes on from where it stopped.
            let from = if from_start {
                0
            } else {
                continued_from(request.as_ref())
            };
            let chunks = (from, chunks);
            return Ok(sse_stream(state, key, chunks, gap, anthropic, include_usage));
        }
        let body = if anthropic {
            anthropic_message()
        } else {
            chat_completion()
        };
        return Ok(json_response(StatusCode::OK, body));
    }
    Ok(json_response(
        StatusCode::NOT_FOUND,
        r#"{"error":{"message":"unknown path","type":"invalid_request_error","code":"not_found"}}"#.into(),
    ))
}

fn websocket_echo(state: &Arc<State>, key: &str, up: hyper::upgrade::OnUpgrade) -> Response<Body> {
    *lock(&state.counts).entry(key.to_string()).or_insert(0) += 1;
    tokio::spawn(async move {
        if let Ok(upgraded) = up.await {
            let mut io = TokioIo::new(upgraded);
            let mut buf = [0u8; 1024];
            loop {
                match io.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if io.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                }
            }
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .body(full(String::new()))
        .unwrap_or_default()
}

/// Control endpoints for out-of-process use.
async fn control(state: &Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let key = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("key="))
        .unwrap_or("default")
        .to_string();
    match path.as_str() {
        "/_fake/script" => {
            #[derive(Deserialize)]
            struct Script {
                key: String,
                steps: Vec<Step>,
            }
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            match serde_json::from_slice::<Script>(&body) {
                Ok(s) => {
                    lock(&state.scripts).insert(s.key, s.steps);
                    json_response(StatusCode::OK, "{}".into())
                }
                Err(e) => json_response(
                    StatusCode::BAD_REQUEST,
                    serde_json::json!({"error": e.to_string()}).to_string(),
                ),
            }
        }
        "/_fake/rate_limit" => {
            #[derive(Deserialize)]
            struct Rate {
                limit: usize,
                window_ms: u64,
            }
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            match serde_json::from_slice::<Rate>(&body) {
                Ok(r) => {
                    *lock(&state.rate) = Some((r.limit, Duration::from_millis(r.window_ms)));
                    json_response(StatusCode::OK, "{}".into())
                }
                Err(e) => json_response(
                    StatusCode::BAD_REQUEST,
                    serde_json::json!({"error": e.to_string()}).to_string(),
                ),
            }
        }
        "/_fake/aws" => {
            #[derive(Deserialize)]
            struct Aws {
                region: Option<String>,
            }
            let body = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            match serde_json::from_slice::<Aws>(&body) {
                Ok(a) => {
                    *lock(&state.aws_region) = a.region;
                    json_response(StatusCode::OK, "{}".into())
                }
                Err(e) => json_response(
                    StatusCode::BAD_REQUEST,
                    serde_json::json!({"error": e.to_string()}).to_string(),
                ),
            }
        }
        "/_fake/count" => {
            let n = lock(&state.counts).get(&key).copied().unwrap_or(0);
            json_response(StatusCode::OK, serde_json::json!({"key": key, "count": n}).to_string())
        }
        "/_fake/requests" => {
            let r = lock(&state.recorded).get(&key).cloned().unwrap_or_default();
            json_response(StatusCode::OK, serde_json::to_string(&r).unwrap_or_default())
        }
        _ => json_response(StatusCode::NOT_FOUND, "{}".into()),
    }
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

pub fn full(s: String) -> Body {
    Full::new(Bytes::from(s))
        .map_err(|never: Infallible| match never {})
        .boxed()
}

pub fn json_response(status: StatusCode, body: String) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("x-request-id", "req_fake_0001")
        .body(full(body))
        .unwrap_or_default()
}

pub fn sse_response(body: Body) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(body)
        .unwrap_or_default()
}

pub fn add_headers(resp: &mut Response<Body>, headers: Vec<(String, String)>) {
    for (k, v) in headers {
        if let (Ok(k), Ok(v)) = (
            http::HeaderName::from_bytes(k.as_bytes()),
            http::HeaderValue::from_str(&v),
        ) {
            resp.headers_mut().append(k, v);
        }
    }
}

/// An error object of this type, as Anthropic (`{"type":"error","error":{..}}`) or OpenAI
/// (`{"error":{..}}`) shapes it.
pub fn error_object(error_type: &str, anthropic: bool) -> String {
    if anthropic {
        format!(r#"{{"type":"error","error":{{"type":"{error_type}","message":"scripted {error_type}"}}}}"#)
    } else {
        format!(r#"{{"error":{{"message":"scripted {error_type}","type":"{error_type}","param":null,"code":null}}}}"#)
    }
}

/// An error event of this type: `event: error` + the object (Anthropic), or `data:` only (OpenAI).
pub fn error_event(error_type: &str, anthropic: bool) -> String {
    let object = error_object(error_type, anthropic);
    if anthropic {
        format!("event: error\ndata: {object}\n\n")
    } else {
        format!("data: {object}\n\n")
    }
}

/// The `i`th event of a chat-completion stream.
pub fn sse_chunk(i: usize) -> String {
    sse_delta(i, "null")
}

/// The `i`th event of a chat-completion stream of `chunks`: the last one carries `finish_reason`,
/// as OpenAI's stream always does (LiteLLM takes a stream without one for a truncated stream).
pub fn sse_chunk_of(i: usize, chunks: usize) -> String {
    sse_delta(i, if i + 1 == chunks { "\"stop\"" } else { "null" })
}

fn sse_delta(i: usize, finish_reason: &str) -> String {
    format!(
        "data: {{\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-fake\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"token{i} \"}},\"finish_reason\":{finish_reason}}}]}}\n\n"
    )
}

pub fn anthropic_event(i: usize) -> String {
    format!(
        "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"token{i} \"}}}}\n\n"
    )
}

/// What an Anthropic stream sends before its first delta (the SDKs' stream helpers need it).
pub fn anthropic_stream_start() -> &'static str {
    concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_fake\",\"type\":\"message\",\"role\":\"assistant\",",
        "\"model\":\"claude-fake\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,",
        "\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    )
}

/// What an Anthropic stream sends after its last delta.
pub fn anthropic_stream_end(chunks: usize) -> String {
    format!(
        "event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":0}}\n\n\
         event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\",\
         \"stop_sequence\":null}},\"usage\":{{\"output_tokens\":{chunks}}}}}\n\n\
         event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
    )
}

/// The exact bytes of a full stream of `chunks` events (for byte-exact assertions).
pub fn sse_stream_bytes(chunks: usize) -> String {
    let mut s: String = (0..chunks).map(|i| sse_chunk_of(i, chunks)).collect();
    s.push_str("data: [DONE]\n\n");
    s
}

/// `ping` every `every` (never when zero) until `think` has passed from now (the response head
/// goes out at once), then the end of this part of the body.
fn thinking(
    think: Duration,
    every: Duration,
    ping: &'static str,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, std::io::Error>> + Send {
    let until = tokio::time::Instant::now() + think;
    futures_util::stream::unfold((), move |()| async move {
        let next = if every.is_zero() {
            until
        } else {
            (tokio::time::Instant::now() + every).min(until)
        };
        tokio::time::sleep_until(next).await;
        (next < until).then(|| (Ok(Frame::data(Bytes::from_static(ping.as_bytes()))), ()))
    })
}

fn sse_stream(
    state: Arc<State>,
    key: String,
    (from, chunks): (usize, usize),
    gap: Duration,
    anthropic: bool,
    include_usage: bool,
) -> Response<Body> {
    let events = sse_events_from(state, key, (from, chunks), gap, anthropic);
    if !include_usage || anthropic {
        return sse_response(BodyExt::boxed(StreamBody::new(events)));
    }
    // The usage chunk goes just before `[DONE]`: in the last frame, ahead of it.
    let events = futures_util::StreamExt::map(events, move |frame| {
        frame.map(|f| match f.into_data() {
            Ok(data) if data.as_ref() == b"data: [DONE]\n\n" => {
                Frame::data(Bytes::from(format!("{}{}", usage_chunk(chunks), "data: [DONE]\n\n")))
            }
            Ok(data) => Frame::data(data),
            Err(f) => f,
        })
    });
    sse_response(BodyExt::boxed(StreamBody::new(events)))
}

/// The usage chunk of a chat stream of `chunks` deltas (`stream_options.include_usage`).
pub fn usage_chunk(chunks: usize) -> String {
    format!(
        "data: {{\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-fake\",\"choices\":[],\"usage\":{{\"prompt_tokens\":12,\"completion_tokens\":{chunks},\"total_tokens\":{}}}}}\n\n",
        12 + chunks
    )
}

/// The events of a normal stream of `chunks` deltas, `gap` apart.
fn sse_events(
    state: Arc<State>,
    key: String,
    chunks: usize,
    gap: Duration,
    anthropic: bool,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, std::io::Error>> + Send {
    sse_events_from(state, key, (0, chunks), gap, anthropic)
}

/// Where a continuation of an answer picks up: after the `tokenN` words of the request's last
/// assistant message (a prefill, or the partial answer of a continuation turn); 0 for a request
/// that carries none.
fn continued_from(request: Option<&serde_json::Value>) -> usize {
    let Some(messages) = request.and_then(|r| r.get("messages")).and_then(|m| m.as_array()) else {
        return 0;
    };
    let Some(assistant) = messages
        .iter()
        .rev()
        .take(2)
        .find(|m| m.get("role").and_then(|r| r.as_str()) == Some("assistant"))
    else {
        return 0;
    };
    let text = match assistant.get("content") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(|t| t.as_str()))
            .collect(),
        _ => String::new(),
    };
    text.matches("token").count()
}

/// The normal stream's events `from..chunks` (the first carries the stream's start).
fn sse_events_from(
    state: Arc<State>,
    key: String,
    (from, chunks): (usize, usize),
    gap: Duration,
    anthropic: bool,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, std::io::Error>> + Send {
    futures_util::stream::unfold(from, move |i| {
        let state = state.clone();
        let key = key.clone();
        async move {
            if i > chunks {
                return None;
            }
            if i > from && !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
            let data = if i == chunks {
                *lock(&state.streams_completed).entry(key).or_insert(0) += 1;
                if anthropic {
                    let start = if chunks == from { anthropic_stream_start() } else { "" };
                    format!("{start}{}", anthropic_stream_end(chunks))
                } else {
                    "data: [DONE]\n\n".to_string()
                }
            } else if anthropic && i == from {
                // One frame, so that the timing of the stream is the same as OpenAI's.
                format!("{}{}", anthropic_stream_start(), anthropic_event(i))
            } else if anthropic {
                anthropic_event(i)
            } else {
                sse_chunk_of(i, chunks)
            };
            Some((Ok::<_, std::io::Error>(Frame::data(Bytes::from(data))), i + 1))
        }
    })
}

/// `events`, one body frame each, `gap` apart (the first at once), as `content_type`; the stream
/// counts as completed when its last event is sent.
fn listed_events(
    state: Arc<State>,
    key: String,
    events: Vec<String>,
    gap: Duration,
    content_type: &'static str,
) -> Response<Body> {
    let last = events.len();
    let stream = futures_util::stream::unfold((events.into_iter(), 0usize), move |(mut events, i)| {
        let state = state.clone();
        let key = key.clone();
        async move {
            let event = events.next()?;
            if i > 0 && !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
            if i + 1 == last {
                *lock(&state.streams_completed).entry(key).or_insert(0) += 1;
            }
            Some((
                Ok::<_, std::io::Error>(Frame::data(Bytes::from(event))),
                (events, i + 1),
            ))
        }
    });
    let mut resp = sse_response(BodyExt::boxed(StreamBody::new(stream)));
    resp.headers_mut()
        .insert("content-type", http::HeaderValue::from_static(content_type));
    resp
}

/// A ~1 KB OpenAI chat completion.
pub fn chat_completion() -> String {
    let content = "rebound ".repeat(96);
    format!(
        r#"{{"id":"chatcmpl-fake","object":"chat.completion","created":1700000000,"model":"gpt-fake","choices":[{{"index":0,"message":{{"role":"assistant","content":"{content}"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":12,"completion_tokens":96,"total_tokens":108}}}}"#
    )
}

/// An Anthropic message of similar size.
pub fn anthropic_message() -> String {
    let content = "rebound ".repeat(96);
    format!(
        r#"{{"id":"msg_fake","type":"message","role":"assistant","model":"claude-fake","content":[{{"type":"text","text":"{content}"}}],"stop_reason":"end_turn","usage":{{"input_tokens":12,"output_tokens":96}}}}"#
    )
}
