//! The request an attempt sends upstream, and rebound's error for an attempt that failed before
//! an answer came.

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;

use super::routes::Target;
use crate::credentials::{self, Credentials};
use crate::error::ProxyError;
use crate::upstream::AttemptError;
use crate::wire::headers;

/// The request sent upstream: same method and body, hop-by-hop and rebound's own headers out,
/// `host` from the upstream URL, the upstream's `set_headers` in. An upstream that sets a
/// credential replaces the app's: every credential header and query parameter of the request
/// (`forms`) is left out.
pub(super) fn build(
    target: &Target,
    parts: &http::request::Parts,
    path: &str,
    body: Bytes,
    forms: &Credentials,
) -> Result<Request<Full<Bytes>>, http::uri::InvalidUri> {
    let upstream = &target.upstream.config;
    let uri = match (parts.uri.query(), upstream.sets_credential) {
        (Some(q), true) => target
            .upstream
            .target_for(path, credentials::strip_query(q).as_deref())?,
        (q, _) => target.upstream.target_for(path, q)?,
    };
    // The target's name for the requested model, when it has one (the rest of the body as sent).
    let body = match target.config.models.is_empty() {
        true => body,
        false => crate::wire::usage::rewrite_model(&body, &target.config.models).map_or(body, Bytes::from),
    };
    let body_len = body.len();
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    let headers = req.headers_mut();
    headers.clone_from(&parts.headers);
    headers::strip_hop_by_hop(headers, false);
    // Rebound's own headers out; the client sets `host` (HTTP/1.1) or `:authority` (HTTP/2)
    // from the upstream URI; the length is the buffered body's.
    headers::remove_all(headers, &headers::NOT_FORWARDED);
    if body_len > 0 || matches!(parts.method, Method::POST | Method::PUT | Method::PATCH) {
        let stated = parts.headers.get(http::header::CONTENT_LENGTH);
        headers.insert(http::header::CONTENT_LENGTH, headers::content_length(body_len, stated));
    }
    if upstream.sets_credential {
        forms.remove_from(headers);
    }
    for (name, value) in &upstream.set_headers {
        headers.insert(name.clone(), value.clone());
    }
    Ok(req)
}

pub(super) fn attempt_error(upstream: &str, e: AttemptError) -> ProxyError {
    let upstream = upstream.to_string();
    match e {
        AttemptError::Timeout(t) => ProxyError::Timeout {
            upstream,
            timeout_ms: t.as_millis(),
        },
        AttemptError::Connect(detail) | AttemptError::RefusedStream(detail) | AttemptError::Reset(detail) => {
            ProxyError::UpstreamUnreachable { upstream, detail }
        }
    }
}
