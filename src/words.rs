//! The words rebound spells in more than one place (a metric's label, a log field, the config, an
//! error body, `rebound check`): each is an enum whose spellings are defined once, by
//! [`spelled!`], where the enum lives or here when every layer reads it. Metrics take the enums,
//! never a copy of their spellings.

/// An enum value with one spelling.
pub(crate) trait Spelled: Copy + PartialEq + 'static {
    /// Every value with its spelling, the default first where there is one.
    const CHOICES: &'static [(&'static str, Self)];

    /// The value spelled `s`.
    fn parse(s: &str) -> Option<Self> {
        Self::CHOICES.iter().find(|(name, _)| *name == s).map(|(_, v)| *v)
    }
}

/// Defines the spellings of an enum's values, once: an inherent `const fn as_str` (a `match`,
/// no search), `ALL` (every value, in this order) and [`Spelled`] (the list, for parsing and for
/// `rebound check`).
macro_rules! spelled {
    ($ty:ident { $($name:expr => $variant:ident),+ $(,)? }) => {
        // As public as the enum it spells (some are the crate's only).
        #[allow(unreachable_pub)]
        impl $ty {
            /// Every value, in the order of its spellings.
            #[allow(dead_code)] // not every enum needs the list
            pub const ALL: [$ty; [$($name),+].len()] = [$($ty::$variant),+];

            /// Every spelling, in order: a metric's label values.
            #[allow(dead_code)] // not every enum needs the list
            pub const NAMES: [&'static str; [$($name),+].len()] = [$($name),+];

            /// Its one spelling.
            #[allow(dead_code)] // an enum that is only a metric's label values needs `NAMES`
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl $crate::words::Spelled for $ty {
            const CHOICES: &'static [(&'static str, $ty)] = &[$(($name, $ty::$variant)),+];
        }
    };
}
pub(crate) use spelled;

/// An open circuit: why the loop stopped before an attempt, why a request left a target, and
/// rebound's error code for it.
pub(crate) const CIRCUIT_OPEN: &str = "circuit_open";

/// A credential told to wait (a 429's reset the fleet holds): why the loop stopped before an
/// attempt, why a request left a target, and rebound's error code for it.
pub(crate) const COOLDOWN: &str = "cooldown";

/// No cloud credential could be had: why the loop stopped before an attempt, and rebound's error
/// code for it.
pub(crate) const CREDENTIAL_UNAVAILABLE: &str = "credential_unavailable";
/// A target's `concurrency` limit had no room for the request within its wait.
pub(crate) const CONCURRENCY_LIMITED: &str = "concurrency_limited";

/// Why the retry loop delivered an outcome rather than retrying it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// A success.
    Success,
    /// Not retryable: a permanent failure, or not named by the policy.
    NotRetryable,
    /// `non_idempotent = "safe-only"` and the provider may have processed the request.
    UnsafeToReplay,
    /// The attempts (or the single retry of a `retry_once_on` outcome) are used up.
    Exhausted,
    /// The provider's Retry-After is longer than `max_retry_after`.
    HintTooLong,
    /// The wait would end past the deadline.
    Deadline,
    /// The route's retry budget is spent.
    BudgetExhausted,
    /// Every circuit the route may use is open (decided before an attempt, not by `decide`).
    CircuitOpen,
    /// The provider told this credential to wait, and the request cannot (decided before an
    /// attempt).
    Cooldown,
    /// No cloud credential could be had for the upstream (decided before an attempt).
    CredentialUnavailable,
    /// The target's concurrency limit had no room within the request's wait (decided before an
    /// attempt).
    ConcurrencyLimited,
}

// The `reason` of the log line, of a dead letter and of `rebound_dead_letters_total`, and the
// error class of a failure rebound did not try. (Earlier builds logged `attempts_exhausted` and
// `deadline`.)
spelled!(Stop {
    "success" => Success,
    "not_retryable" => NotRetryable,
    "unsafe_to_replay" => UnsafeToReplay,
    "retries_exhausted" => Exhausted,
    "retry_after_too_long" => HintTooLong,
    "deadline_exceeded" => Deadline,
    "budget_exhausted" => BudgetExhausted,
    CIRCUIT_OPEN => CircuitOpen,
    COOLDOWN => Cooldown,
    CREDENTIAL_UNAVAILABLE => CredentialUnavailable,
    CONCURRENCY_LIMITED => ConcurrencyLimited,
});

impl Stop {
    /// The reasons a failure becomes a dead letter (`rebound_dead_letters_total{reason}`, in this
    /// order): rebound stopped retrying something transient, or could not try at all.
    /// `NotRetryable` (a permanent 4xx is the app's to see) and `Success` are not.
    pub(crate) const DEAD_LETTER: [Stop; 9] = [
        Stop::Exhausted,
        Stop::BudgetExhausted,
        Stop::Deadline,
        Stop::HintTooLong,
        Stop::UnsafeToReplay,
        Stop::CircuitOpen,
        Stop::Cooldown,
        Stop::CredentialUnavailable,
        Stop::ConcurrencyLimited,
    ];

    /// Whether a failure delivered for this reason is a dead letter.
    pub(crate) fn is_dead_letter(self) -> bool {
        Stop::DEAD_LETTER.contains(&self)
    }
}

/// What said a provider had too much: an overload signal that shrinks an adaptive `concurrency`
/// limit (`limits::aimd`), the `signal` label of `rebound_concurrency_adjustments_total` (which
/// adds `success` for an increase).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Signal {
    /// A 429 with no reset or a short one.
    RateLimited,
    /// A 502, 503 or 504: the provider, or the gateway in front of it, shedding.
    Unavailable,
    /// A 529, an in-band `overloaded_error`, Bedrock's ServiceUnavailableException.
    Overloaded,
    /// No first byte within `first_byte_timeout`.
    FirstByteTimeout,
    /// The time to first byte well above its floor.
    SlowFirstByte,
}

spelled!(Signal {
    "rate_limited" => RateLimited,
    "unavailable" => Unavailable,
    "overloaded" => Overloaded,
    "first_byte_timeout" => FirstByteTimeout,
    "slow_first_byte" => SlowFirstByte,
});

/// What one attempt came to, as `rebound_upstream_attempts_total{outcome}`, an attempt's record
/// and its span count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptOutcome {
    Ok,
    Status4xx,
    Status429,
    Status5xx,
    ConnectFailure,
    Reset,
    Timeout,
    /// An error object where the response's first event (or its JSON body) was.
    StreamError,
}

spelled!(AttemptOutcome {
    "ok" => Ok,
    "status_4xx" => Status4xx,
    "status_429" => Status429,
    "status_5xx" => Status5xx,
    "connect_failure" => ConnectFailure,
    "reset" => Reset,
    "timeout" => Timeout,
    "stream_error" => StreamError,
});

/// What a target is to the credential the sidecar sets for it, as `rebound_target_state{state}`
/// reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TargetState {
    Available,
    Cooling,
    Paced,
    Exhausted,
    /// Its circuit is open.
    Open,
}

spelled!(TargetState {
    "available" => Available,
    "cooling" => Cooling,
    "paced" => Paced,
    "exhausted" => Exhausted,
    "open" => Open,
});

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trips<T: Spelled + std::fmt::Debug>(as_str: fn(T) -> &'static str) {
        let mut seen = std::collections::HashSet::new();
        for (name, value) in T::CHOICES {
            assert_eq!(as_str(*value), *name, "{value:?}");
            assert_eq!(T::parse(name), Some(*value));
            assert!(seen.insert(*name), "{name} spelled twice");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{name}"
            );
        }
    }

    #[test]
    fn every_value_has_one_spelling() {
        round_trips(Stop::as_str);
        round_trips(AttemptOutcome::as_str);
        round_trips(TargetState::as_str);
        assert_eq!(Stop::ALL.len(), 11);
        round_trips(Signal::as_str);
        assert_eq!(AttemptOutcome::ALL.map(AttemptOutcome::as_str)[2], "status_429");
        assert_eq!(
            Stop::Deadline.as_str(),
            "deadline_exceeded",
            "the error code of the same stop"
        );
        // Metrics index their children by the value: `ALL` must be in declaration order.
        for (i, o) in AttemptOutcome::ALL.iter().enumerate() {
            assert_eq!(*o as usize, i, "{o:?}");
        }
    }

    #[test]
    fn the_dead_letter_reasons_are_failures_rebound_stopped_on() {
        assert!(!Stop::Success.is_dead_letter());
        assert!(!Stop::NotRetryable.is_dead_letter());
        assert!(Stop::DEAD_LETTER.iter().all(|s| s.is_dead_letter()));
        assert_eq!(Stop::DEAD_LETTER.len() + 2, Stop::ALL.len());
    }
}
