//! `auth = "gcp"`: bearer tokens by Google's Application Default Credentials, against local
//! stand-ins for Google's token endpoint (which verifies the service account's RS256 JWT), STS
//! and the IAM Credentials API (workload identity federation), and the metadata server, reached
//! through Google's own environment variables. The provider must get `Bearer <token>` and never
//! the app's own key.

use std::path::Path;
use std::time::Duration;

use crate::support::cloud::{
    assert_credential_unavailable, bearer_answer, carried, jwt_claims, rfc3339_in, send_with_app_keys,
    service_account_json, start_with_env, test_key_fragment, Env, StandIn, TokenFile,
};
use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::{FakeProvider, Step};
use crate::support::sidecar::Rebound;
use crate::support::{metric, send, until};

const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
const CHAT: &str = "/fake/v1/chat/completions";
const BODY: &str = r#"{"model":"m","messages":[]}"#;
const AUDIENCE: &str = "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/pool/providers/gke";
const SUBJECT_TYPE: &str = "urn:ietf:params:oauth:token-type:jwt";

/// rebound with the fake route on `provider` with `auth = "gcp"`, in the environment `env`.
async fn rebound(provider: &FakeProvider, env: Env) -> Rebound {
    start_with_env(TestConfig::new(&provider.url()).upstream(|u| u.auth = some("gcp")), env).await
}

async fn chat(url: &str, key: &str) -> crate::support::Answer {
    send_with_app_keys(&format!("{url}{CHAT}"), BODY, key).await
}

/// Google's token endpoint: answers a valid JWT bearer grant with `gcp-token-{n}`, valid `life`.
async fn token_endpoint(life: Duration) -> StandIn {
    StandIn::start(move |seen, n| {
        let grant = seen.form("grant_type").unwrap_or_default();
        let jwt = jwt_claims(&seen.form("assertion").unwrap_or_default());
        match (grant.as_str(), jwt) {
            ("urn:ietf:params:oauth:grant-type:jwt-bearer", Ok(_)) => {
                (200, vec![], bearer_answer(&format!("gcp-token-{}", n + 1), life))
            }
            _ => (400, vec![], r#"{"error":"invalid_grant"}"#.into()),
        }
    })
    .await
}

/// The metadata server: `gcp-token-{n}` for a request with `Metadata-Flavor: Google`.
async fn metadata_server(life: Duration) -> StandIn {
    StandIn::start(move |seen, n| {
        let flavor = seen.headers.get("metadata-flavor").and_then(|v| v.to_str().ok());
        match (seen.path.as_str(), flavor) {
            ("/computeMetadata/v1/instance/service-accounts/default/token", Some("Google")) => {
                (200, vec![], bearer_answer(&format!("gcp-token-{}", n + 1), life))
            }
            _ => (403, vec![], String::new()),
        }
    })
    .await
}

fn metadata_env(server: &StandIn) -> Env {
    vec![("GCE_METADATA_HOST", server.addr.to_string())]
}

/// STS: a token exchange answered with `sts-token-{n}`, valid `life`.
async fn sts(life: Duration) -> StandIn {
    StandIn::start(move |seen, n| match seen.form("grant_type").as_deref() {
        Some("urn:ietf:params:oauth:grant-type:token-exchange") => {
            (200, vec![], bearer_answer(&format!("sts-token-{}", n + 1), life))
        }
        _ => (400, vec![], r#"{"error":"invalid_request"}"#.into()),
    })
    .await
}

/// An `external_account` file reading the subject token from `token`, exchanged at `sts`, and
/// impersonating through `impersonation` when given.
fn external_account(
    sts: &StandIn,
    token: &TokenFile,
    format: serde_json::Value,
    impersonation: Option<String>,
) -> TokenFile {
    let mut file = serde_json::json!({
        "type": "external_account",
        "audience": AUDIENCE,
        "subject_token_type": SUBJECT_TYPE,
        "token_url": format!("{}/v1/token", sts.url()),
        "credential_source": {"file": token.path(), "format": format},
    });
    if let Some(url) = impersonation {
        file["service_account_impersonation_url"] = url.into();
    }
    TokenFile::new(&file.to_string())
}

#[tokio::test]
async fn a_service_account_key_signs_a_jwt_exchanged_for_the_bearer_token_the_provider_gets() {
    let provider = FakeProvider::start().await;
    let endpoint = token_endpoint(Duration::from_secs(3600)).await;
    let key = TokenFile::new(&service_account_json(&format!("{}/token", endpoint.url())));
    let mut r = rebound(&provider, vec![("GOOGLE_APPLICATION_CREDENTIALS", key.path())]).await;
    for k in ["a", "b"] {
        let resp = chat(&r.url, k).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        carried(&provider, k, 0, "gcp-token-1");
    }
    // One exchange for both requests: the token is held, not fetched per request.
    assert_eq!(endpoint.count(), 1);
    let asked = &endpoint.seen()[0];
    assert_eq!(asked.path, "/token");
    let claims = jwt_claims(&asked.form("assertion").unwrap()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(claims["iss"], "llm@llm-project.iam.gserviceaccount.com");
    assert_eq!(claims["scope"], SCOPE);
    assert_eq!(claims["aud"], format!("{}/token", endpoint.url()));
    assert_eq!(claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(), 3600);
    let page = r.metrics().await;
    let ok = r#"rebound_credential_refreshes_total{result="ok",upstream="fake"}"#;
    assert_eq!(metric(&page, ok), 1.0);
    let left = metric(&page, r#"rebound_credential_expiry_seconds{upstream="fake"}"#);
    assert!(left > 3000.0, "{left}");
    assert!(!page.contains("gcp-token") && !page.contains(test_key_fragment()));
    r.shutdown().await;
}

#[tokio::test]
async fn workload_identity_federation_exchanges_the_subject_token_then_impersonates() {
    let provider = FakeProvider::start().await;
    let sts = sts(Duration::from_secs(3600)).await;
    let iam = StandIn::start(|seen, _| {
        let auth = seen.headers.get("authorization").and_then(|v| v.to_str().ok());
        let body: serde_json::Value = serde_json::from_str(&seen.body).unwrap_or_default();
        match (auth, body["scope"][0].as_str()) {
            (Some("Bearer sts-token-1"), Some(SCOPE)) => {
                let answer = serde_json::json!({"accessToken": "sa-token-1", "expireTime": rfc3339_in(Duration::from_secs(3600))});
                (200, vec![], answer.to_string())
            }
            _ => (401, vec![], String::new()),
        }
    })
    .await;
    let token = TokenFile::new("eyJ.gke-projected-token");
    let path = "/v1/projects/-/serviceAccounts/llm@p.iam.gserviceaccount.com:generateAccessToken";
    let config = external_account(
        &sts,
        &token,
        serde_json::json!({"type": "text"}),
        Some(format!("{}{path}", iam.url())),
    );
    let mut r = rebound(&provider, vec![("GOOGLE_APPLICATION_CREDENTIALS", config.path())]).await;
    let resp = chat(&r.url, "k").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    carried(&provider, "k", 0, "sa-token-1");
    let asked = &sts.seen()[0];
    assert_eq!(asked.path, "/v1/token");
    for (field, want) in [
        ("requested_token_type", "urn:ietf:params:oauth:token-type:access_token"),
        ("subject_token_type", SUBJECT_TYPE),
        ("subject_token", "eyJ.gke-projected-token"),
        ("audience", AUDIENCE),
        ("scope", SCOPE),
    ] {
        assert_eq!(asked.form(field).as_deref(), Some(want), "{field}");
    }
    assert_eq!(iam.seen()[0].path, path);
    assert_eq!(iam.seen()[0].method, "POST");
    r.shutdown().await;

    // Without impersonation, STS's token is the one sent; a JSON subject token file is read by
    // its field.
    let provider = FakeProvider::start().await;
    let json = TokenFile::new(r#"{"access_token":"eyJ.from-json","expires_in":600}"#);
    let format = serde_json::json!({"type": "json", "subject_token_field_name": "access_token"});
    let config = external_account(&sts, &json, format, None);
    let mut r = rebound(&provider, vec![("GOOGLE_APPLICATION_CREDENTIALS", config.path())]).await;
    let resp = chat(&r.url, "k").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    carried(&provider, "k", 0, "sts-token-2");
    assert_eq!(sts.seen()[1].form("subject_token").as_deref(), Some("eyJ.from-json"));
    r.shutdown().await;
}

#[tokio::test]
async fn the_metadata_server_gives_the_token_of_the_pods_service_account() {
    let provider = FakeProvider::start().await;
    let server = metadata_server(Duration::from_secs(3600)).await;
    let mut r = rebound(&provider, metadata_env(&server)).await;
    let resp = chat(&r.url, "k").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    carried(&provider, "k", 0, "gcp-token-1");
    assert_eq!(server.seen()[0].method, "GET");
    r.shutdown().await;
}

#[tokio::test]
async fn gclouds_user_credentials_are_refreshed_with_their_refresh_token() {
    let provider = FakeProvider::start().await;
    let endpoint = StandIn::start(|seen, _| match seen.form("refresh_token").as_deref() {
        Some("1//user-refresh-token") => (200, vec![], bearer_answer("user-token", Duration::from_secs(3600))),
        _ => (400, vec![], String::new()),
    })
    .await;
    let gcloud = tempfile::tempdir().unwrap();
    let file = serde_json::json!({
        "type": "authorized_user",
        "client_id": "764086051850.apps.googleusercontent.com",
        "client_secret": "user-client-secret",
        "refresh_token": "1//user-refresh-token",
        "token_uri": format!("{}/token", endpoint.url()),
    });
    std::fs::write(
        gcloud.path().join("application_default_credentials.json"),
        file.to_string(),
    )
    .unwrap();
    let env = vec![("CLOUDSDK_CONFIG", gcloud.path().display().to_string())];
    let mut r = rebound(&provider, env).await;
    let resp = chat(&r.url, "k").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    carried(&provider, "k", 0, "user-token");
    assert_eq!(endpoint.seen()[0].form("grant_type").as_deref(), Some("refresh_token"));
    r.shutdown().await;
}

#[tokio::test]
async fn a_short_lived_token_is_refreshed_before_it_expires_with_the_subject_token_file_reread() {
    let provider = FakeProvider::start().await;
    // Four seconds of life: refreshed at half of it, before any request sees it expire.
    let sts = sts(Duration::from_secs(4)).await;
    let token = TokenFile::new("first-subject-token");
    let config = external_account(&sts, &token, serde_json::json!({"type": "text"}), None);
    let mut r = rebound(&provider, vec![("GOOGLE_APPLICATION_CREDENTIALS", config.path())]).await;
    assert_eq!(chat(&r.url, "k").await.status, 200);
    carried(&provider, "k", 0, "sts-token-1");
    token.rotate("rotated-subject-token");
    until("a second STS call", Duration::from_secs(20), || async {
        match sts.count() {
            n if n >= 2 => Ok(()),
            n => Err(format!("{n} calls")),
        }
    })
    .await;
    assert_eq!(
        sts.seen()[1].form("subject_token").as_deref(),
        Some("rotated-subject-token")
    );
    assert_eq!(chat(&r.url, "k").await.status, 200);
    carried(&provider, "k", 1, "sts-token-2");
    r.shutdown().await;
}

#[tokio::test]
async fn a_401_renews_the_token_and_repeats_the_attempt_once_not_as_a_retry() {
    let provider = FakeProvider::start().await;
    let server = metadata_server(Duration::from_secs(3600)).await;
    provider.script("k", vec![Step::status(401)]);
    let mut r = rebound(&provider, metadata_env(&server)).await;
    let resp = chat(&r.url, "k").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.header("x-rebound-attempts"), Some("2"));
    assert_eq!(provider.count("k"), 2);
    assert_eq!(server.count(), 2, "one refresh for the rejection");
    carried(&provider, "k", 0, "gcp-token-1");
    carried(&provider, "k", 1, "gcp-token-2");
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
    let server = StandIn::start(|_, _| (503, vec![], "metadata server body".into())).await;
    let mut r = rebound(&provider, metadata_env(&server)).await;
    let resp = chat(&r.url, "k").await;
    assert_credential_unavailable(&r, &resp, &provider, "k", "metadata server body").await;
    r.shutdown().await;
}

#[tokio::test]
async fn rebound_check_names_the_source_and_no_secret() {
    let key = TokenFile::new(&service_account_json("https://oauth2.googleapis.com/token"));
    let config = TestConfig::new("https://us-east5-aiplatform.googleapis.com").upstream(|u| u.auth = some("gcp"));
    let summary = |env: Env| {
        let lookup = move |name: &str| env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone());
        let parsed = rebound::Config::parse(&config.toml(), Path::new("test.toml"), &lookup).unwrap();
        format!("{}\n{parsed:?}", parsed.summary())
    };
    let shown = summary(vec![("GOOGLE_APPLICATION_CREDENTIALS", key.path())]);
    assert!(
        shown.contains("auth gcp (bearer token, credential from service_account)"),
        "{shown}"
    );
    assert!(
        !shown.contains(test_key_fragment()) && !shown.contains("PRIVATE KEY"),
        "{shown}"
    );
    let shown = summary(vec![("GCE_METADATA_HOST", "127.0.0.1:9".into())]);
    assert!(shown.contains("credential from metadata_server"), "{shown}");
}

/// The real binary, with the debug log: neither the key, nor the tokens Google gave, nor the
/// app's key appear in its output, whatever happened (a rejection and a renewal).
#[tokio::test]
async fn no_credential_reaches_the_log() {
    let provider = FakeProvider::start().await;
    let endpoint = token_endpoint(Duration::from_secs(3600)).await;
    let key = TokenFile::new(&service_account_json(&format!("{}/token", endpoint.url())));
    provider.script("k", vec![Step::status(401)]);
    let toml = TestConfig::new(&provider.url())
        .upstream(|u| u.auth = some("gcp"))
        .toml();
    let path = key.path();
    let env = [("GOOGLE_APPLICATION_CREDENTIALS", path.as_str()), ("RUST_LOG", "debug")];
    let r = crate::support::sidecar::ReboundProcess::start(&toml, &env).await;
    let headers = [("authorization", "Bearer sk-app-canary"), ("x-fake-key", "k")];
    let resp = send("POST", &format!("{}{CHAT}", r.proxy), &headers, BODY).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(endpoint.count(), 2);
    let logs = r.logs();
    assert!(logs.contains("cloud credential rejected"), "{logs}");
    for secret in ["gcp-token-1", "gcp-token-2", "sk-app-canary", test_key_fragment()] {
        assert!(!logs.contains(secret), "{secret} in the log:\n{logs}");
    }
}
