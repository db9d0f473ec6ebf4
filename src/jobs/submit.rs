//! Submission: a request with `Prefer: respond-async` on an async route becomes a queued job,
//! answered at once with 202 and where to poll.

use bytes::Bytes;
use http::{header, HeaderValue, Method, Response, StatusCode};

use super::record::{JobState, NewJob, StoredRequest, Submitted};
use super::{callback, hygiene, json_response, Backend, JobId, Jobs, JobsError};
use crate::credentials;
use crate::error::{error_response, ProxyError};
use crate::idempotency::fingerprint::{self, Version};
use crate::idempotency::{Idempotency, ReplayIdentity};
use crate::wire::body::{ProxyBody, RequestLog};
use crate::wire::headers;

/// A job's identity: its id, and with an idempotency key the fingerprint and identity every run
/// claims (hashes only).
struct Identity {
    id: JobId,
    fingerprint: String,
    replay: Option<ReplayIdentity>,
}

/// A submitted request as a job is made of it: the route it came on, that route's idempotency,
/// and the request's head (the body travels apart: it is moved into the job).
#[derive(Clone, Copy)]
struct Submission<'a> {
    /// The route's name.
    route: &'a str,
    idempotency: Option<&'a Idempotency>,
    parts: &'a http::request::Parts,
}

impl Jobs {
    /// Queues a request (`Prefer: respond-async` on an async route): 202 with `Location`, or
    /// rebound's error (400 callback or key, 422 key reused, 503 queue full or store down).
    pub async fn submit(
        &self,
        route: &str,
        idempotency: Option<&Idempotency>,
        parts: &http::request::Parts,
        body: Bytes,
        log: RequestLog,
    ) -> Response<ProxyBody> {
        let callback = match self.callback_of(parts) {
            Ok(c) => c,
            Err(e) => return error_response(e, log),
        };
        let version = idempotency.map_or(Version::V2, Idempotency::fingerprint_version);
        let submission = Submission {
            route,
            idempotency,
            parts,
        };
        let identity = match identity_of(submission, &body, version) {
            Ok(i) => i,
            Err(e) => return error_response(e, log),
        };
        let id = identity.id.clone();
        let keyed = identity.replay.is_some();
        let job = self.new_job(submission, body.clone(), identity, callback.clone());
        let mut submitted = self.enqueue(job).await;
        if keyed && matches!(submitted, Ok(Submitted::Mismatch)) && matches!(self.inner.backend, Backend::Redis(_)) {
            // A job submitted before an upgrade, or by a replica on the other side of `[redis]
            // fingerprint`, holds the request's fingerprint of the other version.
            if let Ok(identity) = identity_of(submission, &body, version.other()) {
                submitted = self.enqueue(self.new_job(submission, body, identity, callback)).await;
            }
        }
        self.answer_submission(route, &id, submitted, log)
    }

    /// The `x-rebound-callback` URL: none, or one under `callback_allowed_prefixes`.
    fn callback_of(&self, parts: &http::request::Parts) -> Result<Option<String>, ProxyError> {
        let allowed = &self.inner.config.callback_allowed_prefixes;
        match parts
            .headers
            .get_all(headers::X_REBOUND_CALLBACK)
            .iter()
            .collect::<Vec<_>>()
            .as_slice()
        {
            [] => Ok(None),
            [url] => match url.to_str() {
                Ok(url) if callback::allowed(url, allowed) => Ok(Some(url.to_string())),
                _ => Err(self.callback_refused()),
            },
            _ => Err(self.callback_refused()),
        }
    }

    /// The job as it is stored: credentials and the raw idempotency key apart (sealed in Redis),
    /// the rest of the request as sent.
    fn new_job(&self, submission: Submission<'_>, body: Bytes, identity: Identity, callback: Option<String>) -> NewJob {
        let Submission {
            route,
            idempotency,
            parts,
        } = submission;
        let key_header = idempotency.map(|i| &i.policy.header);
        let mut kept = parts.headers.clone();
        hygiene::strip_hop_by_hop(&mut kept, false);
        let (mut headers, mut credentials) = (Vec::new(), Vec::new());
        for (name, value) in &kept {
            if *name == headers::X_REBOUND_CALLBACK || matches!(name.as_str(), "host" | "content-length") {
                continue;
            }
            let Ok(value) = value.to_str() else { continue };
            let pair = (name.as_str().to_string(), value.to_string());
            if self.inner.secret_headers.contains(name) || key_header == Some(name) {
                credentials.push(pair);
            } else {
                headers.push(pair);
            }
        }
        // Credential query parameters are sealed with the headers (as `?name`), the rest of the
        // target kept as sent.
        let path = parts.uri.path();
        let uri = match parts.uri.query().map(credentials::split_query) {
            None => path.to_string(),
            Some((kept, secret)) => {
                for pair in secret {
                    let (name, value) = pair.split_once('=').unwrap_or((&pair, ""));
                    credentials.push((format!("?{name}"), value.to_string()));
                }
                kept.map_or_else(|| path.to_string(), |q| format!("{path}?{q}"))
            }
        };
        NewJob {
            id: identity.id,
            route: route.to_string(),
            fingerprint: identity.fingerprint,
            access: self.access_of(&parts.headers, parts.uri.query()),
            created_ms: crate::time::now_unix_ms(),
            request: StoredRequest {
                method: parts.method.to_string(),
                uri,
                headers,
                identity: identity.replay,
            },
            body,
            credentials,
            callback,
        }
    }

    /// Queues `job` (the queue depth gauge follows).
    async fn enqueue(&self, job: NewJob) -> Result<Submitted, JobsError> {
        let config = &self.inner.config;
        match &self.inner.backend {
            Backend::Memory(q) => {
                let (outcome, depth) = q.submit(job, config.max_queue as usize);
                self.set_depth(depth as u64);
                Ok(outcome)
            }
            Backend::Redis(q) => {
                let (outcome, depth) = q
                    .submit(&job, self.inner.sealer.as_ref(), config.max_queue, config.result_ttl)
                    .await?;
                if let Some(d) = depth {
                    self.set_depth(d);
                }
                Ok(outcome)
            }
        }
    }

    fn answer_submission(
        &self,
        route: &str,
        id: &JobId,
        submitted: Result<Submitted, JobsError>,
        log: RequestLog,
    ) -> Response<ProxyBody> {
        let max_queue = self.inner.config.max_queue;
        match submitted {
            Ok(Submitted::Queued) => {
                self.count(route, "queued");
                tracing::debug!(route = %route, job = %id, "job queued");
                accepted(id, JobState::Queued, false, log)
            }
            Ok(Submitted::Exists(state)) => {
                self.count(route, "deduplicated");
                accepted(id, state, true, log)
            }
            Ok(Submitted::Mismatch) => error_response(ProxyError::IdempotencyKeyReused, log),
            Ok(Submitted::Full) => {
                self.count(route, "rejected");
                tracing::warn!(route = %route, max_queue, "job queue full; submission refused");
                error_response(ProxyError::QueueFull { max_queue }, log)
            }
            Err(e) => {
                self.count(route, "rejected");
                tracing::warn!(route = %route, error = %e, "job store unavailable; submission refused");
                error_response(ProxyError::JobsUnavailable, log)
            }
        }
    }

    fn callback_refused(&self) -> ProxyError {
        let prefixes = &self.inner.config.callback_allowed_prefixes;
        ProxyError::CallbackNotAllowed {
            allowed: if prefixes.is_empty() {
                "none are configured".to_string()
            } else {
                prefixes.join(", ")
            },
        }
    }
}

/// Same key, same tenant: same job id. Without a key (or on a method idempotency does not
/// cover), a random id.
fn identity_of(submission: Submission<'_>, body: &Bytes, version: Version) -> Result<Identity, ProxyError> {
    let Submission {
        route,
        idempotency,
        parts,
    } = submission;
    let random = || Identity {
        id: JobId::random(),
        fingerprint: String::new(),
        replay: None,
    };
    let Some(idem) = idempotency.filter(|_| matches!(parts.method, Method::POST | Method::PATCH)) else {
        return Ok(random());
    };
    let key = match fingerprint::request_key(&parts.headers, &idem.policy.header) {
        None if idem.policy.require_key => {
            let header = idem.policy.header.to_string();
            return Err(ProxyError::IdempotencyKeyRequired { header });
        }
        None => return Ok(random()),
        Some(Err(e)) => return Err(ProxyError::InvalidIdempotencyKey { detail: e.to_string() }),
        Some(Ok(key)) => key,
    };
    let replay = idem.identity_of(version, parts, body);
    Ok(Identity {
        id: JobId::keyed(route, &replay.scope, &key),
        fingerprint: replay.fingerprint.as_str().to_owned(),
        replay: Some(replay),
    })
}

/// 202 Accepted: where to poll, and the job's state.
fn accepted(id: &JobId, state: JobState, existing: bool, log: RequestLog) -> Response<ProxyBody> {
    let body =
        serde_json::to_vec(&serde_json::json!({ "job_id": id.as_str(), "status": state.as_str() })).unwrap_or_default();
    let mut resp = json_response(StatusCode::ACCEPTED, body, log);
    let h = resp.headers_mut();
    if let Ok(location) = HeaderValue::from_str(&format!("/jobs/{id}")) {
        h.insert(header::LOCATION, location);
    }
    if let Ok(v) = HeaderValue::from_str(id.as_str()) {
        h.insert(headers::X_REBOUND_JOB_ID, v);
    }
    h.insert(headers::PREFERENCE_APPLIED, HeaderValue::from_static("respond-async"));
    if existing {
        h.insert(headers::IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    resp
}
