//! Canonical JSON: exactly the bytes `serde_json::to_writer(&serde_json::Value)` writes (object
//! keys sorted, insignificant whitespace gone, the last of duplicate keys kept), without building
//! a `Value`: strings and keys without an escape are borrowed from the body instead of copied
//! into their own allocations, which is most of a large prompt's cost. The bytes must not change:
//! stored records hold fingerprints made from them (`idempotency_store` and the property test
//! below pin them to `Value`'s).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::io::Write;

/// A JSON document, its strings borrowed where they can be.
pub(super) enum Canon<'a> {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    Str(Cow<'a, str>),
    Array(Vec<Canon<'a>>),
    Object(BTreeMap<Cow<'a, str>, Canon<'a>>),
}

/// `body` parsed for its canonical form, or `None` when it is not JSON.
pub(super) fn parse(body: &[u8]) -> Option<Canon<'_>> {
    serde_json::from_slice::<Canon<'_>>(body).ok()
}

/// The length of `doc`'s canonical form (what [`emit`] writes).
pub(super) fn len(doc: &Canon<'_>) -> usize {
    let mut counted = Counted(0);
    // Counting cannot fail.
    let _ = emit(doc, &mut counted);
    counted.0
}

/// Writes `doc` in canonical form: what `serde_json`'s compact writer writes for the same
/// document as a `Value`. A string that had no escape in the body is written as it came (it holds
/// no `"`, `\` or control character: JSON would have escaped them), one that had is escaped as
/// `serde_json` escapes it.
pub(super) fn emit(doc: &Canon<'_>, w: &mut impl Write) -> std::io::Result<()> {
    match doc {
        Canon::Null => w.write_all(b"null"),
        Canon::Bool(true) => w.write_all(b"true"),
        Canon::Bool(false) => w.write_all(b"false"),
        Canon::Number(n) => serde_json::to_writer(w, n).map_err(std::io::Error::other),
        Canon::Str(s) => string(s, w),
        Canon::Array(items) => {
            w.write_all(b"[")?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    w.write_all(b",")?;
                }
                emit(item, w)?;
            }
            w.write_all(b"]")
        }
        Canon::Object(map) => {
            w.write_all(b"{")?;
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    w.write_all(b",")?;
                }
                string(k, w)?;
                w.write_all(b":")?;
                emit(v, w)?;
            }
            w.write_all(b"}")
        }
    }
}

/// A string: borrowed from the body (it had no escape: written as it came), or decoded from
/// escapes (written escaped as `serde_json` escapes it).
#[allow(clippy::ptr_arg)] // the variant is the point: borrowed means it had no escape
fn string(s: &Cow<'_, str>, w: &mut impl Write) -> std::io::Result<()> {
    match s {
        Cow::Borrowed(raw) => {
            w.write_all(b"\"")?;
            w.write_all(raw.as_bytes())?;
            w.write_all(b"\"")
        }
        Cow::Owned(decoded) => serde_json::to_writer(w, decoded).map_err(std::io::Error::other),
    }
}

/// A writer that only counts.
struct Counted(usize);

impl Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A key, borrowed when it has no escape.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_string())))
            }
            fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

impl<'de> Deserialize<'de> for Canon<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CanonVisitor)
    }
}

/// What `serde_json::Value`'s visitor does, value for value.
struct CanonVisitor;

impl<'de> Visitor<'de> for CanonVisitor {
    type Value = Canon<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Canon<'de>, E> {
        Ok(Canon::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Canon<'de>, E> {
        Ok(Canon::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Canon<'de>, E> {
        Ok(Canon::Number(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Canon<'de>, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Canon::Null, Canon::Number))
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Canon<'de>, E> {
        Ok(Canon::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Canon<'de>, E> {
        Ok(Canon::Str(Cow::Owned(v.to_string())))
    }
    fn visit_string<E>(self, v: String) -> Result<Canon<'de>, E> {
        Ok(Canon::Str(Cow::Owned(v)))
    }
    fn visit_none<E>(self) -> Result<Canon<'de>, E> {
        Ok(Canon::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Canon<'de>, D::Error> {
        Deserialize::deserialize(d)
    }
    fn visit_unit<E>(self) -> Result<Canon<'de>, E> {
        Ok(Canon::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Canon<'de>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Canon::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Canon<'de>, A::Error> {
        let mut out = BTreeMap::new();
        while let Some((Key(k), v)) = map.next_entry::<Key<'de>, Canon<'de>>()? {
            out.insert(k, v);
        }
        Ok(Canon::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What the fingerprint used before: `Value`, written out.
    fn by_value(body: &[u8]) -> Option<Vec<u8>> {
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        serde_json::to_vec(&v).ok()
    }

    fn by_canon(body: &[u8]) -> Option<Vec<u8>> {
        let doc = parse(body)?;
        let mut out = Vec::new();
        emit(&doc, &mut out).unwrap();
        assert_eq!(len(&doc), out.len());
        Some(out)
    }

    #[test]
    fn the_bytes_are_values_for_the_awkward_cases() {
        for body in [
            r#"{"b":1,"a":[1,2.50,-0,1e3,1E-7,18446744073709551615,-9223372036854775808],"a":"last"}"#,
            r#"{"s":"\u0041\n\t\"\\\/\u00e9\ud83d\ude00","\u0062":null,"c":{"z":true,"y":false}}"#,
            r#"  [ ]  "#,
            r#""just a string""#,
            r#"{"":{"":[{}]}}"#,
            r#"123456789012345678901234567890"#,
            "{\"ctl\":\"\\u0001\\u001f\",\"k\u{e9}\":1}",
            r#"{"a":1} trailing"#,
            r#"{"a":}"#,
            "not json",
            "",
        ] {
            assert_eq!(by_canon(body.as_bytes()), by_value(body.as_bytes()), "{body}");
        }
    }

    fn json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(|n| serde_json::json!(n)),
            any::<u64>().prop_map(|n| serde_json::json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| serde_json::json!(f)),
            ".{0,12}".prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
                proptest::collection::vec((".{0,6}", inner), 0..6)
                    .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config(512))]

        /// Any document, written with its keys in any order and escaped or not: the same bytes
        /// as `Value`'s.
        #[test]
        fn canonical_bytes_are_values_bytes(doc in json(), pretty in any::<bool>(), ascii in any::<bool>()) {
            let text = if pretty { serde_json::to_string_pretty(&doc).unwrap() } else { serde_json::to_string(&doc).unwrap() };
            // Escape every non-ASCII character as \uXXXX on some runs (owned, unescaped strings).
            let text = if ascii {
                text.chars().map(|c| if c.is_ascii() { c.to_string() } else {
                    let mut buf = [0u16; 2];
                    c.encode_utf16(&mut buf).iter().map(|u| format!("\\u{u:04x}")).collect()
                }).collect::<String>()
            } else { text };
            prop_assert_eq!(by_canon(text.as_bytes()), by_value(text.as_bytes()));
        }
    }
}
