//! Server-sent events as a continuation reads and writes them: whole events cut from a stream's
//! bytes ([`Framer`]), one event's name and data ([`Event`], read with `wire::sse`), and events
//! written back (`event:` and one `data:` line, `\n` terminators).

use serde_json::Value;

use crate::wire::sse::{event_fields, EventEnd};

/// Cuts a stream's bytes into whole events, fed in order: what the pipeline forwards to the app
/// when a route continues streams (an event is never split between two attempts' bytes).
#[derive(Debug, Default)]
pub(crate) struct Framer {
    /// Bytes of events not complete yet.
    buf: Vec<u8>,
    /// How much of `buf` the finder has seen.
    scanned: usize,
    end: EventEnd,
}

impl Framer {
    /// Adds the stream's next bytes.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole event (its bytes as they came, terminators included), once its blank line
    /// is in.
    pub(crate) fn next_event(&mut self) -> Option<Vec<u8>> {
        let found = self.end.feed(&self.buf[self.scanned..]);
        let Some(at) = found else {
            self.scanned = self.buf.len();
            return None;
        };
        let mut end = self.scanned + at;
        // The `\n` of a final `\r\n`, when it is in already.
        if self.buf[end - 1] == b'\r' && self.buf.get(end) == Some(&b'\n') {
            end += 1;
        }
        self.scanned = 0;
        self.end = EventEnd::default();
        let rest = self.buf.split_off(end);
        Some(std::mem::replace(&mut self.buf, rest))
    }

    /// The bytes held (an event not complete yet), taken: what a stream that ended left.
    pub(crate) fn take_held(&mut self) -> Option<Vec<u8>> {
        self.scanned = 0;
        self.end = EventEnd::default();
        (!self.buf.is_empty()).then(|| std::mem::take(&mut self.buf))
    }

    /// The bytes held: an event not complete yet (the caller bounds it).
    pub(crate) fn held(&self) -> usize {
        self.buf.len()
    }
}

/// What an event's data is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Data {
    Json(Value),
    /// OpenAI's `[DONE]`.
    Done,
    /// Anything else: no data (a comment, a keep-alive), or data that is not JSON.
    Other,
}

/// One event, read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Event {
    /// Its `event` field (empty when it has none: OpenAI's chat chunks).
    pub(crate) name: String,
    pub(crate) data: Data,
}

impl Event {
    pub(crate) fn parse(bytes: &[u8]) -> Event {
        let (name, data) = event_fields(bytes);
        let data = if data.trim_ascii() == b"[DONE]" {
            Data::Done
        } else {
            serde_json::from_slice(&data).map_or(Data::Other, Data::Json)
        };
        Event {
            name: String::from_utf8_lossy(name).into_owned(),
            data,
        }
    }

    /// Its type: the data's `type`, else its name.
    pub(crate) fn kind(&self) -> &str {
        match &self.data {
            Data::Json(v) => v.get("type").and_then(Value::as_str).unwrap_or(&self.name),
            _ => &self.name,
        }
    }

    pub(crate) fn json(&self) -> Option<&Value> {
        match &self.data {
            Data::Json(v) => Some(v),
            _ => None,
        }
    }
}

/// An event with this name (none when empty) and JSON data.
pub(crate) fn encode(name: &str, data: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    if !name.is_empty() {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    // Writing a `Value` cannot fail.
    out.extend_from_slice(&serde_json::to_vec(data).unwrap_or_default());
    out.extend_from_slice(b"\n\n");
    out
}

/// OpenAI's end of a stream.
pub(crate) const DONE: &[u8] = b"data: [DONE]\n\n";

/// The unsigned integer at `key` of a JSON object.
pub(crate) fn u64_at(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

/// The string at `key` of a JSON object.
pub(crate) fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_events_whatever_the_framing_and_terminators() {
        let stream = b"event: a\r\ndata: {\"x\":1}\r\n\r\n: ping\n\ndata: [DONE]\n\ndata: cut";
        for size in 1..stream.len() {
            let mut f = Framer::default();
            let mut events = Vec::new();
            for chunk in stream.chunks(size) {
                f.push(chunk);
                while let Some(e) = f.next_event() {
                    events.push(e);
                }
            }
            let names: Vec<Event> = events.iter().map(|e| Event::parse(e)).collect();
            assert_eq!(names.len(), 3, "size {size}: {events:?}");
            assert_eq!(names[0].kind(), "a");
            assert_eq!(names[0].json(), Some(&serde_json::json!({"x": 1})));
            assert_eq!(names[1].data, Data::Other);
            assert_eq!(names[2].data, Data::Done);
            // What is not whole stays held, and the bytes are all there.
            let mut all: Vec<u8> = events.concat();
            let held = f.held();
            all.extend_from_slice(&stream[stream.len() - held..]);
            assert_eq!(all, stream);
        }
    }

    #[test]
    fn multi_line_data_is_joined_and_the_type_comes_from_the_data() {
        let e = Event::parse(b"event: message_start\ndata: {\"type\":\ndata: \"message_start\"}\n\n");
        assert_eq!(e.kind(), "message_start");
        let chat = Event::parse(b"data: {\"id\":\"c\"}\n\n");
        assert_eq!(chat.kind(), "");
        let out = encode("ping", &serde_json::json!({"type": "ping"}));
        assert_eq!(out, b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
        assert_eq!(encode("", &serde_json::json!(1)), b"data: 1\n\n");
    }
}
