//! Step 8's upstream answer: the response as it came, with rebound's headers, its body streamed
//! through the idle timeout, the mid-stream error watch and the recorders of the claims it is
//! stored for.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Response};
use http_body_util::Either;

use super::delivery::Delivery;
use super::routes::{Route, Target};
use super::stream::{ErrorWatch, IdleTimeout};
use super::tokens::Meter;
use crate::cache::Looked;
use crate::idempotency::Claim;
use crate::retry::policy::Outcome;
use crate::wire::body::{self, ProxyBody, RequestLog};
use crate::wire::headers;
use crate::wire::sse::Shape;

/// How an answer came: after how many attempts, the last one's outcome, the meter of its token
/// usage (when the route counts it), and its shape (read once, from its `content-type`).
pub(super) struct Came {
    pub(super) attempts: u32,
    pub(super) outcome: Outcome,
    pub(super) meter: Option<Meter>,
    pub(super) shape: Shape,
    /// How the stream is continued when cut, on a route with `continue_streams`.
    pub(super) again: Option<Box<super::continued::Again>>,
}

/// The upstream's response as it came, minus hop-by-hop headers, plus `x-rebound-attempts`. A
/// failure on a route that retries also gets `x-should-retry: false`: rebound is the retry layer,
/// the SDK must not retry on top. The body streams through under `stream_idle_timeout`; an event
/// stream is watched for an error event mid-stream (counted, passed through).
pub(super) fn upstream_response<B>(
    resp: Response<B>,
    (route, target): (&Route, &Target),
    came: Came,
    claims: Claims,
    log: RequestLog,
) -> Response<ProxyBody>
where
    B: http_body::Body<Data = Bytes, Error = body::BoxError> + Send + Unpin + 'static,
{
    let Came {
        attempts,
        outcome,
        meter,
        shape,
        again,
    } = came;
    let (mut parts, body) = resp.into_parts();
    headers::strip_hop_by_hop(&mut parts.headers, false);
    // Room for rebound's own headers at once (the map is sized for the upstream's).
    parts.headers.reserve(4);
    parts
        .headers
        .insert(headers::X_REBOUND_ATTEMPTS, headers::attempts_value(attempts));
    if outcome.is_failure() && route.retries {
        parts
            .headers
            .insert(headers::X_SHOULD_RETRY, HeaderValue::from_static("false"));
    }
    let status = parts.status.as_u16();
    let first_event_error = matches!(outcome, Outcome::InBand(_));
    let (body, stream_error) = ErrorWatch::for_response(body, shape, first_event_error, &target.attempts, meter);
    let body = IdleTimeout::new(body, route.retry.stream_idle_timeout);
    // A stream of a route that continues cut streams: finished elsewhere when it is cut.
    let body = match again.filter(|_| status == 200 && shape == Shape::EventStream) {
        Some(again) => {
            parts
                .headers
                .insert(headers::X_REBOUND_CONTINUABLE, super::continued::Again::header());
            // A continued answer has no length known in advance.
            parts.headers.remove(http::header::CONTENT_LENGTH);
            Either::Left(again.wrap(body, stream_error.clone(), (attempts, Some(target.index))))
        }
        None => Either::Right(body),
    };
    // The cache entry's recorder first: an answer it does not keep is still shared with its
    // followers, then the entry freed at its end.
    let body = match claims.cache.and_then(|c| c.recording) {
        Some(Recording { claim, kept }) => {
            let failed = match kept {
                true => stream_error.clone(),
                false => Some(Arc::new(AtomicBool::new(true))),
            };
            Either::Left(claim.record(status, &parts.headers, body, failed))
        }
        None => Either::Right(body),
    };
    let body = match claims.idempotency {
        // A stream with an error event in it is passed through, but not stored: the key is
        // released at its end, so that the app's retry runs.
        Some(claim) => ProxyBody::new(claim.record(status, &parts.headers, body, stream_error), log, status),
        None => ProxyBody::new(body, log, status),
    };
    Response::from_parts(parts, body)
}

/// The claims a response is recorded for: the idempotency key's (or whether the store was
/// bypassed), and the response cache's.
pub(super) struct Claims {
    pub(super) idempotency: Option<Claim>,
    /// The idempotency store could not be reached and the request went on without it
    /// (`x-rebound-idempotency: bypassed`).
    pub(super) bypassed: bool,
    pub(super) cache: Option<CacheClaim>,
}

/// The response cache's part in a response: its `x-rebound-cache` value, and the entry's claim
/// when the response is recorded for it.
pub(super) struct CacheClaim {
    pub(super) header: &'static str,
    pub(super) recording: Option<Recording>,
}

/// A cache entry's claim a response is recorded for, and whether the store keeps this answer
/// (else it is shared with followers as it is produced, then the entry is freed).
pub(super) struct Recording {
    claim: Claim,
    kept: bool,
}

impl Claims {
    /// No claim: the route has neither, or the idempotency store was `bypassed`.
    pub(super) fn none(bypassed: bool) -> Claims {
        Claims {
            idempotency: None,
            bypassed,
            cache: None,
        }
    }

    /// What each claim does with the delivery. An outcome the idempotency store does not keep
    /// frees the key first, so that the app's retry runs instead of waiting for the lease. A cache
    /// entry claimed records the response, kept or not: followers get it as it is produced either
    /// way; rebound's own error has nothing to share, and the entry is freed.
    ///
    /// The delivery passes through: held by this (boxed) future while the release waits, it takes
    /// no room in the request's own.
    pub(super) async fn settle(
        (idempotency, bypassed): (Option<Claim>, bool),
        cache: Option<Looked>,
        delivery: Delivery,
    ) -> (Claims, Delivery) {
        let idempotency = match idempotency {
            Some(c) if delivery.stored_by(&c) => Some(c),
            Some(c) => {
                c.release().await;
                None
            }
            None => None,
        };
        let cache = cache.map(|looked| {
            let header = looked.header_value();
            let recording = match looked {
                Looked::Claimed(claim) if delivery.result.is_ok() => {
                    let kept = delivery.stored_by(&claim);
                    Some(Recording { claim, kept })
                }
                _ => None,
            };
            CacheClaim { header, recording }
        });
        let claims = Claims {
            idempotency,
            bypassed,
            cache,
        };
        (claims, delivery)
    }
}
