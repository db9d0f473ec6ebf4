//! The bounded weighted fair queue requests wait in while a limit is used up (`on_limit =
//! "queue"`): first in, first out within a share value (a team, a bucket), and across values
//! start-time fair queuing (Goyal, Vin and Cheng, 1996), so that under scarcity values are
//! released in proportion to their `weights`, and a value that asks for less than its share
//! leaves the rest to the others.
//!
//! Each value's head entry carries a start tag `max(vtime, the value's last finish)`; the entry
//! with the least start tag goes first (the older ticket on a tie); serving it moves the virtual
//! time to its tag and the value's finish to `tag + cost / weight`. A value that comes back after
//! a pause starts at the virtual time: it earns no credit for the time it asked for nothing.
//!
//! Decides: the order of release, expiry at deadlines (those requests get 429 at once), the
//! capacity bound. Does not decide when to release (the caller pops when a limit admits the next
//! one, fleet-wide through the leases), nor the deadline itself (the request's, capped by
//! `max_wait`). No clock reads: `now` is a parameter. No tasks, no wakers.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::time::Instant;

/// Fixed point of the virtual time: `cost / weight` in 1/2^20 units.
const SCALE: u128 = 1 << 20;

/// A queued request's number, unique within its queue, in order of arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Ticket(u64);

impl Ticket {
    /// Its number (unique within its queue).
    pub(crate) fn number(self) -> u64 {
        self.0
    }
}

/// One waiting request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry<K> {
    pub(crate) ticket: Ticket,
    /// The share value it is queued under (a bucket, a team's id).
    pub(crate) share: K,
    /// The value's weight (0 counts as 1).
    pub(crate) weight: u32,
    /// What it costs when released (1 for a request, its reservation for tokens; 0 counts as 1).
    pub(crate) cost: u64,
    /// When it stops waiting.
    pub(crate) deadline: Instant,
}

/// The queue holds `capacity` entries already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full;

#[derive(Debug)]
struct Share<K> {
    entries: VecDeque<Entry<K>>,
    /// The start tag of the head entry (while there is one).
    head: u128,
    /// The finish tag of the last entry served.
    last_finish: u128,
}

/// A bounded weighted fair queue over share values `K`.
#[derive(Debug)]
pub(crate) struct FairQueue<K> {
    capacity: usize,
    len: usize,
    vtime: u128,
    next_ticket: u64,
    shares: BTreeMap<K, Share<K>>,
    /// The head of every value with entries: (start tag, ticket, value).
    ready: BTreeSet<(u128, Ticket, K)>,
    /// Values with no entry whose last finish is still ahead of the virtual time (kept so that
    /// coming back at once does not jump ahead): (last finish, value).
    idle: BTreeSet<(u128, K)>,
    deadlines: BTreeSet<(Instant, Ticket)>,
    tickets: BTreeMap<Ticket, K>,
}

impl<K: Ord + Copy> FairQueue<K> {
    /// An empty queue of at most `capacity` entries.
    pub(crate) fn new(capacity: usize) -> FairQueue<K> {
        FairQueue::numbering_from(capacity, 0)
    }

    /// An empty queue whose tickets are numbered from `first` (a queue that replaces an emptied
    /// one of the same bucket: tickets stay unique for as long as a number may still be in use).
    pub(crate) fn numbering_from(capacity: usize, first: u64) -> FairQueue<K> {
        FairQueue {
            capacity,
            len: 0,
            vtime: 0,
            next_ticket: first,
            shares: BTreeMap::new(),
            ready: BTreeSet::new(),
            idle: BTreeSet::new(),
            deadlines: BTreeSet::new(),
            tickets: BTreeMap::new(),
        }
    }

    /// Queues a request under `share`, or refuses it when the queue is full.
    pub(crate) fn push(&mut self, share: K, weight: u32, cost: u64, deadline: Instant) -> Result<Ticket, Full> {
        if self.len >= self.capacity {
            return Err(Full);
        }
        let ticket = Ticket(self.next_ticket);
        self.next_ticket += 1;
        let entry = Entry {
            ticket,
            share,
            weight,
            cost,
            deadline,
        };
        let s = self.shares.entry(share).or_insert_with(|| Share {
            entries: VecDeque::new(),
            head: 0,
            last_finish: 0,
        });
        if s.entries.is_empty() {
            self.idle.remove(&(s.last_finish, share));
            s.head = self.vtime.max(s.last_finish);
            self.ready.insert((s.head, ticket, share));
        }
        s.entries.push_back(entry);
        self.deadlines.insert((deadline, ticket));
        self.tickets.insert(ticket, share);
        self.len += 1;
        Ok(ticket)
    }

    /// The entry that goes next.
    pub(crate) fn peek(&self) -> Option<&Entry<K>> {
        let (_, _, share) = self.ready.first()?;
        self.shares.get(share)?.entries.front()
    }

    /// Releases the entry that goes next.
    pub(crate) fn pop(&mut self) -> Option<Entry<K>> {
        let (tag, _, share) = self.ready.pop_first()?;
        let s = self.shares.get_mut(&share)?;
        let entry = s.entries.pop_front()?;
        self.vtime = self.vtime.max(tag);
        s.last_finish = tag + u128::from(entry.cost.max(1)) * SCALE / u128::from(entry.weight.max(1));
        self.forget(&entry);
        self.next_head(share);
        // Values idle since their finish passed the virtual time start afresh.
        while let Some(&(finish, idle)) = self.idle.first() {
            if finish > self.vtime {
                break;
            }
            self.idle.pop_first();
            self.shares.remove(&idle);
        }
        Some(entry)
    }

    /// Takes out a request that stopped waiting (its client went away).
    pub(crate) fn remove(&mut self, ticket: Ticket) -> Option<Entry<K>> {
        let share = *self.tickets.get(&ticket)?;
        let s = self.shares.get_mut(&share)?;
        let at = s.entries.iter().position(|e| e.ticket == ticket)?;
        let head = s.head;
        let entry = s.entries.remove(at)?;
        self.forget(&entry);
        if at == 0 {
            self.ready.remove(&(head, ticket, share));
            self.next_head(share);
        }
        Some(entry)
    }

    /// Takes out every entry whose deadline is at or before `now`, earliest first (each gets
    /// its 429 at once).
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<Entry<K>> {
        let mut out = Vec::new();
        while let Some(&(deadline, ticket)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            match self.remove(ticket) {
                Some(entry) => out.push(entry),
                None => {
                    self.deadlines.pop_first();
                }
            }
        }
        out
    }

    /// The earliest deadline of a waiting entry (when the caller should next call `expire`).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(d, _)| d)
    }

    /// Entries waiting.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether none is waiting.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops an entry that left from the indexes.
    fn forget(&mut self, entry: &Entry<K>) {
        self.deadlines.remove(&(entry.deadline, entry.ticket));
        self.tickets.remove(&entry.ticket);
        self.len -= 1;
        if self.len == 0 {
            // Nobody waits: nobody is owed anything.
            self.idle.clear();
            self.shares.retain(|_, s| !s.entries.is_empty());
        }
    }

    /// Gives a value's new head its start tag, or marks the value idle.
    fn next_head(&mut self, share: K) {
        let Some(s) = self.shares.get_mut(&share) else {
            return;
        };
        match s.entries.front() {
            Some(next) => {
                s.head = self.vtime.max(s.last_finish);
                self.ready.insert((s.head, next.ticket, share));
            }
            None if s.last_finish > self.vtime && self.len > 0 => {
                self.idle.insert((s.last_finish, share));
            }
            None => {
                self.shares.remove(&share);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn later(base: Instant, secs: u64) -> Instant {
        base + Duration::from_secs(secs)
    }

    #[test]
    fn weights_4_to_1_share_scarce_releases_4_to_1() {
        let t = crate::time::now();
        let mut q = FairQueue::new(2000);
        for _ in 0..1000 {
            q.push('c', 4, 1, later(t, 60)).unwrap();
        }
        for _ in 0..1000 {
            q.push('b', 1, 1, later(t, 60)).unwrap();
        }
        let chat = (0..1000).filter(|_| q.pop().unwrap().share == 'c').count();
        assert!((792..=808).contains(&chat), "{chat} of 1000 to the weight-4 value");
        assert_eq!(q.len(), 1000);
    }

    #[test]
    fn weights_apply_to_costs() {
        let t = crate::time::now();
        let mut q = FairQueue::new(100);
        // Equal weights, one value's requests cost 3 times as much: it gets a third as many.
        for _ in 0..40 {
            q.push('a', 1, 3, t).unwrap();
            q.push('b', 1, 1, t).unwrap();
        }
        let a = (0..40).filter(|_| q.pop().unwrap().share == 'a').count();
        assert!((9..=11).contains(&a), "{a}");
    }

    #[test]
    fn order_is_first_in_first_out_within_a_value() {
        let t = crate::time::now();
        let mut q = FairQueue::new(10);
        let tickets: Vec<Ticket> = (0..5).map(|_| q.push(7u8, 1, 1, t).unwrap()).collect();
        let out: Vec<Ticket> = std::iter::from_fn(|| q.pop().map(|e| e.ticket)).collect();
        assert_eq!(out, tickets);
        assert!(q.is_empty());
    }

    #[test]
    fn a_value_that_asks_for_less_leaves_the_rest_to_others() {
        let t = crate::time::now();
        let mut q = FairQueue::new(200);
        q.push('c', 4, 1, t).unwrap();
        q.push('c', 4, 1, t).unwrap();
        for _ in 0..100 {
            q.push('b', 1, 1, t).unwrap();
        }
        let released: Vec<char> = (0..100).map(|_| q.pop().unwrap().share).collect();
        assert_eq!(released.iter().filter(|&&s| s == 'c').count(), 2);
        assert_eq!(&released[..3], &['c', 'b', 'c'], "the light value is not kept waiting");
    }

    #[test]
    fn a_value_that_comes_back_at_once_gets_no_more_than_its_share() {
        let t = crate::time::now();
        let mut q = FairQueue::new(200);
        for _ in 0..100 {
            q.push('b', 1, 1, t).unwrap();
        }
        // 'c' (weight 1 too) keeps one request queued: each time it is served it asks again.
        q.push('c', 1, 1, t).unwrap();
        let mut c = 0;
        for _ in 0..60 {
            if q.pop().unwrap().share == 'c' {
                c += 1;
                q.push('c', 1, 1, t).unwrap();
            }
        }
        assert!((29..=31).contains(&c), "{c} of 60");
    }

    #[test]
    fn expired_entries_leave_at_their_deadline_and_the_rest_keep_their_order() {
        let t = crate::time::now();
        let mut q = FairQueue::new(10);
        let a = q.push('a', 1, 1, later(t, 5)).unwrap();
        let b = q.push('a', 1, 1, later(t, 1)).unwrap();
        let c = q.push('b', 1, 1, later(t, 3)).unwrap();
        let d = q.push('a', 1, 1, later(t, 9)).unwrap();
        assert_eq!(q.next_deadline(), Some(later(t, 1)));
        assert!(q.expire(t).is_empty());
        let gone: Vec<Ticket> = q.expire(later(t, 3)).into_iter().map(|e| e.ticket).collect();
        assert_eq!(gone, vec![b, c]);
        assert_eq!(q.next_deadline(), Some(later(t, 5)));
        assert_eq!(q.peek().map(|e| e.ticket), Some(a));
        assert_eq!(q.remove(a).map(|e| e.ticket), Some(a));
        assert_eq!(q.remove(a), None);
        assert_eq!(q.pop().map(|e| e.ticket), Some(d));
        assert!(q.is_empty() && q.next_deadline().is_none() && q.pop().is_none());
    }

    #[test]
    fn a_full_queue_refuses_until_one_leaves() {
        let t = crate::time::now();
        let mut q = FairQueue::new(2);
        q.push(1u8, 1, 1, t).unwrap();
        let b = q.push(2u8, 1, 1, t).unwrap();
        assert_eq!(q.push(3u8, 1, 1, t), Err(Full));
        q.remove(b).unwrap();
        assert!(q.push(3u8, 1, 1, t).is_ok());
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn zero_weights_and_costs_count_as_one() {
        let t = crate::time::now();
        let mut q = FairQueue::new(100);
        for _ in 0..20 {
            q.push('z', 0, 0, t).unwrap();
            q.push('o', 1, 1, t).unwrap();
        }
        let z = (0..20).filter(|_| q.pop().unwrap().share == 'z').count();
        assert_eq!(z, 10);
    }
}
