//! The workers: each takes a job (the in-memory queue, or the Redis stream through one reader per
//! process), owns it with a token and a heartbeat, runs its request through the [`Pipeline`], keeps
//! the result and fires the callback.

use std::future::pending;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt as _, Full, Limited};
use rand::Rng as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::callback::{self, Callbacks};
use super::memory::MemoryQueue;
use super::prefer::without_respond_async;
use super::record::{self, CallbackView, Finished, JobResult, JobState, StoredRequest};
use super::redis_queue::{self, Held, RedisQueue, Start};
use super::{
    Backend, JobId, JobRun, Jobs, JobsError, Pipeline, DEPARTED_EVERY, DEPARTED_IDLE, MAX_RUNS, READ_BLOCK,
    REDIS_BACKOFF, RESULT_HEADERS,
};
use crate::wire::body::Delivered;

impl Jobs {
    pub(super) fn spawn_workers(&self) {
        if !self.inner.wanted.load(Ordering::SeqCst) {
            return;
        }
        let parts = self.inner.runtime.lock().take();
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
    id: JobId,
    /// The owner token (Redis).
    owner: String,
    /// The stream entry (Redis).
    entry: Option<String>,
}

impl Lease {
    /// This lease's job as the Redis queue addresses it, held through stream entry `entry`.
    fn held<'a>(&'a self, entry: &'a str) -> Held<'a> {
        Held {
            id: &self.id,
            entry,
            owner: &self.owner,
        }
    }
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
    credentials: Result<Vec<(String, String)>, JobsError>,
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
    let mut reader = Reader {
        reclaim_every: (config.visibility_timeout / 2).clamp(Duration::from_millis(100), Duration::from_secs(5)),
        conn: None,
        group_ready: false,
        cursor: "0-0".to_string(),
        next_reclaim: crate::time::now(),
        next_departed: crate::time::now() + DEPARTED_EVERY,
        announced: false,
        rt,
        queue,
        tasks,
    };
    loop {
        let permit = tokio::select! {
            p = free.clone().acquire_owned() => p,
            _ = draining.cancelled() => return,
        };
        let Ok(permit) = permit else { return };
        let step = match reader.ensure_group().await {
            Err(e) => Err(("cannot create the consumer group", e)),
            Ok(()) => match reader.reclaim_due(permit).await {
                Some(permit) => match reader.connection().await {
                    Ok(conn) => reader.read_new(conn, permit, &draining).await,
                    Err(e) => Err(("cannot connect to Redis", e)),
                },
                None => Ok(true),
            },
        };
        match step {
            Ok(true) => {}
            Ok(false) => return,
            Err((what, error)) => {
                reader.announce(what, &error);
                tokio::select! {
                    _ = tokio::time::sleep(REDIS_BACKOFF) => {}
                    _ = draining.cancelled() => return,
                }
            }
        }
    }
}

/// The reader's state between two reads.
struct Reader {
    rt: Arc<Runtime>,
    queue: RedisQueue,
    tasks: TaskTracker,
    reclaim_every: Duration,
    /// Its own connection for blocking reads.
    conn: Option<redis::aio::MultiplexedConnection>,
    group_ready: bool,
    /// Where XAUTOCLAIM goes on.
    cursor: String,
    next_reclaim: Instant,
    next_departed: Instant,
    /// A failure was logged; the next success says so.
    announced: bool,
}

impl Reader {
    fn announce(&mut self, what: &str, error: &dyn std::error::Error) {
        if !self.announced {
            tracing::warn!(error = %error, "job workers: {what}; retrying every second");
            self.announced = true;
        }
    }

    async fn ensure_group(&mut self) -> Result<(), JobsError> {
        if !self.group_ready {
            self.queue.ensure_group().await?;
            self.group_ready = true;
        }
        Ok(())
    }

    /// When due: reclaims one entry of a dead worker (handing it `permit`), refreshes the depth
    /// and forgets departed consumers. The permit comes back when it was not used.
    async fn reclaim_due(&mut self, permit: OwnedSemaphorePermit) -> Option<OwnedSemaphorePermit> {
        let now = crate::time::now();
        if now < self.next_reclaim {
            return Some(permit);
        }
        let config = &self.rt.jobs.inner.config;
        match self
            .queue
            .reclaim(&self.rt.consumer, config.visibility_timeout, &self.cursor)
            .await
        {
            Ok((next, Some((entry, job)))) => {
                self.cursor = next;
                self.rt.jobs.inner.metrics.jobs_reclaimed_total.inc();
                tracing::info!(
                    job = job.as_ref().map_or("-", JobId::as_str),
                    "reclaiming a job whose worker stopped"
                );
                self.spawn_entry(entry, job, true, permit);
                return None;
            }
            Ok((next, None)) => {
                self.cursor = next;
                self.next_reclaim = now + self.reclaim_every;
            }
            Err(e) => {
                if redis_queue::is_nogroup(&e) {
                    self.group_ready = false;
                }
                self.next_reclaim = now + self.reclaim_every;
            }
        }
        if let Ok(depth) = self.queue.depth().await {
            self.rt.jobs.set_depth(depth);
        }
        if now >= self.next_departed {
            self.next_departed = now + DEPARTED_EVERY;
            if let Ok(n) = self.queue.forget_departed(DEPARTED_IDLE).await {
                if n > 0 {
                    tracing::info!(consumers = n, "forgot job consumers of departed processes");
                }
            }
        }
        Some(permit)
    }

    /// The reader's own connection (made when there is none).
    async fn connection(&mut self) -> Result<redis::aio::MultiplexedConnection, JobsError> {
        if let Some(c) = self.conn.take() {
            return Ok(c);
        }
        let redis = &self.queue.redis;
        // On a Cluster, the master of the stream's slot; on Sentinel, the current master.
        let c = redis
            .dedicated_for(&self.queue.stream, Some(READ_BLOCK + Duration::from_secs(5)))
            .await?;
        if self.announced {
            tracing::info!("job workers: reading the queue again");
            self.announced = false;
        }
        Ok(c)
    }

    /// One blocking read; an entry goes to a worker task with `permit`. `Ok(false)`: draining.
    async fn read_new(
        &mut self,
        mut conn: redis::aio::MultiplexedConnection,
        permit: OwnedSemaphorePermit,
        draining: &CancellationToken,
    ) -> Result<bool, (&'static str, JobsError)> {
        let block = self
            .next_reclaim
            .saturating_duration_since(crate::time::now())
            .clamp(Duration::from_millis(10), READ_BLOCK);
        let read = tokio::select! {
            r = tokio::time::timeout(block + Duration::from_secs(5), self.queue.read_new(&mut conn, &self.rt.consumer, block)) => r,
            _ = draining.cancelled() => return Ok(false),
        };
        match read {
            Ok(Ok(Some((entry, job)))) => {
                self.conn = Some(conn);
                self.spawn_entry(entry, job, false, permit);
                Ok(true)
            }
            Ok(Ok(None)) => {
                self.conn = Some(conn);
                Ok(true)
            }
            Ok(Err(JobsError::NoGroup)) => {
                self.conn = Some(conn);
                self.group_ready = false;
                Ok(true)
            }
            Ok(Err(e)) => Err(("cannot read the queue", e)),
            Err(elapsed) => {
                self.announce("a queue read timed out", &elapsed);
                Ok(true)
            }
        }
    }

    fn spawn_entry(&self, entry: String, job: Option<JobId>, reclaimed: bool, permit: OwnedSemaphorePermit) {
        let rt = self.rt.clone();
        let q = self.queue.clone();
        self.tasks.spawn(async move {
            rt.redis_entry(&q, entry, job, reclaimed).await;
            drop(permit);
        });
    }
}

impl Runtime {
    /// Takes and runs the job of a stream entry this consumer holds.
    async fn redis_entry(&self, queue: &RedisQueue, entry: String, job: Option<JobId>, reclaimed: bool) {
        let Some(id) = job else {
            let _ = queue.drop_entry(&entry).await;
            return;
        };
        let config = &self.jobs.inner.config;
        let owner = owner_token();
        let held = Held {
            id: &id,
            entry: &entry,
            owner: &owner,
        };
        let started = queue
            .start(held, crate::time::now_unix_ms(), MAX_RUNS, config.result_ttl)
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
                        (_, Err(e)) => failed(e.to_string()),
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
        id: &JobId,
        stored: StoredRequest,
        body: Bytes,
        credentials: Vec<(String, String)>,
    ) -> Finished {
        let max_body = self.jobs.inner.config.max_result_body;
        let mut builder = Request::builder()
            .method(stored.method.as_str())
            .uri(with_sealed_query(&stored.uri, &credentials));
        for (name, value) in stored.headers.iter().chain(&credentials) {
            if name.starts_with('?') {
                continue;
            }
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
        req.extensions_mut().insert(JobRun(id.clone()));
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
            .filter(|(k, _)| crate::idempotency::KEPT_HEADERS.contains(&k.as_str()) || RESULT_HEADERS.contains(k))
            .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str().to_string(), v.to_string())))
            .collect();
        let rebound_error = delivered.error.map(str::to_string);
        let ledger = resp.extensions().get::<crate::wire::usage::Ledger>().cloned();
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
            // Read after the body: the last attempt's usage is counted as it ends.
            usage: ledger.map(|l| l.entries()).unwrap_or_default(),
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
            (Backend::Redis(q), Some(entry)) => match q.finish(lease.held(entry), f, callback_pending, ttl).await {
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
            },
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
            (Backend::Redis(q), Some(entry)) => match q.callback_done(lease.held(entry), &delivered, ttl).await {
                Ok((_, depth)) => self.jobs.set_depth(depth),
                Err(e) => tracing::warn!(job = %lease.id, error = %e, "job callback outcome not recorded"),
            },
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
            match q.heartbeat(lease.held(entry), &self.consumer, config.result_ttl).await {
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
        usage: Vec::new(),
    }
}
/// A stored target with the credential query parameters that were sealed apart (`?name`
/// entries of the credentials) put back.
fn with_sealed_query(uri: &str, credentials: &[(String, String)]) -> String {
    let mut out = uri.to_string();
    for (name, value) in credentials {
        if let Some(name) = name.strip_prefix('?') {
            out.push(if out.contains('?') { '&' } else { '?' });
            out.push_str(name);
            out.push('=');
            out.push_str(value);
        }
    }
    out
}
