//! `Prefer: respond-async` (RFC 7240): whether a request asks to be answered asynchronously, and
//! the `Prefer` value a job's own run is sent with.

use http::HeaderMap;

use super::JobRun;

/// Whether the request asks to be answered asynchronously (`Prefer: respond-async`, among any
/// other preferences, in any of several `Prefer` headers) and is not a job's own run.
pub(crate) fn wants_async(parts: &http::request::Parts) -> bool {
    parts.extensions.get::<JobRun>().is_none() && prefers_async(&parts.headers)
}

fn preferences(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').filter(|p| !p.trim().is_empty())
}

fn preference_token(pref: &str) -> &str {
    pref.split([';', '=']).next().unwrap_or("").trim()
}

/// RFC 7240: `Prefer` holds comma-separated preferences, each `token [= value] *(; param)`.
pub fn prefers_async(headers: &HeaderMap) -> bool {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(preferences)
        .any(|p| preference_token(p).eq_ignore_ascii_case("respond-async"))
}

/// A `Prefer` value without `respond-async` (`None` when nothing else is left).
pub(super) fn without_respond_async(value: &str) -> Option<String> {
    let rest: Vec<&str> = preferences(value)
        .filter(|p| !preference_token(p).eq_ignore_ascii_case("respond-async"))
        .map(str::trim)
        .collect();
    (!rest.is_empty()).then(|| rest.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefer(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("prefer", v.parse().unwrap());
        }
        h
    }

    #[test]
    fn respond_async_among_other_preferences() {
        assert!(prefers_async(&prefer(&["respond-async"])));
        assert!(prefers_async(&prefer(&["Respond-Async"])));
        assert!(prefers_async(&prefer(&["return=minimal, respond-async, wait=10"])));
        assert!(prefers_async(&prefer(&["wait=10", "respond-async; foo=bar"])));
        assert!(!prefers_async(&prefer(&["return=representation"])));
        assert!(!prefers_async(&prefer(&["respond-asynchronously"])));
        assert!(!prefers_async(&prefer(&["foo=respond-async"])));
        assert!(!prefers_async(&HeaderMap::new()));
    }

    #[test]
    fn a_run_drops_only_respond_async() {
        assert_eq!(without_respond_async("respond-async"), None);
        assert_eq!(
            without_respond_async("respond-async, wait=10 ,return=minimal").as_deref(),
            Some("wait=10, return=minimal")
        );
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(crate::testing::proptest_config(512))]

            /// Any header value: no panic, and what is left after removing `respond-async`
            /// never asks for it.
            #[test]
            fn any_prefer_value(value in "[ -~]{0,80}", with in any::<bool>()) {
                let value = if with { format!("{value}, respond-async") } else { value };
                let mut headers = HeaderMap::new();
                if let Ok(v) = http::HeaderValue::from_str(&value) {
                    headers.insert("prefer", v);
                    prop_assert!(!with || prefers_async(&headers));
                }
                if let Some(rest) = without_respond_async(&value) {
                    let mut h = HeaderMap::new();
                    if let Ok(v) = http::HeaderValue::from_str(&rest) {
                        h.insert("prefer", v);
                        prop_assert!(!prefers_async(&h), "{rest:?}");
                    }
                }
            }
        }
    }
}
