//! OpenAI Chat Completions streams: `data:` chunks (`choices[].delta` with `role`, `content`,
//! `tool_calls`, `reasoning_content`; `finish_reason`; a last `usage` chunk with
//! `stream_options.include_usage`), then `data: [DONE]`. What the app has of one ([`observe`]),
//! and a continuation's chunks mapped into it ([`Map`]): the app's `id`, `model` and `created`;
//! no second `role`; reasoning dropped once the app has content; the content through the seam;
//! at the end the summed usage chunk (when the app asked for usage) and one `[DONE]`. One choice
//! only (`n` > 1 is not continued).

use serde_json::{json, Map as Object, Value};

use super::event::{str_at, u64_at, Data, Event, DONE};
use super::transcript::{Kind, Transcript};
use super::{DialectApi, Out, SpliceError};
use crate::wire::usage::Usage;

/// Chat, as a continuation reads and rewrites it.
pub(super) struct Chat;

impl DialectApi for Chat {
    fn observe(&self, t: &mut Transcript, event: &Event) {
        observe(t, event);
    }

    fn set_text(&self, value: &mut Value, text: String) {
        set_text(value, text);
    }
}

/// Chat's reasoning fields (DeepSeek and vLLM's `reasoning_content`, OpenRouter's `reasoning`).
const REASONING: [&str; 2] = ["reasoning_content", "reasoning"];

/// A non-empty string at `key`.
fn text_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    str_at(v, key).filter(|s| !s.is_empty())
}

/// The last block, opened as `kind` unless it is open as that already.
fn block(t: &mut Transcript, kind: Kind) -> u64 {
    match t.blocks.last() {
        Some(b) if b.open && b.kind == kind => b.index,
        _ => {
            for b in &mut t.blocks {
                b.open = false;
            }
            let index = t.blocks.len() as u64;
            t.open_block(index, kind, None);
            index
        }
    }
}

/// Updates the app's view with one chunk it received.
fn observe(t: &mut Transcript, e: &Event) {
    let v = match &e.data {
        Data::Done => {
            t.ended = true;
            t.closed = true;
            return;
        }
        Data::Json(v) if v.get("error").is_none() => v,
        _ => return,
    };
    if !t.started {
        t.started = true;
        t.id = str_at(v, "id").map(str::to_string);
        t.model = str_at(v, "model").map(str::to_string);
        t.created = v.get("created").cloned();
    }
    for choice in v["choices"].as_array().into_iter().flatten() {
        if u64_at(choice, "index").unwrap_or(0) != 0 {
            t.unsupported = true;
            continue;
        }
        let d = &choice["delta"];
        if let Some(r) = REASONING.iter().find_map(|k| text_at(d, k)) {
            let i = block(t, Kind::Thinking);
            t.append(i, 0, r);
        }
        if let Some(c) = text_at(d, "content") {
            let i = block(t, Kind::Text);
            t.append(i, 0, c);
        }
        if let Some(calls) = d["tool_calls"].as_array().filter(|c| !c.is_empty()) {
            block(t, Kind::Tool);
            for call in calls {
                t.produced(str_at(&call["function"], "arguments").unwrap_or(""));
            }
        }
        if !choice["finish_reason"].is_null() {
            t.ended = true;
            for b in &mut t.blocks {
                b.open = false;
            }
        }
    }
}

/// Usage as Chat Completions reports it (cached tokens inside the prompt's).
pub(super) fn usage_json(u: Usage) -> Value {
    let prompt = u.input.saturating_add(u.cache_read).saturating_add(u.cache_write);
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": u.output,
        "total_tokens": prompt.saturating_add(u.output),
        "prompt_tokens_details": {"cached_tokens": u.cache_read},
    })
}

/// Whether an object has nothing but nulls.
fn empty(o: &Object<String, Value>) -> bool {
    o.values().all(Value::is_null)
}

/// A continuation's chunks mapped into the app's stream.
#[derive(Debug)]
pub(super) struct Map {
    /// The app's `id`, `model` and `created`, put on every chunk.
    id: Option<Value>,
    model: Option<Value>,
    created: Option<Value>,
    /// The app has content (the continuation's reasoning is dropped).
    answered: bool,
    /// The app asked for usage (`stream_options.include_usage`).
    wants_usage: bool,
    /// The continuation's `finish_reason` came.
    finished: bool,
}

impl Map {
    pub(super) fn new(app: &Transcript, request: &Value) -> Map {
        Map {
            id: app.id.clone().map(Value::from),
            model: app.model.clone().map(Value::from),
            created: app.created.clone(),
            answered: !app.blocks.is_empty(),
            wants_usage: request["stream_options"]["include_usage"].as_bool() == Some(true),
            finished: false,
        }
    }

    /// What to send the app for one of the continuation's chunks.
    pub(super) fn map(&mut self, e: &Event, raw: &[u8]) -> Result<Vec<Out>, SpliceError> {
        let v = match &e.data {
            Data::Done => return Ok(vec![Out::RunEnd, Out::Finish]),
            Data::Other => return Ok(vec![Out::Raw(raw.to_vec())]),
            Data::Json(v) if v.get("error").is_some_and(|e| !e.is_null()) => return Err(SpliceError::Cut),
            Data::Json(v) => v,
        };
        let mut v = v.clone();
        for (key, app) in [("id", &self.id), ("model", &self.model), ("created", &self.created)] {
            if let (Some(app), Some(slot)) = (app, v.get_mut(key)) {
                *slot = app.clone();
            }
        }
        // One choice (the app's); a chunk without one is the usage chunk, summed at the end.
        let Some(mut choice) = v["choices"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| u64_at(c, "index").unwrap_or(0) == 0))
            .cloned()
        else {
            return Ok(vec![]);
        };
        let Some(delta) = choice.get_mut("delta").and_then(Value::as_object_mut) else {
            return Ok(vec![]);
        };
        delta.remove("role");
        if self.answered {
            for key in REASONING {
                delta.remove(key);
            }
        }
        let content = delta.remove("content");
        let tools = delta.get("tool_calls").is_some_and(|t| !t.is_null());
        let rest = !empty(delta);
        let finish = !choice["finish_reason"].is_null();
        let mut out = Vec::new();
        if let Some(text) = content.as_ref().and_then(Value::as_str).filter(|t| !t.is_empty()) {
            let mut part = v.clone();
            let mut only = choice.clone();
            only["delta"] = json!({"content": ""});
            only["finish_reason"] = Value::Null;
            part["choices"] = json!([only]);
            out.push(Out::Text(e.name.clone(), part, text.to_string()));
            self.answered = true;
        }
        if tools || finish {
            out.push(Out::RunEnd);
        }
        if rest || finish {
            v["choices"] = json!([choice]);
            out.push(Out::Event(e.name.clone(), v));
        }
        self.finished |= finish;
        Ok(out)
    }

    /// The end: the summed usage chunk when the app asked for usage, and `[DONE]`.
    pub(super) fn finish(&mut self, total: Usage) -> Vec<Out> {
        let mut out = Vec::new();
        if self.wants_usage {
            let chunk = json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage_json(total),
            });
            out.push(Out::Event(String::new(), chunk));
        }
        out.push(Out::Raw(DONE.to_vec()));
        out
    }

    /// Whether the continuation's end is known (its `finish_reason` came) though its `[DONE]`
    /// did not.
    pub(super) fn ended(&self) -> bool {
        self.finished
    }
}

/// Sets the content of a chunk.
fn set_text(v: &mut Value, text: String) {
    v["choices"][0]["delta"]["content"] = text.into();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::continuation::{Dialect, How, Plan, Refusal};

    fn chunk(delta: &str, finish: &str) -> String {
        format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1730000000,\"model\":\"gpt-4o\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}]}}\n\n"
        )
    }

    fn transcript(chunks: &[String]) -> Transcript {
        let mut t = Transcript::new(Dialect::Chat);
        for c in chunks {
            t.observe(c.as_bytes());
        }
        t
    }

    #[test]
    fn content_reasoning_and_tool_calls_are_followed() {
        let role = chunk(r#"{"role":"assistant","content":"","refusal":null}"#, "null");
        let t = transcript(std::slice::from_ref(&role));
        assert_eq!(t.decide(b"{}", false), Plan::Continue(How::Restart));
        let t = transcript(&[role.clone(), chunk(r#"{"content":"Hello"}"#, "null")]);
        assert_eq!(t.text(), "Hello");
        assert_eq!(t.decide(b"{}", false), Plan::Continue(How::Turn));
        assert_eq!(t.decide(b"{}", true), Plan::Continue(How::Prefill));
        assert_eq!(t.decide(br#"{"n":2}"#, true), Plan::Refuse(Refusal::Unsupported));
        // Reasoning with no content after it: cut inside it.
        let reasoning = chunk(r#"{"reasoning_content":"Let me think"}"#, "null");
        let t = transcript(&[role.clone(), reasoning.clone()]);
        assert_eq!(t.decide(b"{}", false), Plan::Refuse(Refusal::Thinking));
        let t = transcript(&[role.clone(), reasoning, chunk(r#"{"content":"So"}"#, "null")]);
        assert_eq!(t.decide(b"{}", false), Plan::Continue(How::Turn));
        let call = r#"{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a"}}]}"#;
        let t = transcript(&[role.clone(), chunk(call, "null")]);
        assert_eq!(t.decide(b"{}", false), Plan::Refuse(Refusal::ToolCall));
        let t = transcript(&[role.clone(), chunk("{}", "\"stop\"")]);
        assert_eq!(t.decide(b"{}", false), Plan::Refuse(Refusal::Ended));
        let second = chunk(r#"{"content":"x"}"#, "null").replace("\"index\":0", "\"index\":1");
        let t = transcript(&[role, second]);
        assert_eq!(t.decide(b"{}", false), Plan::Refuse(Refusal::Unsupported));
    }
}
