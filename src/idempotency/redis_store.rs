//! The Redis idempotency store: any replica answers. One Lua script per operation, each one round
//! trip, each checking the owner token (compare-and-set). A record is one hash (state,
//! fingerprint, owner, response metadata, body), so every script touches one key and the key's
//! hash tag keeps it valid on Redis Cluster. TTLs are Redis's own (PEXPIRE): no replica's clock is
//! trusted.

use std::time::Duration;

use bytes::Bytes;
use redis::{Script, Value};
use serde::{Deserialize, Serialize};

use super::fingerprint::{Fingerprint, RecordKey};
use super::liveness::{DeadOwner, Owner};
use super::store::{Begin, Completion, KeptHeaders, Store, StoreError, StoredResponse};
use crate::redis::RedisHandle;

/// The Redis-backed store.
#[derive(Clone)]
pub struct RedisStore {
    redis: RedisHandle,
    scripts: std::sync::Arc<Scripts>,
}

struct Scripts {
    begin: Script,
    renew: Script,
    complete: Script,
    release: Script,
    take_over: Script,
    take_over_cut: Script,
    reclaim: Script,
}

/// A stored response's status and headers, as kept in its record (JSON).
#[derive(Deserialize)]
struct Meta {
    status: u16,
    headers: Vec<(String, String)>,
    /// When it was stored (unix ms, the writer's clock; 0 in records of earlier versions).
    #[serde(default)]
    at: u64,
}

/// [`Meta`] written from a response, its headers borrowed.
#[derive(Serialize)]
struct MetaOf<'a> {
    status: u16,
    headers: &'a KeptHeaders,
    at: u64,
}

impl RedisStore {
    pub fn new(redis: RedisHandle) -> RedisStore {
        let scripts = Scripts {
            begin: Script::new(include_str!("../redis/scripts/idem_begin_v4.lua")),
            renew: Script::new(include_str!("../redis/scripts/idem_renew_v2.lua")),
            complete: Script::new(include_str!("../redis/scripts/idem_complete_v2.lua")),
            release: Script::new(include_str!("../redis/scripts/idem_release_v2.lua")),
            take_over: Script::new(include_str!("../redis/scripts/idem_takeover_v1.lua")),
            take_over_cut: Script::new(include_str!("../redis/scripts/idem_takeover_cut_v1.lua")),
            reclaim: Script::new(include_str!("../redis/scripts/cache_reclaim_v1.lua")),
        };
        RedisStore {
            redis,
            scripts: std::sync::Arc::new(scripts),
        }
    }

    fn full_key(&self, key: &RecordKey) -> String {
        self.redis.key(key.as_str())
    }
}

fn ms(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// For the fuzz targets under `fuzz/`.
#[doc(hidden)]
pub(crate) fn fuzz_parse_begin(reply: Vec<Value>) -> Result<Begin, StoreError> {
    parse_begin(reply)
}

pub(super) fn parse_begin(reply: Vec<Value>) -> Result<Begin, StoreError> {
    let bad = || StoreError::UnexpectedReply("idem_begin_v4");
    match text(reply.first()).as_deref() {
        // Only when this replica's estimate of Redis's clock is off by more than the time left.
        Some("late") => Err(StoreError::Late("idem_begin_v4")),
        Some("claimed") => Ok(Begin::Claimed),
        Some("mismatch") => Ok(Begin::Mismatch),
        Some("not_kept") => Ok(Begin::NotKept),
        Some("in_progress") => {
            let pttl = match reply.get(1) {
                Some(Value::Int(n)) => (*n).max(0) as u64,
                _ => 0,
            };
            Ok(Begin::InProgress {
                lease_left: Duration::from_millis(pttl),
                owner: Owner::new(text(reply.get(2)).unwrap_or_default()),
            })
        }
        Some("completed") => {
            let meta: Meta = text(reply.get(1))
                .and_then(|m| serde_json::from_str(&m).ok())
                .ok_or_else(bad)?;
            let body = match reply.get(2) {
                Some(Value::BulkString(b)) => Bytes::from(b.clone()),
                _ => Bytes::new(),
            };
            let age = match meta.at {
                0 => 0,
                at => crate::time::now_unix_ms().saturating_sub(at),
            };
            Ok(Begin::Completed(StoredResponse {
                status: meta.status,
                headers: meta.headers.into(),
                body,
                age: Duration::from_millis(age),
            }))
        }
        _ => Err(bad()),
    }
}

/// What a takeover of a dead replica's claim did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakenOver {
    /// The key is this request's now.
    Yes,
    /// The record is no longer that claim's (completed, released, taken over): look again.
    Changed,
    /// The claim is younger than `liveness`: left alone (its replica may be alive).
    TooYoung,
}

/// What a takeover of a dead replica's cut stream did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CutTakeover {
    /// The key is this request's now: it continues the response.
    Won,
    /// Another request continues it: its owner, and the byte it continues after.
    Continued { owner: Owner, from: u64 },
    /// Anything else (the claim too young, the record completed, released, or restarted).
    Lost,
}

/// Who takes over a dead replica's claim, and on what terms ([`RedisStore::take_over`], and
/// `take_over_cut` for a cut stream).
#[derive(Debug, Clone, Copy)]
pub struct Succession<'a> {
    /// The claim's owner, whose replica stopped heartbeating.
    pub dead: DeadOwner<'a>,
    /// The owner token that takes the claim over.
    pub owner: &'a Owner,
    /// The new claim's lease.
    pub lease: Duration,
    /// A claim younger than this is left alone: its replica may not have written its liveness
    /// record yet.
    pub liveness: Duration,
}

/// A completion's arguments (`idem_complete_v2`'s ARGV).
struct CompleteArgs<'a> {
    /// The owner token that holds the claim (compare-and-set).
    owner: &'a Owner,
    /// The record's new state: `C` (the response kept) or `U` (completed, not kept).
    state: &'a str,
    /// The kept response's status and headers ([`MetaOf`], JSON); empty when not kept.
    meta: &'a str,
    /// The kept response's body; empty when not kept.
    body: &'a Bytes,
    /// How long the record is kept, in milliseconds.
    ttl_ms: u64,
    fingerprint: &'a Fingerprint,
}

/// A claim script, and the name its round trip is run (counted, logged) under.
#[derive(Clone, Copy)]
struct ClaimOp<'a> {
    script: &'a Script,
    /// The operation's name (`idem_begin`, `cache_reclaim`).
    op: &'static str,
}

impl RedisStore {
    /// Claims `key`, in progress under `heir.dead` (a claim of a replica that stopped
    /// heartbeating), for `heir.owner`, unless that claim is younger than `heir.liveness` (its
    /// replica may not have written its liveness record yet).
    pub async fn take_over(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        heir: Succession<'_>,
    ) -> Result<TakenOver, StoreError> {
        let Succession {
            dead,
            owner,
            lease,
            liveness,
        } = heir;
        let key = self.full_key(key);
        let script = &self.scripts.take_over;
        let give_up_at = self.redis.give_up_at_ms();
        let n: i64 = self
            .redis
            .run("idem_takeover", |mut c| async move {
                script
                    .key(&key)
                    .arg(fingerprint.as_str())
                    .arg(dead.0.as_str())
                    .arg(owner.as_str())
                    .arg(ms(lease))
                    .arg(give_up_at)
                    .arg(ms(liveness))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        match n {
            1 => Ok(TakenOver::Yes),
            -1 => Err(StoreError::Late("idem_takeover_v1")),
            -2 => Ok(TakenOver::TooYoung),
            _ => Ok(TakenOver::Changed),
        }
    }

    /// Claims `key`, in progress under `heir.dead`, for `heir.owner` to continue its response
    /// after its first `from` bytes; or who continues it already (`idem_takeover_cut_v1`).
    pub(crate) async fn take_over_cut(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        heir: Succession<'_>,
        from: u64,
    ) -> Result<CutTakeover, StoreError> {
        let Succession {
            dead,
            owner,
            lease,
            liveness,
        } = heir;
        let key = self.full_key(key);
        let script = &self.scripts.take_over_cut;
        let give_up_at = self.redis.give_up_at_ms();
        let reply: Vec<Value> = self
            .redis
            .run("idem_takeover", |mut c| async move {
                script
                    .key(&key)
                    .arg(fingerprint.as_str())
                    .arg(dead.0.as_str())
                    .arg(owner.as_str())
                    .arg(ms(lease))
                    .arg(give_up_at)
                    .arg(ms(liveness))
                    .arg(from)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let text = |i: usize| match reply.get(i) {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            _ => String::new(),
        };
        Ok(match reply.first() {
            Some(Value::Int(1)) => CutTakeover::Won,
            Some(Value::Int(-1)) => return Err(StoreError::Late("idem_takeover_cut_v1")),
            Some(Value::Int(0)) if text(1) == "P" => {
                let own = text(2);
                let from = text(3)
                    .split_once(' ')
                    .filter(|(by, _)| *by == own)
                    .and_then(|(_, n)| n.parse().ok());
                match from {
                    Some(from) => CutTakeover::Continued {
                        owner: Owner::new(own),
                        from,
                    },
                    None => CutTakeover::Lost,
                }
            }
            _ => CutTakeover::Lost,
        })
    }

    /// Whether completions wait for replica acknowledgements (`wait_replicas` > 0).
    pub(crate) fn waits_for_replicas(&self) -> bool {
        self.redis.wait_replicas() > 0
    }

    /// A completion followed by `WAIT replicas` in one round trip, on the durable lane: it
    /// counts as written once that many replicas acknowledged it within `command_timeout`
    /// (else an error that may have applied, so the completion is retried until they do).
    async fn complete_waited(&self, key: &str, args: CompleteArgs<'_>, replicas: u32) -> Result<bool, StoreError> {
        let CompleteArgs {
            owner,
            state,
            meta,
            body,
            ttl_ms,
            fingerprint,
        } = args;
        let script = &self.scripts.complete;
        // WAIT answers before the command timeout gives up on it.
        let wait_ms = u64::try_from((self.redis.command_timeout() * 3 / 4).as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg(script.get_hash())
            .arg(1)
            .arg(key)
            .arg(owner.as_str())
            .arg(state)
            .arg(meta)
            .arg(body.as_ref())
            .arg(ttl_ms)
            .arg(fingerprint.as_str());
        let mut pipe = redis::pipe();
        pipe.add_command(evalsha).cmd("WAIT").arg(replicas).arg(wait_ms);
        let pipe = &pipe;
        let (n, acked): (i64, i64) = self
            .redis
            .run_durable("idem_complete", |mut c| async move {
                match pipe.query_async(&mut c).await {
                    Err(e) if e.kind() == redis::ErrorKind::NoScriptError => {
                        script.prepare_invoke().load_async(&mut c).await?;
                        pipe.query_async(&mut c).await
                    }
                    other => other,
                }
            })
            .await?;
        if n >= 1 && acked < i64::from(replicas) {
            self.redis.count("idem_complete");
            return Err(StoreError::Redis(crate::redis::RedisError::NotReplicated {
                op: "idem_complete",
                wanted: replicas,
                acked,
            }));
        }
        Ok(n >= 1)
    }
}

impl RedisStore {
    /// Claims a response-cache record for a refresh (`cache_reclaim_v1`): a completed record is
    /// replaced by the claim.
    pub(crate) async fn reclaim(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        let reclaim = ClaimOp {
            script: &self.scripts.reclaim,
            op: "cache_reclaim",
        };
        self.claim_with(reclaim, key, fingerprint, owner, lease).await
    }

    async fn claim_with(
        &self,
        claim: ClaimOp<'_>,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        let ClaimOp { script, op } = claim;
        let key = self.full_key(key);
        let give_up_at = self.redis.give_up_at_ms();
        let reply: Vec<Value> = self
            .redis
            .run(op, |mut c| async move {
                script
                    .key(&key)
                    .arg(fingerprint.as_str())
                    .arg(owner.as_str())
                    .arg(ms(lease))
                    .arg(give_up_at)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        parse_begin(reply)
    }
}

impl Store for RedisStore {
    async fn begin(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        owner: &Owner,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        let begin = ClaimOp {
            script: &self.scripts.begin,
            op: "idem_begin",
        };
        self.claim_with(begin, key, fingerprint, owner, lease).await
    }

    async fn renew(&self, key: &RecordKey, owner: &Owner, lease: Duration) -> Result<bool, StoreError> {
        let key = self.full_key(key);
        let script = &self.scripts.renew;
        let give_up_at = self.redis.give_up_at_ms();
        let n: i64 = self
            .redis
            .run("idem_renew", |mut c| async move {
                script
                    .key(&key)
                    .arg(owner.as_str())
                    .arg(ms(lease))
                    .arg(give_up_at)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        match n {
            -1 => Err(StoreError::Late("idem_renew_v2")),
            n => Ok(n == 1),
        }
    }

    async fn complete(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        owner: &Owner,
        completion: &Completion,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let key = self.full_key(key);
        let script = &self.scripts.complete;
        let (state, meta, body) = match completion {
            Completion::Kept(r) => {
                let meta = MetaOf {
                    status: r.status,
                    headers: &r.headers,
                    at: crate::time::now_unix_ms(),
                };
                ("C", serde_json::to_string(&meta).unwrap_or_default(), r.body.clone())
            }
            Completion::NotKept => ("U", String::new(), Bytes::new()),
        };
        let replicas = self.redis.wait_replicas();
        if replicas > 0 {
            let args = CompleteArgs {
                owner,
                state,
                meta: &meta,
                body: &body,
                ttl_ms: ms(ttl),
                fingerprint,
            };
            return self.complete_waited(&key, args, replicas).await;
        }
        let n: i64 = self
            .redis
            .run("idem_complete", |mut c| async move {
                script
                    .key(&key)
                    .arg(owner.as_str())
                    .arg(state)
                    .arg(meta)
                    .arg(body.as_ref())
                    .arg(ms(ttl))
                    .arg(fingerprint.as_str())
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(n >= 1)
    }

    async fn release(&self, key: &RecordKey, owner: &Owner) -> Result<bool, StoreError> {
        let key = self.full_key(key);
        let script = &self.scripts.release;
        let n: i64 = self
            .redis
            .run("idem_release", |mut c| async move {
                script.key(&key).arg(owner.as_str()).invoke_async(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Nil),
            any::<i64>().prop_map(Value::Int),
            proptest::collection::vec(any::<u8>(), 0..64).prop_map(Value::BulkString),
            "[a-z_]{0,12}".prop_map(Value::SimpleString),
            prop_oneof![
                Just("claimed"),
                Just("mismatch"),
                Just("in_progress"),
                Just("not_kept"),
                Just("completed"),
                Just("late"),
            ]
            .prop_map(|s| Value::BulkString(s.as_bytes().to_vec())),
            "\\{\"status\":[0-9]{1,3},\"headers\":\\[\\]\\}".prop_map(|s| Value::BulkString(s.into_bytes())),
        ]
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config(1024))]

        /// Whatever Redis hands back (a corrupted record, another version's script): an error or
        /// a decision, never a panic.
        #[test]
        fn any_begin_reply_is_decoded_or_refused(reply in proptest::collection::vec(value(), 0..4)) {
            let _ = parse_begin(reply);
        }
    }
}
