//! What rebound knows of each API, one file per family of models: a request's reading (what it
//! names: its operation, model and stream), its envelope for each host of the family, and
//! rebound's own errors in the family's shape.
//!
//! - `anthropic.rs`: Anthropic's Messages API, Amazon Bedrock, Claude on Vertex AI;
//! - `openai.rs`: OpenAI (and every OpenAI-compatible provider), Azure OpenAI;
//! - `gemini.rs`: the Gemini API, Gemini on Vertex AI;
//! - `named.rs`: what a reading is ([`Named`]), the body's top-level members, the checks of a
//!   name placed in a path; `envelope.rs`: the host a request is adapted for and the edits of a
//!   query and a body every family makes.
//!
//! This file dispatches on the family. What a provider sends back is read by its shape, not by
//! the route's API (an OpenAI-compatible host may answer with any provider's error or usage):
//! error bodies in `src/retry/provider_error.rs`, in-band errors in [`crate::wire::sse`], usage
//! objects in [`crate::wire::usage`], a stream's continuation per API in `src/continuation/`.
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

pub(crate) mod anthropic;
mod envelope;
pub(crate) mod gemini;
mod named;
mod openai;

use envelope::Names;
pub(crate) use envelope::{Adapted, Host, Reframe, Reframed, Sent};
use named::{any_path_model, checked, Top};
pub(crate) use named::{api_of_path, has_dot_segment, in_path, segment, Invalid, Named, Op};
use percent_encoding::percent_decode_str;
use std::sync::Arc;

use crate::config::{Api, Family};

impl Named {
    /// What a request to a route of `api` names, from its forwarded `path` (no query) and body.
    /// A model the path names must be one segment its API allows ([`segment`]).
    pub(crate) fn read(api: Api, path: &str, body: &[u8]) -> Result<Named, Invalid> {
        let path = match memchr::memchr2(b'?', b'#', path.as_bytes()) {
            Some(end) => &path[..end],
            None => path,
        };
        let path = path.trim_end_matches('/');
        let top = Top::of(body);
        let read = match api.family() {
            Family::Anthropic => anthropic::read(api, path, &top),
            Family::OpenAi => openai::read(api, path, &top),
            Family::Gemini => gemini::read(api, path),
        };
        if let Some(named) = read {
            return named;
        }
        // A path the API does not name, sent as it came: a host of no known API speaks the
        // route's (OpenAI's by default) whatever its paths, so the operations of Anthropic's and
        // OpenAI's paths are known on any route; the model is the body's, else one the path seems
        // to name (for the steps kept per model only).
        let op = if path.ends_with("/messages/count_tokens") {
            Some(Op::CountTokens)
        } else if path.ends_with("/messages") {
            Some(Op::Messages)
        } else {
            openai::op(path).map(Op::OpenAi)
        };
        let model = match top.model()? {
            Some(m) => Some(m),
            None => any_path_model(path).and_then(|raw| {
                let decoded = percent_decode_str(raw).decode_utf8().ok()?;
                checked(&decoded).ok().map(|()| Arc::from(decoded))
            }),
        };
        Ok(Named {
            stream: top.stream && op != Some(Op::CountTokens),
            op,
            model,
        })
    }
}

/// `named` (read from the request `sent`, in its route's API) as `to` takes it, naming `model` (the target's
/// name for the requested model). `Ok(None)`: nothing can be adapted (the request goes as it
/// came); `Err`: the model is no name `to` allows in its paths ([`segment`]).
pub(crate) fn adapt(
    named: &Named,
    to: &Host<'_>,
    sent: Sent<'_>,
    model: Option<&str>,
) -> Result<Option<Adapted>, Invalid> {
    let Some(op) = &named.op else { return Ok(None) };
    // The model as one segment of `to`'s paths, checked and encoded once.
    let in_path = match model.filter(|_| named::in_path(to.api)) {
        Some(m) => Some(segment(to.api, m)?),
        None => None,
    };
    let mut out = Adapted {
        path: String::new(),
        query: sent.query.map(str::to_string),
        body: None,
        remove: &[],
        insert: None,
        reframe: false,
    };
    let names = Names {
        body: model,
        path: in_path.as_deref(),
    };
    let adapted = match op {
        Op::Messages | Op::CountTokens => anthropic::adapt(&mut out, (op, named.stream), to, sent, names),
        Op::OpenAi(op) => openai::adapt(&mut out, op, to, sent, names),
        Op::Gemini(method) => gemini::adapt(&mut out, method, to, names),
    };
    Ok(adapted.map(|()| out))
}
