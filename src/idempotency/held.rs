//! Completions this replica delivered but has not yet written to the store (Redis did not answer
//! in time). Until the write lands, a duplicate of the key that reaches this replica is answered
//! from here, never run again; other replicas see the original's claim, still renewed, and wait.
//!
//! Bounded: at most [`MAX_ENTRIES`] completions and [`MAX_BYTES`] of responses. A completion that
//! finds it full is not held: it gets the single write it always had, and is counted as lost when
//! that fails (`rebound_idempotency_completions_total{result="lost"}`).

use foldhash::HashMap;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::fingerprint::{Fingerprint, RecordKey};
use super::store::Completion;

/// The most completions held at once.
pub(crate) const MAX_ENTRIES: usize = 10_000;
/// The most response bytes held at once.
pub(crate) const MAX_BYTES: usize = 64 << 20;

/// A delivered response waiting for its write.
#[derive(Debug)]
pub struct HeldCompletion {
    pub fingerprint: Fingerprint,
    pub completion: Completion,
}

impl HeldCompletion {
    fn size(&self) -> usize {
        let response = match &self.completion {
            Completion::Kept(r) => r.size(),
            Completion::NotKept => 0,
        };
        response + self.fingerprint.as_str().len() + 128
    }
}

/// The process's held completions, by record key (shared by every route and survives reloads).
#[derive(Default)]
pub struct Held {
    map: Mutex<HeldMap>,
    /// Entries held; read without the lock so that the common case (nothing held) costs one load.
    len: AtomicUsize,
}

#[derive(Default)]
struct HeldMap {
    map: HashMap<RecordKey, Arc<HeldCompletion>>,
    bytes: usize,
}

impl Held {
    /// The completion held for `record`, if any.
    pub fn get(&self, record: &RecordKey) -> Option<Arc<HeldCompletion>> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let m = self.map.lock();
        m.map.get(record).cloned()
    }

    /// Holds `completion` for `record`; false (nothing held) when the bounds are reached.
    pub fn hold(&self, record: &RecordKey, completion: Arc<HeldCompletion>) -> bool {
        let size = completion.size();
        let mut m = self.map.lock();
        if m.map.len() >= MAX_ENTRIES || m.bytes + size > MAX_BYTES {
            return false;
        }
        // The key's block is shared, not copied.
        if let Some(old) = m.map.insert(record.clone(), completion) {
            m.bytes = m.bytes.saturating_sub(old.size());
        }
        m.bytes += size;
        self.len.store(m.map.len(), Ordering::Release);
        true
    }

    /// Lets go of `record`'s completion (written, or given up).
    pub(crate) fn forget(&self, record: &RecordKey) {
        let mut m = self.map.lock();
        if let Some(old) = m.map.remove(record) {
            m.bytes = m.bytes.saturating_sub(old.size());
        }
        self.len.store(m.map.len(), Ordering::Release);
    }

    /// Completions held now.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::test_ids::{fp, k};
    use crate::idempotency::StoredResponse;
    use bytes::Bytes;

    fn held(body: usize) -> Arc<HeldCompletion> {
        Arc::new(HeldCompletion {
            fingerprint: fp("fp"),
            completion: Completion::Kept(StoredResponse {
                status: 200,
                headers: Vec::new().into(),
                body: Bytes::from(vec![b'x'; body]),
                age: std::time::Duration::ZERO,
            }),
        })
    }

    #[test]
    fn holds_until_forgotten() {
        let h = Held::default();
        assert!(h.get(&k("a")).is_none());
        assert!(h.hold(&k("a"), held(10)));
        assert_eq!(h.len(), 1);
        assert!(h.get(&k("a")).is_some());
        assert!(h.get(&k("b")).is_none());
        h.forget(&k("a"));
        assert!(h.get(&k("a")).is_none());
        assert!(h.is_empty());
    }

    #[test]
    fn refuses_past_its_bytes() {
        let h = Held::default();
        assert!(h.hold(&k("a"), held(MAX_BYTES / 2)));
        assert!(!h.hold(&k("b"), held(MAX_BYTES / 2 + 1)), "over the byte bound");
        assert!(h.get(&k("b")).is_none());
        h.forget(&k("a"));
        assert!(h.hold(&k("b"), held(MAX_BYTES / 2 + 1)), "room again");
    }

    #[test]
    fn refuses_past_its_entries() {
        let h = Held::default();
        for i in 0..MAX_ENTRIES {
            assert!(h.hold(&k(&i.to_string()), held(1)));
        }
        assert!(!h.hold(&k("one more"), held(1)));
        assert_eq!(h.len(), MAX_ENTRIES);
    }
}
