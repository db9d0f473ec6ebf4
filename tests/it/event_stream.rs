//! The test support's AWS event stream encoder and decoder (`support/event_stream.rs`), which the
//! fake provider's Bedrock host writes its streams with: botocore's test vectors, byte for byte.

use base64::Engine as _;

use crate::support::event_stream::{self, decode};

// botocore's event stream test vectors (tests/unit/test_eventstream.py): the messages whose
// headers are all strings, which is what Bedrock sends and the encoder writes.
const EMPTY: &[u8] = b"\x00\x00\x00\x10\x00\x00\x00\x00\x05\xc2H\xeb}\x98\xc8\xff";
const PAYLOAD_NO_HEADERS: &[u8] = b"\x00\x00\x00\x1d\x00\x00\x00\x00\xfdR\x8cZ{'foo':'bar'}\xc3e96";
const ONE_STRING_HEADER: &[u8] = b"\x00\x00\x00=\x00\x00\x00 \x07\xfd\x83\x96\x0ccontent-type\x07\x00\x10\
application/json{'foo':'bar'}\x8d\x9c\x08\xb1";
const ERROR_MESSAGE: &[u8] = b"\x00\x00\x00\x52\x00\x00\x00\x42\xbf\x23\x63\x7e\
\x0d:message-type\x07\x00\x05error\x0b:error-code\x07\x00\x04code\x0e:error-message\x07\x00\x07message\
\x6b\x6c\xea\x3d";
const INITIAL_RESPONSE: &[u8] = b"\x00\x00\x00~\x00\x00\x00O\xc5\xa3\xdd\xc6\r:message-type\x07\x00\x05event\
\x0b:event-type\x07\x00\x10initial-response\r:content-type\x07\x00\ttext/json\
{\"InitialResponse\": \"sometext\"}\xf6\x98$\x83";
/// Every header type (bool, byte, short, int, long, bytes, string, timestamp, uuid): read only.
const ALL_HEADER_TYPES: &[u8] = b"\x00\x00\x00\x62\x00\x00\x00\x52\x03\xb5\xcb\x9c\
\x010\x00\x011\x01\x012\x02\x02\x013\x03\x00\x03\x014\x04\x00\x00\x00\x04\x015\x05\x00\x00\x00\x00\x00\x00\x00\x05\
\x016\x06\x00\x05bytes\x017\x07\x00\x04utf8\x018\x08\x00\x00\x00\x00\x00\x00\x00\x08\x019\x090123456789abcdef\
\x63\x35\x36\x71";

#[test]
fn the_encoder_writes_botocores_vectors_byte_for_byte() {
    assert_eq!(event_stream::message(&[], b""), EMPTY);
    assert_eq!(event_stream::message(&[], b"{'foo':'bar'}"), PAYLOAD_NO_HEADERS);
    assert_eq!(
        event_stream::message(&[("content-type", "application/json")], b"{'foo':'bar'}"),
        ONE_STRING_HEADER
    );
    assert_eq!(
        event_stream::message(
            &[
                (":message-type", "error"),
                (":error-code", "code"),
                (":error-message", "message")
            ],
            b""
        ),
        ERROR_MESSAGE
    );
    assert_eq!(
        event_stream::message(
            &[
                (":message-type", "event"),
                (":event-type", "initial-response"),
                (":content-type", "text/json")
            ],
            br#"{"InitialResponse": "sometext"}"#
        ),
        INITIAL_RESPONSE
    );
}

#[test]
fn the_decoder_reads_the_vectors_and_refuses_a_broken_checksum() {
    let all = [
        EMPTY,
        PAYLOAD_NO_HEADERS,
        ONE_STRING_HEADER,
        ERROR_MESSAGE,
        INITIAL_RESPONSE,
        ALL_HEADER_TYPES,
    ]
    .concat();
    let messages = decode(&all).unwrap();
    assert_eq!(messages.len(), 6);
    assert_eq!(messages[2].header("content-type"), Some("application/json"));
    assert_eq!(messages[2].payload, b"{'foo':'bar'}");
    assert_eq!(messages[3].header(":error-code"), Some("code"));
    assert_eq!(messages[5].headers.len(), 10);
    assert_eq!(messages[5].header("7"), Some("utf8"));

    let broken = event_stream::corrupt(ONE_STRING_HEADER.to_vec());
    assert_eq!(
        decode(&[EMPTY, &broken].concat()).unwrap_err(),
        "message 2: message checksum"
    );
    let mut prelude = EMPTY.to_vec();
    prelude[3] ^= 1;
    assert_eq!(decode(&prelude).unwrap_err(), "message 1: prelude checksum");
}

#[test]
fn a_chunk_carries_its_event_in_base64_and_an_exception_its_message() {
    let event = r#"{"type":"message_stop"}"#;
    let chunk = &decode(&event_stream::chunk(event)).unwrap()[0];
    assert_eq!(chunk.header(":event-type"), Some("chunk"));
    assert_eq!(chunk.header(":content-type"), Some("application/json"));
    assert_eq!(chunk.header(":message-type"), Some("event"));
    let payload: serde_json::Value = serde_json::from_slice(&chunk.payload).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(event);
    assert_eq!(payload["bytes"], b64.as_str());
    assert!(payload["p"].is_string());
    assert_eq!(chunk.event().unwrap()["type"], "message_stop");

    let exception = &decode(&event_stream::exception("throttlingException", "slow down")).unwrap()[0];
    assert_eq!(exception.header(":message-type"), Some("exception"));
    assert_eq!(exception.header(":exception-type"), Some("throttlingException"));
    assert_eq!(exception.payload, br#"{"message":"slow down"}"#);
}

/// rebound's own encoder (`hooks::eventstream`, written apart from this one, for the same
/// purpose) writes the same messages, byte for byte: what the fake's Bedrock host sends is what
/// rebound's unit tests decode.
#[test]
fn rebounds_encoder_writes_the_same_messages() {
    use rebound::hooks::eventstream::{chunk_frame, encode, exception_frame};
    assert_eq!(
        encode(&[("content-type", "application/json")], b"{'foo':'bar'}"),
        ONE_STRING_HEADER
    );
    for event in [
        r#"{"type":"message_stop"}"#,
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"token0 "}}"#,
    ] {
        assert_eq!(chunk_frame(event), event_stream::chunk(event), "{event}");
    }
    assert_eq!(
        exception_frame("throttlingException", "Too many \"tokens\""),
        event_stream::exception("throttlingException", "Too many \"tokens\"")
    );
}
