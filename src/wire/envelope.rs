//! A request's envelope in each API of a model family, and the same request for a host of
//! another shape: the path and query, where the model is named (body or path), Anthropic's
//! `anthropic_version`, and what the answer's framing needs. Messages, tools and parameters pass
//! as they are; a path the envelope does not know is sent as it came (the host answers it).
//! Pure: no I/O.
//!
//! | API | the request names |
//! | --- | --- |
//! | `anthropic` | `POST /v1/messages` (`/v1/messages/count_tokens`), the model and `stream` in the body |
//! | `bedrock` | `POST /model/{id}/invoke` or `/invoke-with-response-stream`, `anthropic_version: bedrock-2023-05-31` in the body |
//! | `vertex-anthropic` | `POST /v1/projects/{p}/locations/{l}/publishers/anthropic/models/{m}:rawPredict` or `:streamRawPredict`, `anthropic_version: vertex-2023-10-16` |
//! | `openai` | `POST /v1/{chat/completions, completions, embeddings, responses}`, the model in the body |
//! | `azure-openai` | `/openai/deployments/{deployment}/{op}?api-version=V` (`/openai/responses?api-version=V`), or the v1 API `/openai/v1/{op}` |
//! | `gemini` | `/v1beta/models/{m}:{method}` (`?alt=sse` to stream) |
//! | `vertex-gemini` | `/v1/projects/{p}/locations/{l}/publishers/google/models/{m}:{method}` |

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, HeaderValue};
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::config::Api;

/// `anthropic_version` on Bedrock.
pub(crate) const BEDROCK_VERSION: &str = "bedrock-2023-05-31";
/// `anthropic_version` on Vertex AI.
pub(crate) const VERTEX_VERSION: &str = "vertex-2023-10-16";
/// The `anthropic-version` header a request to Anthropic carries when the app's API has none.
const ANTHROPIC_VERSION: &str = "2023-06-01";

const ANTHROPIC_VERSION_HEADER: HeaderName = HeaderName::from_static("anthropic-version");
const ANTHROPIC_BETA_HEADER: HeaderName = HeaderName::from_static("anthropic-beta");
/// What Bedrock takes in the body (or not at all).
static NOT_TO_BEDROCK: [HeaderName; 2] = [ANTHROPIC_VERSION_HEADER, ANTHROPIC_BETA_HEADER];
/// What Vertex AI takes in the body.
static NOT_TO_VERTEX: [HeaderName; 1] = [ANTHROPIC_VERSION_HEADER];

/// What `encodeURIComponent` leaves as it is (the SDKs encode a Bedrock model id so).
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'!')
    .remove(b'~')
    .remove(b'*')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')');

/// The OpenAI operations, by the path's tail.
const OPENAI_OPS: [&str; 4] = ["chat/completions", "completions", "embeddings", "responses"];

/// A request extension: its answer is Bedrock's event stream, which the app reads as
/// Anthropic's SSE.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reframe;

/// A response extension: its body is a re-framed Bedrock stream (whose last event carries
/// Bedrock's invocation metrics).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reframed;

/// What a request asks, as its API names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op<'a> {
    /// Anthropic Messages; `stream`: the answer is an event stream.
    Messages { stream: bool },
    /// Anthropic's token count.
    CountTokens,
    /// An OpenAI operation (`chat/completions`, `completions`, `embeddings`, `responses`).
    OpenAi(&'a str),
    /// A Gemini method (`generateContent`, `streamGenerateContent`, `countTokens`, ...).
    Gemini(&'a str),
}

/// A request read in its API: the operation and the model it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Asked<'a> {
    pub(crate) op: Op<'a>,
    pub(crate) model: Option<Cow<'a, str>>,
}

/// Reads what a request to an `api` host asks; `None`: a path the envelope does not know.
pub(crate) fn read<'a>(api: Api, path: &'a str, body: &'a [u8]) -> Option<Asked<'a>> {
    let path = path.trim_end_matches('/');
    let in_body = || super::usage::request_model(body).map(Cow::Borrowed);
    let (op, model) = match api {
        Api::Anthropic if path.ends_with("/messages/count_tokens") => (Op::CountTokens, in_body()),
        Api::Anthropic if path.ends_with("/messages") => (Op::Messages { stream: streams(body) }, in_body()),
        Api::Anthropic => return None,
        Api::Bedrock => {
            let (_, rest) = path.split_once("/model/")?;
            let (id, action) = rest.rsplit_once('/')?;
            let stream = match action {
                "invoke" => false,
                "invoke-with-response-stream" => true,
                _ => return None,
            };
            (
                Op::Messages { stream },
                Some(percent_decode_str(id).decode_utf8_lossy()),
            )
        }
        Api::VertexAnthropic => {
            let (model, method) = vertex_model(path, "anthropic")?;
            match (model, method) {
                ("count-tokens", "rawPredict") => (Op::CountTokens, in_body()),
                (m, "rawPredict") => (Op::Messages { stream: false }, Some(Cow::Borrowed(m))),
                (m, "streamRawPredict") => (Op::Messages { stream: true }, Some(Cow::Borrowed(m))),
                _ => return None,
            }
        }
        Api::OpenAi => (Op::OpenAi(openai_op(path)?), in_body()),
        Api::AzureOpenAi => {
            let (_, rest) = path.split_once("/openai/")?;
            match rest.strip_prefix("deployments/").and_then(|r| r.split_once('/')) {
                Some((deployment, op)) => (
                    Op::OpenAi(OPENAI_OPS.into_iter().find(|o| *o == op)?),
                    Some(Cow::Borrowed(deployment)),
                ),
                None => (Op::OpenAi(openai_op(path)?), in_body()),
            }
        }
        Api::Gemini | Api::VertexGemini => {
            let (_, rest) = path.rsplit_once("/models/")?;
            let (model, method) = rest.split_once(':')?;
            (Op::Gemini(method), Some(Cow::Borrowed(model)))
        }
    };
    Some(Asked { op, model })
}

/// The OpenAI operation a path ends with.
fn openai_op(path: &str) -> Option<&'static str> {
    OPENAI_OPS.into_iter().find(|op| {
        path.strip_suffix(op).is_some_and(|p| p.ends_with('/'))
            && !(*op == "completions" && path.ends_with("/chat/completions"))
    })
}

/// A Vertex AI path's model and method: `.../publishers/{publisher}/models/{m}:{method}`.
fn vertex_model<'a>(path: &'a str, publisher: &str) -> Option<(&'a str, &'a str)> {
    let (_, rest) = path.split_once("/publishers/")?;
    let rest = rest.strip_prefix(publisher)?.strip_prefix("/models/")?;
    rest.split_once(':')
}

/// Whether a JSON body asks for a stream (`"stream": true` at its top level).
pub(crate) fn streams(body: &[u8]) -> bool {
    members(body).is_some_and(|m| m.iter().any(|(k, v)| *k == b"stream" && *v == b"true"))
}

/// The host a request is adapted for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Host<'a> {
    pub(crate) api: Api,
    /// The upstream URL's path (prepended to the adapted path): a base ending in `/v1` already
    /// holds the version of an OpenAI or Anthropic path.
    pub(crate) base_path: &'a str,
    pub(crate) gcp_project: Option<&'a str>,
    pub(crate) gcp_location: Option<&'a str>,
    pub(crate) azure_api_version: Option<&'a str>,
}

impl Host<'_> {
    /// An OpenAI or Anthropic path with its version (`/v1`), unless the base path holds it.
    fn v1(&self, path: &str) -> String {
        match self.base_path.ends_with("/v1") {
            true => path.to_string(),
            false => format!("/v1{path}"),
        }
    }

    /// A Vertex AI model's path: `None` without the project and location.
    fn vertex(&self, publisher: &str, model: &str, method: &str) -> Option<String> {
        Some(format!(
            "/v1/projects/{}/locations/{}/publishers/{publisher}/models/{model}:{method}",
            self.gcp_project?, self.gcp_location?
        ))
    }
}

/// A request adapted for a host: what replaces the app's path, query, body and headers.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Adapted {
    /// The path (after the upstream's base path) and query.
    pub(crate) path: String,
    pub(crate) query: Option<String>,
    /// The body, when it changes.
    pub(crate) body: Option<Vec<u8>>,
    /// Headers the host takes in the body or not at all (`anthropic-version`, `anthropic-beta`).
    pub(crate) remove: &'static [HeaderName],
    /// A header the host needs that the app's API does not send.
    pub(crate) insert: Option<(HeaderName, HeaderValue)>,
    /// The answer is Bedrock's event stream, which the app reads as Anthropic's SSE.
    pub(crate) reframe: bool,
}

/// `asked` (read from a request in `from`'s API) as `to` takes it, naming `model` (the target's
/// name for the requested model). `None`: nothing can be adapted (the request goes as it came).
pub(crate) fn adapt(
    asked: &Asked<'_>,
    from: Api,
    to: &Host<'_>,
    (query, body, headers): (Option<&str>, &[u8], &HeaderMap),
    model: Option<&str>,
) -> Option<Adapted> {
    let mut out = Adapted {
        path: String::new(),
        query: query.map(str::to_string),
        body: None,
        remove: &[],
        insert: None,
        reframe: false,
    };
    match asked.op {
        Op::Messages { .. } | Op::CountTokens => to_claude(&mut out, asked, from, to, (query, body, headers), model)?,
        Op::OpenAi(_) | Op::Gemini(_) => to_gpt_or_gemini(&mut out, asked, to, (query, body), model)?,
    }
    Some(out)
}

/// An Anthropic Messages request for a host of `to`'s shape.
fn to_claude(
    out: &mut Adapted,
    asked: &Asked<'_>,
    from: Api,
    to: &Host<'_>,
    (query, body, headers): (Option<&str>, &[u8], &HeaderMap),
    model: Option<&str>,
) -> Option<()> {
    match (&asked.op, to.api) {
        (Op::Messages { stream }, Api::Anthropic) => {
            out.path = to.v1("/messages");
            out.query = query.filter(|_| from == Api::Anthropic).map(str::to_string);
            let (remove, stream) = stream_from_path(from, *stream);
            out.body = edit(body, remove, model_entry(model)?.into_iter().chain(stream));
            if !headers.contains_key(ANTHROPIC_VERSION_HEADER) {
                out.insert = Some((ANTHROPIC_VERSION_HEADER, HeaderValue::from_static(ANTHROPIC_VERSION)));
            }
        }
        (Op::CountTokens, Api::Anthropic) => {
            out.path = to.v1("/messages/count_tokens");
            out.query = None;
            out.body = edit(body, &["model", "anthropic_version"], model_entry(model)?);
            if !headers.contains_key(ANTHROPIC_VERSION_HEADER) {
                out.insert = Some((ANTHROPIC_VERSION_HEADER, HeaderValue::from_static(ANTHROPIC_VERSION)));
            }
        }
        (Op::Messages { stream }, Api::Bedrock) => {
            let id = utf8_percent_encode(model?, COMPONENT);
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
            out.reframe = *stream;
        }
        (Op::Messages { stream }, Api::VertexAnthropic) => {
            let method = if *stream { "streamRawPredict" } else { "rawPredict" };
            out.path = to.vertex("anthropic", model?, method)?;
            out.query = None;
            let version = ("anthropic_version", json_string(VERTEX_VERSION));
            let (remove, stream) = stream_from_path(from, *stream);
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
                model_entry(model)?.into_iter().chain([version]),
            );
            out.remove = &NOT_TO_VERTEX;
        }
        _ => return None,
    }
    Some(())
}

/// An OpenAI or Gemini request for a host of `to`'s shape.
fn to_gpt_or_gemini(
    out: &mut Adapted,
    asked: &Asked<'_>,
    to: &Host<'_>,
    (query, body): (Option<&str>, &[u8]),
    model: Option<&str>,
) -> Option<()> {
    match (&asked.op, to.api) {
        (Op::OpenAi(op), Api::OpenAi) => {
            out.path = to.v1(&format!("/{op}"));
            out.query = without(query, "api-version");
            out.body = edit(body, &["model"], model_entry(model)?);
        }
        (Op::OpenAi(op), Api::AzureOpenAi) => {
            // A URL that ends in `/openai` already holds the first segment of Azure's paths.
            let root = if to.base_path.ends_with("/openai") {
                ""
            } else {
                "/openai"
            };
            match (to.azure_api_version, *op) {
                (Some(version), "responses") => {
                    out.path = format!("{root}/responses");
                    out.query = Some(with_first(query, "api-version", version));
                }
                (Some(version), op) => {
                    out.path = format!("{root}/deployments/{}/{op}", utf8_percent_encode(model?, COMPONENT));
                    out.query = Some(with_first(query, "api-version", version));
                }
                (None, op) => {
                    out.path = format!("{root}/v1/{op}");
                    out.query = without(query, "api-version");
                }
            }
            out.body = edit(body, &["model"], model_entry(model)?);
        }
        (Op::Gemini(method), Api::Gemini) => {
            out.path = format!("/v1beta/models/{}:{method}", model?);
        }
        (Op::Gemini(method), Api::VertexGemini) => {
            out.path = to.vertex("google", model?, method)?;
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

/// `"model": name` as a body entry.
fn model_entry(model: Option<&str>) -> Option<Option<(&'static str, String)>> {
    Some(model.map(|m| ("model", json_string(m))))
}

/// `s` as a JSON string (quoted and escaped).
fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default() // a `&str` always serialises
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

/// `query` without the parameter `name`.
fn without(query: Option<&str>, name: &str) -> Option<String> {
    let kept: Vec<&str> = query?
        .split('&')
        .filter(|p| !p.is_empty() && p.split('=').next() != Some(name))
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

/// `name=value`, then the rest of `query` without `name`.
fn with_first(query: Option<&str>, name: &str, value: &str) -> String {
    let value = utf8_percent_encode(value, COMPONENT);
    match without(query, name) {
        Some(rest) => format!("{name}={value}&{rest}"),
        None => format!("{name}={value}"),
    }
}

/// A JSON object body with the top-level keys `remove` left out and `add` (raw JSON values) put
/// first, in their order. The other members keep their order and bytes. `None`: not a JSON
/// object (the body goes as it came, and the host answers it).
fn edit<'k>(body: &[u8], remove: &[&str], add: impl IntoIterator<Item = (&'k str, String)>) -> Option<Vec<u8>> {
    let members = members(body)?;
    let mut out = Vec::with_capacity(body.len() + 64);
    out.push(b'{');
    for (key, value) in add {
        out.extend_from_slice(json_string(key).as_bytes());
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
        out.push(b',');
    }
    for (key, value) in members {
        if !remove.iter().any(|r| r.as_bytes() == key) {
            out.push(b'"');
            out.extend_from_slice(key);
            out.extend_from_slice(b"\":");
            out.extend_from_slice(value);
            out.push(b',');
        }
    }
    match out.last_mut() {
        Some(last @ b',') => *last = b'}',
        _ => out.push(b'}'),
    }
    Some(out)
}

/// The top-level members of the JSON object `body`, in order: each key as written between its
/// quotes and its value's bytes, found without parsing the values (strings are skipped with
/// `memchr`, the bytes between them counted for nesting). `None` when `body` is not one object
/// (a malformed value inside is left for the host to refuse).
fn members(body: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    let mut i = ws(body, 0);
    if body.get(i) != Some(&b'{') {
        return None;
    }
    i = ws(body, i + 1);
    let mut out = Vec::new();
    if body.get(i) == Some(&b'}') {
        return (ws(body, i + 1) == body.len()).then_some(out);
    }
    loop {
        if body.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(body, i + 1)?;
        let key = &body[i + 1..key_end];
        i = ws(body, key_end + 1);
        if body.get(i) != Some(&b':') {
            return None;
        }
        let start = ws(body, i + 1);
        let end = value_end(body, start)?;
        out.push((key, &body[start..end]));
        i = ws(body, end);
        match body.get(i) {
            Some(b',') => i = ws(body, i + 1),
            Some(b'}') => return (ws(body, i + 1) == body.len()).then_some(out),
            _ => return None,
        }
    }
}

/// The first index from `i` that is not JSON whitespace.
fn ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// The index of the quote that closes the string whose contents start at `i`.
fn string_end(b: &[u8], mut i: usize) -> Option<usize> {
    loop {
        let at = i + memchr::memchr2(b'"', b'\\', b.get(i..)?)?;
        if b[at] == b'"' {
            return Some(at);
        }
        i = at + 2; // an escape, and the byte it escapes
    }
}

/// The index just past the value that starts at `i`.
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => string_end(b, i + 1).map(|e| e + 1),
        b'{' | b'[' => {
            let (mut depth, mut j) = (0usize, i);
            loop {
                match b.get(j)? {
                    b'"' => {
                        j = string_end(b, j + 1)? + 1;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        // A number or a literal.
        _ => {
            let rest = &b[i..];
            let len = rest
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(rest.len());
            (len > 0).then_some(i + len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MESSAGES: &str = r#"{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hi \"there\""}],"stream":true}"#;

    fn host(api: Api) -> Host<'static> {
        Host {
            api,
            base_path: "",
            gcp_project: Some("proj"),
            gcp_location: Some("us-east5"),
            azure_api_version: None,
        }
    }

    fn adapt_to(
        to: Host<'_>,
        from: Api,
        path: &str,
        query: Option<&str>,
        body: &str,
        headers: &HeaderMap,
        model: &str,
    ) -> Adapted {
        let asked = read(from, path, body.as_bytes()).expect("a known path");
        adapt(&asked, from, &to, (query, body.as_bytes(), headers), Some(model)).expect("adapted")
    }

    fn body(a: &Adapted) -> serde_json::Value {
        serde_json::from_slice(a.body.as_deref().expect("a body")).expect("JSON")
    }

    #[test]
    fn requests_are_read_in_their_api() {
        let read = |api, path: &'static str, body: &'static str| read(api, path, body.as_bytes());
        let model = |m: &'static str| Some(Cow::Borrowed(m));
        assert_eq!(
            read(Api::Anthropic, "/v1/messages", MESSAGES),
            Some(Asked {
                op: Op::Messages { stream: true },
                model: model("claude-sonnet-4-5")
            })
        );
        assert_eq!(
            read(Api::Anthropic, "/v1/messages/count_tokens", r#"{"model":"m"}"#).map(|a| a.op),
            Some(Op::CountTokens)
        );
        assert_eq!(read(Api::Anthropic, "/v1/models", ""), None);
        let bedrock = read(
            Api::Bedrock,
            "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream",
            "{}",
        );
        assert_eq!(
            bedrock,
            Some(Asked {
                op: Op::Messages { stream: true },
                model: Some(Cow::Owned("us.anthropic.claude-sonnet-4-5-20250929-v1:0".into()))
            })
        );
        let vertex = read(
            Api::VertexAnthropic,
            "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:rawPredict",
            "{}",
        );
        assert_eq!(
            vertex,
            Some(Asked {
                op: Op::Messages { stream: false },
                model: model("claude-sonnet-4-5@20250929")
            })
        );
        assert_eq!(
            read(Api::OpenAi, "/v1/chat/completions", r#"{"model":"gpt-4o"}"#),
            Some(Asked {
                op: Op::OpenAi("chat/completions"),
                model: model("gpt-4o")
            })
        );
        assert_eq!(
            read(Api::OpenAi, "/v1/completions", "{}").map(|a| a.op),
            Some(Op::OpenAi("completions"))
        );
        assert_eq!(read(Api::OpenAi, "/v1/files", "{}"), None);
        assert_eq!(
            read(Api::AzureOpenAi, "/openai/deployments/gpt4o-eu/chat/completions", "{}"),
            Some(Asked {
                op: Op::OpenAi("chat/completions"),
                model: model("gpt4o-eu")
            })
        );
        assert_eq!(
            read(Api::AzureOpenAi, "/openai/v1/embeddings", r#"{"model":"e"}"#),
            Some(Asked {
                op: Op::OpenAi("embeddings"),
                model: model("e")
            })
        );
        assert_eq!(
            read(Api::Gemini, "/v1beta/models/gemini-2.5-pro:streamGenerateContent", "{}"),
            Some(Asked {
                op: Op::Gemini("streamGenerateContent"),
                model: model("gemini-2.5-pro")
            })
        );
    }

    #[test]
    fn anthropic_to_bedrock_names_the_model_in_the_path_and_the_version_in_the_body() {
        let mut headers = HeaderMap::new();
        headers.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
        headers.append("anthropic-beta", HeaderValue::from_static("a-2025-01-01, b-2025-02-02"));
        let a = adapt_to(
            host(Api::Bedrock),
            Api::Anthropic,
            "/v1/messages",
            Some("beta=true"),
            MESSAGES,
            &headers,
            "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
        );
        assert_eq!(
            a.path,
            "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream"
        );
        assert_eq!(a.query, None);
        assert!(a.reframe);
        assert_eq!(a.remove, &[ANTHROPIC_VERSION_HEADER, ANTHROPIC_BETA_HEADER]);
        let sent = String::from_utf8(a.body.clone().unwrap_or_default()).unwrap_or_default();
        assert_eq!(
            sent,
            r#"{"anthropic_version":"bedrock-2023-05-31","anthropic_beta":["a-2025-01-01","b-2025-02-02"],"max_tokens":64,"messages":[{"role":"user","content":"hi \"there\""}]}"#
        );
        let plain = adapt_to(
            host(Api::Bedrock),
            Api::Anthropic,
            "/v1/messages",
            None,
            r#"{"model":"m","max_tokens":1}"#,
            &HeaderMap::new(),
            "anthropic.claude-3-haiku-20240307-v1:0",
        );
        assert_eq!(plain.path, "/model/anthropic.claude-3-haiku-20240307-v1%3A0/invoke");
        assert!(!plain.reframe);
    }

    #[test]
    fn anthropic_to_vertex_keeps_the_stream_flag() {
        let a = adapt_to(
            host(Api::VertexAnthropic),
            Api::Anthropic,
            "/v1/messages",
            None,
            MESSAGES,
            &HeaderMap::new(),
            "claude-sonnet-4-5@20250929",
        );
        assert_eq!(a.path, "/v1/projects/proj/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict");
        let b = body(&a);
        assert_eq!(b["anthropic_version"], VERTEX_VERSION);
        assert_eq!(b["stream"], true);
        assert!(b.get("model").is_none());
        assert!(!a.reframe);
        let count = adapt_to(
            host(Api::VertexAnthropic),
            Api::Anthropic,
            "/v1/messages/count_tokens",
            None,
            r#"{"model":"claude-sonnet-4-5","messages":[]}"#,
            &HeaderMap::new(),
            "claude-sonnet-4-5@20250929",
        );
        assert_eq!(
            count.path,
            "/v1/projects/proj/locations/us-east5/publishers/anthropic/models/count-tokens:rawPredict"
        );
        assert_eq!(body(&count)["model"], "claude-sonnet-4-5@20250929");
    }

    #[test]
    fn bedrock_and_vertex_to_anthropic() {
        let bedrock_body = r#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":8,"messages":[]}"#;
        let a = adapt_to(
            host(Api::Anthropic),
            Api::Bedrock,
            "/model/anthropic.claude-x-v1%3A0/invoke-with-response-stream",
            None,
            bedrock_body,
            &HeaderMap::new(),
            "claude-x",
        );
        assert_eq!(a.path, "/v1/messages");
        assert_eq!(
            body(&a),
            serde_json::json!({"model": "claude-x", "stream": true, "max_tokens": 8, "messages": []})
        );
        assert_eq!(
            a.insert,
            Some((ANTHROPIC_VERSION_HEADER, HeaderValue::from_static("2023-06-01")))
        );
        let vertex_body = r#"{"anthropic_version":"vertex-2023-10-16","max_tokens":8,"messages":[],"stream":false}"#;
        let v = adapt_to(
            host(Api::Anthropic),
            Api::VertexAnthropic,
            "/v1/projects/p/locations/l/publishers/anthropic/models/claude-x@1:rawPredict",
            None,
            vertex_body,
            &HeaderMap::new(),
            "claude-x",
        );
        assert_eq!(
            body(&v),
            serde_json::json!({"model": "claude-x", "max_tokens": 8, "messages": [], "stream": false})
        );
    }

    #[test]
    fn openai_to_azure_deployments_or_the_v1_api() {
        let chat = r#"{"model":"gpt-4o","messages":[]}"#;
        let mut azure = host(Api::AzureOpenAi);
        azure.azure_api_version = Some("2024-10-21");
        let a = adapt_to(
            azure,
            Api::OpenAi,
            "/v1/chat/completions",
            None,
            chat,
            &HeaderMap::new(),
            "gpt4o-eu",
        );
        assert_eq!(
            (a.path.as_str(), a.query.as_deref()),
            (
                "/openai/deployments/gpt4o-eu/chat/completions",
                Some("api-version=2024-10-21")
            )
        );
        assert_eq!(body(&a)["model"], "gpt4o-eu");
        let r = adapt_to(
            azure,
            Api::OpenAi,
            "/v1/responses",
            None,
            chat,
            &HeaderMap::new(),
            "gpt4o-eu",
        );
        assert_eq!(
            (r.path.as_str(), r.query.as_deref()),
            ("/openai/responses", Some("api-version=2024-10-21"))
        );
        let v1 = adapt_to(
            host(Api::AzureOpenAi),
            Api::OpenAi,
            "/v1/embeddings",
            None,
            r#"{"model":"te3","input":"x"}"#,
            &HeaderMap::new(),
            "te3-eu",
        );
        assert_eq!((v1.path.as_str(), v1.query.as_deref()), ("/openai/v1/embeddings", None));
        // A URL of `https://RESOURCE.openai.azure.com/openai` holds Azure's first segment.
        let based = Host {
            base_path: "/openai",
            ..host(Api::AzureOpenAi)
        };
        let b = adapt_to(
            based,
            Api::OpenAi,
            "/v1/responses",
            None,
            chat,
            &HeaderMap::new(),
            "gpt4o-eu",
        );
        assert_eq!(b.path, "/v1/responses");
        let back = adapt_to(
            host(Api::OpenAi),
            Api::AzureOpenAi,
            "/openai/deployments/gpt4o-eu/chat/completions",
            Some("api-version=2024-10-21"),
            chat,
            &HeaderMap::new(),
            "gpt-4o",
        );
        assert_eq!(
            (back.path.as_str(), back.query.as_deref()),
            ("/v1/chat/completions", None)
        );
        assert_eq!(body(&back)["model"], "gpt-4o");
    }

    #[test]
    fn gemini_to_vertex_moves_the_path_and_keeps_the_query() {
        let a = adapt_to(
            host(Api::VertexGemini),
            Api::Gemini,
            "/v1beta/models/gemini-2.5-pro:streamGenerateContent",
            Some("alt=sse"),
            "{}",
            &HeaderMap::new(),
            "gemini-2.5-pro",
        );
        assert_eq!(
            a.path,
            "/v1/projects/proj/locations/us-east5/publishers/google/models/gemini-2.5-pro:streamGenerateContent"
        );
        assert_eq!((a.query.as_deref(), a.body), (Some("alt=sse"), None));
    }

    #[test]
    fn what_cannot_be_adapted_goes_as_it_came() {
        let asked = read(Api::Anthropic, "/v1/messages", MESSAGES.as_bytes()).expect("read");
        let mut no_project = host(Api::VertexAnthropic);
        no_project.gcp_project = None;
        assert_eq!(
            adapt(
                &asked,
                Api::Anthropic,
                &no_project,
                (None, MESSAGES.as_bytes(), &HeaderMap::new()),
                Some("m")
            ),
            None
        );
        assert_eq!(
            adapt(
                &asked,
                Api::Anthropic,
                &host(Api::Bedrock),
                (None, MESSAGES.as_bytes(), &HeaderMap::new()),
                None
            ),
            None
        );
        let a = adapt(
            &asked,
            Api::Anthropic,
            &host(Api::Bedrock),
            (None, b"not json", &HeaderMap::new()),
            Some("m"),
        )
        .expect("adapted");
        assert_eq!(a.body, None, "a body that is not a JSON object is the host's to refuse");
    }

    #[test]
    fn members_are_found_as_serde_reads_them() {
        for body in [
            r#"{}"#,
            r#" { "a" : 1 , "b":[1,{"c":"}]\"{"}], "d":{"e":null,"f":[true,false]},"g":"x\\\"y","h":-1.5e3 } "#,
            r#"{"model":"m","messages":[{"role":"user","content":"a \"quoted\" {brace}"}],"stream":true}"#,
            r#"{"k\"ey":"v","n":{"deep":{"deeper":[[[]]]}}}"#,
        ] {
            let got = members(body.as_bytes()).unwrap_or_else(|| panic!("{body}"));
            let want: serde_json::Map<String, serde_json::Value> = serde_json::from_str(body).expect("JSON");
            let read: serde_json::Map<String, serde_json::Value> = got
                .iter()
                .map(|(key, value)| {
                    let key: String = serde_json::from_slice(&[b"\"", *key, b"\""].concat()).expect("a key");
                    (key, serde_json::from_slice(value).expect("a value"))
                })
                .collect();
            assert_eq!((got.len(), read), (want.len(), want), "{body}");
        }
        for not_one in [
            "",
            "[]",
            "{",
            r#"{"a"}"#,
            r#"{"a":}"#,
            r#"{"a":1,}"#,
            r#"{"a":1} x"#,
            r#"{"a":"1}"#,
            r#"{"a":[1}"#,
        ] {
            assert_eq!(members(not_one.as_bytes()), None, "{not_one}");
        }
    }

    #[test]
    fn streams_reads_the_top_level_flag() {
        assert!(streams(MESSAGES.as_bytes()));
        assert!(!streams(br#"{"model":"m","stream":false}"#));
        assert!(!streams(br#"{"model":"m","tools":[{"stream":true}]}"#));
        assert!(!streams(b"not json"));
    }
}
