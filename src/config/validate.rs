//! Raw TOML → typed [`Config`]: defaults, `${VAR}` interpolation, units, cross-references.
//! Every problem is collected (not just the first) and located in the source.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};

use super::error::{ConfigError, ConfigErrors, Locator};
use super::interpolate::interpolate;
use super::raw::*;
use super::units::{parse_duration, parse_size};
use super::*;

/// Parses and validates a whole file.
pub fn parse(src: &str, path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
    let file = path.display().to_string();
    let loc = Locator::new(src);
    let raw: RawConfig = match toml::from_str(src) {
        Ok(raw) => raw,
        Err(e) => {
            let (line, column, key) = match e.span() {
                Some(span) => {
                    let (l, c) = loc.line_col(span.start);
                    (Some(l), Some(c), loc.path_at(span.start))
                }
                None => (None, None, String::new()),
            };
            return Err(ConfigErrors(vec![ConfigError {
                file,
                line,
                column,
                key,
                message: e.message().trim().to_string(),
            }]));
        }
    };
    let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut v = Validator {
        file,
        loc,
        env,
        errors: Vec::new(),
        base_dir,
    };
    let config = v.config(raw, path);
    if v.errors.is_empty() {
        Ok(config)
    } else {
        // In file order, as an editor would walk them.
        v.errors.sort_by_key(|e| (e.line.is_none(), e.line, e.column));
        Err(ConfigErrors(v.errors))
    }
}

/// An upstream's default `keepalive`: a dead peer is found within about twice this.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);

/// The defaults of a `[retry.*]` table (README, "Configuration").
pub fn default_retry(name: &str) -> RetryPolicy {
    RetryPolicy {
        name: name.to_string(),
        max_attempts: 3,
        base_delay: Duration::from_millis(500),
        max_delay: Duration::from_secs(30),
        jitter: Jitter::Full,
        per_try_timeout: Duration::from_secs(600),
        first_byte_timeout: Duration::from_secs(600),
        stream_idle_timeout: Duration::from_secs(60),
        deadline: Duration::from_secs(900),
        retry_on: vec![
            RetryOn::ConnectFailure,
            RetryOn::RefusedStream,
            RetryOn::Reset,
            RetryOn::Timeout,
            RetryOn::Status(429),
            RetryOn::Status(502),
            RetryOn::Status(503),
            RetryOn::Status(504),
        ],
        retry_once_on: vec![RetryOn::Status(500)],
        non_idempotent: NonIdempotent::All,
        respect_retry_after: true,
        max_retry_after: Duration::from_secs(60),
        budget_ratio: 0.2,
        budget_min_per_second: 10,
    }
}

struct Validator<'a> {
    file: String,
    loc: Locator<'a>,
    env: &'a dyn Fn(&str) -> Option<String>,
    errors: Vec<ConfigError>,
    base_dir: PathBuf,
}

impl Validator<'_> {
    fn err(&mut self, key: &str, message: impl Into<String>) {
        let e = self.loc.error(&self.file, key, message.into());
        self.errors.push(e);
    }

    /// An interpolated string, or `None` when absent or invalid (the error is recorded).
    fn string(&mut self, key: &str, raw: Option<&str>) -> Option<String> {
        let raw = raw?;
        match interpolate(raw, self.env) {
            Ok(s) => Some(s),
            Err(expected) => {
                self.err(key, format!("expected {expected}"));
                None
            }
        }
    }

    fn parsed<T>(&mut self, key: &str, raw: Option<&str>, default: T, parse: impl Fn(&str) -> Result<T, String>) -> T {
        let Some(s) = self.string(key, raw) else {
            return default;
        };
        match parse(&s) {
            Ok(v) => v,
            Err(expected) => {
                self.err(key, format!("expected {expected}, found {s:?}"));
                default
            }
        }
    }

    fn duration(&mut self, key: &str, raw: &Option<String>, default: Duration) -> Duration {
        self.parsed(key, raw.as_deref(), default, parse_duration)
    }

    /// A duration that must be above zero.
    fn positive_duration(&mut self, key: &str, raw: &Option<String>, default: Duration) -> Duration {
        let d = self.duration(key, raw, default);
        if d.is_zero() {
            self.err(key, "expected a duration above zero, found 0");
            return default;
        }
        d
    }

    /// An upstream's `keepalive`: a duration from 1s to 1h (TCP counts keepalive in whole
    /// seconds), or `"off"`.
    fn keepalive(&mut self, key: &str, raw: &Option<String>) -> Option<Duration> {
        let default = Some(DEFAULT_KEEPALIVE);
        let Some(s) = self.string(key, raw.as_deref()) else {
            return default;
        };
        if s.trim() == "off" {
            return None;
        }
        match parse_duration(&s) {
            Ok(d) if (Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&d) => Some(d),
            Ok(_) => {
                self.err(
                    key,
                    format!("expected a duration from 1s to 1h, or \"off\", found {s:?}"),
                );
                default
            }
            Err(expected) => {
                self.err(key, format!("expected {expected} or \"off\", found {s:?}"));
                default
            }
        }
    }

    fn size(&mut self, key: &str, raw: &Option<String>, default: u64) -> u64 {
        self.parsed(key, raw.as_deref(), default, parse_size)
    }

    fn addr(&mut self, key: &str, raw: &Option<String>, default: &str) -> SocketAddr {
        let fallback: SocketAddr = default
            .parse()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        self.parsed(key, raw.as_deref().or(Some(default)), fallback, |s| {
            s.parse::<SocketAddr>()
                .map_err(|_| "an IP address and port such as \"127.0.0.1:8080\" or \"[::1]:8080\"".to_string())
        })
    }

    fn choice<T: Copy>(&mut self, key: &str, raw: &Option<String>, default: T, choices: &[(&str, T)]) -> T {
        self.parsed(key, raw.as_deref(), default, |s| {
            choices.iter().find(|(n, _)| *n == s).map(|(_, v)| *v).ok_or_else(|| {
                format!(
                    "one of {}",
                    choices
                        .iter()
                        .map(|(n, _)| format!("\"{n}\""))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
        })
    }

    fn int(&mut self, key: &str, raw: Option<i64>, default: u32, min: u32, max: u32) -> u32 {
        match raw {
            None => default,
            Some(n) if n >= i64::from(min) && n <= i64::from(max) => n as u32,
            Some(n) => {
                self.err(key, format!("expected an integer from {min} to {max}, found {n}"));
                default
            }
        }
    }

    fn ratio(&mut self, key: &str, raw: Option<f64>, default: f64) -> f64 {
        match raw {
            None => default,
            Some(r) if (0.0..=1.0).contains(&r) => r,
            Some(r) => {
                self.err(key, format!("expected a number from 0.0 to 1.0, found {r}"));
                default
            }
        }
    }

    fn config(&mut self, raw: RawConfig, path: &Path) -> Config {
        let server = raw.server.unwrap_or_default();
        let server = ServerConfig {
            listen: self.addr("server.listen", &server.listen, "127.0.0.1:8080"),
            worker_threads: self.int("server.worker_threads", server.worker_threads, 0, 0, 256),
            max_request_body: self.size("server.max_request_body", &server.max_request_body, 8 << 20),
            shutdown_grace: self.duration("server.shutdown_grace", &server.shutdown_grace, Duration::from_secs(30)),
        };
        let admin_raw = raw.admin.unwrap_or_default();
        let admin = AdminConfig {
            listen: self.addr("admin.listen", &admin_raw.listen, "127.0.0.1:9901"),
            token: self
                .string("admin.token", admin_raw.token.as_deref())
                .filter(|t| !t.is_empty()),
        };
        if server.listen == admin.listen && server.listen.port() != 0 {
            self.err(
                "admin.listen",
                format!("expected an address other than server.listen, found {}", admin.listen),
            );
        }
        let log = raw.log.unwrap_or_default();
        let log = LogConfig {
            format: self.choice(
                "log.format",
                &log.format,
                LogFormat::Json,
                &[("json", LogFormat::Json), ("text", LogFormat::Text)],
            ),
            level: self
                .choice(
                    "log.level",
                    &log.level,
                    "info",
                    &[
                        ("error", "error"),
                        ("warn", "warn"),
                        ("info", "info"),
                        ("debug", "debug"),
                        ("trace", "trace"),
                    ],
                )
                .to_string(),
        };
        let redis = raw.redis.map(|r| self.redis(r));
        let dl = raw.dead_letters.unwrap_or_default();
        let dead_letters = DeadLettersConfig {
            max_entries: self.int("dead_letters.max_entries", dl.max_entries, 10_000, 1, 10_000_000),
            sensitive_headers: dl
                .sensitive_headers
                .unwrap_or_default()
                .iter()
                .enumerate()
                .filter_map(|(i, h)| match HeaderName::from_bytes(h.as_bytes()) {
                    Ok(h) => Some(h),
                    Err(_) => {
                        self.err(
                            &format!("dead_letters.sensitive_headers[{i}]"),
                            format!("expected a valid HTTP header name, found {h:?}"),
                        );
                        None
                    }
                })
                .collect(),
        };

        let jobs = self.jobs(raw.jobs.unwrap_or_default());

        let retry: BTreeMap<_, _> = raw
            .retry
            .iter()
            .map(|(name, r)| (name.clone(), Arc::new(self.retry(name, r))))
            .collect();
        let circuit: BTreeMap<_, _> = raw
            .circuit
            .iter()
            .map(|(name, c)| (name.clone(), Arc::new(self.circuit(name, c))))
            .collect();
        let idempotency: BTreeMap<_, _> = raw
            .idempotency
            .iter()
            .map(|(name, i)| (name.clone(), Arc::new(self.idempotency(name, i))))
            .collect();
        let upstreams: BTreeMap<_, _> = raw
            .upstreams
            .iter()
            .filter_map(|(name, u)| self.upstream(name, u, &circuit).map(|u| (name.clone(), Arc::new(u))))
            .collect();
        let mut routes = Vec::new();
        let mut names = BTreeSet::new();
        let mut prefixes = BTreeSet::new();
        for (i, r) in raw.routes.iter().enumerate() {
            if let Some(route) = self.route(i, r, &raw.upstreams, &retry, &idempotency) {
                if !names.insert(route.name.clone()) {
                    self.err(
                        &format!("routes[{i}].name"),
                        format!("expected a unique route name, found {:?} twice", route.name),
                    );
                }
                if !prefixes.insert(route.path_prefix.clone()) {
                    self.err(
                        &format!("routes[{i}].path_prefix"),
                        format!("expected a unique path_prefix, found {:?} twice", route.path_prefix),
                    );
                }
                routes.push(route);
            }
        }
        if raw.routes.is_empty() {
            self.err("routes", "expected at least one [[routes]] table, found none");
        }
        self.async_routes(&routes, redis.is_some(), &jobs);
        Config {
            source: path.to_path_buf(),
            server,
            admin,
            log,
            redis,
            dead_letters,
            jobs,
            upstreams,
            routes,
            retry,
            circuit,
            idempotency,
        }
    }

    fn jobs(&mut self, j: RawJobs) -> JobsConfig {
        let d = JobsConfig::default();
        let mut prefixes = Vec::new();
        for (i, p) in j.callback_allowed_prefixes.unwrap_or_default().iter().enumerate() {
            let key = format!("jobs.callback_allowed_prefixes[{i}]");
            let Some(p) = self.string(&key, Some(p)) else { continue };
            // The host must be closed by a '/': "https://hooks.example.com" would also allow
            // "https://hooks.example.com.attacker.net/".
            let closed = ["http://", "https://"]
                .iter()
                .find_map(|s| p.strip_prefix(s))
                .is_some_and(|rest| rest.find('/').is_some_and(|slash| slash > 0));
            if closed {
                prefixes.push(p);
            } else {
                self.err(
                    &key,
                    format!("expected an http:// or https:// URL prefix with a path, such as \"https://hooks.example.com/\", found {p:?}"),
                );
            }
        }
        let secret = self
            .string("jobs.secret", j.secret.as_deref())
            .filter(|s| !s.is_empty());
        if secret.as_ref().is_some_and(|s| s.len() < 16) {
            // Never echo the value.
            self.err(
                "jobs.secret",
                "expected at least 16 characters (a random value shared by every replica; it is not shown)",
            );
        }
        let visibility_timeout =
            self.positive_duration("jobs.visibility_timeout", &j.visibility_timeout, d.visibility_timeout);
        if visibility_timeout < Duration::from_secs(1) {
            self.err(
                "jobs.visibility_timeout",
                format!(
                    "expected at least 1s (workers heartbeat every third of it), found {}",
                    units::format_duration(visibility_timeout)
                ),
            );
        }
        JobsConfig {
            workers: self.int("jobs.workers", j.workers, d.workers, 1, 256),
            visibility_timeout,
            result_ttl: self.positive_duration("jobs.result_ttl", &j.result_ttl, d.result_ttl),
            max_queue: self.int("jobs.max_queue", j.max_queue, d.max_queue, 1, 10_000_000),
            max_result_body: self.size("jobs.max_result_body", &j.max_result_body, d.max_result_body),
            callback_allowed_prefixes: prefixes,
            secret,
        }
    }

    /// Routes with `async = true`: the job API's paths stay free, and with Redis the credentials
    /// of queued jobs need `[jobs] secret` to be sealed with.
    fn async_routes(&mut self, routes: &[RouteConfig], redis: bool, jobs: &JobsConfig) {
        let any_async = routes.iter().any(|r| r.async_jobs);
        for (i, r) in routes.iter().enumerate() {
            if any_async && (r.path_prefix.starts_with("/jobs/") || r.path_prefix == "/jobs") {
                self.err(
                    &format!("routes[{i}].path_prefix"),
                    format!(
                        "expected a prefix outside /jobs/ (the job API answers there when a route is async), found {:?}",
                        r.path_prefix
                    ),
                );
            }
            if r.async_jobs && redis && jobs.secret.is_none() {
                self.err(
                    &format!("routes[{i}].async"),
                    "expected [jobs] secret to be set: with [redis], queued requests wait in Redis and their credential headers are sealed with it (the same random value on every replica, e.g. secret = \"${REBOUND_JOBS_SECRET}\")",
                );
            }
        }
    }

    fn redis(&mut self, r: RawRedis) -> RedisConfig {
        let url = self
            .string("redis.url", r.url.as_deref())
            .unwrap_or_else(|| "redis://127.0.0.1:6379/0".into());
        if !(url.starts_with("redis://")
            || url.starts_with("rediss://")
            || url.starts_with("redis+unix://")
            || url.starts_with("unix://"))
        {
            self.err(
                "redis.url",
                format!(
                    "expected a redis://, rediss:// or unix:// URL, found {:?}",
                    redact_url(&url)
                ),
            );
        }
        RedisConfig {
            url,
            key_prefix: self
                .string("redis.key_prefix", r.key_prefix.as_deref())
                .unwrap_or_else(|| "rebound:".into()),
            command_timeout: self.positive_duration(
                "redis.command_timeout",
                &r.command_timeout,
                Duration::from_millis(100),
            ),
            sync_interval: self.positive_duration("redis.sync_interval", &r.sync_interval, Duration::from_millis(250)),
        }
    }

    fn upstream(
        &mut self,
        name: &str,
        u: &RawUpstream,
        circuits: &BTreeMap<String, Arc<CircuitPolicy>>,
    ) -> Option<UpstreamConfig> {
        let key = |k: &str| format!("upstreams.{name}.{k}");
        let Some(url) = self.string(&key("url"), u.url.as_deref()) else {
            if u.url.is_none() {
                self.err(
                    &format!("upstreams.{name}"),
                    "expected a `url` key (e.g. url = \"https://api.openai.com\"), found none",
                );
            }
            return None;
        };
        let uri: http::Uri = match url.parse() {
            Ok(u) => u,
            Err(_) => {
                self.err(
                    &key("url"),
                    format!("expected an absolute http:// or https:// URL, found {url:?}"),
                );
                return None;
            }
        };
        let (Some(scheme), Some(authority)) = (uri.scheme().cloned(), uri.authority().cloned()) else {
            self.err(
                &key("url"),
                format!("expected an absolute http:// or https:// URL, found {url:?}"),
            );
            return None;
        };
        if scheme != http::uri::Scheme::HTTP && scheme != http::uri::Scheme::HTTPS {
            self.err(
                &key("url"),
                format!("expected an http:// or https:// URL, found {url:?}"),
            );
            return None;
        }
        if uri.query().is_some() || authority.as_str().contains('@') {
            self.err(
                &key("url"),
                format!("expected a URL without query or credentials, found {url:?}"),
            );
            return None;
        }
        let base_path = uri.path().trim_end_matches('/').to_string();
        let circuit = u.circuit.clone();
        if let Some(c) = &circuit {
            if !circuits.contains_key(c) {
                self.err(
                    &key("circuit"),
                    format!(
                        "expected the name of a [circuit.*] table ({}), found {c:?}",
                        names(circuits)
                    ),
                );
            }
        }
        let cooldown = self.choice(
            &key("cooldown"),
            &u.cooldown,
            CooldownMode::Wait,
            &[
                ("wait", CooldownMode::Wait),
                ("reject", CooldownMode::Reject),
                ("off", CooldownMode::Off),
            ],
        );
        let ca_file = self.string(&key("ca_file"), u.ca_file.as_deref()).map(|p| {
            let p = PathBuf::from(p);
            if p.is_relative() && !p.exists() {
                self.base_dir.join(p)
            } else {
                p
            }
        });
        if let Some(p) = &ca_file {
            if !p.is_file() {
                self.err(
                    &key("ca_file"),
                    format!("expected a readable PEM file, found {:?} (no such file)", p.display()),
                );
            }
        }
        let mut set_headers = Vec::new();
        for (h, raw_value) in &u.set_headers {
            let k = format!("upstreams.{name}.set_headers.{h}");
            let Ok(header) = HeaderName::from_bytes(h.as_bytes()) else {
                self.err(&k, format!("expected a valid HTTP header name, found {h:?}"));
                continue;
            };
            let Some(value) = self.string(&k, Some(raw_value)) else {
                continue;
            };
            match HeaderValue::from_str(&value) {
                Ok(mut v) => {
                    v.set_sensitive(true);
                    set_headers.push((header, v));
                }
                // Never echo the value: it is usually a credential.
                Err(_) => self.err(
                    &k,
                    "expected a header value of visible ASCII characters (the value is not shown)",
                ),
            }
        }
        Some(UpstreamConfig {
            name: name.to_string(),
            scheme,
            authority,
            base_path,
            connect_timeout: self.positive_duration(
                &key("connect_timeout"),
                &u.connect_timeout,
                Duration::from_secs(5),
            ),
            keepalive: self.keepalive(&key("keepalive"), &u.keepalive),
            circuit,
            cooldown,
            ca_file,
            set_headers,
        })
    }

    fn route(
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

    fn retry_on_list(&mut self, key: &str, raw: &Option<Vec<String>>, default: Vec<RetryOn>) -> Vec<RetryOn> {
        let Some(list) = raw else { return default };
        let mut out = Vec::new();
        for (j, item) in list.iter().enumerate() {
            let k = format!("{key}[{j}]");
            let parsed = match item.as_str() {
                "connect-failure" => Some(RetryOn::ConnectFailure),
                "refused-stream" => Some(RetryOn::RefusedStream),
                "reset" => Some(RetryOn::Reset),
                "timeout" => Some(RetryOn::Timeout),
                s => match s.parse::<u16>() {
                    Ok(429) => Some(RetryOn::Status(429)),
                    Ok(code) if (500..=599).contains(&code) => Some(RetryOn::Status(code)),
                    Ok(code) if (400..=499).contains(&code) => {
                        self.err(&k, format!("expected a transient condition; {code} is a client error and is never retried (only 429 is)"));
                        None
                    }
                    _ => {
                        self.err(
                            &k,
                            format!("expected connect-failure, refused-stream, reset, timeout, \"429\" or a 5xx status, found {item:?}"),
                        );
                        None
                    }
                },
            };
            out.extend(parsed);
        }
        out
    }

    fn retry(&mut self, name: &str, r: &RawRetry) -> RetryPolicy {
        let d = default_retry(name);
        let key = |k: &str| format!("retry.{name}.{k}");
        let jitter = self.parsed(&key("jitter"), r.jitter.as_deref(), d.jitter, |s| {
            s.parse::<Jitter>()
                .map_err(|_| "one of \"full\", \"equal\", \"decorrelated\", \"none\"".to_string())
        });
        let policy = RetryPolicy {
            name: name.to_string(),
            max_attempts: self.int(&key("max_attempts"), r.max_attempts, d.max_attempts, 1, 20),
            base_delay: self.duration(&key("base_delay"), &r.base_delay, d.base_delay),
            max_delay: self.duration(&key("max_delay"), &r.max_delay, d.max_delay),
            jitter,
            per_try_timeout: self.positive_duration(&key("per_try_timeout"), &r.per_try_timeout, d.per_try_timeout),
            first_byte_timeout: self.positive_duration(
                &key("first_byte_timeout"),
                &r.first_byte_timeout,
                d.first_byte_timeout,
            ),
            stream_idle_timeout: self.positive_duration(
                &key("stream_idle_timeout"),
                &r.stream_idle_timeout,
                d.stream_idle_timeout,
            ),
            deadline: self.positive_duration(&key("deadline"), &r.deadline, d.deadline),
            retry_on: self.retry_on_list(&key("retry_on"), &r.retry_on, d.retry_on.clone()),
            retry_once_on: self.retry_on_list(&key("retry_once_on"), &r.retry_once_on, d.retry_once_on.clone()),
            non_idempotent: self.choice(
                &key("non_idempotent"),
                &r.non_idempotent,
                d.non_idempotent,
                &[("all", NonIdempotent::All), ("safe-only", NonIdempotent::SafeOnly)],
            ),
            respect_retry_after: r.respect_retry_after.unwrap_or(d.respect_retry_after),
            max_retry_after: self.duration(&key("max_retry_after"), &r.max_retry_after, d.max_retry_after),
            budget_ratio: self.ratio(&key("budget_ratio"), r.budget_ratio, d.budget_ratio),
            budget_min_per_second: self.int(
                &key("budget_min_per_second"),
                r.budget_min_per_second,
                d.budget_min_per_second,
                0,
                100_000,
            ),
        };
        if policy.base_delay > policy.max_delay {
            self.err(
                &key("max_delay"),
                format!(
                    "expected max_delay >= base_delay ({}), found {}",
                    units::format_duration(policy.base_delay),
                    units::format_duration(policy.max_delay)
                ),
            );
        }
        if policy.base_delay.is_zero() && policy.jitter != Jitter::None {
            self.err(
                &key("base_delay"),
                "expected a base_delay above zero (or jitter = \"none\"), found 0",
            );
        }
        policy
    }

    fn circuit(&mut self, name: &str, c: &RawCircuit) -> CircuitPolicy {
        let key = |k: &str| format!("circuit.{name}.{k}");
        let failure_on = match &c.failure_on {
            None => vec![
                FailureOn::ConnectFailure,
                FailureOn::Reset,
                FailureOn::Timeout,
                FailureOn::AnyServerError,
            ],
            Some(list) => {
                let mut out = Vec::new();
                for (j, item) in list.iter().enumerate() {
                    let parsed = match item.as_str() {
                        "connect-failure" => Some(FailureOn::ConnectFailure),
                        "reset" => Some(FailureOn::Reset),
                        "timeout" => Some(FailureOn::Timeout),
                        "5xx" => Some(FailureOn::AnyServerError),
                        s => match s.parse::<u16>() {
                            Ok(code) if (500..=599).contains(&code) => Some(FailureOn::Status(code)),
                            Ok(429) => {
                                self.err(
                                    &format!("{}[{j}]", key("failure_on")),
                                    "expected a failure; 429 is not one (it feeds the cooldown)",
                                );
                                None
                            }
                            _ => {
                                self.err(
                                    &format!("{}[{j}]", key("failure_on")),
                                    format!("expected connect-failure, reset, timeout, \"5xx\" or a 5xx status, found {item:?}"),
                                );
                                None
                            }
                        },
                    };
                    out.extend(parsed);
                }
                out
            }
        };
        let policy = CircuitPolicy {
            name: name.to_string(),
            consecutive_failures: self.int(&key("consecutive_failures"), c.consecutive_failures, 5, 1, 1_000_000),
            failure_rate: self.ratio(&key("failure_rate"), c.failure_rate, 0.5),
            minimum_requests: self.int(&key("minimum_requests"), c.minimum_requests, 20, 1, 1_000_000),
            window: self.positive_duration(&key("window"), &c.window, Duration::from_secs(30)),
            open_for: self.positive_duration(&key("open_for"), &c.open_for, Duration::from_secs(5)),
            max_open_for: self.positive_duration(&key("max_open_for"), &c.max_open_for, Duration::from_secs(300)),
            half_open_probes: self.int(&key("half_open_probes"), c.half_open_probes, 1, 1, 1000),
            failure_on,
            shared: c.shared.unwrap_or(true),
        };
        if policy.open_for > policy.max_open_for {
            self.err(&key("max_open_for"), "expected max_open_for >= open_for");
        }
        policy
    }

    fn idempotency(&mut self, name: &str, r: &RawIdempotency) -> IdempotencyPolicy {
        let key = |k: &str| format!("idempotency.{name}.{k}");
        let header = self.parsed(
            &key("header"),
            r.header.as_deref(),
            HeaderName::from_static("idempotency-key"),
            |s| HeaderName::from_bytes(s.as_bytes()).map_err(|_| "a valid HTTP header name".to_string()),
        );
        let store_statuses = match &r.store_statuses {
            None => vec![StatusPattern::Class(2)],
            Some(list) => {
                let mut out = Vec::new();
                for (j, s) in list.iter().enumerate() {
                    let p = if s.len() == 3 && s.ends_with("xx") {
                        s[..1]
                            .parse::<u16>()
                            .ok()
                            .filter(|c| (1..=5).contains(c))
                            .map(StatusPattern::Class)
                    } else {
                        s.parse::<u16>()
                            .ok()
                            .filter(|c| (100..=599).contains(c))
                            .map(StatusPattern::Exact)
                    };
                    match p {
                        Some(p) => out.push(p),
                        None => self.err(
                            &format!("{}[{j}]", key("store_statuses")),
                            format!("expected a status such as \"201\" or a class such as \"2xx\", found {s:?}"),
                        ),
                    }
                }
                out
            }
        };
        let scope_headers = match &r.scope_headers {
            None => ["authorization", "x-api-key", "api-key"]
                .iter()
                .map(|h| HeaderName::from_static(h))
                .collect(),
            Some(list) => {
                let mut out = Vec::new();
                for (j, h) in list.iter().enumerate() {
                    match HeaderName::from_bytes(h.as_bytes()) {
                        Ok(h) => out.push(h),
                        Err(_) => self.err(
                            &format!("{}[{j}]", key("scope_headers")),
                            format!("expected a valid HTTP header name, found {h:?}"),
                        ),
                    }
                }
                out
            }
        };
        let policy = IdempotencyPolicy {
            name: name.to_string(),
            header,
            require_key: r.require_key.unwrap_or(false),
            ttl: self.positive_duration(&key("ttl"), &r.ttl, Duration::from_secs(86_400)),
            lease: self.positive_duration(&key("lease"), &r.lease, Duration::from_secs(30)),
            on_concurrent: self.choice(
                &key("on_concurrent"),
                &r.on_concurrent,
                OnConcurrent::Wait,
                &[("wait", OnConcurrent::Wait), ("conflict", OnConcurrent::Conflict)],
            ),
            wait_timeout: self.positive_duration(&key("wait_timeout"), &r.wait_timeout, Duration::from_secs(120)),
            store_statuses,
            scope_headers,
            max_stored_body: self.size(&key("max_stored_body"), &r.max_stored_body, 16 << 20),
            complete_on_disconnect: r.complete_on_disconnect.unwrap_or(true),
            on_store_error: self.choice(
                &key("on_store_error"),
                &r.on_store_error,
                OnStoreError::FailClosed,
                &[
                    ("fail_closed", OnStoreError::FailClosed),
                    ("fail_open", OnStoreError::FailOpen),
                ],
            ),
        };
        if policy.lease >= policy.ttl {
            self.err(
                &key("lease"),
                "expected a lease shorter than ttl (the claim must lapse before the record)",
            );
        }
        policy
    }
}

fn names<V>(map: &BTreeMap<String, V>) -> String {
    if map.is_empty() {
        "none are defined".to_string()
    } else {
        map.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
    }
}
