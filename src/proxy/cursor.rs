//! Where a request is among its route's targets. It stays on its target while the retry policy
//! retries there; it leaves one when an outcome fails over ([`crate::retry::failover`]) or when
//! the target cannot take it (its circuit open, the credential cooling down or paced out), and
//! never comes back to it. The choice among the targets it has not left is the route's `balance`
//! ([`crate::targets::choose`]).
//!
//! A stream's continuation starts [`Cursor::after_cuts`]: a target that cut the stream is
//! evidence against itself, so it is chosen only when no other is left, and one that stalled it
//! (its idle timeout spent once) not at all (`stream_cut` in the route's `failover_on`).

use std::time::Duration;

use super::routes::{Route, Target};
use crate::config::FailoverReason;
use crate::error::ProxyError;
use crate::retry::policy::{RetryState, Stop};
use crate::targets::{choose, Candidate};

pub(super) struct Cursor {
    /// The target it is on (retries stay there); `None` before the first attempt and after it
    /// left one.
    current: Option<usize>,
    /// Targets it left or found unavailable, and why (allocated only when one is): never chosen
    /// again for this request.
    left: Vec<(usize, FailoverReason)>,
    /// Why it is leaving a target it was on, counted when the next one is admitted.
    leaving: Option<(usize, FailoverReason)>,
    /// The soonest a target found unavailable recovers (`None`: none has a time, e.g. all
    /// exhausted).
    soonest: Option<Duration>,
    /// Times it moved to another target.
    pub(super) failovers: u32,
    /// Targets that cut the stream this request continues: chosen only when no other is left.
    deferred: Vec<usize>,
    /// Targets found at their `concurrency` limit since the last attempt: not chosen while
    /// another has room.
    busy: Vec<usize>,
}

/// A target that cut a stream, and whether it stalled it (the idle timeout) rather than reset it
/// or ended it with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cut {
    pub(super) index: usize,
    pub(super) stalled: bool,
}

impl Cursor {
    pub(super) fn new() -> Cursor {
        Cursor {
            current: None,
            left: Vec::new(),
            leaving: None,
            soonest: None,
            failovers: 0,
            deferred: Vec::new(),
            busy: Vec::new(),
        }
    }

    /// The cursor of a continuation of a stream cut by `cuts` (oldest first): each target that
    /// stalled it is left (a route's only target after its second stall), each that cut it
    /// otherwise is deferred, and the move away from the
    /// last one is a `stream_cut` failover. A route that does not fail over on `stream_cut`
    /// chooses as for any request.
    pub(super) fn after_cuts(route: &Route, cuts: &[Cut]) -> Cursor {
        let mut cursor = Cursor::new();
        if !route.targets.failover_on.contains(FailoverReason::StreamCut) {
            return cursor;
        }
        for (n, cut) in cuts.iter().enumerate() {
            // A stall costs its idle timeout once per target: the only target of a route is
            // asked again once.
            let stalled_before = cuts[..n].iter().any(|c| c.index == cut.index && c.stalled);
            if cut.stalled && (route.targets.len() > 1 || stalled_before) {
                cursor.mark(cut.index, FailoverReason::StreamCut);
            } else if !cursor.deferred.contains(&cut.index) {
                cursor.deferred.push(cut.index);
            }
        }
        if let Some(last) = cuts.last() {
            cursor.leaving = Some((last.index, FailoverReason::StreamCut));
        }
        cursor
    }

    /// Why `index` was left, if it was.
    fn reason(&self, index: usize) -> Option<FailoverReason> {
        self.left.iter().find(|(i, _)| *i == index).map(|(_, r)| *r)
    }

    fn is_left(&self, index: usize) -> bool {
        self.reason(index).is_some()
    }

    fn mark(&mut self, index: usize, reason: FailoverReason) {
        if !self.is_left(index) {
            self.left.push((index, reason));
        }
    }

    /// The targets the request has not left, besides `index`.
    pub(super) fn others<'r>(&'r self, route: &'r Route, index: usize) -> impl Iterator<Item = &'r Target> + 'r {
        route
            .targets
            .iter()
            .filter(move |t| t.index != index && !self.is_left(t.index))
    }

    /// Whether a target it has not left, besides `index`, has not been found at its limit.
    pub(super) fn others_free(&self, route: &Route, index: usize) -> bool {
        self.others(route, index).any(|t| !self.busy.contains(&t.index))
    }

    /// `index` is at its `concurrency` limit: another target is chosen for now.
    pub(super) fn at_limit(&mut self, index: usize) {
        self.busy.push(index);
        if self.current == Some(index) {
            self.current = None;
        }
    }

    /// The request waits for `index` (every other target is at its limit too).
    pub(super) fn wait_for(&mut self, index: usize) {
        self.current = Some(index);
        self.busy.clear();
    }

    /// Whether a target it has not left takes a larger prompt than `target` (an unknown
    /// `context_window` is not larger than any).
    pub(super) fn larger_context(&self, route: &Route, target: &Target) -> bool {
        self.others(route, target.index)
            .any(|t| t.config.context_window > target.config.context_window)
    }

    /// The request leaves the target it is on for `reason` (a failover). A prompt too long for
    /// it is too long for every target that takes no more: those are left too.
    pub(super) fn leave(&mut self, route: &Route, index: usize, reason: FailoverReason, state: &mut RetryState) {
        if reason == FailoverReason::ContextLength {
            let limit = route.targets.get(index).and_then(|t| t.config.context_window);
            for t in route.targets.iter().filter(|t| t.config.context_window <= limit) {
                self.mark(t.index, reason);
            }
        }
        self.unavailable(index, reason, None);
        state.switch_target();
    }

    /// The target for the next attempt: the current one, else one chosen by the route's balance
    /// among those not left.
    pub(super) fn next(&mut self, route: &Route) -> Option<usize> {
        if let Some(i) = self.current {
            return Some(i);
        }
        if route.targets.len() == 1 {
            // The common route: nothing to choose, nothing allocated.
            return (!self.is_left(0)).then_some(0);
        }
        // A target that cut the stream only when no other is left.
        let open = |i: usize| !self.is_left(i) && !self.busy.contains(&i);
        let fresh = |i: usize| open(i) && !self.deferred.contains(&i);
        let any_fresh = route.targets.iter().any(|t| fresh(t.index));
        let candidates: Vec<Candidate> = route
            .targets
            .iter()
            .filter(|t| open(t.index) && (!any_fresh || fresh(t.index)))
            .map(|t| Candidate {
                index: t.index,
                weight: t.config.weight,
                in_flight: t.load.in_flight(),
                ewma_us: t.load.ewma_us(),
            })
            .collect();
        choose(route.targets.balance, &candidates, &mut rand::rng())
    }

    /// `index` cannot take the request now (`reason`, back after `after` if known): left.
    pub(super) fn unavailable(&mut self, index: usize, reason: FailoverReason, after: Option<Duration>) {
        self.mark(index, reason);
        if self.current == Some(index) {
            self.current = None;
        }
        self.leaving.get_or_insert((index, reason));
        if let Some(after) = after {
            self.soonest = Some(self.soonest.map_or(after, |s| s.min(after)));
        }
    }

    /// The request's next attempt goes to `index`: the move that brought it there, if it moved
    /// (from which target, and why), to be counted.
    pub(super) fn arrive(&mut self, index: usize) -> Option<(usize, FailoverReason)> {
        self.current = Some(index);
        self.busy.clear();
        // Back on the target it left (a continuation on the one that cut the stream): no move.
        let moved = self.leaving.take().filter(|(from, _)| *from != index);
        if moved.is_some() {
            self.failovers += 1;
        }
        moved
    }

    /// Why no target can take the request, as rebound answers it: for a one-target route the
    /// specific error (503 `circuit_open`, 429 `cooldown`), for several 503 `no_target_available`
    /// with each target's reason; both with the soonest recovery.
    pub(super) fn none_left(&self, route: &Route) -> (Stop, ProxyError) {
        if let (1, Some(reason), Some(retry_after)) = (route.targets.len(), self.reason(0), self.soonest) {
            let upstream = route.primary().name.to_string();
            match reason {
                FailoverReason::CircuitOpen => {
                    return (Stop::CircuitOpen, ProxyError::CircuitOpen { upstream, retry_after });
                }
                FailoverReason::Cooldown => return (Stop::Cooldown, ProxyError::Cooldown { upstream, retry_after }),
                _ => {}
            }
        }
        if let (1, Some(FailoverReason::Credential)) = (route.targets.len(), self.reason(0)) {
            let target = route.primary();
            let auth = target.upstream.config.auth.kind().as_str();
            let upstream = target.name.to_string();
            return (
                Stop::CredentialUnavailable,
                ProxyError::CredentialUnavailable { upstream, auth },
            );
        }
        let reasons: Vec<Option<FailoverReason>> = route.targets.iter().map(|t| self.reason(t.index)).collect();
        let all = |reason| reasons.iter().all(|r| *r == Some(reason));
        let stop = match (all(FailoverReason::CircuitOpen), all(FailoverReason::Credential)) {
            (true, _) => Stop::CircuitOpen,
            (_, true) => Stop::CredentialUnavailable,
            _ => Stop::Cooldown,
        };
        let targets: Vec<(String, &'static str)> = route
            .targets
            .iter()
            .zip(reasons)
            .map(|(t, r)| (t.name.to_string(), r.map_or("available", FailoverReason::as_str)))
            .collect();
        let retry_after = self.soonest;
        (stop, ProxyError::NoTargetAvailable { retry_after, targets })
    }
}
