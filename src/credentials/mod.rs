//! Credentials: every form in which a request carries one, defined once, and what may be done with
//! them. A credential is never logged, never kept in the clear (dead letters, job records), and
//! only ever hashed where it scopes something (idempotency records, cache entries, cooldowns,
//! pacing, exhaustion, job access).
//!
//! The forms are the headers of [`HEADERS`] (plus `[server] credential_headers`) and the query
//! parameters of [`QUERY_PARAMS`] (Gemini's `?key=`). [`Credentials`] is the list in force for a
//! configuration; [`Presented`] is what one request carried, hashed into a [`CredentialHash`]
//! only when something is keyed by it.

mod memo;

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Digest, Sha256};
use smallvec::SmallVec;

/// The credential headers rebound knows, in the order their values are hashed.
pub const HEADERS: [HeaderName; 7] = [
    http::header::AUTHORIZATION,
    http::header::PROXY_AUTHORIZATION,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("api-key"),
    HeaderName::from_static("x-goog-api-key"),
    HeaderName::from_static("x-amz-security-token"),
    http::header::COOKIE,
];

/// The query parameters that carry a credential (compared ignoring ASCII case).
pub const QUERY_PARAMS: [&str; 4] = ["key", "api_key", "api-key", "access_token"];

/// The headers a tenant scope hashed before the list grew, whether a request carried them or not:
/// a request that carries no other form keeps the scope it had, so its records are still found.
/// Any other form counts only when a request carries it.
pub(crate) const CLASSIC_SCOPE: [HeaderName; 3] = [
    http::header::AUTHORIZATION,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("api-key"),
];

/// Response headers whose values are secrets too (never logged or kept).
const RESPONSE_SECRETS: [HeaderName; 1] = [http::header::SET_COOKIE];

/// The credential forms in force: [`HEADERS`], then `[server] credential_headers`, then the query
/// parameters of [`QUERY_PARAMS`]. Cheap to clone.
#[derive(Clone)]
pub struct Credentials {
    headers: Arc<[HeaderName]>,
    /// The credentials' and models' hashes already computed (not part of what the list is).
    memo: Arc<memo::Memo>,
}

impl PartialEq for Credentials {
    fn eq(&self, other: &Credentials) -> bool {
        self.headers == other.headers
    }
}

impl Eq for Credentials {}

impl Default for Credentials {
    fn default() -> Credentials {
        Credentials::with(&[])
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.headers.iter()).finish()
    }
}

impl Credentials {
    /// The built-in forms and `extra` header names (duplicates of the built-in ones dropped).
    pub fn with(extra: &[HeaderName]) -> Credentials {
        let mut headers: Vec<HeaderName> = HEADERS.to_vec();
        for name in extra {
            if !headers.contains(name) {
                headers.push(name.clone());
            }
        }
        Credentials {
            headers: headers.into(),
            memo: Arc::default(),
        }
    }

    /// Every credential header name in force, built-in first.
    pub fn headers(&self) -> &[HeaderName] {
        &self.headers
    }

    /// Every header whose value is a secret: the credential headers and `set-cookie`.
    pub(crate) fn secrets(&self) -> impl Iterator<Item = &HeaderName> {
        self.headers.iter().chain(&RESPONSE_SECRETS)
    }

    /// Removes every credential header from `headers`.
    pub(crate) fn remove_from(&self, headers: &mut HeaderMap) {
        for name in self.headers.iter() {
            headers.remove(name);
        }
    }

    /// What a request carries: the values of its credential headers (one pass over the map) and
    /// of its credential query parameters. The values are shared, not copied.
    pub(crate) fn presented(&self, headers: &HeaderMap, query: Option<&str>) -> Presented {
        let mut values: SmallVec<[(u8, HeaderValue); 2]> = SmallVec::new();
        for (key, value) in headers {
            if let Some(i) = self.headers.iter().position(|n| n == key) {
                values.push((i as u8, value.clone()));
            }
        }
        let base = self.headers.len();
        for (i, value) in query_credentials(query.unwrap_or("")) {
            if let Ok(v) = HeaderValue::from_str(value) {
                values.push(((base + i) as u8, v));
            }
        }
        // Stable: each form's values stay in the order they came.
        values.sort_by_key(|(i, _)| *i);
        Presented {
            values,
            hashed: std::cell::OnceCell::new(),
        }
    }

    /// The name a form is hashed under: a header's name, `?param` for a query parameter (a
    /// header name cannot hold `?`, so the two never collide).
    fn form_name(&self, index: usize) -> Cow<'_, str> {
        match self.headers.get(index) {
            Some(h) => Cow::Borrowed(h.as_str()),
            None => Cow::Owned(format!(
                "?{}",
                QUERY_PARAMS.get(index - self.headers.len()).unwrap_or(&"")
            )),
        }
    }
}

/// The credential a request carried: its credential header and query parameter values, in the
/// order of the forms in force. Shows no value when printed.
#[derive(Clone, Default)]
pub(crate) struct Presented {
    values: SmallVec<[(u8, HeaderValue); 2]>,
    /// The hash, once asked for (a request asks for it once per hold it is checked against).
    hashed: std::cell::OnceCell<CredentialHash>,
}

impl fmt::Debug for Presented {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Presented({} values, redacted)", self.values.len())
    }
}

/// Domain separation: a hash made here never equals one made for another purpose.
const DOMAIN: &[u8] = b"rebound/cooldown-credential/v1\0";

impl Presented {
    /// The credential's hash: each form present, in the order of `forms`, with its values
    /// (length-prefixed). A request that carries none of the forms hashes as every other such
    /// request; one that carries only forms known before the list grew hashes as it did then.
    /// Computed once; `forms` must be the forms the credential was presented under.
    pub(crate) fn hash(&self, forms: &Credentials) -> CredentialHash {
        *self.hashed.get_or_init(|| {
            // The SHA-256 of a credential seen before, from the forms' memo.
            let values = &self.values[..];
            CredentialHash(forms.memo.name((b'c', values), || self.hash_with(forms).0))
        })
    }

    fn hash_with(&self, forms: &Credentials) -> CredentialHash {
        let mut h = Sha256::new();
        h.update(DOMAIN);
        let mut rest = &self.values[..];
        while let Some((index, _)) = rest.first() {
            let n = rest.iter().take_while(|(i, _)| i == index).count();
            let name = forms.form_name(usize::from(*index));
            h.update((name.len() as u32).to_be_bytes());
            h.update(name.as_bytes());
            h.update((n as u32).to_be_bytes());
            for (_, v) in &rest[..n] {
                h.update((v.as_bytes().len() as u32).to_be_bytes());
                h.update(v.as_bytes());
            }
            rest = &rest[n..];
        }
        CredentialHash(first_128_bits(h))
    }
}

/// The first 128 bits of a SHA-256: enough for a name no one can guess a key from.
fn first_128_bits(h: Sha256) -> [u8; 16] {
    let digest = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&digest[..16]);
    out
}

/// A stable, non-reversible name for a credential (128 bits of SHA-256), shown as 32 hex digits.
/// Stable across processes and versions (replicas exchange it through Redis); API keys carry far
/// more entropy than 128 bits, so it cannot be reversed by guessing.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CredentialHash(pub [u8; 16]);

impl fmt::Display for CredentialHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for CredentialHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CredentialHash({self})")
    }
}

impl FromStr for CredentialHash {
    type Err = ();

    fn from_str(s: &str) -> Result<CredentialHash, ()> {
        let bytes = s.as_bytes();
        if bytes.len() != 32 {
            return Err(());
        }
        let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8).ok_or(());
        let mut out = [0u8; 16];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Ok(CredentialHash(out))
    }
}

/// Domain separation of a model's hash in a [`LimitKey`].
const MODEL_DOMAIN: &[u8] = b"rebound/limit-model/v1\0";

/// What a rate-limit hold (a cooldown, pacing, a used-up quota) is kept under: a credential, and
/// the model its limit is for (`None`: the whole credential, and every request that names no
/// model). Shown as `CREDENTIAL` or `CREDENTIAL/MODEL` (32 hex digits each), the form replicas
/// exchange through Redis: a replica that keeps limits per credential only does not parse the
/// second and ignores it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LimitKey {
    pub credential: CredentialHash,
    pub model: Option<[u8; 16]>,
}

impl LimitKey {
    /// `credential`'s limits on `model` (the whole credential's when `model` is empty).
    pub fn new(credential: CredentialHash, model: &str) -> LimitKey {
        if model.is_empty() {
            return LimitKey::from(credential);
        }
        let mut h = Sha256::new();
        h.update(MODEL_DOMAIN);
        h.update(model.as_bytes());
        LimitKey {
            credential,
            model: Some(first_128_bits(h)),
        }
    }
}

impl Credentials {
    /// [`LimitKey::new`], the model's hash from the memo when it was computed before.
    pub(crate) fn limit_key(&self, credential: CredentialHash, model: &str) -> LimitKey {
        if model.is_empty() {
            return LimitKey::from(credential);
        }
        let model = self.memo.name((b'm', model), || {
            let mut h = Sha256::new();
            h.update(MODEL_DOMAIN);
            h.update(model.as_bytes());
            first_128_bits(h)
        });
        LimitKey {
            credential,
            model: Some(model),
        }
    }
}

impl From<CredentialHash> for LimitKey {
    fn from(credential: CredentialHash) -> LimitKey {
        LimitKey {
            credential,
            model: None,
        }
    }
}

impl fmt::Display for LimitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.model {
            None => write!(f, "{}", self.credential),
            Some(m) => write!(f, "{}/{}", self.credential, CredentialHash(m)),
        }
    }
}

impl fmt::Debug for LimitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LimitKey({self})")
    }
}

impl FromStr for LimitKey {
    type Err = ();

    fn from_str(s: &str) -> Result<LimitKey, ()> {
        match s.split_once('/') {
            None => Ok(LimitKey::from(s.parse::<CredentialHash>()?)),
            Some((c, m)) => Ok(LimitKey {
                credential: c.parse()?,
                model: Some(m.parse::<CredentialHash>()?.0),
            }),
        }
    }
}

/// Whether a query parameter carries a credential.
pub(crate) fn is_query_param(name: &str) -> bool {
    QUERY_PARAMS.iter().any(|p| p.eq_ignore_ascii_case(name))
}

/// The credential parameters of a query, in order: the index of each in [`QUERY_PARAMS`] and its
/// value as sent (still percent-encoded).
pub(crate) fn query_credentials(query: &str) -> impl Iterator<Item = (usize, &str)> {
    query.split('&').filter_map(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        QUERY_PARAMS
            .iter()
            .position(|p| p.eq_ignore_ascii_case(name))
            .map(|i| (i, value))
    })
}

/// Whether a query parameter is to be hidden wherever a query is printed or kept: a credential
/// parameter, or any name that looks like a secret (`token`, `secret`, `signature`, ...).
fn looks_secret(name: &str) -> bool {
    const WORDS: [&str; 10] = [
        "key",
        "token",
        "secret",
        "password",
        "passwd",
        "signature",
        "sig",
        "auth",
        "credential",
        "session",
    ];
    is_query_param(name) || {
        let n = name.to_ascii_lowercase();
        WORDS.iter().any(|w| n.contains(w))
    }
}

/// A query as it may be printed or kept: the value of every credential (or secret-looking)
/// parameter replaced by `[redacted]`. Borrowed when there is nothing to hide.
pub(crate) fn redact_query(query: &str) -> Cow<'_, str> {
    let hidden = |pair: &str| looks_secret(pair.split_once('=').map_or(pair, |(n, _)| n)) && pair.contains('=');
    if !query.split('&').any(hidden) {
        return Cow::Borrowed(query);
    }
    let pairs: Vec<Cow<'_, str>> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if looks_secret(name) => Cow::Owned(format!("{name}=[redacted]")),
            _ => Cow::Borrowed(pair),
        })
        .collect();
    Cow::Owned(pairs.join("&"))
}

/// A query split in two: what is not a credential (`None` when nothing is left) and the
/// credential parameters (`name=value` pairs, as sent).
pub(crate) fn split_query(query: &str) -> (Option<String>, Vec<String>) {
    let (mut kept, mut secret) = (Vec::new(), Vec::new());
    for pair in query.split('&') {
        let name = pair.split_once('=').map_or(pair, |(n, _)| n);
        if is_query_param(name) {
            secret.push(pair.to_string());
        } else {
            kept.push(pair);
        }
    }
    let kept = (!kept.is_empty()).then(|| kept.join("&"));
    (kept, secret)
}

/// A query without its credential parameters (`None` when nothing is left); borrowed when it
/// has none.
pub(crate) fn strip_query(query: &str) -> Option<Cow<'_, str>> {
    if query_credentials(query).next().is_none() {
        return Some(Cow::Borrowed(query));
    }
    split_query(query).0.map(Cow::Owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn hash(pairs: &[(&str, &str)], query: Option<&str>) -> CredentialHash {
        let forms = Credentials::default();
        forms.presented(&map(pairs), query).hash(&forms)
    }

    #[test]
    fn the_list_is_the_designed_one() {
        let headers = HEADERS;
        let names: Vec<&str> = headers.iter().map(HeaderName::as_str).collect();
        assert_eq!(
            names,
            [
                "authorization",
                "proxy-authorization",
                "x-api-key",
                "api-key",
                "x-goog-api-key",
                "x-amz-security-token",
                "cookie"
            ]
        );
        assert_eq!(QUERY_PARAMS, ["key", "api_key", "api-key", "access_token"]);
        for c in CLASSIC_SCOPE {
            assert!(HEADERS.contains(&c));
        }
    }

    #[test]
    fn extra_names_extend_the_list_once() {
        let forms = Credentials::with(&[HeaderName::from_static("x-tenant-key"), http::header::AUTHORIZATION]);
        assert_eq!(forms.headers().len(), 8);
        assert_eq!(forms.headers()[7], HeaderName::from_static("x-tenant-key"));
        let secrets: Vec<&HeaderName> = forms.secrets().collect();
        assert!(secrets.contains(&&HeaderName::from_static("x-tenant-key")));
        assert!(secrets.contains(&&http::header::SET_COOKIE));
        assert!(!secrets.contains(&&http::header::ACCEPT));
    }

    #[test]
    fn every_form_distinguishes_credentials() {
        let none = hash(&[], None);
        for name in HEADERS {
            let a = hash(&[(name.as_str(), "secret-a")], None);
            let b = hash(&[(name.as_str(), "secret-b")], None);
            assert_ne!(a, b, "{name}");
            assert_ne!(a, none, "{name}");
        }
        for p in QUERY_PARAMS {
            let a = hash(&[], Some(&format!("alt=json&{p}=secret-a")));
            let b = hash(&[], Some(&format!("alt=json&{p}=secret-b")));
            assert_ne!(a, b, "{p}");
            assert_ne!(a, none, "{p}");
        }
        // Not a credential: the same hash as none.
        assert_eq!(hash(&[("accept", "x")], Some("alt=json&keys=1")), none);
        // The same value under two forms is two credentials.
        assert_ne!(hash(&[("x-goog-api-key", "k")], None), hash(&[], Some("key=k")));
        // Header order does not matter, each form's value order does.
        assert_eq!(
            hash(&[("x-api-key", "a"), ("authorization", "b")], None),
            hash(&[("authorization", "b"), ("x-api-key", "a")], None)
        );
        // Length prefixes: values never run into each other.
        assert_ne!(
            hash(&[("x-api-key", "ab"), ("api-key", "c")], None),
            hash(&[("x-api-key", "a"), ("api-key", "bc")], None)
        );
    }

    #[test]
    fn a_classic_credential_hashes_as_before_the_list_grew() {
        // Pinned: the value the three-header hash of earlier versions gave (replicas of both
        // versions share cooldowns through Redis during a rollout). A change here breaks
        // mixed-version fleets: bump the DOMAIN version instead. SHA-256("rebound/cooldown-
        // credential/v1\0" || u32be(13) "authorization" || u32be(1) || u32be(11) "Bearer test"),
        // first 16 bytes (checked independently with Python's hashlib).
        assert_eq!(
            hash(&[("authorization", "Bearer test")], None).to_string(),
            "7cdb1810be83ef94a5650d60389790f5"
        );
    }

    #[test]
    fn the_memo_names_as_the_hash_does() {
        let forms = Credentials::default();
        let mut headers = HeaderMap::new();
        headers.insert("authorization", HeaderValue::from_static("Bearer test"));
        for _ in 0..2 {
            // Asked twice from fresh requests: the second answer is the memo's.
            let p = forms.presented(&headers, None);
            assert_eq!(p.hash(&forms).to_string(), "7cdb1810be83ef94a5650d60389790f5");
            let h = p.hash(&forms);
            assert_eq!(forms.limit_key(h, "gpt-4o"), LimitKey::new(h, "gpt-4o"));
            assert_eq!(forms.limit_key(h, ""), LimitKey::new(h, ""));
        }
        headers.insert("authorization", HeaderValue::from_static("Bearer other"));
        assert_ne!(
            forms.presented(&headers, None).hash(&forms).to_string(),
            "7cdb1810be83ef94a5650d60389790f5"
        );
    }

    #[test]
    fn a_model_makes_a_key_of_its_own() {
        let a = hash(&[("authorization", "Bearer test")], None);
        let b = hash(&[("authorization", "Bearer other")], None);
        assert_eq!(LimitKey::new(a, ""), LimitKey::from(a));
        assert_ne!(LimitKey::new(a, "gpt-4o"), LimitKey::from(a));
        assert_ne!(LimitKey::new(a, "gpt-4o"), LimitKey::new(a, "gpt-4o-mini"));
        assert_ne!(LimitKey::new(a, "gpt-4o"), LimitKey::new(b, "gpt-4o"));
        assert_eq!(LimitKey::new(a, "gpt-4o").credential, a);
        for key in [LimitKey::from(a), LimitKey::new(a, "gpt-4o")] {
            let text = key.to_string();
            assert_eq!(text.parse::<LimitKey>(), Ok(key), "{text}");
            assert!(!text.contains("gpt"));
        }
        // What a replica of the previous version parses: the credential alone.
        assert!(LimitKey::new(a, "m").to_string().parse::<CredentialHash>().is_err());
        assert_eq!(LimitKey::from(a).to_string().parse::<CredentialHash>(), Ok(a));
        assert!("a/b".parse::<LimitKey>().is_err());
    }

    #[test]
    fn hashes_round_trip_through_text() {
        let h = hash(&[("authorization", "Bearer test")], None);
        assert_eq!(h.to_string().parse::<CredentialHash>(), Ok(h));
        assert!("xyz".parse::<CredentialHash>().is_err());
    }

    #[test]
    fn queries_are_redacted_and_split() {
        assert_eq!(
            redact_query("api-version=2024-02-01&key=AIza123&x=1"),
            "api-version=2024-02-01&key=[redacted]&x=1"
        );
        assert_eq!(redact_query("access_token=abc"), "access_token=[redacted]");
        assert_eq!(redact_query("API_KEY=abc&alt=sse"), "API_KEY=[redacted]&alt=sse");
        assert_eq!(redact_query("flag"), "flag");
        assert!(matches!(redact_query("alt=sse"), Cow::Borrowed(_)));
        assert_eq!(
            split_query("alt=sse&key=k1&api_key=k2"),
            (
                Some("alt=sse".to_string()),
                vec!["key=k1".to_string(), "api_key=k2".to_string()]
            )
        );
        assert_eq!(split_query("key=k1"), (None, vec!["key=k1".to_string()]));
        assert_eq!(strip_query("alt=sse&key=k").as_deref(), Some("alt=sse"));
        assert_eq!(strip_query("key=k"), None);
        assert!(matches!(strip_query("alt=sse"), Some(Cow::Borrowed(_))));
    }

    #[test]
    fn a_presented_credential_prints_no_value() {
        let forms = Credentials::default();
        let p = forms.presented(&map(&[("x-goog-api-key", "AIza-canary")]), Some("key=AIza-q"));
        let shown = format!("{p:?}");
        assert!(!shown.contains("canary") && !shown.contains("AIza"), "{shown}");
        assert_eq!(p.values.len(), 2);
        assert!(forms.presented(&map(&[]), None).values.is_empty());
    }
}
