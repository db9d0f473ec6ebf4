//! Where a bucket's quota comes from: the fleet's counters. With Redis, every replica leases
//! shares of each window's quota there (`limit_lease_v1.lua`: the counter holds what the fleet
//! was granted and never grants past the limit), reports what it spent beyond its lease or did not
//! spend (`limit_adjust_v1.lua`), and declares the concurrent-request slots it holds
//! (`limit_slots_v2.lua`: a holding expires unless renewed, so a replica that dies loses only its
//! own). Without Redis, one process is the fleet: the same arithmetic on a local table.
//!
//! One round trip per call, off the request path in the common case: the pipeline spends leases
//! locally and renews them in the background (`crate::limits::ledger`).

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use crate::redis::{RedisError, RedisHandle};

static LEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../redis/scripts/limit_lease_v1.lua")));
static ADJUST: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../redis/scripts/limit_adjust_v1.lua")));
static QUEUE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../redis/scripts/limit_queue_v2.lua")));
static SLOTS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../redis/scripts/limit_slots_v2.lua")));

/// A counter's name: the limit, the bucket (32 hex digits, a hash: no key value), the quota and
/// the window; the first two are the hash tag, so a bucket's keys share a Cluster slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CounterId {
    pub limit: String,
    pub bucket: String,
    /// `requests`, `tokens` or `usd`.
    pub quota: &'static str,
    pub window: u64,
}

impl CounterId {
    fn suffix(&self) -> String {
        format!(
            "limit:{{{}:{}}}:{}:{}",
            self.limit, self.bucket, self.quota, self.window
        )
    }

    fn replicas_suffix(&self) -> String {
        format!("limit:{{{}:{}}}:replicas", self.limit, self.bucket)
    }

    fn queue_suffix(&self) -> String {
        queue_key(&self.limit, &self.bucket)
    }
}

/// What a lease call granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    pub granted: u64,
    /// What the fleet was granted of the window's quota so far, this grant included.
    pub fleet_used: u64,
    /// The replicas that leased of the bucket lately, this one included.
    pub replicas: u32,
    /// Requests waiting in the bucket's fleet queue.
    pub waiting: u64,
}

/// What a call asks of a counter or of a bucket's slots: up to `want`, so long as the fleet
/// holds no more than `limit` of it in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    pub want: u64,
    pub limit: u64,
}

/// The replica a lease call counts among the bucket's replicas, and how long it counts there
/// without another call.
#[derive(Debug, Clone, Copy)]
pub struct Leaser<'a> {
    pub replica: &'a str,
    pub liveness: Duration,
}

/// Who declares a bucket's slots: the limit, the bucket (hex), this replica and the
/// declaration's number in its sequence (`limit_slots_v2.lua` applies a replica's declarations
/// in this order, whatever order they land in).
#[derive(Debug, Clone, Copy)]
pub struct SlotsCaller<'a> {
    pub limit: &'a str,
    pub bucket: &'a str,
    pub replica: &'a str,
    pub seq: u64,
}

/// A bucket's fleet queue key: its waiting set (every entry, by deadline), whose length the
/// lease and slot scripts read.
fn queue_key(limit: &str, bucket: &str) -> String {
    format!("limit:{{{limit}:{bucket}}}:waiting")
}

/// The fleet's counters: Redis, or this process's table.
pub enum Counters {
    Redis(RedisHandle),
    Local(parking_lot::Mutex<LocalCounters>),
    /// A simulated Redis shared by simulated replicas (`limiter::sim`), with its faults.
    #[cfg(test)]
    Sim(super::sim::SimCall),
}

impl Counters {
    /// Redis's counters, else this process's.
    pub fn of(redis: Option<RedisHandle>) -> Counters {
        match redis {
            Some(r) => Counters::Redis(r),
            None => Counters::local(),
        }
    }

    pub fn local() -> Counters {
        Counters::Local(parking_lot::Mutex::new(LocalCounters::default()))
    }

    /// Up to `demand.want` of `id`'s window quota of `demand.limit`, kept for `ttl` (the window's
    /// end, plus a margin); `leaser` is counted among the bucket's replicas for its liveness.
    pub async fn lease(
        &self,
        id: &CounterId,
        demand: Demand,
        ttl: Duration,
        leaser: Leaser<'_>,
    ) -> Result<Granted, RedisError> {
        match self {
            Counters::Local(t) => Ok(t.lock().lease(id, demand.want, demand.limit)),
            #[cfg(test)]
            Counters::Sim(s) => s.call(|r| r.lease(id, demand, leaser)).await,
            Counters::Redis(redis) => {
                let mut inv = LEASE.prepare_invoke();
                inv.key(redis.key(&id.suffix()))
                    .key(redis.key(&id.replicas_suffix()))
                    .key(redis.key(&id.queue_suffix()))
                    .arg(demand.want)
                    .arg(demand.limit)
                    .arg(ttl_ms(ttl))
                    .arg(leaser.replica)
                    .arg(ttl_ms(leaser.liveness));
                let (granted, fleet_used, replicas, waiting): (u64, u64, u32, u64) = redis
                    .run("limit_lease", |mut c| async move { inv.invoke_async(&mut c).await })
                    .await?;
                Ok(Granted {
                    granted,
                    fleet_used,
                    replicas,
                    waiting,
                })
            }
        }
    }

    /// Adds `amount` (negative: gives back) to `id`'s counter, never below zero; the counter
    /// after.
    pub async fn adjust(&self, id: &CounterId, amount: i64, ttl: Duration) -> Result<u64, RedisError> {
        match self {
            Counters::Local(t) => Ok(t.lock().adjust(id, amount)),
            #[cfg(test)]
            Counters::Sim(s) => s.call(|r| r.adjust(id, amount)).await,
            Counters::Redis(redis) => {
                let mut inv = ADJUST.prepare_invoke();
                inv.key(redis.key(&id.suffix())).arg(amount).arg(ttl_ms(ttl));
                redis
                    .run("limit_adjust", |mut c| async move { inv.invoke_async(&mut c).await })
                    .await
            }
        }
    }

    /// Declares that `caller`'s replica holds `demand.want` of its bucket's `demand.limit`
    /// concurrent slots for `ttl`: granted up to what the other replicas' live holdings leave
    /// (what it holds, when a later declaration of its own, by `caller.seq`, landed first); the
    /// requests waiting in the bucket's fleet queue; the replicas holding slots of it.
    pub async fn hold_slots(
        &self,
        caller: SlotsCaller<'_>,
        demand: Demand,
        ttl: Duration,
    ) -> Result<SlotsHeld, RedisError> {
        match self {
            // One process: it holds what it asks, within the limit.
            Counters::Local(_) => Ok(SlotsHeld {
                granted: demand.want.min(demand.limit),
                waiting: 0,
                holders: 1,
            }),
            #[cfg(test)]
            Counters::Sim(s) => s.call(|r| r.hold_slots(caller, demand, ttl)).await,
            Counters::Redis(redis) => {
                let (limit_name, bucket) = (caller.limit, caller.bucket);
                let mut inv = SLOTS.prepare_invoke();
                inv.key(redis.key(&format!("limit:{{{limit_name}:{bucket}}}:slots")))
                    .key(redis.key(&queue_key(limit_name, bucket)))
                    .arg(caller.replica)
                    .arg(demand.want)
                    .arg(demand.limit)
                    .arg(ttl_ms(ttl))
                    .arg(caller.seq);
                let (granted, _others, waiting, holders): (u64, u64, u64, u32) = redis
                    .run("limit_slots", |mut c| async move { inv.invoke_async(&mut c).await })
                    .await?;
                Ok(SlotsHeld {
                    granted,
                    waiting,
                    holders,
                })
            }
        }
    }
}

/// What a slot declaration was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotsHeld {
    /// The slots this replica holds now.
    pub granted: u64,
    /// Requests waiting in the bucket's fleet queue.
    pub waiting: u64,
    /// The replicas holding slots of the bucket, this one included.
    pub holders: u32,
}

/// A call on a bucket's fleet queue (`limit_queue_v2.lua`).
#[derive(Debug, Clone, Copy)]
pub enum QueueOp<'a> {
    /// Queues the ticket under `share` (hex) with `weight`, until `deadline_ms` (unix ms).
    Join {
        share: &'a str,
        weight: u32,
        deadline_ms: u64,
    },
    /// Whether it is the ticket's turn in the fleet's queue (0: its turn; 1: not yet; -1: not
    /// queued), and the fleet's first ticket when it is the caller's.
    Head,
    /// The ticket leaves the queue; `served`: it was admitted (the fair books move on).
    Done { served: bool },
}

/// Who calls the fleet's queue: the limit, the bucket (hex), this replica and its ticket.
pub struct QueueCaller<'a> {
    pub limit: &'a str,
    pub bucket: &'a str,
    pub replica: &'a str,
    pub ticket: u64,
}

/// What the fleet's queue answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueAnswer {
    /// Join: the entry's start tag as of now; head: 0 its turn, 1 not yet, -1 not queued.
    pub result: i64,
    /// Head: the ticket of the fleet's first entry, when it is the caller's.
    pub mine: Option<u64>,
    /// Requests waiting fleet-wide.
    pub waiting: u64,
}

impl Counters {
    /// One call on the fleet's queue of a bucket (see [`QueueAnswer`]), its keys kept for `ttl`
    /// and the caller's replica live in it for `liveness`. `None` without Redis (one process: its
    /// own queue is the fleet's).
    pub async fn queue(
        &self,
        caller: QueueCaller<'_>,
        op: QueueOp<'_>,
        ttl: Duration,
        liveness: Duration,
    ) -> Result<Option<QueueAnswer>, RedisError> {
        #[cfg(test)]
        if let Counters::Sim(s) = self {
            return s.call(|r| r.queue(&caller, op, liveness)).await.map(Some);
        }
        let Counters::Redis(redis) = self else { return Ok(None) };
        let base = format!("limit:{{{}:{}}}", caller.limit, caller.bucket);
        let mut inv = QUEUE.prepare_invoke();
        inv.key(redis.key(&queue_key(caller.limit, caller.bucket)))
            .key(redis.key(&format!("{base}:ready")))
            .key(redis.key(&format!("{base}:fifo")))
            .key(redis.key(&format!("{base}:books2")));
        let name = match op {
            QueueOp::Join { .. } => "join",
            QueueOp::Head => "head",
            QueueOp::Done { served: true } => "served",
            QueueOp::Done { served: false } => "done",
        };
        inv.arg(name)
            .arg(caller.replica)
            .arg(caller.ticket)
            .arg(ttl_ms(ttl))
            .arg(ttl_ms(liveness));
        if let QueueOp::Join {
            share,
            weight,
            deadline_ms,
        } = op
        {
            inv.arg(share).arg(weight).arg(deadline_ms);
        }
        let (result, mine, waiting): (i64, i64, u64) = redis
            .run("limit_queue", |mut c| async move { inv.invoke_async(&mut c).await })
            .await?;
        Ok(Some(QueueAnswer {
            result,
            mine: u64::try_from(mine).ok(),
            waiting,
        }))
    }
}

fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The counters of a process that is the whole fleet: one per limit, bucket and quota, for its
/// current window (a newer window's count replaces an older one's in place). The counters of
/// windows that ended are dropped in the order they were made, a few at each call of the same
/// quota: O(1) amortised per call, and the table holds the live windows of the buckets counted
/// in them (before, every call swept the whole table: past 100,000 buckets a new one cost
/// milliseconds).
#[derive(Debug, Default)]
pub struct LocalCounters {
    /// The count of each counter, with its window.
    counters: HashMap<LocalKey, (u64, u64)>,
    /// Per quota, the counters in the order their windows began: (key, window).
    made: HashMap<&'static str, std::collections::VecDeque<(LocalKey, u64)>>,
}

/// A local counter: the limit, the bucket and the quota (its window apart).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct LocalKey {
    limit: String,
    bucket: String,
    quota: &'static str,
}

impl LocalCounters {
    fn lease(&mut self, id: &CounterId, want: u64, limit: u64) -> Granted {
        let used = self.counter(id);
        let granted = want.min(limit.saturating_sub(*used));
        *used += granted;
        Granted {
            granted,
            fleet_used: *used,
            replicas: 1,
            waiting: 0,
        }
    }

    fn adjust(&mut self, id: &CounterId, amount: i64) -> u64 {
        let used = self.counter(id);
        *used = used.saturating_add_signed(amount);
        *used
    }

    /// `id`'s count (0 in a window not counted yet), once the windows of its quota that ended
    /// before `id`'s are dropped.
    fn counter(&mut self, id: &CounterId) -> &mut u64 {
        let made = self.made.entry(id.quota).or_default();
        while let Some((key, window)) = made.front() {
            if *window >= id.window {
                break;
            }
            if self.counters.get(key).is_some_and(|(w, _)| w == window) {
                self.counters.remove(key);
            }
            made.pop_front();
        }
        let key = LocalKey {
            limit: id.limit.clone(),
            bucket: id.bucket.clone(),
            quota: id.quota,
        };
        if self.counters.get(&key).is_none_or(|(w, _)| *w < id.window) {
            self.counters.insert(key.clone(), (id.window, 0));
            made.push_back((key.clone(), id.window));
        }
        // A call for a window older than the counter's (a late settlement) counts in the newer:
        // the safe side.
        let entry = self.counters.entry(key).or_insert((id.window, 0));
        &mut entry.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(window: u64) -> CounterId {
        CounterId {
            limit: "team".into(),
            bucket: "00".repeat(16),
            quota: "tokens",
            window,
        }
    }

    #[test]
    fn a_window_never_grants_past_its_limit_and_the_next_starts_afresh() {
        let mut t = LocalCounters::default();
        assert_eq!(
            t.lease(&id(1), 60, 100),
            Granted {
                granted: 60,
                fleet_used: 60,
                replicas: 1,
                waiting: 0
            }
        );
        assert_eq!(
            t.lease(&id(1), 60, 100),
            Granted {
                granted: 40,
                fleet_used: 100,
                replicas: 1,
                waiting: 0
            }
        );
        assert_eq!(t.lease(&id(1), 60, 100).granted, 0);
        // What was spent beyond the lease is counted; what was not spent is given back.
        assert_eq!(t.adjust(&id(1), 7), 107);
        assert_eq!(t.adjust(&id(1), -200), 0);
        assert_eq!(t.lease(&id(2), 60, 100).granted, 60);
        assert_eq!(t.counters.len(), 1, "window 1 was replaced");
    }

    #[test]
    fn counters_of_ended_windows_are_dropped_as_newer_ones_are_counted() {
        let mut t = LocalCounters::default();
        let of = |bucket: u32, window: u64| CounterId {
            limit: "team".into(),
            bucket: format!("{bucket:032x}"),
            quota: "requests",
            window,
        };
        for window in 1..=3 {
            for bucket in 0..1_000 {
                t.lease(&of(bucket, window), 1, 10);
            }
        }
        // Window 3 only (each call drops a few of the ended ones: none is left behind).
        assert_eq!(t.counters.len(), 1_000);
        assert!(t.made.values().map(|m| m.len()).sum::<usize>() <= 1_000 + 1);
        assert_eq!(t.lease(&of(7, 3), 10, 10).granted, 9, "window 3's count kept");
    }
}
