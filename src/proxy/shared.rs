//! What outlives one configuration: the process's metrics, tasks, stores, circuits, job queue
//! and trace exporter, handed to each [`super::Proxy`] a (re)load builds.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::circuit::Circuits;
use crate::cloud::Clouds;
use crate::dead_letters::DeadLetters;
use crate::idempotency::{AnyStore, MemoryLimits, MemoryStore, Records, RedisStore};
use crate::jobs::Jobs;
use crate::metrics::Metrics;
use crate::redis::RedisHandle;
use crate::traces::Traces;

/// What outlives one configuration: a reload builds a new [`super::Proxy`] around the same metrics,
/// tasks and idempotency store (in-memory records survive a reload).
#[derive(Clone)]
pub struct Shared {
    pub metrics: Arc<Metrics>,
    /// Tasks that outlive their request (upgraded connections, idempotency writes), drained on
    /// shutdown.
    pub tasks: TaskTracker,
    /// Cancelled when the shutdown grace runs out.
    pub(crate) hard_stop: CancellationToken,
    /// The idempotency store (Redis when configured: any replica answers; else in memory), and
    /// the delivered responses this replica holds until their write lands.
    pub store: Records,
    /// Requests that failed for good: a Redis Stream when configured, else a ring in memory.
    pub dead_letters: DeadLetters,
    /// Every upstream's breaker and cooldowns (state survives reloads).
    pub circuits: Arc<Circuits>,
    /// Async jobs: the queue (Redis when configured, else in memory) and its workers.
    pub jobs: Jobs,
    /// OpenTelemetry traces (started once: a reload keeps the exporter it started with).
    pub traces: Traces,
    /// The upstreams' cloud credentials (a reload that keeps an upstream's `auth` keeps its
    /// credential).
    pub(crate) clouds: Clouds,
    /// Where the quotas of `[limits.*]` come from: Redis leases, else this process's counters.
    pub(crate) limit_store: Arc<crate::limiter::store::Counters>,
    /// The most replicas seen sharing a limit's bucket (the share a replica takes while Redis is
    /// away), kept across reloads.
    pub(crate) limit_fleet_size: Arc<std::sync::atomic::AtomicU32>,
    /// The upstreams' `concurrency` limits (a reload that keeps an upstream's settings keeps its
    /// limits).
    pub(crate) concurrency: Arc<crate::limiter::concurrency::Concurrency>,
}

impl Shared {
    /// The store for `redis`: Redis when configured (with the relay that lets duplicates follow
    /// an original on another replica, its tasks on `tasks` until `stop`), else a bounded map in
    /// memory (one replica).
    pub(crate) fn store_for(redis: Option<RedisHandle>, tasks: &TaskTracker, stop: CancellationToken) -> Records {
        match redis {
            Some(r) => Records::with_relay(AnyStore::Redis(RedisStore::new(r.clone())), r, tasks, stop),
            None => Records::new(AnyStore::Memory(MemoryStore::new(MemoryLimits::default()))),
        }
    }
}
