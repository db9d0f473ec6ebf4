//! Owner liveness: which replicas of the fleet are alive, so that the claims of one that
//! died (SIGKILL, OOM kill, node loss) stop holding their keys long before their lease ends.
//!
//! Every replica has an id (64 random bits, new at each start) that begins the owner token of each
//! claim it makes (`{replica}.{claim}`), and keeps a liveness record in Redis,
//! `{prefix}idem:alive:{replica}`, with a TTL of `[redis] liveness` (1.5 s), set again every quarter
//! of it: one `SET .. PX .. GET` per replica per beat, whatever it has in flight. A replica whose
//! record is gone has not been heard for a whole TTL: it is dead, or cut off from Redis.
//!
//! Two places ask, and only when a key is found in progress under another replica's claim:
//! a duplicate (`wait` or `follow`) that finds the record in progress, and the reader of a
//! followed response that has heard nothing for a while. A dead owner's followers are aborted
//! (they have bytes of a response that will never end), and its key is taken over by the next
//! request with it (a compare-and-set on the owner token: [`super::RedisStore::take_over`]).
//!
//! A replica trusts its own view only while its heartbeats land ([`Trust`]): after a gap in its
//! own record (Redis frozen or restarted, or this replica cut off) it waits one TTL before it
//! takes anyone for dead, so that a stall every replica lived through is not read as their deaths.
//! Owner tokens of another form (before this version) are never taken for dead: their keys free
//! as they always did, when their lease ends.

use parking_lot::Mutex;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::redis::{RedisHandle, ReplicaId};
use crate::time::{self, Instant};

/// A claim's owner token, `{replica}.{claim}` (tokens of builds before owner liveness have
/// another form): every write after the claim checks it. Its own type so that it cannot be passed
/// where a record key or a fingerprint is asked for.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Owner(String);

impl Owner {
    /// A token from its text, as a record holds it (one read back, or a test's).
    pub fn new(text: impl Into<String>) -> Owner {
        Owner(text.into())
    }

    /// A new claim's token on `replica`: its id, then 64 random bits (`{replica}.{claim}`).
    pub(crate) fn mint(replica: &ReplicaId) -> Owner {
        let n: u64 = rand::random();
        let mut token = String::with_capacity(ReplicaId::HEX + 17);
        token.push_str(replica.as_str());
        token.push('.');
        super::fingerprint::push_hex(&mut token, &n.to_be_bytes());
        Owner(token)
    }

    /// The text, for Redis and logs.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The replica that made the claim ([`replica_of`]).
    pub(crate) fn replica(&self) -> Option<&str> {
        replica_of(&self.0)
    }

    /// Whether the token is unknown (a record that named no owner).
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Owner({:?})", self.0)
    }
}

/// The owner of a claim whose replica is dead, as a takeover names it
/// ([`super::RedisStore::take_over`]): a type of its own, so that it cannot be swapped with the
/// owner taking the claim over.
#[derive(Debug, Clone, Copy)]
pub struct DeadOwner<'a>(pub &'a Owner);

/// The replica that made the claim `owner` (`{replica}.{claim}`); `None` for a token of another
/// form (made before owner liveness existed: never taken for dead).
pub(crate) fn replica_of(owner: &str) -> Option<&str> {
    let (replica, claim) = owner.split_once('.')?;
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    (replica.len() == ReplicaId::HEX && hex(replica) && hex(claim)).then_some(replica)
}

/// Whether this replica may take another for dead: its own heartbeats landed without a gap for
/// at least one TTL, and the last one within a TTL. Pure: the caller gives the instants.
#[derive(Debug, Clone, Default)]
pub(crate) struct Trust {
    /// Since when this replica's own record has been in Redis without a gap (as far as it knows).
    since: Option<Instant>,
    /// When its last heartbeat was answered.
    last: Option<Instant>,
}

impl Trust {
    /// A heartbeat was answered at `at`; `continuous`: the record was still there (no gap).
    pub(crate) fn answered(&mut self, at: Instant, continuous: bool, ttl: Duration) {
        self.last = Some(at);
        if !continuous {
            // Set anew: anyone's record may have lapsed in the same gap.
            self.since = Some(at);
        } else if self.since.is_none() {
            // There without a gap since at least the previous heartbeat.
            self.since = Some(at.checked_sub(ttl).unwrap_or(at));
        }
    }

    /// Whether a missing record of another replica means it is dead, at `now`.
    pub(crate) fn trusted(&self, now: Instant, ttl: Duration) -> bool {
        match (self.since, self.last) {
            (Some(since), Some(last)) => {
                now.saturating_duration_since(since) >= ttl && now.saturating_duration_since(last) <= ttl
            }
            _ => false,
        }
    }
}

/// This replica's heartbeat, and its view of the others.
pub(crate) struct Liveness {
    redis: RedisHandle,
    replica: ReplicaId,
    ttl: Duration,
    trust: Mutex<Trust>,
}

impl Liveness {
    pub(crate) fn new(redis: RedisHandle, replica: ReplicaId) -> Arc<Liveness> {
        let ttl = redis.liveness();
        Arc::new(Liveness {
            redis,
            replica,
            ttl,
            trust: Mutex::new(Trust::default()),
        })
    }

    /// How long a replica counts as alive after its last heartbeat (`[redis] liveness`).
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    fn key(&self, replica: &str) -> String {
        self.redis.key(&format!("idem:alive:{replica}"))
    }

    /// Starts the heartbeat (until `stop`: the process's end, after its drain).
    pub(crate) fn start(self: &Arc<Self>, tasks: &TaskTracker, stop: CancellationToken) {
        let liveness = self.clone();
        tasks.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                () = liveness.beat_forever() => {}
            }
        });
    }

    async fn beat_forever(&self) {
        let every = self.ttl / 4;
        loop {
            self.beat().await;
            tokio::time::sleep(every).await;
        }
    }

    /// One heartbeat: the record set again for a TTL, and whether it was still there.
    async fn beat(&self) {
        let key = self.key(self.replica.as_str());
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let key = &key;
        let answer = self
            .redis
            .run("idem_alive", |mut c| async move {
                redis::cmd("SET")
                    .arg(key)
                    .arg(1)
                    .arg("PX")
                    .arg(ttl_ms)
                    .arg("GET")
                    .query_async::<Option<String>>(&mut c)
                    .await
            })
            .await;
        if let Ok(previous) = answer {
            let continuous = previous.is_some();
            let now = time::now();
            let was_trusted = {
                let mut trust = self.trust.lock();
                let was = trust.trusted(now, self.ttl);
                trust.answered(now, continuous, self.ttl);
                was
            };
            if !continuous && was_trusted {
                tracing::warn!(
                    "this replica's liveness record had lapsed (Redis stalled, restarted or unreachable for longer than [redis] liveness): other replicas may have taken over its keys in progress"
                );
            }
        }
    }

    /// Whether the replica that made the claim `owner` is dead: another replica's, its liveness
    /// record gone, while this replica's own heartbeats are trusted. One `EXISTS`; an error, an
    /// untrusted view, this replica's own claims and tokens of another form all count as alive.
    pub(crate) async fn is_dead(&self, owner: &Owner) -> bool {
        let Some(replica) = owner.replica() else {
            return false;
        };
        if replica == self.replica.as_str() || !self.trust.lock().trusted(time::now(), self.ttl) {
            return false;
        }
        let key = self.key(replica);
        let key = &key;
        let found = self
            .redis
            .run("idem_alive", |mut c| async move {
                redis::cmd("EXISTS").arg(key).query_async::<i64>(&mut c).await
            })
            .await;
        matches!(found, Ok(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(2);

    #[test]
    fn owner_tokens_name_their_replica() {
        let replica = ReplicaId::random();
        let owner = format!("{replica}.00ff00ff00ff00ff");
        assert_eq!(replica_of(&owner), Some(replica.as_str()));
        // Tokens made before owner liveness (128 random bits, no dot) name no replica.
        assert_eq!(replica_of("0123456789abcdef0123456789abcdef"), None);
        for bad in [
            "",
            ".",
            "0123456789abcdef.",
            ".0a",
            "0123456789abcdeg.0a",
            "0123.0a",
            "0123456789abcdef.0a.0a",
        ] {
            assert_eq!(replica_of(bad), None, "{bad:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn trust_starts_one_ttl_after_the_first_heartbeat() {
        let mut t = Trust::default();
        let start = time::now();
        assert!(!t.trusted(start, TTL), "no heartbeat yet");
        t.answered(start, false, TTL);
        assert!(!t.trusted(start, TTL));
        assert!(!t.trusted(start + TTL - Duration::from_millis(1), TTL));
        // Heartbeats every quarter of the TTL: trusted once the record has been there a TTL.
        for i in 1..=4 {
            t.answered(start + TTL / 4 * i, true, TTL);
        }
        assert!(t.trusted(start + TTL, TTL));
    }

    #[tokio::test(start_paused = true)]
    async fn a_gap_in_its_own_record_suspends_trust_for_a_ttl() {
        let mut t = Trust::default();
        let start = time::now();
        t.answered(start, false, TTL);
        t.answered(start + TTL, true, TTL);
        assert!(t.trusted(start + TTL, TTL));
        // Redis froze for 5 s: every record lapsed, this one too.
        let thaw = start + TTL + Duration::from_secs(5);
        assert!(!t.trusted(thaw, TTL), "no heartbeat answered for longer than a TTL");
        t.answered(thaw, false, TTL);
        assert!(!t.trusted(thaw, TTL), "its record was set anew");
        assert!(!t.trusted(thaw + TTL / 2, TTL));
        t.answered(thaw + TTL / 2, true, TTL);
        t.answered(thaw + TTL, true, TTL);
        assert!(t.trusted(thaw + TTL, TTL), "a whole TTL after the gap");
    }

    #[tokio::test(start_paused = true)]
    async fn failed_heartbeats_end_trust_within_a_ttl_and_a_kept_record_restores_it() {
        let mut t = Trust::default();
        let start = time::now();
        t.answered(start, false, TTL);
        t.answered(start + TTL, true, TTL);
        // Heartbeats fail (not answered): still trusted for a TTL after the last answer.
        assert!(t.trusted(start + TTL * 2, TTL));
        assert!(!t.trusted(start + TTL * 2 + Duration::from_millis(1), TTL));
        // The next one finds the record still there (no gap as Redis saw it): trusted again.
        let mut fresh = Trust::default();
        fresh.answered(start + TTL * 3, true, TTL);
        assert!(fresh.trusted(start + TTL * 3, TTL));
    }
}
