//! Mid-stream continuation (`continue_streams = true`), the pure core: no I/O, no clock, no tasks.
//! A streamed generation cut after bytes reached the app is finished by another attempt, and that
//! attempt's events are spliced into the app's stream so that the app (an official SDK) reads one
//! valid stream whose text is the whole answer: one message start, consistent block indexes, one
//! end, one final usage that sums every attempt.
//!
//! Three APIs ([`Dialect`]): Anthropic Messages, OpenAI Chat Completions, OpenAI Responses.
//!
//! # How the pipeline uses it
//! 1. It forwards only whole events to the app ([`Framer`]) and feeds each one it forwards to the
//!    request's [`Transcript`] ([`Transcript::observe`]): the text the app has, per block, whether
//!    a tool call or a thinking block is open, the usage reported, the ids, Responses' sequence
//!    numbers and background mode. The text kept is capped ([`transcript::KEPT_MAX`]).
//! 2. On a cut (a reset, a mid-stream `error` event, the idle timeout) it asks
//!    [`Transcript::decide`]: [`Plan::Refuse`] with a [`Refusal`] (the app sees the cut, as
//!    without the feature; [`Refusal::fate`] is the metric's `result`), or
//!    [`Plan::Continue`] with a [`How`].
//! 3. It sends the continuation: for [`How::Resume`] a `GET` of [`Transcript::resume_path`]; else
//!    a `POST` of [`request::body`] (the original request, the partial carried as `How` says).
//!    A 400 that [`request::is_prefill_rejection`] recognises is the target refusing a prefill,
//!    not the failure: it asks again with `prefill = false` (a turn), and never reports it.
//! 4. It feeds the continuation's events, one whole event at a time, to a [`Splicer`] made from
//!    the transcript, and forwards what [`Splicer::feed`] returns (the last call returns the end:
//!    Anthropic's `message_delta` with the summed usage and `message_stop`; Chat's usage chunk
//!    when the app asked for one and `[DONE]`; Responses' `response.completed` with the whole
//!    output). When the continuation's body ends, [`Splicer::finish`] returns what is left.
//! 5. A [`SpliceError`]: [`SpliceError::Disagrees`] (the continuation restarts or repeats the
//!    answer: none of its text reached the app; the attempt failed) or [`SpliceError::Cut`] (the
//!    continuation was cut in turn). Either way [`Splicer::into_transcript`] is the app's
//!    transcript with whatever was sent to it, for the next decision (each hop is one attempt;
//!    how many the pipeline allows is its policy).
//! 6. Every attempt's tokens: [`Splicer::attempts`] ([`Spent`]), for the ledger (the cut ones
//!    are the wasted ones; a cut attempt's output is estimated from its text). The final usage
//!    the app reads is their sum, but for a resumed response: the same generation, its own usage.
//!
//! A comment (`: rebound: continued (HOW)`) marks the seam in the app's stream; SDKs skip
//! comments.
//!
//! # Decisions
//! - Not continued, `refused_tool_call`: a stream that carried a tool call (an open one's
//!   arguments would be cut JSON; after a whole one the message is the tool call's).
//!   `refused_thinking`: cut inside a thinking block (Anthropic `thinking`, Responses
//!   `reasoning`, Chat `reasoning_content` before any content). `failed`: nothing reached the app
//!   yet (the pipeline's own retry applies), the message already ended, the kept text is over the
//!   cap, several choices (`n` > 1), a body that is not a JSON object.
//! - Continued: [`How::Resume`] for a Responses background response (the same generation from
//!   `starting_after`: nothing is generated again, so a cut inside a tool call or reasoning is
//!   resumed too); [`How::Restart`] when the app has no text yet (the original request
//!   again, its start spliced away); else [`How::Prefill`] where the target accepts one (the
//!   pipeline says so) and no Anthropic thinking is enabled (a prefill is refused with thinking),
//!   else [`How::Turn`].
//! - After a completed Anthropic thinking block (or Responses reasoning item) the continuation is
//!   a turn carrying the text only: a thinking block's signature is not carried to another
//!   target. The continuation thinks anew; its thinking blocks are dropped from the app's stream
//!   (one message keeps one thinking before its text) and their tokens counted.
//! - The seam ([`seam`]): the continuation's first characters are held until it is clear what
//!   they do: a repeat of the partial's tail is dropped, whitespace is kept exactly once, a
//!   continuation that starts over or repeats the partial is an error, never spliced.
//! - The app's ids stay: the message id, Chat's `id`, `model` and `created`, Responses' response
//!   and item ids, its `sequence_number`s continued. A continuation's first text block (Chat:
//!   its content; Responses: its first message item's first text part) continues the block the
//!   cut left open; any other block is numbered after the app's, the open one closed first.
//!
//! # Not handled
//! Several choices (`n` > 1); Chat `logprobs` and Responses annotations of the text at the seam
//! (kept as they came, not re-cut); text in a block the seam does not watch (a second text
//! block) is not checked for repeats; the bytes a [`Framer`] holds are bounded by the caller.

mod anthropic;
mod chat;
pub(crate) mod event;
pub(crate) mod request;
mod responses;
pub(crate) mod seam;
mod splice;
pub(crate) mod transcript;

#[cfg(test)]
mod tests;

pub(crate) use event::Framer;
pub(crate) use seam::SeamError;
pub(crate) use splice::Splicer;
pub(crate) use transcript::Transcript;

use crate::words::spelled;

/// The API a stream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// Anthropic Messages (`POST /v1/messages`; Bedrock's and Vertex AI's streams of it are not
    /// continued).
    Messages,
    /// OpenAI Chat Completions.
    Chat,
    /// OpenAI Responses.
    Responses,
}

/// What a dialect's map makes of one event.
#[derive(Debug)]
pub(crate) enum Out {
    /// An event for the app.
    Event(String, serde_json::Value),
    /// Bytes for the app as they came (a ping, a comment): never held.
    Raw(Vec<u8>),
    /// A text delta of the run: the event, and the text the seam is to see.
    Text(String, serde_json::Value, String),
    /// The run's text is over: the seam decides with what it has.
    RunEnd,
    /// The continuation ended: the end of the app's stream.
    Finish,
}

/// What continuation knows of one API, implemented in that API's file: how an event it sends
/// changes what the app has, and how a text delta's text is replaced. The splicing of a
/// continuation's events is each file's `Map`.
pub(crate) trait DialectApi: Sync {
    /// Updates the app's transcript with an event it received.
    fn observe(&self, t: &mut Transcript, event: &event::Event);
    /// Sets the text of a text delta event.
    fn set_text(&self, value: &mut serde_json::Value, text: String);
}

impl Dialect {
    /// What continuation knows of this API.
    pub(crate) fn api(self) -> &'static dyn DialectApi {
        match self {
            Dialect::Messages => &anthropic::Messages,
            Dialect::Chat => &chat::Chat,
            Dialect::Responses => &responses::Responses,
        }
    }
}

/// How a cut stream is continued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum How {
    /// Responses background mode: the same generation, read again after the last sequence number
    /// the app has (`GET` [`Transcript::resume_path`]).
    Resume,
    /// The app has no text yet: the original request again.
    Restart,
    /// The partial as the start of the answer (a final assistant message).
    Prefill,
    /// The partial as an assistant message, and a user message asking to go on.
    Turn,
}

impl How {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            How::Resume => "resume",
            How::Restart => "restart",
            How::Prefill => "prefill",
            How::Turn => "turn",
        }
    }
}

/// What to do about a cut stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    Continue(How),
    Refuse(Refusal),
}

/// Why a cut stream is not continued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The stream carried a tool call.
    ToolCall,
    /// Cut inside a thinking (reasoning) block.
    Thinking,
    /// Nothing of a message reached the app yet.
    NotStarted,
    /// The message had ended.
    Ended,
    /// More text than [`transcript::KEPT_MAX`].
    TooLong,
    /// Something the continuation does not handle (several choices, a body that is not JSON).
    Unsupported,
}

impl Refusal {
    /// Why, in words (the error event's message).
    pub(crate) fn says(self) -> &'static str {
        match self {
            Refusal::ToolCall => "the stream carried a tool call",
            Refusal::Thinking => "it was cut inside a thinking block",
            Refusal::NotStarted => "no message had started",
            Refusal::Ended => "the message had ended",
            Refusal::TooLong => "more than a continuation keeps (1 MiB of text, 1024 blocks)",
            Refusal::Unsupported => {
                "a stream a continuation does not handle (several choices, a body that is not JSON)"
            }
        }
    }

    /// The `result` of `rebound_continuations_total`.
    pub(crate) fn fate(self) -> Fate {
        match self {
            Refusal::ToolCall => Fate::RefusedToolCall,
            Refusal::Thinking => Fate::RefusedThinking,
            Refusal::NotStarted | Refusal::Ended | Refusal::TooLong | Refusal::Unsupported => Fate::Failed,
        }
    }
}

/// The `result` label of `rebound_continuations_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    Continued,
    RefusedToolCall,
    RefusedThinking,
    Failed,
}

spelled!(Fate {
    "continued" => Continued,
    "refused_tool_call" => RefusedToolCall,
    "refused_thinking" => RefusedThinking,
    "failed" => Failed,
});

/// Why a continuation's events could not be spliced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpliceError {
    /// Its text does not agree with the partial (none of it reached the app).
    Disagrees(SeamError),
    /// It was cut in turn: an error event, or its body ended before its end.
    Cut,
}

impl From<SeamError> for SpliceError {
    fn from(e: SeamError) -> SpliceError {
        SpliceError::Disagrees(e)
    }
}
