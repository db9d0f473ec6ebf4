//! Step 5b of the pipeline: the response cache's answers (a stored entry, or an identical request
//! in flight), recorded as the request's idempotency key's response when it claimed one.

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};

use super::idempotent::kept_headers;
use crate::idempotency::kept::KeptHeaders;
use crate::idempotency::{Claim, Followed, StoredResponse};
use crate::wire::body::{BoxError, ProxyBody, RequestLog};
use crate::wire::headers;
use crate::wire::usage::UsageScan;

/// What counts a cached answer's usage as tokens saved.
pub(super) type Saved = Box<dyn FnOnce(&UsageScan) + Send>;

/// A stored entry: no upstream call (`age`: whole seconds since it was stored).
pub(super) fn hit_response(
    stored: StoredResponse,
    claim: Option<Claim>,
    log: RequestLog,
    saved: Saved,
) -> Response<ProxyBody> {
    let mut scan = UsageScan::default();
    scan.feed(&stored.body);
    saved(&scan);
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let full = Full::new(stored.body).map_err(|never: Infallible| -> BoxError { match never {} });
    let body = match claim {
        Some(c) => ProxyBody::new(record(c, status, &stored.headers, full), log, status.as_u16()),
        None => ProxyBody::new(full, log, status.as_u16()),
    };
    let mut resp = answered(status, &stored.headers, body);
    resp.headers_mut()
        .insert(http::header::AGE, HeaderValue::from(stored.age.as_secs()));
    resp
}

/// The response of an identical request in flight, as it is produced: no upstream call. Its
/// usage is read as it passes and handed to `saved` at its end (tokens saved).
pub(super) fn follow_response(
    followed: Followed,
    claim: Option<Claim>,
    log: RequestLog,
    saved: Saved,
) -> Response<ProxyBody> {
    let status = StatusCode::from_u16(followed.head.status).unwrap_or(StatusCode::OK);
    let kept = followed.head.headers;
    let body = Scanned {
        inner: followed.body.boxed_unsync(),
        scan: UsageScan::default(),
        saved: Some(saved),
    };
    let body = match claim {
        Some(c) => ProxyBody::new(record(c, status, &kept, body), log, status.as_u16()),
        None => ProxyBody::new(body, log, status.as_u16()),
    };
    let mut resp = answered(status, &kept, body);
    resp.headers_mut()
        .insert(http::header::AGE, HeaderValue::from_static("0"));
    resp
}

/// The cache's answer recorded as the response of the request's idempotency key (a fresh key
/// answered from the cache: later requests with the key replay it).
fn record<B>(claim: Claim, status: StatusCode, kept: &KeptHeaders, body: B) -> crate::idempotency::Recorder
where
    B: http_body::Body<Data = Bytes, Error = BoxError> + Send + 'static,
{
    if !claim.stores(status.as_u16()) {
        // Not an outcome the key keeps: dropping the claim frees the key.
        drop(claim);
        return crate::idempotency::Recorder::passthrough(body);
    }
    claim.record(status.as_u16(), &kept_headers(kept), body, None)
}

/// A cached answer with its kept headers, `x-rebound-cache: hit` and no attempt.
fn answered(status: StatusCode, kept: &KeptHeaders, body: ProxyBody) -> Response<ProxyBody> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = kept_headers(kept);
    let h = resp.headers_mut();
    h.insert(headers::X_REBOUND_CACHE, HeaderValue::from_static("hit"));
    h.insert(headers::X_REBOUND_ATTEMPTS, headers::attempts_value(0));
    resp
}

/// A followed body whose usage is read as it passes; at a clean end the usage goes to `saved`.
struct Scanned {
    inner: UnsyncBoxBody<Bytes, BoxError>,
    scan: UsageScan,
    saved: Option<Saved>,
}

impl http_body::Body for Scanned {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let data = data.clone();
                    self.scan.feed(&data);
                }
            }
            Poll::Ready(None) => {
                if let Some(saved) = self.saved.take() {
                    saved(&self.scan);
                }
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
