//! A route's targets at run time: which one the next attempt goes to ([`choice`], pure) and the
//! load each carries on this replica ([`Load`]: requests in flight and a latency EWMA). Whether
//! a target can take a request at all (its circuit, the credential's cooldown, pacing and
//! exhaustion) is the fleet-wide state of `circuit`, read by the pipeline from the local mirror.

pub(crate) mod choice;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

pub(crate) use choice::{choose, Candidate};

/// How much of a new latency sample the EWMA takes (the rest is the old value): about the last
/// ten responses count.
const ALPHA: f64 = 0.2;

/// What one target carries for one route on this replica.
#[derive(Debug, Default)]
pub(crate) struct Load {
    in_flight: AtomicU32,
    /// The EWMA of the time to the response head, in microseconds, as `f64` bits; 0: none yet.
    ewma_bits: AtomicU64,
}

impl Load {
    /// Counts a request in flight until the guard is dropped.
    pub(crate) fn start(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self)
    }

    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The latency EWMA in microseconds, `None` before the first sample.
    pub(crate) fn ewma_us(&self) -> Option<f64> {
        let bits = self.ewma_bits.load(Ordering::Relaxed);
        (bits != 0).then(|| f64::from_bits(bits))
    }

    /// Adds one sample (a lost race between two updates loses one sample, never corrupts).
    pub(crate) fn observe(&self, took: Duration) {
        let sample = (took.as_secs_f64() * 1e6).max(1.0);
        let next = choice::ewma(self.ewma_us(), sample, ALPHA);
        self.ewma_bits.store(next.to_bits(), Ordering::Relaxed);
    }
}

/// A request in flight on a target; dropping it ends it.
pub(crate) struct InFlight<'a>(&'a Load);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_counts_guards_and_the_ewma_starts_at_the_first_sample() {
        let load = Load::default();
        assert_eq!((load.in_flight(), load.ewma_us()), (0, None));
        let a = load.start();
        let b = load.start();
        assert_eq!(load.in_flight(), 2);
        drop(a);
        drop(b);
        assert_eq!(load.in_flight(), 0);
        load.observe(Duration::from_millis(10));
        assert_eq!(load.ewma_us(), Some(10_000.0));
        load.observe(Duration::from_millis(20));
        assert_eq!(load.ewma_us(), Some(12_000.0));
    }
}
