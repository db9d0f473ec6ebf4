//! An adaptive concurrency limit (`concurrency = "adaptive"`): additive increase, multiplicative
//! decrease, on the provider's own answers. docs/concurrency.md states the algorithm, its
//! constants and why; this is that text as code.
//!
//! - **Shrinks** by [`DECREASE`] on an overload signal ([`Signal`]): a 429 with no reset or a
//!   short one, a 503 or 529 (or their in-band forms: `overloaded_error`), no first byte within
//!   `first_byte_timeout`, or a time to first byte well above its recent floor. At most once per
//!   round: a signal from a request sent before the last decrease is the same overload seen late
//!   (every request in flight when capacity fell reports it), not a new one.
//! - **Grows** while requests at the limit succeed: each success adds `step / limit`, so a whole
//!   limit's worth of them (one round) adds `step`. Below the limit the last decrease came from
//!   (the **ceiling**: where the provider pushed back) `step` is 1, the classic additive increase
//!   that keeps the sawtooth near the capacity small; one round past the ceiling without a signal
//!   says the capacity grew, and from then `step` doubles after each clean round (at most half the
//!   limit; past a ceiling with the provider queueing nothing it starts at a quarter of the
//!   limit), so a limit far below a capacity
//!   that came back finds it in a few rounds (as CUBIC probes slowly near its last maximum and fast
//!   beyond it).
//! - The **floor** of the time to first byte is the least smoothed value ([`ALPHA`]) seen over the
//!   last one to two [`FLOOR_WINDOW`]s: a time above [`SLOW_RATIO`] times it (and at least
//!   [`SLOW_MARGIN`] above it) is a provider queueing the request, not a long prompt: one long
//!   prompt moves the smoothed value by a fifth.
//! - A queue **building**: at the limit, [`QUEUE_RUN`] answers in a row whose time and smoothed
//!   time are above [`QUEUE_RATIO`] times the floor (and [`QUEUE_MARGIN`] above it) are the first
//!   sign that the limit has passed the capacity
//!   (each request past it waits for one to end at the provider): a gentle decrease
//!   ([`GENTLE_DECREASE`]) that drains that queue before the times double, so the probing above
//!   the capacity costs a few tens of milliseconds, not a second. Such an answer never grows the
//!   limit.
//!
//! Decides: the limit, and whether an answer is a signal. Does not decide: who is admitted under
//! the limit (`limiter::concurrency`), nor how the fleet shares it (the same steps run in the
//! fleet's script, `concurrency_v1.lua`). No clock reads: `now` is a parameter.

use std::time::Duration;

use crate::time::Instant;

/// A decrease multiplies the limit by this.
pub(crate) const DECREASE: f64 = 0.75;
/// How much of a new time to first byte the smoothed value takes.
pub(crate) const ALPHA: f64 = 0.2;
/// The floor is the least smoothed time over the current window and the one before.
pub(crate) const FLOOR_WINDOW: Duration = Duration::from_secs(30);
/// A time to first byte this many times its floor is a signal...
pub(crate) const SLOW_RATIO: f64 = 2.0;
/// ...when it is also this much above it.
pub(crate) const SLOW_MARGIN: Duration = Duration::from_millis(100);
/// At the limit, a smoothed time to first byte this many times its floor is a queue building...
pub(crate) const QUEUE_RATIO: f64 = 1.5;
/// ...when it is also this much above it...
pub(crate) const QUEUE_MARGIN: Duration = Duration::from_millis(50);
/// ...in this many answers in a row (one long prompt is one answer)...
pub(crate) const QUEUE_RUN: u32 = 3;
/// ...and the limit is multiplied by this (once per round, as any decrease).
pub(crate) const GENTLE_DECREASE: f64 = 0.9;
/// A smoothed time to first byte within this many times its floor: the provider queues nothing
/// (a limit past its ceiling then jumps; see [`Aimd::success`]).
pub(crate) const CLEAR_RATIO: f64 = 1.2;
/// A 429 whose reset is at most this is a provider out of capacity (a longer one is a quota's
/// window: the cooldown's business).
pub(crate) const SHORT_RESET: Duration = Duration::from_secs(2);

pub(crate) use crate::words::Signal;

/// What an answer changed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Adjusted {
    /// Lowered, on this signal, to the limit.
    Down(Signal, f64),
    /// Raised past a whole number, to the limit.
    Up(f64),
}

/// One scope's adaptive limit.
#[derive(Debug, Clone)]
pub(crate) struct Aimd {
    limit: f64,
    min: f64,
    max: f64,
    step: f64,
    /// The limit before the last decrease, until a round past it without a signal.
    ceiling: Option<f64>,
    /// Successes at the limit since `step` last changed.
    round: f64,
    /// The successes a round takes: the limit when it began.
    round_len: f64,
    last_decrease: Option<Instant>,
    floor: Floor,
    /// Answers in a row that said a queue is building.
    queueing: u32,
}

/// The least smoothed time to first byte over a window and the one before it.
#[derive(Debug, Clone, Default)]
struct Floor {
    smoothed: Option<f64>,
    /// The least of each window: (window start, least), the current last.
    windows: [Option<(Instant, f64)>; 2],
}

impl Floor {
    /// Takes a sample (seconds) at `now`; the floor before it, and the smoothed value after.
    fn sample(&mut self, secs: f64, now: Instant) -> (Option<f64>, f64) {
        let floor = self.least();
        let smoothed = match self.smoothed {
            Some(s) => s + ALPHA * (secs - s),
            None => secs,
        };
        self.smoothed = Some(smoothed);
        match self.windows[1] {
            Some((start, least)) if now.saturating_duration_since(start) < FLOOR_WINDOW => {
                self.windows[1] = Some((start, least.min(smoothed)));
            }
            Some(current) => self.windows = [Some(current), Some((now, smoothed))],
            None => self.windows[1] = Some((now, smoothed)),
        }
        // A window more than one window old no longer counts.
        if let (Some((old, _)), Some((cur, _))) = (self.windows[0], self.windows[1]) {
            if cur.saturating_duration_since(old) >= FLOOR_WINDOW * 2 {
                self.windows[0] = None;
            }
        }
        (floor, smoothed)
    }

    fn least(&self) -> Option<f64> {
        self.windows.iter().flatten().map(|(_, l)| *l).reduce(f64::min)
    }
}

/// A successful answer, as the limit sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Success {
    /// When its request was sent.
    pub(crate) sent: Instant,
    /// Its time to first byte (the response head, read ahead to its first event).
    pub(crate) first_byte: Duration,
    /// Whether the requests in flight when it was admitted were at least half the limit: one
    /// below that says nothing of whether the limit could be higher.
    pub(crate) at_limit: bool,
}

impl Aimd {
    /// A limit starting at `initial`, moving within `min..=max`.
    pub(crate) fn new(initial: u32, min: u32, max: u32) -> Aimd {
        let (min, max) = (f64::from(min.max(1)), f64::from(max.max(min.max(1))));
        Aimd {
            limit: f64::from(initial).clamp(min, max),
            min,
            max,
            step: 1.0,
            ceiling: None,
            round: 0.0,
            round_len: f64::from(initial).clamp(min, max),
            last_decrease: None,
            floor: Floor::default(),
            queueing: 0,
        }
    }

    /// The limit: the requests that may be in flight at once.
    pub(crate) fn limit(&self) -> u32 {
        self.limit.floor() as u32
    }

    /// The limit as a fraction (the fleet's script keeps it so).
    pub(crate) fn exact(&self) -> f64 {
        self.limit
    }

    /// The fleet set the limit to `limit` (its script adjusted it with every replica's signals);
    /// `lowered`: it lowered it since this replica last heard, at `now` as far as this replica
    /// knows: signals from requests sent before then are not new.
    pub(crate) fn set(&mut self, limit: f64, lowered: bool, now: Instant) {
        let before = self.limit;
        self.limit = limit.clamp(self.min, self.max);
        if lowered {
            self.ceiling = Some(before.max(self.limit));
            self.after_decrease(now);
        }
    }

    /// An overload signal from a request sent at `sent`, seen at `now`: the limit shrinks unless
    /// a decrease came after the request was sent.
    pub(crate) fn overload(&mut self, signal: Signal, sent: Instant, now: Instant) -> Option<Adjusted> {
        self.decrease(signal, DECREASE, sent, now)
    }

    fn decrease(&mut self, signal: Signal, factor: f64, sent: Instant, now: Instant) -> Option<Adjusted> {
        if self.last_decrease.is_some_and(|d| sent < d) {
            return None;
        }
        let before = self.limit;
        self.limit = (self.limit * factor).max(self.min);
        self.ceiling = Some(before);
        self.after_decrease(now);
        (self.limit < before).then_some(Adjusted::Down(signal, self.limit))
    }

    fn after_decrease(&mut self, now: Instant) {
        self.last_decrease = Some(now);
        self.step = 1.0;
        self.round = 0.0;
        self.round_len = self.limit;
    }

    /// A success seen at `now`: a signal if its first byte was slow against the floor, else
    /// growth when it ran at the limit.
    pub(crate) fn success(&mut self, s: Success, now: Instant) -> Option<Adjusted> {
        let secs = s.first_byte.as_secs_f64();
        let (floor, smoothed) = self.floor.sample(secs, now);
        if let Some(floor) = floor {
            let above = |t: f64, ratio: f64, margin: Duration| t > floor * ratio && t > floor + margin.as_secs_f64();
            if above(secs, SLOW_RATIO, SLOW_MARGIN) && above(smoothed, SLOW_RATIO, SLOW_MARGIN) {
                return self.overload(Signal::SlowFirstByte, s.sent, now);
            }
            let building =
                s.at_limit && above(secs, QUEUE_RATIO, QUEUE_MARGIN) && above(smoothed, QUEUE_RATIO, QUEUE_MARGIN);
            self.queueing = if building { self.queueing + 1 } else { 0 };
            if self.queueing >= QUEUE_RUN {
                self.queueing = 0;
                return self.decrease(Signal::SlowFirstByte, GENTLE_DECREASE, s.sent, now);
            }
            if building {
                // Not a success that says the limit could be higher.
                return None;
            }
        }
        if !s.at_limit || self.limit >= self.max {
            return None;
        }
        let before = self.limit;
        self.limit = (self.limit + self.step / self.limit).min(self.max);
        self.round += 1.0;
        if self.round >= self.round_len.floor() {
            self.round = 0.0;
            self.round_len = self.limit;
            // The provider queues nothing at all: room to find fast.
            let clear = floor.is_none_or(|f| smoothed <= f * CLEAR_RATIO);
            match self.ceiling {
                // Below where the provider pushed back: probe by one.
                Some(c) if self.limit < c => {}
                // A whole round past it, no signal: the capacity grew. If the provider queues
                // nothing (a brownout ended), find it fast: a quarter of the limit a round at
                // once, then doubling; else from 1, doubling.
                Some(_) => {
                    self.ceiling = None;
                    if clear {
                        self.step = (self.limit / 4.0).max(self.step);
                    }
                }
                // Doubling while the provider queues nothing; back to one a round once it
                // starts to (the capacity is near: probe it slowly, as below a ceiling).
                None if clear => self.step = (self.step * 2.0).min((self.limit / 2.0).max(1.0)),
                None => self.step = 1.0,
            }
        }
        (self.limit.floor() > before.floor()).then_some(Adjusted::Up(self.limit))
    }

    /// The growth a success adds now (for the fleet's script, which adds every replica's).
    pub(crate) fn growth_since(&self, before: f64) -> f64 {
        (self.limit - before).max(0.0)
    }
}

/// Whether a request that would be `position`th (from 1) in a scope's queue can expect a place in
/// time: places free at `allowance` per `hold` (how long a place is held, smoothed; `None`: not
/// known yet, so it waits), and once it has one it still needs about `hold` to be served. It waits
/// when its expected place comes within `wait_left` (what the queue may take) and leaves `hold`
/// before its deadline (`deadline_left`); else a 429 at once is better than a wait that ends in
/// one, or in an attempt cut short by the deadline (under sustained overload, a first-in first-out
/// queue where every request waits to its deadline serves nobody in time).
pub(crate) fn may_wait(position: u32, allowance: u32, hold: Option<Duration>, left: (Duration, Duration)) -> bool {
    let (wait_left, deadline_left) = left;
    let Some(hold) = hold else { return true };
    let expected = hold.mul_f64(f64::from(position) / f64::from(allowance.max(1)));
    expected < wait_left && expected + hold <= deadline_left
}

/// The overload signal an answer is, if any: `status` (or the status an in-band error stands
/// for), its reset if it gave one, whether it was a first-byte timeout.
pub(crate) fn signal_of(status: Option<u16>, reset: Option<Duration>, first_byte_timeout: bool) -> Option<Signal> {
    if first_byte_timeout {
        return Some(Signal::FirstByteTimeout);
    }
    match status? {
        429 if reset.is_none_or(|r| r <= SHORT_RESET) => Some(Signal::RateLimited),
        502..=504 => Some(Signal::Unavailable),
        529 => Some(Signal::Overloaded),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        crate::time::now() + Duration::from_millis(ms)
    }

    fn ok(sent: Instant, first_byte_ms: u64) -> Success {
        Success {
            sent,
            first_byte: Duration::from_millis(first_byte_ms),
            at_limit: true,
        }
    }

    #[test]
    fn a_signal_shrinks_it_once_per_round() {
        let mut a = Aimd::new(32, 1, 1000);
        let t0 = at(0);
        assert_eq!(
            a.overload(Signal::Overloaded, t0, at(10)),
            Some(Adjusted::Down(Signal::Overloaded, 24.0))
        );
        // Every request in flight when capacity fell says so: one decrease, not one each.
        assert_eq!(a.overload(Signal::Overloaded, t0, at(20)), None);
        assert_eq!(a.overload(Signal::RateLimited, at(5), at(30)), None);
        // A request sent after the decrease that is still refused: the next one.
        assert_eq!(
            a.overload(Signal::RateLimited, at(15), at(40)),
            Some(Adjusted::Down(Signal::RateLimited, 18.0))
        );
        assert_eq!(a.limit(), 18);
    }

    #[test]
    fn it_never_leaves_its_bounds() {
        let mut a = Aimd::new(4, 2, 6);
        for i in 0..20u64 {
            a.overload(Signal::Unavailable, at(i * 10 + 5), at(i * 10 + 6));
        }
        assert_eq!(a.limit(), 2);
        for i in 0..1000u64 {
            a.success(ok(at(i), 10), at(i));
        }
        assert_eq!(a.limit(), 6);
        assert_eq!(Aimd::new(50, 1, 10).limit(), 10);
    }

    #[test]
    fn growth_doubles_its_step_each_round_without_a_signal() {
        let mut a = Aimd::new(8, 1, 1000);
        let mut limits = Vec::new();
        let mut n = 0u64;
        // Five rounds of successes at the limit: each round is a limit's worth of them.
        for _ in 0..5 {
            let round = a.limit();
            for _ in 0..round {
                n += 1;
                a.success(ok(at(n), 10), at(n));
            }
            limits.push(a.limit());
        }
        // Each round adds twice what the one before added (at most half the limit): a limit of 8
        // finds a capacity of 24 that came back in five rounds; one at 1 per round would take 16.
        assert_eq!(limits, vec![8, 10, 13, 19, 27], "{limits:?}");
        // A decrease starts the step again at 1, and below the limit it came from (the ceiling,
        // 27) growth stays at one per round: the sawtooth near a capacity stays small.
        a.overload(Signal::Overloaded, at(n), at(n + 1));
        let mut n = n + 2;
        let mut rounds = Vec::new();
        for _ in 0..12 {
            let round = a.limit();
            for _ in 0..round {
                n += 1;
                a.success(ok(at(n), 10), at(n));
            }
            rounds.push(a.limit());
        }
        // 20 to 28 by one a round; a round past it says the capacity grew: a quarter of the limit
        // a round at once (+7), then doubling up to half the limit (+12, +19, +27).
        assert_eq!(
            rounds,
            vec![21, 22, 23, 24, 25, 26, 27, 28, 34, 46, 65, 92],
            "{rounds:?}"
        );
    }

    #[test]
    fn past_its_ceiling_it_jumps_only_when_the_provider_queues_nothing() {
        let climb = |first_byte_ms: u64| {
            let mut a = Aimd::new(20, 1, 1000);
            let mut n = 0u64;
            // A floor of 100 ms, then a decrease from 20 (the ceiling) to 15.
            for _ in 0..20 {
                n += 1;
                a.success(ok(at(n), 100), at(n));
            }
            a.overload(Signal::Overloaded, at(n), at(n + 1));
            n += 2;
            let mut limits = Vec::new();
            for _ in 0..8 {
                for _ in 0..a.limit() {
                    n += 1;
                    a.success(ok(at(n), first_byte_ms), at(n));
                }
                limits.push(a.limit());
            }
            limits
        };
        // At the floor: past 20 it jumps by a quarter of the limit.
        let clear = climb(100);
        // 1.3 times the floor (a queue of a few at the provider, under the gentle decrease's
        // threshold): past 20 it grows from +1, doubling.
        let queueing = climb(130);
        assert!(clear[7] > queueing[7] + 5, "{clear:?} {queueing:?}");
        assert_eq!(&clear[..5], &queueing[..5], "the same up to the ceiling");
    }

    #[test]
    fn the_step_stops_doubling_once_the_provider_queues() {
        let rounds = |first_byte_ms: u64| {
            let mut a = Aimd::new(20, 1, 1000);
            let mut n = 0u64;
            for _ in 0..20 {
                n += 1;
                a.success(ok(at(n), 100), at(n));
            }
            let mut limits = Vec::new();
            for _ in 0..5 {
                for _ in 0..a.limit() {
                    n += 1;
                    a.success(ok(at(n), first_byte_ms), at(n));
                }
                limits.push(a.limit());
            }
            limits
        };
        // At its floor the step doubles each round; 1.3 times it (a few queued at the provider,
        // under the gentle decrease) it stays at one a round.
        let clear = rounds(100);
        let queueing = rounds(130);
        assert_eq!(queueing, vec![22, 23, 24, 25, 26], "{queueing:?}");
        assert!(clear[4] > queueing[4] + 10, "{clear:?}");
    }

    #[test]
    fn a_success_below_half_the_limit_does_not_grow_it() {
        let mut a = Aimd::new(20, 1, 1000);
        for i in 0..500u64 {
            let s = Success {
                at_limit: false,
                ..ok(at(i), 10)
            };
            assert_eq!(a.success(s, at(i)), None);
        }
        assert_eq!(a.limit(), 20);
    }

    #[test]
    fn a_first_byte_well_above_its_floor_is_a_signal_one_long_prompt_is_not() {
        let mut a = Aimd::new(20, 1, 1000);
        for i in 0..50u64 {
            a.success(ok(at(i), 200), at(i));
        }
        let grown = a.exact();
        // One slow answer (a long prompt) moves the smoothed value by a fifth: no signal, neither
        // the hard one nor a queue building (the next answer is fast again).
        assert!(!matches!(a.success(ok(at(60), 900), at(60)), Some(Adjusted::Down(..))));
        assert!(!matches!(a.success(ok(at(61), 200), at(61)), Some(Adjusted::Down(..))));
        // The provider queueing every request: the smoothed value passes twice the floor.
        let mut down = None;
        for i in 0..10u64 {
            if let Some(adj @ Adjusted::Down(..)) = a.success(ok(at(70 + i), 1500), at(70 + i)) {
                down = Some(adj);
                break;
            }
        }
        assert!(
            matches!(down, Some(Adjusted::Down(Signal::SlowFirstByte, l)) if l < grown),
            "{down:?}"
        );
    }

    #[test]
    fn a_queue_building_at_the_limit_is_a_gentle_decrease_below_it_nothing() {
        let mut a = Aimd::new(40, 1, 1000);
        for i in 0..50u64 {
            a.success(ok(at(i), 200), at(i));
        }
        let grown = a.exact();
        // Each request past the capacity waits 150 ms at the provider: 1.75 times the floor,
        // not twice it; below half the limit that is a slower model, not this limit's doing.
        for i in 0..20u64 {
            let s = Success {
                at_limit: false,
                ..ok(at(60 + i), 350)
            };
            assert_eq!(a.success(s, at(60 + i)), None);
        }
        let mut down = None;
        for i in 0..10u64 {
            if let Some(adj) = a.success(ok(at(100 + i), 350), at(100 + i)) {
                down = Some(adj);
                break;
            }
        }
        // The third answer in a row.
        assert_eq!(a.queueing, 0);
        let expected = grown * GENTLE_DECREASE;
        assert!(
            matches!(down, Some(Adjusted::Down(Signal::SlowFirstByte, l)) if (l - expected).abs() < 1e-9),
            "{down:?} {grown}"
        );
        // Once per round: the requests sent before it say the same.
        assert_eq!(a.success(ok(at(105), 350), at(120)), None);
    }

    #[test]
    fn the_floor_forgets_what_is_two_windows_old() {
        let mut f = Floor::default();
        let t = at(0);
        f.sample(0.1, t);
        for s in 1..=70u64 {
            f.sample(1.0, t + Duration::from_secs(s));
        }
        // The 100 ms of 70 s ago is gone; the floor is the smoothed value since.
        let least = f.least().unwrap();
        assert!(least > 0.5, "{least}");
    }

    #[test]
    fn a_request_waits_only_for_a_place_it_can_use() {
        let s = Duration::from_secs;
        let hold = Some(s(1));
        // Eight places held a second each: the 16th in line expects one in 2 s.
        assert!(may_wait(16, 8, hold, (s(30), s(10))));
        // The 80th in 10 s, and needs a second more: past a 10 s deadline.
        assert!(!may_wait(80, 8, hold, (s(30), s(10))));
        assert!(may_wait(72, 8, hold, (s(30), s(10))));
        // The queue's own bound.
        assert!(!may_wait(16, 8, hold, (s(2), s(900))));
        // Nothing known yet: it waits; no allowance counts as one.
        assert!(may_wait(1000, 8, None, (s(1), s(1))));
        assert!(!may_wait(2, 0, hold, (s(30), s(2))));
    }

    #[test]
    fn what_is_a_signal() {
        let s = |status, reset: Option<u64>| signal_of(Some(status), reset.map(Duration::from_secs), false);
        assert_eq!(s(429, None), Some(Signal::RateLimited));
        assert_eq!(s(429, Some(1)), Some(Signal::RateLimited));
        // A quota's window: the cooldown waits it out, the limit is not the cause.
        assert_eq!(s(429, Some(30)), None);
        assert_eq!(s(503, None), Some(Signal::Unavailable));
        assert_eq!(s(529, None), Some(Signal::Overloaded));
        assert_eq!(s(500, None), None);
        assert_eq!(s(400, None), None);
        assert_eq!(s(200, None), None);
        assert_eq!(signal_of(None, None, true), Some(Signal::FirstByteTimeout));
        assert_eq!(signal_of(None, None, false), None);
    }
}
