//! The policy tables: `[retry.NAME]`, `[circuit.NAME]`, `[idempotency.NAME]`.

use std::time::Duration;

use http::HeaderName;

use super::super::raw::*;
use super::super::*;
use super::Validator;

/// The defaults of a `[retry.*]` table (docs/configuration.md).
pub(crate) fn default_retry(name: &str) -> RetryPolicy {
    RetryPolicy {
        name: name.to_string(),
        max_attempts: 3,
        base_delay: Duration::from_millis(500),
        max_delay: Duration::from_secs(30),
        jitter: Jitter::Full,
        per_try_timeout: Duration::from_secs(600),
        first_byte_timeout: Duration::from_secs(600),
        stream_idle_timeout: Duration::from_secs(600),
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
            // Cloudflare in front of a provider: its own view of the origin failing.
            RetryOn::Status(520),
            RetryOn::Status(521),
            RetryOn::Status(522),
            RetryOn::Status(523),
            RetryOn::Status(524),
        ],
        retry_once_on: vec![RetryOn::Status(500)],
        non_idempotent: NonIdempotent::All,
        respect_retry_after: true,
        max_retry_after: Duration::from_secs(60),
        budget_ratio: 0.2,
        budget_min_per_second: 10,
    }
}

impl Validator<'_> {
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

    pub(super) fn retry(&mut self, name: &str, r: &RawRetry) -> RetryPolicy {
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
                NonIdempotent::CHOICES,
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

    pub(super) fn circuit(&mut self, name: &str, c: &RawCircuit) -> CircuitPolicy {
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
        // Defaults: 3 failures in a row open (a route with other targets moves each
        // request away sooner), and the open time doubles from 5 s to 8 s at most, so that a
        // target that recovers is probed, and carries traffic again, within about 9 s, even
        // after flapping; a probe of a target still down costs one request per 8 s, fleet-wide.
        let open_for = self.positive_duration(&key("open_for"), &c.open_for, Duration::from_secs(5));
        let policy = CircuitPolicy {
            name: name.to_string(),
            consecutive_failures: self.int(&key("consecutive_failures"), c.consecutive_failures, 3, 1, 1_000_000),
            failure_rate: self.ratio(&key("failure_rate"), c.failure_rate, 0.5),
            minimum_requests: self.int(&key("minimum_requests"), c.minimum_requests, 20, 1, 1_000_000),
            window: self.positive_duration(&key("window"), &c.window, Duration::from_secs(30)),
            open_for,
            // Not given: 8 s, or open_for when that is longer (a config that sets only a long
            // open_for stays valid).
            max_open_for: self.positive_duration(
                &key("max_open_for"),
                &c.max_open_for,
                open_for.max(Duration::from_secs(8)),
            ),
            half_open_probes: self.int(&key("half_open_probes"), c.half_open_probes, 1, 1, 1000),
            failure_on,
            shared: c.shared.unwrap_or(true),
        };
        if policy.open_for > policy.max_open_for {
            self.err(&key("max_open_for"), "expected max_open_for >= open_for");
        }
        policy
    }

    pub(super) fn idempotency(&mut self, name: &str, r: &RawIdempotency) -> IdempotencyPolicy {
        let key = |k: &str| format!("idempotency.{name}.{k}");
        let header = self.parsed(
            &key("header"),
            r.header.as_deref(),
            HeaderName::from_static("idempotency-key"),
            |s| HeaderName::from_bytes(s.as_bytes()).map_err(|_| "a valid HTTP header name".to_string()),
        );
        let store_statuses = self.statuses(&key("store_statuses"), &r.store_statuses);
        let scope_headers = self.scope_headers(&key("scope_headers"), &r.scope_headers);
        let policy = IdempotencyPolicy {
            name: name.to_string(),
            header,
            require_key: r.require_key.unwrap_or(false),
            ttl: self.positive_duration(&key("ttl"), &r.ttl, Duration::from_secs(86_400)),
            lease: self.positive_duration(&key("lease"), &r.lease, Duration::from_secs(30)),
            on_concurrent: self.choice(
                &key("on_concurrent"),
                &r.on_concurrent,
                OnConcurrent::Follow,
                OnConcurrent::CHOICES,
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
                OnStoreError::CHOICES,
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

    /// A `[cache.NAME]` table.
    pub(super) fn cache(&mut self, name: &str, r: &RawCache) -> CachePolicy {
        let key = |k: &str| format!("cache.{name}.{k}");
        let ttl = self.positive_duration(&key("ttl"), &r.ttl, Duration::from_secs(3600));
        if ttl > Duration::from_secs(30 * 86_400) {
            self.err(&key("ttl"), "expected at most 720h (30 days)");
        }
        CachePolicy {
            name: name.to_string(),
            ttl,
            statuses: self.statuses(&key("statuses"), &r.statuses),
            max_entry_size: self.bounded_size(&key("max_entry_size"), &r.max_entry_size, 4 << 20, (1, 64 << 20)),
            scope_headers: self.scope_headers(&key("scope_headers"), &r.scope_headers),
        }
    }

    /// Status patterns (`"2xx"`, `"201"`); `["2xx"]` when absent.
    fn statuses(&mut self, key: &str, raw: &Option<Vec<String>>) -> Vec<StatusPattern> {
        let Some(list) = raw else {
            return vec![StatusPattern::Class(2)];
        };
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
                    &format!("{key}[{j}]"),
                    format!("expected a status such as \"201\" or a class such as \"2xx\", found {s:?}"),
                ),
            }
        }
        out
    }

    /// Header names whose values scope a record (the tenant); every credential header when
    /// absent (the credential query parameters always count).
    fn scope_headers(&mut self, key: &str, raw: &Option<Vec<String>>) -> Vec<HeaderName> {
        match raw {
            None => self.credentials.headers().to_vec(),
            Some(list) => self.header_names(key, Some(list)),
        }
    }
}
