//! Step 5c: the route's `[limits.*]` ([`crate::limiter`]). A request is admitted by every limit
//! its route lists (its pass settled with the tokens it used when its response ends), waits
//! while a limit is over and its `on_limit = "queue"` allows (at most `max_wait`, and never past
//! the request's deadline), or gets 429 `limit_exceeded` with `retry-after`. Every response of a
//! limited route carries the tightest limit's `RateLimit-Policy` and `RateLimit` fields.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use parking_lot::Mutex;

use super::context::Context;
use super::request::Request;
use super::routes::Route;
use crate::credentials::CredentialHash;
use crate::error::ProxyError;
use crate::limiter::{fields, Ask, Limit, Pass, Subject, Timing, Want};
use crate::limits::estimate;
use crate::limits::key::{BucketKey, KeyInput};
use crate::metrics::LimitResult;
use crate::time::{self, Instant};
use crate::wire::body::{Flow, RequestLog, Settle, Used};

/// The fields an admitted request's response carries.
pub(super) type RateLimitFields = Option<(HeaderValue, HeaderValue)>;

/// Admits the request on its route's limits, within its deadline: its pass is held by `log`
/// until the response ends; the `RateLimit` fields to send; or rebound's 429.
pub(super) async fn admit(cx: &Context, req: &Request, log: &mut RequestLog) -> Result<RateLimitFields, Refusal> {
    let (route, parts, deadline) = (&*req.route, &req.parts, req.deadline);
    let limits = &route.limits;
    let (credential, model, ask) = asks(cx, req);
    let tokens = ask.want.tokens;
    let input = KeyInput {
        route: &route.name,
        credential,
        model,
        headers: &parts.headers,
    };
    let started = time::now();
    // Each limit's bucket, hashed once.
    let buckets: smallvec::SmallVec<[BucketKey; 2]> = limits.iter().map(|l| l.bucket(&input)).collect();
    let share = |l: &Limit, bucket: BucketKey| l.share(bucket, &input);
    let subject = Subject {
        limits,
        buckets: &buckets,
        share: &share,
    };
    let timing = Timing { started, deadline };
    let waited = cx.limiter.wait_admit(subject, ask, timing, &time::now_unix_ms).await;
    match waited {
        Ok(a) => {
            let result = if a.queued {
                LimitResult::Queued
            } else {
                LimitResult::Admitted
            };
            Ok(admitted(route, a.pass, (result, tokens, started), log))
        }
        Err(t) => {
            let refusing = t.at.and_then(|i| Some((&**limits.get(i)?, *buckets.get(i)?)));
            Err(rejected(route, (refusing, &t.limit), t.retry_after, started))
        }
    }
}

/// What the request brings to its limits: its credential's hash and its model (each only when a
/// key or a price needs it), and what it may use (tokens, and their cost at its model's price).
fn asks<'b>(cx: &Context, req: &'b Request) -> (CredentialHash, Option<&'b str>, Ask) {
    let (route, body, named) = (&*req.route, &req.body, &req.named);
    let limits = &route.limits;
    let keys = || limits.iter().map(|l| &l.policy.key);
    let credential = match keys().any(|k| k.uses_credential()) {
        true => req.credential(&cx.credentials),
        false => CredentialHash([0; 16]),
    };
    let spends = limits
        .iter()
        .any(|l| l.policy.micro_usd_per_day.is_some() || l.policy.micro_usd_per_month.is_some());
    let model = named
        .model
        .as_deref()
        .filter(|_| spends || keys().any(|k| k.uses_model()));
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
        p.cost(Used {
            input: prompt,
            cached_input: 0,
            output,
        })
    });
    let ask = Ask {
        want: Want {
            tokens,
            cost,
            sparing: false,
        },
        price,
    };
    (credential, model, ask)
}

/// The pass held by `log` until the response ends; the `RateLimit` fields.
fn admitted(
    route: &Route,
    pass: Pass,
    (result, tokens, started): (LimitResult, u64, Instant),
    log: &mut RequestLog,
) -> RateLimitFields {
    count(route, (result, None), started);
    if tokens > 0 {
        for l in route.limits.iter().filter(|l| l.policy.tokens_per_minute.is_some()) {
            l.metrics.reserved.inc_by(tokens);
        }
    }
    let fields = pass.headers(time::now_unix_ms());
    let charged = route.limits.iter().any(|l| {
        let p = &l.policy;
        p.tokens_per_minute.is_some() || p.micro_usd_per_day.is_some() || p.micro_usd_per_month.is_some()
    });
    log.set_settle(Box::new(Settlement {
        pass: Arc::new(Mutex::new(Some(pass))),
        flows: charged.then_some(tokens),
    }));
    fields
}

/// A refusal: rebound's 429, and the `RateLimit` fields of the refusing limit's bucket.
pub(super) type Refusal = (ProxyError, RateLimitFields);

/// 429 `limit_exceeded` for `limit` (its bucket, when known, for the fields), counted.
fn rejected(
    route: &Route,
    (refusing, limit): (Option<(&Limit, BucketKey)>, &str),
    retry_after: Duration,
    started: Instant,
) -> Refusal {
    count(route, (LimitResult::Rejected, Some(limit)), started);
    let fields = refusing.and_then(|spot| fields(std::iter::once(spot), time::now_unix_ms()));
    let err = ProxyError::LimitExceeded {
        limit: limit.to_string(),
        retry_after,
    };
    (err, fields)
}

/// Counts a decision: an admission under every limit of the route, a rejection under the limit
/// that refused; the wait of a request that waited.
fn count(route: &Route, (result, refusing): (LimitResult, Option<&str>), started: Instant) {
    for l in &route.limits {
        if refusing.is_some_and(|r| r != l.policy.name) {
            continue;
        }
        l.metrics.decided(result);
        if result != LimitResult::Admitted {
            l.metrics.queue_seconds.observe(started.elapsed().as_secs_f64());
        }
    }
}

/// An admitted request's pass, settled when its books close.
struct Settlement {
    /// Shared with the stream's [`Flowing`] charge until then.
    pass: Arc<Mutex<Option<Pass>>>,
    /// On a route with a token or spend limit, the tokens the request reserved: its stream is
    /// charged as it flows past them.
    flows: Option<u64>,
}

/// The delivered stream's usage so far, charged to the pass once it passes what was reserved
/// (before that, a charge would debit nothing: no lock is taken).
struct Flowing {
    pass: Arc<Mutex<Option<Pass>>>,
    reserved: u64,
}

impl Flow for Flowing {
    fn flowed(&self, used: Used) {
        if used.input + used.cached_input + used.output <= self.reserved {
            return;
        }
        if let Some(pass) = self.pass.lock().as_mut() {
            pass.charge(used, time::now_unix_ms());
        }
    }
}

impl Settle for Settlement {
    fn settle(self: Box<Self>, used: Option<Used>) {
        if let Some(pass) = self.pass.lock().take() {
            pass.settle(used, time::now_unix_ms());
        }
    }

    fn flow(&self) -> Option<Arc<dyn Flow>> {
        let reserved = self.flows?;
        Some(Arc::new(Flowing {
            pass: self.pass.clone(),
            reserved,
        }))
    }
}
