//! `[redis]`: exactly one topology (`url`, `cluster`, or `sentinels` with `master_name`), the
//! credentials and trust roots every node connection uses, and the timings.

use std::time::Duration;

use super::super::raw::RawRedis;
use super::super::{redact_url, RedisConfig, RedisTopology};
use super::Validator;

/// What a Redis URL may start with, per topology.
const URL_SCHEMES: [&str; 4] = ["redis://", "rediss://", "redis+unix://", "unix://"];
const NODE_SCHEMES: [&str; 2] = ["redis://", "rediss://"];

impl Validator<'_> {
    pub(super) fn redis(&mut self, r: RawRedis) -> RedisConfig {
        let topology = self.redis_topology(&r);
        let username = self
            .string("redis.username", r.username.as_deref())
            .filter(|u| !u.is_empty());
        let password = self
            .string("redis.password", r.password.as_deref())
            .filter(|p| !p.is_empty());
        self.redis_credentials_once(&topology, username.is_some(), password.is_some());
        let ca_file = self.ca_file("redis.ca_file", r.ca_file.as_deref());
        let tls = match &topology {
            RedisTopology::Standalone { url } => url.starts_with("rediss://"),
            RedisTopology::Cluster { seeds } => seeds.iter().any(|u| u.starts_with("rediss://")),
            RedisTopology::Sentinel { sentinels, .. } => sentinels.iter().any(|u| u.starts_with("rediss://")),
        };
        if ca_file.is_some() && !tls {
            self.err(
                "redis.ca_file",
                "expected rediss:// URLs with a ca_file (it holds the trust roots for TLS), found redis:// only",
            );
        }
        let wait_replicas = self.int("redis.wait_replicas", r.wait_replicas, 0, 0, 16);
        let command_timeout =
            self.positive_duration("redis.command_timeout", &r.command_timeout, Duration::from_millis(100));
        // A heartbeat, every quarter of `liveness`, must fit its command_timeout: the default
        // (1.5 s) grows with a long command_timeout; a value set below that is an error.
        let shortest = (command_timeout * 4).max(Duration::from_millis(500));
        let default = shortest.max(Duration::from_millis(1500));
        let liveness = self.duration("redis.liveness", &r.liveness, default);
        let liveness = if liveness < shortest || liveness > Duration::from_secs(60) {
            self.err(
                "redis.liveness",
                format!(
                    "expected a duration from {} (500ms, and 4 x command_timeout: a heartbeat every quarter of it must fit its command_timeout) to 60s, found {}",
                    crate::config::units::format_duration(shortest),
                    crate::config::units::format_duration(liveness)
                ),
            );
            default
        } else {
            liveness
        };
        RedisConfig {
            topology,
            username,
            password,
            ca_file,
            wait_replicas,
            key_prefix: self
                .string("redis.key_prefix", r.key_prefix.as_deref())
                .unwrap_or_else(|| "rebound:".into()),
            command_timeout,
            sync_interval: self.positive_duration("redis.sync_interval", &r.sync_interval, Duration::from_millis(250)),
            liveness,
            fingerprint: self.int("redis.fingerprint", r.fingerprint, 2, 1, 2),
        }
    }

    /// Exactly one of `url`, `cluster`, `sentinels` (with `master_name`).
    fn redis_topology(&mut self, r: &RawRedis) -> RedisTopology {
        let given: Vec<&str> = [
            ("url", r.url.is_some()),
            ("cluster", r.cluster.is_some()),
            ("sentinels", r.sentinels.is_some()),
        ]
        .iter()
        .filter(|(_, set)| *set)
        .map(|(name, _)| *name)
        .collect();
        let fallback = RedisTopology::Standalone {
            url: "redis://127.0.0.1:6379/0".into(),
        };
        if given.len() != 1 {
            let found = if given.is_empty() {
                "none".to_string()
            } else {
                given.join(" and ")
            };
            self.err(
                "redis",
                format!("expected exactly one of url (one server), cluster (Redis Cluster seed nodes) or sentinels (with master_name), found {found}"),
            );
            return fallback;
        }
        if r.master_name.is_some() && r.sentinels.is_none() {
            self.err(
                "redis.master_name",
                "expected master_name only with sentinels (it names the master they watch)",
            );
        }
        if let Some(url) = self.string("redis.url", r.url.as_deref()) {
            self.redis_url("redis.url", &url, &URL_SCHEMES);
            return RedisTopology::Standalone { url };
        }
        if let Some(seeds) = &r.cluster {
            let seeds = self.redis_urls("redis.cluster", seeds);
            return RedisTopology::Cluster { seeds };
        }
        let sentinels = self.redis_urls("redis.sentinels", r.sentinels.as_deref().unwrap_or_default());
        let master_name = self
            .string("redis.master_name", r.master_name.as_deref())
            .unwrap_or_default();
        if master_name.is_empty() {
            self.err(
                "redis.sentinels",
                "expected master_name beside sentinels (the name of the master they watch, e.g. master_name = \"mymaster\"), found none",
            );
        }
        RedisTopology::Sentinel { sentinels, master_name }
    }

    /// A list of node URLs, at least one, each redis:// or rediss://, all with the same scheme.
    fn redis_urls(&mut self, key: &str, raw: &[String]) -> Vec<String> {
        if raw.is_empty() {
            self.err(
                key,
                "expected at least one redis:// or rediss:// URL, found an empty list",
            );
        }
        let mut urls = Vec::new();
        for (i, u) in raw.iter().enumerate() {
            let k = format!("{key}[{i}]");
            if let Some(url) = self.string(&k, Some(u)) {
                self.redis_url(&k, &url, &NODE_SCHEMES);
                urls.push(url);
            }
        }
        let tls = urls.iter().filter(|u| u.starts_with("rediss://")).count();
        if tls != 0 && tls != urls.len() {
            self.err(
                key,
                "expected the same scheme for every node (all redis:// or all rediss://)",
            );
        }
        urls
    }

    fn redis_url(&mut self, key: &str, url: &str, schemes: &[&str]) {
        let scheme_ok = schemes.iter().any(|s| url.starts_with(s));
        let parsed = scheme_ok && redis::parse_redis_url(url).is_some() || url.contains("unix://");
        if !scheme_ok || !parsed {
            let names: Vec<&str> = schemes.iter().map(|s| s.trim_end_matches("://")).collect();
            self.err(
                key,
                format!(
                    "expected a {} URL such as \"redis://host:6379\", found {:?}",
                    names.join(" or "),
                    redact_url(url)
                ),
            );
        }
    }

    /// A user or password set both in a URL and as a key is ambiguous.
    fn redis_credentials_once(&mut self, topology: &RedisTopology, username: bool, password: bool) {
        let urls: Vec<&String> = match topology {
            RedisTopology::Standalone { url } => vec![url],
            RedisTopology::Cluster { seeds } => seeds.iter().collect(),
            // A sentinel URL's credentials are the sentinel's own.
            RedisTopology::Sentinel { .. } => Vec::new(),
        };
        for url in urls {
            let Some(info) = redis::parse_redis_url(url) else {
                continue;
            };
            if username && !info.username().is_empty() {
                self.err(
                    "redis.username",
                    "expected the user in one place: the URL or redis.username, found both",
                );
                return;
            }
            if password && info.password().is_some() {
                self.err(
                    "redis.password",
                    "expected the password in one place: the URL or redis.password, found both",
                );
                return;
            }
        }
    }
}
