//! Claude's family: Anthropic's Messages API and the hosts that serve it, Amazon Bedrock
//! (`/model/{id}/invoke`, `/invoke-with-response-stream`) and Vertex AI (`.../publishers/anthropic/
//! models/{m}:rawPredict`, `:streamRawPredict`). What a request to each names, its envelope for
//! each of them (where the model and `stream` go, `anthropic_version`, which headers the host
//! takes in the body), and rebound's own errors in Anthropic's shape.

use http::{HeaderMap, HeaderName, HeaderValue};

use super::envelope::{edit, json_string, model_entry, Adapted, Host, Names, Sent};
use super::named::{in_path_named, Invalid, Named, Op, Top};
use crate::config::Api;

/// `anthropic_version` on Bedrock.
pub(super) const BEDROCK_VERSION: &str = "bedrock-2023-05-31";
/// `anthropic_version` on Vertex AI.
pub(super) const VERTEX_VERSION: &str = "vertex-2023-10-16";
/// The `anthropic-version` header a request to Anthropic carries when the app's API has none.
const ANTHROPIC_VERSION: &str = "2023-06-01";

pub(super) const ANTHROPIC_VERSION_HEADER: HeaderName = HeaderName::from_static("anthropic-version");
pub(super) const ANTHROPIC_BETA_HEADER: HeaderName = HeaderName::from_static("anthropic-beta");
/// What Bedrock takes in the body (or not at all).
static NOT_TO_BEDROCK: [HeaderName; 2] = [ANTHROPIC_VERSION_HEADER, ANTHROPIC_BETA_HEADER];
/// What Vertex AI takes in the body.
static NOT_TO_VERTEX: [HeaderName; 1] = [ANTHROPIC_VERSION_HEADER];

/// What a request to a route of `api` names, when its path is one of this family's operations
/// (`None`: another path, read as any route reads it).
pub(super) fn read(api: Api, path: &str, top: &Top<'_>) -> Option<Result<Named, Invalid>> {
    match api {
        Api::Anthropic if path.ends_with("/messages/count_tokens") => Some(top.named(Op::CountTokens, false)),
        Api::Anthropic if path.ends_with("/messages") => Some(top.named(Op::Messages, top.stream)),
        Api::Bedrock => {
            let (id, action) = path.split_once("/model/").and_then(|(_, rest)| rest.rsplit_once('/'))?;
            match action {
                "invoke" => Some(in_path_named(api, Op::Messages, id, false)),
                "invoke-with-response-stream" => Some(in_path_named(api, Op::Messages, id, true)),
                _ => None,
            }
        }
        Api::VertexAnthropic => match vertex_model(path, "anthropic")? {
            ("count-tokens", "rawPredict") => Some(top.named(Op::CountTokens, false)),
            (m, "rawPredict") => Some(in_path_named(api, Op::Messages, m, false)),
            (m, "streamRawPredict") => Some(in_path_named(api, Op::Messages, m, true)),
            _ => None,
        },
        _ => None,
    }
}

/// A Vertex AI path's model and method: `.../publishers/{publisher}/models/{m}:{method}`.
fn vertex_model<'a>(path: &'a str, publisher: &str) -> Option<(&'a str, &'a str)> {
    let (_, rest) = path.split_once("/publishers/")?;
    let rest = rest.strip_prefix(publisher)?.strip_prefix("/models/")?;
    rest.split_once(':')
}

/// An Anthropic Messages request for a host of `to`'s shape.
pub(super) fn adapt(
    out: &mut Adapted,
    (op, stream): (&Op, bool),
    to: &Host<'_>,
    sent: Sent<'_>,
    model: Names<'_>,
) -> Option<()> {
    let Sent {
        api: from,
        query,
        body,
        headers,
    } = sent;
    match (op, to.api) {
        (Op::Messages, Api::Anthropic) => {
            out.path = to.v1("/messages");
            out.query = query.filter(|_| from == Api::Anthropic).map(str::to_string);
            let (remove, stream) = stream_from_path(from, stream);
            out.body = edit(body, remove, model_entry(model.body)?.into_iter().chain(stream));
            if !headers.contains_key(ANTHROPIC_VERSION_HEADER) {
                out.insert = Some((ANTHROPIC_VERSION_HEADER, HeaderValue::from_static(ANTHROPIC_VERSION)));
            }
        }
        (Op::CountTokens, Api::Anthropic) => {
            out.path = to.v1("/messages/count_tokens");
            out.query = None;
            out.body = edit(body, &["model", "anthropic_version"], model_entry(model.body)?);
            if !headers.contains_key(ANTHROPIC_VERSION_HEADER) {
                out.insert = Some((ANTHROPIC_VERSION_HEADER, HeaderValue::from_static(ANTHROPIC_VERSION)));
            }
        }
        (Op::Messages, Api::Bedrock) => {
            let id = model.path?;
            out.path = match stream {
                true => format!("/model/{id}/invoke-with-response-stream"),
                false => format!("/model/{id}/invoke"),
            };
            out.query = None;
            let beta = betas(headers).map(|b| ("anthropic_beta", b));
            let version = ("anthropic_version", json_string(BEDROCK_VERSION));
            let remove = ["model", "stream", "anthropic_version", "anthropic_beta"];
            out.body = edit(body, &remove, std::iter::once(version).chain(beta));
            out.remove = &NOT_TO_BEDROCK;
            out.reframe = stream;
        }
        (Op::Messages, Api::VertexAnthropic) => {
            let method = if stream { "streamRawPredict" } else { "rawPredict" };
            out.path = to.vertex("anthropic", model.path?, method)?;
            out.query = None;
            let version = ("anthropic_version", json_string(VERTEX_VERSION));
            let (remove, stream) = stream_from_path(from, stream);
            out.body = edit(body, remove, std::iter::once(version).chain(stream));
            out.remove = &NOT_TO_VERTEX;
        }
        (Op::CountTokens, Api::VertexAnthropic) => {
            out.path = to.vertex("anthropic", "count-tokens", "rawPredict")?;
            out.query = None;
            let version = ("anthropic_version", json_string(VERTEX_VERSION));
            out.body = edit(
                body,
                &["model", "anthropic_version"],
                model_entry(model.body)?.into_iter().chain([version]),
            );
            out.remove = &NOT_TO_VERTEX;
        }
        _ => return None,
    }
    Some(())
}

/// What a Messages body keeps and gains for a host that reads `stream` from it: a Bedrock request
/// says it in its path (its body has none: `"stream": true` is added), the others in the body
/// (kept as it is).
fn stream_from_path(from: Api, stream: bool) -> (&'static [&'static str], Option<(&'static str, String)>) {
    match from {
        Api::Bedrock => (
            &["model", "anthropic_version", "stream"],
            stream.then(|| ("stream", "true".to_string())),
        ),
        _ => (&["model", "anthropic_version"], None),
    }
}

/// The `anthropic-beta` header's values (comma-separated, possibly repeated) as a JSON array.
fn betas(headers: &HeaderMap) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all(ANTHROPIC_BETA_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect();
    (!values.is_empty()).then(|| serde_json::Value::from(values).to_string())
}

/// rebound's error `message` in Anthropic's shape, `{"type": "error", "error": {"type",
/// "message"}}` (the error type by status, as Anthropic's), with rebound's `code` in
/// `error.code` and `error.details.error_code`, and RFC 9457's members but `type`, which is
/// Anthropic's.
pub(crate) fn error_document(status: u16, (code, title): (&str, &str), message: &str) -> serde_json::Value {
    serde_json::json!({
        "type": "error",
        "error": {
            "type": error_type(status),
            "message": message,
            "code": code,
            "details": { "error_code": code },
        },
        "title": title,
        "status": status,
        "detail": message,
    })
}

/// Anthropic's error type for an HTTP status.
fn error_type(status: u16) -> &'static str {
    match status {
        400 | 405 | 409 | 422 | 431 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}
