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
//! 6. the attempts ([`Proxy::attempts`]): admit (deadline, circuit, cooldown), send, observe,
//!    decide, until an outcome is delivered;
//! 7. a failure for good is recorded as a dead letter;
//! 8. respond ([`Proxy::respond`]): the upstream's status, headers (minus hop-by-hop) and body,
//!    streamed frame by frame through the idempotency recorder, with `x-rebound-attempts`; or
//!    rebound's own error ([`crate::error`]).

mod commit;
mod idempotent;
mod pacing;
pub mod stream;
mod tokens;
mod websocket;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response};
use http_body_util::Full;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use std::time::Duration;

use crate::circuit::{release_delay, Attempt, Circuits, Permit, CREDENTIAL_NAMES};
use crate::config::{Config, CooldownMode, RetryPolicy, RouteConfig};
use crate::dead_letters::{self, AttemptRecord, DeadLetter, DeadLetters};
use crate::error::{error_response, ProxyError};
use crate::idempotency::{AnyStore, Claim, Idempotency, MemoryLimits, MemoryStore, Records, RedisStore};
use crate::jobs::{self, Jobs};
use crate::metrics::{AttemptMetrics, Metrics, RouteMetrics, TokenMetrics};
use crate::redis::RedisHandle;
use crate::retry::policy::{Decision, Outcome, RetryState, Stop};
use crate::retry::{self, Backoff, RetryBudget};
use crate::routing::{forwarded_path, RouteTable};
use crate::time;
use crate::traces::{self, RequestSpan, Traces};
use crate::upstream::{AttemptError, Upstream, UpstreamBody};
use crate::wire::body::{self, BodyError, Delivered, ProxyBody, RequestLog};
use crate::wire::headers;
use crate::wire::sse::Shape;
use idempotent::{follow_response, idempotency_step, replay_response, Answered};
use pacing::credential_hash_of;
use stream::{ErrorWatch, IdleTimeout, Primed};
use tokens::{Meter, RequestTokens};

/// A route with everything it refers to resolved.
pub struct Route {
    pub name: Arc<str>,
    pub config: RouteConfig,
    pub retry: Arc<RetryPolicy>,
    /// Whether the route names a retry policy (rebound is then the retry layer).
    pub retries: bool,
    pub backoff: Backoff,
    /// Bounds what retries add to this route's traffic.
    pub budget: RetryBudget,
    /// The route's idempotency policy and the store, when it names one.
    pub idempotency: Option<Idempotency>,
    /// The route's upstream, then its `fallback` upstreams.
    pub targets: Targets,
    /// This route's metric children.
    pub metrics: Arc<RouteMetrics>,
}

/// An upstream a route may use.
#[derive(Clone)]
pub struct Target {
    pub name: Arc<str>,
    pub upstream: Arc<Upstream>,
    /// `x-rebound-upstream` for responses it served.
    pub header: HeaderValue,
    /// The attempt metric children for (route, this upstream).
    pub attempts: Arc<AttemptMetrics>,
    /// The token metric children for (route, this upstream).
    pub tokens: Arc<TokenMetrics>,
}

impl Target {
    fn new(route: &str, name: &str, upstream: &Arc<Upstream>, metrics: &Metrics) -> Target {
        Target {
            name: Arc::from(name),
            upstream: upstream.clone(),
            header: HeaderValue::from_str(name).unwrap_or_else(|_| HeaderValue::from_static("-")),
            attempts: Arc::new(AttemptMetrics::new(metrics, route, name)),
            tokens: Arc::new(TokenMetrics::new(
                metrics,
                route,
                name,
                &tokens::provider_name(name, &upstream.config),
            )),
        }
    }
}

/// The upstreams a route may use: its own, then its fallbacks in order (never empty).
pub struct Targets {
    primary: Target,
    fallbacks: Vec<Target>,
}

impl Targets {
    /// All of them, the route's own first.
    pub fn iter(&self) -> impl Iterator<Item = &Target> {
        std::iter::once(&self.primary).chain(&self.fallbacks)
    }
}

impl Route {
    /// The route's own upstream.
    pub fn primary(&self) -> &Target {
        &self.targets.primary
    }

    /// The target named `name` (one of `targets`; the primary if unknown).
    fn target(&self, name: &str) -> &Target {
        self.targets.iter().find(|t| &*t.name == name).unwrap_or(self.primary())
    }
}

/// Why the proxy could not be built from a (valid) config.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("upstream {name}: {source}")]
    Upstream {
        name: String,
        source: crate::upstream::SetupError,
    },
    #[error("retry policy {name}: {detail}")]
    Retry { name: String, detail: String },
}

/// The retry budget's sliding window (Linkerd's and Finagle's `ttl`).
const BUDGET_WINDOW: Duration = Duration::from_secs(10);

/// What outlives one configuration: a reload builds a new [`Proxy`] around the same metrics,
/// tasks and idempotency store (in-memory records survive a reload).
#[derive(Clone)]
pub struct Shared {
    pub metrics: Arc<Metrics>,
    /// Tasks that outlive their request (upgraded connections, idempotency writes), drained on
    /// shutdown.
    pub tasks: TaskTracker,
    /// Cancelled when the shutdown grace runs out.
    pub hard_stop: CancellationToken,
    /// The idempotency store (Redis when configured: any replica answers; else in memory), and
    /// the delivered responses this replica holds until their write lands.
    pub store: Records,
    /// Requests that failed for good: a Redis Stream when configured, else a ring in memory.
    pub dead_letters: DeadLetters,
    /// Every upstream's breaker and cooldowns (state survives reloads).
    pub circuits: Arc<Circuits>,
    /// Async jobs: the queue (Redis when configured, else in memory) and its workers.
    pub jobs: Jobs,
    /// OpenTelemetry traces (started once: a reload keeps the exporter it started with).
    pub traces: Traces,
}

impl Shared {
    /// The store for `redis`: Redis when configured (with the relay that lets duplicates follow
    /// an original on another replica, its tasks on `tasks` until `stop`), else a bounded map in
    /// memory (one replica).
    pub fn store_for(redis: Option<RedisHandle>, tasks: &TaskTracker, stop: CancellationToken) -> Records {
        match redis {
            Some(r) => Records::with_relay(AnyStore::Redis(RedisStore::new(r.clone())), r, tasks, stop),
            None => Records::new(AnyStore::Memory(MemoryStore::new(MemoryLimits::default()))),
        }
    }
}

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
    prefixes: String,
    max_request_body: u64,
    max_request_head: u64,
    metrics: Arc<Metrics>,
    /// Tasks that outlive their request (upgraded connections), drained on shutdown.
    tasks: TaskTracker,
    /// Cancelled when the shutdown grace runs out.
    hard_stop: CancellationToken,
    dead_letters: DeadLetters,
    dead_letter_config: crate::config::DeadLettersConfig,
    circuits: Arc<Circuits>,
    /// The job queue, when a route is async.
    jobs: Option<Jobs>,
    /// OpenTelemetry traces (off unless `[telemetry] otlp_endpoint` is set).
    traces: Traces,
    /// The `model` label values of the token metrics (`[metrics] models`, then `other`).
    models: tokens::Models,
}

impl Proxy {
    /// Resolves routes against upstreams and policies and builds the connection pools.
    pub fn new(config: &Config, shared: &Shared) -> Result<Proxy, BuildError> {
        shared.metrics.init_series(config);
        let Shared {
            metrics,
            tasks,
            hard_stop,
            store,
            dead_letters,
            circuits,
            jobs,
            traces,
        } = shared.clone();
        let mut upstreams = std::collections::BTreeMap::new();
        for (name, u) in &config.upstreams {
            let built = Upstream::new(u.clone()).map_err(|source| BuildError::Upstream {
                name: name.clone(),
                source,
            })?;
            upstreams.insert(name.clone(), Arc::new(built));
        }
        let no_retries = Arc::new(RetryPolicy::no_retries());
        let mut routes = Vec::new();
        for r in &config.routes {
            // Validation guarantees the references resolve; a miss would be a bug, so skip loudly.
            let Some(upstream) = upstreams.get(&r.upstream) else {
                tracing::error!(route = %r.name, upstream = %r.upstream, "route refers to an unknown upstream");
                continue;
            };
            let retry = r
                .retry
                .as_ref()
                .and_then(|p| config.retry.get(p).cloned())
                .unwrap_or_else(|| no_retries.clone());
            let invalid = |detail: String| BuildError::Retry {
                name: retry.name.clone(),
                detail,
            };
            let backoff = Backoff::try_new(retry.base_delay, retry.max_delay, retry.jitter)
                .map_err(|e| invalid(e.to_string()))?;
            let budget = RetryBudget::try_new(retry.budget_ratio, retry.budget_min_per_second, BUDGET_WINDOW)
                .map_err(|e| invalid(e.to_string()))?;
            let route = Route {
                name: Arc::from(r.name.as_str()),
                config: r.clone(),
                retries: r.retry.is_some(),
                retry,
                backoff,
                budget,
                targets: Targets {
                    primary: Target::new(&r.name, &r.upstream, upstream, &metrics),
                    fallbacks: r
                        .fallback
                        .iter()
                        .filter_map(|name| upstreams.get(name).map(|u| Target::new(&r.name, name, u, &metrics)))
                        .collect(),
                },
                metrics: Arc::new(RouteMetrics::new(&metrics, &r.name)),
                idempotency: r
                    .idempotency
                    .as_ref()
                    .and_then(|p| config.idempotency.get(p))
                    .map(|policy| {
                        Idempotency::new(
                            policy.clone(),
                            &store,
                            metrics.clone(),
                            tasks.clone(),
                            hard_stop.clone(),
                            Arc::from(r.name.as_str()),
                        )
                    }),
            };
            routes.push((r.path_prefix.clone(), Arc::new(route)));
        }
        let routes = RouteTable::new(routes);
        let prefixes = routes.prefixes().collect::<Vec<_>>().join(", ");
        Ok(Proxy {
            routes,
            prefixes,
            max_request_body: config.server.max_request_body,
            max_request_head: config.server.max_request_head,
            metrics,
            tasks,
            hard_stop,
            dead_letters,
            dead_letter_config: config.dead_letters.clone(),
            circuits,
            jobs: jobs.for_config(config),
            traces,
            models: tokens::Models::new(&config.metrics),
        })
    }

    /// Answers one request. Never fails: every error becomes a response. Generic over the body
    /// so that admin replays run through the same pipeline as client requests.
    pub async fn handle<B>(self: Arc<Self>, req: Request<B>) -> Response<ProxyBody>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<body::BoxError>,
    {
        let mut log = RequestLog::start(&self.metrics, req.method(), req.uri());
        log.set_trace(req.headers());
        let trace = self.traces.request(req.method(), req.uri().path(), req.headers());
        if trace.is_recording() {
            log.set_span(Box::new(trace.clone()), None);
        }

        // 1. Not an open proxy.
        if req.method() == Method::CONNECT {
            return error_response(ProxyError::Connect, log);
        }
        if is_absolute_form(&req) {
            return error_response(ProxyError::AbsoluteForm, log);
        }
        let head = headers::head_size(req.method(), req.uri(), req.headers());
        if head > self.max_request_head {
            let limit = self.max_request_head;
            return error_response(ProxyError::RequestHeadTooLarge { size: head, limit }, log);
        }
        // The job API (`/jobs/{id}`, `/jobs/{id}/result`), when a route is async.
        if let Some(jobs) = self.jobs.as_ref().filter(|_| jobs::is_api_path(req.uri().path())) {
            // Boxed, like every rare branch: inline, its state would make every request's future
            // larger, and each request moves that future around several times.
            return Box::pin(jobs.api(req.method(), req.uri().path(), req.headers(), log)).await;
        }

        // 2. Route.
        let Some((prefix, route)) = self.routes.find(req.uri().path()) else {
            let err = ProxyError::NoRoute {
                path: req.uri().path().to_string(),
                prefixes: self.prefixes.clone(),
            };
            return error_response(err, log);
        };
        let route = route.clone();
        log.set_route(&route.metrics);

        // 3. WebSocket upgrades pass through.
        if headers::is_upgrade(req.headers()) {
            let path = forwarded_path(req.uri().path(), prefix, route.config.strip_prefix).into_owned();
            return Box::pin(websocket::pass_through(&self, &route, &path, req, log)).await;
        }

        // 4. The request body, capped.
        let (parts, body) = req.into_parts();
        // Borrowed from the request's own path unless a prefix strip has to add a `/`.
        let path = forwarded_path(parts.uri.path(), prefix, route.config.strip_prefix);
        let job_run = parts.extensions.get::<jobs::JobRun>().is_some();
        let body = match body::read_capped(body, &parts.headers, self.max_request_body).await {
            Ok(b) => b,
            Err(BodyError::TooLarge) => {
                return error_response(
                    ProxyError::BodyTooLarge {
                        limit: self.max_request_body,
                    },
                    log,
                )
            }
            Err(BodyError::Read(e)) => return error_response(ProxyError::BadRequestBody(e), log),
        };

        // `Prefer: respond-async` on an async route: queued (202), run later by a job worker.
        if route.config.async_jobs {
            if let Some(jobs) = self.jobs.as_ref().filter(|_| jobs::wants_async(&parts)) {
                return Box::pin(jobs.submit(&route.name, route.idempotency.as_ref(), &parts, body, log)).await;
            }
        }

        // 5. Idempotency: replay a completed original, follow one in flight, refuse, or claim.
        let step = if route.idempotency.is_some() {
            idempotency_step(&route, &parts, &body, &mut log).await
        } else {
            Ok((None, false))
        };
        let (claim, bypassed) = match step {
            Ok(go_on) => go_on,
            Err(Answered::Replay(stored)) => return replay_response(stored, log),
            Err(Answered::Follow(followed)) => return follow_response(followed, log),
            Err(Answered::Refuse(err)) => return error_response(err, log),
        };

        // 6. Attempts: send, classify, decide, wait; until delivered.
        if trace.is_recording() {
            let target = route.primary();
            let provider = tokens::provider_name(&target.name, &target.upstream.config);
            let model = crate::wire::usage::request_model(&body);
            trace.set_route(&route.name, &provider, model, traces::operation_name(&path));
        }
        let delivery = self.attempts(&route, &parts, &path, &body, &trace).await;
        log.set_upstream(&delivery.upstream, delivery.attempts.len() as u32);
        log.set_wait(delivery.attempts.iter().map(|a| a.wait_ms).sum());
        log.set_usage(&delivery.tokens.ledger);

        // 7. A failure for good is recorded as a dead letter.
        if let Some(reason) = delivery.dead_letter_reason() {
            if route.config.dead_letters {
                self.record_dead_letter(&route, &parts, &body, &delivery, reason);
            }
        }

        // 8. Respond. An outcome the idempotency store keeps is recorded as it streams; any other
        // frees the key first, so that the app's retry runs instead of waiting for the lease. An
        // in-band error (a 200 whose first event is an error) is a failure: never stored.
        let claim = match claim {
            Some(c) if delivery.stored_by(&c) => Some(c),
            Some(c) => {
                Box::pin(c.release()).await;
                None
            }
            None => None,
        };
        self.respond(&route, delivery, claim, bypassed, job_run, log)
    }

    /// Step 8: the upstream's response (through the idempotency recorder when `claim` is given:
    /// the key of an outcome that is not stored was released before) or rebound's own error,
    /// with rebound's headers.
    fn respond(
        &self,
        route: &Route,
        delivery: Delivery,
        claim: Option<Claim>,
        bypassed: bool,
        job_run: bool,
        log: RequestLog,
    ) -> Response<ProxyBody> {
        let attempts = delivery.attempts.len() as u32;
        let outcome = delivery.outcome.unwrap_or(Outcome::Timeout);
        let target = route.target(&delivery.upstream);
        let mut resp = match delivery.result {
            Ok(resp) => {
                let meter = Meter::for_delivered(&resp, &target.tokens, &delivery.tokens, attempts, delivery.sent);
                let shape = resp.body().shape();
                let mut resp = upstream_response(resp, shape, route, target, (attempts, outcome), claim, log, meter);
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
        if bypassed {
            resp.headers_mut()
                .insert(headers::X_REBOUND_IDEMPOTENCY, HeaderValue::from_static("bypassed"));
        }
        resp
    }

    /// The retry loop, until an outcome is delivered, as four phases per attempt: **admit** (the
    /// deadline, the circuits choosing the upstream: the route's, else its fallbacks in order, all
    /// open: 503 `circuit_open`; the credential's cooldown: held or 429 `cooldown`), **send**,
    /// **observe** (the outcome feeds the breaker, a 429's reset hint the cooldown, the metrics)
    /// and **decide** (the pure retry policy: deliver, or wait and go round again).
    async fn attempts(
        &self,
        route: &Route,
        parts: &http::request::Parts,
        path: &str,
        body: &Bytes,
        trace: &RequestSpan,
    ) -> Delivery {
        let limits = retry::policy::request_limits(&parts.headers, &route.retry);
        let started = crate::time::now();
        let mut state = RetryState::new(limits.max_attempts, started + limits.deadline);
        if limits.sdk_retry {
            route.budget.record_external_retry(started);
        } else {
            route.budget.deposit(started);
        }
        let mut d = Progress::new(
            route.primary().name.clone(),
            limits.deadline,
            self.models.for_request(body),
            started,
        );
        let mut now = started;
        let mut waited: (Duration, Option<&'static str>) = (Duration::ZERO, None);
        loop {
            let go = match self.admit(route, parts, path, body, &state, &mut d, now).await {
                Admit::Go(go) => go,
                Admit::Held => {
                    now = crate::time::now();
                    continue;
                }
                Admit::Stop(delivery) => return delivery,
            };
            d.last = None;
            state.attempts += 1;
            d.upstream = go.target.name.clone();
            let remaining = state.deadline.saturating_duration_since(now);
            d.sent = now;
            let span = trace.attempt(state.attempts, &go.target.name, waited.0, waited.1);
            let mut req = go.req;
            span.inject(req.headers_mut());
            let (result, received) = commit::attempt(route, go.target, req, now, remaining).await;
            let (outcome, hint) = self.observe(go.target, go.permit, &go.credentials, &result, received);
            let status = result.as_ref().ok().map(|r| r.status().as_u16());
            span.end(outcome.label(), status, hint.map(|h| h.delay));
            let target = go.target;
            d.record(
                outcome,
                result.as_ref().ok().map(|r| r.status().as_u16()),
                received - now,
            );
            let decision = state.decide(
                &route.retry,
                &route.backoff,
                &parts.method,
                outcome,
                hint,
                &route.budget,
                received,
                &mut rand::rng(),
            );
            match decision {
                Decision::Retry { wait, source, reason } => {
                    self.count_retry(route, state.attempts, &reason.to_string(), wait, source.as_str());
                    d.waited(wait);
                    waited = (wait, Some(source.as_str()));
                    d.last = result.ok().map(|mut r| {
                        tokens::discard(&mut r, &target.tokens, &d.tokens, state.attempts, now);
                        r
                    });
                    tokio::time::sleep(wait).await;
                    now = crate::time::now();
                }
                Decision::Deliver(stop) => {
                    self.count_stop(route, stop);
                    let result = result.map_err(|e| {
                        tracing::warn!(route = %route.name, upstream = %target.name, error = %e, "upstream attempt failed");
                        attempt_error(&target.name, e)
                    });
                    if outcome.is_failure() && (state.attempts > 1 || stop != Stop::NotRetryable) {
                        tracing::info!(route = %route.name, attempts = state.attempts, reason = stop.as_str(), outcome = outcome.label(), "delivering failure");
                    }
                    return d.deliver(result, stop);
                }
            }
        }
    }

    /// Admission of the next attempt: the deadline, the circuits (which upstream), the request
    /// for it, and the credential's cooldown (which may hold the request, then look again).
    #[allow(clippy::too_many_arguments)]
    async fn admit<'r>(
        &self,
        route: &'r Route,
        parts: &http::request::Parts,
        path: &str,
        body: &Bytes,
        state: &RetryState,
        d: &mut Progress,
        now: Instant,
    ) -> Admit<'r> {
        if state.deadline <= now {
            let (upstream, timeout_ms) = (route.primary().name.to_string(), d.deadline.as_millis());
            return Admit::Stop(d.stop_before_attempt(Stop::Deadline, || ProxyError::Timeout { upstream, timeout_ms }));
        }
        let kind = if state.attempts == 0 {
            Attempt::First
        } else {
            Attempt::Retry
        };
        let (target, permit) = match self
            .circuits
            .admit_first(route.targets.iter().map(|t| &*t.name), kind, now)
        {
            Ok((name, permit)) => (route.target(name), permit),
            Err(retry_after) => {
                let upstream = route.primary().name.to_string();
                return Admit::Stop(
                    d.stop_before_attempt(Stop::CircuitOpen, || ProxyError::CircuitOpen { upstream, retry_after }),
                );
            }
        };
        let req = match build_upstream_request(target, parts, path, body.clone()) {
            Ok(r) => r,
            Err(e) => {
                d.last = None;
                return Admit::Stop(
                    d.stop_before_attempt(Stop::NotRetryable, || ProxyError::InvalidRequestTarget(e.to_string())),
                );
            }
        };
        // The credential is hashed only when some cooldown holds this upstream, or after a 429.
        let credentials = CREDENTIAL_NAMES.map(|h| req.headers().get(h).cloned());
        if let Some(hold) = pacing::wait(&self.circuits, target, &credentials, now, state.deadline) {
            drop(permit);
            tokio::time::sleep(hold).await;
            return Admit::Held;
        }
        if self.circuits.cooldowns_active(&target.name) {
            let credential = credential_hash_of(&credentials);
            if let Some(left) = self.circuits.cooldown_check(&target.name, &credential, now) {
                if target.upstream.config.cooldown == CooldownMode::Wait && now + left < state.deadline {
                    drop(permit);
                    let hold = release_delay(left, &mut rand::rng()).min(state.deadline - now);
                    tracing::debug!(route = %route.name, upstream = %target.name, hold_ms = hold.as_millis() as u64, "held by a cooldown");
                    tokio::time::sleep(hold).await;
                    return Admit::Held;
                }
                self.circuits.count_cooldown_rejection(&target.name);
                let upstream = target.name.to_string();
                return Admit::Stop(d.stop_before_attempt(Stop::Cooldown, || ProxyError::Cooldown {
                    upstream,
                    retry_after: left,
                }));
            }
        }
        Admit::Go(Go {
            target,
            permit,
            req,
            credentials,
        })
    }

    /// What an attempt's result tells: its outcome (counted), the breaker fed through `permit`,
    /// a 429's reset hint noted as a cooldown for the credential, and the hint for the decision.
    fn observe(
        &self,
        target: &Target,
        permit: Permit,
        credentials: &[Option<HeaderValue>; 3],
        result: &Result<Response<Primed<UpstreamBody>>, AttemptError>,
        received: Instant,
    ) -> (Outcome, Option<retry::RetryHint>) {
        let outcome = match result {
            Ok(resp) => commit::outcome_of(resp),
            Err(e) => e.outcome(),
        };
        target.attempts.count(outcome.label());
        if let Ok(resp) = result {
            pacing::note(&self.circuits, target, credentials, resp.headers(), received);
        }
        let hint = match result {
            Ok(resp) if outcome.is_failure() => retry::parse_hint(resp.headers(), time::wall_now()),
            _ => None,
        };
        permit.record(
            outcome,
            hint.filter(|h| h.source.is_explicit()).map(|h| h.delay),
            received,
        );
        if let Some(h) = hint.filter(|_| outcome.is_rate_limited()) {
            self.circuits.cooldown_note(
                &target.name,
                credential_hash_of(credentials),
                received + h.delay,
                received,
            );
        }
        (outcome, hint)
    }

    fn count_retry(&self, route: &Route, attempt: u32, reason: &str, wait: Duration, source: &str) {
        self.metrics
            .retries_total
            .with_label_values(&[&*route.name, reason])
            .inc();
        self.metrics
            .retry_wait_seconds
            .with_label_values(&[&*route.name, source])
            .observe(wait.as_secs_f64());
        tracing::debug!(route = %route.name, attempt, reason, wait_ms = wait.as_millis() as u64, source, "retrying");
    }

    fn count_stop(&self, route: &Route, stop: Stop) {
        let family = match stop {
            Stop::Exhausted => &self.metrics.retries_exhausted_total,
            Stop::BudgetExhausted => &self.metrics.retry_budget_exhausted_total,
            _ => return,
        };
        family.with_label_values(&[&*route.name]).inc();
    }

    /// Records a dead letter in the background (the response does not wait for the store).
    fn record_dead_letter(
        &self,
        route: &Route,
        parts: &http::request::Parts,
        body: &Bytes,
        d: &Delivery,
        reason: &str,
    ) {
        let idem = route.idempotency.as_ref();
        let failure = dead_letters::Failure {
            route: &route.name,
            upstream: &d.upstream,
            parts,
            body,
            keep_body: route.config.dead_letter_bodies,
            idempotency_header: idem.map(|i| &i.policy.header),
            identity: idem
                .map(|i| i.identity_of(&parts.method, parts.uri.path(), parts.uri.query(), &parts.headers, body)),
            reason,
            error_class: d.error_class(),
            final_status: d.status(),
            attempts: tokens::with_usage(&d.attempts, &d.tokens.ledger),
            job_id: parts.extensions.get::<jobs::JobRun>().map(|j| j.0.clone()),
        };
        let entry = DeadLetter::of(failure, &self.dead_letter_config);
        let store = self.dead_letters.clone();
        self.tasks.spawn(async move {
            if let Err(e) = store.add(entry).await {
                tracing::warn!(error = %e, "dead letter not recorded");
            }
        });
    }
}

/// The retry loop's account of a request so far: what each attempt did, and where.
struct Progress {
    /// The last attempt's outcome (`None` while no attempt ran).
    outcome: Option<Outcome>,
    attempts: Vec<AttemptRecord>,
    /// The upstream of the last attempt (a fallback, when the primary's circuit was open).
    upstream: Arc<str>,
    /// The last failed response, kept while waiting: delivered if no further attempt can run.
    last: Option<Response<Primed<UpstreamBody>>>,
    /// The request's whole deadline (for the error that reports it).
    deadline: Duration,
    /// The request's model label and token ledger.
    tokens: RequestTokens,
    /// When the last attempt was sent.
    sent: Instant,
}

impl Progress {
    fn new(upstream: Arc<str>, deadline: Duration, tokens: RequestTokens, started: Instant) -> Progress {
        Progress {
            outcome: None,
            attempts: Vec::new(),
            upstream,
            last: None,
            deadline,
            tokens,
            sent: started,
        }
    }

    fn record(&mut self, outcome: Outcome, status: Option<u16>, took: Duration) {
        self.outcome = Some(outcome);
        self.attempts.push(AttemptRecord {
            outcome: std::borrow::Cow::Borrowed(outcome.label()),
            status,
            duration_ms: took.as_millis() as u64,
            wait_ms: 0,
            usage: None,
        });
    }

    fn waited(&mut self, wait: Duration) {
        if let Some(a) = self.attempts.last_mut() {
            a.wait_ms = wait.as_millis() as u64;
        }
    }

    /// Ends the loop with this result.
    fn deliver(&mut self, result: Result<Response<Primed<UpstreamBody>>, ProxyError>, stop: Stop) -> Delivery {
        Delivery {
            result,
            outcome: self.outcome,
            attempts: std::mem::take(&mut self.attempts),
            stop,
            upstream: self.upstream.clone(),
            tokens: self.tokens.clone(),
            sent: self.sent,
        }
    }

    /// Ends the loop before an attempt could run: the last failed response, if one is kept,
    /// else rebound's own error.
    fn stop_before_attempt(&mut self, stop: Stop, err: impl FnOnce() -> ProxyError) -> Delivery {
        let result = self.last.take().map_or_else(|| Err(err()), Ok);
        self.deliver(result, stop)
    }
}

/// What admission decided for the next attempt.
enum Admit<'r> {
    /// Send it.
    Go(Go<'r>),
    /// A cooldown held the request for a while; admit again.
    Held,
    /// No attempt can run: this is delivered.
    Stop(Delivery),
}

/// An admitted attempt: where it goes, the circuit's permit, the request, and its credential
/// header values (hashed only when a cooldown needs them).
struct Go<'r> {
    target: &'r Target,
    permit: Permit,
    req: Request<Full<Bytes>>,
    credentials: [Option<HeaderValue>; 3],
}

/// What the retry loop hands back.
struct Delivery {
    /// The upstream's answer, or rebound's own error.
    result: Result<Response<Primed<UpstreamBody>>, ProxyError>,
    /// The last attempt's outcome (`None` when no attempt ran).
    outcome: Option<Outcome>,
    attempts: Vec<AttemptRecord>,
    stop: Stop,
    /// The upstream of the last attempt.
    upstream: Arc<str>,
    tokens: RequestTokens,
    /// When the last attempt was sent.
    sent: Instant,
}

impl Delivery {
    /// Whether `claim`'s store keeps this outcome: a response with a stored status that is not
    /// an in-band error.
    fn stored_by(&self, claim: &Claim) -> bool {
        let in_band = matches!(self.outcome, Some(Outcome::InBand(_)));
        !in_band && matches!(&self.result, Ok(r) if claim.stores(r.status().as_u16()))
    }

    /// The status the app receives.
    fn status(&self) -> u16 {
        match &self.result {
            Ok(r) => r.status().as_u16(),
            Err(e) => e.status().as_u16(),
        }
    }

    /// Why this delivery is a failure for good, if it is one: rebound stopped retrying something
    /// transient, or could not try at all (a permanent 4xx is the app's to see, not a dead letter).
    fn dead_letter_reason(&self) -> Option<&'static str> {
        let untried = matches!(self.stop, Stop::CircuitOpen | Stop::Cooldown);
        let failed = self.outcome.is_some_and(Outcome::is_failure);
        (self.stop.is_dead_letter() && (untried || failed)).then(|| self.stop.as_str())
    }

    /// The entry's error class: the last outcome, or what stopped the loop before an attempt.
    fn error_class(&self) -> &'static str {
        match (self.outcome, self.stop) {
            (_, stop @ (Stop::CircuitOpen | Stop::Cooldown)) => stop.as_str(),
            (Some(o), _) => o.label(),
            (None, _) => "timeout",
        }
    }
}

/// An absolute-form target (`GET http://host/ HTTP/1.1`) is how forward proxies are addressed.
/// HTTP/2 requests always carry scheme and authority, so only HTTP/1 is checked.
fn is_absolute_form<B>(req: &Request<B>) -> bool {
    req.version() <= http::Version::HTTP_11 && (req.uri().scheme().is_some() || req.uri().authority().is_some())
}

/// The request sent upstream: same method and body, hop-by-hop and rebound's own headers out,
/// `host` from the upstream URL, the upstream's `set_headers` in.
fn build_upstream_request(
    target: &Target,
    parts: &http::request::Parts,
    path: &str,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, http::uri::InvalidUri> {
    let uri = target.upstream.target_for(path, parts.uri.query())?;
    let body_len = body.len();
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    let headers = req.headers_mut();
    headers.clone_from(&parts.headers);
    headers::strip_hop_by_hop(headers, false);
    // Rebound's own headers out; the client sets `host` (HTTP/1.1) or `:authority` (HTTP/2)
    // from the upstream URI; the length is the buffered body's.
    headers::remove_all(headers, &headers::NOT_FORWARDED);
    if body_len > 0 || matches!(parts.method, Method::POST | Method::PUT | Method::PATCH) {
        headers.insert(http::header::CONTENT_LENGTH, HeaderValue::from(body_len));
    }
    for (name, value) in &target.upstream.config.set_headers {
        headers.insert(name.clone(), value.clone());
    }
    Ok(req)
}

fn attempt_error(upstream: &str, e: AttemptError) -> ProxyError {
    let upstream = upstream.to_string();
    match e {
        AttemptError::Timeout(t) => ProxyError::Timeout {
            upstream,
            timeout_ms: t.as_millis(),
        },
        AttemptError::Connect(detail) | AttemptError::RefusedStream(detail) | AttemptError::Reset(detail) => {
            ProxyError::UpstreamUnreachable { upstream, detail }
        }
    }
}

/// The upstream's response as it came, minus hop-by-hop headers, plus `x-rebound-attempts`. A
/// failure on a route that retries also gets `x-should-retry: false`: rebound is the retry layer,
/// the SDK must not retry on top. The body streams through under `stream_idle_timeout`; an event
/// stream is watched for an error event mid-stream (counted, passed through).
#[allow(clippy::too_many_arguments)]
fn upstream_response<B>(
    resp: Response<B>,
    shape: Shape,
    route: &Route,
    target: &Target,
    (attempts, outcome): (u32, Outcome),
    claim: Option<Claim>,
    log: RequestLog,
    meter: Option<Meter>,
) -> Response<ProxyBody>
where
    B: http_body::Body<Data = Bytes, Error = body::BoxError> + Send + Unpin + 'static,
{
    let (mut parts, body) = resp.into_parts();
    headers::strip_hop_by_hop(&mut parts.headers, false);
    parts
        .headers
        .insert(headers::X_REBOUND_ATTEMPTS, headers::attempts_value(attempts));
    if outcome.is_failure() && route.retries {
        parts
            .headers
            .insert(headers::X_SHOULD_RETRY, HeaderValue::from_static("false"));
    }
    let status = parts.status.as_u16();
    let first_event_error = matches!(outcome, Outcome::InBand(_));
    let (body, stream_error) = ErrorWatch::for_response(body, shape, first_event_error, &target.attempts, meter);
    let body = IdleTimeout::new(body, route.retry.stream_idle_timeout);
    let body = match claim {
        // A stream with an error event in it is passed through, but not stored: the key is
        // released at its end, so that the app's retry runs.
        Some(claim) => ProxyBody::new(claim.record(status, &parts.headers, body, stream_error), log, status),
        None => ProxyBody::new(body, log, status),
    };
    Response::from_parts(parts, body)
}
