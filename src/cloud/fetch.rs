//! The HTTP client of the credential services (STS, the container and instance metadata
//! endpoints, Google's and Entra ID's token endpoints): HTTPS with the webpki roots, or plain
//! HTTP where the cloud's own endpoint is (instance metadata) or where a test points it. Every
//! call is bounded in time and in the size of what it reads.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// A credential service's answer is small; one larger than this is not one.
const MAX_BODY: usize = 64 * 1024;

/// The longest one call to a credential service may take.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a call to a credential service failed (the message names the service, never a secret).
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("{what}: {source}")]
    Send {
        what: &'static str,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("{what}: no answer within {CALL_TIMEOUT:?}")]
    Timeout { what: &'static str },
    #[error("{what}: answered {status}")]
    Status { what: &'static str, status: StatusCode },
    #[error("{what}: the answer could not be read")]
    Body { what: &'static str },
    #[error("{what}: {detail}")]
    Invalid { what: &'static str, detail: String },
}

/// A request to a credential service.
pub(crate) struct TokenCall<'a> {
    /// What is asked, for messages (`"STS AssumeRoleWithWebIdentity"`).
    pub(crate) what: &'static str,
    pub(crate) method: Method,
    pub(crate) uri: &'a str,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) body: Bytes,
}

impl<'a> TokenCall<'a> {
    pub(crate) fn get(what: &'static str, uri: &'a str) -> TokenCall<'a> {
        TokenCall {
            what,
            method: Method::GET,
            uri,
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// A form POST (`application/x-www-form-urlencoded`) of `pairs`.
    pub(crate) fn form(what: &'static str, uri: &'a str, pairs: &[(&str, &str)]) -> TokenCall<'a> {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish();
        TokenCall {
            what,
            method: Method::POST,
            uri,
            headers: vec![(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-www-form-urlencoded"),
            )],
            body: Bytes::from(body),
        }
    }

    /// A JSON POST of `body`.
    pub(crate) fn json(what: &'static str, uri: &'a str, body: String) -> TokenCall<'a> {
        TokenCall {
            what,
            method: Method::POST,
            uri,
            headers: vec![(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            body: Bytes::from(body),
        }
    }

    pub(crate) fn header(mut self, name: HeaderName, value: HeaderValue) -> TokenCall<'a> {
        self.headers.push((name, value));
        self
    }
}

/// The client (one per process: its pool is shared by every credential's refreshes).
#[derive(Clone)]
pub(crate) struct Fetch {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Fetch {
    pub(crate) fn new() -> Result<Fetch, crate::upstream::tls::TlsError> {
        let tls = crate::upstream::tls::client_config(None)?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(Duration::from_secs(2)));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Fetch {
            client: Client::builder(TokioExecutor::new()).build(connector),
        })
    }

    /// Sends `call`; its answer's headers and body when the status is a success.
    pub(crate) async fn send(&self, call: TokenCall<'_>) -> Result<(HeaderMap, Bytes), FetchError> {
        let what = call.what;
        let uri: Uri = call.uri.parse().map_err(|_| FetchError::Invalid {
            what,
            detail: "not a URL".into(),
        })?;
        let mut req = Request::new(Full::new(call.body));
        *req.method_mut() = call.method;
        *req.uri_mut() = uri;
        for (name, value) in call.headers {
            req.headers_mut().insert(name, value);
        }
        let answer = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|source| FetchError::Send { what, source })?;
            let (parts, body) = resp.into_parts();
            let body = Limited::new(body, MAX_BODY)
                .collect()
                .await
                .map_err(|_| FetchError::Body { what })?
                .to_bytes();
            match parts.status.is_success() {
                true => Ok((parts.headers, body)),
                false => Err(FetchError::Status {
                    what,
                    status: parts.status,
                }),
            }
        };
        tokio::time::timeout(CALL_TIMEOUT, answer)
            .await
            .map_err(|_| FetchError::Timeout { what })?
    }
}
