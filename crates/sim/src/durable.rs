//! A simulated disk for one M-PoWerStore server: the `Change`s whose persistence completed, folded
//! into the state a restart reloads.
//!
//! The real node commits every `Change` of a request before it releases the reply (DESIGN.md §2,
//! "a server acknowledges only what is durable"). The simulator models exactly that: a change
//! becomes durable when its reply is released, and a crash loses the rest. Restarting replays
//! this state through `restore_key`, the call the node makes at start-up, and a running server
//! reads a key it evicted from its cache back through [`DurableState::key_after`]. Nothing here models torn writes or disk corruption: a correct server's
//! disk either holds a committed change or does not.

use bulwark_core::{Key, Time};
use bulwark_protocol::powerstore::{
    Candidate, Change, EntryMeta, Server, ServerConfig, ServerKeys, StoredEntry, StoredKey,
    Timestamp,
};
use bytes::Bytes;
use std::collections::BTreeMap;

/// What one server's disk holds. Ordered maps keep restarts deterministic: the order of the
/// `restore_*` calls never depends on a hash seed.
#[derive(Clone, Debug, Default)]
pub struct DurableState {
    keys: BTreeMap<Key, DurableKey>,
    /// Changes applied since the disk was created, for statistics.
    applied: u64,
}

#[derive(Clone, Debug, Default)]
struct DurableKey {
    lc: Option<Candidate>,
    /// `Hist`, keyed by the canonical timestamp encoding (tag included, spec §4.8(b)).
    hist: BTreeMap<[u8; 52], StoredEntry>,
}

impl DurableKey {
    fn stored(&self) -> StoredKey {
        StoredKey {
            lc: self.lc.clone(),
            hist: self.hist.values().map(EntryMeta::from).collect(),
        }
    }
}

impl DurableState {
    /// An empty disk.
    pub fn new() -> DurableState {
        DurableState::default()
    }

    /// Applies one committed change, in commit order.
    pub fn apply(&mut self, change: &Change) {
        self.applied += 1;
        match change {
            Change::PutHist { key, entry } => {
                let state = self.keys.entry(key.clone()).or_default();
                state.hist.insert(entry.ts.canonical(), entry.clone());
            }
            Change::DeleteHist { key, ts } => {
                if let Some(state) = self.keys.get_mut(key) {
                    state.hist.remove(&ts.canonical());
                }
            }
            Change::SetLc { key, candidate } => {
                // The server emits `SetLc` only when `lc` grows, so the last one committed is the
                // highest; a restart must not roll `lc` back (spec §7.1 item 3).
                self.keys.entry(key.clone()).or_default().lc = Some(candidate.clone());
            }
        }
    }

    /// Number of changes applied so far.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Number of `Hist` entries on disk, over all keys.
    pub fn versions(&self) -> usize {
        self.keys.values().map(|k| k.hist.len()).sum()
    }

    /// The committed `lc` of `key`.
    pub fn lc(&self, key: &Key) -> Option<&Candidate> {
        self.keys.get(key).and_then(|k| k.lc.as_ref())
    }

    /// The fragment of a committed `Hist` entry.
    pub fn fragment(&self, key: &Key, ts: &Timestamp) -> Option<Bytes> {
        let entry = self.keys.get(key)?.hist.get(&ts.canonical())?;
        Some(entry.fragment.clone())
    }

    /// The fragment of `Hist[ts]` of `key` as the server sees it: the last of `pending` (changes
    /// handled but not yet committed, oldest first) to touch it, else the committed one.
    pub fn fragment_after<'a>(
        &self,
        pending: impl DoubleEndedIterator<Item = &'a Change>,
        key: &Key,
        ts: &Timestamp,
    ) -> Option<Bytes> {
        for change in pending.rev() {
            match change {
                Change::PutHist { key: k, entry } if k == key && entry.ts == *ts => {
                    return Some(entry.fragment.clone());
                }
                Change::DeleteHist { key: k, ts: t } if k == key && t == ts => return None,
                _ => {}
            }
        }
        self.fragment(key, ts)
    }

    /// `key` as the server sees it: the committed state with `pending` (changes handled but not
    /// yet committed, oldest first) applied over it.
    pub fn key_after<'a>(&self, pending: impl Iterator<Item = &'a Change>, key: &Key) -> StoredKey {
        let mut state = self.keys.get(key).cloned().unwrap_or_default();
        for change in pending {
            match change {
                Change::PutHist { key: k, entry } if k == key => {
                    state.hist.insert(entry.ts.canonical(), entry.clone());
                }
                Change::DeleteHist { key: k, ts } if k == key => {
                    state.hist.remove(&ts.canonical());
                }
                Change::SetLc { key: k, candidate } if k == key => {
                    state.lc = Some(candidate.clone());
                }
                _ => {}
            }
        }
        state.stored()
    }

    /// A fresh server holding exactly this disk's state, as the node builds one at start-up.
    pub fn restore(&self, config: ServerConfig, keys: ServerKeys, now: Time) -> Server {
        let mut server = Server::new(config, keys);
        for (key, state) in &self.keys {
            server.restore_key(key.clone(), state.stored(), now);
        }
        server
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulwark_core::erasure::{ErasureCodec, Layout, ReedSolomonSimd};
    use bulwark_core::{ClientId, GroupId, Slot, Tag};
    use bulwark_protocol::powerstore::{
        CrossChecksum, MacVec, Nonce, Pid, Timestamp, fragment_digest,
    };
    use bytes::Bytes;

    fn entry(num: u64) -> StoredEntry {
        let layout = Layout::for_value(3, 4, 1);
        let fragments = ReedSolomonSimd.encode(&layout, b"abc").unwrap();
        StoredEntry {
            ts: Timestamp {
                num,
                pid: Pid {
                    writer: ClientId(0),
                    seq: num,
                },
                tag: Tag([num as u8; 32]),
            },
            fragment: fragments[0].clone(),
            cc: CrossChecksum {
                layout,
                tombstone: false,
                hashes: fragments.iter().map(|f| fragment_digest(f)).collect(),
            },
            nonce_hash: Nonce([num as u8; 32]).commitment(),
            vec: MacVec(vec![Tag([0; 32]); 4]),
        }
    }

    #[test]
    fn a_restart_sees_puts_and_deletes_in_commit_order_and_the_last_lc() {
        let key = Key::new(Bytes::from_static(b"k")).unwrap();
        let mut disk = DurableState::new();
        for num in 1..=3 {
            disk.apply(&Change::PutHist {
                key: key.clone(),
                entry: entry(num),
            });
        }
        let lc = |num: u64| Candidate {
            ts: entry(num).ts,
            nonce: Nonce([num as u8; 32]),
            vec: MacVec(vec![Tag([0; 32]); 4]),
        };
        disk.apply(&Change::SetLc {
            key: key.clone(),
            candidate: lc(2),
        });
        disk.apply(&Change::SetLc {
            key: key.clone(),
            candidate: lc(3),
        });
        disk.apply(&Change::DeleteHist {
            key: key.clone(),
            ts: entry(1).ts,
        });
        assert_eq!(disk.versions(), 2);
        assert_eq!(disk.applied(), 6);
        let server = disk.restore(
            ServerConfig::new(Slot(0), 1),
            ServerKeys::default(),
            Time(0),
        );
        assert_eq!(server.versions(&key), 2);
        assert_eq!(server.lc(&key), Some(&lc(3)));
        assert_eq!(server.config().group, GroupId(0));
    }
}
