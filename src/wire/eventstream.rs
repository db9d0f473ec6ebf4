//! Amazon Bedrock's response stream (`application/vnd.amazon.eventstream`, the AWS event stream),
//! re-framed as the server-sent events api.anthropic.com sends, for an Anthropic-shaped route
//! failed over to Bedrock's `invoke-with-response-stream`:
//! - [`Decoder`]: the binary framing, fed chunks split anywhere; each message's two checksums are
//!   verified, its lengths bounded ([`MAX_MESSAGE`], [`MAX_HEADERS`]), and at most one unfinished
//!   message is held (whole messages in a chunk are read where they lie, never copied);
//! - [`ToSse`]: pure, the messages as Anthropic's events: a `chunk`'s base64 event is decoded into
//!   `event: {type}\ndata: {json}\n\n` as it came (no JSON value is built); an exception, an error
//!   message or a corrupt stream becomes Anthropic's `error` event, and nothing follows it;
//! - [`encode`], [`chunk_frame`], [`exception_frame`]: frames as Bedrock writes them, for the fake
//!   provider and the tests (`hooks::eventstream`).
//!
//! A message: total length (u32 BE, all of it), headers length (u32 BE), the CRC32 of those 8
//! bytes; headers (`[name len u8][name][type u8][value]`); payload; the CRC32 of everything before.

use std::borrow::Cow;

use base64::Engine as _;
use bytes::BytesMut;
use memchr::memchr2;
use serde::{Deserialize, Serialize};

/// The prelude: total length, headers length, their CRC.
const PRELUDE: usize = 12;
/// The smallest message: a prelude and the message CRC.
const MIN_MESSAGE: usize = PRELUDE + 4;
/// The largest message accepted: 16 MiB, the cap of AWS's own implementation
/// (`AWS_EVENT_STREAM_MAX_MESSAGE_SIZE` of aws-c-event-stream). Bedrock's chunks are a few hundred
/// bytes (one Anthropic event each); a larger length is a corrupt stream, not a message to wait for.
/// Memory follows the bytes that arrive, not the length declared.
const MAX_MESSAGE: usize = 16 << 20;
/// The largest headers section accepted: 128 KiB (`AWS_EVENT_STREAM_MAX_HEADERS_SIZE`).
const MAX_HEADERS: usize = 128 << 10;
/// A held message buffer larger than this is freed once its message is out (a rare large
/// message does not keep its room for the rest of the stream).
const KEEP: usize = 64 << 10;

/// Why the framing of a stream is corrupt, and at which message (1 for the first). Read as the
/// end of "the event stream from Bedrock ...".
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    #[error("failed its checksum at frame {frame} (prelude)")]
    PreludeChecksum { frame: u64 },
    #[error("failed its checksum at frame {frame}")]
    MessageChecksum { frame: u64 },
    #[error(
        "declared a frame of {total} bytes at frame {frame} ({} to {} allowed)",
        MIN_MESSAGE,
        MAX_MESSAGE
    )]
    Length { frame: u64, total: u32 },
    #[error("declared {headers} bytes of headers in a frame of {total} bytes at frame {frame}")]
    HeadersLength { frame: u64, headers: u32, total: u32 },
    #[error("had a malformed header at frame {frame}")]
    Header { frame: u64 },
}

/// A header's value, by its type byte (0 to 9).
/// (Typed reading is the tests': the stream is read raw, [`RawHeader`].)
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderValue<'a> {
    Bool(bool),
    Byte(i8),
    Int16(i16),
    Int32(i32),
    Int64(i64),
    Bytes(&'a [u8]),
    String(&'a str),
    Timestamp(i64),
    Uuid([u8; 16]),
}

/// A header that does not parse.
struct Malformed;

/// A header's name and value, and the bytes after it.
#[cfg(test)]
type Parsed<'a> = (&'a str, HeaderValue<'a>, &'a [u8]);

/// A header as it lies in a message: its name, its type byte and its value's bytes (without the
/// length of a string or a byte array). Read without checking UTF-8: a name is compared as bytes,
/// and only a value that is used is checked.
struct RawHeader<'a> {
    name: &'a [u8],
    kind: u8,
    value: &'a [u8],
}

/// The first header of `buf`, raw, and what follows it; `None` at the end.
fn raw_header(buf: &[u8]) -> Result<Option<(RawHeader<'_>, &[u8])>, Malformed> {
    let Some((&name_len, rest)) = buf.split_first() else {
        return Ok(None);
    };
    let (name, rest) = take(rest, usize::from(name_len))?;
    let (&kind, rest) = rest.split_first().ok_or(Malformed)?;
    let (value, rest) = match kind {
        0 | 1 => (&rest[..0], rest),
        2 => take(rest, 1)?,
        3 => take(rest, 2)?,
        4 => take(rest, 4)?,
        5 | 8 => take(rest, 8)?,
        6 | 7 => {
            let (len, rest) = take_array::<2>(rest)?;
            take(rest, usize::from(u16::from_be_bytes(*len)))?
        }
        9 => take(rest, 16)?,
        _ => return Err(Malformed),
    };
    Ok(Some((RawHeader { name, kind, value }, rest)))
}

/// The first header of `buf`, typed, and what follows it; `None` at the end.
#[cfg(test)]
fn header(buf: &[u8]) -> Result<Option<Parsed<'_>>, Malformed> {
    let Some((raw, rest)) = raw_header(buf)? else {
        return Ok(None);
    };
    let name = std::str::from_utf8(raw.name).map_err(|_| Malformed)?;
    let fixed = |v: &[u8]| -> Result<[u8; 8], Malformed> {
        let mut b = [0u8; 8];
        b.get_mut(8 - v.len()..).ok_or(Malformed)?.copy_from_slice(v);
        Ok(b)
    };
    let value = match raw.kind {
        0 => HeaderValue::Bool(true),
        1 => HeaderValue::Bool(false),
        2 => HeaderValue::Byte(i8::from_be_bytes([fixed(raw.value)?[7]])),
        3 => {
            let b = fixed(raw.value)?;
            HeaderValue::Int16(i16::from_be_bytes([b[6], b[7]]))
        }
        4 => {
            let b = fixed(raw.value)?;
            HeaderValue::Int32(i32::from_be_bytes([b[4], b[5], b[6], b[7]]))
        }
        5 => HeaderValue::Int64(i64::from_be_bytes(fixed(raw.value)?)),
        6 => HeaderValue::Bytes(raw.value),
        7 => HeaderValue::String(std::str::from_utf8(raw.value).map_err(|_| Malformed)?),
        8 => HeaderValue::Timestamp(i64::from_be_bytes(fixed(raw.value)?)),
        _ => HeaderValue::Uuid(raw.value.try_into().map_err(|_| Malformed)?),
    };
    Ok(Some((name, value, rest)))
}

fn take(buf: &[u8], n: usize) -> Result<(&[u8], &[u8]), Malformed> {
    if n <= buf.len() {
        Ok(buf.split_at(n))
    } else {
        Err(Malformed)
    }
}

fn take_array<const N: usize>(buf: &[u8]) -> Result<(&[u8; N], &[u8]), Malformed> {
    buf.split_first_chunk::<N>().ok_or(Malformed)
}

/// The headers of a message, in order (a message's headers were checked when it was framed).
#[cfg(test)]
pub(crate) struct Headers<'a> {
    rest: &'a [u8],
}

#[cfg(test)]
impl<'a> Iterator for Headers<'a> {
    type Item = (&'a str, HeaderValue<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        match header(self.rest) {
            Ok(Some((name, value, rest))) => {
                self.rest = rest;
                Some((name, value))
            }
            _ => {
                self.rest = &[];
                None
            }
        }
    }
}

/// One message of the stream, checked: both checksums, its lengths, its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Message<'a> {
    /// Its place in the stream (1 for the first).
    pub(crate) number: u64,
    headers: &'a [u8],
    pub(crate) payload: &'a [u8],
}

impl<'a> Message<'a> {
    #[cfg(test)]
    pub(crate) fn headers(&self) -> Headers<'a> {
        Headers { rest: self.headers }
    }

    /// The value of the first header named `name`, if it is a string (the one value checked
    /// for UTF-8).
    pub(crate) fn string(&self, name: &str) -> Option<&'a str> {
        let mut rest = self.headers;
        while let Ok(Some((raw, next))) = raw_header(rest) {
            if raw.name == name.as_bytes() {
                return (raw.kind == 7).then(|| std::str::from_utf8(raw.value).ok()).flatten();
            }
            rest = next;
        }
        None
    }
}

/// The total length a prelude declares, once its CRC and lengths are checked.
fn prelude(prelude: &[u8; PRELUDE], frame: u64) -> Result<usize, FrameError> {
    let [t0, t1, t2, t3, h0, h1, h2, h3, c0, c1, c2, c3] = *prelude;
    let (total, headers) = (
        u32::from_be_bytes([t0, t1, t2, t3]),
        u32::from_be_bytes([h0, h1, h2, h3]),
    );
    if crc32fast::hash(&prelude[..8]) != u32::from_be_bytes([c0, c1, c2, c3]) {
        return Err(FrameError::PreludeChecksum { frame });
    }
    let total_len = usize::try_from(total).unwrap_or(usize::MAX);
    if !(MIN_MESSAGE..=MAX_MESSAGE).contains(&total_len) {
        return Err(FrameError::Length { frame, total });
    }
    let headers_len = usize::try_from(headers).unwrap_or(usize::MAX);
    if headers_len > total_len - MIN_MESSAGE || headers_len > MAX_HEADERS {
        return Err(FrameError::HeadersLength { frame, headers, total });
    }
    Ok(total_len)
}

/// A whole message (`bytes` is exactly its declared length, its prelude already checked).
fn message(bytes: &[u8], frame: u64) -> Result<Message<'_>, FrameError> {
    let Some((covered, crc)) = bytes.split_last_chunk::<4>() else {
        return Err(FrameError::Length { frame, total: 0 });
    };
    if crc32fast::hash(covered) != u32::from_be_bytes(*crc) {
        return Err(FrameError::MessageChecksum { frame });
    }
    let Some((&[_, _, _, _, h0, h1, h2, h3, ..], rest)) = covered.split_first_chunk::<PRELUDE>() else {
        return Err(FrameError::Length { frame, total: 0 });
    };
    let headers_len = u32::from_be_bytes([h0, h1, h2, h3]);
    let total = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    let Ok((headers, payload)) = take(rest, usize::try_from(headers_len).unwrap_or(usize::MAX)) else {
        return Err(FrameError::HeadersLength {
            frame,
            headers: headers_len,
            total,
        });
    };
    let mut at = headers;
    loop {
        match raw_header(at) {
            Ok(Some((_, rest))) => at = rest,
            Ok(None) => break,
            Err(Malformed) => return Err(FrameError::Header { frame }),
        }
    }
    Ok(Message {
        number: frame,
        headers,
        payload,
    })
}

/// The AWS event stream's framing, fed chunks as they come. A message a chunk holds whole is
/// read where it lies; the start of one that goes on in a later chunk is kept (at most one
/// message, [`MAX_MESSAGE`] bytes). Once the framing is corrupt, nothing more is decoded.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    /// The start of a message that the chunks so far have not finished.
    partial: Vec<u8>,
    /// `partial` is a whole message handed out: cleared on the next call.
    handed_out: bool,
    /// Messages framed so far.
    frames: u64,
    failed: bool,
}

impl Decoder {
    /// The messages `chunk` completes, read with [`Messages::next`] until it gives `None` (then
    /// the bytes after the last whole message are kept for the next chunk).
    pub(crate) fn feed<'d, 'c>(&'d mut self, chunk: &'c [u8]) -> Messages<'d, 'c> {
        Messages {
            decoder: self,
            rest: chunk,
        }
    }

    /// Whether the bytes so far end inside a message.
    pub(crate) fn in_frame(&self) -> bool {
        !self.handed_out && !self.partial.is_empty()
    }

    fn settle(&mut self) {
        if self.handed_out {
            self.handed_out = false;
            if self.partial.capacity() > KEEP {
                self.partial = Vec::new();
            } else {
                self.partial.clear();
            }
        }
    }
}

/// The messages of one chunk (see [`Decoder::feed`]).
pub(crate) struct Messages<'d, 'c> {
    decoder: &'d mut Decoder,
    rest: &'c [u8],
}

impl Messages<'_, '_> {
    /// The next whole message, or the framing's error (after which there is none); `None` when
    /// the chunk is used up (its last bytes kept for the next one).
    pub(crate) fn next(&mut self) -> Option<Result<Message<'_>, FrameError>> {
        let decoder = &mut *self.decoder;
        if decoder.failed {
            return None;
        }
        decoder.settle();
        let frame = decoder.frames + 1;
        if !decoder.partial.is_empty() {
            // Finish the message held from earlier chunks: its prelude, then the rest of it.
            let want = PRELUDE.saturating_sub(decoder.partial.len());
            let (head, rest) = self.rest.split_at(want.min(self.rest.len()));
            decoder.partial.extend_from_slice(head);
            self.rest = rest;
            let head = decoder.partial.first_chunk::<PRELUDE>()?;
            let total = match prelude(head, frame) {
                Ok(total) => total,
                Err(e) => {
                    decoder.failed = true;
                    return Some(Err(e));
                }
            };
            let want = total.saturating_sub(decoder.partial.len());
            let (body, rest) = self.rest.split_at(want.min(self.rest.len()));
            decoder.partial.extend_from_slice(body);
            self.rest = rest;
            if decoder.partial.len() < total {
                return None;
            }
            decoder.handed_out = true;
            decoder.frames = frame;
            let result = message(&decoder.partial, frame);
            decoder.failed = result.is_err();
            return Some(result);
        }
        let Some(head) = self.rest.first_chunk::<PRELUDE>() else {
            decoder.partial.extend_from_slice(self.rest);
            self.rest = &[];
            return None;
        };
        let total = match prelude(head, frame) {
            Ok(total) => total,
            Err(e) => {
                decoder.failed = true;
                return Some(Err(e));
            }
        };
        if self.rest.len() < total {
            decoder.partial.extend_from_slice(self.rest);
            self.rest = &[];
            return None;
        }
        let (whole, rest) = self.rest.split_at(total);
        self.rest = rest;
        decoder.frames = frame;
        let result = message(whole, frame);
        decoder.failed = result.is_err();
        Some(result)
    }
}

/// What a message left the stream: more may follow, or it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Go,
    End,
}

/// Bedrock's stream as Anthropic's server-sent events, fed the upstream's chunks as they come
/// (pure: bytes in, bytes out). Each `chunk` event becomes `event: {type}\ndata: {json}\n\n`, the
/// JSON as Bedrock carried it; other event types are skipped. An exception or error message ends
/// the stream with Anthropic's `error` event ([`error_type`]), as do a corrupt frame, a chunk that
/// is not an Anthropic event, and an end inside a frame (`api_error`).
#[derive(Debug, Default)]
pub(crate) struct ToSse {
    decoder: Decoder,
    /// The event of the chunk at hand (one event's JSON at most, its room reused).
    event: Vec<u8>,
    done: bool,
}

impl ToSse {
    /// Re-frames a chunk of the upstream's body: the events it completes are appended to `out`.
    pub(crate) fn feed(&mut self, chunk: &[u8], out: &mut BytesMut) {
        if self.done {
            return;
        }
        let mut messages = self.decoder.feed(chunk);
        while let Some(next) = messages.next() {
            let step = match next {
                Ok(message) => reframe(&message, &mut self.event, out),
                Err(e) => {
                    error_event(out, "api_error", &format!("the event stream from Bedrock {e}"));
                    Step::End
                }
            };
            if step == Step::End {
                self.done = true;
                break;
            }
        }
        if self.event.capacity() > KEEP {
            self.event = Vec::new();
        }
    }

    /// The upstream's body ended: an end inside a frame is reported (appended to `out`).
    pub(crate) fn end(&mut self, out: &mut BytesMut) {
        if !self.done && self.decoder.in_frame() {
            error_event(out, "api_error", "the event stream from Bedrock ended inside a frame");
        }
        self.done = true;
    }

    /// Whether the stream is over (an exception, an error, corruption, or [`ToSse::end`]):
    /// nothing more is produced.
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }
}

/// One message as SSE, appended to `out`.
fn reframe(message: &Message<'_>, event: &mut Vec<u8>, out: &mut BytesMut) -> Step {
    // Bedrock's chunk, told in one pass over the headers, as bytes (the first of each name).
    let (mut message_type, mut event_type): (Option<&[u8]>, Option<&[u8]>) = (None, None);
    let mut rest = message.headers;
    while let Ok(Some((raw, next))) = raw_header(rest) {
        let slot = match raw.name {
            b":message-type" => &mut message_type,
            b":event-type" => &mut event_type,
            _ => {
                rest = next;
                continue;
            }
        };
        if slot.is_none() {
            *slot = Some(raw.value).filter(|_| raw.kind == 7);
        }
        rest = next;
    }
    match message_type {
        Some(b"event") if event_type == Some(b"chunk") => chunk(message, event, out),
        // An event of another type than `chunk`, or a message type the format may add later.
        Some(b"event") | None => Step::Go,
        Some(_) => not_an_event(message, out),
    }
}

/// An exception or error message as Anthropic's error event (the end of the stream); another
/// message type is skipped.
fn not_an_event(message: &Message<'_>, out: &mut BytesMut) -> Step {
    match message.string(":message-type") {
        Some("exception") => {
            let kind = message.string(":exception-type").unwrap_or_default();
            exception_event(out, kind, &exception_message(message.payload));
            Step::End
        }
        Some("error") => {
            let code = message.string(":error-code").unwrap_or_default();
            exception_event(out, code, message.string(":error-message").unwrap_or_default());
            Step::End
        }
        _ => Step::Go,
    }
}

/// A `chunk` event as SSE, appended to `out`.
fn chunk(message: &Message<'_>, event: &mut Vec<u8>, out: &mut BytesMut) -> Step {
    if chunk_event(message.payload, event, out).is_err() {
        let text = format!(
            "the event stream from Bedrock carried a chunk that is not an Anthropic event at frame {}",
            message.number
        );
        error_event(out, "api_error", &text);
        return Step::End;
    }
    Step::Go
}

/// A chunk that is not `{"bytes":"<base64 of an Anthropic event>"}`.
struct NotAnEvent;

/// A chunk's event as `event: {type}\ndata: {json}\n\n`, appended to `out` (`event` is room for
/// the decoded JSON).
fn chunk_event(payload: &[u8], event: &mut Vec<u8>, out: &mut BytesMut) -> Result<(), NotAnEvent> {
    let encoded = chunk_bytes(payload)?;
    event.clear();
    // SIMD: the decoding is most of what re-framing costs (bench/instructions --targets bedrock).
    base64_simd::STANDARD
        .decode_append(&*encoded, event)
        .map_err(|_| NotAnEvent)?;
    // Not checked for UTF-8 (nor is an SSE stream passed through): the app's JSON parser reads it.
    // A raw line break can only be whitespace between JSON tokens (never inside a string): a
    // space means the same JSON, on the one `data:` line an event has.
    if memchr2(b'\r', b'\n', event).is_some() {
        for b in event.iter_mut().filter(|b| matches!(**b, b'\r' | b'\n')) {
            *b = b' ';
        }
    }
    let kind = event_type(event)?;
    out.reserve(kind.len() + event.len() + 17);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(&kind);
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(event);
    out.extend_from_slice(b"\n\n");
    Ok(())
}

/// Bedrock's own form of a chunk's payload, read in place: `{"bytes":"`, the base64, then `"}`,
/// or `","p":"`, the padding (letters and digits, not read) and `"}`.
const CHUNK_FORM: [&[u8]; 3] = [b"{\"bytes\":\"", b"\",\"p\":\"", b"\"}"];
/// How Anthropic writes an event: `type` first, read in place.
const EVENT_FORM: [&[u8]; 2] = [b"{\"type\":\"", b"}"];

/// The base64 text of a chunk's payload (`p` pads the payload's length, and is ignored): read in
/// place in Bedrock's form ([`CHUNK_FORM`]), by serde in any other.
fn chunk_bytes(payload: &[u8]) -> Result<Cow<'_, [u8]>, NotAnEvent> {
    let [open, padding, close] = CHUNK_FORM;
    if let Some(rest) = payload.strip_prefix(open) {
        if let Some(end) = memchr2(b'"', b'\\', rest) {
            let (value, tail) = rest.split_at(end);
            // The padding is not read (nor checked): only its frame.
            let plain = tail == close || tail.starts_with(padding) && tail.ends_with(close);
            if plain {
                return Ok(Cow::Borrowed(value));
            }
        }
    }
    #[derive(Deserialize)]
    struct Chunk<'a> {
        #[serde(borrow)]
        bytes: Cow<'a, str>,
    }
    match serde_json::from_slice::<Chunk<'_>>(payload) {
        Ok(Chunk {
            bytes: Cow::Borrowed(s),
        }) => Ok(Cow::Borrowed(s.as_bytes())),
        Ok(Chunk { bytes: Cow::Owned(s) }) => Ok(Cow::Owned(s.into_bytes())),
        Err(_) => Err(NotAnEvent),
    }
}

/// The top-level `type` of an Anthropic event: read in place when it is the first key
/// ([`EVENT_FORM`]), by serde otherwise. Never empty, never with a line break.
fn event_type(json: &[u8]) -> Result<Cow<'_, [u8]>, NotAnEvent> {
    let [open, close] = EVENT_FORM;
    if let Some(rest) = json.strip_prefix(open).filter(|_| json.ends_with(close)) {
        if let Some(end) = memchr2(b'"', b'\\', rest) {
            let (kind, tail) = rest.split_at(end);
            // No escape in it, and no line break (those were spaced out of the event).
            if tail.first() == Some(&b'"') && !kind.is_empty() {
                return Ok(Cow::Borrowed(kind));
            }
        }
    }
    #[derive(Deserialize)]
    struct Typed<'a> {
        #[serde(borrow, rename = "type")]
        kind: Cow<'a, str>,
    }
    let kind = serde_json::from_slice::<Typed<'_>>(json).map_err(|_| NotAnEvent)?.kind;
    if kind.is_empty() || kind.contains(['\r', '\n']) {
        return Err(NotAnEvent);
    }
    Ok(match kind {
        Cow::Borrowed(k) => Cow::Borrowed(k.as_bytes()),
        Cow::Owned(k) => Cow::Owned(k.into_bytes()),
    })
}

/// The `message` of an exception's payload (`{"message":"..."}`), or nothing.
fn exception_message(payload: &[u8]) -> Cow<'_, str> {
    #[derive(Deserialize)]
    struct Exception<'a> {
        #[serde(borrow, alias = "Message")]
        message: Option<Cow<'a, str>>,
    }
    serde_json::from_slice::<Exception<'_>>(payload)
        .ok()
        .and_then(|e| e.message)
        .unwrap_or_default()
}

/// The Anthropic error type a Bedrock exception (or error code) stands for.
pub(crate) fn error_type(exception: &str) -> &'static str {
    const TYPES: [(&str, &str); 5] = [
        ("throttlingException", "rate_limit_error"),
        ("serviceUnavailableException", "overloaded_error"),
        ("modelNotReadyException", "overloaded_error"),
        ("validationException", "invalid_request_error"),
        ("accessDeniedException", "permission_error"),
    ];
    TYPES
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(exception))
        .map_or("api_error", |(_, kind)| kind)
}

/// An exception (or error message) as Anthropic's error event: `"{Exception}: {message}"`.
fn exception_event(out: &mut BytesMut, exception: &str, text: &str) {
    let mut chars = exception.chars();
    let name: Cow<'_, str> = match chars.next() {
        Some(first) if first.is_ascii_lowercase() => {
            Cow::Owned(format!("{}{}", first.to_ascii_uppercase(), chars.as_str()))
        }
        Some(_) => Cow::Borrowed(exception),
        None => Cow::Borrowed("UnknownException"),
    };
    let message = if text.is_empty() {
        name.into_owned()
    } else {
        format!("{name}: {text}")
    };
    error_event(out, error_type(exception), &message);
}

/// Anthropic's error event, `event: error\ndata: {"type":"error","error":{..}}\n\n`, appended to
/// `out` (the JSON written by serde, escapes and all).
fn error_event(out: &mut BytesMut, kind: &str, message: &str) {
    #[derive(Serialize)]
    struct ErrorEvent<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        error: ErrorObject<'a>,
    }
    #[derive(Serialize)]
    struct ErrorObject<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        message: &'a str,
    }
    let event = ErrorEvent {
        kind: "error",
        error: ErrorObject { kind, message },
    };
    out.extend_from_slice(b"event: error\ndata: ");
    match serde_json::to_vec(&event) {
        Ok(json) => out.extend_from_slice(&json),
        // Serialising two strings does not fail; were it to, the event still says what happened.
        Err(_) => out.extend_from_slice(
            br#"{"type":"error","error":{"type":"api_error","message":"the event stream from Bedrock failed"}}"#,
        ),
    }
    out.extend_from_slice(b"\n\n");
}

/// A message with string headers (names cut at 255 bytes, values at 65,535), as the fake provider
/// and the tests send them.
pub fn encode(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut head = Vec::new();
    for (name, value) in headers {
        let name = name.as_bytes().get(..name.len().min(255)).unwrap_or_default();
        let value = value.as_bytes().get(..value.len().min(65_535)).unwrap_or_default();
        head.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
        head.extend_from_slice(name);
        head.push(7);
        head.extend_from_slice(&u16::try_from(value.len()).unwrap_or(u16::MAX).to_be_bytes());
        head.extend_from_slice(value);
    }
    let total = MIN_MESSAGE + head.len() + payload.len();
    let mut message = Vec::with_capacity(total);
    message.extend_from_slice(&u32::try_from(total).unwrap_or(u32::MAX).to_be_bytes());
    message.extend_from_slice(&u32::try_from(head.len()).unwrap_or(u32::MAX).to_be_bytes());
    let crc = crc32fast::hash(&message);
    message.extend_from_slice(&crc.to_be_bytes());
    message.extend_from_slice(&head);
    message.extend_from_slice(payload);
    let crc = crc32fast::hash(&message);
    message.extend_from_slice(&crc.to_be_bytes());
    message
}

/// What Bedrock pads a chunk's payload with (`p`: a prefix of it, of varying length).
const PADDING: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/// The `chunk` message Bedrock sends for one Anthropic event (its JSON as Anthropic writes it):
/// the headers in Bedrock's order, the event base64-encoded in `bytes`, and padding.
pub fn chunk_frame(event: &str) -> Vec<u8> {
    let encoded = base64::engine::general_purpose::STANDARD.encode(event);
    let pad = PADDING.get(..event.len() % PADDING.len()).unwrap_or_default();
    let payload = format!("{{\"bytes\":\"{encoded}\",\"p\":\"{pad}\"}}");
    encode(
        &[
            (":event-type", "chunk"),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.as_bytes(),
    )
}

/// The exception message Bedrock sends mid-stream (`exception` is its type as Bedrock names it,
/// `throttlingException`): the headers in Bedrock's order, `{"message":..}`.
pub fn exception_frame(exception: &str, message: &str) -> Vec<u8> {
    #[derive(Serialize)]
    struct Exception<'a> {
        message: &'a str,
    }
    let payload = serde_json::to_vec(&Exception { message }).unwrap_or_default();
    encode(
        &[
            (":exception-type", exception),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        &payload,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Recorded streams, as they came over the wire:
    // - `bedrock_stream.b64`: a Bedrock `invoke-with-response-stream` answer of Claude Sonnet 4.5
    //   ("Hi! 👋 How are you doing today?"), ten `chunk` messages in the seven network reads they
    //   arrived in, base64-encoded one read a line; from envoyproxy/ai-gateway (Apache-2.0),
    //   internal/translator/anthropic_awsanthropic_test.go ("extracted from a real streaming
    //   response"), with `bedrock_stream.sse`, the Anthropic events that test expects of it.
    // - `bedrock_validation_exception.bin`: the `validationException` Bedrock answered an
    //   `invoke-with-response-stream` with; from epam/ai-dial-adapter-bedrock (Apache-2.0),
    //   tests/integration_tests/test_anthropic_error.py.
    const STREAM_B64: &str = include_str!("testdata/bedrock_stream.b64");
    const STREAM_SSE: &str = include_str!("testdata/bedrock_stream.sse");
    const VALIDATION_EXCEPTION: &[u8] = include_bytes!("testdata/bedrock_validation_exception.bin");

    /// The recorded stream's network reads.
    fn recorded() -> Vec<Vec<u8>> {
        STREAM_B64
            .lines()
            .map(|line| base64::engine::general_purpose::STANDARD.decode(line).unwrap())
            .collect()
    }

    fn sse(chunks: &[&[u8]]) -> String {
        let mut to_sse = ToSse::default();
        let mut out = BytesMut::new();
        for chunk in chunks {
            to_sse.feed(chunk, &mut out);
        }
        to_sse.end(&mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    /// `bytes` cut at the given points (taken modulo its length).
    fn cut(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        points.push(0);
        points.push(bytes.len());
        points.sort_unstable();
        points.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).collect()
    }

    /// Checks that `text` is a run of whole events as Anthropic writes them (an `event:` line, a
    /// `data:` line of a JSON object whose `type` is the event's name, a blank line), and
    /// returns their names.
    fn events(text: &str) -> Vec<String> {
        assert!(text.is_empty() || text.ends_with("\n\n"), "{text:?}");
        assert!(!text.contains('\r'), "{text:?}");
        let mut names = Vec::new();
        for block in text.split_terminator("\n\n") {
            let (event, data) = block.split_once('\n').unwrap();
            let name = event.strip_prefix("event: ").unwrap();
            let data = data.strip_prefix("data: ").unwrap();
            assert!(!data.contains('\n'), "{block:?}");
            let json: serde_json::Value = serde_json::from_str(data).unwrap();
            assert_eq!(json["type"], name, "{block:?}");
            names.push(name.to_string());
        }
        names
    }

    // The AWS event stream test vectors of botocore (Apache-2.0), tests/unit/test_eventstream.py
    // (braces written `\x7b` and `\x7d` where one is alone: the size scan of
    // tests/it/architecture.rs counts them).
    const EMPTY_MESSAGE: &[u8] = b"\x00\x00\x00\x10\x00\x00\x00\x00\x05\xc2H\xeb\x7d\x98\xc8\xff";
    const INT8_HEADER: &[u8] = b"\x00\x00\x00\x17\x00\x00\x00\x07)\x86\x01X\x04byte\x02\xff\xc2\xf8i\xdc";
    const INT16_HEADER: &[u8] = b"\x00\x00\x00\x19\x00\x00\x00\x09q\x0e\x92>\x05short\x03\xff\xff\xb2|\xb6\xcc";
    const INT32_HEADER: &[u8] =
        b"\x00\x00\x00\x1d\x00\x00\x00\x0d\x83\xe3\xf0\xe7\x07integer\x04\xff\xff\xff\xff\x8b\x8e\x12\xeb";
    const INT64_HEADER: &[u8] =
        b"\x00\x00\x00\x1e\x00\x00\x00\x0e]J\xdb\x8d\x04long\x05\xff\xff\xff\xff\xff\xff\xff\xffK\xc22\xda";
    const PAYLOAD_NO_HEADERS: &[u8] = b"\x00\x00\x00\x1d\x00\x00\x00\x00\xfdR\x8cZ{'foo':'bar'}\xc3e96";
    const PAYLOAD_ONE_STR_HEADER: &[u8] = b"\x00\x00\x00=\x00\x00\x00 \x07\xfd\x83\x96\x0ccontent-type\x07\x00\x10application/json{'foo':'bar'}\x8d\x9c\x08\xb1";
    const ALL_HEADERS_TYPES: &[u8] = b"\x00\x00\x00b\x00\x00\x00R\x03\xb5\xcb\x9c\x010\x00\x011\x01\x012\x02\x02\x013\x03\x00\x03\x014\x04\x00\x00\x00\x04\x015\x05\x00\x00\x00\x00\x00\x00\x00\x05\x016\x06\x00\x05bytes\x017\x07\x00\x04utf8\x018\x08\x00\x00\x00\x00\x00\x00\x00\x08\x019\x090123456789abcdefc56q";
    const ERROR_EVENT_MESSAGE: &[u8] = b"\x00\x00\x00R\x00\x00\x00B\xbf#c~\x0d:message-type\x07\x00\x05error\x0b:error-code\x07\x00\x04code\x0e:error-message\x07\x00\x07messagekl\xea=";
    const CORRUPTED_HEADER_LENGTH: &[u8] = b"\x00\x00\x00=\xff\x00\x01\x02\x07\xfd\x83\x96\x0ccontent-type\x07\x00\x10application/json{'foo':'bar'}\x8d\x9c\x08\xb1";
    const CORRUPTED_HEADERS: &[u8] = b"\x00\x00\x00=\x00\x00\x00 \x07\xfd\x83\x96\x0ccontent+type\x07\x00\x10application/json{'foo':'bar'}\x8d\x9c\x08\xb1";
    const CORRUPTED_LENGTH: &[u8] = b"\x01\x00\x00\x1d\x00\x00\x00\x00\xfdR\x8cZ{'foo':'bar'}\xc3e96";
    const CORRUPTED_PAYLOAD: &[u8] = b"\x00\x00\x00\x1d\x00\x00\x00\x00\xfdR\x8cZ\x7b'foo':'bar'\x8d\xc3e96";
    const DUPLICATE_HEADER: &[u8] =
        b"\x00\x00\x00$\x00\x00\x00\x14K\xb9\x82\xd0\x04test\x04asdf\x04test\x04asdf\xf3\xf4uc";

    /// The one message of `bytes`, fed whole.
    fn only_message(bytes: &[u8], check: impl FnOnce(&Message<'_>)) {
        let mut decoder = Decoder::default();
        let mut messages = decoder.feed(bytes);
        check(&messages.next().unwrap().unwrap());
        assert!(messages.next().is_none());
        assert!(!decoder.in_frame());
    }

    /// A vector: its bytes, prelude CRC, message CRC, headers and payload.
    type Vector<'a> = (&'a [u8], u32, u32, Vec<(&'a str, HeaderValue<'a>)>, &'a [u8]);

    #[test]
    fn botocore_vectors_decode_with_their_checksums_and_header_values() {
        use HeaderValue as V;
        let cases: [Vector<'_>; 9] = [
            (EMPTY_MESSAGE, 0x05c2_48eb, 0x7d98_c8ff, vec![], b""),
            (INT8_HEADER, 0x2986_0158, 0xc2f8_69dc, vec![("byte", V::Byte(-1))], b""),
            (
                INT16_HEADER,
                0x710e_923e,
                0xb27c_b6cc,
                vec![("short", V::Int16(-1))],
                b"",
            ),
            (
                INT32_HEADER,
                0x83e3_f0e7,
                0x8b8e_12eb,
                vec![("integer", V::Int32(-1))],
                b"",
            ),
            (
                INT64_HEADER,
                0x5d4a_db8d,
                0x4bc2_32da,
                vec![("long", V::Int64(-1))],
                b"",
            ),
            (PAYLOAD_NO_HEADERS, 0xfd52_8c5a, 0xc365_3936, vec![], b"{'foo':'bar'}"),
            (
                PAYLOAD_ONE_STR_HEADER,
                0x07fd_8396,
                0x8d9c_08b1,
                vec![("content-type", V::String("application/json"))],
                b"{'foo':'bar'}",
            ),
            (
                ALL_HEADERS_TYPES,
                0x03b5_cb9c,
                0x6335_3671,
                vec![
                    ("0", V::Bool(true)),
                    ("1", V::Bool(false)),
                    ("2", V::Byte(2)),
                    ("3", V::Int16(3)),
                    ("4", V::Int32(4)),
                    ("5", V::Int64(5)),
                    ("6", V::Bytes(b"bytes")),
                    ("7", V::String("utf8")),
                    ("8", V::Timestamp(8)),
                    ("9", V::Uuid(*b"0123456789abcdef")),
                ],
                b"",
            ),
            (
                ERROR_EVENT_MESSAGE,
                0xbf23_637e,
                0x6b6c_ea3d,
                vec![
                    (":message-type", V::String("error")),
                    (":error-code", V::String("code")),
                    (":error-message", V::String("message")),
                ],
                b"",
            ),
        ];
        for (bytes, prelude_crc, message_crc, headers, payload) in &cases {
            // The CRC is AWS's: the vectors' own checksums, over the bytes they cover.
            assert_eq!(crc32fast::hash(&bytes[..8]), *prelude_crc);
            assert_eq!(crc32fast::hash(&bytes[..bytes.len() - 4]), *message_crc);
            only_message(bytes, |m| {
                assert_eq!(m.number, 1);
                assert_eq!(&m.headers().collect::<Vec<_>>(), headers);
                assert_eq!(m.payload, *payload);
            });
        }
        // All of them in one stream, one byte at a time.
        let all: Vec<u8> = cases.iter().flat_map(|c| c.0.to_vec()).collect();
        let mut decoder = Decoder::default();
        let mut payloads = Vec::new();
        for byte in all.chunks(1) {
            let mut messages = decoder.feed(byte);
            while let Some(m) = messages.next() {
                let m = m.unwrap();
                payloads.push((m.number, m.payload.to_vec()));
            }
        }
        let want: Vec<(u64, Vec<u8>)> = (1..).zip(cases.iter().map(|c| c.4.to_vec())).collect();
        assert_eq!(payloads, want);
    }

    #[test]
    fn botocore_corrupt_vectors_are_refused() {
        for (bytes, error) in [
            // botocore checks the lengths before the prelude's CRC; this decoder, the CRC first.
            (CORRUPTED_LENGTH, FrameError::PreludeChecksum { frame: 1 }),
            (CORRUPTED_HEADER_LENGTH, FrameError::PreludeChecksum { frame: 1 }),
            (CORRUPTED_PAYLOAD, FrameError::MessageChecksum { frame: 1 }),
            (CORRUPTED_HEADERS, FrameError::MessageChecksum { frame: 1 }),
        ] {
            let mut decoder = Decoder::default();
            let mut messages = decoder.feed(bytes);
            assert_eq!(messages.next().unwrap().unwrap_err(), error);
            assert!(messages.next().is_none());
            // Nothing more is decoded from a corrupt stream.
            assert!(decoder.feed(EMPTY_MESSAGE).next().is_none());
        }
        // A header repeated is not an error of the framing (botocore refuses it): the first
        // one counts.
        only_message(DUPLICATE_HEADER, |m| {
            assert_eq!(m.headers().count(), 2);
            assert_eq!(m.headers().next(), Some(("test", HeaderValue::Int32(0x6173_6466))));
        });
    }

    #[test]
    fn lengths_out_of_bounds_are_refused_from_the_prelude_alone() {
        let prelude = |total: u32, headers: u32| {
            let mut p = [total.to_be_bytes(), headers.to_be_bytes()].concat();
            p.extend_from_slice(&crc32fast::hash(&p).to_be_bytes());
            p
        };
        for (total, headers, error) in [
            (15, 0, FrameError::Length { frame: 1, total: 15 }),
            (0, 0, FrameError::Length { frame: 1, total: 0 }),
            (
                16 << 20 | 1,
                0,
                FrameError::Length {
                    frame: 1,
                    total: 16 << 20 | 1,
                },
            ),
            (
                u32::MAX,
                0,
                FrameError::Length {
                    frame: 1,
                    total: u32::MAX,
                },
            ),
            (
                16,
                1,
                FrameError::HeadersLength {
                    frame: 1,
                    headers: 1,
                    total: 16,
                },
            ),
            (
                100,
                85,
                FrameError::HeadersLength {
                    frame: 1,
                    headers: 85,
                    total: 100,
                },
            ),
            (
                1 << 20,
                128 << 10 | 1,
                FrameError::HeadersLength {
                    frame: 1,
                    headers: 128 << 10 | 1,
                    total: 1 << 20,
                },
            ),
        ] {
            let mut decoder = Decoder::default();
            // In two pieces: the error comes with the prelude's twelfth byte.
            let bytes = prelude(total, headers);
            assert!(decoder.feed(&bytes[..11]).next().is_none());
            assert_eq!(decoder.feed(&bytes[11..]).next().unwrap().unwrap_err(), error);
        }
        // The largest length allowed waits for its bytes.
        let mut decoder = Decoder::default();
        assert!(decoder.feed(&prelude(16 << 20, 128 << 10)).next().is_none());
        assert!(decoder.in_frame());
    }

    #[test]
    fn a_header_that_runs_past_its_section_is_a_malformed_frame() {
        // A string header whose length runs past the headers section, the CRCs right.
        let mut bad = encode(&[(":message-type", "event")], b"{}");
        let headers_len = 1 + 13 + 1 + 2 + 5;
        bad[PRELUDE + headers_len - 7] = 0x40; // the value's length, high byte
        let n = bad.len();
        let crc = crc32fast::hash(&bad[..n - 4]);
        bad[n - 4..].copy_from_slice(&crc.to_be_bytes());
        let ok = encode(&[], b"");
        let stream = [ok.clone(), bad, ok].concat();
        let mut decoder = Decoder::default();
        let mut messages = decoder.feed(&stream);
        assert_eq!(messages.next().unwrap().unwrap().number, 1);
        assert_eq!(messages.next().unwrap().unwrap_err(), FrameError::Header { frame: 2 });
        assert!(messages.next().is_none());
        // So is an unknown value type.
        let mut unknown = encode(&[("x", "y")], b"");
        unknown[PRELUDE + 2] = 10;
        let n = unknown.len();
        let crc = crc32fast::hash(&unknown[..n - 4]);
        unknown[n - 4..].copy_from_slice(&crc.to_be_bytes());
        let mut decoder = Decoder::default();
        assert_eq!(
            decoder.feed(&unknown).next().unwrap().unwrap_err(),
            FrameError::Header { frame: 1 }
        );
    }

    #[test]
    fn encode_writes_what_the_decoder_reads() {
        let frame = encode(&[(":message-type", "event"), ("é", "ünïcode")], b"payload");
        only_message(&frame, |m| {
            assert_eq!(m.string(":message-type"), Some("event"));
            assert_eq!(m.string("é"), Some("ünïcode"));
            assert_eq!(m.string("missing"), None);
            assert_eq!(m.payload, b"payload");
        });
        // As Bedrock writes a chunk (the recorded stream's first message, re-encoded).
        let first = recorded().concat();
        let total = u32::from_be_bytes(first[..4].try_into().unwrap()) as usize;
        only_message(&first[..total], |m| {
            let again = encode(
                &[
                    (":event-type", "chunk"),
                    (":content-type", "application/json"),
                    (":message-type", "event"),
                ],
                m.payload,
            );
            assert_eq!(again, &first[..total]);
        });
    }

    #[test]
    fn the_recorded_bedrock_stream_is_the_sse_anthropic_sends() {
        let reads = recorded();
        assert_eq!(reads.len(), 7);
        let whole = reads.concat();
        assert_eq!(sse(&reads.iter().map(Vec::as_slice).collect::<Vec<_>>()), STREAM_SSE);
        assert_eq!(sse(&[&whole]), STREAM_SSE);
        assert_eq!(sse(&whole.chunks(1).collect::<Vec<_>>()), STREAM_SSE);
        assert_eq!(
            events(STREAM_SSE),
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
    }

    #[test]
    fn every_split_point_of_the_recorded_stream_gives_the_same_sse() {
        let whole = recorded().concat();
        for at in 0..=whole.len() {
            let (a, b) = whole.split_at(at);
            assert_eq!(sse(&[a, b]), STREAM_SSE, "split at {at}");
        }
    }

    /// An answer with a tool call, as api.anthropic.com streams it.
    const ANSWER: [&str; 9] = [
        r#"{"type":"message_start","message":{"id":"msg_bdrk_01","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Let me check \"the weather\"\n"}}"#,
        r#"{"type":"content_block_stop","index":0}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{}}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"Paris\"}"}}"#,
        r#"{"type":"content_block_stop","index":1}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":40}}"#,
        r#"{"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":12,"outputTokenCount":40,"invocationLatency":900,"firstByteLatency":300}}"#,
    ];

    const ANSWER_SSE: &str = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_bdrk_01","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Let me check \"the weather\"\n"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"Paris\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":40}}

event: message_stop
data: {"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":12,"outputTokenCount":40,"invocationLatency":900,"firstByteLatency":300}}

"#;

    fn answer_frames() -> Vec<Vec<u8>> {
        ANSWER.iter().map(|e| chunk_frame(e)).collect()
    }

    #[test]
    fn a_whole_answer_as_bedrock_frames_is_the_sse_anthropic_sends() {
        let frames = answer_frames();
        assert_eq!(sse(&frames.iter().map(Vec::as_slice).collect::<Vec<_>>()), ANSWER_SSE);
        assert_eq!(sse(&[&frames.concat()]), ANSWER_SSE);
    }

    const THROTTLED: &str = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"ThrottlingException: Too many requests, please wait before trying again.\"}}\n\n";

    #[test]
    fn a_throttling_exception_mid_stream_is_the_last_event() {
        let frames = answer_frames();
        let throttled = exception_frame(
            "throttlingException",
            "Too many requests, please wait before trying again.",
        );
        let stream = [&frames[..3], &[throttled], &frames[3..]].concat();
        let want = format!(
            "{}{THROTTLED}",
            ANSWER_SSE.split_inclusive("\n\n").take(3).collect::<String>()
        );
        assert_eq!(sse(&stream.iter().map(Vec::as_slice).collect::<Vec<_>>()), want);
        assert_eq!(sse(&[&stream.concat()]), want);
        // What rebound's in-band error reading makes of it: a 429.
        let error = crate::wire::sse::classify_event(THROTTLED.as_bytes()).unwrap();
        assert_eq!(error.equivalent.map(|s| s.as_u16()), Some(429));
    }

    #[test]
    fn exceptions_become_anthropic_error_types() {
        for (exception, kind, status) in [
            ("throttlingException", "rate_limit_error", Some(429)),
            ("serviceUnavailableException", "overloaded_error", Some(529)),
            ("modelNotReadyException", "overloaded_error", Some(529)),
            ("validationException", "invalid_request_error", None),
            ("accessDeniedException", "permission_error", None),
            ("internalServerException", "api_error", Some(500)),
            ("modelStreamErrorException", "api_error", Some(500)),
            ("modelTimeoutException", "api_error", Some(500)),
            ("somethingNewException", "api_error", Some(500)),
            ("ThrottlingException", "rate_limit_error", Some(429)),
        ] {
            let text = sse(&[&exception_frame(exception, "it \"failed\"\nhere")]);
            let mut name = exception.to_string();
            name[..1].make_ascii_uppercase();
            let message = serde_json::to_string(&format!("{name}: it \"failed\"\nhere")).unwrap();
            let data = format!(r#"{{"type":"error","error":{{"type":"{kind}","message":{message}}}}}"#);
            assert_eq!(text, format!("event: error\ndata: {data}\n\n"));
            assert_eq!(events(&text), ["error"]);
            let error = crate::wire::sse::classify_event(text.as_bytes()).unwrap();
            assert_eq!(error.equivalent.map(|s| s.as_u16()), status, "{exception}");
        }
        // Without a message, or a type.
        assert_eq!(
            sse(&[&encode(&[(":message-type", "exception")], b"not json")]),
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"UnknownException\"}}\n\n"
        );
    }

    #[test]
    fn the_recorded_validation_exception_is_an_invalid_request_error() {
        let frames = answer_frames();
        assert_eq!(
            sse(&[&frames[0], VALIDATION_EXCEPTION, &frames[1]]),
            format!(
                "{}{}",
                ANSWER_SSE.split_inclusive("\n\n").next().unwrap(),
                "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"ValidationException: messages.1.content.1.text.citations: Extra inputs are not permitted\"}}\n\n"
            )
        );
    }

    #[test]
    fn an_error_message_ends_the_stream_with_its_code_and_message() {
        assert_eq!(
            sse(&[ERROR_EVENT_MESSAGE, &answer_frames()[0]]),
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"Code: message\"}}\n\n"
        );
    }

    fn corrupt(frame: u64, what: &str) -> String {
        format!("event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"api_error\",\"message\":\"the event stream from Bedrock {what} at frame {frame}\"}}}}\n\n")
    }

    #[test]
    fn a_frame_that_fails_a_checksum_ends_the_stream_with_an_api_error() {
        let frames = answer_frames();
        let first = ANSWER_SSE.split_inclusive("\n\n").take(2).collect::<String>();
        // The third frame's prelude, then its payload.
        let prelude = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"the event stream from Bedrock failed its checksum at frame 3 (prelude)\"}}\n\n";
        for (at, message) in [(5, prelude.to_string()), (40, corrupt(3, "failed its checksum"))] {
            let mut stream = frames.clone();
            stream[2][at] ^= 0x01;
            let want = format!("{first}{message}");
            assert_eq!(sse(&stream.iter().map(Vec::as_slice).collect::<Vec<_>>()), want);
            assert_eq!(sse(&[&stream.concat()]), want);
            events(&want);
        }
        // The recorded stream with its seventh message's CRC broken.
        let mut whole = recorded().concat();
        let mut end = 0;
        for _ in 0..7 {
            end += u32::from_be_bytes(whole[end..end + 4].try_into().unwrap()) as usize;
        }
        whole[end - 1] ^= 0x80;
        let want = format!(
            "{}{}",
            STREAM_SSE.split_inclusive("\n\n").take(6).collect::<String>(),
            corrupt(7, "failed its checksum")
        );
        assert_eq!(sse(&[&whole]), want);
    }

    #[test]
    fn a_chunk_that_is_not_an_anthropic_event_ends_the_stream_with_an_api_error() {
        let chunk = |payload: &str| {
            encode(
                &[(":event-type", "chunk"), (":message-type", "event")],
                payload.as_bytes(),
            )
        };
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let ok = chunk_frame(ANSWER[0]);
        let first = ANSWER_SSE.split_inclusive("\n\n").next().unwrap();
        for payload in [
            "not json".to_string(),
            r#"{"bytes":"!!notbase64!!"}"#.to_string(),
            r#"{"bytes":"e30"}"#.to_string(), // unpadded
            r#"{"other":"e30="}"#.to_string(),
            r#"{"bytes":42}"#.to_string(),
            format!(r#"{{"bytes":"{}"}}"#, b64("[1,2]")),
            format!(r#"{{"bytes":"{}"}}"#, b64(r#"{"no":"type"}"#)),
            format!(r#"{{"bytes":"{}"}}"#, b64(r#"{"type":""}"#)),
            format!(r#"{{"bytes":"{}"}}"#, b64(r#"{"a":1,"type":"x\ny"}"#)),
            // (An event that is not UTF-8 is passed on, as an SSE stream's would be: the app's
            // JSON parser judges it.)
        ] {
            let text = sse(&[&ok, &chunk(&payload), &ok]);
            assert_eq!(
                text,
                format!(
                    "{first}{}",
                    corrupt(2, "carried a chunk that is not an Anthropic event")
                ),
                "{payload}"
            );
        }
    }

    #[test]
    fn chunks_in_other_json_forms_and_events_with_line_breaks_still_make_valid_sse() {
        let chunk = |payload: &str| {
            encode(
                &[(":event-type", "chunk"), (":message-type", "event")],
                payload.as_bytes(),
            )
        };
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let event = r#"{"type":"ping"}"#;
        for payload in [
            format!(r#"{{ "bytes" : "{}" }}"#, b64(event)),
            format!(r#"{{"p":"xyz","bytes":"{}"}}"#, b64(event)),
            format!(r#"{{"bytes":"{}","p":"with space"}}"#, b64(event)),
            format!(r#"{{"bytes":"{}"}}"#, b64(event).replace('/', "\\/")),
            format!(r#"{{"bytes":"{}"}}"#, b64(event)),
        ] {
            assert_eq!(
                sse(&[&chunk(&payload)]),
                format!("event: ping\ndata: {event}\n\n"),
                "{payload}"
            );
        }
        // Pretty-printed, `type` not first: the same JSON on one line.
        let pretty = "{\r\n  \"index\": 0,\n  \"type\": \"content_block_stop\"\n}";
        assert_eq!(
            sse(&[&chunk_frame(pretty)]),
            "event: content_block_stop\ndata: {    \"index\": 0,   \"type\": \"content_block_stop\" }\n\n"
        );
        // An escaped type.
        assert_eq!(
            sse(&[&chunk_frame(r#"{"type":"a\u0062c"}"#)]),
            "event: abc\ndata: {\"type\":\"a\\u0062c\"}\n\n"
        );
    }

    #[test]
    fn other_event_types_and_message_types_are_skipped() {
        let frames = answer_frames();
        let stream = [
            frames[0].clone(),
            encode(
                &[(":event-type", "initial-response"), (":message-type", "event")],
                b"{}",
            ),
            encode(&[(":event-type", "chunk")], b"no message type"),
            encode(&[(":message-type", "something-new")], b""),
            EMPTY_MESSAGE.to_vec(),
            ALL_HEADERS_TYPES.to_vec(),
            frames[1].clone(),
        ];
        assert_eq!(
            sse(&stream.iter().map(Vec::as_slice).collect::<Vec<_>>()),
            ANSWER_SSE.split_inclusive("\n\n").take(2).collect::<String>()
        );
    }

    #[test]
    fn an_end_inside_a_frame_is_reported_and_an_end_between_frames_is_not() {
        let frames = answer_frames();
        let ended = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"the event stream from Bedrock ended inside a frame\"}}\n\n";
        let first = ANSWER_SSE.split_inclusive("\n\n").next().unwrap();
        for cut in [1, 11, 12, 13, frames[1].len() - 1] {
            assert_eq!(sse(&[&frames[0], &frames[1][..cut]]), format!("{first}{ended}"));
        }
        assert_eq!(sse(&[&frames[0]]), first);
        assert_eq!(sse(&[]), "");
    }

    #[test]
    fn the_decoder_holds_at_most_the_message_at_hand() {
        let whole = [recorded().concat(), answer_frames().concat()].concat();
        let largest = 648; // the recorded message_start
        let mut decoder = Decoder::default();
        for chunk in whole.chunks(1000) {
            let mut messages = decoder.feed(chunk);
            while let Some(m) = messages.next() {
                assert!(m.unwrap().payload.len() < largest);
            }
            assert!(decoder.partial.len() < largest);
            assert!(decoder.partial.capacity() <= KEEP);
        }
        assert!(!decoder.in_frame());
        assert_eq!(decoder.frames, 19);
    }

    /// Anthropic-like events with arbitrary text.
    fn event_json() -> impl Strategy<Value = String> {
        (
            prop_oneof![
                Just("content_block_delta"),
                Just("message_start"),
                Just("ping"),
                Just("x")
            ],
            any::<String>(),
            any::<u32>(),
        )
            .prop_map(|(kind, text, index)| {
                serde_json::json!({"type": kind, "index": index, "delta": {"text": text}}).to_string()
            })
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config(256))]

        #[test]
        fn any_split_of_a_stream_gives_the_same_sse(
            cuts in proptest::collection::vec(any::<usize>(), 0..16),
            exception in any::<bool>(),
        ) {
            let mut stream = recorded().concat();
            stream.extend(answer_frames().concat());
            if exception {
                stream.extend(exception_frame("modelStreamErrorException", "boom"));
                stream.extend(chunk_frame(ANSWER[0]));
            }
            let whole = sse(&[&stream]);
            let chunks = cut(&stream, &cuts);
            prop_assert_eq!(&sse(&chunks.iter().map(Vec::as_slice).collect::<Vec<_>>()), &whole);
            prop_assert_eq!(events(&whole).len(), 19 + usize::from(exception));
        }

        #[test]
        fn any_event_comes_out_as_it_went_in(events_in in proptest::collection::vec(event_json(), 0..8), cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
            let stream: Vec<u8> = events_in.iter().flat_map(|e| chunk_frame(e)).collect();
            let chunks = cut(&stream, &cuts);
            let text = sse(&chunks.iter().map(Vec::as_slice).collect::<Vec<_>>());
            let want: String = events_in
                .iter()
                .map(|e| {
                    let kind = serde_json::from_str::<serde_json::Value>(e).unwrap()["type"].as_str().unwrap().to_string();
                    format!("event: {kind}\ndata: {e}\n\n")
                })
                .collect();
            prop_assert_eq!(text, want);
        }

        #[test]
        fn garbage_never_panics_and_what_comes_out_is_valid_sse(
            bytes in any::<Vec<u8>>(),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let chunks = cut(&bytes, &cuts);
            let text = sse(&chunks.iter().map(Vec::as_slice).collect::<Vec<_>>());
            let names = events(&text);
            prop_assert!(names.len() <= 1);
        }

        #[test]
        fn a_damaged_stream_gives_its_events_up_to_the_damage_then_an_error(
            at in any::<usize>(),
            flip in 1..=255u8,
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let mut stream = answer_frames().concat();
            let at = at % stream.len();
            stream[at] ^= flip;
            let chunks = cut(&stream, &cuts);
            let text = sse(&chunks.iter().map(Vec::as_slice).collect::<Vec<_>>());
            let names = events(&text);
            prop_assert_eq!(names.last().map(String::as_str), Some("error"));
            let before = text.rfind("event: error").unwrap();
            prop_assert!(ANSWER_SSE.starts_with(&text[..before]));
        }
    }
}
