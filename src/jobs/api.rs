//! The job API: `GET /jobs/{id}` (the job's state) and `GET /jobs/{id}/result` (its response as
//! it came), readable only with the credential that submitted the job.

use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode};

use super::{json_response, JobId, Jobs};
use crate::error::{error_response, ProxyError};
use crate::wire::body::{ProxyBody, RequestLog};
use crate::wire::headers;

/// Whether `path` is the job API's (`/jobs/...`).
pub(crate) fn is_api_path(path: &str) -> bool {
    path.starts_with("/jobs/")
}

impl Jobs {
    /// `GET /jobs/{id}` (the status) and `GET /jobs/{id}/result` (the response as it came).
    pub async fn api(
        &self,
        method: &Method,
        uri: &http::Uri,
        headers: &HeaderMap,
        log: RequestLog,
    ) -> Response<ProxyBody> {
        let path = uri.path();
        let rest = path.strip_prefix("/jobs/").unwrap_or_default();
        let (id, want_result) = match rest.split_once('/') {
            None => (rest, false),
            Some((id, "result")) => (id, true),
            Some(_) => return error_response(ProxyError::JobNotFound, log),
        };
        let Some(id) = JobId::parse(id) else {
            return error_response(ProxyError::JobNotFound, log);
        };
        if method != Method::GET && method != Method::HEAD {
            let mut resp = error_response(ProxyError::JobMethodNotAllowed, log);
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return resp;
        }
        let loaded = match self.load(&id, want_result).await {
            Ok(l) => l,
            Err(_) => return error_response(ProxyError::JobsUnavailable, log),
        };
        let Some((view, result, _)) = loaded.filter(|(v, _, _)| v.access == Some(self.access_of(headers, uri.query())))
        else {
            return error_response(ProxyError::JobNotFound, log);
        };
        if !want_result {
            let body = serde_json::to_vec(&view.to_json()).unwrap_or_default();
            let mut resp = json_response(StatusCode::OK, body, log);
            if !view.state.finished() {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            return resp;
        }
        if !view.state.finished() {
            return error_response(
                ProxyError::JobNotFinished {
                    state: view.state.as_str(),
                },
                log,
            );
        }
        let Some(result) = result else {
            let detail = view.error.unwrap_or_else(|| "no response was kept".to_string());
            return error_response(ProxyError::JobResultUnavailable { detail }, log);
        };
        let status = StatusCode::from_u16(result.status).unwrap_or(StatusCode::BAD_GATEWAY);
        let mut resp = Response::new(ProxyBody::full(result.body, log, status.as_u16()));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        for (name, value) in &result.headers {
            if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) {
                h.append(name, value);
            }
        }
        h.insert(headers::X_REBOUND_ATTEMPTS, HeaderValue::from(view.attempts));
        if let Ok(v) = HeaderValue::from_str(view.id.as_str()) {
            h.insert(headers::X_REBOUND_JOB_ID, v);
        }
        resp
    }
}
