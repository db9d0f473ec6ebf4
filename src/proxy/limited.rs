//! Step 5c: the route's `[limits.*]` ([`crate::limiter`]). A request is admitted by every limit
//! its route lists (its pass settled with the tokens it used when its response ends), waits
//! while a limit is over and its `on_limit = "queue"` allows (at most `max_wait`, and never past
//! the request's deadline), or gets 429 `limit_exceeded` with `retry-after`. Every response of a
//! limited route carries the tightest limit's `RateLimit-Policy` and `RateLimit` fields.

use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;

use super::context::Context;
use super::routes::Route;
use crate::config::OnLimit;
use crate::credentials::CredentialHash;
use crate::error::ProxyError;
use crate::limiter::Pass;
use crate::limits::estimate;
use crate::limits::key::KeyInput;
use crate::time;
use crate::wire::body::{RequestLog, Settle};

/// The fields an admitted request's response carries.
pub(super) type RateLimitFields = Option<(HeaderValue, HeaderValue)>;

/// How often a request waiting for a concurrent slot looks again.
const SLOT_POLL: Duration = Duration::from_millis(50);

/// Admits the request (`parts`, `body`) on `route`'s limits: its pass is held by `log` until the
/// response ends; the `RateLimit` fields to send; or rebound's 429.
pub(super) async fn admit(
    cx: &Context,
    route: &Route,
    (parts, body): (&http::request::Parts, &Bytes),
    deadline: Duration,
    log: &mut RequestLog,
) -> Result<RateLimitFields, ProxyError> {
    let limits = &route.limits;
    let keys = || limits.iter().map(|l| &l.policy.key);
    let credential = match keys().any(|k| k.uses_credential()) {
        true => cx
            .credentials
            .presented(&parts.headers, parts.uri.query())
            .hash(&cx.credentials),
        false => CredentialHash([0; 16]),
    };
    let model = keys()
        .any(|k| k.uses_model())
        .then(|| crate::wire::usage::request_model(body))
        .flatten();
    let tokens = match limits.iter().any(|l| l.policy.tokens_per_minute.is_some()) {
        true => estimate::tokens(body),
        false => 0,
    };
    let input = KeyInput {
        route: &route.name,
        credential,
        model,
        headers: &parts.headers,
    };
    let started = time::now();
    let mut queued = false;
    loop {
        let refused = match cx.limiter.admit(limits, &input, tokens, time::now_unix_ms()).await {
            Ok(pass) => {
                count(cx, route, if queued { "queued" } else { "admitted" }, started);
                if tokens > 0 {
                    for l in limits.iter().filter(|l| l.policy.tokens_per_minute.is_some()) {
                        cx.metrics
                            .limit_tokens_total
                            .with_label_values(&[&l.policy.name, "reserved"])
                            .inc_by(tokens);
                    }
                }
                let fields = pass.headers(time::now_unix_ms());
                log.set_settle(Box::new(Settlement {
                    pass,
                    settled: settled_series(cx, route),
                }));
                return Ok(fields);
            }
            Err(refused) => refused,
        };
        let policy = limits
            .iter()
            .find(|l| l.policy.name == refused.limit)
            .map(|l| &l.policy);
        let waited = started.elapsed();
        let allowed = policy
            .filter(|p| p.on_limit == OnLimit::Queue)
            .map_or(Duration::ZERO, |p| p.max_wait.min(deadline).saturating_sub(waited));
        // A window's end is known; a slot frees when a request ends: look again soon.
        let wait = refused.retry_after.min(SLOT_POLL.max(refused.retry_after / 20));
        if refused.retry_after > allowed || wait.is_zero() {
            count(cx, route, "rejected", started);
            return Err(ProxyError::LimitExceeded {
                limit: refused.limit,
                retry_after: refused.retry_after,
            });
        }
        queued = true;
        tokio::time::sleep(wait).await;
    }
}

fn count(cx: &Context, route: &Route, result: &str, started: tokio::time::Instant) {
    for l in &route.limits {
        let name = l.policy.name.as_str();
        cx.metrics
            .limit_decisions_total
            .with_label_values(&[name, result])
            .inc();
        cx.metrics
            .limit_queue_seconds
            .with_label_values(&[name])
            .observe(started.elapsed().as_secs_f64());
    }
}

/// An admitted request's pass, settled when its books close.
struct Settlement {
    pass: Pass,
    /// The `settled` token series of the route's token limits.
    settled: Vec<prometheus::IntCounter>,
}

fn settled_series(cx: &Context, route: &Route) -> Vec<prometheus::IntCounter> {
    route
        .limits
        .iter()
        .filter(|l| l.policy.tokens_per_minute.is_some())
        .map(|l| {
            cx.metrics
                .limit_tokens_total
                .with_label_values(&[&l.policy.name, "settled"])
        })
        .collect()
}

impl Settle for Settlement {
    fn settle(self: Box<Self>, tokens: Option<u64>) {
        if let Some(n) = tokens {
            for c in &self.settled {
                c.inc_by(n);
            }
        }
        self.pass.settle(tokens, time::now_unix_ms());
    }
}
