//! Whether a target has room for an attempt under its upstream's `concurrency`
//! ([`crate::limiter::concurrency`]), asked by `Call::admit` once the target's circuit and holds
//! let the attempt through: a permit (no round trip: the fleet's part is in hand), else another
//! target of the route, else the scope's queue within the request's wait, else 429
//! `concurrency_limited`. Also what an attempt's answer tells the limit ([`observe`]).

use std::time::Duration;

use super::routes::Target;
use crate::credentials::LimitKey;
use crate::error::ProxyError;
use crate::limiter::concurrency::{Acquired, Queued, Seen, Slot, MAX_QUEUE_WAIT};
use crate::limiter::QUEUE_POLL;
use crate::retry::policy::Outcome;
use crate::time::{self, Instant};

/// A timeout this close to the request's deadline was the deadline's.
const DEADLINE_SLACK: Duration = Duration::from_millis(10);

/// What the target's limit says of the attempt.
pub(super) enum Room {
    /// Go: with the permit to hold while it runs (none when the upstream has no limit).
    Free(Option<Slot>),
    /// At its limit: another target of the route may take it.
    Elsewhere,
    /// At its limit, and no other target: wait in the queue (joined), then ask again.
    Wait,
    /// No room within the request's wait, or the queue is full: rebound's 429.
    Refused(ProxyError),
}

/// What a request asks of a target's limit.
pub(super) struct Ask<'a> {
    pub(super) key: &'a dyn Fn() -> LimitKey,
    /// The request's model label (`[metrics] models`).
    pub(super) model: &'a str,
    pub(super) route: &'a str,
    /// Another target of the route has not been found at its limit yet.
    pub(super) elsewhere: bool,
    pub(super) deadline: Instant,
}

/// The room `target` has for the attempt at `now`: `queued`, the request's place when it waits
/// (taken when it is admitted, left when its wait is over).
pub(super) fn room(target: &Target, ask: &Ask<'_>, queued: &mut Option<Queued>, now: Instant) -> Room {
    let Some(limit) = &target.concurrency else {
        return Room::Free(None);
    };
    let key = (ask.key)();
    let place = queued.as_ref().map(|q| &q.place);
    match limit.try_acquire(key, ask.model, place, now) {
        Acquired::Ok(slot) => {
            let Some(q) = queued.take() else {
                return Room::Free(Some(slot));
            };
            q.admitted();
            // Its turn came too late to be served before its deadline: the place goes to the
            // next, the request gets its 429 rather than an attempt cut short.
            if slot.hold().is_some_and(|hold| now + hold > ask.deadline) {
                return Room::Refused(refusal(&target.name, ask.route, true));
            }
            return Room::Free(Some(slot));
        }
        Acquired::Full => {}
    }
    let refused = |waited: bool| Room::Refused(refusal(&target.name, ask.route, waited));
    match queued {
        Some(q) if now >= q.until => {
            queued.take();
            refused(true)
        }
        Some(_) => Room::Wait,
        None if ask.elsewhere => Room::Elsewhere,
        None => {
            let until = ask.deadline.min(now + MAX_QUEUE_WAIT);
            if until <= now {
                return refused(false);
            }
            match limit.queue(key, ask.model, ask.route, (until, ask.deadline)) {
                Some(q) => {
                    *queued = Some(q);
                    Room::Wait
                }
                None => refused(false),
            }
        }
    }
}

/// Rebound's 429 for a request `upstream`'s limit had no room for (`waited`: in its queue).
pub(super) fn refusal(upstream: &str, route: &str, waited: bool) -> ProxyError {
    let upstream = upstream.to_string();
    tracing::info!(upstream = %upstream, route, waited, "at the upstream's concurrency limit");
    ProxyError::ConcurrencyLimited {
        upstream,
        retry_after: Duration::from_secs(1),
    }
}

/// Waits for the request's turn in its queue: woken when a request of the scope ends or the fleet
/// gives this replica a larger part, or after [`QUEUE_POLL`], or at the end of its wait.
pub(super) async fn turn(target: &Target, queued: &Queued) {
    let Some(limit) = &target.concurrency else { return };
    let woken = limit.waiting.listen();
    let left = queued.until.saturating_duration_since(time::now());
    let _ = tokio::time::timeout(left.min(QUEUE_POLL), woken).await;
}

/// What an attempt's answer tells its target's limit: an overload signal, or a success and its
/// time to first byte (`hint`: the reset the answer gave). A timeout the request's own `deadline`
/// cut short is not the provider's: only one that came before it is a signal.
pub(super) fn observe(
    permit: &Slot,
    outcome: Outcome,
    hint: Option<Duration>,
    (sent, received): (Instant, Instant),
    deadline: Instant,
) {
    let status = match outcome {
        Outcome::Status(s) | Outcome::InBand(s) => Some(s.as_u16()),
        _ => None,
    };
    let timed_out = outcome == Outcome::Timeout && received + DEADLINE_SLACK < deadline;
    let signal = crate::limits::aimd::signal_of(status, hint, timed_out);
    permit.observe(Seen {
        sent,
        received,
        signal,
        ok: status.is_some_and(|s| (200..300).contains(&s)) && matches!(outcome, Outcome::Status(_)),
    });
}
