//! Local stand-ins for the clouds' credential services (STS, the container credentials endpoint,
//! IMDSv2, Google's and Entra ID's token endpoints, the metadata servers), over real sockets,
//! reached through the clouds' standard environment variables; the SigV4 verifier (`sigv4.rs`,
//! re-exported); and an RS256 JWT verifier, with the throwaway RSA key of the tests' service
//! account.

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

pub use super::sigv4::sigv4_valid;

use super::config_builder::TestConfig;
use super::fake_provider::FakeProvider;
use super::sidecar::Rebound;
use super::{send, until_metric, Answer};

/// The environment a test gives rebound's credential chains (never the process's own).
pub type Env = Vec<(&'static str, String)>;

/// rebound on `config`, its credential chains reading `env`.
pub async fn start_with_env(config: TestConfig, env: Env) -> Rebound {
    let lookup = move |name: &str| env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone());
    let parsed = rebound::Config::parse(&config.toml(), std::path::Path::new("test.toml"), &lookup).unwrap();
    Rebound::start_config(parsed).await
}

/// A POST of `body` to `url` under the fake provider's `key`, carrying the app's own credentials
/// (which an `auth` upstream must never receive).
pub async fn send_with_app_keys(url: &str, body: &str, key: &str) -> Answer {
    let headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer sk-app-own-key"),
        ("x-goog-api-key", "app-own-goog-key"),
        ("x-fake-key", key),
    ];
    send("POST", url, &headers, body.to_string()).await
}

/// The `n`th request the provider received under `key` carried `Bearer {token}`, and none of
/// the app's own credentials.
pub fn carried(provider: &FakeProvider, key: &str, n: usize, token: &str) {
    let seen = &provider.requests(key)[n];
    assert_eq!(seen.header("authorization"), Some(format!("Bearer {token}").as_str()));
    assert_eq!(seen.header("x-goog-api-key"), None);
    assert!(
        !seen.headers.iter().any(|(_, v)| v.contains("app-own")),
        "{:?}",
        seen.headers
    );
}

/// `resp` is rebound's 503 `credential_unavailable`, nothing reached the provider under `key`,
/// the credential service's answer (`said`) is not in it, and the failed fetch is counted.
pub async fn assert_credential_unavailable(r: &Rebound, resp: &Answer, provider: &FakeProvider, key: &str, said: &str) {
    assert_eq!(resp.status, 503, "{}", resp.text());
    assert_eq!(resp.header("x-rebound-error"), Some("credential_unavailable"));
    assert_eq!(resp.header("x-should-retry"), Some("false"));
    assert_eq!(provider.count(key), 0, "nothing without a credential reaches the cloud");
    assert!(!resp.text().contains(said), "{}", resp.text());
    until_metric(
        r,
        r#"rebound_credential_refreshes_total{result="error",upstream="fake"}"#,
        |v| v >= 1.0,
    )
    .await;
}

/// A request a stand-in received.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: http::HeaderMap,
    pub body: String,
}

impl Seen {
    /// A field of its form body.
    pub fn form(&self, name: &str) -> Option<String> {
        form_urlencoded::parse(self.body.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    }
}

type Handler = dyn Fn(&Seen, usize) -> (u16, Vec<(String, String)>, String) + Send + Sync;

/// A credential service stand-in: answers each request with `handler(request, n)` (`n`: the
/// requests before it), and records what it received.
pub struct StandIn {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    handler: Arc<Mutex<Arc<Handler>>>,
    /// How long each answer waits before it is made (a slow credential service).
    delay: Arc<Mutex<Duration>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl StandIn {
    pub async fn start(
        handler: impl Fn(&Seen, usize) -> (u16, Vec<(String, String)>, String) + Send + Sync + 'static,
    ) -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let handler: Arc<Mutex<Arc<Handler>>> = Arc::new(Mutex::new(Arc::new(handler)));
        let delay: Arc<Mutex<Duration>> = Arc::default();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let (s, h, d) = (seen.clone(), handler.clone(), delay.clone());
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    accepted = listener.accept() => match accepted { Ok((s, _)) => s, Err(_) => continue },
                    _ = &mut stopped => return,
                };
                let (s, h, d) = (s.clone(), h.clone(), d.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (s, h, d) = (s.clone(), h.clone(), d.clone());
                        async move {
                            let wait = *d.lock().unwrap();
                            tokio::time::sleep(wait).await;
                            let (parts, body) = req.into_parts();
                            let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                            let seen = Seen {
                                method: parts.method.to_string(),
                                path: parts.uri.to_string(),
                                headers: parts.headers,
                                body: String::from_utf8_lossy(&body).into_owned(),
                            };
                            let n = {
                                let mut all = s.lock().unwrap();
                                all.push(seen.clone());
                                all.len() - 1
                            };
                            let handler = h.lock().unwrap().clone();
                            let (status, headers, body) = handler(&seen, n);
                            let mut resp = Response::new(Full::new(Bytes::from(body)));
                            *resp.status_mut() = StatusCode::from_u16(status).unwrap();
                            for (k, v) in headers {
                                resp.headers_mut()
                                    .insert(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
                            }
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        StandIn {
            addr,
            seen,
            handler,
            delay,
            _stop: stop,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answers from now on with `handler`.
    pub fn answer(
        &self,
        handler: impl Fn(&Seen, usize) -> (u16, Vec<(String, String)>, String) + Send + Sync + 'static,
    ) {
        *self.handler.lock().unwrap() = Arc::new(handler);
    }

    /// Each answer from now on waits `wait` first.
    pub fn delay(&self, wait: Duration) {
        *self.delay.lock().unwrap() = wait;
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// A token file (or any credentials file) in a directory of its own (removed when dropped).
pub struct TokenFile(tempfile::TempDir);

impl TokenFile {
    pub fn new(content: &str) -> TokenFile {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), content).unwrap();
        TokenFile(dir)
    }

    pub fn path(&self) -> String {
        self.0.path().join("token").display().to_string()
    }

    pub fn rotate(&self, content: &str) {
        std::fs::write(self.0.path().join("token"), content).unwrap();
    }
}

/// An OAuth 2.0 token answer (Google's, Entra ID's): `token`, valid for `life`.
pub fn bearer_answer(token: &str, life: Duration) -> String {
    serde_json::json!({"access_token": token, "expires_in": life.as_secs(), "token_type": "Bearer"}).to_string()
}

/// The throwaway 2048-bit RSA key (PKCS#8 PEM) of the tests' Google service account, made once
/// with `openssl genpkey` (neither ring nor rcgen's ring backend generates RSA keys). It signs
/// nothing outside these tests.
pub const TEST_RSA_KEY: &str = include_str!("../../../src/cloud/testdata/rsa_test_key.pem");

/// A base64 run of [`TEST_RSA_KEY`]'s body, to look for where no key may appear.
pub fn test_key_fragment() -> &'static str {
    &TEST_RSA_KEY.lines().nth(5).unwrap()[..40]
}

/// A Google `service_account` key file whose token endpoint is `token_uri`, signing with
/// [`TEST_RSA_KEY`].
pub fn service_account_json(token_uri: &str) -> String {
    serde_json::json!({
        "type": "service_account",
        "project_id": "llm-project",
        "private_key_id": "0123456789abcdef",
        "private_key": TEST_RSA_KEY,
        "client_email": "llm@llm-project.iam.gserviceaccount.com",
        "client_id": "100000000000000000001",
        "token_uri": token_uri,
    })
    .to_string()
}

/// The claims of `jwt` when it is RS256 and its signature verifies with [`TEST_RSA_KEY`]'s public
/// key (ring's verifier).
pub fn jwt_claims(jwt: &str) -> Result<serde_json::Value, String> {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    let decode = |part: &str| URL_SAFE_NO_PAD.decode(part).map_err(|e| format!("base64url: {e}"));
    let [header, claims, signature] = jwt.split('.').collect::<Vec<_>>()[..] else {
        return Err(format!("not three parts: {jwt}"));
    };
    let header_json: serde_json::Value = serde_json::from_slice(&decode(header)?).map_err(|e| e.to_string())?;
    if header_json["alg"] != "RS256" {
        return Err(format!("header {header_json}"));
    }
    let Some(rustls::pki_types::PrivateKeyDer::Pkcs8(der)) =
        rustls_pemfile::private_key(&mut TEST_RSA_KEY.as_bytes()).unwrap()
    else {
        panic!("the test key is PKCS#8")
    };
    let pair = ring::signature::RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).unwrap();
    let public =
        ring::signature::UnparsedPublicKey::new(&ring::signature::RSA_PKCS1_2048_8192_SHA256, pair.public().as_ref());
    public
        .verify(format!("{header}.{claims}").as_bytes(), &decode(signature)?)
        .map_err(|_| "the signature does not verify".to_string())?;
    serde_json::from_slice(&decode(claims)?).map_err(|e| e.to_string())
}

/// An RFC 3339 time `after` from now.
pub fn rfc3339_in(after: Duration) -> String {
    let t = time::OffsetDateTime::from(SystemTime::now() + after);
    t.replace_nanosecond(0)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

/// An STS answer with the `n`th temporary keys (`ASIA{n}`, `secret-{n}`, `token-{n}`), valid for
/// `life`.
pub fn sts_answer(action: &str, n: usize, life: Duration) -> String {
    format!(
        "<{action}Response xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\"><{action}Result><Credentials>\
         <AccessKeyId>ASIA{n}</AccessKeyId><SecretAccessKey>secret-{n}</SecretAccessKey>\
         <SessionToken>token-{n}</SessionToken><Expiration>{}</Expiration></Credentials></{action}Result>\
         </{action}Response>",
        rfc3339_in(life)
    )
}

/// The keys of STS answer `n` (see [`sts_answer`]).
pub fn sts_secret(n: usize) -> String {
    format!("secret-{n}")
}
