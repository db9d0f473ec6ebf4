//! Mid-stream continuation (`continue_streams`) through real sockets: a stream the fake provider
//! cuts after some events (an error event mid-stream, a reset) is finished by another attempt
//! and reaches the app as one valid stream whose text is the whole answer; what is not continued
//! stays a visible cut.

use std::time::Duration;

use rebound::hooks::config::raw::{RawIdempotency, RawRetry};

use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::{FakeProvider, Step};
use crate::support::*;

/// A route that continues cut streams.
async fn rebound(provider: &FakeProvider) -> Rebound {
    TestConfig::new(&provider.url())
        .route(|r| r.continue_streams = Some(true))
        .start()
        .await
}

/// One SSE event as an SDK reads it: its name and its JSON data.
pub(crate) fn events(body: &str) -> Vec<(String, serde_json::Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .filter_map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event:")).unwrap_or("").trim();
            let data: String = e
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .collect::<Vec<_>>()
                .join("\n");
            let data = data.trim();
            if data.is_empty() {
                return None; // a comment
            }
            let json = serde_json::from_str(data).unwrap_or(serde_json::Value::String(data.to_string()));
            Some((name.to_string(), json))
        })
        .collect()
}

/// A streamed Messages request.
pub(crate) const MESSAGES: &str =
    r#"{"model":"claude-sonnet-4-5","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"count"}]}"#;

/// The whole answer of a fake stream of `chunks` deltas.
pub(crate) fn whole(chunks: usize) -> String {
    (0..chunks).map(|i| format!("token{i} ")).collect()
}

/// Checks an Anthropic stream as the SDK reads it: one message, block 0, one end; its text.
pub(crate) fn anthropic_text(body: &str) -> String {
    let events = events(body);
    let count = |t: &str| events.iter().filter(|(_, d)| d["type"] == t).count();
    assert_eq!(count("message_start"), 1, "{body}");
    assert_eq!(count("message_stop"), 1, "{body}");
    assert_eq!(count("message_delta"), 1, "{body}");
    assert_eq!(count("error"), 0, "{body}");
    assert_eq!(count("content_block_start"), count("content_block_stop"), "{body}");
    events
        .iter()
        .filter(|(_, d)| d["type"] == "content_block_delta")
        .map(|(_, d)| {
            assert_eq!(d["index"], 0, "{body}");
            d["delta"]["text"].as_str().unwrap_or("").to_string()
        })
        .collect()
}

/// The text of a chat stream's deltas.
pub(crate) fn chat_text(body: &str) -> String {
    events(body)
        .iter()
        .filter_map(|(_, d)| d["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect()
}

/// Reads a stream that could not be finished (`why`): it ends with an error event in its
/// dialect (never a bare reset, never a clean end without one), and the cut is counted under
/// `result`. Its bytes, as text.
async fn visible_cut(
    rebound: &Rebound,
    resp: http::Response<hyper::body::Incoming>,
    (result, why): (&str, &str),
) -> String {
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body(), b"", Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&read.bytes).to_string();
    assert!(read.clean, "the stream ends, with an error event ({why}): {text}");
    let (name, last) = events(&text).pop().expect("an event");
    assert!(
        name == "error" || last.get("error").is_some(),
        "the last event is an error ({why}): {text}"
    );
    let series = format!(r#"rebound_continuations_total{{result="{result}",route="fake"}}"#);
    until_metric(rebound, &series, |n| n == 1.0).await;
    text
}

fn continued(page: &str, result: &str) -> f64 {
    metric(
        page,
        &format!(r#"rebound_continuations_total{{result="{result}",route="fake"}}"#),
    )
}

#[tokio::test]
async fn an_anthropic_stream_cut_by_an_error_event_is_finished_by_a_prefill() {
    let provider = FakeProvider::start().await;
    let error = "overloaded_error".to_string();
    provider.script(
        "cut",
        vec![Step::MidStreamError {
            after: 3,
            error_type: error,
        }],
    );
    let rebound = rebound(&provider).await;
    let h = [
        ("x-fake-key", "cut"),
        ("x-fake-chunks", "8"),
        ("content-type", "application/json"),
    ];
    let body = MESSAGES;
    let a = send("POST", &format!("{}/fake/v1/messages", rebound.url), &h, body).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("x-rebound-continuable"), Some("true"));
    assert_eq!(anthropic_text(&a.text()), whole(8), "one answer, whole: {}", a.text());
    // The continuation carried the partial answer as the start of the assistant's.
    let sent = provider.requests("cut");
    assert_eq!(sent.len(), 2);
    let second: serde_json::Value = serde_json::from_slice(&sent[1].body).unwrap();
    let last = &second["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "assistant", "{second}");
    assert_eq!(last["content"], "token0 token1 token2", "{second}");
    let page = rebound.metrics().await;
    assert_eq!(continued(&page, "continued"), 1.0);
    // The tokens of both attempts: the cut one wasted (its input, as its first event said), the
    // continuation delivered (its input and its output).
    let tokens = |outcome: &str, kind: &str| {
        let series = format!(
            r#"rebound_tokens_total{{kind="{kind}",model="other",outcome="{outcome}",route="fake",upstream="fake"}}"#
        );
        metric(&page, &series)
    };
    assert_eq!(tokens("wasted", "input"), 12.0);
    assert_eq!(tokens("delivered", "input"), 12.0);
    assert_eq!(tokens("delivered", "output"), 8.0);
}

#[tokio::test]
async fn a_chat_stream_cut_by_a_reset_is_finished_by_a_continuation_turn() {
    let provider = FakeProvider::start().await;
    provider.script("reset", vec![Step::CutAfterFirstChunk]);
    let rebound = rebound(&provider).await;
    let h = [
        ("x-fake-key", "reset"),
        ("x-fake-chunks", "6"),
        ("content-type", "application/json"),
    ];
    let body = r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"count"}]}"#;
    let a = send("POST", &format!("{}/fake/v1/chat/completions", rebound.url), &h, body).await;
    assert_eq!(a.status, 200);
    let events = events(&a.text());
    let done = events.iter().filter(|(_, d)| d == &serde_json::json!("[DONE]")).count();
    assert_eq!(done, 1, "{}", a.text());
    let chunks: Vec<&serde_json::Value> = events.iter().map(|(_, d)| d).filter(|d| d.is_object()).collect();
    assert!(
        chunks.iter().all(|c| c["id"] == chunks[0]["id"]),
        "one id: {}",
        a.text()
    );
    assert_eq!(chat_text(&a.text()), whole(6), "{}", a.text());
    let finishes = chunks
        .iter()
        .filter(|c| c["choices"][0]["finish_reason"].is_string())
        .count();
    assert_eq!(finishes, 1, "{}", a.text());
    // A turn: the partial as the assistant's, then a user message asking to go on.
    let sent = provider.requests("reset");
    let second: serde_json::Value = serde_json::from_slice(&sent[1].body).unwrap();
    let messages = second["messages"].as_array().unwrap();
    assert_eq!(messages[messages.len() - 2]["role"], "assistant", "{second}");
    assert_eq!(messages[messages.len() - 1]["role"], "user", "{second}");
}

#[tokio::test]
async fn a_target_that_refuses_a_prefill_is_asked_again_with_a_turn() {
    let provider = FakeProvider::start().await;
    let refusal = r#"{"type":"error","error":{"type":"invalid_request_error","message":"This model does not support assistant message prefill. The conversation must end with a user message."}}"#;
    provider.script(
        "noprefill",
        vec![
            Step::MidStreamError {
                after: 2,
                error_type: "overloaded_error".into(),
            },
            Step::Status {
                status: 400,
                headers: Vec::new(),
                body: Some(refusal.into()),
            },
        ],
    );
    let rebound = rebound(&provider).await;
    let h = [
        ("x-fake-key", "noprefill"),
        ("x-fake-chunks", "5"),
        ("content-type", "application/json"),
    ];
    let body = MESSAGES;
    let a = send("POST", &format!("{}/fake/v1/messages", rebound.url), &h, body).await;
    assert_eq!(a.status, 200);
    assert_eq!(anthropic_text(&a.text()), whole(5), "{}", a.text());
    assert_eq!(provider.count("noprefill"), 3, "the cut, the refused prefill, the turn");
    let page = rebound.metrics().await;
    assert_eq!(continued(&page, "continued"), 1.0);
    assert_eq!(
        continued(&page, "failed"),
        0.0,
        "the refused prefill is not the failure"
    );
}

#[tokio::test]
async fn a_continuation_that_starts_over_is_not_spliced_and_the_cut_stays_visible() {
    let provider = FakeProvider::start().await;
    let error = "overloaded_error".to_string();
    // Every continuation starts the answer over, and then says something else: never spliced.
    let over = "token0 token1 token2 token3 token4 token5 but this time it goes another way ";
    let mut script = vec![Step::MidStreamError {
        after: 12,
        error_type: error,
    }];
    script.extend(std::iter::repeat_n(Step::AnthropicText { text: over.into() }, 5));
    provider.script("over", script);
    let rebound = rebound(&provider).await;
    let h = [
        ("x-fake-key", "over"),
        ("x-fake-chunks", "20"),
        ("content-type", "application/json"),
    ];
    let body = MESSAGES;
    let resp = send_streaming("POST", &format!("{}/fake/v1/messages", rebound.url), &h, body).await;
    let text = visible_cut(&rebound, resp, ("failed", "the continuations disagree")).await;
    assert!(!text.contains("another way"), "never spliced: {text}");
    assert_eq!(text.matches("event: message_start").count(), 1, "{text}");
}

#[tokio::test]
async fn a_stream_that_stalls_past_the_idle_timeout_is_finished_elsewhere() {
    let provider = FakeProvider::start().await;
    provider.script("stall", vec![Step::StallAfterFirstChunk]);
    let rebound = TestConfig::new(&provider.url())
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
        .start()
        .await;
    let h = [
        ("x-fake-key", "stall"),
        ("x-fake-chunks", "4"),
        ("content-type", "application/json"),
    ];
    let body = r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"count"}]}"#;
    let a = send("POST", &format!("{}/fake/v1/chat/completions", rebound.url), &h, body).await;
    assert_eq!(a.status, 200);
    assert_eq!(chat_text(&a.text()), whole(4), "{}", a.text());
    assert_eq!(provider.count("stall"), 2);
}

#[tokio::test]
async fn a_stream_cut_inside_a_tool_calls_arguments_is_not_continued() {
    let provider = FakeProvider::start().await;
    let start = crate::support::fake_provider::anthropic_stream_start().to_string();
    let events = vec![
        start,
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Let me look. \"}}\n\n".to_string(),
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n".to_string(),
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"weather\",\"input\":{}}}\n\n".to_string(),
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \\\"Par\"}}\n\n".to_string(),
    ];
    provider.script("tool", vec![Step::EventsThenCut { events }]);
    let rebound = rebound(&provider).await;
    let h = [("x-fake-key", "tool"), ("content-type", "application/json")];
    let body = r#"{"model":"claude-sonnet-4-5","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"weather?"}]}"#;
    let resp = send_streaming("POST", &format!("{}/fake/v1/messages", rebound.url), &h, body).await;
    let why = "the tool call's JSON is never repaired";
    let text = visible_cut(&rebound, resp, ("refused_tool_call", why)).await;
    assert!(text.contains("Par"));
    assert_eq!(provider.count("tool"), 1, "no continuation was asked for");
}

#[tokio::test]
async fn with_an_idempotency_key_the_stored_answer_is_the_continued_whole() {
    let provider = FakeProvider::start().await;
    let error = "overloaded_error".to_string();
    provider.script(
        "idem",
        vec![Step::MidStreamError {
            after: 3,
            error_type: error,
        }],
    );
    let rebound = TestConfig::new(&provider.url())
        .idempotency(
            "keys",
            RawIdempotency {
                wait_timeout: some("5s"),
                ..RawIdempotency::default()
            },
        )
        .route(|r| {
            r.continue_streams = Some(true);
            r.idempotency = some("keys");
        })
        .start()
        .await;
    let h = [
        ("x-fake-key", "idem"),
        ("x-fake-chunks", "8"),
        ("content-type", "application/json"),
        ("idempotency-key", "cont-1"),
    ];
    let body = MESSAGES;
    let url = format!("{}/fake/v1/messages", rebound.url);
    let first = send("POST", &url, &h, body).await;
    assert_eq!(anthropic_text(&first.text()), whole(8));
    let replay = until("the answer stored", Duration::from_secs(10), || async {
        let a = send("POST", &url, &h, body).await;
        match a.header("idempotent-replayed") {
            Some("true") => Ok(a),
            other => Err(format!("not replayed yet: {other:?}")),
        }
    })
    .await;
    assert_eq!(
        anthropic_text(&replay.text()),
        whole(8),
        "the continued whole: {}",
        replay.text()
    );
    assert_eq!(provider.count("idem"), 2, "the cut and its continuation, never a third");
}

#[tokio::test]
async fn a_responses_background_stream_is_resumed_after_its_last_event() {
    let provider = FakeProvider::start().await;
    // The response's first seven events (created, in progress, its item and part added, three
    // deltas), then a reset.
    let first = crate::support::fake_hosts::responses_events(8, true)
        .into_iter()
        .take(7)
        .collect();
    provider.script("bg", vec![Step::EventsThenCut { events: first }]);
    let rebound = rebound(&provider).await;
    let h = [
        ("x-fake-key", "bg"),
        ("x-fake-chunks", "8"),
        ("content-type", "application/json"),
    ];
    let body = r#"{"model":"gpt-4o","stream":true,"background":true,"input":"count"}"#;
    let a = send("POST", &format!("{}/fake/v1/responses", rebound.url), &h, body).await;
    assert_eq!(a.status, 200);
    let events = events(&a.text());
    let text: String = events
        .iter()
        .filter(|(_, d)| d["type"] == "response.output_text.delta")
        .filter_map(|(_, d)| d["delta"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, whole(8), "{}", a.text());
    let seqs: Vec<u64> = events
        .iter()
        .filter_map(|(_, d)| d["sequence_number"].as_u64())
        .collect();
    let all = crate::support::fake_hosts::responses_events(8, true).len() as u64;
    assert_eq!(
        seqs,
        (0..all).collect::<Vec<u64>>(),
        "each event once, in order: {}",
        a.text()
    );
    let completed: Vec<_> = events
        .iter()
        .filter(|(_, d)| d["type"] == "response.completed")
        .collect();
    assert_eq!(completed.len(), 1);
    // The same generation read again, not a second one.
    let sent = provider.requests("bg");
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1].method, "GET");
    assert_eq!(sent[1].path, "/v1/responses/resp_fake");
    assert_eq!(sent[1].query.as_deref(), Some("stream=true&starting_after=6"));
}

#[tokio::test]
async fn a_cut_stream_is_finished_on_the_next_target_when_its_own_is_overloaded() {
    let (a, b) = (FakeProvider::start().await, FakeProvider::start().await);
    let error = "overloaded_error".to_string();
    // The first target cuts the stream, then answers 529 to the continuation.
    a.script(
        "next",
        vec![
            Step::MidStreamError {
                after: 3,
                error_type: error,
            },
            Step::status(529),
        ],
    );
    let rebound = TestConfig::new(&a.url())
        .upstream_named("backup", &b.url(), |_| {})
        .route(|r| {
            r.fallback = Some(vec!["backup".into()]);
            r.continue_streams = Some(true);
        })
        .start()
        .await;
    let h = [
        ("x-fake-key", "next"),
        ("x-fake-chunks", "8"),
        ("content-type", "application/json"),
    ];
    let body = MESSAGES;
    let r = send("POST", &format!("{}/fake/v1/messages", rebound.url), &h, body).await;
    assert_eq!(r.status, 200);
    assert_eq!(anthropic_text(&r.text()), whole(8), "{}", r.text());
    assert_eq!(a.count("next"), 1, "the cut only: its continuation goes elsewhere");
    assert_eq!(b.count("next"), 1, "finished on the next target");
    let page = rebound.metrics().await;
    let moved = r#"rebound_failovers_total{from="fake",reason="stream_cut",route="fake",to="backup"}"#;
    assert_eq!(metric(&page, moved), 1.0, "{page}");
    let on_b: serde_json::Value = serde_json::from_slice(&b.requests("next")[0].body).unwrap();
    assert_eq!(
        on_b["messages"].as_array().unwrap().last().unwrap()["role"],
        "assistant"
    );
}

/// A replica that owns a live generation dies: its follower on another replica is continued
/// there from what it received, and ends with the whole answer instead of an abort; so does a
/// duplicate that comes just after the death and joins the dead stream.
#[tokio::test]
async fn a_dead_owners_followers_are_continued_on_their_replica() {
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
    // B takes A for dead only once its own heartbeats have landed for a whole liveness.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let key = "owner-dies-continued";
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
    let follower = call(b.proxy.clone()).await;
    assert_eq!(follower.headers()["idempotent-replayed"], "true", "a follower");
    let follower = tokio::spawn(read_body(follower.into_body(), b"", Duration::from_secs(30)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.child.start_kill().unwrap();
    let _ = a.child.wait().await;
    drop(original);
    // A duplicate 0.3 s after the death joins the dead stream on B.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let late = call(b.proxy.clone()).await;
    assert_eq!(late.status(), 200);
    let late = tokio::spawn(read_body(late.into_body(), b"", Duration::from_secs(30)));
    for (name, read) in [("follower", follower), ("duplicate", late)] {
        let read = read.await.unwrap();
        let body = String::from_utf8_lossy(&read.bytes).to_string();
        assert!(read.clean, "{name}: a whole answer, not an abort: {body}");
        assert_eq!(chat_text(&body), whole(30), "{name}: {body}");
        assert_eq!(body.matches("[DONE]").count(), 1, "{name}: {body}");
    }
}

#[tokio::test]
async fn what_a_continuation_repeats_of_the_partial_answer_is_dropped_at_the_seam() {
    let provider = FakeProvider::start().await;
    let error = "overloaded_error".to_string();
    // The app has token0 to token4; the continuation says the last three words again (21
    // characters: a repeat, not a chance match) before going on.
    let again = "token2 token3 token4 token5 ";
    provider.script(
        "seam",
        vec![
            Step::MidStreamError {
                after: 5,
                error_type: error,
            },
            Step::AnthropicText { text: again.into() },
        ],
    );
    let rebound = rebound(&provider).await;
    let h = [
        ("x-fake-key", "seam"),
        ("x-fake-chunks", "6"),
        ("content-type", "application/json"),
    ];
    let body = MESSAGES;
    let a = send("POST", &format!("{}/fake/v1/messages", rebound.url), &h, body).await;
    assert_eq!(a.status, 200);
    assert_eq!(anthropic_text(&a.text()), whole(6), "no word twice: {}", a.text());
}

#[tokio::test]
async fn a_stream_cut_inside_a_thinking_block_is_not_continued() {
    let provider = FakeProvider::start().await;
    let start = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_t","type":"message","role":"assistant","model":"claude-fake","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}}

"#;
    let thinking = r#"event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"First, the user wants"}}

"#;
    let events = vec![start.to_string(), thinking.to_string()];
    provider.script("think", vec![Step::EventsThenCut { events }]);
    let rebound = rebound(&provider).await;
    let h = [("x-fake-key", "think"), ("content-type", "application/json")];
    let body = r#"{"model":"claude-sonnet-4-5","max_tokens":2000,"stream":true,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"why?"}]}"#;
    let resp = send_streaming("POST", &format!("{}/fake/v1/messages", rebound.url), &h, body).await;
    visible_cut(&rebound, resp, ("refused_thinking", "inside a thinking block")).await;
    assert_eq!(provider.count("think"), 1, "no continuation was asked for");
}

#[tokio::test]
async fn a_responses_stream_is_finished_by_a_continuation_turn() {
    let provider = FakeProvider::start().await;
    // Its first seven events (three deltas), then a reset.
    let first = crate::support::fake_hosts::responses_events(8, false)
        .into_iter()
        .take(7)
        .collect();
    provider.script("resp", vec![Step::EventsThenCut { events: first }]);
    let rebound = rebound(&provider).await;
    let h = [
        ("x-fake-key", "resp"),
        ("x-fake-chunks", "8"),
        ("content-type", "application/json"),
    ];
    let body = r#"{"model":"gpt-4o","stream":true,"input":"count"}"#;
    let a = send("POST", &format!("{}/fake/v1/responses", rebound.url), &h, body).await;
    assert_eq!(a.status, 200);
    let events = events(&a.text());
    let text: String = events
        .iter()
        .filter(|(_, d)| d["type"] == "response.output_text.delta")
        .filter_map(|(_, d)| d["delta"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, whole(8), "{}", a.text());
    let created = events.iter().filter(|(_, d)| d["type"] == "response.created").count();
    let completed: Vec<_> = events
        .iter()
        .filter(|(_, d)| d["type"] == "response.completed")
        .collect();
    assert_eq!((created, completed.len()), (1, 1), "{}", a.text());
    assert_eq!(completed[0].1["response"]["id"], "resp_fake");
    let whole_output = completed[0].1["response"]["output"][0]["content"][0]["text"].clone();
    assert_eq!(
        whole_output,
        whole(8),
        "the completed response carries the whole answer"
    );
    let seqs: Vec<u64> = events
        .iter()
        .filter_map(|(_, d)| d["sequence_number"].as_u64())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "sequence numbers run on: {seqs:?}"
    );
    let sent = provider.requests("resp");
    let second: serde_json::Value = serde_json::from_slice(&sent[1].body).unwrap();
    assert!(second["input"].is_array(), "a turn: {second}");
}

#[tokio::test]
async fn an_error_event_in_a_stream_that_is_not_continued_reaches_the_app_as_it_came() {
    let provider = FakeProvider::start().await;
    let start = crate::support::fake_provider::anthropic_stream_start().to_string();
    let tool = r#"event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"weather","input":{}}}

"#;
    let error = crate::support::fake_provider::error_event("overloaded_error", true);
    provider.script(
        "toolerr",
        vec![Step::EventsThenCut {
            events: vec![start, tool.to_string(), error],
        }],
    );
    let rebound = rebound(&provider).await;
    let h = [("x-fake-key", "toolerr"), ("content-type", "application/json")];
    let resp = send_streaming("POST", &format!("{}/fake/v1/messages", rebound.url), &h, MESSAGES).await;
    assert_eq!(resp.status(), 200);
    let read = read_body(resp.into_body(), b"", Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&read.bytes).to_string();
    // The SDK raises the provider's own error, as without continue_streams.
    assert!(
        text.ends_with(&crate::support::fake_provider::error_event("overloaded_error", true)),
        "{text}"
    );
    assert_eq!(provider.count("toolerr"), 1);
    let series = r#"rebound_continuations_total{result="refused_tool_call",route="fake"}"#;
    until_metric(&rebound, series, |n| n == 1.0).await;
}

/// Two replicas on one Redis, a `continue_streams` route with idempotency (the shipped config).
async fn two_replicas(
    provider: &FakeProvider,
    redis: &crate::support::redis::RedisServer,
) -> [crate::support::sidecar::ReboundProcess; 2] {
    use crate::support::sidecar::ReboundProcess;
    let mut doc = crate::support::shipped::doc(&provider.url(), &[]);
    doc["routes"][0]["continue_streams"] = toml_edit::value(true);
    doc["redis"]["url"] = toml_edit::value(redis.url());
    let toml = doc.to_string();
    [
        ReboundProcess::start(&toml, &[]).await,
        ReboundProcess::start(&toml, &[]).await,
    ]
}

/// `key`'s stream (5 events 300 ms apart) sent to both replicas at once, read to its end.
async fn both_at_once(r: &[crate::support::sidecar::ReboundProcess; 2], key: &str) -> (BodyRead, BodyRead) {
    let (original, follower) = tokio::join!(keyed_stream(&r[0].proxy, key), keyed_stream(&r[1].proxy, key));
    tokio::join!(
        read_body(original.into_body(), b"", Duration::from_secs(30)),
        read_body(follower.into_body(), b"", Duration::from_secs(30))
    )
}

async fn keyed_stream(base: &str, key: &str) -> http::Response<hyper::body::Incoming> {
    send_streaming_within(
        Duration::from_secs(60),
        "POST",
        &format!("{base}/openai/v1/chat/completions"),
        &[
            ("x-fake-key", key),
            ("idempotency-key", key),
            ("x-fake-chunks", "5"),
            ("x-fake-gap-ms", "300"),
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-test"),
        ],
        r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"count"}]}"#,
    )
    .await
}

fn overloaded_after(after: usize) -> Step {
    Step::MidStreamError {
        after,
        error_type: "overloaded_error".into(),
    }
}

/// A keyed stream continued by its owner (cut by an error event mid-stream) and followed from
/// another replica: the follower reads the continued whole as the app does, the key keeps it,
/// and a later request replays it: two provider calls in all.
#[tokio::test]
async fn a_continued_stream_reaches_its_followers_and_the_key_keeps_it() {
    let (redis, provider) = (crate::support::redis::RedisServer::start(), FakeProvider::start().await);
    let r = two_replicas(&provider, &redis).await;
    provider.script("kept", vec![overloaded_after(2)]);
    let (original, follower) = both_at_once(&r, "kept").await;
    for (name, read) in [("original", &original), ("follower", &follower)] {
        let body = String::from_utf8_lossy(&read.bytes).to_string();
        assert!(read.clean, "{name}: {body}");
        assert_eq!(chat_text(&body), whole(5), "{name}: {body}");
    }
    assert_eq!(original.bytes, follower.bytes, "the follower reads what the app read");
    let again = keyed_stream(&r[0].proxy, "kept").await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again = read_body(again.into_body(), b"", Duration::from_secs(30)).await;
    assert_eq!(again.bytes, original.bytes, "the key keeps the continued whole");
    assert_eq!(provider.count("kept"), 2, "the cut and its continuation");
}

/// The owner cannot finish the stream (every continuation is reset): its app gets the error
/// event that says so, and so does the follower on another replica, which reads that end as it
/// came and does not continue the stream on its own (the soak found a follower doing so: a
/// second answer to one key, while the key was released for a third). The provider sees what
/// one replica alone makes of the request, nothing more.
#[tokio::test]
async fn a_stream_its_owner_could_not_finish_ends_the_same_for_its_followers() {
    let (redis, provider) = (crate::support::redis::RedisServer::start(), FakeProvider::start().await);
    let r = two_replicas(&provider, &redis).await;
    let steps = || [vec![overloaded_after(2)], vec![Step::Reset; 40]].concat();
    provider.script("alone", steps());
    let alone = read_body(
        keyed_stream(&r[0].proxy, "alone").await.into_body(),
        b"",
        Duration::from_secs(30),
    )
    .await;
    let alone_text = String::from_utf8_lossy(&alone.bytes).to_string();
    // It ends with the provider's error event, as it came.
    assert!(
        alone.clean && alone_text.contains("scripted overloaded_error"),
        "{alone_text}"
    );
    provider.script("followed", steps());
    let (original, follower) = both_at_once(&r, "followed").await;
    let body = String::from_utf8_lossy(&original.bytes).to_string();
    assert!(original.clean && body.contains("scripted overloaded_error"), "{body}");
    assert_eq!(
        String::from_utf8_lossy(&follower.bytes),
        body,
        "the follower ends as the original did"
    );
    assert_eq!(
        provider.count("followed"),
        provider.count("alone"),
        "no call of the follower's own"
    );
}

/// The follower's reader loses its connection to Redis (as in a failover) while the original
/// runs on: the follower is not continued on its own (a second answer for the key); it ends with
/// a visible cut, and the provider sees the original's call only.
#[tokio::test]
async fn a_follower_that_loses_the_relay_while_the_original_runs_is_not_continued_alone() {
    use crate::support::redis::query;
    let (redis, provider) = (crate::support::redis::RedisServer::start(), FakeProvider::start().await);
    let r = two_replicas(&provider, &redis).await;
    let original = keyed_stream(&r[0].proxy, "lost").await;
    let follower = keyed_stream(&r[1].proxy, "lost").await;
    assert_eq!(follower.headers()["idempotent-replayed"], "true", "a follower");
    let follower = tokio::spawn(read_body(follower.into_body(), b"", Duration::from_secs(30)));
    // Its reader's connection (blocked in XREAD), killed by Redis.
    let port = redis.port;
    tokio::task::spawn_blocking(move || {
        for _ in 0..500 {
            let clients: String = query(port, ::redis::cmd("CLIENT").arg("LIST")).unwrap_or_default();
            let reader = clients.lines().find(|l| l.contains("cmd=xread"));
            if let Some(id) = reader.and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id="))) {
                let _: ::redis::Value = query(port, ::redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id)).unwrap();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("no reader blocked in XREAD");
    })
    .await
    .unwrap();
    let original = read_body(original.into_body(), b"", Duration::from_secs(30)).await;
    assert!(original.clean, "the original is not touched");
    assert_eq!(chat_text(&String::from_utf8_lossy(&original.bytes)), whole(5));
    let follower = follower.await.unwrap();
    let text = String::from_utf8_lossy(&follower.bytes).to_string();
    assert!(
        follower.clean && text.contains(r#""type":"stream_cut""#),
        "a visible cut: {text}"
    );
    assert_eq!(provider.count("lost"), 1, "the original's call only");
}
