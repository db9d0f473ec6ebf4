//! Upstreams: a connection pool per upstream ([`pool`]: rustls, ALPN h2 where offered, plain
//! `http://` too), how a forwarded request's URI is built, and how a failed attempt is named.
//!
//! WebSocket upgrades go through a separate hyper-util client, HTTP/1.1 only: an upgraded
//! connection leaves the pool for good.

pub(crate) mod pool;
pub(crate) mod tls;

use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt as _;
use http::{Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
pub(crate) use pool::UpstreamBody;
use std::sync::Arc;

use crate::config::UpstreamConfig;
use crate::retry::policy::Outcome;

type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A configured upstream and its connection pools.
pub(crate) struct Upstream {
    pub config: Arc<UpstreamConfig>,
    /// HTTP/1.1 and, over TLS, HTTP/2 when the server selects it by ALPN.
    pool: Arc<pool::Pool>,
    /// HTTP/1.1 only: for WebSocket upgrades, which HTTP/2 cannot carry as such.
    upgrade_client: HttpsClient,
}

/// Why an upstream could not be set up (at startup or reload, never per request).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// The origin URI could not be built: http's error, kept as the source.
    #[error("invalid address: {0}")]
    Address(#[source] http::Error),
    #[error("invalid address: {0} is not a valid host header")]
    HostHeader(http::uri::Authority),
}

/// What an attempt's failure came from (the connector's, hyper's or the body's error), kept whole:
/// its chain is read when the failure is reported, and a caller may look into it.
pub(crate) type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why an attempt produced no response head.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AttemptError {
    /// The connection could not be established (DNS, refused, TLS, connect timeout): the request
    /// was never sent.
    #[error("connect failed: {}", error_chain(&**.0))]
    Connect(#[source] Cause),
    /// HTTP/2 REFUSED_STREAM: the server did not process the request.
    #[error("stream refused: {}", error_chain(&**.0))]
    RefusedStream(#[source] Cause),
    /// The connection failed after the request may have been sent (reset, closed early).
    #[error("connection failed: {}", error_chain(&**.0))]
    Reset(#[source] Cause),
    /// No response head within the per-try timeout.
    #[error("no response within {0:?}")]
    Timeout(Duration),
}

impl AttemptError {
    /// The retry engine's name for this failure.
    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            AttemptError::Connect(_) => Outcome::ConnectFailure,
            AttemptError::RefusedStream(_) => Outcome::RefusedStream,
            AttemptError::Reset(_) => Outcome::Reset,
            AttemptError::Timeout(_) => Outcome::Timeout,
        }
    }
}

impl Upstream {
    /// Builds the pools. Fails only on TLS setup (an unreadable `ca_file`).
    pub(crate) fn new(config: Arc<UpstreamConfig>) -> Result<Upstream, SetupError> {
        let tls = tls::client_config(config.ca_file.as_deref())?;
        let origin = Uri::builder()
            .scheme(config.scheme.clone())
            .authority(config.authority.clone())
            .path_and_query("/")
            .build()
            .map_err(SetupError::Address)?;
        let host = pool::host_header(&config.scheme, &config.authority)
            .ok_or_else(|| SetupError::HostHeader(config.authority.clone()))?;
        let pool = Arc::new(pool::Pool::new(
            connector(&config, tls.clone(), true),
            origin,
            host,
            config.keepalive,
        ));
        let upgrade_client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(pool::IDLE_TIMEOUT)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(connector(&config, tls, false));
        Ok(Upstream {
            config,
            pool,
            upgrade_client,
        })
    }

    /// The upstream URI for a forwarded path (already stripped) and query, absolute (for the
    /// upgrade client).
    pub(crate) fn uri_for(&self, path: &str, query: Option<&str>) -> Result<Uri, http::Error> {
        Uri::builder()
            .scheme(self.config.scheme.clone())
            .authority(self.config.authority.clone())
            .path_and_query(self.path_and_query(path, query))
            .build()
    }

    /// The origin-form target (`/base/path?query`) of a forwarded request: what HTTP/1.1 sends;
    /// the pool makes it absolute for HTTP/2.
    pub(crate) fn target_for(&self, path: &str, query: Option<&str>) -> Result<Uri, http::uri::InvalidUri> {
        http::uri::PathAndQuery::try_from(self.path_and_query(path, query)).map(Uri::from)
    }

    /// `base_path` + `path` + `?query`.
    fn path_and_query(&self, path: &str, query: Option<&str>) -> String {
        // Exactly the length: a `String` whose capacity is its length becomes the URI's `Bytes`
        // without a second allocation.
        let mut pq = String::with_capacity(self.config.base_path.len() + path.len() + query.map_or(0, |q| 1 + q.len()));
        pq.push_str(&self.config.base_path);
        pq.push_str(path);
        if let Some(q) = query {
            pq.push('?');
            pq.push_str(q);
        }
        pq
    }

    /// Sends one attempt (its URI in origin form, from [`Upstream::target_for`]) and waits for
    /// the response head, at most `timeout`.
    ///
    /// The timeout's future itself, not an `async fn` around it, which would hold the request a
    /// second time for as long as the attempt waits.
    pub(crate) fn send(
        &self,
        req: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<Response<UpstreamBody>, AttemptError>> + Send + '_ {
        tokio::time::timeout(timeout, self.pool.send(req))
            .map(move |sent| sent.unwrap_or_else(|_| Err(AttemptError::Timeout(timeout))))
    }

    /// Sends an upgrade request (HTTP/1.1 only).
    pub(crate) async fn send_upgrade(
        &self,
        req: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Result<Response<Incoming>, AttemptError> {
        match tokio::time::timeout(timeout, self.upgrade_client.request(req)).await {
            Err(_) => Err(AttemptError::Timeout(timeout)),
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(classify(e)),
        }
    }
}

/// Unanswered TCP keepalive probes after which the connection is dead.
const TCP_KEEPALIVE_PROBES: u32 = 3;

/// The gap between TCP keepalive probes: a third of `keepalive` (whole seconds, at least one), so
/// that the last of [`TCP_KEEPALIVE_PROBES`] goes unanswered about `keepalive` after the first.
pub(crate) fn tcp_keepalive_interval(keepalive: Duration) -> Duration {
    Duration::from_secs((keepalive.as_secs() / u64::from(TCP_KEEPALIVE_PROBES)).max(1))
}

fn connector(config: &UpstreamConfig, tls: rustls::ClientConfig, allow_h2: bool) -> HttpsConnector<HttpConnector> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(config.connect_timeout));
    // TCP keepalive: a peer that vanished (host gone, a middlebox that dropped the flow) fails the
    // connection within about twice `keepalive`, while a live peer's kernel answers every probe
    // however long its model thinks. The probes also keep NAT and load-balancer mappings of a
    // silent connection (a long non-streamed generation) from expiring.
    if let Some(keepalive) = config.keepalive {
        http.set_keepalive(Some(keepalive));
        http.set_keepalive_interval(Some(tcp_keepalive_interval(keepalive)));
        http.set_keepalive_retries(Some(TCP_KEEPALIVE_PROBES));
    }
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if allow_h2 {
        builder.enable_http1().enable_http2().wrap_connector(http)
    } else {
        builder.enable_http1().wrap_connector(http)
    }
}

/// Names a client error by hyper's predicates, not by message text.
fn classify(e: hyper_util::client::legacy::Error) -> AttemptError {
    if e.is_connect() {
        AttemptError::Connect(Box::new(e))
    } else if refused_stream(&e) {
        AttemptError::RefusedStream(Box::new(e))
    } else {
        AttemptError::Reset(Box::new(e))
    }
}

/// Whether an HTTP/2 stream was refused (RST_STREAM or GOAWAY with REFUSED_STREAM): RFC 9113
/// §8.7 guarantees the server did not process it.
fn refused_stream(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        cur = err.source();
    }
    false
}

/// `outer: inner: innermost`, for logs and error messages (never contains headers).
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let msg = s.to_string();
        if !out.contains(&msg) {
            out.push_str(": ");
            out.push_str(&msg);
        }
        src = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_service::Service as _;

    fn upstream(extra: &str) -> UpstreamConfig {
        let toml = format!(
            "[upstreams.u]\nurl = \"http://127.0.0.1:1\"\n{extra}\n[[routes]]\nname = \"r\"\npath_prefix = \"/r/\"\nupstream = \"u\"\n"
        );
        let c = crate::config::Config::parse(&toml, std::path::Path::new("t.toml"), &|_| None).unwrap();
        (*c.upstreams["u"]).clone()
    }

    /// The TCP keepalive options of a socket the upstream connector opened: `None` when off,
    /// else (idle time, probe interval, probes).
    async fn keepalive_of(config: &UpstreamConfig) -> Option<(Duration, Duration, u32)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Uri = format!("http://{}", listener.local_addr().unwrap()).parse().unwrap();
        let mut connector = connector(config, tls::client_config(None).unwrap(), true);
        let io = connector.call(uri).await.unwrap();
        let hyper_rustls::MaybeHttpsStream::Http(tcp) = io else {
            panic!("plain http expected");
        };
        let socket = socket2::SockRef::from(tcp.inner());
        if !socket.keepalive().unwrap() {
            return None;
        }
        Some((
            socket.tcp_keepalive_time().unwrap(),
            socket.tcp_keepalive_interval().unwrap(),
            socket.tcp_keepalive_retries().unwrap(),
        ))
    }

    #[tokio::test]
    async fn upstream_sockets_carry_tcp_keepalive() {
        // The default: first probe after 15 s of silence, then every 5 s, dead after 3 misses.
        let default = upstream("");
        assert_eq!(
            keepalive_of(&default).await,
            Some((Duration::from_secs(15), Duration::from_secs(5), 3))
        );
        let custom = upstream("keepalive = \"60s\"");
        assert_eq!(
            keepalive_of(&custom).await,
            Some((Duration::from_secs(60), Duration::from_secs(20), 3))
        );
        let short = upstream("keepalive = \"1s\"");
        assert_eq!(
            keepalive_of(&short).await,
            Some((Duration::from_secs(1), Duration::from_secs(1), 3))
        );
        assert_eq!(keepalive_of(&upstream("keepalive = \"off\"")).await, None);
    }

    /// The first error of type `T` in what `e` came from.
    fn cause_of<T: std::error::Error + 'static>(e: &AttemptError) -> Option<&T> {
        let mut at = std::error::Error::source(e);
        while let Some(err) = at {
            if let Some(t) = err.downcast_ref::<T>() {
                return Some(t);
            }
            at = err.source();
        }
        None
    }

    async fn send_to(addr: std::net::SocketAddr) -> AttemptError {
        let toml = format!(
            "[upstreams.u]\nurl = \"http://{addr}\"\n[[routes]]\nname = \"r\"\npath_prefix = \"/r/\"\nupstream = \"u\"\n"
        );
        let c = crate::config::Config::parse(&toml, std::path::Path::new("t.toml"), &|_| None).unwrap();
        let u = Upstream::new(c.upstreams["u"].clone()).unwrap();
        let mut req = Request::new(Full::new(Bytes::new()));
        *req.uri_mut() = u.target_for("/x", None).unwrap();
        match u.send(req, Duration::from_secs(30)).await {
            Ok(resp) => panic!("answered {}", resp.status()),
            Err(e) => e,
        }
    }

    #[tokio::test]
    async fn a_failed_attempt_keeps_the_error_it_came_from() {
        // Nothing listens: a connect failure, the socket's own error kept.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let refused = send_to(closed).await;
        assert!(matches!(refused, AttemptError::Connect(_)), "{refused:?}");
        let io = cause_of::<std::io::Error>(&refused).map(std::io::Error::kind);
        assert_eq!(io, Some(std::io::ErrorKind::ConnectionRefused), "{refused}");
        assert!(refused.to_string().starts_with("connect failed: "), "{refused}");

        // A server that closes the connection once it reads the request: a reset, hyper's error
        // kept.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut socket, &mut buf).await;
        };
        let ((), reset) = tokio::join!(server, send_to(addr));
        assert!(matches!(reset, AttemptError::Reset(_)), "{reset:?}");
        assert!(cause_of::<hyper::Error>(&reset).is_some(), "{reset}");
    }
}
