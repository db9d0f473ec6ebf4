//! Errors rebound itself answers with, and their one table ([`ErrorKind::row`]: status, code,
//! title, `x-should-retry`), used by the data plane, the job API and the admin API. The body is
//! both an RFC 9457 problem and the `{"error": {...}}` shape the OpenAI and Anthropic SDKs parse.

use crate::words;
use http::{HeaderValue, Response, StatusCode};

use crate::wire::api::{anthropic, gemini};
use crate::wire::body::{Delivered, ErrorShape, ProxyBody, RequestLog};
use crate::wire::headers;

/// The path a request asked for, for `no_route`: at most [`ASKED_PATH_MAX`] bytes of it.
pub(crate) fn asked_path(path: &str) -> String {
    match path.char_indices().nth(ASKED_PATH_MAX) {
        Some((end, _)) => format!("{}...", &path[..end]),
        None => path.to_string(),
    }
}

/// The longest path `no_route` repeats, in characters.
const ASKED_PATH_MAX: usize = 200;

/// A failure rebound answers for itself (an upstream's own response is passed through instead).
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The routes are not listed: the message reaches any caller, pasted whole into its client's
    /// exception text (`rebound check` lists them).
    #[error("no route matches {path:?}: a path must start with one of this sidecar's route prefixes (its operator's `rebound check` lists them)")]
    NoRoute { path: String },
    #[error("the request body is larger than max_request_body ({limit} bytes)")]
    BodyTooLarge { limit: u64 },
    #[error("the request line and headers ({size} bytes) are larger than max_request_head ({limit} bytes); nothing was forwarded")]
    RequestHeadTooLarge { size: u64, limit: u64 },
    #[error("the request body could not be read: {0}")]
    BadRequestBody(String),
    #[error("the request target cannot be forwarded: {0}")]
    InvalidRequestTarget(String),
    #[error("the model {detail}; nothing was sent upstream")]
    InvalidModel { detail: String },
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
    #[error("upstream {upstream} has as many requests in flight as its concurrency limit allows, and none ended within the wait this request had; nothing was sent upstream; retry after the retry-after delay")]
    ConcurrencyLimited {
        upstream: String,
        retry_after: std::time::Duration,
    },
    #[error("over the route's limit {limit} (its [limits.{limit}] table); retry after the retry-after delay")]
    LimitExceeded {
        limit: String,
        retry_after: std::time::Duration,
    },
    #[error("no credential for upstream {upstream} can be had from its cloud ({auth}): see rebound_credential_refreshes_total and the log; nothing was sent upstream")]
    CredentialUnavailable { upstream: String, auth: &'static str },
    #[error(
        "no target of this route can take the request now ({}); retry after the retry-after delay, if any",
        describe_targets(targets)
    )]
    NoTargetAvailable {
        /// The soonest a target recovers; `None` when every one is exhausted (no time to give).
        retry_after: Option<std::time::Duration>,
        /// Each target and why it could not take the request (`circuit_open`, `cooldown`, ..).
        targets: Vec<(String, &'static str)>,
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

/// Declares [`ErrorKind`] and [`ErrorKind::ALL`] from one list, so that neither can miss a kind.
macro_rules! error_kinds {
    ($($kind:ident),* $(,)?) => {
        /// Every kind of answer rebound gives for itself, data plane, job API and admin API alike.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum ErrorKind {
            $($kind),*
        }

        /// `concurrency_limited`, by a name short enough for its row of [`ErrorKind::row`] to fit a line.
const CONCURRENCY: &str = words::CONCURRENCY_LIMITED;

impl ErrorKind {
            /// Every kind, in declaration order.
            pub const ALL: &[ErrorKind] = &[$(ErrorKind::$kind),*];
        }
    };
}

error_kinds! {
    NoRoute,
    BodyTooLarge,
    RequestHeadTooLarge,
    BadRequestBody,
    InvalidRequestTarget,
    InvalidModel,
    AbsoluteForm,
    Connect,
    UpstreamUnreachable,
    DeadlineExceeded,
    IdempotencyKeyRequired,
    InvalidIdempotencyKey,
    IdempotencyInProgress,
    IdempotencyKeyReused,
    IdempotencyResponseNotKept,
    StoreUnavailable,
    CircuitOpen,
    Cooldown,
    ConcurrencyLimited,
    LimitExceeded,
    CredentialUnavailable,
    NoTargetAvailable,
    QueueFull,
    JobsUnavailable,
    JobNotFound,
    JobNotFinished,
    JobResultUnavailable,
    JobMethodNotAllowed,
    CallbackNotAllowed,
    AdminDisabled,
    AdminUnauthorized,
    AdminNotFound,
    DeadLetterStoreUnavailable,
}

/// One row of the error table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorRow {
    /// The HTTP status.
    pub status: StatusCode,
    /// The stable machine-readable code (`x-rebound-error`, `error.code`).
    pub code: &'static str,
    /// A short title for the problem document.
    pub(crate) title: &'static str,
    /// Whether the client may usefully retry (`x-should-retry`). Only an in-progress idempotent
    /// request (the same key then gets the replay) and an unfinished job's result are worth coming
    /// back for; everything else is final: rebound already spent its own retries, or the request
    /// cannot succeed as sent.
    pub retryable: bool,
}

impl ErrorKind {
    /// The error table: status, code, title, retryable.
    pub const fn row(self) -> ErrorRow {
        use ErrorKind as K;
        use StatusCode as S;
        let (status, code, title, retryable) = match self {
            K::NoRoute => (S::NOT_FOUND, "no_route", "No route", false),
            K::BodyTooLarge => (S::PAYLOAD_TOO_LARGE, "body_too_large", "Request body too large", false),
            K::RequestHeadTooLarge => (
                S::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "request_head_too_large",
                "Request head too large",
                false,
            ),
            K::BadRequestBody => (S::BAD_REQUEST, "bad_request_body", "Unreadable request body", false),
            K::InvalidRequestTarget => (
                S::BAD_REQUEST,
                "invalid_request_target",
                "Invalid request target",
                false,
            ),
            K::InvalidModel => (S::BAD_REQUEST, "invalid_model", "Invalid model", false),
            K::AbsoluteForm => (S::BAD_REQUEST, "forward_proxy_refused", "Not a forward proxy", false),
            K::Connect => (
                S::METHOD_NOT_ALLOWED,
                "forward_proxy_refused",
                "Not a forward proxy",
                false,
            ),
            K::UpstreamUnreachable => (S::BAD_GATEWAY, "upstream_unreachable", "Upstream unreachable", false),
            K::DeadlineExceeded => (S::GATEWAY_TIMEOUT, "deadline_exceeded", "Deadline exceeded", false),
            K::IdempotencyKeyRequired => (
                S::BAD_REQUEST,
                "idempotency_key_required",
                "Idempotency key required",
                false,
            ),
            K::InvalidIdempotencyKey => (
                S::BAD_REQUEST,
                "invalid_idempotency_key",
                "Invalid idempotency key",
                false,
            ),
            K::IdempotencyInProgress => (S::CONFLICT, "idempotency_in_progress", "Request in progress", true),
            K::IdempotencyKeyReused => (
                S::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "Idempotency key reused",
                false,
            ),
            K::IdempotencyResponseNotKept => (S::CONFLICT, "idempotency_response_not_kept", "Response not kept", false),
            K::StoreUnavailable => (
                S::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "Idempotency store unavailable",
                false,
            ),
            K::CircuitOpen => (S::SERVICE_UNAVAILABLE, words::CIRCUIT_OPEN, "Circuit open", false),
            K::Cooldown => (S::TOO_MANY_REQUESTS, words::COOLDOWN, "Rate-limit cooldown", false),
            K::ConcurrencyLimited => (S::TOO_MANY_REQUESTS, CONCURRENCY, "Concurrency limit", false),
            K::LimitExceeded => (S::TOO_MANY_REQUESTS, "limit_exceeded", "Limit exceeded", false),
            K::CredentialUnavailable => (
                S::SERVICE_UNAVAILABLE,
                words::CREDENTIAL_UNAVAILABLE,
                "Cloud credential unavailable",
                false,
            ),
            K::NoTargetAvailable => (
                S::SERVICE_UNAVAILABLE,
                "no_target_available",
                "No target available",
                false,
            ),
            K::QueueFull => (S::SERVICE_UNAVAILABLE, "queue_full", "Job queue full", false),
            K::JobsUnavailable => (
                S::SERVICE_UNAVAILABLE,
                "jobs_unavailable",
                "Job store unavailable",
                false,
            ),
            K::JobNotFound => (S::NOT_FOUND, "job_not_found", "No such job", false),
            K::JobNotFinished => (S::NOT_FOUND, "job_not_finished", "Job not finished", true),
            K::JobResultUnavailable => (S::NOT_FOUND, "job_result_unavailable", "No job result", false),
            K::JobMethodNotAllowed => (S::METHOD_NOT_ALLOWED, "method_not_allowed", "Method not allowed", false),
            K::CallbackNotAllowed => (S::BAD_REQUEST, "callback_not_allowed", "Callback not allowed", false),
            K::AdminDisabled => (S::NOT_FOUND, "admin_disabled", "Admin API disabled", false),
            K::AdminUnauthorized => (S::UNAUTHORIZED, "unauthorized", "Unauthorized", false),
            K::AdminNotFound => (S::NOT_FOUND, "not_found", "Not found", false),
            K::DeadLetterStoreUnavailable => (
                S::SERVICE_UNAVAILABLE,
                "store_unavailable",
                "Dead-letter store unavailable",
                false,
            ),
        };
        ErrorRow {
            status,
            code,
            title,
            retryable,
        }
    }
}

/// The JSON body of every error rebound answers for itself: RFC 9457 fields plus the
/// `{"error": {...}}` object the OpenAI and Anthropic SDKs read.
pub(crate) fn problem_body(kind: ErrorKind, message: &str) -> String {
    problem_document(kind, message).to_string()
}

/// [`problem_body`] as a JSON value, for an error that adds members of its own.
fn problem_document(kind: ErrorKind, message: &str) -> serde_json::Value {
    let row = kind.row();
    serde_json::json!({
        "type": format!("https://rebound.dev/errors/{}", row.code),
        "title": row.title,
        "status": row.status.as_u16(),
        "detail": message,
        "error": {
            "type": "rebound_error",
            "code": row.code,
            "message": message,
            // Where the Anthropic SDKs look for a machine-readable code.
            "details": { "error_code": row.code },
        }
    })
}

impl ProxyError {
    /// Its row in the error table.
    pub fn kind(&self) -> ErrorKind {
        use ErrorKind as K;
        match self {
            ProxyError::NoRoute { .. } => K::NoRoute,
            ProxyError::BodyTooLarge { .. } => K::BodyTooLarge,
            ProxyError::RequestHeadTooLarge { .. } => K::RequestHeadTooLarge,
            ProxyError::BadRequestBody(_) => K::BadRequestBody,
            ProxyError::InvalidRequestTarget(_) => K::InvalidRequestTarget,
            ProxyError::InvalidModel { .. } => K::InvalidModel,
            ProxyError::AbsoluteForm => K::AbsoluteForm,
            ProxyError::Connect => K::Connect,
            ProxyError::UpstreamUnreachable { .. } => K::UpstreamUnreachable,
            ProxyError::Timeout { .. } => K::DeadlineExceeded,
            ProxyError::IdempotencyKeyRequired { .. } => K::IdempotencyKeyRequired,
            ProxyError::InvalidIdempotencyKey { .. } => K::InvalidIdempotencyKey,
            ProxyError::IdempotencyInProgress { .. } => K::IdempotencyInProgress,
            ProxyError::IdempotencyKeyReused => K::IdempotencyKeyReused,
            ProxyError::IdempotencyResponseNotKept => K::IdempotencyResponseNotKept,
            ProxyError::StoreUnavailable => K::StoreUnavailable,
            ProxyError::CircuitOpen { .. } => K::CircuitOpen,
            ProxyError::Cooldown { .. } => K::Cooldown,
            ProxyError::ConcurrencyLimited { .. } => K::ConcurrencyLimited,
            ProxyError::LimitExceeded { .. } => K::LimitExceeded,
            ProxyError::CredentialUnavailable { .. } => K::CredentialUnavailable,
            ProxyError::NoTargetAvailable { .. } => K::NoTargetAvailable,
            ProxyError::QueueFull { .. } => K::QueueFull,
            ProxyError::JobsUnavailable => K::JobsUnavailable,
            ProxyError::JobNotFound => K::JobNotFound,
            ProxyError::JobNotFinished { .. } => K::JobNotFinished,
            ProxyError::JobResultUnavailable { .. } => K::JobResultUnavailable,
            ProxyError::JobMethodNotAllowed => K::JobMethodNotAllowed,
            ProxyError::CallbackNotAllowed { .. } => K::CallbackNotAllowed,
        }
    }

    /// The HTTP status rebound answers with.
    pub fn status(&self) -> StatusCode {
        self.kind().row().status
    }

    /// The stable machine-readable code (`x-rebound-error`, `error.code`).
    pub fn code(&self) -> &'static str {
        self.kind().row().code
    }

    /// When to come back (`retry-after`), where that is known.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            ProxyError::IdempotencyInProgress { retry_after } => Some(*retry_after),
            ProxyError::StoreUnavailable | ProxyError::JobsUnavailable | ProxyError::JobNotFinished { .. } => {
                Some(std::time::Duration::from_secs(1))
            }
            ProxyError::QueueFull { .. } => Some(std::time::Duration::from_secs(5)),
            ProxyError::CircuitOpen { retry_after, .. }
            | ProxyError::Cooldown { retry_after, .. }
            | ProxyError::ConcurrencyLimited { retry_after, .. }
            | ProxyError::LimitExceeded { retry_after, .. } => Some(*retry_after),
            ProxyError::NoTargetAvailable { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The JSON body (see [`problem_body`]), with the members an error adds to the problem
    /// details (RFC 9457 section 3.2 extensions): `targets: [{upstream, outcome}]` for
    /// `no_target_available`.
    pub fn body(&self) -> String {
        self.body_in(ErrorShape::OpenAi)
    }

    /// The JSON body in `shape` ([`in_shape`]), with the error's own extension members.
    pub(crate) fn body_in(&self, shape: ErrorShape) -> String {
        let mut doc = in_shape(shape, self.kind(), &self.to_string());
        if let (ProxyError::NoTargetAvailable { targets, .. }, Some(members)) = (self, doc.as_object_mut()) {
            let list = targets
                .iter()
                .map(|(upstream, outcome)| serde_json::json!({ "upstream": upstream, "outcome": outcome }))
                .collect();
            members.insert("targets".into(), serde_json::Value::Array(list));
        }
        doc.to_string()
    }
}

/// rebound's error document in the shape of the route's API, RFC 9457's members beside where
/// they do not collide with it:
/// - OpenAI: `{"error": {"message", "type", "code", "param"}}` and every RFC 9457 member;
/// - Anthropic's and Google's shapes, each made in its family's file (`wire::api::anthropic`,
///   `wire::api::gemini`);
/// - RFC 9457 alone, when the request asked for `application/problem+json`.
///
/// rebound's code is in each: `error.code` (OpenAI, Anthropic), Anthropic's
/// `error.details.error_code`, Google's `ErrorInfo.reason`, and `x-rebound-error`.
fn in_shape(shape: ErrorShape, kind: ErrorKind, message: &str) -> serde_json::Value {
    let row = kind.row();
    let status = row.status.as_u16();
    match shape {
        ErrorShape::OpenAi => problem_document(kind, message),
        ErrorShape::Problem => serde_json::json!({
            "type": format!("https://rebound.dev/errors/{}", row.code),
            "title": row.title, "status": status, "detail": message,
        }),
        ErrorShape::Anthropic => anthropic::error_document(status, (row.code, row.title), message),
        ErrorShape::Gemini => gemini::error_document(status, (row.code, row.title), message),
    }
}

fn describe_targets(targets: &[(String, &'static str)]) -> String {
    targets
        .iter()
        .map(|(upstream, outcome)| format!("{upstream}: {outcome}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The one builder of every error rebound answers for itself (the proxy, the job API, the admin
/// API): its status, the JSON body of [`problem_body`] (made into `B` by `body`),
/// `content-type`, `x-rebound-error`, `x-should-retry`, and `retry-after` when it is known.
pub(crate) fn problem_response<B>(
    kind: ErrorKind,
    message: &str,
    retry_after: Option<std::time::Duration>,
    body: impl FnOnce(String) -> B,
) -> Response<B> {
    with_problem_headers(kind, body(problem_body(kind, message)), retry_after)
}

/// `body` (a problem document) as the response of `kind`, with rebound's headers.
fn with_problem_headers<B>(kind: ErrorKind, body: B, retry_after: Option<std::time::Duration>) -> Response<B> {
    let row = kind.row();
    let mut resp = Response::new(body);
    *resp.status_mut() = row.status;
    let h = resp.headers_mut();
    h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(headers::X_REBOUND_ERROR, HeaderValue::from_static(row.code));
    h.insert(
        headers::X_SHOULD_RETRY,
        HeaderValue::from_static(if row.retryable { "true" } else { "false" }),
    );
    if let Some(after) = retry_after {
        headers::insert_retry_after(h, after);
    }
    resp
}

/// Rebound's own error on the proxy listener ([`problem_response`]), its code in the request's
/// log and in the response's `Delivered` extension.
pub(crate) fn error_response(err: ProxyError, mut log: RequestLog) -> Response<ProxyBody> {
    let status = err.status().as_u16();
    log.set_error(err.code());
    let shape = log.error_shape();
    let body = ProxyBody::full(err.body_in(shape), log, status);
    let mut resp = with_problem_headers(err.kind(), body, err.retry_after());
    if shape == ErrorShape::Problem {
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
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
    fn no_route_repeats_at_most_200_characters_of_the_path() {
        assert_eq!(asked_path("/nope/v1"), "/nope/v1");
        let long = format!("/{}", "é".repeat(300));
        let asked = asked_path(&long);
        assert_eq!(asked.chars().count(), 203);
        assert!(asked.ends_with("é..."));
    }

    #[test]
    fn each_api_reads_rebounds_errors_in_its_own_dialect() {
        let e = ProxyError::UpstreamUnreachable {
            upstream: "a".into(),
            detail: "connection refused".into(),
        };
        let doc = |d| serde_json::from_str::<serde_json::Value>(&e.body_in(d)).unwrap();
        let anthropic = doc(ErrorShape::Anthropic);
        assert_eq!(anthropic["type"], "error");
        assert_eq!(anthropic["error"]["type"], "api_error");
        assert_eq!(anthropic["error"]["details"]["error_code"], "upstream_unreachable");
        assert_eq!(
            (anthropic["status"].as_u64(), anthropic["title"].is_string()),
            (Some(502), true)
        );
        let gemini = doc(ErrorShape::Gemini);
        assert_eq!(gemini["error"]["code"], 502);
        assert_eq!(gemini["error"]["status"], "UNAVAILABLE");
        assert_eq!(gemini["error"]["details"][0]["reason"], "upstream_unreachable");
        assert!(
            gemini.get("status").is_none(),
            "google-genai reads a top-level status as Google's"
        );
        assert_eq!(gemini["type"], "https://rebound.dev/errors/upstream_unreachable");
        let problem = doc(ErrorShape::Problem);
        assert_eq!(
            problem.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()),
            Some(vec!["detail".into(), "status".into(), "title".into(), "type".into()])
        );
        let openai = doc(ErrorShape::OpenAi);
        assert_eq!(
            (openai["error"]["code"].as_str(), openai["status"].as_u64()),
            (Some("upstream_unreachable"), Some(502))
        );
        for (status, anthropic, google) in [
            (404, "not_found_error", "NOT_FOUND"),
            (429, "rate_limit_error", "RESOURCE_EXHAUSTED"),
            (503, "overloaded_error", "UNAVAILABLE"),
            (504, "timeout_error", "DEADLINE_EXCEEDED"),
            (413, "request_too_large", "INVALID_ARGUMENT"),
        ] {
            let (a, g) = (
                anthropic::error_document(status, ("c", "t"), "m"),
                gemini::error_document(status, ("c", "t"), "m"),
            );
            assert_eq!(
                (a["error"]["type"].as_str(), g["error"]["status"].as_str()),
                (Some(anthropic), Some(google))
            );
        }
    }

    #[test]
    fn body_has_both_shapes() {
        let e = ProxyError::NoRoute { path: "/x".into() };
        let v: serde_json::Value = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(v["status"], 404);
        assert_eq!(v["error"]["code"], "no_route");
        assert_eq!(v["error"]["type"], "rebound_error");
        assert_eq!(v["type"], "https://rebound.dev/errors/no_route");
        assert!(v["detail"].as_str().unwrap().starts_with("no route matches \"/x\": "));
    }

    #[test]
    fn every_code_names_one_status_and_title() {
        use ErrorKind as K;
        let all = [
            K::NoRoute,
            K::BodyTooLarge,
            K::RequestHeadTooLarge,
            K::BadRequestBody,
            K::InvalidRequestTarget,
            K::AbsoluteForm,
            K::Connect,
            K::UpstreamUnreachable,
            K::DeadlineExceeded,
            K::IdempotencyKeyRequired,
            K::InvalidIdempotencyKey,
            K::IdempotencyInProgress,
            K::IdempotencyKeyReused,
            K::IdempotencyResponseNotKept,
            K::StoreUnavailable,
            K::CircuitOpen,
            K::Cooldown,
            K::ConcurrencyLimited,
            K::CredentialUnavailable,
            K::NoTargetAvailable,
            K::QueueFull,
            K::JobsUnavailable,
            K::JobNotFound,
            K::JobNotFinished,
            K::JobResultUnavailable,
            K::JobMethodNotAllowed,
            K::CallbackNotAllowed,
            K::AdminDisabled,
            K::AdminUnauthorized,
            K::AdminNotFound,
            K::DeadLetterStoreUnavailable,
        ];
        for k in all {
            let row = k.row();
            assert!(row.status.is_client_error() || row.status.is_server_error(), "{k:?}");
            assert!(!row.code.is_empty() && row.code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
            let v: serde_json::Value = serde_json::from_str(&problem_body(k, "m")).unwrap();
            assert_eq!(v["error"]["code"], row.code);
            assert_eq!(v["status"], row.status.as_u16());
        }
        let retryable: Vec<_> = all.into_iter().filter(|k| k.row().retryable).collect();
        assert_eq!(retryable, [K::IdempotencyInProgress, K::JobNotFinished]);
        let target = ProxyError::InvalidRequestTarget("bad".into());
        assert_eq!(
            (target.status().as_u16(), target.code()),
            (400, "invalid_request_target")
        );
    }
}
