//! The AWS default credential chain, on rebound's own client (not the AWS SDK's: `aws-config`
//! would bring its own HTTP stack, runtime and a hundred crates for five small calls): keys in
//! the environment, the shared credentials file, web identity (IRSA: STS
//! `AssumeRoleWithWebIdentity` with the token file, re-read at each refresh), the container
//! endpoint (EKS Pod Identity, ECS: its authorization token file re-read at each refresh), the
//! instance metadata service (IMDSv2, with its session token), and a role assumed on top of any
//! of them (`aws_role_arn`: STS `AssumeRole`, signed with the chain's credential).
//!
//! Which source applies is decided once, from the environment ([`CloudEnv::aws_source`]), as the
//! SDKs do: a source that fails is an error to see, not a reason to try the next one.

use std::time::SystemTime;

use futures_util::future::BoxFuture;
use http::{HeaderName, HeaderValue, Method};
use serde::Deserialize;

use super::fetch::{Fetch, TokenCall};
use super::sigv4::{self, Keys};
use super::{invalid, read, rfc3339, secret, Credential, Issued, Source, SourceError};
use crate::config::{AwsAuth, AwsSource, CloudEnv};

/// The instance metadata service, where `AWS_EC2_METADATA_SERVICE_ENDPOINT` does not say.
const IMDS: &str = "http://169.254.169.254";
/// The ECS and EKS Pod Identity agent, for a relative container credentials URI.
const CONTAINER_HOST: &str = "http://169.254.170.2";
/// The session name of the roles rebound assumes (seen in CloudTrail).
const SESSION_NAME: &str = "rebound";

/// The chain for `auth`, in `env`.
pub(crate) fn chain(auth: &AwsAuth, env: &CloudEnv) -> Box<dyn Source> {
    let base = Base {
        kind: env.aws_source(),
        env: env.clone(),
        region: auth.region.clone(),
    };
    match &auth.role_arn {
        Some(role) => Box::new(AssumeRole {
            base,
            role: role.clone(),
            region: auth.region.clone(),
        }),
        None => Box::new(base),
    }
}

/// The chain's own source.
struct Base {
    kind: AwsSource,
    env: CloudEnv,
    region: String,
}

impl Source for Base {
    fn fetch<'a>(&'a self, http: &'a Fetch) -> BoxFuture<'a, Result<Issued, SourceError>> {
        Box::pin(self.keys(http))
    }
}

impl Base {
    async fn keys(&self, http: &Fetch) -> Result<Issued, SourceError> {
        let env = &self.env;
        match self.kind {
            AwsSource::Environment => {
                let keys = Keys {
                    access_key_id: env.get("AWS_ACCESS_KEY_ID").unwrap_or_default().to_string(),
                    secret_access_key: env.get("AWS_SECRET_ACCESS_KEY").unwrap_or_default().to_string(),
                    session_token: env.get("AWS_SESSION_TOKEN").map(str::to_string),
                };
                Ok(issued(keys, None))
            }
            AwsSource::Profile => profile(env),
            AwsSource::WebIdentity => {
                let file = env.get("AWS_WEB_IDENTITY_TOKEN_FILE").unwrap_or_default();
                let token = read(file)?;
                let role = env.get("AWS_ROLE_ARN").unwrap_or_default();
                let session = env.get("AWS_ROLE_SESSION_NAME").unwrap_or(SESSION_NAME);
                let url = sts_url(env, &self.region);
                let form = [
                    ("Action", "AssumeRoleWithWebIdentity"),
                    ("Version", "2011-06-15"),
                    ("RoleArn", role),
                    ("RoleSessionName", session),
                    ("WebIdentityToken", token.trim()),
                ];
                let (_, body) = http
                    .send(TokenCall::form("STS AssumeRoleWithWebIdentity", &url, &form))
                    .await?;
                sts_keys("STS AssumeRoleWithWebIdentity", &body)
            }
            AwsSource::Container => {
                let url = match env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") {
                    Some(full) => full.to_string(),
                    None => format!(
                        "{CONTAINER_HOST}{}",
                        env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").unwrap_or_default()
                    ),
                };
                let token = match env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
                    Some(file) => Some(read(file)?.trim().to_string()),
                    None => env.get("AWS_CONTAINER_AUTHORIZATION_TOKEN").map(str::to_string),
                };
                const WHAT: &str = "the container credentials endpoint";
                let mut call = TokenCall::get(WHAT, &url);
                if let Some(token) = token {
                    call = call.header(http::header::AUTHORIZATION, secret(&token, WHAT)?);
                }
                let (_, body) = http.send(call).await?;
                json_keys("the container credentials endpoint", &body)
            }
            AwsSource::InstanceMetadata => {
                if env
                    .get("AWS_EC2_METADATA_DISABLED")
                    .is_some_and(|v| v.eq_ignore_ascii_case("true"))
                {
                    return Err(SourceError::Invalid {
                        what: "the AWS credential chain",
                        detail: "no source: no keys, profile, web identity or container endpoint, \
                                 and AWS_EC2_METADATA_DISABLED is set"
                            .into(),
                    });
                }
                imds(http, env.get("AWS_EC2_METADATA_SERVICE_ENDPOINT").unwrap_or(IMDS)).await
            }
        }
    }
}

/// A role assumed on top of the chain's credential (`aws_role_arn`).
struct AssumeRole {
    base: Base,
    role: String,
    region: String,
}

impl Source for AssumeRole {
    fn fetch<'a>(&'a self, http: &'a Fetch) -> BoxFuture<'a, Result<Issued, SourceError>> {
        Box::pin(async move {
            const WHAT: &str = "STS AssumeRole";
            let Credential::Aws(keys) = self.base.keys(http).await?.credential else {
                return Err(invalid(WHAT, "the chain gave no AWS keys"));
            };
            let url = sts_url(&self.base.env, &self.region);
            let form = [
                ("Action", "AssumeRole"),
                ("Version", "2011-06-15"),
                ("RoleArn", self.role.as_str()),
                ("RoleSessionName", SESSION_NAME),
            ];
            let call = TokenCall::form(WHAT, &url, &form);
            let mut req = http::Request::new(http_body_util::Full::new(call.body.clone()));
            *req.method_mut() = Method::POST;
            *req.uri_mut() = url.parse().map_err(|_| SourceError::Invalid {
                what: WHAT,
                detail: "the STS endpoint is not a URL".into(),
            })?;
            for (name, value) in &call.headers {
                req.headers_mut().insert(name.clone(), value.clone());
            }
            let scope = sigv4::Scope {
                host: "",
                region: &self.region,
                service: "sts",
                time: crate::time::wall_now(),
            };
            sigv4::sign_request(&mut req, &sigv4::payload_hash(&call.body), &keys, &scope).map_err(|e| {
                SourceError::Invalid {
                    what: WHAT,
                    detail: e.to_string(),
                }
            })?;
            let mut signed = call;
            signed.headers = req.headers().iter().map(|(n, v)| (n.clone(), v.clone())).collect();
            let (_, body) = http.send(signed).await?;
            sts_keys(WHAT, &body)
        })
    }
}

/// STS: `AWS_ENDPOINT_URL_STS`, else the region's endpoint.
fn sts_url(env: &CloudEnv, region: &str) -> String {
    match env.get("AWS_ENDPOINT_URL_STS") {
        Some(url) => url.trim_end_matches('/').to_string() + "/",
        None => format!("https://sts.{region}.amazonaws.com/"),
    }
}

/// IMDSv2: a session token (PUT), the instance role's name, then its credential.
async fn imds(http: &Fetch, endpoint: &str) -> Result<Issued, SourceError> {
    const WHAT: &str = "the instance metadata service";
    let base = endpoint.trim_end_matches('/');
    let token_url = format!("{base}/latest/api/token");
    let mut call = TokenCall::get(WHAT, &token_url).header(
        HeaderName::from_static("x-aws-ec2-metadata-token-ttl-seconds"),
        HeaderValue::from_static("21600"),
    );
    call.method = Method::PUT;
    let (_, token) = http.send(call).await?;
    let token = std::str::from_utf8(&token).map_err(|_| invalid(WHAT, "its session token is not text"))?;
    let token = secret(token.trim(), WHAT)?;
    let token_header = HeaderName::from_static("x-aws-ec2-metadata-token");
    let roles_url = format!("{base}/latest/meta-data/iam/security-credentials/");
    let (_, roles) = http
        .send(TokenCall::get(WHAT, &roles_url).header(token_header.clone(), token.clone()))
        .await?;
    let role = std::str::from_utf8(&roles)
        .ok()
        .and_then(|r| r.lines().next())
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .ok_or_else(|| invalid(WHAT, "the instance has no role"))?;
    let creds_url = format!("{roles_url}{role}");
    let (_, body) = http
        .send(TokenCall::get(WHAT, &creds_url).header(token_header, token))
        .await?;
    json_keys(WHAT, &body)
}

/// The `[AWS_PROFILE]` (else `[default]`) keys of the shared credentials file.
fn profile(env: &CloudEnv) -> Result<Issued, SourceError> {
    const WHAT: &str = "the shared credentials file";
    let path = env
        .aws_credentials_file()
        .ok_or_else(|| invalid(WHAT, "no path (HOME is not set)"))?;
    let text = read(&path.display().to_string())?;
    let wanted = env.get("AWS_PROFILE").unwrap_or("default");
    let (mut section, mut keys) = (String::new(), Keys::empty());
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_string();
        } else if let (true, Some((k, v))) = (section == wanted, line.split_once('=')) {
            let v = v.trim().to_string();
            match k.trim() {
                "aws_access_key_id" => keys.access_key_id = v,
                "aws_secret_access_key" => keys.secret_access_key = v,
                "aws_session_token" => keys.session_token = Some(v),
                _ => {}
            }
        }
    }
    if keys.access_key_id.is_empty() || keys.secret_access_key.is_empty() {
        return Err(invalid(WHAT, &format!("no keys for the profile {wanted:?}")));
    }
    Ok(issued(keys, None))
}

impl Keys {
    fn empty() -> Keys {
        Keys {
            access_key_id: String::new(),
            secret_access_key: String::new(),
            session_token: None,
        }
    }
}

/// The credential of an STS answer (`AssumeRole` or `AssumeRoleWithWebIdentity`).
fn sts_keys(what: &'static str, body: &[u8]) -> Result<Issued, SourceError> {
    #[derive(Deserialize)]
    struct Response {
        #[serde(rename = "AssumeRoleWithWebIdentityResult", alias = "AssumeRoleResult")]
        result: Result_,
    }
    #[derive(Deserialize)]
    struct Result_ {
        #[serde(rename = "Credentials")]
        credentials: StsCredentials,
    }
    #[derive(Deserialize)]
    struct StsCredentials {
        #[serde(rename = "AccessKeyId")]
        access_key_id: String,
        #[serde(rename = "SecretAccessKey")]
        secret_access_key: String,
        #[serde(rename = "SessionToken")]
        session_token: String,
        #[serde(rename = "Expiration")]
        expiration: String,
    }
    let text = std::str::from_utf8(body).map_err(|_| invalid(what, "the answer is not text"))?;
    let c = quick_xml::de::from_str::<Response>(text)
        .map_err(|_| invalid(what, "the answer holds no credentials"))?
        .result
        .credentials;
    let expires = rfc3339(what, &c.expiration)?;
    let keys = Keys {
        access_key_id: c.access_key_id,
        secret_access_key: c.secret_access_key,
        session_token: Some(c.session_token),
    };
    Ok(issued(keys, Some(expires)))
}

/// The credential of a container or instance metadata answer (JSON).
fn json_keys(what: &'static str, body: &[u8]) -> Result<Issued, SourceError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Answer {
        access_key_id: String,
        secret_access_key: String,
        token: Option<String>,
        expiration: Option<String>,
    }
    let a: Answer = serde_json::from_slice(body).map_err(|_| invalid(what, "the answer holds no credentials"))?;
    let expires = a.expiration.as_deref().map(|e| rfc3339(what, e)).transpose()?;
    let keys = Keys {
        access_key_id: a.access_key_id,
        secret_access_key: a.secret_access_key,
        session_token: a.token,
    };
    Ok(issued(keys, expires))
}

fn issued(keys: Keys, expires: Option<SystemTime>) -> Issued {
    Issued {
        credential: Credential::Aws(keys),
        expires,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STS: &str = r#"<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <SubjectFromWebIdentityToken>system:serviceaccount:default:app</SubjectFromWebIdentityToken>
    <Credentials>
      <SessionToken>FwoGZXIvYXdzEXAMPLE</SessionToken>
      <SecretAccessKey>wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY</SecretAccessKey>
      <Expiration>2026-12-05T17:00:00Z</Expiration>
      <AccessKeyId>ASIAEXAMPLE</AccessKeyId>
    </Credentials>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata><RequestId>ad4156e9-bce1-11e2-82e6-6b6efEXAMPLE</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>"#;

    #[test]
    fn an_sts_answer_gives_temporary_keys_and_their_expiry() {
        let issued = sts_keys("STS", STS.as_bytes()).unwrap();
        let Credential::Aws(keys) = issued.credential else {
            panic!("not keys")
        };
        assert_eq!(keys.access_key_id, "ASIAEXAMPLE");
        assert_eq!(keys.session_token.as_deref(), Some("FwoGZXIvYXdzEXAMPLE"));
        let expires = issued.expires.unwrap().duration_since(SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(expires.as_secs(), 1_796_490_000);
        let assumed = STS.replace("AssumeRoleWithWebIdentity", "AssumeRole");
        assert!(sts_keys("STS", assumed.as_bytes()).is_ok());
        assert!(sts_keys("STS", b"<ErrorResponse/>").is_err());
    }

    #[test]
    fn a_metadata_answer_gives_keys_and_a_wrong_one_names_the_service_only() {
        let body = br#"{"Code":"Success","AccessKeyId":"ASIA1","SecretAccessKey":"s","Token":"t","Expiration":"2026-12-05T17:00:00Z"}"#;
        let issued = json_keys("IMDS", body).unwrap();
        assert!(issued.expires.is_some());
        let err = json_keys("IMDS", br#"{"SecretAccessKey":"do-not-show"}"#)
            .err()
            .unwrap();
        assert!(!err.to_string().contains("do-not-show"), "{err}");
        assert!(err.to_string().starts_with("IMDS"), "{err}");
    }

    #[test]
    fn a_profile_is_read_from_its_section() {
        let dir = std::env::temp_dir().join(format!("rebound-aws-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("credentials");
        std::fs::write(
            &file,
            "[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key = s1\n\n[llm]\naws_access_key_id=AKLLM\naws_secret_access_key=s2\n",
        )
        .unwrap();
        let path = file.display().to_string();
        let env = CloudEnv::capture(&|n| match n {
            "AWS_SHARED_CREDENTIALS_FILE" => Some(path.clone()),
            "AWS_PROFILE" => Some("llm".into()),
            _ => None,
        });
        assert_eq!(env.aws_source(), AwsSource::Profile);
        let Credential::Aws(keys) = profile(&env).unwrap().credential else {
            panic!("not keys")
        };
        assert_eq!(keys.access_key_id, "AKLLM");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
