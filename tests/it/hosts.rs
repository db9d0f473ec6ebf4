//! One model on several hosts: a route speaks its first target's API, and its other targets may
//! be hosts of other shapes that serve the same model family (Claude on Anthropic, Bedrock and
//! Vertex AI; GPT on OpenAI and Azure OpenAI; Gemini on the Gemini API and Vertex AI).
//! The config errors name the key; the requests each host receives are checked by fake hosts.

use std::collections::BTreeMap;

use rebound::hooks::config::raw::{RawCache, RawIdempotency, RawRetry, RawRoute, RawTarget, RawUpstream};

use crate::support::cloud::{start_with_env, Env};
use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_hosts::{AWS_ACCESS_KEY, AWS_SECRET, BEDROCK_VERSION, VERTEX_VERSION};
use crate::support::fake_provider::{FakeProvider, Step};
use crate::support::sidecar::Rebound;
use crate::support::{metric, send, until_metric, Answer};

/// A target of `upstream` with `models`.
pub(crate) fn target(upstream: &str, models: &[(&str, &str)]) -> RawTarget {
    RawTarget {
        upstream: some(upstream),
        models: (!models.is_empty()).then(|| {
            models
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect::<BTreeMap<_, _>>()
        }),
        ..RawTarget::default()
    }
}

/// The errors of a config with the hosts of every shape, whose route's targets are `targets`.
fn errors(targets: Vec<RawTarget>, edit: impl Fn(&str, &mut RawUpstream)) -> String {
    let hosts = [
        ("claude", "https://api.anthropic.com"),
        ("bedrock", "https://bedrock-runtime.us-east-1.amazonaws.com"),
        ("vertex", "https://us-east5-aiplatform.googleapis.com"),
        ("gpt", "https://api.openai.com"),
        ("azure", "https://my-eu.openai.azure.com"),
        ("local", "http://127.0.0.1:9"),
    ];
    let mut c = TestConfig::new("http://127.0.0.1:9");
    for (name, url) in hosts {
        c = c.upstream_named(name, url, |u| edit(name, u));
    }
    let c = c.route(|r: &mut RawRoute| {
        r.upstream = None;
        r.targets = Some(targets.clone());
    });
    match rebound::Config::parse(&c.toml(), std::path::Path::new("t.toml"), &|_| None) {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    }
}

/// The Vertex upstream has its project; Bedrock signs with `auth = "aws"`.
fn clouds(name: &str, u: &mut RawUpstream) {
    match name {
        "vertex" => u.gcp_project = some("my-project"),
        "bedrock" => u.auth = some("aws"),
        _ => {}
    }
}

pub(crate) const SONNET: (&str, &str) = ("claude-sonnet-4-5", "us.anthropic.claude-sonnet-4-5-20250929-v1:0");

#[test]
fn hosts_of_one_family_make_one_route() {
    let ok = errors(
        vec![
            target("claude", &[]),
            target("bedrock", &[SONNET]),
            target("vertex", &[("claude-sonnet-4-5", "claude-sonnet-4-5@20250929")]),
        ],
        clouds,
    );
    assert_eq!(ok, "");
    assert_eq!(errors(vec![target("gpt", &[]), target("azure", &[])], clouds), "");
    // A host rebound does not know speaks the route's API, whichever it is.
    assert_eq!(errors(vec![target("claude", &[]), target("local", &[])], clouds), "");
    assert_eq!(errors(vec![target("local", &[]), target("gpt", &[])], clouds), "");
}

#[test]
fn a_target_that_cannot_serve_the_routes_api_is_named() {
    let mixed = errors(vec![target("gpt", &[]), target("bedrock", &[SONNET])], clouds);
    assert!(
        mixed.contains("routes[0].targets[1].upstream: expected an upstream that serves the route's API (openai, its first target \"gpt\"'s): openai or azure-openai; found \"bedrock\" (bedrock)"),
        "{mixed}"
    );
    let set = errors(vec![target("claude", &[]), target("local", &[])], |name, u| {
        if name == "local" {
            u.api = some("gemini");
        }
    });
    assert!(
        set.contains("routes[0].targets[1].upstream: expected an upstream that serves the route's API (anthropic"),
        "{set}"
    );
    let bedrock_first = errors(vec![target("bedrock", &[]), target("claude", &[])], clouds);
    assert!(
        bedrock_first
            .contains("routes[0].targets[1].upstream: expected a bedrock upstream, found \"claude\" (anthropic)"),
        "{bedrock_first}"
    );
    let fallback = TestConfig::new("https://api.openai.com")
        .upstream_named("claude", "https://api.anthropic.com", |_| {})
        .route(|r| r.fallback = Some(vec!["claude".into()]));
    let e = rebound::Config::parse(&fallback.toml(), std::path::Path::new("t.toml"), &|_| None)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("routes[0].fallback[0]: expected an upstream that serves the route's API (openai"),
        "{e}"
    );
}

#[test]
fn bedrock_needs_its_model_ids() {
    let none = errors(vec![target("claude", &[]), target("bedrock", &[])], clouds);
    assert!(
        none.contains("routes[0].targets[1].models: expected a `models` table naming the Bedrock model id of each model the app asks for"),
        "{none}"
    );
    let vertex_names = [
        ("claude-sonnet-4-5", "claude-sonnet-4-5@20250929"),
        ("claude-haiku-4-5", "claude-haiku-4-5@20251001"),
    ];
    let missing = errors(
        vec![
            target("claude", &[]),
            target("vertex", &vertex_names),
            target("bedrock", &[SONNET]),
        ],
        clouds,
    );
    assert!(
        missing.contains("routes[0].targets[2].models: expected a Bedrock model id for every model the route's targets map, found none for [\"claude-haiku-4-5\"] on \"bedrock\""),
        "{missing}"
    );
    let not_an_id = errors(
        vec![
            target("claude", &[]),
            target("bedrock", &[("claude-sonnet-4-5", "claude-sonnet-4-5@20250929")]),
        ],
        clouds,
    );
    assert!(
        not_an_id.contains("routes[0].targets[1].models: expected Bedrock model ids or inference profiles"),
        "{not_an_id}"
    );
}

#[test]
fn the_keys_of_each_host_are_checked() {
    let no_project = errors(vec![target("claude", &[]), target("vertex", &[])], |_, _| {});
    assert!(
        no_project.contains("upstreams.vertex.gcp_project: expected a Google Cloud project (or GOOGLE_CLOUD_PROJECT in the environment)"),
        "{no_project}"
    );
    let from_env = TestConfig::new("https://api.anthropic.com")
        .upstream_named("vertex", "https://aiplatform.googleapis.com", |_| {})
        .route(|r| r.fallback = Some(vec!["vertex".into()]));
    let env = |k: &str| (k == "GOOGLE_CLOUD_PROJECT").then(|| "from-env".to_string());
    let config = rebound::Config::parse(&from_env.toml(), std::path::Path::new("t.toml"), &env).expect("valid");
    // A Vertex AI host serves Claude on an Anthropic route (its location from the host: global).
    assert_eq!(
        config.routes[0].targets[1].api,
        rebound::hooks::config::Api::VertexAnthropic
    );
    let wrong = errors(vec![target("claude", &[])], |name, u| match name {
        "claude" => u.gcp_project = some("p"),
        "gpt" => u.azure_api_version = some("2024-10-21"),
        "azure" => u.azure_api_version = some("2024 10"),
        "local" => u.api = some("bedrock-runtime"),
        _ => {}
    });
    for expected in [
        "upstreams.claude.gcp_project: expected only with api = \"vertex-anthropic\" or \"vertex-gemini\"",
        "upstreams.gpt.azure_api_version: expected only with api = \"azure-openai\"",
        "upstreams.azure.azure_api_version: expected letters, digits, '-', '_' or '.' (e.g. \"2024-10-21\"), found \"2024 10\"",
        "upstreams.local.api: expected one of \"openai\", \"azure-openai\", \"anthropic\", \"bedrock\", \"vertex-anthropic\", \"gemini\", \"vertex-gemini\"",
    ] {
        assert!(wrong.contains(expected), "{expected}\n{wrong}");
    }
}

/// The Anthropic SDK's request, as it sends it.
fn messages(stream: bool) -> String {
    format!(
        r#"{{"model":"claude-sonnet-4-5","max_tokens":256,"messages":[{{"role":"user","content":"Hello"}}],"stream":{stream}}}"#
    )
}

/// Claude on four hosts: Anthropic (`fake`, first: the route's API), Bedrock in two regions and
/// Vertex AI, each a fake host that checks what it receives (SigV4 with AWS's example keys, the
/// body's `anthropic_version`, no `model`).
pub(crate) struct Claude {
    pub(crate) anthropic: FakeProvider,
    pub(crate) east: FakeProvider,
    pub(crate) west: FakeProvider,
    pub(crate) vertex: FakeProvider,
    pub(crate) rebound: Rebound,
}

impl Claude {
    pub(crate) async fn start(edit: impl FnOnce(TestConfig) -> TestConfig) -> Claude {
        let (anthropic, east, west, vertex) = (
            FakeProvider::start().await,
            FakeProvider::start().await,
            FakeProvider::start().await,
            FakeProvider::start().await,
        );
        east.aws_region("us-east-1");
        west.aws_region("us-west-2");
        let bedrock = |region: &'static str| {
            move |u: &mut RawUpstream| {
                u.api = some("bedrock");
                u.auth = some("aws");
                u.aws_region = some(region);
            }
        };
        let config = TestConfig::new(&anthropic.url())
            .upstream(|u| u.api = some("anthropic"))
            .upstream_named("bedrock-east", &east.url(), bedrock("us-east-1"))
            .upstream_named("bedrock-west", &west.url(), bedrock("us-west-2"))
            .upstream_named("vertex", &vertex.url(), |u| {
                u.api = some("vertex-anthropic");
                u.gcp_project = some("my-project");
                u.gcp_location = some("us-east5");
                u.set_headers
                    .insert("authorization".into(), "Bearer vertex-token".into());
            })
            .retry(
                "p",
                RawRetry {
                    max_attempts: Some(2),
                    base_delay: some("10ms"),
                    max_delay: some("10ms"),
                    ..RawRetry::default()
                },
            )
            .route(|r| {
                r.upstream = None;
                r.retry = some("p");
                r.targets = Some(vec![
                    target("fake", &[]),
                    target("bedrock-east", &[SONNET]),
                    target("bedrock-west", &[SONNET]),
                    target("vertex", &[("claude-sonnet-4-5", "claude-sonnet-4-5@20250929")]),
                ]);
            });
        let env: Env = vec![
            ("AWS_ACCESS_KEY_ID", AWS_ACCESS_KEY.to_string()),
            ("AWS_SECRET_ACCESS_KEY", AWS_SECRET.to_string()),
        ];
        let rebound = start_with_env(edit(config), env).await;
        Claude {
            anthropic,
            east,
            west,
            vertex,
            rebound,
        }
    }

    /// An Anthropic SDK call under the fake's `key`, with the app's own Anthropic key.
    pub(crate) async fn call(&self, key: &str, stream: bool, extra: &[(&str, &str)]) -> Answer {
        self.send(key, messages(stream), extra).await
    }

    /// The app's `body` under the fake's `key`, as [`Claude::call`] sends it.
    pub(crate) async fn send(&self, key: &str, body: String, extra: &[(&str, &str)]) -> Answer {
        let mut headers = vec![
            ("content-type", "application/json"),
            ("x-api-key", "sk-ant-app-own"),
            ("anthropic-version", "2023-06-01"),
            ("x-fake-key", key),
        ];
        headers.extend_from_slice(extra);
        send(
            "POST",
            &format!("{}/fake/v1/messages", self.rebound.url),
            &headers,
            body,
        )
        .await
    }
}

/// An SSE body's events (name and JSON data), Bedrock's invocation metrics left out.
fn events(sse: &str) -> Vec<(String, serde_json::Value)> {
    sse.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (name, data) = e.split_once("\ndata: ").expect("an event with data");
            let mut data: serde_json::Value = serde_json::from_str(data).expect("JSON data");
            if let Some(o) = data.as_object_mut() {
                o.remove("amazon-bedrock-invocationMetrics");
            }
            (name.to_string(), data)
        })
        .collect()
}

/// What a Bedrock host received under `key` (its only request): the path, and a body with
/// Bedrock's `anthropic_version`, no `model` or `stream`, the rest as the app sent it; no
/// Anthropic key or version header.
fn bedrock_received(host: &FakeProvider, key: &str, action: &str) {
    let seen = host.requests(key);
    assert_eq!(seen.len(), 1);
    let seen = &seen[0];
    assert_eq!(
        seen.path,
        format!("/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/{action}")
    );
    let body: serde_json::Value = serde_json::from_slice(&seen.body).expect("JSON");
    assert_eq!(body["anthropic_version"], BEDROCK_VERSION);
    assert_eq!((body.get("model"), body.get("stream")), (None, None));
    assert_eq!(body["messages"][0]["content"], "Hello");
    assert_eq!(body["max_tokens"], 256);
    assert!(seen
        .header("authorization")
        .is_some_and(|a| a.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")));
    assert_eq!(
        (seen.header("x-api-key"), seen.header("anthropic-version")),
        (None, None)
    );
}

#[tokio::test]
async fn claude_is_served_by_bedrock_when_anthropic_and_a_region_are_throttled() {
    let c = Claude::start(|c| c).await;
    for (key, stream) in [("plain", false), ("streamed", true)] {
        c.anthropic.script(key, vec![Step::status(429)]);
        c.east.script(key, vec![Step::status(429)]); // Bedrock's ThrottlingException
        let resp = c.call(key, stream, &[]).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.header("x-rebound-upstream"), Some("bedrock-west"));
        assert_eq!(resp.header("x-rebound-failovers"), Some("2"));
        let action = if stream {
            "invoke-with-response-stream"
        } else {
            "invoke"
        };
        bedrock_received(&c.west, key, action);
        // The east region refused it as throttled: it was signed and shaped the same.
        assert_eq!(c.east.count(key), 1);
        if stream {
            // The Anthropic SSE the SDK reads, event for event, from Bedrock's event stream.
            assert_eq!(resp.header("content-type"), Some("text/event-stream"));
            let direct = send(
                "POST",
                &format!("{}/v1/messages", c.anthropic.url()),
                &[("content-type", "application/json"), ("x-fake-key", "direct")],
                messages(true),
            )
            .await;
            assert_eq!(events(&resp.text()), events(&direct.text()));
            assert!(resp.text().contains("amazon-bedrock-invocationMetrics"));
        } else {
            assert_eq!(resp.json()["type"], "message");
        }
    }
}

#[tokio::test]
async fn vertex_takes_what_every_bedrock_region_throttles() {
    let c = Claude::start(|c| c).await;
    for (key, stream) in [("v-plain", false), ("v-streamed", true)] {
        c.anthropic.script(key, vec![Step::status(529)]);
        c.east.script(key, vec![Step::status(429)]);
        // ServiceUnavailableException, retried once there.
        c.west.script(key, vec![Step::status(503), Step::status(503)]);
        let resp = c
            .call(key, stream, &[("anthropic-beta", "context-1m-2025-08-07")])
            .await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_eq!(resp.header("x-rebound-upstream"), Some("vertex"));
        let seen = c.vertex.requests(key);
        let method = if stream { "streamRawPredict" } else { "rawPredict" };
        assert_eq!(
            seen[0].path,
            format!("/v1/projects/my-project/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:{method}")
        );
        let body: serde_json::Value = serde_json::from_slice(&seen[0].body).expect("JSON");
        assert_eq!(body["anthropic_version"], VERTEX_VERSION);
        assert_eq!(body.get("model"), None);
        assert_eq!(body["stream"], stream);
        assert_eq!(seen[0].header("authorization"), Some("Bearer vertex-token"));
        assert_eq!(seen[0].header("anthropic-beta"), Some("context-1m-2025-08-07"));
        // On Bedrock the beta went into the body.
        let west: serde_json::Value = serde_json::from_slice(&c.west.requests(key)[0].body).expect("JSON");
        assert_eq!(west["anthropic_beta"], serde_json::json!(["context-1m-2025-08-07"]));
        if stream {
            assert!(
                resp.text()
                    .ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
                "{}",
                resp.text()
            );
        }
    }
}

#[tokio::test]
async fn bedrock_exceptions_fail_over_before_the_first_byte_and_reach_the_app_after() {
    let c = Claude::start(|c| c).await;
    let exception = |after| Step::EventStreamException {
        after,
        exception_type: "throttlingException".into(),
        message: "Too many tokens, please wait before trying again.".into(),
    };
    // A throttling exception as the first frame: nothing reached the app, the next host serves.
    c.anthropic.script("first", vec![Step::status(429)]);
    c.east.script("first", vec![exception(0)]);
    let resp = c.call("first", true, &[]).await;
    assert_eq!(
        resp.header("x-rebound-upstream"),
        Some("bedrock-west"),
        "{}",
        resp.text()
    );
    assert!(resp.text().contains("event: message_stop"), "{}", resp.text());
    assert!(!resp.text().contains("event: error"), "{}", resp.text());
    // Mid-stream: the app has the events before it, then Anthropic's rate_limit_error, the end.
    c.anthropic.script("mid", vec![Step::status(429)]);
    c.east.script("mid", vec![exception(3)]);
    let resp = c.call("mid", true, &[]).await;
    assert_eq!(resp.header("x-rebound-upstream"), Some("bedrock-east"));
    let text = resp.text();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 4, "{text}");
    assert!(events[0].starts_with("event: message_start\n"), "{text}");
    assert_eq!(
        events[3],
        r#"event: error
data: {"type":"error","error":{"type":"rate_limit_error","message":"ThrottlingException: Too many tokens, please wait before trying again."}}"#
    );
    assert_eq!(
        c.west.count("mid"),
        0,
        "bytes reached the app: never a second generation"
    );
    // A frame that fails its checksum: the events before it, then an api_error, never its bytes.
    c.anthropic.script("crc", vec![Step::status(429)]);
    c.east.script("crc", vec![Step::BadChecksum { after: 2 }]);
    let text = c.call("crc", true, &[]).await.text();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 3, "{text}");
    assert!(
        events[2].contains(r#""type":"api_error","message":"the event stream from Bedrock failed its checksum"#),
        "{text}"
    );
    until_metric(
        &c.rebound,
        r#"rebound_stream_errors_total{position="mid_stream",route="fake",upstream="bedrock-east"}"#,
        |v| v >= 2.0,
    )
    .await;
}

#[tokio::test]
async fn an_idempotency_key_replays_what_bedrock_streamed() {
    let c = Claude::start(|c| {
        c.idempotency("keys", RawIdempotency::default())
            .route(|r| r.idempotency = some("keys"))
    })
    .await;
    c.anthropic.script("idem", vec![Step::status(429)]);
    c.east.script("idem", vec![]);
    let first = c.call("idem", true, &[("idempotency-key", "order-7")]).await;
    assert_eq!(
        first.header("x-rebound-upstream"),
        Some("bedrock-east"),
        "{}",
        first.text()
    );
    let again = c.call("idem", true, &[("idempotency-key", "order-7")]).await;
    assert_eq!(again.status, 200);
    assert_eq!(
        again.text(),
        first.text(),
        "the stored answer is the SSE the app received"
    );
    assert_eq!(c.east.count("idem"), 1, "one generation");
}

#[tokio::test]
async fn the_cache_answers_with_what_bedrock_streamed() {
    let policy = RawCache {
        ttl: some("60s"),
        ..RawCache::default()
    };
    let c = Claude::start(|c| c.cache("answers", policy)).await;
    c.anthropic.script("cached", vec![Step::status(429)]);
    let first = c.call("cached", true, &[]).await;
    assert_eq!(
        first.header("x-rebound-upstream"),
        Some("bedrock-east"),
        "{}",
        first.text()
    );
    assert_eq!(first.header("x-rebound-cache"), Some("miss"));
    let again = c.call("cached", true, &[]).await;
    assert_eq!(again.header("x-rebound-cache"), Some("hit"));
    assert_eq!(again.text(), first.text());
    assert_eq!((c.anthropic.count("cached"), c.east.count("cached")), (1, 1));
}

#[tokio::test]
async fn tokens_are_counted_from_each_host() {
    let c = Claude::start(|c| c).await;
    let series = |upstream: &str, kind: &str| {
        format!(
            r#"rebound_tokens_total{{kind="{kind}",model="other",outcome="delivered",route="fake",upstream="{upstream}"}}"#
        )
    };
    for (key, stream) in [("t1", true), ("t2", false)] {
        c.call(key, stream, &[]).await;
        c.anthropic.script(&format!("{key}b"), vec![Step::status(429)]);
        c.call(&format!("{key}b"), stream, &[]).await;
        c.anthropic.script(&format!("{key}v"), vec![Step::status(429)]);
        c.east.script(&format!("{key}v"), vec![Step::status(429)]);
        c.west.script(&format!("{key}v"), vec![Step::status(429)]);
        c.call(&format!("{key}v"), stream, &[]).await;
    }
    for upstream in ["fake", "bedrock-east", "vertex"] {
        until_metric(&c.rebound, &series(upstream, "output"), |v| v > 0.0).await;
        until_metric(&c.rebound, &series(upstream, "input"), |v| v > 0.0).await;
    }
    let page = c.rebound.metrics().await;
    assert_eq!(
        metric(&page, &series("bedrock-east", "output")),
        metric(&page, &series("fake", "output")),
        "the same answers, the same counts"
    );
}

#[tokio::test]
async fn gpt_on_openai_then_azure_deployments() {
    let (openai, azure, azure_v1) = (
        FakeProvider::start().await,
        FakeProvider::start().await,
        FakeProvider::start().await,
    );
    let config = TestConfig::new(&openai.url())
        .upstream(|u| u.api = some("openai"))
        .upstream_named("azure", &azure.url(), |u| {
            u.api = some("azure-openai");
            u.azure_api_version = some("2024-10-21");
            u.set_headers.insert("api-key".into(), "azure-key".into());
        })
        // Its URL holds Azure's `/openai` (as config/examples/multi-provider-fallback.toml's).
        .upstream_named("azure-v1", &format!("{}/openai", azure_v1.url()), |u| {
            u.api = some("azure-openai");
            u.set_headers.insert("api-key".into(), "azure-key".into());
        })
        .route(|r| {
            r.upstream = None;
            r.targets = Some(vec![
                target("fake", &[]),
                target("azure", &[("gpt-4o", "gpt4o-eu")]),
                target("azure-v1", &[("gpt-4o", "gpt4o-v1")]),
            ]);
        });
    let rebound = Rebound::start_config(crate::support::sidecar::parse(&config.toml())).await;
    let chat = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
    let call = |key: &'static str, path: &'static str, body: &'static str| {
        let url = format!("{}/fake{path}", rebound.url);
        async move {
            let headers = [
                ("content-type", "application/json"),
                ("authorization", "Bearer sk-app"),
                ("x-fake-key", key),
            ];
            send("POST", &url, &headers, body).await
        }
    };
    openai.script("chat", vec![Step::status(429)]);
    let resp = call("chat", "/v1/chat/completions", chat).await;
    assert_eq!(resp.header("x-rebound-upstream"), Some("azure"), "{}", resp.text());
    let seen = &azure.requests("chat")[0];
    assert_eq!(seen.path, "/openai/deployments/gpt4o-eu/chat/completions");
    assert_eq!(seen.query.as_deref(), Some("api-version=2024-10-21"));
    assert_eq!(
        (seen.header("api-key"), seen.header("authorization")),
        (Some("azure-key"), None)
    );
    openai.script("emb", vec![Step::status(429)]);
    azure.script("emb", vec![Step::status(429)]);
    let resp = call("emb", "/v1/embeddings", r#"{"model":"gpt-4o","input":"x"}"#).await;
    assert_eq!(resp.header("x-rebound-upstream"), Some("azure-v1"), "{}", resp.text());
    let seen = &azure_v1.requests("emb")[0];
    assert_eq!(
        (seen.path.as_str(), seen.query.as_deref()),
        ("/openai/v1/embeddings", None)
    );
    let body: serde_json::Value = serde_json::from_slice(&seen.body).expect("JSON");
    assert_eq!(body["model"], "gpt4o-v1");
    // Azure's content filter is the app's answer: never another target.
    openai.script("filter", vec![Step::status(429)]);
    let filtered = r#"{"error":{"message":"The response was filtered","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation"}}}"#;
    azure.script(
        "filter",
        vec![Step::Status {
            status: 400,
            headers: vec![("content-type".into(), "application/json".into())],
            body: Some(filtered.into()),
        }],
    );
    let resp = call("filter", "/v1/chat/completions", chat).await;
    assert_eq!(
        (resp.status.as_u16(), resp.header("x-rebound-upstream")),
        (400, Some("azure"))
    );
    assert_eq!(azure_v1.count("filter"), 0);
}
