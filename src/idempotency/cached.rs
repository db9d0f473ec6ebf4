//! The records as the response cache uses them: the same claim, recorder, store and live follow
//! as idempotency keys (one way to store and replay a response), keyed by the request's
//! fingerprint instead of a client's key, and with an age a request may refuse.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::fingerprint::{self, Fingerprint, RecordKey};
use super::liveness::Owner;
use super::store::{Begin, StoreError};
use super::{AnyStore, Check, Counters, Idempotency, Pending, Records, Shared, Start};
use crate::config::{CachePolicy, IdempotencyPolicy, OnConcurrent, OnStoreError};
use crate::metrics::Metrics;

/// The lease of a cache claim (renewed while the original runs, like an idempotency key's).
const CACHE_LEASE: Duration = Duration::from_secs(30);

/// What a request accepts of a stored entry (its `cache-control`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// Any entry within its `ttl`.
    Any,
    /// An entry whose age in whole seconds is at most this (`max-age=N`, RFC 9111).
    MaxAge(u64),
    /// None: call upstream and store the new answer (`no-cache`).
    Refresh,
}

impl Freshness {
    fn accepts(self, age: Duration) -> bool {
        match self {
            Freshness::Any => true,
            Freshness::MaxAge(n) => age.as_secs() <= n,
            Freshness::Refresh => false,
        }
    }
}

impl AnyStore {
    /// Claims `key` over a stored entry (a refresh).
    pub(crate) async fn reclaim(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        match self {
            AnyStore::Memory(s) => Ok(s.reclaim_now(key, fingerprint, owner, lease)),
            AnyStore::Redis(s) => s.reclaim(key, fingerprint, owner, lease).await,
        }
    }
}

impl Idempotency {
    /// A route's response cache on the process's records: a claim is made by the first of
    /// identical requests, the others follow it; a response outside `statuses` or over
    /// `max_entry_size` frees the entry; a store that cannot answer lets the request through.
    pub(crate) fn for_cache(
        cache: &CachePolicy,
        records: &Records,
        metrics: Arc<Metrics>,
        tasks: TaskTracker,
        hard_stop: CancellationToken,
        route: Arc<str>,
    ) -> Idempotency {
        let policy = IdempotencyPolicy {
            name: cache.name.clone(),
            header: http::HeaderName::from_static("x-rebound-cache-unused"),
            require_key: false,
            ttl: cache.ttl,
            lease: CACHE_LEASE.min(cache.ttl / 2),
            on_concurrent: OnConcurrent::Follow,
            wait_timeout: Duration::from_secs(120),
            store_statuses: cache.statuses.clone(),
            scope_headers: cache.scope_headers.clone(),
            max_stored_body: cache.max_entry_size,
            complete_on_disconnect: true,
            on_store_error: OnStoreError::FailOpen,
        };
        let shared = Shared {
            records: records.clone(),
            metrics,
            tasks,
            hard_stop,
            route,
        };
        let counters = Arc::new(Counters {
            results: None,
            completions: None,
        });
        Idempotency::assemble(Arc::new(policy), shared, counters, true)
    }

    /// Looks a request up in the cache: a stored entry it accepts is replayed, an identical
    /// request in flight is followed, else the entry is claimed (a miss, or a refresh when an
    /// entry was there but not accepted). GET and POST only; anything else is forwarded.
    pub(crate) fn check_cached(&self, parts: &http::request::Parts, body: &Bytes, freshness: Freshness) -> Check {
        let (method, path, query, headers) = (&parts.method, parts.uri.path(), parts.uri.query(), &parts.headers);
        if !matches!(*method, Method::GET | Method::POST) {
            return Check::Decided(Start::Forward { bypassed: false });
        }
        let scope = self.scope_of(headers, query);
        let fingerprint = fingerprint::fingerprint_as(self.records.fingerprint, method, path, query, headers, body);
        let mut pending = Pending {
            record: fingerprint::cache_record_key(&self.route, &scope, &fingerprint),
            fingerprint,
            owner: Owner::mint(&self.records.replica),
            first: None,
            freshness,
            refresh: freshness == Freshness::Refresh,
            // A cache entry's key is its fingerprint's: one of another version is never found.
            other_version_possible: false,
        };
        if let Some(held) = self.records.held.get(&pending.record).filter(|_| !pending.refresh) {
            if let super::Completion::Kept(r) = &held.completion {
                return Check::Decided(Start::Replay(r.clone()));
            }
        }
        // In memory the store answers at once; an identical request in flight is followed in
        // `wait`, as with Redis.
        let AnyStore::Memory(m) = &self.records.store else {
            return Check::Wait(pending);
        };
        if self.records.lives.get(&pending.record).is_some() {
            return Check::Wait(pending);
        }
        let lease = self.policy.lease;
        let mut begun = match pending.refresh {
            true => m.reclaim_now(&pending.record, &pending.fingerprint, &pending.owner, lease),
            false => m.begin_now(&pending.record, &pending.fingerprint, &pending.owner, lease),
        };
        if !pending.refresh && self.stale(&begun, freshness) {
            pending.refresh = true;
            begun = m.reclaim_now(&pending.record, &pending.fingerprint, &pending.owner, lease);
        }
        match self.decide(Ok(begun), pending) {
            super::ClaimAnswer::Decided(start) => Check::Decided(start),
            super::ClaimAnswer::InProgress {
                lease_left,
                theirs,
                pending: mut back,
            } => {
                back.first = Some((lease_left, theirs));
                Check::Wait(back)
            }
        }
    }

    /// Whether the store's answer is an entry the request does not accept (too old, or a
    /// response that was not kept): it is claimed over instead.
    pub(super) fn stale(&self, begun: &Begin, freshness: Freshness) -> bool {
        match begun {
            Begin::Completed(r) => !freshness.accepts(r.age),
            Begin::NotKept | Begin::Mismatch => true,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_age_counts_whole_seconds_as_rfc_9111() {
        assert!(Freshness::MaxAge(0).accepts(Duration::from_millis(999)));
        assert!(!Freshness::MaxAge(0).accepts(Duration::from_millis(1000)));
        assert!(Freshness::MaxAge(5).accepts(Duration::from_millis(5999)));
        assert!(!Freshness::MaxAge(5).accepts(Duration::from_secs(6)));
        assert!(Freshness::Any.accepts(Duration::from_secs(86_400)));
        assert!(!Freshness::Refresh.accepts(Duration::ZERO));
    }

    #[test]
    fn cache_records_are_apart_from_idempotency_records() {
        let scope = fingerprint::Scope::new("s");
        let cache = fingerprint::cache_record_key("r", &scope, &Fingerprint::new("fp"));
        assert!(cache.as_str().starts_with("cache:{r:s:"), "{cache}");
        assert_ne!(cache, fingerprint::record_key("r", &scope, "fp"));
    }
}
