//! The response cache (`cache = "NAME"` on a route, docs/cache.md): identical requests answered
//! from the store, concurrent identical misses coalesced into one upstream call.
//!
//! It is the idempotency machinery keyed by the request's fingerprint instead of a client's key
//! ([`Idempotency::for_cache`]): the same claim, recorder, store (Redis or the process's memory)
//! and live follow, so a response is stored and replayed one way only. What it adds: the
//! request's `cache-control` ([`control`]), the `x-rebound-cache` result, and its metrics.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::CachePolicy;
use crate::idempotency::{Check, Claim, Followed, Freshness, Idempotency, Records, Start, StoredResponse};
use crate::metrics::{CacheResult, Metrics, RouteCounters};
use crate::wire::body::RequestLog;
use crate::wire::usage::UsageScan;

/// What a request asks of the cache (`cache-control`, RFC 9111 section 5.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// Look up an entry it accepts, and store the answer.
    Use(Freshness),
    /// `no-store`: neither looked up nor stored.
    NoStore,
}

/// The request's `cache-control`: `no-store` wins over everything, then `no-cache`, then the
/// smallest `max-age`; unknown directives and malformed values are ignored.
pub(crate) fn control(headers: &HeaderMap) -> Control {
    let mut freshness = Freshness::Any;
    for value in headers.get_all(http::header::CACHE_CONTROL) {
        let Ok(value) = value.to_str() else { continue };
        for directive in value.split(',') {
            let (name, arg) = match directive.split_once('=') {
                Some((n, a)) => (n.trim(), Some(a.trim().trim_matches('"'))),
                None => (directive.trim(), None),
            };
            match (name.to_ascii_lowercase().as_str(), arg) {
                ("no-store", _) => return Control::NoStore,
                ("no-cache", _) => freshness = Freshness::Refresh,
                ("max-age", Some(n)) => {
                    if let (Ok(n), false) = (n.parse::<u64>(), freshness == Freshness::Refresh) {
                        freshness = match freshness {
                            Freshness::MaxAge(m) => Freshness::MaxAge(m.min(n)),
                            _ => Freshness::MaxAge(n),
                        };
                    }
                }
                _ => {}
            }
        }
    }
    Control::Use(freshness)
}

/// What the cache did with a request.
pub(crate) enum Looked {
    /// Not looked up (`no-store`, a method that is not cached): forwarded, not stored.
    Bypass,
    /// A stored entry: answered without an upstream call.
    Hit(StoredResponse),
    /// An identical request in flight: its response as it is produced.
    Follow(Followed),
    /// Claimed: forward it and store the answer (`refresh`: an entry was replaced).
    Claimed(Claim),
    /// The store could not answer: forwarded, not stored (fail-open).
    StoreError,
}

impl Looked {
    /// The `x-rebound-cache` value.
    pub(crate) fn header_value(&self) -> &'static str {
        let shown = match self {
            Looked::Bypass => CacheResult::Bypass,
            Looked::Hit(_) | Looked::Follow(_) => CacheResult::Hit,
            Looked::Claimed(c) if c.refreshed => CacheResult::Refresh,
            Looked::Claimed(_) | Looked::StoreError => CacheResult::Miss,
        };
        shown.as_str()
    }

    /// The `result` of `rebound_cache_requests_total`.
    fn result(&self) -> &'static str {
        match self {
            Looked::StoreError => CacheResult::StoreError.as_str(),
            other => other.header_value(),
        }
    }
}

/// A route's response cache.
pub(crate) struct Cache {
    records: Idempotency,
    results: RouteCounters,
    metrics: Arc<Metrics>,
    route: Arc<str>,
}

impl Cache {
    pub(crate) fn new(
        policy: &CachePolicy,
        records: &Records,
        metrics: Arc<Metrics>,
        tasks: TaskTracker,
        hard_stop: CancellationToken,
        route: Arc<str>,
    ) -> Cache {
        Cache {
            records: Idempotency::for_cache(policy, records, metrics.clone(), tasks, hard_stop, route.clone()),
            results: RouteCounters::new(&metrics.cache_requests_total, &route, &CacheResult::NAMES),
            metrics,
            route,
        }
    }

    /// Looks a request up (at most one store round trip, and a second only to replace an entry
    /// the request finds too old), and counts the result.
    pub(crate) async fn lookup(&self, parts: &http::request::Parts, body: &Bytes, log: &mut RequestLog) -> Looked {
        let looked = match control(&parts.headers) {
            Control::NoStore => Looked::Bypass,
            Control::Use(freshness) => {
                let check = self.records.check_cached(parts, body, freshness);
                let start = match check {
                    Check::Decided(start) => start,
                    Check::Wait(pending) => Box::pin(self.records.wait(pending)).await,
                };
                match start {
                    Start::Forward { bypassed: true } => Looked::StoreError,
                    Start::Forward { bypassed: false } | Start::Refuse(_) | Start::CheckOtherVersion => Looked::Bypass,
                    Start::Claimed(claim) => Looked::Claimed(claim),
                    Start::Replay(stored) => Looked::Hit(stored),
                    Start::Follow(followed) => Looked::Follow(followed),
                }
            }
        };
        self.results.inc(looked.result());
        log.set_cache(looked.header_value());
        looked
    }

    /// Counts the usage a cached answer reported (read as it passed) as tokens saved (`model`:
    /// the request's label, as for `rebound_tokens_total`).
    pub(crate) fn count_scanned(&self, model: &str, scan: &UsageScan) {
        let Some(usage) = scan.usage() else { return };
        for (kind, n) in ["input", "output", "cache_read", "cache_write"]
            .iter()
            .zip(usage.kinds())
        {
            if n > 0 {
                self.metrics
                    .cache_tokens_saved_total
                    .with_label_values(&[&*self.route, model, kind])
                    .inc_by(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn of(values: &[&str]) -> Control {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(http::header::CACHE_CONTROL, HeaderValue::from_str(v).unwrap());
        }
        control(&h)
    }

    #[test]
    fn cache_control_is_read_as_rfc_9111_says() {
        assert_eq!(of(&[]), Control::Use(Freshness::Any));
        assert_eq!(of(&["no-cache"]), Control::Use(Freshness::Refresh));
        assert_eq!(of(&["No-Store"]), Control::NoStore);
        assert_eq!(of(&["max-age=60, no-store"]), Control::NoStore);
        assert_eq!(of(&["max-age=60"]), Control::Use(Freshness::MaxAge(60)));
        assert_eq!(of(&["max-age=\"60\""]), Control::Use(Freshness::MaxAge(60)));
        assert_eq!(of(&["max-age=60", "max-age=5"]), Control::Use(Freshness::MaxAge(5)));
        assert_eq!(of(&["max-age=0, no-cache"]), Control::Use(Freshness::Refresh));
        assert_eq!(of(&["no-cache", "max-age=5"]), Control::Use(Freshness::Refresh));
        assert_eq!(of(&["max-age=soon, private"]), Control::Use(Freshness::Any));
        assert_eq!(of(&["max-age=-1"]), Control::Use(Freshness::Any));
    }
}
