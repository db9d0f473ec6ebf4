//! GPT's family: OpenAI's API (and every OpenAI-compatible provider's) and Azure OpenAI's, on
//! its deployment paths (`/openai/deployments/{d}/{op}?api-version=V`) or its v1 API
//! (`/openai/v1/{op}`). What a request to each names and its envelope for each of them. rebound's
//! own errors take OpenAI's shape by default (`src/error.rs`).

use super::envelope::{edit, model_entry, with_first, without, Adapted, Host, Names, Sent};
use super::named::{in_path_named, Invalid, Named, Op, Top};
use crate::config::Api;

/// The OpenAI operations, by the path's tail.
const OPS: [&str; 4] = ["chat/completions", "completions", "embeddings", "responses"];

/// What a request to a route of `api` names, when its path is an Azure deployment's or Azure's
/// v1 API's (`None`: another path, read as any route reads it: OpenAI's paths are those).
pub(super) fn read(api: Api, path: &str, top: &Top<'_>) -> Option<Result<Named, Invalid>> {
    if api != Api::AzureOpenAi {
        return None;
    }
    match path.split_once("/openai/deployments/") {
        Some((_, rest)) => {
            let (deployment, op) = rest.split_once('/')?;
            let op = OPS.into_iter().find(|o| *o == op)?;
            Some(in_path_named(api, Op::OpenAi(op), deployment, top.stream))
        }
        None => Some(top.named(Op::OpenAi(self::op(path)?), top.stream)),
    }
}

/// The OpenAI operation a path ends with.
pub(super) fn op(path: &str) -> Option<&'static str> {
    OPS.into_iter().find(|op| {
        path.strip_suffix(op).is_some_and(|p| p.ends_with('/'))
            && !(*op == "completions" && path.ends_with("/chat/completions"))
    })
}

/// An OpenAI request (`op`) for a host of `to`'s shape.
pub(super) fn adapt(
    out: &mut Adapted,
    op: &'static str,
    to: &Host<'_>,
    sent: Sent<'_>,
    model: Names<'_>,
) -> Option<()> {
    let Sent { query, body, .. } = sent;
    match to.api {
        Api::OpenAi => {
            out.path = to.v1(&format!("/{op}"));
            out.query = without(query, "api-version");
            out.body = edit(body, &["model"], model_entry(model.body)?);
        }
        Api::AzureOpenAi => {
            // A URL that ends in `/openai` already holds the first segment of Azure's paths.
            let root = if to.base_path.ends_with("/openai") {
                ""
            } else {
                "/openai"
            };
            match (to.azure_api_version, op) {
                (Some(version), "responses") => {
                    out.path = format!("{root}/responses");
                    out.query = Some(with_first(query, "api-version", version));
                }
                (Some(version), op) => {
                    out.path = format!("{root}/deployments/{}/{op}", model.path?);
                    out.query = Some(with_first(query, "api-version", version));
                }
                (None, op) => {
                    out.path = format!("{root}/v1/{op}");
                    out.query = without(query, "api-version");
                }
            }
            out.body = edit(body, &["model"], model_entry(model.body)?);
        }
        _ => return None,
    }
    Some(())
}
