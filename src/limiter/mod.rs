//! Fleet-wide limits at run time (`[limits.NAME]`): the buckets each replica keeps, the admission
//! a request passes before its attempts ([`Limiter::admit`]), and the settlement when its response
//! ends ([`Pass`], on drop). The arithmetic (buckets, windows, ledgers, slots, the fair queue) is
//! `crate::limits`, pure; where a bucket's quota comes from is [`store`] (Redis leases shared by
//! every replica, or this process alone).
//!
//! Not yet: leases are handed back at shutdown only, not on a reload (docs/limits.md, "Not yet").

mod bucket;
pub(crate) mod concurrency;
mod fleet;
mod pass;
mod queue;
#[cfg(test)]
mod sim;
pub mod store;
mod table;
mod wait;

use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, LimitPolicy};
use crate::limits::key::{self, BucketKey, KeyInput};
use crate::limits::ledger::Lease;
use crate::limits::prices::{Price, Rate};
use crate::limits::window::Window;
use crate::metrics::{LimitMetrics, Metrics};
pub(crate) use bucket::Want;
use bucket::{Bucket, Held, Quota, Step};
use fleet::{Declaration, Evicted, Fleet};
pub(crate) use pass::{fields, Pass};
pub(crate) use queue::Place;
use queue::{QueueShare, Waiting};
use store::{CounterId, Counters};
pub(crate) use wait::{Subject, Timing, QUEUE_POLL};

/// Buckets kept per limit at most (beyond those in use): past it, a new bucket takes the place of
/// one not used lately ([`table::Table`]), whose unspent leases and idle slots go back to the
/// fleet.
const MAX_BUCKETS: usize = 100_000;

/// How long a replica's slot holding lives in Redis without a renewal.
const SLOT_TTL: Duration = Duration::from_secs(30);

/// Every limit of a configuration, and the store their quotas come from.
pub(crate) struct Limiter {
    limits: HashMap<String, Arc<Limit>>,
    /// The store the buckets draw on.
    fleet: Arc<Fleet>,
    /// `[prices]`, by model (`"*"`: any other).
    prices: HashMap<String, Price>,
}

/// One `[limits.NAME]`: its policy and this replica's buckets.
pub(crate) struct Limit {
    pub(crate) policy: Arc<LimitPolicy>,
    buckets: parking_lot::Mutex<table::Table<Bucket>>,
    /// Requests waiting for it (`on_limit = "queue"`).
    pub(crate) waiting: Waiting,
    /// Woken when an ask of the fleet is answered.
    answered: tokio::sync::Notify,
    /// Its series of the limit families.
    pub(crate) metrics: LimitMetrics,
}

impl Limit {
    /// The bucket a request falls in.
    pub(crate) fn bucket(&self, input: &KeyInput<'_>) -> BucketKey {
        key::bucket(&self.policy.key, &self.policy.name, input)
    }

    /// The share value and weight of a request of `bucket` in the bucket's queue (`share_by`'s
    /// value, weighed by `weights`; without `share_by`, the bucket itself).
    pub(crate) fn share(&self, bucket: BucketKey, input: &KeyInput<'_>) -> QueueShare {
        let policy = &self.policy;
        let Some(by) = &policy.share_by else {
            return QueueShare {
                value: bucket.0,
                weight: 1,
            };
        };
        let share = key::bucket(by, &policy.name, input);
        let weight = key::value(by, input)
            .and_then(|v| policy.weights.get(&v).copied())
            .unwrap_or(1);
        QueueShare { value: share.0, weight }
    }
}

/// What a request asks of its limits: what it may use of each bucket, and the price of its
/// model (its spend, settled with the tokens it used).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask {
    pub(crate) want: Want,
    /// Its model's price under `[prices]`, if any.
    pub(crate) price: Option<Price>,
}

/// Why a request was not admitted.
#[derive(Debug)]
pub(crate) struct Refused {
    /// The limit that refused it.
    pub(crate) limit: String,
    /// When it may be admitted again.
    pub(crate) retry_after: Duration,
    /// The limit's window is used up (`retry_after` is when it ends); else no concurrent slot
    /// is free (`retry_after` is a guess: one frees when a request ends).
    pub(crate) window: bool,
}

impl Limiter {
    /// The limits of `config`, their quotas from `store`.
    /// `most`: the most replicas this process has seen share a bucket (kept across reloads).
    pub(crate) fn new(config: &Config, store: Arc<Counters>, most: Arc<AtomicU32>, metrics: &Metrics) -> Limiter {
        let limits = config
            .limits
            .iter()
            .map(|(name, policy)| {
                let limit = Limit {
                    policy: policy.clone(),
                    buckets: parking_lot::Mutex::new(table::Table::new(MAX_BUCKETS)),
                    waiting: Waiting::default(),
                    answered: tokio::sync::Notify::new(),
                    metrics: LimitMetrics::new(metrics, name),
                };
                (name.clone(), Arc::new(limit))
            })
            .collect();
        Limiter {
            limits,
            fleet: Arc::new(Fleet::new(store, most)),
            prices: config
                .prices
                .iter()
                .filter_map(|(model, p)| Some((model.clone(), price_of(p)?)))
                .collect(),
        }
    }

    /// The price of `model` under `[prices]` (`"*"` for a model not listed), if any.
    pub(crate) fn price(&self, model: Option<&str>) -> Option<Price> {
        model
            .and_then(|m| self.prices.get(m))
            .or_else(|| self.prices.get("*"))
            .copied()
    }

    /// The limits a route lists, in order.
    pub(crate) fn for_route(&self, names: &[String]) -> Vec<Arc<Limit>> {
        names.iter().filter_map(|n| self.limits.get(n).cloned()).collect()
    }

    /// Admits a request (of `buckets`, one per limit, asking `ask`: what it may use, its model's
    /// price) on every limit of `limits`, at `now_ms` (unix ms): the pass it holds until its
    /// response ends, or the limit that refused it (what it took of the others given back).
    pub(crate) async fn admit(
        &self,
        limits: &[Arc<Limit>],
        buckets: &[BucketKey],
        ask: Ask,
        now_ms: u64,
    ) -> Result<Pass, Refused> {
        let mut pass = Pass {
            held: Vec::with_capacity(limits.len()),
            fleet: self.fleet.clone(),
            price: ask.price,
        };
        for (limit, bucket) in limits.iter().zip(buckets.iter().copied()) {
            match self.admit_one(limit, bucket, ask.want, now_ms).await {
                Ok(held) => pass.held.push((limit.clone(), bucket, held)),
                Err((retry_after_ms, window)) => {
                    pass.cancel(now_ms);
                    return Err(Refused {
                        limit: limit.policy.name.clone(),
                        retry_after: Duration::from_millis(retry_after_ms),
                        window,
                    });
                }
            }
        }
        Ok(pass)
    }

    /// One limit's admission: from the leases in hand, else after a lease (one round trip).
    async fn admit_one(
        &self,
        limit: &Arc<Limit>,
        bucket: BucketKey,
        want: Want,
        now_ms: u64,
    ) -> Result<Held, (u64, bool)> {
        let want = Want {
            sparing: limit.policy.concurrent.is_some() && limit.waiting.busy(&bucket),
            ..want
        };
        // One ask of the fleet per quota and one for slots, and a few waits for others' asks: a
        // fleet that grants nothing more ends it.
        for _ in 0..16 {
            // Registered before the bucket is read: an answer that lands in between still wakes.
            let answered = limit.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            // A slot declaration is numbered where its count is read, under the lock.
            let (step, evicted, seq) = {
                let mut buckets = limit.buckets.lock();
                let make = || Bucket::new(&limit.policy, self.fleet.replicas());
                let (b, evicted) = buckets.get_or_insert(bucket, make, |k, b| b.pinned() || limit.waiting.busy(k));
                let step = b.try_admit(now_ms, want);
                let counts = evicted.is_some() || matches!(step, Step::Slots { .. });
                (step, evicted, if counts { self.fleet.next_declaration() } else { 0 })
            };
            if let Some((key, mut old)) = evicted {
                let evicted = Evicted {
                    key,
                    bucket: &mut old,
                    seq,
                };
                self.fleet.hand_back_evicted(limit, evicted, now_ms);
            }
            match step {
                Step::Held(held, renewals) => {
                    for (i, lease) in renewals.into_iter().flat_map(|r| *r).enumerate() {
                        if let Some(lease) = lease {
                            self.renew_in_background(limit.clone(), bucket, Quota::ALL[i], lease, now_ms);
                        }
                    }
                    return Ok(held);
                }
                Step::Over { retry_after_ms, window } => return Err((retry_after_ms, window)),
                Step::Wait => {
                    let _ = tokio::time::timeout(ASK_WAIT, answered).await;
                }
                Step::Lease(quota, lease) => {
                    let asking = Asking::new(limit, bucket, quota as usize);
                    let (grant, replicas) = self.fleet.lease(limit, bucket, quota, lease).await;
                    asking.done(|b| {
                        if let Some(l) = b.ledger(quota) {
                            l.grant(now_ms, grant);
                            if let Some(n) = replicas {
                                l.set_replicas(n);
                            }
                        }
                    });
                    // Nothing granted though the fleet has more: the store did not answer.
                    if grant.granted == 0 && grant.left > 0 {
                        return Err((1000, false));
                    }
                }
                Step::Slots { want, held } => {
                    let with_slots = self.limits.values().filter(|l| l.policy.concurrent.is_some());
                    self.fleet
                        .renew_slots_in_background(with_slots.map(Arc::downgrade).collect());
                    let asking = Asking::new(limit, bucket, bucket::SLOTS);
                    let declared = Declaration {
                        slots: held + want,
                        seq,
                    };
                    let (total, holders) = self.fleet.hold_slots(limit, bucket, declared).await;
                    asking.done(|b| {
                        if let Some(s) = b.slots.as_mut() {
                            if let Some(n) = holders {
                                s.set_replicas(n);
                            }
                            // Held now (releases may have come meanwhile): the fleet's answer is
                            // the whole holding, so only what it adds is granted.
                            let now_held = s.in_use() + s.free();
                            s.grant(total.saturating_sub(now_held));
                        }
                    });
                }
            }
        }
        Err((1000, false))
    }

    /// Hands this replica's unspent leases and idle slots back to the fleet's counts (a replica
    /// shutting down, after its drain): the other replicas may use them in this window. Nothing
    /// to do without Redis (the process is the fleet).
    pub(crate) async fn hand_back(&self, now_ms: u64) {
        if matches!(*self.fleet.store, Counters::Local(_)) {
            return;
        }
        for limit in self.limits.values() {
            // A lease asked in the background and not answered yet would be granted here after
            // this hands back what it holds: its answer is waited for first (bounded).
            let until = crate::time::now() + ASK_WAIT;
            loop {
                let answered = limit.answered.notified();
                let in_flight = limit
                    .buckets
                    .lock()
                    .iter_mut()
                    .any(|(_, b)| b.asking.iter().any(|a| *a));
                if !in_flight || tokio::time::timeout_at(until, answered).await.is_err() {
                    break;
                }
            }
            // Taken under the lock, told to the store after it.
            let mut leases = Vec::new();
            let mut slots = Vec::new();
            for (key, b) in limit.buckets.lock().iter_mut() {
                for quota in Quota::ALL {
                    if let Some((window, n)) = b.ledger(quota).and_then(|l| l.give_back(now_ms)) {
                        leases.push((counter(limit, *key, quota, window), window, n));
                    }
                }
                if let Some(s) = b.slots.as_mut().filter(|s| s.free() > 0) {
                    s.give_back_idle();
                    let seq = self.fleet.next_declaration();
                    slots.push((*key, Declaration { slots: s.in_use(), seq }));
                }
            }
            for (id, window, n) in leases {
                let n = i64::try_from(n).unwrap_or(i64::MAX);
                let _ = self.fleet.store.adjust(&id, -n, window_ttl(window)).await;
            }
            for (bucket, declared) in slots {
                self.fleet.hold_slots(limit, bucket, declared).await;
            }
        }
    }

    /// Queues a request for `limit` (under `share`, until `until`): in the bucket's queue here
    /// and, with Redis, in the fleet's; its place, or `None` when the queue is full.
    pub(crate) async fn queue(
        &self,
        limit: &Limit,
        bucket: BucketKey,
        share: QueueShare,
        until: crate::time::Instant,
    ) -> Option<Place> {
        let mut place = limit.waiting.join(bucket, share, until).ok()?;
        if let Some(tag) = self.fleet.queue_join(limit, &place, share, until).await {
            limit.waiting.joined_fleet(&mut place, tag);
        }
        Some(place)
    }

    /// Whether a waiting request may try the limit: the first of this replica's queue and, in
    /// the fleet's queue, the first there.
    pub(crate) async fn turn(&self, limit: &Limit, place: &Place) -> bool {
        limit.waiting.is_head(place) && (place.fleet.is_none() || self.fleet.queue_turn(limit, place).await)
    }

    /// A waiting request leaves the queues: admitted (`served`), or its wait ran out.
    pub(crate) fn dequeue(&self, limit: &Arc<Limit>, place: Place, served: bool) {
        match served {
            true => limit.waiting.served(place),
            false => limit.waiting.leave(place),
        }
        self.fleet.queue_leave(limit, place, served);
    }

    /// Asks the fleet for `lease` of `bucket`'s `quota` off the request path: the lease in hand
    /// ran low, and the requests after this one spend the new one without waiting. The bucket
    /// marks the ask in flight (its requests wait for it rather than ask again).
    fn renew_in_background(&self, limit: Arc<Limit>, bucket: BucketKey, quota: Quota, lease: Lease, now_ms: u64) {
        let fleet = self.fleet.clone();
        crate::tasks::spawn("limit lease renewal", async move {
            let asking = Asking::new(&limit, bucket, quota as usize);
            let (grant, replicas) = fleet.lease(&limit, bucket, quota, lease).await;
            asking.done(|b| {
                if let Some(l) = b.ledger(quota) {
                    // As of the admission that asked (a later clock read rolls windows there).
                    l.grant(now_ms, grant);
                    if let Some(n) = replicas {
                        l.set_replicas(n);
                    }
                }
            });
        });
    }
}

/// `[prices]`' entry as the spend arithmetic holds it (validated at load: never refused here).
fn price_of(p: &crate::config::PriceConfig) -> Option<Price> {
    Some(Price {
        input: Rate::from_usd_per_million(p.input).ok()?,
        output: Rate::from_usd_per_million(p.output).ok()?,
        cached_input: Some(Rate::from_usd_per_million(p.cached_input).ok()?),
    })
}

fn counter(limit: &Limit, bucket: BucketKey, quota: Quota, window: Window) -> CounterId {
    CounterId {
        limit: limit.policy.name.clone(),
        bucket: bucket.to_string(),
        quota: quota.name(),
        window: window.index,
    }
}

/// The longest a request waits for another's ask of the fleet before looking again.
const ASK_WAIT: Duration = Duration::from_secs(1);

/// A request's ask of the fleet for a bucket: cleared (and the waiting requests woken) when it
/// is answered, or when the request goes away before (its future dropped).
struct Asking<'a> {
    limit: &'a Limit,
    bucket: BucketKey,
    index: usize,
}

impl<'a> Asking<'a> {
    fn new(limit: &'a Limit, bucket: BucketKey, index: usize) -> Asking<'a> {
        Asking { limit, bucket, index }
    }

    /// The answer: `credit` applies it to the bucket (the ask is cleared on drop, after).
    fn done(self, credit: impl FnOnce(&mut Bucket)) {
        if let Some(b) = self.limit.buckets.lock().get_mut(&self.bucket) {
            credit(b);
        }
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.limit.buckets.lock().get_mut(&self.bucket) {
            b.asking[self.index] = false;
        }
        self.limit.answered.notify_waiters();
    }
}

/// A window's counter lives as long as the window, plus a minute (it is made during the window).
fn window_ttl(window: Window) -> Duration {
    Duration::from_millis(window.end_ms().saturating_sub(window.start_ms())) + Duration::from_secs(60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::CredentialHash;
    use http::HeaderMap;

    fn limiter(limit: &str) -> Limiter {
        let src = format!(
            "[upstreams.u]\nurl = \"http://127.0.0.1:9\"\n[[routes]]\nname = \"r\"\npath_prefix = \"/r/\"\nupstream = \"u\"\nlimits = [\"team\"]\n[limits.team]\nkey = \"header:x-team\"\non_limit = \"reject\"\n{limit}"
        );
        let config = Config::parse(&src, std::path::Path::new("t.toml"), &|_| None).expect("config");
        Limiter::new(
            &config,
            Arc::new(Counters::local()),
            Arc::default(),
            &Metrics::new().expect("metrics"),
        )
    }

    fn input(headers: &HeaderMap) -> KeyInput<'_> {
        KeyInput {
            route: "r",
            credential: CredentialHash([1; 16]),
            model: None,
            headers,
        }
    }

    fn team(name: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-team", name.parse().unwrap());
        h
    }

    fn buckets(limits: &[Arc<Limit>], headers: &HeaderMap) -> Vec<BucketKey> {
        limits.iter().map(|l| l.bucket(&input(headers))).collect()
    }

    fn tokens(n: u64) -> Ask {
        Ask {
            want: Want {
                tokens: n,
                cost: 0,
                sparing: false,
            },
            price: None,
        }
    }

    fn used(output: u64) -> crate::wire::body::Used {
        crate::wire::body::Used {
            output,
            ..Default::default()
        }
    }

    /// 12:00:10 UTC on some day: 50 s left in the minute.
    const NOW: u64 = 1_796_385_610_000;

    #[tokio::test]
    async fn requests_per_minute_admits_the_limit_then_refuses_until_the_window_ends() {
        let l = limiter("requests_per_minute = 3");
        let limits = l.for_route(&["team".into()]);
        let (a, b) = (team("a"), team("b"));
        let mut passes = Vec::new();
        for _ in 0..3 {
            passes.push(
                l.admit(&limits, &buckets(&limits, &a), tokens(0), NOW)
                    .await
                    .expect("admitted"),
            );
        }
        let refused = l
            .admit(&limits, &buckets(&limits, &a), tokens(0), NOW)
            .await
            .err()
            .expect("refused");
        assert_eq!(refused.limit, "team");
        assert_eq!(refused.retry_after, Duration::from_secs(50));
        // Another team has its own bucket.
        assert!(l.admit(&limits, &buckets(&limits, &b), tokens(0), NOW).await.is_ok());
        // A request that ended does not give back its request: it was made.
        for p in passes {
            p.settle(None, NOW + 500);
        }
        assert!(l
            .admit(&limits, &buckets(&limits, &a), tokens(0), NOW + 1000)
            .await
            .is_err());
        // The next minute starts afresh.
        assert!(l
            .admit(&limits, &buckets(&limits, &a), tokens(0), NOW + 50_000)
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn tokens_are_reserved_then_settled_from_the_usage() {
        let l = limiter("tokens_per_minute = 1000");
        let limits = l.for_route(&["team".into()]);
        let a = team("a");
        let first = l
            .admit(&limits, &buckets(&limits, &a), tokens(800), NOW)
            .await
            .expect("admitted");
        assert!(
            l.admit(&limits, &buckets(&limits, &a), tokens(300), NOW).await.is_err(),
            "800 + 300 reserved > 1000"
        );
        // It used 100 of its 800: 700 come back.
        first.settle(Some(used(100)), NOW + 10);
        let second = l
            .admit(&limits, &buckets(&limits, &a), tokens(800), NOW + 20)
            .await
            .expect("admitted");
        // Used more than reserved: the excess counts, and the window is over the limit.
        second.settle(Some(used(950)), NOW + 30);
        assert!(l
            .admit(&limits, &buckets(&limits, &a), tokens(1), NOW + 40)
            .await
            .is_err());
    }

    #[tokio::test]
    async fn a_request_a_later_limit_refuses_gives_back_what_the_earlier_took() {
        let src = "[upstreams.u]\nurl = \"http://127.0.0.1:9\"\n[[routes]]\nname = \"r\"\npath_prefix = \"/r/\"\nupstream = \"u\"\nlimits = [\"rpm\", \"one\"]\n[limits.rpm]\nkey = \"route\"\non_limit = \"reject\"\nrequests_per_minute = 2\n[limits.one]\nkey = \"route\"\non_limit = \"reject\"\nconcurrent = 1\n";
        let config = Config::parse(src, std::path::Path::new("t.toml"), &|_| None).expect("config");
        let l = Limiter::new(
            &config,
            Arc::new(Counters::local()),
            Arc::default(),
            &Metrics::new().expect("metrics"),
        );
        let limits = l.for_route(&["rpm".into(), "one".into()]);
        let h = HeaderMap::new();
        let first = l
            .admit(&limits, &buckets(&limits, &h), tokens(0), NOW)
            .await
            .expect("first");
        for _ in 0..3 {
            let refused = l
                .admit(&limits, &buckets(&limits, &h), tokens(0), NOW)
                .await
                .err()
                .expect("no slot");
            assert_eq!(refused.limit, "one");
        }
        first.settle(None, NOW + 10);
        // The refused requests were not made: rpm still has its second request.
        assert!(l
            .admit(&limits, &buckets(&limits, &h), tokens(0), NOW + 20)
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn concurrent_requests_wait_for_a_slot_to_be_released() {
        let l = limiter("concurrent = 2");
        let limits = l.for_route(&["team".into()]);
        let a = team("a");
        let one = l
            .admit(&limits, &buckets(&limits, &a), tokens(0), NOW)
            .await
            .expect("one");
        let _two = l
            .admit(&limits, &buckets(&limits, &a), tokens(0), NOW)
            .await
            .expect("two");
        assert!(l.admit(&limits, &buckets(&limits, &a), tokens(0), NOW).await.is_err());
        drop(one); // the response ended, however it ended
        assert!(l.admit(&limits, &buckets(&limits, &a), tokens(0), NOW).await.is_ok());
    }
    /// Past the table's cap a new bucket takes an idle one's place in O(1): the table stays
    /// bounded, a bucket a request holds stays (its concurrent slot is not forgotten), and an
    /// evicted bucket's unspent lease goes back to the count (its team loses nothing).
    #[tokio::test]
    async fn a_flood_of_new_buckets_evicts_idle_ones_and_gives_their_leases_back() {
        let l = limiter("requests_per_minute = 80\nconcurrent = 1");
        let limits = l.for_route(&["team".into()]);
        *limits[0].buckets.lock() = table::Table::new(4);
        let ask = |h: HeaderMap| {
            let (l, limits) = (&l, &limits);
            async move { l.admit(limits, &buckets(limits, &h), tokens(0), NOW).await }
        };
        let held = ask(team("t0")).await.expect("t0 holds its slot");
        ask(team("e")).await.expect("admitted").settle(None, NOW);
        for n in 0..10_000 {
            ask(team(&format!("flood-{n}")))
                .await
                .expect("admitted")
                .settle(None, NOW);
            assert!(limits[0].buckets.lock().len() <= 5, "the cap and the pinned t0");
        }
        assert!(ask(team("t0")).await.is_err(), "t0's slot is still held");
        for _ in 0..100 {
            tokio::task::yield_now().await; // the hand-backs
        }
        // e used 1 of its 80: the 9 of its first lease it never spent came back.
        for _ in 0..79 {
            ask(team("e")).await.expect("admitted").settle(None, NOW);
        }
        assert!(ask(team("e")).await.is_err(), "80 in the window");
        held.settle(None, NOW);
    }
}
