//! Identities and small value types used across the protocols.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A storage node's identity: global and stable, whatever groups it belongs to. Its position in
/// one group is a [`Slot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl NodeId {
    /// The id as a `usize`.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node{}", self.0)
    }
}

/// A client's index in the cluster configuration's client list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClientId(pub u32);

/// A node's position in one replica group for one epoch, `0..n`: what protocol machines index
/// fragments, MAC slots and quorums by. A node has a slot in every group it belongs to, and the
/// slots change with the groups; drivers translate slots to nodes through the group's view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Slot(pub u32);

impl Slot {
    /// The position as a `usize`, for slices of per-slot values.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "slot{}", self.0)
    }
}

/// Which service a frame, a replica or a storage namespace belongs to: one per protocol a node
/// runs (registers of each kind, later the configuration service, causal volumes, tables).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServiceId(pub u16);

impl ServiceId {
    /// The node itself: status and administration.
    pub const SYSTEM: ServiceId = ServiceId(0);
    /// M-PoWerStore registers.
    pub const POWERSTORE: ServiceId = ServiceId(1);
    /// Multi-writer ABD registers (the crash-tolerant baseline).
    pub const ABD: ServiceId = ServiceId(2);
    /// Phalanx-style registers (the Byzantine baseline with signed versions).
    pub const PHALANX: ServiceId = ServiceId(3);
    /// The configuration service (Rosebud §3): PBFT among the epoch's CS replicas.
    pub const CONFIG: ServiceId = ServiceId(4);
    /// Content-hash objects (Rosebud §4.3): immutable, named by the hash of their manifest.
    pub const CONTENT: ServiceId = ServiceId(5);
    /// Public-key objects (Rosebud §4.4): mutable, named by the hash of their owner's key.
    pub const PUBKEY: ServiceId = ServiceId(6);
    /// The trusted log (A2M): its component's own store, kept apart from the node's.
    pub const A2M: ServiceId = ServiceId(7);
    /// Single-server volumes (A2M-Storage): one server with a trusted log, forks detected.
    pub const A2M_STORAGE: ServiceId = ServiceId(8);
    /// Causal volumes (Depot): available and fork-join-causal whatever number of nodes fail.
    pub const DEPOT: ServiceId = ServiceId(9);
    /// Hardened tables: rows of client-signed cells read and written through Byzantine quorums.
    pub const TABLE: ServiceId = ServiceId(10);
}

impl fmt::Display for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "service{}", self.0)
    }
}

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client{}", self.0)
    }
}

/// A Rosebud configuration number. Static membership uses epoch 0 throughout; messages carry it
/// already so that reconfiguration does not change the wire format.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Epoch(pub u64);

/// A replica group (a key range's set of `n` nodes). One group today, many after Rosebud.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct GroupId(pub u32);

/// Milliseconds on whatever clock the driver feeds in: the simulator's virtual clock or the
/// node's monotonic clock. Protocol code only compares and adds these; safety never depends on them.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub struct Time(pub u64);

impl Time {
    /// This time plus `millis` milliseconds, saturating.
    pub fn plus_millis(self, millis: u64) -> Time {
        Time(self.0.saturating_add(millis))
    }
}

/// An object key: opaque bytes, at most [`Key::BYTES_MAX`] long.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Key(bytes::Bytes);

/// Why a byte string is not a valid key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// Keys must name something.
    #[error("key is empty")]
    Empty,
    /// Keys are bounded so that metadata stays small.
    #[error("key is {len} bytes; the limit is {max}")]
    TooLong {
        /// The offered length.
        len: usize,
        /// [`Key::BYTES_MAX`].
        max: usize,
    },
}

impl Key {
    /// The longest key accepted, as S3 allows.
    pub const BYTES_MAX: usize = 1024;

    /// Validates and wraps `bytes`.
    pub fn new(bytes: impl Into<bytes::Bytes>) -> Result<Key, KeyError> {
        let bytes = bytes.into();
        if bytes.is_empty() {
            return Err(KeyError::Empty);
        }
        if bytes.len() > Key::BYTES_MAX {
            return Err(KeyError::TooLong {
                len: bytes.len(),
                max: Key::BYTES_MAX,
            });
        }
        Ok(Key(bytes))
    }

    /// Checks a key decoded from a peer, whose length the codec did not bound.
    pub fn is_valid(&self) -> bool {
        !self.0.is_empty() && self.0.len() <= Key::BYTES_MAX
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match std::str::from_utf8(&self.0) {
            Ok(s) if s.chars().all(|c| !c.is_control()) => write!(f, "{s:?}"),
            _ => write!(f, "0x{}", hex::encode(&self.0)),
        }
    }
}
