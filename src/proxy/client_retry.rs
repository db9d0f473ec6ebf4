//! Steps 6 and 7 for a client's own retry ([`crate::retry::client_retry`]): before the attempts,
//! whether the request repeats a failure for good of moments ago (then it gets one attempt); after
//! them, a failure for good marks the request, and a client's retry that got through clears it.
//! Only on routes that retry (elsewhere every request makes one attempt anyway), and never for an
//! operator's replay of a dead letter.

use tokio::time::Instant;

use super::context::Context;
use super::delivery::Delivery;
use super::request::Request;
use crate::dead_letters::OperatorReplay;
use crate::retry::client_retry::{self, RequestKey};

/// What step 6 found out about the request.
pub(super) struct Repeat {
    /// The request's key, when it was made (only while the route holds a failure).
    key: Option<RequestKey>,
    /// It repeats a failure for good whose window still runs.
    is_repeat: bool,
}

impl Repeat {
    /// Whether the request at `now` is a client's retry: counted
    /// (`rebound_client_retries_total`) and logged when it is.
    pub(super) fn check(cx: &Context, req: &Request, now: Instant) -> Repeat {
        let (route, parts) = (&*req.route, &req.parts);
        // Most requests stop at the second test: a route holds no failure while it is healthy.
        if !route.retries || !route.client_retries.may_hold() || parts.extensions.get::<OperatorReplay>().is_some() {
            return Repeat {
                key: None,
                is_repeat: false,
            };
        }
        let key = key_of(cx, req);
        let is_repeat = route.client_retries.is_repeat(&key, now);
        if is_repeat {
            req.mark_client_retry();
            cx.metrics.client_retries_total.with_label_values(&[&*route.name]).inc();
            tracing::info!(route = %route.name, "a client's retry of a failure for good: one attempt");
        }
        Repeat {
            key: Some(key),
            is_repeat,
        }
    }

    /// After the attempts at `now`: a failure for good marks the request until rebound would try
    /// again (its `retry-after`, else 10 s); a client's retry that did not fail for good clears
    /// it.
    pub(super) fn settle(self, cx: &Context, req: &Request, delivery: &Delivery, now: Instant) {
        let route = &*req.route;
        if !route.retries {
            return;
        }
        if delivery.dead_letter_reason().is_some() {
            let key = self.key.unwrap_or_else(|| key_of(cx, req));
            let window = client_retry::window(delivery.retry_after);
            route.client_retries.failed(key, window, now);
        } else if let Some(key) = self.key.filter(|_| self.is_repeat) {
            route.client_retries.succeeded(&key);
        }
    }
}

/// The request's key: its credential's hash (never the credential), method, path, query, body.
fn key_of(cx: &Context, req: &Request) -> RequestKey {
    let (parts, credential) = (&req.parts, req.credential(&cx.credentials));
    client_retry::request_key(
        &credential,
        &parts.method,
        parts.uri.path(),
        parts.uri.query(),
        &req.body,
    )
}
