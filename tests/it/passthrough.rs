//! The forwarding core through real sockets: what the app sees is what the provider sent.

use std::time::Duration;

use http_body_util::BodyExt;
use rebound::hooks::config::raw::{RawRetry, RawRoute, RawUpstream};

use crate::support::config_builder::{some, TestConfig};
use crate::support::fake_provider::{chat_completion, sse_stream_bytes};
use crate::support::*;

async fn setup() -> (FakeProvider, Rebound) {
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url()).start().await;
    (provider, rebound)
}

#[tokio::test]
async fn json_passes_through_byte_exact() {
    let (provider, rebound) = setup().await;
    let direct = post_json(&format!("{}/v1/chat/completions", provider.url()), "{}").await;
    let via = post_json(
        &format!("{}/fake/v1/chat/completions", rebound.url),
        r#"{"model":"gpt-fake"}"#,
    )
    .await;
    assert_eq!(via.status, 200);
    assert_eq!(via.body, direct.body);
    assert_eq!(via.text(), chat_completion());
    assert_eq!(via.header("content-type"), Some("application/json"));
    assert_eq!(via.header("x-request-id"), Some("req_fake_0001"));
    assert_eq!(via.header("x-rebound-attempts"), Some("1"));
    // The provider got the body unchanged on the stripped path.
    let seen = provider.requests("default");
    let last = seen.last().unwrap();
    assert_eq!(last.path, "/v1/chat/completions");
    assert_eq!(last.body, br#"{"model":"gpt-fake"}"#);
}

#[tokio::test]
async fn sse_passes_through_byte_exact() {
    let (_provider, rebound) = setup().await;
    let a = send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[("x-fake-chunks", "20")],
        r#"{"stream":true}"#,
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("content-type"), Some("text/event-stream"));
    assert_eq!(a.text(), sse_stream_bytes(20));
}

#[tokio::test]
async fn sse_first_chunk_arrives_before_the_provider_sends_the_last() {
    let (provider, rebound) = setup().await;
    let resp = send_streaming(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[
            ("x-fake-key", "stream"),
            ("x-fake-chunks", "5"),
            ("x-fake-gap-ms", "300"),
        ],
        r#"{"stream":true}"#,
    )
    .await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let first = first.into_data().unwrap();
    assert!(
        String::from_utf8_lossy(&first).contains("token0"),
        "first frame: {first:?}"
    );
    // The provider is still ~1.2 s from its last event: the proxy did not buffer the stream.
    assert_eq!(
        provider.streams_completed("stream"),
        0,
        "first chunk came only after the stream ended"
    );
    let rest = body.collect().await.unwrap().to_bytes();
    let mut all = first.to_vec();
    all.extend_from_slice(&rest);
    assert_eq!(String::from_utf8_lossy(&all), sse_stream_bytes(5));
    assert_eq!(provider.streams_completed("stream"), 1);
}

#[tokio::test]
async fn oversized_body_is_refused_with_413_and_not_forwarded() {
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .server(|s| s.max_request_body = some("1KiB"))
        .start()
        .await;
    let big = "x".repeat(2048);
    let a = send(
        "POST",
        &format!("{}/fake/echo", rebound.url),
        &[("x-fake-key", "big")],
        big.clone(),
    )
    .await;
    assert_eq!(a.status, 413);
    assert_eq!(a.header("x-rebound-error"), Some("body_too_large"));
    assert_eq!(a.header("x-should-retry"), Some("false"));
    assert_eq!(a.json()["error"]["code"], "body_too_large");
    assert_eq!(provider.count("big"), 0);

    // Chunked (no content-length): stopped once the bytes read pass the limit.
    let raw = format!(
        "POST /fake/echo HTTP/1.1\r\nhost: x\r\nx-fake-key: big\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n800\r\n{big}\r\n0\r\n\r\n"
    );
    let out = raw_exchange(rebound.server.as_ref().unwrap().proxy_addr, raw.as_bytes()).await;
    assert!(out.starts_with("HTTP/1.1 413"), "{out}");
    assert_eq!(provider.count("big"), 0);

    // At the limit: forwarded.
    let a = send(
        "POST",
        &format!("{}/fake/echo", rebound.url),
        &[("x-fake-key", "ok")],
        "x".repeat(1024),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["body_len"], 1024);
}

/// rebound's own errors in the dialect of the route's API (the SDK of each reads its own), and RFC
/// 9457 alone for a client that asks for it.
#[tokio::test]
async fn rebounds_errors_speak_the_routes_api() {
    // Nothing listens on port 9: every attempt fails to connect.
    let route = |name: &str| RawRoute {
        name: some(name),
        path_prefix: some(&format!("/{name}/")),
        upstream: some(name),
        strip_prefix: Some(true),
        ..RawRoute::default()
    };
    let rebound = TestConfig::new("http://127.0.0.1:9")
        .upstream_named("claude", "http://127.0.0.1:9", |u| u.api = some("anthropic"))
        .upstream_named("gemini", "http://127.0.0.1:9", |u| u.api = some("gemini"))
        .with_route(route("claude"))
        .with_route(route("gemini"))
        .start()
        .await;
    let call = |path: &'static str, accept: &'static str| {
        let url = format!("{}{path}", rebound.url);
        async move {
            send(
                "POST",
                &url,
                &[("content-type", "application/json"), ("accept", accept)],
                "{}",
            )
            .await
        }
    };
    let claude = call("/claude/v1/messages", "application/json").await;
    assert_eq!(
        (claude.status.as_u16(), claude.header("x-rebound-error")),
        (502, Some("upstream_unreachable"))
    );
    let v = claude.json();
    assert_eq!(
        (v["type"].as_str(), v["error"]["type"].as_str()),
        (Some("error"), Some("api_error")),
        "{v}"
    );
    assert_eq!(v["error"]["details"]["error_code"], "upstream_unreachable");
    let gemini = call("/gemini/v1beta/models/gemini-2.5-flash:generateContent", "*/*").await;
    let v = gemini.json();
    assert_eq!(
        (v["error"]["code"].as_u64(), v["error"]["status"].as_str()),
        (Some(502), Some("UNAVAILABLE")),
        "{v}"
    );
    assert!(v.get("status").is_none(), "{v}");
    let openai = call("/fake/v1/chat/completions", "application/json").await;
    assert_eq!(openai.json()["error"]["type"], "rebound_error");
    let problem = call("/claude/v1/messages", "application/problem+json").await;
    assert_eq!(problem.header("content-type"), Some("application/problem+json"));
    let v = problem.json();
    assert_eq!(v["type"], "https://rebound.dev/errors/upstream_unreachable");
    assert_eq!((v["status"].as_u64(), v.get("error")), (Some(502), None), "{v}");
}

#[tokio::test]
async fn unknown_route_is_404_without_listing_the_routes() {
    let (_provider, rebound) = setup().await;
    let a = get(&format!("{}/nope/v1/models", rebound.url)).await;
    assert_eq!(a.status, 404);
    assert_eq!(a.header("x-rebound-error"), Some("no_route"));
    assert_eq!(a.header("x-should-retry"), Some("false"));
    assert_eq!(a.header("content-type"), Some("application/json"));
    let v = a.json();
    assert_eq!(v["error"]["code"], "no_route");
    assert_eq!(v["error"]["type"], "rebound_error");
    assert_eq!(v["status"], 404);
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("no route matches \"/nope/v1/models\": "), "{v}");
    assert!(!message.contains("/fake/"), "the routes are the operator's: {v}");
    // No route, so no route's API: the path says which API the client speaks.
    let post = |path: &'static str| {
        let url = format!("{}{path}", rebound.url);
        async move { send("POST", &url, &[("content-type", "application/json")], "{}").await }
    };
    let anthropic = post("/nope/v1/messages").await.json();
    assert_eq!(
        (anthropic["type"].as_str(), anthropic["error"]["type"].as_str()),
        (Some("error"), Some("not_found_error")),
        "{anthropic}"
    );
    let gemini = post("/nope/v1beta/models/gemini-2.5-flash:generateContent")
        .await
        .json();
    assert_eq!(
        (gemini["error"]["code"].as_u64(), gemini["error"]["status"].as_str()),
        (Some(404), Some("NOT_FOUND")),
        "{gemini}"
    );
    let bedrock = post("/nope/model/anthropic.claude-haiku-4-5-v1:0/invoke").await.json();
    assert_eq!(bedrock["type"], "error", "{bedrock}");
}

#[tokio::test]
async fn absolute_form_and_connect_are_refused() {
    let (provider, rebound) = setup().await;
    let addr = rebound.server.as_ref().unwrap().proxy_addr;
    let target = provider.addr;
    let out = raw_exchange(
        addr,
        format!(
            "GET http://{target}/fake/echo HTTP/1.1\r\nhost: {target}\r\nx-fake-key: abs\r\nconnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(out.contains("x-rebound-error: forward_proxy_refused"), "{out}");
    let out = raw_exchange(
        addr,
        format!("CONNECT {target} HTTP/1.1\r\nhost: {target}\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 405"), "{out}");
    assert_eq!(provider.count("abs"), 0);
}

#[tokio::test]
async fn hop_by_hop_headers_are_stripped_and_host_is_the_upstreams() {
    let (provider, rebound) = setup().await;
    let addr = rebound.server.as_ref().unwrap().proxy_addr;
    let raw = "GET /fake/echo?a=1&b=two HTTP/1.1\r\nhost: 127.0.0.1\r\nx-fake-key: hop\r\nconnection: keep-alive, x-private-hop\r\n\
               keep-alive: timeout=5\r\nx-private-hop: secret-hop\r\nte: trailers\r\nproxy-authorization: Basic Zm9v\r\n\
               x-rebound-max-attempts: 1\r\nx-end-to-end: kept\r\n\r\n";
    let out = raw_exchange_one(addr, raw).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let req = provider.requests("hop").pop().unwrap();
    for gone in [
        "connection",
        "keep-alive",
        "x-private-hop",
        "te",
        "proxy-authorization",
        "x-rebound-max-attempts",
    ] {
        assert!(req.header(gone).is_none(), "{gone} was forwarded: {:?}", req.headers);
    }
    assert_eq!(req.header("x-end-to-end"), Some("kept"));
    assert_eq!(req.header("host"), Some(provider.addr.to_string().as_str()));
    assert_eq!(req.query.as_deref(), Some("a=1&b=two"));

    // Response side: the provider's hop-by-hop headers do not reach the client.
    provider.script(
        "hop-resp",
        vec![Step::status_with(
            200,
            &[
                ("connection", "x-upstream-hop"),
                ("x-upstream-hop", "1"),
                ("x-kept", "yes"),
            ],
        )],
    );
    let a = send(
        "GET",
        &format!("{}/fake/echo", rebound.url),
        &[("x-fake-key", "hop-resp")],
        "",
    )
    .await;
    assert_eq!(a.status, 200);
    assert!(a.header("x-upstream-hop").is_none());
    assert_eq!(a.header("x-kept"), Some("yes"));
}

/// Sends one request on a keep-alive connection and returns the head and whatever body arrived.
async fn raw_exchange_one(addr: std::net::SocketAddr, raw: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(raw.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[tokio::test]
async fn routes_prefixes_base_paths_and_set_headers() {
    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .with_upstream(
            "based",
            RawUpstream {
                url: Some(format!("{}/echo/base/", provider.url())),
                set_headers: [("authorization", "Bearer sk-sidecar-only"), ("x-extra", "1")]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into(),
                ..RawUpstream::default()
            },
        )
        .with_route(RawRoute {
            name: some("nested"),
            path_prefix: some("/fake/v1/special/"),
            upstream: some("based"),
            strip_prefix: Some(true),
            ..RawRoute::default()
        })
        .with_route(RawRoute {
            name: some("unstripped"),
            path_prefix: some("/echo/"),
            upstream: some("fake"),
            ..RawRoute::default()
        })
        .start()
        .await;

    // Longest prefix wins, prefix stripped, upstream base path prepended, credentials injected.
    let a = send(
        "POST",
        &format!("{}/fake/v1/special/thing?x=1", rebound.url),
        &[("authorization", "Bearer app-placeholder"), ("x-fake-key", "nested")],
        "{}",
    )
    .await;
    assert_eq!(a.status, 200);
    let req = provider.requests("nested").pop().unwrap();
    assert_eq!(req.path, "/echo/base/thing");
    assert_eq!(req.query.as_deref(), Some("x=1"));
    assert_eq!(req.header("authorization"), Some("Bearer sk-sidecar-only"));
    assert_eq!(req.header("x-extra"), Some("1"));

    // strip_prefix = false keeps the path.
    let a = send(
        "GET",
        &format!("{}/echo/kept", rebound.url),
        &[("x-fake-key", "kept")],
        "",
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(provider.requests("kept").pop().unwrap().path, "/echo/kept");

    // The shorter prefix still serves the rest.
    let a = send(
        "GET",
        &format!("{}/fake/echo", rebound.url),
        &[("x-fake-key", "short")],
        "",
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(provider.requests("short").pop().unwrap().path, "/echo");
}

#[tokio::test]
async fn upstream_errors_are_passed_through_as_they_came() {
    let (provider, rebound) = setup().await;
    provider.script(
        "e400",
        vec![Step::Status {
            status: 400,
            headers: vec![],
            body: Some(r#"{"error":{"message":"bad"}}"#.into()),
        }],
    );
    let a = send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[("x-fake-key", "e400")],
        "{}",
    )
    .await;
    assert_eq!(a.status, 400);
    assert_eq!(a.text(), r#"{"error":{"message":"bad"}}"#);
    assert!(a.header("x-rebound-error").is_none());
    assert_eq!(provider.count("e400"), 1);
}

#[tokio::test]
async fn unreachable_upstream_is_502_and_slow_one_is_504() {
    // Nothing listens on this port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let rebound = TestConfig::new(&format!("http://127.0.0.1:{port}")).start().await;
    let a = post_json(&format!("{}/fake/v1/chat/completions", rebound.url), "{}").await;
    assert_eq!(a.status, 502);
    assert_eq!(a.header("x-rebound-error"), Some("upstream_unreachable"));
    assert_eq!(a.header("x-should-retry"), Some("false"));
    assert_eq!(a.json()["error"]["code"], "upstream_unreachable");

    let provider = FakeProvider::start().await;
    let rebound = TestConfig::new(&provider.url())
        .retry(
            "short",
            RawRetry {
                max_attempts: Some(1),
                per_try_timeout: some("200ms"),
                ..RawRetry::default()
            },
        )
        .route(|r| r.retry = some("short"))
        .start()
        .await;
    provider.script("slow", vec![Step::Delay { ms: 2000 }]);
    let started = std::time::Instant::now();
    let a = send(
        "POST",
        &format!("{}/fake/v1/chat/completions", rebound.url),
        &[("x-fake-key", "slow")],
        "{}",
    )
    .await;
    assert_eq!(a.status, 504);
    // Cut by the 200 ms per-try limit, not answered after the provider's 2 s: one call.
    assert_eq!(a.header("x-rebound-error"), Some("deadline_exceeded"));
    assert_eq!(provider.count("slow"), 1);
    eprintln!("cut after {:?}", started.elapsed());
}

#[tokio::test]
async fn h2c_clients_are_served() {
    let (provider, rebound) = setup().await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let req = http::Request::post(format!("{}/fake/v1/chat/completions", rebound.url))
        .header("x-fake-key", "h2c")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, chat_completion().as_bytes());
    assert_eq!(provider.count("h2c"), 1);
}

#[tokio::test]
async fn keep_alive_reuses_client_and_upstream_connections() {
    let (provider, rebound) = setup().await;
    for _ in 0..5 {
        let a = post_json(&format!("{}/fake/v1/chat/completions", rebound.url), "{}").await;
        assert_eq!(a.status, 200);
    }
    assert_eq!(
        provider.connections(),
        1,
        "the upstream pool should reuse one connection"
    );
}

#[tokio::test]
async fn websocket_upgrades_pass_through() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (provider, rebound) = setup().await;
    let addr = rebound.server.as_ref().unwrap().proxy_addr;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        b"GET /fake/ws HTTP/1.1\r\nhost: x\r\nx-fake-key: ws\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\
          sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut byte))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n, 1, "closed during the handshake: {}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    // After the switch, bytes flow both ways untouched (the fake upstream echoes).
    s.write_all(b"\x81\x05hello").await.unwrap();
    let mut echo = [0u8; 7];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut echo))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&echo, b"\x81\x05hello");
    assert_eq!(provider.count("ws"), 1);
}
