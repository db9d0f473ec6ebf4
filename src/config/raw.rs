//! The configuration file as TOML sees it: a serde mirror with `deny_unknown_fields`, every value
//! optional (defaults are applied in `validate`), units still strings. Serialisable too: the tests
//! build their configurations with it (`tests/it/support/config_builder.rs`), so that a misspelt
//! key does not compile.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub server: Option<RawServer>,
    pub admin: Option<RawAdmin>,
    pub log: Option<RawLog>,
    pub redis: Option<RawRedis>,
    pub dead_letters: Option<RawDeadLetters>,
    pub jobs: Option<RawJobs>,
    pub telemetry: Option<RawTelemetry>,
    pub metrics: Option<RawMetrics>,
    #[serde(default)]
    pub upstreams: BTreeMap<String, RawUpstream>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    #[serde(default)]
    pub retry: BTreeMap<String, RawRetry>,
    #[serde(default)]
    pub circuit: BTreeMap<String, RawCircuit>,
    #[serde(default)]
    pub idempotency: BTreeMap<String, RawIdempotency>,
    #[serde(default)]
    pub cache: BTreeMap<String, RawCache>,
    #[serde(default)]
    pub limits: BTreeMap<String, RawLimit>,
    /// The tuning of every adaptive `concurrency`.
    pub concurrency: Option<RawConcurrency>,
    /// USD per million tokens, by model.
    #[serde(default)]
    pub prices: BTreeMap<String, RawPrice>,
}

/// A `[limits.NAME]` table.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimit {
    pub key: Option<String>,
    pub requests_per_minute: Option<i64>,
    pub tokens_per_minute: Option<i64>,
    pub concurrent: Option<i64>,
    pub usd_per_day: Option<f64>,
    pub usd_per_month: Option<f64>,
    pub on_limit: Option<String>,
    pub max_wait: Option<String>,
    pub weights: Option<BTreeMap<String, i64>>,
    pub share_by: Option<String>,
    pub redis_down: Option<String>,
}

/// A model's price in `[prices]`: USD per million tokens.
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrice {
    pub input: Option<f64>,
    pub output: Option<f64>,
    pub cached_input: Option<f64>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    pub otlp_endpoint: Option<String>,
    pub sample_ratio: Option<f64>,
    pub service_name: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub listen: Option<String>,
    pub worker_threads: Option<i64>,
    pub runtime: Option<String>,
    pub max_request_body: Option<String>,
    pub max_request_head: Option<String>,
    pub max_connections: Option<i64>,
    pub header_read_timeout: Option<String>,
    pub shutdown_grace: Option<String>,
    pub credential_headers: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    pub listen: Option<String>,
    pub token: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    pub format: Option<String>,
    pub level: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRedis {
    pub url: Option<String>,
    pub cluster: Option<Vec<String>>,
    pub sentinels: Option<Vec<String>>,
    pub master_name: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub ca_file: Option<String>,
    pub wait_replicas: Option<i64>,
    pub key_prefix: Option<String>,
    pub command_timeout: Option<String>,
    pub sync_interval: Option<String>,
    pub liveness: Option<String>,
    pub fingerprint: Option<i64>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub url: Option<String>,
    pub connect_timeout: Option<String>,
    pub keepalive: Option<String>,
    pub circuit: Option<String>,
    pub cooldown: Option<String>,
    pub rate_limit_scope: Option<String>,
    pub pacing: Option<String>,
    pub pacing_reserve: Option<i64>,
    pub ca_file: Option<String>,
    #[serde(default)]
    pub set_headers: BTreeMap<String, String>,
    pub auth: Option<String>,
    pub aws_region: Option<String>,
    pub aws_service: Option<String>,
    pub aws_role_arn: Option<String>,
    pub api: Option<String>,
    pub gcp_project: Option<String>,
    pub gcp_location: Option<String>,
    pub azure_api_version: Option<String>,
    /// A number (a fixed limit) or `"adaptive"`.
    pub concurrency: Option<toml::Value>,
}

/// `[concurrency]`: the bounds of every adaptive limit.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConcurrency {
    pub initial: Option<i64>,
    pub min: Option<i64>,
    pub max: Option<i64>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub name: Option<String>,
    pub path_prefix: Option<String>,
    pub upstream: Option<String>,
    pub strip_prefix: Option<bool>,
    pub retry: Option<String>,
    pub idempotency: Option<String>,
    pub cache: Option<String>,
    pub limits: Option<Vec<String>>,
    pub fallback: Option<Vec<String>>,
    pub targets: Option<Vec<RawTarget>>,
    pub balance: Option<String>,
    pub failover_on: Option<Vec<String>>,
    pub failover_wait: Option<String>,
    pub dead_letters: Option<bool>,
    pub dead_letter_bodies: Option<bool>,
    #[serde(rename = "async")]
    pub async_jobs: Option<bool>,
    pub continue_streams: Option<bool>,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTarget {
    pub upstream: Option<String>,
    pub weight: Option<f64>,
    pub models: Option<BTreeMap<String, String>>,
    pub first_byte_timeout: Option<String>,
    pub context_window: Option<i64>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    pub max_attempts: Option<i64>,
    pub base_delay: Option<String>,
    pub max_delay: Option<String>,
    pub jitter: Option<String>,
    pub per_try_timeout: Option<String>,
    pub first_byte_timeout: Option<String>,
    pub stream_idle_timeout: Option<String>,
    pub deadline: Option<String>,
    pub retry_on: Option<Vec<String>>,
    pub retry_once_on: Option<Vec<String>>,
    pub non_idempotent: Option<String>,
    pub respect_retry_after: Option<bool>,
    pub max_retry_after: Option<String>,
    pub budget_ratio: Option<f64>,
    pub budget_min_per_second: Option<i64>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawCircuit {
    pub consecutive_failures: Option<i64>,
    pub failure_rate: Option<f64>,
    pub minimum_requests: Option<i64>,
    pub window: Option<String>,
    pub open_for: Option<String>,
    pub max_open_for: Option<String>,
    pub half_open_probes: Option<i64>,
    pub failure_on: Option<Vec<String>>,
    pub shared: Option<bool>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawIdempotency {
    pub header: Option<String>,
    pub require_key: Option<bool>,
    pub ttl: Option<String>,
    pub lease: Option<String>,
    pub on_concurrent: Option<String>,
    pub wait_timeout: Option<String>,
    pub store_statuses: Option<Vec<String>>,
    pub scope_headers: Option<Vec<String>>,
    pub max_stored_body: Option<String>,
    pub complete_on_disconnect: Option<bool>,
    pub on_store_error: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawCache {
    pub ttl: Option<String>,
    pub statuses: Option<Vec<String>>,
    pub max_entry_size: Option<String>,
    pub scope_headers: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawDeadLetters {
    pub max_entries: Option<i64>,
    pub max_body: Option<String>,
    pub max_bytes: Option<String>,
    pub sensitive_headers: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawJobs {
    pub workers: Option<i64>,
    pub visibility_timeout: Option<String>,
    pub result_ttl: Option<String>,
    pub max_queue: Option<i64>,
    pub max_result_body: Option<String>,
    pub callback_allowed_prefixes: Option<Vec<String>>,
    pub secret: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    pub models: Option<Vec<String>>,
}
