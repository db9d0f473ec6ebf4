//! A retry budget: retries may add at most a fixed fraction to a route's traffic, plus a small
//! floor, over a sliding window.
//!
//! This is the Finagle / Linkerd / tower `TpsBudget` model (tower `retry::budget::TpsBudget`,
//! Linkerd `retryBudget {retryRatio: 0.2, minRetriesPerSecond: 10, ttl: 10s}`): a per-request
//! attempt limit alone cannot stop retry storms, because when an upstream fails for everyone,
//! every request retries and the load on the struggling upstream multiplies by `max_attempts`.
//! A budget caps that amplification at `1 + ratio` in steady state, while the floor keeps
//! retries available to routes with little traffic.
//!
//! The window is a ring of [`SLOTS`] buckets of `window / SLOTS` each, so old traffic falls out in
//! steps of one bucket and the effective window is between 9/10 and 10/10 of `window`, as in
//! tower. Counters sit behind a `parking_lot::Mutex`: the critical section is a handful of
//! additions, never held across an `.await` (there is none here), and an uncontended futex costs
//! tens of nanoseconds, which is simpler to get right than a lock-free rotating ring.

use parking_lot::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Number of buckets the window is divided into.
pub(crate) const SLOTS: usize = 10;

#[cfg(test)]
/// The window used when a route does not say otherwise (Linkerd's `ttl` default).
pub(crate) const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

/// The shortest window accepted: 1 ms, so that a bucket is at least 100 µs.
pub(crate) const MIN_WINDOW: Duration = Duration::from_millis(1);

/// Largest accepted `ratio` (tower's bound: retries may add up to 1000 times the traffic).
pub(crate) const MAX_RATIO: f64 = 1000.0;

/// Why a [`RetryBudget`] could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum InvalidBudget {
    /// `ratio` is negative, NaN, infinite or above [`MAX_RATIO`].
    #[error("budget_ratio must be a number between 0 and {MAX_RATIO}, got {0}")]
    Ratio(f64),
    /// The window is shorter than [`MIN_WINDOW`].
    #[error("retry budget window must be at least 1ms, got {0:?}")]
    Window(Duration),
}

#[cfg(test)]
/// The counts a budget holds for its current window, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BudgetSnapshot {
    /// Original requests deposited in the window.
    pub requests: u64,
    /// Retries withdrawn (granted or recorded as external) in the window.
    pub retries: u64,
    /// Retries the window allows in all: `min_per_second * window_secs + ratio * requests`.
    pub allowed: f64,
}

#[cfg(test)]
impl BudgetSnapshot {
    #[cfg(test)]
    /// Retries that would still be granted now (whole retries, zero when spent).
    pub(crate) fn remaining(&self) -> u64 {
        let left = (self.allowed - self.retries as f64).floor();
        if left > 0.0 {
            left as u64
        } else {
            0
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    requests: u64,
    retries: u64,
}

#[derive(Debug)]
struct State {
    /// The instant bucket 0 starts at: the first time the budget was used.
    origin: Option<Instant>,
    /// The absolute index (since `origin`) of the newest bucket.
    newest: u64,
    slots: [Slot; SLOTS],
}

/// A per-route retry budget (Linkerd/tower `TpsBudget` semantics); `Sync`, shared by reference
/// or `Arc` between all the tasks serving the route.
///
/// Contract:
/// - call [`deposit`](RetryBudget::deposit) once per original request (first attempt);
/// - call [`withdraw`](RetryBudget::withdraw) before every retry attempt, and retry only when it
///   returns true;
/// - for a request that is itself a client's retry (`x-stainless-retry-count` > 0), call
///   [`record_external_retry`](RetryBudget::record_external_retry) *instead of* `deposit`.
///
/// Within the window, `withdraw` succeeds while the retry fits in the allowance:
/// `retries + 1 <= min_per_second * window_secs + ratio * requests` (for whole allowances, the
/// same as `retries < allowed`; a fraction of a retry is never granted early).
///
/// Times come from the caller (`tokio::time::Instant`, the project's one clock). They need not
/// be strictly ordered across tasks: a time older than the newest bucket counts in the newest.
#[derive(Debug)]
pub(crate) struct RetryBudget {
    ratio: f64,
    slot_nanos: u128,
    reserve: f64,
    state: Mutex<State>,
}

impl RetryBudget {
    /// Builds a budget: `ratio` (e.g. 0.2: retries add at most 20% to the traffic),
    /// `min_per_second` (retries always allowed per second of window, whatever the traffic) and
    /// the sliding `window` (normally [`DEFAULT_WINDOW`]).
    ///
    /// Rejects a `ratio` outside `0..=MAX_RATIO` (or NaN) and a window below [`MIN_WINDOW`].
    pub(crate) fn try_new(ratio: f64, min_per_second: u32, window: Duration) -> Result<RetryBudget, InvalidBudget> {
        if !(0.0..=MAX_RATIO).contains(&ratio) {
            return Err(InvalidBudget::Ratio(ratio));
        }
        if window < MIN_WINDOW {
            return Err(InvalidBudget::Window(window));
        }
        Ok(RetryBudget {
            ratio,
            slot_nanos: window.as_nanos() / SLOTS as u128,
            reserve: f64::from(min_per_second) * window.as_secs_f64(),
            state: Mutex::new(State {
                origin: None,
                newest: 0,
                slots: [Slot::default(); SLOTS],
            }),
        })
    }

    /// Records one original request at `now`: it earns `ratio` retries for the window.
    pub(crate) fn deposit(&self, now: Instant) {
        let mut state = self.state.lock();
        let slot = self.advance(&mut state, now);
        let slot = &mut state.slots[slot];
        slot.requests = slot.requests.saturating_add(1);
    }

    /// Asks for one retry at `now`: true (and the retry is counted) when the window's retries
    /// are below what it allows; false, counting nothing, when the budget is spent.
    pub(crate) fn withdraw(&self, now: Instant) -> bool {
        let mut state = self.state.lock();
        let slot = self.advance(&mut state, now);
        let (requests, retries) = totals(&state);
        // The retry must fit: `retries + 1 <= allowed`. For whole numbers this is
        // `retries < allowed`; with a fractional allowance (ratio 0.2 and one request: 0.2) it
        // refuses a retry that is not fully earned, as tower's token accounting does.
        if (retries as f64) + 1.0 <= self.allowed(requests) {
            let slot = &mut state.slots[slot];
            slot.retries = slot.retries.saturating_add(1);
            true
        } else {
            false
        }
    }

    /// Counts a retry that a client made on its own (a request arriving with
    /// `x-stainless-retry-count` > 0) as a withdrawal, without checking the budget: the request
    /// is already here, but it is retry traffic and must not earn retries of its own. Call it
    /// instead of [`deposit`](RetryBudget::deposit) for such a request.
    pub(crate) fn record_external_retry(&self, now: Instant) {
        let mut state = self.state.lock();
        let slot = self.advance(&mut state, now);
        let slot = &mut state.slots[slot];
        slot.retries = slot.retries.saturating_add(1);
    }

    #[cfg(test)]
    /// The window's counts as of `now` (advancing the window like the other calls).
    pub(crate) fn snapshot(&self, now: Instant) -> BudgetSnapshot {
        let mut state = self.state.lock();
        self.advance(&mut state, now);
        let (requests, retries) = totals(&state);
        BudgetSnapshot {
            requests,
            retries,
            allowed: self.allowed(requests),
        }
    }

    fn allowed(&self, requests: u64) -> f64 {
        self.reserve + self.ratio * requests as f64
    }

    /// Moves the ring forward to `now`, clearing the buckets that fell out of the window, and
    /// returns the ring index of the bucket `now` counts in.
    fn advance(&self, state: &mut State, now: Instant) -> usize {
        let origin = *state.origin.get_or_insert(now);
        let elapsed = now.saturating_duration_since(origin).as_nanos();
        let index = u64::try_from(elapsed / self.slot_nanos).unwrap_or(u64::MAX);
        if index > state.newest {
            let expired = (index - state.newest).min(SLOTS as u64);
            for k in 1..=expired {
                state.slots[ring(state.newest.wrapping_add(k))] = Slot::default();
            }
            state.newest = index;
        }
        ring(state.newest)
    }
}

fn ring(index: u64) -> usize {
    (index % SLOTS as u64) as usize
}

fn totals(state: &State) -> (u64, u64) {
    state.slots.iter().fold((0u64, 0u64), |(req, ret), s| {
        (req.saturating_add(s.requests), ret.saturating_add(s.retries))
    })
}

#[cfg(test)]
mod tests {

    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const SEC: Duration = Duration::from_secs(1);

    fn budget(ratio: f64, min_per_second: u32) -> RetryBudget {
        RetryBudget::try_new(ratio, min_per_second, DEFAULT_WINDOW).unwrap()
    }

    fn drain(b: &RetryBudget, now: Instant) -> u64 {
        let mut granted = 0;
        while b.withdraw(now) {
            granted += 1;
            assert!(granted < 10_000_000, "budget never ran out");
        }
        granted
    }

    #[test]
    fn is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<RetryBudget>();
    }

    #[test]
    fn rejects_bad_parameters() {
        for ratio in [-0.1, f64::NAN, f64::INFINITY, 1000.5] {
            assert!(matches!(
                RetryBudget::try_new(ratio, 10, DEFAULT_WINDOW),
                Err(InvalidBudget::Ratio(_))
            ));
        }
        assert_eq!(
            RetryBudget::try_new(0.2, 10, Duration::from_micros(999)).unwrap_err(),
            InvalidBudget::Window(Duration::from_micros(999))
        );
        assert!(RetryBudget::try_new(0.0, 0, MIN_WINDOW).is_ok());
        assert!(RetryBudget::try_new(MAX_RATIO, u32::MAX, Duration::MAX).is_ok());
        let msg = RetryBudget::try_new(-1.0, 10, DEFAULT_WINDOW).unwrap_err().to_string();
        assert!(msg.contains("budget_ratio"), "{msg}");
    }

    #[test]
    fn floor_holds_with_zero_traffic() {
        let b = budget(0.2, 10);
        let t0 = crate::time::now();
        // 10 per second over a 10 s window: 100 retries with no requests at all.
        assert_eq!(drain(&b, t0), 100);
        assert!(!b.withdraw(t0 + SEC * 5));
        let snap = b.snapshot(t0 + SEC * 5);
        assert_eq!((snap.requests, snap.retries, snap.remaining()), (0, 100, 0));
    }

    #[test]
    fn zero_floor_and_zero_ratio_allow_nothing() {
        let b = budget(0.0, 0);
        let t0 = crate::time::now();
        for _ in 0..1000 {
            b.deposit(t0);
        }
        assert!(!b.withdraw(t0));
    }

    #[test]
    fn ratio_without_floor() {
        let b = budget(0.2, 0);
        let t0 = crate::time::now();
        assert!(!b.withdraw(t0));
        for _ in 0..100 {
            b.deposit(t0);
        }
        assert_eq!(drain(&b, t0), 20);
        // Each 5 further requests earn one more retry.
        for _ in 0..4 {
            b.deposit(t0);
        }
        assert!(!b.withdraw(t0));
        b.deposit(t0);
        assert!(b.withdraw(t0));
        assert!(!b.withdraw(t0));
    }

    #[test]
    fn floor_and_ratio_add_up() {
        let b = budget(0.5, 3);
        let t0 = crate::time::now();
        for _ in 0..10 {
            b.deposit(t0);
        }
        // 3/s * 10 s + 0.5 * 10.
        assert_eq!(b.snapshot(t0).remaining(), 35);
        assert_eq!(drain(&b, t0), 35);
    }

    #[test]
    fn window_expiry_restores_the_budget() {
        let b = budget(0.2, 10);
        let t0 = crate::time::now();
        for _ in 0..1000 {
            b.deposit(t0);
        }
        assert_eq!(drain(&b, t0), 300);
        // Still inside the window (the bucket of t0 is the oldest of the ring until t0 + 10 s).
        assert!(!b.withdraw(t0 + SEC * 9 + MS * 999));
        // One full window later everything has expired: back to the floor.
        let later = t0 + DEFAULT_WINDOW;
        let snap = b.snapshot(later);
        assert_eq!((snap.requests, snap.retries), (0, 0));
        assert_eq!(drain(&b, later), 100);
    }

    #[test]
    fn buckets_expire_one_at_a_time() {
        let b = budget(1.0, 0);
        let t0 = crate::time::now();
        // One request per second for 10 s, each second in its own bucket.
        for s in 0..10 {
            b.deposit(t0 + SEC * s);
        }
        assert_eq!(b.snapshot(t0 + SEC * 9).requests, 10);
        assert_eq!(b.snapshot(t0 + SEC * 10).requests, 9);
        assert_eq!(b.snapshot(t0 + SEC * 15).requests, 4);
        assert_eq!(b.snapshot(t0 + SEC * 19).requests, 0);
    }

    #[test]
    fn external_retries_spend_the_budget_unchecked() {
        let b = budget(0.2, 1);
        let t0 = crate::time::now();
        for _ in 0..50 {
            b.deposit(t0);
        }
        // 10 + 10 allowed; clients already retried 25 times on their own.
        for _ in 0..25 {
            b.record_external_retry(t0);
        }
        assert!(!b.withdraw(t0));
        let snap = b.snapshot(t0);
        assert_eq!((snap.requests, snap.retries, snap.remaining()), (50, 25, 0));
        // They expire with the window like any other retry.
        assert_eq!(drain(&b, t0 + DEFAULT_WINDOW), 10);
    }

    #[test]
    fn out_of_order_times_count_in_the_newest_bucket() {
        let b = budget(0.0, 1);
        let t0 = crate::time::now();
        b.snapshot(t0);
        b.snapshot(t0 + SEC * 5);
        // A task that read the clock before t0 + 5 s but got the lock later.
        for _ in 0..10 {
            assert!(b.withdraw(t0 + SEC));
        }
        assert!(!b.withdraw(t0));
        // Those retries live in the t0 + 5 s bucket, so they expire 10 s after it.
        assert!(!b.withdraw(t0 + SEC * 14 + MS * 999));
        assert!(b.withdraw(t0 + SEC * 15));
    }

    #[test]
    fn huge_time_jumps_do_not_overflow() {
        let b = budget(0.2, 10);
        let t0 = crate::time::now();
        b.deposit(t0);
        let far = t0 + Duration::from_secs(60 * 60 * 24 * 365 * 100);
        assert_eq!(drain(&b, far), 100);
        b.deposit(far + MS);
        assert_eq!(b.snapshot(far + MS).requests, 1);
        // A minimal window with a huge jump.
        let tiny = RetryBudget::try_new(0.2, 1000, MIN_WINDOW).unwrap();
        tiny.deposit(t0);
        assert_eq!(drain(&tiny, far), 1);
    }

    /// 1000 requests/s for 30 s, every attempt failing, up to 2 retries each (max_attempts 3):
    /// what the budget grants stays within ratio * requests + floor.
    #[test]
    fn ratio_holds_under_sustained_failure() {
        let b = budget(0.2, 10);
        let t0 = crate::time::now();
        let mut granted_per_second = [0u64; 30];
        let mut denied = 0u64;
        for ms in 0..30_000u64 {
            let now = t0 + MS * ms as u32;
            b.deposit(now);
            for _retry in 0..2 {
                if b.withdraw(now) {
                    granted_per_second[(ms / 1000) as usize] += 1;
                } else {
                    denied += 1;
                }
            }
        }
        let total: u64 = granted_per_second.iter().sum();
        let requests = 30_000f64;
        // Overall: at most 20% of the requests, plus the floor for each second of the run and
        // for the first window.
        assert!(
            (total as f64) <= 0.2 * requests + 10.0 * (30.0 + 10.0),
            "granted {total}"
        );
        // And the budget is not stingier than promised: the 20% is granted.
        assert!((total as f64) >= 0.2 * requests, "granted {total}");
        assert_eq!(total + denied, 60_000);
        // In every 10 s stretch, at most 20% of its 10 000 requests plus the 100 floor, plus one
        // bucket's worth of slack because the window slides in 1 s steps.
        for start in 0..=20 {
            let in_window: u64 = granted_per_second[start..start + 10].iter().sum();
            assert!(in_window <= 2_000 + 100 + 200, "window from {start}s: {in_window}");
        }
        // Every second gets its 20% (200) and none more than 20% plus the whole window's floor
        // (100). The floor is not spread at 10 per second: it is spent as a burst whenever the
        // bucket that spent it expires (seconds 0, 10, 20: 300 each), an echo inherent to a
        // bucketed sliding window, harmless because each window stays within its allowance.
        for (second, granted) in granted_per_second.iter().enumerate() {
            assert!((200..=300).contains(granted), "second {second}: {granted}");
        }
    }

    #[test]
    fn concurrent_callers_get_exactly_the_budget() {
        let b = budget(0.2, 10);
        let t0 = crate::time::now();
        let granted: u64 = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        for _ in 0..1000 {
                            b.deposit(t0);
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            let handles: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| (0..1000).filter(|_| b.withdraw(t0)).count() as u64))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        // 100 floor + 20% of 4000.
        assert_eq!(granted, 900);
    }
}
