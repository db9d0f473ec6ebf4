//! What Google's and Entra ID's token services have in common (OAuth 2.0, RFC 6749 §5.1): an
//! answer with an `access_token` and its life, which becomes a bearer credential. The life comes
//! as `expires_in` (seconds: a number, or a string from Azure's instance metadata service), or
//! only as `expires_on` (Azure App Service: the Unix time it ends).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Deserialize;

use super::{invalid, secret, Credential, Issued, SourceError};

/// Seconds, as a JSON number or a string of digits.
#[derive(Deserialize)]
#[serde(untagged)]
enum Seconds {
    Number(u64),
    Text(String),
}

impl Seconds {
    fn get(&self) -> Option<u64> {
        match self {
            Seconds::Number(n) => Some(*n),
            Seconds::Text(t) => t.trim().parse().ok(),
        }
    }
}

#[derive(Deserialize)]
struct Answer {
    access_token: String,
    expires_in: Option<Seconds>,
    expires_on: Option<Seconds>,
}

/// The bearer credential of a token service's answer `body`, received at `now` (a message names
/// `what` answered, never what the answer holds).
pub(crate) fn token(what: &'static str, body: &[u8], now: SystemTime) -> Result<Issued, SourceError> {
    let a: Answer = serde_json::from_slice(body).map_err(|_| invalid(what, "the answer holds no access_token"))?;
    let seconds = |s: &Option<Seconds>| s.as_ref().and_then(Seconds::get);
    let expires = match (seconds(&a.expires_in), seconds(&a.expires_on)) {
        (Some(life), _) => now + Duration::from_secs(life),
        (None, Some(at)) => UNIX_EPOCH + Duration::from_secs(at),
        (None, None) => return Err(invalid(what, "the answer does not say when its token expires")),
    };
    bearer(what, &a.access_token, expires)
}

/// `Bearer <token>`, valid until `expires`.
pub(crate) fn bearer(what: &'static str, token: &str, expires: SystemTime) -> Result<Issued, SourceError> {
    if token.is_empty() {
        return Err(invalid(what, "the answer holds an empty access_token"));
    }
    Ok(Issued {
        credential: Credential::Bearer(secret(&format!("Bearer {token}"), what)?),
        expires: Some(expires),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(body: &str) -> (String, Duration) {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let issued = token("the token service", body.as_bytes(), now).unwrap();
        let Credential::Bearer(header) = issued.credential else {
            panic!("not a bearer token")
        };
        assert!(header.is_sensitive());
        let life = issued.expires.unwrap().duration_since(now).unwrap();
        (header.to_str().unwrap().to_string(), life)
    }

    #[test]
    fn a_token_answer_gives_a_bearer_header_and_its_expiry() {
        // Google's token endpoint, STS and metadata server; Entra ID's v2 endpoint.
        let google = r#"{"access_token":"ya29.c.abc","expires_in":3599,"token_type":"Bearer"}"#;
        assert_eq!(parsed(google), ("Bearer ya29.c.abc".into(), Duration::from_secs(3599)));
        // Azure's instance metadata service: every number a string.
        let imds = r#"{"access_token":"eyJ0","refresh_token":"","expires_in":"86399","expires_on":"1800086399","not_before":"1799999700","resource":"https://cognitiveservices.azure.com","token_type":"Bearer"}"#;
        assert_eq!(parsed(imds).1, Duration::from_secs(86399));
        // Azure App Service (2019-08-01): the end as a Unix time only.
        let app_service = r#"{"access_token":"eyJ1","expires_on":"1800000600","resource":"https://cognitiveservices.azure.com","token_type":"Bearer"}"#;
        assert_eq!(parsed(app_service).1, Duration::from_secs(600));
    }

    #[test]
    fn a_wrong_answer_is_an_error_that_shows_none_of_it() {
        let now = UNIX_EPOCH;
        for body in [
            r#"{"error":"invalid_grant","error_description":"secret-ish detail"}"#,
            r#"{"access_token":"secret-token"}"#,
            r#"{"access_token":"","expires_in":60}"#,
            r#"{"access_token":"secret-token","expires_in":"soon"}"#,
            "not json at all: secret-token",
        ] {
            let err = token("the token service", body.as_bytes(), now)
                .err()
                .unwrap()
                .to_string();
            assert!(err.starts_with("the token service: "), "{err}");
            assert!(!err.contains("secret"), "{err}");
        }
    }
}
