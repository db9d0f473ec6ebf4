//! Rate-limit cooldowns: "no calls before T" per credential, for one upstream. Pure: the caller
//! passes the time and the RNG.
//!
//! A provider's 429 with a reset hint applies to the credential that made the call (for the model
//! it asked for), so the table is keyed by a [`LimitKey`]: a hash of the credential the request
//! carried to the upstream (`crate::credentials`), never the credential itself, and of the model.
//!
//! The table keeps the latest deadline per credential (a shorter hint never shortens a cooldown),
//! drops expired entries as it goes and holds at most `capacity` entries: when full, the entry
//! that expires soonest makes room (it is the one whose loss costs least). The entries are also
//! indexed by deadline, so pruning and eviction take the front of that index: O(log n) per
//! entry, never a walk over the whole table.

use foldhash::HashMap;
use std::collections::BTreeSet;
use std::time::Duration;

use rand::Rng;

pub use crate::credentials::{CredentialHash, LimitKey};
use crate::time::Instant;

/// Entries per upstream at most.
pub(crate) const DEFAULT_CAPACITY: usize = 10_000;

/// How long a request held by a cooldown (`cooldown = "wait"`) should sleep: the time left plus
/// an upward jitter of `U(0, clamp(left / 5, 50 ms, 2 s))`, so that the requests that piled up do
/// not all hit the provider in the same millisecond when the window reopens.
pub(crate) fn release_delay(left: Duration, rng: &mut impl Rng) -> Duration {
    let spread = (left / 5).clamp(Duration::from_millis(50), Duration::from_secs(2));
    let extra = rng.random_range(0..=u64::try_from(spread.as_micros()).unwrap_or(u64::MAX));
    left + Duration::from_micros(extra)
}

/// One upstream's cooldowns.
#[derive(Debug, Clone)]
pub(crate) struct CooldownTable {
    entries: HashMap<LimitKey, Instant>,
    /// The same entries, soonest deadline first.
    by_deadline: BTreeSet<(Instant, LimitKey)>,
    capacity: usize,
}

impl Default for CooldownTable {
    fn default() -> Self {
        CooldownTable::new(DEFAULT_CAPACITY)
    }
}

impl CooldownTable {
    pub(crate) fn new(capacity: usize) -> CooldownTable {
        CooldownTable {
            entries: HashMap::default(),
            by_deadline: BTreeSet::new(),
            capacity: capacity.max(1),
        }
    }

    /// No calls with `cred` before `until`. Keeps the later deadline; returns whether this one
    /// extended it (false when it was already as long, or in the past).
    pub(crate) fn note(&mut self, cred: LimitKey, until: Instant, now: Instant) -> bool {
        if until <= now {
            return false;
        }
        if let Some(t) = self.entries.get_mut(&cred) {
            if *t >= until {
                return false;
            }
            self.by_deadline.remove(&(*t, cred));
            self.by_deadline.insert((until, cred));
            *t = until;
            return true;
        }
        if self.entries.len() >= self.capacity {
            self.prune(now);
        }
        if self.entries.len() >= self.capacity {
            match self.by_deadline.first().copied() {
                // The newcomer expires sooner than anything held: it is the one to lose.
                Some((t, _)) if t >= until => return false,
                Some(soonest) => {
                    self.by_deadline.remove(&soonest);
                    self.entries.remove(&soonest.1);
                }
                None => {}
            }
        }
        self.entries.insert(cred, until);
        self.by_deadline.insert((until, cred));
        true
    }

    /// Whether a hold under `credential` is in force, for any model (what `rebound_target_state`
    /// shows: a walk over the table, at a scrape).
    pub(crate) fn any_for(&self, credential: &CredentialHash, now: Instant) -> bool {
        self.entries
            .iter()
            .any(|(k, t)| k.credential == *credential && *t > now)
    }

    /// The time left before calls with `cred` may go out, if any.
    pub(crate) fn check(&self, cred: &LimitKey, now: Instant) -> Option<Duration> {
        self.entries
            .get(cred)
            .and_then(|t| t.checked_duration_since(now))
            .filter(|d| !d.is_zero())
    }

    #[cfg(test)]
    /// The deadline held for `cred`, if it is still ahead.
    pub(crate) fn until(&self, cred: &LimitKey, now: Instant) -> Option<Instant> {
        self.entries.get(cred).copied().filter(|t| *t > now)
    }

    /// Drops expired entries, from the front of the deadline index (each once: O(log n) per
    /// entry dropped, nothing for the live ones).
    pub(crate) fn prune(&mut self, now: Instant) {
        while let Some(&(t, cred)) = self.by_deadline.first() {
            if t > now {
                break;
            }
            self.by_deadline.remove(&(t, cred));
            self.entries.remove(&cred);
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    const SEC: Duration = Duration::from_secs(1);

    fn cred(n: u8) -> LimitKey {
        LimitKey::from(CredentialHash([n; 16]))
    }

    #[test]
    fn keeps_the_latest_deadline() {
        let now = crate::time::now();
        let mut t = CooldownTable::default();
        assert!(t.note(cred(1), now + 3 * SEC, now));
        assert_eq!(t.check(&cred(1), now), Some(3 * SEC));
        assert!(!t.note(cred(1), now + SEC, now), "a shorter hint never shortens it");
        assert_eq!(t.check(&cred(1), now + SEC), Some(2 * SEC));
        assert!(t.note(cred(1), now + 5 * SEC, now));
        assert_eq!(t.check(&cred(1), now), Some(5 * SEC));
        assert_eq!(t.check(&cred(2), now), None, "another credential is unaffected");
        assert!(!t.note(cred(3), now, now), "a deadline in the past is no cooldown");
        assert_eq!(t.check(&cred(1), now + 5 * SEC), None);
        assert_eq!(t.until(&cred(1), now), Some(now + 5 * SEC));
    }

    #[test]
    fn expired_entries_are_pruned() {
        let now = crate::time::now();
        let mut t = CooldownTable::default();
        t.note(cred(1), now + SEC, now);
        t.note(cred(2), now + 3 * SEC, now);
        t.prune(now + 2 * SEC);
        assert_eq!(t.len(), 1);
        assert_eq!(t.check(&cred(2), now + 2 * SEC), Some(SEC));
    }

    #[test]
    fn bounded_and_evicts_the_soonest_expiring() {
        let now = crate::time::now();
        let mut t = CooldownTable::new(3);
        t.note(cred(1), now + 10 * SEC, now);
        t.note(cred(2), now + 2 * SEC, now);
        t.note(cred(3), now + 30 * SEC, now);
        assert!(t.note(cred(4), now + 20 * SEC, now));
        assert_eq!(t.len(), 3);
        assert_eq!(t.check(&cred(2), now), None, "the soonest-expiring made room");
        assert!(
            !t.note(cred(5), now + SEC, now),
            "a newcomer sooner than all is dropped"
        );
        assert_eq!(t.len(), 3);
        // Expired entries make room first.
        assert!(t.note(cred(6), now + 40 * SEC + SEC, now + 15 * SEC));
        assert_eq!(t.check(&cred(1), now + 15 * SEC), None);
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn the_deadline_index_follows_every_change() {
        let now = crate::time::now();
        let mut t = CooldownTable::new(100);
        for i in 0..=255u8 {
            // Deadlines not in insertion order; every third one extended later.
            t.note(cred(i), now + u32::from(i.wrapping_mul(37) % 200 + 1) * SEC, now);
            if i % 3 == 0 {
                t.note(cred(i / 2), now + 300 * SEC, now);
            }
            assert!(t.len() <= 100);
            assert_eq!(t.by_deadline.len(), t.entries.len());
            for (c, until) in &t.entries {
                assert!(t.by_deadline.contains(&(*until, *c)));
            }
        }
        // An extended entry is evicted by its new deadline, not its old one: the ones at 300 s
        // outlive everything else.
        for i in 0..=255u8 {
            if i % 3 == 0 && t.entries.len() == 100 {
                assert!(t.until(&cred(i / 2), now).is_none_or(|u| u == now + 300 * SEC));
            }
        }
        t.prune(now + 250 * SEC);
        assert!(t.entries.values().all(|u| *u == now + 300 * SEC));
        assert_eq!(t.by_deadline.len(), t.entries.len());
        t.prune(now + 300 * SEC);
        assert!(t.is_empty() && t.by_deadline.is_empty());
    }

    #[test]
    fn release_jitter_is_upward_and_bounded() {
        let mut rng = StdRng::seed_from_u64(5);
        for left in [Duration::ZERO, Duration::from_millis(100), 3 * SEC, 60 * SEC] {
            let spread = (left / 5).clamp(Duration::from_millis(50), 2 * SEC);
            for _ in 0..100 {
                let d = release_delay(left, &mut rng);
                assert!(d >= left && d <= left + spread, "{left:?} -> {d:?}");
            }
        }
    }
}
