//! The idempotency store contract, and the in-memory implementation (one replica, bounded,
//! TTL-evicted). The Redis implementation is in [`super::redis_store`]; both pass one test suite.
//!
//! A record is: absent → in progress (a lease held by an owner token) → completed (the response
//! kept, or "completed, not kept" when it was too large). Every transition after the claim checks
//! the owner, so a stale owner can never overwrite a newer one.

use foldhash::HashMap;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::fingerprint::{Fingerprint, RecordKey};
use super::liveness::Owner;
use crate::redis::RedisError;
use crate::time::{self, Instant};

pub(crate) use super::kept::KeptHeaders;

/// A response kept for replay. Two are equal when they are the same response, whenever each
/// was read (`age` aside).
#[derive(Debug, Clone)]
pub struct StoredResponse {
    pub status: u16,
    /// Allowlisted headers only.
    pub headers: KeptHeaders,
    pub body: Bytes,
    /// How long ago it was stored, as read (zero when it is written, or not known).
    pub age: Duration,
}

impl PartialEq for StoredResponse {
    fn eq(&self, other: &Self) -> bool {
        (self.status, &self.headers, &self.body) == (other.status, &other.headers, &other.body)
    }
}

impl Eq for StoredResponse {}

impl StoredResponse {
    /// An estimate of the memory it holds (body, headers, bookkeeping).
    pub(crate) fn size(&self) -> usize {
        self.body.len() + self.headers.text_len() + 64
    }
}

/// What `begin` found (claim-or-lookup, one round trip).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// The caller now owns the key (it was absent, or already held by this same owner).
    Claimed,
    /// Another request holds the key; its lease has this long left. `owner`: its owner token
    /// (names the relay of its response to followers on other replicas; empty if unknown).
    InProgress { lease_left: Duration, owner: Owner },
    /// The original completed: replay this.
    Completed(StoredResponse),
    /// The original completed but its response was too large to keep.
    NotKept,
    /// The key is known with another fingerprint.
    Mismatch,
}

/// How a claimed request ended.
#[derive(Debug, Clone)]
pub enum Completion {
    Kept(StoredResponse),
    NotKept,
}

/// The store could not answer (Redis down or slower than `command_timeout`), or answered what
/// cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis did not answer, or refused the command: the cause is kept.
    #[error("idempotency store unavailable: {0}")]
    Redis(#[from] RedisError),
    /// A script's reply this build cannot read (a corrupted record, another version's script).
    #[error("idempotency store unavailable: unexpected reply from {0}")]
    UnexpectedReply(&'static str),
    /// A script ran after its caller gave up on it (Redis's clock past the caller's deadline):
    /// it changed nothing.
    #[error("idempotency store unavailable: {0} ran after its caller gave up")]
    Late(&'static str),
}

impl StoreError {
    /// Whether the command was sent and may still run (it timed out, or its connection broke
    /// after it was written): a claim made this way is released once the store answers again.
    pub(crate) fn maybe_applied(&self) -> bool {
        match self {
            StoreError::Redis(RedisError::NotConnected | RedisError::Connect { .. } | RedisError::Sentinel(_)) => false,
            StoreError::Redis(RedisError::Timeout { .. } | RedisError::NotReplicated { .. }) => true,
            StoreError::Redis(RedisError::Command { source, .. }) => source.is_io_error() || source.is_timeout(),
            StoreError::UnexpectedReply(_) | StoreError::Late(_) => false,
        }
    }
}

/// The operations the idempotency semantics need. Keys are already hashed; owners are random.
pub trait Store: Send + Sync + 'static {
    /// Claims `key` for `owner` with a lease, or reports its state.
    ///
    /// The record key, the fingerprint and the owner are types of their own, so that one cannot
    /// be passed in another's place:
    ///
    /// ```
    /// # use rebound::hooks::idempotency::{Fingerprint, MemoryStore, Owner, RecordKey, Store};
    /// # async fn claim(store: &MemoryStore, key: &RecordKey, fingerprint: &Fingerprint, owner: &Owner) {
    /// let begun = store.begin(key, fingerprint, owner, std::time::Duration::from_secs(30)).await;
    /// # }
    /// ```
    ///
    /// while a key and a fingerprint swapped do not compile:
    ///
    /// ```compile_fail,E0308
    /// # use rebound::hooks::idempotency::{Fingerprint, MemoryStore, Owner, RecordKey, Store};
    /// # async fn claim(store: &MemoryStore, key: &RecordKey, fingerprint: &Fingerprint, owner: &Owner) {
    /// let begun = store.begin(fingerprint, key, owner, std::time::Duration::from_secs(30)).await;
    /// # }
    /// ```
    fn begin(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        owner: &Owner,
        lease: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send;
    /// Extends `owner`'s lease; false when `owner` no longer holds the key.
    fn renew(
        &self,
        key: &RecordKey,
        owner: &Owner,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// Records the outcome of a delivered response, kept for `ttl`. True when it is recorded: now,
    /// by an earlier call of the same owner (safe to repeat), or because the record had gone
    /// (lapsed or lost: nobody holds it, so the delivered response is what a retry must replay).
    /// False when another owner holds or completed the key: nothing is overwritten.
    fn complete(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        owner: &Owner,
        completion: &Completion,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// Frees the key so that a retry can run; false when `owner` did not hold it.
    fn release(&self, key: &RecordKey, owner: &Owner) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// Bounds of the in-memory store.
#[derive(Debug, Clone, Copy)]
pub struct MemoryLimits {
    pub max_entries: usize,
    pub max_bytes: usize,
}

impl Default for MemoryLimits {
    fn default() -> Self {
        MemoryLimits {
            max_entries: 10_000,
            max_bytes: 64 << 20,
        }
    }
}

/// The single-replica store: a bounded map with TTL eviction. Completed records are evicted
/// soonest-expiring first when the bounds are reached; leases are never evicted.
///
/// Every operation is O(log n) under the one mutex, whatever the fill level: the records are in a
/// hash map, and two ordered indexes by `(expiry, insertion sequence)`, one of completed records
/// and one of leases, give the soonest-expiring of each kind without looking at the others.
/// Expired records are purged from the front of the indexes, at most [`PURGE_PER_CALL`] of each
/// kind per call (a record is purged once, so this keeps up with any arrival rate, amortised),
/// and when an insert goes over a bound the front of the completed index is evicted.
///
/// When the store is full of leases only (every record an in-progress request), a new claim is
/// still accepted, over the bound: leases are bounded by the requests in flight and each one
/// lapses within its lease, and refusing would fail a live request for want of room. The next
/// insert past the bound evicts completed records again as soon as there are some.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Memory>>,
    limits: MemoryLimits,
}

/// The most expired records of each kind (completed, leases) one call purges: no call does
/// unbounded work, and since a record is purged only once the purge keeps up, amortised.
pub(crate) const PURGE_PER_CALL: usize = 64;

/// A position in an expiry index: the expiry, then a sequence number that makes it unique.
type Slot = (Instant, u64);

/// When a write to the map happens, and the bounds it must leave the map within (evicting if
/// need be).
#[derive(Clone, Copy)]
struct WriteAt {
    /// The time of the write: a new record's storage time, and what a lapsed lease is lapsed at.
    now: Instant,
    /// The store's bounds, which evictions restore.
    limits: MemoryLimits,
}

struct Memory {
    map: HashMap<RecordKey, Entry>,
    /// Completed records (kept or not kept), soonest-expiring first: the eviction order.
    completed: BTreeMap<Slot, RecordKey>,
    /// In-progress leases, soonest-expiring first: only ever purged once lapsed, never evicted.
    leases: BTreeMap<Slot, RecordKey>,
    /// The sum of the records' sizes (an estimate of the memory they hold).
    bytes: usize,
    /// Response-cache entries (completed `cache:` records) and their body bytes.
    cache: (usize, usize),
    /// The next insertion sequence number.
    seq: u64,
}

struct Entry {
    /// When it was inserted or completed (a completed record's age).
    stored: Instant,
    /// Its fingerprint, and the claim's owner (kept after completion so that a repeated
    /// completion is recognised).
    ids: Ids,
    state: MemState,
    expires: Instant,
    /// Its insertion sequence number: `(expires, seq)` is its slot in its index.
    seq: u64,
}

/// A record's fingerprint and its claim's owner token in one block (`{fingerprint}{owner}`): a
/// full store evicts a record per insert, and each block it frees is cold by then.
struct Ids {
    text: Box<str>,
    /// Where the owner token starts.
    split: usize,
}

impl Ids {
    fn new(fingerprint: &Fingerprint, owner: &Owner) -> Ids {
        let (fingerprint, owner) = (fingerprint.as_str(), owner.as_str());
        let mut text = String::with_capacity(fingerprint.len() + owner.len());
        text.push_str(fingerprint);
        text.push_str(owner);
        Ids {
            text: text.into_boxed_str(),
            split: fingerprint.len(),
        }
    }

    fn fingerprint(&self) -> &str {
        self.text.get(..self.split).unwrap_or_default()
    }

    fn owner(&self) -> &str {
        self.text.get(self.split..).unwrap_or_default()
    }
}

enum MemState {
    InProgress,
    Completed(StoredResponse),
    NotKept,
}

impl Entry {
    fn size(&self) -> usize {
        match &self.state {
            MemState::Completed(r) => r.size(),
            _ => 128,
        }
    }

    fn is_lease(&self) -> bool {
        matches!(self.state, MemState::InProgress)
    }

    fn held_by(&self, owner: &Owner) -> bool {
        self.is_lease() && self.ids.owner() == owner.as_str()
    }

    fn slot(&self) -> Slot {
        (self.expires, self.seq)
    }

    /// The body bytes of a response-cache entry (a completed `cache:` record), else `None`.
    fn cached_body(&self, key: &str) -> Option<usize> {
        match &self.state {
            MemState::Completed(r) if key.starts_with("cache:") => Some(r.body.len()),
            _ => None,
        }
    }
}

impl MemoryStore {
    pub fn new(limits: MemoryLimits) -> MemoryStore {
        MemoryStore {
            inner: Arc::new(Mutex::new(Memory {
                map: HashMap::default(),
                completed: BTreeMap::new(),
                leases: BTreeMap::new(),
                bytes: 0,
                cache: (0, 0),
                seq: 0,
            })),
            limits,
        }
    }

    /// Runs `f` under the lock, after purging at most [`PURGE_PER_CALL`] expired records of each kind.
    fn with<T>(&self, f: impl FnOnce(&mut Memory, Instant) -> T) -> T {
        let mut m = self.inner.lock();
        let now = time::now();
        m.purge(now, PURGE_PER_CALL);
        f(&mut m, now)
    }

    /// Live records (for tests and metrics). Not on the request path: it purges every expired
    /// record first (each is purged once, from the front of its index, so its cost is the expired
    /// records it frees, never the live ones), then reads the map's own count.
    pub fn len(&self) -> usize {
        let mut m = self.inner.lock();
        m.purge(time::now(), usize::MAX);
        m.map.len()
    }

    /// The response-cache entries held and their body bytes.
    pub(crate) fn cache_usage(&self) -> (usize, usize) {
        let mut m = self.inner.lock();
        m.purge(time::now(), usize::MAX);
        m.cache
    }

    /// Whether no live record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Memory {
    /// The record for `key` unless it has expired (an expired one is removed).
    fn live(&mut self, key: &str, now: Instant) -> Option<&Entry> {
        if self.map.get(key).is_some_and(|e| e.expires <= now) {
            self.remove(key);
        }
        self.map.get(key)
    }

    fn index(&mut self, lease: bool) -> &mut BTreeMap<Slot, RecordKey> {
        if lease {
            &mut self.leases
        } else {
            &mut self.completed
        }
    }

    /// Removes `key`'s record and its index slot; the key's shared name is handed back.
    fn remove(&mut self, key: &str) -> Option<RecordKey> {
        let (name, e) = self.map.remove_entry(key)?;
        self.index(e.is_lease()).remove(&e.slot());
        self.bytes = self.bytes.saturating_sub(e.size());
        if let Some(body) = e.cached_body(key) {
            self.cache = (self.cache.0.saturating_sub(1), self.cache.1.saturating_sub(body));
        }
        Some(name)
    }

    /// Inserts (or replaces) `key`'s record, then evicts until the bounds hold again.
    fn insert(&mut self, key: &RecordKey, ids: Ids, state: MemState, expires: Instant, at: WriteAt) {
        // The caller's key is shared, not copied (the claim and its live response hold it too).
        self.remove(key.as_str());
        let name = key.clone();
        self.seq += 1;
        let entry = Entry {
            stored: at.now,
            ids,
            state,
            expires,
            seq: self.seq,
        };
        self.bytes += entry.size();
        if let Some(body) = entry.cached_body(key.as_str()) {
            self.cache = (self.cache.0 + 1, self.cache.1 + body);
        }
        self.index(entry.is_lease()).insert(entry.slot(), name.clone());
        self.map.insert(name, entry);
        self.evict(at.limits, at.now);
    }

    /// Inserts a claim: `owner`'s lease on `key` until `expires`.
    fn insert_lease(
        &mut self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        owner: &Owner,
        expires: Instant,
        at: WriteAt,
    ) {
        let ids = Ids::new(fingerprint, owner);
        self.insert(key, ids, MemState::InProgress, expires, at);
    }

    /// Turns `key`'s lease (ours: checked by the caller) into its completed record in place: its
    /// key, fingerprint and owner are kept, not copied again. Then evicts until the bounds hold.
    fn complete_lease(&mut self, key: &str, state: MemState, expires: Instant, at: WriteAt) {
        let Some(e) = self.map.get_mut(key) else {
            return;
        };
        let name = self.leases.remove(&(e.expires, e.seq));
        self.seq += 1;
        self.bytes = self.bytes.saturating_sub(e.size());
        e.state = state;
        e.stored = at.now;
        e.expires = expires;
        e.seq = self.seq;
        self.bytes += e.size();
        if let Some(body) = e.cached_body(key) {
            self.cache = (self.cache.0 + 1, self.cache.1 + body);
        }
        let slot = (e.expires, e.seq);
        let name = name.unwrap_or_else(|| RecordKey::new(key));
        self.completed.insert(slot, name);
        self.evict(at.limits, at.now);
    }

    /// Moves `key`'s record to a new expiry (a lease renewed), keeping its index in order.
    fn set_expiry(&mut self, key: &str, expires: Instant) {
        let Some(e) = self.map.get_mut(key) else {
            return;
        };
        let index = if e.is_lease() {
            &mut self.leases
        } else {
            &mut self.completed
        };
        if let Some(name) = index.remove(&(e.expires, e.seq)) {
            e.expires = expires;
            index.insert((e.expires, e.seq), name);
        }
    }

    /// Removes up to `max` expired records of each kind, soonest-expired first.
    fn purge(&mut self, now: Instant, max: usize) {
        for lease in [false, true] {
            for _ in 0..max {
                let index = self.index(lease);
                let name = match index.first_key_value() {
                    Some(((expires, _), name)) if *expires <= now => name.clone(),
                    _ => break,
                };
                self.remove(name.as_str());
            }
        }
    }

    fn over(&self, limits: MemoryLimits) -> bool {
        self.map.len() > limits.max_entries || self.bytes > limits.max_bytes
    }

    /// While over a bound: drop a lapsed lease if there is one, else the soonest-expiring
    /// completed record. Live leases are never evicted: with only those left, it stops (over the
    /// bound, see [`MemoryStore`]). Each step is O(log n) and removes a record.
    fn evict(&mut self, limits: MemoryLimits, now: Instant) {
        while self.over(limits) {
            let name = match self.leases.first_key_value() {
                Some(((expires, _), name)) if *expires <= now => name.clone(),
                _ => match self.completed.first_key_value() {
                    Some((_, name)) => name.clone(),
                    None => return,
                },
            };
            self.remove(name.as_str());
        }
    }
}

/// The in-memory store answers at once: its operations are synchronous, and the [`Store`] impl
/// wraps them (a caller that knows the store is in memory saves the future).
impl MemoryStore {
    pub(crate) fn begin_now(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        owner: &Owner,
        lease: Duration,
    ) -> Begin {
        let limits = self.limits;
        self.with(|m, now| {
            let found = match m.live(key.as_str(), now) {
                None => None,
                Some(e) if e.ids.fingerprint() != fingerprint.as_str() => Some(Begin::Mismatch),
                Some(e) => Some(match &e.state {
                    MemState::InProgress if e.ids.owner() == owner.as_str() => Begin::Claimed,
                    MemState::InProgress => Begin::InProgress {
                        lease_left: e.expires - now,
                        owner: Owner::new(e.ids.owner()),
                    },
                    MemState::Completed(r) => Begin::Completed(StoredResponse {
                        age: now.saturating_duration_since(e.stored),
                        ..r.clone()
                    }),
                    MemState::NotKept => Begin::NotKept,
                }),
            };
            match found {
                None => {
                    m.insert_lease(key, fingerprint, owner, now + lease, WriteAt { now, limits });
                    Begin::Claimed
                }
                Some(Begin::Claimed) => {
                    // The same owner again: its lease starts over.
                    m.set_expiry(key.as_str(), now + lease);
                    Begin::Claimed
                }
                Some(other) => other,
            }
        })
    }

    /// Claims `key` for a refresh: as [`MemoryStore::begin_now`], except that a completed record
    /// is replaced by the claim (a cache entry too old for the request, or `no-cache`).
    pub(crate) fn reclaim_now(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        owner: &Owner,
        lease: Duration,
    ) -> Begin {
        let limits = self.limits;
        self.with(|m, now| {
            match m.live(key.as_str(), now) {
                Some(e) if e.ids.fingerprint() != fingerprint.as_str() => return Begin::Mismatch,
                Some(e) if e.is_lease() && e.ids.owner() != owner.as_str() => {
                    return Begin::InProgress {
                        lease_left: e.expires - now,
                        owner: Owner::new(e.ids.owner()),
                    }
                }
                _ => {}
            }
            m.insert_lease(key, fingerprint, owner, now + lease, WriteAt { now, limits });
            Begin::Claimed
        })
    }

    pub(crate) fn renew_now(&self, key: &RecordKey, owner: &Owner, lease: Duration) -> bool {
        let key = key.as_str();
        self.with(|m, now| {
            if !m.live(key, now).is_some_and(|e| e.held_by(owner)) {
                return false;
            }
            m.set_expiry(key, now + lease);
            true
        })
    }

    pub(crate) fn complete_now(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        owner: &Owner,
        completion: Completion,
        ttl: Duration,
    ) -> bool {
        let limits = self.limits;
        self.with(|m, now| {
            match m.live(key.as_str(), now) {
                Some(e) if e.ids.owner() != owner.as_str() => return false,
                Some(e) if !e.is_lease() => return true,
                // Ours, or gone (nobody holds it): record the delivered response.
                _ => {}
            }
            let state = match completion {
                Completion::Kept(r) => MemState::Completed(r),
                Completion::NotKept => MemState::NotKept,
            };
            let at = WriteAt { now, limits };
            if m.map.get(key.as_str()).is_some_and(Entry::is_lease) {
                m.complete_lease(key.as_str(), state, now + ttl, at);
            } else {
                m.insert(key, Ids::new(fingerprint, owner), state, now + ttl, at);
            }
            true
        })
    }

    pub(crate) fn release_now(&self, key: &RecordKey, owner: &Owner) -> bool {
        let key = key.as_str();
        self.with(|m, now| {
            if !m.live(key, now).is_some_and(|e| e.held_by(owner)) {
                return false;
            }
            m.remove(key);
            true
        })
    }
}

impl Store for MemoryStore {
    async fn begin(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        Ok(self.begin_now(key, fingerprint, owner, lease))
    }

    async fn renew(&self, key: &RecordKey, owner: &Owner, lease: Duration) -> Result<bool, StoreError> {
        Ok(self.renew_now(key, owner, lease))
    }

    async fn complete(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        owner: &Owner,
        completion: &Completion,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        Ok(self.complete_now(key, fingerprint, owner, completion.clone(), ttl))
    }

    async fn release(&self, key: &RecordKey, owner: &Owner) -> Result<bool, StoreError> {
        Ok(self.release_now(key, owner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::test_ids::{fp, k, own};

    const TTL: Duration = Duration::from_secs(3600);
    const LEASE: Duration = Duration::from_secs(30);

    fn response(body: &str) -> StoredResponse {
        StoredResponse {
            status: 200,
            headers: vec![("content-type".into(), "application/json".into())].into(),
            body: Bytes::from(body.to_string()),
            age: Duration::ZERO,
        }
    }

    fn store(max_entries: usize, max_bytes: usize) -> MemoryStore {
        MemoryStore::new(MemoryLimits { max_entries, max_bytes })
    }

    /// Records held (expired ones not yet purged included), without purging anything.
    fn held(s: &MemoryStore) -> usize {
        s.inner.lock().map.len()
    }

    fn bytes(s: &MemoryStore) -> usize {
        s.inner.lock().bytes
    }

    /// The indexes and the byte count agree with the map (walks it: tests only).
    fn check_consistent(s: &MemoryStore) {
        let m = s.inner.lock();
        assert_eq!(m.map.len(), m.completed.len() + m.leases.len());
        for (name, e) in &m.map {
            let index = if e.is_lease() { &m.leases } else { &m.completed };
            assert_eq!(index.get(&e.slot()), Some(name));
        }
        assert_eq!(m.bytes, m.map.values().map(Entry::size).sum::<usize>());
    }

    async fn put(s: &MemoryStore, key: &str, ttl: Duration) {
        assert_eq!(
            s.begin(&k(key), &fp("fp"), &own("o"), LEASE).await.unwrap(),
            Begin::Claimed
        );
        assert!(s
            .complete(&k(key), &fp("fp"), &own("o"), &Completion::Kept(response(key)), ttl)
            .await
            .unwrap());
    }

    /// Whether `key` holds a live completed record; looks without claiming or purging anything.
    async fn kept(s: &MemoryStore, key: &str) -> bool {
        let m = s.inner.lock();
        m.map
            .get(key)
            .is_some_and(|e| e.expires > time::now() && matches!(e.state, MemState::Completed(_)))
    }

    /// A store error keeps Redis's error as its source (logs and error chains show the cause),
    /// and says as before what failed.
    #[test]
    fn a_store_error_keeps_its_cause() {
        let timeout = Duration::from_millis(5);
        let e = StoreError::from(RedisError::Timeout {
            op: "idem_begin",
            timeout,
        });
        assert_eq!(
            e.to_string(),
            "idempotency store unavailable: redis command idem_begin timed out after 5ms"
        );
        assert!(e.maybe_applied(), "a command that timed out may still run");
        let cause = std::error::Error::source(&e).and_then(|c| c.downcast_ref::<RedisError>());
        assert!(matches!(cause, Some(RedisError::Timeout { .. })));
        assert!(!StoreError::from(RedisError::NotConnected).maybe_applied());
        assert_eq!(
            StoreError::Late("idem_renew_v2").to_string(),
            "idempotency store unavailable: idem_renew_v2 ran after its caller gave up"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn eviction_keeps_the_entry_bound_and_drops_the_soonest_expiring_first() {
        let s = store(100, 1 << 30);
        // 300 records whose expiries are not in insertion order: key i expires at (i * 7919 % 300) s.
        let expiry = |i: u64| Duration::from_secs(1000 + i * 7919 % 300);
        for i in 0..300u64 {
            put(&s, &format!("k{i}"), expiry(i)).await;
            assert!(held(&s) <= 100, "{}", held(&s));
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        check_consistent(&s);
        assert_eq!(s.len(), 100);
        // The survivors are what the policy predicts: each claim takes a slot (a lease is never
        // evicted), so it evicts the soonest-expiring completed record held at that moment.
        let mut model = std::collections::BTreeSet::new();
        for i in 0..300u64 {
            if model.len() == 100 {
                model.pop_first();
            }
            model.insert((i * 7919 % 300, i));
        }
        for i in 0..300u64 {
            let survives = model.contains(&(i * 7919 % 300, i));
            assert_eq!(kept(&s, &format!("k{i}")).await, survives, "k{i}");
        }
        // Mostly the latest-expiring: 90 of the 100 latest expiries are there.
        assert!(model.iter().filter(|(e, _)| *e >= 200).count() >= 90);
    }

    /// Response-cache entries share the store's bounds and eviction; their count and bytes (the
    /// `rebound_cache_*` gauges) follow every insert, completion, refresh, eviction and expiry.
    #[tokio::test(start_paused = true)]
    async fn cache_entries_are_bounded_and_counted_through_eviction_and_expiry() {
        let s = store(50, 1 << 30);
        for i in 0..200u64 {
            put(&s, &format!("cache:{{r:s:{i}}}"), Duration::from_secs(60 + i)).await;
            let (entries, bytes) = s.cache_usage();
            assert!(entries <= 50, "{entries}");
            let held: usize = s
                .inner
                .lock()
                .map
                .iter()
                .filter_map(|(k, e)| e.cached_body(k.as_str()))
                .sum();
            assert_eq!(bytes, held);
        }
        assert_eq!(s.cache_usage().0, 50);
        // A refresh: the entry is claimed over (no longer counted), then completed again.
        let key = "cache:{r:s:199}";
        assert_eq!(s.reclaim_now(&k(key), &fp("fp"), &own("o2"), LEASE), Begin::Claimed);
        assert_eq!(s.cache_usage().0, 49);
        assert!(s.complete_now(
            &k(key),
            &fp("fp"),
            &own("o2"),
            Completion::Kept(response(key)),
            Duration::from_secs(1)
        ));
        assert_eq!(s.cache_usage().0, 50);
        // Idempotency records are not cache entries.
        put(&s, "idem:{r:s:k}", Duration::from_secs(3600)).await;
        assert_eq!(
            s.cache_usage().0,
            49,
            "one cache entry evicted for it, none counted for it"
        );
        tokio::time::advance(Duration::from_secs(400)).await;
        assert_eq!(s.cache_usage(), (0, 0), "every cache entry expired");
        check_consistent(&s);
    }

    #[tokio::test(start_paused = true)]
    async fn eviction_keeps_the_byte_bound() {
        let body = "x".repeat(1000);
        let size = response(&body).size();
        let s = store(10_000, 10 * size);
        for i in 0..50 {
            let key = format!("k{i}");
            assert_eq!(
                s.begin(&k(&key), &fp("fp"), &own("o"), LEASE).await.unwrap(),
                Begin::Claimed
            );
            assert!(s
                .complete(&k(&key), &fp("fp"), &own("o"), &Completion::Kept(response(&body)), TTL)
                .await
                .unwrap());
            assert!(bytes(&s) <= 10 * size, "{}", bytes(&s));
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        check_consistent(&s);
        assert_eq!(s.len(), 10);
        // The ten latest (latest expiries) are the ones kept.
        for i in 0..50 {
            assert_eq!(kept(&s, &format!("k{i}")).await, i >= 40, "k{i}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn leases_are_never_evicted() {
        let s = store(100, 1 << 30);
        for i in 0..40 {
            assert_eq!(
                s.begin(&k(&format!("lease{i}")), &fp("fp"), &own("holder"), LEASE)
                    .await
                    .unwrap(),
                Begin::Claimed
            );
        }
        for i in 0..500 {
            put(&s, &format!("k{i}"), TTL).await;
            assert!(held(&s) <= 100);
        }
        check_consistent(&s);
        for i in 0..40 {
            assert!(matches!(
                s.begin(&k(&format!("lease{i}")), &fp("fp"), &own("other"), LEASE)
                    .await
                    .unwrap(),
                Begin::InProgress { .. }
            ));
            // The owner still holds it: it can complete it.
            assert!(s.renew(&k(&format!("lease{i}")), &own("holder"), LEASE).await.unwrap());
        }
        // The completed records that are left are the newest 60.
        assert!(kept(&s, "k499").await);
        assert!(kept(&s, "k440").await);
        assert!(!kept(&s, "k439").await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_full_of_leases_still_accepts_a_new_claim() {
        let s = store(10, 1 << 30);
        put(&s, "done", TTL).await;
        for i in 0..10 {
            assert_eq!(
                s.begin(&k(&format!("lease{i}")), &fp("fp"), &own("o"), LEASE)
                    .await
                    .unwrap(),
                Begin::Claimed
            );
        }
        // The completed record made room for the tenth lease; then only leases are left.
        assert!(!kept(&s, "done").await);
        assert_eq!(
            s.begin(&k("one-more"), &fp("fp"), &own("o"), LEASE).await.unwrap(),
            Begin::Claimed
        );
        assert_eq!(s.len(), 11, "over the bound by the leases in flight, as documented");
        for i in 0..10 {
            assert!(matches!(
                s.begin(&k(&format!("lease{i}")), &fp("fp"), &own("other"), LEASE)
                    .await
                    .unwrap(),
                Begin::InProgress { .. }
            ));
        }
        // Completing one puts a completed record back in the eviction order: the bound is
        // restored by evicting it, never a lease.
        assert!(s
            .complete(&k("lease0"), &fp("fp"), &own("o"), &Completion::NotKept, TTL)
            .await
            .unwrap());
        assert_eq!(s.len(), 10);
        check_consistent(&s);
        // Once the leases lapse they are purged, and the bound holds again.
        tokio::time::advance(LEASE).await;
        assert_eq!(s.len(), 0);
        check_consistent(&s);
    }

    #[tokio::test(start_paused = true)]
    async fn expired_records_are_purged_a_bounded_number_per_call() {
        let s = store(10_000, 1 << 30);
        for i in 0..1000 {
            put(&s, &format!("k{i}"), Duration::from_secs(60)).await;
        }
        for i in 0..300 {
            assert_eq!(
                s.begin(&k(&format!("lease{i}")), &fp("fp"), &own("o"), LEASE)
                    .await
                    .unwrap(),
                Begin::Claimed
            );
        }
        assert_eq!(held(&s), 1300);
        tokio::time::advance(Duration::from_secs(61)).await;
        // One call purges at most PURGE_PER_CALL of each kind (and here adds one record).
        assert_eq!(
            s.begin(&k("fresh"), &fp("fp"), &own("o"), LEASE).await.unwrap(),
            Begin::Claimed
        );
        assert_eq!(held(&s), 1300 - 2 * PURGE_PER_CALL + 1);
        check_consistent(&s);
        // An expired record is never answered, purged yet or not.
        assert_eq!(
            s.begin(&k("k999"), &fp("fp"), &own("new"), LEASE).await.unwrap(),
            Begin::Claimed
        );
        assert_eq!(
            s.begin(&k("lease299"), &fp("fp"), &own("new"), LEASE).await.unwrap(),
            Begin::Claimed
        );
        // len() counts live records only.
        assert_eq!(s.len(), 3);
        assert_eq!(held(&s), 3);
        check_consistent(&s);
        // Calls keep purging until nothing expired is left.
        tokio::time::advance(TTL).await;
        for _ in 0..2 {
            let _ = s.renew(&k("nothing"), &own("o"), LEASE).await.unwrap();
        }
        assert_eq!(held(&s), 0);
        assert!(s.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn expired_records_make_room_before_live_ones_are_evicted() {
        let s = store(10, 1 << 30);
        for i in 0..5 {
            put(&s, &format!("short{i}"), Duration::from_secs(10)).await;
        }
        for i in 0..5 {
            put(&s, &format!("long{i}"), TTL).await;
        }
        for i in 0..5 {
            assert_eq!(
                s.begin(&k(&format!("lapsing{i}")), &fp("fp"), &own("o"), Duration::from_secs(5))
                    .await
                    .unwrap(),
                Begin::Claimed
            );
        }
        // The five lapsing leases pushed out the five short-lived records (soonest-expiring).
        assert_eq!(held(&s), 10);
        tokio::time::advance(Duration::from_secs(6)).await;
        // The leases have lapsed: they go, no live completed record does.
        for i in 0..5 {
            put(&s, &format!("new{i}"), TTL).await;
        }
        for i in 0..5 {
            assert!(kept(&s, &format!("long{i}")).await, "long{i}");
            assert!(kept(&s, &format!("new{i}")).await, "new{i}");
        }
        check_consistent(&s);
    }

    #[tokio::test(start_paused = true)]
    async fn ownership_is_checked_on_every_transition() {
        let s = store(100, 1 << 30);
        assert_eq!(
            s.begin(&k("k"), &fp("fp"), &own("a"), LEASE).await.unwrap(),
            Begin::Claimed
        );
        // Another owner sees it in progress with the lease left; a mismatch wins over that.
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(
            s.begin(&k("k"), &fp("fp"), &own("b"), LEASE).await.unwrap(),
            Begin::InProgress {
                lease_left: Duration::from_secs(20),
                owner: own("a"),
            }
        );
        assert_eq!(
            s.begin(&k("k"), &fp("other"), &own("b"), LEASE).await.unwrap(),
            Begin::Mismatch
        );
        assert!(!s.renew(&k("k"), &own("b"), LEASE).await.unwrap());
        assert!(!s
            .complete(&k("k"), &fp("fp"), &own("b"), &Completion::NotKept, TTL)
            .await
            .unwrap());
        assert!(!s.release(&k("k"), &own("b")).await.unwrap());
        // The same owner again renews its lease (re-indexed: it does not lapse at the old time).
        assert_eq!(
            s.begin(&k("k"), &fp("fp"), &own("a"), LEASE).await.unwrap(),
            Begin::Claimed
        );
        tokio::time::advance(Duration::from_secs(25)).await;
        assert!(s.renew(&k("k"), &own("a"), LEASE).await.unwrap());
        tokio::time::advance(Duration::from_secs(25)).await;
        assert!(matches!(
            s.begin(&k("k"), &fp("fp"), &own("b"), LEASE).await.unwrap(),
            Begin::InProgress { .. }
        ));
        check_consistent(&s);
        // Lapsed: the next owner takes it, and the stale owner can no longer write.
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(
            s.begin(&k("k"), &fp("fp"), &own("b"), LEASE).await.unwrap(),
            Begin::Claimed
        );
        assert!(!s
            .complete(&k("k"), &fp("fp"), &own("a"), &Completion::Kept(response("stale")), TTL)
            .await
            .unwrap());
        assert!(!s.release(&k("k"), &own("a")).await.unwrap());
        assert!(s
            .complete(&k("k"), &fp("fp"), &own("b"), &Completion::Kept(response("new")), TTL)
            .await
            .unwrap());
        assert_eq!(
            s.begin(&k("k"), &fp("fp"), &own("c"), LEASE).await.unwrap(),
            Begin::Completed(response("new"))
        );
        // Completed records are not leases: no renew or release by anyone; completing again is
        // acknowledged for the owner whose completion landed (a retried write) and overwrites
        // nothing; another owner is refused.
        assert!(!s.renew(&k("k"), &own("b"), LEASE).await.unwrap());
        assert!(!s.release(&k("k"), &own("b")).await.unwrap());
        assert!(s
            .complete(&k("k"), &fp("fp"), &own("b"), &Completion::NotKept, TTL)
            .await
            .unwrap());
        assert!(!s
            .complete(&k("k"), &fp("fp"), &own("c"), &Completion::NotKept, TTL)
            .await
            .unwrap());
        assert_eq!(
            s.begin(&k("k"), &fp("fp"), &own("c"), LEASE).await.unwrap(),
            Begin::Completed(response("new"))
        );
        // A released key is free again.
        assert_eq!(
            s.begin(&k("r"), &fp("fp"), &own("a"), LEASE).await.unwrap(),
            Begin::Claimed
        );
        assert!(s.release(&k("r"), &own("a")).await.unwrap());
        assert_eq!(
            s.begin(&k("r"), &fp("fp"), &own("b"), LEASE).await.unwrap(),
            Begin::Claimed
        );
        // Not kept stays not kept until its ttl ends.
        assert!(s
            .complete(&k("r"), &fp("fp"), &own("b"), &Completion::NotKept, TTL)
            .await
            .unwrap());
        assert_eq!(
            s.begin(&k("r"), &fp("fp"), &own("c"), LEASE).await.unwrap(),
            Begin::NotKept
        );
        tokio::time::advance(TTL).await;
        assert_eq!(
            s.begin(&k("r"), &fp("fp"), &own("c"), LEASE).await.unwrap(),
            Begin::Claimed
        );
        check_consistent(&s);
    }
}
