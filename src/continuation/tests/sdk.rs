//! A stream read as an SDK reads it, strictly: every rule the official SDKs' stream accumulators
//! rely on is asserted (one message start, block indexes in order, deltas and stops only for open
//! blocks, one end), and what they accumulate returned.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::continuation::event::{Data, Event, Framer};

/// What an SDK makes of a stream.
#[derive(Debug, Default)]
pub(super) struct Read {
    /// The text of every text block (message item, content), in order.
    pub(super) text: String,
    /// Each block's type, in order.
    pub(super) blocks: Vec<String>,
    /// Thinking text (Anthropic).
    pub(super) thinking: String,
    /// The message's id.
    pub(super) id: String,
    /// The final usage object.
    pub(super) usage: Value,
    /// The final response object (Responses).
    pub(super) response: Value,
}

/// The events of a stream, comments and keep-alives left out (as SDKs skip them).
pub(super) fn events(stream: &[u8]) -> Vec<Event> {
    let mut f = Framer::default();
    f.push(stream);
    let mut out = Vec::new();
    while let Some(bytes) = f.next_event() {
        let e = Event::parse(&bytes);
        if e.data != Data::Other || !e.name.is_empty() {
            out.push(e);
        }
    }
    assert_eq!(f.held(), 0, "the stream ends with a whole event");
    out
}

fn index(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key}: {v}"))
}

/// An Anthropic Messages stream.
pub(super) fn anthropic(stream: &[u8]) -> Read {
    let events = events(stream);
    let mut read = Read::default();
    let mut open = BTreeSet::new();
    let mut delta = None;
    for (k, e) in events.iter().enumerate() {
        let v = e.json().unwrap_or_else(|| panic!("not JSON: {e:?}"));
        assert_eq!(e.name, e.kind(), "the event's name is its type");
        match e.kind() {
            "message_start" => {
                assert_eq!(k, 0, "one message_start, the first event");
                read.id = v["message"]["id"].as_str().unwrap().to_string();
            }
            "content_block_start" => {
                let i = index(v, "index");
                assert_eq!(i as usize, read.blocks.len(), "blocks start in order: {v}");
                read.blocks
                    .push(v["content_block"]["type"].as_str().unwrap().to_string());
                open.insert(i);
            }
            "content_block_delta" => {
                let i = index(v, "index");
                assert!(open.contains(&i), "a delta for a block not open: {v}");
                let d = &v["delta"];
                match d["type"].as_str().unwrap() {
                    "text_delta" => read.text.push_str(d["text"].as_str().unwrap()),
                    "thinking_delta" => read.thinking.push_str(d["thinking"].as_str().unwrap()),
                    _ => {}
                }
            }
            "content_block_stop" => assert!(open.remove(&index(v, "index")), "a stop for a block not open: {v}"),
            "message_delta" => {
                assert!(delta.is_none(), "one message_delta");
                assert!(
                    open.is_empty(),
                    "every block stopped before the message_delta: {open:?}"
                );
                delta = Some(v.clone());
                read.usage = v["usage"].clone();
            }
            "message_stop" => {
                assert_eq!(k, events.len() - 1, "message_stop ends the stream");
                assert!(delta.is_some(), "a message_delta before it");
            }
            "ping" => {}
            other => panic!("an event the app should not see: {other}"),
        }
    }
    assert_eq!(events.last().map(Event::kind), Some("message_stop"));
    read
}

/// An OpenAI Chat Completions stream.
pub(super) fn chat(stream: &[u8]) -> Read {
    let events = events(stream);
    let mut read = Read::default();
    let mut finished = false;
    let (last, chunks) = events.split_last().unwrap();
    assert_eq!(last.data, Data::Done, "[DONE] ends the stream");
    for (k, e) in chunks.iter().enumerate() {
        let v = e.json().unwrap_or_else(|| panic!("not a chunk: {e:?}"));
        let id = v["id"].as_str().unwrap();
        if k == 0 {
            read.id = id.to_string();
        }
        assert_eq!(id, read.id, "one id");
        assert_eq!(v["object"], "chat.completion.chunk");
        let choices = v["choices"].as_array().unwrap();
        if choices.is_empty() {
            assert!(finished && k == chunks.len() - 1, "the usage chunk is the last");
            read.usage = v["usage"].clone();
            continue;
        }
        assert!(!finished, "nothing after the finish but the usage: {v}");
        let c = &choices[0];
        assert_eq!(c["index"], 0);
        assert_eq!(
            c["delta"].get("role").is_some(),
            k == 0,
            "the role in the first chunk only: {v}"
        );
        if let Some(text) = c["delta"]["content"].as_str() {
            read.text.push_str(text);
        }
        finished = !c["finish_reason"].is_null();
    }
    assert!(finished, "one finish_reason");
    assert_eq!(events.iter().filter(|e| e.data == Data::Done).count(), 1);
    read
}

/// An OpenAI Responses stream.
pub(super) fn responses(stream: &[u8]) -> Read {
    let events = events(stream);
    let mut read = Read::default();
    let mut items: Vec<(String, bool)> = Vec::new();
    let mut texts: Vec<String> = Vec::new();
    for (k, e) in events.iter().enumerate() {
        let v = e.json().unwrap_or_else(|| panic!("not JSON: {e:?}"));
        assert_eq!(
            index(v, "sequence_number"),
            k as u64,
            "sequence numbers follow each other: {v}"
        );
        let at = v["output_index"].as_u64().map(|i| i as usize);
        match e.kind() {
            "response.created" => {
                assert_eq!(k, 0, "one response.created, the first");
                read.id = v["response"]["id"].as_str().unwrap().to_string();
            }
            "response.in_progress" => assert_eq!(v["response"]["id"], read.id.as_str()),
            "response.output_item.added" => {
                assert_eq!(at, Some(items.len()), "items added in order: {v}");
                items.push((v["item"]["id"].as_str().unwrap().to_string(), true));
                read.blocks.push(v["item"]["type"].as_str().unwrap().to_string());
                texts.push(String::new());
            }
            "response.output_item.done" => {
                let i = at.unwrap();
                assert!(items[i].1, "done once");
                items[i].1 = false;
                assert_eq!(v["item"]["id"], items[i].0.as_str());
                if v["item"]["type"] == "message" {
                    assert_eq!(
                        v["item"]["content"][0]["text"],
                        texts[i].as_str(),
                        "the item's whole text"
                    );
                }
            }
            "response.completed" => {
                assert_eq!(k, events.len() - 1, "response.completed ends the stream");
                assert!(items.iter().all(|(_, open)| !open), "every item done");
                let r = &v["response"];
                assert_eq!(r["id"], read.id.as_str());
                let output = r["output"].as_array().unwrap();
                assert_eq!(output.len(), items.len());
                for (i, item) in output.iter().enumerate() {
                    assert_eq!(item["id"], items[i].0.as_str());
                    if item["type"] == "message" {
                        assert_eq!(item["content"][0]["text"], texts[i].as_str());
                    }
                }
                read.usage = r["usage"].clone();
                read.response = r.clone();
            }
            kind => {
                let i = at.unwrap_or_else(|| panic!("an event the app should not see: {v}"));
                assert!(items[i].1, "an event for an item not open: {v}");
                if let Some(id) = v["item_id"].as_str() {
                    assert_eq!(id, items[i].0, "the item's id");
                }
                match kind {
                    "response.output_text.delta" => {
                        let d = v["delta"].as_str().unwrap();
                        texts[i].push_str(d);
                        read.text.push_str(d);
                    }
                    "response.output_text.done" => assert_eq!(v["text"], texts[i].as_str()),
                    "response.content_part.done" => assert_eq!(v["part"]["text"], texts[i].as_str()),
                    _ => {}
                }
            }
        }
    }
    assert_eq!(events.last().map(Event::kind), Some("response.completed"));
    read
}
