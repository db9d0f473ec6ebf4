//! A route's targets: the upstreams it may send a request to, how it spreads requests over them
//! (`balance`) and what moves a request from one to the next (`failover_on`).

use super::Api;
use crate::words::{self, spelled};
use std::collections::BTreeMap;
use std::time::Duration;

/// One upstream a route may use.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetConfig {
    /// The `[upstreams.NAME]` it sends to.
    pub upstream: String,
    /// Its share under `balance = "weighted"` (positive; 1 when not given).
    pub weight: f64,
    /// The JSON body's `model` rewritten for this target: requested name -> this target's name.
    pub models: BTreeMap<String, String>,
    /// The first body byte must come within this long of sending the request, else the request
    /// moves on (`first_byte_timeout` failover); `None`: the retry policy's `first_byte_timeout`.
    pub first_byte_timeout: Option<Duration>,
    /// The largest prompt it takes, in tokens (for `context_length` failover); `None`: unknown.
    pub context_window: Option<u64>,
    /// The API it speaks on this route (its upstream's `api`, resolved by the route's family).
    pub api: Api,
}

impl TargetConfig {
    /// A plain target: weight 1, no rewriting, the policy's timeouts.
    pub fn plain(upstream: &str) -> TargetConfig {
        TargetConfig {
            upstream: upstream.to_string(),
            weight: 1.0,
            models: BTreeMap::new(),
            first_byte_timeout: None,
            context_window: None,
            api: Api::OpenAi,
        }
    }
}

/// How a route spreads its requests over its available targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Balance {
    /// The first available target in the route's order; the next ones on failover.
    Ordered,
    /// A random available target, in proportion to the weights.
    Weighted,
    /// Power of two choices on requests in flight and a latency EWMA.
    LeastLoaded,
}

/// Why a request moved from one target to another: the `failover_on` entries, the `reason` label
/// of `rebound_failovers_total`, and the outcome named in a `no_target_available` error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailoverReason {
    /// The target's circuit is open.
    CircuitOpen,
    /// A 429 (or a cooldown the fleet holds for the credential).
    Cooldown,
    /// The credential's quota is used up (marked fleet-wide until its reset).
    Exhausted,
    /// 529, an in-band `overloaded_error` before the first byte, Bedrock's
    /// ServiceUnavailableException.
    Overloaded,
    /// No first byte within the target's `first_byte_timeout`.
    FirstByteTimeout,
    /// The retry policy's attempts are used up on the target.
    RetriesExhausted,
    /// The prompt is longer than the target takes: to one with a larger `context_window`.
    ContextLength,
    /// No cloud credential can be had for the target (`auth = "aws" | "gcp" | "azure"`).
    Credential,
    /// The target cut a stream mid-answer: its continuation (`continue_streams`) goes to another
    /// target first.
    StreamCut,
}

// The one spelling (config, metric label, error body).
spelled!(FailoverReason {
    words::CIRCUIT_OPEN => CircuitOpen,
    words::COOLDOWN => Cooldown,
    "exhausted" => Exhausted,
    "overloaded" => Overloaded,
    "first_byte_timeout" => FirstByteTimeout,
    "retries_exhausted" => RetriesExhausted,
    "context_length" => ContextLength,
    "credential" => Credential,
    "stream_cut" => StreamCut,
});

impl FailoverReason {
    pub fn parse(s: &str) -> Option<FailoverReason> {
        <FailoverReason as crate::words::Spelled>::parse(s)
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// The set of reasons a route fails over on (all of them by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailoverOn(u16);

impl FailoverOn {
    pub fn all() -> FailoverOn {
        FailoverOn::of(FailoverReason::ALL)
    }

    pub fn of(reasons: impl IntoIterator<Item = FailoverReason>) -> FailoverOn {
        FailoverOn(reasons.into_iter().fold(0, |bits, r| bits | r.bit()))
    }

    pub fn contains(self, reason: FailoverReason) -> bool {
        self.0 & reason.bit() != 0
    }

    pub fn iter(self) -> impl Iterator<Item = FailoverReason> {
        FailoverReason::ALL.into_iter().filter(move |r| self.contains(*r))
    }
}

impl Default for FailoverOn {
    fn default() -> FailoverOn {
        FailoverOn::all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_have_one_spelling_each_and_round_trip() {
        let mut seen = std::collections::BTreeSet::new();
        for r in FailoverReason::ALL {
            assert!(seen.insert(r.as_str()));
            assert_eq!(FailoverReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(FailoverReason::parse("circuit-open"), None);
    }

    #[test]
    fn failover_on_is_a_set() {
        let set = FailoverOn::of([FailoverReason::Cooldown, FailoverReason::Overloaded]);
        assert!(set.contains(FailoverReason::Cooldown));
        assert!(!set.contains(FailoverReason::CircuitOpen));
        assert_eq!(set.iter().count(), 2);
        assert_eq!(FailoverOn::default().iter().count(), 9);
    }
}
