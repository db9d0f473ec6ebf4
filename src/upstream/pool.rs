//! One upstream's connections, on hyper's connection-level client (`hyper::client::conn`).
//!
//! Why not hyper-util's pooled `Client`: for every HTTP/1 response with a body it spawns a task
//! that waits for the connection to be reusable, and every request goes through its keyed pool
//! and checkout machinery. Here the response body itself hands its connection back when its last
//! frame arrives, and a checkout is a `Vec::pop` under an uncontended lock. Measured on the
//! forward path (`bench/`), this is about a third of rebound's user CPU per request.
//!
//! - HTTP/1.1 connections are exclusive: idle ones wait in a LIFO stack (the most recently used
//!   first, the warmest), at most [`MAX_IDLE`] per worker, and those idle longer than
//!   [`IDLE_TIMEOUT`] are dropped when the stack is next touched. An idle connection the upstream
//!   closes ends on its own (its task reads the EOF).
//! - HTTP/2 (negotiated by ALPN) is shared: one connection per worker multiplexes every request
//!   until it closes; then the next request opens another.
//! - Each worker (src/workers.rs) has its own idle stack and HTTP/2 connection: a connection's
//!   task runs on the worker that opened it, and a request sent on it from another thread would
//!   wake that thread twice.
//! - A request that could not be written because a reused connection had closed in the meantime
//!   is sent again on another connection (hyper hands it back unsent, so this is safe for every
//!   method). It is invisible to the retry engine, like hyper-util's own "canceled" replay.

use futures_util::FutureExt;
use parking_lot::Mutex;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2, TrySendError};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connection as _, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::time::Instant;
use tower_service::Service as _;

use super::{refused_stream, AttemptError};
use crate::wire::eventstream::ToSse;

type ReqBody = Full<Bytes>;
type H1 = http1::SendRequest<ReqBody>;
type H2 = http2::SendRequest<ReqBody>;

/// Idle HTTP/1.1 connections kept per upstream, at most.
pub(crate) const MAX_IDLE: usize = 512;
/// How long an idle connection is kept.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The connections to one upstream.
pub(crate) struct Pool {
    connector: HttpsConnector<HttpConnector>,
    /// `scheme://authority`: what the connector dials.
    origin: Uri,
    /// The `host` header of HTTP/1.1 requests: the authority, without a default port.
    host: HeaderValue,
    /// One per worker (src/workers.rs), never none: a connection's task runs on the worker that
    /// opened it, and only that worker sends on it.
    shards: Box<[Shard]>,
    /// HTTP/2 PING interval and ack timeout (the upstream's `keepalive`).
    keepalive: Option<Duration>,
}

/// The connections one worker sends on.
#[derive(Default)]
struct Shard {
    idle: Mutex<Vec<Idle>>,
    h2: Mutex<Option<H2>>,
}

struct Idle {
    sender: H1,
    since: Instant,
}

enum Sender {
    H1(H1),
    H2(H2),
}

impl Pool {
    pub(crate) fn new(
        connector: HttpsConnector<HttpConnector>,
        origin: Uri,
        host: HeaderValue,
        keepalive: Option<Duration>,
    ) -> Pool {
        Pool {
            connector,
            origin,
            host,
            shards: (0..crate::workers::count().max(1)).map(|_| Shard::default()).collect(),
            keepalive,
        }
    }

    /// Sends `req` (its URI in origin form) and waits for the response head.
    ///
    /// An `async` block, not an `async fn`: an `async fn` would keep the request twice in its
    /// future (as passed, and as the `mut` binding), and every request in flight holds this future.
    #[allow(clippy::manual_async_fn)] // on purpose: see above
    pub(crate) fn send(
        self: &Arc<Self>,
        mut req: Request<ReqBody>,
    ) -> impl std::future::Future<Output = Result<Response<UpstreamBody>, AttemptError>> + Send + '_ {
        async move {
            let index = crate::workers::current() % self.shards.len();
            let shard = &self.shards[index];
            loop {
                let (sender, reused) = match self.checkout(shard).await {
                    Some(s) => (s, true),
                    // Boxed: the connect future (TLS, HTTP/2 handshake) is large and rare; inline,
                    // every request's future would carry it and be copied around with it.
                    None => (Box::pin(self.connect(shard)).await?, false),
                };
                let sent = match sender {
                    Sender::H2(mut h2) => {
                        // HTTP/2 takes the scheme and authority as pseudo-headers, from an absolute URI.
                        if req.uri().scheme().is_none() {
                            *req.uri_mut() = self.absolute(req.uri());
                        }
                        let sent = h2.try_send_request(req).await;
                        if sent.as_ref().is_err_and(|e| e.message().is_some()) {
                            // The shared connection is going away: the next request opens another.
                            shard.h2.lock().take();
                        }
                        sent.map(|resp| resp.map(|body| UpstreamBody::new(body, None)))
                    }
                    Sender::H1(mut h1) => {
                        // HTTP/1.1 takes the origin form and a `host` header.
                        req.headers_mut().insert(http::header::HOST, self.host.clone());
                        let sent = h1.try_send_request(req).await;
                        sent.map(|resp| resp.map(|body| UpstreamBody::new(body, Some((self.clone(), index, h1)))))
                    }
                };
                match sent {
                    Ok(resp) => return Ok(resp),
                    Err(e) => req = Pool::unsent(e, reused)?,
                }
            }
        }
    }

    /// `target` (origin form) on this upstream, as an absolute URI.
    fn absolute(&self, target: &Uri) -> Uri {
        let mut parts = http::uri::Parts::default();
        parts.scheme = self.origin.scheme().cloned();
        parts.authority = self.origin.authority().cloned();
        parts.path_and_query = target.path_and_query().cloned();
        Uri::from_parts(parts).unwrap_or_else(|_| target.clone())
    }

    /// A failed send: the request back when it was never written on a reused connection (the
    /// upstream had closed it while it was idle), else the attempt's error.
    fn unsent(mut e: TrySendError<Request<ReqBody>>, reused: bool) -> Result<Request<ReqBody>, AttemptError> {
        match e.take_message() {
            Some(req) if reused => {
                tracing::debug!(error = %e.error(), "pooled connection closed before the request was written; resending");
                Ok(req)
            }
            _ => {
                let err = e.into_error();
                Err(if refused_stream(&err) {
                    AttemptError::RefusedStream(Box::new(err))
                } else {
                    AttemptError::Reset(Box::new(err))
                })
            }
        }
    }

    /// A reusable connection: the shared HTTP/2 one, else the most recently idle HTTP/1.1 one.
    async fn checkout(&self, shard: &Shard) -> Option<Sender> {
        {
            let mut h2 = shard.h2.lock();
            match h2.as_ref() {
                Some(s) if !s.is_closed() => return Some(Sender::H2(s.clone())),
                Some(_) => *h2 = None,
                None => {}
            }
        }
        loop {
            let Idle { mut sender, since } = shard.idle.lock().pop()?;
            if since.elapsed() >= IDLE_TIMEOUT {
                continue;
            }
            // Ready at once, unless its connection task has yet to finish the previous exchange;
            // an error means the upstream closed it.
            if sender.ready().await.is_ok() {
                return Some(Sender::H1(sender));
            }
        }
    }

    /// Puts an HTTP/1.1 connection back after its response ended.
    fn checkin(&self, index: usize, sender: H1) {
        let Some(shard) = self.shards.get(index) else { return };
        if sender.is_closed() {
            return;
        }
        let now = crate::time::now();
        let mut idle = shard.idle.lock();
        // The bottom of the stack is the longest idle: expire from there.
        let expired = idle
            .iter()
            .take_while(|i| now.duration_since(i.since) >= IDLE_TIMEOUT)
            .count();
        idle.drain(..expired);
        if idle.len() < MAX_IDLE {
            idle.push(Idle { sender, since: now });
        }
    }

    /// Opens a connection (TCP, TLS with ALPN), and speaks HTTP/2 on it if the upstream chose it.
    async fn connect(&self, shard: &Shard) -> Result<Sender, AttemptError> {
        let io = self
            .connector
            .clone()
            .call(self.origin.clone())
            .await
            .map_err(AttemptError::Connect)?;
        if io.connected().is_negotiated_h2() {
            let mut builder = http2::Builder::new(TokioExecutor::new());
            builder.timer(TokioTimer::new());
            // PINGs while a request is in flight, after `keepalive` without a frame from the
            // provider: the peer's HTTP/2 stack acks them whatever its model is doing, so only a
            // dead connection misses the ack, and fails its requests as resets (retried per
            // policy). Not while idle: some servers answer pings on an idle connection with
            // GOAWAY, and the socket's TCP keepalive finds an idle connection's death anyway.
            if let Some(keepalive) = self.keepalive {
                builder
                    .keep_alive_interval(keepalive)
                    .keep_alive_timeout(keepalive)
                    .keep_alive_while_idle(false);
            }
            let (sender, conn) = builder
                .handshake(io)
                .await
                .map_err(|e| AttemptError::Connect(Box::new(e)))?;
            crate::tasks::spawn("upstream h2 connection", conn.map(ended));
            *shard.h2.lock() = Some(sender.clone());
            Ok(Sender::H2(sender))
        } else {
            let (sender, conn) = http1::Builder::new()
                .handshake(io)
                .await
                .map_err(|e| AttemptError::Connect(Box::new(e)))?;
            crate::tasks::spawn("upstream h1 connection", conn.map(ended));
            Ok(Sender::H1(sender))
        }
    }
}

/// How an upstream connection's task (its reads and writes, until it closes) ends. The task is
/// the connection mapped by this, not an `async fn` awaiting it: that would hold the connection
/// twice (as its argument and as the future it awaits), 3.7 KiB instead of 1.9 for every upstream
/// connection, idle or streaming.
fn ended(result: hyper::Result<()>) {
    if let Err(e) = result {
        tracing::debug!(error = %e, "upstream connection ended with an error");
    }
}

/// An upstream response body. An HTTP/1.1 body returns its connection to the pool as soon as
/// its last frame is in; a body dropped before its end takes the connection with it (hyper
/// closes it: the rest of the response can never be read). A Bedrock event stream the app reads
/// as Anthropic's SSE is re-framed as it is read ([`UpstreamBody::reframe`]).
pub(crate) struct UpstreamBody {
    inner: Incoming,
    /// The pool, and the index of the shard, an HTTP/1.1 connection goes back to.
    give_back: Option<(Arc<Pool>, usize, H1)>,
    /// Boxed: rare, and every request in flight holds this body. With the buffer the re-framed
    /// bytes are written in and go out from (its room reclaimed once the frames before are
    /// written and dropped: no allocation per frame).
    reframe: Option<Box<(ToSse, BytesMut)>>,
    /// What the response holds until its last frame is in (or it is dropped): a request's place
    /// under its upstream's `concurrency` limit.
    held: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl UpstreamBody {
    fn new(inner: Incoming, give_back: Option<(Arc<Pool>, usize, H1)>) -> UpstreamBody {
        let mut body = UpstreamBody {
            inner,
            give_back,
            reframe: None,
            held: None,
        };
        if body.inner.is_end_stream() {
            body.done();
        }
        body
    }

    /// From now on the body is read as Bedrock's event stream and yields the Anthropic SSE it
    /// carries (`wire::eventstream`).
    pub(crate) fn reframe(&mut self) {
        self.reframe = Some(Box::default());
    }

    fn done(&mut self) {
        self.held = None;
        if let Some((pool, shard, sender)) = self.give_back.take() {
            pool.checkin(shard, sender);
        }
    }

    /// Keeps `held` until the body's last frame is in, or it is dropped (at once when it has
    /// ended already).
    pub(crate) fn hold_until_end(&mut self, held: Box<dyn std::any::Any + Send + Sync>) {
        if !self.inner.is_end_stream() {
            self.held = Some(held);
        }
    }

    /// The inner body's next frame, with the connection given back at its end.
    #[inline]
    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.done(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.done(),
            Poll::Ready(Some(Err(_))) => {
                self.give_back = None;
                self.held = None;
            }
            _ => {}
        }
        polled
    }

    /// The next frame of a re-framed Bedrock stream: the SSE the inner body's frames complete.
    /// Apart from [`Body::poll_frame`], which stays small for every other body.
    #[inline(never)]
    fn poll_reframed(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self;
        loop {
            if this.reframe.as_deref().is_none_or(|(sse, _)| sse.is_done()) {
                return Poll::Ready(None);
            }
            let polled = std::task::ready!(this.poll_inner(cx));
            let Some((sse, out)) = this.reframe.as_deref_mut() else {
                return Poll::Ready(None);
            };
            match polled {
                None => {
                    sse.end(out);
                    let last = (!out.is_empty()).then(|| Ok(Frame::data(out.split().freeze())));
                    // Ended: later polls read the (ended) inner body.
                    this.reframe = None;
                    return Poll::Ready(last);
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => sse.feed(&data, out),
                    Err(_) => continue, // trailers: nothing the app reads
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
            }
            if !out.is_empty() {
                let frame = Frame::data(out.split().freeze());
                if frame.data_ref().is_some_and(|d| d.len() > 64 << 10) {
                    *out = BytesMut::new(); // a rare large frame does not keep its room
                }
                return Poll::Ready(Some(Ok(frame)));
            }
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        match this.reframe {
            None => this.poll_inner(cx),
            Some(_) => this.poll_reframed(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self.reframe.as_deref() {
            Some((sse, _)) => sse.is_done(),
            None => self.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.reframe {
            Some(_) => SizeHint::default(),
            None => self.inner.size_hint(),
        }
    }
}

/// `host` for HTTP/1.1: the authority, without the scheme's default port (as hyper-util sets it).
pub(crate) fn host_header(scheme: &http::uri::Scheme, authority: &http::uri::Authority) -> Option<HeaderValue> {
    let default_port = if *scheme == http::uri::Scheme::HTTPS { 443 } else { 80 };
    let host = match authority.port_u16() {
        Some(port) if port != default_port => authority.as_str(),
        _ => authority.host(),
    };
    HeaderValue::from_str(host).ok()
}
