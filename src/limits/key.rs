//! Who a limit limits: a limit's `key` (`"route"`, `"credential"`, `"model"`, `"header:NAME"`,
//! joined with `+`, e.g. `"header:x-team+model"`) and the bucket a request falls in under it.
//!
//! Decides: what a key may say, its canonical spelling, and the [`BucketKey`], a 128-bit BLAKE3
//! hash of the limit's name and the request's values of the key's parts. Every value is hashed,
//! so no team name, model or credential reaches Redis, a log or a metric through a bucket, and
//! nothing here prints one (`Display` and `Debug` show names and hashes only). Does not decide
//! which model a request names (`wire::api`), which credential it carried (the request's
//! `credentials::Presented`, hashed), or what the bucket's limits are.

use std::fmt;

pub(crate) use crate::config::{KeySpec, Part};
use crate::credentials::CredentialHash;
use http::header::HeaderMap;

/// Domain separation: a bucket key never equals a hash made for another purpose.
const DOMAIN: &[u8] = b"rebound/limit-bucket/v1\0";

/// What a request brings to a key: its values of every part a key may name.
#[derive(Clone, Copy)]
pub(crate) struct KeyInput<'a> {
    /// The route's name.
    pub(crate) route: &'a str,
    /// The credential's hash (never the credential).
    pub(crate) credential: CredentialHash,
    /// The model the request names, if it names one.
    pub(crate) model: Option<&'a str>,
    /// The request's headers.
    pub(crate) headers: &'a HeaderMap,
}

impl fmt::Debug for KeyInput<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyInput(redacted)")
    }
}

/// The bucket a request falls in under one limit: 128 bits of BLAKE3 over the limit's name and
/// the request's values of the key's parts. Shown as 32 hex digits (the form Redis keys use); a
/// bucket of another limit, or of the same values under another key, is another bucket.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct BucketKey(pub(crate) [u8; 16]);

impl fmt::Display for BucketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for BucketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BucketKey({self})")
    }
}

/// The bucket of a request under the limit `limit` (its `[limits.NAME]`): each part's value
/// length-prefixed after the part's tag, so that no two different sets of values collide.
/// A header with several values is keyed by all of them in order; a missing one is `""`.
pub(crate) fn bucket(spec: &KeySpec, limit: &str, input: &KeyInput<'_>) -> BucketKey {
    // The bytes hashed, gathered first: one call of the one-shot hash costs less than a hasher's
    // state (the same bytes give the same key either way).
    let mut h: smallvec::SmallVec<[u8; 256]> = smallvec::SmallVec::new();
    h.extend_from_slice(DOMAIN);
    prefixed(&mut h, limit.as_bytes());
    for part in spec.parts() {
        match part {
            Part::Route => {
                h.extend_from_slice(b"r");
                prefixed(&mut h, input.route.as_bytes());
            }
            Part::Credential => {
                h.extend_from_slice(b"c");
                h.extend_from_slice(&input.credential.0);
            }
            Part::Model => {
                h.extend_from_slice(b"m");
                prefixed(&mut h, input.model.unwrap_or("").as_bytes());
            }
            Part::Header(name) => {
                h.extend_from_slice(b"h");
                prefixed(&mut h, name.as_str().as_bytes());
                let values = input.headers.get_all(name);
                let n = values.iter().count().max(1);
                h.extend_from_slice(&(n as u32).to_be_bytes());
                let mut any = false;
                for v in values {
                    prefixed(&mut h, v.as_bytes());
                    any = true;
                }
                if !any {
                    prefixed(&mut h, b"");
                }
            }
        }
    }
    let mut out = [0u8; 16];
    out.copy_from_slice(&blake3::hash(&h).as_bytes()[..16]);
    BucketKey(out)
}

/// The value a request has under `spec`, as `weights` name it: each part's value (a header's
/// first, `""` when absent; the route's name; the model), joined with `+`. `None` for a key with
/// a credential part: weights never name a credential.
pub(crate) fn value(spec: &KeySpec, input: &KeyInput<'_>) -> Option<String> {
    let mut out = String::new();
    for (i, part) in spec.parts().iter().enumerate() {
        if i > 0 {
            out.push('+');
        }
        match part {
            Part::Route => out.push_str(input.route),
            Part::Model => out.push_str(input.model.unwrap_or("")),
            Part::Header(name) => {
                let v = input.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
                out.push_str(v);
            }
            Part::Credential => return None,
        }
    }
    Some(out)
}

fn prefixed(h: &mut smallvec::SmallVec<[u8; 256]>, bytes: &[u8]) {
    h.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    h.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderName;

    fn input<'a>(headers: &'a HeaderMap, model: Option<&'a str>) -> KeyInput<'a> {
        KeyInput {
            route: "chat",
            credential: CredentialHash([7; 16]),
            model,
            headers,
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn keys_parse_into_a_canonical_order_and_print_it() {
        let k = KeySpec::parse("header:X-Team+model").unwrap();
        assert_eq!(k.to_string(), "model+header:x-team");
        assert_eq!(k, " model + header:x-team ".parse().unwrap());
        assert!(k.names_header(&HeaderName::from_static("x-team")));
        assert!(!k.names_header(&HeaderName::from_static("x-tenant")));
        assert!(k.uses_model() && !k.uses_credential());
        let all = KeySpec::parse("header:b+credential+header:a+route+model").unwrap();
        assert_eq!(all.to_string(), "route+credential+model+header:a+header:b");
        assert_eq!(all.parts().len(), 5);
    }

    #[test]
    fn a_bad_key_says_what_was_expected() {
        for (text, says) in [
            ("", "an empty part"),
            ("model+", "an empty part"),
            ("team", "unknown part \"team\": expected \"route\""),
            ("model+model", "\"model\" twice"),
            ("header:", "does not name a valid header"),
            ("header:x team", "does not name a valid header"),
            ("header:Authorization", "credential header: key by \"credential\""),
        ] {
            let err = KeySpec::parse(text).unwrap_err();
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }

    #[test]
    fn each_value_of_each_part_has_its_own_bucket() {
        let k = KeySpec::parse("header:x-team+model").unwrap();
        let (chat, batch, none) = (
            headers(&[("x-team", "chat")]),
            headers(&[("x-team", "batch")]),
            HeaderMap::new(),
        );
        let a = bucket(&k, "team", &input(&chat, Some("gpt-4o")));
        assert_eq!(a, bucket(&k, "team", &input(&chat, Some("gpt-4o"))));
        assert_ne!(a, bucket(&k, "team", &input(&batch, Some("gpt-4o"))));
        assert_ne!(a, bucket(&k, "team", &input(&chat, Some("gpt-4o-mini"))));
        assert_ne!(a, bucket(&k, "other", &input(&chat, Some("gpt-4o"))));
        // A missing header and no model are the scope "".
        let empty = headers(&[("x-team", "")]);
        assert_eq!(
            bucket(&k, "team", &input(&none, None)),
            bucket(&k, "team", &input(&empty, Some("")))
        );
        // Parts the key does not name do not matter.
        let mut other = input(&chat, Some("gpt-4o"));
        other.route = "batch";
        other.credential = CredentialHash([8; 16]);
        assert_eq!(a, bucket(&k, "team", &other));
    }

    #[test]
    fn values_cannot_be_shifted_between_parts_or_headers() {
        let k = KeySpec::parse("header:a+header:b").unwrap();
        let one = headers(&[("a", "xy"), ("b", "z")]);
        let two = headers(&[("a", "x"), ("b", "yz")]);
        assert_ne!(bucket(&k, "l", &input(&one, None)), bucket(&k, "l", &input(&two, None)));
        // Two values of one header are not one value.
        let k = KeySpec::parse("header:a").unwrap();
        let split = headers(&[("a", "x"), ("a", "y")]);
        let whole = headers(&[("a", "xy")]);
        assert_ne!(
            bucket(&k, "l", &input(&split, None)),
            bucket(&k, "l", &input(&whole, None))
        );
        // The same value under another part is another bucket.
        let route = KeySpec::parse("route").unwrap();
        let model = KeySpec::parse("model").unwrap();
        let h = HeaderMap::new();
        assert_ne!(
            bucket(&route, "l", &input(&h, Some("chat"))),
            bucket(&model, "l", &input(&h, Some("chat")))
        );
    }

    #[test]
    fn the_credential_part_keys_by_its_hash() {
        let k = KeySpec::parse("credential").unwrap();
        let h = HeaderMap::new();
        let a = input(&h, None);
        let mut b = a;
        b.credential = CredentialHash([9; 16]);
        assert_ne!(bucket(&k, "l", &a), bucket(&k, "l", &b));
        assert!(k.uses_credential());
    }

    #[test]
    fn nothing_prints_a_value() {
        let k = KeySpec::parse("header:x-team").unwrap();
        let h = headers(&[("x-team", "secret-team")]);
        let i = input(&h, Some("secret-model"));
        let bucket = bucket(&k, "team", &i);
        for shown in [
            format!("{bucket}"),
            format!("{bucket:?}"),
            format!("{i:?}"),
            format!("{k:?}"),
        ] {
            assert!(!shown.contains("secret"), "{shown}");
        }
        assert_eq!(bucket.to_string().len(), 32);
    }
}
