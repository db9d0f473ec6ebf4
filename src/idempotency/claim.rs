//! A fresh request's ownership of its key, to its end ([`Claim`]): its lease renewed while it
//! runs, and at the end its completion (the response kept, or not) or its release, written to the
//! store and retried until the store answers ([`Writer`]).

use super::fingerprint::RecordKey;
use super::held::{Held, HeldCompletion};
use super::live::{self, End, Head, Live};
use super::liveness::Owner;
use super::renewal::Renewal;
use super::store::StoreError;
use super::store::{Completion, KeptHeaders, Store};
use super::{AnyStore, Counters, Recorder, KEPT_HEADERS, WRITE_RETRY_FIRST, WRITE_RETRY_MAX};
use crate::config::IdempotencyPolicy;
use crate::metrics::{CompletionResult, IdempotencyResult, Metrics};
use crate::wire::body::BoxError;
use bytes::Bytes;
use http::HeaderMap;
use http_body::Body;
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Ownership of a claimed key until the request ends. Dropped without an outcome (the client went
/// away before the response), it releases the key so that a retry can run.
pub struct Claim {
    pub(super) inner: Option<ClaimInner>,
    /// A response-cache claim made over a stored entry (`no-cache`, or older than `max-age`).
    pub(crate) refreshed: bool,
}

pub(super) struct ClaimInner {
    pub(super) writer: Writer,
    pub(super) held: Arc<Held>,
    pub(super) policy: Arc<IdempotencyPolicy>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) counters: Arc<Counters>,
    pub(super) tasks: TaskTracker,
    /// The response as it is produced: the recorder's buffer, and what followers read.
    pub(super) live: Arc<Live>,
    /// A response-cache claim: a response that is not kept frees the entry (no "not kept" record).
    pub(super) cache: bool,
    /// Followers on this replica find `live` while the claim lasts (`"follow"` only).
    pub(super) _registered: Option<live::Registered>,
    /// Stops the lease renewal when the claim ends (after its write landed or was given up).
    /// Its lease renewed until the claim ends.
    pub(super) _renewal: Renewal,
}

/// How a write that must land (a completion, a release) ended.
pub(super) enum Written {
    /// At the first try.
    AtOnce,
    /// After the store failed to answer at least once.
    Late,
    /// Another owner holds or completed the key (a duplicate ran), or nobody holds it any more.
    Refused,
    /// Given up: the shutdown grace ran out, or the time it was worth trying passed.
    Abandoned,
}

/// Writes to the store that are retried until they land: the store answered no, or it answered.
pub(super) struct Writer {
    pub(super) store: AnyStore,
    pub(super) hard_stop: CancellationToken,
    pub(super) route: Arc<str>,
}

impl Writer {
    /// Tries `op` until the store answers, with jittered exponential backoff, for at most `bound`
    /// and never past the shutdown grace. `failed`: a first try already failed (pause first).
    pub(super) async fn until_answered<F, Fut>(&self, bound: Duration, mut failed: bool, mut op: F) -> Written
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool, StoreError>>,
    {
        let give_up = crate::time::now() + bound;
        let mut step = WRITE_RETRY_FIRST;
        loop {
            if failed {
                let pause = step.mul_f64(rand::rng().random_range(0.5..=1.0));
                if crate::time::now() + pause >= give_up {
                    return Written::Abandoned;
                }
                tokio::select! {
                    _ = self.hard_stop.cancelled() => return Written::Abandoned,
                    _ = tokio::time::sleep(pause) => {}
                }
                step = (step * 2).min(WRITE_RETRY_MAX);
            }
            match op().await {
                Ok(true) if failed => return Written::Late,
                Ok(true) => return Written::AtOnce,
                Ok(false) => return Written::Refused,
                Err(e) if !failed => {
                    tracing::warn!(route = %self.route, error = %e, "idempotency write failed; retrying until the store answers");
                    failed = true;
                }
                Err(_) => {}
            }
        }
    }

    /// Frees `record` for `owner`, retried until the store answers (at most `lease`: after it the
    /// claim has lapsed anyway).
    pub(super) async fn release_until_answered(
        &self,
        record: &RecordKey,
        owner: &Owner,
        lease: Duration,
        failed: bool,
    ) -> Written {
        let written = self
            .until_answered(lease, failed, || self.store.release(record, owner))
            .await;
        if matches!(written, Written::Abandoned) {
            tracing::warn!(route = %self.route, "idempotency release not written; the key frees when its lease ends");
        }
        written
    }
}

impl ClaimInner {
    pub(super) fn count(&self, result: IdempotencyResult) {
        self.counters.result(result);
    }

    pub(super) fn count_write(&self, result: CompletionResult) {
        self.counters.completion(result);
    }

    /// The response is not stored: its followers are told, the outcome counted.
    pub(super) fn released(&self) {
        self.live.finish(End::Released);
        self.count(IdempotencyResult::NotStored);
    }

    /// Frees the key: at once in memory, else as a task retried until the store answers.
    pub(super) fn release_or_spawn(self) {
        self.released();
        if let AnyStore::Memory(m) = &self.writer.store {
            m.release_now(&self.live.record, &self.live.owner);
            return;
        }
        let tasks = self.tasks.clone();
        tasks.spawn(self.release_retried(false));
    }

    /// Records a delivered response: at once in memory (no task, no future to box), else as a
    /// task ([`ClaimInner::complete`]).
    pub(super) fn complete_or_spawn(self, completion: Completion, first_try: Option<tokio::sync::oneshot::Sender<()>>) {
        if self.cache && matches!(completion, Completion::NotKept) {
            return self.release_or_spawn();
        }
        if let AnyStore::Memory(m) = &self.writer.store {
            let kept = matches!(completion, Completion::Kept(_));
            let (live, ttl) = (&self.live, self.policy.ttl);
            let written = if m.complete_now(&live.record, &live.fingerprint, &live.owner, completion, ttl) {
                Written::AtOnce
            } else {
                Written::Refused
            };
            drop(first_try);
            self.count_written(written, kept);
            return;
        }
        let tasks = self.tasks.clone();
        tasks.spawn(self.complete(completion, first_try));
    }

    pub(super) async fn release_retried(self, failed: bool) {
        self.writer
            .release_until_answered(&self.live.record, &self.live.owner, self.policy.lease, failed)
            .await;
    }

    /// Frees the key with one try (a response waits for it: bounded by `command_timeout`); a try
    /// the store does not answer goes on in the background.
    pub(super) async fn release_now(self) {
        self.released();
        if let Err(e) = self.writer.store.release(&self.live.record, &self.live.owner).await {
            tracing::warn!(route = %self.writer.route, error = %e, "idempotency release failed; retrying in the background");
            let tasks = self.tasks.clone();
            tasks.spawn(self.release_retried(true));
        }
    }

    /// Records a delivered response. A write the store does not answer is retried, the lease still
    /// renewed, until it lands, another owner has the key, or `ttl` (or the shutdown grace) runs
    /// out; meanwhile a duplicate reaching this replica is answered from the held response.
    /// `first_try` is dropped once the first write has answered (or failed): a response whose
    /// end waits for it (`wait_replicas`) is released then.
    pub(super) async fn complete(self, completion: Completion, first_try: Option<tokio::sync::oneshot::Sender<()>>) {
        let kept = matches!(completion, Completion::Kept(_));
        let (record, owner, fp, ttl) = (
            &self.live.record,
            &self.live.owner,
            &self.live.fingerprint,
            self.policy.ttl,
        );
        let first = self.writer.store.complete(record, fp, owner, &completion, ttl).await;
        drop(first_try);
        let written = match first {
            Ok(true) => Written::AtOnce,
            Ok(false) => Written::Refused,
            Err(e) => {
                tracing::warn!(route = %self.writer.route, error = %e, "idempotency completion not written; retrying, and answering duplicates here meanwhile");
                let held = Arc::new(HeldCompletion {
                    fingerprint: fp.clone(),
                    completion,
                });
                if self.held.hold(record, held.clone()) {
                    let pending = &self.metrics.idempotency_completions_pending;
                    pending.inc();
                    let store = &self.writer.store;
                    let written = self
                        .writer
                        .until_answered(ttl, true, || store.complete(record, fp, owner, &held.completion, ttl))
                        .await;
                    self.held.forget(record);
                    pending.dec();
                    written
                } else {
                    Written::Abandoned
                }
            }
        };
        self.count_written(written, kept);
    }

    /// Counts how a completion's write ended.
    pub(super) fn count_written(&self, written: Written, kept: bool) {
        match written {
            Written::AtOnce => self.count(if kept {
                IdempotencyResult::Stored
            } else {
                IdempotencyResult::NotStored
            }),
            Written::Late => {
                self.count(if kept {
                    IdempotencyResult::Stored
                } else {
                    IdempotencyResult::NotStored
                });
                self.count_write(CompletionResult::Late);
                tracing::info!(route = %self.writer.route, "idempotency completion written late");
            }
            Written::Refused => {
                self.count(IdempotencyResult::NotStored);
                self.count_write(CompletionResult::Lost);
                tracing::warn!(route = %self.writer.route, "idempotency key taken by another request before completion: the response was not stored");
            }
            Written::Abandoned => {
                self.count(IdempotencyResult::StoreError);
                self.count_write(CompletionResult::Lost);
                tracing::warn!(route = %self.writer.route, "idempotency completion not written: a retry with this key may run again");
            }
        }
    }
}

impl Claim {
    /// The response it records (none for a claim that records nothing).
    pub(crate) fn live(&self) -> Option<Arc<Live>> {
        self.inner.as_ref().map(|c| c.live.clone())
    }

    /// Whether a response with this status is stored (per `store_statuses`).
    pub(crate) fn stores(&self, status: u16) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|c| c.policy.store_statuses.iter().any(|p| p.matches(status)))
    }

    /// Frees the key now (an outcome outside `store_statuses`, or rebound's own error).
    pub async fn release(mut self) {
        if let Some(inner) = self.inner.take() {
            inner.release_now().await;
        }
    }

    /// Wraps a response body to be stored as it streams to the client (and shared, as it is
    /// produced, with the duplicates that follow it).
    /// `failed`: set while it streams when the response turns out to be a failure (an error
    /// event mid-stream): it is then passed through but not stored, the key released at its end.
    pub fn record<B>(
        mut self,
        status: u16,
        headers: &HeaderMap,
        body: B,
        failed: Option<Arc<std::sync::atomic::AtomicBool>>,
    ) -> Recorder
    where
        B: Body<Data = Bytes, Error = BoxError> + Send + 'static,
    {
        let kept = KeptHeaders::of(|| {
            headers
                .iter()
                .filter(|(k, _)| KEPT_HEADERS.contains(&k.as_str()))
                .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str(), v)))
        });
        Recorder::new(self.inner.take(), Head { status, headers: kept }, body, failed)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            inner.release_or_spawn();
        }
    }
}
