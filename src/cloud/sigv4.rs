//! SigV4 on a request upstream, by AWS's own signer (`aws-sigv4`). The payload is hashed by the
//! caller, once per request, whatever the number of attempts.
//!
//! What is signed: the method, the URI, `host` (from the URI), `content-type` and every `x-amz-`
//! header; the app's other headers pass unsigned (a proxy between may change them without
//! breaking the signature, and nothing AWS reads from them needs it).

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use bytes::Bytes;
use http::Request;
use http_body_util::Full;

/// Keys of an AWS identity (`session_token` for temporary ones).
#[derive(Clone)]
pub(crate) struct Keys {
    pub(crate) access_key_id: String,
    pub(crate) secret_access_key: String,
    pub(crate) session_token: Option<String>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(<redacted>)")
    }
}

/// The hex SHA-256 of a request body, as SigV4 signs it.
pub(crate) fn payload_hash(body: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, body);
    hex::encode(digest.as_ref())
}

/// Why a request could not be signed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SignError {
    #[error("a header value is not visible ASCII")]
    Header,
    #[error("SigV4: {0}")]
    Sign(String),
}

/// What one signature is made for.
pub(crate) struct Scope<'a> {
    /// The host (and port) the request goes to: an upstream request's URI is in origin form.
    pub(crate) host: &'a str,
    pub(crate) region: &'a str,
    pub(crate) service: &'a str,
    pub(crate) time: SystemTime,
}

/// Signs `req` (whose body hashes to `payload`) with `keys` for `scope`: `authorization`,
/// `x-amz-date` and, with a session token, `x-amz-security-token` are set.
pub(crate) fn sign_request(
    req: &mut Request<Full<Bytes>>,
    payload: &str,
    keys: &Keys,
    scope: &Scope<'_>,
) -> Result<(), SignError> {
    let identity: Identity = Credentials::new(
        &keys.access_key_id,
        &keys.secret_access_key,
        keys.session_token.clone(),
        None,
        "rebound",
    )
    .into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(scope.region)
        .name(scope.service)
        .time(scope.time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| SignError::Sign(e.to_string()))?
        .into();
    // Reserved characters in the path (a Bedrock model id's `:`) are sent encoded, as AWS's
    // SDKs send them, so that the signature's double encoding matches the service's.
    if let Some(encoded) = encoded_path(req.uri()) {
        *req.uri_mut() = encoded;
    }
    let mut headers = Vec::new();
    for (name, value) in req.headers() {
        let n = name.as_str();
        if n == "content-type" || n.starts_with("x-amz-") {
            headers.push((n, value.to_str().map_err(|_| SignError::Header)?));
        }
    }
    let uri = match req.uri().authority() {
        Some(_) => req.uri().to_string(),
        None => format!("https://{}{}", scope.host, req.uri()),
    };
    let signable = SignableRequest::new(
        req.method().as_str(),
        &uri,
        headers.into_iter(),
        SignableBody::Precomputed(payload.to_string()),
    )
    .map_err(|e| SignError::Sign(e.to_string()))?;
    let (instructions, _) = sign(signable, &params)
        .map_err(|e| SignError::Sign(e.to_string()))?
        .into_parts();
    instructions.apply_to_request_http1x(req);
    Ok(())
}

/// `uri` with every byte of its path outside RFC 3986's unreserved set, `/` and `%` encoded;
/// `None` when it has none.
fn encoded_path(uri: &http::Uri) -> Option<http::Uri> {
    let path = uri.path();
    let keep = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/' | b'%');
    if path.bytes().all(keep) {
        return None;
    }
    let mut out = String::with_capacity(path.len() + 8);
    for b in path.bytes() {
        match keep(b) {
            true => out.push(b as char),
            false => out.push_str(&format!("%{b:02X}")),
        }
    }
    if let Some(q) = uri.query() {
        out.push('?');
        out.push_str(q);
    }
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = out.parse().ok();
    http::Uri::from_parts(parts).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    /// AWS's published example (the IAM `ListUsers` request of the SigV4 documentation, "Create
    /// a signed AWS API request"), signed by this code and checked against AWS's own result.
    #[test]
    fn the_published_example_signs_to_awss_signature() {
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.uri_mut() = "https://iam.amazonaws.com/?Action=ListUsers&Version=2010-05-08"
            .parse()
            .unwrap();
        req.headers_mut().insert(
            "content-type",
            "application/x-www-form-urlencoded; charset=utf-8".parse().unwrap(),
        );
        let keys = Keys {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        };
        // 20150830T123600Z
        let time = UNIX_EPOCH + Duration::from_secs(1_440_938_160);
        let scope = Scope {
            host: "unused.example",
            region: "us-east-1",
            service: "iam",
            time,
        };
        sign_request(&mut req, &payload_hash(b""), &keys, &scope).unwrap();
        let auth = req.headers()["authorization"].to_str().unwrap();
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
        assert_eq!(req.headers()["x-amz-date"], "20150830T123600Z");
        assert!(req.headers().get("x-amz-security-token").is_none());
    }

    #[test]
    fn a_model_ids_colon_is_sent_encoded() {
        let uri: http::Uri = "https://h/model/anthropic.claude-v2:1/invoke?x=1".parse().unwrap();
        let encoded = encoded_path(&uri).unwrap();
        assert_eq!(
            encoded.to_string(),
            "https://h/model/anthropic.claude-v2%3A1/invoke?x=1"
        );
        assert!(encoded_path(&encoded).is_none());
    }

    #[test]
    fn a_session_token_is_sent_and_the_empty_body_hash_is_sha256s() {
        assert_eq!(
            payload_hash(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let mut req = Request::new(Full::new(Bytes::from_static(b"{}")));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = "https://bedrock-runtime.us-east-1.amazonaws.com/model/m/invoke"
            .parse()
            .unwrap();
        let keys = Keys {
            access_key_id: "AKID".into(),
            secret_access_key: "secret".into(),
            session_token: Some("token".into()),
        };
        let scope = Scope {
            host: "unused.example",
            region: "us-east-1",
            service: "bedrock",
            time: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        };
        sign_request(&mut req, &payload_hash(b"{}"), &keys, &scope).unwrap();
        assert_eq!(req.headers()["x-amz-security-token"], "token");
        let auth = req.headers()["authorization"].to_str().unwrap();
        assert!(auth.contains("/us-east-1/bedrock/aws4_request"), "{auth}");
        assert!(
            auth.contains("SignedHeaders=host;x-amz-date;x-amz-security-token"),
            "{auth}"
        );
        assert!(!auth.contains("secret"), "{auth}");
    }
}
