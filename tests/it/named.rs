//! What a request names (DESIGN section 10): the top-level `model` only, read once and used by
//! every step; a value placed in an upstream path is one checked segment, refused with 400
//! `invalid_model` before any host is asked (and so never signed). Driven through the sidecar
//! with recording stand-ins of Anthropic, Bedrock (SigV4), Vertex AI and Azure OpenAI.

use rebound::hooks::config::raw::{RawLimit, RawPrice, RawUpstream};

use crate::hosts::{target, Claude, SONNET};
use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::{FakeProvider, Step};
use crate::support::sidecar::Rebound;
use crate::support::{send, until_metric, Answer};

/// Values a hostile or broken app might put in `model` to reach another resource on the host.
const HOSTILE: [&str; 13] = [
    "../../../../v1/projects/another-project/locations/us-east5/publishers/anthropic/models/claude-x",
    "..",
    ".",
    "",
    "claude#x",
    "claude?alt=1",
    "claude/x",
    "claude%2Fx",
    "%2e%2e",
    "claude\u{0}x",
    "claude\nx",
    "claude x",
    "an over-long name",
];

/// The values under test (the last one: 3000 bytes).
fn hostile() -> impl Iterator<Item = (usize, String)> {
    HOSTILE
        .iter()
        .map(|v| match *v {
            "an over-long name" => "m".repeat(3000),
            v => v.to_string(),
        })
        .enumerate()
}

/// An Anthropic SDK body naming `model` (as the SDK writes it: `model` last).
fn naming(model: &str) -> String {
    serde_json::json!({
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hello"}],
        "model": model,
    })
    .to_string()
}

/// 400 `invalid_model` in the route's dialect (`anthropic` or `openai`).
fn refused(resp: &Answer, dialect: &str) {
    assert_eq!(resp.status, 400, "{}", resp.text());
    let body = resp.json();
    assert_eq!(body["error"]["code"], "invalid_model", "{body}");
    match dialect {
        "anthropic" => assert_eq!(
            (body["type"].as_str(), body["error"]["type"].as_str()),
            (Some("error"), Some("invalid_request_error")),
            "{body}"
        ),
        _ => assert!(body["error"]["message"].as_str().is_some(), "{body}"),
    }
    assert_eq!(resp.header("x-should-retry"), Some("false"));
}

#[tokio::test]
async fn a_model_that_would_leave_its_path_segment_reaches_no_host() {
    // Anthropic first, then Bedrock (signed) and Vertex AI (its project in the path): a model the
    // targets do not map goes into their paths as the app named it, so it is checked for each.
    let c = Claude::start(|c| c).await;
    for (i, value) in hostile() {
        let key = format!("hostile-{i}");
        // Were it sent, the primary would fail it over to the hosts whose paths name the model.
        c.anthropic.script(&key, vec![Step::status(529)]);
        let resp = c.send(&key, naming(&value), &[]).await;
        refused(&resp, "anthropic");
        assert_eq!(
            (
                c.anthropic.count(&key),
                c.east.count(&key),
                c.west.count(&key),
                c.vertex.count(&key)
            ),
            (0, 0, 0, 0),
            "{:?}: no host asked",
            HOSTILE[i]
        );
    }
    // What the message says: the value (escaped, cut) and why.
    let resp = c.send("why", naming("claude/x"), &[]).await;
    let message = resp.json()["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(
        message.contains(r#"the model "claude/x" holds '/'"#) && message.contains("nothing was sent upstream"),
        "{message}"
    );
    // A name each host allows still fails over as before.
    c.anthropic.script("fine", vec![Step::status(529)]);
    let resp = c.send("fine", naming("claude-sonnet-4-5"), &[]).await;
    assert_eq!(
        resp.header("x-rebound-upstream"),
        Some("bedrock-east"),
        "{}",
        resp.text()
    );
}

#[tokio::test]
async fn a_tool_call_that_names_another_model_changes_nothing() {
    // The history holds a tool call whose input names `gpt-4o-mini`; the SDK writes `model` last.
    let body = serde_json::json!({
        "max_tokens": 64,
        "messages": [
            {"role": "user", "content": "Which model should I use?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "pick", "input": {"model": "gpt-4o-mini"}}
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}
        ],
        "model": "claude-sonnet-4-5",
    })
    .to_string();
    crate::limits::whole_minute_ahead(std::time::Duration::from_secs(20)).await;
    // Limited per model (one request a minute each), priced per model (the Sonnet request costs
    // more than the day's quota; gpt-4o-mini is free), counted under the model's label.
    let per_model = RawLimit {
        key: some("model"),
        requests_per_minute: Some(1),
        on_limit: some("reject"),
        ..RawLimit::default()
    };
    let c = Claude::start(|c| {
        c.limit("per-model", per_model)
            .metrics_models(&["claude-sonnet-4-5", "gpt-4o-mini"])
    })
    .await;
    // Routed by the top-level model on every host.
    c.anthropic.script("tool", vec![Step::status(429)]);
    c.east.script("tool", vec![Step::status(429)]);
    c.west.script("tool", vec![Step::status(429)]);
    let resp = c.send("tool", body.clone(), &[]).await;
    assert_eq!(resp.header("x-rebound-upstream"), Some("vertex"), "{}", resp.text());
    let sent: serde_json::Value = serde_json::from_slice(&c.anthropic.requests("tool")[0].body).expect("JSON");
    assert_eq!(sent["model"], "claude-sonnet-4-5");
    for host in [&c.east, &c.west] {
        assert_eq!(
            host.requests("tool")[0].path,
            format!("/model/{}/invoke", SONNET.1.replace(':', "%3A"))
        );
    }
    assert_eq!(
        c.vertex.requests("tool")[0].path,
        "/v1/projects/my-project/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:rawPredict"
    );
    // The tool's input is sent as the app wrote it.
    let vertex: serde_json::Value = serde_json::from_slice(&c.vertex.requests("tool")[0].body).expect("JSON");
    assert_eq!(vertex["messages"][1]["content"][0]["input"]["model"], "gpt-4o-mini");
    // Limited by the top-level model: Sonnet's bucket is spent, gpt-4o-mini's is not.
    let again = c.send("again", body.clone(), &[]).await;
    assert_eq!(again.status, 429, "{}", again.text());
    assert_eq!(again.json()["error"]["code"], "limit_exceeded");
    let mini = c.send("mini", naming("gpt-4o-mini"), &[]).await;
    assert_eq!(mini.status, 200, "{}", mini.text());
    // Counted under the top-level model's label.
    until_metric(
        &c.rebound,
        r#"rebound_tokens_total{kind="output",model="claude-sonnet-4-5",outcome="delivered",route="fake",upstream="vertex"}"#,
        |v| v > 0.0,
    )
    .await;
}

#[tokio::test]
async fn spend_is_priced_by_the_top_level_model() {
    let spend = RawLimit {
        key: some("route"),
        usd_per_day: Some(0.01),
        on_limit: some("reject"),
        ..RawLimit::default()
    };
    let price = |usd: f64| RawPrice {
        input: Some(usd),
        output: Some(usd),
        cached_input: None,
    };
    let c = Claude::start(|c| {
        c.limit("spend", spend)
            .price("claude-sonnet-4-5", price(1_000_000.0))
            .price("gpt-4o-mini", price(0.0))
    })
    .await;
    let nested = serde_json::json!({
        "max_tokens": 64,
        "messages": [{"role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "pick", "input": {"model": "gpt-4o-mini"}}
        ]}],
        "model": "claude-sonnet-4-5",
    })
    .to_string();
    // gpt-4o-mini is free: however many, the day's quota is untouched.
    for i in 0..3 {
        let free = c.send(&format!("free-{i}"), naming("gpt-4o-mini"), &[]).await;
        assert_eq!(free.status, 200, "{}", free.text());
    }
    // Priced as Sonnet (its tool call's gpt-4o-mini never counts): the first spends the day's
    // quota, the next is refused without reaching a host.
    let first = c.send("priced", nested.clone(), &[]).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let resp = c.send("refused", nested, &[]).await;
    assert_eq!(
        resp.status,
        429,
        "priced as Sonnet, over the day's quota: {}",
        resp.text()
    );
    assert_eq!(resp.json()["error"]["code"], "limit_exceeded");
    assert_eq!(c.anthropic.count("refused"), 0);
}

#[tokio::test]
async fn two_top_level_models_are_refused() {
    let c = Claude::start(|c| c).await;
    for body in [
        r#"{"model":"claude-sonnet-4-5","max_tokens":8,"messages":[],"model":"claude-opus-4"}"#,
        r#"{"model":"claude-sonnet-4-5","max_tokens":8,"messages":[],"mod\u0065l":"claude-opus-4"}"#,
    ] {
        let resp = c.send("twice", body.to_string(), &[]).await;
        refused(&resp, "anthropic");
        assert!(
            resp.json()["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("appears twice at the body's top level")),
            "{}",
            resp.text()
        );
    }
    assert_eq!(c.anthropic.count("twice"), 0);
}

#[tokio::test]
async fn azure_deployments_take_only_a_name_azure_allows() {
    let (openai, azure) = (FakeProvider::start().await, FakeProvider::start().await);
    let config = TestConfig::new(&openai.url())
        .upstream(|u| u.api = some("openai"))
        .upstream_named("azure", &azure.url(), |u: &mut RawUpstream| {
            u.api = some("azure-openai");
            u.azure_api_version = some("2024-10-21");
            u.set_headers.insert("api-key".into(), "azure-key".into());
        })
        .route(|r| {
            r.upstream = None;
            r.targets = Some(vec![target("fake", &[]), target("azure", &[("gpt-4o", "gpt4o-eu")])]);
        });
    let rebound = Rebound::start_config(crate::support::sidecar::parse(&config.toml())).await;
    let chat =
        |model: &str| serde_json::json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let call = |key: String, body: String| {
        let url = format!("{}/fake/v1/chat/completions", rebound.url);
        async move {
            let headers = [
                ("content-type", "application/json"),
                ("authorization", "Bearer sk-app"),
                ("x-fake-key", key.as_str()),
            ];
            send("POST", &url, &headers, body).await
        }
    };
    for (i, value) in hostile() {
        let key = format!("azure-{i}");
        openai.script(&key, vec![Step::status(429)]);
        let resp = call(key.clone(), chat(&value)).await;
        refused(&resp, "openai");
        assert_eq!((openai.count(&key), azure.count(&key)), (0, 0), "{:?}", HOSTILE[i]);
    }
    // A name Azure's deployments cannot have (an OpenAI fine-tune) must be mapped to one.
    let resp = call("ft".into(), chat("ft:gpt-4o-mini:org::abc")).await;
    refused(&resp, "openai");
    let message = resp.json()["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(
        message.contains("for upstream azure (azure-openai)") && message.contains("`models`"),
        "{message}"
    );
    // A mapped one goes to its deployment, whatever model a tool call in the history names (the
    // OpenAI SDK writes `messages` before `model`).
    openai.script("ok", vec![Step::status(429)]);
    let history = serde_json::json!({
        "messages": [
            {"role": "user", "content": "which model?"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "pick", "arguments": "{\"model\":\"gpt-4o-mini\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": {"model": "gpt-4o-mini"}}
        ],
        "model": "gpt-4o",
    })
    .to_string();
    let resp = call("ok".into(), history).await;
    assert_eq!(resp.header("x-rebound-upstream"), Some("azure"), "{}", resp.text());
    assert_eq!(
        azure.requests("ok")[0].path,
        "/openai/deployments/gpt4o-eu/chat/completions"
    );
    let sent: serde_json::Value = serde_json::from_slice(&azure.requests("ok")[0].body).expect("JSON");
    assert_eq!(sent["model"], "gpt4o-eu");
    assert_eq!(
        sent["messages"][2]["content"]["model"], "gpt-4o-mini",
        "the history as the app sent it"
    );
}

#[tokio::test]
async fn a_path_that_leaves_the_route_reaches_no_host() {
    let provider = FakeProvider::start().await;
    let rebound = Rebound::start_config(crate::support::sidecar::parse(&TestConfig::new(&provider.url()).toml())).await;
    for path in [
        "/fake/../admin",
        "/fake/v1/./chat/completions",
        "/fake/v1/%2e%2e/x",
        "/fake/v1/a%2F..%2Fb",
        "/fake/v1/..",
    ] {
        let resp = send(
            "POST",
            &format!("{}{path}", rebound.url),
            &[("content-type", "application/json"), ("x-fake-key", "dots")],
            "{}",
        )
        .await;
        assert_eq!(resp.status, 400, "{path}: {}", resp.text());
        assert_eq!(resp.json()["error"]["code"], "invalid_request_target", "{path}");
    }
    assert_eq!(provider.count("dots"), 0);
}

#[tokio::test]
async fn a_bedrock_route_checks_the_model_its_path_names() {
    let provider = FakeProvider::start().await;
    provider.aws_region("us-east-1");
    let config = TestConfig::new(&provider.url()).upstream(|u| {
        u.api = some("bedrock");
        u.auth = some("aws");
        u.aws_region = some("us-east-1");
    });
    let env = vec![
        (
            "AWS_ACCESS_KEY_ID",
            crate::support::fake_hosts::AWS_ACCESS_KEY.to_string(),
        ),
        (
            "AWS_SECRET_ACCESS_KEY",
            crate::support::fake_hosts::AWS_SECRET.to_string(),
        ),
    ];
    let rebound = crate::support::cloud::start_with_env(config, env).await;
    let body = r#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":8,"messages":[]}"#;
    for id in ["%2e%2e", "..", "a%2Fb", "a%3Fb", "%00", "a%20b"] {
        let resp = send(
            "POST",
            &format!("{}/fake/model/{id}/invoke", rebound.url),
            &[("content-type", "application/json"), ("x-fake-key", "bedrock")],
            body,
        )
        .await;
        assert_eq!(resp.status, 400, "{id}: {}", resp.text());
        assert_eq!(resp.json()["error"]["code"], "invalid_model", "{id}");
    }
    assert_eq!(provider.count("bedrock"), 0);
    let resp = send(
        "POST",
        &format!(
            "{}/fake/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke",
            rebound.url
        ),
        &[("content-type", "application/json"), ("x-fake-key", "bedrock")],
        body,
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.text());
}

#[test]
fn a_models_entry_that_leaves_its_path_segment_is_a_config_error() {
    let config = TestConfig::new("https://api.anthropic.com")
        .upstream_named("vertex", "https://us-east5-aiplatform.googleapis.com", |u| {
            u.gcp_project = some("p");
            u.gcp_location = some("us-east5");
        })
        .route(|r| {
            r.upstream = None;
            r.targets = Some(vec![
                target("fake", &[]),
                target("vertex", &[("claude-sonnet-4-5", "../../other/models/x")]),
            ]);
        });
    let e = rebound::Config::parse(&config.toml(), std::path::Path::new("t.toml"), &|_| None)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains(
            r#"routes[0].targets[1].models: expected a name vertex-anthropic allows as one segment of its paths"#
        ) && e.contains(r#"found "claude-sonnet-4-5" = "../../other/models/x", which holds '/'"#),
        "{e}"
    );
}
