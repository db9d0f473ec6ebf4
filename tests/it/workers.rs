//! The runtime of one thread per core (`rebound::Workers`): client connections spread over the
//! workers, each worker sends on upstream connections of its own, and the drain waits for the
//! requests of every worker.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rebound::{Exit, Workers};

use crate::support::config_builder::TestConfig;
use crate::support::*;

/// One kept-alive client connection, as an SDK's pool holds.
struct Conn(SendRequest<Full<Bytes>>);

impl Conn {
    async fn open(url: &str) -> Conn {
        let addr = url.trim_start_matches("http://");
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.unwrap();
        tokio::spawn(conn);
        Conn(sender)
    }

    /// POSTs `body` to the fake route's chat completions: the status and the whole body.
    async fn chat(&mut self, body: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let mut req = http::Request::post("/fake/v1/chat/completions")
            .header("host", "rebound")
            .header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(body.to_owned()))).unwrap();
        self.0.ready().await.unwrap();
        let resp = self.0.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }
}

/// `rebound_client_connections{worker="W"}` on the metrics page.
fn open_on(metrics: &str, worker: usize) -> Option<u64> {
    let prefix = format!("rebound_client_connections{{worker=\"{worker}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn connections_spread_over_the_workers_each_with_its_own_upstream_connections() {
    let provider = FakeProvider::start().await;
    let config = TestConfig::new(&provider.url()).config();
    let mut rebound = Rebound::start_on(config, Workers::spawn(1).unwrap()).await;

    // Four kept-alive connections, opened one after the other (each served before the next
    // opens): they alternate between the two workers.
    let mut conns = Vec::new();
    for _ in 0..4 {
        let mut c = Conn::open(&rebound.url).await;
        assert_eq!(c.chat("{}", &[]).await.0, 200);
        conns.push(c);
    }
    let metrics = rebound.metrics().await;
    assert_eq!(open_on(&metrics, 0), Some(2), "{metrics}");
    assert_eq!(open_on(&metrics, 1), Some(2), "{metrics}");

    // One request at a time, from every connection in turn: each worker reuses the upstream
    // connection it opened (two in all), never the other worker's.
    for _ in 0..5 {
        for c in &mut conns {
            let (status, body) = c.chat("{}", &[]).await;
            assert_eq!(status, 200, "{body}");
            assert!(body.contains("chat.completion"), "{body}");
        }
    }
    assert_eq!(provider.count("default"), 24);
    assert_eq!(provider.connections(), 2, "one upstream connection per worker");

    // A connection closed leaves its worker's count; the next one goes to the least busy.
    drop(conns.remove(1));
    drop(conns.remove(2));
    let mut fresh = None;
    for _ in 0..100 {
        if open_on(&rebound.metrics().await, 1) == Some(0) {
            fresh = Some(Conn::open(&rebound.url).await);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut fresh = fresh.expect("the closed connections leave worker 1's count");
    assert_eq!(fresh.chat("{}", &[]).await.0, 200);
    let metrics = rebound.metrics().await;
    assert_eq!(
        (open_on(&metrics, 0), open_on(&metrics, 1)),
        (Some(2), Some(1)),
        "{metrics}"
    );

    // The drain waits for a stream on each worker.
    let streams = [conns.remove(0), fresh].map(|mut c| {
        tokio::spawn(async move {
            let body = r#"{"stream":true}"#;
            c.chat(body, &[("x-fake-chunks", "5"), ("x-fake-gap-ms", "60")]).await
        })
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(rebound.shutdown().await, Exit::Drained);
    for s in streams {
        let (status, body) = s.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(
            body.contains(r#""finish_reason":"stop""#),
            "every event arrived: {body}"
        );
    }
}
