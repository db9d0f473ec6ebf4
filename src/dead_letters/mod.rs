//! Dead letters: diagnostics for requests that failed for good, not a graveyard. Each entry says
//! what was asked (method, path, idempotency key, the body where the route keeps bodies), what
//! happened at every attempt, and why rebound stopped; entries are counted, grouped by cause in a
//! summary, and can be replayed through the route's normal pipeline with their original
//! idempotency key (so a replay of something that already succeeded is answered from the store).
//!
//! Storage: a capped Redis Stream shared by the fleet when `[redis]` is set (replay outcomes in a
//! hash beside it), else a bounded ring in memory. Credentials are never kept: the entry's headers
//! exclude every credential form (`crate::credentials`) and every `[dead_letters]
//! sensitive_headers` entry, the query is redacted; the idempotency scope is kept as its hash only.

pub(crate) mod analysis;

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use http::HeaderMap;
use serde::{Deserialize, Serialize};

use crate::config::DeadLettersConfig;
use crate::idempotency::ReplayIdentity;
use crate::jobs::seal::Sealer;
use crate::metrics::Metrics;
use crate::redis::{RedisError, RedisHandle};
use crate::wire::usage::AttemptUsage;

/// Marks a request an operator replays from a dead letter: a deliberate new try, never taken for
/// a client's own retry of the failure it recorded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OperatorReplay;

/// One attempt, as the entry shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AttemptRecord {
    /// `ok`, `status_4xx`, `status_429`, `status_5xx`, `connect_failure`, `reset`, `timeout`.
    pub outcome: std::borrow::Cow<'static, str>,
    /// The response status, when there was a response.
    pub status: Option<u16>,
    /// How long the attempt took to its response head (or failure).
    pub duration_ms: u64,
    /// The wait before the next attempt (0 for the last).
    pub wait_ms: u64,
    /// The tokens the attempt's response reported, when it reported any (by the time the entry
    /// was recorded: a retried attempt's, from what rebound read of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<AttemptUsage>,
}

/// A replay of an entry and what came of it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReplayRecord {
    pub(crate) at_ms: u64,
    pub status: u16,
    /// The replay was answered from the idempotency store (the original already succeeded).
    pub from_store: bool,
}

/// A request that failed for good.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeadLetter {
    /// Time-ordered (`<unix ms>-<seq>`, the Redis Stream id form).
    #[serde(default)]
    pub id: String,
    pub(crate) time_ms: u64,
    pub route: String,
    pub upstream: String,
    pub method: String,
    /// The request path as the app sent it.
    pub path: String,
    /// The query, with the values of credential-like parameters (`key`, `token`, `secret`,
    /// `password`, `signature`, `auth`...) replaced by `[redacted]`.
    pub query: Option<String>,
    pub idempotency_key: Option<String>,
    /// Why rebound stopped: `retries_exhausted`, `budget_exhausted`, `deadline_exceeded`,
    /// `retry_after_too_long`, `unsafe_to_replay`, `circuit_open`.
    pub reason: String,
    /// The last attempt's outcome (`status_5xx`, `timeout`, ...).
    pub error_class: String,
    /// The status the app received.
    pub final_status: u16,
    /// The provider's error message of the last answer, when it gave one (credential-like
    /// tokens redacted, at most 300 characters: [`analysis::keepable_message`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    pub attempts: Vec<AttemptRecord>,
    /// Non-sensitive request headers (for replay).
    pub headers: Vec<(String, String)>,
    /// The request body, base64, only where the route sets `dead_letter_bodies = true` and the
    /// body is at most `[dead_letters] max_body`.
    pub body_base64: Option<String>,
    /// Whether the body was kept (a body-less request is replayable too).
    pub body_kept: bool,
    /// Why the body is not here, when it is not: not kept by the route, over `max_body`, or
    /// sealed under another `[jobs] secret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_missing: Option<String>,
    /// On Redis with a `[jobs] secret`: the body sealed at rest (never in the API's answers,
    /// which carry it opened as `body_base64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) body_sealed: Option<String>,
    /// The original's idempotency identity (hashes only), so that a replay finds its record.
    pub idempotency: Option<crate::idempotency::ReplayIdentity>,
    #[serde(default)]
    pub replays: Vec<ReplayRecord>,
    /// The async job whose run this was, if any (`GET /jobs/{id}`).
    #[serde(default)]
    pub job_id: Option<String>,
}

impl DeadLetter {
    /// The request body, if kept.
    pub fn body(&self) -> Option<Bytes> {
        let b64 = self.body_base64.as_ref()?;
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .ok()
            .map(Bytes::from)
    }

    /// Whether this entry can be re-sent as it was.
    pub(crate) fn replayable(&self) -> bool {
        self.body_kept
    }
}

/// The request headers an entry keeps: everything but credentials, hop-by-hop headers and the
/// configured sensitive ones.
pub(crate) fn keepable_headers(headers: &HeaderMap, config: &DeadLettersConfig) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(k, _)| !config.secret_headers.contains(k))
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "host" | "content-length" | "connection" | "transfer-encoding"
            )
        })
        .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str().to_string(), v.to_string())))
        .collect()
}

/// Encodes a body for an entry.
pub(crate) fn encode_body(body: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(body)
}

/// Which entries an operation applies to.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Filter {
    pub route: Option<String>,
    pub reason: Option<String>,
    pub upstream: Option<String>,
    /// Entries at or after this time (unix ms).
    pub since: Option<u64>,
    /// One group of the summary (its `key`).
    #[serde(default)]
    pub group: Option<String>,
}

impl Filter {
    pub fn matches(&self, e: &DeadLetter) -> bool {
        self.route.as_ref().is_none_or(|r| *r == e.route)
            && self.reason.as_ref().is_none_or(|r| *r == e.reason)
            && self.upstream.as_ref().is_none_or(|u| *u == e.upstream)
            && self.since.is_none_or(|t| e.time_ms >= t)
            && self.group.as_ref().is_none_or(|g| *g == analysis::group_key(e))
    }
}

/// A summary reads at most this many entries...
const SUMMARY_MAX_ENTRIES: usize = 20_000;
/// ...for at most this long, so that a large store cannot stall the admin port.
const SUMMARY_MAX_TIME: std::time::Duration = std::time::Duration::from_secs(2);
/// The window a summary covers when the filter sets no `since`.
pub(crate) const SUMMARY_DEFAULT_WINDOW_MS: u64 = 24 * 3600 * 1000;
/// Where a read of the store stops (see `DeadLetters::read_matching`).
#[derive(Clone, Copy)]
struct Bound {
    since: u64,
    entries: usize,
    time: std::time::Duration,
}

/// The parts of a summary's timelines.
const TIMELINE_BUCKETS: u64 = 48;

/// A page of entries, newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Page {
    pub items: Vec<DeadLetter>,
    /// Pass as `cursor` for the next page; `None` at the end.
    pub(crate) next_cursor: Option<String>,
}

/// One group of the summary: one cause ([`analysis`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Group {
    /// Names the group in a filter (`group=`): 16 hex digits of what makes it one cause.
    #[serde(default)]
    pub key: String,
    pub route: String,
    pub upstream: String,
    pub reason: String,
    pub error_class: String,
    pub final_status: u16,
    /// The provider's message, masked (ids, numbers, quoted values).
    #[serde(default)]
    pub message: Option<String>,
    /// One entry's message as it was kept (the newest).
    #[serde(default)]
    pub example: Option<String>,
    pub count: u64,
    pub first_seen_ms: u64,
    pub(crate) last_seen_ms: u64,
    /// Entries whose body was kept (that can be re-sent).
    #[serde(default)]
    pub replayable: u64,
    /// Entries with an idempotency key (a replay of them cannot generate twice).
    #[serde(default)]
    pub with_key: u64,
    /// Entries replayed at least once.
    #[serde(default)]
    pub replayed: u64,
    /// Entries per part of the summary's `window`.
    #[serde(default)]
    pub timeline: Vec<u32>,
    #[serde(default)]
    pub analysis: Option<analysis::Analysis>,
}

/// Counts grouped by cause, with timelines and analysis: what an on-call engineer opens first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// Entries read (within the window).
    pub total: u64,
    pub groups: Vec<Group>,
    /// The span the timelines cover.
    #[serde(default)]
    pub window: Option<analysis::Window>,
    /// The read stopped at its bound (entries or time) before the window's start: the oldest
    /// entries of the window are not counted.
    #[serde(default)]
    pub truncated: bool,
}

/// The dead-letter store could not answer: Redis's error, kept as the source.
#[derive(Debug, thiserror::Error)]
#[error("dead-letter store unavailable: {0}")]
pub struct DeadLetterError(#[from] RedisError);

/// The dead letters of this process (memory) or fleet (Redis).
#[derive(Clone)]
pub struct DeadLetters {
    backend: Backend,
    metrics: Arc<Metrics>,
    cap: usize,
    /// The in-memory ring's bound on the bodies it holds (base64 bytes).
    max_bytes: usize,
    /// Seals bodies at rest in Redis (`[jobs] secret`; `None`: stored as they are).
    sealer: Option<Arc<Sealer>>,
}

#[derive(Clone)]
enum Backend {
    Memory(Arc<Mutex<Ring>>),
    Redis(RedisHandle),
}

/// The in-memory entries, oldest first. Ids are assigned in increasing order as entries are
/// added (and purging keeps the order), so the ring is sorted by id: a lookup by id or cursor is
/// a binary search, never a walk over the ring.
#[derive(Default)]
struct Ring {
    entries: VecDeque<DeadLetter>,
    last_id: (u64, u64),
    /// The bodies the entries hold (base64 bytes).
    bytes: usize,
}

fn body_bytes(e: &DeadLetter) -> usize {
    e.body_base64.as_ref().map_or(0, String::len)
}

impl Ring {
    /// The index of the entry with this exact id.
    fn position(&self, id: &str) -> Option<usize> {
        let key = id_order(id);
        let i = self.entries.binary_search_by(|e| id_order(&e.id).cmp(&key)).ok()?;
        (self.entries.get(i)?.id == id).then_some(i)
    }
}

/// Appends a replay record to an entry's JSON list (KEYS[1] the replays hash, ARGV[1] the entry
/// id, ARGV[2] the record).
static APPEND_REPLAY: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("../redis/scripts/dead_letter_replay_v1.lua")));

/// Entries read per Redis round trip while scanning.
const SCAN_BATCH: usize = 500;

/// What the pipeline knows of a request that failed for good: the dead letter is made of it
/// here, where what may be kept (headers, query, body) is decided.
pub struct Failure<'a> {
    pub route: &'a str,
    /// The upstream of the last attempt.
    pub upstream: &'a str,
    pub parts: &'a http::request::Parts,
    pub body: &'a Bytes,
    /// `dead_letter_bodies` on the route (an empty body is always "kept").
    pub(crate) keep_body: bool,
    /// The route's idempotency header, when the route has idempotency.
    pub(crate) idempotency_header: Option<&'a http::HeaderName>,
    /// The idempotency identity a replay must carry to find the original's record.
    pub identity: Option<ReplayIdentity>,
    pub reason: &'a str,
    pub error_class: &'a str,
    pub final_status: u16,
    /// The provider's error message of the last answer, as it came.
    pub error_message: Option<&'a str>,
    pub attempts: Vec<AttemptRecord>,
    pub job_id: Option<String>,
}

impl DeadLetter {
    /// The entry for `f`, with only what may be kept: sensitive headers and query values out, the
    /// body only where the route keeps bodies.
    pub fn of(f: Failure<'_>, config: &DeadLettersConfig) -> DeadLetter {
        let Failure { parts, body, .. } = f;
        let fits = body.len() as u64 <= config.max_body;
        let keep_body = (f.keep_body && fits) || body.is_empty();
        let body_missing = (!keep_body).then(|| {
            if f.keep_body {
                format!(
                    "the request body ({} bytes) was over [dead_letters] max_body ({} bytes)",
                    body.len(),
                    config.max_body
                )
            } else {
                "the request body was not kept (set dead_letter_bodies = true on the route)".to_string()
            }
        });
        DeadLetter {
            id: String::new(),
            time_ms: crate::time::now_unix_ms(),
            route: f.route.to_string(),
            upstream: f.upstream.to_string(),
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            query: parts
                .uri
                .query()
                .map(|q| crate::credentials::redact_query(q).into_owned()),
            idempotency_key: f
                .idempotency_header
                .and_then(|h| parts.headers.get(h))
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            reason: f.reason.to_string(),
            error_class: f.error_class.to_string(),
            final_status: f.final_status,
            error_message: f
                .error_message
                .map(analysis::keepable_message)
                .filter(|m| !m.is_empty()),
            attempts: f.attempts,
            headers: keepable_headers(&parts.headers, config),
            body_base64: (keep_body && !body.is_empty()).then(|| encode_body(body)),
            body_kept: keep_body,
            body_missing,
            body_sealed: None,
            idempotency: f.identity,
            replays: Vec::new(),
            job_id: f.job_id,
        }
    }
}

impl DeadLetters {
    /// The store: in memory, or the fleet's stream on `redis`, where bodies are sealed with
    /// `secret` (`[jobs] secret`) when there is one.
    pub fn new(
        config: &DeadLettersConfig,
        secret: Option<&str>,
        redis: Option<RedisHandle>,
        metrics: Arc<Metrics>,
    ) -> DeadLetters {
        let backend = match redis {
            Some(r) => Backend::Redis(r),
            None => Backend::Memory(Arc::default()),
        };
        DeadLetters {
            backend,
            metrics,
            cap: config.max_entries as usize,
            max_bytes: usize::try_from(config.max_bytes).unwrap_or(usize::MAX),
            sealer: secret.and_then(Sealer::new).map(Arc::new),
        }
    }

    /// What binds a sealed body to its entry (the id is Redis's, assigned after sealing).
    fn seal_context(e: &DeadLetter) -> String {
        format!("dead-letter:{}:{}:{}:{}", e.time_ms, e.route, e.method, e.path)
    }

    /// Before an entry goes to Redis: its body sealed, when there is a secret.
    fn seal(&self, mut e: DeadLetter) -> DeadLetter {
        let Some(sealer) = &self.sealer else {
            return e;
        };
        if let Some(body) = e.body_base64.take() {
            e.body_sealed = sealer.seal(&Self::seal_context(&e), body.as_bytes());
            if e.body_sealed.is_none() {
                e.body_kept = false;
                e.body_missing = Some("the request body could not be sealed".into());
            }
        }
        e
    }

    /// After an entry is read from Redis: its body opened (or marked as unreadable here).
    fn open(&self, mut e: DeadLetter) -> DeadLetter {
        let Some(sealed) = e.body_sealed.take() else {
            return e;
        };
        let opened = self
            .sealer
            .as_ref()
            .and_then(|s| s.open(&Self::seal_context(&e), &sealed))
            .and_then(|plain| String::from_utf8(plain).ok());
        match opened {
            Some(b64) => e.body_base64 = Some(b64),
            None => {
                e.body_kept = false;
                e.body_missing = Some(
                    "the request body is sealed under another [jobs] secret (it must be the same on every replica)"
                        .into(),
                );
            }
        }
        e
    }

    fn stream_key(r: &RedisHandle) -> String {
        r.key("dead_letters")
    }

    fn replays_key(r: &RedisHandle) -> String {
        r.key("dead_letters:replays")
    }

    /// Records an entry at once when the store is in memory (a write there never waits: no task,
    /// and the entry is there before the response goes out); on Redis it is handed back, for
    /// [`DeadLetters::add`] on a task.
    pub(crate) fn add_now(&self, entry: DeadLetter) -> Result<String, Box<DeadLetter>> {
        match &self.backend {
            Backend::Memory(ring) => Ok(self.add_to_ring(ring, entry)),
            Backend::Redis(_) => Err(Box::new(entry)),
        }
    }

    /// Counts an entry (`rebound_dead_letters_total`), wherever it is recorded.
    fn count(&self, entry: &DeadLetter) {
        self.metrics
            .dead_letters_total
            .with_label_values(&[&entry.route, &entry.reason])
            .inc();
    }

    /// Counts an entry and adds it to the ring (its `id` is assigned here).
    fn add_to_ring(&self, ring: &Mutex<Ring>, mut entry: DeadLetter) -> String {
        self.count(&entry);
        let mut ring = ring.lock();
        let (ms, seq) = ring.last_id;
        let id = if entry.time_ms > ms {
            (entry.time_ms, 0)
        } else {
            (ms, seq + 1)
        };
        ring.last_id = id;
        entry.id = format!("{}-{}", id.0, id.1);
        let id = entry.id.clone();
        ring.bytes += body_bytes(&entry);
        ring.entries.push_back(entry);
        while ring.entries.len() > self.cap || (ring.bytes > self.max_bytes && ring.entries.len() > 1) {
            if let Some(old) = ring.entries.pop_front() {
                ring.bytes -= body_bytes(&old);
            }
        }
        self.metrics.dead_letters_depth.set(ring.entries.len() as i64);
        id
    }

    /// Records an entry (its `id` is assigned here) and counts it.
    pub async fn add(&self, entry: DeadLetter) -> Result<String, DeadLetterError> {
        match &self.backend {
            Backend::Memory(ring) => Ok(self.add_to_ring(ring, entry)),
            Backend::Redis(r) => {
                self.count(&entry);
                let key = Self::stream_key(r);
                let data = serde_json::to_string(&self.seal(entry)).unwrap_or_default();
                let cap = self.cap;
                let (id, depth): (String, i64) = r
                    .run("dead_letter_add", |mut c| async move {
                        redis::pipe()
                            .cmd("XADD")
                            .arg(&key)
                            .arg("MAXLEN")
                            .arg("~")
                            .arg(cap)
                            .arg("*")
                            .arg("e")
                            .arg(data)
                            .cmd("XLEN")
                            .arg(&key)
                            .query_async(&mut c)
                            .await
                    })
                    .await?;
                self.metrics.dead_letters_depth.set(depth);
                Ok(id)
            }
        }
    }

    /// Every entry matching `filter`, newest first, from `cursor` (exclusive), at most `limit`.
    pub async fn list(&self, filter: &Filter, limit: usize, cursor: Option<&str>) -> Result<Page, DeadLetterError> {
        let limit = limit.clamp(1, 1000);
        let mut items = Vec::new();
        let mut last_scanned: Option<String> = cursor.map(str::to_string);
        let mut exhausted = false;
        while items.len() < limit && !exhausted {
            let batch = self.scan_back(last_scanned.as_deref(), SCAN_BATCH).await?;
            exhausted = batch.len() < SCAN_BATCH;
            for e in batch {
                last_scanned = Some(e.id.clone());
                if filter.matches(&e) {
                    items.push(e);
                    if items.len() == limit {
                        break;
                    }
                }
            }
        }
        let next_cursor = if items.len() == limit {
            items.last().map(|e| e.id.clone())
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }

    /// One entry by id.
    pub async fn get(&self, id: &str) -> Result<Option<DeadLetter>, DeadLetterError> {
        match &self.backend {
            Backend::Memory(ring) => {
                let ring = ring.lock();
                Ok(ring.position(id).and_then(|i| ring.entries.get(i)).cloned())
            }
            Backend::Redis(r) => {
                let mut cmd = redis::cmd("XRANGE");
                cmd.arg(Self::stream_key(r)).arg(id).arg(id);
                let mut entries = self.read(r, "dead_letter_get", cmd).await?;
                Ok(entries.pop())
            }
        }
    }

    /// The groups of the entries matching `filter` since its `since` (else the last 24 hours)
    /// up to `now_ms`, newest first, read within [`SUMMARY_MAX_ENTRIES`] and [`SUMMARY_MAX_TIME`]
    /// (`truncated` says the read stopped there). Without analysis: the caller has the journal.
    pub async fn summary(&self, filter: &Filter, now_ms: u64) -> Result<Summary, DeadLetterError> {
        let since = filter.since.unwrap_or(now_ms.saturating_sub(SUMMARY_DEFAULT_WINDOW_MS));
        let bound = Bound {
            since,
            entries: SUMMARY_MAX_ENTRIES,
            time: SUMMARY_MAX_TIME,
        };
        let (entries, truncated) = self.read_matching(filter, Some(bound)).await?;
        let window = analysis::Window::new(since, now_ms.max(since), TIMELINE_BUCKETS);
        Ok(Summary {
            total: entries.len() as u64,
            groups: analysis::group(&entries, window),
            window: Some(window),
            truncated,
        })
    }

    /// Records a replay's outcome on its entry.
    pub(crate) async fn record_replay(&self, id: &str, replay: ReplayRecord) -> Result<(), DeadLetterError> {
        match &self.backend {
            Backend::Memory(ring) => {
                let mut ring = ring.lock();
                if let Some(e) = ring.position(id).and_then(|i| ring.entries.get_mut(i)) {
                    e.replays.push(replay);
                }
                Ok(())
            }
            Backend::Redis(r) => {
                // Appended in one script: one round trip, and concurrent replays of one entry
                // cannot overwrite each other's record.
                let (key, id) = (Self::replays_key(r), id.to_string());
                let record = serde_json::to_string(&replay).unwrap_or_default();
                let script = &*APPEND_REPLAY;
                r.run("dead_letter_replay", |mut c| async move {
                    script.key(&key).arg(&id).arg(record).invoke_async::<i64>(&mut c).await
                })
                .await?;
                Ok(())
            }
        }
    }

    /// Deletes every entry matching `filter`; returns how many.
    pub(crate) async fn purge(&self, filter: &Filter) -> Result<u64, DeadLetterError> {
        match &self.backend {
            Backend::Memory(ring) => {
                let mut ring = ring.lock();
                let before = ring.entries.len();
                ring.entries.retain(|e| !filter.matches(e));
                ring.bytes = ring.entries.iter().map(body_bytes).sum();
                self.metrics.dead_letters_depth.set(ring.entries.len() as i64);
                Ok((before - ring.entries.len()) as u64)
            }
            Backend::Redis(r) => {
                let ids: Vec<String> = self.matching(filter).await?.into_iter().map(|e| e.id).collect();
                let (key, replays) = (Self::stream_key(r), Self::replays_key(r));
                for chunk in ids.chunks(SCAN_BATCH) {
                    let (key, replays, chunk) = (key.clone(), replays.clone(), chunk.to_vec());
                    // Two commands: the stream and the replays hash are two Cluster slots.
                    r.run("dead_letter_purge", |mut c| async move {
                        redis::cmd("XDEL")
                            .arg(&key)
                            .arg(&chunk)
                            .query_async::<()>(&mut c)
                            .await?;
                        redis::cmd("HDEL")
                            .arg(&replays)
                            .arg(&chunk)
                            .query_async::<()>(&mut c)
                            .await
                    })
                    .await?;
                }
                let key2 = key.clone();
                let depth: i64 = r
                    .run("dead_letter_len", |mut c| async move {
                        redis::cmd("XLEN").arg(&key2).query_async(&mut c).await
                    })
                    .await?;
                self.metrics.dead_letters_depth.set(depth);
                Ok(ids.len() as u64)
            }
        }
    }

    /// Every entry matching `filter`, newest first (at most the cap: the store is bounded).
    pub(crate) async fn matching(&self, filter: &Filter) -> Result<Vec<DeadLetter>, DeadLetterError> {
        Ok(self.read_matching(filter, None).await?.0)
    }

    /// The entries matching `filter`, newest first; within `bound` when given (the read stops at
    /// the first entry older than its `since`, and once it holds `entries` or has taken `time`:
    /// `true` then, the older entries unread).
    async fn read_matching(
        &self,
        filter: &Filter,
        bound: Option<Bound>,
    ) -> Result<(Vec<DeadLetter>, bool), DeadLetterError> {
        let started = crate::time::now();
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let batch = self.scan_back(cursor.as_deref(), SCAN_BATCH).await?;
            let done = batch.len() < SCAN_BATCH;
            cursor = batch.last().map(|e| e.id.clone());
            for e in batch {
                if bound.is_some_and(|b| e.time_ms < b.since) {
                    return Ok((out, false));
                }
                if filter.matches(&e) {
                    out.push(e);
                }
            }
            if done || cursor.is_none() {
                return Ok((out, false));
            }
            if bound.is_some_and(|b| {
                out.len() >= b.entries || crate::time::now().saturating_duration_since(started) >= b.time
            }) {
                return Ok((out, true));
            }
        }
    }

    /// Entries older than `before` (exclusive; newest end when `None`), newest first.
    async fn scan_back(&self, before: Option<&str>, count: usize) -> Result<Vec<DeadLetter>, DeadLetterError> {
        match &self.backend {
            Backend::Memory(ring) => {
                let ring = ring.lock();
                // The ring is in id order: the entries older than `before` are a prefix of it.
                let end = before.map_or(ring.entries.len(), |b| {
                    let b = id_order(b);
                    ring.entries.partition_point(|e| id_order(&e.id) < b)
                });
                Ok(ring.entries.range(..end).rev().take(count).cloned().collect())
            }
            Backend::Redis(r) => {
                let end = before.map_or_else(|| "+".to_string(), |b| format!("({b}"));
                let mut cmd = redis::cmd("XREVRANGE");
                cmd.arg(Self::stream_key(r)).arg(end).arg("-").arg("COUNT").arg(count);
                let entries = self.read(r, "dead_letter_scan", cmd).await?;
                Ok(entries)
            }
        }
    }

    /// Runs a stream range command and returns its entries, with their replays.
    async fn read(
        &self,
        r: &RedisHandle,
        op: &'static str,
        cmd: redis::Cmd,
    ) -> Result<Vec<DeadLetter>, DeadLetterError> {
        let rows: Vec<(String, Vec<(String, String)>)> =
            r.run(op, |mut c| async move { cmd.query_async(&mut c).await }).await?;
        let mut entries = self.decode(rows);
        self.attach_replays(r, &mut entries).await?;
        Ok(entries)
    }

    fn decode(&self, rows: Vec<(String, Vec<(String, String)>)>) -> Vec<DeadLetter> {
        rows.into_iter()
            .filter_map(|(id, fields)| {
                let data = fields.into_iter().find(|(k, _)| k == "e")?.1;
                let mut e: DeadLetter = serde_json::from_str(&data).ok()?;
                e.id = id;
                Some(self.open(e))
            })
            .collect()
    }

    async fn attach_replays(&self, r: &RedisHandle, entries: &mut [DeadLetter]) -> Result<(), DeadLetterError> {
        if entries.is_empty() {
            return Ok(());
        }
        let key = Self::replays_key(r);
        let ids: Vec<String> = entries.iter().map(|e| e.id.clone()).collect();
        let found: Vec<Option<String>> = r
            .run("dead_letter_scan", |mut c| async move {
                redis::cmd("HMGET").arg(&key).arg(&ids).query_async(&mut c).await
            })
            .await?;
        for (e, replays) in entries.iter_mut().zip(found) {
            if let Some(list) = replays.and_then(|s| serde_json::from_str(&s).ok()) {
                e.replays = list;
            }
        }
        Ok(())
    }
}

/// Orders `<ms>-<seq>` ids numerically.
fn id_order(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(route: &str, reason: &str, t: u64) -> DeadLetter {
        DeadLetter {
            id: String::new(),
            time_ms: t,
            route: route.into(),
            upstream: "u".into(),
            method: "POST".into(),
            path: "/v1/x".into(),
            idempotency_key: None,
            query: None,
            reason: reason.into(),
            error_class: "status_5xx".into(),
            final_status: 503,
            error_message: None,
            attempts: vec![],
            headers: vec![],
            body_base64: None,
            body_kept: false,
            body_missing: None,
            body_sealed: None,
            idempotency: None,
            replays: vec![],
            job_id: None,
        }
    }

    fn store(cap: u32) -> DeadLetters {
        let config = DeadLettersConfig {
            max_entries: cap,
            max_body: 1 << 20,
            max_bytes: 64 << 20,
            secret_headers: vec![],
        };
        DeadLetters::new(&config, None, None, Arc::new(Metrics::new().unwrap()))
    }

    #[tokio::test]
    async fn ring_is_capped_and_lists_newest_first_with_cursors() {
        let s = store(50);
        for i in 0..500u64 {
            s.add(entry(
                if i % 2 == 0 { "a" } else { "b" },
                "retries_exhausted",
                1000 + i / 10,
            ))
            .await
            .unwrap();
        }
        let all = s.list(&Filter::default(), 1000, None).await.unwrap();
        assert_eq!(all.items.len(), 50);
        assert!(all.items.windows(2).all(|w| id_order(&w[0].id) > id_order(&w[1].id)));
        let a = Filter {
            route: Some("a".into()),
            ..Filter::default()
        };
        let p1 = s.list(&a, 10, None).await.unwrap();
        assert_eq!(p1.items.len(), 10);
        let p2 = s.list(&a, 10, p1.next_cursor.as_deref()).await.unwrap();
        assert_eq!(p2.items.len(), 10);
        assert!(id_order(&p2.items[0].id) < id_order(&p1.items[9].id));
        let p3 = s.list(&a, 10, p2.next_cursor.as_deref()).await.unwrap();
        assert_eq!(p3.items.len(), 5);
        assert!(p3.next_cursor.is_none());
        let all = Filter {
            since: Some(0),
            ..Filter::default()
        };
        let summary = s.summary(&all, crate::time::now_unix_ms()).await.unwrap();
        assert_eq!(summary.total, 50);
        assert_eq!(summary.groups.len(), 2);
        assert_eq!(s.purge(&a).await.unwrap(), 25);
        assert_eq!(s.list(&Filter::default(), 1000, None).await.unwrap().items.len(), 25);
    }

    #[tokio::test]
    async fn entries_are_found_by_id_after_wrapping_and_purging() {
        let s = store(100);
        let mut ids = Vec::new();
        for i in 0..300u64 {
            let route = if i % 3 == 0 { "a" } else { "b" };
            ids.push(s.add(entry(route, "retries_exhausted", 1000 + i / 7)).await.unwrap());
        }
        let a = Filter {
            route: Some("a".into()),
            ..Filter::default()
        };
        assert_eq!(s.purge(&a).await.unwrap(), 33);
        for (i, id) in ids.iter().enumerate() {
            let kept = i >= 200 && i % 3 != 0;
            assert_eq!(s.get(id).await.unwrap().map(|e| e.id), kept.then(|| id.clone()), "{id}");
        }
        // Same order numbers, not the same id: not found.
        let (ms, seq) = ids[250].split_once('-').unwrap();
        assert!(s.get(&format!("{ms}-0{seq}")).await.unwrap().is_none());
        assert!(s.get("nonsense").await.unwrap().is_none());
        let replay = ReplayRecord {
            at_ms: 5,
            status: 200,
            from_store: true,
        };
        s.record_replay(&ids[299], replay.clone()).await.unwrap();
        s.record_replay(&ids[0], replay.clone()).await.unwrap();
        assert_eq!(s.get(&ids[299]).await.unwrap().unwrap().replays, vec![replay]);
        // A cursor that is no longer in the ring still pages from where it was.
        let page = s.list(&Filter::default(), 5, Some(&ids[150])).await.unwrap();
        assert_eq!(page.items.len(), 0);
        let page = s.list(&Filter::default(), 5, Some(&ids[201])).await.unwrap();
        assert_eq!(page.items.iter().map(|e| &e.id).collect::<Vec<_>>(), vec![&ids[200]]);
        let page = s.list(&Filter::default(), 5, Some(&ids[210])).await.unwrap();
        let want: Vec<&String> = [209, 208, 206, 205, 203].iter().map(|i| &ids[*i]).collect();
        assert_eq!(page.items.iter().map(|e| &e.id).collect::<Vec<_>>(), want);
    }
}
