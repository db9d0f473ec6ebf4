//! `[[routes]]`: prefixes, the targets (or the upstream and its fallbacks), the policies a route
//! names.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::super::raw::*;
use super::super::*;
use super::{names, Validator};

impl Validator<'_> {
    /// A route's reference to a policy table (`what`: "a [retry.*]") names one.
    pub(super) fn policy_name<V>(
        &mut self,
        key: &str,
        name: &Option<String>,
        what: &str,
        tables: &BTreeMap<String, V>,
    ) {
        if let Some(p) = name.as_ref().filter(|p| !tables.contains_key(*p)) {
            self.err(
                key,
                format!("expected the name of {what} table ({}), found {p:?}", names(tables)),
            );
        }
    }

    pub(super) fn route(
        &mut self,
        i: usize,
        r: &RawRoute,
        upstreams: &BTreeMap<String, RawUpstream>,
        retry: &BTreeMap<String, Arc<RetryPolicy>>,
        idempotency: &BTreeMap<String, Arc<IdempotencyPolicy>>,
    ) -> Option<RouteConfig> {
        let key = |k: &str| format!("routes[{i}].{k}");
        let mut ok = true;
        let mut required = |v: &mut Self, k: &str, val: &Option<String>, example: &str| -> String {
            match val {
                Some(s) => s.clone(),
                None => {
                    v.err(
                        &format!("routes[{i}]"),
                        format!("expected a `{k}` key (e.g. {k} = {example}), found none"),
                    );
                    ok = false;
                    String::new()
                }
            }
        };
        let name = required(self, "name", &r.name, "\"openai\"");
        let path_prefix = required(self, "path_prefix", &r.path_prefix, "\"/openai/\"");
        if !ok {
            return None;
        }
        if !path_prefix.starts_with('/') || path_prefix.contains(['?', '#', ' ']) {
            self.err(
                &key("path_prefix"),
                format!("expected a path starting with '/', such as \"/openai/\", found {path_prefix:?}"),
            );
        }
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') || name.is_empty() {
            self.err(
                &key("name"),
                format!("expected a name of letters, digits, '-' and '_' (it is a metric label), found {name:?}"),
            );
        }
        self.policy_name(&key("retry"), &r.retry, "a [retry.*]", retry);
        self.policy_name(&key("idempotency"), &r.idempotency, "an [idempotency.*]", idempotency);
        let targets = self.targets(i, r, upstreams);
        let balance = self.choice(&key("balance"), &r.balance, Balance::Ordered, Balance::CHOICES);
        let failover_on = match &r.failover_on {
            None => FailoverOn::all(),
            Some(list) => {
                let mut reasons = Vec::new();
                for (j, entry) in list.iter().enumerate() {
                    match FailoverReason::parse(entry) {
                        Some(reason) => reasons.push(reason),
                        None => self.err(
                            &format!("routes[{i}].failover_on[{j}]"),
                            format!(
                                "expected one of {}, found {entry:?}",
                                FailoverReason::ALL.map(|r| format!("\"{}\"", r.as_str())).join(", ")
                            ),
                        ),
                    }
                }
                FailoverOn::of(reasons)
            }
        };
        if balance == Balance::Weighted && targets.len() < 2 {
            self.err(
                &key("balance"),
                "expected \"weighted\" only with two targets or more (one target takes every request)",
            );
        }
        Some(RouteConfig {
            name,
            path_prefix,
            api: Api::OpenAi, // its first target's (`route_apis`)
            targets,
            balance,
            failover_on,
            failover_wait: self.duration(&key("failover_wait"), &r.failover_wait, Duration::ZERO),
            strip_prefix: r.strip_prefix.unwrap_or(false),
            retry: r.retry.clone(),
            idempotency: r.idempotency.clone(),
            cache: r.cache.clone(),
            limits: r.limits.clone().unwrap_or_default(),
            dead_letters: r.dead_letters.unwrap_or(false),
            dead_letter_bodies: r.dead_letter_bodies.unwrap_or(false),
            async_jobs: r.async_jobs.unwrap_or(false),
            continue_streams: r.continue_streams.unwrap_or(false),
        })
    }

    /// A route's targets: `targets`, or `upstream` then its `fallback`s (never both).
    fn targets(&mut self, i: usize, r: &RawRoute, upstreams: &BTreeMap<String, RawUpstream>) -> Vec<TargetConfig> {
        let key = |k: &str| format!("routes[{i}].{k}");
        let known = |n: &str| upstreams.contains_key(n);
        let expected = |n: &str| {
            format!(
                "expected the name of an [upstreams.*] table ({}), found {n:?}",
                names(upstreams)
            )
        };
        if r.targets.is_some() && (r.upstream.is_some() || r.fallback.is_some()) {
            let both = if r.upstream.is_some() { "upstream" } else { "fallback" };
            self.err(
                &key("targets"),
                format!("expected either `targets` or `upstream` (with `fallback`), found both `targets` and `{both}`"),
            );
            return Vec::new();
        }
        let raw = match (&r.targets, &r.upstream) {
            (Some(targets), _) => targets.clone(),
            (None, Some(upstream)) => {
                if !known(upstream) {
                    self.err(&key("upstream"), expected(upstream));
                }
                let fallback = r.fallback.clone().unwrap_or_default();
                for (j, f) in fallback.iter().enumerate() {
                    if !known(f) || f == upstream {
                        self.err(
                            &format!("routes[{i}].fallback[{j}]"),
                            format!(
                                "expected the name of another [upstreams.*] table ({}), found {f:?}",
                                names(upstreams)
                            ),
                        );
                    }
                }
                return std::iter::once(upstream)
                    .chain(&fallback)
                    .map(|u| TargetConfig::plain(u))
                    .collect();
            }
            (None, None) => {
                self.err(
                    &format!("routes[{i}]"),
                    "expected a `upstream` key (e.g. upstream = \"openai\") or `targets` (e.g. targets = [{ upstream = \"openai-a\" }, { upstream = \"openai-b\" }]), found neither",
                );
                return Vec::new();
            }
        };
        if raw.is_empty() {
            self.err(&key("targets"), "expected at least one target, found an empty list");
        }
        let mut targets: Vec<TargetConfig> = Vec::new();
        for (j, t) in raw.iter().enumerate() {
            if let Some(target) = self.target(i, j, t, upstreams, &targets) {
                targets.push(target);
            }
        }
        targets
    }

    /// `routes[i].targets[j]`, given the targets before it (no upstream twice).
    fn target(
        &mut self,
        i: usize,
        j: usize,
        t: &RawTarget,
        upstreams: &BTreeMap<String, RawUpstream>,
        before: &[TargetConfig],
    ) -> Option<TargetConfig> {
        let known = |n: &str| upstreams.contains_key(n);
        let tkey = |k: &str| format!("routes[{i}].targets[{j}].{k}");
        let Some(upstream) = t.upstream.clone() else {
            self.err(
                &format!("routes[{i}].targets[{j}]"),
                "expected an `upstream` key (e.g. { upstream = \"openai-b\" }), found none",
            );
            return None;
        };
        if !known(&upstream) {
            self.err(
                &tkey("upstream"),
                format!(
                    "expected the name of an [upstreams.*] table ({}), found {upstream:?}",
                    names(upstreams)
                ),
            );
        } else if before.iter().any(|o| o.upstream == upstream) {
            self.err(
                &tkey("upstream"),
                format!("expected each target to be another upstream, found {upstream:?} twice (its circuit and cooldowns are the upstream's)"),
            );
        }
        let weight = t.weight.unwrap_or(1.0);
        if !(weight > 0.0 && weight.is_finite()) {
            self.err(&tkey("weight"), format!("expected a positive number, found {weight}"));
        }
        let first_byte_timeout = t.first_byte_timeout.as_ref().map(|_| {
            self.positive_duration(
                &tkey("first_byte_timeout"),
                &t.first_byte_timeout,
                Duration::from_secs(600),
            )
        });
        let context_window = t.context_window.and_then(|n| match u64::try_from(n) {
            Ok(n) if n > 0 => Some(n),
            _ => {
                self.err(
                    &tkey("context_window"),
                    format!("expected a positive number of tokens, found {n}"),
                );
                None
            }
        });
        let models = t.models.clone().unwrap_or_default();
        for (from, to) in &models {
            if from.is_empty() || to.is_empty() {
                self.err(
                    &tkey("models"),
                    format!("expected model names on both sides, found {from:?} = {to:?}"),
                );
            }
        }
        Some(TargetConfig {
            upstream,
            weight,
            models,
            first_byte_timeout,
            context_window,
            api: Api::OpenAi, // resolved with the route's (`route_apis`)
        })
    }
}
