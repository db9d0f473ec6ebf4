//! Whether an attempt's outcome moves the request to another target of its route, and why: pure.
//!
//! Two moments. **At once**, before the retry decision, for what another target answers better
//! than a retry here would (DESIGN section 8: no retry of the same target, no backoff wait): a
//! 429 (even one whose reset would fit the deadline: waiting is for when no other target is
//! available), a quota used up, an overloaded provider, no first byte within the target's own
//! `first_byte_timeout`, a prompt too long for this target when another takes more. **After** the
//! decision, when the retry policy's attempts on this target are used up (`retries_exhausted`).
//!
//! Never on a permanent 4xx or a content-policy refusal: another target would refuse it too, and
//! a second generation elsewhere is a second bill.

use std::time::Duration;

use http::StatusCode;

use super::policy::{Outcome, Stop};
use super::provider_error::ErrorClass;
use crate::config::FailoverReason;

/// How long a credential whose quota is used up is avoided when the provider gives no reset.
pub(crate) const EXHAUSTED_FOR: Duration = Duration::from_secs(3600);

/// What else the attempt showed, beyond its outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// The class of an error response, read from its status, headers and small body.
    pub(crate) class: Option<ErrorClass>,
    /// The target sets its own `first_byte_timeout` (a timeout there is that limit).
    pub(crate) first_byte_limit: bool,
    /// Another target of the route declares a larger `context_window` than this one.
    pub(crate) larger_context_elsewhere: bool,
    /// The rate limit's reset is within the route's `failover_wait`: it is waited for here
    /// (when the retry policy allows the wait) rather than moved from at once.
    pub(crate) reset_within_failover_wait: bool,
}

/// The reason this outcome moves the request at once, if it does.
pub(crate) fn at_once(outcome: Outcome, seen: Seen) -> Option<FailoverReason> {
    let status = match outcome {
        Outcome::Status(s) | Outcome::InBand(s) => Some(s),
        _ => None,
    };
    match seen.class {
        Some(ErrorClass::Exhausted) => return Some(FailoverReason::Exhausted),
        Some(ErrorClass::ContentPolicy) => return None,
        Some(ErrorClass::ContextLength) => {
            return seen.larger_context_elsewhere.then_some(FailoverReason::ContextLength);
        }
        Some(ErrorClass::Overloaded) => return Some(FailoverReason::Overloaded),
        Some(ErrorClass::RateLimited) => return (!seen.reset_within_failover_wait).then_some(FailoverReason::Cooldown),
        _ => {}
    }
    match (outcome, status) {
        (_, Some(StatusCode::TOO_MANY_REQUESTS)) => {
            (!seen.reset_within_failover_wait).then_some(FailoverReason::Cooldown)
        }
        (_, Some(s)) if s.as_u16() == 529 => Some(FailoverReason::Overloaded),
        (Outcome::Timeout, _) if seen.first_byte_limit => Some(FailoverReason::FirstByteTimeout),
        _ => None,
    }
}

/// The reason the retry decision's `stop` moves the request, if it does: the attempts on this
/// target are used up on a failure that another target may not have; or a rate limit that was to
/// be waited for here (`failover_wait`) cannot be (the policy, the budget or the deadline said
/// no), so it moves as it would have at once.
pub(crate) fn after_decision(outcome: Outcome, stop: Stop, seen: Seen) -> Option<FailoverReason> {
    if seen.reset_within_failover_wait && outcome.is_failure() {
        return Some(FailoverReason::Cooldown);
    }
    (stop == Stop::Exhausted && outcome.is_failure()).then_some(FailoverReason::RetriesExhausted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(s: u16) -> Outcome {
        Outcome::Status(StatusCode::from_u16(s).unwrap())
    }

    fn class(c: ErrorClass) -> Seen {
        Seen {
            class: Some(c),
            ..Seen::default()
        }
    }

    #[test]
    fn what_another_target_answers_better_moves_at_once() {
        use FailoverReason::*;
        let none = Seen::default();
        assert_eq!(at_once(status(429), none), Some(Cooldown));
        assert_eq!(
            at_once(Outcome::InBand(StatusCode::TOO_MANY_REQUESTS), none),
            Some(Cooldown)
        );
        assert_eq!(at_once(status(529), none), Some(Overloaded));
        assert_eq!(
            at_once(Outcome::InBand(StatusCode::from_u16(529).unwrap()), none),
            Some(Overloaded)
        );
        assert_eq!(at_once(status(429), class(ErrorClass::Exhausted)), Some(Exhausted));
        assert_eq!(at_once(status(503), class(ErrorClass::Overloaded)), Some(Overloaded));
        assert_eq!(at_once(status(400), class(ErrorClass::RateLimited)), Some(Cooldown));
        // A timeout is the target's first-byte limit only when it sets one.
        assert_eq!(at_once(Outcome::Timeout, none), None);
        let limited = Seen {
            first_byte_limit: true,
            ..none
        };
        assert_eq!(at_once(Outcome::Timeout, limited), Some(FirstByteTimeout));
        // A prompt too long moves only to a target that takes more.
        assert_eq!(at_once(status(400), class(ErrorClass::ContextLength)), None);
        let larger = Seen {
            class: Some(ErrorClass::ContextLength),
            larger_context_elsewhere: true,
            ..none
        };
        assert_eq!(at_once(status(400), larger), Some(ContextLength));
    }

    #[test]
    fn permanent_failures_and_refusals_never_move() {
        for s in [400, 401, 403, 404, 422] {
            assert_eq!(at_once(status(s), Seen::default()), None, "{s}");
            assert_eq!(at_once(status(s), class(ErrorClass::Permanent)), None, "{s}");
        }
        assert_eq!(at_once(status(400), class(ErrorClass::ContentPolicy)), None);
        // Even a 429 status: the body's refusal decides.
        assert_eq!(at_once(status(429), class(ErrorClass::ContentPolicy)), None);
        // Transient trouble is retried here first, and moves when the retries are used up.
        assert_eq!(at_once(status(503), class(ErrorClass::Transient)), None);
        assert_eq!(at_once(Outcome::Reset, Seen::default()), None);
    }

    #[test]
    fn a_reset_within_failover_wait_is_waited_for_unless_the_policy_says_no() {
        let waits = Seen {
            reset_within_failover_wait: true,
            ..Seen::default()
        };
        assert_eq!(at_once(status(429), waits), None);
        assert_eq!(
            at_once(
                status(400),
                Seen {
                    class: Some(ErrorClass::RateLimited),
                    ..waits
                }
            ),
            None
        );
        // A used-up quota or an overload still moves at once.
        assert_eq!(
            at_once(
                status(429),
                Seen {
                    class: Some(ErrorClass::Exhausted),
                    ..waits
                }
            ),
            Some(FailoverReason::Exhausted)
        );
        assert_eq!(at_once(status(529), waits), Some(FailoverReason::Overloaded));
        // The retry policy would not wait (hint too long, budget, deadline, attempts): move.
        for stop in [
            Stop::HintTooLong,
            Stop::Exhausted,
            Stop::Deadline,
            Stop::BudgetExhausted,
        ] {
            assert_eq!(
                after_decision(status(429), stop, waits),
                Some(FailoverReason::Cooldown),
                "{stop:?}"
            );
        }
    }

    #[test]
    fn used_up_retries_move_a_failure_only() {
        let none = Seen::default();
        assert_eq!(
            after_decision(status(503), Stop::Exhausted, none),
            Some(FailoverReason::RetriesExhausted)
        );
        assert_eq!(
            after_decision(Outcome::Reset, Stop::Exhausted, none),
            Some(FailoverReason::RetriesExhausted)
        );
        assert_eq!(after_decision(status(503), Stop::Deadline, none), None);
        assert_eq!(after_decision(status(400), Stop::NotRetryable, none), None);
        assert_eq!(after_decision(status(200), Stop::Success, none), None);
    }
}
