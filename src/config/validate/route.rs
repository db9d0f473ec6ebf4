//! `[[routes]]`: prefixes, the upstream and its fallbacks, the policies a route names.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::super::raw::*;
use super::super::*;
use super::{names, Validator};

impl Validator<'_> {
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
        let upstream = required(self, "upstream", &r.upstream, "\"openai\"");
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
        let known = |n: &str| upstreams.contains_key(n);
        if !known(&upstream) {
            self.err(
                &key("upstream"),
                format!(
                    "expected the name of an [upstreams.*] table ({}), found {upstream:?}",
                    names(upstreams)
                ),
            );
        }
        if let Some(p) = &r.retry {
            if !retry.contains_key(p) {
                self.err(
                    &key("retry"),
                    format!("expected the name of a [retry.*] table ({}), found {p:?}", names(retry)),
                );
            }
        }
        if let Some(p) = &r.idempotency {
            if !idempotency.contains_key(p) {
                self.err(
                    &key("idempotency"),
                    format!(
                        "expected the name of an [idempotency.*] table ({}), found {p:?}",
                        names(idempotency)
                    ),
                );
            }
        }
        let fallback = r.fallback.clone().unwrap_or_default();
        for (j, f) in fallback.iter().enumerate() {
            if !known(f) || *f == upstream {
                self.err(
                    &format!("routes[{i}].fallback[{j}]"),
                    format!(
                        "expected the name of another [upstreams.*] table ({}), found {f:?}",
                        names(upstreams)
                    ),
                );
            }
        }
        Some(RouteConfig {
            name,
            path_prefix,
            upstream,
            strip_prefix: r.strip_prefix.unwrap_or(false),
            retry: r.retry.clone(),
            idempotency: r.idempotency.clone(),
            fallback,
            dead_letters: r.dead_letters.unwrap_or(false),
            dead_letter_bodies: r.dead_letter_bodies.unwrap_or(false),
            async_jobs: r.async_jobs.unwrap_or(false),
        })
    }
}
