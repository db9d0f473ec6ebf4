//! `auth = "aws"`: SigV4 with the AWS default chain, against local stand-ins for STS, the
//! container credentials endpoint and IMDSv2, reached through AWS's own environment variables;
//! every signature the fake provider receives is checked by an independent SigV4 verifier.

use std::path::Path;
use std::time::Duration;

use crate::support::cloud::{
    assert_credential_unavailable, sigv4_valid, start_with_env, sts_answer, sts_secret, Env, StandIn, TokenFile,
};
use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::{FakeProvider, Step};
use crate::support::sidecar::Rebound;
use crate::support::{metric, send, until};

const ROLE: &str = "arn:aws:iam::123456789012:role/llm";
/// A Bedrock path (under the fake provider's `/echo`), with the `:` a model id carries.
const INVOKE: &str = "/fake/echo/model/anthropic.claude-sonnet-4-5-v1:0/invoke";
const BODY: &str = r#"{"anthropic_version":"bedrock-2023-05-31","max_tokens":16,"messages":[]}"#;

/// STS answering `AssumeRoleWithWebIdentity` with keys `ASIA{n}` valid for `life`.
async fn sts(life: Duration) -> StandIn {
    StandIn::start(move |_, n| (200, vec![], sts_answer("AssumeRoleWithWebIdentity", n + 1, life))).await
}

/// rebound with the fake route on `provider` signed for AWS (`us-east-1`, `bedrock`), with the
/// environment `env` and `edit` applied.
async fn rebound(provider: &FakeProvider, env: Env, edit: impl FnOnce(TestConfig) -> TestConfig) -> Rebound {
    let config = edit(TestConfig::new(&provider.url()).upstream(|u| {
        u.auth = some("aws");
        u.aws_region = some("us-east-1");
    }));
    start_with_env(config, env).await
}

fn irsa(sts: &StandIn, token: &TokenFile) -> Env {
    vec![
        ("AWS_ROLE_ARN", ROLE.to_string()),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", token.path()),
        ("AWS_ENDPOINT_URL_STS", sts.url()),
    ]
}

async fn invoke(r: &Rebound, key: &str) -> crate::support::Answer {
    let headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer sk-app-own-key"),
        ("x-fake-key", key),
    ];
    send("POST", &format!("{}{INVOKE}", r.url), &headers, BODY).await
}

/// The `n`th request the provider received under `key` carries a valid signature by STS's
/// keys `m` (and its session token), and none of the app's own credential.
fn signed_by(provider: &FakeProvider, key: &str, n: usize, m: usize) {
    let seen = &provider.requests(key)[n];
    let auth = seen.header("authorization").unwrap();
    assert!(
        auth.starts_with(&format!("AWS4-HMAC-SHA256 Credential=ASIA{m}/")),
        "{auth}"
    );
    assert!(auth.contains("/us-east-1/bedrock/aws4_request"), "{auth}");
    assert!(!auth.contains("sk-app-own-key"));
    assert_eq!(seen.header("x-amz-security-token"), Some(format!("token-{m}").as_str()));
    let path = seen.path.as_str();
    assert!(path.ends_with("/anthropic.claude-sonnet-4-5-v1%3A0/invoke"), "{path}");
    sigv4_valid(
        &sts_secret(m),
        &seen.method,
        path,
        seen.query.as_deref(),
        &seen.headers,
        &seen.body,
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn web_identity_keys_sign_every_request_and_the_apps_key_never_reaches_aws() {
    let provider = FakeProvider::start().await;
    let sts = sts(Duration::from_secs(3600)).await;
    let token = TokenFile::new("eyJ.projected-service-account-token");
    let mut r = rebound(&provider, irsa(&sts, &token), |c| c).await;
    for key in ["a", "b"] {
        let resp = invoke(&r, key).await;
        assert_eq!(resp.status, 200, "{}", resp.text());
        signed_by(&provider, key, 0, 1);
    }
    // One STS call for both requests: the credential is held, not fetched per request.
    assert_eq!(sts.count(), 1);
    let asked = &sts.seen()[0];
    assert_eq!(asked.form("Action").as_deref(), Some("AssumeRoleWithWebIdentity"));
    assert_eq!(asked.form("RoleArn").as_deref(), Some(ROLE));
    assert_eq!(
        asked.form("WebIdentityToken").as_deref(),
        Some("eyJ.projected-service-account-token")
    );
    let page = r.metrics().await;
    assert_eq!(
        metric(
            &page,
            r#"rebound_credential_refreshes_total{result="ok",upstream="fake"}"#
        ),
        1.0
    );
    let left = metric(&page, r#"rebound_credential_expiry_seconds{upstream="fake"}"#);
    assert!(left > 3000.0, "{left}");
    assert!(!page.contains("secret-1") && !page.contains("token-1"));
    r.shutdown().await;
}

#[tokio::test]
async fn a_short_lived_credential_is_refreshed_before_it_expires_with_the_token_file_reread() {
    let provider = FakeProvider::start().await;
    // Four seconds of life: refreshed at half of it, before any request sees it expire.
    let sts = sts(Duration::from_secs(4)).await;
    let token = TokenFile::new("first-token");
    let mut r = rebound(&provider, irsa(&sts, &token), |c| c).await;
    assert_eq!(invoke(&r, "k").await.status, 200);
    signed_by(&provider, "k", 0, 1);
    token.rotate("rotated-token");
    until("a second STS call", Duration::from_secs(20), || async {
        match sts.count() {
            n if n >= 2 => Ok(()),
            n => Err(format!("{n} calls")),
        }
    })
    .await;
    assert_eq!(sts.seen()[1].form("WebIdentityToken").as_deref(), Some("rotated-token"));
    assert_eq!(invoke(&r, "k").await.status, 200);
    signed_by(&provider, "k", 1, 2);
    r.shutdown().await;
}

#[tokio::test]
async fn an_expired_token_answer_renews_the_credential_and_repeats_the_attempt_once_not_as_a_retry() {
    let provider = FakeProvider::start().await;
    let sts = sts(Duration::from_secs(3600)).await;
    let token = TokenFile::new("t");
    let expired = Step::status_with(
        403,
        &[("x-amzn-errortype", "ExpiredTokenException:http://internal.amazon.com/")],
    );
    provider.script("k", vec![expired.clone()]);
    let mut r = rebound(&provider, irsa(&sts, &token), |c| c).await;
    let resp = invoke(&r, "k").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.header("x-rebound-attempts"), Some("2"));
    assert_eq!(provider.count("k"), 2);
    assert_eq!(sts.count(), 2, "one refresh for the rejection");
    signed_by(&provider, "k", 1, 2);
    let page = r.metrics().await;
    assert_eq!(
        metric(&page, r#"rebound_retries_total{reason="403",route="fake"}"#),
        0.0
    );

    // Once per request: a second rejection is the app's to see.
    provider.script("twice", vec![expired.clone(), expired]);
    let resp = invoke(&r, "twice").await;
    assert_eq!(resp.status, 403);
    assert_eq!(provider.count("twice"), 2);
    r.shutdown().await;
}

#[tokio::test]
async fn no_credential_is_503_credential_unavailable_and_a_route_with_targets_fails_over() {
    let provider = FakeProvider::start().await;
    let sts = StandIn::start(|_, _| (503, vec![], "<ErrorResponse/>".into())).await;
    let token = TokenFile::new("t");
    let mut r = rebound(&provider, irsa(&sts, &token), |c| c).await;
    let resp = invoke(&r, "k").await;
    assert_credential_unavailable(&r, &resp, &provider, "k", "ErrorResponse").await;
    r.shutdown().await;

    // With a second target, the request goes there (failover reason `credential`).
    let other = FakeProvider::start().await;
    let mut r = rebound(&provider, irsa(&sts, &token), |c| {
        c.upstream_named("other", &other.url(), |_| {}).route(|route| {
            route.upstream = None;
            route.targets = Some(vec![
                rebound::hooks::config::raw::RawTarget {
                    upstream: some("fake"),
                    ..Default::default()
                },
                rebound::hooks::config::raw::RawTarget {
                    upstream: some("other"),
                    ..Default::default()
                },
            ]);
        })
    })
    .await;
    let resp = invoke(&r, "k").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.header("x-rebound-upstream"), Some("other"));
    let page = r.metrics().await;
    assert_eq!(
        metric(
            &page,
            r#"rebound_failovers_total{from="fake",reason="credential",route="fake",to="other"}"#
        ),
        1.0
    );
    r.shutdown().await;
}

#[tokio::test]
async fn container_credentials_are_fetched_with_the_token_file_reread() {
    let provider = FakeProvider::start().await;
    let endpoint = StandIn::start(|seen, n| {
        let auth = seen
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if auth != "pod-identity-token" {
            return (401, vec![], "{}".into());
        }
        let body = format!(
            r#"{{"AccessKeyId":"ASIA{m}","SecretAccessKey":"secret-{m}","Token":"token-{m}","Expiration":"{}"}}"#,
            crate::support::cloud::rfc3339_in(Duration::from_secs(3600)),
            m = n + 1
        );
        (200, vec![], body)
    })
    .await;
    let token = TokenFile::new("pod-identity-token\n");
    let env = vec![
        (
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            format!("{}/v1/credentials", endpoint.url()),
        ),
        ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token.path()),
    ];
    let mut r = rebound(&provider, env, |c| c).await;
    let resp = invoke(&r, "k").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    signed_by(&provider, "k", 0, 1);
    assert_eq!(endpoint.seen()[0].path, "/v1/credentials");
    r.shutdown().await;
}

#[tokio::test]
async fn imdsv2_gives_the_instance_roles_credential_with_its_session_token() {
    let provider = FakeProvider::start().await;
    let imds = StandIn::start(|seen, _| {
        let session = seen.headers.get("x-aws-ec2-metadata-token").and_then(|v| v.to_str().ok());
        match (seen.method.as_str(), seen.path.as_str(), session) {
            ("PUT", "/latest/api/token", _) => (200, vec![], "imds-session".into()),
            (_, _, Some("imds-session")) if seen.path.ends_with("/security-credentials/") => (200, vec![], "llm-role\n".into()),
            (_, "/latest/meta-data/iam/security-credentials/llm-role", Some("imds-session")) => {
                let body = format!(
                    r#"{{"Code":"Success","AccessKeyId":"ASIA1","SecretAccessKey":"secret-1","Token":"token-1","Expiration":"{}"}}"#,
                    crate::support::cloud::rfc3339_in(Duration::from_secs(3600))
                );
                (200, vec![], body)
            }
            _ => (401, vec![], String::new()),
        }
    })
    .await;
    let env = vec![
        ("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url()),
        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials".to_string()),
    ];
    let mut r = rebound(&provider, env, |c| c).await;
    let resp = invoke(&r, "k").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    signed_by(&provider, "k", 0, 1);
    assert_eq!(imds.count(), 3);
    r.shutdown().await;
}

#[tokio::test]
async fn a_role_on_top_is_assumed_with_a_signed_sts_call() {
    let provider = FakeProvider::start().await;
    let sts = StandIn::start(|_, _| (200, vec![], sts_answer("AssumeRole", 7, Duration::from_secs(3600)))).await;
    let env = vec![
        ("AWS_ACCESS_KEY_ID", "AKIDBASE".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "base-secret".to_string()),
        ("AWS_ENDPOINT_URL_STS", sts.url()),
    ];
    let mut r = rebound(&provider, env, |c| {
        c.upstream(|u| u.aws_role_arn = some("arn:aws:iam::123456789012:role/assumed"))
    })
    .await;
    let resp = invoke(&r, "k").await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    signed_by(&provider, "k", 0, 7);
    let asked = &sts.seen()[0];
    assert_eq!(asked.form("Action").as_deref(), Some("AssumeRole"));
    let headers: Vec<(String, String)> = asked
        .headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
        .collect();
    let auth = asked.headers["authorization"].to_str().unwrap();
    assert!(
        auth.contains("Credential=AKIDBASE/") && auth.contains("/us-east-1/sts/aws4_request"),
        "{auth}"
    );
    sigv4_valid("base-secret", &asked.method, "/", None, &headers, asked.body.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    r.shutdown().await;
}

#[tokio::test]
async fn a_stream_outlives_the_credential_it_was_signed_with() {
    let provider = FakeProvider::start().await;
    let sts = sts(Duration::from_secs(2)).await;
    let token = TokenFile::new("t");
    let mut r = rebound(&provider, irsa(&sts, &token), |c| c).await;
    // A stream of three seconds, signed with keys that expire after two.
    let headers = [
        ("content-type", "application/json"),
        ("x-fake-key", "s"),
        ("x-fake-chunks", "6"),
        ("x-fake-gap-ms", "500"),
    ];
    let url = format!("{}/fake/v1/chat/completions", r.url);
    let resp = send("POST", &url, &headers, r#"{"model":"m","stream":true}"#).await;
    assert_eq!(resp.status, 200);
    assert!(resp.text().contains("[DONE]"), "{}", resp.text());
    assert_eq!(provider.streams_completed("s"), 1);
    r.shutdown().await;
}

#[tokio::test]
async fn rebound_check_names_the_source_and_no_secret() {
    let config = TestConfig::new("https://bedrock-runtime.eu-west-3.amazonaws.com").upstream(|u| {
        u.auth = some("aws");
        u.aws_role_arn = some(ROLE);
    });
    let env = |name: &str| match name {
        "AWS_ACCESS_KEY_ID" => Some("AKIDCANARY".to_string()),
        "AWS_SECRET_ACCESS_KEY" => Some("secret-canary-value".to_string()),
        _ => None,
    };
    let parsed = rebound::Config::parse(&config.toml(), Path::new("test.toml"), &env).unwrap();
    let shown = format!("{}\n{parsed:?}", parsed.summary());
    assert!(
        shown.contains(&format!(
            "auth aws (SigV4 eu-west-3 bedrock, credential from environment, then assumes {ROLE})"
        )),
        "{shown}"
    );
    assert!(
        !shown.contains("secret-canary-value") && !shown.contains("AKIDCANARY"),
        "{shown}"
    );

    // A region the host does not name, and no AWS_REGION: the config says which key.
    let config = TestConfig::new("http://127.0.0.1:9").upstream(|u| u.auth = some("aws"));
    let err = rebound::Config::parse(&config.toml(), Path::new("test.toml"), &|_| None).unwrap_err();
    assert!(err.to_string().contains("upstreams.fake.aws_region"), "{err}");
}

/// The real binary, with the debug log: neither the web identity token, nor the keys STS gave,
/// nor the session token appear in its output, whatever happened (a rejection and a renewal).
#[tokio::test]
async fn no_credential_reaches_the_log() {
    let provider = FakeProvider::start().await;
    let sts = sts(Duration::from_secs(3600)).await;
    let token = TokenFile::new("eyJ.canary-web-identity-token");
    provider.script(
        "k",
        vec![Step::status_with(
            403,
            &[("x-amzn-errortype", "ExpiredTokenException:")],
        )],
    );
    let toml = TestConfig::new(&provider.url())
        .upstream(|u| {
            u.auth = some("aws");
            u.aws_region = some("us-east-1");
        })
        .toml();
    let (path, url) = (token.path(), sts.url());
    let env = [
        ("AWS_ROLE_ARN", ROLE),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", path.as_str()),
        ("AWS_ENDPOINT_URL_STS", url.as_str()),
        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials"),
        ("RUST_LOG", "debug"),
    ];
    let r = crate::support::sidecar::ReboundProcess::start(&toml, &env).await;
    let headers = [("authorization", "Bearer sk-app-canary"), ("x-fake-key", "k")];
    let resp = send("POST", &format!("{}{INVOKE}", r.proxy), &headers, BODY).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(sts.count(), 2);
    let logs = r.logs();
    assert!(logs.contains("cloud credential rejected"), "{logs}");
    for secret in [
        "canary-web-identity-token",
        "secret-1",
        "secret-2",
        "token-1",
        "token-2",
        "sk-app-canary",
    ] {
        assert!(!logs.contains(secret), "{secret} in the log:\n{logs}");
    }
}
