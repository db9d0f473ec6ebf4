//! What makes two requests "the same request": the record key (who and which key) and the
//! fingerprint (what was asked). Pure. The record key and the scope are SHA-256 hashes, so no raw
//! key or credential is stored; the fingerprint (version 2) is BLAKE3, the fastest to hash a large
//! body with, and [`fingerprint_v1`] is the SHA-256 one of records written before it.

use std::borrow::{Borrow, Cow};
use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, Method};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::credentials;

/// A record's key in the store ([`record_key`], [`cache_record_key`]): who asked and under which
/// key. Its own type so that it cannot be passed where a fingerprint or an owner is asked for.
/// Shared, not copied: the claim, its live response and the in-memory store's record hold the
/// one block.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RecordKey(Arc<str>);

impl RecordKey {
    /// A key from its text, as the store holds it (one read back, or a test's).
    pub fn new(text: impl Into<Arc<str>>) -> RecordKey {
        RecordKey(text.into())
    }

    /// The text, for Redis and logs.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The in-memory store's maps look keys up by their text (a key is its text).
impl Borrow<str> for RecordKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RecordKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RecordKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RecordKey({:?})", &*self.0)
    }
}

/// What a request asked ([`fingerprint`], [`fingerprint_v1`]): the same key with another
/// fingerprint is another request. Kept with the record, and in dead letters and job records as
/// the text it always was (serialized as a plain string).
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// A fingerprint from its text, as a record holds it (one read back, or a test's).
    pub fn new(text: impl Into<String>) -> Fingerprint {
        Fingerprint(text.into())
    }

    /// The text, for Redis, logs and hashes.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({:?})", self.0)
    }
}

/// A tenant's scope ([`scope_hash`]): the hash of its `scope_headers` values and credential query
/// parameters, 32 hex digits. Part of its records' keys; kept in dead letters and job records as
/// the text it always was (serialized as a plain string).
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Scope(String);

impl Scope {
    #[cfg(test)]
    pub(crate) fn new(text: &str) -> Scope {
        Scope(text.to_string())
    }

    /// The text, for hashes and logs.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scope({:?})", self.0)
    }
}

/// A hash fed in pieces.
trait Feed {
    fn feed(&mut self, bytes: &[u8]);
    fn finish(self) -> [u8; 32];
}

impl Feed for Sha256 {
    fn feed(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
    fn finish(self) -> [u8; 32] {
        self.finalize().into()
    }
}

impl Feed for blake3::Hasher {
    fn feed(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
    fn finish(self) -> [u8; 32] {
        *self.finalize().as_bytes()
    }
}

/// A hash over parts, each length-prefixed (so `("ab","c")` and `("a","bc")` differ). Small
/// pieces are gathered and fed to the hash together: every call into a hash costs something of
/// its own (about 160 instructions for BLAKE3), and most of a request's parts are a few bytes.
/// The hash is the same however its input is cut.
struct Parts<H: Feed = Sha256> {
    hash: H,
    gathered: [u8; GATHER],
    len: usize,
}

/// How many bytes of small pieces [`Parts`] gathers before feeding them.
const GATHER: usize = 256;

impl Parts {
    fn new() -> Parts {
        Parts::with(Sha256::new())
    }

    fn of(parts: &[&[u8]]) -> [u8; 32] {
        let mut h = Parts::new();
        for p in parts {
            h.part(p);
        }
        h.finish()
    }
}

impl<H: Feed> Parts<H> {
    fn with(hash: H) -> Parts<H> {
        Parts {
            hash,
            gathered: [0; GATHER],
            len: 0,
        }
    }

    fn feed(&mut self, bytes: &[u8]) {
        if self.len + bytes.len() > GATHER {
            self.hash.feed(&self.gathered[..self.len]);
            self.len = 0;
        }
        if bytes.len() >= GATHER {
            self.hash.feed(bytes);
        } else {
            self.gathered[self.len..self.len + bytes.len()].copy_from_slice(bytes);
            self.len += bytes.len();
        }
    }

    fn part(&mut self, p: &[u8]) {
        self.feed(&(p.len() as u64).to_be_bytes());
        self.feed(p);
    }

    /// A part of `len` bytes whose bytes follow through [`Parts::write`] (the same hash as
    /// [`Parts::part`] over them, without holding them in one buffer).
    fn part_of_len(&mut self, len: usize) {
        self.feed(&(len as u64).to_be_bytes());
    }

    fn finish(mut self) -> [u8; 32] {
        self.hash.feed(&self.gathered[..self.len]);
        self.hash.finish()
    }
}

impl<H: Feed> std::io::Write for Parts<H> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.feed(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Hex SHA-256 of the parts, each length-prefixed (so `("ab","c")` and `("a","bc")` differ).
pub fn digest(parts: &[&[u8]]) -> String {
    hex(&Parts::of(parts))
}

/// `bytes` in lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    push_hex(&mut s, bytes);
    s
}

/// Appends `bytes` in lower-case hex.
pub(crate) fn push_hex(out: &mut String, bytes: &[u8]) {
    let mut buf = [0u8; 64];
    for chunk in bytes.chunks(32) {
        hex_into(chunk, &mut buf);
        // Hex digits are ASCII, always valid UTF-8.
        out.push_str(std::str::from_utf8(&buf[..2 * chunk.len()]).unwrap_or_default());
    }
}

/// Writes `bytes` in lower-case hex into `out`, two digits a byte (as many bytes as fit).
fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&[HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
    }
}

/// The hash of a tenant's identity: the values of the `scope_headers` it sent and of its
/// credential query parameters (the first 128 bits, in hex). Two credentials never share a
/// record; a request without any of them has an empty scope.
///
/// A listed header the request does not carry counts only when it is one of the three that every
/// scope hashed before the credential list grew (`authorization`, `x-api-key`, `api-key`: their
/// names are hashed, present or not), so a request that carries no other form keeps the scope its
/// records were written under; a form added since counts only when present, and so makes a scope
/// of its own. Query parameters are hashed as `?name`, which no header name can be.
pub fn scope_hash(headers: &HeaderMap, query: Option<&str>, scope_headers: &[HeaderName]) -> Scope {
    Scope(hex(&scope_digest(headers, query, scope_headers)))
}

/// The 128 bits [`scope_hash`] shows in hex.
pub(crate) fn scope_digest(headers: &HeaderMap, query: Option<&str>, scope_headers: &[HeaderName]) -> [u8; 16] {
    // One pass over the request's headers (a lookup by name would hash each listed name).
    let mut found: smallvec::SmallVec<[(usize, &http::HeaderValue); 2]> = smallvec::SmallVec::new();
    for (key, value) in headers {
        if let Some(i) = scope_headers.iter().position(|n| n == key) {
            found.push((i, value));
        }
    }
    found.sort_by_key(|(i, _)| *i); // stable: each name's values stay in order
    let mut h = Parts::new();
    let mut rest = &found[..];
    for (i, name) in scope_headers.iter().enumerate() {
        let n = rest.iter().take_while(|(j, _)| *j == i).count();
        if n == 0 && !credentials::CLASSIC_SCOPE.contains(name) {
            continue;
        }
        h.part(name.as_str().as_bytes());
        for (_, v) in &rest[..n] {
            h.part(v.as_bytes());
        }
        rest = &rest[n..];
    }
    for (i, value) in credentials::query_credentials(query.unwrap_or("")) {
        h.part(b"?");
        h.part(credentials::QUERY_PARAMS.get(i).map_or(&b""[..], |p| p.as_bytes()));
        h.part(value.as_bytes());
    }
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finish()[..16]);
    out
}

/// The store key of `key` sent to `route` by the tenant `scope`: `idem:{route:scope:hash}`,
/// the hash the first 128 bits of the key's. One hash tag per record: every script touches
/// one Redis Cluster slot.
pub fn record_key(route: &str, scope: &Scope, key: &str) -> RecordKey {
    keyed("idem:", route, scope, key)
}

/// The store key of a response-cache entry: `cache:{route:scope:hash}`, the hash the first 128
/// bits of the request fingerprint's (apart from every idempotency record).
pub(crate) fn cache_record_key(route: &str, scope: &Scope, fingerprint: &Fingerprint) -> RecordKey {
    keyed("cache:", route, scope, fingerprint.as_str())
}

/// A store key, shared (not copied) by the claim, its live response and the in-memory store's
/// record; written on the stack first, so that the shared block is its only allocation.
fn keyed(prefix: &str, route: &str, scope: &Scope, key: &str) -> RecordKey {
    let hash = Parts::of(&[key.as_bytes()]);
    let mut hex = [0u8; 32];
    hex_into(&hash[..16], &mut hex);
    let pieces: [&[u8]; 8] = [
        prefix.as_bytes(),
        b"{",
        route.as_bytes(),
        b":",
        scope.as_str().as_bytes(),
        b":",
        &hex,
        b"}",
    ];
    // A route or scope too long for the stack is joined on the heap instead.
    let text = shared_text(pieces).unwrap_or_else(|| Arc::from(String::from_utf8_lossy(&pieces.concat()).as_ref()));
    RecordKey(text)
}

/// The longest text [`shared_text`] joins.
pub(crate) const SHARED_TEXT: usize = 512;

/// `pieces` (each from a `&str` or ASCII) joined into one shared block, written on the stack
/// first so that the block is its only allocation; `None` when longer than [`SHARED_TEXT`].
pub(crate) fn shared_text<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> Option<Arc<str>> {
    let mut buf = [0u8; SHARED_TEXT];
    let mut at = 0;
    for piece in pieces {
        buf.get_mut(at..at + piece.len())?.copy_from_slice(piece);
        at += piece.len();
    }
    std::str::from_utf8(buf.get(..at)?).ok().map(Arc::from)
}

/// Why an `Idempotency-Key` value is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    Empty,
    TooLong,
    NotPrintable,
    Several,
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeyError::Empty => "the idempotency key is empty",
            KeyError::TooLong => "the idempotency key is longer than 255 characters",
            KeyError::NotPrintable => "the idempotency key must be visible ASCII characters",
            KeyError::Several => "the idempotency key header must appear once, with one value",
        })
    }
}

/// The key a request carries under `header`: `None` without one, an error when malformed.
/// Accepts a bare token or an RFC 8941 quoted string (`"abc"`, unescaped). A bare token is
/// borrowed from the header, not copied.
pub fn request_key<'a>(headers: &'a HeaderMap, header: &HeaderName) -> Option<Result<Cow<'a, str>, KeyError>> {
    let mut values = headers.get_all(header).iter();
    let first = values.next()?;
    if values.next().is_some() {
        return Some(Err(KeyError::Several));
    }
    Some(parse_key(first.as_bytes()))
}

fn parse_key(raw: &[u8]) -> Result<Cow<'_, str>, KeyError> {
    let raw = trim(raw);
    let key: Cow<'_, [u8]> = if raw.len() >= 2 && raw[0] == b'"' && raw[raw.len() - 1] == b'"' {
        let mut out = Vec::with_capacity(raw.len());
        let mut escaped = false;
        for &b in &raw[1..raw.len() - 1] {
            match (escaped, b) {
                (false, b'\\') => escaped = true,
                (false, b'"') => return Err(KeyError::Several),
                (_, b) => {
                    out.push(b);
                    escaped = false;
                }
            }
        }
        if escaped {
            return Err(KeyError::NotPrintable);
        }
        Cow::Owned(out)
    } else {
        if raw.contains(&b',') {
            return Err(KeyError::Several);
        }
        Cow::Borrowed(raw)
    };
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > 255 {
        return Err(KeyError::TooLong);
    }
    if !key.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(KeyError::NotPrintable);
    }
    // Printable ASCII only (checked above): always UTF-8.
    match key {
        Cow::Borrowed(b) => std::str::from_utf8(b)
            .map(Cow::Borrowed)
            .map_err(|_| KeyError::NotPrintable),
        Cow::Owned(v) => String::from_utf8(v).map(Cow::Owned).map_err(|_| KeyError::NotPrintable),
    }
}

fn trim(mut b: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = b {
        if first.is_ascii_whitespace() {
            b = rest;
        } else {
            break;
        }
    }
    while let [rest @ .., last] = b {
        if last.is_ascii_whitespace() {
            b = rest;
        } else {
            break;
        }
    }
    b
}

/// What a fingerprint of version 2 starts with. One without it is of version 1
/// ([`fingerprint_v1`]), written by builds before it (up to commit 06cc037).
pub const V2: &str = "2:";

/// The fingerprint of a request: method, path, query (parameters sorted) and body. JSON bodies
/// are taken as documents (key order, whitespace and escapes do not matter: `json_digest`),
/// multipart bodies part by part (the boundary does not matter), anything else byte for byte.
/// BLAKE3, marked [`V2`].
pub fn fingerprint(method: &Method, path: &str, query: Option<&str>, headers: &HeaderMap, body: &[u8]) -> Fingerprint {
    let mut h = Parts::with(blake3::Hasher::new());
    h.part(b"rebound-fingerprint-v2");
    let content_type = request_line(&mut h, method, path, query, headers);
    let mime = mime_of(content_type);
    if let Some(parts) = multipart(mime, content_type, body) {
        h.part_of_len(9 + parts.len() * 32);
        h.feed(b"multipart");
        for p in parts {
            let mut d = Parts::with(blake3::Hasher::new());
            d.part(p.headers.as_bytes());
            d.part(p.body);
            h.feed(&d.finish());
        }
    } else if let Some(form) = is_json(mime).then(|| super::json_digest::form(body)).flatten() {
        h.part_of_len(4 + form.len());
        h.feed(b"json");
        h.feed(&form);
    } else {
        h.part_of_len(3 + body.len());
        h.feed(b"raw");
        h.feed(body);
    }
    let mut out = String::with_capacity(V2.len() + 64);
    out.push_str(V2);
    push_hex(&mut out, &h.finish());
    Fingerprint(out)
}

/// Which fingerprint: this version's, or that of records written before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl Version {
    /// The version a record may hold when it does not match this one's fingerprint: written
    /// before an upgrade (1), or by a replica already past `[redis] fingerprint = 1` (2).
    pub(crate) fn other(self) -> Version {
        match self {
            Version::V1 => Version::V2,
            Version::V2 => Version::V1,
        }
    }
}

/// The fingerprint of `version` ([`fingerprint`] or [`fingerprint_v1`]).
pub(crate) fn fingerprint_as(
    version: Version,
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Fingerprint {
    match version {
        Version::V1 => fingerprint_v1(method, path, query, headers, body),
        Version::V2 => fingerprint(method, path, query, headers, body),
    }
}

/// The fingerprint of version 1: SHA-256 over the same request line and the body's canonical
/// JSON text (`canonical`). Records written before [`V2`] hold it; a request whose version-2
/// fingerprint does not match a record is checked again with this one.
pub fn fingerprint_v1(
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Fingerprint {
    let mut h = Parts::new();
    let content_type = request_line(&mut h, method, path, query, headers);
    body_part_v1(&mut h, content_type, body);
    Fingerprint(hex(&h.finish()))
}

/// Method, path and query (parameters sorted) into `h`; the request's content type.
fn request_line<'h, H: Feed>(
    h: &mut Parts<H>,
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &'h HeaderMap,
) -> &'h str {
    let mut params: Vec<&str> = query
        .map(|q| q.split('&').filter(|p| !p.is_empty()).collect())
        .unwrap_or_default();
    params.sort_unstable();
    h.part(method.as_str().as_bytes());
    h.part(path.as_bytes());
    h.part(params.join("&").as_bytes());
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn mime_of(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or("").trim()
}

/// No content type, `application/json` or `*/*+json`.
fn is_json(mime: &str) -> bool {
    let json_suffix = mime.len() >= 5 && mime.as_bytes()[mime.len() - 5..].eq_ignore_ascii_case(b"+json");
    mime.is_empty() || mime.eq_ignore_ascii_case("application/json") || json_suffix
}

/// A well-formed `multipart/form-data` body's parts.
fn multipart<'a>(mime: &str, content_type: &str, body: &'a [u8]) -> Option<Vec<Part<'a>>> {
    if !mime.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    boundary(content_type).and_then(|b| multipart_parts(body, &b))
}

/// The body's part of the version-1 fingerprint, hashed as it is produced (a large body is never
/// copied): `json` and its canonical form (`serde_json`'s written form of the document: keys
/// sorted), `multipart` and each part's digest, else `raw` and the bytes.
fn body_part_v1(h: &mut Parts, content_type: &str, body: &[u8]) {
    let mime = mime_of(content_type);
    if let Some(parts) = multipart(mime, content_type, body) {
        let mut out = b"multipart".to_vec();
        for p in parts {
            out.extend_from_slice(digest(&[p.headers.as_bytes(), p.body]).as_bytes());
        }
        return h.part(&out);
    }
    if is_json(mime) {
        if let Some(doc) = super::canonical::parse(body) {
            h.part_of_len(4 + super::canonical::len(&doc));
            h.feed(b"json");
            // Hashing cannot fail.
            let _ = super::canonical::emit(&doc, h);
            return;
        }
    }
    h.part_of_len(3 + body.len());
    h.feed(b"raw");
    h.feed(body);
}

fn boundary(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        (k.trim().eq_ignore_ascii_case("boundary")).then(|| v.trim().trim_matches('"').to_string())
    })
}

struct Part<'a> {
    /// The part's headers, normalised (lower-case names, in order).
    headers: String,
    body: &'a [u8],
}

/// Splits a multipart body (RFC 7578) into parts; `None` if it is not well formed.
fn multipart_parts<'a>(body: &'a [u8], boundary: &str) -> Option<Vec<Part<'a>>> {
    let delim = format!("--{boundary}");
    let delim = delim.as_bytes();
    let mut parts = Vec::new();
    let mut rest = &body[find(body, delim)? + delim.len()..];
    loop {
        if rest.starts_with(b"--") {
            return Some(parts);
        }
        rest = rest.strip_prefix(b"\r\n")?;
        let head_end = find(rest, b"\r\n\r\n")?;
        let head = std::str::from_utf8(&rest[..head_end]).ok()?;
        let after_head = &rest[head_end + 4..];
        let mut close = b"\r\n".to_vec();
        close.extend_from_slice(delim);
        let end = find(after_head, &close)?;
        let headers = head
            .split("\r\n")
            .map(|l| match l.split_once(':') {
                Some((k, v)) => format!("{}:{}", k.trim().to_ascii_lowercase(), v.trim()),
                None => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        parts.push(Part {
            headers,
            body: &after_head[..end],
        });
        rest = &after_head[end + close.len()..];
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    /// A record key is the same text whether it was joined on the stack or, for a route too long
    /// for it, on the heap.
    #[test]
    fn a_record_key_is_the_same_text_however_long_its_route() {
        let hash = |key: &str| hex(&Parts::of(&[key.as_bytes()])[..16]);
        for route in ["llm".to_string(), "r".repeat(300)] {
            let want = format!("idem:{{{route}:scope:{}}}", hash("key-1"));
            let scope = Scope::new("scope");
            assert_eq!(record_key(&route, &scope, "key-1").as_str(), want);
            let want = format!("cache:{{{route}:scope:{}}}", hash("2:ab"));
            assert_eq!(
                cache_record_key(&route, &scope, &Fingerprint::new("2:ab")).as_str(),
                want
            );
        }
    }

    #[test]
    fn keys() {
        let name = HeaderName::from_static("idempotency-key");
        let key = |v: &str| {
            request_key(&headers(&[("idempotency-key", v)]), &name)
                .unwrap()
                .map(Cow::into_owned)
        };
        assert_eq!(key("abc-123"), Ok("abc-123".into()));
        assert_eq!(key("\"abc-123\""), Ok("abc-123".into()));
        assert_eq!(key("\"a\\\"b\""), Ok("a\"b".into()));
        assert_eq!(key(""), Err(KeyError::Empty));
        assert_eq!(key("\"\""), Err(KeyError::Empty));
        assert_eq!(key(&"x".repeat(256)), Err(KeyError::TooLong));
        assert_eq!(key(&"x".repeat(255)).unwrap().len(), 255);
        assert_eq!(key("a b"), Err(KeyError::NotPrintable));
        assert_eq!(key("a,b"), Err(KeyError::Several));
        assert!(request_key(&headers(&[]), &name).is_none());
        let two = headers(&[("idempotency-key", "a"), ("idempotency-key", "b")]);
        assert_eq!(request_key(&two, &name).unwrap(), Err(KeyError::Several));
    }

    /// The fingerprint as it was computed before it was streamed (records in stores keep
    /// fingerprints: they must not change across an upgrade).
    fn as_before(method: &Method, path: &str, query: &str, content_type: &str, body: &[u8]) -> String {
        let mime = content_type.split(';').next().unwrap_or("").trim();
        let body = match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(v) if mime.is_empty() || mime.ends_with("json") => {
                [b"json".to_vec(), serde_json::to_vec(&v).unwrap()].concat()
            }
            _ => [b"raw".to_vec(), body.to_vec()].concat(),
        };
        digest(&[method.as_str().as_bytes(), path.as_bytes(), query.as_bytes(), &body])
    }

    #[test]
    fn fingerprints_are_what_they_were_before_they_were_streamed() {
        let big = format!(r#"{{"model":"m","input":"{}","z":"a\nb"}}"#, "x".repeat(300_000));
        for (ct, body) in [
            ("application/json", big.as_str()),
            ("application/json", r#"{"b":[1,2.5,{"y":null,"x":"\u00e9"}],"a":"é"}"#),
            ("", r#"[1,"two"]"#),
            ("application/vnd.api+json", r#"{"k":true}"#),
            ("application/json", "not json {"),
            ("text/plain", "plain text"),
            ("", ""),
        ] {
            let h = headers(&[("content-type", ct)]);
            let h = if ct.is_empty() { HeaderMap::new() } else { h };
            assert_eq!(
                fingerprint_v1(&Method::POST, "/v1/x", Some("b=2&a=1"), &h, body.as_bytes()).as_str(),
                as_before(&Method::POST, "/v1/x", "a=1&b=2", ct, body.as_bytes()),
                "{ct}: {}",
                &body[..body.len().min(60)]
            );
        }
    }

    #[test]
    fn json_fingerprints_ignore_order_and_whitespace() {
        let h = headers(&[("content-type", "application/json")]);
        let a = fingerprint(
            &Method::POST,
            "/v1/x",
            None,
            &h,
            br#"{"a":1,"b":[1,2],"c":{"y":1,"x":2}}"#,
        );
        let b = fingerprint(
            &Method::POST,
            "/v1/x",
            None,
            &h,
            b"{ \"c\": {\"x\":2, \"y\":1},\n \"b\":[1, 2], \"a\":1 }",
        );
        assert_eq!(a, b);
        assert_ne!(
            a,
            fingerprint(
                &Method::POST,
                "/v1/x",
                None,
                &h,
                br#"{"a":2,"b":[1,2],"c":{"y":1,"x":2}}"#
            )
        );
        assert_ne!(
            a,
            fingerprint(
                &Method::POST,
                "/v1/y",
                None,
                &h,
                br#"{"a":1,"b":[1,2],"c":{"y":1,"x":2}}"#
            )
        );
        assert_ne!(
            a,
            fingerprint(
                &Method::PUT,
                "/v1/x",
                None,
                &h,
                br#"{"a":1,"b":[1,2],"c":{"y":1,"x":2}}"#
            )
        );
        assert_eq!(
            fingerprint(&Method::POST, "/v1/x", Some("b=2&a=1"), &h, b"{}"),
            fingerprint(&Method::POST, "/v1/x", Some("a=1&b=2"), &h, b"{}")
        );
        assert_ne!(
            fingerprint(&Method::POST, "/v1/x", Some("a=1"), &h, b"{}"),
            fingerprint(&Method::POST, "/v1/x", None, &h, b"{}")
        );
    }

    #[test]
    fn multipart_fingerprints_ignore_the_boundary() {
        let body = |b: &str, content: &str| {
            format!(
                "--{b}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--{b}\r\ncontent-disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n{content}\r\n--{b}--\r\n"
            )
        };
        let fp = |b: &str, content: &str| {
            let h = headers(&[("content-type", &format!("multipart/form-data; boundary={b}"))]);
            fingerprint(&Method::POST, "/v1/audio", None, &h, body(b, content).as_bytes())
        };
        assert_eq!(fp("XYZ", "RIFFdata"), fp("----other-boundary-123", "RIFFdata"));
        assert_ne!(fp("XYZ", "RIFFdata"), fp("XYZ", "RIFFdatb"));
        let v1 = |b: &str, content: &str| {
            let h = headers(&[("content-type", &format!("multipart/form-data; boundary={b}"))]);
            fingerprint_v1(&Method::POST, "/v1/audio", None, &h, body(b, content).as_bytes())
        };
        assert_eq!(v1("XYZ", "RIFFdata"), v1("----other-boundary-123", "RIFFdata"));
        assert_ne!(v1("XYZ", "RIFFdata"), fp("XYZ", "RIFFdata"));
    }

    #[test]
    fn scopes_differ_by_credential() {
        let names = [
            HeaderName::from_static("authorization"),
            HeaderName::from_static("x-api-key"),
        ];
        let a = scope_hash(&headers(&[("authorization", "Bearer a")]), None, &names);
        let b = scope_hash(&headers(&[("authorization", "Bearer b")]), None, &names);
        let none = scope_hash(&headers(&[]), None, &names);
        assert_ne!(a, b);
        assert_ne!(a, none);
        assert_eq!(a, scope_hash(&headers(&[("authorization", "Bearer a")]), None, &names));
        assert!(!a.as_str().contains("Bearer"));
        assert_eq!(a.as_str().len(), 32);
    }

    /// A job's access is kept as a `CredentialHash` of the scope's bits: its text, what Redis
    /// holds, is the scope hash jobs were stored with before.
    #[test]
    fn a_scope_digest_shows_as_its_scope_hash() {
        let all = credentials::HEADERS;
        for h in [headers(&[("authorization", "Bearer a")]), headers(&[])] {
            let access = credentials::CredentialHash(scope_digest(&h, Some("key=k"), &all));
            assert_eq!(access.to_string(), scope_hash(&h, Some("key=k"), &all).as_str());
            assert_eq!(access.to_string().parse(), Ok(access));
        }
    }

    #[test]
    fn every_credential_form_makes_a_scope_of_its_own() {
        let all = credentials::HEADERS;
        let none = scope_hash(&headers(&[]), None, &all);
        let mut seen = std::collections::BTreeSet::new();
        for name in &all {
            for v in ["k-one", "k-two"] {
                let s = scope_hash(&headers(&[(name.as_str(), v)]), None, &all);
                assert_ne!(s, none, "{name}");
                assert!(seen.insert(s.as_str().to_owned()), "{name} {v}");
            }
        }
        for p in credentials::QUERY_PARAMS {
            for v in ["k-one", "k-two"] {
                let q = format!("alt=sse&{p}={v}");
                let s = scope_hash(&headers(&[]), Some(&q), &all);
                assert!(seen.insert(s.as_str().to_owned()), "{p} {v}");
                // Even with a scope list that names no header.
                assert_ne!(
                    scope_hash(&headers(&[]), Some(&q), &[]),
                    scope_hash(&headers(&[]), None, &[])
                );
            }
        }
        // A query without a credential is no scope.
        assert_eq!(scope_hash(&headers(&[]), Some("alt=sse"), &all), none);
    }

    /// A request that carries only the forms scopes knew before the list grew keeps its scope
    /// under the whole list: its records, written before the upgrade, are still found.
    #[test]
    fn a_classic_credential_keeps_its_scope_under_the_whole_list() {
        let classic = credentials::CLASSIC_SCOPE;
        let all = credentials::HEADERS;
        for pairs in [
            &[("authorization", "Bearer a")][..],
            &[("x-api-key", "sk-ant")][..],
            &[("api-key", "azure"), ("authorization", "Bearer b")][..],
            &[][..],
        ] {
            let h = headers(pairs);
            assert_eq!(scope_hash(&h, None, &all), scope_hash(&h, None, &classic), "{pairs:?}");
        }
        // Pinned: the three-header default scope of earlier versions (Python's hashlib over
        // the length-prefixed parts "authorization", "Bearer a", "x-api-key", "api-key").
        assert_eq!(
            scope_hash(&headers(&[("authorization", "Bearer a")]), None, &all).as_str(),
            "7c2d2dc7c87047c5c53619808b47be6b"
        );
        // A newer form present: another scope.
        let goog = headers(&[("authorization", "Bearer a"), ("x-goog-api-key", "AIza")]);
        assert_ne!(scope_hash(&goog, None, &all), scope_hash(&goog, None, &classic));
    }

    /// Records written by an earlier version must still be found after an upgrade (a rolling
    /// deploy shares one Redis): the hashes are pinned, computed independently (Python's hashlib
    /// over the same length-prefixed parts).
    #[test]
    fn hashes_are_stable_across_versions() {
        assert_eq!(
            digest(&[b"abc"]),
            "c3494ca1a2cf8eeb8a11ded316fb55b83c3bbbedb6313cd50415251e5d09e12f"
        );
        let auth = [HeaderName::from_static("authorization")];
        let scope = scope_hash(&headers(&[("authorization", "Bearer a")]), None, &auth);
        assert_eq!(scope.as_str(), "b705347cb1e5eb2e49692dcab1e4bbdd");
        assert_eq!(
            scope_hash(&headers(&[]), None, &auth).as_str(),
            "77d02fe21ac9e3d671949929c9a3d40c"
        );
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        let json = headers(&[("content-type", "Application/JSON; charset=utf-8")]);
        assert_eq!(
            fingerprint_v1(&Method::POST, "/v1/chat/completions", Some("b=2&a=1"), &json, body).as_str(),
            "83295de5c405c63e76911946e5259272a83a3d56fb61fb830d8e21064acb8700"
        );
        let text = headers(&[("content-type", "text/plain")]);
        assert_eq!(
            fingerprint_v1(&Method::PATCH, "/x", None, &text, b"not json").as_str(),
            "32d3adf35198ff56ab1fb7fb01beceb042e33034c28bc32970f5501f66a9ddbe"
        );
        // Version 2, computed independently (Python's `blake3` package over the form
        // `json_digest` documents): a change to it changes every stored fingerprint.
        assert_eq!(
            fingerprint(&Method::POST, "/v1/chat/completions", Some("b=2&a=1"), &json, body).as_str(),
            "2:4f3861f05b0d86a3309daf0dc7079f3d2c96101113076db2a378669bf240da26"
        );
        assert_eq!(
            fingerprint(&Method::PATCH, "/x", None, &text, b"not json").as_str(),
            "2:f8c9d203190c9bf68163f9b64ceb678ccbcd6e245aedaa46c623e045c489716d"
        );
        assert_eq!(
            record_key("llm", &scope, "key-1").as_str(),
            "idem:{llm:b705347cb1e5eb2e49692dcab1e4bbdd:de9f9efc94bf445902a9690d5c49225d}"
        );
    }

    #[test]
    fn hex_is_lower_case_and_zero_padded() {
        for n in [0u128, 1, 0xabc, u128::MAX, 0x0123_4567_89ab_cdef_0011_2233_4455_6677] {
            assert_eq!(hex(&n.to_be_bytes()), format!("{n:032x}"));
        }
        let mut s = String::from("x");
        push_hex(&mut s, &[0xffu8; 70]);
        assert_eq!(s, format!("x{}", "ff".repeat(70)));
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(crate::testing::proptest_config(512))]

            /// Any key header: no panic, and an accepted key is 1 to 255 visible ASCII characters.
            #[test]
            fn the_key_validator_accepts_only_what_it_documents(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
                let header = HeaderName::from_static("idempotency-key");
                let mut headers = HeaderMap::new();
                if let Ok(v) = http::HeaderValue::from_bytes(&raw) {
                    headers.insert(header.clone(), v);
                    if let Some(Ok(key)) = request_key(&headers, &header) {
                        prop_assert!((1..=255).contains(&key.len()));
                        prop_assert!(key.bytes().all(|b| (0x21..=0x7e).contains(&b)));
                    }
                }
            }

            /// Any body under any content type: no panic.
            #[test]
            fn any_body_is_fingerprinted(
                body in proptest::collection::vec(any::<u8>(), 0..512),
                ct in prop_oneof![
                    Just("application/json"),
                    Just("multipart/form-data; boundary=xyz"),
                    Just("multipart/form-data"),
                    Just("text/plain"),
                ],
            ) {
                let mut headers = HeaderMap::new();
                headers.insert("content-type", http::HeaderValue::from_static(ct));
                let fp = fingerprint(&Method::POST, "/v1/x", Some("b=2&a=1"), &headers, &body);
                prop_assert!(!fp.as_str().is_empty());
            }

            /// A JSON object's fingerprint does not depend on its key order or whitespace.
            #[test]
            fn json_key_order_does_not_matter(
                fields in proptest::collection::btree_map("[a-z]{1,6}", any::<i64>(), 1..8),
                spaces in any::<bool>(),
            ) {
                let pairs: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                let sep = if spaces { ", " } else { "," };
                let forward = format!("{{{}}}", pairs.join(sep));
                let backward = format!("{{{}}}", pairs.iter().rev().cloned().collect::<Vec<_>>().join(sep));
                let mut headers = HeaderMap::new();
                headers.insert("content-type", http::HeaderValue::from_static("application/json"));
                prop_assert_eq!(
                    fingerprint(&Method::POST, "/p", None, &headers, forward.as_bytes()),
                    fingerprint(&Method::POST, "/p", None, &headers, backward.as_bytes())
                );
            }
        }
    }
}
