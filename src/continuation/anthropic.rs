//! Anthropic Messages streams: `message_start`, `content_block_start` / `_delta` / `_stop`,
//! `ping`, `message_delta` (the stop reason, the usage), `message_stop`, `error`. What the app has
//! of one ([`observe`]), and a continuation's events mapped into it ([`Map`]): its
//! `message_start` dropped, its first text block continuing the app's open one (its
//! `content_block_start` dropped), later blocks numbered after the app's, its thinking dropped
//! once the app has a block, one `message_delta` with the summed usage and one `message_stop`
//! at the end.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::event::{str_at, u64_at, Data, Event};
use super::transcript::{Kind, Transcript};
use super::{DialectApi, Out, SpliceError};
use crate::wire::usage::Usage;

/// Messages, as a continuation reads and rewrites it.
pub(super) struct Messages;

impl DialectApi for Messages {
    fn observe(&self, t: &mut Transcript, event: &Event) {
        observe(t, event);
    }

    fn set_text(&self, value: &mut Value, text: String) {
        set_text(value, text);
    }
}

fn kind(block: &Value) -> Kind {
    match str_at(block, "type") {
        Some("text") => Kind::Text,
        Some("thinking" | "redacted_thinking") => Kind::Thinking,
        _ => Kind::Tool,
    }
}

/// Updates the app's view with one event it received.
fn observe(t: &mut Transcript, e: &Event) {
    let Some(v) = e.json() else { return };
    let index = u64_at(v, "index").unwrap_or(0);
    match e.kind() {
        "message_start" => {
            t.started = true;
            let m = &v["message"];
            t.id = str_at(m, "id").map(str::to_string);
            t.model = str_at(m, "model").map(str::to_string);
        }
        "content_block_start" => {
            let block = &v["content_block"];
            t.open_block(index, kind(block), None);
            if let Some(text) = str_at(block, "text").or_else(|| str_at(block, "thinking")) {
                t.append(index, 0, text);
            }
        }
        "content_block_delta" => {
            let d = &v["delta"];
            match str_at(d, "type") {
                Some("text_delta") => t.append(index, 0, str_at(d, "text").unwrap_or("")),
                Some("thinking_delta") => t.append(index, 0, str_at(d, "thinking").unwrap_or("")),
                Some("input_json_delta") => t.produced(str_at(d, "partial_json").unwrap_or("")),
                _ => {}
            }
        }
        "content_block_stop" => {
            if let Some(b) = t.block_mut(index) {
                b.open = false;
            }
        }
        "message_delta" => t.ended |= !v["delta"]["stop_reason"].is_null(),
        "message_stop" => {
            t.ended = true;
            t.closed = true;
        }
        _ => {}
    }
}

/// Usage as Anthropic reports it.
pub(super) fn usage_json(u: Usage) -> Value {
    json!({
        "input_tokens": u.input,
        "cache_creation_input_tokens": u.cache_write,
        "cache_read_input_tokens": u.cache_read,
        "output_tokens": u.output,
    })
}

fn stop(index: u64) -> Out {
    Out::Event(
        "content_block_stop".into(),
        json!({"type": "content_block_stop", "index": index}),
    )
}

/// A continuation's events mapped into the app's message.
#[derive(Debug)]
pub(super) struct Map {
    /// The continuation's block indexes: where each goes in the app's message (`None`: dropped).
    blocks: HashMap<u64, Option<u64>>,
    /// The app's next free index.
    next: u64,
    /// The app's text block left open by the cut, until it is continued or closed.
    open: Option<u64>,
    /// The continuation's block whose text meets the partial at the seam.
    run: Option<u64>,
    /// The app has a block already (the continuation's thinking is dropped).
    answered: bool,
    /// The continuation's `message_delta`, sent at the end with the summed usage.
    delta: Option<Value>,
}

impl Map {
    pub(super) fn new(app: &Transcript) -> Map {
        Map {
            blocks: HashMap::new(),
            next: app.blocks.iter().map(|b| b.index.saturating_add(1)).max().unwrap_or(0),
            open: app
                .blocks
                .iter()
                .rev()
                .find(|b| b.open && b.kind == Kind::Text)
                .map(|b| b.index),
            run: None,
            answered: !app.blocks.is_empty(),
            delta: None,
        }
    }

    /// What to send the app for one of the continuation's events.
    pub(super) fn map(&mut self, e: &Event, raw: &[u8]) -> Result<Vec<Out>, SpliceError> {
        let Data::Json(v) = &e.data else {
            return Ok(vec![Out::Raw(raw.to_vec())]);
        };
        let mut v = v.clone();
        let index = u64_at(&v, "index");
        let out = match (e.kind(), index) {
            ("message_start", _) => vec![],
            ("ping", _) => vec![Out::Raw(raw.to_vec())],
            ("error", _) => return Err(SpliceError::Cut),
            ("content_block_start", Some(i)) => self.start(i, v),
            ("content_block_delta", Some(i)) => match self.blocks.get(&i) {
                Some(Some(j)) => {
                    v["index"] = (*j).into();
                    let text = str_at(&v["delta"], "text").map(str::to_string);
                    match text {
                        Some(text) if self.run == Some(i) => vec![Out::Text(e.name.clone(), v, text)],
                        _ => vec![Out::Event(e.name.clone(), v)],
                    }
                }
                _ => vec![],
            },
            ("content_block_stop", Some(i)) => match self.blocks.get(&i) {
                Some(Some(j)) if self.run == Some(i) => vec![Out::RunEnd, stop(*j)],
                Some(Some(j)) => vec![stop(*j)],
                _ => vec![],
            },
            ("message_delta", _) => {
                self.delta = Some(v);
                vec![]
            }
            ("message_stop", _) => vec![Out::RunEnd, Out::Finish],
            _ => vec![Out::Event(e.name.clone(), v)],
        };
        Ok(out)
    }

    fn start(&mut self, i: u64, mut v: Value) -> Vec<Out> {
        let kind = kind(&v["content_block"]);
        if kind == Kind::Thinking && self.answered {
            self.blocks.insert(i, None);
            return vec![];
        }
        let run = kind == Kind::Text && self.run.is_none();
        let mut out = Vec::new();
        // The run continues the app's open block: the app saw that one start.
        let continued = if run { self.open.take() } else { None };
        let j = match continued {
            Some(open) => open,
            None => {
                out.extend(self.open.take().map(stop));
                let j = self.next;
                self.next = j.saturating_add(1);
                j
            }
        };
        self.blocks.insert(i, Some(j));
        // Text in the run's start goes through the seam like its deltas.
        let mut text = None;
        if run {
            self.run = Some(i);
            text = str_at(&v["content_block"], "text")
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            v["content_block"]["text"] = "".into();
        }
        if continued.is_none() {
            v["index"] = j.into();
            out.push(Out::Event("content_block_start".into(), v));
        }
        if let Some(text) = text {
            let delta = json!({"type": "content_block_delta", "index": j, "delta": {"type": "text_delta", "text": ""}});
            out.push(Out::Text("content_block_delta".into(), delta, text));
        }
        out
    }

    /// The end: the app's block if still open closed, one `message_delta` with `total`, one
    /// `message_stop`.
    pub(super) fn finish(&mut self, total: Usage) -> Vec<Out> {
        let mut out = Vec::new();
        if let Some(open) = self.open.take() {
            out.push(stop(open));
        }
        let mut delta = self.delta.take().unwrap_or_else(
            || json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}}),
        );
        delta["usage"] = usage_json(total);
        out.push(Out::Event("message_delta".into(), delta));
        out.push(Out::Event("message_stop".into(), json!({"type": "message_stop"})));
        out
    }

    /// Whether the continuation's end is known (its `message_delta` came) though its
    /// `message_stop` did not.
    pub(super) fn ended(&self) -> bool {
        self.delta.is_some()
    }
}

/// Sets the text of a `text_delta` event.
fn set_text(v: &mut Value, text: String) {
    v["delta"]["text"] = text.into();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::continuation::{Dialect, How, Plan, Refusal};

    fn feed(t: &mut Transcript, events: &str) {
        let mut f = crate::continuation::Framer::default();
        f.push(events.as_bytes());
        while let Some(e) = f.next_event() {
            t.observe(&e);
        }
    }

    const START: &str = concat!(
        "event: message_start\r\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",",
        "\"model\":\"claude-sonnet-4-5\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":25,",
        "\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\r\n\r\n",
    );

    #[test]
    fn the_transcript_follows_blocks_text_and_usage() {
        let mut t = Transcript::new(Dialect::Messages);
        feed(&mut t, START);
        feed(
            &mut t,
            concat!(
                "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
                "event: ping\ndata: {\"type\": \"ping\"}\n\n",
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\n",
                "data: \"delta\":{\"type\":\"text_delta\",\"text\":\" world\"}}\n\n",
            ),
        );
        assert_eq!(t.id.as_deref(), Some("msg_01"));
        assert_eq!(t.text(), "Hello world");
        assert!(t.blocks[0].open);
        assert_eq!(
            t.decide(b"{\"model\":\"c\",\"max_tokens\":9}", true),
            Plan::Continue(How::Prefill)
        );
        assert_eq!(
            t.decide(b"{\"model\":\"c\",\"max_tokens\":9}", false),
            Plan::Continue(How::Turn)
        );
        let thinking = br#"{"model":"c","max_tokens":9,"thinking":{"type":"enabled","budget_tokens":4}}"#;
        assert_eq!(
            t.decide(thinking, true),
            Plan::Continue(How::Turn),
            "no prefill with thinking"
        );
        assert_eq!(t.decide(b"not json", true), Plan::Refuse(Refusal::Unsupported));
        feed(
            &mut t,
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":3}}\n\n",
        );
        assert_eq!(t.decide(b"{}", true), Plan::Refuse(Refusal::Ended));
    }

    #[test]
    fn cuts_inside_a_tool_call_or_thinking_are_refused() {
        let tool = concat!(
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \\\"Par\"}}\n\n",
        );
        let mut t = Transcript::new(Dialect::Messages);
        feed(&mut t, START);
        feed(&mut t, tool);
        assert_eq!(t.decide(b"{}", true), Plan::Refuse(Refusal::ToolCall));
        let thinking = concat!(
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Let me\"}}\n\n",
        );
        let mut t = Transcript::new(Dialect::Messages);
        feed(&mut t, START);
        feed(&mut t, thinking);
        assert_eq!(t.decide(b"{}", true), Plan::Refuse(Refusal::Thinking));
        // Closed, it is no reason: the text after it is continued (nothing yet: restarted).
        feed(
            &mut t,
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        );
        assert_eq!(t.decide(b"{}", true), Plan::Continue(How::Restart));
        // Nothing reached the app: not continued.
        let t = Transcript::new(Dialect::Messages);
        assert_eq!(t.decide(b"{}", true), Plan::Refuse(Refusal::NotStarted));
    }
}
