//! [`Primed`]: a response body with the frames read ahead put back first (the commit point: a
//! response is only forwarded once its first byte, or its first event, is in).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::wire::body::BoxError;
use crate::wire::sse::Shape;

/// A body whose first frames were already read (the prefix), put back in order before the rest.
/// The prefix is held as the frames came: nothing is copied.
pub(crate) struct Primed<B> {
    /// The first frame held (kept apart: the common case holds one frame and allocates nothing).
    first: Option<Frame<Bytes>>,
    /// Frames held after it, when the commit point took several.
    more: VecDeque<Frame<Bytes>>,
    inner: B,
    /// The response's shape, from its `content-type`, read once for every step that asks.
    shape: Shape,
}

impl<B> Primed<B> {
    /// Nothing held yet, of a response shaped `shape`.
    pub(crate) fn new(inner: B, shape: Shape) -> Primed<B> {
        Primed {
            first: None,
            more: VecDeque::new(),
            inner,
            shape,
        }
    }

    /// The response's shape (its `content-type`).
    pub(crate) fn shape(&self) -> Shape {
        self.shape
    }

    /// The body still to be read.
    pub(crate) fn inner_mut(&mut self) -> &mut B {
        &mut self.inner
    }

    /// Holds `frame`, after those held already.
    pub(crate) fn hold(&mut self, frame: Frame<Bytes>) {
        if self.first.is_none() && self.more.is_empty() {
            self.first = Some(frame);
        } else {
            self.more.push_back(frame);
        }
    }

    fn held(&self) -> impl Iterator<Item = &Bytes> {
        self.first.iter().chain(&self.more).filter_map(Frame::data_ref)
    }

    /// The data bytes held.
    pub(crate) fn held_len(&self) -> usize {
        self.held().map(Bytes::len).sum()
    }

    /// The first `n` data bytes held (fewer if fewer are held): borrowed when the first frame has
    /// them all, else copied together.
    pub(crate) fn held_prefix(&self, n: usize) -> Cow<'_, [u8]> {
        let mut held = self.held();
        match held.next() {
            None => Cow::Borrowed(&[]),
            Some(first) if first.len() >= n => Cow::Borrowed(&first[..n]),
            Some(first) => {
                let mut out = first.to_vec();
                for data in held {
                    let take = data.len().min(n - out.len());
                    out.extend_from_slice(&data[..take]);
                    if out.len() == n {
                        break;
                    }
                }
                Cow::Owned(out)
            }
        }
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
        if let Some(frame) = self.first.take().or_else(|| self.more.pop_front()) {
            return Poll::Ready(Some(Ok(frame)));
        }
        Pin::new(&mut self.inner).poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.more.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let n = self.held_len() as u64;
        // Upper first: `set_lower` asserts lower <= upper.
        let mut hint = SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(n));
        }
        hint.set_lower(inner.lower().saturating_add(n));
        hint
    }
}
