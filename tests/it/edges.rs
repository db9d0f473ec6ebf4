//! The edges a hostile or broken client probes, through real sockets: oversized heads, more
//! connections than allowed, clients that send their head slowly or not at all, and idle
//! kept-alive connections.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::config_builder::{some, TestConfig};
use crate::support::*;

fn addr(url: &str) -> std::net::SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

/// Reads until the server closes the connection: what it sent, and after how long (`None`: it
/// was still open after `within`).
async fn until_closed(s: &mut TcpStream, within: Duration) -> (String, Option<Duration>) {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = within.saturating_sub(start.elapsed());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&out).into_owned(), Some(start.elapsed())),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&out).into_owned(), None),
        }
    }
}

#[tokio::test]
async fn a_head_over_max_request_head_is_431_and_never_forwarded() {
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url()).start().await;
    let url = format!("{}/fake/v1/chat/completions", rebound.url);
    let big = "x".repeat(200 * 1024);
    let refused = send("POST", &url, &[("x-fake-key", "big"), ("x-big", &big)], "{}").await;
    assert_eq!(refused.status, 431);
    assert_eq!(refused.header("x-rebound-error"), Some("request_head_too_large"));
    assert_eq!(refused.json()["error"]["code"], "request_head_too_large");
    assert_eq!(provider.count("big"), 0, "the provider is never called");

    // Just under the default 64 KiB: forwarded.
    let fits = "x".repeat(60 * 1024);
    let ok = send("POST", &url, &[("x-fake-key", "fits"), ("x-big", &fits)], "{}").await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(provider.count("fits"), 1);

    // A configured limit applies, with the same answer.
    let small = TestConfig::new(&provider.url())
        .server(|s| s.max_request_head = some("4KiB"))
        .start()
        .await;
    let url = format!("{}/fake/v1/chat/completions", small.url);
    let refused = send(
        "POST",
        &url,
        &[("x-fake-key", "small"), ("x-big", &"y".repeat(5000))],
        "{}",
    )
    .await;
    assert_eq!(refused.status, 431);
    assert_eq!(provider.count("small"), 0);
}

#[tokio::test]
async fn past_max_connections_new_connections_wait_in_the_backlog_and_are_then_served() {
    let provider = FakeProvider::start().await;
    provider.script("slow", vec![Step::Delay { ms: 800 }, Step::Delay { ms: 800 }]);
    let rebound = TestConfig::new(&provider.url())
        .server(|s| s.max_connections = Some(2))
        .start()
        .await;
    let at = addr(&rebound.url);
    let request = b"POST /fake/v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-fake-key: slow\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
    let started = Instant::now();
    let busy: Vec<_> = (0..2).map(|_| tokio::spawn(raw_exchange(at, request))).collect();
    // Both slots are taken once both requests reached the provider.
    assert!(eventually(Duration::from_secs(10), || provider.count("slow") == 2).await);
    // The third connection is accepted by the kernel (the backlog), not refused, and waits.
    let third = raw_exchange(at, b"GET /fake/echo HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await;
    let waited = started.elapsed();
    assert!(third.starts_with("HTTP/1.1 200"), "{third}");
    for b in busy {
        assert!(b.await.unwrap().starts_with("HTTP/1.1 200"));
    }
    assert!(
        waited >= Duration::from_millis(700),
        "served only once a slot freed ({waited:?})"
    );
}

#[tokio::test]
async fn slow_silent_and_idle_clients_are_closed_after_header_read_timeout() {
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .server(|s| s.header_read_timeout = some("1s"))
        .start()
        .await;
    let at = addr(&rebound.url);

    // Silent: connects, sends nothing.
    let mut silent = TcpStream::connect(at).await.unwrap();
    let (_, closed) = until_closed(&mut silent, Duration::from_secs(10)).await;
    let closed = closed.expect("a silent client is closed");
    assert!(closed >= Duration::from_millis(900), "{closed:?}");

    // Slow: a head trickled one byte every 200 ms, never finished.
    let mut slow = TcpStream::connect(at).await.unwrap();
    slow.write_all(b"POST /fake/v1/chat/completions HTTP/1.1\r\nx-fake-key: slowloris\r\n")
        .await
        .unwrap();
    let trickle = tokio::spawn(async move {
        for _ in 0..50 {
            if slow.write_all(b"x").await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    });
    let cut = tokio::time::timeout(Duration::from_secs(15), trickle)
        .await
        .unwrap()
        .unwrap();
    assert!(cut, "a head that never ends is cut");
    assert_eq!(provider.count("slowloris"), 0);

    // Idle: one request answered, then nothing: the kept-alive connection is closed.
    let mut idle = TcpStream::connect(at).await.unwrap();
    idle.write_all(b"GET /fake/echo HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let (answer, closed) = until_closed(&mut idle, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(closed.is_some(), "an idle kept-alive connection is closed");
}
