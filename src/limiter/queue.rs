//! Where requests wait for a limit (`on_limit = "queue"`): one weighted fair queue per bucket on
//! this replica (`crate::limits::fair_queue`), its share values those of the limit's `share_by`
//! (else one value: first in, first out). With Redis, a waiting request is also in the bucket's
//! fleet queue (`limit_queue_v2.lua`, the same fair order across every replica): this replica's
//! entries there are kept in the fleet's order, and the first of them is the one that asks the
//! fleet whether it is its turn. Without the fleet (no Redis, or Redis away when it joined), the
//! head of the local queue is the one that may try the limit again. A request that arrives while
//! others wait (here, or in the fleet's queue as last seen) queues behind them. A release (a
//! request served, one that gave up, a slot freed) wakes the waiters to look again.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
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
    queues: parking_lot::Mutex<Queues>,
    /// Whether anything waits, here or (as last seen) in the fleet: while nothing does (the
    /// common case), a request looks no further, taking no lock.
    any: AtomicBool,
    turn: Notify,
}

#[derive(Default)]
struct Queues {
    local: HashMap<BucketKey, FairQueue<[u8; 16]>>,
    /// This replica's entries in each bucket's fleet queue, in the fleet's order (start tag,
    /// ticket).
    fleet: HashMap<BucketKey, BTreeSet<(i64, Ticket)>>,
    /// Buckets whose fleet queue had requests waiting when last seen.
    fleet_busy: HashSet<BucketKey>,
    /// The ticket the fleet last said is its first, where it is one of this replica's waiters
    /// (it, not the first by this replica's order, asks next).
    fleet_first: HashMap<BucketKey, u64>,
    /// The next ticket number, for every bucket of the limit: a bucket's queue that empties and
    /// comes back does not reuse a number the fleet's queue may still hear about.
    next_ticket: u64,
}

/// A request's share in a limit's queue: the value it waits under (its `share_by` value, hashed
/// as a bucket is; without `share_by`, its bucket), and that value's weight under `weights`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueShare {
    pub(crate) value: [u8; 16],
    pub(crate) weight: u32,
}

/// A request's place in a bucket's queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    pub(crate) bucket: BucketKey,
    pub(crate) ticket: Ticket,
    /// Its start tag in the fleet's queue, when it is in it.
    pub(crate) fleet: Option<i64>,
}

impl Waiting {
    /// Whether requests wait in `bucket`'s queue, here or (as last seen) in the fleet's.
    pub(crate) fn busy(&self, bucket: &BucketKey) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let q = self.queues.lock();
        q.local.get(bucket).is_some_and(|q| !q.is_empty()) || q.fleet_busy.contains(bucket)
    }

    /// What the fleet said of `bucket`'s queue: `waiting` requests in it.
    pub(crate) fn fleet_saw(&self, bucket: BucketKey, waiting: u64) {
        if waiting == 0 && !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut q = self.queues.lock();
        match waiting > 0 {
            true => q.fleet_busy.insert(bucket),
            false => q.fleet_busy.remove(&bucket),
        };
        self.any.store(q.any(), Ordering::Release);
    }

    /// Queues a request under `share` (its value, with its weight) until `deadline`.
    pub(crate) fn join(&self, bucket: BucketKey, share: QueueShare, deadline: Instant) -> Result<Place, Full> {
        let mut queues = self.queues.lock();
        let first = queues.next_ticket;
        let queue = queues
            .local
            .entry(bucket)
            .or_insert_with(|| FairQueue::numbering_from(QUEUE_CAPACITY, first));
        let ticket = queue.push(share.value, share.weight, 1, deadline)?;
        queues.next_ticket = queues.next_ticket.max(ticket.number() + 1);
        self.any.store(true, Ordering::Release);
        Ok(Place {
            bucket,
            ticket,
            fleet: None,
        })
    }

    /// `place` joined the fleet's queue with start tag `tag`.
    pub(crate) fn joined_fleet(&self, place: &mut Place, tag: i64) {
        place.fleet = Some(tag);
        let mut q = self.queues.lock();
        q.fleet.entry(place.bucket).or_default().insert((tag, place.ticket));
        q.fleet_busy.insert(place.bucket);
        self.any.store(true, Ordering::Release);
    }

    /// Whether `place` is the one of this replica that may try the limit (or, in the fleet's
    /// queue, ask the fleet whether it is its turn).
    pub(crate) fn is_head(&self, place: &Place) -> bool {
        let q = self.queues.lock();
        match place.fleet {
            Some(tag) => {
                let ours = q.fleet.get(&place.bucket);
                match q.fleet_first.get(&place.bucket) {
                    Some(first) if ours.is_some_and(|f| f.iter().any(|(_, t)| t.number() == *first)) => {
                        *first == place.ticket.number()
                    }
                    _ => ours
                        .and_then(|f| f.first())
                        .is_some_and(|first| *first == (tag, place.ticket)),
                }
            }
            None => q
                .local
                .get(&place.bucket)
                .and_then(FairQueue::peek)
                .is_some_and(|e| e.ticket == place.ticket),
        }
    }

    /// The head was admitted: released in its turn (the shares' books move on).
    pub(crate) fn served(&self, place: Place) {
        {
            let mut queues = self.queues.lock();
            queues.forget_fleet(&place);
            if let Some(q) = queues.local.get_mut(&place.bucket) {
                match q.peek().map(|e| e.ticket) {
                    Some(t) if t == place.ticket => {
                        q.pop();
                    }
                    _ => {
                        q.remove(place.ticket);
                    }
                }
                if q.is_empty() {
                    queues.local.remove(&place.bucket);
                }
            }
            self.any.store(queues.any(), Ordering::Release);
        }
        self.after_leaving(&place);
    }

    /// A request stopped waiting without being admitted (its wait ran out, its client left).
    pub(crate) fn leave(&self, place: Place) {
        {
            let mut queues = self.queues.lock();
            queues.forget_fleet(&place);
            if let Some(q) = queues.local.get_mut(&place.bucket) {
                q.remove(place.ticket);
                if q.is_empty() {
                    queues.local.remove(&place.bucket);
                }
            }
            self.any.store(queues.any(), Ordering::Release);
        }
        self.after_leaving(&place);
    }

    /// The waiters look again once `place` left: at once when it waited here only; in the
    /// fleet's queue, once the fleet has heard (`Fleet::queue_leave` wakes them): woken before,
    /// the next one would still find it first there and sleep a whole poll.
    fn after_leaving(&self, place: &Place) {
        if place.fleet.is_none() {
            self.turn.notify_waiters();
        }
    }

    /// The fleet's first waiter of `bucket` is this replica's `ticket`: it asks next (unless it
    /// left already and the fleet has not heard yet: then nobody is woken, or the asker would
    /// wake itself at once, for ever).
    pub(crate) fn fleet_first(&self, bucket: BucketKey, ticket: u64) {
        {
            let mut q = self.queues.lock();
            let waits_here = q
                .fleet
                .get(&bucket)
                .is_some_and(|f| f.iter().any(|(_, t)| t.number() == ticket));
            if !waits_here {
                return;
            }
            q.fleet_first.insert(bucket, ticket);
        }
        self.turn.notify_waiters();
    }

    /// Something was released: the waiters look again.
    pub(crate) fn wake(&self) {
        if self.any.load(Ordering::Acquire) {
            self.turn.notify_waiters();
        }
    }

    /// Waits for a release, at most `within`.
    pub(crate) async fn next_turn(&self, within: Duration) {
        let _ = tokio::time::timeout(within, self.turn.notified()).await;
    }

    /// A wake-up registered now, to wait for after looking: a release that comes while a waiter
    /// asks the fleet whether it may go is not missed (it would sleep a whole poll).
    pub(crate) fn listen(&self) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut woken = Box::pin(self.turn.notified());
        woken.as_mut().enable();
        woken
    }
}

impl Queues {
    /// Whether anything waits (an empty bucket's queue is removed).
    fn any(&self) -> bool {
        !self.local.is_empty() || !self.fleet_busy.is_empty()
    }

    fn forget_fleet(&mut self, place: &Place) {
        let Some(tag) = place.fleet else { return };
        if self.fleet_first.get(&place.bucket) == Some(&place.ticket.number()) {
            self.fleet_first.remove(&place.bucket);
        }
        if let Some(f) = self.fleet.get_mut(&place.bucket) {
            f.remove(&(tag, place.ticket));
            if f.is_empty() {
                self.fleet.remove(&place.bucket);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(value: u8, weight: u32) -> QueueShare {
        QueueShare {
            value: [value; 16],
            weight,
        }
    }

    #[test]
    fn the_head_is_the_one_that_may_try_and_leaving_moves_the_next_up() {
        let w = Waiting::default();
        let b = BucketKey([1; 16]);
        let far = crate::time::now() + Duration::from_secs(60);
        assert!(!w.busy(&b));
        let first = w.join(b, share(1, 1), far).unwrap();
        let second = w.join(b, share(1, 1), far).unwrap();
        assert!(w.busy(&b));
        assert!(w.is_head(&first) && !w.is_head(&second));
        w.leave(first);
        assert!(w.is_head(&second));
        w.served(second);
        assert!(!w.busy(&b));
    }

    #[test]
    fn in_the_fleets_queue_the_fleets_order_decides_who_asks() {
        let w = Waiting::default();
        let b = BucketKey([1; 16]);
        let far = crate::time::now() + Duration::from_secs(60);
        // Joined here first, but the fleet gave it a later tag (a heavier share's turn).
        let mut first = w.join(b, share(1, 1), far).unwrap();
        let mut second = w.join(b, share(2, 4), far).unwrap();
        w.joined_fleet(&mut first, 1 << 20);
        w.joined_fleet(&mut second, 1 << 18);
        assert!(w.is_head(&second) && !w.is_head(&first));
        w.served(second);
        assert!(w.is_head(&first));
        w.leave(first);
        // The fleet's queue was busy when last seen, until the fleet says otherwise.
        assert!(w.busy(&b));
        w.fleet_saw(b, 0);
        assert!(!w.busy(&b));
    }

    #[test]
    fn the_fleets_first_asks_even_when_this_replica_ordered_it_later() {
        let w = Waiting::default();
        let b = BucketKey([1; 16]);
        let far = crate::time::now() + Duration::from_secs(60);
        let mut batch = w.join(b, share(1, 1), far).unwrap();
        let mut chat = w.join(b, share(2, 4), far).unwrap();
        w.joined_fleet(&mut batch, 100);
        w.joined_fleet(&mut chat, 120);
        assert!(w.is_head(&batch));
        // Chat's requests elsewhere gave up: the fleet's first is this replica's chat request.
        w.fleet_first(b, chat.ticket.number());
        assert!(w.is_head(&chat) && !w.is_head(&batch));
        w.served(chat);
        assert!(w.is_head(&batch), "once it left, this replica's order decides again");
    }

    #[test]
    fn tickets_are_never_reused_when_a_bucket_empties() {
        let w = Waiting::default();
        let b = BucketKey([1; 16]);
        let far = crate::time::now() + Duration::from_secs(60);
        let first = w.join(b, share(1, 1), far).unwrap();
        w.leave(first);
        let second = w.join(b, share(1, 1), far).unwrap();
        assert_ne!(
            first.ticket, second.ticket,
            "a late `done` for the first must not remove the second"
        );
    }
}
