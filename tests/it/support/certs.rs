//! Test certificates: a throwaway CA (rcgen) and a `localhost` leaf signed by it.

#![allow(dead_code)]

use std::sync::Arc;

/// A CA and a server configuration whose certificate it signed.
pub struct TestPki {
    /// The CA certificate in PEM, for `ca_file`.
    pub ca_pem: String,
    /// A server config for `localhost` / `127.0.0.1` (no ALPN set).
    pub server: rustls::ServerConfig,
    /// The same leaf certificate and its key in PEM (for servers configured by file).
    pub leaf_pem: String,
    pub leaf_key_pem: String,
}

pub fn test_pki() -> TestPki {
    let ca_key = rcgen::KeyPair::generate().expect("ca key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "rebound test CA");
    let ca = ca_params.self_signed(&ca_key).expect("ca cert");

    let leaf_key = rcgen::KeyPair::generate().expect("leaf key");
    let leaf_params =
        rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).expect("leaf params");
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).expect("leaf cert");

    let key_der = rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).expect("key der");
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone(), ca.der().clone()], key_der)
        .expect("server config");
    TestPki {
        ca_pem: ca.pem(),
        server,
        leaf_pem: leaf.pem(),
        leaf_key_pem: leaf_key.serialize_pem(),
    }
}
