//! A typed builder for test configurations: the config file's own serde mirror
//! (`rebound::hooks::config::raw`), so a misspelt key does not compile; serialised to TOML and loaded by
//! the real parser and validator, as a file would be.

use rebound::hooks::config::raw::{
    RawAdmin, RawCache, RawCircuit, RawConcurrency, RawConfig, RawDeadLetters, RawIdempotency, RawJobs, RawLimit,
    RawLog, RawMetrics, RawPrice, RawRedis, RawRetry, RawRoute, RawServer, RawTelemetry, RawUpstream,
};

use super::sidecar::{parse, Rebound};

/// `Some(s.to_string())`, for the raw mirror's optional strings.
pub fn some(s: &str) -> Option<String> {
    Some(s.to_string())
}

/// `Some(vec![...])`, for the raw mirror's optional lists of strings.
pub fn list(items: &[&str]) -> Option<Vec<String>> {
    Some(items.iter().map(|s| s.to_string()).collect())
}

/// A test configuration, typed.
pub struct TestConfig(pub RawConfig);

impl TestConfig {
    /// `/fake/` forwarded to `upstream_url` (prefix stripped, connect timeout 1 s), both listeners
    /// on port 0, a 5 s shutdown grace, debug logs.
    pub fn new(upstream_url: &str) -> TestConfig {
        let mut raw = RawConfig {
            server: Some(RawServer {
                listen: some("127.0.0.1:0"),
                shutdown_grace: some("5s"),
                ..RawServer::default()
            }),
            admin: Some(RawAdmin {
                listen: some("127.0.0.1:0"),
                ..RawAdmin::default()
            }),
            log: Some(RawLog {
                level: some("debug"),
                ..RawLog::default()
            }),
            ..RawConfig::default()
        };
        raw.upstreams.insert(
            "fake".into(),
            RawUpstream {
                url: some(upstream_url),
                connect_timeout: some("1s"),
                ..RawUpstream::default()
            },
        );
        raw.routes.push(RawRoute {
            name: some("fake"),
            path_prefix: some("/fake/"),
            upstream: some("fake"),
            strip_prefix: Some(true),
            ..RawRoute::default()
        });
        TestConfig(raw)
    }

    /// The `fake` route, edited.
    pub fn route(mut self, edit: impl FnOnce(&mut RawRoute)) -> TestConfig {
        let route = self.0.routes.iter_mut().find(|r| r.name.as_deref() == Some("fake"));
        edit(route.expect("the fake route"));
        self
    }

    /// The `fake` upstream, edited.
    pub fn upstream(mut self, edit: impl FnOnce(&mut RawUpstream)) -> TestConfig {
        edit(self.0.upstreams.get_mut("fake").expect("the fake upstream"));
        self
    }

    /// Another `[upstreams.NAME]` at `url` (connect timeout 1 s).
    pub fn upstream_named(mut self, name: &str, url: &str, edit: impl FnOnce(&mut RawUpstream)) -> TestConfig {
        let mut upstream = RawUpstream {
            url: some(url),
            connect_timeout: some("1s"),
            ..RawUpstream::default()
        };
        edit(&mut upstream);
        self.0.upstreams.insert(name.to_string(), upstream);
        self
    }

    /// Another `[upstreams.NAME]`, exactly as given.
    pub fn with_upstream(mut self, name: &str, upstream: RawUpstream) -> TestConfig {
        self.0.upstreams.insert(name.to_string(), upstream);
        self
    }

    /// Another `[[routes]]` entry, exactly as given, after the `fake` route.
    pub fn with_route(mut self, route: RawRoute) -> TestConfig {
        self.0.routes.push(route);
        self
    }

    /// `[server]`, edited.
    pub fn server(mut self, edit: impl FnOnce(&mut RawServer)) -> TestConfig {
        edit(self.0.server.get_or_insert_with(Default::default));
        self
    }

    /// `[admin] token`.
    pub fn admin_token(mut self, token: &str) -> TestConfig {
        self.0.admin.get_or_insert_with(Default::default).token = some(token);
        self
    }

    /// `[log] level`.
    pub fn log_level(mut self, level: &str) -> TestConfig {
        self.0.log.get_or_insert_with(Default::default).level = some(level);
        self
    }

    /// `[idempotency.NAME]`.
    pub fn idempotency(mut self, name: &str, policy: RawIdempotency) -> TestConfig {
        self.0.idempotency.insert(name.to_string(), policy);
        self
    }

    /// `[circuit.NAME]`.
    pub fn circuit(mut self, name: &str, policy: RawCircuit) -> TestConfig {
        self.0.circuit.insert(name.to_string(), policy);
        self
    }

    /// `[jobs]`.
    pub fn jobs(mut self, jobs: RawJobs) -> TestConfig {
        self.0.jobs = Some(jobs);
        self
    }

    /// `[dead_letters]`.
    pub fn dead_letters(mut self, dead_letters: RawDeadLetters) -> TestConfig {
        self.0.dead_letters = Some(dead_letters);
        self
    }

    /// `[telemetry]`.
    pub fn telemetry(mut self, telemetry: RawTelemetry) -> TestConfig {
        self.0.telemetry = Some(telemetry);
        self
    }

    /// `[metrics] models`.
    pub fn metrics_models(mut self, models: &[&str]) -> TestConfig {
        self.0.metrics = Some(RawMetrics {
            models: Some(models.iter().map(|m| m.to_string()).collect()),
        });
        self
    }

    /// `[cache.NAME]`, named by the `fake` route.
    pub fn cache(mut self, name: &str, policy: RawCache) -> TestConfig {
        self.0.cache.insert(name.to_string(), policy);
        self.route(|r| r.cache = some(name))
    }

    /// Another `[cache.NAME]`, exactly as given, named by no route (yet).
    pub fn with_cache(mut self, name: &str, policy: RawCache) -> TestConfig {
        self.0.cache.insert(name.to_string(), policy);
        self
    }

    /// `[limits.NAME]`, listed by the `fake` route.
    pub fn limit(mut self, name: &str, policy: RawLimit) -> TestConfig {
        self.0.limits.insert(name.to_string(), policy);
        let name = name.to_string();
        self.route(move |r| r.limits.get_or_insert_with(Vec::new).push(name))
    }

    /// A model's `[prices]` entry.
    pub fn price(mut self, model: &str, price: RawPrice) -> TestConfig {
        self.0.prices.insert(model.to_string(), price);
        self
    }

    /// `[redis]`, exactly as given (a cluster, sentinels).
    pub fn with_redis(mut self, redis: RawRedis) -> TestConfig {
        self.0.redis = Some(redis);
        self
    }

    /// `[redis] url`.
    pub fn redis(self, url: &str) -> TestConfig {
        self.redis_with(url, |_| {})
    }

    /// `[redis] url` with `edit` applied (timeouts, sync interval, credentials).
    pub fn redis_with(self, url: &str, edit: impl FnOnce(&mut RawRedis)) -> TestConfig {
        let mut redis = RawRedis {
            url: some(url),
            ..RawRedis::default()
        };
        edit(&mut redis);
        self.with_redis(redis)
    }

    /// `[concurrency]`: the bounds of every adaptive `concurrency`.
    pub fn concurrency_bounds(mut self, initial: i64, min: i64, max: i64) -> TestConfig {
        self.0.concurrency = Some(RawConcurrency {
            initial: Some(initial),
            min: Some(min),
            max: Some(max),
        });
        self
    }

    /// `[retry.NAME]`.
    pub fn retry(mut self, name: &str, policy: RawRetry) -> TestConfig {
        self.0.retry.insert(name.to_string(), policy);
        self
    }

    /// The file it stands for.
    pub fn toml(&self) -> String {
        toml::to_string(&self.0).expect("a test config serialises to TOML")
    }

    /// The validated configuration (a test config that does not validate fails loudly).
    pub fn config(&self) -> rebound::Config {
        parse(&self.toml())
    }

    pub async fn start(&self) -> Rebound {
        Rebound::start_config(self.config()).await
    }
}

#[test]
fn the_typed_config_is_the_file_it_stands_for() {
    let typed = TestConfig::new("http://127.0.0.1:9").config();
    let text = parse(
        r#"
[server]
listen = "127.0.0.1:0"
shutdown_grace = "5s"

[admin]
listen = "127.0.0.1:0"

[log]
level = "debug"

[upstreams.fake]
url = "http://127.0.0.1:9"
connect_timeout = "1s"

[[routes]]
name = "fake"
path_prefix = "/fake/"
upstream = "fake"
strip_prefix = true
"#,
    );
    assert_eq!(format!("{typed:?}"), format!("{text:?}"));
    // An edit lands where it names (and a key the mirror lacks does not compile).
    let c = TestConfig::new("http://127.0.0.1:9")
        .retry(
            "p",
            RawRetry {
                max_attempts: Some(5),
                ..RawRetry::default()
            },
        )
        .route(|r| r.retry = some("p"))
        .config();
    assert_eq!(c.retry["p"].max_attempts, 5);
    assert_eq!(c.routes[0].retry.as_deref(), Some("p"));
}
