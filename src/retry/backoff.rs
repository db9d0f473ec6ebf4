//! Exponential backoff with jitter, and the upward jitter put on top of a server's Retry-After.
//!
//! The formulas are Marc Brooker's ("Exponential Backoff And Jitter", AWS Architecture Blog, 2015),
//! which gRPC (proposal A6) and the AWS SDKs also use. Envoy's documentation and its code disagree
//! on the exponent, so the contract is pinned here, exactly, and tested.
//!
//! Everything here is pure: randomness comes in as a parameter (`&mut impl Rng`), so tests use a
//! seeded generator and production code passes whatever per-task generator it owns.

use std::time::Duration;

use rand::Rng;

pub use crate::config::jitter::Jitter;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Why a [`Backoff`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InvalidBackoff {
    /// `max_delay` is zero: every delay would be zero, which is never what a policy means.
    #[error("max_delay must be greater than zero")]
    ZeroMax,
    /// `base_delay` is above `max_delay`.
    #[error("base_delay ({base:?}) must not exceed max_delay ({max:?})")]
    BaseAboveMax {
        /// The configured base delay.
        base: Duration,
        /// The configured maximum delay.
        max: Duration,
    },
}

/// An exponential backoff schedule: `base_delay`, `max_delay` and a [`Jitter`] mode.
///
/// Invariants (checked by [`Backoff::try_new`]): `0 < max` and `base <= max`. A zero `base` is
/// allowed and means "retry immediately" (every delay is zero).
///
/// Worked example, `base = 500ms`, `max = 30s` (the shipped `[retry.llm]` defaults):
///
/// | retry `n` | `cap(n)` | `full` | `equal` | `none` |
/// | --- | --- | --- | --- | --- |
/// | 1 | 500ms | 0..=500ms | 250ms..=500ms | 500ms |
/// | 2 | 1s | 0..=1s | 500ms..=1s | 1s |
/// | 3 | 2s | 0..=2s | 1s..=2s | 2s |
/// | 4 | 4s | 0..=4s | 2s..=4s | 4s |
/// | 5 | 8s | 0..=8s | 4s..=8s | 8s |
/// | 6 | 16s | 0..=16s | 8s..=16s | 16s |
/// | 7 | 30s (not 32s) | 0..=30s | 15s..=30s | 30s |
/// | 1000 | 30s (saturated) | 0..=30s | 15s..=30s | 30s |
///
/// `decorrelated` ignores `n`: the first retry draws from `500ms..=1.5s` (prev = base), and each
/// later one from `500ms..=3*prev`, the result capped at 30s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    base: Duration,
    max: Duration,
    jitter: Jitter,
}

impl Backoff {
    /// Builds a schedule; rejects `max == 0` and `base > max`.
    pub(crate) fn try_new(base: Duration, max: Duration, jitter: Jitter) -> Result<Backoff, InvalidBackoff> {
        if max.is_zero() {
            return Err(InvalidBackoff::ZeroMax);
        }
        if base > max {
            return Err(InvalidBackoff::BaseAboveMax { base, max });
        }
        Ok(Backoff { base, max, jitter })
    }

    #[cfg(test)]
    /// The configured base delay.
    pub(crate) fn base(&self) -> Duration {
        self.base
    }

    #[cfg(test)]
    /// The configured maximum delay: no [`Backoff::delay`] is ever longer.
    pub(crate) fn max(&self) -> Duration {
        self.max
    }

    /// `min(max, base * 2^(retry-1))`, saturating: never overflows, whatever `retry` is.
    /// `retry` 0 is treated as 1.
    pub(crate) fn cap(&self, retry: u32) -> Duration {
        let exponent = retry.saturating_sub(1);
        match 1u32.checked_shl(exponent) {
            Some(factor) => self.base.checked_mul(factor).map_or(self.max, |d| d.min(self.max)),
            // 2^32 or more: any non-zero base is past every representable max.
            None if self.base.is_zero() => Duration::ZERO,
            None => self.max,
        }
    }

    /// The delay before retry number `retry` (1 for the first retry, i.e. the second attempt).
    ///
    /// `prev` is only read by [`Jitter::Decorrelated`]: pass the value this function returned for
    /// the previous retry, or `None` for the first retry and after a server-directed wait
    /// (Retry-After), which resets the schedule as gRPC does after pushback. Other modes ignore it.
    ///
    /// The result is always `<= max`; for `full` it is in `[0, cap(retry)]`, for `equal` in
    /// `[cap/2, cap]`, for `decorrelated` in `[min(base, max), max]`, for `none` exactly `cap`.
    pub(crate) fn delay<R: Rng + ?Sized>(&self, retry: u32, prev: Option<Duration>, rng: &mut R) -> Duration {
        match self.jitter {
            Jitter::None => self.cap(retry),
            Jitter::Full => {
                let cap = self.cap(retry).as_nanos();
                from_nanos(uniform(rng, 0, cap))
            }
            Jitter::Equal => {
                let cap = self.cap(retry).as_nanos();
                let half = cap / 2;
                // `cap - half` rather than `half` so that an odd cap is still reachable.
                from_nanos(half + uniform(rng, 0, cap - half))
            }
            Jitter::Decorrelated => {
                let low = self.base.as_nanos();
                let prev = prev.unwrap_or(self.base).as_nanos();
                // A `prev` below base/3 (e.g. zero) would make the range empty: draw from `base`.
                let high = prev.saturating_mul(3).max(low);
                from_nanos(uniform(rng, low, high)).min(self.max)
            }
        }
    }
}

/// Smallest upward jitter added on top of a Retry-After hint.
pub(crate) const RETRY_AFTER_MIN_EXTRA: Duration = Duration::from_millis(10);
/// Smallest spread of the random part of the Retry-After jitter.
pub(crate) const RETRY_AFTER_MIN_SPREAD: Duration = Duration::from_millis(50);
/// Largest spread of the random part of the Retry-After jitter.
pub(crate) const RETRY_AFTER_MAX_SPREAD: Duration = Duration::from_secs(1);

/// The extra wait to add on top of a server's Retry-After `hint`: never negative, so the caller
/// never comes back earlier than the server asked.
///
/// Returns `RETRY_AFTER_MIN_EXTRA + U(0, spread)` with
/// `spread = clamp(hint / 10, RETRY_AFTER_MIN_SPREAD, RETRY_AFTER_MAX_SPREAD)`, i.e. between
/// 10 ms and 1.01 s. The caller waits `max(backoff, hint) + retry_after_jitter(hint)`.
///
/// Why: a provider that rate-limits an account sends the same Retry-After (often a date with
/// one-second resolution, or a reset instant) to every client of that account. Clients that all
/// wake up at that exact instant form a thundering herd and trip the limit again. Envoy's
/// rate-limited backoff draws from `[I, 1.5 I)` for this reason; we spread by 10% of the hint but
/// at most 1 s, because past the reset instant the wait is pure added latency, and at least
/// 50 ms so that short or zero hints are spread too. The fixed 10 ms floor keeps us from arriving
/// at the reset boundary itself, where a one-second-resolution clock may not have ticked yet.
pub(crate) fn retry_after_jitter<R: Rng + ?Sized>(hint: Duration, rng: &mut R) -> Duration {
    let spread = (hint / 10).clamp(RETRY_AFTER_MIN_SPREAD, RETRY_AFTER_MAX_SPREAD);
    RETRY_AFTER_MIN_EXTRA + from_nanos(uniform(rng, 0, spread.as_nanos()))
}

/// A uniform draw from the closed range `[low, high]`; `low` when the range is empty or a point.
fn uniform<R: Rng + ?Sized>(rng: &mut R, low: u128, high: u128) -> u128 {
    if low >= high {
        low
    } else {
        rng.random_range(low..=high)
    }
}

/// `Duration` from nanoseconds, saturating at `Duration::MAX` instead of wrapping.
fn from_nanos(nanos: u128) -> Duration {
    let secs = nanos / NANOS_PER_SEC;
    let sub = (nanos % NANOS_PER_SEC) as u32;
    match u64::try_from(secs) {
        Ok(secs) => Duration::new(secs, sub),
        Err(_) => Duration::MAX,
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    const MS: Duration = Duration::from_millis(1);

    fn backoff(base_ms: u64, max_ms: u64, jitter: Jitter) -> Backoff {
        Backoff::try_new(MS * base_ms as u32, MS * max_ms as u32, jitter).unwrap()
    }

    #[test]
    fn jitter_names_round_trip() {
        for j in Jitter::ALL {
            assert_eq!(j.to_string().parse::<Jitter>().unwrap(), j);
        }
        assert_eq!(Jitter::default(), Jitter::Full);
    }

    #[test]
    fn unknown_jitter_lists_the_valid_names() {
        for bad in ["", "Full", "FULL", " full", "expo", "decorrelated "] {
            let err = bad.parse::<Jitter>().unwrap_err();
            assert_eq!(err.given, bad);
            let msg = err.to_string();
            for name in ["full", "equal", "decorrelated", "none"] {
                assert!(msg.contains(name), "{msg}");
            }
        }
    }

    #[test]
    fn try_new_validates() {
        assert_eq!(
            Backoff::try_new(Duration::ZERO, Duration::ZERO, Jitter::Full),
            Err(InvalidBackoff::ZeroMax)
        );
        assert_eq!(
            Backoff::try_new(MS * 2, MS, Jitter::None),
            Err(InvalidBackoff::BaseAboveMax { base: MS * 2, max: MS })
        );
        assert!(Backoff::try_new(MS, MS, Jitter::Equal).is_ok());
        assert!(Backoff::try_new(Duration::ZERO, MS, Jitter::Full).is_ok());
        let err = Backoff::try_new(MS * 2, MS, Jitter::None).unwrap_err().to_string();
        assert!(err.contains("base_delay") && err.contains("max_delay"), "{err}");
    }

    #[test]
    fn cap_doubles_then_saturates() {
        let b = backoff(500, 30_000, Jitter::None);
        let caps: Vec<u64> = (0..=8).map(|n| b.cap(n).as_millis() as u64).collect();
        assert_eq!(caps, [500, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        for n in [31, 32, 33, 63, 64, 65, 1000, u32::MAX] {
            assert_eq!(b.cap(n), b.max(), "retry {n}");
        }
        // Largest representable durations do not overflow either.
        let huge = Backoff::try_new(Duration::MAX / 2, Duration::MAX, Jitter::Full).unwrap();
        assert_eq!(huge.cap(3), Duration::MAX);
        let zero = Backoff::try_new(Duration::ZERO, MS, Jitter::None).unwrap();
        assert_eq!(zero.cap(u32::MAX), Duration::ZERO);
    }

    #[test]
    fn none_is_the_documented_table() {
        let b = backoff(500, 30_000, Jitter::None);
        let mut rng = StdRng::seed_from_u64(1);
        let got: Vec<u64> = (1..=8).map(|n| b.delay(n, None, &mut rng).as_millis() as u64).collect();
        assert_eq!(got, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
    }

    #[test]
    fn full_jitter_stays_in_zero_to_cap() {
        let b = backoff(500, 30_000, Jitter::Full);
        let mut rng = StdRng::seed_from_u64(7);
        for n in [1, 2, 3, 7, 8, 100, u32::MAX] {
            let cap = b.cap(n);
            for _ in 0..5_000 {
                assert!(b.delay(n, None, &mut rng) <= cap);
            }
        }
    }

    #[test]
    fn full_jitter_mean_is_half_the_cap_and_covers_the_range() {
        let b = backoff(100, 10_000, Jitter::Full);
        let mut rng = StdRng::seed_from_u64(42);
        let cap = b.cap(4).as_secs_f64(); // 800ms
        let draws: Vec<f64> = (0..20_000).map(|_| b.delay(4, None, &mut rng).as_secs_f64()).collect();
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        // Standard error of the mean is cap/sqrt(12 n) ~ 0.2% of cap: 2% is a wide margin.
        assert!((mean - cap / 2.0).abs() < cap * 0.02, "mean {mean} cap {cap}");
        let low = draws.iter().filter(|d| **d < cap * 0.1).count();
        let high = draws.iter().filter(|d| **d > cap * 0.9).count();
        assert!(low > 1_500 && high > 1_500, "low {low} high {high}");
    }

    #[test]
    fn equal_jitter_stays_in_half_cap_to_cap() {
        let b = backoff(333, 20_001, Jitter::Equal);
        let mut rng = StdRng::seed_from_u64(3);
        for n in [1, 2, 5, 6, 7, 64, u32::MAX] {
            let cap = b.cap(n);
            let mut saw_upper_half = false;
            for _ in 0..5_000 {
                let d = b.delay(n, None, &mut rng);
                assert!(d >= cap / 2 && d <= cap, "retry {n}: {d:?} cap {cap:?}");
                saw_upper_half |= d > cap * 3 / 4;
            }
            assert!(saw_upper_half);
        }
        // An odd number of nanoseconds: the cap itself is reachable (no off-by-one).
        let odd = Backoff::try_new(Duration::from_nanos(3), Duration::from_nanos(3), Jitter::Equal).unwrap();
        let seen: std::collections::BTreeSet<u128> =
            (0..200).map(|_| odd.delay(1, None, &mut rng).as_nanos()).collect();
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), [1, 2, 3]);
    }

    #[test]
    fn decorrelated_grows_from_prev_and_is_capped() {
        let b = backoff(500, 30_000, Jitter::Decorrelated);
        let mut rng = StdRng::seed_from_u64(11);
        for _ in 0..5_000 {
            let first = b.delay(1, None, &mut rng);
            assert!(first >= MS * 500 && first <= MS * 1500, "{first:?}");
        }
        for prev_ms in [0u32, 1, 100, 500, 2_000, 9_000, 10_000, 60_000] {
            let prev = MS * prev_ms;
            let high = (prev * 3).max(MS * 500);
            for _ in 0..2_000 {
                let d = b.delay(5, Some(prev), &mut rng);
                assert!(d >= MS * 500 && d <= high.min(b.max()), "prev {prev:?}: {d:?}");
            }
        }
        // Chained the way a caller uses it: every value within bounds, reaching the cap.
        let mut prev = None;
        let mut reached_cap = false;
        for n in 1..200 {
            let d = b.delay(n, prev, &mut rng);
            assert!(d >= b.base() && d <= b.max());
            reached_cap |= d == b.max();
            prev = Some(d);
        }
        assert!(reached_cap);
        // A huge prev does not overflow.
        assert!(b.delay(1, Some(Duration::MAX), &mut rng) <= b.max());
    }

    #[test]
    fn zero_base_means_no_delay() {
        let mut rng = StdRng::seed_from_u64(5);
        for j in Jitter::ALL {
            let b = Backoff::try_new(Duration::ZERO, MS * 100, j).unwrap();
            for n in [1, 2, 40, u32::MAX] {
                assert_eq!(b.delay(n, None, &mut rng), Duration::ZERO, "{j} retry {n}");
            }
        }
    }

    #[test]
    fn same_seed_same_sequence() {
        let b = backoff(100, 5_000, Jitter::Full);
        let seq = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (1..10).map(|n| b.delay(n, None, &mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(seq(9), seq(9));
        assert_ne!(seq(9), seq(10));
    }

    #[test]
    fn retry_after_jitter_bounds() {
        let mut rng = StdRng::seed_from_u64(13);
        let cases = [
            (Duration::ZERO, MS * 50),
            (MS * 100, MS * 50),
            (MS * 500, MS * 50),
            (Duration::from_secs(2), MS * 200),
            (Duration::from_secs(10), Duration::from_secs(1)),
            (Duration::from_secs(3600), Duration::from_secs(1)),
            (Duration::MAX, Duration::from_secs(1)),
        ];
        for (hint, spread) in cases {
            let draws: Vec<Duration> = (0..3_000).map(|_| retry_after_jitter(hint, &mut rng)).collect();
            for d in &draws {
                assert!(*d >= RETRY_AFTER_MIN_EXTRA && *d <= RETRY_AFTER_MIN_EXTRA + spread);
            }
            // Actually spread out, not a constant.
            let max = draws.iter().max().unwrap();
            let min = draws.iter().min().unwrap();
            assert!(*max - *min > spread / 2, "hint {hint:?}");
        }
    }

    fn any_jitter() -> impl Strategy<Value = Jitter> {
        prop::sample::select(Jitter::ALL.to_vec())
    }

    /// The crate's property-test configuration (`crate::testing`): a fixed seed unless
    /// `REBOUND_FUZZ_SEED` says otherwise, no regression files, more cases with
    /// `REBOUND_FUZZ_SCALE`.
    fn proptest_config(cases: u32) -> ProptestConfig {
        crate::testing::proptest_config(cases)
    }

    proptest! {
        #![proptest_config(proptest_config(1024))]

        #[test]
        fn delay_never_exceeds_max(
            base in 0u64..=u64::MAX / 4,
            extra in 0u64..=u64::MAX / 4,
            jitter in any_jitter(),
            retry in any::<u32>(),
            prev in proptest::option::of(any::<u64>()),
            seed in any::<u64>(),
        ) {
            let base = Duration::from_nanos(base);
            let max = (base + Duration::from_nanos(extra)).max(Duration::from_nanos(1));
            let b = Backoff::try_new(base, max, jitter).unwrap();
            let mut rng = StdRng::seed_from_u64(seed);
            let d = b.delay(retry, prev.map(Duration::from_nanos), &mut rng);
            prop_assert!(d <= max);
            match jitter {
                Jitter::Full => prop_assert!(d <= b.cap(retry)),
                Jitter::Equal => prop_assert!(d >= b.cap(retry) / 2 && d <= b.cap(retry)),
                Jitter::None => prop_assert_eq!(d, b.cap(retry)),
                Jitter::Decorrelated => prop_assert!(d >= base),
            }
        }

        #[test]
        fn cap_is_monotonic(base in 0u64..10_000_000_000, extra in 1u64..100_000_000_000, retry in 0u32..200) {
            let b = Backoff::try_new(
                Duration::from_nanos(base),
                Duration::from_nanos(base + extra),
                Jitter::None,
            ).unwrap();
            prop_assert!(b.cap(retry) <= b.cap(retry + 1));
            prop_assert!(b.cap(retry) <= b.max());
        }

        #[test]
        fn retry_after_jitter_is_small_and_positive(hint in any::<u64>(), seed in any::<u64>()) {
            let mut rng = StdRng::seed_from_u64(seed);
            let j = retry_after_jitter(Duration::from_millis(hint), &mut rng);
            prop_assert!(j >= RETRY_AFTER_MIN_EXTRA);
            prop_assert!(j <= RETRY_AFTER_MIN_EXTRA + RETRY_AFTER_MAX_SPREAD);
        }
    }
}
