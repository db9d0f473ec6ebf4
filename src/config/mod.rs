//! Configuration: the TOML file, parsed into typed, validated values before anything binds.
//!
//! - [`raw`] mirrors the file for serde (`deny_unknown_fields`: a typo is an error, never ignored);
//! - [`validate`] turns it into [`Config`], applying defaults, `${VAR}` interpolation and units,
//!   collecting every error with its file, line, key and what was expected;
//! - [`units`] and [`interpolate`] are the pure parsers it uses.
//!
//! Policies (`[retry.*]`, `[circuit.*]`, `[idempotency.*]`) are validated here even where the
//! pipeline does not use them yet, so that a config that loads today keeps loading.

mod api;
mod cloud;
pub(crate) mod interpolate;
pub mod jitter;
mod limits;
pub mod raw;
mod spelling;
mod targets;
pub mod units;
pub(crate) mod validate;

mod error;
mod summary;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};

pub use crate::credentials::Credentials;

pub use error::{ConfigErrors, LoadError};

pub(crate) use cloud::{aws_region_of, aws_service_of};
pub use cloud::{Auth, AwsAuth, CloudEnv};
pub(crate) use cloud::{AuthKind, AwsSource, AzureSource};
pub use error::ConfigError;

pub(crate) use crate::words::Spelled;
pub(crate) use api::vertex_location_of;
pub use api::{Api, ApiOf, Family};
pub use jitter::Jitter;
pub use limits::{Concurrency, ConcurrencyBounds, LimitPolicy, OnLimit, PriceConfig, RedisDown};
pub(crate) use limits::{KeySpec, Part};
pub use targets::{Balance, FailoverOn, FailoverReason, TargetConfig};

/// The whole validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from (for messages).
    pub source: PathBuf,
    pub server: ServerConfig,
    pub admin: AdminConfig,
    pub log: LogConfig,
    /// `None`: all state in memory (one replica).
    pub redis: Option<RedisConfig>,
    pub dead_letters: DeadLettersConfig,
    pub jobs: JobsConfig,
    pub telemetry: TelemetryConfig,
    pub metrics: MetricsConfig,
    /// By name.
    pub upstreams: BTreeMap<String, Arc<UpstreamConfig>>,
    /// In file order (the route table sorts them by prefix length).
    pub routes: Vec<RouteConfig>,
    pub retry: BTreeMap<String, Arc<RetryPolicy>>,
    pub circuit: BTreeMap<String, Arc<CircuitPolicy>>,
    pub idempotency: BTreeMap<String, Arc<IdempotencyPolicy>>,
    pub cache: BTreeMap<String, Arc<CachePolicy>>,
    /// `[limits.NAME]`: request, token, concurrency and spend limits routes list.
    pub limits: BTreeMap<String, Arc<LimitPolicy>>,
    /// `[prices]`: USD per million tokens, by model (`"*"`: any other model).
    pub prices: BTreeMap<String, PriceConfig>,
    /// `[concurrency]`: the bounds of the upstreams' adaptive `concurrency`.
    pub concurrency: ConcurrencyBounds,
    /// The clouds' environment variables, captured when an upstream's `auth` is a cloud's.
    pub cloud_env: CloudEnv,
}

/// OpenTelemetry traces (`[telemetry]`): off unless an OTLP endpoint is set.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`); spans go to `/v1/traces`.
    /// `None`: no traces.
    pub otlp_endpoint: Option<String>,
    /// The share of traces sampled when the app sent no sampling decision (its own is followed).
    pub(crate) sample_ratio: f64,
    pub(crate) service_name: String,
}

/// How the worker threads share the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// One single-threaded runtime per worker, each serving its own connections (src/workers.rs):
    /// no cross-thread hop on a request's path.
    PerCore,
    /// tokio's multi-threaded runtime: any worker runs any task, and an idle one steals work.
    /// More context switches and CPU per request; serves more where a few connections at their
    /// limit bound the load and cores are idle.
    WorkStealing,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Worker threads, each a single-threaded runtime serving its own client connections
    /// (src/workers.rs); 0: one per CPU the process may use (cgroup quota and affinity
    /// included).
    pub worker_threads: u32,
    /// How the worker threads share the work (`runtime`).
    pub runtime: Runtime,
    pub max_request_body: u64,
    /// The request line and headers, at most (larger: 431 `request_head_too_large`).
    pub max_request_head: u64,
    /// Client connections held at once; beyond it new ones wait in the listen backlog.
    pub max_connections: u32,
    /// A client must send its request head within this (from connecting, or from the end of the
    /// previous response on a kept-alive connection): slow or silent clients are closed.
    pub header_read_timeout: Duration,
    pub shutdown_grace: Duration,
    /// The credential forms in force: the built-in ones and `credential_headers`.
    pub credentials: Credentials,
}

#[derive(Clone)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// `None` when empty: `/admin/*` is disabled.
    pub token: Option<String>,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

#[derive(Debug, Clone)]
pub struct LogConfig {
    pub format: LogFormat,
    /// One of error, warn, info, debug, trace: applies to rebound's own events (dependencies log
    /// at warn, so that no library ever prints a header).
    pub level: String,
}

/// Where requests that failed for good are kept, and what they never keep.
#[derive(Debug, Clone)]
pub struct DeadLettersConfig {
    /// The cap of the in-memory ring or the (approximately trimmed) Redis stream.
    pub max_entries: u32,
    /// A body larger than this is not kept (the entry says so, and is not replayable).
    pub(crate) max_body: u64,
    /// The in-memory ring's bound on the bodies it holds: the oldest entries go first.
    pub(crate) max_bytes: u64,
    /// Headers never kept in an entry (nor in a job record in the clear): every credential
    /// header in force, `set-cookie`, then `sensitive_headers`.
    pub(crate) secret_headers: Vec<HeaderName>,
}

/// Async jobs (`Prefer: respond-async` on routes with `async = true`). Read at startup: a reload
/// that changes it takes effect at the next restart.
#[derive(Clone)]
pub struct JobsConfig {
    /// Jobs run at once per process.
    pub workers: u32,
    /// A running job whose worker stops heartbeating for this long is reclaimed by another.
    pub visibility_timeout: Duration,
    /// How long a finished job (and its result) is kept; also the longest a job may wait queued.
    pub(crate) result_ttl: Duration,
    /// Unfinished jobs (queued or running) at most: fleet-wide with Redis, per process without.
    pub max_queue: u32,
    /// The largest response kept as a result.
    pub(crate) max_result_body: u64,
    /// `x-rebound-callback` URLs must start with one of these (none: callbacks refused).
    pub callback_allowed_prefixes: Vec<String>,
    /// Seals the credential headers of queued jobs in Redis; the same on every replica. Secret.
    pub secret: Option<String>,
}

impl Default for JobsConfig {
    fn default() -> JobsConfig {
        JobsConfig {
            workers: 4,
            visibility_timeout: Duration::from_secs(30),
            result_ttl: Duration::from_secs(86_400),
            max_queue: 1000,
            max_result_body: 16 << 20,
            callback_allowed_prefixes: Vec::new(),
            secret: None,
        }
    }
}

impl std::fmt::Debug for JobsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobsConfig")
            .field("workers", &self.workers)
            .field("visibility_timeout", &self.visibility_timeout)
            .field("result_ttl", &self.result_ttl)
            .field("max_queue", &self.max_queue)
            .field("max_result_body", &self.max_result_body)
            .field("callback_allowed_prefixes", &self.callback_allowed_prefixes)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Where Redis is: one of `[redis] url`, `cluster` or `sentinels` (+ `master_name`).
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTopology {
    /// One server (`redis://` or `rediss://`, or a unix socket). May hold a password: never printed.
    Standalone { url: String },
    /// Redis Cluster, from these seed nodes (URLs; the rest of the cluster is discovered).
    Cluster { seeds: Vec<String> },
    /// A master and its replicas watched by Sentinel: the sentinels' URLs and the master's name.
    Sentinel {
        sentinels: Vec<String>,
        master_name: String,
    },
}

impl RedisTopology {
    /// `standalone`, `cluster` or `sentinel`.
    pub fn kind(&self) -> &'static str {
        match self {
            RedisTopology::Standalone { .. } => "standalone",
            RedisTopology::Cluster { .. } => "cluster",
            RedisTopology::Sentinel { .. } => "sentinel",
        }
    }

    /// Every URL as written, secrets included (to compare two configurations; never printed).
    pub(crate) fn describe_secret(&self) -> String {
        match self {
            RedisTopology::Standalone { url } => url.clone(),
            RedisTopology::Cluster { seeds } => seeds.join(" "),
            RedisTopology::Sentinel { sentinels, master_name } => format!("{} {master_name}", sentinels.join(" ")),
        }
    }

    /// The topology in one line, without secrets.
    pub fn describe(&self) -> String {
        let list = |urls: &[String]| urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>().join(", ");
        match self {
            RedisTopology::Standalone { url } => format!("standalone {}", redact_url(url)),
            RedisTopology::Cluster { seeds } => format!("cluster (seeds {})", list(seeds)),
            RedisTopology::Sentinel { sentinels, master_name } => {
                format!("sentinel master {master_name:?} (sentinels {})", list(sentinels))
            }
        }
    }
}

#[derive(Clone)]
pub struct RedisConfig {
    pub topology: RedisTopology,
    /// ACL user for the data nodes (overrides one in the URLs).
    pub username: Option<String>,
    /// Secret: never printed (overrides one in the URLs).
    pub password: Option<String>,
    /// Trust roots for `rediss://` (instead of the public web roots).
    pub ca_file: Option<PathBuf>,
    /// Replica acknowledgements a completion waits for (`WAIT`); 0: none.
    pub wait_replicas: u32,
    pub key_prefix: String,
    pub command_timeout: Duration,
    pub sync_interval: Duration,
    /// How long a replica counts as alive after its last heartbeat (sent every quarter of it):
    /// past it, its followers elsewhere are aborted and its keys in progress taken over.
    pub liveness: Duration,
    /// The version of the request fingerprint written into records (2; 1 while a fleet that
    /// shares this Redis still runs builds from before version 2).
    pub fingerprint: u32,
}

impl RedisConfig {
    /// A standalone server at `url` with the defaults of everything else (tests, tools).
    pub fn standalone(url: &str) -> RedisConfig {
        RedisConfig {
            topology: RedisTopology::Standalone { url: url.to_string() },
            username: None,
            password: None,
            ca_file: None,
            wait_replicas: 0,
            key_prefix: "rebound:".into(),
            command_timeout: Duration::from_millis(100),
            sync_interval: Duration::from_millis(250),
            liveness: Duration::from_millis(1500),
            fingerprint: 2,
        }
    }
}

impl RedisConfig {
    /// The same settings on another topology.
    pub fn with_topology(self, topology: RedisTopology) -> RedisConfig {
        RedisConfig { topology, ..self }
    }
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("topology", &self.topology.describe())
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("ca_file", &self.ca_file)
            .field("wait_replicas", &self.wait_replicas)
            .field("key_prefix", &self.key_prefix)
            .field("command_timeout", &self.command_timeout)
            .field("sync_interval", &self.sync_interval)
            .field("liveness", &self.liveness)
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

/// `redis://user:secret@host/0` → `redis://***@host/0`.
pub(crate) fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***{}", &url[..s], &url[at..]),
        _ => url.to_string(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CooldownMode {
    Wait,
    Reject,
    Off,
}

/// What an upstream's rate limits (cooldowns, pacing) are kept per
/// (`[upstreams.NAME] rate_limit_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimitScope {
    /// Per credential and model: a 429 on one model never holds another (providers limit per
    /// model); a used-up quota still holds the whole credential.
    Model,
    /// Per credential: one scope for every model.
    Credential,
}

/// Pacing (`[upstreams.NAME] pacing`): what a credential whose request quota is nearly spent does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacingMode {
    /// New requests with it wait for the quota's reset.
    Wait,
    Off,
}

/// `[metrics]`: what bounds the labels rebound cannot take from the config alone.
#[derive(Debug, Clone, Default)]
pub struct MetricsConfig {
    /// The `model` label values of the token metrics; any other model counts as `other`.
    pub models: Vec<String>,
}

impl RouteConfig {
    /// The upstreams of its targets, in order.
    pub fn upstreams(&self) -> impl Iterator<Item = &str> {
        self.targets.iter().map(|t| t.upstream.as_str())
    }
}

impl MetricsConfig {}

#[derive(Clone)]
pub struct UpstreamConfig {
    pub name: String,
    /// `http` or `https`.
    pub scheme: http::uri::Scheme,
    pub authority: http::uri::Authority,
    /// The URL's path without a trailing slash (`""` for none): prepended to forwarded paths.
    pub(crate) base_path: String,
    pub connect_timeout: Duration,
    /// Liveness probing of idle-looking connections (`None`: off): TCP keepalive on every
    /// connection, HTTP/2 PINGs while a request is in flight. See [`UpstreamConfig::keepalive`].
    pub keepalive: Option<Duration>,
    pub circuit: Option<String>,
    pub cooldown: CooldownMode,
    pub rate_limit_scope: RateLimitScope,
    pub pacing: PacingMode,
    /// Pacing starts when a response says at most this many requests are left.
    pub pacing_reserve: u32,
    pub ca_file: Option<PathBuf>,
    /// Set on every request to this upstream, replacing what the app sent. Values are secret.
    pub set_headers: Vec<(HeaderName, HeaderValue)>,
    /// Whether rebound sets the credential (`set_headers` sets a credential header, or `auth` is
    /// a cloud's): the app's own credentials (headers and query parameters) are then left out of
    /// the request upstream.
    pub sets_credential: bool,
    /// Where the credential comes from (`static`: `set_headers`).
    pub auth: Auth,
    /// The API it speaks: `api`, else its host's; a host rebound does not know speaks its route's.
    pub api: ApiOf,
    /// Where a Vertex AI host serves the model (its paths name them): `gcp_project`,
    /// `gcp_location` (else the host's region, `global` for `aiplatform.googleapis.com`).
    pub(crate) gcp_project: Option<String>,
    pub(crate) gcp_location: Option<String>,
    /// Azure OpenAI's `azure_api_version`: deployment paths with this `api-version`; `None`: the
    /// v1 API (`/openai/v1/...`, the model in the body).
    pub(crate) azure_api_version: Option<String>,
    /// Requests in flight at once per credential and model, across the fleet (`None`: no
    /// limit).
    pub concurrency: Option<Concurrency>,
}

impl UpstreamConfig {
    /// The configured URL, for messages.
    pub fn url(&self) -> String {
        format!("{}://{}{}", self.scheme, self.authority, self.base_path)
    }
}

impl std::fmt::Debug for UpstreamConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConfig")
            .field("name", &self.name)
            .field("url", &self.url())
            .field("connect_timeout", &self.connect_timeout)
            .field("keepalive", &self.keepalive)
            .field("circuit", &self.circuit)
            .field("cooldown", &self.cooldown)
            .field("pacing", &self.pacing)
            .field("pacing_reserve", &self.pacing_reserve)
            .field("concurrency", &self.concurrency)
            .field("ca_file", &self.ca_file)
            .field(
                "set_headers",
                &self
                    .set_headers
                    .iter()
                    .map(|(k, _)| (k.as_str(), "<redacted>"))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub name: String,
    pub path_prefix: String,
    /// The API its app speaks: its first target's.
    pub api: Api,
    /// Where its requests go (never empty): `targets`, or `upstream` then its `fallback`s.
    pub targets: Vec<TargetConfig>,
    pub balance: Balance,
    pub failover_on: FailoverOn,
    /// A 429 (or a cooldown) whose reset is at most this long is waited for on the target the
    /// request is on rather than failing over (0: never).
    pub failover_wait: Duration,
    pub strip_prefix: bool,
    pub retry: Option<String>,
    pub idempotency: Option<String>,
    /// A `[cache.*]` policy: identical requests answered from the store.
    pub cache: Option<String>,
    /// The `[limits.*]` a request must be admitted by, in order.
    pub limits: Vec<String>,
    pub dead_letters: bool,
    pub dead_letter_bodies: bool,
    pub async_jobs: bool,
    /// A streamed generation cut after bytes reached the app is finished by another attempt.
    pub continue_streams: bool,
}

/// What a retry policy may retry on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryOn {
    ConnectFailure,
    RefusedStream,
    Reset,
    Timeout,
    Status(u16),
}

impl std::fmt::Display for RetryOn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RetryOn::ConnectFailure => f.write_str("connect-failure"),
            RetryOn::RefusedStream => f.write_str("refused-stream"),
            RetryOn::Reset => f.write_str("reset"),
            RetryOn::Timeout => f.write_str("timeout"),
            RetryOn::Status(s) => write!(f, "{s}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonIdempotent {
    /// Retry POST/PATCH only when the provider surely did not process the request.
    SafeOnly,
    /// Also retry timeouts, resets, 502 and 504 (may cost a second generation).
    All,
}

#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub name: String,
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
    pub jitter: Jitter,
    pub per_try_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub stream_idle_timeout: Duration,
    pub deadline: Duration,
    pub retry_on: Vec<RetryOn>,
    pub retry_once_on: Vec<RetryOn>,
    pub non_idempotent: NonIdempotent,
    pub(crate) respect_retry_after: bool,
    pub max_retry_after: Duration,
    pub budget_ratio: f64,
    pub budget_min_per_second: u32,
}

impl RetryPolicy {
    /// The policy of a route that names none: one attempt, the default timeouts.
    pub(crate) fn no_retries() -> RetryPolicy {
        RetryPolicy {
            name: "(none)".into(),
            max_attempts: 1,
            ..validate::default_retry("(none)")
        }
    }
}

/// What counts as a failure for a circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureOn {
    ConnectFailure,
    Reset,
    Timeout,
    AnyServerError,
    Status(u16),
}

#[derive(Debug, Clone)]
pub struct CircuitPolicy {
    pub name: String,
    pub consecutive_failures: u32,
    pub failure_rate: f64,
    pub minimum_requests: u32,
    pub window: Duration,
    pub open_for: Duration,
    pub max_open_for: Duration,
    pub half_open_probes: u32,
    pub failure_on: Vec<FailureOn>,
    pub shared: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnConcurrent {
    /// Duplicates receive the original's response as it is produced.
    Follow,
    Wait,
    Conflict,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStoreError {
    FailClosed,
    FailOpen,
}

/// A status or a class of statuses (`"2xx"`, `"201"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatusPattern {
    Class(u16),
    Exact(u16),
}

/// As the config writes it: `2xx`, `201`.
impl std::fmt::Display for StatusPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatusPattern::Class(c) => write!(f, "{c}xx"),
            StatusPattern::Exact(s) => write!(f, "{s}"),
        }
    }
}

impl StatusPattern {
    pub(crate) fn matches(&self, status: u16) -> bool {
        match *self {
            StatusPattern::Class(c) => status / 100 == c,
            StatusPattern::Exact(s) => status == s,
        }
    }
}

/// A `[cache.NAME]` table: identical requests (the idempotency fingerprint, within the scope of
/// `scope_headers`) answered from the store for `ttl`.
#[derive(Debug, Clone)]
pub struct CachePolicy {
    pub name: String,
    pub ttl: Duration,
    pub(crate) statuses: Vec<StatusPattern>,
    pub max_entry_size: u64,
    pub scope_headers: Vec<HeaderName>,
}

#[derive(Debug, Clone)]
pub struct IdempotencyPolicy {
    pub name: String,
    pub header: HeaderName,
    pub require_key: bool,
    pub ttl: Duration,
    pub lease: Duration,
    pub on_concurrent: OnConcurrent,
    pub wait_timeout: Duration,
    pub(crate) store_statuses: Vec<StatusPattern>,
    pub scope_headers: Vec<HeaderName>,
    pub max_stored_body: u64,
    pub complete_on_disconnect: bool,
    pub on_store_error: OnStoreError,
}

impl Config {
    /// Reads, interpolates from the process environment and validates `path`.
    pub fn load(path: &Path) -> Result<Config, LoadError> {
        Self::load_with_env(path, &|name| std::env::var(name).ok())
    }

    /// As [`Config::load`], with the environment given (tests never touch the process's).
    pub fn load_with_env(path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, LoadError> {
        let src = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            file: path.display().to_string(),
            source,
        })?;
        Ok(Self::parse(&src, path, env)?)
    }

    /// Parses and validates `src`; `path` names it in errors.
    pub fn parse(src: &str, path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
        validate::parse(src, path, env)
    }

    /// The effective routes and policies, readable (for `rebound check`). Secrets are redacted.
    pub fn summary(&self) -> String {
        summary::render(self)
    }
}
