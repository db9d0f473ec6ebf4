//! Concurrent requests per bucket (`concurrent`), across the fleet: the fleet's count of a bucket
//! holds `limit` slots ([`SlotPool`] is its contract); a replica leases a few at a time and
//! admits requests on them with no round trip ([`Slots`]), giving back what it does not need.
//!
//! Decides: admission on a slot held here, how many slots to ask for, and how many to give back
//! on a release. The bound is exact: the fleet never leases more than `limit` slots, and a
//! replica admits only on a slot it holds, so at most `limit` requests run at once fleet-wide
//! (the property test below). Does not decide: how a dead replica's slots come back (the Redis
//! count keeps each replica's slots under its liveness record), nor what a request does when
//! none is free (the fair queue, or 429). Has no notion of time.

/// One replica's slots of one bucket.
#[derive(Debug, Clone)]
pub(crate) struct Slots {
    limit: u64,
    /// The most this replica asks for at once beyond its need, and keeps idle.
    chunk: u64,
    /// Whether idle slots are kept at all: only while a chunk is a true share of the limit
    /// (`limit >= 4 x replicas`); a limit smaller than that has no slot to spare, and one kept
    /// idle here is one a request on another replica waits for.
    keep_idle: bool,
    held: u64,
    in_use: u64,
    /// The fleet had no slot left at the last answer: wait for a release before asking again.
    full: bool,
}

/// One running request's slot. Not `Clone`: released once, with [`Slots::release`] (the
/// pipeline's guard releases it when the response ends, however it ends).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a slot is released with Slots::release"]
pub(crate) struct Slot(());

/// What an admission attempt found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// Admitted on a slot held here.
    Ok(Slot),
    /// No slot free here: ask the fleet for `want`, hand the answer to [`Slots::grant`], try again.
    NeedSlots { want: u64 },
    /// The fleet had none left at the last answer: wait (queue) until a release, then
    /// [`Slots::ask_again`].
    Full,
}

impl Slots {
    /// Slots of a bucket of `limit` concurrent requests on a fleet of about `replicas` replicas:
    /// leases of `limit / (4 × replicas)`, at least 1.
    pub(crate) fn new(limit: u64, replicas: u32) -> Slots {
        let mut slots = Slots {
            limit,
            chunk: 1,
            keep_idle: false,
            held: 0,
            in_use: 0,
            full: false,
        };
        slots.set_replicas(replicas);
        slots
    }

    /// The fleet's size as last seen (the replicas holding slots of the bucket): the chunk.
    pub(crate) fn set_replicas(&mut self, replicas: u32) {
        let share = 4 * u64::from(replicas.max(1));
        self.chunk = (self.limit / share).max(1);
        self.keep_idle = self.limit >= share;
    }

    /// Admits a request on a free slot held here, if there is one. `sparing`: others wait for
    /// the bucket, so only the one slot this request needs is asked for.
    pub(crate) fn try_acquire(&mut self, sparing: bool) -> Acquire {
        if self.in_use < self.held {
            self.in_use += 1;
            return Acquire::Ok(Slot(()));
        }
        if self.full || self.limit == 0 {
            return Acquire::Full;
        }
        let want = if sparing { 1 } else { self.chunk };
        Acquire::NeedSlots {
            want: want.min(self.limit),
        }
    }

    /// The fleet's answer: `granted` more slots held here; none means it is full.
    pub(crate) fn grant(&mut self, granted: u64) {
        self.held = self.held.saturating_add(granted);
        self.full = granted == 0;
    }

    /// A request ended. Returns how many slots to give back to the fleet now ([`SlotPool::give_back`]):
    /// once two chunks lie idle, all but one; every idle one while the fleet is full (others may
    /// be waiting), or when the limit is too small to keep any.
    pub(crate) fn release(&mut self, slot: Slot) -> u64 {
        let Slot(()) = slot;
        self.in_use = self.in_use.saturating_sub(1);
        let idle = self.held - self.in_use;
        // Back to one chunk idle once two have gathered (not at every release: each give-back is
        // a round trip); every idle slot while the fleet is full (others may be waiting).
        let back = match self.full || !self.keep_idle {
            true => idle,
            false if idle >= 2 * self.chunk => idle - self.chunk,
            false => 0,
        };
        self.held -= back;
        back
    }

    /// Forgets that the fleet was full (a release elsewhere was heard, or a waiting request's
    /// turn came): the next admission without a free slot asks again.
    pub(crate) fn ask_again(&mut self) {
        self.full = false;
    }

    /// Every idle slot, for the fleet (a replica shutting down, or a bucket gone idle).
    pub(crate) fn give_back_idle(&mut self) -> u64 {
        let idle = self.held - self.in_use;
        self.held = self.in_use;
        idle
    }

    /// Requests running on this replica.
    pub(crate) fn in_use(&self) -> u64 {
        self.in_use
    }

    /// Slots free here, for the `RateLimit` field (other replicas' count as taken: tight side).
    pub(crate) fn free(&self) -> u64 {
        self.held - self.in_use
    }
}

/// The fleet's count of one bucket's slots: the contract of the Redis script (and the whole of
/// it without Redis). Never leases more than `limit`.
#[derive(Debug, Clone)]
pub(crate) struct SlotPool {
    limit: u64,
    leased: u64,
}

impl SlotPool {
    /// A count of `limit` slots.
    pub(crate) fn new(limit: u64) -> SlotPool {
        SlotPool { limit, leased: 0 }
    }

    /// Leases what it can of `want` slots.
    pub(crate) fn lease(&mut self, want: u64) -> u64 {
        let granted = want.min(self.limit - self.leased);
        self.leased += granted;
        granted
    }

    /// Takes slots back.
    pub(crate) fn give_back(&mut self, n: u64) {
        self.leased = self.leased.saturating_sub(n);
    }
}

#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;

    fn ok(a: Acquire) -> Slot {
        match a {
            Acquire::Ok(s) => s,
            other => panic!("not admitted: {other:?}"),
        }
    }

    #[test]
    fn a_replica_admits_on_slots_it_holds_and_asks_for_more() {
        let (mut s, mut pool) = (Slots::new(8, 1), SlotPool::new(8));
        assert_eq!(s.try_acquire(false), Acquire::NeedSlots { want: 2 });
        s.grant(pool.lease(2));
        let a = ok(s.try_acquire(false));
        let b = ok(s.try_acquire(false));
        assert_eq!((s.in_use(), s.free()), (2, 0));
        assert!(matches!(s.try_acquire(false), Acquire::NeedSlots { .. }));
        // Up to a chunk of idle slots is kept.
        assert_eq!(s.release(a), 0);
        assert_eq!(s.release(b), 0);
        assert_eq!(s.free(), 2);
        assert_eq!(s.give_back_idle(), 2);
        assert_eq!(s.free(), 0);
    }

    #[test]
    fn a_limit_too_small_to_share_keeps_no_slot_idle_and_one_that_is_keeps_a_chunk() {
        // concurrent = 1 on three replicas: the slot a request freed is the fleet's at once.
        let mut one = Slots::new(1, 3);
        one.grant(1);
        let s = ok(one.try_acquire(false));
        assert_eq!(one.release(s), 1);
        // concurrent = 48 on three replicas: chunks of 4, one kept idle, the rest given back.
        let mut many = Slots::new(48, 3);
        assert_eq!(many.try_acquire(false), Acquire::NeedSlots { want: 4 });
        many.grant(8);
        let held: Vec<Slot> = (0..8).map(|_| ok(many.try_acquire(false))).collect();
        let back: u64 = held.into_iter().map(|s| many.release(s)).sum();
        assert_eq!((back, many.free()), (4, 4));
        // Others wait: one slot is asked for, not a chunk to keep idle.
        assert_eq!(Slots::new(48, 3).try_acquire(true), Acquire::NeedSlots { want: 1 });
        // Learning the fleet's size resizes the chunk.
        let mut learned = Slots::new(16, 1);
        assert_eq!(learned.try_acquire(false), Acquire::NeedSlots { want: 4 });
        learned.set_replicas(3);
        assert_eq!(learned.try_acquire(false), Acquire::NeedSlots { want: 1 });
    }

    #[test]
    fn a_full_fleet_is_waited_for_and_given_back_to() {
        let mut pool = SlotPool::new(2);
        let (mut a, mut b) = (Slots::new(2, 2), Slots::new(2, 2));
        a.grant(pool.lease(2));
        let x = ok(a.try_acquire(false));
        let _y = ok(a.try_acquire(false));
        let Acquire::NeedSlots { want } = b.try_acquire(false) else {
            panic!("b holds nothing")
        };
        b.grant(pool.lease(want));
        assert_eq!(b.try_acquire(false), Acquire::Full);
        // b heard nothing: it keeps waiting until told to ask again.
        assert_eq!(b.try_acquire(false), Acquire::Full);
        // A limit of 2 on 2 replicas has no slot to spare: a gives its freed one back at once,
        // though it has not seen the fleet full (b's next ask gets it).
        assert_eq!(a.release(x), 1);
        pool.give_back(1);
        b.ask_again();
        assert_eq!(b.try_acquire(false), Acquire::NeedSlots { want: 1 });
        b.grant(pool.lease(1));
        let _z = ok(b.try_acquire(false));
        let zero = Slots::new(0, 1).try_acquire(false);
        assert_eq!(zero, Acquire::Full);
    }

    #[test]
    fn a_replica_that_saw_the_fleet_full_keeps_no_idle_slot() {
        let mut pool = SlotPool::new(3);
        let mut a = Slots::new(3, 1);
        a.grant(pool.lease(3));
        let x = ok(a.try_acquire(false));
        a.grant(pool.lease(1)); // nothing left: full
        assert_eq!(a.release(x), 3);
        pool.give_back(3);
        assert_eq!(pool.lease(3), 3);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire(usize),
        Answer(usize),
        Release(usize),
        AskAgain(usize),
        GiveBackIdle(usize),
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config(256))]

        /// However replicas interleave, no more than `limit` requests run at once fleet-wide.
        #[test]
        fn no_more_than_the_limit_run_at_once(
            limit in 0u64..20,
            ops in vec((0usize..5, 0usize..3).prop_map(|(k, r)| match k {
                0 => Op::Acquire(r),
                1 => Op::Answer(r),
                2 => Op::Release(r),
                3 => Op::AskAgain(r),
                _ => Op::GiveBackIdle(r),
            }), 1..300),
        ) {
            let mut pool = SlotPool::new(limit);
            let mut replicas: Vec<(Slots, Vec<Slot>, Option<u64>)> =
                (0..3).map(|_| (Slots::new(limit, 3), Vec::new(), None)).collect();
            for op in ops {
                match op {
                    Op::Acquire(r) => match replicas[r].0.try_acquire(false) {
                        Acquire::Ok(slot) => replicas[r].1.push(slot),
                        Acquire::NeedSlots { want } => replicas[r].2 = Some(want),
                        Acquire::Full => {}
                    },
                    Op::Answer(r) => {
                        if let Some(want) = replicas[r].2.take() {
                            replicas[r].0.grant(pool.lease(want));
                        }
                    }
                    Op::Release(r) => {
                        if let Some(slot) = replicas[r].1.pop() {
                            pool.give_back(replicas[r].0.release(slot));
                        }
                    }
                    Op::AskAgain(r) => replicas[r].0.ask_again(),
                    Op::GiveBackIdle(r) => pool.give_back(replicas[r].0.give_back_idle()),
                }
                let running: u64 = replicas.iter().map(|(s, _, _)| s.in_use()).sum();
                prop_assert!(running <= limit, "{running} running, limit {limit}");
                prop_assert!(pool.leased <= limit);
            }
        }
    }
}
