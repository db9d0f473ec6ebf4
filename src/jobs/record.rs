//! What a job is made of, as both stores keep it and as the API shows it.

use crate::words::{spelled, Spelled};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::JobId;
use crate::credentials::CredentialHash;
use crate::idempotency::ReplayIdentity;

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Queued,
    Running,
    Succeeded,
    Failed,
}

spelled!(JobState { "queued" => Queued, "running" => Running, "succeeded" => Succeeded, "failed" => Failed });

impl JobState {
    pub fn parse(s: &str) -> Option<JobState> {
        <JobState as Spelled>::parse(s)
    }

    pub fn finished(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Failed)
    }
}

/// The request a job runs, minus its body and credentials (kept beside it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct StoredRequest {
    pub method: String,
    /// Path and query as the app sent them (the route prefix included).
    pub uri: String,
    /// Every header but hop-by-hop ones, `host`, `content-length`, `x-rebound-callback` and the
    /// credentials.
    pub headers: Vec<(String, String)>,
    /// The submission's idempotency identity (hashes only), so that every run of the job claims
    /// the same record, whichever replica runs it.
    pub identity: Option<ReplayIdentity>,
}

/// A job to create.
#[derive(Debug, Clone)]
pub(crate) struct NewJob {
    pub id: JobId,
    pub route: String,
    /// The idempotency fingerprint when the job came with a key (`""` without).
    pub fingerprint: String,
    /// Hash of the submitter's credential headers: only the same credential reads the job.
    pub access: CredentialHash,
    pub(crate) created_ms: u64,
    pub request: StoredRequest,
    pub body: Bytes,
    /// Credential headers (sealed before they reach Redis).
    pub credentials: Vec<(String, String)>,
    pub callback: Option<String>,
}

/// How a submission went.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Submitted {
    /// Created and queued.
    Queued,
    /// A job with this id exists (the same Idempotency-Key): its state.
    Exists(JobState),
    /// The same key was used with another request.
    Mismatch,
    /// `max_queue` unfinished jobs already.
    Full,
}

/// A callback's delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallbackState {
    Pending,
    Delivered,
    Failed,
}

spelled!(CallbackState { "pending" => Pending, "delivered" => Delivered, "failed" => Failed });

impl CallbackState {
    pub fn parse(s: &str) -> Option<CallbackState> {
        <CallbackState as Spelled>::parse(s)
    }
}

/// What became of a job's callback.
#[derive(Debug, Clone, PartialEq)]
pub struct CallbackView {
    pub state: CallbackState,
    /// POSTs made.
    pub attempts: u32,
    /// The receiver's last status (none when it could not be reached).
    pub last_status: Option<u16>,
}

/// A job as `GET /jobs/{id}` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobView {
    pub(crate) id: JobId,
    pub state: JobState,
    pub route: String,
    /// Whose job it is ([`NewJob::access`]); `None` when the stored hash cannot be read.
    pub access: Option<CredentialHash>,
    pub(crate) created_ms: u64,
    pub(crate) started_ms: Option<u64>,
    pub(crate) finished_ms: Option<u64>,
    /// Worker runs (more than 1 when a job was reclaimed from a worker that died).
    pub runs: u32,
    /// Upstream attempts of the run that finished it.
    pub attempts: u32,
    /// The final HTTP status.
    pub http_status: Option<u16>,
    /// Why it failed, when it did.
    pub error: Option<String>,
    pub callback: Option<CallbackView>,
    /// The token usage of the finishing run's attempts (those that reported any).
    pub usage: Vec<crate::wire::usage::AttemptUsage>,
}

impl JobView {
    /// The status document.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let at = |ms: Option<u64>| ms.map(rfc3339);
        let mut v = serde_json::json!({
            "job_id": self.id.as_str(),
            "status": self.state.as_str(),
            "route": self.route,
            "attempts": self.attempts,
            "runs": self.runs,
            "created_at": rfc3339(self.created_ms),
            "started_at": at(self.started_ms),
            "finished_at": at(self.finished_ms),
            "http_status": self.http_status,
            "error": self.error,
        });
        if self.state.finished() {
            v["result_url"] = format!("/jobs/{}/result", self.id).into();
        }
        if !self.usage.is_empty() {
            v["usage"] = serde_json::to_value(&self.usage).unwrap_or_default();
        }
        if let Some(cb) = &self.callback {
            v["callback"] = serde_json::json!({
                "state": cb.state.as_str(),
                "attempts": cb.attempts,
                "last_status": cb.last_status,
            });
        }
        v
    }
}

/// The upstream's response, as it came (an allowlist of headers).
#[derive(Debug, Clone, PartialEq)]
pub struct JobResult {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

/// A run's outcome, as the owner records it.
#[derive(Debug, Clone)]
pub(crate) struct Finished {
    pub state: JobState,
    pub(crate) finished_ms: u64,
    pub attempts: u32,
    /// The final HTTP status (none when no request could be made).
    pub http_status: Option<u16>,
    /// The response, when there was one to keep.
    pub result: Option<JobResult>,
    pub error: Option<String>,
    /// Each attempt's token usage (those that reported any).
    pub usage: Vec<crate::wire::usage::AttemptUsage>,
}

/// Unix milliseconds as RFC 3339 UTC (`2025-01-31T12:00:00.123Z`).
pub fn rfc3339(ms: u64) -> String {
    crate::time::rfc3339(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_utc_with_millis() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }

    #[test]
    fn states_round_trip() {
        for s in [
            JobState::Queued,
            JobState::Running,
            JobState::Succeeded,
            JobState::Failed,
        ] {
            assert_eq!(JobState::parse(s.as_str()), Some(s));
        }
        assert_eq!(JobState::parse("done"), None);
        for s in [CallbackState::Pending, CallbackState::Delivered, CallbackState::Failed] {
            assert_eq!(CallbackState::parse(s.as_str()), Some(s));
        }
    }
}
