//! Fragments read from disk and found intact, kept in memory (bounded) so that serving the same
//! fragment again needs neither a redb read nor a re-hash.
//!
//! A FILTER reply may only carry a fragment that hashes to this node's slot of the entry's
//! cross-checksum. Damage enters on the disk, so every fragment read from it is hashed; once
//! checked, the copy held here cannot rot the way the disk can, and it is served only for the
//! same digest it was checked against. Profiles of 1 MiB gets had the re-hash at half of a
//! node's instructions and the redb read with its copy at a fifth.

use bulwark_core::Digest;
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};

/// Fragment bytes held at most.
pub const VERIFIED_BYTES_MAX: usize = 32 * 1024 * 1024;

/// Intact fragments by storage record id, evicted oldest first beyond a byte bound.
pub struct Verified {
    by_record: HashMap<Vec<u8>, (u64, Digest, Bytes)>,
    /// Insertion order, with the generation each insertion had: a record replaced or removed
    /// since leaves a stale entry here that eviction skips.
    order: VecDeque<(Vec<u8>, u64)>,
    generation: u64,
    bytes: usize,
    bytes_max: usize,
}

impl Verified {
    pub fn new(bytes_max: usize) -> Verified {
        Verified {
            by_record: HashMap::new(),
            order: VecDeque::new(),
            generation: 0,
            bytes: 0,
            bytes_max,
        }
    }

    /// The fragment of `record` if it was checked against `digest`.
    pub fn get(&self, record: &[u8], digest: &Digest) -> Option<Bytes> {
        match self.by_record.get(record) {
            Some((_, checked, fragment)) if checked == digest => Some(fragment.clone()),
            _ => None,
        }
    }

    /// Remembers that `fragment` of `record` hashes to `digest`. A fragment larger than the
    /// whole bound is not kept.
    pub fn insert(&mut self, record: Vec<u8>, digest: Digest, fragment: Bytes) {
        if fragment.len() > self.bytes_max {
            return;
        }
        self.remove(&record);
        self.generation += 1;
        self.bytes += fragment.len();
        self.order.push_back((record.clone(), self.generation));
        self.by_record
            .insert(record, (self.generation, digest, fragment));
        while self.bytes > self.bytes_max {
            let Some((oldest, generation)) = self.order.pop_front() else {
                break;
            };
            if self
                .by_record
                .get(&oldest)
                .is_some_and(|(g, ..)| *g == generation)
            {
                self.remove(&oldest);
            }
        }
        // Stale order entries are dropped once they outnumber the live ones.
        if self.order.len() > 2 * self.by_record.len() + 64 {
            let live = &self.by_record;
            self.order.retain(|(record, generation)| {
                live.get(record).is_some_and(|(g, ..)| g == generation)
            });
        }
    }

    /// Forgets `record` (its `Hist` entry was deleted or rewritten).
    pub fn remove(&mut self, record: &[u8]) {
        if let Some((_, _, fragment)) = self.by_record.remove(record) {
            self.bytes -= fragment.len();
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(byte: u8) -> Digest {
        Digest::of("test", &[byte])
    }

    fn fragment(len: usize) -> Bytes {
        Bytes::from(vec![7u8; len])
    }

    #[test]
    fn a_fragment_is_served_only_for_the_digest_it_was_checked_against() {
        let mut verified = Verified::new(1000);
        verified.insert(b"a".to_vec(), digest(1), fragment(10));
        assert_eq!(verified.get(b"a", &digest(1)), Some(fragment(10)));
        assert_eq!(verified.get(b"a", &digest(2)), None);
        assert_eq!(verified.get(b"b", &digest(1)), None);
        verified.remove(b"a");
        assert_eq!(verified.get(b"a", &digest(1)), None);
        assert_eq!(verified.bytes(), 0);
    }

    #[test]
    fn the_oldest_go_first_and_the_bound_holds() {
        let mut verified = Verified::new(100);
        for i in 0..5u8 {
            verified.insert(vec![i], digest(i), fragment(30));
            assert!(verified.bytes() <= 100);
        }
        assert_eq!(verified.get(&[0], &digest(0)), None);
        assert_eq!(verified.get(&[1], &digest(1)), None);
        assert!(verified.get(&[2], &digest(2)).is_some());
        assert!(verified.get(&[4], &digest(4)).is_some());
        // Re-inserting a record moves it to the back rather than keeping two copies.
        verified.insert(vec![2], digest(2), fragment(30));
        verified.insert(vec![5], digest(5), fragment(30));
        assert!(verified.get(&[2], &digest(2)).is_some());
        assert_eq!(verified.get(&[3], &digest(3)), None);
        assert_eq!(verified.bytes(), 90);
        // Too large to keep at all.
        verified.insert(vec![9], digest(9), fragment(101));
        assert_eq!(verified.get(&[9], &digest(9)), None);
        assert_eq!(verified.bytes(), 90);
    }

    #[test]
    fn stale_order_entries_do_not_pile_up() {
        let mut verified = Verified::new(1000);
        for _ in 0..10_000 {
            verified.insert(b"same".to_vec(), digest(1), fragment(10));
        }
        assert!(verified.order.len() <= 2 * verified.by_record.len() + 65);
        assert_eq!(verified.bytes(), 10);
    }
}
