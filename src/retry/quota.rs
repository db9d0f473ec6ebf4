//! A credential's request quota, as the providers report it on every response (what pacing
//! reads): OpenAI's `x-ratelimit-remaining-requests` with `x-ratelimit-reset-requests` (a Go
//! duration), Anthropic's `anthropic-ratelimit-requests-remaining` with
//! `anthropic-ratelimit-requests-reset` (an RFC 3339 time, measured against the response's `Date`
//! when it has one, as in [`super::retry_after`]). Pure: the caller passes the time.

use std::time::{Duration, SystemTime};

use http::header::{HeaderMap, HeaderName, DATE};

use crate::wire::headers::first_values;

use super::retry_after::{parse_go_duration, parse_rfc3339, parse_unsigned, single_value, until};

/// Requests left in the current window, and when it resets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Quota {
    pub remaining: u64,
    pub reset: Duration,
}

// Parsed once: a `&str` name is parsed and hashed on every lookup, and this runs per response.
const OPENAI_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining-requests");
const OPENAI_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset-requests");
const ANTHROPIC_REMAINING: HeaderName = HeaderName::from_static("anthropic-ratelimit-requests-remaining");
const ANTHROPIC_RESET: HeaderName = HeaderName::from_static("anthropic-ratelimit-requests-reset");

/// The request quota a response reports, if it reports one whole (both the remaining count and
/// the reset, valid). With both providers' headers, the one with fewer requests left.
pub(crate) fn requests_quota(headers: &HeaderMap, now: SystemTime) -> Option<Quota> {
    // Most responses carry neither: one pass over the names says so without hashing either.
    if first_values(headers, &[OPENAI_REMAINING, ANTHROPIC_REMAINING]) == [None, None] {
        return None;
    }
    let remaining = |name: &HeaderName| single_value(headers, name).and_then(parse_unsigned);
    let openai = remaining(&OPENAI_REMAINING).and_then(|remaining| {
        let reset = single_value(headers, &OPENAI_RESET).and_then(parse_go_duration)?;
        Some(Quota { remaining, reset })
    });
    let anthropic = remaining(&ANTHROPIC_REMAINING).and_then(|remaining| {
        let at = single_value(headers, &ANTHROPIC_RESET).and_then(parse_rfc3339)?;
        let reference = single_value(headers, &DATE)
            .and_then(|v| httpdate::parse_http_date(v).ok())
            .unwrap_or(now);
        Some(Quota {
            remaining,
            reset: until(at, reference),
        })
    });
    match (openai, anthropic) {
        (Some(a), Some(b)) => Some(if b.remaining < a.remaining { b } else { a }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn openai_and_anthropic_quotas() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let q = requests_quota(
            &headers(&[
                ("x-ratelimit-remaining-requests", "4"),
                ("x-ratelimit-reset-requests", "1.5s"),
            ]),
            now,
        );
        assert_eq!(
            q,
            Some(Quota {
                remaining: 4,
                reset: Duration::from_millis(1500)
            })
        );
        // 2023-11-14T22:13:20Z is `now`.
        let q = requests_quota(
            &headers(&[
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-requests-reset", "2023-11-14T22:13:22Z"),
            ]),
            now,
        );
        assert_eq!(
            q,
            Some(Quota {
                remaining: 0,
                reset: Duration::from_secs(2)
            })
        );
        // Measured against the response's Date.
        let q = requests_quota(
            &headers(&[
                ("anthropic-ratelimit-requests-remaining", "1"),
                ("anthropic-ratelimit-requests-reset", "2023-11-14T22:13:22Z"),
                ("date", "Tue, 14 Nov 2023 22:13:21 GMT"),
            ]),
            now,
        );
        assert_eq!(q.map(|q| q.reset), Some(Duration::from_secs(1)));
    }

    #[test]
    fn half_a_quota_or_a_malformed_one_is_none() {
        let now = UNIX_EPOCH;
        for pairs in [
            &[("x-ratelimit-remaining-requests", "4")][..],
            &[("x-ratelimit-reset-requests", "1s")][..],
            &[
                ("x-ratelimit-remaining-requests", "-1"),
                ("x-ratelimit-reset-requests", "1s"),
            ][..],
            &[
                ("x-ratelimit-remaining-requests", "1"),
                ("x-ratelimit-reset-requests", "soon"),
            ][..],
            &[("anthropic-ratelimit-requests-remaining", "1")][..],
            &[
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-tokens", "1s"),
            ][..],
        ] {
            assert_eq!(requests_quota(&headers(pairs), now), None, "{pairs:?}");
        }
    }
}
