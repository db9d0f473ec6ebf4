//! The effective configuration, readable, for `rebound check`. Secrets are never printed.

use std::fmt::Write;

use super::units::{format_duration as d, format_size};
use super::*;

pub(super) fn render(c: &Config) -> String {
    let mut out = String::new();
    listeners(&mut out, c);
    routes(&mut out, c);
    upstreams(&mut out, c);
    policies(&mut out, c);
    jobs_and_idempotency(&mut out, c);
    caches(&mut out, c);
    let models = if c.metrics.models.is_empty() {
        "none (every model counts as other)".to_string()
    } else {
        c.metrics.models.join(", ")
    };
    let _ = writeln!(out, "\nmetrics: token models {models}");
    out
}

/// The listeners and Redis.
fn listeners(out: &mut String, c: &Config) {
    let _ = writeln!(out, "{}: valid", c.source.display());
    let _ = writeln!(
        out,
        "listen {} (max_request_body {}, shutdown_grace {}), admin {} (/admin/* {})",
        c.server.listen,
        format_size(c.server.max_request_body),
        d(c.server.shutdown_grace),
        c.admin.listen,
        if c.admin.token.is_some() {
            "enabled"
        } else {
            "disabled: no token"
        }
    );
    let creds = &c.server.credentials;
    let names: Vec<&str> = creds.headers().iter().map(http::HeaderName::as_str).collect();
    let _ = writeln!(
        out,
        "credentials (never logged or kept; hashed where they scope): headers {}; query parameters {}",
        names.join(", "),
        crate::credentials::QUERY_PARAMS.join(", ")
    );
    match &c.redis {
        Some(r) => {
            let _ = writeln!(
                out,
                "redis {} (prefix {:?}, command_timeout {}, sync_interval {}, liveness {})",
                r.topology.describe(),
                r.key_prefix,
                d(r.command_timeout),
                d(r.sync_interval),
                d(r.liveness)
            );
            let tls = match &r.ca_file {
                Some(ca) => format!("trust roots from {}", ca.display()),
                None => "public trust roots for rediss://".to_string(),
            };
            let user = match (&r.username, r.password.is_some()) {
                (Some(u), true) => format!("user {u:?} with a password"),
                (Some(u), false) => format!("user {u:?}"),
                (None, true) => "a password".to_string(),
                (None, false) => "credentials from the URL, if any".to_string(),
            };
            let wait = match r.wait_replicas {
                0 => "completions not waited for on replicas".to_string(),
                n => format!("completions wait for {n} replica acknowledgement(s) (WAIT)"),
            };
            let _ = writeln!(out, "  {user}; {tls}; {wait}");
            if r.fingerprint == 1 {
                let _ = writeln!(
                    out,
                    "  request fingerprints written as version 1 (for replicas of earlier builds; remove once the fleet is rolled)"
                );
            }
        }
        None => {
            let _ = writeln!(out, "redis: none (state in memory, one replica)");
        }
    }
    let t = &c.telemetry;
    match &t.otlp_endpoint {
        Some(e) => {
            let _ = writeln!(
                out,
                "traces: OTLP/HTTP to {e}/v1/traces (service {}, sample_ratio {})",
                t.service_name, t.sample_ratio
            );
        }
        None => {
            let _ = writeln!(out, "traces: off (no [telemetry] otlp_endpoint)");
        }
    }
}

/// Routes, longest prefix first.
fn routes(out: &mut String, c: &Config) {
    let _ = writeln!(out, "\nroutes (longest prefix wins):");
    let mut routes: Vec<&RouteConfig> = c.routes.iter().collect();
    routes.sort_by(|a, b| {
        b.path_prefix
            .len()
            .cmp(&a.path_prefix.len())
            .then(a.path_prefix.cmp(&b.path_prefix))
    });
    for r in routes {
        let first = r.upstreams().next().unwrap_or_default();
        let target = c.upstreams.get(first).map(|u| u.url()).unwrap_or_default();
        let _ = write!(out, "  {:<16} {:<14} -> {} ({})", r.path_prefix, r.name, first, target);
        let _ = write!(out, ", api {}", r.api.as_str());
        if r.strip_prefix {
            let _ = write!(out, ", strip_prefix");
        }
        let _ = write!(out, ", retry {}", r.retry.as_deref().unwrap_or("none"));
        let _ = write!(out, ", idempotency {}", r.idempotency.as_deref().unwrap_or("none"));
        if let Some(cache) = &r.cache {
            let _ = write!(out, ", cache {cache}");
        }
        if r.targets.len() > 1 {
            let targets: Vec<String> = r.targets.iter().map(|t| describe_target(t, r.api)).collect();
            let _ = write!(
                out,
                ", targets [{}], balance {}",
                targets.join(", "),
                r.balance.as_str()
            );
            if r.failover_on != crate::config::FailoverOn::all() {
                let on: Vec<&str> = r.failover_on.iter().map(|f| f.as_str()).collect();
                let _ = write!(out, ", failover_on [{}]", on.join(", "));
            }
        }
        if r.dead_letters {
            let _ = write!(
                out,
                ", dead_letters{}",
                if r.dead_letter_bodies { " (with bodies)" } else { "" }
            );
        }
        if r.async_jobs {
            let _ = write!(out, ", async");
        }
        out.push('\n');
    }
}

/// Upstreams (header values hidden).
fn upstreams(out: &mut String, c: &Config) {
    let _ = writeln!(out, "\nupstreams:");
    for u in c.upstreams.values() {
        let _ = write!(
            out,
            "  {:<14} {} connect_timeout {}, keepalive {}, circuit {}, cooldown {}",
            u.name,
            u.url(),
            d(u.connect_timeout),
            u.keepalive.map_or_else(|| "off".to_string(), d),
            u.circuit.as_deref().unwrap_or("none"),
            u.cooldown.as_str()
        );
        match u.pacing {
            PacingMode::Wait => {
                let _ = write!(out, ", pacing wait (reserve {})", u.pacing_reserve);
            }
            PacingMode::Off => {
                let _ = write!(out, ", pacing off");
            }
        }
        if let Some(ca) = &u.ca_file {
            let _ = write!(out, ", ca_file {}", ca.display());
        }
        if !u.set_headers.is_empty() {
            let names: Vec<&str> = u.set_headers.iter().map(|(k, _)| k.as_str()).collect();
            let _ = write!(out, ", sets {} (values hidden)", names.join(", "));
        }
        match &u.auth {
            Auth::Static => {}
            Auth::Aws(aws) => {
                let _ = write!(
                    out,
                    ", auth aws (SigV4 {} {}, credential from {}{})",
                    aws.region,
                    aws.service,
                    c.cloud_env.aws_source().as_str(),
                    aws.role_arn
                        .as_deref()
                        .map_or(String::new(), |r| format!(", then assumes {r}"))
                );
            }
            Auth::Gcp => {
                let source = c.cloud_env.gcp_source().as_str();
                let _ = write!(out, ", auth gcp (bearer token, credential from {source})");
            }
            Auth::Azure => {
                let source = c.cloud_env.azure_source().as_str();
                let _ = write!(out, ", auth azure (bearer token, credential from {source})");
            }
        }
        out.push('\n');
    }
}

/// Retry policies and circuit breakers.
fn policies(out: &mut String, c: &Config) {
    if !c.retry.is_empty() {
        let _ = writeln!(out, "\nretry policies:");
    }
    for p in c.retry.values() {
        let list = |l: &[RetryOn]| l.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
        let _ = writeln!(
            out,
            "  {:<14} {} attempts, backoff {}..{} ({} jitter), per_try {}, first_byte {}, idle {}, deadline {}, \
             retry_on [{}], once [{}], non_idempotent {}, retry_after {} (max {}), budget {}% + {}/s",
            p.name,
            p.max_attempts,
            d(p.base_delay),
            d(p.max_delay),
            p.jitter,
            d(p.per_try_timeout),
            d(p.first_byte_timeout),
            d(p.stream_idle_timeout),
            d(p.deadline),
            list(&p.retry_on),
            list(&p.retry_once_on),
            p.non_idempotent.as_str(),
            if p.respect_retry_after { "obeyed" } else { "ignored" },
            d(p.max_retry_after),
            p.budget_ratio * 100.0,
            p.budget_min_per_second
        );
    }
    if !c.circuit.is_empty() {
        let _ = writeln!(out, "\ncircuit breakers:");
    }
    for p in c.circuit.values() {
        let _ = writeln!(
            out,
            "  {:<14} open after {} consecutive failures or {}% of >= {} calls in {}, open {}..{}, {} probe(s), {}",
            p.name,
            p.consecutive_failures,
            p.failure_rate * 100.0,
            p.minimum_requests,
            d(p.window),
            d(p.open_for),
            d(p.max_open_for),
            p.half_open_probes,
            if p.shared { "shared" } else { "local" }
        );
    }
}

/// The job queue (when a route is async) and the idempotency policies.
fn jobs_and_idempotency(out: &mut String, c: &Config) {
    if c.routes.iter().any(|r| r.async_jobs) {
        let j = &c.jobs;
        let _ = writeln!(
            out,
            "\njobs: {}, {} workers, visibility_timeout {}, result_ttl {}, max_queue {}, \
             max_result_body {}, callbacks {}, secret {}",
            if c.redis.is_some() {
                "redis stream"
            } else {
                "in memory (lost on restart)"
            },
            j.workers,
            d(j.visibility_timeout),
            d(j.result_ttl),
            j.max_queue,
            format_size(j.max_result_body),
            if j.callback_allowed_prefixes.is_empty() {
                "refused".to_string()
            } else {
                format!("to [{}]", j.callback_allowed_prefixes.join(", "))
            },
            if j.secret.is_some() { "set (hidden)" } else { "none" }
        );
    }
    if !c.idempotency.is_empty() {
        let _ = writeln!(out, "\nidempotency policies:");
    }
    for p in c.idempotency.values() {
        let _ = writeln!(
            out,
            "  {:<14} header {}, {}, ttl {}, lease {}, on_concurrent {}, max_stored_body {}, on_store_error {}, scope {}",
            p.name,
            p.header,
            if p.require_key { "required" } else { "optional" },
            d(p.ttl),
            d(p.lease),
            p.on_concurrent.as_str(),
            format_size(p.max_stored_body),
            p.on_store_error.as_str(),
            scope(&p.scope_headers, c)
        );
    }
}

/// The response-cache policies.
fn caches(out: &mut String, c: &Config) {
    if !c.cache.is_empty() {
        let _ = writeln!(out, "\ncache policies:");
    }
    for p in c.cache.values() {
        let statuses: Vec<String> = p.statuses.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            out,
            "  {:<14} ttl {}, statuses [{}], max_entry_size {}, scope {}",
            p.name,
            d(p.ttl),
            statuses.join(","),
            format_size(p.max_entry_size),
            scope(&p.scope_headers, c)
        );
    }
}

/// A policy's tenant scope: `credentials` when it is the whole list in force, else the headers
/// it names (the credential query parameters always count).
fn scope(headers: &[http::HeaderName], c: &Config) -> String {
    if headers == c.server.credentials.headers() {
        return "credentials".to_string();
    }
    let names: Vec<&str> = headers.iter().map(http::HeaderName::as_str).collect();
    format!("[{}] + credential query parameters", names.join(","))
}

/// A target as `rebound check` shows it: its upstream, then what differs from a plain one.
fn describe_target(t: &crate::config::TargetConfig, route: crate::config::Api) -> String {
    let mut s = t.upstream.clone();
    if t.api != route {
        let _ = write!(s, " as {}", t.api.as_str());
    }
    if t.weight != 1.0 {
        let _ = write!(s, " weight {}", t.weight);
    }
    for (from, to) in &t.models {
        let _ = write!(s, " model {from} -> {to}");
    }
    if let Some(timeout) = t.first_byte_timeout {
        let _ = write!(s, " first_byte_timeout {}", d(timeout));
    }
    if let Some(n) = t.context_window {
        let _ = write!(s, " context_window {n}");
    }
    s
}
