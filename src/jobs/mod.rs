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

pub mod api;
pub mod callback;
mod id;
pub mod memory;
pub mod prefer;
pub mod record;
pub(crate) mod redis_queue;
pub(crate) mod seal;
mod submit;
mod worker;

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{header, HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, JobsConfig};
use crate::credentials::CredentialHash;
use crate::idempotency::fingerprint;
use crate::metrics::Metrics;
use crate::redis::RedisHandle;
use crate::wire::body::{ProxyBody, RequestLog};
use crate::wire::headers::{self, self as hygiene};
use memory::MemoryQueue;
use redis_queue::RedisQueue;
use seal::Sealer;

pub(crate) use api::is_api_path;
pub(crate) use id::JobId;
pub(crate) use prefer::wants_async;

/// A job whose workers died this many times is failed as abandoned (a poison job must not take
/// the fleet down one replica after another).
pub(crate) const MAX_RUNS: u32 = 5;

/// Response headers kept with a result, beyond the idempotency store's allowlist.
const RESULT_HEADERS: [HeaderName; 4] = [
    headers::X_REBOUND_ERROR,
    headers::X_REBOUND_UPSTREAM,
    headers::IDEMPOTENT_REPLAYED,
    http::header::RETRY_AFTER,
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
pub(crate) struct JobRun(pub JobId);

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
    /// The credential forms in force at startup: a job's access is scoped by them (only the
    /// credential that submitted it reads it).
    credentials: crate::credentials::Credentials,
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
        let secret_headers = config.dead_letters.secret_headers.clone();
        Jobs {
            inner: Arc::new(Inner {
                backend,
                metrics,
                config: config.jobs.clone(),
                sealer: config.jobs.secret.as_deref().and_then(Sealer::new),
                secret_headers,
                credentials: config.server.credentials.clone(),
                wanted: AtomicBool::new(false),
                runtime: Mutex::new(None),
            }),
        }
    }

    /// The service for a configuration: `Some` when one of its routes is async (the workers are
    /// started then, once).
    pub(crate) fn for_config(&self, config: &Config) -> Option<Jobs> {
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
        *self.inner.runtime.lock() = Some(RuntimeParts {
            pipeline,
            tasks: tasks.clone(),
            draining,
            stop,
        });
        self.spawn_workers();
    }

    fn count(&self, route: &str, status: &str) {
        self.inner.metrics.jobs_total.with_label_values(&[route, status]).inc();
    }

    fn set_depth(&self, depth: u64) {
        self.inner.metrics.jobs_queue_depth.set(depth as i64);
    }

    /// A job: its view, its result (when asked for) and callback URL. `Err`: the store did not
    /// answer.
    async fn load(
        &self,
        id: &JobId,
        full: bool,
    ) -> Result<Option<(record::JobView, Option<record::JobResult>, Option<String>)>, JobsError> {
        match &self.inner.backend {
            Backend::Memory(q) => Ok(q.load(id).map(|l| (l.view, l.result, l.callback))),
            Backend::Redis(q) => match q.load(id, full).await {
                Ok(l) => Ok(l.map(|l| (l.view, l.result, l.callback))),
                Err(e) => {
                    tracing::warn!(error = %e, "job store unavailable");
                    Err(e.into())
                }
            },
        }
    }
}

/// Why the job service could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JobsError {
    /// Redis did not answer, or refused the command.
    #[error("job store unavailable: {0}")]
    Store(#[from] crate::redis::RedisError),
    /// A blocking read failed on the reader's own connection.
    #[error("job queue read failed: {0}")]
    Read(#[source] ::redis::RedisError),
    /// The consumer group is gone (Redis restarted without persistence, or the stream was deleted).
    #[error("the job queue's consumer group is gone")]
    NoGroup,
    /// A job's sealed credentials cannot be opened (`[jobs] secret` differs between replicas).
    #[error("the request's credentials could not be unsealed: [jobs] secret must be the same on every replica")]
    Sealed,
}

impl Jobs {
    /// The hash a job's access is checked against: the request's credential, in every form (the
    /// tenant scope over every credential form, the hash jobs have always been stored with).
    fn access_of(&self, headers: &HeaderMap, query: Option<&str>) -> CredentialHash {
        CredentialHash(fingerprint::scope_digest(
            headers,
            query,
            self.inner.credentials.headers(),
        ))
    }
}

fn json_response(status: StatusCode, body: Vec<u8>, log: RequestLog) -> Response<ProxyBody> {
    let mut resp = Response::new(ProxyBody::full(body, log, status.as_u16()));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}
