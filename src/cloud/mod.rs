//! Cloud credentials (`auth = "aws" | "gcp" | "azure"`): rebound signs each request to the
//! upstream (SigV4) or sets a bearer token, with a credential it fetches itself from the cloud's
//! default chain. A credential is fetched in the background and held: the request path reads the
//! one held and does no I/O. It is refreshed before it expires (token files re-read each time),
//! after a failure with a growing wait, and at once when the provider says the one sent expired
//! or was revoked ([`CloudAuth::rejected`]).
//!
//! Credentials never reach logs, metrics, Redis or dead letters: what is held is never printed,
//! and errors name the service that failed, not what it answered.

pub(crate) mod aws;
pub(crate) mod azure;
pub(crate) mod fetch;
pub(crate) mod gcp;
pub(crate) mod oauth;
pub(crate) mod sigv4;

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderValue, Request};
use http_body_util::Full;
use parking_lot::Mutex;
use prometheus::IntCounter;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Auth, CloudEnv, UpstreamConfig};
use crate::metrics::Metrics;
use fetch::{Fetch, FetchError};
use sigv4::Keys;

/// A credential as a source hands it out.
pub(crate) enum Credential {
    /// AWS keys, signed into each request.
    Aws(Keys),
    /// `Bearer <token>` (Google's and Entra ID's access tokens), set as `authorization`; marked
    /// sensitive, so that `http`'s `Debug` never prints it.
    Bearer(HeaderValue),
}

/// A credential and when it expires (`None`: it does not, e.g. keys in the environment).
pub(crate) struct Issued {
    pub(crate) credential: Credential,
    pub(crate) expires: Option<SystemTime>,
}

/// Why a source could not hand out a credential.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SourceError {
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error("cannot read {path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {detail}")]
    Invalid { what: &'static str, detail: String },
}

/// Where an upstream's credential comes from.
pub(crate) trait Source: Send + Sync {
    /// Fetches a fresh credential (files re-read, services asked).
    fn fetch<'a>(&'a self, http: &'a Fetch) -> BoxFuture<'a, Result<Issued, SourceError>>;
}

/// How the held credential goes on a request.
enum Signing {
    /// SigV4 for this host, region and service.
    Aws {
        host: String,
        region: String,
        service: String,
    },
    /// The token as `authorization: Bearer <token>`.
    Bearer,
}

/// Why a request cannot carry the upstream's credential now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unavailable {
    /// The first fetch has not finished yet: worth a short wait.
    Pending,
    /// None is held (the last fetch failed, or what is held has expired).
    Failed,
}

/// Before it expires, a credential is refreshed this long ahead (or at half its life, when that
/// is shorter: a credential of a few minutes is not refreshed in a loop).
const REFRESH_AHEAD: Duration = Duration::from_secs(5 * 60);

/// Waits between failed fetches: doubling from the first, at most the last.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// One upstream's cloud credential: the one held, and its refresher.
pub(crate) struct CloudAuth {
    upstream: Arc<str>,
    signing: Signing,
    source: Box<dyn Source>,
    held: ArcSwapOption<Issued>,
    /// Set when the first fetch has ended, either way.
    tried: std::sync::atomic::AtomicBool,
    /// Wakes the refresher at once (a rejected credential).
    wake: Notify,
    /// Fetches finished (either way), for a request waiting for the one after a rejection.
    fetches: tokio::sync::watch::Sender<u64>,
    /// Stops the refresher when the last user lets go (a reload that no longer names it).
    stop: CancellationToken,
    refreshed_ok: IntCounter,
    refresh_failed: IntCounter,
}

impl Drop for CloudAuth {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl CloudAuth {
    /// Puts the held credential on `req`, whose body hashes to `payload` (SigV4's; unused for a
    /// bearer token), as of `now`.
    pub(crate) fn apply(
        &self,
        req: &mut Request<Full<Bytes>>,
        payload: &str,
        now: SystemTime,
    ) -> Result<(), Unavailable> {
        let held = self.held.load();
        let Some(issued) = held.as_deref().filter(|i| i.expires.is_none_or(|e| e > now)) else {
            return Err(match self.tried.load(std::sync::atomic::Ordering::Acquire) {
                true => Unavailable::Failed,
                false => Unavailable::Pending,
            });
        };
        match (&issued.credential, &self.signing) {
            (Credential::Aws(keys), Signing::Aws { host, region, service }) => {
                let scope = sigv4::Scope {
                    host,
                    region,
                    service,
                    time: now,
                };
                sigv4::sign_request(req, payload, keys, &scope).map_err(|e| {
                    tracing::warn!(upstream = %self.upstream, error = %e, "request not signed");
                    Unavailable::Failed
                })
            }
            (Credential::Bearer(token), Signing::Bearer) => {
                req.headers_mut().insert(http::header::AUTHORIZATION, token.clone());
                Ok(())
            }
            // A source hands out its cloud's kind of credential: a mismatch is a bug, and no
            // request goes out with the wrong one.
            (Credential::Aws(_), Signing::Bearer) | (Credential::Bearer(_), Signing::Aws { .. }) => {
                tracing::warn!(upstream = %self.upstream, "credential of another kind than the upstream's auth");
                Err(Unavailable::Failed)
            }
        }
    }

    /// Whether this upstream signs its requests (SigV4 needs the body's hash).
    pub(crate) fn signs(&self) -> bool {
        matches!(self.signing, Signing::Aws { .. })
    }

    /// The provider said the credential sent expired or was revoked: the refresher fetches a new
    /// one now (the held one is kept until then: another request may still be accepted with it).
    /// The number of fetches finished so far is returned, for [`CloudAuth::fetched_after`].
    pub(crate) fn rejected(&self) -> u64 {
        let n = *self.fetches.borrow();
        self.wake.notify_one();
        n
    }

    /// Waits until more than `n` fetches have finished (the one a rejection asked for).
    pub(crate) async fn fetched_after(&self, n: u64) {
        let mut rx = self.fetches.subscribe();
        let _ = rx.wait_for(|done| *done > n).await;
    }

    /// Seconds until the held credential expires: 0 when none is held (or it expired), infinite
    /// for one that does not expire (keys in the environment or a file).
    pub(crate) fn expires_in(&self, now: SystemTime) -> f64 {
        match self.held.load().as_ref().map(|i| i.expires) {
            None => 0.0,
            Some(None) => f64::INFINITY,
            Some(Some(at)) => at.duration_since(now).map_or(0.0, |d| d.as_secs_f64()),
        }
    }

    /// Fetches until stopped: at once, then before each expiry.
    async fn refresh(weak: Weak<CloudAuth>, http: Fetch, stop: CancellationToken) {
        let mut failures = 0u32;
        loop {
            let Some(auth) = weak.upgrade() else { return };
            let fetched = auth.source.fetch(&http).await;
            let now = crate::time::wall_now();
            let next = match fetched {
                Ok(issued) => {
                    failures = 0;
                    auth.refreshed_ok.inc();
                    let next = issued.expires.map(|e| refresh_after(now, e));
                    auth.held.store(Some(Arc::new(issued)));
                    next
                }
                Err(e) => {
                    failures += 1;
                    auth.refresh_failed.inc();
                    tracing::warn!(upstream = %auth.upstream, error = %e, failures, "credential not refreshed");
                    Some(retry_wait(failures))
                }
            };
            auth.tried.store(true, std::sync::atomic::Ordering::Release);
            auth.fetches.send_modify(|n| *n += 1);
            let woken = async {
                match next {
                    Some(wait) => {
                        tokio::select! {
                            () = tokio::time::sleep(wait) => {}
                            () = auth.wake.notified() => {}
                        }
                    }
                    None => auth.wake.notified().await,
                }
            };
            tokio::select! {
                () = woken => {}
                () = stop.cancelled() => return,
            }
        }
    }
}

/// Whether an upstream's answer says the credential it was sent expired or was revoked: a 401
/// (Google's and Entra ID's tokens), or AWS's 403 `ExpiredTokenException` /
/// `UnrecognizedClientException` (`x-amzn-errortype`).
pub(crate) fn says_rejected(status: u16, headers: &http::HeaderMap) -> bool {
    let aws = || {
        headers
            .get("x-amzn-errortype")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("ExpiredToken") || t.starts_with("UnrecognizedClient"))
    };
    status == 401 || (status == 403 && aws())
}

/// When to refresh a credential fetched at `now` that expires at `expires`: never sooner than
/// [`RETRY_FIRST`], so that a service handing out credentials that are already expired (or
/// expire at once) is not called in a loop.
fn refresh_after(now: SystemTime, expires: SystemTime) -> Duration {
    let life = expires.duration_since(now).unwrap_or_default();
    life.saturating_sub(REFRESH_AHEAD.min(life / 2)).max(RETRY_FIRST)
}

/// The wait after `failures` failed fetches in a row.
fn retry_wait(failures: u32) -> Duration {
    RETRY_FIRST
        .saturating_mul(1 << failures.saturating_sub(1).min(6))
        .min(RETRY_MAX)
}

/// A token file's or key file's content (re-read at each refresh: the platform rotates it).
pub(crate) fn read(path: &str) -> Result<String, SourceError> {
    std::fs::read_to_string(path).map_err(|source| SourceError::File {
        path: path.to_string(),
        source,
    })
}

/// A secret as a header value, marked sensitive (never printed by `http`'s `Debug`).
pub(crate) fn secret(value: &str, what: &'static str) -> Result<HeaderValue, SourceError> {
    let mut v = HeaderValue::from_str(value).map_err(|_| invalid(what, "a token is not a header value"))?;
    v.set_sensitive(true);
    Ok(v)
}

/// An RFC 3339 time (`2026-12-05T17:00:00Z`), as credential services send expiries.
pub(crate) fn rfc3339(what: &'static str, text: &str) -> Result<SystemTime, SourceError> {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map(SystemTime::from)
        .map_err(|_| invalid(what, "its expiration is not an RFC 3339 time"))
}

pub(crate) fn invalid(what: &'static str, detail: &str) -> SourceError {
    SourceError::Invalid {
        what,
        detail: detail.to_string(),
    }
}

/// Every upstream's cloud credential, across reloads: a reload that keeps an upstream's `auth`
/// and environment keeps its credential (and its refresher).
#[derive(Clone)]
pub(crate) struct Clouds {
    inner: Arc<CloudsInner>,
}

/// An upstream's credential as it was made: for its `auth`, host and environment (a reload that
/// changes any of them makes a new one).
type Known = (Auth, http::uri::Authority, CloudEnv, Weak<CloudAuth>);

struct CloudsInner {
    /// `None` when the HTTPS client could not be built (then no cloud credential can be had).
    http: Option<Fetch>,
    by_upstream: Mutex<HashMap<String, Known>>,
    metrics: Arc<Metrics>,
    tasks: TaskTracker,
    stop: CancellationToken,
}

impl Clouds {
    pub(crate) fn new(metrics: Arc<Metrics>, tasks: TaskTracker, stop: CancellationToken) -> Clouds {
        let http = Fetch::new()
            .inspect_err(|e| tracing::error!(error = %e, "no client for the cloud credential services"))
            .ok();
        Clouds {
            inner: Arc::new(CloudsInner {
                http,
                by_upstream: Mutex::new(HashMap::new()),
                metrics,
                tasks,
                stop,
            }),
        }
    }

    /// The credential of `upstream` (`None` for `auth = "static"`): the one already held for the
    /// same `auth` and environment, else a new one whose refresher starts now.
    pub(crate) fn for_upstream(&self, config: &UpstreamConfig, env: &CloudEnv) -> Option<Arc<CloudAuth>> {
        let (upstream, auth) = (config.name.as_str(), &config.auth);
        let (signing, source) = match auth {
            Auth::Static => return None,
            Auth::Aws(aws) => (
                Signing::Aws {
                    host: config.authority.to_string(),
                    region: aws.region.clone(),
                    service: aws.service.clone(),
                },
                aws::chain(aws, env),
            ),
            Auth::Gcp => (Signing::Bearer, gcp::source(env)),
            Auth::Azure => (Signing::Bearer, azure::source(env)),
        };
        let mut known = self.inner.by_upstream.lock();
        if let Some((a, host, e, weak)) = known.get(upstream) {
            if (a, host, e) == (auth, &config.authority, env) {
                if let Some(held) = weak.upgrade() {
                    return Some(held);
                }
            }
        }
        let m = &self.inner.metrics;
        let auth_state = Arc::new(CloudAuth {
            upstream: Arc::from(upstream),
            signing,
            source,
            held: ArcSwapOption::empty(),
            tried: std::sync::atomic::AtomicBool::new(false),
            wake: Notify::new(),
            fetches: tokio::sync::watch::Sender::new(0),
            stop: self.inner.stop.child_token(),
            refreshed_ok: m.credential_refreshes_total.with_label_values(&[upstream, "ok"]),
            refresh_failed: m.credential_refreshes_total.with_label_values(&[upstream, "error"]),
        });
        known.insert(
            upstream.to_string(),
            (
                auth.clone(),
                config.authority.clone(),
                env.clone(),
                Arc::downgrade(&auth_state),
            ),
        );
        drop(known);
        match self.inner.http.clone() {
            Some(http) => {
                let weak = Arc::downgrade(&auth_state);
                let stop = auth_state.stop.clone();
                self.inner.tasks.spawn(CloudAuth::refresh(weak, http, stop));
            }
            None => auth_state.tried.store(true, std::sync::atomic::Ordering::Release),
        }
        Some(auth_state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_is_refreshed_ahead_of_its_expiry_never_in_a_loop() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let hour = now + Duration::from_secs(3600);
        assert_eq!(refresh_after(now, hour), Duration::from_secs(3300));
        let short = now + Duration::from_secs(60);
        assert_eq!(refresh_after(now, short), Duration::from_secs(30));
        assert_eq!(refresh_after(now, now - Duration::from_secs(1)), RETRY_FIRST);
        assert_eq!(refresh_after(now, now), RETRY_FIRST, "expires_in 0 is not a loop");
    }

    #[test]
    fn an_expired_or_revoked_credential_is_told_apart_from_a_refusal() {
        let mut h = http::HeaderMap::new();
        assert!(says_rejected(401, &h));
        assert!(
            !says_rejected(403, &h),
            "a plain 403 is an access refusal, not an expiry"
        );
        h.insert(
            "x-amzn-errortype",
            "ExpiredTokenException:http://internal.amazon.com/".parse().unwrap(),
        );
        assert!(says_rejected(403, &h));
        h.insert("x-amzn-errortype", "AccessDeniedException:".parse().unwrap());
        assert!(!says_rejected(403, &h));
        assert!(!says_rejected(429, &http::HeaderMap::new()));
    }

    #[test]
    fn failed_fetches_wait_longer_each_time_up_to_a_minute() {
        let waits: Vec<u64> = (1..=9).map(|n| retry_wait(n).as_secs()).collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }
}
