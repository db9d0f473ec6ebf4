//! This replica's side of the fleet's counters ([`Fleet`]): leases of a window's quota and
//! holdings of concurrent slots from the store, with `redis_down` deciding what a call that finds
//! Redis away gets, and the replica count that sizes leases. Asked by a request that finds its
//! lease spent, or in the background when a lease runs low (`Limiter::admit`).

use crate::redis::ReplicaId;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::bucket::{Bucket, Quota};
use super::queue::{Place, QueueShare};
use super::store::{Counters, Demand, Leaser, QueueAnswer, QueueCaller, QueueOp, SlotsCaller, SlotsHeld};
use super::{counter, window_ttl, Limit, SLOT_TTL};

use crate::config::{LimitPolicy, RedisDown};
use crate::limits::key::BucketKey;
use crate::limits::ledger::{Grant, Lease};
use crate::redis::RedisError;
use crate::time::Instant;

/// How long a replica's entries in a fleet queue outlive its last call there (its waiting head
/// asks every 100 ms): a replica that dies waiting holds the queue up this long at most.
const QUEUE_LIVENESS: Duration = Duration::from_secs(2);

/// A declaration of the slots this replica holds of a bucket: how many, and its number in this
/// replica's sequence (taken where the count is read: the store applies a replica's
/// declarations in this order, whatever order they land in).
#[derive(Debug, Clone, Copy)]
pub(super) struct Declaration {
    pub(super) slots: u64,
    pub(super) seq: u64,
}

/// A bucket that left this replica's table (a new one took its place), and the number of the
/// declaration that gives its idle slots back.
pub(super) struct Evicted<'a> {
    pub(super) key: BucketKey,
    pub(super) bucket: &'a mut Bucket,
    pub(super) seq: u64,
}

/// The store a replica's buckets draw on, and who this replica is in it.
pub(crate) struct Fleet {
    pub(super) store: Arc<Counters>,
    /// This replica's name in the store's holdings and replica counts.
    pub(super) replica: ReplicaId,
    /// The replicas last seen sharing a bucket (the size of a new bucket's leases).
    replicas: AtomicU32,
    /// The most replicas ever seen sharing a bucket, by this process (it outlives reloads): a
    /// replica counting alone while Redis is away takes no more than `limit / this`, whatever
    /// bucket it counts (a bucket only this replica used so far is still the fleet's).
    most: Arc<AtomicU32>,
    /// Whether the task renewing this replica's slot holdings runs.
    renewing: AtomicBool,
    /// The sequence of this replica's slot declarations (`limit_slots_v2.lua` applies them in
    /// this order, whatever order they land in).
    declared: AtomicU64,
}

impl Fleet {
    pub(super) fn new(store: Arc<Counters>, most: Arc<AtomicU32>) -> Fleet {
        Fleet {
            store,
            replica: ReplicaId::random(),
            replicas: AtomicU32::new(most.load(Ordering::Relaxed).max(1)),
            most,
            renewing: AtomicBool::new(false),
            declared: AtomicU64::new(0),
        }
    }

    /// The number of a slot declaration counted now (under the buckets' lock, where the count is
    /// read).
    pub(super) fn next_declaration(&self) -> u64 {
        self.declared.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Declares `declared.slots` slots of `bucket` (counted as declaration `declared.seq`); what
    /// the store said.
    pub(super) async fn declare(
        &self,
        limit: &Limit,
        bucket: BucketKey,
        declared: Declaration,
    ) -> Result<SlotsHeld, RedisError> {
        let cap = u64::from(limit.policy.concurrent.unwrap_or(0));
        let b = bucket.to_string();
        let caller = SlotsCaller {
            limit: &limit.policy.name,
            bucket: &b,
            replica: self.replica.as_str(),
            seq: declared.seq,
        };
        let demand = Demand {
            want: declared.slots,
            limit: cap,
        };
        let held = self.store.hold_slots(caller, demand, SLOT_TTL).await;
        if let Ok(h) = &held {
            limit.waiting.fleet_saw(bucket, h.waiting);
            self.most.fetch_max(h.holders, Ordering::Relaxed);
        }
        held
    }

    /// The fleet's store said `replicas` share a bucket.
    fn saw(&self, replicas: u32) {
        self.replicas.store(replicas.max(1), Ordering::Relaxed);
        self.most.fetch_max(replicas, Ordering::Relaxed);
    }

    /// A lease from the store, and the replicas it says share the bucket; with Redis away, what
    /// `redis_down` says (this replica's share of the window, everything, or nothing).
    pub(super) async fn lease(
        &self,
        limit: &Limit,
        bucket: BucketKey,
        quota: Quota,
        lease: Lease,
    ) -> (Grant, Option<u32>) {
        let ledger_limit = quota.limit(&limit.policy).unwrap_or(0);
        let id = counter(limit, bucket, quota, lease.window);
        let ttl = window_ttl(lease.window);
        let liveness = Duration::from_secs(2 * lease.window.period.nominal_secs());
        let demand = Demand {
            want: lease.want,
            limit: ledger_limit,
        };
        let leaser = Leaser {
            replica: self.replica.as_str(),
            liveness,
        };
        let asked = self.store.lease(&id, demand, ttl, leaser).await;
        let (granted, left, replicas) = match asked {
            Ok(g) => {
                self.saw(g.replicas);
                limit.waiting.fleet_saw(bucket, g.waiting);
                (g.granted, ledger_limit.saturating_sub(g.fleet_used), Some(g.replicas))
            }
            Err(e) => {
                log_store_error(&limit.policy, &e);
                let (granted, left) = match limit.policy.redis_down {
                    RedisDown::Open => (lease.want, ledger_limit),
                    // Refused while Redis is away, not for the rest of the window.
                    RedisDown::Closed => (0, ledger_limit),
                    // This replica's share of the window, less what it was granted in it
                    // already (from the fleet before Redis went away, or counting alone since).
                    RedisDown::Local => {
                        let share = self.share(ledger_limit, lease.replicas);
                        let left = share.saturating_sub(lease.granted);
                        let granted = lease.want.min(left);
                        (granted, left - granted)
                    }
                };
                (granted, left, None)
            }
        };
        let grant = Grant {
            window: lease.window,
            granted,
            left,
        };
        (grant, replicas)
    }

    /// Declares `declared.slots` slots of `bucket` held by this replica: the fleet's answer (at
    /// most the cap, less what others hold) and the replicas holding slots of it, or what
    /// `redis_down` allows.
    pub(super) async fn hold_slots(
        &self,
        limit: &Limit,
        bucket: BucketKey,
        declared: Declaration,
    ) -> (u64, Option<u32>) {
        let cap = u64::from(limit.policy.concurrent.unwrap_or(0));
        match self.declare(limit, bucket, declared).await {
            Ok(held) => (held.granted, Some(held.holders)),
            Err(e) => {
                log_store_error(&limit.policy, &e);
                let granted = match limit.policy.redis_down {
                    RedisDown::Open => declared.slots,
                    RedisDown::Closed => 0,
                    RedisDown::Local => declared.slots.min(self.share(cap, 0)),
                };
                (granted, None)
            }
        }
    }

    /// A bucket left this replica's table (a new one took its place): its unspent leases go back
    /// to the fleet's counts (Redis, or this process's), its idle slots to the fleet, told in the
    /// background.
    pub(super) fn hand_back_evicted(self: &Arc<Self>, limit: &Arc<Limit>, evicted: Evicted<'_>, now_ms: u64) {
        let Evicted { key, bucket, seq } = evicted;
        let (leases, slots) = bucket.unspent(now_ms);
        if leases.iter().all(Option::is_none) && !slots {
            return;
        }
        let (fleet, limit) = (self.clone(), limit.clone());
        crate::tasks::spawn("limit bucket hand-back", async move {
            for (i, lease) in leases.iter().enumerate() {
                if let Some((window, n)) = lease {
                    let id = counter(&limit, key, Quota::ALL[i], *window);
                    let n = i64::try_from(*n).unwrap_or(i64::MAX);
                    let _ = fleet.store.adjust(&id, -n, window_ttl(*window)).await;
                }
            }
            if slots {
                let _ = fleet.declare(&limit, key, Declaration { slots: 0, seq }).await;
            }
        });
    }

    /// Starts (once) the task that renews this replica's slot holdings in the store while its
    /// requests run: a holding not renewed expires after `SLOT_TTL`, and another replica may
    /// take it. The task ends when `limits` are gone (a reload).
    pub(super) fn renew_slots_in_background(self: &Arc<Self>, limits: Vec<std::sync::Weak<Limit>>) {
        if self.renewing.swap(true, Ordering::Relaxed) || matches!(*self.store, Counters::Local(_)) {
            return;
        }
        let fleet = self.clone();
        crate::tasks::spawn("limit slot renewal", async move {
            loop {
                tokio::time::sleep(SLOT_TTL / 3).await;
                let mut alive = false;
                for limit in limits.iter().filter_map(std::sync::Weak::upgrade) {
                    alive = true;
                    // Idle slots of a bucket others wait for go back with the renewal.
                    let held: Vec<(BucketKey, Declaration)> = limit
                        .buckets
                        .lock()
                        .iter_mut()
                        .filter_map(|(k, b)| {
                            let s = b.slots.as_mut()?;
                            if limit.waiting.busy(k) {
                                s.give_back_idle();
                            }
                            Some((*k, s.in_use() + s.free()))
                        })
                        .filter(|(_, n)| *n > 0)
                        .map(|(k, slots)| {
                            let seq = fleet.next_declaration();
                            (k, Declaration { slots, seq })
                        })
                        .collect();
                    for (bucket, declared) in held {
                        let _ = fleet.declare(&limit, bucket, declared).await;
                    }
                }
                if !alive {
                    return;
                }
            }
        });
    }

    /// Puts a waiting request (`place`, under `share` with its weight, until `until`) in the
    /// bucket's fleet queue, when there is one (Redis): its start tag there. Unreachable, the
    /// request waits in this replica's queue only.
    pub(super) async fn queue_join(
        &self,
        limit: &Limit,
        place: &Place,
        share: QueueShare,
        until: Instant,
    ) -> Option<i64> {
        let left = until.saturating_duration_since(crate::time::now());
        let deadline_ms = crate::time::now_unix_ms() + u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        let value = BucketKey(share.value).to_string();
        let op = QueueOp::Join {
            share: &value,
            weight: share.weight,
            deadline_ms,
        };
        self.queue(limit, place, op).await.map(|a| a.result)
    }

    /// Whether it is `place`'s turn in the fleet's queue (first in it, or no longer in it: a
    /// fleet that cannot say does not hold the request back). When the fleet's first is another
    /// of this replica's waiters, that one is told to ask instead.
    pub(super) async fn queue_turn(&self, limit: &Limit, place: &Place) -> bool {
        let Some(answer) = self.queue(limit, place, QueueOp::Head).await else {
            return true;
        };
        if let Some(first) = answer.mine.filter(|t| *t != place.ticket.number()) {
            limit.waiting.fleet_first(place.bucket, first);
        }
        answer.result <= 0
    }

    /// `place` leaves the fleet's queue (`served`: admitted), told in the background.
    pub(super) fn queue_leave(self: &Arc<Self>, limit: &Arc<Limit>, place: Place, served: bool) {
        if place.fleet.is_none() {
            return;
        }
        let (fleet, limit) = (self.clone(), limit.clone());
        crate::tasks::spawn("limit queue leave", async move {
            fleet.queue(&limit, &place, QueueOp::Done { served }).await;
            limit.waiting.wake();
        });
    }

    /// One call on the fleet's queue; what it says of the queue's length is noted.
    async fn queue(&self, limit: &Limit, place: &Place, op: QueueOp<'_>) -> Option<QueueAnswer> {
        let bucket = place.bucket.to_string();
        let caller = QueueCaller {
            limit: &limit.policy.name,
            bucket: &bucket,
            replica: self.replica.as_str(),
            ticket: place.ticket.number(),
        };
        // The keys live while a request may wait; a replica counts as live while it polls.
        let ttl = limit.policy.max_wait + Duration::from_secs(60);
        match self.store.queue(caller, op, ttl, QUEUE_LIVENESS).await {
            Ok(answer) => {
                if let Some(a) = answer {
                    limit.waiting.fleet_saw(place.bucket, a.waiting);
                }
                answer
            }
            Err(e) => {
                tracing::debug!(limit = %limit.policy.name, error = %e, "limit queue unavailable");
                None
            }
        }
    }

    /// This replica's share of `limit` (rounded up) when it counts alone: among the most
    /// replicas this process has seen sharing a bucket, or `bucket_replicas` (the bucket's own
    /// last count), whichever is more.
    fn share(&self, limit: u64, bucket_replicas: u32) -> u64 {
        let replicas = self.most.load(Ordering::Relaxed).max(bucket_replicas).max(1);
        limit.div_ceil(u64::from(replicas))
    }

    /// The replicas last seen sharing a bucket (1 without Redis): the size of leases.
    pub(super) fn replicas(&self) -> u32 {
        self.replicas.load(Ordering::Relaxed).max(1)
    }
}

fn log_store_error(policy: &LimitPolicy, e: &RedisError) {
    let mode = match policy.redis_down {
        RedisDown::Local => "this replica's share enforced",
        RedisDown::Open => "not enforced",
        RedisDown::Closed => "requests refused",
    };
    tracing::warn!(limit = %policy.name, error = %e, mode, "limit store unavailable");
}
