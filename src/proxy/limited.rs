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
use crate::limiter::{Pass, Want};
use crate::limits::estimate;
use crate::limits::key::KeyInput;
use crate::limits::prices::Usage;
use crate::time;
use crate::wire::body::{RequestLog, Settle, Used};

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
    let spends = limits
        .iter()
        .any(|l| l.policy.micro_usd_per_day.is_some() || l.policy.micro_usd_per_month.is_some());
    let model = (spends || keys().any(|k| k.uses_model()))
        .then(|| crate::wire::usage::request_model(body))
        .flatten();
    let counts_tokens = spends || limits.iter().any(|l| l.policy.tokens_per_minute.is_some());
    let (prompt, output) = match counts_tokens {
        true => estimate::split(body),
        false => (0, 0),
    };
    let tokens = prompt.saturating_add(output);
    // What it may cost: its prompt and its most output at its model's prices (an unpriced model
    // costs nothing: docs/limits.md).
    let price = spends.then(|| cx.limiter.price(model)).flatten();
    let cost = price.map_or(0, |p| {
        p.cost(Usage {
            input: prompt,
            cached_input: 0,
            output,
        })
    });
    let want = (Want { tokens, cost }, price);
    let input = KeyInput {
        route: &route.name,
        credential,
        model,
        headers: &parts.headers,
    };
    let started = time::now();
    let mut queued = false;
    loop {
        let refused = match cx.limiter.admit(limits, &input, want, time::now_unix_ms()).await {
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
    fn settle(self: Box<Self>, used: Option<Used>) {
        if let Some(n) = used.map(|u| u.input + u.cached_input + u.output) {
            for c in &self.settled {
                c.inc_by(n);
            }
        }
        self.pass.settle(used, time::now_unix_ms());
    }
}
