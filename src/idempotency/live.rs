//! Live responses (`on_concurrent = "follow"`): what an in-flight original has produced so far,
//! shared with the duplicates that follow it.
//!
//! A [`Live`] is created with the claim. Its head is set when the original's response is decided
//! (a status the route stores), its body grows frame by frame as the original streams to its own
//! client, and it ends as the original ends: complete, aborted mid-stream, or released (no stored
//! response: followers then run the request themselves, as `"wait"` would).
//!
//! Every follower reads the same bytes from byte 0 at its own pace: a slow one never slows the
//! original or the others. Memory is bounded by `max_stored_body` per in-flight key (the bytes the
//! recorder keeps for the store anyway): past it the oldest bytes are dropped, the response is not
//! stored, and a follower still behind them is cut with an abort.

use foldhash::HashMap;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use super::fingerprint::{Fingerprint, RecordKey};
use super::liveness::Owner;
use super::store::KeptHeaders;
use crate::wire::body::BoxError;

/// How an original's response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Its body ended cleanly.
    Complete,
    /// Its body failed mid-stream (upstream reset, idle timeout): followers are aborted too.
    Aborted,
    /// No response to share (an outcome the route does not store, or the request was dropped
    /// before its response): followers run the request themselves.
    Released,
}

/// The status and the kept headers of a live response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub headers: KeptHeaders,
}

/// What a follower waiting for the head learns.
#[derive(Debug)]
pub enum HeadOrEnd {
    Head(Head),
    /// The response ended before a head could be shared.
    End(End),
    /// The head was decided, but the first bytes were already dropped (over `max_stored_body`):
    /// a follower cannot get the response from byte 0.
    TooLarge,
}

/// One in-flight original's response, as produced.
pub struct Live {
    /// The record key of the claim it is the response of.
    pub record: RecordKey,
    /// The request's fingerprint (a duplicate with another one is 422, not a follower).
    pub fingerprint: Fingerprint,
    /// The claim's owner token (names its relay through Redis).
    pub owner: Owner,
    /// Whether it is being relayed to other replicas already.
    relaying: AtomicBool,
    state: Mutex<State>,
}

/// What a relay reads next: the chunks after the ones it sent, and how the response ended.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub data: Vec<Bytes>,
    /// The index of the chunk after `data`.
    pub next: u64,
    pub end: Option<End>,
    /// The reader fell behind what was dropped (or the response outgrew the cap).
    pub cut: bool,
}

struct State {
    head: Option<Head>,
    chunks: VecDeque<Bytes>,
    /// Chunks dropped from the front (over the cap): chunk `i` of the body is `chunks[i - dropped]`.
    dropped: u64,
    /// Bytes in `chunks`.
    held: usize,
    cap: usize,
    end: Option<End>,
    /// Ended as a failure the route does not keep (an error event mid-stream): the followers
    /// already reading get it to its end, a new duplicate runs the request itself.
    unshared: bool,
    /// Tasks waiting for a change, by waiter id.
    wakers: Vec<(u64, Waker)>,
    next_waiter: u64,
}

/// The follower cannot get the rest: it fell more than `max_stored_body` behind.
#[derive(Debug, thiserror::Error)]
#[error("the follower fell more than max_stored_body behind the original")]
pub(crate) struct FollowerCut;

/// The original's response failed mid-stream.
#[derive(Debug, thiserror::Error)]
#[error("the original response was aborted mid-stream")]
pub(crate) struct OriginalAborted;

impl Live {
    pub fn new(record: RecordKey, fingerprint: Fingerprint, owner: Owner, cap: usize) -> Live {
        Live {
            record,
            fingerprint,
            owner,
            relaying: AtomicBool::new(false),
            state: Mutex::new(State {
                head: None,
                chunks: VecDeque::new(),
                dropped: 0,
                held: 0,
                cap,
                end: None,
                unshared: false,
                wakers: Vec::new(),
                next_waiter: 0,
            }),
        }
    }

    /// The response's status and kept headers are decided.
    pub(crate) fn set_head(&self, head: Head) {
        let mut s = self.state.lock();
        if s.head.is_none() && s.end.is_none() {
            s.head = Some(head);
            s.wake_all();
        }
    }

    /// The original sent these bytes to its client (copied once: the chunk is shared by every
    /// follower and becomes the stored body).
    pub fn push(&self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let mut s = self.state.lock();
        if s.end.is_some() {
            return;
        }
        s.chunks.push_back(Bytes::copy_from_slice(data));
        s.held += data.len();
        while s.held > s.cap {
            let Some(first) = s.chunks.pop_front() else { break };
            s.held -= first.len();
            s.dropped += 1;
        }
        s.wake_all();
    }

    /// The original's response ended (the first end counts).
    pub(crate) fn finish(&self, end: End) {
        let mut s = self.state.lock();
        if s.end.is_none() {
            s.end = Some(end);
            s.wake_all();
        }
    }

    /// Ends a response that cannot be shared from byte 0 (a relay's source outgrew the cap):
    /// followers waiting for the head are refused, the others cut.
    pub fn cut(&self) {
        let mut s = self.state.lock();
        s.dropped = s.dropped.max(1) + s.chunks.len() as u64;
        s.held = 0;
        s.chunks.clear();
        if s.end.is_none() {
            s.end = Some(End::Aborted);
        }
        s.wake_all();
    }

    /// The most body bytes it keeps (`max_stored_body`).
    pub fn cap(&self) -> usize {
        self.state.lock().cap
    }

    /// Claims the right to relay this response (once).
    pub(crate) fn start_relay(&self) -> bool {
        !self.relaying.swap(true, Ordering::AcqRel)
    }

    /// Waits for chunks from index `from` on (at most about `max_bytes` of them) or the end.
    pub(crate) async fn next_batch(&self, from: u64, max_bytes: usize) -> Batch {
        let id = self.state.lock().waiter_id();
        let out = poll_fn(|cx| {
            let mut s = self.state.lock();
            if from < s.dropped {
                return Poll::Ready(Batch {
                    cut: true,
                    ..Batch::default()
                });
            }
            let local = usize::try_from(from - s.dropped).unwrap_or(usize::MAX);
            let mut batch = Batch {
                next: from,
                ..Batch::default()
            };
            let mut bytes = 0;
            for chunk in s.chunks.iter().skip(local) {
                if bytes > 0 && bytes + chunk.len() > max_bytes {
                    break;
                }
                bytes += chunk.len();
                batch.data.push(chunk.clone());
                batch.next += 1;
            }
            let all = local.saturating_add(batch.data.len()) >= s.chunks.len();
            batch.end = s.end.filter(|_| all);
            if batch.data.is_empty() && batch.end.is_none() {
                s.register(id, cx.waker());
                return Poll::Pending;
            }
            Poll::Ready(batch)
        })
        .await;
        self.state.lock().unregister(id);
        out
    }

    /// The original's body ended cleanly but the response is a failure not to be shared with
    /// new duplicates (followers already reading get it to its end).
    pub(crate) fn finish_unshared(&self) {
        let mut s = self.state.lock();
        s.unshared = true;
        if s.end.is_none() {
            s.end = Some(End::Complete);
        }
        s.wake_all();
    }

    /// Whether it ended as a failure not shared with new duplicates.
    pub(crate) fn is_unshared(&self) -> bool {
        self.state.lock().unshared
    }

    #[cfg(test)]
    /// Whether the response kept its first byte (it never outgrew `max_stored_body`).
    pub(crate) fn is_whole(&self) -> bool {
        self.state.lock().dropped == 0
    }

    /// The whole body, when none of it was dropped (one copy, unless it is one chunk).
    pub fn body(&self) -> Option<Bytes> {
        let s = self.state.lock();
        if s.dropped > 0 {
            return None;
        }
        Some(concat(s.chunks.iter()))
    }

    /// Waits until the head is decided or the response ends without one.
    pub async fn head(&self) -> HeadOrEnd {
        // A follower that joined while the response was live gets it even if it ends as one not
        // shared with new duplicates (it may wake only after that end: a short body passes fast).
        let (id, joined_live) = {
            let mut s = self.state.lock();
            (s.waiter_id(), s.end.is_none())
        };
        let out = poll_fn(|cx| {
            let mut s = self.state.lock();
            if s.unshared && !(joined_live && s.head.is_some()) {
                return Poll::Ready(HeadOrEnd::End(End::Released));
            }
            if s.dropped > 0 {
                return Poll::Ready(HeadOrEnd::TooLarge);
            }
            if let Some(h) = &s.head {
                return Poll::Ready(HeadOrEnd::Head(h.clone()));
            }
            if let Some(end) = s.end {
                return Poll::Ready(HeadOrEnd::End(end));
            }
            s.register(id, cx.waker());
            Poll::Pending
        })
        .await;
        self.state.lock().unregister(id);
        out
    }

    /// A body that reads this response from byte 0.
    pub fn follower(self: &Arc<Self>) -> Follower {
        self.follower_from(0)
    }

    /// A body that reads this response from byte `from` on (a follower that has the bytes
    /// before, and joins the continuation of a cut stream).
    pub(crate) fn follower_from(self: &Arc<Self>, from: usize) -> Follower {
        let id = self.state.lock().waiter_id();
        Follower {
            live: self.clone(),
            next: 0,
            skip: from,
            id,
            done: false,
        }
    }

    /// The head, if it is decided.
    pub(crate) fn head_now(&self) -> Option<Head> {
        self.state.lock().head.clone()
    }

    /// Chunk `index` of the body, or why there is none (yet).
    fn poll_chunk(&self, index: u64, id: u64, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BoxError>>> {
        let mut s = self.state.lock();
        if index < s.dropped {
            return Poll::Ready(Some(Err(Box::new(FollowerCut))));
        }
        let local = usize::try_from(index - s.dropped).unwrap_or(usize::MAX);
        if let Some(chunk) = s.chunks.get(local) {
            return Poll::Ready(Some(Ok(chunk.clone())));
        }
        match s.end {
            Some(End::Complete) => Poll::Ready(None),
            Some(End::Aborted | End::Released) => Poll::Ready(Some(Err(Box::new(OriginalAborted)))),
            None => {
                s.register(id, cx.waker());
                Poll::Pending
            }
        }
    }
}

impl State {
    fn wake_all(&mut self) {
        for (_, w) in self.wakers.drain(..) {
            w.wake();
        }
    }

    fn waiter_id(&mut self) -> u64 {
        self.next_waiter += 1;
        self.next_waiter
    }

    fn register(&mut self, id: u64, waker: &Waker) {
        match self.wakers.iter_mut().find(|(i, _)| *i == id) {
            Some((_, w)) => w.clone_from(waker),
            None => self.wakers.push((id, waker.clone())),
        }
    }

    fn unregister(&mut self, id: u64) {
        self.wakers.retain(|(i, _)| *i != id);
    }
}

/// The chunks as one `Bytes`: no copy for a single chunk.
pub fn concat<'a>(chunks: impl ExactSizeIterator<Item = &'a Bytes> + Clone) -> Bytes {
    if chunks.len() == 1 {
        return chunks.clone().next().cloned().unwrap_or_default();
    }
    let mut buf = BytesMut::with_capacity(chunks.clone().map(Bytes::len).sum());
    for c in chunks {
        buf.extend_from_slice(c);
    }
    buf.freeze()
}

/// A follower's body: the original's bytes from byte 0, as they are produced; it ends as the
/// original ends.
pub struct Follower {
    live: Arc<Live>,
    /// The next chunk to send.
    next: u64,
    /// Bytes still to skip (the reader has them).
    skip: usize,
    id: u64,
    done: bool,
}

impl Follower {
    /// The response it reads.
    pub(crate) fn live(&self) -> &Arc<Live> {
        &self.live
    }
}

impl Body for Follower {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            let polled = self.live.poll_chunk(self.next, self.id, cx);
            return match polled {
                Poll::Ready(Some(Ok(mut chunk))) => {
                    self.next += 1;
                    if self.skip > 0 {
                        let skipped = self.skip.min(chunk.len());
                        self.skip -= skipped;
                        chunk = chunk.slice(skipped..);
                        if chunk.is_empty() {
                            continue;
                        }
                    }
                    Poll::Ready(Some(Ok(Frame::data(chunk))))
                }
                Poll::Ready(other) => {
                    self.done = true;
                    Poll::Ready(other.map(|r| r.map(Frame::data)))
                }
                Poll::Pending => Poll::Pending,
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.live.state.lock().unregister(self.id);
    }
}

/// The live responses of this replica's in-flight claims, by record key.
#[derive(Default)]
pub(crate) struct Lives {
    map: Mutex<HashMap<RecordKey, Arc<Live>>>,
}

impl Lives {
    /// The live response of an in-flight claim of `record` on this replica.
    pub(crate) fn get(&self, record: &RecordKey) -> Option<Arc<Live>> {
        self.by_text(record.as_str())
    }

    /// The same, by the key's text as a follow request names it (looked up without making a key).
    pub(crate) fn by_text(&self, record: &str) -> Option<Arc<Live>> {
        self.map.lock().get(record).cloned()
    }

    /// Registers a fresh claim's response under its record key; the returned guard ends and
    /// unregisters it when dropped.
    pub(crate) fn register(self: &Arc<Self>, live: Arc<Live>) -> Registered {
        self.map.lock().insert(live.record.clone(), live.clone());
        Registered {
            lives: self.clone(),
            live,
        }
    }

    #[cfg(test)]
    /// How many are registered.
    pub(crate) fn len(&self) -> usize {
        self.map.lock().len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A registered live response: unregistered when the claim ends (its write landed or was given
/// up), and ended as released if nothing else ended it.
pub(crate) struct Registered {
    lives: Arc<Lives>,
    pub live: Arc<Live>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.live.finish(End::Released);
        let mut map = self.lives.map.lock();
        // A later claim of the same key may have registered its own since.
        if map.get(&self.live.record).is_some_and(|l| Arc::ptr_eq(l, &self.live)) {
            map.remove(&self.live.record);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::test_ids::{fp, k, own};
    use http_body_util::BodyExt;

    fn head() -> Head {
        Head {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())].into(),
        }
    }

    #[tokio::test]
    async fn a_follower_gets_every_byte_from_the_first_and_ends_with_the_original() {
        let live = Arc::new(Live::new(k("rec"), fp("fp"), own("me"), 1024));
        live.set_head(head());
        live.push(b"one ");
        let follower = live.follower();
        let reader = crate::tasks::spawn("test", async move { follower.collect().await.map(|c| c.to_bytes()) });
        live.push(b"two ");
        live.push(b"three");
        live.finish(End::Complete);
        let got = reader.await.unwrap().unwrap();
        assert_eq!(&got[..], b"one two three");
        assert_eq!(live.body().unwrap(), Bytes::from_static(b"one two three"));
        assert!(matches!(live.head().await, HeadOrEnd::Head(h) if h == head()));
    }

    #[tokio::test]
    async fn an_aborted_original_aborts_its_followers_after_the_bytes_they_had() {
        let live = Arc::new(Live::new(k("rec"), fp("fp"), own("me"), 1024));
        live.set_head(head());
        live.push(b"partial");
        let mut follower = live.follower();
        let first = follower.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"partial");
        live.finish(End::Aborted);
        assert!(follower.frame().await.unwrap().is_err());
        assert!(follower.frame().await.is_none());
    }

    #[tokio::test]
    async fn a_released_original_has_no_head_to_share() {
        let live = Arc::new(Live::new(k("rec"), fp("fp"), own("me"), 1024));
        let waiting = {
            let live = live.clone();
            crate::tasks::spawn("test", async move { live.head().await })
        };
        live.finish(End::Released);
        assert!(matches!(waiting.await.unwrap(), HeadOrEnd::End(End::Released)));
    }

    #[tokio::test]
    async fn past_the_cap_the_response_is_not_whole_and_a_late_follower_is_cut() {
        let live = Arc::new(Live::new(k("rec"), fp("fp"), own("me"), 8));
        live.set_head(head());
        let mut early = live.follower();
        live.push(b"12345");
        assert_eq!(
            &early.frame().await.unwrap().unwrap().into_data().unwrap()[..],
            b"12345"
        );
        let mut late = live.follower();
        live.push(b"6789");
        assert!(!live.is_whole());
        assert!(live.body().is_none());
        // The early follower read the dropped chunk already: it goes on.
        assert_eq!(&early.frame().await.unwrap().unwrap().into_data().unwrap()[..], b"6789");
        // The late one is behind what was dropped: cut.
        assert!(late.frame().await.unwrap().is_err());
        assert!(matches!(live.head().await, HeadOrEnd::TooLarge));
    }

    #[test]
    fn a_registration_ends_and_unregisters_only_its_own_response() {
        let lives = Arc::new(Lives::default());
        let first = Arc::new(Live::new(k("k"), fp("fp"), own("me"), 8));
        let reg = lives.register(first.clone());
        let second = Arc::new(Live::new(k("k"), fp("fp"), own("me"), 8));
        let reg2 = lives.register(second.clone());
        drop(reg);
        assert!(Arc::ptr_eq(&lives.get(&k("k")).unwrap(), &second));
        assert!(matches!(first.state.lock().end, Some(End::Released)));
        drop(reg2);
        assert!(lives.is_empty());
    }
}
