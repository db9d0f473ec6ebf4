//! The admin listener: `/healthz` (alive), `/readyz` (ready to take traffic; 503 while draining),
//! `/metrics` (Prometheus text), and `/admin/*` behind `Authorization: Bearer <[admin] token>`
//! (off when the token is empty):
//!
//! | method and path | does |
//! | --- | --- |
//! | `GET /admin/dead-letters?route=&reason=&upstream=&since=&limit=&cursor=` | list, newest first |
//! | `GET /admin/dead-letters/summary?route=&reason=&upstream=&since=` | groups by cause, with timelines and analysis |
//! | `GET /admin/dead-letters/{id}` | one entry |
//! | `POST /admin/dead-letters/{id}/replay` | re-send one entry through its route |
//! | `POST /admin/dead-letters/replay?route=&reason=&upstream=&since=&group=` | replay every match |
//! | `POST /admin/dead-letters/replay?...&dry_run=true` | what a replay would send |
//! | `GET /admin/fleet` | the fleet now (the console's view) |
//!
//! and `GET /console`, the operator's console ([`crate::console`]), served when a token is set.
//! | `DELETE /admin/dead-letters?route=&reason=&upstream=&since=` | purge (all, or matching) |

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::dead_letters::{DeadLetter, DeadLetters, Filter, ReplayRecord};
use crate::error::ErrorKind;
use crate::metrics::Metrics;
use crate::proxy::Proxy;
use crate::redis::RedisHandle;
use crate::time;

/// What the admin endpoints report on and act on.
pub(crate) struct AdminState {
    pub metrics: Arc<Metrics>,
    /// Set when shutdown starts: `/readyz` turns 503.
    pub draining: AtomicBool,
    pub redis: Option<RedisHandle>,
    /// `None`: `/admin/*` is disabled.
    pub token: Option<String>,
    pub dead_letters: DeadLetters,
    /// The running proxy (replays go through it).
    pub proxy: Arc<ArcSwap<Proxy>>,
    /// What happened lately (the analysis and the console read it).
    pub(crate) journal: Arc<crate::journal::Journal>,
}

/// Serves admin requests until `stop` is cancelled.
pub(crate) async fn serve(listener: TcpListener, state: Arc<AdminState>, stop: CancellationToken) {
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
                async move { Ok::<_, Infallible>(handle(&state, req).await) }
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

async fn handle(state: &AdminState, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    if let Some(rest) = path.strip_prefix("/admin/") {
        return admin_api(state, rest, req).await;
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    if let Some(resp) = crate::console::asset(&path, state.token.is_some()) {
        return resp;
    }
    match path.as_str() {
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" => {
            if state.draining.load(Ordering::SeqCst) {
                return text(StatusCode::SERVICE_UNAVAILABLE, "draining\n");
            }
            // Redis is not a readiness condition: rebound serves without it (each feature
            // degrades as configured), so a Redis outage must not pull every pod out of service.
            let body = match &state.redis {
                Some(r) => format!("ready ({})\n", r.status()),
                None => "ready\n".to_string(),
            };
            text(StatusCode::OK, body)
        }
        "/metrics" => {
            let proxy = state.proxy.load();
            proxy.refresh_target_states(crate::time::now());
            proxy.refresh_cache_usage();
            let mut resp = Response::new(Full::new(Bytes::from(state.metrics.render())));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            resp
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /healthz, /readyz, /metrics, /console or /admin/dead-letters\n",
        ),
    }
}

async fn admin_api(state: &AdminState, rest: &str, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let Some(token) = &state.token else {
        return problem(ErrorKind::AdminDisabled, "the admin API is disabled: set [admin] token");
    };
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !constant_time_eq(presented.as_bytes(), token.as_bytes()) {
        let mut resp = problem(
            ErrorKind::AdminUnauthorized,
            "send Authorization: Bearer <[admin] token>",
        );
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
        return resp;
    }
    let filter = parse_filter(req.uri().query());
    let query = |name: &str| query_param(req.uri().query(), name);
    let dl = &state.dead_letters;
    let segments: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    let result = match (req.method().clone(), segments.as_slice()) {
        (Method::GET, ["dead-letters"]) => {
            let limit = query("limit").and_then(|l| l.parse().ok()).unwrap_or(50);
            let cursor = query("cursor");
            dl.list(&filter, limit, cursor.as_deref())
                .await
                .map(|p| json(StatusCode::OK, &p))
        }
        (Method::GET, ["dead-letters", "summary"]) => crate::console::summary(dl, &state.journal, &filter)
            .await
            .map(|s| json(StatusCode::OK, &s)),
        (Method::GET, ["fleet"]) => Ok(json(
            StatusCode::OK,
            &crate::console::fleet(&state.journal, state.redis.is_some()),
        )),
        (Method::POST, ["dead-letters", "replay"]) if query("dry_run").is_some_and(|v| v == "true") => {
            crate::console::replay_plan(dl, &filter)
                .await
                .map(|p| json(StatusCode::OK, &p))
        }
        (Method::GET, ["dead-letters", id]) => dl.get(id).await.map(|e| match e {
            Some(e) => json(StatusCode::OK, &e),
            None => problem(ErrorKind::AdminNotFound, "no dead letter with this id"),
        }),
        (Method::POST, ["dead-letters", "replay"]) => replay_matching(state, &filter).await,
        (Method::POST, ["dead-letters", id, "replay"]) => match dl.get(id).await {
            Ok(Some(e)) => Ok(json(StatusCode::OK, &replay(state, e).await)),
            Ok(None) => Ok(problem(ErrorKind::AdminNotFound, "no dead letter with this id")),
            Err(e) => Err(e),
        },
        (Method::DELETE, ["dead-letters"]) => dl
            .purge(&filter)
            .await
            .map(|n| json(StatusCode::OK, &serde_json::json!({ "purged": n }))),
        _ => Ok(problem(
            ErrorKind::AdminNotFound,
            "unknown admin path; see docs/dead-letters.md",
        )),
    };
    result.unwrap_or_else(|e| problem(ErrorKind::DeadLetterStoreUnavailable, &e.to_string()))
}

/// What one replay did.
#[derive(Debug, Serialize)]
pub(crate) struct ReplayOutcome {
    pub id: String,
    /// The status the replay got (0 when it could not be sent).
    pub status: u16,
    /// Answered from the idempotency store: the original had succeeded meanwhile.
    pub from_store: bool,
    pub error: Option<String>,
}

async fn replay_matching(
    state: &AdminState,
    filter: &Filter,
) -> Result<Response<Full<Bytes>>, crate::dead_letters::DeadLetterError> {
    let mut outcomes = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = state.dead_letters.list(filter, 200, cursor.as_deref()).await?;
        for e in page.items {
            outcomes.push(replay(state, e).await);
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    // Sent (whatever the answer) or skipped (could not be sent, and why).
    let ok = outcomes.iter().filter(|o| (200..300).contains(&o.status)).count();
    let mut skipped: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for o in &outcomes {
        if let Some(why) = &o.error {
            *skipped.entry(why.as_str()).or_default() += 1;
        }
    }
    let skipped_count: usize = skipped.values().sum();
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({
            "replayed": outcomes.len() - skipped_count,
            "succeeded": ok,
            "skipped": skipped_count,
            "skipped_reasons": skipped,
            "results": outcomes,
        }),
    ))
}

/// Re-sends an entry through its route's normal pipeline (retries, circuit, idempotency with the
/// original key and tenant scope) and records the outcome on the entry.
async fn replay(state: &AdminState, entry: DeadLetter) -> ReplayOutcome {
    let id = entry.id.clone();
    if !entry.replayable() {
        return ReplayOutcome {
            id,
            status: 0,
            from_store: false,
            error: Some(
                entry
                    .body_missing
                    .clone()
                    .unwrap_or_else(|| "the request body was not kept".into()),
            ),
        };
    }
    let uri = match &entry.query {
        Some(q) => format!("{}?{q}", entry.path),
        None => entry.path.clone(),
    };
    let mut builder = Request::builder().method(entry.method.as_str()).uri(uri);
    for (k, v) in &entry.headers {
        builder = builder.header(k.as_str(), v.as_str());
    }
    let mut req = match builder.body(Full::new(entry.body().unwrap_or_default())) {
        Ok(r) => r,
        Err(e) => {
            return ReplayOutcome {
                id,
                status: 0,
                from_store: false,
                error: Some(e.to_string()),
            }
        }
    };
    if let Some(identity) = &entry.idempotency {
        req.extensions_mut().insert(identity.clone());
    }
    req.extensions_mut().insert(crate::dead_letters::OperatorReplay);
    let proxy = state.proxy.load_full();
    let resp = proxy.handle(req).await;
    let status = resp.status().as_u16();
    let from_store = resp
        .headers()
        .get(crate::wire::headers::IDEMPOTENT_REPLAYED)
        .is_some_and(|v| v == "true");
    // Read the response to its end: that is what completes its idempotency record.
    let _ = resp.into_body().collect().await;
    let at_ms = time::now_unix_ms();
    if let Err(e) = state
        .dead_letters
        .record_replay(
            &id,
            ReplayRecord {
                at_ms,
                status,
                from_store,
            },
        )
        .await
    {
        tracing::warn!(error = %e, "replay outcome not recorded");
    }
    tracing::info!(dead_letter = %id, route = %entry.route, status, from_store, "dead letter replayed");
    ReplayOutcome {
        id,
        status,
        from_store,
        error: None,
    }
}

fn parse_filter(query: Option<&str>) -> Filter {
    let since = query_param(query, "since").and_then(|s| {
        s.parse::<u64>().ok().or_else(|| {
            crate::retry::retry_after::parse_rfc3339(&s)
                .filter(|t| *t >= std::time::UNIX_EPOCH)
                .map(time::unix_ms)
        })
    });
    Filter {
        route: query_param(query, "route"),
        reason: query_param(query, "reason"),
        upstream: query_param(query, "upstream"),
        since,
        group: query_param(query, "group"),
    }
}

/// A query parameter, percent-decoded; empty values count as absent.
fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == name && !v.is_empty()).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let escaped = (b[i] == b'%' && i + 3 <= b.len())
            .then(|| {
                std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
            })
            .flatten();
        match (escaped, b[i]) {
            (Some(byte), _) => {
                out.push(byte);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, byte) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Compares a presented token with the configured one in time that depends on neither: both are
/// hashed (SHA-256, so their lengths do not show either) and the digests compared with `subtle`.
fn constant_time_eq(presented: &[u8], token: &[u8]) -> bool {
    use sha2::Digest as _;
    use subtle::ConstantTimeEq as _;
    let (a, b) = (sha2::Sha256::digest(presented), sha2::Sha256::digest(token));
    a.as_slice().ct_eq(b.as_slice()).into()
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    resp
}

fn problem(kind: ErrorKind, message: &str) -> Response<Full<Bytes>> {
    crate::error::problem_response(kind, message, None, |body| Full::new(Bytes::from(body)))
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_params_are_decoded() {
        assert_eq!(
            query_param(Some("route=openai&reason=retries_exhausted"), "reason").as_deref(),
            Some("retries_exhausted")
        );
        assert_eq!(query_param(Some("a=x%20y&b=1"), "a").as_deref(), Some("x y"));
        assert_eq!(query_param(Some("a=&b=1"), "a"), None);
        assert_eq!(query_param(None, "a"), None);
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%4"), "%4");
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
