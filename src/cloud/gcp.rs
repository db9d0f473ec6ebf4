//! Google's Application Default Credentials, on rebound's own client, for access tokens of scope
//! `cloud-platform`: the credentials file (`GOOGLE_APPLICATION_CREDENTIALS`, else gcloud's) by
//! its type, re-read at each refresh (a service account key: a JWT signed RS256 with its key and
//! exchanged at its `token_uri`; workload identity federation, `external_account`: the subject
//! token file exchanged at STS, then a service account impersonated when the file names one; a
//! user's refresh token), else the metadata server (GKE Workload Identity, a VM's account).
//!
//! Which source applies is decided once, from the environment ([`CloudEnv::gcp_credentials_file`]),
//! as Google's libraries do: a source that fails is an error to see, not a reason to try the next.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use futures_util::future::BoxFuture;
use http::{HeaderName, HeaderValue};
use ring::rand::SystemRandom;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use rustls::pki_types::PrivateKeyDer;
use serde::Deserialize;

use super::fetch::{Fetch, TokenCall};
use super::{invalid, oauth, read, rfc3339, Credential, Issued, Source, SourceError};
use crate::config::CloudEnv;

/// The scope of every token rebound asks Google for (Vertex AI's).
pub(crate) const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// Google's token endpoint, where a credentials file names none.
const TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
/// The metadata server, where `GCE_METADATA_HOST` does not say.
const METADATA_HOST: &str = "metadata.google.internal";
/// The life of a service account's JWT, and of an impersonated token (Google's maximum for both).
const LIFE_SECS: u64 = 3600;
const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";
const FILE: &str = "the Google credentials file";

/// The chain in `env`.
pub(crate) fn source(env: &CloudEnv) -> Box<dyn Source> {
    let host = env.get("GCE_METADATA_HOST").unwrap_or(METADATA_HOST);
    Box::new(Adc {
        file: env.gcp_credentials_file().map(|f| f.display().to_string()),
        metadata: format!("http://{host}/computeMetadata/v1/instance/service-accounts/default/token"),
    })
}

/// The chain: a credentials file, else the metadata server.
struct Adc {
    file: Option<String>,
    metadata: String,
}

impl Source for Adc {
    fn fetch<'a>(&'a self, http: &'a Fetch) -> BoxFuture<'a, Result<Issued, SourceError>> {
        Box::pin(async move {
            let Some(path) = &self.file else {
                return metadata_server(http, &self.metadata).await;
            };
            match parse(path, &read(path)?)? {
                KeyFile::ServiceAccount(key) => service_account(http, &key).await,
                KeyFile::ExternalAccount(ext) => external_account(http, &ext).await,
                KeyFile::AuthorizedUser(user) => authorized_user(http, &user).await,
            }
        })
    }
}

/// A credentials file, by its `type` (no `Debug`: it holds secrets).
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum KeyFile {
    ServiceAccount(ServiceAccountKey),
    ExternalAccount(ExternalAccount),
    AuthorizedUser(AuthorizedUser),
}

#[derive(Deserialize)]
struct ServiceAccountKey {
    client_email: String,
    /// PKCS#8, PEM.
    private_key: String,
    private_key_id: Option<String>,
    token_uri: Option<String>,
}

#[derive(Deserialize)]
struct ExternalAccount {
    audience: String,
    subject_token_type: String,
    token_url: String,
    service_account_impersonation_url: Option<String>,
    #[serde(default)]
    service_account_impersonation: Impersonation,
    credential_source: CredentialSource,
}

#[derive(Deserialize, Default)]
struct Impersonation {
    token_lifetime_seconds: Option<u64>,
}

#[derive(Deserialize)]
struct CredentialSource {
    /// The subject token's file (the other kinds, `url`, `executable` and AWS's, are refused).
    file: Option<String>,
    #[serde(default)]
    format: Format,
}

#[derive(Deserialize, Default)]
struct Format {
    /// `text` (the default) or `json`.
    #[serde(rename = "type")]
    kind: Option<String>,
    subject_token_field_name: Option<String>,
}

#[derive(Deserialize)]
struct AuthorizedUser {
    client_id: String,
    client_secret: String,
    refresh_token: String,
    token_uri: Option<String>,
}

/// The credentials file at `path`. serde's message is kept only where it names a field or a
/// type: other messages may quote a value of the file.
fn parse(path: &str, text: &str) -> Result<KeyFile, SourceError> {
    serde_json::from_str(text).map_err(|e| {
        let message = e.to_string();
        let detail = match message.starts_with("missing field") || message.starts_with("unknown variant") {
            true => message,
            false => "not a service_account, external_account or authorized_user file".to_string(),
        };
        invalid(FILE, &format!("{path}: {detail}"))
    })
}

/// A service account key: its signed JWT exchanged for an access token.
async fn service_account(http: &Fetch, key: &ServiceAccountKey) -> Result<Issued, SourceError> {
    const WHAT: &str = "Google's token endpoint";
    let now = crate::time::wall_now();
    let jwt = assertion(key, now)?;
    let uri = key.token_uri.as_deref().unwrap_or(TOKEN_URI);
    let form = [("grant_type", JWT_BEARER), ("assertion", jwt.as_str())];
    let (_, body) = http.send(TokenCall::form(WHAT, uri, &form)).await?;
    oauth::token(WHAT, &body, now)
}

/// The JWT a service account presents (RFC 7523): `header.claims.signature`, base64url, signed
/// RS256 with the key's private key, for `SCOPE`, addressed to its token endpoint, valid an hour.
fn assertion(key: &ServiceAccountKey, now: SystemTime) -> Result<String, SourceError> {
    const WHAT: &str = "the service account key";
    let iat = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut header = serde_json::json!({"alg": "RS256", "typ": "JWT"});
    if let Some(kid) = &key.private_key_id {
        header["kid"] = serde_json::Value::from(kid.as_str());
    }
    let claims = serde_json::json!({
        "iss": key.client_email,
        "scope": SCOPE,
        "aud": key.token_uri.as_deref().unwrap_or(TOKEN_URI),
        "iat": iat,
        "exp": iat + LIFE_SECS,
    });
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let Ok(Some(PrivateKeyDer::Pkcs8(der))) = rustls_pemfile::private_key(&mut key.private_key.as_bytes()) else {
        return Err(invalid(WHAT, "its private_key is not a PKCS#8 PEM key"));
    };
    let pair = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der())
        .map_err(|_| invalid(WHAT, "its private_key is not an RSA key of 2048 to 4096 bits"))?;
    let mut signature = vec![0; pair.public().modulus_len()];
    pair.sign(
        &RSA_PKCS1_SHA256,
        &SystemRandom::new(),
        input.as_bytes(),
        &mut signature,
    )
    .map_err(|_| invalid(WHAT, "the JWT could not be signed"))?;
    Ok(format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature)))
}

/// Workload identity federation: the subject token exchanged at STS (RFC 8693), then, when the
/// file names a service account to impersonate, that account's token.
async fn external_account(http: &Fetch, ext: &ExternalAccount) -> Result<Issued, SourceError> {
    const WHAT: &str = "Google STS";
    let subject = subject_token(&ext.credential_source)?;
    let now = crate::time::wall_now();
    let form = [
        ("grant_type", TOKEN_EXCHANGE),
        ("requested_token_type", ACCESS_TOKEN_TYPE),
        ("subject_token_type", ext.subject_token_type.as_str()),
        ("subject_token", subject.as_str()),
        ("audience", ext.audience.as_str()),
        ("scope", SCOPE),
    ];
    let (_, body) = http.send(TokenCall::form(WHAT, &ext.token_url, &form)).await?;
    let federated = oauth::token(WHAT, &body, now)?;
    match &ext.service_account_impersonation_url {
        Some(url) => {
            let life = ext
                .service_account_impersonation
                .token_lifetime_seconds
                .unwrap_or(LIFE_SECS);
            impersonate(http, url, federated, life).await
        }
        None => Ok(federated),
    }
}

/// The subject token of an `external_account` (its file re-read at each refresh: the platform
/// rotates it): the file's text, or a field of its JSON.
fn subject_token(source: &CredentialSource) -> Result<String, SourceError> {
    let Some(path) = &source.file else {
        return Err(invalid(
            FILE,
            "credential_source: only a `file` is supported (not a `url`, an `executable` or AWS)",
        ));
    };
    let text = read(path)?;
    let token = match source.format.kind.as_deref().unwrap_or("text") {
        "text" => text.trim().to_string(),
        "json" => {
            let Some(field) = source.format.subject_token_field_name.as_deref() else {
                return Err(invalid(
                    FILE,
                    "credential_source.format json needs subject_token_field_name",
                ));
            };
            serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.get(field)?.as_str().map(str::to_string))
                .ok_or_else(|| invalid(FILE, &format!("{path}: no string field {field:?}")))?
        }
        other => {
            return Err(invalid(
                FILE,
                &format!("credential_source.format type {other:?}: expected \"text\" or \"json\""),
            ))
        }
    };
    match token.is_empty() {
        true => Err(invalid(FILE, &format!("{path}: the subject token is empty"))),
        false => Ok(token),
    }
}

/// A service account's token, asked for with the federated token (IAM Credentials
/// `generateAccessToken`), valid `life` seconds.
async fn impersonate(http: &Fetch, url: &str, federated: Issued, life: u64) -> Result<Issued, SourceError> {
    const WHAT: &str = "the IAM Credentials API";
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Answer {
        access_token: String,
        expire_time: String,
    }
    let Credential::Bearer(federated) = federated.credential else {
        return Err(invalid(WHAT, "STS gave no bearer token"));
    };
    let body = serde_json::json!({"scope": [SCOPE], "lifetime": format!("{life}s")}).to_string();
    let call = TokenCall::json(WHAT, url, body).header(http::header::AUTHORIZATION, federated);
    let (_, body) = http.send(call).await?;
    let a: Answer = serde_json::from_slice(&body).map_err(|_| invalid(WHAT, "the answer holds no accessToken"))?;
    oauth::bearer(WHAT, &a.access_token, rfc3339(WHAT, &a.expire_time)?)
}

/// A user's refresh token (gcloud's `application_default_credentials.json`).
async fn authorized_user(http: &Fetch, user: &AuthorizedUser) -> Result<Issued, SourceError> {
    const WHAT: &str = "Google's token endpoint";
    let now = crate::time::wall_now();
    let form = [
        ("grant_type", "refresh_token"),
        ("client_id", user.client_id.as_str()),
        ("client_secret", user.client_secret.as_str()),
        ("refresh_token", user.refresh_token.as_str()),
    ];
    let uri = user.token_uri.as_deref().unwrap_or(TOKEN_URI);
    let (_, body) = http.send(TokenCall::form(WHAT, uri, &form)).await?;
    oauth::token(WHAT, &body, now)
}

/// The metadata server's token for the default service account (on GKE with Workload Identity,
/// the one the pod's Kubernetes service account is bound to).
async fn metadata_server(http: &Fetch, url: &str) -> Result<Issued, SourceError> {
    const WHAT: &str = "the metadata server";
    let now = crate::time::wall_now();
    let call = TokenCall::get(WHAT, url).header(
        HeaderName::from_static("metadata-flavor"),
        HeaderValue::from_static("Google"),
    );
    let (_, body) = http.send(call).await?;
    oauth::token(WHAT, &body, now)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ring::signature::{UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};

    use super::*;

    /// A throwaway 2048-bit RSA key (PKCS#8), made for the tests with `openssl genpkey`.
    const TEST_KEY: &str = include_str!("testdata/rsa_test_key.pem");

    fn key() -> ServiceAccountKey {
        ServiceAccountKey {
            client_email: "llm@project.iam.gserviceaccount.com".into(),
            private_key: TEST_KEY.into(),
            private_key_id: Some("kid-1".into()),
            token_uri: Some("https://oauth2.example/token".into()),
        }
    }

    fn decoded(part: &str) -> serde_json::Value {
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
    }

    #[test]
    fn a_service_account_jwt_is_rs256_signed_with_its_key_for_the_scope_and_token_endpoint() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let jwt = assertion(&key(), now).unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        let [header, claims, signature] = parts[..] else {
            panic!("{jwt}")
        };
        assert_eq!(
            decoded(header),
            serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": "kid-1"})
        );
        assert_eq!(
            decoded(claims),
            serde_json::json!({
                "iss": "llm@project.iam.gserviceaccount.com",
                "scope": "https://www.googleapis.com/auth/cloud-platform",
                "aud": "https://oauth2.example/token",
                "iat": 1_800_000_000u64,
                "exp": 1_800_003_600u64,
            })
        );
        let Ok(Some(PrivateKeyDer::Pkcs8(der))) = rustls_pemfile::private_key(&mut TEST_KEY.as_bytes()) else {
            panic!("the test key")
        };
        let public = RsaKeyPair::from_pkcs8(der.secret_pkcs8_der())
            .unwrap()
            .public()
            .as_ref()
            .to_vec();
        let verifier = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, public);
        let signed = format!("{header}.{claims}");
        verifier
            .verify(signed.as_bytes(), &URL_SAFE_NO_PAD.decode(signature).unwrap())
            .unwrap();
        assert!(verifier
            .verify(b"other.input", &URL_SAFE_NO_PAD.decode(signature).unwrap())
            .is_err());
    }

    #[test]
    fn a_key_that_is_not_rsa_pkcs8_is_an_error_that_shows_none_of_it() {
        let mut k = key();
        k.private_key = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END PRIVATE KEY-----\n".into();
        let err = assertion(&k, UNIX_EPOCH).err().unwrap().to_string();
        assert!(err.starts_with("the service account key: "), "{err}");
        assert!(!err.contains("c2VjcmV0"), "{err}");
        k.private_key = "secret-not-pem".into();
        let err = assertion(&k, UNIX_EPOCH).err().unwrap().to_string();
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn a_credentials_file_is_read_by_its_type_and_its_errors_quote_no_value() {
        let sa = r#"{"type":"service_account","client_email":"a@b","private_key":"k"}"#;
        assert!(matches!(parse("f", sa), Ok(KeyFile::ServiceAccount(_))));
        let err = parse("f", r#"{"type":"service_account","private_key":"secret-pem"}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("missing field `client_email`") && !err.contains("secret"),
            "{err}"
        );
        let err = parse("f", r#"{"type":"impersonated_service_account"}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("unknown variant"), "{err}");
        let err = parse(
            "f",
            r#"{"type":"service_account","client_email":"a","private_key":["secret-pem"]}"#,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn a_subject_token_is_the_files_text_or_a_field_of_its_json() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let source = |kind: Option<&str>, field: Option<&str>| CredentialSource {
            file: Some(path.display().to_string()),
            format: Format {
                kind: kind.map(str::to_string),
                subject_token_field_name: field.map(str::to_string),
            },
        };
        std::fs::write(&path, "eyJ.oidc-token\n").unwrap();
        assert_eq!(subject_token(&source(None, None)).unwrap(), "eyJ.oidc-token");
        assert_eq!(subject_token(&source(Some("text"), None)).unwrap(), "eyJ.oidc-token");
        std::fs::write(&path, r#"{"id_token":"eyJ.from-json","other":1}"#).unwrap();
        let json = source(Some("json"), Some("id_token"));
        assert_eq!(subject_token(&json).unwrap(), "eyJ.from-json");
        assert!(subject_token(&source(Some("json"), Some("other"))).is_err());
        assert!(subject_token(&source(Some("json"), None)).is_err());
        assert!(subject_token(&source(Some("xml"), None)).is_err());
        let url = CredentialSource {
            file: None,
            format: Format::default(),
        };
        assert!(subject_token(&url).err().unwrap().to_string().contains("only a `file`"));
    }
}
