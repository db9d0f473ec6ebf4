//! Micro-benchmarks of the functions every request runs (divan): a regression here shows before
//! the load benchmark (`bench/run`) would. `cargo bench --bench hot_path`.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the clock and lock rules are the product's: harnesses measure real time and keep their own fixtures
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use divan::{black_box, Bencher};
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use rebound::hooks::circuit::breaker::{Admission, Attempt, Breaker, BreakerConfig};
use rebound::hooks::config::FailureOn;
use rebound::hooks::idempotency::fingerprint::{fingerprint, fingerprint_v1};
use rebound::hooks::retry::policy::Outcome;
use rebound::hooks::retry::retry_after::parse_hint;
use rebound::hooks::routing::RouteTable;
use rebound::hooks::wire::headers::strip_hop_by_hop;

fn main() {
    divan::main();
}

/// Headers as an OpenAI SDK sends them, plus hop-by-hop ones for the hygiene pass.
fn request_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in [
        ("host", "localhost:8080"),
        ("authorization", "Bearer sk-proj-0123456789abcdef0123456789abcdef"),
        ("content-type", "application/json"),
        ("accept", "application/json"),
        ("user-agent", "OpenAI/Python 1.99.0"),
        ("x-stainless-lang", "python"),
        ("x-stainless-retry-count", "0"),
        ("x-stainless-timeout", "600"),
        ("connection", "keep-alive, x-custom-hop"),
        ("x-custom-hop", "1"),
        ("keep-alive", "timeout=5"),
        ("idempotency-key", "order-42"),
    ] {
        h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
    }
    h
}

#[divan::bench]
fn route_lookup(b: Bencher) {
    let table = RouteTable::new(
        [
            "/openai/",
            "/anthropic/",
            "/openai/v1/batches/",
            "/azure/",
            "/email/",
            "/embeddings/",
        ]
        .into_iter()
        .enumerate()
        .map(|(i, p)| (p.to_string(), i)),
    );
    b.bench(|| table.find(black_box("/openai/v1/chat/completions")).map(|(_, v)| *v));
}

#[divan::bench]
fn header_hygiene(b: Bencher) {
    let headers = request_headers();
    b.with_inputs(|| headers.clone())
        .bench_local_refs(|h| strip_hop_by_hop(black_box(h), false));
}

#[divan::bench(args = ["v2", "v1"])]
fn fingerprint_json_body(b: Bencher, version: &str) {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let body = br#"{"model":"gpt-4o","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Summarise the attached ticket in one line, please."}],"temperature":0.2,"stream":true}"#;
    let f = if version == "v2" { fingerprint } else { fingerprint_v1 };
    b.bench(|| f(&Method::POST, "/v1/chat/completions", None, &headers, black_box(body)));
}

/// A 1 MiB chat body as agents send it: many messages, escapes in every one.
fn chat_body_1mib() -> Vec<u8> {
    let mut body = String::from(r#"{"model":"gpt-4o","messages":["#);
    let mut i = 0;
    while body.len() < 1024 * 1024 {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&format!(
            r#"{{"role":"user","content":"Line {i} of the ticket: the customer said \"it broke\".\nSummarise the log in one line.\n"}}"#
        ));
        i += 1;
    }
    body.push_str(r#"],"temperature":0.2}"#);
    body.into_bytes()
}

#[divan::bench(args = ["v2", "v1"])]
fn fingerprint_1mib_chat_body(b: Bencher, version: &str) {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let body = chat_body_1mib();
    let f = if version == "v2" { fingerprint } else { fingerprint_v1 };
    b.bench(|| f(&Method::POST, "/v1/chat/completions", None, &headers, black_box(&body)));
}

/// The body mode's 1 MiB body: one long string.
#[divan::bench(args = ["v2", "v1"])]
fn fingerprint_1mib_string_body(b: Bencher, version: &str) {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let body = format!(r#"{{"model":"m","input":"{}"}}"#, "x".repeat((1 << 20) - 26)).into_bytes();
    let f = if version == "v2" { fingerprint } else { fingerprint_v1 };
    b.bench(|| f(&Method::POST, "/v1/chat/completions", None, &headers, black_box(&body)));
}

#[divan::bench]
fn retry_after_parse(b: Bencher) {
    let mut headers = HeaderMap::new();
    headers.insert("retry-after", HeaderValue::from_static("2"));
    headers.insert("x-ratelimit-reset-requests", HeaderValue::from_static("1m30.5s"));
    headers.insert("x-ratelimit-reset-tokens", HeaderValue::from_static("250ms"));
    let now = UNIX_EPOCH + Duration::from_secs(1_795_946_400);
    b.bench(|| parse_hint(black_box(&headers), black_box(now)));
}

#[divan::bench]
fn breaker_admit_and_record(b: Bencher) {
    let cfg = BreakerConfig {
        consecutive_failures: 5,
        failure_rate: 0.5,
        minimum_requests: 20,
        window: Duration::from_secs(30),
        open_for: Duration::from_secs(5),
        max_open_for: Duration::from_secs(300),
        half_open_probes: 1,
        failure_on: vec![FailureOn::AnyServerError],
        probe_lease: Duration::from_secs(90),
    };
    let now = rebound::hooks::time::now();
    let mut breaker = Breaker::new(cfg, now);
    let mut rng = rand::rng();
    let ok = Outcome::Status(http::StatusCode::OK);
    b.bench_local(|| {
        if let (Admission::Allowed(ticket), _) = breaker.admit(Attempt::First, now) {
            black_box(breaker.record(ticket, ok, None, now, &mut rng));
        }
    });
}

#[divan::bench]
fn wall_clock(b: Bencher) {
    b.bench(SystemTime::now);
}

/// SigV4 of an attempt with a 100 KiB body (`auth = "aws"`): the body's SHA-256 (once per
/// request), then the signature.
#[divan::bench]
fn sigv4_sign_100kib_body(b: Bencher) {
    let body = bytes::Bytes::from(vec![b'x'; 100 * 1024]);
    b.bench(|| rebound::hooks::sigv4_sign(black_box(&body)));
}

/// The signature alone (what a retry or a second target costs: the hash is kept).
#[divan::bench]
fn sigv4_sign_empty_body(b: Bencher) {
    let body = bytes::Bytes::new();
    b.bench(|| rebound::hooks::sigv4_sign(black_box(&body)));
}
