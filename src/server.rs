//! Listeners, accept loops and graceful shutdown.
//!
//! [`start`] binds both listeners (port 0 works: tests read the bound addresses) and runs until
//! [`Server::shutdown`]: then it stops accepting, turns `/readyz` to 503, lets in-flight requests
//! and streams finish within `shutdown_grace`, and closes whatever is left after it.

use crate::limiter::concurrency::Concurrency;
use crate::limiter::store::Counters;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::{self, AdminState};
use crate::circuit::Circuits;
use crate::config::Config;
use crate::dead_letters::DeadLetters;
use crate::jobs::Jobs;
use crate::metrics::Metrics;
use crate::proxy::{BuildError, Proxy, Shared};
use crate::redis::RedisHandle;
use crate::reload::{ReloadError, Reloader};
use crate::shutdown::ShutdownSignal;
use crate::traces::Traces;
use crate::workers::Workers;
use arc_swap::ArcSwap;

/// How long startup waits for Redis before serving without it.
const REDIS_STARTUP_WAIT: Duration = Duration::from_secs(2);

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr} ({key}): {source}")]
    Bind {
        key: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Traces(#[from] crate::traces::TracesError),
    #[error("{0}")]
    Redis(String),
    #[error("metrics setup failed: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// How the server ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Every in-flight request finished within the grace period.
    Drained,
    /// The grace period ran out; this many tasks (connections, pending writes, job runs) were
    /// ended unfinished.
    GraceExpired { closed: usize },
}

/// A running rebound.
pub struct Server {
    /// Where the proxy listens.
    pub proxy_addr: SocketAddr,
    /// Where the admin endpoints listen.
    pub admin_addr: SocketAddr,
    /// The metrics this instance records.
    pub metrics: Arc<Metrics>,
    reloader: Arc<Reloader>,
    shutdown: CancellationToken,
    done: JoinHandle<Exit>,
}

impl Server {
    /// Starts draining (idempotent).
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Reloads the configuration file now (SIGHUP). An invalid file is refused, logged and
    /// counted; the running configuration stays in force.
    pub fn reload(&self) -> Result<(), ReloadError> {
        self.reloader.reload("signal")
    }

    /// Waits for the end of the drain.
    pub async fn wait(self) -> Exit {
        self.done.await.unwrap_or(Exit::GraceExpired { closed: 0 })
    }
}

/// The journal's task: reads the series once a second, the targets' states brought up to date
/// first, until `stop`.
fn start_journal(
    journal: Arc<crate::journal::Journal>,
    proxy: &Arc<ArcSwap<Proxy>>,
    metrics: &Arc<Metrics>,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let proxy = proxy.clone();
    let refresh = move || proxy.load().refresh_target_states(crate::time::now());
    crate::tasks::spawn(
        "journal",
        crate::journal::run(journal, metrics.clone(), refresh, stop.clone()),
    )
}

/// A listener on `addr` (`key` names it in the error), and the address it is bound to (port 0
/// works: tests read the bound addresses).
async fn bind(key: &'static str, addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { key, addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    Ok((listener, bound))
}

/// Binds the listeners and starts serving, every connection on the caller's runtime.
pub async fn start(config: Config) -> Result<Server, StartError> {
    start_on(config, Workers::none()).await
}

/// Binds the listeners and starts serving: the caller's runtime accepts and runs the background
/// tasks, and each client connection is served by the least busy of `workers`.
pub async fn start_on(config: Config, mut workers: Workers) -> Result<Server, StartError> {
    let metrics = Arc::new(Metrics::new()?);
    let tasks = TaskTracker::new();
    let hard_stop = CancellationToken::new();

    let (proxy_listener, proxy_addr) = bind("server.listen", config.server.listen).await?;
    let (admin_listener, admin_addr) = bind("admin.listen", config.admin.listen).await?;
    workers.count_in(&metrics.client_connections);

    // Background tasks live as long as the process, not as one configuration.
    let background = TaskTracker::new();
    let background_stop = CancellationToken::new();
    let redis = config
        .redis
        .clone()
        .map(|r| RedisHandle::start(r, metrics.clone(), &background, background_stop.clone()));
    let shared = Shared {
        metrics: metrics.clone(),
        tasks: tasks.clone(),
        hard_stop: hard_stop.clone(),
        store: Shared::store_for(redis.clone(), &background, background_stop.clone()),
        dead_letters: DeadLetters::new(
            &config.dead_letters,
            config.jobs.secret.as_deref(),
            redis.clone(),
            metrics.clone(),
        ),
        circuits: Arc::new(Circuits::new(&config, metrics.clone())),
        jobs: Jobs::new(&config, redis.clone(), metrics.clone()),
        traces: Traces::start(&config.telemetry, &metrics)?,
        clouds: crate::cloud::Clouds::new(metrics.clone(), background.clone(), background_stop.clone()),
        limit_store: Arc::new(Counters::of(redis.clone())),
        limit_fleet_size: Arc::default(),
        concurrency: Concurrency::start(metrics.clone(), redis.as_ref(), &background, background_stop.clone()),
    };
    let traces = shared.traces.clone();
    shared
        .circuits
        .start(redis.clone(), &background, background_stop.clone());
    let shared_dead_letters = shared.dead_letters.clone();
    let jobs = shared.jobs.clone();
    let proxy = Arc::new(ArcSwap::from_pointee(Proxy::new(&config, &shared)?));
    if let Some(r) = &redis {
        // Bounded: rebound serves without Redis, each feature degrading as configured; but what
        // Redis refuses for good (credentials, certificate) stops the start with its reason.
        if let Err(why) = r.wait_connected(REDIS_STARTUP_WAIT).await {
            background_stop.cancel();
            return Err(StartError::Redis(why));
        }
    }
    let reloader = Arc::new(Reloader::new(&config, proxy.clone(), shared));
    background.spawn(reloader.clone().watch(background_stop.clone()));

    let admin_state = Arc::new(AdminState {
        metrics: metrics.clone(),
        draining: false.into(),
        redis,
        token: config.admin.token.clone(),
        dead_letters: shared_dead_letters,
        proxy: proxy.clone(),
        journal: Arc::default(),
    });
    let admin_stop = CancellationToken::new();
    let journal_task = start_journal(admin_state.journal.clone(), &proxy, &metrics, &admin_stop);
    let admin_task = crate::tasks::spawn(
        "admin listener",
        admin::serve(admin_listener, admin_state.clone(), admin_stop.clone()),
    );

    let shutdown = CancellationToken::new();
    // Job workers stop taking jobs when the drain starts; a running job gets the grace, like an
    // in-flight request, and is abandoned when it runs out (another replica reclaims it).
    jobs.start(proxy.clone(), &tasks, shutdown.clone(), hard_stop.clone());
    let drain = Drain {
        tasks,
        hard_stop,
        grace: config.server.shutdown_grace,
    };
    let limits = ClientLimits::of(&config.server);
    let done = crate::tasks::spawn("proxy listener", {
        let shutdown = shutdown.clone();
        async move {
            let listening = Listening {
                listener: proxy_listener,
                workers,
            };
            let exit = serve(listening, proxy, shutdown, drain, limits, &admin_state).await;
            traces.shutdown(Duration::from_secs(2)).await;
            background_stop.cancel();
            background.close();
            background.wait().await;
            admin_stop.cancel();
            let _ = admin_task.await;
            let _ = journal_task.await;
            exit
        }
    });
    Ok(Server {
        proxy_addr,
        admin_addr,
        metrics,
        reloader,
        shutdown,
        done,
    })
}

/// What one client may hold (startup values: a reload does not change them).
#[derive(Clone, Copy)]
struct ClientLimits {
    /// Connections held at once; past it, new ones wait in the listen backlog.
    max_connections: u32,
    /// The request line and headers, at most. A larger head gets rebound's own 431
    /// (`request_head_too_large`, from the proxy) while it fits hyper's read buffer
    /// ([`ClientLimits::read_buffer`]); past that, hyper's bare 431 and the connection closed.
    max_request_head: u64,
    /// The first byte, then the whole request head, within this; an idle kept-alive connection
    /// is closed after it.
    header_read_timeout: Duration,
}

impl ClientLimits {
    fn of(server: &crate::config::ServerConfig) -> ClientLimits {
        ClientLimits {
            max_connections: server.max_connections,
            max_request_head: server.max_request_head,
            header_read_timeout: server.header_read_timeout,
        }
    }

    /// hyper's HTTP/1 read buffer: twice the head limit, and never below hyper's own default
    /// (~400 KiB), so that an oversized head of up to that size gets rebound's JSON 431.
    fn read_buffer(&self) -> usize {
        const HYPER_DEFAULT: usize = 8192 + 4096 * 100;
        usize::try_from(self.max_request_head.saturating_mul(2))
            .unwrap_or(usize::MAX)
            .max(HYPER_DEFAULT)
    }
}

struct Drain {
    /// Every task the drain waits for: client connections, upgraded connections, and the work
    /// that outlives a request (idempotency writes, dead-letter writes, job runs).
    tasks: TaskTracker,
    /// Cancelled when the grace runs out: closes what is left.
    hard_stop: CancellationToken,
    grace: Duration,
}

/// Where client connections come from and the threads that serve them (which end with the drain).
struct Listening {
    listener: TcpListener,
    workers: Workers,
}

/// The proxy listener's life: accept until shutdown, then drain.
async fn serve(
    listening: Listening,
    proxy: Arc<ArcSwap<Proxy>>,
    shutdown: CancellationToken,
    drain: Drain,
    limits: ClientLimits,
    admin: &AdminState,
) -> Exit {
    let Listening { listener, workers } = listening;
    let signal = ShutdownSignal::new();
    let builders = Arc::new(builders(&limits));
    let serving = Serving {
        tasks: &drain.tasks,
        limits: &limits,
        builders: &builders,
        signal: &signal,
        workers: &workers,
    };
    accept_until_shutdown(&listener, &proxy, &shutdown, serving).await;
    drop(listener);
    admin.draining.store(true, Ordering::SeqCst);
    let exit = drain_connections(drain, signal).await;
    // What this replica leased of the fleet's limits and did not spend goes back to the others
    // (bounded: a Redis that does not answer does not hold the exit up).
    let proxy = proxy.load_full();
    let _ = tokio::time::timeout(Duration::from_secs(2), proxy.hand_back_limits()).await;
    exit
}

/// The connection builders: hyper's HTTP/1.1 for a connection that cannot be HTTP/2, and
/// hyper-util's auto builder (HTTP/1.1 or HTTP/2 by the preface) for one that opens with a prefix
/// of HTTP/2's preface. hyper-util's builder reads the first bytes apart to decide; hyper's
/// HTTP/1.1 connection then reads the rest into a buffer grown to 16 KiB instead of 8, kept for
/// the connection's life, and every read of the connection passes through its rewind wrapper.
struct Builders {
    http1: hyper::server::conn::http1::Builder,
    auto: hyper_util::server::conn::auto::Builder<TokioExecutor>,
}

/// What an HTTP/2 connection opens with (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Whether the bytes a connection opened with may begin HTTP/2's preface: then the auto builder
/// reads on and decides. No HTTP/1.1 request line does (its method would be `PRI`).
fn may_be_http2(first: &[u8]) -> bool {
    H2_PREFACE.starts_with(first)
}

/// HTTP/1.1 (keep-alive, head read timeout and size) and HTTP/2 (header list size), as the
/// limits say. The auto builder's HTTP/1.1 has the same settings as `http1`: a connection that
/// opened with a bare `P` goes to it and may be a `POST`.
fn builders(limits: &ClientLimits) -> Builders {
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .keep_alive(true)
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.read_buffer());
    let mut auto = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    auto.http1()
        .timer(TokioTimer::new())
        .keep_alive(true)
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.read_buffer());
    auto.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_request_head).unwrap_or(u32::MAX));
    Builders { http1, auto }
}

/// How client connections are served: on a task of `tasks`, within `limits`, by `builders`'
/// protocols, each watching `signal` for the drain.
struct Serving<'a> {
    tasks: &'a TaskTracker,
    limits: &'a ClientLimits,
    builders: &'a Arc<Builders>,
    signal: &'a ShutdownSignal,
    workers: &'a Workers,
}

/// Accepts connections until `shutdown`, each on a slot of `max_connections` (past it, new
/// connections wait in the listen backlog), each served as `serving` says.
async fn accept_until_shutdown(
    listener: &TcpListener,
    proxy: &Arc<ArcSwap<Proxy>>,
    shutdown: &CancellationToken,
    serving: Serving<'_>,
) {
    let Serving {
        tasks,
        limits,
        builders,
        signal,
        workers,
    } = serving;
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections as usize));
    loop {
        // A connection slot first: past max_connections, new connections wait in the backlog.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            _ = shutdown.cancelled() => break,
        };
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Typically EMFILE: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let _ = tcp.set_nodelay(true);
        let proxy = proxy.clone();
        let (builders, signal, shutdown) = (builders.clone(), signal.clone(), shutdown.clone());
        let first_byte = limits.header_read_timeout;
        workers.serve(tasks, tcp, move |tcp| async move {
            let _slot = slot;
            // A client that connects and sends nothing is closed after header_read_timeout
            // (hyper times HTTP/1 heads and idle kept-alive connections from there on).
            let mut first = [0u8; H2_PREFACE.len()];
            let opened = tokio::select! {
                peeked = tokio::time::timeout(first_byte, tcp.peek(&mut first)) => match peeked {
                    Ok(Ok(n)) if n > 0 => n,
                    _ => return,
                },
                _ = shutdown.cancelled() => return,
            };
            let svc = hyper::service::service_fn(move |req| {
                // Each request runs to its end on the configuration it started with.
                let proxy = proxy.load_full();
                // Boxed: hyper keeps a slot the size of this future for the connection's life,
                // so a request's state (several KiB) would stay resident in every idle
                // kept-alive connection; boxed, it is freed as soon as the response head is out.
                let handle = Box::pin(proxy.handle(req));
                async move { Ok::<_, Infallible>(handle.await) }
            });
            // The connection goes straight to `watch`, which boxes it, and the watch is awaited
            // where it is built: a future bound to a name across an await is kept twice in this
            // task's state (the binding and the awaited copy), for the connection's whole life.
            let io = TokioIo::new(tcp);
            let ended = match may_be_http2(&first[..opened]) {
                false => failure(
                    signal
                        .watch(builders.http1.serve_connection(io, svc).with_upgrades())
                        .await,
                ),
                true => failure(
                    signal
                        .watch(builders.auto.serve_connection_with_upgrades(io, svc).into_owned())
                        .await,
                ),
            };
            if let Some(e) = ended {
                tracing::debug!(error = %e, "client connection ended with an error");
            }
        });
    }
}

/// The error a watched connection ended with, if it did.
fn failure<E: std::fmt::Display>(ended: Option<Result<(), E>>) -> Option<String> {
    match ended {
        Some(Err(e)) => Some(e.to_string()),
        _ => None,
    }
}

/// The drain: connections finish their requests within the grace, then what is left is closed
/// and unfinished work abandoned (`hard_stop`).
async fn drain_connections(drain: Drain, signal: ShutdownSignal) -> Exit {
    let open = drain.tasks.len();
    tracing::info!(open_tasks = open, grace_ms = drain.grace.as_millis() as u64, "draining");
    drain.tasks.close();
    signal.drain();
    let drained = tokio::time::timeout(drain.grace, drain.tasks.wait()).await.is_ok();
    if drained {
        tracing::info!("drained; exiting");
        return Exit::Drained;
    }
    let closed = drain.tasks.len();
    tracing::warn!(
        closed_tasks = closed,
        "shutdown grace expired; closing the remaining connections and abandoning unfinished work"
    );
    drain.hard_stop.cancel();
    signal.stop();
    let _ = tokio::time::timeout(Duration::from_secs(1), drain.tasks.wait()).await;
    Exit::GraceExpired { closed }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_prefix_of_the_http2_preface_goes_to_the_auto_builder() {
        for first in [&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..], b"PRI * HT", b"PR", b"P"] {
            assert!(may_be_http2(first), "{first:?}");
        }
        for first in [
            &b"POST /openai/v1/chat/completions HTTP/1.1\r\n"[..],
            b"PO",
            b"PUT",
            b"PATCH",
            b"GET / HTTP/1.1\r\n",
            b"PRIVATE / HTTP/1.1\r\n",
            b"\x16\x03\x01",
        ] {
            assert!(!may_be_http2(first), "{first:?}");
        }
    }
}
