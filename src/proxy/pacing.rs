//! Pacing: a credential whose request quota is nearly spent waits for the quota's reset instead
//! of spending the last requests and meeting the provider's 429.
//!
//! After every response, the request quota it reports ([`crate::retry::requests_quota`]) is read;
//! when at most `pacing_reserve` requests are left, the credential is held until the reset
//! ([`Hold::Pacing`], fleet-wide through the cooldown machinery). Before every attempt, a held
//! credential's request waits for the reset (with the cooldowns' release jitter) when its deadline
//! allows; when it does not, the request goes at once (pacing never refuses a request: the
//! provider may still accept it, and a 429 starts the cooldown as usual).
//!
//! The reserve is for requests already in flight elsewhere: with one credential shared by N
//! requests in flight across the fleet, `pacing_reserve = N - 1` keeps the last one from a 429.

use std::time::Duration;

use http::HeaderMap;
use tokio::time::Instant;

use super::Target;
use crate::circuit::{release_delay, Circuits, CredentialHash, Hold};
use crate::config::PacingMode;
use crate::retry::requests_quota;
use crate::time;

/// After a response: holds the credential until the quota's reset when at most
/// `pacing_reserve` requests are left.
pub(super) fn note(
    circuits: &Circuits,
    target: &Target,
    credential: impl FnOnce() -> CredentialHash,
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

/// Before an attempt: how long the request is to wait for its credential's quota to reset (the
/// wait is counted), if it is held and its deadline allows.
pub(super) fn wait(
    circuits: &Circuits,
    target: &Target,
    credential: impl FnOnce() -> CredentialHash,
    now: Instant,
    deadline: Instant,
) -> Option<Duration> {
    if !circuits.hold_active(Hold::Pacing, &target.name) {
        return None;
    }
    let left = circuits.hold_check(Hold::Pacing, &target.name, &credential(), now)?;
    if now + left >= deadline {
        return None;
    }
    circuits.count_pacing_wait(&target.name);
    let hold = release_delay(left, &mut rand::rng()).min(deadline - now);
    tracing::debug!(upstream = %target.name, hold_ms = hold.as_millis() as u64, "held by pacing");
    Some(hold)
}
