//! The IETF RateLimit header fields (draft-ietf-httpapi-ratelimit-headers) a limited route's
//! responses carry, for the tightest of its limits: `RateLimit-Policy: "team";q=600;w=60` (the
//! quota policy) and `RateLimit: "team";r=42;t=17` (what is left, and the seconds until the
//! window ends), each one Structured Field list item named by the limit (an sf-string), with
//! integer parameters; and `retry-after` for a 429.
//!
//! Units. Requests are the draft's default and carry no `qu`; concurrent requests are its
//! registered `qu="concurrent-requests"`. Tokens and spend have no registered unit (the
//! registry holds request, content-bytes and concurrent-requests): they are sent as
//! `qu="tokens"` and `qu="usd-micros"`. The draft makes `qu` an sf-string and a field with an
//! unknown unit is well formed, so a client that knows the unit gets the limit that most often
//! binds an LLM client in the one standard form, and the limit's name and unit say what it is;
//! leaving token limits out would show a request limit that is not the one about to refuse, and
//! converting tokens to requests would invent numbers. A concurrency limit has no window: no `w`
//! and no `t`.
//!
//! Decides: which limit is the tightest (the least fraction left) and the fields' exact bytes.
//! Does not decide which limits a route is under, nor their numbers (the ledgers').

use http::header::{HeaderName, HeaderValue};

/// `RateLimit-Policy` (the quota policies).
pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (the service limits now).
pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// What a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    Requests,
    ConcurrentRequests,
    /// Input and output tokens.
    Tokens,
    /// Spend, in micro-USD.
    MicroUsd,
}

impl Unit {
    /// The `qu` parameter's value; none for requests (the draft's default).
    fn qu(self) -> Option<&'static str> {
        match self {
            Unit::Requests => None,
            Unit::ConcurrentRequests => Some("concurrent-requests"),
            Unit::Tokens => Some("tokens"),
            Unit::MicroUsd => Some("usd-micros"),
        }
    }
}

/// One limit's state as a response reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Status<'a> {
    /// The limit's name (`[limits.NAME]`).
    pub(crate) name: &'a str,
    pub(crate) unit: Unit,
    /// The quota per window (`q`).
    pub(crate) quota: u64,
    /// The window's length in seconds (`w`); none for concurrency.
    pub(crate) window_secs: Option<u64>,
    /// What is left now (`r`, at most the quota).
    pub(crate) remaining: u64,
    /// Seconds until the window ends (`t`); none for concurrency.
    pub(crate) reset_secs: Option<u64>,
}

/// The tightest limit: the one with the least fraction of its quota left (a quota of 0 has
/// nothing left); the first of equals.
pub(crate) fn tightest<'s, 'a>(limits: &'s [Status<'a>]) -> Option<&'s Status<'a>> {
    limits.iter().min_by(|a, b| {
        let (ra, qa) = a.fraction();
        let (rb, qb) = b.fraction();
        (ra * qb).cmp(&(rb * qa))
    })
}

impl Status<'_> {
    /// `remaining / quota` as a fraction, `0 / 1` for a quota of 0.
    fn fraction(&self) -> (u128, u128) {
        if self.quota == 0 {
            (0, 1)
        } else {
            (u128::from(self.remaining.min(self.quota)), u128::from(self.quota))
        }
    }

    /// The `RateLimit-Policy` field's value, e.g. `"team";q=200000;qu="tokens";w=60`.
    pub(crate) fn policy(&self) -> HeaderValue {
        let mut out = sf_string(self.name);
        push_integer(&mut out, "q", self.quota);
        if let Some(unit) = self.unit.qu() {
            out.push_str(";qu=");
            out.push_str(&sf_string(unit));
        }
        if let Some(w) = self.window_secs {
            push_integer(&mut out, "w", w);
        }
        value(out)
    }

    /// The `RateLimit` field's value, e.g. `"team";r=42;t=17`.
    pub(crate) fn ratelimit(&self) -> HeaderValue {
        let mut out = sf_string(self.name);
        push_integer(&mut out, "r", self.remaining.min(self.quota));
        if let Some(t) = self.reset_secs {
            push_integer(&mut out, "t", t);
        }
        value(out)
    }
}

/// `retry-after` in whole seconds, rounded up and at least 1 (a client that waits this long finds
/// the next window).
pub(crate) fn retry_after(ms: u64) -> HeaderValue {
    HeaderValue::from(ms.div_ceil(1000).max(1))
}

/// The largest sf-integer (15 digits).
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

fn push_integer(out: &mut String, key: &str, n: u64) {
    out.push(';');
    out.push_str(key);
    out.push('=');
    out.push_str(itoa::Buffer::new().format(n.min(SF_INTEGER_MAX)));
}

/// An sf-string (RFC 8941 §3.3.3): `"` and `\` escaped; a character outside visible ASCII and
/// space (which the type cannot hold) becomes `?` (the config layer keeps names to ASCII).
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

fn value(text: String) -> HeaderValue {
    // Visible ASCII only (sf_string and integers): always a valid value.
    HeaderValue::try_from(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(name: &str, unit: Unit, quota: u64, remaining: u64) -> Status<'_> {
        Status {
            name,
            unit,
            quota,
            window_secs: Some(60),
            remaining,
            reset_secs: Some(17),
        }
    }

    #[test]
    fn a_request_limit_is_sent_in_the_draft_s_default_unit() {
        let s = status("team", Unit::Requests, 600, 42);
        assert_eq!(s.policy(), "\"team\";q=600;w=60");
        assert_eq!(s.ratelimit(), "\"team\";r=42;t=17");
    }

    #[test]
    fn tokens_spend_and_concurrency_name_their_unit() {
        let t = status("tpm", Unit::Tokens, 200_000, 150_000);
        assert_eq!(t.policy(), "\"tpm\";q=200000;qu=\"tokens\";w=60");
        assert_eq!(t.ratelimit(), "\"tpm\";r=150000;t=17");
        let mut usd = status("budget", Unit::MicroUsd, 100_000_000, 5);
        usd.window_secs = Some(86_400);
        usd.reset_secs = Some(3_600);
        assert_eq!(usd.policy(), "\"budget\";q=100000000;qu=\"usd-micros\";w=86400");
        assert_eq!(usd.ratelimit(), "\"budget\";r=5;t=3600");
        let c = Status {
            name: "llm",
            unit: Unit::ConcurrentRequests,
            quota: 50,
            window_secs: None,
            remaining: 7,
            reset_secs: None,
        };
        assert_eq!(c.policy(), "\"llm\";q=50;qu=\"concurrent-requests\"");
        assert_eq!(c.ratelimit(), "\"llm\";r=7");
    }

    #[test]
    fn names_are_sf_strings_and_numbers_sf_integers() {
        let s = status("a \"b\" \\ é", Unit::Requests, u64::MAX, u64::MAX);
        assert_eq!(s.policy(), "\"a \\\"b\\\" \\\\ ?\";q=999999999999999;w=60");
        // What is left never exceeds the quota.
        let s = status("x", Unit::Requests, 10, 12);
        assert_eq!(s.ratelimit(), "\"x\";r=10;t=17");
    }

    #[test]
    fn the_tightest_limit_has_the_least_fraction_left() {
        let limits = [
            status("rpm", Unit::Requests, 600, 300),               // 1/2
            status("tpm", Unit::Tokens, 200_000, 20_000),          // 1/10
            status("day", Unit::MicroUsd, 100_000_000, 9_000_000), // 9/100
            status("other", Unit::Requests, 100, 9),               // 9/100, later
        ];
        assert_eq!(tightest(&limits).map(|s| s.name), Some("day"));
        let zero = [limits[0], status("off", Unit::Requests, 0, 0)];
        assert_eq!(tightest(&zero).map(|s| s.name), Some("off"));
        assert_eq!(tightest(&[]), None);
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after(45_000), "45");
        assert_eq!(retry_after(45_001), "46");
        assert_eq!(retry_after(0), "1");
        assert_eq!(RATELIMIT.as_str(), "ratelimit");
        assert_eq!(RATELIMIT_POLICY.as_str(), "ratelimit-policy");
    }
}
