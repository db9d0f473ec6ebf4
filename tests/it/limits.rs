//! Fleet-wide limits through real sockets: `[limits.*]` on the `fake` route, what the
//! app sees (200 with the `RateLimit` fields, 429 `limit_exceeded` with `retry-after`), what the
//! provider sees (nothing of a refused request), and the fleet's share of a limit on one Redis.

use std::time::Duration;

use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::{FakeProvider, Step};
use crate::support::redis::RedisServer;
use crate::support::*;
use http_body_util::BodyExt;
use rebound::hooks::config::raw::{RawLimit, RawPrice};

pub(crate) fn team_limit(edit: impl FnOnce(&mut RawLimit)) -> RawLimit {
    let mut l = RawLimit {
        key: some("header:x-team"),
        on_limit: some("reject"),
        ..RawLimit::default()
    };
    edit(&mut l);
    l
}

pub(crate) async fn call(rebound: &Rebound, key: &str, team: &str) -> Answer {
    let h = [
        ("x-fake-key", key),
        ("x-team", team),
        ("content-type", "application/json"),
    ];
    let body = r#"{"model":"gpt-fake","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
    send("POST", &format!("{}/fake/v1/chat/completions", rebound.url), &h, body).await
}

/// Waits until `rebound` reports its Redis connection up.
pub(crate) async fn redis_up(rebound: &Rebound) {
    until("redis up", Duration::from_secs(10), || async {
        let page = rebound.metrics().await;
        (metric(&page, "rebound_redis_up") == 1.0)
            .then_some(())
            .ok_or("down".to_string())
    })
    .await;
}

/// Waits, when less than `margin` is left of the current UTC minute, for the next one: a test
/// that counts a minute's requests must not straddle two windows.
pub(crate) async fn whole_minute_ahead(margin: Duration) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let left = Duration::from_millis(60_000 - (now.as_millis() % 60_000) as u64);
    if left < margin {
        tokio::time::sleep(left + Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn requests_over_a_teams_limit_get_429_and_never_reach_the_provider() {
    whole_minute_ahead(Duration::from_secs(20)).await;
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .limit("team", team_limit(|l| l.requests_per_minute = Some(3)))
        .start()
        .await;
    for r in (0..3).rev() {
        let a = call(&rebound, "k", "chat").await;
        assert_eq!(a.status, 200);
        assert_eq!(a.header("ratelimit-policy"), Some(r#""team";q=3;w=60"#));
        let ratelimit = a.header("ratelimit").unwrap();
        assert!(ratelimit.starts_with(&format!(r#""team";r={r};t="#)), "{ratelimit}");
    }
    let over = call(&rebound, "k", "chat").await;
    assert_eq!(over.status, 429);
    assert_eq!(over.header("x-rebound-error"), Some("limit_exceeded"));
    let after: u64 = over.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&after), "the minute's end: {after}");
    // The refusing limit's fields: nothing left.
    assert_eq!(over.header("ratelimit-policy"), Some(r#""team";q=3;w=60"#));
    assert!(
        over.header("ratelimit").unwrap().starts_with(r#""team";r=0;t="#),
        "{:?}",
        over.header("ratelimit")
    );
    assert_eq!(provider.count("k"), 3, "the refused request was not sent");
    // Another team has its own bucket.
    assert_eq!(call(&rebound, "k", "batch").await.status, 200);
    let page = rebound.metrics().await;
    assert_eq!(
        metric(
            &page,
            r#"rebound_limit_decisions_total{limit="team",result="admitted"}"#
        ),
        4.0
    );
    assert_eq!(
        metric(
            &page,
            r#"rebound_limit_decisions_total{limit="team",result="rejected"}"#
        ),
        1.0
    );
}

#[tokio::test]
async fn tokens_are_settled_from_the_usage_the_provider_reports() {
    whole_minute_ahead(Duration::from_secs(20)).await;
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .limit("team", team_limit(|l| l.tokens_per_minute = Some(1000)))
        .start()
        .await;
    // Each request reserves 100 (max_tokens) + its prompt (about 25), and uses 108 (the fake's
    // usage): settled at 108, nine fit in 1000, the tenth does not.
    for _ in 0..9 {
        assert_eq!(call(&rebound, "t", "chat").await.status, 200);
    }
    let page = rebound.metrics().await;
    assert_eq!(
        metric(&page, r#"rebound_limit_tokens_total{kind="settled",limit="team"}"#),
        9.0 * 108.0
    );
    let tenth = call(&rebound, "t", "chat").await;
    assert_eq!(tenth.status, 429, "1000 - 9 x 108 = 28 left, less than the reservation");
    assert_eq!(provider.count("t"), 9);
}

#[tokio::test]
async fn a_queued_request_waits_for_a_concurrent_slot() {
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .limit(
            "one",
            team_limit(|l| {
                l.concurrent = Some(1);
                l.on_limit = some("queue");
                l.max_wait = some("10s");
            }),
        )
        .start()
        .await;
    provider.script("slow", vec![Step::Delay { ms: 400 }, Step::Delay { ms: 400 }]);
    let url = rebound.url.clone();
    let first = tokio::spawn(async move {
        let h = [("x-fake-key", "slow"), ("x-team", "chat")];
        send("POST", &format!("{url}/fake/v1/chat/completions"), &h, "{}").await
    });
    until_metric(
        &rebound,
        r#"rebound_limit_decisions_total{limit="one",result="admitted"}"#,
        |v| v >= 1.0,
    )
    .await;
    let second = call(&rebound, "slow", "chat").await;
    assert_eq!(second.status, 200, "it waited for the first to end");
    assert_eq!(first.await.unwrap().status, 200);
    let page = rebound.metrics().await;
    assert_eq!(
        metric(&page, r#"rebound_limit_decisions_total{limit="one",result="queued"}"#),
        1.0
    );
}

#[tokio::test]
async fn three_replicas_on_one_redis_share_one_limit() {
    whole_minute_ahead(Duration::from_secs(30)).await;
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = TestConfig::new(&provider.url())
        .redis(&redis.url())
        .limit("team", team_limit(|l| l.requests_per_minute = Some(20)));
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(config.start().await);
    }
    for r in &replicas {
        redis_up(r).await;
    }
    let mut admitted = 0;
    for i in 0..45 {
        let a = call(&replicas[i % 3], "fleet", "chat").await;
        match a.status.as_u16() {
            200 => admitted += 1,
            429 => assert_eq!(a.header("x-rebound-error"), Some("limit_exceeded")),
            s => panic!("status {s}"),
        }
    }
    assert_eq!(admitted, 20, "the fleet admits the limit, not 3 x the limit");
    assert_eq!(provider.count("fleet"), 20);
}

/// A shared capacity (one slot for the whole route) under scarcity: the queue releases the two
/// teams 4 : 1, as their weights say.
#[tokio::test]
async fn weights_share_a_scarce_limit_four_to_one() {
    let provider = FakeProvider::start().await;
    let shared = RawLimit {
        key: some("route"),
        concurrent: Some(1),
        on_limit: some("queue"),
        max_wait: some("60s"),
        share_by: some("header:x-team"),
        weights: Some([("chat".to_string(), 4), ("batch".to_string(), 1)].into()),
        ..RawLimit::default()
    };
    let rebound = TestConfig::new(&provider.url()).limit("shared", shared).start().await;
    provider.script("w", vec![Step::Delay { ms: 10 }; 200]);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..120 {
        let url = rebound.url.clone();
        let team = if i % 2 == 0 { "chat" } else { "batch" };
        set.spawn(async move {
            let h = [("x-fake-key", "w"), ("x-team", team)];
            let body = format!(r#"{{"n":{i}}}"#);
            send_within(
                Duration::from_secs(60),
                "POST",
                &format!("{url}/fake/v1/chat/completions"),
                &h,
                body,
            )
            .await
        });
    }
    while let Some(a) = set.join_next().await {
        assert_eq!(a.unwrap().status, 200);
    }
    let order: Vec<String> = provider
        .requests("w")
        .iter()
        .map(|r| r.header("x-team").unwrap_or("").to_string())
        .collect();
    assert_eq!(order.len(), 120);
    // While both teams wait (the first 10 releases may come before every request queued).
    let chat = order[10..60].iter().filter(|t| *t == "chat").count();
    assert!(
        (36..=44).contains(&chat),
        "chat had {chat} of 50 releases, 40 expected: {order:?}"
    );
}

#[tokio::test]
async fn a_queued_request_gets_its_429_when_its_wait_runs_out() {
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .limit(
            "one",
            team_limit(|l| {
                l.concurrent = Some(1);
                l.on_limit = some("queue");
                l.max_wait = some("300ms");
            }),
        )
        .start()
        .await;
    provider.script("hold", vec![Step::Delay { ms: 3000 }]);
    let url = rebound.url.clone();
    let first = tokio::spawn(async move {
        let h = [("x-fake-key", "hold"), ("x-team", "chat")];
        send("POST", &format!("{url}/fake/v1/chat/completions"), &h, "{}").await
    });
    until_metric(
        &rebound,
        r#"rebound_limit_decisions_total{limit="one",result="admitted"}"#,
        |v| v >= 1.0,
    )
    .await;
    let second = call(&rebound, "hold", "chat").await;
    assert_eq!(second.status, 429);
    assert_eq!(second.header("x-rebound-error"), Some("limit_exceeded"));
    assert!(
        !first.is_finished(),
        "the 429 came when the wait ran out, not when the slot freed"
    );
    assert_eq!(first.await.unwrap().status, 200);
}

#[tokio::test]
async fn a_spend_limit_counts_each_requests_cost_at_its_models_price() {
    whole_minute_ahead(Duration::from_secs(20)).await;
    let provider = FakeProvider::start().await;
    let mut config = TestConfig::new(&provider.url()).limit("budget", team_limit(|l| l.usd_per_day = Some(0.005)));
    // 10 USD per million tokens: 10 micro-USD a token. Each request reserves about 1250
    // (its prompt and max_tokens 100) and costs 1080 (the fake's 108 tokens): four fit in 5000.
    config = config.price(
        "gpt-fake",
        RawPrice {
            input: Some(10.0),
            output: Some(10.0),
            cached_input: None,
        },
    );
    let rebound = config.start().await;
    for _ in 0..4 {
        assert_eq!(call(&rebound, "s", "chat").await.status, 200);
    }
    let fifth = call(&rebound, "s", "chat").await;
    assert_eq!(
        fifth.status, 429,
        "4 x 1080 spent, 680 left: less than the next reservation"
    );
    assert_eq!(provider.count("s"), 4);
}

#[tokio::test]
async fn while_redis_is_away_a_limit_does_what_redis_down_says() {
    whole_minute_ahead(Duration::from_secs(30)).await;
    let mut redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = TestConfig::new(&provider.url()).redis(&redis.url()).limit(
        "closed",
        team_limit(|l| {
            l.requests_per_minute = Some(1000);
            l.redis_down = some("closed");
        }),
    );
    let rebound = config.start().await;
    redis_up(&rebound).await;
    assert_eq!(call(&rebound, "r", "chat").await.status, 200);
    redis.stop();
    // Leases of 125 (1000 / 8): the one in hand runs out, then no new one comes.
    let mut statuses = Vec::new();
    for _ in 0..200 {
        statuses.push(call(&rebound, "r", "chat").await.status.as_u16());
    }
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    assert!(
        admitted < 200 && statuses.last() == Some(&429),
        "closed: refused once the lease ran out ({admitted} admitted)"
    );
}

#[test]
fn a_limit_that_cannot_work_is_refused_at_load_naming_the_key() {
    use rebound::hooks::config::Config;
    let base = "[upstreams.u]\nurl = \"http://127.0.0.1:9\"\n[[routes]]\nname = \"r\"\npath_prefix = \"/r/\"\nupstream = \"u\"\n";
    let cases = [
        (
            "limits = [\"nope\"]\n",
            "routes[0].limits[0]",
            "expected the name of a [limits.*] table",
        ),
        (
            "[limits.a]\nrequests_per_minute = 1\n",
            "limits.a.key",
            "expected who is limited",
        ),
        (
            "[limits.a]\nkey = \"team\"\nrequests_per_minute = 1\n",
            "limits.a.key",
            "unknown part \"team\"",
        ),
        (
            "[limits.a]\nkey = \"header:authorization\"\nconcurrent = 1\n",
            "limits.a.key",
            "credential header",
        ),
        ("[limits.a]\nkey = \"route\"\n", "limits.a", "expected at least one of"),
        (
            "[limits.a]\nkey = \"route\"\nusd_per_day = 5.0\n",
            "limits.a",
            "[prices]",
        ),
        (
            "[limits.a]\nkey = \"route\"\nconcurrent = 1\nweights = { chat = 4 }\n",
            "limits.a.weights",
            "share_by",
        ),
        (
            "[limits.a]\nkey = \"route\"\nconcurrent = 1\non_limit = \"reject\"\nmax_wait = \"5s\"\n",
            "limits.a.on_limit",
            "\"queue\"",
        ),
        (
            "[limits.a]\nkey = \"route\"\nconcurrent = 1\nredis_down = \"maybe\"\n",
            "limits.a.redis_down",
            "\"local\"",
        ),
    ];
    for (extra, key, says) in cases {
        let (route_extra, tables) = match extra.starts_with("limits =") {
            true => (extra, ""),
            false => ("", extra),
        };
        let src = format!("{base}{route_extra}{tables}");
        let err = Config::parse(&src, std::path::Path::new("t.toml"), &|_| None)
            .err()
            .unwrap_or_else(|| panic!("{extra:?} loaded"))
            .to_string();
        assert!(err.contains(key) && err.contains(says), "{extra:?}: {err}");
        assert!(err.contains("t.toml"), "{err}");
    }
}

/// A replica that dies holding a lease takes only that lease with it: the others admit the rest
/// of the window, and the fleet never passes the limit.
#[tokio::test]
async fn a_replica_killed_holding_a_lease_costs_the_fleet_at_most_that_lease() {
    whole_minute_ahead(Duration::from_secs(30)).await;
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = TestConfig::new(&provider.url())
        .redis(&redis.url())
        .limit("team", team_limit(|l| l.requests_per_minute = Some(40)));
    let mut doomed = crate::support::sidecar::ReboundProcess::start(&config.toml(), &[]).await;
    let url = doomed.proxy.clone();
    let doomed_call = |n: u32| {
        let url = url.clone();
        async move {
            let h = [("x-fake-key", "kill"), ("x-team", "chat")];
            send(
                "POST",
                &format!("{url}/fake/v1/chat/completions"),
                &h,
                format!(r#"{{"n":{n}}}"#),
            )
            .await
        }
    };
    // Alone on the bucket, it leases 40 / 8 = 5 and admits 3 of them, renewing in the
    // background at the low-water mark (2 left): it dies holding 2 + 5.
    for n in 0..3 {
        assert_eq!(doomed_call(n).await.status, 200);
    }
    doomed.child.kill().await.expect("kill");
    let others = [config.start().await, config.start().await];
    let mut admitted = 3;
    for i in 0..60 {
        match call(&others[i % 2], "kill", "chat").await.status.as_u16() {
            200 => admitted += 1,
            429 => {}
            s => panic!("status {s}"),
        }
    }
    assert_eq!(provider.count("kill"), admitted);
    assert!(
        (33..=40).contains(&admitted),
        "the limit, less at most the dead replica's unspent leases (7): {admitted}"
    );
}

/// Redis frozen mid-run: with `redis_down = "local"` the replica goes on with its own share of
/// the limit, and stops at it.
#[tokio::test]
async fn while_redis_is_frozen_a_replica_enforces_its_share() {
    whole_minute_ahead(Duration::from_secs(30)).await;
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .redis_with(&redis.url(), |r| r.command_timeout = some("200ms"))
        .limit("team", team_limit(|l| l.requests_per_minute = Some(16)))
        .start()
        .await;
    redis_up(&rebound).await;
    for _ in 0..2 {
        assert_eq!(call(&rebound, "frozen", "chat").await.status, 200);
    }
    redis.freeze();
    let mut statuses = Vec::new();
    for _ in 0..24 {
        statuses.push(call(&rebound, "frozen", "chat").await.status.as_u16());
    }
    redis.thaw();
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    // The lease in hand (16 / 8 = 2), then the replica's own count of its share (16 / 1 replica).
    assert!(
        statuses[..10].iter().all(|s| *s == 200),
        "admitted while frozen: {statuses:?}"
    );
    assert!(admitted <= 2 + 16, "its share, not unlimited: {admitted}");
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
}

/// A burst on a fresh bucket asks the fleet once, not once per request: the others wait for that
/// answer (before, each asked, and one told "nothing left" before the others' grants were
/// credited was refused with the quota far from used).
#[tokio::test]
async fn a_burst_on_a_fresh_bucket_asks_the_fleet_once_and_is_admitted_whole() {
    whole_minute_ahead(Duration::from_secs(20)).await;
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .redis(&redis.url())
        .limit(
            "team",
            team_limit(|l| {
                l.requests_per_minute = Some(600);
                l.concurrent = Some(200);
            }),
        )
        .start()
        .await;
    redis_up(&rebound).await;
    provider.script("burst", vec![Step::Delay { ms: 50 }; 64]);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..64 {
        let url = rebound.url.clone();
        set.spawn(async move {
            let h = [("x-fake-key", "burst"), ("x-team", "chat")];
            send(
                "POST",
                &format!("{url}/fake/v1/chat/completions"),
                &h,
                format!(r#"{{"n":{i}}}"#),
            )
            .await
        });
    }
    while let Some(a) = set.join_next().await {
        assert_eq!(a.unwrap().status, 200);
    }
    let page = rebound.metrics().await;
    let asks = |op: &str| {
        metric(
            &page,
            &format!(r#"rebound_redis_command_duration_seconds_count{{op="{op}"}}"#),
        )
    };
    // 600 / 8 = 75 requests a lease, 200 / 4 = 50 slots a holding: a few asks, not 64.
    assert!(asks("limit_lease") <= 2.0, "{} leases", asks("limit_lease"));
    assert!(asks("limit_slots") <= 4.0, "{} slot asks", asks("limit_slots"));
}

#[tokio::test]
async fn with_redis_down_open_a_limit_admits_while_redis_is_away() {
    whole_minute_ahead(Duration::from_secs(20)).await;
    let mut redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .redis_with(&redis.url(), |r| r.command_timeout = some("200ms"))
        .limit(
            "open",
            team_limit(|l| {
                l.requests_per_minute = Some(20);
                l.redis_down = some("open");
            }),
        )
        .start()
        .await;
    redis_up(&rebound).await;
    assert_eq!(call(&rebound, "open", "chat").await.status, 200);
    redis.stop();
    // Past the leases in hand (3) and past the limit itself.
    for _ in 0..25 {
        assert_eq!(
            call(&rebound, "open", "chat").await.status,
            200,
            "not enforced while Redis is away"
        );
    }
    assert_eq!(provider.count("open"), 26);
}

/// A stream is charged as it flows: once it has used more than it reserved, what it uses counts
/// against the limit before it ends, so that a long stream does not pass the limit unseen.
#[tokio::test]
async fn a_long_stream_is_charged_as_it_flows() {
    whole_minute_ahead(Duration::from_secs(30)).await;
    let provider = FakeProvider::start().await;
    // 9000 events, the first 8000 at once, then a pause: the stream is mid-way for 10 s.
    provider.script(
        "long",
        vec![Step::PauseAfter {
            after: 8000,
            ms: 10_000,
        }],
    );
    let rebound = TestConfig::new(&provider.url())
        .limit("team", team_limit(|l| l.tokens_per_minute = Some(10_000)))
        .start()
        .await;
    let url = format!("{}/fake/v1/chat/completions", rebound.url);
    let h = [
        ("x-fake-key", "long"),
        ("x-team", "chat"),
        ("x-fake-chunks", "9000"),
        ("content-type", "application/json"),
    ];
    // No max_tokens: it reserves its prompt and 4096 of output.
    let body = r#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;
    let resp = send_streaming("POST", &url, &h, body).await;
    assert_eq!(resp.status(), 200);
    let mut stream = resp.into_body();
    let mut read = Vec::new();
    let mut events = 0;
    while events < 8000 {
        let frame = tokio::time::timeout(Duration::from_secs(10), stream.frame())
            .await
            .expect("the first 8000 events")
            .expect("a frame")
            .expect("no error");
        if let Some(d) = frame.data_ref() {
            events += d.windows(5).filter(|w| *w == b"data:").count();
            read.extend_from_slice(d);
        }
    }
    let ask = |max_tokens: u32| {
        let url = url.clone();
        async move {
            let h = [
                ("x-fake-key", "other"),
                ("x-team", "chat"),
                ("content-type", "application/json"),
            ];
            let body = format!(r#"{{"model":"gpt-4o","max_tokens":{max_tokens},"messages":[]}}"#);
            send("POST", &url, &h, body).await
        }
    };
    // Reserved alone (4096 and its prompt), the stream would leave 5800 of the 10 000: 3000
    // would pass. Charged the 8000 it has streamed, it leaves 2000.
    let refused = ask(3000).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert!(refused.text().contains("limit_exceeded"), "{}", refused.text());
    assert_eq!(ask(1000).await.status, 200, "what is left is admitted");
    let rest = read_body(stream, &read, Duration::from_secs(20)).await;
    assert!(rest.clean);
    // The other is settled from the usage it reported (12 + 96); the stream reported none, and
    // keeps what it was charged (about 9000 of the window), not its reservation.
    let settled = r#"rebound_limit_tokens_total{kind="settled",limit="team"}"#;
    until_metric(&rebound, settled, |n| n == 108.0).await;
    // Its books closed (they are settled as they close).
    until_metric(&rebound, "rebound_inflight_requests", |n| n == 0.0).await;
    assert_eq!(ask(1000).await.status, 429);
}

/// Three replicas on one Redis under bursts of concurrent requests and streams, with a ledger of
/// every admitted request and the tokens it used: the fleet admits no more than the limit plus
/// the stated bound (the excess of requests that used more than they reserved), and most of it.
#[tokio::test]
async fn three_replicas_keep_a_token_limit_within_the_stated_bound_under_bursts_and_streams() {
    whole_minute_ahead(Duration::from_secs(40)).await;
    let minute = || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        now.as_secs() / 60
    };
    let started = minute();
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    const LIMIT: u64 = 20_000;
    let config = TestConfig::new(&provider.url())
        .redis(&redis.url())
        .limit("team", team_limit(|l| l.tokens_per_minute = Some(LIMIT as i64)));
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let r = config.start().await;
        redis_up(&r).await;
        replicas.push(r);
    }
    // What each kind of request sends and what the provider reports it used.
    // (path, body, deltas, tokens used, max_tokens)
    let kinds: [(&str, String, &str, u64, u64); 3] = [
        // A chat completion: 12 + 96, within its reservation.
        (
            "chat/completions",
            r#"{"model":"gpt-4o","max_tokens":200,"messages":[{"role":"user","content":"hi"}]}"#.into(),
            "5",
            108,
            200,
        ),
        // A chat stream of 300 deltas with max_tokens 100: 12 + 300, beyond its reservation.
        (
            "chat/completions",
            r#"{"model":"gpt-4o","max_tokens":100,"stream":true,"stream_options":{"include_usage":true},"messages":[]}"#.into(),
            "300",
            312,
            100,
        ),
        // A Messages stream of 150 deltas: 12 + 150.
        (
            "messages",
            r#"{"model":"claude-sonnet-4-5","max_tokens":400,"stream":true,"messages":[]}"#.into(),
            "150",
            162,
            400,
        ),
    ];
    let mut ledger: Vec<(u64, u64)> = Vec::new(); // (used, excess) of each admitted request
    let mut refused = 0;
    for burst in 0..6 {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..30usize {
            let url = replicas[i % 3].url.clone();
            let (path, body, chunks, used, max_tokens) = kinds[(i + burst) % 3].clone();
            set.spawn(async move {
                let h = [
                    ("x-fake-key", "ledger"),
                    ("x-team", "chat"),
                    ("x-fake-chunks", chunks),
                    ("content-type", "application/json"),
                ];
                // What rebound reserves: the prompt at 4 bytes a token, and max_tokens.
                let reserved = (body.len() as u64).div_ceil(4) + max_tokens;
                let a = send("POST", &format!("{url}/fake/v1/{path}"), &h, body).await;
                (a, used, reserved)
            });
        }
        while let Some(joined) = set.join_next().await {
            let (a, used, reserved) = joined.expect("task");
            match a.status.as_u16() {
                200 => ledger.push((used, used.saturating_sub(reserved))),
                429 => {
                    assert_eq!(a.header("x-rebound-error"), Some("limit_exceeded"));
                    refused += 1;
                }
                s => panic!("status {s}: {}", a.text()),
            }
        }
    }
    assert_eq!(minute(), started, "the run stayed in one window");
    let used: u64 = ledger.iter().map(|(u, _)| u).sum();
    let excess: u64 = ledger.iter().map(|(_, e)| e).sum();
    assert_eq!(
        provider.count("ledger"),
        ledger.len(),
        "every admitted request, and no other, was sent"
    );
    assert!(refused > 0, "the bursts asked for more than the limit");
    assert!(
        used <= LIMIT + excess,
        "{} admitted used {used} tokens: more than the limit {LIMIT} + their excess {excess}",
        ledger.len()
    );
    // Idle leases (at most a chunk and a half per replica: 3 x 1250) and the reservations of
    // requests in flight when the window filled are what keeps it below.
    assert!(
        used >= LIMIT / 2,
        "{} admitted used only {used} of {LIMIT}",
        ledger.len()
    );
    eprintln!(
        "LEDGER admitted {} used {used} excess {excess} refused {refused}",
        ledger.len()
    );
}

/// The queue is the fleet's: chat waits on one replica, batch on another, for one slot the
/// whole fleet shares, and the releases still go 4 : 1 by the weights (each replica releasing
/// its own queue would go about 1 : 1, by who asks first).
#[tokio::test]
async fn two_replicas_release_a_shared_limits_queue_four_to_one() {
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let shared = RawLimit {
        key: some("route"),
        concurrent: Some(1),
        on_limit: some("queue"),
        max_wait: some("60s"),
        share_by: some("header:x-team"),
        weights: Some([("chat".to_string(), 4), ("batch".to_string(), 1)].into()),
        ..RawLimit::default()
    };
    let config = TestConfig::new(&provider.url())
        .redis(&redis.url())
        .limit("shared", shared);
    let (chat_replica, batch_replica) = (config.start().await, config.start().await);
    redis_up(&chat_replica).await;
    redis_up(&batch_replica).await;
    provider.script("fleetw", vec![Step::Delay { ms: 10 }; 200]);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..120 {
        let (team, url) = match i % 2 {
            0 => ("chat", chat_replica.url.clone()),
            _ => ("batch", batch_replica.url.clone()),
        };
        set.spawn(async move {
            let h = [("x-fake-key", "fleetw"), ("x-team", team)];
            let url = format!("{url}/fake/v1/chat/completions");
            send_within(Duration::from_secs(60), "POST", &url, &h, format!(r#"{{"n":{i}}}"#)).await
        });
    }
    while let Some(a) = set.join_next().await {
        assert_eq!(a.unwrap().status, 200);
    }
    let order: Vec<String> = provider
        .requests("fleetw")
        .iter()
        .map(|r| r.header("x-team").unwrap_or("").to_string())
        .collect();
    assert_eq!(order.len(), 120);
    // While both teams wait (the first releases may come before every request queued).
    let chat = order[10..60].iter().filter(|t| *t == "chat").count();
    assert!(
        (36..=44).contains(&chat),
        "chat had {chat} of 50 releases, 40 expected: {order:?}"
    );
}

/// A replica that shuts down hands its unspent leases back: the others admit the whole rest of
/// the window (a replica killed loses its leases instead: the test above).
#[tokio::test]
async fn a_replica_shut_down_hands_its_leases_back_to_the_fleet() {
    whole_minute_ahead(Duration::from_secs(30)).await;
    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let config = TestConfig::new(&provider.url())
        .redis(&redis.url())
        .limit("team", team_limit(|l| l.requests_per_minute = Some(40)));
    let mut leaving = config.start().await;
    redis_up(&leaving).await;
    // Alone on the bucket, it leases 40 / 8 = 5, admits 3 and renews at the low-water mark: it
    // holds 2 + 5 when it shuts down.
    for _ in 0..3 {
        assert_eq!(call(&leaving, "back", "chat").await.status, 200);
    }
    leaving.shutdown().await;
    let other = config.start().await;
    redis_up(&other).await;
    let mut admitted = 3;
    for _ in 0..50 {
        match call(&other, "back", "chat").await.status.as_u16() {
            200 => admitted += 1,
            429 => {}
            s => panic!("status {s}"),
        }
    }
    assert_eq!(
        admitted, 40,
        "the whole limit, the leaving replica's unspent leases included"
    );
    assert_eq!(provider.count("back"), 40);
}

/// One deadline per request, counted from its arrival: what a request waited in the queue is not
/// given back to its attempts (a client that gave up at its deadline may have sent it again).
#[tokio::test]
async fn a_queued_request_spends_one_deadline_from_its_arrival() {
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .limit(
            "one",
            team_limit(|l| {
                l.concurrent = Some(1);
                l.on_limit = some("queue");
                l.max_wait = some("60s");
            }),
        )
        .start()
        .await;
    provider.script("hold", vec![Step::Delay { ms: 2700 }]);
    // Sent now, its answer would come 2.7 s (queued) + 3 s later: past its 4 s.
    provider.script("late", vec![Step::Delay { ms: 3000 }]);
    let url = rebound.url.clone();
    let first = tokio::spawn(async move {
        let h = [("x-fake-key", "hold"), ("x-team", "chat")];
        send("POST", &format!("{url}/fake/v1/chat/completions"), &h, "{}").await
    });
    until_metric(
        &rebound,
        r#"rebound_limit_decisions_total{limit="one",result="admitted"}"#,
        |v| v >= 1.0,
    )
    .await;
    let sent = std::time::Instant::now();
    let h = [
        ("x-fake-key", "late"),
        ("x-team", "chat"),
        ("x-rebound-deadline-ms", "4000"),
    ];
    let second = send("POST", &format!("{}/fake/v1/chat/completions", rebound.url), &h, "{}").await;
    let took = sent.elapsed();
    assert_eq!(second.status, 504, "{}", second.text());
    assert_eq!(second.header("x-rebound-error"), Some("deadline_exceeded"));
    // Cut at its deadline, 4 s after it arrived (the 504 tells: with a fresh deadline for its
    // attempts it was answered 200 after 5.7 s).
    assert!(took >= Duration::from_millis(3900), "{took:?}");
    assert_eq!(
        provider.count("late"),
        1,
        "it was admitted and sent, then cut at its deadline"
    );
    assert_eq!(first.await.unwrap().status, 200);
}
