//! One bucket's account on this replica: a ledger per quota the limit sets (requests and tokens
//! per minute, spend per day and per month) and its concurrent slots. An admission takes from
//! each, or from none: what is missing is asked of the fleet and the admission tried again.

use crate::config::LimitPolicy;
use crate::limits::concurrency::{Acquire, Slot, Slots};
use crate::limits::ledger::{Lease, Ledger, Reservation, Reserve};
use crate::limits::window::Period;

/// Which quota of a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Quota {
    Requests,
    Tokens,
    SpendDay,
    SpendMonth,
}

impl Quota {
    pub(crate) const ALL: [Quota; 4] = [Quota::Requests, Quota::Tokens, Quota::SpendDay, Quota::SpendMonth];

    /// Its name in the store's keys.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Quota::Requests => "requests",
            Quota::Tokens => "tokens",
            Quota::SpendDay => "usd_day",
            Quota::SpendMonth => "usd_month",
        }
    }

    /// Its limit under `policy`, if it sets one.
    pub(crate) fn limit(self, policy: &LimitPolicy) -> Option<u64> {
        match self {
            Quota::Requests => policy.requests_per_minute,
            Quota::Tokens => policy.tokens_per_minute,
            Quota::SpendDay => policy.micro_usd_per_day,
            Quota::SpendMonth => policy.micro_usd_per_month,
        }
    }

    fn period(self) -> Period {
        match self {
            Quota::Requests | Quota::Tokens => Period::Minute,
            Quota::SpendDay => Period::Day,
            Quota::SpendMonth => Period::Month,
        }
    }
}

/// The index of the slots' entry in [`Bucket::asking`].
pub(crate) const SLOTS: usize = 4;

/// What a request asks of a bucket.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Want {
    /// Tokens it may use (input and output).
    pub(crate) tokens: u64,
    /// What that may cost, in micro-USD.
    pub(crate) cost: u64,
    /// Others wait for the bucket (here or in the fleet): a slot is asked for alone, not a
    /// chunk that would lie idle here while they wait.
    pub(crate) sparing: bool,
}

impl Want {
    fn of(self, quota: Quota) -> u64 {
        match quota {
            Quota::Requests => 1,
            Quota::Tokens => self.tokens,
            Quota::SpendDay | Quota::SpendMonth => self.cost,
        }
    }
}

/// One bucket's ledgers on this replica.
pub(crate) struct Bucket {
    ledgers: [Option<Ledger>; 4],
    pub(crate) slots: Option<Slots>,
    /// A request of the fleet is in flight for this quota's lease (index 0 to 3) or for slots
    /// ([`SLOTS`]): one at a time per bucket, the others wait for its answer. Without it,
    /// concurrent requests would each ask for a lease, and one told "nothing left" before the
    /// others' grants were credited would be refused with the quota far from used.
    pub(crate) asking: [bool; 5],
    /// Requests holding something of it (admitted, not yet settled).
    holders: u32,
}

/// What a bucket says to a request.
pub(crate) enum Step {
    /// Admitted; the leases to renew in the background, by quota (ran low, no ask in flight:
    /// marked asking now), a few times a window.
    Held(Held, Option<Box<Renewals>>),
    Lease(Quota, Lease),
    Slots {
        want: u64,
        held: u64,
    },
    /// Another request is asking the fleet for what is missing: wait for its answer.
    Wait,
    /// Over: a window used up (`window`), or no slot free.
    Over {
        retry_after_ms: u64,
        window: bool,
    },
}

/// The leases to ask for, by quota (index as [`Quota::ALL`]).
pub(crate) type Renewals = [Option<Lease>; 4];

/// What a request holds of one bucket: a reservation per quota, a slot.
pub(crate) struct Held {
    pub(crate) reserved: [Option<Reservation>; 4],
    pub(crate) slot: Option<Slot>,
}

impl Bucket {
    pub(crate) fn new(policy: &LimitPolicy, replicas: u32) -> Bucket {
        Bucket {
            ledgers: Quota::ALL.map(|q| q.limit(policy).map(|n| Ledger::new(n, q.period(), replicas))),
            slots: policy.concurrent.map(|n| Slots::new(u64::from(n), replicas)),
            asking: [false; 5],
            holders: 0,
        }
    }

    /// Whether it must stay in the table: a request holds something of it, or the fleet is being
    /// asked for it (the answer is credited to it).
    pub(crate) fn pinned(&self) -> bool {
        self.holders > 0 || self.asking.iter().any(|a| *a)
    }

    /// What it holds of the fleet that nobody uses, given back (it is dropped): each quota's
    /// unspent lease with its window, and whether it held idle slots.
    pub(crate) fn unspent(&mut self, now_ms: u64) -> ([Option<(crate::limits::window::Window, u64)>; 4], bool) {
        let mut leases: [Option<(crate::limits::window::Window, u64)>; 4] = Default::default();
        for (i, ledger) in self.ledgers.iter_mut().enumerate() {
            leases[i] = ledger.as_mut().and_then(|l| l.give_back(now_ms));
        }
        let slots = self.slots.as_mut().is_some_and(|s| s.give_back_idle() > 0);
        (leases, slots)
    }

    /// Admits a request that wants `want` at `now_ms` on everything the bucket limits, or says
    /// what is missing (having taken nothing).
    pub(crate) fn try_admit(&mut self, now_ms: u64, want: Want) -> Step {
        let mut reserved: [Option<Reservation>; 4] = Default::default();
        for (i, quota) in Quota::ALL.into_iter().enumerate() {
            let Some(ledger) = self.ledgers[i].as_mut() else {
                continue;
            };
            match ledger.try_reserve(now_ms, want.of(quota)) {
                Reserve::Ok(r) => reserved[i] = Some(r),
                other => {
                    self.undo(now_ms, reserved);
                    return match other {
                        Reserve::NeedLease(_) if self.asking[i] => Step::Wait,
                        Reserve::NeedLease(lease) => {
                            self.asking[i] = true;
                            Step::Lease(quota, lease)
                        }
                        Reserve::Over { retry_after_ms } => Step::Over {
                            retry_after_ms,
                            window: true,
                        },
                        Reserve::Ok(_) => Step::Over {
                            retry_after_ms: 1000,
                            window: false,
                        },
                    };
                }
            }
        }
        let slot = match self.slots.as_mut().map(|s| s.try_acquire(want.sparing)) {
            None => None,
            Some(Acquire::Ok(slot)) => Some(slot),
            Some(other) => {
                let held = self.slots.as_ref().map_or(0, |s| s.in_use() + s.free());
                self.undo(now_ms, reserved);
                // The fleet was full when last asked: the next admission asks again (a slot
                // may have been released on another replica).
                if let Some(s) = self.slots.as_mut() {
                    s.ask_again();
                }
                return match other {
                    Acquire::NeedSlots { .. } if self.asking[SLOTS] => Step::Wait,
                    Acquire::NeedSlots { want } => {
                        self.asking[SLOTS] = true;
                        Step::Slots { want, held }
                    }
                    // A slot frees when a request ends: soon, but when is not known.
                    _ => Step::Over {
                        retry_after_ms: 1000,
                        window: false,
                    },
                };
            }
        };
        let mut renewals: Option<Box<Renewals>> = None;
        for (i, ledger) in self.ledgers.iter().enumerate() {
            if let Some(lease) = ledger
                .as_ref()
                .and_then(|l| l.renewal(now_ms))
                .filter(|_| !self.asking[i])
            {
                self.asking[i] = true;
                renewals.get_or_insert_default()[i] = Some(lease);
            }
        }
        self.holders += 1;
        Step::Held(Held { reserved, slot }, renewals)
    }

    /// Gives back what an admission took before it found something missing.
    fn undo(&mut self, now_ms: u64, reserved: [Option<Reservation>; 4]) {
        for (ledger, r) in self.ledgers.iter_mut().zip(reserved) {
            if let (Some(l), Some(r)) = (ledger.as_mut(), r) {
                l.settle(now_ms, r, 0);
            }
        }
    }

    /// Charges `held` with what its stream used so far (`total` per quota; `None`: not counted
    /// while it flows): what goes beyond a reservation is debited at once.
    pub(crate) fn charge(&mut self, now_ms: u64, held: &mut Held, total: impl Fn(Quota) -> Option<u64>) {
        for (i, (ledger, r)) in self.ledgers.iter_mut().zip(held.reserved.iter_mut()).enumerate() {
            if let (Some(l), Some(r), Some(total)) = (ledger.as_mut(), r.as_mut(), total(Quota::ALL[i])) {
                let more = total.saturating_sub(r.used());
                if more > 0 {
                    l.charge(now_ms, r, more);
                }
            }
        }
    }

    pub(crate) fn ledger(&mut self, quota: Quota) -> Option<&mut Ledger> {
        self.ledgers[quota as usize].as_mut()
    }

    pub(crate) fn ledger_ref(&self, quota: Quota) -> Option<&Ledger> {
        self.ledgers[quota as usize].as_ref()
    }

    /// Settles `held` with what the request used (`actual` per quota; `None`: unknown, the
    /// reservation stays spent), at `now_ms`: each quota's excess beyond its reservation, with
    /// its window, and the slots to hold after the release (when some go back to the fleet:
    /// every idle one when `others_wait`, requests waiting for the bucket in the fleet's queue).
    pub(crate) fn settle(
        &mut self,
        now_ms: u64,
        held: Held,
        others_wait: bool,
        actual: impl Fn(Quota) -> Option<u64> + Copy,
    ) -> ([Option<(crate::limits::window::Window, u64)>; 4], Option<u64>) {
        self.holders = self.holders.saturating_sub(1);
        let mut excess: [Option<(crate::limits::window::Window, u64)>; 4] = Default::default();
        for (i, (ledger, r)) in self.ledgers.iter_mut().zip(held.reserved).enumerate() {
            if let (Some(l), Some(r)) = (ledger.as_mut(), r) {
                let quota = Quota::ALL[i];
                // Unknown: what it reserved, or what its stream was charged when more.
                let used = actual(quota).unwrap_or(r.reserved().max(r.used()));
                let window = r.window();
                let settled = l.settle(now_ms, r, used);
                if settled.excess > 0 {
                    excess[i] = Some((window, settled.excess));
                }
            }
        }
        let mut slots_after = None;
        if let (Some(s), Some(slot)) = (self.slots.as_mut(), held.slot) {
            let mut back = s.release(slot);
            if others_wait {
                back += s.give_back_idle();
            }
            if back > 0 {
                slots_after = Some(s.in_use() + s.free());
            }
            // A slot was freed: the next request asks the fleet again.
            s.ask_again();
        }
        (excess, slots_after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{KeySpec, OnLimit, RedisDown};
    use crate::limits::ledger::Grant;

    fn policy(tokens_per_minute: u64) -> LimitPolicy {
        LimitPolicy {
            name: "team".into(),
            key: KeySpec::parse("route").expect("key"),
            requests_per_minute: None,
            tokens_per_minute: Some(tokens_per_minute),
            concurrent: None,
            micro_usd_per_day: None,
            micro_usd_per_month: None,
            on_limit: OnLimit::Reject,
            max_wait: std::time::Duration::ZERO,
            weights: Default::default(),
            share_by: None,
            redis_down: RedisDown::Local,
        }
    }

    /// 12:00:10 UTC on some day.
    const NOW: u64 = 1_796_385_610_000;

    /// What the fleet grants: all that is asked while the window has it.
    fn answer(left: &mut u64, lease: Lease) -> Grant {
        let granted = lease.want.min(*left);
        *left -= granted;
        Grant {
            window: lease.window,
            granted,
            left: *left,
        }
    }

    #[test]
    fn a_lease_running_low_is_renewed_before_a_request_has_to_wait_for_it() {
        let mut b = Bucket::new(&policy(16_000), 1); // leases of 2000
        let mut fleet_left = 16_000;
        let want = Want {
            tokens: 100,
            cost: 0,
            sparing: false,
        };
        let mut waited = 0;
        let mut renewed = 0;
        let mut held = Vec::new();
        for i in 0..150u64 {
            let now = NOW + i;
            loop {
                match b.try_admit(now, want) {
                    Step::Held(h, renewals) => {
                        held.push(h);
                        // Answered in the background, before the next request.
                        for (q, lease) in renewals.into_iter().flat_map(|r| *r).enumerate() {
                            if let Some(lease) = lease {
                                renewed += 1;
                                let grant = answer(&mut fleet_left, lease);
                                b.ledger(Quota::ALL[q]).expect("ledger").grant(now, grant);
                                b.asking[q] = false;
                            }
                        }
                        break;
                    }
                    Step::Lease(q, lease) => {
                        waited += 1;
                        let grant = answer(&mut fleet_left, lease);
                        b.ledger(q).expect("ledger").grant(now, grant);
                        b.asking[q as usize] = false;
                    }
                    Step::Over { .. } => {
                        assert_eq!(i, 160, "refused before the window's 16 000 were spent");
                    }
                    Step::Wait | Step::Slots { .. } => panic!("one request at a time, no slots"),
                }
            }
        }
        assert_eq!(waited, 1, "only the first request of the window waits for the fleet");
        assert!(renewed >= 6, "{renewed} renewals for 15 000 tokens in leases of 2000");
        // While one renewal is in flight, no second is asked for.
        let mut b = Bucket::new(&policy(16_000), 1);
        let Step::Lease(_, lease) = b.try_admit(NOW, want) else {
            panic!("the first asks")
        };
        let mut left = 16_000;
        b.ledger(Quota::Tokens)
            .expect("ledger")
            .grant(NOW, answer(&mut left, lease));
        b.asking[Quota::Tokens as usize] = false;
        let mut asked = 0;
        for _ in 0..19 {
            if let Step::Held(_, r) = b.try_admit(NOW, want) {
                asked += r.iter().flat_map(|r| r.iter()).flatten().count();
            }
        }
        assert_eq!(asked, 1);
        drop(held);
    }
}
