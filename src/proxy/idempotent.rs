//! Step 5 of the pipeline: what idempotency does with a request before any attempt (claim it,
//! replay a completed original, follow one in flight, or refuse), and the responses it answers
//! with by itself.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};

use super::routes::Route;
use crate::error::ProxyError;
use crate::idempotency::kept::KeptHeaders;
use crate::idempotency::{Check, Claim, Followed, Idempotency, Pending, ReplayIdentity, Start, StoredResponse};
use crate::wire::body::{ProxyBody, RequestLog};
use crate::wire::headers;

/// A request idempotency answers without an attempt.
pub(super) enum Answered {
    Replay(StoredResponse),
    Follow(Followed),
    Refuse(ProxyError),
}

/// Step 5: the claim to carry to the response (and whether the store was bypassed), or the answer.
pub(super) async fn idempotency_step(
    route: &Route,
    parts: &http::request::Parts,
    body: &Bytes,
    log: &mut RequestLog,
) -> Result<(Option<Claim>, bool), Answered> {
    let Some(idem) = &route.idempotency else {
        return Ok((None, false));
    };
    let replay = parts.extensions.get::<ReplayIdentity>();
    let started = match idem.check(parts, body, replay) {
        Check::Decided(start) => start,
        // A store round trip (Redis) or a wait for an original in flight: boxed, so that its
        // state does not enlarge every request's future.
        Check::Wait(pending) => Box::pin(wait(idem, pending, parts, body)).await,
    };
    match started {
        Start::Forward { bypassed } => {
            if bypassed {
                log.set_idempotency("bypassed");
            }
            Ok((None, bypassed))
        }
        Start::Claimed(c) => {
            log.set_idempotency("claimed");
            Ok((Some(c), false))
        }
        Start::Replay(stored) => {
            log.set_idempotency("replayed");
            Err(Answered::Replay(stored))
        }
        Start::Follow(followed) => {
            log.set_idempotency("followed");
            Err(Answered::Follow(followed))
        }
        Start::Refuse(err) => Err(Answered::Refuse(err)),
        // Only from the store (`wait`), which checks again.
        Start::CheckOtherVersion => Err(Answered::Refuse(ProxyError::IdempotencyKeyReused)),
    }
}

/// [`Idempotency::wait`]; when the record's fingerprint may be of the other version (written
/// before an upgrade, or by a replica on the other side of `[redis] fingerprint`), once more with
/// the request's fingerprint of that version.
async fn wait(idem: &Idempotency, pending: Pending, parts: &http::request::Parts, body: &Bytes) -> Start {
    match idem.wait(pending).await {
        Start::CheckOtherVersion => {
            let version = idem.fingerprint_version().other();
            let other = idem.identity_of(version, parts, body);
            match idem.check(parts, body, Some(&other)) {
                Check::Decided(start) => start,
                Check::Wait(pending) => idem.wait(pending).await,
            }
        }
        start => start,
    }
}

/// A completed original's stored response: no upstream call.
pub(super) fn replay_response(stored: StoredResponse, log: RequestLog) -> Response<ProxyBody> {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let body = ProxyBody::full(stored.body, log, status.as_u16());
    shared_response(status, &stored.headers, body)
}

/// The response of an original still in flight, as it is produced: no upstream call.
///
/// On a route with `continue_streams`, a followed stream cut (its owner died, its stream was cut)
/// is continued from what this request received (`again`): when its owner's replica died, by one
/// continuation for every follower of the key, else here.
pub(super) fn follow_response(
    followed: Followed,
    again: Option<Box<super::continued::Again>>,
    log: RequestLog,
) -> Response<ProxyBody> {
    let status = StatusCode::from_u16(followed.head.status).unwrap_or(StatusCode::OK);
    let streams = followed.head.headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("content-type") && v.to_ascii_lowercase().starts_with("text/event-stream")
    });
    let continued = again.filter(|_| status == StatusCode::OK && streams);
    let length = continued.is_none();
    let body = match continued {
        Some(again) => {
            let live = followed.live();
            let continued = again.wrap(followed.body, None, (0, None)).following(live);
            ProxyBody::new(continued, log, status.as_u16())
        }
        None => ProxyBody::new(followed.body, log, status.as_u16()),
    };
    let mut resp = shared_response(status, &followed.head.headers, body);
    if !length {
        // A continued answer has no length known in advance.
        resp.headers_mut().remove(http::header::CONTENT_LENGTH);
    }
    resp
}

/// Another request's response (replayed or followed), with its kept headers.
fn shared_response(status: StatusCode, kept: &KeptHeaders, body: ProxyBody) -> Response<ProxyBody> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = kept_headers(kept);
    let h = resp.headers_mut();
    h.insert(headers::IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    h.insert(headers::X_REBOUND_ATTEMPTS, headers::attempts_value(0));
    resp
}

/// A stored or followed response's kept headers, as a header map.
pub(super) fn kept_headers(kept: &KeptHeaders) -> http::HeaderMap {
    kept.header_map()
}
