//! The in-memory job queue (no `[redis]`): one process, bounded, lost on restart. Unfinished jobs
//! are capped by `max_queue`; finished ones are kept for `result_ttl`, at most
//! [`MAX_FINISHED`] of them and [`MAX_RESULT_BYTES`] of result bodies (the oldest go first).

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::record::{
    CallbackState, CallbackView, Finished, JobResult, JobState, JobView, NewJob, StoredRequest, Submitted,
};
use super::JobId;

/// Finished jobs kept at most.
pub(crate) const MAX_FINISHED: usize = 10_000;
/// Result bodies kept at most (bytes).
pub(crate) const MAX_RESULT_BYTES: usize = 64 << 20;

/// A job a worker took.
pub(crate) struct Taken {
    pub id: JobId,
    pub route: String,
    pub request: StoredRequest,
    pub body: Bytes,
    pub credentials: Vec<(String, String)>,
    pub callback: Option<String>,
}

/// A job with what the API shows and what a callback needs.
pub(crate) struct Loaded {
    pub(crate) view: JobView,
    pub result: Option<JobResult>,
    pub callback: Option<String>,
}

#[derive(Default)]
pub(crate) struct MemoryQueue {
    state: Mutex<State>,
    notify: Notify,
}

#[derive(Default)]
struct State {
    jobs: HashMap<JobId, Job>,
    queue: VecDeque<JobId>,
    unfinished: usize,
    /// Finished job ids, in the order they finished.
    finished: VecDeque<JobId>,
    result_bytes: usize,
}

struct Job {
    view: JobView,
    fingerprint: String,
    /// Until a worker takes it.
    request: Option<Pending>,
    callback: Option<String>,
    result: Option<JobResult>,
    /// Finished jobs only.
    expires: Option<Instant>,
}

struct Pending {
    request: StoredRequest,
    body: Bytes,
    credentials: Vec<(String, String)>,
}

impl Job {
    fn expired(&self, now: Instant) -> bool {
        self.expires.is_some_and(|e| e <= now)
    }
}

impl MemoryQueue {
    /// Creates and queues a job, unless its id exists or `max_queue` jobs are unfinished.
    /// Returns the outcome and the number of unfinished jobs.
    pub(crate) fn submit(&self, job: NewJob, max_queue: usize) -> (Submitted, usize) {
        let mut s = self.state.lock();
        s.sweep(crate::time::now());
        if let Some(existing) = s.jobs.get(&job.id) {
            let outcome = if existing.fingerprint == job.fingerprint {
                Submitted::Exists(existing.view.state)
            } else {
                Submitted::Mismatch
            };
            return (outcome, s.unfinished);
        }
        if s.unfinished >= max_queue {
            return (Submitted::Full, s.unfinished);
        }
        let view = JobView {
            id: job.id.clone(),
            state: JobState::Queued,
            route: job.route,
            access: Some(job.access),
            created_ms: job.created_ms,
            started_ms: None,
            finished_ms: None,
            runs: 0,
            attempts: 0,
            http_status: None,
            error: None,
            callback: None,
            usage: Vec::new(),
        };
        s.jobs.insert(
            job.id.clone(),
            Job {
                view,
                fingerprint: job.fingerprint,
                request: Some(Pending {
                    request: job.request,
                    body: job.body,
                    credentials: job.credentials,
                }),
                callback: job.callback,
                result: None,
                expires: None,
            },
        );
        s.queue.push_back(job.id);
        s.unfinished += 1;
        let depth = s.unfinished;
        drop(s);
        self.notify.notify_one();
        (Submitted::Queued, depth)
    }

    /// A job's view, its result and callback target.
    pub(crate) fn load(&self, id: &JobId) -> Option<Loaded> {
        let mut s = self.state.lock();
        s.sweep(crate::time::now());
        let job = s.jobs.get(id)?;
        Some(Loaded {
            view: job.view.clone(),
            result: job.result.clone(),
            callback: job.callback.clone(),
        })
    }

    /// Waits for the next queued job and marks it running.
    pub(crate) async fn take(&self, now_ms: impl Fn() -> u64) -> Taken {
        loop {
            let notified = self.notify.notified();
            if let Some(taken) = self.try_take(now_ms()) {
                return taken;
            }
            notified.await;
        }
    }

    fn try_take(&self, now_ms: u64) -> Option<Taken> {
        let mut s = self.state.lock();
        while let Some(id) = s.queue.pop_front() {
            let Some(job) = s.jobs.get_mut(&id) else { continue };
            let Some(Pending {
                request,
                body,
                credentials,
            }) = job.request.take()
            else {
                continue;
            };
            job.view.state = JobState::Running;
            job.view.started_ms.get_or_insert(now_ms);
            job.view.runs += 1;
            return Some(Taken {
                id,
                route: job.view.route.clone(),
                request,
                body,
                credentials,
                callback: job.callback.clone(),
            });
        }
        None
    }

    /// Records a run's outcome. Returns the number of unfinished jobs.
    pub(crate) fn finish(&self, id: &JobId, f: &Finished, callback_pending: bool, ttl: Duration) -> usize {
        let mut s = self.state.lock();
        let now = crate::time::now();
        if let Some(job) = s.jobs.get_mut(id) {
            if !job.view.state.finished() {
                job.view.state = f.state;
                job.view.finished_ms = Some(f.finished_ms);
                job.view.attempts = f.attempts;
                job.view.http_status = f.http_status;
                job.view.error = f.error.clone();
                job.view.usage.clone_from(&f.usage);
                if callback_pending {
                    job.view.callback = Some(CallbackView {
                        state: CallbackState::Pending,
                        attempts: 0,
                        last_status: None,
                    });
                }
                let added = f.result.as_ref().map_or(0, |r| r.body.len());
                job.result = f.result.clone();
                job.expires = Some(now + ttl);
                s.unfinished = s.unfinished.saturating_sub(1);
                s.finished.push_back(id.clone());
                s.result_bytes += added;
            }
        }
        s.sweep(now);
        s.unfinished
    }

    /// Records what became of a job's callback.
    pub(crate) fn callback_done(&self, id: &JobId, view: CallbackView) {
        let mut s = self.state.lock();
        if let Some(job) = s.jobs.get_mut(id) {
            job.view.callback = Some(view);
        }
    }
}

impl State {
    /// Drops expired finished jobs, then the oldest ones beyond the caps.
    fn sweep(&mut self, now: Instant) {
        while let Some(id) = self.finished.front() {
            let over = self.finished.len() > MAX_FINISHED || self.result_bytes > MAX_RESULT_BYTES;
            let expired = self.jobs.get(id).is_none_or(|j| j.expired(now));
            if !(over || expired) {
                break;
            }
            let Some(id) = self.finished.pop_front() else { break };
            if let Some(job) = self.jobs.remove(&id) {
                self.result_bytes = self.result_bytes.saturating_sub(job.result.map_or(0, |r| r.body.len()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(text: &str) -> JobId {
        JobId::from_stored(text.into())
    }

    fn job(text: &str, fp: &str) -> NewJob {
        NewJob {
            id: id(text),
            route: "r".into(),
            fingerprint: fp.into(),
            access: crate::credentials::CredentialHash([7; 16]),
            created_ms: 1,
            request: StoredRequest {
                method: "POST".into(),
                uri: "/r/x".into(),
                headers: vec![],
                identity: None,
            },
            body: Bytes::from_static(b"{}"),
            credentials: vec![],
            callback: None,
        }
    }

    fn done(body: &[u8]) -> Finished {
        Finished {
            state: JobState::Succeeded,
            finished_ms: 2,
            attempts: 1,
            http_status: Some(200),
            result: Some(JobResult {
                status: 200,
                headers: vec![],
                body: Bytes::copy_from_slice(body),
            }),
            error: None,
            usage: Vec::new(),
        }
    }

    #[tokio::test]
    async fn queue_is_bounded_and_ids_are_unique() {
        let q = MemoryQueue::default();
        assert_eq!(q.submit(job("a", "f"), 2).0, Submitted::Queued);
        assert_eq!(q.submit(job("a", "f"), 2).0, Submitted::Exists(JobState::Queued));
        assert_eq!(q.submit(job("a", "other"), 2).0, Submitted::Mismatch);
        assert_eq!(q.submit(job("b", ""), 2).0, Submitted::Queued);
        assert_eq!(q.submit(job("c", ""), 2).0, Submitted::Full);
        let t = q.take(|| 5).await;
        assert_eq!(t.id.as_str(), "a");
        let v = q.load(&id("a")).unwrap().view;
        assert_eq!((v.state, v.runs, v.started_ms), (JobState::Running, 1, Some(5)));
        // Running still counts against the cap.
        assert_eq!(q.submit(job("c", ""), 2).0, Submitted::Full);
        assert_eq!(q.finish(&id("a"), &done(b"ok"), false, Duration::from_secs(60)), 1);
        assert_eq!(q.submit(job("c", ""), 2).0, Submitted::Queued);
        let l = q.load(&id("a")).unwrap();
        assert_eq!(l.view.state, JobState::Succeeded);
        assert_eq!(l.result.unwrap().body, "ok");
    }

    #[tokio::test(start_paused = true)]
    async fn finished_jobs_expire() {
        let q = MemoryQueue::default();
        q.submit(job("a", ""), 10);
        q.take(|| 1).await;
        q.finish(&id("a"), &done(b"x"), false, Duration::from_secs(10));
        assert!(q.load(&id("a")).is_some());
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(q.load(&id("a")).is_none());
    }
}
