//! WebSocket (and any HTTP/1.1 `Upgrade`) pass-through for providers' realtime APIs: the handshake
//! goes to the upstream over HTTP/1.1, and once both sides have switched protocols the two
//! connections are spliced byte for byte. No retry: the session is stateful.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use http_body_util::Full;
use hyper_util::rt::TokioIo;

use super::context::Context;
use super::outbound::attempt_error;
use super::respond::{upstream_response, Came, Claims};
use super::routes::Route;
use crate::error::error_response;
use crate::error::ProxyError;
use crate::wire::body::{ProxyBody, RequestLog};
use crate::wire::headers;

pub(super) async fn pass_through<B>(
    cx: &Context,
    route: &Route,
    path: &str,
    mut req: Request<B>,
    mut log: RequestLog,
) -> Response<ProxyBody> {
    let client_side = hyper::upgrade::on(&mut req);
    let (parts, _) = req.into_parts();
    let upstream = &route.primary().upstream;
    // An upstream that sets a credential replaces the app's (as for every other request).
    let query = match (parts.uri.query(), upstream.config.sets_credential) {
        (Some(q), true) => crate::credentials::strip_query(q),
        (q, _) => q.map(std::borrow::Cow::Borrowed),
    };
    let uri = match upstream.uri_for(path, query.as_deref()) {
        Ok(u) => u,
        Err(e) => return error_response(ProxyError::BadRequestBody(e.to_string()), log),
    };
    let mut upstream_req = Request::new(Full::new(Bytes::new()));
    *upstream_req.method_mut() = parts.method.clone();
    *upstream_req.uri_mut() = uri;
    let h = upstream_req.headers_mut();
    h.clone_from(&parts.headers);
    headers::strip_hop_by_hop(h, true);
    headers::remove_all(h, &headers::NOT_FORWARDED);
    if upstream.config.sets_credential {
        cx.credentials.remove_from(h);
    }
    for (name, value) in &upstream.config.set_headers {
        h.insert(name.clone(), value.clone());
    }

    let result = route
        .primary()
        .upstream
        .send_upgrade(upstream_req, route.retry.per_try_timeout)
        .await;
    log.set_upstream(&route.primary().name, 1);
    let mut resp = match result {
        Ok(resp) => resp,
        Err(e) => {
            tracing::warn!(route = %route.name, upstream = %route.primary().name, error = %e, "upgrade attempt failed");
            return error_response(attempt_error(&route.primary().name, e), log);
        }
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // The upstream declined the upgrade: its answer goes back as it came.
        let came = Came {
            again: None,
            attempts: 1,
            outcome: crate::retry::policy::Outcome::Status(resp.status()),
            meter: None,
            shape: crate::wire::sse::Shape::of(resp.headers()),
        };
        let resp = resp.map(|b| b.map_err(Into::into));
        return upstream_response(resp, (route, route.primary()), came, Claims::none(false), log);
    }
    let upstream_side = hyper::upgrade::on(&mut resp);
    let hard_stop = cx.hard_stop.clone();
    let route_name = route.name.clone();
    cx.tasks.spawn(async move {
        let (client, upstream) = match tokio::try_join!(client_side, upstream_side) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!(route = %route_name, error = %e, "upgrade did not complete");
                return;
            }
        };
        let (mut client, mut upstream) = (TokioIo::new(client), TokioIo::new(upstream));
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
            _ = hard_stop.cancelled() => {}
        }
    });
    let (mut parts, _) = resp.into_parts();
    headers::strip_hop_by_hop(&mut parts.headers, true);
    parts
        .headers
        .insert(headers::X_REBOUND_ATTEMPTS, headers::attempts_value(1));
    Response::from_parts(parts, ProxyBody::full(Bytes::new(), log, 101))
}
