//! What a request names: its operation, its model and whether it streams,
//! read once per request after routing, in the route's API, and used by every later step
//! (envelope, limits, cooldowns, pacing, prices, tokens, traces, continuation). Pure.
//!
//! The model is the one the host reads: the JSON body's top-level `model` member for the APIs
//! that name it in the body (OpenAI, Anthropic, Azure's v1 API), the path's for those that name
//! it there (Bedrock's `/model/{id}/...`, Vertex AI's and Gemini's `/models/{m}:{method}`,
//! Azure's `/openai/deployments/{d}/...`), whose hosts never read a body's `model`. Never a
//! `model` nested in a message or a tool call, and a body with two top-level `model` members is
//! refused (hosts disagree on which one counts).
//!
//! A value from a request that rebound places in an upstream path is one path segment, checked
//! against what the target's API allows for it ([`segment`]) and percent-encoded: the app is a
//! tenant of the sidecar's credential, not its owner, so nothing it sends may choose another
//! resource on the host than the one its route and target name.

use std::borrow::Cow;
use std::sync::Arc;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::config::Api;
use crate::wire::json;

/// What `encodeURIComponent` leaves as it is (the SDKs encode a Bedrock model id and a query
/// value so).
pub(super) const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'!')
    .remove(b'~')
    .remove(b'*')
    .remove(b'\'')
    .remove(b'(')
    .remove(b')');

/// The longest model name rebound reads, in bytes: a Bedrock ARN's bound (2048); every other
/// host's names are far shorter.
pub(super) const MODEL_MAX: usize = 2048;

/// What a request asks, as its API names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// Anthropic Messages (Bedrock's invoke, Vertex AI's rawPredict).
    Messages,
    /// Anthropic's token count.
    CountTokens,
    /// An OpenAI operation (`chat/completions`, `completions`, `embeddings`, `responses`).
    OpenAi(&'static str),
    /// A Gemini method (`generateContent`, `streamGenerateContent`, `countTokens`, ...).
    Gemini(Box<str>),
}

impl Op {
    /// `gen_ai.operation.name` (OpenTelemetry's GenAI conventions).
    pub(crate) fn operation_name(&self) -> Option<&'static str> {
        match self {
            Op::Messages | Op::OpenAi("chat/completions" | "responses") => Some("chat"),
            Op::OpenAi("completions") => Some("text_completion"),
            Op::OpenAi("embeddings") => Some("embeddings"),
            Op::Gemini(m) if matches!(&**m, "generateContent" | "streamGenerateContent") => Some("generate_content"),
            Op::Gemini(m) if matches!(&**m, "embedContent" | "batchEmbedContents") => Some("embeddings"),
            _ => None,
        }
    }
}

/// What a request names, read once ([`Named::read`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Named {
    /// The operation; `None`: a path the route's API does not name (sent as it came).
    pub(crate) op: Option<Op>,
    /// The model the host reads (see the module's text); `None`: the request names none.
    pub(crate) model: Option<Arc<str>>,
    /// The answer is an event stream: `"stream": true` at the body's top level, or the path says
    /// so (Bedrock's `invoke-with-response-stream`, `streamRawPredict`, `streamGenerateContent`).
    pub(crate) stream: bool,
}

/// Why a request's model cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Invalid {
    /// The value as the request sent it, cut to 200 characters.
    pub(crate) value: String,
    pub(crate) why: &'static str,
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} {}", self.value, self.why)
    }
}

impl Invalid {
    pub(super) fn new(value: &str, why: &'static str) -> Invalid {
        let value = match value.char_indices().nth(200) {
            Some((end, _)) => format!("{}...", &value[..end]),
            None => value.to_string(),
        };
        Invalid { value, why }
    }
}

/// The top-level members of a body that say what it names.
#[derive(Default)]
pub(super) struct Top<'b> {
    model: Option<&'b [u8]>,
    models: u32,
    pub(super) stream: bool,
}

impl<'b> Top<'b> {
    /// One pass over `body`'s top-level members (nothing when it is not one JSON object: the host
    /// refuses it).
    pub(super) fn of(body: &'b [u8]) -> Top<'b> {
        let mut top = Top::default();
        let whole = json::each_member(body, |key, value| {
            if json::key_is(key, "model") {
                top.model = Some(value);
                top.models += 1;
            } else if json::key_is(key, "stream") {
                // The last one counts, as serde reads it.
                top.stream = value == b"true";
            }
        });
        match whole {
            true => top,
            false => Top::default(),
        }
    }

    /// The top-level `model` string, checked.
    pub(super) fn model(&self) -> Result<Option<Arc<str>>, Invalid> {
        if self.models > 1 {
            return Err(Invalid::new("model", "appears twice at the body's top level"));
        }
        match self.model.and_then(json::string_value) {
            Some(m) => checked(&m).map(|()| Some(Arc::from(m))),
            None => Ok(None),
        }
    }

    /// The request names `op`, the body's model and `stream` (an API that names it in the body).
    pub(super) fn named(&self, op: Op, stream: bool) -> Result<Named, Invalid> {
        Ok(Named {
            op: Some(op),
            model: self.model()?,
            stream,
        })
    }
}

/// The request names `op`, the model `raw` of an `api` path (percent-encoded as it came), and
/// `stream` (an API that names the model in its paths).
pub(super) fn in_path_named(api: Api, op: Op, raw: &str, stream: bool) -> Result<Named, Invalid> {
    Ok(Named {
        op: Some(op),
        model: Some(path_name(api, raw)?),
        stream,
    })
}

/// A model any step may use: not empty, at most [`MODEL_MAX`] bytes, no control character.
pub(super) fn checked(model: &str) -> Result<(), Invalid> {
    if model.is_empty() {
        Err(Invalid::new(model, "is empty"))
    } else if model.len() > MODEL_MAX {
        Err(Invalid::new(model, "is longer than 2048 bytes"))
    } else if model.chars().any(char::is_control) {
        Err(Invalid::new(model, "holds a control character"))
    } else {
        Ok(())
    }
}

impl Named {
    /// The model, or `""` when the request names none (the key of a scope kept per model).
    pub(crate) fn model_or_empty(&self) -> &str {
        self.model.as_deref().unwrap_or("")
    }
}

/// A name read from a path: percent-decoded, and a valid segment of `api`'s paths.
fn path_name(api: Api, raw: &str) -> Result<Arc<str>, Invalid> {
    let decoded = percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| Invalid::new(raw, "is not UTF-8 once percent-decoded"))?;
    segment(api, &decoded)?;
    Ok(Arc::from(decoded))
}

/// The model or deployment any path names: the segment after `models` (up to a `:` that starts
/// the method), `deployments` or `model`.
pub(super) fn any_path_model(path: &str) -> Option<&str> {
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

/// Whether `api`'s paths name the model (so a target of it takes the request's model there).
pub(crate) fn in_path(api: Api) -> bool {
    api.names_model_in_path()
}

/// `name` as one segment of an `api` host's path, percent-encoded, when it is a name that API
/// allows there ([`Api::path_name_fault`]): no request chooses another resource on the host.
pub(crate) fn segment(api: Api, name: &str) -> Result<Cow<'_, str>, Invalid> {
    match api.path_name_fault(name) {
        Some(why) => Err(Invalid::new(name, why)),
        None => Ok(match api {
            // `:` as `%3A` and an ARN's `/` as `%2F`, as the AWS SDKs send them.
            Api::Bedrock => utf8_percent_encode(name, COMPONENT).into(),
            // Nothing the other hosts allow needs encoding (`@` is a path character).
            _ => Cow::Borrowed(name),
        }),
    }
}

/// Whether a forwarded path holds a dot segment (`.` or `..`, percent-encoded or not, or hidden
/// behind an encoded `/` or `\`), which a host may resolve to a path above the upstream's.
pub(crate) fn has_dot_segment(path: &str) -> bool {
    let path = path.split(['?', '#']).next().unwrap_or(path);
    if memchr::memchr2(b'.', b'%', path.as_bytes()).is_none() {
        return false;
    }
    path.split('/').any(|s| {
        let decoded = percent_decode_str(s).decode_utf8_lossy();
        decoded.split(['/', '\\']).any(|p| p == "." || p == "..")
    })
}

/// Before a route matched (`no_route`), the API a path looks like: Anthropic's Messages paths
/// (and Bedrock's invoke paths, which carry Claude), Gemini's `models/{model}:{method}`, else
/// OpenAI's. Rebound's own error then takes that API's shape.
pub(crate) fn api_of_path(path: &str) -> Api {
    let path = path.trim_end_matches('/');
    let last = path.rsplit('/').next().unwrap_or("");
    if path.ends_with("/messages") || path.ends_with("/messages/count_tokens") || path.ends_with("/complete") {
        Api::Anthropic
    } else if path.contains("/model/") && (last == "invoke" || last == "invoke-with-response-stream") {
        Api::Bedrock
    } else if last.contains(':') && path.contains("/models/") {
        Api::Gemini
    } else {
        Api::OpenAi
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read(api: Api, path: &str, body: &str) -> Named {
        Named::read(api, path, body.as_bytes()).unwrap_or_else(|e| panic!("{path} {body}: {e}"))
    }

    fn named(op: Op, model: Option<&str>, stream: bool) -> Named {
        Named {
            op: Some(op),
            model: model.map(Arc::from),
            stream,
        }
    }

    const MESSAGES: &str =
        r#"{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hi"}],"stream":true}"#;

    #[test]
    fn requests_are_read_in_their_api() {
        let sonnet = Some("claude-sonnet-4-5");
        assert_eq!(
            read(Api::Anthropic, "/v1/messages", MESSAGES),
            named(Op::Messages, sonnet, true)
        );
        assert_eq!(
            read(Api::Anthropic, "/v1/messages/count_tokens", r#"{"model":"m"}"#),
            named(Op::CountTokens, Some("m"), false)
        );
        assert_eq!(read(Api::Anthropic, "/v1/models", "").op, None);
        assert_eq!(read(Api::Bedrock, "/model/m/converse", "").op, None);
        assert_eq!(
            read(
                Api::Bedrock,
                "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream",
                "{}"
            ),
            named(Op::Messages, Some("us.anthropic.claude-sonnet-4-5-20250929-v1:0"), true)
        );
        assert_eq!(
            read(
                Api::VertexAnthropic,
                "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:rawPredict",
                "{}"
            ),
            named(Op::Messages, Some("claude-sonnet-4-5@20250929"), false)
        );
        assert_eq!(
            read(
                Api::OpenAi,
                "/v1/chat/completions",
                r#"{"model":"gpt-4o","stream":true}"#
            ),
            named(Op::OpenAi("chat/completions"), Some("gpt-4o"), true)
        );
        assert_eq!(
            read(Api::OpenAi, "/v1/completions", "{}"),
            named(Op::OpenAi("completions"), None, false)
        );
        assert_eq!(read(Api::OpenAi, "/v1/files", "{}").op, None);
        // A host of no known API on an OpenAI route (the default) may serve Anthropic's paths.
        assert_eq!(
            read(Api::OpenAi, "/v1/messages", MESSAGES),
            named(Op::Messages, sonnet, true)
        );
        // Azure reads the deployment from the path, never the body's model.
        assert_eq!(
            read(
                Api::AzureOpenAi,
                "/openai/deployments/gpt4o-eu/chat/completions",
                r#"{"model":"gpt-4o"}"#
            ),
            named(Op::OpenAi("chat/completions"), Some("gpt4o-eu"), false)
        );
        assert_eq!(
            read(Api::AzureOpenAi, "/openai/v1/embeddings", r#"{"model":"e"}"#),
            named(Op::OpenAi("embeddings"), Some("e"), false)
        );
        assert_eq!(
            read(Api::Gemini, "/v1beta/models/gemini-2.5-pro:streamGenerateContent", "{}"),
            named(Op::Gemini("streamGenerateContent".into()), Some("gemini-2.5-pro"), true)
        );
        // Paths the API does not name: the body's model, else the path's.
        assert_eq!(
            read(Api::OpenAi, "/v1/images/generations", r#"{"model":"dall-e-3"}"#)
                .model
                .as_deref(),
            Some("dall-e-3")
        );
        assert_eq!(
            read(Api::AzureOpenAi, "/openai/deployments/d1/images/generations", "{}")
                .model
                .as_deref(),
            Some("d1")
        );
        assert_eq!(read(Api::OpenAi, "/v1/models", "").model, None);
        // A pass-through path of another shape names its model as it is, unchecked by the
        // route's API (an OpenAI route in front of a signed Bedrock host).
        assert_eq!(
            read(Api::OpenAi, "/model/anthropic.claude-x-v1:0/invoke", "{}")
                .model
                .as_deref(),
            Some("anthropic.claude-x-v1:0")
        );
        assert_eq!(
            read(Api::Gemini, "/v1beta/models/gemini-2.0-flash:generateContent", "{}")
                .model
                .as_deref(),
            Some("gemini-2.0-flash")
        );
        assert_eq!(read(Api::OpenAi, "/model/a%0Ab/converse", "{}").model, None);
        assert_eq!(
            read(Api::OpenAi, "/openai/deployments/gpt4o-b/chat/completions", "{}"),
            named(Op::OpenAi("chat/completions"), Some("gpt4o-b"), false)
        );
    }

    #[test]
    fn the_model_is_the_top_level_member_only() {
        // The Anthropic SDK writes `model` last; a tool call in the history names another.
        let history = r#"{"max_tokens":64,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"pick","input":{"model":"gpt-4o-mini"}}]}],"model":"claude-sonnet-4-5"}"#;
        assert_eq!(
            read(Api::Anthropic, "/v1/messages", history).model.as_deref(),
            Some("claude-sonnet-4-5")
        );
        let nested_only = r#"{"messages":[{"content":"x","model":"gpt-4o-mini"}],"tools":[{"model":"y"}]}"#;
        assert_eq!(read(Api::OpenAi, "/v1/chat/completions", nested_only).model, None);
        assert_eq!(
            read(Api::OpenAi, "/v1/chat/completions", r#"{"mod\u0065l":"gpt-4o"}"#)
                .model
                .as_deref(),
            Some("gpt-4o")
        );
        assert_eq!(
            read(Api::OpenAi, "/v1/chat/completions", r#"{"model":"gpt\u002d4o"}"#)
                .model
                .as_deref(),
            Some("gpt-4o")
        );
        assert_eq!(read(Api::OpenAi, "/v1/chat/completions", r#"{"model":4}"#).model, None);
        // Not one object: the host refuses it; nothing is read.
        assert_eq!(
            read(Api::OpenAi, "/v1/chat/completions", r#"{"model":"m","#).model,
            None
        );
        // `stream` is the top-level one too.
        assert!(!read(Api::Anthropic, "/v1/messages", r#"{"tools":[{"stream":true}]}"#).stream);
        assert!(!read(Api::Anthropic, "/v1/messages", r#"{"stream":false}"#).stream);
    }

    #[test]
    fn two_top_level_models_are_refused() {
        for body in [
            r#"{"model":"a","messages":[],"model":"b"}"#,
            r#"{"model":"a","mod\u0065l":"a"}"#,
        ] {
            let e = Named::read(Api::OpenAi, "/v1/chat/completions", body.as_bytes()).expect_err(body);
            assert_eq!(e.why, "appears twice at the body's top level");
        }
    }

    #[test]
    fn a_body_model_is_checked() {
        for (model, why) in [
            ("", "is empty"),
            ("a\nb", "holds a control character"),
            (&"m".repeat(MODEL_MAX + 1), "is longer than 2048 bytes"),
        ] {
            let body = serde_json::json!({ "model": model }).to_string();
            let e = Named::read(Api::OpenAi, "/v1/chat/completions", body.as_bytes()).expect_err(model);
            assert_eq!(e.why, why);
            assert!(e.value.len() <= 203, "the message repeats at most 200 characters");
        }
    }

    #[test]
    fn names_that_leave_their_segment_are_refused() {
        for api in [
            Api::Bedrock,
            Api::VertexAnthropic,
            Api::VertexGemini,
            Api::Gemini,
            Api::AzureOpenAi,
        ] {
            for bad in [
                "",
                ".",
                "..",
                "../../../../v1/projects/another-project/locations/us-east5/publishers/anthropic/models/claude-x",
                "claude#x",
                "claude?x=1",
                "a/b",
                "a%2Fb",
                "..%2F..",
                "a b",
                "a\u{0}b",
                "a\u{7f}",
                "clau\u{e9}de",
            ] {
                assert!(segment(api, bad).is_err(), "{api:?} {bad:?}");
            }
            let long = "m".repeat(2049);
            assert!(segment(api, &long).is_err());
        }
        assert!(segment(Api::VertexAnthropic, &"m".repeat(257)).is_err());
        assert!(segment(Api::Bedrock, &"m".repeat(2048)).is_ok());
        assert_eq!(
            segment(Api::Bedrock, "us.anthropic.claude-sonnet-4-5-20250929-v1:0").as_deref(),
            Ok("us.anthropic.claude-sonnet-4-5-20250929-v1%3A0")
        );
        assert_eq!(
            segment(
                Api::Bedrock,
                "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-x-v1:0"
            )
            .as_deref(),
            Ok("arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-x-v1%3A0")
        );
        assert!(segment(Api::Bedrock, "arn:aws:bedrock:us-east-1:1:x/../y").is_err());
        assert!(segment(Api::Bedrock, "arn:aws:bedrock:us-east-1:1:x//y").is_err());
        assert!(segment(Api::Bedrock, "a/b").is_err(), "a '/' only in an ARN");
        assert_eq!(
            segment(Api::VertexAnthropic, "claude-sonnet-4@20250514").as_deref(),
            Ok("claude-sonnet-4@20250514")
        );
        assert!(
            segment(Api::VertexAnthropic, "claude:countTokens").is_err(),
            "':' starts the method"
        );
        assert!(segment(Api::AzureOpenAi, "gpt4o@x").is_err());
        assert_eq!(segment(Api::AzureOpenAi, "gpt-4o.eu_1").as_deref(), Ok("gpt-4o.eu_1"));
    }

    #[test]
    fn a_path_that_names_a_model_is_checked_as_its_host_would_place_it() {
        for (api, path) in [
            (Api::Bedrock, "/model/../invoke"),
            (Api::Bedrock, "/model/%2e%2e/invoke"),
            (Api::Bedrock, "/model/a%2Fb/invoke"),
            (
                Api::VertexAnthropic,
                "/v1/projects/p/locations/l/publishers/anthropic/models/a/b:rawPredict",
            ),
            (Api::Gemini, "/v1beta/models/%2e%2e:generateContent"),
            (Api::AzureOpenAi, "/openai/deployments/%2e%2e/chat/completions"),
            (Api::AzureOpenAi, "/openai/deployments/a%3Fb/chat/completions"),
        ] {
            assert!(Named::read(api, path, b"{}").is_err(), "{path}");
        }
    }

    #[test]
    fn dot_segments_are_found_however_written() {
        for path in [
            "/../admin",
            "/v1/./chat",
            "/v1/..",
            "/v1/%2e%2e/x",
            "/v1/.%2E/x",
            "/v1/a%2F..%2Fb",
            "/v1/a%5C..%5Cb",
        ] {
            assert!(has_dot_segment(path), "{path}");
        }
        for path in [
            "/v1/chat/completions",
            "/model/anthropic.claude-3-5-sonnet-20240620-v1:0/invoke",
            "/v1/...",
            "/v1/a.b",
            "/v1/x?q=../..",
        ] {
            assert!(!has_dot_segment(path), "{path}");
        }
    }

    #[test]
    fn operations_have_their_opentelemetry_names() {
        assert_eq!(Op::Messages.operation_name(), Some("chat"));
        assert_eq!(Op::OpenAi("responses").operation_name(), Some("chat"));
        assert_eq!(Op::OpenAi("completions").operation_name(), Some("text_completion"));
        assert_eq!(Op::OpenAi("embeddings").operation_name(), Some("embeddings"));
        assert_eq!(
            Op::Gemini("generateContent".into()).operation_name(),
            Some("generate_content")
        );
        assert_eq!(Op::CountTokens.operation_name(), None);
    }

    /// Any JSON value, up to a few levels deep, with keys that are often `model` or `stream`.
    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        crate::testing::json_value(&["model", "stream", "messages"])
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config(1024))]

        /// For any JSON object, the model read is the top-level `model` serde_json reads (when
        /// it is a string a step may use), and `stream` is its top-level `stream: true`.
        #[test]
        fn the_model_read_is_the_one_serde_reads(
            members in prop::collection::btree_map(
                prop_oneof![Just("model".to_string()), Just("stream".to_string()), "[a-z]{1,8}"],
                json_value(),
                0..6,
            ),
            pretty in any::<bool>(),
        ) {
            let value = serde_json::Value::Object(members.into_iter().collect());
            let body = match pretty {
                true => serde_json::to_vec_pretty(&value),
                false => serde_json::to_vec(&value),
            }
            .expect("serialises");
            let want = value.get("model").and_then(serde_json::Value::as_str);
            let read = Named::read(Api::OpenAi, "/v1/chat/completions", &body);
            match want.map(checked) {
                Some(Err(_)) => prop_assert!(read.is_err()),
                _ => {
                    let read = read.expect("read");
                    prop_assert_eq!(read.model.as_deref(), want);
                    prop_assert_eq!(read.stream, value.get("stream") == Some(&serde_json::Value::Bool(true)));
                }
            }
        }

        /// Bytes of any kind never make the reading panic.
        #[test]
        fn any_bytes_are_read_or_refused(body in prop::collection::vec(any::<u8>(), 0..256), path in "[ -~]{0,40}") {
            for api in [Api::OpenAi, Api::Anthropic, Api::Bedrock, Api::VertexAnthropic, Api::AzureOpenAi, Api::Gemini] {
                let _ = Named::read(api, &path, &body);
            }
        }
    }
}
