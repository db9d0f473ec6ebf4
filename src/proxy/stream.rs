//! Response bodies on their way to the client: [`Primed`] puts back the first frame that was read
//! ahead (the commit point: a response is only forwarded once its first byte is in), and
//! [`IdleTimeout`] aborts a stream that goes silent for longer than `stream_idle_timeout`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

use crate::wire::body::BoxError;

/// A body whose first frame was already read.
pub struct Primed<B> {
    first: Option<Frame<Bytes>>,
    inner: B,
}

impl<B> Primed<B> {
    pub fn new(first: Option<Frame<Bytes>>, inner: B) -> Primed<B> {
        Primed { first, inner }
    }
}

impl<B> Body for Primed<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(frame) = self.first.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        Pin::new(&mut self.inner).poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let n = self
            .first
            .as_ref()
            .and_then(Frame::data_ref)
            .map_or(0, |d| d.len() as u64);
        // Upper first: `set_lower` asserts lower <= upper.
        let mut hint = SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(n));
        }
        hint.set_lower(inner.lower().saturating_add(n));
        hint
    }
}

/// The upstream went silent for longer than `stream_idle_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the upstream sent nothing for {0:?} (stream_idle_timeout)")]
pub struct StreamIdle(pub Duration);

/// Fails the body when no frame arrives within `idle` of the previous one. The client connection
/// is then aborted: a stream cut short must never look complete.
///
/// The timer is armed only when the upstream has nothing ready (a body that arrives whole, the
/// common JSON case, never touches the timer wheel), and re-armed after each frame that follows a
/// wait: the silence is measured from the moment rebound found the stream waiting, which is at
/// most one poll after the previous frame.
pub struct IdleTimeout<B> {
    inner: B,
    idle: Duration,
    /// Created on the first wait; reset for every later one.
    timer: Option<Pin<Box<Sleep>>>,
    /// Whether `timer` counts the current wait (cleared when a frame arrives).
    armed: bool,
}

impl<B> IdleTimeout<B> {
    pub fn new(inner: B, idle: Duration) -> IdleTimeout<B> {
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
            let deadline = tokio::time::Instant::now() + this.idle;
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
