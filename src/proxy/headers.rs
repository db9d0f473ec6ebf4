//! Header hygiene: hop-by-hop headers (RFC 9110 §7.6.1), rebound's own request headers, and the
//! names whose values must never be logged.

use http::header::{HeaderMap, HeaderName, CONNECTION, UPGRADE};

/// Hop-by-hop headers that apply to one connection only (RFC 9110 §7.6.1, plus the
/// non-standard `keep-alive` and `proxy-connection` that clients still send).
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Request headers addressed to rebound itself: read, never forwarded.
pub const REBOUND_REQUEST_HEADERS: [&str; 2] = ["x-rebound-deadline-ms", "x-rebound-max-attempts"];

/// Header names whose values are credentials: never logged, never stored.
pub const SENSITIVE: [&str; 6] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "cookie",
    "set-cookie",
];

/// Removes hop-by-hop headers: the fixed list and every header the `Connection` header names.
/// With `keep_upgrade`, `connection: upgrade` and `upgrade` survive (a WebSocket handshake needs
/// them on both hops).
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let listed: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .filter(|n| !(keep_upgrade && n == UPGRADE))
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        if keep_upgrade && (name == "connection" || name == "upgrade") {
            continue;
        }
        headers.remove(name);
    }
    if keep_upgrade {
        headers.insert(CONNECTION, http::HeaderValue::from_static("upgrade"));
    }
}

/// Whether the request asks to switch protocols (a WebSocket handshake): `Connection` lists
/// `upgrade` and an `Upgrade` header is present.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(UPGRADE)
        && headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
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
