//! The shipped config/rebound.toml itself (read from disk; only the upstream URLs and the
//! listen addresses replaced, by a TOML edit) never cuts a healthy long generation, and still
//! retries a connection that really stalls. Two of these tests take 70 s and 35 s of wall time:
//! that is what they prove (the margins are 600 s against 70 s, nothing here is timing-sensitive).

use std::time::{Duration, Instant};

use crate::support::certs::test_pki;
use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::{chat_completion, sse_stream_bytes, ANTHROPIC_PING, SSE_COMMENT};
use crate::support::shipped;
use crate::support::*;
use http_body_util::BodyExt as _;

fn shipped_path() -> std::path::PathBuf {
    shipped::path()
}

/// The shipped config with both providers at `provider`, both listeners on free ports, and
/// `edits` (dotted key, new value) applied on top.
fn shipped_config(provider: &FakeProvider, edits: &[(&str, &str)]) -> rebound::Config {
    parse_shipped(&shipped_doc(provider, edits))
}

fn parse_shipped(doc: &toml_edit::DocumentMut) -> rebound::Config {
    shipped::parse(doc)
}

fn shipped_doc(provider: &FakeProvider, edits: &[(&str, &str)]) -> toml_edit::DocumentMut {
    shipped::doc(&provider.url(), edits)
}

async fn start(edits: &[(&str, &str)]) -> (FakeProvider, Rebound) {
    let provider = FakeProvider::start().await;
    let rebound = Rebound::start_config(shipped_config(&provider, edits)).await;
    (provider, rebound)
}

const OPENAI: &str = "/openai/v1/chat/completions";
const ANTHROPIC: &str = "/anthropic/v1/messages";

/// A POST to `path` on `rebound` keyed `key`, read whole within `within`.
async fn call(
    rebound: &Rebound,
    path: &str,
    key: &str,
    body: &str,
    headers: &[(&str, &str)],
    within: Duration,
) -> Answer {
    let mut h = vec![("x-fake-key", key), ("content-type", "application/json")];
    h.extend_from_slice(headers);
    send_within(within, "POST", &format!("{}{path}", rebound.url), &h, body.to_string()).await
}

/// Every retry the sidecar made, whatever the route and reason.
async fn retries(rebound: &Rebound) -> f64 {
    let page = rebound.metrics().await;
    page.lines()
        .filter(|l| l.starts_with("rebound_retries_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn anthropic_stream_is_whole(body: &str) {
    assert!(body.contains("event: message_start"), "{body}");
    assert!(
        body.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
        "{body}"
    );
}

#[tokio::test]
async fn the_shipped_timeouts_are_generous_and_tested_as_shipped() {
    let provider = FakeProvider::start().await;
    let c = shipped_config(&provider, &[]);
    for name in ["llm", "anthropic"] {
        let p = &c.retry[name];
        assert!(p.per_try_timeout >= Duration::from_secs(600), "{name}: {p:?}");
        assert!(p.first_byte_timeout >= Duration::from_secs(600), "{name}: {p:?}");
        // No stricter than the SDKs' own 600 s between bytes.
        assert!(p.stream_idle_timeout >= Duration::from_secs(600), "{name}: {p:?}");
        assert_eq!(p.deadline, Duration::from_secs(900), "{name}");
    }
    for name in ["openai", "anthropic"] {
        assert_eq!(c.upstreams[name].keepalive, Some(Duration::from_secs(15)), "{name}");
    }
    // The edit replaced only what it names.
    assert_eq!(c.upstreams["openai"].url(), provider.url());
    assert_eq!(c.upstreams["anthropic"].url(), provider.url());
    let untouched = rebound::Config::load_with_env(&shipped_path(), &|_| None).unwrap();
    assert_eq!(format!("{:?}", c.retry), format!("{:?}", untouched.retry));
    assert_eq!(format!("{:?}", c.routes), format!("{:?}", untouched.routes));
}

/// (a) A non-streamed answer whose head comes 70 s after the request: delivered whole, one call.
#[tokio::test]
async fn a_non_streamed_answer_after_70s_is_delivered_whole_with_one_call() {
    let (provider, rebound) = start(&[]).await;
    provider.script("slow-openai", vec![Step::Delay { ms: 70_000 }]);
    provider.script("slow-anthropic", vec![Step::Delay { ms: 70_000 }]);
    let started = Instant::now();
    let within = Duration::from_secs(300);
    let (o, a) = tokio::join!(
        call(&rebound, OPENAI, "slow-openai", r#"{"model":"m"}"#, &[], within),
        call(&rebound, ANTHROPIC, "slow-anthropic", r#"{"model":"m"}"#, &[], within),
    );
    assert!(started.elapsed() >= Duration::from_secs(70));
    for (answer, key) in [(&o, "slow-openai"), (&a, "slow-anthropic")] {
        assert_eq!(answer.status, 200, "{key}: {}", answer.text());
        assert_eq!(answer.header("x-rebound-attempts"), Some("1"), "{key}");
        assert_eq!(provider.count(key), 1, "{key}: one provider call");
    }
    assert_eq!(o.text(), chat_completion());
    assert_eq!(a.text(), crate::support::fake_provider::anthropic_message());
    assert_eq!(retries(&rebound).await, 0.0, "no retry at all");
}

/// (b) A stream whose head comes at once and whose first event comes 35 s later, with no byte in
/// between (a reasoning model on a provider that sends no pings): delivered whole, one call.
#[tokio::test]
async fn a_stream_whose_first_event_comes_35s_after_its_head_is_delivered_whole_with_one_call() {
    let think = Step::ThinkThenStream {
        ms: 35_000,
        ping_every_ms: 0,
    };
    both_streams_whole_with_one_call(think, "think", Duration::from_secs(35)).await;
}

/// A stream whose first event comes at once and whose next byte comes 75 s later (a
/// reasoning model thinking after `response.created`, on a provider that sends no pings): delivered
/// whole, with one provider call and no retry. Before, the shipped 60 s idle limit cut it.
#[tokio::test]
async fn a_stream_silent_75s_after_its_first_event_is_delivered_whole_with_one_call() {
    let pause = Step::PauseAfterFirst { ms: 75_000 };
    both_streams_whole_with_one_call(pause, "pause", Duration::from_secs(75)).await;
}

/// An OpenAI and an Anthropic stream through the shipped config, both scripted with `step` (keys
/// `{prefix}-openai`, `{prefix}-anthropic`): each takes at least `took` and is delivered whole,
/// with one provider call and no retry.
async fn both_streams_whole_with_one_call(step: Step, prefix: &str, took: Duration) {
    let (provider, rebound) = start(&[]).await;
    let (ko, ka) = (format!("{prefix}-openai"), format!("{prefix}-anthropic"));
    provider.script(&ko, vec![step.clone()]);
    provider.script(&ka, vec![step]);
    let started = Instant::now();
    let within = Duration::from_secs(300);
    let body = r#"{"model":"m","stream":true}"#;
    let (o, a) = tokio::join!(
        call(&rebound, OPENAI, &ko, body, &[], within),
        call(&rebound, ANTHROPIC, &ka, body, &[], within),
    );
    assert!(started.elapsed() >= took);
    for (answer, key) in [(&o, &ko), (&a, &ka)] {
        assert_eq!(answer.status, 200, "{key}: {}", answer.text());
        assert_eq!(answer.header("x-rebound-attempts"), Some("1"), "{key}");
        assert_eq!(provider.count(key), 1, "{key}: one provider call");
        assert_eq!(provider.streams_completed(key), 1, "{key}");
    }
    assert_eq!(o.text(), sse_stream_bytes(5));
    anthropic_stream_is_whole(&a.text());
    assert_eq!(retries(&rebound).await, 0.0, "no retry at all");
}

/// In paused time: a 9-minute silence after the first event is delivered whole
/// (one call), and a silence past the shipped 600 s is what `stream_idle_timeout` still cuts (a
/// visible abort, never a clean end, and no retry: the app has bytes).
///
/// Real sockets, virtual time: a blocking task held open keeps tokio from advancing the clock by
/// itself, so it moves only by `advance` (exactly 540 s, then 61 s more) while the bytes flow on
/// their own; nothing here depends on how fast the machine is.
#[tokio::test(start_paused = true)]
async fn a_nine_minute_pause_mid_stream_is_delivered_whole_and_600s_is_the_limit() {
    let (release, held) = std::sync::mpsc::channel::<()>();
    // A bound in real time, in case the test hangs: the clock then moves by itself again and
    // the timeouts below fail it.
    let hold = tokio::task::spawn_blocking(move || held.recv_timeout(std::time::Duration::from_secs(120)));
    let (provider, rebound) = start(&[]).await;
    provider.script("nine-openai", vec![Step::PauseAfterFirst { ms: 540_000 }]);
    provider.script("nine-anthropic", vec![Step::PauseAfterFirst { ms: 540_000 }]);
    provider.script("eleven", vec![Step::PauseAfterFirst { ms: 660_000 }]);
    let body = r#"{"model":"m","stream":true}"#;
    let open = |path: &'static str, key: &'static str| {
        let url = format!("{}{path}", rebound.url);
        async move {
            let h = [("x-fake-key", key), ("content-type", "application/json")];
            send_streaming_within(Duration::from_secs(30), "POST", &url, &h, body).await
        }
    };
    let mut streams = Vec::new();
    for (path, key) in [
        (OPENAI, "nine-openai"),
        (ANTHROPIC, "nine-anthropic"),
        (OPENAI, "eleven"),
    ] {
        let resp = open(path, key).await;
        assert_eq!(resp.status(), 200, "{key}");
        assert_eq!(resp.headers()["x-rebound-attempts"], "1", "{key}");
        let mut body = resp.into_body();
        // The first event, before any time passes.
        let first = body.frame().await.expect("a first frame").expect("not an error");
        assert!(!first.data_ref().expect("data").is_empty(), "{key}");
        streams.push((key, first.into_data().expect("data"), body));
    }

    // 9 minutes of silence: the provider then sends the rest.
    tokio::time::advance(Duration::from_secs(540)).await;
    let mut rest = Vec::new();
    for (key, first, mut body) in streams {
        if key == "eleven" {
            rest.push((first, body));
            continue;
        }
        let mut all = first.to_vec();
        while let Some(frame) = body.frame().await {
            let frame = frame.unwrap_or_else(|e| panic!("{key}: cut after a 9-minute pause: {e}"));
            all.extend_from_slice(frame.data_ref().expect("data"));
        }
        let all = String::from_utf8(all).unwrap();
        if key == "nine-openai" {
            assert_eq!(all, sse_stream_bytes(5));
        } else {
            anthropic_stream_is_whole(&all);
        }
        assert_eq!(provider.count(key), 1, "{key}: one provider call");
        assert_eq!(provider.streams_completed(key), 1, "{key}");
    }

    // The third is still silent at 601 s: cut by stream_idle_timeout, visibly.
    tokio::time::advance(Duration::from_secs(61)).await;
    let (_, mut body) = rest.pop().expect("the third stream");
    let mut clean_end = true;
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            clean_end = false;
            break;
        }
    }
    assert!(!clean_end, "a stream cut by the idle limit never ends cleanly");
    assert_eq!(provider.count("eleven"), 1, "never retried once bytes went out");
    assert_eq!(provider.streams_completed("eleven"), 0);
    assert_eq!(retries(&rebound).await, 0.0, "no retry at all");
    drop(release);
    let _ = hold.await;
}

/// A connection that really dies mid-stream (the provider's host hangs after the
/// first event: its kernel still acknowledges TCP, nothing else answers) is still found, by the
/// shipped `keepalive` (HTTP/2 PINGs, 15 s), not by the 600 s idle limit: the app sees the first
/// event, then a visible abort, and the provider is called once (bytes went out: no retry).
#[tokio::test]
async fn a_connection_that_dies_mid_stream_is_found_by_keepalive() {
    let pki = test_pki();
    let provider = FakeProvider::start_tls(pki.server).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    // Only the trust root for the fake provider's certificate is added.
    let mut doc = shipped_doc(&provider, &[]);
    for name in ["openai", "anthropic"] {
        doc["upstreams"][name]["ca_file"] = toml_edit::value(ca.display().to_string());
    }
    let config = parse_shipped(&doc);
    assert_eq!(config.upstreams["openai"].keepalive, Some(Duration::from_secs(15)));
    let rebound = Rebound::start_config(config).await;
    provider.script("dies", vec![Step::FreezeAfterFirst]);
    let started = Instant::now();
    let h = [("x-fake-key", "dies"), ("content-type", "application/json")];
    let resp = send_streaming_within(
        Duration::from_secs(60),
        "POST",
        &format!("{}{OPENAI}", rebound.url),
        &h,
        r#"{"model":"m","stream":true}"#,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut got = Vec::new();
    let mut clean_end = true;
    while let Some(frame) = tokio::time::timeout(Duration::from_secs(300), body.frame())
        .await
        .expect("found long before the 600 s idle limit")
    {
        match frame {
            Ok(f) => got.extend_from_slice(f.data_ref().expect("data")),
            Err(_) => {
                clean_end = false;
                break;
            }
        }
    }
    let took = started.elapsed();
    assert!(!clean_end, "a dead stream is never ended cleanly");
    assert!(
        String::from_utf8_lossy(&got).starts_with("data: "),
        "the first event arrived"
    );
    assert_eq!(provider.count("dies"), 1, "bytes went out: no retry");
    assert_eq!(provider.requests("dies")[0].version, "HTTP/2.0");
    // About twice keepalive (one interval to the PING, one for its ack), far from 600 s.
    assert!(took >= Duration::from_secs(15), "{took:?}");
    eprintln!("dead connection found {took:?} after the request");
}

/// (c) A connection that really stalls (no byte at all past the configured limit) is still
/// retried, and the retry is counted as reason="timeout": a stalled first byte and a late head.
#[tokio::test]
async fn a_real_stall_past_the_limit_is_retried_and_counted_as_a_timeout() {
    let (provider, rebound) = start(&[
        ("retry.llm.first_byte_timeout", "2s"),
        ("retry.anthropic.per_try_timeout", "2s"),
    ])
    .await;
    // OpenAI: the head, then no body byte at all.
    provider.script("stall", vec![Step::Stall]);
    // Anthropic: no head within per_try_timeout.
    provider.script("late", vec![Step::Delay { ms: 30_000 }]);
    let within = Duration::from_secs(60);
    let started = Instant::now();
    let (o, a) = tokio::join!(
        call(&rebound, OPENAI, "stall", r#"{"model":"m"}"#, &[], within),
        call(&rebound, ANTHROPIC, "late", r#"{"model":"m"}"#, &[], within),
    );
    assert!(started.elapsed() >= Duration::from_secs(2));
    eprintln!("both stalls retried and answered after {:?}", started.elapsed());
    assert_eq!(o.status, 200, "{}", o.text());
    assert_eq!(o.text(), chat_completion());
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.text(), crate::support::fake_provider::anthropic_message());
    for (answer, key) in [(&o, "stall"), (&a, "late")] {
        assert_eq!(answer.header("x-rebound-attempts"), Some("2"), "{key}");
        assert_eq!(provider.count(key), 2, "{key}");
    }
    let page = rebound.metrics().await;
    for route in ["openai", "anthropic"] {
        assert_eq!(
            metric(
                &page,
                &format!(r#"rebound_retries_total{{reason="timeout",route="{route}"}}"#)
            ),
            1.0,
            "{route}:\n{page}"
        );
        assert_eq!(
            metric(
                &page,
                &format!(r#"rebound_upstream_attempts_total{{outcome="timeout",route="{route}",upstream="{route}"}}"#)
            ),
            1.0,
            "{route}:\n{page}"
        );
    }
}

/// (d) Pings (Anthropic's `event: ping`) and SSE comments every second keep a stream alive past a
/// short first-byte and idle limit: one call. The same silence without them is cut and retried.
#[tokio::test]
async fn pings_and_comments_keep_a_thinking_stream_alive() {
    let short = [
        ("retry.llm.first_byte_timeout", "3s"),
        ("retry.llm.stream_idle_timeout", "3s"),
        ("retry.anthropic.first_byte_timeout", "3s"),
        ("retry.anthropic.stream_idle_timeout", "3s"),
    ];
    let (provider, rebound) = start(&short).await;
    let pinging = Step::ThinkThenStream {
        ms: 8_000,
        ping_every_ms: 1_000,
    };
    provider.script("comments", vec![pinging.clone()]);
    provider.script("pings", vec![pinging]);
    provider.script(
        "silent",
        vec![Step::ThinkThenStream {
            ms: 8_000,
            ping_every_ms: 0,
        }],
    );
    let within = Duration::from_secs(60);
    let body = r#"{"model":"m","stream":true}"#;
    let (o, a, silent) = tokio::join!(
        call(&rebound, OPENAI, "comments", body, &[], within),
        call(&rebound, ANTHROPIC, "pings", body, &[], within),
        call(&rebound, OPENAI, "silent", body, &[], within),
    );
    for (answer, key) in [(&o, "comments"), (&a, "pings")] {
        assert_eq!(answer.status, 200, "{key}: {}", answer.text());
        assert_eq!(answer.header("x-rebound-attempts"), Some("1"), "{key}");
        assert_eq!(provider.count(key), 1, "{key}: one provider call");
    }
    let o = o.text();
    assert!(o.starts_with(SSE_COMMENT), "{o}");
    assert!(o.ends_with(&sse_stream_bytes(5)), "{o}");
    assert!(o.matches(SSE_COMMENT).count() >= 5, "{o}");
    let a = a.text();
    assert!(a.starts_with(ANTHROPIC_PING), "{a}");
    assert!(a.matches(ANTHROPIC_PING).count() >= 5, "{a}");
    anthropic_stream_is_whole(&a);
    // Without pings the first byte misses the 3 s limit: retried (the retry answers at once).
    assert_eq!(silent.status, 200);
    assert_eq!(silent.text(), sse_stream_bytes(5));
    assert_eq!(provider.count("silent"), 2);
    let page = rebound.metrics().await;
    assert_eq!(
        metric(&page, r#"rebound_retries_total{reason="timeout",route="openai"}"#),
        1.0
    );
    assert_eq!(
        metric(&page, r#"rebound_retries_total{reason="timeout",route="anthropic"}"#),
        0.0
    );
}

/// The SDK's x-stainless-timeout / x-stainless-read-timeout, google-genai's x-server-timeout and
/// the app's x-rebound-deadline-ms still shorten the shipped 600 s / 900 s limits per request: no
/// attempt or wait past them.
#[tokio::test]
async fn sdk_and_app_timeouts_still_shorten_the_shipped_limits() {
    let (provider, rebound) = start(&[]).await;
    let cases = [
        ("stainless", ("x-stainless-timeout", "2")),
        ("read", ("x-stainless-read-timeout", "2")),
        ("server", ("x-server-timeout", "2")),
        ("deadline", ("x-rebound-deadline-ms", "2000")),
    ];
    for (key, _) in &cases {
        provider.script(key, vec![Step::Delay { ms: 20_000 }; 3]);
    }
    let within = Duration::from_secs(30);
    let started = Instant::now();
    let answers = futures_util::future::join_all(cases.iter().map(|(key, h)| {
        call(
            &rebound,
            OPENAI,
            key,
            r#"{"model":"m"}"#,
            std::slice::from_ref(h),
            within,
        )
    }))
    .await;
    // Cut at the caller's 2 s (a 504 deadline_exceeded below), not by the provider's 20 s answer.
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(2), "{took:?}");
    for ((key, _), a) in cases.iter().zip(&answers) {
        assert_eq!(a.status, 504, "{key}: {}", a.text());
        assert_eq!(a.header("x-rebound-error"), Some("deadline_exceeded"), "{key}");
        assert_eq!(provider.count(key), 1, "{key}: no retry past the caller's limit");
    }
}

/// HTTP/2 keep-alive PINGs: an upstream whose connection dies silently (its process hangs, its
/// kernel still acknowledges TCP) fails the attempt as a reset within about twice `keepalive`,
/// retried at once on a new connection, while a live connection to a model that thinks far longer
/// than `keepalive` is never cut.
#[tokio::test]
async fn http2_pings_tell_a_dead_connection_from_a_thinking_model() {
    let pki = test_pki();
    let provider = FakeProvider::start_tls(pki.server).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let rebound = TestConfig::new(&provider.url())
        .retry("p", Default::default())
        .route(|r| r.retry = some("p"))
        .upstream(|u| {
            u.keepalive = some("1s");
            u.ca_file = some(&ca.display().to_string());
        })
        .start()
        .await;
    let url = "/fake/v1/chat/completions";

    // A model that thinks for 5 s (five keepalive intervals) on a live connection: one call.
    provider.script("thinking", vec![Step::Delay { ms: 5_000 }]);
    let a = call(
        &rebound,
        url,
        "thinking",
        r#"{"model":"m"}"#,
        &[],
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.text(), chat_completion());
    assert_eq!(provider.count("thinking"), 1);
    assert_eq!(provider.requests("thinking")[0].version, "HTTP/2.0");

    // The connection goes dead mid-request: found by the unanswered PING, retried as a reset.
    provider.script("frozen", vec![Step::Freeze]);
    let started = Instant::now();
    let a = call(
        &rebound,
        url,
        "frozen",
        r#"{"model":"m"}"#,
        &[],
        Duration::from_secs(60),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.text(), chat_completion());
    assert_eq!(a.header("x-rebound-attempts"), Some("2"));
    assert_eq!(provider.count("frozen"), 2);
    // Found by the PING (a reset, counted below), not by the 600 s timeout (a "timeout").
    eprintln!("dead connection found and retried in {took:?}");
    let page = rebound.metrics().await;
    assert_eq!(
        metric(&page, r#"rebound_retries_total{reason="reset",route="fake"}"#),
        1.0,
        "{page}"
    );
    assert_eq!(
        metric(&page, r#"rebound_retries_total{reason="timeout",route="fake"}"#),
        0.0
    );
}
