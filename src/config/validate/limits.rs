//! `[limits.NAME]`, `[prices]` and the `limits` a route lists.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::super::limits::MICRO;
use super::super::raw::RawConcurrency;
use super::super::raw::{RawLimit, RawPrice, RawRoute};
use super::super::{Concurrency, ConcurrencyBounds, KeySpec, LimitPolicy, OnLimit, PriceConfig, RedisDown};
use super::{names, Validator};

/// The longest `max_wait` (a request held longer than this is better answered 429).
const MAX_WAIT_CAP: Duration = Duration::from_secs(600);

/// The most requests an upstream's `concurrency` admits at once.
const MAX_CONCURRENCY: u32 = 1_000_000;

impl Validator<'_> {
    /// An upstream's `concurrency`: a number from 1, or `"adaptive"`.
    pub(super) fn upstream_concurrency(&mut self, key: &str, raw: Option<&toml::Value>) -> Option<Concurrency> {
        let expected = format!("expected an integer from 1 to {MAX_CONCURRENCY} or \"adaptive\"");
        match raw? {
            toml::Value::String(s) if s == "adaptive" => Some(Concurrency::Adaptive),
            toml::Value::Integer(n) if (1..=i64::from(MAX_CONCURRENCY)).contains(n) => {
                Some(Concurrency::Fixed(*n as u32))
            }
            other => {
                self.err(key, format!("{expected}, found {other}"));
                None
            }
        }
    }

    /// `[concurrency]`: `min <= initial <= max`, from 1.
    pub(super) fn concurrency(&mut self, raw: Option<&RawConcurrency>) -> ConcurrencyBounds {
        let d = ConcurrencyBounds::default();
        let Some(r) = raw else { return d };
        let min = self.int("concurrency.min", r.min, d.min, 1, MAX_CONCURRENCY);
        let max = self.int("concurrency.max", r.max, d.max.max(min), 1, MAX_CONCURRENCY);
        let initial = self.int(
            "concurrency.initial",
            r.initial,
            d.initial.clamp(min, max.max(min)),
            1,
            MAX_CONCURRENCY,
        );
        if min > max {
            self.err(
                "concurrency.max",
                format!("expected at least concurrency.min ({min}), found {max}"),
            );
        } else if !(min..=max).contains(&initial) {
            self.err(
                "concurrency.initial",
                format!("expected from concurrency.min ({min}) to concurrency.max ({max}), found {initial}"),
            );
        }
        ConcurrencyBounds { initial, min, max }
    }

    /// A `[limits.NAME]` table.
    pub(super) fn limit(&mut self, name: &str, r: &RawLimit) -> Option<LimitPolicy> {
        let key = |k: &str| format!("limits.{name}.{k}");
        let spec = match &r.key {
            Some(raw) => self.key_spec(&key("key"), raw),
            None => {
                self.err(
                    &key("key"),
                    "expected who is limited: \"route\", \"credential\", \"model\" or \"header:NAME\", joined with \"+\"",
                );
                None
            }
        };
        let count = |v: &mut Self, k: &str, raw: Option<i64>| -> Option<u64> {
            match raw {
                None => None,
                Some(n) if n >= 1 => Some(n as u64),
                Some(n) => {
                    v.err(&key(k), format!("expected an integer of at least 1, found {n}"));
                    None
                }
            }
        };
        let requests_per_minute = count(self, "requests_per_minute", r.requests_per_minute);
        let tokens_per_minute = count(self, "tokens_per_minute", r.tokens_per_minute);
        let concurrent = count(self, "concurrent", r.concurrent).map(|n| n.min(u64::from(u32::MAX)) as u32);
        let micro_usd_per_day = self.usd(&key("usd_per_day"), r.usd_per_day);
        let micro_usd_per_month = self.usd(&key("usd_per_month"), r.usd_per_month);
        let quotas = [
            requests_per_minute,
            tokens_per_minute,
            concurrent.map(u64::from),
            micro_usd_per_day,
            micro_usd_per_month,
        ];
        if quotas.iter().all(Option::is_none) {
            self.err(
                &format!("limits.{name}"),
                "expected at least one of requests_per_minute, tokens_per_minute, concurrent, usd_per_day, usd_per_month",
            );
        }
        let on_limit = self.choice(
            &key("on_limit"),
            &r.on_limit,
            OnLimit::Queue,
            &[("queue", OnLimit::Queue), ("reject", OnLimit::Reject)],
        );
        let max_wait = self.positive_duration(&key("max_wait"), &r.max_wait, Duration::from_secs(30));
        if max_wait > MAX_WAIT_CAP {
            self.err(&key("max_wait"), "expected at most 10m");
        }
        let share_by = r.share_by.as_ref().and_then(|raw| self.key_spec(&key("share_by"), raw));
        let weights = self.weights(&key("weights"), r.weights.as_ref());
        if r.weights.is_some() && r.share_by.is_none() {
            self.err(
                &key("weights"),
                "expected share_by beside weights: they weigh share_by's values (e.g. share_by = \"header:x-team\")",
            );
        }
        if on_limit == OnLimit::Reject && (r.weights.is_some() || r.share_by.is_some() || r.max_wait.is_some()) {
            self.err(
                &key("on_limit"),
                "expected \"queue\" where max_wait, weights or share_by are set (they shape the queue)",
            );
        }
        let redis_down = self.choice(
            &key("redis_down"),
            &r.redis_down,
            RedisDown::Local,
            &[
                ("local", RedisDown::Local),
                ("open", RedisDown::Open),
                ("closed", RedisDown::Closed),
            ],
        );
        // An invalid key was reported: the load fails, and the placeholder is never used.
        let key = spec.or_else(|| KeySpec::parse("route").ok())?;
        Some(LimitPolicy {
            name: name.to_string(),
            key,
            requests_per_minute,
            tokens_per_minute,
            concurrent,
            micro_usd_per_day,
            micro_usd_per_month,
            on_limit,
            max_wait,
            weights,
            share_by,
            redis_down,
        })
    }

    /// `weights`: each value's share, from 1 to 1000.
    fn weights(&mut self, key: &str, raw: Option<&BTreeMap<String, i64>>) -> BTreeMap<String, u32> {
        let mut weights = BTreeMap::new();
        for (value, w) in raw.into_iter().flatten() {
            match u32::try_from(*w).ok().filter(|w| (1..=1000).contains(w)) {
                Some(w) => {
                    weights.insert(value.clone(), w);
                }
                None => self.err(
                    &format!("{key}.{value}"),
                    format!("expected an integer from 1 to 1000, found {w}"),
                ),
            }
        }
        weights
    }

    fn key_spec(&mut self, key: &str, raw: &str) -> Option<KeySpec> {
        match raw.parse::<KeySpec>() {
            Ok(spec) => {
                // The forms `[server] credential_headers` adds are credentials too.
                if let Some(h) = self.credentials.headers().iter().find(|h| spec.names_header(h)) {
                    self.err(key, format!("expected \"credential\" (its hash) to key by a credential, found the credential header {:?}", h.as_str()));
                    return None;
                }
                Some(spec)
            }
            Err(expected) => {
                self.err(key, format!("expected {expected}, found {raw:?}"));
                None
            }
        }
    }

    /// A spend in USD (above zero, at most a billion), as micro-USD.
    fn usd(&mut self, key: &str, raw: Option<f64>) -> Option<u64> {
        let usd = raw?;
        if !(usd.is_finite() && usd > 0.0 && usd <= 1e9) {
            self.err(key, format!("expected an amount of USD above 0, found {usd}"));
            return None;
        }
        Some((usd * MICRO).ceil() as u64)
    }

    /// `[prices]`: USD per million tokens, by model.
    pub(super) fn prices(&mut self, raw: &BTreeMap<String, RawPrice>) -> BTreeMap<String, PriceConfig> {
        let mut out = BTreeMap::new();
        for (model, p) in raw {
            let key = |k: &str| format!("prices.{model:?}.{k}");
            let amount = |v: &mut Self, k: &str, raw: Option<f64>| -> Option<f64> {
                match raw {
                    Some(x) if x.is_finite() && (0.0..=1e6).contains(&x) => Some(x),
                    Some(x) => {
                        v.err(
                            &key(k),
                            format!("expected USD per million tokens, from 0 to 1000000, found {x}"),
                        );
                        None
                    }
                    None => None,
                }
            };
            let input = amount(self, "input", p.input);
            let output = amount(self, "output", p.output);
            let cached_input = amount(self, "cached_input", p.cached_input);
            match (input, output) {
                (Some(input), Some(output)) => {
                    let cached_input = cached_input.unwrap_or(input);
                    out.insert(
                        model.clone(),
                        PriceConfig {
                            input,
                            output,
                            cached_input,
                        },
                    );
                }
                _ => self.err(
                    &format!("prices.{model:?}"),
                    "expected { input = USD, output = USD } per million tokens (cached_input optional)",
                ),
            }
        }
        out
    }

    /// Every route's `limits` name `[limits.*]` tables, once each; a spend limit needs `[prices]`.
    pub(super) fn route_limits(
        &mut self,
        raw_routes: &[RawRoute],
        limits: &BTreeMap<String, Arc<LimitPolicy>>,
        prices: &BTreeMap<String, PriceConfig>,
    ) {
        for (i, r) in raw_routes.iter().enumerate() {
            for (j, name) in r.limits.iter().flatten().enumerate() {
                let key = format!("routes[{i}].limits[{j}]");
                if !limits.contains_key(name) {
                    self.err(
                        &key,
                        format!(
                            "expected the name of a [limits.*] table ({}), found {name:?}",
                            names(limits)
                        ),
                    );
                } else if r.limits.iter().flatten().take(j).any(|n| n == name) {
                    self.err(&key, format!("expected each limit once, found {name:?} again"));
                }
            }
        }
        for (name, l) in limits {
            let spends = l.micro_usd_per_day.is_some() || l.micro_usd_per_month.is_some();
            if spends && prices.is_empty() {
                self.err(
                    &format!("limits.{name}"),
                    "expected a [prices] table beside usd_per_day / usd_per_month (spend is priced from it)",
                );
            }
        }
    }
}
