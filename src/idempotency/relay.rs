//! Following an original that runs on another replica (`on_concurrent = "follow"` with Redis).
//!
//! Nothing is relayed until someone follows: a replica whose duplicate finds the key in progress
//! elsewhere publishes `record owner` on the fleet's follow channel; the replica that owns the
//! claim (its owner token names it) then relays the response, from byte 0, into a Redis Stream of
//! its own (`{record}:live:{owner}`, same hash tag as the record): a head entry, data entries (as
//! much as is ready per `XADD`, one write in flight), and an end entry, at most
//! `max_stored_body` of data (past it: an end entry `cut`), the stream expiring a lease after
//! its last write. On the follower's replica, one reader per followed response (a dedicated
//! connection, `XREAD BLOCK`) fills a local [`Live`] mirror that every follower there reads.
//!
//! A reader that hears nothing keeps asking (the owner may not have registered its claim yet),
//! and checks the record: once it is no longer in progress under that owner, or that owner's
//! replica is dead (no heartbeat for `[redis] liveness`: [`super::liveness`]), a response that
//! never arrived is treated as released (the followers then look at the record again: usually a
//! replay, or a takeover of a dead replica's key), one cut short as aborted. A reader of a response
//! whose replica died thus ends its followers within `liveness` + [`READ_BLOCK`] of the death.

use foldhash::HashMap;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use redis::streams::StreamReadReply;
use redis::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::fingerprint::{Fingerprint, RecordKey};
use super::live::{concat, End, Head, HeadOrEnd, Live, Lives};
use super::liveness::{Liveness, Owner};
use crate::redis::{RedisError, RedisHandle};

/// The most data per stream entry.
const MAX_ENTRY: usize = 256 << 10;
/// How long a reader blocks for the next entries before it looks at the record (and at the
/// liveness of the original's replica).
const READ_BLOCK: Duration = Duration::from_millis(500);
/// What a blocking read's answer may take past its block before the read counts as failed. Not
/// `[redis] command_timeout` (100 ms by default, for commands that answer at once): Redis answers
/// an empty blocking read from its event loop, up to 100 ms late when idle and more when the host
/// is busy, and a read taken for failed ends its followers (or, while the original's replica still
/// looks alive, cuts them: `Rejoin::OwnerRuns`), though nothing was lost.
const READ_SLACK: Duration = Duration::from_secs(1);
/// The first and the longest pause before a follow request is published again.
const ASK_FIRST: Duration = Duration::from_millis(50);
const ASK_MAX: Duration = Duration::from_secs(1);

/// The relay of this replica: answers follow requests, and mirrors followed responses.
pub(crate) struct Relay {
    redis: RedisHandle,
    lives: Arc<Lives>,
    /// Which replicas are dead (a followed original's included).
    liveness: Arc<Liveness>,
    channel: String,
    /// Mirrors of responses followed here, by relay stream key.
    mirrors: Mutex<HashMap<String, Arc<Live>>>,
    tasks: TaskTracker,
    stop: CancellationToken,
}

/// The relay stream of the claim `owner` holds on `record` (a store key, without the prefix).
fn stream_key(redis: &RedisHandle, record: &RecordKey, owner: &Owner) -> String {
    redis.key(&format!("{record}:live:{owner}"))
}

impl Relay {
    pub(super) fn new(
        redis: RedisHandle,
        lives: Arc<Lives>,
        liveness: Arc<Liveness>,
        tasks: TaskTracker,
        stop: CancellationToken,
    ) -> Arc<Relay> {
        let channel = redis.key("idem:follow");
        Arc::new(Relay {
            redis,
            lives,
            liveness,
            channel,
            mirrors: Mutex::new(HashMap::default()),
            tasks,
            stop,
        })
    }

    /// Starts answering follow requests (until the process stops).
    pub(super) fn start(self: &Arc<Self>) {
        let relay = self.clone();
        self.tasks.spawn(async move { relay.listen().await });
    }

    /// The mirror of the response `owner` produces for `record` on another replica (one per
    /// response on this replica, shared by its followers here).
    pub(crate) fn mirror(
        self: &Arc<Self>,
        record: &RecordKey,
        owner: &Owner,
        fingerprint: &Fingerprint,
        cap: usize,
    ) -> Arc<Live> {
        let key = stream_key(&self.redis, record, owner);
        let mut mirrors = self.mirrors.lock();
        if let Some(live) = mirrors.get(&key) {
            return live.clone();
        }
        let live = Arc::new(Live::new(record.clone(), fingerprint.clone(), owner.clone(), cap));
        mirrors.insert(key.clone(), live.clone());
        let reader = Reader {
            relay: self.clone(),
            record: self.redis.key(record.as_str()),
            ask: format!("{record} {owner}"),
            owner: owner.clone(),
            key,
            live: live.clone(),
        };
        self.tasks.spawn(reader.run());
        live
    }

    /// Listens for follow requests, resubscribing after any loss.
    async fn listen(self: Arc<Self>) {
        let connect_timeout = self.redis.command_timeout().max(Duration::from_millis(500));
        let mut backoff = Duration::from_millis(100);
        loop {
            let connect = async {
                let mut pubsub = self.redis.pubsub().await?;
                let subscribed = pubsub.subscribe(&self.channel).await;
                subscribed.map_err(|source| RedisError::Command {
                    op: "subscribe",
                    source,
                })?;
                Ok::<_, RedisError>(pubsub)
            };
            let subscribed = tokio::select! {
                _ = self.stop.cancelled() => return,
                r = tokio::time::timeout(connect_timeout, connect) => r,
            };
            if let Ok(Err(e)) = &subscribed {
                tracing::debug!(error = %e, "idempotency relay cannot subscribe to follow requests; retrying");
            }
            if let Ok(Ok(pubsub)) = subscribed {
                backoff = Duration::from_millis(100);
                let mut messages = pubsub.into_on_message();
                loop {
                    tokio::select! {
                        _ = self.stop.cancelled() => return,
                        msg = messages.next() => match msg {
                            Some(msg) => {
                                if let Ok(payload) = msg.get_payload::<String>() {
                                    self.answer(&payload);
                                }
                            }
                            None => break,
                        },
                    }
                }
            }
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(self.redis.reconnect_backoff_max());
        }
    }

    /// A follow request `record owner`: relay that response if it runs here (once).
    fn answer(self: &Arc<Self>, request: &str) {
        let Some((record, owner)) = request.split_once(' ') else {
            return;
        };
        let Some(live) = self.lives.by_text(record).filter(|l| l.owner.as_str() == owner) else {
            return;
        };
        if !live.start_relay() {
            return;
        }
        let relay = self.clone();
        let key = stream_key(&self.redis, &live.record, &live.owner);
        let cap = live.cap();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = relay.stop.cancelled() => {}
                () = relay.send(key, live, cap) => {}
            }
        });
    }

    /// Relays `live` into its stream, from its head to its end: at most `max_stored_body` of
    /// data (`cap`), after which the stream ends `cut` (followers here go on; those elsewhere are
    /// cut).
    async fn send(&self, key: String, live: Arc<Live>, cap: usize) {
        let ttl = self.redis.command_timeout().max(Duration::from_secs(30));
        self.append(&key, &[("a", Bytes::new())], ttl).await;
        let head = match live.head().await {
            HeadOrEnd::Head(h) => h,
            HeadOrEnd::TooLarge => {
                self.append(&key, &[("e", Bytes::from_static(b"cut"))], ttl).await;
                return;
            }
            HeadOrEnd::End(end) => {
                self.append(&key, &[("e", end_name(end))], ttl).await;
                return;
            }
        };
        let Ok(head) = serde_json::to_vec(&(head.status, &head.headers)) else {
            return;
        };
        if !self.append(&key, &[("h", Bytes::from(head))], ttl).await {
            return;
        }
        let (mut next, mut sent) = (0, 0usize);
        loop {
            let batch = live.next_batch(next, MAX_ENTRY).await;
            let offset = sent;
            sent = sent.saturating_add(batch.data.iter().map(Bytes::len).sum());
            if batch.cut || sent > cap {
                self.append(&key, &[("e", Bytes::from_static(b"cut"))], ttl).await;
                return;
            }
            next = batch.next;
            let mut fields = Vec::with_capacity(2);
            if !batch.data.is_empty() {
                fields.push(("d", concat(batch.data.iter())));
                // Where its bytes start: a reader tells a stream that lost entries (Redis lost
                // writes: a failover, a flush) from a whole one.
                fields.push(("o", Bytes::from(offset.to_string())));
            }
            if let Some(end) = batch.end {
                let unshared = end == End::Complete && live.is_unshared();
                fields.push((
                    "e",
                    if unshared {
                        Bytes::from_static(b"unshared")
                    } else {
                        end_name(end)
                    },
                ));
            }
            if !self.append(&key, &fields, ttl).await || batch.end.is_some() {
                return;
            }
        }
    }

    /// One stream entry, and the stream's expiry pushed back (one round trip).
    async fn append(&self, key: &str, fields: &[(&str, Bytes)], ttl: Duration) -> bool {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let written = self
            .redis
            .run("idem_relay", |mut c| async move {
                let mut xadd = redis::cmd("XADD");
                xadd.arg(key).arg("*");
                for (name, value) in fields {
                    xadd.arg(*name).arg(value.as_ref());
                }
                redis::pipe()
                    .add_command(xadd)
                    .ignore()
                    .cmd("PEXPIRE")
                    .arg(key)
                    .arg(ms)
                    .ignore()
                    .query_async::<()>(&mut c)
                    .await
            })
            .await;
        if let Err(e) = &written {
            tracing::warn!(error = %e, "idempotency relay write failed; followers elsewhere are cut");
        }
        written.is_ok()
    }
}

fn end_name(end: End) -> Bytes {
    Bytes::from_static(match end {
        End::Complete => b"complete",
        End::Aborted => b"aborted",
        End::Released => b"released",
    })
}

/// Fills one mirror from its relay stream.
struct Reader {
    relay: Arc<Relay>,
    /// The record's full key.
    record: String,
    /// The follow request to publish.
    ask: String,
    owner: Owner,
    key: String,
    live: Arc<Live>,
}

/// What the reader learned from one read.
enum Read {
    /// Entries came (the relay runs).
    Entries { accepted: bool, ended: bool },
    /// Nothing within the block time.
    Nothing,
    /// The connection failed.
    Failed,
}

impl Reader {
    async fn run(self) {
        tokio::select! {
            _ = self.relay.stop.cancelled() => self.live.finish(End::Aborted),
            () = self.read() => {}
        }
        let mut mirrors = self.relay.mirrors.lock();
        if mirrors.get(&self.key).is_some_and(|l| Arc::ptr_eq(l, &self.live)) {
            mirrors.remove(&self.key);
        }
    }

    async fn read(&self) {
        let redis = &self.relay.redis;
        // On a Cluster, the node that serves the stream's slot (the record's hash tag).
        let conn = redis.dedicated_for(&self.key, None).await;
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot follow an original on another replica");
                return self.live.finish(End::Released);
            }
        };
        let mut last = String::from("0");
        let mut received = 0u64;
        let mut accepted = false;
        let mut ask_every = ASK_FIRST;
        let mut asked_at = None;
        loop {
            if !accepted && asked_at.is_none_or(|at: tokio::time::Instant| at.elapsed() >= ask_every) {
                self.ask().await;
                asked_at = Some(crate::time::now());
                ask_every = (ask_every * 2).min(ASK_MAX);
            }
            let block = if accepted { READ_BLOCK } else { ask_every };
            match self.read_once(&mut conn, (&mut last, &mut received), block).await {
                Read::Entries { ended: true, .. } => return,
                Read::Entries { accepted: a, .. } => accepted |= a,
                Read::Failed => return self.live.finish(End::Aborted),
                Read::Nothing => {
                    if !self.original_runs().await {
                        // One last look: its end may have been written just before.
                        if let Read::Entries { ended: true, .. } = self
                            .read_once(&mut conn, (&mut last, &mut received), Duration::ZERO)
                            .await
                        {
                            return;
                        }
                        return self.live.finish(if accepted { End::Aborted } else { End::Released });
                    }
                }
            }
        }
    }

    /// Asks the owner's replica to relay its response.
    async fn ask(&self) {
        let (channel, ask) = (&self.relay.channel, &self.ask);
        let _ = self
            .relay
            .redis
            .run("idem_follow", |mut c| async move {
                redis::cmd("PUBLISH")
                    .arg(channel)
                    .arg(ask)
                    .query_async::<i64>(&mut c)
                    .await
            })
            .await;
    }

    /// Whether the record is still in progress under the owner this mirror follows, on a replica
    /// that is alive (a failure to tell counts as yes: the next look decides).
    async fn original_runs(&self) -> bool {
        let record = &self.record;
        let found = self
            .relay
            .redis
            .run("idem_follow", |mut c| async move {
                redis::cmd("HMGET")
                    .arg(record)
                    .arg("st")
                    .arg("own")
                    .arg("at")
                    .query_async::<(Option<String>, Option<String>, Option<i64>)>(&mut c)
                    .await
            })
            .await;
        match found {
            Ok((Some(st), Some(own), at)) if st == "P" && own == self.owner.as_str() => {
                // A claim younger than `liveness` may be its replica's first, before its first
                // heartbeat landed: never taken for dead (as idem_takeover_v1 refuses it).
                let liveness = &self.relay.liveness;
                let ttl_ms = i64::try_from(liveness.ttl().as_millis()).unwrap_or(i64::MAX);
                let old_enough = matches!(
                    (at, self.relay.redis.redis_now_ms()),
                    (Some(at), Some(now)) if now.saturating_sub(at) >= ttl_ms
                );
                if old_enough && liveness.is_dead(&self.owner).await {
                    tracing::warn!("the replica running a followed original died (no heartbeat for [redis] liveness): its followers here end");
                    return false;
                }
                true
            }
            Ok(_) => false,
            Err(_) => true,
        }
    }

    /// The entries after `last` (then the last read), at most `block` from now; `received`: the
    /// data bytes read so far, which the next data entry must start at.
    async fn read_once(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        (last, received): (&mut String, &mut u64),
        block: Duration,
    ) -> Read {
        let block_ms = u64::try_from(block.as_millis()).unwrap_or(1000);
        let mut cmd = redis::cmd("XREAD");
        if block_ms > 0 {
            cmd.arg("BLOCK").arg(block_ms);
        }
        cmd.arg("COUNT").arg(64).arg("STREAMS").arg(&self.key).arg(&*last);
        let bound = block + self.relay.redis.command_timeout().max(READ_SLACK);
        let reply = tokio::time::timeout(bound, cmd.query_async::<Option<StreamReadReply>>(conn)).await;
        let reply = match reply {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) => return Read::Nothing,
            _ => return Read::Failed,
        };
        let mut accepted = false;
        for entry in reply.keys.into_iter().flat_map(|k| k.ids) {
            accepted = true;
            last.clone_from(&entry.id);
            if let Some(head) = entry.map.get("h").and_then(bytes_of).and_then(|h| parse_head(&h)) {
                self.live.set_head(head);
            }
            if let Some(data) = entry.map.get("d").and_then(bytes_of) {
                let at = entry.map.get("o").and_then(bytes_of);
                let at = at.and_then(|o| std::str::from_utf8(&o).ok()?.parse::<u64>().ok());
                if at.is_some_and(|at| at != *received) {
                    // Entries were lost (an entry without `o` is an older replica's: taken as is).
                    tracing::warn!(
                        "a followed response's relay lost entries (Redis lost writes): its followers here end"
                    );
                    self.live.finish(End::Aborted);
                    return Read::Entries { accepted, ended: true };
                }
                *received += data.len() as u64;
                self.live.push(&data);
            }
            if let Some(end) = entry.map.get("e").and_then(bytes_of) {
                match &end[..] {
                    b"complete" => self.live.finish(End::Complete),
                    b"released" => self.live.finish(End::Released),
                    b"unshared" => self.live.finish_unshared(),
                    b"cut" => self.live.cut(),
                    _ => self.live.finish(End::Aborted),
                }
                return Read::Entries { accepted, ended: true };
            }
        }
        if accepted {
            Read::Entries { accepted, ended: false }
        } else {
            Read::Nothing
        }
    }
}

fn bytes_of(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

fn parse_head(raw: &[u8]) -> Option<Head> {
    let (status, headers): (u16, Vec<(String, String)>) = serde_json::from_slice(raw).ok()?;
    Some(Head {
        status,
        headers: headers.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(crate::testing::proptest_config(512))]

        /// A relayed head as any bytes: parsed or ignored, never a panic; a real one parses back.
        #[test]
        fn relayed_heads(raw in proptest::collection::vec(any::<u8>(), 0..128), status in 100u16..600) {
            let _ = parse_head(&raw);
            let headers = vec![("content-type".to_string(), "text/event-stream".to_string())];
            let encoded = serde_json::to_vec(&(status, &headers)).unwrap();
            prop_assert_eq!(parse_head(&encoded), Some(Head { status, headers: headers.into() }));
        }
    }
}
