//! What the integration tests and the benchmarks drive inside the library, behind one hidden
//! module (as `fuzzing` is for the fuzz targets): not API, and not for the app. The library's
//! modules are private; each is reachable here under its own name (`rebound::hooks::config::raw`,
//! `rebound::hooks::idempotency::MemoryStore`), so that what the tests use is one list.

use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use crate::cloud::sigv4;

macro_rules! reach {
    ($($module:ident),+ $(,)?) => {
        $(
            pub mod $module {
                pub use crate::$module::*;
            }
        )+
    };
}

reach!(
    circuit,
    config,
    credentials,
    error,
    idempotency,
    jobs,
    limiter,
    metrics,
    redis,
    retry,
    routing,
    time,
    wire
);

/// Bedrock's event stream as the fake provider and the tests write it: messages, `chunk`s of
/// Anthropic events, exceptions.
pub mod eventstream {
    pub use crate::wire::eventstream::{chunk_frame, encode, exception_frame};
}

/// SigV4 as an attempt to Bedrock gets it: the body hashed, then the request signed with session
/// keys. The length of the `authorization` header it got (0: not signed).
pub fn sigv4_sign(body: &Bytes) -> usize {
    let mut req = Request::new(Full::new(body.clone()));
    *req.method_mut() = http::Method::POST;
    *req.uri_mut() = http::Uri::from_static("/model/anthropic.claude-sonnet-4-5-v1:0/invoke");
    req.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    let keys = sigv4::Keys {
        access_key_id: "ASIAEXAMPLEEXAMPLE".into(),
        secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
        session_token: Some("FwoGZXIvYXdzEXAMPLE".repeat(20)),
    };
    let scope = sigv4::Scope {
        host: "bedrock-runtime.us-east-1.amazonaws.com",
        region: "us-east-1",
        service: "bedrock",
        time: UNIX_EPOCH + Duration::from_secs(1_764_950_400),
    };
    let payload = sigv4::payload_hash(body);
    match sigv4::sign_request(&mut req, &payload, &keys, &scope) {
        Ok(()) => req.headers().get(http::header::AUTHORIZATION).map_or(0, |v| v.len()),
        Err(_) => 0,
    }
}
