//! Header hygiene: hop-by-hop headers (RFC 9110 §7.6.1), rebound's own request headers, and the
//! names whose values must never be logged.

use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, UPGRADE};

// Header names used on every request, parsed once (a `&str` name is parsed on each use).
pub(crate) const X_REBOUND_ATTEMPTS: HeaderName = HeaderName::from_static("x-rebound-attempts");
pub(crate) const X_REBOUND_UPSTREAM: HeaderName = HeaderName::from_static("x-rebound-upstream");
/// How many times the request moved to another target of its route.
pub(crate) const X_REBOUND_FAILOVERS: HeaderName = HeaderName::from_static("x-rebound-failovers");
pub(crate) const X_REBOUND_ERROR: HeaderName = HeaderName::from_static("x-rebound-error");
pub(crate) const X_REBOUND_IDEMPOTENCY: HeaderName = HeaderName::from_static("x-rebound-idempotency");
/// What the response cache did: `hit`, `miss`, `refresh` or `bypass`.
pub(crate) const X_REBOUND_CACHE: HeaderName = HeaderName::from_static("x-rebound-cache");
pub(crate) const X_SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");
pub(crate) const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
pub(crate) const X_REBOUND_DEADLINE_MS: HeaderName = HeaderName::from_static("x-rebound-deadline-ms");
/// On a stream of a route that continues cut streams (`continue_streams`): `true`.
pub(crate) const X_REBOUND_CONTINUABLE: HeaderName = HeaderName::from_static("x-rebound-continuable");
pub(crate) const X_REBOUND_MAX_ATTEMPTS: HeaderName = HeaderName::from_static("x-rebound-max-attempts");
pub(crate) const X_REBOUND_CALLBACK: HeaderName = HeaderName::from_static("x-rebound-callback");
/// A job's id, on its 202, its `GET /jobs/{id}` answers and its callback.
pub(crate) const X_REBOUND_JOB_ID: HeaderName = HeaderName::from_static("x-rebound-job-id");
pub(crate) const PREFERENCE_APPLIED: HeaderName = HeaderName::from_static("preference-applied");
pub(crate) const X_STAINLESS_TIMEOUT: HeaderName = HeaderName::from_static("x-stainless-timeout");
pub(crate) const X_STAINLESS_READ_TIMEOUT: HeaderName = HeaderName::from_static("x-stainless-read-timeout");
pub(crate) const X_STAINLESS_RETRY_COUNT: HeaderName = HeaderName::from_static("x-stainless-retry-count");
/// google-genai's client timeout, in seconds (Google's servers read it too: it is forwarded).
pub(crate) const X_SERVER_TIMEOUT: HeaderName = HeaderName::from_static("x-server-timeout");
/// W3C Trace Context.
pub(crate) const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Sets `retry-after` (whole seconds, rounded up: never sooner than `after`) where the response
/// has none: a failure rebound delivers says when it would try again, when it knows.
pub(crate) fn insert_retry_after(headers: &mut HeaderMap, after: std::time::Duration) {
    if !headers.contains_key(http::header::RETRY_AFTER) {
        let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    }
}

/// An `x-rebound-attempts` value: static for the counts a retry policy allows, so that setting
/// the header allocates nothing (`HeaderValue::from(u32)` allocates every time).
pub(crate) fn attempts_value(attempts: u32) -> HeaderValue {
    const SMALL: [&str; 17] = [
        "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    ];
    match SMALL.get(attempts as usize) {
        Some(s) => HeaderValue::from_static(s),
        None => HeaderValue::from(attempts),
    }
}

/// The `content-length` value for a body of `len` bytes: the request's own value when it states
/// that length (a clone shares its bytes), else a new one from the digits written on the stack
/// (one allocation; `HeaderValue::from(usize)` makes two).
pub(crate) fn content_length(len: usize, stated: Option<&HeaderValue>) -> HeaderValue {
    let mut buf = itoa::Buffer::new();
    let digits = buf.format(len).as_bytes();
    match stated {
        Some(v) if v.as_bytes() == digits => v.clone(),
        _ => HeaderValue::from_bytes(digits).unwrap_or_else(|_| HeaderValue::from(len)),
    }
}

/// Hop-by-hop headers that apply to one connection only (RFC 9110 §7.6.1, plus the
/// non-standard `keep-alive` and `proxy-connection` that clients still send).
const HOP_BY_HOP: [HeaderName; 9] = [
    CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    http::header::PROXY_AUTHENTICATE,
    http::header::PROXY_AUTHORIZATION,
    http::header::TE,
    http::header::TRAILER,
    http::header::TRANSFER_ENCODING,
    UPGRADE,
];

/// Request headers never copied to the upstream request as they came: rebound's own, and the
/// ones the upstream request sets itself (`host`, `content-length`).
pub(crate) const NOT_FORWARDED: [HeaderName; 5] = [
    X_REBOUND_DEADLINE_MS,
    X_REBOUND_MAX_ATTEMPTS,
    X_REBOUND_CALLBACK,
    http::header::HOST,
    http::header::CONTENT_LENGTH,
];

/// Removes hop-by-hop headers: the fixed list and every header the `Connection` header names.
/// With `keep_upgrade`, `connection: upgrade` and `upgrade` survive (a WebSocket handshake needs
/// them on both hops).
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let found = present(headers, &HOP_BY_HOP);
    if found[0] {
        // The values are cloned (a clone shares the bytes) so that the map can change while the
        // tokens are read; one `Connection` value, the usual case, needs no `Vec`. A token is
        // removed by its `&str`, which is looked up without building a `HeaderName` (an
        // allocation for every name that is not a standard one, `keep-alive` included).
        let mut values = headers.get_all(CONNECTION).iter();
        let first = values.next().cloned();
        let rest: Vec<http::HeaderValue> = values.cloned().collect();
        for value in first.iter().chain(&rest) {
            let Ok(value) = value.to_str() else { continue };
            for token in value.split(',').map(str::trim) {
                let kept = token.is_empty() || (keep_upgrade && token.eq_ignore_ascii_case("upgrade"));
                if !kept {
                    headers.remove(token);
                }
            }
        }
    }
    for (name, found) in HOP_BY_HOP.iter().zip(found) {
        if found && !(keep_upgrade && (*name == CONNECTION || *name == UPGRADE)) {
            headers.remove(name);
        }
    }
    if keep_upgrade {
        headers.insert(CONNECTION, http::HeaderValue::from_static("upgrade"));
    }
}

/// Removes every header in `names` (each name once, however many values it has).
pub(crate) fn remove_all<const N: usize>(headers: &mut HeaderMap, names: &[HeaderName; N]) {
    for (name, found) in names.iter().zip(present(headers, names)) {
        if found {
            headers.remove(name);
        }
    }
}

/// Which of `names` the map holds, found in one pass over its names: most messages carry few or
/// none of the headers rebound removes, and comparing names is cheaper than hashing each one.
/// (A pass over the names alone: cheaper than [`first_values`]'s over every value.)
fn present<const N: usize>(headers: &HeaderMap, names: &[HeaderName; N]) -> [bool; N] {
    let mut found = [false; N];
    for key in headers.keys() {
        if let Some(i) = names.iter().position(|n| n == key) {
            found[i] = true;
        }
    }
    found
}

/// The first value of each of `names` (what `HeaderMap::get` returns), found in one pass over the
/// map, as [`present`] finds names: five lookups by name would hash each name whether or not it
/// is there.
pub(crate) fn first_values<'h, const N: usize>(
    headers: &'h HeaderMap,
    names: &[HeaderName; N],
) -> [Option<&'h HeaderValue>; N] {
    let mut first = [None; N];
    for (key, value) in headers {
        if let Some(i) = names.iter().position(|n| n == key) {
            first[i].get_or_insert(value);
        }
    }
    first
}

/// Whether the request asks to switch protocols (a WebSocket handshake): `Connection` lists
/// `upgrade` and an `Upgrade` header is present.
pub(crate) fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(UPGRADE)
        && headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// The size of a request head as it came on the wire, near enough: the request line and each
/// header line (`name: value\r\n`), for the `max_request_head` limit.
pub(crate) fn head_size(method: &http::Method, uri: &http::Uri, headers: &http::HeaderMap) -> u64 {
    let line = method.as_str().len() + uri.path_and_query().map_or(1, |p| p.as_str().len()) + 12;
    let fields: usize = headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum();
    (line + fields) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn attempts_values_are_the_decimal_count() {
        for n in [0, 1, 9, 10, 16, 17, 100, u32::MAX] {
            assert_eq!(attempts_value(n), HeaderValue::from(n), "{n}");
        }
    }

    #[test]
    fn content_length_is_the_decimal_length_and_reuses_a_matching_value() {
        for n in [0usize, 1, 9, 10, 99, 100, 4096, 1 << 20, usize::MAX] {
            let made = content_length(n, None);
            assert_eq!(made, HeaderValue::from(n), "{n}");
            // A stated value is kept only when it is the same digits.
            assert_eq!(content_length(n, Some(&made)), made, "{n}");
            let other = HeaderValue::from(n / 2 + 1);
            assert_eq!(content_length(n, Some(&other)), HeaderValue::from(n), "{n}");
        }
        // `007` states 7 too, but not in the form sent: a new value is made.
        assert_eq!(content_length(7, Some(&HeaderValue::from_static("007"))), "7");
    }

    #[test]
    fn strips_fixed_and_listed_headers() {
        let mut h = map(&[
            ("connection", "keep-alive, x-private-hop"),
            ("keep-alive", "timeout=5"),
            ("x-private-hop", "1"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("proxy-authorization", "Basic abc"),
            ("upgrade", "h2c"),
            ("authorization", "Bearer sk"),
            ("content-type", "application/json"),
        ]);
        strip_hop_by_hop(&mut h, false);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["authorization", "content-type"]);

        // Every value of `Connection` counts, tokens in any case; a token that is no valid
        // header name, or names nothing present, is ignored.
        let mut h = map(&[
            ("connection", "close"),
            ("x-a", "1"),
            ("connection", " X-B ,, bad name,x-missing"),
            ("x-b", "2"),
            ("x-c", "3"),
        ]);
        strip_hop_by_hop(&mut h, false);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, vec!["x-a", "x-c"]);
    }

    #[test]
    fn keeps_upgrade_for_websockets() {
        let mut h = map(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "k"),
        ]);
        assert!(is_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "upgrade");
        assert_eq!(h["sec-websocket-key"], "k");

        // Other listed headers still go.
        let mut h = map(&[
            ("connection", "keep-alive, UPGRADE, x-hop"),
            ("upgrade", "websocket"),
            ("x-hop", "1"),
        ]);
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "upgrade");
        assert!(!h.contains_key("x-hop"));
    }

    #[test]
    fn remove_all_removes_every_value_of_each_name() {
        let mut h = map(&[("host", "a"), ("x-keep", "1"), ("host", "b"), ("content-length", "2")]);
        remove_all(&mut h, &[http::header::HOST, http::header::CONTENT_LENGTH, UPGRADE]);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["x-keep"]);
    }

    #[test]
    fn upgrade_needs_both_headers() {
        assert!(!is_upgrade(&map(&[("upgrade", "websocket")])));
        assert!(!is_upgrade(&map(&[("connection", "upgrade")])));
        assert!(is_upgrade(&map(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket")
        ])));
    }
}
