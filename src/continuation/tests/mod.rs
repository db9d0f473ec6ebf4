//! End to end, pure: the app's stream cut, the decision, the continuation's request, the
//! continuation's events through a splicer, and everything the app received read as an SDK reads
//! it ([`sdk`]): one message, consistent indexes, one end, the whole text, the summed usage.

mod closing;
mod sdk;

use proptest::prelude::*;
use serde_json::{json, Value};

use super::transcript::Spent;
use super::{request, Dialect, Framer, How, Plan, Refusal, SeamError, SpliceError, Splicer, Transcript};

/// The whole answer every fixture streams.
const WHOLE: &str = "Here are three tips for better sleep:\n\n1. Keep a regular schedule.\n2. Avoid screens before bed.\n3. Keep your room cool and dark.";

const ANTHROPIC_CUT: &str = include_str!("../testdata/anthropic_cut.sse");
const ANTHROPIC_PREFILL: &str = include_str!("../testdata/anthropic_prefill.sse");
const ANTHROPIC_TURN: &str = include_str!("../testdata/anthropic_turn.sse");
const ANTHROPIC_THINKING_CUT: &str = include_str!("../testdata/anthropic_thinking_cut.sse");
const ANTHROPIC_THINKING_TURN: &str = include_str!("../testdata/anthropic_thinking_turn.sse");
const CHAT_CUT: &str = include_str!("../testdata/chat_cut.sse");
const CHAT_TURN: &str = include_str!("../testdata/chat_turn.sse");
const RESPONSES_CUT: &str = include_str!("../testdata/responses_cut.sse");
const RESPONSES_TURN: &str = include_str!("../testdata/responses_turn.sse");
const RESPONSES_BACKGROUND_CUT: &str = include_str!("../testdata/responses_background_cut.sse");
const RESPONSES_RESUME: &str = include_str!("../testdata/responses_resume.sse");

fn events(stream: &str) -> Vec<Vec<u8>> {
    let mut f = Framer::default();
    f.push(stream.as_bytes());
    std::iter::from_fn(|| f.next_event().map(|e| e.to_vec())).collect()
}

fn is_error(event: &[u8]) -> bool {
    crate::wire::sse::classify_event(event).is_some()
}

/// The app's side until the cut: what was forwarded (up to an error event, which is the cut and
/// is not forwarded), and the transcript fed with it.
fn cut(dialect: Dialect, stream: &str) -> (Vec<u8>, Transcript) {
    let mut app = Vec::new();
    let mut t = Transcript::new(dialect);
    for e in events(stream).into_iter().take_while(|e| !is_error(e)) {
        t.observe(&e);
        app.extend_from_slice(&e);
    }
    (app, t)
}

/// A continuation's events through the splicer, appended to what the app has; the error when
/// the splicer stops (what it sent before stays appended).
fn splice(app: &mut Vec<u8>, s: &mut Splicer, stream: &str) -> Result<(), SpliceError> {
    for e in events(stream) {
        app.extend(s.feed(&e)?);
    }
    app.extend(s.finish()?);
    Ok(())
}

fn continue_how(t: &Transcript, request: &Value, prefill: bool) -> How {
    match t.decide(request.to_string().as_bytes(), prefill) {
        Plan::Continue(how) => how,
        refused => panic!("{refused:?}"),
    }
}

fn body(t: &Transcript, request: &Value, how: How) -> Value {
    let body = request::body(request.to_string().as_bytes(), t, how).unwrap();
    serde_json::from_slice(&body).unwrap()
}

fn claude() -> Value {
    json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": true,
        "messages": [{"role": "user", "content": "Three tips for better sleep?"}]})
}

/// A cut attempt's estimated output: one token per 4 characters.
fn estimate(text: &str) -> u64 {
    text.chars().count().div_ceil(4) as u64
}

#[test]
fn anthropic_prefill_continues_the_open_block() {
    let (mut app, t) = cut(Dialect::Messages, ANTHROPIC_CUT);
    let partial = t.text();
    assert_eq!(
        partial,
        "Here are three tips for better sleep:\n\n1. Keep a regular schedule.\n2. Avoid "
    );
    let how = continue_how(&t, &claude(), true);
    assert_eq!(how, How::Prefill);
    let sent = body(&t, &claude(), how);
    assert_eq!(sent["messages"][1]["content"], partial.trim_end());
    let mut s = Splicer::new(t, how, claude().to_string().as_bytes());
    splice(&mut app, &mut s, ANTHROPIC_PREFILL).unwrap();
    let read = sdk::anthropic(&app);
    assert_eq!(
        read.text, WHOLE,
        "the trailing space stripped from the prefill is kept once"
    );
    assert_eq!(read.blocks, ["text"]);
    assert_eq!(read.id, "msg_01XFDUDYJgAACzvnptvVoYEL");
    // Every attempt summed: the cut one's output estimated from its text.
    let wasted = estimate(&partial);
    assert_eq!(read.usage["input_tokens"], 21 + 44);
    assert_eq!(read.usage["output_tokens"], wasted + 17);
    let attempts: Vec<Spent> = s.attempts();
    assert_eq!(attempts.len(), 2);
    assert!(attempts[0].estimated && !attempts[1].estimated);
    assert_eq!((attempts[1].usage.input, attempts[1].usage.output), (44, 17));
    assert!(String::from_utf8_lossy(&app).contains(": rebound: continued (prefill)\n\n"));
    assert!(s.done());
}

#[test]
fn anthropic_turn_after_a_prefill_rejection_drops_the_repeated_tail() {
    let (mut app, t) = cut(Dialect::Messages, ANTHROPIC_CUT);
    let rejection = br#"{"type":"error","error":{"type":"invalid_request_error","message":"This model does not support assistant message prefill. The conversation must end with a user message."}}"#;
    assert!(request::is_prefill_rejection(400, rejection));
    let how = continue_how(&t, &claude(), false);
    assert_eq!(how, How::Turn);
    let sent = body(&t, &claude(), how);
    assert_eq!(sent["messages"][2]["content"], request::CONTINUE);
    let mut s = Splicer::new(t, how, claude().to_string().as_bytes());
    splice(&mut app, &mut s, ANTHROPIC_TURN).unwrap();
    let read = sdk::anthropic(&app);
    assert_eq!(read.text, WHOLE, "\"2. Avoid\" repeated by the continuation is dropped");
}

#[test]
fn anthropic_thinking_turn_carries_the_text_and_drops_the_new_thinking() {
    let request = json!({"model": "claude-sonnet-4-5", "max_tokens": 4096, "stream": true,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [{"role": "user", "content": "Three tips for better sleep?"}]});
    let (mut app, t) = cut(Dialect::Messages, ANTHROPIC_THINKING_CUT);
    let how = continue_how(&t, &request, true);
    assert_eq!(how, How::Turn, "no prefill with thinking");
    let sent = body(&t, &request, how);
    assert_eq!(
        sent["messages"][1],
        json!({"role": "assistant", "content": "Here are three tips for better sleep:\n\n1. Keep"}),
        "the text only: no signed thinking carried"
    );
    assert!(sent["max_tokens"].as_u64().unwrap() > 1024, "room to think");
    let mut s = Splicer::new(t, how, request.to_string().as_bytes());
    splice(&mut app, &mut s, ANTHROPIC_THINKING_TURN).unwrap();
    let read = sdk::anthropic(&app);
    assert_eq!(read.text, WHOLE);
    assert_eq!(read.blocks, ["thinking", "text"], "one thinking, the app's");
    assert_eq!(read.thinking, "The user wants sleep tips. Three short ones.");
    assert_eq!(read.usage["input_tokens"], 30 + 120);
    assert_eq!(read.usage["cache_read_input_tokens"], 12 + 12);
    assert_eq!(
        read.usage["output_tokens"],
        40 + estimate("The user wants sleep tips. Three short ones.Here are three tips for better sleep:\n\n1. Keep")
    );
}

/// An Anthropic stream of one text block with these deltas; ended, or cut by an error event.
fn claude_stream(id: &str, input: u64, deltas: &[&str], ended: bool) -> String {
    let mut s = format!(
        "event: message_start\ndata: {}\n\nevent: content_block_start\ndata: {}\n\n",
        json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant", "model": "claude-opus-4-6",
            "content": [], "stop_reason": null, "usage": {"input_tokens": input, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    );
    for d in deltas {
        let delta = json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": d}});
        s.push_str(&format!("event: content_block_delta\ndata: {delta}\n\n"));
    }
    if ended {
        s.push_str("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n");
        s.push_str("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":9}}\n\n");
        s.push_str("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    } else {
        s.push_str("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n");
    }
    s
}

#[test]
fn anthropic_restart_refused_then_a_cut_continuation_continued_again() {
    let (mut app, t) = cut(Dialect::Messages, ANTHROPIC_CUT);
    let partial = t.text();
    // 1. The continuation starts the answer over: an error, none of its text sent.
    let mut s = Splicer::new(t, How::Prefill, claude().to_string().as_bytes());
    let restart = claude_stream(
        "msg_a",
        50,
        &["Here are three tips", " for better sleep:\n\n1. Keep"],
        true,
    );
    let sent_before = app.len();
    assert_eq!(
        splice(&mut app, &mut s, &restart),
        Err(SpliceError::Disagrees(SeamError::Restarted))
    );
    assert!(!String::from_utf8_lossy(&app[sent_before..]).contains("text_delta"));
    let t = s.into_transcript();
    assert_eq!(t.text(), partial);
    // 2. Continued, then cut in turn while the seam still held its text (too short to tell a
    // preamble's restart): none of it reached the app.
    let how = continue_how(&t, &claude(), true);
    let mut s = Splicer::new(t, how, claude().to_string().as_bytes());
    let cut_again = claude_stream("msg_b", 60, &[" screens before", " bed.\n3. Keep"], false);
    let sent_before = app.len();
    assert_eq!(splice(&mut app, &mut s, &cut_again), Err(SpliceError::Cut));
    assert!(!String::from_utf8_lossy(&app[sent_before..]).contains("screens"));
    let t = s.into_transcript();
    assert_eq!(t.text(), partial);
    // 3. The next continuation goes on from what the app has.
    let how = continue_how(&t, &claude(), true);
    let sent = body(&t, &claude(), how);
    assert!(sent["messages"][1]["content"]
        .as_str()
        .unwrap()
        .ends_with(partial.trim_end()));
    let mut s = Splicer::new(t, how, claude().to_string().as_bytes());
    splice(
        &mut app,
        &mut s,
        &claude_stream(
            "msg_c",
            70,
            &[" screens before bed.\n3. Keep", " your room cool and dark."],
            true,
        ),
    )
    .unwrap();
    let read = sdk::anthropic(&app);
    assert_eq!(read.text, WHOLE);
    assert_eq!(read.blocks, ["text"]);
    assert_eq!(read.usage["input_tokens"], 21 + 50 + 60 + 70, "every attempt's input");
    assert_eq!(s.attempts().len(), 4);
    assert_eq!(
        app.windows(13).filter(|w| **w == b"message_start"[..]).count(),
        2,
        "one event, its name and type"
    );
}

#[test]
fn anthropic_continuation_that_calls_a_tool_closes_the_app_block_first() {
    let (mut app, t) = cut(Dialect::Messages, ANTHROPIC_CUT);
    let mut s = Splicer::new(t, How::Prefill, claude().to_string().as_bytes());
    let tool = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_t\",\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"lookup\",\"input\":{}}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"q\\\": \\\"sleep\\\"}\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":12}}\n\n",
    );
    // Its body ends after the message_delta: the end is known, the message_stop is rebound's.
    splice(&mut app, &mut s, tool).unwrap();
    let read = sdk::anthropic(&app);
    assert_eq!(read.blocks, ["text", "tool_use"]);
    assert_eq!(
        read.text,
        "Here are three tips for better sleep:\n\n1. Keep a regular schedule.\n2. Avoid "
    );
}

#[test]
fn anthropic_cuts_inside_a_tool_call_or_thinking_are_refused() {
    let tool = ANTHROPIC_CUT.replace(
        "{\"type\":\"text\",\"text\":\"\"}",
        "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{}}",
    );
    let (_, t) = cut(Dialect::Messages, &tool);
    assert_eq!(
        t.decide(claude().to_string().as_bytes(), true),
        Plan::Refuse(Refusal::ToolCall)
    );
    assert_eq!(Refusal::ToolCall.fate().as_str(), "refused_tool_call");
    let (_, t) = cut(
        Dialect::Messages,
        &ANTHROPIC_THINKING_CUT[..ANTHROPIC_THINKING_CUT.find("event: content_block_stop").unwrap()],
    );
    assert_eq!(
        t.decide(claude().to_string().as_bytes(), true),
        Plan::Refuse(Refusal::Thinking)
    );
    assert_eq!(Refusal::Thinking.fate().as_str(), "refused_thinking");
    assert_eq!(Refusal::Ended.fate().as_str(), "failed");
}

fn gpt(include_usage: bool) -> Value {
    let mut r = json!({"model": "gpt-4o", "stream": true, "max_completion_tokens": 500,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Three tips for better sleep?"}]});
    if include_usage {
        r["stream_options"] = json!({"include_usage": true});
    }
    r
}

#[test]
fn chat_turn_with_the_usage_summed() {
    let (mut app, t) = cut(Dialect::Chat, CHAT_CUT);
    let partial = t.text();
    assert!(partial.ends_with("\n2. Av"), "cut inside a word");
    let how = continue_how(&t, &gpt(true), false);
    assert_eq!(how, How::Turn);
    let sent = body(&t, &gpt(true), how);
    assert_eq!(sent["messages"].as_array().unwrap().len(), 4);
    assert_eq!(sent["messages"][0]["content"], "Be brief.");
    let mut s = Splicer::new(t, how, gpt(true).to_string().as_bytes());
    splice(&mut app, &mut s, CHAT_TURN).unwrap();
    let read = sdk::chat(&app);
    assert_eq!(
        read.text, WHOLE,
        "\"2. Av\" rewritten as \"2. Avoid\" by the continuation: dropped once"
    );
    assert_eq!(read.id, "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG");
    assert_eq!(read.usage["prompt_tokens"], 88, "the cut attempt reported none");
    assert_eq!(read.usage["prompt_tokens_details"]["cached_tokens"], 64);
    assert_eq!(read.usage["completion_tokens"], 18 + estimate(&partial));
}

#[test]
fn chat_prefill_without_usage_asked() {
    let (mut app, t) = cut(Dialect::Chat, CHAT_CUT);
    let how = continue_how(&t, &gpt(false), true);
    assert_eq!(how, How::Prefill);
    let sent = body(&t, &gpt(false), how);
    assert_eq!(sent["messages"][2]["prefix"], true);
    let chunk = |delta: Value, finish: Value| {
        let c = json!({"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "deepseek-chat",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        format!("data: {c}\n\n")
    };
    let stream = [
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"content": "oid screens before bed.\n3. Keep"}), Value::Null),
        chunk(json!({"content": " your room cool and dark."}), json!("stop")),
        "data: [DONE]\n\n".to_string(),
    ]
    .concat();
    let mut s = Splicer::new(t, how, gpt(false).to_string().as_bytes());
    splice(&mut app, &mut s, &stream).unwrap();
    let read = sdk::chat(&app);
    assert_eq!(read.text, WHOLE);
    assert_eq!(read.usage, Value::Null, "no usage chunk: the app did not ask");
}

fn openai_responses() -> Value {
    json!({"model": "gpt-4.1", "stream": true, "instructions": "Be brief.", "input": "Three tips for better sleep?",
        "max_output_tokens": 400})
}

#[test]
fn responses_turn_continues_the_open_item() {
    let (mut app, t) = cut(Dialect::Responses, RESPONSES_CUT);
    let partial = t.text();
    let how = continue_how(&t, &openai_responses(), true);
    assert_eq!(how, How::Turn);
    let sent = body(&t, &openai_responses(), how);
    assert_eq!(sent["input"][1], json!({"role": "assistant", "content": partial}));
    assert_eq!(sent["instructions"], "Be brief.");
    let mut s = Splicer::new(t, how, openai_responses().to_string().as_bytes());
    splice(&mut app, &mut s, RESPONSES_TURN).unwrap();
    let read = sdk::responses(&app);
    assert_eq!(read.text, WHOLE, "the continuation's leading space kept");
    assert_eq!(read.blocks, ["message"]);
    assert_eq!(read.id, "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b");
    assert_eq!(read.response["created_at"], 1741476542);
    assert_eq!(read.usage["input_tokens"], 130);
    assert_eq!(read.usage["input_tokens_details"]["cached_tokens"], 100);
    assert_eq!(read.usage["output_tokens"], 16 + estimate(&partial));
    assert_eq!(read.usage["total_tokens"], 130 + 16 + estimate(&partial));
}

#[test]
fn responses_background_resumes_after_the_last_sequence_number() {
    let (mut app, t) = cut(Dialect::Responses, RESPONSES_BACKGROUND_CUT);
    let how = continue_how(&t, &openai_responses(), true);
    assert_eq!(how, How::Resume);
    assert_eq!(
        t.resume_path().as_deref(),
        Some("/v1/responses/resp_68b1f0bg0000000000000000000000000000000000000000?stream=true&starting_after=6")
    );
    assert_eq!(
        request::body(b"{}", &t, how),
        Err(Refusal::Unsupported),
        "a GET, no body"
    );
    let mut s = Splicer::new(t, how, b"{}");
    splice(&mut app, &mut s, RESPONSES_RESUME).unwrap();
    // The events 5 and 6 the app had are not sent twice; the rest are the provider's.
    let read = sdk::responses(&app);
    assert_eq!(read.text, WHOLE);
    assert_eq!(read.usage["output_tokens"], 30, "one generation: its own usage");
}

#[test]
fn responses_cut_inside_a_function_call_is_refused() {
    let call = RESPONSES_CUT
        .replace("\"type\":\"message\"", "\"type\":\"function_call\"")
        .replace(
            "\"type\":\"response.output_text.delta\"",
            "\"type\":\"response.function_call_arguments.delta\"",
        );
    let (_, t) = cut(Dialect::Responses, &call);
    assert_eq!(
        t.decide(openai_responses().to_string().as_bytes(), true),
        Plan::Refuse(Refusal::ToolCall)
    );
}

#[test]
fn anthropic_restart_when_the_app_has_no_text_yet() {
    let only_start = &ANTHROPIC_CUT[..ANTHROPIC_CUT.find("event: content_block_start").unwrap()];
    let (mut app, t) = cut(Dialect::Messages, only_start);
    let how = continue_how(&t, &claude(), true);
    assert_eq!(how, How::Restart);
    assert_eq!(body(&t, &claude(), how), claude(), "the original request");
    let mut s = Splicer::new(t, how, claude().to_string().as_bytes());
    splice(
        &mut app,
        &mut s,
        &claude_stream("msg_r", 21, &[&WHOLE[..30], &WHOLE[30..]], true),
    )
    .unwrap();
    let read = sdk::anthropic(&app);
    assert_eq!(read.text, WHOLE);
    assert_eq!(
        read.id, "msg_01XFDUDYJgAACzvnptvVoYEL",
        "the app's message, started once"
    );
}

#[test]
fn anthropic_text_in_a_block_start_goes_through_the_seam() {
    let (mut app, t) = cut(Dialect::Messages, ANTHROPIC_CUT);
    let mut s = Splicer::new(t, How::Turn, claude().to_string().as_bytes());
    let stream = claude_stream("msg_x", 5, &[" before bed.\n3. Keep your room cool and dark."], true).replace(
        "\"content_block\":{\"text\":\"\",\"type\":\"text\"}",
        "\"content_block\":{\"text\":\"Avoid screens\",\"type\":\"text\"}",
    );
    assert!(stream.contains("Avoid screens"));
    splice(&mut app, &mut s, &stream).unwrap();
    let read = sdk::anthropic(&app);
    assert_eq!(read.text, WHOLE, "the repeated \"Avoid\" dropped from the start's text");
}

#[test]
fn a_short_continuation_is_held_until_its_block_ends() {
    let all_but_the_stop = &WHOLE[..WHOLE.len() - 1];
    let (mut app, t) = cut(
        Dialect::Messages,
        &claude_stream("msg_app", 10, &[all_but_the_stop], false),
    );
    let mut s = Splicer::new(t, How::Prefill, claude().to_string().as_bytes());
    // "." is in the partial: held until its block ends, a ping going through meanwhile.
    let mut stream = claude_stream("msg_s", 30, &["."], true);
    let stop = stream.find("event: content_block_stop").unwrap();
    stream.insert_str(stop, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
    let events = events(&stream);
    let ping = events.iter().position(|e| e.starts_with(b"event: ping")).unwrap();
    for e in &events[..ping] {
        app.extend(s.feed(e).unwrap());
    }
    assert!(!String::from_utf8_lossy(&app).contains("\".\""), "the \".\" is held");
    let sent = s.feed(&events[ping]).unwrap();
    assert!(sent.ends_with(&events[ping]), "a ping is not");
    app.extend(sent);
    for e in &events[ping + 1..] {
        app.extend(s.feed(e).unwrap());
    }
    let read = sdk::anthropic(&app);
    assert_eq!(read.text, WHOLE);
}

#[test]
fn responses_continuation_that_reasons_first() {
    let (mut app, t) = cut(Dialect::Responses, RESPONSES_CUT);
    // The continuation's message is its second item, after a reasoning item: the reasoning is
    // dropped, the message continues the app's first.
    let shifted = RESPONSES_TURN.replace("\"output_index\":0", "\"output_index\":1");
    let reasoning = concat!(
        "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,\"item\":{\"id\":\"rs_1\",\"type\":\"reasoning\",\"summary\":[]}}\n\n",
        "event: response.reasoning_summary_text.delta\ndata: {\"type\":\"response.reasoning_summary_text.delta\",\"sequence_number\":3,\"item_id\":\"rs_1\",\"output_index\":0,\"summary_index\":0,\"delta\":\"Go on.\"}\n\n",
        "event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"sequence_number\":4,\"output_index\":0,\"item\":{\"id\":\"rs_1\",\"type\":\"reasoning\",\"summary\":[]}}\n\n",
    );
    let at = shifted.find("event: response.output_item.added").unwrap();
    let stream = format!("{}{reasoning}{}", &shifted[..at], &shifted[at..]);
    let mut s = Splicer::new(t, How::Turn, openai_responses().to_string().as_bytes());
    splice(&mut app, &mut s, &stream).unwrap();
    let read = sdk::responses(&app);
    assert_eq!(read.text, WHOLE);
    assert_eq!(read.blocks, ["message"]);
}

#[test]
fn a_transcript_over_the_cap_is_not_continued() {
    let mut t = Transcript::new(Dialect::Chat);
    let big = "word ".repeat(super::transcript::KEPT_MAX / 5 + 1);
    t.observe(
        format!(
            "data: {}\n\n",
            json!({"id": "c", "choices": [{"index": 0, "delta": {"content": big}}]})
        )
        .as_bytes(),
    );
    assert_eq!(t.decide(b"{}", false), Plan::Refuse(Refusal::TooLong));
    assert!(t.text().is_empty(), "nothing kept past the cap");
}

/// A Chat stream: a role chunk, these contents, and (ended) a finish chunk and `[DONE]`.
fn gpt_stream(id: &str, contents: &[&str], ended: bool) -> String {
    let chunk = |delta: Value, finish: Value| {
        let c = json!({"id": id, "object": "chat.completion.chunk", "created": 7, "model": "gpt-4o",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]});
        format!("data: {c}\n\n")
    };
    let mut s = chunk(json!({"role": "assistant", "content": ""}), Value::Null);
    for c in contents {
        s.push_str(&chunk(json!({"content": c}), Value::Null));
    }
    if ended {
        s.push_str(&chunk(json!({}), json!("stop")));
        s.push_str("data: [DONE]\n\n");
    }
    s
}

/// A text of distinct words, none a prefix of another: it repeats nothing by chance.
const DISTINCT: &str = "Rivers drift north over copper stone, lanterns hum under ivory glass.\n\nMaple groves yield brisk ember light; quiet harbors wander.";

/// `s` cut at the given points (character boundaries), empty pieces left out.
pub(super) fn pieces<'a>(s: &'a str, cuts: &[usize]) -> Vec<&'a str> {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|c| c % (s.len() + 1))
        .filter(|&c| s.is_char_boundary(c))
        .collect();
    points.extend([0, s.len()]);
    points.sort_unstable();
    points.dedup();
    points.windows(2).map(|w| &s[w[0]..w[1]]).collect()
}

proptest! {
    #![proptest_config(crate::testing::proptest_config(128))]

    /// Any cut of the answer, continued by a continuation that starts at the cut or repeats the
    /// partial's tail from a word start, each stream in any deltas: the app reads one valid
    /// stream whose text is the whole answer.
    #[test]
    fn any_cut_continued_reads_as_the_whole_answer(
        split in 1..DISTINCT.len(),
        back in any::<usize>(),
        overlap in any::<bool>(),
        prefill in any::<bool>(),
        chat in any::<bool>(),
        app_cuts in proptest::collection::vec(any::<usize>(), 0..5),
        cuts in proptest::collection::vec(any::<usize>(), 0..5),
    ) {
        let t = DISTINCT;
        let i = (split..=t.len()).find(|&i| t.is_char_boundary(i)).unwrap_or(t.len());
        let starts: Vec<usize> = (0..i)
            .filter(|&k| t[k..].starts_with(char::is_alphanumeric) && !t[..k].ends_with(char::is_alphanumeric))
            .collect();
        // A cut inside a run of whitespace: the continuation gives the run whole (as a prefill's
        // does, whose partial is sent without its trailing whitespace). One that gave only the
        // run's rest could not be told from one repeating it ("\n" after "\n"): the seam keeps
        // the app's whitespace then, by its rule 2, and the run is one shorter.
        let run = if t[i..].starts_with(char::is_whitespace) { i - (t[..i].len() - t[..i].trim_end().len()) } else { i };
        let j = if overlap && !starts.is_empty() { starts[back % starts.len()] } else { run };
        let how = if prefill && j == run { How::Prefill } else { How::Turn };
        let (dialect, request, app_stream, cont) = if chat {
            (Dialect::Chat, gpt(false), gpt_stream("a", &pieces(&t[..i], &app_cuts), false), gpt_stream("b", &pieces(&t[j..], &cuts), true))
        } else {
            (Dialect::Messages, claude(), claude_stream("a", 3, &pieces(&t[..i], &app_cuts), false), claude_stream("b", 4, &pieces(&t[j..], &cuts), true))
        };
        let (mut app, transcript) = cut(dialect, &app_stream);
        prop_assert_eq!(transcript.decide(request.to_string().as_bytes(), prefill), Plan::Continue(if prefill { How::Prefill } else { How::Turn }));
        let mut s = Splicer::new(transcript, how, request.to_string().as_bytes());
        prop_assert_eq!(splice(&mut app, &mut s, &cont), Ok(()));
        let read = if chat { sdk::chat(&app) } else { sdk::anthropic(&app) };
        prop_assert_eq!(read.text, t, "cut at {}, continued from {}", i, j);
    }
}

/// Event types of every dialect, and some that are none.
const KINDS: [&str; 22] = [
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "ping",
    "error",
    "response.created",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
    "response.failed",
    "response.reasoning_summary_text.delta",
    "response.function_call_arguments.delta",
    "",
    "[DONE]",
    "other",
];

/// Events of any dialect's shape, with any numbers in them.
fn wild_event() -> impl Strategy<Value = String> {
    let number = || prop_oneof![0..4u64, any::<u64>()];
    let kinds = ["text", "thinking", "tool_use", "message", "reasoning", "function_call"];
    (
        proptest::sample::select(KINDS.to_vec()),
        number(),
        number(),
        "[ a-z.\n]{0,8}",
        proptest::sample::select(kinds.to_vec()),
    )
        .prop_map(|(kind, i, j, text, block)| {
            if kind == "[DONE]" {
                return "data: [DONE]\n\n".to_string();
            }
            let v = json!({"type": kind, "index": i, "output_index": i, "content_index": j, "sequence_number": j,
                "delta": if j % 2 == 0 { json!(text) } else { json!({"type": "text_delta", "text": text, "stop_reason": "end_turn"}) },
                "content_block": {"type": block, "text": text}, "item": {"type": block, "id": format!("i{i}")},
                "part": {"type": "output_text", "text": text}, "message": {"id": "m", "usage": {"input_tokens": i}},
                "response": {"id": "r", "background": j % 2 == 0, "usage": {"input_tokens": i, "output_tokens": j}},
                "choices": [{"index": j % 2, "delta": {"content": text, "role": "assistant", "reasoning_content": text},
                    "finish_reason": if i % 3 == 0 { json!("stop") } else { Value::Null }}],
                "usage": {"prompt_tokens": i, "completion_tokens": j, "output_tokens": j}});
            format!("event: {kind}\ndata: {v}\n\n")
        })
}

proptest! {
    #![proptest_config(crate::testing::proptest_config(256))]

    /// Whatever the streams say, nothing panics.
    #[test]
    fn no_stream_makes_anything_panic(
        dialect in proptest::sample::select(vec![Dialect::Messages, Dialect::Chat, Dialect::Responses]),
        app in proptest::collection::vec(wild_event(), 0..10),
        continuation in proptest::collection::vec(wild_event(), 0..10),
    ) {
        let mut t = Transcript::new(dialect);
        for e in &app {
            t.observe(e.as_bytes());
        }
        let request = json!({"model": "m", "max_tokens": 10, "messages": [], "input": "x"}).to_string();
        let _ = t.decide(request.as_bytes(), true);
        for how in [How::Resume, How::Restart, How::Prefill, How::Turn] {
            let _ = request::body(request.as_bytes(), &t, how);
            let mut s = Splicer::new(t.clone(), how, request.as_bytes());
            for e in &continuation {
                if s.feed(e.as_bytes()).is_err() {
                    break;
                }
            }
            let _ = s.finish();
            let _ = s.attempts();
            let _ = s.into_transcript().decide(request.as_bytes(), false);
        }
    }
}
