//! The idempotency key validator and the request fingerprint (JSON and multipart canonicalised).
#![no_main]
use libfuzzer_sys::fuzz_target;
use rebound::hooks::idempotency::fingerprint::{fingerprint, request_key};

fuzz_target!(|data: &[u8]| {
    let name = http::HeaderName::from_static("idempotency-key");
    let mut headers = http::HeaderMap::new();
    if let Ok(v) = http::HeaderValue::from_bytes(data) {
        headers.insert(name.clone(), v);
    }
    let _ = request_key(&headers, &name);
    for ct in ["application/json", "multipart/form-data; boundary=b", "text/plain"] {
        let mut h = http::HeaderMap::new();
        h.insert("content-type", http::HeaderValue::from_static(ct));
        let _ = fingerprint(&http::Method::POST, "/v1/x", Some("a=1&b=2"), &h, data);
    }
    let _ = rebound::hooks::jobs::prefer::prefers_async(&headers);
});
