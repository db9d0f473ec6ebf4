//! The request pipeline, top-down in one function ([`Proxy::handle`]), its steps numbered in the
//! code as here:
//!
//! 1. refuse forward-proxy use (CONNECT, absolute-form targets); serve the job API (`/jobs/{id}`)
//!    when a route is async;
//! 2. route: the longest `path_prefix` wins, else 404 `no_route`;
//! 3. WebSocket upgrades pass through untouched ([`websocket`]);
//! 4. take the request body, capped at `max_request_body` (413 beyond it, nothing forwarded); on
//!    an async route, `Prefer: respond-async` queues it as a job instead (202);
//! 5. idempotency: replay a completed original, hold or refuse a duplicate, or claim the key;
//!    then the response cache: answer from a stored entry or an identical request in flight, or
//!    claim the entry;
//! 6. the attempts ([`call::attempts`], one [`call::Call`] per request): admit (deadline,
//!    target, circuit, holds), send, observe, decide the next step, until an outcome is delivered;
//! 7. a failure for good is recorded as a dead letter;
//! 8. respond ([`Proxy::respond`]): the upstream's status, headers (minus hop-by-hop) and body,
//!    streamed frame by frame through the idempotency recorder, with `x-rebound-attempts`; or
//!    rebound's own error ([`crate::error`]).

mod admission;
mod cached;
mod call;
mod client_retry;
mod commit;
mod context;
mod continued;
mod cursor;
mod delivery;
mod hold_scope;
mod idempotent;
mod limited;
mod outbound;
mod pacing;
mod primed;
mod request;
mod respond;
mod room;
mod routes;
mod shared;
pub(crate) mod stream;
mod tokens;
mod websocket;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response};
use http_body_util::Full;
use tokio::time::Instant;

use crate::cache::Looked;
use crate::config::Config;
use crate::dead_letters::DeadLetters;
use crate::error::{error_response, ProxyError};
use crate::idempotency::{AnyStore, MemoryStore};
use crate::jobs::{self, Jobs};
use crate::limits::headers::{RATELIMIT, RATELIMIT_POLICY};
use crate::retry::policy::Outcome;
use crate::routing::{forwarded_path, RouteTable};
use crate::time;
use crate::traces::{self, Traces};
use crate::wire::api::Named;
use crate::wire::body::{self, BodyError, Delivered, ProxyBody, RequestLog};
use crate::wire::headers;
use crate::words::TargetState;
use call::Asked;
use client_retry::Repeat;
use context::Context;
use delivery::Delivery;
use idempotent::{follow_response, idempotency_step, replay_response, Answered};
use respond::{upstream_response, Came, Claims};
pub(crate) use routes::BuildError;
use routes::Route;
pub(crate) use shared::Shared;
use tokens::Meter;

/// The job workers run their requests through the configuration in force when each one starts.
impl jobs::Pipeline for arc_swap::ArcSwap<Proxy> {
    fn run(&self, req: Request<Full<Bytes>>) -> futures_util::future::BoxFuture<'static, Response<ProxyBody>> {
        let proxy = self.load_full();
        Box::pin(proxy.handle(req))
    }
}

/// Everything a request needs: routes, upstream pools, metrics.
pub struct Proxy {
    routes: RouteTable<Arc<Route>>,
    max_request_body: u64,
    max_request_head: u64,
    /// What every step shares: metrics, tasks, credential forms, circuits.
    cx: Arc<Context>,
    dead_letters: DeadLetters,
    dead_letter_config: crate::config::DeadLettersConfig,
    /// The job queue, when a route is async.
    jobs: Option<Jobs>,
    /// OpenTelemetry traces (off unless `[telemetry] otlp_endpoint` is set).
    traces: Traces,
    /// The `model` label values of the token metrics (`[metrics] models`, then `other`).
    models: tokens::Models,
    /// The in-memory store (without Redis): its cache entries are reported at each scrape.
    memory: Option<MemoryStore>,
}

impl Proxy {
    /// Resolves routes against upstreams and policies and builds the connection pools.
    pub fn new(config: &Config, shared: &Shared) -> Result<Proxy, BuildError> {
        shared.metrics.init_series(config);
        shared.concurrency.configure(config);
        let limiter = Arc::new(crate::limiter::Limiter::new(
            config,
            shared.limit_store.clone(),
            shared.limit_fleet_size.clone(),
            &shared.metrics,
        ));
        let routes = routes::build(config, shared, &limiter)?;
        let Shared {
            metrics,
            tasks,
            hard_stop,
            store,
            dead_letters,
            circuits,
            jobs,
            traces,
            clouds: _,
            limit_store: _,
            limit_fleet_size: _,
            concurrency: _,
        } = shared.clone();
        Ok(Proxy {
            routes,
            max_request_body: config.server.max_request_body,
            max_request_head: config.server.max_request_head,
            cx: Arc::new(Context {
                metrics,
                tasks,
                hard_stop,
                credentials: config.server.credentials.clone(),
                circuits,
                limiter,
            }),
            dead_letters,
            dead_letter_config: config.dead_letters.clone(),
            jobs: jobs.for_config(config),
            traces,
            models: tokens::Models::new(&config.metrics),
            memory: match &store.store {
                AnyStore::Memory(m) => Some(m.clone()),
                AnyStore::Redis(_) => None,
            },
        })
    }

    /// Hands this replica's unspent limit leases and idle slots back to the fleet (after the
    /// drain: every request has settled).
    pub(crate) async fn hand_back_limits(&self) {
        self.cx.limiter.hand_back(time::now_unix_ms()).await;
    }

    /// Sets `rebound_cache_entries` and `rebound_cache_bytes` (called at each scrape; 0 with
    /// Redis, whose own INFO tells).
    pub(crate) fn refresh_cache_usage(&self) {
        let (entries, bytes) = self.memory.as_ref().map_or((0, 0), MemoryStore::cache_usage);
        let metrics = &self.cx.metrics;
        metrics.cache_entries.set(i64::try_from(entries).unwrap_or(i64::MAX));
        metrics.cache_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Sets `rebound_target_state` for every target of every route, as of `now` (called at each
    /// scrape; see [`admission::target_state`]).
    pub(crate) fn refresh_target_states(&self, now: Instant) {
        let wall = crate::time::wall_now();
        for route in self.routes.routes() {
            for t in route.targets.iter() {
                if let Some(auth) = &t.cloud {
                    let left = auth.expires_in(wall);
                    self.cx
                        .metrics
                        .credential_expiry_seconds
                        .with_label_values(&[&*t.name])
                        .set(left);
                }
                let state = admission::target_state(&self.cx, t, now);
                for s in TargetState::ALL {
                    self.cx
                        .metrics
                        .target_state
                        .with_label_values(&[&*route.name, &*t.name, s.as_str()])
                        .set(i64::from(s == state));
                }
            }
        }
    }

    /// Counts a cached answer's usage as tokens saved on `route` (the request's model label).
    fn saved(&self, route: &Arc<Route>, named: &Named) -> cached::Saved {
        let (route, model) = (route.clone(), self.models.for_request(named).model);
        Box::new(move |scan| route.cache.iter().for_each(|c| c.count_scanned(&model, scan)))
    }

    /// Answers one request. Never fails: every error becomes a response. Generic over the body
    /// so that admin replays run through the same pipeline as client requests.
    ///
    /// An `async` block, not an `async fn`: an `async fn` keeps its arguments twice in its future
    /// (as they were passed, and moved into its body), 264 bytes of request more per request in
    /// flight; the block uses what it captured in place. The request is taken apart before the
    /// block: a captured value keeps its place in the future for the request's whole life, so
    /// capturing the request and then its parts would hold the head twice.
    #[allow(clippy::manual_async_fn)] // on purpose: see above
    pub fn handle<B>(self: Arc<Self>, req: Request<B>) -> impl std::future::Future<Output = Response<ProxyBody>> + Send
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<body::BoxError>,
    {
        let (parts, body) = req.into_parts();
        async move {
            let arrived = time::now();
            let mut log = RequestLog::start(&self.cx.metrics, &parts.method, &parts.uri);
            log.set_trace(&parts.headers);
            log.set_accept(&parts.headers);
            let trace = self.traces.request(&parts.method, parts.uri.path(), &parts.headers);
            if trace.is_recording() {
                log.set_span(Box::new(trace.clone()), None);
            }

            // 1. Not an open proxy.
            if parts.method == Method::CONNECT {
                return error_response(ProxyError::Connect, log);
            }
            if is_absolute_form(&parts) {
                return error_response(ProxyError::AbsoluteForm, log);
            }
            let head = headers::head_size(&parts.method, &parts.uri, &parts.headers);
            if head > self.max_request_head {
                let limit = self.max_request_head;
                return error_response(ProxyError::RequestHeadTooLarge { size: head, limit }, log);
            }
            // The job API (`/jobs/{id}`, `/jobs/{id}/result`), when a route is async.
            if let Some(jobs) = self.jobs.as_ref().filter(|_| jobs::is_api_path(parts.uri.path())) {
                // Boxed, like every rare branch: inline, its state would make every request's future
                // larger, and each request moves that future around several times.
                return Box::pin(jobs.api(&parts.method, &parts.uri, &parts.headers, log)).await;
            }

            // 2. Route.
            let Some((prefix, route)) = self.routes.find(parts.uri.path()) else {
                log.set_api(crate::wire::api::api_of_path(parts.uri.path()));
                let err = ProxyError::NoRoute {
                    path: crate::error::asked_path(parts.uri.path()),
                };
                return error_response(err, log);
            };
            let route = route.clone();
            log.set_route(&route.metrics);
            log.set_api(route.config.api);

            // 3. WebSocket upgrades pass through.
            if headers::is_upgrade(&parts.headers) {
                let path = forwarded_path(parts.uri.path(), prefix, route.config.strip_prefix).into_owned();
                let req = Request::from_parts(parts, body);
                return Box::pin(websocket::pass_through(&self.cx, &route, &path, req, log)).await;
            }

            // 4. The request body, capped.
            // Borrowed from the request's own path unless a prefix strip has to add a `/`.
            let path = forwarded_path(parts.uri.path(), prefix, route.config.strip_prefix);
            let body = match body::read_capped(body, &parts.headers, self.max_request_body).await {
                Ok(b) => b,
                Err(e) => return error_response(self.body_error(e), log),
            };

            // What the request names (its operation, model, stream), read once for every later
            // step; a name that would leave its path segment on a target is refused here.
            let named = match route.named(&path, &body) {
                Ok(named) => named,
                Err(err) => return error_response(err, log),
            };
            let path = request::Forwarded::of(parts.uri.path(), path);

            // `Prefer: respond-async` on an async route: queued (202), run later by a job worker.
            if route.config.async_jobs {
                if let Some(jobs) = self.jobs.as_ref().filter(|_| jobs::wants_async(&parts)) {
                    return Box::pin(jobs.submit(&route.name, route.idempotency.as_ref(), &parts, body, log)).await;
                }
            }

            // The request, read once: every later step borrows it, a continuation holds it.
            let req = Arc::new(request::Request::new(route, (parts, path), (body, named), arrived));
            let (route, parts, body, named) = (&req.route, &req.parts, &req.body, &req.named);

            // The request's token books, and how its stream is continued when cut (a route with
            // `continue_streams`: its own stream, or the one it follows).
            let tokens = self.models.for_request(named);
            let again = continued::Again::of(&self.cx, &req, (&tokens, &trace));

            // 5. Idempotency: replay a completed original, follow one in flight, refuse, or claim.
            // In a block of its own: the step's result would otherwise keep its place in the
            // request's future through every later await.
            let (claim, bypassed) = {
                let step = if route.idempotency.is_some() {
                    idempotency_step(route, parts, body, &mut log).await
                } else {
                    Ok((None, false))
                };
                match step {
                    Ok(go_on) => go_on,
                    Err(Answered::Replay(stored)) => return replay_response(stored, log),
                    Err(Answered::Follow(followed)) => return follow_response(followed, again, log),
                    Err(Answered::Refuse(err)) => return error_response(err, log),
                }
            };

            // 5b. The response cache: a stored entry or an identical request in flight answers (and
            // becomes the idempotency key's response); otherwise the entry is claimed.
            let cache = match &route.cache {
                Some(c) => match Box::pin(c.lookup(parts, body, &mut log)).await {
                    Looked::Hit(stored) => return cached::hit_response(stored, claim, log, self.saved(route, named)),
                    Looked::Follow(f) => return cached::follow_response(f, claim, log, self.saved(route, named)),
                    looked => Some(looked),
                },
                None => None,
            };

            // 5c. The route's limits: admitted (held until the response ends), queued, or 429;
            // 6. then the attempts until delivered (a client's retry of a failure for good: one).
            describe_span(&trace, route, named);
            let repeat = Repeat::check(&self.cx, &req, time::now());
            let asked = Asked::of(&req);
            let delivery = self.deliver(asked, tokens, &mut log, &trace).await;

            // 7. The books; a failure for good is a dead letter and marks the request.
            let delivery = self.account(&req, &mut log, delivery, repeat);

            // 8. Respond: an outcome the idempotency store keeps is recorded as it streams (never an
            // in-band error); any other frees the key first; a cache entry records it, kept or
            // not. (Boxed only where there is a claim: the release waits on the store.)
            let (claims, delivery) = match (claim, cache) {
                (None, None) => (Claims::none(bypassed), delivery),
                (claim, cache) => Box::pin(Claims::settle((claim, bypassed), cache, delivery)).await,
            };
            self.respond(&req, delivery, (claims, again), log)
        }
    }

    /// Step 4's answer to a body that cannot be taken.
    fn body_error(&self, e: BodyError) -> ProxyError {
        match e {
            BodyError::TooLarge => ProxyError::BodyTooLarge {
                limit: self.max_request_body,
            },
            BodyError::Read(e) => ProxyError::BadRequestBody(e),
        }
    }

    /// Steps 5c and 6: the route's limits (boxed where there are any: most routes have none),
    /// then the attempts.
    async fn deliver(
        &self,
        asked: Asked<'_>,
        tokens: tokens::RequestTokens,
        log: &mut RequestLog,
        trace: &traces::RequestSpan,
    ) -> Delivery {
        let limited = match asked.route.limits.is_empty() {
            true => Ok(None),
            false => Box::pin(self.limited(asked.request, log)).await,
        };
        match limited {
            Ok(fields) => call::attempts(&self.cx, asked, tokens, trace)
                .await
                .with_ratelimit(fields),
            Err((refused, fields)) => Delivery::refused(refused, tokens).with_ratelimit(fields),
        }
    }

    /// Step 5c: the request admitted by its route's limits within its deadline.
    async fn limited(
        &self,
        req: &request::Request,
        log: &mut RequestLog,
    ) -> Result<limited::RateLimitFields, limited::Refusal> {
        limited::admit(&self.cx, req, log).await
    }

    /// Step 7: the delivery in the request's books, and a failure for good as a dead letter.
    /// Handed through by value, never borrowed in `handle`: a local borrowed there keeps its place
    /// in the request's future through later awaits, even once moved away.
    fn account(
        &self,
        req: &request::Request,
        log: &mut RequestLog,
        mut delivery: Delivery,
        repeat: Repeat,
    ) -> Delivery {
        let (route, parts, body) = (&*req.route, &req.parts, &req.body);
        let upstream = &route.targets.get(delivery.target).unwrap_or(route.primary()).name;
        let now = time::now();
        if delivery.failed() && delivery.retry_after.is_none() {
            delivery.retry_after = self.cx.circuits.open_for(upstream, now);
        }
        repeat.settle(&self.cx, req, &delivery, now);
        log.set_upstream(upstream, delivery.attempts.len() as u32);
        log.set_wait(delivery.attempts.iter().map(|a| a.wait_ms).sum());
        log.set_usage(&delivery.tokens.ledger);
        if let Some(reason) = delivery.dead_letter_reason().filter(|_| route.config.dead_letters) {
            let entry = delivery.dead_letter(route, (parts, body), reason, &self.dead_letter_config);
            // In memory: recorded here, before the response goes out; on Redis: by a task.
            if let Err(entry) = self.dead_letters.add_now(entry) {
                let store = self.dead_letters.clone();
                self.cx.tasks.spawn(async move {
                    if let Err(e) = store.add(*entry).await {
                        tracing::warn!(error = %e, "dead letter not recorded");
                    }
                });
            }
        }
        delivery
    }

    /// Step 8: the upstream's response (through the idempotency recorder when `claim` is given:
    /// the key of an outcome that is not stored was released before) or rebound's own error,
    /// with rebound's headers.
    fn respond(
        &self,
        req: &request::Request,
        delivery: Delivery,
        (claims, again): (Claims, Option<Box<continued::Again>>),
        log: RequestLog,
    ) -> Response<ProxyBody> {
        let route = &*req.route;
        // A job worker's run of a queued request: its books go to the job record.
        let job_run = req.parts.extensions.get::<jobs::JobRun>().is_some();
        let attempts = delivery.attempts.len() as u32;
        let outcome = delivery.outcome.unwrap_or(Outcome::Timeout);
        let target = route.targets.get(delivery.target).unwrap_or(route.primary());
        let failovers = delivery.failovers;
        let (bypassed, cache_claim) = (claims.bypassed, claims.cache.as_ref().map(|c| c.header));
        let ratelimit = delivery.ratelimit.clone();
        // A failed answer says when rebound would try again, if it knows and the answer does not.
        let retry_after = delivery.retry_after.filter(|_| delivery.failed());
        let mut resp = match delivery.result {
            Ok(resp) => {
                let mut meter = Meter::for_delivered(&resp, &target.tokens, &delivery.tokens, attempts, delivery.sent);
                // A stream's usage is charged to its limits as it flows (no handle for a body).
                let shape = resp.body().shape();
                if let Some(m) = meter.as_mut().filter(|_| shape == crate::wire::sse::Shape::EventStream) {
                    m.charge_as_it_flows(shape, log.flow());
                }
                let came = Came {
                    attempts,
                    outcome,
                    meter,
                    shape: resp.body().shape(),
                    again,
                };
                let mut resp = upstream_response(resp, (route, target), came, claims, log);
                if let Some(after) = retry_after {
                    headers::insert_retry_after(resp.headers_mut(), after);
                }
                if let Some(value) = cache_claim {
                    resp.headers_mut()
                        .insert(headers::X_REBOUND_CACHE, HeaderValue::from_static(value));
                }
                if job_run {
                    resp.extensions_mut().insert(Delivered { attempts, error: None });
                    // Filled as the body ends: the job record keeps each attempt's usage.
                    resp.extensions_mut().insert(delivery.tokens.ledger.clone());
                }
                resp
            }
            Err(err) => {
                let error = Some(err.code());
                let mut resp = error_response(err, log);
                if let Some(value) = cache_claim {
                    resp.headers_mut()
                        .insert(headers::X_REBOUND_CACHE, HeaderValue::from_static(value));
                }
                if attempts > 0 {
                    resp.headers_mut()
                        .insert(headers::X_REBOUND_ATTEMPTS, headers::attempts_value(attempts));
                    resp.extensions_mut().insert(Delivered { attempts, error });
                }
                resp
            }
        };
        resp.headers_mut()
            .insert(headers::X_REBOUND_UPSTREAM, target.header.clone());
        if route.targets.len() > 1 {
            resp.headers_mut()
                .insert(headers::X_REBOUND_FAILOVERS, HeaderValue::from(failovers));
        }
        if bypassed {
            resp.headers_mut()
                .insert(headers::X_REBOUND_IDEMPOTENCY, HeaderValue::from_static("bypassed"));
        }
        if let Some((policy, ratelimit)) = ratelimit {
            resp.headers_mut().insert(RATELIMIT_POLICY, policy);
            resp.headers_mut().insert(RATELIMIT, ratelimit);
        }
        resp
    }
}

/// The request's span, when it is recorded, names its route, provider, model and operation.
fn describe_span(trace: &traces::RequestSpan, route: &Route, named: &Named) {
    if trace.is_recording() {
        let target = route.primary();
        let provider = tokens::provider_name(&target.name, &target.upstream.config);
        let operation = named.op.as_ref().and_then(crate::wire::api::Op::operation_name);
        trace.set_route(&route.name, &provider, named.model.as_deref(), operation);
    }
}

/// An absolute-form target (`GET http://host/ HTTP/1.1`) is how forward proxies are addressed.
/// HTTP/2 requests always carry scheme and authority, so only HTTP/1 is checked.
fn is_absolute_form(parts: &http::request::Parts) -> bool {
    parts.version <= http::Version::HTTP_11 && (parts.uri.scheme().is_some() || parts.uri.authority().is_some())
}
