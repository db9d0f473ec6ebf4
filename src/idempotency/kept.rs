//! The response headers kept with a stored response ([`super::KEPT_HEADERS`]), in one block.
//!
//! They are shared by every copy of a response (the live response, the store, each replay)
//! instead of copied, and held as one text: names and values joined by `\n`, which no header
//! value read with `to_str` can hold. A record evicted from a full in-memory store frees one
//! block for its headers instead of one per name and per value, and that block is cold by then:
//! the frees were the largest part of an eviction (`perf`, `bench/run --mode policy`).

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::fingerprint::shared_text;

/// Kept response headers, in order, as `(name, value)` pairs. Serialised as the list of pairs
/// (`[["content-type","application/json"]]`), as records have always been written.
#[derive(Clone)]
pub struct KeptHeaders(Repr);

#[derive(Clone)]
enum Repr {
    /// `name\nvalue\nname\nvalue`; empty when there are none.
    Joined(Arc<str>),
    /// Pairs of which one holds a `\n` (never read from a response; a record written elsewhere).
    Pairs(Arc<[(String, String)]>),
}

impl KeptHeaders {
    /// The kept headers `pairs()` walks, in order. It is walked once, joined on the stack
    /// ([`shared_text`]); only a text too long for it or a pair that holds a `\n` walks it again.
    pub(crate) fn of<'a, I>(pairs: impl Fn() -> I) -> KeptHeaders
    where
        I: Iterator<Item = (&'a str, &'a str)>,
    {
        let mut count = 0;
        let pieces = pairs().enumerate().flat_map(|(i, (name, value))| {
            count += 1;
            let sep: &[u8] = if i == 0 { b"" } else { b"\n" };
            [sep, name.as_bytes(), b"\n", value.as_bytes()]
        });
        match shared_text(pieces) {
            // Only the separators are newlines (2 per pair, less one), or a pair holds one itself.
            Some(text) if count == 0 || text.bytes().filter(|&b| b == b'\n').count() + 1 == 2 * count => {
                KeptHeaders(Repr::Joined(text))
            }
            _ => KeptHeaders::of_any(pairs),
        }
    }

    /// [`KeptHeaders::of`] for any length and any pairs.
    fn of_any<'a, I>(pairs: impl Fn() -> I) -> KeptHeaders
    where
        I: Iterator<Item = (&'a str, &'a str)>,
    {
        if pairs().any(|(name, value)| name.contains('\n') || value.contains('\n')) {
            let owned = pairs().map(|(n, v)| (n.to_string(), v.to_string())).collect();
            return KeptHeaders(Repr::Pairs(owned));
        }
        let mut text = String::new();
        for (i, (name, value)) in pairs().enumerate() {
            if i > 0 {
                text.push('\n');
            }
            text.push_str(name);
            text.push('\n');
            text.push_str(value);
        }
        KeptHeaders(Repr::Joined(Arc::from(text)))
    }

    /// As a header map (a pair that is not a valid header is left out).
    pub(crate) fn header_map(&self) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (name, value) in self {
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(name.as_bytes()),
                http::HeaderValue::from_str(value),
            ) {
                h.append(name, value);
            }
        }
        h
    }

    /// The pairs, in order.
    pub fn iter(&self) -> Iter<'_> {
        match &self.0 {
            Repr::Joined(text) if text.is_empty() => Iter::Pairs([].iter()),
            Repr::Joined(text) => Iter::Joined(text.split('\n')),
            Repr::Pairs(pairs) => Iter::Pairs(pairs.iter()),
        }
    }

    /// The bytes of its text (names, values and, joined, their separators): what it holds.
    pub(crate) fn text_len(&self) -> usize {
        match &self.0 {
            Repr::Joined(text) => text.len(),
            Repr::Pairs(pairs) => pairs.iter().map(|(k, v)| k.len() + v.len()).sum(),
        }
    }
}

/// The pairs of a [`KeptHeaders`].
pub enum Iter<'a> {
    Joined(std::str::Split<'a, char>),
    Pairs(std::slice::Iter<'a, (String, String)>),
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Joined(parts) => Some((parts.next()?, parts.next()?)),
            Iter::Pairs(pairs) => pairs.next().map(|(k, v)| (k.as_str(), v.as_str())),
        }
    }
}

impl<'a> IntoIterator for &'a KeptHeaders {
    type Item = (&'a str, &'a str);
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl From<Vec<(String, String)>> for KeptHeaders {
    fn from(pairs: Vec<(String, String)>) -> KeptHeaders {
        KeptHeaders::of(|| pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }
}

impl Default for KeptHeaders {
    /// No headers.
    fn default() -> KeptHeaders {
        KeptHeaders(Repr::Joined(Arc::from("")))
    }
}

impl PartialEq for KeptHeaders {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for KeptHeaders {}

impl fmt::Debug for KeptHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for KeptHeaders {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for KeptHeaders {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<KeptHeaders, D::Error> {
        Vec::<(String, String)>::deserialize(d).map(KeptHeaders::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::fingerprint::SHARED_TEXT;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn round_trip(list: &[(&str, &str)]) {
        let kept = KeptHeaders::from(pairs(list));
        let back: Vec<(&str, &str)> = kept.iter().collect();
        assert_eq!(back, list, "{list:?}");
        // Written as the list of pairs records have always held, and read back the same.
        let json = serde_json::to_string(&kept).unwrap();
        assert_eq!(json, serde_json::to_string(&pairs(list)).unwrap());
        assert_eq!(serde_json::from_str::<KeptHeaders>(&json).unwrap(), kept);
        let text: usize = list.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!((text..=text + 2 * list.len()).contains(&kept.text_len()), "{list:?}");
    }

    #[test]
    fn every_list_of_pairs_reads_back_as_it_was_given() {
        round_trip(&[]);
        round_trip(&[("content-type", "application/json")]);
        round_trip(&[("x-request-id", ""), ("content-type", "text/event-stream")]);
        round_trip(&[("", "")]);
        round_trip(&[("a", ""), ("", "b"), ("", "")]);
        // Values that hold the separator are kept as pairs, never split.
        round_trip(&[("x-odd", "one\ntwo"), ("content-type", "a")]);
        round_trip(&[("odd\nname", "v")]);
        // Longer than the stack buffer.
        let long = "v".repeat(SHARED_TEXT * 2);
        round_trip(&[("request-id", long.as_str()), ("content-type", "application/json")]);
        let exact = "w".repeat(SHARED_TEXT - "k".len() - 1);
        round_trip(&[("k", exact.as_str())]);
    }

    #[test]
    fn lists_are_equal_exactly_when_their_pairs_are() {
        let a = KeptHeaders::from(pairs(&[("a", "b"), ("c", "d")]));
        assert_eq!(a, KeptHeaders::from(pairs(&[("a", "b"), ("c", "d")])));
        assert_ne!(a, KeptHeaders::from(pairs(&[("c", "d"), ("a", "b")])));
        assert_ne!(a, KeptHeaders::from(pairs(&[("a", "b\nc"), ("d", "")])));
        assert_ne!(a, KeptHeaders::from(pairs(&[("a", "b")])));
        assert_ne!(KeptHeaders::from(pairs(&[])), KeptHeaders::from(pairs(&[("", "")])));
    }
}
