//! The config's own spellings of its enum values, defined once: the validator reads them, and
//! `rebound check` and the docs print them (never the Rust names).

use super::{Balance, CooldownMode, LogFormat, NonIdempotent, OnConcurrent, OnStoreError, PacingMode, RateLimitScope};

/// An enum value with a spelling in the config file.
pub(crate) trait Spelled: Copy + PartialEq + 'static {
    /// Every value with its spelling, the default first where there is one.
    const CHOICES: &'static [(&'static str, Self)];

    /// The spelling the config uses for it.
    fn as_str(self) -> &'static str {
        Self::CHOICES
            .iter()
            .find(|(_, v)| *v == self)
            .map_or("?", |(name, _)| *name)
    }
}

macro_rules! spelled {
    ($ty:ident { $($name:literal => $variant:ident),+ $(,)? }) => {
        impl Spelled for $ty {
            const CHOICES: &'static [(&'static str, $ty)] = &[$(($name, $ty::$variant)),+];
        }
    };
}

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

    fn round_trips<T: Spelled + std::fmt::Debug>() {
        for (name, value) in T::CHOICES {
            assert_eq!(value.as_str(), *name, "{value:?}");
            assert!(
                name.chars().all(|c| c.is_ascii_lowercase() || c == '_' || c == '-'),
                "{name}"
            );
        }
    }

    #[test]
    fn every_value_has_one_spelling_in_the_configs_own_words() {
        round_trips::<LogFormat>();
        round_trips::<CooldownMode>();
        round_trips::<PacingMode>();
        round_trips::<RateLimitScope>();
        round_trips::<NonIdempotent>();
        round_trips::<OnConcurrent>();
        round_trips::<OnStoreError>();
        round_trips::<Balance>();
        assert_eq!(OnStoreError::FailClosed.as_str(), "fail_closed");
        assert_eq!(NonIdempotent::SafeOnly.as_str(), "safe-only");
    }
}
