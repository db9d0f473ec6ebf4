//! One attempt up to its commit point: send, wait for the response head (`per_try_timeout`), then
//! read a successful response ahead before anything is forwarded:
//!
//! - an event stream (`text/event-stream`) until its first complete event (a blank line), so that
//!   an error reported as that event (an in-band error, [`crate::wire::sse`]) is retried like the
//!   status it stands for;
//! - a JSON body (`application/json`) to its end, so that a 200 whose body is an error object is
//!   too;
//! - anything else until its first body byte, as before.
//!
//! The read-ahead is bounded by [`LOOKAHEAD`] bytes and by the first byte's deadline
//! (`first_byte_timeout` from the head, within the request's remaining time). No byte by then is a
//! timeout (retryable); some bytes, but not the whole event or body, commit the response as it is
//! (a stream that has started is never retried and a healthy generation is never held back). Only
//! the prefix is held, as the frames came ([`Primed`]); it is copied only when the first event
//! spans several frames and may be an error, and parsed only when it contains `error`.

use std::time::Duration;

use bytes::Bytes;
use futures_util::future::Either;
use futures_util::FutureExt as _;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt as _;
use http_body_util::Full;
use tokio::time::Instant;

use super::primed::Primed;
use super::routes::{Route, Target};
use crate::retry::policy::Outcome;
use crate::retry::provider_error::{self, ErrorSignal};
use crate::upstream::{AttemptError, Cause, UpstreamBody};
use crate::wire::api::{Reframe, Reframed};
use crate::wire::sse::{self, EventEnd, InBandError, Shape};

/// The most rebound reads ahead of the commit point.
pub(crate) const LOOKAHEAD: usize = 64 * 1024;

/// One attempt: the response (its prefix read ahead, an in-band error marked as an
/// [`InBandError`] extension) or why it failed, and when it was received.
///
/// The send's future, then the read-ahead's, one after the other in the same room (`then`): an
/// `async fn` here would also keep the request it was given, long sent, and the two futures side
/// by side. Every request in flight holds this until its first event.
pub(super) fn attempt<'a>(
    route: &'a Route,
    target: &'a Target,
    req: Request<Full<Bytes>>,
    started: Instant,
    remaining: Duration,
) -> impl std::future::Future<Output = (Result<Response<Primed<UpstreamBody>>, AttemptError>, Instant)> + Send + 'a {
    let policy = &route.retry;
    // A target's own first_byte_timeout runs from sending the request: it bounds the head too.
    let own = target.config.first_byte_timeout;
    let head_limit = own.map_or(policy.per_try_timeout, |t| t.min(policy.per_try_timeout));
    let reframe = req.extensions().get::<Reframe>().is_some();
    target.upstream.send(req, head_limit.min(remaining)).then(move |sent| {
        let head_at = crate::time::now();
        target.attempts.duration.observe((head_at - started).as_secs_f64());
        match sent {
            Err(e) => Either::Left(std::future::ready((Err(e), head_at))),
            Ok(resp) => {
                let wait = match own {
                    Some(t) => t.saturating_sub(head_at - started),
                    None => policy.first_byte_timeout,
                };
                let left = remaining.saturating_sub(head_at - started);
                let resp = match reframe {
                    true => reframed(resp),
                    false => resp,
                };
                Either::Right(read_to_commit(target, resp, head_at, wait.min(left), left))
            }
        }
    })
}

/// A successful Bedrock event stream, as the Anthropic SSE it carries (the app asked a host of
/// another shape, `wire::api`): the body re-framed as it is read, the head saying so.
fn reframed(mut resp: Response<UpstreamBody>) -> Response<UpstreamBody> {
    let eventstream = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().get(..EVENTSTREAM.len()))
        .is_some_and(|v| v.eq_ignore_ascii_case(EVENTSTREAM));
    if resp.status().is_success() && eventstream {
        let headers = resp.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/event-stream"),
        );
        headers.remove(http::header::CONTENT_LENGTH);
        resp.extensions_mut().insert(Reframed);
        resp.body_mut().reframe();
    }
    resp
}

/// Bedrock's stream framing.
const EVENTSTREAM: &str = "application/vnd.amazon.eventstream";

/// The response, read to its commit point: a successful one ahead within `wait` (the first
/// byte's deadline), an error one's small body within [`ERROR_BODY_WAIT`] (and `left`, the
/// request's remaining time), to classify it.
///
/// A plain `fn` returning a block: the response is taken apart before the block, which holds its
/// parts once (an `async fn` would also hold the response as passed).
fn read_to_commit(
    target: &Target,
    resp: Response<UpstreamBody>,
    head_at: Instant,
    wait: Duration,
    left: Duration,
) -> impl std::future::Future<Output = (Result<Response<Primed<UpstreamBody>>, AttemptError>, Instant)> + Send + '_ {
    let (mut parts, body) = resp.into_parts();
    let shape = Shape::of(&parts.headers);
    let mut body = Primed::new(body, shape);
    async move {
        let mut received = head_at;
        if parts.status.is_success() && !body.is_end_stream() {
            match read_ahead(&mut body, &parts.headers, shape, head_at + wait).await {
                Err(Stopped::Timeout) => return (Err(AttemptError::Timeout(wait)), crate::time::now()),
                Err(Stopped::Failed(cause)) => return (Err(AttemptError::Reset(cause)), crate::time::now()),
                Ok(ahead) => {
                    if ahead.waited {
                        received = crate::time::now();
                    }
                    if let Some((e, signal)) = ahead.in_band {
                        target.attempts.first_event_errors.inc();
                        parts.extensions.insert(e);
                        parts.extensions.insert(signal);
                    }
                }
            }
        } else if parts.status.is_client_error() || parts.status.is_server_error() {
            // An error response: a small body is read (it usually came with the head) to tell its
            // class, e.g. a quota used up from a rate limit; then forwarded as it came.
            let wait = ERROR_BODY_WAIT.min(left);
            let n = match read_error_body(&mut body, &parts.headers, head_at + wait).await {
                Ok(n) => n,
                // As a successful body failing before its commit point: nothing was forwarded.
                Err(cause) => return (Err(AttemptError::Reset(cause)), crate::time::now()),
            };
            let (signal, message) = provider_error::read(parts.status, &parts.headers, &body.held_prefix(n));
            parts.extensions.insert(signal);
            if let Some(message) = message {
                parts.extensions.insert(message);
            }
        }
        (Ok(Response::from_parts(parts, body)), received)
    }
}

/// How long an error body is waited for, at most, after its head.
const ERROR_BODY_WAIT: Duration = Duration::from_secs(1);

/// Holds up to [`provider_error::MAX_ERROR_BODY`] bytes of an error body (none when it says it is
/// longer) until its end or `deadline`; the bytes held (0 when it could not be read whole: a
/// partial body is not classified by its contents), or why the body failed.
async fn read_error_body<B>(body: &mut Primed<B>, headers: &http::HeaderMap, deadline: Instant) -> Result<usize, Cause>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Cause>,
{
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > provider_error::MAX_ERROR_BODY) {
        return Ok(0);
    }
    let mut held = 0;
    while !body.inner_mut().is_end_stream() {
        let next = match tokio::time::timeout_at(deadline, body.inner_mut().frame()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(e))) => return Err(e.into()),
            // The end: what is held is the body.
            Ok(None) => return Ok(held),
            // Too slow: forwarded as it comes, classified by its status and headers.
            Err(_) => return Ok(0),
        };
        let Some(len) = next.data_ref().map(Bytes::len) else {
            body.hold(next);
            return Ok(held);
        };
        held += len;
        body.hold(next);
        if held > provider_error::MAX_ERROR_BODY {
            return Ok(0);
        }
    }
    Ok(held)
}

/// An attempt's outcome from its response: its status, or the status its in-band error stands for
/// (the response's own when the error type has none).
pub(super) fn outcome_of<B>(resp: &Response<B>) -> Outcome {
    match resp.extensions().get::<InBandError>() {
        Some(e) => Outcome::InBand(e.equivalent.unwrap_or(resp.status())),
        None => Outcome::Status(resp.status()),
    }
}

/// Why the read-ahead ended the attempt.
enum Stopped {
    /// No byte before the deadline.
    Timeout,
    /// The body failed before the commit point (nothing was forwarded).
    Failed(Cause),
}

/// What the read-ahead found.
struct Ahead {
    /// Whether it waited for a frame (else everything held came with the head).
    waited: bool,
    /// An in-band error, and what the provider-error classifier reads in its error object.
    in_band: Option<(InBandError, ErrorSignal)>,
}

/// The class of an in-band error's object, read under the status it stands for (a success's own
/// when it has none).
fn signal_of(e: InBandError, headers: &http::HeaderMap, object: &[u8]) -> ErrorSignal {
    provider_error::classify(e.equivalent.unwrap_or(StatusCode::OK), headers, object)
}

/// Reads `body` ahead into its prefix until the commit point (see the module documentation).
async fn read_ahead<B>(
    body: &mut Primed<B>,
    headers: &http::HeaderMap,
    shape: Shape,
    deadline: Instant,
) -> Result<Ahead, Stopped>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Cause>,
{
    let mut waited = false;
    let mut finder = EventEnd::default();
    let mut held = 0;
    // Where the first event ends, or the body's end: what is classified.
    let mut classify = None;
    loop {
        // A frame that is already in needs no timer (a small body usually comes with its head).
        let next = match body.inner_mut().frame().now_or_never() {
            Some(next) => next,
            None => {
                waited = true;
                match tokio::time::timeout_at(deadline, body.inner_mut().frame()).await {
                    Ok(next) => next,
                    Err(_) if held == 0 => return Err(Stopped::Timeout),
                    Err(_) => break,
                }
            }
        };
        let frame = match next {
            None => {
                classify = Some(held);
                break;
            }
            Some(Err(e)) => return Err(Stopped::Failed(e.into())),
            Some(Ok(frame)) => frame,
        };
        let Some(data) = frame.data_ref() else {
            body.hold(frame); // trailers: the body ends here
            classify = Some(held);
            break;
        };
        let end = match shape {
            Shape::EventStream => finder.feed(data).map(|k| held + k),
            Shape::Json => None,
            Shape::Other => Some(0),
        };
        held += data.len();
        body.hold(frame);
        if end.is_some() {
            classify = end;
            break;
        }
        if body.inner_mut().is_end_stream() {
            classify = Some(held);
            break;
        }
        if held >= LOOKAHEAD {
            break;
        }
    }
    // An in-band error's object is classified as an error response's body would be (one reading
    // of what a provider's error means: a quota used up, a rate limit, an overload, ...), under
    // the status it stands for.
    let in_band = match (shape, classify) {
        (Shape::EventStream, Some(n)) => {
            let event = body.held_prefix(n);
            sse::classify_event(&event).map(|e| (e, signal_of(e, headers, &sse::event_data(&event))))
        }
        (Shape::Json, Some(n)) => {
            let json = body.held_prefix(n);
            sse::classify_json(&json).map(|e| (e, signal_of(e, headers, &json)))
        }
        _ => None,
    };
    Ok(Ahead { waited, in_band })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Frame;
    use http_body_util::combinators::UnsyncBoxBody;
    use http_body_util::StreamBody;

    use crate::retry::provider_error::ErrorClass;

    type Frames = Vec<Result<Frame<Bytes>, std::io::Error>>;

    /// A body of these frames, then (when `then_pending`) nothing ever again.
    fn body(frames: &[&str], then_pending: bool) -> Primed<UnsyncBoxBody<Bytes, std::io::Error>> {
        let frames: Frames = frames
            .iter()
            .map(|f| Ok(Frame::data(Bytes::from(f.to_string()))))
            .collect();
        let stream = futures_util::stream::iter(frames);
        let inner = if then_pending {
            StreamBody::new(futures_util::StreamExt::chain(stream, futures_util::stream::pending())).boxed_unsync()
        } else {
            StreamBody::new(stream).boxed_unsync()
        };
        Primed::new(inner, Shape::Other)
    }

    async fn ahead(frames: &[&str], pending: bool, shape: Shape) -> (Result<Ahead, Stopped>, String) {
        let mut b = body(frames, pending);
        let deadline = crate::time::now() + Duration::from_millis(50);
        let r = read_ahead(&mut b, &http::HeaderMap::new(), shape, deadline).await;
        let held = String::from_utf8(b.held_prefix(usize::MAX).into_owned()).unwrap();
        (r, held)
    }

    const OVERLOADED: &str =
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";

    #[tokio::test(start_paused = true)]
    async fn an_event_stream_is_held_until_its_first_event() {
        // The whole event in the first frame: nothing more is read.
        let (r, held) = ahead(&["data: a\n\ndata: b\n\n", "data: c\n\n"], true, Shape::EventStream).await;
        assert!(r.is_ok_and(|a| a.in_band.is_none() && !a.waited));
        assert_eq!(held, "data: a\n\ndata: b\n\n");
        // Split over frames: read until it is complete.
        let (r, held) = ahead(
            &[
                "event: er",
                "ror\ndata: {\"type\":\"error\",",
                "\"error\":{\"type\":\"overloaded_error\"}}\n",
                "\n",
                "x",
            ],
            true,
            Shape::EventStream,
        )
        .await;
        let (in_band, signal) = r.ok().and_then(|a| a.in_band).unwrap();
        assert_eq!(in_band.equivalent.map(|s| s.as_u16()), Some(529));
        assert_eq!(signal.class, ErrorClass::Overloaded);
        assert!(held.ends_with("}}\n\n"), "{held}");
        let (r, _) = ahead(&[OVERLOADED], false, Shape::EventStream).await;
        assert!(r.is_ok_and(|a| a.in_band.is_some()));
    }

    /// The error object inside a stream or a 200 JSON body is read by the one provider-error
    /// classifier: a quota used up is that, not a rate limit.
    #[tokio::test(start_paused = true)]
    async fn an_in_band_error_is_classified_as_an_error_response_would_be() {
        let quota = "{\"error\":{\"message\":\"You exceeded your current quota\",\"type\":\"insufficient_quota\",\"code\":\"insufficient_quota\"}}";
        let (r, _) = ahead(&[&format!("data: {quota}\n\n")], false, Shape::EventStream).await;
        let (_, signal) = r.ok().and_then(|a| a.in_band).unwrap();
        assert_eq!(signal.class, ErrorClass::Exhausted);
        let (r, _) = ahead(&[quota], false, Shape::Json).await;
        let (_, signal) = r.ok().and_then(|a| a.in_band).unwrap();
        assert_eq!(signal.class, ErrorClass::Exhausted);
        // A rate limit named in `code` stays one.
        let limited = "data: {\"error\":{\"type\":\"requests\",\"code\":\"rate_limit_exceeded\"}}\n\n";
        let (r, _) = ahead(&[limited], false, Shape::EventStream).await;
        let (e, signal) = r.ok().and_then(|a| a.in_band).unwrap();
        assert_eq!(
            (e.equivalent.map(|s| s.as_u16()), signal.class),
            (Some(429), ErrorClass::RateLimited)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_commits_what_came_and_times_out_when_nothing_did() {
        let (r, held) = ahead(
            &["event: error\ndata: {\"error\":{\"type\":\"api_error\"}}\n"],
            true,
            Shape::EventStream,
        )
        .await;
        assert!(
            r.is_ok_and(|a| a.in_band.is_none() && a.waited),
            "an incomplete event is forwarded as it is"
        );
        assert!(held.starts_with("event: error"));
        let (r, _) = ahead(&[], true, Shape::EventStream).await;
        assert!(matches!(r, Err(Stopped::Timeout)));
        let (r, _) = ahead(&[], true, Shape::Json).await;
        assert!(matches!(r, Err(Stopped::Timeout)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_lookahead_is_bounded() {
        let big = "x".repeat(LOOKAHEAD / 2);
        let (r, held) = ahead(&[&big, &big, "more"], true, Shape::EventStream).await;
        assert!(r.is_ok_and(|a| a.in_band.is_none() && !a.waited));
        assert_eq!(held.len(), LOOKAHEAD);
        let (r, held) = ahead(&["{\"a\":", &big, &big, "1}"], true, Shape::Json).await;
        assert!(r.is_ok_and(|a| a.in_band.is_none()));
        assert_eq!(held.len(), LOOKAHEAD + 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_json_body_is_read_to_its_end() {
        let (r, held) = ahead(
            &["{\"type\":\"error\",", "\"error\":{\"type\":\"rate_limit_error\"}}"],
            false,
            Shape::Json,
        )
        .await;
        let (in_band, signal) = r.ok().and_then(|a| a.in_band).unwrap();
        assert_eq!(in_band.equivalent.map(|s| s.as_u16()), Some(429));
        assert_eq!(signal.class, ErrorClass::RateLimited);
        assert_eq!(held, "{\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\"}}");
        let (r, _) = ahead(&["{\"id\":1}"], false, Shape::Json).await;
        assert!(r.is_ok_and(|a| a.in_band.is_none()));
        // Anything else: the first frame is the commit point.
        let (r, held) = ahead(&["{\"error\":{\"type\":\"api_error\"}}", "more"], true, Shape::Other).await;
        assert!(r.is_ok_and(|a| a.in_band.is_none()));
        assert_eq!(held, "{\"error\":{\"type\":\"api_error\"}}");
    }

    #[tokio::test(start_paused = true)]
    async fn what_was_held_is_put_back_in_order() {
        let mut b = body(&["event: ping\n", "data: {}\n\n", "data: rest\n\n"], false);
        let r = read_ahead(
            &mut b,
            &http::HeaderMap::new(),
            Shape::EventStream,
            crate::time::now() + Duration::from_secs(1),
        )
        .await;
        assert!(r.is_ok());
        assert_eq!(b.held_len(), 22);
        let all = b.collect().await.unwrap().to_bytes();
        assert_eq!(all, "event: ping\ndata: {}\n\ndata: rest\n\n");
    }
}
