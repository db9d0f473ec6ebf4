//! The Redis connection, whatever the topology (`[redis] url`, `cluster` or `sentinels`): one
//! multiplexed connection per process ([`Conn`]), a health signal, the command wrapper every
//! Redis-backed feature goes through (timeout, metrics), and the connections of their own that
//! blocking reads and pub/sub need ([`RedisHandle::dedicated_for`], [`RedisHandle::pubsub`]),
//! each made to the node that serves them.
//!
//! rebound starts and serves without Redis: a supervisor task keeps trying to connect in the
//! background, and each feature decides how to degrade while [`RedisHandle::is_up`] is false.
//! Failovers are followed without a restart: redis-rs follows a Cluster's (MOVED, slot refresh);
//! for Sentinel the supervisor asks the sentinels again whenever the master stops answering or
//! says it is a replica, and reconnects to the one they name. What Redis refuses for good (a
//! wrong password, an untrusted certificate) is told apart from an outage: startup fails with it.

mod conn;
mod nodes;
mod replica;

use parking_lot::RwLock;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection, PubSub};
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{RedisConfig, RedisTopology};
use crate::metrics::Metrics;
use crate::time;
pub use conn::Conn;
pub use nodes::{key_slot, SentinelError};
use nodes::{parse_slots, Nodes};
pub use replica::ReplicaId;

/// How often the supervisor checks Redis.
const HEALTH_INTERVAL: Duration = Duration::from_secs(1);
/// The shortest pause between two checks (a failed command asks for one sooner).
const KICK_GAP: Duration = Duration::from_millis(100);
/// Failed health checks in a row after which a Cluster connection is made anew.
const CLUSTER_REBUILD_AFTER: u32 = 3;

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
    #[error("redis {op}: {detail}")]
    Connect { op: &'static str, detail: String },
    /// No sentinel named the master: what the last one asked answered, kept as the source.
    #[error("redis sentinel: {0}")]
    Sentinel(#[from] SentinelError),
    #[error("redis command {op} written, but acknowledged by {acked} of the {wanted} replicas it waited for")]
    NotReplicated { op: &'static str, wanted: u32, acked: i64 },
}

/// A cheap-to-clone handle on the process's Redis connection.
#[derive(Clone)]
pub struct RedisHandle {
    inner: Arc<Inner>,
}

struct Inner {
    config: RedisConfig,
    /// How to reach the nodes; `None` when the configuration cannot work (see `refused`).
    nodes: Option<Nodes>,
    conn: RwLock<Option<Conn>>,
    /// Completions that wait for replicas (`WAIT` blocks its connection): their own lane.
    durable: RwLock<Option<Conn>>,
    /// Sentinel: the master connected to, and the sentinel asked first.
    master: RwLock<Option<(String, u16)>>,
    first_sentinel: AtomicUsize,
    /// Cluster: which master the next pub/sub connection goes to.
    next_node: AtomicUsize,
    up: AtomicBool,
    /// Wakes the supervisor early (Sentinel: a command failed, the master may have changed).
    kick: tokio::sync::Notify,
    /// What Redis refused for good (credentials, trust), with how to fix it.
    refused: RwLock<Option<String>>,
    /// Redis's clock minus this replica's, in ms, measured by every health check (`TIME`);
    /// `i64::MIN` until the first one answers.
    clock_offset_ms: AtomicI64,
    metrics: Arc<Metrics>,
}

impl RedisHandle {
    /// Starts the supervisor (connect, then check every second) on `tasks`; it stops with `stop`.
    pub fn start(
        config: RedisConfig,
        metrics: Arc<Metrics>,
        tasks: &TaskTracker,
        stop: CancellationToken,
    ) -> RedisHandle {
        metrics.redis_up.set(0);
        let (nodes, refused) = match nodes::read_ca(&config) {
            Ok(ca) => (Some(Nodes::new(&config, ca)), None),
            // Kept as the text readiness and startup show (what to fix).
            Err(e) => (None, Some(e.to_string())),
        };
        let handle = RedisHandle {
            inner: Arc::new(Inner {
                config,
                nodes,
                conn: RwLock::new(None),
                durable: RwLock::new(None),
                master: RwLock::new(None),
                first_sentinel: AtomicUsize::new(0),
                next_node: AtomicUsize::new(0),
                up: AtomicBool::new(false),
                kick: tokio::sync::Notify::new(),
                refused: RwLock::new(refused),
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
    /// whose Redis is up does not answer its first requests as if it were down). `Err`: Redis
    /// refused rebound for good (credentials, certificate): the message says what to fix.
    pub(crate) async fn wait_connected(&self, bound: Duration) -> Result<bool, String> {
        let end = crate::time::now() + bound;
        while !self.is_up() {
            if let Some(why) = self.refused() {
                return Err(why);
            }
            if crate::time::now() >= end {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(true)
    }

    /// Whether the last health check answered (on a Cluster: every master did).
    pub fn is_up(&self) -> bool {
        self.inner.up.load(Ordering::Relaxed)
    }

    /// What Redis refused for good since the last answer, if anything.
    pub fn refused(&self) -> Option<String> {
        self.inner.refused.read().clone()
    }

    /// The topology and its state, in a few words (readiness).
    pub fn status(&self) -> String {
        let state = if self.is_up() { "up" } else { "unreachable" };
        match &self.inner.config.topology {
            RedisTopology::Standalone { .. } => format!("redis: {state}"),
            RedisTopology::Cluster { .. } => format!("redis cluster: {state}"),
            RedisTopology::Sentinel { master_name, .. } => match self.master() {
                Some((host, port)) if self.is_up() => {
                    format!("redis sentinel: {state}, master {master_name} at {host}:{port}")
                }
                _ => format!("redis sentinel: {state}"),
            },
        }
    }

    /// Redis's clock now (unix ms), from this replica's clock and the offset measured by the last
    /// health check; `None` before the first one answered. Scripts compare it with `TIME` to refuse
    /// a command that ran after its caller gave up on it (it sat in a frozen Redis's buffer).
    pub(crate) fn redis_now_ms(&self) -> Option<i64> {
        let offset = self.inner.clock_offset_ms.load(Ordering::Relaxed);
        (offset != i64::MIN).then(|| signed(time::now_unix_ms()).saturating_add(offset))
    }

    /// The instant on Redis's clock (unix ms) after which a command sent now has been given up
    /// on: now plus `command_timeout`. 0 (no bound) while the offset is unknown.
    pub(crate) fn give_up_at_ms(&self) -> i64 {
        let timeout = i64::try_from(self.inner.config.command_timeout.as_millis()).unwrap_or(i64::MAX);
        self.redis_now_ms().map_or(0, |now| now.saturating_add(timeout))
    }

    /// `key_prefix` + `suffix`.
    pub fn key(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.inner.config.key_prefix)
    }

    /// How long a lost subscription or connection waits, at most, before it is tried again: the
    /// fleet sync interval, so that shared state is back within about two of them after Redis is.
    pub(crate) fn reconnect_backoff_max(&self) -> Duration {
        self.inner.config.sync_interval.max(Duration::from_millis(50))
    }

    /// `liveness`: how long a replica counts as alive after its last heartbeat.
    pub fn liveness(&self) -> Duration {
        self.inner.config.liveness
    }

    /// The configured command timeout.
    pub fn command_timeout(&self) -> Duration {
        self.inner.config.command_timeout
    }

    /// `fingerprint`: the version of the request fingerprint written into records.
    pub(crate) fn fingerprint_version(&self) -> u32 {
        self.inner.config.fingerprint
    }

    /// `wait_replicas`: how many replicas must acknowledge a completion (0: none).
    pub fn wait_replicas(&self) -> u32 {
        self.inner.config.wait_replicas
    }

    /// Runs one command (or pipeline / script) within `command_timeout`, counting failures under
    /// `op`. Never waits longer than the timeout, connected or not.
    pub async fn run<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T, RedisError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let conn = read(&self.inner.conn);
        self.run_on(conn, op, f).await
    }

    /// [`RedisHandle::run`] on the lane of writes that wait for replicas (`WAIT` holds its
    /// connection until the replicas answer: the shared one must not wait behind it).
    pub(crate) async fn run_durable<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T, RedisError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let conn = read(&self.inner.durable).or_else(|| read(&self.inner.conn));
        self.run_on(conn, op, f).await
    }

    async fn run_on<T, F, Fut>(&self, conn: Option<Conn>, op: &'static str, f: F) -> Result<T, RedisError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let Some(conn) = conn else {
            self.count(op);
            self.kick();
            return Err(RedisError::NotConnected);
        };
        let timeout = self.inner.config.command_timeout;
        let started = crate::time::now();
        let result = tokio::time::timeout(timeout, f(conn)).await;
        self.inner
            .metrics
            .redis_command_duration_seconds
            .with_label_values(&[op])
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => {
                self.count(op);
                if source.is_io_error() || source.kind() == redis::ErrorKind::ReadOnly {
                    self.kick();
                }
                Err(RedisError::Command { op, source })
            }
            Err(_) => {
                self.count(op);
                self.kick();
                Err(RedisError::Timeout { op, timeout })
            }
        }
    }

    /// Asks the supervisor to check now rather than at its next tick (Sentinel only: a lost
    /// master is looked for again at once, not a second later).
    fn kick(&self) {
        if matches!(self.inner.config.topology, RedisTopology::Sentinel { .. }) {
            self.inner.kick.notify_one();
        }
    }

    /// Counts a failure of `op` (`redis_errors_total{op}`).
    pub fn count(&self, op: &str) {
        self.inner.metrics.redis_errors_total.with_label_values(&[op]).inc();
    }

    /// A connection of its own to the node that serves `key` (blocking reads such as `XREAD
    /// BLOCK` would stall every command behind them on the shared one): the server, Sentinel's
    /// current master, or the master of the key's Cluster slot. Made within the connect timeout;
    /// its replies wait at most `response_timeout` (`None`: as long as the caller's own bound).
    pub(crate) async fn dedicated_for(
        &self,
        key: &str,
        response_timeout: Option<Duration>,
    ) -> Result<MultiplexedConnection, RedisError> {
        let op = "dedicated";
        let client = self.client_for(Some(key)).await?;
        let nodes = self.nodes()?;
        let mut cfg = redis::AsyncConnectionConfig::new().set_connection_timeout(nodes.connect_timeout);
        if let Some(t) = response_timeout {
            cfg = cfg.set_response_timeout(t);
        }
        let connect = client.get_multiplexed_async_connection_with_config(&cfg);
        match tokio::time::timeout(nodes.connect_timeout, connect).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(source)) => {
                self.count(op);
                Err(RedisError::Command { op, source })
            }
            Err(_) => {
                self.count(op);
                Err(RedisError::Timeout {
                    op,
                    timeout: nodes.connect_timeout,
                })
            }
        }
    }

    /// A pub/sub connection (subscribe on it). Classic pub/sub: on a Cluster every node hears
    /// what is published on any node, so it goes to any master (another one after each loss).
    pub(crate) async fn pubsub(&self) -> Result<PubSub, RedisError> {
        let op = "pubsub";
        let client = self.client_for(None).await?;
        let timeout = self.nodes()?.connect_timeout;
        match tokio::time::timeout(timeout, client.get_async_pubsub()).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(source)) => {
                self.count(op);
                Err(RedisError::Command { op, source })
            }
            Err(_) => {
                self.count(op);
                Err(RedisError::Timeout { op, timeout })
            }
        }
    }

    fn nodes(&self) -> Result<&Nodes, RedisError> {
        self.inner.nodes.as_ref().ok_or_else(|| RedisError::Connect {
            op: "connect",
            detail: self.refused().unwrap_or_default(),
        })
    }

    /// A client for the node serving `key` (`None`: any master).
    async fn client_for(&self, key: Option<&str>) -> Result<redis::Client, RedisError> {
        let nodes = self.nodes()?;
        let client = match &nodes.topology {
            RedisTopology::Standalone { url } => nodes.url_client(url),
            RedisTopology::Sentinel { .. } => {
                let (host, port) = self.master().ok_or(RedisError::NotConnected)?;
                nodes.node_client(&host, port)
            }
            RedisTopology::Cluster { .. } => {
                let (host, port) = self.cluster_node(key).await?;
                nodes.node_client(&host, port)
            }
        };
        client.map_err(|source| RedisError::Command { op: "connect", source })
    }

    /// The master of `key`'s slot, or (`None`) the next master in turn.
    async fn cluster_node(&self, key: Option<&str>) -> Result<(String, u16), RedisError> {
        let op = "cluster_slots";
        let reply = self
            .run(op, |mut c| async move {
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<redis::Value>(&mut c)
                    .await
            })
            .await?;
        let mut ranges = parse_slots(&reply);
        let found = match key {
            Some(key) => {
                let slot = key_slot(key.as_bytes());
                ranges.into_iter().find(|r| (r.start..=r.end).contains(&slot))
            }
            None => {
                ranges.sort_by(|a, b| (&a.host, a.port).cmp(&(&b.host, b.port)));
                ranges.dedup_by(|a, b| a.host == b.host && a.port == b.port);
                let n = self.inner.next_node.fetch_add(1, Ordering::Relaxed);
                let len = ranges.len().max(1);
                ranges.into_iter().nth(n % len)
            }
        };
        found.map(|r| (r.host, r.port)).ok_or_else(|| {
            self.count(op);
            RedisError::Connect {
                op,
                detail: "no node serves that slot".into(),
            }
        })
    }

    fn master(&self) -> Option<(String, u16)> {
        self.inner.master.read().clone()
    }

    async fn supervise(&self) {
        let Some(nodes) = self.inner.nodes.as_ref() else {
            if let Some(why) = self.refused() {
                tracing::error!(error = %why, "redis cannot be used");
            }
            return;
        };
        let topology = nodes.topology.describe();
        let mut announced_down = false;
        let mut failures = 0u32;
        loop {
            if read(&self.inner.conn).is_none() {
                if let Err(e) = self.connect(nodes).await {
                    self.count("connect");
                    self.set_up(false);
                    self.note_failure(&topology, &e, &mut announced_down);
                    self.pause().await;
                    continue;
                }
            }
            let health = self.health().await;
            match &health {
                Ok(()) => {
                    failures = 0;
                    *self.inner.refused.write() = None;
                    if !self.is_up() {
                        tracing::info!(redis = %topology, "redis connected");
                        announced_down = false;
                    }
                }
                Err(e) => {
                    failures += 1;
                    if self.is_up() {
                        tracing::warn!(redis = %topology, error = %e, "redis stopped answering; reconnecting in the background");
                        announced_down = true;
                    }
                }
            }
            self.set_up(health.is_ok());
            if health.is_err() {
                self.recover(nodes, failures).await;
            }
            self.pause().await;
        }
    }

    /// Until the next check: `HEALTH_INTERVAL`, or sooner when a command failed (at most every
    /// `KICK_GAP`).
    async fn pause(&self) {
        tokio::time::sleep(KICK_GAP).await;
        tokio::select! {
            _ = tokio::time::sleep(HEALTH_INTERVAL - KICK_GAP) => {}
            _ = self.inner.kick.notified() => {}
        }
    }

    /// After a failed health check: Sentinel asks the sentinels again at once (a failover names
    /// another master); a Cluster connection is made anew after a few failures in a row (its own
    /// recovery follows MOVED and slot changes, this covers the rest).
    async fn recover(&self, nodes: &Nodes, failures: u32) {
        let again = match nodes.topology {
            RedisTopology::Sentinel { .. } => true,
            RedisTopology::Cluster { .. } => failures >= CLUSTER_REBUILD_AFTER,
            RedisTopology::Standalone { .. } => false,
        };
        if !again {
            return;
        }
        if let Err(e) = self.connect(nodes).await {
            self.count("connect");
            tracing::debug!(error = %e, "redis reconnection failed");
            if matches!(nodes.topology, RedisTopology::Sentinel { .. }) {
                // Commands fail at once rather than wait on a master that is gone.
                store(&self.inner.conn, None);
                store(&self.inner.durable, None);
            }
        }
    }

    fn note_failure(&self, topology: &str, e: &RedisError, announced_down: &mut bool) {
        if let Some(why) = refusal(e) {
            let first = self.refused().is_none();
            *self.inner.refused.write() = Some(format!("redis {topology} refused rebound: {why} ({e})"));
            if first {
                tracing::error!(redis = %topology, error = %e, "redis refused rebound: {why}");
            }
            *announced_down = true;
        } else if !*announced_down {
            tracing::warn!(redis = %topology, error = %e, "redis unreachable; serving without it and retrying");
            *announced_down = true;
        }
    }

    fn set_up(&self, up: bool) {
        self.inner.up.store(up, Ordering::Relaxed);
        self.inner.metrics.redis_up.set(i64::from(up));
    }

    /// (Re)connects the shared connection (and the durable lane when completions wait for
    /// replicas) to the topology as it is now.
    async fn connect(&self, nodes: &Nodes) -> Result<(), RedisError> {
        let timeout = self.inner.config.command_timeout;
        let lanes = if self.inner.config.wait_replicas > 0 { 2 } else { 1 };
        let mut conns = Vec::with_capacity(lanes);
        match &nodes.topology {
            RedisTopology::Standalone { url } => {
                let client = nodes
                    .url_client(url)
                    .map_err(|source| RedisError::Command { op: "connect", source })?;
                for _ in 0..lanes {
                    conns.push(Conn::Single(self.manager(client.clone(), nodes).await?));
                }
            }
            RedisTopology::Sentinel { sentinels, master_name } => {
                let first = self.inner.first_sentinel.load(Ordering::Relaxed);
                let (host, port, at) = nodes.sentinel_master(sentinels, master_name, first).await?;
                self.inner.first_sentinel.store(at, Ordering::Relaxed);
                let unchanged = self.master() == Some((host.clone(), port)) && read(&self.inner.conn).is_some();
                let client = nodes
                    .node_client(&host, port)
                    .map_err(|source| RedisError::Command { op: "connect", source })?;
                for _ in 0..lanes {
                    let mut c = Conn::Single(self.manager(client.clone(), nodes).await?);
                    check_master(&mut c, timeout).await?;
                    conns.push(c);
                }
                if !unchanged {
                    tracing::info!(master = %master_name, at = %format!("{host}:{port}"), "redis sentinel: connected to the master");
                }
                store(&self.inner.master, Some((host, port)));
            }
            RedisTopology::Cluster { seeds } => {
                for _ in 0..lanes {
                    let cluster = tokio::time::timeout(nodes.connect_timeout * 2, nodes.cluster(seeds, timeout)).await;
                    match cluster {
                        Ok(Ok(c)) => conns.push(Conn::Cluster(c)),
                        failed => {
                            // The cluster client says only that no seed answered: ask one why.
                            for seed in seeds {
                                let client = nodes
                                    .url_client(seed)
                                    .map_err(|source| RedisError::Command { op: "connect", source })?;
                                probe(&client, nodes.connect_timeout).await?;
                            }
                            return Err(match failed {
                                Ok(Err(source)) => RedisError::Command { op: "connect", source },
                                _ => RedisError::Timeout {
                                    op: "connect",
                                    timeout: nodes.connect_timeout * 2,
                                },
                            });
                        }
                    }
                }
            }
        }
        let mut conns = conns.into_iter();
        store(&self.inner.conn, conns.next());
        store(&self.inner.durable, conns.next());
        Ok(())
    }

    async fn manager(&self, client: redis::Client, nodes: &Nodes) -> Result<ConnectionManager, RedisError> {
        // One plain connection first: it reports what the server refuses (credentials, TLS
        // trust) as it is, where the manager would retry it into a timeout.
        probe(&client, nodes.connect_timeout).await?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(nodes.connect_timeout)
            .set_response_timeout(self.inner.config.command_timeout)
            // One connection try per reconnection, no backoff sleeps (the crate's are at least
            // 1 s): while Redis is down a command fails at once, and the first one after it is
            // back reconnects. The supervisor's checks keep trying in between.
            .set_number_of_retries(0);
        let connect = ConnectionManager::new_with_config(client, config);
        match tokio::time::timeout(nodes.connect_timeout * 2, connect).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(source)) => Err(RedisError::Command { op: "connect", source }),
            Err(_) => Err(RedisError::Timeout {
                op: "connect",
                timeout: nodes.connect_timeout * 2,
            }),
        }
    }

    /// One health check: the shared connection answers (Sentinel: from a master; Cluster: every
    /// master answers), and `TIME` keeps the clock offset fresh.
    async fn health(&self) -> Result<(), RedisError> {
        let timeout = self.inner.config.command_timeout;
        match &self.inner.config.topology {
            RedisTopology::Sentinel { .. } => {
                self.run("ping", |mut c| async move {
                    check_master(&mut c, timeout).await.map_err(to_redis)
                })
                .await?;
            }
            RedisTopology::Cluster { .. } => {
                self.run("ping", |mut c| async move {
                    let Conn::Cluster(c) = &mut c else { return Ok(()) };
                    let all = RoutingInfo::MultiNode((
                        MultipleNodeRoutingInfo::AllMasters,
                        Some(ResponsePolicy::AllSucceeded),
                    ));
                    c.route_command(&redis::cmd("PING"), all).await.map(|_| ())
                })
                .await?;
            }
            RedisTopology::Standalone { .. } => {}
        }
        let sent = signed(time::now_unix_ms());
        let (secs, micros) = self
            .run("ping", |mut c| async move {
                redis::cmd("TIME").query_async::<(i64, i64)>(&mut c).await
            })
            .await?;
        let received = signed(time::now_unix_ms());
        let theirs = secs.saturating_mul(1000).saturating_add(micros / 1000);
        let ours = sent + (received - sent) / 2;
        self.inner.clock_offset_ms.store(theirs - ours, Ordering::Relaxed);
        Ok(())
    }
}

/// One plain connection to `client`'s node (and `PING`): what it refuses, as it says it.
async fn probe(client: &redis::Client, timeout: Duration) -> Result<(), RedisError> {
    let cfg = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(timeout)
        .set_response_timeout(timeout);
    let attempt = async {
        let mut c = client.get_multiplexed_async_connection_with_config(&cfg).await?;
        redis::cmd("PING").query_async::<()>(&mut c).await
    };
    match tokio::time::timeout(timeout * 2, attempt).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(RedisError::Command { op: "connect", source }),
        Err(_) => Err(RedisError::Timeout { op: "connect", timeout }),
    }
}

/// Whether the node behind `conn` is a master (`ROLE`): after a failover the old master may come
/// back as a replica of the new one.
async fn check_master(conn: &mut Conn, timeout: Duration) -> Result<(), RedisError> {
    let role = tokio::time::timeout(timeout, redis::cmd("ROLE").query_async::<redis::Value>(conn)).await;
    let role = match role {
        Ok(Ok(v)) => v,
        Ok(Err(source)) => return Err(RedisError::Command { op: "ping", source }),
        Err(_) => return Err(RedisError::Timeout { op: "ping", timeout }),
    };
    let first = match &role {
        redis::Value::Array(items) => items.first(),
        _ => None,
    };
    match first {
        Some(redis::Value::BulkString(b)) if b == b"master" => Ok(()),
        Some(redis::Value::SimpleString(s)) if s == "master" => Ok(()),
        _ => Err(RedisError::Connect {
            op: "ping",
            detail: "the node sentinel names is not a master (yet)".into(),
        }),
    }
}

fn to_redis(e: RedisError) -> redis::RedisError {
    match e {
        RedisError::Command { source, .. } => source,
        // Kept whole, as the source of an I/O error (redis's own error takes no other source).
        other => redis::RedisError::from(std::io::Error::other(other)),
    }
}

/// What Redis refused for good, and how to fix it: credentials or trust roots (an outage is
/// retried; these are not fixed by waiting).
fn refusal(e: &RedisError) -> Option<&'static str> {
    let source = match e {
        RedisError::Command { source, .. } => source,
        RedisError::Sentinel(SentinelError::Failed { source, .. }) => {
            let text = source.to_string();
            return (text.contains("WRONGPASS") || text.contains("NOAUTH") || text.contains("certificate"))
                .then_some("check [redis] username, password and ca_file");
        }
        _ => return None,
    };
    let auth = source.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(source.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"));
    if auth {
        return Some("authentication refused: check [redis] username and password (or the URL's)");
    }
    let text = source.to_string();
    if text.contains("certificate") || text.contains("UnknownIssuer") {
        return Some("its TLS certificate is not trusted: check [redis] ca_file (the CA that signed it)");
    }
    None
}

fn read<T: Clone>(slot: &RwLock<Option<T>>) -> Option<T> {
    slot.read().clone()
}

fn store<T>(slot: &RwLock<Option<T>>, value: Option<T>) {
    *slot.write() = value;
}

/// Unix milliseconds as a signed number, for offsets between clocks.
fn signed(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}
