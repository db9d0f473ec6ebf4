//! The jitter applied to retry backoff (`[retry.NAME] jitter`): a configuration value type, used
//! by the backoff in `retry::backoff`.

use crate::words::spelled;
use std::fmt;
use std::str::FromStr;

/// How randomness is applied to the exponential backoff (`[retry.NAME] jitter`).
///
/// `cap(n) = min(max_delay, base_delay * 2^(n-1))` for retry `n` (1 for the first retry):
///
/// | variant | delay before retry `n` |
/// | --- | --- |
/// | `full` | `U(0, cap(n))` |
/// | `equal` | `cap(n)/2 + U(0, cap(n)/2)` |
/// | `decorrelated` | `min(max_delay, U(base_delay, 3 * prev))`, `prev` = the previous delay, `base_delay` at first |
/// | `none` | `cap(n)` |
///
/// `full` is the default: Brooker's simulations show it does the least total work for the server
/// among the jittered variants, and un-jittered backoff is the clear loser (synchronised waves).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Jitter {
    /// `U(0, cap)`: the default.
    #[default]
    Full,
    /// `cap/2 + U(0, cap/2)`: never shorter than half the cap.
    Equal,
    /// AWS "decorrelated jitter": `min(max, U(base, 3 * prev))`; grows from the previous delay
    /// rather than from the retry number.
    Decorrelated,
    /// No randomness: `cap`. Only for tests and for callers that add their own jitter.
    None,
}

// The configuration names, in the order they are documented.
spelled!(Jitter { "full" => Full, "equal" => Equal, "decorrelated" => Decorrelated, "none" => None });

impl fmt::Display for Jitter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `jitter` value that is not one of the known names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown jitter {given:?}: expected one of \"full\", \"equal\", \"decorrelated\", \"none\"")]
pub struct UnknownJitter {
    /// The rejected input, as given.
    pub given: String,
}

impl FromStr for Jitter {
    type Err = UnknownJitter;

    /// Parses the exact (lower-case) configuration names; anything else is an error whose message
    /// lists the valid names.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Jitter::ALL
            .into_iter()
            .find(|j| j.as_str() == s)
            .ok_or_else(|| UnknownJitter { given: s.to_owned() })
    }
}
