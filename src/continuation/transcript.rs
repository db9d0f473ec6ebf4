//! What the app has received of a streamed answer, fed each whole event forwarded to it: the
//! message's ids, its blocks (Anthropic's content blocks, Chat's content and reasoning, Responses'
//! output items) with their text and whether they are open, the usage reported, Responses'
//! sequence numbers and background mode; and the decision on a cut.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde_json::Value;

use super::event::{u64_at, Event};
use super::{Dialect, How, Plan, Refusal};
use crate::wire::usage::{Usage, UsageScan};

/// The most text (and Responses items) kept: past it, a cut is not continued.
pub(crate) const KEPT_MAX: usize = 1024 * 1024;

/// The most blocks kept: past it, a cut is not continued (a message of many empty blocks costs
/// no more than this).
pub(crate) const MAX_BLOCKS: usize = 1024;

/// The most content parts of one block kept (a Responses message has one or two).
pub(crate) const MAX_PARTS: u64 = 16;

/// What a block is to a continuation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Text,
    /// Anthropic `thinking` / `redacted_thinking`, Responses `reasoning`, Chat reasoning.
    Thinking,
    /// A tool call, or anything else that is not text (a server tool's use or result).
    Tool,
}

/// One block of the app's message.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    /// Its index in the app's stream (Anthropic's `index`, Responses' `output_index`).
    pub(crate) index: u64,
    pub(crate) kind: Kind,
    pub(crate) open: bool,
    /// Its text, per content part (one part but for a Responses message).
    pub(crate) parts: Vec<String>,
    /// Responses: the content part open, if any.
    pub(crate) part_open: Option<u64>,
    /// Responses: the item as added, then as done.
    pub(crate) item: Option<Value>,
}

impl Block {
    pub(crate) fn text(&self) -> String {
        self.parts.concat()
    }
}

/// One attempt's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spent {
    pub(crate) usage: Usage,
    /// Its output count is estimated from its text (a cut attempt reports no final count).
    pub(crate) estimated: bool,
}

/// What the app has of a streamed answer (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct Transcript {
    pub(crate) dialect: Dialect,
    /// The message's id (Anthropic `msg_`, Chat `chatcmpl-`, Responses `resp_`).
    pub(crate) id: Option<String>,
    pub(crate) model: Option<String>,
    /// Chat's `created`, Responses' `created_at`.
    pub(crate) created: Option<Value>,
    pub(crate) started: bool,
    /// The message ended (a finish or stop reason, or the stream's last event).
    pub(crate) ended: bool,
    /// The stream's own last event came (Chat's `[DONE]`, Anthropic's `message_stop`,
    /// Responses' final event).
    pub(crate) closed: bool,
    pub(crate) blocks: Vec<Block>,
    /// Bytes of text and items kept, and whether some were not.
    kept: usize,
    overflow: bool,
    /// Something seen that a continuation does not handle (a second choice).
    pub(crate) unsupported: bool,
    /// Responses: the last `sequence_number`, and whether the response runs in background mode.
    pub(crate) last_seq: Option<u64>,
    pub(crate) background: bool,
    /// The attempt the app reads now: the usage it reported, and the characters it produced.
    usage: UsageScan,
    chars: usize,
    /// Earlier attempts' tokens.
    spent: Vec<Spent>,
}

impl Transcript {
    pub(crate) fn new(dialect: Dialect) -> Transcript {
        Transcript {
            dialect,
            id: None,
            model: None,
            created: None,
            started: false,
            ended: false,
            closed: false,
            blocks: Vec::new(),
            kept: 0,
            overflow: false,
            unsupported: false,
            last_seq: None,
            background: false,
            usage: UsageScan::default(),
            chars: 0,
            spent: Vec::new(),
        }
    }

    /// Feeds one whole event the app received (its bytes as forwarded).
    pub(crate) fn observe(&mut self, event: &[u8]) {
        self.usage.feed(event);
        self.forwarded(&Event::parse(event));
    }

    /// Updates the app's view with an event sent to it (its usage not counted: a splicer's
    /// events carry the sums).
    pub(crate) fn forwarded(&mut self, event: &Event) {
        self.dialect.api().observe(self, event);
    }

    /// The app's text so far: every text block's, in order.
    pub(crate) fn text(&self) -> String {
        self.blocks
            .iter()
            .filter(|b| b.kind == Kind::Text)
            .map(Block::text)
            .collect()
    }

    /// The characters of text and thinking the app has (what the tokens produced are estimated
    /// from).
    pub(crate) fn produced_chars(&self) -> usize {
        let chars = |b: &Block| b.parts.iter().map(|p| p.chars().count()).sum::<usize>();
        self.blocks.iter().filter(|b| b.kind != Kind::Tool).map(chars).sum()
    }

    /// For a stream cut after its message ended but before its last event: that event (Chat's
    /// `[DONE]`, Anthropic's `message_stop`), so that the app reads a whole stream. `None` when
    /// nothing is missing or the message had not ended.
    /// Not when the transcript may have missed events (over its cap: the last one may have come)
    /// or the stream has a choice it does not follow (`n` > 1: another may be cut short).
    pub(crate) fn closing(&self) -> Option<&'static [u8]> {
        if self.overflow || self.unsupported {
            return None;
        }
        match (self.ended && !self.closed, self.dialect) {
            (true, Dialect::Chat) => Some(super::event::DONE),
            (true, Dialect::Messages) => Some(super::event::MESSAGE_STOP),
            _ => None,
        }
    }

    /// What to do about a cut, for the original `request` (its body). `prefill`: the target
    /// accepts an assistant prefill (false after [`super::request::is_prefill_rejection`]).
    /// See the module documentation of [`super`] for the rules.
    pub(crate) fn decide(&self, request: &[u8], prefill: bool) -> Plan {
        if !self.started {
            return Plan::Refuse(Refusal::NotStarted);
        }
        if self.ended {
            return Plan::Refuse(Refusal::Ended);
        }
        // The same generation read on: nothing is generated again, so nothing is refused.
        if self.resume_path().is_some() {
            return Plan::Continue(How::Resume);
        }
        if let Some(refusal) = self.refusal() {
            return Plan::Refuse(refusal);
        }
        let Ok(request) = serde_json::from_slice::<Value>(request) else {
            return Plan::Refuse(Refusal::Unsupported);
        };
        if !request.is_object() || u64_at(&request, "n").is_some_and(|n| n > 1) {
            return Plan::Refuse(Refusal::Unsupported);
        }
        if self.text().trim().is_empty() {
            return Plan::Continue(How::Restart);
        }
        let how = match self.dialect {
            Dialect::Messages if prefill && !thinks(&request) => How::Prefill,
            Dialect::Chat if prefill => How::Prefill,
            _ => How::Turn,
        };
        Plan::Continue(how)
    }

    /// Why a new generation may not continue what the app has.
    fn refusal(&self) -> Option<Refusal> {
        let refusal = if self.unsupported {
            Refusal::Unsupported
        } else if self.overflow {
            Refusal::TooLong
        } else if self.blocks.iter().any(|b| b.kind == Kind::Tool) {
            Refusal::ToolCall
        } else if self.blocks.iter().any(|b| b.kind == Kind::Thinking && b.open) {
            Refusal::Thinking
        } else {
            return None;
        };
        Some(refusal)
    }

    /// Responses background mode: where the same generation is read again, after the last event
    /// the app has (`GET`; the OpenAI path, the pipeline adapts it to its host).
    pub(crate) fn resume_path(&self) -> Option<String> {
        if self.dialect != Dialect::Responses || !self.background {
            return None;
        }
        Some(resume_path(self.id.as_deref()?, self.last_seq?))
    }

    /// The attempt the app read is over, cut: its tokens join the earlier attempts' (its output
    /// estimated from its text, one token per 4 characters, when it reported less).
    pub(crate) fn close_attempt(&mut self) {
        let mut usage = self.usage.usage().unwrap_or_default();
        let estimate = self.chars.div_ceil(4) as u64;
        let estimated = usage.output < estimate;
        usage.output = usage.output.max(estimate);
        self.spent.push(Spent { usage, estimated });
        self.usage = UsageScan::default();
        self.chars = 0;
    }

    /// Forgets the attempt the app reads now (a resumed generation's final usage counts it).
    pub(crate) fn reset_attempt(&mut self) {
        self.usage = UsageScan::default();
        self.chars = 0;
    }

    /// Makes `other`'s attempt the one the app reads now (a continuation's, spliced into it).
    pub(crate) fn adopt_attempt(&mut self, other: &Transcript) {
        self.usage = other.usage.clone();
        self.chars = other.chars;
    }

    /// The usage the attempt the app reads now reported.
    pub(crate) fn reported(&self) -> Usage {
        self.usage.usage().unwrap_or_default()
    }

    /// Earlier attempts' tokens.
    pub(crate) fn spent(&self) -> &[Spent] {
        &self.spent
    }

    /// The block at `index` (the last one there, for Chat's).
    pub(crate) fn block_mut(&mut self, index: u64) -> Option<&mut Block> {
        self.blocks.iter_mut().rev().find(|b| b.index == index)
    }

    /// A new block, open.
    pub(crate) fn open_block(&mut self, index: u64, kind: Kind, item: Option<Value>) {
        if self.blocks.len() >= MAX_BLOCKS {
            self.overflow = true;
            return;
        }
        self.blocks.push(Block {
            index,
            kind,
            open: true,
            parts: Vec::new(),
            part_open: None,
            item,
        });
    }

    /// Adds text to part `part` of the block at `index`, within the cap.
    pub(crate) fn append(&mut self, index: u64, part: u64, text: &str) {
        self.chars += text.chars().count();
        if !self.keep(text.len()) {
            return;
        }
        if part >= MAX_PARTS {
            return;
        }
        // Text for a block the stream never opened: a stream not understood, never continued
        // (the app has text the transcript would not know of).
        let Some(block) = self.block_mut(index) else {
            self.unsupported = true;
            return;
        };
        let part = part as usize;
        if block.parts.len() <= part {
            block.parts.resize(part + 1, String::new());
        }
        block.parts[part].push_str(text);
    }

    /// Counts characters produced that are not kept (a tool call's arguments).
    pub(crate) fn produced(&mut self, text: &str) {
        self.chars += text.chars().count();
    }

    /// Whether `bytes` more fit under the cap (counted when they do).
    pub(crate) fn keep(&mut self, bytes: usize) -> bool {
        if self.overflow || self.kept + bytes > KEPT_MAX {
            self.overflow = true;
            return false;
        }
        self.kept += bytes;
        true
    }

    /// Whether what the app has is past what a continuation keeps: the decision is made
    /// ([`Refusal::TooLong`]), and nothing more need be observed.
    pub(crate) fn overflowed(&self) -> bool {
        self.overflow
    }

    /// Notes a `sequence_number`.
    pub(crate) fn sequence(&mut self, v: &Value) {
        if let Some(seq) = u64_at(v, "sequence_number") {
            self.last_seq = Some(self.last_seq.map_or(seq, |s| s.max(seq)));
        }
    }
}

/// Whether an Anthropic request enables thinking (`thinking: {type: enabled | adaptive}`).
pub(crate) fn thinks(request: &Value) -> bool {
    request
        .get("thinking")
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
        .is_some_and(|t| t != "disabled")
}

/// Usage added field by field.
pub(crate) fn sum(a: Usage, b: Usage) -> Usage {
    Usage {
        input: a.input.saturating_add(b.input),
        output: a.output.saturating_add(b.output),
        cache_read: a.cache_read.saturating_add(b.cache_read),
        cache_write: a.cache_write.saturating_add(b.cache_write),
    }
}

/// What an id keeps of itself in a path.
const ID: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// The path that resumes a Responses background response `id` after sequence number `after`.
fn resume_path(id: &str, after: u64) -> String {
    format!(
        "/v1/responses/{}?stream=true&starting_after={after}",
        utf8_percent_encode(id, ID)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resume_path() {
        assert_eq!(
            resume_path("resp_abc-1", 42),
            "/v1/responses/resp_abc-1?stream=true&starting_after=42"
        );
        assert_eq!(
            resume_path("a/b?c", 0),
            "/v1/responses/a%2Fb%3Fc?stream=true&starting_after=0"
        );
    }
}
