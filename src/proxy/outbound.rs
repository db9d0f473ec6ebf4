//! The request an attempt sends upstream, and rebound's error for an attempt that failed before
//! an answer came.

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;

use super::routes::Target;
use crate::config::Api;
use crate::credentials::{self, Credentials};
use crate::error::ProxyError;
use crate::upstream::{error_chain, AttemptError};
use crate::wire::api::{self, Adapted, Host, Sent};
use crate::wire::api::{Invalid, Named};
use crate::wire::headers;

/// The request sent upstream: same method and body, hop-by-hop and rebound's own headers out,
/// `host` from the upstream URL, the upstream's `set_headers` in. An upstream that sets a
/// credential replaces the app's: every credential header and query parameter of the request
/// (`forms`) is left out. A target of another API than the route's gets the request's envelope
/// in its own (path, query, where the model is named, `anthropic_version`), and an answer to
/// re-frame is marked ([`api::Reframe`]). With the request, its body when it is not the
/// app's (a model rewritten, an envelope adapted): what a signature must cover.
pub(super) fn build(
    target: &Target,
    (parts, path, body, named): (&http::request::Parts, &str, Bytes, &Named),
    forms: &Credentials,
) -> Result<(Request<Full<Bytes>>, Option<Bytes>), ProxyError> {
    let upstream = &target.upstream.config;
    let mut adapted = match target.adapt_from {
        Some(from) => adapt(target, from, parts, named, &body).map_err(|e| ProxyError::InvalidModel {
            detail: format!("{e} for upstream {}", target.name),
        })?,
        None => None,
    };
    let rewritten = match adapted.as_mut() {
        Some(a) => a.body.take(),
        // The target's name for the requested model, when it has one (the rest of the body as sent).
        None if target.config.models.is_empty() => None,
        None => crate::wire::usage::rewrite_model(&body, &target.config.models),
    };
    let rewritten = rewritten.map(Bytes::from);
    let body = rewritten.clone().unwrap_or(body);
    let (path, query) = match &adapted {
        Some(a) => (a.path.as_str(), a.query.as_deref()),
        None => (path, parts.uri.query()),
    };
    let uri = match (query, upstream.sets_credential) {
        (Some(q), true) => target.upstream.target_for(path, credentials::strip_query(q).as_deref()),
        (q, _) => target.upstream.target_for(path, q),
    }
    .map_err(|e| ProxyError::InvalidRequestTarget(e.to_string()))?;
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
    if let Some(a) = adapted {
        for name in a.remove {
            headers.remove(name);
        }
        if let Some((name, value)) = a.insert {
            headers.insert(name, value);
        }
        if a.reframe {
            req.extensions_mut().insert(api::Reframe);
        }
    }
    Ok((req, rewritten))
}

/// The request's envelope for a target that speaks another API of the route's family than the
/// route (`from`), naming the target's model; `Ok(None)`: a request the envelope does not know,
/// sent as it came (the host answers it); `Err`: a model the target's paths cannot hold.
fn adapt(
    target: &Target,
    from: Api,
    parts: &http::request::Parts,
    named: &Named,
    body: &[u8],
) -> Result<Option<Adapted>, Invalid> {
    let models = &target.config.models;
    let model = named.model.as_deref().map(|m| models.get(m).map_or(m, String::as_str));
    let upstream = &target.upstream.config;
    let host = Host {
        api: target.config.api,
        base_path: &upstream.base_path,
        gcp_project: upstream.gcp_project.as_deref(),
        gcp_location: upstream.gcp_location.as_deref(),
        azure_api_version: upstream.azure_api_version.as_deref(),
    };
    let sent = Sent {
        api: from,
        query: parts.uri.query(),
        body,
        headers: &parts.headers,
    };
    api::adapt(named, &host, sent, model)
}

pub(super) fn attempt_error(upstream: &str, e: AttemptError) -> ProxyError {
    let upstream = upstream.to_string();
    match e {
        AttemptError::Timeout(t) => ProxyError::Timeout {
            upstream,
            timeout_ms: t.as_millis(),
        },
        AttemptError::Connect(cause) | AttemptError::RefusedStream(cause) | AttemptError::Reset(cause) => {
            ProxyError::UpstreamUnreachable {
                upstream,
                detail: error_chain(&*cause),
            }
        }
    }
}
