//! Fleet-wide limits at run time (`[limits.NAME]`): the buckets each replica keeps, the admission
//! a request passes before its attempts ([`Limiter::admit`]), and the settlement when its response
//! ends ([`Pass`], on drop). The arithmetic (buckets, windows, ledgers, slots, the fair queue) is
//! `crate::limits`, pure; where a bucket's quota comes from is [`store`] (Redis leases shared by
//! every replica, or this process alone).
//!
//! Being built (issue 49): admission spends leases for requests, tokens and concurrent slots and
//! refuses (429 `limit_exceeded`) what is over; the fair queue, spend limits and `redis_down` are
//! next.

pub mod store;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, LimitPolicy};
use crate::limits::concurrency::{Acquire, Slot, Slots};
use crate::limits::headers::{self, Status, Unit};
use crate::limits::key::{self, BucketKey, KeyInput};
use crate::limits::ledger::{Grant, Lease, Ledger, Reservation, Reserve};
use crate::limits::window::{Period, Window};
use crate::redis::RedisError;
use store::{CounterId, Store};

/// Buckets kept per limit at most: past it, buckets idle for a window are dropped first.
const MAX_BUCKETS: usize = 100_000;

/// How long a replica's slot holding lives in Redis without a renewal.
const SLOT_TTL: Duration = Duration::from_secs(30);

/// Every limit of a configuration, and the store their quotas come from.
pub(crate) struct Limiter {
    limits: HashMap<String, Arc<Limit>>,
    store: Arc<Store>,
    /// This replica's name in slot holdings.
    replica: Arc<str>,
}

/// One `[limits.NAME]`: its policy and this replica's buckets.
pub(crate) struct Limit {
    pub(crate) policy: Arc<LimitPolicy>,
    buckets: parking_lot::Mutex<HashMap<BucketKey, Bucket>>,
}

/// One bucket's ledgers on this replica.
struct Bucket {
    requests: Option<Ledger>,
    tokens: Option<Ledger>,
    slots: Option<Slots>,
    /// When it was last used (unix ms), to drop idle buckets.
    used_ms: u64,
}

/// Which quota a lease is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quota {
    Requests,
    Tokens,
}

impl Quota {
    fn name(self) -> &'static str {
        match self {
            Quota::Requests => "requests",
            Quota::Tokens => "tokens",
        }
    }
}

/// What a bucket says to a request.
enum Step {
    Held(Held),
    Lease(Quota, Lease),
    Slots { want: u64, held: u64 },
    Over { retry_after_ms: u64 },
}

/// What a request holds of one bucket.
struct Held {
    requests: Option<Reservation>,
    tokens: Option<Reservation>,
    slot: Option<Slot>,
}

impl Bucket {
    fn new(policy: &LimitPolicy, replicas: u32) -> Bucket {
        Bucket {
            requests: policy
                .requests_per_minute
                .map(|n| Ledger::new(n, Period::Minute, replicas)),
            tokens: policy
                .tokens_per_minute
                .map(|n| Ledger::new(n, Period::Minute, replicas)),
            slots: policy.concurrent.map(|n| Slots::new(u64::from(n), replicas)),
            used_ms: 0,
        }
    }

    /// Admits a request that may use `tokens` at `now_ms`, on everything the bucket limits, or
    /// says what is missing (having taken nothing).
    fn try_admit(&mut self, now_ms: u64, tokens: u64) -> Step {
        self.used_ms = now_ms;
        let requests = match self.requests.as_mut().map(|l| l.try_reserve(now_ms, 1)) {
            None => None,
            Some(Reserve::Ok(r)) => Some(r),
            Some(Reserve::NeedLease(lease)) => return Step::Lease(Quota::Requests, lease),
            Some(Reserve::Over { retry_after_ms }) => return Step::Over { retry_after_ms },
        };
        let reserved_tokens = match self.tokens.as_mut().map(|l| l.try_reserve(now_ms, tokens)) {
            None => None,
            Some(Reserve::Ok(r)) => Some(r),
            Some(other) => {
                self.undo(now_ms, requests, None);
                return match other {
                    Reserve::NeedLease(lease) => Step::Lease(Quota::Tokens, lease),
                    Reserve::Over { retry_after_ms } => Step::Over { retry_after_ms },
                    Reserve::Ok(_) => Step::Over { retry_after_ms: 1000 },
                };
            }
        };
        let slot = match self.slots.as_mut().map(Slots::try_acquire) {
            None => None,
            Some(Acquire::Ok(slot)) => Some(slot),
            Some(other) => {
                let held = self.slots.as_ref().map_or(0, |s| s.in_use() + s.free());
                self.undo(now_ms, requests, reserved_tokens);
                return match other {
                    Acquire::NeedSlots { want } => Step::Slots { want, held },
                    // A slot frees when a request ends: soon, but when is not known.
                    _ => Step::Over { retry_after_ms: 1000 },
                };
            }
        };
        Step::Held(Held {
            requests,
            tokens: reserved_tokens,
            slot,
        })
    }

    /// Gives back what an admission took before it found something missing.
    fn undo(&mut self, now_ms: u64, requests: Option<Reservation>, tokens: Option<Reservation>) {
        if let (Some(l), Some(r)) = (self.requests.as_mut(), requests) {
            l.settle(now_ms, r, 0);
        }
        if let (Some(l), Some(r)) = (self.tokens.as_mut(), tokens) {
            l.settle(now_ms, r, 0);
        }
    }

    fn ledger(&mut self, quota: Quota) -> Option<&mut Ledger> {
        match quota {
            Quota::Requests => self.requests.as_mut(),
            Quota::Tokens => self.tokens.as_mut(),
        }
    }
}

/// Why a request was not admitted.
#[derive(Debug)]
pub(crate) struct Refused {
    /// The limit that refused it.
    pub(crate) limit: String,
    /// When it may be admitted again.
    pub(crate) retry_after: Duration,
}

impl Limiter {
    /// The limits of `config`, their quotas from `store`.
    pub(crate) fn new(config: &Config, store: Arc<Store>) -> Limiter {
        let limits = config
            .limits
            .iter()
            .map(|(name, policy)| {
                let limit = Limit {
                    policy: policy.clone(),
                    buckets: parking_lot::Mutex::new(HashMap::new()),
                };
                (name.clone(), Arc::new(limit))
            })
            .collect();
        let replica: String = (0..16).map(|_| format!("{:x}", rand::random::<u8>() & 0xf)).collect();
        Limiter {
            limits,
            store,
            replica: Arc::from(replica),
        }
    }

    /// The limits a route lists, in order.
    pub(crate) fn for_route(&self, names: &[String]) -> Vec<Arc<Limit>> {
        names.iter().filter_map(|n| self.limits.get(n).cloned()).collect()
    }

    /// Admits a request (`input`, which may use `tokens`) on every limit of `limits`, at `now_ms`
    /// (unix ms): the pass it holds until its response ends, or the limit that refused it (what
    /// it took of the others given back).
    pub(crate) async fn admit(
        &self,
        limits: &[Arc<Limit>],
        input: &KeyInput<'_>,
        tokens: u64,
        now_ms: u64,
    ) -> Result<Pass, Refused> {
        let mut pass = Pass {
            held: Vec::with_capacity(limits.len()),
            store: self.store.clone(),
            replica: self.replica.clone(),
        };
        for limit in limits {
            let bucket = key::bucket(&limit.policy.key, &limit.policy.name, input);
            match self.admit_one(limit, bucket, tokens, now_ms).await {
                Ok(held) => pass.held.push((limit.clone(), bucket, held)),
                Err(retry_after_ms) => {
                    return Err(Refused {
                        limit: limit.policy.name.clone(),
                        retry_after: Duration::from_millis(retry_after_ms),
                    })
                }
            }
        }
        Ok(pass)
    }

    /// One limit's admission: from the leases in hand, else after a lease (one round trip).
    async fn admit_one(&self, limit: &Limit, bucket: BucketKey, tokens: u64, now_ms: u64) -> Result<Held, u64> {
        // At most one lease per quota and one slot request per admission: a fleet that grants
        // nothing more ends it.
        for _ in 0..4 {
            let step = {
                let mut buckets = limit.buckets.lock();
                if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(&bucket) {
                    buckets.retain(|_, b| now_ms.saturating_sub(b.used_ms) < 120_000);
                }
                buckets
                    .entry(bucket)
                    .or_insert_with(|| Bucket::new(&limit.policy, 1))
                    .try_admit(now_ms, tokens)
            };
            match step {
                Step::Held(held) => return Ok(held),
                Step::Over { retry_after_ms } => return Err(retry_after_ms),
                Step::Lease(quota, lease) => {
                    let grant = self.lease(limit, bucket, quota, lease).await;
                    let mut buckets = limit.buckets.lock();
                    if let Some(l) = buckets.get_mut(&bucket).and_then(|b| b.ledger(quota)) {
                        l.grant(now_ms, grant);
                    }
                }
                Step::Slots { want, held } => {
                    let total = self.hold_slots(limit, bucket, held + want).await;
                    let mut buckets = limit.buckets.lock();
                    if let Some(s) = buckets.get_mut(&bucket).and_then(|b| b.slots.as_mut()) {
                        s.grant(total.saturating_sub(held));
                    }
                }
            }
        }
        Err(1000)
    }

    /// A lease from the store; with Redis away, nothing (the request is refused until it is
    /// back: `redis_down` is next).
    async fn lease(&self, limit: &Limit, bucket: BucketKey, quota: Quota, lease: Lease) -> Grant {
        let ledger_limit = match quota {
            Quota::Requests => limit.policy.requests_per_minute,
            Quota::Tokens => limit.policy.tokens_per_minute,
        }
        .unwrap_or(0);
        let id = counter(limit, bucket, quota, lease.window);
        match self
            .store
            .lease(&id, lease.want, ledger_limit, window_ttl(lease.window))
            .await
        {
            Ok(g) => Grant {
                window: lease.window,
                granted: g.granted,
                left: ledger_limit.saturating_sub(g.fleet_used),
            },
            Err(e) => {
                log_store_error(&limit.policy.name, &e);
                Grant {
                    window: lease.window,
                    granted: 0,
                    left: 0,
                }
            }
        }
    }

    async fn hold_slots(&self, limit: &Limit, bucket: BucketKey, total: u64) -> u64 {
        let cap = u64::from(limit.policy.concurrent.unwrap_or(0));
        let b = bucket.to_string();
        match self
            .store
            .hold_slots((&limit.policy.name, &b), &self.replica, total, (cap, SLOT_TTL))
            .await
        {
            Ok(n) => n,
            Err(e) => {
                log_store_error(&limit.policy.name, &e);
                0
            }
        }
    }
}

fn counter(limit: &Limit, bucket: BucketKey, quota: Quota, window: Window) -> CounterId {
    CounterId {
        limit: limit.policy.name.clone(),
        bucket: bucket.to_string(),
        quota: quota.name(),
        window: window.index,
    }
}

/// A window's counter lives until the window ends, plus a minute.
fn window_ttl(window: Window) -> Duration {
    Duration::from_secs(window.period.nominal_secs() + 60)
}

fn log_store_error(limit: &str, e: &RedisError) {
    tracing::warn!(limit, error = %e, "limit store unavailable: request refused");
}

/// What an admitted request holds of its limits until its response ends: settled on drop with
/// the tokens it used (`used_tokens`, else what it reserved stays spent), its slots released.
pub(crate) struct Pass {
    held: Vec<(Arc<Limit>, BucketKey, Held)>,
    store: Arc<Store>,
    replica: Arc<str>,
}

impl Pass {
    /// The `RateLimit-Policy` and `RateLimit` fields of the tightest limit the request passed,
    /// as of `now_ms`.
    pub(crate) fn headers(&self, now_ms: u64) -> Option<(http::HeaderValue, http::HeaderValue)> {
        let mut statuses = Vec::new();
        let mut guards = Vec::with_capacity(self.held.len());
        for (limit, bucket, _) in &self.held {
            guards.push((limit, limit.buckets.lock(), *bucket));
        }
        for (limit, buckets, bucket) in &guards {
            let Some(b) = buckets.get(bucket) else { continue };
            let name = limit.policy.name.as_str();
            let window = Period::Minute.window(now_ms);
            for (ledger, unit) in [(&b.requests, Unit::Requests), (&b.tokens, Unit::Tokens)] {
                if let Some(l) = ledger {
                    statuses.push(Status {
                        name,
                        unit,
                        quota: l.limit(),
                        window_secs: Some(Period::Minute.nominal_secs()),
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

    /// Settles every limit with the tokens the request used (`None`: unknown, the reservation
    /// stays spent), at `now_ms`, and releases its slots. What went beyond a lease is reported
    /// to the fleet in the background.
    pub(crate) fn settle(mut self, used_tokens: Option<u64>, now_ms: u64) {
        self.settle_held(used_tokens, now_ms);
    }

    fn settle_held(&mut self, used_tokens: Option<u64>, now_ms: u64) {
        for (limit, bucket, held) in std::mem::take(&mut self.held) {
            let mut excess = 0;
            let mut window = None;
            let mut slots_after = None;
            {
                let mut buckets = limit.buckets.lock();
                let Some(b) = buckets.get_mut(&bucket) else { continue };
                if let (Some(l), Some(r)) = (b.requests.as_mut(), held.requests) {
                    l.settle(now_ms, r, 1);
                }
                if let (Some(l), Some(r)) = (b.tokens.as_mut(), held.tokens) {
                    let reserved = r.reserved();
                    window = Some(r.window());
                    excess = l.settle(now_ms, r, used_tokens.unwrap_or(reserved)).excess;
                }
                if let (Some(s), Some(slot)) = (b.slots.as_mut(), held.slot) {
                    if s.release(slot) > 0 {
                        slots_after = Some(s.in_use() + s.free());
                    }
                    // A slot was freed: the next request asks the fleet again.
                    s.ask_again();
                }
            }
            let store = self.store.clone();
            let replica = self.replica.clone();
            if excess > 0 || slots_after.is_some() {
                crate::tasks::spawn("limit settle", async move {
                    if let Some(w) = window.filter(|_| excess > 0) {
                        let id = counter(&limit, bucket, Quota::Tokens, w);
                        let _ = store
                            .adjust(&id, i64::try_from(excess).unwrap_or(i64::MAX), window_ttl(w))
                            .await;
                    }
                    if let Some(total) = slots_after {
                        let cap = u64::from(limit.policy.concurrent.unwrap_or(0));
                        let b = bucket.to_string();
                        let _ = store
                            .hold_slots((&limit.policy.name, &b), &replica, total, (cap, SLOT_TTL))
                            .await;
                    }
                });
            }
        }
    }
}

impl Drop for Pass {
    /// A pass dropped unsettled (the request ended before its usage was known): its
    /// reservations stay spent, its slots are released.
    fn drop(&mut self) {
        if !self.held.is_empty() {
            self.settle_held(None, crate::time::now_unix_ms());
        }
    }
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
        Limiter::new(&config, Arc::new(Store::local()))
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

    /// 12:00:10 UTC on some day: 50 s left in the minute.
    const NOW: u64 = 1_796_385_610_000;

    #[tokio::test]
    async fn requests_per_minute_admits_the_limit_then_refuses_until_the_window_ends() {
        let l = limiter("requests_per_minute = 3");
        let limits = l.for_route(&["team".into()]);
        let (a, b) = (team("a"), team("b"));
        let mut passes = Vec::new();
        for _ in 0..3 {
            passes.push(l.admit(&limits, &input(&a), 0, NOW).await.expect("admitted"));
        }
        let refused = l.admit(&limits, &input(&a), 0, NOW).await.err().expect("refused");
        assert_eq!(refused.limit, "team");
        assert_eq!(refused.retry_after, Duration::from_secs(50));
        // Another team has its own bucket.
        assert!(l.admit(&limits, &input(&b), 0, NOW).await.is_ok());
        // A request that ended does not give back its request: it was made.
        for p in passes {
            p.settle(None, NOW + 500);
        }
        assert!(l.admit(&limits, &input(&a), 0, NOW + 1000).await.is_err());
        // The next minute starts afresh.
        assert!(l.admit(&limits, &input(&a), 0, NOW + 50_000).await.is_ok());
    }

    #[tokio::test]
    async fn tokens_are_reserved_then_settled_from_the_usage() {
        let l = limiter("tokens_per_minute = 1000");
        let limits = l.for_route(&["team".into()]);
        let a = team("a");
        let first = l.admit(&limits, &input(&a), 800, NOW).await.expect("admitted");
        assert!(
            l.admit(&limits, &input(&a), 300, NOW).await.is_err(),
            "800 + 300 reserved > 1000"
        );
        // It used 100 of its 800: 700 come back.
        first.settle(Some(100), NOW + 10);
        let second = l.admit(&limits, &input(&a), 800, NOW + 20).await.expect("admitted");
        // Used more than reserved: the excess counts, and the window is over the limit.
        second.settle(Some(950), NOW + 30);
        assert!(l.admit(&limits, &input(&a), 1, NOW + 40).await.is_err());
    }

    #[tokio::test]
    async fn concurrent_requests_wait_for_a_slot_to_be_released() {
        let l = limiter("concurrent = 2");
        let limits = l.for_route(&["team".into()]);
        let a = team("a");
        let one = l.admit(&limits, &input(&a), 0, NOW).await.expect("one");
        let _two = l.admit(&limits, &input(&a), 0, NOW).await.expect("two");
        assert!(l.admit(&limits, &input(&a), 0, NOW).await.is_err());
        drop(one); // the response ended, however it ended
        assert!(l.admit(&limits, &input(&a), 0, NOW).await.is_ok());
    }
}
