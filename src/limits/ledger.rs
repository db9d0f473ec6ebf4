//! One replica's account of one bucket's quota (requests, tokens or micro-USD) in the current
//! window, spent from a **lease**: capacity the fleet's count of the bucket granted this replica
//! ([`Pool`] is that count's contract: the Redis script keeps it for a fleet, a local `Pool` for
//! one replica without Redis, or for each replica's share while Redis is away).
//!
//! A request reserves what it can use on admission ([`Ledger::try_reserve`]); a stream is charged
//! as it flows beyond that ([`Ledger::charge`]); the provider's usage settles it
//! ([`Ledger::settle`]), giving back what it did not use while its window lasts. Only when the
//! lease here cannot cover a reservation does a request wait for the fleet (`NeedLease`), and
//! only when the fleet has granted the whole window is it over the limit (`Over`). Leases come in
//! chunks so that a replica asks a few times a window ([`Ledger::renewal`] says when to renew in
//! the background, before requests block).
//!
//! **The overshoot bound.** The fleet's count never grants more than the limit in a window, and a
//! reservation is admitted only from lease in hand, so for every window W, over the whole fleet:
//!
//! > Σ over requests admitted in W of their usage ≤ limit + Σ over the same requests of their
//! > excess, where a request's excess is its usage beyond its reservation (`max(0, usage −
//! > reserved)`).
//!
//! Why: a replica's balance in W starts at 0 and moves by grants (+), reservations (−, only when
//! the balance covers them, so a reservation never takes it below 0), refunds (+, at most what
//! the same reservation debited in W) and excess (−). So the balance never falls below minus the
//! excess still standing in W. A request admitted and settled in W stays debited its usage; one
//! settled later, at least its reservation. Summed over the fleet, Σ min(usage, reserved) of the
//! requests admitted in W ≤ Σ grants in W ≤ limit; each request's excess is the rest.
//!
//! A request that reserves at least what it uses (`max_tokens` and a prompt estimate that is an
//! upper bound) adds nothing: such traffic never exceeds the limit, whatever the number of
//! replicas, the interleaving or the lease sizes. Excess charged while a stream flows also blocks
//! later admissions at once. The property test `the_fleet_stays_within_the_limit_plus_the_excess`
//! (in `limits/mod.rs`) checks the bound over random interleavings of replicas, late leases,
//! streams, settlements and windows; [`Ledger::overshoot`] and [`Settled::excess`] are its terms,
//! for the metrics. What leases cost is the other way: capacity leased to a replica that does not
//! use it lies idle for the window (about one lease per replica; [`Ledger::give_back`] returns it).
//!
//! Does not decide: how much a request reserves (the pipeline's estimate), how leases reach
//! Redis, which replica asks when (one lease request in flight per bucket is the caller's
//! coalescing), or what happens while Redis is away (`redis_down`).

use super::window::{Period, Window};

/// One replica's ledger of one bucket.
#[derive(Debug, Clone)]
pub(crate) struct Ledger {
    limit: u64,
    period: Period,
    /// The lease size this replica asks for at least (see [`Ledger::set_replicas`]).
    chunk: u64,
    /// The window the balance is for; an older one's lease is worth nothing.
    window: Window,
    /// Lease in hand; below zero when excess was charged beyond it (the overshoot).
    balance: i128,
    /// What the fleet had left after this replica's last grant in this window (`None`: not
    /// asked yet); `Some(0)`: the window is used up fleet-wide.
    fleet_left: Option<u64>,
    /// Excess charged here in this window (usage beyond reservations).
    excess: u64,
    /// What this replica was granted in this window.
    granted: u64,
    /// The replicas the fleet's count last said share the bucket (0: never asked).
    replicas: u32,
}

/// A lease request: ask the fleet's count of the bucket for `want` in `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    pub(crate) window: Window,
    pub(crate) want: u64,
    /// What this replica was granted already in `window` (what a replica counting alone while
    /// the fleet's count is away takes its share from).
    pub(crate) granted: u64,
    /// The replicas that shared the bucket, as the fleet's count last said (0: not asked yet).
    pub(crate) replicas: u32,
}

/// The fleet's answer to a [`Lease`]: `granted` (at most what was wanted) and what it has `left`
/// in the window after granting it (`0`: used up; the fleet's count never goes below 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) window: Window,
    pub(crate) granted: u64,
    pub(crate) left: u64,
}

/// What a reservation attempt found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reserve {
    /// Admitted: spend it through [`Ledger::charge`] and [`Ledger::settle`].
    Ok(Reservation),
    /// The lease here cannot cover it, and the fleet may have more: ask for this lease, hand the
    /// answer to [`Ledger::grant`] and try again.
    NeedLease(Lease),
    /// The fleet has granted the whole window and the lease here cannot cover it: over the
    /// limit until the window ends, in `retry_after_ms`.
    Over { retry_after_ms: u64 },
}

/// Capacity one request holds: what it reserved, and what it was charged beyond. Dropped without
/// [`Ledger::settle`], it stays spent (the safe side). Not `Clone`: it is settled once.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a reservation is settled with Ledger::settle (dropped, it stays spent)"]
pub(crate) struct Reservation {
    reserved: u64,
    /// Everything debited for it, in any window (reserved, then excess).
    debited: u64,
    /// What [`Ledger::charge`] counted so far.
    used: u64,
    /// The window of its latest debit, and how much it debited there (what may be given back).
    window: Window,
    in_window: u64,
}

impl Reservation {
    /// What [`Ledger::charge`] counted so far.
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// What the request reserved on admission (at most the limit).
    pub(crate) fn reserved(&self) -> u64 {
        self.reserved
    }

    /// The window it was last debited in (its admission's, unless a charge came later).
    pub(crate) fn window(&self) -> Window {
        self.window
    }
}

/// What [`Ledger::settle`] did: capacity `refunded` to this window's lease, and the request's
/// `excess` (usage beyond its reservation: its share of the overshoot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Settled {
    pub(crate) refunded: u64,
    pub(crate) excess: u64,
}

/// Leases are at least 1/8 of a replica's share of the limit: a busy replica renews about eight
/// times a window (one Redis round trip per lease, not per request), and at most one lease per
/// replica lies idle.
const LEASES_PER_WINDOW: u64 = 8;

impl Ledger {
    /// A ledger of `limit` per window of `period`, on a fleet of about `replicas` replicas.
    pub(crate) fn new(limit: u64, period: Period, replicas: u32) -> Ledger {
        let mut ledger = Ledger {
            limit,
            period,
            chunk: 1,
            window: Window { period, index: 0 },
            balance: 0,
            fleet_left: None,
            excess: 0,
            granted: 0,
            replicas: 0,
        };
        ledger.size_leases(replicas);
        ledger
    }

    /// Sizes leases for a fleet of `replicas` (as the liveness records count it; 0 counts as 1):
    /// `limit / (8 × replicas)`, at least 1.
    fn size_leases(&mut self, replicas: u32) {
        let share = self.limit / (LEASES_PER_WINDOW * u64::from(replicas.max(1)));
        self.chunk = share.max(1);
    }

    /// The fleet's count said `replicas` share the bucket: leases are sized for them, and a
    /// replica counting alone while the count is away takes `limit / replicas`.
    pub(crate) fn set_replicas(&mut self, replicas: u32) {
        self.size_leases(replicas);
        self.replicas = replicas.max(1);
    }

    /// The lease asking for `want` in the current window.
    fn lease(&self, want: u64) -> Lease {
        Lease {
            window: self.window,
            want,
            granted: self.granted,
            replicas: self.replicas,
        }
    }

    /// The limit per window.
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// The window's period.
    pub(crate) fn period(&self) -> Period {
        self.period
    }

    /// Reserves `amount` at `now_ms` (unix ms), from the lease in hand. An amount over the limit
    /// reserves the whole limit (a request may use less than it could; what it uses beyond is
    /// its excess): it is not refused for ever.
    pub(crate) fn try_reserve(&mut self, now_ms: u64, amount: u64) -> Reserve {
        self.roll(now_ms);
        let amount = amount.min(self.limit);
        if self.limit > 0 && self.balance >= i128::from(amount) {
            self.balance -= i128::from(amount);
            return Reserve::Ok(Reservation {
                reserved: amount,
                debited: amount,
                used: 0,
                window: self.window,
                in_window: amount,
            });
        }
        if self.limit == 0 || self.fleet_left == Some(0) {
            return Reserve::Over {
                retry_after_ms: self.window.ms_left(now_ms).max(1),
            };
        }
        let shortfall = u64::try_from(i128::from(amount) - self.balance).unwrap_or(u64::MAX);
        Reserve::NeedLease(self.lease(shortfall.max(self.chunk).min(self.limit)))
    }

    /// A lease arrived. One of a window that has passed is worth nothing.
    pub(crate) fn grant(&mut self, now_ms: u64, grant: Grant) {
        self.roll(now_ms);
        if grant.window > self.window {
            self.reset(grant.window);
        }
        if grant.window == self.window {
            self.balance += i128::from(grant.granted);
            self.granted = self.granted.saturating_add(grant.granted);
            self.fleet_left = Some(grant.left);
        }
    }

    /// Charges a stream's usage as it flows (`amount` more counted): what goes beyond its
    /// reservation is debited at once, as excess, so that later requests see it.
    pub(crate) fn charge(&mut self, now_ms: u64, reservation: &mut Reservation, amount: u64) {
        reservation.used = reservation.used.saturating_add(amount);
        if reservation.used > reservation.debited {
            let more = reservation.used - reservation.debited;
            self.debit(now_ms, reservation, more);
        }
    }

    /// Settles a request with its `actual` usage (the provider's report, which wins over what
    /// was charged): more than was debited is debited as excess; less gives the difference back
    /// to the lease, while the window of the last debit lasts (a window that has passed keeps it).
    pub(crate) fn settle(&mut self, now_ms: u64, mut reservation: Reservation, actual: u64) -> Settled {
        self.roll(now_ms);
        let mut refunded = 0;
        if actual > reservation.debited {
            let more = actual - reservation.debited;
            self.debit(now_ms, &mut reservation, more);
        } else if reservation.window == self.window {
            refunded = (reservation.debited - actual).min(reservation.in_window);
            self.balance += i128::from(refunded);
        }
        Settled {
            refunded,
            excess: actual.saturating_sub(reservation.reserved),
        }
    }

    /// What is left of the limit in `now_ms`'s window, for the `RateLimit` field: the lease in
    /// hand and what the fleet had left at the last grant (other replicas' unspent leases count as
    /// spent: the field errs on the tight side). A window not yet drawn on has the whole limit.
    pub(crate) fn remaining(&self, now_ms: u64) -> u64 {
        if self.period.window(now_ms) > self.window {
            return self.limit;
        }
        let here = u64::try_from(self.balance.max(0)).unwrap_or(u64::MAX);
        let fleet = self.fleet_left.unwrap_or(self.limit);
        here.saturating_add(fleet).min(self.limit)
    }

    /// The lease to ask for in the background, if the lease in hand is at or below its low-water
    /// mark (half a chunk) and the fleet has more: call it after an admission, and keep one renewal
    /// in flight at a time.
    pub(crate) fn renewal(&self, now_ms: u64) -> Option<Lease> {
        let stale = self.period.window(now_ms) > self.window;
        let low = self.balance <= i128::from(self.chunk / 2);
        (!stale && low && self.limit > 0 && self.fleet_left != Some(0)).then(|| self.lease(self.chunk.min(self.limit)))
    }

    /// Hands the unspent lease back (a replica shutting down, or a bucket gone idle): the amount
    /// to return to the fleet's count with [`Pool::give_back`], for its window. `None` when
    /// there is none.
    pub(crate) fn give_back(&mut self, now_ms: u64) -> Option<(Window, u64)> {
        self.roll(now_ms);
        let spare = u64::try_from(self.balance).ok().filter(|&n| n > 0)?;
        self.balance = 0;
        Some((self.window, spare))
    }

    /// The excess charged on this replica in `now_ms`'s window: its part of the overshoot.
    pub(crate) fn overshoot(&self, now_ms: u64) -> u64 {
        if self.period.window(now_ms) > self.window {
            0
        } else {
            self.excess
        }
    }

    /// Debits excess for a reservation in the current window.
    fn debit(&mut self, now_ms: u64, reservation: &mut Reservation, amount: u64) {
        self.roll(now_ms);
        if reservation.window != self.window {
            reservation.window = self.window;
            reservation.in_window = 0;
        }
        self.balance -= i128::from(amount);
        self.excess = self.excess.saturating_add(amount);
        reservation.debited = reservation.debited.saturating_add(amount);
        reservation.in_window = reservation.in_window.saturating_add(amount);
    }

    /// Moves to `now_ms`'s window when it is a later one (a clock read that went back keeps the
    /// current window).
    fn roll(&mut self, now_ms: u64) {
        let window = self.period.window(now_ms);
        if window > self.window {
            self.reset(window);
        }
    }

    fn reset(&mut self, window: Window) {
        self.window = window;
        self.balance = 0;
        self.fleet_left = None;
        self.excess = 0;
        self.granted = 0;
    }
}

/// The fleet's count of one bucket in its current window: the contract of the Redis script (and
/// the whole of it without Redis). It never grants past the limit in a window.
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    limit: u64,
    window: Option<Window>,
    granted: u64,
}

impl Pool {
    /// A count of `limit` per window.
    pub(crate) fn new(limit: u64) -> Pool {
        Pool {
            limit,
            window: None,
            granted: 0,
        }
    }

    /// Grants what it can of a lease: at most what is left in the lease's window. A lease of a
    /// window before the current one gets nothing.
    pub(crate) fn lease(&mut self, lease: Lease) -> Grant {
        if self.window.is_none_or(|w| lease.window > w) {
            self.window = Some(lease.window);
            self.granted = 0;
        }
        let current = self.window == Some(lease.window);
        let left = if current { self.limit - self.granted } else { 0 };
        let granted = lease.want.min(left);
        self.granted += granted;
        Grant {
            window: lease.window,
            granted,
            left: left - granted,
        }
    }

    /// Takes back a replica's unspent lease ([`Ledger::give_back`]) while its window lasts.
    pub(crate) fn give_back(&mut self, window: Window, amount: u64) {
        if self.window == Some(window) {
            self.granted = self.granted.saturating_sub(amount);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_764_000_000_000; // a whole minute of Unix time

    fn lease(ledger: &mut Ledger, pool: &mut Pool, now: u64, amount: u64) -> Reserve {
        match ledger.try_reserve(now, amount) {
            Reserve::NeedLease(l) => {
                ledger.grant(now, pool.lease(l));
                ledger.try_reserve(now, amount)
            }
            other => other,
        }
    }

    fn ok(r: Reserve) -> Reservation {
        match r {
            Reserve::Ok(r) => r,
            other => panic!("not admitted: {other:?}"),
        }
    }

    #[test]
    fn a_replica_spends_its_lease_and_asks_for_chunks() {
        let (mut l, mut pool) = (Ledger::new(80, Period::Minute, 1), Pool::new(80));
        // Nothing in hand: a chunk of limit / 8, or the shortfall when it is larger.
        let want = |r| match r {
            Reserve::NeedLease(l) => l.want,
            other => panic!("{other:?}"),
        };
        assert_eq!(want(l.try_reserve(T0, 1)), 10);
        assert_eq!(want(l.try_reserve(T0, 25)), 25);
        assert_eq!(want(l.try_reserve(T0, 500)), 80, "capped by the limit");
        let a = ok(lease(&mut l, &mut pool, T0, 4));
        assert_eq!((a.reserved(), l.remaining(T0)), (4, 76));
        // The rest of the chunk admits without asking.
        for _ in 0..6 {
            let _ = ok(l.try_reserve(T0 + 1, 1));
        }
        assert!(matches!(l.try_reserve(T0 + 2, 1), Reserve::NeedLease(_)));
        assert_eq!(l.limit(), 80);
        assert_eq!(l.period(), Period::Minute);
    }

    #[test]
    fn over_only_when_the_fleet_has_granted_the_whole_window() {
        let mut pool = Pool::new(10);
        let (mut a, mut b) = (Ledger::new(10, Period::Minute, 2), Ledger::new(10, Period::Minute, 2));
        let _x = ok(lease(&mut a, &mut pool, T0, 6));
        let _y = ok(lease(&mut b, &mut pool, T0, 4));
        // b's grant left the fleet at 0: b is over until the minute ends.
        assert_eq!(b.try_reserve(T0 + 15_000, 1), Reserve::Over { retry_after_ms: 45_000 });
        // a has heard nothing yet: it asks, and learns.
        assert!(matches!(lease(&mut a, &mut pool, T0, 1), Reserve::Over { .. }));
        // The next minute is a new window: old leases are worth nothing there.
        assert!(matches!(a.try_reserve(T0 + 60_000, 1), Reserve::NeedLease(_)));
        let _z = ok(lease(&mut b, &mut pool, T0 + 60_000, 10));
    }

    #[test]
    fn a_zero_limit_admits_nothing() {
        let mut l = Ledger::new(0, Period::Day, 3);
        assert!(matches!(l.try_reserve(T0, 0), Reserve::Over { .. }));
        assert_eq!(l.renewal(T0), None);
    }

    #[test]
    fn settling_gives_back_what_was_not_used_while_the_window_lasts() {
        let (mut l, mut pool) = (Ledger::new(100, Period::Minute, 1), Pool::new(100));
        let r = ok(lease(&mut l, &mut pool, T0, 100));
        assert!(matches!(l.try_reserve(T0, 1), Reserve::Over { .. }));
        let s = l.settle(T0 + 10, r, 30);
        assert_eq!(
            s,
            Settled {
                refunded: 70,
                excess: 0
            }
        );
        assert_eq!(l.remaining(T0 + 10), 70);
        let _ = ok(l.try_reserve(T0 + 20, 70));
        // Settled in a later window: nothing comes back (the window it was spent in is over).
        let r = ok(lease(&mut l, &mut pool, T0 + 60_000, 50));
        let s = l.settle(T0 + 120_000, r, 10);
        assert_eq!(s, Settled { refunded: 0, excess: 0 });
        assert_eq!(l.remaining(T0 + 120_000), 100);
    }

    #[test]
    fn a_stream_is_charged_beyond_its_reservation_as_it_flows() {
        let (mut l, mut pool) = (Ledger::new(100, Period::Minute, 1), Pool::new(100));
        let mut r = ok(lease(&mut l, &mut pool, T0, 50));
        let _other = ok(lease(&mut l, &mut pool, T0, 50));
        l.charge(T0 + 1, &mut r, 40);
        assert_eq!(l.overshoot(T0 + 1), 0);
        l.charge(T0 + 2, &mut r, 30); // 20 beyond its 50
        assert_eq!(l.overshoot(T0 + 2), 20);
        assert_eq!(l.remaining(T0 + 2), 0);
        // The provider's usage wins: 60 in all gives back the 10 charged too many.
        let s = l.settle(T0 + 3, r, 60);
        assert_eq!(
            s,
            Settled {
                refunded: 10,
                excess: 10
            }
        );
        assert!(matches!(l.try_reserve(T0 + 4, 1), Reserve::Over { .. }));
        // Usage reported beyond every charge is debited at settlement.
        let (mut l, mut pool) = (Ledger::new(100, Period::Minute, 1), Pool::new(100));
        let r = ok(lease(&mut l, &mut pool, T0, 10));
        assert_eq!(l.settle(T0, r, 25).excess, 15);
        assert_eq!(l.overshoot(T0), 15);
        assert_eq!(l.overshoot(T0 + 60_000), 0);
    }

    #[test]
    fn excess_charged_in_a_later_window_is_that_window_s_and_only_it_comes_back() {
        let (mut l, mut pool) = (Ledger::new(100, Period::Minute, 1), Pool::new(100));
        let mut r = ok(lease(&mut l, &mut pool, T0, 20));
        l.charge(T0 + 60_000, &mut r, 30); // 10 beyond, in the next minute
        assert_eq!(r.window(), Period::Minute.window(T0 + 60_000));
        assert_eq!(l.overshoot(T0 + 60_000), 10);
        let s = l.settle(T0 + 60_001, r, 5);
        assert_eq!(
            s,
            Settled {
                refunded: 10,
                excess: 0
            }
        );
    }

    #[test]
    fn a_lease_of_a_passed_window_is_worth_nothing() {
        let (mut l, mut pool) = (Ledger::new(100, Period::Minute, 1), Pool::new(100));
        let Reserve::NeedLease(old) = l.try_reserve(T0, 5) else {
            panic!("no lease asked")
        };
        let late = pool.lease(old);
        assert_eq!(late.granted, 12);
        l.grant(T0 + 60_000, late);
        assert_eq!(l.remaining(T0 + 60_000), 100);
        assert!(matches!(l.try_reserve(T0 + 60_000, 5), Reserve::NeedLease(_)));
        // The fleet's count gives nothing for a window before its current one.
        let new = pool.lease(Lease {
            window: Period::Minute.window(T0 + 60_000),
            want: 5,
            granted: 0,
            replicas: 0,
        });
        assert_eq!(new.granted, 5);
        assert_eq!(pool.lease(old).granted, 0);
    }

    #[test]
    fn a_renewal_is_due_at_the_low_water_mark_and_not_past_the_fleet() {
        let (mut l, mut pool) = (Ledger::new(160, Period::Minute, 2), Pool::new(160));
        assert_eq!(l.renewal(T0), None, "the first request asks");
        let _a = ok(lease(&mut l, &mut pool, T0, 1)); // 9 left of a chunk of 160 / (8 x 2)
        assert_eq!(l.renewal(T0), None);
        for _ in 0..4 {
            let _ = ok(l.try_reserve(T0, 1));
        }
        let renewal = l.renewal(T0).unwrap();
        assert_eq!(renewal.want, 10);
        l.grant(T0, pool.lease(renewal));
        assert_eq!(l.remaining(T0), 160 - 5);
        l.set_replicas(0);
        assert_eq!(l.renewal(T0), None);
        // A fleet that is used up is not asked again.
        let mut pool = Pool::new(3);
        let mut l = Ledger::new(3, Period::Minute, 1);
        let _b = ok(lease(&mut l, &mut pool, T0, 3));
        assert_eq!(l.renewal(T0), None);
        // Nor is one of a window that has passed.
        assert_eq!(l.renewal(T0 + 60_000), None);
    }

    #[test]
    fn an_unspent_lease_goes_back_to_the_fleet() {
        let mut pool = Pool::new(20);
        let (mut a, mut b) = (Ledger::new(20, Period::Minute, 1), Ledger::new(20, Period::Minute, 1));
        let x = ok(lease(&mut a, &mut pool, T0, 15));
        assert_eq!(a.settle(T0, x, 10).refunded, 5);
        let (window, spare) = a.give_back(T0).unwrap();
        assert_eq!(spare, 5);
        assert_eq!(a.give_back(T0), None);
        pool.give_back(window, spare);
        let _y = ok(lease(&mut b, &mut pool, T0, 10));
    }
}
