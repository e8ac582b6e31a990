//! How a Depot node's changes become records, and records a node again: one format for servers
//! (in the node's store) and clients (in their own directory). Accepted updates are kept by
//! acceptance number, so a restore accepts them again in the same order; values by hash; fork
//! proofs by writer. The storage is the driver's; this only names and encodes.

use super::log::ForkProof;
use super::node::Change;
use super::update::{WireUpdate, value_hash};
use bulwark_core::wire::{self, FRAME_BYTES_MAX};
use bytes::Bytes;

/// Accepted updates, by acceptance number (8 bytes, big-endian).
pub const UPDATES: &str = "updates";
/// Values, by hash.
pub const VALUES: &str = "values";
/// Fork proofs, by writer (4 bytes, big-endian).
pub const FORKS: &str = "forks";

/// One record: its table, key and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// [`UPDATES`], [`VALUES`] or [`FORKS`].
    pub table: &'static str,
    /// Its key in the table.
    pub key: Vec<u8>,
    /// Its bytes.
    pub value: Bytes,
}

/// Numbers accepted updates as they are recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recorder {
    next: u64,
}

impl Recorder {
    /// The record of `change`.
    pub fn record(&mut self, change: &Change) -> Record {
        match change {
            Change::Update(update) => {
                let key = self.next.to_be_bytes().to_vec();
                self.next += 1;
                Record {
                    table: UPDATES,
                    key,
                    value: Bytes::from(wire::encode(update)),
                }
            }
            Change::Value(value) => Record {
                table: VALUES,
                key: value_hash(value).0.to_vec(),
                value: value.clone(),
            },
            Change::Fork(proof) => Record {
                table: FORKS,
                key: proof.writer.0.to_be_bytes().to_vec(),
                value: Bytes::from(wire::encode(&**proof)),
            },
        }
    }
}

/// The changes the records of the three tables say, in the order to restore them, and the
/// recorder that goes on numbering after them; or why they cannot be a node's. Each table's
/// records in key order.
pub fn restore(
    values: Vec<(Vec<u8>, Bytes)>,
    forks: Vec<(Vec<u8>, Bytes)>,
    updates: Vec<(Vec<u8>, Bytes)>,
) -> Result<(Vec<Change>, Recorder), String> {
    let mut changes = Vec::with_capacity(values.len() + forks.len() + updates.len());
    for (hash, value) in values {
        if value_hash(&value).0.as_slice() != hash.as_slice() {
            return Err("a value is stored under another hash than its own".into());
        }
        changes.push(Change::Value(value));
    }
    for (_, record) in forks {
        let proof: ForkProof = wire::decode(&record, FRAME_BYTES_MAX)
            .map_err(|error| format!("a fork proof's record: {error}"))?;
        changes.push(Change::Fork(Box::new(proof)));
    }
    let mut next = 0;
    for (number, record) in updates {
        let number = <[u8; 8]>::try_from(number.as_slice())
            .map(u64::from_be_bytes)
            .map_err(|_| "an update's acceptance number is not 8 bytes".to_string())?;
        let update: WireUpdate = wire::decode(&record, FRAME_BYTES_MAX)
            .map_err(|error| format!("update {number}'s record: {error}"))?;
        changes.push(Change::Update(update));
        next = number + 1;
    }
    Ok((changes, Recorder { next }))
}
