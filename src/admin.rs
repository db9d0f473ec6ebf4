//! The admin listener: `/healthz` (alive), `/readyz` (ready to take traffic; 503 while draining),
//! `/metrics` (Prometheus text). `/admin/*` (dead letters) arrives with its own issue.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;
use crate::redis::RedisHandle;

/// What the admin endpoints report on.
pub struct AdminState {
    pub metrics: Arc<Metrics>,
    /// Set when shutdown starts: `/readyz` turns 503.
    pub draining: AtomicBool,
    pub redis: Option<RedisHandle>,
}

/// Serves admin requests until `stop` is cancelled.
pub async fn serve(listener: TcpListener, state: Arc<AdminState>, stop: CancellationToken) {
    let conns = TaskTracker::new();
    loop {
        let tcp = tokio::select! {
            r = listener.accept() => match r {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let state = state.clone();
        let stop = stop.clone();
        conns.spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(handle(&state, req)) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(tcp), svc);
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
    }
    conns.close();
    conns.wait().await;
}

fn handle(state: &AdminState, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    match req.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" => {
            if state.draining.load(Ordering::SeqCst) {
                return text(StatusCode::SERVICE_UNAVAILABLE, "draining\n");
            }
            // Redis is not a readiness condition: rebound serves without it (each feature
            // degrades as configured), so a Redis outage must not pull every pod out of service.
            let body = match &state.redis {
                Some(r) if !r.is_up() => "ready (redis: unreachable)\n",
                Some(_) => "ready (redis: up)\n",
                None => "ready\n",
            };
            text(StatusCode::OK, body)
        }
        "/metrics" => {
            let mut resp = Response::new(Full::new(Bytes::from(state.metrics.render())));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            resp
        }
        _ => text(StatusCode::NOT_FOUND, "not found: try /healthz, /readyz or /metrics\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}
