//! A job's identity: the id it is queued, stored, polled (`/jobs/{id}`) and called back under.

use std::fmt;

use rand::Rng as _;

use crate::idempotency::fingerprint::{digest, Scope};

/// Longest id the job API accepts in its path.
const MAX_LEN: usize = 64;

/// A job's id: 32 hex digits, random, or a hash of the route, the tenant scope and the
/// idempotency key (the same key from the same tenant names the same job). Its text is what the
/// Redis keys, the stream entries, the API's JSON and the `x-rebound-job-id` header carry.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct JobId(String);

impl JobId {
    /// A fresh random id (a submission without an idempotency key).
    pub(crate) fn random() -> JobId {
        JobId(format!("{:032x}", rand::rng().random::<u128>()))
    }

    /// The id of the job of idempotency key `key` on `route` in tenant scope `scope`: the same
    /// three always give the same id.
    pub(crate) fn keyed(route: &str, scope: &Scope, key: &str) -> JobId {
        let mut id = digest(&[
            b"rebound-job-v1",
            route.as_bytes(),
            scope.as_str().as_bytes(),
            key.as_bytes(),
        ]);
        id.truncate(32);
        JobId(id)
    }

    /// The id of a job API path (`/jobs/{id}`): `None` when it cannot be one (empty, longer than
    /// 64 characters, or not hex).
    pub(crate) fn parse(text: &str) -> Option<JobId> {
        let valid = !text.is_empty() && text.len() <= MAX_LEN && text.bytes().all(|b| b.is_ascii_hexdigit());
        valid.then(|| JobId(text.to_string()))
    }

    /// An id as a store holds it (a stream entry's `job` field, a fuzz target's): taken as it is.
    pub(crate) fn from_stored(text: String) -> JobId {
        JobId(text)
    }

    /// The text, for Redis keys, headers, JSON and logs.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobId({:?})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_are_32_hex_digits() {
        let id = JobId::random();
        assert_eq!(id.as_str().len(), 32);
        assert!(JobId::parse(id.as_str()).is_some_and(|p| p == id));
        assert_ne!(JobId::random(), id);
    }

    #[test]
    fn the_same_key_and_tenant_give_the_same_id() {
        let (a, b) = (Scope::new("a"), Scope::new("b"));
        let id = JobId::keyed("r", &a, "k");
        assert_eq!(id.as_str().len(), 32);
        assert_eq!(JobId::keyed("r", &a, "k"), id);
        assert_ne!(JobId::keyed("r", &b, "k"), id);
        assert_ne!(JobId::keyed("r", &a, "l"), id);
        assert_ne!(JobId::keyed("s", &a, "k"), id);
    }

    #[test]
    fn the_api_path_takes_only_hex_ids() {
        assert_eq!(JobId::parse("0aF9").map(|i| i.to_string()), Some("0aF9".to_string()));
        assert!(JobId::parse("").is_none());
        assert!(JobId::parse("xyz").is_none());
        assert!(JobId::parse(&"a".repeat(65)).is_none());
        assert!(JobId::parse(&"a".repeat(64)).is_some());
    }

    #[test]
    fn shows_its_text() {
        let id = JobId::from_stored("abc".into());
        assert_eq!(format!("{id} {id:?}"), r#"abc JobId("abc")"#);
    }
}
