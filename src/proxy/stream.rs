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

use super::body::BoxError;

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
pub struct IdleTimeout<B> {
    inner: B,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
}

impl<B> IdleTimeout<B> {
    pub fn new(inner: B, idle: Duration) -> IdleTimeout<B> {
        IdleTimeout {
            inner,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
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
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let deadline = tokio::time::Instant::now() + self.idle;
                self.timer.as_mut().reset(deadline);
                Poll::Ready(frame)
            }
            Poll::Pending => match self.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(StreamIdle(self.idle))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
