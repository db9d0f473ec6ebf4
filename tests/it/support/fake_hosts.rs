//! The cloud hosts of the models, emulated by the fake provider on their own paths: Amazon
//! Bedrock, Vertex AI (Anthropic's models and Google's), Azure OpenAI and the Gemini API. The fake
//! provider's router hands a request whose path is a host's ([`Call::of`]) to this module: what
//! the host refuses ([`refuse`]), what it answers ([`answer`]), the shape of its errors
//! ([`scripted_error`]) and, for Bedrock, its event stream ([`to_bedrock`]). Everything else of the
//! fake provider applies as on any path: the `x-fake-key`, the [`Step`] scripts (consumed only by
//! a request the host accepted), the counts and the recorded requests.
//!
//! **Amazon Bedrock**, `POST .../model/{model id}/invoke` and `.../invoke-with-response-stream`
//! (the id percent-encoded, `:` as `%3A`):
//! - refused as AWS refuses: no `authorization` is 403 `MissingAuthenticationTokenException`; one
//!   that is not SigV4 (a bearer key other than the API key [`BEDROCK_API_KEY`]), or whose access key is not [`AWS_ACCESS_KEY`], 403
//!   `UnrecognizedClientException`; a scope of another service than `bedrock`, or of another
//!   region than the one set with `POST /_fake/aws` (`{"region": "us-west-2"}`,
//!   `FakeProvider::aws_region`; any region when none is set), or a signature that does not
//!   verify with [`AWS_SECRET`] (AWS's documentation example keys: rebound signs with them when
//!   its environment has them as `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`), 403
//!   `InvalidSignatureException`; a body that is not a JSON object, or has a `model` or `stream`
//!   key, no `anthropic_version` or another one than [`BEDROCK_VERSION`] (or a dated Messages
//!   API version such as `2026-10-21`, which the pinned Anthropic SDK's Bedrock client sends), or
//!   an `anthropic_beta` that is not a list of strings, 400 `ValidationException`. Errors carry
//!   `x-amzn-errortype: {Type}:http://internal.amazon.com/coral/...` and `{"message": ".."}`;
//!   every answer carries `x-amzn-requestid`;
//! - `invoke`: the fake's Anthropic message, with `x-amzn-bedrock-input-token-count` and
//!   `x-amzn-bedrock-output-token-count`;
//! - `invoke-with-response-stream`: `application/vnd.amazon.eventstream`, the fake's Anthropic
//!   stream (the same events, the same timing) one `chunk` message per event
//!   ([`super::event_stream`]); `message_stop` carries `amazon-bedrock-invocationMetrics` (its
//!   token counts are the stream's own usage); keep-alives (`ping`, SSE comments) are dropped,
//!   and an Anthropic `error` event becomes an exception message of its kind
//!   ([`exception_type`]). Every scripted step that answers with an event stream elsewhere is
//!   re-framed so ([`to_bedrock`]): `InBandError` is a first message that is an exception,
//!   `MidStreamError` an exception after its events, `Stall`, `PauseAfterFirst`, ... as
//!   elsewhere; and two steps are Bedrock's own: `EventStreamException { after, exception_type,
//!   message }` (the first `after` events, 0 allowed, then that exception message, then the end)
//!   and `BadChecksum { after }` (the first `after` events, then the next one with its message
//!   CRC broken, then the end).
//!
//! **Vertex AI, Anthropic's models**, `POST /v1/projects/{p}/locations/{l}/publishers/anthropic/
//! models/{model}:rawPredict` and `:streamRawPredict`: refused with Google's errors
//! (`{"error":{"code":..,"message":"..","status":".."}}`): no `authorization: Bearer ..` is 401
//! `UNAUTHENTICATED`; a body that is not a JSON object, has a `model` key, no `anthropic_version`
//! or another one than [`VERTEX_VERSION`] (or a dated one, as for Bedrock) is 400
//! `INVALID_ARGUMENT`, and so (the fake's own rule, to tell a wrong method) is `"stream": true` on
//! `:rawPredict` or its absence on `:streamRawPredict`. Answers as Anthropic's (the message, or
//! its event stream).
//!
//! **Azure OpenAI**, `/openai/deployments/{deployment}/{chat/completions|embeddings|completions}`
//! and `/openai/responses` (both with `?api-version=`), `/openai/v1/{...}` (without): a
//! deployment path or `/openai/responses` without `api-version` is 404 `DeploymentNotFound`;
//! neither `api-key` nor `authorization: Bearer ..` is 401; another operation is 404. Answers
//! as OpenAI's (chat, its stream, embeddings, responses; `completions` is the fake's 404).
//!
//! **The Gemini API** (`/v1beta/models/{m}:generateContent`, `:streamGenerateContent`) and **Vertex
//! AI, Google's models** (`/v1/projects/{p}/locations/{l}/publishers/google/models/{m}:...`):
//! without `x-goog-api-key` (or `?key=`) the Gemini API is 403 `PERMISSION_DENIED`, without a
//! bearer token Vertex is 401 `UNAUTHENTICATED`; a body without `contents`, or with a key a
//! `GenerateContentRequest` does not have (`model`, `stream`, `messages`, ...), is 400
//! `INVALID_ARGUMENT`. `:generateContent` answers a `GenerateContentResponse` with
//! `usageMetadata`; `:streamGenerateContent?alt=sse` the same text in `x-fake-chunks` events
//! (`data: {..}\r\n\r\n`, as Google ends them; `usageMetadata` in each, cumulative), and without
//! `alt=sse` those chunks as one JSON array.
//!
//! A scripted `Status` without a body answers in the host's error shape (Bedrock's
//! `x-amzn-errortype` and message, Google's error object, Azure's `{"error":{"code":"429",..}}`):
//! `Status { status: 429 }` on a Bedrock path is a `ThrottlingException`, on Vertex a
//! `RESOURCE_EXHAUSTED`. A step's own headers and body win.
//!
//! Besides the hosts, `POST .../embeddings` and `POST .../responses` are answered on any path in
//! OpenAI's shapes ([`embeddings`], [`responses`]).

#![allow(dead_code)]

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use hyper::body::Frame;
use serde_json::Value;

use super::event_stream;
use super::fake_provider::{anthropic_message, full, json_response, Body};
use super::sigv4::sigv4_valid;

/// The access key rebound must sign with (AWS's documentation example).
pub const AWS_ACCESS_KEY: &str = "AKIDEXAMPLE";
/// Its secret (AWS's documentation example).
pub const AWS_SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
/// A Bedrock API key the fake accepts (`authorization: Bearer ..`, as Bedrock takes its API keys;
/// the benchmark's Bedrock upstream sets it).
pub const BEDROCK_API_KEY: &str = "bench-bedrock-api-key";
/// The `anthropic_version` Bedrock requires in the body.
pub const BEDROCK_VERSION: &str = "bedrock-2023-05-31";
/// The `anthropic_version` Vertex AI requires in the body.
pub const VERTEX_VERSION: &str = "vertex-2023-10-16";
/// Bedrock's error type namespace.
const BEDROCK_NS: &str = "http://internal.amazon.com/coral/com.amazon.bedrock/";
/// AWS's own (authentication) error type namespace.
const CORAL_NS: &str = "http://internal.amazon.com/coral/com.amazon.coral.service/";
/// Bedrock's answer to a bad signature.
pub const SIGNATURE_MISMATCH: &str = "The request signature we calculated does not match the signature you provided. \
     Check your AWS Secret Access Key and signing method. Consult the service documentation for details.";

/// A host of the models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    Bedrock,
    VertexAnthropic,
    Azure,
    Gemini,
    VertexGemini,
}

impl Host {
    /// It speaks Anthropic's Messages API (its scripted events are Anthropic's).
    pub fn anthropic(self) -> bool {
        matches!(self, Host::Bedrock | Host::VertexAnthropic)
    }

    fn google(self) -> bool {
        matches!(self, Host::VertexAnthropic | Host::Gemini | Host::VertexGemini)
    }
}

/// A request on a host's path, as its path tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub host: Host,
    /// The model the path names, percent-decoded: Bedrock's model id, Vertex AI's or Gemini's
    /// model, Azure's deployment (`None` on Azure's other paths).
    pub model: Option<String>,
    /// The method's (Bedrock, Vertex, Gemini) or the body's (Azure) say.
    pub stream: bool,
    /// Vertex AI's project and location.
    pub project: Option<String>,
    pub location: Option<String>,
    /// The method (`rawPredict`, `generateContent`, ...) or Azure's operation (`chat/completions`).
    pub operation: String,
    /// The query's `api-version` (Azure).
    pub api_version: Option<String>,
    /// `alt=sse` (Gemini), `/openai/v1/` (Azure).
    pub sse: bool,
    pub v1: bool,
}

impl Call {
    /// The host call `path` is, if any (never under `/echo`).
    pub fn of(path: &str, query: Option<&str>) -> Option<Call> {
        if path == "/echo" || path.starts_with("/echo/") {
            return None;
        }
        bedrock(path)
            .or_else(|| google(path, query))
            .or_else(|| azure(path, query))
    }

    fn new(host: Host, operation: &str) -> Call {
        Call {
            host,
            model: None,
            stream: false,
            project: None,
            location: None,
            operation: operation.to_string(),
            api_version: None,
            sse: false,
            v1: false,
        }
    }

    /// Whether the answer is a stream: the path's say, or on Azure the body's.
    pub fn streams(&self, body_says: bool) -> bool {
        match self.host {
            Host::Azure => body_says,
            _ => self.stream,
        }
    }
}

fn bedrock(path: &str) -> Option<Call> {
    let (rest, stream) = match path.strip_suffix("/invoke-with-response-stream") {
        Some(rest) => (rest, true),
        None => (path.strip_suffix("/invoke")?, false),
    };
    let at = rest.rfind("/model/")?;
    let id = &rest[at + "/model/".len()..];
    if id.contains('/') {
        return None;
    }
    let mut call = Call::new(
        Host::Bedrock,
        if stream {
            "invoke-with-response-stream"
        } else {
            "invoke"
        },
    );
    call.model = Some(percent_decode(id));
    call.stream = stream;
    Some(call)
}

fn google(path: &str, query: Option<&str>) -> Option<Call> {
    let (head, method) = path.rsplit_once(':')?;
    let (prefix, model) = head.rsplit_once("/models/")?;
    if method.contains('/') || model.contains('/') {
        return None;
    }
    let host = match method {
        "rawPredict" | "streamRawPredict" if prefix.ends_with("/publishers/anthropic") => Host::VertexAnthropic,
        "generateContent" | "streamGenerateContent" if prefix.ends_with("/publishers/google") => Host::VertexGemini,
        "generateContent" | "streamGenerateContent" if !prefix.contains("/publishers/") => Host::Gemini,
        _ => return None,
    };
    let mut call = Call::new(host, method);
    call.model = Some(percent_decode(model));
    call.stream = method.starts_with("stream");
    let segments: Vec<&str> = prefix.split('/').collect();
    let after = |name: &str| {
        segments
            .iter()
            .position(|s| *s == name)
            .and_then(|i| segments.get(i + 1))
            .map(|s| percent_decode(s))
    };
    call.project = after("projects");
    call.location = after("locations");
    call.sse = query_param(query, "alt").as_deref() == Some("sse");
    Some(call)
}

fn azure(path: &str, query: Option<&str>) -> Option<Call> {
    let rest = path.strip_prefix("/openai/")?;
    let mut call = if let Some(deployment) = rest.strip_prefix("deployments/") {
        let (deployment, operation) = deployment.split_once('/')?;
        let mut call = Call::new(Host::Azure, operation);
        call.model = Some(percent_decode(deployment));
        call
    } else if let Some(operation) = rest.strip_prefix("v1/") {
        let mut call = Call::new(Host::Azure, operation);
        call.v1 = true;
        call
    } else if rest == "responses" || rest.starts_with("responses/") {
        Call::new(Host::Azure, rest)
    } else {
        return None;
    };
    call.api_version = query_param(query, "api-version");
    Some(call)
}

/// The value of `name` in `query`, decoded.
pub fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// `%XX` decoded (a path segment: `+` stays).
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// What the host answers a request it does not take, before anything else (the script is not
/// consumed), and why in a line (the status, Bedrock's error type, the body); `None` when it takes
/// it. `aws_region` is the region a Bedrock signature must be scoped to, when set.
pub fn refuse(
    call: &Call,
    aws_region: Option<&str>,
    parts: &http::request::Parts,
    body: &[u8],
) -> Option<(String, Response<Body>)> {
    let refused = match call.host {
        Host::Bedrock => refuse_bedrock(call, aws_region, parts, body),
        Host::VertexAnthropic => refuse_vertex_anthropic(call, parts, body),
        Host::Azure => refuse_azure(call, parts),
        Host::Gemini | Host::VertexGemini => refuse_gemini(call, parts, body),
    }?;
    let (head, body) = refused.into_parts();
    // A whole body: ready at once.
    let bytes = futures_util::FutureExt::now_or_never(body.collect())
        .and_then(Result::ok)
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let error_type = header(&head.headers, "x-amzn-errortype")
        .and_then(|t| t.split(':').next())
        .map(|t| format!("{t}: "))
        .unwrap_or_default();
    let why = format!(
        "{} {error_type}{}",
        head.status.as_u16(),
        String::from_utf8_lossy(&bytes)
    );
    Some((
        why,
        Response::from_parts(head, full(String::from_utf8_lossy(&bytes).into_owned())),
    ))
}

/// Bedrock's error: the status, `x-amzn-errortype` and `{"message": ..}`.
pub fn bedrock_error(status: u16, error_type: &str, message: &str) -> Response<Body> {
    let ns = match error_type {
        "MissingAuthenticationTokenException"
        | "UnrecognizedClientException"
        | "InvalidSignatureException"
        | "IncompleteSignatureException" => CORAL_NS,
        _ => BEDROCK_NS,
    };
    let mut resp = json_response(
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        serde_json::json!({ "message": message }).to_string(),
    );
    let headers = resp.headers_mut();
    headers.remove("x-request-id");
    if let Ok(v) = http::HeaderValue::from_str(&format!("{error_type}:{ns}")) {
        headers.insert("x-amzn-errortype", v);
    }
    headers.insert("x-amzn-requestid", http::HeaderValue::from_static(REQUEST_ID));
    resp
}

const REQUEST_ID: &str = "00000000-0000-4000-8000-00000000fa4e";

/// Google's error object: `{"error": {"code", "message", "status"}}`.
pub fn google_error(status: u16, message: &str) -> Response<Body> {
    let body = serde_json::json!({
        "error": { "code": status, "message": message, "status": google_status(status) }
    });
    json_response(
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        body.to_string(),
    )
}

/// The `status` Google names an HTTP status by.
pub fn google_status(status: u16) -> &'static str {
    match status {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        500 => "INTERNAL",
        501 => "UNIMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "UNKNOWN",
    }
}

/// Azure OpenAI's error object: `{"error": {"code": "..", "message": ".."}}`.
pub fn azure_error(status: u16, code: &str, message: &str) -> Response<Body> {
    json_response(
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        serde_json::json!({ "error": { "code": code, "message": message } }).to_string(),
    )
}

/// The error type and message Bedrock answers a status with.
pub fn bedrock_error_type(status: u16) -> (&'static str, &'static str) {
    match status {
        400 => (
            "ValidationException",
            "Malformed input request, please reformat your input and try again.",
        ),
        403 => (
            "AccessDeniedException",
            "You don't have access to the model with the specified model ID.",
        ),
        404 => (
            "ResourceNotFoundException",
            "Could not resolve the foundation model from the provided model identifier.",
        ),
        408 => (
            "ModelTimeoutException",
            "Model has timed out in processing the request.",
        ),
        424 => ("ModelErrorException", "The model returned an error."),
        429 => (
            "ThrottlingException",
            "Too many requests, please wait before trying again.",
        ),
        503 => (
            "ServiceUnavailableException",
            "Bedrock is unable to process your request.",
        ),
        _ => ("InternalServerException", "The server encountered an internal error."),
    }
}

/// The status, added headers and body of a scripted `Status` without a body, in the host's shape.
pub fn scripted_error(call: &Call, status: u16) -> (Vec<(String, String)>, String) {
    match call.host {
        Host::Bedrock => {
            let (error_type, message) = bedrock_error_type(status);
            (
                vec![
                    ("x-amzn-errortype".into(), format!("{error_type}:{BEDROCK_NS}")),
                    ("x-amzn-requestid".into(), REQUEST_ID.into()),
                ],
                serde_json::json!({ "message": message }).to_string(),
            )
        }
        Host::VertexAnthropic | Host::Gemini | Host::VertexGemini => (
            Vec::new(),
            serde_json::json!({
                "error": { "code": status, "message": format!("scripted {status}"), "status": google_status(status) }
            })
            .to_string(),
        ),
        Host::Azure => (
            Vec::new(),
            serde_json::json!({ "error": { "code": status.to_string(), "message": format!("scripted {status}") } })
                .to_string(),
        ),
    }
}

/// The headers as a list, with `host` from the URI's authority when HTTP/2 sent none.
fn header_list(parts: &http::request::Parts) -> Vec<(String, String)> {
    let mut list: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    if !parts.headers.contains_key("host") {
        if let Some(authority) = parts.uri.authority() {
            list.push(("host".into(), authority.to_string()));
        }
    }
    list
}

/// Whether the SigV4 `authorization` of the request holds, as AWS checks it: the error type and
/// message when not.
fn bedrock_signature(
    aws_region: Option<&str>,
    parts: &http::request::Parts,
    body: &[u8],
) -> Result<(), (&'static str, String)> {
    let Some(auth) = header(&parts.headers, "authorization") else {
        return Err((
            "MissingAuthenticationTokenException",
            "Missing Authentication Token".into(),
        ));
    };
    let invalid_token = || {
        (
            "UnrecognizedClientException",
            "The security token included in the request is invalid.".to_string(),
        )
    };
    if auth.strip_prefix("Bearer ") == Some(BEDROCK_API_KEY) {
        return Ok(());
    }
    let Some(fields) = auth.strip_prefix("AWS4-HMAC-SHA256 ") else {
        return Err(invalid_token());
    };
    let credential = fields.split(", ").find_map(|f| f.strip_prefix("Credential=")).ok_or((
        "IncompleteSignatureException",
        "Authorization header requires 'Credential' parameter.".to_string(),
    ))?;
    let scope: Vec<&str> = credential.split('/').collect();
    let [access_key, _date, region, service, "aws4_request"] = scope[..] else {
        return Err((
            "IncompleteSignatureException",
            format!("Credential {credential} is malformed."),
        ));
    };
    if access_key != AWS_ACCESS_KEY {
        return Err(invalid_token());
    }
    if service != "bedrock" {
        return Err((
            "InvalidSignatureException",
            format!("Credential should be scoped to correct service: 'bedrock'. (was '{service}')"),
        ));
    }
    if aws_region.is_some_and(|want| want != region) {
        return Err((
            "InvalidSignatureException",
            format!("Credential should be scoped to a valid region. (was '{region}')"),
        ));
    }
    let headers = header_list(parts);
    sigv4_valid(
        AWS_SECRET,
        parts.method.as_str(),
        parts.uri.path(),
        parts.uri.query(),
        &headers,
        body,
    )
    .map_err(|_| ("InvalidSignatureException", SIGNATURE_MISMATCH.to_string()))
}

fn refuse_bedrock(
    call: &Call,
    aws_region: Option<&str>,
    parts: &http::request::Parts,
    body: &[u8],
) -> Option<Response<Body>> {
    if let Err((error_type, message)) = bedrock_signature(aws_region, parts, body) {
        return Some(bedrock_error(403, error_type, &message));
    }
    let invalid = |message: String| Some(bedrock_error(400, "ValidationException", &message));
    if call.model.as_deref().is_none_or(str::is_empty) {
        return invalid("The provided model identifier is invalid.".into());
    }
    let Some(Value::Object(object)) = serde_json::from_slice::<Value>(body).ok() else {
        return invalid("Malformed input request, please reformat your input and try again.".into());
    };
    for key in ["model", "stream"] {
        if object.contains_key(key) {
            return invalid(format!(
                "Malformed input request: #: extraneous key [{key}] is not permitted, please reformat your input and try again."
            ));
        }
    }
    match object.get("anthropic_version") {
        None => {
            return invalid(
                "Malformed input request: #: required key [anthropic_version] not found, please reformat your input and try again."
                    .into(),
            )
        }
        Some(v) if !version_ok(v, BEDROCK_VERSION) => {
            return invalid(format!(
                "Malformed input request: #/anthropic_version: {v} is not a valid enum value, please reformat your input and try again."
            ))
        }
        Some(_) => {}
    }
    if let Some(beta) = object.get("anthropic_beta") {
        let strings = beta.as_array().is_some_and(|a| a.iter().all(Value::is_string));
        if !strings {
            return invalid(format!(
                "Malformed input request: #/anthropic_beta: expected type: JSONArray of strings, found: {beta}, please reformat your input and try again."
            ));
        }
    }
    None
}

/// An `anthropic_version` the host takes: its own (`bedrock-2023-05-31`, `vertex-2023-10-16`), or
/// a dated version of the Messages API (`2026-10-21`), which the pinned Anthropic SDK's Bedrock and
/// Vertex clients send in its place.
fn version_ok(version: &Value, host_version: &str) -> bool {
    let Some(v) = version.as_str() else { return false };
    let dated = v.len() == 10
        && v.bytes().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                b == b'-'
            } else {
                b.is_ascii_digit()
            }
        });
    v == host_version || dated
}

fn bearer(parts: &http::request::Parts) -> bool {
    header(&parts.headers, "authorization").is_some_and(|v| v.starts_with("Bearer ") && v.len() > "Bearer ".len())
}

const UNAUTHENTICATED: &str = "Request had invalid authentication credentials. Expected OAuth 2 access token, \
     login cookie or other valid authentication credential.";

fn refuse_vertex_anthropic(call: &Call, parts: &http::request::Parts, body: &[u8]) -> Option<Response<Body>> {
    if !bearer(parts) {
        return Some(google_error(401, UNAUTHENTICATED));
    }
    let invalid = |message: String| Some(google_error(400, &message));
    let Some(Value::Object(object)) = serde_json::from_slice::<Value>(body).ok() else {
        return invalid("Invalid JSON payload received.".into());
    };
    if object.contains_key("model") {
        return invalid("model: Extra inputs are not permitted".into());
    }
    if !object
        .get("anthropic_version")
        .is_some_and(|v| version_ok(v, VERTEX_VERSION))
    {
        return invalid(format!("anthropic_version: Input should be '{VERTEX_VERSION}'"));
    }
    let streams = object.get("stream").and_then(Value::as_bool).unwrap_or(false);
    if streams != call.stream {
        return invalid(format!(
            "stream: {} with :{} (the fake provider's rule: stream: true is :streamRawPredict's)",
            object.get("stream").map_or("absent".to_string(), Value::to_string),
            call.operation
        ));
    }
    None
}

/// The operations Azure OpenAI answers.
const AZURE_OPERATIONS: [&str; 4] = ["chat/completions", "embeddings", "completions", "responses"];

fn refuse_azure(call: &Call, parts: &http::request::Parts) -> Option<Response<Body>> {
    if !call.v1 && call.api_version.is_none() {
        return Some(azure_error(
            404,
            "DeploymentNotFound",
            "The API deployment for this resource does not exist. If you created the deployment within the \
             last 5 minutes, please wait a moment and try again.",
        ));
    }
    let key = header(&parts.headers, "api-key").is_some_and(|k| !k.is_empty());
    if !key && !bearer(parts) {
        return Some(azure_error(
            401,
            "401",
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key \
             for an active subscription and use a correct regional API endpoint for your resource.",
        ));
    }
    let operation = call.operation.as_str();
    let known = if call.model.is_some() {
        AZURE_OPERATIONS[..3].contains(&operation)
    } else {
        AZURE_OPERATIONS.contains(&operation) || operation.starts_with("responses/")
    };
    (!known).then(|| azure_error(404, "404", "Resource not found"))
}

/// The fields of a `GenerateContentRequest` (proto JSON: either spelling).
const GENERATE_CONTENT_FIELDS: [&str; 14] = [
    "contents",
    "tools",
    "toolConfig",
    "tool_config",
    "safetySettings",
    "safety_settings",
    "systemInstruction",
    "system_instruction",
    "generationConfig",
    "generation_config",
    "cachedContent",
    "cached_content",
    "labels",
    "model_armor_config",
];

fn refuse_gemini(call: &Call, parts: &http::request::Parts, body: &[u8]) -> Option<Response<Body>> {
    if call.host == Host::Gemini {
        let key = header(&parts.headers, "x-goog-api-key").is_some() || query_param(parts.uri.query(), "key").is_some();
        if !key && !bearer(parts) {
            return Some(google_error(
                403,
                "Method doesn't allow unregistered callers (callers without established identity). \
                 Please use API Key or other form of API consumer identity to call this API.",
            ));
        }
    } else if !bearer(parts) {
        return Some(google_error(401, UNAUTHENTICATED));
    }
    let invalid = |message: String| Some(google_error(400, &message));
    let Some(Value::Object(object)) = serde_json::from_slice::<Value>(body).ok() else {
        return invalid("Invalid JSON payload received.".into());
    };
    if let Some(unknown) = object.keys().find(|k| !GENERATE_CONTENT_FIELDS.contains(&k.as_str())) {
        return invalid(format!(
            "Invalid JSON payload received. Unknown name \"{unknown}\": Cannot find field."
        ));
    }
    if !object.get("contents").is_some_and(Value::is_array) {
        return invalid("* GenerateContentRequest.contents: contents is not specified\n".into());
    }
    None
}

/// What a host answers a request it took when no step says otherwise.
pub enum HostAnswer {
    /// A JSON body, with these headers added.
    Json {
        body: String,
        headers: Vec<(String, String)>,
    },
    /// The fake's Anthropic stream (Bedrock's is re-framed by [`to_bedrock`] on its way out).
    AnthropicStream,
    /// These events, one body frame each (`x-fake-gap-ms` apart), as `content_type`.
    Events {
        events: Vec<String>,
        content_type: &'static str,
    },
    /// What the fake provider answers the path (Azure's chat: OpenAI's).
    Generic,
}

/// A host's normal answer to `call`; `request` is the body's JSON, `chunks` the stream's deltas.
pub fn answer(call: &Call, request: Option<&Value>, chunks: usize) -> HostAnswer {
    match call.host {
        Host::Bedrock if call.stream => HostAnswer::AnthropicStream,
        Host::Bedrock => HostAnswer::Json {
            body: anthropic_message(),
            headers: vec![
                ("x-amzn-requestid".into(), REQUEST_ID.into()),
                ("x-amzn-bedrock-input-token-count".into(), "12".into()),
                ("x-amzn-bedrock-output-token-count".into(), "96".into()),
                ("x-amzn-bedrock-invocation-latency".into(), "512".into()),
            ],
        },
        Host::VertexAnthropic if call.stream => HostAnswer::AnthropicStream,
        Host::VertexAnthropic => HostAnswer::Json {
            body: anthropic_message(),
            headers: Vec::new(),
        },
        Host::Gemini | Host::VertexGemini if !call.stream => HostAnswer::Json {
            body: gemini_response(),
            headers: Vec::new(),
        },
        Host::Gemini | Host::VertexGemini if call.sse => HostAnswer::Events {
            events: (0..chunks)
                .map(|i| format!("data: {}\r\n\r\n", gemini_chunk(i, chunks)))
                .collect(),
            content_type: "text/event-stream",
        },
        Host::Gemini | Host::VertexGemini => {
            // Without `alt=sse`: the chunks as one JSON array, streamed as it is written.
            let mut events: Vec<String> = (0..chunks)
                .map(|i| format!("{}{}", if i == 0 { "[" } else { ",\r\n" }, gemini_chunk(i, chunks)))
                .collect();
            events.push(if chunks == 0 { "[]".into() } else { "]".into() });
            HostAnswer::Events {
                events,
                content_type: "application/json",
            }
        }
        Host::Azure => openai_extra(&call.operation, request, chunks).unwrap_or(HostAnswer::Generic),
    }
}

/// The OpenAI shapes the fake answers on any path besides chat: `.../embeddings` and
/// `.../responses`.
pub fn openai_extra(path: &str, request: Option<&Value>, chunks: usize) -> Option<HostAnswer> {
    let streams = request.and_then(|r| r.get("stream")).and_then(Value::as_bool) == Some(true);
    if path.ends_with("embeddings") {
        return Some(HostAnswer::Json {
            body: embeddings(request),
            headers: Vec::new(),
        });
    }
    if path.ends_with("responses") {
        if streams {
            return Some(HostAnswer::Events {
                events: responses_events_from(continued_from(request), chunks, background(request)),
                content_type: "text/event-stream",
            });
        }
        return Some(HostAnswer::Json {
            body: responses(),
            headers: Vec::new(),
        });
    }
    None
}

/// The vector of input `i` (8 dimensions).
pub fn embedding(i: usize) -> Vec<f32> {
    (0..8).map(|d| (i * 8 + d) as f32 / 64.0).collect()
}

/// An OpenAI embeddings answer: one vector per input, as floats or, with `"encoding_format":
/// "base64"` (the OpenAI SDK's default), as base64 of little-endian f32s.
pub fn embeddings(request: Option<&Value>) -> String {
    use base64::Engine as _;
    let inputs = match request.and_then(|r| r.get("input")) {
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => 1,
        Some(Value::Array(items)) => items.len(),
        _ => 1,
    };
    let base64 = request.and_then(|r| r.get("encoding_format")).and_then(Value::as_str) == Some("base64");
    let data: Vec<Value> = (0..inputs)
        .map(|i| {
            let vector = embedding(i);
            let value = if base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|f| f.to_le_bytes()).collect();
                Value::from(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                Value::from(vector)
            };
            serde_json::json!({ "object": "embedding", "index": i, "embedding": value })
        })
        .collect();
    serde_json::json!({
        "object": "list",
        "data": data,
        "model": "text-embedding-fake",
        "usage": { "prompt_tokens": 8, "total_tokens": 8 },
    })
    .to_string()
}

/// The text of the fake's answers (96 words, as the fake's chat completion).
fn answer_text() -> String {
    "rebound ".repeat(96)
}

/// An OpenAI Responses API answer.
pub fn responses() -> String {
    responses_object("completed", &answer_text(), 96)
}

fn responses_object(status: &str, text: &str, output_tokens: usize) -> String {
    serde_json::json!({
        "id": "resp_fake",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": status,
        "model": "gpt-fake",
        "output": [{
            "type": "message", "id": "msg_fake", "status": "completed", "role": "assistant",
            "content": [{ "type": "output_text", "text": text, "annotations": [] }],
        }],
        "usage": {
            "input_tokens": 12, "input_tokens_details": { "cached_tokens": 0 },
            "output_tokens": output_tokens, "output_tokens_details": { "reasoning_tokens": 0 },
            "total_tokens": 12 + output_tokens,
        },
    })
    .to_string()
}

/// Whether a Responses request asks for background mode.
fn background(request: Option<&Value>) -> bool {
    request.and_then(|r| r.get("background")).and_then(Value::as_bool) == Some(true)
}

/// Where a continuation of a Responses answer picks up: after the `tokenN` words of the
/// assistant message in its `input` (0 for a fresh request).
fn continued_from(request: Option<&Value>) -> usize {
    let Some(input) = request.and_then(|r| r.get("input")).and_then(Value::as_array) else {
        return 0;
    };
    let assistant = input
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("assistant"));
    let text = match assistant.and_then(|m| m.get("content")) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    };
    text.matches("token").count()
}

/// The Responses API's stream of `chunks` deltas, as OpenAI sends it: `response.created` and
/// `response.in_progress` (`background` as asked), the message item and its text part added, the
/// deltas, the text, part and item done, `response.completed` (with usage); each event with its
/// `sequence_number` (from 0).
pub fn responses_events(chunks: usize, background: bool) -> Vec<String> {
    responses_events_from(0, chunks, background)
}

/// [`responses_events`] of a continuation: its deltas from `from` on.
pub fn responses_events_from(from: usize, chunks: usize, background: bool) -> Vec<String> {
    let mut text = String::new();
    for i in from..chunks {
        text.push_str(&format!("token{i} "));
    }
    let response = |status: &str| {
        serde_json::json!({"id": "resp_fake", "object": "response", "created_at": 1_700_000_000, "status": status,
            "background": background, "model": "gpt-fake", "output": []})
    };
    let item = |status: &str, text: Option<&str>| {
        let content = match text {
            Some(t) => serde_json::json!([{"type": "output_text", "text": t, "annotations": []}]),
            None => serde_json::json!([]),
        };
        serde_json::json!({"id": "msg_fake", "type": "message", "status": status, "role": "assistant", "content": content})
    };
    let part = |text: &str| serde_json::json!({"type": "output_text", "text": text, "annotations": []});
    let mut data = vec![
        serde_json::json!({"type": "response.created", "response": response("in_progress")}),
        serde_json::json!({"type": "response.in_progress", "response": response("in_progress")}),
        serde_json::json!({"type": "response.output_item.added", "output_index": 0, "item": item("in_progress", None)}),
        serde_json::json!({"type": "response.content_part.added", "item_id": "msg_fake", "output_index": 0,
            "content_index": 0, "part": part("")}),
    ];
    for i in from..chunks {
        data.push(
            serde_json::json!({"type": "response.output_text.delta", "item_id": "msg_fake", "output_index": 0,
            "content_index": 0, "delta": format!("token{i} ")}),
        );
    }
    let mut completed: Value =
        serde_json::from_str(&responses_object("completed", &text, chunks - from)).unwrap_or_default();
    completed["background"] = Value::from(background);
    data.extend([
        serde_json::json!({"type": "response.output_text.done", "item_id": "msg_fake", "output_index": 0,
            "content_index": 0, "text": text}),
        serde_json::json!({"type": "response.content_part.done", "item_id": "msg_fake", "output_index": 0,
            "content_index": 0, "part": part(&text)}),
        serde_json::json!({"type": "response.output_item.done", "output_index": 0, "item": item("completed", Some(&text))}),
        serde_json::json!({"type": "response.completed", "response": completed}),
    ]);
    data.into_iter()
        .enumerate()
        .map(|(seq, mut d)| {
            d["sequence_number"] = Value::from(seq);
            let name = d["type"].as_str().unwrap_or("").to_string();
            format!("event: {name}\ndata: {d}\n\n")
        })
        .collect()
}

/// A background response read again (`GET .../responses/{id}?stream=true&starting_after=N`):
/// its events after sequence number N, or `None` for another request.
pub fn resumed(path: &str, query: Option<&str>, chunks: usize) -> Option<Vec<String>> {
    if !path.contains("/responses/") {
        return None;
    }
    let after: usize = query?
        .split('&')
        .find_map(|p| p.strip_prefix("starting_after="))?
        .parse()
        .ok()?;
    Some(responses_events(chunks, true).into_iter().skip(after + 1).collect())
}

/// A Gemini `GenerateContentResponse` with the fake's text and `usageMetadata`.
pub fn gemini_response() -> String {
    serde_json::json!({
        "candidates": [{
            "content": { "parts": [{ "text": answer_text() }], "role": "model" },
            "finishReason": "STOP",
            "index": 0,
        }],
        "usageMetadata": { "promptTokenCount": 12, "candidatesTokenCount": 96, "totalTokenCount": 108 },
        "modelVersion": "gemini-fake",
        "responseId": "fake-response",
    })
    .to_string()
}

/// The `i`th of `chunks` chunks of a Gemini stream: `token{i} `, and `usageMetadata` so far (the
/// last with `finishReason`).
pub fn gemini_chunk(i: usize, chunks: usize) -> String {
    let mut candidate = serde_json::json!({
        "content": { "parts": [{ "text": format!("token{i} ") }], "role": "model" },
        "index": 0,
    });
    if i + 1 == chunks {
        candidate["finishReason"] = Value::from("STOP");
    }
    serde_json::json!({
        "candidates": [candidate],
        "usageMetadata": { "promptTokenCount": 12, "candidatesTokenCount": i + 1, "totalTokenCount": 13 + i },
        "modelVersion": "gemini-fake",
        "responseId": "fake-response",
    })
    .to_string()
}

/// The exception Bedrock sends mid-stream for an Anthropic error type.
pub fn exception_type(anthropic_error_type: &str) -> &'static str {
    match anthropic_error_type {
        "rate_limit_error" => "throttlingException",
        "overloaded_error" => "serviceUnavailableException",
        "invalid_request_error" => "validationException",
        "api_error" => "internalServerException",
        "timeout_error" => "modelTimeoutException",
        _ => "modelStreamErrorException",
    }
}

/// The Anthropic error type an exception stands for (where a step asks an exception of a
/// path that has no event stream).
pub fn anthropic_error_type(exception_type: &str) -> &'static str {
    match exception_type {
        "throttlingException" => "rate_limit_error",
        "serviceUnavailableException" => "overloaded_error",
        "validationException" => "invalid_request_error",
        "modelTimeoutException" => "timeout_error",
        _ => "api_error",
    }
}

/// The usage a stream reported so far, for `amazon-bedrock-invocationMetrics`.
#[derive(Default)]
struct Reframer {
    input: u64,
    output: u64,
}

impl Reframer {
    /// The SSE text of whole events, as Bedrock's messages.
    fn reframe(&mut self, sse: &[u8]) -> Vec<u8> {
        let text = String::from_utf8_lossy(sse);
        let mut out = Vec::new();
        for event in text.split("\n\n") {
            if let Some(message) = self.message(event) {
                out.extend_from_slice(&message);
            }
        }
        out
    }

    /// One SSE event as a Bedrock message (`None`: Bedrock sends nothing for it).
    fn message(&mut self, event: &str) -> Option<Vec<u8>> {
        let data: String = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim_start)
            .collect::<Vec<_>>()
            .join("\n");
        if data.is_empty() || data == "[DONE]" {
            return None;
        }
        let Ok(json) = serde_json::from_str::<Value>(&data) else {
            return Some(event_stream::chunk(&data));
        };
        match json["type"].as_str() {
            Some("ping") => None,
            Some("error") => {
                let kind = json["error"]["type"].as_str().unwrap_or("api_error");
                let message = json["error"]["message"].as_str().unwrap_or("");
                Some(event_stream::exception(exception_type(kind), message))
            }
            Some("message_start") => {
                self.input = json["message"]["usage"]["input_tokens"].as_u64().unwrap_or(0);
                self.output = json["message"]["usage"]["output_tokens"].as_u64().unwrap_or(0);
                Some(event_stream::chunk(&data))
            }
            Some("message_delta") => {
                self.output = json["usage"]["output_tokens"].as_u64().unwrap_or(self.output);
                Some(event_stream::chunk(&data))
            }
            Some("message_stop") => {
                // As Bedrock writes it: `type` first, the metrics after it.
                let metrics = invocation_metrics(self.input, self.output);
                let event = format!(r#"{{"type":"message_stop","amazon-bedrock-invocationMetrics":{metrics}}}"#);
                Some(event_stream::chunk(&event))
            }
            _ => Some(event_stream::chunk(&data)),
        }
    }
}

/// What Bedrock adds to the last event of a stream.
pub fn invocation_metrics(input: u64, output: u64) -> Value {
    serde_json::json!({
        "inputTokenCount": input,
        "outputTokenCount": output,
        "invocationLatency": 512,
        "firstByteLatency": 128,
    })
}

/// Bedrock's answer: an event stream (`text/event-stream` from the fake's stream steps and normal
/// stream) re-framed as `application/vnd.amazon.eventstream`, frame for frame (an SSE frame's
/// events are one body frame of messages); any other answer as it is.
pub fn to_bedrock(resp: Response<Body>) -> Response<Body> {
    let sse = resp
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !sse {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    set_event_stream_headers(&mut parts.headers);
    let mut reframer = Reframer::default();
    let frames = futures_util::StreamExt::map(BodyStream::new(body), move |frame| {
        frame.map(|f| match f.into_data() {
            Ok(data) => Frame::data(Bytes::from(reframer.reframe(&data))),
            Err(f) => f,
        })
    });
    Response::from_parts(parts, BodyExt::boxed(StreamBody::new(frames)))
}

fn set_event_stream_headers(headers: &mut HeaderMap) {
    headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/vnd.amazon.eventstream"),
    );
    headers.insert(
        "x-amzn-bedrock-content-type",
        http::HeaderValue::from_static("application/json"),
    );
    headers.insert("x-amzn-requestid", http::HeaderValue::from_static(REQUEST_ID));
    headers.remove("cache-control");
}

/// The events of the fake's normal Anthropic stream of `chunks` deltas, one SSE event each.
pub fn anthropic_events(chunks: usize) -> Vec<String> {
    let mut text = super::fake_provider::anthropic_stream_start().to_string();
    for i in 0..chunks {
        text.push_str(&super::fake_provider::anthropic_event(i));
    }
    text.push_str(&super::fake_provider::anthropic_stream_end(chunks));
    text.split_inclusive("\n\n").map(str::to_string).collect()
}

/// Bedrock's stream of `chunks` deltas that fails after its first `after` events with `last`
/// (an exception message, or a message whose checksum is broken), then ends.
pub fn failing_bedrock_stream(chunks: usize, after: usize, last: Vec<u8>) -> Response<Body> {
    let mut reframer = Reframer::default();
    let first: Vec<u8> = anthropic_events(chunks)
        .iter()
        .take(after)
        .flat_map(|e| reframer.reframe(e.as_bytes()))
        .collect();
    let head = (!first.is_empty()).then(|| Ok(Frame::data(Bytes::from(first))));
    let last = futures_util::stream::once(async move {
        // The first events reach the wire (and rebound's commit point) on their own.
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok::<_, std::io::Error>(Frame::data(Bytes::from(last)))
    });
    let stream = futures_util::StreamExt::chain(futures_util::stream::iter(head), last);
    let mut resp = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    set_event_stream_headers(resp.headers_mut());
    resp
}

/// The message Bedrock would send as event `index` (0 for the first) of a stream of `chunks`
/// deltas (the last one when `index` is past the end).
pub fn bedrock_message(chunks: usize, index: usize) -> Vec<u8> {
    let events = anthropic_events(chunks);
    let mut reframer = Reframer::default();
    let mut message = Vec::new();
    for event in events.iter().take(index + 1) {
        message = reframer.reframe(event.as_bytes());
    }
    message
}

/// A JSON body.
pub fn json(body: String, headers: Vec<(String, String)>) -> Response<Body> {
    let mut resp = json_response(StatusCode::OK, body);
    super::fake_provider::add_headers(&mut resp, headers);
    resp
}

/// An empty body (for a response whose body is elsewhere).
pub fn empty() -> Body {
    full(String::new())
}
