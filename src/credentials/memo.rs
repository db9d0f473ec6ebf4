//! The SHA-256 names already computed ([`super::CredentialHash`], a [`super::LimitKey`]'s model),
//! found again by a keyed hash of what they name: a credential or a model seen before costs a
//! SipHash and a map lookup instead of a SHA-256 (a request under per-model holds or a
//! concurrency limit needs two). The map is keyed by 128 bits of SipHash under this process's
//! random keys, never by the value: it holds no credential, and its keys mean nothing outside the
//! process. Bounded: emptied when full (the names are recomputed, nothing is lost).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};

use std::collections::hash_map::RandomState;

/// Names kept at most; past it the map starts again empty.
const CAP: usize = 4096;

/// A memo of 128-bit names (see the module's text).
#[derive(Default)]
pub(super) struct Memo {
    keys: [RandomState; 2],
    names: parking_lot::Mutex<HashMap<u128, [u8; 16]>>,
}

impl Memo {
    /// The name of `what`, computed by `name` the first time (and again after the map was full).
    pub(super) fn name(&self, what: impl Hash + Copy, name: impl FnOnce() -> [u8; 16]) -> [u8; 16] {
        let key = (u128::from(self.keys[0].hash_one(what)) << 64) | u128::from(self.keys[1].hash_one(what));
        if let Some(n) = self.names.lock().get(&key) {
            return *n;
        }
        let n = name();
        let mut names = self.names.lock();
        if names.len() >= CAP {
            names.clear();
        }
        names.insert(key, n);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_computed_once_and_the_map_stays_bounded() {
        let memo = Memo::default();
        let mut computed = 0;
        for _ in 0..3 {
            memo.name(("m", 1u8), || {
                computed += 1;
                [7; 16]
            });
        }
        assert_eq!(computed, 1);
        assert_eq!(memo.name(("m", 1u8), || [0; 16]), [7; 16]);
        // What differs is named apart.
        assert_eq!(memo.name(("m", 2u8), || [9; 16]), [9; 16]);
        for i in 0..(CAP as u32 + 10) {
            memo.name(i, || [1; 16]);
        }
        assert!(memo.names.lock().len() <= CAP);
    }
}
