//! Errors rebound itself answers with, and their single mapping to status, code, message and
//! `x-should-retry`. The body is both an RFC 9457 problem and the `{"error": {...}}` shape the
//! OpenAI and Anthropic SDKs parse.

use http::{HeaderValue, Response, StatusCode};

use crate::wire::body::{Delivered, ProxyBody, RequestLog};
use crate::wire::headers;

/// A failure rebound answers for itself (an upstream's own response is passed through instead).
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("no route matches {path:?}; configured prefixes: {prefixes}")]
    NoRoute { path: String, prefixes: String },
    #[error("the request body is larger than max_request_body ({limit} bytes)")]
    BodyTooLarge { limit: u64 },
    #[error("the request body could not be read: {0}")]
    BadRequestBody(String),
    #[error("absolute-form request targets are refused: rebound is a reverse proxy, not an open proxy; send the path only, e.g. POST /openai/v1/chat/completions")]
    AbsoluteForm,
    #[error("CONNECT is refused: rebound is a reverse proxy, not an open proxy")]
    Connect,
    #[error("upstream {upstream} could not be reached: {detail}")]
    UpstreamUnreachable { upstream: String, detail: String },
    #[error("upstream {upstream} did not answer within {timeout_ms} ms")]
    Timeout { upstream: String, timeout_ms: u128 },
    #[error("this route requires an idempotency key: send the {header} header")]
    IdempotencyKeyRequired { header: String },
    #[error("invalid idempotency key: {detail}; use 1 to 255 visible ASCII characters, e.g. a UUID")]
    InvalidIdempotencyKey { detail: String },
    #[error("a request with this idempotency key is still in progress; retry after the retry-after delay to get its response")]
    IdempotencyInProgress { retry_after: std::time::Duration },
    #[error("this idempotency key was already used for a request with a different method, path or body; use a new key for a new request")]
    IdempotencyKeyReused,
    #[error("the request with this idempotency key completed, but its response was too large to keep (max_stored_body); it will not run again")]
    IdempotencyResponseNotKept,
    #[error("upstream {upstream}'s circuit is open (it has been failing) and no fallback is available; retry after the retry-after delay")]
    CircuitOpen {
        upstream: String,
        retry_after: std::time::Duration,
    },
    #[error("upstream {upstream} asked this credential to wait (rate limited); retry after the retry-after delay")]
    Cooldown {
        upstream: String,
        retry_after: std::time::Duration,
    },
    #[error("the idempotency store (Redis) cannot be reached, and this route fails closed; nothing was sent upstream")]
    StoreUnavailable,
    #[error("the async job queue is full ({max_queue} unfinished jobs, [jobs] max_queue); nothing was queued: retry later, or send the request without Prefer: respond-async")]
    QueueFull { max_queue: u32 },
    #[error("the job store (Redis) cannot be reached; nothing was queued")]
    JobsUnavailable,
    #[error(
        "no job with this id: it may have expired ([jobs] result_ttl), or it was submitted with another credential"
    )]
    JobNotFound,
    #[error("the job is {state}: poll GET /jobs/{{id}} until it is succeeded or failed, then fetch its result")]
    JobNotFinished { state: &'static str },
    #[error("the job finished without a response to return: {detail}")]
    JobResultUnavailable { detail: String },
    #[error("the job API answers GET and HEAD only")]
    JobMethodNotAllowed,
    #[error("x-rebound-callback must be one URL starting with one of [jobs] callback_allowed_prefixes ({allowed}); nothing was queued")]
    CallbackNotAllowed { allowed: String },
}

impl ProxyError {
    /// The HTTP status rebound answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NoRoute { .. } => StatusCode::NOT_FOUND,
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::BadRequestBody(_) | ProxyError::AbsoluteForm => StatusCode::BAD_REQUEST,
            ProxyError::Connect => StatusCode::METHOD_NOT_ALLOWED,
            ProxyError::UpstreamUnreachable { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::IdempotencyKeyRequired { .. } | ProxyError::InvalidIdempotencyKey { .. } => {
                StatusCode::BAD_REQUEST
            }
            ProxyError::IdempotencyInProgress { .. } | ProxyError::IdempotencyResponseNotKept => StatusCode::CONFLICT,
            ProxyError::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            ProxyError::StoreUnavailable | ProxyError::CircuitOpen { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::Cooldown { .. } => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::QueueFull { .. } | ProxyError::JobsUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::JobNotFound | ProxyError::JobNotFinished { .. } | ProxyError::JobResultUnavailable { .. } => {
                StatusCode::NOT_FOUND
            }
            ProxyError::JobMethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ProxyError::CallbackNotAllowed { .. } => StatusCode::BAD_REQUEST,
        }
    }

    /// The stable machine-readable code (`x-rebound-error`, `error.code`).
    pub fn code(&self) -> &'static str {
        match self {
            ProxyError::NoRoute { .. } => "no_route",
            ProxyError::BodyTooLarge { .. } => "body_too_large",
            ProxyError::BadRequestBody(_) => "bad_request_body",
            ProxyError::AbsoluteForm | ProxyError::Connect => "forward_proxy_refused",
            ProxyError::UpstreamUnreachable { .. } => "upstream_unreachable",
            ProxyError::Timeout { .. } => "deadline_exceeded",
            ProxyError::IdempotencyKeyRequired { .. } => "idempotency_key_required",
            ProxyError::InvalidIdempotencyKey { .. } => "invalid_idempotency_key",
            ProxyError::IdempotencyInProgress { .. } => "idempotency_in_progress",
            ProxyError::IdempotencyKeyReused => "idempotency_key_reused",
            ProxyError::IdempotencyResponseNotKept => "idempotency_response_not_kept",
            ProxyError::StoreUnavailable => "store_unavailable",
            ProxyError::CircuitOpen { .. } => "circuit_open",
            ProxyError::Cooldown { .. } => "cooldown",
            ProxyError::QueueFull { .. } => "queue_full",
            ProxyError::JobsUnavailable => "jobs_unavailable",
            ProxyError::JobNotFound => "job_not_found",
            ProxyError::JobNotFinished { .. } => "job_not_finished",
            ProxyError::JobResultUnavailable { .. } => "job_result_unavailable",
            ProxyError::JobMethodNotAllowed => "method_not_allowed",
            ProxyError::CallbackNotAllowed { .. } => "callback_not_allowed",
        }
    }

    /// A short title for the problem document.
    fn title(&self) -> &'static str {
        match self {
            ProxyError::NoRoute { .. } => "No route",
            ProxyError::BodyTooLarge { .. } => "Request body too large",
            ProxyError::BadRequestBody(_) => "Unreadable request body",
            ProxyError::AbsoluteForm | ProxyError::Connect => "Not a forward proxy",
            ProxyError::UpstreamUnreachable { .. } => "Upstream unreachable",
            ProxyError::Timeout { .. } => "Deadline exceeded",
            ProxyError::IdempotencyKeyRequired { .. } => "Idempotency key required",
            ProxyError::InvalidIdempotencyKey { .. } => "Invalid idempotency key",
            ProxyError::IdempotencyInProgress { .. } => "Request in progress",
            ProxyError::IdempotencyKeyReused => "Idempotency key reused",
            ProxyError::IdempotencyResponseNotKept => "Response not kept",
            ProxyError::StoreUnavailable => "Idempotency store unavailable",
            ProxyError::CircuitOpen { .. } => "Circuit open",
            ProxyError::Cooldown { .. } => "Rate-limit cooldown",
            ProxyError::QueueFull { .. } => "Job queue full",
            ProxyError::JobsUnavailable => "Job store unavailable",
            ProxyError::JobNotFound => "No such job",
            ProxyError::JobNotFinished { .. } => "Job not finished",
            ProxyError::JobResultUnavailable { .. } => "No job result",
            ProxyError::JobMethodNotAllowed => "Method not allowed",
            ProxyError::CallbackNotAllowed { .. } => "Callback not allowed",
        }
    }

    /// Whether the client may usefully retry. Only an in-progress idempotent request (the same
    /// key then gets the replay) and an unfinished job's result are worth coming back for;
    /// everything else is final: rebound already spent its own retries, or the request cannot
    /// succeed as sent.
    pub fn should_retry(&self) -> bool {
        matches!(
            self,
            ProxyError::IdempotencyInProgress { .. } | ProxyError::JobNotFinished { .. }
        )
    }

    /// When to come back (`retry-after`), where that is known.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            ProxyError::IdempotencyInProgress { retry_after } => Some(*retry_after),
            ProxyError::StoreUnavailable | ProxyError::JobsUnavailable | ProxyError::JobNotFinished { .. } => {
                Some(std::time::Duration::from_secs(1))
            }
            ProxyError::QueueFull { .. } => Some(std::time::Duration::from_secs(5)),
            ProxyError::CircuitOpen { retry_after, .. } | ProxyError::Cooldown { retry_after, .. } => {
                Some(*retry_after)
            }
            _ => None,
        }
    }

    /// The JSON body: RFC 9457 fields plus the SDK-readable `error` object.
    pub fn body(&self) -> String {
        let message = self.to_string();
        serde_json::json!({
            "type": format!("https://rebound.dev/errors/{}", self.code()),
            "title": self.title(),
            "status": self.status().as_u16(),
            "detail": message,
            "error": {
                "type": "rebound_error",
                "code": self.code(),
                "message": message,
                // Where the Anthropic SDKs look for a machine-readable code.
                "details": { "error_code": self.code() },
            }
        })
        .to_string()
    }
}

/// Rebound's own error: JSON body, `x-rebound-error`, `x-should-retry`.
pub fn error_response(err: ProxyError, log: RequestLog) -> Response<ProxyBody> {
    let status = err.status();
    let mut resp = Response::new(ProxyBody::full(err.body(), log, status.as_u16()));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(headers::X_REBOUND_ERROR, HeaderValue::from_static(err.code()));
    h.insert(
        headers::X_SHOULD_RETRY,
        HeaderValue::from_static(if err.should_retry() { "true" } else { "false" }),
    );
    if let Some(after) = err.retry_after() {
        h.insert(http::header::RETRY_AFTER, HeaderValue::from(after.as_secs().max(1)));
    }
    resp.extensions_mut().insert(Delivered {
        attempts: 0,
        error: Some(err.code()),
    });
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_both_shapes() {
        let e = ProxyError::NoRoute {
            path: "/x".into(),
            prefixes: "/openai/".into(),
        };
        let v: serde_json::Value = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(v["status"], 404);
        assert_eq!(v["error"]["code"], "no_route");
        assert_eq!(v["error"]["type"], "rebound_error");
        assert_eq!(v["type"], "https://rebound.dev/errors/no_route");
        assert!(v["detail"].as_str().unwrap().contains("/openai/"));
    }
}
