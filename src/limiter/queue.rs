//! Where requests wait for a limit (`on_limit = "queue"`): one weighted fair queue per bucket on
//! this replica (`crate::limits::fair_queue`), its share values those of the limit's `share_by`
//! (else one value: first in, first out). The head of a bucket's queue is the one request that
//! may try the limit again; a request that arrives while others wait queues behind them. A
//! release (a request served, one that gave up, a slot freed) wakes the waiters to look again.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::Notify;

use crate::limits::fair_queue::{FairQueue, Full, Ticket};
use crate::limits::key::BucketKey;
use crate::time::Instant;

/// Requests waiting per bucket at most: past it, 429 at once.
const QUEUE_CAPACITY: usize = 10_000;

/// One limit's waiting requests on this replica.
#[derive(Default)]
pub(crate) struct Waiting {
    queues: parking_lot::Mutex<HashMap<BucketKey, FairQueue<[u8; 16]>>>,
    turn: Notify,
}

/// A request's place in a bucket's queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    pub(crate) bucket: BucketKey,
    pub(crate) ticket: Ticket,
}

impl Waiting {
    /// Whether requests wait in `bucket`'s queue.
    pub(crate) fn busy(&self, bucket: &BucketKey) -> bool {
        self.queues.lock().get(bucket).is_some_and(|q| !q.is_empty())
    }

    /// Queues a request under `share` (its `weight`) until `deadline`.
    pub(crate) fn join(
        &self,
        bucket: BucketKey,
        (share, weight): ([u8; 16], u32),
        deadline: Instant,
    ) -> Result<Place, Full> {
        let mut queues = self.queues.lock();
        let queue = queues.entry(bucket).or_insert_with(|| FairQueue::new(QUEUE_CAPACITY));
        let ticket = queue.push(share, weight, 1, deadline)?;
        Ok(Place { bucket, ticket })
    }

    /// Whether `place` is the head of its queue (the one that may try the limit).
    pub(crate) fn is_head(&self, place: &Place) -> bool {
        let queues = self.queues.lock();
        queues
            .get(&place.bucket)
            .and_then(FairQueue::peek)
            .is_some_and(|e| e.ticket == place.ticket)
    }

    /// The head was admitted: released in its turn (the shares' books move on).
    pub(crate) fn served(&self, place: Place) {
        {
            let mut queues = self.queues.lock();
            if let Some(q) = queues.get_mut(&place.bucket) {
                match q.peek().map(|e| e.ticket) {
                    Some(t) if t == place.ticket => {
                        q.pop();
                    }
                    _ => {
                        q.remove(place.ticket);
                    }
                }
            }
        }
        self.turn.notify_waiters();
    }

    /// A request stopped waiting without being admitted (its wait ran out, its client left).
    pub(crate) fn leave(&self, place: Place) {
        {
            let mut queues = self.queues.lock();
            if let Some(q) = queues.get_mut(&place.bucket) {
                q.remove(place.ticket);
                if q.is_empty() {
                    queues.remove(&place.bucket);
                }
            }
        }
        self.turn.notify_waiters();
    }

    /// Something was released: the waiters look again.
    pub(crate) fn wake(&self) {
        self.turn.notify_waiters();
    }

    /// Waits for a release, at most `within`.
    pub(crate) async fn next_turn(&self, within: Duration) {
        let _ = tokio::time::timeout(within, self.turn.notified()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_is_the_one_that_may_try_and_leaving_moves_the_next_up() {
        let w = Waiting::default();
        let b = BucketKey([1; 16]);
        let far = crate::time::now() + Duration::from_secs(60);
        assert!(!w.busy(&b));
        let first = w.join(b, ([1; 16], 1), far).unwrap();
        let second = w.join(b, ([1; 16], 1), far).unwrap();
        assert!(w.busy(&b));
        assert!(w.is_head(&first) && !w.is_head(&second));
        w.leave(first);
        assert!(w.is_head(&second));
        w.served(second);
        assert!(!w.busy(&b));
    }
}
