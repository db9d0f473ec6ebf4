//! `auth = "azure"`: Entra ID bearer tokens, against local stand-ins for Entra ID's token
//! endpoint (workload identity: the client assertion must be the federated token file's
//! content; a client secret), App Service's managed identity endpoint and the instance metadata
//! service, reached through the Azure SDKs' own environment variables. The provider must get
//! `Bearer <token>` and never the app's own key.

use std::path::Path;
use std::time::Duration;

use crate::support::cloud::{
    assert_credential_unavailable, bearer_answer, carried, send_with_app_keys, start_with_env, Env, Seen, StandIn,
    TokenFile,
};
use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::{FakeProvider, Step};
use crate::support::sidecar::Rebound;
use crate::support::{metric, send, until};

const SCOPE: &str = "https://cognitiveservices.azure.com/.default";
const RESOURCE: &str = "https://cognitiveservices.azure.com";
const CLIENT_ID: &str = "00000000-0000-0000-0000-0000000000c1";
const TENANT: &str = "00000000-0000-0000-0000-0000000000t1";
const CHAT: &str = "/fake/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21";
const BODY: &str = r#"{"messages":[]}"#;
const ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// rebound with the fake route on `provider` with `auth = "azure"`, in the environment `env`.
async fn rebound(provider: &FakeProvider, env: Env) -> Rebound {
    start_with_env(
        TestConfig::new(&provider.url()).upstream(|u| u.auth = some("azure")),
        env,
    )
    .await
}

async fn chat(url: &str, key: &str) -> crate::support::Answer {
    send_with_app_keys(&format!("{url}{CHAT}"), BODY, key).await
}

/// Entra ID: the client credentials grant for the tenant, answered with `entra-token-{n}`,
/// valid `life`, when the client presents `credential` (a field and its value).
async fn entra_id(credential: (&'static str, String), life: Duration) -> StandIn {
    StandIn::start(move |seen, n| {
        let path = format!("/{TENANT}/oauth2/v2.0/token");
        let ok = seen.path == path
            && seen.form("grant_type").as_deref() == Some("client_credentials")
            && seen.form("client_id").as_deref() == Some(CLIENT_ID)
            && seen.form("scope").as_deref() == Some(SCOPE)
            && seen.form(credential.0).as_deref() == Some(credential.1.as_str());
        match ok {
            true => (200, vec![], bearer_answer(&format!("entra-token-{}", n + 1), life)),
            false => (401, vec![], r#"{"error":"invalid_client"}"#.into()),
        }
    })
    .await
}

/// Entra ID for workload identity: the assertion must be the token file's content at the time.
async fn entra_for_file(token: &TokenFile, life: Duration) -> StandIn {
    let path = token.path();
    StandIn::start(move |seen, n| {
        let file = std::fs::read_to_string(&path).unwrap_or_default();
        let ok = seen.form("client_assertion_type").as_deref() == Some(ASSERTION_TYPE)
            && seen.form("client_assertion").as_deref() == Some(file.as_str())
            && seen.form("client_id").as_deref() == Some(CLIENT_ID)
            && seen.form("scope").as_deref() == Some(SCOPE);
        match ok {
            true => (200, vec![], bearer_answer(&format!("entra-token-{}", n + 1), life)),
            false => (401, vec![], r#"{"error":"invalid_client"}"#.into()),
        }
    })
    .await
}

fn workload_identity(entra: &StandIn, token: &TokenFile) -> Env {
    vec![
        ("AZURE_CLIENT_ID", CLIENT_ID.to_string()),
        ("AZURE_TENANT_ID", TENANT.to_string()),
        ("AZURE_FEDERATED_TOKEN_FILE", token.path()),
        ("AZURE_AUTHORITY_HOST", format!("{}/", entra.url())),
    ]
}

/// The instance metadata service: `imds-token-{n}` (every number a string, as IMDS sends them)
/// for a request with `metadata: true`.
async fn imds(life: Duration) -> StandIn {
    StandIn::start(move |seen: &Seen, n| {
        let metadata = seen.headers.get("metadata").and_then(|v| v.to_str().ok());
        let query = seen
            .path
            .strip_prefix("/metadata/identity/oauth2/token?")
            .unwrap_or_default();
        let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
        let want = [
            ("api-version".to_string(), "2018-02-01".to_string()),
            ("resource".to_string(), RESOURCE.to_string()),
        ];
        if metadata != Some("true") || pairs != want {
            return (400, vec![], String::new());
        }
        let answer = serde_json::json!({
            "access_token": format!("imds-token-{}", n + 1),
            "refresh_token": "",
            "expires_in": life.as_secs().to_string(),
            "expires_on": "0",
            "resource": RESOURCE,
            "token_type": "Bearer",
        });
        (200, vec![], answer.to_string())
    })
    .await
}

fn imds_env(imds: &StandIn) -> Env {
    vec![("AZURE_POD_IDENTITY_AUTHORITY_HOST", imds.url())]
}

#[tokio::test]
async fn workload_identity_presents_the_federated_token_and_the_provider_gets_the_bearer_token() {
    let provider = FakeProvider::start().await;
    let token = TokenFile::new("eyJ.aks-federated-token");
    let entra = entra_for_file(&token, Duration::from_secs(3600)).await;
    let mut r = rebound(&provider, workload_identity(&entra, &token)).await;
    for k in ["a", "b"] {
        let resp = chat(&r.url, k).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        carried(&provider, k, 0, "entra-token-1");
    }
    assert_eq!(entra.count(), 1, "the token is held, not fetched per request");
    assert_eq!(entra.seen()[0].path, format!("/{TENANT}/oauth2/v2.0/token"));
    assert_eq!(
        entra.seen()[0].form("grant_type").as_deref(),
        Some("client_credentials")
    );
    let page = r.metrics().await;
    let ok = r#"rebound_credential_refreshes_total{result="ok",upstream="fake"}"#;
    assert_eq!(metric(&page, ok), 1.0);
    let left = metric(&page, r#"rebound_credential_expiry_seconds{upstream="fake"}"#);
    assert!(left > 3000.0, "{left}");
    assert!(!page.contains("entra-token") && !page.contains("aks-federated-token"));
    r.shutdown().await;
}

#[tokio::test]
async fn a_short_lived_token_is_refreshed_before_it_expires_with_the_token_file_reread() {
    let provider = FakeProvider::start().await;
    // Four seconds of life: refreshed at half of it, before any request sees it expire.
    let token = TokenFile::new("first-federated-token");
    let entra = entra_for_file(&token, Duration::from_secs(4)).await;
    let mut r = rebound(&provider, workload_identity(&entra, &token)).await;
    assert_eq!(chat(&r.url, "k").await.status, 200);
    carried(&provider, "k", 0, "entra-token-1");
    token.rotate("rotated-federated-token");
    until("a second token request", Duration::from_secs(20), || async {
        match entra.count() {
            n if n >= 2 => Ok(()),
            n => Err(format!("{n} requests")),
        }
    })
    .await;
    assert_eq!(
        entra.seen()[1].form("client_assertion").as_deref(),
        Some("rotated-federated-token")
    );
    assert_eq!(chat(&r.url, "k").await.status, 200);
    carried(&provider, "k", 1, "entra-token-2");
    r.shutdown().await;
}

#[tokio::test]
async fn a_client_secret_is_exchanged_at_the_same_endpoint() {
    let provider = FakeProvider::start().await;
    let entra = entra_id(
        ("client_secret", "app-registration-secret".into()),
        Duration::from_secs(3600),
    )
    .await;
    let env = vec![
        ("AZURE_CLIENT_ID", CLIENT_ID.to_string()),
        ("AZURE_TENANT_ID", TENANT.to_string()),
        ("AZURE_CLIENT_SECRET", "app-registration-secret".to_string()),
        ("AZURE_AUTHORITY_HOST", entra.url()),
    ];
    let mut r = rebound(&provider, env).await;
    let resp = chat(&r.url, "k").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    carried(&provider, "k", 0, "entra-token-1");
    r.shutdown().await;
}

#[tokio::test]
async fn app_service_managed_identity_sends_its_identity_header() {
    let provider = FakeProvider::start().await;
    let endpoint = StandIn::start(|seen, _| {
        let header = seen.headers.get("x-identity-header").and_then(|v| v.to_str().ok());
        let query = seen.path.strip_prefix("/msi/token?").unwrap_or_default();
        let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
        let want = [
            ("api-version".to_string(), "2019-08-01".to_string()),
            ("resource".to_string(), RESOURCE.to_string()),
            ("client_id".to_string(), CLIENT_ID.to_string()),
        ];
        if header != Some("identity-header-secret") || pairs != want {
            return (400, vec![], String::new());
        }
        // App Service says when the token ends, as a Unix time, and not its life.
        let end = std::time::SystemTime::now() + Duration::from_secs(3600);
        let end = end.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let answer = serde_json::json!({"access_token": "app-service-token", "expires_on": end.to_string(), "resource": RESOURCE, "token_type": "Bearer"});
        (200, vec![], answer.to_string())
    })
    .await;
    let env = vec![
        ("IDENTITY_ENDPOINT", format!("{}/msi/token", endpoint.url())),
        ("IDENTITY_HEADER", "identity-header-secret".to_string()),
        ("AZURE_CLIENT_ID", CLIENT_ID.to_string()),
    ];
    let mut r = rebound(&provider, env).await;
    let resp = chat(&r.url, "k").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    carried(&provider, "k", 0, "app-service-token");
    let left = metric(
        &r.metrics().await,
        r#"rebound_credential_expiry_seconds{upstream="fake"}"#,
    );
    assert!(left > 3000.0, "{left}");
    r.shutdown().await;
}

#[tokio::test]
async fn the_instance_metadata_service_gives_the_managed_identitys_token() {
    let provider = FakeProvider::start().await;
    let server = imds(Duration::from_secs(3600)).await;
    let mut r = rebound(&provider, imds_env(&server)).await;
    let resp = chat(&r.url, "k").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    carried(&provider, "k", 0, "imds-token-1");
    assert_eq!(server.count(), 1);
    r.shutdown().await;
}

#[tokio::test]
async fn a_401_renews_the_token_and_repeats_the_attempt_once_not_as_a_retry() {
    let provider = FakeProvider::start().await;
    let server = imds(Duration::from_secs(3600)).await;
    provider.script("k", vec![Step::status(401)]);
    let mut r = rebound(&provider, imds_env(&server)).await;
    let resp = chat(&r.url, "k").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.header("x-rebound-attempts"), Some("2"));
    assert_eq!(provider.count("k"), 2);
    assert_eq!(server.count(), 2, "one refresh for the rejection");
    carried(&provider, "k", 0, "imds-token-1");
    carried(&provider, "k", 1, "imds-token-2");
    let page = r.metrics().await;
    assert_eq!(
        metric(&page, r#"rebound_retries_total{reason="401",route="fake"}"#),
        0.0
    );

    // Once per request: a second rejection is the app's to see.
    provider.script("twice", vec![Step::status(401), Step::status(401)]);
    let resp = chat(&r.url, "twice").await;
    assert_eq!(resp.status, 401);
    assert_eq!(provider.count("twice"), 2);
    r.shutdown().await;
}

#[tokio::test]
async fn the_token_service_down_is_503_credential_unavailable_and_nothing_is_sent() {
    let provider = FakeProvider::start().await;
    let token = TokenFile::new("t");
    let entra = StandIn::start(|_, _| (503, vec![], r#"{"error":"temporarily_unavailable"}"#.into())).await;
    let mut r = rebound(&provider, workload_identity(&entra, &token)).await;
    let resp = chat(&r.url, "k").await;
    assert_credential_unavailable(&r, &resp, &provider, "k", "temporarily_unavailable").await;
    r.shutdown().await;
}

#[tokio::test]
async fn rebound_check_names_the_source_and_no_secret() {
    let config = TestConfig::new("https://my-resource.openai.azure.com").upstream(|u| u.auth = some("azure"));
    let summary = |env: Env| {
        let lookup = move |name: &str| env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone());
        let parsed = rebound::Config::parse(&config.toml(), Path::new("test.toml"), &lookup).unwrap();
        format!("{}\n{parsed:?}", parsed.summary())
    };
    let shown = summary(vec![
        ("AZURE_CLIENT_ID", CLIENT_ID.into()),
        ("AZURE_TENANT_ID", TENANT.into()),
        ("AZURE_CLIENT_SECRET", "client-secret-canary".into()),
    ]);
    assert!(
        shown.contains("auth azure (bearer token, credential from client_secret)"),
        "{shown}"
    );
    assert!(!shown.contains("client-secret-canary"), "{shown}");
    let shown = summary(vec![
        ("IDENTITY_ENDPOINT", "http://127.0.0.1:9/msi/token".into()),
        ("IDENTITY_HEADER", "identity-header-canary".into()),
    ]);
    assert!(shown.contains("credential from app_service"), "{shown}");
    assert!(!shown.contains("identity-header-canary"), "{shown}");
    assert!(summary(vec![]).contains("credential from instance_metadata"));
}

/// The real binary, with the debug log: neither the federated token, nor the tokens Entra ID
/// gave, nor the app's key appear in its output, whatever happened (a rejection and a renewal).
#[tokio::test]
async fn no_credential_reaches_the_log() {
    let provider = FakeProvider::start().await;
    let token = TokenFile::new("eyJ.canary-federated-token");
    let entra = entra_for_file(&token, Duration::from_secs(3600)).await;
    provider.script("k", vec![Step::status(401)]);
    let toml = TestConfig::new(&provider.url())
        .upstream(|u| u.auth = some("azure"))
        .toml();
    let env = workload_identity(&entra, &token);
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.push(("RUST_LOG", "debug"));
    let r = crate::support::sidecar::ReboundProcess::start(&toml, &env).await;
    let headers = [("api-key", "app-canary-key"), ("x-fake-key", "k")];
    let resp = send("POST", &format!("{}{CHAT}", r.proxy), &headers, BODY).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(entra.count(), 2);
    let logs = r.logs();
    assert!(logs.contains("cloud credential rejected"), "{logs}");
    for secret in [
        "canary-federated-token",
        "entra-token-1",
        "entra-token-2",
        "app-canary-key",
    ] {
        assert!(!logs.contains(secret), "{secret} in the log:\n{logs}");
    }
}
