//! Graceful shutdown: stop accepting, `/readyz` 503, in-flight streams finish, bounded by the grace.

use std::time::Duration;

use http_body_util::BodyExt;
use rebound::Exit;

use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::sse_stream_bytes;
use crate::support::*;

#[tokio::test]
async fn drain_keeps_an_inflight_stream_alive_to_its_end() {
    let provider = FakeProvider::start().await;
    let mut rebound = TestConfig::new(&provider.url()).start().await;
    let proxy_addr = rebound.server.as_ref().unwrap().proxy_addr;
    let resp = send_streaming(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[("x-fake-chunks", "6"), ("x-fake-gap-ms", "150")],
        r#"{"stream":true}"#,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let reader = tokio::spawn(async move { resp.into_body().collect().await.map(|b| b.to_bytes()) });

    let admin = rebound.admin.clone();
    let server = rebound.server.take().unwrap();
    server.shutdown();
    // While draining: not ready, and no new connections.
    assert!(
        eventually(Duration::from_secs(2), || {
            std::net::TcpStream::connect(proxy_addr).is_err()
        })
        .await,
        "the listener should be closed"
    );
    let ready = get(&format!("{admin}/readyz")).await;
    assert_eq!(ready.status, 503);
    assert_eq!(ready.text(), "draining\n");

    let body = reader.await.unwrap().expect("the stream ends cleanly");
    assert_eq!(String::from_utf8_lossy(&body), sse_stream_bytes(6));
    assert_eq!(server.wait().await, Exit::Drained);
}

#[tokio::test]
async fn grace_expiry_closes_what_is_left() {
    let provider = FakeProvider::start().await;
    let mut rebound = TestConfig::new(&provider.url())
        .server(|s| s.shutdown_grace = some("300ms"))
        .start()
        .await;
    provider.script("stall", vec![Step::StallAfterFirstChunk]);
    let resp = send_streaming(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[("x-fake-key", "stall")],
        "{}",
    )
    .await;
    let reader = tokio::spawn(async move { resp.into_body().collect().await.map(|b| b.to_bytes()) });
    // Ended by the 300 ms grace (the exit says so), not by the stalled stream, which never ends.
    let exit = rebound.shutdown().await;
    assert_eq!(exit, Exit::GraceExpired { closed: 1 });
    // The client sees an aborted response, not a clean end.
    assert!(reader.await.unwrap().is_err());
}

#[tokio::test]
async fn idle_keepalive_connections_do_not_hold_the_drain() {
    let provider = FakeProvider::start().await;
    let mut rebound = TestConfig::new(&provider.url()).start().await;
    // An idle keep-alive connection from a previous request.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(rebound.server.as_ref().unwrap().proxy_addr)
        .await
        .unwrap();
    s.write_all(b"GET /fake/echo HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 4096];
    let _ = s.read(&mut buf).await.unwrap();
    // Drained (not GraceExpired): the idle connection was closed, not waited for.
    assert_eq!(rebound.shutdown().await, Exit::Drained);
}
