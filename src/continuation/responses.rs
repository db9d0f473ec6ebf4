//! OpenAI Responses streams: `response.created` / `in_progress`, `response.output_item.added` /
//! `done` (`message`, `reasoning`, `function_call`, ...), `response.content_part.added` / `done`,
//! `response.output_text.delta` / `done`, `response.function_call_arguments.delta`,
//! `response.reasoning*`, and `response.completed` with the whole response; every event with a
//! `sequence_number`. What the app has of one ([`observe`]), and a continuation's events mapped
//! into it ([`Map`]):
//! - resumed (background mode): the same response's events after the app's last sequence
//!   number, as they come;
//! - else: its `response.created` / `in_progress` dropped; its first message item continuing the
//!   app's open one (the item's and the part's `added` dropped, its ids the app's), later items
//!   numbered after the app's, its reasoning dropped once the app has an item; every event's
//!   `sequence_number` following the app's; the `done` events' text the app's whole text; one
//!   `response.completed` with the app's response id, every item the app has, the summed usage.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::event::{str_at, u64_at, Data, Event};
use super::transcript::{Block, Kind, Transcript, MAX_PARTS};
use super::{DialectApi, Out, SpliceError};
use crate::wire::usage::Usage;

/// Responses, as a continuation reads and rewrites it.
pub(super) struct Responses;

impl DialectApi for Responses {
    fn observe(&self, t: &mut Transcript, event: &Event) {
        observe(t, event);
    }

    fn set_text(&self, value: &mut Value, text: String) {
        set_text(value, text);
    }
}

fn kind(item: &Value) -> Kind {
    match str_at(item, "type") {
        Some("message") => Kind::Text,
        Some("reasoning") => Kind::Thinking,
        _ => Kind::Tool,
    }
}

/// Updates the app's view with one event it received.
fn observe(t: &mut Transcript, e: &Event) {
    let Some(v) = e.json() else { return };
    t.sequence(v);
    let index = u64_at(v, "output_index").unwrap_or(0);
    let part = u64_at(v, "content_index").unwrap_or(0);
    match e.kind() {
        "response.created" | "response.queued" | "response.in_progress" => {
            let r = &v["response"];
            if !t.started {
                t.started = true;
                t.id = str_at(r, "id").map(str::to_string);
                t.model = str_at(r, "model").map(str::to_string);
                t.created = r.get("created_at").cloned();
            }
            t.background |= r["background"].as_bool() == Some(true);
        }
        "response.output_item.added" => t.open_block(index, kind(&v["item"]), Some(v["item"].clone())),
        "response.content_part.added" => {
            if let Some(b) = t.block_mut(index).filter(|_| part < MAX_PARTS) {
                b.part_open = Some(part);
                if b.parts.len() <= part as usize {
                    b.parts.resize(part as usize + 1, String::new());
                }
            }
        }
        "response.output_text.delta" => t.append(index, part, str_at(v, "delta").unwrap_or("")),
        "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
            t.append(index, 0, str_at(v, "delta").unwrap_or(""));
        }
        "response.function_call_arguments.delta" | "response.custom_tool_call_input.delta" => {
            t.produced(str_at(v, "delta").unwrap_or(""));
        }
        "response.content_part.done" => {
            if let Some(b) = t.block_mut(index) {
                b.part_open = None;
            }
        }
        "response.output_item.done" => {
            let item = &v["item"];
            // A message's text is kept in its parts; another item whole, within the cap.
            let keep = kind(item) == Kind::Text || t.keep(item.to_string().len());
            if let Some(b) = t.block_mut(index) {
                b.open = false;
                if keep && b.kind != Kind::Text {
                    b.item = Some(item.clone());
                }
            }
        }
        "response.completed" | "response.incomplete" | "response.failed" => {
            t.ended = true;
            t.closed = true;
        }
        _ => {}
    }
}

/// A message item as the app has it: its id and role as added, its text per part.
fn message(b: &Block) -> Value {
    let mut item = b
        .item
        .clone()
        .unwrap_or_else(|| json!({"type": "message", "role": "assistant"}));
    item["status"] = "completed".into();
    item["content"] = b
        .parts
        .iter()
        .map(|text| json!({"type": "output_text", "annotations": [], "text": text}))
        .collect();
    item
}

/// The item the app has at a block.
fn item(b: &Block) -> Value {
    match b.kind {
        Kind::Text => message(b),
        _ => b.item.clone().unwrap_or(Value::Null),
    }
}

/// Sets the counts of a usage object (Responses' fields; cached tokens inside the input's).
fn usage_into(slot: &mut Value, u: Usage) {
    if !slot.is_object() {
        *slot = json!({"output_tokens_details": {"reasoning_tokens": 0}});
    }
    let input = u.input.saturating_add(u.cache_read).saturating_add(u.cache_write);
    slot["input_tokens"] = input.into();
    slot["input_tokens_details"] = json!({"cached_tokens": u.cache_read});
    slot["output_tokens"] = u.output.into();
    slot["total_tokens"] = input.saturating_add(u.output).into();
}

/// The app's message item left open by the cut.
#[derive(Debug, Clone)]
struct Open {
    index: u64,
    id: Value,
    part_open: Option<u64>,
    parts: u64,
}

impl Open {
    /// Its closing events (their texts and sequence numbers filled when sent).
    fn close(&self) -> Vec<Out> {
        let (index, id) = (self.index, &self.id);
        let mut out = Vec::new();
        if let Some(part) = self.part_open {
            let at = json!({"sequence_number": 0, "item_id": id, "output_index": index, "content_index": part});
            let mut done = at.clone();
            done["type"] = "response.output_text.done".into();
            done["text"] = "".into();
            out.push(Out::Event("response.output_text.done".into(), done));
            let mut part = at;
            part["type"] = "response.content_part.done".into();
            part["part"] = json!({"type": "output_text", "annotations": [], "text": ""});
            out.push(Out::Event("response.content_part.done".into(), part));
        }
        let item = json!({"type": "response.output_item.done", "sequence_number": 0, "output_index": index,
            "item": {"id": id, "type": "message", "status": "completed", "role": "assistant", "content": []}});
        out.push(Out::Event("response.output_item.done".into(), item));
        out
    }
}

/// A continuation's events mapped into the app's stream.
#[derive(Debug)]
pub(super) struct Map {
    /// The same response, resumed after `after`.
    resume: bool,
    after: Option<u64>,
    /// The continuation's output indexes: where each goes in the app's (`None`: dropped).
    items: HashMap<u64, Option<u64>>,
    /// The continuation's item ids that are the app's.
    ids: HashMap<String, Value>,
    /// The continuation's content parts (output index, content index) that go elsewhere.
    parts: HashMap<(u64, u64), u64>,
    /// The app's next free output index.
    next: u64,
    /// The app's open message item, until a continuation's item continues or follows it.
    open: Option<Open>,
    /// The continuation's item that continues it, and that item (its parts numbered after).
    continued: Option<(u64, Open)>,
    /// The continuation's first output text part (the seam's run), once seen.
    run: Option<(u64, u64)>,
    /// The app has an item already (the continuation's reasoning is dropped).
    answered: bool,
    /// The continuation's final event: its type and its response.
    response: Option<(String, Value)>,
}

impl Map {
    pub(super) fn new(app: &Transcript, resume: bool) -> Map {
        let open = app
            .blocks
            .iter()
            .rev()
            .find(|b| b.open && b.kind == Kind::Text)
            .map(|b| Open {
                index: b.index,
                id: b.item.as_ref().map_or(Value::Null, |i| i["id"].clone()),
                part_open: b.part_open,
                parts: b.parts.len() as u64,
            });
        Map {
            resume,
            after: app.last_seq,
            items: HashMap::new(),
            ids: HashMap::new(),
            parts: HashMap::new(),
            next: app.blocks.iter().map(|b| b.index.saturating_add(1)).max().unwrap_or(0),
            open,
            continued: None,
            run: None,
            answered: !app.blocks.is_empty(),
            response: None,
        }
    }

    /// What to send the app for one of the continuation's events.
    pub(super) fn map(&mut self, e: &Event, raw: &[u8]) -> Result<Vec<Out>, SpliceError> {
        let v = match &e.data {
            Data::Json(v) => v,
            Data::Done => return Ok(vec![]),
            Data::Other => return Ok(vec![Out::Raw(raw.to_vec())]),
        };
        let kind = e.kind();
        if matches!(kind, "error" | "response.failed") {
            return Err(SpliceError::Cut);
        }
        if self.resume {
            let seq = u64_at(v, "sequence_number");
            if seq.is_some_and(|s| self.after.is_some_and(|a| s <= a)) {
                return Ok(vec![]);
            }
            let end = matches!(kind, "response.completed" | "response.incomplete");
            let mut out = vec![Out::Raw(raw.to_vec())];
            if end {
                out.push(Out::Finish);
            }
            return Ok(out);
        }
        let mut v = v.clone();
        let out = match kind {
            "response.created" | "response.in_progress" | "response.queued" => vec![],
            "response.completed" | "response.incomplete" => {
                self.response = Some((kind.to_string(), v["response"].take()));
                vec![Out::RunEnd, Out::Finish]
            }
            "response.output_item.added" => self.added(e, v),
            "response.content_part.added" => self.part_added(e, v),
            _ => {
                let at = (
                    u64_at(&v, "output_index").unwrap_or(0),
                    u64_at(&v, "content_index").unwrap_or(0),
                );
                if !self.remap(&mut v) {
                    return Ok(vec![]);
                }
                let run = self.run == Some(at);
                match (kind, str_at(&v, "delta").map(str::to_string)) {
                    ("response.output_text.delta", Some(text)) if run => vec![Out::Text(e.name.clone(), v, text)],
                    ("response.output_text.done", _) if run => vec![Out::RunEnd, Out::Event(e.name.clone(), v)],
                    _ => vec![Out::Event(e.name.clone(), v)],
                }
            }
        };
        Ok(out)
    }

    /// Puts the app's output index, item id and content index on an event: false when its item
    /// is dropped.
    fn remap(&self, v: &mut Value) -> bool {
        let Some(index) = u64_at(v, "output_index") else {
            return true;
        };
        match self.items.get(&index) {
            Some(None) => return false,
            Some(Some(j)) => v["output_index"] = (*j).into(),
            None => {}
        }
        if let Some(id) = str_at(v, "item_id").and_then(|id| self.ids.get(id)) {
            v["item_id"] = id.clone();
        }
        if let Some(part) = u64_at(v, "content_index").and_then(|c| self.parts.get(&(index, c))) {
            v["content_index"] = (*part).into();
        }
        if let Some(id) = v["item"]["id"].as_str().and_then(|id| self.ids.get(id)) {
            v["item"]["id"] = id.clone();
        }
        true
    }

    fn added(&mut self, e: &Event, mut v: Value) -> Vec<Out> {
        let index = u64_at(&v, "output_index").unwrap_or(0);
        let item_kind = kind(&v["item"]);
        if item_kind == Kind::Thinking && self.answered {
            self.items.insert(index, None);
            return vec![];
        }
        if item_kind == Kind::Text && self.run.is_none() && self.continued.is_none() {
            if let Some(open) = self.open.take() {
                // It continues the app's open item: the app saw that one added.
                self.items.insert(index, Some(open.index));
                if let Some(id) = str_at(&v["item"], "id") {
                    self.ids.insert(id.to_string(), open.id.clone());
                }
                self.continued = Some((index, open));
                return vec![];
            }
        }
        let mut out = self.open.take().map(|o| o.close()).unwrap_or_default();
        let j = self.next;
        self.next = j.saturating_add(1);
        self.items.insert(index, Some(j));
        v["output_index"] = j.into();
        out.push(Out::Event(e.name.clone(), v));
        out
    }

    fn part_added(&mut self, e: &Event, mut v: Value) -> Vec<Out> {
        let at = (
            u64_at(&v, "output_index").unwrap_or(0),
            u64_at(&v, "content_index").unwrap_or(0),
        );
        let text = str_at(&v["part"], "type") == Some("output_text");
        let first = text && self.run.is_none();
        if first {
            self.run = Some(at);
        }
        if let Some((_, open)) = self.continued.as_mut().filter(|(i, _)| *i == at.0) {
            match open.part_open.take() {
                Some(part) if first => {
                    // It continues the app's open part.
                    self.parts.insert(at, part);
                    return vec![];
                }
                _ => {
                    self.parts.insert(at, open.parts);
                    open.parts = open.parts.saturating_add(1);
                }
            }
        }
        if !self.remap(&mut v) {
            return vec![];
        }
        vec![Out::Event(e.name.clone(), v)]
    }

    /// The end: the app's item if still open closed, and one final event with the app's response
    /// id, every item the app has, and `total` (none when resumed: the response's own came).
    pub(super) fn finish(&mut self, total: Usage, app: &Transcript) -> Vec<Out> {
        if self.resume {
            return vec![];
        }
        let mut out = self.open.take().map(|o| o.close()).unwrap_or_default();
        let (kind, mut response) = self.response.take().unwrap_or_else(|| {
            (
                "response.completed".into(),
                json!({"object": "response", "status": "completed"}),
            )
        });
        if !response.is_object() {
            response = json!({"object": "response", "status": "completed"});
        }
        if let Some(id) = &app.id {
            response["id"] = id.clone().into();
        }
        if let Some(created) = &app.created {
            response["created_at"] = created.clone();
        }
        response["output"] = app.blocks.iter().map(item).collect();
        usage_into(&mut response["usage"], total);
        let event = json!({"type": kind, "sequence_number": 0, "response": response});
        out.push(Out::Event(kind, event));
        out
    }

    /// Fills an event about to be sent: the next sequence number, and the app's whole text in a
    /// message's `done` events.
    pub(super) fn fill(&self, app: &Transcript, v: &mut Value) {
        if self.resume {
            return;
        }
        if v.get("sequence_number").is_some() {
            v["sequence_number"] = app.last_seq.map_or(0, |s| s.saturating_add(1)).into();
        }
        let index = u64_at(v, "output_index").unwrap_or(0);
        let Some(b) = app
            .blocks
            .iter()
            .rev()
            .find(|b| b.index == index && b.kind == Kind::Text)
        else {
            return;
        };
        let part = u64_at(v, "content_index").unwrap_or(0) as usize;
        let text = b.parts.get(part).cloned().unwrap_or_default();
        match str_at(v, "type") {
            Some("response.output_text.done") => v["text"] = text.into(),
            Some("response.content_part.done") => v["part"]["text"] = text.into(),
            Some("response.output_item.done") => {
                let mut item = message(b);
                item["id"] = v["item"]["id"].clone();
                v["item"] = item;
            }
            _ => {}
        }
    }
}

/// Sets the text of an `output_text.delta`.
fn set_text(v: &mut Value, text: String) {
    v["delta"] = text.into();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::continuation::{Dialect, How, Plan, Refusal};

    fn ev(kind: &str, seq: u64, rest: &str) -> String {
        format!("event: {kind}\ndata: {{\"type\":\"{kind}\",\"sequence_number\":{seq}{rest}}}\n\n")
    }

    fn transcript(events: &[String]) -> Transcript {
        let mut t = Transcript::new(Dialect::Responses);
        for e in events {
            t.observe(e.as_bytes());
        }
        t
    }

    fn created(background: bool) -> String {
        let r = format!(",\"response\":{{\"id\":\"resp_1\",\"object\":\"response\",\"created_at\":1730000000,\"status\":\"in_progress\",\"background\":{background},\"model\":\"gpt-4.1\",\"output\":[],\"usage\":null}}");
        ev("response.created", 0, &r)
    }

    #[test]
    fn items_text_and_the_cursor_are_followed() {
        let text = [
            created(false),
            ev("response.output_item.added", 1, ",\"output_index\":0,\"item\":{\"id\":\"msg_1\",\"type\":\"message\",\"status\":\"in_progress\",\"content\":[],\"role\":\"assistant\"}"),
            ev("response.content_part.added", 2, ",\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"annotations\":[],\"text\":\"\"}"),
            ev("response.output_text.delta", 3, ",\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi there\""),
        ];
        let t = transcript(&text);
        assert_eq!(t.text(), "Hi there");
        assert_eq!(t.last_seq, Some(3));
        assert_eq!(
            t.decide(b"{}", true),
            Plan::Continue(How::Turn),
            "no prefill in Responses"
        );
        assert_eq!(t.resume_path(), None);
        let mut background = text.clone();
        background[0] = created(true);
        let t = transcript(&background);
        assert_eq!(t.decide(b"{}", false), Plan::Continue(How::Resume));
        assert_eq!(
            t.resume_path().as_deref(),
            Some("/v1/responses/resp_1?stream=true&starting_after=3")
        );
        let call = ev("response.output_item.added", 1, ",\"output_index\":0,\"item\":{\"id\":\"fc_1\",\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"f\",\"arguments\":\"\"}");
        let t = transcript(&[created(false), call.clone()]);
        assert_eq!(t.decide(b"{}", false), Plan::Refuse(Refusal::ToolCall));
        // Resumed, the same generation goes on: a cut inside a tool call is no reason.
        let t = transcript(&[created(true), call]);
        assert_eq!(t.decide(b"{}", false), Plan::Continue(How::Resume));
        let reasoning = ev(
            "response.output_item.added",
            1,
            ",\"output_index\":0,\"item\":{\"id\":\"rs_1\",\"type\":\"reasoning\",\"summary\":[]}",
        );
        let t = transcript(&[created(false), reasoning]);
        assert_eq!(t.decide(b"{}", false), Plan::Refuse(Refusal::Thinking));
    }

    #[test]
    fn a_responses_stream_with_its_item_and_part_events_keeps_its_text() {
        let mut t = Transcript::new(super::super::Dialect::Responses);
        for e in [
            r#"{"type":"response.created","response":{"id":"resp_fake","status":"in_progress","background":false,"model":"m","output":[]},"sequence_number":0}"#,
            r#"{"type":"response.in_progress","response":{"id":"resp_fake","status":"in_progress","background":false,"model":"m","output":[]},"sequence_number":1}"#,
            r#"{"item":{"content":[],"id":"msg_fake","role":"assistant","status":"in_progress","type":"message"},"output_index":0,"sequence_number":2,"type":"response.output_item.added"}"#,
            r#"{"content_index":0,"item_id":"msg_fake","output_index":0,"part":{"annotations":[],"text":"","type":"output_text"},"sequence_number":3,"type":"response.content_part.added"}"#,
            r#"{"content_index":0,"delta":"token0 ","item_id":"msg_fake","output_index":0,"sequence_number":4,"type":"response.output_text.delta"}"#,
        ] {
            let name = serde_json::from_str::<serde_json::Value>(e).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_string();
            t.observe(format!("event: {name}\ndata: {e}\n\n").as_bytes());
        }
        assert_eq!(t.text(), "token0 ");
        assert_eq!(
            t.decide(br#"{"model":"m","stream":true,"input":"count"}"#, false),
            super::super::Plan::Continue(super::super::How::Turn)
        );
    }
}
