//! Cut streams on a route with `continue_streams`, through real sockets: a continuation goes to
//! another target than the one that cut the stream (a stall costs its idle timeout once per
//! target); a stream that cannot be finished ends with an error event in its dialect (the
//! provider's own, else rebound's `stream_cut`), never a reset; a continued answer carries no
//! length; a continuation that restarts after a preamble is refused; and a continued route's
//! memory stays bounded whatever the chunking.

use std::time::Duration;

use bytes::Bytes;
use rebound::hooks::config::raw::RawRetry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::continuation::{anthropic_text, chat_text, events, whole, MESSAGES};
use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::{anthropic_event, anthropic_stream_start, FakeProvider, Step};
use crate::support::*;

/// A route on `primary` that falls back to `backup` and continues cut streams, with a 300 ms
/// idle timeout.
async fn two_targets(primary: &str, backup: &str) -> Rebound {
    idle_route(TestConfig::new(primary).upstream_named("backup", backup, |_| {}))
        .route(|r| r.fallback = Some(vec!["backup".into()]))
        .start()
        .await
}

/// `config`'s route continues cut streams, with a 300 ms idle timeout.
fn idle_route(config: TestConfig) -> TestConfig {
    config
        .retry(
            "idle",
            RawRetry {
                stream_idle_timeout: some("300ms"),
                ..RawRetry::default()
            },
        )
        .route(|r| {
            r.continue_streams = Some(true);
            r.retry = some("idle");
        })
}

fn headers(key: &str, chunks: &str) -> [(&'static str, String); 3] {
    [
        ("x-fake-key", key.to_string()),
        ("x-fake-chunks", chunks.to_string()),
        ("content-type", "application/json".to_string()),
    ]
}

async fn post(rebound: &Rebound, path: &str, h: &[(&'static str, String); 3], body: &str) -> Answer {
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    send("POST", &format!("{}/fake{path}", rebound.url), &h, body.to_string()).await
}

fn cut(after: usize) -> Step {
    Step::MidStreamError {
        after,
        error_type: "overloaded_error".into(),
    }
}

fn stall(after: usize) -> Step {
    Step::PauseAfter { after, ms: 60_000 }
}

fn refused(status: u16) -> Step {
    let body = r#"{"type":"error","error":{"type":"invalid_request_error","message":"no"}}"#;
    Step::Status {
        status,
        headers: Vec::new(),
        body: Some(body.into()),
    }
}

/// The last event of a stream that could not be finished: an error event (the body ended
/// cleanly after it).
fn last_error(body: &str) -> (String, serde_json::Value) {
    let (name, data) = events(body).pop().expect("an event");
    assert!(
        name == "error" || data.get("error").is_some(),
        "ends with an error event: {body}"
    );
    (name, data)
}

fn counted(page: &str, result: &str) -> f64 {
    metric(
        page,
        &format!(r#"rebound_continuations_total{{result="{result}",route="fake"}}"#),
    )
}

#[tokio::test]
async fn a_cut_stream_is_continued_on_the_fallback_not_on_the_target_that_cut_it() {
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    // The primary cuts every stream after three events.
    a.script("cuts", vec![cut(3), cut(3), cut(3), cut(3)]);
    let rebound = two_targets(&a.url(), &b.url()).await;
    let r = post(&rebound, "/v1/messages", &headers("cuts", "8"), MESSAGES).await;
    assert_eq!(r.status, 200);
    assert_eq!(anthropic_text(&r.text()), whole(8), "{}", r.text());
    assert_eq!(a.count("cuts"), 1, "the target that cut it is not asked again");
    assert_eq!(b.count("cuts"), 1, "one continuation, on the fallback");
    let page = rebound.metrics().await;
    let moved = r#"rebound_failovers_total{from="fake",reason="stream_cut",route="fake",to="backup"}"#;
    assert_eq!(metric(&page, moved), 1.0, "{page}");
    assert_eq!(counted(&page, "continued"), 1.0);
}

#[tokio::test]
async fn a_stall_costs_the_idle_timeout_once_per_target() {
    // The primary stalls: the continuation goes to the fallback, which finishes the answer.
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    a.script("stall", vec![stall(3), stall(3), stall(3)]);
    let rebound = two_targets(&a.url(), &b.url()).await;
    let body = r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"count"}]}"#;
    let r = post(&rebound, "/v1/chat/completions", &headers("stall", "6"), body).await;
    assert_eq!(r.status, 200);
    assert_eq!(chat_text(&r.text()), whole(6), "{}", r.text());
    assert_eq!((a.count("stall"), b.count("stall")), (1, 1));

    // Both stall: each is waited for once, and the app reads why its answer stopped.
    b.script("both", vec![stall(3), stall(3), stall(3)]);
    a.script("both", vec![stall(3), stall(3), stall(3)]);
    let r = post(&rebound, "/v1/chat/completions", &headers("both", "6"), body).await;
    assert_eq!(r.status, 200);
    let (_, error) = last_error(&r.text());
    assert_eq!(error["error"]["code"], "stream_cut", "{}", r.text());
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("stream_idle_timeout"), "names the cause: {message}");
    assert_eq!(
        (a.count("both"), b.count("both")),
        (1, 1),
        "one idle timeout per target"
    );
}

#[tokio::test]
async fn a_routes_only_target_that_stalls_is_asked_once_more() {
    let provider = FakeProvider::start().await;
    provider.script("one", vec![stall(3), stall(3), stall(3), stall(3)]);
    let rebound = idle_route(TestConfig::new(&provider.url())).start().await;
    let r = post(&rebound, "/v1/messages", &headers("one", "8"), MESSAGES).await;
    assert_eq!(r.status, 200);
    let (name, error) = last_error(&r.text());
    assert_eq!(name, "error");
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "stream_cut", "{}", r.text());
    assert_eq!(provider.count("one"), 2, "the stall, and once more");
    assert_eq!(counted(&rebound.metrics().await, "failed"), 1.0);
}

#[tokio::test]
async fn a_fallback_that_refuses_a_prefill_is_asked_with_a_turn() {
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    a.script("turn", vec![cut(3)]);
    let refusal = r#"{"type":"error","error":{"type":"invalid_request_error","message":"This model does not support assistant message prefill. The conversation must end with a user message."}}"#;
    b.script(
        "turn",
        vec![Step::Status {
            status: 400,
            headers: Vec::new(),
            body: Some(refusal.into()),
        }],
    );
    let rebound = two_targets(&a.url(), &b.url()).await;
    let r = post(&rebound, "/v1/messages", &headers("turn", "8"), MESSAGES).await;
    assert_eq!(r.status, 200);
    assert_eq!(anthropic_text(&r.text()), whole(8), "{}", r.text());
    assert_eq!(a.count("turn"), 1);
    let sent = b.requests("turn");
    assert_eq!(sent.len(), 2, "the refused prefill, the turn");
    let turn: serde_json::Value = serde_json::from_slice(&sent[1].body).unwrap();
    let last = turn["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "user", "{turn}");
}

#[tokio::test]
async fn a_continuation_that_fails_ends_the_stream_with_the_providers_error_event() {
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    a.script("own", vec![cut(3)]);
    b.script("own", vec![refused(400)]);
    let rebound = two_targets(&a.url(), &b.url()).await;
    let resp = send_streaming(
        "POST",
        &format!("{}/fake/v1/messages", rebound.url),
        &[
            ("x-fake-key", "own"),
            ("x-fake-chunks", "8"),
            ("content-type", "application/json"),
        ],
        MESSAGES,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body(), b"", Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&read.bytes).to_string();
    assert!(read.clean, "never a bare reset: {text}");
    let (name, error) = last_error(&text);
    assert_eq!(name, "error");
    assert_eq!(error["error"]["type"], "overloaded_error", "as it came: {text}");
    assert_eq!(text.matches("event: error").count(), 1, "{text}");
    assert!(text.starts_with("event: message_start"), "{text}");
    assert_eq!(counted(&rebound.metrics().await, "failed"), 1.0);
}

#[tokio::test]
async fn a_reset_that_cannot_be_finished_ends_with_a_stream_cut_event_in_each_dialect() {
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let anthropic: Vec<String> = std::iter::once(anthropic_stream_start().to_string())
        .chain((0..3).map(anthropic_event))
        .collect();
    a.script("reset", vec![Step::EventsThenCut { events: anthropic }]);
    b.script("reset", vec![refused(400)]);
    let rebound = two_targets(&a.url(), &b.url()).await;
    let r = post(&rebound, "/v1/messages", &headers("reset", "8"), MESSAGES).await;
    let (name, error) = last_error(&r.text());
    assert_eq!(name, "error");
    assert_eq!(error["error"]["type"], "stream_cut", "{}", r.text());
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("answered 400"),
        "names why it was not finished: {message}"
    );

    let chat: Vec<String> = (0..3)
        .map(|i| format!("data: {{\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-fake\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"token{i} \"}},\"finish_reason\":null}}]}}\n\n"))
        .collect();
    a.script("chat", vec![Step::EventsThenCut { events: chat }]);
    b.script("chat", vec![refused(400)]);
    let body = r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"count"}]}"#;
    let r = post(&rebound, "/v1/chat/completions", &headers("chat", "8"), body).await;
    let (name, error) = last_error(&r.text());
    assert_eq!(name, "", "a chat error is a data line: {}", r.text());
    assert_eq!(error["error"]["code"], "stream_cut");
    assert_eq!(chat_text(&r.text()), whole(3), "what the app had stays");
}

#[tokio::test]
async fn a_continuation_that_restarts_after_a_preamble_is_refused() {
    let provider = FakeProvider::start().await;
    let preamble = "Sure! Here is the rest: token0 token1 token2 token3 token4 token5 token6 token7 ";
    let restart = || Step::AnthropicText { text: preamble.into() };
    provider.script("preamble", vec![cut(3), restart(), restart(), restart()]);
    let rebound = TestConfig::new(&provider.url())
        .route(|r| r.continue_streams = Some(true))
        .start()
        .await;
    let r = post(&rebound, "/v1/messages", &headers("preamble", "8"), MESSAGES).await;
    assert_eq!(r.status, 200);
    assert!(!r.text().contains("Sure!"), "never spliced: {}", r.text());
    let (_, error) = last_error(&r.text());
    assert_eq!(error["error"]["type"], "overloaded_error", "the cut stays visible");
    assert_eq!(provider.count("preamble"), 4, "the cut, three continuations refused");
    assert_eq!(counted(&rebound.metrics().await, "failed"), 1.0);
}

/// A provider on a raw socket: each connection's request is read, then `answer` is written as
/// it is (head and body), and the connection closed.
async fn raw_provider(answer: Vec<Bytes>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                // The head, then as much body as it says.
                let body_at = loop {
                    let Ok(n) = conn.read(&mut buf).await else { return };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    if let Some(at) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                };
                let head = String::from_utf8_lossy(&seen[..body_at]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while seen.len() < body_at + length {
                    let Ok(n) = conn.read(&mut buf).await else { return };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                }
                for part in answer {
                    if conn.write_all(&part).await.is_err() {
                        return;
                    }
                }
                let _ = conn.shutdown().await;
            });
        }
    });
    url
}

#[tokio::test]
async fn a_continued_answer_carries_no_length() {
    // The primary says a length, and closes before it.
    let partial: String = std::iter::once(anthropic_stream_start().to_string())
        .chain((0..3).map(anthropic_event))
        .collect();
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n",
        partial.len() + 4096
    );
    let primary = raw_provider(vec![Bytes::from(head), Bytes::from(partial)]).await;
    let backup = FakeProvider::start().await;
    let rebound = two_targets(&primary, &backup.url()).await;
    let r = post(&rebound, "/v1/messages", &headers("length", "8"), MESSAGES).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), None, "a continued answer has no length");
    assert_eq!(anthropic_text(&r.text()), whole(8), "{}", r.text());
    assert_eq!(backup.count("length"), 1);
}

/// The peak resident memory of a process, in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[tokio::test]
async fn a_continued_route_streams_megabyte_chunks_in_bounded_memory() {
    use crate::support::shipped;
    use crate::support::sidecar::ReboundProcess;

    // 48 chunks of 1 MiB of whole events (about 1 KiB of text each), then the end.
    let text = "x".repeat(1000);
    let event = format!(
        "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{text}\"}}}}\n\n"
    );
    let per_chunk = (1 << 20) / event.len();
    let chunk = Bytes::from(event.repeat(per_chunk));
    let end = crate::support::fake_provider::anthropic_stream_end(48 * per_chunk);
    let mut body = vec![Bytes::from(anthropic_stream_start())];
    body.extend(std::iter::repeat_n(chunk.clone(), 48));
    body.push(Bytes::from(end));
    let length: usize = body.iter().map(Bytes::len).sum();
    let head = format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {length}\r\n\r\n");
    let mut answer = vec![Bytes::from(head)];
    answer.extend(body);
    let provider = raw_provider(answer).await;

    let mut doc = shipped::doc(&provider, &[]);
    doc["routes"][1]["continue_streams"] = toml_edit::value(true);
    let rebound = ReboundProcess::start(&doc.to_string(), &[]).await;
    let before = peak_rss(rebound.child.id().unwrap());
    let resp = send_streaming_within(
        Duration::from_secs(120),
        "POST",
        &format!("{}/anthropic/v1/messages", rebound.proxy),
        &[("content-type", "application/json"), ("x-api-key", "sk-ant-test")],
        MESSAGES,
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-rebound-continuable"], "true");
    let read = read_body(resp.into_body(), b"", Duration::from_secs(30)).await;
    assert!(read.clean);
    assert_eq!(read.bytes.len(), length, "every byte, as it came");
    let grown = peak_rss(rebound.child.id().unwrap()).saturating_sub(before);
    // A 48 MiB stream: at most a few chunks held at once (the framer, the events queued, the
    // client's and the server's buffers), never the stream.
    assert!(grown < 24 << 20, "peak RSS grew {} MiB", grown >> 20);
}

/// The replica that owns a live generation dies mid-stream: its followers on two other replicas,
/// and a retry with the same key, read one continuation. The provider is called twice in all:
/// the original, and the one continuation of its cut.
#[tokio::test]
async fn a_dead_owners_followers_on_two_replicas_read_one_continuation() {
    use crate::support::redis::RedisServer;
    use crate::support::shipped;
    use crate::support::sidecar::ReboundProcess;
    use http_body_util::BodyExt as _;

    let redis = RedisServer::start();
    let provider = FakeProvider::start().await;
    let mut doc = shipped::doc(&provider.url(), &[]);
    doc["routes"][0]["continue_streams"] = toml_edit::value(true);
    doc["redis"]["url"] = toml_edit::value(redis.url());
    let toml = doc.to_string();
    let mut a = ReboundProcess::start(&toml, &[]).await;
    let b = ReboundProcess::start(&toml, &[]).await;
    let c = ReboundProcess::start(&toml, &[]).await;
    // The others take A for dead only once their own heartbeats have landed for a liveness.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let key = "one-continuation-for-all";
    let call = |base: String| async move {
        send_streaming_within(
            Duration::from_secs(60),
            "POST",
            &format!("{base}/openai/v1/chat/completions"),
            &[
                ("x-fake-key", key),
                ("idempotency-key", key),
                ("x-fake-chunks", "30"),
                ("x-fake-gap-ms", "100"),
                ("content-type", "application/json"),
                ("authorization", "Bearer sk-test"),
            ],
            r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"count"}]}"#,
        )
        .await
    };
    let original = call(a.proxy.clone()).await;
    assert_eq!(original.status(), 200);
    let mut original = original.into_body();
    let _ = original.frame().await;
    let mut readers = Vec::new();
    for (name, replica) in [("follower on B", &b), ("follower on C", &c)] {
        let resp = call(replica.proxy.clone()).await;
        assert_eq!(resp.headers()["idempotent-replayed"], "true", "{name}");
        readers.push((
            name,
            tokio::spawn(read_body(resp.into_body(), b"", Duration::from_secs(30))),
        ));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.child.start_kill().unwrap();
    let _ = a.child.wait().await;
    drop(original);
    // The app's retry, half a second after the death.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let retry = call(b.proxy.clone()).await;
    assert_eq!(retry.status(), 200);
    readers.push((
        "retry on B",
        tokio::spawn(read_body(retry.into_body(), b"", Duration::from_secs(30))),
    ));
    for (name, read) in readers {
        let read = read.await.unwrap();
        let body = String::from_utf8_lossy(&read.bytes).to_string();
        assert!(read.clean, "{name}: a whole answer: {body}");
        assert_eq!(chat_text(&body), whole(30), "{name}: {body}");
        assert_eq!(body.matches("[DONE]").count(), 1, "{name}: {body}");
    }
    assert_eq!(provider.count(key), 2, "the original and one continuation");
    let continued = r#"rebound_continuations_total{result="continued",route="openai"}"#;
    let (on_b, on_c) = (
        metric(&get(&format!("{}/metrics", b.admin)).await.text(), continued),
        metric(&get(&format!("{}/metrics", c.admin)).await.text(), continued),
    );
    assert_eq!(on_b + on_c, 1.0, "one continuation, on B or C");
}
