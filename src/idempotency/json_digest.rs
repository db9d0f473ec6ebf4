//! The form of a JSON document for the request fingerprint (version 2): equal for two bodies
//! that are the same document (key order, whitespace, escapes and duplicate keys do not matter,
//! as with `serde_json::Value`), in one pass over the body, with nothing allocated per value.
//!
//! The document is written, as it is parsed, into one buffer in a typed, length-prefixed form
//! (below); an object's members are put in order when it closes. Any value whose form is longer
//! than [`INLINE`] bytes is replaced by `h` and the BLAKE3 hash of its form, so each byte of the
//! body is hashed once. A long array is hashed in batches as it is parsed, so the buffer holds
//! about one batch of it; a long string is hashed straight from the body.
//!
//! The form of a value: `n`, `t`, `f`; `d` and the number as `serde_json` writes it; `s` and the
//! string (unescaped); `[` the items `]`; `{` each member (key, then value) in the order of their
//! keys' forms, the last of duplicate keys kept `}`. Numbers and strings carry their length
//! (LEB128) first, so no two documents share a form.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The longest form a value keeps inline; longer ones are replaced by their hash.
const INLINE: usize = 1024;

/// How much of a long array's form is hashed at a time.
const BATCH: usize = 64 * 1024;

/// The form of `body` as a JSON document (inline, or `h` and its hash when longer than
/// [`INLINE`], like any value's), or `None` when it is not one.
pub(super) fn form(body: &[u8]) -> Option<Vec<u8>> {
    // The form is about as long as the body, or a few KiB once long values are hashed.
    let mut w = Writer {
        out: Vec::with_capacity(body.len().min(4 * INLINE) + 64),
        members: Vec::new(),
        scratch: Vec::new(),
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    Value(&mut w).deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(w.out)
}

/// A member of an object still open: where its key's form and its value's form lie in the buffer.
struct Member {
    start: usize,
    key_end: usize,
    end: usize,
}

#[derive(Default)]
struct Writer {
    out: Vec<u8>,
    /// The members of every object still open, innermost last.
    members: Vec<Member>,
    /// Where an object's members are put in order.
    scratch: Vec<u8>,
}

impl Writer {
    /// A string or number: `tag`, its length, its bytes; hashed when that is too long.
    fn len_prefixed(&mut self, tag: u8, bytes: &[u8]) {
        let (head, n) = head(tag, bytes.len());
        let head = &head[..n];
        if head.len() + bytes.len() > INLINE {
            let mut h = blake3::Hasher::new();
            h.update(head);
            h.update(bytes);
            self.hashed(self.out.len(), &h);
        } else {
            self.out.extend_from_slice(head);
            self.out.extend_from_slice(bytes);
        }
    }

    fn number(&mut self, n: &serde_json::Number) {
        // The longest number `serde_json` writes is 24 bytes (an f64 in full): on the stack.
        let mut text = std::io::Cursor::new([0u8; 32]);
        match serde_json::to_writer(&mut text, n) {
            Ok(()) => {
                let len = usize::try_from(text.position()).unwrap_or(0);
                self.len_prefixed(b'd', &text.get_ref()[..len]);
            }
            // Not expected; never a number left out of the form.
            Err(_) => self.len_prefixed(b'd', n.to_string().as_bytes()),
        }
    }

    /// Closes the value that began at `start`: replaced by its hash when it is too long.
    fn seal(&mut self, start: usize) {
        if self.out.len() - start > INLINE {
            let mut h = blake3::Hasher::new();
            h.update(&self.out[start..]);
            self.hashed(start, &h);
        }
    }

    fn hashed(&mut self, start: usize, h: &blake3::Hasher) {
        self.out.truncate(start);
        self.out.push(b'h');
        self.out.extend_from_slice(h.finalize().as_bytes());
    }

    /// Closes the object that began at `start` (its `{` written) with its members from `first`:
    /// in the order of their keys, the last of equal keys kept, then `}`.
    fn close_object(&mut self, start: usize, first: usize) {
        let out = &self.out;
        let members = &mut self.members[first..];
        let key = |m: &Member| &out[m.start..m.key_end];
        let ordered = members.windows(2).all(|w| key(&w[0]) < key(&w[1]));
        if !ordered {
            // Stable: of equal keys, the last stays last.
            members.sort_by(|a, b| key(a).cmp(key(b)));
            self.scratch.clear();
            for (i, m) in members.iter().enumerate() {
                let later_twin = members.get(i + 1).is_some_and(|n| key(n) == key(m));
                if !later_twin {
                    self.scratch.extend_from_slice(&out[m.start..m.end]);
                }
            }
            self.out.truncate(start + 1);
            self.out.extend_from_slice(&self.scratch);
        }
        self.members.truncate(first);
        self.out.push(b'}');
        self.seal(start);
    }
}

/// `tag` and `len` in LEB128: the head of a string or number, and how many of its bytes are used.
fn head(tag: u8, mut len: usize) -> ([u8; 11], usize) {
    let mut head = [0u8; 11];
    head[0] = tag;
    let mut i = 1;
    loop {
        let byte = (len & 0x7f) as u8;
        len >>= 7;
        if len == 0 {
            head[i] = byte;
            return (head, i + 1);
        }
        head[i] = byte | 0x80;
        i += 1;
    }
}

/// A value, written into the writer as it is parsed.
struct Value<'w>(&'w mut Writer);

impl<'de> DeserializeSeed<'de> for Value<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Value<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.0.out.push(if v { b't' } else { b'f' });
        Ok(())
    }
    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.0.number(&v.into());
        Ok(())
    }
    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.0.number(&v.into());
        Ok(())
    }
    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        match serde_json::Number::from_f64(v) {
            Some(n) => self.0.number(&n),
            None => self.0.out.push(b'n'),
        }
        Ok(())
    }
    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.0.len_prefixed(b's', v.as_bytes());
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        self.0.out.push(b'n');
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let w = self.0;
        let start = w.out.len();
        w.out.push(b'[');
        // A long form is hashed in batches as its items close (the same hash as over the whole
        // form): the buffer holds about one batch of it. Batches, not items: BLAKE3 hashes a
        // long input several chunks at a time.
        let mut hashing: Option<Box<blake3::Hasher>> = None;
        while seq.next_element_seed(Value(w))?.is_some() {
            if w.out.len() - start >= BATCH {
                hashing
                    .get_or_insert_with(|| Box::new(blake3::Hasher::new()))
                    .update(&w.out[start..]);
                w.out.truncate(start);
            }
        }
        w.out.push(b']');
        match hashing {
            Some(mut h) => {
                h.update(&w.out[start..]);
                w.hashed(start, &h);
            }
            None => w.seal(start),
        }
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let w = self.0;
        let start = w.out.len();
        w.out.push(b'{');
        let first = w.members.len();
        loop {
            let member = w.out.len();
            if map.next_key_seed(Key(w))?.is_none() {
                break;
            }
            let key_end = w.out.len();
            map.next_value_seed(Value(w))?;
            w.members.push(Member {
                start: member,
                key_end,
                end: w.out.len(),
            });
        }
        w.close_object(start, first);
        Ok(())
    }
}

/// An object's key: written as a string, never replaced by its hash (the order is by keys).
struct Key<'w>(&'w mut Writer);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        let (head, n) = head(b's', v.len());
        self.0.out.extend_from_slice(&head[..n]);
        self.0.out.extend_from_slice(v.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn digest(body: &[u8]) -> Option<[u8; 32]> {
        form(body).map(|f| *blake3::hash(&f).as_bytes())
    }

    fn same(a: &str, b: &str) -> bool {
        digest(a.as_bytes()).unwrap() == digest(b.as_bytes()).unwrap()
    }

    #[test]
    fn the_same_document_has_the_same_digest() {
        assert!(same(
            r#"{"a":1,"b":[true,null,"x"]}"#,
            r#" { "b" : [ true , null , "\u0078" ] , "a" : 1 } "#
        ));
        assert!(
            same(r#"{"a":1,"a":2}"#, r#"{"a":2}"#),
            "the last of duplicate keys is kept"
        );
        assert!(same(r#"{"b":0,"a":1,"b":2,"a":3}"#, r#"{"a":3,"b":2}"#));
        assert!(same(r#""\ud83d\ude00\n""#, "\"\u{1f600}\\u000a\""));
        let long = "y".repeat(5000);
        assert!(same(
            &format!(r#"{{"a":"{long}","b":1}}"#),
            &format!(r#"{{"b":1,"a":"{long}"}}"#)
        ));
    }

    #[test]
    fn other_documents_have_other_digests() {
        let pairs = [
            (r#"{"a":1}"#, r#"{"a":"1"}"#),
            (r#"{"a":1}"#, r#"{"a":1.0}"#),
            (r#"["ab","c"]"#, r#"["a","bc"]"#),
            (r#"[[],[]]"#, r#"[[[]]]"#),
            (r#"{"a":{}}"#, r#"{"a":[]}"#),
            (r#"{"ab":"c"}"#, r#"{"a":"bc"}"#),
            (r#"null"#, r#""""#),
            (r#"{"a":1,"a":2}"#, r#"{"a":1}"#),
            (r#"[1,2]"#, r#"[2,1]"#),
        ];
        for (a, b) in pairs {
            assert!(!same(a, b), "{a} vs {b}");
        }
        // A value long enough to be hashed is not its hash's bytes written inline.
        let long = "z".repeat(2000);
        assert!(!same(&format!(r#"["{long}"]"#), &format!(r#"["{long}x"]"#)));
    }

    /// The form as documented, computed independently (a Python implementation of the module
    /// comment over the `blake3` package): a long array hashed item by item, a long string
    /// hashed whole, members put in order, a duplicate key.
    #[test]
    fn the_digest_is_the_documented_forms() {
        let messages: Vec<String> = (0..100)
            .map(|i| format!(r#"{{"n":{i},"content":"line {i}: \"q\"\n","role":"user"}}"#))
            .collect();
        let body = format!(
            r#"{{"z":null,"model":"x","messages":[{}],"long":"{}","a":[true,false],"model":"m"}}"#,
            messages.join(","),
            r"\u00e9".repeat(700)
        );
        let hex = super::super::fingerprint::hex(&digest(body.as_bytes()).unwrap());
        assert_eq!(hex, "1b2182d69dc571e016985e37ad32209d61d5b828a315a99c65e713e440fea336");
    }

    #[test]
    fn what_is_not_one_document_has_no_digest() {
        for body in [
            r#"{"a":1} trailing"#,
            r#"{"a":}"#,
            "not json",
            "",
            "[1,2",
            &"[".repeat(200),
        ] {
            assert!(digest(body.as_bytes()).is_none(), "{body}");
        }
    }

    #[test]
    fn a_large_body_is_hashed_once_and_held_in_a_bounded_buffer() {
        let item = r#"{"role":"user","content":"Say \"hi\".\nThen stop."}"#;
        let body = format!(r#"{{"model":"m","messages":[{}]}}"#, vec![item; 20_000].join(","));
        let mut w = Writer::default();
        let mut de = serde_json::Deserializer::from_slice(body.as_bytes());
        Value(&mut w).deserialize(&mut de).unwrap();
        assert!(
            w.out.len() <= INLINE + 40,
            "the root ends inline or hashed: {}",
            w.out.len()
        );
        assert!(w.members.is_empty());
        assert!(w.out.capacity() <= 2 * BATCH, "a batch at a time: {}", w.out.capacity());
    }

    fn json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(|n| serde_json::json!(n)),
            // serde_json's float parser may read a float's text back one bit off: only floats
            // that survive being written and read again, so that each document has one text.
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_filter("round trip", |f| serde_json::from_str::<f64>(
                    &serde_json::to_string(f).unwrap()
                )
                .ok()
                    == Some(*f))
                .prop_map(|f| serde_json::json!(f)),
            ".{0,12}".prop_map(serde_json::Value::String),
            (0usize..1400).prop_map(|n| serde_json::Value::String("q".repeat(n))),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
                proptest::collection::vec(("[a-c]{0,2}", inner), 0..6)
                    .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// `doc` written with its object members in reverse order and, on some runs, pretty.
    fn rewritten(doc: &serde_json::Value, pretty: bool) -> String {
        fn reversed(v: &serde_json::Value) -> String {
            match v {
                serde_json::Value::Object(m) => {
                    let members: Vec<String> = m
                        .iter()
                        .rev()
                        .map(|(k, v)| format!("{}:{}", serde_json::to_string(k).unwrap(), reversed(v)))
                        .collect();
                    format!("{{{}}}", members.join(","))
                }
                serde_json::Value::Array(items) => {
                    format!("[{}]", items.iter().map(reversed).collect::<Vec<_>>().join(","))
                }
                other => serde_json::to_string(other).unwrap(),
            }
        }
        let text = reversed(doc);
        if pretty {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            serde_json::to_string_pretty(&v).unwrap()
        } else {
            text
        }
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config(512))]

        /// Two bodies have the same digest exactly when they are the same `Value`.
        #[test]
        fn digests_are_equal_exactly_when_values_are(a in json(), b in json(), pretty in any::<bool>()) {
            let (ta, tb) = (serde_json::to_string(&a).unwrap(), rewritten(&b, pretty));
            let (va, vb): (serde_json::Value, serde_json::Value) =
                (serde_json::from_str(&ta).unwrap(), serde_json::from_str(&tb).unwrap());
            prop_assert_eq!(digest(ta.as_bytes()) == digest(tb.as_bytes()), va == vb);
            // The same document written plainly, in its keys' order (parsed again: a float's
            // text may not read back as the same float).
            prop_assert_eq!(digest(serde_json::to_string(&vb).unwrap().as_bytes()), digest(tb.as_bytes()));
        }
    }
}
