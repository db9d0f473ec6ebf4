//! The app's request, read once after routing (step 4): its head, the path it is forwarded to,
//! its body (capped), what it names (`wire::api`), its route, when it arrived, what its headers
//! ask of the retry policy, its one deadline, counted from its arrival, its credential's hash
//! (made when first needed, then kept) and whether it is a client's retry of a failure for good.
//! Every later step borrows it (the limits' queue, the idempotency and cache steps, the attempts,
//! the books); a continuation holds it by `Arc`, never a copy. No other module computes a
//! deadline or hashes the app's credential.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use super::routes::Route;
use crate::credentials::{CredentialHash, Credentials};
use crate::retry::policy::{retry_terms, RetryTerms};
use crate::time::Instant;
use crate::wire::api::Named;

/// The app's request (see the module documentation).
pub(super) struct Request {
    pub(super) route: Arc<Route>,
    pub(super) parts: http::request::Parts,
    path: Forwarded,
    pub(super) body: Bytes,
    pub(super) named: Named,
    /// What its headers ask of the route's retry policy (attempts, deadline, an SDK's retry).
    pub(super) retry: RetryTerms,
    /// Its deadline: the limits' queue, the attempts and any continuation all spend it.
    pub(super) deadline: Instant,
    /// The hash of the credential it carries (never the credential), once something needed it.
    credential: OnceLock<CredentialHash>,
    /// It repeats a failure for good of moments ago (`client_retry::Repeat` found it).
    client_retry: AtomicBool,
}

/// The path a request is forwarded to: the URI's from a byte on (all of it, or what follows a
/// stripped prefix), or one made (a prefix stripped that left no leading `/`).
pub(super) enum Forwarded {
    From(usize),
    Made(String),
}

impl Forwarded {
    /// `path`, the forwarded path of the URI path `uri` (`routing::forwarded_path`).
    pub(super) fn of(uri: &str, path: Cow<'_, str>) -> Forwarded {
        match path {
            Cow::Borrowed(p) if uri.ends_with(p) => Forwarded::From(uri.len() - p.len()),
            p => Forwarded::Made(p.into_owned()),
        }
    }
}

impl Request {
    /// The request that arrived at `arrived` on `route`, forwarded to `path`, with its `body` and
    /// what it names.
    pub(super) fn new(
        route: Arc<Route>,
        (parts, path): (http::request::Parts, Forwarded),
        (body, named): (Bytes, Named),
        arrived: Instant,
    ) -> Request {
        let retry = retry_terms(&parts.headers, &route.retry);
        let deadline = arrived + retry.deadline;
        Request {
            route,
            parts,
            path,
            body,
            named,
            retry,
            deadline,
            credential: OnceLock::new(),
            client_retry: AtomicBool::new(false),
        }
    }

    /// The hash of the credential the app sent (in the forms of `forms`), made once.
    pub(super) fn credential(&self, forms: &Credentials) -> CredentialHash {
        *self
            .credential
            .get_or_init(|| forms.presented(&self.parts.headers, self.parts.uri.query()).hash(forms))
    }

    /// Marks it a client's retry of a failure for good: its attempts are one.
    pub(super) fn mark_client_retry(&self) {
        self.client_retry.store(true, Ordering::Relaxed);
    }

    /// Whether it is a client's retry of a failure for good.
    pub(super) fn is_client_retry(&self) -> bool {
        self.client_retry.load(Ordering::Relaxed)
    }

    /// The path it is forwarded to (after the route's `strip_prefix`).
    pub(super) fn path(&self) -> &str {
        match &self.path {
            Forwarded::From(at) => self.parts.uri.path().get(*at..).unwrap_or("/"),
            Forwarded::Made(p) => p,
        }
    }
}
