//! The AWS event stream (`application/vnd.amazon.eventstream`) as Amazon Bedrock writes it, for the
//! fake provider's Bedrock host (`fake_hosts.rs`) and the tests that read what it sent: an encoder
//! and a decoder written from the format's specification, independent of rebound's own.
//!
//! A message: the prelude (total length u32 BE, headers length u32 BE, the CRC32 of those 8 bytes),
//! the headers (`[name len u8][name][type u8][value]`; Bedrock sends only strings, type 7, as
//! `[len u16 BE][bytes]`), the payload, and the CRC32 of everything before it.
//!
//! Bedrock's `InvokeModelWithResponseStream` sends one message per Anthropic event: headers
//! `:event-type` = `chunk`, `:content-type` = `application/json`, `:message-type` = `event`, and the
//! payload `{"bytes":"<base64 of the event's JSON>","p":"<padding>"}` ([`chunk`]); an error while
//! streaming is a message with `:message-type` = `exception` and `:exception-type` (e.g.
//! `throttlingException`), its payload `{"message":"..."}` ([`exception`]).

#![allow(dead_code)]

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

/// The header value type of a string.
const STRING: u8 = 7;

/// One message: string headers, in order, and the payload.
pub fn message(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut head = Vec::new();
    for (name, value) in headers {
        let name_len = u8::try_from(name.len()).expect("a header name of at most 255 bytes");
        let value_len = u16::try_from(value.len()).expect("a header value of at most 65535 bytes");
        head.push(name_len);
        head.extend_from_slice(name.as_bytes());
        head.push(STRING);
        head.extend_from_slice(&value_len.to_be_bytes());
        head.extend_from_slice(value.as_bytes());
    }
    let total = 12 + head.len() + payload.len() + 4;
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&u32::try_from(total).expect("a message under 4 GiB").to_be_bytes());
    out.extend_from_slice(&u32::try_from(head.len()).expect("headers under 4 GiB").to_be_bytes());
    out.extend_from_slice(&crc32fast::hash(&out).to_be_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// Bedrock's padding: letters, so that the length of a message says little about its event.
/// Deterministic here (the real one varies).
fn padding(len: usize) -> String {
    const LETTERS: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    LETTERS[..len % LETTERS.len()].to_string()
}

/// The `chunk` message carrying one Anthropic event (its JSON, as the `data:` of Anthropic's SSE).
pub fn chunk(event_json: &str) -> Vec<u8> {
    let payload = format!(
        r#"{{"bytes":"{}","p":"{}"}}"#,
        STANDARD.encode(event_json),
        padding(event_json.len())
    );
    message(
        &[
            (":event-type", "chunk"),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.as_bytes(),
    )
}

/// An exception message (`throttlingException`, `serviceUnavailableException`,
/// `modelStreamErrorException`, `internalServerException`, `validationException`,
/// `modelTimeoutException`), as Bedrock ends a stream that failed.
pub fn exception(exception_type: &str, message_text: &str) -> Vec<u8> {
    let payload = serde_json::json!({ "message": message_text }).to_string();
    message(
        &[
            (":exception-type", exception_type),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        payload.as_bytes(),
    )
}

/// `message` with its message checksum (the last 4 bytes) broken; the prelude's still holds, so a
/// decoder reads the whole message before it finds out.
pub fn corrupt(mut message: Vec<u8>) -> Vec<u8> {
    if let Some(last) = message.last_mut() {
        *last ^= 0xff;
    }
    message
}

/// A decoded message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub headers: Vec<(String, String)>,
    pub payload: Vec<u8>,
}

impl Message {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The Anthropic event a `chunk` carries (its payload's `bytes`, decoded).
    pub fn event(&self) -> Result<serde_json::Value, String> {
        let payload: serde_json::Value = serde_json::from_slice(&self.payload).map_err(|e| e.to_string())?;
        let bytes = payload["bytes"].as_str().ok_or("no bytes")?;
        let json = STANDARD.decode(bytes).map_err(|e| e.to_string())?;
        serde_json::from_slice(&json).map_err(|e| e.to_string())
    }
}

fn be32(b: &[u8]) -> usize {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize
}

/// Every message of `bytes`, both checksums verified; an error names the message (from 1) and
/// what was wrong. Header values other than strings are read as their raw bytes.
pub fn decode(mut bytes: &[u8]) -> Result<Vec<Message>, String> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let n = out.len() + 1;
        if bytes.len() < 16 {
            return Err(format!("message {n}: {} bytes left, less than a message", bytes.len()));
        }
        let (total, headers_len) = (be32(&bytes[0..4]), be32(&bytes[4..8]));
        if be32(&bytes[8..12]) != crc32fast::hash(&bytes[..8]) as usize {
            return Err(format!("message {n}: prelude checksum"));
        }
        if total < 16 + headers_len || total > bytes.len() {
            return Err(format!(
                "message {n}: length {total}, headers {headers_len}, {} bytes",
                bytes.len()
            ));
        }
        if be32(&bytes[total - 4..total]) != crc32fast::hash(&bytes[..total - 4]) as usize {
            return Err(format!("message {n}: message checksum"));
        }
        let mut head = &bytes[12..12 + headers_len];
        let mut headers = Vec::new();
        while !head.is_empty() {
            let name_len = head[0] as usize;
            let name = String::from_utf8_lossy(head.get(1..1 + name_len).ok_or("header name")?).into_owned();
            head = &head[1 + name_len..];
            let kind = *head.first().ok_or("header type")?;
            let value_len = match kind {
                0 | 1 => 0,
                2 => 1,
                3 => 2,
                4 => 4,
                5 | 8 => 8,
                9 => 16,
                6 | 7 => match head.get(1..3) {
                    Some(len) => 2 + u16::from_be_bytes([len[0], len[1]]) as usize,
                    None => return Err(format!("message {n}: header {name}'s length")),
                },
                other => return Err(format!("message {n}: header type {other}")),
            };
            let value = head.get(1..1 + value_len).ok_or("header value")?;
            let value = if kind == 6 || kind == STRING {
                &value[2..]
            } else {
                value
            };
            headers.push((name, String::from_utf8_lossy(value).into_owned()));
            head = &head[1 + value_len..];
        }
        out.push(Message {
            headers,
            payload: bytes[12 + headers_len..total - 4].to_vec(),
        });
        bytes = &bytes[total..];
    }
    Ok(out)
}
