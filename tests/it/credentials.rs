//! Credentials in every form (`rebound::credentials`: each header, each query parameter, and a
//! `[server] credential_headers` name): a canary of each sent through every path that keeps or
//! prints something never appears in the clear; two credentials of one form never share an
//! idempotency record, a cache entry or a cooldown; an upstream that sets its own credential
//! replaces the app's.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rebound::hooks::config::raw::{RawCache, RawIdempotency, RawJobs, RawRetry, RawRoute, RawTelemetry};
use tokio::net::TcpListener;
use tokio::process::Command;

use crate::support::config_builder::{some, TestConfig};
use crate::support::redis::RedisServer;
use crate::support::sidecar::ReboundProcess;
use crate::support::*;

const TOKEN: &str = "admin-token-creds";
const EXTRA: &str = "x-tenant-key";

/// Every credential form: `(header name, None)` or `(query parameter, Some(()))`.
fn forms() -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = rebound::hooks::credentials::HEADERS
        .iter()
        .map(|h| (h.as_str().to_string(), false))
        .collect();
    out.push((EXTRA.to_string(), false));
    out.extend(
        rebound::hooks::credentials::QUERY_PARAMS
            .iter()
            .map(|p| (p.to_string(), true)),
    );
    out
}

/// The headers and query of a request that carries `value` in the form `(name, in_query)`.
fn carrying(form: &(String, bool), value: &str) -> (Vec<(String, String)>, String) {
    match form {
        (name, false) => (vec![(name.clone(), value.to_string())], String::new()),
        (name, true) => (vec![], format!("{name}={value}")),
    }
}

/// A request with a canary in every form at once.
fn canaries() -> (Vec<(String, String)>, String) {
    let (mut headers, mut query) = (Vec::new(), vec!["alt=sse".to_string()]);
    for (i, form) in forms().iter().enumerate() {
        let (h, q) = carrying(form, &format!("CANARY{i}x{}", form.0.replace('-', "")));
        headers.extend(h);
        if !q.is_empty() {
            query.push(q);
        }
    }
    (headers, query.join("&"))
}

async fn send_with(method: &str, url: &str, creds: &[(String, String)], more: &[(&str, &str)], body: &str) -> Answer {
    let mut headers: Vec<(&str, &str)> = creds.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    headers.extend_from_slice(more);
    send(method, url, &headers, body.to_string()).await
}

/// An OTLP/HTTP receiver that keeps the raw bytes of every export.
struct RawCollector {
    url: String,
    bodies: Arc<Mutex<Vec<Bytes>>>,
}

impl RawCollector {
    async fn start() -> RawCollector {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let b = bodies.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { return };
                let b = b.clone();
                let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let b = b.clone();
                    async move {
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        b.lock().unwrap().push(body);
                        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new())))
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        RawCollector { url, bodies }
    }

    fn text(&self) -> String {
        let bodies = self.bodies.lock().unwrap();
        bodies.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect()
    }
}

/// Every key of a Redis database and every value under it, as text.
async fn redis_dump(url: &str) -> (usize, String) {
    let client = ::redis::Client::open(url).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = ::redis::cmd("KEYS").arg("*").query_async(&mut c).await.unwrap();
    let mut out = String::new();
    for key in &keys {
        let kind: String = ::redis::cmd("TYPE").arg(key).query_async(&mut c).await.unwrap();
        let value: ::redis::Value = match kind.as_str() {
            "string" => ::redis::cmd("GET").arg(key).query_async(&mut c).await.unwrap(),
            "hash" => ::redis::cmd("HGETALL").arg(key).query_async(&mut c).await.unwrap(),
            "stream" => ::redis::cmd("XRANGE")
                .arg(key)
                .arg("-")
                .arg("+")
                .query_async(&mut c)
                .await
                .unwrap(),
            "list" => ::redis::cmd("LRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .query_async(&mut c)
                .await
                .unwrap(),
            "set" => ::redis::cmd("SMEMBERS").arg(key).query_async(&mut c).await.unwrap(),
            "zset" => ::redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .query_async(&mut c)
                .await
                .unwrap(),
            _ => ::redis::Value::Nil,
        };
        out.push_str(&format!("{key} {kind} {}\n", text_of(&value)));
    }
    (keys.len(), out)
}

fn text_of(v: &::redis::Value) -> String {
    match v {
        ::redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        ::redis::Value::SimpleString(s) => s.clone(),
        ::redis::Value::Array(items) | ::redis::Value::Set(items) => {
            items.iter().map(text_of).collect::<Vec<_>>().join(" ")
        }
        ::redis::Value::Map(pairs) => pairs
            .iter()
            .map(|(k, v)| format!("{} {}", text_of(k), text_of(v)))
            .collect::<Vec<_>>()
            .join(" "),
        other => format!("{other:?}"),
    }
}

/// The real binary on Redis, at debug level, exporting traces, with idempotency, a cache, dead
/// letters with bodies and an async route: a canary of every form in one request, through each.
#[tokio::test]
async fn no_credential_form_is_kept_or_printed_anywhere() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let collector = RawCollector::start().await;
    let config = TestConfig::new(&provider.url())
        .server(|s| s.credential_headers = Some(vec![EXTRA.to_string()]))
        .retry(
            "fast",
            RawRetry {
                max_attempts: Some(2),
                base_delay: some("10ms"),
                max_delay: some("20ms"),
                ..RawRetry::default()
            },
        )
        .idempotency("idem", lease_2s())
        .cache(
            "c",
            RawCache {
                ttl: some("1m"),
                ..RawCache::default()
            },
        )
        .jobs(RawJobs {
            secret: some("jobs-secret-0123456789"),
            visibility_timeout: some("1s"),
            ..RawJobs::default()
        })
        .telemetry(RawTelemetry {
            otlp_endpoint: some(&collector.url),
            sample_ratio: Some(1.0),
            ..RawTelemetry::default()
        })
        .redis(&redis.url())
        .with_route(RawRoute {
            name: some("async"),
            path_prefix: some("/async/"),
            upstream: some("fake"),
            strip_prefix: Some(true),
            async_jobs: Some(true),
            idempotency: some("idem"),
            dead_letters: Some(true),
            ..RawRoute::default()
        })
        .route(|r| {
            r.retry = some("fast");
            r.idempotency = some("idem");
            r.dead_letters = Some(true);
            r.dead_letter_bodies = Some(true);
        })
        .admin_token(TOKEN);
    let rebound = ReboundProcess::start(&config.toml(), &[]).await;
    let (creds, query) = canaries();
    let chat = |base: &str, prefix: &str| format!("{base}/{prefix}/v1/chat/completions?{query}");

    // A failure for good: a dead letter with its body.
    provider.script("fail", vec![Step::status(503); 2]);
    let a = send_with(
        "POST",
        &chat(&rebound.proxy, "fake"),
        &creds,
        &[("x-fake-key", "fail"), ("idempotency-key", "k-fail")],
        r#"{"model":"m"}"#,
    )
    .await;
    assert_eq!(a.status, 503, "{}", a.text());
    // A success with a key (an idempotency record) and without (a cache entry).
    for more in [&[("idempotency-key", "k-ok")][..], &[][..]] {
        let a = send_with("POST", &chat(&rebound.proxy, "fake"), &creds, more, r#"{"model":"m"}"#).await;
        assert_eq!(a.status, 200, "{}", a.text());
    }
    // An async job, polled with the same credential to its end.
    let mut more = vec![
        ("prefer", "respond-async"),
        ("x-fake-key", "job"),
        ("idempotency-key", "k-job"),
    ];
    more.push(("content-type", "application/json"));
    let a = send_with(
        "POST",
        &chat(&rebound.proxy, "async"),
        &creds,
        &more,
        r#"{"model":"m"}"#,
    )
    .await;
    assert_eq!(a.status, 202, "{}", a.text());
    let id = a.json()["job_id"].as_str().unwrap().to_string();
    let poll = format!("{}/jobs/{id}?{query}", rebound.proxy);
    let done = until("the job succeeds", Duration::from_secs(10), || async {
        let s = send_with("GET", &poll, &creds, &[], "").await;
        assert_eq!(s.status, 200, "{}", s.text());
        let status = s.json();
        match status["status"] == "succeeded" {
            true => Ok(status),
            false => Err(status.to_string()),
        }
    })
    .await;
    // Another credential does not read the job.
    assert_eq!(get(&format!("{}/jobs/{id}", rebound.proxy)).await.status, 404);
    // The job ran with its credentials: the sealed query parameters were put back.
    let job_run = &provider.requests("job")[0];
    let sent_query = job_run.query.clone().unwrap_or_default();
    for p in rebound::hooks::credentials::QUERY_PARAMS {
        assert!(sent_query.contains(&format!("{p}=CANARY")), "{sent_query}");
    }
    assert!(job_run
        .header("x-goog-api-key")
        .is_some_and(|v| v.starts_with("CANARY")));

    // Everything that keeps or prints something.
    let admin = |path: &str| {
        let url = format!("{}{path}", rebound.admin);
        async move { send("GET", &url, &[("authorization", &format!("Bearer {TOKEN}"))], "").await }
    };
    let page = until("the dead letter is listed", Duration::from_secs(10), || async {
        let page = admin("/admin/dead-letters").await.text();
        if page.contains("k-fail") {
            Ok(page)
        } else {
            Err(page)
        }
    })
    .await;
    assert!(page.contains("[redacted]"), "{page}");
    let entry_id = serde_json::from_str::<serde_json::Value>(&page).unwrap()["items"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let summary = admin("/admin/dead-letters/summary").await.text();
    let mut cli = String::new();
    for args in [vec!["list"], vec!["list", "--json"], vec!["summary"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_rebound"))
            .arg("dead-letters")
            .args(&args)
            .args(["--admin", &rebound.admin, "--token", TOKEN])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        cli.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    assert!(cli.contains(&entry_id), "{cli}");
    let (keys, dump) = redis_dump(&redis.url()).await;
    for kind in ["idem:", "cache:", "dead_letters", "{jobs}:job:"] {
        assert!(dump.contains(kind), "no {kind} key in Redis:\n{dump}");
    }
    assert!(keys > 4, "{dump}");
    let traced = until("a span is exported", Duration::from_secs(10), || async {
        let t = collector.text();
        if t.contains("/v1/chat/completions") {
            Ok(t)
        } else {
            Err(format!("{} bytes", t.len()))
        }
    })
    .await;
    let logs = rebound.logs();
    assert!(logs.contains("\"level\":\"DEBUG\""), "no debug line: {logs}");
    assert!(logs.contains("/v1/chat/completions"), "{logs}");

    for (what, text) in [
        ("the dead letters API", &page),
        ("the dead letters summary", &summary),
        ("rebound dead-letters", &cli),
        ("Redis", &dump),
        ("the traces", &traced),
        ("the log", &logs),
        ("the job API", &done.to_string()),
    ] {
        assert!(!text.contains("CANARY"), "a credential reached {what}:\n{text}");
    }
}

/// `[idempotency.idem]` with a 2 s lease.
fn lease_2s() -> RawIdempotency {
    RawIdempotency {
        lease: some("2s"),
        ..RawIdempotency::default()
    }
}

/// A route on one fake provider with idempotency, a cache and rejecting cooldowns; Redis when
/// given.
fn isolation_config(provider: &str, redis: Option<&str>) -> TestConfig {
    let c = TestConfig::new(provider)
        .server(|s| s.credential_headers = Some(vec![EXTRA.to_string()]))
        .retry(
            "once",
            RawRetry {
                max_attempts: Some(1),
                ..RawRetry::default()
            },
        )
        .idempotency("idem", lease_2s())
        .with_cache(
            "c",
            RawCache {
                ttl: some("1m"),
                ..RawCache::default()
            },
        )
        .with_route(RawRoute {
            name: some("cached"),
            path_prefix: some("/cached/"),
            upstream: some("fake"),
            strip_prefix: Some(true),
            cache: some("c"),
            ..RawRoute::default()
        })
        .upstream(|u| u.cooldown = some("reject"))
        .route(|r| {
            r.retry = some("once");
            r.idempotency = some("idem");
        });
    match redis {
        Some(url) => c.redis(url),
        None => c,
    }
}

/// Two credentials of each form: one `Idempotency-Key` never replays across them, one cached
/// body never hits across them, and a cooldown on one never holds the other; the same
/// credential again replays, hits and is held (so the isolation is not an accident).
async fn credentials_of_each_form_are_isolated(redis: Option<&RedisServer>) {
    let provider = FakeProvider::start().await;
    let rebound = isolation_config(&provider.url(), redis.map(|r| r.url()).as_deref())
        .start()
        .await;
    for (i, form) in forms().iter().enumerate() {
        let url = |prefix: &str, creds: &(Vec<(String, String)>, String)| {
            let sep = if creds.1.is_empty() { "" } else { "?" };
            format!("{}/{prefix}/v1/chat/completions{sep}{}", rebound.url, creds.1)
        };
        let a = carrying(form, &format!("first-{i}"));
        let b = carrying(form, &format!("second-{i}"));
        let body = format!(r#"{{"model":"m","n":{i}}}"#);

        // Idempotency.
        let fake = format!("idem-{i}");
        let more = [("x-fake-key", fake.as_str()), ("idempotency-key", "one-key")];
        for creds in [&a, &b] {
            let r = send_with("POST", &url("fake", creds), &creds.0, &more, &body).await;
            assert_eq!(r.status, 200, "{form:?}: {}", r.text());
            assert_eq!(r.header("idempotent-replayed"), None, "{form:?}");
        }
        assert_eq!(provider.count(&fake), 2, "{form:?}: replayed across credentials");
        let r = send_with("POST", &url("fake", &a), &a.0, &more, &body).await;
        assert_eq!(r.header("idempotent-replayed"), Some("true"), "{form:?}");
        assert_eq!(provider.count(&fake), 2, "{form:?}");

        // The cache.
        let fake = format!("cache-{i}");
        let more = [("x-fake-key", fake.as_str())];
        for creds in [&a, &b] {
            let r = send_with("POST", &url("cached", creds), &creds.0, &more, &body).await;
            assert_eq!(r.status, 200, "{form:?}: {}", r.text());
            assert_eq!(r.header("x-rebound-cache"), Some("miss"), "{form:?}");
        }
        assert_eq!(provider.count(&fake), 2, "{form:?}: a cache hit across credentials");
        let r = send_with("POST", &url("cached", &a), &a.0, &more, &body).await;
        assert_eq!(r.header("x-rebound-cache"), Some("hit"), "{form:?}");

        // Cooldowns: a 429 with a long reset on the first credential. (`proxy-authorization` is
        // hop-by-hop: it never reaches the provider, which cannot limit by it.)
        if form.0 == "proxy-authorization" {
            continue;
        }
        let fake = format!("cool-{i}");
        provider.script(&fake, vec![Step::status_with(429, &[("retry-after", "30")])]);
        let more = [("x-fake-key", fake.as_str())];
        let r = send_with("POST", &url("fake", &a), &a.0, &more, &body).await;
        assert_eq!(r.status, 429, "{form:?}");
        let r = send_with("POST", &url("fake", &b), &b.0, &more, &body).await;
        assert_eq!(r.status, 200, "{form:?}: the other credential was held: {}", r.text());
        assert_eq!(provider.count(&fake), 2, "{form:?}");
        let r = send_with("POST", &url("fake", &a), &a.0, &more, &body).await;
        assert_eq!(r.status, 429, "{form:?}");
        assert_eq!(r.header("x-rebound-error"), Some("cooldown"), "{form:?}");
        assert_eq!(provider.count(&fake), 2, "{form:?}: a held credential was sent");
    }
}

#[tokio::test]
async fn credentials_of_each_form_are_isolated_in_memory() {
    credentials_of_each_form_are_isolated(None).await;
}

#[tokio::test]
async fn credentials_of_each_form_are_isolated_on_redis() {
    let redis = RedisServer::start();
    credentials_of_each_form_are_isolated(Some(&redis)).await;
}

/// An upstream whose `set_headers` sets a credential: the app's own credentials, in every form,
/// do not reach it; other query parameters do.
#[tokio::test]
async fn an_upstream_that_sets_a_credential_replaces_the_apps() {
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .server(|s| s.credential_headers = Some(vec![EXTRA.to_string()]))
        .upstream(|u| {
            u.set_headers
                .insert("x-goog-api-key".to_string(), "sidecar-key".to_string());
        })
        .start()
        .await;
    let (creds, query) = canaries();
    let r = send_with(
        "POST",
        &format!("{}/fake/echo?{query}", rebound.url),
        &creds,
        &[("x-fake-key", "echo")],
        "{}",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let seen = &provider.requests("echo")[0];
    assert_eq!(seen.query.as_deref(), Some("alt=sse"));
    assert_eq!(seen.header("x-goog-api-key"), Some("sidecar-key"));
    for (name, in_query) in forms() {
        if !in_query && name != "x-goog-api-key" {
            assert_eq!(seen.header(&name), None, "{name} reached the upstream");
        }
    }
}
