//! What every API's envelope shares: the host a request is adapted for ([`Host`]), the request
//! adapted ([`Adapted`]), and the edits of a path's query and a JSON body's top-level members
//! that each family's file makes (`anthropic.rs`, `openai.rs`, `gemini.rs`). Pure: no I/O.

use http::{HeaderMap, HeaderName, HeaderValue};
use percent_encoding::utf8_percent_encode;

use super::named::COMPONENT;
use crate::config::Api;
use crate::wire::json::{self, members};

/// A request extension: its answer is Bedrock's event stream, which the app reads as
/// Anthropic's SSE.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reframe;

/// A response extension: its body is a re-framed Bedrock stream (whose last event carries
/// Bedrock's invocation metrics).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reframed;

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
    pub(super) fn v1(&self, path: &str) -> String {
        match self.base_path.ends_with("/v1") {
            true => path.to_string(),
            false => format!("/v1{path}"),
        }
    }

    /// A Vertex AI model's path: `None` without the project and location.
    pub(super) fn vertex(&self, publisher: &str, model: &str, method: &str) -> Option<String> {
        Some(format!(
            "/v1/projects/{}/locations/{}/publishers/{publisher}/models/{model}:{method}",
            self.gcp_project?, self.gcp_location?
        ))
    }
}

/// The app's request as it came, in the API it was written for: what an envelope is made from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sent<'a> {
    /// The API of the route the request came on.
    pub(crate) api: Api,
    pub(crate) query: Option<&'a str>,
    pub(crate) body: &'a [u8],
    pub(crate) headers: &'a HeaderMap,
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

/// The target's name for the model: as a body's member, and as a checked, encoded path segment.
#[derive(Clone, Copy)]
pub(super) struct Names<'a> {
    pub(super) body: Option<&'a str>,
    pub(super) path: Option<&'a str>,
}

/// `"model": name` as a body entry.
pub(super) fn model_entry(model: Option<&str>) -> Option<Option<(&'static str, String)>> {
    Some(model.map(|m| ("model", json_string(m))))
}

/// `s` as a JSON string (quoted and escaped).
pub(super) fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default() // a `&str` always serialises
}

/// `query` without the parameter `name`.
pub(super) fn without(query: Option<&str>, name: &str) -> Option<String> {
    let kept: Vec<&str> = query?
        .split('&')
        .filter(|p| !p.is_empty() && p.split('=').next() != Some(name))
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

/// `name=value`, then the rest of `query` without `name`.
pub(super) fn with_first(query: Option<&str>, name: &str, value: &str) -> String {
    let value = utf8_percent_encode(value, COMPONENT);
    match without(query, name) {
        Some(rest) => format!("{name}={value}&{rest}"),
        None => format!("{name}={value}"),
    }
}

/// A JSON object body with the top-level keys `remove` left out and `add` (raw JSON values) put
/// first, in their order. The other members keep their order and bytes. `None`: not a JSON
/// object (the body goes as it came, and the host answers it).
pub(super) fn edit<'k>(
    body: &[u8],
    remove: &[&str],
    add: impl IntoIterator<Item = (&'k str, String)>,
) -> Option<Vec<u8>> {
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
        if !remove.iter().any(|r| json::key_is(key, r)) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Api;
    use crate::wire::api::anthropic::{ANTHROPIC_BETA_HEADER, ANTHROPIC_VERSION_HEADER, VERTEX_VERSION};
    use crate::wire::api::{Invalid, Named};

    /// `wire::api::adapt` of a request to `from` with its `(query, body, headers)`.
    fn adapt(
        named: &Named,
        from: Api,
        to: &Host<'_>,
        (query, body, headers): (Option<&str>, &[u8], &HeaderMap),
        model: Option<&str>,
    ) -> Result<Option<Adapted>, Invalid> {
        let sent = Sent {
            api: from,
            query,
            body,
            headers,
        };
        crate::wire::api::adapt(named, to, sent, model)
    }

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
        let named = Named::read(from, path, body.as_bytes()).expect("read");
        adapt(&named, from, &to, (query, body.as_bytes(), headers), Some(model))
            .expect("a valid name")
            .expect("adapted")
    }

    fn body(a: &Adapted) -> serde_json::Value {
        serde_json::from_slice(a.body.as_deref().expect("a body")).expect("JSON")
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
        let named = Named::read(Api::Anthropic, "/v1/messages", MESSAGES.as_bytes()).expect("read");
        let mut no_project = host(Api::VertexAnthropic);
        no_project.gcp_project = None;
        let empty = HeaderMap::new();
        let messages = (None, MESSAGES.as_bytes(), &empty);
        assert_eq!(
            adapt(&named, Api::Anthropic, &no_project, messages, Some("m")),
            Ok(None)
        );
        assert_eq!(
            adapt(&named, Api::Anthropic, &host(Api::Bedrock), messages, None),
            Ok(None)
        );
        let unknown = Named::read(Api::Anthropic, "/v1/models", b"").expect("read");
        assert_eq!(
            adapt(&unknown, Api::Anthropic, &host(Api::Bedrock), messages, Some("m")),
            Ok(None)
        );
        let a = adapt(
            &named,
            Api::Anthropic,
            &host(Api::Bedrock),
            (None, b"not json", &HeaderMap::new()),
            Some("m"),
        )
        .expect("a valid name")
        .expect("adapted");
        assert_eq!(a.body, None, "a body that is not a JSON object is the host's to refuse");
    }

    #[test]
    fn a_name_no_host_allows_in_its_paths_is_never_placed_there() {
        let named = Named::read(Api::Anthropic, "/v1/messages", MESSAGES.as_bytes()).expect("read");
        let empty = HeaderMap::new();
        for api in [Api::Bedrock, Api::VertexAnthropic] {
            for bad in ["..", "../../x", "a#b", "a?b", "a%2Fb", ""] {
                let got = adapt(
                    &named,
                    Api::Anthropic,
                    &host(api),
                    (None, MESSAGES.as_bytes(), &empty),
                    Some(bad),
                );
                assert!(got.is_err(), "{api:?} {bad:?}: {got:?}");
            }
        }
        let chat = Named::read(Api::OpenAi, "/v1/chat/completions", br#"{"model":"x"}"#).expect("read");
        let mut azure = host(Api::AzureOpenAi);
        azure.azure_api_version = Some("2024-10-21");
        let got = adapt(&chat, Api::OpenAi, &azure, (None, b"{}", &empty), Some("../x"));
        assert!(got.is_err());
        // A name only a body carries is not a path's to check.
        let openai = Named::read(Api::AzureOpenAi, "/openai/v1/chat/completions", b"{}").expect("read");
        let got = adapt(
            &openai,
            Api::AzureOpenAi,
            &host(Api::OpenAi),
            (None, b"{}", &empty),
            Some("a/b"),
        );
        assert!(matches!(got, Ok(Some(_))), "{got:?}");
    }

    /// Requests of each API: its route's API and a path of each operation it names.
    const REQUESTS: [(Api, &str); 9] = [
        (Api::Anthropic, "/v1/messages"),
        (Api::Anthropic, "/v1/messages/count_tokens"),
        (
            Api::Bedrock,
            "/model/anthropic.claude-v2%3A1/invoke-with-response-stream",
        ),
        (
            Api::VertexAnthropic,
            "/v1/projects/p/locations/l/publishers/anthropic/models/c@1:rawPredict",
        ),
        (Api::OpenAi, "/v1/chat/completions"),
        (Api::OpenAi, "/v1/embeddings"),
        (Api::AzureOpenAi, "/openai/deployments/d/responses"),
        (Api::Gemini, "/v1beta/models/g:streamGenerateContent"),
        (
            Api::VertexGemini,
            "/v1/projects/p/locations/l/publishers/google/models/g:generateContent",
        ),
    ];

    /// The members an envelope may take out, put in or rename.
    const EDITED: [&str; 4] = ["model", "stream", "anthropic_version", "anthropic_beta"];

    proptest::proptest! {
        #![proptest_config(crate::testing::proptest_config(512))]

        /// Any request of any API, any body (JSON or not), any model name, for every host of its
        /// family: adapting never panics; a path made is one the host resolves where it was meant
        /// (no dot segment, no query or fragment, a valid URI path); a body made is a JSON object
        /// exactly when the app's was, with every member the envelope does not edit as serde read
        /// it in the app's body.
        #[test]
        fn any_request_is_adapted_for_any_host_of_its_family_or_sent_as_it_came(
            request in proptest::sample::select(&REQUESTS[..]),
            to in proptest::prelude::any::<usize>(),
            doc in crate::testing::json_value(&EDITED),
            noise in proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)),
            model in "[a-zA-Z0-9./:@%?#\\ -]{0,24}|\\PC{0,8}",
            azure in proptest::prelude::any::<bool>(),
        ) {
            let (from, path) = request;
            let hosts: Vec<Api> = Api::ALL.into_iter().filter(|a| a.family() == from.family()).collect();
            let to = hosts[to % hosts.len()];
            let body = noise.unwrap_or_else(|| serde_json::to_vec(&doc).unwrap_or_default());
            let Ok(named) = Named::read(from, path, &body) else { return Ok(()) };
            let mut to = host(to);
            to.azure_api_version = azure.then_some("2024-10-21");
            let mut headers = HeaderMap::new();
            headers.insert(ANTHROPIC_BETA_HEADER, http::HeaderValue::from_static("a,b"));
            let Ok(Some(a)) = adapt(&named, from, &to, (Some("alt=sse&key=k"), &body, &headers), Some(&model)) else {
                return Ok(());
            };
            proptest::prop_assert!(a.path.starts_with('/'), "{:?}", a.path);
            proptest::prop_assert!(!crate::wire::api::has_dot_segment(&a.path), "{:?}", a.path);
            proptest::prop_assert!(!a.path.contains(['?', '#']), "{:?}", a.path);
            proptest::prop_assert!(http::uri::PathAndQuery::try_from(a.path.as_str()).is_ok(), "{:?}", a.path);
            let Some(made) = a.body else { return Ok(()) };
            let before = serde_json::from_slice::<serde_json::Value>(&body).ok();
            let after = serde_json::from_slice::<serde_json::Value>(&made).ok();
            let (Some(serde_json::Value::Object(before)), Some(serde_json::Value::Object(after))) = (before, after) else {
                return Err(proptest::test_runner::TestCaseError::fail(format!(
                    "a body made from {:?}: {:?}", String::from_utf8_lossy(&body), String::from_utf8_lossy(&made)
                )));
            };
            for (key, value) in before.iter().filter(|(k, _)| !EDITED.contains(&k.as_str())) {
                proptest::prop_assert_eq!(after.get(key), Some(value), "{}", key);
            }
        }
    }
}
