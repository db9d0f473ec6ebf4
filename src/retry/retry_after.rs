//! Server-directed delays: `retry-after-ms`, `Retry-After`, and the providers' rate-limit reset
//! headers, turned into one [`RetryHint`].
//!
//! Sources, first usable one wins:
//! 1. `retry-after-ms`: milliseconds, fractions allowed (`1500.5`). Sent by OpenAI and Azure
//!    OpenAI; the Stainless SDKs read it before `retry-after`.
//! 2. `retry-after` (RFC 9110 §10.2.3): `delay-seconds` or an `HTTP-date` in any of the three
//!    forms that RFC 9110 §5.6.7 obliges recipients to accept (IMF-fixdate, obsolete RFC 850,
//!    asctime). A fractional number of seconds is accepted as the SDKs do, although the grammar
//!    is `1*DIGIT`.
//! 3. Rate-limit reset headers, the fallback: OpenAI's `x-ratelimit-reset-{requests,tokens}`
//!    (Go durations such as `6m0s`) and Anthropic's
//!    `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset` (RFC 3339
//!    timestamps). See [`parse_hint`] for how one of several is chosen.
//!
//! A header that is absent, malformed, repeated with different values, not ASCII, negative or
//! NaN is ignored (the next source is tried); nothing here panics on any input. Absurdly large
//! values are kept (the caller compares the hint with its `max_retry_after` and passes the
//! response back rather than waiting), but saturate at [`MAX_HINT`] so that no caller arithmetic
//! (`Instant + Duration`) can overflow; this follows RFC 9111 §1.2.2, which has caches treat an
//! unrepresentable delta-seconds as 2^31.
//!
//! Absolute times (an HTTP-date, an RFC 3339 reset) are measured against the response's own
//! `Date` header when it has a valid one, and against the caller's `now` otherwise: the server
//! computed both from the same clock, so their difference is free of the skew between its clock
//! and ours. `Date` has one-second resolution and is truncated, so this can only over-estimate
//! the wait, by less than a second.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderMap, DATE, RETRY_AFTER};

/// The largest delay any parser here returns: 2^31 seconds (about 68 years). Larger values
/// saturate to it (RFC 9111 §1.2.2 precedent), so that `now + hint` can never overflow.
pub(crate) const MAX_HINT: Duration = Duration::from_secs(1 << 31);

const NANOS_PER_MILLI: u128 = 1_000_000;
const NANOS_PER_SEC: u128 = 1_000_000_000;
const NANOS_PER_MIN: u128 = 60 * NANOS_PER_SEC;
const NANOS_PER_HOUR: u128 = 60 * NANOS_PER_MIN;

/// Which response header a [`RetryHint`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HintSource {
    /// `retry-after-ms` (OpenAI, Azure OpenAI).
    RetryAfterMs,
    /// `retry-after` (RFC 9110 §10.2.3), seconds or HTTP-date.
    RetryAfter,
    /// OpenAI `x-ratelimit-reset-requests`.
    OpenAiResetRequests,
    /// OpenAI `x-ratelimit-reset-tokens`.
    OpenAiResetTokens,
    /// Anthropic `anthropic-ratelimit-requests-reset`.
    AnthropicRequestsReset,
    /// Anthropic `anthropic-ratelimit-tokens-reset`.
    AnthropicTokensReset,
    /// Anthropic `anthropic-ratelimit-input-tokens-reset`.
    AnthropicInputTokensReset,
    /// Anthropic `anthropic-ratelimit-output-tokens-reset`.
    AnthropicOutputTokensReset,
    /// Not a header: the error body's delay (Gemini / Vertex `RetryInfo.retryDelay`), used when
    /// no header gives one (see `provider_error`).
    ErrorBody,
}

impl HintSource {
    /// The (lower-case) name of the header this hint was read from.
    pub(crate) const fn header_name(self) -> &'static str {
        match self {
            HintSource::RetryAfterMs => "retry-after-ms",
            HintSource::RetryAfter => "retry-after",
            HintSource::OpenAiResetRequests => "x-ratelimit-reset-requests",
            HintSource::OpenAiResetTokens => "x-ratelimit-reset-tokens",
            HintSource::AnthropicRequestsReset => "anthropic-ratelimit-requests-reset",
            HintSource::AnthropicTokensReset => "anthropic-ratelimit-tokens-reset",
            HintSource::AnthropicInputTokensReset => "anthropic-ratelimit-input-tokens-reset",
            HintSource::AnthropicOutputTokensReset => "anthropic-ratelimit-output-tokens-reset",
            HintSource::ErrorBody => "retryDelay",
        }
    }

    /// True for `retry-after-ms` and `retry-after`: the server said "come back after this".
    /// False for reset headers, which only say when a quota refills and are sent on every
    /// response, successful ones included.
    pub(crate) const fn is_explicit(self) -> bool {
        matches!(
            self,
            HintSource::RetryAfterMs | HintSource::RetryAfter | HintSource::ErrorBody
        )
    }

    /// The `-remaining` header that goes with a reset header (none for the explicit sources).
    const fn remaining_header(self) -> Option<&'static str> {
        match self {
            HintSource::RetryAfterMs | HintSource::RetryAfter | HintSource::ErrorBody => None,
            HintSource::OpenAiResetRequests => Some("x-ratelimit-remaining-requests"),
            HintSource::OpenAiResetTokens => Some("x-ratelimit-remaining-tokens"),
            HintSource::AnthropicRequestsReset => Some("anthropic-ratelimit-requests-remaining"),
            HintSource::AnthropicTokensReset => Some("anthropic-ratelimit-tokens-remaining"),
            HintSource::AnthropicInputTokensReset => Some("anthropic-ratelimit-input-tokens-remaining"),
            HintSource::AnthropicOutputTokensReset => Some("anthropic-ratelimit-output-tokens-remaining"),
        }
    }
}

impl fmt::Display for HintSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.header_name())
    }
}

/// A server-directed delay: wait at least `delay` from the moment the response was received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryHint {
    /// How long to wait; zero for a date in the past; at most [`MAX_HINT`].
    pub(crate) delay: Duration,
    /// The header it was read from.
    pub source: HintSource,
}

/// Reset headers in the order they are tried and in which ties are broken.
const RESET_SOURCES: [HintSource; 6] = [
    HintSource::OpenAiResetRequests,
    HintSource::OpenAiResetTokens,
    HintSource::AnthropicRequestsReset,
    HintSource::AnthropicTokensReset,
    HintSource::AnthropicInputTokensReset,
    HintSource::AnthropicOutputTokensReset,
];

/// Reads the server-directed delay of a response, if it has one.
///
/// `now` is the caller's wall-clock time when the response head arrived; it is used for absolute
/// times only when the response has no valid `Date` header (see the module docs).
///
/// Precedence: `retry-after-ms`, then `retry-after`, then the reset headers. The explicit headers
/// win because they answer the question asked ("when may I retry?"); RFC 9110 and the IETF
/// RateLimit draft also give Retry-After precedence over quota fields.
///
/// Among the reset headers: a 429 does not say which limit was exhausted (requests, tokens,
/// input or output tokens), and each reset header says when *its* quota refills. Waiting for
/// the earliest would often come back too soon. So when a reset header's paired `-remaining`
/// header reads `0`, that limit is known to be exhausted and the longest reset among the
/// exhausted limits is taken; when none reads `0` (a token limit can refuse a request that needs
/// more tokens than remain while some remain), the longest reset of all is taken. Both are
/// conservative: never earlier than the limit that refused us can refill. Note that OpenAI's
/// token reset is the time until the bucket is *full* again, which can be minutes.
///
/// Reset headers come on every response, so the caller should only act on a hint whose source
/// is not [`HintSource::is_explicit`] when the status says rate-limited (429).
pub fn parse_hint(headers: &HeaderMap, now: SystemTime) -> Option<RetryHint> {
    if let Some(delay) = single_value(headers, "retry-after-ms").and_then(parse_retry_after_ms) {
        return Some(RetryHint {
            delay,
            source: HintSource::RetryAfterMs,
        });
    }
    let reference = single_value(headers, &DATE)
        .and_then(|v| httpdate::parse_http_date(v).ok())
        .unwrap_or(now);
    if let Some(delay) = single_value(headers, &RETRY_AFTER).and_then(|v| parse_retry_after_value(v, reference)) {
        return Some(RetryHint {
            delay,
            source: HintSource::RetryAfter,
        });
    }

    let mut best: Option<(bool, RetryHint)> = None;
    for source in RESET_SOURCES {
        let Some(value) = single_value(headers, source.header_name()) else {
            continue;
        };
        let delay = match source {
            HintSource::OpenAiResetRequests | HintSource::OpenAiResetTokens => parse_go_duration(value),
            _ => parse_rfc3339(value).map(|at| until(at, reference)),
        };
        let Some(delay) = delay else {
            continue;
        };
        let exhausted = source
            .remaining_header()
            .and_then(|name| single_value(headers, name))
            .and_then(parse_unsigned)
            == Some(0);
        let candidate = (exhausted, RetryHint { delay, source });
        // Exhausted limits outrank the others; then the longer delay; ties keep the first.
        best = match best {
            Some(current) if (current.0, current.1.delay) >= (candidate.0, candidate.1.delay) => Some(current),
            _ => Some(candidate),
        };
    }
    best.map(|(_, hint)| hint)
}

/// Parses a `retry-after-ms` value: a non-negative decimal number of milliseconds, fractions
/// allowed (`1500`, `1500.5`, `.5`). Surrounding spaces or tabs are allowed; signs, exponents,
/// `NaN`, `inf` and anything else are not. Saturates at [`MAX_HINT`].
pub fn parse_retry_after_ms(value: &str) -> Option<Duration> {
    parse_decimal(trim_ows(value), NANOS_PER_MILLI).map(saturating_duration)
}

/// Parses one `Retry-After` value (RFC 9110 §10.2.3) into a delay measured from `now`.
///
/// Accepts `delay-seconds` (leniently also with a fraction, `1.5`, as the OpenAI and Anthropic
/// SDKs do) and the three HTTP-date forms of RFC 9110 §5.6.7:
/// `Sun, 06 Nov 1994 08:49:37 GMT` (IMF-fixdate), `Sunday, 06-Nov-94 08:49:37 GMT` (RFC 850) and
/// `Sun Nov  6 08:49:37 1994` (asctime). A date at or before `now` gives zero. Surrounding spaces
/// or tabs are allowed. Saturates at [`MAX_HINT`].
///
/// The dates are parsed by the `httpdate` crate, which also checks the weekday and maps an
/// RFC 850 two-digit year `70..=99` to 19xx and `00..=69` to 20xx; RFC 9110's "more than 50
/// years in the future" rule would differ only for years 2070-2076 written as `70`-`76`, which
/// no server sends in a Retry-After.
pub fn parse_retry_after_value(value: &str, now: SystemTime) -> Option<Duration> {
    let value = trim_ows(value);
    if value.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return parse_decimal(value, NANOS_PER_SEC).map(saturating_duration);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(until(at, now))
}

/// Parses a Go `time.Duration` string as OpenAI sends in `x-ratelimit-reset-*`: a sequence of
/// decimal numbers, each with an optional fraction and a unit (`ns`, `us`, `µs`, `μs`, `ms`, `s`,
/// `m`, `h`), such as `6m0s`, `1.5s`, `20ms`, `1h2m3.5s`, or the bare `0`. An optional leading
/// `+` is accepted; a negative duration is rejected (`None`), as is a number without a unit.
/// Surrounding spaces or tabs are allowed. Saturates at [`MAX_HINT`] (Go itself reports an
/// overflow past about 292 years).
pub fn parse_go_duration(value: &str) -> Option<Duration> {
    let value = trim_ows(value);
    let mut rest = value.strip_prefix('+').unwrap_or(value);
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let unit_nanos = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => NANOS_PER_MILLI,
            "s" => NANOS_PER_SEC,
            "m" => NANOS_PER_MIN,
            "h" => NANOS_PER_HOUR,
            _ => return None,
        };
        total = total.saturating_add(parse_decimal(number, unit_nanos)?);
        rest = after;
    }
    Some(saturating_duration(total))
}

/// Parses an RFC 3339 `date-time` (§5.6) such as `2026-11-29T10:00:00Z`,
/// `2026-11-29T10:00:00.123456Z` or `2026-11-29T11:00:00+01:00`, strictly: four-digit year,
/// `T` (or `t`), seconds required, a fraction of one or more digits (beyond nanoseconds
/// truncated), and `Z` (or `z`) or a `±HH:MM` offset (`-00:00` counts as UTC). Day of month is
/// checked against the month and leap years; a leap second (`:60`) is read as the first second
/// of the next minute. Surrounding spaces or tabs are allowed; nothing else is.
pub(crate) fn parse_rfc3339(value: &str) -> Option<SystemTime> {
    let s = trim_ows(value).as_bytes();
    // "YYYY-MM-DDTHH:MM:SS" then fraction and offset.
    if s.len() < 20 {
        return None;
    }
    let year = digits(&s[0..4])?;
    let month = digits(&s[5..7])?;
    let day = digits(&s[8..10])?;
    let hour = digits(&s[11..13])?;
    let minute = digits(&s[14..16])?;
    let second = digits(&s[17..19])?;
    if s[4] != b'-' || s[7] != b'-' || !matches!(s[10], b'T' | b't') || s[13] != b':' {
        return None;
    }
    if s[16] != b':'
        || !(1..=12).contains(&month)
        || day == 0
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }

    let mut rest = &s[19..];
    let mut nanos: u64 = 0;
    if let Some(fraction) = rest.strip_prefix(b".") {
        let len = fraction.iter().take_while(|b| b.is_ascii_digit()).count();
        if len == 0 {
            return None;
        }
        for (i, b) in fraction[..len].iter().enumerate().take(9) {
            nanos += u64::from(b - b'0') * 10u64.pow(8 - i as u32);
        }
        rest = &fraction[len..];
    }
    let offset_secs: i64 = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let oh = digits(&[*h1, *h2])?;
            let om = digits(&[*m1, *m2])?;
            if oh > 23 || om > 59 {
                return None;
            }
            let magnitude = i64::from(oh * 3600 + om * 60);
            if *sign == b'+' {
                magnitude
            } else {
                -magnitude
            }
        }
        _ => return None,
    };

    let days = days_from_civil(i64::from(year), month, day);
    // Local time = UTC + offset, so UTC = local - offset.
    let secs = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second) - offset_secs;
    let whole = Duration::from_secs(secs.unsigned_abs());
    let base = if secs >= 0 {
        UNIX_EPOCH.checked_add(whole)?
    } else {
        UNIX_EPOCH.checked_sub(whole)?
    };
    base.checked_add(Duration::from_nanos(nanos))
}

/// The value of a header that is present exactly once, or several times with byte-identical
/// values; ASCII (visible characters, spaces, tabs) only, trimmed of spaces and tabs.
pub(super) fn single_value(headers: &HeaderMap, name: impl http::header::AsHeaderName) -> Option<&str> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    if values.any(|other| other != first) {
        return None;
    }
    first.to_str().ok().map(trim_ows)
}

/// Removes optional whitespace (RFC 9110 §5.6.3: spaces and horizontal tabs) at both ends.
fn trim_ows(value: &str) -> &str {
    value.trim_matches(|c| c == ' ' || c == '\t')
}

/// `[0-9]*("."[0-9]*)`, at least one digit, times `unit_nanos`, in saturating nanoseconds.
/// Fraction digits beyond the 18th are checked but cannot change the result for any unit up to
/// an hour (they weigh less than a nanosecond), so they are not accumulated.
fn parse_decimal(s: &str, unit_nanos: u128) -> Option<u128> {
    let (int_part, frac_part) = match s.split_once('.') {
        Some((i, f)) => (i, f),
        None => (s, ""),
    };
    let all_digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if int_part.len() + frac_part.len() == 0 || !all_digits(int_part) || !all_digits(frac_part) {
        return None;
    }
    let int_value = int_part.bytes().fold(0u128, |acc, b| {
        acc.saturating_mul(10).saturating_add(u128::from(b - b'0'))
    });
    let mut frac_value: u128 = 0;
    let mut scale: u128 = 1;
    for b in frac_part.bytes().take(18) {
        frac_value = frac_value * 10 + u128::from(b - b'0');
        scale *= 10;
    }
    Some(
        int_value
            .saturating_mul(unit_nanos)
            .saturating_add(frac_value * unit_nanos / scale),
    )
}

/// A decimal integer of at most 19 digits (a `-remaining` counter).
pub(super) fn parse_unsigned(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 19 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Nanoseconds to a `Duration`, saturating at [`MAX_HINT`].
fn saturating_duration(nanos: u128) -> Duration {
    if nanos >= MAX_HINT.as_nanos() {
        return MAX_HINT;
    }
    // Below 2^31 seconds, so the seconds fit in a u64.
    Duration::new((nanos / NANOS_PER_SEC) as u64, (nanos % NANOS_PER_SEC) as u32)
}

/// Time from `reference` until `at`: zero when `at` is not in the future; at most [`MAX_HINT`].
pub(super) fn until(at: SystemTime, reference: SystemTime) -> Duration {
    at.duration_since(reference).map_or(Duration::ZERO, |d| d.min(MAX_HINT))
}

/// Exactly `N` ASCII digits as a number.
fn digits(s: &[u8]) -> Option<u32> {
    s.iter().try_fold(0u32, |acc, b| {
        b.is_ascii_digit().then(|| acc * 10 + u32::from(b - b'0'))
    })
}

fn is_leap_year(year: u32) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = (if year >= 0 { year } else { year - 399 }) / 400;
    let year_of_era = year - era * 400;
    let shifted_month = i64::from((month + 9) % 12); // March = 0
    let day_of_year = (153 * shifted_month + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {

    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);
    const SEC: Duration = Duration::from_secs(1);

    /// 2026-11-29T10:00:00Z.
    fn t0() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_795_946_400)
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn t0_is_what_it_says() {
        assert_eq!(httpdate::fmt_http_date(t0()), "Sun, 29 Nov 2026 10:00:00 GMT");
    }

    #[test]
    fn retry_after_ms_table() {
        let ok: &[(&str, Duration)] = &[
            ("1500", MS * 1500),
            ("1500.5", MS * 1500 + Duration::from_micros(500)),
            ("0", Duration::ZERO),
            ("0.0", Duration::ZERO),
            (".5", Duration::from_micros(500)),
            ("7.", MS * 7),
            (" 20\t", MS * 20),
            ("0.000001", Duration::from_nanos(1)),
            ("0.0000001", Duration::ZERO),
            ("60000", SEC * 60),
            ("99999999999999999999999999999999999999999", MAX_HINT),
        ];
        for (input, want) in ok {
            assert_eq!(parse_retry_after_ms(input), Some(*want), "{input:?}");
        }
        let bad = [
            "", " ", ".", "-1", "+5", "NaN", "nan", "inf", "1e3", "1,5", "1 5", "1.5.5", "0x10", "５", "1ms", "١",
        ];
        for input in bad {
            assert_eq!(parse_retry_after_ms(input), None, "{input:?}");
        }
    }

    #[test]
    fn retry_after_seconds_and_dates_table() {
        let now = t0();
        let ok: &[(&str, Duration)] = &[
            ("120", SEC * 120),
            ("0", Duration::ZERO),
            ("1.5", MS * 1500),
            ("  7  ", SEC * 7),
            ("007", SEC * 7),
            // IMF-fixdate, 30 s ahead.
            ("Sun, 29 Nov 2026 10:00:30 GMT", SEC * 30),
            // Obsolete RFC 850 form, two-digit year.
            ("Sunday, 29-Nov-26 10:01:00 GMT", SEC * 60),
            // asctime form, space-padded day.
            ("Sun Nov 29 10:00:05 2026", SEC * 5),
            ("Tue Dec  1 10:00:00 2026", SEC * 2 * 86_400),
            // In the past: no wait.
            ("Sun, 29 Nov 2026 09:59:59 GMT", Duration::ZERO),
            ("Sun, 06 Nov 1994 08:49:37 GMT", Duration::ZERO),
            ("Sunday, 06-Nov-94 08:49:37 GMT", Duration::ZERO),
            ("Sun Nov  6 08:49:37 1994", Duration::ZERO),
            // Exactly now.
            ("Sun, 29 Nov 2026 10:00:00 GMT", Duration::ZERO),
            ("99999999999999999999999", MAX_HINT),
            ("Fri, 31 Dec 9999 23:59:59 GMT", MAX_HINT),
        ];
        for (input, want) in ok {
            assert_eq!(parse_retry_after_value(input, now), Some(*want), "{input:?}");
        }
        let bad = [
            "",
            "-1",
            "+1",
            "soon",
            "1e3",
            "NaN",
            "5, 10",
            "5s",
            // Wrong weekday for that date.
            "Mon, 29 Nov 2026 10:00:30 GMT",
            "Sun, 29 Nov 2026 10:00:30 UTC",
            "Sun, 29 Nov 2026 10:00:30",
            "2026-11-29T10:00:30Z",
            "Sun, 31 Feb 2026 10:00:30 GMT",
            "Sun, 29 Nov 2026 25:00:30 GMT",
        ];
        for input in bad {
            assert_eq!(parse_retry_after_value(input, now), None, "{input:?}");
        }
    }

    #[test]
    fn go_duration_table() {
        let ok: &[(&str, Duration)] = &[
            ("0", Duration::ZERO),
            ("+0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("6m0s", SEC * 360),
            ("1.5s", MS * 1500),
            ("20ms", MS * 20),
            ("1h2m3.5s", SEC * 3723 + MS * 500),
            ("1h", SEC * 3600),
            ("2h45m", SEC * (2 * 3600 + 45 * 60)),
            (".5s", MS * 500),
            ("1.s", SEC),
            ("300ms", MS * 300),
            ("1.5h", SEC * 5400),
            ("100ns", Duration::from_nanos(100)),
            ("5us", Duration::from_micros(5)),
            ("5\u{b5}s", Duration::from_micros(5)),
            ("5\u{3bc}s", Duration::from_micros(5)),
            ("1m1m", SEC * 120),
            ("+2s", SEC * 2),
            (" 7s ", SEC * 7),
            ("0.000000001s", Duration::from_nanos(1)),
            ("99999999999999999999999h", MAX_HINT),
        ];
        for (input, want) in ok {
            assert_eq!(parse_go_duration(input), Some(*want), "{input:?}");
        }
        let bad = [
            "", "+", "-1s", "-0s", "1", "10", "s", ".s", "1.5.5s", "1x", "1S", "1 s", "1d", "1hh", "1h-1m", "h1",
            "NaN", "infs", "1e3s", "1sec",
        ];
        for input in bad {
            assert_eq!(parse_go_duration(input), None, "{input:?}");
        }
    }

    #[test]
    fn rfc3339_table() {
        let t = t0();
        let ok: &[(&str, SystemTime)] = &[
            ("2026-11-29T10:00:00Z", t),
            ("2026-11-29t10:00:00z", t),
            ("2026-11-29T10:00:00.5Z", t + MS * 500),
            ("2026-11-29T10:00:00.123456789Z", t + Duration::from_nanos(123_456_789)),
            (
                "2026-11-29T10:00:00.1234567891234Z",
                t + Duration::from_nanos(123_456_789),
            ),
            ("2026-11-29T11:00:00+01:00", t),
            ("2026-11-29T04:30:00-05:30", t),
            ("2026-11-29T10:00:00-00:00", t),
            ("2026-11-29T10:00:00+00:00", t),
            ("2026-11-29T09:59:60Z", t),
            ("1970-01-01T00:00:00Z", UNIX_EPOCH),
            ("1969-12-31T23:59:59Z", UNIX_EPOCH - SEC),
            ("1969-12-31T23:59:59.25Z", UNIX_EPOCH - MS * 750),
            ("2024-02-29T00:00:00Z", UNIX_EPOCH + SEC * 1_709_164_800),
            ("2000-02-29T00:00:00Z", UNIX_EPOCH + SEC * 951_782_400),
            (" 2026-11-29T10:00:00Z\t", t),
        ];
        for (input, want) in ok {
            assert_eq!(parse_rfc3339(input), Some(*want), "{input:?}");
        }
        let bad = [
            "",
            "2026-11-29",
            "2026-11-29T10:00Z",
            "2026-11-29T10:00:00",
            "2026-11-29 10:00:00Z",
            "2026-11-29T10:00:00.Z",
            "2026-11-29T10:00:00,5Z",
            "2026-11-29T10:00:00+0100",
            "2026-11-29T10:00:00+01",
            "2026-11-29T10:00:00+24:00",
            "2026-11-29T10:00:00+01:60",
            "2026-11-29T10:00:00ZZ",
            "2026-13-01T10:00:00Z",
            "2026-00-01T10:00:00Z",
            "2026-11-00T10:00:00Z",
            "2026-11-31T10:00:00Z",
            "2025-02-29T10:00:00Z",
            "1900-02-29T10:00:00Z",
            "2026-11-29T24:00:00Z",
            "2026-11-29T10:60:00Z",
            "2026-11-29T10:00:61Z",
            "+2026-11-29T10:00:00Z",
            "26-11-29T10:00:00Z",
            "2026-1-29T10:00:00Z",
            "2026-11-29T10:00:00.５Z",
            "２026-11-29T10:00:00Z",
            "1779926400",
            "Sun, 29 Nov 2026 10:00:00 GMT",
        ];
        for input in bad {
            assert_eq!(parse_rfc3339(input), None, "{input:?}");
        }
    }

    #[test]
    fn rfc3339_agrees_with_httpdate() {
        assert_eq!(
            parse_rfc3339("1994-11-06T08:49:37Z"),
            Some(httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap())
        );
    }

    /// Response header fields, and the hint they should give.
    type Case = (Vec<(&'static str, &'static str)>, Option<RetryHint>);

    fn hint(delay: Duration, source: HintSource) -> Option<RetryHint> {
        Some(RetryHint { delay, source })
    }

    #[test]
    fn precedence_and_fallback() {
        let now = t0();
        let reset = [
            ("x-ratelimit-reset-requests", "2s"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ];
        let cases: Vec<Case> = vec![
            (vec![], None),
            (vec![("content-type", "application/json")], None),
            (
                vec![("retry-after-ms", "250"), ("retry-after", "3")],
                hint(MS * 250, HintSource::RetryAfterMs),
            ),
            (
                vec![("Retry-After", "3"), reset[0], reset[1]],
                hint(SEC * 3, HintSource::RetryAfter),
            ),
            // Garbage in a higher source falls through to the next one.
            (
                vec![("retry-after-ms", "NaN"), ("retry-after", "3")],
                hint(SEC * 3, HintSource::RetryAfter),
            ),
            (
                vec![("retry-after-ms", "-5"), ("retry-after", "soon"), reset[0]],
                hint(SEC * 2, HintSource::OpenAiResetRequests),
            ),
            // Several different values: ambiguous, ignored.
            (vec![("retry-after", "3"), ("retry-after", "30")], None),
            (
                vec![("retry-after-ms", "1"), ("retry-after-ms", "2"), ("retry-after", "3")],
                hint(SEC * 3, HintSource::RetryAfter),
            ),
            // The same value twice is not ambiguous.
            (
                vec![("retry-after", "3"), ("retry-after", "3")],
                hint(SEC * 3, HintSource::RetryAfter),
            ),
            // A comma list in one field line is not a number.
            (vec![("retry-after", "3, 30")], None),
            // Zero is a hint (retry now), not an absence.
            (
                vec![("retry-after", "0"), reset[1]],
                hint(Duration::ZERO, HintSource::RetryAfter),
            ),
        ];
        for (pairs, want) in cases {
            assert_eq!(parse_hint(&headers(&pairs), now), want, "{pairs:?}");
        }
    }

    #[test]
    fn non_ascii_values_are_ignored() {
        let mut map = HeaderMap::new();
        map.insert("retry-after", HeaderValue::from_bytes(b"3\xe9").unwrap());
        map.insert(
            "x-ratelimit-reset-requests",
            HeaderValue::from_bytes("5\u{b5}s".as_bytes()).unwrap(),
        );
        assert_eq!(parse_hint(&map, t0()), None);
        map.insert("x-ratelimit-reset-tokens", HeaderValue::from_static("1s"));
        assert_eq!(parse_hint(&map, t0()), hint(SEC, HintSource::OpenAiResetTokens));
    }

    #[test]
    fn reset_headers_take_the_longest() {
        let now = t0();
        let cases: Vec<Case> = vec![
            (
                vec![
                    ("x-ratelimit-reset-requests", "1s"),
                    ("x-ratelimit-reset-tokens", "6m0s"),
                ],
                hint(SEC * 360, HintSource::OpenAiResetTokens),
            ),
            (
                vec![
                    ("anthropic-ratelimit-requests-reset", "2026-11-29T10:00:20Z"),
                    ("anthropic-ratelimit-tokens-reset", "2026-11-29T10:00:05Z"),
                    ("anthropic-ratelimit-input-tokens-reset", "2026-11-29T10:00:30.5Z"),
                    ("anthropic-ratelimit-output-tokens-reset", "2026-11-29T10:00:01Z"),
                ],
                hint(SEC * 30 + MS * 500, HintSource::AnthropicInputTokensReset),
            ),
            // A past reset counts as zero; a garbage one is skipped.
            (
                vec![
                    ("anthropic-ratelimit-requests-reset", "2026-11-29T09:00:00Z"),
                    ("anthropic-ratelimit-tokens-reset", "tomorrow"),
                ],
                hint(Duration::ZERO, HintSource::AnthropicRequestsReset),
            ),
            // Ties keep the first in the documented order.
            (
                vec![("x-ratelimit-reset-tokens", "5s"), ("x-ratelimit-reset-requests", "5s")],
                hint(SEC * 5, HintSource::OpenAiResetRequests),
            ),
            // A limit known to be exhausted wins over a longer one that still has quota.
            (
                vec![
                    ("x-ratelimit-reset-requests", "1s"),
                    ("x-ratelimit-remaining-requests", "0"),
                    ("x-ratelimit-reset-tokens", "6m0s"),
                    ("x-ratelimit-remaining-tokens", "149000"),
                ],
                hint(SEC, HintSource::OpenAiResetRequests),
            ),
            // Several exhausted: the longest of those.
            (
                vec![
                    ("anthropic-ratelimit-requests-reset", "2026-11-29T10:00:02Z"),
                    ("anthropic-ratelimit-requests-remaining", "0"),
                    ("anthropic-ratelimit-tokens-reset", "2026-11-29T10:00:09Z"),
                    ("anthropic-ratelimit-tokens-remaining", "0"),
                    ("anthropic-ratelimit-output-tokens-reset", "2026-11-29T10:01:00Z"),
                    ("anthropic-ratelimit-output-tokens-remaining", "10"),
                ],
                hint(SEC * 9, HintSource::AnthropicTokensReset),
            ),
            // A garbage remaining value says nothing: back to the longest of all.
            (
                vec![
                    ("x-ratelimit-reset-requests", "1s"),
                    ("x-ratelimit-remaining-requests", "-0"),
                    ("x-ratelimit-reset-tokens", "6m0s"),
                ],
                hint(SEC * 360, HintSource::OpenAiResetTokens),
            ),
        ];
        for (pairs, want) in cases {
            assert_eq!(parse_hint(&headers(&pairs), now), want, "{pairs:?}");
        }
    }

    #[test]
    fn absolute_times_are_measured_against_the_date_header() {
        // Our clock runs 100 s ahead of the server's.
        let now = t0() + SEC * 100;
        let date = ("date", "Sun, 29 Nov 2026 10:00:00 GMT");
        let cases: Vec<Case> = vec![
            (
                vec![date, ("retry-after", "Sun, 29 Nov 2026 10:00:30 GMT")],
                hint(SEC * 30, HintSource::RetryAfter),
            ),
            (
                vec![("retry-after", "Sun, 29 Nov 2026 10:00:30 GMT")],
                hint(Duration::ZERO, HintSource::RetryAfter),
            ),
            (
                vec![date, ("anthropic-ratelimit-requests-reset", "2026-11-29T10:00:12Z")],
                hint(SEC * 12, HintSource::AnthropicRequestsReset),
            ),
            // A garbage Date falls back to our clock.
            (
                vec![("date", "yesterday"), ("retry-after", "Sun, 29 Nov 2026 10:02:00 GMT")],
                hint(SEC * 20, HintSource::RetryAfter),
            ),
            // delay-seconds is relative: Date plays no part.
            (vec![date, ("retry-after", "4")], hint(SEC * 4, HintSource::RetryAfter)),
        ];
        for (pairs, want) in cases {
            assert_eq!(parse_hint(&headers(&pairs), now), want, "{pairs:?}");
        }
    }

    #[test]
    fn source_names() {
        assert_eq!(HintSource::RetryAfter.to_string(), "retry-after");
        assert!(HintSource::RetryAfterMs.is_explicit());
        for s in RESET_SOURCES {
            assert!(!s.is_explicit());
            assert!(s.remaining_header().is_some());
            assert!(s.header_name().ends_with("reset") || s.header_name().contains("-reset-"));
            http::header::HeaderName::from_static(s.header_name());
        }
    }

    /// Splits `Sun, 06 Nov 1994 08:49:37 GMT` into an RFC 3339 string: an oracle independent of
    /// our calendar arithmetic.
    fn imf_to_rfc3339(imf: &str) -> String {
        let month = match &imf[8..11] {
            "Jan" => 1,
            "Feb" => 2,
            "Mar" => 3,
            "Apr" => 4,
            "May" => 5,
            "Jun" => 6,
            "Jul" => 7,
            "Aug" => 8,
            "Sep" => 9,
            "Oct" => 10,
            "Nov" => 11,
            "Dec" => 12,
            other => panic!("{other}"),
        };
        format!("{}-{month:02}-{}T{}Z", &imf[12..16], &imf[5..7], &imf[17..25])
    }

    const HEADER_NAMES: [&str; 14] = [
        "retry-after-ms",
        "retry-after",
        "date",
        "x-ratelimit-reset-requests",
        "x-ratelimit-reset-tokens",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-remaining-tokens",
        "anthropic-ratelimit-requests-reset",
        "anthropic-ratelimit-tokens-reset",
        "anthropic-ratelimit-input-tokens-reset",
        "anthropic-ratelimit-output-tokens-reset",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-output-tokens-remaining",
    ];

    /// The crate's property-test configuration (`crate::testing`): a fixed seed unless
    /// `REBOUND_FUZZ_SEED` says otherwise, no regression files, more cases with
    /// `REBOUND_FUZZ_SCALE`.
    fn proptest_config(cases: u32) -> ProptestConfig {
        crate::testing::proptest_config(cases)
    }

    proptest! {
        #![proptest_config(proptest_config(512))]

        #[test]
        fn parsers_never_panic(s in any::<String>(), now in any::<u64>()) {
            let now = UNIX_EPOCH + Duration::from_millis(now);
            for d in [
                parse_retry_after_ms(&s),
                parse_retry_after_value(&s, now),
                parse_go_duration(&s),
            ].into_iter().flatten() {
                prop_assert!(d <= MAX_HINT);
            }
            let _ = parse_rfc3339(&s);
        }

        #[test]
        fn parsers_never_panic_on_near_misses(s in "[0-9.:+TZtz -]{0,40}") {
            let _ = parse_rfc3339(&s);
            let _ = parse_go_duration(&s);
            let _ = parse_retry_after_ms(&s);
            let _ = parse_retry_after_value(&s, UNIX_EPOCH);
        }

        #[test]
        fn go_durations_never_panic_on_near_misses(s in "[0-9.]{0,6}(ns|us|ms|s|m|h|µs|x|){0,4}") {
            let _ = parse_go_duration(&s);
        }

        #[test]
        fn parse_hint_never_panics(
            fields in proptest::collection::vec(
                (0..HEADER_NAMES.len(), proptest::collection::vec(any::<u8>(), 0..40)),
                0..8,
            ),
            now in any::<i64>(),
        ) {
            let mut map = HeaderMap::new();
            for (name, value) in fields {
                if let Ok(value) = HeaderValue::from_bytes(&value) {
                    map.append(HEADER_NAMES[name], value);
                }
            }
            let now = if now >= 0 {
                UNIX_EPOCH + Duration::from_secs(now.unsigned_abs() / 4)
            } else {
                UNIX_EPOCH - Duration::from_secs(now.unsigned_abs() / 4)
            };
            if let Some(h) = parse_hint(&map, now) {
                prop_assert!(h.delay <= MAX_HINT);
            }
        }

        #[test]
        fn seconds_round_trip(secs in 0u32..(1 << 31), millis in 0u32..1000) {
            let whole = Duration::from_secs(u64::from(secs));
            prop_assert_eq!(parse_retry_after_value(&secs.to_string(), t0()), Some(whole));
            let frac = whole + MS * millis;
            prop_assert_eq!(
                parse_retry_after_value(&format!("{secs}.{millis:03}"), t0()),
                Some(frac)
            );
            prop_assert_eq!(
                parse_retry_after_ms(&format!("{}", u64::from(secs) * 1000 + u64::from(millis))),
                Some(frac)
            );
        }

        #[test]
        fn http_dates_round_trip(ahead in 0u64..10_000_000, now_secs in 0u64..4_000_000_000) {
            let now = UNIX_EPOCH + Duration::from_secs(now_secs);
            let imf = httpdate::fmt_http_date(now + Duration::from_secs(ahead));
            prop_assert_eq!(parse_retry_after_value(&imf, now), Some(Duration::from_secs(ahead)));
        }

        #[test]
        fn go_durations_round_trip(
            h in 0u64..10_000,
            m in 0u64..60,
            s in 0u64..60,
            frac in 0u64..1_000_000_000,
            ms in 0u64..1000,
        ) {
            let want = Duration::from_secs(h * 3600 + m * 60 + s)
                + Duration::from_nanos(frac)
                + Duration::from_millis(ms);
            let text = format!("{h}h{m}m{s}.{frac:09}s{ms}ms");
            prop_assert_eq!(parse_go_duration(&text), Some(want));
            // Go's own formatting of a duration below one hour: "{m}m{s}.{frac}s".
            let short = Duration::from_secs(m * 60 + s) + Duration::from_nanos(frac);
            let go = if m > 0 { format!("{m}m{s}.{frac:09}s") } else { format!("{s}.{frac:09}s") };
            prop_assert_eq!(parse_go_duration(&go), Some(short));
        }

        #[test]
        fn rfc3339_matches_httpdate(secs in 0u64..253_402_300_800, nanos in 0u32..1_000_000_000) {
            let at = UNIX_EPOCH + Duration::from_secs(secs);
            let text = imf_to_rfc3339(&httpdate::fmt_http_date(at));
            prop_assert_eq!(parse_rfc3339(&text), Some(at));
            let with_frac = format!("{}.{nanos:09}Z", text.trim_end_matches('Z'));
            prop_assert_eq!(parse_rfc3339(&with_frac), Some(at + Duration::from_nanos(u64::from(nanos))));
        }

        #[test]
        fn rfc3339_offsets_shift(secs in 86_400u64..4_000_000_000, oh in 0u64..24, om in 0u64..60) {
            let at = UNIX_EPOCH + Duration::from_secs(secs);
            let offset = Duration::from_secs(oh * 3600 + om * 60);
            // The same instant written in local time at +HH:MM reads `offset` later.
            let local = imf_to_rfc3339(&httpdate::fmt_http_date(at + offset));
            let text = format!("{}+{oh:02}:{om:02}", local.trim_end_matches('Z'));
            prop_assert_eq!(parse_rfc3339(&text), Some(at));
        }
    }
}
