//! The floor for a hyper-based proxy, as a benchmark target (`bench/run --targets hyper-floor`).
//!
//! The same building blocks rebound forwards with (hyper's HTTP/1.1 server on a current-thread
//! tokio runtime, hyper's connection-level client, a LIFO stack of idle upstream connections
//! given back by the response body) and nothing else: no routing table, retries, breakers,
//! timers, metrics, logs or header hygiene. What it costs per request is what any proxy built on
//! hyper costs before it does any work of its own; rebound's figure minus this one is what its
//! features cost. (It is standalone on purpose, not built on rebound's own pool: that pool's
//! connector, TLS-capable, would already be part of what is measured.)
//!
//! ```sh
//! cargo run --release --example hyper-floor -- --listen 127.0.0.1:18082 --upstream 127.0.0.1:19000
//! ```
//! Forwards `POST /fake/<path>` to `http://<upstream>/<path>`.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the clock and lock rules are the product's: harnesses measure real time and keep their own fixtures
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Sender = SendRequest<Full<Bytes>>;

struct Pool {
    upstream: SocketAddr,
    host: HeaderValue,
    idle: Mutex<Vec<Sender>>,
}

impl Pool {
    async fn checkout(&self) -> Result<Sender, BoxError> {
        loop {
            let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match idle {
                Some(mut sender) => {
                    if sender.ready().await.is_ok() {
                        return Ok(sender);
                    }
                }
                None => {
                    let tcp = TcpStream::connect(self.upstream).await?;
                    tcp.set_nodelay(true)?;
                    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
                    tokio::spawn(conn);
                    return Ok(sender);
                }
            }
        }
    }

    fn checkin(&self, sender: Sender) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(sender);
    }
}

/// The upstream body; gives the connection back after its last frame.
struct Pooled {
    inner: Incoming,
    back: Option<(Arc<Pool>, Sender)>,
}

impl Pooled {
    fn give_back(&mut self) {
        if let Some((pool, sender)) = self.back.take() {
            pool.checkin(sender);
        }
    }
}

impl Body for Pooled {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.give_back(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.give_back(),
            Poll::Ready(Some(Err(_))) => self.back = None,
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

type RespBody = UnsyncBoxBody<Bytes, BoxError>;

async fn forward(pool: Arc<Pool>, req: Request<Incoming>) -> Result<Response<RespBody>, BoxError> {
    let (mut parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let path = parts.uri.path().strip_prefix("/fake").unwrap_or("/");
    let target = match parts.uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    parts.uri = target.parse::<Uri>()?;
    parts.headers.insert(http::header::HOST, pool.host.clone());
    let mut sender = pool.checkout().await?;
    let resp = sender.send_request(Request::from_parts(parts, Full::new(body))).await?;
    let (head, inner) = resp.into_parts();
    let body = Pooled {
        inner,
        back: Some((pool, sender)),
    };
    Ok(Response::from_parts(head, body.map_err(BoxError::from).boxed_unsync()))
}

fn bad_gateway(e: &BoxError) -> Response<RespBody> {
    let mut resp = Response::new(
        Full::new(Bytes::from(e.to_string()))
            .map_err(|never: Infallible| -> BoxError { match never {} })
            .boxed_unsync(),
    );
    *resp.status_mut() = StatusCode::BAD_GATEWAY;
    resp
}

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let listen: SocketAddr = arg("--listen", "127.0.0.1:18082").parse()?;
    let upstream: SocketAddr = arg("--upstream", "127.0.0.1:19000").parse()?;
    let pool = Arc::new(Pool {
        upstream,
        host: HeaderValue::from_str(&upstream.to_string())?,
        idle: Mutex::new(Vec::new()),
    });
    let listener = TcpListener::bind(listen).await?;
    loop {
        let (tcp, _) = listener.accept().await?;
        tcp.set_nodelay(true)?;
        let pool = pool.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let pool = pool.clone();
                async move { Ok::<_, Infallible>(forward(pool, req).await.unwrap_or_else(|e| bad_gateway(&e))) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}
