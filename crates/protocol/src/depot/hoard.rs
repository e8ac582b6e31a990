//! The values a Depot node holds (§5.7: servers hoard every value), known by hash and length, with
//! the bytes of at most a bounded number of them in memory.
//!
//! A server may hold far more values than it has memory, so the bytes of most live only in the
//! driver's store: a node that is given a bound keeps the bytes of the values it handled most
//! recently within it and reads the rest back through the [`Values`] view its driver lends to
//! [`super::Node::on_message_with`]. The driver must answer for every value whose
//! [`super::Change::Value`] it was handed, durable yet or not; the node evicts only at the end of
//! an input, after which its driver holds every change of that input. A value read back is checked
//! against its hash (a disk is not trusted more than a peer): one the store lost or damaged is
//! counted, held no more, and fetched again from peers like any value the node lacks.
//!
//! Without a bound (clients, whose logs are their own; the simulator; tests) every value stays in
//! memory and no view is needed.

use super::update::value_hash;
use bulwark_core::Digest;
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Where a node finds the bytes of values it holds and no longer keeps in memory: its driver's
/// store, the changes not yet durable first.
pub trait Values {
    /// The stored bytes named `hash`, if any (the node checks them).
    fn value(&self, hash: &Digest) -> Option<Bytes>;
}

/// No store: every value a node holds is in its memory.
impl Values for () {
    fn value(&self, _hash: &Digest) -> Option<Bytes> {
        None
    }
}

/// The values one node holds.
#[derive(Debug, Default)]
pub(super) struct Hoard {
    /// Every value held, with its length.
    held: BTreeMap<Digest, u64>,
    held_bytes: u64,
    /// The bytes in memory, and the order they came in (a hash may appear again after it left).
    resident: BTreeMap<Digest, Bytes>,
    order: VecDeque<Digest>,
    resident_bytes: u64,
    /// At most this many bytes stay in memory after an input; `None`: every value's.
    resident_max: Option<u64>,
    /// Values the store did not give back intact.
    damaged: u64,
    /// Those not yet fetched again: the node takes them with [`Hoard::take_lost`].
    lost: Vec<Digest>,
}

impl Hoard {
    /// Keeps the bytes of at most `bytes` of values in memory from now on.
    pub(super) fn bound(&mut self, bytes: u64) {
        self.resident_max = Some(bytes);
        self.order = self.resident.keys().copied().collect();
    }

    /// Whether `hash` is held.
    pub(super) fn holds(&self, hash: &Digest) -> bool {
        self.held.contains_key(hash)
    }

    /// How many values are held.
    pub(super) fn len(&self) -> usize {
        self.held.len()
    }

    /// Their bytes.
    pub(super) fn bytes(&self) -> u64 {
        self.held_bytes
    }

    /// Values the store did not give back intact.
    pub(super) fn damaged(&self) -> u64 {
        self.damaged
    }

    /// The length of the value `hash`, if held.
    pub(super) fn len_of(&self, hash: &Digest) -> Option<u64> {
        self.held.get(hash).copied()
    }

    /// The values the store lost or damaged since the last call: no longer held.
    pub(super) fn take_lost(&mut self) -> Vec<Digest> {
        std::mem::take(&mut self.lost)
    }

    /// The bytes of `hash` if they are in memory.
    pub(super) fn resident(&self, hash: &Digest) -> Option<&Bytes> {
        self.resident.get(hash)
    }

    /// The bytes of `hash`, from memory or else from `store` (`None`: no store lent to this
    /// input); `None` if not held, or not in memory and no store was lent, or if the store does
    /// not give those bytes back, in which case the value is lost ([`Hoard::take_lost`]).
    pub(super) fn get(&mut self, hash: &Digest, store: Option<&dyn Values>) -> Option<Bytes> {
        if let Some(value) = self.resident.get(hash) {
            return Some(value.clone());
        }
        if !self.held.contains_key(hash) {
            return None;
        }
        match store?.value(hash) {
            Some(value) if value_hash(&value) == *hash => Some(value),
            _ => {
                self.damaged += 1;
                self.remove(hash);
                self.lost.push(*hash);
                None
            }
        }
    }

    /// Holds `value`, named `hash`, with its bytes in memory until [`Hoard::evict`] lets them go.
    pub(super) fn insert(&mut self, hash: Digest, value: Bytes) {
        debug_assert_eq!(value_hash(&value), hash);
        let len = value.len() as u64;
        self.insert_stored(hash, len);
        if let Some(before) = self.resident.insert(hash, value) {
            self.resident_bytes -= before.len() as u64;
        } else if self.resident_max.is_some() {
            self.order.push_back(hash);
        }
        self.resident_bytes += len;
    }

    /// A value held on the store only (a restore that leaves the bytes on disk).
    pub(super) fn insert_stored(&mut self, hash: Digest, len: u64) {
        if let Some(before) = self.held.insert(hash, len) {
            self.held_bytes -= before;
        }
        self.held_bytes += len;
    }

    /// Lets `hash` go.
    pub(super) fn remove(&mut self, hash: &Digest) {
        if let Some(len) = self.held.remove(hash) {
            self.held_bytes -= len;
        }
        if let Some(value) = self.resident.remove(hash) {
            self.resident_bytes -= value.len() as u64;
        }
    }

    /// Drops the bytes of the oldest values in memory until the bound holds, sparing `pinned`
    /// (what the node must read again before its driver could answer for it).
    pub(super) fn evict(&mut self, pinned: &BTreeSet<Digest>) {
        let Some(max) = self.resident_max else {
            return;
        };
        let mut spared = 0;
        while self.resident_bytes > max && spared <= self.order.len() {
            let Some(hash) = self.order.pop_front() else {
                break;
            };
            if pinned.contains(&hash) {
                self.order.push_back(hash);
                spared += 1;
                continue;
            }
            if let Some(value) = self.resident.remove(&hash) {
                self.resident_bytes -= value.len() as u64;
            }
        }
        // Hashes whose bytes left by `remove` linger in the order; drop them once they dominate.
        if self.order.len() > 2 * self.resident.len() + 64 {
            let resident = &self.resident;
            self.order.retain(|hash| resident.contains_key(hash));
        }
        debug_assert!(self.resident_bytes <= max || spared > 0 || self.order.is_empty());
    }
}
