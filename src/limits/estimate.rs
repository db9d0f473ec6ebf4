//! What a request may use of a token limit, reserved on admission before the provider says what
//! it used: the most output it asked for (`max_tokens`, `max_completion_tokens`,
//! `max_output_tokens`, Gemini's `generationConfig.maxOutputTokens`; [`DEFAULT_OUTPUT`] when it
//! names none) plus its prompt, estimated at one token per [`BYTES_PER_TOKEN`] bytes of body.
//!
//! The settlement gives back what was not used, so an estimate too high costs only while the
//! request runs; one too low is the request's excess, the only way a fleet passes a token limit
//! (`ledger.rs`'s bound). Decides nothing else: reading the usage is `wire::usage`'s.

/// Output reserved for a request that names no maximum.
pub(crate) const DEFAULT_OUTPUT: u64 = 4096;

/// Prompt bytes per token, for the estimate (about 4 for English text; JSON framing and
/// non-Latin text run lower, and their excess is settled).
pub(crate) const BYTES_PER_TOKEN: u64 = 4;

/// The keys that name the most output a request may use, in the order they are looked for.
const OUTPUT_KEYS: [&[u8]; 4] = [
    b"\"max_tokens\"",
    b"\"max_completion_tokens\"",
    b"\"max_output_tokens\"",
    b"\"maxOutputTokens\"",
];

/// The tokens a request with this body may use.
pub(crate) fn tokens(body: &[u8]) -> u64 {
    let (prompt, output) = split(body);
    prompt.saturating_add(output)
}

/// Its prompt (estimated) and the most output it may ask for: the first of [`OUTPUT_KEYS`] found
/// with a number for its value, found without parsing the body (a key inside a string is
/// escaped, `\"max_tokens\"`, and never matches; one whose value is not a number, a tool
/// schema's property, is passed over).
pub(crate) fn split(body: &[u8]) -> (u64, u64) {
    let output = OUTPUT_KEYS
        .iter()
        .find_map(|key| number_after(body, key))
        .unwrap_or(DEFAULT_OUTPUT);
    let prompt = (body.len() as u64).div_ceil(BYTES_PER_TOKEN);
    (prompt, output)
}

/// The first whole number that is the value of `key` in `body`.
fn number_after(body: &[u8], key: &[u8]) -> Option<u64> {
    memchr::memmem::find_iter(body, key).find_map(|at| {
        let rest = body.get(at + key.len()..)?;
        let rest = rest.get(rest.iter().position(|b| !b.is_ascii_whitespace())?..)?;
        let rest = rest.strip_prefix(b":")?;
        let rest = rest.get(rest.iter().position(|b| !b.is_ascii_whitespace())?..)?;
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        // A number with a fraction or an exponent is not a token count.
        if digits == 0 || rest.get(digits).is_some_and(|b| matches!(b, b'.' | b'e' | b'E')) {
            return None;
        }
        std::str::from_utf8(rest.get(..digits)?).ok()?.parse().ok()
    })
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

    #[test]
    fn only_a_keys_number_counts_not_a_schema_property_nor_text() {
        let output = |body: &[u8]| split(body).1;
        // A tool schema's property of that name comes first; the request's own value counts.
        let tool =
            br#"{"tools":[{"input_schema":{"properties":{"max_tokens":{"type":"integer"}}}}],"max_tokens" : 300}"#;
        assert_eq!(output(tool), 300);
        // In a message's text the key is escaped.
        let text = br#"{"messages":[{"content":"set \"max_tokens\": 5"}],"max_tokens":64}"#;
        assert_eq!(output(text), 64);
        assert_eq!(output(br#"{"max_tokens":1.5e3}"#), DEFAULT_OUTPUT);
        assert_eq!(output(br#"{"max_tokens":null,"max_completion_tokens":9}"#), 9);
        assert_eq!(output(br#"{"max_tokens":99999999999999999999999}"#), DEFAULT_OUTPUT);
    }
}
