//! The idempotency store contract, and the in-memory implementation (one replica, bounded,
//! TTL-evicted). The Redis implementation is in [`super::redis_store`]; both pass one test suite.
//!
//! A record is: absent → in progress (a lease held by an owner token) → completed (the response
//! kept, or "completed, not kept" when it was too large). Every transition after the claim checks
//! the owner, so a stale owner can never overwrite a newer one.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use crate::time::{self, Instant};

/// A response kept for replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    /// Allowlisted headers only.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl StoredResponse {
    fn size(&self) -> usize {
        self.body.len() + self.headers.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() + 64
    }
}

/// What `begin` found (claim-or-lookup, one round trip).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// The caller now owns the key (it was absent, or already held by this same owner).
    Claimed,
    /// Another request holds the key; its lease has this long left.
    InProgress { lease_left: Duration },
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

/// The store could not answer (Redis down or slower than `command_timeout`).
#[derive(Debug, thiserror::Error)]
#[error("idempotency store unavailable: {message}")]
pub struct StoreError {
    pub message: String,
    /// The command was sent and may still run (it timed out, or its connection broke after it
    /// was written): a claim made this way is released once the store answers again.
    pub maybe_applied: bool,
}

impl StoreError {
    pub fn new(message: impl Into<String>, maybe_applied: bool) -> StoreError {
        StoreError {
            message: message.into(),
            maybe_applied,
        }
    }
}

/// The operations the idempotency semantics need. Keys are already hashed; owners are random.
pub trait Store: Send + Sync + 'static {
    /// Claims `key` for `owner` with a lease, or reports its state.
    fn begin(
        &self,
        key: &str,
        fingerprint: &str,
        owner: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send;
    /// Extends `owner`'s lease; false when `owner` no longer holds the key.
    fn renew(&self, key: &str, owner: &str, lease: Duration) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// Records the outcome of a delivered response, kept for `ttl`. True when it is recorded: now,
    /// by an earlier call of the same owner (safe to repeat), or because the record had gone
    /// (lapsed or lost: nobody holds it, so the delivered response is what a retry must replay).
    /// False when another owner holds or completed the key: nothing is overwritten.
    fn complete(
        &self,
        key: &str,
        fingerprint: &str,
        owner: &str,
        completion: &Completion,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// Frees the key so that a retry can run; false when `owner` did not hold it.
    fn release(&self, key: &str, owner: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;
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
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Memory>>,
    limits: MemoryLimits,
}

struct Memory {
    map: HashMap<String, Entry>,
    bytes: usize,
}

struct Entry {
    fingerprint: String,
    /// The claim's owner; kept after completion so that a repeated completion is recognised.
    owner: String,
    state: MemState,
    expires: Instant,
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
}

impl MemoryStore {
    pub fn new(limits: MemoryLimits) -> MemoryStore {
        MemoryStore {
            inner: Arc::new(Mutex::new(Memory {
                map: HashMap::new(),
                bytes: 0,
            })),
            limits,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Memory, Instant) -> T) -> T {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut m, time::now())
    }

    /// Live records (for tests and metrics).
    pub fn len(&self) -> usize {
        self.with(|m, now| m.map.values().filter(|e| e.expires > now).count())
    }

    /// Whether no live record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Memory {
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Entry> {
        if self.map.get(key).is_some_and(|e| e.expires <= now) {
            self.remove(key);
        }
        self.map.get_mut(key)
    }

    fn remove(&mut self, key: &str) {
        if let Some(e) = self.map.remove(key) {
            self.bytes = self.bytes.saturating_sub(e.size());
        }
    }

    fn insert(&mut self, key: &str, entry: Entry, limits: MemoryLimits, now: Instant) {
        self.remove(key);
        self.bytes += entry.size();
        self.map.insert(key.to_string(), entry);
        if self.map.len() > limits.max_entries || self.bytes > limits.max_bytes {
            self.evict(limits, now);
        }
    }

    fn evict(&mut self, limits: MemoryLimits, now: Instant) {
        let expired: Vec<String> = self
            .map
            .iter()
            .filter(|(_, e)| e.expires <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in expired {
            self.remove(&k);
        }
        if self.map.len() <= limits.max_entries && self.bytes <= limits.max_bytes {
            return;
        }
        let mut completed: Vec<(Instant, String)> = self
            .map
            .iter()
            .filter(|(_, e)| !matches!(e.state, MemState::InProgress))
            .map(|(k, e)| (e.expires, k.clone()))
            .collect();
        completed.sort();
        for (_, k) in completed {
            if self.map.len() <= limits.max_entries && self.bytes <= limits.max_bytes {
                break;
            }
            self.remove(&k);
        }
    }
}

impl Store for MemoryStore {
    async fn begin(&self, key: &str, fingerprint: &str, owner: &str, lease: Duration) -> Result<Begin, StoreError> {
        let limits = self.limits;
        Ok(self.with(|m, now| {
            let Some(entry) = m.live(key, now) else {
                let entry = Entry {
                    fingerprint: fingerprint.to_string(),
                    owner: owner.to_string(),
                    state: MemState::InProgress,
                    expires: now + lease,
                };
                m.insert(key, entry, limits, now);
                return Begin::Claimed;
            };
            if entry.fingerprint != fingerprint {
                return Begin::Mismatch;
            }
            match &entry.state {
                MemState::InProgress if entry.owner == owner => {
                    entry.expires = now + lease;
                    Begin::Claimed
                }
                MemState::InProgress => Begin::InProgress {
                    lease_left: entry.expires - now,
                },
                MemState::Completed(r) => Begin::Completed(r.clone()),
                MemState::NotKept => Begin::NotKept,
            }
        }))
    }

    async fn renew(&self, key: &str, owner: &str, lease: Duration) -> Result<bool, StoreError> {
        Ok(self.with(|m, now| match m.live(key, now) {
            Some(e) if matches!(e.state, MemState::InProgress) && e.owner == owner => {
                e.expires = now + lease;
                true
            }
            _ => false,
        }))
    }

    async fn complete(
        &self,
        key: &str,
        fingerprint: &str,
        owner: &str,
        completion: &Completion,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let limits = self.limits;
        Ok(self.with(|m, now| {
            match m.live(key, now) {
                Some(e) if e.owner != owner => return false,
                Some(e) if !matches!(e.state, MemState::InProgress) => return true,
                // Ours, or gone (nobody holds it): record the delivered response.
                _ => {}
            }
            let state = match completion {
                Completion::Kept(r) => MemState::Completed(r.clone()),
                Completion::NotKept => MemState::NotKept,
            };
            m.insert(
                key,
                Entry {
                    fingerprint: fingerprint.to_string(),
                    owner: owner.to_string(),
                    state,
                    expires: now + ttl,
                },
                limits,
                now,
            );
            true
        }))
    }

    async fn release(&self, key: &str, owner: &str) -> Result<bool, StoreError> {
        Ok(self.with(|m, now| match m.live(key, now) {
            Some(e) if matches!(e.state, MemState::InProgress) && e.owner == owner => {
                m.remove(key);
                true
            }
            _ => false,
        }))
    }
}
