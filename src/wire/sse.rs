//! In-band errors: a provider that answers 200 and then reports a failure in the body, as the first
//! event of a server-sent-event stream (Anthropic: `event: error` + `{"type":"error","error":{..}}`;
//! OpenAI-style: `data: {"error": {..}}`) or as a JSON body that is an error object.
//!
//! Pure byte work, no I/O:
//! - [`EventEnd`] finds where the first event of a stream ends (a blank line; every SSE line
//!   terminator, `\n`, `\r\n` or `\r`, counts), fed frame by frame;
//! - [`classify_event`] and [`classify_json`] tell whether that event (or a whole JSON body) is an
//!   error and what it stands for ([`InBandError::equivalent`]): `overloaded_error` a 529,
//!   `rate_limit_error` / `rate_limit_exceeded` a 429, `api_error` / `server_error` a 500, anything
//!   else nothing retryable. JSON is parsed only when the bytes contain `error`, so a normal event
//!   costs one scan;
//! - [`ErrorScan`] spots an error event later in a stream (a line `event: error` or `data: {"error"`),
//!   fed frame by frame with its state carried across frame boundaries, without copying the stream.

use http::{HeaderMap, StatusCode};
use memchr::{memchr2, memmem};

/// How a response body is shaped, from its `content-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `text/event-stream`.
    EventStream,
    /// `application/json`.
    Json,
    /// Anything else (or no content type).
    Other,
}

impl Shape {
    pub(crate) fn of(headers: &HeaderMap) -> Shape {
        let essence = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(str::trim)
            .unwrap_or("");
        if essence.eq_ignore_ascii_case("text/event-stream") {
            Shape::EventStream
        } else if essence.eq_ignore_ascii_case("application/json") {
            Shape::Json
        } else {
            Shape::Other
        }
    }
}

/// An error reported inside a successful response's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InBandError {
    /// The status the error stands for (529, 429 or 500); `None` for an error type that has no
    /// retryable equivalent (passed through as it came).
    pub equivalent: Option<StatusCode>,
}

/// The status an error type stands for, if it is one rebound may retry.
fn equivalent(kind: &str) -> Option<StatusCode> {
    let status = match kind {
        "overloaded_error" => 529,
        "rate_limit_error" | "rate_limit_exceeded" => 429,
        "api_error" | "server_error" => 500,
        _ => return None,
    };
    StatusCode::from_u16(status).ok()
}

/// The error a JSON value reports: an object with an `error` object (Anthropic's
/// `{"type":"error","error":{..}}` and OpenAI's `{"error":{..}}` alike), classified by the error's
/// `type`, else its `code` (OpenAI names rate limits in `code`).
fn error_of(value: &serde_json::Value) -> Option<InBandError> {
    let error = value.as_object()?.get("error")?.as_object()?;
    let field = |name: &str| error.get(name).and_then(serde_json::Value::as_str).and_then(equivalent);
    Some(InBandError {
        equivalent: field("type").or_else(|| field("code")),
    })
}

/// Whether a whole JSON body is an error object (and which).
pub fn classify_json(body: &[u8]) -> Option<InBandError> {
    // Parsed only when it can be an error.
    ERROR_KEY.find(body)?;
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| error_of(&v))
}

/// Whether one SSE event (its bytes, terminators included or not) is an error: named `error`, or
/// whose data is an error object. An `event: error` whose data says nothing usable is an error
/// without an equivalent.
pub fn classify_event(event: &[u8]) -> Option<InBandError> {
    // Parsed only when it can be an error.
    ERROR_WORD.find(event)?;
    let (name, data) = fields(event);
    let parsed = serde_json::from_slice::<serde_json::Value>(&data).ok();
    match parsed.as_ref().and_then(error_of) {
        Some(e) => Some(e),
        None if name == b"error" => Some(InBandError { equivalent: None }),
        None => None,
    }
}

/// The data of one SSE event (its `data` lines joined by `\n`): for an error event, the error
/// object, which the provider-error classifier reads as it reads an error response's body.
pub(crate) fn event_data(event: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    fields(event).1
}

/// An event's name (its `event` field; empty when it has none) and its data (its `data` lines
/// joined by `\n`): what a continuation reads of each event it tracks or rewrites.
pub(crate) fn event_fields(event: &[u8]) -> (&[u8], std::borrow::Cow<'_, [u8]>) {
    fields(event)
}

/// An event's name and its data (its `data` lines joined by `\n`; borrowed when there is one).
fn fields(event: &[u8]) -> (&[u8], std::borrow::Cow<'_, [u8]>) {
    let mut name: &[u8] = b"";
    let mut data: Vec<&[u8]> = Vec::new();
    for line in lines(event) {
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(0) => continue, // a comment
            Some(i) => (&line[..i], line[i + 1..].strip_prefix(b" ").unwrap_or(&line[i + 1..])),
            None => (line, &b""[..]),
        };
        match field {
            b"event" => name = value,
            b"data" => data.push(value),
            _ => {}
        }
    }
    let data = match data.as_slice() {
        [] => std::borrow::Cow::Borrowed(&b""[..]),
        [one] => std::borrow::Cow::Borrowed(*one),
        many => std::borrow::Cow::Owned(many.join(&b'\n')),
    };
    (name, data)
}

/// The lines of `bytes`, split at `\r\n`, `\n` or `\r` (an unterminated last line included).
fn lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        match memchr2(b'\n', b'\r', rest) {
            Some(i) => {
                let line = &rest[..i];
                let skip = if rest[i] == b'\r' && rest.get(i + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                rest = &rest[i + skip..];
                Some(line)
            }
            None => Some(std::mem::take(&mut rest)),
        }
    })
}

/// Finds the end of a stream's first event, fed the stream's bytes in order: the blank line after
/// the first non-blank line (blank lines before it are skipped, as the SSE parser does).
#[derive(Debug, Clone)]
pub struct EventEnd {
    /// No byte of the current line yet.
    line_empty: bool,
    /// A non-blank line was seen.
    seen: bool,
    /// The last byte was a `\r`: a `\n` next completes that terminator.
    after_cr: bool,
}

impl Default for EventEnd {
    fn default() -> EventEnd {
        EventEnd {
            line_empty: true,
            seen: false,
            after_cr: false,
        }
    }
}

impl EventEnd {
    /// Feeds the next bytes: the offset in `chunk` just past the event's end, once it is found
    /// (feeding stops there).
    pub fn feed(&mut self, chunk: &[u8]) -> Option<usize> {
        let mut i = 0;
        while i < chunk.len() {
            let Some(k) = memchr2(b'\n', b'\r', &chunk[i..]) else {
                self.text();
                return None;
            };
            if k > 0 {
                self.text();
            }
            let at = i + k;
            i = at + 1;
            if chunk[at] == b'\n' && std::mem::take(&mut self.after_cr) {
                continue; // the `\n` of a `\r\n`
            }
            if self.line_empty && self.seen {
                return Some(i);
            }
            self.line_empty = true;
            self.after_cr = chunk[at] == b'\r';
        }
        None
    }

    fn text(&mut self) {
        self.line_empty = false;
        self.seen = true;
        self.after_cr = false;
    }
}

/// What a line's first bytes say about it.
#[derive(Debug, PartialEq, Eq)]
enum Judged {
    Error,
    Other,
    /// Not decided yet: more bytes of the line are needed.
    More,
}

/// Lines that are the whole of an error event's name line.
const ERROR_NAMES: [&[u8]; 2] = [b"event: error", b"event:error"];
/// Starts of a data line that carries an error object.
const ERROR_DATA: [&[u8]; 2] = [b"data: {\"error\"", b"data:{\"error\""];
/// Every error pattern contains it: a frame without it holds no error line (searched with a
/// searcher built once, not per frame).
static ERROR_WORD: std::sync::LazyLock<memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memmem::Finder::new(b"error"));
/// The key of an error object in a JSON body (building a searcher costs more than a short search).
static ERROR_KEY: std::sync::LazyLock<memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memmem::Finder::new(b"\"error\""));

/// Enough of a line to judge it (longer than every pattern).
const HEAD: usize = 16;

fn judge(head: &[u8], complete: bool) -> Judged {
    if ERROR_DATA.iter().any(|p| head.starts_with(p)) || (complete && ERROR_NAMES.contains(&head)) {
        return Judged::Error;
    }
    let could = |p: &&[u8]| p.len() >= head.len() && p.starts_with(head);
    if !complete && (ERROR_NAMES.iter().any(could) || ERROR_DATA.iter().any(could)) {
        return Judged::More;
    }
    Judged::Other
}

/// Spots an error event in a stream, fed its frames in order: a line `event: error` (or
/// `event:error`), or a data line starting `data: {"error"`. Only the first bytes of each line are
/// looked at (at most 16 kept across a frame boundary); the stream itself is never copied.
#[derive(Debug, Clone, Default)]
pub struct ErrorScan {
    /// The current line's first bytes, while they cannot be judged yet.
    head: [u8; HEAD],
    head_len: usize,
    /// The current line is judged: skip to its end.
    judged: bool,
    /// The last byte was a `\r`: a `\n` next completes that terminator.
    after_cr: bool,
}

impl ErrorScan {
    /// Feeds the next bytes: whether an error line ends or is recognised in them.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        // The common frame: whole lines, none of which can be an error line (each pattern
        // contains `error`). One SIMD pass, and the state stays at a line start.
        let at_line_start = self.head_len == 0 && !self.judged && !self.after_cr;
        if at_line_start && chunk.last() == Some(&b'\n') && ERROR_WORD.find(chunk).is_none() {
            return false;
        }
        let mut found = false;
        let mut i = 0;
        while i < chunk.len() {
            if std::mem::take(&mut self.after_cr) && chunk[i] == b'\n' {
                i += 1;
                continue;
            }
            let end = memchr2(b'\n', b'\r', &chunk[i..]).map(|k| i + k);
            if !self.judged {
                let segment = &chunk[i..end.unwrap_or(chunk.len())];
                let take = segment.len().min(HEAD - self.head_len);
                self.head[self.head_len..self.head_len + take].copy_from_slice(&segment[..take]);
                self.head_len += take;
                match judge(&self.head[..self.head_len], end.is_some() || take < segment.len()) {
                    Judged::Error => {
                        found = true;
                        self.judged = true;
                    }
                    Judged::Other => self.judged = true,
                    Judged::More => {}
                }
            }
            let Some(end) = end else { return found };
            self.after_cr = chunk[end] == b'\r';
            self.head_len = 0;
            self.judged = false;
            i = end + 1;
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ANTHROPIC_OVERLOADED: &str =
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    const OPENAI_SERVER_ERROR: &str =
        "data: {\"error\": {\"message\": \"The server had an error\", \"type\": \"server_error\", \"param\": null, \"code\": null}}\n\n";
    const MESSAGE_START: &str =
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\"}}\n\n";
    const CHAT_CHUNK: &str = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"an error here\"}}]}\n\n";

    fn status(s: u16) -> Option<StatusCode> {
        Some(StatusCode::from_u16(s).unwrap())
    }

    fn first_event(bytes: &[u8]) -> Option<usize> {
        EventEnd::default().feed(bytes)
    }

    #[test]
    fn the_first_event_ends_at_the_first_blank_line_whatever_the_terminators() {
        for (stream, end) in [
            ("data: a\n\ndata: b\n\n", 9),
            ("data: a\r\n\r\ndata: b", 10),
            ("data: a\r\rdata: b", 9),
            ("data: a\n\r\n", 9),
            ("data: a\r\n\n", 10),
            ("event: x\ndata: a\n\n", 18),
            ("\n\n\r\ndata: a\n\n", 13),
            (": keep-alive\n\n", 14),
        ] {
            assert_eq!(first_event(stream.as_bytes()), Some(end), "{stream:?}");
        }
        for stream in ["data: a\n", "data: a\r\n", "data: a", "", "\n\n"] {
            assert_eq!(first_event(stream.as_bytes()), None, "{stream:?}");
        }
    }

    #[test]
    fn error_events_are_classified_by_their_type() {
        assert_eq!(
            classify_event(ANTHROPIC_OVERLOADED.as_bytes()),
            Some(InBandError {
                equivalent: status(529)
            })
        );
        assert_eq!(
            classify_event(OPENAI_SERVER_ERROR.as_bytes()),
            Some(InBandError {
                equivalent: status(500)
            })
        );
        let cases = [
            ("rate_limit_error", status(429)),
            ("api_error", status(500)),
            ("invalid_request_error", None),
            ("authentication_error", None),
        ];
        for (kind, want) in cases {
            let event =
                format!("event: error\r\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"{kind}\"}}}}\r\n\r\n");
            assert_eq!(
                classify_event(event.as_bytes()),
                Some(InBandError { equivalent: want }),
                "{kind}"
            );
        }
        // OpenAI names rate limits in `code`.
        let limited = "data: {\"error\":{\"type\":\"requests\",\"code\":\"rate_limit_exceeded\"}}\n\n";
        assert_eq!(
            classify_event(limited.as_bytes()),
            Some(InBandError {
                equivalent: status(429)
            })
        );
        // An error event whose data is unusable is still an error, with no equivalent.
        for event in ["event: error\ndata: not json\n\n", "event:error\n\n"] {
            assert_eq!(
                classify_event(event.as_bytes()),
                Some(InBandError { equivalent: None }),
                "{event:?}"
            );
        }
        // Data split over several lines is joined.
        let split = "event: error\ndata: {\"error\":\ndata: {\"type\":\"overloaded_error\"}}\n\n";
        assert_eq!(
            classify_event(split.as_bytes()),
            Some(InBandError {
                equivalent: status(529)
            })
        );
    }

    #[test]
    fn normal_events_are_not_errors() {
        for event in [
            MESSAGE_START,
            CHAT_CHUNK,
            ": keep-alive\n\n",
            "event: ping\ndata: {\"type\": \"ping\"}\n\n",
            "data: {\"error\": null}\n\n",
            "data: {\"error\": \"a string\"}\n\n",
            "data: [DONE]\n\n",
            "event: errors\ndata: {}\n\n",
        ] {
            assert_eq!(classify_event(event.as_bytes()), None, "{event:?}");
        }
    }

    #[test]
    fn json_bodies() {
        let anthropic = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        assert_eq!(
            classify_json(anthropic.as_bytes()),
            Some(InBandError {
                equivalent: status(529)
            })
        );
        let openai = r#"{"error":{"message":"m","type":"invalid_request_error","code":null}}"#;
        assert_eq!(classify_json(openai.as_bytes()), Some(InBandError { equivalent: None }));
        for body in [
            r#"{"id":"chatcmpl","choices":[{"message":{"content":"say \"error\" twice"}}]}"#,
            r#"{"error":null,"result":1}"#,
            r#"{"error""#,
            "",
        ] {
            assert_eq!(classify_json(body.as_bytes()), None, "{body:?}");
        }
    }

    #[test]
    fn shapes() {
        let of = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(http::header::CONTENT_TYPE, v.parse().unwrap());
            Shape::of(&h)
        };
        assert_eq!(of("text/event-stream"), Shape::EventStream);
        assert_eq!(of("Text/Event-Stream; charset=utf-8"), Shape::EventStream);
        assert_eq!(of("application/json"), Shape::Json);
        assert_eq!(of("application/json; charset=utf-8"), Shape::Json);
        assert_eq!(of("text/plain"), Shape::Other);
        assert_eq!(Shape::of(&HeaderMap::new()), Shape::Other);
    }

    fn scan(chunks: &[&[u8]]) -> bool {
        let mut s = ErrorScan::default();
        chunks.iter().fold(false, |found, c| s.feed(c) | found)
    }

    #[test]
    fn the_scanner_finds_error_lines_only() {
        let normal =
            format!("{MESSAGE_START}{CHAT_CHUNK}event: ping\ndata: {{}}\n\n: comment error\n\ndata: [DONE]\n\n");
        assert!(!scan(&[normal.as_bytes()]));
        assert!(!scan(&[
            b"event: errors\n\n",
            b"data: {\"errors\": 1}\n\n",
            b"x event: error\n"
        ]));
        for error in [
            ANTHROPIC_OVERLOADED,
            OPENAI_SERVER_ERROR,
            "event:error\r\n",
            "data:{\"error\":{}}",
        ] {
            let stream = format!("{normal}{error}");
            assert!(scan(&[stream.as_bytes()]), "{error:?}");
        }
        // Split anywhere, even inside a line's first bytes or a `\r\n`.
        assert!(scan(&[b"data: x\r", b"\nev", b"ent: err", b"or", b"\n"]));
        assert!(scan(&[b"data: x\n\ndata: {\"er", b"ror\": {}}\n\n"]));
        // `event: error` at the very end of what came is decided by the terminator that follows.
        let mut s = ErrorScan::default();
        assert!(!s.feed(b"event: error"));
        assert!(s.feed(b"\n"));
        let mut s = ErrorScan::default();
        assert!(!s.feed(b"event: error"));
        assert!(!s.feed(b"s\n"));
    }

    /// Deterministic property tests: a fixed seed, and no regression files written outside the
    /// module (a failure prints its minimal input; add it to a table test).
    fn proptest_config(cases: u32) -> ProptestConfig {
        let mut config = ProptestConfig::with_cases(cases);
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(0x55E_E770);
        config.failure_persistence = None;
        config
    }

    /// Bytes that look like SSE: fields, terminators of every kind, JSON-ish data.
    fn sse_like() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            Just(&b"\n"[..]),
            Just(&b"\r"[..]),
            Just(&b"\r\n"[..]),
            Just(&b"event: error"[..]),
            Just(&b"event:"[..]),
            Just(&b"data: "[..]),
            Just(&b"{\"error\""[..]),
            Just(&b"{\"type\":\"overloaded_error\"}}"[..]),
            Just(&b": ping"[..]),
            Just(&b"x"[..]),
        ];
        proptest::collection::vec(piece, 0..40).prop_map(|ps| ps.concat())
    }

    /// `bytes` cut at the given points (taken modulo its length).
    fn cut(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        points.push(0);
        points.push(bytes.len());
        points.sort_unstable();
        points.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).collect()
    }

    proptest! {
        #![proptest_config(proptest_config(512))]

        #[test]
        fn classifiers_never_panic(bytes in any::<Vec<u8>>()) {
            let _ = classify_event(&bytes);
            let _ = classify_json(&bytes);
            let _ = first_event(&bytes);
            let _ = ErrorScan::default().feed(&bytes);
        }

        #[test]
        fn framing_does_not_change_where_the_first_event_ends(
            bytes in sse_like(),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let whole = first_event(&bytes);
            let mut finder = EventEnd::default();
            let mut offset = 0;
            let mut found = None;
            for chunk in cut(&bytes, &cuts) {
                if let Some(end) = finder.feed(&chunk) {
                    found = Some(offset + end);
                    break;
                }
                offset += chunk.len();
            }
            prop_assert_eq!(found, whole);
            if let Some(end) = whole {
                prop_assert!(end <= bytes.len());
                prop_assert!(matches!(bytes[end - 1], b'\n' | b'\r'));
            }
        }

        #[test]
        fn framing_does_not_change_what_the_scanner_sees(
            bytes in sse_like(),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let whole = ErrorScan::default().feed(&bytes);
            let chunks = cut(&bytes, &cuts);
            let split = scan(&chunks.iter().map(Vec::as_slice).collect::<Vec<_>>());
            prop_assert_eq!(split, whole);
        }

        #[test]
        fn an_error_event_after_normal_events_is_always_seen(
            events in proptest::collection::vec(prop_oneof![Just(MESSAGE_START), Just(CHAT_CHUNK), Just(": ping\r\n\r\n")], 0..6),
            error in prop_oneof![Just(ANTHROPIC_OVERLOADED), Just(OPENAI_SERVER_ERROR)],
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let stream = format!("{}{error}", events.concat());
            let chunks = cut(stream.as_bytes(), &cuts);
            prop_assert!(scan(&chunks.iter().map(Vec::as_slice).collect::<Vec<_>>()));
            // And the first event of the stream is classified as what it is.
            let end = first_event(stream.as_bytes()).unwrap();
            let first = classify_event(&stream.as_bytes()[..end]);
            prop_assert_eq!(first.is_some(), events.is_empty());
        }
    }
}
