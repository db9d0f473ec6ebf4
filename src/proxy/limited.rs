//! Step 5c: the route's `[limits.*]` ([`crate::limiter`]). A request is admitted by every limit
//! its route lists (its pass settled with the tokens it used when its response ends), waits
//! while a limit is over and its `on_limit = "queue"` allows (at most `max_wait`, and never past
//! the request's deadline), or gets 429 `limit_exceeded` with `retry-after`. Every response of a
//! limited route carries the tightest limit's `RateLimit-Policy` and `RateLimit` fields.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use parking_lot::Mutex;

use super::context::Context;
use super::routes::Route;
use crate::config::OnLimit;
use crate::credentials::CredentialHash;
use crate::error::ProxyError;
use crate::limiter::{fields, Limit, Pass, Place, Want};
use crate::limits::estimate;
use crate::limits::key::{BucketKey, KeyInput};
use crate::limits::prices::{Price, Usage};
use crate::time::{self, Instant};
use crate::wire::body::{Flow, RequestLog, Settle, Used};
use crate::wire::named::Named;

/// The fields an admitted request's response carries.
pub(super) type RateLimitFields = Option<(HeaderValue, HeaderValue)>;

/// How often a waiting request looks again when no release woke it (a release elsewhere in the
/// fleet, a notification missed). The fleet's first waiter on a replica asks Redis this often
/// (only while requests wait): at 100 ms, a saturated queued limit of 16 slots on three
/// replicas kept 8 busy, each release waiting for a poll; at 20 ms, 14.5
/// (`limits_fleet::a_saturated_queued_limit_keeps_its_slots_busy`).
const QUEUE_POLL: Duration = Duration::from_millis(20);

/// The `retry-after` of a refusal that names no time (a queue full).
const SLOT_POLL: Duration = Duration::from_secs(1);

/// Admits the request (`parts`, `body`) on `route`'s limits: its pass is held by `log` until the
/// response ends; the `RateLimit` fields to send; or rebound's 429.
pub(super) async fn admit(
    cx: &Context,
    route: &Route,
    (parts, body, named): (&http::request::Parts, &Bytes, &Named),
    deadline: Instant,
    log: &mut RequestLog,
) -> Result<RateLimitFields, Refusal> {
    let limits = &route.limits;
    let (credential, model, want) = asks(cx, route, (parts, body, named));
    let tokens = want.0.tokens;
    let input = KeyInput {
        route: &route.name,
        credential,
        model,
        headers: &parts.headers,
    };
    let started = time::now();
    // Each limit's bucket, hashed once.
    let buckets: smallvec::SmallVec<[BucketKey; 2]> = limits.iter().map(|l| l.bucket(&input)).collect();
    // A request that finds others waiting for a limit (here or in the fleet) waits behind them.
    let mut waiting: Option<InQueue> = None;
    for (l, bucket) in limits.iter().zip(buckets.iter().copied()) {
        if l.policy.on_limit == OnLimit::Queue && l.waiting.busy(&bucket) {
            let until = (started + l.policy.max_wait).min(deadline);
            let Some(place) = cx.limiter.queue(l, bucket, l.share(bucket, &input), until).await else {
                let refusing = (Some((&**l, bucket)), l.policy.name.as_str());
                return Err(rejected(route, refusing, SLOT_POLL, started));
            };
            waiting = Some(InQueue::new(cx, l, place, until));
            break;
        }
    }
    loop {
        let mut pause = QUEUE_POLL;
        // Registered before it looks: a release while it asks wakes it at once.
        let woken = waiting.as_ref().map(|q| {
            let limit = q.limit;
            limit.waiting.listen()
        });
        let turn = match &waiting {
            None => true,
            Some(q) => cx.limiter.turn(q.limit, &q.place).await,
        };
        if turn {
            let refused = match cx.limiter.admit((limits, &buckets), want, time::now_unix_ms()).await {
                Ok(pass) => {
                    let result = if waiting.is_some() { "queued" } else { "admitted" };
                    if let Some(q) = waiting {
                        q.leave(true);
                    }
                    return Ok(admitted(route, pass, (result, tokens, started), log));
                }
                Err(refused) => refused,
            };
            if waiting.is_none() {
                let asked = (&buckets[..], &input, deadline);
                waiting = Some(queue_refused(cx, route, asked, &refused, started).await?);
            }
            pause = refused.retry_after;
            // A slot may free on any replica: the fleet's head looks again soon.
            if !refused.window && waiting.as_ref().is_some_and(|q| q.place.fleet.is_some()) {
                pause = pause.min(QUEUE_POLL);
            }
        }
        let Some(q) = waiting.as_ref() else {
            return Err(rejected(route, (None, ""), SLOT_POLL, started));
        };
        let (l, place, until) = (q.limit, q.place, q.until);
        let now = time::now();
        if now >= until {
            if let Some(q) = waiting.take() {
                q.leave(false);
            }
            return Err(rejected(
                route,
                (Some((l, place.bucket)), &l.policy.name),
                pause,
                started,
            ));
        }
        // Woken by a release, else in time for the limit's reset and the end of the wait.
        let within = pause.min(until - now).max(Duration::from_millis(1));
        match woken {
            Some(woken) => {
                let _ = tokio::time::timeout(within, woken).await;
            }
            None => l.waiting.next_turn(within).await,
        }
    }
}

/// A request the limits refused, queued where the refusing limit allows it and may open within
/// the wait (`buckets`: the request's, one per limit), or its 429.
async fn queue_refused<'a>(
    cx: &'a Context,
    route: &'a Route,
    (buckets, input, deadline): (&[BucketKey], &KeyInput<'_>, Instant),
    refused: &crate::limiter::Refused,
    started: Instant,
) -> Result<InQueue<'a>, Refusal> {
    let limits = &route.limits;
    let at = limits.iter().position(|l| l.policy.name == refused.limit);
    let l = at.and_then(|i| limits.get(i));
    let until = l.map(|l| (started + l.policy.max_wait).min(deadline));
    let opens_in_time = until.is_some_and(|u| !refused.window || time::now() + refused.retry_after < u);
    let queued = match (l.filter(|l| l.policy.on_limit == OnLimit::Queue), until) {
        (Some(l), Some(until)) if opens_in_time => {
            let bucket = at
                .and_then(|i| buckets.get(i).copied())
                .unwrap_or_else(|| l.bucket(input));
            let place = cx.limiter.queue(l, bucket, l.share(bucket, input), until).await;
            place.map(|place| InQueue::new(cx, l, place, until))
        }
        _ => None,
    };
    queued.ok_or_else(|| {
        let refusing = at.and_then(|i| Some((&**limits.get(i)?, *buckets.get(i)?)));
        rejected(route, (refusing, &refused.limit), refused.retry_after, started)
    })
}

/// A request's place in a limit's queues, left when it is admitted, when its wait runs out, or
/// when it goes away (its client gone: its future dropped), so that it never holds a queue up.
struct InQueue<'a> {
    cx: &'a Context,
    limit: &'a Arc<Limit>,
    place: Place,
    until: Instant,
    left: bool,
}

impl<'a> InQueue<'a> {
    fn new(cx: &'a Context, limit: &'a Arc<Limit>, place: Place, until: Instant) -> InQueue<'a> {
        InQueue {
            cx,
            limit,
            place,
            until,
            left: false,
        }
    }

    /// Leaves the queues: admitted (`served`), or not.
    fn leave(mut self, served: bool) {
        self.left = true;
        self.cx.limiter.dequeue(self.limit, self.place, served);
    }
}

impl Drop for InQueue<'_> {
    fn drop(&mut self) {
        if !self.left {
            self.cx.limiter.dequeue(self.limit, self.place, false);
        }
    }
}

/// What the request brings to its limits: its credential's hash and its model (each only when a
/// key or a price needs it), and what it may use (tokens, and their cost at its model's price).
fn asks<'b>(
    cx: &Context,
    route: &Route,
    (parts, body, named): (&'b http::request::Parts, &'b Bytes, &'b Named),
) -> (CredentialHash, Option<&'b str>, (Want, Option<Price>)) {
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
        p.cost(Usage {
            input: prompt,
            cached_input: 0,
            output,
        })
    });
    let want = (
        Want {
            tokens,
            cost,
            sparing: false,
        },
        price,
    );
    (credential, model, want)
}

/// The pass held by `log` until the response ends; the `RateLimit` fields.
fn admitted(
    route: &Route,
    pass: Pass,
    (result, tokens, started): (&str, u64, Instant),
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
    count(route, ("rejected", Some(limit)), started);
    let fields = refusing.and_then(|spot| fields(std::iter::once(spot), time::now_unix_ms()));
    let err = ProxyError::LimitExceeded {
        limit: limit.to_string(),
        retry_after,
    };
    (err, fields)
}

/// Counts a decision: an admission under every limit of the route, a rejection under the limit
/// that refused; the wait of a request that waited.
fn count(route: &Route, (result, refusing): (&str, Option<&str>), started: Instant) {
    for l in &route.limits {
        if refusing.is_some_and(|r| r != l.policy.name) {
            continue;
        }
        l.metrics.decided(result);
        if result != "admitted" {
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
