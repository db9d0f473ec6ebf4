//! TLS upstreams with a test CA (rcgen), and HTTP/2 to the upstream when it offers it.

use crate::support::certs::test_pki;
use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::{chat_completion, sse_stream_bytes};
use crate::support::*;

async fn tls_setup(alpn: Option<Vec<Vec<u8>>>) -> (FakeProvider, Rebound, tempfile::TempDir) {
    let pki = test_pki();
    let mut server = pki.server;
    if let Some(alpn) = alpn {
        server.alpn_protocols = alpn;
    }
    let provider = FakeProvider::start_tls(server).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    let rebound = TestConfig::new(&provider.url())
        .upstream(|u| u.ca_file = some(&ca.display().to_string()))
        .start()
        .await;
    (provider, rebound, dir)
}

#[tokio::test]
async fn tls_upstream_with_a_private_ca_and_http2() {
    let (provider, rebound, _dir) = tls_setup(None).await;
    let a = post_json(&format!("{}/fake/v1/chat/completions", rebound.url), "{}").await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.text(), chat_completion());
    let seen = provider.requests("default").pop().unwrap();
    assert_eq!(seen.version, "HTTP/2.0", "ALPN should select h2");
    // :authority carries the upstream's host.
    let s = send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[("x-fake-chunks", "7")],
        r#"{"stream":true}"#,
    )
    .await;
    assert_eq!(s.text(), sse_stream_bytes(7));
}

#[tokio::test]
async fn tls_upstream_over_http1_when_h2_is_not_offered() {
    let (provider, rebound, _dir) = tls_setup(Some(vec![b"http/1.1".to_vec()])).await;
    let a = send(
        "GET",
        &format!("{}/fake/echo", rebound.url),
        &[("x-fake-key", "h1")],
        "",
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let seen = provider.requests("h1").pop().unwrap();
    assert_eq!(seen.version, "HTTP/1.1");
    assert_eq!(
        seen.header("host"),
        Some(format!("localhost:{}", provider.addr.port()).as_str())
    );
}

#[tokio::test]
async fn untrusted_certificate_is_a_502_not_a_silent_downgrade() {
    // The provider's CA is not given to rebound: the webpki roots do not trust it.
    let pki = test_pki();
    let provider = FakeProvider::start_tls(pki.server).await;
    let rebound = TestConfig::new(&provider.url()).start().await;
    let a = post_json(&format!("{}/fake/v1/chat/completions", rebound.url), "{}").await;
    assert_eq!(a.status, 502);
    assert_eq!(a.header("x-rebound-error"), Some("upstream_unreachable"));
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("certificate"),
        "{}",
        a.text()
    );
    assert_eq!(provider.count("default"), 0);
}
