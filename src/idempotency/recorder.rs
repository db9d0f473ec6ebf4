//! [`Recorder`]: tees a claimed request's response into the idempotency store while it streams to
//! the client, and into its [`Live`] response for the duplicates that follow it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;

use super::claim::ClaimInner;
use super::live::{End, Head, Live};
use super::store::{Completion, KeptHeaders, StoredResponse};
use crate::wire::body::BoxError;

/// Tees a response into the idempotency store while it streams to the client, frame by frame,
/// with no added delay. At the end the response is completed in the store (or marked "not kept"
/// when it outgrew `max_stored_body`); a failed stream releases the key. With
/// `complete_on_disconnect`, a client that goes away mid-stream does not stop the upstream read:
/// the rest is read and stored (and its followers get it), so the app's retry replays the
/// generation it already paid for.
///
/// With `[redis] wait_replicas`, the end of the response (its last data frame when the body
/// knows it is the last, else the end of the stream) is held until the completion's first write
/// has answered: a client that saw the whole response knows its record is on the replicas (or
/// that the store failed to say so within `command_timeout`).
pub struct Recorder {
    body: Option<UnsyncBoxBody<Bytes, BoxError>>,
    claim: Option<ClaimInner>,
    head: Head,
    /// The bytes so far (bounded by `max_stored_body`), shared with followers.
    live: Option<Arc<Live>>,
    /// The end held until the completion's first write answers (`wait_replicas`).
    held_end: Option<HeldEnd>,
    /// Set when the response turned out to be a failure while it streamed (not stored).
    failed: Option<Arc<AtomicBool>>,
    /// It is the read to the end of a response whose client went away: dropped before that end
    /// (the runtime shutting down), it is not handed to another read.
    draining: bool,
}

struct HeldEnd {
    first_try: tokio::sync::oneshot::Receiver<()>,
    last: Option<Frame<Bytes>>,
}

impl Recorder {
    pub(super) fn new<B>(claim: Option<ClaimInner>, head: Head, body: B, failed: Option<Arc<AtomicBool>>) -> Recorder
    where
        B: Body<Data = Bytes, Error = BoxError> + Send + 'static,
    {
        let live = claim.as_ref().map(|c| c.live.clone());
        if let Some(live) = &live {
            live.set_head(head.clone());
        }
        Recorder {
            body: Some(body.boxed_unsync()),
            claim,
            head,
            live,
            held_end: None,
            failed,
            draining: false,
        }
    }

    /// A body passed through with nothing recorded (the same type as a recording one).
    pub fn passthrough<B>(body: B) -> Recorder
    where
        B: Body<Data = Bytes, Error = BoxError> + Send + 'static,
    {
        let head = Head {
            status: 0,
            headers: KeptHeaders::default(),
        };
        Recorder::new(None, head, body, None)
    }

    /// Whether the end waits for the completion's first write.
    fn waits(&self) -> bool {
        self.claim.as_ref().is_some_and(|c| c.writer.store.waits_for_replicas())
    }

    fn keep(&self, data: &Bytes) {
        if let Some(live) = &self.live {
            live.push(data);
        }
    }

    fn completion(&self) -> Completion {
        match self.live.as_ref().and_then(|l| l.body()) {
            Some(body) => Completion::Kept(StoredResponse {
                status: self.head.status,
                headers: self.head.headers.clone(),
                body,
                age: std::time::Duration::ZERO,
            }),
            None => Completion::NotKept,
        }
    }

    fn finish(&mut self) {
        self.finish_with(None);
    }

    /// Completes the record; `first_try` is dropped when its first write has answered.
    fn finish_with(&mut self, first_try: Option<tokio::sync::oneshot::Sender<()>>) {
        let failed = self.failed.as_ref().is_some_and(|f| f.load(Ordering::Acquire));
        if let Some(live) = &self.live {
            if failed {
                live.finish_unshared();
            } else {
                live.finish(End::Complete);
            }
        }
        if let Some(claim) = self.claim.take() {
            if failed {
                // Nothing to wait for: `first_try` is dropped, which releases a held end.
                claim.release_or_spawn();
            } else {
                let completion = self.completion();
                claim.complete_or_spawn(completion, first_try);
            }
        }
    }

    /// Completes the record and holds `last` (the end) until the first write has answered.
    fn finish_held(&mut self, last: Option<Frame<Bytes>>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.finish_with(Some(tx));
        self.held_end = Some(HeldEnd { first_try: rx, last });
    }

    fn fail(&mut self) {
        if let Some(live) = &self.live {
            live.finish(End::Aborted);
        }
        if let Some(claim) = self.claim.take() {
            claim.release_or_spawn();
        }
    }
}

impl Body for Recorder {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(held) = self.held_end.as_mut() {
            // Sent or dropped: either way the first write has answered.
            if Pin::new(&mut held.first_try).poll(cx).is_pending() {
                return Poll::Pending;
            }
            let last = held.last.take();
            self.held_end = None;
            self.body = None;
            return Poll::Ready(last.map(Ok));
        }
        let Some(body) = self.body.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(body).poll_frame(cx);
        let waits = self.waits();
        match polled {
            Poll::Ready(Some(Ok(frame))) if waits && self.body.as_ref().is_some_and(Body::is_end_stream) => {
                if let Some(data) = frame.data_ref() {
                    self.keep(data);
                }
                self.finish_held(Some(frame));
                return self.poll_frame(cx);
            }
            Poll::Ready(None) if waits => {
                self.finish_held(None);
                return self.poll_frame(cx);
            }
            _ => {}
        }
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.keep(data);
                }
                // The last frame of a body that knows its length: hyper sends it and drops the
                // body without asking for its end, so the response is complete now.
                if self.body.as_ref().is_some_and(Body::is_end_stream) {
                    self.finish();
                }
            }
            Poll::Ready(None) => self.finish(),
            Poll::Ready(Some(Err(_))) => self.fail(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body.as_ref().map(Body::size_hint).unwrap_or_default()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let Some(claim) = self.claim.take() else { return };
        let tasks = claim.tasks.clone();
        let body = self.body.take();
        let (Some(body), true) = (body, claim.policy.complete_on_disconnect && !self.draining) else {
            if let Some(live) = &self.live {
                live.finish(End::Aborted);
            }
            claim.release_or_spawn();
            return;
        };
        // The client went away mid-stream: read the upstream to its end and store it (followers
        // go on receiving it). The body is wrapped in the stream idle timeout, so this read
        // cannot hang.
        let rec = Recorder {
            body: Some(body),
            claim: Some(claim),
            head: self.head.clone(),
            live: self.live.take(),
            held_end: None,
            failed: self.failed.take(),
            draining: true,
        };
        tasks.spawn(drain_and_store(rec));
    }
}

async fn drain_and_store(mut rec: Recorder) {
    tracing::debug!("client went away mid-stream; reading the rest for the idempotency store");
    loop {
        let Some(body) = rec.body.as_mut() else { return };
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    rec.keep(data);
                }
            }
            Some(Err(_)) => {
                rec.fail();
                return;
            }
            None => {
                rec.finish();
                return;
            }
        }
    }
}
