//! The lease renewals of this replica's in-flight claims, all run by one task.
//!
//! A claim's lease is renewed every `lease / 3` while its request runs, so that a long generation
//! keeps its key and a crashed replica's key frees within one lease. Most requests end long
//! before their first renewal is due, so a claim costs one insert into [`Renewals`] and one
//! removal when it ends (no task, no timer, no wakeup of its own). One ticker task renews what
//! is due: it sleeps until the soonest renewal due, and waits with no timer at all while nothing
//! has been claimed for a whole interval, so a quiet replica never wakes for it.
//!
//! The renewals due at one wake-up run concurrently (each bounded by the store's
//! `command_timeout`): a store that does not answer one of them delays the others by at most that.

use parking_lot::Mutex;
use std::sync::{Arc, Weak};
use std::time::Duration;

use foldhash::HashMap;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::live::Live;
use super::store::Store;
use super::AnyStore;

/// The process's lease renewals (one per store, shared by every route, survives reloads).
pub struct Renewals {
    store: AnyStore,
    state: Mutex<State>,
    /// Wakes the ticker: a claim due sooner than it planned to wake, or the renewals dropped.
    wake: Arc<Notify>,
}

#[derive(Default)]
struct State {
    claims: HashMap<u64, Due>,
    next_id: u64,
    /// The ticker runs (started with the first claim).
    started: bool,
    /// When the ticker wakes next; `None`: it waits for a claim, with no timer.
    wakes_at: Option<Instant>,
    /// Claims registered since the ticker last woke (it stays awake one more interval after any).
    claimed_since_wake: bool,
    /// The interval of the last claim registered: how long the ticker waits, with nothing due,
    /// before it goes quiet.
    interval: Duration,
}

#[derive(Clone)]
struct Due {
    live: Arc<Live>,
    lease: Duration,
    at: Instant,
    route: Arc<str>,
}

/// One claim's place in [`Renewals`]; dropped when the claim ends, which stops its renewals.
pub struct Renewal {
    renewals: Arc<Renewals>,
    id: u64,
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.renewals.state.lock().claims.remove(&self.id);
    }
}

impl Drop for Renewals {
    fn drop(&mut self) {
        // The ticker holds a weak reference: woken, it finds the renewals gone and ends.
        self.wake.notify_one();
    }
}

impl Renewals {
    pub fn new(store: AnyStore) -> Arc<Renewals> {
        Arc::new(Renewals {
            store,
            state: Mutex::new(State::default()),
            wake: Arc::new(Notify::new()),
        })
    }

    /// Renews `live`'s claim every `lease / 3` until the returned [`Renewal`] is dropped.
    /// Must be called on the runtime (the first claim starts the ticker there).
    pub fn renew(self: &Arc<Self>, live: Arc<Live>, lease: Duration, route: Arc<str>) -> Renewal {
        let interval = lease / 3;
        let at = crate::time::now() + interval;
        let mut s = self.state.lock();
        let id = s.next_id;
        s.next_id += 1;
        s.claims.insert(id, Due { live, lease, at, route });
        s.claimed_since_wake = true;
        s.interval = interval;
        let start = !s.started;
        s.started = true;
        let wake = s.wakes_at.is_none_or(|t| at < t);
        if wake {
            // The ticker plans its next wake-up when it sees this claim: not again before then.
            s.wakes_at = Some(at);
        }
        drop(s);
        if start {
            crate::tasks::spawn("lease renewals", tick(Arc::downgrade(self), self.wake.clone()));
        } else if wake {
            self.wake.notify_one();
        }
        Renewal {
            renewals: self.clone(),
            id,
        }
    }

    /// Claims with a renewal due.
    pub fn len(&self) -> usize {
        self.state.lock().claims.len()
    }

    /// Whether no claim is renewed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The renewals due at `now` (their next one planned), and when the ticker wakes next.
    fn due(&self, now: Instant) -> (Vec<(u64, Due)>, Option<Instant>) {
        let mut s = self.state.lock();
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        for (id, d) in s.claims.iter_mut() {
            if d.at <= now {
                d.at = now + d.lease / 3;
                due.push((*id, d.clone()));
            }
            next = Some(next.map_or(d.at, |n| n.min(d.at)));
        }
        // Nothing to renew: one more interval awake if a claim came since the last wake-up (the
        // next claim then needs no notification), else quiet until the next claim.
        let wakes_at = match next {
            Some(at) => Some(at),
            None if s.claimed_since_wake => Some(now + s.interval),
            None => None,
        };
        s.claimed_since_wake = false;
        s.wakes_at = wakes_at;
        (due, wakes_at)
    }

    /// Stops renewing a claim whose lease another owner holds now.
    fn forget(&self, id: u64) {
        self.state.lock().claims.remove(&id);
    }
}

async fn tick(renewals: Weak<Renewals>, wake: Arc<Notify>) {
    loop {
        let Some(r) = renewals.upgrade() else { return };
        let (due, wakes_at) = r.due(crate::time::now());
        if !due.is_empty() {
            let renewed = due
                .iter()
                .map(|(_, d)| r.store.renew(&d.live.record, &d.live.owner, d.lease));
            let results = futures_util::future::join_all(renewed).await;
            for ((id, Due { route, .. }), result) in due.iter().zip(results) {
                match result {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(route = %route, "idempotency lease lost while the request ran: a duplicate may run");
                        r.forget(*id);
                    }
                    Err(e) => tracing::warn!(route = %route, error = %e, "idempotency lease renewal failed"),
                }
            }
            // Their renewals took time: look again before sleeping.
            continue;
        }
        drop(r);
        match wakes_at {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::store::{Begin, MemoryLimits, MemoryStore};
    use crate::idempotency::test_ids::{fp, k, own};

    const LEASE: Duration = Duration::from_secs(3);

    fn setup() -> (AnyStore, Arc<Renewals>) {
        let store = AnyStore::Memory(MemoryStore::new(MemoryLimits::default()));
        (store.clone(), Renewals::new(store))
    }

    async fn claim(store: &AnyStore, renewals: &Arc<Renewals>, key: &str, owner: &str) -> Renewal {
        assert_eq!(
            store.begin(&k(key), &fp("fp"), &own(owner), LEASE).await.unwrap(),
            Begin::Claimed
        );
        let live = Arc::new(Live::new(k(key), fp("fp"), own(owner), 1024));
        renewals.renew(live, LEASE, "r".into())
    }

    fn held_by_another(b: &Begin) -> bool {
        matches!(b, Begin::InProgress { .. })
    }

    impl Renewals {
        fn quiet(&self) -> bool {
            self.state.lock().wakes_at.is_none()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_is_renewed_past_its_lease_until_it_ends_then_lapses() {
        let (store, renewals) = setup();
        let renewal = claim(&store, &renewals, "k", "o1").await;
        // Ten leases later the key is still held: renewed every lease / 3.
        tokio::time::sleep(LEASE * 10).await;
        assert!(held_by_another(
            &store.begin(&k("k"), &fp("fp"), &own("o2"), LEASE).await.unwrap()
        ));
        assert_eq!(renewals.len(), 1);
        // The claim ends without a release (a crash of its request): the lease lapses.
        drop(renewal);
        assert!(renewals.is_empty());
        tokio::time::sleep(LEASE / 2).await;
        assert!(held_by_another(
            &store.begin(&k("k"), &fp("fp"), &own("o2"), LEASE).await.unwrap()
        ));
        tokio::time::sleep(LEASE).await;
        assert_eq!(
            store.begin(&k("k"), &fp("fp"), &own("o2"), LEASE).await.unwrap(),
            Begin::Claimed
        );
    }

    #[tokio::test(start_paused = true)]
    async fn claims_started_at_different_times_are_each_renewed_in_time() {
        let (store, renewals) = setup();
        let mut held = Vec::new();
        // A claim every 700 ms (not a divisor of the interval): each one's first renewal falls
        // due at its own time, and the ticker must wake for the soonest.
        for i in 0..8 {
            held.push(claim(&store, &renewals, &format!("k{i}"), "o1").await);
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        tokio::time::sleep(LEASE * 4).await;
        for i in 0..8 {
            let b = store
                .begin(&k(&format!("k{i}")), &fp("fp"), &own("o2"), LEASE)
                .await
                .unwrap();
            assert!(held_by_another(&b), "k{i} lapsed: {b:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_lease_claimed_while_the_ticker_sleeps_for_a_longer_one_is_renewed_in_time() {
        let (store, renewals) = setup();
        // A route with a 30 s lease: the ticker plans to wake in 10 s.
        let long = Duration::from_secs(30);
        assert_eq!(
            store.begin(&k("slow"), &fp("fp"), &own("o1"), long).await.unwrap(),
            Begin::Claimed
        );
        let live = Arc::new(Live::new(k("slow"), fp("fp"), own("o1"), 1024));
        let _slow = renewals.renew(live, long, "slow".into());
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Another route's 3 s lease: due in 1 s, long before the ticker's plan.
        let _fast = claim(&store, &renewals, "fast", "o1").await;
        tokio::time::sleep(LEASE * 2).await;
        assert!(held_by_another(
            &store.begin(&k("fast"), &fp("fp"), &own("o2"), LEASE).await.unwrap()
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_taken_by_another_owner_is_no_longer_renewed() {
        let (store, renewals) = setup();
        let _renewal = claim(&store, &renewals, "k", "o1").await;
        // The store lost it (evicted, or it lapsed while the store was away) and another took it.
        assert!(store.release(&k("k"), &own("o1")).await.unwrap());
        assert_eq!(
            store.begin(&k("k"), &fp("fp"), &own("o2"), LEASE).await.unwrap(),
            Begin::Claimed
        );
        tokio::time::sleep(LEASE / 3 + Duration::from_millis(10)).await;
        assert!(renewals.is_empty(), "a refused renewal stops its claim's renewals");
        assert!(held_by_another(
            &store.begin(&k("k"), &fp("fp"), &own("o1"), LEASE).await.unwrap()
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_with_no_claims_goes_quiet_and_wakes_for_the_next() {
        let (store, renewals) = setup();
        drop(claim(&store, &renewals, "k1", "o1").await);
        // One interval awake after the last claim, then no timer at all.
        tokio::time::sleep(LEASE).await;
        assert!(renewals.quiet());
        // The next claim wakes it and is renewed.
        let _renewal = claim(&store, &renewals, "k2", "o1").await;
        assert!(!renewals.quiet());
        tokio::time::sleep(LEASE * 3).await;
        assert!(held_by_another(
            &store.begin(&k("k2"), &fp("fp"), &own("o2"), LEASE).await.unwrap()
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn the_ticker_ends_with_the_renewals() {
        let (store, renewals) = setup();
        drop(claim(&store, &renewals, "k", "o1").await);
        let weak = Arc::downgrade(&renewals);
        drop(renewals);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            weak.upgrade().is_none(),
            "the ticker holds no strong reference while it waits"
        );
    }
}
