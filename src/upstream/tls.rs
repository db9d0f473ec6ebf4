//! TLS to upstreams: rustls with the webpki roots plus an upstream's optional `ca_file`.

use std::path::Path;
use std::sync::Arc;

/// Why an upstream's TLS setup failed (at startup, never per request).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read ca_file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("ca_file {path} holds no usable PEM certificate")]
    NoCertificate { path: String },
    #[error("TLS setup failed: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A client config trusting the webpki roots and the certificates in `ca_file`.
pub(crate) fn client_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        let shown = path.display().to_string();
        let pem = std::fs::read(path).map_err(|source| TlsError::Read {
            path: shown.clone(),
            source,
        })?;
        let mut added = 0;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()).flatten() {
            if roots.add(cert).is_ok() {
                added += 1;
            }
        }
        if added == 0 {
            return Err(TlsError::NoCertificate { path: shown });
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
