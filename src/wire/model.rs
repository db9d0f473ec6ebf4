//! The model a request names, for what providers limit per model: the JSON body's top-level
//! `model`, else the one its path names (`/models/{m}:...` for Gemini and Vertex AI,
//! `/deployments/{d}/...` for Azure OpenAI, `/model/{m}/...` for Bedrock). Pure.

/// The model `body` or, failing that, `path` names.
pub(crate) fn of_request<'a>(body: &'a [u8], path: &'a str) -> Option<&'a str> {
    super::usage::request_model(body).or_else(|| in_path(path))
}

/// The model or deployment a path names: the segment after `models` (up to a `:` that starts
/// the method, Gemini's `gemini-2.0-flash:generateContent`), `deployments` or `model` (whole:
/// a Bedrock model id holds `:`, as in `anthropic.claude-3-5-sonnet-20240620-v1:0`).
pub(crate) fn in_path(path: &str) -> Option<&str> {
    let path = path.split(['?', '#']).next().unwrap_or(path);
    let mut segments = path.split('/');
    while let Some(s) = segments.next() {
        let name = match s {
            "models" => segments.next().and_then(|n| n.split(':').next()),
            "deployments" | "model" => segments.next(),
            _ => continue,
        };
        if let Some(n) = name.filter(|n| !n.is_empty()) {
            return Some(n);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_model() {
        for (path, model) in [
            ("/v1beta/models/gemini-2.0-flash:generateContent", Some("gemini-2.0-flash")),
            ("/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse", Some("gemini-2.0-flash")),
            (
                "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4@20250514:streamRawPredict",
                Some("claude-sonnet-4@20250514"),
            ),
            ("/openai/deployments/gpt4o-eu/chat/completions", Some("gpt4o-eu")),
            (
                "/model/anthropic.claude-3-5-sonnet-20240620-v1:0/invoke",
                Some("anthropic.claude-3-5-sonnet-20240620-v1:0"),
            ),
            ("/model/arn%3Aaws%3Abedrock%3Aus-east-1/converse", Some("arn%3Aaws%3Abedrock%3Aus-east-1")),
            ("/v1/chat/completions", None),
            ("/v1/models", None),
            ("/v1/models/", None),
            ("/", None),
        ] {
            assert_eq!(in_path(path), model, "{path}");
        }
    }

    #[test]
    fn the_body_comes_first() {
        let path = "/openai/deployments/d1/chat/completions";
        assert_eq!(of_request(br#"{"model":"gpt-4o","messages":[]}"#, path), Some("gpt-4o"));
        assert_eq!(of_request(b"{}", path), Some("d1"));
        assert_eq!(of_request(b"", "/v1/embeddings"), None);
    }
}
