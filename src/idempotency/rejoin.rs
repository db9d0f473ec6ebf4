//! One continuation per cut stream, fleet-wide: when the replica that owns a live response dies
//! mid-stream, its followers (on any replica) race for the key. The first to claim it
//! ([`Rejoin::Won`]: `idem_takeover_cut_v1`, which writes the byte it continues after) continues
//! the response under the key, its claim's response begun with what was followed; every other
//! follower ([`Rejoin::Follow`]) reads that continuation from the same byte, on whichever replica
//! runs it, as it read the original. A duplicate that comes later follows (or replays) the
//! continued whole.
//!
//! A follower whose owner is alive ([`Rejoin::OwnerRuns`]: its mirror lost the relay, a failover
//! of Redis, while the original runs on) is not continued: a continuation of its own would be a
//! second answer for the key. It ends as a follower of a route without continuation does.
//!
//! Anything else ([`Rejoin::Alone`]: no Redis, the record restarted by a takeover, a follower
//! that has other bytes than the winner) leaves the follower to continue on its own, as a
//! follower of a route without a key would.

use std::sync::Arc;

use super::live::{Follower, Live};
use super::liveness::{DeadOwner, Owner};
use super::redis_store::{CutTakeover, Succession};
use super::AnyStore;
use super::{Claim, Idempotency};
use crate::config::OnConcurrent;

/// Who continues a followed stream whose owner died.
pub(crate) enum Rejoin {
    /// This request: its claim (the response begun with the followed bytes) records the
    /// continuation; `Live` is that response.
    Won(Claim, Arc<Live>),
    /// Another request: its response from the byte this follower has on, and that response.
    Follow(Follower, Arc<Live>),
    /// Nobody for this follower: it continues on its own.
    Alone,
    /// The original runs on (its replica is alive): not continued here.
    OwnerRuns,
}

impl super::Followed {
    /// The response it follows.
    pub(crate) fn live(&self) -> Arc<Live> {
        self.body.live().clone()
    }
}

impl Idempotency {
    /// A follower of `dead` (a response whose stream was cut: aborted) asks who continues it.
    pub(crate) async fn rejoin(&self, dead: &Arc<Live>) -> Rejoin {
        let records = &self.records;
        let (Some(liveness), AnyStore::Redis(store), Some(relay)) =
            (records.liveness.as_ref(), &records.store, records.relay.as_ref())
        else {
            return Rejoin::Alone;
        };
        let p = &self.policy;
        let (Some(head), Some(prefix)) = (dead.head_now(), dead.body()) else {
            return Rejoin::Alone;
        };
        if p.on_concurrent != OnConcurrent::Follow {
            return Rejoin::Alone;
        }
        if !liveness.is_dead(&dead.owner).await {
            return Rejoin::OwnerRuns;
        }
        let owner = Owner::mint(&records.replica);
        let from = prefix.len() as u64;
        let heir = Succession {
            dead: DeadOwner(&dead.owner),
            owner: &owner,
            lease: p.lease,
            liveness: liveness.ttl(),
        };
        let taken = store.take_over_cut(&dead.record, &dead.fingerprint, heir, from).await;
        match taken {
            Ok(CutTakeover::Won) => {
                self.count_takeover();
                tracing::warn!(route = %self.route, "a followed stream's replica died mid-stream: its continuation runs here, for every follower");
                let (record, fingerprint) = (dead.record.clone(), dead.fingerprint.clone());
                let claim = self.claim(record, owner, fingerprint, true);
                let Some(live) = claim.live() else {
                    return Rejoin::Alone;
                };
                // Begun with what was followed (its head first: a duplicate that finds it now
                // waits for that, then reads these bytes before any of the continuation's).
                live.set_head(head);
                live.push(&prefix);
                Rejoin::Won(claim, live)
            }
            Ok(CutTakeover::Continued {
                owner: theirs,
                from: at,
            }) if at == from => {
                let cap = usize::try_from(p.max_stored_body).unwrap_or(usize::MAX);
                let live = match records.lives.get(&dead.record).filter(|l| l.owner == theirs) {
                    Some(live) => live,
                    None => relay.mirror(&dead.record, &theirs, &dead.fingerprint, cap),
                };
                tracing::info!(route = %self.route, "a followed stream's replica died mid-stream: following its continuation");
                Rejoin::Follow(live.follower_from(prefix.len()), live)
            }
            Ok(_) => Rejoin::Alone,
            Err(e) => {
                tracing::warn!(route = %self.route, error = %e, "the takeover of a cut stream was not written");
                if e.maybe_applied() {
                    self.release_orphan(dead.record.clone(), owner);
                }
                Rejoin::Alone
            }
        }
    }
}
