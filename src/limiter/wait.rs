//! A request's way through its route's limits ([`Limiter::wait_admit`]): admitted at once from
//! the leases in hand, or queued where a limit with `on_limit = "queue"` refused it (or others
//! already wait for it) and admitted in its turn within its wait, or turned away. The clock of
//! windows is a parameter (the pipeline's wall clock, a simulation's own), so that the fleet's
//! protocol runs the same in the pipeline and in `limiter::sim`'s simulated fleet.

use std::sync::Arc;
use std::time::Duration;

use super::{Ask, Limit, Limiter, Pass, Place, QueueShare, Refused};
use crate::config::OnLimit;
use crate::limits::key::BucketKey;
use crate::time::{self, Instant};

/// How often a waiting request looks again when no release woke it (a release elsewhere in the
/// fleet, a notification missed). The fleet's first waiter on a replica asks Redis this often
/// (only while requests wait): at 100 ms, a saturated queued limit of 16 slots on three
/// replicas kept 8 busy, each release waiting for a poll; at 20 ms, 14.5
/// (`limits_fleet::a_saturated_queued_limit_keeps_its_slots_busy`).
pub(crate) const QUEUE_POLL: Duration = Duration::from_millis(20);

/// The `retry-after` of a refusal that says nothing better (a queue full, a slot that frees when
/// some request ends).
pub(crate) const SLOT_POLL: Duration = Duration::from_secs(1);

/// An admitted request: its pass, and whether it waited in a queue for it.
pub(crate) struct Admitted {
    pub(crate) pass: Pass,
    pub(crate) queued: bool,
}

/// A request turned away: the limit that refused it (its place in the route's list, when
/// known), and when it may come back.
pub(crate) struct Turned {
    pub(crate) at: Option<usize>,
    pub(crate) limit: String,
    pub(crate) retry_after: Duration,
}

/// The share value and weight of a request in a limit's queue, for its bucket.
pub(crate) type Share<'s> = &'s (dyn Fn(&Limit, BucketKey) -> QueueShare + Sync);

/// The wall clock, in unix ms (the limits' windows).
pub(crate) type Clock<'c> = &'c (dyn Fn() -> u64 + Sync);

/// A request as its route's limits see it: the limits, the bucket it falls in under each, and
/// its share in their queues.
#[derive(Clone, Copy)]
pub(crate) struct Subject<'a> {
    pub(crate) limits: &'a [Arc<Limit>],
    /// One per limit, in the order of `limits`.
    pub(crate) buckets: &'a [BucketKey],
    pub(crate) share: Share<'a>,
}

/// When a request started, and the deadline it must be answered by: a queue's `max_wait` counts
/// from `started`, and no wait goes past `deadline`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) started: Instant,
    pub(crate) deadline: Instant,
}

impl Limiter {
    /// Admits a request on `subject`'s limits (its buckets, one per limit; its share in their
    /// queues) asking `ask`, arrived `timing.started`, by its `timing.deadline` at the latest (a
    /// queue's `max_wait` counts from `started` too).
    pub(crate) async fn wait_admit(
        &self,
        subject: Subject<'_>,
        ask: Ask,
        timing: Timing,
        now_ms: Clock<'_>,
    ) -> Result<Admitted, Turned> {
        let Subject { limits, buckets, share } = subject;
        let Timing { started, deadline } = timing;
        // A request that finds others waiting for a limit (here or in the fleet) waits behind them.
        let mut waiting: Option<InQueue> = None;
        for (i, (l, bucket)) in limits.iter().zip(buckets.iter().copied()).enumerate() {
            if l.policy.on_limit == OnLimit::Queue && l.waiting.busy(&bucket) {
                let until = (started + l.policy.max_wait).min(deadline);
                let Some(place) = self.queue(l, bucket, share(l, bucket), until).await else {
                    return Err(turned(Some(i), l, SLOT_POLL));
                };
                waiting = Some(InQueue::new(self, l, place, until));
                break;
            }
        }
        loop {
            let mut pause = QUEUE_POLL;
            // Registered before it looks: a release while it asks wakes it at once.
            let woken = waiting.as_ref().map(|q| {
                let limit = q.limit;
                limit.waiting.listen()
            });
            let turn = match &waiting {
                None => true,
                Some(q) => self.turn(q.limit, &q.place).await,
            };
            if turn {
                let refused = match self.admit(limits, buckets, ask, now_ms()).await {
                    Ok(pass) => {
                        let queued = waiting.is_some();
                        if let Some(q) = waiting {
                            q.leave(true);
                        }
                        return Ok(Admitted { pass, queued });
                    }
                    Err(refused) => refused,
                };
                if waiting.is_none() {
                    waiting = Some(self.queue_refused(subject, &refused, timing).await?);
                }
                pause = refused.retry_after;
                // A slot may free on any replica: the fleet's head looks again soon.
                if !refused.window && waiting.as_ref().is_some_and(|q| q.place.fleet.is_some()) {
                    pause = pause.min(QUEUE_POLL);
                }
            }
            let Some(q) = waiting.as_ref() else {
                return Err(Turned {
                    at: None,
                    limit: String::new(),
                    retry_after: SLOT_POLL,
                });
            };
            let (l, until) = (q.limit, q.until);
            let now = time::now();
            if now >= until {
                let at = limits.iter().position(|x| Arc::ptr_eq(x, l));
                if let Some(q) = waiting.take() {
                    q.leave(false);
                }
                return Err(turned(at, l, pause));
            }
            // Woken by a release, else in time for the limit's reset and the end of the wait.
            let within = pause.min(until - now).max(Duration::from_millis(1));
            match woken {
                Some(woken) => {
                    let _ = tokio::time::timeout(within, woken).await;
                }
                None => l.waiting.next_turn(within).await,
            }
        }
    }

    /// A request the limits refused, queued where the refusing limit allows it and may open
    /// within the wait, or turned away.
    async fn queue_refused<'a>(
        &'a self,
        subject: Subject<'a>,
        refused: &Refused,
        timing: Timing,
    ) -> Result<InQueue<'a>, Turned> {
        let Subject { limits, buckets, share } = subject;
        let Timing { started, deadline } = timing;
        let at = limits.iter().position(|l| l.policy.name == refused.limit);
        let l = at.and_then(|i| limits.get(i));
        let until = l.map(|l| (started + l.policy.max_wait).min(deadline));
        let opens_in_time = until.is_some_and(|u| !refused.window || time::now() + refused.retry_after < u);
        let queued = match (l.filter(|l| l.policy.on_limit == OnLimit::Queue), until, at) {
            (Some(l), Some(until), Some(i)) if opens_in_time => match buckets.get(i).copied() {
                Some(bucket) => self
                    .queue(l, bucket, share(l, bucket), until)
                    .await
                    .map(|place| InQueue::new(self, l, place, until)),
                None => None,
            },
            _ => None,
        };
        queued.ok_or_else(|| Turned {
            at,
            limit: refused.limit.clone(),
            retry_after: refused.retry_after,
        })
    }
}

/// Turned away by `l` (at `at` in the route's list), to come back after `retry_after`.
fn turned(at: Option<usize>, l: &Limit, retry_after: Duration) -> Turned {
    Turned {
        at,
        limit: l.policy.name.clone(),
        retry_after,
    }
}

/// A request's place in a limit's queues, left when it is admitted, when its wait runs out, or
/// when it goes away (its client gone: its future dropped), so that it never holds a queue up.
struct InQueue<'a> {
    limiter: &'a Limiter,
    limit: &'a Arc<Limit>,
    place: Place,
    until: Instant,
    left: bool,
}

impl<'a> InQueue<'a> {
    fn new(limiter: &'a Limiter, limit: &'a Arc<Limit>, place: Place, until: Instant) -> InQueue<'a> {
        InQueue {
            limiter,
            limit,
            place,
            until,
            left: false,
        }
    }

    /// Leaves the queues: admitted (`served`), or not.
    fn leave(mut self, served: bool) {
        self.left = true;
        self.limiter.dequeue(self.limit, self.place, served);
    }
}

impl Drop for InQueue<'_> {
    fn drop(&mut self) {
        if !self.left {
            self.limiter.dequeue(self.limit, self.place, false);
        }
    }
}
