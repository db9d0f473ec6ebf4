//! JSON read without parsing it whole, pure: a body's top-level members (each key and its
//! value's bytes, nested values skipped by counting brackets outside strings, strings skipped
//! with `memchr`), a key compared as serde decodes it, a string value decoded. What a request
//! names and its envelope ([`super::api`]) read bodies so: one
//! pass, no allocation but for a string with escapes, any depth without recursion.

use std::borrow::Cow;

/// The top-level members of the JSON object `body`, in order: each key as written between its
/// quotes and its value's bytes, found without parsing the values (strings are skipped with
/// `memchr`, the bytes between them counted for nesting). `None` when `body` is not one object
/// (a malformed value inside is left for the host to refuse).
pub(crate) fn members(body: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    let mut out = Vec::new();
    each_member(body, |key, value| out.push((key, value))).then_some(out)
}

/// Calls `visit` with each top-level member of the JSON object `body` as [`members`] finds them,
/// allocating nothing; `false` when `body` is not one object (the members before the fault
/// were visited).
pub(crate) fn each_member<'b>(body: &'b [u8], mut visit: impl FnMut(&'b [u8], &'b [u8])) -> bool {
    let mut i = ws(body, 0);
    if body.get(i) != Some(&b'{') {
        return false;
    }
    i = ws(body, i + 1);
    if body.get(i) == Some(&b'}') {
        return ws(body, i + 1) == body.len();
    }
    loop {
        if body.get(i) != Some(&b'"') {
            return false;
        }
        let Some(key_end) = string_end(body, i + 1) else {
            return false;
        };
        let key = &body[i + 1..key_end];
        i = ws(body, key_end + 1);
        if body.get(i) != Some(&b':') {
            return false;
        }
        let start = ws(body, i + 1);
        let Some(end) = value_end(body, start) else {
            return false;
        };
        visit(key, &body[start..end]);
        i = ws(body, end);
        match body.get(i) {
            Some(b',') => i = ws(body, i + 1),
            Some(b'}') => return ws(body, i + 1) == body.len(),
            _ => return false,
        }
    }
}

/// Whether a key as written between its quotes is `name` (escapes decoded as serde does:
/// `"mod\u0065l"` is `model`).
pub(crate) fn key_is(raw: &[u8], name: &str) -> bool {
    match memchr::memchr(b'\\', raw) {
        None => raw == name.as_bytes(),
        Some(_) => string(raw).is_some_and(|k| k == name),
    }
}

/// A string's contents as written between its quotes, decoded (borrowed when it has no escape);
/// `None` when they are not a valid JSON string.
pub(crate) fn string(raw: &[u8]) -> Option<Cow<'_, str>> {
    match memchr::memchr(b'\\', raw) {
        None => std::str::from_utf8(raw).ok().map(Cow::Borrowed),
        Some(_) => {
            let mut quoted = Vec::with_capacity(raw.len() + 2);
            quoted.push(b'"');
            quoted.extend_from_slice(raw);
            quoted.push(b'"');
            serde_json::from_slice::<String>(&quoted).ok().map(Cow::Owned)
        }
    }
}

/// A value's string, when the value (as [`members`] gives it) is a JSON string.
pub(crate) fn string_value(value: &[u8]) -> Option<Cow<'_, str>> {
    match value {
        [b'"', inner @ .., b'"'] => string(inner),
        _ => None,
    }
}

/// The first index from `i` that is not JSON whitespace.
pub(crate) fn ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// The index of the quote that closes the string whose contents start at `i`.
fn string_end(b: &[u8], mut i: usize) -> Option<usize> {
    loop {
        let at = i + memchr::memchr2(b'"', b'\\', b.get(i..)?)?;
        if b[at] == b'"' {
            return Some(at);
        }
        i = at + 2; // an escape, and the byte it escapes
    }
}

/// The index just past the value that starts at `i`.
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => string_end(b, i + 1).map(|e| e + 1),
        b'{' | b'[' => {
            let (mut depth, mut j) = (0usize, i);
            loop {
                match b.get(j)? {
                    b'"' => {
                        j = string_end(b, j + 1)? + 1;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        // A number or a literal.
        _ => {
            let rest = &b[i..];
            let len = rest
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(rest.len());
            (len > 0).then_some(i + len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn members_are_found_as_serde_reads_them() {
        for body in [
            r#"{}"#,
            r#" { "a" : 1 , "b":[1,{"c":"}]\"{"}], "d":{"e":null,"f":[true,false]},"g":"x\\\"y","h":-1.5e3 } "#,
            r#"{"model":"m","messages":[{"role":"user","content":"a \"quoted\" {brace}"}],"stream":true}"#,
            r#"{"k\"ey":"v","n":{"deep":{"deeper":[[[]]]}}}"#,
        ] {
            let got = members(body.as_bytes()).unwrap_or_else(|| panic!("{body}"));
            let want: serde_json::Map<String, serde_json::Value> = serde_json::from_str(body).expect("JSON");
            let read: serde_json::Map<String, serde_json::Value> = got
                .iter()
                .map(|(key, value)| {
                    let key: String = serde_json::from_slice(&[b"\"", *key, b"\""].concat()).expect("a key");
                    (key, serde_json::from_slice(value).expect("a value"))
                })
                .collect();
            assert_eq!((got.len(), read), (want.len(), want), "{body}");
        }
        for not_one in [
            "",
            "[]",
            "{",
            r#"{"a"}"#,
            r#"{"a":}"#,
            r#"{"a":1,}"#,
            r#"{"a":1} x"#,
            r#"{"a":"1}"#,
            r#"{"a":[1}"#,
        ] {
            assert_eq!(members(not_one.as_bytes()), None, "{not_one}");
        }
    }

    #[test]
    fn keys_and_strings_are_decoded_as_serde_decodes_them() {
        assert!(key_is(b"model", "model"));
        assert!(key_is(br"mod\u0065l", "model"));
        assert!(key_is(br"\u006d\u006f\u0064\u0065\u006c", "model"));
        assert!(!key_is(b"models", "model"));
        assert!(!key_is(br"model\", "model"));
        assert_eq!(string_value(br#""gpt-4o""#).as_deref(), Some("gpt-4o"));
        assert_eq!(string_value(br#""a\/b\u00e9""#).as_deref(), Some("a/b\u{e9}"));
        assert_eq!(string_value(b"42"), None);
        assert_eq!(string_value(b"null"), None);
        assert_eq!(string_value(br#""\x""#), None);
        assert_eq!(string_value(b"\"\xff\""), None);
    }

    #[test]
    fn a_deep_body_is_read_without_recursion() {
        let depth = 1_000_000;
        let mut body = String::from(r#"{"messages":"#);
        body.push_str(&"[".repeat(depth));
        body.push_str(&"]".repeat(depth));
        body.push_str(r#","model":"m"}"#);
        let got = members(body.as_bytes()).expect("one object");
        assert_eq!(got.len(), 2);
        assert_eq!(got[1], (&b"model"[..], &br#""m""#[..]));
    }

    /// `body`'s members as serde reads them: each key decoded, each value parsed (a repeated key:
    /// the last, as serde keeps it); `None` when a key or a value is not JSON.
    fn read(members: &[(&[u8], &[u8])]) -> Option<serde_json::Map<String, serde_json::Value>> {
        members
            .iter()
            .map(|(key, value)| Some((string(key)?.into_owned(), serde_json::from_slice(value).ok()?)))
            .collect()
    }

    /// A JSON text with each of `edits` applied: a byte put at a place (a space, a quote, a
    /// bracket, a comma, a backslash or any byte), or a byte taken out.
    fn edited(text: &[u8], edits: &[(usize, Option<u8>)]) -> Vec<u8> {
        let mut out = text.to_vec();
        for (at, byte) in edits {
            match byte {
                Some(b) if !out.is_empty() => out.insert(at % (out.len() + 1), *b),
                Some(b) => out.push(*b),
                None if !out.is_empty() => {
                    out.remove(at % out.len());
                }
                None => {}
            }
        }
        out
    }

    fn an_edit() -> impl Strategy<Value = (usize, Option<u8>)> {
        let byte = prop_oneof![proptest::sample::select(&b" \t\n\"\\{}[],:0e-"[..]), any::<u8>()];
        (any::<usize>(), proptest::option::of(byte))
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config(512))]

        /// Any JSON object, compact or pretty: the scan finds its members in order, each key and
        /// value what serde reads.
        #[test]
        fn the_scan_reads_each_object_as_serde_reads_it(
            members in proptest::collection::btree_map("[a-z\"\\\\\u{e9}]{0,6}", crate::testing::json_value(&["model"]), 0..8),
            pretty in any::<bool>(),
        ) {
            let doc = serde_json::Value::Object(members.into_iter().collect());
            let text = match pretty {
                true => serde_json::to_vec_pretty(&doc),
                false => serde_json::to_vec(&doc),
            }.expect("serialisable");
            let found = super::members(&text);
            prop_assert!(found.is_some(), "{}", String::from_utf8_lossy(&text));
            let found = found.unwrap_or_default();
            let keys: Vec<String> = found.iter().filter_map(|(k, _)| string(k).map(Cow::into_owned)).collect();
            let names: Vec<String> = doc.as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
            prop_assert_eq!(keys, names);
            // Compared with serde's reading of the text (a float may not read back as written).
            let want: serde_json::Value = serde_json::from_slice(&text).expect("JSON");
            prop_assert_eq!(read(&found).map(serde_json::Value::Object), Some(want));
        }

        /// Any bytes, and any JSON object with bytes put in or taken out: the scan never panics;
        /// whatever serde reads as one object, the scan reads too, with the same members.
        #[test]
        fn whatever_serde_reads_as_an_object_the_scan_reads_the_same(
            doc in crate::testing::json_value(&["model", "stream"]),
            edits in proptest::collection::vec(an_edit(), 0..4),
            noise in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let text = serde_json::to_vec(&doc).expect("serialisable");
            for body in [edited(&text, &edits), noise.clone()] {
                let found = super::members(&body);
                if let Ok(serde_json::Value::Object(want)) = serde_json::from_slice::<serde_json::Value>(&body) {
                    let found = found.as_deref().and_then(read);
                    prop_assert_eq!(found, Some(want), "{}", String::from_utf8_lossy(&body));
                }
                // The members are the body's own bytes, in order, never past its end.
                if let Some(found) = found {
                    let mut at = 0;
                    for (key, value) in found {
                        let key_at = key.as_ptr() as usize - body.as_ptr() as usize;
                        let value_at = value.as_ptr() as usize - body.as_ptr() as usize;
                        prop_assert!(at <= key_at && key_at + key.len() < value_at && value_at + value.len() <= body.len());
                        at = value_at + value.len();
                    }
                }
            }
        }
    }
}
