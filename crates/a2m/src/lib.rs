//! Bulwark's trusted log: A2M, attested append-only memory (the A2M paper §2;
//! ../shared/specs/a2m.md §2.2, §2.5).
//!
//! Each node has one component. It holds append-only logs of 32-byte values and answers questions
//! about them with attestations signed by its own key ([`bulwark_core::a2m::Attestation`]), which
//! anyone holding the public key checks. No operation overwrites a slot, so a host cannot have
//! two different values attested for one slot, whoever asks: that is what stops equivocation.
//!
//! [`A2m`] is the interface every backend offers, with the fused `append_attest` and
//! `advance_attest` of the paper's batching (§5.4) so that a backend across a process boundary
//! or inside a TPM answers in one call. [`Component`] is the software backend: the logs in memory,
//! every change durable in its own store before the call returns (and so before any attestation
//! about it can leave), the key beside the logs, refusing to start on lost or damaged state.
//!
//! A component that lost its state must never come back under its old identity: after a reset it
//! could attest different contents for slots it already attested (spec §2.5, §7.1 item 8). So
//! [`Component::open`] refuses a directory without state, and only [`Component::create`] makes an
//! identity, on an empty directory.
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::panic))]

mod logs;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use bulwark_core::a2m::{Attestation, ChainDigest, LogId, Nonce, Seq, Value};
use bulwark_core::ids::{GroupId, ServiceId};
use bulwark_core::sign::{PublicKey, SecretKey, Signed};
use bulwark_core::wire;
use bulwark_storage::{Namespace, StorageError, StorageOp, Store, Table};
use bytes::Bytes;

pub use logs::{Entry, Head, Limits, Logs, Plan};

/// What a backend refused, or why it stopped.
#[derive(Debug, thiserror::Error)]
pub enum A2mError {
    /// The log holds as many slots as it may: the host must stop rather than drop entries, or
    /// truncate at a stable checkpoint first (spec §7.1 item 4).
    #[error("log {log} is full ({max} slots kept); truncate it at a stable checkpoint")]
    Full {
        /// The log.
        log: LogId,
        /// Slots it may keep.
        max: usize,
    },
    /// The component holds as many logs as it may.
    #[error("the trusted log holds {max} logs already")]
    TooManyLogs {
        /// Logs it may hold.
        max: usize,
    },
    /// The log's last slot is the largest there is.
    #[error("log {log} has used every slot")]
    Exhausted {
        /// The log.
        log: LogId,
    },
    /// An advance to a slot at or below the end: a correct caller never asks this (spec §7.1
    /// item 5).
    #[error("log {log} ends at slot {high}: it cannot advance to slot {seq}")]
    NotMonotone {
        /// The log.
        log: LogId,
        /// The slot asked for.
        seq: Seq,
        /// The log's end.
        high: Seq,
    },
    /// A truncation to a slot outside `(low, high]`.
    #[error("log {log} keeps slots {low} to {high}: it cannot be truncated to slot {seq}")]
    OutOfRange {
        /// The log.
        log: LogId,
        /// The slot asked for.
        seq: Seq,
        /// The lowest slot kept.
        low: Seq,
        /// The log's end.
        high: Seq,
    },
    /// The component's storage failed: it attests nothing more until it is restarted, since it
    /// cannot tell what reached the disk.
    #[error("the trusted log stopped: {0}")]
    Stopped(String),
    /// The directory holds no identity, or one whose state is lost or damaged: the component
    /// must take a new identity, and its verifiers must be told.
    #[error(
        "{}: {reason}. A trusted log that lost its state must not come back under its old \
         identity: make a new identity (a new key) on an empty directory, and have the cluster \
         learn it",
        dir.display()
    )]
    Identity {
        /// The component's directory.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// The interface of every trusted-log backend (spec §2.2 and the appendix's suggested surface).
/// Attestations come back signed; a caller that forwards one sends
/// [`Signed::to_unverified`], and verifiers check it with
/// [`bulwark_core::a2m::Expected::check`].
pub trait A2m {
    /// The key its attestations verify under: the component's identity.
    fn public_key(&self) -> PublicKey;

    /// Assigns `value` to the slot after the log's end and returns that slot.
    fn append(&mut self, log: LogId, value: Value) -> Result<Seq, A2mError>;

    /// Assigns `value` to slot `seq`, past the log's end, chained to `digest` instead of the
    /// previous slot's digest; the slots between are skipped.
    fn advance(
        &mut self,
        log: LogId,
        seq: Seq,
        digest: ChainDigest,
        value: Value,
    ) -> Result<(), A2mError>;

    /// Attests what slot `seq` of `log` holds, answering `nonce`.
    fn lookup(
        &mut self,
        log: LogId,
        seq: Seq,
        nonce: Nonce,
    ) -> Result<Signed<Attestation>, A2mError>;

    /// Attests which slot is the log's last, answering `nonce`.
    fn end(&mut self, log: LogId, nonce: Nonce) -> Result<Signed<Attestation>, A2mError>;

    /// Forgets every slot below `seq`, which must lie in `(low, high]`; slot `seq` stays.
    fn truncate(&mut self, log: LogId, seq: Seq) -> Result<(), A2mError>;

    /// [`A2m::append`], then [`A2m::lookup`] of the slot it filled, in one call.
    fn append_attest(
        &mut self,
        log: LogId,
        value: Value,
        nonce: Nonce,
    ) -> Result<Signed<Attestation>, A2mError> {
        let seq = self.append(log, value)?;
        self.lookup(log, seq, nonce)
    }

    /// [`A2m::advance`], then [`A2m::lookup`] of slot `seq`, in one call.
    fn advance_attest(
        &mut self,
        log: LogId,
        seq: Seq,
        digest: ChainDigest,
        value: Value,
        nonce: Nonce,
    ) -> Result<Signed<Attestation>, A2mError> {
        self.advance(log, seq, digest, value)?;
        self.lookup(log, seq, nonce)
    }
}

/// The namespace of a component's own store (a store of its own, in its own directory).
const NAMESPACE: Namespace = Namespace::new(ServiceId::A2M, GroupId(0));
/// `secret` → the key's 32-byte seed.
const IDENTITY: Table = NAMESPACE.table("identity");
/// Big-endian log id → its [`Head`].
const HEADS: Table = NAMESPACE.table("heads");
/// Big-endian log id, then big-endian slot → its [`Entry`].
const ENTRIES: Table = NAMESPACE.table("entries");
const SECRET: &[u8] = b"secret";

/// The software backend: logs in memory, each change durable in the component's store before
/// the call that made it returns.
pub struct Component {
    key: SecretKey,
    logs: Logs,
    /// `None` for a component that keeps nothing (the simulator's, tests').
    store: Option<Store>,
    stopped: Option<String>,
    attestations: u64,
}

impl Component {
    /// A component that keeps its state in memory only, with the key from `seed`: for the
    /// simulator, whose crashes model what a durable component keeps.
    pub fn in_memory(seed: &[u8; 32], limits: Limits) -> Component {
        Component {
            key: SecretKey::from_seed(seed),
            logs: Logs::new(limits),
            store: None,
            stopped: None,
            attestations: 0,
        }
    }

    /// Makes a new identity (a fresh key, empty logs) in `dir`, which must hold no component yet.
    pub fn create(dir: &Path, limits: Limits) -> Result<Component, A2mError> {
        if dir.join(STATE_FILE).exists() {
            return Err(A2mError::Identity {
                dir: dir.to_path_buf(),
                reason: "it already holds a trusted log; a new identity needs an empty directory"
                    .to_string(),
            });
        }
        let store = open_store(dir)?;
        let seed: [u8; 32] = rand::random();
        store
            .apply(&[StorageOp::Put {
                table: IDENTITY,
                key: SECRET.to_vec(),
                value: Bytes::copy_from_slice(&seed),
            }])
            .map_err(|error| identity(dir, format!("storing the new key failed: {error}")))?;
        Ok(Component {
            key: SecretKey::from_seed(&seed),
            logs: Logs::new(limits),
            store: Some(store),
            stopped: None,
            attestations: 0,
        })
    }

    /// Opens the identity in `dir`, with its logs as they were last made durable. Refuses a
    /// directory without one, and any state it could not have written.
    pub fn open(dir: &Path, limits: Limits) -> Result<Component, A2mError> {
        if !dir.join(STATE_FILE).exists() {
            return Err(identity(dir, "it holds no trusted log".to_string()));
        }
        let store = open_store(dir)?;
        let damaged = |what: &str, error: StorageError| identity(dir, format!("{what}: {error}"));
        let seed = store
            .get(IDENTITY, SECRET)
            .map_err(|error| damaged("reading the key failed", error))?
            .ok_or_else(|| identity(dir, "its key is missing".to_string()))?;
        let seed: [u8; 32] = seed
            .as_ref()
            .try_into()
            .map_err(|_| identity(dir, "its key is damaged".to_string()))?;
        let mut heads = Vec::new();
        store
            .scan(HEADS, |key, value| {
                let id = key
                    .try_into()
                    .map(LogId::from_be_bytes)
                    .map_err(|_| StorageError::other("a head's key is not a log id"))?;
                heads.push((id, decode::<Head>(value)?));
                Ok(())
            })
            .map_err(|error| damaged("its log heads are damaged", error))?;
        let mut entries = Vec::new();
        store
            .scan(ENTRIES, |key, value| {
                let (id, seq) = split_entry_key(key)
                    .ok_or_else(|| StorageError::other("an entry's key is not a log and slot"))?;
                entries.push((id, seq, decode::<Entry>(value)?));
                Ok(())
            })
            .map_err(|error| damaged("its log entries are damaged", error))?;
        let logs = Logs::restore(limits, heads, entries)
            .map_err(|reason| identity(dir, format!("its logs are inconsistent: {reason}")))?;
        Ok(Component {
            key: SecretKey::from_seed(&seed),
            logs,
            store: Some(store),
            stopped: None,
            attestations: 0,
        })
    }

    /// The logs, for status: each log's bounds.
    pub fn heads(&self) -> Vec<(LogId, Head)> {
        self.logs.heads().collect()
    }

    /// Attestations signed since start.
    pub fn attestations(&self) -> u64 {
        self.attestations
    }

    /// Makes `plan` durable, then the state. A failed commit stops the component: it cannot tell
    /// whether the change reached the disk, so attesting either way could contradict it later.
    fn run(&mut self, plan: Plan) -> Result<(), A2mError> {
        self.running()?;
        if let Some(store) = &self.store {
            let mut ops = Vec::with_capacity(2 + plan.forget.len());
            let log = plan.log.to_be_bytes();
            ops.push(StorageOp::Put {
                table: HEADS,
                key: log.to_vec(),
                value: Bytes::from(wire::encode(&plan.head)),
            });
            if let Some((seq, entry)) = plan.put {
                ops.push(StorageOp::Put {
                    table: ENTRIES,
                    key: entry_key(plan.log, seq),
                    value: Bytes::from(wire::encode(&entry)),
                });
            }
            for seq in &plan.forget {
                ops.push(StorageOp::Delete {
                    table: ENTRIES,
                    key: entry_key(plan.log, *seq),
                });
            }
            if let Err(error) = store.apply(&ops) {
                tracing::error!(%error, "the trusted log's store failed; it stops attesting");
                self.stopped = Some(error.to_string());
                return Err(A2mError::Stopped(error.to_string()));
            }
        }
        self.logs.apply(&plan);
        Ok(())
    }

    fn running(&self) -> Result<(), A2mError> {
        match &self.stopped {
            Some(reason) => Err(A2mError::Stopped(reason.clone())),
            None => Ok(()),
        }
    }

    fn sign(&mut self, statement: Attestation) -> Result<Signed<Attestation>, A2mError> {
        self.running()?;
        self.attestations += 1;
        Signed::sign(&self.key, statement).map_err(|error| A2mError::Stopped(error.to_string()))
    }
}

impl A2m for Component {
    fn public_key(&self) -> PublicKey {
        self.key.public_key()
    }

    fn append(&mut self, log: LogId, value: Value) -> Result<Seq, A2mError> {
        let plan = self.logs.plan_append(log, value)?;
        let seq = plan.head.high;
        self.run(plan)?;
        Ok(seq)
    }

    fn advance(
        &mut self,
        log: LogId,
        seq: Seq,
        digest: ChainDigest,
        value: Value,
    ) -> Result<(), A2mError> {
        let plan = self.logs.plan_advance(log, seq, digest, value)?;
        self.run(plan)
    }

    fn lookup(
        &mut self,
        log: LogId,
        seq: Seq,
        nonce: Nonce,
    ) -> Result<Signed<Attestation>, A2mError> {
        let statement = self.logs.lookup(log, seq, nonce);
        self.sign(statement)
    }

    fn end(&mut self, log: LogId, nonce: Nonce) -> Result<Signed<Attestation>, A2mError> {
        let statement = self.logs.end(log, nonce);
        self.sign(statement)
    }

    fn truncate(&mut self, log: LogId, seq: Seq) -> Result<(), A2mError> {
        let plan = self.logs.plan_truncate(log, seq)?;
        self.run(plan)
    }
}

/// The store's file in a component's directory (the storage crate's name for it).
const STATE_FILE: &str = "state.redb";

fn open_store(dir: &Path) -> Result<Store, A2mError> {
    Store::open(dir).map_err(|error| match error {
        StorageError::InUse => identity(
            dir,
            "another process holds this trusted log open (a component already runs on it)"
                .to_string(),
        ),
        error => identity(dir, format!("its store cannot be opened: {error}")),
    })
}

fn identity(dir: &Path, reason: String) -> A2mError {
    A2mError::Identity {
        dir: dir.to_path_buf(),
        reason,
    }
}

fn entry_key(log: LogId, seq: Seq) -> Vec<u8> {
    let mut key = Vec::with_capacity(24);
    key.extend_from_slice(&log.to_be_bytes());
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

fn split_entry_key(key: &[u8]) -> Option<(LogId, Seq)> {
    let log = LogId::from_be_bytes(key.get(..8)?.try_into().ok()?);
    let seq = Seq::from_be_bytes(key.get(8..)?.try_into().ok()?);
    Some((log, seq))
}

/// A head or an entry is a few dozen bytes.
const RECORD_BYTES_MAX: usize = 128;

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, StorageError> {
    wire::decode(bytes, RECORD_BYTES_MAX)
        .map_err(|error| StorageError::other(format!("undecodable: {error}")))
}
