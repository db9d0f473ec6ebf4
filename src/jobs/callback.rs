//! Callbacks: when a job finishes, its result is POSTed to the `x-rebound-callback` URL it was
//! submitted with (only URLs under `[jobs] callback_allowed_prefixes` are accepted), with the job
//! id as the `Idempotency-Key`, retried a few times with backoff on connect failures, timeouts,
//! 408, 429 and 5xx.

use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{header, Request};
use http_body_util::{BodyExt as _, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rand::Rng as _;
use tokio_util::sync::CancellationToken;

use super::record::{CallbackState, CallbackView, JobResult, JobView};
use super::JobId;

/// POSTs per callback, the first included.
pub(crate) const ATTEMPTS: u32 = 4;
/// The first wait between POSTs (doubled each time, with jitter).
const BASE_DELAY: Duration = Duration::from_millis(500);
/// How long one POST may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Whether `url` is under one of the allowed prefixes.
pub fn allowed(url: &str, prefixes: &[String]) -> bool {
    url.parse::<http::Uri>()
        .is_ok_and(|u| u.scheme().is_some() && u.authority().is_some())
        && prefixes.iter().any(|p| url.starts_with(p.as_str()))
}

/// The JSON a callback carries: the job's status and its response as it came (the body as text
/// when it is UTF-8, else base64).
pub fn payload(view: &JobView, result: Option<&JobResult>) -> Bytes {
    let mut v = view.to_json();
    if let Some(r) = result {
        let headers: serde_json::Map<String, serde_json::Value> =
            r.headers.iter().map(|(k, v)| (k.clone(), v.clone().into())).collect();
        let mut response = serde_json::json!({ "status": r.status, "headers": headers });
        match std::str::from_utf8(&r.body) {
            Ok(text) => response["body"] = text.into(),
            Err(_) => {
                response["body_base64"] = base64::engine::general_purpose::STANDARD.encode(&r.body).into();
            }
        }
        v["response"] = response;
    }
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}

/// The client callbacks go out on.
pub(crate) struct Callbacks {
    client: Option<Client<HttpsConnector<HttpConnector>, Full<Bytes>>>,
}

impl Callbacks {
    pub(crate) fn new() -> Callbacks {
        let client = match crate::upstream::tls::client_config(None) {
            Ok(tls) => {
                let mut http = HttpConnector::new();
                http.enforce_http(false);
                http.set_connect_timeout(Some(Duration::from_secs(5)));
                let connector = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(tls)
                    .https_or_http()
                    .enable_http1()
                    .wrap_connector(http);
                Some(
                    Client::builder(TokioExecutor::new())
                        .pool_timer(TokioTimer::new())
                        .timer(TokioTimer::new())
                        .build(connector),
                )
            }
            Err(e) => {
                tracing::error!(error = %e, "no TLS client for job callbacks: they will fail");
                None
            }
        };
        Callbacks { client }
    }

    /// Delivers `payload` to `url`: until a 2xx, a status not worth retrying, or
    /// [`ATTEMPTS`] POSTs. `stop` abandons it (shutdown).
    pub(crate) async fn deliver(
        &self,
        url: &str,
        job_id: &JobId,
        payload: Bytes,
        stop: &CancellationToken,
    ) -> CallbackView {
        let mut view = CallbackView {
            state: CallbackState::Failed,
            attempts: 0,
            last_status: None,
        };
        let Some(client) = &self.client else { return view };
        let mut delay = BASE_DELAY;
        while view.attempts < ATTEMPTS {
            if view.attempts > 0 {
                let wait = delay + delay.mul_f64(rand::rng().random::<f64>() * 0.5);
                delay *= 2;
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.cancelled() => return view,
                }
            }
            view.attempts += 1;
            let req = Request::post(url)
                .header(header::CONTENT_TYPE, "application/json")
                .header("idempotency-key", job_id.as_str())
                .header(crate::wire::headers::X_REBOUND_JOB_ID, job_id.as_str())
                .header(header::USER_AGENT, concat!("rebound/", env!("CARGO_PKG_VERSION")))
                .body(Full::new(payload.clone()));
            let Ok(req) = req else { return view };
            let sent = tokio::time::timeout(TIMEOUT, async {
                let resp = client.request(req).await?;
                let status = resp.status();
                // Read the (small) answer so that the connection is reused.
                let _ = resp.into_body().collect().await;
                Ok::<_, hyper_util::client::legacy::Error>(status)
            })
            .await;
            match sent {
                Ok(Ok(status)) => {
                    view.last_status = Some(status.as_u16());
                    if status.is_success() {
                        view.state = CallbackState::Delivered;
                        return view;
                    }
                    let retryable = status.is_server_error()
                        || status == http::StatusCode::TOO_MANY_REQUESTS
                        || status == http::StatusCode::REQUEST_TIMEOUT;
                    if !retryable {
                        return view;
                    }
                    tracing::debug!(
                        job = job_id.as_str(),
                        status = status.as_u16(),
                        "job callback refused; retrying"
                    );
                }
                Ok(Err(e)) => {
                    view.last_status = None;
                    tracing::debug!(job = job_id.as_str(), error = %crate::upstream::error_chain(&e), "job callback failed; retrying");
                }
                Err(_) => {
                    view.last_status = None;
                    tracing::debug!(job = job_id.as_str(), "job callback timed out; retrying");
                }
            }
        }
        view
    }
}

impl Default for Callbacks {
    fn default() -> Callbacks {
        Callbacks::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_urls_under_an_allowed_prefix() {
        let prefixes = vec!["https://hooks.example.com/rebound/".to_string()];
        assert!(allowed("https://hooks.example.com/rebound/done?x=1", &prefixes));
        assert!(!allowed("https://hooks.example.com/other", &prefixes));
        assert!(!allowed("https://hooks.example.com.evil.org/rebound/", &prefixes));
        assert!(!allowed("https://hooks.example.com/rebound/", &[]));
        assert!(!allowed("not a url", &["not".to_string()]));
    }
}
