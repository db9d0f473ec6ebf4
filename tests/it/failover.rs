//! A route with several targets moves a request to where capacity is, by error class,
//! and says what happened. Two (or three) fake providers over TCP play the targets; each counts
//! the calls it got.

use rebound::hooks::config::raw::{RawRetry, RawTarget};

use crate::support::config_builder::{some, TestConfig};
use crate::support::*;

const PATH: &str = "/fake/v1/chat/completions";

/// A target of `upstream` with `edit` applied.
fn target(upstream: &str, edit: impl FnOnce(&mut RawTarget)) -> RawTarget {
    let mut t = RawTarget {
        upstream: some(upstream),
        ..RawTarget::default()
    };
    edit(&mut t);
    t
}

/// The `fake` route over targets `a` (first) and `b`, balance `balance`, retry policy `p`
/// (3 attempts, 10 ms apart, Retry-After up to 5 s).
fn two_targets(a: &FakeProvider, b: &FakeProvider, balance: &str, ta: RawTarget, tb: RawTarget) -> TestConfig {
    TestConfig::new(&a.url())
        .upstream_named("a", &a.url(), |_| {})
        .upstream_named("b", &b.url(), |_| {})
        .retry(
            "p",
            RawRetry {
                max_attempts: Some(3),
                base_delay: some("10ms"),
                max_delay: some("10ms"),
                max_retry_after: some("5s"),
                ..RawRetry::default()
            },
        )
        .route(|r| {
            r.upstream = None;
            r.targets = Some(vec![ta, tb]);
            r.balance = some(balance);
            r.retry = some("p");
        })
}

async fn call(rebound: &Rebound, key: &str, extra: &[(&str, &str)]) -> Answer {
    let mut headers = vec![("x-fake-key", key), ("content-type", "application/json")];
    headers.extend_from_slice(extra);
    send("POST", &format!("{}{PATH}", rebound.url), &headers, r#"{"model":"m"}"#).await
}

fn failovers(page: &str, from: &str, to: &str, reason: &str) -> f64 {
    metric(
        page,
        &format!(r#"rebound_failovers_total{{from="{from}",reason="{reason}",route="fake",to="{to}"}}"#),
    )
}

#[tokio::test]
async fn a_429_moves_the_request_at_once_and_the_cooling_key_is_skipped_after() {
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let rebound = two_targets(&a, &b, "ordered", target("a", |_| {}), target("b", |_| {}))
        .start()
        .await;
    // A 429 whose reset (2 s) would fit the deadline: another target answers now instead.
    a.script("k", vec![Step::status_with(429, &[("retry-after", "2")])]);
    let first = call(&rebound, "k", &[]).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("x-rebound-upstream"), Some("b"));
    assert_eq!(first.header("x-rebound-failovers"), Some("1"));
    assert_eq!(first.header("x-rebound-attempts"), Some("2"));
    assert_eq!((a.count("k"), b.count("k")), (1, 1), "no retry of a, no wait");
    // While a's credential cools down, requests go to b without calling a.
    let second = call(&rebound, "k", &[]).await;
    assert_eq!(second.header("x-rebound-upstream"), Some("b"));
    assert_eq!((a.count("k"), b.count("k")), (1, 2));
    let page = rebound.metrics().await;
    assert_eq!(failovers(&page, "a", "b", "cooldown"), 2.0, "{page}");
    assert_eq!(failovers(&page, "b", "a", "cooldown"), 0.0);
}

#[tokio::test]
async fn overloaded_and_used_up_retries_move_a_request_and_4xx_never_does() {
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let rebound = two_targets(&a, &b, "ordered", target("a", |_| {}), target("b", |_| {}))
        .start()
        .await;
    // 529: at once.
    a.script("over", vec![Step::status(529)]);
    let r = call(&rebound, "over", &[]).await;
    assert_eq!((r.status.as_u16(), r.header("x-rebound-upstream")), (200, Some("b")));
    assert_eq!((a.count("over"), b.count("over")), (1, 1));
    // 503: retried on a (3 attempts), then moved.
    a.script("down", vec![Step::status(503); 3]);
    let r = call(&rebound, "down", &[]).await;
    assert_eq!((r.status.as_u16(), r.header("x-rebound-upstream")), (200, Some("b")));
    assert_eq!(r.header("x-rebound-attempts"), Some("4"));
    assert_eq!((a.count("down"), b.count("down")), (3, 1));
    // Permanent failures are the app's: never sent elsewhere (a second bill, the same answer).
    for status in [400, 401, 403, 404, 422] {
        let key = format!("perm-{status}");
        a.script(&key, vec![Step::status(status)]);
        let r = call(&rebound, &key, &[]).await;
        assert_eq!(r.status.as_u16(), status);
        assert_eq!(r.header("x-rebound-upstream"), Some("a"));
        assert_eq!(r.header("x-rebound-failovers"), Some("0"));
        assert_eq!(b.count(&key), 0, "{status} never fails over");
    }
    let page = rebound.metrics().await;
    assert_eq!(failovers(&page, "a", "b", "overloaded"), 1.0, "{page}");
    assert_eq!(failovers(&page, "a", "b", "retries_exhausted"), 1.0, "{page}");
}

#[tokio::test]
async fn a_target_without_its_first_byte_in_time_is_left_for_the_next() {
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let ta = target("a", |t| t.first_byte_timeout = some("1s"));
    let rebound = two_targets(&a, &b, "ordered", ta, target("b", |_| {})).start().await;
    a.script("slow", vec![Step::Delay { ms: 30_000 }]);
    let started = std::time::Instant::now();
    let r = call(&rebound, "slow", &[]).await;
    assert_eq!((r.status.as_u16(), r.header("x-rebound-upstream")), (200, Some("b")));
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(1),
        "a had its second"
    );
    assert_eq!((a.count("slow"), b.count("slow")), (1, 1));
    let page = rebound.metrics().await;
    assert_eq!(failovers(&page, "a", "b", "first_byte_timeout"), 1.0, "{page}");
}

#[tokio::test]
async fn when_no_target_can_take_a_request_the_app_is_told_each_ones_state() {
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    // cooldown = "reject": a request that no target can take is not held for one.
    let rebound = two_targets(&a, &b, "ordered", target("a", |_| {}), target("b", |_| {}))
        .upstream_named("a", &a.url(), |u| u.cooldown = some("reject"))
        .upstream_named("b", &b.url(), |u| u.cooldown = some("reject"))
        .start()
        .await;
    let limited = |s| Step::status_with(429, &[("retry-after", s)]);
    a.script("k", vec![limited("30")]);
    b.script("k", vec![limited("20")]);
    // Both called: the last upstream answer is handed back (b's 429, too long to wait for).
    let r = call(&rebound, "k", &[]).await;
    assert_eq!(r.status.as_u16(), 429);
    assert_eq!(r.header("x-rebound-upstream"), Some("b"));
    assert_eq!((a.count("k"), b.count("k")), (1, 1));
    // Both cooling: nothing is sent; 503 no_target_available, back at the soonest recovery.
    let r = call(&rebound, "k", &[]).await;
    assert_eq!(r.status.as_u16(), 503, "{}", r.text());
    assert_eq!(r.header("x-rebound-error"), Some("no_target_available"));
    assert_eq!(r.header("x-should-retry"), Some("false"));
    let after: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((15..=20).contains(&after), "the soonest: b's 20 s, {after}");
    let body = r.json();
    assert_eq!(
        body["targets"],
        serde_json::json!([
            {"upstream": "a", "outcome": "cooldown"},
            {"upstream": "b", "outcome": "cooldown"}
        ])
    );
    assert_eq!((a.count("k"), b.count("k")), (1, 1), "nothing sent");
}

#[tokio::test]
async fn an_idempotency_key_is_one_generation_whichever_target_served_it() {
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let rebound = two_targets(&a, &b, "ordered", target("a", |_| {}), target("b", |_| {}))
        .idempotency("i", Default::default())
        .route(|r| r.idempotency = some("i"))
        .start()
        .await;
    a.script("k", vec![Step::status(529)]);
    let key = [("idempotency-key", "once-1")];
    let first = call(&rebound, "k", &key).await;
    assert_eq!(
        (first.status.as_u16(), first.header("x-rebound-upstream")),
        (200, Some("b"))
    );
    let again = call(&rebound, "k", &key).await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
    assert_eq!((a.count("k"), b.count("k")), (1, 1), "one generation, on b");
}

#[tokio::test]
async fn weighted_spreads_by_weight_and_least_loaded_avoids_the_slow_target() {
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let weighted = two_targets(
        &a,
        &b,
        "weighted",
        target("a", |t| t.weight = Some(3.0)),
        target("b", |t| t.weight = Some(1.0)),
    )
    .start()
    .await;
    for _ in 0..1000 {
        let r = call(&weighted, "w", &[]).await;
        assert_eq!(r.status, 200);
    }
    let (na, nb) = (a.count("w"), b.count("w"));
    eprintln!("weighted 3:1 over 1,000 requests: a {na}, b {nb}");
    // 750 expected, a standard deviation of 13.7: 670..=830 is 5.8 of them.
    assert!((670..=830).contains(&na) && na + nb == 1000, "a {na}, b {nb}");

    // least_loaded: a answers in 200 ms, b at once; 8 callers at a time, 1,000 requests.
    let loaded = two_targets(&a, &b, "least_loaded", target("a", |_| {}), target("b", |_| {}))
        .start()
        .await;
    a.script("l", vec![Step::Delay { ms: 200 }; 1000]);
    let url = loaded.url.clone();
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..8 {
        let url = url.clone();
        tasks.spawn(async move {
            for _ in 0..125 {
                let r = send(
                    "POST",
                    &format!("{url}{PATH}"),
                    &[("x-fake-key", "l"), ("content-type", "application/json")],
                    r#"{"model":"m"}"#,
                )
                .await;
                assert_eq!(r.status, 200, "worker {worker}");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let (na, nb) = (a.count("l"), b.count("l"));
    eprintln!("least_loaded, a 200 ms slower: a {na}, b {nb} of 1,000");
    assert_eq!(na + nb, 1000);
    assert!(na <= 100, "the slow target took {na} of 1,000");
}

#[tokio::test]
async fn an_upstream_with_fallback_is_the_ordered_case() {
    // The old form: `upstream` + `fallback` is `targets` in order, failing over by the same rules.
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let rebound = TestConfig::new(&a.url())
        .upstream_named("backup", &b.url(), |_| {})
        .route(|r| r.fallback = Some(vec!["backup".into()]))
        .start()
        .await;
    a.script("k", vec![Step::status(529)]);
    let r = call(&rebound, "k", &[]).await;
    assert_eq!(
        (r.status.as_u16(), r.header("x-rebound-upstream")),
        (200, Some("backup"))
    );
    assert_eq!(r.header("x-rebound-failovers"), Some("1"));
}

#[test]
fn bad_target_configs_are_refused_with_the_key_and_what_was_expected() {
    let errors = |edit: &dyn Fn(&mut rebound::hooks::config::raw::RawRoute)| -> String {
        let c = TestConfig::new("http://127.0.0.1:9")
            .upstream_named("b", "http://127.0.0.1:9", |_| {})
            .upstream_named("claude", "https://api.anthropic.com", |_| {})
            .upstream_named("gpt", "https://api.openai.com/v1", |_| {})
            .route(|r| edit(r));
        match rebound::Config::parse(&c.toml(), std::path::Path::new("t.toml"), &|_| None) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    };
    // The route with `targets` instead of its `upstream`.
    let only = |r: &mut rebound::hooks::config::raw::RawRoute, list: Vec<RawTarget>| {
        r.upstream = None;
        r.targets = Some(list);
    };
    let both = errors(&|r| r.targets = Some(vec![target("b", |_| {})]));
    assert!(
        both.contains("routes[0].targets: expected either `targets` or `upstream`"),
        "{both}"
    );
    let unknown = errors(&|r| only(r, vec![target("fake", |_| {}), target("nope", |_| {})]));
    assert!(
        unknown.contains("routes[0].targets[1].upstream: expected the name of an [upstreams.*] table"),
        "{unknown}"
    );
    let weight = errors(&|r| only(r, vec![target("fake", |t| t.weight = Some(0.0)), target("b", |_| {})]));
    assert!(
        weight.contains("routes[0].targets[0].weight: expected a positive number, found 0"),
        "{weight}"
    );
    let mixed = errors(&|r| only(r, vec![target("gpt", |_| {}), target("claude", |_| {})]));
    assert!(
        mixed.contains("routes[0].targets[1].upstream: expected an upstream that serves the route's API (openai"),
        "{mixed}"
    );
    let twice = errors(&|r| only(r, vec![target("b", |_| {}), target("b", |_| {})]));
    assert!(twice.contains("found \"b\" twice"), "{twice}");
    let reason = errors(&|r| r.failover_on = Some(vec!["circuit-open".into()]));
    assert!(
        reason.contains("routes[0].failover_on[0]: expected one of \"circuit_open\""),
        "{reason}"
    );
}

/// A scripted error with a body (JSON), as a provider sends it.
fn error_body(status: u16, headers: &[(&str, &str)], body: &str) -> Step {
    let mut h: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    h.push(("content-type".into(), "application/json".into()));
    Step::Status {
        status,
        headers: h,
        body: Some(body.to_string()),
    }
}

#[tokio::test]
async fn provider_error_bodies_decide_the_class() {
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let rebound = two_targets(&a, &b, "ordered", target("a", |_| {}), target("b", |_| {}))
        .start()
        .await;
    // Bedrock's ServiceUnavailableException (a 503 by status): overloaded, moved at once.
    a.script(
        "br",
        vec![error_body(
            503,
            &[(
                "x-amzn-errortype",
                "ServiceUnavailableException:http://internal.amazon.com/coral/com.amazon.bedrock/",
            )],
            r#"{"message":"Service unavailable"}"#,
        )],
    );
    let r = call(&rebound, "br", &[]).await;
    assert_eq!(r.header("x-rebound-upstream"), Some("b"));
    assert_eq!((a.count("br"), b.count("br")), (1, 1), "not retried on a first");
    // A content-policy refusal (a 400): the app's, never moved.
    let refusal = r#"{"error":{"message":"Your request was rejected as a result of our safety system.","type":"invalid_request_error","code":"content_policy_violation"}}"#;
    a.script("cp", vec![error_body(400, &[], refusal)]);
    let r = call(&rebound, "cp", &[]).await;
    assert_eq!((r.status.as_u16(), r.header("x-rebound-upstream")), (400, Some("a")));
    assert_eq!(r.text(), refusal, "the body is forwarded as it came");
    assert_eq!(b.count("cp"), 0);
    // Last, since it marks the credential for an hour:
    // OpenAI's quota used up (a 429 that no wait cures): exhausted, moved, the key avoided after.
    let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
    a.script("q", vec![error_body(429, &[], quota)]);
    let r = call(&rebound, "q", &[]).await;
    assert_eq!((r.status.as_u16(), r.header("x-rebound-upstream")), (200, Some("b")));
    let r = call(&rebound, "q", &[]).await;
    assert_eq!(
        r.header("x-rebound-upstream"),
        Some("b"),
        "the exhausted key is not called"
    );
    assert_eq!((a.count("q"), b.count("q")), (1, 2));
    let page = rebound.metrics().await;
    // The request that met the quota, and the next one that skipped the exhausted key.
    assert_eq!(failovers(&page, "a", "b", "exhausted"), 2.0, "{page}");
    assert_eq!(failovers(&page, "a", "b", "overloaded"), 1.0, "{page}");
}

#[tokio::test]
async fn gemini_retry_delay_in_the_body_is_obeyed() {
    // One target: the 429's only delay is in its body (RetryInfo.retryDelay, 1.5 s).
    let a = FakeProvider::start().await;
    let rebound = TestConfig::new(&a.url())
        .retry(
            "p",
            RawRetry {
                max_attempts: Some(2),
                base_delay: some("10ms"),
                max_delay: some("10ms"),
                ..RawRetry::default()
            },
        )
        .route(|r| r.retry = some("p"))
        .start()
        .await;
    let gemini = r#"{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_requests","quotaId":"GenerateRequestsPerMinutePerProjectPerModel-FreeTier"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}]}}"#;
    a.script("g", vec![error_body(429, &[], gemini)]);
    let r = call(&rebound, "g", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let gaps = a.gaps("g");
    assert_eq!(gaps.len(), 1, "two requests");
    assert!(gaps[0] >= std::time::Duration::from_millis(1500), "{gaps:?}");
    let page = rebound.metrics().await;
    assert_eq!(
        metric(
            &page,
            r#"rebound_retry_wait_seconds_count{route="fake",source="retry_after"}"#
        ),
        1.0,
        "{page}"
    );
}

#[tokio::test]
async fn a_target_gets_its_own_model_name_and_a_long_prompt_the_larger_context() {
    let (a, b, c) = (
        FakeProvider::start().await,
        FakeProvider::start().await,
        FakeProvider::start().await,
    );
    let rebound = two_targets(
        &a,
        &b,
        "ordered",
        target("a", |t| t.context_window = Some(128_000)),
        target("b", |t| {
            t.models = Some([("m".to_string(), "m-eu-prod".to_string())].into());
            t.context_window = Some(100_000);
        }),
    )
    .upstream_named("c", &c.url(), |_| {})
    .route(|r| {
        let targets = r.targets.as_mut().unwrap();
        targets.push(target("c", |t| t.context_window = Some(1_000_000)));
    })
    .start()
    .await;
    // The model rewrite: b is asked for its own name, the rest of the body untouched.
    a.script("rw", vec![Step::status(529)]);
    let r = call(&rebound, "rw", &[]).await;
    assert_eq!(r.header("x-rebound-upstream"), Some("b"));
    assert_eq!(
        String::from_utf8(b.requests("rw")[0].body.clone()).unwrap(),
        r#"{"model":"m-eu-prod"}"#
    );
    assert_eq!(
        String::from_utf8(a.requests("rw")[0].body.clone()).unwrap(),
        r#"{"model":"m"}"#
    );
    // Too long for a (128k): b takes less, so the request goes to c (1M).
    let long = r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 180000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
    a.script("ctx", vec![error_body(400, &[], long)]);
    let r = call(&rebound, "ctx", &[]).await;
    assert_eq!((r.status.as_u16(), r.header("x-rebound-upstream")), (200, Some("c")));
    assert_eq!((a.count("ctx"), b.count("ctx"), c.count("ctx")), (1, 0, 1));
    let page = rebound.metrics().await;
    assert_eq!(failovers(&page, "a", "c", "context_length"), 1.0, "{page}");
}

#[tokio::test]
async fn an_in_band_overloaded_error_before_the_first_byte_moves_the_stream() {
    // Anthropic sends a 200 whose first event is `overloaded_error`: nothing has reached the app,
    // so another target serves the stream.
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let rebound = two_targets(&a, &b, "ordered", target("a", |_| {}), target("b", |_| {}))
        .start()
        .await;
    a.script("s", vec![Step::in_band("overloaded_error")]);
    let headers = [("x-fake-key", "s"), ("content-type", "application/json")];
    let body = r#"{"model":"m","stream":true}"#;
    let r = send("POST", &format!("{}/fake/v1/messages", rebound.url), &headers, body).await;
    let reference = send(
        "POST",
        &format!("{}/v1/messages", b.url()),
        &[("x-fake-key", "ref"), ("content-type", "application/json")],
        body,
    )
    .await;
    assert_eq!((r.status.as_u16(), r.header("x-rebound-upstream")), (200, Some("b")));
    assert_eq!(r.text(), reference.text(), "b's whole stream, no error event");
    assert_eq!((a.count("s"), b.count("s")), (1, 1));
    let page = rebound.metrics().await;
    assert_eq!(failovers(&page, "a", "b", "overloaded"), 1.0, "{page}");
}

#[tokio::test]
async fn a_key_exhausted_on_one_replica_is_avoided_by_the_fleet() {
    let redis = crate::support::redis::RedisServer::start();
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let mut config = two_targets(&a, &b, "ordered", target("a", |_| {}), target("b", |_| {}));
    config.0.redis = Some(rebound::hooks::config::raw::RawRedis {
        url: some(&redis.url()),
        sync_interval: some("100ms"),
        ..Default::default()
    });
    let config = config.config();
    let fleet = [
        Rebound::start_config(config.clone()).await,
        Rebound::start_config(config.clone()).await,
        Rebound::start_config(config).await,
    ];
    let syncs = |page: &str| {
        metric(
            page,
            r#"rebound_redis_command_duration_seconds_count{op="circuit_sync"}"#,
        )
    };
    for r in &fleet {
        until_metric(r, r#"rebound_redis_up"#, |v| v == 1.0).await;
    }
    let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    a.script("q", vec![error_body(429, &[], quota); 10]);
    let first = call(&fleet[0], "q", &[]).await;
    assert_eq!(first.header("x-rebound-upstream"), Some("b"));
    // Within one sync of their own after it: the other replicas hold the key too.
    let before: Vec<f64> = futures_util::future::join_all(fleet[1..].iter().map(|r| r.metrics()))
        .await
        .iter()
        .map(|p| syncs(p))
        .collect();
    for (r, from) in fleet[1..].iter().zip(before) {
        until_metric(
            r,
            r#"rebound_redis_command_duration_seconds_count{op="circuit_sync"}"#,
            |n| n >= from + 1.0,
        )
        .await;
    }
    for r in &fleet {
        let answer = call(r, "q", &[]).await;
        assert_eq!(answer.header("x-rebound-upstream"), Some("b"));
    }
    assert_eq!(
        (a.count("q"), b.count("q")),
        (1, 4),
        "no replica calls the exhausted key"
    );
}

#[tokio::test]
async fn traffic_returns_to_the_first_target_once_it_recovers() {
    // The breaker's defaults (3 in a row, 5 s doubling to 8 s) are shown by the breaker's unit
    // test on a clock; here the same path through sockets, with the times scaled down.
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let mut config =
        two_targets(&a, &b, "ordered", target("a", |_| {}), target("b", |_| {}))
            .upstream_named("a", &a.url(), |u| u.circuit = some("c"));
    config.0.circuit.insert(
        "c".into(),
        rebound::hooks::config::raw::RawCircuit {
            open_for: some("500ms"),
            max_open_for: some("1s"),
            ..Default::default()
        },
    );
    let rebound = config.start().await;
    a.script("k", vec![Step::status(503); 1000]);
    // a is down: every request ends on b, and a's circuit opens after its default 3 failures.
    for _ in 0..6 {
        let r = call(&rebound, "k", &[]).await;
        assert_eq!(r.header("x-rebound-upstream"), Some("b"));
    }
    let page = rebound.metrics().await;
    assert_eq!(metric(&page, r#"rebound_circuit_state{upstream="a"}"#), 2.0, "{page}");
    // a recovers (its script ends: it answers normally); within a guard of 10 s, requests are
    // served by a again.
    a.script("k", vec![]);
    let healed = std::time::Instant::now();
    let back = until(
        "a carries traffic again",
        std::time::Duration::from_secs(10),
        || async {
            let r = call(&rebound, "k", &[]).await;
            match r.header("x-rebound-upstream") {
                Some("a") => Ok(healed.elapsed()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    eprintln!("a served again {back:?} after it recovered");
    for _ in 0..3 {
        assert_eq!(call(&rebound, "k", &[]).await.header("x-rebound-upstream"), Some("a"));
    }
}

#[tokio::test]
async fn cloudflares_520_to_524_in_front_of_a_provider_are_retried() {
    let a = FakeProvider::start().await;
    let rebound = TestConfig::new(&a.url())
        .retry(
            "p",
            RawRetry {
                base_delay: some("10ms"),
                max_delay: some("10ms"),
                ..RawRetry::default()
            },
        )
        .route(|r| r.retry = some("p"))
        .start()
        .await;
    for status in [520, 521, 522, 523, 524] {
        let key = format!("cf-{status}");
        a.script(
            &key,
            vec![error_body(
                status,
                &[("server", "cloudflare")],
                "<html>error code: 52x</html>",
            )],
        );
        let r = call(&rebound, &key, &[]).await;
        assert_eq!(r.status, 200, "{status} retried by the default retry_on");
        assert_eq!(a.count(&key), 2, "{status}");
    }
}

#[tokio::test]
async fn when_every_target_is_exhausted_no_retry_after_is_promised() {
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let rebound = two_targets(&a, &b, "ordered", target("a", |_| {}), target("b", |_| {}))
        .start()
        .await;
    let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    a.script("q", vec![error_body(429, &[], quota)]);
    b.script("q", vec![error_body(429, &[], quota)]);
    let first = call(&rebound, "q", &[]).await;
    assert_eq!(
        (first.status.as_u16(), first.header("x-rebound-upstream")),
        (429, Some("b"))
    );
    let r = call(&rebound, "q", &[]).await;
    assert_eq!(r.status.as_u16(), 503, "{}", r.text());
    assert_eq!(r.header("x-rebound-error"), Some("no_target_available"));
    assert_eq!(
        r.header("retry-after"),
        None,
        "a quota used up for the day has no time to give"
    );
    assert_eq!(
        r.json()["targets"],
        serde_json::json!([
            {"upstream": "a", "outcome": "exhausted"},
            {"upstream": "b", "outcome": "exhausted"}
        ])
    );
    assert_eq!((a.count("q"), b.count("q")), (1, 1), "neither key called again");
}

#[tokio::test]
async fn each_targets_state_is_a_gauge_for_the_key_the_sidecar_sets() {
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let rebound = two_targets(&a, &b, "ordered", target("a", |_| {}), target("b", |_| {}))
        .upstream_named("a", &a.url(), |u| {
            u.set_headers.insert("authorization".into(), "Bearer sk-a".into());
        })
        .upstream_named("b", &b.url(), |u| {
            u.set_headers.insert("authorization".into(), "Bearer sk-b".into());
        })
        .start()
        .await;
    let state = |page: &str, upstream: &str, state: &str| {
        metric(
            page,
            &format!(r#"rebound_target_state{{route="fake",state="{state}",upstream="{upstream}"}}"#),
        )
    };
    let page = rebound.metrics().await;
    assert_eq!(
        (state(&page, "a", "available"), state(&page, "b", "available")),
        (1.0, 1.0),
        "{page}"
    );
    let quota = r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    a.script("q", vec![error_body(429, &[], quota)]);
    b.script("q", vec![Step::status_with(429, &[("retry-after", "30")])]);
    call(&rebound, "q", &[]).await;
    let page = rebound.metrics().await;
    assert_eq!(
        (state(&page, "a", "exhausted"), state(&page, "a", "available")),
        (1.0, 0.0),
        "{page}"
    );
    assert_eq!(state(&page, "b", "cooling"), 1.0, "{page}");
}
