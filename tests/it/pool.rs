//! The upstream connection pool against an HTTP/1.1 server that is hard on connections: it
//! closes idle keep-alive connections, or answers `connection: close`. Whatever the upstream does
//! to a connection between requests, the app must never see it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::config_builder::TestConfig;
use crate::support::*;

/// How the raw upstream treats a connection after each answer.
#[derive(Clone, Copy)]
enum After {
    /// Keep it open, but close it once it has been idle this long.
    IdleClose(Duration),
    /// Say `connection: close` in the answer and close.
    ConnectionClose,
}

/// A minimal HTTP/1.1 upstream on raw TCP: answers every request `200 {"n":K}` (K counts the
/// requests) and counts the connections it accepted.
struct RawUpstream {
    url: String,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

impl RawUpstream {
    async fn start(after: After) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let (c, r) = (connections.clone(), requests.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut tcp, _)) = listener.accept().await else {
                    return;
                };
                c.fetch_add(1, Ordering::SeqCst);
                let r = r.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        // Read one request head (the tests send bodies of `content-length: 2`).
                        let wait = match after {
                            After::IdleClose(idle) => idle,
                            After::ConnectionClose => Duration::from_secs(5),
                        };
                        let head_end = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            let mut chunk = [0u8; 4096];
                            match tokio::time::timeout(wait, tcp.read(&mut chunk)).await {
                                Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                                _ => return, // idle too long, or the client closed: close
                            }
                        };
                        while buf.len() < head_end + 2 {
                            let mut chunk = [0u8; 4096];
                            match tcp.read(&mut chunk).await {
                                Ok(n) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                                _ => return,
                            }
                        }
                        buf.drain(..head_end + 2);
                        let n = r.fetch_add(1, Ordering::SeqCst) + 1;
                        let body = format!(r#"{{"n":{n}}}"#);
                        let close = matches!(after, After::ConnectionClose);
                        let resp = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{}\r\n{}",
                            body.len(),
                            if close { "connection: close\r\n" } else { "" },
                            body
                        );
                        if tcp.write_all(resp.as_bytes()).await.is_err() || close {
                            return;
                        }
                    }
                });
            }
        });
        RawUpstream {
            url,
            connections,
            requests,
        }
    }
}

#[tokio::test]
async fn an_idle_connection_the_upstream_closed_is_never_the_apps_problem() {
    let upstream = RawUpstream::start(After::IdleClose(Duration::from_millis(100))).await;
    // No retry policy: a stale pooled connection must not cost the app a 502.
    let rebound = TestConfig::new(&upstream.url).start().await;
    let url = format!("{}/fake/v1/chat/completions", rebound.url);
    for round in 1..=3 {
        let a = post_json(&url, "{}").await;
        assert_eq!(a.status, 200, "round {round}: {}", a.text());
        assert_eq!(a.text(), format!(r#"{{"n":{round}}}"#));
        assert_eq!(a.header("x-rebound-attempts"), Some("1"));
        // Past the upstream's idle limit: it closes the pooled connection.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(upstream.requests.load(Ordering::SeqCst), 3);
    assert_eq!(
        upstream.connections.load(Ordering::SeqCst),
        3,
        "a new connection per round"
    );
}

#[tokio::test]
async fn connection_close_answers_are_not_reused() {
    let upstream = RawUpstream::start(After::ConnectionClose).await;
    let rebound = TestConfig::new(&upstream.url).start().await;
    let url = format!("{}/fake/v1/chat/completions", rebound.url);
    for round in 1..=5 {
        let a = post_json(&url, "{}").await;
        assert_eq!(a.status, 200, "round {round}: {}", a.text());
        assert_eq!(a.text(), format!(r#"{{"n":{round}}}"#));
    }
    assert_eq!(upstream.connections.load(Ordering::SeqCst), 5);
}

#[tokio::test]
async fn concurrent_requests_share_a_bounded_set_of_reused_connections() {
    let upstream = RawUpstream::start(After::IdleClose(Duration::from_secs(30))).await;
    let rebound = TestConfig::new(&upstream.url).start().await;
    let url = format!("{}/fake/v1/chat/completions", rebound.url);
    for _ in 0..4 {
        let batch = (0..8).map(|_| {
            let url = url.clone();
            tokio::spawn(async move { post_json(&url, "{}").await.status })
        });
        for status in futures_util::future::join_all(batch).await {
            assert_eq!(status.unwrap(), 200);
        }
    }
    assert_eq!(upstream.requests.load(Ordering::SeqCst), 32);
    let opened = upstream.connections.load(Ordering::SeqCst);
    assert!(
        opened <= 8,
        "32 requests, at most 8 at a time, opened {opened} connections (reuse expected)"
    );
}
