//! The usage objects providers send, read without serde: every response with a JSON body is
//! scanned for one, and serde's derived reader costs several times the bytes' worth (each key is
//! validated as UTF-8 and matched against every field name).
//!
//! [`read`] takes the common shapes only and declines the rest, which the caller then gives to
//! serde, so that what is read never differs from what serde reads:
//! - keys and string values of printable ASCII without escapes;
//! - counts as plain non-negative integers (no sign, fraction, exponent or leading zero) that fit
//!   a `u64`, or `null`;
//! - nested objects one level deep, of such scalars (`prompt_tokens_details`, Anthropic's
//!   `cache_creation`);
//! - each field the reader knows once (serde refuses a duplicate field).
//!
//! Anything else (an escape, a float, an array, deeper nesting, the end of the bytes before the
//! object's) is declined, not judged.

use super::{Details, Raw};

/// The usage object that starts `bytes` (at its `{`) and the offset just past its `}`, when it
/// has one of the common shapes; `None` leaves it to serde.
pub(super) fn read(bytes: &[u8]) -> Option<(Raw, usize)> {
    let mut c = Cursor { bytes, at: 0 };
    let mut raw = Raw::default();
    let mut seen = 0u16;
    c.object(|c, key| {
        let (bit, slot) = match key {
            b"prompt_tokens" => (0, &mut raw.prompt_tokens),
            b"completion_tokens" => (1, &mut raw.completion_tokens),
            b"input_tokens" => (2, &mut raw.input_tokens),
            b"output_tokens" => (3, &mut raw.output_tokens),
            b"cache_read_input_tokens" => (4, &mut raw.cache_read_input_tokens),
            b"cache_creation_input_tokens" => (5, &mut raw.cache_creation_input_tokens),
            b"prompt_tokens_details" => {
                once(&mut seen, 6)?;
                raw.prompt_tokens_details = c.details()?;
                return Some(());
            }
            b"input_tokens_details" => {
                once(&mut seen, 7)?;
                raw.input_tokens_details = c.details()?;
                return Some(());
            }
            _ => return c.skip_value(true),
        };
        once(&mut seen, bit)?;
        *slot = c.count()?;
        Some(())
    })?;
    Some((raw, c.at))
}

/// Marks field `bit` as read; `None` when it already was.
fn once(seen: &mut u16, bit: u16) -> Option<()> {
    let mask = 1 << bit;
    if *seen & mask != 0 {
        return None;
    }
    *seen |= mask;
    Some(())
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    /// The next byte that is not JSON whitespace (not consumed).
    fn peek(&mut self) -> Option<u8> {
        while let Some(&b) = self.bytes.get(self.at) {
            if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                return Some(b);
            }
            self.at += 1;
        }
        None
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// `{}` or `{"key": value, ...}`, each member's value read by `member`.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            member(self, key)?;
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A string of printable ASCII without escapes: its bytes between the quotes.
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let rest = self.bytes.get(self.at..)?;
        let len = memchr::memchr2(b'"', b'\\', rest)?;
        let s = &rest[..len];
        if rest[len] != b'"' || !s.iter().all(|b| (b' '..=b'~').contains(b)) {
            return None;
        }
        self.at += len + 1;
        Some(s)
    }

    /// `null` (`None`), or a count.
    fn count(&mut self) -> Option<Option<u64>> {
        if self.peek()? == b'n' {
            return self.literal(b"null").map(|()| None);
        }
        let start = self.at;
        let mut n: u64 = 0;
        while let Some(d) = self.bytes.get(self.at).filter(|b| b.is_ascii_digit()) {
            n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
            self.at += 1;
        }
        let digits = self.at - start;
        // No digits, a leading zero, or a number that goes on (`.5`, `e3`): serde's to judge.
        let ended = matches!(
            self.bytes.get(self.at),
            Some(b' ' | b'\n' | b'\r' | b'\t' | b',' | b'}')
        );
        (digits > 0 && (digits == 1 || self.bytes[start] != b'0') && ended).then_some(Some(n))
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// `null`, or an object whose `cached_tokens` (once at most) is a count.
    fn details(&mut self) -> Option<Option<Details>> {
        if self.peek()? == b'n' {
            return self.literal(b"null").map(|()| None);
        }
        let mut details = Details::default();
        let mut seen = 0u16;
        self.object(|c, key| match key {
            b"cached_tokens" => {
                once(&mut seen, 0)?;
                details.cached_tokens = c.count()?;
                Some(())
            }
            _ => c.skip_value(false),
        })?;
        Some(Some(details))
    }

    /// A value not read: a string, a count, `null`, `true`, `false`, or (when `nested`) an object
    /// of those.
    fn skip_value(&mut self, nested: bool) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'n' => self.literal(b"null"),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'{' if nested => self.object(|c, _| c.skip_value(false)),
            _ => self.count().map(drop),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What serde reads from the same bytes: the usage and where it ends, or `None` for an error.
    fn by_serde(bytes: &[u8]) -> Option<(Raw, usize)> {
        let mut values = serde_json::Deserializer::from_slice(bytes).into_iter::<Raw>();
        match values.next() {
            Some(Ok(raw)) => Some((raw, values.byte_offset())),
            _ => None,
        }
    }

    #[test]
    fn the_providers_usage_objects_are_read_without_serde() {
        for object in [
            r#"{"prompt_tokens":12,"completion_tokens":96,"total_tokens":108}"#,
            r#"{"prompt_tokens":120,"completion_tokens":30,"total_tokens":150,"prompt_tokens_details":{"cached_tokens":100,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":10,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}"#,
            r#"{"input_tokens":40,"input_tokens_details":{"cached_tokens":8},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":47}"#,
            r#"{"input_tokens":25,"cache_creation_input_tokens":0,"cache_read_input_tokens":100,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"output_tokens":1,"service_tier":"standard"}"#,
            r#"{"output_tokens": 15}"#,
            "{ \"prompt_tokens\" : 3 ,\n \"completion_tokens\" : null }",
            "{}",
        ] {
            let read = read(object.as_bytes());
            assert!(read.is_some(), "declined: {object}");
            assert_eq!(read, by_serde(object.as_bytes()), "{object}");
        }
    }

    #[test]
    fn what_it_declines_serde_judges() {
        for object in [
            r#"{"prompt_tokens":1.0}"#,
            r#"{"prompt_tokens":-1}"#,
            r#"{"prompt_tokens":012}"#,
            r#"{"prompt_tokens":18446744073709551616}"#,
            r#"{"prompt_tokens":1,"prompt_tokens":2}"#,
            r#"{"prompt\u005ftokens":1}"#,
            r#"{"prompt_tokens":"1"}"#,
            r#"{"x":[1]}"#,
            r#"{"x":{"y":{}}}"#,
            r#"{"prompt_tokens":1"#,
            r#"{"prompt_tokens":1,}"#,
            r#"{"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":1}}"#,
            "{\"n\u{e9}\":1}",
        ] {
            assert_eq!(read(object.as_bytes()), None, "{object}");
        }
    }

    /// JSON-ish objects from usage-like pieces: valid or not, known fields or not, repeated or
    /// not, with odd numbers, nesting and spacing.
    fn objects() -> impl Strategy<Value = String> {
        let key = prop::sample::select(vec![
            "prompt_tokens",
            "completion_tokens",
            "input_tokens",
            "output_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
            "total_tokens",
            "service_tier",
            "cached_tokens",
            "prompt\\u005ftokens",
        ]);
        let scalar = prop::sample::select(vec![
            "0",
            "7",
            "120",
            "007",
            "1.5",
            "-3",
            "1e3",
            "null",
            "true",
            "false",
            "\"x\"",
            "\"a\\\"b\"",
            "18446744073709551615",
            "18446744073709551616",
            "[]",
            "{}",
            "",
        ]);
        let details_key = prop::sample::select(vec!["prompt_tokens_details", "input_tokens_details", "cache_creation"]);
        let space = prop::sample::select(vec!["", " ", "\n\t"]);
        let member = prop_oneof![
            (key, scalar.clone(), space.clone()).prop_map(|(k, v, s)| format!("{s}\"{k}\"{s}:{s}{v}")),
            (
                details_key,
                proptest::collection::vec(
                    (prop::sample::select(vec!["cached_tokens", "audio_tokens"]), scalar),
                    0..3
                )
            )
                .prop_map(|(k, inner)| {
                    let inner: Vec<String> = inner.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                    format!("\"{k}\":{{{}}}", inner.join(","))
                }),
        ];
        (proptest::collection::vec(member, 0..6), space, any::<bool>()).prop_map(|(members, s, cut)| {
            let object = format!("{{{}{s}}}", members.join(","));
            match cut {
                true => object[..object.len() / 2].to_string(),
                false => object,
            }
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 2048,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x05A6E),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]
        /// Whatever it reads, serde reads the same from the same bytes.
        #[test]
        fn it_reads_what_serde_reads(object in objects()) {
            if let Some(read) = read(object.as_bytes()) {
                prop_assert_eq!(Some(read), by_serde(object.as_bytes()), "{}", object);
            }
        }
    }
}
