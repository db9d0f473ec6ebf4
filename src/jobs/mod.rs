//! Async jobs, the queue + worker pattern: a request to a route with `async = true` that carries
//! `Prefer: respond-async` (RFC 7240) is queued and answered at once, `202 Accepted` with
//! `Location: /jobs/{id}`; a worker runs it later through the route's normal pipeline (retries,
//! circuit, idempotency, dead letters) and keeps the response for `GET /jobs/{id}/result`.
//!
//! - **Identity.** With the route's idempotency key, the job id is a hash of the route, the tenant
//!   scope and the key: the same key from the same credential never enqueues twice (the second
//!   submission gets the first job's id and state; another request under the same key gets 422).
//!   Without one, the id is random. Only the credential that submitted a job can read it.
//! - **Storage.** With `[redis]`: a Stream and consumer group shared by the fleet, job records in
//!   TTL'd hashes ([`redis_queue`]), the request's credentials sealed with `[jobs] secret`
//!   ([`seal`]). Without: a bounded queue in memory ([`memory`]), lost on restart.
//! - **Workers.** `[jobs] workers` per process. A job is taken with an owner token
//!   (compare-and-set), so one worker owns it; while it runs its owner heartbeats; a worker that
//!   dies stops heartbeating and, after `visibility_timeout`, another replica reclaims the job
//!   (XAUTOCLAIM) and runs it again: the job's idempotency key (when it has one) answers from the
//!   store if the first run had completed upstream. A job whose workers die [`MAX_RUNS`] times is
//!   failed as abandoned.
//! - **Outcome.** 2xx/3xx: `succeeded`; anything else: `failed`, with the response kept as it came.
//!   A failure for good is a dead letter on routes with `dead_letters = true` (the pipeline
//!   records it, with the job id). An optional callback POSTs the result ([`callback`]).
//! - **Bounds.** `max_queue` unfinished jobs (503 `queue_full` beyond it), `max_result_body` per
//!   result, `workers` concurrent runs per process; every task is owned by the server's background
//!   tracker and stops at shutdown (a job cut short there is reclaimed by another replica).

pub mod callback;
pub mod memory;
pub mod record;
pub mod redis_queue;
pub mod seal;

use std::future::pending;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, Limited};
use rand::Rng as _;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, JobsConfig};
use crate::error::error_response;
use crate::error::ProxyError;
use crate::idempotency::fingerprint::{self, digest};
use crate::idempotency::Idempotency;
use crate::metrics::Metrics;
use crate::redis::RedisHandle;
use crate::wire::body::{Delivered, ProxyBody, RequestLog};
use crate::wire::headers as hygiene;
use callback::Callbacks;
use memory::MemoryQueue;
use record::{CallbackView, Finished, JobResult, JobState, NewJob, StoredRequest, Submitted};
use redis_queue::{ReadError, RedisQueue, Start};
use seal::Sealer;

/// A job whose workers died this many times is failed as abandoned (a poison job must not take
/// the fleet down one replica after another).
pub const MAX_RUNS: u32 = 5;

/// The request header naming a callback URL.
pub const CALLBACK_HEADER: &str = "x-rebound-callback";

/// The headers a job's access is scoped by: only the credential that submitted it reads it.
const ACCESS_HEADERS: [&str; 3] = crate::circuit::CREDENTIAL_HEADERS;

/// Response headers kept with a result, beyond the idempotency store's allowlist.
const RESULT_HEADERS: [&str; 4] = [
    "x-rebound-error",
    "x-rebound-upstream",
    "idempotent-replayed",
    "retry-after",
];

/// Longest block of one XREADGROUP.
const READ_BLOCK: Duration = Duration::from_secs(2);
/// Pause after a Redis failure in the reader.
const REDIS_BACKOFF: Duration = Duration::from_secs(1);
/// How often consumers of departed processes are looked for, and how idle they must be.
const DEPARTED_EVERY: Duration = Duration::from_secs(300);
const DEPARTED_IDLE: Duration = Duration::from_secs(3600);

/// The request pipeline as the job workers see it. Jobs defines it and the server injects it (the
/// proxy implements it), so that the dependency runs one way: the pipeline uses jobs, never the
/// reverse. A run answers like any request; its [`Delivered`] extension says what it cost.
pub trait Pipeline: Send + Sync + 'static {
    /// Runs `req` through the pipeline of the configuration in force now.
    fn run(&self, req: Request<Full<Bytes>>) -> BoxFuture<'static, Response<ProxyBody>>;
}

/// Marks a request run by a job worker (it is never queued again; dead letters name the job).
#[derive(Debug, Clone)]
pub struct JobRun(pub String);

/// Whether `path` is the job API's (`/jobs/...`).
pub fn is_api_path(path: &str) -> bool {
    path.starts_with("/jobs/")
}

/// Whether the request asks to be answered asynchronously (`Prefer: respond-async`, among any
/// other preferences, in any of several `Prefer` headers) and is not a job's own run.
pub fn wants_async(parts: &http::request::Parts) -> bool {
    parts.extensions.get::<JobRun>().is_none() && prefers_async(&parts.headers)
}

fn preferences(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').filter(|p| !p.trim().is_empty())
}

fn preference_token(pref: &str) -> &str {
    pref.split([';', '=']).next().unwrap_or("").trim()
}

/// RFC 7240: `Prefer` holds comma-separated preferences, each `token [= value] *(; param)`.
pub fn prefers_async(headers: &HeaderMap) -> bool {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(preferences)
        .any(|p| preference_token(p).eq_ignore_ascii_case("respond-async"))
}

/// A `Prefer` value without `respond-async` (`None` when nothing else is left).
fn without_respond_async(value: &str) -> Option<String> {
    let rest: Vec<&str> = preferences(value)
        .filter(|p| !preference_token(p).eq_ignore_ascii_case("respond-async"))
        .map(str::trim)
        .collect();
    (!rest.is_empty()).then(|| rest.join(", "))
}

/// The job service: the queue (memory or Redis), its workers, the API. One per process; cheap to
/// clone.
#[derive(Clone)]
pub struct Jobs {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    metrics: Arc<Metrics>,
    /// `[jobs]` as started: a reload that changes it takes effect at the next restart.
    config: JobsConfig,
    sealer: Option<Sealer>,
    /// Request headers sealed (Redis) instead of stored: credentials and configured sensitive
    /// headers.
    secret_headers: Vec<HeaderName>,
    /// A configuration with an async route was loaded: workers should run.
    wanted: AtomicBool,
    /// What the workers need, until they are spawned (once).
    runtime: Mutex<Option<RuntimeParts>>,
}

#[derive(Clone)]
enum Backend {
    Memory(Arc<MemoryQueue>),
    Redis(RedisQueue),
}

struct RuntimeParts {
    pipeline: Arc<dyn Pipeline>,
    tasks: TaskTracker,
    draining: CancellationToken,
    stop: CancellationToken,
}

impl Jobs {
    /// The queue for `config`: Redis when configured, else in memory.
    pub fn new(config: &Config, redis: Option<RedisHandle>, metrics: Arc<Metrics>) -> Jobs {
        let backend = match redis {
            Some(r) => Backend::Redis(RedisQueue::new(r)),
            None => Backend::Memory(Arc::default()),
        };
        let secret_headers = hygiene::SENSITIVE
            .iter()
            .map(|h| HeaderName::from_static(h))
            .chain(config.dead_letters.sensitive_headers.iter().cloned())
            .collect();
        Jobs {
            inner: Arc::new(Inner {
                backend,
                metrics,
                config: config.jobs.clone(),
                sealer: config.jobs.secret.as_deref().and_then(Sealer::new),
                secret_headers,
                wanted: AtomicBool::new(false),
                runtime: Mutex::new(None),
            }),
        }
    }

    /// The service for a configuration: `Some` when one of its routes is async (the workers are
    /// started then, once).
    pub fn for_config(&self, config: &Config) -> Option<Jobs> {
        if !config.routes.iter().any(|r| r.async_jobs) {
            return None;
        }
        self.inner.wanted.store(true, Ordering::SeqCst);
        self.spawn_workers();
        Some(self.clone())
    }

    /// Gives the workers what they run with: the running proxy, the tracker that owns their
    /// tasks, `draining` (stop taking jobs) and `stop` (abandon running ones). They start now if
    /// an async route is configured, else when a reload brings one.
    pub fn start(
        &self,
        pipeline: Arc<dyn Pipeline>,
        tasks: &TaskTracker,
        draining: CancellationToken,
        stop: CancellationToken,
    ) {
        if let Ok(mut slot) = self.inner.runtime.lock() {
            *slot = Some(RuntimeParts {
                pipeline,
                tasks: tasks.clone(),
                draining,
                stop,
            });
        }
        self.spawn_workers();
    }

    fn spawn_workers(&self) {
        if !self.inner.wanted.load(Ordering::SeqCst) {
            return;
        }
        let parts = match self.inner.runtime.lock() {
            Ok(mut slot) => slot.take(),
            Err(_) => None,
        };
        let Some(parts) = parts else { return };
        let workers = self.inner.config.workers;
        let rt = Arc::new(Runtime {
            jobs: self.clone(),
            pipeline: parts.pipeline,
            callbacks: Callbacks::new(),
            stop: parts.stop,
            consumer: consumer_name(),
        });
        match &self.inner.backend {
            Backend::Memory(q) => {
                for _ in 0..workers {
                    parts
                        .tasks
                        .spawn(memory_worker(rt.clone(), q.clone(), parts.draining.clone()));
                }
                tracing::info!(
                    workers,
                    "job workers started (in-memory queue: jobs are lost on restart)"
                );
            }
            Backend::Redis(q) => {
                let tasks = parts.tasks.clone();
                parts
                    .tasks
                    .spawn(redis_reader(rt.clone(), q.clone(), tasks, parts.draining.clone()));
                tracing::info!(workers, consumer = %rt.consumer, "job workers started (Redis stream)");
            }
        }
    }

    fn count(&self, route: &str, status: &str) {
        self.inner.metrics.jobs_total.with_label_values(&[route, status]).inc();
    }

    fn set_depth(&self, depth: u64) {
        self.inner.metrics.jobs_queue_depth.set(depth as i64);
    }

    /// Queues a request (`Prefer: respond-async` on an async route): 202 with `Location`, or
    /// rebound's error (400 callback or key, 422 key reused, 503 queue full or store down).
    pub async fn submit(
        &self,
        route: &str,
        idempotency: Option<&Idempotency>,
        parts: &http::request::Parts,
        body: Bytes,
        log: RequestLog,
    ) -> Response<ProxyBody> {
        let config = &self.inner.config;
        let callback = match parts
            .headers
            .get_all(CALLBACK_HEADER)
            .iter()
            .collect::<Vec<_>>()
            .as_slice()
        {
            [] => None,
            [url] => match url.to_str() {
                Ok(url) if callback::allowed(url, &config.callback_allowed_prefixes) => Some(url.to_string()),
                _ => return error_response(self.callback_refused(), log),
            },
            _ => return error_response(self.callback_refused(), log),
        };

        // Same key, same tenant: same job id. The identity (hashes only) goes with the job so
        // that every run claims the same idempotency record.
        let mut keyed = None;
        if let Some(idem) = idempotency.filter(|_| matches!(parts.method, Method::POST | Method::PATCH)) {
            match fingerprint::request_key(&parts.headers, &idem.policy.header) {
                None if idem.policy.require_key => {
                    let header = idem.policy.header.to_string();
                    return error_response(ProxyError::IdempotencyKeyRequired { header }, log);
                }
                None => {}
                Some(Err(e)) => {
                    let detail = e.to_string();
                    return error_response(ProxyError::InvalidIdempotencyKey { detail }, log);
                }
                Some(Ok(key)) => {
                    let identity = idem.identity_of(
                        &parts.method,
                        parts.uri.path(),
                        parts.uri.query(),
                        &parts.headers,
                        &body,
                    );
                    keyed = Some((key, identity));
                }
            }
        }
        let (id, fingerprint, identity) = match keyed {
            Some((key, identity)) => {
                let id = digest(&[
                    b"rebound-job-v1",
                    route.as_bytes(),
                    identity.scope.as_bytes(),
                    key.as_bytes(),
                ])[..32]
                    .to_string();
                (id, identity.fingerprint.clone(), Some(identity))
            }
            None => (format!("{:032x}", rand::rng().random::<u128>()), String::new(), None),
        };

        // Credentials and the raw idempotency key are sealed (Redis), the rest kept as sent.
        let key_header = idempotency.map(|i| &i.policy.header);
        let mut kept = parts.headers.clone();
        hygiene::strip_hop_by_hop(&mut kept, false);
        let (mut headers, mut credentials) = (Vec::new(), Vec::new());
        for (name, value) in &kept {
            if matches!(name.as_str(), "host" | "content-length" | CALLBACK_HEADER) {
                continue;
            }
            let Ok(value) = value.to_str() else { continue };
            let pair = (name.as_str().to_string(), value.to_string());
            if self.inner.secret_headers.contains(name) || key_header == Some(name) {
                credentials.push(pair);
            } else {
                headers.push(pair);
            }
        }
        let job = NewJob {
            id: id.clone(),
            route: route.to_string(),
            fingerprint,
            access: access_of(&parts.headers),
            created_ms: crate::time::now_unix_ms(),
            request: StoredRequest {
                method: parts.method.to_string(),
                uri: parts
                    .uri
                    .path_and_query()
                    .map_or_else(|| parts.uri.path().to_string(), |pq| pq.as_str().to_string()),
                headers,
                identity,
            },
            body,
            credentials,
            callback,
        };

        let submitted = match &self.inner.backend {
            Backend::Memory(q) => {
                let (outcome, depth) = q.submit(job, config.max_queue as usize);
                self.set_depth(depth as u64);
                Ok(outcome)
            }
            Backend::Redis(q) => q
                .submit(&job, self.inner.sealer.as_ref(), config.max_queue, config.result_ttl)
                .await
                .map(|(outcome, depth)| {
                    if let Some(d) = depth {
                        self.set_depth(d);
                    }
                    outcome
                }),
        };
        match submitted {
            Ok(Submitted::Queued) => {
                self.count(route, "queued");
                tracing::debug!(route = %route, job = %id, "job queued");
                accepted(&id, JobState::Queued, false, log)
            }
            Ok(Submitted::Exists(state)) => {
                self.count(route, "deduplicated");
                accepted(&id, state, true, log)
            }
            Ok(Submitted::Mismatch) => error_response(ProxyError::IdempotencyKeyReused, log),
            Ok(Submitted::Full) => {
                self.count(route, "rejected");
                tracing::warn!(route = %route, max_queue = config.max_queue, "job queue full; submission refused");
                error_response(
                    ProxyError::QueueFull {
                        max_queue: config.max_queue,
                    },
                    log,
                )
            }
            Err(e) => {
                self.count(route, "rejected");
                tracing::warn!(route = %route, error = %e, "job store unavailable; submission refused");
                error_response(ProxyError::JobsUnavailable, log)
            }
        }
    }

    fn callback_refused(&self) -> ProxyError {
        let prefixes = &self.inner.config.callback_allowed_prefixes;
        ProxyError::CallbackNotAllowed {
            allowed: if prefixes.is_empty() {
                "none are configured".to_string()
            } else {
                prefixes.join(", ")
            },
        }
    }

    /// `GET /jobs/{id}` (the status) and `GET /jobs/{id}/result` (the response as it came).
    pub async fn api(&self, method: &Method, path: &str, headers: &HeaderMap, log: RequestLog) -> Response<ProxyBody> {
        let rest = path.strip_prefix("/jobs/").unwrap_or_default();
        let (id, want_result) = match rest.split_once('/') {
            None => (rest, false),
            Some((id, "result")) => (id, true),
            Some(_) => return error_response(ProxyError::JobNotFound, log),
        };
        if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return error_response(ProxyError::JobNotFound, log);
        }
        if method != Method::GET && method != Method::HEAD {
            let mut resp = error_response(ProxyError::JobMethodNotAllowed, log);
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return resp;
        }
        let loaded = match self.load(id, want_result).await {
            Ok(l) => l,
            Err(()) => return error_response(ProxyError::JobsUnavailable, log),
        };
        let Some((view, result, _)) = loaded.filter(|(v, _, _)| v.access == access_of(headers)) else {
            return error_response(ProxyError::JobNotFound, log);
        };
        if !want_result {
            let body = serde_json::to_vec(&view.to_json()).unwrap_or_default();
            let mut resp = json_response(StatusCode::OK, body, log);
            if !view.state.finished() {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            return resp;
        }
        if !view.state.finished() {
            return error_response(
                ProxyError::JobNotFinished {
                    state: view.state.as_str(),
                },
                log,
            );
        }
        let Some(result) = result else {
            let detail = view.error.unwrap_or_else(|| "no response was kept".to_string());
            return error_response(ProxyError::JobResultUnavailable { detail }, log);
        };
        let status = StatusCode::from_u16(result.status).unwrap_or(StatusCode::BAD_GATEWAY);
        let mut resp = Response::new(ProxyBody::full(result.body, log, status.as_u16()));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        for (name, value) in &result.headers {
            if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) {
                h.append(name, value);
            }
        }
        h.insert("x-rebound-attempts", HeaderValue::from(view.attempts));
        if let Ok(v) = HeaderValue::from_str(&view.id) {
            h.insert("x-rebound-job-id", v);
        }
        resp
    }

    /// A job: its view, its result (when asked for) and callback URL. `Err`: the store did not
    /// answer.
    async fn load(
        &self,
        id: &str,
        full: bool,
    ) -> Result<Option<(record::JobView, Option<JobResult>, Option<String>)>, ()> {
        match &self.inner.backend {
            Backend::Memory(q) => Ok(q.load(id).map(|l| (l.view, l.result, l.callback))),
            Backend::Redis(q) => match q.load(id, full).await {
                Ok(l) => Ok(l.map(|l| (l.view, l.result, l.callback))),
                Err(e) => {
                    tracing::warn!(error = %e, "job store unavailable");
                    Err(())
                }
            },
        }
    }
}

/// The hash a job's access is checked against.
fn access_of(headers: &HeaderMap) -> String {
    fingerprint::scope_hash(headers, &ACCESS_HEADERS.map(HeaderName::from_static))
}

fn json_response(status: StatusCode, body: Vec<u8>, log: RequestLog) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::full(body, log, status.as_u16()));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// 202 Accepted: where to poll, and the job's state.
fn accepted(id: &str, state: JobState, existing: bool, log: RequestLog) -> Response<ProxyBody> {
    let body = serde_json::to_vec(&serde_json::json!({ "job_id": id, "status": state.as_str() })).unwrap_or_default();
    let mut resp = json_response(StatusCode::ACCEPTED, body, log);
    let h = resp.headers_mut();
    if let Ok(location) = HeaderValue::from_str(&format!("/jobs/{id}")) {
        h.insert(header::LOCATION, location);
    }
    if let Ok(v) = HeaderValue::from_str(id) {
        h.insert("x-rebound-job-id", v);
    }
    h.insert("preference-applied", HeaderValue::from_static("respond-async"));
    if existing {
        h.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    resp
}

/// `{hostname}-{pid}-{random}`: one consumer per process in the group.
fn consumer_name() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "rebound".into());
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(64)
        .collect();
    format!("{host}-{}-{:08x}", std::process::id(), rand::rng().random::<u32>())
}

fn owner_token() -> String {
    format!("{:032x}", rand::rng().random::<u128>())
}

/// What the workers share.
struct Runtime {
    jobs: Jobs,
    pipeline: Arc<dyn Pipeline>,
    callbacks: Callbacks,
    /// Abandons running jobs (shutdown).
    stop: CancellationToken,
    /// This process's consumer name in the group.
    consumer: String,
}

/// A job a worker owns for now.
struct Lease {
    id: String,
    /// The owner token (Redis).
    owner: String,
    /// The stream entry (Redis).
    entry: Option<String>,
}

enum Work {
    Run(Box<ToRun>),
    /// Finished already; its callback is due.
    Callback,
}

struct ToRun {
    route: String,
    /// `None` when it could not be read back.
    request: Option<StoredRequest>,
    body: Bytes,
    /// `Err` when they could not be unsealed.
    credentials: Result<Vec<(String, String)>, String>,
    callback: Option<String>,
}

async fn memory_worker(rt: Arc<Runtime>, queue: Arc<MemoryQueue>, draining: CancellationToken) {
    loop {
        let taken = tokio::select! {
            t = queue.take(crate::time::now_unix_ms) => t,
            _ = draining.cancelled() => return,
        };
        let lease = Lease {
            id: taken.id,
            owner: String::new(),
            entry: None,
        };
        let work = Work::Run(Box::new(ToRun {
            route: taken.route,
            request: Some(taken.request),
            body: taken.body,
            credentials: Ok(taken.credentials),
            callback: taken.callback,
        }));
        rt.process(lease, work).await;
    }
}

/// Takes entries for this process's workers: new ones (XREADGROUP, blocking, on a connection of
/// its own so the shared one never stalls) and those of dead workers (XAUTOCLAIM, every
/// `visibility_timeout / 2`), only while a worker is free.
async fn redis_reader(rt: Arc<Runtime>, queue: RedisQueue, tasks: TaskTracker, draining: CancellationToken) {
    let config = &rt.jobs.inner.config;
    let free = Arc::new(Semaphore::new(config.workers as usize));
    let reclaim_every = (config.visibility_timeout / 2).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let mut conn: Option<redis::aio::MultiplexedConnection> = None;
    let mut group_ready = false;
    let mut cursor = "0-0".to_string();
    let mut next_reclaim = Instant::now();
    let mut next_departed = Instant::now() + DEPARTED_EVERY;
    let mut announced = false;
    let backoff = |announced: &mut bool, what: &str, error: String| {
        if !*announced {
            tracing::warn!(error = %error, "job workers: {what}; retrying every second");
            *announced = true;
        }
    };
    loop {
        let permit = tokio::select! {
            p = free.clone().acquire_owned() => p,
            _ = draining.cancelled() => return,
        };
        let Ok(permit) = permit else { return };
        let pause = async {
            tokio::select! {
                _ = tokio::time::sleep(REDIS_BACKOFF) => false,
                _ = draining.cancelled() => true,
            }
        };
        if !group_ready {
            match queue.ensure_group().await {
                Ok(()) => group_ready = true,
                Err(e) => {
                    backoff(&mut announced, "cannot create the consumer group", e.to_string());
                    if pause.await {
                        return;
                    }
                    continue;
                }
            }
        }

        let now = Instant::now();
        if now >= next_reclaim {
            match queue.reclaim(&rt.consumer, config.visibility_timeout, &cursor).await {
                Ok((next, Some((entry, job)))) => {
                    cursor = next;
                    rt.jobs.inner.metrics.jobs_reclaimed_total.inc();
                    tracing::info!(
                        job = job.as_deref().unwrap_or("-"),
                        "reclaiming a job whose worker stopped"
                    );
                    let rt = rt.clone();
                    let q = queue.clone();
                    tasks.spawn(async move {
                        rt.redis_entry(&q, entry, job, true).await;
                        drop(permit);
                    });
                    continue;
                }
                Ok((next, None)) => {
                    cursor = next;
                    next_reclaim = now + reclaim_every;
                }
                Err(e) => {
                    if redis_queue::is_nogroup(&e) {
                        group_ready = false;
                    }
                    next_reclaim = now + reclaim_every;
                }
            }
            if let Ok(depth) = queue.depth().await {
                rt.jobs.set_depth(depth);
            }
            if now >= next_departed {
                next_departed = now + DEPARTED_EVERY;
                match queue.forget_departed(DEPARTED_IDLE).await {
                    Ok(n) if n > 0 => tracing::info!(consumers = n, "forgot job consumers of departed processes"),
                    _ => {}
                }
            }
        }

        let mut c = match conn.take() {
            Some(c) => c,
            None => {
                let connected = match queue.redis.client() {
                    Ok(client) => {
                        let cfg = redis::AsyncConnectionConfig::new()
                            .set_connection_timeout(queue.redis.command_timeout().max(Duration::from_millis(500)))
                            .set_response_timeout(READ_BLOCK + Duration::from_secs(5));
                        client
                            .get_multiplexed_async_connection_with_config(&cfg)
                            .await
                            .map_err(|e| e.to_string())
                    }
                    Err(e) => Err(e.to_string()),
                };
                match connected {
                    Ok(c) => {
                        if announced {
                            tracing::info!("job workers: reading the queue again");
                            announced = false;
                        }
                        c
                    }
                    Err(e) => {
                        backoff(&mut announced, "cannot connect to Redis", e);
                        if pause.await {
                            return;
                        }
                        continue;
                    }
                }
            }
        };
        let block = next_reclaim
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(10), READ_BLOCK);
        let read = tokio::select! {
            r = tokio::time::timeout(block + Duration::from_secs(5), queue.read_new(&mut c, &rt.consumer, block)) => r,
            _ = draining.cancelled() => return,
        };
        match read {
            Ok(Ok(Some((entry, job)))) => {
                conn = Some(c);
                let rt = rt.clone();
                let q = queue.clone();
                tasks.spawn(async move {
                    rt.redis_entry(&q, entry, job, false).await;
                    drop(permit);
                });
            }
            Ok(Ok(None)) => conn = Some(c),
            Ok(Err(ReadError::NoGroup)) => {
                conn = Some(c);
                group_ready = false;
            }
            Ok(Err(ReadError::Redis(e))) => {
                backoff(&mut announced, "cannot read the queue", e);
                if pause.await {
                    return;
                }
            }
            Err(_) => {
                backoff(&mut announced, "a queue read timed out", "timeout".into());
            }
        }
    }
}

impl Runtime {
    /// Takes and runs the job of a stream entry this consumer holds.
    async fn redis_entry(&self, queue: &RedisQueue, entry: String, job: Option<String>, reclaimed: bool) {
        let Some(id) = job else {
            let _ = queue.drop_entry(&entry).await;
            return;
        };
        let config = &self.jobs.inner.config;
        let owner = owner_token();
        let started = queue
            .start(
                &id,
                &entry,
                &owner,
                crate::time::now_unix_ms(),
                MAX_RUNS,
                config.result_ttl,
            )
            .await;
        let lease = Lease {
            id: id.clone(),
            owner,
            entry: Some(entry),
        };
        match started {
            Err(e) => {
                // The entry stays pending: reclaimed after the visibility timeout.
                tracing::warn!(job = %id, error = %e, "could not take a job; it will be reclaimed");
            }
            Ok(Start::Skip) => self.refresh_depth(queue).await,
            Ok(Start::Abandoned { route }) => {
                self.refresh_depth(queue).await;
                self.jobs.count(&route, JobState::Failed.as_str());
                tracing::warn!(job = %id, route = %route, runs = MAX_RUNS, "job abandoned: its workers kept stopping before it finished");
            }
            Ok(Start::Callback) => self.process(lease, Work::Callback).await,
            Ok(Start::Run(run)) => {
                let redis_queue::Run {
                    runs,
                    request,
                    body,
                    sealed,
                    route,
                    callback,
                } = *run;
                if reclaimed || runs > 1 {
                    tracing::info!(job = %id, run = runs, "running a reclaimed job");
                }
                let credentials = redis_queue::open_credentials(self.jobs.inner.sealer.as_ref(), &id, &sealed);
                let work = Work::Run(Box::new(ToRun {
                    route,
                    request,
                    body,
                    credentials,
                    callback,
                }));
                self.process(lease, work).await;
            }
        }
    }

    async fn refresh_depth(&self, queue: &RedisQueue) {
        if let Ok(depth) = queue.depth().await {
            self.jobs.set_depth(depth);
        }
    }

    /// Runs a job to its recorded outcome (and callback), heartbeating meanwhile; abandoned at
    /// shutdown.
    async fn process(&self, lease: Lease, work: Work) {
        let job = async {
            match work {
                Work::Run(run) => {
                    let ToRun {
                        route,
                        request,
                        body,
                        credentials,
                        callback,
                    } = *run;
                    let finished = match (request, credentials) {
                        (Some(request), Ok(credentials)) => self.execute(&lease.id, request, body, credentials).await,
                        (None, _) => failed("the stored request could not be read".into()),
                        (_, Err(e)) => failed(e),
                    };
                    self.jobs.count(&route, finished.state.as_str());
                    tracing::info!(
                        job = %lease.id,
                        route = %route,
                        status = finished.state.as_str(),
                        http_status = finished.http_status.unwrap_or(0),
                        attempts = finished.attempts,
                        "job finished"
                    );
                    if self.finish(&lease, &finished, callback.is_some()).await {
                        if let Some(url) = callback {
                            self.callback(&lease, &url).await;
                        }
                    }
                }
                Work::Callback => {
                    if let Ok(Some((_, _, Some(url)))) = self.jobs.load(&lease.id, false).await {
                        self.callback(&lease, &url).await;
                    }
                }
            }
        };
        tokio::select! {
            _ = job => {}
            _ = self.heartbeat(&lease) => {}
            _ = self.stop.cancelled() => {
                tracing::info!(job = %lease.id, "job cut short by shutdown; another replica reclaims it (in memory: lost)");
            }
        }
    }

    /// Sends the job through the route's pipeline (synchronously: no `respond-async`) and reads
    /// the whole response.
    async fn execute(
        &self,
        id: &str,
        stored: StoredRequest,
        body: Bytes,
        credentials: Vec<(String, String)>,
    ) -> Finished {
        let max_body = self.jobs.inner.config.max_result_body;
        let mut builder = Request::builder()
            .method(stored.method.as_str())
            .uri(stored.uri.as_str());
        for (name, value) in stored.headers.iter().chain(&credentials) {
            if name == "prefer" {
                if let Some(rest) = without_respond_async(value) {
                    builder = builder.header(name.as_str(), rest);
                }
                continue;
            }
            builder = builder.header(name.as_str(), value.as_str());
        }
        let mut req = match builder.body(Full::new(body)) {
            Ok(r) => r,
            Err(e) => return failed(format!("the stored request is invalid: {e}")),
        };
        req.extensions_mut().insert(JobRun(id.to_string()));
        if let Some(identity) = stored.identity {
            req.extensions_mut().insert(identity);
        }
        let resp = self.pipeline.run(req).await;
        let status = resp.status().as_u16();
        let delivered = resp.extensions().get::<Delivered>().copied().unwrap_or_default();
        let attempts = delivered.attempts;
        let headers: Vec<(String, String)> = resp
            .headers()
            .iter()
            .filter(|(k, _)| {
                crate::idempotency::KEPT_HEADERS.contains(&k.as_str()) || RESULT_HEADERS.contains(&k.as_str())
            })
            .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str().to_string(), v.to_string())))
            .collect();
        let rebound_error = delivered.error.map(str::to_string);
        let state = if status < 400 {
            JobState::Succeeded
        } else {
            JobState::Failed
        };
        let error = rebound_error.or_else(|| (status >= 400).then(|| format!("the upstream answered {status}")));
        // Reading to the end also completes the idempotency record.
        let limit = usize::try_from(max_body).unwrap_or(usize::MAX);
        let read = Limited::new(resp.into_body(), limit).collect().await;
        let (state, result, error) = match read {
            Ok(collected) => (
                state,
                Some(JobResult {
                    status,
                    headers,
                    body: collected.to_bytes(),
                }),
                error,
            ),
            Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => (
                JobState::Failed,
                None,
                Some(format!(
                    "the response is larger than [jobs] max_result_body ({max_body} bytes): it was not kept"
                )),
            ),
            Err(e) => (JobState::Failed, None, Some(format!("the response ended early: {e}"))),
        };
        Finished {
            state,
            finished_ms: crate::time::now_unix_ms(),
            attempts,
            http_status: Some(status),
            result,
            error,
        }
    }

    /// Records the outcome; `false` when this worker no longer owns the job (or the store did not
    /// answer: the job is then reclaimed and run again, its idempotency key answering from the
    /// store where it has one).
    async fn finish(&self, lease: &Lease, f: &Finished, callback_pending: bool) -> bool {
        let ttl = self.jobs.inner.config.result_ttl;
        match (&self.jobs.inner.backend, &lease.entry) {
            (Backend::Memory(q), _) => {
                let depth = q.finish(&lease.id, f, callback_pending, ttl);
                self.jobs.set_depth(depth as u64);
                true
            }
            (Backend::Redis(q), Some(entry)) => {
                match q.finish(&lease.id, entry, &lease.owner, f, callback_pending, ttl).await {
                    Ok((owned, depth)) => {
                        self.jobs.set_depth(depth);
                        if !owned {
                            tracing::warn!(job = %lease.id, "job was reclaimed by another worker meanwhile; this run's outcome is discarded");
                        }
                        owned
                    }
                    Err(e) => {
                        tracing::warn!(job = %lease.id, error = %e, "job outcome not recorded; it will be reclaimed");
                        false
                    }
                }
            }
            (Backend::Redis(_), None) => false,
        }
    }

    /// POSTs the finished job to its callback URL and records what came of it.
    async fn callback(&self, lease: &Lease, url: &str) {
        let Ok(Some((view, result, _))) = self.jobs.load(&lease.id, true).await else {
            return;
        };
        let payload = callback::payload(&view, result.as_ref());
        let delivered: CallbackView = self.callbacks.deliver(url, &lease.id, payload, &self.stop).await;
        if delivered.state != record::CallbackState::Delivered {
            tracing::warn!(job = %lease.id, attempts = delivered.attempts, last_status = delivered.last_status.unwrap_or(0), "job callback not delivered");
        }
        let ttl = self.jobs.inner.config.result_ttl;
        match (&self.jobs.inner.backend, &lease.entry) {
            (Backend::Memory(q), _) => q.callback_done(&lease.id, delivered),
            (Backend::Redis(q), Some(entry)) => {
                match q.callback_done(&lease.id, entry, &lease.owner, &delivered, ttl).await {
                    Ok((_, depth)) => self.jobs.set_depth(depth),
                    Err(e) => tracing::warn!(job = %lease.id, error = %e, "job callback outcome not recorded"),
                }
            }
            (Backend::Redis(_), None) => {}
        }
    }

    /// Keeps a running Redis job from being reclaimed (every `visibility_timeout / 3`). Never
    /// returns.
    async fn heartbeat(&self, lease: &Lease) {
        let (Backend::Redis(q), Some(entry)) = (&self.jobs.inner.backend, &lease.entry) else {
            return pending().await;
        };
        let config = &self.jobs.inner.config;
        let every = (config.visibility_timeout / 3).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(every).await;
            match q
                .heartbeat(&lease.id, entry, &lease.owner, &self.consumer, config.result_ttl)
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(job = %lease.id, "job taken over by another worker (this one stalled past the visibility timeout)");
                    return pending().await;
                }
                Err(e) => tracing::warn!(job = %lease.id, error = %e, "job heartbeat failed"),
            }
        }
    }
}

fn failed(error: String) -> Finished {
    Finished {
        state: JobState::Failed,
        finished_ms: crate::time::now_unix_ms(),
        attempts: 0,
        http_status: None,
        result: None,
        error: Some(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefer(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("prefer", v.parse().unwrap());
        }
        h
    }

    #[test]
    fn respond_async_among_other_preferences() {
        assert!(prefers_async(&prefer(&["respond-async"])));
        assert!(prefers_async(&prefer(&["Respond-Async"])));
        assert!(prefers_async(&prefer(&["return=minimal, respond-async, wait=10"])));
        assert!(prefers_async(&prefer(&["wait=10", "respond-async; foo=bar"])));
        assert!(!prefers_async(&prefer(&["return=representation"])));
        assert!(!prefers_async(&prefer(&["respond-asynchronously"])));
        assert!(!prefers_async(&prefer(&["foo=respond-async"])));
        assert!(!prefers_async(&HeaderMap::new()));
    }

    #[test]
    fn a_run_drops_only_respond_async() {
        assert_eq!(without_respond_async("respond-async"), None);
        assert_eq!(
            without_respond_async("respond-async, wait=10 ,return=minimal").as_deref(),
            Some("wait=10, return=minimal")
        );
    }
}
