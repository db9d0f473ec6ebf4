//! Response bodies on their way to the client, after the frames read ahead
//! ([`super::primed::Primed`]): [`ErrorWatch`] counts an error event that passes mid-stream, and
//! [`IdleTimeout`] aborts a stream that goes silent for longer than `stream_idle_timeout`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use prometheus::IntCounter;
use tokio::time::Sleep;

use super::tokens::Meter;
use crate::metrics::AttemptMetrics;
use crate::wire::body::BoxError;
use crate::wire::sse::{ErrorScan, Shape};

/// Watches an event stream for an error event after the commit point (the app already has bytes:
/// it is passed through untouched, not retried) and counts it once
/// (`rebound_stream_errors_total{position="mid_stream"}`), setting the response's flag. Each data
/// frame is scanned in place ([`ErrorScan`]); once an error is seen, scanning stops.
///
/// In the same poll, each data frame is fed to the attempt's token [`Meter`] (event streams and
/// JSON bodies), which is finished when the body ends, fails or is dropped.
pub(crate) struct ErrorWatch<B: Body> {
    inner: B,
    watching: Option<Watching>,
    meter: Option<Meter>,
}

struct Watching {
    scan: ErrorScan,
    seen: Arc<AtomicBool>,
    counter: IntCounter,
}

impl<B: Body> ErrorWatch<B> {
    /// Scans `inner`, setting `seen` and counting with `counter` when an error event passes.
    pub(crate) fn new(inner: B, seen: Arc<AtomicBool>, counter: IntCounter) -> ErrorWatch<B> {
        ErrorWatch {
            inner,
            watching: Some(Watching {
                scan: ErrorScan::default(),
                seen,
                counter,
            }),
            meter: None,
        }
    }

    /// Passes `inner` through without looking.
    pub(crate) fn off(inner: B) -> ErrorWatch<B> {
        ErrorWatch {
            inner,
            watching: None,
            meter: None,
        }
    }

    /// Feeds every data frame to `meter` too; its tokens are wasted when `error` is set.
    fn metered(mut self, meter: Option<Meter>, error: Option<&Arc<AtomicBool>>) -> ErrorWatch<B> {
        self.meter = meter.map(|mut m| {
            m.watch_error(error.cloned());
            m
        });
        self
    }

    /// The watch a delivered response needs, and its error flag: an event stream whose first
    /// event was not an error is watched (the flag is set when an error event passes); a response
    /// whose first event or JSON body was one is not (its flag is set already); any other response
    /// has no flag.
    pub(crate) fn for_response(
        inner: B,
        shape: Shape,
        first_event_error: bool,
        metrics: &AttemptMetrics,
        meter: Option<Meter>,
    ) -> (ErrorWatch<B>, Option<Arc<AtomicBool>>) {
        if first_event_error {
            let flag = Arc::new(AtomicBool::new(true));
            return (ErrorWatch::off(inner).metered(meter, Some(&flag)), Some(flag));
        }
        if shape != Shape::EventStream {
            return (ErrorWatch::off(inner).metered(meter, None), None);
        }
        let seen = Arc::new(AtomicBool::new(false));
        let watch = ErrorWatch::new(inner, seen.clone(), metrics.mid_stream_errors.clone()).metered(meter, Some(&seen));
        (watch, Some(seen))
    }
}

impl<B> Body for ErrorWatch<B>
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        let Poll::Ready(frame) = &polled else {
            return polled;
        };
        match frame {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    if let Some(w) = &mut this.watching {
                        if w.scan.feed(data) {
                            w.seen.store(true, Ordering::Release);
                            w.counter.inc();
                            this.watching = None;
                        }
                    }
                    if let Some(m) = &mut this.meter {
                        m.feed(data);
                    }
                }
            }
            Some(Err(_)) => {
                if let Some(m) = &mut this.meter {
                    m.finish(false);
                }
            }
            None => {
                if let Some(m) = &mut this.meter {
                    m.finish(true);
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: Body> Drop for ErrorWatch<B> {
    /// A body dropped before its end (the client went away, the idle timeout fired) was not
    /// delivered whole; one whose last frame was read was (the end itself may never be polled).
    fn drop(&mut self) {
        if let Some(m) = &mut self.meter {
            m.finish(self.inner.is_end_stream());
        }
    }
}

/// The upstream went silent for longer than `stream_idle_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the upstream sent nothing for {0:?} (stream_idle_timeout)")]
pub(crate) struct StreamIdle(pub Duration);

/// Fails the body when no frame arrives within `idle` of the previous one. The client connection
/// is then aborted: a stream cut short must never look complete.
///
/// The timer is armed only when the upstream has nothing ready (a body that arrives whole, the
/// common JSON case, never touches the timer wheel), and re-armed after each frame that follows a
/// wait: the silence is measured from the moment rebound found the stream waiting, which is at
/// most one poll after the previous frame.
pub(crate) struct IdleTimeout<B> {
    inner: B,
    idle: Duration,
    /// Created on the first wait; reset for every later one.
    timer: Option<Pin<Box<Sleep>>>,
    /// Whether `timer` counts the current wait (cleared when a frame arrives).
    armed: bool,
}

impl<B> IdleTimeout<B> {
    pub(crate) fn new(inner: B, idle: Duration) -> IdleTimeout<B> {
        IdleTimeout {
            inner,
            idle,
            timer: None,
            armed: false,
        }
    }
}

impl<B> Body for IdleTimeout<B>
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.armed = false;
            return Poll::Ready(frame);
        }
        if !this.armed {
            let deadline = crate::time::now() + this.idle;
            match &mut this.timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => this.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            this.armed = true;
        }
        match this.timer.as_mut().map(|timer| timer.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Some(Err(Box::new(StreamIdle(this.idle))))),
            _ => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt as _, StreamBody};

    fn frames(parts: &[&'static str]) -> http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError> {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync()
    }

    #[tokio::test]
    async fn the_watch_passes_everything_through_and_counts_an_error_once() {
        let counter = IntCounter::new("t", "t").unwrap();
        let seen = Arc::new(AtomicBool::new(false));
        let parts = [
            "data: {\"a\":1}\n\n",
            "event: er",
            "ror\ndata: {\"type\":\"error\"}\n\n",
            "event: error\ndata: {}\n\n",
        ];
        let body = ErrorWatch::new(frames(&parts), seen.clone(), counter.clone());
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(all, parts.concat());
        assert!(seen.load(Ordering::Acquire));
        assert_eq!(counter.get(), 1);

        let seen = Arc::new(AtomicBool::new(false));
        let body = ErrorWatch::new(
            frames(&["data: {\"a\":1}\n\n", "data: [DONE]\n\n"]),
            seen.clone(),
            counter.clone(),
        );
        body.collect().await.unwrap();
        assert!(!seen.load(Ordering::Acquire));
        assert_eq!(counter.get(), 1);
    }
}
