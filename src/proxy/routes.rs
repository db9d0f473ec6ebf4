//! The route table of one configuration: each route with everything it refers to resolved (its
//! targets, policies, idempotency and metrics), built by [`build`].

use crate::limiter::concurrency::UpstreamLimit;
use std::time::Duration;

use super::shared::Shared;
use super::tokens;
use crate::cache::Cache;
use crate::cloud::CloudAuth;
use crate::config::{Api, Balance, Config, FailoverOn, RetryPolicy, RouteConfig, TargetConfig};
use crate::error::ProxyError;
use crate::idempotency::Idempotency;
use crate::metrics::{AttemptMetrics, Metrics, RouteMetrics, TokenMetrics};
use crate::retry::client_retry::ClientRetries;
use crate::retry::{Backoff, RetryBudget};
use crate::routing::RouteTable;
use crate::targets::Load;
use crate::upstream::Upstream;
use crate::wire::api::{self, Named};
use http::HeaderValue;
use std::sync::Arc;

/// A route with everything it refers to resolved.
pub(crate) struct Route {
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
    /// The route's response cache, when it names one.
    pub(crate) cache: Option<Cache>,
    /// Where its requests go.
    pub targets: Targets,
    /// This route's metric children.
    pub metrics: Arc<RouteMetrics>,
    /// Its recent failures for good, each until its repeats are new requests again.
    pub(crate) client_retries: ClientRetries,
    /// The `[limits.*]` a request is admitted by, in order.
    pub(crate) limits: Vec<Arc<crate::limiter::Limit>>,
}

/// An upstream a route may use.
pub(crate) struct Target {
    pub name: Arc<str>,
    /// Its place in the route's list.
    pub index: usize,
    pub upstream: Arc<Upstream>,
    /// Its weight, model rewrites, first-byte timeout and context window.
    pub config: TargetConfig,
    /// `x-rebound-upstream` for responses it served.
    pub header: HeaderValue,
    /// The attempt metric children for (route, this upstream).
    pub attempts: Arc<AttemptMetrics>,
    /// The token metric children for (route, this upstream).
    pub tokens: Arc<TokenMetrics>,
    /// This route's requests on it, on this replica.
    pub load: Load,
    /// Its cloud credential (`auth = "aws" | "gcp" | "azure"`).
    pub cloud: Option<Arc<CloudAuth>>,
    /// The route's API, when this target speaks another of its family: each request's envelope
    /// is adapted (`wire::api`).
    pub(crate) adapt_from: Option<Api>,
    /// Its upstream's `concurrency` limits, if it has one.
    pub(crate) concurrency: Option<Arc<UpstreamLimit>>,
}

impl Target {
    fn new(
        route: (&str, Api),
        (index, config): (usize, &TargetConfig),
        upstream: &Arc<Upstream>,
        metrics: &Metrics,
        cloud: Option<Arc<CloudAuth>>,
    ) -> Target {
        let name = config.upstream.as_str();
        let (route, api) = route;
        Target {
            name: Arc::from(name),
            index,
            upstream: upstream.clone(),
            config: config.clone(),
            header: HeaderValue::from_str(name).unwrap_or_else(|_| HeaderValue::from_static("-")),
            attempts: Arc::new(AttemptMetrics::new(metrics, route, name)),
            tokens: Arc::new(TokenMetrics::new(
                metrics,
                route,
                name,
                &tokens::provider_name(name, &upstream.config),
            )),
            load: Load::default(),
            cloud,
            adapt_from: (config.api != api).then_some(api),
            concurrency: None,
        }
    }
}

/// The upstreams a route may use, in its order (never empty), and how it spreads over them.
pub(crate) struct Targets {
    list: Vec<Target>,
    pub balance: Balance,
    pub failover_on: FailoverOn,
}

impl Targets {
    /// All of them, in the route's order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Target> {
        self.list.iter()
    }

    pub(super) fn len(&self) -> usize {
        self.list.len()
    }

    pub(super) fn get(&self, index: usize) -> Option<&Target> {
        self.list.get(index)
    }
}

impl Route {
    /// The route's first target.
    pub(super) fn primary(&self) -> &Target {
        &self.targets.list[0]
    }

    /// What a request to this route names (`wire::api`), read once from its forwarded path and
    /// body; refused (400, before any upstream is asked) when its path holds a dot segment, or
    /// when its model is no name a target that places it in its path allows there (the target's
    /// name for it, after its `models` map).
    pub(crate) fn named(&self, path: &str, body: &[u8]) -> Result<Named, ProxyError> {
        let invalid = |e: api::Invalid, to: Option<&Target>| {
            ProxyError::InvalidModel {
            detail: match to {
                None => e.to_string(),
                Some(t) => format!(
                    "{e} for upstream {} ({}), which names it in its paths; map it to a name {} allows in the target's `models`",
                    t.name,
                    t.config.api.as_str(),
                    t.config.api.as_str()
                ),
            },
        }
        };
        let read = Named::read(self.config.api, path, body).map_err(|e| invalid(e, None))?;
        if api::has_dot_segment(path) {
            return Err(ProxyError::InvalidRequestTarget(
                "the path holds a dot segment ('.' or '..', encoded or not), which would name another path on the host"
                    .into(),
            ));
        }
        if let Some(model) = read.model.as_deref() {
            for t in self
                .targets
                .iter()
                .filter(|t| t.adapt_from.is_some() && api::in_path(t.config.api))
            {
                let name = t.config.models.get(model).map_or(model, String::as_str);
                api::segment(t.config.api, name).map_err(|e| invalid(e, Some(t)))?;
            }
        }
        Ok(read)
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

/// The route table of `config`: routes resolved against its upstreams (their connection pools
/// built) and policies, on the process's `shared` state.
pub(super) fn build(
    config: &Config,
    shared: &Shared,
    limiter: &crate::limiter::Limiter,
) -> Result<RouteTable<Arc<Route>>, BuildError> {
    let metrics = &shared.metrics;
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
        let mut list = Vec::new();
        for (index, t) in r.targets.iter().enumerate() {
            match upstreams.get(&t.upstream) {
                Some(upstream) => {
                    let cloud = shared.clouds.for_upstream(&upstream.config, &config.cloud_env);
                    let mut target = Target::new((&r.name, r.api), (index, t), upstream, metrics, cloud);
                    target.concurrency = shared.concurrency.for_upstream(&t.upstream);
                    list.push(target);
                }
                None => {
                    tracing::error!(route = %r.name, upstream = %t.upstream, "route refers to an unknown upstream");
                }
            }
        }
        if list.len() != r.targets.len() || list.is_empty() {
            continue;
        }
        let retry = r
            .retry
            .as_ref()
            .and_then(|p| config.retry.get(p).cloned())
            .unwrap_or_else(|| no_retries.clone());
        let invalid = |detail: String| BuildError::Retry {
            name: retry.name.clone(),
            detail,
        };
        let (idempotency, cache) = records_of(config, r, shared);
        let backoff =
            Backoff::try_new(retry.base_delay, retry.max_delay, retry.jitter).map_err(|e| invalid(e.to_string()))?;
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
                list,
                balance: r.balance,
                failover_on: r.failover_on,
            },
            metrics: Arc::new(RouteMetrics::new(metrics, &r.name)),
            client_retries: ClientRetries::default(),
            limits: limiter.for_route(&r.limits),
            idempotency,
            cache,
        };
        routes.push((r.path_prefix.clone(), Arc::new(route)));
    }
    Ok(RouteTable::new(routes))
}

/// A route's idempotency and response cache, on the process's records (when it names them).
fn records_of(config: &Config, r: &RouteConfig, shared: &Shared) -> (Option<Idempotency>, Option<Cache>) {
    let route: Arc<str> = Arc::from(r.name.as_str());
    let idempotency = r
        .idempotency
        .as_ref()
        .and_then(|p| config.idempotency.get(p))
        .map(|policy| {
            Idempotency::new(
                policy.clone(),
                &shared.store,
                shared.metrics.clone(),
                shared.tasks.clone(),
                shared.hard_stop.clone(),
                route.clone(),
            )
        });
    let cache = r.cache.as_ref().and_then(|c| config.cache.get(c)).map(|policy| {
        Cache::new(
            policy,
            &shared.store,
            shared.metrics.clone(),
            shared.tasks.clone(),
            shared.hard_stop.clone(),
            route.clone(),
        )
    });
    (idempotency, cache)
}
