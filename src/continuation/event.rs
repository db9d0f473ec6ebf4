//! Server-sent events as a continuation reads and writes them: whole events cut from a stream's
//! bytes ([`Framer`]), one event's name and data ([`Event`], read with `wire::sse`), and events
//! written back (`event:` and one `data:` line, `\n` terminators).

use std::ops::Range;

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use crate::wire::sse::{event_fields, EventEnd};

/// Cuts a stream's bytes into whole events, fed in order: what the pipeline forwards to the app
/// when a route continues streams (an event is never split between two attempts' bytes).
///
/// The bytes are copied in once; the events found are handed out as slices of them and taken
/// together ([`Framer::take_found`], no copy), so that a chunk of many events costs one pass
/// whatever its size. What is held is an event not complete yet, which the caller bounds.
#[derive(Debug, Default)]
pub(crate) struct Framer {
    buf: BytesMut,
    /// The end of the whole events found and not taken yet.
    found: usize,
    /// How much of `buf` the finder has seen.
    scanned: usize,
    end: EventEnd,
}

impl Framer {
    /// Adds the stream's next bytes.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Where the next whole event is in [`Framer::found`] (its bytes as they came, terminators
    /// included), once its blank line is in.
    pub(crate) fn next_found(&mut self) -> Option<Range<usize>> {
        let from = self.scanned.max(self.found);
        let Some(at) = self.end.feed(&self.buf[from..]) else {
            self.scanned = self.buf.len();
            return None;
        };
        let mut end = from + at;
        // The `\n` of a final `\r\n`, when it is in already.
        if self.buf[end - 1] == b'\r' && self.buf.get(end) == Some(&b'\n') {
            end += 1;
        }
        let start = self.found;
        self.found = end;
        self.scanned = end;
        self.end = EventEnd::default();
        Some(start..end)
    }

    /// The bytes of the events found and not taken.
    pub(crate) fn found(&self) -> &[u8] {
        &self.buf[..self.found]
    }

    /// The events found, taken as one run of bytes (they share the buffer: no copy).
    pub(crate) fn take_found(&mut self) -> Bytes {
        let n = std::mem::take(&mut self.found);
        self.scanned -= n;
        self.buf.split_to(n).freeze()
    }

    /// The next whole event, taken.
    #[cfg(test)]
    pub(crate) fn next_event(&mut self) -> Option<Bytes> {
        self.next_found()?;
        Some(self.take_found())
    }

    /// Everything held (events found, and an event not complete yet), taken: what a stream that
    /// ended left.
    pub(crate) fn take_held(&mut self) -> Option<Bytes> {
        self.found = 0;
        self.scanned = 0;
        self.end = EventEnd::default();
        (!self.buf.is_empty()).then(|| self.buf.split().freeze())
    }

    /// The bytes held past the events found: an event not complete yet.
    pub(crate) fn held(&self) -> usize {
        self.buf.len() - self.found
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

/// The `type` (and `code`) of the error event that ends a stream rebound could not finish.
pub(crate) const STREAM_CUT: &str = "stream_cut";

/// The error event that ends a cut stream that could not be finished, in the stream's dialect
/// (`message` says what cut it and why it was not finished): Anthropic's `event: error`; Chat's
/// `data: {"error": ...}`; Responses' `event: error` with its `code`, `message` and next
/// `sequence_number`, and an `error` object too (what the OpenAI SDKs raise on).
pub(crate) fn cut_event(dialect: super::Dialect, message: &str, next_seq: Option<u64>) -> Vec<u8> {
    use serde_json::json;
    let error = json!({"type": STREAM_CUT, "code": STREAM_CUT, "message": message, "param": null});
    match dialect {
        super::Dialect::Messages => encode(
            "error",
            &json!({"type": "error", "error": {"type": STREAM_CUT, "message": message}}),
        ),
        super::Dialect::Chat => encode("", &json!({ "error": error })),
        super::Dialect::Responses => encode(
            "error",
            &json!({
                "type": "error",
                "code": STREAM_CUT,
                "message": message,
                "param": null,
                "sequence_number": next_seq.unwrap_or(0),
                "error": error,
            }),
        ),
    }
}

/// OpenAI's end of a stream.
pub(crate) const DONE: &[u8] = b"data: [DONE]\n\n";

/// Anthropic's end of a stream.
pub(crate) const MESSAGE_STOP: &[u8] = b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

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
    use proptest::prelude::*;

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
            let mut all: Vec<u8> = events.iter().flat_map(|e| e.to_vec()).collect();
            let held = f.held();
            all.extend_from_slice(&stream[stream.len() - held..]);
            assert_eq!(all, stream);
        }
    }

    #[test]
    fn a_cut_event_is_an_error_event_in_each_dialect() {
        use crate::continuation::Dialect;
        for dialect in [Dialect::Messages, Dialect::Chat, Dialect::Responses] {
            let event = cut_event(dialect, "cut \"here\"\n", Some(7));
            assert!(crate::wire::sse::classify_event(&event).is_some(), "{dialect:?}");
            let e = Event::parse(&event);
            let json = e.json().expect("json");
            let message = json["error"]["message"].as_str().or(json["message"].as_str());
            assert_eq!(message, Some("cut \"here\"\n"), "{dialect:?}");
        }
        let responses = Event::parse(&cut_event(Dialect::Responses, "m", Some(7)));
        assert_eq!(responses.kind(), "error");
        assert_eq!(u64_at(responses.json().expect("json"), "sequence_number"), Some(7));
        let messages = Event::parse(&cut_event(Dialect::Messages, "m", None));
        assert_eq!(messages.name, "error");
        assert_eq!(messages.json().expect("json")["error"]["type"], "stream_cut");
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

    /// Where each event of a whole stream ends, as the SSE specification reads it, written
    /// plainly: `\r\n`, `\n` or `\r` ends a line, and an empty line after a line of the event
    /// ends it (just after its terminator). Empty lines before an event's first line dispatch
    /// nothing: they go with the event that follows.
    fn event_ends(stream: &[u8]) -> Vec<usize> {
        let (mut ends, mut i, mut empty, mut lines) = (Vec::new(), 0, true, false);
        while i < stream.len() {
            let end = match stream[i] {
                b'\r' if stream.get(i + 1) == Some(&b'\n') => i + 2,
                b'\r' | b'\n' => i + 1,
                _ => {
                    empty = false;
                    i += 1;
                    continue;
                }
            };
            match (empty, lines) {
                (true, true) => {
                    ends.push(end);
                    lines = false;
                }
                (true, false) => {}
                (false, _) => lines = true,
            }
            empty = true;
            i = end;
        }
        ends
    }

    /// Bytes that look like a stream: field lines, comments, blank lines, every terminator, and
    /// now and then any byte.
    fn stream_bytes() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            Just(b"data: {\"x\":1}".to_vec()),
            Just(b"event: a".to_vec()),
            Just(b": ping".to_vec()),
            Just(b"\n".to_vec()),
            Just(b"\r".to_vec()),
            Just(b"\r\n".to_vec()),
            any::<u8>().prop_map(|b| vec![b]),
        ];
        proptest::collection::vec(piece, 0..24).prop_map(|p| p.concat())
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config(512))]

        /// Any stream cut into chunks anywhere: the framer gives the events the specification
        /// reads in the whole stream, in order, each its bytes as they came; what it holds after
        /// each chunk is only the event not complete yet.
        #[test]
        fn the_framer_finds_the_events_the_specification_reads(
            stream in stream_bytes(),
            cuts in proptest::collection::vec(any::<usize>(), 0..6),
        ) {
            let mut cut: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
            cut.push(stream.len());
            cut.sort_unstable();
            let (mut f, mut events, mut from) = (Framer::default(), Vec::<Bytes>::new(), 0);
            for &to in &cut {
                f.push(&stream[from..to]);
                from = to;
                while let Some(e) = f.next_event() {
                    events.push(e);
                }
                let taken: usize = events.iter().map(Bytes::len).sum();
                prop_assert_eq!(f.held(), to - taken, "holds only what is not an event yet");
            }
            // Each event ends where the specification says, but for one case: a `\r\n` cut
            // between its bytes ends the event at the `\r` (the framer does not wait for the
            // `\n`, which then goes with the next event as an empty line, dispatching nothing).
            let want = event_ends(&stream);
            let ends: Vec<usize> = events.iter().scan(0, |end, e| { *end += e.len(); Some(*end) }).collect();
            let text = String::from_utf8_lossy(&stream);
            prop_assert_eq!(ends.len(), want.len(), "{:?}: {:?} {:?}", text, ends, want);
            for (got, want) in ends.iter().zip(&want) {
                let straddled = *got + 1 == *want && stream[*got - 1] == b'\r' && stream[*got] == b'\n' && cut.contains(got);
                prop_assert!(got == want || straddled, "{:?}: {:?}", text, ends);
            }
            let mut all: Vec<u8> = events.iter().flat_map(|e| e.to_vec()).collect();
            all.extend(f.take_held().unwrap_or_default());
            prop_assert_eq!(all, stream);
        }
    }
}
