//! The route table of one configuration: each route with everything it refers to resolved (its
//! targets, policies, idempotency and metrics), built by [`Proxy::new`].

use super::{tokens, Proxy, Shared, BUDGET_WINDOW};
use crate::config::{Config, RetryPolicy, RouteConfig};
use crate::idempotency::Idempotency;
use crate::metrics::{AttemptMetrics, Metrics, RouteMetrics, TokenMetrics};
use crate::retry::{Backoff, RetryBudget};
use crate::routing::RouteTable;
use crate::upstream::Upstream;
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
    /// The route's upstream, then its `fallback` upstreams.
    pub targets: Targets,
    /// This route's metric children.
    pub metrics: Arc<RouteMetrics>,
}

/// An upstream a route may use.
#[derive(Clone)]
pub(crate) struct Target {
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
pub(crate) struct Targets {
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
    pub(super) fn target(&self, name: &str) -> &Target {
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
}
