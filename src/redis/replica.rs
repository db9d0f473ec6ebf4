//! A replica's identity among the processes that share Redis: who holds a limit's lease or slots,
//! whose heartbeat says it is alive, which replica an idempotency claim's owner token names.

use std::fmt;
use std::sync::Arc;

/// A replica's id: 64 random bits as 16 lowercase hex digits, made when its state is made.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ReplicaId(Arc<str>);

impl ReplicaId {
    /// The number of hex digits of an id.
    pub(crate) const HEX: usize = 16;

    /// A new id.
    pub fn random() -> ReplicaId {
        let n: u64 = rand::random();
        ReplicaId(Arc::from(format!("{n:016x}")))
    }

    /// The text, for Redis and logs.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReplicaId({:?})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_sixteen_hex_digits_and_new_each_time() {
        let (a, b) = (ReplicaId::random(), ReplicaId::random());
        for id in [&a, &b] {
            assert_eq!(id.as_str().len(), ReplicaId::HEX);
            assert!(id
                .as_str()
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        }
        assert_ne!(a, b);
        assert_eq!(format!("{a:?}"), format!("ReplicaId({:?})", a.as_str()));
    }
}
