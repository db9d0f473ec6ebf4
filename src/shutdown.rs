//! The shutdown signal every client connection watches: *drain* (finish the requests in flight,
//! take no new one) and then, if the grace runs out, *stop* (close now).
//!
//! A connection checks the signal each time its task wakes, which is several times per request,
//! so the check is one atomic load. Its waker is registered once (a task's waker does not change)
//! and woken when the signal moves. hyper-util's graceful watcher plus a cancellation token,
//! which this replaces, took two locks on every wake-up.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};

use crate::wire::body::BoxError;

const DRAIN: u8 = 1;
const STOP: u8 = 2;

/// Sends drain and stop to every watched connection. Clones share the signal.
#[derive(Clone, Default)]
pub(crate) struct ShutdownSignal {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// 0 (serving), then `DRAIN`, then `STOP`: it only moves forward.
    state: AtomicU8,
    next_id: AtomicU64,
    /// The waker of every connection being watched, by watch id.
    wakers: Mutex<HashMap<u64, Waker>>,
}

impl ShutdownSignal {
    pub(crate) fn new() -> ShutdownSignal {
        ShutdownSignal::default()
    }

    /// Connections finish what they are serving, then close (HTTP/1.1: after the response in
    /// flight; HTTP/2: GOAWAY).
    pub(crate) fn drain(&self) {
        self.advance(DRAIN);
    }

    /// Connections close now, whatever they are serving.
    pub(crate) fn stop(&self) {
        self.advance(STOP);
    }

    fn advance(&self, to: u8) {
        // The store happens before the lock: a connection that registers after the wake-up
        // below loads the new state after its own registration (under the same lock).
        self.inner.state.fetch_max(to, Ordering::SeqCst);
        for waker in self.inner.wakers.lock().values() {
            waker.wake_by_ref();
        }
    }

    /// Serves `conn` until it ends (`Some(result)`) or the signal says stop (`None`). On drain it
    /// asks `conn` to shut down gracefully and goes on serving it.
    ///
    /// `conn` is boxed before the future is built: an `async` block keeps what it captures for
    /// its whole life, so pinning a captured connection inside it would hold the connection's
    /// state (about 1.5 KiB for hyper-util's HTTP/1 + HTTP/2 connection) twice, in every idle
    /// kept-alive connection. The future returned holds a pointer.
    pub(crate) fn watch<C>(&self, conn: C) -> impl Future<Output = Option<C::Output>> + Send + 'static
    where
        C: Graceful + Send + 'static,
    {
        let inner = self.inner.clone();
        let mut conn = Box::pin(conn);
        async move {
            let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
            let _registration = Registration { inner: &inner, id };
            let mut registered: Option<Waker> = None;
            let mut draining = false;
            poll_fn(|cx| {
                if !registered.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    inner.wakers.lock().insert(id, cx.waker().clone());
                    registered = Some(cx.waker().clone());
                }
                match inner.state.load(Ordering::SeqCst) {
                    STOP => return Poll::Ready(None),
                    DRAIN if !draining => {
                        draining = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    _ => {}
                }
                conn.as_mut().poll(cx).map(Some)
            })
            .await
        }
    }
}

/// A client connection that can be asked to finish the requests in flight and take no new one.
/// (hyper-util's `GracefulConnection` is sealed and leaves out hyper's own HTTP/1 connection with
/// upgrades, which serves every connection that does not open with HTTP/2's preface.)
pub(crate) trait Graceful: Future {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S, B> Graceful for hyper::server::conn::http1::UpgradeableConnection<I, S>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<BoxError>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<BoxError>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        hyper::server::conn::http1::UpgradeableConnection::graceful_shutdown(self);
    }
}

impl<I, S, B, E> Graceful for hyper_util::server::conn::auto::UpgradeableConnection<'static, I, S, E>
where
    S: hyper::service::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: 'static,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<BoxError>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        hyper_util::server::conn::auto::UpgradeableConnection::graceful_shutdown(self);
    }
}

/// Removes a finished connection's waker.
struct Registration<'a> {
    inner: &'a Inner,
    id: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.inner.wakers.lock().remove(&self.id);
    }
}
