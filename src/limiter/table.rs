//! A limit's buckets on this replica, bounded: at most `cap` of them, a new bucket past it taking
//! the place of one no request used since the clock hand last passed it (CLOCK, the
//! second-chance approximation of least recently used). Finding it costs O(1) amortised: each
//! entry the hand passes over was either used since (its mark, set by that use, is cleared: paid
//! for by the use) or is pinned. Pinned entries (a request holds something of the bucket, asks
//! the fleet for it, or waits for it) are never taken: the table then grows past `cap` by at most
//! their number, which the requests in flight bound. Nothing is swept: before, past 100,000
//! buckets every new one ran a pass over all of them under the limit's lock, evicted nothing
//! younger than two minutes, and the table grew anyway.

use std::collections::HashMap;

use crate::limits::key::BucketKey;

/// A bounded table of `V` by bucket.
pub(crate) struct Table<V> {
    index: HashMap<BucketKey, usize>,
    entries: Vec<Entry<V>>,
    hand: usize,
    cap: usize,
}

struct Entry<V> {
    key: BucketKey,
    value: V,
    /// Used since the hand last passed.
    used: bool,
}

impl<V> Table<V> {
    /// An empty table of at most `cap` entries beyond the pinned ones.
    pub(crate) fn new(cap: usize) -> Table<V> {
        Table {
            index: HashMap::new(),
            entries: Vec::new(),
            hand: 0,
            cap: cap.max(1),
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn get(&self, key: &BucketKey) -> Option<&V> {
        self.index.get(key).map(|&i| &self.entries[i].value)
    }

    /// The entry of `key`, marked used.
    pub(crate) fn get_mut(&mut self, key: &BucketKey) -> Option<&mut V> {
        let e = &mut self.entries[*self.index.get(key)?];
        e.used = true;
        Some(&mut e.value)
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&BucketKey, &mut V)> {
        self.entries.iter_mut().map(|e| (&e.key, &mut e.value))
    }

    /// The entry of `key`, marked used; made by `make` when there is none, in the place of an
    /// entry neither used since the hand passed nor `pinned` when the table is full: that one is
    /// returned, for what it holds to be handed back.
    pub(crate) fn get_or_insert(
        &mut self,
        key: BucketKey,
        make: impl FnOnce() -> V,
        pinned: impl Fn(&BucketKey, &V) -> bool,
    ) -> (&mut V, Option<(BucketKey, V)>) {
        if let Some(&i) = self.index.get(&key) {
            let e = &mut self.entries[i];
            e.used = true;
            return (&mut e.value, None);
        }
        let entry = Entry {
            key,
            value: make(),
            used: true,
        };
        if self.entries.len() < self.cap {
            return (self.push(entry), None);
        }
        // Twice round at most: the first pass clears the marks, the second finds one unused
        // unless every entry is pinned (then the table grows).
        for _ in 0..2 * self.entries.len() {
            let i = self.hand % self.entries.len();
            self.hand = i + 1;
            let e = &mut self.entries[i];
            if pinned(&e.key, &e.value) {
                continue;
            }
            if std::mem::take(&mut e.used) {
                continue;
            }
            let old = std::mem::replace(e, entry);
            self.index.remove(&old.key);
            self.index.insert(key, i);
            return (&mut self.entries[i].value, Some((old.key, old.value)));
        }
        (self.push(entry), None)
    }

    fn push(&mut self, entry: Entry<V>) -> &mut V {
        let i = self.entries.len();
        self.index.insert(entry.key, i);
        self.entries.push(entry);
        &mut self.entries[i].value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn key(n: u64) -> BucketKey {
        let mut k = [0; 16];
        k[..8].copy_from_slice(&n.to_le_bytes());
        BucketKey(k)
    }

    #[test]
    fn a_flood_of_new_buckets_keeps_the_table_at_its_cap_and_the_busy_ones_in_it() {
        let mut t: Table<u32> = Table::new(4);
        // Bucket 0 is held by a running request (pinned); bucket 1 is used all the time.
        t.get_or_insert(key(0), || 0, |_, _| false);
        let mut rng = rand::rngs::StdRng::seed_from_u64(58);
        let mut evicted = 0;
        for _ in 0..10_000 {
            let n = rng.random_range(2..u64::MAX);
            let (_, old) = t.get_or_insert(key(n), || 7, |k, _| *k == key(0));
            evicted += usize::from(old.is_some());
            t.get_or_insert(key(1), || 1, |k, _| *k == key(0));
            assert!(t.len() <= 4);
            assert!(t.get(&key(0)).is_some(), "a pinned bucket stays");
        }
        assert!(t.get(&key(1)).is_some(), "a bucket in use stays");
        assert!(evicted >= 10_000 - 4);
    }

    #[test]
    fn when_every_entry_is_pinned_the_table_grows_by_them_only() {
        let mut t: Table<u32> = Table::new(2);
        for n in 0..5 {
            let (_, old) = t.get_or_insert(key(n), || 0, |_, _| true);
            assert!(old.is_none());
        }
        assert_eq!(t.len(), 5);
        // Once they are let go, new buckets take their places.
        let (_, old) = t.get_or_insert(key(9), || 0, |_, _| false);
        assert!(old.is_some());
        assert_eq!(t.len(), 5);
    }
}
