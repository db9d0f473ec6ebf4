//! The runtime shaped for a sidecar: one single-threaded tokio runtime per core, each serving its
//! own client connections with its own upstream connections, so that a request never changes
//! thread between the client's bytes and the provider's.
//!
//! Why not tokio's multi-threaded runtime: at low load (an app sending one request at a time,
//! the common case beside one app) it wakes a sibling worker whenever a task becomes runnable,
//! so each request costs about one context switch more than a single thread does, and its wakers
//! hop between threads (measured in docs/performance.md, "The runtime"). Here the thread that
//! starts the server is worker 0: it accepts every connection and runs the background tasks
//! (Redis, syncs, the journal, job workers); [`Workers::spawn`] adds one thread per further
//! core, and each accepted connection goes to the worker serving the fewest (a few long-lived
//! SDK connections spread over the cores as evenly as they can; a connection's requests then
//! stay on its worker). An upstream's pool keeps its idle connections per worker
//! ([`current`]): a connection's task runs on the worker that opened it, and only that worker
//! sends on it.
//!
//! What it gives up: one client connection is served by one core. An app that multiplexes all
//! its calls over a single HTTP/2 connection gets one core's worth (tens of thousands of
//! requests a second on the benchmark's VMs), where SDKs' HTTP/1.1 pools open several.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use prometheus::{IntGauge, IntGaugeVec};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

thread_local! {
    /// This thread's worker index: 0 for the thread that started rebound and every thread that
    /// is not a worker (tests' runtimes, blocking threads).
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The most workers any [`Workers`] of this process has had (at least 1): how many shards an
/// upstream pool made after it keeps.
static MOST: AtomicUsize = AtomicUsize::new(1);

/// The worker this thread is (see [`INDEX`]).
pub(crate) fn current() -> usize {
    INDEX.with(Cell::get)
}

/// How many per-worker parts a pool made now should have.
pub(crate) fn count() -> usize {
    MOST.load(Ordering::Relaxed)
}

/// The threads that serve client connections besides the one that starts the server.
pub struct Workers {
    /// Workers 1..: their runtimes, and what stops each.
    others: Vec<(Handle, Option<oneshot::Sender<()>>)>,
    /// Client connections open on each worker, 0 first.
    open: Arc<[AtomicUsize]>,
    /// The same, exported (`rebound_client_connections{worker}`), once [`Workers::count_in`].
    gauges: Vec<IntGauge>,
}

impl Workers {
    /// No more threads: every connection is served on the runtime that starts the server
    /// (tests, `worker_threads = 1`).
    pub fn none() -> Workers {
        Workers {
            others: Vec::new(),
            open: Arc::new([AtomicUsize::new(0)]),
            gauges: Vec::new(),
        }
    }

    /// `more` threads beside the caller's, each with its own single-threaded runtime (named
    /// `rebound-wN`: a thread name keeps 15 bytes). Fails when a thread or a runtime cannot be made.
    pub fn spawn(more: usize) -> std::io::Result<Workers> {
        let mut others = Vec::with_capacity(more);
        for index in 1..=more {
            let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
            let (stop_tx, stop_rx) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("rebound-w{index}"))
                .spawn(move || run(index, ready_tx, stop_rx))?;
            let handle = ready_rx
                .recv()
                .map_err(|_| std::io::Error::other("a worker thread ended at its start"))??;
            others.push((handle, Some(stop_tx)));
        }
        MOST.fetch_max(more + 1, Ordering::Relaxed);
        let open = (0..=more).map(|_| AtomicUsize::new(0)).collect();
        Ok(Workers {
            others,
            open,
            gauges: Vec::new(),
        })
    }

    /// How many workers serve connections (the caller's included).
    fn len(&self) -> usize {
        self.open.len()
    }

    /// Exports each worker's open connections (`rebound_client_connections`).
    pub(crate) fn count_in(&mut self, gauges: &IntGaugeVec) {
        self.gauges = (0..self.len())
            .map(|i| gauges.with_label_values(&[&i.to_string()]))
            .collect();
    }

    /// The worker serving the fewest connections now (the lowest index among equals).
    fn least_busy(&self) -> usize {
        let mut best = (0, usize::MAX);
        for (i, open) in self.open.iter().enumerate() {
            let n = open.load(Ordering::Relaxed);
            if n < best.1 {
                best = (i, n);
            }
        }
        best.0
    }

    /// Serves an accepted connection on the least busy worker, as a task of `tasks`: `serve`
    /// gets the connection registered with that worker's runtime. Called on worker 0.
    pub(crate) fn serve<F, Fut>(&self, tasks: &TaskTracker, tcp: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let worker = self.least_busy();
        let open = Counted::new(self.open.clone(), worker, self.gauges.get(worker).cloned());
        let Some((handle, _)) = worker.checked_sub(1).and_then(|i| self.others.get(i)) else {
            tasks.spawn(async move {
                let _open = open;
                serve(tcp).await;
            });
            return;
        };
        // The socket leaves this runtime's reactor and joins the worker's there, so that its
        // readiness wakes that thread and no other.
        let Ok(std) = tcp.into_std() else { return };
        tasks.spawn_on(
            async move {
                let _open = open;
                match TcpStream::from_std(std) {
                    Ok(tcp) => serve(tcp).await,
                    Err(e) => tracing::warn!(error = %e, "a connection could not join its worker"),
                }
            },
            handle,
        );
    }
}

impl Drop for Workers {
    /// Ends the workers' runtimes (each drops what it still runs); does not wait for them.
    fn drop(&mut self) {
        for (_, stop) in &mut self.others {
            if let Some(stop) = stop.take() {
                let _ = stop.send(());
            }
        }
    }
}

/// A worker thread's life: its runtime, handed back through `ready`, runs until `stop`.
fn run(index: usize, ready: std::sync::mpsc::SyncSender<std::io::Result<Handle>>, stop: oneshot::Receiver<()>) {
    INDEX.with(|i| i.set(index));
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    if ready.send(Ok(runtime.handle().clone())).is_err() {
        return;
    }
    runtime.block_on(async move {
        let _ = stop.await;
    });
}

/// One open connection counted on its worker while it lives.
struct Counted {
    open: Arc<[AtomicUsize]>,
    worker: usize,
    gauge: Option<IntGauge>,
}

impl Counted {
    fn new(open: Arc<[AtomicUsize]>, worker: usize, gauge: Option<IntGauge>) -> Counted {
        if let Some(n) = open.get(worker) {
            n.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(g) = &gauge {
            g.inc();
        }
        Counted { open, worker, gauge }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some(n) = self.open.get(self.worker) {
            n.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(g) = &self.gauge {
            g.dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_go_to_the_least_busy_worker_and_leave_their_count_when_they_end() {
        let w = Workers::spawn(2).unwrap();
        assert_eq!(w.len(), 3);
        assert!(count() >= 3);
        let a = Counted::new(w.open.clone(), w.least_busy(), None);
        let b = Counted::new(w.open.clone(), w.least_busy(), None);
        let c = Counted::new(w.open.clone(), w.least_busy(), None);
        assert_eq!((a.worker, b.worker, c.worker), (0, 1, 2));
        drop(b);
        assert_eq!(w.least_busy(), 1);
        let d = Counted::new(w.open.clone(), w.least_busy(), None);
        assert_eq!(d.worker, 1);
        assert_eq!(w.least_busy(), 0, "all equal again: the lowest index");
    }

    #[test]
    fn each_worker_thread_knows_its_index() {
        let w = Workers::spawn(2).unwrap();
        assert_eq!(current(), 0, "a thread that is no worker is 0");
        for (i, (handle, _)) in w.others.iter().enumerate() {
            let (tx, rx) = std::sync::mpsc::channel();
            handle.spawn(async move { tx.send(current()).unwrap() });
            assert_eq!(rx.recv().unwrap(), i + 1);
        }
    }
}
