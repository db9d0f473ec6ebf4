//! Token usage, read from a response as it streams: pure byte work, no I/O.
//!
//! Every shape the providers report usage in carries it as a JSON object under a `"usage"` key:
//! - OpenAI chat completions: the JSON body's `usage`, or, streamed with
//!   `stream_options.include_usage`, the last chunk's (every earlier chunk says `"usage":null`);
//!   `prompt_tokens` (cached ones included, `prompt_tokens_details.cached_tokens`),
//!   `completion_tokens`;
//! - OpenAI Responses API: the body's `usage`, or the `response.completed` event's
//!   `response.usage`: `input_tokens` (cached ones included, `input_tokens_details.cached_tokens`),
//!   `output_tokens`;
//! - Anthropic messages: the body's `usage`, or streamed: `message_start`'s `message.usage` and
//!   each `message_delta`'s `usage` (cumulative): `input_tokens` (cache reads and writes not
//!   included), `cache_read_input_tokens`, `cache_creation_input_tokens`, `output_tokens`.
//!
//! [`UsageScan`] is fed the body's bytes in order, frame by frame. It looks for the bytes
//! `"usage"` (one SIMD substring search per frame; a JSON string value cannot contain them
//! unescaped, so only a key matches) and parses only the value after that key, never the event or
//! the body around it. A value cut by a frame boundary is carried over (at most [`CARRY_MAX`]
//! bytes: a usage object is small), and so are the last bytes of a frame that could begin the key.
//! Nothing else is copied. Several reports of one response (Anthropic's start and deltas, a body
//! scanned twice) merge by taking each count's largest value, so a report seen twice is counted
//! once.
//!
//! The four kinds are disjoint: `input` is the input tokens neither read from nor written to a
//! prompt cache, so that the kinds add up to what the provider bills.

use crate::metrics::TokenOutcome;
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::sync::Arc;

use memchr::memmem;

mod object;

/// The searchers, built once (building one per frame costs more than the search).
static USAGE_KEY: std::sync::LazyLock<memmem::Finder<'static>> = std::sync::LazyLock::new(|| memmem::Finder::new(KEY));
use serde::{Deserialize, Serialize};

/// The most bytes carried over a frame boundary for one usage value.
pub(crate) const CARRY_MAX: usize = 8 * 1024;

const KEY: &[u8] = b"\"usage\"";

/// The first byte of a JSON object.
const OBJECT: u8 = 0x7b;

/// Bedrock's invocation metrics, in the last event of a stream: `{"inputTokenCount": ..,
/// "outputTokenCount": .., "cacheReadInputTokenCount": .., "cacheWriteInputTokenCount": ..}`.
static INVOCATION_KEY: std::sync::LazyLock<memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memmem::Finder::new(b"\"amazon-bedrock-invocationMetrics\""));

/// How far from a frame's end the invocation metrics are looked for: the key and four counts,
/// with room for the latencies and whatever Bedrock adds beside them.
const INVOCATION_TAIL: usize = 512;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Invocation {
    #[serde(default)]
    input_token_count: u64,
    #[serde(default)]
    output_token_count: u64,
    #[serde(default)]
    cache_read_input_token_count: u64,
    #[serde(default)]
    cache_write_input_token_count: u64,
}

/// The invocation metrics in `frame`, which holds whole events (a re-framed Bedrock stream): they
/// are the last member of the last event, `message_stop`, so only the frame's end is searched.
fn invocation_metrics(frame: &[u8]) -> Option<Usage> {
    let tail = &frame[frame.len().saturating_sub(INVOCATION_TAIL)..];
    let at = INVOCATION_KEY.find(tail)?;
    let rest = &tail[at..];
    let colon = memchr::memchr(b':', rest)?;
    let mut values = serde_json::Deserializer::from_slice(&rest[colon + 1..]).into_iter::<Invocation>();
    let m = values.next()?.ok()?;
    Some(Usage {
        input: m.input_token_count,
        output: m.output_token_count,
        cache_read: m.cache_read_input_token_count,
        cache_write: m.cache_write_input_token_count,
    })
}

/// The token counts of one attempt's response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Input tokens not read from or written to a prompt cache.
    pub input: u64,
    pub output: u64,
    /// Input tokens read from a prompt cache.
    pub(crate) cache_read: u64,
    /// Input tokens written to a prompt cache.
    pub(crate) cache_write: u64,
}

impl Usage {
    /// Each count, in the order of `rebound_tokens_total`'s kinds
    /// ([`crate::metrics::TokenKind`]).
    pub(crate) fn kinds(&self) -> [u64; 4] {
        [self.input, self.output, self.cache_read, self.cache_write]
    }

    /// Each count's largest value of the two (see the module documentation).
    pub(crate) fn merge(&mut self, other: Usage) {
        self.input = self.input.max(other.input);
        self.output = self.output.max(other.output);
        self.cache_read = self.cache_read.max(other.cache_read);
        self.cache_write = self.cache_write.max(other.cache_write);
    }
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(PartialEq))]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

/// A usage object, in any provider's field names (unknown fields ignored).
#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(PartialEq))]
struct Raw {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<Details>,
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    input_tokens_details: Option<Details>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

impl Raw {
    fn usage(&self) -> Usage {
        // OpenAI counts cached tokens inside the input; Anthropic apart from it.
        let cached = self
            .prompt_tokens_details
            .as_ref()
            .or(self.input_tokens_details.as_ref())
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0);
        let input = self.prompt_tokens.or(self.input_tokens).unwrap_or(0);
        Usage {
            input: input.saturating_sub(cached),
            output: self.completion_tokens.or(self.output_tokens).unwrap_or(0),
            cache_read: cached.saturating_add(self.cache_read_input_tokens.unwrap_or(0)),
            cache_write: self.cache_creation_input_tokens.unwrap_or(0),
        }
    }
}

/// One attempt's usage, as the access log, dead letters and job records show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptUsage {
    /// The attempt's number, from 1.
    pub attempt: u32,
    pub input: u64,
    pub output: u64,
    pub(crate) cache_read: u64,
    pub(crate) cache_write: u64,
    /// `delivered` or `wasted`.
    pub outcome: std::borrow::Cow<'static, str>,
}

/// The usage of a request's attempts, each added when its tokens are counted (an attempt that
/// reported none is not listed). Shared by the request's books, its dead letter and its job.
/// Room for one attempt in place: most requests have one, and its entry then needs no allocation
/// of its own.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ledger(Arc<Mutex<SmallVec<[AttemptUsage; 1]>>>);

impl Ledger {
    pub(crate) fn add(&self, attempt: u32, usage: Usage, wasted: bool) {
        let entry = AttemptUsage {
            attempt,
            input: usage.input,
            output: usage.output,
            cache_read: usage.cache_read,
            cache_write: usage.cache_write,
            outcome: std::borrow::Cow::Borrowed(match wasted {
                true => TokenOutcome::Wasted.as_str(),
                false => TokenOutcome::Delivered.as_str(),
            }),
        };
        self.0.lock().push(entry);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.lock().is_empty()
    }

    /// Every attempt's usage so far, in the order counted.
    pub(crate) fn entries(&self) -> Vec<AttemptUsage> {
        self.0.lock().to_vec()
    }

    /// The entries as compact JSON (`[]` when none), for the access log.
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(&self.0.lock()[..]).unwrap_or_default()
    }
}

/// What parsing at a `"usage"` key found.
enum Parsed {
    /// A usage object (or `null`, or something else that is no usage: `None`), ending at this
    /// offset.
    Done(Option<Usage>, usize),
    /// The value is cut short: more bytes are needed.
    Incomplete,
}

/// Parses the value of the `"usage"` key that starts `bytes`.
fn parse_at(bytes: &[u8]) -> Parsed {
    let mut i = KEY.len();
    let skip_ws = |i: &mut usize| {
        while bytes.get(*i).is_some_and(|b| b.is_ascii_whitespace()) {
            *i += 1;
        }
    };
    skip_ws(&mut i);
    match bytes.get(i) {
        None => return Parsed::Incomplete,
        Some(b':') => i += 1,
        Some(_) => return Parsed::Done(None, i), // a string "usage", not a key
    }
    skip_ws(&mut i);
    match bytes.get(i) {
        None => return Parsed::Incomplete,
        Some(&OBJECT) => {}
        Some(_) => return Parsed::Done(None, i), // null, or not an object
    }
    // The common shapes without serde; serde for the rest (see `object`).
    if let Some((raw, len)) = object::read(&bytes[i..]) {
        return Parsed::Done(Some(raw.usage()), i + len);
    }
    let mut values = serde_json::Deserializer::from_slice(&bytes[i..]).into_iter::<Raw>();
    match values.next() {
        Some(Ok(raw)) => Parsed::Done(Some(raw.usage()), i + values.byte_offset()),
        Some(Err(e)) if e.is_eof() => Parsed::Incomplete,
        _ => Parsed::Done(None, i + 1),
    }
}

/// Reads usage from a body fed in order (see the module documentation).
#[derive(Debug, Default, Clone)]
pub(crate) struct UsageScan {
    usage: Usage,
    found: bool,
    /// Bytes carried from the previous frames: a usage value cut short (starting with the key),
    /// or the last bytes of a frame that may begin the key.
    carry: Vec<u8>,
    /// Also read Bedrock's invocation metrics: the body is a re-framed Bedrock stream, whose
    /// frames each hold whole events.
    invocation: bool,
}

impl UsageScan {
    /// The usage found so far (`None` when the body reported none).
    pub(crate) fn usage(&self) -> Option<Usage> {
        self.found.then_some(self.usage)
    }

    fn found(&mut self, usage: Usage) {
        self.usage.merge(usage);
        self.found = true;
    }

    /// A scan that also reads Bedrock's invocation metrics (`amazon-bedrock-invocationMetrics`),
    /// for a re-framed Bedrock stream (whole events in each frame).
    pub(crate) fn with_invocation_metrics() -> UsageScan {
        UsageScan {
            invocation: true,
            ..UsageScan::default()
        }
    }

    /// Feeds the body's next bytes.
    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        if self.invocation {
            if let Some(usage) = invocation_metrics(chunk) {
                self.found(usage);
            }
        }
        let mut from = 0;
        if !self.carry.is_empty() {
            from = self.resume(chunk);
        }
        let Some(rest) = chunk.get(from..) else { return };
        let mut at = 0;
        while let Some(k) = USAGE_KEY.find(&rest[at..]) {
            let start = at + k;
            match parse_at(&rest[start..]) {
                Parsed::Done(usage, end) => {
                    if let Some(u) = usage {
                        self.found(u);
                    }
                    at = start + end.max(1);
                }
                Parsed::Incomplete => {
                    if rest.len() - start <= CARRY_MAX {
                        self.carry.extend_from_slice(&rest[start..]);
                    }
                    return;
                }
            }
        }
        self.carry_key_prefix(&rest[at..]);
    }

    /// Keeps the end of `tail` when it could be the start of the key.
    fn carry_key_prefix(&mut self, tail: &[u8]) {
        let longest = (1..KEY.len())
            .rev()
            .find(|&n| tail.len() >= n && tail.ends_with(&KEY[..n]));
        if let Some(n) = longest {
            self.carry.extend_from_slice(&tail[tail.len() - n..]);
        }
    }

    /// Continues what was carried with the start of `chunk`: the offset in `chunk` from which
    /// the rest is to be scanned.
    fn resume(&mut self, chunk: &[u8]) -> usize {
        let mut carry = std::mem::take(&mut self.carry);
        let held = carry.len();
        if !carry.starts_with(KEY) {
            // A possible start of the key: is it completed here?
            let need = KEY.len() - held;
            if chunk.len() < need {
                carry.extend_from_slice(chunk);
                if KEY.starts_with(&carry) {
                    self.carry = carry;
                }
                return chunk.len();
            }
            if chunk[..need] != KEY[held..] {
                return 0;
            }
        }
        let take = chunk.len().min(CARRY_MAX.saturating_sub(held));
        carry.extend_from_slice(&chunk[..take]);
        match parse_at(&carry) {
            Parsed::Done(usage, end) => {
                if let Some(u) = usage {
                    self.found(u);
                }
                end.saturating_sub(held).min(chunk.len())
            }
            Parsed::Incomplete if take == chunk.len() && carry.len() < CARRY_MAX => {
                self.carry = carry;
                chunk.len()
            }
            // Too long to be a usage object: given up.
            Parsed::Incomplete => take,
        }
    }
}

/// The body with its top-level `model` replaced by `models[model]` (a target's model rewrite),
/// or `None` when nothing is to change: no top-level string `model`, or one the map does not
/// name. Only the model's bytes change; the rest of the body is sent as it came.
pub(crate) fn rewrite_model(body: &[u8], models: &std::collections::BTreeMap<String, String>) -> Option<Vec<u8>> {
    let mut value = None;
    super::json::each_member(body, |key, v| {
        if super::json::key_is(key, "model") {
            value = Some(v);
        }
    });
    let value = value?;
    let to = serde_json::to_string(models.get(&*super::json::string_value(value)?)?).ok()?;
    // Where the value lies in the body (it is a slice of it).
    let start = (value.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start + value.len();
    let mut out = Vec::with_capacity(body.len() + to.len());
    out.extend_from_slice(body.get(..start)?);
    out.extend_from_slice(to.as_bytes());
    out.extend_from_slice(body.get(end..)?);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_rewrite_changes_the_top_level_model_only() {
        let models: std::collections::BTreeMap<String, String> =
            [("gpt-4o".to_string(), "gpt4o-eu-prod".to_string())].into();
        let body = br#"{"model": "gpt-4o", "messages":[{"role":"user","content":"say \"model\": 1"}], "n":1.50}"#;
        let out = rewrite_model(body, &models).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"model": "gpt4o-eu-prod", "messages":[{"role":"user","content":"say \"model\": 1"}], "n":1.50}"#
        );
        // Not named: unchanged; not JSON, no model, a nested model first: nothing to do.
        assert_eq!(rewrite_model(br#"{"model":"o3"}"#, &models), None);
        assert_eq!(rewrite_model(b"model=gpt-4o", &models), None);
        assert_eq!(rewrite_model(br#"{"messages":[]}"#, &models), None);
        assert_eq!(
            rewrite_model(br#"{"tools":[{"model":"gpt-4o"}],"model":"x"}"#, &models),
            None
        );
        // The top-level one, wherever it is, escaped or not.
        assert_eq!(
            rewrite_model(br#"{"tools":[{"model":"x"}],"mod\u0065l":"gpt\u002d4o"}"#, &models).as_deref(),
            Some(&br#"{"tools":[{"model":"x"}],"mod\u0065l":"gpt4o-eu-prod"}"#[..])
        );
    }
    use proptest::prelude::*;

    const CHAT_JSON: &str = r#"{"id":"c","model":"gpt-4o","choices":[{"message":{"content":"the \"usage\": {\"prompt_tokens\": 999}"}}],"usage":{"prompt_tokens":120,"completion_tokens":30,"total_tokens":150,"prompt_tokens_details":{"cached_tokens":100,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":10}}}"#;
    const CHAT_SSE: &str = concat!(
        "data: {\"id\":\"c\",\"model\":\"gpt-4o\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n",
        "data: {\"id\":\"c\",\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":5,\"total_tokens\":17}}\n\n",
        "data: [DONE]\n\n",
    );
    const RESPONSES_SSE: &str = concat!(
        "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"usage\":null}}\n\n",
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"usage\"}\n\n",
        "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"output\":[{\"content\":[{\"text\":\"x\"}]}],",
        "\"usage\":{\"input_tokens\":40,\"input_tokens_details\":{\"cached_tokens\":8},\"output_tokens\":7,",
        "\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":47}}}\n\n",
    );
    const ANTHROPIC_SSE: &str = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"claude\",\"content\":[],",
        "\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":3,\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    const ANTHROPIC_JSON: &str = r#"{"id":"m","type":"message","model":"claude","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":12,"cache_creation_input_tokens":null,"cache_read_input_tokens":0,"output_tokens":96,"server_tool_use":{"web_search_requests":0}}}"#;

    fn scan(chunks: &[&[u8]]) -> Option<Usage> {
        let mut s = UsageScan::default();
        for c in chunks {
            s.feed(c);
        }
        s.usage()
    }

    fn u(input: u64, output: u64, cache_read: u64, cache_write: u64) -> Option<Usage> {
        Some(Usage {
            input,
            output,
            cache_read,
            cache_write,
        })
    }

    #[test]
    fn every_provider_shape() {
        assert_eq!(scan(&[CHAT_JSON.as_bytes()]), u(20, 30, 100, 0));
        assert_eq!(scan(&[CHAT_SSE.as_bytes()]), u(12, 5, 0, 0));
        assert_eq!(scan(&[RESPONSES_SSE.as_bytes()]), u(32, 7, 8, 0));
        assert_eq!(scan(&[ANTHROPIC_SSE.as_bytes()]), u(25, 15, 100, 3));
        assert_eq!(scan(&[ANTHROPIC_JSON.as_bytes()]), u(12, 96, 0, 0));
        let responses_json = r#"{"id":"r","object":"response","usage":{"input_tokens":5,"output_tokens":2}}"#;
        assert_eq!(scan(&[responses_json.as_bytes()]), u(5, 2, 0, 0));
    }

    #[test]
    fn bedrock_invocation_metrics_are_read_where_asked() {
        let stop = br#"event: message_stop
data: {"type":"message_stop","amazon-bedrock-invocationMetrics":{"inputTokenCount":12,"outputTokenCount":40,"invocationLatency":900,"firstByteLatency":300,"cacheReadInputTokenCount":5}}

"#;
        let mut scan = UsageScan::with_invocation_metrics();
        scan.feed(stop);
        assert_eq!(scan.usage(), u(12, 40, 5, 0));
        let mut plain = UsageScan::default();
        plain.feed(stop);
        assert_eq!(
            plain.usage(),
            None,
            "only a re-framed Bedrock stream is searched for them"
        );
        // With the Anthropic events' own usage: the same counts, counted once.
        let mut both = UsageScan::with_invocation_metrics();
        both.feed(br#"data: {"type":"message_delta","usage":{"output_tokens":40}}"#);
        both.feed(stop);
        assert_eq!(both.usage(), u(12, 40, 5, 0));
    }

    #[test]
    fn no_usage_is_none() {
        for body in [
            "data: {\"usage\":null}\n\ndata: [DONE]\n\n",
            "{\"usage\": \"many\"}",
            "{\"text\":\"usage\"}",
            "",
            "\"usage\"",
        ] {
            assert_eq!(scan(&[body.as_bytes()]), None, "{body:?}");
        }
        assert_eq!(scan(&[b"{\"usage\":{\"prompt_tokens\":1"]), None, "cut short");
    }

    #[test]
    fn split_anywhere_including_inside_the_key() {
        let s = ANTHROPIC_SSE.as_bytes();
        for cut in 0..s.len() {
            assert_eq!(scan(&[&s[..cut], &s[cut..]]), u(25, 15, 100, 3), "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = CHAT_SSE.as_bytes().chunks(1).collect();
        assert_eq!(scan(&bytes), u(12, 5, 0, 0));
    }

    #[test]
    fn an_overlong_value_is_given_up_without_growing() {
        let mut s = UsageScan::default();
        s.feed(b"{\"usage\":{\"prompt_tokens\":1,\"x\":\"");
        for _ in 0..10 {
            s.feed(&[b'a'; 4096]);
            assert!(s.carry.len() <= CARRY_MAX);
        }
        s.feed(b"\"}}");
        assert_eq!(s.usage(), None);
        // And the scan goes on afterwards.
        s.feed(b"data: {\"usage\":{\"completion_tokens\":3}}\n\n");
        assert_eq!(s.usage(), u(0, 3, 0, 0));
    }

    fn cut(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        points.push(0);
        points.push(bytes.len());
        points.sort_unstable();
        points.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).collect()
    }

    fn proptest_config() -> ProptestConfig {
        let mut config = ProptestConfig::with_cases(256);
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(0x70_4E_25);
        config.failure_persistence = None;
        config
    }

    proptest! {
        #![proptest_config(proptest_config())]

        #[test]
        fn framing_does_not_change_the_usage(
            which in 0usize..4,
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            let body = [CHAT_JSON, CHAT_SSE, RESPONSES_SSE, ANTHROPIC_SSE][which].as_bytes();
            let whole = scan(&[body]);
            let chunks = cut(body, &cuts);
            let split = scan(&chunks.iter().map(Vec::as_slice).collect::<Vec<_>>());
            prop_assert_eq!(split, whole);
            prop_assert!(whole.is_some());
        }

        #[test]
        fn never_panics(bytes in any::<Vec<u8>>(), cuts in proptest::collection::vec(any::<usize>(), 0..4)) {
            let chunks = cut(&bytes, &cuts);
            let _ = scan(&chunks.iter().map(Vec::as_slice).collect::<Vec<_>>());
            let _ = rewrite_model(&bytes, &[("m".to_string(), "n".to_string())].into());
        }
    }
}
