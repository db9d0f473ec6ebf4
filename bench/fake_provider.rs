//! The fake provider as a process, for the benchmark and the Python end-to-end tests.
//!
//! `cargo run --release --example fake-provider -- --listen 127.0.0.1:9000 [--tls-dir DIR] [--record]`
//! With `--tls-dir`, it writes `ca.pem` there and serves TLS (ALPN h2, http/1.1) for `localhost`.

#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // the clock and lock rules are the product's: harnesses measure real time and keep their own fixtures
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fixture: fails loudly by design

#[path = "../tests/it/support/certs.rs"]
mod certs;
#[path = "../tests/it/support/event_stream.rs"]
mod event_stream;
#[path = "../tests/it/support/fake_hosts.rs"]
mod fake_hosts;
#[path = "../tests/it/support/fake_provider.rs"]
mod fake_provider;
#[path = "../tests/it/support/sigv4.rs"]
mod sigv4;

use std::time::Duration;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let listen = arg("--listen").unwrap_or_else(|| "127.0.0.1:9000".into());
    let record = args.iter().any(|a| a == "--record");
    let tls = arg("--tls-dir").map(|dir| {
        let pki = certs::test_pki();
        std::fs::write(format!("{dir}/ca.pem"), &pki.ca_pem).expect("write ca.pem");
        let mut server = pki.server;
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        server
    });
    let provider = fake_provider::FakeProvider::start_on(&listen, tls, record).await;
    println!("fake provider listening on {}", provider.url());
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}
