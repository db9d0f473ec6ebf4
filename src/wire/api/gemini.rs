//! Gemini's family: the Gemini API (`/v1beta/models/{m}:{method}`) and Gemini on Vertex AI
//! (`.../publishers/google/models/{m}:{method}`). What a request to each names, its envelope for
//! each of them, and rebound's own errors in Google's shape.

use super::envelope::{Adapted, Host, Names};
use super::named::{in_path_named, Invalid, Named, Op};
use crate::config::Api;

/// What a request to a route of `api` names, when its path names a model's method (`None`:
/// another path, read as any route reads it).
pub(super) fn read(api: Api, path: &str) -> Option<Result<Named, Invalid>> {
    if !matches!(api, Api::Gemini | Api::VertexGemini) {
        return None;
    }
    let (m, method) = path
        .rsplit_once("/models/")
        .and_then(|(_, rest)| rest.split_once(':'))?;
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
        return None;
    }
    let stream = method == "streamGenerateContent";
    Some(in_path_named(api, Op::Gemini(method.into()), m, stream))
}

/// A Gemini request (`method`) for a host of `to`'s shape (the body and query as they came).
pub(super) fn adapt(out: &mut Adapted, method: &str, to: &Host<'_>, model: Names<'_>) -> Option<()> {
    match to.api {
        Api::Gemini => {
            out.path = format!("/v1beta/models/{}:{method}", model.path?);
        }
        Api::VertexGemini => {
            out.path = to.vertex("google", model.path?, method)?;
        }
        _ => return None,
    }
    Some(())
}

/// rebound's error `message` in Google's shape, `{"error": {"code", "message", "status"}}`
/// (Google's canonical status by HTTP status), rebound's `code` as `ErrorInfo.reason`, and RFC
/// 9457's members but `status`, which google-genai reads as Google's.
pub(crate) fn error_document(status: u16, (code, title): (&str, &str), message: &str) -> serde_json::Value {
    serde_json::json!({
        "error": {
            "code": status,
            "message": message,
            "status": status_name(status),
            "details": [{
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": code,
                "domain": "rebound.dev",
            }],
        },
        "type": format!("https://rebound.dev/errors/{code}"),
        "title": title,
        "detail": message,
    })
}

/// Google's canonical status for an HTTP status.
fn status_name(status: u16) -> &'static str {
    match status {
        400 | 413 | 422 | 431 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        405 => "UNIMPLEMENTED",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        502 | 503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
}
