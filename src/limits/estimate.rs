//! What a request may use of a token limit, reserved on admission before the provider says what
//! it used: the most output it asked for (`max_tokens`, `max_completion_tokens`,
//! `max_output_tokens`, Gemini's `generationConfig.maxOutputTokens`; [`DEFAULT_OUTPUT`] when it
//! names none) plus its prompt, estimated at one token per [`BYTES_PER_TOKEN`] bytes of body.
//!
//! The settlement gives back what was not used, so an estimate too high costs only while the
//! request runs; one too low is the request's excess, the only way a fleet passes a token limit
//! (`ledger.rs`'s bound). Decides nothing else: reading the usage is `wire::usage`'s.

use serde::Deserialize;

/// Output reserved for a request that names no maximum.
pub(crate) const DEFAULT_OUTPUT: u64 = 4096;

/// Prompt bytes per token, for the estimate (about 4 for English text; JSON framing and
/// non-Latin text run lower, and their excess is settled).
pub(crate) const BYTES_PER_TOKEN: u64 = 4;

#[derive(Deserialize, Default)]
struct Asked {
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    max_output_tokens: Option<u64>,
    #[serde(rename = "generationConfig")]
    generation_config: Option<GenerationConfig>,
}

#[derive(Deserialize, Default)]
struct GenerationConfig {
    #[serde(rename = "maxOutputTokens")]
    max_output_tokens: Option<u64>,
}

/// The tokens a request with this body may use.
pub(crate) fn tokens(body: &[u8]) -> u64 {
    let (prompt, output) = split(body);
    prompt.saturating_add(output)
}

/// Its prompt (estimated) and the most output it may ask for.
pub(crate) fn split(body: &[u8]) -> (u64, u64) {
    let asked: Asked = serde_json::from_slice(body).unwrap_or_default();
    let output = asked
        .max_tokens
        .or(asked.max_completion_tokens)
        .or(asked.max_output_tokens)
        .or(asked.generation_config.and_then(|g| g.max_output_tokens))
        .unwrap_or(DEFAULT_OUTPUT);
    let prompt = (body.len() as u64).div_ceil(BYTES_PER_TOKEN);
    (prompt, output)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_asked_for_plus_the_prompt_estimated() {
        let body = br#"{"model":"m","max_tokens":100,"messages":[]}"#;
        assert_eq!(tokens(body), 100 + (body.len() as u64).div_ceil(4));
        let openai = br#"{"max_completion_tokens":7}"#;
        assert_eq!(tokens(openai), 7 + 7);
        let gemini = br#"{"generationConfig":{"maxOutputTokens":50}}"#;
        assert_eq!(tokens(gemini), 50 + 11);
        let none = br#"{"model":"m"}"#;
        assert_eq!(tokens(none), DEFAULT_OUTPUT + 4);
        assert_eq!(tokens(b"not json"), DEFAULT_OUTPUT + 2);
    }
}
