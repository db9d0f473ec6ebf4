//! A client's own retry, told apart from a new request: a request that repeats one that failed for
//! good moments ago (the same request, with the same credential) gets one attempt, not a fresh
//! set. Clients that do not read `x-should-retry: false` (the Vercel AI SDK by default, LiteLLM's
//! `num_retries`, LangChain's `.with_retry()`, google-genai's `retry_options`) then add their
//! retries to rebound's instead of multiplying them: a provider down for good sees
//! `max_attempts + client retries` calls per app request, not `max_attempts × (1 + client
//! retries)`.
//!
//! Pure: the caller passes the time and the request's key (a hash of the request and its
//! credential's hash, never either); [`RecentFailures`] holds a route's failures for good, each
//! until the time rebound would try again ([`window`]: the failure's `retry-after`, else
//! [`DEFAULT_WINDOW`]). [`ClientRetries`] shares a table between a route's requests behind a
//! lock taken for a lookup or an insert, never across an `.await`, and lets the requests of a
//! route with no recent failure skip the key's hash altogether.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use foldhash::HashMap;
use http::Method;

use crate::credentials::CredentialHash;
use crate::time::Instant;

/// How long a failure for good marks its request when rebound does not know when to try again.
pub(crate) const DEFAULT_WINDOW: Duration = Duration::from_secs(10);

/// The longest a failure marks its request, whatever its `retry-after` says (a quota's reset may
/// be a day away; a client retrying then is a new request).
pub(crate) const MAX_WINDOW: Duration = Duration::from_secs(3600);

/// Failures kept per route at most: when full, the one that expires soonest makes room.
pub(crate) const CAPACITY: usize = 10_000;

/// What a request is known by: 128 bits of a hash of its credential's hash, method, path, query
/// and body.
pub(crate) type RequestKey = [u8; 16];

/// Domain separation: a key made here never equals a hash made for another purpose.
const DOMAIN: &[u8] = b"rebound/client-retry/v1\0";

/// The key of a request: its credential's hash, method, path, query and body, byte for byte (a
/// client's retry sends the bytes it sent before), each part length-prefixed.
pub(crate) fn request_key(
    credential: &CredentialHash,
    method: &Method,
    path: &str,
    query: Option<&str>,
    body: &[u8],
) -> RequestKey {
    let mut h = blake3::Hasher::new();
    h.update(DOMAIN);
    h.update(&credential.0);
    for part in [
        method.as_str().as_bytes(),
        path.as_bytes(),
        query.unwrap_or("").as_bytes(),
        body,
    ] {
        h.update(&(part.len() as u64).to_be_bytes());
        h.update(part);
    }
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize().as_bytes()[..16]);
    out
}

/// How long a failure for good with this `retry_after` marks its request.
pub(crate) fn window(retry_after: Option<Duration>) -> Duration {
    retry_after.unwrap_or(DEFAULT_WINDOW).min(MAX_WINDOW)
}

/// A route's recent failures for good: each request's key, until when a repeat of it is a
/// client's retry. Expired entries are dropped as the table is used; the entries are indexed by
/// expiry too, so that pruning and eviction take the front of that index.
#[derive(Debug)]
pub(crate) struct RecentFailures {
    until: HashMap<RequestKey, Instant>,
    by_expiry: BTreeSet<(Instant, RequestKey)>,
    capacity: usize,
}

impl RecentFailures {
    pub(crate) fn new(capacity: usize) -> RecentFailures {
        RecentFailures {
            until: HashMap::default(),
            by_expiry: BTreeSet::new(),
            capacity: capacity.max(1),
        }
    }

    /// Whether the request `key` repeats a failure for good whose window still runs at `now`.
    pub(crate) fn is_repeat(&self, key: &RequestKey, now: Instant) -> bool {
        self.until.get(key).is_some_and(|until| *until > now)
    }

    /// The request `key` failed for good at `now`: its repeats until `now + window` are a
    /// client's retries (a later failure moves the window on; it never shortens it).
    pub(crate) fn failed(&mut self, key: RequestKey, window: Duration, now: Instant) {
        self.prune(now);
        let until = now + window;
        if let Some(old) = self.until.get(&key).copied() {
            if old >= until {
                return;
            }
            self.by_expiry.remove(&(old, key));
        } else if self.until.len() >= self.capacity {
            if let Some(first) = self.by_expiry.pop_first() {
                self.until.remove(&first.1);
            }
        }
        self.until.insert(key, until);
        self.by_expiry.insert((until, key));
    }

    /// The request `key` succeeded: its repeats are new requests again.
    pub(crate) fn succeeded(&mut self, key: &RequestKey) {
        if let Some(until) = self.until.remove(key) {
            self.by_expiry.remove(&(until, *key));
        }
    }

    /// Drops every entry expired at `now`.
    pub(crate) fn prune(&mut self, now: Instant) {
        while let Some(&(until, key)) = self.by_expiry.first() {
            if until > now {
                break;
            }
            self.by_expiry.pop_first();
            self.until.remove(&key);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.until.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.until.is_empty()
    }
}

/// A route's [`RecentFailures`], shared by its requests.
#[derive(Debug)]
pub(crate) struct ClientRetries {
    table: parking_lot::Mutex<RecentFailures>,
    /// Whether the table may hold an entry: false, a request need not hash itself to know it is
    /// no repeat (the state of nearly every request of a healthy route).
    any: AtomicBool,
}

impl Default for ClientRetries {
    fn default() -> Self {
        ClientRetries::new(CAPACITY)
    }
}

impl ClientRetries {
    pub(crate) fn new(capacity: usize) -> ClientRetries {
        ClientRetries {
            table: parking_lot::Mutex::new(RecentFailures::new(capacity)),
            any: AtomicBool::new(false),
        }
    }

    /// Whether a request may be a repeat: when not, its key need not be made.
    pub(crate) fn may_hold(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    /// Whether the request `key` is a client's retry at `now` (expired entries are dropped).
    pub(crate) fn is_repeat(&self, key: &RequestKey, now: Instant) -> bool {
        let mut table = self.table.lock();
        table.prune(now);
        self.any.store(!table.is_empty(), Ordering::Relaxed);
        table.is_repeat(key, now)
    }

    /// See [`RecentFailures::failed`].
    pub(crate) fn failed(&self, key: RequestKey, window: Duration, now: Instant) {
        let mut table = self.table.lock();
        table.failed(key, window, now);
        self.any.store(true, Ordering::Relaxed);
    }

    /// See [`RecentFailures::succeeded`].
    pub(crate) fn succeeded(&self, key: &RequestKey) {
        let mut table = self.table.lock();
        table.succeeded(key);
        self.any.store(!table.is_empty(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> RequestKey {
        [n; 16]
    }

    #[test]
    fn keys_differ_by_credential_and_by_every_part_of_the_request() {
        let (a, b) = (CredentialHash([1; 16]), CredentialHash([2; 16]));
        let k = |c: &CredentialHash, m: &Method, p: &str, q: Option<&str>, body: &[u8]| request_key(c, m, p, q, body);
        let base = k(&a, &Method::POST, "/v1/chat", None, b"{}");
        assert_eq!(base, k(&a, &Method::POST, "/v1/chat", None, b"{}"));
        for other in [
            k(&b, &Method::POST, "/v1/chat", None, b"{}"),
            k(&a, &Method::PUT, "/v1/chat", None, b"{}"),
            k(&a, &Method::POST, "/v1/chat2", None, b"{}"),
            k(&a, &Method::POST, "/v1/chat", Some("x=1"), b"{}"),
            k(&a, &Method::POST, "/v1/chat", None, b"{ }"),
            // Parts cannot run into each other.
            k(&a, &Method::POST, "/v1/cha", None, b"t{}"),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn a_repeat_within_the_window_is_a_client_retry() {
        let t0 = crate::time::now();
        let mut f = RecentFailures::new(10);
        f.failed(key(1), window(None), t0);
        assert!(f.is_repeat(&key(1), t0 + Duration::from_secs(9)));
        assert!(!f.is_repeat(&key(2), t0 + Duration::from_secs(1)), "another request");
        assert!(!f.is_repeat(&key(1), t0 + DEFAULT_WINDOW), "the window is over");
    }

    #[test]
    fn the_window_is_the_failures_retry_after_within_bounds() {
        assert_eq!(window(None), Duration::from_secs(10));
        assert_eq!(window(Some(Duration::from_secs(30))), Duration::from_secs(30));
        assert_eq!(window(Some(Duration::from_millis(200))), Duration::from_millis(200));
        assert_eq!(window(Some(Duration::from_secs(86_400))), MAX_WINDOW);
    }

    #[test]
    fn a_later_failure_extends_the_window_and_a_success_ends_it() {
        let t0 = crate::time::now();
        let mut f = RecentFailures::new(10);
        f.failed(key(1), Duration::from_secs(10), t0);
        f.failed(key(1), Duration::from_secs(10), t0 + Duration::from_secs(8));
        assert!(f.is_repeat(&key(1), t0 + Duration::from_secs(15)));
        // A shorter window never shortens it.
        f.failed(key(1), Duration::from_secs(1), t0 + Duration::from_secs(9));
        assert!(f.is_repeat(&key(1), t0 + Duration::from_secs(15)));
        assert_eq!(f.by_expiry.len(), 1);
        f.succeeded(&key(1));
        assert!(!f.is_repeat(&key(1), t0 + Duration::from_secs(15)));
        assert!(f.is_empty() && f.by_expiry.is_empty());
    }

    #[test]
    fn a_full_table_drops_what_expires_soonest_and_expired_entries_go() {
        let t0 = crate::time::now();
        let mut f = RecentFailures::new(2);
        f.failed(key(1), Duration::from_secs(5), t0);
        f.failed(key(2), Duration::from_secs(20), t0);
        f.failed(key(3), Duration::from_secs(10), t0);
        assert_eq!(f.len(), 2);
        assert!(!f.is_repeat(&key(1), t0), "evicted: it expired soonest");
        assert!(f.is_repeat(&key(2), t0) && f.is_repeat(&key(3), t0));
        f.prune(t0 + Duration::from_secs(10));
        assert_eq!(f.len(), 1);
        assert!(f.is_repeat(&key(2), t0 + Duration::from_secs(10)));
    }

    #[test]
    fn a_route_without_failures_needs_no_key() {
        let t0 = crate::time::now();
        let c = ClientRetries::new(10);
        assert!(!c.may_hold());
        c.failed(key(1), Duration::from_secs(1), t0);
        assert!(c.may_hold());
        assert!(c.is_repeat(&key(1), t0));
        // Once its entries expire, the route's requests skip the hash again.
        assert!(!c.is_repeat(&key(1), t0 + Duration::from_secs(1)));
        assert!(!c.may_hold());
        c.failed(key(2), Duration::from_secs(1), t0);
        c.succeeded(&key(2));
        assert!(!c.may_hold());
    }
}
