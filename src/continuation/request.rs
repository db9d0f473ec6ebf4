//! The continuation's request: the original request's body with the partial answer carried as
//! [`How`] says ([`body`]); and whether a 400
//! is a target refusing a prefill ([`is_prefill_rejection`]).
//!
//! Every field of the original is kept (model, tools, temperature, system prompt, `instructions`,
//! `stream_options`), `stream` is true, and the output cap (`max_tokens`,
//! `max_completion_tokens`, `max_output_tokens`) is lowered by the tokens already produced: an
//! under-estimate, one token per 5 characters the app has (at least 1 left). An Anthropic request
//! with thinking keeps room for it (`budget_tokens` on top, up to the original cap): the
//! continuation thinks anew.
//!
//! The partial is sent without its trailing whitespace (Anthropic refuses a final assistant
//! message that ends in whitespace; the seam restores it):
//! - Anthropic prefill: a final `{"role": "assistant", "content": partial}` (joined to the app's
//!   own final assistant message when it had one);
//! - Chat prefill: the same with `"prefix": true` (the form of the OpenAI-compatible targets that
//!   continue a prefill);
//! - a turn (Anthropic, Chat): that assistant message, then a user message asking to go on
//!   ([`CONTINUE`]);
//! - a Responses turn: `input` (a string becomes a user message) extended with the same two
//!   messages; `instructions` untouched.

use serde_json::{json, Map as Object, Value};

use super::transcript::{thinks, Transcript};
use super::{Dialect, How, Refusal};

/// The user message of a continuation turn: short, neutral (no persona, no language of its own).
pub(crate) const CONTINUE: &str = "Your previous message was cut off. Continue it exactly where it stopped, as \
if it had not been interrupted: do not repeat any of it and add nothing before the continuation (if it \
stopped inside a word or a sentence, finish that word or sentence first).";

/// Characters per token of the estimate of what was produced (an under-estimate for most text).
const CHARS_PER_TOKEN: usize = 5;

/// The output caps of the three APIs.
const CAPS: [&str; 3] = ["max_tokens", "max_completion_tokens", "max_output_tokens"];

/// What a 400 that refuses a prefill says (lowercased): Anthropic's models without prefill,
/// Bedrock's Converse, Mistral's `prefix`, an OpenAI-compatible host that knows no `prefix`.
const PREFILL_REFUSALS: [&str; 6] = [
    "prefill",
    "must end with a user message",
    "final assistant content",
    "expected last role",
    "last message must",
    "prefix",
];

/// The body of the continuation request asked for `how`, from the original `request` (its body)
/// and what the app has. [`How::Resume`] has none (it is a `GET`).
pub(crate) fn body(request: &[u8], app: &Transcript, how: How) -> Result<Vec<u8>, Refusal> {
    let mut request: Value = serde_json::from_slice(request).map_err(|_| Refusal::Unsupported)?;
    let Some(fields) = request.as_object_mut() else {
        return Err(Refusal::Unsupported);
    };
    fields.insert("stream".into(), true.into());
    let text = app.text();
    let partial = text.trim_end();
    match (app.dialect, how) {
        (_, How::Restart) => {}
        (Dialect::Messages | Dialect::Chat, How::Prefill) => {
            lower_caps(fields, app);
            assistant(fields, partial, app.dialect == Dialect::Chat)?;
        }
        (Dialect::Messages | Dialect::Chat, How::Turn) => {
            lower_caps(fields, app);
            assistant(fields, partial, false)?;
            messages(fields)?.push(json!({"role": "user", "content": CONTINUE}));
        }
        (Dialect::Responses, How::Turn) => {
            lower_caps(fields, app);
            let mut input = match fields.remove("input") {
                Some(Value::String(s)) => vec![json!({"role": "user", "content": s})],
                Some(Value::Array(items)) => items,
                None => Vec::new(),
                Some(_) => return Err(Refusal::Unsupported),
            };
            input.push(json!({"role": "assistant", "content": partial}));
            input.push(json!({"role": "user", "content": CONTINUE}));
            fields.insert("input".into(), input.into());
        }
        _ => return Err(Refusal::Unsupported),
    }
    serde_json::to_vec(&request).map_err(|_| Refusal::Unsupported)
}

/// Lowers the output caps by the tokens the app has (see the module documentation).
fn lower_caps(fields: &mut Object<String, Value>, app: &Transcript) {
    let produced = (app.produced_chars() / CHARS_PER_TOKEN) as u64;
    let thinking = (app.dialect == Dialect::Messages && thinks(&Value::Object(fields.clone())))
        .then(|| {
            fields
                .get("thinking")
                .and_then(|t| t.get("budget_tokens"))
                .and_then(Value::as_u64)
        })
        .flatten();
    for cap in CAPS {
        let Some(n) = fields.get(cap).and_then(Value::as_u64) else {
            continue;
        };
        let left = n.saturating_sub(produced).max(1);
        let lowered = match thinking {
            Some(budget) if cap == "max_tokens" => left.saturating_add(budget).min(n),
            _ => left,
        };
        fields.insert(cap.into(), lowered.into());
    }
}

fn messages(fields: &mut Object<String, Value>) -> Result<&mut Vec<Value>, Refusal> {
    fields
        .get_mut("messages")
        .and_then(Value::as_array_mut)
        .ok_or(Refusal::Unsupported)
}

/// The partial as the final assistant message (`prefix`: marked as a prefill, Chat's way).
fn assistant(fields: &mut Object<String, Value>, partial: &str, prefix: bool) -> Result<(), Refusal> {
    let messages = messages(fields)?;
    match messages.last_mut() {
        // The app's own prefill: the partial continues it.
        Some(last) if last["role"] == "assistant" => {
            match last.get_mut("content") {
                Some(Value::String(s)) => {
                    s.push_str(partial);
                    s.truncate(s.trim_end().len());
                }
                Some(Value::Array(blocks)) => blocks.push(json!({"type": "text", "text": partial})),
                _ => last["content"] = partial.into(),
            }
            if prefix {
                last["prefix"] = true.into();
            }
        }
        _ => {
            let mut message = json!({"role": "assistant", "content": partial});
            if prefix {
                message["prefix"] = true.into();
            }
            messages.push(message);
        }
    }
    Ok(())
}

/// Whether an error response to a prefill (`status`, `body`) is the target refusing the prefill:
/// then the continuation is asked again as a turn, and this answer is not the failure.
pub(crate) fn is_prefill_rejection(status: u16, body: &[u8]) -> bool {
    if status != 400 && status != 422 {
        return false;
    }
    let body = &body[..body.len().min(16 * 1024)];
    let message = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
        v["error"]["message"]
            .as_str()
            .or_else(|| v["message"].as_str())
            .map(str::to_string)
    });
    let text = message
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned())
        .to_lowercase();
    PREFILL_REFUSALS.iter().any(|p| text.contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::continuation::Dialect;

    /// A transcript whose app has `text` in one open text block.
    fn app(dialect: Dialect, text: &str) -> Transcript {
        let mut t = Transcript::new(dialect);
        t.started = true;
        t.open_block(0, super::super::transcript::Kind::Text, None);
        t.append(0, 0, text);
        t
    }

    fn build(request: Value, app: &Transcript, how: How) -> Value {
        let body = body(request.to_string().as_bytes(), app, how).unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    const PARTIAL: &str = "The first part of the answer, fifty characters. \n";

    #[test]
    fn anthropic_prefill_and_turn() {
        let t = app(Dialect::Messages, PARTIAL);
        let request = json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "system": "Be terse.",
            "temperature": 0.2, "tools": [{"name": "f"}], "messages": [{"role": "user", "content": "Hi"}]});
        let prefill = build(request.clone(), &t, How::Prefill);
        assert_eq!(prefill["stream"], true);
        assert_eq!(prefill["max_tokens"], 91, "49 characters: 9 tokens produced");
        assert_eq!(prefill["system"], "Be terse.");
        assert_eq!(prefill["tools"], request["tools"]);
        assert_eq!(prefill["temperature"], 0.2);
        let messages = prefill["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 2);
        assert_eq!(
            messages[1],
            json!({"role": "assistant", "content": "The first part of the answer, fifty characters."}),
            "no trailing whitespace"
        );
        let turn = build(request, &t, How::Turn);
        let messages = turn["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[1]["role"], "assistant");
        assert_eq!(messages[2], json!({"role": "user", "content": CONTINUE}));
        // The app's own prefill: the partial continues it.
        let own = json!({"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "{\"a\":"}]});
        let t = app(Dialect::Messages, " 1, \"b\": ");
        let prefill = build(own, &t, How::Prefill);
        assert_eq!(prefill["messages"][1]["content"], "{\"a\": 1, \"b\":");
        assert_eq!(prefill["max_tokens"], 4);
    }

    #[test]
    fn anthropic_thinking_keeps_room_to_think() {
        let t = app(Dialect::Messages, &"x".repeat(10_000));
        let request = json!({"model": "c", "max_tokens": 8000, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [{"role": "user", "content": "Hi"}]});
        let turn = build(request, &t, How::Turn);
        assert_eq!(turn["max_tokens"], 6000 + 1024, "what is left, and the budget on top");
        assert_eq!(turn["thinking"]["budget_tokens"], 1024);
        let t = app(Dialect::Messages, &"x".repeat(50_000));
        let request = json!({"model": "c", "max_tokens": 3000, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [{"role": "user", "content": "Hi"}]});
        assert_eq!(
            build(request.clone(), &t, How::Turn)["max_tokens"],
            1025,
            "always above the budget"
        );
        let t = app(Dialect::Messages, "short");
        assert_eq!(
            build(request, &t, How::Turn)["max_tokens"],
            3000,
            "never above the original"
        );
    }

    #[test]
    fn chat_prefill_turn_and_restart() {
        let t = app(Dialect::Chat, PARTIAL);
        let request = json!({"model": "gpt-4o", "max_completion_tokens": 5, "stream": true,
            "stream_options": {"include_usage": true}, "messages": [{"role": "system", "content": "S"},
            {"role": "user", "content": "Hi"}]});
        let prefill = build(request.clone(), &t, How::Prefill);
        assert_eq!(prefill["messages"][2]["prefix"], true);
        assert_eq!(prefill["max_completion_tokens"], 1, "at least one left");
        assert_eq!(prefill["stream_options"], request["stream_options"]);
        let turn = build(request.clone(), &t, How::Turn);
        assert_eq!(turn["messages"].as_array().unwrap().len(), 4);
        assert_eq!(turn["messages"][2].get("prefix"), None);
        let restart = build(request.clone(), &t, How::Restart);
        assert_eq!(restart, request, "the original, as it came");
        assert_eq!(body(b"[1]", &t, How::Turn), Err(Refusal::Unsupported));
        assert_eq!(body(br#"{"model":"m"}"#, &t, How::Turn), Err(Refusal::Unsupported));
    }

    #[test]
    fn responses_turn_extends_the_input() {
        let t = app(Dialect::Responses, "Partial");
        let request = json!({"model": "gpt-4.1", "instructions": "Be kind.", "input": "Tell me",
            "max_output_tokens": 50});
        let turn = build(request, &t, How::Turn);
        assert_eq!(turn["instructions"], "Be kind.");
        assert_eq!(turn["stream"], true);
        assert_eq!(turn["max_output_tokens"], 49);
        assert_eq!(
            turn["input"],
            json!([{"role": "user", "content": "Tell me"}, {"role": "assistant", "content": "Partial"},
                {"role": "user", "content": CONTINUE}])
        );
        let items = json!({"model": "m", "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]});
        let turn = build(items, &t, How::Turn);
        assert_eq!(turn["input"].as_array().unwrap().len(), 3);
        assert_eq!(body(br#"{"input": 1}"#, &t, How::Turn), Err(Refusal::Unsupported));
        assert_eq!(body(br#"{"input": "x"}"#, &t, How::Prefill), Err(Refusal::Unsupported));
    }

    #[test]
    fn a_prefill_rejection_is_recognised() {
        for body in [
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"This model does not support assistant message prefill. The conversation must end with a user message."}}"#,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages: final assistant content cannot end with trailing whitespace"}}"#,
            r#"{"message":"A conversation must end with a user message. Try again with a conversation that ends with a user message."}"#,
            r#"{"object":"error","message":"Expected last role User or Tool (or Assistant with prefix True) for serving but got assistant","type":"invalid_request_message_order"}"#,
            "Prefill is not supported",
        ] {
            assert!(is_prefill_rejection(400, body.as_bytes()), "{body}");
        }
        let other = r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: 100000 > 64000, which is the maximum allowed"}}"#;
        assert!(!is_prefill_rejection(400, other.as_bytes()));
        let overloaded = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded prefill"}}"#;
        assert!(!is_prefill_rejection(529, overloaded.as_bytes()), "only a 400 or 422");
    }
}
