//! Managed-Redis style: TLS with a private CA, an ACL user and the default user off; what Redis
//! refuses for good (a wrong password, an untrusted certificate) stops the start with an error
//! naming Redis, never a hang; and the `[redis]` table's validation and summary.

use std::path::Path;
use std::time::{Duration, Instant};

use rebound::hooks::config::raw::{RawIdempotency, RawRedis};
use rebound::Config;

use crate::support::config_builder::{some, TestConfig};
use crate::support::redis::RedisTls;
use crate::support::*;

/// `[redis]` on the TLS server as `user` (name and password) when given, trusting its CA when
/// `ca`.
fn tls_redis(redis: &RedisTls, user: Option<(&str, &str)>, ca: bool) -> RawRedis {
    RawRedis {
        url: Some(format!("rediss://127.0.0.1:{}/0", redis.port)),
        username: user.map(|(name, _)| name.to_string()),
        password: user.map(|(_, password)| password.to_string()),
        ca_file: ca.then(|| redis.ca_file.display().to_string()),
        command_timeout: some("500ms"),
        ..RawRedis::default()
    }
}

fn with_idempotency(provider: &str, redis: RawRedis) -> TestConfig {
    TestConfig::new(provider)
        .idempotency(
            "idem",
            RawIdempotency {
                lease: some("2s"),
                ..RawIdempotency::default()
            },
        )
        .with_redis(redis)
        .route(|r| r.idempotency = some("idem"))
}

async fn keyed(rebound: &Rebound, key: &str) -> Answer {
    send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[
            ("idempotency-key", key),
            ("x-fake-key", key),
            ("content-type", "application/json"),
        ],
        "{}",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_an_acl_user_and_the_default_user_off() {
    let redis = RedisTls::start();
    let provider = FakeProvider::start().await;
    let rebound = with_idempotency(&provider.url(), tls_redis(&redis, Some(("rebound", "s3cret")), true))
        .start()
        .await;
    until_metric(&rebound, "rebound_redis_up", |v| v == 1.0).await;
    let ready = get(&format!("{}/readyz", rebound.admin)).await;
    assert_eq!(ready.text(), "ready (redis: up)\n");
    assert_eq!(metric(&rebound.metrics().await, "rebound_redis_up"), 1.0);

    let first = keyed(&rebound, "tls-1").await;
    assert_eq!(first.status, 200, "{}", first.text());
    // The completion lands as the body ends, in the background.
    let replayed = until(
        "the record was stored over TLS as the ACL user",
        Duration::from_secs(2),
        || async {
            let again = keyed(&rebound, "tls-1").await;
            match again.header("idempotent-replayed") {
                Some("true") => Ok(again),
                _ => Err(again.text()),
            }
        },
    )
    .await;
    assert_eq!(replayed.body, first.body);
    assert_eq!(provider.count("tls-1"), 1);
    let page = rebound.metrics().await;
    assert_eq!(
        metric(&page, "rebound_redis_errors_total{op=\"idem_begin\"}"),
        0.0,
        "{page}"
    );
    assert_eq!(metric(&page, "rebound_redis_errors_total{op=\"idem_complete\"}"), 0.0);
}

/// Starts rebound and expects a refusal naming Redis, quickly.
async fn refused(config: TestConfig) -> String {
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(20), rebound::start(config.config()))
        .await
        .expect("start never hangs");
    let took = started.elapsed();
    let err = match result {
        Ok(_) => panic!("rebound started although Redis refuses it"),
        Err(e) => e.to_string(),
    };
    println!("refused after {took:?}: {err}");
    assert!(err.contains("redis"), "{err}");
    assert!(
        !err.contains("s3cret") && !err.contains("wrong-pass"),
        "no secret in {err}"
    );
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_or_an_untrusted_certificate_stops_the_start_naming_redis() {
    let redis = RedisTls::start();
    let provider = FakeProvider::start().await;

    let err = refused(with_idempotency(
        &provider.url(),
        tls_redis(&redis, Some(("rebound", "wrong-pass")), true),
    ))
    .await;
    assert!(err.contains("authentication") && err.contains("password"), "{err}");

    // The default user is off: no credentials at all is refused the same way.
    let err = refused(with_idempotency(&provider.url(), tls_redis(&redis, None, true))).await;
    assert!(err.contains("authentication"), "{err}");

    // The public roots do not trust the test CA.
    let err = refused(with_idempotency(
        &provider.url(),
        tls_redis(&redis, Some(("rebound", "s3cret")), false),
    ))
    .await;
    assert!(err.contains("certificate") && err.contains("ca_file"), "{err}");

    // An unreachable Redis is an outage, not a refusal: rebound starts and serves without it.
    let down = RawRedis {
        url: Some(crate::support::redis::RedisServer::unused_url()),
        command_timeout: some("200ms"),
        ..RawRedis::default()
    };
    let rebound = with_idempotency(&provider.url(), down).start().await;
    assert_eq!(
        get(&format!("{}/readyz", rebound.admin)).await.text(),
        "ready (redis: unreachable)\n"
    );
}

fn parse(toml: &str) -> Result<Config, String> {
    Config::parse(toml, Path::new("redis.toml"), &|name| {
        (name == "REDIS_PASSWORD").then(|| "pa55word".to_string())
    })
    .map_err(|e| e.to_string())
}

const ROUTE: &str =
    "[upstreams.u]\nurl = \"http://127.0.0.1:9\"\n[[routes]]\nname = \"r\"\npath_prefix = \"/r/\"\nupstream = \"u\"\n";

#[test]
fn exactly_one_topology_and_errors_that_name_the_keys() {
    let cases = [
        ("[redis]\nkey_prefix = \"x:\"\n", "redis: expected exactly one of url (one server), cluster (Redis Cluster seed nodes) or sentinels (with master_name), found none"),
        ("[redis]\nurl = \"redis://a:6379\"\ncluster = [\"redis://b:7000\"]\n", "found url and cluster"),
        ("[redis]\nsentinels = [\"redis://a:26379\"]\n", "redis.sentinels: expected master_name beside sentinels"),
        ("[redis]\ncluster = []\n", "redis.cluster: expected at least one redis:// or rediss:// URL"),
        ("[redis]\ncluster = [\"http://a:7000\"]\n", "redis.cluster[0]: expected a redis or rediss URL"),
        ("[redis]\ncluster = [\"redis://a:7000\", \"rediss://b:7000\"]\n", "expected the same scheme for every node"),
        ("[redis]\nurl = \"redis://a:6379\"\nmaster_name = \"m\"\n", "redis.master_name: expected master_name only with sentinels"),
        ("[redis]\nurl = \"redis://:pw@a:6379\"\npassword = \"${REDIS_PASSWORD}\"\n", "redis.password: expected the password in one place"),
        ("[redis]\nurl = \"redis://a:6379\"\nca_file = \"redis.toml\"\n", "redis.ca_file: expected rediss:// URLs with a ca_file"),
        ("[redis]\nurl = \"rediss://a:6380\"\nca_file = \"/nonexistent/ca.pem\"\n", "redis.ca_file: expected a readable PEM file"),
        ("[redis]\nurl = \"redis://a:6379\"\nwait_replicas = 99\n", "redis.wait_replicas: expected an integer from 0 to 16, found 99"),
    ];
    for (redis, want) in cases {
        let err = parse(&format!("{redis}{ROUTE}")).expect_err(redis);
        assert!(err.contains(want), "{redis}\n→ {err}\nwanted: {want}");
        assert!(err.contains("redis.toml:"), "names the file: {err}");
        assert!(!err.contains("pa55word") && !err.contains(":pw@"), "no secret: {err}");
    }
}

#[test]
fn the_summary_shows_the_topology_and_never_a_password() {
    let c = parse(&format!(
        "[redis]\ncluster = [\"redis://10.0.0.1:7000\", \"redis://10.0.0.2:7000\"]\nusername = \"rebound\"\npassword = \"${{REDIS_PASSWORD}}\"\nwait_replicas = 1\n{ROUTE}"
    ))
    .unwrap();
    let s = c.summary();
    assert!(
        s.contains("redis cluster (seeds redis://10.0.0.1:7000, redis://10.0.0.2:7000)"),
        "{s}"
    );
    assert!(s.contains("user \"rebound\" with a password"), "{s}");
    assert!(
        s.contains("completions wait for 1 replica acknowledgement(s) (WAIT)"),
        "{s}"
    );
    let c = parse(&format!(
        "[redis]\nsentinels = [\"redis://:sentinel-pw@10.0.0.5:26379\"]\nmaster_name = \"mymaster\"\npassword = \"${{REDIS_PASSWORD}}\"\n{ROUTE}"
    ))
    .unwrap();
    let shown = format!("{}\n{c:?}", c.summary());
    assert!(
        shown.contains("redis sentinel master \"mymaster\" (sentinels redis://***@10.0.0.5:26379)"),
        "{shown}"
    );
    assert!(!shown.contains("pa55word") && !shown.contains("sentinel-pw"), "{shown}");
}
