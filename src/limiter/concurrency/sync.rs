//! The fleet's side of the upstreams' `concurrency`: every [`EVERY`] (at once when a limit was
//! lowered here), for each scope used lately, this replica tells Redis what it runs and wants and
//! what its answers did to the limit, and takes back the fleet's limit and its part of it
//! (`concurrency_v1.lua`). One round trip per scope and exchange, in the background: a request
//! never waits for one. Without an answer (Redis away) a replica keeps its last part and adapts it
//! on its own answers.

use std::sync::Arc;
use std::time::Duration;

use redis::Script;
use std::sync::LazyLock;
use tokio_util::sync::CancellationToken;

use super::{Concurrency, Scope, UpstreamLimit};
use crate::redis::{RedisError, RedisHandle, ReplicaId};
use crate::time;

/// How often a replica exchanges with the fleet: the longest a burst beyond its part waits for a
/// larger one, and the lag of the fleet's limit behind its answers.
pub(crate) const EVERY: Duration = Duration::from_millis(100);

/// How long a replica's report counts after its exchange: a replica paused or dead stops
/// counting this long after its last one.
const REPORT_TTL: Duration = Duration::from_secs(1);

/// A scope nobody used for this long starts again from the initial limit.
const SCOPE_TTL: Duration = Duration::from_secs(600);

/// A scope is exchanged while used within this long (so that its idle report reaches the fleet).
const ACTIVE: Duration = Duration::from_secs(5);

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../redis/scripts/concurrency_v1.lua")));

/// What the fleet answered for a scope.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answer {
    /// The fleet's limit.
    pub(crate) limit: f64,
    /// Decreases of it so far (one more than last heard: it was lowered).
    pub(crate) decreases: u64,
    /// The requests this replica may run.
    pub(crate) part: u32,
    /// Replicas reporting on the scope, this one included.
    pub(crate) replicas: u32,
}

/// Starts the exchanges on `tracker`, until `stop`.
pub(super) fn start(
    concurrency: &Arc<Concurrency>,
    redis: &RedisHandle,
    tracker: &tokio_util::task::TaskTracker,
    stop: CancellationToken,
) {
    tracker.spawn(run(concurrency.clone(), redis.clone(), ReplicaId::random(), stop));
}

/// Exchanges every active scope with the fleet until `stop`.
async fn run(concurrency: Arc<Concurrency>, redis: RedisHandle, replica: ReplicaId, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(EVERY) => {}
            () = concurrency.urgent.notified() => {}
            () = stop.cancelled() => return,
        }
        let now = time::now();
        for upstream in concurrency.all() {
            for scope in upstream.scopes() {
                let active =
                    scope.in_flight() > 0 || now.saturating_duration_since(scope.state.lock().last_used) < ACTIVE;
                if active {
                    exchange(&upstream, &scope, &redis, &replica).await;
                }
            }
        }
    }
}

/// One scope's exchange: what this replica reports, and the fleet's answer applied.
async fn exchange(upstream: &UpstreamLimit, scope: &Scope, redis: &RedisHandle, replica: &ReplicaId) {
    let report = {
        let mut st = scope.state.lock();
        let running = scope.in_flight();
        Report {
            running,
            wanted: running + st.waiting,
            grown: std::mem::take(&mut st.grown),
            lowered: st.lowered.take(),
        }
    };
    match call(upstream, scope, (redis, replica), report).await {
        Ok(answer) => upstream.synced(scope, answer, time::now()),
        Err(e) => tracing::debug!(upstream = %upstream.name, error = %e, "concurrency exchange failed; adapting alone"),
    }
}

/// What a replica tells the fleet of a scope.
struct Report {
    running: u32,
    /// Running and waiting.
    wanted: u32,
    /// What its successes added to the limit since the last exchange.
    grown: f64,
    /// The limit it lowered to since the last exchange, if it did.
    lowered: Option<f64>,
}

async fn call(
    upstream: &UpstreamLimit,
    scope: &Scope,
    (redis, replica): (&RedisHandle, &ReplicaId),
    report: Report,
) -> Result<Answer, RedisError> {
    let (initial, min, max) = upstream.bounds();
    let Report {
        running,
        wanted,
        grown,
        lowered,
    } = report;
    let mut inv = SCRIPT.prepare_invoke();
    inv.key(redis.key(&key(upstream, scope)))
        .arg(replica.as_str())
        .arg(running)
        .arg(wanted)
        .arg(initial)
        .arg(min)
        .arg(max)
        .arg(grown)
        .arg(lowered.unwrap_or(-1.0))
        .arg(REPORT_TTL.as_millis() as u64)
        .arg(SCOPE_TTL.as_millis() as u64);
    let (part, limit, decreases, replicas): (u32, String, u64, u32) = redis
        .run("concurrency", |mut c| async move { inv.invoke_async(&mut c).await })
        .await?;
    Ok(Answer {
        limit: limit.parse().unwrap_or(f64::from(initial)),
        decreases,
        part,
        replicas,
    })
}

/// A scope's key: the upstream (hashed: a name may hold any character), its settings'
/// generation, the credential and model (hashed already); all in the hash tag.
fn key(upstream: &UpstreamLimit, scope: &Scope) -> String {
    let name = blake3::hash(upstream.name.as_bytes());
    let name = &name.to_hex()[..16];
    format!("concurrency:{{{name}:{:08x}:{}}}", upstream.generation, scope.key)
}
