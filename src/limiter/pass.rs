//! What an admitted request holds of its limits until its response ends ([`Pass`]): settled then
//! with what it used (tokens, and their cost under `[prices]`), its slots released; what went
//! beyond a lease is reported to the fleet in the background. Dropped unsettled (the request
//! ended before its usage was known), its reservations stay spent.

use std::sync::Arc;

use http::HeaderValue;

use super::bucket::{Held, Quota};
use super::fleet::{Declaration, Fleet};
use super::{counter, window_ttl, Limit};
use crate::limits::headers::{self, Status, Unit};
use crate::limits::key::BucketKey;
use crate::limits::prices::Price;
use crate::wire::body::Used;

/// An admitted request's hold on its limits.
pub(crate) struct Pass {
    pub(super) held: Vec<(Arc<Limit>, BucketKey, Held)>,
    pub(super) fleet: Arc<Fleet>,
    /// The price of the request's model, for its spend.
    pub(super) price: Option<Price>,
}

impl Pass {
    /// Settles every limit with what the request used (`None`: unknown, what it reserved stays
    /// spent), at `now_ms`, and releases its slots.
    pub(crate) fn settle(mut self, used: Option<Used>, now_ms: u64) {
        self.settle_held(used, now_ms);
    }

    /// Gives back everything the pass holds: the request was not made (a later limit refused
    /// it).
    pub(crate) fn cancel(mut self, now_ms: u64) {
        self.settle_with(now_ms, |_| Some(0));
    }

    /// Charges what the request's stream used so far (tokens, and their cost): beyond its
    /// reservations, debited at once, so that later admissions see it before the stream ends.
    pub(crate) fn charge(&mut self, used: Used, now_ms: u64) {
        let cost = self.cost(used);
        let total = |q: Quota| match q {
            Quota::Requests => None,
            Quota::Tokens => Some(used.input + used.cached_input + used.output),
            Quota::SpendDay | Quota::SpendMonth => Some(cost),
        };
        for (limit, bucket, held) in &mut self.held {
            if let Some(b) = limit.buckets.lock().get_mut(bucket) {
                b.charge(now_ms, held, total);
            }
        }
    }

    fn cost(&self, used: Used) -> u64 {
        self.price.map_or(0, |p| p.cost(used))
    }

    fn settle_held(&mut self, used: Option<Used>, now_ms: u64) {
        if let Some(n) = used.map(|u| u.input + u.cached_input + u.output) {
            for (limit, _, _) in self
                .held
                .iter()
                .filter(|(l, _, _)| l.policy.tokens_per_minute.is_some())
            {
                limit.metrics.settled.inc_by(n);
            }
        }
        let cost = used.map(|u| self.cost(u));
        let actual = |q: Quota| match q {
            Quota::Requests => Some(1),
            Quota::Tokens => used.map(|u| u.input + u.cached_input + u.output),
            Quota::SpendDay | Quota::SpendMonth => cost,
        };
        self.settle_with(now_ms, actual);
    }

    /// Settles every limit with `actual` per quota (`None`: the reservation stays spent).
    fn settle_with(&mut self, now_ms: u64, actual: impl Fn(Quota) -> Option<u64> + Copy) {
        for (limit, bucket, held) in std::mem::take(&mut self.held) {
            // Requests wait for the bucket (here or elsewhere in the fleet): idle slots go back.
            let others_wait = limit.waiting.busy(&bucket);
            let (excess, slots_after) = {
                let mut buckets = limit.buckets.lock();
                let Some(b) = buckets.get_mut(&bucket) else { continue };
                let (excess, after) = b.settle(now_ms, held, others_wait, actual);
                // Numbered where counted: a later declaration landing first wins.
                let declared = after.map(|slots| Declaration {
                    slots,
                    seq: self.fleet.next_declaration(),
                });
                (excess, declared)
            };
            // What was given back may admit a waiting request.
            limit.waiting.wake();
            if excess.iter().all(Option::is_none) && slots_after.is_none() {
                continue;
            }
            let fleet = self.fleet.clone();
            crate::tasks::spawn("limit settle", async move {
                for (i, e) in excess.iter().enumerate() {
                    if let Some((window, n)) = e {
                        let id = counter(&limit, bucket, Quota::ALL[i], *window);
                        let n = i64::try_from(*n).unwrap_or(i64::MAX);
                        let _ = fleet.store.adjust(&id, n, window_ttl(*window)).await;
                    }
                }
                if let Some(declared) = slots_after {
                    let _ = fleet.declare(&limit, bucket, declared).await;
                    // The slots given back may be another replica's waiter's: the fleet's
                    // queue moves on (this replica's waiters look again too).
                    limit.waiting.wake();
                }
            });
        }
    }

    /// The `RateLimit-Policy` and `RateLimit` fields of the tightest limit the request passed,
    /// as of `now_ms`.
    pub(crate) fn headers(&self, now_ms: u64) -> Option<(HeaderValue, HeaderValue)> {
        fields(self.held.iter().map(|(limit, bucket, _)| (&**limit, *bucket)), now_ms)
    }
}

/// The `RateLimit-Policy` and `RateLimit` fields of the tightest quota of these limits' buckets
/// (the refused request's too: the quota that refused it shows what is left of it).
pub(crate) fn fields<'a>(
    buckets: impl Iterator<Item = (&'a Limit, BucketKey)>,
    now_ms: u64,
) -> Option<(HeaderValue, HeaderValue)> {
    let mut statuses = Vec::new();
    for (limit, bucket) in buckets {
        let name = limit.policy.name.as_str();
        let buckets = limit.buckets.lock();
        let Some(b) = buckets.get(&bucket) else { continue };
        for (quota, unit) in [
            (Quota::Requests, Unit::Requests),
            (Quota::Tokens, Unit::Tokens),
            (Quota::SpendDay, Unit::MicroUsd),
            (Quota::SpendMonth, Unit::MicroUsd),
        ] {
            if let Some(l) = b.ledger_ref(quota) {
                let window = l.period().window(now_ms);
                statuses.push(Status {
                    name,
                    unit,
                    quota: l.limit(),
                    window_secs: Some(l.period().nominal_secs()),
                    remaining: l.remaining(now_ms),
                    reset_secs: Some(window.secs_left(now_ms)),
                });
            }
        }
        if let (Some(s), Some(n)) = (&b.slots, limit.policy.concurrent) {
            statuses.push(Status {
                name,
                unit: Unit::ConcurrentRequests,
                quota: u64::from(n),
                window_secs: None,
                remaining: s.free(),
                reset_secs: None,
            });
        }
    }
    headers::tightest(&statuses).map(|s| (s.policy(), s.ratelimit()))
}

impl Drop for Pass {
    fn drop(&mut self) {
        if !self.held.is_empty() {
            self.settle_held(None, crate::time::now_unix_ms());
        }
    }
}
