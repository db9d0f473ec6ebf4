//! [`Recorder`]: tees a claimed request's response into the idempotency store while it streams to
//! the client, and into its [`Live`] response for the duplicates that follow it.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;

use super::live::{End, Head, Live};
use super::store::{Completion, StoredResponse};
use super::ClaimInner;
use crate::wire::body::BoxError;

/// Tees a response into the idempotency store while it streams to the client, frame by frame,
/// with no added delay. At the end the response is completed in the store (or marked "not kept"
/// when it outgrew `max_stored_body`); a failed stream releases the key. With
/// `complete_on_disconnect`, a client that goes away mid-stream does not stop the upstream read:
/// the rest is read and stored (and its followers get it), so the app's retry replays the
/// generation it already paid for.
pub struct Recorder {
    body: Option<UnsyncBoxBody<Bytes, BoxError>>,
    claim: Option<ClaimInner>,
    head: Head,
    /// The bytes so far (bounded by `max_stored_body`), shared with followers.
    live: Option<Arc<Live>>,
    /// Set when the response turned out to be a failure while it streamed (not stored).
    failed: Option<Arc<AtomicBool>>,
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
            failed,
        }
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
            }),
            None => Completion::NotKept,
        }
    }

    fn finish(&mut self) {
        let failed = self.failed.as_ref().is_some_and(|f| f.load(Ordering::Acquire));
        if let Some(live) = &self.live {
            if failed {
                live.finish_unshared();
            } else {
                live.finish(End::Complete);
            }
        }
        if let Some(claim) = self.claim.take() {
            let tasks = claim.tasks.clone();
            if failed {
                tasks.spawn(claim.release());
            } else {
                let completion = self.completion();
                tasks.spawn(claim.complete(completion));
            }
        }
    }

    fn fail(&mut self) {
        if let Some(live) = &self.live {
            live.finish(End::Aborted);
        }
        if let Some(claim) = self.claim.take() {
            let tasks = claim.tasks.clone();
            tasks.spawn(claim.release());
        }
    }
}

impl Body for Recorder {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(body) = self.body.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.keep(data);
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
        let (Some(body), true) = (body, claim.policy.complete_on_disconnect) else {
            if let Some(live) = &self.live {
                live.finish(End::Aborted);
            }
            tasks.spawn(claim.release());
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
            failed: self.failed.take(),
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
