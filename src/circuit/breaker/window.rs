//! The breaker's sliding window: a ring of [`BUCKETS`] buckets, each `window / BUCKETS` wide
//! (Hystrix, Resilience4j's time-based window): a call counts for at least `0.9 * window` and at
//! most `window`.

use std::time::Duration;

use super::BUCKETS;
use crate::time::Instant;

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Bucket {
    epoch: u64,
    used: bool,
    successes: u64,
    failures: u64,
}

/// The sliding window: a ring of buckets indexed by `(now - origin) / bucket`.
#[derive(Debug, Clone)]
pub(super) struct Window {
    origin: Instant,
    bucket_nanos: u128,
    buckets: [Bucket; BUCKETS],
}

impl Window {
    pub(super) fn new(bucket: Duration, origin: Instant) -> Window {
        Window {
            origin,
            bucket_nanos: bucket.as_nanos().max(1),
            buckets: [Bucket::default(); BUCKETS],
        }
    }

    fn epoch(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.origin).as_nanos() / self.bucket_nanos).unwrap_or(u64::MAX)
    }

    pub(super) fn add(&mut self, now: Instant, failure: bool) {
        let epoch = self.epoch(now);
        let b = &mut self.buckets[(epoch % BUCKETS as u64) as usize];
        if !b.used || b.epoch != epoch {
            *b = Bucket {
                epoch,
                used: true,
                successes: 0,
                failures: 0,
            };
        }
        if failure {
            b.failures = b.failures.saturating_add(1);
        } else {
            b.successes = b.successes.saturating_add(1);
        }
    }

    /// (successes, failures) of the calls in the window at `now`.
    pub(super) fn totals(&self, now: Instant) -> (u64, u64) {
        let current = self.epoch(now);
        self.buckets
            .iter()
            .filter(|b| b.used && b.epoch <= current && b.epoch.saturating_add(BUCKETS as u64) > current)
            .fold((0, 0), |(s, f), b| (s + b.successes, f + b.failures))
    }

    pub(super) fn clear(&mut self) {
        self.buckets = [Bucket::default(); BUCKETS];
    }
}
