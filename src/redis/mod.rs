//! The Redis connection: one multiplexed, self-reconnecting connection (redis-rs
//! `ConnectionManager`) per process, a health signal, and the command wrapper every Redis-backed
//! feature goes through (timeout, metrics).
//!
//! rebound starts and serves without Redis: a supervisor task keeps trying to connect in the
//! background, and each feature decides how to degrade while [`RedisHandle::is_up`] is false.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{redact_url, RedisConfig};
use crate::metrics::Metrics;
use crate::time;

/// How often the supervisor pings Redis.
const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// Why a Redis command produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    #[error("redis is not connected")]
    NotConnected,
    #[error("redis command {op} timed out after {timeout:?}")]
    Timeout { op: &'static str, timeout: Duration },
    #[error("redis command {op} failed: {source}")]
    Command {
        op: &'static str,
        source: redis::RedisError,
    },
}

/// A cheap-to-clone handle on the process's Redis connection.
#[derive(Clone)]
pub struct RedisHandle {
    inner: Arc<Inner>,
}

struct Inner {
    config: RedisConfig,
    conn: RwLock<Option<ConnectionManager>>,
    up: AtomicBool,
    /// Redis's clock minus this replica's, in ms, measured by every health check (`TIME`);
    /// `i64::MIN` until the first one answers.
    clock_offset_ms: AtomicI64,
    metrics: Arc<Metrics>,
}

impl RedisHandle {
    /// Starts the supervisor (connect, then ping every second) on `tasks`; it stops with `stop`.
    pub fn start(
        config: RedisConfig,
        metrics: Arc<Metrics>,
        tasks: &TaskTracker,
        stop: CancellationToken,
    ) -> RedisHandle {
        metrics.redis_up.set(0);
        let handle = RedisHandle {
            inner: Arc::new(Inner {
                config,
                conn: RwLock::new(None),
                up: AtomicBool::new(false),
                clock_offset_ms: AtomicI64::new(i64::MIN),
                metrics,
            }),
        };
        let supervisor = handle.clone();
        tasks.spawn(async move {
            tokio::select! {
                _ = supervisor.supervise() => {}
                _ = stop.cancelled() => {}
            }
        });
        handle
    }

    /// Waits until the first health check answers, at most `bound` (startup: so that a fleet
    /// whose Redis is up does not answer its first requests as if it were down).
    pub async fn wait_connected(&self, bound: Duration) -> bool {
        let end = tokio::time::Instant::now() + bound;
        while !self.is_up() {
            if tokio::time::Instant::now() >= end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Whether the last health check answered.
    pub fn is_up(&self) -> bool {
        self.inner.up.load(Ordering::Relaxed)
    }

    /// Redis's clock now (unix ms), from this replica's clock and the offset measured by the last
    /// health check; `None` before the first one answered. Scripts compare it with `TIME` to refuse
    /// a command that ran after its caller gave up on it (it sat in a frozen Redis's buffer).
    pub fn redis_now_ms(&self) -> Option<i64> {
        let offset = self.inner.clock_offset_ms.load(Ordering::Relaxed);
        (offset != i64::MIN).then(|| time::unix_ms_now().saturating_add(offset))
    }

    /// The instant on Redis's clock (unix ms) after which a command sent now has been given up
    /// on: now plus `command_timeout`. 0 (no bound) while the offset is unknown.
    pub fn give_up_at_ms(&self) -> i64 {
        let timeout = i64::try_from(self.inner.config.command_timeout.as_millis()).unwrap_or(i64::MAX);
        self.redis_now_ms().map_or(0, |now| now.saturating_add(timeout))
    }

    /// `key_prefix` + `suffix`.
    pub fn key(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.inner.config.key_prefix)
    }

    /// The configured command timeout.
    pub fn command_timeout(&self) -> Duration {
        self.inner.config.command_timeout
    }

    /// A client for connections of their own (pub/sub cannot share the multiplexed one).
    pub fn client(&self) -> redis::RedisResult<redis::Client> {
        redis::Client::open(self.inner.config.url.as_str())
    }

    /// Runs one command (or pipeline / script) within `command_timeout`, counting failures under
    /// `op`. Never waits longer than the timeout, connected or not.
    pub async fn run<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T, RedisError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let conn = self
            .inner
            .conn
            .read()
            .map(|c| c.clone())
            .unwrap_or_else(|e| e.into_inner().clone());
        let Some(conn) = conn else {
            self.inner.metrics.redis_errors_total.with_label_values(&[op]).inc();
            return Err(RedisError::NotConnected);
        };
        let timeout = self.inner.config.command_timeout;
        let started = tokio::time::Instant::now();
        let result = tokio::time::timeout(timeout, f(conn)).await;
        self.inner
            .metrics
            .redis_command_duration_seconds
            .with_label_values(&[op])
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => {
                self.inner.metrics.redis_errors_total.with_label_values(&[op]).inc();
                Err(RedisError::Command { op, source })
            }
            Err(_) => {
                self.inner.metrics.redis_errors_total.with_label_values(&[op]).inc();
                Err(RedisError::Timeout { op, timeout })
            }
        }
    }

    async fn supervise(&self) {
        let url = redact_url(&self.inner.config.url);
        let mut announced_down = false;
        loop {
            if self.current().is_none() {
                match self.connect().await {
                    Ok(conn) => {
                        if let Ok(mut slot) = self.inner.conn.write() {
                            *slot = Some(conn);
                        }
                    }
                    Err(e) => {
                        if !announced_down {
                            tracing::warn!(redis = %url, error = %e, "redis unreachable; serving without it and retrying");
                            announced_down = true;
                        }
                        self.set_up(false);
                        tokio::time::sleep(HEALTH_INTERVAL).await;
                        continue;
                    }
                }
            }
            // The health check is `TIME`: as cheap as `PING`, and it keeps the clock offset fresh.
            let sent = time::unix_ms_now();
            let reply = self
                .run("ping", |mut c| async move {
                    redis::cmd("TIME").query_async::<(i64, i64)>(&mut c).await
                })
                .await;
            let healthy = reply.is_ok();
            if let Ok((secs, micros)) = reply {
                let received = time::unix_ms_now();
                let theirs = secs.saturating_mul(1000).saturating_add(micros / 1000);
                let ours = sent + (received - sent) / 2;
                self.inner.clock_offset_ms.store(theirs - ours, Ordering::Relaxed);
            }
            if healthy && !self.is_up() {
                tracing::info!(redis = %url, "redis connected");
                announced_down = false;
            } else if !healthy && self.is_up() {
                tracing::warn!(redis = %url, "redis stopped answering; reconnecting in the background");
                announced_down = true;
            }
            self.set_up(healthy);
            tokio::time::sleep(HEALTH_INTERVAL).await;
        }
    }

    fn current(&self) -> Option<ConnectionManager> {
        self.inner.conn.read().ok().and_then(|c| c.clone())
    }

    fn set_up(&self, up: bool) {
        self.inner.up.store(up, Ordering::Relaxed);
        self.inner.metrics.redis_up.set(i64::from(up));
    }

    async fn connect(&self) -> redis::RedisResult<ConnectionManager> {
        let client = redis::Client::open(self.inner.config.url.as_str())?;
        let timeout = self.inner.config.command_timeout;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(timeout.max(Duration::from_millis(500)))
            .set_response_timeout(timeout)
            .set_number_of_retries(2)
            .set_max_delay(1000);
        ConnectionManager::new_with_config(client, config).await
    }
}
