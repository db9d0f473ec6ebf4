//! Retry-After and the providers' reset hints, as values and as whole header maps.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rebound::hooks::retry::retry_after::{parse_go_duration, parse_hint, parse_retry_after_ms, parse_retry_after_value};
use std::time::{Duration, UNIX_EPOCH};

const NAMES: [&str; 6] = [
    "retry-after",
    "retry-after-ms",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-reset",
];

fuzz_target!(|data: &[u8]| {
    let now = UNIX_EPOCH + Duration::from_secs(1_795_946_400);
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = parse_retry_after_ms(s);
        let _ = parse_retry_after_value(s, now);
        let _ = parse_go_duration(s);
    }
    let mut headers = http::HeaderMap::new();
    for (i, part) in data.split(|b| *b == b'\n').enumerate() {
        if let Ok(v) = http::HeaderValue::from_bytes(part) {
            headers.append(NAMES[i % NAMES.len()], v);
        }
    }
    let _ = parse_hint(&headers, now);
});
