//! Mid-stream continuation on a route with `continue_streams` (the pure core is
//! `crate::continuation`). The delivered stream is forwarded to the app one whole event at a
//! time, each one noted in the request's [`Transcript`]; when it is cut after bytes reached the
//! app (a reset, an error event mid-stream, the idle timeout), the transcript decides: a refusal
//! (a tool call, a thinking block, nothing to go on) leaves the cut visible, as without the
//! feature; otherwise another attempt of the request ([`Again`], through the same retry loop, so
//! on the same target or the next one, within what is left of the request's deadline) asks the
//! target to go on, and its events are spliced into the app's stream ([`Splicer`]): one message,
//! one end, the usage of every attempt. A continuation cut in turn is continued again, up to
//! [`MAX_HOPS`] times. `rebound_continuations_total{route,result}` counts each cut.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context as TaskContext, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;

use super::call::{self, Asked};
use super::context::Context;
use super::routes::Route;
use super::stream::{ErrorWatch, IdleTimeout};
use super::tokens::{Meter, RequestTokens};
use crate::config::Api;
use crate::continuation::{request, Decision, Dialect, Framer, How, Outcome, Splicer, Transcript};
use crate::time::{self, Instant};
use crate::traces::RequestSpan;
use crate::wire::body::BoxError;
use crate::wire::headers;
use crate::wire::named::{Named, Op};
use crate::wire::sse::classify_event;

/// Continuations of one request at most (a continuation cut in turn is continued again).
pub(super) const MAX_HOPS: u32 = 3;

/// An event longer than this is not waited for whole: the stream is cut.
const MAX_EVENT: usize = 1 << 20;

/// The most of a refused continuation's answer read, to tell a prefill refused.
const MAX_REFUSAL: usize = 64 * 1024;

type Stream = UnsyncBoxBody<Bytes, BoxError>;

/// What another attempt of the request needs: the request as the app sent it, where it goes,
/// and by when.
pub(super) struct Again {
    cx: Arc<Context>,
    route: Arc<Route>,
    parts: http::request::Parts,
    path: String,
    body: Bytes,
    /// What the request names (a continuation names the same).
    named: Named,
    tokens: RequestTokens,
    trace: RequestSpan,
    dialect: Dialect,
    /// The request's deadline.
    until: Instant,
    /// The delivered attempt's number: continuations are numbered after it.
    delivered: u32,
}

impl Again {
    /// The continuation of a streamed request on a route with `continue_streams`, if its API is
    /// one a continuation knows (Anthropic Messages, Chat Completions, Responses).
    pub(super) fn of(
        cx: &Arc<Context>,
        route: &Arc<Route>,
        (parts, path, body, named): (&http::request::Parts, &str, &Bytes, &Named),
        (tokens, trace, deadline): (&RequestTokens, &RequestSpan, Instant),
    ) -> Option<Box<Again>> {
        if !route.config.continue_streams || parts.method != Method::POST {
            return None;
        }
        let dialect = dialect(route.config.api, named)?;
        Some(Box::new(Again {
            cx: cx.clone(),
            route: route.clone(),
            parts: parts.clone(),
            path: path.to_string(),
            body: body.clone(),
            named: named.clone(),
            tokens: tokens.clone(),
            trace: trace.clone(),
            dialect,
            until: deadline,
            delivered: 0,
        }))
    }

    /// Wraps the delivered stream (already under its idle timeout): continued when it is cut.
    /// `error_seen` is the response's mid-stream error flag, cleared when a continuation ends
    /// the stream whole (the idempotency record and the cache keep the continued answer).
    /// `attempts`: the delivered attempt's number (continuations are counted after it).
    pub(super) fn wrap<B>(mut self: Box<Self>, body: B, error_seen: Option<Arc<AtomicBool>>, attempts: u32) -> Continued
    where
        B: Body<Data = Bytes, Error = BoxError> + Send + 'static,
    {
        self.delivered = attempts;
        let route = self.route.name.clone();
        let transcript = Transcript::new(self.dialect);
        Continued {
            body: body.boxed_unsync(),
            framer: Framer::default(),
            app: Some(transcript),
            splicer: None,
            asking: None,
            out: VecDeque::new(),
            again: Arc::from(self),
            hops: 0,
            error_seen,
            route,
            done: false,
        }
    }

    /// The `x-rebound-continuable` value of a stream of such a route.
    pub(super) fn header() -> HeaderValue {
        HeaderValue::from_static("true")
    }

    /// Asks the target to go on from `app` (`how`): the continuation's stream, under the
    /// route's idle timeout, and its splicer; or why not.
    /// Each continuation's tokens are metered as its body passes, as the attempt it is (number
    /// `hop` after the delivered one): `rebound_tokens_total`, and the request's ledger.
    async fn ask(self: Arc<Self>, app: Transcript, mut how: How, hop: u32) -> Result<(Stream, Splicer), BoxError> {
        loop {
            let left = self.until.saturating_duration_since(time::now());
            if left.is_zero() {
                return Err("the request's deadline passed before its stream could be continued".into());
            }
            let (parts, path, body) = self.request(&app, how, left)?;
            let asked = Asked::of(&self.route, (&parts, &path, &body, &self.named), false, self.until);
            let delivery = call::attempts(&self.cx, asked, self.tokens.clone(), &self.trace).await;
            let resp = delivery.result.map_err(|e| -> BoxError { e.to_string().into() })?;
            let status = resp.status().as_u16();
            if status == 200 {
                let target = self.route.targets.get(delivery.target).unwrap_or(self.route.primary());
                let n = self.delivered + hop;
                let meter = Meter::for_delivered(&resp, &target.tokens, &self.tokens, n, delivery.sent);
                let shape = resp.body().shape();
                let (body, _) = ErrorWatch::for_response(resp.into_body(), shape, false, &target.attempts, meter);
                let idle = self.route.retry.stream_idle_timeout;
                let stream = IdleTimeout::new(body, idle).boxed_unsync();
                return Ok((stream, Splicer::new(app, how, &self.body)));
            }
            let refused = http_body_util::Limited::new(resp.into_body(), MAX_REFUSAL)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            // A target that takes no prefill is asked again with a turn: never the failure.
            if how == How::Prefill && request::is_prefill_rejection(status, &refused) {
                how = How::Turn;
                continue;
            }
            return Err(format!("the continuation was answered {status}").into());
        }
    }

    /// The continuation's request: its head (the app's, with the deadline left), path and body.
    fn request(
        &self,
        app: &Transcript,
        how: How,
        left: Duration,
    ) -> Result<(http::request::Parts, String, Bytes), BoxError> {
        let mut parts = self.parts.clone();
        let ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1);
        parts
            .headers
            .insert(headers::X_REBOUND_DEADLINE_MS, HeaderValue::from(ms));
        parts.headers.remove(http::header::CONTENT_LENGTH);
        if how == How::Resume {
            let resume = app.resume_path().ok_or("no response to resume")?;
            let (resume, query) = resume.split_once('?').unwrap_or((&resume, ""));
            // The route's own prefix before the API path (`/v1/responses/...`); the query goes
            // upstream from the request's URI.
            let base = self.path.split("/v1/").next().unwrap_or("");
            let path = format!("{base}{resume}");
            parts.uri = format!("{}?{query}", parts.uri.path()).parse()?;
            parts.method = Method::GET;
            parts.headers.remove(http::header::CONTENT_TYPE);
            return Ok((parts, path, Bytes::new()));
        }
        let body = request::body(&self.body, app, how).map_err(|r| format!("not continued: {r:?}"))?;
        Ok((parts, self.path.clone(), Bytes::from(body)))
    }
}

/// The API of a streamed request, when a continuation knows it: Anthropic Messages, Chat
/// Completions and Responses (Bedrock's, Vertex AI's and Gemini's paths are not continued).
fn dialect(api: Api, named: &Named) -> Option<Dialect> {
    match (api, named.op.as_ref()?) {
        _ if !named.stream => None,
        (Api::Bedrock | Api::VertexAnthropic | Api::Gemini | Api::VertexGemini, _) => None,
        (_, Op::Messages) => Some(Dialect::Messages),
        (_, Op::OpenAi("chat/completions")) => Some(Dialect::Chat),
        (_, Op::OpenAi("responses")) => Some(Dialect::Responses),
        _ => None,
    }
}

type Asking = Pin<Box<dyn Future<Output = Result<(Stream, Splicer), BoxError>> + Send>>;

/// The app's stream on a route with `continue_streams` (see the module documentation).
pub(super) struct Continued {
    /// The attempt streaming now: the delivered one, then each continuation.
    body: Stream,
    framer: Framer,
    /// What the app has, while the delivered attempt streams.
    app: Option<Transcript>,
    /// While a continuation streams.
    splicer: Option<Splicer>,
    /// A continuation being asked for.
    asking: Option<Asking>,
    /// Events to send the app.
    out: VecDeque<Bytes>,
    again: Arc<Again>,
    hops: u32,
    error_seen: Option<Arc<AtomicBool>>,
    route: Arc<str>,
    done: bool,
}

impl Continued {
    /// Counts a cut's result.
    fn count(&self, outcome: Outcome) {
        self.again
            .cx
            .metrics
            .continuations_total
            .with_label_values(&[&self.route, outcome.as_str()])
            .inc();
    }

    /// The stream was cut (`why`): a continuation asked for, or the cut passed to the app.
    fn cut(&mut self, why: BoxError) -> Result<(), BoxError> {
        let app = match (self.splicer.take(), self.app.take()) {
            (Some(s), _) => s.into_transcript(),
            (None, Some(t)) => t,
            (None, None) => return Err(why),
        };
        let prefill = self.again.dialect == Dialect::Messages;
        let decision = app.decide(&self.again.body, prefill);
        match decision {
            Decision::Continue(how) if self.hops < MAX_HOPS => {
                self.hops += 1;
                tracing::info!(route = %self.route, how = how.as_str(), hop = self.hops, error = %why, "continuing a cut stream");
                self.asking = Some(Box::pin(self.again.clone().ask(app, how, self.hops)));
                self.framer = Framer::default();
                Ok(())
            }
            Decision::Continue(_) => {
                self.count(Outcome::Failed);
                self.done = true;
                Err(why)
            }
            Decision::Refuse(refusal) => {
                self.count(refusal.outcome());
                self.done = true;
                Err(why)
            }
        }
    }

    /// The whole events the attempt's bytes completed, to the app (or to the splicer).
    fn events(&mut self, data: &[u8]) -> Result<(), BoxError> {
        self.framer.push(data);
        while let Some(event) = self.framer.next_event() {
            if let Some(s) = self.splicer.as_mut() {
                match s.feed(&event) {
                    Ok(bytes) if bytes.is_empty() => {}
                    Ok(bytes) => self.out.push_back(Bytes::from(bytes)),
                    Err(e) => return self.cut(format!("the continuation was cut: {e:?}").into()),
                }
                continue;
            }
            if classify_event(&event).is_some() {
                // Not continued: the provider's error event goes to the app as it came, and the
                // stream ends there, as it would without the feature.
                if self.cut("an error event mid-stream".into()).is_err() {
                    self.out.push_back(Bytes::from(event));
                }
                return Ok(());
            }
            if let Some(app) = self.app.as_mut() {
                app.observe(&event);
            }
            self.out.push_back(Bytes::from(event));
        }
        if self.framer.held() > MAX_EVENT {
            return self.cut("an event over 1 MiB".into());
        }
        Ok(())
    }

    /// The attempt's body ended.
    fn ended(&mut self) -> Result<(), BoxError> {
        match self.splicer.as_mut() {
            Some(s) => match s.finish() {
                Ok(bytes) => {
                    if !bytes.is_empty() {
                        self.out.push_back(Bytes::from(bytes));
                    }
                    self.count(Outcome::Continued);
                    if let Some(flag) = &self.error_seen {
                        flag.store(false, Ordering::Release);
                    }
                    self.done = true;
                    Ok(())
                }
                Err(e) => self.cut(format!("the continuation ended early: {e:?}").into()),
            },
            None => {
                // The delivered stream ended by itself: what it left unterminated goes as it came.
                if let Some(rest) = self.framer.take_held() {
                    self.out.push_back(Bytes::from(rest));
                }
                self.done = true;
                Ok(())
            }
        }
    }
}

impl Body for Continued {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some(bytes) = this.out.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            if let Some(asking) = this.asking.as_mut() {
                let answer = ready!(asking.as_mut().poll(cx));
                this.asking = None;
                match answer {
                    Ok((stream, splicer)) => {
                        this.body = stream;
                        this.splicer = Some(splicer);
                    }
                    Err(e) => {
                        this.count(Outcome::Failed);
                        this.done = true;
                        return Poll::Ready(Some(Err(e)));
                    }
                }
                continue;
            }
            let step = match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.events(&data),
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                Some(Err(e)) => this.cut(e),
                None => this.ended(),
            };
            if let Err(e) = step {
                return Poll::Ready(Some(Err(e)));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.out.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_requests_of_the_three_apis_are_continuable() {
        let read = |api, path: &str, body: &str| dialect(api, &Named::read(api, path, body.as_bytes()).expect("read"));
        let stream = r#"{"model":"m","stream":true}"#;
        assert_eq!(read(Api::Anthropic, "/v1/messages", stream), Some(Dialect::Messages));
        assert_eq!(read(Api::OpenAi, "/v1/messages", stream), Some(Dialect::Messages));
        assert_eq!(read(Api::OpenAi, "/v1/chat/completions", stream), Some(Dialect::Chat));
        assert_eq!(
            read(Api::OpenAi, "/openai/v1/responses?x=1", stream),
            Some(Dialect::Responses)
        );
        assert_eq!(read(Api::OpenAi, "/v1/embeddings", stream), None);
        assert_eq!(read(Api::Anthropic, "/v1/messages", r#"{"model":"m"}"#), None);
        assert_eq!(
            read(Api::Anthropic, "/v1/messages", r#"{"model":"m","stream":false}"#),
            None
        );
        assert_eq!(
            read(
                Api::Anthropic,
                "/v1/messages",
                r#"{"model":"m","tools":[{"stream":true}]}"#
            ),
            None
        );
        assert_eq!(read(Api::Bedrock, "/model/m/invoke-with-response-stream", "{}"), None);
    }
}
