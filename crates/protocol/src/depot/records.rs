//! How a Depot node's changes become records, and records a node again: one format for servers
//! (in the node's store) and clients (in their own directory). Accepted updates are kept by
//! acceptance number, so a restore accepts them again in the same order; values by hash; fork
//! proofs by writer; the hashes of values every client agreed to drop, so that a restored node
//! does not fetch them again. The storage is the driver's; this only names and encodes.

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
/// Hashes of discarded values (§6.6), each with an empty record.
pub const DISCARDED: &str = "discarded";
/// When each accepted update was accepted (8 bytes, big-endian microseconds), by acceptance
/// number: the lives of versions (§6.6) survive a restart.
pub const ACCEPTED: &str = "accepted";

/// One record: its table, key and value; no value deletes the record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// [`UPDATES`], [`VALUES`], [`FORKS`] or [`DISCARDED`].
    pub table: &'static str,
    /// Its key in the table.
    pub key: Vec<u8>,
    /// Its bytes; `None`: delete it.
    pub value: Option<Bytes>,
}

/// Numbers accepted updates as they are recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recorder {
    next: u64,
}

impl Recorder {
    /// The records of `change`, in order.
    pub fn record(&mut self, change: &Change) -> Vec<Record> {
        match change {
            Change::Update(update, accepted) => {
                let key = self.next.to_be_bytes().to_vec();
                self.next += 1;
                let mut records = vec![Record {
                    table: UPDATES,
                    key: key.clone(),
                    value: Some(Bytes::from(wire::encode(update))),
                }];
                if let Some(at) = accepted {
                    records.push(Record {
                        table: ACCEPTED,
                        key,
                        value: Some(Bytes::copy_from_slice(&at.to_be_bytes())),
                    });
                }
                records
            }
            // A value stored again after its discard (equal bytes written again) undoes it.
            Change::Value(value) => vec![
                Record {
                    table: VALUES,
                    key: value_hash(value).0.to_vec(),
                    value: Some(value.clone()),
                },
                Record {
                    table: DISCARDED,
                    key: value_hash(value).0.to_vec(),
                    value: None,
                },
            ],
            Change::Fork(proof) => vec![Record {
                table: FORKS,
                key: proof.writer.0.to_be_bytes().to_vec(),
                value: Some(Bytes::from(wire::encode(&**proof))),
            }],
            // Read from the records, never made.
            Change::Stored(..) => Vec::new(),
            Change::Discard(hash) => vec![
                Record {
                    table: DISCARDED,
                    key: hash.0.to_vec(),
                    value: Some(Bytes::new()),
                },
                Record {
                    table: VALUES,
                    key: hash.0.to_vec(),
                    value: None,
                },
            ],
        }
    }
}

/// The records of a node's tables, each in key order.
#[derive(Clone, Debug, Default)]
pub struct Tables {
    /// [`VALUES`].
    pub values: Vec<(Vec<u8>, Bytes)>,
    /// [`VALUES`] by hash and length alone, their bytes left in the store (checked when read).
    pub stored: Vec<(Vec<u8>, u64)>,
    /// [`FORKS`].
    pub forks: Vec<(Vec<u8>, Bytes)>,
    /// [`UPDATES`].
    pub updates: Vec<(Vec<u8>, Bytes)>,
    /// [`DISCARDED`].
    pub discarded: Vec<(Vec<u8>, Bytes)>,
    /// [`ACCEPTED`].
    pub accepted: Vec<(Vec<u8>, Bytes)>,
}

impl Tables {
    /// Every table's records, read with `load`.
    pub fn load<E>(
        mut load: impl FnMut(&'static str) -> Result<Vec<(Vec<u8>, Bytes)>, E>,
    ) -> Result<Tables, E> {
        Ok(Tables {
            values: load(VALUES)?,
            stored: Vec::new(),
            forks: load(FORKS)?,
            updates: load(UPDATES)?,
            discarded: load(DISCARDED)?,
            accepted: load(ACCEPTED)?,
        })
    }

    /// The tables but the values, read with `load`, and the hash and length of each value, read
    /// with `lengths`: what a node that holds more values than memory restores from.
    pub fn load_leaving_values<E>(
        mut load: impl FnMut(&'static str) -> Result<Vec<(Vec<u8>, Bytes)>, E>,
        lengths: impl FnOnce(&'static str) -> Result<Vec<(Vec<u8>, u64)>, E>,
    ) -> Result<Tables, E> {
        Ok(Tables {
            values: Vec::new(),
            stored: lengths(VALUES)?,
            forks: load(FORKS)?,
            updates: load(UPDATES)?,
            discarded: load(DISCARDED)?,
            accepted: load(ACCEPTED)?,
        })
    }
}

/// The changes the records of `tables` say, in the order to restore them, and the recorder that
/// goes on numbering after them; or why they cannot be a node's.
pub fn restore(tables: Tables) -> Result<(Vec<Change>, Recorder), String> {
    let Tables {
        values,
        stored,
        forks,
        updates,
        discarded,
        accepted,
    } = tables;
    let accepted: std::collections::BTreeMap<Vec<u8>, u64> = accepted
        .into_iter()
        .filter_map(|(number, at)| Some((number, u64::from_be_bytes(at.as_ref().try_into().ok()?))))
        .collect();
    let mut changes = Vec::with_capacity(values.len() + forks.len() + updates.len());
    for (hash, _) in discarded {
        let hash = <[u8; 32]>::try_from(hash.as_slice())
            .map_err(|_| "a discarded value's hash is not 32 bytes".to_string())?;
        changes.push(Change::Discard(bulwark_core::Digest(hash)));
    }
    for (hash, value) in values {
        if value_hash(&value).0.as_slice() != hash.as_slice() {
            return Err("a value is stored under another hash than its own".into());
        }
        changes.push(Change::Value(value));
    }
    for (hash, len) in stored {
        let hash = <[u8; 32]>::try_from(hash.as_slice())
            .map_err(|_| "a value's hash is not 32 bytes".to_string())?;
        changes.push(Change::Stored(bulwark_core::Digest(hash), len));
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
        changes.push(Change::Update(
            update,
            accepted.get(number.to_be_bytes().as_slice()).copied(),
        ));
        next = number + 1;
    }
    Ok((changes, Recorder { next }))
}
