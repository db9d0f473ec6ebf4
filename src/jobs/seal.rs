//! Credentials of queued jobs in Redis: sealed with ChaCha20-Poly1305 under a key derived from
//! `[jobs] secret` (shared by the fleet), the job id as associated data, so that a sealed blob
//! neither reveals nor can be moved to another job. Redis never holds a credential in the clear.

use base64::Engine as _;
use rand::Rng as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};

use crate::idempotency::fingerprint::digest;

/// Seals and opens credential headers.
pub(crate) struct Sealer {
    key: LessSafeKey,
}

impl Sealer {
    /// The sealer for `secret` (any length; the key is its SHA-256 under a domain separator).
    pub(crate) fn new(secret: &str) -> Option<Sealer> {
        let hex = digest(&[b"rebound-jobs-seal-v1", secret.as_bytes()]);
        let key: Vec<u8> = (0..hex.len())
            .step_by(2)
            .filter_map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect();
        let key = UnboundKey::new(&CHACHA20_POLY1305, &key).ok()?;
        Some(Sealer {
            key: LessSafeKey::new(key),
        })
    }

    /// `base64(nonce || ciphertext || tag)`.
    pub(crate) fn seal(&self, aad: &str, plain: &[u8]) -> Option<String> {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill(&mut nonce);
        let mut data = plain.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad.as_bytes()),
                &mut data,
            )
            .ok()?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&data);
        Some(base64::engine::general_purpose::STANDARD.encode(out))
    }

    /// The plaintext, or `None` when the blob was not sealed for `aad` under this secret.
    pub(crate) fn open(&self, aad: &str, sealed: &str) -> Option<Vec<u8>> {
        let raw = base64::engine::general_purpose::STANDARD.decode(sealed).ok()?;
        if raw.len() < NONCE_LEN {
            return None;
        }
        let (nonce, data) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut data = data.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(aad.as_bytes()), &mut data)
            .ok()?;
        Some(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seals_and_opens_only_for_the_same_job_and_secret() {
        let s = Sealer::new("a shared secret of the fleet").unwrap();
        let sealed = s.seal("job-1", b"Bearer sk-CANARY").unwrap();
        assert!(!sealed.contains("CANARY"));
        assert_eq!(s.open("job-1", &sealed).unwrap(), b"Bearer sk-CANARY");
        assert!(s.open("job-2", &sealed).is_none(), "bound to its job");
        let other = Sealer::new("another secret").unwrap();
        assert!(other.open("job-1", &sealed).is_none(), "bound to its secret");
        assert_ne!(
            sealed,
            s.seal("job-1", b"Bearer sk-CANARY").unwrap(),
            "fresh nonce each time"
        );
        assert!(s.open("job-1", "not base64!").is_none());
        assert!(s.open("job-1", "AAAA").is_none());
    }
}
