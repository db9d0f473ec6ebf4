//! One model on several hosts: a route speaks its first target's API, and its other targets may
//! be hosts of other shapes that serve the same model family (Claude on Anthropic, Bedrock and
//! Vertex AI; GPT on OpenAI and Azure OpenAI; Gemini on the Gemini API and Vertex AI).
//! The config errors name the key; the requests each host receives are checked by fake hosts.

use std::collections::BTreeMap;

use rebound::hooks::config::raw::{RawRoute, RawTarget, RawUpstream};

use crate::support::config_builder::{some, TestConfig};

/// A target of `upstream` with `models`.
fn target(upstream: &str, models: &[(&str, &str)]) -> RawTarget {
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

const SONNET: (&str, &str) = ("claude-sonnet-4-5", "us.anthropic.claude-sonnet-4-5-20250929-v1:0");

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
