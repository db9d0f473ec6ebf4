//! The Redis job queue, shared by the fleet. Keys (all with the `{jobs}` hash tag, so that every
//! script's keys share a Redis Cluster slot, as BullMQ does per queue):
//!
//! - `{prefix}{jobs}:stream`: a Stream, one entry (`job` = id) per unfinished job, consumed by the
//!   consumer group `workers` (one consumer per process). Entries are acknowledged *and deleted*
//!   when their job finishes, so the stream's length is the number of unfinished jobs, which
//!   `max_queue` caps (MAXLEN is only a backstop far above it).
//! - `{prefix}{jobs}:job:{id}`: a hash per job, TTL'd (`result_ttl`, renewed while it runs): `st`
//!   (queued, running, succeeded, failed), `route`, `fp` (idempotency fingerprint), `access` (hash
//!   of the submitter's credentials), `created`/`started`/`finished` (unix ms), `runs`, `own` (the
//!   owner token of the current run), `req` (the request's method, path and non-secret headers, as
//!   JSON), `rbody` (its body), `cred` (its credential headers, sealed), `cb` (callback URL), and
//!   once finished `status`, `attempts`, `meta` (kept headers), `body`, `err`, `cbst`/`cbn`/`cbs`
//!   (callback state, POSTs, last status). `req`, `rbody` and `cred` are deleted when it finishes.
//!
//! Every write after the submission is one Lua script that checks the owner token
//! (compare-and-set): a worker that lost its job to a reclaim can never overwrite the new owner's
//! outcome.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redis::{Script, Value};

use super::record::{
    CallbackState, CallbackView, Finished, JobResult, JobState, JobView, NewJob, StoredRequest, Submitted,
};
use super::seal::Sealer;
use super::{JobId, JobsError};
use crate::redis::{RedisError, RedisHandle};

/// The consumer group every replica's workers read through.
pub(crate) const GROUP: &str = "workers";

/// The stream's MAXLEN backstop, as a multiple of `max_queue` (trimming never happens while the
/// cap holds: finished entries are deleted).
const MAXLEN_FACTOR: u64 = 4;

/// The job hash fields a status view reads.
const VIEW_FIELDS: [&str; 15] = [
    "st", "route", "access", "created", "started", "finished", "runs", "attempts", "status", "err", "cb", "cbst",
    "cbn", "cbs", "usage",
];

/// How a worker's take went.
pub(crate) enum Start {
    /// Run it (this worker owns it now).
    Run(Box<Run>),
    /// Finished, but its callback is still to deliver (this worker owns it now).
    Callback,
    /// Nothing to do (finished or expired): the entry was acknowledged.
    Skip,
    /// Its workers died too often: marked failed.
    Abandoned { route: String },
}

/// A job to run, as the start script hands it over.
pub(crate) struct Run {
    /// This run's number (more than 1: the job was reclaimed).
    pub runs: u32,
    /// `None` when it could not be read.
    pub request: Option<StoredRequest>,
    pub body: Bytes,
    /// The credential headers, sealed.
    pub sealed: String,
    pub route: String,
    pub callback: Option<String>,
}

/// The stream entry a consumer holds, the job it names, and this run's owner token: what every
/// owner-checked write of a run is addressed to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held<'a> {
    /// The job's id.
    pub(crate) id: &'a JobId,
    /// The stream entry's id.
    pub(crate) entry: &'a str,
    /// This run's owner token (compare-and-set: a reclaimed job has another).
    pub(crate) owner: &'a str,
}

/// A job read back with its result and callback target.
pub(crate) struct Loaded {
    pub(crate) view: JobView,
    pub result: Option<JobResult>,
    pub callback: Option<String>,
}

struct Scripts {
    submit: Script,
    start: Script,
    heartbeat: Script,
    update: Script,
}

/// The queue's keys and scripts over the process's Redis connection.
#[derive(Clone)]
pub(crate) struct RedisQueue {
    pub redis: RedisHandle,
    scripts: Arc<Scripts>,
    pub stream: String,
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn bytes(v: Option<&Value>) -> Bytes {
    match v {
        Some(Value::BulkString(b)) => Bytes::from(b.clone()),
        _ => Bytes::new(),
    }
}

fn int(v: Option<&Value>) -> u64 {
    match v {
        Some(Value::Int(n)) => (*n).max(0) as u64,
        other => text(other).and_then(|s| s.parse().ok()).unwrap_or(0),
    }
}

fn items(v: &Value) -> &[Value] {
    match v {
        Value::Array(items) | Value::Set(items) => items,
        _ => &[],
    }
}

/// `(entry id, job id)` of a stream entry `[id, [field, value, ...]]` (fields are nil for an
/// entry deleted while pending).
fn entry(v: &Value) -> Option<(String, Option<JobId>)> {
    let parts = items(v);
    let id = text(parts.first())?;
    let fields = parts.get(1).map(items).unwrap_or_default();
    let job = fields
        .chunks(2)
        .find(|kv| text(kv.first()).as_deref() == Some("job"))
        .and_then(|kv| text(kv.get(1)))
        .map(JobId::from_stored);
    Some((id, job))
}

pub(crate) fn is_nogroup(e: &RedisError) -> bool {
    matches!(e, RedisError::Command { source, .. } if source.code() == Some("NOGROUP"))
}

impl RedisQueue {
    pub(crate) fn new(redis: RedisHandle) -> RedisQueue {
        let stream = redis.key("{jobs}:stream");
        RedisQueue {
            redis,
            scripts: Arc::new(Scripts {
                submit: Script::new(include_str!("../redis/scripts/jobs_submit_v1.lua")),
                start: Script::new(include_str!("../redis/scripts/jobs_start_v1.lua")),
                heartbeat: Script::new(include_str!("../redis/scripts/jobs_heartbeat_v1.lua")),
                update: Script::new(include_str!("../redis/scripts/jobs_update_v1.lua")),
            }),
            stream,
        }
    }

    fn job_key(&self, id: &JobId) -> String {
        self.redis.key(&format!("{{jobs}}:job:{}", id.as_str()))
    }

    /// Creates and queues a job (credentials sealed with `sealer`). Returns the outcome and the
    /// number of unfinished jobs when the script counted them.
    pub(crate) async fn submit(
        &self,
        job: &NewJob,
        sealer: Option<&Sealer>,
        max_queue: u32,
        ttl: Duration,
    ) -> Result<(Submitted, Option<u64>), RedisError> {
        let sealed = if job.credentials.is_empty() {
            String::new()
        } else {
            let plain = serde_json::to_vec(&job.credentials).unwrap_or_default();
            // Validation requires a secret with Redis; without one nothing secret is written.
            sealer.and_then(|s| s.seal(job.id.as_str(), &plain)).unwrap_or_default()
        };
        let req = serde_json::to_string(&job.request).unwrap_or_default();
        let mut fields: Vec<(&str, Vec<u8>)> = vec![
            ("route", job.route.clone().into_bytes()),
            ("access", job.access.to_string().into_bytes()),
            ("created", job.created_ms.to_string().into_bytes()),
            ("runs", b"0".to_vec()),
            ("req", req.into_bytes()),
            ("rbody", job.body.to_vec()),
            ("cred", sealed.into_bytes()),
        ];
        if let Some(cb) = &job.callback {
            fields.push(("cb", cb.clone().into_bytes()));
        }
        let (key, stream, script) = (self.job_key(&job.id), self.stream.clone(), self.scripts.clone());
        let maxlen = u64::from(max_queue).saturating_mul(MAXLEN_FACTOR).max(1000);
        let reply: Vec<Value> = self
            .redis
            .run("jobs_submit", |mut c| async move {
                let mut inv = script.submit.prepare_invoke();
                inv.key(&key)
                    .key(&stream)
                    .arg(job.id.as_str())
                    .arg(&job.fingerprint)
                    .arg(max_queue)
                    .arg(ms(ttl))
                    .arg(maxlen);
                for (name, value) in &fields {
                    inv.arg(*name).arg(value.as_slice());
                }
                inv.invoke_async(&mut c).await
            })
            .await?;
        let outcome = match text(reply.first()).as_deref() {
            Some("queued") => (Submitted::Queued, Some(int(reply.get(1)))),
            Some("full") => (Submitted::Full, Some(int(reply.get(1)))),
            Some("mismatch") => (Submitted::Mismatch, None),
            _ => {
                let state = text(reply.get(1))
                    .and_then(|s| JobState::parse(&s))
                    .unwrap_or(JobState::Queued);
                (Submitted::Exists(state), None)
            }
        };
        Ok(outcome)
    }

    /// A job's status view, and with `full` its result and callback URL.
    pub(crate) async fn load(&self, id: &JobId, full: bool) -> Result<Option<Loaded>, RedisError> {
        let key = self.job_key(id);
        let mut fields: Vec<&str> = VIEW_FIELDS.to_vec();
        if full {
            fields.extend(["meta", "body"]);
        }
        let reply: Vec<Value> = self
            .redis
            .run("jobs_get", |mut c| async move {
                redis::cmd("HMGET").arg(&key).arg(&fields).query_async(&mut c).await
            })
            .await?;
        Ok(decode(id, &reply))
    }

    /// Creates the consumer group (and the stream) if they do not exist.
    pub(crate) async fn ensure_group(&self) -> Result<(), RedisError> {
        let stream = self.stream.clone();
        let created: Result<Value, RedisError> = self
            .redis
            .run("jobs_group", |mut c| async move {
                redis::cmd("XGROUP")
                    .arg("CREATE")
                    .arg(&stream)
                    .arg(GROUP)
                    .arg("0")
                    .arg("MKSTREAM")
                    .query_async(&mut c)
                    .await
            })
            .await;
        match created {
            Err(RedisError::Command { source, .. }) if source.code() == Some("BUSYGROUP") => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// Reads one new entry for `consumer`, blocking up to `block` on a connection of its own.
    /// `Ok(None)`: nothing arrived. A missing group is reported as [`JobsError::NoGroup`].
    pub(crate) async fn read_new(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
        consumer: &str,
        block: Duration,
    ) -> Result<Option<(String, Option<JobId>)>, JobsError> {
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg(consumer)
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(ms(block))
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(">")
            .query_async(conn)
            .await
            .map_err(|e| {
                if e.code() == Some("NOGROUP") {
                    JobsError::NoGroup
                } else {
                    JobsError::Read(e)
                }
            })?;
        // [[stream, [[id, [field, value]]]]] (a map under RESP3).
        let streams: Vec<&Value> = match &reply {
            Value::Map(pairs) => pairs.iter().map(|(_, v)| v).collect(),
            v => items(v).iter().filter_map(|s| items(s).get(1)).collect(),
        };
        Ok(streams.into_iter().flat_map(items).find_map(entry))
    }

    /// Claims one entry idle for at least `min_idle` (its worker stopped heartbeating), scanning
    /// from `cursor`. Returns the next cursor and the entry.
    pub(crate) async fn reclaim(
        &self,
        consumer: &str,
        min_idle: Duration,
        cursor: &str,
    ) -> Result<(String, Option<(String, Option<JobId>)>), RedisError> {
        let (stream, consumer, cursor) = (self.stream.clone(), consumer.to_string(), cursor.to_string());
        let reply: Value = self
            .redis
            .run("jobs_reclaim", |mut c| async move {
                redis::cmd("XAUTOCLAIM")
                    .arg(&stream)
                    .arg(GROUP)
                    .arg(&consumer)
                    .arg(ms(min_idle))
                    .arg(&cursor)
                    .arg("COUNT")
                    .arg(1)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let parts = items(&reply);
        let next = text(parts.first()).unwrap_or_else(|| "0-0".into());
        let claimed = parts.get(1).map(items).unwrap_or_default().iter().find_map(entry);
        Ok((next, claimed))
    }

    /// Takes the job of an entry this consumer holds.
    pub(crate) async fn start(
        &self,
        held: Held<'_>,
        now_ms: u64,
        max_runs: u32,
        ttl: Duration,
    ) -> Result<Start, RedisError> {
        let Held { id, entry, owner } = held;
        let (key, stream, script) = (self.job_key(id), self.stream.clone(), self.scripts.clone());
        let reply: Vec<Value> = self
            .redis
            .run("jobs_start", |mut c| async move {
                script
                    .start
                    .key(&key)
                    .key(&stream)
                    .arg(owner)
                    .arg(now_ms)
                    .arg(max_runs)
                    .arg(GROUP)
                    .arg(entry)
                    .arg(ms(ttl))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(match text(reply.first()).as_deref() {
            Some("run") => Start::Run(Box::new(Run {
                runs: int(reply.get(1)) as u32,
                request: text(reply.get(2)).and_then(|r| serde_json::from_str(&r).ok()),
                body: bytes(reply.get(3)),
                sealed: text(reply.get(4)).unwrap_or_default(),
                route: text(reply.get(5)).unwrap_or_default(),
                callback: text(reply.get(6)).filter(|c| !c.is_empty()),
            })),
            Some("callback") => Start::Callback,
            Some("abandoned") => Start::Abandoned {
                route: text(reply.get(1)).unwrap_or_default(),
            },
            _ => Start::Skip,
        })
    }

    /// Acknowledges and deletes an entry whose job id could not be read.
    pub(crate) async fn drop_entry(&self, entry: &str) -> Result<(), RedisError> {
        let (stream, entry) = (self.stream.clone(), entry.to_string());
        self.redis
            .run("jobs_ack", |mut c| async move {
                redis::pipe()
                    .cmd("XACK")
                    .arg(&stream)
                    .arg(GROUP)
                    .arg(&entry)
                    .ignore()
                    .cmd("XDEL")
                    .arg(&stream)
                    .arg(&entry)
                    .ignore()
                    .query_async::<()>(&mut c)
                    .await
            })
            .await
    }

    /// Keeps a running job's entry from being reclaimed. `Ok(false)`: another worker owns it.
    pub(crate) async fn heartbeat(&self, held: Held<'_>, consumer: &str, ttl: Duration) -> Result<bool, RedisError> {
        let Held { id, entry, owner } = held;
        let (key, stream, script) = (self.job_key(id), self.stream.clone(), self.scripts.clone());
        let kept: i64 = self
            .redis
            .run("jobs_heartbeat", |mut c| async move {
                script
                    .heartbeat
                    .key(&key)
                    .key(&stream)
                    .arg(owner)
                    .arg(GROUP)
                    .arg(consumer)
                    .arg(entry)
                    .arg(ms(ttl))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(kept == 1)
    }

    /// Records a run's outcome (owner-checked); the entry is acknowledged unless a callback is
    /// still to deliver. Returns whether this worker still owned the job, and the queue depth.
    pub(crate) async fn finish(
        &self,
        held: Held<'_>,
        f: &Finished,
        callback_pending: bool,
        ttl: Duration,
    ) -> Result<(bool, u64), RedisError> {
        let mut fields: Vec<(&str, Vec<u8>)> = vec![
            ("st", f.state.as_str().as_bytes().to_vec()),
            ("finished", f.finished_ms.to_string().into_bytes()),
            ("attempts", f.attempts.to_string().into_bytes()),
            ("status", f.http_status.unwrap_or(0).to_string().into_bytes()),
            ("err", f.error.clone().unwrap_or_default().into_bytes()),
            ("usage", serde_json::to_vec(&f.usage).unwrap_or_default()),
        ];
        if let Some(r) = &f.result {
            fields.push(("meta", serde_json::to_vec(&r.headers).unwrap_or_default()));
            fields.push(("body", r.body.to_vec()));
        }
        if callback_pending {
            fields.push(("cbst", b"pending".to_vec()));
            fields.push(("cbn", b"0".to_vec()));
        }
        self.update(held, ttl, !callback_pending, fields).await
    }

    /// Records what became of the job's callback and acknowledges its entry.
    pub(crate) async fn callback_done(
        &self,
        held: Held<'_>,
        cb: &CallbackView,
        ttl: Duration,
    ) -> Result<(bool, u64), RedisError> {
        let fields = vec![
            ("cbst", cb.state.as_str().as_bytes().to_vec()),
            ("cbn", cb.attempts.to_string().into_bytes()),
            ("cbs", cb.last_status.unwrap_or(0).to_string().into_bytes()),
        ];
        self.update(held, ttl, true, fields).await
    }

    async fn update(
        &self,
        held: Held<'_>,
        ttl: Duration,
        ack: bool,
        fields: Vec<(&str, Vec<u8>)>,
    ) -> Result<(bool, u64), RedisError> {
        let Held { id, entry, owner } = held;
        let (key, stream, script) = (self.job_key(id), self.stream.clone(), self.scripts.clone());
        let reply: Vec<Value> = self
            .redis
            .run("jobs_update", |mut c| async move {
                let mut inv = script.update.prepare_invoke();
                inv.key(&key)
                    .key(&stream)
                    .arg(owner)
                    .arg(GROUP)
                    .arg(entry)
                    .arg(ms(ttl))
                    .arg(if ack { "1" } else { "0" });
                for (name, value) in &fields {
                    inv.arg(*name).arg(value.as_slice());
                }
                inv.invoke_async(&mut c).await
            })
            .await?;
        Ok((int(reply.first()) == 1, int(reply.get(1))))
    }

    /// Unfinished jobs (the stream's length).
    pub(crate) async fn depth(&self) -> Result<u64, RedisError> {
        let stream = self.stream.clone();
        self.redis
            .run("jobs_depth", |mut c| async move {
                redis::cmd("XLEN").arg(&stream).query_async(&mut c).await
            })
            .await
    }

    /// Removes consumers of departed processes: nothing pending, idle for longer than `idle`.
    pub(crate) async fn forget_departed(&self, idle: Duration) -> Result<usize, RedisError> {
        let stream = self.stream.clone();
        let reply = self
            .redis
            .run("jobs_consumers", |mut c| async move {
                redis::cmd("XINFO")
                    .arg("CONSUMERS")
                    .arg(&stream)
                    .arg(GROUP)
                    .query_async::<Value>(&mut c)
                    .await
            })
            .await;
        let reply = match reply {
            Err(e) if is_nogroup(&e) => return Ok(0),
            r => r?,
        };
        let mut gone = Vec::new();
        for consumer in items(&reply) {
            let pairs: Vec<(String, u64, Option<String>)> = match consumer {
                Value::Map(m) => m
                    .iter()
                    .filter_map(|(k, v)| text(Some(k)).map(|k| (k, int(Some(v)), text(Some(v)))))
                    .collect(),
                v => items(v)
                    .chunks(2)
                    .filter_map(|kv| text(kv.first()).map(|k| (k, int(kv.get(1)), text(kv.get(1)))))
                    .collect(),
            };
            let field = |name: &str| pairs.iter().find(|(k, _, _)| k == name);
            let name = field("name").and_then(|(_, _, s)| s.clone());
            let pending = field("pending").map_or(1, |(_, n, _)| *n);
            let idle_ms = field("inactive").or_else(|| field("idle")).map_or(0, |(_, n, _)| *n);
            if let (Some(name), 0) = (name, pending) {
                if idle_ms >= ms(idle) {
                    gone.push(name);
                }
            }
        }
        for name in &gone {
            let (stream, name) = (self.stream.clone(), name.clone());
            self.redis
                .run("jobs_consumers", |mut c| async move {
                    redis::cmd("XGROUP")
                        .arg("DELCONSUMER")
                        .arg(&stream)
                        .arg(GROUP)
                        .arg(&name)
                        .query_async::<i64>(&mut c)
                        .await
                })
                .await?;
        }
        Ok(gone.len())
    }
}

/// Opens the sealed credentials of a job.
pub(crate) fn open_credentials(
    sealer: Option<&Sealer>,
    id: &JobId,
    sealed: &str,
) -> Result<Vec<(String, String)>, JobsError> {
    if sealed.is_empty() {
        return Ok(Vec::new());
    }
    sealer
        .and_then(|s| s.open(id.as_str(), sealed))
        .and_then(|plain| serde_json::from_slice(&plain).ok())
        .ok_or(JobsError::Sealed)
}

/// A job hash as `HMGET` returned it (the view fields, then `meta` and `body` when asked for):
/// `None` when it holds no job. Whatever the bytes, a decision, never a panic.
/// For the fuzz targets under `fuzz/`.
#[doc(hidden)]
pub(crate) fn fuzz_decode(reply: &[Value]) {
    let _ = decode(&JobId::from_stored("fuzz".to_string()), reply);
}

fn decode(id: &JobId, reply: &[Value]) -> Option<Loaded> {
    let full = reply.len() > VIEW_FIELDS.len();
    let get = |name: &str| {
        VIEW_FIELDS
            .iter()
            .chain(["meta", "body"].iter())
            .position(|f| *f == name)
            .and_then(|i| reply.get(i))
            .filter(|v| !matches!(v, Value::Nil))
    };
    let state = text(get("st")).and_then(|s| JobState::parse(&s))?;
    let opt = |name: &str| get(name).map(|v| int(Some(v)));
    let callback = text(get("cbst"))
        .and_then(|s| CallbackState::parse(&s))
        .map(|state| CallbackView {
            state,
            attempts: opt("cbn").unwrap_or(0) as u32,
            last_status: opt("cbs").map(|s| s as u16).filter(|s| *s > 0),
        });
    let view = JobView {
        id: id.clone(),
        state,
        route: text(get("route")).unwrap_or_default(),
        access: text(get("access")).and_then(|a| a.parse().ok()),
        created_ms: opt("created").unwrap_or(0),
        started_ms: opt("started"),
        finished_ms: opt("finished"),
        runs: opt("runs").unwrap_or(0) as u32,
        attempts: opt("attempts").unwrap_or(0) as u32,
        http_status: opt("status").map(|s| s as u16).filter(|s| *s > 0),
        error: text(get("err")).filter(|e| !e.is_empty()),
        callback,
        usage: text(get("usage"))
            .and_then(|u| serde_json::from_str(&u).ok())
            .unwrap_or_default(),
    };
    let result = match (full, view.http_status, text(get("meta"))) {
        (true, Some(status), Some(meta)) => Some(JobResult {
            status,
            headers: serde_json::from_str(&meta).unwrap_or_default(),
            body: bytes(get("body")),
        }),
        _ => None,
    };
    Some(Loaded {
        view,
        result,
        callback: text(get("cb")).filter(|c| !c.is_empty()),
    })
}

fn ms(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

#[cfg(test)]
mod tests {
    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        fn value() -> impl Strategy<Value = Value> {
            prop_oneof![
                Just(Value::Nil),
                any::<i64>().prop_map(Value::Int),
                proptest::collection::vec(any::<u8>(), 0..48).prop_map(Value::BulkString),
                prop_oneof![
                    Just("queued"),
                    Just("running"),
                    Just("succeeded"),
                    Just("failed"),
                    Just("pending")
                ]
                .prop_map(|s| Value::BulkString(s.as_bytes().to_vec())),
                "[0-9]{1,20}".prop_map(|s| Value::BulkString(s.into_bytes())),
            ]
        }

        proptest! {
            #![proptest_config(crate::testing::proptest_config(1024))]

            /// A job hash as any bytes Redis may hold (corrupted, another version's): decoded or
            /// refused, never a panic.
            #[test]
            fn any_job_hash_is_decoded_or_refused(
                reply in proptest::collection::vec(value(), 0..=VIEW_FIELDS.len() + 2),
            ) {
                let _ = decode(&JobId::from_stored("job".to_string()), &reply);
            }
        }
    }
}
