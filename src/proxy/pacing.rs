//! Pacing: a credential whose request quota is nearly spent waits for the quota's reset instead
//! of spending the last requests and meeting the provider's 429.
//!
//! After every response, the request quota it reports ([`crate::retry::requests_quota`]) is read;
//! when at most `pacing_reserve` requests are left, the credential is held until the reset
//! ([`Hold::Pacing`], fleet-wide through the cooldown machinery), for the model the response was
//! for ([`super::limits`]). Before every attempt, a held credential's request waits for the reset
//! (with the cooldowns' release jitter) as a cooldown's does: when the wait fits its deadline and
//! its policy's `max_retry_after`; when it does not, it moves to another target or is answered
//! 429 `cooldown` at once with the time left.
//!
//! The reserve is for requests already in flight elsewhere: with one credential shared by N
//! requests in flight across the fleet, `pacing_reserve = N - 1` keeps the last one from a 429.

use std::time::Duration;

use http::HeaderMap;
use tokio::time::Instant;

use super::routes::Target;
use crate::circuit::{Circuits, Hold, LimitKey};
use crate::config::PacingMode;
use crate::retry::requests_quota;
use crate::time;

/// After a response: holds the credential until the quota's reset when at most
/// `pacing_reserve` requests are left.
pub(super) fn note(
    circuits: &Circuits,
    target: &Target,
    credential: impl FnOnce() -> LimitKey,
    headers: &HeaderMap,
    received: Instant,
) {
    let config = &target.upstream.config;
    if config.pacing == PacingMode::Off {
        return;
    }
    let Some(quota) = requests_quota(headers, time::wall_now()) else {
        return;
    };
    if quota.remaining > u64::from(config.pacing_reserve) || quota.reset.is_zero() {
        return;
    }
    circuits.hold_note(
        Hold::Pacing,
        &target.name,
        credential(),
        received + quota.reset,
        received,
    );
}

/// Before an attempt: how long the credential's quota has left to reset, if pacing holds it
/// (the caller decides whether the request waits).
pub(super) fn left(
    circuits: &Circuits,
    target: &Target,
    credential: impl FnOnce() -> LimitKey,
    now: Instant,
) -> Option<Duration> {
    if !circuits.hold_active(Hold::Pacing, &target.name) {
        return None;
    }
    circuits.hold_check(Hold::Pacing, &target.name, &credential(), now)
}
