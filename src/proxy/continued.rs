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

use super::call;
use super::context::Context;
use super::cursor::Cut;
use super::request::Request;
use super::stream::{ErrorWatch, IdleTimeout, StreamIdle};
use super::tokens::{Meter, RequestTokens};
use crate::config::Api;
use crate::continuation::{event, request, Dialect, Fate, Framer, How, Plan, Refusal, Splicer, Transcript};
use crate::idempotency::live::OriginalAborted;
use crate::idempotency::{Live, Rejoin};
use crate::time;
use crate::traces::RequestSpan;
use crate::wire::api::{Named, Op};
use crate::wire::body::BoxError;
use crate::wire::headers;
use crate::wire::sse::classify_event;

/// Continuations of one request at most (a continuation cut in turn is continued again).
pub(super) const MAX_HOPS: u32 = 3;

/// An event longer than this is not waited for whole: the stream is cut.
const MAX_EVENT: usize = 1 << 20;

/// The most of a refused continuation's answer read, to tell a prefill refused.
const MAX_REFUSAL: usize = 64 * 1024;

type Stream = UnsyncBoxBody<Bytes, BoxError>;

/// What another attempt of the request needs: the app's request (its route, head, body, what it
/// names, its deadline), the request's books and trace, and the stream's dialect.
pub(super) struct Again {
    cx: Arc<Context>,
    request: Arc<Request>,
    tokens: RequestTokens,
    trace: RequestSpan,
    dialect: Dialect,
    /// The delivered attempt's number: continuations are numbered after it.
    delivered: u32,
}

impl Again {
    /// The continuation of a streamed request on a route with `continue_streams`, if its API is
    /// one a continuation knows (Anthropic Messages, Chat Completions, Responses).
    pub(super) fn of(
        cx: &Arc<Context>,
        request: &Arc<Request>,
        (tokens, trace): (&RequestTokens, &RequestSpan),
    ) -> Option<Box<Again>> {
        if !request.route.config.continue_streams || request.parts.method != Method::POST {
            return None;
        }
        let dialect = dialect(request.route.config.api, &request.named)?;
        Some(Box::new(Again {
            cx: cx.clone(),
            request: request.clone(),
            tokens: tokens.clone(),
            trace: trace.clone(),
            dialect,
            delivered: 0,
        }))
    }

    /// Wraps the delivered stream (already under its idle timeout): continued when it is cut.
    /// `error_seen` is the response's mid-stream error flag, cleared when a continuation ends
    /// the stream whole (the idempotency record and the cache keep the continued answer).
    /// `attempts`: the delivered attempt's number (continuations are counted after it);
    /// `target`: the target it streams from (unknown for a followed stream).
    pub(super) fn wrap<B>(
        mut self: Box<Self>,
        body: B,
        error_seen: Option<Arc<AtomicBool>>,
        (attempts, target): (u32, Option<usize>),
    ) -> Continued
    where
        B: Body<Data = Bytes, Error = BoxError> + Send + 'static,
    {
        self.delivered = attempts;
        let route = self.request.route.name.clone();
        let transcript = Transcript::new(self.dialect);
        Continued {
            body: body.boxed_unsync(),
            target,
            framer: Framer::default(),
            app: Some(transcript),
            splicer: None,
            asking: None,
            out: VecDeque::new(),
            again: Arc::from(self),
            hops: 0,
            cuts: Vec::new(),
            first_cut: None,
            provider_error: None,
            last_seq: None,
            error_seen,
            followed: None,
            rejoined: false,
            route,
            done: false,
        }
    }

    /// The `x-rebound-continuable` value of a stream of such a route.
    pub(super) fn header() -> HeaderValue {
        HeaderValue::from_static("true")
    }

    /// Asks a target to go on from `app` (`how`): the continuation's stream, under the route's
    /// idle timeout, its splicer and its target; or why not. A target that cut the stream
    /// (`cuts`) is asked only when no other is left, one that stalled it not at all.
    /// Each continuation's tokens are metered as its body passes, as the attempt it is (number
    /// `hop` after the delivered one): `rebound_tokens_total`, and the request's ledger.
    async fn ask(
        self: Arc<Self>,
        app: Transcript,
        mut how: How,
        hop: u32,
        cuts: Vec<Cut>,
    ) -> Result<Continuation, BoxError> {
        loop {
            let left = self.request.deadline.saturating_duration_since(time::now());
            if left.is_zero() {
                return Err("the request's deadline passed before its stream could be continued".into());
            }
            let (parts, path, body) = self.request(&app, how, left)?;
            let asked = call::Asked::continuing(&self.request, (&parts, &path, &body), &cuts);
            let delivery = call::attempts(&self.cx, asked, self.tokens.clone(), &self.trace).await;
            let resp = delivery.result.map_err(|e| -> BoxError { e.to_string().into() })?;
            let status = resp.status().as_u16();
            if status == 200 {
                let target = self
                    .request
                    .route
                    .targets
                    .get(delivery.target)
                    .unwrap_or(self.request.route.primary());
                let n = self.delivered + hop;
                let meter = Meter::for_delivered(&resp, &target.tokens, &self.tokens, n, delivery.sent);
                let shape = resp.body().shape();
                let (body, _) = ErrorWatch::for_response(resp.into_body(), shape, false, &target.attempts, meter);
                // A stall waits no longer than the request's deadline.
                let idle = self
                    .request
                    .route
                    .retry
                    .stream_idle_timeout
                    .min(left.max(Duration::from_millis(1)));
                let stream = IdleTimeout::new(body, idle).boxed_unsync();
                let splicer = Splicer::new(app, how, &self.request.body);
                return Ok(Continuation {
                    stream,
                    splicer,
                    target: delivery.target,
                });
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
        let mut parts = self.request.parts.clone();
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
            let base = self.request.path().split("/v1/").next().unwrap_or("");
            let path = format!("{base}{resume}");
            parts.uri = format!("{}?{query}", parts.uri.path()).parse()?;
            parts.method = Method::GET;
            parts.headers.remove(http::header::CONTENT_TYPE);
            return Ok((parts, path, Bytes::new()));
        }
        let body = request::body(&self.request.body, app, how).map_err(|r| format!("not continued: {r:?}"))?;
        Ok((parts, self.request.path().to_string(), Bytes::from(body)))
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

type Asking = Pin<Box<dyn Future<Output = Result<Next, BoxError>> + Send>>;

/// A continuation answered: its stream, its splicer, and the target it streams from.
struct Continuation {
    stream: Stream,
    splicer: Splicer,
    target: usize,
}

/// What a cut stream goes on with.
enum Next {
    /// A continuation, spliced here.
    Spliced(Box<Continuation>),
    /// The continuation of the followed response, recorded under its key (by this request or
    /// another, on any replica): read from the byte the app has on, as spliced there; the app's
    /// transcript, and that response.
    Rejoined(Stream, Box<Transcript>, Arc<Live>),
}

/// The app's stream on a route with `continue_streams` (see the module documentation).
pub(super) struct Continued {
    /// The attempt streaming now: the delivered one, then each continuation.
    body: Stream,
    /// The target it streams from (unknown for a followed stream).
    target: Option<usize>,
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
    /// The targets that cut the stream so far (where its continuation goes last, or not at all).
    cuts: Vec<Cut>,
    /// What cut the stream first, for the error event when it is not finished.
    first_cut: Option<String>,
    /// The last error event a provider sent: what the app reads when the stream is not finished.
    provider_error: Option<Bytes>,
    /// Responses: the last sequence number the app has when it was cut (the error event's is next).
    last_seq: Option<u64>,
    error_seen: Option<Arc<AtomicBool>>,
    /// The live response of another request this one follows (its key's), while it does.
    followed: Option<Arc<Live>>,
    /// It reads the continuation of the response it followed (spliced where that runs).
    rejoined: bool,
    route: Arc<str>,
    done: bool,
}

impl Continued {
    /// Follows `live` (the response of another request with its key): when that one's replica
    /// dies mid-stream, one continuation is run for every follower ([`Rejoin`]).
    pub(super) fn following(mut self, live: Arc<Live>) -> Continued {
        self.followed = Some(live);
        self
    }

    /// The continuation of a followed response whose replica died, run by the request that won
    /// it (`app`: what was followed) and recorded under its key: only its own events.
    fn after_cut(
        again: Arc<Again>,
        (app, how, hop): (Transcript, How, u32),
        cuts: Vec<Cut>,
        failed: Arc<AtomicBool>,
    ) -> Continued {
        let route = again.request.route.name.clone();
        let last_seq = app.last_seq;
        let asking = again.clone().ask(app, how, hop, cuts.clone());
        Continued {
            body: http_body_util::Empty::new().map_err(|e| match e {}).boxed_unsync(),
            target: None,
            framer: Framer::default(),
            app: None,
            splicer: None,
            asking: Some(Box::pin(
                async move { asking.await.map(|a| Next::Spliced(Box::new(a))) },
            )),
            out: VecDeque::new(),
            again,
            hops: hop,
            cuts,
            first_cut: Some("the replica running the original died".into()),
            provider_error: None,
            last_seq,
            error_seen: Some(failed),
            followed: None,
            rejoined: false,
            route,
            done: false,
        }
    }

    /// Counts a cut's result.
    fn count(&self, fate: Fate) {
        self.again
            .cx
            .metrics
            .continuations_total
            .with_label_values(&[&self.route, fate.as_str()])
            .inc();
    }

    /// The stream was cut (`why`; `stalled`: by the idle timeout): a continuation asked for, or
    /// the stream ended with an error event (or, when the app's message had ended, as it is).
    fn cut(&mut self, why: BoxError, stalled: bool) {
        // A followed response aborted between two whole events: who continues it is asked.
        let rejoin = match self.followed.take() {
            Some(live) if why.is::<OriginalAborted>() && self.framer.held() == 0 => Some(live),
            _ => None,
        };
        self.framer = Framer::default();
        // The continuation this stream joined failed where it ran: as it ended there.
        if self.rejoined && self.provider_error.is_some() {
            return self.fail(why);
        }
        if let Some(index) = self.target.take() {
            self.cuts.push(Cut { index, stalled });
        }
        self.first_cut.get_or_insert_with(|| why.to_string());
        let app = match (self.splicer.take(), self.app.take()) {
            (Some(s), _) => s.into_transcript(),
            (None, Some(t)) => t,
            (None, None) => return self.fail(why),
        };
        self.last_seq = app.last_seq;
        let prefill = self.again.dialect == Dialect::Messages;
        match app.decide(&self.again.request.body, prefill) {
            Plan::Continue(how) if self.hops < MAX_HOPS => {
                self.hops += 1;
                tracing::info!(route = %self.route, how = how.as_str(), hop = self.hops, error = %why, "continuing a cut stream");
                let (again, cuts) = (self.again.clone(), self.cuts.clone());
                let hop = self.hops;
                self.asking = Some(match rejoin {
                    Some(live) => Box::pin(rejoin_or_ask(again, (app, how, hop), cuts, live)),
                    None => {
                        Box::pin(
                            async move { again.ask(app, how, hop, cuts).await.map(|a| Next::Spliced(Box::new(a))) },
                        )
                    }
                });
            }
            Plan::Continue(_) => {
                self.count(Fate::Failed);
                self.fail(format!("cut again after {MAX_HOPS} continuations: {why}").into());
            }
            // The app has the whole message: nothing to finish, nothing to report; the stream's
            // last event, if the cut took it, so that the stream ends as a whole one does.
            Plan::Refuse(Refusal::Ended) => {
                self.count(Fate::Failed);
                if let Some(end) = app.closing() {
                    self.send(Bytes::from_static(end));
                }
                self.done = true;
            }
            Plan::Refuse(refusal) => {
                self.count(refusal.fate());
                self.fail(format!("not continued: {}", refusal.says()).into());
            }
        }
    }

    /// The stream cannot be finished (`why`): it ends with the provider's error event as it
    /// came, else rebound's (`stream_cut`, in the stream's dialect), never a reset or a clean
    /// end; the idempotency record and the cache do not keep it.
    fn fail(&mut self, why: BoxError) {
        let event = self.provider_error.take().unwrap_or_else(|| {
            let cut = self.first_cut.as_deref().unwrap_or("the stream was cut");
            let message = format!("rebound: the upstream stream was cut ({cut}) and could not be finished: {why}");
            let next_seq = self.last_seq.map(|s| s + 1);
            Bytes::from(event::cut_event(self.again.dialect, &message, next_seq))
        });
        tracing::warn!(route = %self.route, error = %why, "a cut stream ends with an error event");
        self.out.push_back(event);
        if let Some(flag) = &self.error_seen {
            flag.store(true, Ordering::Release);
        }
        self.done = true;
    }

    /// The whole events the attempt's bytes completed, to the app (or to the splicer); the app's
    /// events of one chunk go as one run of bytes.
    fn events(&mut self, data: &[u8]) {
        self.framer.push(data);
        while let Some(at) = self.framer.next_found() {
            let event = &self.framer.found()[at.clone()];
            let following = self.followed.is_some() || self.rejoined;
            if following && self.splicer.is_none() && classify_event(event).is_some() {
                // An error event in a stream this request follows is the verdict of the replica
                // that runs it (which continues the stream it can and ends with an error event
                // the one it cannot): final here too, never continued a second time.
                let found = self.framer.take_found();
                self.send(found);
                if let Some(flag) = &self.error_seen {
                    flag.store(true, Ordering::Release);
                }
                self.done = true;
                return;
            }
            if classify_event(event).is_some() {
                // The provider's error event: kept for the app should the stream not be
                // finished; what came before it goes on.
                let why = format!("an error event mid-stream: {}", describe(event));
                let mut found = self.framer.take_found();
                self.provider_error = Some(found.split_off(at.start));
                self.send(found);
                return self.cut(why.into(), false);
            }
            if let Some(s) = self.splicer.as_mut() {
                let spliced = s.feed(event);
                drop(self.framer.take_found());
                match spliced {
                    Ok(bytes) => self.send(Bytes::from(bytes)),
                    Err(e) => return self.cut(format!("the continuation was cut: {e:?}").into(), false),
                }
                continue;
            }
            if let Some(app) = self.app.as_mut().filter(|a| !a.overflowed()) {
                app.observe(event);
            }
        }
        if self.splicer.is_none() {
            let found = self.framer.take_found();
            self.send(found);
        }
        if self.framer.held() > MAX_EVENT {
            self.cut("an event over 1 MiB".into(), false);
        }
    }

    fn send(&mut self, bytes: Bytes) {
        if !bytes.is_empty() {
            self.out.push_back(bytes);
        }
    }

    /// The attempt's body ended.
    fn ended(&mut self) {
        match self.splicer.as_mut() {
            Some(s) => match s.finish() {
                Ok(bytes) => {
                    self.send(Bytes::from(bytes));
                    self.count(Fate::Continued);
                    if let Some(flag) = &self.error_seen {
                        flag.store(false, Ordering::Release);
                    }
                    self.done = true;
                }
                Err(e) => self.cut(format!("the continuation ended early: {e:?}").into(), false),
            },
            None => {
                // The delivered stream ended by itself: what it left unterminated goes as it came.
                if let Some(rest) = self.framer.take_held() {
                    self.out.push_back(rest);
                }
                self.done = true;
            }
        }
    }
}

/// The continuation of a followed response whose replica died: run here for every follower of its
/// key when this request claims it first (recorded under the key, read here as the others read
/// it), followed when another did, else asked for here alone.
async fn rejoin_or_ask(
    again: Arc<Again>,
    (app, how, hop): (Transcript, How, u32),
    cuts: Vec<Cut>,
    dead: Arc<Live>,
) -> Result<Next, BoxError> {
    let rejoined = match again.request.route.idempotency.as_ref() {
        Some(idem) => idem.rejoin(&dead).await,
        None => Rejoin::Alone,
    };
    match rejoined {
        Rejoin::Won(claim, live) => {
            let (Some(head), Some(from)) = (live.head_now(), live.body().map(|b| b.len())) else {
                return Err("the continued response has no head".into());
            };
            let failed = Arc::new(AtomicBool::new(false));
            let body = Continued::after_cut(again, (app.clone(), how, hop), cuts, failed.clone());
            let headers = head.headers.header_map();
            let recorder = claim.record(head.status, &headers, body, Some(failed));
            // Read to its end whoever reads it: every follower of the key waits for it.
            crate::tasks::spawn("cut_stream_continuation", async move {
                let mut recorder = std::pin::pin!(recorder);
                while let Some(Ok(_)) = recorder.frame().await {}
            });
            Ok(Next::Rejoined(
                live.follower_from(from).boxed_unsync(),
                Box::new(app),
                live,
            ))
        }
        Rejoin::Follow(follower, live) => Ok(Next::Rejoined(follower.boxed_unsync(), Box::new(app), live)),
        Rejoin::Alone => again.ask(app, how, hop, cuts).await.map(|a| Next::Spliced(Box::new(a))),
        Rejoin::OwnerRuns => {
            Err("the original it follows runs on: a continuation here would be a second answer".into())
        }
    }
}

/// What an error event says, for a log line and a message: its data, at most 200 bytes.
fn describe(event: &[u8]) -> String {
    let data = crate::wire::sse::event_data(event);
    let text = String::from_utf8_lossy(&data[..data.len().min(200)]).into_owned();
    text
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
                    Ok(Next::Spliced(continuation)) => {
                        let Continuation {
                            stream,
                            splicer,
                            target,
                        } = *continuation;
                        this.body = stream;
                        this.splicer = Some(splicer);
                        this.target = Some(target);
                        // Its own continuation now, not one it joined.
                        this.rejoined = false;
                    }
                    Ok(Next::Rejoined(stream, app, live)) => {
                        this.body = stream;
                        this.app = Some(*app);
                        this.followed = Some(live);
                        this.rejoined = true;
                    }
                    Err(e) => {
                        this.count(Fate::Failed);
                        this.fail(e);
                    }
                }
                continue;
            }
            match ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.events(&data),
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                Some(Err(e)) => {
                    let stalled = e.downcast_ref::<StreamIdle>().is_some();
                    this.cut(e, stalled);
                }
                None => this.ended(),
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
