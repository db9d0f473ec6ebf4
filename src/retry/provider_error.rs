//! Provider error bodies: what class of failure an upstream's error response is, and the delay its
//! body gives, read from the status, the headers and at most [`MAX_ERROR_BODY`] bytes of the body.
//!
//! Pure: no I/O, no clock, no global state; nothing here panics on any input (a body may be
//! truncated, not UTF-8, not JSON, nested without end or full of huge numbers).
//!
//! What is read, first match wins (`docs/provider-errors.md` has the full table):
//! 1. Bedrock: the error type in `x-amzn-errortype` (`ThrottlingException:http://...`), else the
//!    body's `__type` (`com.amazon.coral.service#ThrottlingException`), with the body's `message`.
//! 2. A JSON body (an object, or an array whose first element is one: Vertex streams wrap their
//!    error in `[..]`):
//!    - Anthropic, `{"type":"error","error":{"type":..,"message":..}}`: the error's `type`;
//!    - Gemini / Vertex AI, `{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[..]}}`
//!      (an `error` with a string `status` or a `details` array): the `QuotaFailure`, `ErrorInfo`
//!      and `RetryInfo` details, then the canonical `status` (and the message for the context
//!      window);
//!    - OpenAI and Azure OpenAI, `{"error":{"code":..,"type":..,"message":..}}`: the error's `code`
//!      and `type`, Azure's `innererror.code`;
//!    - a Gemini safety block (`promptFeedback.blockReason`, a candidate's `finishReason`).
//! 3. The status alone ([`ErrorClass`] says which status is which class).
//!
//! A body signal wins over the status: it is the more specific of the two (a 429 saying
//! `insufficient_quota` is a quota used up, not a rate limit). Header delays (`retry-after`, the
//! reset headers) are read by [`super::retry_after::parse_hint`], and win over [`ErrorSignal::body_delay`].

use std::time::Duration;

use http::{HeaderMap, HeaderName, StatusCode};
use serde_json::{Map, Value};

use super::retry_after::parse_go_duration;

/// Bytes of an error body that are read to classify it (a larger body is classified by its
/// status and headers alone). Never applied to a success body: only error responses are read.
pub(crate) const MAX_ERROR_BODY: usize = 16 * 1024;

/// Bedrock's error type (`ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/`).
const X_AMZN_ERRORTYPE: HeaderName = HeaderName::from_static("x-amzn-errortype");
/// Sent by Azure OpenAI (API Management) on every response.
const APIM_REQUEST_ID: HeaderName = HeaderName::from_static("apim-request-id");
/// Sent by Azure OpenAI on every response.
const X_MS_REGION: HeaderName = HeaderName::from_static("x-ms-region");

/// What kind of failure an error response is: what a retry or a failover can do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorClass {
    /// Rate limited: come back after the reset. A 429; Anthropic `rate_limit_error`; OpenAI
    /// `rate_limit_exceeded`; Azure's `"code": "429"`; Bedrock `ThrottlingException`; Gemini /
    /// Vertex `RESOURCE_EXHAUSTED` without a per-day quota (a per-minute `QuotaFailure`, a
    /// `RetryInfo`, or nothing).
    RateLimited,
    /// A quota used up: not worth retrying on this credential before its reset. OpenAI
    /// `insufficient_quota` and `billing_hard_limit_reached`; a Gemini / Vertex `QuotaFailure`
    /// whose `quotaId` or `quotaMetric` says per day (`PerDay`, `per_day`); Anthropic
    /// `billing_error`, a `rate_limit_error` whose `details.error_code` is
    /// `enforced_spend_limit_reached`, and the spent-credit or usage-limit messages; Bedrock
    /// `ServiceQuotaExceededException` and a `ThrottlingException` that says "per day".
    Exhausted,
    /// The provider is out of capacity for everyone: a 529; Anthropic `overloaded_error`; Bedrock
    /// `ServiceUnavailableException` and `ModelNotReadyException`; a Gemini / Vertex
    /// `MODEL_CAPACITY_EXHAUSTED` (`ErrorInfo.reason`), or `UNAVAILABLE` saying "overloaded".
    Overloaded,
    /// The prompt does not fit the model's context window (a larger one may answer): OpenAI
    /// `context_length_exceeded`; Anthropic "prompt is too long" and "exceed context limit";
    /// Gemini / Vertex `INVALID_ARGUMENT` "exceeds the maximum number of tokens" or "but model only
    /// supports up to"; Bedrock `ValidationException` "Input is too long" (all: [`says_context_too_long`]).
    ContextLength,
    /// A content-policy refusal, never retried or failed over: OpenAI
    /// `content_policy_violation`, OpenAI / Azure `content_filter`, Azure `innererror.code`
    /// `ResponsibleAIPolicyViolation`; a Gemini `promptFeedback.blockReason` or a safety
    /// `finishReason` in an error body.
    ContentPolicy,
    /// Transient trouble on the way or at the server: 408 (the server gave up waiting for the
    /// request: RFC 9110 lets a client repeat it), 500, 502, 503, 504, Cloudflare's 520..=524, the
    /// informal proxy timeouts 598 and 599; OpenAI `server_error`; Anthropic `api_error`; Bedrock
    /// `InternalServerException` and `ModelTimeoutException`; Gemini / Vertex `UNAVAILABLE`,
    /// `INTERNAL` and `DEADLINE_EXCEEDED`.
    Transient,
    /// Anything else: the request itself is wrong or not allowed (400, 401, 403, 404, 409, 413,
    /// 422, 501, ...). 409 is here because a conflict is a state of the resource that repeating
    /// the request does not change (`retry::policy` never retries it either).
    Permanent,
}

/// What [`classify`] and [`read`] read from an error response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ErrorSignal {
    pub(crate) class: ErrorClass,
    /// A delay the *body* gave: Gemini / Vertex `RetryInfo.retryDelay` (`"33s"`, `"1.5s"`), at most
    /// [`super::retry_after::MAX_HINT`]. Header hints are parsed elsewhere
    /// ([`super::retry_after::parse_hint`]) and win over this. Always `None` for
    /// [`ErrorClass::Exhausted`]: Google sends a short `retryDelay` with a per-day quota, which is
    /// not that quota's reset.
    pub(crate) body_delay: Option<Duration>,
    /// Which shape decided the class: `"openai"`, `"azure"`, `"anthropic"`, `"gemini"` (Gemini API
    /// and Vertex AI), `"bedrock"`, `"cloudflare"` (a 520..=524 without a body signal), or
    /// `"status"` when only the status decided. For logs.
    pub(crate) shape: &'static str,
}

impl ErrorSignal {
    fn new(class: ErrorClass, shape: &'static str) -> ErrorSignal {
        ErrorSignal {
            class,
            body_delay: None,
            shape,
        }
    }
}

/// Classifies an error response, and gives the provider's own message in the body
/// (`error.message`, Bedrock's `message`, an `error` that is a string) as it came: for dead
/// letters, which keep it redacted. `body` is its first bytes, at most [`MAX_ERROR_BODY`]
/// (possibly truncated: a body that does not parse is classified by its status and headers); a
/// longer slice is not read at all. Meant for error statuses; any other status falls back to
/// [`ErrorClass::Permanent`] unless the body says otherwise.
pub(crate) fn read(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> (ErrorSignal, Option<ProviderMessage>) {
    let json = parse_body(body);
    let json = json.as_ref();
    let signal = bedrock(headers, json)
        .or_else(|| json.and_then(|object| from_body(object, headers, status)))
        .unwrap_or_else(|| by_status(status));
    (signal, json.and_then(message_of))
}

/// [`read`]'s class alone (an in-band error's, which carries no message worth keeping).
pub(crate) fn classify(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> ErrorSignal {
    read(status, headers, body).0
}

/// A provider's error message, as its error body gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProviderMessage(pub(crate) std::sync::Arc<str>);

fn message_of(object: &Map<String, Value>) -> Option<ProviderMessage> {
    let text = match object.get("error") {
        Some(Value::Object(e)) => str_field(e, "message"),
        Some(Value::String(e)) => Some(e.as_str()),
        _ => None,
    }
    .or_else(|| str_field(object, "message").or_else(|| str_field(object, "Message")))?;
    let text = text.trim();
    (!text.is_empty()).then(|| ProviderMessage(text.into()))
}

/// The class a status stands for when nothing else says more.
fn by_status(status: StatusCode) -> ErrorSignal {
    match status.as_u16() {
        429 => ErrorSignal::new(ErrorClass::RateLimited, "status"),
        529 => ErrorSignal::new(ErrorClass::Overloaded, "status"),
        520..=524 => ErrorSignal::new(ErrorClass::Transient, "cloudflare"),
        408 | 500 | 502 | 503 | 504 | 598 | 599 => ErrorSignal::new(ErrorClass::Transient, "status"),
        _ => ErrorSignal::new(ErrorClass::Permanent, "status"),
    }
}

/// The body as a JSON object: the body itself, or the first element of a top-level array.
fn parse_body(body: &[u8]) -> Option<Map<String, Value>> {
    if body.is_empty() || body.len() > MAX_ERROR_BODY {
        return None;
    }
    // serde_json refuses nesting deeper than 128 levels with an error, never a stack overflow.
    let value = match serde_json::from_slice::<Value>(body).ok()? {
        Value::Array(items) => items.into_iter().next()?,
        value => value,
    };
    match value {
        Value::Object(object) => Some(object),
        _ => None,
    }
}

fn str_field<'a>(object: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    object.get(name).and_then(Value::as_str)
}

/// A Bedrock error type: from `x-amzn-errortype`, else the body's `__type`; the part before a
/// `:` (the header's namespace URL) and after a `#` (a Coral namespace).
fn bedrock(headers: &HeaderMap, json: Option<&Map<String, Value>>) -> Option<ErrorSignal> {
    let header = headers.get(X_AMZN_ERRORTYPE).and_then(|v| v.to_str().ok());
    let raw = header.or_else(|| json.and_then(|o| str_field(o, "__type")))?;
    let raw = raw.split_once(':').map_or(raw, |(name, _)| name);
    let name = raw.rsplit_once('#').map_or(raw, |(_, name)| name).trim();
    let message = json
        .and_then(|o| str_field(o, "message").or_else(|| str_field(o, "Message")))
        .unwrap_or("");
    let class = match name {
        // "Too many tokens per day, please wait before trying again."
        "ThrottlingException" if contains_ignore_case(message, "per day") => ErrorClass::Exhausted,
        "ThrottlingException" => ErrorClass::RateLimited,
        "ServiceQuotaExceededException" => ErrorClass::Exhausted,
        "ServiceUnavailableException" | "ModelNotReadyException" => ErrorClass::Overloaded,
        "InternalServerException" | "ModelTimeoutException" => ErrorClass::Transient,
        "ValidationException" if says_context_too_long(message) => ErrorClass::ContextLength,
        _ => return None,
    };
    Some(ErrorSignal::new(class, "bedrock"))
}

/// The class a JSON error body names, by its shape.
fn from_body(object: &Map<String, Value>, headers: &HeaderMap, status: StatusCode) -> Option<ErrorSignal> {
    let Some(error) = object.get("error").and_then(Value::as_object) else {
        return gemini_blocked(object);
    };
    if str_field(object, "type") == Some("error") {
        return anthropic(error);
    }
    if error.get("status").is_some_and(Value::is_string) || error.get("details").is_some_and(Value::is_array) {
        return google(error, status);
    }
    openai(error, headers).or_else(|| gemini_blocked(error))
}

/// Anthropic: `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`.
fn anthropic(error: &Map<String, Value>) -> Option<ErrorSignal> {
    let message = str_field(error, "message").unwrap_or("");
    let spend_limit = error
        .get("details")
        .and_then(|d| d.get("error_code"))
        .and_then(Value::as_str)
        == Some("enforced_spend_limit_reached");
    let class = match str_field(error, "type")? {
        "overloaded_error" => ErrorClass::Overloaded,
        "rate_limit_error" if spend_limit => ErrorClass::Exhausted,
        "rate_limit_error" => ErrorClass::RateLimited,
        "billing_error" => ErrorClass::Exhausted,
        "api_error" => ErrorClass::Transient,
        "invalid_request_error" if says_context_too_long(message) => ErrorClass::ContextLength,
        // "Your credit balance is too low to access the Anthropic API. ..." and "You have reached
        // your specified API usage limits. You will regain access on 2026-04-01 at 00:00 UTC."
        "invalid_request_error"
            if contains_ignore_case(message, "credit balance is too low")
                || contains_ignore_case(message, "reached your specified api usage limits") =>
        {
            ErrorClass::Exhausted
        }
        _ => return None,
    };
    Some(ErrorSignal::new(class, "anthropic"))
}

/// Gemini API and Vertex AI (`google.rpc.Status`): `{"error":{"code":429,"message":"..",
/// "status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure",
/// "violations":[{"quotaId":"GenerateRequestsPerDayPerProjectPerModel-FreeTier",..}]},
/// {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"33s"}]}}`.
fn google(error: &Map<String, Value>, status: StatusCode) -> Option<ErrorSignal> {
    let mut delay = None;
    // None: no QuotaFailure; Some(per_day).
    let mut quota: Option<bool> = None;
    let mut capacity = false;
    let details = error
        .get("details")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    for detail in details {
        let kind = detail.get("@type").and_then(Value::as_str).unwrap_or("");
        if kind.ends_with("google.rpc.RetryInfo") {
            let parsed = detail
                .get("retryDelay")
                .and_then(Value::as_str)
                .and_then(parse_retry_delay);
            delay = delay.or(parsed);
        } else if kind.ends_with("google.rpc.QuotaFailure") {
            quota = Some(quota == Some(true) || violations_per_day(detail));
        } else if kind.ends_with("google.rpc.ErrorInfo") {
            capacity |= detail.get("reason").and_then(Value::as_str) == Some("MODEL_CAPACITY_EXHAUSTED");
        }
    }
    let message = str_field(error, "message").unwrap_or("");
    let class = match (quota, str_field(error, "status").unwrap_or("")) {
        // A per-day quota is used up whatever else the body says, a short retryDelay included.
        (Some(true), _) => return Some(ErrorSignal::new(ErrorClass::Exhausted, "gemini")),
        _ if capacity => Some(ErrorClass::Overloaded),
        (Some(false), _) | (None, "RESOURCE_EXHAUSTED") => Some(ErrorClass::RateLimited),
        (None, "UNAVAILABLE") if contains_ignore_case(message, "overloaded") => Some(ErrorClass::Overloaded),
        (None, "UNAVAILABLE" | "INTERNAL" | "DEADLINE_EXCEEDED") => Some(ErrorClass::Transient),
        (None, "INVALID_ARGUMENT") if says_context_too_long(message) => Some(ErrorClass::ContextLength),
        (None, _) => None,
    };
    // Else a safety block; else a delay without a class of its own keeps the status's class.
    let class = match class {
        Some(class) => class,
        None => match gemini_blocked(error) {
            Some(blocked) => return Some(blocked),
            None if delay.is_some() => by_status(status).class,
            None => return None,
        },
    };
    Some(ErrorSignal {
        class,
        body_delay: delay,
        shape: "gemini",
    })
}

/// Whether a `QuotaFailure` detail names a per-day quota (`quotaId`
/// `GenerateRequestsPerDayPerProjectPerModel-FreeTier`, `quotaMetric` `..._per_day`).
fn violations_per_day(detail: &Value) -> bool {
    let Some(violations) = detail.get("violations").and_then(Value::as_array) else {
        return false;
    };
    violations.iter().any(|violation| {
        ["quotaId", "quotaMetric"].iter().any(|field| {
            violation
                .get(*field)
                .and_then(Value::as_str)
                .is_some_and(|name| contains_ignore_case(name, "perday") || contains_ignore_case(name, "per_day"))
        })
    })
}

/// A Gemini safety block in an error body: `promptFeedback.blockReason`, or a candidate whose
/// `finishReason` is a safety one.
fn gemini_blocked(object: &Map<String, Value>) -> Option<ErrorSignal> {
    let block_reason = object
        .get("promptFeedback")
        .and_then(|f| f.get("blockReason"))
        .and_then(Value::as_str)
        .is_some_and(|reason| !reason.is_empty() && reason != "BLOCK_REASON_UNSPECIFIED");
    let unsafe_candidate = || {
        object
            .get("candidates")
            .and_then(Value::as_array)
            .is_some_and(|candidates| {
                candidates.iter().any(|c| {
                    matches!(
                        c.get("finishReason").and_then(Value::as_str),
                        Some("SAFETY" | "PROHIBITED_CONTENT" | "BLOCKLIST" | "SPII" | "IMAGE_SAFETY")
                    )
                })
            })
    };
    (block_reason || unsafe_candidate()).then(|| ErrorSignal::new(ErrorClass::ContentPolicy, "gemini"))
}

/// OpenAI and Azure OpenAI: `{"error":{"message":"..","type":"insufficient_quota","param":null,
/// "code":"insufficient_quota"}}`; Azure adds `innererror` and uses numeric codes (`"429"`).
fn openai(error: &Map<String, Value>, headers: &HeaderMap) -> Option<ErrorSignal> {
    let code = str_field(error, "code");
    let kind = str_field(error, "type");
    let is = |name: &str| code == Some(name) || kind == Some(name);
    let inner_code = error
        .get("innererror")
        .and_then(|i| i.get("code"))
        .and_then(Value::as_str);
    let message = str_field(error, "message").unwrap_or("");
    let azure = error.contains_key("innererror")
        || code.is_some_and(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()))
        || headers.contains_key(APIM_REQUEST_ID)
        || headers.contains_key(X_MS_REGION);
    let class = if is("insufficient_quota") || is("billing_hard_limit_reached") {
        ErrorClass::Exhausted
    } else if is("context_length_exceeded") || (kind == Some("invalid_request_error") && says_context_too_long(message))
    {
        ErrorClass::ContextLength
    } else if is("content_policy_violation")
        || is("content_filter")
        || inner_code == Some("ResponsibleAIPolicyViolation")
    {
        ErrorClass::ContentPolicy
    } else if is("rate_limit_exceeded") || (azure && code == Some("429")) {
        ErrorClass::RateLimited
    } else if is("server_error") {
        ErrorClass::Transient
    } else {
        return None;
    };
    Some(ErrorSignal::new(class, if azure { "azure" } else { "openai" }))
}

/// Phrases of the providers' "the prompt does not fit" messages (compared ignoring ASCII case).
const CONTEXT_PHRASES: [&str; 6] = [
    // Anthropic, and Claude on Bedrock: "prompt is too long: 208310 tokens > 200000 maximum".
    "prompt is too long",
    // Bedrock: "Input is too long for requested model."
    "input is too long",
    // Anthropic: "input length and `max_tokens` exceed context limit: 198000 + 8192 > 200000, ..".
    "exceed context limit",
    // OpenAI-style wording, also from other models on Bedrock: "This model's maximum context
    // length is 8192 tokens."
    "maximum context length",
    // Gemini / Vertex: "The input token count (1200293) exceeds the maximum number of tokens
    // allowed (1048576)."
    "exceeds the maximum number of tokens",
    // Vertex: "Unable to submit request because the input token count is 1251952 but model only
    // supports up to 1048576."
    "but model only supports up to",
];

/// Whether an error message says the prompt does not fit the model's context window.
fn says_context_too_long(message: &str) -> bool {
    CONTEXT_PHRASES
        .iter()
        .any(|phrase| contains_ignore_case(message, phrase))
}

/// Whether `haystack` contains `needle`, ignoring ASCII case; no allocation.
fn contains_ignore_case(haystack: &str, needle: &str) -> bool {
    let needle = needle.as_bytes();
    needle.is_empty()
        || haystack
            .as_bytes()
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

/// Parses a protobuf `Duration` in its JSON form, as `RetryInfo.retryDelay` carries it: decimal
/// seconds with an `s` suffix (`"33s"`, `"1.500s"`, `"0.5s"`, `"45.837906927s"`). A sign, an
/// exponent, spaces, another unit or no digits at all is refused (`None`); digits past
/// nanoseconds are truncated; a huge value saturates at [`super::retry_after::MAX_HINT`].
fn parse_retry_delay(value: &str) -> Option<Duration> {
    let number = value.strip_suffix('s')?;
    let digits = number.bytes().filter(u8::is_ascii_digit).count();
    let dots = number.bytes().filter(|&b| b == b'.').count();
    if digits == 0 || dots > 1 || digits + dots != number.len() {
        return None;
    }
    // Now exactly one Go duration term in seconds: the shared parser does the arithmetic.
    parse_go_duration(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::retry_after::MAX_HINT;
    use http::HeaderValue;
    use proptest::prelude::*;

    use ErrorClass::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn status(code: u16) -> StatusCode {
        StatusCode::from_u16(code).unwrap()
    }

    /// Classifies a body with no headers.
    fn body(code: u16, body: &str) -> ErrorSignal {
        classify(status(code), &HeaderMap::new(), body.as_bytes())
    }

    fn signal(class: ErrorClass, shape: &'static str) -> ErrorSignal {
        ErrorSignal::new(class, shape)
    }

    fn delayed(class: ErrorClass, shape: &'static str, delay: Duration) -> ErrorSignal {
        ErrorSignal {
            class,
            body_delay: Some(delay),
            shape,
        }
    }

    // Recorded bodies, in the providers' documented formats.

    const OPENAI_INSUFFICIENT_QUOTA: &str = r#"{
    "error": {
        "message": "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
        "type": "insufficient_quota",
        "param": null,
        "code": "insufficient_quota"
    }
}"#;
    const OPENAI_RATE_LIMIT: &str = r#"{"error":{"message":"Rate limit reached for gpt-4o in organization org-abc123 on tokens per min (TPM): Limit 30000, Used 29500, Requested 1200. Please try again in 1.4s. Visit https://platform.openai.com/account/rate-limits to learn more.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#;
    const OPENAI_CONTEXT: &str = r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130532 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
    const OPENAI_CONTENT_POLICY: &str = r#"{"error":{"code":"content_policy_violation","message":"Your request was rejected as a result of our safety system. Your prompt may contain text that is not allowed by our safety system.","param":null,"type":"invalid_request_error"}}"#;
    const OPENAI_SERVER_ERROR: &str = r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#;
    const OPENAI_BILLING_LIMIT: &str = r#"{"error":{"code":"billing_hard_limit_reached","message":"Billing hard limit has been reached","param":null,"type":"invalid_request_error"}}"#;
    const OPENAI_INVALID_KEY: &str = r#"{"error":{"message":"Incorrect API key provided: sk-abc***def. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}"#;

    const AZURE_CONTENT_FILTER: &str = r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry. To learn more about our content filtering policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":{"hate":{"filtered":false,"severity":"safe"},"jailbreak":{"filtered":true,"detected":true},"self_harm":{"filtered":false,"severity":"safe"},"sexual":{"filtered":false,"severity":"safe"},"violence":{"filtered":false,"severity":"safe"}}}}}"#;
    const AZURE_INNER_ONLY: &str = r#"{"error":{"message":"The response was filtered.","type":null,"param":"prompt","code":"400","innererror":{"code":"ResponsibleAIPolicyViolation"}}}"#;
    const AZURE_RATE_LIMIT: &str = r#"{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 6 seconds. Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit."}}"#;
    const AZURE_DEPLOYMENT_NOT_FOUND: &str = r#"{"error":{"code":"DeploymentNotFound","message":"The API deployment for this resource does not exist. If you created the deployment within the last 5 minutes, please wait a moment and try again."}}"#;

    const ANTHROPIC_OVERLOADED: &str = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}"#;
    const ANTHROPIC_RATE_LIMIT: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization (5d2b1f7c-0e5e-4b8f-9e54-1a2b3c4d5e6f) of 50,000 input tokens per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits."},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}"#;
    const ANTHROPIC_SPEND_LIMIT: &str = r#"{"type":"error","error":{"type":"rate_limit_error","message":"Your organization has reached its monthly spend limit.","details":{"error_code":"enforced_spend_limit_reached"}},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}"#;
    const ANTHROPIC_API_ERROR: &str =
        r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#;
    const ANTHROPIC_PROMPT_TOO_LONG: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}"#;
    const ANTHROPIC_CONTEXT_LIMIT: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"input length and `max_tokens` exceed context limit: 198000 + 8192 > 200000, decrease input length or `max_tokens` and try again"}}"#;
    const ANTHROPIC_CREDIT: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}"#;
    const ANTHROPIC_USAGE_LIMIT: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"You have reached your specified API usage limits. You will regain access on 2026-04-01 at 00:00 UTC."},"request_id":"req_011CZLrUfBVkVHn5T6EqQaf7"}"#;
    const ANTHROPIC_BILLING: &str = r#"{"type":"error","error":{"type":"billing_error","message":"There's an issue with your billing information."}}"#;
    const ANTHROPIC_BAD_REQUEST: &str = r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages: roles must alternate between \"user\" and \"assistant\""}}"#;

    const GEMINI_PER_DAY: &str = r#"{
  "error": {
    "code": 429,
    "message": "You exceeded your current quota, please check your plan and billing details. For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.\n* Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: 50, model: gemini-2.0-flash-exp\nPlease retry in 33.005104466s.",
    "status": "RESOURCE_EXHAUSTED",
    "details": [
      {
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [
          {
            "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
            "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
            "quotaDimensions": {"location": "global", "model": "gemini-2.0-flash-exp"},
            "quotaValue": "50"
          }
        ]
      },
      {
        "@type": "type.googleapis.com/google.rpc.Help",
        "links": [{"description": "Learn more about Gemini API quotas", "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}]
      },
      {
        "@type": "type.googleapis.com/google.rpc.RetryInfo",
        "retryDelay": "33s"
      }
    ]
  }
}"#;
    const GEMINI_PER_MINUTE: &str = r#"{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details.\n* Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_input_token_count, limit: 250000, model: gemini-2.5-flash\nPlease retry in 45.837906927s.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generativelanguage.googleapis.com/generate_content_free_tier_input_token_count","quotaId":"GenerateContentInputTokensPerModelPerMinute-FreeTier","quotaDimensions":{"location":"global","model":"gemini-2.5-flash"},"quotaValue":"250000"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"45.837906927s"}]}}"#;
    const VERTEX_PER_DAY_METRIC: &str = r#"{"error":{"code":429,"message":"Quota exceeded for aiplatform.googleapis.com/generate_content_requests_per_day_per_project_per_base_model with base model: gemini-2.5-pro. Please submit a quota increase request.","status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"aiplatform.googleapis.com/generate_content_requests_per_day_per_project_per_base_model"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}]}}"#;
    const VERTEX_RESOURCE_EXHAUSTED: &str = r#"{"error":{"code":429,"message":"Resource exhausted. Please try again later. Please refer to https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429 for more details.","status":"RESOURCE_EXHAUSTED"}}"#;
    const VERTEX_STREAM_WRAPPED: &str = r#"[{
  "error": {
    "code": 429,
    "message": "Resource exhausted. Please try again later.",
    "status": "RESOURCE_EXHAUSTED",
    "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "0.5s"}]
  }
}
]"#;
    const GEMINI_CAPACITY: &str = r#"{"error":{"code":503,"message":"No capacity available for model gemini-3-pro-high on the server","status":"UNAVAILABLE","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"MODEL_CAPACITY_EXHAUSTED","domain":"cloudcode-pa.googleapis.com","metadata":{"model":"gemini-3-pro-high"}},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"40s"}]}}"#;
    const GEMINI_OVERLOADED: &str =
        r#"{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}"#;
    const GEMINI_UNAVAILABLE: &str =
        r#"{"error":{"code":503,"message":"The service is currently unavailable.","status":"UNAVAILABLE"}}"#;
    const GEMINI_INTERNAL: &str = r#"{"error":{"code":500,"message":"An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting","status":"INTERNAL"}}"#;
    const GEMINI_TOKENS: &str = r#"[{
    "error": {
      "code": 400,
      "message": "The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).",
      "errors": [
        {
          "message": "The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).",
          "domain": "global",
          "reason": "badRequest"
        }
      ],
      "status": "INVALID_ARGUMENT"
    }
  }
  ]"#;
    const VERTEX_TOKENS: &str = r#"{"error":{"code":400,"message":"Unable to submit request because the input token count is 1251952 but model only supports up to 1048576. Reduce the input token count and try again. You can also use the CountTokens API to calculate prompt token count and billable characters. Learn more: https://cloud.google.com/vertex-ai/generative-ai/docs/learn/models","status":"INVALID_ARGUMENT"}}"#;
    const GEMINI_BAD_ARGUMENT: &str = r#"{"error":{"code":400,"message":"* GenerateContentRequest.contents: contents is not specified\n","status":"INVALID_ARGUMENT"}}"#;
    const GEMINI_PERMISSION: &str = r#"{"error":{"code":403,"message":"Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.","status":"PERMISSION_DENIED"}}"#;
    const GEMINI_BLOCKED: &str = r#"{"promptFeedback":{"blockReason":"SAFETY","safetyRatings":[{"category":"HARM_CATEGORY_HARASSMENT","probability":"HIGH"}]},"usageMetadata":{"promptTokenCount":12,"totalTokenCount":12}}"#;
    const GEMINI_SAFETY_FINISH: &str = r#"{"candidates":[{"finishReason":"SAFETY","index":0,"safetyRatings":[{"category":"HARM_CATEGORY_DANGEROUS_CONTENT","probability":"HIGH","blocked":true}]}]}"#;

    const BEDROCK_THROTTLING: &str = r#"{"message":"Too many requests, please wait before trying again."}"#;
    const BEDROCK_PER_DAY: &str = r#"{"message":"Too many tokens per day, please wait before trying again."}"#;
    const BEDROCK_UNAVAILABLE: &str = r#"{"message":"Bedrock is unable to process your request."}"#;
    const BEDROCK_TOO_LONG: &str = r#"{"message":"Input is too long for requested model."}"#;
    const BEDROCK_VALIDATION: &str = r#"{"message":"The provided model identifier is invalid."}"#;
    const BEDROCK_CORAL_BODY: &str = r#"{"__type":"com.amazon.coral.service#ThrottlingException","message":"Too many tokens, please wait before trying again."}"#;

    const CLOUDFLARE_524: &str = "error code: 524";
    const CLOUDFLARE_HTML: &str = "<!DOCTYPE html>\n<html lang=\"en-US\"><head><title>api.anthropic.com | 520: Web server is returning an unknown error</title></head><body>...</body></html>";

    fn bedrock_type(name: &str) -> HeaderMap {
        headers(&[(
            "x-amzn-errortype",
            &format!("{name}:http://internal.amazon.com/coral/com.amazon.bedrock/"),
        )])
    }

    #[test]
    fn openai_bodies() {
        assert_eq!(body(429, OPENAI_INSUFFICIENT_QUOTA), signal(Exhausted, "openai"));
        assert_eq!(body(429, OPENAI_RATE_LIMIT), signal(RateLimited, "openai"));
        assert_eq!(body(400, OPENAI_CONTEXT), signal(ContextLength, "openai"));
        assert_eq!(body(400, OPENAI_CONTENT_POLICY), signal(ContentPolicy, "openai"));
        assert_eq!(body(500, OPENAI_SERVER_ERROR), signal(Transient, "openai"));
        assert_eq!(body(400, OPENAI_BILLING_LIMIT), signal(Exhausted, "openai"));
        // A code that says nothing more than the status: the status decides.
        assert_eq!(body(401, OPENAI_INVALID_KEY), signal(Permanent, "status"));
    }

    #[test]
    fn azure_bodies() {
        assert_eq!(body(400, AZURE_CONTENT_FILTER), signal(ContentPolicy, "azure"));
        assert_eq!(body(400, AZURE_INNER_ONLY), signal(ContentPolicy, "azure"));
        assert_eq!(body(429, AZURE_RATE_LIMIT), signal(RateLimited, "azure"));
        assert_eq!(body(404, AZURE_DEPLOYMENT_NOT_FOUND), signal(Permanent, "status"));
        // Azure's headers name the shape of an OpenAI-shaped body.
        let azure = headers(&[
            ("apim-request-id", "1b9a7e1c-3c5d-4c1e-9d1f-2f0b6c7d8e9f"),
            ("x-ms-region", "Sweden Central"),
        ]);
        assert_eq!(
            classify(status(400), &azure, OPENAI_CONTEXT.as_bytes()),
            signal(ContextLength, "azure")
        );
    }

    #[test]
    fn anthropic_bodies() {
        assert_eq!(body(529, ANTHROPIC_OVERLOADED), signal(Overloaded, "anthropic"));
        assert_eq!(body(429, ANTHROPIC_RATE_LIMIT), signal(RateLimited, "anthropic"));
        assert_eq!(body(429, ANTHROPIC_SPEND_LIMIT), signal(Exhausted, "anthropic"));
        assert_eq!(body(500, ANTHROPIC_API_ERROR), signal(Transient, "anthropic"));
        assert_eq!(body(400, ANTHROPIC_PROMPT_TOO_LONG), signal(ContextLength, "anthropic"));
        assert_eq!(body(400, ANTHROPIC_CONTEXT_LIMIT), signal(ContextLength, "anthropic"));
        assert_eq!(body(400, ANTHROPIC_CREDIT), signal(Exhausted, "anthropic"));
        assert_eq!(body(400, ANTHROPIC_USAGE_LIMIT), signal(Exhausted, "anthropic"));
        assert_eq!(body(402, ANTHROPIC_BILLING), signal(Exhausted, "anthropic"));
        assert_eq!(body(400, ANTHROPIC_BAD_REQUEST), signal(Permanent, "status"));
    }

    #[test]
    fn gemini_and_vertex_bodies() {
        // Per day: exhausted, and the short retryDelay is not its reset.
        assert_eq!(body(429, GEMINI_PER_DAY), signal(Exhausted, "gemini"));
        assert_eq!(body(429, VERTEX_PER_DAY_METRIC), signal(Exhausted, "gemini"));
        assert_eq!(
            body(429, GEMINI_PER_MINUTE),
            delayed(RateLimited, "gemini", Duration::new(45, 837_906_927))
        );
        assert_eq!(body(429, VERTEX_RESOURCE_EXHAUSTED), signal(RateLimited, "gemini"));
        assert_eq!(
            body(429, VERTEX_STREAM_WRAPPED),
            delayed(RateLimited, "gemini", Duration::from_millis(500))
        );
        assert_eq!(
            body(503, GEMINI_CAPACITY),
            delayed(Overloaded, "gemini", Duration::from_secs(40))
        );
        assert_eq!(body(503, GEMINI_OVERLOADED), signal(Overloaded, "gemini"));
        assert_eq!(body(503, GEMINI_UNAVAILABLE), signal(Transient, "gemini"));
        assert_eq!(body(500, GEMINI_INTERNAL), signal(Transient, "gemini"));
        assert_eq!(body(400, GEMINI_TOKENS), signal(ContextLength, "gemini"));
        assert_eq!(body(400, VERTEX_TOKENS), signal(ContextLength, "gemini"));
        assert_eq!(body(400, GEMINI_BAD_ARGUMENT), signal(Permanent, "status"));
        assert_eq!(body(403, GEMINI_PERMISSION), signal(Permanent, "status"));
        assert_eq!(body(400, GEMINI_BLOCKED), signal(ContentPolicy, "gemini"));
        assert_eq!(body(400, GEMINI_SAFETY_FINISH), signal(ContentPolicy, "gemini"));
    }

    #[test]
    fn gemini_delay_without_a_class_of_its_own_keeps_the_status() {
        let aborted = r#"{"error":{"code":409,"message":"Aborted.","status":"ABORTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"2s"}]}}"#;
        assert_eq!(body(409, aborted), delayed(Permanent, "gemini", Duration::from_secs(2)));
        // The first valid RetryInfo counts.
        let two = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"soon"},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"7s"},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"9s"}]}}"#;
        assert_eq!(body(429, two), delayed(RateLimited, "gemini", Duration::from_secs(7)));
        // A per-minute and a per-day violation: the day wins.
        let both = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"GenerateRequestsPerMinutePerProjectPerModel"},{"quotaId":"GenerateRequestsPerDayPerProjectPerModel"}]},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"20s"}]}}"#;
        assert_eq!(body(429, both), signal(Exhausted, "gemini"));
        // A safety block counts before a delay that has no class of its own.
        let blocked = r#"{"error":{"code":400,"status":"FAILED_PRECONDITION","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"2s"}],"promptFeedback":{"blockReason":"PROHIBITED_CONTENT"}}}"#;
        assert_eq!(body(400, blocked), signal(ContentPolicy, "gemini"));
    }

    #[test]
    fn bedrock_headers_and_bodies() {
        let bedrock = |name: &str, code: u16, body: &str| classify(status(code), &bedrock_type(name), body.as_bytes());
        assert_eq!(
            bedrock("ThrottlingException", 429, BEDROCK_THROTTLING),
            signal(RateLimited, "bedrock")
        );
        assert_eq!(
            bedrock("ThrottlingException", 429, BEDROCK_PER_DAY),
            signal(Exhausted, "bedrock")
        );
        assert_eq!(
            bedrock("ServiceQuotaExceededException", 400, BEDROCK_THROTTLING),
            signal(Exhausted, "bedrock")
        );
        assert_eq!(
            bedrock("ServiceUnavailableException", 503, BEDROCK_UNAVAILABLE),
            signal(Overloaded, "bedrock")
        );
        assert_eq!(
            bedrock("ModelNotReadyException", 429, BEDROCK_UNAVAILABLE),
            signal(Overloaded, "bedrock")
        );
        assert_eq!(
            bedrock("InternalServerException", 500, BEDROCK_UNAVAILABLE),
            signal(Transient, "bedrock")
        );
        assert_eq!(
            bedrock("ModelTimeoutException", 408, BEDROCK_UNAVAILABLE),
            signal(Transient, "bedrock")
        );
        assert_eq!(
            bedrock("ValidationException", 400, BEDROCK_TOO_LONG),
            signal(ContextLength, "bedrock")
        );
        assert_eq!(
            bedrock("ValidationException", 400, BEDROCK_VALIDATION),
            signal(Permanent, "status")
        );
        assert_eq!(
            bedrock("AccessDeniedException", 403, BEDROCK_VALIDATION),
            signal(Permanent, "status")
        );
        // The header alone is enough (a body that is not JSON, or none).
        assert_eq!(
            bedrock("ThrottlingException", 429, "<html>"),
            signal(RateLimited, "bedrock")
        );
        let bare = headers(&[("x-amzn-errortype", "ServiceUnavailableException")]);
        assert_eq!(classify(status(503), &bare, b""), signal(Overloaded, "bedrock"));
        // The body's __type, with a Coral namespace, when there is no header.
        assert_eq!(body(400, BEDROCK_CORAL_BODY), signal(RateLimited, "bedrock"));
        // The header wins over the body's __type.
        assert_eq!(
            classify(
                status(503),
                &bedrock_type("ServiceUnavailableException"),
                BEDROCK_CORAL_BODY.as_bytes()
            ),
            signal(Overloaded, "bedrock")
        );
        // Without a type, a Bedrock body is only its status.
        assert_eq!(body(429, BEDROCK_THROTTLING), signal(RateLimited, "status"));
    }

    #[test]
    fn cloudflare_and_proxies() {
        for code in 520..=524 {
            assert_eq!(body(code, CLOUDFLARE_524), signal(Transient, "cloudflare"), "{code}");
            assert_eq!(body(code, CLOUDFLARE_HTML), signal(Transient, "cloudflare"), "{code}");
        }
        assert_eq!(body(502, CLOUDFLARE_HTML), signal(Transient, "status"));
        assert_eq!(body(525, CLOUDFLARE_HTML), signal(Permanent, "status"));
        // A provider's body behind a Cloudflare status still decides.
        assert_eq!(body(524, ANTHROPIC_OVERLOADED), signal(Overloaded, "anthropic"));
    }

    #[test]
    fn the_status_decides_when_nothing_else_does() {
        let table: &[(u16, ErrorClass)] = &[
            (400, Permanent),
            (401, Permanent),
            (403, Permanent),
            (404, Permanent),
            (408, Transient),
            (409, Permanent),
            (413, Permanent),
            (422, Permanent),
            (429, RateLimited),
            (500, Transient),
            (501, Permanent),
            (502, Transient),
            (503, Transient),
            (504, Transient),
            (505, Permanent),
            (529, Overloaded),
            (598, Transient),
            (599, Transient),
            (200, Permanent),
        ];
        for &(code, class) in table {
            assert_eq!(body(code, ""), signal(class, "status"), "{code}");
            assert_eq!(
                body(code, "upstream connect error or disconnect/reset before headers"),
                signal(class, "status"),
                "{code}"
            );
            assert_eq!(body(code, r#"{"message":"no"}"#), signal(class, "status"), "{code}");
        }
    }

    #[test]
    fn a_body_signal_beats_a_contradicting_status() {
        assert_eq!(body(429, OPENAI_INSUFFICIENT_QUOTA).class, Exhausted);
        assert_eq!(body(400, OPENAI_CONTEXT).class, ContextLength);
        assert_eq!(body(500, OPENAI_CONTEXT).class, ContextLength);
        assert_eq!(
            classify(status(503), &bedrock_type("ServiceUnavailableException"), b"").class,
            Overloaded
        );
        assert_eq!(body(429, GEMINI_PER_DAY).class, Exhausted);
        assert_eq!(body(503, ANTHROPIC_RATE_LIMIT).class, RateLimited);
        // An in-band error on a 200 (what the commit point reads) is classified by its body.
        assert_eq!(body(200, ANTHROPIC_OVERLOADED), signal(Overloaded, "anthropic"));
    }

    #[test]
    fn a_body_over_the_limit_is_not_read() {
        let mut big = OPENAI_INSUFFICIENT_QUOTA.to_string();
        big.push_str(&" ".repeat(MAX_ERROR_BODY + 1 - big.len()));
        assert_eq!(big.len(), MAX_ERROR_BODY + 1);
        assert_eq!(body(429, &big), signal(RateLimited, "status"));
        big.pop();
        assert_eq!(body(429, &big), signal(Exhausted, "openai"));
        // Headers are still read.
        let over = format!("{BEDROCK_PER_DAY}{}", " ".repeat(MAX_ERROR_BODY));
        assert_eq!(
            classify(status(429), &bedrock_type("ThrottlingException"), over.as_bytes()),
            signal(RateLimited, "bedrock")
        );
    }

    /// Every recorded body with the status and headers it came with.
    fn recorded() -> Vec<(u16, HeaderMap, &'static str)> {
        let none = HeaderMap::new;
        let mut all = vec![(429, bedrock_type("ThrottlingException"), BEDROCK_PER_DAY)];
        for (code, body) in [
            (429, OPENAI_INSUFFICIENT_QUOTA),
            (429, OPENAI_RATE_LIMIT),
            (400, OPENAI_CONTEXT),
            (400, OPENAI_CONTENT_POLICY),
            (500, OPENAI_SERVER_ERROR),
            (400, AZURE_CONTENT_FILTER),
            (429, AZURE_RATE_LIMIT),
            (529, ANTHROPIC_OVERLOADED),
            (429, ANTHROPIC_SPEND_LIMIT),
            (400, ANTHROPIC_PROMPT_TOO_LONG),
            (429, GEMINI_PER_DAY),
            (429, GEMINI_PER_MINUTE),
            (429, VERTEX_STREAM_WRAPPED),
            (503, GEMINI_CAPACITY),
            (400, GEMINI_TOKENS),
            (400, GEMINI_BLOCKED),
            (400, BEDROCK_CORAL_BODY),
        ] {
            all.push((code, none(), body));
        }
        all
    }

    #[test]
    fn a_truncated_body_is_classified_by_status_and_headers() {
        for (code, headers, text) in recorded() {
            let bytes = text.as_bytes();
            let without_body = classify(status(code), &headers, b"");
            let whole = classify(status(code), &headers, bytes);
            assert_ne!(whole, without_body, "{text}");
            for cut in 0..bytes.len() {
                assert_eq!(
                    classify(status(code), &headers, &bytes[..cut]),
                    without_body,
                    "{text} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn garbage_never_panics() {
        let deep_array = "[".repeat(MAX_ERROR_BODY);
        let deep_object = r#"{"error":"#.repeat(1000);
        let huge_number = format!(
            r#"{{"error":{{"code":1{},"status":"RESOURCE_EXHAUSTED"}}}}"#,
            "0".repeat(5000)
        );
        let inputs: Vec<Vec<u8>> = vec![
            vec![0xff, 0xfe, 0x00, 0x7b],
            b"\xef\xbb\xbf{\"error\":{\"code\":\"insufficient_quota\"}}".to_vec(),
            deep_array.into_bytes(),
            deep_object.into_bytes(),
            huge_number.into_bytes(),
            br#"{"error":{"code":1e999999,"status":"UNAVAILABLE"}}"#.to_vec(),
            br#"{"error":{"code":-1,"status":"UNAVAILABLE","details":"not a list"}}"#.to_vec(),
            br#"{"error":{"status":"RESOURCE_EXHAUSTED","details":[null,1,"x",{"@type":7},{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":99}]}}"#.to_vec(),
            br#"{"error":{"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":{"quotaId":"PerDay"}}]}}"#.to_vec(),
            br#"{"error":null}"#.to_vec(),
            br#"{"error":"Too Many Requests"}"#.to_vec(),
            br#"{"type":"error","error":{"type":42}}"#.to_vec(),
            br#"{"type":"error","error":{"type":"rate_limit_error","details":[1,2]}}"#.to_vec(),
            br#"{"__type":17,"message":null}"#.to_vec(),
            br#"{"candidates":"SAFETY","promptFeedback":{"blockReason":null}}"#.to_vec(),
            br#"[]"#.to_vec(),
            br#"[1, {"error":{"code":"insufficient_quota"}}]"#.to_vec(),
            br#""just a string""#.to_vec(),
            b"null".to_vec(),
        ];
        for input in &inputs {
            for code in [200, 400, 429, 503, 529, 999] {
                let _ = classify(status(code), &HeaderMap::new(), input);
                let _ = classify(status(code), &bedrock_type("ThrottlingException"), input);
            }
        }
        // A header value that is not ASCII is ignored; an empty one names nothing.
        let mut odd = HeaderMap::new();
        odd.insert(
            X_AMZN_ERRORTYPE,
            HeaderValue::from_bytes(b"Throttling\xffException").unwrap(),
        );
        assert_eq!(classify(status(429), &odd, b""), signal(RateLimited, "status"));
        odd.insert(X_AMZN_ERRORTYPE, HeaderValue::from_static(":"));
        assert_eq!(classify(status(503), &odd, b""), signal(Transient, "status"));
        odd.insert(
            X_AMZN_ERRORTYPE,
            HeaderValue::from_static("a#b#ThrottlingException:x:y"),
        );
        assert_eq!(classify(status(400), &odd, b""), signal(RateLimited, "bedrock"));
    }

    #[test]
    fn retry_delay_parsing() {
        let ok: &[(&str, Duration)] = &[
            ("0s", Duration::ZERO),
            ("33s", Duration::from_secs(33)),
            ("1.5s", Duration::from_millis(1500)),
            ("1.500s", Duration::from_millis(1500)),
            ("0.5s", Duration::from_millis(500)),
            (".5s", Duration::from_millis(500)),
            ("45.837906927s", Duration::new(45, 837_906_927)),
            ("0.0000000019s", Duration::from_nanos(1)),
            ("99999999999s", MAX_HINT),
            ("99999999999999999999999999999999999999999999.9s", MAX_HINT),
        ];
        for (text, want) in ok {
            assert_eq!(parse_retry_delay(text), Some(*want), "{text}");
        }
        for bad in [
            "", "s", ".s", "abc", "-3s", "+3s", "3", "3m", "1m30s", "1.5.5s", "1e3s", " 3s", "3s ", "3 s", "NaNs",
            "infs", "3ss", "٣s",
        ] {
            assert_eq!(parse_retry_delay(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn contains_ignore_case_is_ascii_only_and_bounded() {
        assert!(contains_ignore_case(
            "Prompt Is Too Long: 5 tokens",
            "prompt is too long"
        ));
        assert!(!contains_ignore_case("prompt", "prompt is too long"));
        assert!(contains_ignore_case("", ""));
        assert!(contains_ignore_case("ÉPROMPT", "prompt"));
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config(256))]

        #[test]
        fn arbitrary_bytes_never_panic(
            code in 100u16..1000,
            bytes in prop::collection::vec(any::<u8>(), 0..(MAX_ERROR_BODY + 64)),
            errortype in prop::option::of("[A-Za-z#:./]{0,40}"),
        ) {
            let mut map = HeaderMap::new();
            if let Some(value) = errortype {
                map.insert(X_AMZN_ERRORTYPE, HeaderValue::from_str(&value).unwrap());
            }
            let got = classify(status(code), &map, &bytes);
            if got.class == Exhausted {
                prop_assert_eq!(got.body_delay, None);
            }
            prop_assert!(got.body_delay.is_none_or(|d| d <= MAX_HINT));
        }

        #[test]
        fn json_like_soup_never_panics(
            code in 100u16..1000,
            tokens in prop::collection::vec(prop::sample::select(vec![
                "{", "}", "[", "]", ",", ":", "\"error\"", "\"type\"", "\"error\"", "\"status\"", "\"details\"",
                "\"@type\"", "\"type.googleapis.com/google.rpc.RetryInfo\"", "\"type.googleapis.com/google.rpc.QuotaFailure\"",
                "\"retryDelay\"", "\"1.5s\"", "\"-1s\"", "\"99999999999999999999s\"", "\"violations\"", "\"quotaId\"",
                "\"PerDay\"", "\"RESOURCE_EXHAUSTED\"", "\"UNAVAILABLE\"", "\"code\"", "\"insufficient_quota\"",
                "\"__type\"", "\"message\"", "\"prompt is too long\"", "null", "1e400", "-0", "123456789012345678901234567890",
                "\"\\ud800\"", "\"\\u0000\"", "true",
            ]), 0..200),
        ) {
            let text = tokens.concat();
            let got = classify(status(code), &HeaderMap::new(), text.as_bytes());
            prop_assert!(got.body_delay.is_none_or(|d| d <= MAX_HINT));
        }

        #[test]
        fn retry_delays_never_panic_and_stay_bounded(text in "[0-9.+-]{0,30}s?") {
            if let Some(d) = parse_retry_delay(&text) {
                prop_assert!(d <= MAX_HINT);
            }
        }
    }
}
