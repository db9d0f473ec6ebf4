//! Raw TOML → typed [`Config`]: defaults, `${VAR}` interpolation, units, cross-references.
//! Every problem is collected (not just the first) and located in the source. This file holds the
//! validator, its primitives (strings, units, choices, bounds) and the top-level tables; upstreams,
//! routes and the policy tables have a file each.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;

mod api;
mod limits;
mod policy;
mod redis;
mod route;
mod upstream;

use super::error::{ConfigError, ConfigErrors, Locator};
use super::interpolate::interpolate;
use super::raw::*;
use super::units::{parse_duration, parse_size};
use super::TelemetryConfig;
use super::*;

pub(crate) use policy::default_retry;

/// Parses and validates a whole file.
pub(crate) fn parse(src: &str, path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
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
                // One line: the parser's message may run over several, and each line of an
                // error names its place (`file:line:col: ...`).
                message: e
                    .message()
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .collect::<Vec<_>>()
                    .join("; "),
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
        credentials: Credentials::default(),
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
pub(crate) const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(15);

/// `[server] credential_headers` at most (each is looked for in every request's headers).
const MAX_CREDENTIAL_HEADERS: usize = 32;

struct Validator<'a> {
    file: String,
    loc: Locator<'a>,
    env: &'a dyn Fn(&str) -> Option<String>,
    errors: Vec<ConfigError>,
    base_dir: PathBuf,
    /// The credential forms of `[server]`, read first: the default scope of every policy.
    credentials: Credentials,
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

    /// A size within `min..=max` (the default when out of range, with an error naming the range).
    fn bounded_size(&mut self, key: &str, raw: &Option<String>, default: u64, (min, max): (u64, u64)) -> u64 {
        let n = self.size(key, raw, default);
        if (min..=max).contains(&n) {
            return n;
        }
        self.err(
            key,
            format!(
                "expected a size from {} to {}, found {}",
                super::units::format_size(min),
                super::units::format_size(max),
                super::units::format_size(n)
            ),
        );
        default
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
        let server = self.server(raw.server.unwrap_or_default());
        let admin = self.admin(raw.admin.unwrap_or_default(), &server);
        let log = self.log(raw.log.unwrap_or_default());
        let redis = raw.redis.map(|r| self.redis(r));
        let dead_letters = self.dead_letters(raw.dead_letters.unwrap_or_default());
        let jobs = self.jobs(raw.jobs.unwrap_or_default());
        let telemetry = self.telemetry(raw.telemetry.unwrap_or_default());
        let metrics = self.metrics(raw.metrics.unwrap_or_default());

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
        let cache: BTreeMap<_, _> = raw
            .cache
            .iter()
            .map(|(name, c)| (name.clone(), Arc::new(self.cache(name, c))))
            .collect();
        let limits: BTreeMap<_, _> = raw
            .limits
            .iter()
            .filter_map(|(name, l)| Some((name.clone(), Arc::new(self.limit(name, l)?))))
            .collect();
        let prices = self.prices(&raw.prices);
        let concurrency = self.concurrency(raw.concurrency.as_ref());
        let has_cloud_auth = upstreams.values().any(|u| u.auth != Auth::Static);
        let routes = self.routes(&raw.routes, (&raw.upstreams, &upstreams), &retry, &idempotency);
        self.route_caches(&raw.routes, &cache);
        self.route_limits(&raw.routes, &limits, &prices);
        self.async_routes(&routes, redis.is_some(), &jobs);
        Config {
            source: path.to_path_buf(),
            server,
            admin,
            log,
            redis,
            dead_letters,
            jobs,
            telemetry,
            metrics,
            upstreams,
            routes,
            retry,
            circuit,
            idempotency,
            cache,
            limits,
            prices,
            concurrency,
            cloud_env: match has_cloud_auth {
                true => CloudEnv::capture(self.env),
                false => CloudEnv::default(),
            },
        }
    }

    fn server(&mut self, server: RawServer) -> ServerConfig {
        let extra = self.header_names("server.credential_headers", server.credential_headers.as_deref());
        if extra.len() > MAX_CREDENTIAL_HEADERS {
            self.err(
                "server.credential_headers",
                format!("expected at most {MAX_CREDENTIAL_HEADERS} names, found {}", extra.len()),
            );
        }
        self.credentials = Credentials::with(&extra[..extra.len().min(MAX_CREDENTIAL_HEADERS)]);
        ServerConfig {
            listen: self.addr("server.listen", &server.listen, "127.0.0.1:8080"),
            worker_threads: self.int("server.worker_threads", server.worker_threads, 0, 0, 256),
            runtime: self.choice(
                "server.runtime",
                &server.runtime,
                Runtime::PerCore,
                &[("per_core", Runtime::PerCore), ("work_stealing", Runtime::WorkStealing)],
            ),
            max_request_body: self.size("server.max_request_body", &server.max_request_body, 8 << 20),
            max_request_head: self.bounded_size(
                "server.max_request_head",
                &server.max_request_head,
                64 << 10,
                (1 << 10, 1 << 20),
            ),
            max_connections: self.int("server.max_connections", server.max_connections, 10_000, 1, 1_000_000),
            header_read_timeout: self.positive_duration(
                "server.header_read_timeout",
                &server.header_read_timeout,
                Duration::from_secs(30),
            ),
            shutdown_grace: self.duration("server.shutdown_grace", &server.shutdown_grace, Duration::from_secs(30)),
            credentials: self.credentials.clone(),
        }
    }

    /// A list of header names (`KEY[i]` named in an error).
    fn header_names(&mut self, key: &str, raw: Option<&[String]>) -> Vec<HeaderName> {
        let mut out = Vec::new();
        for (i, h) in raw.unwrap_or_default().iter().enumerate() {
            match HeaderName::from_bytes(h.as_bytes()) {
                Ok(h) => out.push(h),
                Err(_) => self.err(
                    &format!("{key}[{i}]"),
                    format!("expected a valid HTTP header name, found {h:?}"),
                ),
            }
        }
        out
    }

    fn admin(&mut self, admin_raw: RawAdmin, server: &ServerConfig) -> AdminConfig {
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
        admin
    }

    fn log(&mut self, log: RawLog) -> LogConfig {
        LogConfig {
            format: self.choice("log.format", &log.format, LogFormat::Json, LogFormat::CHOICES),
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
        }
    }

    fn telemetry(&mut self, t: RawTelemetry) -> TelemetryConfig {
        let key = "telemetry.otlp_endpoint";
        let endpoint = self.string(key, t.otlp_endpoint.as_deref()).filter(|e| !e.is_empty());
        let endpoint = endpoint.and_then(|e| {
            let e = e.trim_end_matches('/').to_string();
            match e.parse::<http::Uri>() {
                Ok(u) if matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some() => Some(e),
                _ => {
                    self.err(
                        key,
                        format!(
                            "expected an http:// or https:// URL such as \"http://otel-collector:4318\", found {e:?}"
                        ),
                    );
                    None
                }
            }
        });
        TelemetryConfig {
            otlp_endpoint: endpoint,
            sample_ratio: self.ratio("telemetry.sample_ratio", t.sample_ratio, 1.0),
            service_name: self
                .string("telemetry.service_name", t.service_name.as_deref())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "rebound".to_string()),
        }
    }

    fn dead_letters(&mut self, dl: RawDeadLetters) -> DeadLettersConfig {
        DeadLettersConfig {
            max_entries: self.int("dead_letters.max_entries", dl.max_entries, 10_000, 1, 10_000_000),
            max_body: self.bounded_size("dead_letters.max_body", &dl.max_body, 1 << 20, (0, 1 << 30)),
            max_bytes: self.bounded_size("dead_letters.max_bytes", &dl.max_bytes, 64 << 20, (0, 1 << 40)),
            secret_headers: {
                let configured = self.header_names("dead_letters.sensitive_headers", dl.sensitive_headers.as_deref());
                let mut all: Vec<HeaderName> = self.credentials.secrets().cloned().collect();
                for h in configured {
                    if !all.contains(&h) {
                        all.push(h);
                    }
                }
                all
            },
        }
    }

    /// `[metrics] models`: distinct, non-empty names, at most 100 (each adds series), never
    /// `other` (the label of every model not listed).
    fn metrics(&mut self, m: RawMetrics) -> MetricsConfig {
        let mut models: Vec<String> = Vec::new();
        let raw = m.models.unwrap_or_default();
        if raw.len() > 100 {
            self.err(
                "metrics.models",
                format!("expected at most 100 models (each adds series), found {}", raw.len()),
            );
        }
        for (i, name) in raw.iter().enumerate().take(100) {
            let key = format!("metrics.models[{i}]");
            let Some(name) = self.string(&key, Some(name)) else {
                continue;
            };
            if name.is_empty() || name == "other" || name.len() > 128 || name.chars().any(char::is_control) {
                self.err(
                    &key,
                    format!("expected a model name (1 to 128 printable characters, not \"other\"), found {name:?}"),
                );
            } else if models.contains(&name) {
                self.err(&key, format!("expected each model once, found {name:?} twice"));
            } else {
                models.push(name);
            }
        }
        MetricsConfig { models }
    }

    /// Every `[[routes]]` table, with unique names and prefixes, at least one.
    fn routes(
        &mut self,
        raw_routes: &[RawRoute],
        (raw_upstreams, upstreams): (&BTreeMap<String, RawUpstream>, &BTreeMap<String, Arc<UpstreamConfig>>),
        retry: &BTreeMap<String, Arc<RetryPolicy>>,
        idempotency: &BTreeMap<String, Arc<IdempotencyPolicy>>,
    ) -> Vec<RouteConfig> {
        let mut routes = Vec::new();
        let mut names = BTreeSet::new();
        let mut prefixes = BTreeSet::new();
        for (i, r) in raw_routes.iter().enumerate() {
            if let Some(mut route) = self.route(i, r, raw_upstreams, retry, idempotency) {
                self.route_api(i, r, &mut route, upstreams);
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
        if raw_routes.is_empty() {
            self.err("routes", "expected at least one [[routes]] table, found none");
        }
        routes
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

    /// Every route's `cache` names a `[cache.*]` table.
    fn route_caches(&mut self, raw_routes: &[RawRoute], cache: &BTreeMap<String, Arc<CachePolicy>>) {
        for (i, r) in raw_routes.iter().enumerate() {
            self.policy_name(&format!("routes[{i}].cache"), &r.cache, "a [cache.*]", cache);
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
}

fn names<V>(map: &BTreeMap<String, V>) -> String {
    if map.is_empty() {
        "none are defined".to_string()
    } else {
        map.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
    }
}
