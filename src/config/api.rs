//! The API an upstream speaks (`api`), and the families of APIs a route's targets may mix: one
//! model family served by hosts of different shapes (Claude on Anthropic, Bedrock and Vertex AI;
//! GPT on OpenAI and Azure OpenAI; Gemini on the Gemini API and Vertex AI).

use crate::words::spelled;

/// The shape of an upstream's API: its paths, where it names the model, its auth and framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    /// OpenAI and every OpenAI-compatible provider: Chat Completions, Responses, Embeddings.
    OpenAi,
    /// Azure OpenAI: deployment paths with an `api-version`, or the v1 API (`/openai/v1/...`).
    AzureOpenAi,
    /// Anthropic's Messages API.
    Anthropic,
    /// Amazon Bedrock with Anthropic bodies: InvokeModel, InvokeModelWithResponseStream.
    Bedrock,
    /// Claude on Vertex AI: rawPredict, streamRawPredict.
    VertexAnthropic,
    /// The Gemini API (generativelanguage.googleapis.com).
    Gemini,
    /// Gemini on Vertex AI.
    VertexGemini,
}

spelled!(Api {
    "openai" => OpenAi,
    "azure-openai" => AzureOpenAi,
    "anthropic" => Anthropic,
    "bedrock" => Bedrock,
    "vertex-anthropic" => VertexAnthropic,
    "gemini" => Gemini,
    "vertex-gemini" => VertexGemini,
});

/// The APIs that serve one family of models with one body format: a route's targets are all of
/// its family (rebound adapts the envelope, never translates between families).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    OpenAi,
    Anthropic,
    Gemini,
}

impl Family {
    /// Its APIs, for messages.
    pub(crate) fn apis(self) -> &'static str {
        match self {
            Family::OpenAi => "openai or azure-openai",
            Family::Anthropic => "anthropic, bedrock or vertex-anthropic",
            Family::Gemini => "gemini or vertex-gemini",
        }
    }
}

impl Api {
    /// Whether this API's hosts name the model in their paths (Bedrock's `/model/{id}/...`, Vertex
    /// AI's and Gemini's `/models/{m}:{method}`, Azure's `/openai/deployments/{d}/...`).
    pub(crate) fn names_model_in_path(self) -> bool {
        matches!(
            self,
            Api::Bedrock | Api::VertexAnthropic | Api::VertexGemini | Api::Gemini | Api::AzureOpenAi
        )
    }

    /// Why `name` is no name this API's hosts allow as one segment of their paths, if it is not:
    /// letters, digits, `-`, `_` and `.`, with `:` on Bedrock (model ids end in `-v1:0`) and `/`
    /// in a Bedrock ARN (sent encoded), `@` on Vertex AI (`claude-sonnet-4@20250514`); at most 256
    /// bytes (2048 on Bedrock, an ARN's bound); never empty, `.` or `..` (nor an ARN part that
    /// is). Everything else (`/`, `?`, `#`, `%`, spaces, control characters) would let a request
    /// choose another resource on the host.
    pub(crate) fn path_name_fault(self, name: &str) -> Option<&'static str> {
        let arn = self == Api::Bedrock && name.starts_with("arn:");
        let allowed = |b: u8| {
            b.is_ascii_alphanumeric()
                || matches!(b, b'-' | b'_' | b'.')
                || match self {
                    Api::Bedrock => b == b':' || (arn && b == b'/'),
                    Api::VertexAnthropic | Api::VertexGemini => b == b'@',
                    _ => false,
                }
        };
        let dots = |part: &str| part.is_empty() || part.bytes().all(|b| b == b'.');
        if name.is_empty() {
            Some("is empty")
        } else if self == Api::Bedrock && name.len() > 2048 {
            Some("is longer than 2048 bytes")
        } else if self != Api::Bedrock && name.len() > 256 {
            Some("is longer than 256 bytes")
        } else if let Some(b) = name.bytes().find(|b| !allowed(*b)) {
            Some(match b {
                b'/' => "holds '/', which would name another path on the host",
                b'?' | b'#' => "holds '?' or '#', which would end the path on the host",
                b'%' => "holds '%': a name is sent percent-encoded, never pre-encoded",
                b if b.is_ascii_control() => "holds a control character",
                _ => "holds a character the host's model names do not have",
            })
        } else if dots(name) || (arn && name.split('/').any(dots)) {
            Some("is a dot segment, which would name another path on the host")
        } else {
            None
        }
    }

    pub fn family(self) -> Family {
        match self {
            Api::OpenAi | Api::AzureOpenAi => Family::OpenAi,
            Api::Anthropic | Api::Bedrock | Api::VertexAnthropic => Family::Anthropic,
            Api::Gemini | Api::VertexGemini => Family::Gemini,
        }
    }
}

/// What an upstream's `api` is: set, known by its host, or left to the route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiOf {
    /// `api = "..."`, or a host rebound knows (`api.anthropic.com`, `*.openai.azure.com`,
    /// `bedrock-runtime.*.amazonaws.com`, ...).
    Known(Api),
    /// A Vertex AI host (`*aiplatform.googleapis.com`) without `api`: Claude or Gemini, as the
    /// route's family says.
    Vertex,
    /// A host rebound does not know, without `api`: it speaks the route's API (an
    /// OpenAI-compatible provider on an OpenAI route, a gateway in front of Anthropic on an
    /// Anthropic route). A route whose first target is one speaks `openai`.
    Route,
}

impl ApiOf {
    /// By the host's name (lowercase or not).
    pub(crate) fn of_host(host: &str) -> ApiOf {
        let host = host.to_ascii_lowercase();
        let under = |domain: &str| host.ends_with(domain);
        if host == "api.openai.com" {
            ApiOf::Known(Api::OpenAi)
        } else if under(".openai.azure.com") || under(".cognitiveservices.azure.com") || under(".services.ai.azure.com")
        {
            ApiOf::Known(Api::AzureOpenAi)
        } else if host == "api.anthropic.com" {
            ApiOf::Known(Api::Anthropic)
        } else if host.starts_with("bedrock-runtime") && under(".amazonaws.com") {
            ApiOf::Known(Api::Bedrock)
        } else if host == "generativelanguage.googleapis.com" {
            ApiOf::Known(Api::Gemini)
        } else if host == "aiplatform.googleapis.com" || under("-aiplatform.googleapis.com") {
            ApiOf::Vertex
        } else {
            ApiOf::Route
        }
    }

    /// The API, given the family of the route it serves (`None`: the first target's own).
    pub fn on(self, family: Option<Family>) -> Api {
        match (self, family) {
            (ApiOf::Known(api), _) => api,
            (ApiOf::Vertex, Some(Family::Anthropic)) => Api::VertexAnthropic,
            (ApiOf::Vertex, _) => Api::VertexGemini,
            (ApiOf::Route, Some(Family::Anthropic)) => Api::Anthropic,
            (ApiOf::Route, Some(Family::Gemini)) => Api::Gemini,
            (ApiOf::Route, _) => Api::OpenAi,
        }
    }

    /// The provider it is (OpenTelemetry's `gen_ai.provider.name`), where rebound knows it.
    pub fn provider(self) -> Option<&'static str> {
        match self {
            ApiOf::Known(Api::OpenAi) => Some("openai"),
            ApiOf::Known(Api::AzureOpenAi) => Some("azure.ai.openai"),
            ApiOf::Known(Api::Anthropic) => Some("anthropic"),
            ApiOf::Known(Api::Bedrock) => Some("aws.bedrock"),
            ApiOf::Known(Api::VertexAnthropic | Api::VertexGemini) | ApiOf::Vertex => Some("gcp.vertex_ai"),
            ApiOf::Known(Api::Gemini) => Some("gcp.gemini"),
            ApiOf::Route => None,
        }
    }

    /// The family it fixes, if it fixes one.
    pub fn family(self) -> Option<Family> {
        match self {
            ApiOf::Known(api) => Some(api.family()),
            ApiOf::Vertex | ApiOf::Route => None,
        }
    }
}

/// A Vertex AI host's location: `us-east5` for `us-east5-aiplatform.googleapis.com`, `global` for
/// `aiplatform.googleapis.com`; `None` for any other host.
pub(crate) fn vertex_location_of(host: &str) -> Option<&str> {
    match host.strip_suffix("aiplatform.googleapis.com")? {
        "" => Some("global"),
        region => region.strip_suffix('-').filter(|r| !r.is_empty() && !r.contains('.')),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_say_their_api_where_rebound_knows_them() {
        for (host, api) in [
            ("api.openai.com", ApiOf::Known(Api::OpenAi)),
            ("my-eu.openai.azure.com", ApiOf::Known(Api::AzureOpenAi)),
            ("my.cognitiveservices.azure.com", ApiOf::Known(Api::AzureOpenAi)),
            ("API.ANTHROPIC.COM", ApiOf::Known(Api::Anthropic)),
            ("bedrock-runtime.us-east-1.amazonaws.com", ApiOf::Known(Api::Bedrock)),
            (
                "bedrock-runtime-fips.us-east-1.amazonaws.com",
                ApiOf::Known(Api::Bedrock),
            ),
            ("generativelanguage.googleapis.com", ApiOf::Known(Api::Gemini)),
            ("us-east5-aiplatform.googleapis.com", ApiOf::Vertex),
            ("aiplatform.googleapis.com", ApiOf::Vertex),
            ("127.0.0.1", ApiOf::Route),
            ("openrouter.ai", ApiOf::Route),
            ("sts.amazonaws.com", ApiOf::Route),
        ] {
            assert_eq!(ApiOf::of_host(host), api, "{host}");
        }
    }

    #[test]
    fn a_host_that_does_not_say_takes_the_routes_family() {
        assert_eq!(ApiOf::Vertex.on(Some(Family::Anthropic)), Api::VertexAnthropic);
        assert_eq!(ApiOf::Vertex.on(None), Api::VertexGemini);
        assert_eq!(ApiOf::Route.on(Some(Family::Anthropic)), Api::Anthropic);
        assert_eq!(ApiOf::Route.on(None), Api::OpenAi);
        assert_eq!(ApiOf::Known(Api::Bedrock).on(Some(Family::OpenAi)), Api::Bedrock);
    }

    #[test]
    fn vertex_locations_come_from_the_host() {
        assert_eq!(
            vertex_location_of("us-east5-aiplatform.googleapis.com"),
            Some("us-east5")
        );
        assert_eq!(
            vertex_location_of("europe-west1-aiplatform.googleapis.com"),
            Some("europe-west1")
        );
        assert_eq!(vertex_location_of("aiplatform.googleapis.com"), Some("global"));
        assert_eq!(vertex_location_of("evil.com-aiplatform.googleapis.com"), None);
        assert_eq!(vertex_location_of("127.0.0.1"), None);
    }

    #[test]
    fn every_api_has_one_family_and_spelling() {
        for api in Api::ALL {
            assert_eq!(<Api as crate::words::Spelled>::parse(api.as_str()), Some(api));
            assert!(api.family().apis().contains(api.as_str()));
        }
    }
}
