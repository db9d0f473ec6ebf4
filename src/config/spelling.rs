//! The config's own spellings of its enum values, defined once: the validator reads them, and
//! `rebound check` and the docs print them (never the Rust names).

use super::{Balance, CooldownMode, LogFormat, NonIdempotent, OnConcurrent, OnStoreError, PacingMode, RateLimitScope};

use crate::words::spelled;
#[cfg(test)]
use crate::words::Spelled;

spelled!(LogFormat { "json" => Json, "text" => Text });
spelled!(CooldownMode { "wait" => Wait, "reject" => Reject, "off" => Off });
spelled!(PacingMode { "wait" => Wait, "off" => Off });
spelled!(RateLimitScope { "model" => Model, "credential" => Credential });
spelled!(NonIdempotent { "all" => All, "safe-only" => SafeOnly });
spelled!(OnConcurrent { "follow" => Follow, "wait" => Wait, "conflict" => Conflict });
spelled!(OnStoreError { "fail_closed" => FailClosed, "fail_open" => FailOpen });
spelled!(Balance { "ordered" => Ordered, "weighted" => Weighted, "least_loaded" => LeastLoaded });

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T: Spelled + std::fmt::Debug>(as_str: fn(T) -> &'static str) {
        for (name, value) in T::CHOICES {
            assert_eq!(as_str(*value), *name, "{value:?}");
            assert!(
                name.chars().all(|c| c.is_ascii_lowercase() || c == '_' || c == '-'),
                "{name}"
            );
        }
    }

    #[test]
    fn every_value_has_one_spelling_in_the_configs_own_words() {
        round_trips(LogFormat::as_str);
        round_trips(CooldownMode::as_str);
        round_trips(PacingMode::as_str);
        round_trips(RateLimitScope::as_str);
        round_trips(NonIdempotent::as_str);
        round_trips(OnConcurrent::as_str);
        round_trips(OnStoreError::as_str);
        round_trips(Balance::as_str);
        assert_eq!(OnStoreError::FailClosed.as_str(), "fail_closed");
        assert_eq!(NonIdempotent::SafeOnly.as_str(), "safe-only");
    }
}
