//! Idempotency keys: a request that repeats a completed `Idempotency-Key` gets the stored response,
//! never a second upstream call. The semantics, in order of checks (docs/idempotency.md):
//!
//! 1. Only POST and PATCH are covered. No key: forwarded unprotected (400 where `require_key`).
//!    A malformed key: 400, nothing stored.
//! 2. The record key hashes the route, the `scope_headers` values (the tenant) and the key.
//! 3. The fingerprint covers method, path, query and canonical body; the same key with another
//!    fingerprint is 422, whatever state the record is in.
//! 4. Completed: replayed with `idempotent-replayed: true`, no upstream call.
//! 5. In progress: held until the original completes (`on_concurrent = "wait"`, bounded backoff,
//!    409 after `wait_timeout`) or 409 at once (`"conflict"`). The claim is a lease renewed while
//!    the original runs.
//! 6. Outcomes outside `store_statuses` release the key so that a retry can run.
//!
//! [`Idempotency::check`] and [`Idempotency::wait`] are steps 1-5 (one store round trip for a
//! fresh key on Redis, none in memory); [`Claim`] carries a fresh request's ownership to its end,
//! where [`Recorder`] tees the response into the store as it streams to the client.

mod cached;
mod canonical;
mod claim;
pub mod fingerprint;
pub mod held;
mod json_digest;
pub mod kept;
pub mod live;
pub mod liveness;
#[cfg(test)]
mod model;
mod recorder;
pub(crate) mod redis_store;
mod rejoin;
mod relay;
pub(crate) mod renewal;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method};
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{IdempotencyPolicy, OnConcurrent, OnStoreError};
use crate::error::ProxyError;
use crate::metrics::{CompletionResult, IdempotencyResult, Metrics, RouteCounters};
use crate::redis::{RedisHandle, ReplicaId};
pub use cached::Freshness;
pub use claim::Claim;
use claim::{ClaimInner, Writer};
pub use fingerprint::{Fingerprint, RecordKey, Scope};
pub use held::Held;
pub use held::HeldCompletion;
pub use live::End;
pub use live::Follower;
pub use live::Head;
pub use live::HeadOrEnd;
pub use live::Live;
pub(crate) use live::Lives;
use liveness::Liveness;
pub use liveness::{DeadOwner, Owner};
pub use recorder::Recorder;
pub use redis_store::{RedisStore, Succession, TakenOver};
pub(crate) use rejoin::Rejoin;
use relay::Relay;
use renewal::Renewals;
pub use store::StoreError;
pub use store::{Begin, Completion, MemoryLimits, MemoryStore, Store, StoredResponse};

/// Response headers kept with a stored response (and replayed). Never `set-cookie`, rate-limit
/// or hop-by-hop headers: they describe the original exchange, not the result.
pub(crate) const KEPT_HEADERS: [&str; 9] = [
    "content-type",
    "content-encoding",
    "content-language",
    "x-request-id",
    "request-id",
    "openai-model",
    "openai-organization",
    "openai-processing-ms",
    "openai-version",
];

/// The longest pause between two looks at an in-progress record while waiting.
const MAX_WAIT_STEP: Duration = Duration::from_millis(500);

/// The first and the longest pause between two tries of a write the store did not answer.
const WRITE_RETRY_FIRST: Duration = Duration::from_millis(50);
const WRITE_RETRY_MAX: Duration = Duration::from_secs(2);

/// The most releases of unanswered claims pending at once (each a small task retrying until the
/// store answers); past it, such a claim is left to its lease (and to the script's `not_after`).
const MAX_ORPHAN_RELEASES: usize = 1024;

/// The store and what this replica holds beside it, for the whole process (survives reloads).
#[derive(Clone)]
pub struct Records {
    pub store: AnyStore,
    /// Delivered responses whose write has not landed yet.
    pub held: Arc<Held>,
    /// Releases of unanswered claims in flight.
    orphan_releases: Arc<AtomicUsize>,
    /// The responses of this replica's in-flight claims, for their followers.
    pub(crate) lives: Arc<Lives>,
    /// Follows originals on other replicas, and relays this one's to their followers (Redis).
    relay: Option<Arc<Relay>>,
    /// The lease renewals of this replica's in-flight claims (one task renews them all).
    pub renewals: Arc<Renewals>,
    /// This replica's id: the first part of its claims' owner tokens.
    replica: ReplicaId,
    /// This replica's heartbeat, and which other replicas are dead (Redis).
    liveness: Option<Arc<Liveness>>,
    /// The fingerprint written into records: version 2, or 1 (`[redis] fingerprint = 1`) while
    /// replicas of earlier builds share the store.
    pub(crate) fingerprint: fingerprint::Version,
}

impl Records {
    pub fn new(store: AnyStore) -> Records {
        Records {
            renewals: Renewals::new(store.clone()),
            store,
            held: Arc::new(Held::default()),
            orphan_releases: Arc::new(AtomicUsize::new(0)),
            lives: Arc::new(Lives::default()),
            relay: None,
            replica: ReplicaId::random(),
            liveness: None,
            fingerprint: fingerprint::Version::V2,
        }
    }

    /// Records on Redis, with the relay of live responses between replicas and this replica's
    /// heartbeat (both started here, both until `stop`).
    pub(crate) fn with_relay(
        store: AnyStore,
        redis: RedisHandle,
        tasks: &TaskTracker,
        stop: CancellationToken,
    ) -> Records {
        let mut records = Records::new(store);
        if redis.fingerprint_version() == 1 {
            records.fingerprint = fingerprint::Version::V1;
        }
        let liveness = Liveness::new(redis.clone(), records.replica.clone());
        liveness.start(tasks, stop.clone());
        let relay = Relay::new(redis, records.lives.clone(), liveness.clone(), tasks.clone(), stop);
        relay.start();
        records.relay = Some(relay);
        records.liveness = Some(liveness);
        records
    }
}

/// One store for the whole process: in memory, or Redis when `[redis]` is configured.
#[derive(Clone)]
pub enum AnyStore {
    Memory(MemoryStore),
    Redis(RedisStore),
}

impl AnyStore {
    /// Whether a completion is acknowledged by replicas before its response ends
    /// (`[redis] wait_replicas` > 0).
    pub(crate) fn waits_for_replicas(&self) -> bool {
        matches!(self, AnyStore::Redis(s) if s.waits_for_replicas())
    }
}

impl Store for AnyStore {
    async fn begin(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        match self {
            AnyStore::Memory(s) => s.begin(key, fingerprint, owner, lease).await,
            AnyStore::Redis(s) => s.begin(key, fingerprint, owner, lease).await,
        }
    }
    async fn renew(&self, key: &RecordKey, owner: &Owner, lease: Duration) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(s) => s.renew(key, owner, lease).await,
            AnyStore::Redis(s) => s.renew(key, owner, lease).await,
        }
    }
    async fn complete(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        owner: &Owner,
        completion: &Completion,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(s) => s.complete(key, fingerprint, owner, completion, ttl).await,
            AnyStore::Redis(s) => s.complete(key, fingerprint, owner, completion, ttl).await,
        }
    }
    async fn release(&self, key: &RecordKey, owner: &Owner) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(s) => s.release(key, owner).await,
            AnyStore::Redis(s) => s.release(key, owner).await,
        }
    }
}

/// A route's idempotency: its policy and the process's store.
pub struct Idempotency {
    pub policy: Arc<IdempotencyPolicy>,
    records: Records,
    metrics: Arc<Metrics>,
    tasks: TaskTracker,
    /// Cancelled when the shutdown grace runs out: writes still pending give up then.
    hard_stop: CancellationToken,
    route: Arc<str>,
    counters: Arc<Counters>,
    /// The response cache's records (keyed by the request's fingerprint), not a client's keys.
    cache: bool,
}

/// What a route's idempotency and response cache share of the process.
struct Shared {
    records: Records,
    metrics: Arc<Metrics>,
    tasks: TaskTracker,
    hard_stop: CancellationToken,
    route: Arc<str>,
}

/// The route's idempotency counters, resolved once (none for the response cache, which counts
/// its own results).
struct Counters {
    /// `rebound_idempotency_requests_total{route,result}`.
    results: Option<RouteCounters>,
    /// `rebound_idempotency_completions_total{route,result}`.
    completions: Option<RouteCounters>,
}

impl Counters {
    fn result(&self, result: IdempotencyResult) {
        if let Some(c) = &self.results {
            c.inc(result.as_str());
        }
    }

    fn completion(&self, result: CompletionResult) {
        if let Some(c) = &self.completions {
            c.inc(result.as_str());
        }
    }
}

/// The original request's idempotency identity, carried by an admin replay (as a request
/// extension): the credential it came with is never stored, only this scope hash, and its query
/// may have been redacted, so both are taken from the original instead of recomputed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReplayIdentity {
    pub scope: Scope,
    pub fingerprint: Fingerprint,
}

/// What to do with a request after the idempotency check.
pub enum Start {
    /// Forward it; nothing is recorded (no key, a method that is not covered, or the store was
    /// unreachable under `on_store_error = "fail_open"`: `bypassed`).
    Forward { bypassed: bool },
    /// This request owns the key: run it, then record or release.
    Claimed(Claim),
    /// The stored response of a completed original.
    Replay(StoredResponse),
    /// The response of the original still in flight, as it is produced (`on_concurrent =
    /// "follow"`).
    Follow(Followed),
    /// Rebound answers (400, 409, 422, 503).
    Refuse(ProxyError),
    /// The record's fingerprint is not this request's, but it may be of the other version
    /// (written before an upgrade, or while `[redis] fingerprint = 1` is being rolled in or out):
    /// check again with that identity ([`Idempotency::identity_of`], `Version::other`).
    CheckOtherVersion,
}

/// What [`Idempotency::check`] found.
pub enum Check {
    /// Decided without waiting.
    Decided(Start),
    /// The store must be asked (Redis), or the key is in progress: [`Idempotency::wait`].
    Wait(Pending),
}

/// A check still to be decided: the record, and this request's claim on it.
pub struct Pending {
    record: RecordKey,
    fingerprint: Fingerprint,
    owner: Owner,
    /// The store's answer so far, when it said "in progress" (lease left, holder).
    first: Option<(Duration, Owner)>,
    /// What a cache lookup accepts of a stored entry (`Any` for idempotency).
    freshness: Freshness,
    /// Claim over a stored entry (a cache refresh) instead of replaying it.
    refresh: bool,
    /// A mismatch may be a record of the other fingerprint version
    /// ([`Start::CheckOtherVersion`]): the store (Redis) outlives an upgrade and is shared by
    /// replicas of both.
    other_version_possible: bool,
}

/// What the store's answer to a claim decided.
enum ClaimAnswer {
    Decided(Start),
    /// Another request holds the key (lease left, its owner): wait, follow, or refuse.
    InProgress {
        lease_left: Duration,
        theirs: Owner,
        pending: Pending,
    },
}

/// What became of a key in progress under another claim, once its replica's liveness was asked.
enum TakeOver {
    /// Its replica is dead, and this request took the key over.
    Claimed(Start),
    /// Its replica is dead, but the record changed meanwhile: look at it again.
    Changed(Pending),
    /// Its replica is alive (or it cannot be told): wait, follow, or refuse as usual.
    Alive(Pending),
}

/// A duplicate following an in-flight original: its head, and its body from byte 0.
pub struct Followed {
    pub head: Head,
    pub body: Follower,
}

impl Idempotency {
    pub fn new(
        policy: Arc<IdempotencyPolicy>,
        records: &Records,
        metrics: Arc<Metrics>,
        tasks: TaskTracker,
        hard_stop: CancellationToken,
        route: Arc<str>,
    ) -> Idempotency {
        // Its series are exported from startup (`Metrics::init_series`).
        let counters = Arc::new(Counters {
            results: Some(RouteCounters::new(
                &metrics.idempotency_requests_total,
                &route,
                &IdempotencyResult::NAMES,
            )),
            completions: Some(RouteCounters::new(
                &metrics.idempotency_completions_total,
                &route,
                &CompletionResult::NAMES,
            )),
        });
        let shared = Shared {
            records: records.clone(),
            metrics,
            tasks,
            hard_stop,
            route,
        };
        Idempotency::assemble(policy, shared, counters, false)
    }

    /// A route's idempotency (or, with `cache`, its response cache) from its parts.
    fn assemble(policy: Arc<IdempotencyPolicy>, s: Shared, counters: Arc<Counters>, cache: bool) -> Idempotency {
        Idempotency {
            policy,
            records: s.records,
            metrics: s.metrics,
            tasks: s.tasks,
            hard_stop: s.hard_stop,
            route: s.route,
            counters,
            cache,
        }
    }

    fn count(&self, result: IdempotencyResult) {
        self.counters.result(result);
    }

    /// The request's identity under fingerprint `version`: the one a dead letter keeps so that
    /// its replay finds the original's record, or (the other version) the one a request checks
    /// again with when its record may have been written with that version.
    pub(crate) fn identity_of(
        &self,
        version: fingerprint::Version,
        parts: &http::request::Parts,
        body: &Bytes,
    ) -> ReplayIdentity {
        let (method, path, query, headers) = (&parts.method, parts.uri.path(), parts.uri.query(), &parts.headers);
        ReplayIdentity {
            scope: self.scope_of(headers, query),
            fingerprint: fingerprint::fingerprint_as(version, method, path, query, headers, body),
        }
    }

    /// The version of the fingerprint this replica writes (`[redis] fingerprint`).
    pub(crate) fn fingerprint_version(&self) -> fingerprint::Version {
        self.records.fingerprint
    }

    /// The tenant scope of a request (a hash of its `scope_headers` values and credential query
    /// parameters).
    pub(crate) fn scope_of(&self, headers: &HeaderMap, query: Option<&str>) -> Scope {
        fingerprint::scope_hash(headers, query, &self.policy.scope_headers)
    }

    /// Checks a request (`parts`, `body`) against the store: claim, replay, hold, or refuse.
    /// `replay` replaces the scope and fingerprint computed from the request (an admin replay
    /// carries the original's). Decided here when no store round trip is needed (the in-memory
    /// store answers at once); otherwise [`Idempotency::wait`] goes on with it.
    pub fn check(&self, parts: &http::request::Parts, body: &Bytes, replay: Option<&ReplayIdentity>) -> Check {
        let p = &self.policy;
        if !matches!(parts.method, Method::POST | Method::PATCH) {
            return Check::Decided(Start::Forward { bypassed: false });
        }
        let key = match fingerprint::request_key(&parts.headers, &p.header) {
            None if p.require_key => {
                self.count(IdempotencyResult::Invalid);
                return Check::Decided(Start::Refuse(ProxyError::IdempotencyKeyRequired {
                    header: p.header.to_string(),
                }));
            }
            None => return Check::Decided(Start::Forward { bypassed: false }),
            Some(Err(e)) => {
                self.count(IdempotencyResult::Invalid);
                return Check::Decided(Start::Refuse(ProxyError::InvalidIdempotencyKey {
                    detail: e.to_string(),
                }));
            }
            Some(Ok(k)) => k,
        };
        let ReplayIdentity { scope, fingerprint } = replay
            .cloned()
            .unwrap_or_else(|| self.identity_of(self.records.fingerprint, parts, body));
        let record = fingerprint::record_key(&self.route, &scope, &key);
        // A delivered response whose write has not landed yet is answered from here.
        if let Some(held) = self.records.held.get(&record) {
            return Check::Decided(self.answer_held(&held, &fingerprint));
        }
        let mut pending = Pending {
            record,
            fingerprint,
            owner: Owner::mint(&self.records.replica),
            first: None,
            freshness: Freshness::Any,
            refresh: false,
            other_version_possible: replay.is_none() && matches!(self.records.store, AnyStore::Redis(_)),
        };
        // In memory, the first look is taken here; a duplicate of an original still in flight
        // waits (or follows it) in `wait`.
        if let AnyStore::Memory(m) = &self.records.store {
            let follows_here =
                p.on_concurrent == OnConcurrent::Follow && self.records.lives.get(&pending.record).is_some();
            if !follows_here {
                let begun = m.begin_now(&pending.record, &pending.fingerprint, &pending.owner, p.lease);
                match self.decide(Ok(begun), pending) {
                    ClaimAnswer::Decided(start) => return Check::Decided(start),
                    ClaimAnswer::InProgress {
                        lease_left,
                        theirs,
                        pending: mut back,
                    } => {
                        // `wait` acts on this answer before it asks again.
                        back.first = Some((lease_left, theirs));
                        pending = back;
                    }
                }
            }
        }
        Check::Wait(pending)
    }

    /// What the store's answer to a claim decides, unless the key is in progress elsewhere
    /// (handed back, with how long its lease has left and who holds it).
    fn decide(&self, begun: Result<Begin, StoreError>, pending: Pending) -> ClaimAnswer {
        let p = &self.policy;
        let start = match begun {
            Err(e) => {
                self.count(IdempotencyResult::StoreError);
                tracing::warn!(route = %self.route, error = %e, "idempotency store unavailable");
                if e.maybe_applied() {
                    // The claim may still run once the store answers: take it back then.
                    self.release_orphan(pending.record, pending.owner);
                }
                match p.on_store_error {
                    OnStoreError::FailClosed => Start::Refuse(ProxyError::StoreUnavailable),
                    OnStoreError::FailOpen => Start::Forward { bypassed: true },
                }
            }
            Ok(Begin::Claimed) => {
                let follow = p.on_concurrent == OnConcurrent::Follow;
                let refresh = pending.refresh;
                let mut claim = self.claim(pending.record, pending.owner, pending.fingerprint, follow);
                claim.refreshed = refresh;
                Start::Claimed(claim)
            }
            Ok(Begin::Completed(r)) => {
                self.count(IdempotencyResult::Replayed);
                Start::Replay(r)
            }
            Ok(Begin::Mismatch) if pending.other_version_possible => Start::CheckOtherVersion,
            Ok(Begin::Mismatch) => {
                self.count(IdempotencyResult::Mismatch);
                Start::Refuse(ProxyError::IdempotencyKeyReused)
            }
            Ok(Begin::NotKept) => {
                self.count(IdempotencyResult::Conflict);
                Start::Refuse(ProxyError::IdempotencyResponseNotKept)
            }
            Ok(Begin::InProgress { lease_left, owner }) => {
                return ClaimAnswer::InProgress {
                    lease_left,
                    theirs: owner,
                    pending,
                }
            }
        };
        ClaimAnswer::Decided(start)
    }

    /// Goes on with a check that needs the store or must wait: follows an original in flight,
    /// or looks again with bounded backoff until it completes, is released, or `wait_timeout`.
    pub async fn wait(&self, mut pending: Pending) -> Start {
        let p = &self.policy;
        let follow = p.on_concurrent == OnConcurrent::Follow;
        let waited_until = crate::time::now() + p.wait_timeout;
        let mut step = Duration::from_millis(20);
        loop {
            let (lease_left, theirs) = match pending.first.take() {
                Some(in_progress) => in_progress,
                None => {
                    // The original runs on this replica: follow it with no store round trip.
                    if let Some(live) = self.records.lives.get(&pending.record).filter(|_| follow) {
                        if live.fingerprint != pending.fingerprint {
                            self.count(IdempotencyResult::Mismatch);
                            return Start::Refuse(ProxyError::IdempotencyKeyReused);
                        }
                        if let Some(start) = self.follow(&live).await {
                            return start;
                        }
                    }
                    let store = &self.records.store;
                    let (record, fp, owner) = (&pending.record, &pending.fingerprint, &pending.owner);
                    let begun = match pending.refresh {
                        true => store.reclaim(record, fp, owner, p.lease).await,
                        false => store.begin(record, fp, owner, p.lease).await,
                    };
                    // A cache entry too old for the request (or not kept): claimed over.
                    if self.cache && !pending.refresh && matches!(&begun, Ok(b) if self.stale(b, pending.freshness)) {
                        pending.refresh = true;
                        continue;
                    }
                    match self.decide(begun, pending) {
                        ClaimAnswer::Decided(start) => return start,
                        ClaimAnswer::InProgress {
                            lease_left,
                            theirs,
                            pending: back,
                        } => {
                            pending = back;
                            (lease_left, theirs)
                        }
                    }
                }
            };
            // The original's replica died (it stopped heartbeating): its key is taken over now,
            // not when its lease ends.
            pending = match self.take_over_dead(pending, &theirs).await {
                TakeOver::Claimed(start) => return start,
                TakeOver::Changed(back) => {
                    pending = back;
                    continue;
                }
                TakeOver::Alive(back) => back,
            };
            // The original runs on another replica: follow it through Redis.
            if let Some(relay) = self.records.relay.as_ref().filter(|_| follow && !theirs.is_empty()) {
                let cap = usize::try_from(p.max_stored_body).unwrap_or(usize::MAX);
                let live = relay.mirror(&pending.record, &theirs, &pending.fingerprint, cap);
                if let Some(start) = self.follow(&live).await {
                    return start;
                }
            }
            let now = crate::time::now();
            if p.on_concurrent == OnConcurrent::Conflict || now + step > waited_until {
                self.count(IdempotencyResult::Conflict);
                let retry_after = lease_left.clamp(Duration::from_secs(1), Duration::from_secs(30));
                return Start::Refuse(ProxyError::IdempotencyInProgress { retry_after });
            }
            // Bounded backoff: duplicates look again at most every 500 ms, never in a
            // tight loop; the original's completion (or release) ends the wait.
            tokio::time::sleep(step).await;
            step = (step * 2).min(MAX_WAIT_STEP);
        }
    }

    /// A key in progress under `theirs`: taken over by this request when that claim's replica is
    /// dead (Redis only; one `EXISTS`, and the takeover when it is dead).
    async fn take_over_dead(&self, mut pending: Pending, theirs: &Owner) -> TakeOver {
        let (Some(liveness), AnyStore::Redis(store)) = (self.records.liveness.as_ref(), &self.records.store) else {
            return TakeOver::Alive(pending);
        };
        if !liveness.is_dead(theirs).await {
            return TakeOver::Alive(pending);
        }
        let p = &self.policy;
        let heir = Succession {
            dead: DeadOwner(theirs),
            owner: &pending.owner,
            lease: p.lease,
            liveness: liveness.ttl(),
        };
        let taken = store.take_over(&pending.record, &pending.fingerprint, heir).await;
        match taken {
            Ok(TakenOver::Yes) => {
                self.count_takeover();
                tracing::warn!(route = %self.route, "idempotency key in progress under a dead replica's claim taken over: the request runs again");
                let follow = p.on_concurrent == OnConcurrent::Follow;
                TakeOver::Claimed(Start::Claimed(self.claim(
                    pending.record,
                    pending.owner,
                    pending.fingerprint,
                    follow,
                )))
            }
            Ok(TakenOver::Changed) => TakeOver::Changed(pending),
            Ok(TakenOver::TooYoung) => TakeOver::Alive(pending),
            Err(e) => {
                tracing::warn!(route = %self.route, error = %e, "idempotency takeover not written");
                if e.maybe_applied() {
                    // It may still run: this request's claim is then released once the store answers.
                    self.release_orphan(pending.record.clone(), pending.owner.clone());
                    pending.owner = Owner::mint(&self.records.replica);
                }
                TakeOver::Alive(pending)
            }
        }
    }

    /// Counts a key taken over from a dead replica's claim (`rebound_idempotency_takeovers_total`).
    fn count_takeover(&self) {
        self.metrics
            .idempotency_takeovers_total
            .with_label_values(&[&*self.route])
            .inc();
    }

    /// Follows an in-flight original from its head on (which may take as long as the original's
    /// attempts: the wait ends with them). `None`: it released the key without a response to
    /// share, so the duplicate goes round again (and usually claims the key).
    async fn follow(&self, live: &Arc<Live>) -> Option<Start> {
        match live.head().await {
            HeadOrEnd::Head(head) => {
                self.count(IdempotencyResult::Followed);
                Some(Start::Follow(Followed {
                    head,
                    body: live.follower(),
                }))
            }
            // A cache entry that outgrew max_entry_size cannot be followed from byte 0: the
            // request goes upstream itself, uncached.
            HeadOrEnd::TooLarge if self.cache => Some(Start::Forward { bypassed: false }),
            HeadOrEnd::TooLarge => {
                self.count(IdempotencyResult::Conflict);
                Some(Start::Refuse(ProxyError::IdempotencyResponseNotKept))
            }
            HeadOrEnd::End(_) => None,
        }
    }

    /// Answers a duplicate of a key whose delivered response this replica still holds.
    fn answer_held(&self, held: &HeldCompletion, fingerprint: &Fingerprint) -> Start {
        if held.fingerprint != *fingerprint {
            self.count(IdempotencyResult::Mismatch);
            return Start::Refuse(ProxyError::IdempotencyKeyReused);
        }
        match &held.completion {
            Completion::Kept(r) => {
                self.count(IdempotencyResult::Replayed);
                Start::Replay(r.clone())
            }
            Completion::NotKept => {
                self.count(IdempotencyResult::Conflict);
                Start::Refuse(ProxyError::IdempotencyResponseNotKept)
            }
        }
    }

    /// Releases a claim whose reply never came (it may have run late, or its reply was lost), as
    /// soon as the store answers again, so that it cannot hold the key for its whole lease.
    fn release_orphan(&self, record: RecordKey, owner: Owner) {
        let pending = self.records.orphan_releases.clone();
        if pending.fetch_add(1, Ordering::AcqRel) >= MAX_ORPHAN_RELEASES {
            pending.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let (writer, lease) = (self.writer(), self.policy.lease);
        self.tasks.spawn(async move {
            writer.release_until_answered(&record, &owner, lease, false).await;
            pending.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// Writes retried until the store answers, on this route's behalf.
    fn writer(&self) -> Writer {
        Writer {
            store: self.records.store.clone(),
            hard_stop: self.hard_stop.clone(),
            route: self.route.clone(),
        }
    }

    /// Takes ownership of a fresh claim: renews its lease until it is recorded or released.
    fn claim(&self, record: RecordKey, owner: Owner, fingerprint: Fingerprint, follow: bool) -> Claim {
        let cap = usize::try_from(self.policy.max_stored_body).unwrap_or(usize::MAX);
        let live = Arc::new(Live::new(record, fingerprint, owner, cap));
        let registered = follow.then(|| self.records.lives.register(live.clone()));
        let renewal = self
            .records
            .renewals
            .renew(live.clone(), self.policy.lease, self.route.clone());
        Claim {
            refreshed: false,
            inner: Some(ClaimInner {
                writer: self.writer(),
                held: self.records.held.clone(),
                policy: self.policy.clone(),
                metrics: self.metrics.clone(),
                counters: self.counters.clone(),
                tasks: self.tasks.clone(),
                live,
                cache: self.cache,
                _registered: registered,
                _renewal: renewal,
            }),
        }
    }
}

/// Identities from text, for the unit tests of this module's files.
#[cfg(test)]
mod test_ids {
    use super::{Fingerprint, Owner, RecordKey};

    pub(super) fn k(text: &str) -> RecordKey {
        RecordKey::new(text)
    }

    pub(super) fn fp(text: &str) -> Fingerprint {
        Fingerprint::new(text)
    }

    pub(super) fn own(text: &str) -> Owner {
        Owner::new(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StatusPattern;
    use crate::wire::body::BoxError;
    use http::HeaderValue;
    use http_body_util::{BodyExt as _, StreamBody};

    /// Follow, 30 s lease, `complete_on_disconnect` off (a crashed task's claim is released).
    fn policy() -> IdempotencyPolicy {
        IdempotencyPolicy {
            name: "t".into(),
            header: http::HeaderName::from_static("idempotency-key"),
            require_key: false,
            ttl: Duration::from_secs(60),
            lease: Duration::from_secs(30),
            on_concurrent: OnConcurrent::Follow,
            wait_timeout: Duration::from_secs(10),
            store_statuses: vec![StatusPattern::Class(2)],
            scope_headers: Vec::new(),
            max_stored_body: 1 << 20,
            complete_on_disconnect: false,
            on_store_error: OnStoreError::FailClosed,
        }
    }

    /// A route's idempotency on the memory store, `complete_on_disconnect` off.
    fn memory_idempotency() -> Idempotency {
        let records = Records::new(AnyStore::Memory(MemoryStore::new(MemoryLimits::default())));
        Idempotency::new(
            Arc::new(policy()),
            &records,
            Arc::new(Metrics::new().unwrap()),
            TaskTracker::new(),
            CancellationToken::new(),
            "r".into(),
        )
    }

    fn keyed() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("idempotency-key", HeaderValue::from_static("k1"));
        h
    }

    fn check(idem: &Idempotency) -> Check {
        let (mut parts, ()) = http::Request::post("/v1/chat").body(()).unwrap().into_parts();
        parts.headers = keyed();
        idem.check(&parts, &Bytes::from_static(b"{}"), None)
    }

    /// On the memory store no other replica can hold a key, but a task of this one
    /// can: one that crashes (panics) while it streams the original's response ends its
    /// followers with an abort (never a clean end) and frees the key at once.
    #[tokio::test]
    async fn a_crashed_task_holds_no_key_in_memory() {
        let idem = memory_idempotency();
        let Check::Decided(Start::Claimed(claim)) = check(&idem) else {
            panic!("a fresh key is claimed");
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, BoxError>>(4);
        let upstream = StreamBody::new(tokio_stream_of(rx));
        let mut response = claim.record(200, &HeaderMap::new(), upstream, None);
        tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"data: 1\n\n"))))
            .await
            .unwrap();
        // The task that streams it reads the first event, then crashes.
        let crashed = crate::tasks::spawn("test", async move {
            let first = response.frame().await.unwrap().unwrap();
            assert_eq!(first.into_data().unwrap(), "data: 1\n\n");
            panic!("the task streaming the original crashed");
        })
        .await;
        assert!(crashed.unwrap_err().is_panic());
        // A duplicate now: the key is free at once, claimed by it (not followed, not held).
        let Check::Decided(Start::Claimed(_second)) = check(&idem) else {
            panic!("the key is free once the task that held it crashed");
        };
        drop(tx);
    }

    /// A follower of an original whose task crashes mid-stream gets its first bytes, then an
    /// abort.
    #[tokio::test]
    async fn a_follower_of_a_crashed_task_ends_with_an_abort() {
        let idem = memory_idempotency();
        let Check::Decided(Start::Claimed(claim)) = check(&idem) else {
            panic!("a fresh key is claimed");
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, BoxError>>(4);
        let mut response = claim.record(200, &HeaderMap::new(), StreamBody::new(tokio_stream_of(rx)), None);
        tx.send(Ok(http_body::Frame::data(Bytes::from_static(b"data: 1\n\n"))))
            .await
            .unwrap();
        response.frame().await.unwrap().unwrap();
        let Check::Wait(pending) = check(&idem) else {
            panic!("an original in flight here is followed");
        };
        let Start::Follow(followed) = idem.wait(pending).await else {
            panic!("followed");
        };
        assert_eq!(followed.head.status, 200);
        let crashed = crate::tasks::spawn("test", async move {
            let _holds = response;
            panic!("the task streaming the original crashed");
        })
        .await;
        assert!(crashed.unwrap_err().is_panic());
        let mut body = followed.body;
        assert_eq!(body.frame().await.unwrap().unwrap().into_data().unwrap(), "data: 1\n\n");
        assert!(body.frame().await.unwrap().is_err(), "an abort, never a clean end");
        drop(tx);
    }

    fn tokio_stream_of<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Send + Unpin {
        Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }
}
